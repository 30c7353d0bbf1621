"""onnxruntime's quantized dialect (com.microsoft) on every backend, against onnxruntime itself.

(a) One small hand-made graph per op, covering attributes and optional inputs: zero points absent
and present, per-channel scales, signed and unsigned types.

(b) Models written by onnxruntime's own tools inside the test: ``quantize_dynamic`` and
``quantize_static`` (QOperator; QDQ; QDQ with int16 activations or int4 weights, which write
com.microsoft Q/DQ; a two-batch calibration reader) on two small torch CNNs (the second with the ops
kept in 8 bits: Pad, Split, Resize, Transpose, Reshape, ArgMax), an LSTM and a GRU, and a two-layer
BERT (hidden 32) before and after ``onnxruntime.transformers.optimizer.optimize_model``; and the
files onnxruntime's session optimizer writes from dynamically quantized ones. Each file is first
checked for the quantized ops the tool is expected to write, so a change in the tool fails here
rather than passing vacuously.

Int8 weights of u8 x s8 products are drawn in 7 bits, and the tools write them so (``reduce_range``):
onnxruntime on x86 without VNNI saturates each pair of such products to int16, so full-range weights
are checked against exact int64 arithmetic instead (test_full_range_int8_weights_match_exact_arithmetic).

Tolerances. Integer outputs of single ops compare exactly: the kernels reproduce onnxruntime's
rounding (half to even) and saturation. Float outputs of single ops (dequantized products, LSTM,
attention, layer norm) allow 1e-5 relative + 1e-5 absolute: only float32 summation order differs.
Whole quantized models get a quantization-aware bound instead: a float difference of one ulp in an
intermediate value (onnxruntime's polynomial sigmoid/tanh, its summation order) can move a value
across a rounding boundary, which then shows as one quantization step downstream. So every output
element must be within 1% of the output's largest magnitude of onnxruntime (two to three 8-bit
steps). Files with the quantized ops themselves (QOperator, dynamic, onnxruntime-fused) must also
agree to float32 precision in at least 95% of elements, which fails a kernel that is wrong rather
than unlucky; measured, they agree everywhere (largest difference 3e-7 of the output's range). QDQ
files are compared with onnxruntime running the graph as written (no QDQ fusion) and held to the
bound alone: their float ops between Q/DQ pairs are the standard kernels, whose results can differ
from onnxruntime's by an ulp (AveragePool's window sum, bilinear Resize), which the next
QuantizeLinear turns into a step (6 of 32 CNN outputs).
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mithril as ml
from mithril.backends.table import BACKENDS as TABLE
from mithril.compile import JitFallbackWarning

ort = pytest.importorskip("onnxruntime")

MS = "com.microsoft"
BACKENDS = [name for name, entry in TABLE.items() if entry.installed()]
U8, I8, U16, I16, I32, F32 = (TensorProto.UINT8, TensorProto.INT8, TensorProto.UINT16, TensorProto.INT16,
                              TensorProto.INT32, TensorProto.FLOAT)
_NP = {U8: np.uint8, I8: np.int8, U16: np.uint16, I16: np.int16, I32: np.int32, F32: np.float32,
       TensorProto.BOOL: np.bool_, TensorProto.INT64: np.int64}


def _model(nodes, inputs, outputs, inits=None, opset=17):
    """inputs/outputs: (name, elem_type, shape); every node in com.microsoft unless it says otherwise."""
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)],
                             ir_version=10)


def _node(op, inputs, outputs, **attrs):
    return helper.make_node(op, inputs, outputs, name=f"{op.lower()}_node", domain=MS, **attrs)


def _rand_q(rng, shape, dtype, seven_bit=False):
    # seven_bit (s8 weights of u8 x s8 products): onnxruntime on x86 without VNNI saturates product pairs to int16.
    low, high = (-64, 63) if seven_bit else (np.iinfo(dtype).min, int(np.iinfo(dtype).max))
    return rng.integers(low, high + 1, shape).astype(dtype)


def _s(v):
    return np.float32(v)


# -- (a) one graph per op ------------------------------------------------------------------------
def quantize_cases():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((2, 3, 4)) * 3).astype(np.float32)
    # Values on the rounding midpoints check round-half-to-even.
    x[0, 0, :] = np.array([0.25, 0.75, -0.25, -0.75], np.float32)
    cases = {}
    cases["QuantizeLinear-u8"] = (
        _model([_node("QuantizeLinear", ["x", "s", "z"], ["y"])], [("x", F32, x.shape)], [("y", U8, x.shape)],
               {"s": _s(0.5), "z": np.uint8(128)}), {"x": x})
    cases["QuantizeLinear-int16-axis"] = (
        _model([_node("QuantizeLinear", ["x", "s", "z"], ["y"], axis=1)], [("x", F32, x.shape)],
               [("y", I16, x.shape)],
               {"s": np.array([1e-3, 2e-4, 0.5], np.float32), "z": np.array([-5, 0, 7], np.int16)}), {"x": x})
    cases["QuantizeLinear-uint16"] = (
        _model([_node("QuantizeLinear", ["x", "s", "z"], ["y"])], [("x", F32, x.shape)], [("y", U16, x.shape)],
               {"s": _s(1e-4), "z": np.uint16(30000)}), {"x": x})
    cases["QuantizeLinear-no-zero-point"] = (
        _model([_node("QuantizeLinear", ["x", "s"], ["y"])], [("x", F32, x.shape)], [("y", U8, x.shape)],
               {"s": _s(0.05)}), {"x": x})
    # Every value on a rounding midpoint: the division must be the one correctly rounded float32
    # division onnxruntime does (XLA's reciprocal rewrite moved a third of these on JAX).
    mid = ((rng.integers(-100, 100, 2000) + 0.5) * np.float32(0.03)).astype(np.float32)
    for domain in ("", MS):
        cases[f"QuantizeLinear-midpoints-{domain or 'onnx'}"] = (
            _model([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], domain=domain)],
                   [("x", F32, mid.shape)], [("y", U8, mid.shape)], {"s": _s(0.03), "z": np.uint8(128)}),
            {"x": mid})
    cases["DynamicQuantizeLinear-midpoints"] = (
        _model([helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])], [("x", F32, mid.shape)],
               [("y", U8, mid.shape), ("s", F32, []), ("z", U8, [])]), {"x": mid})
    q16 = _rand_q(rng, (3, 2, 4), np.int16)
    cases["DequantizeLinear-int16-axis0"] = (
        _model([_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=0)], [("q", I16, q16.shape)],
               [("y", F32, q16.shape)],
               {"s": np.array([1e-3, 2e-2, 0.5], np.float32), "z": np.array([3, -2, 0], np.int16)}), {"q": q16})
    qu16 = _rand_q(rng, (2, 5), np.uint16)
    cases["DequantizeLinear-uint16"] = (
        _model([_node("DequantizeLinear", ["q", "s", "z"], ["y"])], [("q", U16, qu16.shape)],
               [("y", F32, qu16.shape)], {"s": _s(1e-3), "z": np.uint16(32768)}), {"q": qu16})
    q32 = rng.integers(-(2**20), 2**20, (2, 5)).astype(np.int32)
    cases["DequantizeLinear-int32-no-zero-point"] = (
        _model([_node("DequantizeLinear", ["q", "s"], ["y"])], [("q", I32, q32.shape)],
               [("y", F32, q32.shape)], {"s": _s(1e-3)}), {"q": q32})
    return cases


def _binary_cases(op):
    rng = np.random.default_rng(1)
    cases = {}
    a, b = _rand_q(rng, (2, 3, 4), np.uint8), _rand_q(rng, (4,), np.uint8)
    cases[f"{op}-u8-broadcast"] = (
        _model([_node(op, ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], ["c"])],
               [("a", U8, a.shape), ("b", U8, b.shape)], [("c", U8, a.shape)],
               {"sa": _s(0.02), "za": np.uint8(120), "sb": _s(0.03), "zb": np.uint8(130), "sc": _s(0.04),
                "zc": np.uint8(125)}), {"a": a, "b": b})
    a, b = _rand_q(rng, (3, 5), np.int8), _rand_q(rng, (3, 5), np.int8)
    # Enough values that a different rounding order shows (a QLinearMul rounding before adding the
    # zero point missed 25 of 20000).
    big_a, big_b = _rand_q(rng, (50, 400), np.uint8), _rand_q(rng, (50, 400), np.uint8)
    cases[f"{op}-u8-large"] = (
        _model([_node(op, ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], ["c"])],
               [("a", U8, big_a.shape), ("b", U8, big_b.shape)], [("c", U8, big_a.shape)],
               {"sa": _s(0.1), "za": np.uint8(120), "sb": _s(0.07), "zb": np.uint8(130),
                "sc": _s(0.05 if op == "QLinearAdd" else 0.5), "zc": np.uint8(125)}), {"a": big_a, "b": big_b})
    # onnxruntime's type inference rejects absent zero points here, so the int8 case gives them.
    cases[f"{op}-i8"] = (
        _model([_node(op, ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], ["c"])],
               [("a", I8, a.shape), ("b", I8, b.shape)], [("c", I8, a.shape)],
               {"sa": _s(0.05), "za": np.int8(-2), "sb": _s(0.07), "zb": np.int8(3),
                "sc": _s(0.09 if op == "QLinearAdd" else 0.2), "zc": np.int8(-1)}), {"a": a, "b": b})
    return cases


def _unary_cases(op, **attrs):
    rng = np.random.default_rng(2)
    x8 = np.arange(256, dtype=np.uint8).reshape(4, 64)
    xi8 = _rand_q(rng, (3, 7), np.int8)
    return {
        f"{op}-u8-every-value": (
            _model([_node(op, ["x", "sx", "zx", "sy", "zy"], ["y"], **attrs)], [("x", U8, x8.shape)],
                   [("y", U8, x8.shape)], {"sx": _s(0.05), "zx": np.uint8(128), "sy": _s(1 / 256),
                                           "zy": np.uint8(0 if op == "QLinearSigmoid" else 100)}), {"x": x8}),
        f"{op}-i8": (
            _model([_node(op, ["x", "sx", "zx", "sy", "zy"], ["y"], **attrs)], [("x", I8, xi8.shape)],
                   [("y", I8, xi8.shape)], {"sx": _s(0.1), "zx": np.int8(-3), "sy": _s(0.02), "zy": np.int8(4)}),
            {"x": xi8}),
    }


def pool_cases():
    rng = np.random.default_rng(3)
    x = _rand_q(rng, (2, 3, 7, 6), np.uint8)
    inits = {"sx": _s(0.1), "zx": np.uint8(100), "sy": _s(0.08), "zy": np.uint8(110)}
    cases = {}
    for include in (0, 1):
        cases[f"QLinearAveragePool-pads-count_include_pad={include}"] = (
            _model([_node("QLinearAveragePool", ["x", "sx", "zx", "sy", "zy"], ["y"], kernel_shape=[3, 3],
                          strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=include)],
                   [("x", U8, x.shape)], [("y", U8, [2, 3, 4, 3])], inits), {"x": x})
    xi = _rand_q(rng, (1, 5, 4, 3), np.int8)
    cases["QLinearAveragePool-i8"] = (
        _model([_node("QLinearAveragePool", ["x", "sx", "zx", "sy", "zy"], ["y"], kernel_shape=[2, 2])],
               [("x", I8, xi.shape)], [("y", I8, [1, 5, 3, 2])],
               {"sx": _s(0.1), "zx": np.int8(3), "sy": _s(0.05), "zy": np.int8(-7)}), {"x": xi})
    xc, w = _rand_q(rng, (1, 5, 5, 4), np.uint8), _rand_q(rng, (6, 2, 3, 3), np.int8, seven_bit=True)
    cases["QLinearConv-channels_last-grouped-per-channel"] = (
        _model([_node("QLinearConv", ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy", "b"], ["y"], channels_last=1,
                      pads=[1, 1, 1, 1], kernel_shape=[3, 3], group=2)],
               [("x", U8, xc.shape)], [("y", U8, [1, 5, 5, 6])],
               {"sx": _s(0.02), "zx": np.uint8(128), "w": w, "sw": rng.uniform(0.005, 0.02, 6).astype(np.float32),
                "zw": np.zeros(6, np.int8), "sy": _s(0.1), "zy": np.uint8(120),
                "b": rng.integers(-500, 500, 6).astype(np.int32)}), {"x": xc})
    cases["QLinearAveragePool-channels_last"] = (
        _model([_node("QLinearAveragePool", ["x", "sx", "zx", "sy", "zy"], ["y"], kernel_shape=[2, 2],
                      strides=[2, 2], channels_last=1)],
               [("x", U8, [2, 6, 4, 3])], [("y", U8, [2, 3, 2, 3])], inits),
        {"x": _rand_q(rng, (2, 6, 4, 3), np.uint8)})
    for last in (0, 1):
        cases[f"QLinearGlobalAveragePool-channels_last={last}"] = (
            _model([_node("QLinearGlobalAveragePool", ["x", "sx", "zx", "sy", "zy"], ["y"], channels_last=last)],
                   [("x", U8, x.shape)], [("y", U8, [2, 1, 1, 6] if last else [2, 3, 1, 1])], inits), {"x": x})
    xi = _rand_q(rng, (2, 4, 5, 5), np.int8)
    cases["QLinearGlobalAveragePool-i8"] = (
        _model([_node("QLinearGlobalAveragePool", ["x", "sx", "zx", "sy", "zy"], ["y"])],
               [("x", I8, xi.shape)], [("y", I8, [2, 4, 1, 1])],
               {"sx": _s(0.1), "zx": np.int8(-3), "sy": _s(0.03), "zy": np.int8(5)}), {"x": xi})
    return cases


def misc_cases():
    rng = np.random.default_rng(4)
    cases = {}
    a, b, c = _rand_q(rng, (2, 3, 4), np.uint8), _rand_q(rng, (2, 2, 4), np.uint8), _rand_q(rng, (2, 1, 4), np.uint8)
    cases["QLinearConcat-requantized"] = (
        _model([_node("QLinearConcat", ["sy", "zy", "a", "sa", "za", "b", "sb", "zb", "c", "sy", "zy"], ["y"],
                      axis=1)],
               [("a", U8, a.shape), ("b", U8, b.shape), ("c", U8, c.shape)], [("y", U8, [2, 6, 4])],
               {"sy": _s(0.05), "zy": np.uint8(128), "sa": _s(0.02), "za": np.uint8(10), "sb": _s(0.1),
                "zb": np.uint8(200)}), {"a": a, "b": b, "c": c})
    for dtype, t, zy in ((np.uint8, U8, np.uint8(0)), (np.int8, I8, np.int8(-128))):
        x = _rand_q(rng, (2, 3, 10), dtype)
        x[0, 0] = x[0, 0].max()  # a uniform row
        cases[f"QLinearSoftmax-{dtype.__name__}"] = (
            _model([_node("QLinearSoftmax", ["x", "sx", "zx", "sy", "zy"], ["y"], opset=13, axis=-1)],
                   [("x", t, x.shape)], [("y", t, x.shape)],
                   {"sx": _s(0.04), "zx": dtype(3), "sy": _s(1 / 256), "zy": zy}), {"x": x})
    x = _rand_q(rng, (2, 3, 4), np.uint8)
    cases["QLinearSoftmax-opset12-axis1"] = (
        _model([_node("QLinearSoftmax", ["x", "sx", "zx", "sy", "zy"], ["y"], opset=12, axis=1)],
               [("x", U8, x.shape)], [("y", U8, x.shape)],
               {"sx": _s(0.02), "zx": np.uint8(0), "sy": _s(1 / 256), "zy": np.uint8(0)}), {"x": x})
    cases["QLinearSoftmax-opset13-axis1"] = (
        _model([_node("QLinearSoftmax", ["x", "sx", "zx", "sy", "zy"], ["y"], opset=13, axis=1)],
               [("x", U8, x.shape)], [("y", U8, x.shape)],
               {"sx": _s(0.1), "zx": np.uint8(0), "sy": _s(1 / 256), "zy": np.uint8(0)}), {"x": x})
    cond = rng.random((2, 3, 4)) > 0.5
    xw, yw = _rand_q(rng, (2, 3, 4), np.int8), _rand_q(rng, (3, 1), np.int8)
    cases["QLinearWhere-broadcast"] = (
        _model([_node("QLinearWhere", ["cond", "x", "sx", "zx", "y", "sy", "zy", "sz", "zz"], ["z"])],
               [("cond", TensorProto.BOOL, cond.shape), ("x", I8, xw.shape), ("y", I8, yw.shape)],
               [("z", I8, [2, 3, 4])],
               {"sx": _s(0.03), "zx": np.int8(2), "sy": _s(0.05), "zy": np.int8(-4), "sz": _s(0.04),
                "zz": np.int8(1)}), {"cond": cond, "x": xw, "y": yw})
    return cases


def matmul_cases():
    rng = np.random.default_rng(5)
    cases = {}
    a, b = _rand_q(rng, (3, 8), np.uint8), _rand_q(rng, (5, 8), np.int8, seven_bit=True)
    c = rng.integers(-2000, 2000, (5,)).astype(np.int32)
    per_col = {"sa": _s(0.02), "za": np.uint8(120), "sb": rng.uniform(0.01, 0.05, 5).astype(np.float32),
               "zb": np.zeros(5, np.int8)}
    cases["QGemm-transB-per-column-bias-quantized"] = (
        _model([_node("QGemm", ["a", "sa", "za", "b", "sb", "zb", "c", "sy", "zy"], ["y"], transB=1, alpha=0.5)],
               [("a", U8, a.shape)], [("y", U8, [3, 5])],
               {**per_col, "b": b, "c": c, "sy": _s(0.05), "zy": np.uint8(128)}), {"a": a})
    cases["QGemm-float-output"] = (
        _model([_node("QGemm", ["a", "sa", "za", "b", "sb", "zb"], ["y"], transA=1)],
               [("a", U8, [8, 3])], [("y", F32, [3, 5])],
               {"sa": _s(0.02), "za": np.uint8(120), "b": np.ascontiguousarray(b.T), "sb": _s(0.03),
                "zb": np.int8(3)}), {"a": np.ascontiguousarray(a.T)})
    a8 = _rand_q(rng, (3, 8), np.int8)
    cases["QGemm-i8"] = (
        _model([_node("QGemm", ["a", "sa", "za", "b", "sb", "zb", "", "sy", "zy"], ["y"])],
               [("a", I8, a8.shape)], [("y", I8, [3, 5])],
               {"sa": _s(0.02), "za": np.int8(-5), "b": np.ascontiguousarray(b.T), "sb": _s(0.03),
                "zb": np.int8(0), "sy": _s(0.3), "zy": np.int8(-10)}), {"a": a8})
    a3 = _rand_q(rng, (2, 3, 8), np.uint8)
    bias = rng.standard_normal(5).astype(np.float32)
    cases["MatMulIntegerToFloat-per-column-bias"] = (
        _model([_node("MatMulIntegerToFloat", ["a", "b", "sa", "sb", "za", "zb", "bias"], ["y"])],
               [("a", U8, a3.shape)], [("y", F32, [2, 3, 5])],
               {"b": np.ascontiguousarray(b.T), "sa": _s(0.02), "sb": per_col["sb"], "za": np.uint8(120),
                "zb": rng.integers(-3, 3, 5).astype(np.int8), "bias": bias}), {"a": a3})
    cases["MatMulIntegerToFloat-no-zero-points"] = (
        _model([_node("MatMulIntegerToFloat", ["a", "b", "sa", "sb"], ["y"])],
               [("a", U8, a3.shape)], [("y", F32, [2, 3, 5])],
               {"b": _rand_q(rng, (8, 5), np.uint8), "sa": _s(0.02), "sb": _s(0.01)}), {"a": a3})
    x = rng.standard_normal((2, 3, 8)).astype(np.float32)
    cases["DynamicQuantizeMatMul-i8-bias"] = (
        _model([_node("DynamicQuantizeMatMul", ["x", "b", "sb", "zb", "bias"], ["y"])],
               [("x", F32, x.shape)], [("y", F32, [2, 3, 5])],
               {"b": np.ascontiguousarray(b.T), "sb": per_col["sb"], "zb": np.zeros(5, np.int8), "bias": bias}),
        {"x": x})
    cases["DynamicQuantizeMatMul-u8-no-zero-point"] = (
        _model([_node("DynamicQuantizeMatMul", ["x", "b", "sb"], ["y"])],
               [("x", F32, x.shape)], [("y", F32, [2, 3, 5])],
               {"b": _rand_q(rng, (8, 5), np.uint8), "sb": _s(0.01)}), {"x": x})
    a16, b16 = _rand_q(rng, (3, 6), np.int16) // 4, _rand_q(rng, (6, 4), np.int16) // 4
    cases["MatMulInteger16"] = (
        _model([_node("MatMulInteger16", ["a", "b"], ["y"])], [("a", I16, a16.shape), ("b", I16, b16.shape)],
               [("y", I32, [3, 4])]), {"a": a16, "b": b16})
    return cases


def lstm_cases():
    rng = np.random.default_rng(6)
    cases = {}
    seq, batch, inp, hidden = 4, 2, 5, 3
    for direction, per_channel in (("forward", False), ("bidirectional", True)):
        d = 2 if direction == "bidirectional" else 1
        scale_shape = (d, 4 * hidden) if per_channel else (d,)
        inits = {
            "W": _rand_q(rng, (d, inp, 4 * hidden), np.int8, seven_bit=True),
            "R": _rand_q(rng, (d, hidden, 4 * hidden), np.int8, seven_bit=True),
            "B": rng.standard_normal((d, 8 * hidden)).astype(np.float32) * 0.1,
            "ws": rng.uniform(0.002, 0.01, scale_shape).astype(np.float32), "wz": np.zeros(scale_shape, np.int8),
            "rs": rng.uniform(0.002, 0.01, scale_shape).astype(np.float32), "rz": np.zeros(scale_shape, np.int8),
        }
        feeds = {"x": rng.standard_normal((seq, batch, inp)).astype(np.float32),
                 "h0": rng.standard_normal((d, batch, hidden)).astype(np.float32) * 0.5,
                 "c0": rng.standard_normal((d, batch, hidden)).astype(np.float32) * 0.5}
        node = _node("DynamicQuantizeLSTM", ["x", "W", "R", "B", "", "h0", "c0", "", "ws", "wz", "rs", "rz"],
                     ["y", "yh", "yc"], hidden_size=hidden, direction=direction)
        cases[f"DynamicQuantizeLSTM-{direction}"] = (
            _model([node], [("x", F32, [seq, batch, inp]), ("h0", F32, [d, batch, hidden]),
                            ("c0", F32, [d, batch, hidden])],
                   [("y", F32, [seq, d, batch, hidden]), ("yh", F32, [d, batch, hidden]),
                    ("yc", F32, [d, batch, hidden])], inits), feeds)
    return cases


def transformer_cases():
    rng = np.random.default_rng(7)
    cases = {}
    batch, seq, hidden, heads = 2, 5, 8, 2
    x = _rand_q(rng, (batch, seq, hidden), np.uint8)
    inits = {"w": _rand_q(rng, (hidden, 3 * hidden), np.int8, seven_bit=True),
             "bias": rng.standard_normal(3 * hidden).astype(np.float32) * 0.1,
             "sx": _s(0.02), "sw": _s(0.01), "zx": np.uint8(128), "zw": np.int8(0)}
    masks = {
        "no-mask": None,
        "mask-index": np.array([3, 5], np.int32),
        "raw-mask": np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int32),
    }
    for name, mask in masks.items():
        for uni in (0, 1):
            if uni and name != "mask-index":
                continue
            ins = ["x", "w", "bias", "sx", "sw", "mask" if mask is not None else "", "zx", "zw"]
            feeds = {"x": x} if mask is None else {"x": x, "mask": mask}
            graph_in = [("x", U8, x.shape)] + ([] if mask is None else [("mask", I32, mask.shape)])
            cases[f"QAttention-{name}-unidirectional={uni}"] = (
                _model([_node("QAttention", ins, ["y"], num_heads=heads, unidirectional=uni)], graph_in,
                       [("y", F32, [batch, seq, hidden])], inits), feeds)
    past = rng.standard_normal((2, batch, heads, 3, hidden // heads)).astype(np.float32)
    cases["QAttention-past-present-unidirectional"] = (
        _model([_node("QAttention", ["x", "w", "bias", "sx", "sw", "", "zx", "zw", "past"], ["y", "present"],
                      num_heads=heads, unidirectional=1)],
               [("x", U8, x.shape), ("past", F32, past.shape)],
               [("y", F32, [batch, seq, hidden]), ("present", F32, [2, batch, heads, seq + 3, hidden // heads])],
               inits), {"x": x, "past": past})
    vocab, positions = 20, 16
    emb = {
        "word": _rand_q(rng, (vocab, hidden), np.uint8), "pos": _rand_q(rng, (positions, hidden), np.uint8),
        "seg": _rand_q(rng, (2, hidden), np.uint8), "gamma": _rand_q(rng, (hidden,), np.uint8),
        "beta": _rand_q(rng, (hidden,), np.uint8),
    }
    scales = {f"{k}_s": _s(v) for k, v in zip(emb, (0.02, 0.01, 0.03, 0.008, 0.004))}
    zps = {f"{k}_z": np.uint8(v) for k, v in zip(emb, (128, 120, 130, 0, 128))}
    ids = rng.integers(0, vocab, (batch, seq)).astype(np.int32)
    seg = rng.integers(0, 2, (batch, seq)).astype(np.int32)
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int32)
    ins = ["ids", "segs", "word", "pos", "seg", "gamma", "beta", "mask"] + list(scales) + list(zps)
    cases["QEmbedLayerNormalization-segments-mask"] = (
        _model([_node("QEmbedLayerNormalization", ins, ["y", "mask_index"], epsilon=1e-5)],
               [("ids", I32, ids.shape), ("segs", I32, seg.shape), ("mask", I32, mask.shape)],
               [("y", F32, [batch, seq, hidden]), ("mask_index", I32, [batch])], {**emb, **scales, **zps}),
        {"ids": ids, "segs": seg, "mask": mask})
    return cases


CASES = {
    **quantize_cases(), **_binary_cases("QLinearAdd"), **_binary_cases("QLinearMul"),
    **_unary_cases("QLinearSigmoid"), **_unary_cases("QLinearLeakyRelu", alpha=0.1), **pool_cases(),
    **misc_cases(), **matmul_cases(), **lstm_cases(), **transformer_cases(),
}  # fmt: skip


def _ort_run(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def _mithril_run(model, feeds, backend_name, constant_keys=None):
    backend = TABLE[backend_name].load()()
    pm = ml.compile(ml.load_onnx(model), backend, shapes={k: list(v.shape) for k, v in feeds.items()},
                    constant_keys=constant_keys)
    out = pm.evaluate(pm.get_parameters(), {k: backend.from_numpy(v) for k, v in feeds.items()})
    return {k: backend.to_numpy(v) for k, v in out.items()}


_reference: dict[str, dict] = {}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(CASES))
def test_op_matches_onnxruntime(case, backend):
    model, feeds = CASES[case]
    if backend == "torch" and "uint16" in case:
        # torch stores uint16 but has no arithmetic for it: the backend refuses such graphs by name.
        with pytest.raises(ml.errors.UnsupportedDTypeError, match="uint16"):
            _mithril_run(model, feeds, backend)
        return
    if case not in _reference:
        _reference[case] = _ort_run(model, feeds)
    want = _reference[case]
    got = _mithril_run(model, feeds, backend)
    for name, ref in want.items():
        out = got[name]
        assert out.dtype == ref.dtype and out.shape == ref.shape, (name, out.dtype, out.shape, ref.dtype, ref.shape)
        if ref.dtype.kind in "iub":
            np.testing.assert_array_equal(out, ref, err_msg=f"{case} {name} on {backend}")
        else:
            np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5, err_msg=f"{case} {name} on {backend}")


@pytest.mark.parametrize("case", list(CASES))
def test_output_shape_rules_match_onnxruntime(case):
    """ONNX shape inference does not know com.microsoft ops; the kernels' rules give their output
    shapes and types (graph outputs declared without a type, so nothing else can)."""
    import onnx_ir as ir

    from mithril.backends.specialize import InferShapes
    from mithril.onnx_bridge.passes import static_shape

    model, feeds = CASES[case]
    stripped = onnx.ModelProto.FromString(model.SerializeToString())
    for out in stripped.graph.output:
        out.ClearField("type")
    loaded = ir.serde.deserialize_model(stripped)
    InferShapes()(loaded)
    if case not in _reference:
        _reference[case] = _ort_run(model, feeds)
    for out in loaded.graph.outputs:
        want = _reference[case][out.name]
        assert static_shape(out) == want.shape, (out.name, out.shape, want.shape)
        assert out.dtype is not None and out.dtype.numpy() == want.dtype, (out.name, out.dtype, want.dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_qlinear_reduce_mean_follows_its_definition(backend):
    """onnxruntime has no CPU kernel for QLinearReduceMean: the reference is its documented
    definition, dequantize -> ReduceMean in float32 -> quantize."""
    rng = np.random.default_rng(8)
    x = _rand_q(rng, (2, 3, 5), np.int8)
    model = _model([_node("QLinearReduceMean", ["x", "s", "z", "sy", "zy"], ["y"], axes=[0, 2], keepdims=0)],
                   [("x", I8, x.shape)], [("y", I8, [3])],
                   {"s": _s(0.1), "z": np.int8(-4), "sy": _s(0.03), "zy": np.int8(2)})
    mean = ((x.astype(np.int32) + 4).astype(np.float32) * np.float32(0.1)).mean(axis=(0, 2), dtype=np.float32)
    want = np.clip(np.rint(mean / np.float32(0.03)) + 2, -128, 127).astype(np.int8)
    np.testing.assert_array_equal(_mithril_run(model, {"x": x}, backend)["y"], want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_full_range_int8_weights_match_exact_arithmetic(backend):
    """The cases compared with onnxruntime keep u8 x s8 weights in 7 bits (see ``_rand_q``); here the
    weights span [-128, 127] and the reference is int64 arithmetic. Scales are powers of two, so the
    requantized and float outputs are exact in float32 too (half to even on exact midpoints)."""
    rng = np.random.default_rng(9)
    m, k, n = 4, 64, 8
    a, w = _rand_q(rng, (m, k), np.uint8), _rand_q(rng, (k, n), np.int8)
    a.flat[:2], w.flat[:2] = (0, 255), (-128, 127)
    # Where an int16 pair sum saturates, so a kernel that does so fails here.
    pairs = a[:, 0::2, None].astype(np.int64) * w[0::2] + a[:, 1::2, None].astype(np.int64) * w[1::2]
    assert np.abs(pairs).max() > np.iinfo(np.int16).max
    za, zw = np.uint8(128), np.int8(2)
    acc = (a.astype(np.int64) - za) @ (w.astype(np.int64) - zw)
    # DynamicQuantizeMatMul's input spans -8 to 127/16 on a 1/16 grid: its scale is 1/16, its zero
    # point 128, so it quantizes to ``a`` and its product is ``acc``.
    x = (a.astype(np.float32) - 128) / np.float32(16)
    bias = rng.standard_normal(n).astype(np.float32)
    c = rng.integers(-3000, 3000, n).astype(np.int32)
    xc, wc = _rand_q(rng, (1, 4, 6, 6), np.uint8), _rand_q(rng, (8, 4, 3, 3), np.int8)
    wc.flat[:2] = -128, 127
    bc = rng.integers(-3000, 3000, 8).astype(np.int32)
    swc = np.array([2.0**-5, 2.0**-6] * 4, np.float32)
    padded = np.pad(xc.astype(np.int64) - 128, [(0, 0), (0, 0), (1, 1), (1, 1)])
    conv = sum(np.einsum("nchw,oc->nohw", padded[:, :, i:i + 6, j:j + 6], wc[:, :, i, j].astype(np.int64))
               for i in range(3) for j in range(3))

    def requantize(values, multiplier, zero_point):
        return np.clip(np.rint(values * multiplier) + zero_point, 0, 255).astype(np.uint8)

    want = {
        "mmi": acc.astype(np.int32),
        "qmm": requantize(acc, 2.0**-10, 100),  # (1/16) * (1/64) / 1
        "qgemm": requantize(acc + c, 2.0**-10, 128),  # alpha 1/2 * (1/16) * (1/64) / (1/2)
        "dqmm": (acc.astype(np.float32) * np.float32(2.0**-10) + bias).astype(np.float32),  # (1/16) * (1/64)
        "convi": conv.astype(np.int32),
        "qconv": requantize(conv + bc[:, None, None], swc[:, None, None].astype(np.float64) / 16, 120),
    }
    s4, s6 = _s(2.0**-4), _s(2.0**-6)
    conv_attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    nodes = [
        helper.make_node("MatMulInteger", ["a", "w", "za", "zw"], ["mmi"]),
        helper.make_node("QLinearMatMul", ["a", "s4", "za", "w", "s6", "zw", "one", "z100"], ["qmm"]),
        _node("QGemm", ["a", "s4", "za", "wt", "s6", "zw", "c", "half", "z128"], ["qgemm"], transB=1, alpha=0.5),
        _node("DynamicQuantizeMatMul", ["x", "w", "s6", "zw", "bias"], ["dqmm"]),
        helper.make_node("ConvInteger", ["xc", "wc", "za"], ["convi"], **conv_attrs),
        helper.make_node("QLinearConv", ["xc", "s4", "za", "wc", "swc", "zwc", "one", "z120", "bc"], ["qconv"],
                         **conv_attrs),
    ]
    inits = {"w": w, "wt": np.ascontiguousarray(w.T), "za": za,
             "zw": zw, "s4": s4, "s6": s6, "one": _s(1), "half": _s(0.5), "z100": np.uint8(100), "z128": za,
             "c": c, "bias": bias, "wc": wc, "swc": swc, "zwc": np.zeros(8, np.int8), "z120": np.uint8(120), "bc": bc}
    types = {"mmi": I32, "qmm": U8, "qgemm": U8, "dqmm": F32, "convi": I32, "qconv": U8}
    model = _model(nodes, [("a", U8, [m, k]), ("x", F32, [m, k]), ("xc", U8, xc.shape)],
                   [(name, types[name], want[name].shape) for name in want], inits)
    got = _mithril_run(model, {"a": a, "x": x, "xc": xc}, backend)
    for name, ref in want.items():
        assert got[name].dtype == ref.dtype, (name, got[name].dtype)
        if ref.dtype.kind == "f":
            np.testing.assert_allclose(got[name], ref, rtol=1e-6, atol=0, err_msg=f"{name} on {backend}")
        else:
            np.testing.assert_array_equal(got[name], ref, err_msg=f"{name} on {backend}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_unsupported_attribute_names_the_node(backend):
    model, feeds = CASES["QAttention-no-mask-unidirectional=0"]
    model = onnx.ModelProto.FromString(model.SerializeToString())
    model.graph.node[0].attribute.append(helper.make_attribute("do_rotary", 1))
    with pytest.raises(ml.errors.UnsupportedAttributeError, match="qattention_node.*do_rotary"):
        _mithril_run(model, feeds, backend)


# -- (b) models written by onnxruntime's quantization tools --------------------------------------
torch = pytest.importorskip("torch")


class _Reader:
    """A CalibrationDataReader over a fixed list of feeds."""

    def __init__(self, feeds):
        self._it = iter(feeds)

    def get_next(self):
        return next(self._it, None)


class _CNN(torch.nn.Module):
    """Conv/Relu/MaxPool/Add/Concat/AveragePool/Sigmoid/Mul/LeakyRelu/GlobalAveragePool/Gemm/Softmax."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 8, 3, padding=1)
        self.c3, self.fc = torch.nn.Conv2d(8, 8, 1), torch.nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        a = torch.max_pool2d(torch.relu(self.c1(x)), 2)
        b, c = torch.relu(self.c2(a)), self.c3(a)
        e = torch.nn.functional.avg_pool2d(torch.cat([b + c, c], 1), 2)
        f = torch.nn.functional.leaky_relu(torch.sigmoid(e) * e, 0.1)
        g = torch.nn.functional.adaptive_avg_pool2d(f, 1).flatten(1)
        return torch.softmax(self.fc(f.flatten(1)), -1), g


class _ResizeCNN(torch.nn.Module):
    """Clip/Pad/Split/Resize (nearest and bilinear)/Transpose/Reshape/ArgMax: the ops the QOperator
    quantizer keeps in 8 bits (onnxruntime's Direct8BitOp, QPad, QResize, QSplit, QArgMax)."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(4, 4, 3)

    def forward(self, x):
        a = torch.nn.functional.pad(torch.clamp(self.c1(x), 0, 6), (1, 1, 1, 1))
        p, q = torch.chunk(a, 2, 1)
        b = self.c2(p) + q[:, :, 1:-1, 1:-1]
        up = [torch.nn.functional.interpolate(b, scale_factor=2, mode=m) for m in ("nearest", "bilinear")]
        return torch.cat(up, 1).permute(0, 2, 3, 1).reshape(2, -1, 8), torch.argmax(b.flatten(2), -1)


class _Recurrent(torch.nn.Module):
    def __init__(self, cell):
        super().__init__()
        self.rnn, self.fc = cell(8, 16, batch_first=True), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc(self.rnn(x)[0])


class _Bert(torch.nn.Module):
    def __init__(self):
        super().__init__()
        from transformers import BertConfig, BertModel

        config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                            vocab_size=100, max_position_embeddings=64, attn_implementation="eager")
        self.bert = BertModel(config, add_pooling_layer=False).eval()

    def forward(self, input_ids, attention_mask, token_type_ids):
        return self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                         return_dict=True)["last_hidden_state"]


def _export(module, args, names, path, dynamic=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), args, str(path), input_names=names, output_names=["y"] if len(names) > 0
                          else None, opset_version=17, dynamo=False, dynamic_axes=dynamic)


def _bert_feeds(seed):
    rng = np.random.default_rng(seed)
    mask = np.ones((2, 8), np.int64)
    mask[1, 6:] = 0
    return {"input_ids": rng.integers(0, 100, (2, 8)).astype(np.int64), "attention_mask": mask,
            "token_type_ids": np.zeros((2, 8), np.int64)}


# name -> (source, how it is quantized, the ops ("domain:op") the result must contain)
TOOL_MODELS = {
    "cnn-dynamic": ("cnn", "dynamic", {":ConvInteger", ":MatMulInteger", ":DynamicQuantizeLinear"}),
    "cnn-static-qoperator": ("cnn", "qoperator", {
        ":QLinearConv", f"{MS}:QLinearAdd", f"{MS}:QLinearConcat", f"{MS}:QLinearAveragePool",
        f"{MS}:QLinearSigmoid", f"{MS}:QLinearMul", f"{MS}:QLinearLeakyRelu", f"{MS}:QLinearGlobalAveragePool",
        f"{MS}:QGemm", f"{MS}:QLinearSoftmax"}),
    "cnn-static-qdq": ("cnn", "qdq", {":QuantizeLinear", ":DequantizeLinear"}),
    "resize-cnn-static-qoperator": ("resize-cnn", "qoperator", {
        ":QLinearConv", f"{MS}:QLinearAdd", f"{MS}:QLinearConcat", ":Resize", ":Pad", ":ArgMax"}),
    "cnn-static-qdq-int16": ("cnn", "qdq16", {f"{MS}:QuantizeLinear", f"{MS}:DequantizeLinear"}),
    "cnn-static-qdq-int4-weights": ("cnn", "qdq4", {f"{MS}:QuantizeLinear", f"{MS}:DequantizeLinear"}),
    "lstm-dynamic": ("lstm", "dynamic", {f"{MS}:DynamicQuantizeLSTM", ":MatMulInteger"}),
    "gru-dynamic": ("gru", "dynamic", {":GRU", ":MatMulInteger"}),
    "bert-dynamic": ("bert", "dynamic", {":MatMulInteger", ":DynamicQuantizeLinear"}),
    "bert-static-qoperator": ("bert", "qoperator", {
        ":QLinearMatMul", f"{MS}:QLinearAdd", f"{MS}:QLinearMul", f"{MS}:QLinearSoftmax"}),
    "bert-static-qdq": ("bert", "qdq", {":QuantizeLinear", ":DequantizeLinear"}),
    "bert-optimized-dynamic": ("bert-optimized", "dynamic", {
        f"{MS}:QAttention", f"{MS}:QEmbedLayerNormalization", ":MatMulInteger"}),
    # quantize_dynamic, then the file onnxruntime's own graph optimizer writes (optimized_model_filepath).
    "cnn-dynamic-ort-fused": ("cnn", "dynamic+fused", {f"{MS}:DynamicQuantizeMatMul", ":ConvInteger"}),
    "lstm-dynamic-ort-fused": ("lstm", "dynamic+fused", {f"{MS}:DynamicQuantizeMatMul",
                                                          f"{MS}:DynamicQuantizeLSTM"}),
    "bert-dynamic-ort-fused": ("bert", "dynamic+fused", {f"{MS}:DynamicQuantizeMatMul",
                                                          f"{MS}:MatMulIntegerToFloat"}),
}


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory):
    """tool_model(name) -> (quantized ModelProto, feeds, onnxruntime's outputs), built once."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static

    folder = tmp_path_factory.mktemp("quantized")
    sources: dict[str, tuple] = {}
    built: dict[str, tuple] = {}

    def source(kind):
        if kind in sources:
            return sources[kind]
        torch.manual_seed(0)
        path = folder / f"{kind}.onnx"
        if kind == "cnn":
            _export(_CNN(), (torch.randn(2, 3, 16, 16),), ["x"], path)
            feeds = [{"x": np.random.default_rng(s).standard_normal((2, 3, 16, 16)).astype(np.float32)}
                     for s in range(3)]
        elif kind == "resize-cnn":
            _export(_ResizeCNN(), (torch.randn(2, 3, 8, 8),), ["x"], path)
            feeds = [{"x": np.random.default_rng(s).standard_normal((2, 3, 8, 8)).astype(np.float32)}
                     for s in range(3)]
        elif kind in ("lstm", "gru"):
            cell = torch.nn.LSTM if kind == "lstm" else torch.nn.GRU
            _export(_Recurrent(cell), (torch.randn(2, 5, 8),), ["x"], path)
            feeds = [{"x": np.random.default_rng(s).standard_normal((2, 5, 8)).astype(np.float32)} for s in range(3)]
        else:
            pytest.importorskip("transformers", reason="transformers builds the BERT model")
            names = ["input_ids", "attention_mask", "token_type_ids"]
            args = tuple(torch.from_numpy(v) for v in _bert_feeds(0).values())
            _export(_Bert(), args, names, path, {n: {0: "batch", 1: "seq"} for n in names})
            feeds = [_bert_feeds(s) for s in range(3)]
            if kind == "bert-optimized":
                from onnxruntime.transformers.optimizer import optimize_model

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    optimize_model(str(path), model_type="bert", num_heads=2, hidden_size=32).save_model_to_file(
                        str(folder / "bert-optimized.onnx"))
                path = folder / "bert-optimized.onnx"
        sources[kind] = (path, feeds)
        return sources[kind]

    def get(name):
        if name in built:
            return built[name]
        kind, how, _ = TOOL_MODELS[name]
        path, feeds = source(kind)
        out = str(folder / f"{name}.onnx")
        # Transformer fusions leave outputs of com.microsoft ops without inferred types.
        extra = {"DefaultTensorType": TensorProto.FLOAT}
        if how.startswith("dynamic"):
            quantize_dynamic(str(path), out, reduce_range=True, extra_options=extra)
            if how.endswith("+fused"):
                options = ort.SessionOptions()
                options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
                options.optimized_model_filepath = str(folder / f"{name}-fused.onnx")
                ort.InferenceSession(out, options, providers=["CPUExecutionProvider"])
                out = options.optimized_model_filepath
        else:
            fmt = QuantFormat.QOperator if how == "qoperator" else QuantFormat.QDQ
            options = dict(extra, UseQDQContribOps=True) if how == "qdq16" else extra
            activation = QuantType.QInt16 if how == "qdq16" else QuantType.QUInt8
            weight = QuantType.QInt4 if how == "qdq4" else QuantType.QInt8
            # QOperator's integer kernels need 7-bit weights to be exact (see _rand_q); QDQ files run as float.
            quantize_static(str(path), out, _Reader(feeds[:2]), quant_format=fmt, activation_type=activation,
                            weight_type=weight, reduce_range=how == "qoperator", extra_options=options)
        model = onnx.load(out)
        # onnxruntime fuses QDQ groups (DequantizeLinear -> GlobalAveragePool -> QuantizeLinear) into its
        # integer kernels, which round differently from the float ops the file describes: QDQ files are
        # compared with the graph as written.
        options = ort.SessionOptions()
        if how.startswith("qdq"):
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = ort.InferenceSession(out, options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        built[name] = (model, feeds[2], dict(zip(names, session.run(names, feeds[2]))))
        return built[name]

    return get


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("name", list(TOOL_MODELS))
def test_tool_writes_the_expected_quantized_ops(tool_model, name):
    model, _, _ = tool_model(name)
    ops = {f"{n.domain}:{n.op_type}" for n in model.graph.node}
    missing = TOOL_MODELS[name][2] - ops
    assert not missing, f"{name}: the tool no longer writes {sorted(missing)}; it wrote {sorted(ops)}"


@pytest.mark.filterwarnings("ignore::UserWarning:torch")
def test_fixed_shapes_fold_shape_subgraphs_after_quantized_ops(tool_model):
    """With the input shapes fixed, BERT's mask arithmetic (Shape of a LayerNormalization fed by
    QLinearAdd) folds, so JAX runs the quantized model as one jitted program."""
    import re

    model, feeds, want = tool_model("bert-static-qoperator")
    shapes = {k: list(v.shape) for k, v in feeds.items()}
    ops = re.findall(r"# (\w+) '", ml.compile(ml.load_onnx(model), ml.NumpyBackend(), shapes=shapes).code)
    assert "QLinearAdd" in ops and "Shape" not in ops
    if "jax" in BACKENDS:
        with warnings.catch_warnings():
            warnings.simplefilter("error", JitFallbackWarning)
            got = _mithril_run(model, feeds, "jax")
        np.testing.assert_allclose(got["y"], want["y"], rtol=1e-4, atol=1e-5)


def _missing_kernels(model):
    from mithril.backends.registry import REGISTRY

    have = REGISTRY.ops()
    return sorted({f"{n.domain}::{n.op_type}" for n in model.graph.node
                   if n.domain in (MS,) and (n.domain, n.op_type) not in have})


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(TOOL_MODELS))
def test_tool_quantized_model_matches_onnxruntime(tool_model, name, backend):
    model, feeds, want = tool_model(name)
    missing = _missing_kernels(model)
    if missing:
        pytest.xfail(f"non-quantized contrib kernels not registered yet: {missing}")
    constant_keys = None
    narrow = [i.name for i in model.graph.initializer if i.data_type in (TensorProto.INT4, TensorProto.UINT4)]
    if narrow and backend in ("torch", "mlx"):
        # torch and MLX hold no int4 arrays: refused by name, unless the weights' DequantizeLinear
        # nodes fold at compile (their inputs named constant), which leaves float32 weights.
        with pytest.raises(ml.errors.UnsupportedDTypeError, match="int4"):
            _mithril_run(model, feeds, backend)
        dequantized = {n.output[0]: n for n in model.graph.node if n.op_type == "DequantizeLinear"}
        constant_keys = [i for n in dequantized.values() if n.input[0] in narrow for i in n.input]
    got = _mithril_run(model, feeds, backend, constant_keys)
    for key, ref in want.items():
        out = got[key]
        assert out.dtype == ref.dtype and out.shape == ref.shape
        # Quantization-aware bound (see the module docstring): all within 1% of the output's range
        # (two to three 8-bit steps), and 95% of elements equal to float32 precision.
        diff = np.abs(out.astype(np.float64) - ref.astype(np.float64))
        bound = 0.01 * float(np.abs(ref).max())
        assert diff.max() <= bound, f"{name} {key} on {backend}: max |diff| {diff.max():.3g} > {bound:.3g}"
        # In QDQ files float ops sit between QuantizeLinear pairs and are requantized at once: the
        # standard float AveragePool sums its window in another order than onnxruntime (the first
        # divergence in the QDQ CNN, one ulp), and one ulp across a midpoint is a whole step
        # downstream, measured in 6 of 32 CNN outputs; those files are held to the bound alone.
        if TOOL_MODELS[name][1].startswith("qdq"):
            continue
        close = np.isclose(out, ref, rtol=1e-4, atol=1e-5).mean()
        assert close >= 0.95, f"{name} {key} on {backend}: only {close:.0%} of elements match to float32 precision"
