/* Elementwise kernels and reductions, per element type. */
#ifndef MT_ELEMENTWISE_H
#define MT_ELEMENTWISE_H

#include "mt_base.h"

#define T float
#define MT_SFX f32
#include "mt_elementwise_t.h"
#undef T
#undef MT_SFX

#define T double
#define MT_SFX f64
#include "mt_elementwise_t.h"
#undef T
#undef MT_SFX

#endif /* MT_ELEMENTWISE_H */
