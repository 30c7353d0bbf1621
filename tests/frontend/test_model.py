"""The logical-model frontend: composition, operators, shape inference, export, names, errors."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import mithril as ml
from mithril.errors import (
    CycleError,
    DuplicateOutputError,
    MissingShapeError,
    ModelError,
    ShapeMismatchError,
    TypeMismatchError,
    UnconnectedInputError,
)
from mithril.frontend.onnx_export import RandomParamsWarning, default_opset
from mithril.models import (
    MLP,
    Add,
    Convolution2D,
    CrossEntropy,
    Flatten,
    IOKey,
    Linear,
    MaxPool2D,
    Mean,
    Model,
    Relu,
    Softmax,
)

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(1)
pytestmark = pytest.mark.filterwarnings("ignore::mithril.frontend.onnx_export.RandomParamsWarning")


def issue_model() -> Model:
    model = Model()
    model |= Linear(dimension=32)(input="input", output="hidden")
    model += Relu()
    model += Linear(dimension=16).connect(output="output")
    return model


def ort_run(proto, feeds):
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


# -- composition --------------------------------------------------------------------------------
def test_issue_example_compiles_exports_and_matches_onnxruntime(tmp_path):
    model = issue_model()
    pm = ml.compile(model, ml.NumpyBackend(), shapes={"input": [8, 64]}, data_keys={"input"})
    params = pm.randomize_params()
    x = RNG.standard_normal((8, 64)).astype(np.float32)
    got = pm.evaluate(params, {"input": x})
    proto = ml.export_onnx(model, tmp_path / "model.onnx", shapes={"input": [8, 64]}, params=params)
    assert (tmp_path / "model.onnx").exists()
    assert [i.name for i in proto.graph.input] == ["input"]
    assert [o.name for o in proto.graph.output] == ["output"]
    np.testing.assert_allclose(got["output"], ort_run(proto, {"input": x})["output"], rtol=1e-5, atol=1e-5)
    # by hand: the chain really is linear -> relu -> linear
    h = np.maximum(x @ params["linear_0.weight"].T + params["linear_0.bias"], 0)
    np.testing.assert_allclose(got["output"], h @ params["linear_1.weight"].T + params["linear_1.bias"],
                               rtol=1e-5, atol=1e-5)


def test_parameter_names_are_stable_across_compile_export_and_backends():
    model = Model()
    model |= MLP(activations=[Relu, None], dimensions=[8, 3])(input="input", output="h")
    model += Linear(dimension=2)(weight=IOKey("w_out"), output="output")
    names = {"mlp_0.linear_0.weight", "mlp_0.linear_0.bias", "mlp_0.linear_1.weight", "mlp_0.linear_1.bias",
             "w_out", "linear_0.bias"}
    pm = ml.compile(model, ml.NumpyBackend(), shapes={"input": [4, 5]})
    assert set(pm.parameter_keys) == names
    params = pm.randomize_params()
    proto = ml.export_onnx(model, None, shapes={"input": [4, 5]}, params=params)
    assert {i.name for i in proto.graph.initializer} == names
    # a second build of the same structure gives the same names
    again = Model()
    again |= MLP(activations=[Relu, None], dimensions=[8, 3])(input="input", output="h")
    again += Linear(dimension=2)(weight=IOKey("w_out"), output="output")
    assert set(ml.compile(again, ml.NumpyBackend(), shapes={"input": [4, 5]}).parameter_keys) == names
    try:
        jax_pm = ml.compile(model, ml.JaxBackend(), shapes={"input": [4, 5]})
    except ml.errors.BackendUnavailableError:
        return
    assert set(jax_pm.parameter_keys) == names
    x = RNG.standard_normal((4, 5)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(jax_pm.evaluate({k: np.asarray(v) for k, v in params.items()},
                                                          {"input": x})["output"]),
                               pm.evaluate(params, {"input": x})["output"], rtol=1e-4, atol=1e-5)


def test_iokey_binds_a_parameter_with_a_shape():
    m = Model()
    m |= Linear(dimension=4)(input="h", weight=IOKey("w", shape=[4, 7]), output="out")
    assert m.shape_of("h") == "[...v, 7]"
    assert m.shape_of("out") == "[...v, 4]"
    pm = ml.compile(m, ml.NumpyBackend(), shapes={"h": [2, 7]})
    assert "w" in pm.parameter_keys and "linear_0.bias" in pm.parameter_keys


def test_iokey_symbolic_dims_are_shared_and_exported_as_dim_params():
    m = Model()
    m |= Add()(left=IOKey("a", shape=["N", 3]), right=IOKey("b", shape=["N", 1]), output="out")
    assert m.shape_of("out") == "[N, 3]"
    proto = ml.export_onnx(m)
    dims = [[d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in list(proto.graph.input) + list(proto.graph.output)]
    assert dims == [["N", 3], ["N", 1], ["N", 3]]


def test_operators_build_blocks():
    m = Model()
    m |= Linear(dimension=6)(input="x", output="h")
    h, x = m.h, m.x
    m |= Add()(left=(h * 2.0 + 1.0) @ m.h.T, right=x[..., 1:].sum(axis=-1, keepdim=True), output="y")
    m.set_outputs(z=h.reshape(-1).max(), neg=-abs(h) - h / 3.0)
    m.set_outputs(flags=(h > 0.0) & (h < 1.0))
    pm = ml.compile(m, ml.NumpyBackend(), shapes={"x": [4, 5]})
    params = pm.randomize_params()
    x_val = RNG.standard_normal((4, 5)).astype(np.float32)
    out = pm.evaluate(params, {"x": x_val})
    hv = x_val @ params["linear_0.weight"].T + params["linear_0.bias"]
    np.testing.assert_allclose(out["y"], (hv * 2 + 1) @ hv.T + x_val[..., 1:].sum(-1, keepdims=True), rtol=1e-4)
    np.testing.assert_allclose(out["z"], hv.max(), rtol=1e-6)
    np.testing.assert_allclose(out["neg"], -np.abs(hv) - hv / 3, rtol=1e-5)
    np.testing.assert_array_equal(out["flags"], (hv > 0) & (hv < 1))
    proto = ml.export_onnx(m, None, shapes={"x": [4, 5]}, params=params)
    want = ort_run(proto, {"x": x_val})
    for k in want:
        np.testing.assert_allclose(out[k], want[k], rtol=1e-5, atol=1e-5)


def test_shape_inference_while_composing_keeps_unknown_dims_symbolic():
    m = Model()
    m |= Convolution2D(kernel_size=3, out_channels=8, padding="same")(input=IOKey("input", shape=["B", 3, 32, 32]))
    m += MaxPool2D(kernel_size=2)
    m += Flatten(start_dim=1)
    m += Linear(dimension=10)(output="output")
    assert m.shape_of("output") == "[B, 10]"
    assert m.shape_of("input") == "[B, 3, 32, 32]"
    text = m.summary(file=False)
    assert "convolution2d_0" in text and "[B, 8, 32, 32]" in text and "[10, 2048]" in text


def test_summary_prints_symbolic_shapes(capsys):
    issue_model().summary()
    out = capsys.readouterr().out
    assert "linear_0" in out and "[32, in]" in out and "'hidden'" in out


def test_chained_models_nest_and_export():
    head = Model()
    head |= Linear(dimension=3)(input="input", output="logits")
    head += Softmax()(output="output")
    m = Model()
    m |= MLP(activations=[Relu], dimensions=[5])(input="input")
    m += head(output="probs")
    pm = ml.compile(m, ml.NumpyBackend(), shapes={"input": [2, 4]})
    assert "model_0.linear_0.weight" in pm.parameter_keys
    out = pm.evaluate(pm.randomize_params(), {"input": np.ones((2, 4), np.float32)})
    np.testing.assert_allclose(out["probs"].sum(-1), 1.0, rtol=1e-6)


def test_loss_on_top_of_a_model():
    m = Model()
    m |= Linear(dimension=4)(input="input", output="logits")
    m |= CrossEntropy()(input="logits", target="target", output="per_sample")
    m += Mean()(output="loss")
    m.set_outputs("logits")  # read by CrossEntropy, so internal unless exposed
    feeds = {"input": RNG.standard_normal((6, 3)).astype(np.float32), "target": RNG.integers(0, 4, 6)}
    pm = ml.compile(m, ml.NumpyBackend(), shapes={k: v.shape for k, v in feeds.items()})
    params = pm.randomize_params()
    got = pm.evaluate(params, feeds)
    assert set(got) == {"logits", "loss"}
    want = ort_run(ml.export_onnx(m, None, shapes={k: v.shape for k, v in feeds.items()}, params=params), feeds)
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)


# -- export ---------------------------------------------------------------------------------------
def test_default_opset_is_the_newest_onnxruntime_loads():
    proto = ml.export_onnx(issue_model(), None, shapes={"input": [2, 64]})
    assert proto.opset_import[0].version == default_opset() >= 21


def test_dynamic_axes_stay_dynamic():
    model = issue_model()
    proto = ml.export_onnx(model, None, shapes={"input": [8, 64]}, dynamic_axes={"input": {0: "batch"}})
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert proto.graph.output[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    onnx.checker.check_model(proto, full_check=True)
    for n in (1, 5):
        assert ort_run(proto, {"input": np.ones((n, 64), np.float32)})["output"].shape == (n, 16)


def test_unknown_dims_become_dim_params():
    m = Model()
    m |= Linear(dimension=3)(input=IOKey("input", shape=[None, 4]), output="output")
    proto = ml.export_onnx(m)
    dim0 = proto.graph.input[0].type.tensor_type.shape.dim[0]
    assert dim0.dim_param and not dim0.HasField("dim_value")
    assert ort_run(proto, {"input": np.ones((7, 4), np.float32)})["output"].shape == (7, 3)


def test_export_without_params_warns_and_randomizes():
    with pytest.warns(RandomParamsWarning, match="linear_0.weight"):
        proto = ml.export_onnx(issue_model(), None, shapes={"input": [2, 64]})
    assert len(proto.graph.initializer) == 4


def test_params_from_another_backend_become_initializers():
    torch = pytest.importorskip("torch")
    model = issue_model()
    pm = ml.compile(model, ml.NumpyBackend(), shapes={"input": [2, 64]})
    params = {k: torch.from_numpy(np.asarray(v)) for k, v in pm.randomize_params().items()}
    proto = ml.export_onnx(model, None, shapes={"input": [2, 64]}, params=params)
    init = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
    np.testing.assert_array_equal(init["linear_1.bias"], params["linear_1.bias"].numpy())


def test_load_onnx_of_export_evaluates_the_same_as_compile():
    model = issue_model()
    pm = ml.compile(model, ml.NumpyBackend(), shapes={"input": [3, 64]})
    params = pm.randomize_params()
    loaded = ml.load_onnx(ml.export_onnx(model, None, shapes={"input": [3, 64]}, params=params))
    pm2 = ml.compile(loaded, ml.NumpyBackend())
    x = RNG.standard_normal((3, 64)).astype(np.float32)
    np.testing.assert_array_equal(pm2.evaluate(None, {"input": x})["output"],
                                  pm.evaluate(params, {"input": x})["output"])


def test_export_rejects_bad_params():
    model = issue_model()
    with pytest.raises(ShapeMismatchError, match="linear_0.bias"):
        ml.export_onnx(model, None, shapes={"input": [2, 64]}, params={"linear_0.bias": np.zeros(3)})
    with pytest.raises(ModelError, match="nope"):
        ml.export_onnx(model, None, shapes={"input": [2, 64]}, params={"nope": np.zeros(3)})


# -- errors ---------------------------------------------------------------------------------------
def test_shape_conflict_raises_at_the_line_naming_both_terminals_and_rolls_back():
    m = Model()
    m |= Linear(dimension=4)(input=IOKey("x", shape=[3, 5]), output="y")
    with pytest.raises(ShapeMismatchError) as info:
        m |= Linear(dimension=2)(input="y", weight=IOKey("w", shape=[2, 6]))
    msg = str(info.value)
    assert "linear_1.weight" in msg and "'w'" in msg and "[2, 4]" in msg and "[2, 6]" in msg
    assert len(m._blocks) == 1 and "w" not in m._named  # the failed line left no trace
    m |= Linear(dimension=2)(input="y", weight=IOKey("w", shape=[2, 4]), output="z")
    assert m.shape_of("z") == "[3, 2]"


def test_broadcast_conflict_names_the_block():
    m = Model()
    with pytest.raises(ShapeMismatchError, match=r"add_0.*cannot broadcast 3 with 4"):
        m |= Add()(left=IOKey("a", shape=[3]), right=IOKey("b", shape=[4]))


def test_type_conflict():
    m = Model()
    m |= Add()(left=IOKey("a", type=ml.int64), right="b", output="c")
    with pytest.raises(TypeMismatchError, match="float32"):
        m |= Add()(left="c", right=IOKey("d", type=ml.float32))


def test_unconnected_required_input():
    m = Model()
    m += Relu()
    m += Linear(dimension=2)(output="out")
    with pytest.raises(UnconnectedInputError, match=r"model 'model'.*relu_0\.input"):
        ml.compile(m, ml.NumpyBackend())


def test_cycle():
    m = Model()
    m |= Relu()(input="a", output="b")
    with pytest.raises(CycleError, match=r"relu_1\.output.*'a'"):
        m |= Relu()(input="b", output="a")


def test_duplicate_output_names():
    m = Model()
    m |= Relu()(input="a", output="y")
    with pytest.raises(DuplicateOutputError, match=r"'y' is already written by relu_0\.output"):
        m |= Relu()(input="b", output="y")


def test_shape_needed_by_compile_but_not_given():
    with pytest.raises(MissingShapeError, match=r"linear_0\.weight.*'input'"):
        ml.compile(issue_model(), ml.NumpyBackend())


def test_shapes_for_an_unknown_input():
    with pytest.raises(ShapeMismatchError, match="'nope'"):
        ml.compile(issue_model(), ml.NumpyBackend(), shapes={"nope": [1]})


def test_a_block_is_used_once():
    lin = Linear(dimension=2)
    m = Model()
    m |= lin(input="x")
    with pytest.raises(ModelError, match="already belongs"):
        m |= lin(input="y")


def test_unknown_terminal():
    with pytest.raises(ModelError, match="no terminal"):
        Model().extend(Relu()(inp="x"))


def test_summary_shows_symbolic_shapes_literally():
    # rich would read "[batch, 3]" as markup and drop it.
    from mithril.models import IOKey, Linear, Model

    m = Model()
    m |= Linear(dimension=4)(input=IOKey("input", shape=["batch", 3]), output="output")
    text = m.summary(file=False) if "file" in Model.summary.__code__.co_varnames else m.summary()
    assert "[batch, 3]" in text and "[batch, 4]" in text
