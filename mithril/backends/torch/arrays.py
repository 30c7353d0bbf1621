"""PyTorch's tensor helpers (see :mod:`mithril.backends.numpy.arrays`)."""

from __future__ import annotations

import contextlib

import ml_dtypes
import numpy as np
import torch

from ...errors import MeshError
from . import xp as _xp

sqrt = torch.sqrt
zeros_like = torch.zeros_like


def to_numpy(value) -> np.ndarray:
    """A NumPy copy of a tensor on any device (bfloat16 included); a DTensor's whole value
    (``full_tensor()``: every process of its mesh calls it)."""
    if _xp.DTENSOR is not None and isinstance(value, _xp.DTENSOR):
        value = value.full_tensor()
    if value.is_meta:
        raise MeshError(f"a meta tensor {tuple(value.shape)} {value.dtype} holds no values: on a pipeline it stands "
                        "for a parameter another process's stage holds; backend.gather(params, pm.sharding) "
                        "gives every parameter whole on every process")
    t = value.detach().cpu()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: go through float32, exactly
        return t.float().numpy().astype(ml_dtypes.bfloat16)
    return t.numpy()


def update_scope():
    """The context an optimizer update runs in (torch needs none of its own)."""
    return contextlib.nullcontext()


def jit(fn):
    """``fn`` as is: updates of torch tensors run eagerly."""
    return fn
