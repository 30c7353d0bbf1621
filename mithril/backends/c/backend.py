"""The C backend: the lowering plan rendered as one C translation unit, built with the system C
compiler, run through ctypes on NumPy buffers without copying."""

from __future__ import annotations

import numpy as np

from ...errors import BackendOptionError, CompileError, MithrilError
from ..numpy.backend import NumpyBackend
from .program import CFallbackWarning, CKernelMissingError, CProgram


class CBackend(NumpyBackend):
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
    jit_by_default = False
    needs_static_shapes = True

    def __init__(self, dtype=None, device: str = "cpu", num_threads: int | None = None, *,
                 fallback: str | None = "numpy", device_mesh=None, **unknown):
        """``dtype``: ``ml.float32`` (default) or ``ml.float64``, the element type of the C code.
        ``num_threads``: OpenMP threads (None: OpenMP's default). ``fallback``: ``"numpy"`` runs
        nodes without a C kernel on NumPy; None refuses them at compile."""
        from ... import dtypes

        if fallback not in ("numpy", None):
            raise BackendOptionError(f"CBackend: fallback must be 'numpy' or None, got {fallback!r}")
        super().__init__(dtype if dtype is not None else dtypes.float32, device, num_threads,
                         device_mesh=device_mesh, **unknown)
        if self.dtype.numpy not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise BackendOptionError(f"CBackend computes in float32 or float64, not {self.dtype}")
        self.fallback = fallback

    def scope(self):
        import contextlib

        return contextlib.nullcontext()

    @property
    def _np_dtype(self) -> np.dtype:
        return self.dtype.numpy

    def lower(self, plan, *, file_path: str | None = None, gradient_checkpointing: bool = False):
        """The plan as C: every graph input's shape fixed (an error names those that are not),
        the nodes without a C kernel listed (warned, or refused with ``fallback=None``), the
        source built (or found in the cache) and loaded."""
        from .build import LazyLibrary, start_build
        from .render import render, why_not_c

        loose = [f"{v.name} {list(v.shape) if v.shape is not None else '(rank unknown)'}"
                 for v in plan.inputs if v.kind == "input" and v.static_shape is None
                 and v.dtype is not None and v.dtype.kind != "O"]  # maps, sequences, strings: NumPy's
        if loose:
            raise CompileError("CBackend needs every input shape fixed; give shapes= (and static_shapes=True) "
                               f"for: {', '.join(loose)}")
        dtype = self._np_dtype
        rendered = render(plan, dtype)
        if rendered.fallback:
            listed = ", ".join(f"{pn.label} ({pn.op_type}: {why_not_c(pn, dtype)})" for pn in rendered.fallback)
            if self.fallback is None:
                raise CKernelMissingError(f"CBackend(fallback=None): {len(rendered.fallback)} node(s) have no C kernel: "
                                   f"{listed}")
            from ..backend import warn_user

            warn_user(f"CBackend: {len(rendered.fallback)} node(s) run on NumPy (no C kernel): {listed}",
                      CFallbackWarning)
        # The compiler runs in the background: beside the gradient program's rendering and build
        # (lower_backward), the two compilers on two CPUs. ml.compile waits (wait_for_build).
        library = LazyLibrary(start_build(rendered.source))
        if file_path:
            with open(file_path, "w") as f:
                f.write(rendered.source)
        return CProgram(rendered.source, file_path or "<mithril-c>", rendered.steps, rendered.arena_bytes,
                        rendered.naive_bytes, rendered.fallback, library, self.num_threads, plan, rendered.failures)

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
