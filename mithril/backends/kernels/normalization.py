"""Normalization kernels: BatchNormalization, Layer/RMS/Group/InstanceNormalization, LRN,
LpNormalization, MeanVarianceNormalization."""

from __future__ import annotations

import math

import numpy

from ...dtypes import np_dtype_of_onnx
from ..registry import kernel

_LOW_PRECISION = frozenset({"float16", "bfloat16"})


def compute_dtype(dtype):
    """The dtype statistics are computed in: float32 for float16 and bfloat16, else ``dtype``."""
    # float16/bfloat16 statistics lose too much precision; compute them in float32.
    return numpy.float32 if numpy.dtype(dtype).name in _LOW_PRECISION else dtype


def _stash_dtype(dtype, stash_type: int):
    # stash_type is the least precision of the statistics: float64 data is not narrowed to it
    # (onnxruntime and the ONNX reference compute a float64 LayerNormalization in float64).
    stash = np_dtype_of_onnx(stash_type)
    return dtype if numpy.dtype(dtype).itemsize > numpy.dtype(stash).itemsize else stash


def _per_channel(param, ndim: int, xp):
    """A [C] (or [C, D1, ...]) parameter shaped to broadcast against an [N, C, D1, ...] input."""
    return xp.reshape(param, param.shape + (1,) * (ndim - 1 - param.ndim))


def moments(x, axes, xp):
    """The mean and the (biased) variance of ``x`` over ``axes``, dims kept."""
    mean = xp.mean(x, axis=axes, keepdims=True)
    centered = x - mean
    return mean, xp.mean(centered * centered, axis=axes, keepdims=True)


# ---------------------------------------------------------------------------
# BatchNormalization


def _batch_norm_train(X, scale, B, mean, var, epsilon, momentum, axes, xp):
    """Normalizes X with its own batch statistics; returns Y, the updated running mean and
    variance, and the saved batch mean and inverse standard deviation (parameter-shaped)."""
    xf = X.astype(compute_dtype(X.dtype))
    batch_mean, batch_var = moments(xf, axes, xp)
    inv_std = 1 / xp.sqrt(batch_var + epsilon)
    y = (xf - batch_mean) * inv_std
    y = y * _per_channel(scale, X.ndim, xp) + _per_channel(B, X.ndim, xp)
    batch_mean = xp.reshape(batch_mean, mean.shape).astype(mean.dtype)
    batch_var = xp.reshape(batch_var, var.shape).astype(var.dtype)
    running_mean = mean * momentum + batch_mean * (1 - momentum)
    running_var = var * momentum + batch_var * (1 - momentum)
    # saved_var (versions 7, 9) is the inverse standard deviation, as in onnxruntime and cuDNN.
    saved_inv_std = xp.reshape(inv_std, var.shape).astype(var.dtype)
    running = (running_mean.astype(mean.dtype), running_var.astype(var.dtype))
    return (y.astype(X.dtype), *running, batch_mean, saved_inv_std)


def _batch_norm_infer(X, scale, B, mean, var, epsilon, xp):
    dtype = compute_dtype(X.dtype)
    shaped = [_per_channel(p, X.ndim, xp).astype(dtype) for p in (scale, B, mean, var)]
    s, b, m, v = shaped
    return ((X.astype(dtype) - m) / xp.sqrt(v + epsilon) * s + b).astype(X.dtype)


# Versions 1 and 6: training mode needs is_test=0 and the optional outputs asked for (as in
# onnxruntime); saved_var is the inverse standard deviation, as in versions 7 and 9.
@kernel("BatchNormalization", since=1)
def batch_normalization_v1(
    X, scale, B, mean, var, *, epsilon, momentum, is_test, spatial, consumed_inputs=None, num_outputs, xp
):
    if is_test or num_outputs == 1:
        return _batch_norm_infer(X, scale, B, mean, var, epsilon, xp)
    axes = (0,) + tuple(range(2, X.ndim)) if spatial else (0,)
    return _batch_norm_train(X, scale, B, mean, var, epsilon, momentum, axes, xp)


# Versions 7 and 9: training mode is implied by asking for the optional outputs. spatial=0
# (version 7 only) gives [C, D1, ...] parameters and statistics per activation.
@kernel("BatchNormalization", since=7)
def batch_normalization_legacy(X, scale, B, mean, var, *, epsilon, momentum, spatial=1, num_outputs, xp):
    if num_outputs == 1:
        return _batch_norm_infer(X, scale, B, mean, var, epsilon, xp)
    axes = (0,) + tuple(range(2, X.ndim)) if spatial else (0,)
    return _batch_norm_train(X, scale, B, mean, var, epsilon, momentum, axes, xp)


@kernel("BatchNormalization", since=14)
def batch_normalization(X, scale, B, input_mean, input_var, *, epsilon, momentum, training_mode, xp):
    if not training_mode:
        return _batch_norm_infer(X, scale, B, input_mean, input_var, epsilon, xp)
    axes = (0,) + tuple(range(2, X.ndim))
    return _batch_norm_train(X, scale, B, input_mean, input_var, epsilon, momentum, axes, xp)[:3]


# ---------------------------------------------------------------------------
# LayerNormalization / RMSNormalization: statistics over axes [axis, rank), in stash_type.


@kernel("LayerNormalization", since=17)
def layer_normalization(X, Scale, B=None, *, axis, epsilon, stash_type, xp):
    axis = axis + X.ndim if axis < 0 else axis
    axes = tuple(range(axis, X.ndim))
    xs = X.astype(_stash_dtype(X.dtype, stash_type))
    mean, var = moments(xs, axes, xp)
    inv_std_dev = 1 / xp.sqrt(var + epsilon)
    y = ((xs - mean) * inv_std_dev).astype(X.dtype) * Scale
    if B is not None:
        y = y + B
    if tuple(y.shape) != tuple(X.shape):  # Scale and B broadcast to the normalized dims, never widen X
        raise ValueError(f"Scale {tuple(Scale.shape)} and B {None if B is None else tuple(B.shape)} do not "
                         f"broadcast to the normalized dims {tuple(X.shape[axis:])}")
    return y, mean, inv_std_dev


@kernel("RMSNormalization", since=23)
def rms_normalization(X, scale, *, axis, epsilon, stash_type, xp):
    axis = axis + X.ndim if axis < 0 else axis
    xs = X.astype(_stash_dtype(X.dtype, stash_type))
    mean_square = xp.mean(xs * xs, axis=tuple(range(axis, X.ndim)), keepdims=True)
    return (xs / xp.sqrt(mean_square + epsilon)).astype(X.dtype) * scale


# ---------------------------------------------------------------------------
# GroupNormalization: version 18 has per-group scale/bias [G], version 21 per-channel [C].


def _group_normalized(X, num_groups, epsilon, dtype, xp):
    """X normalized within each group, as [N, G, C/G * D1 * ...] in `dtype`."""
    grouped = xp.reshape(X.astype(dtype), (X.shape[0], num_groups, -1))
    mean, var = moments(grouped, (2,), xp)
    return (grouped - mean) / xp.sqrt(var + epsilon)


@kernel("GroupNormalization", since=18)
def group_normalization_per_group(X, scale, bias, *, epsilon, num_groups, xp):
    normalized = _group_normalized(X, num_groups, epsilon, compute_dtype(X.dtype), xp)
    y = normalized * xp.reshape(scale, (1, -1, 1)) + xp.reshape(bias, (1, -1, 1))
    return xp.reshape(y, X.shape).astype(X.dtype)


@kernel("GroupNormalization", since=21)
def group_normalization(X, scale, bias, *, epsilon, num_groups, stash_type, xp):
    normalized = _group_normalized(X, num_groups, epsilon, _stash_dtype(X.dtype, stash_type), xp)
    normalized = xp.reshape(normalized, X.shape).astype(X.dtype)
    return normalized * _per_channel(scale, X.ndim, xp) + _per_channel(bias, X.ndim, xp)


# ---------------------------------------------------------------------------
# InstanceNormalization: statistics per (n, c) over the spatial axes.


@kernel("InstanceNormalization", since=6)
def instance_normalization(input, scale, B, *, epsilon, xp):  # noqa: A002 (ONNX input name)
    xf = input.astype(compute_dtype(input.dtype))
    mean, var = moments(xf, tuple(range(2, input.ndim)), xp)
    y = (xf - mean) / xp.sqrt(var + epsilon)
    y = y * _per_channel(scale, input.ndim, xp) + _per_channel(B, input.ndim, xp)
    return y.astype(input.dtype)


# ---------------------------------------------------------------------------
# LRN: square sum over channels [c - floor((size-1)/2), c + ceil((size-1)/2)].


@kernel("LRN", since=1)
def lrn(X, *, alpha, beta, bias, size, xp):
    xf = X.astype(compute_dtype(X.dtype))
    before, after = (size - 1) // 2, math.ceil((size - 1) / 2)
    padded = xp.pad(xf * xf, [(0, 0), (before, after)] + [(0, 0)] * (X.ndim - 2))
    channels = X.shape[1]
    square_sum = sum(padded[:, i : i + channels] for i in range(size))
    return (xf / (bias + alpha / size * square_sum) ** beta).astype(X.dtype)


# ---------------------------------------------------------------------------
# LpNormalization / MeanVarianceNormalization


@kernel("LpNormalization", since=1)
def lp_normalization(input, *, axis, p, xp):  # noqa: A002 (ONNX input name)
    if p == 1:
        norm = xp.sum(xp.abs(input), axis=axis, keepdims=True)
    else:
        norm = xp.sqrt(xp.sum(input * input, axis=axis, keepdims=True))
    # A zero vector stays zero instead of becoming 0/0.
    zero = norm == 0
    return xp.where(zero, xp.zeros_like(input), input / xp.where(zero, xp.ones_like(norm), norm))


@kernel("MeanVarianceNormalization", since=9)
def mean_variance_normalization(X, *, axes, xp):
    xf = X.astype(compute_dtype(X.dtype))
    mean, var = moments(xf, tuple(axes), xp)
    # The function body adds epsilon 1e-9 to the standard deviation, not to the variance.
    return ((xf - mean) / (xp.sqrt(var) + 1e-9)).astype(X.dtype)
