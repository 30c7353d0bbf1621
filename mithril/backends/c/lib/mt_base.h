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

#include <math.h>
#include <stdint.h>
#include <string.h>

/* glibc 2.35+ ships libmvec: vector versions of these libm functions (within 4 ulp; 8 floats per
 * call on AVX2). Declaring them `simd`, as glibc's own <math.h> does under -ffast-math, lets the
 * compiler vectorize the loops that call them (Tanh 27x, Exp 10x faster on one core). Elsewhere
 * (another C library, clang, MT_NO_MVEC) the loops call the scalar functions. */
#if defined(__GLIBC__) && defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(MT_NO_MVEC) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))
#define MT_SIMD_1(fn) __attribute__((__simd__("notinbranch"))) float fn##f(float); \
    __attribute__((__simd__("notinbranch"))) double fn(double);
#define MT_SIMD_2(fn) __attribute__((__simd__("notinbranch"))) float fn##f(float, float); \
    __attribute__((__simd__("notinbranch"))) double fn(double, double);
MT_SIMD_1(exp) MT_SIMD_1(exp2) MT_SIMD_1(expm1) MT_SIMD_1(log) MT_SIMD_1(log2) MT_SIMD_1(log10) MT_SIMD_1(log1p)
MT_SIMD_1(sin) MT_SIMD_1(cos) MT_SIMD_1(tan) MT_SIMD_1(asin) MT_SIMD_1(acos) MT_SIMD_1(atan)
MT_SIMD_1(sinh) MT_SIMD_1(cosh) MT_SIMD_1(tanh) MT_SIMD_1(asinh) MT_SIMD_1(acosh) MT_SIMD_1(atanh)
MT_SIMD_1(erf) MT_SIMD_1(erfc) MT_SIMD_1(cbrt) MT_SIMD_2(pow) MT_SIMD_2(atan2)
#undef MT_SIMD_1
#undef MT_SIMD_2
#endif

#include <tgmath.h> /* exp, sqrt, ... pick the float or double function by argument type */

typedef long mt_i;       /* sizes, indices, strides */
typedef uint8_t mt_bool; /* NumPy's bool: one byte, 0 or 1 */

#define MT_PAR_MIN 32768 /* elements below which threading costs more than it saves */
#define MT_PIECE 16384   /* elements one thread takes at a time in MT_FOR_SIMD */

/* for (mt_i i = 0; i < n; i++) { body }: threads take pieces of MT_PIECE elements when n exceeds
 * MT_PAR_MIN, each piece one `omp simd` loop. (GCC 12 vectorizes `omp parallel for simd` badly:
 * Relu ran 4x and Tanh 25x slower than this on one core.) */
#define MT_FOR_SIMD(n, i, ...)                                                                         \
    _Pragma("omp parallel for if((n) > MT_PAR_MIN)")                                                  \
    for (mt_i mt_p_ = 0; mt_p_ < (n); mt_p_ += MT_PIECE) {                                            \
        const mt_i mt_e_ = mt_p_ + MT_PIECE < (n) ? mt_p_ + MT_PIECE : (n);                           \
        _Pragma("omp simd")                                                                           \
        for (mt_i i = mt_p_; i < mt_e_; i++) { __VA_ARGS__; }                                         \
    }

/* A helper called inside a kernel's loops (a GEMM tile's store, one border pixel, a row's
 * moments): inlined even though the library is built with -fno-inline (build.py). */
#define MT_INNER static inline __attribute__((always_inline))

#define MT_CAT_(a, b) a##_##b
#define MT_CAT(a, b) MT_CAT_(a, b)
#define MT_FN(name) MT_CAT(name, MT_SFX) /* mt_relu -> mt_relu_f32 inside a template */

/* Timing hooks the generated code puts around each node; built with MT_PROFILE (Mithril's
 * MITHRIL_C_PROFILE=1) the generated file defines them, else they vanish. */
#ifndef MT_PROFILE
#define MT_PROF_BEGIN(i) (void)0
#define MT_PROF_END(i, slot) (void)0
#endif

/* Any element type: n bytes from x to y (views that cannot share their input's buffer). */
static inline void mt_copy_bytes(const void *x, void *y, size_t n) {
    if (x != y) memcpy(y, x, n);
}

#endif /* MT_BASE_H */
