"""Elementwise kernels: unary math, binary arithmetic and logic, comparisons, variadic
Sum/Mean/Max/Min, Where, Clip, Cast/CastLike/BitCast and activations.

float16 and bfloat16 inputs of transcendental and compound ops are computed in float32 and
cast back; single correctly rounded ops (Add, Mul, Div, ...) run in the input dtype.
"""

from __future__ import annotations

import functools
import math

import ml_dtypes
import numpy as np

from ...dtypes import is_floating_np, np_dtype_of_onnx
from ..registry import kernel

_HALF = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
_FLOAT8 = tuple(
    np.dtype(t)
    for t in (
        ml_dtypes.float8_e4m3fn,
        ml_dtypes.float8_e4m3fnuz,
        ml_dtypes.float8_e5m2,
        ml_dtypes.float8_e5m2fnuz,
    )
)
_E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
# ml_dtypes keeps sub-byte types one per byte, in the low bits.
_SUB_BYTE_BITS = {
    np.dtype(ml_dtypes.int4): 4,
    np.dtype(ml_dtypes.uint4): 4,
    np.dtype(ml_dtypes.float4_e2m1fn): 4,
    np.dtype(ml_dtypes.int2): 2,
    np.dtype(ml_dtypes.uint2): 2,
}
_STRING = np.dtype(object)


def in_float32(fn, x, *others, xp):
    """``fn(x, *others)`` computed in float32 when x is float16/bfloat16, returned in x's dtype."""
    if x.dtype in _HALF:
        return fn(x.astype(xp.float32), *(o.astype(xp.float32) for o in others)).astype(x.dtype)
    return fn(x, *others)


def _is_int(dtype) -> bool:
    return np.dtype(dtype).kind in "iu" or np.dtype(dtype) in (
        np.dtype(ml_dtypes.int4),
        np.dtype(ml_dtypes.uint4),
        np.dtype(ml_dtypes.int2),
        np.dtype(ml_dtypes.uint2),
    )


def _is_ml_dtype(dtype) -> bool:
    # bfloat16, float8/float4, int4/int2...: numpy sees them as kind "V" or "f", so ask the module.
    return np.dtype(dtype).type.__module__ == "ml_dtypes"


def _widen(x, xp):
    """Narrow ml_dtypes floats (float8, float4, e8m0) to float32, so numpy ufuncs apply."""
    return x.astype(xp.float32) if _is_ml_dtype(x.dtype) and is_floating_np(x.dtype) else x


# ---------------------------------------------------------------- unary math


@kernel("Abs", since=6)
def abs_(x, *, xp):
    return xp.abs(x)


@kernel("Neg", since=6)
def neg(x, *, xp):
    return xp.negative(x)


@kernel("Reciprocal", since=6)
def reciprocal(x, *, xp):
    return in_float32(lambda v: 1 / v, x, xp=xp)


@kernel("Sqrt", since=6)
def sqrt(x, *, xp):
    return in_float32(xp.sqrt, x, xp=xp)


@kernel("Exp", since=6)
def exp(x, *, xp):
    return in_float32(xp.exp, x, xp=xp)


@kernel("Log", since=6)
def log(x, *, xp):
    return in_float32(xp.log, x, xp=xp)


@kernel("Sin", since=7)
def sin(x, *, xp):
    return in_float32(xp.sin, x, xp=xp)


@kernel("Cos", since=7)
def cos(x, *, xp):
    return in_float32(xp.cos, x, xp=xp)


@kernel("Tan", since=7)
def tan(x, *, xp):
    return in_float32(xp.tan, x, xp=xp)


@kernel("Asin", since=7)
def asin(x, *, xp):
    return in_float32(xp.arcsin, x, xp=xp)


@kernel("Acos", since=7)
def acos(x, *, xp):
    return in_float32(xp.arccos, x, xp=xp)


@kernel("Atan", since=7)
def atan(x, *, xp):
    return in_float32(xp.arctan, x, xp=xp)


@kernel("Sinh", since=9)
def sinh(x, *, xp):
    return in_float32(xp.sinh, x, xp=xp)


@kernel("Cosh", since=9)
def cosh(x, *, xp):
    return in_float32(xp.cosh, x, xp=xp)


@kernel("Asinh", since=9)
def asinh(x, *, xp):
    return in_float32(xp.arcsinh, x, xp=xp)


@kernel("Acosh", since=9)
def acosh(x, *, xp):
    return in_float32(xp.arccosh, x, xp=xp)


@kernel("Atanh", since=9)
def atanh(x, *, xp):
    return in_float32(xp.arctanh, x, xp=xp)


@kernel("Ceil", since=6)
def ceil(x, *, xp):
    return xp.ceil(x)


@kernel("Floor", since=6)
def floor(x, *, xp):
    return xp.floor(x)


@kernel("Round", since=11)
def round_(x, *, xp):
    # numpy's round is half-to-even, as ONNX requires.
    return xp.round(x)


@kernel("Sign", since=9)
def sign(x, *, xp):
    return xp.sign(x)


# erf(x) / x as a polynomial in x^2 on |x| <= 2.5, lowest power first: a degree-18 least-squares
# fit on Chebyshev nodes against 50-digit erf (mpmath); max error of erf 6e-15.
_ERF_NEAR = (
    1.1283791670955101, -0.37612638903171425, 0.11283791670790354, -0.026866170635238086,
    0.005223977592092699, -0.0008548326311962265, 0.00012055322642366229, -1.492554292181818e-05,
    1.6461289092430622e-06, -1.6361048472188351e-07, 1.4785764952064115e-08, -1.2216192125335832e-09,
    9.221105981026086e-11, -6.283176589101853e-12, 3.752022331594937e-13, -1.8624840872817096e-14,
    7.070930837664845e-16, -1.7888841836283602e-17, 2.2232564744893975e-19,
)


def _erf_parts(a, xp):
    """For a >= 0: erf(a) where a <= 2.5, erfc(a) where a > 2.5, and that mask (numpy has no erf).

    Near: the polynomial above; far: the continued fraction of erfc, evaluated backwards
    (30 levels give float64 precision at 2.5, 10 float32). Computed in float64, as 1 - erf
    cancels near 2.5.
    """
    fraction_depth = 30 if a.dtype == xp.float64 else 10
    a = a.astype(xp.float64)
    near = a <= 2.5
    s = xp.minimum(a, 2.5)
    s2 = s * s
    p = xp.full_like(s2, _ERF_NEAR[-1])
    for c in _ERF_NEAR[-2::-1]:
        p = p * s2 + c
    erf_near = s * p
    b = xp.maximum(a, 2.5)
    t = b
    for k in range(fraction_depth, 0, -1):
        t = b + (k / 2) / t
    erfc_far = xp.exp(-b * b) / (math.sqrt(math.pi) * t)
    return erf_near, erfc_far, near


def _erf(x, xp):
    erf_near, erfc_far, near = _erf_parts(xp.abs(x), xp)
    return (xp.sign(x) * xp.where(near, erf_near, 1 - erfc_far)).astype(x.dtype)


def erfc(x, xp):
    """1 - erf(x), computed apart from 1 - erf so the far tail keeps its relative precision (Gelu of
    large -x)."""
    erf_near, erfc_far, near = _erf_parts(xp.abs(x), xp)
    tail = xp.where(near, 1 - erf_near, erfc_far)
    return xp.where(x >= 0, tail, 2 - tail).astype(x.dtype)


@kernel("Erf", since=9)
def erf(x, *, xp):
    if _is_int(x.dtype):
        return _erf(x.astype(xp.float64), xp).astype(x.dtype)
    return in_float32(lambda v: _erf(v, xp), x, xp=xp)


@kernel("IsInf", since=10)
def isinf(x, *, detect_negative, detect_positive, xp):
    x = _widen(x, xp)
    inf = xp.isinf(x)
    if not detect_positive:
        inf = inf & (x < 0)
    if not detect_negative:
        inf = inf & (x > 0)
    return inf


@kernel("IsNaN", since=9)
def isnan(x, *, xp):
    return xp.isnan(_widen(x, xp))


@kernel("Not", since=1)
def not_(x, *, xp):
    return xp.logical_not(x)


@kernel("BitwiseNot", since=18)
def bitwise_not(x, *, xp):
    return xp.invert(x)


# ---------------------------------------------------------------- binary arithmetic


@kernel("Add", since=7)
def add(a, b, *, xp):
    return xp.add(a, b)


@kernel("Sub", since=7)
def sub(a, b, *, xp):
    return xp.subtract(a, b)


@kernel("Mul", since=7)
def mul(a, b, *, xp):
    return xp.multiply(a, b)


@kernel("Div", since=7)
def div(a, b, *, xp):
    if not _is_int(a.dtype):
        return xp.divide(a, b)
    # Integer division truncates toward zero (C semantics), floor_divide rounds down.
    q = xp.floor_divide(a, b)
    if a.dtype.kind == "u":
        return q
    inexact = (xp.remainder(a, b) != 0) & ((a < 0) != (b < 0))
    return xp.where(inexact, q + 1, q)


@kernel("Mod", since=10)
def mod(a, b, *, fmod, xp):
    # fmod=0: sign of the divisor (Python %); fmod=1: sign of the dividend (C fmod).
    fn = xp.fmod if fmod else xp.remainder
    return in_float32(fn, a, b, xp=xp)


def _int_pow(x, y, xp):
    y = y.astype(x.dtype) if y.dtype != x.dtype else y
    if x.dtype.kind == "u" or y.dtype.kind == "u":
        return xp.power(x, y)
    # Negative exponents: x**-n truncated toward zero is 0 except for x = 1 and x = -1.
    negative = y < 0
    positive_part = xp.power(x, xp.where(negative, 0, y))
    odd = (y % 2) != 0
    negative_part = xp.where(x == 1, 1, xp.where(x == -1, xp.where(odd, -1, 1), 0)).astype(x.dtype)
    return xp.where(negative, negative_part, positive_part)


@kernel("Pow", since=7)
def pow_(x, y, *, xp):
    # The result keeps the base's dtype, whatever the exponent's type.
    if _is_int(x.dtype):
        if _is_int(y.dtype):
            return _int_pow(x, y, xp)
        return xp.power(x.astype(xp.float64), y.astype(xp.float64)).astype(x.dtype)
    if y.dtype == x.dtype:
        return in_float32(xp.power, x, y, xp=xp)
    wide = xp.float64
    return xp.power(x.astype(wide), y.astype(wide)).astype(x.dtype)


# Versions 1 and 6 (Pow: 1) predate numpy broadcasting: B broadcasts onto A only with
# broadcast=1, its dims aligned with A's from `axis` (a suffix of A's shape when unset).


def _legacy_operand(a, b, broadcast, axis, xp):
    if not broadcast:
        if a.shape != b.shape:
            raise ValueError(f"shapes {a.shape} and {b.shape} differ and broadcast=0")
        return b
    if axis is None or b.ndim == 0:
        return b
    axis = axis + a.ndim if axis < 0 else axis
    return xp.reshape(b, b.shape + (1,) * (a.ndim - axis - b.ndim))


@kernel("Add", since=1)
def add_legacy(a, b, *, broadcast, axis, consumed_inputs=None, xp):
    return add(a, _legacy_operand(a, b, broadcast, axis, xp), xp=xp)


@kernel("Sub", since=1)
def sub_legacy(a, b, *, broadcast, axis, consumed_inputs=None, xp):
    return sub(a, _legacy_operand(a, b, broadcast, axis, xp), xp=xp)


@kernel("Mul", since=1)
def mul_legacy(a, b, *, broadcast, axis, consumed_inputs=None, xp):
    return mul(a, _legacy_operand(a, b, broadcast, axis, xp), xp=xp)


@kernel("Div", since=1)
def div_legacy(a, b, *, broadcast, axis, consumed_inputs=None, xp):
    return div(a, _legacy_operand(a, b, broadcast, axis, xp), xp=xp)


@kernel("Pow", since=1)
def pow_legacy(x, y, *, broadcast, axis, xp):
    return pow_(x, _legacy_operand(x, y, broadcast, axis, xp), xp=xp)


@kernel("BitShift", since=11)
def bitshift(x, y, *, direction, xp):
    bits = x.dtype.itemsize * 8
    # Shifts by a negative amount or by >= the width leave only the sign fill (ONNX opset 28).
    valid = (y >= 0) & (y < bits)
    amount = xp.where(valid, y, 0).astype(x.dtype)
    if direction == "LEFT":
        return xp.where(valid, xp.left_shift(x, amount), xp.zeros((), x.dtype))
    if direction == "RIGHT":
        fill = xp.where(x < 0, -1, 0).astype(x.dtype) if x.dtype.kind == "i" else xp.zeros((), x.dtype)
        return xp.where(valid, xp.right_shift(x, amount), fill)
    raise ValueError(f"BitShift direction must be 'LEFT' or 'RIGHT', got {direction!r}")


@kernel("And", since=7)
def and_(a, b, *, xp):
    return xp.logical_and(a, b)


@kernel("Or", since=7)
def or_(a, b, *, xp):
    return xp.logical_or(a, b)


@kernel("Xor", since=7)
def xor(a, b, *, xp):
    return xp.logical_xor(a, b)


@kernel("BitwiseAnd", since=18)
def bitwise_and(a, b, *, xp):
    return xp.bitwise_and(a, b)


@kernel("BitwiseOr", since=18)
def bitwise_or(a, b, *, xp):
    return xp.bitwise_or(a, b)


@kernel("BitwiseXor", since=18)
def bitwise_xor(a, b, *, xp):
    return xp.bitwise_xor(a, b)


# ---------------------------------------------------------------- comparisons


@kernel("Equal", since=7)
def equal(a, b, *, xp):
    return xp.equal(a, b)


@kernel("Less", since=7)
def less(a, b, *, xp):
    return xp.less(a, b)


@kernel("Greater", since=7)
def greater(a, b, *, xp):
    return xp.greater(a, b)


@kernel("LessOrEqual", since=12)
def less_or_equal(a, b, *, xp):
    return xp.less_equal(a, b)


@kernel("GreaterOrEqual", since=12)
def greater_or_equal(a, b, *, xp):
    return xp.greater_equal(a, b)


# ---------------------------------------------------------------- variadic, Where, Clip


@kernel("Sum", since=6)
def sum_(*inputs, xp):
    return functools.reduce(xp.add, inputs)


@kernel("Mean", since=6)
def mean(*inputs, xp):
    return in_float32(lambda *vs: functools.reduce(xp.add, vs) / len(vs), *inputs, xp=xp)


@kernel("Max", since=6)
def max_(*inputs, xp):
    # maximum propagates NaN, as ONNX expects.
    return functools.reduce(xp.maximum, inputs)


@kernel("Min", since=6)
def min_(*inputs, xp):
    return functools.reduce(xp.minimum, inputs)


@kernel("Where", since=9)
def where(condition, x, y, *, xp):
    return xp.where(condition, x, y)


@kernel("Clip", since=6)
def clip_attrs(x, *, min, max, xp):  # noqa: A002 - ONNX attribute names
    # In float32 for float16, where the default bounds (+-FLT_MAX) would overflow.
    return in_float32(lambda v: xp.minimum(xp.maximum(v, min), max), x, xp=xp)


@kernel("Clip", since=11)
def clip(x, low=None, high=None, *, xp):
    # clip is min(max(x, low), high): min > max gives max everywhere, as ONNX specifies.
    if low is None and high is None:
        return x
    if x.dtype.kind == "V":  # bfloat16: NumPy's clip has no bfloat16 loop (it returns float32)
        y = x if low is None else xp.maximum(x, low.astype(x.dtype))
        return y if high is None else xp.minimum(y, high.astype(x.dtype))
    low = None if low is None else low.astype(x.dtype)
    high = None if high is None else high.astype(x.dtype)
    return xp.clip(x, low, high)


# ---------------------------------------------------------------- casts


def _format_strings(x):
    # numpy-only: Python string formatting per element; ONNX spells the specials INF, -INF, NaN.
    specials = {"inf": "INF", "-inf": "-INF", "nan": "NaN", "-nan": "NaN"}
    x = np.asarray(x)
    text = [specials.get(s, s) for s in (str(v) for v in x.reshape(-1))]
    return np.array(text, dtype=object).reshape(x.shape)


def _parse_number(text: str, integer: bool):
    text = text.strip()
    lowered = text.lower()
    if lowered in ("true", "false"):
        return int(lowered == "true")
    if integer:
        try:
            return int(text)
        except ValueError:
            return int(float(text))
    # float() accepts INF, +INF, -inf, NaN in any case and scientific notation.
    return float(text)


def _parse_strings(x, dst):
    # numpy-only: strings are object arrays parsed element by element.
    integer = _is_int(dst)
    values = [_parse_number(str(s), integer) for s in np.asarray(x).reshape(-1)]
    parsed_dtype = dst if dst.kind in "iu" else (np.int64 if integer else np.float64)
    return np.array(values, dtype=parsed_dtype).reshape(np.shape(x))


def _to_e8m0(x, *, saturate, round_mode, xp):
    """Cast to float8e8m0 (a bare power of two, 2**-127 .. 2**127)."""
    a = xp.abs(x)
    mantissa, exponent = xp.frexp(a)  # a = mantissa * 2**exponent, mantissa in [0.5, 1)
    if round_mode == "up":
        e = xp.where(mantissa > 0.5, exponent, exponent - 1)
    elif round_mode == "down":
        e = exponent - 1
    elif round_mode == "nearest":
        e = xp.where(mantissa >= 0.75, exponent, exponent - 1)
    else:
        raise ValueError(f"Cast round_mode must be 'up', 'down' or 'nearest', got {round_mode!r}")
    if saturate:
        e = xp.where(xp.isinf(a), 127, xp.where(a == 0, -127, xp.clip(e, -127, 127)))
        nan = xp.isnan(a)
    else:
        nan = xp.isnan(a) | xp.isinf(a) | (a == 0) | (e < -127) | (e > 127)
        e = xp.clip(e, -127, 127)
    # float64: 2**-127 is subnormal in float32, which XLA flushes to zero.
    value = xp.ldexp(xp.ones(e.shape, xp.float64), e.astype(xp.int32))
    return xp.where(nan, xp.nan, value).astype(_E8M0)


def _saturate_float8(y, x, dst, xp):
    # Out-of-range values became Inf (e5m2) or NaN (the others): clamp them to +-max instead.
    overflow = xp.isinf(y.astype(xp.float32)) | (xp.isnan(y.astype(xp.float32)) & ~xp.isnan(x))
    limit = float(ml_dtypes.finfo(dst).max)
    return xp.where(overflow, xp.where(x > 0, limit, -limit).astype(dst), y)


def _cast(x, dst, *, saturate, round_mode, xp):
    x = xp.asarray(x)
    if dst == _STRING:
        return _format_strings(x)
    if x.dtype == _STRING:
        x = _parse_strings(x, dst)
    if x.dtype == dst:
        return x
    if _is_ml_dtype(x.dtype):
        # ml_dtypes types convert exactly to float32 / int64 and from there to anything.
        x = x.astype(xp.float32 if is_floating_np(x.dtype) else xp.int64)
    if dst == np.dtype(bool):
        return x != 0
    if not _is_ml_dtype(dst):
        return x.astype(dst)
    if _is_int(dst):
        # Truncate, then wrap like any narrowing integer cast.
        return x.astype(xp.int64).astype(dst)
    if x.dtype.kind in "biu":
        x = x.astype(xp.float64)
    elif x.dtype == np.float16:
        x = x.astype(xp.float32)
    if dst == _E8M0:
        return _to_e8m0(x, saturate=saturate, round_mode=round_mode, xp=xp)
    y = x.astype(dst)
    if saturate and dst in _FLOAT8:
        y = _saturate_float8(y, x, dst, xp)
    return y


@kernel("Cast", since=6)
def cast(x, *, to, saturate=1, round_mode="up", xp):
    return _cast(x, np_dtype_of_onnx(to), saturate=saturate, round_mode=round_mode, xp=xp)


@kernel("CastLike", since=15)
def cast_like(x, target_type, *, saturate=1, round_mode="up", xp):
    return _cast(x, target_type.dtype, saturate=saturate, round_mode=round_mode, xp=xp)


def _bits(dtype) -> int:
    return _SUB_BYTE_BITS.get(np.dtype(dtype), np.dtype(dtype).itemsize * 8)


@kernel("BitCast", since=26, host_only=True, emit_required=True)
def bitcast(x, *, to):
    # numpy-only: reinterpreting bytes is ndarray.view.
    dst = np_dtype_of_onnx(to)
    x = np.asarray(x)
    if _bits(x.dtype) != _bits(dst):
        raise ValueError(f"BitCast needs equal bit widths, got {x.dtype} ({_bits(x.dtype)}) -> {dst} ({_bits(dst)})")
    if dst == np.dtype(bool):
        return x.view(np.uint8) != 0
    if dst in _SUB_BYTE_BITS:
        return (x.view(np.uint8) & ((1 << _bits(dst)) - 1)).view(dst)
    return x.view(dst)


# ---------------------------------------------------------------- activations


@kernel("Relu", since=6)
def relu(x, *, xp):
    return xp.maximum(x, xp.zeros((), x.dtype))


@kernel("LeakyRelu", since=6)
def leaky_relu(x, *, alpha, xp):
    return in_float32(lambda v: xp.where(v >= 0, v, alpha * v), x, xp=xp)


@kernel("PRelu", since=1)
def prelu_legacy(x, slope, *, consumed_inputs=None, xp):
    # Versions 1 and 6 predate numpy broadcasting: a [C] slope is per channel (axis 1).
    if slope.ndim == 1 and x.ndim > 2 and slope.shape[0] == x.shape[1]:
        slope = xp.reshape(slope, slope.shape + (1,) * (x.ndim - 2))
    return prelu(x, slope, xp=xp)


@kernel("PRelu", since=7)
def prelu(x, slope, *, xp):
    return in_float32(lambda v, s: xp.where(v < 0, s * v, v), x, slope.astype(x.dtype), xp=xp)


def _elu(v, alpha, xp):
    return xp.where(v > 0, v, alpha * xp.expm1(xp.minimum(v, 0)))


@kernel("Elu", since=6)
def elu(x, *, alpha, xp):
    return in_float32(lambda v: _elu(v, alpha, xp), x, xp=xp)


@kernel("Selu", since=6)
def selu(x, *, alpha, gamma, xp):
    return in_float32(lambda v: gamma * _elu(v, alpha, xp), x, xp=xp)


@kernel("Celu", since=12)
def celu(x, *, alpha, xp):
    return in_float32(lambda v: xp.maximum(v, 0) + xp.minimum(0, alpha * xp.expm1(xp.minimum(v, 0) / alpha)), x, xp=xp)


@kernel("Gelu", since=20)
def gelu(x, *, approximate, xp):
    if approximate == "tanh":
        # 0.5 * (1 + tanh(u)) == sigmoid(2u), which does not cancel for large negative v.
        k = 2 * math.sqrt(2 / math.pi)
        fn = lambda v: v * _sigmoid(k * (v + 0.044715 * v**3), xp)  # noqa: E731
    elif approximate == "none":
        # 0.5 * (1 + erf(v / sqrt2)) == 0.5 * erfc(-v / sqrt2), likewise.
        fn = lambda v: 0.5 * v * erfc(-v / math.sqrt(2), xp)  # noqa: E731
    else:
        raise ValueError(f"Gelu approximate must be 'none' or 'tanh', got {approximate!r}")
    return in_float32(fn, x, xp=xp)


@kernel("HardSigmoid", since=6)
def hard_sigmoid(x, *, alpha, beta, xp):
    return in_float32(lambda v: xp.clip(alpha * v + beta, 0, 1), x, xp=xp)


@kernel("HardSwish", since=14)
def hard_swish(x, *, xp):
    return in_float32(lambda v: v * xp.clip(v / 6 + 0.5, 0, 1), x, xp=xp)


def _sigmoid(v, xp):
    # exp of -|v| only, so nothing overflows.
    e = xp.exp(-xp.abs(v))
    return xp.where(v >= 0, 1 / (1 + e), e / (1 + e))


def _softplus(v, xp):
    return xp.maximum(v, 0) + xp.log1p(xp.exp(-xp.abs(v)))


@kernel("Sigmoid", since=6)
def sigmoid(x, *, xp):
    return in_float32(lambda v: _sigmoid(v, xp), x, xp=xp)


@kernel("Softplus", since=1)
def softplus(x, *, xp):
    return in_float32(lambda v: _softplus(v, xp), x, xp=xp)


@kernel("Softsign", since=1)
def softsign(x, *, xp):
    return in_float32(lambda v: v / (1 + xp.abs(v)), x, xp=xp)


@kernel("Tanh", since=6)
def tanh(x, *, xp):
    return in_float32(xp.tanh, x, xp=xp)


@kernel("ThresholdedRelu", since=10)
def thresholded_relu(x, *, alpha, xp):
    return in_float32(lambda v: xp.where(v > alpha, v, 0), x, xp=xp)


@kernel("Mish", since=18)
def mish(x, *, xp):
    return in_float32(lambda v: v * xp.tanh(_softplus(v, xp)), x, xp=xp)


@kernel("Shrink", since=9)
def shrink(x, *, bias, lambd, xp):
    # Shrink accepts integer tensors too: compute in float, return x's dtype.
    def fn(v):
        return xp.where(v < -lambd, v + bias, xp.where(v > lambd, v - bias, 0)).astype(v.dtype)

    return in_float32(fn, x, xp=xp)


@kernel("Swish", since=24)
def swish(x, *, alpha, xp):
    return in_float32(lambda v: v * _sigmoid(alpha * v, xp), x, xp=xp)
