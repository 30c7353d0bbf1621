"""The gradient program: the forward plan, then vector-Jacobian rules in reverse.

:func:`plan_gradients` extends a lowering plan (:mod:`..plan`) with the rules of the nodes on a
path from a differentiated value to an output, each rule bound like a kernel (attributes with
schema defaults, plus ``needs``, ``y``, ``outputs``...), and the lifetimes of forward values
and of gradients across both halves. :func:`lower_vjp` prints that plan with the Python
emitter (:mod:`..emit_python`) as one function::

    def vjp(params, data, cotangents):
        v0 = data['input']
        v1 = params['fc.weight']
        v2 = matmul_0(v0, v1, xp=xp)  # MatMul 'fc': mithril/backends/kernels/nn.py:40
        outputs = {'output': v2}
        d2 = _cotangent(cotangents, 'output', v2)
        _g = matmul_vjp_1(d2, v0, v1, needs=(False, True))  # MatMul 'fc' (vjp): ...
        d1 = _g[1]
        del v0, v2, d2, _g
        return outputs, {'fc.weight': d1}

A forward value lives until its last reader, forward or backward, and a gradient until its
producer's rule has read it. Gradients reaching a value from several consumers are summed as
they arrive.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy

from ..emit_python import LoweredProgram, NodeSite, PythonEmitter, Source
from ..plan import Plan, PlanNode, PlanValue, bind_attributes
from ..registry import KernelSpec
from .rules import RULES, NoGradientRuleError


def _cotangent(cotangents, name, value):
    """The cotangent of one output: the given one in the output's dtype and shape, else zeros."""
    g = cotangents.get(name)
    if g is None:
        return numpy.zeros_like(value)
    g = numpy.asarray(g, dtype=value.dtype)
    return g if g.shape == value.shape else numpy.broadcast_to(g, value.shape)


def _is_floating(value: PlanValue) -> bool:
    return value.dtype is not None and numpy.issubdtype(value.dtype, numpy.inexact)


def _outer(pn: PlanNode) -> list[PlanValue]:
    """Values a node's subgraphs read from the enclosing graph."""
    return [v for sub in pn.subgraphs.values() for p in (sub if isinstance(sub, tuple) else (sub,)) for v in p.outer]


@dataclass(eq=False)
class RuleStep:
    """One node's vector-Jacobian rule, bound."""

    node: PlanNode
    spec: KernelSpec
    kwargs: dict[str, Any]  # attributes and the context the rule declares (needs, opset...)
    needs: tuple[bool, ...]  # per input: whether its gradient is wanted
    reads: tuple[PlanValue, ...]  # forward values the rule reads
    frees: tuple[PlanValue, ...] = ()  # forward values dead after it


@dataclass(eq=False)
class GradientPlan:
    """The forward plan plus the rules, newest node first, and lifetimes across both.

    Steps are numbered: forward nodes 0..n-1, the outputs dict n, the cotangents n+1, rules n+2...
    ``forward_frees[i]`` replaces ``plan.nodes[i].frees``: a value a rule reads lives longer."""

    plan: Plan
    diff_names: tuple[str, ...]
    sources: dict[str, PlanValue]  # differentiated name -> its value (floating ones)
    useful: set[PlanValue]  # values whose gradient reaches a differentiated value
    rules: list[RuleStep]
    forward_frees: list[tuple[PlanValue, ...]]
    frees_after_outputs: tuple[PlanValue, ...]
    frees_after_cotangents: tuple[PlanValue, ...]


def plan_gradients(plan: Plan, diff_names) -> GradientPlan:
    """The gradient plan of ``plan`` for ``diff_names`` (parameter and input names).

    Raises :class:`NoGradientRuleError` naming every node on a differentiated path whose op has
    no rule, so a missing rule is found when the model is compiled, not when it is trained."""
    diff_names = tuple(diff_names)
    nodes = plan.nodes
    by_name = {v.name: v for v in plan.inputs}
    by_name.update({v.name: v for v in plan.params})
    sources = {n: by_name[n] for n in diff_names if n in by_name and _is_floating(by_name[n])}
    # Which values carry a gradient: floating values reached from a differentiated one...
    requires = set(sources.values())
    for pn in nodes:
        if any(v is not None and v in requires for v in list(pn.inputs) + _outer(pn)):
            requires.update(o for o in pn.outputs if _is_floating(o))
    # ...that also reach an output: those nodes need a rule.
    useful = {v for v in plan.outputs if v in requires}
    active: list[PlanNode] = []
    for pn in reversed(nodes):
        if any(o in useful for o in pn.outputs):
            inputs = [v for v in pn.inputs if v is not None and v in requires]
            if inputs or any(v in requires for v in _outer(pn)):
                active.append(pn)
                useful.update(inputs)

    missing, rules = [], []
    for pn in active:
        spec = RULES.resolve(pn.op_type, pn.opset, pn.domain)
        if spec is None:
            missing.append((pn.label, pn.op_type if not pn.domain else f"{pn.domain}::{pn.op_type}", pn.opset))
            continue
        needs = tuple(v is not None and v in useful for v in pn.inputs)
        kwargs = bind_attributes(spec, pn.attributes, pn.defaults, label=pn.label, op_type=pn.op_type,
                                 opset=pn.opset, kind="gradient rule", graph_attributes=pn.subgraphs)
        if "needs" in spec.accepts:
            kwargs["needs"] = needs
        if "opset" in spec.accepts:
            kwargs["opset"] = pn.opset
        if "num_outputs" in spec.accepts:
            kwargs["num_outputs"] = len(pn.outputs)
        reads = [v for v in pn.inputs if v is not None]
        if "y" in spec.accepts:
            reads.append(pn.outputs[0])
        if "outputs" in spec.accepts:
            reads.extend(pn.outputs)
        rules.append(RuleStep(pn, spec, kwargs, needs, tuple(reads)))
    if missing:
        raise NoGradientRuleError(missing)

    # Lifetimes over both halves.
    n = len(nodes)
    last_use: dict[PlanValue, int] = {}
    for i, pn in enumerate(nodes):
        for v in list(pn.inputs) + _outer(pn):
            if v is not None:
                last_use[v] = i
    for v in plan.outputs:
        last_use[v] = max(last_use.get(v, -1), n + (1 if v in useful else 0))
    for j, step in enumerate(rules):
        for v in step.reads:
            last_use[v] = max(last_use.get(v, -1), n + 2 + j)
    local = set(plan.inputs)
    for pn in nodes:
        local.update(pn.outputs)
    frees: dict[int, list[PlanValue]] = {}
    for v, i in last_use.items():
        if v in local:
            frees.setdefault(i, []).append(v)
    forward_frees = [tuple(frees.get(i, [])) + tuple(o for o in pn.outputs if o.name and o not in last_use)
                     for i, pn in enumerate(nodes)]
    for j, step in enumerate(rules):
        step.frees = tuple(frees.get(n + 2 + j, []))
    return GradientPlan(plan, diff_names, sources, useful, rules, forward_frees,
                        tuple(frees.get(n, [])), tuple(frees.get(n + 1, [])))


@dataclass
class GradientProgram:
    """``run(params, data, cotangents) -> (outputs, gradients)`` for a fixed set of names; asking
    for another set lowers (and caches) another program from the same plan."""

    program: LoweredProgram
    diff_names: tuple[str, ...]
    plan: Plan
    options: dict[str, Any]
    _others: dict[tuple[str, ...], GradientProgram] = field(default_factory=dict)

    @property
    def run(self):
        return self.program.forward

    @property
    def code(self) -> str:
        return self.program.source

    def for_names(self, names) -> GradientProgram:
        names = tuple(names)
        if set(names) == set(self.diff_names):
            return self
        key = tuple(sorted(names))
        if key not in self._others:
            self._others[key] = lower_vjp(self.plan, diff_names=names, **self.options)
        return self._others[key]


def lower_vjp(plan: Plan, *, diff_names, namespace: dict[str, Any], file_path: str | None = None) -> GradientProgram:
    """Print and exec ``vjp(params, data, cotangents) -> (outputs, gradients of diff_names)``."""
    gp = plan_gradients(plan, diff_names)
    em = PythonEmitter({**namespace, "_cotangent": _cotangent, "_zeros": numpy.zeros_like})

    def grad(v: PlanValue) -> str:
        return f"d{v.id}"

    em.emit_header("def vjp(params, data, cotangents):", plan)
    for pn, dead in zip(plan.nodes, gp.forward_frees):
        em.emit_node(pn, 1)
        em.emit_del(1, dead)
    em.emit(1, "outputs = {" + ", ".join(f"{v.name!r}: {em.var(v)}" for v in plan.outputs) + "}")
    em.emit_del(1, gp.frees_after_outputs)
    has_grad: set[PlanValue] = set()

    def accumulate(v: PlanValue, expr: str) -> None:
        em.emit(1, f"{grad(v)} = {grad(v)} + {expr}" if v in has_grad else f"{grad(v)} = {expr}")
        has_grad.add(v)

    for v in plan.outputs:
        if v in gp.useful:
            accumulate(v, f"_cotangent(cotangents, {v.name!r}, {em.var(v)})")
    em.emit_del(1, gp.frees_after_cotangents)

    # Backward: one rule call per active node, newest first.
    sources = set(gp.sources.values())
    for step in gp.rules:
        pn = step.node
        if pn.multi_output:
            grads_in = "(" + "".join((grad(o) if o in has_grad else "None") + ", " for o in pn.outputs) + ")"
        else:
            grads_in = grad(pn.outputs[0])
        kwargs = dict(step.kwargs)
        if "y" in step.spec.accepts:
            kwargs["y"] = Source(em.var(pn.outputs[0]))
        if "outputs" in step.spec.accepts:
            kwargs["outputs"] = Source("(" + "".join(em.var(o) + ", " for o in pn.outputs) + ")")
        input_vars = tuple(None if v is None else em.var(v) for v in pn.inputs)
        call = em.call(step.spec, [grads_in] + [v or "None" for v in input_vars], kwargs, ())
        line = em.emit(1, f"_g = {call}  # {pn.op_type} {pn.label!r} (vjp): {step.spec.location}")
        em.sites[line] = NodeSite(pn.label, pn.op_type, pn.opset, (grads_in,) + input_vars, f"vjp {step.spec.name}")
        seen = set()
        for k, v in enumerate(pn.inputs):
            if not step.needs[k] or v in seen:
                seen.add(v)
                continue
            seen.add(v)
            # The same value at several positions (x * x) sums its entries.
            accumulate(v, " + ".join(f"_g[{j}]" for j in range(k, len(pn.inputs))
                                     if pn.inputs[j] is v and step.needs[j]))
        dead = [grad(o) for o in pn.outputs if o in has_grad and o not in sources]
        em.emit_del(1, step.frees, ["_g"] + dead)

    grads = []
    for name in gp.diff_names:
        v = gp.sources.get(name)
        src = "params" if name in {p.name for p in plan.params} else "data"
        expr = grad(v) if v is not None and v in has_grad else f"_zeros({src}[{name!r}])"
        grads.append(f"{name!r}: {expr}")
    em.emit(1, "return outputs, {" + ", ".join(grads) + "}")
    program = em.finish(f"{plan.backend}-vjp", "vjp", file_path)
    return GradientProgram(program, gp.diff_names, plan, dict(namespace=namespace, file_path=file_path))


__all__ = ["GradientPlan", "GradientProgram", "RuleStep", "lower_vjp", "plan_gradients"]
