"""NumPy's array helpers, the fallback of :func:`mithril.backends.table.array_backend` (Python
scalars and anything no framework claims land here too).

Every backend folder's ``arrays.py`` has these five, over that framework's arrays.
"""

from __future__ import annotations

import contextlib

import numpy as np

sqrt = np.sqrt
zeros_like = np.zeros_like


def to_numpy(value) -> np.ndarray:
    """A NumPy array holding ``value``."""
    return np.asarray(value)


def update_scope():
    """The context an optimizer update runs in (NumPy needs none)."""
    return contextlib.nullcontext()


def jit(fn):
    """``fn`` compiled as one program; NumPy runs it as is."""
    return fn
