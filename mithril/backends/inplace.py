"""Activations that write into their input, in the forward programs of NumPy and Torch.

A Clip or Relu whose input is the result of a Conv, ConvTranspose, Gemm or MatMul that nothing
else reads (not another node, not a subgraph, not a graph output) clamps that array where it lies
instead of allocating a second one: the convolution made it for this node alone. MobileNetV2 at
224x224 runs 35 Clips (ReLU6) on arrays of up to 4.6 MiB; with them in place a process's fastest
call took 25.4-26.0 ms instead of 27.7-29.4 (two processes of each, 15 s of calls, on the noisy
2-CPU host, whose medians are too noisy to quote). The rewrite happens on a copy of the plan's
node list when the forward program is printed (``Backend.forward_plan``); NumPy's gradient
program (:mod:`.vjp`), which reads an activation's input again, keeps the plain kernels.

The in-place kernels live with their backend (:mod:`.numpy.inplace`, :mod:`.torch.inplace`) and
still check what they are given at run time: anything they cannot overwrite safely (a read-only
or bfloat16 NumPy array; a Torch tensor autograd records, or one torch.compile traces) goes to
the kernel they replace.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from .plan import Plan, PlanNode, reads_of

# Ops whose kernels return an array of their own (never an input, a constant or a view
# of one): the activation after them may overwrite it.
FRESH_RESULTS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})


def mithril_kernel(pn: PlanNode) -> bool:
    """Whether ``pn`` runs one of Mithril's kernels (not a user's, registered over it)."""
    return pn.spec is not None and getattr(pn.spec.fn, "__module__", "").startswith("mithril.backends.")


def _readers(plan: Plan) -> Counter:
    return Counter(v for pn in plan.nodes for v in reads_of(pn))


def in_place_activations(plan: Plan, swaps: dict) -> Plan:
    """``plan`` with each eligible activation (see the module docstring) calling its in-place
    kernel; the same plan object when there is none. ``swaps`` maps ``(domain, op_type)`` to
    ``(kernel, in-place kernel)``: a node is swapped only when it resolved to that kernel. Nodes
    are replaced, never changed."""
    made = {o: pn for pn in plan.nodes for o in pn.outputs}
    readers = _readers(plan)
    outputs = set(plan.outputs)
    nodes: list[PlanNode] = []
    changed = False
    for pn in plan.nodes:
        swap = swaps.get((pn.domain, pn.op_type))
        x = pn.inputs[0] if pn.inputs else None
        producer = made.get(x) if x is not None else None
        if (swap is not None and pn.spec is not None and pn.spec.fn is swap[0] and producer is not None
                and producer.op_type in FRESH_RESULTS and producer.domain == "" and mithril_kernel(producer)
                and readers[x] == 1 and x not in outputs and not pn.subgraphs):
            pn = dataclasses.replace(pn, spec=dataclasses.replace(pn.spec, fn=swap[1]))
            changed = True
        nodes.append(pn)
    return dataclasses.replace(plan, nodes=nodes) if changed else plan


__all__ = ["FRESH_RESULTS", "in_place_activations"]
