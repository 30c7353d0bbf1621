"""NumPy gradients: every vector-Jacobian rule against central finite differences (float64,
one small graph per case), the zoo and imported models against JAX and Torch, and the
compile-time error for an op without a rule."""

from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import mithril as ml
from mithril.backends.vjp import RULES, NoGradientRuleError

F64 = TensorProto.DOUBLE


# ---------------------------------------------------------------------------------------------
# Single-node graphs vs central finite differences


class Case:
    """One graph: float inputs are data (differentiated), ``consts`` become initializers."""

    def __init__(self, op, inputs, attrs=None, opset=18, consts=None, outputs=1, positive=False, nodes=None,
                 order=None, id=None):
        self.op, self.inputs, self.attrs, self.opset = op, inputs, attrs or {}, opset
        # The op's input order where inputs and constants interleave (Where's condition first).
        self.order = order or list(inputs) + list(consts or {})
        self.consts, self.outputs, self.positive = consts or {}, outputs, positive
        self.nodes = nodes
        self.id = id or op

    def model(self):
        outs = [f"y{i}" for i in range(self.outputs)]
        nodes = self.nodes or [helper.make_node(self.op, self.order, outs, name="node", **self.attrs)]
        inits = [numpy_helper.from_array(np.asarray(v), n) for n, v in self.consts.items()]
        graph = helper.make_graph(
            nodes, "g", [helper.make_tensor_value_info(n, F64, s) for n, s in self.inputs.items()],
            [helper.make_tensor_value_info(o, F64, None) for o in outs], inits,
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])


_c = Case


def _i64(*v):
    return np.array(v, dtype=np.int64)


CASES = [
    # matmul family
    _c("MatMul", {"a": [3, 4], "b": [4, 5]}),
    _c("MatMul", {"a": [2, 3, 4], "b": [4, 5]}, id="MatMul-batched-weights"),
    _c("MatMul", {"a": [4], "b": [2, 4, 3]}, id="MatMul-vector"),
    _c("MatMul", {"a": [2, 1, 3, 4], "b": [3, 4, 2]}, id="MatMul-broadcast-batch"),
    _c("Gemm", {"a": [4, 3], "b": [5, 4], "c": [5]}, attrs=dict(transA=1, transB=1, alpha=0.5, beta=2.0)),
    _c("Gemm", {"a": [3, 4], "b": [4, 5], "c": [3, 1]}, id="Gemm-plain"),
    # Add(MatMul(x, W), b): the fuse_matmul_bias pass makes it one ai.mithril::MatMulAdd node
    _c("MatMulAdd", {"x": [2, 3, 4], "w": [4, 5], "b": [5]},
       nodes=[helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y0"])]),
    # broadcasting arithmetic
    _c("Add", {"a": [3, 1, 4], "b": [2, 4]}),
    _c("Sub", {"a": [3, 1, 4], "b": [2, 4]}),
    _c("Mul", {"a": [3, 1, 4], "b": [4]}),
    _c("Div", {"a": [2, 4], "b": [3, 1, 4]}, positive=True),
    _c("Pow", {"a": [3, 4], "b": [4]}, positive=True),
    _c("Sum", {"a": [3, 4], "b": [4], "c": [3, 1]}),
    _c("Mean", {"a": [3, 4], "b": [4]}),
    _c("Max", {"a": [3, 4], "b": [4]}),
    _c("Min", {"a": [3, 4], "b": [3, 4]}),
    _c("Where", {"a": [3, 4], "b": [4]}, consts={"cond": np.array([[True, False, True, False]] * 3)},
       order=["cond", "a", "b"]),
    _c("Clip", {"x": [3, 4], "lo": [], "hi": [4]}, opset=13),
    _c("Clip", {"x": [3, 4]}, attrs=dict(min=-0.5, max=0.5), opset=6, id="Clip-attrs"),
    _c("PRelu", {"x": [2, 3, 4], "slope": [3, 1]}),
    # unary
    *[_c(op, {"x": [3, 4]}, positive=op in ("Log", "Sqrt", "Reciprocal"))
      for op in ("Relu", "Sigmoid", "Tanh", "Erf", "Exp", "Log", "Sqrt", "Neg", "Abs", "Reciprocal",
                 "Softplus", "Sin", "Cos", "HardSwish")],
    _c("LeakyRelu", {"x": [3, 4]}, attrs=dict(alpha=0.2)),
    _c("Elu", {"x": [3, 4]}, attrs=dict(alpha=0.7)),
    _c("HardSigmoid", {"x": [3, 4]}, attrs=dict(alpha=0.3, beta=0.4)),
    _c("Gelu", {"x": [3, 4]}, opset=20),
    _c("Gelu", {"x": [3, 4]}, attrs=dict(approximate="tanh"), opset=20, id="Gelu-tanh"),
    # convolution
    _c("Conv", {"x": [2, 4, 7], "w": [6, 2, 3], "b": [6]}, attrs=dict(group=2, pads=[1, 2], strides=[2]),
       id="Conv-1d-groups"),
    _c("Conv", {"x": [2, 3, 7, 6], "w": [4, 3, 3, 2], "b": [4]},
       attrs=dict(strides=[2, 1], pads=[1, 0, 2, 1], dilations=[1, 2]), id="Conv-2d-strides-dilations"),
    _c("Conv", {"x": [1, 4, 6, 6], "w": [4, 1, 3, 3]}, attrs=dict(group=4, auto_pad="SAME_UPPER", strides=[2, 2]),
       id="Conv-depthwise-same"),
    _c("Conv", {"x": [1, 2, 4, 5, 4], "w": [3, 2, 2, 3, 2]}, attrs=dict(pads=[1, 0, 1, 0, 1, 1]), id="Conv-3d"),
    # pooling
    _c("MaxPool", {"x": [2, 3, 7, 6]}, attrs=dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 1])),
    _c("MaxPool", {"x": [1, 2, 7, 7]}, attrs=dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1, dilations=[2, 1]),
       id="MaxPool-ceil-dilations"),
    _c("AveragePool", {"x": [2, 3, 7, 6]}, attrs=dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    _c("AveragePool", {"x": [2, 3, 7, 6]},
       attrs=dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 1, 1, 0], count_include_pad=1, ceil_mode=1),
       id="AveragePool-include-pad"),
    _c("GlobalAveragePool", {"x": [2, 3, 4, 5]}),
    _c("GlobalMaxPool", {"x": [2, 3, 4, 5]}),
    # normalization
    _c("BatchNormalization", {"x": [2, 3, 4, 2], "s": [3], "b": [3], "m": [3], "v": [3]}, positive=True,
       attrs=dict(epsilon=1e-3), opset=15),
    _c("BatchNormalization", {"x": [4, 3, 2], "s": [3], "b": [3]}, attrs=dict(training_mode=1), opset=15,
       consts={"m": np.zeros(3), "v": np.ones(3)}, id="BatchNormalization-training"),
    _c("LayerNormalization", {"x": [2, 3, 4], "s": [4], "b": [4]}, attrs=dict(axis=-1, stash_type=F64), opset=17),
    _c("LayerNormalization", {"x": [2, 3, 4], "s": [3, 4]}, attrs=dict(axis=1, epsilon=1e-3, stash_type=F64), opset=17,
       id="LayerNormalization-axis1"),
    _c("Softmax", {"x": [2, 3, 4]}, attrs=dict(axis=1), opset=13),
    _c("Softmax", {"x": [2, 3, 4]}, attrs=dict(axis=1), opset=11, id="Softmax-coerced"),
    _c("LogSoftmax", {"x": [2, 3, 4]}, attrs=dict(axis=-1), opset=13),
    _c("LogSoftmax", {"x": [2, 3, 4]}, attrs=dict(axis=1), opset=11, id="LogSoftmax-coerced"),
    # reductions
    _c("ReduceSum", {"x": [2, 3, 4]}, consts={"axes": _i64(0, -1)}, attrs=dict(keepdims=0), opset=13),
    _c("ReduceMean", {"x": [2, 3, 4]}, attrs=dict(axes=[1]), opset=13, id="ReduceMean-attr"),
    _c("ReduceMean", {"x": [2, 3, 4]}, consts={"axes": _i64(1, 2)}, attrs=dict(keepdims=0)),
    _c("ReduceMax", {"x": [2, 3, 4]}, consts={"axes": _i64(1)}),
    _c("ReduceMin", {"x": [2, 3, 4]}, attrs=dict(keepdims=0)),
    _c("ReduceSumSquare", {"x": [2, 3, 4]}, consts={"axes": _i64(2)}),
    _c("ReduceL2", {"x": [2, 3, 4]}, consts={"axes": _i64(0)}),
    _c("ReduceLogSumExp", {"x": [2, 3, 4]}, consts={"axes": _i64(1)}),
    # shape and indexing
    _c("Reshape", {"x": [2, 3, 4]}, consts={"shape": _i64(4, -1)}),
    _c("Transpose", {"x": [2, 3, 4]}, attrs=dict(perm=[1, 2, 0])),
    _c("Concat", {"a": [2, 3], "b": [2, 1], "c": [2, 2]}, attrs=dict(axis=-1)),
    _c("Split", {"x": [5, 3]}, consts={"split": _i64(2, 3)}, attrs=dict(axis=0), outputs=2),
    _c("Slice", {"x": [5, 6]}, consts={"starts": _i64(4, 1), "ends": _i64(0, 100), "axes": _i64(0, 1),
                                       "steps": _i64(-2, 2)}),
    _c("Gather", {"x": [3, 4]}, consts={"idx": _i64(0, -1, 3, 0)}, attrs=dict(axis=1)),
    _c("GatherElements", {"x": [3, 4]}, consts={"idx": np.array([[0, 0], [1, -1], [3, 0]])}, attrs=dict(axis=1)),
    _c("Squeeze", {"x": [2, 1, 3]}, consts={"axes": _i64(1)}),
    _c("Unsqueeze", {"x": [2, 3]}, consts={"axes": _i64(0, 3)}),
    _c("Expand", {"x": [3, 1]}, consts={"shape": _i64(2, 3, 4)}),
    _c("Flatten", {"x": [2, 3, 4]}, attrs=dict(axis=2)),
    _c("Identity", {"x": [2, 3]}),
    _c("Tile", {"x": [2, 3]}, consts={"r": _i64(2, 3)}),
    _c("Pad", {"x": [2, 3], "v": []}, consts={"pads": _i64(1, -1, 2, 1)}, order=["x", "pads", "v"]),
    _c("Dropout", {"x": [3, 4]}, outputs=1, id="Dropout-inference"),
    _c("Dropout", {"x": [4, 5]}, consts={"training": np.array(True)}, attrs=dict(seed=3),
       nodes=[helper.make_node("Dropout", ["x", "", "training"], ["y0"], seed=3)], id="Dropout-training"),
    _c("Cast", {"x": [3]}, nodes=[helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT),
                                  helper.make_node("Cast", ["h"], ["y0"], to=F64)]),
    # Resize: nearest and linear, up and down, the coordinate modes the exporters use
    _c("Resize", {"x": [1, 2, 3, 4]}, consts={"roi": np.zeros(0), "scales": np.array([1, 1, 2.0, 1.5])},
       attrs=dict(mode="nearest"), opset=13, id="Resize-nearest"),
    _c("Resize", {"x": [1, 2, 4, 4]}, consts={"roi": np.zeros(0), "scales": np.array([1, 1, 1.5, 0.5])},
       attrs=dict(mode="linear", coordinate_transformation_mode="half_pixel"), opset=13, id="Resize-linear"),
    _c("Resize", {"x": [1, 2, 3, 4]}, consts={"roi": np.zeros(0), "scales": np.zeros(0), "sizes": _i64(1, 2, 5, 7)},
       attrs=dict(mode="linear", coordinate_transformation_mode="align_corners"), opset=19, id="Resize-sizes"),
    # a value read twice, and an output also read inside the graph: gradients add up
    _c("fanout", {"x": [3, 4], "w": [4, 4]}, outputs=2, nodes=[
        helper.make_node("MatMul", ["x", "w"], ["y0"]),
        helper.make_node("Mul", ["y0", "y0"], ["h"]),
        helper.make_node("Add", ["h", "x"], ["y1"]),
    ]),
]


def _data(case, rng):
    data = {}
    for n, s in case.inputs.items():
        v = rng.standard_normal(s)
        data[n] = np.abs(v) + 0.5 if case.positive else v
    return data


def _directional_checks(f, data, name, grad, count=3, eps=1e-6):
    """Central differences along random directions v: (f(x + eps v) - f(x - eps v)) / 2eps = <grad, v>.
    Any wrong component of the gradient changes <grad, v> for a random v."""
    rng = np.random.default_rng(7)
    x = data[name]
    for _ in range(count):
        v = rng.standard_normal(x.shape)
        numeric = (f({**data, name: x + eps * v}) - f({**data, name: x - eps * v})) / (2 * eps)
        yield numeric, float(np.sum(grad * v))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_rule_matches_finite_differences(case):
    rng = np.random.default_rng(0)
    pm = ml.compile(ml.load_onnx(case.model()), ml.NumpyBackend(dtype=ml.float64), data_keys=set(case.inputs))
    data = _data(case, rng)
    out = pm.evaluate(None, data)
    cot = {k: rng.standard_normal(np.shape(v)) for k, v in out.items()}
    got_out, grads = pm.evaluate(None, data, output_gradients=cot)
    for k in out:
        np.testing.assert_allclose(got_out[k], out[k])
    assert set(grads) == set(case.inputs)

    def loss(d):
        return sum(float(np.sum(v * cot[k])) for k, v in pm.evaluate(None, d).items())

    for name in case.inputs:
        assert grads[name].shape == data[name].shape and grads[name].dtype == np.float64, name
        # Through float32 (Cast) the function is linear but rounded: a wide step, a float32 tolerance.
        tol, eps = (1e-5, 1e-2) if case.id == "Cast" else (1e-6, 1e-6)
        for numeric, analytic in _directional_checks(loss, data, name, grads[name], eps=eps):
            assert analytic == pytest.approx(numeric, rel=tol, abs=tol), name


def test_every_rule_is_covered():
    covered = {c.op for c in CASES} | {n.op_type for c in CASES for n in (c.nodes or [])}
    # Rules checked elsewhere in this file: StopGradient (the frontend test), legacy spellings
    # (Upsample, Resize-10, CastLike) share their bodies with the cases above.
    elsewhere = {"StopGradient", "Upsample", "CastLike"}
    missing = {op for _, op in RULES.ops()} - covered - elsewhere
    assert not missing, f"rules without a finite-difference case: {sorted(missing)}"


def test_stop_gradient_stops_the_gradient():
    from mithril.models import Linear, Model, Multiply, StopGradient

    model = Model()
    model |= Linear(dimension=3)(input="input", output="h")
    model |= StopGradient()(input="h", output="hs")
    model |= Multiply()(left="h", right="hs", output="output")
    pm = ml.compile(model, ml.NumpyBackend(dtype=ml.float64), shapes={"input": [2, 4]})
    rng = np.random.default_rng(0)
    x, g = rng.standard_normal((2, 4)), rng.standard_normal((2, 3))
    params = pm.randomize_params()
    _, grads = pm.evaluate(params, {"input": x}, output_gradients={"output": g})
    W, b = params["linear_0.weight"], params["linear_0.bias"]
    h = x @ W.T + b
    # d/dW of h * stop(h) is hs * dh/dW: half of d/dW (h * h).
    np.testing.assert_allclose(grads["linear_0.weight"], (g * h).T @ x, rtol=1e-12)
    np.testing.assert_allclose(grads["linear_0.bias"], (g * h).sum(0), rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# The generated program and the compile-time error


def _sinh_model():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"),
             helper.make_node("Sinh", ["h"], ["y"], name="odd_activation")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F64, [2, 3])],
                              [helper.make_tensor_value_info("y", F64, [2, 3])],
                              [numpy_helper.from_array(np.eye(3), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_an_op_without_a_rule_is_found_at_compile_naming_the_node():
    # Compiled without a loss the model may only ever run forward: compile keeps the error for
    # the first gradient request.
    pm = ml.compile(ml.load_onnx(_sinh_model()), ml.NumpyBackend(dtype=ml.float64))
    assert isinstance(pm.gradient_error, NoGradientRuleError)
    assert pm.gradient_error.missing == [("odd_activation", "Sinh", 18)]
    x = np.ones((2, 3))
    np.testing.assert_allclose(pm.evaluate(None, {"x": x})["y"], np.sinh(x))
    with pytest.raises(NoGradientRuleError, match=r"node 'odd_activation': op Sinh \(opset 18\)"):
        pm.evaluate(None, {"x": x}, output_gradients={"y": np.ones((2, 3))})
    # With nothing to differentiate on its path, the op needs no rule.
    pm = ml.compile(ml.load_onnx(_sinh_model()), ml.NumpyBackend(dtype=ml.float64), trainable_keys=())
    out, grads = pm.evaluate(None, {"x": x}, output_gradients={"y": np.ones((2, 3))})
    assert pm.gradient_error is None and grads == {}
    # Naming what to differentiate is asking for gradients: compile itself fails.
    with pytest.raises(NoGradientRuleError, match=r"node 'odd_activation': op Sinh \(opset 18\)"):
        ml.compile(ml.load_onnx(_sinh_model()), ml.NumpyBackend(dtype=ml.float64), trainable_keys=["w"])
    with pytest.raises(NoGradientRuleError, match="odd_activation"):
        ml.compile(ml.load_onnx(_sinh_model()), ml.NumpyBackend(dtype=ml.float64), data_keys={"x"})


def test_a_model_compiled_to_train_fails_at_compile_naming_the_node():
    import models_zoo
    from mithril.models import CrossEntropy, Mean, TrainModel

    tm = TrainModel(models_zoo.lstm_classifier(vocab_size=10, embed_dim=4, hidden_size=4, num_classes=2))
    tm.add_loss(CrossEntropy(input_type="logits"), input="output", target="target", reduce_steps=[Mean()])
    with pytest.raises(NoGradientRuleError, match=r"op LSTM"):
        ml.compile(tm, ml.NumpyBackend(), shapes={"input": [2, 5], "target": [2]}, data_keys={"input", "target"})


def test_gradient_program_has_one_rule_line_per_node_in_reverse():
    case = next(c for c in CASES if c.id == "fanout")
    pm = ml.compile(ml.load_onnx(case.model()), ml.NumpyBackend(dtype=ml.float64), data_keys={"x", "w"})
    code = pm.backward.code
    rules = re.findall(r"# (\w+) '[^']*' \(vjp\)", code)
    assert rules == ["Add", "Mul", "MatMul"], code
    assert "del " in code.split("outputs = {")[1]  # values are freed during the backward pass
    # Asking for fewer names lowers a smaller program.
    pm.trainable_keys, pm.data_keys = set(), {"w"}
    _, grads = pm.evaluate({}, {"x": np.ones((3, 4)), "w": np.eye(4)}, output_gradients={"y1": np.ones((3, 4))})
    assert set(grads) == {"w"}


# ---------------------------------------------------------------------------------------------
# Whole models: NumPy gradients equal JAX's and Torch's


def _backends(only=None, dtype=ml.float64):
    out = []
    for name in ("JaxBackend", "TorchBackend") if only is None else (only,):
        cls = getattr(ml, name, None)
        try:
            out.append(cls(dtype=dtype))
        except Exception:  # noqa: BLE001 - a missing framework just drops that column
            pass
    if only is not None and not out:
        pytest.skip(f"{only} is not installed")
    assert out, "neither JAX nor Torch is installed: nothing to compare NumPy's gradients with"
    return out


def _gradients(model, backend, shapes, data, data_keys, cot, params=None):
    pm = ml.compile(model, backend, shapes=shapes, data_keys=data_keys)
    if params is None:
        params = {k: np.asarray(backend.to_numpy(v)) for k, v in pm.randomize_params().items()}
    out, grads = pm.evaluate({k: backend.from_numpy(v) for k, v in params.items()},
                             {k: backend.from_numpy(v) for k, v in data.items()},
                             output_gradients={k: backend.from_numpy(v) for k, v in cot.items()})
    return params, {k: np.asarray(backend.to_numpy(v)) for k, v in grads.items()}


def _assert_same_gradients(got, want, rtol, who):
    assert set(got) == set(want), (who, set(got) ^ set(want))
    # A gradient that is zero in exact arithmetic (an attention key's bias) is rounding noise in
    # both: compare it against the largest gradient of the model.
    floor = 1e-6 * max(float(np.max(np.abs(w))) for w in want.values() if w.size)
    for k, w in want.items():
        scale = max(float(np.max(np.abs(w))) if w.size else 0.0, floor)
        err = float(np.max(np.abs(got[k] - w))) if w.size else 0.0
        assert err <= rtol * scale, f"{who}: {k} differs by {err:.3g} (scale {scale:.3g})"


def _zoo(name):
    import models_zoo

    if name == "mlp":
        return models_zoo.mlp(), {"input": [4, 64]}, 10
    if name == "lenet":
        return models_zoo.lenet(num_classes=10), {"input": [2, 1, 32, 32]}, 10
    if name == "resnet18":
        return models_zoo.resnet18(num_classes=10), {"input": [2, 3, 32, 32]}, 10
    raise KeyError(name)


# XLA takes ~18 s to compile ResNet-18's vjp on the CPU: ResNet-18 (zoo and imported) meets JAX in
# the slow run only; Torch checks it every time, and lenet/GPT/BERT take JAX's Conv, pools, attention.
ZOO_PAIRS = [(m, b) for m in ("mlp", "lenet") for b in ("JaxBackend", "TorchBackend")]
# ResNet-18 against JAX: 25-30 s of XLA compile each; the fast tier checks it against Torch.
_RESNET_ON_JAX = pytest.mark.long(reason="ResNet-18's gradients against JAX (XLA compiles for ~30 s); the fast tier "
                                         "compares them with Torch's")
ZOO_PAIRS += [("resnet18", "TorchBackend"), pytest.param("resnet18", "JaxBackend", marks=_RESNET_ON_JAX)]


@pytest.mark.parametrize("name, backend_name", ZOO_PAIRS)
def test_zoo_gradients_match_autodiff_backends(name, backend_name):
    model, shapes, classes = _zoo(name)
    rng = np.random.default_rng(1)
    data = {"input": rng.standard_normal(shapes["input"])}
    cot = {"output": rng.standard_normal((shapes["input"][0], classes))}
    params, ref = _gradients(model, ml.NumpyBackend(dtype=ml.float64), shapes, data, {"input"}, cot)
    assert "input" in ref and len(ref) > 2
    for backend in _backends(backend_name):
        _, got = _gradients(model, backend, shapes, data, {"input"}, cot, params)
        _assert_same_gradients(ref, got, 1e-4, type(backend).__name__)


def test_gpt_gradients_match_autodiff_backends():
    import models_zoo

    model = models_zoo.create_gpt(bias=True, block_size=8, dims=16, num_heads=2, num_layers=1, vocab_size=20)
    shapes = {"input": [2, 8]}
    rng = np.random.default_rng(2)
    data = {"input": rng.integers(0, 20, (2, 8)).astype(np.int64)}
    cot = {"output": rng.standard_normal((2, 8, 20))}
    params, ref = _gradients(model, ml.NumpyBackend(dtype=ml.float64), shapes, data, set(), cot)
    for backend in _backends():
        _, got = _gradients(model, backend, shapes, data, set(), cot, params)
        _assert_same_gradients(ref, got, 1e-4, type(backend).__name__)


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("name, backend_name", [
    ("resnet18", "TorchBackend"), pytest.param("resnet18", "JaxBackend", marks=_RESNET_ON_JAX),
    ("bert", "TorchBackend"), ("bert", "JaxBackend"),
])
def test_imported_gradients_match_autodiff_backends(name, backend_name):
    if name == "bert":
        pytest.importorskip("transformers", reason="transformers builds the BERT model")
    from models_zoo import torch_reference

    spec = torch_reference.build(name, image_size=32, seq=8)
    onnx_bytes = torch_reference.export_onnx(spec, "torchscript")
    data = spec.numpy_inputs(2)
    shapes = {k: list(v.shape) for k, v in data.items()}
    floating = {k for k, v in data.items() if v.dtype.kind == "f"}
    import torch

    with torch.no_grad():
        outs = spec.module(*spec.inputs.values())
    outs = outs if isinstance(outs, tuple) else (outs,)
    rng = np.random.default_rng(3)
    cot = {k: rng.standard_normal(tuple(o.shape)).astype(np.float32) for k, o in zip(spec.output_names, outs)}
    params, ref = _gradients(ml.load_onnx(onnx_bytes), ml.NumpyBackend(), shapes, data, floating, cot)
    assert len(ref) > 10
    # float32 as the reference: a float64 backend would convert the float32 file to float64.
    for backend in _backends(backend_name, dtype=ml.float32):
        _, got = _gradients(ml.load_onnx(onnx_bytes), backend, shapes, data, floating, cot, params)
        _assert_same_gradients(ref, got, 2e-4, type(backend).__name__)
