"""TorchBackend's oneDNN graphs (mithril/backends/torch/graph.py): a convolutional model's
forward-only CPU calls traced once and run by oneDNN's graph API, never a change of values."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import mithril as ml

from tests.conftest import make_model

torch = pytest.importorskip("torch", reason="the Torch backend needs torch (pip install mithril[torch])")
from mithril.backends.torch import graph as tgraph  # noqa: E402

pytestmark = pytest.mark.skipif(not tgraph.AVAILABLE, reason="this torch has no TorchScript oneDNN bridge")

F = TensorProto.FLOAT
RNG = np.random.default_rng(0)


def _w(*shape, scale=0.4):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _cnn(shape=(1, 3, 12, 12)):
    """Conv -> Clip; depthwise Conv -> Clip; 1x1 Conv -> Add (residual) -> Relu; MaxPool;
    GlobalAveragePool -> Flatten -> Gemm: MobileNet's and ResNet's blocks in small."""
    nodes = [
        helper.make_node("Conv", ["x", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c1", "lo", "hi"], ["r1"]),
        helper.make_node("Conv", ["r1", "Wd"], ["d"], group=8, pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["d", "lo", "hi"], ["r2"]),
        helper.make_node("Conv", ["r2", "Wp", "Bp"], ["p"]),
        helper.make_node("Add", ["p", "r1"], ["a"]),
        helper.make_node("Relu", ["a"], ["r3"]),
        helper.make_node("MaxPool", ["r3"], ["mp"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["mp"], ["g"]),
        helper.make_node("Flatten", ["g"], ["fl"]),
        helper.make_node("Gemm", ["fl", "W2", "C"], ["y"], transB=1),
    ]
    inits = {"W1": _w(8, 3, 3, 3), "B1": _w(8), "Wd": _w(8, 1, 3, 3), "Wp": _w(8, 8, 1, 1), "Bp": _w(8),
             "W2": _w(5, 8), "C": _w(5), "lo": np.float32(0.0), "hi": np.float32(6.0)}
    return make_model(nodes, [("x", F, ["N", 3, shape[2], shape[3]])], [("y", F, None)], inits)


def _pair(model, **kw):
    """The model compiled twice: the default TorchBackend and one that runs op by op."""
    return (ml.compile(ml.load_onnx(model), ml.TorchBackend(), **kw),
            ml.compile(ml.load_onnx(model), ml.TorchBackend(onednn_graph=False), **kw))


def _counting(wrapper):
    """Counts the wrapper's op-by-op runs (its ``forward``)."""
    inner, calls = wrapper.forward, []

    def forward(params, data):
        calls.append(1)
        return inner(params, data)

    wrapper.forward = forward
    return calls


def test_a_convolutional_model_runs_as_a_onednn_graph_from_its_second_call():
    pm, eager = _pair(_cnn())
    wrapper = pm.program.forward
    assert isinstance(wrapper, tgraph.OneDnnGraph)
    assert not isinstance(eager.program.forward, tgraph.OneDnnGraph)
    params, x = pm.get_parameters(), torch.randn(2, 3, 12, 12)
    want = eager(eager.get_parameters(), {"x": x})["y"]
    first = pm(params, {"x": x})["y"]
    assert wrapper.built == 0  # a one-off call never pays for a trace
    second = pm(params, {"x": x})["y"]
    assert wrapper.built == 1 and wrapper.refused is None
    calls = _counting(wrapper)
    third = pm(params, {"x": x})["y"]
    assert calls == []  # the graph ran, not the program
    for got in (first, second, third):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # oneDNN's fuser took the convolutions (TorchScript's optimised graph holds its partitions).
    stamp, graph, names = wrapper._graphs[tgraph._data_key({"x": ml.TorchBackend()._to_facade(x)})]
    assert "oneDNNFusionGroup" in str(graph.graph_for(x))
    assert not torch.jit.onednn_fusion_enabled()  # the process's setting, left as it was


def test_a_parameter_changed_in_place_or_a_new_shape_is_traced_again():
    pm, eager = _pair(_cnn())
    wrapper = pm.program.forward
    params, x = pm.get_parameters(), torch.randn(1, 3, 12, 12)
    for _ in range(3):
        pm(params, {"x": x})
    assert wrapper.built == 1
    with torch.no_grad():
        params["W1"].mul_(-1.0)  # in place: the frozen graph holds the old values
    other = eager.get_parameters()
    with torch.no_grad():
        other["W1"].mul_(-1.0)
    want = eager(other, {"x": x})["y"]
    calls = _counting(wrapper)
    torch.testing.assert_close(pm(params, {"x": x})["y"], want, rtol=1e-5, atol=1e-5)
    assert calls == [1] and wrapper.built == 1  # op by op, then traced at the second call
    torch.testing.assert_close(pm(params, {"x": x})["y"], want, rtol=1e-5, atol=1e-5)
    assert wrapper.built == 2
    x4 = torch.randn(4, 3, 12, 12)  # another batch: its own graph, the first one kept
    for _ in range(3):
        got = pm(params, {"x": x4})["y"]
    torch.testing.assert_close(got, eager(other, {"x": x4})["y"], rtol=1e-5, atol=1e-5)
    assert wrapper.built == 3 and len(wrapper._graphs) == 2


def test_gradient_calls_and_foreign_parameters_run_op_by_op():
    pm, eager = _pair(_cnn())
    wrapper = pm.program.forward
    params, x = pm.get_parameters(), torch.randn(2, 3, 12, 12)
    for _ in range(3):
        out, grads = pm(params, {"x": x}, output_gradients={"y": torch.ones(2, 5)})
    want, want_grads = eager(eager.get_parameters(), {"x": x}, output_gradients={"y": torch.ones(2, 5)})
    assert wrapper.built == 0
    torch.testing.assert_close(out["y"], want["y"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads["W1"], want_grads["W1"], rtol=1e-4, atol=1e-5)
    numpy_params = {k: v.numpy() for k, v in params.items()}  # made into new tensors at every call
    with torch.inference_mode():
        inference_params = {k: v.clone() for k, v in params.items()}  # no version counter
    for given in (numpy_params, inference_params):
        for _ in range(3):
            torch.testing.assert_close(pm(given, {"x": x})["y"], want["y"], rtol=1e-5, atol=1e-5)
    assert wrapper.built == 0


def _conv_then(nodes, inits=None, batch=1):
    """x -> Conv (8 channels) -> ``nodes`` (reading ``c``, writing ``y``)."""
    base = {"W": _w(8, 3, 3, 3), "B": _w(8)}
    return make_model([helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]), *nodes],
                      [("x", F, [batch, 3, 6, 6])], [("y", F, None)], {**base, **(inits or {})})


# One model per op of TRACEABLE: each traces, fuses and gives the op-by-op program's values.
OPS = {
    "Relu": ([helper.make_node("Relu", ["c"], ["y"])], {}),
    "Clip": ([helper.make_node("Clip", ["c", "lo", "hi"], ["y"])], {"lo": np.float32(-0.5), "hi": np.float32(0.5)}),
    "LeakyRelu": ([helper.make_node("LeakyRelu", ["c"], ["y"], alpha=0.1)], {}),
    "Sigmoid": ([helper.make_node("Sigmoid", ["c"], ["y"])], {}),
    "Tanh": ([helper.make_node("Tanh", ["c"], ["y"])], {}),
    "Add Sub Mul Div": ([helper.make_node("Add", ["c", "k"], ["a"]), helper.make_node("Sub", ["a", "c"], ["s"]),
                         helper.make_node("Mul", ["s", "c"], ["m"]), helper.make_node("Div", ["m", "k"], ["y"])],
                        {"k": np.full((8, 1, 1), 2.0, np.float32)}),
    "MaxPool": ([helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])],
                {}),
    "AveragePool": ([helper.make_node("AveragePool", ["c"], ["y"], kernel_shape=[2, 2], strides=[2, 2])], {}),
    "BatchNormalization": ([helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"])],
                           {"s": _w(8) + 1, "b": _w(8), "m": _w(8), "v": np.abs(_w(8)) + 0.5}),
    "Concat": ([helper.make_node("Concat", ["c", "c"], ["y"], axis=1)], {}),
    "Identity Transpose Reshape": ([helper.make_node("Identity", ["c"], ["i"]),
                                    helper.make_node("Transpose", ["i"], ["t"], perm=[0, 2, 3, 1]),
                                    helper.make_node("Reshape", ["t", "shape"], ["y"])],
                                   {"shape": np.array([1, -1], np.int64)}),
    "GlobalAveragePool Flatten Gemm Softmax": (
        [helper.make_node("GlobalAveragePool", ["c"], ["g"]), helper.make_node("Flatten", ["g"], ["f"]),
         helper.make_node("Gemm", ["f", "G", "C"], ["z"]), helper.make_node("Softmax", ["z"], ["y"], axis=1)],
        {"G": _w(8, 4), "C": _w(1, 4)}),
    "GlobalAveragePool Flatten MatMul Add (MatMulAdd)": ([helper.make_node("GlobalAveragePool", ["c"], ["g"]),
                                helper.make_node("Flatten", ["g"], ["f"]),
                                helper.make_node("MatMul", ["f", "G"], ["z"]),
                                helper.make_node("Add", ["z", "C"], ["y"])],
                               {"G": _w(8, 4), "C": _w(4)}),
}


@pytest.mark.parametrize("ops", sorted(OPS))
def test_each_traceable_op_runs_in_the_graph_with_the_programs_values(ops):
    nodes, inits = OPS[ops]
    model = _conv_then(nodes, inits)
    pm, eager = _pair(model)
    wrapper = pm.program.forward
    assert isinstance(wrapper, tgraph.OneDnnGraph)
    # What the plan runs is what the case names (Identity is folded away, MatMul -> Add fused into MatMulAdd).
    assert {pn.op_type for pn in pm.plan.nodes} - {"Conv"} <= set(ops.replace("(", " ").replace(")", " ").split())
    x = torch.randn(1, 3, 6, 6)
    want = eager(eager.get_parameters(), {"x": x})["y"]
    params = pm.get_parameters()
    for _ in range(3):
        got = pm(params, {"x": x})["y"]
    assert wrapper.built == 1, wrapper.refused
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_plans_a_trace_would_get_wrong_or_that_have_no_conv_stay_op_by_op():
    relu_only = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", F, [1, 3, 6, 6])], [("y", F, None)], {})
    # A Clip bound computed from a data input: a trace would bake in the first call's value.
    data_bound = _conv_then([helper.make_node("ReduceMax", ["x"], ["hi"], keepdims=0),
                             helper.make_node("Clip", ["c", "", "hi"], ["y"])])
    # A symbolic batch keeps the Shape op (a static one is folded at compile).
    shape_op = _conv_then([helper.make_node("Shape", ["c"], ["s"]), helper.make_node("Reshape", ["c", "s"], ["y"])],
                          batch="N")
    for model in (relu_only, data_bound, shape_op):
        pm = ml.compile(ml.load_onnx(model), ml.TorchBackend())
        assert not isinstance(pm.program.forward, tgraph.OneDnnGraph)
    plan = ml.compile(ml.load_onnx(_cnn()), ml.TorchBackend()).plan
    assert tgraph.eligible(plan)
    clip = next(pn for pn in plan.nodes if pn.op_type == "Clip")
    bound_from_data = next(v for v in plan.inputs)
    changed = type(plan)(**{**plan.__dict__, "nodes": [
        type(pn)(**{**pn.__dict__, "inputs": (pn.inputs[0], bound_from_data, pn.inputs[2])}) if pn is clip else pn
        for pn in plan.nodes]})
    assert not tgraph.eligible(changed)


@pytest.mark.parametrize("fault", ["freeze", "tolerance"])
def test_a_graph_that_fails_or_disagrees_is_refused_and_the_program_stays_op_by_op(monkeypatch, fault):
    pm, eager = _pair(_cnn())
    wrapper = pm.program.forward
    if fault == "freeze":
        def broken(*args, **kwargs):
            raise RuntimeError("no freezing here")

        monkeypatch.setattr(torch.jit, "freeze", broken)
    else:
        monkeypatch.setattr(tgraph, "TOLERANCE", -1.0)  # no difference is small enough
    params, x = pm.get_parameters(), torch.randn(2, 3, 12, 12)
    want = eager(eager.get_parameters(), {"x": x})["y"]
    for _ in range(4):
        torch.testing.assert_close(pm(params, {"x": x})["y"], want, rtol=1e-5, atol=1e-5)
    assert wrapper.built == 0 and not wrapper._graphs
    assert ("no freezing here" if fault == "freeze" else "outputs differ") in wrapper.refused
    assert not torch.jit.onednn_fusion_enabled()


def test_a_graph_that_fails_at_a_later_call_hands_that_call_to_the_program():
    pm, eager = _pair(_cnn())
    wrapper = pm.program.forward
    params, x = pm.get_parameters(), torch.randn(2, 3, 12, 12)
    for _ in range(2):
        pm(params, {"x": x})
    key = next(iter(wrapper._graphs))
    stamp, graph, names = wrapper._graphs[key]

    def broken(*inputs):
        raise RuntimeError("a TorchScript bailout gone wrong")

    wrapper._graphs[key] = (stamp, broken, names)
    want = eager(eager.get_parameters(), {"x": x})["y"]
    torch.testing.assert_close(pm(params, {"x": x})["y"], want, rtol=1e-5, atol=1e-5)
    assert "bailout gone wrong" in wrapper.refused and not wrapper._graphs


def test_profile_says_its_rows_are_the_program_op_by_op_and_its_wall_time_the_graph():
    pm, eager = _pair(_cnn())
    x = np.random.default_rng(1).standard_normal((2, 3, 12, 12)).astype(np.float32)
    report = ml.profile(pm, data={"x": x}, runs=3)
    assert "one oneDNN graph" in report.note and pm.program.forward.built == 1
    assert "oneDNN graph" not in ml.profile(eager, data={"x": x}, runs=3).note
