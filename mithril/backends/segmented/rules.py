"""A segmented backend's rule table: for each op, the rule that runs it natively (C code to
emit, ggml calls to build), keyed like the shared kernel registry by ``(domain, op_type)``
with sorted ``since`` versions, and resolved at the node's opset.

A client subclasses :class:`NativeRule` with its own fields (what to emit or build) and
hooks (``value_problem``, ``node_problem``), and registers its rules in one
:class:`RuleTable`::

    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True, kw_only=True)
    ... class ToyRule(NativeRule):
    ...     fn: object = None
    >>> table = RuleTable("toy rule")
    >>> table.add(ToyRule(op_type="Relu", since=14))
    >>> table.resolve("Relu", 13) is None, table.resolve("Relu", 17).since
    (True, 14)
"""

from __future__ import annotations

import bisect
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..plan import PlanNode, PlanValue


@dataclass(frozen=True, kw_only=True)
class NativeRule:
    """One op's native rule. ``check(pn)`` says why a node cannot run natively (None when it can)
    beyond the checks every segmented backend makes (:func:`..capability.why_not`);
    ``folded`` lists input positions read when the segment is made (Reshape's shape): they
    must be constants and are not buffers. A client adds what it emits or builds with, and
    overrides the hooks below."""

    op_type: str
    domain: str = ""
    since: int = 1
    check: Callable[[PlanNode], str | None] | None = None
    folded: tuple[int, ...] = ()

    @property
    def function(self) -> Callable | None:
        """The client's function that renders or builds the node (for ``mithril ops``)."""
        return None

    def buffers(self, pn: PlanNode) -> Iterator[tuple[int | None, PlanValue]]:
        """The values the native code reads or writes as tensors: ``(input position, value)``
        for the inputs present and not folded, then ``(None, value)`` for each output."""
        for i, v in enumerate(pn.inputs):
            if v is not None and i not in self.folded:
                yield i, v
        for v in pn.outputs:
            yield None, v

    def value_problem(self, pn: PlanNode, position: int | None, v: PlanValue) -> str | None:
        """Why buffer ``v`` (input ``position``, None for an output) can't be held natively
        (its dtype, its rank), before the shared shape checks; None when it can."""
        return None

    def node_problem(self, pn: PlanNode) -> str | None:
        """The rule's own verdict on ``pn`` once every buffer passed: its ``check``."""
        return self.check(pn) if self.check is not None else None


class RuleTable:
    """``(domain, op_type)`` -> rules sorted by ``since``; ``noun`` names a rule in messages
    ("C kernel", "ggml rule")."""

    def __init__(self, noun: str):
        self.noun = noun
        self._rules: dict[tuple[str, str], list[NativeRule]] = {}

    def add(self, rule: NativeRule, *, replace: bool = False) -> None:
        """Registers ``rule``; the same op, domain and ``since`` twice is an error unless ``replace``."""
        rules = self._rules.setdefault((rule.domain, rule.op_type), [])
        old = next((r for r in rules if r.since == rule.since), None)
        if old is not None:
            if not replace:
                raise ValueError(f"{self.noun} for {rule.domain or 'ai.onnx'}::{rule.op_type} since opset "
                                 f"{rule.since} registered twice")
            rules.remove(old)
        bisect.insort(rules, rule, key=lambda r: r.since)

    def resolve(self, op_type: str, opset: int | None, domain: str = "") -> NativeRule | None:
        """The rule with the newest ``since`` <= ``opset`` (None: the newest), or None."""
        rules = self._rules.get((domain, op_type), [])
        if opset is None:
            return rules[-1] if rules else None
        i = bisect.bisect_right(rules, opset, key=lambda r: r.since)
        return rules[i - 1] if i else None

    def rule_for(self, pn: PlanNode) -> NativeRule | None:
        """The rule for plan node ``pn`` at its opset."""
        return self.resolve(pn.op_type, pn.opset, pn.domain)

    def versions(self, op_type: str, domain: str = "") -> list[int]:
        return [r.since for r in self._rules.get((domain, op_type), [])]

    def entries(self, op_type: str, domain: str = "") -> list[NativeRule]:
        return list(self._rules.get((domain, op_type), []))

    def ops(self) -> set[tuple[str, str]]:
        """Every ``(domain, op_type)`` with a rule at some opset."""
        return {key for key, rules in self._rules.items() if rules}

    def __contains__(self, key: tuple[str, str]) -> bool:
        return bool(self._rules.get(key))


def qualified_name(fn: Callable) -> str:
    """``module.function`` of ``fn``'s definition."""
    fn = inspect.unwrap(fn)
    return f"{fn.__module__}.{fn.__qualname__}"


__all__ = ["NativeRule", "RuleTable", "qualified_name"]
