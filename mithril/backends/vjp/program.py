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

With gradient checkpointing (:mod:`..checkpoint`), a segment's values die in the forward half
like in an inference program, except those that cross a segment boundary; before the rules of a
segment run, the nodes producing what those rules read run again (their lines are printed a
second time, under a ``# segment <i> ... again`` comment), and die after their last rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy

from ..emit_python import LoweredProgram, NodeSite, PythonEmitter, Source
from ..checkpoint import Checkpointing, Segment
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


@dataclass(eq=False)
class Step:
    """One step of the gradient program, in the order it runs: a forward node ("forward"), the
    outputs dict ("outputs"), the cotangents ("cotangents"), a forward node run again before the
    rules of its checkpointed segment ("recompute"), or a rule ("rule")."""

    kind: str
    node: PlanNode | None = None
    rule: RuleStep | None = None
    segment: Segment | None = None  # the segment a "recompute" step rebuilds
    frees: tuple[PlanValue, ...] = ()  # forward values dead after it (filled by _set_frees)


@dataclass(eq=False)
class GradientPlan:
    """The forward plan plus the rules, newest node first, scheduled in ``steps`` with the
    lifetimes of forward values across both halves. With ``checkpointing`` (the plan cut into
    segments) the forward keeps only what crosses a segment boundary, and each segment's nodes
    run again, just before its rules, to rebuild what those read."""

    plan: Plan
    diff_names: tuple[str, ...]
    sources: dict[str, PlanValue]  # differentiated name -> its value (floating ones)
    useful: set[PlanValue]  # values whose gradient reaches a differentiated value
    rules: list[RuleStep]
    steps: list[Step]
    checkpointing: Checkpointing | None = None

    @property
    def forward_frees(self) -> list[tuple[PlanValue, ...]]:
        """Per forward node, what dies after it (instead of ``plan.nodes[i].frees``: a value a rule
        reads lives longer)."""
        return [step.frees for step in self.steps if step.kind == "forward"]

    @property
    def recomputed(self) -> list[PlanNode]:
        """Forward nodes the backward half runs again (checkpointing only)."""
        return [step.node for step in self.steps if step.kind == "recompute"]


def plan_gradients(plan: Plan, diff_names, checkpointing: Checkpointing | None = None) -> GradientPlan:
    """The gradient plan of ``plan`` for ``diff_names`` (parameter and input names); with
    ``checkpointing`` (:func:`~mithril.backends.checkpoint.checkpoint_segments` of ``plan``),
    recomputing each segment in the backward half instead of keeping its values.

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

    steps = [Step("forward", node=pn) for pn in nodes] + [Step("outputs"), Step("cotangents")]
    segment_of = checkpointing.segment_of() if checkpointing is not None else {}
    for rule in rules:
        segment = segment_of.get(rule.node)
        if segment is not None and not any(s.segment is segment for s in steps):
            steps += [Step("recompute", node=pn, segment=segment)
                      for pn in _rebuilt(segment, [r for r in rules if segment_of.get(r.node) is segment])]
        steps.append(Step("rule", node=rule.node, rule=rule))
    _set_frees(plan, useful, steps)
    return GradientPlan(plan, diff_names, sources, useful, rules, steps, checkpointing)


def _rebuilt(segment: Segment, rules: list[RuleStep]) -> list[PlanNode]:
    """The segment's nodes, in order, that rebuild what its ``rules`` read: its values other
    than those it passes on (kept anyway, as the next segment's inputs or the outputs)."""
    inside = segment.defined - set(segment.outputs)
    wanted = {v for rule in rules for v in rule.reads if v in inside}
    chosen = []
    for pn in reversed(segment.nodes):
        if wanted.intersection(pn.outputs):
            chosen.append(pn)
            wanted.update(v for v in list(pn.inputs) + _outer(pn) if v is not None and v in inside)
    return chosen[::-1]


def _bound(pn: PlanNode) -> list[PlanValue]:
    """The outputs the printed node binds to names (a multi-output node: the named ones)."""
    return list(pn.outputs) if len(pn.outputs) == 1 else [o for o in pn.outputs if o.name]


def _set_frees(plan: Plan, useful: set[PlanValue], steps: list[Step]) -> None:
    """Each step's ``frees``: the forward values whose last reader it is, per definition (a
    recomputed value is a new one), and the outputs it binds that nobody reads."""
    local = set(plan.inputs) | {o for pn in plan.nodes for o in pn.outputs}
    current: dict[PlanValue, int] = {v: -1 for v in plan.inputs}
    last: dict[tuple[PlanValue, int], int] = {}
    for i, step in enumerate(steps):
        if step.kind in ("forward", "recompute"):
            reads: list = [v for v in step.node.inputs if v is not None] + _outer(step.node)
        elif step.kind == "outputs":
            reads = list(plan.outputs)
        elif step.kind == "cotangents":
            reads = [v for v in plan.outputs if v in useful]
        else:
            reads = list(step.rule.reads)
        for v in reads:
            if v in local:
                last[(v, current[v])] = i
        if step.node is not None and step.kind != "rule":
            for o in _bound(step.node):
                current[o] = i
                last.setdefault((o, i), i)  # read by no one: dead at once
    frees: dict[int, list[PlanValue]] = {}
    for (v, _), i in last.items():
        frees.setdefault(i, []).append(v)
    for i, step in enumerate(steps):
        step.frees = tuple(dict.fromkeys(frees.get(i, ())))


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


def lower_vjp(plan: Plan, *, diff_names, namespace: dict[str, Any], file_path: str | None = None,
              checkpointing: Checkpointing | None = None) -> GradientProgram:
    """Print and exec ``vjp(params, data, cotangents) -> (outputs, gradients of diff_names)``;
    with ``checkpointing``, re-running each segment's forward nodes before its rules."""
    gp = plan_gradients(plan, diff_names, checkpointing)
    em = PythonEmitter({**namespace, "_cotangent": _cotangent, "_zeros": numpy.zeros_like})
    sources = set(gp.sources.values())
    has_grad: set[PlanValue] = set()

    def grad(v: PlanValue) -> str:
        return f"d{v.id}"

    def accumulate(v: PlanValue, expr: str) -> None:
        em.emit(1, f"{grad(v)} = {grad(v)} + {expr}" if v in has_grad else f"{grad(v)} = {expr}")
        has_grad.add(v)

    em.emit_header("def vjp(params, data, cotangents):", plan)
    previous = None
    for step in gp.steps:
        extra: list[str] = []
        if step.kind == "forward":
            em.emit_node(step.node, 1)
        elif step.kind == "outputs":
            em.emit(1, "outputs = {" + ", ".join(f"{v.name!r}: {em.var(v)}" for v in plan.outputs) + "}")
        elif step.kind == "cotangents":
            for v in plan.outputs:
                if v in gp.useful:
                    accumulate(v, f"_cotangent(cotangents, {v.name!r}, {em.var(v)})")
        elif step.kind == "recompute":
            if previous is None or previous.segment is not step.segment:
                seg = step.segment
                em.emit(1, f"# segment {seg.index} ({seg.nodes[0].label!r} to {seg.nodes[-1].label!r}) again: "
                           "what its rules read (gradient checkpointing)")
            em.emit_node(step.node, 1)
        else:
            extra = _emit_rule(em, step.rule, grad, has_grad, accumulate, sources)
        em.emit_del(1, step.frees, extra)
        previous = step

    grads = []
    for name in gp.diff_names:
        v = gp.sources.get(name)
        src = "params" if name in {p.name for p in plan.params} else "data"
        expr = grad(v) if v is not None and v in has_grad else f"_zeros({src}[{name!r}])"
        grads.append(f"{name!r}: {expr}")
    em.emit(1, "return outputs, {" + ", ".join(grads) + "}")
    program = em.finish(f"{plan.backend}-vjp", "vjp", file_path)
    return GradientProgram(program, gp.diff_names, plan,
                           dict(namespace=namespace, file_path=file_path, checkpointing=checkpointing))


def _emit_rule(em: PythonEmitter, rule: RuleStep, grad, has_grad: set[PlanValue], accumulate,
               sources: set[PlanValue]) -> list[str]:
    """One rule call and the sums of its input gradients; returns the names dead after it."""
    pn = rule.node
    if pn.multi_output:
        grads_in = "(" + "".join((grad(o) if o in has_grad else "None") + ", " for o in pn.outputs) + ")"
    else:
        grads_in = grad(pn.outputs[0])
    kwargs = dict(rule.kwargs)
    if "y" in rule.spec.accepts:
        kwargs["y"] = Source(em.var(pn.outputs[0]))
    if "outputs" in rule.spec.accepts:
        kwargs["outputs"] = Source("(" + "".join(em.var(o) + ", " for o in pn.outputs) + ")")
    input_vars = tuple(None if v is None else em.var(v) for v in pn.inputs)
    call = em.call(rule.spec, [grads_in] + [v or "None" for v in input_vars], kwargs, ())
    line = em.emit(1, f"_g = {call}  # {pn.op_type} {pn.label!r} (vjp): {rule.spec.location}")
    em.sites[line] = NodeSite(pn.label, pn.op_type, pn.opset, (grads_in,) + input_vars, f"vjp {rule.spec.name}")
    seen = set()
    for k, v in enumerate(pn.inputs):
        if not rule.needs[k] or v in seen:
            seen.add(v)
            continue
        seen.add(v)
        # The same value at several positions (x * x) sums its entries.
        accumulate(v, " + ".join(f"_g[{j}]" for j in range(k, len(pn.inputs))
                                 if pn.inputs[j] is v and rule.needs[j]))
    return ["_g"] + [grad(o) for o in pn.outputs if o in has_grad and o not in sources]


__all__ = ["GradientPlan", "GradientProgram", "RuleStep", "Step", "lower_vjp", "plan_gradients"]
