/* Data movement kernels (views, Transpose, Slice, Gather, Scatter, Pad, ...), per element type.
 *
 * Data movement does not look at values, so every kernel exists for every element type. Index
 * tensors may be int32 or int64 (OneHot's any integer type): a kernel reads them through
 * mt_index_at with the code MT_IDX_<type>, so one kernel serves both. Kernels that read indices
 * check them all first and return nonzero on one out of range (the caller raises a NodeError).
 */
#ifndef MT_MOVEMENT_H
#define MT_MOVEMENT_H

#include "mt_base.h"

enum { MT_IDX_I32 = 0, MT_IDX_I64 = 1, MT_IDX_I8 = 2, MT_IDX_I16 = 3, MT_IDX_U8 = 4, MT_IDX_U16 = 5,
       MT_IDX_U32 = 6, MT_IDX_U64 = 7 };

/* Element k of an integer index tensor of type `code`, as mt_i. */
static inline mt_i mt_index_at(const void *p, int code, mt_i k) {
    switch (code) {
    case MT_IDX_I32: return (mt_i)((const int32_t *)p)[k];
    case MT_IDX_I8: return (mt_i)((const int8_t *)p)[k];
    case MT_IDX_I16: return (mt_i)((const int16_t *)p)[k];
    case MT_IDX_U8: return (mt_i)((const uint8_t *)p)[k];
    case MT_IDX_U16: return (mt_i)((const uint16_t *)p)[k];
    case MT_IDX_U32: return (mt_i)((const uint32_t *)p)[k];
    case MT_IDX_U64: return (mt_i)((const uint64_t *)p)[k];
    default: return (mt_i)((const int64_t *)p)[k];
    }
}

/* Element k of a numeric tensor of type `code` (MT_IDX_*, or MT_VAL_F32/F64), as double: OneHot
 * compares float indices in their own type, so a fractional one matches no class. */
enum { MT_VAL_F32 = 8, MT_VAL_F64 = 9 };
static inline double mt_value_at(const void *p, int code, mt_i k) {
    switch (code) {
    case MT_VAL_F32: return (double)((const float *)p)[k];
    case MT_VAL_F64: return ((const double *)p)[k];
    default: return (double)mt_index_at(p, code, k);
    }
}

/* BitCast to bool: each byte as 0 or 1, as NumPy's view(uint8) != 0. */
static inline void mt_bytes_to_bool(const uint8_t *x, mt_bool *restrict y, mt_i n) {
    for (mt_i i = 0; i < n; i++) y[i] = x[i] != 0;
}

/* n indices in [-dim, dim)? */
static inline int mt_indices_ok(const void *p, int code, mt_i n, mt_i dim) {
    for (mt_i k = 0; k < n; k++) {
        mt_i j = mt_index_at(p, code, k);
        if (j < -dim || j >= dim) return 0;
    }
    return 1;
}

static inline mt_i mt_clamp_i(mt_i v, mt_i lo, mt_i hi) { return v < lo ? lo : (v > hi ? hi : v); }

/* ---- Shape arguments read at run time (Reshape's shape, Expand's shape, Tile's repeats, ...):
 * the kernels take the output's static shape, so these return 1 when the values ask for another. */
static inline int mt_check_dims(const void *s, int code, mt_i n, const mt_i *want) {
    for (mt_i i = 0; i < n; i++)
        if (mt_value_at(s, code, i) != (double)want[i]) return 1;
    return 0;
}

/* Range: how many elements start, limit, delta give (-1 for a zero delta or an absurd count). */
static inline mt_i mt_range_len(double start, double limit, double delta) {
    if (delta == 0) return -1;
    double c = ceil((limit - start) / delta);
    if (!(c < 1e18)) return c > 0 ? -1 : 0; /* NaN or huge */
    return c > 0 ? (mt_i)c : 0;
}

/* Reshape: -1 is inferred, 0 copies x's dim unless allowzero. */
static inline int mt_check_reshape(const void *s, int code, mt_i n, int xrank, const mt_i *xs, const mt_i *ys,
                                   int allowzero) {
    for (mt_i i = 0; i < n; i++) {
        mt_i v = mt_index_at(s, code, i);
        if (v == -1) continue;
        if (v == 0 && !allowzero) {
            if (i >= xrank) return 1;
            v = xs[i];
        }
        if (v != ys[i]) return 1;
    }
    return 0;
}

/* Expand: x's shape (padded to y's rank) broadcast with the n trailing dims of s gives y. */
static inline int mt_check_expand(const void *s, int code, mt_i n, int rank, const mt_i *xs, const mt_i *ys) {
    for (mt_i i = 0; i < n; i++) {
        mt_i j = rank - n + i, v = mt_index_at(s, code, i), x = xs[j];
        mt_i got = v == 1 ? x : (x == 1 || x == v ? v : -1);
        if (got != ys[j]) return 1;
    }
    return 0;
}

/* ---- Slice, with starts/ends/axes/steps read at run time: fills the element offset `off` and
 * the strides `sy` (x's stride times the step, per axis) for mt_strided over y's shape. Returns
 * 1 on a zero step or an axis out of range, 2 when the slice's length differs from y's shape. */
static inline int mt_slice_setup(int rank, const mt_i *xshape, const mt_i *yshape, mt_i n,
                                 const void *starts, const void *ends, int code, const void *axes, int acode,
                                 const void *steps, int scode, mt_i *off, mt_i *sy) {
    mt_i begin[16], step[16], len[16], stride = 1;
    if (rank > 16) return 1;
    for (int d = 0; d < rank; d++) { begin[d] = 0; step[d] = 1; len[d] = xshape[d]; }
    for (mt_i i = 0; i < n; i++) {
        mt_i a = axes ? mt_index_at(axes, acode, i) : i;
        if (a < 0) a += rank;
        if (a < 0 || a >= rank) return 1;
        mt_i st = steps ? mt_index_at(steps, scode, i) : 1, dim = xshape[a];
        mt_i s = mt_index_at(starts, code, i), e = mt_index_at(ends, code, i);
        if (st == 0) return 1;
        if (s < 0) s += dim;
        if (e < 0) e += dim;
        if (dim == 0) { s = 0; len[a] = 0; }
        else if (st > 0) {
            s = mt_clamp_i(s, 0, dim); e = mt_clamp_i(e, 0, dim);
            len[a] = e > s ? (e - s + st - 1) / st : 0;
        } else {
            s = mt_clamp_i(s, 0, dim - 1); e = mt_clamp_i(e, -1, dim - 1);
            len[a] = s > e ? (s - e - st - 1) / (-st) : 0;
        }
        begin[a] = s; step[a] = st;
    }
    *off = 0;
    for (int d = rank - 1; d >= 0; d--) {
        if (len[d] != yshape[d]) return 2;
        *off += begin[d] * stride;
        sy[d] = stride * step[d];
        stride *= xshape[d];
    }
    return 0;
}

/* ---- Pad with pads (and axes) read at run time: the leading pad of each axis into `begin`.
 * Returns 1 on an axis out of range, 2 when the padded shape differs from y's. */
static inline int mt_pad_setup(int rank, const mt_i *xshape, const mt_i *yshape, const void *pads, int pcode,
                               mt_i npads, const void *axes, int acode, mt_i *begin) {
    mt_i end[16], n = npads / 2;
    if (rank > 16) return 1;
    for (int d = 0; d < rank; d++) begin[d] = end[d] = 0;
    for (mt_i i = 0; i < n; i++) {
        mt_i a = axes ? mt_index_at(axes, acode, i) : i;
        if (a < 0) a += rank;
        if (a < 0 || a >= rank) return 1;
        begin[a] = mt_index_at(pads, pcode, i);
        end[a] = mt_index_at(pads, pcode, i + n);
    }
    for (int d = 0; d < rank; d++)
        if (xshape[d] + begin[d] + end[d] != yshape[d]) return 2;
    return 0;
}

/* Pad modes: where y's coordinate c (already shifted by the leading pad) reads in a dim of n. */
enum { MT_PAD_CONSTANT = 0, MT_PAD_REFLECT = 1, MT_PAD_EDGE = 2, MT_PAD_WRAP = 3 };

static inline mt_i mt_pad_source(mt_i c, mt_i n, int mode) {
    if (c >= 0 && c < n) return c;
    switch (mode) {
    case MT_PAD_EDGE: return c < 0 ? 0 : n - 1;
    case MT_PAD_WRAP: return ((c % n) + n) % n;
    case MT_PAD_REFLECT: {
        if (n == 1) return 0;
        mt_i period = 2 * (n - 1);
        c = ((c % period) + period) % period;
        return c < n ? c : period - c;
    }
    default: return -1;
    }
}

#include "mt_movement_resize.h"

#define T float
#define MT_SFX f32
#include "mt_movement_t.h"
#undef T
#undef MT_SFX

#define T double
#define MT_SFX f64
#include "mt_movement_t.h"
#undef T
#undef MT_SFX

#define T int8_t
#define MT_SFX i8
#include "mt_movement_t.h"
#undef T
#undef MT_SFX

#define T int16_t
#define MT_SFX i16
#include "mt_movement_t.h"
#undef T
#undef MT_SFX

#define T int32_t
#define MT_SFX i32
#include "mt_movement_t.h"
#undef T
#undef MT_SFX

#define T int64_t
#define MT_SFX i64
#include "mt_movement_t.h"
#undef T
#undef MT_SFX

#define T uint8_t
#define MT_SFX u8
#include "mt_movement_t.h"
#undef T
#undef MT_SFX

#define T uint16_t
#define MT_SFX u16
#include "mt_movement_t.h"
#undef T
#undef MT_SFX

#define T uint32_t
#define MT_SFX u32
#include "mt_movement_t.h"
#undef T
#undef MT_SFX

#define T uint64_t
#define MT_SFX u64
#include "mt_movement_t.h"
#undef T
#undef MT_SFX

#define T mt_bool
#define MT_SFX b8
#include "mt_movement_t.h"
#undef T
#undef MT_SFX

#endif /* MT_MOVEMENT_H */
