"""Gradients of reductions and of Softmax/LogSoftmax."""

from __future__ import annotations

import math

import numpy

from ..kernels.reduce import host_ints, normalize_axes
from .rules import vjp_rule


def _axes(x, axes, noop_with_empty_axes=0):
    if not axes:
        return () if noop_with_empty_axes else tuple(range(x.ndim))
    return normalize_axes(axes, x.ndim)


def _kept(t, x, axes):
    """A reduced value (or its gradient) with the reduced axes back as size 1."""
    return t.reshape(tuple(1 if i in axes else d for i, d in enumerate(x.shape)))


def _sum_grad(g, x, y, axes):
    return numpy.broadcast_to(_kept(g, x, axes), x.shape)


def _mean_grad(g, x, y, axes):
    count = math.prod(x.shape[a] for a in axes)
    return numpy.broadcast_to(_kept(g, x, axes) / numpy.asarray(max(count, 1), g.dtype), x.shape)


def _extremum_grad(g, x, y, axes):
    # Ties share the gradient equally, as in JAX and torch.amax.
    hits = x == _kept(y, x, axes)
    count = numpy.sum(hits, axis=axes, keepdims=True)
    return numpy.where(hits, _kept(g, x, axes) / count, 0).astype(g.dtype)


def _sum_square_grad(g, x, y, axes):
    return 2 * x * _kept(g, x, axes)


def _l2_grad(g, x, y, axes):
    yk = _kept(y, x, axes)
    with numpy.errstate(divide="ignore", invalid="ignore"):
        return numpy.where(yk > 0, x / yk, 0).astype(g.dtype) * _kept(g, x, axes)


def _log_sum_exp_grad(g, x, y, axes):
    return numpy.exp(x - _kept(y, x, axes)) * _kept(g, x, axes)


def _register(op_type, grad, axes_input_since):
    @vjp_rule(op_type, since=1)
    def reduce_attribute_vjp(g, data, *, axes, keepdims, y):
        return (grad(g, data, y, _axes(data, axes or ())).astype(data.dtype),)

    @vjp_rule(op_type, since=axes_input_since)
    def reduce_input_vjp(g, data, axes=None, *, keepdims, noop_with_empty_axes, y, needs):
        axes = _axes(data, () if axes is None else host_ints(axes), noop_with_empty_axes)
        return grad(g, data, y, axes).astype(data.dtype), None

    reduce_attribute_vjp.__name__ = f"{op_type}_attr_vjp"
    reduce_input_vjp.__name__ = f"{op_type}_input_vjp"


_register("ReduceSum", _sum_grad, 13)
_register("ReduceMean", _mean_grad, 18)
_register("ReduceMax", _extremum_grad, 18)
_register("ReduceMin", _extremum_grad, 18)
_register("ReduceSumSquare", _sum_square_grad, 18)
_register("ReduceL2", _l2_grad, 18)
_register("ReduceLogSumExp", _log_sum_exp_grad, 18)


# ---------------------------------------------------------------------------------------------
# Softmax / LogSoftmax: from 13 along one axis; before, over the axes from `axis` on (2-D coerced).


def _coerced(x, axis):
    axis = axis + x.ndim if axis < 0 else axis
    return (math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


@vjp_rule("Softmax", since=13)
def softmax_vjp(g, x, *, axis, y):
    return (y * (g - numpy.sum(g * y, axis=axis, keepdims=True)),)


@vjp_rule("Softmax", since=1)
def softmax_2d_vjp(g, x, *, axis, y):
    shape = _coerced(x, axis)
    return (softmax_vjp(g.reshape(shape), None, axis=1, y=y.reshape(shape))[0].reshape(x.shape),)


@vjp_rule("LogSoftmax", since=13)
def log_softmax_vjp(g, x, *, axis, y):
    return (g - numpy.exp(y) * numpy.sum(g, axis=axis, keepdims=True),)


@vjp_rule("LogSoftmax", since=1)
def log_softmax_2d_vjp(g, x, *, axis, y):
    shape = _coerced(x, axis)
    return (log_softmax_vjp(g.reshape(shape), None, axis=1, y=y.reshape(shape))[0].reshape(x.shape),)
