"""The NumPy backend: the reference lowering of ONNX graphs into NumPy calls."""

from __future__ import annotations

import numpy as np

from . import overrides  # noqa: F401
from .backend import Backend
from .overrides import numpy as _numpy_overrides  # noqa: F401  (registers the NumPy overrides)


class NumpyBackend(Backend):
    """Runs lowered ONNX graphs with NumPy on the CPU.

    >>> import mithril as ml
    >>> b = ml.NumpyBackend(dtype=ml.float32)
    >>> b.to_numpy(b.add(b.ones(2), b.ones(2))).tolist()
    [2.0, 2.0]
    """

    name = "numpy"
    xp = np

    def __init__(self, dtype=None, device: str = "cpu"):
        from .. import dtypes

        if device != "cpu":
            from ..errors import BackendUnavailableError

            raise BackendUnavailableError(f"NumpyBackend runs on 'cpu' only; got device {device!r}")
        super().__init__(dtype if dtype is not None else dtypes.float32, device)

    def from_numpy(self, arr):
        return np.asarray(arr)

    def finalize_outputs(self, outputs: dict) -> dict:
        # Kernels return views (Expand, Reshape, Identity); callers get arrays they own, as from onnxruntime.
        return {k: v.copy() if isinstance(v, np.ndarray) and v.base is not None else v for k, v in outputs.items()}
