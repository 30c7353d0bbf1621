"""What the fusion patterns share: reading a scalar constant, and the checks that a fused node
may run where the chain it replaces ran."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..plan import PlanIndex, PlanNode, PlanValue


def constant_scalar(v: PlanValue | None) -> float | None:
    """A float constant's one value (any shape of one element); None for anything else. Constants
    the program embeds count, and frozen one-element parameters (:meth:`PlanValue.frozen_scalar`:
    an exporter's constants written as initializers), which the pass that builds one into a node
    marks ``baked`` (:class:`~.base.PassManager`); other parameters may change at run time."""
    if v is not None and v.kind == "param":
        return v.frozen_scalar()
    if v is None or v.kind != "constant":
        return None
    a = np.asarray(v.value)
    if a.size != 1 or a.dtype.kind != "f":
        return None
    return float(a.reshape(()))


def near(value: float | None, want: float) -> bool:
    """``value`` within 1e-6 (relative) of ``want``."""
    return value is not None and abs(value - want) <= 1e-6 * abs(want)


def other_operand(pn: PlanNode, want: float) -> PlanValue | None:
    """The other operand of a binary node one of whose operands is a constant near ``want``;
    None where neither is."""
    a, b = pn.inputs
    if near(constant_scalar(b), want):
        return a
    if near(constant_scalar(a), want):
        return b
    return None


def mithril_kernel(pn: PlanNode) -> bool:
    """Whether ``pn`` runs one of Mithril's kernels (not a user's, registered over it)."""
    return pn.spec is not None and getattr(pn.spec.fn, "__module__", "").startswith("mithril.backends.")


def chain_frees(chain: Iterable[PlanNode], last: PlanNode) -> tuple[PlanValue, ...]:
    """What a node replacing ``chain`` frees: what the chain's nodes free, but the values passed
    inside the chain (which no longer exist)."""
    chain = list(chain)
    between = {o for pn in chain if pn is not last for o in pn.outputs}
    return tuple(dict.fromkeys(v for pn in chain for v in pn.frees if v not in between))


def reads_stay_alive(index: PlanIndex, reads: Iterable[PlanValue | None], chain: Iterable[PlanNode],
                     at: PlanNode) -> bool:
    """Whether a node replacing ``chain`` may read ``reads`` where ``at`` (the chain's last node)
    ran: no node between the chain's first node and ``at``, outside the chain, frees one of them."""
    chain = list(chain)
    first = min(chain, key=index.position)
    inside = {id(pn) for pn in chain}
    reads = {v for v in reads if v is not None}
    return not any(reads.intersection(pn.frees) for pn in index.between(first, at) if id(pn) not in inside)


__all__ = ["chain_frees", "constant_scalar", "mithril_kernel", "near", "other_operand", "reads_stay_alive"]
