/* Convolutions in a channel-blocked layout (NCHWc), per float type (mt_nchwc_t.h).
 *
 * A blocked tensor of logical shape [N, C, H, W] is stored as [N][ceil(C / B)][H][W][B], B =
 * MT_NCB(T) channels of one position side by side (one cache line, one AVX-512 vector), the last
 * block padded. In that layout a 1x1 convolution is a product whose vectors run over output
 * channels (one input value broadcast to B of them) and a depthwise convolution a sum of whole
 * vectors, with no ragged vectors at planes such as 14x14 or 7x7 and no transposes; onnxruntime
 * runs MobileNet-like models in this layout (its NchwcTransformer). The renderer (nchwc.py) moves
 * chains of such convolutions into it, with mt_nchwc_to / mt_nchwc_from at the chain's edges, and
 * hands these kernels weights packed once, at compile time:
 *
 *     1x1:        Wp[C_out / B (rounded up)][C_in][B]   rows past C_out zero
 *     depthwise:  Wp[C / B][KH * KW][B]
 */
#ifndef MT_NCHWC_H
#define MT_NCHWC_H

#include "mt_base.h"
#include "mt_gemm.h" /* mt_threads */
#include "mt_nn.h"   /* mt_window_range, mt_tr16_f32 */

#define MT_NCB(T) ((mt_i)(64 / sizeof(T))) /* channels per block: 16 floats, 8 doubles */

#define T float
#define MT_SFX f32
#include "mt_nchwc_t.h"
#undef T
#undef MT_SFX

#define T double
#define MT_SFX f64
#include "mt_nchwc_t.h"
#undef T
#undef MT_SFX

#endif /* MT_NCHWC_H */
