"""Kernel bugs the fuzzer found (docs/reliability.md), each pinned by a hand-made graph.

Every case is a model onnxruntime runs; each backend must give onnxruntime's result, shape and
dtype included. The fuzzer found them through attribute and value mutations that the ONNX node
suite never writes (keepdims=2, largest=2, a scalar ArgMax, pads longer than the data...).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import mithril as ml

from tests.conftest import make_model
from tests.backends.test_parity import AVAILABLE, make_backend

F32, F64, F16, I64 = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT64
X = np.array([[3.0, -1.0, 7.0, 7.0], [0.5, 9.0, -2.0, 4.0]], np.float32)


def one_node(op, inputs, output_type, feeds, opset=19, extra_inputs=(), outputs=("y",), declare_shapes=True,
             **attrs):
    """A graph of one node on ``feeds`` (graph inputs) plus constant ``extra_inputs``; the first
    output is compared. ``declare_shapes=False`` leaves the inputs' ranks unknown to shape inference."""
    node = helper.make_node(op, inputs, list(outputs), name=op.lower(), **attrs)
    graph_inputs = [(n, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape) if declare_shapes else None)
                    for n, v in feeds.items()]
    graph_outputs = [(o, output_type if i == 0 else I64, None) for i, o in enumerate(outputs)]
    return make_model([node], graph_inputs, graph_outputs, dict(extra_inputs), opset=opset), feeds


CASES = {
    # keepdims other than 0 or 1 drops the axis, as onnxruntime reads it (4c61694)
    "ReduceMax keepdims=2": lambda: one_node("ReduceMax", ["x", "axes"], F32, {"x": X},
                                             extra_inputs=[("axes", np.array([1], np.int64))], keepdims=2),
    "ArgMax keepdims=-1": lambda: one_node("ArgMax", ["x"], I64, {"x": X}, axis=1, keepdims=-1),
    # an ArgMax of a scalar is the scalar index 0 (the long run at seed 20261124); onnxruntime
    # refuses it only where shape inference sees the rank
    "ArgMax of a scalar": lambda: one_node("ArgMax", ["x"], I64, {"x": np.array(2.5, np.float32)}, axis=0,
                                           keepdims=1, declare_shapes=False),
    # NaN loses every comparison in onnxruntime's scan: it is picked only as the first element
    # (NumPy's argmin picks the first NaN; the second long run at seed 20261124)
    "ArgMin with NaN": lambda: one_node("ArgMin", ["x"], I64, {"x": np.array(
        [[3, np.nan, 1, 2], [np.nan, 3, 1, 1], [3, 1, 1, np.nan]], np.float16)}, axis=1, keepdims=1),
    "ArgMax with NaN, last index": lambda: one_node("ArgMax", ["x"], I64, {"x": np.array(
        [[3, np.nan, 5, 5], [np.nan, 3, 1, 1], [3, 1, 1, np.nan]], np.float32)}, axis=1, keepdims=0,
        select_last_index=1),
    # largest other than 0 or 1 means smallest (c5d1c13)
    "TopK largest=2": lambda: one_node("TopK", ["x", "k"], F32, {"x": X},
                                       extra_inputs=[("k", np.array([2], np.int64))], outputs=("y", "indices"),
                                       axis=1, largest=2),
    # a negative pad longer than the data crops into the padding, never wraps (3ef7aa7)
    "Pad crops past the data": lambda: one_node("Pad", ["x", "pads"], F32, {"x": np.array([1.0, 2.0], np.float32)},
                                                extra_inputs=[("pads", np.array([5, -3], np.int64))]),
    # float16 windows summed in float32, not float16 (9d23dbe)
    "AveragePool float16 large values": lambda: one_node(
        "AveragePool", ["x"], F16, {"x": np.full((1, 1, 4, 4), 30000, np.float16)}, kernel_shape=[2, 2]),
    # an empty axes tensor squeezes every dim of 1 (22be494)
    "Squeeze empty axes": lambda: one_node("Squeeze", ["x", "axes"], F32, {"x": np.ones((1, 3, 1), np.float32)},
                                           extra_inputs=[("axes", np.zeros((0,), np.int64))]),
    # float64 statistics stay float64 whatever stash_type says (8654015)
    "LayerNormalization float64": lambda: one_node(
        "LayerNormalization", ["x", "scale"], F64, {"x": (X.astype(np.float64) * 1e8 + 1e-3)},
        extra_inputs=[("scale", np.ones(4, np.float64))], opset=17),
}


# (case, backend) -> why it fails today.
XFAIL = {("ArgMax with NaN, last index", "ggml"):
         "GGML's ArgMax (a onehot of the row's max, kept by a running count) picks another index than NumPy in a "
         "row holding NaN with select_last_index=1 (docs/backends.md#ggml); to be fixed in ggml/ops/nn.py"}


@pytest.mark.parametrize("case, backend", [
    pytest.param(c, b, marks=[pytest.mark.xfail(strict=True, reason=XFAIL[(c, b)])] if (c, b) in XFAIL else [],
                 id=f"{c}-{b}") for c in CASES for b in AVAILABLE])
def test_fuzzer_found_kernel_bug_stays_fixed(case, backend):
    proto, feeds = CASES[case]()
    options = ort.SessionOptions()
    options.log_severity_level = 3
    expected = ort.InferenceSession(proto.SerializeToString(), options,
                                    providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    b = make_backend(backend)
    if backend == "mlx" and any(v.dtype == np.float64 for v in feeds.values()):
        with pytest.raises(ml.errors.UnsupportedDTypeError, match="float64"):
            ml.compile(proto, b)
        pytest.skip("MLX has no float64 on its default CPU path: refused at compile (checked)")
    # C and GGML compile fixed shapes only: they are given the feeds' (a file that leaves a rank unknown included).
    shapes = {k: list(v.shape) for k, v in feeds.items()} if b.needs_static_shapes else None
    pm = ml.compile(proto, b, shapes=shapes)
    got = b.to_numpy(pm.evaluate(None, {k: b.from_numpy(v) for k, v in feeds.items()})["y"])
    assert got.shape == expected.shape and got.dtype == expected.dtype
    np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64), rtol=1e-6, atol=1e-6)
