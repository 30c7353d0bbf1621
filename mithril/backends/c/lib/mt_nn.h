/* Neural-network kernels, per float type. */
#ifndef MT_NN_H
#define MT_NN_H

#include "mt_base.h"
#include "mt_gemm.h" /* convolution is im2col + GEMM */

#define T float
#define MT_SFX f32
#include "mt_nn_t.h"
#undef T
#undef MT_SFX

#define T double
#define MT_SFX f64
#include "mt_nn_t.h"
#undef T
#undef MT_SFX

#endif /* MT_NN_H */
