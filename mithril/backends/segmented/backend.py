"""The segmented backend: the base of C and GGML, which run the nodes they have a rule for in
segments of their own (generated C, ggml graphs) and the others on NumPy, as onnxruntime's
execution providers do with its CPU provider.

``lower`` checks the input shapes are fixed, lets the client rewrite the nodes (its fusions),
asks every node's capability, applies the ``fallback`` policy (one warning listing the nodes
left to NumPy, or a refusal with ``fallback=None``), partitions the nodes into steps and hands
them to the client's :meth:`SegmentedBackend.compile_segments`, which renders, builds and
returns a :class:`~.program.SegmentedProgram`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from ...errors import FallbackWarning, KernelMissingError
from ..numpy.backend import NumpyBackend
from ..op_support import OpSupport, merge_ranges, registry_ranges
from ..plan import Plan, PlanNode
from .capability import capability
from .partition import Segment, partition
from .policy import apply_fallback, check_fallback, check_fixed_shapes
from ..registry import source_location
from .rules import RuleTable, qualified_name


@dataclass
class Partition:
    """A plan as a segmented backend runs it: ``nodes`` (the plan's, after the client's
    rewrites), each node's capability (why not native, None when native), the ``steps``
    (Segments and fallback nodes), and ``origin``: by id of a rewritten node, the plan node it
    stands for."""

    plan: Plan
    nodes: list[PlanNode]
    capability: list[tuple[PlanNode, str | None]]
    steps: list
    origin: dict[int, PlanNode] = field(default_factory=dict)

    @property
    def fallback(self) -> list[PlanNode]:
        return [s for s in self.steps if not isinstance(s, Segment)]


class SegmentedBackend(NumpyBackend):
    """A backend whose nodes run in native segments where its rules take them, and on NumPy
    between them (``fallback="numpy"``, warned once at compile) or not at all (``fallback=None``:
    compile refuses them, all listed). Its arrays are NumPy arrays.

    A client defines :meth:`native_rules` (its :class:`~.rules.RuleTable`) and
    :meth:`compile_segments`; it may rewrite the nodes first (:meth:`rewrite`)."""

    jit_by_default = False
    needs_static_shapes = True
    segment_type: type = Segment  # what partition() makes of each run of native nodes
    fallback_warning: type[Warning] = FallbackWarning
    missing_error: type[Exception] = KernelMissingError

    def __init__(self, dtype=None, device: str = "cpu", num_threads: int | None = None, *,
                 fallback: str | None = "numpy", device_mesh=None, **unknown):
        check_fallback(type(self).__name__, fallback)
        super().__init__(dtype, device, num_threads, device_mesh=device_mesh, **unknown)
        self.fallback = fallback

    def scope(self):
        return contextlib.nullcontext()  # the native code sets its own threads

    def set_num_threads(self, n: int) -> bool:
        """The threads of the programs lowered from now on (as ``num_threads=n``)."""
        return super().set_num_threads(n)

    # -- what the client defines ---------------------------------------------------------------
    @classmethod
    def native_rules(cls) -> RuleTable:
        """The rule table, every rule registered."""
        raise NotImplementedError

    def native_passes(self) -> list:
        """The plan passes (:mod:`mithril.backends.passes`) :meth:`rewrite` runs: the client's
        fusions of nodes its native code runs as one. None here."""
        return []

    def rewrite(self, plan: Plan) -> tuple[list[PlanNode], dict[int, PlanNode]]:
        """The nodes to partition (the plan's, after :meth:`native_passes`) and, by id of each
        rewritten node, the plan node it stands for."""
        from ..passes import PassManager

        result = PassManager(self.native_passes())(plan)
        return list(result.plan.nodes), result.origins

    def compile_segments(self, part: Partition, *, file_path: str | None = None):
        """The program running ``part``'s steps: each segment rendered and built."""
        raise NotImplementedError

    # -- the shared steps ----------------------------------------------------------------------
    def lower(self, plan, *, file_path: str | None = None, gradient_checkpointing: bool = False):
        """Every input shape fixed (an error names those that are not), then
        :meth:`partition` and the client's :meth:`compile_segments`."""
        check_fixed_shapes(type(self).__name__, plan)
        return self.compile_segments(self.partition(plan), file_path=file_path)

    def capability(self, nodes, pending=frozenset()) -> list[tuple[PlanNode, str | None]]:
        """Each node with why it does not run natively (None: it does); see :mod:`.capability`."""
        return capability(nodes, self.native_rules(), pending)

    def apply_fallback(self, found: list[tuple[PlanNode, str | None]]) -> None:
        """The nodes of ``found`` with a reason: refused with ``fallback=None``, else warned once."""
        apply_fallback(type(self).__name__, self.native_rules().noun, self.fallback,
                       [(pn, why) for pn, why in found if why is not None], self.fallback_warning, self.missing_error)

    def partition(self, plan: Plan, refused: dict[str, str] | None = None, *, warn: bool = True) -> Partition:
        """:meth:`rewrite`, capability, the fallback policy, and the steps. ``refused``: by node
        label, why a node the rules take cannot be built after all (the client found out while
        building it); those nodes run on NumPy too. ``warn=False`` leaves the fallback policy
        (the warning, or the refusal with ``fallback=None``) to the caller."""
        nodes, origin = self.rewrite(plan)
        found = self.capability(nodes)
        if refused:
            found = [(pn, refused.get(pn.label) if why is None else why) for pn, why in found]
        if warn:
            self.apply_fallback(found)
        native = {id(pn) for pn, why in found if why is None}
        return Partition(plan, nodes, found, partition(nodes, lambda pn: id(pn) in native, self.segment_type), origin)

    def lower_clocked(self, plan: Plan):
        """The plan lowered with per-node clocks (its program's ``node_clocks()`` answers), or
        None where the native code has none: a profile then times each segment."""
        return None

    # -- what runs an op -------------------------------------------------------------------------
    @classmethod
    def op_ranges(cls, op_type: str, domain: str = "") -> list[OpSupport]:
        """Per opset range, the native rule (its rendering function and where it is defined)
        where one resolves, else the kernel NumPy runs as the fallback."""
        rules = cls.native_rules()
        fallback = registry_ranges(cls.name, op_type, domain)
        # A node is planned with the registry's kernel first: no rule runs below its first opset.
        first = fallback[0].first if fallback else 1

        def pick(opset):
            rule = rules.resolve(op_type, opset, domain)
            if rule is not None and opset >= first:
                fn = rule.function
                return OpSupport(rule.since, None, qualified_name(fn) if fn else "?", rules.noun,
                                 source_location(fn) if fn else "?", _rule_meta(rule))
            r = next((r for r in fallback if r.covers(opset)), None)
            return None if r is None else OpSupport(r.first, r.last, r.function, "NumPy fallback", r.location, r.meta)

        return merge_ranges([*(max(v, first) for v in rules.versions(op_type, domain)), *(r.first for r in fallback)],
                            pick)

    @classmethod
    def op_keys(cls) -> set[tuple[str, str]]:
        return super().op_keys() | cls.native_rules().ops()


def _rule_meta(rule) -> str:
    return f"folded={','.join(map(str, rule.folded))}" if rule.folded else ""


__all__ = ["Partition", "SegmentedBackend"]
