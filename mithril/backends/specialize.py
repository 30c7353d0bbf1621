"""The compile-time pass pipeline, and the passes in it that run kernels.

``specialize(model, shapes, constant_names, opsets)`` runs, each on onnx_ir's pass contract:

    InlineFunctions -> SetInputShapes -> Toposort -> (InferShapes -> FoldConstants ->
    InlineConstantIfs)* -> ReducePowers -> FuseMatMulBias -> MarkStopGradients ->
    RemoveIdentities -> RemoveDeadNodes -> Toposort

The bracketed rounds repeat until neither folding nor If inlining changes the graph: then shape
sub-graphs of static shapes are constants. The graph-only passes live in
:mod:`mithril.onnx_bridge.passes`; the two here need the kernels (folding runs them, shape
inference asks them for the output shapes of ops ONNX does not know), so this module imports
them all.

>>> import onnx_ir as ir
>>> from mithril.backends.specialize import FoldConstants
>>> a = ir.Value(name="a", const_value=ir.tensor([1.0, 2.0]))
>>> node = ir.node("Neg", [a], num_outputs=1)
>>> node.outputs[0].name = "y"
>>> graph = ir.Graph([], [node.outputs[0]], nodes=[node], initializers=[a], opset_imports={"": 17})
>>> model = ir.Model(graph, ir_version=8)
>>> FoldConstants({"a"}, {"": 17})(model).modified, model.graph.initializers["y"].const_value.numpy()
(True, array([-1., -2.], dtype=float32))
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np
import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassBase, PassResult

from ..errors import MithrilError, PassError
from ..onnx_bridge.passes import (
    FuseMatMulBias,
    InlineConstantIfs,
    InlineFunctions,
    MarkStopGradients,
    ReducePowers,
    RemoveDeadNodes,
    RemoveIdentities,
    SetInputShapes,
    Toposort,
    onnx_shape_inference,
)
from ..onnx_bridge.schema import canonical_domain
from . import kernels as _kernels  # noqa: F401  (registers every kernel: folding and shape rules read them)
from .interpret import fold_constants
from .plan import plan_of_node
from .registry import REGISTRY

logger = logging.getLogger(__name__)

# At most this many rounds of ONNX inference alternating with the kernels' output-shape rules.
RULE_ROUNDS = 32


class InferShapes(InPlacePass):
    """ONNX shape inference with data propagation; failure leaves the model unchanged. Outputs of
    ops ONNX does not know get shapes from their kernels' ``output_shapes`` rules, and inference
    runs again, until a round sets no shape."""

    def call(self, model: ir.Model) -> PassResult:
        if any(v.type is None for v in model.graph.inputs):
            # An untyped input (a map, whose type onnx_ir cannot hold) crashes onnx's C++ inference.
            return PassResult(model, False)
        for v in model.graph.initializers.values():  # as onnx_ir's inference call sets them
            if v.const_value is not None:
                if v.shape is None:
                    v.shape = v.const_value.shape
                if v.dtype is None:
                    v.dtype = v.const_value.dtype
        if _fully_static(model.graph):
            # Every value already has a dtype and int dims: ONNX inference keeps declared shapes
            # (one it disagrees with is an error it swallows), so it would set nothing.
            return PassResult(model, False)
        modified = False
        for _ in range(RULE_ROUNDS):
            modified |= onnx_shape_inference(model)
            if not _apply_output_shape_rules(model):
                break
            modified = True
        return PassResult(model, modified)


def _is_static(value: ir.Value) -> bool:
    shape = value.shape
    return (shape is not None and isinstance(value.type, ir.TensorType)
            and value.dtype not in (None, ir.DataType.UNDEFINED) and all(isinstance(d, int) for d in shape))


def _fully_static(graph: ir.Graph) -> bool:
    """Whether every value of ``graph`` and its subgraphs (inputs, initializers, named node
    outputs, outputs) is a tensor of known dtype and int dims."""
    if not all(_is_static(v) for v in (*graph.inputs, *graph.initializers.values(), *graph.outputs)):
        return False
    for node in graph:
        if not all(_is_static(o) for o in node.outputs if o.name):
            return False
        for attr in node.attributes.values():
            subs = (attr.value,) if attr.type == ir.AttributeType.GRAPH else (
                attr.value if attr.type == ir.AttributeType.GRAPHS else ())
            if not all(_fully_static(sub) for sub in subs):
                return False
    return True


def _apply_output_shape_rules(model: ir.Model) -> bool:
    """Shapes of outputs ONNX inference leaves unknown, from the kernels' ``output_shapes`` rules
    (ops of domains onnx.defs does not know). Returns whether any shape was set."""
    opsets = {canonical_domain(d): v for d, v in model.opset_imports.items()}
    changed = False
    for node in model.graph:
        outputs = [o for o in node.outputs if o.name]
        if not outputs or all(o.shape is not None for o in outputs):
            continue
        domain = canonical_domain(node.domain)
        rule = REGISTRY.shape_rule(node.op_type, opsets.get(domain, 1), domain)
        if rule is None:
            continue
        pn = plan_of_node(node, opsets)  # the node's values and attributes, bound as lowering binds them
        inputs = [None if v is None else (v.static_shape, v.dtype) for v in pn.inputs]
        attrs = {**pn.defaults, **pn.attributes}
        try:
            results = rule(inputs, attrs)
        except Exception as exc:  # an unusual node: its shapes stay unknown, as before
            logger.debug("no output shapes for %s: %s", node.op_type, exc)
            continue
        for out, (shape, dtype) in zip(node.outputs, results or ()):
            if shape is None or out.shape is not None:
                continue
            out.shape = ir.Shape(shape)
            if out.type is None and dtype is not None:
                out.type = ir.TensorType(ir.DataType.from_numpy(np.dtype(dtype)))
            changed = True
    return changed


class FoldConstants(InPlacePass):
    """Nodes whose inputs are all constants, and Shape/Size of static shapes, become initializers
    computed by the NumPy kernels (:func:`mithril.backends.interpret.fold_constants`).
    ``constant_names`` (the initializers that are constants, not parameters) grows by the folded
    values; ``count`` is the number of nodes folded by the last call."""

    def __init__(self, constant_names: set[str], opsets: dict[str, int]):
        super().__init__()
        self.constant_names = constant_names
        self.opsets = opsets
        self.count = 0

    def call(self, model: ir.Model) -> PassResult:
        _, self.count = fold_constants(model, self.constant_names, self.opsets)
        return PassResult(model, self.count > 0)


def run_pass(pass_: PassBase, model: ir.Model) -> PassResult:
    """Run one pass; a failure that is no MithrilError is reported as a PassError naming the pass."""
    try:
        return pass_(model)
    except MithrilError:
        raise
    except Exception as exc:
        name = type(pass_).__name__
        raise PassError(f"pass {name} failed on this model: {type(exc).__name__}: {exc}") from exc


def specialize(
    model: ir.Model,
    shapes: dict[str, Iterable[int]] | None,
    constant_names: set[str],
    opsets: dict[str, int],
    max_rounds: int = 8,
) -> ir.Model:
    """The compile-time pass pipeline, in place: after it, shape sub-graphs of static shapes are
    constants. ``constant_names`` grows by the values folded."""
    for pass_ in (InlineFunctions(), SetInputShapes(shapes), Toposort()):
        run_pass(pass_, model)
    # Folding makes shapes static, new shapes let more fold, a folded condition inlines its If.
    rounds = (InferShapes(), FoldConstants(constant_names, opsets), InlineConstantIfs(constant_names))
    for _ in range(max_rounds):
        results = [run_pass(pass_, model) for pass_ in rounds]
        if not (results[1].modified or results[2].modified):
            break
    for pass_ in (
        ReducePowers(constant_names, opsets),
        FuseMatMulBias(constant_names, opsets),
        # After inference and folding: the internal op has no ONNX schema for them to read.
        MarkStopGradients(),
        RemoveIdentities(),
        RemoveDeadNodes(),
        Toposort(),
    ):
        run_pass(pass_, model)
    return model
