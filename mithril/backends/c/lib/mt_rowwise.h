/* Kernels that work along one axis of their input: RMSNormalization, LpNormalization and TopK
 * (see mithril/backends/c/ops/rowwise.py).
 *
 * The input is seen as (outer, n, inner): the axis has n elements, `inner` apart. The second half of
 * this file is the template over one element type T: the first half includes the file again once
 * per type, with T, MT_SFX and MT_RW_K (0 float, 1 signed, 2 unsigned) defined, as mt_nn.h does
 * with mt_nn_t.h. The normalizations exist for float types only; TopK for every number.
 *
 * TopK orders NaN above every number and equal values by their lower index, largest and smallest
 * alike, as NumPy's stable argsort does.
 */
#ifndef MT_ROWWISE_T
#ifndef MT_ROWWISE_H
#define MT_ROWWISE_H

#include "mt_base.h"

#define MT_ROWWISE_T

#define T float
#define MT_SFX f32
#define MT_RW_K 0
#include "mt_rowwise.h"
#undef T
#undef MT_SFX
#undef MT_RW_K

#define T double
#define MT_SFX f64
#define MT_RW_K 0
#include "mt_rowwise.h"
#undef T
#undef MT_SFX
#undef MT_RW_K

#define T int8_t
#define MT_SFX i8
#define MT_RW_K 1
#include "mt_rowwise.h"
#undef T
#undef MT_SFX
#undef MT_RW_K

#define T int16_t
#define MT_SFX i16
#define MT_RW_K 1
#include "mt_rowwise.h"
#undef T
#undef MT_SFX
#undef MT_RW_K

#define T int32_t
#define MT_SFX i32
#define MT_RW_K 1
#include "mt_rowwise.h"
#undef T
#undef MT_SFX
#undef MT_RW_K

#define T int64_t
#define MT_SFX i64
#define MT_RW_K 1
#include "mt_rowwise.h"
#undef T
#undef MT_SFX
#undef MT_RW_K

#define T uint8_t
#define MT_SFX u8
#define MT_RW_K 2
#include "mt_rowwise.h"
#undef T
#undef MT_SFX
#undef MT_RW_K

#define T uint16_t
#define MT_SFX u16
#define MT_RW_K 2
#include "mt_rowwise.h"
#undef T
#undef MT_SFX
#undef MT_RW_K

#define T uint32_t
#define MT_SFX u32
#define MT_RW_K 2
#include "mt_rowwise.h"
#undef T
#undef MT_SFX
#undef MT_RW_K

#define T uint64_t
#define MT_SFX u64
#define MT_RW_K 2
#include "mt_rowwise.h"
#undef T
#undef MT_SFX
#undef MT_RW_K

#undef MT_ROWWISE_T
#endif /* MT_ROWWISE_H */

#else /* ---- the template: kernels over one element type T ---------------------------------- */

#if MT_RW_K == 0
/* ---- RMSNormalization: y = x / sqrt(mean(x^2) + eps) * scale over each row of `inner` elements;
 * the mean in double. scale is walked over the row as the collapsed dims (rank, shape, st: its
 * strides, 0 where it broadcasts) say; the last dim is the fastest. ------------------------------ */
static inline void MT_FN(mt_rmsnorm)(const T *X, const T *scale, T *restrict Y, mt_i outer, mt_i inner, int rank,
                                     const mt_i *shape, const mt_i *st, double eps) {
    const mt_i last = shape[rank - 1], sl = st[rank - 1], pieces = inner / last;
    _Pragma("omp parallel for if(outer * inner > MT_PAR_MIN)")
    for (mt_i o = 0; o < outer; o++) {
        const T *x = X + o * inner;
        T *restrict y = Y + o * inner;
        double ss = 0;
        for (mt_i i = 0; i < inner; i++) ss += (double)x[i] * (double)x[i];
        const T inv = (T)(1.0 / sqrt(ss / (double)inner + eps));
        for (mt_i p = 0; p < pieces; p++) {
            mt_i r = p, off = 0; /* scale's offset at the start of this piece */
            for (int d = rank - 2; d >= 0; d--) {
                off += r % shape[d] * st[d];
                r /= shape[d];
            }
            const T *s = scale + off;
            const T *xp = x + p * last;
            T *restrict yp = y + p * last;
            for (mt_i i = 0; i < last; i++) yp[i] = (T)(xp[i] * inv) * s[i * sl];
        }
    }
}

/* ---- LpNormalization: y = x / norm along the middle dim of (outer, n, inner), norm the sum of |x|
 * (p = 1) or the root of the sum of squares (p = 2), summed in double; a zero norm gives zeros --- */
static inline void MT_FN(mt_lpnorm)(const T *X, T *restrict Y, mt_i outer, mt_i n, mt_i inner, int p) {
    _Pragma("omp parallel for if(outer * n * inner > MT_PAR_MIN)")
    for (mt_i r = 0; r < outer * inner; r++) {
        const mt_i base = r / inner * n * inner + r % inner;
        const T *x = X + base;
        T *restrict y = Y + base;
        double s = 0;
        if (p == 1)
            for (mt_i j = 0; j < n; j++) s += fabs((double)x[j * inner]);
        else
            for (mt_i j = 0; j < n; j++) s += (double)x[j * inner] * (double)x[j * inner];
        const T norm = (T)(p == 1 ? s : sqrt(s));
        for (mt_i j = 0; j < n; j++) y[j * inner] = norm == 0 ? (T)0 : x[j * inner] / norm;
    }
}
#endif

/* ---- TopK along the middle dim of (outer, n, inner): the k first elements of each row in TopK's
 * order, values Val and int64 indices Idx (both (outer, k, inner)). A heap of k indices kept in
 * the row of Idx, its root the entry ranked last: O(n log k), no scratch. ----------------------------- */

/* Whether x[a] ranks before x[b] (x is a row, `inner` apart): larger first (smaller when not
 * `largest`), NaN above every number, equal values by the lower index. */
MT_INNER int MT_FN(mt_topk_before)(const T *x, mt_i inner, int64_t a, int64_t b, int largest) {
    const T p = x[a * inner], q = x[b * inner];
#if MT_RW_K == 0
    const int pn = p != p, qn = q != q;
    if (pn || qn) return pn && qn ? a < b : (largest ? pn : qn);
#endif
    if (p != q) return largest ? p > q : p < q;
    return a < b;
}

/* Restores the heap h[0..m) (entries `inner` apart) below entry t: a parent never ranks before its children. */
MT_INNER void MT_FN(mt_topk_sift)(const T *x, mt_i inner, int64_t *h, mt_i m, mt_i t, int largest) {
    for (;;) {
        mt_i c = 2 * t + 1;
        if (c >= m) return;
        if (c + 1 < m && MT_FN(mt_topk_before)(x, inner, h[c * inner], h[(c + 1) * inner], largest)) c++;
        if (!MT_FN(mt_topk_before)(x, inner, h[t * inner], h[c * inner], largest)) return;
        const int64_t e = h[t * inner];
        h[t * inner] = h[c * inner];
        h[c * inner] = e;
        t = c;
    }
}

static inline void MT_FN(mt_topk)(const T *X, T *restrict Val, int64_t *restrict Idx, mt_i outer, mt_i n,
                                  mt_i inner, mt_i k, int largest) {
    if (k <= 0) return; /* no heap to compare against */
    _Pragma("omp parallel for if(outer * n * inner > MT_PAR_MIN)")
    for (mt_i r = 0; r < outer * inner; r++) {
        const mt_i o = r / inner, i = r % inner;
        const T *x = X + o * n * inner + i;
        int64_t *h = Idx + o * k * inner + i;
        T *v = Val + o * k * inner + i;
        for (mt_i t = 0; t < k; t++) h[t * inner] = t;
        for (mt_i t = k / 2 - 1; t >= 0; t--) MT_FN(mt_topk_sift)(x, inner, h, k, t, largest);
        for (mt_i j = k; j < n; j++)
            if (MT_FN(mt_topk_before)(x, inner, j, h[0], largest)) {
                h[0] = j;
                MT_FN(mt_topk_sift)(x, inner, h, k, 0, largest);
            }
        for (mt_i m = k - 1; m > 0; m--) { /* heapsort: the entry ranked last goes to the end */
            const int64_t e = h[0];
            h[0] = h[m * inner];
            h[m * inner] = e;
            MT_FN(mt_topk_sift)(x, inner, h, m, 0, largest);
        }
        for (mt_i t = 0; t < k; t++) v[t * inner] = x[h[t * inner] * inner];
    }
}

#endif /* MT_ROWWISE_T */
