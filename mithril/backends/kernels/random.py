"""Random kernels: RandomNormal/Uniform(+Like), Bernoulli, Multinomial, Dropout.

Samples are drawn on the host with NumPy (the lowering's ``rng``), then brought into ``xp``.
A ``seed`` attribute replaces ``rng`` with a fresh ``numpy.random.RandomState(seed)`` on every
call, so a seeded node gives the same values run after run. The legacy MT19937 stream is the
one ONNX's own reference data is generated with (``np.random.seed(seed)``), which makes seeded
Dropout reproduce the suite's expected masks.
"""

from __future__ import annotations

import numpy as np

from ...dtypes import np_dtype_of_onnx
from ..registry import kernel


def _source(seed, rng):
    """The sampler for a node: seeded and reproducible when ``seed`` is set, else ``rng``."""
    if seed is None:
        return rng if rng is not None else np.random.default_rng()
    seed = float(seed)
    # Float seeds: whole values keep their integer meaning, others use their bit pattern.
    value = int(seed) if seed.is_integer() else int(np.float64(seed).view(np.uint64))
    return np.random.RandomState(value % 2**32)


def _out_dtype(dtype, like=None):
    if dtype is None:
        return like.dtype if like is not None else np.dtype(np.float32)
    return np_dtype_of_onnx(dtype)


@kernel("RandomNormal", since=1, nondeterministic=True)
def random_normal(*, dtype, mean, scale, seed, shape, rng, xp):
    sample = _source(seed, rng).normal(mean, scale, tuple(int(d) for d in shape))
    return xp.asarray(sample.astype(_out_dtype(dtype)))


@kernel("RandomUniform", since=1, nondeterministic=True)
def random_uniform(*, dtype, high, low, seed, shape, rng, xp):
    sample = _source(seed, rng).uniform(low, high, tuple(int(d) for d in shape))
    return xp.asarray(sample.astype(_out_dtype(dtype)))


@kernel("RandomNormalLike", since=1, nondeterministic=True)
def random_normal_like(input, *, dtype, mean, scale, seed, rng, xp):
    sample = _source(seed, rng).normal(mean, scale, tuple(input.shape))
    return xp.asarray(sample.astype(_out_dtype(dtype, input)))


@kernel("RandomUniformLike", since=1, nondeterministic=True)
def random_uniform_like(input, *, dtype, high, low, seed, rng, xp):
    sample = _source(seed, rng).uniform(low, high, tuple(input.shape))
    return xp.asarray(sample.astype(_out_dtype(dtype, input)))


@kernel("Bernoulli", since=15, nondeterministic=True)
def bernoulli(input, *, dtype, seed, rng, xp):
    u = xp.asarray(_source(seed, rng).uniform(0.0, 1.0, tuple(input.shape)))
    return (u < input).astype(_out_dtype(dtype, input))


@kernel("Multinomial", since=7, nondeterministic=True)
def multinomial(input, *, dtype, sample_size, seed, rng, xp):
    # input: [batch, classes] unnormalized log-probabilities -> [batch, sample_size] class ids.
    logits = input.astype(np.float64) if input.dtype != np.float64 else input
    probs = xp.exp(logits - xp.max(logits, axis=-1, keepdims=True))
    cdf = xp.cumsum(probs, axis=-1)
    cdf = cdf / cdf[:, -1:]
    u = xp.asarray(_source(seed, rng).uniform(0.0, 1.0, (input.shape[0], sample_size)))
    # Index of the first class whose cumulative probability exceeds u.
    idx = xp.sum(u[:, :, None] >= cdf[:, None, :], axis=-1)
    return xp.minimum(idx, input.shape[1] - 1).astype(_out_dtype(dtype))


def _dropout(data, ratio, seed, rng, xp):
    keep = xp.asarray(_source(seed, rng).uniform(0.0, 1.0, tuple(data.shape))) >= ratio
    scale = xp.asarray(1.0 / (1.0 - ratio), dtype=data.dtype)
    return data * keep.astype(data.dtype) * scale, keep


@kernel("Dropout", since=1, nondeterministic=True)
def dropout_1(data, *, ratio, is_test, consumed_inputs=None, rng, xp):
    if is_test:
        return data, xp.ones(data.shape, dtype=data.dtype)
    out, keep = _dropout(data, ratio, None, rng, xp)
    return out, keep.astype(data.dtype)


@kernel("Dropout", since=7, nondeterministic=True)
def dropout_7(data, *, ratio, xp):
    # Opsets 7-11 have no training mode: Dropout is the identity and the mask all ones.
    return data, xp.ones(data.shape, dtype=data.dtype)


@kernel("Dropout", since=10, nondeterministic=True)
def dropout_10(data, *, ratio, xp):
    return data, xp.ones(data.shape, dtype=bool)


@kernel("Dropout", since=12, nondeterministic=True, static_inputs=(2,))
def dropout_12(data, ratio=None, training_mode=None, *, seed, rng, xp):
    if training_mode is None or not bool(training_mode):
        return data, xp.ones(data.shape, dtype=bool)
    return _dropout(data, 0.5 if ratio is None else ratio, seed, rng, xp)
