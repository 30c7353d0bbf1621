"""The NumPy backend: the reference lowering of ONNX graphs into NumPy calls."""

from __future__ import annotations

import numpy as np

from ..backend import Backend
from . import overrides as _numpy_overrides  # noqa: F401  (registers the NumPy overrides)


class NumpyBackend(Backend):
    """Runs lowered ONNX graphs with NumPy on the CPU.

    >>> import mithril as ml
    >>> b = ml.NumpyBackend(dtype=ml.float32)
    >>> b.to_numpy(b.add(b.ones(2), b.ones(2))).tolist()
    [2.0, 2.0]
    """

    name = "numpy"
    xp = np
    supports_gradients = True  # through the vector-Jacobian rules of mithril.backends.vjp

    jit_by_default = False  # nothing to jit: NumPy runs the generated program as it is

    def __init__(self, dtype=None, device: str = "cpu", num_threads: int | None = None, *, device_mesh=None,
                 **unknown):
        """``dtype``: the default dtype (an ``ml`` dtype, a name, or a NumPy dtype). ``device``:
        ``"cpu"`` (an accelerator name warns once and runs on the CPU). ``num_threads`` caps the
        BLAS threads while the program runs (like onnxruntime's intra_op_num_threads); None leaves
        the library default. On a machine whose cores are busy, a cap avoids BLAS threads stalling
        each other on small matmuls. ``device_mesh``: None or one device, ``(1,)``."""
        from ... import dtypes
        from ..options import check_device_mesh, cpu_device

        self._refuse_unknown_options(unknown)
        if num_threads is not None and (not isinstance(num_threads, int) or num_threads < 1):
            from ...errors import BackendOptionError

            raise BackendOptionError(f"NumpyBackend: num_threads must be a positive int or None, got {num_threads!r}")
        self.num_threads = num_threads
        self._threadpools = None
        self.device_mesh = check_device_mesh(self, device_mesh)
        super().__init__(dtype if dtype is not None else dtypes.float32, cpu_device(self, device))

    def from_numpy(self, arr):
        return np.asarray(arr)

    def set_num_threads(self, n: int) -> bool:
        """Caps the BLAS threads of the evaluations from now on at ``n`` (as ``num_threads=n``)."""
        if not isinstance(n, int) or n < 1:
            from ...errors import BackendOptionError

            raise BackendOptionError(f"{type(self).__name__}: num_threads must be a positive int, got {n!r}")
        self.num_threads = n
        return True

    def scope(self):
        if self.num_threads is None:
            return super().scope()
        if self._threadpools is None:
            from threadpoolctl import ThreadpoolController

            self._threadpools = ThreadpoolController()
        return self._threadpools.limit(limits=self.num_threads, user_api="blas")

    def plan_passes(self):
        from ..passes import InPlaceActivations
        from .inplace import SWAPS

        return [InPlaceActivations(SWAPS)]

    def lower_backward(self, plan, *, diff_names, file_path=None, gradient_checkpointing: bool = False):
        """The gradient program (forward kernels, then each node's vector-Jacobian rule from
        :mod:`mithril.backends.vjp`), built at compile: an op without a rule raises here. With
        ``gradient_checkpointing`` it keeps only the segments' boundary values from the forward
        and re-runs each segment's nodes before its rules (:mod:`mithril.backends.checkpoint`)."""
        from ..checkpoint import checkpoint_segments
        from ..vjp import lower_vjp

        segments = checkpoint_segments(plan) if gradient_checkpointing else None
        return lower_vjp(plan, diff_names=diff_names, namespace=self.program_namespace(), file_path=file_path,
                         checkpointing=segments)

    def vjp(self, program, params, data, diff_params, diff_data, output_gradients):
        if program.backward is None:
            from ...errors import MithrilError

            raise MithrilError("NumpyBackend computes gradients with the program compile builds; "
                               "this model has none (compiled with inference=True?)")
        gradients = program.backward.for_names(list(diff_params) + list(diff_data))
        try:
            outputs, grads = gradients.run(params, data, output_gradients)
        except Exception as exc:
            from ..runner import node_error

            err = node_error(gradients.program, exc)
            if err is exc:
                raise
            raise err from exc
        return outputs, grads

    def finalize_outputs(self, outputs: dict) -> dict:
        # Kernels return views (Expand, Reshape, Identity); callers get arrays they own, as from onnxruntime.
        return {k: v.copy() if isinstance(v, np.ndarray) and v.base is not None else v for k, v in outputs.items()}
