"""The contract of a plan rewrite, and the manager that runs a list of them.

A pass (:class:`PlanPass`) receives a plan's :class:`~mithril.backends.plan.PlanIndex`, rewrites
the plan through it (the index stays true for the next pass) and says whether it changed
anything, as onnx_ir's ``PassBase`` does for graphs. :class:`PassManager` runs its passes in
order on one copy of the plan, so the plan it is given (shared by the gradient program, the
profiler...) never changes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from ..plan import Plan, PlanIndex, PlanNode


class PlanPass:
    """One named rewrite of a plan: :meth:`run` matches, rewrites through the index, and returns
    whether it changed the plan."""

    name: str = ""

    def run(self, index: PlanIndex) -> bool:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


@dataclass
class PassResult:
    """What :class:`PassManager` returns: the plan (the one it was given when nothing changed),
    whether it changed, each pass's own answer, and ``origins``: by id of each node a pass put in,
    the node of the given plan it stands for (a fused node's anchor: profile slots)."""

    plan: Plan
    changed: bool
    changed_by: list[tuple[str, bool]] = field(default_factory=list)
    origins: dict[int, PlanNode] = field(default_factory=dict)


class PassManager:
    """Runs ``passes`` in order over one index of one copy of the plan.

    >>> from mithril.backends.passes import PassManager, InPlaceActivations  # doctest: +SKIP
    >>> result = PassManager([InPlaceActivations(SWAPS)])(plan)              # doctest: +SKIP
    >>> result.changed, result.plan is plan                                  # doctest: +SKIP
    (False, True)
    """

    def __init__(self, passes: Iterable[PlanPass]):
        self.passes = list(passes)

    def __call__(self, plan: Plan) -> PassResult:
        if not self.passes:
            return PassResult(plan, False)
        work = replace(plan, nodes=list(plan.nodes), outputs=list(plan.outputs))
        index = work.index
        changed_by = [(p.name or type(p).__name__, bool(p.run(index))) for p in self.passes]
        if not any(changed for _, changed in changed_by):
            return PassResult(plan, False, changed_by)
        _mark_baked(plan.nodes, work.nodes)
        return PassResult(work, True, changed_by, dict(index.origins))


def _mark_baked(before: list, after: list) -> None:
    """Frozen parameters a pass read as constants (``PlanValue.frozen_scalar``) that the given nodes
    read and the rewritten ones no longer do: the pass built their values into a node (a Gelu made
    of a chain whose sqrt(2) was an initializer), so evaluate must refuse another value for them
    (``PlanValue.baked``). Parameters a pass only repacks (C's NCHWc blocking) stay parameters."""
    read_after = {id(v) for pn in after for v in pn.inputs if v is not None}
    for pn in before:
        for v in pn.inputs:
            if v is not None and v.kind == "param" and v.read_as_constant and id(v) not in read_after:
                v.baked = True


def run_passes(plan: Plan, passes: Iterable[PlanPass]) -> Plan:
    """The plan after ``passes`` (itself when none changes it)."""
    return PassManager(passes)(plan).plan


__all__ = ["PassManager", "PassResult", "PlanPass", "run_passes"]
