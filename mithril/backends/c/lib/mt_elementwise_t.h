/* Template: elementwise kernels and reductions over element type T, of kind MT_EW_K (0 float,
 * 1 signed, 2 unsigned, 3 bool; MT_EW_LO/HI its range for integers). See mt_elementwise.h.
 * Included once per type; no guard. */

#if MT_EW_K == 0
#define MT_EW_ADD(p, q) ((p) + (q))
#define MT_EW_SUB(p, q) ((p) - (q))
#define MT_EW_MUL(p, q) ((p) * (q))
#define MT_EW_ABS(v) fabs(v)
#define MT_EW_ISNAN(v) ((v) != (v))
#define MT_EW_LOW (-(T)INFINITY)
#define MT_EW_HIGH ((T)INFINITY)
#define MT_EW_ACC T /* accumulator of sums and products */
#define MT_EW_FROM_D(v) ((T)(v))
#else
/* Integers wrap: the arithmetic runs in uint64_t, where overflow is defined. */
#define MT_EW_ADD(p, q) ((T)((uint64_t)(p) + (uint64_t)(q)))
#define MT_EW_SUB(p, q) ((T)((uint64_t)(p) - (uint64_t)(q)))
#define MT_EW_MUL(p, q) ((T)((uint64_t)(p) * (uint64_t)(q)))
#if MT_EW_K == 1
#define MT_EW_ABS(v) ((v) < 0 ? (T)(0 - (uint64_t)(v)) : (v))
#else
#define MT_EW_ABS(v) (v)
#endif
#define MT_EW_ISNAN(v) 0
#define MT_EW_LOW ((T)MT_EW_LO)
#define MT_EW_HIGH ((T)MT_EW_HI)
#define MT_EW_ACC uint64_t
#define MT_EW_FROM_D(v) MT_CAT(mt_sat, MT_SFX)(v)
#endif

/* ---- one input: y[i] = expr of v = x[i], and of the parameters a, b ---------------------- */
/* x and y may be the same buffer (Mean scales its sum in place): no restrict; omp simd vectorizes. */
#define MT_EW_UNARY(name, TY, expr)                                                                 \
    MT_EW_NOINLINE void MT_FN(mt_##name)(const T *x, TY *y, mt_i n, T a, T b) {                      \
        (void)a; (void)b;                                                                            \
        MT_FOR_SIMD(n, i, T v = x[i]; y[i] = (expr))                                   \
    }

MT_EW_UNARY(copy, T, v)
MT_EW_UNARY(scale, T, MT_EW_MUL(v, a))
/* Clip: min(max(v, a), b); NaN stays NaN, a > b gives b. The lower bound is min(a, b), taken
 * once outside the loop so that the loop vectorizes (one max and one min per vector). */
MT_EW_NOINLINE void MT_FN(mt_clip)(const T *x, T *y, mt_i n, T a, T b) {
    const T lo = a > b ? b : a;
    MT_FOR_SIMD(n, i, T v = x[i] < lo ? lo : x[i]; y[i] = v > b ? b : v)
}

#if MT_EW_K == 3
MT_EW_UNARY(not, T, (T)!v)
#elif MT_EW_K == 0
MT_EW_UNARY(neg, T, -v) /* -0.0 for 0.0, as NumPy */
MT_EW_UNARY(abs, T, MT_EW_ABS(v))
#else
MT_EW_UNARY(neg, T, MT_EW_SUB(0, v))
MT_EW_UNARY(abs, T, MT_EW_ABS(v))
#endif

#if MT_EW_K == 0 || MT_EW_K == 1
MT_EW_UNARY(relu, T, v < 0 ? (T)0 : v)
MT_EW_UNARY(sign, T, v > 0 ? (T)1 : (v < 0 ? (T)-1 : v))
#elif MT_EW_K == 2
MT_EW_UNARY(relu, T, v)
MT_EW_UNARY(sign, T, (T)(v > 0))
#endif

#if MT_EW_K == 1
/* Python's %: the sign of the divisor (q != 0; q == -1 would overflow on MIN % -1) */
static inline T MT_FN(mt_mod1)(T p, T q) {
    T r = q == -1 ? (T)0 : (T)(p % q);
    return (r != 0 && ((r < 0) != (q < 0))) ? (T)(r + q) : r;
}
#endif

#if MT_EW_K == 1 || MT_EW_K == 2
MT_EW_UNARY(bitwise_not, T, (T)~v)
#endif

#if MT_EW_K == 0
static inline T MT_FN(mt_sigmoid1)(T v) {
    T e = exp(-fabs(v)); /* exp of -|v| only: nothing overflows */
    return v >= 0 ? (T)1 / ((T)1 + e) : e / ((T)1 + e);
}
static inline T MT_FN(mt_softplus1)(T v) { return (v > 0 ? v : (T)0) + log1p(exp(-fabs(v))); }
static inline T MT_FN(mt_clip1)(T v) { return v < 0 ? (T)0 : (v > 1 ? (T)1 : v); } /* NaN stays NaN */
/* NumPy's remainder: the sign of the divisor (a zero result too) */
static inline T MT_FN(mt_mod1)(T p, T q) {
    T r = fmod(p, q);
    if (r != 0 && ((r < 0) != (q < 0))) r += q;
    return r == 0 ? copysign((T)0, q) : r;
}

MT_EW_UNARY(sigmoid, T, MT_FN(mt_sigmoid1)(v))
MT_EW_UNARY(tanh, T, tanh(v))
MT_EW_UNARY(exp, T, exp(v))
MT_EW_UNARY(log, T, log(v))
MT_EW_UNARY(sqrt, T, sqrt(v))
MT_EW_UNARY(erf, T, erf(v))
MT_EW_UNARY(sin, T, sin(v))
MT_EW_UNARY(cos, T, cos(v))
MT_EW_UNARY(tan, T, tan(v))
MT_EW_UNARY(asin, T, asin(v))
MT_EW_UNARY(acos, T, acos(v))
MT_EW_UNARY(atan, T, atan(v))
MT_EW_UNARY(sinh, T, sinh(v))
MT_EW_UNARY(cosh, T, cosh(v))
MT_EW_UNARY(asinh, T, asinh(v))
MT_EW_UNARY(acosh, T, acosh(v))
MT_EW_UNARY(atanh, T, atanh(v))
MT_EW_UNARY(ceil, T, ceil(v))
MT_EW_UNARY(floor, T, floor(v))
MT_EW_UNARY(round, T, rint(v)) /* the default rounding mode: half to even */
MT_EW_UNARY(reciprocal, T, (T)1 / v)
MT_EW_UNARY(softplus, T, MT_FN(mt_softplus1)(v))
MT_EW_UNARY(softsign, T, v / ((T)1 + fabs(v)))
MT_EW_UNARY(mish, T, v * tanh(MT_FN(mt_softplus1)(v)))
MT_EW_UNARY(swish, T, v * MT_FN(mt_sigmoid1)(a * v))
MT_EW_UNARY(hard_swish, T, v * MT_FN(mt_clip1)(v / (T)6 + (T)0.5))
MT_EW_UNARY(isnan, mt_bool, (mt_bool)(v != v))
/* a: detect_positive, b: detect_negative */
MT_EW_UNARY(isinf, mt_bool, (mt_bool)(isinf(v) && (v > 0 ? a != 0 : b != 0)))
MT_EW_UNARY(leaky_relu, T, v >= 0 ? v : a * v)
MT_EW_UNARY(elu, T, v > 0 ? v : a * expm1(v))
MT_EW_UNARY(selu, T, b * (v > 0 ? v : a * expm1(v)))
MT_EW_UNARY(celu, T, v > 0 ? v : (a * expm1(v / a) > 0 ? (T)0 : a * expm1(v / a)))
MT_EW_UNARY(hard_sigmoid, T, MT_FN(mt_clip1)(a * v + b))
MT_EW_UNARY(thresholded_relu, T, v > a ? v : (T)0)
/* a: bias, b: lambd */
MT_EW_UNARY(shrink, T, v < -b ? v + a : (v > b ? v - a : (T)0))
/* 0.5 v (1 + erf(v / sqrt 2)) as 0.5 v erfc(-v / sqrt 2), which does not cancel for large negative v */
MT_EW_UNARY(gelu, T, (T)0.5 * v * erfc(-v * (T)0.70710678118654752440))
/* 0.5 (1 + tanh(u)) as sigmoid(2u), likewise */
MT_EW_UNARY(gelu_tanh, T, v * MT_FN(mt_sigmoid1)((T)1.5957691216057307 * (v + (T)0.044715 * v * v * v)))
#endif

/* ---- two inputs, NumPy broadcasting ---------------------------------------------------------
 * shape: the output's dims (rank >= 1, collapsed by the caller); sa, sb: each input's element
 * strides per output dim (0 where it broadcasts). Rows of the innermost dim run as flat loops. */
#define MT_EW_BINARY(name, TY, expr)                                                                   \
    MT_EW_NOINLINE void MT_FN(mt_##name)(const T *a, const T *b, TY *y, int rank, const mt_i *shape,      \
                                        const mt_i *sa, const mt_i *sb) {                                \
        mt_i inner = shape[rank - 1], outer = 1;                                                         \
        for (int d = 0; d < rank - 1; d++) outer *= shape[d];                                            \
        mt_i ia = sa[rank - 1], ib = sb[rank - 1];                                                       \
        /* rows split in pieces, so one long row (a flat x + y) still spreads over the threads */       \
        mt_i piece = inner < MT_EW_PIECE ? inner : MT_EW_PIECE, pieces = (inner + piece - 1) / piece;    \
        _Pragma("omp parallel for if(outer * inner > MT_PAR_MIN)")                                        \
        for (mt_i t = 0; t < outer * pieces; t++) {                                                      \
            mt_i o = t / pieces, lo = (t % pieces) * piece, n = inner - lo < piece ? inner - lo : piece;  \
            mt_i oa, ob, oc;                                                                             \
            mt_bcast_row(o, rank, shape, sa, sb, 0, &oa, &ob, &oc);                                      \
            const T *pa = a + oa + lo * ia, *pb = b + ob + lo * ib;                                      \
            TY *py = y + o * inner + lo;                                                                 \
            if (ia == 1 && ib == 1) {                                                                    \
                _Pragma("omp simd")                                                                      \
                for (mt_i i = 0; i < n; i++) { T p = pa[i], q = pb[i]; py[i] = (expr); }                 \
            } else if (ia == 1 && ib == 0) {                                                             \
                T q = pb[0];                                                                             \
                _Pragma("omp simd")                                                                      \
                for (mt_i i = 0; i < n; i++) { T p = pa[i]; py[i] = (expr); }                            \
            } else if (ia == 0 && ib == 1) {                                                             \
                T p = pa[0];                                                                             \
                _Pragma("omp simd")                                                                      \
                for (mt_i i = 0; i < n; i++) { T q = pb[i]; py[i] = (expr); }                            \
            } else {                                                                                     \
                for (mt_i i = 0; i < n; i++) { T p = pa[i * ia], q = pb[i * ib]; py[i] = (expr); }       \
            }                                                                                            \
        }                                                                                                \
    }

/* A binary kernel that can fail on the data: `bad` (of p, q) marks an element (y gets 0 there)
 * and the kernel returns 1. */
#define MT_EW_BINARY_CHECKED(name, expr, bad)                                                          \
    MT_EW_NOINLINE int MT_FN(mt_##name)(const T *a, const T *b, T *y, int rank, const mt_i *shape,        \
                                       const mt_i *sa, const mt_i *sb) {                                 \
        mt_i inner = shape[rank - 1], outer = 1;                                                         \
        for (int d = 0; d < rank - 1; d++) outer *= shape[d];                                            \
        mt_i ia = sa[rank - 1], ib = sb[rank - 1];                                                       \
        int failed = 0;                                                                                  \
        _Pragma("omp parallel for reduction(|:failed) if(outer * inner > MT_PAR_MIN)")                    \
        for (mt_i o = 0; o < outer; o++) {                                                               \
            mt_i oa, ob, oc;                                                                             \
            mt_bcast_row(o, rank, shape, sa, sb, 0, &oa, &ob, &oc);                                      \
            const T *pa = a + oa, *pb = b + ob;                                                          \
            T *py = y + o * inner;                                                                       \
            for (mt_i i = 0; i < inner; i++) {                                                           \
                T p = pa[i * ia], q = pb[i * ib];                                                        \
                if (bad) { failed = 1; py[i] = 0; }                                                      \
                else py[i] = (expr);                                                                     \
            }                                                                                            \
        }                                                                                                \
        return failed;                                                                                   \
    }

#if MT_EW_K != 3
MT_EW_BINARY(add, T, MT_EW_ADD(p, q))
MT_EW_BINARY(sub, T, MT_EW_SUB(p, q))
MT_EW_BINARY(mul, T, MT_EW_MUL(p, q))
/* maximum/minimum propagate NaN, as NumPy's */
MT_EW_BINARY(max, T, (p > q || MT_EW_ISNAN(p)) ? p : q)
MT_EW_BINARY(min, T, (p < q || MT_EW_ISNAN(p)) ? p : q)
#endif
MT_EW_BINARY(equal, mt_bool, (mt_bool)(p == q))
MT_EW_BINARY(less, mt_bool, (mt_bool)(p < q))
MT_EW_BINARY(greater, mt_bool, (mt_bool)(p > q))
MT_EW_BINARY(less_equal, mt_bool, (mt_bool)(p <= q))
MT_EW_BINARY(greater_equal, mt_bool, (mt_bool)(p >= q))

#if MT_EW_K == 0
MT_EW_BINARY(div, T, p / q)
MT_EW_BINARY(pow, T, pow(p, q))
MT_EW_BINARY(fmod, T, fmod(p, q))
/* NumPy's remainder: the sign of the divisor */
MT_EW_BINARY(mod, T, MT_FN(mt_mod1)(p, q))
MT_EW_BINARY(prelu, T, p < 0 ? q * p : p)
#elif MT_EW_K == 1
/* C division truncates toward zero; zero divisors and MIN / -1 fail. */
MT_EW_BINARY_CHECKED(div, p / q, q == 0 || (p == MT_EW_LOW && q == -1))
MT_EW_BINARY_CHECKED(fmod, q == -1 ? (T)0 : (T)(p % q), q == 0)
MT_EW_BINARY_CHECKED(mod, MT_FN(mt_mod1)(p, q), q == 0)
MT_EW_BINARY(prelu, T, p < 0 ? MT_EW_MUL(q, p) : p)
#elif MT_EW_K == 2
MT_EW_BINARY_CHECKED(div, p / q, q == 0)
MT_EW_BINARY_CHECKED(fmod, (T)(p % q), q == 0)
MT_EW_BINARY_CHECKED(mod, (T)(p % q), q == 0)
#endif

#if MT_EW_K == 1 || MT_EW_K == 2
MT_EW_BINARY(bitwise_and, T, (T)(p & q))
MT_EW_BINARY(bitwise_or, T, (T)(p | q))
MT_EW_BINARY(bitwise_xor, T, (T)(p ^ q))
#endif
#if MT_EW_K == 1
/* Shifts by a negative amount or by >= the width leave only the sign fill (ONNX, as NumPy's kernel). */
MT_EW_BINARY(shift_left, T, (q >= 0 && q < (T)(8 * sizeof(T))) ? (T)((uint64_t)p << q) : (T)0)
MT_EW_BINARY(shift_right, T, (q >= 0 && q < (T)(8 * sizeof(T))) ? (T)(p >> q) : (T)(p < 0 ? -1 : 0))
#elif MT_EW_K == 2
MT_EW_BINARY(shift_left, T, (uint64_t)q < 8 * sizeof(T) ? (T)((uint64_t)p << q) : (T)0)
MT_EW_BINARY(shift_right, T, (uint64_t)q < 8 * sizeof(T) ? (T)(p >> q) : (T)0)
#endif
#if MT_EW_K == 3
MT_EW_BINARY(and, T, (T)(p && q))
MT_EW_BINARY(or, T, (T)(p || q))
MT_EW_BINARY(xor, T, (T)((p != 0) != (q != 0)))
#endif

/* ---- Where: three inputs broadcast, the condition a bool ---------------------------------- */
MT_EW_NOINLINE void MT_FN(mt_where)(const mt_bool *c, const T *a, const T *b, T *y, int rank, const mt_i *shape,
                                   const mt_i *sc, const mt_i *sa, const mt_i *sb) {
    mt_i inner = shape[rank - 1], outer = 1;
    for (int d = 0; d < rank - 1; d++) outer *= shape[d];
    mt_i ic = sc[rank - 1], ia = sa[rank - 1], ib = sb[rank - 1];
    _Pragma("omp parallel for if(outer * inner > MT_PAR_MIN)")
    for (mt_i o = 0; o < outer; o++) {
        mt_i oc, oa, ob;
        mt_bcast_row(o, rank, shape, sc, sa, sb, &oc, &oa, &ob);
        const mt_bool *pc = c + oc;
        const T *pa = a + oa, *pb = b + ob;
        T *py = y + o * inner;
        for (mt_i i = 0; i < inner; i++) py[i] = pc[i * ic] ? pa[i * ia] : pb[i * ib];
    }
}

/* ---- reductions ------------------------------------------------------------------------------
 * y has ny elements, one per index of the kept dims (ks: sizes, kt: x strides); each reduces the
 * dims rs (x strides rt). Empty reductions give the op's identity. `scale`: ReduceMean's 1/count. */
#define MT_EW_REDUCE(name, TA, init, step, final)                                                      \
    MT_EW_NOINLINE void MT_FN(mt_reduce_##name)(const T *X, T *restrict Y, mt_i ny, int kr, const mt_i *ks, \
                                               const mt_i *kt, int rr, const mt_i *rs, const mt_i *rt,    \
                                               double scale) {                                            \
        mt_i m = 1;                                                                                       \
        for (int d = 0; d < rr; d++) m *= rs[d];                                                          \
        mt_i inner = rr ? rs[rr - 1] : 1, step_ = rr ? rt[rr - 1] : 0, rows = inner ? m / inner : 0;      \
        (void)scale;                                                                                      \
        _Pragma("omp parallel for if(ny * m > MT_PAR_MIN)")                                                \
        for (mt_i j = 0; j < ny; j++) {                                                                   \
            mt_i r = j, base = 0;                                                                         \
            for (int d = kr - 1; d >= 0; d--) { base += (r % ks[d]) * kt[d]; r /= ks[d]; }                \
            TA acc = init;                                                                                \
            for (mt_i q = 0; q < rows; q++) {                                                             \
                mt_i rem = q, off = base;                                                                 \
                for (int d = rr - 2; d >= 0; d--) { off += (rem % rs[d]) * rt[d]; rem /= rs[d]; }         \
                const T *p = X + off;                                                                     \
                for (mt_i i = 0; i < inner; i++) { T v = p[i * step_]; step; }                            \
            }                                                                                             \
            Y[j] = final;                                                                                 \
        }                                                                                                 \
    }

MT_EW_REDUCE(max, T, MT_EW_LOW, if (v > acc || MT_EW_ISNAN(v)) acc = v, acc)
MT_EW_REDUCE(min, T, MT_EW_HIGH, if (v < acc || MT_EW_ISNAN(v)) acc = v, acc)
#if MT_EW_K != 3
MT_EW_REDUCE(sum, MT_EW_ACC, 0, acc += (MT_EW_ACC)v, (T)acc)
MT_EW_REDUCE(prod, MT_EW_ACC, 1, acc *= (MT_EW_ACC)v, (T)acc)
MT_EW_REDUCE(sum_square, MT_EW_ACC, 0, acc += (MT_EW_ACC)v * (MT_EW_ACC)v, (T)acc)
MT_EW_REDUCE(l1, MT_EW_ACC, 0, acc += (MT_EW_ACC)MT_EW_ABS(v), (T)acc)
#if MT_EW_K == 0
MT_EW_REDUCE(mean, T, 0, acc += v, (T)(acc * (T)scale))
MT_EW_REDUCE(l2, T, 0, acc += v * v, sqrt(acc))
MT_EW_REDUCE(log_sum, T, 0, acc += v, log(acc))
#else
MT_EW_REDUCE(mean, double, 0, acc += (double)v, MT_EW_FROM_D(acc * scale))
#endif
#endif

/* ---- reductions of one block of dims with kept dims after it: x is (outer, r, inner), y is
 * (outer, inner). Rows of x add into rows of y, so every access is contiguous (the generic
 * kernel above would walk x with stride inner). Tasks are (outer, piece of inner) pairs. */
#define MT_EW_REDUCE_ROWS(name, init, step, final)                                                     \
    MT_EW_NOINLINE void MT_FN(mt_reduce_rows_##name)(const T *X, T *restrict Y, mt_i outer, mt_i r,       \
                                                     mt_i inner, double scale) {                          \
        mt_i piece = inner < 4096 ? inner : 4096, pieces = (inner + piece - 1) / piece;                  \
        (void)scale;                                                                                      \
        _Pragma("omp parallel for if(outer * r * inner > MT_PAR_MIN)")                                     \
        for (mt_i t = 0; t < outer * pieces; t++) {                                                       \
            mt_i o = t / pieces, lo = (t % pieces) * piece, n = inner - lo < piece ? inner - lo : piece;   \
            T *y = Y + o * inner + lo;                                                                    \
            for (mt_i i = 0; i < n; i++) y[i] = (init);                                                   \
            for (mt_i k = 0; k < r; k++) {                                                                \
                const T *x = X + (o * r + k) * inner + lo;                                                \
                _Pragma("omp simd")                                                                       \
                for (mt_i i = 0; i < n; i++) { T v = x[i], acc = y[i]; step; y[i] = acc; }                \
            }                                                                                             \
            for (mt_i i = 0; i < n; i++) { T acc = y[i]; y[i] = (final); }                                \
        }                                                                                                 \
    }

MT_EW_REDUCE_ROWS(max, MT_EW_LOW, if (v > acc || MT_EW_ISNAN(v)) acc = v, acc)
MT_EW_REDUCE_ROWS(min, MT_EW_HIGH, if (v < acc || MT_EW_ISNAN(v)) acc = v, acc)
#if MT_EW_K != 3
MT_EW_REDUCE_ROWS(sum, 0, acc = MT_EW_ADD(acc, v), acc)
MT_EW_REDUCE_ROWS(prod, 1, acc = MT_EW_MUL(acc, v), acc)
MT_EW_REDUCE_ROWS(sum_square, 0, acc = MT_EW_ADD(acc, MT_EW_MUL(v, v)), acc)
MT_EW_REDUCE_ROWS(l1, 0, acc = MT_EW_ADD(acc, MT_EW_ABS(v)), acc)
#endif
#if MT_EW_K == 0
MT_EW_REDUCE_ROWS(mean, 0, acc += v, (T)(acc * (T)scale))
MT_EW_REDUCE_ROWS(l2, 0, acc += v * v, sqrt(acc))
MT_EW_REDUCE_ROWS(log_sum, 0, acc += v, log(acc))
#endif

#if MT_EW_K == 0
/* log(sum(exp(v - m))) + m, m the max (no shift when it is infinite) */
MT_EW_NOINLINE void MT_FN(mt_reduce_log_sum_exp)(const T *X, T *restrict Y, mt_i ny, int kr, const mt_i *ks,
                                                const mt_i *kt, int rr, const mt_i *rs, const mt_i *rt,
                                                double scale) {
    mt_i m = 1;
    for (int d = 0; d < rr; d++) m *= rs[d];
    (void)scale;
    _Pragma("omp parallel for if(ny * m > MT_PAR_MIN)")
    for (mt_i j = 0; j < ny; j++) {
        mt_i r = j, base = 0;
        for (int d = kr - 1; d >= 0; d--) { base += (r % ks[d]) * kt[d]; r /= ks[d]; }
        T mx = -(T)INFINITY, acc = 0;
        for (int pass = 0; pass < 2; pass++) {
            if (pass == 1 && !isfinite(mx)) mx = 0;
            for (mt_i q = 0; q < m; q++) {
                mt_i rem = q, off = base;
                for (int d = rr - 1; d >= 0; d--) { off += (rem % rs[d]) * rt[d]; rem /= rs[d]; }
                T v = X[off];
                if (pass == 0) { if (v > mx || v != v) mx = v; }
                else acc += exp(v - mx);
            }
        }
        Y[j] = log(acc) + mx;
    }
}
#endif

/* ---- ArgMax / ArgMin over the middle dim of (outer, n, inner): the first extreme, or the last
 * one with `last`; a NaN loses every comparison, so it wins only as the first element. --------- */
#define MT_EW_ARG(name, cmp)                                                                           \
    MT_EW_NOINLINE void MT_FN(mt_##name)(const T *X, int64_t *restrict Y, mt_i outer, mt_i n, mt_i inner,  \
                                        int last) {                                                      \
        _Pragma("omp parallel for if(outer * n * inner > MT_PAR_MIN)")                                    \
        for (mt_i o = 0; o < outer; o++)                                                                 \
            for (mt_i i = 0; i < inner; i++) {                                                           \
                const T *p = X + o * n * inner + i;                                                      \
                T best = p[0];                                                                           \
                int64_t k = 0;                                                                           \
                for (mt_i j = 1; j < n; j++) {                                                           \
                    T v = p[j * inner];                                                                  \
                    if ((v cmp best) || (last && v == best)) { best = v; k = j; }                        \
                }                                                                                        \
                Y[o * inner + i] = k;                                                                    \
            }                                                                                            \
    }
MT_EW_ARG(argmax, >)
MT_EW_ARG(argmin, <)

#if MT_EW_K != 3
/* ---- CumSum (product 0) and CumProd (product 1) over the middle dim of (outer, n, inner) ------ */
MT_EW_NOINLINE void MT_FN(mt_cumulate)(const T *X, T *restrict Y, mt_i outer, mt_i n, mt_i inner, int exclusive,
                                      int reverse, int product) {
    _Pragma("omp parallel for if(outer * n * inner > MT_PAR_MIN)")
    for (mt_i o = 0; o < outer; o++)
        for (mt_i i = 0; i < inner; i++) {
            const T *p = X + o * n * inner + i;
            T *q = Y + o * n * inner + i;
            T acc = product ? (T)1 : (T)0;
            for (mt_i t = 0; t < n; t++) {
                mt_i j = reverse ? n - 1 - t : t;
                T v = p[j * inner];
                if (exclusive) q[j * inner] = acc;
                acc = product ? MT_EW_MUL(acc, v) : MT_EW_ADD(acc, v);
                if (!exclusive) q[j * inner] = acc;
            }
        }
}
#endif

#undef MT_EW_UNARY
#undef MT_EW_BINARY
#undef MT_EW_BINARY_CHECKED
#undef MT_EW_REDUCE
#undef MT_EW_REDUCE_ROWS
#undef MT_EW_ARG
#undef MT_EW_ADD
#undef MT_EW_SUB
#undef MT_EW_MUL
#undef MT_EW_ABS
#undef MT_EW_ISNAN
#undef MT_EW_LOW
#undef MT_EW_HIGH
#undef MT_EW_ACC
#undef MT_EW_FROM_D
