/* Storage-only element types: ONNX's 16-, 8-, 4- and 2-bit types, held as their bits (one element a
 * uint16_t or uint8_t; the sub-byte integers one per byte in the low bits, as ml_dtypes holds them).
 * Kernels do not compute in them: Cast converts to and from every C type, through double for
 * floats and int64 for integers, rounding to nearest even once, as NumPy and ml_dtypes do.
 *
 * A narrow float format is (exponent bits, mantissa bits, bias, kind); the kind says what its
 * top codes mean: IEEE (all-ones exponent: inf / NaN; float16, bfloat16, float8e5m2), FN (no inf;
 * all-ones exponent and mantissa: NaN; float8e4m3fn), FNUZ (no inf, no -0; 0x80: NaN), FINITE (no
 * inf, no NaN; float4e2m1: out of range saturates) and E8M0 (a bare power of two). */
#ifndef MT_CONVERT_H
#define MT_CONVERT_H

#include <math.h>
#include <stdint.h>

enum { MT_NF_IEEE, MT_NF_FN, MT_NF_FNUZ, MT_NF_FINITE, MT_NF_E8M0 };

/* Type codes for mt_cast_any: the numeric C types, then the storage-only ones. */
enum {
    MT_T_F32, MT_T_F64, MT_T_I8, MT_T_I16, MT_T_I32, MT_T_I64, MT_T_U8, MT_T_U16, MT_T_U32, MT_T_U64, MT_T_B8,
    MT_T_F16, MT_T_BF16, MT_T_F8E4M3FN, MT_T_F8E4M3FNUZ, MT_T_F8E5M2, MT_T_F8E5M2FNUZ, MT_T_F8E8M0, MT_T_F4E2M1,
    MT_T_I4, MT_T_U4, MT_T_I2, MT_T_U2
};

typedef struct {
    int ebits, mbits, bias, kind;
} mt_nf;

static const mt_nf MT_NF_FORMATS[] = {
    [MT_T_F16] = {5, 10, 15, MT_NF_IEEE},       [MT_T_BF16] = {8, 7, 127, MT_NF_IEEE},
    [MT_T_F8E4M3FN] = {4, 3, 7, MT_NF_FN},      [MT_T_F8E4M3FNUZ] = {4, 3, 8, MT_NF_FNUZ},
    [MT_T_F8E5M2] = {5, 2, 15, MT_NF_IEEE},     [MT_T_F8E5M2FNUZ] = {5, 2, 16, MT_NF_FNUZ},
    [MT_T_F8E8M0] = {8, 0, 127, MT_NF_E8M0},    [MT_T_F4E2M1] = {2, 1, 1, MT_NF_FINITE},
};

static inline int mt_nf_is_float(int code) { return code >= MT_T_F16 && code <= MT_T_F4E2M1; }

/* The largest finite code of a format, without the sign. */
static inline uint32_t mt_nf_max_code(mt_nf f) {
    uint32_t top = (1u << (f.ebits + f.mbits)) - 1;
    if (f.kind == MT_NF_IEEE) return top - (1u << f.mbits); /* all-ones exponent is special */
    if (f.kind == MT_NF_FN) return top - 1;                    /* all-ones code is NaN */
    if (f.kind == MT_NF_E8M0) return top - 1;
    return top;                                                /* FNUZ, FINITE: every code finite */
}

static inline uint32_t mt_nf_nan(mt_nf f, int sign) {
    uint32_t sbit = 1u << (f.ebits + f.mbits);
    switch (f.kind) {
    case MT_NF_IEEE: /* quiet NaN, sign kept */
        return (sign ? sbit : 0) | (((1u << f.ebits) - 1) << f.mbits) | (1u << (f.mbits - 1));
    case MT_NF_FN: return (sign ? sbit : 0) | (sbit - 1);
    case MT_NF_FNUZ: return sbit;
    case MT_NF_E8M0: return 0xFF;
    default: return sign ? 0 : sbit; /* FINITE has no NaN: ml_dtypes gives -0 for NaN, 0 for -NaN */
    }
}

static inline double mt_nf_decode(uint32_t bits, mt_nf f) {
    if (f.kind == MT_NF_E8M0) return bits == 0xFF ? (double)NAN : ldexp(1.0, (int)bits - 127);
    uint32_t sbit = 1u << (f.ebits + f.mbits);
    uint32_t mag = bits & (sbit - 1);
    int sign = (bits & sbit) != 0;
    uint32_t e = mag >> f.mbits, m = mag & ((1u << f.mbits) - 1);
    if (f.kind == MT_NF_FNUZ && bits == sbit) return (double)NAN;
    if (f.kind == MT_NF_FN && mag == sbit - 1) return (double)NAN;
    if (f.kind == MT_NF_IEEE && e == (1u << f.ebits) - 1) return m ? (double)NAN : (sign ? -(double)INFINITY : (double)INFINITY);
    double v = e ? ldexp((double)(m | (1u << f.mbits)), (int)e - f.bias - f.mbits) : ldexp((double)m, 1 - f.bias - f.mbits);
    return sign ? -v : v;
}

/* ONNX Cast to float8e8m0: round_mode 0 up, 1 down, 2 nearest; of the magnitude. */
static inline uint32_t mt_e8m0_encode(double v, int saturate, int round_mode) {
    double a = fabs(v);
    if (a != a) return 0xFF;
    if (isinf(a)) return saturate ? 254 : 0xFF;
    if (a == 0) return saturate ? 0 : 0xFF;
    int ex;
    double mant = frexp(a, &ex); /* a = mant * 2**ex, mant in [0.5, 1) */
    int e = round_mode == 0 ? (mant > 0.5 ? ex : ex - 1) : round_mode == 1 ? ex - 1 : (mant >= 0.75 ? ex : ex - 1);
    if (e < -127 || e > 127) {
        if (!saturate) return 0xFF;
        e = e < -127 ? -127 : 127;
    }
    return (uint32_t)(e + 127);
}

/* v rounded to nearest even in format f. saturate (ONNX's float8 casts): out of range and
 * infinities become the largest finite value of their sign instead of inf or NaN. */
static inline uint32_t mt_nf_encode(double v, mt_nf f, int saturate, int round_mode) {
    if (f.kind == MT_NF_E8M0) return mt_e8m0_encode(v, saturate, round_mode);
    int sign = signbit(v) != 0;
    uint32_t sbit = 1u << (f.ebits + f.mbits);
    uint32_t s = sign ? sbit : 0;
    if (v != v) return mt_nf_nan(f, sign);
    uint32_t maxc = mt_nf_max_code(f);
    double a = fabs(v);
    uint32_t mag;
    if (isinf(a)) {
        mag = maxc + 1; /* past the largest finite: overflow below */
    } else {
        int ex;
        (void)frexp(a, &ex); /* a in [2**(ex-1), 2**ex) */
        int e = ex - 1;
        int emin = 1 - f.bias;
        if (a == 0 || e < emin) { /* subnormal: multiples of 2**(emin - mbits) */
            mag = (uint32_t)nearbyint(ldexp(a, f.mbits - emin));
        } else {
            uint32_t q = (uint32_t)nearbyint(ldexp(a, f.mbits - e)); /* in [2**m, 2**(m+1)] */
            if (q == 1u << (f.mbits + 1)) q >>= 1, e++;
            int field = e - emin + 1;
            mag = field >= (1 << f.ebits) ? maxc + 1 : ((uint32_t)field << f.mbits) | (q - (1u << f.mbits));
        }
    }
    if (mag > maxc) {
        if (saturate || f.kind == MT_NF_FINITE) return s | maxc;
        if (f.kind == MT_NF_IEEE) return s | (((1u << f.ebits) - 1) << f.mbits);
        return mt_nf_nan(f, sign);
    }
    if (f.kind == MT_NF_FNUZ && mag == 0) return 0; /* no negative zero */
    return s | mag;
}

/* Element i of x (type code c) as a double, or as an int64 when the type is an integer. */
static inline int mt_t_is_int(int c) {
    return (c >= MT_T_I8 && c <= MT_T_B8) || (c >= MT_T_I4 && c <= MT_T_U2);
}

static inline double mt_load_f(const void *x, int c, mt_i i) {
    switch (c) {
    case MT_T_F32: return ((const float *)x)[i];
    case MT_T_F64: return ((const double *)x)[i];
    case MT_T_F16: case MT_T_BF16: return mt_nf_decode(((const uint16_t *)x)[i], MT_NF_FORMATS[c]);
    default: return mt_nf_decode(((const uint8_t *)x)[i], MT_NF_FORMATS[c]);
    }
}

static inline int64_t mt_load_i(const void *x, int c, mt_i i) {
    switch (c) {
    case MT_T_I8: return ((const int8_t *)x)[i];
    case MT_T_I16: return ((const int16_t *)x)[i];
    case MT_T_I32: return ((const int32_t *)x)[i];
    case MT_T_I64: return ((const int64_t *)x)[i];
    case MT_T_U8: return ((const uint8_t *)x)[i];
    case MT_T_U16: return ((const uint16_t *)x)[i];
    case MT_T_U32: return ((const uint32_t *)x)[i];
    case MT_T_U64: return (int64_t)((const uint64_t *)x)[i];
    case MT_T_B8: return ((const uint8_t *)x)[i] != 0;
    case MT_T_I4: return (int64_t)(((((const uint8_t *)x)[i] & 0xF) ^ 0x8)) - 0x8;
    case MT_T_U4: return ((const uint8_t *)x)[i] & 0xF;
    case MT_T_I2: return (int64_t)(((((const uint8_t *)x)[i] & 0x3) ^ 0x2)) - 0x2;
    default: return ((const uint8_t *)x)[i] & 0x3;
    }
}

/* A float to an integer: saturating, NaN -> 0 (as the C backend's Cast of the numeric types). */
static inline int64_t mt_f_to_i64(double v) {
    if (v != v) return 0;
    if (v <= -9223372036854775808.0) return INT64_MIN;
    if (v >= 9223372036854775808.0) return INT64_MAX;
    return (int64_t)v;
}

static inline uint64_t mt_f_to_u64(double v) {
    if (v != v || v <= 0) return 0;
    if (v >= 18446744073709551616.0) return UINT64_MAX;
    return (uint64_t)v;
}

static inline void mt_store_i(void *y, int c, mt_i i, int64_t v) {
    switch (c) {
    case MT_T_F32: ((float *)y)[i] = (float)v; break;
    case MT_T_F64: ((double *)y)[i] = (double)v; break;
    case MT_T_I8: ((int8_t *)y)[i] = (int8_t)v; break;
    case MT_T_I16: ((int16_t *)y)[i] = (int16_t)v; break;
    case MT_T_I32: ((int32_t *)y)[i] = (int32_t)v; break;
    case MT_T_I64: ((int64_t *)y)[i] = v; break;
    case MT_T_U8: ((uint8_t *)y)[i] = (uint8_t)v; break;
    case MT_T_U16: ((uint16_t *)y)[i] = (uint16_t)v; break;
    case MT_T_U32: ((uint32_t *)y)[i] = (uint32_t)v; break;
    case MT_T_U64: ((uint64_t *)y)[i] = (uint64_t)v; break;
    case MT_T_B8: ((uint8_t *)y)[i] = v != 0; break;
    case MT_T_I4: case MT_T_U4: ((uint8_t *)y)[i] = (uint8_t)(v & 0xF); break;
    default: ((uint8_t *)y)[i] = (uint8_t)(v & 0x3); break;
    }
}

/* ONNX Cast where one side is a storage-only type (codes above): integers to integers wrap,
 * floats to integers truncate (saturating, NaN -> 0) then wrap to sub-byte widths, integers to
 * floats go through double, floats to narrow floats round once to nearest even. */
static inline void mt_cast_any(const void *restrict x, int xc, void *restrict y, int yc, mt_i n, int saturate,
                               int round_mode) {
    int xi = mt_t_is_int(xc), yi = mt_t_is_int(yc);
    for (mt_i i = 0; i < n; i++) {
        if (yc == MT_T_B8) {
            ((uint8_t *)y)[i] = xi ? mt_load_i(x, xc, i) != 0 : mt_load_f(x, xc, i) != 0;
            continue;
        }
        if (yi) {
            if (xi) mt_store_i(y, yc, i, mt_load_i(x, xc, i));
            else if (yc == MT_T_U64) ((uint64_t *)y)[i] = mt_f_to_u64(mt_load_f(x, xc, i));
            else mt_store_i(y, yc, i, mt_f_to_i64(mt_load_f(x, xc, i)));
            continue;
        }
        double v = xc == MT_T_U64 ? (double)((const uint64_t *)x)[i] : xi ? (double)mt_load_i(x, xc, i) : mt_load_f(x, xc, i);
        /* ml_dtypes rounds a double to float32 first (NumPy's float16 and Mithril's e8m0 do not) */
        if ((xc == MT_T_F64 || xi) && yc != MT_T_F16 && yc != MT_T_F8E8M0 && yc > MT_T_B8) v = (double)(float)v;
        switch (yc) {
        case MT_T_F32: ((float *)y)[i] = (float)v; break;
        case MT_T_F64: ((double *)y)[i] = v; break;
        case MT_T_F16: case MT_T_BF16:
            ((uint16_t *)y)[i] = (uint16_t)mt_nf_encode(v, MT_NF_FORMATS[yc], 0, round_mode);
            break;
        default: ((uint8_t *)y)[i] = (uint8_t)mt_nf_encode(v, MT_NF_FORMATS[yc], saturate, round_mode); break;
        }
    }
}

#endif
