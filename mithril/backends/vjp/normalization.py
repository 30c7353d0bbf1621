"""Gradients of BatchNormalization (inference and training forms) and LayerNormalization."""

from __future__ import annotations

import numpy

from ...dtypes import np_dtype_of_onnx
from ..kernels.normalization import compute_dtype
from .rules import vjp_rule


def _first(g):
    return g[0] if isinstance(g, tuple) else g


def _norm_backward(gxhat, xhat, inv_std, axes):
    """Input gradient of xhat = (x - mean(x)) * inv_std, statistics over ``axes``."""
    mean_g = numpy.mean(gxhat, axis=axes, keepdims=True)
    mean_gx = numpy.mean(gxhat * xhat, axis=axes, keepdims=True)
    return inv_std * (gxhat - mean_g - xhat * mean_gx)


def _channel(p, ndim):
    return p.reshape(p.shape + (1,) * (ndim - 1 - p.ndim))


# Versions 7, 9 and 14+: training when the node asks for the running statistics (7, 9) or
# sets training_mode (14). The cotangents of the running statistics are not propagated: they are
# buffers updated by assignment, not values a loss reads.
@vjp_rule("BatchNormalization", since=7)
@vjp_rule("BatchNormalization", since=14)
def batch_normalization_vjp(g, X, scale, B, mean, var, *, epsilon, momentum, spatial=1, training_mode=0,
                            num_outputs, opset, needs):
    gy = _first(g)
    training = bool(training_mode) if opset >= 14 else num_outputs > 1
    dtype = compute_dtype(X.dtype)
    axes = (0,) + tuple(range(2, X.ndim)) if spatial else (0,)
    x, gy = X.astype(dtype), gy.astype(dtype)
    s = _channel(scale, X.ndim).astype(dtype)
    if training:
        m = numpy.mean(x, axis=axes, keepdims=True)
        v = numpy.mean((x - m) ** 2, axis=axes, keepdims=True)
    else:
        m, v = _channel(mean, X.ndim).astype(dtype), _channel(var, X.ndim).astype(dtype)
    inv_std = 1 / numpy.sqrt(v + epsilon)
    xhat = (x - m) * inv_std
    gx = gs = gb = gm = gv = None
    if needs[0]:
        gx = (_norm_backward(gy * s, xhat, inv_std, axes) if training else gy * s * inv_std).astype(X.dtype)
    if needs[1]:
        gs = numpy.sum(gy * xhat, axis=axes).reshape(scale.shape).astype(scale.dtype)
    if needs[2]:
        gb = numpy.sum(gy, axis=axes).reshape(B.shape).astype(B.dtype)
    if needs[3]:
        gm = numpy.zeros_like(mean) if training else \
            numpy.sum(-gy * s * inv_std, axis=axes).reshape(mean.shape).astype(mean.dtype)
    if needs[4]:
        gv = numpy.zeros_like(var) if training else \
            numpy.sum(gy * s * xhat * (-0.5 * inv_std**2), axis=axes).reshape(var.shape).astype(var.dtype)
    return gx, gs, gb, gm, gv


# The cotangents of the optional Mean and InvStdDev outputs are not propagated (nothing
# differentiates through them in practice); Y's is.
@vjp_rule("LayerNormalization", since=17)
def layer_normalization_vjp(g, X, Scale, B=None, *, axis, epsilon, stash_type, needs):
    gy = _first(g)
    axis = axis + X.ndim if axis < 0 else axis
    axes = tuple(range(axis, X.ndim))
    dtype = np_dtype_of_onnx(stash_type)
    x = X.astype(dtype)
    m = numpy.mean(x, axis=axes, keepdims=True)
    inv_std = 1 / numpy.sqrt(numpy.mean((x - m) ** 2, axis=axes, keepdims=True) + epsilon)
    xhat = (x - m) * inv_std
    gy = gy.astype(dtype)
    lead = tuple(range(axis))
    gx = gs = gb = None
    if needs[0]:
        gx = _norm_backward(gy * Scale.astype(dtype), xhat, inv_std, axes).astype(X.dtype)
    if needs[1]:
        gs = _sum_to(gy * xhat, Scale.shape, lead).astype(Scale.dtype)
    if B is not None and needs[2]:
        gb = _sum_to(gy, B.shape, lead).astype(B.dtype)
    return gx, gs, gb


def _sum_to(g, shape, lead):
    from .elementwise import unbroadcast

    return unbroadcast(numpy.sum(g, axis=lead) if lead else g, shape)
