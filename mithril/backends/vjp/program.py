"""The generated gradient program: forward kernels, then vector-Jacobian rules in reverse.

For a graph and the names to differentiate, :func:`lower_vjp` emits one function::

    def vjp(params, data, cotangents):
        v0 = data['input']
        v1 = params['fc.weight']
        v2 = matmul_0(v0, v1, xp=xp)  # MatMul 'fc'
        outputs = {'output': v2}
        d2 = _cotangent(cotangents, 'output', v2)
        _g = matmul_vjp_1(d2, v0, v1, needs=(False, True))  # MatMul 'fc' (vjp)
        d1 = _g[1]
        del v0, v2, d2, _g
        return outputs, {'fc.weight': d1}

Only nodes on a path from a differentiated value to an output get a rule line; a forward value
lives until its last reader, forward or backward, and a gradient until its producer's rule has
read it. Gradients reaching a value from several consumers are summed as they arrive.
"""

from __future__ import annotations

import itertools
import linecache
from dataclasses import dataclass, field
from typing import Any

import numpy
import onnx_ir as ir

from ...dtypes import tensor_array
from ...onnx_bridge.schema import is_graph_attribute, max_outputs
from ..lower import LoweredProgram, NodeSite, _Emitter, _np_dtype, _outer_refs, canonical_domain, resolve_kernels
from . import RULES, NoGradientRuleError

_counter = itertools.count()


def _cotangent(cotangents, name, value):
    """The cotangent of one output: the given one in the output's dtype and shape, else zeros."""
    g = cotangents.get(name)
    if g is None:
        return numpy.zeros_like(value)
    g = numpy.asarray(g, dtype=value.dtype)
    return g if g.shape == value.shape else numpy.broadcast_to(g, value.shape)


def _is_floating(value: ir.Value) -> bool:
    dt = _np_dtype(value)
    return dt is not None and numpy.issubdtype(dt, numpy.inexact)


@dataclass
class GradientProgram:
    """``run(params, data, cotangents) -> (outputs, gradients)`` for a fixed set of names; asking
    for another set lowers (and caches) another program from the same graph."""

    program: LoweredProgram
    diff_names: tuple[str, ...]
    graph: ir.Graph
    opsets: dict[str, int]
    options: dict[str, Any]
    _others: dict[tuple[str, ...], GradientProgram] = field(default_factory=dict)

    @property
    def run(self):
        return self.program.namespace["vjp"]

    @property
    def code(self) -> str:
        return self.program.source

    def for_names(self, names) -> GradientProgram:
        names = tuple(names)
        if set(names) == set(self.diff_names):
            return self
        key = tuple(sorted(names))
        if key not in self._others:
            self._others[key] = lower_vjp(self.graph, self.opsets, diff_names=names, **self.options)
        return self._others[key]


class _VjpEmitter(_Emitter):
    def grad(self, value: ir.Value) -> str:
        return "d" + self.var(value)[1:]

    def rule_call(self, node: ir.Node, label: str, spec, opset: int, needs, grads_in) -> str:
        kwargs = self.attribute_kwargs(node, label, spec, opset, kind="gradient rule")
        kwargs["needs"] = repr(tuple(needs)) if "needs" in spec.accepts else None
        if "y" in spec.accepts:
            kwargs["y"] = self.var(node.outputs[0])
        if "outputs" in spec.accepts:
            kwargs["outputs"] = "(" + "".join(self.var(o) + ", " for o in node.outputs) + ")"
        if "opset" in spec.accepts:
            kwargs["opset"] = repr(opset)
        if "num_outputs" in spec.accepts:
            kwargs["num_outputs"] = repr(len(node.outputs))
        args = [grads_in]
        args += [self.var(v) if v is not None else "None" for v in node.inputs]
        args += [f"{k}={v}" for k, v in kwargs.items() if v is not None]
        name = self.kernel_name(spec)
        return f"{name}({', '.join(args)})"


def _rule_reads(node: ir.Node, spec) -> list[ir.Value]:
    reads = [v for v in node.inputs if v is not None]
    if "y" in spec.accepts:
        reads.append(node.outputs[0])
    if "outputs" in spec.accepts:
        reads.extend(node.outputs)
    return reads


def lower_vjp(
    graph: ir.Graph,
    opsets: dict[str, int],
    *,
    diff_names,
    backend: str,
    param_names: set[str],
    extra_namespace: dict[str, Any],
    extra_kwargs: dict[str, str],
    file_path: str | None = None,
) -> GradientProgram:
    """Generate ``vjp(params, data, cotangents) -> (outputs, gradients of diff_names)`` for ``graph``.

    Raises :class:`NoGradientRuleError` naming every node on a differentiated path whose op has
    no rule, so a missing rule is found when the model is compiled, not when it is trained.
    """
    options = dict(backend=backend, param_names=param_names, extra_namespace=extra_namespace,
                   extra_kwargs=extra_kwargs, file_path=file_path)
    diff_names = tuple(diff_names)
    specs = resolve_kernels(graph, opsets, backend)
    em = _VjpEmitter(opsets, backend, specs, extra_kwargs)
    em.namespace.update(extra_namespace)
    em.namespace.update(_cotangent=_cotangent, _zeros=numpy.zeros_like)
    nodes = list(graph)

    # Which values carry a gradient: floating values reached from a differentiated one...
    by_name = {v.name: v for v in graph.inputs}
    by_name.update({n: v for n, v in graph.initializers.items() if n in param_names})
    sources = {by_name[n] for n in diff_names if n in by_name and _is_floating(by_name[n])}
    requires = set(sources)
    for node in nodes:
        reads = [v for v in node.inputs if v is not None]
        for attr in node.attributes.values():
            if is_graph_attribute(attr):
                for sub in attr.value if attr.type == ir.AttributeType.GRAPHS else [attr.value]:
                    reads.extend(_outer_refs(sub))
        if any(v in requires for v in reads):
            requires.update(o for o in node.outputs if _is_floating(o))
    # ...that also reach an output: those nodes need a rule.
    useful = {v for v in graph.outputs if v in requires}
    active: list[ir.Node] = []
    for node in reversed(nodes):
        if any(o in useful for o in node.outputs):
            inputs = [v for v in node.inputs if v is not None and v in requires]
            if inputs or any(v in requires for a in node.attributes.values() if is_graph_attribute(a)
                             for sub in (a.value if a.type == ir.AttributeType.GRAPHS else [a.value])
                             for v in _outer_refs(sub)):
                active.append(node)
                useful.update(inputs)

    # Forward header, as lower_graph emits it.
    em.emit_header("def vjp(params, data, cotangents):", graph, param_names)

    # Steps: forward nodes 0..n-1, the outputs dict n, cotangents n+1, rules n+2... ; last reads.
    n = len(nodes)
    rule_specs = {}
    missing = []
    rule_step = {id(node): n + 2 + j for j, node in enumerate(active)}
    last_use: dict[ir.Value, int] = {}
    for i, node in enumerate(nodes):
        for v in node.inputs:
            if v is not None:
                last_use[v] = i
        for attr in node.attributes.values():
            if is_graph_attribute(attr):
                for sub in attr.value if attr.type == ir.AttributeType.GRAPHS else [attr.value]:
                    for v in _outer_refs(sub):
                        last_use[v] = i
    for v in graph.outputs:
        last_use[v] = max(last_use.get(v, -1), n + (1 if v in useful else 0))
    for node in active:
        domain = canonical_domain(node.domain)
        opset = opsets.get(domain, 1)
        spec = RULES.resolve(node.op_type, opset, domain)
        if spec is None:
            continue
        rule_specs[id(node)] = (spec, opset)
        for v in _rule_reads(node, spec):
            last_use[v] = max(last_use.get(v, -1), rule_step[id(node)])
    local = set(graph.inputs)
    for node in nodes:
        local.update(node.outputs)
    for v in graph.initializers.values():
        if v not in em.names and (v in last_use):
            if v.const_value is None:
                raise ValueError(f"initializer {v.name!r} has no value")
            em.names[v] = em.const(tensor_array(v.const_value), "c")
    frees: dict[int, list[ir.Value]] = {}
    for v, i in last_use.items():
        if v in local:
            frees.setdefault(i, []).append(v)

    labels: dict[int, str] = {}
    for i, node in enumerate(nodes):
        em.emit_node(node, 1)
        labels[id(node)] = next(reversed(em.sites.values())).label
        dead = [em.var(v) for v in frees.get(i, []) if v in em.names]
        dead += [em.var(o) for o in node.outputs if o.name and o not in last_use]
        if dead:
            em.emit(1, "del " + ", ".join(dict.fromkeys(dead)))
    for node in active:
        if id(node) not in rule_specs:
            domain = canonical_domain(node.domain)
            op = node.op_type if not domain else f"{domain}::{node.op_type}"
            missing.append((labels[id(node)], op, opsets.get(domain, 1)))
    if missing:
        raise NoGradientRuleError(missing)

    em.emit(1, "outputs = {" + ", ".join(f"{v.name!r}: {em.var(v)}" for v in graph.outputs) + "}")
    dead = [em.var(v) for v in frees.get(n, [])]
    if dead:
        em.emit(1, "del " + ", ".join(dict.fromkeys(dead)))
    has_grad: set[ir.Value] = set()
    for v in graph.outputs:
        if v in useful:
            expr = f"_cotangent(cotangents, {v.name!r}, {em.var(v)})"
            em.emit(1, f"{em.grad(v)} = {em.grad(v)} + {expr}" if v in has_grad else f"{em.grad(v)} = {expr}")
            has_grad.add(v)
    dead = [em.var(v) for v in frees.get(n + 1, [])]
    if dead:
        em.emit(1, "del " + ", ".join(dict.fromkeys(dead)))

    # Backward: one rule call per active node, newest first.
    for node in active:
        spec, opset = rule_specs[id(node)]
        label = labels[id(node)]
        domain = canonical_domain(node.domain)
        if max_outputs(node.op_type, opset, domain) > 1:
            grads_in = "(" + "".join((em.grad(o) if o in has_grad else "None") + ", " for o in node.outputs) + ")"
        else:
            grads_in = em.grad(node.outputs[0])
        needs = [v is not None and v in useful for v in node.inputs]
        call = em.rule_call(node, label, spec, opset, needs, grads_in)
        line = em.emit(1, f"_g = {call}  # {node.op_type} {label!r} (vjp)")
        input_vars = (grads_in,) + tuple(em.var(v) if v is not None else None for v in node.inputs)
        em.sites[line] = NodeSite(label, node.op_type, opset, input_vars, f"vjp {spec.name}")
        seen = set()
        for k, v in enumerate(node.inputs):
            if not needs[k] or v in seen:
                seen.add(v)
                continue
            seen.add(v)
            # The same value at several positions (x * x) sums its entries.
            terms = [f"_g[{j}]" for j in range(k, len(node.inputs)) if node.inputs[j] is v and needs[j]]
            total = " + ".join(terms)
            em.emit(1, f"{em.grad(v)} = {em.grad(v)} + {total}" if v in has_grad else f"{em.grad(v)} = {total}")
            has_grad.add(v)
        dead = [em.grad(o) for o in node.outputs if o in has_grad and o not in sources]
        dead += [em.var(v) for v in frees.get(rule_step[id(node)], [])]
        em.emit(1, "del " + ", ".join(dict.fromkeys(["_g"] + dead)))

    grads = []
    for name in diff_names:
        v = by_name.get(name)
        src = "params" if name in param_names else "data"
        expr = em.grad(v) if v is not None and v in has_grad else f"_zeros({src}[{name!r}])"
        grads.append(f"{name!r}: {expr}")
    em.emit(1, "return outputs, {" + ", ".join(grads) + "}")

    source = "\n".join(em.lines) + "\n"
    filename = file_path or f"<mithril-{backend}-vjp-{next(_counter)}>"
    if file_path:
        with open(file_path, "w") as f:
            f.write(source)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), em.namespace)
    program = LoweredProgram(source, filename, em.namespace, em.sites)
    return GradientProgram(program, diff_names, graph, opsets, options)
