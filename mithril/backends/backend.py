"""The backend tensor API, shared by every backend over its array namespace ``xp``."""

from __future__ import annotations

import contextlib
import contextlib
from typing import Any

import numpy as np

from ..dtypes import DType, as_dtype, float32


class Backend:
    """Base of every backend: the same tensor API everywhere, over an array namespace.

    Subclasses set ``name`` and ``xp`` and may override the conversions.
    """

    name = "base"
    xp: Any = np
    supports_gradients = False

    def __init__(self, dtype: DType = float32, device: str = "cpu"):
        self.dtype = as_dtype(dtype)
        self.device = device
        self.set_seed(0)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dtype={self.dtype!r}, device={self.device!r})"

    # -- dtypes and conversion -------------------------------------------------------
    def backend_dtype(self, dtype: DType | None):
        return (as_dtype(dtype) if dtype is not None else self.dtype).numpy

    def array(self, data, dtype: DType | None = None):
        if dtype is None and isinstance(data, np.ndarray):
            return self.from_numpy(data)
        if dtype is None:
            arr = np.asarray(data)
            dtype = self.dtype if np.issubdtype(arr.dtype, np.floating) else as_dtype(arr.dtype)
        return self.from_numpy(np.asarray(data, dtype=self.backend_dtype(dtype)))

    def from_numpy(self, arr: np.ndarray):
        return self.xp.asarray(arr)

    def to_numpy(self, arr) -> np.ndarray:
        return np.asarray(arr)

    def dtype_of(self, value) -> np.dtype | None:
        """The NumPy dtype of a backend (or NumPy) array, None when it has none (sequences)."""
        dt = getattr(value, "dtype", None)
        if dt is None:
            return None
        try:
            return np.dtype(dt)
        except TypeError:
            return None

    def prepare_inputs(self, values: dict) -> dict:
        """Params or data as the generated program takes them (a facade backend wraps natives here)."""
        return values

    def finalize_outputs(self, outputs: dict) -> dict:
        """Program outputs as users get them (native arrays of the framework)."""
        return outputs

    def constant(self, value: np.ndarray):
        """An initializer constant that kernels read as a tensor (not as a static input), in the
        array type the program computes on; called once per constant at compile. The default keeps
        the NumPy array (NumPy itself; JAX, whose jit embeds constants in the program)."""
        return value

    # -- compilation hooks: a backend overrides what its framework offers -------------
    def scope(self):
        """The context each evaluation runs in (JAX: x64 and the device; NumPy: a BLAS thread cap)."""
        return contextlib.nullcontext()

    def unsupported_dtype_reason(self, dtype) -> str | None:
        """Why this backend cannot hold ``dtype`` (a NumPy dtype), or None when it can."""
        return None

    def jit(self, forward):
        """Compile the whole generated ``forward(params, data)`` as one program (identity here)."""
        return forward

    def lower_backward(self, graph, opsets: dict[str, int], *, diff_names: list[str], **lowering):
        """Called by ``compile`` (unless ``inference=True``) with the specialized graph and the names
        to differentiate: a backend without autodiff builds its gradient program here, so a missing
        rule fails at compile time. What it returns reaches :meth:`vjp` as ``forward``; None (the
        default) leaves ``forward`` as the generated forward function, for autodiff to trace."""
        return None

    def vjp(self, forward, params: dict, data: dict, diff_params: list[str], diff_data: list[str],
            output_gradients: dict) -> tuple[dict, dict]:
        """Outputs of ``forward`` and the gradients of ``diff_params`` and ``diff_data`` given the
        cotangents ``output_gradients`` (outputs not named get zero cotangents)."""
        from ..errors import MithrilError

        raise MithrilError(f"{type(self).__name__} does not compute gradients")

    # -- creation --------------------------------------------------------------------
    def set_seed(self, seed: int) -> None:
        self.seed = seed
        self.rng = np.random.default_rng(seed)

    def zeros(self, *shape, dtype: DType | None = None):
        return self.from_numpy(np.zeros(_shape(shape), dtype=self.backend_dtype(dtype)))

    def ones(self, *shape, dtype: DType | None = None):
        return self.from_numpy(np.ones(_shape(shape), dtype=self.backend_dtype(dtype)))

    def randn(self, *shape, dtype: DType | None = None):
        return self.from_numpy(self.rng.standard_normal(_shape(shape)).astype(self.backend_dtype(dtype)))

    def rand(self, *shape, dtype: DType | None = None):
        return self.from_numpy(self.rng.random(_shape(shape)).astype(self.backend_dtype(dtype)))

    def arange(self, *args, dtype: DType | None = None):
        if dtype is None:
            dtype = self.dtype if any(isinstance(a, float) for a in args) else as_dtype(np.int64)
        return self.from_numpy(np.arange(*args).astype(self.backend_dtype(dtype)))

    def zeros_like(self, x, dtype: DType | None = None):
        n = self.to_numpy(x)
        return self.from_numpy(np.zeros(n.shape, dtype=n.dtype if dtype is None else self.backend_dtype(dtype)))

    def ones_like(self, x, dtype: DType | None = None):
        n = self.to_numpy(x)
        return self.from_numpy(np.ones(n.shape, dtype=n.dtype if dtype is None else self.backend_dtype(dtype)))

    # -- arithmetic ------------------------------------------------------------------
    def add(self, a, b):
        return a + b

    def subtract(self, a, b):
        return a - b

    def multiply(self, a, b):
        return a * b

    def divide(self, a, b):
        return a / b

    def matmul(self, a, b):
        return self.xp.matmul(a, b)

    def relu(self, x):
        return self.xp.maximum(x, 0)

    def sigmoid(self, x):
        return 1 / (1 + self.xp.exp(-x))

    def tanh(self, x):
        return self.xp.tanh(x)

    def sum(self, x, axis=None, keepdim: bool = False):
        return self.xp.sum(x, axis=axis, keepdims=keepdim)

    def mean(self, x, axis=None, keepdim: bool = False):
        return self.xp.mean(x, axis=axis, keepdims=keepdim)

    def max(self, x, axis=None, keepdim: bool = False):
        return self.xp.max(x, axis=axis, keepdims=keepdim)

    def reshape(self, x, shape):
        return self.xp.reshape(x, tuple(shape))

    def transpose(self, x, axes=None):
        return self.xp.transpose(x, axes)

    def concat(self, arrays, axis: int = 0):
        return self.xp.concatenate(list(arrays), axis=axis)


def _shape(shape) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        return tuple(shape[0])
    return tuple(shape)
