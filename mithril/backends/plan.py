"""The lowering plan: a specialized graph, resolved and bound once, for every consumer.

``build_plan(graph, opsets, backend)`` walks the graph once and returns a :class:`Plan`:

- each node's kernel resolved (the newest ``since`` <= the opset, the backend's override first);
- its arguments bound: inputs as :class:`PlanValue` s, attributes converted to Python values
  with the schema's defaults filled in, the context a kernel declares (``num_outputs``,
  ``opset``, ``node``), which inputs must be static (host) values;
- value lifetimes: after which node each value is read for the last time;
- nested plans for subgraph attributes (If branches, Loop/Scan bodies) and the outer values
  each reads;
- each value's shape and dtype where the graph knows them;
- on demand, its use-def index (:class:`PlanIndex`, ``plan.index``: who makes and who reads each
  value), which the plan passes (:mod:`.passes`) rewrite through.

Everything that runs or prints a graph consumes the plan and never looks back at the ONNX
nodes: :mod:`.interpret` runs it with NumPy (constant folding), :mod:`.emit_python` prints it
as Python source, :mod:`.vjp.program` extends it with gradient rules, and a renderer for
another language (C, ggml calls) receives it with the same shapes and dtypes. Like torch.fx's
``Graph`` after tracing, or tinygrad's linearized program handed to a renderer.

Problems are found here, at compile time, all at once: nodes of unknown domains, nodes without
a kernel (listed together), attributes a kernel does not implement. ``strict=False`` records a
node's problem on it instead (constant folding skips such nodes).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import onnx_ir as ir

from ..dtypes import np_dtype_of_onnx, tensor_array
from ..errors import MithrilError, UnsupportedAttributeError, UnsupportedDomainError, UnsupportedOpsError
from ..onnx_bridge.schema import (
    attribute_defaults,
    canonical_domain,
    convert_attribute,
    is_graph_attribute,
    max_outputs,
)
from .registry import REGISTRY, KernelRegistry, KernelSpec, NodeInfo, StandardKernels, missing_kernel_help

# Keyword arguments a kernel may declare that the runtime supplies (not the node).
RUNTIME_ARGUMENTS = ("xp", "rng", "ctx")


def attributes_of(node: ir.Node) -> dict[str, ir.Attr]:
    """``node.attributes`` as a plain dict (onnx_ir's is a UserDict, whose items() and values()
    cost a Python call per entry)."""
    attrs = node.attributes
    return getattr(attrs, "data", attrs)


def all_nodes(graph: ir.Graph):
    """``graph.all_nodes()``: every node, each followed by the nodes of its subgraphs (preorder),
    without onnx_ir's iterator, which costs ~5 us a node."""
    for node in graph:
        yield node
        attrs = attributes_of(node)
        if attrs:
            for attr in attrs.values():
                if attr.type == ir.AttributeType.GRAPH:
                    yield from all_nodes(attr.value)
                elif attr.type == ir.AttributeType.GRAPHS:
                    for sub in attr.value:
                        yield from all_nodes(sub)


def node_label(node: ir.Node, index: int) -> str:
    """A node's name, or ``op_type#index`` when it has none."""
    return node.name or f"{node.op_type}#{index}"


@dataclass(eq=False)
class PlanValue:
    """One value of a plan: a graph input, a parameter, a constant, or a node's output.

    ``shape`` holds ints for known dims, strings for symbolic ones, None for unknown ones (and
    is None when even the rank is unknown); ``dtype`` is a NumPy dtype (``object`` for
    strings), None for sequences, optionals and values of unknown type."""

    id: int
    name: str
    shape: tuple[int | str | None, ...] | None
    dtype: np.dtype | None
    kind: str  # "input" | "param" | "constant" | "node"
    # A constant's tensor (kind == "constant"), read as an array on first use; a parameter's
    # value in the file (kind == "param", an initializer), which only :meth:`frozen_scalar` reads.
    tensor: Any = field(default=None, repr=False)
    _array: np.ndarray | None = field(default=None, repr=False)
    # A parameter nothing differentiates or updates (compile sets it: an inference compile's, or one
    # trainable_keys leaves out). A pass may read a one-element one's file value (``read_as_constant``
    # records it) and build it into a fused node; ``baked`` then says so, and evaluate refuses
    # another value for it.
    frozen: bool = field(default=False, repr=False, kw_only=True)
    read_as_constant: bool = field(default=False, repr=False, kw_only=True)
    baked: bool = field(default=False, repr=False, kw_only=True)

    def frozen_scalar(self) -> float | None:
        """The file value of a frozen one-element float parameter (an exporter's constant such as
        the sqrt(2) of a Gelu, which torch.onnx's dynamo exporter writes as an initializer);
        None for anything else."""
        if self.kind != "param" or not self.frozen or self.tensor is None or self.static_shape is None:
            return None
        if int(np.prod(self.static_shape)) != 1 or self.dtype is None or self.dtype.kind != "f":
            return None
        self.read_as_constant = True
        return float(tensor_array(self.tensor).reshape(()))

    @property
    def value(self) -> np.ndarray | None:
        """A constant's array (an initializer the program embeds); None for other values."""
        if self._array is None and self.kind == "constant":
            if self.tensor is None:
                raise MithrilError(f"initializer {self.name!r} has no value")
            self._array = tensor_array(self.tensor)
        return self._array

    @property
    def static_shape(self) -> tuple[int, ...] | None:
        """The shape when every dim is known."""
        if self.shape is None or not all(isinstance(d, int) for d in self.shape):
            return None
        return self.shape  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"PlanValue({self.id}, {self.name!r}, {self.kind}, shape={self.shape}, dtype={self.dtype})"


@dataclass(eq=False)
class PlanNode:
    """One node: its kernel, its bound arguments and what dies after it."""

    index: int  # preorder position among all nodes of the graph (subgraphs included)
    label: str  # the node's name, or op_type#index
    op_type: str
    domain: str  # canonical ("" for ai.onnx)
    opset: int
    spec: KernelSpec | None  # None only in a non-strict plan, with ``problem`` saying why
    inputs: tuple[PlanValue | None, ...]
    outputs: tuple[PlanValue, ...]
    # Every attribute the node sets, as Python values; and the schema's defaults for the others.
    attributes: dict[str, Any]
    defaults: dict[str, Any]
    # What the kernel receives by keyword: its attributes (set, else default) and the context it
    # declares (num_outputs, opset, node); runtime arguments (xp, rng) are the consumer's.
    kwargs: dict[str, Any]
    runtime: tuple[str, ...]  # which of RUNTIME_ARGUMENTS (xp, rng, ctx) the kernel declares
    subgraphs: dict[str, Plan | tuple[Plan, ...]]
    # The op may return several outputs (the result is a tuple even when one is asked for).
    multi_output: bool
    # Values read for the last time by this node, and its outputs nobody reads.
    frees: tuple[PlanValue, ...] = ()
    problem: str | None = None

    @property
    def static_inputs(self) -> tuple[int, ...]:
        return self.spec.static_inputs if self.spec is not None else ()

    def input_is_static(self, position: int) -> bool:
        return position in self.static_inputs


@dataclass(eq=False)
class Plan:
    """A (sub)graph ready to run: values, nodes in order, outputs."""

    backend: str
    opsets: dict[str, int]
    inputs: list[PlanValue]  # graph inputs (a subgraph's parameters)
    params: list[PlanValue]  # initializers read from ``params`` (trained, or given at run time)
    constants: list[PlanValue]  # initializers the program embeds
    nodes: list[PlanNode]
    outputs: list[PlanValue]
    outer: list[PlanValue] = field(default_factory=list)  # values read from enclosing graphs
    _index: PlanIndex | None = field(default=None, init=False, repr=False)

    @property
    def index(self) -> PlanIndex:
        """The plan's use-def index (:class:`PlanIndex`), built on first use; rewrites of
        ``nodes`` go through it so that it stays true."""
        if self._index is None:
            self._index = PlanIndex(self)
        return self._index

    def __getstate__(self):
        # A copy builds its own index: this one's maps are keyed by the ids of these objects.
        return {**self.__dict__, "_index": None}

    def all_nodes(self):
        """Every node, subgraph nodes after their parent (the order of ``PlanNode.index``)."""
        for pn in self.nodes:
            yield pn
            for sub in pn.subgraphs.values():
                for p in sub if isinstance(sub, tuple) else (sub,):
                    yield from p.all_nodes()


def reads_of(pn: PlanNode):
    """The values a node reads: its inputs, then what its subgraphs read from enclosing graphs
    (a value read by a subgraph is alive until that node has run)."""
    for v in pn.inputs:
        if v is not None:
            yield v
    for sub in pn.subgraphs.values():
        for p in sub if isinstance(sub, tuple) else (sub,):
            yield from p.outer


# The position of a use that is a subgraph's read from an enclosing graph (not one of the node's inputs).
OUTER = -1


class PlanIndex:
    """Who makes and who reads each value of one plan (torch.fx keeps ``Node.users`` so), kept true
    by the rewrites made through it.

    A use is ``(node, position)``: ``position`` is the input it reads, or :data:`OUTER` where a
    subgraph of ``node`` reads the value from an enclosing graph. Such a read is a use by the
    node holding the subgraph (the value lives until that node has run) that no rewrite may fuse
    away: :meth:`only_reader` never answers for a value a subgraph reads, nor for a graph output.

    Rewrites replace nodes, never change them (a plan's nodes may be shared with the plan it was
    copied from), and rewrite the plan's own ``nodes`` list: rewrite a copy
    (``dataclasses.replace(plan, nodes=list(plan.nodes))``, as :class:`~.passes.PassManager` does)
    when the original must stay. ``origins`` maps the id of each node a rewrite put in to the node
    of the plan it stands for (a fused node to the chain's anchor), which profiles use.

    >>> index = plan.index                                       # doctest: +SKIP
    >>> relu = index.only_reader(conv.outputs[0])               # doctest: +SKIP
    >>> index.replace_nodes([conv, relu], fused, at=relu)       # doctest: +SKIP
    """

    def __init__(self, plan: Plan):
        self.plan = plan
        self.origins: dict[int, PlanNode] = {}
        self._producers: dict[PlanValue, PlanNode] = {}
        self._uses: dict[PlanValue, list[tuple[PlanNode, int]]] = {}
        self._positions: dict[int, int] | None = None
        for pn in plan.nodes:
            self._add(pn)

    # -- queries ---------------------------------------------------------------
    def producer(self, v: PlanValue | None) -> PlanNode | None:
        """The node of this plan that makes ``v``; None for inputs, constants and outer values."""
        return self._producers.get(v) if v is not None else None

    def uses(self, v: PlanValue) -> list[tuple[PlanNode, int]]:
        """Every read of ``v`` as ``(node, position)``, in node order (see the class docstring)."""
        uses = self._uses.get(v, ())
        if len(uses) < 2:
            return list(uses)
        return sorted(uses, key=lambda u: (self.position(u[0]), u[1]))

    def users(self, v: PlanValue) -> list[PlanNode]:
        """The nodes that read ``v``, each once, in node order."""
        return list(dict.fromkeys(pn for pn, _ in self.uses(v)))

    def is_output(self, v: PlanValue) -> bool:
        return v in self.plan.outputs

    def only_reader(self, v: PlanValue | None) -> PlanNode | None:
        """The one node reading ``v``, where it reads it once, as an input, and ``v`` is no graph
        output and no subgraph's read: the value a fusion may fold away. None otherwise."""
        uses = self._uses.get(v) if v is not None else None
        if not uses or len(uses) != 1 or uses[0][1] == OUTER or self.is_output(v):
            return None
        return uses[0][0]

    def position(self, pn: PlanNode) -> int:
        """``pn``'s place in the plan's nodes (KeyError when it is not there)."""
        if self._positions is None:
            self._positions = {id(n): i for i, n in enumerate(self.plan.nodes)}
        return self._positions[id(pn)]

    def __contains__(self, pn: PlanNode) -> bool:
        try:
            self.position(pn)
        except KeyError:
            return False
        return True

    def between(self, first: PlanNode, last: PlanNode) -> list[PlanNode]:
        """The nodes strictly between ``first`` and ``last``."""
        return self.plan.nodes[self.position(first) + 1:self.position(last)]

    def origin(self, pn: PlanNode) -> PlanNode:
        """The node of the plan that ``pn`` stands for (itself when no rewrite made it)."""
        return self.origins.get(id(pn), pn)

    # -- rewrites --------------------------------------------------------------
    def replace(self, old: PlanNode, new: PlanNode) -> None:
        """``new`` in ``old``'s place."""
        self.replace_nodes([old], new, at=old)

    def replace_nodes(self, old: Iterable[PlanNode], new: PlanNode, at: PlanNode) -> None:
        """``old`` (nodes of the plan) removed and ``new`` put where ``at`` (one of them) was: a
        fusion. ``new`` stands for ``at``'s origin. Values only ``old`` made and read go with them."""
        old = list(dict.fromkeys(old))
        if at not in old:
            raise ValueError("replace_nodes: `at` must be one of the replaced nodes")
        where = self.position(at)
        origin = self.origin(at)
        for pn in old:
            self._drop(pn)
            self.origins.pop(id(pn), None)
        nodes = self.plan.nodes
        nodes[where] = new
        if len(old) == 1:  # in place: every other node keeps its position
            del self._positions[id(at)]
            self._positions[id(new)] = where
        else:
            gone = {id(pn) for pn in old if pn is not at}
            nodes[:] = [pn for pn in nodes if id(pn) not in gone]
            self._positions = None
        self._add(new)
        if new is not origin:
            self.origins[id(new)] = origin

    def insert(self, new: PlanNode, before: PlanNode | None = None, origin: PlanNode | None = None) -> None:
        """``new`` put before ``before`` (after every node when None); ``origin``: the node of the
        plan it runs for, where it has one (a layout change's reorder runs for the node it feeds)."""
        nodes = self.plan.nodes
        nodes.insert(len(nodes) if before is None else self.position(before), new)
        self._positions = None
        self._add(new)
        if origin is not None:
            self.origins[id(new)] = self.origin(origin)

    def remove(self, nodes: Iterable[PlanNode]) -> None:
        """Removes ``nodes``; none of their results may be read by a node that stays, or be a
        graph output."""
        nodes = list(dict.fromkeys(nodes))
        gone = {id(pn) for pn in nodes}
        for pn in nodes:
            for o in pn.outputs:
                if self.is_output(o) or any(id(r) not in gone for r, _ in self._uses.get(o, ())):
                    raise ValueError(f"remove: {pn.label}'s result {o.name!r} is still read")
        for pn in nodes:
            self._drop(pn)
            self.origins.pop(id(pn), None)
        self.plan.nodes[:] = [pn for pn in self.plan.nodes if id(pn) not in gone]
        self._positions = None

    def redirect(self, old: PlanValue, new: PlanValue) -> None:
        """Every input reading ``old`` reads ``new`` instead (the readers are replaced by copies),
        and a graph output ``old`` becomes ``new``. A subgraph's read of ``old`` cannot be
        redirected (the subgraph's plan names it): that raises."""
        readers = self.users(old)
        if any(pos == OUTER for _, pos in self._uses.get(old, ())):
            raise ValueError(f"redirect: a subgraph reads {old.name!r}")
        for pn in readers:
            self.replace(pn, replace(pn, inputs=tuple(new if v is old else v for v in pn.inputs)))
        self.plan.outputs = [new if v is old else v for v in self.plan.outputs]

    # -- bookkeeping -----------------------------------------------------------
    def _add(self, pn: PlanNode) -> None:
        for o in pn.outputs:
            self._producers[o] = pn
        for i, v in enumerate(pn.inputs):
            if v is not None:
                self._insert_use(v, pn, i)
        for sub in pn.subgraphs.values():
            for p in sub if isinstance(sub, tuple) else (sub,):
                for v in p.outer:
                    self._insert_use(v, pn, OUTER)

    def _insert_use(self, v: PlanValue, pn: PlanNode, position: int) -> None:
        self._uses.setdefault(v, []).append((pn, position))

    def _drop(self, pn: PlanNode) -> None:
        for o in pn.outputs:
            if self._producers.get(o) is pn:
                del self._producers[o]
        for v in reads_of(pn):
            uses = self._uses.get(v)
            if uses:
                uses[:] = [u for u in uses if u[0] is not pn]
                if not uses:
                    del self._uses[v]


def squeeze_output_problem(pn: PlanNode) -> str | None:
    """For a Squeeze, whether the output shape it gives (empty ``axes`` squeeze every 1, as
    onnxruntime and the NumPy kernel do) is the one the plan allocates: ONNX shape inference keeps
    every dim there. Emit-based backends (C, GGML), which trust the plan's shapes, refuse it."""
    if pn.op_type != "Squeeze" or pn.inputs[0].static_shape is None or pn.outputs[0].static_shape is None:
        return None
    x, y = pn.inputs[0].static_shape, pn.outputs[0].static_shape
    axes = pn.kwargs.get("axes")
    if axes is None and len(pn.inputs) > 1 and pn.inputs[1] is not None:
        if pn.inputs[1].kind != "constant":
            return None
        axes = [int(a) for a in np.asarray(pn.inputs[1].value).reshape(-1)]
    drop = {int(a) % len(x) for a in axes} if axes else {i for i, d in enumerate(x) if d == 1}
    want = tuple(d for i, d in enumerate(x) if i not in drop)
    if want != tuple(y):
        return f"squeezes {list(x)} to {list(want)}, but the inferred output shape is {list(y)}"
    return None


def first_output(out):
    """The one output asked of an op that may return several."""
    return out[0] if isinstance(out, tuple) else out


def check_outputs(out, count: int):
    """A kernel's results for a node with ``count`` outputs; too few is the kernel's error."""
    if not isinstance(out, (tuple, list)) or len(out) < count:
        got = len(out) if isinstance(out, (tuple, list)) else 1
        raise ValueError(f"the kernel returned {got} output(s) but the node has {count}")
    return out


def bind_attributes(spec: KernelSpec, attributes: dict[str, Any], defaults: dict[str, Any], *,
                    label: str, op_type: str, opset: int, kind: str = "kernel",
                    graph_attributes: Iterable[str] = ()) -> dict[str, Any]:
    """The attributes ``spec`` receives: the node's values, else the schema's defaults (but
    never for ``graph_attributes``, which the node sets as subgraphs). A set, non-default
    attribute the function does not accept is refused, naming the node."""
    kwargs: dict[str, Any] = {}
    for name, value in attributes.items():
        if name not in spec.accepts and not spec.accepts_var_keyword:
            if name in defaults and _same(defaults[name], value):
                continue
            raise UnsupportedAttributeError(
                f"{kind} {spec.name} does not implement attribute {name}={value!r}",
                node=label, op_type=op_type, opset=opset,
            )
        kwargs[name] = value
    for name, default in defaults.items():
        if name not in kwargs and name not in attributes and name not in graph_attributes and (
                name in spec.accepts or spec.accepts_var_keyword):
            kwargs[name] = default
    return kwargs


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape and bool(np.all(a == b))
    if isinstance(a, float) and isinstance(b, float):
        return a == b or abs(a - b) <= 1e-7 * max(1.0, abs(a))
    return a == b


def value_dtype(value: ir.Value) -> np.dtype | None:
    """The NumPy dtype of a tensor value, None for other types or an unknown dtype."""
    if value.dtype is None or value.type is None or not isinstance(value.type, ir.TensorType):
        return None
    code = int(value.dtype)
    try:
        return _NP_DTYPES[code]
    except KeyError:
        pass
    try:
        dtype = np_dtype_of_onnx(code)
    except (KeyError, ValueError, TypeError):
        dtype = None
    _NP_DTYPES[code] = dtype
    return dtype


# ONNX element type -> NumPy dtype (None: none), as value_dtype found it: a plan reads every value's.
_NP_DTYPES: dict[int, np.dtype | None] = {}


def value_shape(value: ir.Value) -> tuple[int | str | None, ...] | None:
    if value.shape is None:
        return None
    dims = tuple(value.shape)
    if all(type(d) is int for d in dims):
        return dims
    return tuple(d if isinstance(d, int) else (str(d) if d is not None and str(d) not in ("", "None") else None)
                 for d in value.shape)


def outer_reads(graph: ir.Graph) -> set[ir.Value]:
    """Values a (sub)graph reads that it does not define itself."""
    defined: set[ir.Value] = set(graph.inputs) | set(graph.initializers.values())
    used: set[ir.Value] = set()
    for node in graph:
        used.update(v for v in node.inputs if v is not None)
        for attr in attributes_of(node).values():
            if is_graph_attribute(attr):
                for sub in attr.value if attr.type == ir.AttributeType.GRAPHS else [attr.value]:
                    used |= outer_reads(sub)
        defined.update(node.outputs)
    used.update(graph.outputs)
    return used - defined


def check_domains(graph: ir.Graph, backend: str = "*", registry: KernelRegistry = REGISTRY,
                  opsets: dict[str, int] | None = None) -> None:
    """Nodes of a domain no kernel is registered for (on ``backend``) are refused together,
    before any op lookup, saying how to register one. Model-local functions are inlined before
    lowering, so their domains never reach here."""
    supported = registry.domains(backend)
    bad = [(node_label(node, i), node.domain, node.op_type) for i, node in enumerate(all_nodes(graph))
           if canonical_domain(node.domain) not in supported]
    if bad:
        notes, hint = missing_kernel_help(backend, [(label, canonical_domain(d), op) for label, d, op in bad])
        raise UnsupportedDomainError(bad, backend=backend, opsets=opsets, notes=notes, hint=hint)


class _Builder:
    def __init__(self, opsets: dict[str, int], backend: str, param_names: set[str], strict: bool):
        self.opsets = opsets
        self.backend = backend
        self.param_names = param_names
        self.strict = strict
        self.values: dict[ir.Value, PlanValue] = {}
        self.missing: list[tuple[str, str, int]] = []
        self.missing_ops: list[tuple[str, str, str]] = []  # (label, domain, op_type) of each
        self.index = 0

    def value(self, v: ir.Value, kind: str = "node") -> PlanValue:
        pv = self.values.get(v)
        if pv is None:
            pv = PlanValue(len(self.values), v.name or "", value_shape(v), value_dtype(v), kind)
            self.values[v] = pv
        return pv

    def graph(self, graph: ir.Graph, top: bool) -> Plan:
        inputs = [self.value(v, "param" if top and v.name in self.param_names else "input") for v in graph.inputs]
        params = [pv for pv in inputs if pv.kind == "param"]
        constants = []
        for name, v in graph.initializers.items():
            if v in self.values:  # also a graph input: read from params or data like one
                continue
            if top and name in self.param_names:
                pv = self.value(v, "param")
                pv.tensor = v.const_value
                params.append(pv)
            else:
                pv = self.value(v, "constant")
                pv.tensor = v.const_value
                constants.append(pv)
        nodes = [self.node(node) for node in graph]
        plan = Plan(self.backend, self.opsets, inputs, params, constants, nodes,
                    [self.value(v) for v in graph.outputs])
        if not top:
            plan.outer = [self.values[v] for v in sorted(outer_reads(graph), key=lambda v: self.values[v].id)
                          if v in self.values]
        _set_lifetimes(plan)
        return plan

    def node(self, node: ir.Node) -> PlanNode:
        index = self.index
        self.index += 1
        label = node_label(node, index)
        domain = canonical_domain(node.domain)
        opset = self.opsets.get(domain, 1)
        spec = REGISTRY.resolve(node.op_type, opset, domain, self.backend)
        problem = None
        if spec is None:
            self.missing.append((label, node.op_type if not domain else f"{domain}::{node.op_type}", opset))
            self.missing_ops.append((label, domain, node.op_type))
            problem = "no kernel"
        inputs = tuple(None if v is None else self.value(v) for v in node.inputs)
        outputs = tuple(self.value(o) for o in node.outputs)
        attributes: dict[str, Any] = {}
        subgraphs: dict[str, Plan | tuple[Plan, ...]] = {}
        graph_attrs = []
        for name, attr in attributes_of(node).items():
            if attr.is_ref():
                problem = problem or self.refuse(UnsupportedAttributeError(
                    f"attribute {name!r} refers to a function attribute outside a function body",
                    node=label, op_type=node.op_type, opset=opset))
            elif is_graph_attribute(attr):
                graph_attrs.append((name, attr))
            else:
                attributes[name] = convert_attribute(attr)
        defaults = attribute_defaults(node.op_type, opset, domain)
        kwargs: dict[str, Any] = {}
        if spec is not None:
            for name, attr in graph_attrs:
                if name not in spec.accepts and not spec.accepts_var_keyword:
                    problem = problem or self.refuse(UnsupportedAttributeError(
                        f"kernel {spec.name} takes no graph attribute {name!r}",
                        node=label, op_type=node.op_type, opset=opset))
            try:
                kwargs = bind_attributes(spec, attributes, defaults, label=label, op_type=node.op_type, opset=opset,
                                         graph_attributes=[name for name, _ in graph_attrs])
            except UnsupportedAttributeError as exc:
                problem = problem or self.refuse(exc)
            # Split-18 has an ONNX attribute of that name: where it is unset, the node's output count.
            if "num_outputs" in spec.accepts and kwargs.get("num_outputs") is None:
                kwargs["num_outputs"] = len(outputs)
            if "opset" in spec.accepts:
                kwargs["opset"] = opset
            if "node" in spec.accepts:
                kwargs["node"] = NodeInfo(label, node.op_type, domain, opset, tuple(o.dtype for o in outputs))
            if spec.standard_ops:  # a fused op: the standard kernels it runs, at the model's ai.onnx opset
                try:
                    kwargs["standard"] = StandardKernels(spec, self.opsets, self.backend,
                                                         NodeInfo(label, node.op_type, domain, opset))
                except MithrilError as exc:
                    problem = problem or self.refuse(exc)
        pn = PlanNode(
            index=index, label=label, op_type=node.op_type, domain=domain, opset=opset, spec=spec,
            inputs=inputs, outputs=outputs, attributes=attributes, defaults=defaults, kwargs=kwargs,
            runtime=tuple(a for a in RUNTIME_ARGUMENTS if spec is not None and a in spec.accepts),
            subgraphs=subgraphs, multi_output=max_outputs(node.op_type, opset, domain) > 1, problem=problem,
        )
        for name, attr in graph_attrs:
            if attr.type == ir.AttributeType.GRAPH:
                subgraphs[name] = self.graph(attr.value, top=False)
            else:
                subgraphs[name] = tuple(self.graph(g, top=False) for g in attr.value)
        return pn

    def refuse(self, exc: MithrilError) -> str:
        if self.strict:
            raise exc
        return str(exc)


def _set_lifetimes(plan: Plan) -> None:
    """Each node's ``frees``: the local values it reads last (a read from a subgraph counts at the
    node holding it), and its own outputs that nobody reads."""
    last_use: dict[PlanValue, int] = {}
    for i, pn in enumerate(plan.nodes):
        for v in pn.inputs:
            if v is not None:
                last_use[v] = i
        for sub in pn.subgraphs.values():
            for p in sub if isinstance(sub, tuple) else (sub,):
                for v in p.outer:
                    last_use[v] = i
    keep = set(plan.outputs)
    local = set(plan.inputs)
    for pn in plan.nodes:
        local.update(pn.outputs)
    frees: dict[int, list[PlanValue]] = {}
    for v, i in last_use.items():
        if v in local and v not in keep and v.kind not in ("param", "constant"):
            frees.setdefault(i, []).append(v)
    for i, pn in enumerate(plan.nodes):
        dead = frees.get(i, [])
        dead += [o for o in pn.outputs if o.name and o not in last_use and o not in keep]
        pn.frees = tuple(dict.fromkeys(dead))


def build_plan(graph: ir.Graph, opsets: dict[str, int], backend: str = "*", *,
               param_names: set[str] = frozenset(), strict: bool = True) -> Plan:
    """The plan of ``graph`` on ``backend`` ("*": the shared kernels only, as folding runs them).

    ``param_names`` are the initializers read from ``params`` at run time; the others become
    constants of the plan. Strict (compile): unknown domains, nodes without a kernel and
    unsupported attributes raise, missing kernels all listed in one error; otherwise each
    problem stays on its node."""
    if strict:
        check_domains(graph, backend, opsets=opsets)
    builder = _Builder(opsets, backend, set(param_names), strict)
    plan = builder.graph(graph, top=True)
    if builder.missing and strict:
        notes, hint = missing_kernel_help(backend, builder.missing_ops)
        raise UnsupportedOpsError(builder.missing, backend, notes=notes, hint=hint)
    return plan


def static_initializers(graph: ir.Graph, opsets: dict[str, int], backend: str = "*") -> set[str]:
    """Names of the initializers read at a kernel's static input position (a shape, axes,
    scales...) on ``backend``: those that a non-strict :func:`build_plan` with no parameters
    makes constants and binds at a ``static_inputs`` position, found without building the plan
    (only each node's kernel is resolved)."""
    constants: set[ir.Value] = set()
    _collect_constants(graph, constants)
    names: set[str] = set()
    for node in all_nodes(graph):
        domain = canonical_domain(node.domain)
        spec = REGISTRY.resolve(node.op_type, opsets.get(domain, 1), domain, backend)
        if spec is None or not spec.static_inputs:
            continue
        inputs = node.inputs
        for i in spec.static_inputs:
            if i < len(inputs) and (v := inputs[i]) is not None and v in constants:
                names.add(v.name or "")
    return names


def _collect_constants(graph: ir.Graph, out: set[ir.Value]) -> None:
    """The initializers of ``graph`` and its subgraphs that are not also graph inputs (a plan's
    ``constant`` values when no initializer is a parameter)."""
    inputs = set(graph.inputs)
    out.update(v for v in graph.initializers.values() if v not in inputs)
    for node in graph:
        for attr in attributes_of(node).values():
            if attr.type == ir.AttributeType.GRAPH:
                _collect_constants(attr.value, out)
            elif attr.type == ir.AttributeType.GRAPHS:
                for sub in attr.value:
                    _collect_constants(sub, out)


def plan_of_node(node: ir.Node, opsets: dict[str, int], backend: str = "*") -> PlanNode:
    """One node bound as :func:`build_plan` binds it (non-strict: problems stay on the node)."""
    builder = _Builder(opsets, backend, set(), strict=False)
    return builder.node(node)


__all__ = ["OUTER", "Plan", "PlanIndex", "PlanNode", "PlanValue", "build_plan", "bind_attributes", "check_domains",
           "check_outputs", "first_output", "node_label",
           "outer_reads", "plan_of_node", "reads_of", "squeeze_output_problem", "static_initializers", "value_dtype"]
