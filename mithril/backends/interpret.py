"""Running a lowering plan with NumPy, node by node: the reference interpreter and constant folding.

:class:`Interpreter` walks a :class:`~.plan.Plan` as torch.fx's ``Interpreter`` walks a graph:
each node's kernel, called with the arguments the plan bound. :func:`fold_constants` runs it
over the nodes whose inputs are all constants (and Shape/Size of static shapes) with the shared
NumPy kernels, so folding agrees with the NumPy backend by construction. The pass that runs it
in the compile pipeline is :class:`mithril.backends.specialize.FoldConstants`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx_ir as ir

from .plan import Plan, PlanNode, PlanValue, build_plan, check_outputs, first_output

logger = logging.getLogger(__name__)

# Folding never materializes constants larger than this (elements): they would bloat the program.
FOLD_SIZE_LIMIT = 1 << 22


class Interpreter:
    """Runs a plan with its kernels over the array namespace ``xp`` (NumPy by default).

    >>> import mithril as ml, numpy as np, onnx
    >>> from onnx import helper, TensorProto
    >>> g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
    ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
    ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    >>> m = ml.load_onnx(helper.make_model(g))
    >>> plan = build_plan(m.ir.graph, m.opset_imports)
    >>> Interpreter(plan).run({}, {"x": np.array([-1.0, 2.0], np.float32)})["y"].tolist()
    [0.0, 2.0]
    """

    def __init__(self, plan: Plan, *, xp: Any = np, rng: np.random.Generator | None = None, ctx: Any = None):
        self.plan = plan
        self.runtime = {"xp": xp, "rng": rng if rng is not None else np.random.default_rng(0), "ctx": ctx}

    def run(self, params: Mapping[str, Any], data: Mapping[str, Any]) -> dict[str, Any]:
        env: dict[PlanValue, Any] = {}
        for v in self.plan.inputs:
            env[v] = params[v.name] if v.kind == "param" else data[v.name]
        for v in self.plan.params:
            env.setdefault(v, params[v.name])
        outputs = self.run_graph(self.plan, env)
        return {v.name: out for v, out in zip(self.plan.outputs, outputs)}

    def run_graph(self, plan: Plan, env: dict[PlanValue, Any]) -> list[Any]:
        for pn in plan.nodes:
            results = self.run_node(pn, [None if v is None else self.read(v, env) for v in pn.inputs], env)
            for o, r in zip(pn.outputs, results):
                env[o] = r
            for v in pn.frees:
                env.pop(v, None)
        return [self.read(v, env) for v in plan.outputs]

    def read(self, value: PlanValue, env: dict[PlanValue, Any]) -> Any:
        return value.value if value.kind == "constant" else env[value]

    def run_node(self, pn: PlanNode, args: list[Any], env: Mapping[PlanValue, Any] | None = None) -> list[Any]:
        """The node's outputs, one per ``pn.outputs``, as the generated program computes them."""
        kwargs = dict(pn.kwargs)
        for name, sub in pn.subgraphs.items():
            subs = tuple(self._closure(p, env or {}) for p in (sub if isinstance(sub, tuple) else (sub,)))
            kwargs[name] = subs if isinstance(sub, tuple) else subs[0]
        for name in pn.runtime:
            kwargs[name] = self.runtime[name]
        out = pn.spec.fn(*args, **kwargs)
        n = len(pn.outputs)
        if n == 1:
            return [first_output(out) if pn.multi_output else out]
        return list(check_outputs(out, n))[:n]

    def _closure(self, plan: Plan, outer: Mapping[PlanValue, Any]):
        def body(*inputs):
            env = {v: outer[v] for v in plan.outer if v in outer}
            env.update(zip(plan.inputs, inputs))
            return tuple(self.run_graph(plan, env))

        return body


def _static_dims(value: PlanValue | None) -> tuple[int, ...] | None:
    return None if value is None else value.static_shape


def _fold_shape(pn: PlanNode) -> list[np.ndarray] | None:
    """Shape and Size of a value whose dims are all known."""
    if pn.domain != "" or not pn.inputs or (dims := _static_dims(pn.inputs[0])) is None:
        return None
    if pn.op_type == "Shape":
        start, end = pn.attributes.get("start", 0), pn.attributes.get("end")
        return [np.array(dims[start:end], dtype=np.int64)]
    if pn.op_type == "Size":
        return [np.array(int(np.prod(dims)), dtype=np.int64)]
    return None


def fold_constants(model: ir.Model, constant_names: set[str], opsets: dict[str, int]) -> tuple[ir.Model, int]:
    """Evaluate nodes whose inputs are all constants, and Shape/Size of static shapes, by running
    the graph's plan (shared kernels) with the :class:`Interpreter`; each folded node becomes
    initializers. Returns the model and the number of nodes folded."""
    graph = model.graph
    params = {name for name, v in graph.initializers.items() if name not in constant_names or v.const_value is None}
    plan = build_plan(graph, opsets, "*", param_names=params, strict=False)
    interpreter = Interpreter(plan)
    known: dict[PlanValue, np.ndarray] = {}
    folded = 0
    for node, pn in zip(list(graph), plan.nodes):
        result = _fold_shape(pn)
        if result is None:
            args = [None if v is None else v.value if v.kind == "constant" else known.get(v) for v in pn.inputs]
            if any(v is not None and a is None for v, a in zip(pn.inputs, args)):
                continue
            if pn.spec is None or pn.problem is not None or pn.subgraphs or pn.spec.nondeterministic:
                continue
            if any(o.type is not None and not isinstance(o.type, ir.TensorType) for o in node.outputs):
                continue
            if any(np.prod(o.static_shape or (), dtype=np.float64) > FOLD_SIZE_LIMIT for o in pn.outputs):
                continue  # a result too large to keep is never computed (ConstantOfShape [1e5, 1e5])
            try:
                result = interpreter.run_node(pn, args)
            except Exception as exc:  # leave it to run time, where the error names the node
                logger.debug("not folding %s: %s", pn.label, exc)
                continue
            if any(not isinstance(r, (np.ndarray, np.generic)) for r in result):
                continue
        result = [np.asarray(r) for r in result]
        if any(r.size > FOLD_SIZE_LIMIT or r.dtype == object for r in result):
            continue
        for out, pv, arr in zip(node.outputs, pn.outputs, result):
            known[pv] = arr
            if not out.name and not out.uses():
                continue
            new = ir.Value(name=out.name, shape=ir.Shape(arr.shape),
                           type=ir.TensorType(ir.DataType.from_numpy(arr.dtype)), const_value=ir.tensor(arr))
            out.name = None
            out.replace_all_uses_with(new, replace_graph_outputs=True)
            graph.register_initializer(new)
            constant_names.add(new.name)
        graph.remove(node, safe=False)
        folded += 1
    return model, folded


__all__ = ["FOLD_SIZE_LIMIT", "Interpreter", "fold_constants"]
