"""Gradient checkpointing: a plan's top-level nodes cut into segments whose activations the
backward pass recomputes instead of keeping.

``compile(..., gradient_checkpointing=True)`` keeps, between the forward and the backward pass,
only the values that cross a segment boundary; each segment's own intermediate values are
computed again, segment by segment from the last, just before its backward rules read them.
With about sqrt(N) segments of about sqrt(N) nodes, the activations held at once drop from all
N to about 2*sqrt(N) (Chen et al., 2016, "Training Deep Nets with Sublinear Memory Cost"), for
about one more forward pass of compute.

The cut is backend-neutral and made here, from the plan's lifetimes; each backend consumes it:

- JAX, Torch and MLX, whose autodiff differentiates the generated forward, get each segment
  printed as a nested function and called through :meth:`Backend.checkpoint
  <mithril.backends.backend.Backend.checkpoint>` (``jax.checkpoint``,
  ``torch.utils.checkpoint.checkpoint``, ``mx.checkpoint``) by :mod:`.emit_python`;
- NumPy's gradient program (:mod:`.vjp.program`) re-runs a segment's forward nodes before the
  rules of that segment.

Some nodes stay outside every segment and keep their values as without checkpointing: random
draws (a recomputation would draw again, and the gradient would belong to other masks), nodes
with subgraphs (If, Loop, Scan) and nodes whose output shapes depend on input values (a
checkpointed segment is traced as one function, which can branch on no value), and host-only
kernels (strings). They end the segment before them.

>>> import numpy as np, onnx_ir as ir
>>> from onnx import helper, TensorProto
>>> from mithril.backends.plan import build_plan
>>> nodes = [helper.make_node("Relu", [f"x{i}"], [f"x{i + 1}"]) for i in range(9)]
>>> g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x0", TensorProto.FLOAT, [4])],
...                       [helper.make_tensor_value_info("x9", TensorProto.FLOAT, [4])])
>>> plan = build_plan(ir.from_proto(helper.make_model(g)).graph, {"": 21})
>>> [[pn.index for pn in s.nodes] for s in checkpoint_segments(plan).segments]
[[0, 1, 2], [3, 4, 5], [6, 7, 8]]
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


def checkpoint_segments(plan: Plan, count: int | None = None) -> Checkpointing:
    """Cut ``plan``'s top-level nodes into about ``count`` segments (default: sqrt of the nodes
    that can be recomputed) defining about equal bytes of values, each cut placed, near its even
    position, where the fewest bytes are live across it (between ResNet's blocks rather than
    inside them). Nodes that cannot be
    recomputed (:func:`recompute_blocker`) are left out and end a segment; left-out nodes with
    subgraphs or value-dependent shapes are named in one :class:`GradientCheckpointingWarning`."""
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
    runs: list[tuple[int, int]] = []  # [start, stop) of consecutive recomputable nodes
    start = None
    for i, pn in enumerate(nodes + [None]):
        if pn is not None and pn not in blocked:
            start = i if start is None else start
        elif start is not None:
            runs.append((start, i))
            start = None
    # Segments hold about equal bytes of values (not equal node counts): ResNet's first
    # segments, at 112x112, are short, so recomputing one never holds much more than another.
    weight = [max(1, sum(_nbytes(o) for o in pn.outputs)) for pn in nodes]
    before = np.concatenate([[0], np.cumsum(weight)])  # bytes defined by the nodes before index c
    count = count if count is not None else round(math.sqrt(sum(b - a for a, b in runs)))
    per_segment = sum(before[b] - before[a] for a, b in runs) / max(1, count)
    bounds = []
    for a, b in runs:
        total = before[b] - before[a]
        k = min(b - a, max(1, round(total / per_segment)))
        cuts = [a]
        for j in range(1, k):
            ideal, half = before[a] + total * j / k, total / (2 * k)
            # each later segment keeps at least one node
            choices = range(cuts[-1] + 1, b - (k - j) + 1)
            near = [c for c in choices if abs(before[c] - ideal) <= half]
            cuts.append(min(near, key=lambda c: (crossing[c], abs(before[c] - ideal))) if near else
                        min(choices, key=lambda c: abs(before[c] - ideal)))
        cuts.append(b)
        bounds += zip(cuts, cuts[1:])

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

    untraceable = [f"{pn.label} ({why})" for pn, why in left_out
                   if why in ("subgraphs", "output shape depends on input values")]
    if untraceable:
        shown = ", ".join(untraceable[:5]) + (f" and {len(untraceable) - 5} more" if len(untraceable) > 5 else "")
        warnings.warn(f"gradient_checkpointing: {len(untraceable)} node(s) keep their activations (not recomputed): "
                      f"{shown}", GradientCheckpointingWarning, stacklevel=4)
    return Checkpointing(plan, segments, left_out)


__all__ = ["Checkpointing", "GradientCheckpointingWarning", "Segment", "checkpoint_segments", "recompute_blocker"]
