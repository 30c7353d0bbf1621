"""In-place activations on NumPy and Torch (mithril/backends/passes/inplace.py): a Clip or Relu writes
into a Conv/Gemm/MatMul result only that node reads, and nowhere else. Each case checks the
program printed (which kernel each node calls) and the outputs against onnxruntime, including the
cases where writing in place would corrupt a value another node, a graph output or the caller
holds; and that gradients, where autograd records the forward, are unchanged."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import mithril as ml
from mithril.backends.passes import in_place_activations
from mithril.backends.numpy.inplace import SWAPS

on_each_backend = pytest.mark.parametrize("backend", [ml.NumpyBackend, ml.TorchBackend], ids=["numpy", "torch"])

RNG = np.random.default_rng(0)
X_SHAPE = [1, 3, 6, 6]


def _model(nodes, outputs, extra_inits=()):
    inits = [numpy_helper.from_array((RNG.standard_normal((4, 3, 3, 3)) * 2).astype(np.float32), "w"),
             numpy_helper.from_array(RNG.standard_normal(4).astype(np.float32), "b"),
             numpy_helper.from_array(np.array(0, np.float32), "lo"),
             numpy_helper.from_array(np.array(1.5, np.float32), "hi"), *extra_inits]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, X_SHAPE)],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], inits)
    # IR version 10: onnx 1.23.1 writes 14 by default, which onnxruntime 1.30 refuses (the device machine's pair).
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _conv(out="c", x="x"):
    return helper.make_node("Conv", [x, "w", "b"], [out], kernel_shape=[3, 3], pads=[1, 1, 1, 1])


def _run(model, backend):
    x = RNG.standard_normal(X_SHAPE).astype(np.float32) * 3
    pm = ml.compile(ml.load_onnx(model), backend(), shapes={"x": X_SHAPE}, inference=True)
    given = x.copy()
    got = {k: np.asarray(pm.backend.to_numpy(v)) for k, v in pm.evaluate(pm.get_parameters(), {"x": given}).items()}
    assert np.array_equal(given, x), "the caller's input changed"
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    names = [o.name for o in model.graph.output]
    for name, w in zip(names, want):
        np.testing.assert_allclose(got[name], w, rtol=1e-5, atol=1e-5, err_msg=name)
    return pm


@on_each_backend
@pytest.mark.parametrize("act", ["Clip", "Relu"])
def test_activation_after_conv_runs_in_place(act, backend):
    inputs = ["c", "lo", "hi"] if act == "Clip" else ["c"]
    pm = _run(_model([_conv(), helper.make_node(act, inputs, ["y"])], ["y"]), backend)
    # Torch fuses the pair into one kernel (mithril/backends/torch/fusion.py), which writes the
    # activation into the convolution's result wherever it does not run oneDNN's fused call.
    assert (f"{act.lower()}_into" if backend is ml.NumpyBackend else "conv_activation") in pm.code


@on_each_backend
def test_clip_with_one_bound_in_place(backend):
    pm = _run(_model([_conv(), helper.make_node("Clip", ["c", "", "hi"], ["y"])], ["y"]), backend)
    assert ("clip_into" if backend is ml.NumpyBackend else "conv_activation") in pm.code


@on_each_backend
def test_conv_result_read_elsewhere_is_left_alone(backend):
    # Add reads the convolution's result after the Clip: clipping it in place would change the sum.
    nodes = [_conv(), helper.make_node("Clip", ["c", "lo", "hi"], ["r"]), helper.make_node("Add", ["c", "r"], ["y"])]
    pm = _run(_model(nodes, ["y"]), backend)
    # Torch runs the Conv alone through its oneDNN call (activation=None), the Clip apart.
    assert "clip_into" not in pm.code and "activation='Clip'" not in pm.code


@on_each_backend
def test_conv_result_that_is_a_graph_output_is_left_alone(backend):
    pm = _run(_model([_conv(), helper.make_node("Relu", ["c"], ["y"])], ["c", "y"]), backend)
    assert "relu_into" not in pm.code and "activation='Relu'" not in pm.code


@on_each_backend
def test_activation_of_a_graph_input_or_a_view_is_left_alone(backend):
    shape = numpy_helper.from_array(np.array([1, 4, 36], np.int64), "shape")
    nodes = [helper.make_node("Relu", ["x"], ["rx"]), _conv(x="rx"),
             helper.make_node("Reshape", ["c", "shape"], ["v"]), helper.make_node("Clip", ["v", "lo", "hi"], ["y"])]
    pm = _run(_model(nodes, ["y"], [shape]), backend)
    assert "relu_into" not in pm.code and "clip_into" not in pm.code


@on_each_backend
def test_matmul_and_gemm_results(backend):
    wm = numpy_helper.from_array(RNG.standard_normal((6, 5)).astype(np.float32), "wm")
    nodes = [helper.make_node("MatMul", ["x", "wm"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    pm = _run(_model(nodes, ["y"], [wm]), backend)
    assert "relu_into" in pm.code


def test_gradient_program_keeps_the_plain_kernels():
    # Training: the forward may clip in place, the gradient of the Conv's weights still sees the
    # unclipped result where the Clip's rule needs it (compared with the same model run by Torch).
    model = _model([_conv(), helper.make_node("Clip", ["c", "lo", "hi"], ["y"])], ["y"])
    x = RNG.standard_normal(X_SHAPE).astype(np.float32)
    grads = {}
    for backend in (ml.NumpyBackend(), ml.TorchBackend()):
        pm = ml.compile(ml.load_onnx(model), backend, shapes={"x": X_SHAPE}, trainable_keys=["w", "b"])
        cot = backend.array(np.ones((1, 4, 6, 6), np.float32))
        _, g = pm.evaluate(None, {"x": backend.array(x)}, output_gradients={"y": cot})
        grads[backend.name] = {k: np.asarray(backend.to_numpy(v)) for k, v in g.items()}
    assert set(grads["numpy"]) == {"w", "b"}
    for k in ("w", "b"):
        np.testing.assert_allclose(grads["numpy"][k], grads["torch"][k], rtol=1e-4, atol=1e-4)


def test_plan_is_not_changed():
    model = _model([_conv(), helper.make_node("Clip", ["c", "lo", "hi"], ["y"])], ["y"])
    pm = ml.compile(ml.load_onnx(model), ml.NumpyBackend(), shapes={"x": X_SHAPE}, inference=True)
    before = [pn.spec.fn for pn in pm.plan.nodes]
    rewritten = in_place_activations(pm.plan, SWAPS)
    assert rewritten is not pm.plan and [pn.spec.fn for pn in pm.plan.nodes] == before
    assert in_place_activations(rewritten, SWAPS).nodes[-1].spec.fn is rewritten.nodes[-1].spec.fn


def test_torch_compile_traces_the_plain_kernel():
    # Under torch.compile the in-place kernel hands over to the one it replaced (dynamo traces it).
    model = _model([_conv(), helper.make_node("Clip", ["c", "lo", "hi"], ["y"])], ["y"])
    x = RNG.standard_normal(X_SHAPE).astype(np.float32) * 3
    pm = ml.compile(ml.load_onnx(model), ml.TorchBackend(compile=True), shapes={"x": X_SHAPE}, inference=True)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for _ in range(2):
        np.testing.assert_allclose(pm.backend.to_numpy(pm.evaluate(None, {"x": x})["y"]), want, rtol=1e-5, atol=1e-5)
