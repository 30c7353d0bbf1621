"""Reduction kernels: Reduce*, ArgMax/ArgMin, Softmax/LogSoftmax/Hardmax, CumSum/CumProd, TopK."""

from __future__ import annotations

import math

import numpy

from ..registry import kernel

_LOW_PRECISION = frozenset({"float16", "bfloat16"})


# ---------------------------------------------------------------------------
# Reduce*: one body per op over resolved axes; the attribute and input forms share it.


def host_ints(value) -> tuple[int, ...]:
    """A static (host) input such as axes or k, read on the host as Python ints."""
    return tuple(int(v) for v in numpy.asarray(value).reshape(-1))


def normalize_axes(axes, ndim: int) -> tuple[int, ...]:
    """``axes`` made non-negative for a tensor of rank ``ndim``, sorted, duplicates dropped."""
    return tuple(sorted({a + ndim if a < 0 else a for a in axes}))


def _reduced_shape(shape, axes, keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _accumulate_dtype(dtype):
    # float16/bfloat16 sums lose too much precision; accumulate in float32 like ORT does.
    return numpy.float32 if numpy.dtype(dtype).name in _LOW_PRECISION else dtype


def _float_dtype(dtype):
    return dtype if numpy.issubdtype(numpy.dtype(dtype), numpy.inexact) else numpy.float64


def _max_identity(dtype):
    dtype = numpy.dtype(dtype)
    if dtype == numpy.bool_:
        return False
    if numpy.issubdtype(dtype, numpy.integer):
        return numpy.iinfo(dtype).min
    return -numpy.inf


def _min_identity(dtype):
    dtype = numpy.dtype(dtype)
    if dtype == numpy.bool_:
        return True
    if numpy.issubdtype(dtype, numpy.integer):
        return numpy.iinfo(dtype).max
    return numpy.inf


def _nan_or_zero(dtype):
    # The mean of nothing is undefined; NaN where the dtype has it.
    return numpy.nan if numpy.issubdtype(numpy.dtype(dtype), numpy.inexact) else 0


def _sum(x, axes, keepdims, xp):
    acc = _accumulate_dtype(x.dtype)
    return xp.sum(x.astype(acc), axis=axes, keepdims=keepdims).astype(x.dtype)


def _mean(x, axes, keepdims, xp):
    acc = _float_dtype(_accumulate_dtype(x.dtype))
    return xp.mean(x.astype(acc), axis=axes, keepdims=keepdims).astype(x.dtype)


def _max(x, axes, keepdims, xp):
    return xp.max(x, axis=axes, keepdims=keepdims)


def _min(x, axes, keepdims, xp):
    return xp.min(x, axis=axes, keepdims=keepdims)


def _prod(x, axes, keepdims, xp):
    acc = _accumulate_dtype(x.dtype)
    return xp.prod(x.astype(acc), axis=axes, keepdims=keepdims).astype(x.dtype)


def _l1(x, axes, keepdims, xp):
    return _sum(xp.abs(x), axes, keepdims, xp)


def _l2(x, axes, keepdims, xp):
    acc = _float_dtype(_accumulate_dtype(x.dtype))
    xf = x.astype(acc)
    return xp.sqrt(xp.sum(xf * xf, axis=axes, keepdims=keepdims)).astype(x.dtype)


def _sum_square(x, axes, keepdims, xp):
    acc = _accumulate_dtype(x.dtype)
    xf = x.astype(acc)
    return xp.sum(xf * xf, axis=axes, keepdims=keepdims).astype(x.dtype)


def _log_sum(x, axes, keepdims, xp):
    acc = _float_dtype(_accumulate_dtype(x.dtype))
    return xp.log(xp.sum(x.astype(acc), axis=axes, keepdims=keepdims)).astype(x.dtype)


def _log_sum_exp(x, axes, keepdims, xp):
    xf = x.astype(_float_dtype(_accumulate_dtype(x.dtype)))
    m = xp.max(xf, axis=axes, keepdims=True)
    # Shift by the max for stability; an infinite max (all -inf, or +inf present) needs no shift.
    m = xp.where(xp.isfinite(m), m, xp.zeros_like(m))
    out = xp.log(xp.sum(xp.exp(xf - m), axis=axes, keepdims=True)) + m
    if not keepdims:
        out = xp.reshape(out, _reduced_shape(x.shape, axes, False))
    return out.astype(x.dtype)


def _reduce(body, empty_value, x, axes, keepdims, noop_with_empty_axes, xp):
    if not axes:
        # No axes: reduce everything, or with noop_with_empty_axes reduce nothing, which
        # still applies the op's elementwise part (ReduceSumSquare gives x*x, as its function body).
        axes = () if noop_with_empty_axes else tuple(range(x.ndim))
    axes = normalize_axes(axes, x.ndim)
    keepdims = keepdims == 1  # as onnxruntime: any other value (2, -1) drops the reduced axes
    if any(x.shape[a] == 0 for a in axes):
        # numpy raises on empty max/min; ONNX defines the identity of each reduction.
        value = empty_value(x.dtype) if callable(empty_value) else empty_value
        return xp.full(_reduced_shape(x.shape, axes, keepdims), value, dtype=x.dtype)
    return body(x, axes, keepdims, xp)


def _register_reduce(op_type, body, empty_value, axes_input_since):
    """ReduceX with an `axes` attribute (since 1; 11 allows negative axes) and with an
    `axes` input plus noop_with_empty_axes (since 13 for ReduceSum, 18 for the others)."""

    @kernel(op_type, since=1)
    def reduce_axes_attribute(data, *, axes, keepdims, xp):
        return _reduce(body, empty_value, data, axes or (), keepdims, 0, xp)

    @kernel(op_type, since=axes_input_since, static_inputs=(1,))
    def reduce_axes_input(data, axes=None, *, keepdims, noop_with_empty_axes, xp):
        axes = () if axes is None else host_ints(axes)
        return _reduce(body, empty_value, data, axes, keepdims, noop_with_empty_axes, xp)

    reduce_axes_attribute.__name__ = reduce_axes_attribute.__qualname__ = f"{op_type}_attr"
    reduce_axes_input.__name__ = reduce_axes_input.__qualname__ = f"{op_type}_input"


_register_reduce("ReduceSum", _sum, 0, 13)
_register_reduce("ReduceMean", _mean, _nan_or_zero, 18)
_register_reduce("ReduceMax", _max, _max_identity, 18)
_register_reduce("ReduceMin", _min, _min_identity, 18)
_register_reduce("ReduceProd", _prod, 1, 18)
_register_reduce("ReduceL1", _l1, 0, 18)
_register_reduce("ReduceL2", _l2, 0, 18)
_register_reduce("ReduceSumSquare", _sum_square, 0, 18)
_register_reduce("ReduceLogSum", _log_sum, _max_identity, 18)
_register_reduce("ReduceLogSumExp", _log_sum_exp, _max_identity, 18)


# ---------------------------------------------------------------------------
# ArgMax / ArgMin


def _arg_reduce(fn, x, axis, keepdims, select_last_index, xp):
    if x.ndim == 0:  # no axis to reduce: onnxruntime returns index 0 as a scalar, whatever keepdims says
        return xp.zeros((), dtype=xp.int64)
    axis = axis + x.ndim if axis < 0 else axis
    # NaN as onnxruntime scans: a NaN loses every comparison, so it wins only as the first element
    # (NumPy's argmin/argmax return the first NaN instead).
    floating = numpy.dtype(x.dtype).kind == "f" or numpy.dtype(x.dtype).name == "bfloat16"
    data = xp.where(xp.isnan(x), xp.asarray(math.inf if fn is xp.argmin else -math.inf, dtype=x.dtype), x) \
        if floating else x
    if select_last_index:
        idx = (x.shape[axis] - 1) - fn(xp.flip(data, axis=axis), axis=axis)
    else:
        idx = fn(data, axis=axis)
    if floating and x.shape[axis]:
        first = xp.isnan(xp.squeeze(x[(slice(None),) * axis + (slice(0, 1),)], axis=axis))
        idx = xp.where(first, xp.zeros_like(idx), idx)
    if keepdims == 1:  # as onnxruntime: any other value (2, -1) drops the axis
        idx = xp.expand_dims(idx, axis)
    return idx.astype(xp.int64)


# select_last_index arrives at 12; its default keeps versions 1 and 11 correct.
@kernel("ArgMax", since=1)
def arg_max(data, *, axis, keepdims, select_last_index=0, xp):
    return _arg_reduce(xp.argmax, data, axis, keepdims, select_last_index, xp)


@kernel("ArgMin", since=1)
def arg_min(data, *, axis, keepdims, select_last_index=0, xp):
    return _arg_reduce(xp.argmin, data, axis, keepdims, select_last_index, xp)


# ---------------------------------------------------------------------------
# Softmax family: before 13 the input is coerced to 2D [prod(shape[:axis]), prod(shape[axis:])].


def _softmax(x, axis, xp):
    e = xp.exp(x - xp.max(x, axis=axis, keepdims=True))
    return e / xp.sum(e, axis=axis, keepdims=True)


def _log_softmax(x, axis, xp):
    shifted = x - xp.max(x, axis=axis, keepdims=True)
    return shifted - xp.log(xp.sum(xp.exp(shifted), axis=axis, keepdims=True))


def _hardmax(x, axis, xp):
    # argmax picks the first maximum, as ONNX asks for ties.
    idx = xp.expand_dims(xp.argmax(x, axis=axis), axis)
    positions = xp.reshape(xp.arange(x.shape[axis]), [-1 if i == axis else 1 for i in range(x.ndim)])
    return (positions == idx).astype(x.dtype)


def _coerced_2d(fn, x, axis, xp):
    if x.ndim == 0:
        return fn(xp.reshape(x, (1, 1)), 1, xp).reshape(())
    axis = axis + x.ndim if axis < 0 else axis
    rows = math.prod(x.shape[:axis])
    flat = xp.reshape(x, (rows, math.prod(x.shape[axis:])))
    return xp.reshape(fn(flat, 1, xp), x.shape)


@kernel("Softmax", since=1)
def softmax_2d(x, *, axis, xp):
    return _coerced_2d(_softmax, x, axis, xp)


@kernel("Softmax", since=13)
def softmax(x, *, axis, xp):
    return _softmax(x, axis, xp)


@kernel("LogSoftmax", since=1)
def log_softmax_2d(x, *, axis, xp):
    return _coerced_2d(_log_softmax, x, axis, xp)


@kernel("LogSoftmax", since=13)
def log_softmax(x, *, axis, xp):
    return _log_softmax(x, axis, xp)


@kernel("Hardmax", since=1)
def hardmax_2d(x, *, axis, xp):
    return _coerced_2d(_hardmax, x, axis, xp)


@kernel("Hardmax", since=13)
def hardmax(x, *, axis, xp):
    axis = axis + x.ndim if axis < 0 else axis
    return _hardmax(x, axis, xp)


# ---------------------------------------------------------------------------
# CumSum / CumProd


def _along(axis: int, index) -> tuple:
    return (slice(None),) * axis + (index,)


def _cumulative(fn, identity, x, axis, exclusive, reverse, xp):
    (axis,) = host_ints(axis)
    axis = axis + x.ndim if axis < 0 else axis
    n = x.shape[axis]
    if n == 0:
        return x
    if reverse:
        x = xp.flip(x, axis=axis)
    y = fn(x, axis=axis, dtype=x.dtype)
    if exclusive:
        head = xp.full(x.shape[:axis] + (1,) + x.shape[axis + 1 :], identity, dtype=x.dtype)
        y = xp.concatenate([head, y[_along(axis, slice(0, n - 1))]], axis=axis)
    if reverse:
        y = xp.flip(y, axis=axis)
    return y


@kernel("CumSum", since=11, static_inputs=(1,))
def cum_sum(x, axis, *, exclusive, reverse, xp):
    return _cumulative(xp.cumsum, 0, x, axis, exclusive, reverse, xp)


@kernel("CumProd", since=26, static_inputs=(1,))
def cum_prod(x, axis, *, exclusive, reverse, xp):
    return _cumulative(xp.cumprod, 1, x, axis, exclusive, reverse, xp)


# ---------------------------------------------------------------------------
# TopK: equal values keep the lower index first, for largest and smallest alike.


def _top_k(x, k, axis, largest, xp):
    axis = axis + x.ndim if axis < 0 else axis
    n = x.shape[axis]
    if largest:
        # Stable ascending sort of the reversed axis, read backwards: descending values,
        # equal values in ascending original index. Negation would break unsigned ints.
        order = xp.flip(xp.argsort(xp.flip(x, axis=axis), axis=axis, stable=True), axis=axis)
        order = (n - 1) - order
    else:
        order = xp.argsort(x, axis=axis, stable=True)
    indices = order[_along(axis, slice(0, k))]
    return xp.take_along_axis(x, indices, axis=axis), indices.astype(xp.int64)


@kernel("TopK", since=1)
def top_k_attribute(X, *, axis, k, xp):
    return _top_k(X, k, axis, 1, xp)


# largest/sorted arrive at 11; their defaults keep TopK-10 correct. Unsorted output may be
# in any order, so sorted output serves both.
@kernel("TopK", since=10, static_inputs=(1,))
def top_k(X, K, *, axis, largest=1, sorted=1, xp):  # noqa: A002 (ONNX attribute name)
    (k,) = host_ints(K)
    return _top_k(X, k, axis, largest == 1, xp)  # as onnxruntime: only 1 means largest
