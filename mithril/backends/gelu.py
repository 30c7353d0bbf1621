"""Gelu written out as elementwise ops, found in a plan and run as one kernel.

Exporters before ONNX's Gelu op (opset 20) spell it out. ``torch.onnx.export`` of BERT's
activation gives the exact form, five nodes::

    Div(x, 1.4142135) -> Erf -> Add(., 1) -> Mul(x, .) -> Mul(., 0.5)

and GPT-2's ``gelu_new`` the tanh form, eight::

    Pow(x, 3) -> Mul(., 0.044715) -> Add(x, .) -> Mul(., 0.7978846) -> Tanh -> Add(., 1) -> Mul(h, .)
    with h = Mul(x, 0.5)

(operands of Add and Mul in either order; ``x / sqrt(2)`` also as ``Mul(x, 0.70710677)``; x^3 also
as ``Mul(Mul(x, x), x)``, which the plan makes of a constant Pow of 3; the 0.5 applied to x first
or to the product last). :func:`fuse_gelu` replaces each such chain whose
intermediate results nothing else reads by one node calling a backend's Gelu kernel. Only
constants the program embeds count (an initializer given at run time may change), each a single
value within 1e-6 (relative) of the one above, and only where the result has x's shape and dtype.
The chain's values differ from the kernel's by float rounding alone: the same function, computed
in one pass instead of five or eight (torch's ``F.gelu``: 209-303 us for BERT-small's five ops on a
128x1024 activation against 82-114 us, 2 threads).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter, defaultdict

import numpy as np

from .inplace import mithril_kernel
from .plan import RUNTIME_ARGUMENTS, Plan, PlanNode, PlanValue, reads_of
from .registry import KernelSpec

_SQRT2 = math.sqrt(2.0)
_TANH_SCALE = math.sqrt(2.0 / math.pi)
_CUBIC = 0.044715


def _constant(v: PlanValue | None) -> float | None:
    """A constant's one value (any shape of one element), else None."""
    if v is None or v.kind != "constant":
        return None
    a = np.asarray(v.value)
    if a.size != 1 or a.dtype.kind != "f":
        return None
    return float(a.reshape(()))


def _near(value: float | None, want: float) -> bool:
    return value is not None and abs(value - want) <= 1e-6 * abs(want)


def fuse_gelu(plan: Plan, gelu: KernelSpec) -> Plan:
    """``plan`` with each written-out Gelu (module docstring) as one Gelu node calling ``gelu``
    (the backend's own Gelu kernel) with ``approximate`` "none" or "tanh"; the same plan object
    when there is none. A node of the chain counts only when it resolved to one of Mithril's
    kernels (a user's register_op over Erf, say, keeps its node). Nodes are replaced, never
    changed; the Gelu node keeps the Erf's or Tanh's name and runs where the chain's last node ran."""
    made = {o: pn for pn in plan.nodes for o in pn.outputs}
    readers: dict[int, list[PlanNode]] = defaultdict(list)
    for pn in plan.nodes:
        for v in dict.fromkeys(reads_of(pn)):
            readers[id(v)].append(pn)
    counts = Counter(v for pn in plan.nodes for v in reads_of(pn))
    outputs = set(plan.outputs)

    def ours(pn, op_type, arity):
        return pn is not None and pn.op_type == op_type and pn.domain == "" and mithril_kernel(pn) and \
            not pn.subgraphs and len(pn.inputs) == arity and len(pn.outputs) == 1

    def alone(v):
        """v's one reader, where v is an intermediate nothing else reads; else None."""
        if v is None or v.kind != "node" or counts[v] != 1 or v in outputs:
            return None
        return readers[id(v)][0]

    def split(pn, want):
        """The other operand of a binary node one of whose operands is a constant near ``want``;
        None where neither is."""
        a, b = pn.inputs
        if _near(_constant(b), want):
            return a
        if _near(_constant(a), want):
            return b
        return None

    def producer(v, op_type, arity=2):
        pn = made.get(v)
        return pn if ours(pn, op_type, arity) and alone(v) is not None else None

    def tail(act, x):
        """From the Erf/Tanh node ``act`` of x: (the chain's nodes after it, its last node), or None.
        Add(., 1) -> Mul(x, .) -> Mul(., 0.5), or Add(., 1) -> Mul(Mul(x, 0.5), .)."""
        add = alone(act.outputs[0])
        if not ours(add, "Add", 2) or split(add, 1.0) is not act.outputs[0]:
            return None
        mul = alone(add.outputs[0])
        if not ours(mul, "Mul", 2):
            return None
        other = mul.inputs[0] if mul.inputs[1] is add.outputs[0] else mul.inputs[1]
        if other is x:
            half = alone(mul.outputs[0])
            if ours(half, "Mul", 2) and split(half, 0.5) is mul.outputs[0]:
                return [add, mul, half], half
            return None
        h = producer(other, "Mul")
        if h is not None and split(h, 0.5) is x:
            return [h, add, mul], mul
        return None

    def erf_chain(erf):
        z = erf.inputs[0]
        scale = made.get(z)
        if alone(z) is None:
            return None
        if ours(scale, "Div", 2) and _near(_constant(scale.inputs[1]), _SQRT2):
            x = scale.inputs[0]
        elif ours(scale, "Mul", 2):
            x = split(scale, 1 / _SQRT2)
        else:
            return None
        found = tail(erf, x) if x is not None else None
        return (x, [scale, erf, *found[0]], found[1], "none") if found else None

    def tanh_chain(tanh):
        scaled = producer(tanh.inputs[0], "Mul")
        inner = split(scaled, _TANH_SCALE) if scaled is not None else None
        add = producer(inner, "Add") if inner is not None else None
        if add is None:
            return None
        for x, cubic in (add.inputs, add.inputs[::-1]):
            times = producer(cubic, "Mul")
            cube = cube_of(split(times, _CUBIC), x) if times is not None else None
            found = tail(tanh, x) if cube is not None else None
            if found:
                return x, [*cube, times, add, scaled, tanh, *found[0]], found[1], "tanh"
        return None

    def cube_of(v, x):
        """The nodes that make ``v`` as x^3: Pow(x, 3), or Mul(Mul(x, x), x) in either order (the
        plan writes a constant Pow of 3 so); None otherwise."""
        pow_ = producer(v, "Pow")
        if pow_ is not None:
            return [pow_] if pow_.inputs[0] is x and _near(_constant(pow_.inputs[1]), 3.0) else None
        outer = producer(v, "Mul")
        if outer is None or x not in outer.inputs:
            return None
        square = producer(outer.inputs[1] if outer.inputs[0] is x else outer.inputs[0], "Mul")
        if square is not None and square.inputs[0] is x and square.inputs[1] is x:
            return [square, outer]
        return None

    index = {id(pn): i for i, pn in enumerate(plan.nodes)}
    fused: dict[int, PlanNode] = {}
    gone: set[int] = set()
    for pn in plan.nodes:
        if ours(pn, "Erf", 1):
            found = erf_chain(pn)
        elif ours(pn, "Tanh", 1):
            found = tanh_chain(pn)
        else:
            continue
        if found is None:
            continue
        x, chain, last, approximate = found
        y = last.outputs[0]
        if x is None or x.dtype is None or y.dtype != x.dtype or y.shape != x.shape or \
                any(id(c) in gone or id(c) in fused for c in chain):
            continue
        first = min(index[id(c)] for c in chain)
        # The new node reads x where ``last`` ran: no node between may have freed it.
        if any(x in other.frees for other in plan.nodes[first:index[id(last)]] if other not in chain):
            continue
        between = {c.outputs[0] for c in chain if c is not last}
        fused[id(last)] = dataclasses.replace(
            pn, op_type="Gelu", spec=gelu, inputs=(x,), outputs=last.outputs,
            attributes={"approximate": approximate}, defaults={}, kwargs={"approximate": approximate},
            runtime=tuple(a for a in RUNTIME_ARGUMENTS if a in gelu.accepts),
            frees=tuple(dict.fromkeys(v for c in chain for v in c.frees if v not in between)))
        gone.update(id(c) for c in chain if c is not last)
    if not fused:
        return plan
    nodes = [fused.get(id(pn), pn) for pn in plan.nodes if id(pn) not in gone]
    return dataclasses.replace(plan, nodes=nodes)


__all__ = ["fuse_gelu"]
