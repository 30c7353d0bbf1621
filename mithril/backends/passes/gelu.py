"""Gelu written out as elementwise ops, found once for every backend that runs it as one op.

Exporters before ONNX's Gelu op (opset 20) spell it out. ``torch.onnx.export`` of BERT's
activation gives the exact form, five nodes::

    Div(x, 1.4142135) -> Erf -> Add(., 1) -> Mul(x, .) -> Mul(., 0.5)

and GPT-2's ``gelu_new`` the tanh form, eight::

    Pow(x, 3) -> Mul(., 0.044715) -> Add(x, .) -> Mul(., 0.7978846) -> Tanh -> Add(., 1) -> Mul(h, .)
    with h = Mul(x, 0.5)

Operands of Add and Mul come in either order; ``x / sqrt(2)`` also as ``Mul(x, 0.70710677)``; x^3
also as ``Mul(Mul(x, x), x)`` (the plan makes a constant Pow of 3 so); the halving on x first
(``(0.5 x) * (1 + f)``), on the product last (``x * (1 + f) * 0.5``) or on ``1 + f`` before x
(``(1 + f) * 0.5 * x``). Only constants the program embeds count, each a single value within 1e-6
(relative) of the one above; every intermediate result is read by the chain alone (not by another
node, a subgraph or as a graph output), and the result has x's shape and dtype.

:func:`match_gelu` finds a chain from its Erf or Tanh node; :class:`FuseGelu` replaces each chain
by the node its backend makes of the match (the kernel form for Torch, the ggml rule's form for
GGML), which runs where the chain's last node ran.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..plan import RUNTIME_ARGUMENTS, PlanIndex, PlanNode, PlanValue
from ..registry import KernelSpec
from .base import PlanPass
from .match import chain_frees, constant_scalar, mithril_kernel, near, other_operand, reads_stay_alive

_SQRT2 = math.sqrt(2.0)
_TANH_SCALE = math.sqrt(2.0 / math.pi)
_CUBIC = 0.044715


@dataclass
class GeluMatch:
    """One written-out Gelu: its input ``x``, its nodes in plan order (``anchor``, the Erf or
    Tanh, among them; ``last`` writes the result) and ``approximate`` ("none" or "tanh")."""

    x: PlanValue
    chain: list[PlanNode]
    anchor: PlanNode
    last: PlanNode
    approximate: str

    @property
    def frees(self) -> tuple[PlanValue, ...]:
        """What the node replacing the chain frees."""
        return chain_frees(self.chain, self.last)


def match_gelu(index: PlanIndex, act: PlanNode,
               accept: Callable[[PlanNode], bool] = lambda pn: True) -> GeluMatch | None:
    """The written-out Gelu whose Erf or Tanh node is ``act`` (see the module docstring), where
    ``accept`` takes each of its nodes; else None."""

    def ours(pn, op_type, arity):
        return pn is not None and pn.op_type == op_type and pn.domain == "" and not pn.subgraphs and \
            len(pn.inputs) == arity and len(pn.outputs) == 1 and accept(pn)

    def alone(v):
        """v's one reader, where v is an intermediate result nothing else reads; else None."""
        return index.only_reader(v) if v is not None and v.kind == "node" else None

    def producer(v, op_type, arity=2):
        pn = index.producer(v)
        return pn if ours(pn, op_type, arity) and alone(v) is not None else None

    def tail(act, x):
        """From the Erf/Tanh node ``act`` of x: (the chain's nodes after it, its last node), or None.
        Add(., 1) -> Mul(x, .) -> Mul(., 0.5); Add(., 1) -> Mul(Mul(x, 0.5), .); or
        Add(., 1) -> Mul(., 0.5) -> Mul(x, .)."""
        add = alone(act.outputs[0])
        if not ours(add, "Add", 2) or other_operand(add, 1.0) is not act.outputs[0]:
            return None
        mul = alone(add.outputs[0])
        if not ours(mul, "Mul", 2):
            return None
        other = mul.inputs[0] if mul.inputs[1] is add.outputs[0] else mul.inputs[1]
        if other is x:  # x * (1 + f) * 0.5
            half = alone(mul.outputs[0])
            if ours(half, "Mul", 2) and other_operand(half, 0.5) is mul.outputs[0]:
                return [add, mul, half], half
            return None
        if near(constant_scalar(other), 0.5):  # (1 + f) * 0.5 * x
            last = alone(mul.outputs[0])
            if ours(last, "Mul", 2) and x in last.inputs and mul.outputs[0] in last.inputs and \
                    last.inputs[0] is not last.inputs[1]:
                return [add, mul, last], last
            return None
        h = producer(other, "Mul")  # (0.5 x) * (1 + f)
        if h is not None and other_operand(h, 0.5) is x:
            return [h, add, mul], mul
        return None

    def erf_chain(erf):
        z = erf.inputs[0]
        scale = index.producer(z)
        if alone(z) is None:
            return None
        if ours(scale, "Div", 2) and near(constant_scalar(scale.inputs[1]), _SQRT2):
            x = scale.inputs[0]
        elif ours(scale, "Mul", 2):
            x = other_operand(scale, 1 / _SQRT2)
        else:
            return None
        found = tail(erf, x) if x is not None else None
        return (x, [scale, erf, *found[0]], found[1], "none") if found else None

    def tanh_chain(tanh):
        scaled = producer(tanh.inputs[0], "Mul")
        inner = other_operand(scaled, _TANH_SCALE) if scaled is not None else None
        add = producer(inner, "Add") if inner is not None else None
        if add is None:
            return None
        for x, cubic in (add.inputs, add.inputs[::-1]):
            times = producer(cubic, "Mul")
            cube = cube_of(other_operand(times, _CUBIC), x) if times is not None else None
            found = tail(tanh, x) if cube is not None else None
            if found:
                return x, [*cube, times, add, scaled, tanh, *found[0]], found[1], "tanh"
        return None

    def cube_of(v, x):
        """The nodes that make ``v`` as x^3: Pow(x, 3), or Mul(Mul(x, x), x) in either order; None
        otherwise."""
        pow_ = producer(v, "Pow")
        if pow_ is not None:
            return [pow_] if pow_.inputs[0] is x and near(constant_scalar(pow_.inputs[1]), 3.0) else None
        outer = producer(v, "Mul")
        if outer is None or x not in outer.inputs:
            return None
        square = producer(outer.inputs[1] if outer.inputs[0] is x else outer.inputs[0], "Mul")
        if square is not None and square.inputs[0] is x and square.inputs[1] is x:
            return [square, outer]
        return None

    if ours(act, "Erf", 1):
        found = erf_chain(act)
    elif ours(act, "Tanh", 1):
        found = tanh_chain(act)
    else:
        return None
    if found is None:
        return None
    x, chain, last, approximate = found
    y = last.outputs[0]
    if x is None or x.dtype is None or y.dtype != x.dtype or y.shape != x.shape:
        return None
    return GeluMatch(x, sorted(chain, key=index.position), act, last, approximate)


class FuseGelu(PlanPass):
    """Each written-out Gelu (module docstring) as the one node ``make(match)`` returns (None: the
    chain stays), run where the chain's last node ran. ``accept`` says which nodes may be part
    of a chain."""

    name = "fuse-gelu"

    def __init__(self, make: Callable[[GeluMatch], PlanNode | None],
                 accept: Callable[[PlanNode], bool] = lambda pn: True):
        self.make = make
        self.accept = accept

    def run(self, index: PlanIndex) -> bool:
        changed = False
        for act in list(index.plan.nodes):
            if act.op_type not in ("Erf", "Tanh") or act not in index:
                continue
            found = match_gelu(index, act, self.accept)
            # The new node reads x where the chain's last node ran: no node between may have freed it.
            if found is None or not reads_stay_alive(index, (found.x,), found.chain, found.last):
                continue
            node = self.make(found)
            if node is None:
                continue
            index.replace_nodes(found.chain, node, at=found.last)
            changed = True
        return changed


def gelu_kernel_pass(gelu: KernelSpec) -> FuseGelu:
    """:class:`FuseGelu` making one Gelu node that calls ``gelu`` (a backend's own Gelu kernel)
    with ``approximate`` "none" or "tanh", of chains whose nodes all resolved to Mithril's kernels
    (a user's register_op over Erf, say, keeps its node). The node keeps the Erf's or Tanh's name
    and frees what the chain freed. The chain's values differ from the kernel's by float rounding
    alone: the same function, computed in one pass instead of five or eight (torch's ``F.gelu``:
    209-303 us for BERT-small's five ops on a 128x1024 activation against 82-114 us, 2 threads)."""
    runtime = tuple(a for a in RUNTIME_ARGUMENTS if a in gelu.accepts)

    def make(m: GeluMatch) -> PlanNode:
        return replace(m.anchor, op_type="Gelu", spec=gelu, inputs=(m.x,), outputs=m.last.outputs,
                       attributes={"approximate": m.approximate}, defaults={},
                       kwargs={"approximate": m.approximate}, runtime=runtime, frees=m.frees)

    return FuseGelu(make, accept=mithril_kernel)


__all__ = ["FuseGelu", "GeluMatch", "gelu_kernel_pass", "match_gelu"]
