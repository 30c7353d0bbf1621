"""onnxruntime's quantized ops (domain ``com.microsoft``): what its quantization tools emit.

``quantize_static`` in QOperator format writes QLinearAdd/Mul/Sigmoid/LeakyRelu/AveragePool/
GlobalAveragePool/Concat/Softmax/Where and QGemm; ``quantize_dynamic`` writes DynamicQuantizeLSTM,
QAttention and QEmbedLayerNormalization (after ``onnxruntime.transformers``' fusions); QDQ format
with 16-bit or 4-bit types writes com.microsoft Quantize/DequantizeLinear; onnxruntime's own graph
optimizer fuses DynamicQuantizeMatMul and MatMulIntegerToFloat.

Integer outputs follow onnxruntime's CPU kernels: dequantize as ``scale * (x - zero_point)`` in
float32, requantize as ``round_half_even(y / scale) + zero_point`` saturated, or, where onnxruntime
requantizes an int32 accumulator, ``round_half_even(acc * multiplier) + zero_point``. An absent
zero point is 0 of the data's type. Divisions go through quantize.py's ``divide`` and summed
products through ``_uncontracted``, so that XLA's rewrites (reciprocal multiplication, fused
multiply-add) cannot move a value across a rounding midpoint on JAX.
"""

from __future__ import annotations

import math

import numpy

from ...errors import UnsupportedAttributeError
from ..registry import kernel
from . import nn, rnn
from .geometry import window
from .quantize import (
    divide,
    int_matmul,
    integer_range,
    shifted,
    dequantize_linear,
    dynamic_quantize_linear,
    qlinear_conv,
    quantize_linear,
)

MS = "com.microsoft"
F32 = numpy.float32


def _dequantize(x, scale, zero_point, xp):
    """scale * (x - zero_point) in float32, per tensor."""
    diff = x.astype(numpy.int32)
    if zero_point is not None:
        diff = diff - zero_point.reshape(()).astype(numpy.int32)
    return diff.astype(F32) * scale.reshape(()).astype(F32)


def _uncontracted(v):
    """v, as a value the next addition cannot fuse with: XLA's code generator contracts a product
    feeding a sum into one fused multiply-add, which skips the product's rounding that onnxruntime's
    stored float32 values have. v + v * 0 is v for finite v and is no longer a bare product."""
    return v + v * F32(0)


def _quantize(y, scale, zero_point, dtype, xp, shift_first=False):
    """round_half_even(y / scale) + zero_point, saturated to ``dtype``; per tensor. ``shift_first``
    adds the zero point before rounding, in float32, as onnxruntime's pooling kernels do (the sum
    can round to a midpoint that y / scale alone does not reach)."""
    y = divide(y.astype(F32), scale.reshape(()).astype(F32), xp)
    zero = F32(0) if zero_point is None else zero_point.reshape(()).astype(F32)
    y = xp.round(y + zero) if shift_first else xp.round(y) + zero
    lo, hi = integer_range(dtype)
    return xp.clip(y, lo, hi).astype(dtype)


def _requantize(acc, multiplier, zero_point, dtype, xp):
    """An int32 accumulator to ``dtype``: round_half_even(acc * multiplier) + zero_point, saturated."""
    y = xp.round(acc.astype(F32) * multiplier)
    if zero_point is not None:
        y = y + zero_point.astype(F32)
    lo, hi = integer_range(dtype)
    return xp.clip(y, lo, hi).astype(dtype)


def _out_dtype(zero_point, x):
    return numpy.dtype((x if zero_point is None else zero_point).dtype)


# -- output shapes for compile-time shape inference (ONNX's does not know this domain) ------------
# Each rule maps the inputs' (static shape or None, numpy dtype or None) pairs and the node's
# attributes to one (shape, dtype) per output; a None leaves that output unknown.
def _in(inputs, i):
    return inputs[i] if i < len(inputs) and inputs[i] is not None else (None, None)


def _dtype_of(inputs, *indices):
    """The dtype of the first present input among ``indices``."""
    for i in indices:
        if _in(inputs, i)[1] is not None:
            return _in(inputs, i)[1]
    return None


def _like(index, *dtype_from):
    def rule(inputs, attrs):
        return [(_in(inputs, index)[0], _dtype_of(inputs, *(dtype_from or (index,))))]

    return rule


def _quantize_rule(inputs, attrs):
    return [(_in(inputs, 0)[0], _dtype_of(inputs, 2) or numpy.dtype(numpy.uint8))]


def _broadcast(*indices, dtype_from):
    def rule(inputs, attrs):
        shapes = [_in(inputs, i)[0] for i in indices]
        shape = None if any(s is None for s in shapes) else tuple(numpy.broadcast_shapes(*shapes))
        return [(shape, _dtype_of(inputs, *dtype_from))]

    return rule


def _matmul_shape(a, b):
    if a is None or b is None or len(a) < 2 or len(b) < 2:
        return None
    return tuple(numpy.broadcast_shapes(a[:-2], b[:-2])) + (a[-2], b[-1])


def _matmul_rule(dtype):
    def rule(inputs, attrs):
        out = dtype if dtype is not None else _dtype_of(inputs, 2)
        return [(_matmul_shape(_in(inputs, 0)[0], _in(inputs, 1)[0]), out)]

    return rule


def _window_shape(shape, channels_last, kernel, attrs):
    """(N, C, *spatial) output shape of a convolution or pooling window over ``shape``."""
    if shape is None:
        return None
    first = (shape[0], shape[-1], *shape[1:-1]) if channels_last else tuple(shape)
    win = window(first[2:], kernel, attrs.get("strides"), attrs.get("dilations"), attrs.get("pads"),
                     attrs.get("auto_pad") or "NOTSET", attrs.get("ceil_mode") or 0)
    return first[:2], tuple(win.out)


def _pool_rule(inputs, attrs):
    shape = _in(inputs, 0)[0]
    last = attrs.get("channels_last")
    found = _window_shape(shape, last, tuple(attrs["kernel_shape"]), attrs)
    if found is None:
        return [(None, _dtype_of(inputs, 4, 0))]
    (n, c), out = found
    return [((n, *out, c) if last else (n, c, *out), _dtype_of(inputs, 4, 0))]


def _conv_rule(inputs, attrs):
    shape, w = _in(inputs, 0)[0], _in(inputs, 3)[0]
    last = attrs.get("channels_last")
    if shape is None or w is None:
        return [(None, _dtype_of(inputs, 7))]
    (n, _), out = _window_shape(shape, last, tuple(attrs.get("kernel_shape") or w[2:]), attrs)
    return [((n, *out, w[0]) if last else (n, w[0], *out), _dtype_of(inputs, 7))]


def _global_pool_rule(inputs, attrs):
    shape = _in(inputs, 0)[0]
    if shape is None:
        return [(None, _dtype_of(inputs, 4))]
    ones = (1,) * (len(shape) - 2)
    out = (shape[0], *ones, shape[-1]) if attrs.get("channels_last") else (shape[0], shape[1], *ones)
    return [(out, _dtype_of(inputs, 4))]


def _reduce_mean_rule(inputs, attrs):
    shape = _in(inputs, 0)[0]
    if shape is None:
        return [(None, _dtype_of(inputs, 4, 0))]
    axes = {a % len(shape) for a in (attrs.get("axes") or range(len(shape)))}
    keep = attrs.get("keepdims", 1)
    out = tuple(1 if i in axes else d for i, d in enumerate(shape) if keep or i not in axes)
    return [(out, _dtype_of(inputs, 4, 0))]


def _concat_rule(inputs, attrs):
    parts = [_in(inputs, i)[0] for i in range(2, len(inputs), 3)]
    if not parts or any(p is None for p in parts):
        return [(None, _dtype_of(inputs, 1))]
    axis = attrs["axis"] % len(parts[0])
    out = list(parts[0])
    out[axis] = sum(p[axis] for p in parts)
    return [(tuple(out), _dtype_of(inputs, 1))]


def _qgemm_rule(inputs, attrs):
    a, b = _in(inputs, 0)[0], _in(inputs, 3)[0]
    shape = None
    if a is not None and b is not None:
        shape = (a[1] if attrs.get("transA") else a[0], b[0] if attrs.get("transB") else b[1])
    dtype = numpy.dtype(F32) if _in(inputs, 7)[0] is None and _in(inputs, 7)[1] is None else _dtype_of(inputs, 8)
    return [(shape, dtype)]


def _lstm_rule(inputs, attrs):
    x, r = _in(inputs, 0)[0], _in(inputs, 2)[0]
    if x is None:
        return [(None, F32)] * 3
    hidden = attrs.get("hidden_size") or (r[1] if r is not None else None)
    if hidden is None:
        return [(None, F32)] * 3
    d = 2 if attrs.get("direction") == "bidirectional" else 1
    state = (d, x[1], hidden)
    return [((x[0], d, x[1], hidden), F32), (state, F32), (state, F32)]


def _qattention_rule(inputs, attrs):
    x, w, past = _in(inputs, 0)[0], _in(inputs, 1)[0], _in(inputs, 8)[0]
    dtype = _dtype_of(inputs, 3)
    if x is None or w is None:
        return [(None, dtype), (None, dtype)]
    hidden, heads = w[1] // 3, attrs["num_heads"]
    total = x[1] + (past[3] if past is not None else 0)
    return [((x[0], x[1], hidden), dtype), ((2, x[0], heads, total, hidden // heads), dtype)]


def _qembed_rule(inputs, attrs):
    ids, word = _in(inputs, 0)[0], _in(inputs, 2)[0]
    if ids is None or word is None:
        return [(None, F32), (None, numpy.int32)]
    return [((ids[0], ids[1], word[1]), F32), ((ids[0],), numpy.int32)]


# -- Quantize/DequantizeLinear: 16-bit and 4-bit types, axis optional ---------------------------
@kernel("QuantizeLinear", since=1, domain=MS, output_shapes=_quantize_rule)
def ms_quantize_linear(x, y_scale, y_zero_point=None, *, axis=None, xp):
    # No axis means per tensor: the scale is a scalar and any axis broadcasts the same.
    return quantize_linear(x, y_scale, y_zero_point, axis=1 if axis is None else axis, xp=xp)


@kernel("DequantizeLinear", since=1, domain=MS, output_shapes=_like(0, 1))
def ms_dequantize_linear(x, x_scale, x_zero_point=None, *, axis=None, xp):
    return dequantize_linear(x, x_scale, x_zero_point, axis=1 if axis is None else axis, xp=xp)


# -- elementwise --------------------------------------------------------------------------------
@kernel("QLinearAdd", since=1, domain=MS, output_shapes=_broadcast(0, 3, dtype_from=(7, 0)))
def qlinear_add(A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point=None, *, xp):
    # MLAS's vector kernel: the raw inputs times their scale ratios to C, added to one fixed part
    # that folds all three zero points, then rounded; in float32 in this order.
    c_scale = C_scale.reshape(()).astype(F32)
    ratio_a = A_scale.reshape(()).astype(F32) / c_scale
    ratio_b = B_scale.reshape(()).astype(F32) / c_scale

    def zero(zero_point):
        return F32(0) if zero_point is None else zero_point.reshape(()).astype(F32)

    fixed = zero(C_zero_point) - (ratio_a * zero(A_zero_point) + ratio_b * zero(B_zero_point))
    y = xp.round((fixed + A.astype(F32) * ratio_a) + B.astype(F32) * ratio_b)
    dtype = _out_dtype(C_zero_point, A)
    lo, hi = integer_range(dtype)
    return xp.clip(y, lo, hi).astype(dtype)


@kernel("QLinearMul", since=1, domain=MS, output_shapes=_broadcast(0, 3, dtype_from=(7, 0)))
def qlinear_mul(A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point=None, *, xp):
    # MLAS: the exact int32 product of the shifted inputs, times A_scale * B_scale / C_scale, plus
    # C's zero point, then rounded (the zero point is added before rounding, in float32).
    multiplier = A_scale.reshape(()).astype(F32) * B_scale.reshape(()).astype(F32) / C_scale.reshape(()).astype(F32)
    a = shifted(A, None if A_zero_point is None else A_zero_point.reshape(()), xp)
    b = shifted(B, None if B_zero_point is None else B_zero_point.reshape(()), xp)
    zero = F32(0) if C_zero_point is None else C_zero_point.reshape(()).astype(F32)
    y = xp.round(_uncontracted((a * b).astype(F32) * multiplier) + zero)
    dtype = _out_dtype(C_zero_point, A)
    lo, hi = integer_range(dtype)
    return xp.clip(y, lo, hi).astype(dtype)


def _sigmoid(x, xp):
    return 1 / (1 + xp.exp(-x))


@kernel("QLinearSigmoid", since=1, domain=MS, output_shapes=_like(0, 4, 0))
def qlinear_sigmoid(X, X_scale, X_zero_point=None, Y_scale=None, Y_zero_point=None, *, xp):
    y = _sigmoid(_dequantize(X, X_scale, X_zero_point, xp), xp)
    return _quantize(y, Y_scale, Y_zero_point, _out_dtype(Y_zero_point, X), xp)


@kernel("QLinearLeakyRelu", since=1, domain=MS, output_shapes=_like(0, 4, 0))
def qlinear_leaky_relu(X, X_scale, X_zero_point=None, Y_scale=None, Y_zero_point=None, *, alpha, xp):
    x = _dequantize(X, X_scale, X_zero_point, xp)
    y = xp.where(x >= 0, x, x * F32(alpha))
    return _quantize(y, Y_scale, Y_zero_point, _out_dtype(Y_zero_point, X), xp)


@kernel("QLinearWhere", since=1, domain=MS, output_shapes=_broadcast(0, 1, 4, dtype_from=(8, 1)))
def qlinear_where(condition, X, x_scale, x_zero_point, Y, y_scale, y_zero_point, z_scale, z_zero_point, *, xp):
    dtype = _out_dtype(z_zero_point, X)
    x = _quantize(_dequantize(X, x_scale, x_zero_point, xp), z_scale, z_zero_point, dtype, xp)
    y = _quantize(_dequantize(Y, y_scale, y_zero_point, xp), z_scale, z_zero_point, dtype, xp)
    return xp.where(condition, x, y)


@kernel("QLinearConcat", since=1, domain=MS, output_shapes=_concat_rule)
def qlinear_concat(Y_scale, Y_zero_point, *inputs, axis, xp):
    # Inputs come as (tensor, scale, zero point) triples, each requantized to Y's parameters.
    dtype = numpy.dtype(Y_zero_point.dtype)
    parts = [
        _quantize(_dequantize(x, scale, zp, xp), Y_scale, Y_zero_point, dtype, xp)
        for x, scale, zp in zip(inputs[0::3], inputs[1::3], inputs[2::3])
    ]
    return xp.concatenate(parts, axis=axis)


# -- pooling and reductions ---------------------------------------------------------------------
def _to_channels_first(x, channels_last, xp):
    return xp.moveaxis(x, -1, 1) if channels_last else x


def _from_channels_first(x, channels_last, xp):
    return xp.moveaxis(x, 1, -1) if channels_last else x


@kernel("QLinearAveragePool", since=1, domain=MS, output_shapes=_pool_rule)
def qlinear_average_pool(
    X, x_scale, x_zero_point=None, y_scale=None, y_zero_point=None, *, auto_pad, kernel_shape, pads, strides,
    ceil_mode=0, count_include_pad=0, channels_last=0, xp,
):  # fmt: skip
    # onnxruntime sums the dequantized float32 values window by window, row-major, divides by the
    # count, then quantizes.
    x = _to_channels_first(_uncontracted(_dequantize(X, x_scale, x_zero_point, xp)), channels_last, xp)
    size = x.shape[2:]
    win = window(size, kernel_shape, strides, None, pads, auto_pad, ceil_mode)
    total = None
    for _, tap in nn.window_taps(nn.pad_spatial(x, win, 0, xp), win):
        total = tap if total is None else total + tap
    counts = nn.window_counts(size, win, count_include_pad).astype(F32)
    y = divide(total, xp.asarray(counts), xp)
    y = _quantize(y, y_scale, y_zero_point, _out_dtype(y_zero_point, X), xp, shift_first=True)
    return _from_channels_first(y, channels_last, xp)


@kernel("QLinearGlobalAveragePool", since=1, domain=MS, output_shapes=_global_pool_rule)
def qlinear_global_average_pool(X, x_scale, x_zero_point, y_scale, y_zero_point, *, channels_last=0, xp):
    # MLAS sums the integers, then requantizes the sum with x_scale / (y_scale * count).
    axes = tuple(range(1, X.ndim - 1)) if channels_last else tuple(range(2, X.ndim))
    count = math.prod(X.shape[a] for a in axes)
    total = xp.sum(shifted(X, x_zero_point.reshape(()), xp), axis=axes, keepdims=True)
    multiplier = x_scale.reshape(()).astype(F32) / (y_scale.reshape(()).astype(F32) * F32(count))
    return _requantize(total, multiplier, y_zero_point.reshape(()), _out_dtype(y_zero_point, X), xp)


@kernel("QLinearReduceMean", since=1, domain=MS, output_shapes=_reduce_mean_rule)
def qlinear_reduce_mean(data, data_scale, data_zero_point=None, reduced_scale=None, reduced_zero_point=None, *,
                        axes, keepdims, xp):
    x = _uncontracted(_dequantize(data, data_scale, data_zero_point, xp))
    axes = tuple(axes) if axes else tuple(range(data.ndim))
    y = xp.mean(x, axis=axes, keepdims=bool(keepdims))
    return _quantize(y, reduced_scale, reduced_zero_point, _out_dtype(reduced_zero_point, data), xp)


def _softmax_exponents(x_scale, reduce_len, xp):
    """onnxruntime's table of exp((i - 255) * scale) for i in 0..255, shifted up by a constant factor
    so that a sum of reduce_len entries stays finite, built in float64 where the backend has it."""
    # The shift cancels in the ratio; keeping it reproduces onnxruntime's float32 rounding.
    shift = max(0.0, math.log(float(numpy.finfo(F32).max) / reduce_len) - 5.0)
    scale = x_scale.reshape(()).astype(numpy.float64)
    steps = xp.arange(256).astype(numpy.float64) - 255
    return xp.exp(steps * scale + shift).astype(F32)


@kernel("QLinearSoftmax", since=1, domain=MS, output_shapes=_like(0))
def qlinear_softmax(X, X_scale, x_zero_point=None, y_scale=None, y_zero_point=None, *, axis=-1, xp, **attributes):
    # The node's "opset" attribute (the Softmax version it stands for) arrives through **attributes:
    # a keyword parameter named opset would receive the domain's opset instead.
    opset = attributes["opset"]
    dtype = numpy.dtype(X.dtype)
    shape = X.shape
    axis = axis % X.ndim
    # Before opset 13 softmax runs over all dims from axis on; from 13 over axis alone.
    if opset < 13:
        rows = X.reshape(math.prod(shape[:axis]), -1)
    else:
        rows = xp.moveaxis(X, axis, -1)
    signed = dtype.kind == "i"
    table = _softmax_exponents(X_scale, rows.shape[-1], xp)
    # Each row is shifted so that its maximum reads the table's last entry.
    index = rows.astype(numpy.int32) - xp.max(rows, axis=-1, keepdims=True).astype(numpy.int32) + 255
    e = xp.take(table, index)
    total = xp.sum(e, axis=-1, keepdims=True)
    # onnxruntime scales by floor(1 / y_scale), then divides by the row's sum, in float32.
    inv = xp.floor(F32(1) / y_scale.reshape(()).astype(F32))
    q = xp.round(divide(e * inv, total, xp)).astype(numpy.int32)
    if y_zero_point is not None:
        q = q + y_zero_point.reshape(()).astype(numpy.int32)
    # Values above 255 become 255, then wrap to the output type (int8's 128 reads -128), as onnxruntime.
    q = xp.minimum(q, 255)
    if not signed:
        q = xp.maximum(q, 0)
    y = q.astype(numpy.uint8).astype(dtype) if signed else q.astype(dtype)
    if opset < 13:
        return y.reshape(shape)
    return xp.moveaxis(y, -1, axis)


# -- matrix products ----------------------------------------------------------------------------
def _column_param(param):
    # A per-column scale/zero point [N] of B broadcasts over the output's last axis.
    return param if param.ndim <= 1 else param.reshape(-1)


@kernel("QGemm", since=1, domain=MS, output_shapes=_qgemm_rule)
def qgemm(A, a_scale, a_zero_point, B, b_scale, b_zero_point, C=None, y_scale=None, y_zero_point=None, *,
          alpha, transA, transB, node, xp):
    a = shifted(A, a_zero_point.reshape(()), xp)
    if transA:
        a = xp.transpose(a)
    # A per-column zero point of B runs along B's rows when B is stored transposed.
    b_zp = _column_param(b_zero_point)
    b = shifted(B, b_zp.reshape(-1, 1) if transB and b_zp.ndim == 1 else b_zp, xp)
    if transB:
        b = xp.transpose(b)
    acc = int_matmul(a, b, xp)
    if C is not None:
        acc = acc + C.astype(numpy.int32)
    # onnxruntime's output scale per column: b_scale * (a_scale * alpha), divided by y_scale.
    scale = _column_param(b_scale).astype(F32) * (a_scale.reshape(()).astype(F32) * F32(alpha))
    if y_scale is None:
        return acc.astype(F32) * scale
    scale = scale / y_scale.reshape(()).astype(F32)
    if y_zero_point is not None:
        dtype = numpy.dtype(y_zero_point.dtype)
        zp = y_zero_point.reshape(())
    else:
        dtype = numpy.dtype(node.output_dtypes[0]) if node.output_dtypes else numpy.dtype(numpy.uint8)
        zp = None
    return _requantize(acc, scale, zp, dtype, xp)


def _matmul_to_float(a, b, a_scale, b_scale, a_zero_point, b_zero_point, bias, xp):
    """(A - a_zp) @ (B - b_zp) as int32, times a_scale * b_scale (per column), plus bias."""
    a_zp = None if a_zero_point is None else a_zero_point.reshape(())
    b_zp = None if b_zero_point is None else _column_param(b_zero_point)
    acc = int_matmul(shifted(a, a_zp, xp), shifted(b, b_zp, xp), xp)
    out_dtype = numpy.dtype(a_scale.dtype)
    scale = a_scale.reshape(()).astype(F32) * _column_param(b_scale).astype(F32)
    y = acc.astype(F32) * scale
    if bias is not None:
        y = y + bias.astype(F32)
    return y.astype(out_dtype)


@kernel("MatMulIntegerToFloat", since=1, domain=MS, output_shapes=_matmul_rule(None))
def matmul_integer_to_float(A, B, a_scale, b_scale, a_zero_point=None, b_zero_point=None, bias=None, *, xp):
    return _matmul_to_float(A, B, a_scale, b_scale, a_zero_point, b_zero_point, bias, xp)


@kernel("DynamicQuantizeMatMul", since=1, domain=MS, output_shapes=_matmul_rule(F32))
def dynamic_quantize_matmul(A, B, b_scale, b_zero_point=None, bias=None, *, xp):
    # A is quantized to uint8 over the whole tensor, as DynamicQuantizeLinear does.
    a, a_scale, a_zero_point = dynamic_quantize_linear(A, xp=xp)
    return _matmul_to_float(a, B, a_scale, b_scale, a_zero_point, b_zero_point, bias, xp)


@kernel("MatMulInteger16", since=1, domain=MS, output_shapes=_matmul_rule(numpy.int32))
def matmul_integer16(A, B, *, xp):
    return int_matmul(A, B, xp)


@kernel("QLinearConv", since=1, domain=MS, output_shapes=_conv_rule)
def ms_qlinear_conv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B=None, *,
                    auto_pad, dilations, group, kernel_shape, pads, strides, channels_last=0, xp):
    y = qlinear_conv(
        _to_channels_first(x, channels_last, xp), x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale,
        y_zero_point, B, auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape,
        pads=pads, strides=strides, xp=xp,
    )  # fmt: skip
    return _from_channels_first(y, channels_last, xp)


# -- recurrent ----------------------------------------------------------------------------------
def _dynamic_quantize(x, per_row, xp):
    """DynamicQuantizeLinear over the whole matrix, or over each row (scales and zero points [M, 1])."""
    if not per_row:
        return dynamic_quantize_linear(x, xp=xp)
    x = x.astype(F32)
    x_min = xp.minimum(xp.min(x, axis=-1, keepdims=True), 0)
    x_max = xp.maximum(xp.max(x, axis=-1, keepdims=True), 0)
    scale = (x_max - x_min) / F32(255)
    safe = xp.where(scale == 0, F32(1), scale)
    zero_point = xp.clip(xp.round(-x_min / safe), 0, 255)
    q = xp.clip(xp.round(x / safe) + zero_point, 0, 255)
    return q.astype(numpy.uint8), scale, zero_point.astype(numpy.uint8)


@kernel("DynamicQuantizeLSTM", since=1, domain=MS, output_shapes=_lstm_rule)
def dynamic_quantize_lstm(
    X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, W_scale=None, W_zero_point=None,
    R_scale=None, R_zero_point=None, *, activation_alpha, activation_beta, activations, clip, direction,
    hidden_size, input_forget, xp,
):  # fmt: skip
    """The LSTM of rnn.py with each weight product done as onnxruntime does: the left operand
    quantized to uint8 as DynamicQuantizeLinear does, multiplied by the int8/uint8 weights in int32,
    scaled back by both scales. X is quantized once over all time steps; the hidden state at each
    step row by row (onnxruntime runs the recurrence per batch entry)."""
    # W is [D, input, 4H] and R [D, H, 4H], the transposes of LSTM's; scales and zero points [D] or [D, 4H].

    def quantized_product(weights, scale, zero_point, per_row):
        def product(x, d):
            rows = x.reshape(-1, x.shape[-1])
            xq, x_scale, x_zero_point = _dynamic_quantize(rows, per_row, xp)
            acc = int_matmul(shifted(xq, x_zero_point, xp), shifted(weights[d], zero_point[d], xp), xp)
            y = acc.astype(F32) * (x_scale * scale[d].astype(F32))
            return y.reshape(tuple(x.shape[:-1]) + (weights.shape[-1],))

        return product

    attrs = dict(
        hidden_size=hidden_size, direction=direction, layout=0, activations=activations,
        activation_alpha=activation_alpha, activation_beta=activation_beta, clip=clip,
    )  # fmt: skip
    # rnn.py reads shapes from W and R in LSTM's layout; the products use the quantized originals.
    return rnn.lstm_with_matmul(
        X, xp.swapaxes(W, 1, 2), xp.swapaxes(R, 1, 2), B, sequence_lens, initial_h, initial_c, P,
        input_forget=input_forget, attrs=attrs, xp=xp,
        input_matmul=quantized_product(W, W_scale, W_zero_point, per_row=False),
        recurrent_matmul=quantized_product(R, R_scale, R_zero_point, per_row=True),
    )  # fmt: skip


# -- transformer blocks -------------------------------------------------------------------------
def _attention_bias(mask_index, batch, q_len, total, unidirectional, fill, xp):
    """onnxruntime's additive attention mask, (batch or 1, 1, q_len or 1, total): ``fill`` where a key
    is masked by mask_index (1-D end positions, 1-D end and start positions, or a 2-D/3-D 0/1 mask)
    and again where it lies in the future of a unidirectional query."""
    keys = xp.arange(total).reshape(1, 1, 1, total)
    bias = None
    if mask_index is not None:
        m = mask_index.astype(numpy.int32)
        if m.ndim == 1 and m.shape[0] == 2 * batch:
            end, start = m[:batch].reshape(-1, 1, 1, 1), m[batch:].reshape(-1, 1, 1, 1)
            masked = (keys >= end) | (keys < start)
        elif m.ndim == 1:
            masked = keys >= m.reshape(-1, 1, 1, 1)
        elif m.ndim == 2:
            masked = (m == 0).reshape(batch, 1, 1, total)
        elif m.ndim == 3:
            masked = (m == 0).reshape(batch, 1, q_len, total)
        else:
            # (batch, 1, max_sequence_length, max_sequence_length): the top-left corner applies.
            masked = (m[:, :, total - q_len : total, :total] == 0)
        bias = xp.where(masked, F32(fill), F32(0))
    if unidirectional:
        queries = xp.arange(q_len).reshape(1, 1, q_len, 1) + (total - q_len)
        future = xp.where(keys > queries, F32(fill), F32(0))
        bias = future if bias is None else bias + future
    return bias


def _heads(t, num_heads, xp):
    batch, length, width = t.shape
    return xp.transpose(t.reshape(batch, length, num_heads, width // num_heads), (0, 2, 1, 3))


@kernel("QAttention", since=1, domain=MS, output_shapes=_qattention_rule)
def qattention(
    input, weight, bias, input_scale, weight_scale, mask_index=None, input_zero_point=None, weight_zero_point=None,
    past=None, *, num_heads, unidirectional=0, scale=None, mask_filter_value=None, do_rotary=None,
    past_present_share_buffer=None, num_outputs=1, node, xp,
):  # fmt: skip
    if do_rotary:
        raise UnsupportedAttributeError("do_rotary=1 is not implemented for QAttention", node=node.name,
                                        op_type=node.op_type, opset=node.opset)
    # Q, K and V in one product: the dequantized input times the dequantized packed weights, plus bias.
    qkv = _matmul_to_float(input, weight, input_scale, weight_scale, input_zero_point, weight_zero_point, bias, xp)
    hidden = qkv.shape[-1] // 3
    q, k, v = (_heads(qkv[..., i * hidden : (i + 1) * hidden], num_heads, xp) for i in range(3))
    if past is not None:
        k = xp.concatenate([past[0].astype(k.dtype), k], axis=2)
        v = xp.concatenate([past[1].astype(v.dtype), v], axis=2)
    batch, _, q_len, head_size = q.shape
    total = k.shape[2]
    factor = F32(scale) if scale else F32(1.0 / math.sqrt(head_size))
    scores = xp.matmul(q * factor, xp.swapaxes(k, -1, -2))
    fill = -10000.0 if mask_filter_value is None else mask_filter_value
    mask = _attention_bias(mask_index, batch, q_len, total, unidirectional, fill, xp)
    if mask is not None:
        scores = scores + mask
    scores = scores - xp.max(scores, axis=-1, keepdims=True)
    e = xp.exp(scores)
    probs = e / xp.sum(e, axis=-1, keepdims=True)
    out = xp.matmul(probs, v)
    out = xp.transpose(out, (0, 2, 1, 3)).reshape(batch, q_len, hidden)
    if num_outputs > 1:
        return out, xp.stack([k, v])
    return out


@kernel("QEmbedLayerNormalization", since=1, domain=MS, output_shapes=_qembed_rule)
def qembed_layer_normalization(
    input_ids, segment_ids, word_embedding_quant, position_embedding_quant, segment_embedding, gamma_quant,
    beta_quant, mask, word_embedding_scale, position_embedding_scale, segment_embedding_scale, gamma_scale,
    beta_scale, word_embedding_zero_point, position_embedding_zero_point, segment_embedding_zero_point,
    gamma_zero_point, beta_zero_point, *, epsilon, xp,
):  # fmt: skip
    # onnxruntime dequantizes every table, then runs the float32 EmbedLayerNormalization.
    def table(q, scale, zero_point):
        return _dequantize(q, scale, zero_point, xp)

    seq = input_ids.shape[1]
    x = xp.take(table(word_embedding_quant, word_embedding_scale, word_embedding_zero_point),
                input_ids.astype(numpy.int32), axis=0)
    x = x + table(position_embedding_quant, position_embedding_scale, position_embedding_zero_point)[:seq]
    if segment_ids is not None:
        segments = table(segment_embedding, segment_embedding_scale, segment_embedding_zero_point)
        x = x + xp.take(segments, segment_ids.astype(numpy.int32), axis=0)
    mean = xp.mean(x, axis=-1, keepdims=True)
    centered = x - mean
    var = xp.mean(centered * centered, axis=-1, keepdims=True)
    gamma = table(gamma_quant, gamma_scale, gamma_zero_point)
    beta = table(beta_quant, beta_scale, beta_zero_point)
    y = centered / xp.sqrt(var + F32(epsilon)) * gamma + beta
    # The mask index is each row's count of ones (zeros when no mask is given).
    if mask is None:
        mask_index = xp.zeros((input_ids.shape[0],), dtype=numpy.int32)
    else:
        mask_index = xp.sum((mask == 1).astype(numpy.int32), axis=1).astype(numpy.int32)
    return y, mask_index

