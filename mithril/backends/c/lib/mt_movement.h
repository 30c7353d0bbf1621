/* Data movement kernels, per element type. */
#ifndef MT_MOVEMENT_H
#define MT_MOVEMENT_H

#include "mt_base.h"

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

#endif /* MT_MOVEMENT_H */
