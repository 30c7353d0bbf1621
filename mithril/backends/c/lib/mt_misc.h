/* Kernels of no larger family (mithril/backends/c/ops/misc.py): the training optimizers Adagrad, Adam
 * and Momentum, the cosine windows (Hann, Hamming, Blackman), Det and TensorScatter.
 *
 * They compute what mithril/backends/kernels does. The optimizers work in the tensors' type T with
 * their attributes rounded to T and the learning rate formed in double from R and T, as NumPy
 * promotes a float32 R with an int64 T; every product and sum is rounded as NumPy's, one by one
 * (the library is built -std=c11, so no multiply-add is contracted).
 */
#ifndef MT_MISC_H
#define MT_MISC_H

#include "mt_base.h"

/* ---- optimizers: one optimized tensor of n elements per call, g' = norm * x + g throughout --------
 * Adagrad: rate = r / (1 + t * decay); h' = h + g'^2; x' = x - rate * g' / (sqrt(h') + eps).
 * Adam: v' = alpha v + (1 - alpha) g'; h' = beta h + (1 - beta) g'^2;
 *       x' = (1 - post) (x - rate v' / (sqrt(h') + eps)), rate = r sqrt(1 - beta^t) / (1 - alpha^t)
 *       from t = 1 on, r at t <= 0.
 * Momentum: v' = alpha v + beta' g' (beta' = 1 at t <= 0); x' = x - r v' (standard) or
 *       x - r (g' + alpha v') (nesterov). */
#define MT_OPTIMIZERS(T, S)                                                                                  \
    static inline void mt_adagrad_##S(const T *restrict x, const T *restrict g, const T *restrict h,         \
                                      T *restrict xo, T *restrict ho, mt_i n, double r, int64_t t,            \
                                      double decay, double eps, double norm) {                                \
        const T rate = (T)(r / (1.0 + (double)t * decay)), ep = (T)eps, nc = (T)norm;                         \
        MT_FOR_SIMD(n, i, const T gr = nc * x[i] + g[i]; const T hn = h[i] + gr * gr; ho[i] = hn;             \
                    xo[i] = x[i] - rate * gr / (sqrt(hn) + ep));                                              \
    }                                                                                                         \
    static inline void mt_adam_##S(const T *restrict x, const T *restrict g, const T *restrict v,            \
                                   const T *restrict h, T *restrict xo, T *restrict vo, T *restrict ho,       \
                                   mt_i n, double r, int64_t t, double alpha, double beta, double eps,        \
                                   double norm, double post) {                                                \
        const double rate = t <= 0 ? r : r * (sqrt(1.0 - pow(beta, (double)t)) / (1.0 - pow(alpha, (double)t))); \
        const T rt = (T)rate, a = (T)alpha, a1 = (T)(1.0 - alpha), b = (T)beta, b1 = (T)(1.0 - beta);         \
        const T ep = (T)eps, nc = (T)norm, keep = (T)(1.0 - post);                                            \
        MT_FOR_SIMD(n, i, const T gr = nc * x[i] + g[i]; const T vn = a * v[i] + a1 * gr;                     \
                    const T hn = b * h[i] + b1 * gr * gr; vo[i] = vn; ho[i] = hn;                             \
                    xo[i] = keep * (x[i] - rt * vn / (sqrt(hn) + ep)));                                       \
    }                                                                                                         \
    static inline void mt_momentum_##S(const T *restrict x, const T *restrict g, const T *restrict v,        \
                                       T *restrict xo, T *restrict vo, mt_i n, double r, int64_t t,           \
                                       double alpha, double beta, double norm, int nesterov) {                \
        const T rt = (T)r, a = (T)alpha, b = (T)(t > 0 ? beta : 1.0), nc = (T)norm;                           \
        if (nesterov) {                                                                                       \
            MT_FOR_SIMD(n, i, const T gr = nc * x[i] + g[i]; const T vn = a * v[i] + b * gr; vo[i] = vn;      \
                        xo[i] = x[i] - rt * (gr + a * vn));                                                   \
        } else {                                                                                              \
            MT_FOR_SIMD(n, i, const T gr = nc * x[i] + g[i]; const T vn = a * v[i] + b * gr; vo[i] = vn;      \
                        xo[i] = x[i] - rt * vn);                                                              \
        }                                                                                                     \
    }

/* ---- cosine windows: y[i] = sum_k terms[k] cos(angles[k] * i / denom), in double ------------------
 * (terms[k] = (-1)^k a_k, angles[k] = 2 pi k; denom = n periodic, n - 1 symmetric). A symmetric
 * window of one point is [1]. */
#define MT_WINDOW(T, S)                                                                                      \
    static inline void mt_cosine_window_##S(T *restrict y, mt_i n, mt_i denom, const double *terms,           \
                                            const double *angles, int k_count) {                              \
        if (denom == 0) {                                                                                     \
            y[0] = (T)1;                                                                                      \
            return;                                                                                           \
        }                                                                                                     \
        for (mt_i i = 0; i < n; i++) {                                                                        \
            double w = 0.0;                                                                                   \
            for (int k = 0; k < k_count; k++) w = w + terms[k] * cos(angles[k] * (double)i / (double)denom);  \
            y[i] = (T)w;                                                                                      \
        }                                                                                                     \
    }

/* ---- Det of batch [m, m] matrices: LU with partial pivoting in double (lu: m * m scratch) ------- */
#define MT_DET(T, S)                                                                                         \
    static inline void mt_det_##S(const T *restrict x, T *restrict y, mt_i batch, mt_i m,                     \
                                  double *restrict lu) {                                                      \
        for (mt_i b = 0; b < batch; b++) {                                                                    \
            for (mt_i i = 0; i < m * m; i++) lu[i] = (double)x[b * m * m + i];                                \
            double det = 1.0;                                                                                 \
            for (mt_i k = 0; k < m && det != 0.0; k++) {                                                      \
                mt_i piv = k;                                                                                 \
                for (mt_i i = k + 1; i < m; i++)                                                              \
                    if (fabs(lu[i * m + k]) > fabs(lu[piv * m + k])) piv = i;                                 \
                if (piv != k) {                                                                               \
                    for (mt_i j = 0; j < m; j++) {                                                            \
                        const double tmp = lu[k * m + j];                                                     \
                        lu[k * m + j] = lu[piv * m + j];                                                      \
                        lu[piv * m + j] = tmp;                                                                \
                    }                                                                                         \
                    det = -det;                                                                               \
                }                                                                                             \
                const double p = lu[k * m + k];                                                               \
                det *= p;                                                                                     \
                if (p == 0.0) break;                                                                          \
                for (mt_i i = k + 1; i < m; i++) {                                                            \
                    const double f = lu[i * m + k] / p;                                                       \
                    for (mt_i j = k + 1; j < m; j++) lu[i * m + j] -= f * lu[k * m + j];                      \
                }                                                                                             \
            }                                                                                                 \
            y[b] = (T)det;                                                                                    \
        }                                                                                                     \
    }

MT_OPTIMIZERS(float, f32)
MT_OPTIMIZERS(double, f64)
MT_WINDOW(float, f32)
MT_WINDOW(double, f64)
MT_DET(float, f32)
MT_DET(double, f64)
#undef MT_OPTIMIZERS
#undef MT_WINDOW
#undef MT_DET

/* ---- TensorScatter, any element type: out = past, then update's rows [batch, mid, u] written at
 * rows idx[b] + s of [batch, mid, len] (modulo len when circular; outside [0, len) dropped). A row
 * is `row` bytes (the dims after the sequence axis); idx may be 0 (every write index 0). */
static inline void mt_tensor_scatter(const void *past, const void *restrict update, const int64_t *restrict idx,
                                     void *out, mt_i batch, mt_i mid, mt_i len, mt_i u, size_t row, int circular) {
    mt_copy_bytes(past, out, (size_t)(batch * mid * len) * row);
    for (mt_i b = 0; b < batch; b++)
        for (mt_i q = 0; q < mid; q++)
            for (mt_i s = 0; s < u; s++) {
                int64_t slot = (idx ? idx[b] : 0) + s;
                if (circular) {
                    slot %= len;
                    slot += slot < 0 ? len : 0;
                } else if (slot < 0 || slot >= len) {
                    continue;
                }
                memcpy((char *)out + ((size_t)((b * mid + q) * len) + (size_t)slot) * row,
                       (const char *)update + (size_t)((b * mid + q) * u + s) * row, row);
            }
}

#endif /* MT_MISC_H */
