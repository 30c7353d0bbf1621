"""The partition: a segmented backend's nodes as steps, each a :class:`Segment` (a run of nodes
the backend compiles as one unit: a C function, a ggml graph) or a plan node NumPy runs; and
each segment's inputs (read before it writes them) and outputs (read by a later step or the
caller)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..plan import PlanNode, PlanValue, reads_of


@dataclass
class Segment:
    """A run of nodes compiled as one unit: ``inputs`` come from the steps before it (or the
    caller), ``outputs`` go to the steps after it (or the caller)."""

    index: int
    nodes: list[PlanNode]
    inputs: list[PlanValue] = field(default_factory=list)
    outputs: list[PlanValue] = field(default_factory=list)


def partition(nodes: Iterable[PlanNode], native: Callable[[PlanNode], bool], segment: type = Segment) -> list:
    """The steps: runs of nodes ``native`` accepts become segments (made by ``segment(index,
    nodes)``, numbered from 0), the others stay plan nodes, run on NumPy."""
    steps: list = []
    count = 0
    for pn in nodes:
        if native(pn):
            if not steps or not isinstance(steps[-1], Segment):
                steps.append(segment(count, []))
                count += 1
            steps[-1].nodes.append(pn)
        else:
            steps.append(pn)
    return steps


def later_reads(steps: list, outputs: Iterable[PlanValue]) -> Callable[[int, PlanValue], bool]:
    """``needed(i, v)``: whether value ``v`` is read after step ``i`` (by a later step, a
    subgraph's outer read included, or by the caller: one of ``outputs``)."""
    readers: dict[PlanValue, list[int]] = {}
    for i, step in enumerate(steps):
        for pn in step.nodes if isinstance(step, Segment) else [step]:
            for v in reads_of(pn):
                readers.setdefault(v, []).append(i)
    final = set(outputs)
    return lambda i, v: v in final or any(j > i for j in readers.get(v, ()))


def segment_io(seg: Segment, needed_later: Callable[[PlanValue], bool], reads: Callable[[PlanNode], Iterable],
               writes: Callable[[PlanNode], Iterable] = lambda pn: pn.outputs) -> None:
    """Fills ``seg.inputs`` (the values its nodes ``reads`` before a node of it ``writes`` them,
    first read first) and ``seg.outputs`` (the values it writes that ``needed_later`` says are
    read after it)."""
    produced = {w for pn in seg.nodes for w in writes(pn)}
    seen: set[PlanValue] = set()
    for pn in seg.nodes:
        for v in reads(pn):
            if v not in produced and v not in seen:
                seen.add(v)
                seg.inputs.append(v)
    seg.outputs.extend(w for pn in seg.nodes for w in writes(pn) if needed_later(w))


__all__ = ["Segment", "later_reads", "partition", "segment_io"]
