"""The GGML backend's arrays are NumPy arrays: NumPy's helpers."""

from ..numpy.arrays import jit, sqrt, to_numpy, update_scope, zeros_like  # noqa: F401
