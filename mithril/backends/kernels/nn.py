"""nn kernels: convolution, pooling and the matmul family.

Convolutions are im2col plus one batched matmul per node, so BLAS does the arithmetic. Pools,
depthwise convolutions and im2col itself are built from *taps*: for each kernel offset, the
strided slice of the padded input that this offset reads in every output window. That is one
array operation per kernel offset, never a Python loop over pixels, and plain slicing works
in every array namespace.
"""

from __future__ import annotations

import itertools
import math

import numpy

from ..registry import kernel
from .geometry import Window, grid_window, transposed_window, window

# ---------------------------------------------------------------------------------------------
# Windows (geometry.py computes their geometry)


def pad_spatial(x, win: Window, fill, xp, channels_last: bool = False):
    """``x`` padded with ``fill`` by just what the windows of ``win`` read (``Window.read_pads``). The
    spatial axes are the last ones, or the ones before the channel axis when ``channels_last``."""
    nd = len(win.kernel)
    first = 1 if channels_last else x.ndim - nd
    widths = [(0, 0)] * x.ndim
    widths[first:first + nd] = win.read_pads(x.shape[first:first + nd])
    if not any(b or e for b, e in widths):
        return x
    if xp is numpy:
        # numpy-only: np.pad's generality costs ~100us a call, a tenth of a small conv.
        out = numpy.full(tuple(n + b + e for n, (b, e) in zip(x.shape, widths)), fill, dtype=x.dtype)
        out[tuple(slice(b, b + n) for n, (b, _) in zip(x.shape, widths))] = x
        return out
    return xp.pad(x, widths, constant_values=fill)


def window_taps(padded, win: Window, channels_last: bool = False):
    """Yields (offset, tap): for each kernel offset (row-major), the slice of ``padded`` that
    this offset reads in every output window; tap.shape = padded.shape[:-nd] + win.out, or
    (N, *win.out, C) when ``channels_last``."""
    for offset in itertools.product(*(range(k) for k in win.kernel)):
        index = tuple(
            slice(o * d, o * d + (n - 1) * s + 1, s) for o, d, s, n in zip(offset, win.dilations, win.strides, win.out)
        )
        yield offset, padded[(slice(None), *index, Ellipsis) if channels_last else (Ellipsis, *index)]


def lowest(dtype):
    """The smallest value of ``dtype``: -inf for floating types, else the integer minimum."""
    dtype = numpy.dtype(dtype)
    return -numpy.inf if dtype.kind in "fV" else numpy.iinfo(dtype).min


def _is_half(dtype) -> bool:
    return numpy.dtype(dtype) == numpy.float16 or numpy.dtype(dtype).name == "bfloat16"


def xp_matmul(a, b, xp):
    """``a @ b`` over ``xp``; on NumPy, float16 and bfloat16 go through float32 and return their own dtype."""
    dtype = a.dtype
    if xp is numpy and (dtype == numpy.float16 or dtype.kind == "V"):
        # NumPy has no BLAS for float16/bfloat16 (float16 matmul is a slow scalar loop);
        # accumulate in float32 as onnxruntime does, and return the ONNX type.
        a, b = a.astype(numpy.float32), b.astype(numpy.float32)
    y = xp.matmul(a, b)
    return y if y.dtype == dtype else y.astype(dtype)


def add_bias(y, b, xp):
    """``y`` plus the per-channel bias ``b`` (axis 1), if any."""
    # y is always a fresh result here: += adds in place under NumPy (saving a pass and an
    # allocation) and rebinds under immutable namespaces.
    if b is not None:
        y += xp.reshape(b, (-1,) + (1,) * (y.ndim - 2)).astype(y.dtype)
    return y


# ---------------------------------------------------------------------------------------------
# Convolution


def _conv(x, w, b, *, auto_pad, dilations, group, pads, strides, xp):
    n, c = x.shape[:2]
    m = w.shape[0]
    cg, mg = c // group, m // group
    win = window(x.shape[2:], w.shape[2:], strides, dilations, pads, auto_pad)
    padded = pad_spatial(x, win, 0, xp)
    taps = math.prod(win.kernel)
    length = math.prod(win.out)
    if taps == 1:
        cols = next(window_taps(padded, win))[1]
    else:
        # im2col: (n, c, taps, *out), channel-major to match W's (m, c, *kernel) layout.
        cols = xp.stack([tap for _, tap in window_taps(padded, win)], axis=2)
    # One matmul batched over groups. Depthwise convolutions (cg == 1) take this path too:
    # measured on MobileNetV2's shapes it is 2x faster than multiply-accumulating shifted
    # slices, whose temporaries cost more than the im2col copy. (NumPy overrides depthwise with
    # preallocated, cache-blocked multiply-adds over stride phases, 1.7x faster: numpy/conv.py.)
    cols = xp.reshape(cols, (n, group, cg * taps, length))
    y = xp_matmul(xp.reshape(w, (group, mg, cg * taps)), cols, xp)
    return add_bias(xp.reshape(y, (n, m) + win.out), b, xp)


@kernel("Conv", since=1)
def conv(x, w, b=None, *, auto_pad, dilations, group, kernel_shape, pads, strides, xp):
    # kernel_shape, when given, equals W's spatial shape; W is the source of truth.
    return _conv(
        x, w, b, auto_pad=auto_pad, dilations=dilations, group=group, pads=pads, strides=strides, xp=xp
    )


def fold_columns(cols, grid, win: Window, size, shift=0):
    """Adds column blocks back into an image: cols (n, c, taps, *grid) -> (n, c, *size), the
    block at grid position g and kernel offset o landing at g * stride + o * dilation + shift."""
    # numpy-only: scatter-add through in-place slice assignment.
    out = numpy.zeros(cols.shape[:2] + tuple(size), dtype=cols.dtype)
    for k, offset in enumerate(itertools.product(*(range(k) for k in win.kernel))):
        index = tuple(
            slice(shift + o * d, shift + o * d + (g - 1) * s + 1, s)
            for o, d, s, g in zip(offset, win.dilations, win.strides, grid)
        )
        out[(Ellipsis, *index)] += cols[:, :, k]
    return out


@kernel("ConvTranspose", since=1, host_only=True, emit_required=True)
def conv_transpose(
    x, w, b=None, *, auto_pad, dilations, group, kernel_shape, output_padding, output_shape, pads, strides
):
    # numpy-only: the overlap-add in fold_columns accumulates into a canvas in place.
    n, c = x.shape[:2]
    size = x.shape[2:]
    kernel = w.shape[2:]
    cg, mg = c // group, w.shape[1]
    geo = transposed_window(size, kernel, strides, dilations, pads, auto_pad, output_padding, output_shape)
    taps = math.prod(kernel)
    # Every input pixel spreads over the kernel: cols[n, m, tap, pixel].
    wt = numpy.swapaxes(numpy.reshape(w, (group, cg, mg * taps)), 1, 2)
    cols = xp_matmul(wt, numpy.reshape(x, (n, group, cg, math.prod(size))), numpy)
    cols = numpy.reshape(cols, (n, group * mg, taps) + tuple(size))
    # Negative padding (output larger than full) grows the canvas: geo.shift pixels at the start.
    shift = geo.shift
    y = fold_columns(cols, size, grid_window(kernel, geo.strides, geo.dilations, size), geo.canvas, shift)
    y = y[(Ellipsis, *(slice(shift + bg, shift + bg + o) for bg, o in zip(geo.begin, geo.out)))]
    return add_bias(y, b, numpy)


@kernel("Col2Im", since=18, static_inputs=(1, 2), host_only=True, emit_required=True)
def col2im(x, image_shape, block_shape, *, dilations, pads, strides):
    image = tuple(int(i) for i in image_shape)
    block = tuple(int(k) for k in block_shape)
    win = window(image, block, strides, dilations, pads, "NOTSET")
    n = x.shape[0]
    cols = numpy.reshape(x, (n, -1, math.prod(block)) + win.out)
    padded = [i + b + e for i, b, e in zip(image, win.begin, win.end)]
    y = fold_columns(cols, win.out, win, padded)
    return y[(Ellipsis, *(slice(b, b + i) for b, i in zip(win.begin, image)))]


@kernel("DeformConv", since=19)
def deform_conv(
    x, w, offset, b=None, mask=None, *, dilations, group, kernel_shape, offset_group, pads, strides, xp
):
    n, c = x.shape[:2]
    size = x.shape[2:]
    nd = len(size)
    m = w.shape[0]
    cg, mg = c // group, m // group
    win = window(size, w.shape[2:], strides, dilations, pads, "NOTSET")
    taps, length = math.prod(win.kernel), math.prod(win.out)
    # Where each (tap, output pixel) samples along each axis: the regular grid plus the learned offset.
    tap_at = numpy.array(list(itertools.product(*(range(k) for k in win.kernel))), dtype=numpy.int64)
    grid = numpy.meshgrid(*(numpy.arange(o) for o in win.out), indexing="ij")
    offset = xp.reshape(offset, (n, offset_group, taps, nd) + win.out)
    pos = []
    for i in range(nd):
        tap_i = tap_at[:, i].reshape((taps,) + (1,) * nd)
        regular = tap_i * win.dilations[i] + grid[i] * win.strides[i] - win.begin[i]
        pos.append(xp.asarray(regular[None, None], dtype=x.dtype) + offset[:, :, :, i])
    lower = [xp.floor(p) for p in pos]
    frac = [p - f for p, f in zip(pos, lower)]
    # Multilinear interpolation with zeros outside the image: sum over the 2**nd corners.
    flat_x = xp.reshape(x, (n, offset_group, c // offset_group, math.prod(size)))
    sampled = None
    for corner in itertools.product((0, 1), repeat=nd):
        weight, flat, valid = 1, 0, True
        for i in range(nd):
            idx = lower[i] + corner[i]
            weight = weight * (frac[i] if corner[i] else 1 - frac[i])
            valid = valid & (idx >= 0) & (idx < size[i])
            flat = flat * size[i] + idx
        flat = xp.reshape(xp.where(valid, flat, 0).astype(numpy.int64), (n, offset_group, 1, taps * length))
        weight = xp.reshape(xp.where(valid, weight, 0), (n, offset_group, 1, taps * length))
        term = xp.take_along_axis(flat_x, flat, axis=3) * weight
        sampled = term if sampled is None else sampled + term
    if mask is not None:
        sampled = sampled * xp.reshape(mask, (n, offset_group, 1, taps * length))
    cols = xp.reshape(sampled, (n, group, cg * taps, length))
    y = xp_matmul(xp.reshape(w, (group, mg, cg * taps)), cols, xp)
    return add_bias(xp.reshape(y, (n, m) + win.out), b, xp)


# ---------------------------------------------------------------------------------------------
# Pooling


def window_max(x, win: Window, xp):
    """Each window's maximum: the elementwise maximum of the shifted slices (one fused loop
    under a compiler)."""
    y = None
    for _, tap in window_taps(pad_spatial(x, win, lowest(x.dtype), xp), win):
        y = tap if y is None else xp.maximum(y, tap)
    return y


@kernel("MaxPool", since=1)
def max_pool(
    x, *, auto_pad, kernel_shape, pads, strides, ceil_mode=0, dilations=None, storage_order=0, num_outputs=1, xp
):
    size = x.shape[2:]
    win = window(size, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    if num_outputs < 2:
        return window_max(x, win, xp)
    padded = pad_spatial(x, win, lowest(x.dtype), xp)
    # Indices: flat positions in the unpadded input, spatial axes row- or column-major.
    nd = len(size)
    order = range(nd) if storage_order else range(nd - 1, -1, -1)
    axis_stride, step = [0] * nd, 1
    for i in order:
        axis_stride[i] = step
        step *= size[i]
    channel_base = numpy.arange(x.shape[0] * x.shape[1], dtype=numpy.int64).reshape(x.shape[:2] + (1,) * nd) * step
    y = indices = None
    for offset, tap in window_taps(padded, win):
        flat = channel_base
        for i in range(nd):
            coord = numpy.arange(win.out[i]) * win.strides[i] + offset[i] * win.dilations[i] - win.begin[i]
            flat = flat + (coord * axis_stride[i]).reshape((win.out[i],) + (1,) * (nd - 1 - i))
        if y is None:
            y, indices = tap, xp.broadcast_to(xp.asarray(flat), tap.shape)
        else:
            # Strict > keeps the first maximum in window order.
            better = tap > y
            y = xp.where(better, tap, y)
            indices = xp.where(better, xp.asarray(flat), indices)
    return y, indices


def window_counts(size, win: Window, count_include_pad):
    """How many taps of each window of ``win`` hit counted pixels, over the output's spatial shape."""
    # How many taps of each window hit counted pixels; separable, so an outer product of 1-D counts.
    counts = numpy.ones(())
    for i, n in enumerate(size):
        lo, hi = (0, n + win.begin[i] + win.end[i]) if count_include_pad else (win.begin[i], win.begin[i] + n)
        starts = numpy.arange(win.out[i])[:, None] * win.strides[i]
        pos = starts + numpy.arange(win.kernel[i])[None, :] * win.dilations[i]
        counts = numpy.multiply.outer(counts, ((pos >= lo) & (pos < hi)).sum(axis=1))
    return counts


@kernel("AveragePool", since=1)
def average_pool(x, *, auto_pad, kernel_shape, pads, strides, ceil_mode=0, count_include_pad=0, dilations=None, xp):
    size = x.shape[2:]
    win = window(size, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    # float16/bfloat16 windows are summed in float32, as onnxruntime does: the sum of a window
    # overflows float16 (inf) long before its mean does.
    low = numpy.dtype(x.dtype).name in ("float16", "bfloat16")
    xs = x.astype(numpy.float32) if low else x
    padded = pad_spatial(xs, win, 0, xp)
    total = None
    for _, tap in window_taps(padded, win):
        total = tap if total is None else total + tap
    mean = total / xp.asarray(window_counts(size, win, count_include_pad), dtype=xs.dtype)
    return mean.astype(x.dtype) if low else mean


@kernel("LpPool", since=1)
def lp_pool(x, *, auto_pad, kernel_shape, p, pads, strides, ceil_mode=0, dilations=None, xp):
    if _is_half(x.dtype):  # a sum of powers: in float32 (NumPy's bfloat16 ** 0.5 is float32 anyway)
        return lp_pool(x.astype(xp.float32), auto_pad=auto_pad, kernel_shape=kernel_shape, p=p, pads=pads,
                       strides=strides, ceil_mode=ceil_mode, dilations=dilations, xp=xp).astype(x.dtype)
    win = window(x.shape[2:], kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    padded = xp.abs(pad_spatial(x, win, 0, xp))
    total = None
    for _, tap in window_taps(padded, win):
        term = tap**p
        total = term if total is None else total + term
    return total ** (1.0 / p)


def _spatial_axes(x):
    return tuple(range(2, x.ndim))


@kernel("GlobalAveragePool", since=1)
def global_average_pool(x, *, xp):
    return xp.mean(x, axis=_spatial_axes(x), keepdims=True)


@kernel("GlobalMaxPool", since=1)
def global_max_pool(x, *, xp):
    return xp.max(x, axis=_spatial_axes(x), keepdims=True)


@kernel("GlobalLpPool", since=1)
def global_lp_pool(x, *, p, xp):
    if _is_half(x.dtype):  # a sum of powers: in float32
        return global_lp_pool(x.astype(xp.float32), p=p, xp=xp).astype(x.dtype)
    return xp.sum(xp.abs(x) ** p, axis=_spatial_axes(x), keepdims=True) ** (1.0 / p)


@kernel("MaxUnpool", since=9, static_inputs=(2,), host_only=True, emit_required=True)
def max_unpool(x, indices, output_shape=None, *, kernel_shape, pads, strides):
    # The inverse of MaxPool's window: a transposed window without dilation.
    shape = x.shape[:2] + transposed_window(x.shape[2:], kernel_shape, strides, None, pads).out
    # numpy-only: scatter by assignment into a flat buffer.
    y = numpy.zeros(math.prod(shape), dtype=x.dtype)
    y[numpy.asarray(indices).reshape(-1)] = numpy.asarray(x).reshape(-1)
    y = y.reshape(shape)
    if output_shape is None:
        return y
    # Indices address the inferred shape; a given output_shape pads (or crops) at the end of
    # each axis. This is what the ONNX suite expects; onnxruntime instead reads the indices as
    # flat positions in output_shape (the two agree when output_shape is the inferred shape).
    target = tuple(int(s) for s in output_shape)
    y = y[tuple(slice(0, t) for t in target)]
    return numpy.pad(y, [(0, t - s) for s, t in zip(y.shape, target)])


@kernel("MaxRoiPool", since=1, host_only=True)
def max_roi_pool(x, rois, *, pooled_shape, spatial_scale):
    # numpy-only: each region has its own bin grid; the loops run over regions and bins, not pixels.
    height, width = x.shape[2:]
    ph, pw = pooled_shape
    y = numpy.zeros((rois.shape[0], x.shape[1], ph, pw), dtype=x.dtype)
    for r, roi in enumerate(numpy.asarray(rois, dtype=numpy.float64)):
        batch = int(roi[0])
        # Corners are rounded half away from zero, as in Caffe's RoI pooling.
        x1, y1, x2, y2 = (int(numpy.sign(v) * numpy.floor(abs(v) * spatial_scale + 0.5)) for v in roi[1:5])
        bin_h = max(y2 - y1 + 1, 1) / ph
        bin_w = max(x2 - x1 + 1, 1) / pw
        for i in range(ph):
            h0 = min(max(math.floor(i * bin_h) + y1, 0), height)
            h1 = min(max(math.ceil((i + 1) * bin_h) + y1, 0), height)
            for j in range(pw):
                w0 = min(max(math.floor(j * bin_w) + x1, 0), width)
                w1 = min(max(math.ceil((j + 1) * bin_w) + x1, 0), width)
                if h1 > h0 and w1 > w0:
                    y[r, :, i, j] = x[batch, :, h0:h1, w0:w1].max(axis=(1, 2))
    return y


# ---------------------------------------------------------------------------------------------
# Matmul family


def _compute_dtype(dtype):
    # NumPy's einsum and linalg have no loops for ml_dtypes (bfloat16) or float16 in linalg.
    return numpy.float32 if numpy.dtype(dtype).kind == "V" else dtype


@kernel("MatMul", since=1)
def matmul(a, b, *, xp):
    return xp_matmul(a, b, xp)


@kernel("Gemm", since=1)
def gemm(a, b, c=None, *, alpha, beta, transA, transB, broadcast=0, xp):
    # Gemm-1/6's broadcast flag only permitted what NumPy broadcasting does anyway.
    dtype = a.dtype
    if transA:
        a = xp.swapaxes(a, 0, 1)
    if transB:
        b = xp.swapaxes(b, 0, 1)
    return gemm_scale_add(xp_matmul(a, b, xp), c, alpha, beta, dtype)


def gemm_scale_add(y, c, alpha, beta, dtype):
    """Gemm's ``alpha * (a @ b) + beta * c`` after the product ``y``, in ``dtype``."""
    if alpha != 1:
        y = (y * alpha).astype(dtype)
    if c is not None and beta != 0:
        y = (y + (c if beta == 1 else c * beta)).astype(dtype)
    return y


@kernel("MatMulAdd", since=1, domain="ai.mithril")
def matmul_add(x, w, b, *, xp):
    # Mithril-internal: Add(MatMul(x, W), b) fused by the fuse_matmul_bias pass.
    y = xp_matmul(x, w, xp)
    y += b.astype(y.dtype)  # in place under NumPy, rebinding under immutable namespaces
    return y


@kernel("Einsum", since=12)
def einsum(*inputs, equation, xp):
    dtype = inputs[0].dtype
    compute = _compute_dtype(dtype)
    operands = [i.astype(compute) if i.dtype != compute else i for i in inputs]
    # NumPy's einsum only reaches BLAS (tensordot) when asked to optimize the contraction order.
    extra = {"optimize": True} if xp is numpy and len(operands) > 1 else {}
    y = xp.einsum(equation.replace(" ", ""), *operands, **extra)
    return xp.asarray(y).astype(dtype)


@kernel("Det", since=11)
def det(x, *, xp):
    compute = numpy.float32 if numpy.dtype(x.dtype).kind == "V" or x.dtype == numpy.float16 else x.dtype
    return xp.asarray(xp.linalg.det(x.astype(compute))).astype(x.dtype)
