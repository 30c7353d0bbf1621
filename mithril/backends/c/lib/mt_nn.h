/* Neural-network kernels, per float type (mt_nn_t.h; 3x3 convolutions by Winograd in
 * mt_nn_winograd_t.h), and MaxPool per element type (mt_nn_pool_t.h).
 *
 * Window ops (Conv, ConvTranspose, the pools) take up to three spatial axes: 1-D and 2-D inputs
 * are rendered as 3-D with unit leading axes, so one kernel serves every rank. Their geometry is
 * one `const mt_i *g` of 21 numbers, computed at render time from the static shapes:
 *
 *     g[0..2] input size   g[3..5] output size   g[6..8] kernel     g[9..11] strides
 *     g[12..14] padding before (the output's first window starts there)
 *     g[15..17] dilations  g[18..20] padding after (as declared; AveragePool's count_include_pad)
 */
#ifndef MT_NN_H
#define MT_NN_H

#include "mt_base.h"
#include "mt_gemm.h" /* convolution is im2col + GEMM */

/* [*lo, *hi): the positions o in [0, count) for which o * s + off lies in [0, limit), s >= 1. */
MT_INNER void mt_window_range(mt_i count, mt_i limit, mt_i s, mt_i off, mt_i *lo, mt_i *hi) {
    mt_i a = off >= 0 ? 0 : (-off + s - 1) / s;
    mt_i t = limit - off, b = t <= 0 ? 0 : (t + s - 1) / s;
    if (b > count) b = count;
    if (a > b) a = b;
    *lo = a;
    *hi = b;
}

/* 16 rows of 16 floats (row i at src + i*ss) stored transposed (row j at dst + j*ds) in 64
 * shuffles: the depthwise kernel's channel blocks (mt_dw3_block) go in and out of this layout
 * at a fraction of the cost of gathers. AVX-512 only; elsewhere the kernel gathers. */
#if defined(__AVX512F__)
#include <immintrin.h>
#define MT_TR16 1
MT_INNER void mt_tr16_f32(const float *src, mt_i ss, float *dst, mt_i ds) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src + i * ss);
    for (int i = 0; i < 8; i++) { /* pairs of rows: 2x2 blocks of elements */
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) { /* 4x4 blocks */
        __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 2]);
        __m512d c = _mm512_castps_pd(t[4 * i + 1]), d = _mm512_castps_pd(t[4 * i + 3]);
        r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
    }
    for (int i = 0; i < 2; i++) /* 128-bit lanes, then 256-bit halves */
        for (int j = 0; j < 4; j++) {
            t[8 * i + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + 4 + j], 0x88);
            t[8 * i + 4 + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + 4 + j], 0xdd);
        }
    for (int j = 0; j < 8; j++) {
        r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
        r[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xdd);
    }
    for (int i = 0; i < 16; i++) _mm512_storeu_ps(dst + i * ds, r[i]);
}
#else
#define MT_TR16 0
MT_INNER void mt_tr16_f32(const float *src, mt_i ss, float *dst, mt_i ds) {
    for (mt_i i = 0; i < 16; i++)
        for (mt_i j = 0; j < 16; j++) dst[j * ds + i] = src[i * ss + j];
}
#endif

/* Groups of a reduction over arbitrary axes (MeanVarianceNormalization): element i of a
 * C-contiguous array of `shape` belongs to group sum(index[d] * gstr[d]). */
MT_INNER mt_i mt_group_of(mt_i i, int rank, const mt_i *shape, const mt_i *gstr) {
    mt_i o = 0;
    for (int d = rank - 1; d >= 0; d--) {
        o += (i % shape[d]) * gstr[d];
        i /= shape[d];
    }
    return o;
}

/* MT_EXP_LOW: the argument below which exp(x) is under T's smallest normal (Softmax takes it as 0). */
#define T float
#define MT_SFX f32
#define MT_EXP_LOW (-87.0f)
#include "mt_nn_t.h"
#include "mt_nn_winograd_t.h"
#undef T
#undef MT_SFX
#undef MT_EXP_LOW

#define T double
#define MT_SFX f64
#define MT_EXP_LOW (-708.0)
#include "mt_nn_t.h"
#include "mt_nn_winograd_t.h"
#undef T
#undef MT_SFX
#undef MT_EXP_LOW

/* MaxPool also takes 8-bit integers (ONNX MaxPool-12). */
#define T float
#define MT_SFX f32
#define MT_LOWEST (-INFINITY)
#define MT_ISNAN(v) ((v) != (v))
#include "mt_nn_pool_t.h"
#undef T
#undef MT_SFX
#undef MT_LOWEST
#undef MT_ISNAN

#define T double
#define MT_SFX f64
#define MT_LOWEST (-INFINITY)
#define MT_ISNAN(v) ((v) != (v))
#include "mt_nn_pool_t.h"
#undef T
#undef MT_SFX
#undef MT_LOWEST
#undef MT_ISNAN

#define T int8_t
#define MT_SFX i8
#define MT_LOWEST INT8_MIN
#define MT_ISNAN(v) 0
#include "mt_nn_pool_t.h"
#undef T
#undef MT_SFX
#undef MT_LOWEST
#undef MT_ISNAN

#define T uint8_t
#define MT_SFX u8
#define MT_LOWEST 0
#define MT_ISNAN(v) 0
#include "mt_nn_pool_t.h"
#undef T
#undef MT_SFX
#undef MT_LOWEST
#undef MT_ISNAN

#endif /* MT_NN_H */
