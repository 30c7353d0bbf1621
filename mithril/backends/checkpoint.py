"""Gradient checkpointing: a plan's top-level nodes cut into segments whose activations the
backward pass recomputes instead of keeping.

``compile(..., gradient_checkpointing=True)`` keeps, between the forward and the backward pass,
only the values that cross a segment boundary; each segment's own intermediate values are
computed again, segment by segment from the last, just before its backward rules read them.
With about sqrt(N) segments of about sqrt(N) values each, the activations held at once drop
from all N to about 2*sqrt(N) (Chen et al., 2016, "Training Deep Nets with Sublinear Memory
Cost"), for about one more forward pass of compute. The cuts are chosen by bytes, not node
counts (:func:`_cuts`).

The cut is backend-neutral and made here, from the plan's lifetimes; each backend consumes it:

- JAX, Torch and MLX, whose autodiff differentiates the generated forward, get each segment
  printed as a nested function and called through :meth:`Backend.checkpoint
  <mithril.backends.backend.Backend.checkpoint>` (a custom_vjp on JAX,
  ``torch.utils.checkpoint.checkpoint``, ``mx.checkpoint``) by :mod:`.emit_python`;
- NumPy's gradient program (:mod:`.vjp.program`) re-runs a segment's forward nodes before the
  rules of that segment.

Some nodes stay outside every segment and keep their values as without checkpointing: random
draws (a recomputation would draw again, and the gradient would belong to other masks), nodes
with subgraphs (If, Loop, Scan) and nodes whose output shapes depend on input values (a
checkpointed segment is traced as one function, which can branch on no value), and host-only
kernels (strings). They end the segment before them.

>>> import onnx_ir as ir
>>> from onnx import helper, TensorProto
>>> from mithril.backends.plan import build_plan
>>> nodes = [helper.make_node("Relu", [f"x{i}"], [f"x{i + 1}"]) for i in range(9)]
>>> values = [helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, [4]) for i in range(10)]
>>> g = helper.make_graph(nodes, "chain", values[:1], values[-1:], value_info=values[1:-1])
>>> plan = build_plan(ir.from_proto(helper.make_model(g)).graph, {"": 21})
>>> [[pn.index for pn in s.nodes] for s in checkpoint_segments(plan).segments]
[[0, 1, 2, 3], [4, 5, 6], [7, 8]]

(Later segments are shorter: when the backward pass reaches one, the values crossing every
earlier cut are still kept.)
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from .plan import Plan, PlanNode, PlanValue


class GradientCheckpointingWarning(UserWarning):
    """Part of a graph runs without recomputation under ``gradient_checkpointing=True``."""


@dataclass(eq=False)
class Segment:
    """Contiguous top-level nodes recomputed together.

    ``inputs``: the values its nodes read that are defined before it (parameters included,
    constants not: they are the program's own), in the order first read. ``outputs``: the values
    it defines that later nodes read or the plan returns. ``frees``: values defined before it
    whose last reader is in it (the caller drops them after the segment)."""

    index: int
    nodes: list[PlanNode]
    inputs: tuple[PlanValue, ...]
    outputs: tuple[PlanValue, ...]
    frees: tuple[PlanValue, ...]

    @property
    def defined(self) -> set[PlanValue]:
        return {o for pn in self.nodes for o in pn.outputs}


@dataclass(eq=False)
class Checkpointing:
    """A plan cut into segments; ``left_out``: top-level nodes in no segment, with the reason."""

    plan: Plan
    segments: list[Segment]
    left_out: list[tuple[PlanNode, str]]
    # The backend method the printed program calls each segment through: ``checkpoint(s<i>,
    # live-in...)``; ``pipeline_stage`` (device meshes' pipeline stages) also takes the index first.
    call: str = "checkpoint"

    def segment_starting_at(self) -> dict[PlanNode, Segment]:
        """First node -> its segment (a printer walks the plan's nodes and opens a segment there)."""
        return {s.nodes[0]: s for s in self.segments}

    def segment_of(self) -> dict[PlanNode, Segment]:
        """Every segmented node -> its segment."""
        return {pn: s for s in self.segments for pn in s.nodes}


def recompute_blocker(pn: PlanNode) -> str | None:
    """Why ``pn`` cannot be recomputed inside a segment, or None when it can."""
    spec = pn.spec
    if spec is not None and spec.nondeterministic:
        return "random draws"
    if pn.subgraphs:
        return "subgraphs"
    if spec is not None and spec.data_dependent_shape:
        return "output shape depends on input values"
    if spec is not None and spec.host_only:
        return "computes on the host"
    return None


def _outer(pn: PlanNode) -> list[PlanValue]:
    return [v for sub in pn.subgraphs.values() for p in (sub if isinstance(sub, tuple) else (sub,)) for v in p.outer]


def _reads(pn: PlanNode) -> list[PlanValue]:
    return [v for v in pn.inputs if v is not None] + _outer(pn)


def _nbytes(v: PlanValue) -> int:
    """Bytes of a value, unknown dims counted as 1 (enough to compare cuts of one plan)."""
    elements = math.prod(d for d in v.shape if isinstance(d, int)) if v.shape is not None else 1
    return elements * (v.dtype.itemsize if v.dtype is not None and v.dtype != object else 4)


def checkpoint_segments(plan: Plan) -> Checkpointing:
    """Cut ``plan``'s top-level nodes into the segments that minimize the modelled peak of the
    backward pass (:func:`_cuts`). Nodes that cannot be recomputed (:func:`recompute_blocker`)
    are left out and end a segment; left-out nodes with subgraphs or value-dependent shapes are
    named in one :class:`GradientCheckpointingWarning`."""
    nodes = plan.nodes
    n = len(nodes)
    defined_at: dict[PlanValue, int] = {v: -1 for v in plan.inputs}
    last_read: dict[PlanValue, int] = {}
    for i, pn in enumerate(nodes):
        for v in _reads(pn):
            last_read[v] = i
        for o in pn.outputs:
            defined_at[o] = i
    for v in plan.outputs:
        last_read[v] = n
    # bytes live across the cut before node c (c = 1..n-1)
    crossing = np.zeros(n + 1)
    for v, d in defined_at.items():
        u = last_read.get(v)
        if u is not None and u > d and v.kind not in ("param", "constant"):
            crossing[d + 1:u + 1] += _nbytes(v)
    left_out = [(pn, why) for pn in nodes if (why := recompute_blocker(pn)) is not None]
    blocked = {pn for pn, _ in left_out}
    # bytes defined by the nodes before index c
    before = np.concatenate([[0], np.cumsum([sum(_nbytes(o) for o in pn.outputs) for pn in nodes])])
    bounds = _cuts(crossing, before, np.array([pn in blocked for pn in nodes], dtype=bool))
    segments = segments_between(plan, bounds, last_read)

    untraceable = [f"{pn.label} ({why})" for pn, why in left_out
                   if why in ("subgraphs", "output shape depends on input values")]
    if untraceable:
        shown = ", ".join(untraceable[:5]) + (f" and {len(untraceable) - 5} more" if len(untraceable) > 5 else "")
        warnings.warn(f"gradient_checkpointing: {len(untraceable)} node(s) keep their activations (not recomputed): "
                      f"{shown}", GradientCheckpointingWarning, stacklevel=4)
    return Checkpointing(plan, segments, left_out)


def last_reads(plan: Plan) -> dict[PlanValue, int]:
    """Each value -> the index of the last top-level node reading it (len(nodes) for outputs)."""
    last_read: dict[PlanValue, int] = {}
    for i, pn in enumerate(plan.nodes):
        for v in _reads(pn):
            last_read[v] = i
    for v in plan.outputs:
        last_read[v] = len(plan.nodes)
    return last_read


def segments_between(plan: Plan, bounds, last_read: dict[PlanValue, int] | None = None) -> list[Segment]:
    """The :class:`Segment` of each ``(start, stop)`` range of ``plan``'s top-level nodes."""
    nodes = plan.nodes
    last_read = last_reads(plan) if last_read is None else last_read
    segments = []
    for a, b in bounds:
        members = nodes[a:b]
        inside = {o for pn in members for o in pn.outputs}
        live_in: dict[PlanValue, None] = {}
        for pn in members:
            for v in _reads(pn):
                if v not in inside and v.kind != "constant":
                    live_in[v] = None
        live_out = tuple(o for pn in members for o in pn.outputs if last_read.get(o, -1) >= b)
        frees = tuple(dict.fromkeys(v for pn in members for v in pn.frees if v not in inside))
        segments.append(Segment(len(segments), members, tuple(live_in), tuple(dict.fromkeys(live_out)), frees))
    return segments


def _cuts(crossing: np.ndarray, before: np.ndarray, blocked: np.ndarray,
          longest: int = 512) -> list[tuple[int, int]]:
    """Segments ``[a, b)`` of recomputable nodes minimizing the peak of a simple model of the
    backward pass: while segment k is recomputed and differentiated, the values crossing every
    cut before it (``crossing``, kept from the forward pass) and all the values it defines
    (``before[b] - before[a]``) are alive. No cut holds everything at once (one segment: all the
    values, as without checkpointing); cuts everywhere keep everything too. The least peak is
    found by bisection, each budget checked by a dynamic program over the cut positions that
    keeps the fewest bytes at each (segments of at most ``longest`` nodes); for a chain of N
    equal values that is about sqrt(N) segments of sqrt(N) values, and cuts land where few bytes
    cross (between ResNet's blocks, not inside them). A blocked node runs alone, not recomputed."""
    n = len(blocked)
    start = np.zeros(n + 1, dtype=int)  # the first index a segment ending before b may start at
    for b in range(1, n + 1):
        start[b] = b if blocked[b - 1] else max(start[b - 1], b - longest)

    def solve(budget: float):
        kept = np.full(n + 1, np.inf)
        kept[0] = 0.0
        parent = np.full(n + 1, -1)
        for b in range(1, n + 1):
            if blocked[b - 1]:
                best = b - 1
            else:
                a = start[b]
                heads = kept[a:b] + (before[b] - before[a:b])
                if not (heads <= budget).any():
                    continue
                best = a + int(np.argmin(np.where(heads <= budget, kept[a:b], np.inf)))
            if np.isfinite(kept[best]):
                kept[b] = kept[best] + (crossing[b] if b < n else 0.0)
                parent[b] = best
        return parent if np.isfinite(kept[n]) else None

    lo, hi = 0.0, float(before[n] + crossing.sum()) + 1.0
    parent = solve(hi)
    for _ in range(40):
        mid = (lo + hi) / 2
        found = solve(mid)
        if found is None:
            lo = mid
        else:
            hi, parent = mid, found
        if hi - lo <= 1e-3 * hi:
            break
    bounds, b = [], n
    while b > 0:
        a = int(parent[b])
        if not blocked[b - 1]:
            bounds.append((a, b))
        b = a
    return bounds[::-1]


__all__ = ["Checkpointing", "GradientCheckpointingWarning", "Segment", "checkpoint_segments", "recompute_blocker"]
