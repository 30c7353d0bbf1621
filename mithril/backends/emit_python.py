"""The Python emitter: a lowering plan printed as Python source, one line per node.

The generated function looks like::

    def forward(params, data, ctx=ctx):
        v0 = data['input']
        v1 = params['conv1.weight']
        v2 = conv_3(v0, v1, None, auto_pad='NOTSET', dilations=(1, 1), ..., xp=xp, ctx=ctx)  # Conv 'conv1': mithril/backends/jax/overrides.py:120
        del v0
        ...
        return {'output': v9}

Runtime arguments a kernel declares come from the namespace (``xp``, ``_backend.rng``) or, for
``ctx`` (the backend's options for its kernels, JAX's here), from forward's parameter of that name.
Each value is deleted after its last use (the plan's lifetimes); subgraphs (If/Loop/Scan bodies)
become nested functions that close over the outer values they read, and so do the segments of
gradient checkpointing (:mod:`.checkpoint`), called through ``_backend.checkpoint``. The source is exec'd under
a filename registered with ``linecache`` so tracebacks show the generated line, and the line ->
node map lets errors name the node that failed. The emitter reads only the plan (see
:mod:`.plan`); the gradient program (:mod:`.vjp.program`) prints through the same methods.
"""

from __future__ import annotations

import dataclasses
import itertools
import linecache
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .checkpoint import Checkpointing, Segment
from .plan import Plan, PlanNode, PlanValue, check_outputs, first_output
from .registry import KernelSpec

_counter = itertools.count()

# Runtime arguments a kernel may declare, and the generated expression that supplies each.
RUNTIME_SOURCES = {"xp": "xp", "rng": "_backend.rng", "ctx": "ctx"}


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
    """Generated source, exec'd: ``forward`` (or the entry named ``entry``) and its line map."""

    source: str
    filename: str
    namespace: dict[str, Any]
    lines: dict[int, NodeSite] = field(default_factory=dict)
    entry: str = "forward"
    # A backend's wrapper around the generated entry (autocast, data parallel, a compute dtype).
    wrapped: Callable | None = None
    # emit_python(timed=True): the plan node of each ``_timed(i, kernel, ...)`` call, at index i.
    timed_nodes: list[PlanNode] | None = None

    @property
    def forward(self):
        return self.wrapped if self.wrapped is not None else self.namespace[self.entry]

    def with_forward(self, forward: Callable) -> "LoweredProgram":
        """The same program (source, line map) whose ``forward`` is ``forward``, a wrapper of it."""
        return dataclasses.replace(self, wrapped=forward)


def _literal(value: Any) -> str | None:
    """Python source for simple attribute values, None when a value must be bound by name."""
    kind = type(value)
    if kind is tuple and len(value) <= 64 and all(type(v) is int for v in value):
        return repr(value)  # the common case (pads, strides, axes), printed as below
    if value is None or isinstance(value, (bool, int, str)):
        return repr(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else None
    if isinstance(value, tuple) and len(value) <= 64:
        parts = [_literal(v) for v in value]
        if all(p is not None for p in parts):
            return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
    return None


class PythonEmitter:
    """Prints plans as Python source into one namespace. ``constant`` converts a constant read
    as a tensor (not as a static input) into the backend's array, once."""

    def __init__(self, namespace: dict[str, Any] | None = None,
                 constant: Callable[[np.ndarray], Any] | None = None, timed: bool = False):
        self.namespace: dict[str, Any] = {"_first": first_output, "_outputs": check_outputs}
        self.namespace.update(namespace or {})
        self.lines: list[str] = []
        self.sites: dict[int, NodeSite] = {}
        self.names: dict[PlanValue, str] = {}
        self.constant = constant
        self._backend_consts: dict[PlanValue, str] = {}
        self._kernel_names: dict[int, str] = {}
        self._n_consts = 0
        self._n_graphs = 0
        # Profiling (mithril.profile): each kernel call becomes ``_timed(i, kernel, args...)``,
        # ``_timed`` bound in the namespace by the caller; None when not profiling.
        self.timed_nodes: list[PlanNode] | None = [] if timed else None

    # -- names ---------------------------------------------------------------------
    def var(self, value: PlanValue) -> str:
        """A value's name in the source; a constant is bound into the namespace when first read."""
        name = self.names.get(value)
        if name is None:
            if value.kind == "constant":
                name = self.names[value] = self.const(value.value, "c")
            else:
                name = self.names[value] = f"v{value.id}"
        return name

    def const(self, value: Any, hint: str = "c") -> str:
        name = f"{hint}{self._n_consts}"
        self._n_consts += 1
        self.namespace[name] = value
        return name

    def tensor_var(self, value: PlanValue) -> str:
        """The name a non-static input reads: a constant in the backend's array type where the
        backend converts constants (static inputs, read on the host, keep the NumPy name)."""
        if value.kind != "constant" or self.constant is None:
            return self.var(value)
        if value not in self._backend_consts:
            arr = value.value
            converted = self.constant(arr)
            self._backend_consts[value] = self.var(value) if converted is arr else self.const(converted, "d")
        return self._backend_consts[value]

    def kernel_name(self, spec: KernelSpec) -> str:
        key = id(spec)
        if key not in self._kernel_names:
            # A lambda or partial (a user's register_op) has no identifier for a name.
            base = re.sub(r"\W|^(?=\d)", "_", getattr(spec.fn, "__name__", "") or "kernel")
            name = f"{base}_{len(self._kernel_names)}"
            self._kernel_names[key] = name
            self.namespace[name] = spec.fn
        return self._kernel_names[key]

    def source_of(self, value: Any) -> str:
        src = _literal(value)
        return src if src is not None else self.const(value, "a")

    # -- lines ---------------------------------------------------------------------
    def emit(self, indent: int, text: str) -> int:
        self.lines.append("    " * indent + text)
        return len(self.lines)  # 1-based line number

    def emit_header(self, signature: str, plan: Plan) -> None:
        """The function line, then graph inputs read from params or data, then the parameters."""
        self.emit(0, signature)
        for v in plan.inputs:
            self.emit(1, f"{self.var(v)} = {'params' if v.kind == 'param' else 'data'}[{v.name!r}]")
        for v in plan.params:
            if v not in self.names:
                self.emit(1, f"{self.var(v)} = params[{v.name!r}]")

    def emit_del(self, indent: int, values: Iterable[PlanValue], extra: Iterable[str] = ()) -> None:
        dead = list(extra) + [self.var(v) for v in values if v in self.names]
        if dead:
            self.emit(indent, "del " + ", ".join(dict.fromkeys(dead)))

    def emit_body(self, plan: Plan, indent: int, outputs_expr: Callable[[Plan], str],
                  checkpointing: Checkpointing | None = None) -> None:
        """The nodes, each followed by the values it frees, and the return line; with
        ``checkpointing``, each segment's nodes as a nested function called through the backend."""
        starts = checkpointing.segment_starting_at() if checkpointing is not None else {}
        segmented = checkpointing.segment_of() if checkpointing is not None else {}
        for pn in plan.nodes:
            if pn in starts:
                self.emit_segment(starts[pn], indent, checkpointing.call)
            elif pn not in segmented:
                self.emit_node(pn, indent)
                self.emit_del(indent, pn.frees)
        self.emit(indent, outputs_expr(plan))

    def emit_segment(self, segment: Segment, indent: int, call: str = "checkpoint") -> None:
        """``def s<i>(live-in...)``: the segment's nodes returning its live-out values, then
        ``live-out... = _backend.checkpoint(s<i>, live-in...)``: the backend's autodiff keeps the
        arguments and recomputes the rest in the backward pass (:mod:`.checkpoint`). Another
        ``call`` (a pipeline stage) takes the segment's index first."""
        name = f"s{segment.index}"
        args = ", ".join(self.var(v) for v in segment.inputs)
        what = "checkpointed segment" if call == "checkpoint" else f"{call} {segment.index}"
        self.emit(indent, f"def {name}({args}):  # {what}: nodes "
                          f"{segment.nodes[0].label!r} to {segment.nodes[-1].label!r}")
        for pn in segment.nodes:
            self.emit_node(pn, indent + 1)
            self.emit_del(indent + 1, pn.frees)
        outs = "".join(self.var(v) + ", " for v in segment.outputs)
        self.emit(indent + 1, f"return ({outs})")
        head = name if call == "checkpoint" else f"{segment.index}, {name}"
        call = f"_backend.{call}({head}{', ' if args else ''}{args})"
        self.emit(indent, f"{outs}= {call}" if outs else call)
        self.emit_del(indent, segment.frees, [name])

    def emit_subgraph(self, plan: Plan, indent: int) -> str:
        name = f"g{self._n_graphs}"
        self._n_graphs += 1
        self.emit(indent, f"def {name}({', '.join(self.var(v) for v in plan.inputs)}):")
        self.emit_body(plan, indent + 1,
                       lambda p: "return (" + "".join(self.var(v) + ", " for v in p.outputs) + ")")
        return name

    def call(self, spec: KernelSpec, args: list[str], kwargs: dict[str, Any], runtime: Iterable[str]) -> str:
        """``kernel(args..., attr=value...)``: values printed as literals or bound by name."""
        parts = list(args) + [f"{k}={v if isinstance(v, Source) else self.source_of(v)}" for k, v in kwargs.items()]
        parts += [f"{name}={RUNTIME_SOURCES[name]}" for name in runtime]
        return f"{self.kernel_name(spec)}({', '.join(parts)})"

    def emit_node(self, pn: PlanNode, indent: int) -> None:
        spec = pn.spec
        kwargs: dict[str, Any] = {}
        for name, sub in pn.subgraphs.items():
            if isinstance(sub, tuple):
                kwargs[name] = Source("(" + "".join(self.emit_subgraph(p, indent) + ", " for p in sub) + ")")
            else:
                kwargs[name] = Source(self.emit_subgraph(sub, indent))
        kwargs.update(pn.kwargs)
        if "node" in kwargs:
            kwargs["node"] = Source(self.const(kwargs["node"], "n"))
        input_vars = tuple(None if v is None else self.var(v) if pn.input_is_static(i) else self.tensor_var(v)
                           for i, v in enumerate(pn.inputs))
        call = self.call(spec, [v if v is not None else "None" for v in input_vars], kwargs, pn.runtime)
        if self.timed_nodes is not None:  # kernel(args) -> _timed(i, kernel, args)
            kernel, _, rest = call.partition("(")
            call = f"_timed({len(self.timed_nodes)}, {kernel}, {rest}"
            self.timed_nodes.append(pn)
        comment = f"  # {pn.op_type} {pn.label!r}: {spec.location}"
        outs = pn.outputs
        if len(outs) == 1 and not pn.multi_output:
            line = self.emit(indent, f"{self.var(outs[0])} = {call}{comment}")
        elif len(outs) == 1:
            line = self.emit(indent, f"{self.var(outs[0])} = _first({call}){comment}")
        else:
            # _outputs checks the count on the call's own line, so a short result names this node.
            line = self.emit(indent, f"_o = _outputs({call}, {len(outs)}){comment}")
            for i, o in enumerate(outs):
                if o.name:
                    self.emit(indent, f"{self.var(o)} = _o[{i}]")
            self.emit(indent, "del _o")
        self.sites[line] = NodeSite(pn.label, pn.op_type, pn.opset, input_vars, spec.name)

    # -- exec ----------------------------------------------------------------------
    def finish(self, tag: str, entry: str, file_path: str | None = None) -> LoweredProgram:
        """Exec the source under a registered filename (``file_path`` also gets it written)."""
        source = "\n".join(self.lines) + "\n"
        filename = file_path or f"<mithril-{tag}-{next(_counter)}>"
        if file_path:
            with open(file_path, "w") as f:
                f.write(source)
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        exec(compile(source, filename, "exec"), self.namespace)
        return LoweredProgram(source, filename, self.namespace, self.sites, entry, timed_nodes=self.timed_nodes)


class Source(str):
    """Source text already printed (a subgraph's function name, a bound constant's name)."""


def emit_python(plan: Plan, *, namespace: dict[str, Any], file_path: str | None = None,
                constant: Callable[[np.ndarray], Any] | None = None,
                checkpointing: Checkpointing | None = None, timed: bool = False) -> LoweredProgram:
    """Print and exec ``forward(params, data) -> dict`` for ``plan``; with ``checkpointing``
    (segments of ``plan``), each segment runs through ``_backend.checkpoint``. With ``timed``
    (:mod:`mithril.profile`), each kernel call goes through ``_timed(i, kernel, args...)``, which
    ``namespace`` must hold; ``timed_nodes[i]`` of the result is the call's plan node.

    Kernels that declare ``ctx`` get ``namespace["ctx"]``, the backend's options for them
    (:attr:`~mithril.backends.backend.Backend.kernel_context`); where it is not None, ``forward``
    takes it as a parameter too (``forward(params, data, ctx=other)``: JAX's jitted forward
    program passes its own)."""
    em = PythonEmitter(namespace, constant, timed)
    takes_ctx = em.namespace.get("ctx") is not None
    em.emit_header("def forward(params, data, ctx=ctx):" if takes_ctx else "def forward(params, data):", plan)
    em.emit_body(plan, 1, lambda p: "return {" + ", ".join(f"{v.name!r}: {em.var(v)}" for v in p.outputs) + "}",
                 checkpointing)
    return em.finish(plan.backend, "forward", file_path)


__all__ = ["LoweredProgram", "NodeSite", "PythonEmitter", "Source", "emit_python"]
