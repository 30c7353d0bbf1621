"""NumPy's own 2-D convolutions: depthwise (``group`` == channels) and dense (``group`` == 1).

**Depthwise.** The shared kernel runs a depthwise convolution as im2col (nine copies of the input
for a 3x3 kernel) and a matmul batched over channels, i.e. one tiny gemv per channel. Here it is
nine multiply-adds of shifted views into a preallocated output, with no im2col and no per-channel
matmul:

- The input is copied once into a zero-padded buffer split into ``stride`` phases (phase (a, b)
  holds padded rows a, a+s, ... and columns b, b+s, ...), so that every tap of a strided or
  dilated kernel is a *contiguous* shifted slice of one phase, flattened: the output is computed
  on a grid as wide as the phase and the extra columns are dropped at the end.
- Large images keep channels first and go through cache-sized blocks of channels (each block's
  output and temporary stay in L2 across the nine taps); small images with many channels
  (MobileNetV2's 14x14 and 7x7 stages) go channels last, so that NumPy's inner loop runs along
  the channels instead of along a 7- or 14-pixel row.

Measured on MobileNetV2's depthwise layers (float32, one thread, best of 30 on a loaded 2-core VM)
against the shared kernel: 1.0x (192x28x28, stride 1) to 2x (576x14x14, stride 2), most near 1.7x;
the whole model went from 6.0x to 4.7x onnxruntime's time. The floor is NumPy's: seventeen passes
(nine multiplies, eight adds) over the output where onnxruntime keeps the nine taps in registers,
and stride 2's phase split (strided copies, half of the 96x112x112 layer's time).

**Dense, with a kernel larger than 1x1.** Still im2col and BLAS, but over blocks of output rows:
each block's columns (1-2 MiB) are copied into one reused buffer that stays in cache while the
matmul reads it, and the matmul writes its rows of the output in place, where the bias is added
while they are still in cache. The shared kernel builds every column at once (a 7 MiB array for
ResNet-18's 64x56x56 layers, written to and read back from memory). Measured on ResNet-18's conv
shapes, in one process alternating with the shared kernel on a noisy host: ~0.92x its time over
the network's layers at 1 and 2 threads (0.74-0.87x on the 64x56x56 ones); a layer's peak memory
drops by the columns' size.

tests/backends/numpy/test_conv_fast.py holds the cases both are checked on against the shared kernel.
"""

from __future__ import annotations

import math

import numpy as np

# Elements per channel block of the channels-first path: its output and temporary (2 x 256 KiB
# of float32) stay in a core's L2 across the taps. Chosen on MobileNetV2's 112x112 and 56x56 layers.
_BLOCK_ELEMENTS = 65536

# Bytes of im2col columns per block of output rows in the dense path (a block holds 1-2x this):
# 0.5 and 1 MiB measured alike on ResNet-18's layers on the 2-core VM, whose cores have 1 MiB of
# L2. Columns under twice this go in one block: narrower matmuls cost more than the cache saves.
_COLS_BYTES = 1 << 20


def is_depthwise_2d(x, w, b, group: int) -> bool:
    """Whether :func:`depthwise_2d` computes this Conv: 2-D, one filter per channel, float32 or
    float64 throughout (half types keep the shared kernel's float32 matmul)."""
    return (
        x.ndim == 4 and w.ndim == 4 and group > 1 and x.shape[1] == group and w.shape[0] == group
        and w.shape[1] == 1 and x.dtype in (np.float32, np.float64) and w.dtype == x.dtype
        and (b is None or (b.shape == (group,) and b.dtype == x.dtype))
    )


def _phases(x, win, channels_last: bool):
    """The zero-padded input split into stride phases, flattened: (n, phases, rows*wq, c) when
    ``channels_last``, else (n, c, phases, rows*wq); with the phase width wq and the taps as
    (phase, flat offset) pairs, row-major over the kernel."""
    n, c, h, wd = x.shape
    (kh, kw), (sh, sw), (dh, dw), (oh, _) = win.kernel, win.strides, win.dilations, win.out
    pt, pl = win.begin
    (_, _), (bl, br) = win.read_pads((h, wd))
    wq = -(-(wd + bl + br) // sw)
    rmax, cmax = (kh - 1) * dh // sh, (kw - 1) * dw // sw
    # The last tap reads up to (rmax + oh) * wq + cmax - 1 of its phase.
    rows = oh + rmax + (1 if cmax else 0)
    if channels_last:
        buf = np.zeros((n, sh, sw, rows, wq, c), x.dtype)
        src = x.transpose(0, 2, 3, 1)
    else:
        buf = np.zeros((n, c, sh, sw, rows, wq), x.dtype)
        src = x
    for a in range(sh):
        # Phase row r holds padded row a + sh*r, input row a + sh*r - pt.
        r0 = max(0, -(-(pt - a) // sh))
        xr0 = a + sh * r0 - pt
        if xr0 >= h or r0 >= rows:
            continue
        rc = min(rows - r0, -(-(h - xr0) // sh))
        for b_ in range(sw):
            q0 = max(0, -(-(pl - b_) // sw))
            xc0 = b_ + sw * q0 - pl
            if xc0 >= wd or q0 >= wq:
                continue
            qc = min(wq - q0, -(-(wd - xc0) // sw))
            rs, cs = slice(xr0, xr0 + (rc - 1) * sh + 1, sh), slice(xc0, xc0 + (qc - 1) * sw + 1, sw)
            if channels_last:
                buf[:, a, b_, r0:r0 + rc, q0:q0 + qc] = src[:, rs, cs]
            else:
                buf[:, :, a, b_, r0:r0 + rc, q0:q0 + qc] = src[:, :, rs, cs]
    taps = [((i * dh % sh) * sw + j * dw % sw, (i * dh // sh) * wq + j * dw // sw)
            for i in range(kh) for j in range(kw)]
    if channels_last:
        return buf.reshape(n, sh * sw, rows * wq * c), wq, taps
    return buf.reshape(n, c, sh * sw, rows * wq), wq, taps


def _accumulate(out, tmp, taps_views, weights):
    # out = sum_k taps_views[k] * weights[k], through one temporary: two passes a tap.
    for k, (tap, wk) in enumerate(zip(taps_views, weights)):
        if k == 0:
            np.multiply(tap, wk, out=out)
        else:
            np.multiply(tap, wk, out=tmp)
            np.add(out, tmp, out=out)


def depthwise_2d(x, w, b, win):
    """Conv of x (n, c, h, w) with w (c, 1, kh, kw) and bias b (c,) or None over ``win``
    (:class:`~mithril.backends.kernels.geometry.Window`); a fresh (n, c, oh, ow) array."""
    n, c = x.shape[:2]
    (oh, ow), k = win.out, math.prod(win.kernel)
    wt = w.reshape(c, k)
    channels_last = 4 * c >= oh * (x.shape[3] + 2)  # many channels, small image
    flat, wq, taps = _phases(x, win, channels_last)
    length = oh * wq
    if channels_last:
        wk = np.ascontiguousarray(wt.T)  # (taps, c): one channel row per tap
        out = np.empty((n, length, c), x.dtype)
        views = [flat[:, ph, off * c:(off + length) * c].reshape(n, length, c) for ph, off in taps]
        _accumulate(out, np.empty_like(out), views, wk)
        if b is not None:
            np.add(out, b, out=out)
        y = out.reshape(n, oh, wq, c)[:, :, :ow].transpose(0, 3, 1, 2)
        return np.ascontiguousarray(y)
    out = np.empty((n, c, length), x.dtype)
    block = max(1, _BLOCK_ELEMENTS // (n * length))
    tmp = np.empty((n, min(block, c), length), x.dtype)
    for c0 in range(0, c, block):
        c1 = min(c, c0 + block)
        views = [flat[:, c0:c1, ph, off:off + length] for ph, off in taps]
        o = out[:, c0:c1]
        _accumulate(o, tmp[:, :c1 - c0], views, wt[c0:c1, :, None].transpose(1, 0, 2))
        if b is not None:
            np.add(o, b[c0:c1, None], out=o)
    # A view without the phase's extra columns (a copy only when the next op needs one).
    return out.reshape(n, c, oh, wq)[:, :, :, :ow]


def is_dense_2d(x, w, b, group: int) -> bool:
    """Whether :func:`dense_2d` computes this Conv: 2-D, ``group`` == 1, a kernel larger than
    1x1 (a 1x1 kernel needs no columns), float32 or float64 throughout."""
    return (
        x.ndim == 4 and w.ndim == 4 and group == 1 and w.shape[1] == x.shape[1] and w.shape[2] * w.shape[3] > 1
        and x.dtype in (np.float32, np.float64) and w.dtype == x.dtype
        and (b is None or (b.shape == (w.shape[0],) and b.dtype == x.dtype))
    )


def dense_2d(x, w, b, win):
    """Conv of x (n, c, h, w) with w (m, c, kh, kw) and bias b (m,) or None over ``win``
    (:class:`~mithril.backends.kernels.geometry.Window`): im2col and one matmul per block of
    output rows, into a fresh (n, m, oh, ow) array."""
    from ..kernels.nn import pad_spatial

    n, c = x.shape[:2]
    m = w.shape[0]
    (kh, kw), (sh, sw), (dh, dw), (oh, ow) = win.kernel, win.strides, win.dilations, win.out
    k = c * kh * kw
    padded = pad_spatial(x, win, 0, np)  # the shared kernel's padding, so its taps' offsets hold
    blocks = k * oh * ow * x.itemsize // _COLS_BYTES
    rows = oh if blocks < 2 else -(-oh // blocks)
    w2 = w.reshape(m, k)
    out = np.empty((n, m, oh * ow), x.dtype)
    buf = np.empty(k * rows * ow, x.dtype)  # flat, so that a short last block is a contiguous prefix
    for i in range(n):
        for r0 in range(0, oh, rows):
            r1 = min(oh, r0 + rows)
            cols = buf[:k * (r1 - r0) * ow].reshape(c, kh * kw, r1 - r0, ow)
            for a in range(kh):
                rs = slice(a * dh + r0 * sh, a * dh + (r1 - 1) * sh + 1, sh)
                for b_ in range(kw):
                    cols[:, a * kw + b_] = padded[i, :, rs, b_ * dw:b_ * dw + (ow - 1) * sw + 1:sw]
            y = out[i, :, r0 * ow:r1 * ow]
            np.matmul(w2, cols.reshape(k, -1), out=y)
            if b is not None:
                np.add(y, b[:, None], out=y)
    return out.reshape(n, m, oh, ow)
