/* Mithril's C kernel library: what every family header shares.
 *
 * Kernels are `static inline` functions named mt_<op>_<sfx>, one per element type: sfx is f32,
 * f64, i8, i16, i32, i64, u8, u16, u32, u64 or b8 (bool, one byte). A family writes its kernels
 * once over a type `T` in a template file (mt_<family>_t.h, no include guard, function names
 * through MT_FN(name)) and its header includes that file once per type, as mt_nn.h does:
 *
 *     #define T float
 *     #define MT_SFX f32
 *     #include "mt_nn_t.h"
 *     #undef T
 *     #undef MT_SFX
 *
 * Shapes are passed as arguments (the generated file holds them as constants); every pointer is
 * C-contiguous. Kernels never allocate: scratch space (im2col) is a slice of the model's arena.
 * OpenMP threads the outer loops when the work is large enough (MT_PAR_MIN elements).
 */
#ifndef MT_BASE_H
#define MT_BASE_H

#include <tgmath.h> /* exp, sqrt, ... pick the float or double function by argument type */
#include <stdint.h>
#include <string.h>

typedef long mt_i;       /* sizes, indices, strides */
typedef uint8_t mt_bool; /* NumPy's bool: one byte, 0 or 1 */

#define MT_PAR_MIN 32768 /* elements below which threading costs more than it saves */

#define MT_CAT_(a, b) a##_##b
#define MT_CAT(a, b) MT_CAT_(a, b)
#define MT_FN(name) MT_CAT(name, MT_SFX) /* mt_relu -> mt_relu_f32 inside a template */

/* Any element type: n bytes from x to y (views that cannot share their input's buffer). */
static inline void mt_copy_bytes(const void *x, void *y, size_t n) {
    if (x != y) memcpy(y, x, n);
}

#endif /* MT_BASE_H */
