/* Template: elementwise kernels and reductions over element type T (see mt_base.h). Included once per type; no guard. */

/* ---- elementwise, one input ---------------------------------------------------------------- */
#define MT_UNARY(name, expr)                                                        \
    static inline void MT_FN(mt_##name)(const T *restrict x, T *restrict y, mt_i n) {      \
        _Pragma("omp parallel for simd if(n > MT_PAR_MIN)")                          \
        for (mt_i i = 0; i < n; i++) { T v = x[i]; y[i] = (expr); }                  \
    }

MT_UNARY(relu, v > (T)0 ? v : (T)0)
MT_UNARY(sigmoid, (T)1 / ((T)1 + exp(-v)))
MT_UNARY(tanh, tanh(v))
MT_UNARY(exp, exp(v))
MT_UNARY(log, log(v))
MT_UNARY(sqrt, sqrt(v))
MT_UNARY(neg, -v)
MT_UNARY(abs, fabs(v))
MT_UNARY(erf, erf(v))
MT_UNARY(copy, v)

/* ---- elementwise, two inputs, NumPy broadcasting --------------------------------------------
 * shape: the output's dims (rank >= 1); sa, sb: each input's element strides per output dim
 * (0 where it broadcasts). The innermost dim runs as a flat loop. */
#define MT_BINARY(name, expr)                                                                    \
    static inline void MT_FN(mt_##name)(const T *a, const T *b, T *restrict y, int rank,               \
                                 const mt_i *shape, const mt_i *sa, const mt_i *sb) {            \
        mt_i inner = shape[rank - 1], outer = 1;                                                  \
        for (int d = 0; d < rank - 1; d++) outer *= shape[d];                                     \
        mt_i ia = sa[rank - 1], ib = sb[rank - 1];                                                \
        _Pragma("omp parallel for if(outer * inner > MT_PAR_MIN)")                                 \
        for (mt_i o = 0; o < outer; o++) {                                                        \
            mt_i r = o, oa = 0, ob = 0;                                                           \
            for (int d = rank - 2; d >= 0; d--) {                                                 \
                mt_i c = r % shape[d];                                                            \
                r /= shape[d];                                                                    \
                oa += c * sa[d];                                                                  \
                ob += c * sb[d];                                                                  \
            }                                                                                     \
            const T *pa = a + oa, *pb = b + ob;                                                   \
            T *py = y + o * inner;                                                                \
            if (ia == 1 && ib == 1) {                                                             \
                _Pragma("omp simd")                                                               \
                for (mt_i i = 0; i < inner; i++) { T p = pa[i], q = pb[i]; py[i] = (expr); }      \
            } else {                                                                              \
                for (mt_i i = 0; i < inner; i++) { T p = pa[i * ia], q = pb[i * ib]; py[i] = (expr); } \
            }                                                                                     \
        }                                                                                         \
    }

MT_BINARY(add, p + q)
MT_BINARY(sub, p - q)
MT_BINARY(mul, p * q)
MT_BINARY(div, p / q)
MT_BINARY(pow, pow(p, q))


/* ---- ReduceSum / ReduceMean: x walks the input; sy is y's stride per input dim (0: reduced) -- */
static inline void MT_FN(mt_reduce_sum)(const T *X, T *restrict Y, int rank, const mt_i *shape, const mt_i *sy,
                                 mt_i ny, T scale) {
    mt_i n = 1;
    for (int d = 0; d < rank; d++) n *= shape[d];
    for (mt_i j = 0; j < ny; j++) Y[j] = 0;
    for (mt_i i = 0; i < n; i++) {
        mt_i r = i, o = 0;
        for (int d = rank - 1; d >= 0; d--) { o += (r % shape[d]) * sy[d]; r /= shape[d]; }
        Y[o] += X[i];
    }
    if (scale != (T)1)
        for (mt_i j = 0; j < ny; j++) Y[j] *= scale;
}

#undef MT_UNARY
#undef MT_BINARY
