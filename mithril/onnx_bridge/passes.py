"""Graph passes that need only the graph: each a small, named onnx_ir pass.

Each pass follows onnx_ir's contract (:class:`onnx_ir.passes.InPlacePass`): constructed with what
it needs (shapes, constant names, opsets), called on a model, it rewrites the model in place and
returns ``PassResult(model, modified)``, where ``modified`` says whether it changed anything.

>>> import onnx_ir as ir
>>> x = ir.Value(name="x", shape=ir.Shape([2]), type=ir.TensorType(ir.DataType.FLOAT))
>>> node = ir.node("Identity", [x], num_outputs=1)
>>> node.outputs[0].name = "y"
>>> model = ir.Model(ir.Graph([x], [node.outputs[0]], nodes=[node]), ir_version=8)
>>> RemoveDeadNodes()(model).modified
False

Passes that run kernels (constant folding, the kernels' output-shape rules) and the compile
pipeline that chains them all live in :mod:`mithril.backends.specialize`.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common
from onnx_ir.passes import InPlacePass, PassResult

from ..errors import ShapeError
from .schema import canonical_domain as _canonical_domain

__all__ = [
    "FuseMatMulBias",
    "InlineConstantIfs",
    "InlineFunctions",
    "MarkStopGradients",
    "ReducePowers",
    "RelaxUnknownDims",
    "RemoveDeadNodes",
    "RemoveIdentities",
    "SetInputShapes",
    "Toposort",
    "onnx_shape_inference",
    "static_shape",
]

# The frontend's StopGradient exports as an Identity carrying this mark (onnxruntime ignores it).
STOP_GRADIENT_MARK = "mithril.stop_gradient"
INTERNAL_DOMAIN = "ai.mithril"

_FLOAT_TYPES = (ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)


def all_graphs(graph: ir.Graph):
    """``graph`` and every subgraph under it (If branches, Loop/Scan bodies), outermost first."""
    yield graph
    yield from _subgraphs(graph)


def _node_subgraphs(node: ir.Node) -> list[ir.Graph]:
    subs: list[ir.Graph] = []
    attrs = node.attributes
    # onnx_ir's Attributes is a UserDict: its values() costs a Python call per entry, .data's none.
    for attr in getattr(attrs, "data", attrs).values():
        if attr.type == ir.AttributeType.GRAPH:
            subs.append(attr.value)
        elif attr.type == ir.AttributeType.GRAPHS:
            subs.extend(attr.value)
    return subs


def _subgraphs(graph: ir.Graph):
    # The order of a walk of graph.all_nodes() (each node's subgraphs, then the nodes inside
    # them), without onnx_ir's iterator, which costs ~5 us a node.
    for node in graph:
        if node.attributes:
            subs = _node_subgraphs(node)
            yield from subs
            for sub in subs:
                yield from _subgraphs(sub)


def static_shape(value: ir.Value) -> tuple[int, ...] | None:
    """``value``'s dims when all are known integers, else None."""
    if value.shape is None:
        return None
    dims = tuple(value.shape)
    if all(isinstance(d, int) for d in dims):
        return dims
    return None


class RelaxUnknownDims(InPlacePass):
    """Declared dims of -1 or 0 are unknown, not fixed. PaddlePaddle's exporter and older
    converters write ``dim_value: -1`` (some write 0) where the spec says ``dim_param``, and
    onnxruntime accepts any size there; ``shapes`` at compile fixes them like any symbolic dim.
    Initializers keep their shapes: those come from the tensors themselves."""

    def call(self, model: ir.Model) -> PassResult:
        modified = False
        for graph in list(all_graphs(model.graph)):
            values = list(graph.inputs) + list(graph.outputs)
            values += [o for node in graph for o in node.outputs]
            for value in values:
                if value.shape is None or value.const_value is not None:
                    continue
                dims = list(value.shape)
                if any(isinstance(d, int) and d <= 0 for d in dims):
                    value.shape = ir.Shape([None if isinstance(d, int) and d <= 0 else d for d in dims])
                    modified = True
        return PassResult(model, modified)


class InlineFunctions(InPlacePass):
    """Inline model-local functions so every node is a standard op."""

    def call(self, model: ir.Model) -> PassResult:
        if not model.functions:
            return PassResult(model, False)
        common.InlinePass()(model)
        common.RemoveUnusedFunctionsPass()(model)
        return PassResult(model, True)  # the functions, called or not, are gone


class SetInputShapes(InPlacePass):
    """Fix graph inputs to concrete ``shapes`` (input name -> dims), checking rank and static dims
    against the model."""

    def __init__(self, shapes: dict[str, Iterable[int]] | None):
        super().__init__()
        self.shapes = shapes

    def call(self, model: ir.Model) -> PassResult:
        modified = False
        by_name = {v.name: v for v in model.graph.inputs}
        for name, shape in (self.shapes or {}).items():
            if name not in by_name:
                raise ShapeError(
                    f"shapes names {name!r}, which is not a graph input (inputs: {sorted(by_name)})"
                )
            value = by_name[name]
            if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in shape):
                raise ShapeError(f"shapes[{name!r}] must be a sequence of ints, got {shape!r}: a dim left out "
                                 "of shapes keeps the model's own (symbolic) dim; leave the input out of shapes "
                                 "to keep them all")
            shape = tuple(int(d) for d in shape)
            if value.shape is not None:
                declared = value.shape
                if len(declared) != len(shape):
                    raise ShapeError(
                        f"input {name!r} has rank {len(declared)} ({declared}) but shapes gives {list(shape)}"
                    )
                for axis, (want, got) in enumerate(zip(declared, shape)):
                    if isinstance(want, int) and want != got:
                        raise ShapeError(
                            f"input {name!r} dim {axis} is fixed to {want} in the model but shapes gives {got}"
                        )
            if value.shape is None or tuple(value.shape) != shape:
                value.shape = ir.Shape(shape)
                modified = True
        return PassResult(model, modified)


def onnx_shape_inference(model: ir.Model) -> bool:
    """ONNX shape inference with data propagation, in place; failure leaves the model unchanged.
    Returns whether any shape or type changed."""
    if any(v.type is None for v in model.graph.inputs):
        # An untyped input (a map, whose type onnx_ir cannot hold) crashes onnx's C++ inference.
        return False
    # onnx_ir logs a traceback when inference fails; the model then keeps its declared shapes,
    # which is a normal outcome here (unknown dims stay unknown), not an error to show users.
    ir_logger = logging.getLogger("onnx_ir.passes.common.shape_inference")
    level = ir_logger.level
    ir_logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if _flat_and_named(model):
                return _infer_flat(model)
            return common.ShapeInferencePass(check_type=False, strict_mode=False, data_prop=True)(model).modified
    except ir.serde.SerdeError:
        return False  # inferred types onnx_ir cannot read (ZipMap's sequence of maps): keep the declared ones
    finally:
        ir_logger.setLevel(level)


def _infer_shapes_proto(proto):
    import onnx

    return onnx.shape_inference.infer_shapes(proto, check_type=False, strict_mode=False, data_prop=True)


def _flat_and_named(model: ir.Model) -> bool:
    """Whether the model has no subgraphs and no functions, and each name in its graph is one
    value, defined in it: then :func:`_infer_flat` merges what inference found as onnx_ir's pass
    does."""
    if model.functions:
        return False
    graph = model.graph
    defined = {v.name for v in graph.inputs}
    if len(defined) != len(graph.inputs) or "" in defined or None in defined:
        return False
    for v in graph.initializers.values():
        if v.name not in defined:
            defined.add(v.name)
    count = len(defined)
    for node in graph:
        if node.attributes and _node_subgraphs(node):
            return False
        for v in node.inputs:
            if v is not None and v.name and v.name not in defined:
                return False  # read before it is defined, or never defined
        for o in node.outputs:
            if o.name:
                defined.add(o.name)
                count += 1
                if len(defined) != count:
                    return False  # a name defined twice
    return all(v.name in defined for v in graph.outputs)


def _infer_flat(model: ir.Model) -> bool:
    """onnx_ir's ShapeInferencePass on a model :func:`_flat_and_named` accepts, without
    deserializing the inferred model: each value takes the dtype and shape of its ValueInfoProto
    in the result (graph input, else value_info, an output's overriding either), as the pass's
    merge reads them (ResNet-50: 9 ms of a 50 ms compile saved)."""
    try:
        from onnx_ir.passes.common import _c_api_utils
    except ImportError:  # another onnx_ir: its pass
        return common.ShapeInferencePass(check_type=False, strict_mode=False, data_prop=True)(model).modified
    try:
        inferred = _c_api_utils.call_onnx_api(_infer_shapes_proto, model).graph
    except Exception:  # the pass leaves the model unchanged when inference fails
        return False
    graph = model.graph
    inputs = {info.name: info for info in inferred.input}
    value_info = {info.name: info for info in inferred.value_info}
    infos = dict(inputs)
    for node in inferred.node:
        for name in node.output:
            if name and name not in inputs and name in value_info:
                infos[name] = value_info[name]
    for info in inferred.output:
        infos[info.name] = info
    # Every value's inferred type first (an unreadable one raises before anything changed).
    found: dict[str, tuple] = {}
    for name, info in infos.items():
        holder = ir.serde.deserialize_value_info_proto(info, None)
        found[name] = (holder.shape, holder.dtype)
    values: dict[str, ir.Value] = dict(graph.initializers)
    for v in graph.inputs:
        values.setdefault(v.name, v)
    for node in graph:
        for v in node.inputs:
            if v is not None and v.name:
                values.setdefault(v.name, v)
        for v in node.outputs:
            if v.name:
                values.setdefault(v.name, v)
    modified = False
    for name, value in values.items():
        shape, dtype = found.get(name, (None, None))
        if value.shape != shape and shape is not None:
            value.shape = shape
            modified = True
        if value.dtype != dtype and dtype is not None:
            value.dtype = dtype
            modified = True
    return modified


def _value_names(graph: ir.Graph) -> set[str]:
    names = {v.name for v in graph.inputs} | set(graph.initializers)
    for node in graph.all_nodes():
        names.update(o.name for o in node.outputs if o.name)
    return names


def _take_over(old: ir.Value, new: ir.Value) -> None:
    """``new`` replaces ``old`` everywhere, graph outputs included, and takes its name."""
    name = old.name
    old.name = None
    old.replace_all_uses_with(new, replace_graph_outputs=True)
    new.name = name


def _merge_dims(kept: ir.Shape | None, other: ir.Shape | None) -> ir.Shape | None:
    """``kept``'s shape, with dims it leaves unknown taken from ``other`` when ranks agree."""
    if kept is None or other is None or len(kept) != len(other):
        return kept if kept is not None else other
    return ir.Shape([b if not isinstance(a, int) and isinstance(b, int) else a for a, b in zip(kept, other)])


class InlineConstantIfs(InPlacePass):
    """An If whose condition is a constant becomes the nodes of the branch it takes.

    Exporters guard shape-dependent code this way (silero-vad's ``If(Equal(Size(x), 4))``): once
    shapes are fixed the condition folds, and inlining the branch leaves a graph a tracing jit can
    take whole (JAX's conditional wants branches of one rank). Values moved up keep their names
    unless one is taken in the outer graph. ``constant_names`` (the names of the initializers that
    are constants) grows by the branch's initializers; ``count`` is the number of Ifs inlined by
    the last call.
    """

    def __init__(self, constant_names: set[str]):
        super().__init__()
        self.constant_names = constant_names
        self.count = 0

    def call(self, model: ir.Model) -> PassResult:
        graph = model.graph
        inlined = 0
        for node in list(graph):
            if node.op_type != "If" or _canonical_domain(node.domain) != "" or not node.inputs:
                continue
            cond = node.inputs[0]
            if cond is None or cond.name not in self.constant_names or cond.const_value is None:
                continue
            flag = cond.const_value.numpy()
            if flag.size != 1:
                continue
            attr = node.attributes.get("then_branch" if bool(flag.reshape(-1)[0]) else "else_branch")
            if attr is None or attr.type != ir.AttributeType.GRAPH:
                continue
            branch = attr.value
            if len(branch.outputs) != len(node.outputs) or branch.inputs:
                continue
            taken = _value_names(graph)
            results = list(branch.outputs)
            branch.outputs.clear()
            for name, init in list(branch.initializers.items()):
                del branch.initializers[name]
                if name in taken:
                    init.name = f"{name}__{node.name or 'If'}_{inlined}"
                graph.register_initializer(init)
                self.constant_names.add(init.name)
            for inner in list(branch):
                branch.remove(inner, safe=False)
                for out in inner.outputs:
                    if out.name and out.name in taken:
                        out.name = f"{out.name}__{node.name or 'If'}_{inlined}"
                graph.insert_before(node, inner)
            for old, new in zip(node.outputs, results):
                new.shape = _merge_dims(new.shape, old.shape)
                if new.type is None:
                    new.type = old.type
                _take_over(old, new)
            graph.remove(node, safe=True)
            inlined += 1
        self.count = inlined
        return PassResult(model, inlined > 0)


def _replace_with_internal(node: ir.Node, op_type: str, inputs, name: str | None) -> None:
    """``node`` (one output) gives way to the Mithril-internal ``op_type`` on ``inputs``."""
    new = ir.Node(INTERNAL_DOMAIN, op_type, inputs, name=name, metadata_props=dict(node.metadata_props))
    out, result = node.outputs[0], new.outputs[0]
    result.shape, result.type = out.shape, out.type
    node.graph.insert_before(node, new)
    _take_over(out, result)
    node.graph.remove(node, safe=False)


# Pow by a constant the hardware does better another way: x*x and x*x*x are one or two multiplies
# (GPT-2's tanh-GELU cubes its input; torch.pow with a tensor exponent takes the generic
# exp/log path, 5x slower than two multiplies), x**0.5 is Sqrt. Differentiable the same way.
_POWER_REWRITES = {2.0: ("Mul",), 3.0: ("Mul", "Mul"), 0.5: ("Sqrt",)}


class ReducePowers(InPlacePass):
    """``Pow(x, c)`` with a constant scalar exponent c in {0.5, 2, 3} and a floating base becomes
    Sqrt(x) / Mul(x, x) / Mul(Mul(x, x), x). Only where the result's shape is the base's."""

    def __init__(self, constant_names: set[str], opsets: dict[str, int]):
        super().__init__()
        self.constant_names = constant_names
        self.opsets = opsets

    def call(self, model: ir.Model) -> PassResult:
        if self.opsets.get("", 1) < 7:  # Pow-1's broadcast attribute: leave the legacy form alone
            return PassResult(model, False)
        graph = model.graph
        rewritten = 0
        for node in list(graph):
            if node.op_type != "Pow" or _canonical_domain(node.domain) != "" or len(node.inputs) != 2:
                continue
            base, exponent = node.inputs
            if base is None or exponent is None or exponent.name not in self.constant_names:
                continue
            if exponent.const_value is None or base.type is None or base.shape is None:
                continue
            value = exponent.const_value.numpy()
            if value.size != 1 or value.ndim > len(base.shape) or not np.issubdtype(value.dtype, np.number):
                continue
            if base.dtype not in _FLOAT_TYPES:
                continue
            ops = _POWER_REWRITES.get(float(value.reshape(-1)[0]))
            if ops is None:
                continue
            out = node.outputs[0]
            result = base
            for op in ops:
                inputs = [result] if op == "Sqrt" else [result, base]
                new = ir.Node("", op, inputs, name=f"{node.name}/{op}" if node.name else None,
                              metadata_props=dict(node.metadata_props))
                graph.insert_before(node, new)
                result = new.outputs[0]
                result.shape, result.type = base.shape, base.type
            _take_over(out, result)
            graph.remove(node, safe=False)
            rewritten += 1
        return PassResult(model, rewritten > 0)


def _single_use(value: ir.Value) -> bool:
    return len(value.uses()) == 1 and not value.is_graph_output()


class FuseMatMulBias(InPlacePass):
    """``Add(MatMul(x, W), b)``, the way exporters write a Linear layer, becomes the internal
    ``ai.mithril::MatMulAdd(x, W, b)``: one matmul-plus-bias (torch's F.linear, a single BLAS call
    with beta = 1) instead of a matmul and a second pass over its output. W is (K, N), b is (N,)
    and x is (..., K), all of one floating type; x's leading dims may be symbolic."""

    def __init__(self, constant_names: set[str], opsets: dict[str, int]):
        super().__init__()
        self.constant_names = constant_names
        self.opsets = opsets

    def call(self, model: ir.Model) -> PassResult:
        if self.opsets.get("", 1) < 7:
            return PassResult(model, False)
        graph = model.graph
        fused = 0
        for node in list(graph):
            if node.op_type != "Add" or _canonical_domain(node.domain) != "" or len(node.inputs) != 2:
                continue
            for mm_out, bias in (node.inputs, node.inputs[::-1]):
                producer = mm_out.producer() if mm_out is not None else None
                if producer is not None and producer.op_type == "MatMul" and producer.graph is graph:
                    break
            else:
                continue
            if _canonical_domain(producer.domain) != "" or not _single_use(mm_out):
                continue
            x, w = producer.inputs
            ws, bs = static_shape(w), static_shape(bias) if bias is not None else None
            if ws is None or bs is None or len(ws) != 2 or bs != (ws[1],) or x.shape is None or len(x.shape) < 2:
                continue
            if x.shape[-1] != ws[0] or len({x.dtype, w.dtype, bias.dtype}) != 1 or x.dtype not in _FLOAT_TYPES:
                continue
            _replace_with_internal(node, "MatMulAdd", [x, w, bias], node.name or producer.name)
            graph.remove(producer, safe=False)
            fused += 1
        return PassResult(model, fused > 0)


class MarkStopGradients(InPlacePass):
    """Marked Identity nodes become ``ai.mithril::StopGradient`` so identity removal keeps them and
    autodiff backends can stop gradients there."""

    def call(self, model: ir.Model) -> PassResult:
        marked = 0
        for node in list(model.graph.all_nodes()):
            if node.op_type == "Identity" and node.metadata_props.get(STOP_GRADIENT_MARK) == "true":
                _replace_with_internal(node, "StopGradient", [node.inputs[0]], node.name)
                marked += 1
        return PassResult(model, marked > 0)


class RemoveIdentities(InPlacePass):
    """Identity nodes (exporters leave many) forward their input; graph outputs keep their names.

    ``y = Identity(x)`` goes away when y is no output of its graph: y's readers read x (also
    from inside a subgraph, where x may be an outer value). When y is an output of its graph the
    node goes only if x is made by a node of that same graph and is no output itself: x then takes
    y's place and name. It stays when x is a graph input, an initializer, another output (two
    outputs of one value) or a value of an enclosing scope (a branch returning the outer state):
    the IR gives each value one graph and one name, and those forms need the node.
    (onnx_ir's IdentityEliminationPass renames outer and output values there, which breaks
    subgraphs and drops duplicate outputs.)
    """

    def call(self, model: ir.Model) -> PassResult:
        removed = 0
        for graph in list(all_graphs(model.graph)):
            outputs = set(graph.outputs)
            for node in list(graph):
                if (node.op_type != "Identity" or _canonical_domain(node.domain) != "" or len(node.inputs) != 1
                        or len(node.outputs) != 1 or node.inputs[0] is None):
                    continue
                x, y = node.inputs[0], node.outputs[0]
                if y in outputs:
                    producer = x.producer()
                    if producer is None or producer.graph is not graph or x.is_graph_output():
                        continue
                x.shape = _merge_dims(x.shape, y.shape)
                if x.type is None:
                    x.type = y.type
                if y in outputs:
                    _take_over(y, x)
                    outputs = set(graph.outputs)
                else:
                    y.replace_all_uses_with(x)
                graph.remove(node, safe=True)
                removed += 1
        return PassResult(model, removed > 0)


class RemoveDeadNodes(InPlacePass):
    """Nodes none of whose outputs reach a graph output (subgraphs too), by onnx_ir's pass."""

    def call(self, model: ir.Model) -> PassResult:
        return PassResult(model, common.RemoveUnusedNodesPass()(model).modified)


class Toposort(InPlacePass):
    """Nodes in an order where each comes after the producers of what it reads (onnx_ir's pass)."""

    def call(self, model: ir.Model) -> PassResult:
        if _is_sorted(model.graph):
            # onnx_ir's sort is stable: on an order that is already topological it changes nothing.
            return PassResult(model, False)
        # onnx_ir's pass reports the main graph's order only; sort() reorders subgraphs too.
        before = [list(g) for g in all_graphs(model.graph)]
        common.TopologicalSortPass()(model)
        after = [list(g) for g in all_graphs(model.graph)]
        return PassResult(model, len(before) != len(after) or any(
            len(a) != len(b) or any(x is not y for x, y in zip(a, b)) for a, b in zip(before, after)))


def _is_sorted(graph: ir.Graph) -> bool:
    """Whether every node of ``graph`` and of its subgraphs comes after the producers in its own
    graph of what it reads, its subgraphs' reads included (the dependencies onnx_ir's sort obeys)."""
    seen: set[ir.Node] = set()
    for node in graph:
        subs = _node_subgraphs(node) if node.attributes else ()
        for v in _reads(node, subs):
            producer = v.producer()
            if producer is not None and producer not in seen and producer.graph is graph:
                return False
        if subs and not all(_is_sorted(sub) for sub in subs):
            return False
        seen.add(node)
    return True


def _reads(node: ir.Node, subs):
    """The values ``node`` reads: its inputs, and those of every node in its subgraphs ``subs``."""
    reads = [v for v in node.inputs if v is not None]
    for sub in subs:
        for inner in sub:
            reads.extend(_reads(inner, _node_subgraphs(inner) if inner.attributes else ()))
    return reads
