"""The C gradient program as items: a lowering plan's gradient schedule
(:func:`~mithril.backends.vjp.plan_gradients`) flattened into forward nodes, backward rules and
gradient sums, each reading and writing its own values (:mod:`mithril.backends.c.grad`); and the
registry of C backward kernels (:data:`GRAD_KERNELS`, filled by :mod:`.grad_rules`)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from ...errors import MithrilError
from ..plan import PlanNode, PlanValue
from ..vjp.program import RuleStep
from .ops import C_TYPES, FLOATS, Emitter
from .render import scratch_bytes, tensor_inputs, why_not_c


@dataclass(eq=False)
class Item:
    """One step of the flattened gradient program: ``forward``, ``rule`` or ``sum`` (:mod:`mithril.backends.c.grad`)."""

    kind: str  # "forward" | "rule" | "sum"
    node: PlanNode | None = None
    rule: RuleStep | None = None
    cot: tuple = ()  # rule: the cotangent value of each node output (None: none reaches it)
    grads: tuple = ()  # rule: the gradient value written for each node input (None: not wanted)
    reads: list = field(default_factory=list)
    writes: list = field(default_factory=list)

    @property
    def label(self) -> str:
        if self.kind == "sum":
            return f"sum of gradients ({self.writes[0].name})"
        return self.node.label + (" (backward)" if self.kind == "rule" else "")

    # What a rule's emit reads: the cotangent of output 0, input k, its gradient.
    @property
    def g(self) -> PlanValue:
        return self.cot[0]

    def x(self, k: int) -> PlanValue | None:
        ins = self.node.inputs
        return ins[k] if k < len(ins) else None

    def dx(self, k: int) -> PlanValue | None:
        return self.grads[k] if k < len(self.grads) else None

    @property
    def kwargs(self) -> dict:
        return self.node.kwargs


@dataclass(frozen=True)
class GradKernel:
    """One op's backward in C: ``emit(item, c)`` prints the calls, ``check(item)`` says why an
    item cannot run in C (None when it can), ``scratch(item)`` the arena bytes it borrows."""

    op_type: str
    domain: str
    emit: Callable[[Item, Emitter], None]
    check: Callable[[Item], str | None] | None
    scratch: Callable[[Item], int] | None


GRAD_KERNELS: dict[tuple[str, str], GradKernel] = {}


def grad_kernel(*op_types: str, domain: str = "", check=None, scratch=None):
    """Register ``emit`` as the C backward of each of ``op_types``."""

    def register(emit):
        for op in op_types:
            if (domain, op) in GRAD_KERNELS:
                raise ValueError(f"C backward kernel for {domain or 'ai.onnx'}::{op} registered twice")
            GRAD_KERNELS[(domain, op)] = GradKernel(op, domain, emit, check, scratch)
        return emit

    return register


def why_not_c_item(item: Item) -> str | None:
    """Why ``item`` cannot run in C; None when it can."""
    if item.kind == "forward":
        return why_not_c(item.node)
    if item.kind == "sum":
        return None if item.writes[0].dtype in FLOATS else f"dtype {item.writes[0].dtype}"
    pn = item.node
    rule = GRAD_KERNELS.get((pn.domain, pn.op_type))
    if rule is None or pn.subgraphs:
        return "no C backward kernel"
    if any(c is not None for c in item.cot[1:]) and pn.op_type not in _FIRST_COTANGENT_ONLY:
        return "a cotangent reaches an output other than the first"
    if item.cot[0] is None:
        return "no cotangent reaches the first output"
    wanted = [v for v, d in zip(pn.inputs, item.grads) if d is not None]
    squares = (pn.op_type in ("Mul", "Add") and len(pn.inputs) == 2 and pn.inputs[0] is pn.inputs[1]) or \
        pn.op_type == "Sum"  # Sum(x, x): its rule counts them
    if not squares and any(
            v is not None and v in wanted and d is None and item.rule.needs[k]
            for k, (v, d) in enumerate(zip(pn.inputs, item.grads))):
        return "one value at several wanted inputs"
    for v in item.reads:
        if v.static_shape is None:
            return f"shape of {v.name!r} not fixed"
        if v.dtype not in C_TYPES:
            return f"dtype {v.dtype} of {v.name!r}"
    if item.g.dtype not in FLOATS:
        return f"dtype {item.g.dtype} (the C backward kernels are float32 and float64)"
    return rule.check(item) if rule.check is not None else None


# Ops whose backward reads only the first output's cotangent, as NumPy's rule does (BatchNormalization's
# running statistics are buffers updated by assignment, not values a loss reads).
_FIRST_COTANGENT_ONLY = {"BatchNormalization"}


def item_scratch(item: Item) -> int:
    """Arena bytes ``item`` borrows while it runs (its forward rule's or its backward kernel's scratch)."""
    if item.kind == "forward":
        return scratch_bytes(item.node)
    if item.kind == "rule":
        rule = GRAD_KERNELS[(item.node.domain, item.node.op_type)]
        return rule.scratch(item) if rule.scratch is not None else 0
    return 0


def gradient_items(gp) -> tuple[list[Item], dict[PlanValue, PlanValue], dict[PlanValue, PlanValue]]:
    """The flattened program, the cotangent value of each differentiated plan output, and the
    final gradient value of each value that has one."""
    ids = itertools.count(-1, -1)  # gradient values: ids no plan value has

    def new(v: PlanValue, what: str) -> PlanValue:
        return PlanValue(next(ids), f"{what}({v.name})", v.shape, v.dtype, "node")

    items: list[Item] = []
    grad_of: dict[PlanValue, PlanValue] = {}
    cotangents: dict[PlanValue, PlanValue] = {}
    for step in gp.steps:
        if step.kind == "forward":
            pn = step.node
            reads = tensor_inputs(pn) if why_not_c(pn) is None else [v for v in pn.inputs if v is not None]
            items.append(Item("forward", node=pn, reads=reads, writes=[o for o in pn.outputs if o.name]))
        elif step.kind == "cotangents":
            for v in gp.plan.outputs:
                if v in gp.useful and v not in grad_of:
                    grad_of[v] = cotangents[v] = new(v, "cotangent")
        elif step.kind == "rule":
            pn, rule = step.node, step.rule
            cot = tuple(grad_of.get(o) for o in pn.outputs)
            grads, seen = [], set()
            for k, v in enumerate(pn.inputs):
                if v is not None and rule.needs[k] and v not in seen:
                    grads.append(new(v, "grad"))
                    seen.add(v)
                else:
                    grads.append(None)
            # A C backward may read any input and the first output (Tanh's, Softmax's y) even where
            # NumPy's rule does not: they live until it has run.
            forward = list(rule.reads) + [v for v in pn.inputs if v is not None] + list(pn.outputs[:1])
            item = Item("rule", node=pn, rule=rule, cot=cot, grads=tuple(grads),
                        reads=list(dict.fromkeys([c for c in cot if c is not None] + forward)),
                        writes=[d for d in grads if d is not None])
            items.append(item)
            for v, d in zip(pn.inputs, grads):
                if d is None:
                    continue
                if v in grad_of:
                    total = new(v, "grad")
                    items.append(Item("sum", reads=[grad_of[v], d], writes=[total]))
                    grad_of[v] = total
                else:
                    grad_of[v] = d
        elif step.kind == "recompute":
            raise MithrilError("CBackend keeps every forward value for the gradients (no gradient checkpointing)")
    return items, cotangents, grad_of


__all__ = ["GRAD_KERNELS", "GradKernel", "Item", "gradient_items", "grad_kernel", "item_scratch",
           "why_not_c_item"]
