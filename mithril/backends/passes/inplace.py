"""Activations that write into their input, in the forward programs of NumPy and Torch.

A Clip or Relu whose input is the result of a Conv, ConvTranspose, Gemm or MatMul that nothing
else reads (not another node, not a subgraph, not a graph output) clamps that array where it lies
instead of allocating a second one: the convolution made it for this node alone. MobileNetV2 at
224x224 runs 35 Clips (ReLU6) on arrays of up to 4.6 MiB; with them in place a process's fastest
call took 25.4-26.0 ms instead of 27.7-29.4 (two processes of each, 15 s of calls, on the noisy
2-CPU host, whose medians are too noisy to quote). The rewrite happens on a copy of the plan
when the forward program is printed (``Backend.forward_plan``); NumPy's gradient program
(:mod:`mithril.backends.vjp`), which reads an activation's input again, keeps the plain kernels.

The in-place kernels live with their backend (:mod:`mithril.backends.numpy.inplace`,
:mod:`mithril.backends.torch.inplace`) and still check what they are given at run time: anything
they cannot overwrite safely (a read-only or bfloat16 NumPy array; a Torch tensor autograd
records, or one torch.compile traces) goes to the kernel they replace.
"""

from __future__ import annotations

from dataclasses import replace

from ..plan import Plan, PlanIndex
from .base import PlanPass, run_passes
from .match import mithril_kernel

# Ops whose kernels return an array of their own (never an input, a constant or a view
# of one): the activation after them may overwrite it.
FRESH_RESULTS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})


class InPlaceActivations(PlanPass):
    """Each eligible activation (module docstring) calling its in-place kernel. ``swaps`` maps
    ``(domain, op_type)`` to ``(kernel, in-place kernel)``: a node is swapped only when it
    resolved to that kernel."""

    name = "in-place-activations"

    def __init__(self, swaps: dict):
        self.swaps = swaps

    def run(self, index: PlanIndex) -> bool:
        changed = False
        for pn in list(index.plan.nodes):
            swap = self.swaps.get((pn.domain, pn.op_type))
            if swap is None or pn.spec is None or pn.spec.fn is not swap[0] or pn.subgraphs or not pn.inputs:
                continue
            x = pn.inputs[0]
            producer = index.producer(x)
            if (producer is not None and producer.op_type in FRESH_RESULTS and producer.domain == ""
                    and mithril_kernel(producer) and index.only_reader(x) is pn):
                index.replace(pn, replace(pn, spec=replace(pn.spec, fn=swap[1])))
                changed = True
        return changed


def in_place_activations(plan: Plan, swaps: dict) -> Plan:
    """``plan`` after :class:`InPlaceActivations`; the same plan object when nothing is swapped."""
    return run_passes(plan, [InPlaceActivations(swaps)])


__all__ = ["FRESH_RESULTS", "InPlaceActivations", "in_place_activations"]
