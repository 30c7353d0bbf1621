/* Elementwise kernels and reductions, per element type.
 *
 * mt_elementwise_t.h holds the kernels over one type T (math, comparisons, logic, reductions,
 * CumSum, ArgMax); it is included once per type with MT_EW_K, the kind of T: 0 float, 1 signed,
 * 2 unsigned, 3 bool, so each kernel exists only where it means something. Kernels over two
 * types (Cast, Pow with any base and exponent) are generated here from the type list.
 *
 * Integer arithmetic wraps (it runs in uint64_t, so nothing is C undefined behaviour); integer
 * Div and Mod return nonzero on a zero divisor (and Div on INT_MIN / -1), and the caller raises
 * a NodeError. Float to integer conversions saturate: NaN becomes 0, values beyond the type's
 * range become its lowest or highest value, the rest truncate toward zero.
 */
#ifndef MT_ELEMENTWISE_H
#define MT_ELEMENTWISE_H

#include "mt_base.h"

#include <float.h>

/* Kernels with several loop variants or an OpenMP region are compiled once per translation unit
 * and called, not inlined into every call site (a model with hundreds of calls compiles fast). */
#define MT_EW_PIECE 16384 /* elements of a row one thread takes at a time */

#ifndef MT_EW_NOINLINE
#define MT_EW_NOINLINE static __attribute__((noinline, unused))
#endif

/* The saturating selects vectorize once GCC may treat float compares as non-trapping. */
#if defined(__GNUC__) && !defined(__clang__)
#define MT_EW_NO_TRAPS __attribute__((optimize("no-trapping-math")))
#else
#define MT_EW_NO_TRAPS
#endif

/* ---- float -> integer, saturating (NaN -> 0) --------------------------------------------
 * Types up to 32 bits clamp in double, where both limits are exact, without branches (the loop
 * vectorizes); 64-bit limits are not exact in double, so those compare first. */
#define MT_EW_SAT(sfx, TI, LO, HI)                                                   \
    static inline MT_EW_NO_TRAPS TI mt_sat_##sfx(double v) {                                         \
        v = v < (double)(LO) ? (double)(LO) : v;                                      \
        v = v > (double)(HI) ? (double)(HI) : v;                                      \
        return (TI)(v == v ? v : 0);                                                  \
    }
#define MT_EW_SAT64(sfx, TI, LO, HI)                                                 \
    static inline MT_EW_NO_TRAPS TI mt_sat_##sfx(double v) {                                         \
        if (v != v) return 0;                                                         \
        if (v <= (double)(LO)) return LO;                                             \
        if (v >= (double)(HI)) return HI;                                             \
        return (TI)v;                                                                 \
    }
MT_EW_SAT(i8, int8_t, INT8_MIN, INT8_MAX)
MT_EW_SAT(i16, int16_t, INT16_MIN, INT16_MAX)
MT_EW_SAT(i32, int32_t, INT32_MIN, INT32_MAX)
MT_EW_SAT64(i64, int64_t, INT64_MIN, INT64_MAX)
MT_EW_SAT(u8, uint8_t, 0, UINT8_MAX)
MT_EW_SAT(u16, uint16_t, 0, UINT16_MAX)
MT_EW_SAT(u32, uint32_t, 0, UINT32_MAX)
MT_EW_SAT64(u64, uint64_t, 0, UINT64_MAX)
#undef MT_EW_SAT
#undef MT_EW_SAT64

/* ---- reductions with axes read at run time ------------------------------------------------
 * Splits x's dims into kept (ks, kt: sizes and x strides) and reduced (rs, rt) ones, as a
 * Reduce* node with `axes` (int64) and `noop` (noop_with_empty_axes) does. Returns 1 on an
 * axis out of range, 2 when the reduced shape differs from y's (the compiled one). */
static inline int mt_reduce_setup(int rank, const mt_i *shape, const int64_t *axes, mt_i naxes, int noop,
                                  int keepdims, int yrank, const mt_i *yshape, int *kr, mt_i *ks, mt_i *kt,
                                  int *rr, mt_i *rs, mt_i *rt) {
    int red[16];
    mt_i st[16], s = 1;
    if (rank > 16) return 1;
    for (int d = rank - 1; d >= 0; d--) { st[d] = s; s *= shape[d]; red[d] = naxes == 0 && !noop; }
    for (mt_i i = 0; i < naxes; i++) {
        int64_t a = axes[i] < 0 ? axes[i] + rank : axes[i];
        if (a < 0 || a >= rank) return 1;
        red[a] = 1;
    }
    int n = 0;
    *kr = *rr = 0;
    for (int d = 0; d < rank; d++) {
        if (red[d]) { rs[*rr] = shape[d]; rt[(*rr)++] = st[d]; }
        else { ks[*kr] = shape[d]; kt[(*kr)++] = st[d]; }
        if (keepdims || !red[d]) {
            if (n >= yrank || yshape[n] != (red[d] ? 1 : shape[d])) return 2;
            n++;
        }
    }
    return n == yrank ? 0 : 2;
}

/* ---- one axis split as (outer, n, inner), the axis read at run time: 1 when out of range -- */
static inline int mt_axis_split(int rank, const mt_i *shape, mt_i axis, mt_i *outer, mt_i *n, mt_i *inner) {
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank) return 1;
    *outer = *inner = 1;
    for (int d = 0; d < axis; d++) *outer *= shape[d];
    for (int d = axis + 1; d < rank; d++) *inner *= shape[d];
    *n = shape[axis];
    return 0;
}

/* Offsets of the row `o` of a broadcast walk: dims 0..rank-2 of `shape`, strides s0, s1, s2. */
static inline void mt_bcast_row(mt_i o, int rank, const mt_i *shape, const mt_i *s0, const mt_i *s1,
                                const mt_i *s2, mt_i *o0, mt_i *o1, mt_i *o2) {
    mt_i r = o, a = 0, b = 0, c = 0;
    for (int d = rank - 2; d >= 0; d--) {
        mt_i k = r % shape[d];
        r /= shape[d];
        a += k * s0[d];
        b += k * s1[d];
        if (s2) c += k * s2[d];
    }
    *o0 = a; *o1 = b; *o2 = c;
}

#define T float
#define MT_SFX f32
#define MT_EW_K 0
#include "mt_elementwise_t.h"
#undef T
#undef MT_SFX
#undef MT_EW_K

#define T double
#define MT_SFX f64
#define MT_EW_K 0
#include "mt_elementwise_t.h"
#undef T
#undef MT_SFX
#undef MT_EW_K

#define T int8_t
#define MT_SFX i8
#define MT_EW_K 1
#define MT_EW_LO INT8_MIN
#define MT_EW_HI INT8_MAX
#include "mt_elementwise_t.h"
#undef T
#undef MT_SFX
#undef MT_EW_K
#undef MT_EW_LO
#undef MT_EW_HI

#define T int16_t
#define MT_SFX i16
#define MT_EW_K 1
#define MT_EW_LO INT16_MIN
#define MT_EW_HI INT16_MAX
#include "mt_elementwise_t.h"
#undef T
#undef MT_SFX
#undef MT_EW_K
#undef MT_EW_LO
#undef MT_EW_HI

#define T int32_t
#define MT_SFX i32
#define MT_EW_K 1
#define MT_EW_LO INT32_MIN
#define MT_EW_HI INT32_MAX
#include "mt_elementwise_t.h"
#undef T
#undef MT_SFX
#undef MT_EW_K
#undef MT_EW_LO
#undef MT_EW_HI

#define T int64_t
#define MT_SFX i64
#define MT_EW_K 1
#define MT_EW_LO INT64_MIN
#define MT_EW_HI INT64_MAX
#include "mt_elementwise_t.h"
#undef T
#undef MT_SFX
#undef MT_EW_K
#undef MT_EW_LO
#undef MT_EW_HI

#define T uint8_t
#define MT_SFX u8
#define MT_EW_K 2
#define MT_EW_LO 0
#define MT_EW_HI UINT8_MAX
#include "mt_elementwise_t.h"
#undef T
#undef MT_SFX
#undef MT_EW_K
#undef MT_EW_LO
#undef MT_EW_HI

#define T uint16_t
#define MT_SFX u16
#define MT_EW_K 2
#define MT_EW_LO 0
#define MT_EW_HI UINT16_MAX
#include "mt_elementwise_t.h"
#undef T
#undef MT_SFX
#undef MT_EW_K
#undef MT_EW_LO
#undef MT_EW_HI

#define T uint32_t
#define MT_SFX u32
#define MT_EW_K 2
#define MT_EW_LO 0
#define MT_EW_HI UINT32_MAX
#include "mt_elementwise_t.h"
#undef T
#undef MT_SFX
#undef MT_EW_K
#undef MT_EW_LO
#undef MT_EW_HI

#define T uint64_t
#define MT_SFX u64
#define MT_EW_K 2
#define MT_EW_LO 0
#define MT_EW_HI UINT64_MAX
#include "mt_elementwise_t.h"
#undef T
#undef MT_SFX
#undef MT_EW_K
#undef MT_EW_LO
#undef MT_EW_HI

#define T mt_bool
#define MT_SFX b8
#define MT_EW_K 3
#define MT_EW_LO 0
#define MT_EW_HI 1
#include "mt_elementwise_t.h"
#undef T
#undef MT_SFX
#undef MT_EW_K
#undef MT_EW_LO
#undef MT_EW_HI

/* ---- kernels over two element types ------------------------------------------------------
 * MT_EW_PAIRS(X) calls X(TA, sa, ka, TB, sb, kb) for every pair of element types (k: kind). */
#define MT_EW_TO(X, TA, SA, KA)                                                              \
    X(TA, SA, KA, float, f32, 0) X(TA, SA, KA, double, f64, 0) X(TA, SA, KA, int8_t, i8, 1)    \
    X(TA, SA, KA, int16_t, i16, 1) X(TA, SA, KA, int32_t, i32, 1) X(TA, SA, KA, int64_t, i64, 1) \
    X(TA, SA, KA, uint8_t, u8, 2) X(TA, SA, KA, uint16_t, u16, 2) X(TA, SA, KA, uint32_t, u32, 2) \
    X(TA, SA, KA, uint64_t, u64, 2) X(TA, SA, KA, mt_bool, b8, 3)
#define MT_EW_PAIRS(X)                                                                        \
    MT_EW_TO(X, float, f32, 0) MT_EW_TO(X, double, f64, 0) MT_EW_TO(X, int8_t, i8, 1)          \
    MT_EW_TO(X, int16_t, i16, 1) MT_EW_TO(X, int32_t, i32, 1) MT_EW_TO(X, int64_t, i64, 1)     \
    MT_EW_TO(X, uint8_t, u8, 2) MT_EW_TO(X, uint16_t, u16, 2) MT_EW_TO(X, uint32_t, u32, 2)    \
    MT_EW_TO(X, uint64_t, u64, 2) MT_EW_TO(X, mt_bool, b8, 3)

/* Cast: value v of kind ka as TB (kind kb, suffix sb). */
#define MT_EW_CV_0_0(TB, SB, v) ((TB)(v))
#define MT_EW_CV_0_1(TB, SB, v) mt_sat_##SB((double)(v))
#define MT_EW_CV_0_2(TB, SB, v) mt_sat_##SB((double)(v))
#define MT_EW_CV_0_3(TB, SB, v) ((TB)((v) != 0))
#define MT_EW_CV_1_3(TB, SB, v) ((TB)((v) != 0))
#define MT_EW_CV_2_3(TB, SB, v) ((TB)((v) != 0))
#define MT_EW_CV_3_3(TB, SB, v) ((TB)((v) != 0))
#define MT_EW_CV_1_0(TB, SB, v) ((TB)(v))
#define MT_EW_CV_1_1(TB, SB, v) ((TB)(v))
#define MT_EW_CV_1_2(TB, SB, v) ((TB)(v))
#define MT_EW_CV_2_0(TB, SB, v) ((TB)(v))
#define MT_EW_CV_2_1(TB, SB, v) ((TB)(v))
#define MT_EW_CV_2_2(TB, SB, v) ((TB)(v))
#define MT_EW_CV_3_0(TB, SB, v) ((TB)(v))
#define MT_EW_CV_3_1(TB, SB, v) ((TB)(v))
#define MT_EW_CV_3_2(TB, SB, v) ((TB)(v))
#define MT_EW_CV(KA, KB, TB, SB, v) MT_EW_CV_##KA##_##KB(TB, SB, v)

#define MT_EW_CAST(TA, SA, KA, TB, SB, KB)                                                  \
    MT_EW_NOINLINE MT_EW_NO_TRAPS void mt_cast_##SA##_##SB(const TA *restrict x, TB *restrict y, mt_i n) {  \
        MT_FOR_SIMD(n, i, y[i] = MT_EW_CV(KA, KB, TB, SB, x[i]))                  \
    }
MT_EW_PAIRS(MT_EW_CAST)
#undef MT_EW_CAST

/* Integer power by squaring, wrapping. */
static inline uint64_t mt_ipow(uint64_t b, uint64_t e) {
    uint64_t r = 1;
    while (e) {
        if (e & 1) r *= b;
        b *= b;
        e >>= 1;
    }
    return r;
}

static inline uint64_t mt_ipow_s(int64_t b, int64_t e) {
    if (e >= 0) return mt_ipow((uint64_t)b, (uint64_t)e);
    return b == 1 ? 1 : (b == -1 ? ((e & 1) ? (uint64_t)-1 : 1) : 0);
}

/* Pow(base p of kind ka, exponent q of kind kb) as TA (the base's type): float bases in float64
 * unless both are the same type; integer bases to integer exponents exactly (a negative
 * exponent gives 0 except for bases 1 and -1); integer bases to float exponents through float64. */
#define MT_EW_POW_F(TA, SA, p, q) ((TA)pow((double)(p), (double)(q)))
#define MT_EW_POW_I(TA, SA, p, q) mt_sat_##SA(pow((double)(p), (double)(q)))
#define MT_EW_POW_S(TA, SA, p, q) ((TA)mt_ipow_s((int64_t)(p), (int64_t)(TA)(q)))
#define MT_EW_POW_U(TA, SA, p, q) ((TA)mt_ipow((uint64_t)(p), (uint64_t)(TA)(q)))
#define MT_EW_POW_0_0 MT_EW_POW_F
#define MT_EW_POW_0_1 MT_EW_POW_F
#define MT_EW_POW_0_2 MT_EW_POW_F
#define MT_EW_POW_1_0 MT_EW_POW_I
#define MT_EW_POW_2_0 MT_EW_POW_I
#define MT_EW_POW_1_1 MT_EW_POW_S
#define MT_EW_POW_1_2 MT_EW_POW_S
#define MT_EW_POW_2_1 MT_EW_POW_U
#define MT_EW_POW_2_2 MT_EW_POW_U
#define MT_EW_POW_(KA, KB) MT_EW_POW_##KA##_##KB
#define MT_EW_POWX(KA, KB) MT_EW_POW_(KA, KB)

/* A float base to an exponent that is 2 or 3 along a row (a constant or a parameter: LayerNorm's
 * square, the tanh GELU's cube) is products, as onnxruntime computes them (x * x * x differs from
 * the rounded pow() in a quarter of float32 cubes), and some fifty times faster than pow(). */
#define MT_EW_POW_PRODUCTS_0 1
#define MT_EW_POW_PRODUCTS_1 0
#define MT_EW_POW_PRODUCTS_2 0
#define MT_EW_POW_PRODUCTS_3 0
#define MT_EW_POW_PRODUCTS_(KA) MT_EW_POW_PRODUCTS_##KA
#define MT_EW_POW_PRODUCTS(KA) MT_EW_POW_PRODUCTS_(KA)

#define MT_EW_POW_KERNEL(TA, SA, KA, TB, SB, KB)                                                         \
    MT_EW_NOINLINE void mt_pow_##SA##_##SB(const TA *a, const TB *b, TA *y, int rank, const mt_i *shape,  \
                                          const mt_i *sa, const mt_i *sb) {                              \
        mt_i inner = shape[rank - 1], outer = 1;                                                          \
        for (int d = 0; d < rank - 1; d++) outer *= shape[d];                                             \
        mt_i ia = sa[rank - 1], ib = sb[rank - 1];                                                        \
        _Pragma("omp parallel for if(outer * inner > MT_PAR_MIN)")                                         \
        for (mt_i o = 0; o < outer; o++) {                                                                \
            mt_i oa, ob, oc;                                                                              \
            mt_bcast_row(o, rank, shape, sa, sb, 0, &oa, &ob, &oc);                                       \
            const TA *pa = a + oa;                                                                        \
            const TB *pb = b + ob;                                                                        \
            TA *py = y + o * inner;                                                                       \
            if (MT_EW_POW_PRODUCTS(KA) && inner > 0 && ib == 0 && (pb[0] == 2 || pb[0] == 3)) {          \
                if (pb[0] == 2)                                                                           \
                    for (mt_i i = 0; i < inner; i++) py[i] = pa[i * ia] * pa[i * ia];                     \
                else                                                                                      \
                    for (mt_i i = 0; i < inner; i++) py[i] = pa[i * ia] * pa[i * ia] * pa[i * ia];        \
                continue;                                                                                 \
            }                                                                                             \
            for (mt_i i = 0; i < inner; i++) {                                                            \
                TA p = pa[i * ia];                                                                        \
                TB q = pb[i * ib];                                                                        \
                py[i] = MT_EW_POWX(KA, KB)(TA, SA, p, q);                                                 \
            }                                                                                             \
        }                                                                                                 \
    }
#define MT_EW_POW_IF_NUMBERS(TA, SA, KA, TB, SB, KB) MT_EW_POW_SKIP_##KA##_##KB(TA, SA, KA, TB, SB, KB)
#define MT_EW_POW_SKIP_0_0 MT_EW_POW_KERNEL
#define MT_EW_POW_SKIP_0_1 MT_EW_POW_KERNEL
#define MT_EW_POW_SKIP_0_2 MT_EW_POW_KERNEL
#define MT_EW_POW_SKIP_1_0 MT_EW_POW_KERNEL
#define MT_EW_POW_SKIP_1_1 MT_EW_POW_KERNEL
#define MT_EW_POW_SKIP_1_2 MT_EW_POW_KERNEL
#define MT_EW_POW_SKIP_2_0 MT_EW_POW_KERNEL
#define MT_EW_POW_SKIP_2_1 MT_EW_POW_KERNEL
#define MT_EW_POW_SKIP_2_2 MT_EW_POW_KERNEL
#define MT_EW_POW_SKIP_0_3(...)
#define MT_EW_POW_SKIP_1_3(...)
#define MT_EW_POW_SKIP_2_3(...)
#define MT_EW_POW_SKIP_3_0(...)
#define MT_EW_POW_SKIP_3_1(...)
#define MT_EW_POW_SKIP_3_2(...)
#define MT_EW_POW_SKIP_3_3(...)
MT_EW_PAIRS(MT_EW_POW_IF_NUMBERS)

#endif /* MT_ELEMENTWISE_H */
