"""The capability step: for every plan node, whether a segmented backend runs it natively, and
why not when it does not.

The checks every such backend makes are here, once: a rule exists at the node's opset, the node
has no subgraphs, its folded inputs are constants, each buffer passes the rule's
``value_problem`` (dtypes, ranks: the client's hook) and has a fixed shape, a constant holds
the shape it is typed with; then the rule's own ``node_problem``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

import numpy as np

from ..plan import PlanNode
from .rules import RuleTable


def why_not(pn: PlanNode, rules: RuleTable, pending: Collection = frozenset()) -> str | None:
    """Why ``pn`` cannot run natively under ``rules``; None when it can. ``pending``: values
    known only at the first evaluate (GGML builds its graphs then, for the values of inputs a
    rule reads at build time): a node reading one passes for now and is checked in full later."""
    rule = rules.rule_for(pn)
    if rule is None or pn.subgraphs:
        return f"no {rules.noun}"
    later = False
    for i in rule.folded:
        v = pn.inputs[i] if i < len(pn.inputs) else None
        if v is not None and v.kind != "constant":
            if v not in pending:
                return f"input {i} ({v.name!r}) given at run time"
            later = True
    for position, v in rule.buffers(pn):
        problem = rule.value_problem(pn, position, v)
        if problem:
            return problem
        if v in pending:
            later = True
            continue
        if v.static_shape is None:
            return f"shape of {v.name!r} not fixed"
        if v.kind == "constant" and tuple(np.shape(v.value)) != v.static_shape:
            return f"constant {v.name!r} holds shape {np.shape(v.value)}, typed {v.static_shape}"
    if later:
        return None
    return rule.node_problem(pn)


def capability(nodes: Iterable[PlanNode], rules: RuleTable,
               pending: Collection = frozenset()) -> list[tuple[PlanNode, str | None]]:
    """Every node with why it does not run natively (None: it does), in order."""
    return [(pn, why_not(pn, rules, pending)) for pn in nodes]


__all__ = ["capability", "why_not"]
