/* Linear-attention kernels (mithril/backends/c/ops/linear_attention.py): ONNX LinearAttention and
 * CausalConvWithState (opset 27), SwiGLU (opset 28). They compute what
 * mithril/backends/kernels/attention.py does.
 *
 * LinearAttention runs its recurrence token by token, as the reference does (chunk_size is a GPU
 * hint with no effect on results): each (batch, KV head) pair owns its (dk, dv) state and is one
 * work item for the threads. A step makes two passes over the state, each along contiguous rows of
 * dv: decay the rows and read S^T k from them (delta rules), then add k (x) v and read q^T S for
 * every query head of the group.
 *
 * The second half of this file is the template over one float type T: the first half includes the
 * file again once per type, as mt_recurrent.h does.
 */
#ifndef MT_LINEAR_ATTENTION_T
#ifndef MT_LINEAR_ATTENTION_H
#define MT_LINEAR_ATTENTION_H

#include "mt_base.h"

#define MT_LINEAR_ATTENTION_T

#define T float
#define MT_SFX f32
#include "mt_linear_attention.h"
#undef T
#undef MT_SFX

#define T double
#define MT_SFX f64
#include "mt_linear_attention.h"
#undef T
#undef MT_SFX

#undef MT_LINEAR_ATTENTION_T
#endif /* MT_LINEAR_ATTENTION_H */

#else /* ---- the template: kernels over one float type T ---------------------------------------- */

/* 1 / (1 + exp(-v)), the NumPy kernels' form: branch-free, so the loops calling it vectorize. */
MT_INNER T MT_FN(mt_la_sigmoid)(T v) { return (T)1 / ((T)1 + exp(-v)); }

/* LinearAttention. q: (B, steps, Hq*dk); k: (B, steps, Hkv*dk); v: (B, steps, Hkv*dv); past:
 * (B, Hkv, dk, dv) or NULL (zeros). decay: NULL (no gating), else (B, steps, Hkv) when
 * decay_per_key is 0 or (B, steps, Hkv*dk) when 1, in log space. beta: NULL (no delta rule),
 * else (B, steps, beta_heads) with beta_heads Hkv or 1. y: (B, steps, Hq*dv); state: (B, Hkv, dk,
 * dv), the present state (it may be scratch when the node leaves it out). scratch: B*Hkv*dv
 * elements of T (the delta rule's corrected values). Query head j reads KV head j / (Hq / Hkv). */
static inline void MT_FN(mt_linear_attention)(const T *restrict q, const T *restrict k, const T *restrict v,
                                              const T *restrict past, const T *restrict decay,
                                              const T *restrict beta, T *restrict y, T *restrict state,
                                              T *restrict scratch, mt_i B, mt_i steps, mt_i Hq, mt_i Hkv, mt_i dk,
                                              mt_i dv, int decay_per_key, mt_i beta_heads, T scale) {
    const mt_i group = Hq / Hkv, pairs = B * Hkv;
    (void)pairs;
    _Pragma("omp parallel for if(pairs > 1 && pairs * steps * dk * dv > MT_PAR_MIN)")
    for (mt_i bh = 0; bh < B * Hkv; bh++) {
        const mt_i b = bh / Hkv, h = bh % Hkv;
        T *restrict S = state + bh * dk * dv;
        T *restrict u = scratch + bh * dv;
        if (past)
            memcpy(S, past + bh * dk * dv, (size_t)(dk * dv) * sizeof(T));
        else
            memset(S, 0, (size_t)(dk * dv) * sizeof(T));
        for (mt_i t = 0; t < steps; t++) {
            const mt_i row = b * steps + t; /* this token's row in the packed inputs */
            const T *restrict kt = k + (row * Hkv + h) * dk;
            const T *restrict vt = v + (row * Hkv + h) * dv;
            const T *restrict g = decay ? decay + (row * Hkv + h) * (decay_per_key ? dk : 1) : 0;
            const T *restrict src = vt; /* what the state adds, outer k */
            if (beta) {
                const T bt = beta[row * beta_heads + (beta_heads == 1 ? 0 : h)];
                for (mt_i j = 0; j < dv; j++) u[j] = 0;
                for (mt_i d = 0; d < dk; d++) {
                    T *restrict s = S + d * dv;
                    const T kd = kt[d];
                    if (g) {
                        const T e = exp(g[decay_per_key ? d : 0]);
                        _Pragma("omp simd")
                        for (mt_i j = 0; j < dv; j++) {
                            s[j] *= e;
                            u[j] += s[j] * kd;
                        }
                    } else {
                        _Pragma("omp simd")
                        for (mt_i j = 0; j < dv; j++) u[j] += s[j] * kd;
                    }
                }
                _Pragma("omp simd")
                for (mt_i j = 0; j < dv; j++) u[j] = bt * (vt[j] - u[j]);
                src = u;
            } else if (g) {
                for (mt_i d = 0; d < dk; d++) {
                    T *restrict s = S + d * dv;
                    const T e = exp(g[decay_per_key ? d : 0]);
                    _Pragma("omp simd")
                    for (mt_i j = 0; j < dv; j++) s[j] *= e;
                }
            }
            T *restrict yt = y + (row * Hq + h * group) * dv; /* the group's query heads are adjacent */
            const T *restrict qt = q + (row * Hq + h * group) * dk;
            for (mt_i j = 0; j < group * dv; j++) yt[j] = 0;
            for (mt_i d = 0; d < dk; d++) {
                T *restrict s = S + d * dv;
                const T kd = kt[d];
                _Pragma("omp simd")
                for (mt_i j = 0; j < dv; j++) s[j] += kd * src[j];
                for (mt_i r = 0; r < group; r++) {
                    const T qd = qt[r * dk + d];
                    T *restrict o = yt + r * dv;
                    _Pragma("omp simd")
                    for (mt_i j = 0; j < dv; j++) o[j] += qd * s[j];
                }
            }
            _Pragma("omp simd")
            for (mt_i j = 0; j < group * dv; j++) yt[j] *= scale;
        }
    }
}

/* CausalConvWithState: a depthwise causal 1-D convolution over each of B*C rows of x (B, C, L),
 * read after the row's K-1 positions of past (B, C, K-1; NULL: zeros). w: (C, 1, K); bias: C or
 * NULL. y: (B, C, L), then y * sigmoid(y) when silu; present: (B, C, K-1), the last K-1
 * positions of past then x, or NULL. */
static inline void MT_FN(mt_causal_conv)(const T *restrict x, const T *restrict w, const T *restrict bias,
                                         const T *restrict past, T *restrict y, T *restrict present, mt_i B,
                                         mt_i C, mt_i L, mt_i K, int silu) {
    const mt_i P = K - 1, rows = B * C;
    (void)rows;
    _Pragma("omp parallel for if(rows > 1 && rows * L * K > MT_PAR_MIN)")
    for (mt_i r = 0; r < B * C; r++) {
        const mt_i c = r % C;
        const T *restrict xr = x + r * L, *restrict pr = past ? past + r * P : 0, *restrict wr = w + c * K;
        T *restrict yr = y + r * L;
        const T b0 = bias ? bias[c] : (T)0;
        _Pragma("omp simd")
        for (mt_i l = 0; l < L; l++) yr[l] = b0;
        /* Tap j reads padded[l + j]: the past for l < P - j, x[l + j - P] after. */
        for (mt_i j = 0; j < K; j++) {
            const T wj = wr[j];
            const mt_i split = P - j < L ? P - j : L;
            if (pr)
                for (mt_i l = 0; l < split; l++) yr[l] += wj * pr[l + j];
            _Pragma("omp simd")
            for (mt_i l = split; l < L; l++) yr[l] += wj * xr[l + j - P];
        }
        if (silu) {
            _Pragma("omp simd")
            for (mt_i l = 0; l < L; l++) yr[l] *= MT_FN(mt_la_sigmoid)(yr[l]);
        }
        if (present) {
            T *restrict sr = present + r * P;
            for (mt_i i = 0; i < P; i++) { /* padded[L + i] */
                const mt_i p = L + i;
                sr[i] = p < P ? (pr ? pr[p] : (T)0) : xr[p - P];
            }
        }
    }
}

/* SwiGLU: y = a * sigmoid(alpha * a) * b over n elements. */
static inline void MT_FN(mt_swiglu)(const T *restrict a, const T *restrict b, T *restrict y, mt_i n, T alpha) {
    MT_FOR_SIMD(n, i, const T v = a[i]; y[i] = v * MT_FN(mt_la_sigmoid)(alpha * v) * b[i])
}

#endif /* MT_LINEAR_ATTENTION_T */
