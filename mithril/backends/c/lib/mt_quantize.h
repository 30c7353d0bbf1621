/* Quantization kernels (mithril/backends/c/ops/quantize.py): QuantizeLinear, DequantizeLinear,
 * DynamicQuantizeLinear and the integer products MatMulInteger, QLinearMatMul, ConvInteger and
 * QLinearConv. Each combines several element types; its name carries their suffixes in argument
 * order (mt_quantize_linear_<x>_<scale>_<y>, mt_qlinear_matmul_<a>_<b>_<y>, ...).
 *
 * They compute what mithril/backends/kernels/quantize.py does, bit for bit: x / scale divides in
 * the scale's type, rounds half to even (rint under the default rounding mode) and saturates to
 * the output's range (NaN -> 0); products accumulate (x - zero point) terms in int32 and requantize
 * as rint(acc * (a_scale * b_scale / y_scale)) + y_zero_point in float.
 *
 * (De)QuantizeLinear walk x as [outer, n, inner] and read the scale and zero point of element
 * (o, a, i) at o * so + (a / bs) * sa + i * si, from `const mt_i *w` = {outer, n, inner, bs, so,
 * sa, si} with si 0 or 1 (per tensor: {1, 1, numel, 1, 0, 0, 0}; per axis: sa = 1; blocked by bs
 * along the axis: so = ceil(n / bs) * inner, sa = inner, si = 1). A zero point is optional (0).
 *
 * With a storage-only type (mt_convert.h: int4/uint4/int2/uint2 or float8/float4 values, float16,
 * bfloat16 or float8e8m0 scales, half x or outputs) they run as mt_(de)quantize_linear_any, one
 * element at a time through mt_convert.h's loads, stores and encoder, the buffers typed by codes.
 */
#ifndef MT_QUANTIZE_H
#define MT_QUANTIZE_H

#include "mt_base.h"
#include "mt_convert.h"
#include "mt_nn.h" /* mt_window_range */

/* The saturating selects and rint vectorize once GCC may treat float compares as non-trapping. */
#if defined(__GNUC__) && !defined(__clang__)
#define MT_Q_NO_TRAPS __attribute__((optimize("no-trapping-math")))
#else
#define MT_Q_NO_TRAPS
#endif

/* Float v (of type TW) saturated to [LO, HI] as TY; NaN -> 0. */
#define MT_Q_SAT(TW, TY, LO, HI, v) \
    ((TY)((v) < (TW)(LO) ? (TW)(LO) : (v) > (TW)(HI) ? (TW)(HI) : (v) == (v) ? (v) : (TW)0))

/* The quantized output types: X(T, suffix, lowest, highest). */
#define MT_Q_OUTS(X, ...)                                                                      \
    X(int8_t, i8, INT8_MIN, INT8_MAX, __VA_ARGS__) X(uint8_t, u8, 0, UINT8_MAX, __VA_ARGS__)   \
    X(int16_t, i16, INT16_MIN, INT16_MAX, __VA_ARGS__) X(uint16_t, u16, 0, UINT16_MAX, __VA_ARGS__)

/* for each run of x's elements [e, e + len) that share one parameter index p (si == 0) or read
 * parameters p, p + 1, ... (si == 1): body. Threads take pieces of MT_PIECE elements. */
#define MT_Q_RUNS(w, ...)                                                                        \
    const mt_i mt_total_ = w[0] * w[1] * w[2];                                                   \
    _Pragma("omp parallel for if(mt_total_ > MT_PAR_MIN)")                                        \
    for (mt_i mt_p_ = 0; mt_p_ < mt_total_; mt_p_ += MT_PIECE) {                                 \
        const mt_i mt_end_ = mt_p_ + MT_PIECE < mt_total_ ? mt_p_ + MT_PIECE : mt_total_;        \
        mt_i i_ = mt_p_ % w[2], r_ = mt_p_ / w[2], a_ = r_ % w[1], o_ = r_ / w[1];               \
        for (mt_i e = mt_p_; e < mt_end_;) {                                                     \
            const mt_i len = w[2] - i_ < mt_end_ - e ? w[2] - i_ : mt_end_ - e;                  \
            const mt_i p = o_ * w[4] + (a_ / w[3]) * w[5] + i_ * w[6];                           \
            __VA_ARGS__;                                                                         \
            e += len;                                                                            \
            i_ = 0;                                                                              \
            if (++a_ == w[1]) { a_ = 0; o_++; }                                                  \
        }                                                                                        \
    }

/* ---- QuantizeLinear: y = saturate(rint(x / scale) + zero_point), in the scale's type TS ---- */
#define MT_Q_QUANTIZE(TY, SY, LO, HI, TX, SX, TS, SS)                                                        \
    static inline MT_Q_NO_TRAPS void mt_quantize_linear_##SX##_##SS##_##SY(                                  \
        const TX *restrict x, const TS *restrict s, const TY *restrict zp, TY *restrict y, const mt_i *w) {  \
        MT_Q_RUNS(w, {                                                                                         \
            if (w[6] == 0) {                                                                                   \
                const TS sc = s[p], z = zp ? (TS)zp[p] : (TS)0;                                                \
                _Pragma("omp simd")                                                                            \
                for (mt_i j = 0; j < len; j++) {                                                               \
                    const TS v = rint((TS)x[e + j] / sc) + z;                                                  \
                    y[e + j] = MT_Q_SAT(TS, TY, LO, HI, v);                                                    \
                }                                                                                              \
            } else {                                                                                           \
                for (mt_i j = 0; j < len; j++) {                                                               \
                    const TS v = rint((TS)x[e + j] / s[p + j]) + (zp ? (TS)zp[p + j] : (TS)0);                 \
                    y[e + j] = MT_Q_SAT(TS, TY, LO, HI, v);                                                    \
                }                                                                                              \
            }                                                                                                  \
        })                                                                                                     \
    }
MT_Q_OUTS(MT_Q_QUANTIZE, float, f32, float, f32)
MT_Q_OUTS(MT_Q_QUANTIZE, float, f32, double, f64)
MT_Q_OUTS(MT_Q_QUANTIZE, double, f64, float, f32)
MT_Q_OUTS(MT_Q_QUANTIZE, double, f64, double, f64)
MT_Q_OUTS(MT_Q_QUANTIZE, int32_t, i32, float, f32)
MT_Q_OUTS(MT_Q_QUANTIZE, int32_t, i32, double, f64)
#undef MT_Q_QUANTIZE

/* ---- DequantizeLinear: y = (TO)(x - zero_point) * (TO)scale, the difference in int32 (wrapping) -- */
#define MT_Q_DEQUANTIZE(TX, SX, TS, SS, TO, SO)                                                              \
    static inline void mt_dequantize_linear_##SX##_##SS##_##SO(const TX *restrict x, const TS *restrict s,    \
                                                               const TX *restrict zp, TO *restrict y,          \
                                                               const mt_i *w) {                                \
        MT_Q_RUNS(w, {                                                                                         \
            if (w[6] == 0) {                                                                                   \
                const TO sc = (TO)s[p];                                                                        \
                const uint32_t z = zp ? (uint32_t)zp[p] : 0;                                                   \
                _Pragma("omp simd")                                                                            \
                for (mt_i j = 0; j < len; j++) y[e + j] = (TO)(int32_t)((uint32_t)x[e + j] - z) * sc;          \
            } else {                                                                                           \
                for (mt_i j = 0; j < len; j++) {                                                               \
                    const uint32_t z = zp ? (uint32_t)zp[p + j] : 0;                                           \
                    y[e + j] = (TO)(int32_t)((uint32_t)x[e + j] - z) * (TO)s[p + j];                           \
                }                                                                                              \
            }                                                                                                  \
        })                                                                                                     \
    }
#define MT_Q_DEQUANTIZE_X(TX, SX)                                                                            \
    MT_Q_DEQUANTIZE(TX, SX, float, f32, float, f32) MT_Q_DEQUANTIZE(TX, SX, float, f32, double, f64)         \
    MT_Q_DEQUANTIZE(TX, SX, double, f64, float, f32) MT_Q_DEQUANTIZE(TX, SX, double, f64, double, f64)
MT_Q_DEQUANTIZE_X(int8_t, i8)
MT_Q_DEQUANTIZE_X(uint8_t, u8)
MT_Q_DEQUANTIZE_X(int16_t, i16)
MT_Q_DEQUANTIZE_X(uint16_t, u16)
MT_Q_DEQUANTIZE_X(int32_t, i32)
#undef MT_Q_DEQUANTIZE_X
#undef MT_Q_DEQUANTIZE

/* ---- (De)QuantizeLinear through type codes (mt_convert.h), as the NumPy kernel computes ----------
 * QuantizeLinear in TW (float32, or float64 for a float64 scale or precision): v = x / scale; to an
 * integer type rint(v) + zero point saturated to its range (NaN -> 0); to a float type v + zero
 * point rounded to nearest even, out of range (and infinities) to the largest finite value when
 * saturate is set (float4 always), else to inf or NaN. ml_dtypes narrows a double through float32,
 * so a float64 v is rounded to float first. */
MT_INNER int64_t mt_q_int_min(int c) {
    switch (c) {
    case MT_T_I8: return INT8_MIN;
    case MT_T_I16: return INT16_MIN;
    case MT_T_I4: return -8;
    case MT_T_I2: return -2;
    default: return 0;
    }
}

MT_INNER int64_t mt_q_int_max(int c) {
    switch (c) {
    case MT_T_I8: return INT8_MAX;
    case MT_T_U8: return UINT8_MAX;
    case MT_T_I16: return INT16_MAX;
    case MT_T_U16: return UINT16_MAX;
    case MT_T_I4: return 7;
    case MT_T_U4: return 15;
    case MT_T_I2: return 1;
    default: return 3;
    }
}

#define MT_Q_QUANTIZE_ANY(TW, SW)                                                                            \
    static inline void mt_quantize_linear_any_##SW(const void *restrict x, int xc, const void *restrict s,    \
                                                   int sc, const void *restrict zp, void *restrict y, int yc, \
                                                   const mt_i *w, int saturate) {                             \
        const int yint = mt_t_is_int(yc);                                                                     \
        const TW lo = (TW)mt_q_int_min(yc), hi = (TW)mt_q_int_max(yc);                                        \
        const mt_nf f = MT_NF_FORMATS[yint ? MT_T_F16 : yc]; /* the output's format (unused for ints) */      \
        MT_Q_RUNS(w, {                                                                                        \
            for (mt_i j = 0; j < len; j++) {                                                                  \
                const mt_i q = p + j * w[6];                                                                  \
                const TW xv = xc == MT_T_I32 ? (TW)((const int32_t *)x)[e + j] : (TW)mt_load_f(x, xc, e + j); \
                TW v = xv / (TW)mt_load_f(s, sc, q);                                                          \
                if (yint) {                                                                                   \
                    v = rint(v) + (zp ? (TW)mt_load_i(zp, yc, q) : (TW)0);                                    \
                    mt_store_i(y, yc, e + j, (int64_t)(v < lo ? lo : v > hi ? hi : v == v ? v : (TW)0));     \
                } else {                                                                                      \
                    if (zp) v += (TW)mt_load_f(zp, yc, q);                                                    \
                    ((uint8_t *)y)[e + j] = (uint8_t)mt_nf_encode((double)(float)v, f, saturate, 0);          \
                }                                                                                             \
            }                                                                                                 \
        })                                                                                                    \
    }
MT_Q_QUANTIZE_ANY(float, f32)
MT_Q_QUANTIZE_ANY(double, f64)
#undef MT_Q_QUANTIZE_ANY

/* v rounded to output type c (float32, float64, float16 or bfloat16, through float32 as ml_dtypes). */
MT_INNER double mt_q_round(double v, int c) {
    switch (c) {
    case MT_T_F32: return (float)v;
    case MT_T_F64: return v;
    case MT_T_F16: return mt_nf_decode(mt_nf_encode(v, MT_NF_FORMATS[c], 0, 0), MT_NF_FORMATS[c]);
    default: return mt_nf_decode(mt_nf_encode((float)v, MT_NF_FORMATS[c], 0, 0), MT_NF_FORMATS[c]);
    }
}

MT_INNER void mt_q_store(void *y, int c, mt_i i, double v) {
    switch (c) {
    case MT_T_F32: ((float *)y)[i] = (float)v; break;
    case MT_T_F64: ((double *)y)[i] = v; break;
    case MT_T_F16: ((uint16_t *)y)[i] = (uint16_t)mt_nf_encode(v, MT_NF_FORMATS[c], 0, 0); break;
    default: ((uint16_t *)y)[i] = (uint16_t)mt_nf_encode((float)v, MT_NF_FORMATS[c], 0, 0); break;
    }
}

/* DequantizeLinear: y = (x - zero point) * scale, the difference in int32 (wrapping) for integer x
 * and in float32 for float x; both factors rounded to the output type and multiplied in it (their
 * product is exact in double, so one rounding of it is the output type's product). */
static inline void mt_dequantize_linear_any(const void *restrict x, int xc, const void *restrict s, int sc,
                                            const void *restrict zp, void *restrict y, int yc, const mt_i *w) {
    const int xint = mt_t_is_int(xc);
    MT_Q_RUNS(w, {
        for (mt_i j = 0; j < len; j++) {
            const mt_i q = p + j * w[6];
            double d;
            if (xint)
                d = (double)(int32_t)((uint32_t)mt_load_i(x, xc, e + j) - (zp ? (uint32_t)mt_load_i(zp, xc, q) : 0u));
            else
                d = (double)((float)mt_load_f(x, xc, e + j) - (zp ? (float)mt_load_f(zp, xc, q) : 0.0f));
            mt_q_store(y, yc, e + j, mt_q_round(d, yc) * mt_q_round(mt_load_f(s, sc, q), yc));
        }
    })
}

/* ---- DynamicQuantizeLinear: uint8 over [min(x, 0), max(x, 0)]; the scale 1 where the range is 0 -- */
static inline MT_Q_NO_TRAPS void mt_dynamic_quantize_linear_f32(const float *restrict x, uint8_t *restrict y,
                                                                float *restrict y_scale,
                                                                uint8_t *restrict y_zero_point, mt_i n) {
    float lo = 0.0f, hi = 0.0f;
    _Pragma("omp parallel for simd reduction(min : lo) reduction(max : hi) if(n > MT_PAR_MIN)")
    for (mt_i i = 0; i < n; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    const float scale = (hi - lo) / 255.0f, safe = scale == 0.0f ? 1.0f : scale;
    float z = rint(-lo / safe);
    z = z < 0.0f ? 0.0f : z > 255.0f ? 255.0f : z;
    MT_FOR_SIMD(n, i, const float v = rint(x[i] / safe) + z; y[i] = MT_Q_SAT(float, uint8_t, 0, UINT8_MAX, v));
    if (y_scale) *y_scale = scale;
    if (y_zero_point) *y_zero_point = (uint8_t)z;
}

/* ---- integer products -------------------------------------------------------------------------
 * One row a[0..K) against columns [0, nt) of B (b: the tile's first column, rows N apart):
 * acc[j] = sum_k (a[k] - az) * (b[k * N + j] - bz[j * bzs]), the column zero points taken out
 * once at the end (sum_k (a[k] - az) times each), so the loop over j is a plain widening
 * multiply-add. bz may be 0 (no zero point). */
#define MT_Q_TILE 256 /* columns of one row accumulated at a time (an int32 array on the stack) */

#define MT_Q_ROW(TA, SA, TB, SB)                                                                             \
    MT_INNER void mt_q_row_##SA##_##SB(const TA *restrict a, const TB *restrict b, int32_t az,               \
                                       const TB *restrict bz, mt_i bzs, int32_t *restrict acc, mt_i nt,      \
                                       mt_i N, mt_i K) {                                                      \
        int32_t asum = 0;                                                                                     \
        for (mt_i j = 0; j < nt; j++) acc[j] = 0;                                                             \
        for (mt_i k = 0; k < K; k++) {                                                                        \
            const int32_t av = (int32_t)a[k] - az;                                                            \
            const TB *restrict bk = b + k * N;                                                                \
            asum += av;                                                                                       \
            _Pragma("omp simd")                                                                               \
            for (mt_i j = 0; j < nt; j++) acc[j] += av * (int32_t)bk[j];                                      \
        }                                                                                                     \
        if (bz)                                                                                               \
            for (mt_i j = 0; j < nt; j++) acc[j] -= asum * (int32_t)bz[j * bzs];                              \
    }

/* MatMulInteger of one [M, K] by [K, N] pair: Y = (A - azp) (B - bzp) as int32. A zero point
 * (0: none) is read at azp[m * azs] (per row when azs is 1) and bzp[n * bzs] (per column). */
#define MT_Q_MATMUL_INTEGER(TA, SA, TB, SB)                                                                  \
    MT_Q_ROW(TA, SA, TB, SB)                                                                                  \
    static inline void mt_matmul_integer_##SA##_##SB(const TA *restrict A, const TB *restrict B,              \
                                                     const TA *restrict azp, mt_i azs, const TB *restrict bzp, \
                                                     mt_i bzs, int32_t *restrict Y, mt_i M, mt_i N, mt_i K) { \
        const mt_i tiles = (N + MT_Q_TILE - 1) / MT_Q_TILE;                                                   \
        _Pragma("omp parallel for collapse(2) if(M * N * K > MT_PAR_MIN)")                                    \
        for (mt_i m = 0; m < M; m++)                                                                          \
            for (mt_i t = 0; t < tiles; t++) {                                                                \
                const mt_i n0 = t * MT_Q_TILE, nt = N - n0 < MT_Q_TILE ? N - n0 : MT_Q_TILE;                  \
                mt_q_row_##SA##_##SB(A + m * K, B + n0, azp ? (int32_t)azp[m * azs] : 0,                      \
                                     bzp ? bzp + n0 * bzs : 0, bzs, Y + m * N + n0, nt, N, K);                \
            }                                                                                                 \
    }

/* QLinearMatMul of one pair: y = saturate(rint(acc * (as * bs / ys)) + yzp), each scale and zero
 * point read at its pointer plus a stride times the row (a's) or the column (b's and y's). */
#define MT_Q_QLINEAR_MATMUL(TY, SY, LO, HI, TA, SA, TB, SB)                                                  \
    static inline MT_Q_NO_TRAPS void mt_qlinear_matmul_##SA##_##SB##_##SY(                                    \
        const TA *restrict A, const float *restrict as, mt_i ass, const TA *restrict azp, mt_i azs,           \
        const TB *restrict B, const float *restrict bs, mt_i bss, const TB *restrict bzp, mt_i bzs,           \
        const float *restrict ys, mt_i yss, const TY *restrict yzp, mt_i yzs, TY *restrict Y, mt_i M,         \
        mt_i N, mt_i K) {                                                                                     \
        const mt_i tiles = (N + MT_Q_TILE - 1) / MT_Q_TILE;                                                   \
        _Pragma("omp parallel for collapse(2) if(M * N * K > MT_PAR_MIN)")                                    \
        for (mt_i m = 0; m < M; m++)                                                                          \
            for (mt_i t = 0; t < tiles; t++) {                                                                \
                const mt_i n0 = t * MT_Q_TILE, nt = N - n0 < MT_Q_TILE ? N - n0 : MT_Q_TILE;                  \
                int32_t acc[MT_Q_TILE];                                                                       \
                mt_q_row_##SA##_##SB(A + m * K, B + n0, (int32_t)azp[m * azs], bzp + n0 * bzs, bzs, acc, nt,  \
                                     N, K);                                                                   \
                const float sa = as[m * ass];                                                                 \
                for (mt_i j = 0; j < nt; j++) {                                                               \
                    const mt_i n = n0 + j;                                                                    \
                    const float v = rint((float)acc[j] * (sa * bs[n * bss] / ys[n * yss])) + (float)yzp[n * yzs]; \
                    Y[m * N + n] = MT_Q_SAT(float, TY, LO, HI, v);                                            \
                }                                                                                             \
            }                                                                                                 \
    }

/* ConvInteger (1-D to 3-D windows, geometry g as in mt_nn.h): Y = conv(X - xzp, W - wzp) as int32,
 * padding reading the zero point. Per image and group, im2col copies the group's input into col
 * ([Cg * K, P], K taps, P output positions; padding holds xzp, so it is 0 once shifted) and the
 * group's weights [Mg, Cg * K] multiply it as MatMulInteger does, with wzp per row (wzp[m * wzs]).
 * A 1x1 window with unit strides and no padding reads its input in place (col is not touched). */
#define MT_Q_IM2COL(TX, SX)                                                                                  \
    static inline void mt_q_im2col_##SX(const TX *restrict x, TX pad, TX *restrict col, mt_i Cg,              \
                                        const mt_i *g) {                                                      \
        const mt_i ID = g[0], IH = g[1], IW = g[2], OD = g[3], OH = g[4], OW = g[5];                          \
        const mt_i KD = g[6], KH = g[7], KW = g[8], sd = g[9], sh = g[10], sw = g[11];                        \
        const mt_i pd = g[12], ph = g[13], pw = g[14], dd = g[15], dh = g[16], dw = g[17];                    \
        const mt_i K = KD * KH * KW, P = OD * OH * OW;                                                        \
        _Pragma("omp parallel for if(Cg * K * P > MT_PAR_MIN)")                                               \
        for (mt_i row = 0; row < Cg * K; row++) {                                                             \
            const mt_i c = row / K, kd = row % K / (KH * KW), kh = row % (KH * KW) / KW, kw = row % KW;       \
            const mt_i offw = kw * dw - pw;                                                                   \
            mt_i w0, w1;                                                                                      \
            mt_window_range(OW, IW, sw, offw, &w0, &w1);                                                      \
            for (mt_i od = 0; od < OD; od++)                                                                  \
                for (mt_i oh = 0; oh < OH; oh++) {                                                            \
                    const mt_i id = od * sd + kd * dd - pd, ih = oh * sh + kh * dh - ph;                      \
                    TX *restrict dst = col + row * P + (od * OH + oh) * OW;                                   \
                    if (id < 0 || id >= ID || ih < 0 || ih >= IH) {                                           \
                        for (mt_i ow = 0; ow < OW; ow++) dst[ow] = pad;                                       \
                        continue;                                                                             \
                    }                                                                                         \
                    const TX *src = x + ((c * ID + id) * IH + ih) * IW;                                       \
                    for (mt_i ow = 0; ow < w0; ow++) dst[ow] = pad;                                           \
                    for (mt_i ow = w0; ow < w1; ow++) dst[ow] = src[ow * sw + offw];                          \
                    for (mt_i ow = w1; ow < OW; ow++) dst[ow] = pad;                                          \
                }                                                                                             \
        }                                                                                                     \
    }
MT_Q_IM2COL(int8_t, i8)
MT_Q_IM2COL(uint8_t, u8)
#undef MT_Q_IM2COL

/* The scratch col holds Cg * K * P elements of TX (none for a 1x1 window read in place). */
#define MT_Q_CONV_INTEGER(TX, SX, TW, SW)                                                                    \
    static inline void mt_conv_integer_##SX##_##SW(const TX *X, const TW *W, const TX *xzp, const TW *wzp,   \
                                                   mt_i wzs, int32_t *Y, TX *col, mt_i N, mt_i C, mt_i M,     \
                                                   mt_i group, const mt_i *g) {                               \
        const mt_i Cg = C / group, Mg = M / group, S = g[0] * g[1] * g[2], P = g[3] * g[4] * g[5];            \
        const mt_i K = g[6] * g[7] * g[8];                                                                    \
        const int in_place = K == 1 && P == S && g[9] == 1 && g[10] == 1 && g[11] == 1 && !g[12] && !g[13] && \
                             !g[14];                                                                          \
        for (mt_i n = 0; n < N; n++)                                                                          \
            for (mt_i q = 0; q < group; q++) {                                                                \
                const TX *x = X + (n * C + q * Cg) * S;                                                       \
                if (!in_place) mt_q_im2col_##SX(x, xzp ? xzp[0] : 0, col, Cg, g);                            \
                mt_matmul_integer_##SW##_##SX(W + q * Mg * Cg * K, in_place ? x : col, wzp ? wzp + q * Mg * wzs : 0, \
                                              wzs, xzp, 0, Y + (n * M + q * Mg) * P, Mg, P, Cg * K);          \
            }                                                                                                 \
    }

/* The 8-bit operand pairs: X(TA, SA, TB, SB). */
#define MT_Q_PAIRS(X) \
    X(int8_t, i8, int8_t, i8) X(int8_t, i8, uint8_t, u8) X(uint8_t, u8, int8_t, i8) X(uint8_t, u8, uint8_t, u8)
MT_Q_PAIRS(MT_Q_MATMUL_INTEGER)
MT_Q_PAIRS(MT_Q_CONV_INTEGER)
#define MT_Q_QLINEAR_MATMUL_Y(TA, SA, TB, SB)                                                                \
    MT_Q_QLINEAR_MATMUL(int8_t, i8, INT8_MIN, INT8_MAX, TA, SA, TB, SB)                                       \
    MT_Q_QLINEAR_MATMUL(uint8_t, u8, 0, UINT8_MAX, TA, SA, TB, SB)
MT_Q_PAIRS(MT_Q_QLINEAR_MATMUL_Y)
#undef MT_Q_QLINEAR_MATMUL_Y
#undef MT_Q_PAIRS

/* QLinearConv after ConvInteger into acc: y = saturate(rint((acc + bias[m]) * (xs * ws / ys)) + yzp)
 * per output channel m (ws[m * wss]); bias may be 0. */
#define MT_Q_REQUANTIZE(TY, SY, LO, HI)                                                                      \
    static inline MT_Q_NO_TRAPS void mt_qlinear_conv_requantize_##SY(                                         \
        const int32_t *restrict acc, const int32_t *restrict bias, const float *restrict xs,                  \
        const float *restrict ws, mt_i wss, const float *restrict ys, const TY *restrict yzp, TY *restrict Y, \
        mt_i N, mt_i M, mt_i P) {                                                                             \
        _Pragma("omp parallel for if(N * M * P > MT_PAR_MIN)")                                                \
        for (mt_i nm = 0; nm < N * M; nm++) {                                                                 \
            const mt_i m = nm % M;                                                                            \
            const int32_t b = bias ? bias[m] : 0;                                                             \
            const float mult = xs[0] * ws[m * wss] / ys[0], z = (float)yzp[0];                                \
            _Pragma("omp simd")                                                                               \
            for (mt_i p = 0; p < P; p++) {                                                                    \
                const float v = rint((float)(int32_t)((uint32_t)acc[nm * P + p] + (uint32_t)b) * mult) + z;   \
                Y[nm * P + p] = MT_Q_SAT(float, TY, LO, HI, v);                                               \
            }                                                                                                 \
        }                                                                                                     \
    }
MT_Q_REQUANTIZE(int8_t, i8, INT8_MIN, INT8_MAX)
MT_Q_REQUANTIZE(uint8_t, u8, 0, UINT8_MAX)
#undef MT_Q_REQUANTIZE

#endif /* MT_QUANTIZE_H */
