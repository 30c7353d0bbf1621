"""MLX kernels: native calls for the hot ops (convolution, matmul, pooling, erf).

MLX convolves channels-last (NHWC): inputs are transposed in and out, which MLX fuses into
the convolution's copy. Cases the native call does not cover (integer data, more than three
spatial axes) run the shared kernel through the facade.
"""

from __future__ import annotations

import itertools
import math

import mlx.core as mx

from ..kernels import elementwise, nn, shape
from ..kernels.geometry import grid_window, transposed_window, window
from ..registry import override
from .xp import MlxArray, native_matmul, native

_FLOAT = (mx.float16, mx.bfloat16, mx.float32)


def _channels_last(a):
    return mx.moveaxis(a, 1, -1)


def _channels_first(a):
    return mx.moveaxis(a, -1, 1)


@override("mlx", "Conv", since=1,
          reason="speed: mx.conv_general (channels-last); the shared kernel is im2col over the facade")
def conv(x, w, b=None, *, auto_pad, dilations, group, kernel_shape, pads, strides, xp):
    xn, wn = native(x), native(w)
    nd = wn.ndim - 2
    # MLX convolves groups in 1-D and 2-D only.
    if xn.dtype not in _FLOAT or not 1 <= nd <= 3 or (group != 1 and nd == 3):
        return nn.conv(x, w, b, auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape,
                       pads=pads, strides=strides, xp=xp)
    win = window(xn.shape[2:], wn.shape[2:], strides, dilations, pads, auto_pad)
    # Only the end padding some window reads: more would add output positions.
    end = [max(0, ext - bg - n) for ext, bg, n in zip(win.extent, win.begin, xn.shape[2:])]
    if (group == 1 and all(k == 1 for k in wn.shape[2:]) and all(s == 1 for s in win.strides)
            and not any(win.begin) and not any(end)):
        return MlxArray(_pointwise(xn, wn, b))
    y = mx.conv_general(_channels_last(xn), _channels_last(wn).astype(xn.dtype), stride=list(win.strides),
                        padding=(list(win.begin), end), kernel_dilation=list(win.dilations), groups=group)
    if b is not None:
        y = y + native(b).astype(y.dtype)
    return MlxArray(_channels_first(y))


def _pointwise(xn, wn, b):
    """A 1x1 convolution (stride 1, no padding, one group) as one matmul on the NCHW layout:
    (O, C) @ (N, C, H*W). conv_general would copy the input channels-last and back; this reads it
    in place, and is faster on the CPU (MobileNetV2 at batch 1: 29 MiB of intermediates at the peak, 14)."""
    n, c = xn.shape[:2]
    y = mx.matmul(wn.reshape(wn.shape[0], c).astype(xn.dtype), xn.reshape(n, c, -1))
    y = y.reshape((n, wn.shape[0]) + tuple(xn.shape[2:]))
    if b is not None:
        y = y + native(b).astype(y.dtype).reshape((-1,) + (1,) * (xn.ndim - 2))
    return y


@override("mlx", "MatMul", since=1,
          reason="speed: mx.matmul without the facade's promotion layer")
def matmul(a, b, *, xp):
    return MlxArray(native_matmul(native(a), native(b)))


@override("mlx", "Gemm", since=1,
          reason="speed: one mx.addmm or matmul")
def gemm(a, b, c=None, *, alpha, beta, transA, transB, broadcast=0, xp):
    an, bn = native(a), native(b)
    if transA:
        an = mx.swapaxes(an, 0, 1)
    if transB:
        bn = mx.swapaxes(bn, 0, 1)
    if an.dtype in _FLOAT and bn.dtype == an.dtype and c is not None and beta != 0:
        cn = mx.broadcast_to(native(c).astype(an.dtype), (an.shape[0], bn.shape[1]))
        return MlxArray(mx.addmm(cn, an, bn, alpha=alpha, beta=beta))
    y = native_matmul(an, bn)
    if alpha != 1:
        y = (y * alpha).astype(an.dtype)
    if c is not None and beta != 0:
        y = (y + native(c) * beta).astype(an.dtype)
    return MlxArray(y)


def _col2im(cols, grid, win, size, shift=0):
    """nn.fold_columns with MLX's scatter-add: cols (n, c, taps, *grid) -> (n, c, *size)."""
    out = mx.zeros(cols.shape[:2] + tuple(size), cols.dtype)
    for k, offset in enumerate(itertools.product(*(range(k) for k in win.kernel))):
        index = tuple(slice(shift + o * d, shift + o * d + (g - 1) * s + 1, s)
                      for o, d, s, g in zip(offset, win.dilations, win.strides, grid))
        out = out.at[(Ellipsis, *index)].add(cols[:, :, k])
    return out


@override("mlx", "ConvTranspose", since=1,
          reason="semantic gap: the shared overlap-add mutates a NumPy canvas; here a functional scatter-add")
def conv_transpose(x, w, b=None, *, auto_pad, dilations, group, kernel_shape, output_padding, output_shape, pads,
                   strides):
    # nn.conv_transpose's geometry, with the overlap-add as a functional scatter-add.
    xn, wn = native(x), native(w)
    n, c = xn.shape[:2]
    size = xn.shape[2:]
    nd = len(size)
    kernel = wn.shape[2:]
    cg, mg = c // group, wn.shape[1]
    geo = transposed_window(size, kernel, strides, dilations, pads, auto_pad, output_padding, output_shape)
    taps = math.prod(kernel)
    wt = mx.swapaxes(mx.reshape(wn, (group, cg, mg * taps)), 1, 2)
    cols = native_matmul(wt, mx.reshape(xn, (n, group, cg, math.prod(size))))
    cols = mx.reshape(cols, (n, group * mg, taps) + tuple(size))
    shift = geo.shift
    y = _col2im(cols, size, grid_window(kernel, geo.strides, geo.dilations, size), geo.canvas, shift)
    y = y[(Ellipsis, *(slice(shift + bg, shift + bg + o) for bg, o in zip(geo.begin, geo.out)))]
    if b is not None:
        y = y + mx.reshape(native(b), (-1,) + (1,) * nd).astype(y.dtype)
    return MlxArray(y)


@override("mlx", "Col2Im", since=18, static_inputs=(1, 2),
          reason="semantic gap: the shared overlap-add mutates a NumPy canvas; here a functional scatter-add")
def col2im(x, image_shape, block_shape, *, dilations, pads, strides):
    image = tuple(int(i) for i in image_shape)
    block = tuple(int(k) for k in block_shape)
    win = window(image, block, strides, dilations, pads, "NOTSET")
    xn = native(x)
    cols = mx.reshape(xn, (xn.shape[0], -1, math.prod(block)) + win.out)
    padded = [i + b + e for i, b, e in zip(image, win.begin, win.end)]
    y = _col2im(cols, win.out, win, padded)
    return MlxArray(y[(Ellipsis, *(slice(b, b + i) for b, i in zip(win.begin, image)))])


def _windows(xn, win, fill):
    """(N, C, *out, *kernel) view of every pooling window of a padded NCHW input."""
    nd = len(win.kernel)
    widths = [(0, 0), (0, 0), *win.read_pads(xn.shape[2:])]
    padded = mx.pad(xn, widths, constant_values=fill) if any(b or e for b, e in widths) else xn
    shape = padded.shape
    row = [math.prod(shape[i + 1:]) for i in range(len(shape))]  # row-major element strides
    spatial = row[2:]
    out_strides = [r * s for r, s in zip(spatial, win.strides)]
    tap_strides = [r * d for r, d in zip(spatial, win.dilations)]
    return mx.as_strided(padded, (*shape[:2], *win.out, *win.kernel), (*row[:2], *out_strides, *tap_strides)), nd


@override("mlx", "MaxPool", since=1,
          reason="speed: one max over an as_strided view of the windows")
def max_pool(x, *, auto_pad, kernel_shape, pads, strides, ceil_mode=0, dilations=None, storage_order=0,
             num_outputs=1, xp):
    xn = native(x)
    if num_outputs > 1 or xn.dtype not in _FLOAT:
        return nn.max_pool(x, auto_pad=auto_pad, kernel_shape=kernel_shape, pads=pads, strides=strides,
                           ceil_mode=ceil_mode, dilations=dilations, storage_order=storage_order,
                           num_outputs=num_outputs, xp=xp)
    win = window(xn.shape[2:], kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    windows, nd = _windows(xn, win, -math.inf)
    return MlxArray(mx.max(windows, axis=tuple(range(-nd, 0))))


@override("mlx", "AveragePool", since=1,
          reason="speed: one sum over an as_strided view of the windows")
def average_pool(x, *, auto_pad, kernel_shape, pads, strides, ceil_mode=0, count_include_pad=0, dilations=None,
                 xp):
    xn = native(x)
    if xn.dtype not in _FLOAT:
        return nn.average_pool(x, auto_pad=auto_pad, kernel_shape=kernel_shape, pads=pads, strides=strides,
                               ceil_mode=ceil_mode, count_include_pad=count_include_pad, dilations=dilations, xp=xp)
    size = xn.shape[2:]
    win = window(size, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    # float16/bfloat16 windows are summed in float32, as onnxruntime does (the sum overflows first).
    windows, nd = _windows(xn.astype(mx.float32) if xn.dtype in (mx.float16, mx.bfloat16) else xn, win, 0)
    total = mx.sum(windows, axis=tuple(range(-nd, 0)))
    counts = mx.array(nn.window_counts(size, win, count_include_pad).astype("float32")).astype(total.dtype)
    return MlxArray((total / counts).astype(xn.dtype))


@override("mlx", "Erf", since=9,
          reason="speed: mx.erf is one op; the shared polynomial is a dozen facade ops")
def erf(x, *, xp):
    xn = native(x)
    if xn.dtype not in _FLOAT:
        return elementwise.erf(x, xp=xp)
    return MlxArray(mx.erf(xn.astype(mx.float32)).astype(xn.dtype))


@override("mlx", "Gelu", since=20,
          reason="speed: mx.erf in one expression, as for Erf")
def gelu(x, *, approximate, xp):
    xn = native(x)
    if approximate != "none" or xn.dtype not in _FLOAT:
        return elementwise.gelu(x, approximate=approximate, xp=xp)
    v = xn.astype(mx.float32)
    return MlxArray((0.5 * v * (1 + mx.erf(v / math.sqrt(2)))).astype(xn.dtype))


_SCATTER_METHODS = {"add": "add", "mul": "multiply", "max": "maximum", "min": "minimum"}


def _scatter_into(data, index, updates, reduction):
    # shape._scatter_into mutates a NumPy copy; MLX scatters functionally (duplicates accumulate).
    d = native(data)
    u = native(updates).astype(d.dtype)
    index = tuple(native(i) if not isinstance(i, int) else i for i in index)
    index = tuple(mx.array(i) if not isinstance(i, (int, mx.array)) else i for i in index)
    if reduction == "none":
        out = mx.array(d)
        out[index] = u
        return MlxArray(out)
    return MlxArray(getattr(d.at[index], _SCATTER_METHODS[reduction])(u))


@override("mlx", "ScatterElements", since=11,
          reason="semantic gap: the shared kernel mutates a NumPy copy; MLX scatters functionally")
def scatter_elements(data, indices, updates, *, axis, reduction="none"):
    return _scatter_into(data, shape.element_index(data, indices, axis), updates, reduction)


@override("mlx", "Scatter", since=9,
          reason="semantic gap: the shared kernel mutates a NumPy copy; MLX scatters functionally")
def scatter(data, indices, updates, *, axis):
    return _scatter_into(data, shape.element_index(data, indices, axis), updates, "none")


@override("mlx", "ScatterND", since=11,
          reason="semantic gap: the shared kernel mutates a NumPy copy; MLX scatters functionally")
def scatter_nd(data, indices, updates, *, reduction="none"):
    return _scatter_into(data, tuple(indices[..., j] for j in range(indices.shape[-1])), updates, reduction)


@override("mlx", "StopGradient", since=1, domain="ai.mithril",
          reason="gradient: mx.stop_gradient on MLX arrays")
def stop_gradient(x):
    # Host values (static shapes) carry no gradient.
    return MlxArray(mx.stop_gradient(native(x))) if isinstance(x, (MlxArray, mx.array)) else x
