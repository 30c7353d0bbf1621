"""Node patterns GGML runs as one ggml op: exporters write GELU as ``x * 0.5 * (1 + erf(x / sqrt 2))``
(five nodes; ggml has no erf kernel, the Erf rule composes one from ``ggml_gelu_erf`` and a
series); the pattern becomes one ``Gelu`` node, which ``ggml_gelu_erf`` computes exactly in float32.
GPT-2's tanh form (``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, nine nodes) becomes one
``Gelu(approximate="tanh")``, computed through ggml's vectorized silu (the Gelu rule says how).

Only patterns whose scalars are constants are fused (a float initializer that is a parameter may
be given another value at run time), and only when the fused node runs in ggml: a node left to
NumPy must be the plan's own, with its own kernel.
"""

from __future__ import annotations

from dataclasses import replace
from math import sqrt

import numpy as np

from ..plan import Plan, PlanNode, PlanValue, reads_of


def _scalar(v: PlanValue | None) -> float | None:
    if v is None or v.kind != "constant" or np.size(v.value) != 1:
        return None
    return float(np.asarray(v.value).reshape(()))


def _close(a: float | None, b: float) -> bool:
    return a is not None and abs(a - b) <= 1e-6 * abs(b)


def fuse_gelu(plan: Plan, supported) -> list[PlanNode]:
    """The plan's nodes with each erf-GELU chain replaced by one ``Gelu`` node (when
    ``supported(node)`` says the fused node runs in ggml)."""
    nodes = list(plan.nodes)
    readers: dict[PlanValue, list[int]] = {}
    for i, pn in enumerate(nodes):
        for v in reads_of(pn):
            readers.setdefault(v, []).append(i)
    producer = {pn.outputs[0]: i for i, pn in enumerate(nodes) if len(pn.outputs) == 1}
    outputs = set(plan.outputs)

    def only_reader(v: PlanValue) -> int | None:
        r = readers.get(v, [])
        return r[0] if len(r) == 1 and v not in outputs else None

    def other(pn: PlanNode, v: PlanValue) -> PlanValue | None:
        """The input of a binary node that is not ``v``."""
        a, b = pn.inputs[0], pn.inputs[1]
        return b if a is v else a if b is v else None

    drop: set[int] = set()

    def fuse(anchor: PlanNode, x: PlanValue, chain: list[int], approximate: str, what: str) -> None:
        """One Gelu node in place of ``chain`` (its last node's outputs), when ggml runs it."""
        if any(nodes[c].domain != "" or c in drop for c in chain):
            return
        fused = replace(anchor, op_type="Gelu", inputs=(x,), outputs=nodes[chain[-1]].outputs,
                        kwargs={"approximate": approximate}, label=f"{anchor.label} ({what} of {len(chain)} nodes)")
        if supported(fused):
            nodes[chain[-1]] = fused
            drop.update(chain[:-1])

    for i, erf in enumerate(nodes):
        if erf.op_type != "Erf" or erf.domain != "" or i in drop:
            continue
        d = nodes[producer[erf.inputs[0]]] if erf.inputs[0] in producer else None
        if d is None or d.domain != "" or not ((d.op_type == "Div" and _close(_scalar(d.inputs[1]), sqrt(2)))
                                               or (d.op_type == "Mul" and _close(_scalar(d.inputs[1]), 1 / sqrt(2)))):
            continue
        x = d.inputs[0]
        chain = [producer[erf.inputs[0]], i]
        j = only_reader(erf.outputs[0])
        if j is None or nodes[j].op_type != "Add" or not _close(_scalar(other(nodes[j], erf.outputs[0])), 1.0):
            continue
        if only_reader(d.outputs[0]) is None:
            continue
        chain.append(j)
        added = nodes[j].outputs[0]
        k = only_reader(added)
        if k is None or nodes[k].op_type != "Mul":
            continue
        chain.append(k)
        m = other(nodes[k], added)
        if m is x:  # x * (1 + erf) then * 0.5
            half = only_reader(nodes[k].outputs[0])
            if half is None or nodes[half].op_type != "Mul" or not _close(
                    _scalar(other(nodes[half], nodes[k].outputs[0])), 0.5):
                continue
            chain.append(half)
        elif _close(_scalar(m), 0.5):  # 0.5 * (1 + erf) then * x
            last = only_reader(nodes[k].outputs[0])
            if last is None or nodes[last].op_type != "Mul" or other(nodes[last], nodes[k].outputs[0]) is not x:
                continue
            chain.append(last)
        else:
            continue
        fuse(erf, x, chain, "none", "GELU")
    for i, tanh in enumerate(nodes):
        if tanh.op_type != "Tanh" or tanh.domain != "" or i in drop:
            continue
        found = _tanh_gelu(nodes, i, producer, only_reader, other)
        if found is None:
            continue
        x, chain = found
        fuse(tanh, x, chain, "tanh", "tanh GELU")
    return [pn for i, pn in enumerate(nodes) if i not in drop]


def _binary(nodes, producer, v, op_type: str):
    """The node making ``v`` when it is an ``op_type`` of the default domain with two inputs."""
    pn = nodes[producer[v]] if v in producer else None
    return pn if pn is not None and pn.op_type == op_type and pn.domain == "" and len(pn.inputs) == 2 else None


def _cube(nodes, producer, v, x, only_reader) -> list[int] | None:
    """The nodes making ``v = x^3``: ``Pow(x, 3)``, or ``(x * x) * x`` as the plan's passes
    rewrite a small whole power; None when ``v`` is not that."""
    power = _binary(nodes, producer, v, "Pow")
    if power is not None:
        return [producer[v]] if power.inputs[0] is x and _close(_scalar(power.inputs[1]), 3.0) else None
    outer = _binary(nodes, producer, v, "Mul")
    if outer is None or x not in outer.inputs:
        return None
    square = outer.inputs[1] if outer.inputs[0] is x else outer.inputs[0]
    inner = _binary(nodes, producer, square, "Mul")
    if inner is None or inner.inputs[0] is not x or inner.inputs[1] is not x or only_reader(square) is None:
        return None
    return [producer[square], producer[v]]


def _tanh_gelu(nodes, i, producer, only_reader, other):
    """``(x, chain)`` when ``nodes[i]`` (a Tanh) is the middle of GPT-2's GELU as exporters write
    it, ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` (``x^3``: see :func:`_cube`; the halving
    on ``x``, on ``1 + tanh`` or on the product): the chain's node indices, the last one writing
    the result, every value between read only inside the chain. None otherwise."""
    def scalar_of(pn, v):
        return _scalar(other(pn, v)) if pn is not None else None

    scaled = _binary(nodes, producer, nodes[i].inputs[0], "Mul")  # sqrt(2/pi) * inner
    if scaled is None:
        return None
    inner = next((v for v in scaled.inputs if _close(scalar_of(scaled, v), sqrt(2 / np.pi))), None)
    add = _binary(nodes, producer, inner, "Add") if inner is not None else None  # x + 0.044715 x^3
    if add is None:
        return None
    for x, cubic in (add.inputs, add.inputs[::-1]):
        term = _binary(nodes, producer, cubic, "Mul")  # 0.044715 * x^3
        cube = next((v for v in term.inputs if _close(scalar_of(term, v), 0.044715)), None) if term else None
        cubing = _cube(nodes, producer, cube, x, only_reader) if cube is not None else None
        if cubing is not None:
            break
    else:
        return None
    chain = cubing + [producer[cubic], producer[inner], producer[scaled.outputs[0]], i]
    for v in (cube, cubic, inner, scaled.outputs[0]):
        if only_reader(v) is None:
            return None
    j = only_reader(nodes[i].outputs[0])  # 1 + tanh
    if j is None or nodes[j].op_type != "Add" or not _close(_scalar(other(nodes[j], nodes[i].outputs[0])), 1.0):
        return None
    chain.append(j)
    one_plus = nodes[j].outputs[0]
    k = only_reader(one_plus)
    if k is None or nodes[k].op_type != "Mul":
        return None
    m = other(nodes[k], one_plus)
    half_x = _binary(nodes, producer, m, "Mul") if m is not None else None
    if half_x is not None and x in half_x.inputs and _close(_scalar(other(half_x, x)), 0.5) \
            and only_reader(m) == k:  # (0.5 x) * (1 + tanh)
        return x, chain[:1] + [producer[m]] + chain[1:] + [k]
    last = only_reader(nodes[k].outputs[0])
    if last is None or nodes[last].op_type != "Mul":
        return None
    rest = other(nodes[last], nodes[k].outputs[0])
    if (m is x and _close(_scalar(rest), 0.5)) or (_close(_scalar(m), 0.5) and rest is x):
        return x, chain + [k, last]  # x * (1 + tanh) * 0.5, or 0.5 * (1 + tanh) * x
    return None


__all__ = ["fuse_gelu"]
