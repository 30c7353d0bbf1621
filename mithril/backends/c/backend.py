"""The C backend: the lowering plan rendered as one C translation unit, built with the system C
compiler, run through ctypes on NumPy buffers without copying."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import BackendOptionError, BackendOptionWarning, CompileError, MithrilError
from ..numpy.backend import NumpyBackend


class CFallbackWarning(BackendOptionWarning):
    """Nodes without a C kernel run on NumPy between the C segments (``fallback="numpy"``)."""


class CKernelMissingError(CompileError):
    """``CBackend(fallback=None)`` and nodes without a C kernel: all of them listed, with why."""


@dataclass
class CProgram:
    """A lowered C program: ``forward(params, data)`` runs the steps (C segments through the
    built library, the other nodes with the shared NumPy kernels). ``source`` is the C file."""

    source: str
    filename: str
    steps: list
    arena_bytes: int
    naive_bytes: int
    fallback: list
    library: Any
    num_threads: int | None
    plan: Any
    failures: list = field(default_factory=list)
    lines: dict = field(default_factory=dict)
    namespace: dict = field(default_factory=dict)
    _segments: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        from ..interpret import Interpreter

        self._interpreter = Interpreter(self.plan)
        self._arena = np.empty(max(self.arena_bytes, 1) + 64, dtype=np.uint8)
        base = self._arena.ctypes.data
        self._arena_ptr = ctypes.c_void_p(base + (-base) % 64)  # 64-byte aligned, as offsets are
        for step in self.steps:
            if hasattr(step, "nodes"):
                fn = getattr(self.library, f"seg{step.index}")
                fn.restype = ctypes.c_int
                fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
                self._segments[step.index] = fn
        # Constants the C segments read, as C-contiguous arrays of their dtype, kept alive here.
        # (np.ascontiguousarray would make a 0-d constant 1-d: np.require keeps the shape.)
        self._constants = {v: np.require(v.value, requirements="C") for v in self.plan.constants}

    @property
    def forward(self):
        return self.run

    def memory_report(self) -> dict[str, int]:
        """Arena bytes (intermediates of the C segments, lifetimes shared) and the naive sum."""
        return {"arena_bytes": self.arena_bytes, "naive_bytes": self.naive_bytes}

    def _read(self, v, env):
        if v.kind == "constant":
            return self._constants[v]
        return env[v]

    def run(self, params: dict, data: dict) -> dict:
        if self.num_threads is not None:
            self.library.mt_set_threads(self.num_threads)
        env: dict = {}
        for v in self.plan.inputs:
            env[v] = params[v.name] if v.kind == "param" else data[v.name]
        for v in self.plan.params:
            env.setdefault(v, params[v.name])
        for step in self.steps:
            if hasattr(step, "nodes"):
                self._run_segment(step, env)
            else:
                args = [None if v is None else self._read(v, env) for v in step.inputs]
                for o, r in zip(step.outputs, self._interpreter.run_node(step, args, env)):
                    env[o] = r
        return {v.name: self._read(v, env) for v in self.plan.outputs}

    def _run_segment(self, seg, env) -> None:
        buffers = []
        for v in seg.inputs:
            arr = self._read(v, env)
            if isinstance(arr, np.generic):
                arr = np.asarray(arr)  # NumPy kernels return 0-d results as scalars
            if isinstance(arr, np.ndarray) and arr.shape != v.static_shape and arr.size == max(
                    int(np.prod(v.static_shape)), 1) and arr.dtype == v.dtype:
                arr = arr.reshape(v.static_shape)  # a scalar given as [1] (or the reverse): same bytes
            if not isinstance(arr, np.ndarray) or arr.dtype != v.dtype or arr.shape != v.static_shape:
                got = f"{getattr(arr, 'dtype', type(arr).__name__)} {getattr(arr, 'shape', '')}"
                raise MithrilError(f"CBackend: {v.name!r} must be a {v.dtype} array of shape {v.static_shape} "
                                   f"(the shape it was compiled for), got {got}")
            if not arr.flags.c_contiguous:
                arr = np.require(arr, requirements="C")  # a NumPy fallback node's strided view
            buffers.append(arr)
        for v in seg.outputs:
            out = np.empty(v.static_shape, dtype=v.dtype)
            env[v] = out
            buffers.append(out)
        io = (ctypes.c_void_p * max(len(buffers), 1))(*[b.ctypes.data for b in buffers])
        status = self._segments[seg.index](io, self._arena_ptr)
        if status:
            from ...errors import NodeError

            pn, problem = self.failures[status - 1]
            ins = [v for v in pn.inputs if v is not None]
            raise NodeError(f"CBackend: {problem}", node=pn.label, op_type=pn.op_type, opset=pn.opset,
                            shapes=[v.static_shape for v in ins], dtypes=[str(v.dtype) for v in ins])


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
        from .build import build_library, load_library
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
        library = build_library(rendered.source)
        if file_path:
            with open(file_path, "w") as f:
                f.write(rendered.source)
        return CProgram(rendered.source, file_path or "<mithril-c>", rendered.steps, rendered.arena_bytes,
                        rendered.naive_bytes, rendered.fallback, load_library(library), self.num_threads, plan,
                        rendered.failures)

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
