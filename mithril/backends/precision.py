"""The float-precision pass: a loaded model computes in the backend's dtype.

``ml.compile(model, backend)`` calls :func:`convert_precision` on its own copy of the graph
(the user's model stays as loaded). When ``backend.dtype`` is float16, bfloat16 or float64 and
the model computes in float32 (most of its float weights are float32), the pass converts:

- float32 initializers and Constant tensors (float16 and bfloat16 keep finite values finite and
  nonzero values nonzero: a float32 ``finfo.min`` attention mask becomes ``-65504``, not
  ``-inf``, whose product with 0 would be NaN; as onnxruntime's converter clamps them);
- the element type of every float32 value, graph inputs and outputs included (the
  onnxconverter-common convention); with ``keep_io_types=True`` graph inputs and outputs keep
  their file dtype, and Casts at the boundary convert them;
- the dtypes ops are told: ``Cast``'s ``to``, ``RandomNormal``/``RandomUniform``/``EyeLike``/
  ``Bernoulli``/``SequenceEmpty``'s ``dtype``, the windows' and ``MelWeightMatrix``'s
  ``output_datatype``, ``ConstantOfShape``'s value;
- If/Loop/Scan bodies (and model-local functions, inlined first) the same way.

Integer and boolean tensors (indices, shapes, masks) are never touched, nor are float64 or
float16 parts a float32 file chose. A model whose floats are already float16, bfloat16 or
float64 is left as it is: a float16 file runs in float16 on a float32 backend, never widened.

Stays float32, with Casts around it, when converting to float16 or bfloat16
(:data:`KEEP_FLOAT32`; float64 keeps nothing behind):

- Softmax, LogSoftmax: a row of exponentials is summed and divided by the sum; a half-precision
  sum of many terms loses the small probabilities. The ONNX Attention op gets
  ``softmax_precision=FLOAT`` instead, so its matmuls stay in the backend dtype.
- LayerNormalization, GroupNormalization, InstanceNormalization, RMSNormalization,
  MeanVarianceNormalization, LpNormalization, BatchNormalization in training mode, and
  onnxruntime's (Skip)(Simplified)LayerNormalization, EmbedLayerNormalization, (Skip)GroupNorm:
  their statistics (mean and variance over a whole axis) are large sums (ONNX's ``stash_type``
  keeps LayerNormalization's in float32 by default, and onnxruntime's GPT-2 and T5 float16
  recipes block these ops). Inference-mode BatchNormalization is a per-channel affine map of
  stored statistics and converts.
- ReduceSum, ReduceMean, ReduceSumSquare, ReduceL1, ReduceL2, ReduceLogSum, ReduceLogSumExp,
  ReduceProd, CumSum, GlobalAveragePool, GlobalLpPool: sums (products) over whole axes, where
  float16 rounding accumulates and its range (65504) overflows; CumSum is on onnxruntime's
  block list for this reason. MatMul, Gemm and Conv are sums too, but they are the work the
  precision is chosen for, and every framework here accumulates them in float32.
- Range (``start + i * delta``: float16 counts exactly only to 2048, bfloat16 to 256) and
  RoiAlign (pixel coordinates), both on onnxruntime's block list.

Stays float32 for every dtype, as onnxruntime's ``ALWAYS_FLOAT_INPUTS`` keeps Resize's scales:
an input or output the op's schema types ``tensor(float)`` only (Resize and Upsample scales,
NonMaxSuppression's boxes and thresholds, the scales of DynamicQuantizeLinear and QLinearConv,
the outputs of ai.onnx.ml's Scaler, LinearRegressor, SVM...), and a node of another domain whose
schema admits no such type for a float32 value (ai.onnx.ml's trees, scalers and encoders take
float and double, never float16); and BitCast (:data:`KEEP_FLOAT32_ALWAYS`), which reinterprets
the float32 bits. A graph input only such readers take stays float32 too.

>>> import mithril as ml, numpy as np
>>> from onnx import helper, TensorProto
>>> g = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"])], "g",
...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
>>> pm = ml.compile(helper.make_model(g), ml.NumpyBackend(dtype=ml.float16))
>>> pm.evaluate({}, {"x": np.zeros((2, 3), np.float16)})["y"].dtype
dtype('float16')
"""

from __future__ import annotations

from collections import Counter

import ml_dtypes
import numpy as np
import onnx.defs
import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassResult

from ..dtypes import tensor_array
from ..errors import DTypeError
from ..onnx_bridge.passes import InlineFunctions, all_graphs
from ..onnx_bridge.schema import canonical_domain

__all__ = ["ConvertPrecision", "KEEP_FLOAT32", "KEEP_FLOAT32_ALWAYS", "convert_precision", "model_float_dtype"]

FLOAT = ir.DataType.FLOAT
_HALVES = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
_TARGETS = (*_HALVES, ir.DataType.DOUBLE)
# The float types a model computes in (float8 and float4 are storage types of quantized weights).
_COMPUTE_TYPES = (FLOAT, *_TARGETS)
_MS = "com.microsoft"

_SOFTMAX = "a row of exponentials summed and divided by its sum"
_STATISTICS = "mean and variance over whole axes (large sums)"
_SUM = "a sum or product over whole axes: half-precision rounding accumulates and overflows"
_COORDINATES = "coordinates: half precision counts exactly only to 2048 (float16) or 256 (bfloat16)"

# (domain, op_type) -> why it stays float32 when converting to float16 or bfloat16.
KEEP_FLOAT32: dict[tuple[str, str], str] = {
    ("", "Softmax"): _SOFTMAX,
    ("", "LogSoftmax"): _SOFTMAX,
    ("", "LayerNormalization"): _STATISTICS,
    ("", "GroupNormalization"): _STATISTICS,
    ("", "InstanceNormalization"): _STATISTICS,
    ("", "RMSNormalization"): _STATISTICS,
    ("", "MeanVarianceNormalization"): _STATISTICS,
    ("", "LpNormalization"): _STATISTICS,
    ("", "SimplifiedLayerNormalization"): _STATISTICS,  # onnxruntime registers it in the ONNX domain
    (_MS, "SkipLayerNormalization"): _STATISTICS,
    (_MS, "SkipSimplifiedLayerNormalization"): _STATISTICS,
    (_MS, "EmbedLayerNormalization"): _STATISTICS,
    (_MS, "GroupNorm"): _STATISTICS,
    (_MS, "SkipGroupNorm"): _STATISTICS,
    ("", "ReduceSum"): _SUM,
    ("", "ReduceMean"): _SUM,
    ("", "ReduceSumSquare"): _SUM,
    ("", "ReduceL1"): _SUM,
    ("", "ReduceL2"): _SUM,
    ("", "ReduceLogSum"): _SUM,
    ("", "ReduceLogSumExp"): _SUM,
    ("", "ReduceProd"): _SUM,
    ("", "CumSum"): _SUM,
    ("", "GlobalAveragePool"): _SUM,
    ("", "GlobalLpPool"): _SUM,
    ("", "Range"): _COORDINATES,
    ("", "RoiAlign"): _COORDINATES,
}
_TRAINING_BATCHNORM = "batch statistics (training_mode=1): " + _STATISTICS
# (domain, op_type) -> why it stays float32 in every dtype.
KEEP_FLOAT32_ALWAYS: dict[tuple[str, str], str] = {
    ("", "BitCast"): "it reinterprets the float32 bits: another dtype's bits are other numbers",
}
_RESCALING = ("an integer accumulator of MatMulInteger/ConvInteger rescaled by a product of quantization "
              "scales: the sums exceed float16's range and the scale products fall below it")
# Reasons of numerics: an input read at such a node still takes the backend dtype (and a Cast).
_NUMERIC_REASONS = frozenset({_SOFTMAX, _STATISTICS, _SUM, _COORDINATES, _TRAINING_BATCHNORM, _RESCALING})
# The opset of the Casts the pass inserts into a file that imports no ONNX opset (bfloat16 needs 13).
_CAST_OPSET = 13

# Ops with an attribute naming their output's type: op -> (attribute, its default when absent;
# None: the output follows an input's type).
_DTYPE_ATTRIBUTES = {
    "RandomNormal": ("dtype", FLOAT), "RandomUniform": ("dtype", FLOAT), "SequenceEmpty": ("dtype", FLOAT),
    "RandomNormalLike": ("dtype", None), "RandomUniformLike": ("dtype", None), "EyeLike": ("dtype", None),
    "Bernoulli": ("dtype", None), "MelWeightMatrix": ("output_datatype", FLOAT),
    "HannWindow": ("output_datatype", FLOAT), "HammingWindow": ("output_datatype", FLOAT),
    "BlackmanWindow": ("output_datatype", FLOAT), "DequantizeLinear": ("output_dtype", None),
}
# Inputs read for their shape or converted whatever their type: a Cast before them is wasted work.
_ANY_TYPE_INPUTS = {"Cast", "CastLike", "Shape", "Size"}


def _target_of(backend) -> ir.DataType | None:
    dtype = getattr(backend, "dtype", None)
    onnx_type = getattr(dtype, "onnx", None)
    if onnx_type is None:
        return None
    target = ir.DataType(onnx_type)
    return target if target in _TARGETS else None


def _float_dtype(value: ir.Value) -> ir.DataType | None:
    """The element type of a tensor (or sequence/optional of tensors) value, None when unknown."""
    t = value.type
    while isinstance(t, (ir.SequenceType, ir.OptionalType)):
        t = t.elem_type
    if isinstance(t, ir.TensorType):
        return t.dtype
    return None


def _retyped(t, dtype: ir.DataType):
    if isinstance(t, ir.SequenceType):
        return ir.SequenceType(_retyped(t.elem_type, dtype))
    if isinstance(t, ir.OptionalType):
        return ir.OptionalType(_retyped(t.elem_type, dtype))
    return ir.TensorType(dtype)


def model_float_dtype(model: ir.Model) -> ir.DataType | None:
    """The float type a model computes in: the one of float16, bfloat16, float32 and float64 most
    weight elements (initializers and Constant tensors) have; without weights, the one most graph
    inputs have. float8 and float4 are storage types of quantized weights, not counted."""
    counts: Counter = Counter()
    for graph in all_graphs(model.graph):
        for init in graph.initializers.values():
            if init.const_value is not None and init.const_value.dtype in _COMPUTE_TYPES:
                counts[init.const_value.dtype] += max(init.const_value.size, 1)
        for node in graph:
            if node.op_type == "Constant" and canonical_domain(node.domain) == "":
                attr = node.attributes.get("value")
                if attr is not None and attr.type == ir.AttributeType.TENSOR and attr.value.dtype in _COMPUTE_TYPES:
                    counts[attr.value.dtype] += max(attr.value.size, 1)
    if not counts:
        for v in model.graph.inputs:
            dtype = _float_dtype(v)
            if dtype in _COMPUTE_TYPES:
                counts[dtype] += 1
    return counts.most_common(1)[0][0] if counts else None


def _narrow(array: np.ndarray, dtype: ir.DataType) -> np.ndarray:
    """``array`` (float32) in ``dtype``; for float16 and bfloat16 finite values stay finite and
    nonzero values nonzero, keeping their sign (clamped to the dtype's range)."""
    np_dtype = dtype.numpy()
    a = np.asarray(array, np.float32)
    with np.errstate(over="ignore"):  # values beyond the range are clamped below
        narrowed = a.astype(np_dtype)
    if dtype not in _HALVES or not a.size:
        return narrowed
    info = ml_dtypes.finfo(np_dtype)
    big, tiny = np.float32(info.max), np.float32(info.smallest_subnormal)
    # The cheap checks first: most weights lie well inside the range and round to no new zero.
    if not (-big <= a.min() and a.max() <= big):
        overflow = np.isinf(narrowed) & np.isfinite(a)
        narrowed[overflow] = np.copysign(big, a[overflow]).astype(np_dtype)
    lost = (narrowed == 0) & (a != 0)
    if lost.any():
        narrowed[lost] = np.copysign(tiny, a[lost]).astype(np_dtype)
    return narrowed


def _schema(node: ir.Node, opsets: dict[str, int]):
    domain = canonical_domain(node.domain)
    try:
        return onnx.defs.get_schema(node.op_type, opsets.get(domain, 1), domain)
    except onnx.defs.SchemaError:
        return None


def _allowed_types(schema) -> tuple[list[set[str]], list[set[str]]]:
    """Per formal input and output of ``schema``: the type strings it admits."""
    constraints = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    return ([constraints.get(f.type_str, {f.type_str}) for f in schema.inputs],
            [constraints.get(f.type_str, {f.type_str}) for f in schema.outputs])


def _integer_rescaling(graphs: list[ir.Graph]) -> set[int]:
    """Ids of the nodes that turn integer accumulators back into floats (dynamic quantization):
    the Cast of a MatMulInteger/ConvInteger output, and the Muls that rescale it by quantization
    scales (DynamicQuantizeLinear's ``y_scale``, constants, and products of those)."""
    producers = {}
    for g in graphs:
        for node in g:
            for o in node.outputs:
                producers[id(o)] = node
    found: set[int] = set()
    muls = []
    for g in graphs:
        for node in g:
            if canonical_domain(node.domain) != "":
                continue
            if node.op_type == "Cast" and node.inputs and node.inputs[0] is not None:
                source = producers.get(id(node.inputs[0]))
                if source is not None and source.op_type in ("MatMulInteger", "ConvInteger"):
                    found.add(id(node))
            elif node.op_type in ("Mul", "Div"):
                muls.append(node)

    def scale_like(v: ir.Value) -> bool:
        """A quantization scale: a constant, DynamicQuantizeLinear's y_scale, a value of the
        rescaling found so far, or a product of those."""
        source = producers.get(id(v))
        if source is None:
            return v.is_initializer()
        if id(source) in found or source.op_type == "Constant" or _is_dynamic_scale(v, source):
            return True
        return source.op_type in ("Mul", "Div") and all(scale_like(u) for u in source.inputs if u is not None)

    changed = True
    while changed:
        changed = False
        for node in muls:
            ins = [v for v in node.inputs if v is not None]
            if id(node) in found or not all(scale_like(v) for v in ins):
                continue
            rescales = any(id(producers.get(id(v))) in found or _is_dynamic_scale(v, producers.get(id(v)))
                           for v in ins)
            uses = list(node.outputs[0].uses())
            if rescales or (uses and all(id(use[0]) in found for use in uses)):
                found.add(id(node))
                changed = True
    return found


def _is_dynamic_scale(v: ir.Value, source: ir.Node | None) -> bool:
    return (source is not None and source.op_type == "DynamicQuantizeLinear" and len(source.outputs) > 1
            and source.outputs[1] is v)


def _slot(formals: list, i: int):
    """The formal at position ``i`` (the last one is variadic)."""
    if not formals:
        return None
    return formals[i] if i < len(formals) else formals[-1]


class ConvertPrecision(InPlacePass):
    """The pass of :func:`convert_precision`: float32 computation to ``dtype`` (float16,
    bfloat16 or float64), in place. ``kept`` lists, after a call, the nodes left in float32
    with their reasons (``"node_name (OpType): reason"``)."""

    def __init__(self, dtype: ir.DataType, keep_io_types: bool = False):
        super().__init__()
        if dtype not in _TARGETS:
            raise DTypeError(f"ConvertPrecision converts to float16, bfloat16 or float64, not {dtype}")
        self.dtype = dtype
        self.keep_io_types = keep_io_types
        self.kept: list[str] = []

    def call(self, model: ir.Model) -> PassResult:
        InlineFunctions()(model)  # function bodies are converted as the graph they become
        _fill_types(model)
        return PassResult(model, _Conversion(model, self.dtype, self.keep_io_types, self.kept).run())


def convert_precision(model: ir.Model, backend, *, keep_io_types: bool = False) -> None:
    """Convert ``model``'s float32 computation to ``backend.dtype`` in place, when that is
    float16, bfloat16 or float64 and the model computes in float32 (see the module docstring)."""
    target = _target_of(backend)
    if target is None or model_float_dtype(model) != FLOAT:
        return
    ConvertPrecision(target, keep_io_types)(model)


def _fill_types(model: ir.Model) -> None:
    """Element types for values the file leaves untyped, from shape inference on a copy (the
    model keeps its own shapes: compile's specialization infers them once it knows the inputs)."""
    from .specialize import InferShapes  # the kernels' rules type ops ONNX does not know

    if all(v.type is not None for g in all_graphs(model.graph) for n in g for v in n.outputs if v.name):
        return
    probe = model.clone()
    InferShapes()(probe)
    types = {}
    for g in all_graphs(probe.graph):
        for n in g:
            for v in n.outputs:
                if v.name and v.type is not None:
                    types[v.name] = v.type
    opsets = {canonical_domain(d): v for d, v in model.opset_imports.items()}
    for g in all_graphs(model.graph):
        for n in g:
            for v in n.outputs:
                if v.name and v.type is None and v.name in types:
                    v.type = types[v.name]
            _schema_types(n, opsets)


def _schema_types(node: ir.Node, opsets: dict[str, int]) -> None:
    """Types ONNX inference leaves out (ai.onnx.ml's ops have no type inference), from the
    schema: an output of one fixed type, or of a type variable an input binds."""
    if all(v.type is not None for v in node.outputs if v.name):
        return
    schema = _schema(node, opsets)
    if schema is None:
        return
    bound = {}
    for i, v in enumerate(node.inputs):
        formal = _slot(list(schema.inputs), i)
        if v is not None and formal is not None and isinstance(v.type, ir.TensorType):
            bound.setdefault(formal.type_str, v.type)
    fixed = {f"tensor({_onnx_type_name(t)})": t for t in ir.DataType}
    for i, v in enumerate(node.outputs):
        formal = _slot(list(schema.outputs), i)
        if not v.name or v.type is not None or formal is None:
            continue
        if formal.type_str in bound:
            v.type = bound[formal.type_str]
        elif formal.type_str in fixed:
            v.type = ir.TensorType(fixed[formal.type_str])


class _Conversion:
    def __init__(self, model: ir.Model, target: ir.DataType, keep_io: bool, kept: list[str]):
        self.model = model
        self.target = target
        self.keep_io = keep_io
        self.kept = kept
        self.half = target in _HALVES
        self.opsets = {canonical_domain(d): v for d, v in model.opset_imports.items()}
        self.graphs = list(all_graphs(model.graph))
        self.names = {v.name for g in self.graphs for v in (*g.inputs, *g.initializers.values(),
                                                             *(o for n in g for o in n.outputs)) if v.name}
        self.casts: dict[tuple[int, int, ir.DataType], ir.Value] = {}
        self.made: set[int] = set()  # ids of the Casts' outputs made here
        self.modified = False

    # -- what stays float32 -------------------------------------------------------
    def _fixed_slots(self, node: ir.Node) -> tuple[set[int], set[int]]:
        """Input and output positions the schema types tensor(float) only."""
        schema = _schema(node, self.opsets)
        if schema is None:
            return set(), set()
        ins, outs = _allowed_types(schema)
        only = {"tensor(float)"}
        return ({i for i in range(len(node.inputs)) if _slot(ins, i) == only},
                {i for i in range(len(node.outputs)) if _slot(outs, i) == only})

    def _keep_reason(self, node: ir.Node) -> str | None:
        domain = canonical_domain(node.domain)
        if (domain, node.op_type) in KEEP_FLOAT32_ALWAYS:
            return KEEP_FLOAT32_ALWAYS[(domain, node.op_type)]
        if self.half:
            reason = KEEP_FLOAT32.get((domain, node.op_type))
            if reason is not None:
                return reason
            if node.op_type == "BatchNormalization" and domain == "":
                mode = node.attributes.get("training_mode")
                if mode is not None and mode.value:
                    return _TRAINING_BATCHNORM
        if domain != "":
            # Another domain's schema (ai.onnx.ml) may admit float and double but no half type.
            schema = _schema(node, self.opsets)
            if schema is not None:
                ins, outs = _allowed_types(schema)
                want = f"tensor({_onnx_type_name(self.target)})"
                for formals, values in ((ins, node.inputs), (outs, node.outputs)):
                    for i, v in enumerate(values):
                        allowed = _slot(formals, i)
                        if (v is not None and _float_dtype(v) == FLOAT and allowed and want not in allowed
                                and allowed != {"tensor(float)"}):
                            return f"its schema admits {sorted(allowed)} here, not {want}"
        return None

    # -- the conversion -----------------------------------------------------------
    def run(self) -> bool:
        target = self.target
        plan = {}
        rescaling = _integer_rescaling(self.graphs) if self.half else set()
        for g in self.graphs:
            for node in g:
                reason = _RESCALING if id(node) in rescaling else self._keep_reason(node)
                plan[id(node)] = (reason, *self._fixed_slots(node))
        originally = {id(v) for g in self.graphs
                      for v in (*g.inputs, *g.initializers.values(), *(o for n in g for o in n.outputs))
                      if _float_dtype(v) == FLOAT}

        def wants(node: ir.Node, i: int) -> ir.DataType:
            reason, fixed_in, _ = plan[id(node)]
            return FLOAT if reason is not None or i in fixed_in else target

        def needs_float32(node: ir.Node, i: int) -> bool:
            """Whether this slot reads float32 by its type (a schema's tensor(float), BitCast's bits,
            another domain's float-and-double op), not for numerics a Cast could serve."""
            reason, fixed_in, _ = plan[id(node)]
            return i in fixed_in or (reason is not None and reason not in _NUMERIC_REASONS)

        top = self.model.graph
        if "" not in self.opsets:
            # The Casts inserted below are ONNX ops: a file of ai.onnx.ml ops alone imports no ONNX opset.
            self.model.opset_imports[""] = _CAST_OPSET
        for g in self.graphs:
            for v in g.inputs:
                if id(v) not in originally or v.is_initializer() or (g is top and self.keep_io):
                    continue
                # An input only float32 readers take (BitCast's bits, NonMaxSuppression's boxes)
                # stays float32: converting it would round what they read.
                uses = list(v.uses())
                if g is not top or v.is_graph_output() or not all(needs_float32(n, i) for n, i in uses) or not uses:
                    self._retype(v)
            for v in g.initializers.values():
                if id(v) not in originally or v.const_value is None:
                    continue
                uses = [wants(node, i) for node, i in v.uses()]
                if v.is_graph_output() and not (g is top and self.keep_io):
                    uses.append(target)
                if not uses or target in uses:
                    v.const_value = ir.tensor(_narrow(tensor_array(v.const_value), target), name=v.name)
                    self._retype(v)
            for node in g:
                reason, _, fixed_out = plan[id(node)]
                if reason is not None:
                    self.kept.append(f"{node.name or node.op_type} ({node.op_type}): {reason}")
                    continue
                self._convert_attributes(node)
                for i, v in enumerate(node.outputs):
                    if id(v) in originally and i not in fixed_out:
                        self._retype(v)
        # Every use gets the type it wants: Casts where a float32 value meets the target or back.
        for g in self.graphs:
            for node in list(g):
                if node.op_type in _ANY_TYPE_INPUTS and canonical_domain(node.domain) == "":
                    continue
                for i, v in enumerate(node.inputs):
                    if v is not None and id(v) in originally and v.dtype != wants(node, i):
                        node.replace_input_with(i, self._cast(v, wants(node, i), g, before=node))
            want = FLOAT if g is top and self.keep_io else target
            for i, v in enumerate(g.outputs):
                if id(v) in originally and v.dtype != want:
                    self._cast_output(g, i, want)
        return self.modified

    def _retype(self, v: ir.Value) -> None:
        v.type = _retyped(v.type, self.target)
        self.modified = True

    def _convert_attributes(self, node: ir.Node) -> None:
        target = self.target
        attrs = node.attributes
        domain = canonical_domain(node.domain)
        if domain == "" and node.op_type == "Cast" and attrs["to"].value == FLOAT:
            attrs["to"] = ir.AttrInt64("to", target)
        if domain == "" and node.op_type in _DTYPE_ATTRIBUTES:
            name, default = _DTYPE_ATTRIBUTES[node.op_type]
            current = attrs[name].value if name in attrs else default
            if current == FLOAT:
                attrs[name] = ir.AttrInt64(name, target)
        if domain == "" and node.op_type == "Constant":
            for name in ("value_float", "value_floats"):
                if name in attrs:
                    array = np.asarray(attrs.pop(name).value, np.float32)
                    attrs["value"] = ir.AttrTensor("value", ir.tensor(array))
        if domain == "" and node.op_type == "ConstantOfShape" and "value" not in attrs:
            attrs["value"] = ir.AttrTensor("value", ir.tensor(np.zeros(1, np.float32)))  # the default: float32 0
        if domain == "" and node.op_type == "Attention" and self.half and "softmax_precision" not in attrs:
            attrs["softmax_precision"] = ir.AttrInt64("softmax_precision", FLOAT)
        for name, attr in list(attrs.items()):
            if attr.type == ir.AttributeType.TENSOR and attr.value.dtype == FLOAT:
                attrs[name] = ir.AttrTensor(name, ir.tensor(_narrow(tensor_array(attr.value), target)))
            elif attr.type == ir.AttributeType.TENSORS and any(t.dtype == FLOAT for t in attr.value):
                attrs[name] = ir.AttrTensors(name, [ir.tensor(_narrow(tensor_array(t), target)) if t.dtype == FLOAT
                                                    else t for t in attr.value])
        self.modified = True

    def _name(self, base: str) -> str:
        name, k = base, 1
        while name in self.names:
            k += 1
            name = f"{base}_{k}"
        self.names.add(name)
        return name

    def _cast(self, v: ir.Value, to: ir.DataType, graph: ir.Graph, before: ir.Node) -> ir.Value:
        """``v`` as ``to``: one Cast per value, type and graph. A value that is a Cast made here
        of a value already of type ``to`` is that value (float32 -> float16 -> float32 would round)."""
        producer = v.producer()
        if id(v) in self.made and producer is not None and producer.inputs[0].dtype == to:
            return producer.inputs[0]
        key = (id(v), id(graph), to)
        if key not in self.casts:
            out = ir.Value(name=self._name(f"{v.name or 'value'}_{_onnx_type_name(to)}"),
                           type=_retyped(v.type, to), shape=_copy(v.shape))
            cast = ir.node("Cast", [v], {"to": int(to)}, outputs=[out], name=self._name(f"{out.name}_Cast"))
            graph.insert_before(before, cast)
            self.casts[key] = out
            self.made.add(id(out))
            self.modified = True
        return self.casts[key]

    def _cast_output(self, graph: ir.Graph, index: int, to: ir.DataType) -> None:
        """Graph output ``index`` cast to ``to``; the Cast's output takes the output's name."""
        v = graph.outputs[index]
        name = v.name
        v.name = self._name(f"{name}_{_onnx_type_name(v.dtype)}")
        out = ir.Value(name=name, type=_retyped(v.type, to), shape=_copy(v.shape))
        graph.append(ir.node("Cast", [v], {"to": int(to)}, outputs=[out], name=self._name(f"{name}_Cast")))
        graph.outputs[index] = out
        self.made.add(id(out))
        self.modified = True


def _onnx_type_name(dtype: ir.DataType) -> str:
    return {ir.DataType.FLOAT: "float", ir.DataType.FLOAT16: "float16", ir.DataType.BFLOAT16: "bfloat16",
            ir.DataType.DOUBLE: "double"}.get(dtype, dtype.name.lower())


def _copy(shape: ir.Shape | None) -> ir.Shape | None:
    return None if shape is None else shape.copy()
