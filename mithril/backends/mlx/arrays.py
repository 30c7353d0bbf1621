"""MLX's array helpers (see :mod:`mithril.backends.numpy.arrays`)."""

from __future__ import annotations

import contextlib

import ml_dtypes
import mlx.core as mx
import numpy as np

sqrt = mx.sqrt
zeros_like = mx.zeros_like


def to_numpy(value) -> np.ndarray:
    """A NumPy copy of an mx.array (bfloat16 included)."""
    if value.dtype == mx.bfloat16:  # numpy has no bfloat16: go through float32, exactly
        return np.array(value.astype(mx.float32)).astype(ml_dtypes.bfloat16)
    return np.array(value)


def update_scope():
    """The context an optimizer update runs in (MLX needs none)."""
    return contextlib.nullcontext()


def jit(fn):
    """``fn`` as is: updates of mx.arrays run eagerly."""
    return fn
