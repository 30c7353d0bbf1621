/* Backward kernels (the gradient program of a training step), per float type (mt_grad_t.h).
 *
 * Each kernel writes the gradient of one input of one forward node from the cotangent of its
 * output (and the forward values it needs), into a buffer of its own: the renderer
 * (mithril/backends/c/grad.py) sums gradients that reach a value from several consumers with
 * mt_grad_add. Convolution and pool kernels take the forward's window geometry `g` (mt_nn.h);
 * the weight gradient of a convolution is im2col + GEMM, its input gradient GEMM + col2im.
 */
#ifndef MT_GRAD_H
#define MT_GRAD_H

#include "mt_base.h"
#include "mt_gemm.h"
#include "mt_nn.h" /* mt_im2col, mt_window_range */

/* Offset of element i of a C-contiguous array of `shape` in an array walked with strides `st`. */
static inline mt_i mt_grad_offset(mt_i i, int rank, const mt_i *shape, const mt_i *st) {
    mt_i o = 0;
    for (int d = rank - 1; d >= 0; d--) {
        o += (i % shape[d]) * st[d];
        i /= shape[d];
    }
    return o;
}

#define T float
#define MT_SFX f32
#include "mt_grad_t.h"
#undef T
#undef MT_SFX

#define T double
#define MT_SFX f64
#include "mt_grad_t.h"
#undef T
#undef MT_SFX

#endif /* MT_GRAD_H */
