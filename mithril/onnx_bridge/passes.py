"""Graph passes, each small and named, each taking and returning an onnx_ir model.

The compile pipeline runs ``specialize(model, shapes, constant_names)`` which chains:
inline_functions -> set_input_shapes -> (infer_shapes -> fold_constants -> inline_constant_ifs)* ->
reduce_powers -> fuse_matmul_bias -> mark_stop_gradients -> remove_identities -> remove_dead_nodes ->
toposort.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common

from ..dtypes import tensor_array
from ..errors import MithrilError, PassError, ShapeError
from .schema import canonical_domain as _canonical_domain
from ..backends.registry import REGISTRY, NodeInfo

logger = logging.getLogger(__name__)

# Folding never materializes constants larger than this (elements): they would bloat the program.
FOLD_SIZE_LIMIT = 1 << 22
# At most this many rounds of ONNX inference alternating with the kernels' output-shape rules.
RULE_ROUNDS = 32


def _graphs(graph: ir.Graph):
    """``graph`` and every subgraph under it (If branches, Loop/Scan bodies), outermost first."""
    yield graph
    for node in graph.all_nodes():
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                yield attr.value
            elif attr.type == ir.AttributeType.GRAPHS:
                yield from attr.value


def relax_unknown_dims(model: ir.Model) -> ir.Model:
    """Declared dims of -1 or 0 are unknown, not fixed. PaddlePaddle's exporter and older
    converters write ``dim_value: -1`` (some write 0) where the spec says ``dim_param``, and
    onnxruntime accepts any size there; ``shapes`` at compile fixes them like any symbolic dim.
    Initializers keep their shapes: those come from the tensors themselves."""
    for graph in list(_graphs(model.graph)):
        values = list(graph.inputs) + list(graph.outputs)
        values += [o for node in graph for o in node.outputs]
        for value in values:
            if value.shape is None or value.const_value is not None:
                continue
            dims = list(value.shape)
            if any(isinstance(d, int) and d <= 0 for d in dims):
                value.shape = ir.Shape([None if isinstance(d, int) and d <= 0 else d for d in dims])
    return model


def inline_functions(model: ir.Model) -> ir.Model:
    """Inline model-local functions so every node is a standard op."""
    if model.functions:
        common.InlinePass()(model)
        common.RemoveUnusedFunctionsPass()(model)
    return model


def set_input_shapes(model: ir.Model, shapes: dict[str, Iterable[int]] | None) -> ir.Model:
    """Fix graph inputs to concrete shapes, checking rank and static dims against the model."""
    if not shapes:
        return model
    by_name = {v.name: v for v in model.graph.inputs}
    for name, shape in shapes.items():
        if name not in by_name:
            raise ShapeError(
                f"shapes names {name!r}, which is not a graph input (inputs: {sorted(by_name)})"
            )
        value = by_name[name]
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
        value.shape = ir.Shape(shape)
    return model


def infer_shapes(model: ir.Model) -> ir.Model:
    """ONNX shape inference with data propagation; failure leaves the model unchanged. Outputs of
    ops ONNX does not know get shapes from their kernels' rules, and inference runs again."""
    # onnx_ir logs a traceback when inference fails; the model then keeps its declared shapes,
    # which is a normal outcome here (unknown dims stay unknown), not an error to show users.
    if any(v.type is None for v in model.graph.inputs):
        # An untyped input (a map, whose type onnx_ir cannot hold) crashes onnx's C++ inference.
        return model
    # Each round carries shapes across one more op ONNX does not know; stop when none was set.
    for _ in range(RULE_ROUNDS):
        _onnx_shape_inference(model)
        if not _apply_output_shape_rules(model):
            break
    return model


def _onnx_shape_inference(model: ir.Model) -> None:
    ir_logger = logging.getLogger("onnx_ir.passes.common.shape_inference")
    level = ir_logger.level
    ir_logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            common.ShapeInferencePass(check_type=False, strict_mode=False, data_prop=True)(model)
    except ir.serde.SerdeError:
        pass  # inferred types onnx_ir cannot read (ZipMap's sequence of maps): keep the declared ones
    finally:
        ir_logger.setLevel(level)


def _apply_output_shape_rules(model: ir.Model) -> bool:
    """Shapes of outputs ONNX inference leaves unknown, from the kernels' ``output_shapes`` rules
    (ops of domains onnx.defs does not know). Returns whether any shape was set."""
    from ..onnx_bridge.schema import attribute_defaults, convert_attribute, is_graph_attribute

    opsets = {_canonical_domain(d): v for d, v in model.opset_imports.items()}
    changed = False
    for node in model.graph:
        outputs = [o for o in node.outputs if o.name]
        if not outputs or all(o.shape is not None for o in outputs):
            continue
        domain = _canonical_domain(node.domain)
        opset = opsets.get(domain, 1)
        spec = REGISTRY.resolve(node.op_type, opset, domain)
        if spec is None or spec.output_shapes is None:
            continue
        inputs = [None if v is None else (static_shape(v), _numpy_dtype(v)) for v in node.inputs]
        attrs = dict(attribute_defaults(node.op_type, opset, domain))
        attrs.update({k: convert_attribute(a) for k, a in node.attributes.items() if not is_graph_attribute(a)})
        try:
            results = spec.output_shapes(inputs, attrs)
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


def _numpy_dtype(value: ir.Value):
    try:
        return value.dtype.numpy() if value.type is not None and value.dtype is not None else None
    except (TypeError, ValueError, AttributeError):
        return None


def static_shape(value: ir.Value) -> tuple[int, ...] | None:
    if value.shape is None:
        return None
    dims = tuple(value.shape)
    if all(isinstance(d, int) for d in dims):
        return dims
    return None


def _constant_array(value: ir.Value | None, constants: set[ir.Value]) -> np.ndarray | None:
    if value is None or value not in constants:
        return None
    return tensor_array(value.const_value) if value.const_value is not None else None


def fold_constants(
    model: ir.Model, constant_names: set[str], opsets: dict[str, int]
) -> tuple[ir.Model, int]:
    """Evaluate nodes whose inputs are all constants, and Shape/Size of static shapes.

    Uses the shared NumPy kernels, so folding agrees with the NumPy backend by construction.
    Returns the model and the number of nodes folded.
    """
    from ..onnx_bridge.schema import attribute_defaults, convert_attribute, is_graph_attribute

    graph = model.graph
    constants: set[ir.Value] = {
        v for name, v in graph.initializers.items() if name in constant_names and v.const_value is not None
    }
    folded = 0
    for node in list(graph):
        domain = _canonical_domain(node.domain)
        opset = opsets.get(domain, 1)
        if any(is_graph_attribute(a) for a in node.attributes.values()):
            continue
        result: list[np.ndarray] | None = None
        if node.op_type == "Shape" and domain == "" and node.inputs[0] is not None:
            dims = static_shape(node.inputs[0])
            if dims is not None:
                start = node.attributes.get("start")
                end = node.attributes.get("end")
                s = start.value if start is not None else 0
                e = end.value if end is not None else None
                result = [np.array(dims[s:e], dtype=np.int64)]
        elif node.op_type == "Size" and domain == "" and node.inputs[0] is not None:
            dims = static_shape(node.inputs[0])
            if dims is not None:
                result = [np.array(int(np.prod(dims)), dtype=np.int64)]
        if result is None:
            inputs = [_constant_array(v, constants) if v is not None else None for v in node.inputs]
            if any(v is not None and a is None for v, a in zip(node.inputs, inputs)):
                continue
            spec = REGISTRY.resolve(node.op_type, opset, domain)
            if spec is None or spec.nondeterministic:
                continue
            if any(o.type is not None and not isinstance(o.type, ir.TensorType) for o in node.outputs):
                continue
            if any(np.prod(static_shape(o) or (), dtype=np.float64) > FOLD_SIZE_LIMIT for o in node.outputs):
                continue  # a result too large to keep is never computed (ConstantOfShape [1e5, 1e5])
            defaults = attribute_defaults(node.op_type, opset, domain)
            kwargs = {k: v for k, v in defaults.items() if k in spec.accepts}
            for name, attr in node.attributes.items():
                if attr.is_ref():
                    kwargs = None
                    break
                if name in spec.accepts or spec.accepts_var_keyword:
                    kwargs[name] = convert_attribute(attr)
            if kwargs is None:
                continue
            if "xp" in spec.accepts:
                kwargs["xp"] = np
            if "num_outputs" in spec.accepts and kwargs.get("num_outputs") is None:
                kwargs["num_outputs"] = len(node.outputs)
            if "opset" in spec.accepts:
                kwargs["opset"] = opset
            if "node" in spec.accepts:
                kwargs["node"] = NodeInfo(node.name or node.op_type, node.op_type, domain, opset, ())
            try:
                out = spec.fn(*inputs, **kwargs)
            except Exception as exc:  # leave it to run time, where the error names the node
                logger.debug("not folding %s: %s", node.op_type, exc)
                continue
            result = list(out) if isinstance(out, tuple) else [out]
            if any(not isinstance(r, (np.ndarray, np.generic)) for r in result[: len(node.outputs)]):
                continue
        result = [np.asarray(r) for r in result]
        if any(r.size > FOLD_SIZE_LIMIT or r.dtype == object for r in result[: len(node.outputs)]):
            continue
        for out, arr in zip(node.outputs, result):
            if not out.name and not out.uses():
                continue
            new = ir.Value(name=out.name, shape=ir.Shape(arr.shape), type=ir.TensorType(ir.DataType.from_numpy(arr.dtype)),
                           const_value=ir.tensor(arr))
            out.name = None
            out.replace_all_uses_with(new, replace_graph_outputs=True)
            graph.register_initializer(new)
            constants.add(new)
            constant_names.add(new.name)
        graph.remove(node, safe=False)
        folded += 1
    return model, folded


def _value_names(graph: ir.Graph) -> set[str]:
    names = {v.name for v in graph.inputs} | set(graph.initializers)
    for node in graph.all_nodes():
        names.update(o.name for o in node.outputs if o.name)
    return names


def inline_constant_ifs(model: ir.Model, constant_names: set[str]) -> tuple[ir.Model, int]:
    """An If whose condition is a constant becomes the nodes of the branch it takes.

    Exporters guard shape-dependent code this way (silero-vad's ``If(Equal(Size(x), 4))``): once
    shapes are fixed the condition folds, and inlining the branch leaves a graph a tracing jit can
    take whole (JAX's conditional wants branches of one rank). Values moved up keep their names
    unless one is taken in the outer graph. Returns the model and the number of If nodes inlined.
    """
    graph = model.graph
    inlined = 0
    for node in list(graph):
        if node.op_type != "If" or _canonical_domain(node.domain) != "" or not node.inputs:
            continue
        cond = node.inputs[0]
        if cond is None or cond.name not in constant_names or cond.const_value is None:
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
            constant_names.add(init.name)
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
    return model, inlined


# The frontend's StopGradient exports as an Identity carrying this mark (onnxruntime ignores it).
STOP_GRADIENT_MARK = "mithril.stop_gradient"
INTERNAL_DOMAIN = "ai.mithril"

_FLOAT_TYPES = (ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)


def _take_over(old: ir.Value, new: ir.Value) -> None:
    """``new`` replaces ``old`` everywhere, graph outputs included, and takes its name."""
    name = old.name
    old.name = None
    old.replace_all_uses_with(new, replace_graph_outputs=True)
    new.name = name


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


def reduce_powers(model: ir.Model, constant_names: set[str], opsets: dict[str, int]) -> ir.Model:
    """``Pow(x, c)`` with a constant scalar exponent c in {0.5, 2, 3} and a floating base becomes
    Sqrt(x) / Mul(x, x) / Mul(Mul(x, x), x). Only where the result's shape is the base's."""
    if opsets.get("", 1) < 7:  # Pow-1's broadcast attribute: leave the legacy form alone
        return model
    graph = model.graph
    for node in list(graph):
        if node.op_type != "Pow" or _canonical_domain(node.domain) != "" or len(node.inputs) != 2:
            continue
        base, exponent = node.inputs
        if base is None or exponent is None or exponent.name not in constant_names:
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
    return model


def _single_use(value: ir.Value) -> bool:
    return len(value.uses()) == 1 and not value.is_graph_output()


def fuse_matmul_bias(model: ir.Model, constant_names: set[str], opsets: dict[str, int]) -> ir.Model:
    """``Add(MatMul(x, W), b)``, the way exporters write a Linear layer, becomes the internal
    ``ai.mithril::MatMulAdd(x, W, b)``: one matmul-plus-bias (torch's F.linear, a single BLAS call
    with beta = 1) instead of a matmul and a second pass over its output. W is (K, N), b is (N,)
    and x is (..., K), all of one floating type; x's leading dims may be symbolic."""
    if opsets.get("", 1) < 7:
        return model
    graph = model.graph
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
    return model


def mark_stop_gradients(model: ir.Model) -> ir.Model:
    """Marked Identity nodes become ``ai.mithril::StopGradient`` so identity removal keeps them and
    autodiff backends can stop gradients there."""
    for node in list(model.graph.all_nodes()):
        if node.op_type == "Identity" and node.metadata_props.get(STOP_GRADIENT_MARK) == "true":
            _replace_with_internal(node, "StopGradient", [node.inputs[0]], node.name)
    return model


def _merge_dims(kept: ir.Shape | None, other: ir.Shape | None) -> ir.Shape | None:
    """``kept``'s shape, with dims it leaves unknown taken from ``other`` when ranks agree."""
    if kept is None or other is None or len(kept) != len(other):
        return kept if kept is not None else other
    return ir.Shape([b if not isinstance(a, int) and isinstance(b, int) else a for a, b in zip(kept, other)])


def remove_identities(model: ir.Model) -> ir.Model:
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
    for graph in list(_graphs(model.graph)):
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
    return model


def remove_dead_nodes(model: ir.Model) -> ir.Model:
    common.RemoveUnusedNodesPass()(model)
    return model


def toposort(model: ir.Model) -> ir.Model:
    common.TopologicalSortPass()(model)
    return model


def _run_pass(fn, *args):
    """Run one pass; a failure that is no MithrilError is reported naming the pass."""
    try:
        return fn(*args)
    except MithrilError:
        raise
    except Exception as exc:
        raise PassError(f"pass {fn.__name__} failed on this model: {type(exc).__name__}: {exc}") from exc


def specialize(
    model: ir.Model,
    shapes: dict[str, Iterable[int]] | None,
    constant_names: set[str],
    opsets: dict[str, int],
    max_rounds: int = 8,
) -> ir.Model:
    """The compile-time pass pipeline: after it, shape sub-graphs of static shapes are constants."""
    _run_pass(inline_functions, model)
    _run_pass(set_input_shapes, model, shapes)
    _run_pass(toposort, model)
    for _ in range(max_rounds):
        _run_pass(infer_shapes, model)
        _, folded = _run_pass(fold_constants, model, constant_names, opsets)
        _, inlined = _run_pass(inline_constant_ifs, model, constant_names)
        if not folded and not inlined:
            break
    _run_pass(reduce_powers, model, constant_names, opsets)
    _run_pass(fuse_matmul_bias, model, constant_names, opsets)
    # After inference and folding: the internal op has no ONNX schema for them to read.
    _run_pass(mark_stop_gradients, model)
    _run_pass(remove_identities, model)
    _run_pass(remove_dead_nodes, model)
    _run_pass(toposort, model)
    return model
