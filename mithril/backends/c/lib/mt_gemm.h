/* GEMM, per float type: Y = alpha * op(A) @ op(B) + beta * C (see mt_gemm_t.h). */
#ifndef MT_GEMM_H
#define MT_GEMM_H

#include "mt_base.h"

#define T float
#define MT_SFX f32
#include "mt_gemm_t.h"
#undef T
#undef MT_SFX

#define T double
#define MT_SFX f64
#include "mt_gemm_t.h"
#undef T
#undef MT_SFX

#endif /* MT_GEMM_H */
