"""A compiled C program: its segments (through the built library) and the nodes NumPy runs
between them, on NumPy buffers passed without copies; and the errors and warning the C
backend raises. Kept apart from :mod:`.backend` so :mod:`.grad` builds on it without a cycle."""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import FallbackWarning, KernelMissingError, MithrilError
from ..segmented import SegmentedProgram
from ..segmented.threads import ThreadGovernor


class CFallbackWarning(FallbackWarning):
    """Nodes without a C kernel run on NumPy between the C segments (``fallback="numpy"``)."""


class CKernelMissingError(KernelMissingError):
    """``CBackend(fallback=None)`` and nodes without a C kernel: all of them listed, with why."""


@dataclass
class CProgram(SegmentedProgram):
    """A lowered C program: ``forward(params, data)`` runs the steps (C segments through the
    built library, the other nodes with the shared NumPy kernels). ``source`` is the C file."""

    segment_noun = "C segments"
    segment_label = "C segment"
    report_labels = {"arena_bytes": "arena (C)"}
    clock_method = "C node"
    clock_note = ("per-node clocks of the C library (built with MITHRIL_C_PROFILE=1); nodes without a C kernel "
                  "timed as NumPy runs them")

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

        self.interpreter = Interpreter(self.plan)
        self._governor = ThreadGovernor(self.num_threads, probe_one=True, watch_load=True)
        self._arena = np.empty(max(self.arena_bytes, 1) + 64, dtype=np.uint8)
        base = self._arena.ctypes.data
        self._arena_ptr = ctypes.c_void_p(base + (-base) % 64)  # 64-byte aligned, as offsets are
        # Constants the C segments read, as C-contiguous arrays of their dtype, kept alive here.
        # (np.ascontiguousarray would make a 0-d constant 1-d: np.require keeps the shape.)
        # Besides the plan's, the constants the renderer derived (weights packed for NCHWc kernels).
        derived = [v for step in self.steps if hasattr(step, "nodes") for v in step.inputs if v.kind == "constant"]
        self._constants = {v: np.require(v.value, requirements="C") for v in dict.fromkeys([*self.plan.constants,
                                                                                             *derived])}
        # Per segment, what each call checks and allocates: (value, shape, dtype) of inputs and outputs.
        self._io = {step.index: ([(v, v.static_shape, v.dtype) for v in step.inputs],
                                 [(v, v.static_shape, v.dtype) for v in step.outputs])
                    for step in self.steps if hasattr(step, "nodes")}

    def wait(self) -> None:
        """Until the library is built (lower starts the C compiler in the background); then loads
        it and binds its segment functions."""
        if self._segments:
            return
        for step in self.steps:
            if hasattr(step, "nodes"):
                fn = getattr(self.library, f"seg{step.index}")  # a LazyLibrary waits for the compiler here
                fn.restype = ctypes.c_int
                fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
                self._segments[step.index] = fn

    def memory_bytes(self) -> dict[str, int]:
        """Arena bytes (intermediates of the C segments, lifetimes shared) and the naive sum."""
        return {"arena_bytes": self.arena_bytes, "naive_bytes": self.naive_bytes}

    def node_clocks(self) -> list[tuple[object, float]] | None:
        """(plan node, seconds) for every node run in C since the library was loaded, when it was
        built with ``MITHRIL_C_PROFILE=1``; None when it was not."""
        try:
            fn = self.library.mt_profile
        except AttributeError:
            return None
        fn.restype = ctypes.POINTER(ctypes.c_double)
        seconds = fn()
        return [(pn, seconds[i]) for i, pn in enumerate(self.plan.nodes)]

    def profile(self) -> list[tuple[object, float]]:
        """:meth:`node_clocks`, or an error saying how to get them (for scripts/bench.py --profile)."""
        clocks = self.node_clocks()
        if clocks is None:
            raise MithrilError("CBackend: this library has no profile; compile with MITHRIL_C_PROFILE=1 set")
        return clocks

    def read(self, v, env):
        if v.kind == "constant":
            return self._constants[v]
        return env[v]

    def _start_call(self) -> float:
        """Sets the threads this call runs on (the governor's choice); returns its start time."""
        threads = self._governor.begin()
        if threads is not None:
            self.library.mt_set_threads(threads)
        return time.perf_counter()

    def _end_call(self, started: float) -> None:
        self._governor.end(time.perf_counter() - started)

    def run(self, params: dict, data: dict, *, hook=None) -> dict:
        """The segmented run loop (``hook``: around each step), on the threads the governor picks."""
        started = self._start_call()
        out = super().run(params, data, hook=hook)
        self._end_call(started)
        return out

    def run_segment(self, seg, env) -> None:
        """Calls the segment's C function on its inputs' buffers and new output arrays."""
        inputs, outputs = self._io[seg.index]
        pointers, keep = [], []  # keep: arrays made here, alive until the call has run
        for v, shape, dtype in inputs:
            arr = self._constants[v] if v.kind == "constant" else env[v]
            if type(arr) is np.ndarray and arr.shape == shape and arr.dtype == dtype and arr.flags.c_contiguous:
                pointers.append(arr.__array_interface__["data"][0])  # the common case, checked cheaply
                continue
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
            keep.append(arr)
            pointers.append(arr.__array_interface__["data"][0])
        for v, shape, dtype in outputs:
            out = np.empty(shape, dtype=dtype)
            env[v] = out
            pointers.append(out.__array_interface__["data"][0])
        io = (ctypes.c_void_p * max(len(pointers), 1))(*pointers)
        if not self._segments:
            self.wait()
        status = self._segments[seg.index](io, self._arena_ptr)
        if status:
            from ...errors import NodeError

            pn, problem = self.failures[status - 1]
            ins = [v for v in pn.inputs if v is not None]
            raise NodeError(f"CBackend: {problem}", node=pn.label, op_type=pn.op_type, opset=pn.opset,
                            shapes=[v.static_shape for v in ins], dtypes=[str(v.dtype) for v in ins])


__all__ = ["CFallbackWarning", "CKernelMissingError", "CProgram"]
