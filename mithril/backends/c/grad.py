"""C gradients: the gradient program of a lowering plan, rendered as C.

:func:`lower_gradients` takes the same plan :func:`~mithril.backends.c.render.render` prints and
the schedule NumPy's gradient program runs (:func:`~mithril.backends.vjp.plan_gradients`: the
forward nodes, then each node's vector-Jacobian rule, newest first) and flattens it into items:

- ``forward``: a forward node, printed by its C rule (:mod:`.ops`);
- ``rule``: a node's backward, printed by its rule in :mod:`.grad_rules` (registered in
  :data:`.grad_items.GRAD_KERNELS`), writing the gradient of each wanted input into a buffer of its own;
- ``sum``: two gradients of one value added (a value read by several nodes).

Every value, cotangents included, is written once, so the items partition into C segments and
share one arena exactly like the forward program: a forward value lives until its last reader,
forward or backward, and a gradient until the rule (or sum) that reads it. Items without a C
rule run on NumPy between segments (the forward kernels, NumPy's vjp rules), warned once with
``fallback="numpy"``, refused at compile with ``fallback=None``. The C kernels are in
``lib/mt_grad.h``.

    >>> import mithril as ml
    >>> from mithril.models import Linear
    >>> pm = ml.compile(Linear(2), ml.CBackend(), shapes={"input": [4, 3]}, trainable_keys={"weight"})
    >>> out, grads = pm.evaluate(data={"input": ml.CBackend().ones(4, 3)},
    ...                          output_gradients={"output": ml.CBackend().ones(4, 2)})
    >>> grads["weight"].shape  # Linear's weight is [out, in]
    (2, 3)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import MithrilError, NodeError
from ..plan import Plan, PlanValue
from ..vjp.program import plan_gradients
from . import grad_rules  # noqa: F401  (registers the C backward kernels)
from .grad_items import GRAD_KERNELS, Item, gradient_items, item_scratch, why_not_c_item
from .program import CKernelMissingError, CProgram
from .ops import Emitter
from .render import Segment, Renderer, layout_segment, preamble


class _GradRenderer(Renderer):
    def item(self, item: Item, buf, scratch: str | None) -> None:
        if item.kind == "forward":
            self.node(item.node, buf, scratch)
            return
        c = Emitter(self, buf, scratch)
        if item.kind == "sum":
            a, b = item.reads
            y = item.writes[0]
            self.lines.append(f"    /* {item.label} */")
            c.line(f"mt_grad_add_{c.sfx(y)}({c.buf(a)}, {c.buf(b)}, {c.buf(y)}, {c.numel(y)});")
            return
        pn = item.node
        self.lines.append(f"    /* {pn.label} ({pn.op_type} backward) */")
        before = len(self.problems)
        GRAD_KERNELS[(pn.domain, pn.op_type)].emit(item, c)
        self.failures += [(pn, f"{p} (backward)") for p in self.problems[before:]]


@dataclass
class GradientSource:
    source: str
    steps: list
    arena_bytes: int
    naive_bytes: int
    fallback: list[Item]
    failures: list


def render_gradients(plan: Plan, items: list[Item], final: list[PlanValue]) -> GradientSource:
    """The items as C segments ``seg<k>`` (C-able runs) and NumPy steps; ``final`` are the values
    returned to Python (outputs, gradients)."""
    r = _GradRenderer(plan)
    steps: list = []
    fallback: list[Item] = []
    for item in items:
        if why_not_c_item(item) is None:
            if not steps or not isinstance(steps[-1], Segment):
                steps.append(Segment(len([s for s in steps if isinstance(s, Segment)]), []))
            steps[-1].nodes.append(item)
        else:
            steps.append(item)
            if item.kind == "rule":
                fallback.append(item)
    readers: dict[PlanValue, list[int]] = {}
    for i, step in enumerate(steps):
        for item in step.nodes if isinstance(step, Segment) else [step]:
            for v in item.reads:
                readers.setdefault(v, []).append(i)
    kept = set(final)
    r.lines += preamble(plan, "a training step's forward and backward, one function per C segment",
                        ("mithril_kernels.h", "mt_grad.h"))
    arena_bytes, naive = 0, 0
    for si, step in enumerate(steps):
        if not isinstance(step, Segment):
            continue
        lay = layout_segment(step, lambda v, si=si: v in kept or any(i > si for i in readers.get(v, [])),
                             lambda item: item.reads, lambda item: item.writes, item_scratch)
        arena_bytes = max(arena_bytes, lay.arena_bytes)
        naive += lay.naive_bytes
        r.lines.append(f"int seg{step.index}(void *const *io, char *arena) {{")
        r.lines.append("    (void)io; (void)arena;")
        for j, item in enumerate(step.nodes):
            r.item(item, lay.buf, f"(arena + {lay.scratch[j]})" if j in lay.scratch else None)
        r.lines += ["    return 0;", "}", ""]
    return GradientSource("\n".join(r.lines) + "\n", steps, arena_bytes, naive, fallback, r.failures)


# ---------------------------------------------------------------------------------------------
# The program


@dataclass
class CGradientProgram(CProgram):
    """``run(params, data, cotangents) -> (outputs, gradients)``: a training step's forward and
    backward, as C segments and NumPy steps. ``for_names`` lowers (and caches) the program of
    another set of differentiated names from the same plan."""

    diff_names: tuple = ()
    cotangent_values: dict = field(default_factory=dict)
    grad_values: dict = field(default_factory=dict)  # differentiated name -> its gradient value
    relower: Any = None
    _others: dict = field(default_factory=dict, repr=False)

    @property
    def code(self) -> str:
        return self.source

    def for_names(self, names) -> CGradientProgram:
        names = tuple(names)
        if set(names) == set(self.diff_names):
            return self
        key = tuple(sorted(names))
        if key not in self._others:
            self._others[key] = self.relower(names)
        return self._others[key]

    def run(self, params: dict, data: dict, cotangents: dict | None = None):  # type: ignore[override]
        started = self._start_call()
        cotangents = cotangents or {}
        env: dict = {}
        for v in self.plan.inputs:
            env[v] = params[v.name] if v.kind == "param" else data[v.name]
        for v in self.plan.params:
            env.setdefault(v, params[v.name])
        for v, cv in self.cotangent_values.items():
            g = cotangents.get(v.name)
            g = np.zeros(cv.static_shape, cv.dtype) if g is None else np.asarray(g, dtype=cv.dtype)
            env[cv] = np.ascontiguousarray(np.broadcast_to(g, cv.static_shape))
        for step in self.steps:
            if hasattr(step, "nodes"):
                self.run_segment(step, env)
            else:
                self._run_numpy(step, env)
        outputs = {v.name: self.read(v, env) for v in self.plan.outputs}
        grads = {}
        for name in self.diff_names:
            gv = self.grad_values.get(name)
            if gv is not None:
                grads[name] = env[gv]
            else:
                grads[name] = np.zeros_like(np.asarray(params[name] if name in params else data[name]))
        self._end_call(started)
        return outputs, grads

    def _run_numpy(self, item: Item, env: dict) -> None:
        pn = item.node
        try:
            if item.kind == "sum":
                a, b = item.reads
                env[item.writes[0]] = env[a] + env[b]
            elif item.kind == "forward":
                args = [None if v is None else self.read(v, env) for v in pn.inputs]
                for o, r in zip(pn.outputs, self.interpreter.run_node(pn, args, env)):
                    env[o] = r
            else:
                rule = item.rule
                g = (tuple(None if c is None else env[c] for c in item.cot) if pn.multi_output
                     else env[item.cot[0]])
                kwargs = dict(rule.kwargs)
                if "y" in rule.spec.accepts:
                    kwargs["y"] = self.read(pn.outputs[0], env)
                if "outputs" in rule.spec.accepts:
                    kwargs["outputs"] = tuple(self.read(o, env) for o in pn.outputs)
                args = [None if v is None else self.read(v, env) for v in pn.inputs]
                result = rule.spec.fn(g, *args, **kwargs)
                for k, d in enumerate(item.grads):
                    if d is None:
                        continue
                    parts = [result[j] for j in range(k, len(pn.inputs))
                             if pn.inputs[j] is pn.inputs[k] and rule.needs[j] and result[j] is not None]
                    shape = d.static_shape or np.shape(args[k])
                    total = sum(parts[1:], parts[0]) if parts else np.zeros(shape, d.dtype)
                    env[d] = np.asarray(total, dtype=d.dtype)
        except MithrilError:
            raise
        except Exception as exc:
            ins = [v for v in pn.inputs if v is not None] if pn is not None else item.reads
            raise NodeError(f"CBackend gradients: {item.label} failed on NumPy: {type(exc).__name__}: {exc}",
                            node=pn.label if pn else None, op_type=pn.op_type if pn else None,
                            opset=pn.opset if pn else None, shapes=[v.shape for v in ins],
                            dtypes=[str(v.dtype) for v in ins]) from exc


def lower_gradients(plan: Plan, diff_names, *, fallback: str | None = "numpy", num_threads: int | None = None,
                    file_path: str | None = None, warn: bool = True) -> CGradientProgram:
    """The gradient program of ``plan`` for ``diff_names`` as C (see the module docstring)."""
    from .program import CFallbackWarning
    from .build import build_library, load_library

    gp = plan_gradients(plan, diff_names)
    items, cotangents, grad_of = gradient_items(gp)
    grad_values = {name: grad_of[v] for name, v in gp.sources.items() if v in grad_of}
    final = list(plan.outputs) + list(grad_values.values())
    rendered = render_gradients(plan, items, final)
    if rendered.fallback:
        listed = ", ".join(f"{it.node.label} ({it.node.op_type}: {why_not_c_item(it)})" for it in rendered.fallback)
        if fallback is None:
            raise CKernelMissingError(f"CBackend(fallback=None): {len(rendered.fallback)} node(s) have no C backward "
                                      f"kernel: {listed}")
        if warn:
            from ..options import warn_user

            warn_user(f"CBackend: the backward of {len(rendered.fallback)} node(s) runs on NumPy (no C backward "
                      f"kernel): {listed}", CFallbackWarning)
    library = build_library(rendered.source)
    if file_path:
        path = file_path[:-3] + ".c" if file_path.endswith(".py") else file_path
        with open(path, "w") as f:
            f.write(rendered.source)
    return CGradientProgram(
        rendered.source, file_path or "<mithril-c-gradients>", rendered.steps, rendered.arena_bytes,
        rendered.naive_bytes, [it.node for it in rendered.fallback], load_library(library), num_threads, plan,
        rendered.failures, diff_names=gp.diff_names, cotangent_values=cotangents, grad_values=grad_values,
        relower=lambda names: lower_gradients(plan, names, fallback=fallback, num_threads=num_threads, warn=False))



__all__ = ["CGradientProgram", "GradientSource", "lower_gradients", "render_gradients"]
