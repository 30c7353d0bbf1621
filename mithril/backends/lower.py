"""Lowering: a specialized ONNX graph becomes Python source, one line per node.

The generated function looks like::

    def forward(params, data):
        v0 = data['input']
        v1 = params['conv1.weight']
        v2 = k0(v0, v1, None, auto_pad='NOTSET', dilations=(1, 1), group=1, ...)  # Conv 'conv1'
        del v0
        ...
        return {'output': v9}

Each value is deleted after its last use; subgraphs (If/Loop/Scan bodies) become nested
functions that close over the outer values they read. The source is exec'd under a filename
registered with ``linecache`` so tracebacks show the generated line, and the line -> node map
lets errors name the node that failed.
"""

from __future__ import annotations

import itertools
import linecache
import math
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx_ir as ir

from ..errors import (
    UnsupportedAttributeError,
    UnsupportedDomainError,
    UnsupportedOpsError,
)
from ..dtypes import tensor_array
from ..onnx_bridge.schema import (
    attribute_defaults,
    canonical_domain,
    convert_attribute,
    is_graph_attribute,
    max_outputs,
)
from .registry import REGISTRY, KernelSpec, NodeInfo

_counter = itertools.count()


def node_label(node: ir.Node, index: int) -> str:
    """A node's name, or ``op_type#index`` when it has none."""
    return node.name or f"{node.op_type}#{index}"


@dataclass
class NodeSite:
    """Where a node sits in the generated source, for error messages."""

    label: str
    op_type: str
    opset: int
    input_vars: tuple[str | None, ...]
    kernel: str


@dataclass
class LoweredProgram:
    source: str
    filename: str
    namespace: dict[str, Any]
    lines: dict[int, NodeSite] = field(default_factory=dict)

    @property
    def forward(self):
        return self.namespace["forward"]


def _literal(value: Any) -> str | None:
    """Python source for simple attribute values, None when a value must be bound by name."""
    if value is None or isinstance(value, (bool, int, str)):
        return repr(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else None
    if isinstance(value, tuple) and len(value) <= 64:
        parts = [_literal(v) for v in value]
        if all(p is not None for p in parts):
            return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
    return None


def iter_graph_nodes(graph: ir.Graph):
    """Every node of a graph and of its subgraphs, with (domain, op_type) canonicalized."""
    for node in graph.all_nodes():
        yield node


def check_domains(graph: ir.Graph, backend: str = "*") -> None:
    """Nodes of a domain no kernel is registered for are refused together, before any op lookup.
    Model-local functions are inlined before lowering, so their domains never reach here."""
    supported = REGISTRY.domains(backend)
    bad = []
    for i, node in enumerate(graph.all_nodes()):
        if canonical_domain(node.domain) not in supported:
            bad.append((node_label(node, i), node.domain, node.op_type))
    if bad:
        raise UnsupportedDomainError(bad)


def resolve_kernels(graph: ir.Graph, opsets: dict[str, int], backend: str) -> dict[int, KernelSpec]:
    """Kernel per node (keyed by id(node)); raises listing every node without one."""
    check_domains(graph, backend)
    specs: dict[int, KernelSpec] = {}
    missing = []
    for i, node in enumerate(graph.all_nodes()):
        domain = canonical_domain(node.domain)
        opset = opsets.get(domain, 1)
        spec = REGISTRY.resolve(node.op_type, opset, domain, backend)
        if spec is None:
            missing.append((node_label(node, i), node.op_type if not domain else f"{domain}::{node.op_type}", opset))
        else:
            specs[id(node)] = spec
    if missing:
        raise UnsupportedOpsError(missing, backend)
    return specs


def _outer_refs(graph: ir.Graph) -> set[ir.Value]:
    """Values a (sub)graph reads that it does not define itself."""
    defined: set[ir.Value] = set(graph.inputs) | set(graph.initializers.values())
    used: set[ir.Value] = set()
    for node in graph:
        for v in node.inputs:
            if v is not None:
                used.add(v)
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                used |= _outer_refs(attr.value)
            elif attr.type == ir.AttributeType.GRAPHS:
                for g in attr.value:
                    used |= _outer_refs(g)
        defined.update(node.outputs)
    for v in graph.outputs:
        used.add(v)
    return used - defined


class _Emitter:
    def __init__(self, opsets: dict[str, int], backend: str, specs: dict[int, KernelSpec], extra_kwargs: dict[str, str]):
        self.opsets = opsets
        self.backend = backend
        self.specs = specs
        self.namespace: dict[str, Any] = {"_first": _first, "_outputs": _outputs}
        self.lines: list[str] = []
        self.sites: dict[int, NodeSite] = {}
        self.names: dict[ir.Value, str] = {}
        self.extra_kwargs = extra_kwargs  # kernel kwarg -> source expression (xp, rng)
        self._kernel_names: dict[int, str] = {}
        self._n_values = 0
        self._n_consts = 0
        self._n_graphs = 0
        self._node_index = 0
        # Initializer constants as NumPy arrays, and as the backend's arrays where it keeps them so
        # (Backend.constant), converted once here instead of on every call.
        self.const_arrays: dict[ir.Value, np.ndarray] = {}
        self.backend_constant: Callable[[np.ndarray], Any] | None = None
        self._backend_consts: dict[ir.Value, str] = {}

    # -- names ---------------------------------------------------------------------
    def var(self, value: ir.Value) -> str:
        name = self.names.get(value)
        if name is None:
            name = self.names[value] = f"v{self._n_values}"
            self._n_values += 1
        return name

    def const(self, value: Any, hint: str = "c") -> str:
        name = f"{hint}{self._n_consts}"
        self._n_consts += 1
        self.namespace[name] = value
        return name

    def backend_const(self, value: ir.Value) -> str:
        """The name a non-static input reads: a constant in the backend's array type where the
        backend converts constants (static inputs, read on the host, keep the NumPy name)."""
        arr = self.const_arrays.get(value)
        if arr is None or self.backend_constant is None:
            return self.var(value)
        if value not in self._backend_consts:
            converted = self.backend_constant(arr)
            self._backend_consts[value] = self.var(value) if converted is arr else self.const(converted, "d")
        return self._backend_consts[value]

    def kernel_name(self, spec: KernelSpec) -> str:
        key = id(spec)
        if key not in self._kernel_names:
            name = f"{spec.fn.__name__}_{len(self._kernel_names)}"
            self._kernel_names[key] = name
            self.namespace[name] = spec.fn
        return self._kernel_names[key]

    def emit_header(self, signature: str, graph: ir.Graph, param_names: set[str]) -> None:
        """The function line, then graph inputs read from params or data and the parameters."""
        self.emit(0, signature)
        for v in graph.inputs:
            src = "params" if v.name in param_names else "data"
            self.emit(1, f"{self.var(v)} = {src}[{v.name!r}]")
        for name, v in graph.initializers.items():
            if name in param_names and v not in self.names:
                self.emit(1, f"{self.var(v)} = params[{name!r}]")

    def emit(self, indent: int, text: str) -> int:
        self.lines.append("    " * indent + text)
        return len(self.lines)  # 1-based line number

    # -- graphs --------------------------------------------------------------------
    def emit_graph_body(self, graph: ir.Graph, indent: int, outputs_expr) -> None:
        nodes = list(graph)
        # Liveness: last node index that reads each value (directly or from a subgraph).
        last_use: dict[ir.Value, int] = {}
        for i, node in enumerate(nodes):
            for v in node.inputs:
                if v is not None:
                    last_use[v] = i
            for attr in node.attributes.values():
                if is_graph_attribute(attr):
                    subs = attr.value if attr.type == ir.AttributeType.GRAPHS else [attr.value]
                    for sub in subs:
                        for v in _outer_refs(sub):
                            last_use[v] = i
        keep = set(graph.outputs)
        local = set(graph.inputs) | set(graph.initializers.values())
        for node in nodes:
            local.update(node.outputs)
        for v in graph.initializers.values():
            if v in self.names:  # a parameter, read from params in the header
                continue
            if v in last_use or v in keep:
                if v.const_value is None:
                    raise ValueError(f"initializer {v.name!r} has no value")
                arr = tensor_array(v.const_value)
                self.names[v] = self.const(arr, "c")
                self.const_arrays[v] = arr
        frees: dict[int, list[ir.Value]] = {}
        for v, i in last_use.items():
            if v in local and v not in keep and not v.is_initializer():
                frees.setdefault(i, []).append(v)
        for i, node in enumerate(nodes):
            self.emit_node(node, indent)
            dead = [self.var(v) for v in frees.get(i, []) if v in self.names]
            # Outputs never read are dropped at once.
            dead += [self.var(o) for o in node.outputs if o.name and o not in last_use and o not in keep]
            if dead:
                self.emit(indent, "del " + ", ".join(dict.fromkeys(dead)))
        self.emit(indent, outputs_expr(graph))

    def emit_subgraph(self, graph: ir.Graph, indent: int) -> str:
        name = f"g{self._n_graphs}"
        self._n_graphs += 1
        args = [self.var(v) for v in graph.inputs]
        self.emit(indent, f"def {name}({', '.join(args)}):")

        def outputs_expr(g):
            outs = [self.var(v) for v in g.outputs]
            return "return (" + "".join(o + ", " for o in outs) + ")"

        self.emit_graph_body(graph, indent + 1, outputs_expr)
        return name

    def emit_node(self, node: ir.Node, indent: int) -> None:
        index = self._node_index
        self._node_index += 1
        label = node_label(node, index)
        domain = canonical_domain(node.domain)
        opset = self.opsets.get(domain, 1)
        spec = self.specs[id(node)]
        kwargs: dict[str, str] = {}
        for name, attr in node.attributes.items():
            if attr.is_ref():
                raise UnsupportedAttributeError(
                    f"attribute {name!r} refers to a function attribute outside a function body",
                    node=label, op_type=node.op_type, opset=opset,
                )
            if is_graph_attribute(attr):
                if name not in spec.accepts and not spec.accepts_var_keyword:
                    raise UnsupportedAttributeError(
                        f"kernel {spec.name} takes no graph attribute {name!r}", node=label, op_type=node.op_type, opset=opset
                    )
                if attr.type == ir.AttributeType.GRAPH:
                    kwargs[name] = self.emit_subgraph(attr.value, indent)
                else:
                    kwargs[name] = "(" + "".join(self.emit_subgraph(g, indent) + ", " for g in attr.value) + ")"
                continue
        kwargs.update(self.attribute_kwargs(node, label, spec, opset))
        for name, expr in self.extra_kwargs.items():
            if name in spec.accepts:
                kwargs[name] = expr
        n_out = len(node.outputs)
        # Split-18 has an ONNX attribute of that name: where it is unset, the node's output count.
        if "num_outputs" in spec.accepts and kwargs.get("num_outputs", "None") == "None":
            kwargs["num_outputs"] = repr(n_out)
        if "opset" in spec.accepts:
            kwargs["opset"] = repr(opset)
        if "node" in spec.accepts:
            out_dtypes = tuple(_np_dtype(o) for o in node.outputs)
            kwargs["node"] = self.const(NodeInfo(label, node.op_type, domain, opset, out_dtypes), "n")
        input_vars = tuple(
            None if v is None else self.backend_const(v) if i not in spec.static_inputs else self.var(v)
            for i, v in enumerate(node.inputs)
        )
        args = [v if v is not None else "None" for v in input_vars]
        args += [f"{k}={v}" for k, v in kwargs.items()]
        call = f"{self.kernel_name(spec)}({', '.join(args)})"
        comment = f"  # {node.op_type} {label!r}"
        outs = node.outputs
        if n_out == 1 and max_outputs(node.op_type, opset, domain) == 1:
            line = self.emit(indent, f"{self.var(outs[0])} = {call}{comment}")
        elif n_out == 1:
            line = self.emit(indent, f"{self.var(outs[0])} = _first({call}){comment}")
        else:
            # _outputs checks the count on the call's own line, so a short result names this node.
            line = self.emit(indent, f"_o = _outputs({call}, {n_out}){comment}")
            for i, o in enumerate(outs):
                if o.name:
                    self.emit(indent, f"{self.var(o)} = _o[{i}]")
            self.emit(indent, "del _o")
        self.sites[line] = NodeSite(label, node.op_type, opset, input_vars, spec.name)

    def attribute_kwargs(self, node: ir.Node, label: str, spec: KernelSpec, opset: int,
                         kind: str = "kernel") -> dict[str, str]:
        """Source for the node's non-graph attributes (its values, else schema defaults) that
        ``spec`` accepts; an explicitly set, non-default attribute it does not accept is an error."""
        defaults = attribute_defaults(node.op_type, opset, canonical_domain(node.domain))
        kwargs: dict[str, str] = {}
        for name, attr in node.attributes.items():
            if is_graph_attribute(attr):
                continue
            value = convert_attribute(attr)
            if name not in spec.accepts and not spec.accepts_var_keyword:
                if name in defaults and _same(defaults[name], value):
                    continue
                raise UnsupportedAttributeError(
                    f"{kind} {spec.name} does not implement attribute {name}={value!r}",
                    node=label, op_type=node.op_type, opset=opset,
                )
            kwargs[name] = self._value_source(value)
        for name, default in defaults.items():
            if name not in kwargs and (name in spec.accepts or spec.accepts_var_keyword) and name not in node.attributes:
                kwargs[name] = self._value_source(default)
        return kwargs

    def _value_source(self, value: Any) -> str:
        src = _literal(value)
        return src if src is not None else self.const(value, "a")


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _outputs(out, count: int):
    """A kernel's results for a node with ``count`` outputs; too few is the kernel's error."""
    if not isinstance(out, (tuple, list)) or len(out) < count:
        got = len(out) if isinstance(out, (tuple, list)) else 1
        raise ValueError(f"the kernel returned {got} output(s) but the node has {count}")
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape and bool(np.all(a == b))
    if isinstance(a, float) and isinstance(b, float):
        return a == b or abs(a - b) <= 1e-7 * max(1.0, abs(a))
    return a == b


def _np_dtype(value: ir.Value):
    from ..dtypes import np_dtype_of_onnx

    if value.dtype is None or value.type is None or not isinstance(value.type, ir.TensorType):
        return None
    try:
        return np_dtype_of_onnx(int(value.dtype))
    except (KeyError, ValueError, TypeError):
        return None


def lower_graph(
    graph: ir.Graph,
    opsets: dict[str, int],
    backend: str,
    *,
    param_names: set[str],
    extra_namespace: dict[str, Any],
    extra_kwargs: dict[str, str],
    file_path: str | None = None,
    constant: Callable[[np.ndarray], Any] | None = None,
) -> LoweredProgram:
    """Generate and exec ``forward(params, data) -> dict`` for ``graph``. ``constant`` converts an
    initializer constant read as a tensor (not as a static input) into the backend's array, once."""
    specs = resolve_kernels(graph, opsets, backend)
    em = _Emitter(opsets, backend, specs, extra_kwargs)
    em.backend_constant = constant
    em.namespace.update(extra_namespace)
    em.emit_header("def forward(params, data):", graph, param_names)

    def outputs_expr(g):
        return "return {" + ", ".join(f"{v.name!r}: {em.var(v)}" for v in g.outputs) + "}"

    em.emit_graph_body(graph, 1, outputs_expr)
    source = "\n".join(em.lines) + "\n"
    filename = file_path or f"<mithril-{backend}-{next(_counter)}>"
    if file_path:
        with open(file_path, "w") as f:
            f.write(source)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    code = compile(source, filename, "exec")
    exec(code, em.namespace)
    return LoweredProgram(source, filename, em.namespace, em.sites)
