"""Torch's in-place activations (see :mod:`mithril.backends.passes.inplace` for when they run): a
plain tensor that autograd does not record and torch.compile does not trace is clamped where it
lies; anything else goes to the kernel the node resolved to (:mod:`.overrides`)."""

from __future__ import annotations

import torch

from . import overrides as _ov
from .xp import TorchArray


def _writable(x) -> torch.Tensor | None:
    """``x``'s tensor where it may be overwritten, else None."""
    if type(x) is not TorchArray:
        return None
    t = x.native
    if type(t) is not torch.Tensor or not t.dtype.is_floating_point or t.requires_grad or \
            torch.is_grad_enabled() or torch.compiler.is_compiling() or _ov.is_tracing():
        return None
    return t


def clip_into(x, low=None, high=None, *, xp):
    """ONNX Clip (opset 11+) written into ``x``."""
    t = _writable(x)
    if t is not None and (low is not None or high is not None):
        lo, hi = _ov.host_scalar(low, t.dtype), _ov.host_scalar(high, t.dtype)
        if lo is not False and hi is not False:
            return TorchArray(t.clamp_(lo, hi))
    return _ov.clip(x, low, high, xp=xp)


def relu_into(x):
    """ONNX Relu written into ``x``."""
    t = _writable(x)
    return TorchArray(t.relu_()) if t is not None else _ov.relu(x)


# (domain, op_type) -> (the kernel a node resolves to, the kernel that replaces it)
SWAPS = {("", "Clip"): (_ov.clip, clip_into), ("", "Relu"): (_ov.relu, relu_into)}

__all__ = ["SWAPS", "clip_into", "relu_into"]
