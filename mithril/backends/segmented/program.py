"""A segmented program: the steps of a partition run in order, each segment by the client's
``run_segment`` (a C function, a ggml graph) and each other node by NumPy's interpreter, over
one environment of values.

``run(params, data, hook=...)`` calls ``hook(step, fn, *args)`` around each step, which must
return ``fn(*args)``: ``step`` is the Segment or the plan node, ``fn`` what runs it. The
profiler (:mod:`mithril.profile`) times each step through it::

    def hook(step, fn, *args):
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            seconds[step] = time.perf_counter() - start
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ...errors import KernelError, MithrilError
from .partition import Segment


class SegmentedProgram:
    """The run loop a client's program inherits. The client sets ``plan``, ``steps``,
    ``fallback`` (the plan nodes among them) and ``interpreter`` (a :class:`~mithril.backends.interpret.Interpreter` of the plan, for the
    fallback nodes), and defines :meth:`run_segment` and :meth:`memory_bytes`; the class
    attributes name its parts in reports."""

    segment_noun = "segments"  # what its segments are, plural: "C segments", "ggml graphs"
    segment_label = "segment"  # a segment's row in a profile: "C segment 0: 3 nodes (...)"
    # A memory report's name for each of memory_bytes()' entries it prints besides the weights.
    report_labels = {"arena_bytes": "arena"}
    # What a profile by segment measures, in words.
    profile_note = ("per partition: each segment is one row, and each node NumPy runs between segments another")
    clock_method = "native node"  # a profile's method when node_clocks() answers
    clock_note = "per-node clocks of the native code; nodes left to NumPy timed as NumPy runs them"

    # -- what the client defines ---------------------------------------------------------------
    def run_segment(self, seg: Segment, env: dict) -> None:
        """Runs ``seg``: reads its inputs from ``env``, writes its outputs into it."""
        raise NotImplementedError

    def memory_bytes(self) -> dict:
        """The program's bytes (``arena_bytes``, and what else it knows)."""
        return {}

    def node_clocks(self) -> list[tuple[object, float]] | None:
        """(plan node, seconds) for every plan node, summed over the runs so far, where the native
        code keeps per-node clocks; None where it does not (a profile then times each segment)."""
        return None

    # -- the run loop ------------------------------------------------------------------------------
    @property
    def forward(self):
        return self.run

    def program_for(self, params: dict, data: dict) -> SegmentedProgram:
        """The program that runs for these inputs: this one (a program built at its first
        evaluate answers with the one it built for them)."""
        return self

    def bind(self, params: dict, data: dict) -> dict:
        """The environment a run starts from: graph inputs and parameters by plan value."""
        env: dict = {}
        for v in self.plan.inputs:
            env[v] = params[v.name] if v.kind == "param" else data[v.name]
        for v in self.plan.params:
            env.setdefault(v, params[v.name])
        return env

    def read(self, v, env: dict):
        """Value ``v``: a constant's array, else what the environment holds."""
        return v.value if v.kind == "constant" else env[v]

    def run(self, params: dict, data: dict, *, hook: Callable | None = None) -> dict:
        """The plan's outputs by name; ``hook`` (see the module docstring) around each step."""
        env = self.bind(params, data)
        for step in self.steps:
            if isinstance(step, Segment):
                if hook is None:
                    self.run_segment(step, env)
                else:
                    hook(step, self.run_segment, step, env)
                continue
            args = [None if v is None else self.read(v, env) for v in step.inputs]
            try:
                results = (self.interpreter.run_node(step, args, env) if hook is None
                           else hook(step, self.interpreter.run_node, step, args, env))
            except MithrilError:
                raise
            except Exception as exc:  # the NumPy kernel refusing its inputs: named as NumpyBackend names it
                raise KernelError(f"the NumPy kernel failed: {type(exc).__name__}: {exc}", node=step.label,
                                  op_type=step.op_type, opset=step.opset,
                                  shapes=[list(np.shape(a)) if hasattr(a, "shape") else None for a in args],
                                  dtypes=[str(getattr(a, "dtype", type(a).__name__)) for a in args]) from exc
            for o, r in zip(step.outputs, results):
                env[o] = r
        return {v.name: self.read(v, env) for v in self.plan.outputs}

    # -- reports -------------------------------------------------------------------------------
    def memory_report(self) -> dict:
        """:meth:`memory_bytes`, with ``labels`` (a report's name for each of them) and
        ``fallback_nodes`` (how many nodes NumPy runs, allocating their own outputs)."""
        return {**self.memory_bytes(), "labels": dict(self.report_labels), "segment_noun": self.segment_noun,
                "fallback_nodes": len(self.fallback)}


__all__ = ["SegmentedProgram"]
