"""The C backend: the lowering plan rendered as one C translation unit, built with the system C
compiler, run through ctypes on NumPy buffers without copying."""

from __future__ import annotations

import numpy as np

from ...errors import BackendOptionError, MithrilError
from ..segmented import SegmentedBackend
from .program import CFallbackWarning, CKernelMissingError, CProgram


class CBackend(SegmentedBackend):
    """Runs models as generated C, built with the system C compiler (``CC``, default ``cc``).

    Every shape must be fixed at compile (``shapes=``, ``static_shapes=True``). Nodes without a
    C kernel run on NumPy between C segments, with one warning listing them
    (``fallback="numpy"``); ``fallback=None`` refuses them at compile. Arrays are NumPy arrays.

    >>> import mithril as ml
    >>> ml.CBackend().to_numpy(ml.CBackend().ones(2)).tolist()
    [1.0, 1.0]
    """

    name = "c"
    supports_gradients = True  # the gradient program rendered as C (grad.py)
    fallback_warning = CFallbackWarning
    missing_error = CKernelMissingError

    def __init__(self, dtype=None, device: str = "cpu", num_threads: int | None = None, *,
                 fallback: str | None = "numpy", device_mesh=None, **unknown):
        """``dtype``: ``ml.float32`` (default) or ``ml.float64``, the element type of the C code.
        ``num_threads``: OpenMP threads (None: OpenMP's default). ``fallback``: ``"numpy"`` runs
        nodes without a C kernel on NumPy; None refuses them at compile."""
        from ... import dtypes

        super().__init__(dtype if dtype is not None else dtypes.float32, device, num_threads, fallback=fallback,
                         device_mesh=device_mesh, **unknown)
        if self.dtype.numpy not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise BackendOptionError(f"CBackend computes in float32 or float64, not {self.dtype}")

    @property
    def _np_dtype(self) -> np.dtype:
        return self.dtype.numpy

    @classmethod
    def native_rules(cls):
        from .render import KERNELS  # with every op family registered

        return KERNELS

    def native_passes(self):
        """Half-float nodes run in float32 between Casts (:class:`.render.WidenHalfFloats`), weight
        transposes folded into their MatMuls (:class:`.render.FoldWeightTranspose`) and the Conv
        epilogue fusions (:class:`.render.FuseConvEpilogues`)."""
        from .render import FoldWeightTranspose, FuseConvEpilogues, WidenHalfFloats

        return [WidenHalfFloats(), FoldWeightTranspose(), FuseConvEpilogues()]

    def compile_segments(self, part, *, file_path: str | None = None):
        """The segments as one C file, built (or found in the cache) and loaded."""
        from .build import LazyLibrary, start_build
        from .render import render_steps

        rendered = render_steps(part.plan, part.steps, part.origin)
        # The compiler runs in the background: beside the gradient program's rendering and build
        # (lower_backward), the two compilers on two CPUs. ml.compile waits (wait_for_build).
        library = LazyLibrary(start_build(rendered.source))
        if file_path:
            with open(file_path, "w") as f:
                f.write(rendered.source)
        return CProgram(rendered.source, file_path or "<mithril-c>", rendered.steps, rendered.arena_bytes,
                        rendered.naive_bytes, rendered.fallback, library, self.num_threads, part.plan,
                        rendered.failures)

    def lower_clocked(self, plan):
        """The plan built again with per-node clocks (``MITHRIL_C_PROFILE=1``, a library of its
        own in the cache), its fallback nodes not warned about again."""
        import os
        import warnings

        before = os.environ.get("MITHRIL_C_PROFILE")
        os.environ["MITHRIL_C_PROFILE"] = "1"  # read by the C build
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", CFallbackWarning)  # compile already warned
                return self.lower(plan)
        finally:
            if before is None:
                del os.environ["MITHRIL_C_PROFILE"]
            else:
                os.environ["MITHRIL_C_PROFILE"] = before

    def wait_for_build(self, program) -> None:
        wait = getattr(program, "wait", None)  # a CProgram (an export renders only)
        if callable(wait):
            wait()

    def lower_backward(self, plan, *, diff_names, file_path=None, gradient_checkpointing: bool = False):
        """The gradient program in C (:mod:`.grad`): the forward nodes, then each node's backward
        as C kernel calls, cotangents in the arena too; backward rules without a C kernel run on
        NumPy's (warned once, refused with ``fallback=None``). Every forward value a rule reads
        is kept, so ``gradient_checkpointing`` recomputes nothing here."""
        from .grad import lower_gradients

        return lower_gradients(plan, diff_names, fallback=self.fallback, num_threads=self.num_threads,
                               file_path=file_path)

    def vjp(self, program, params, data, diff_params, diff_data, output_gradients):
        if program.backward is None:
            raise MithrilError("CBackend computes gradients with the program compile builds; "
                               "this model has none (compiled with inference=True?)")
        return program.backward.for_names(list(diff_params) + list(diff_data)).run(params, data, output_gradients)


__all__ = ["CBackend", "CFallbackWarning", "CKernelMissingError"]
