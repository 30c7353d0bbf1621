"""A convolution and what its kernel can apply as it stores, as one node: ``Conv -> Relu/Clip``,
``Conv -> Add`` (a residual block's end) and ``Conv -> Add -> Relu/Clip``, as onnxruntime's Conv+Add
and Conv+activation fusions do (one pass over memory instead of two or three).

The matching is written once here; each backend (C, Torch) subclasses :class:`FuseConvChains`
to say which nodes its kernels take and to make the fused node its own way. A chain is taken
where each intermediate result is read by the next node of the chain alone (not by another node,
a subgraph or as a graph output), and the Add's other operand (the residual) has the
convolution's result's fixed shape and dtype. Activations are matched first (through an Add where
one is between), then the Adds no activation follows.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..plan import PlanIndex, PlanNode, PlanValue
from .base import PlanPass
from .match import chain_frees


@dataclass
class ConvChain:
    """A convolution ``conv``, the Add of ``residual`` to its result (or None), then the
    activation ``act`` (or None)."""

    conv: PlanNode
    add: PlanNode | None = None
    residual: PlanValue | None = None
    act: PlanNode | None = None

    @property
    def nodes(self) -> list[PlanNode]:
        return [pn for pn in (self.conv, self.add, self.act) if pn is not None]

    @property
    def last(self) -> PlanNode:
        return self.nodes[-1]

    @property
    def frees(self) -> tuple[PlanValue, ...]:
        """What a node replacing the chain frees."""
        return chain_frees(self.nodes, self.last)


class FuseConvChains(PlanPass):
    """Finds each chain (module docstring) and puts the node :meth:`make` returns in its place,
    where the convolution ran (``at_conv``) or where the chain's last node ran. A subclass says
    which convolutions, Adds and activations its kernels take."""

    name = "fuse-conv-chains"
    at_conv = False

    def takes_conv(self, index: PlanIndex, conv: PlanNode) -> bool:
        """Whether ``conv`` is a convolution whose kernel can apply what follows it."""
        raise NotImplementedError

    def takes_residual(self, index: PlanIndex, conv: PlanNode, add: PlanNode, residual: PlanValue) -> bool:
        """Whether ``add`` (of ``residual`` to ``conv``'s result) may be fused into ``conv``."""
        raise NotImplementedError

    def takes_activation(self, index: PlanIndex, act: PlanNode, chain: ConvChain) -> bool:
        """Whether ``act`` may be fused after ``chain`` (a convolution, and its residual Add or none)."""
        raise NotImplementedError

    def make(self, index: PlanIndex, chain: ConvChain) -> PlanNode | None:
        """The node that runs ``chain``; None leaves it as it is."""
        raise NotImplementedError

    # -- matching --------------------------------------------------------------
    def conv_of(self, index: PlanIndex, v: PlanValue | None) -> PlanNode | None:
        """The convolution making ``v``, where ``v`` is its one result and read by one node alone."""
        conv = index.producer(v)
        if conv is None or len(conv.outputs) != 1 or index.only_reader(v) is None or not self.takes_conv(index, conv):
            return None
        return conv

    def residual_chain(self, index: PlanIndex, add: PlanNode) -> ConvChain | None:
        """``add`` as the Add of a residual to a convolution's result (either operand order)."""
        if add.op_type != "Add" or add.domain != "" or len(add.inputs) != 2 or None in add.inputs or add.subgraphs:
            return None
        for mine, theirs in (add.inputs, add.inputs[::-1]):
            conv = self.conv_of(index, mine)
            if conv is not None and theirs is not mine and mine.static_shape is not None and \
                    theirs.static_shape == mine.static_shape and theirs.dtype == mine.dtype and \
                    self.takes_residual(index, conv, add, theirs):
                return ConvChain(conv, add, theirs)
        return None

    def activation_chain(self, index: PlanIndex, act: PlanNode) -> ConvChain | None:
        """``act`` after a convolution, directly or through a residual Add."""
        if not act.inputs or act.inputs[0] is None or act.subgraphs:
            return None
        x = act.inputs[0]
        conv = self.conv_of(index, x)
        if conv is not None:
            chain = ConvChain(conv)
            if not self.takes_activation(index, act, chain):
                return None
            chain.act = act
            return chain
        add = index.producer(x)
        if add is None or index.only_reader(x) is not act:
            return None
        chain = self.residual_chain(index, add)
        if chain is None or not self.takes_activation(index, act, chain):
            return None
        chain.act = act
        return chain

    def run(self, index: PlanIndex) -> bool:
        changed = False
        for act in list(index.plan.nodes):
            if act.domain == "" and act.op_type in ("Relu", "Clip") and act in index:
                changed |= self.fuse(index, self.activation_chain(index, act))
        for add in list(index.plan.nodes):
            if add.domain == "" and add.op_type == "Add" and add in index:
                changed |= self.fuse(index, self.residual_chain(index, add))
        return changed

    def fuse(self, index: PlanIndex, chain: ConvChain | None) -> bool:
        node = self.make(index, chain) if chain is not None else None
        if node is None:
            return False
        index.replace_nodes(chain.nodes, node, at=chain.conv if self.at_conv else chain.last)
        return True


__all__ = ["ConvChain", "FuseConvChains"]
