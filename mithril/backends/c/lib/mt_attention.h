/* Attention kernels (mithril/backends/c/ops/attention.py): ONNX Attention (opsets 23 to 25) and
 * RotaryEmbedding. They compute what mithril/backends/kernels/attention.py does.
 *
 * The second half of this file is the template over one float type T: the first half includes the
 * file again once per type, with T, MT_SFX and MT_ATT_EXP_LOW defined, as mt_nn.h does with
 * mt_nn_t.h; float64 first, so that a float32 Attention can take its softmax in float64
 * (softmax_precision).
 *
 * Attention's shapes are one `const mt_i *g` of 30 numbers, strides in elements:
 *
 *     g[0..7]   B, Hq, Hkv, Sq, Skv (new keys), P (past keys), D (Q and K head size), Dv
 *     g[8..10]  Q's strides along batch, head and query row (3-D or 4-D Q alike)
 *     g[11..13] K's, g[14..16] V's, g[17..19] Y's strides, the same way
 *     g[20..22] the mask's strides along batch, head and query row (0 where it broadcasts)
 *     g[23]     the mask's columns, <= P + Skv (the keys past them are masked)
 *     g[24]     is_causal   g[25] left_window_size   g[26] right_window_size (-1: none)
 *     g[27]     past keys are given (the causal frontier then starts at P, not nonpad - Sq)
 *     g[28]     query rows per block (a work item is one block of one head)
 *     g[29]     scratch slots: the most threads that run at once, each on its own slot of
 *               MT_ATT_SLOT(T, rows, P + Skv, Dv) bytes
 */
#ifndef MT_ATTENTION_T
#ifndef MT_ATTENTION_H
#define MT_ATTENTION_H

#include "mt_base.h"
#include "mt_gemm.h" /* QK^T and PV; <omp.h> */

#define MT_ATT_A64(n) (((mt_i)(n) + 63) / 64 * 64)
/* A slot: the block's scores (rows x keys), its output rows (rows x Dv, for a Y whose rows are
 * not contiguous), and two rows of keys in double (the softmax's exponentials; float64 scores). */
#define MT_ATT_SLOT(T, rows, keys, Dv) \
    (MT_ATT_A64((rows) * (keys) * sizeof(T)) + MT_ATT_A64((rows) * (Dv) * sizeof(T)) + MT_ATT_A64(2 * (keys) * 8))

#define MT_ATTENTION_T

#define T double
#define MT_SFX f64
#define MT_ATT_EXP_LOW (-708.0) /* exp below this is under double's smallest normal */
#include "mt_attention.h"
#undef T
#undef MT_SFX
#undef MT_ATT_EXP_LOW

#define T float
#define MT_SFX f32
#define MT_ATT_EXP_LOW (-87.0f)
#include "mt_attention.h"
#undef T
#undef MT_SFX
#undef MT_ATT_EXP_LOW

#undef MT_ATTENTION_T
#endif /* MT_ATTENTION_H */

#else /* ---- the template: kernels over one float type T --------------------------------------- */

/* Softmax of one row of n scores in place (tmp: n more of T), as the reference's masked softmax:
 * a row of -inf only gives zeros, a NaN or +inf score makes the whole row NaN. A score more than
 * -MT_ATT_EXP_LOW below the row's maximum gives exactly 0 (its exp is under T's smallest normal;
 * libmvec computes such lanes one by one, and a causal row has half its scores at -inf). The
 * clamp is a loop of its own: GCC 12 vectorizes no loop holding both a select and a call. */
static inline void MT_FN(mt_attention_softmax)(T *restrict x, T *restrict tmp, mt_i n) {
    T m = -(T)INFINITY;
    int bad = 0;
    _Pragma("omp simd reduction(max:m) reduction(|:bad)")
    for (mt_i j = 0; j < n; j++) {
        m = x[j] > m ? x[j] : m;
        bad |= x[j] != x[j];
    }
    if (bad || m == (T)INFINITY || m == -(T)INFINITY) {
        const T fill = bad || m == (T)INFINITY ? (T)NAN : (T)0;
        for (mt_i j = 0; j < n; j++) x[j] = fill;
        return;
    }
    _Pragma("omp simd")
    for (mt_i j = 0; j < n; j++) tmp[j] = x[j] - m < MT_ATT_EXP_LOW ? MT_ATT_EXP_LOW : x[j] - m;
    T s = 0;
    _Pragma("omp simd reduction(+:s)")
    for (mt_i j = 0; j < n; j++) {
        T e = exp(tmp[j]);
        tmp[j] = e;
        s += e;
    }
    _Pragma("omp simd")
    for (mt_i j = 0; j < n; j++) x[j] = x[j] - m < MT_ATT_EXP_LOW ? (T)0 : tmp[j] / s;
}

/* dst (count heads of `len` rows of d, head-major) = each head's `past` rows, then its `len - past`
 * rows of src (head c of batch c / heads at src + (c / heads) * sb + (c % heads) * sh, rows rs
 * apart): present_key and present_value, or the keys and values the products read. */
static inline void MT_FN(mt_attention_concat)(const T *past, const T *src, T *restrict dst, mt_i count,
                                              mt_i heads, mt_i len, mt_i npast, mt_i d, mt_i sb, mt_i sh,
                                              mt_i rs) {
    _Pragma("omp parallel for if(count * len * d > MT_PAR_MIN)")
    for (mt_i c = 0; c < count; c++) {
        T *out = dst + c * len * d;
        if (npast > 0) memcpy(out, past + c * npast * d, (size_t)(npast * d) * sizeof(T));
        const T *in = src + (c / heads) * sb + (c % heads) * sh;
        for (mt_i t = 0; t < len - npast; t++) memcpy(out + (npast + t) * d, in + t * rs, (size_t)d * sizeof(T));
    }
}

/* Attention (geometry g: see the top of this file). Mf (float mask) or Mb (bool mask) or neither;
 * PK/PV the past keys and values, NULL when none; nonpad the per-batch count of valid keys (opset
 * 24's nonpad_kv_seqlen), NULL when none. Kc and Vc, when not NULL, receive the past and new keys
 * (values) head-major, [B, Hkv, P + Skv, D], and the products read them there: present_key and
 * present_value, or scratch when past keys come without those outputs. QK, when not NULL, receives
 * the scores at stage qk_mode (0 Q K^T scaled, 1 after softcap, 2 after the mask, 3 the softmax).
 * wide: the softmax runs in float64. scratch: g[29] slots (MT_ATT_SLOT). Work items (a block of
 * query rows of one head) are shared out dynamically; each thread keeps to its slot. */
static inline void MT_FN(mt_attention)(const T *Q, const T *K, const T *V, const T *Mf, const mt_bool *Mb,
                                       const T *PK, const T *PV, const int64_t *nonpad, T *restrict Y,
                                       T *restrict Kc, T *restrict Vc, T *restrict QK, char *scratch,
                                       const mt_i *g, T scale, T softcap, int qk_mode, int wide) {
    const mt_i B = g[0], Hq = g[1], Hkv = g[2], Sq = g[3], Skv = g[4], P = g[5], D = g[6], Dv = g[7];
    const mt_i Tn = P + Skv, groups = Hq / Hkv, Tm = g[23];
    const int masked = Mf || Mb, causal = g[24] != 0, frontier = causal || g[25] >= 0 || g[26] >= 0 || nonpad;
    mt_i kb = g[11], kh = g[12], ks = g[13], vb = g[14], vh = g[15], vs = g[16];
    if (Kc) {
        MT_FN(mt_attention_concat)(PK, K, Kc, B * Hkv, Hkv, Tn, P, D, kb, kh, ks);
        K = Kc, kb = Hkv * Tn * D, kh = Tn * D, ks = D;
    }
    if (Vc) {
        MT_FN(mt_attention_concat)(PV, V, Vc, B * Hkv, Hkv, Tn, P, Dv, vb, vh, vs);
        V = Vc, vb = Hkv * Tn * Dv, vh = Tn * Dv, vs = Dv;
    }
    const mt_i R = g[28], nblk = (Sq + R - 1) / R, items = B * Hq * nblk;
    const mt_i s_bytes = MT_ATT_A64(R * Tn * sizeof(T)), o_bytes = MT_ATT_A64(R * Dv * sizeof(T));
    mt_i threads = mt_threads();
    if (threads > g[29]) threads = g[29];
    _Pragma("omp parallel num_threads(threads) if(threads > 1 && B * Hq * Sq * Tn * (D + Dv) > MT_PAR_MIN)")
    {
#ifdef _OPENMP
        char *slot = scratch + omp_get_thread_num() * MT_ATT_SLOT(T, R, Tn, Dv);
#else
        char *slot = scratch;
#endif
        T *S = (T *)slot, *O = (T *)(slot + s_bytes);
        double *W = (double *)(slot + s_bytes + o_bytes);
        _Pragma("omp for schedule(dynamic)")
        for (mt_i it = 0; it < items; it++) {
            const mt_i b = it / (Hq * nblk), h = it / nblk % Hq, i0 = it % nblk * R;
            const mt_i rows = Sq - i0 < R ? Sq - i0 : R;
            const T *k = K + b * kb + (h / groups) * kh, *v = V + b * vb + (h / groups) * vh;
            MT_FN(mt_gemm)(Q + b * g[8] + h * g[9] + i0 * g[10], k, 0, S, rows, Tn, D, g[10], 1, 1, ks, 0, 0, scale,
                           (T)0);
            for (mt_i r = 0; r < rows; r++) {
                const mt_i i = i0 + r;
                T *restrict s = S + r * Tn;
                T *qk = QK ? QK + ((b * Hq + h) * Sq + i) * Tn : 0;
                if (qk && qk_mode == 0) memcpy(qk, s, (size_t)Tn * sizeof(T));
                if (softcap != 0) {
                    _Pragma("omp simd")
                    for (mt_i j = 0; j < Tn; j++) s[j] = softcap * tanh(s[j] / softcap);
                }
                if (qk && qk_mode == 1) memcpy(qk, s, (size_t)Tn * sizeof(T));
                if (masked || frontier) {
                    /* the keys the frontier lets this query see: [lo, hi) */
                    mt_i lo = 0, hi = Tn;
                    if (frontier) {
                        const mt_i pos = i + (g[27] ? P : nonpad ? (mt_i)nonpad[b] - Sq : 0);
                        if (causal && pos + 1 < hi) hi = pos + 1;
                        if (g[25] >= 0 && pos - g[25] > lo) lo = pos - g[25];
                        if (g[26] >= 0 && pos + g[26] + 1 < hi) hi = pos + g[26] + 1;
                        if (nonpad && (mt_i)nonpad[b] < hi) hi = (mt_i)nonpad[b];
                    }
                    const mt_i m0 = b * g[20] + h * g[21] + i * g[22];
                    for (mt_i j = 0; j < Tn; j++) {
                        /* the mask, then the frontier added to it, then both to the score */
                        T bias = 0;
                        if (masked)
                            bias = j >= Tm ? -(T)INFINITY : Mb ? (Mb[m0 + j] ? (T)0 : -(T)INFINITY) : Mf[m0 + j];
                        if (frontier && (j < lo || j >= hi)) bias += -(T)INFINITY;
                        s[j] += bias;
                    }
                }
                if (qk && qk_mode == 2) memcpy(qk, s, (size_t)Tn * sizeof(T));
                if (wide) {
                    for (mt_i j = 0; j < Tn; j++) W[j] = (double)s[j];
                    mt_attention_softmax_f64(W, W + Tn, Tn);
                    for (mt_i j = 0; j < Tn; j++) s[j] = (T)W[j];
                } else {
                    MT_FN(mt_attention_softmax)(s, (T *)W, Tn);
                }
                if (qk && qk_mode == 3) memcpy(qk, s, (size_t)Tn * sizeof(T));
            }
            /* Y's rows of this block: in place when they are contiguous (4-D), else through O */
            const mt_i ys = g[19];
            T *y = Y + b * g[17] + h * g[18] + i0 * ys;
            T *o = ys == Dv ? y : O;
            MT_FN(mt_gemm)(S, v, 0, o, rows, Dv, Tn, Tn, 1, vs, 1, 0, 0, (T)1, (T)0);
            if (o != y)
                for (mt_i r = 0; r < rows; r++) memcpy(y + r * ys, O + r * Dv, (size_t)Dv * sizeof(T));
        }
    }
}

/* RotaryEmbedding: X and Y are [B, S, H, D] walked with strides sb, ss, sh (3-D or 4-D alike, the
 * head's D elements contiguous). The first `rot` of each head's D rotate by the angle whose cos and
 * sin are row p of the caches (`half` = rot / 2 values each) for position (b, s): with position ids,
 * p = pos[b * bstep + s] (p < rows, else nonzero is returned), else p = b * bstep + s; bstep is S,
 * or 0 where the ids (the caches) hold one batch for all. interleaved: pairs (2i, 2i + 1), else
 * (i, i + half). The rest of the head is copied. */
static inline int MT_FN(mt_rotary)(const T *X, const T *cosc, const T *sinc, const int64_t *pos, T *restrict Y,
                                   mt_i B, mt_i S, mt_i H, mt_i D, mt_i rot, mt_i rows, mt_i bstep, mt_i sb, mt_i ss,
                                   mt_i sh, int interleaved) {
    const mt_i half = rot / 2;
    if (pos)
        for (mt_i i = 0; i < (bstep ? B : 1) * S; i++)
            if (pos[i] < 0 || pos[i] >= rows) return 1;
    _Pragma("omp parallel for if(B * S * H * D > MT_PAR_MIN)")
    for (mt_i bs = 0; bs < B * S; bs++) {
        const mt_i at = (bs / S) * bstep + bs % S, p = pos ? (mt_i)pos[at] : at;
        const mt_i off = (bs / S) * sb + (bs % S) * ss;
        const T *c = cosc + p * half, *sn = sinc + p * half;
        for (mt_i h = 0; h < H; h++) {
            const T *x = X + off + h * sh;
            T *restrict y = Y + off + h * sh;
            if (interleaved) {
                for (mt_i i = 0; i < half; i++) {
                    const T x1 = x[2 * i], x2 = x[2 * i + 1];
                    y[2 * i] = c[i] * x1 - sn[i] * x2;
                    y[2 * i + 1] = sn[i] * x1 + c[i] * x2;
                }
            } else {
                _Pragma("omp simd")
                for (mt_i i = 0; i < half; i++) {
                    const T x1 = x[i], x2 = x[i + half];
                    y[i] = c[i] * x1 - sn[i] * x2;
                    y[i + half] = sn[i] * x1 + c[i] * x2;
                }
            }
            for (mt_i d = rot; d < D; d++) y[d] = x[d];
        }
    }
    return 0;
}

#endif /* MT_ATTENTION_T */
