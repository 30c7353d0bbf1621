"""Node patterns GGML runs as one ggml op: exporters write GELU as ``x * 0.5 * (1 + erf(x / sqrt 2))``
(five nodes; ggml has no erf kernel, the Erf rule composes one from ``ggml_gelu_erf`` and a
series); the pattern becomes one ``Gelu`` node, which ``ggml_gelu_erf`` computes exactly in float32.

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
        if any(nodes[c].domain != "" or c in drop for c in chain):
            continue
        end = nodes[chain[-1]]
        fused = replace(erf, op_type="Gelu", inputs=(x,), outputs=end.outputs,
                        kwargs={"approximate": "none"}, label=f"{erf.label} (GELU of {len(chain)} nodes)")
        if not supported(fused):
            continue
        nodes[chain[-1]] = fused
        drop.update(chain[:-1])
    return [pn for i, pn in enumerate(nodes) if i not in drop]


__all__ = ["fuse_gelu"]
