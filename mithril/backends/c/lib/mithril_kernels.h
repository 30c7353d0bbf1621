/* Mithril's C kernel library: static inline kernels over one element type T.
 *
 * A generated translation unit defines T (float or double) before including this header, so one
 * model's file holds one dtype. Shapes are passed as arguments (the generated file holds them as
 * constants); every pointer is C-contiguous. Kernels never allocate: scratch space (im2col) is a
 * slice of the model's arena. OpenMP threads the outer loops when the work is large enough.
 */
#ifndef MITHRIL_KERNELS_H
#define MITHRIL_KERNELS_H

#include <tgmath.h>
#include <string.h>

#ifndef T
#error "define T (float or double) before including mithril_kernels.h"
#endif

typedef long mt_i;

#define MT_PAR_MIN 32768 /* elements below which threading costs more than it saves */

/* ---- elementwise, one input ---------------------------------------------------------------- */
#define MT_UNARY(name, expr)                                                        \
    static inline void mt_##name(const T *restrict x, T *restrict y, mt_i n) {      \
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
    static inline void mt_##name(const T *a, const T *b, T *restrict y, int rank,               \
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

/* ---- GEMM: Y[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] (+ beta * C broadcast) ------------------
 * A(i,k) = A[i*ar + k*ac], B(k,j) = B[k*br + j*bc]. When B's rows are contiguous (bc == 1) the
 * i-k-j order vectorizes over j; otherwise each Y(i,j) is a dot product over k. Rows run in
 * parallel. C (may be NULL): C(i,j) = C[i*cr + j*cc]. */
static inline void mt_gemm(const T *A, const T *B, const T *C, T *restrict Y, mt_i M, mt_i N, mt_i K,
                           mt_i ar, mt_i ac, mt_i br, mt_i bc, mt_i cr, mt_i cc, T alpha, T beta) {
    _Pragma("omp parallel for if(M * N * K > MT_PAR_MIN)")
    for (mt_i i = 0; i < M; i++) {
        T *restrict y = Y + i * N;
        if (bc == 1) {
            for (mt_i j = 0; j < N; j++) y[j] = 0;
            const mt_i KB = 256; /* a block of B's rows stays in cache while y is updated */
            for (mt_i k0 = 0; k0 < K; k0 += KB) {
                mt_i k1 = k0 + KB < K ? k0 + KB : K;
                for (mt_i k = k0; k < k1; k++) {
                    T s = A[i * ar + k * ac];
                    const T *restrict b = B + k * br;
                    _Pragma("omp simd")
                    for (mt_i j = 0; j < N; j++) y[j] += s * b[j];
                }
            }
        } else {
            for (mt_i j = 0; j < N; j++) {
                T acc = 0;
                _Pragma("omp simd reduction(+:acc)")
                for (mt_i k = 0; k < K; k++) acc += A[i * ar + k * ac] * B[k * br + j * bc];
                y[j] = acc;
            }
        }
        if (alpha != (T)1)
            for (mt_i j = 0; j < N; j++) y[j] *= alpha;
        if (C)
            for (mt_i j = 0; j < N; j++) y[j] += beta * C[i * cr + j * cc];
    }
}

/* ---- 2-D convolution: im2col into `col` (arena scratch, (C/g)*KH*KW x OH*OW), then the GEMM --- */
static inline void mt_conv2d(const T *X, const T *W, const T *Bias, T *restrict Y, T *restrict col,
                             mt_i N, mt_i C, mt_i H, mt_i Wd, mt_i M, mt_i KH, mt_i KW, mt_i OH, mt_i OW,
                             mt_i groups, mt_i sh, mt_i sw, mt_i ph, mt_i pw, mt_i dh, mt_i dw) {
    mt_i Cg = C / groups, Mg = M / groups, P = OH * OW, R = Cg * KH * KW;
    for (mt_i n = 0; n < N; n++) {
        for (mt_i g = 0; g < groups; g++) {
            const T *x = X + (n * C + g * Cg) * H * Wd;
            _Pragma("omp parallel for if(R * P > MT_PAR_MIN)")
            for (mt_i r = 0; r < R; r++) {
                mt_i c = r / (KH * KW), kh = (r / KW) % KH, kw = r % KW;
                T *restrict dst = col + r * P;
                for (mt_i oh = 0; oh < OH; oh++) {
                    mt_i ih = oh * sh - ph + kh * dh;
                    for (mt_i ow = 0; ow < OW; ow++) {
                        mt_i iw = ow * sw - pw + kw * dw;
                        dst[oh * OW + ow] = (ih >= 0 && ih < H && iw >= 0 && iw < Wd) ? x[(c * H + ih) * Wd + iw] : (T)0;
                    }
                }
            }
            T *y = Y + (n * M + g * Mg) * P;
            mt_gemm(W + g * Mg * R, col, 0, y, Mg, P, R, R, 1, P, 1, 0, 0, (T)1, (T)0);
            if (Bias)
                for (mt_i m = 0; m < Mg; m++)
                    for (mt_i p = 0; p < P; p++) y[m * P + p] += Bias[g * Mg + m];
        }
    }
}

/* ---- 2-D pooling over (N*C) planes; out-of-range taps (padding, ceil_mode) are skipped ------- */
static inline void mt_maxpool2d(const T *X, T *restrict Y, mt_i NC, mt_i H, mt_i Wd, mt_i OH, mt_i OW,
                                mt_i KH, mt_i KW, mt_i sh, mt_i sw, mt_i ph, mt_i pw, mt_i dh, mt_i dw) {
    _Pragma("omp parallel for if(NC * OH * OW * KH * KW > MT_PAR_MIN)")
    for (mt_i p = 0; p < NC; p++) {
        const T *x = X + p * H * Wd;
        for (mt_i oh = 0; oh < OH; oh++)
            for (mt_i ow = 0; ow < OW; ow++) {
                T m = -INFINITY;
                for (mt_i kh = 0; kh < KH; kh++) {
                    mt_i ih = oh * sh - ph + kh * dh;
                    if (ih < 0 || ih >= H) continue;
                    for (mt_i kw = 0; kw < KW; kw++) {
                        mt_i iw = ow * sw - pw + kw * dw;
                        if (iw < 0 || iw >= Wd) continue;
                        T v = x[ih * Wd + iw];
                        if (v > m || v != v) m = v;
                    }
                }
                Y[(p * OH + oh) * OW + ow] = m;
            }
    }
}

/* count_include_pad: divide by the window clipped to the padded input, else to the input. */
static inline void mt_avgpool2d(const T *X, T *restrict Y, mt_i NC, mt_i H, mt_i Wd, mt_i OH, mt_i OW,
                                mt_i KH, mt_i KW, mt_i sh, mt_i sw, mt_i ph, mt_i pw, mt_i pe_h, mt_i pe_w,
                                int count_include_pad) {
    _Pragma("omp parallel for if(NC * OH * OW * KH * KW > MT_PAR_MIN)")
    for (mt_i p = 0; p < NC; p++) {
        const T *x = X + p * H * Wd;
        for (mt_i oh = 0; oh < OH; oh++)
            for (mt_i ow = 0; ow < OW; ow++) {
                T s = 0;
                mt_i cnt = 0, cnt_pad = 0;
                for (mt_i kh = 0; kh < KH; kh++) {
                    mt_i ih = oh * sh - ph + kh;
                    if (ih >= H + pe_h) continue;
                    for (mt_i kw = 0; kw < KW; kw++) {
                        mt_i iw = ow * sw - pw + kw;
                        if (iw >= Wd + pe_w) continue;
                        cnt_pad++;
                        if (ih < 0 || ih >= H || iw < 0 || iw >= Wd) continue;
                        s += x[ih * Wd + iw];
                        cnt++;
                    }
                }
                Y[(p * OH + oh) * OW + ow] = s / (T)(count_include_pad ? cnt_pad : cnt);
            }
    }
}

static inline void mt_global_avgpool(const T *X, T *restrict Y, mt_i NC, mt_i S) {
    _Pragma("omp parallel for if(NC * S > MT_PAR_MIN)")
    for (mt_i p = 0; p < NC; p++) {
        T s = 0;
        for (mt_i i = 0; i < S; i++) s += X[p * S + i];
        Y[p] = s / (T)S;
    }
}

/* ---- inference BatchNormalization over (N, C, S) -------------------------------------------- */
static inline void mt_batchnorm(const T *X, const T *scale, const T *bias, const T *mean, const T *var,
                                T *restrict Y, mt_i N, mt_i C, mt_i S, T eps) {
    _Pragma("omp parallel for if(N * C * S > MT_PAR_MIN)")
    for (mt_i nc = 0; nc < N * C; nc++) {
        mt_i c = nc % C;
        T a = scale[c] / sqrt(var[c] + eps), b = bias[c] - mean[c] * a;
        const T *x = X + nc * S;
        T *y = Y + nc * S;
        _Pragma("omp simd")
        for (mt_i i = 0; i < S; i++) y[i] = x[i] * a + b;
    }
}

/* ---- Softmax / LogSoftmax over the middle dim of (outer, n, inner) -------------------------- */
static inline void mt_softmax(const T *X, T *restrict Y, mt_i outer, mt_i n, mt_i inner, int log_out) {
    _Pragma("omp parallel for if(outer * n * inner > MT_PAR_MIN)")
    for (mt_i o = 0; o < outer; o++)
        for (mt_i k = 0; k < inner; k++) {
            const T *x = X + o * n * inner + k;
            T *y = Y + o * n * inner + k;
            T m = -INFINITY, s = 0;
            for (mt_i i = 0; i < n; i++) m = x[i * inner] > m ? x[i * inner] : m;
            for (mt_i i = 0; i < n; i++) s += exp(x[i * inner] - m);
            if (log_out) {
                T ls = log(s);
                for (mt_i i = 0; i < n; i++) y[i * inner] = x[i * inner] - m - ls;
            } else {
                for (mt_i i = 0; i < n; i++) y[i * inner] = exp(x[i * inner] - m) / s;
            }
        }
}

/* ---- Transpose: y's dim d walks x with stride sx[d] (x's stride of axis perm[d]) ------------ */
static inline void mt_transpose(const T *X, T *restrict Y, int rank, const mt_i *shape, const mt_i *sx) {
    mt_i n = 1;
    for (int d = 0; d < rank; d++) n *= shape[d];
    _Pragma("omp parallel for if(n > MT_PAR_MIN)")
    for (mt_i i = 0; i < n; i++) {
        mt_i r = i, o = 0;
        for (int d = rank - 1; d >= 0; d--) { o += (r % shape[d]) * sx[d]; r /= shape[d]; }
        Y[i] = X[o];
    }
}

/* ---- Concat: one input's (outer, chunk) block into y's (outer, total) rows at `offset` ------- */
static inline void mt_concat_part(const T *X, T *restrict Y, mt_i outer, mt_i chunk, mt_i total, mt_i offset) {
    for (mt_i o = 0; o < outer; o++) memcpy(Y + o * total + offset, X + o * chunk, (size_t)chunk * sizeof(T));
}

/* ---- ReduceSum / ReduceMean: x walks the input; sy is y's stride per input dim (0: reduced) -- */
static inline void mt_reduce_sum(const T *X, T *restrict Y, int rank, const mt_i *shape, const mt_i *sy,
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

#endif /* MITHRIL_KERNELS_H */
