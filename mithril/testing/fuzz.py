"""A structure-aware fuzzer for load + compile + evaluate on the NumPy backend, or on GGMLBackend
(``backend="ggml"``: the cases also draw the ops of :data:`GGML_OPS`, which stress what ggml
asserts on; a worker killed by a signal, a ggml abort, is a ``crash``).

Cases come from hypothesis strategies (hypothesis is in the ``test`` extra):

- ``valid``: small valid graphs, a random chain of ops from :data:`OPS` with valid attributes and
  shapes (float32/float64 values of rank 1 to 4);
- ``field``: a valid graph with protobuf fields mutated: attributes, tensor dims, dtypes,
  constant values, dropped or renamed inputs, swapped ops, deleted nodes, opset changes;
- ``bytes``: a valid graph's serialized bytes with bits flipped, bytes overwritten, inserted,
  duplicated or cut.

Each case runs in a long-lived worker process (a pool fed over pipes, a watchdog per case): a
worker that hangs past the time limit is killed and replaced, one that crashes is replaced. The
outcome of a case is one of :data:`OUTCOMES`: ``ok``; ``refused`` (a MithrilError: an expected
refusal); ``exception`` (any other exception: a bug); ``hang``; ``crash``; ``mismatch`` (Mithril
and onnxruntime both ran the model and an output differs beyond ``ml.validate``'s per-dtype
tolerance). onnxruntime runs only after Mithril succeeded; a crash or hang inside onnxruntime is
counted apart (``reference_crash``/``reference_hang``), not as a Mithril bug.

>>> from mithril.testing.fuzz import generate_cases, run_case       # doctest: +SKIP
>>> kind, data = generate_cases(1, seed=0)[0]                        # doctest: +SKIP
>>> run_case(data)["outcome"]                                        # doctest: +SKIP
'ok'
"""

from __future__ import annotations

import hashlib
import math
import multiprocessing as mp
import os
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.connection import wait as wait_connections
from pathlib import Path

import numpy as np

from ..errors import MithrilError

OUTCOMES = ("ok", "refused", "exception", "hang", "crash", "mismatch")
BUG_OUTCOMES = ("exception", "hang", "crash", "mismatch")
KINDS = ("valid", "field", "bytes")

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
OPSETS = (13, 14, 15, 17, 18, 19, 20, 21)
# Outputs larger than this (elements) are not compared with onnxruntime's.
COMPARE_LIMIT = 1 << 24
# metadata_props key (plus the input's name) of an input's concrete shape, where it is declared symbolic.
SHAPE_KEY = "mithril.fuzz.shape."


# -- building valid graphs --------------------------------------------------------------------------
@dataclass
class Value:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype


class GraphBuilder:
    """Nodes, initializers and value shapes of a graph being drawn."""

    def __init__(self, opset: int, rng: np.random.Generator):
        self.opset = opset
        self.rng = rng
        self.nodes = []
        self.initializers = []
        self.inputs: list[Value] = []
        self.values: list[Value] = []
        self.count = 0

    def fresh(self, stem: str) -> str:
        self.count += 1
        return f"{stem}{self.count}"

    def input(self, shape, dtype) -> Value:
        v = Value(self.fresh("in"), tuple(shape), np.dtype(dtype))
        self.inputs.append(v)
        self.values.append(v)
        return v

    def const(self, array: np.ndarray, stem: str = "c") -> str:
        from onnx import numpy_helper

        name = self.fresh(stem)
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def ints(self, values) -> str:
        return self.const(np.asarray(values, dtype=np.int64), "i")

    def floats(self, shape, dtype) -> str:
        return self.const(self.rng.standard_normal(shape).astype(dtype), "w")

    def node(self, op: str, inputs, shape, dtype, n_outputs: int = 1, **attrs) -> Value:
        from onnx import helper

        outs = [self.fresh("v") for _ in range(n_outputs)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=self.fresh(op.lower()), **attrs))
        v = Value(outs[0], tuple(int(d) for d in shape), np.dtype(dtype))
        self.values.append(v)
        return v

    def model(self, outputs: list[Value], symbolic_batch: bool):
        from onnx import helper

        def info(v: Value, symbolic: bool):
            dims = list(v.shape)
            if symbolic and dims:
                dims[0] = "N"
            return helper.make_tensor_value_info(v.name, helper.np_dtype_to_tensor_dtype(v.dtype), dims)

        graph = helper.make_graph(
            self.nodes, "fuzz", [info(v, symbolic_batch) for v in self.inputs],
            [info(v, False) for v in outputs], initializer=self.initializers,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        model.ir_version = 8
        if symbolic_batch:  # the shapes the constants were drawn for, read back by run_case
            for v in self.inputs:
                model.metadata_props.add(key=SHAPE_KEY + v.name, value=",".join(map(str, v.shape)))
        return model


def _axis(draw, st, rank: int) -> int:
    return draw(st.integers(-rank, rank - 1)) if rank else 0


def _norm(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _broadcast_shape(draw, st, shape) -> tuple[int, ...]:
    """A shape that broadcasts to ``shape``: a suffix of it with some dims set to 1."""
    k = draw(st.integers(0, len(shape)))
    suffix = shape[len(shape) - k:]
    return tuple(1 if draw(st.booleans()) else d for d in suffix)


UNARY = {
    "Relu": {}, "Neg": {}, "Abs": {}, "Exp": {}, "Tanh": {}, "Sigmoid": {}, "Sqrt": {}, "Log": {},
    "Floor": {}, "Ceil": {}, "Sin": {}, "Cos": {}, "Softplus": {}, "Erf": {}, "Reciprocal": {},
    "Softsign": {}, "Identity": {}, "Sign": {}, "Round": {}, "Selu": {}, "Atan": {}, "Asinh": {},
    "Elu": {"alpha": (0.1, 2.0)}, "LeakyRelu": {"alpha": (0.0, 0.5)}, "Celu": {"alpha": (0.5, 2.0)},
    "HardSigmoid": {"alpha": (0.1, 0.5), "beta": (0.2, 0.7)}, "ThresholdedRelu": {"alpha": (0.0, 1.0)},
    "HardSwish": {}, "Mish": {},
}
BINARY = ("Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "Sum", "Mean")
REDUCE = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
          "ReduceLogSumExp", "ReduceSumSquare")


def op_unary(draw, st, b: GraphBuilder, v: Value):
    # Uniform picks from the builder's generator: hypothesis's own draws favour the first items.
    op = str(b.rng.choice(sorted(UNARY)))
    if op in ("Celu",) and v.dtype != F32:
        op = "Relu"  # Celu is float32-only in the schema
    if (op == "HardSwish" and b.opset < 14) or (op == "Mish" and b.opset < 18):
        op = "Relu"
    attrs = {k: draw(st.floats(lo, hi)) for k, (lo, hi) in UNARY[op].items()}
    if op in ("Log", "Sqrt"):
        # NaN-free inputs: NaN propagation through MaxPool/ArgMax differs between correct
        # implementations (onnxruntime's MaxPool skips NaN, numpy's max returns it).
        v = b.node("Abs", [v.name], v.shape, v.dtype)
    return b.node(op, [v.name], v.shape, v.dtype, **attrs)


def op_binary(draw, st, b, v):
    op = str(b.rng.choice(BINARY))
    same = [u for u in b.values if u.shape == v.shape and u.dtype == v.dtype]
    if draw(st.booleans()):
        other = draw(st.sampled_from(same)).name
    else:
        other = b.floats(_broadcast_shape(draw, st, v.shape), v.dtype)
    if op == "Pow":  # a positive base and exponent keep the result real and finite
        v = b.node("Abs", [v.name], v.shape, v.dtype)
        other = b.const(np.clip(np.abs(b.rng.standard_normal(_broadcast_shape(draw, st, v.shape))) + 0.5, 0.5, 3)
                        .astype(v.dtype))
    inputs = [v.name, other] if draw(st.booleans()) or op == "Pow" else [other, v.name]
    return b.node(op, inputs, v.shape, v.dtype)


def op_reduce(draw, st, b, v):
    op = str(b.rng.choice(REDUCE))
    rank = len(v.shape)
    axes = sorted(set(draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank))))
    axes = [a - rank if draw(st.booleans()) else a for a in axes]
    keep = draw(st.integers(0, 1))
    shape = [1 if i in {_norm(a, rank) for a in axes} else d for i, d in enumerate(v.shape)]
    if not keep:
        shape = [d for i, d in enumerate(v.shape) if i not in {_norm(a, rank) for a in axes}]
    if op == "ReduceSum" or b.opset >= 18:
        return b.node(op, [v.name, b.ints(axes)], shape, v.dtype, keepdims=keep)
    return b.node(op, [v.name], shape, v.dtype, axes=axes, keepdims=keep)


def op_transpose(draw, st, b, v):
    perm = draw(st.permutations(range(len(v.shape))))
    return b.node("Transpose", [v.name], [v.shape[p] for p in perm], v.dtype, perm=list(perm))


def op_reshape(draw, st, b, v):
    size = math.prod(v.shape)
    choice = draw(st.integers(0, 3))
    if choice == 0:
        target, shape = [-1], [size]
    elif choice == 1 and len(v.shape) >= 2:
        target, shape = [0, -1], [v.shape[0], size // v.shape[0]]
    else:
        divisors = [d for d in range(1, size + 1) if size % d == 0]
        first = draw(st.sampled_from(divisors))
        target = shape = [first, size // first]
    return b.node("Reshape", [v.name, b.ints(target)], shape, v.dtype)


def op_flatten(draw, st, b, v):
    rank = len(v.shape)
    axis = draw(st.integers(-rank, rank))
    a = _norm(axis, rank)
    return b.node("Flatten", [v.name], [math.prod(v.shape[:a]), math.prod(v.shape[a:])], v.dtype, axis=axis)


def op_unsqueeze(draw, st, b, v):
    if len(v.shape) >= 4:
        return None
    rank = len(v.shape) + 1
    axis = draw(st.integers(-rank, rank - 1))
    shape = list(v.shape)
    shape.insert(_norm(axis, rank), 1)
    return b.node("Unsqueeze", [v.name, b.ints([axis])], shape, v.dtype)


def op_squeeze(draw, st, b, v):
    ones = [i for i, d in enumerate(v.shape) if d == 1]
    if not ones or len(v.shape) == 1:
        return None
    axis = draw(st.sampled_from(ones))
    return b.node("Squeeze", [v.name, b.ints([axis])], [d for i, d in enumerate(v.shape) if i != axis], v.dtype)


def op_concat(draw, st, b, v):
    rank = len(v.shape)
    axis = _axis(draw, st, rank)
    extra = list(v.shape)
    extra[_norm(axis, rank)] = draw(st.integers(1, 3))
    shape = list(v.shape)
    shape[_norm(axis, rank)] += extra[_norm(axis, rank)]
    return b.node("Concat", [v.name, b.floats(extra, v.dtype)], shape, v.dtype, axis=axis)


def op_slice(draw, st, b, v):
    rank = len(v.shape)
    axes = sorted(set(draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank))))
    starts, ends, steps, shape = [], [], [], list(v.shape)
    for a in axes:
        d = v.shape[a]
        step = draw(st.sampled_from([1, 1, 2, -1, -2]))
        start = draw(st.integers(-d - 1, d + 1))
        end = draw(st.integers(-d - 1, d + 1))
        starts.append(start), ends.append(end), steps.append(step)
        shape[a] = len(range(d)[slice(start, end, step)])
    if 0 in shape:
        return None
    return b.node("Slice", [v.name, b.ints(starts), b.ints(ends), b.ints(axes), b.ints(steps)], shape, v.dtype)


def op_gather(draw, st, b, v):
    rank = len(v.shape)
    axis = _axis(draw, st, rank)
    d = v.shape[_norm(axis, rank)]
    ishape = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    if rank + len(ishape) - 1 > 4 or rank + len(ishape) - 1 < 1:
        return None
    indices = b.rng.integers(-d, d, size=ishape)
    a = _norm(axis, rank)
    shape = v.shape[:a] + ishape + v.shape[a + 1:]
    return b.node("Gather", [v.name, b.ints(indices)], shape, v.dtype, axis=axis)


def op_tile(draw, st, b, v):
    reps = [draw(st.integers(1, 2)) for _ in v.shape]
    return b.node("Tile", [v.name, b.ints(reps)], [d * r for d, r in zip(v.shape, reps)], v.dtype)


def op_pad(draw, st, b, v):
    mode = draw(st.sampled_from(["constant", "reflect", "edge"]))
    rank = len(v.shape)
    pads = []
    for _ in range(2):
        for d in v.shape:
            pads.append(draw(st.integers(0, min(2, d - 1) if mode == "reflect" else 2)))
    shape = [d + pads[i] + pads[i + rank] for i, d in enumerate(v.shape)]
    inputs = [v.name, b.ints(pads)]
    if mode == "constant" and draw(st.booleans()):
        inputs.append(b.const(np.array(draw(st.floats(-2, 2)), dtype=v.dtype)))
    return b.node("Pad", inputs, shape, v.dtype, mode=mode)


def op_softmax(draw, st, b, v):
    op = draw(st.sampled_from(["Softmax", "LogSoftmax"]))
    return b.node(op, [v.name], v.shape, v.dtype, axis=_axis(draw, st, len(v.shape)))


def op_matmul(draw, st, b, v):
    k = draw(st.integers(1, 5))
    if len(v.shape) == 1:
        return b.node("MatMul", [v.name, b.floats([v.shape[0], k], v.dtype)], [k], v.dtype)
    return b.node("MatMul", [v.name, b.floats([v.shape[-1], k], v.dtype)], v.shape[:-1] + (k,), v.dtype)


def op_gemm(draw, st, b, v):
    if len(v.shape) != 2:
        return None
    m, kdim = v.shape
    n = draw(st.integers(1, 5))
    trans_b = draw(st.integers(0, 1))
    w = b.floats([n, kdim] if trans_b else [kdim, n], v.dtype)
    inputs = [v.name, w]
    if draw(st.booleans()):
        inputs.append(b.floats(draw(st.sampled_from([(n,), (1,), (m, n), (1, n)])), v.dtype))
    return b.node("Gemm", inputs, [m, n], v.dtype, transB=trans_b,
                  alpha=draw(st.floats(-2, 2)), beta=draw(st.floats(-2, 2)))


def op_cast(draw, st, b, v):
    # Only down: a float32 result cast up would be compared at float64's tolerance.
    if v.dtype != F64:
        return None
    to = F32
    from onnx import helper

    return b.node("Cast", [v.name], v.shape, to, to=helper.np_dtype_to_tensor_dtype(to))


def op_clip(draw, st, b, v):
    lo = draw(st.floats(-2, 0))
    hi = draw(st.floats(0, 2))
    return b.node("Clip", [v.name, b.const(np.array(lo, v.dtype)), b.const(np.array(hi, v.dtype))], v.shape, v.dtype)


def op_where(draw, st, b, v):
    threshold = b.const(np.array(draw(st.floats(-1, 1)), v.dtype))
    cond = b.node(draw(st.sampled_from(["Greater", "Less"])), [v.name, threshold], v.shape, np.bool_)
    other = b.floats(_broadcast_shape(draw, st, v.shape), v.dtype)
    return b.node("Where", [cond.name, v.name, other], v.shape, v.dtype)


def op_layernorm(draw, st, b, v):
    if b.opset < 17:
        return None
    rank = len(v.shape)
    axis = _axis(draw, st, rank)
    norm_shape = v.shape[_norm(axis, rank):]
    return b.node("LayerNormalization", [v.name, b.floats(norm_shape, v.dtype), b.floats(norm_shape, v.dtype)],
                  v.shape, v.dtype, axis=axis, epsilon=draw(st.sampled_from([1e-5, 1e-3])))


def op_cumsum(draw, st, b, v):
    axis = _axis(draw, st, len(v.shape))
    return b.node("CumSum", [v.name, b.ints(axis)], v.shape, v.dtype,
                  exclusive=draw(st.integers(0, 1)), reverse=draw(st.integers(0, 1)))


def op_argmax(draw, st, b, v):
    from onnx import helper

    op = draw(st.sampled_from(["ArgMax", "ArgMin"]))
    rank = len(v.shape)
    axis = _axis(draw, st, rank)
    keep = draw(st.integers(0, 1))
    a = _norm(axis, rank)
    shape = [1 if i == a else d for i, d in enumerate(v.shape)] if keep else [d for i, d in enumerate(v.shape) if i != a]
    if not shape:
        return None
    idx = b.node(op, [v.name], shape, np.int64, axis=axis, keepdims=keep)
    return b.node("Cast", [idx.name], shape, v.dtype, to=helper.np_dtype_to_tensor_dtype(v.dtype))


def op_topk(draw, st, b, v):
    rank = len(v.shape)
    axis = _axis(draw, st, rank)
    a = _norm(axis, rank)
    k = draw(st.integers(1, v.shape[a]))
    shape = [k if i == a else d for i, d in enumerate(v.shape)]
    return b.node("TopK", [v.name, b.ints([k])], shape, v.dtype, n_outputs=2, axis=axis,
                  largest=draw(st.integers(0, 1)))


def op_expand(draw, st, b, v):
    shape = [draw(st.integers(2, 3)) if d == 1 and draw(st.booleans()) else d for d in v.shape]
    return b.node("Expand", [v.name, b.ints(shape)], shape, v.dtype)


def _pool_dim(d, k, s, p0, p1, dil=1, ceil=False):
    span = d + p0 + p1 - dil * (k - 1) - 1
    return (math.ceil(span / s) if ceil else span // s) + 1


def op_conv(draw, st, b, v):
    if len(v.shape) != 4:
        return None
    n, c, h, w = v.shape
    group = draw(st.sampled_from([g for g in (1, 2, c) if c % g == 0]))
    m = group * draw(st.integers(1, 2))
    k = [draw(st.integers(1, min(3, h))), draw(st.integers(1, min(3, w)))]
    strides = [draw(st.integers(1, 2)) for _ in range(2)]
    dil = [draw(st.integers(1, 2)) for _ in range(2)]
    pads = [draw(st.integers(0, k[i % 2] - 1)) for i in range(4)]
    out = [_pool_dim(x, k[i], strides[i], pads[i], pads[i + 2], dil[i]) for i, x in enumerate((h, w))]
    if min(out) < 1:
        return None
    inputs = [v.name, b.floats([m, c // group, *k], v.dtype)]
    if draw(st.booleans()):
        inputs.append(b.floats([m], v.dtype))
    return b.node("Conv", inputs, [n, m, *out], v.dtype, group=group, kernel_shape=k, strides=strides,
                  dilations=dil, pads=pads)


def op_pool(draw, st, b, v):
    if len(v.shape) != 4:
        return None
    op = draw(st.sampled_from(["MaxPool", "AveragePool"]))
    n, c, h, w = v.shape
    k = [draw(st.integers(1, min(3, h))), draw(st.integers(1, min(3, w)))]
    strides = [draw(st.integers(1, 2)) for _ in range(2)]
    pads = [draw(st.integers(0, k[i % 2] - 1)) for i in range(4)]
    ceil = draw(st.integers(0, 1))
    out = []
    for i, x in enumerate((h, w)):
        o = _pool_dim(x, k[i], strides[i], pads[i], pads[i + 2], 1, bool(ceil))
        if ceil and (o - 1) * strides[i] >= x + pads[i]:  # the last window would start in the padding
            o -= 1
        out.append(o)
    if min(out) < 1:
        return None
    attrs = dict(kernel_shape=k, strides=strides, pads=pads, ceil_mode=ceil)
    if op == "AveragePool":
        attrs["count_include_pad"] = draw(st.integers(0, 1))
    return b.node(op, [v.name], [n, c, *out], v.dtype, **attrs)


def op_batchnorm(draw, st, b, v):
    if len(v.shape) < 2:
        return None
    c = v.shape[1]
    var = np.abs(b.rng.standard_normal(c)).astype(v.dtype) + 0.5
    return b.node("BatchNormalization", [v.name, b.floats([c], v.dtype), b.floats([c], v.dtype),
                                         b.floats([c], v.dtype), b.const(var)], v.shape, v.dtype,
                  epsilon=1e-5)


def op_shape_reshape(draw, st, b, v):
    """The exporters' shape sub-graph: Shape -> Gather -> Unsqueeze -> Concat -> Reshape."""
    if len(v.shape) < 2:
        return None
    shape = b.node("Shape", [v.name], [len(v.shape)], np.int64)
    first = b.node("Gather", [shape.name, b.ints(0)], [], np.int64, axis=0)
    first = b.node("Unsqueeze", [first.name, b.ints([0])], [1], np.int64)
    target = b.node("Concat", [first.name, b.ints([-1])], [2], np.int64, axis=0)
    return b.node("Reshape", [v.name, target.name], [v.shape[0], math.prod(v.shape[1:])], v.dtype)


def op_split(draw, st, b, v):
    rank = len(v.shape)
    axis = _axis(draw, st, rank)
    d = v.shape[_norm(axis, rank)]
    if d < 2:
        return None
    first = draw(st.integers(1, d - 1))
    shape = [first if i == _norm(axis, rank) else x for i, x in enumerate(v.shape)]
    return b.node("Split", [v.name, b.ints([first, d - first])], shape, v.dtype, n_outputs=2, axis=axis)


def op_if(draw, st, b, v):
    """If on a data-dependent condition; both branches read ``v`` from the enclosing graph."""
    from onnx import helper

    total = b.node("ReduceSum", [v.name, b.ints(list(range(len(v.shape))))], [], v.dtype, keepdims=0)
    cond = b.node("Greater", [total.name, b.const(np.array(0, v.dtype))], [], np.bool_)
    elem = helper.np_dtype_to_tensor_dtype(v.dtype)
    branches = {}
    for key, op in (("then_branch", draw(st.sampled_from(["Relu", "Neg", "Abs"]))),
                    ("else_branch", draw(st.sampled_from(["Tanh", "Sigmoid", "Identity"])))):
        out = b.fresh(key[:4])
        branches[key] = helper.make_graph([helper.make_node(op, [v.name], [out])], b.fresh("g"), [],
                                          [helper.make_tensor_value_info(out, elem, list(v.shape))])
    return b.node("If", [cond.name], v.shape, v.dtype, **branches)


def op_gather_elements(draw, st, b, v):
    rank = len(v.shape)
    axis = _axis(draw, st, rank)
    a = _norm(axis, rank)
    ishape = [draw(st.integers(1, d)) if i != a else draw(st.integers(1, 3)) for i, d in enumerate(v.shape)]
    indices = b.rng.integers(-v.shape[a], v.shape[a], size=ishape)
    return b.node("GatherElements", [v.name, b.ints(indices)], ishape, v.dtype, axis=axis)


def op_resize(draw, st, b, v):
    if len(v.shape) != 4:
        return None
    mode = draw(st.sampled_from(["nearest", "linear"]))
    coord = draw(st.sampled_from(["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel"]))
    scales = [1.0, 1.0, draw(st.sampled_from([0.5, 1.5, 2.0, 3.0])), draw(st.sampled_from([0.5, 1.0, 2.0]))]
    out = [int(math.floor(d * s)) for d, s in zip(v.shape, scales)]
    if min(out) < 1:
        return None
    if coord == "align_corners" and any(d * s != o for d, s, o in zip(v.shape, scales, out)):
        # length_resized is d * scale in the ONNX reference (and Mithril) but the floored output
        # size in onnxruntime: the spec leaves it open, so the fuzzer does not compare it.
        coord = "asymmetric"
    attrs = dict(mode=mode, coordinate_transformation_mode=coord)
    if mode == "nearest":
        attrs["nearest_mode"] = draw(st.sampled_from(["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]))
    roi = "" if b.opset >= 13 else b.const(np.zeros(0, np.float32))
    return b.node("Resize", [v.name, roi, b.const(np.array(scales, np.float32), "s")], out, v.dtype, **attrs)


def op_depth_to_space(draw, st, b, v):
    if len(v.shape) != 4:
        return None
    n, c, h, w = v.shape
    if draw(st.booleans()):
        if c % 4:
            return None
        return b.node("DepthToSpace", [v.name], [n, c // 4, h * 2, w * 2], v.dtype, blocksize=2,
                      mode=draw(st.sampled_from(["DCR", "CRD"])))
    if h % 2 or w % 2:
        return None
    return b.node("SpaceToDepth", [v.name], [n, c * 4, h // 2, w // 2], v.dtype, blocksize=2)


def op_einsum(draw, st, b, v):
    if len(v.shape) != 2:
        return None
    m, k = v.shape
    choice = draw(st.integers(0, 2))
    if choice == 0:
        n = draw(st.integers(1, 4))
        return b.node("Einsum", [v.name, b.floats([k, n], v.dtype)], [m, n], v.dtype, equation="ij,jk->ik")
    if choice == 1:
        return b.node("Einsum", [v.name], [k, m], v.dtype, equation="ij->ji")
    return b.node("Einsum", [v.name], [m], v.dtype, equation="ij->i")


def op_trilu(draw, st, b, v):
    if len(v.shape) < 2 or b.opset < 14:
        return None
    inputs = [v.name] + ([b.ints(draw(st.integers(-2, 2)))] if draw(st.booleans()) else [])
    return b.node("Trilu", inputs, v.shape, v.dtype, upper=draw(st.integers(0, 1)))


def op_integer(draw, st, b, v):
    """A detour through integers: Cast(Floor(4x)) to int32/int64, integer ops, Cast back.
    Integer Div truncates toward zero and Mod follows the divisor's sign (fmod=0) or the
    dividend's (fmod=1): the places numpy's floor semantics differ."""
    from onnx import helper

    if v.dtype == np.float16:
        return None
    it = draw(st.sampled_from([np.dtype(np.int32), np.dtype(np.int64)]))
    scaled = b.node("Mul", [v.name, b.const(np.array(4, v.dtype))], v.shape, v.dtype)
    floored = b.node("Floor", [scaled.name], v.shape, v.dtype)
    x = b.node("Cast", [floored.name], v.shape, it, to=helper.np_dtype_to_tensor_dtype(it))
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["Add", "Sub", "Mul", "Div", "Mod", "Max", "Min", "Abs", "Neg"]))
        if op in ("Abs", "Neg"):
            x = b.node(op, [x.name], x.shape, it)
            continue
        other = b.rng.integers(-5, 6, size=_broadcast_shape(draw, st, x.shape)).astype(it)
        if op in ("Div", "Mod"):
            other[other == 0] = 3
        attrs = {"fmod": draw(st.integers(0, 1))} if op == "Mod" else {}
        x = b.node(op, [x.name, b.const(other)], x.shape, it, **attrs)
    return b.node("Cast", [x.name], x.shape, v.dtype, to=helper.np_dtype_to_tensor_dtype(v.dtype))


# The op table: each entry draws one node on the value ``v`` (or declines with None).
OPS = {
    "unary": op_unary, "binary": op_binary, "reduce": op_reduce, "transpose": op_transpose,
    "reshape": op_reshape, "flatten": op_flatten, "unsqueeze": op_unsqueeze, "squeeze": op_squeeze,
    "concat": op_concat, "slice": op_slice, "gather": op_gather, "tile": op_tile, "pad": op_pad,
    "softmax": op_softmax, "matmul": op_matmul, "gemm": op_gemm, "cast": op_cast, "clip": op_clip,
    "where": op_where, "layernorm": op_layernorm, "cumsum": op_cumsum, "argmax": op_argmax,
    "topk": op_topk, "expand": op_expand, "conv": op_conv, "pool": op_pool, "batchnorm": op_batchnorm,
    "shape_reshape": op_shape_reshape, "split": op_split, "if": op_if, "gather_elements": op_gather_elements,
    "resize": op_resize, "depth_to_space": op_depth_to_space, "einsum": op_einsum, "trilu": op_trilu,
    "integer": op_integer,
}


def _widen(draw, st, b, v) -> Value:
    """``v`` (N, C, H, W) with C multiplied by 1 to 6 through a 1x1 Conv: grouped convolutions get
    many groups (ggml builds each group as its own convolution)."""
    n, c, h, w = v.shape
    r = draw(st.integers(1, 6))
    if r == 1:
        return v
    return b.node("Conv", [v.name, b.floats([c * r, c, 1, 1], v.dtype)], [n, c * r, h, w], v.dtype,
                  kernel_shape=[1, 1])


def op_conv_wide(draw, st, b, v):
    """A Conv with a kernel up to the padded input (and, one time in six, past it: onnxruntime
    and Mithril refuse that node, ggml's im2col asserts on it), grouped (depthwise, with a
    channel multiplier, or by a divisor), strided, dilated, or padded by auto_pad."""
    if len(v.shape) != 4 or v.dtype != F32:
        return None
    v = _widen(draw, st, b, v)
    n, c, h, w = v.shape
    group = draw(st.sampled_from(sorted({g for g in (1, 2, 3, c) if c % g == 0})))
    m = group * draw(st.integers(1, 3))
    strides = [draw(st.integers(1, 3)) for _ in range(2)]
    dil = [draw(st.integers(1, 2)) for _ in range(2)]
    pads = [draw(st.integers(0, 3)) for _ in range(4)]
    over = draw(st.integers(0, 5)) == 0
    k = []
    for i, x in enumerate((h, w)):
        room = (x + pads[i] + pads[i + 2] - 1) // dil[i] + 1  # the largest kernel that fits
        k.append(room + draw(st.integers(1, 2)) if over else draw(st.integers(1, max(room, 1))))
    attrs = dict(group=group, kernel_shape=k, strides=strides, dilations=dil)
    if draw(st.integers(0, 4)) == 0:
        attrs["auto_pad"] = draw(st.sampled_from(["SAME_UPPER", "SAME_LOWER", "VALID"]))
        if attrs["auto_pad"] == "VALID":
            pads = [0, 0, 0, 0]
        else:
            attrs["dilations"] = dil = [1, 1]
    else:
        attrs["pads"] = pads
    if attrs.get("auto_pad", "").startswith("SAME"):
        out = [-(-x // s) for x, s in zip((h, w), strides)]
    else:
        out = [max(_pool_dim(x, k[i], strides[i], pads[i], pads[i + 2], dil[i]), 1) for i, x in enumerate((h, w))]
    inputs = [v.name, b.floats([m, c // group, *k], v.dtype)]
    if draw(st.booleans()):
        inputs.append(b.floats([m], v.dtype))
    return b.node("Conv", inputs, [n, m, *out], v.dtype, **attrs)


def op_pool_wide(draw, st, b, v):
    """MaxPool / AveragePool / LpPool with windows up to the padded input, strides past the
    window, ceil_mode. (Not past the padded input: onnxruntime computes such a pool, its output
    size by C's truncating division, where the ONNX formula gives none.)"""
    if len(v.shape) != 4 or v.dtype != F32:
        return None
    n, c, h, w = v.shape
    op = draw(st.sampled_from(["MaxPool", "AveragePool", "LpPool"]))
    pads = [draw(st.integers(0, 2)) for _ in range(4)]
    k = [draw(st.integers(1, x + pads[i] + pads[i + 2])) for i, x in enumerate((h, w))]
    pads = [min(p, k[i % 2] - 1) for i, p in enumerate(pads)]  # onnxruntime: each pad smaller than the window
    strides = [draw(st.integers(1, 4)) for _ in range(2)]
    attrs = dict(kernel_shape=k, strides=strides, pads=pads)
    ceil = 0
    if op != "LpPool":
        ceil = attrs["ceil_mode"] = draw(st.integers(0, 1))
    else:
        attrs["p"] = draw(st.sampled_from([1, 2, 3]))
    out = []
    for i, x in enumerate((h, w)):
        o = _pool_dim(x, k[i], strides[i], pads[i], pads[i + 2], 1, bool(ceil))
        if ceil and (o - 1) * strides[i] >= x + pads[i]:
            o -= 1
        out.append(max(o, 1))
    return b.node(op, [v.name], [n, c, *out], v.dtype, **attrs)


def op_recurrent(draw, st, b, v):
    """RNN, GRU or LSTM over ``v`` read as (seq, batch, input), forward, reverse or bidirectional
    (ggml unrolls each step: many tensors for one node)."""
    if len(v.shape) != 3 or v.dtype != F32:
        return None
    op = draw(st.sampled_from(["RNN", "GRU", "LSTM"]))
    s_, bsz, i = v.shape
    h = draw(st.integers(1, 4))
    direction = draw(st.sampled_from(["forward", "reverse", "bidirectional"]))
    d = 2 if direction == "bidirectional" else 1
    g = {"RNN": 1, "GRU": 3, "LSTM": 4}[op]
    inputs = [v.name, b.floats([d, g * h, i], v.dtype), b.floats([d, g * h, h], v.dtype)]
    if draw(st.booleans()):
        inputs.append(b.floats([d, 2 * g * h], v.dtype))
    y = b.node(op, inputs, [s_, d, bsz, h], v.dtype, hidden_size=h, direction=direction)
    return b.node("Reshape", [y.name, b.ints([s_, d * bsz, h])], [s_, d * bsz, h], v.dtype)


def op_arg_gather(draw, st, b, v):
    """ArgMax along one axis, its indices reading rows of another value along an axis of
    another length (onnxruntime fails at run time on an index past it; ggml would read past
    its table and assert)."""
    if v.dtype != F32 or not v.shape:
        return None
    rank = len(v.shape)
    axis = draw(st.integers(0, rank - 1))
    keep = [d for i, d in enumerate(v.shape) if i != axis]
    if not keep or len(keep) > 2:
        return None
    idx = b.node("ArgMax", [v.name], keep, np.int64, axis=axis, keepdims=0)
    rows = max(1, v.shape[axis] + draw(st.integers(-2, 2)))
    table = b.floats([rows, 3], v.dtype)
    return b.node("Gather", [table, idx.name], keep + [3], v.dtype, axis=0)


def op_nan_topk(draw, st, b, v):
    """TopK of values with NaN and inf in them, its indices gathering ``v`` (ggml's TopK counts
    ranks by comparisons NaN makes false)."""
    if v.dtype != F32 or not v.shape:
        return None
    special = b.rng.choice(np.array([np.nan, np.inf, -np.inf, 1.0, 1.0], np.float32), size=v.shape)
    x = b.node("Mul", [v.name, b.const(special)], v.shape, v.dtype)
    axis = len(v.shape) - 1
    k = draw(st.integers(1, v.shape[axis]))
    shape = list(v.shape[:-1]) + [k]
    b.node("TopK", [x.name, b.ints([k])], shape, v.dtype, n_outputs=2, axis=axis)
    indices = b.nodes[-1].output[1]
    return b.node("GatherElements", [v.name, indices], shape, v.dtype, axis=axis)


def op_norm_eps(draw, st, b, v):
    """LayerNormalization or InstanceNormalization with a negative epsilon (ggml's norms assert
    epsilon >= 0; onnxruntime takes it). Not 0 or tiny: the normalized value of a row of equal
    values is then 0 / 0, or rounding noise over nothing, which correct kernels disagree on."""
    if v.dtype != F32 or len(v.shape) < 2 or b.opset < 17:
        return None
    eps = draw(st.sampled_from([-1e-5, -1e-3, 1e-5]))
    if draw(st.booleans()) and len(v.shape) >= 3:
        c = v.shape[1]
        return b.node("InstanceNormalization", [v.name, b.floats([c], v.dtype), b.floats([c], v.dtype)], v.shape,
                      v.dtype, epsilon=eps)
    return b.node("LayerNormalization", [v.name, b.floats(v.shape[-1:], v.dtype)], v.shape, v.dtype, axis=-1,
                  epsilon=eps)


# Ops the GGML target draws besides :data:`OPS`: the shapes and values ggml's assertions are about.
GGML_OPS = {
    "conv_wide": op_conv_wide, "pool_wide": op_pool_wide, "recurrent": op_recurrent,
    "arg_gather": op_arg_gather, "nan_topk": op_nan_topk, "norm_eps": op_norm_eps,
}
BACKENDS = ("numpy", "ggml")


def _strategies(ops: dict | None = None):
    """The hypothesis strategies, built on first use (hypothesis is a test-only dependency);
    ``ops``: the op table valid graphs draw from (default :data:`OPS`)."""
    from hypothesis import strategies as st

    ops = OPS if ops is None else ops

    @st.composite
    def valid_models(draw):
        opset = draw(st.sampled_from(OPSETS))
        b = GraphBuilder(opset, np.random.default_rng(draw(st.integers(0, 2**32 - 1))))
        rank = int(b.rng.integers(1, 5))
        shape = [int(d) for d in b.rng.integers(1, 5, size=rank)]
        dtype = [F32, F32, F32, F64, F16][int(b.rng.integers(0, 5))]
        v = b.input(shape, dtype)
        if draw(st.booleans()):
            b.input(shape, dtype)  # a second input, read through binary ops
        for _ in range(int(b.rng.integers(1, 7))):
            if not v.shape:  # a scalar ends the chain: most ops in the table want an axis
                break
            op = str(b.rng.choice(sorted(ops)))
            produced = ops[op](draw, st, b, v)
            if produced is not None and math.prod(produced.shape) <= 4096 and len(produced.shape) <= 4:
                v = produced
            elif produced is not None:
                break
        outputs = [v]
        extra = [u for u in b.values[:-1] if u not in b.inputs and u.name != v.name]
        if extra and draw(st.booleans()):
            outputs.insert(0, draw(st.sampled_from(extra)))
        return b.model(outputs, symbolic_batch=draw(st.integers(0, 4)) == 0).SerializeToString()

    @st.composite
    def field_mutated_models(draw):
        import onnx

        proto = onnx.ModelProto.FromString(draw(valid_models()))
        for _ in range(draw(st.integers(1, 3))):
            mutation = draw(st.sampled_from(sorted(MUTATIONS)))
            try:
                MUTATIONS[mutation](draw, st, proto)
            except Exception:  # noqa: BLE001 - a mutation that cannot apply after an earlier one
                pass
        return proto.SerializeToString()

    @st.composite
    def byte_mutated_models(draw):
        data = bytearray(draw(valid_models()))
        for _ in range(draw(st.integers(1, 4))):
            how = draw(st.sampled_from(["flip", "set", "insert", "delete", "duplicate", "truncate"]))
            if not data:
                break
            i = draw(st.integers(0, len(data) - 1))
            if how == "flip":
                data[i] ^= 1 << draw(st.integers(0, 7))
            elif how == "set":
                data[i] = draw(st.sampled_from([0, 1, 0x7F, 0x80, 0xFF, draw(st.integers(0, 255))]))
            elif how == "insert":
                data[i:i] = draw(st.binary(min_size=1, max_size=8))
            elif how == "delete":
                del data[i:i + draw(st.integers(1, 8))]
            elif how == "duplicate":
                j = draw(st.integers(i, min(len(data), i + 32)))
                data[j:j] = data[i:j]
            else:
                del data[i:]
        return bytes(data)

    return {"valid": valid_models(), "field": field_mutated_models(), "bytes": byte_mutated_models()}


# -- protobuf-field mutations ----------------------------------------------------------------------
def _all_nodes(proto):
    return list(proto.graph.node)


def _pick_node(draw, st, proto):
    nodes = _all_nodes(proto)
    return draw(st.sampled_from(nodes)) if nodes else None


def mutate_attribute(draw, st, proto):
    import onnx

    node = _pick_node(draw, st, proto)
    if node is None or not node.attribute:
        return
    attr = draw(st.sampled_from(list(node.attribute)))
    how = draw(st.integers(0, 3))
    if how == 0:
        node.attribute.remove(attr)
    elif attr.type == onnx.AttributeProto.INT:
        attr.i = draw(st.sampled_from([-1, 0, 1, 2, 3, 5, -7, 2**31, -(2**63)]))
    elif attr.type == onnx.AttributeProto.FLOAT:
        # Moderate values: alpha=1e30 only measures float32 rounding (exp(x/alpha)-1 == 0).
        attr.f = draw(st.sampled_from([0.0, -1.0, 0.5, 3.5]))
    elif attr.type == onnx.AttributeProto.INTS and attr.ints:
        i = draw(st.integers(0, len(attr.ints) - 1))
        if how == 1:
            attr.ints[i] = draw(st.sampled_from([-5, -1, 0, 1, 7, 2**40]))
        elif how == 2:
            del attr.ints[i]
        else:
            attr.ints.append(draw(st.integers(-3, 5)))
    elif attr.type == onnx.AttributeProto.STRING:
        attr.s = draw(st.sampled_from([b"", b"bogus", b"reflect", b"edge", b"wrap"]))
    else:  # change the declared type
        attr.type = draw(st.sampled_from([onnx.AttributeProto.INT, onnx.AttributeProto.FLOATS,
                                          onnx.AttributeProto.STRING, onnx.AttributeProto.TENSOR]))


def mutate_constant_values(draw, st, proto):
    """An initializer's values replaced (consistently): int64 shape/axes/indices get small ints."""
    from onnx import numpy_helper

    if not proto.graph.initializer:
        return
    t = draw(st.sampled_from(list(proto.graph.initializer)))
    arr = numpy_helper.to_array(t)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if arr.dtype.kind in "iu":
        new = rng.integers(-6, 8, size=arr.shape).astype(arr.dtype)
    else:
        # Finite values: inf/nan through fused formulas (BatchNormalization's scale * x + shift)
        # put NaNs in places that differ between correct implementations.
        new = rng.choice(np.array([0.0, -1.0, 2.5, 1e3, -0.0], arr.dtype), size=arr.shape)
    t.CopyFrom(numpy_helper.from_array(new, t.name))


def mutate_tensor_dims(draw, st, proto):
    """An initializer's dims changed, with data to match (a consistent but unexpected shape)."""
    from onnx import numpy_helper

    if not proto.graph.initializer:
        return
    t = draw(st.sampled_from(list(proto.graph.initializer)))
    arr = numpy_helper.to_array(t)
    rank = draw(st.integers(0, 4))
    shape = [draw(st.integers(0, 4)) for _ in range(rank)]
    new = np.resize(arr.reshape(-1) if arr.size else np.zeros(1, arr.dtype), math.prod(shape)).reshape(shape)
    t.CopyFrom(numpy_helper.from_array(new.astype(arr.dtype), t.name))


def mutate_raw_dims(draw, st, proto):
    """An initializer's dims changed and its data left as it was (inconsistent)."""
    if not proto.graph.initializer:
        return
    t = draw(st.sampled_from(list(proto.graph.initializer)))
    if t.dims:
        t.dims[draw(st.integers(0, len(t.dims) - 1))] = draw(st.sampled_from([0, -1, 3, 2**20, 2**40]))
    else:
        t.dims.append(draw(st.integers(0, 5)))


def mutate_dtype(draw, st, proto):
    from onnx import TensorProto, numpy_helper

    where = draw(st.integers(0, 2))
    dtypes = [TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT64,
              TensorProto.INT32, TensorProto.BOOL, TensorProto.UINT8, TensorProto.STRING]
    to = draw(st.sampled_from(dtypes))
    if where == 0 and proto.graph.initializer:
        t = draw(st.sampled_from(list(proto.graph.initializer)))
        arr = numpy_helper.to_array(t)
        if to == TensorProto.STRING:
            new = arr.astype(str).astype(object)
        else:
            from onnx import helper

            with np.errstate(all="ignore"):
                new = np.nan_to_num(arr).astype(helper.tensor_dtype_to_np_dtype(to))
        t.CopyFrom(numpy_helper.from_array(new, t.name))
    elif where == 1:
        values = list(proto.graph.input) + list(proto.graph.output)
        if values:
            draw(st.sampled_from(values)).type.tensor_type.elem_type = to
    else:
        casts = [n for n in proto.graph.node if n.op_type == "Cast"]
        if casts:
            for a in draw(st.sampled_from(casts)).attribute:
                a.i = to


def mutate_drop_input(draw, st, proto):
    node = _pick_node(draw, st, proto)
    if node is None or not node.input:
        return
    i = draw(st.integers(0, len(node.input) - 1))
    if draw(st.booleans()):
        node.input[i] = ""
    else:
        del node.input[i]


def mutate_rename(draw, st, proto):
    node = _pick_node(draw, st, proto)
    if node is None:
        return
    names = [v.name for v in proto.graph.input] + [t.name for t in proto.graph.initializer]
    names += [o for n in proto.graph.node for o in n.output]
    new = draw(st.sampled_from(names + ["fresh_name"]))
    if draw(st.booleans()) and node.input:
        node.input[draw(st.integers(0, len(node.input) - 1))] = new
    elif node.output:
        node.output[draw(st.integers(0, len(node.output) - 1))] = new


def mutate_op_type(draw, st, proto):
    node = _pick_node(draw, st, proto)
    if node is not None:
        node.op_type = draw(st.sampled_from(sorted(UNARY) + list(BINARY) + list(REDUCE) + [
            "Transpose", "Reshape", "Concat", "Slice", "Gather", "Softmax", "MatMul", "Gemm", "Conv",
            "MaxPool", "Cast", "Where", "Expand", "TopK", "Split", "Resize", "If", "Loop", "NonZero"]))


def mutate_delete_node(draw, st, proto):
    node = _pick_node(draw, st, proto)
    if node is not None:
        proto.graph.node.remove(node)


def mutate_duplicate_node(draw, st, proto):
    node = _pick_node(draw, st, proto)
    if node is not None:
        proto.graph.node.append(node)


def mutate_opset(draw, st, proto):
    version = draw(st.sampled_from([1, 6, 7, 9, 11, 12, 13, 16, 18, 21, 22, 23, 0, -1, 29, 10**9]))
    if draw(st.integers(0, 5)) == 0:
        del proto.opset_import[:]
    elif draw(st.integers(0, 4)) == 0:
        proto.opset_import.add(domain=draw(st.sampled_from(["ai.onnx.ml", "com.microsoft", "x"])), version=version)
    else:
        proto.opset_import[0].version = version


def mutate_input_dims(draw, st, proto):
    values = list(proto.graph.input) + list(proto.graph.output)
    if not values:
        return
    shape = draw(st.sampled_from(values)).type.tensor_type.shape
    if shape.dim and draw(st.booleans()):
        dim = shape.dim[draw(st.integers(0, len(shape.dim) - 1))]
        how = draw(st.integers(0, 2))
        if how == 0:
            dim.dim_value = draw(st.sampled_from([0, -1, 1, 7, 2**40]))
        elif how == 1:
            dim.dim_param = draw(st.sampled_from(["N", "", "M"]))
        else:
            dim.Clear()
    elif draw(st.booleans()):
        shape.dim.add().dim_value = draw(st.integers(1, 3))
    elif shape.dim:
        del shape.dim[-1]


MUTATIONS = {
    "attribute": mutate_attribute, "constant_values": mutate_constant_values,
    "tensor_dims": mutate_tensor_dims, "raw_dims": mutate_raw_dims, "dtype": mutate_dtype,
    "drop_input": mutate_drop_input, "rename": mutate_rename, "op_type": mutate_op_type,
    "delete_node": mutate_delete_node, "duplicate_node": mutate_duplicate_node, "opset": mutate_opset,
    "value_dims": mutate_input_dims,
}


# Errors raised while drawing cases (bugs in the strategies, not in Mithril), for the report.
GENERATION_ERRORS: list[str] = []


def generate_cases(n: int, seed: int, kinds=KINDS, batch: int = 50, backend: str = "numpy") -> list[tuple[str, bytes]]:
    """``n`` cases (kind, serialized model), drawn deterministically from ``seed``, the kinds
    interleaved (valid, field, bytes, valid, ...); ``backend="ggml"`` adds :data:`GGML_OPS`."""
    return list(iter_cases(n, seed, kinds, batch, backend))


def iter_cases(n: int, seed: int, kinds=KINDS, batch: int = 50, backend: str = "numpy"):
    """The same cases as :func:`generate_cases`, drawn batch by batch (no list of them all)."""
    import warnings

    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    strategies = _strategies({**OPS, **GGML_OPS} if backend == "ggml" else OPS)
    made = 0
    round_ = 0
    while made < n:
        for kind in kinds:
            want = min(batch, n - made)
            if want <= 0:
                break
            drawn: list[bytes] = []

            @hypothesis_seed(seed * 7919 + round_ * 31 + KINDS.index(kind))
            @settings(max_examples=want, database=None, deadline=None, phases=[Phase.generate],
                      suppress_health_check=list(HealthCheck), derandomize=False)
            @given(strategies[kind])
            def collect(data):
                if len(drawn) < want:
                    drawn.append(data)

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    collect()
                except Exception as exc:  # noqa: BLE001 - a generator bug must not end a long run
                    GENERATION_ERRORS.append(f"{kind} round {round_}: {type(exc).__name__}: {exc}"[:300])
            for data in drawn:
                yield kind, data
            made += len(drawn)
        round_ += 1


# -- running one case -----------------------------------------------------------------------------
def _signature(exc: BaseException) -> str:
    """Where an exception comes from: its type and the innermost frame in Mithril's code."""
    frames = traceback.extract_tb(exc.__traceback__)
    site = next((f for f in reversed(frames) if "mithril" in f.filename and "testing" not in f.filename), None)
    if site is None and frames:
        site = frames[-1]
    if site is not None and site.filename.startswith("<mithril-"):  # a generated program: one name for all
        where = f"generated program, line {site.lineno}: {(site.line or '').strip()[:80]}"
    else:
        where = f"{Path(site.filename).name}:{site.lineno} ({site.name})" if site else "?"
    return f"{type(exc).__name__} at {where}"


def _backend(name: str):
    import mithril as ml

    if name == "ggml":
        return ml.GGMLBackend(num_threads=1)  # one thread per worker: the pool's workers are the parallelism
    return ml.NumpyBackend()


# A GGML fallback warning's reason when the backstop (mithril.backends.ggml.guard), not a rule's
# check, moved a node to NumPy: the check it reveals missing.
BACKSTOP = "ggml would abort on"


def run_case(data: bytes, phase=None, compare: bool = True, backend: str = "numpy") -> dict:
    """Load, compile and evaluate one model on ``backend`` (``"numpy"``, ``"ggml"``); compare with
    onnxruntime when both run it. ``phase``, a shared int, says whether Mithril (1) or
    onnxruntime (2) is running, so a crash or hang can be blamed on the right one. On GGML a node
    the backstop moved to NumPy is reported as ``backstop`` (the warning's text)."""
    import warnings

    import mithril as ml
    from mithril.validate import compare as compare_output, random_inputs

    if phase is not None:
        phase.value = 1
    inputs = None
    backstop = None
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = ml.load_onnx(data)
            shapes = _drawn_shapes(model)
            _check_input_sizes(model, shapes)
            inputs = random_inputs(model, shapes, seed=0)
            runner = _backend(backend)
            pm = ml.compile(model, runner, shapes={k: v.shape for k, v in inputs.items()})
            out = pm.evaluate(None, inputs)
            got = {k: np.asarray(runner.to_numpy(v)) for k, v in out.items()}
        backstop = next((str(w.message) for w in caught if BACKSTOP in str(w.message)), None)
    except MithrilError as exc:
        cause = _internal_cause(exc)
        if cause is not None:  # an internal failure the public boundary wrapped: still a bug
            return {"outcome": "exception", "signature": f"{type(exc).__name__} wrapping {_signature(cause)}",
                    "message": str(exc)[:500],
                    "traceback": "".join(traceback.format_exception(cause))[-3000:]}
        result = {"outcome": "refused", "error": type(exc).__name__, "message": str(exc)[:300]}
        if compare and inputs is not None:
            # Refused after loading: does onnxruntime run it? (Mithril refusing what the
            # reference runs is a gap to look at, though not a crash-class bug.)
            ref = _run_reference(data, inputs, phase, after_refusal=True)
            if isinstance(ref, dict):
                op = getattr(exc, "op_type", None)
                result["reference_ran"] = f"{type(exc).__name__}{f' ({op})' if op else ''}"
        return result
    except Exception as exc:  # noqa: BLE001 - every other exception is what the fuzzer hunts
        return {"outcome": "exception", "signature": _signature(exc), "message": f"{type(exc).__name__}: {exc}"[:500],
                "traceback": traceback.format_exc()[-3000:]}
    result = {"outcome": "ok", "compared": False}
    if backstop is not None:  # the reason (op and ggml function), and the warning from its first such node on
        start = backstop.rfind("), ", 0, backstop.index(BACKSTOP)) + 1
        result["backstop"] = _backstop_reason(backstop)
        result["backstop_text"] = backstop[start:start + 500].lstrip(", ")
    if not compare:
        return result
    if _has_nonfinite_constants(model):
        # NaN/inf constants (Clip's min = NaN) have no defined result to compare.
        result["not_compared"] = "non-finite constants"
        return result
    ref = _run_reference(data, inputs, phase)
    if not isinstance(ref, dict):
        result["reference_refused"] = ref
        return result
    result["compared"] = True
    bad = []
    nonfinite = []
    for name, r in ref.items():
        if name not in got:
            continue
        if np.size(r) > COMPARE_LIMIT:  # comparing copies it to float64: bounded by the worker's memory
            result["not_compared"] = "outputs too large to compare"
            continue
        try:
            rep = compare_output(name, "numpy", got[name], r)
        except MemoryError:  # the comparison's float64 copies outgrew the worker's address-space cap
            result["not_compared"] = "outputs too large to compare"
            continue
        if not rep.passed and _only_nonfinite_differ(got[name], r):
            nonfinite.append(name)
        elif not rep.passed:
            bad.append(f"{name}: got {rep.dtype}{list(rep.shape)} vs onnxruntime {np.asarray(r).dtype}"
                       f"{list(np.shape(r))}, max abs err {rep.max_abs_err:.3g} {rep.note}")
    if nonfinite and not bad:
        # inf/NaN propagation differs between correct implementations (onnxruntime's float16
        # AveragePool turns an inf in a window into a finite value; ReduceMean of an empty
        # set is NaN in the ONNX reference and Mithril, 0 in onnxruntime): counted, not a bug.
        result["not_compared"] = "differences only where a value is inf or NaN"
        return result
    if bad:
        # Which node diverges first, and does it alone (fed onnxruntime's inputs) diverge? If it
        # agrees alone, float rounding upstream was amplified by a discrete op (ArgMin on a
        # near-tie, Floor): not a kernel bug.
        if phase is not None:
            phase.value = 2  # the per-node check runs onnxruntime too
        where = _first_divergence(model, inputs, backend)
        if phase is not None:
            phase.value = 1
        if where is not None and not where.local_error:
            result["not_compared"] = "rounding drift amplified by a discrete op (each node agrees alone)"
            return result
        ops = sorted({n.op_type for n in _node_protos(data)})
        site = f"{where.op_type} (node {where.node!r})" if where is not None else f"graph of {'+'.join(ops)[:120]}"
        return {"outcome": "mismatch", "signature": f"mismatch at {where.op_type if where else '+'.join(ops)[:120]}",
                "message": f"first divergent: {site}; " + "; ".join(bad)[:500]}
    return result


def _first_divergence(model, inputs, backend: str = "numpy"):
    import warnings

    from mithril.validate import first_divergent_node

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return first_divergent_node(model, _backend(backend), inputs)
    except Exception:  # noqa: BLE001 - the per-node check is best effort
        return None


class InputTooLargeForFuzzing(MithrilError):
    """The harness declines to make random data for an input declared absurdly large (its
    model is not wrong, the case just cannot run here); counted as a refusal."""


def _check_input_sizes(model, shapes, limit: int = 1 << 24) -> None:
    inits = model.graph.initializers
    for v in model.graph.inputs:
        if v.name in inits or v.name in shapes or v.shape is None:
            continue
        dims = [d if isinstance(d, int) and d > 0 else 1 for d in v.shape]
        if math.prod(dims) > limit:
            raise InputTooLargeForFuzzing(f"input {v.name!r} is declared {list(v.shape)}: too large for random data")


def _internal_cause(exc: MithrilError) -> BaseException | None:
    """The non-Mithril exception behind a MithrilError raised by the public-API boundary
    (``errors.public_api``: CompileError, PassError, EvaluationError, 'load_onnx failed: ...'),
    which is a bug in Mithril rather than a refusal. A KernelError (a kernel refusing its inputs)
    or an error Mithril raised on purpose is not."""
    from mithril import errors

    cause = exc.__cause__
    if cause is None or isinstance(cause, MithrilError) or isinstance(exc, errors.KernelError):
        return None
    if isinstance(cause, MemoryError):  # a model needing more memory than the worker's limit: refused
        return None
    boundary = tuple(getattr(errors, n) for n in ("CompileError", "EvaluationError") if hasattr(errors, n))
    if isinstance(exc, boundary) or str(exc).startswith("load_onnx failed:"):
        return cause
    return None


def _only_nonfinite_differ(got, ref) -> bool:
    """Same shape and dtype, and every element outside tolerance is inf or NaN on one side."""
    from mithril.validate import tolerance_for

    got, ref = np.asarray(got), np.asarray(ref)
    if got.shape != ref.shape or got.dtype != ref.dtype or got.dtype.kind not in "fc":
        return False
    g, r = got.astype(np.float64), ref.astype(np.float64)
    rtol, atol = tolerance_for(ref.dtype)
    with np.errstate(all="ignore"):
        close = np.isclose(g, r, rtol=rtol, atol=atol, equal_nan=True)
    return bool(np.all(close | ~np.isfinite(g) | ~np.isfinite(r)))


def _has_nonfinite_constants(model) -> bool:
    for v in model.graph.initializers.values():
        if v.const_value is None:
            continue
        arr = v.const_value.numpy()
        if arr.dtype.kind == "f" and arr.size and not np.all(np.isfinite(arr)):
            return True
    for node in model.graph.all_nodes():
        attr = node.attributes.get("value")
        if node.op_type == "Constant" and attr is not None and attr.type == attr.type.TENSOR:
            arr = attr.value.numpy()
            if arr.dtype.kind == "f" and arr.size and not np.all(np.isfinite(arr)):
                return True
    return False


def _run_reference(data: bytes, inputs: dict, phase, after_refusal: bool = False) -> dict | str:
    """onnxruntime's outputs by name, or the name of the exception it raised. ``phase`` tells the
    watchdog that onnxruntime runs, after Mithril ran the model (2) or refused it (3)."""
    if phase is not None:
        phase.value = 3 if after_refusal else 2
    try:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 4
        sess = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        return dict(zip(names, sess.run(None, inputs)))
    except Exception as exc:  # noqa: BLE001 - onnxruntime refusing the model
        return type(exc).__name__
    finally:
        if phase is not None:
            phase.value = 1


def _drawn_shapes(model) -> dict[str, list[int]]:
    shapes = {}
    for key, value in model.ir.metadata_props.items():
        if isinstance(key, str) and isinstance(value, str) and key.startswith(SHAPE_KEY):
            try:
                shapes[key[len(SHAPE_KEY):]] = [min(int(d), 64) for d in value.split(",") if d]
            except ValueError:
                pass
    names = set(model.input_names)
    return {k: v for k, v in shapes.items() if k in names}


def _node_protos(data: bytes):
    import onnx

    return onnx.ModelProto.FromString(data).graph.node


# -- the worker pool ------------------------------------------------------------------------------
# Payloads with which the tests check the watchdog: a worker given one hangs, or aborts.
SELF_TEST_HANG = b"\0mithril-fuzz-self-test:hang"
SELF_TEST_CRASH = b"\0mithril-fuzz-self-test:crash"

def _worker_main(conn, phase, log_path: str, memory_limit: int | None):
    """A long-lived worker: reads (index, data, compare) from ``conn``, answers run_case's result."""
    import faulthandler
    import resource
    import sys

    log = open(log_path, "a", buffering=1)
    os.dup2(log.fileno(), 2)  # native crash reports and stray output land in the log
    sys.stderr = log
    faulthandler.enable(log)
    if memory_limit:
        resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    import mithril  # noqa: F401  (imported once, before the first case)

    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        index, data, compare, backend = msg
        print(f"case {index}", file=log)
        if data == SELF_TEST_HANG:
            phase.value = 1
            while True:
                time.sleep(1)
        if data == SELF_TEST_CRASH:
            phase.value = 1
            os.abort()
        try:
            result = run_case(data, phase, compare, backend)
        except BaseException as exc:  # noqa: BLE001 - e.g. MemoryError inside the comparison
            result = {"outcome": "exception", "signature": _signature(exc), "message": repr(exc)[:500]}
        conn.send((index, result))


@dataclass
class BugRecord:
    outcome: str
    signature: str
    count: int = 0
    example: str = ""
    message: str = ""
    kind: str = ""


@dataclass
class FuzzStats:
    seed: int
    workers: int
    backend: str = "numpy"
    started: float = field(default_factory=time.time)
    elapsed: float = 0.0
    cases: int = 0
    outcomes: Counter = field(default_factory=Counter)
    by_kind: dict = field(default_factory=dict)
    compared: int = 0
    reference_refused: int = 0
    reference_crash: int = 0
    reference_hang: int = 0
    restarts: int = 0
    bugs: dict = field(default_factory=dict)
    refusals: Counter = field(default_factory=Counter)
    not_compared: Counter = field(default_factory=Counter)
    # Refusals of models onnxruntime ran, by error class and op: gaps to look at.
    refused_reference_ran: Counter = field(default_factory=Counter)
    # GGML: nodes the backstop moved to NumPy (a rule's check let them through), by reason, and
    # for each reason the first case's warning and model file.
    backstops: Counter = field(default_factory=Counter)
    backstop_examples: dict = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.cases / self.elapsed if self.elapsed else 0.0

    def bug_count(self) -> int:
        return sum(self.outcomes[o] for o in BUG_OUTCOMES)

    @property
    def aborts(self) -> int:
        """Cases whose worker died (a signal: ggml's GGML_ASSERT is SIGABRT) while Mithril ran."""
        return self.outcomes["crash"]


class _Worker:
    def __init__(self, ctx, log_dir: Path, slot: int, memory_limit):
        self.phase = ctx.Value("i", 0, lock=False)
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, daemon=True,
                                args=(child, self.phase, str(log_dir / f"worker{slot}.log"), memory_limit))
        self.proc.start()
        child.close()
        self.case = None  # (index, kind, data, started)

    def stop(self, kill: bool = False):
        if kill:
            self.proc.kill()
        else:
            try:
                self.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self.conn.close()


def run_fuzz(cases: int, seed: int = 0, workers: int = 1, time_limit: float = 10.0, kinds=KINDS,
             failure_dir: str | os.PathLike | None = None, progress=None, progress_every: float = 30.0,
             compare: bool = True, memory_limit: int | None = 3 << 30, source=None,
             backend: str = "numpy") -> FuzzStats:
    """Run ``cases`` generated cases on a pool of ``workers`` processes; return the counts.
    ``backend``: ``"numpy"`` or ``"ggml"`` (see the module docstring).

    A case running longer than ``time_limit`` seconds is a hang: its worker is killed and
    replaced. A worker that dies is a crash, and is replaced. ``failure_dir`` receives the model
    of the first case of each bug signature (``<outcome>-<hash>.onnx``) and the workers' logs.
    ``progress(stats)`` is called every ``progress_every`` seconds (and at the end). ``source``,
    an iterable of (kind, serialized model), replaces the generated cases.
    """
    failure_dir = Path(failure_dir or f"/tmp/mithril-fuzz-{seed}")
    failure_dir.mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("spawn")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, not {backend!r}")
    stats = FuzzStats(seed=seed, workers=workers, backend=backend)
    for kind in KINDS:
        stats.by_kind[kind] = Counter()
    pool = [_Worker(ctx, failure_dir, i, memory_limit) for i in range(workers)]
    source = iter(source) if source is not None else iter_cases(cases, seed, kinds, backend=backend)
    exhausted = False
    last_progress = time.time()
    index = 0

    def record(kind: str, data: bytes, result: dict):
        outcome = result["outcome"]
        stats.cases += 1
        stats.outcomes[outcome] += 1
        stats.by_kind[kind][outcome] += 1
        if result.get("compared"):
            stats.compared += 1
        if "reference_refused" in result:
            stats.reference_refused += 1
        if "not_compared" in result:
            stats.not_compared[result["not_compared"]] += 1
        if "backstop" in result:
            reason = result["backstop"]
            stats.backstops[reason] += 1
            if reason not in stats.backstop_examples:
                example = failure_dir / f"backstop-{hashlib.sha1(reason.encode()).hexdigest()[:10]}.onnx"
                example.write_bytes(data)
                stats.backstop_examples[reason] = (result.get("backstop_text", ""), str(example))
        if outcome == "refused":
            stats.refusals[result["error"]] += 1
            if "reference_ran" in result:
                stats.refused_reference_ran[result["reference_ran"]] += 1
        if outcome in BUG_OUTCOMES:
            sig = result.get("signature", outcome)
            bug = stats.bugs.get((outcome, sig))
            if bug is None:
                digest = hashlib.sha1(f"{outcome}{sig}".encode()).hexdigest()[:10]
                example = failure_dir / f"{outcome}-{digest}.onnx"
                example.write_bytes(data)
                if result.get("traceback"):
                    example.with_suffix(".txt").write_text(result["traceback"])
                bug = stats.bugs[(outcome, sig)] = BugRecord(outcome, sig, 0, str(example), result.get("message", ""), kind)
            bug.count += 1

    try:
        while True:
            for w in pool:
                if w.case is None and not exhausted:
                    nxt = next(source, None)
                    if nxt is None:
                        exhausted = True
                        break
                    kind, data = nxt
                    w.case = (index, kind, data, time.time())
                    w.conn.send((index, data, compare, backend))
                    index += 1
            busy = [w for w in pool if w.case is not None]
            if not busy:
                break
            ready = wait_connections([w.conn for w in busy] + [w.proc.sentinel for w in busy], timeout=0.5)
            now = time.time()
            for i, w in enumerate(pool):
                if w.case is None:
                    continue
                idx, kind, data, started = w.case
                result = None
                if w.conn in ready:
                    try:
                        _, result = w.conn.recv()
                    except (EOFError, OSError):
                        result = None
                if result is None and (w.proc.sentinel in ready or not w.proc.is_alive()):
                    w.proc.join(5)
                    code = w.proc.exitcode
                    if w.phase.value in (2, 3):
                        stats.reference_crash += 1
                        result = _reference_failed(w.phase.value, "crash")
                    else:
                        result = {"outcome": "crash", "signature": f"worker died (exit code {code})",
                                  "message": _log_tail(failure_dir / f"worker{i}.log")}
                elif result is None and now - started > time_limit:
                    if w.phase.value in (2, 3):
                        stats.reference_hang += 1
                        result = _reference_failed(w.phase.value, "hang")
                    else:
                        result = {"outcome": "hang", "signature": f"no answer after {time_limit:g} s",
                                  "message": ""}
                    w.stop(kill=True)
                if result is None:
                    continue
                record(kind, data, result)
                w.case = None
                if not w.proc.is_alive():
                    stats.restarts += 1
                    w.conn.close()
                    pool[i] = _Worker(ctx, failure_dir, i, memory_limit)
            stats.elapsed = time.time() - stats.started
            if progress is not None and time.time() - last_progress >= progress_every:
                last_progress = time.time()
                progress(stats)
    finally:
        for w in pool:
            w.stop(kill=w.case is not None)
    stats.elapsed = time.time() - stats.started
    if progress is not None:
        progress(stats)
    return stats


def _backstop_reason(text: str) -> str:
    """A backstop's fallback warning as ``op: what`` (the ggml function, or ``result shape`` where
    the rule built another shape than the plan's: a file declaring shapes its nodes do not make),
    shapes and names dropped; several nodes joined."""
    import re

    found = set()
    pattern = r"\((\w+): ggml would abort on (ggml_\w+|a \[[^\]]*\] result|[A-Za-z_ ]+ \(\w+\)|[^:,)]+)"
    for op, what in re.findall(pattern, text):
        found.add(f"{op}: {'result shape' if what.endswith('] result') else what}")
    return ", ".join(sorted(found)) or text[:120]


def _reference_failed(phase: int, how: str) -> dict:
    """The outcome of a case whose onnxruntime run crashed or hung: Mithril's, known from the phase."""
    if phase == 2:
        return {"outcome": "ok", "compared": False, "reference_refused": how}
    return {"outcome": "refused", "error": f"(refused; onnxruntime then {how}ed)", "message": ""}


def _log_tail(path: Path, limit: int = 1500) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-limit:]
