"""Quantization kernels: (De)QuantizeLinear, DynamicQuantizeLinear and the integer/QLinear matmul and conv.

Integer results are exact: x / scale rounds half to even, then saturates to the target range. Narrow
types (int4, int2, float8, float4, float6) are the ``ml_dtypes`` NumPy dtypes.
"""

from __future__ import annotations

import itertools
import math

import ml_dtypes
import numpy

from ...dtypes import np_dtype_of_onnx
from ..registry import kernel

# Float8 types keep inf/NaN for out-of-range values when saturate=0; float4/float6 always saturate.
_FLOAT8 = {"float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz"}
_WIDE_FLOATS = {"float16", "bfloat16", "float32", "float64"}


def _is_integer(dtype) -> bool:
    return numpy.dtype(dtype).kind in "iu" or numpy.dtype(dtype).name in ("int4", "uint4", "int2", "uint2")


def integer_range(dtype) -> tuple[int, int]:
    """``(min, max)`` of an integer dtype, the 4-bit ones included."""
    info = ml_dtypes.iinfo(dtype) if numpy.dtype(dtype).kind not in "iu" else numpy.iinfo(dtype)
    return int(info.min), int(info.max)


def _compute_dtype(dtype):
    # Arithmetic dtype for a scale: float8e8m0 scales and int32 "scales" are widened to float32.
    dtype = numpy.dtype(dtype)
    return dtype if dtype.name in _WIDE_FLOATS else numpy.dtype(numpy.float32)


def _division_dtype(scale_dtype):
    # Like onnxruntime, divide at least in float32: a float16 quotient is off by one step near 2**11.
    dtype = _compute_dtype(scale_dtype)
    return numpy.dtype(numpy.float64) if dtype == numpy.float64 else numpy.dtype(numpy.float32)


def _broadcast_param(param, x, axis, block_size, xp):
    """Shape a scale or zero point so it broadcasts against x (per-tensor, per-axis or blocked)."""
    if param.ndim == 0 or (param.ndim == 1 and param.shape[0] == 1 and block_size <= 0):
        return param.reshape(())
    axis = axis % x.ndim
    if block_size > 0:
        # Blocked: every scale covers block_size consecutive elements along axis.
        param = xp.repeat(param, block_size, axis=axis)
        index = tuple(slice(0, x.shape[axis]) if i == axis else slice(None) for i in range(x.ndim))
        return param[index]
    shape = [1] * x.ndim
    shape[axis] = param.shape[0]
    return param.reshape(shape)


def divide(x, d, xp):
    """x / d, one correctly rounded division per element on every backend. XLA's simplifier rewrites
    a division by a broadcast scale as a multiplication by its reciprocal, and (a / b) / c as
    a / (b * c): one ulp off at times, so a value on a rounding midpoint goes the other way (a third
    of the midpoints in a measured sample). Adding a zero computed from x to both operands makes
    them elementwise values those rewrites do not match; infinities keep their own zero."""
    zero = xp.where(xp.isinf(x), 0, x * 0).astype(x.dtype)
    return (x + zero) / (d + zero)


def _saturate_cast(y, dtype, saturate, xp):
    """Cast floats to a quantized dtype: integers round half to even and clip, narrow floats round
    to nearest even and clip to +-max when saturating (float4/float6 always saturate)."""
    dtype = numpy.dtype(dtype)
    if _is_integer(dtype):
        lo, hi = integer_range(dtype)
        return xp.clip(y, lo, hi).astype(dtype)
    if saturate or dtype.name not in _FLOAT8:
        big = float(ml_dtypes.finfo(dtype).max)
        y = xp.clip(y, -big, big)
    return y.astype(dtype)


@kernel("QuantizeLinear", since=10)
def quantize_linear(
    x, y_scale, y_zero_point=None, *, axis=1, saturate=1, block_size=0, output_dtype=0, precision=0, xp
):
    if y_zero_point is not None:
        out_dtype = numpy.dtype(y_zero_point.dtype)
    elif output_dtype:
        out_dtype = np_dtype_of_onnx(output_dtype)
    else:
        out_dtype = numpy.dtype(numpy.uint8)
    work = np_dtype_of_onnx(precision) if precision else _division_dtype(y_scale.dtype)
    scale = _broadcast_param(y_scale.astype(work), x, axis, block_size, xp)
    y = divide(x.astype(work), scale, xp)
    if _is_integer(out_dtype):
        # Round in the division precision, then widen so adding the zero point is exact.
        y = xp.round(y)
        if y.dtype.itemsize < 4:
            y = y.astype(numpy.float32)
    if y_zero_point is not None:
        zero_point = _broadcast_param(y_zero_point, x, axis, block_size, xp)
        y = y + zero_point.astype(y.dtype)
    return _saturate_cast(y, out_dtype, saturate, xp)


@kernel("DequantizeLinear", since=10)
def dequantize_linear(x, x_scale, x_zero_point=None, *, axis=1, block_size=0, output_dtype=0, xp):
    if output_dtype:
        out_dtype = np_dtype_of_onnx(output_dtype)
    else:
        out_dtype = _compute_dtype(x_scale.dtype)
    if _is_integer(x.dtype):
        diff = x.astype(numpy.int32)
        if x_zero_point is not None:
            zero_point = _broadcast_param(x_zero_point, x, axis, block_size, xp)
            diff = diff - zero_point.astype(numpy.int32)
    else:
        diff = x.astype(numpy.float32)
        if x_zero_point is not None:
            zero_point = _broadcast_param(x_zero_point, x, axis, block_size, xp)
            diff = diff - zero_point.astype(numpy.float32)
    scale = _broadcast_param(x_scale, x, axis, block_size, xp)
    # The output type is also the precision of the multiplication.
    return diff.astype(out_dtype) * scale.astype(out_dtype)


@kernel("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(x, *, xp):
    x = x.astype(numpy.float32)
    # The range always contains 0 so that 0 is exactly representable.
    x_min = xp.minimum(xp.min(x), 0).astype(numpy.float32)
    x_max = xp.maximum(xp.max(x), 0).astype(numpy.float32)
    scale = divide(x_max - x_min, numpy.float32(255), xp).astype(numpy.float32)
    safe_scale = xp.where(scale == 0, numpy.float32(1), scale)
    zero_point = xp.clip(xp.round(divide(-x_min, safe_scale, xp)), 0, 255)
    y = xp.clip(xp.round(divide(x, safe_scale, xp)) + zero_point, 0, 255)
    return y.astype(numpy.uint8), scale, zero_point.astype(numpy.uint8)


def int_matmul(a, b, xp):
    """Exact matmul of small integer arrays, as int32."""
    if xp is numpy:
        # numpy-only: integer matmul has no BLAS; float64 is exact while sums stay below 2**53.
        return numpy.rint(numpy.matmul(a.astype(numpy.float64), b.astype(numpy.float64))).astype(numpy.int32)
    return xp.matmul(a.astype(numpy.int32), b.astype(numpy.int32))


def _row_zero_point(zero_point, a):
    # A per-row zero point of A ([M] for a [..., M, K] input) applies along the row axis.
    if zero_point.ndim == 1 and a.ndim >= 2 and zero_point.shape[0] == a.shape[-2] and zero_point.shape[0] != 1:
        return zero_point.reshape(-1, 1)
    return zero_point


def shifted(x, zero_point, xp):
    """``x`` minus its zero point as int32 (``x`` as int32 when there is none)."""
    x = x.astype(numpy.int32)
    return x if zero_point is None else x - zero_point.astype(numpy.int32)


@kernel("MatMulInteger", since=10)
def matmul_integer(a, b, a_zero_point=None, b_zero_point=None, *, xp):
    a_zp = None if a_zero_point is None else _row_zero_point(a_zero_point, a)
    return int_matmul(shifted(a, a_zp, xp), shifted(b, b_zero_point, xp), xp)


def _requantize(acc, multiplier, y_zero_point, xp):
    """int32 accumulator -> quantized output: round(acc * multiplier) + zero point, saturated."""
    y = xp.round(acc.astype(numpy.float32) * multiplier.astype(numpy.float32))
    y = y + y_zero_point.astype(numpy.float32)
    return _saturate_cast(y, y_zero_point.dtype, True, xp)


@kernel("QLinearMatMul", since=10)
def qlinear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point, *, xp):
    acc = int_matmul(shifted(a, _row_zero_point(a_zero_point, a), xp), shifted(b, b_zero_point, xp), xp)
    a_scale = _row_zero_point(a_scale, a).astype(numpy.float32)
    multiplier = a_scale * b_scale.astype(numpy.float32) / y_scale.astype(numpy.float32)
    return _requantize(acc, multiplier, y_zero_point, xp)


def _conv_pads(in_shape, kernel_shape, strides, dilations, pads, auto_pad):
    n = len(in_shape)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begins, ends = [], []
        for size, k, s, d in zip(in_shape, kernel_shape, strides, dilations):
            total = max(0, (math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size)
            small, large = total // 2, total - total // 2
            begins.append(small if auto_pad == "SAME_UPPER" else large)
            ends.append(large if auto_pad == "SAME_UPPER" else small)
        return begins, ends
    if auto_pad == "VALID" or pads is None:
        return [0] * n, [0] * n
    return list(pads[:n]), list(pads[n:])


def _conv_integer(x, w, *, group, pads, strides, dilations, kernel_shape, auto_pad, xp):
    """Grouped N-d convolution of zero-point-shifted int32 arrays -> int32, via im2col."""
    spatial = x.ndim - 2
    kernel_shape = tuple(kernel_shape) if kernel_shape else tuple(w.shape[2:])
    strides = tuple(strides) if strides else (1,) * spatial
    dilations = tuple(dilations) if dilations else (1,) * spatial
    begins, ends = _conv_pads(x.shape[2:], kernel_shape, strides, dilations, pads, auto_pad)
    # Shifted inputs pad with 0, i.e. with the zero point of the unshifted input.
    x = xp.pad(x, [(0, 0), (0, 0)] + list(zip(begins, ends)))
    out_shape = tuple(
        (size - d * (k - 1) - 1) // s + 1 for size, k, s, d in zip(x.shape[2:], kernel_shape, strides, dilations)
    )
    # One strided view per kernel offset: (N, C, prod(kernel), *out).
    patches = []
    for offset in itertools.product(*(range(k) for k in kernel_shape)):
        index = tuple(
            slice(o * d, o * d + s * (n - 1) + 1, s) for o, d, s, n in zip(offset, dilations, strides, out_shape)
        )
        patches.append(x[(slice(None), slice(None), *index)])
    batch, channels = x.shape[:2]
    out_channels = w.shape[0]
    columns = xp.stack(patches, axis=2).reshape(batch, group, -1, math.prod(out_shape))
    weights = w.reshape(group, out_channels // group, -1)
    y = int_matmul(weights[None], columns, xp)
    return y.reshape(batch, out_channels, *out_shape)


def _channel_zero_point(zero_point, ndim):
    # A per-output-channel weight zero point/scale [M] broadcasts over (M, C/group, *kernel).
    if zero_point.ndim == 1 and zero_point.shape[0] != 1:
        return zero_point.reshape((-1,) + (1,) * (ndim - 1))
    return zero_point.reshape(())


@kernel("ConvInteger", since=10)
def conv_integer(
    x, w, x_zero_point=None, w_zero_point=None, *, auto_pad, dilations, group, kernel_shape, pads, strides, xp
):
    w_zp = None if w_zero_point is None else _channel_zero_point(w_zero_point, w.ndim)
    return _conv_integer(
        shifted(x, x_zero_point, xp),
        shifted(w, w_zp, xp),
        group=group,
        pads=pads,
        strides=strides,
        dilations=dilations,
        kernel_shape=kernel_shape,
        auto_pad=auto_pad,
        xp=xp,
    )


@kernel("QLinearConv", since=10)
def qlinear_conv(
    x,
    x_scale,
    x_zero_point,
    w,
    w_scale,
    w_zero_point,
    y_scale,
    y_zero_point,
    B=None,
    *,
    auto_pad,
    dilations,
    group,
    kernel_shape,
    pads,
    strides,
    xp,
):
    acc = _conv_integer(
        shifted(x, x_zero_point, xp),
        shifted(w, _channel_zero_point(w_zero_point, w.ndim), xp),
        group=group,
        pads=pads,
        strides=strides,
        dilations=dilations,
        kernel_shape=kernel_shape,
        auto_pad=auto_pad,
        xp=xp,
    )
    spatial_ones = (1,) * (x.ndim - 2)
    if B is not None:
        acc = acc + B.astype(numpy.int32).reshape((-1,) + spatial_ones)
    w_scale = _channel_zero_point(w_scale, 1 + len(spatial_ones)).astype(numpy.float32)
    multiplier = x_scale.astype(numpy.float32) * w_scale / y_scale.astype(numpy.float32)
    return _requantize(acc, multiplier, y_zero_point, xp)
