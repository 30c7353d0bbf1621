"""NumPy's in-place activations (see :mod:`mithril.backends.passes.inplace` for when they run)."""

from __future__ import annotations

import numpy as np

from ..kernels import elementwise as _ew


def _writable(x) -> bool:
    return type(x) is np.ndarray and x.flags.writeable and x.dtype.kind == "f"


def clip_into(x, low=None, high=None, *, xp):
    """ONNX Clip (opset 11+) written into ``x``."""
    if not _writable(x) or (low is None and high is None):
        return _ew.clip(x, low, high, xp=xp)
    low = None if low is None else low.astype(x.dtype)
    high = None if high is None else high.astype(x.dtype)
    return np.clip(x, low, high, out=x)


def relu_into(x, *, xp):
    """ONNX Relu written into ``x``."""
    if not _writable(x):
        return _ew.relu(x, xp=xp)
    return np.maximum(x, x.dtype.type(0), out=x)


# (domain, op_type) -> (the kernel a node resolves to, the kernel that replaces it)
SWAPS = {("", "Clip"): (_ew.clip, clip_into), ("", "Relu"): (_ew.relu, relu_into)}

__all__ = ["SWAPS", "clip_into", "relu_into"]
