"""Loaded ONNX models as frontend blocks (OnnxBlock): composed with new blocks and a loss, they
compile, export, and evaluate like the original graph; names, shapes and opsets carry over."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mithril as ml
from mithril.cli import available_backends
from mithril.errors import ModelError, ShapeMismatchError
from mithril.frontend.onnx_block import OnnxBlock
from mithril.models import IOKey, Linear, Mean, Model, Relu, SquaredError

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(0)
W = RNG.standard_normal((4, 6)).astype(np.float32)
W2 = RNG.standard_normal((6,)).astype(np.float32)


def _backbone(opset: int = 17, declare_output_shape: bool = True) -> onnx.ModelProto:
    """x [N, 4] -> MatMul W -> Relu -> Reshape(int64 shape initializer) -> If(sum > 0: * W2, else: - W2).
    The If branches read W2 and the Relu output from the outer scope."""
    then = helper.make_graph([helper.make_node("Mul", ["r", "W2"], ["t_out"])], "then", [],
                             [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Sub", ["r", "W2"], ["e_out"])], "else", [],
                              [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, None)])
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("Relu", ["h"], ["h_relu"]),
        helper.make_node("Reshape", ["h_relu", "shape"], ["r"]),
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["cond"]),
        helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other),
    ]
    out_shape = ["N", 6] if declare_output_shape else None
    graph = helper.make_graph(
        nodes, "backbone", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(W2, "W2"),
         numpy_helper.from_array(np.array([-1, 6], np.int64), "shape"),
         numpy_helper.from_array(np.array(0, np.float32), "zero")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _reference(x: np.ndarray) -> np.ndarray:
    r = np.maximum(x @ W, 0)
    return r * W2 if x.sum() > 0 else r - W2


def _with_head(backbone, **bindings) -> Model:
    model = Model()
    model |= OnnxBlock(backbone, name="backbone")(x="input", y=IOKey("features", expose=True), **bindings)
    model += Linear(dimension=3)(output="output")
    return model


def test_backbone_terminals_params_and_symbolic_shapes():
    model = _with_head(ml.load_onnx(_backbone()))
    assert model.shape_of("features") == "[N, 6]"  # the declared dim_param stays a shared symbol
    assert model.shape_of("output") == "[N, 3]"
    pm = ml.compile(model, ml.NumpyBackend(), shapes={"input": [2, 4]})
    # float initializers are parameters under the block's name; the int64 Reshape shape is a constant
    assert sorted(pm.parameter_keys) == ["backbone.W", "backbone.W2", "backbone.zero", "linear_0.bias",
                                         "linear_0.weight"]
    assert sorted(model.backbone.pretrained_params()) == ["backbone.W", "backbone.W2", "backbone.zero"]


@pytest.mark.parametrize("sign", [1.0, -1.0])  # both If branches
def test_composed_model_evaluates_like_the_original_graph_and_exports(sign):
    model = _with_head(ml.load_onnx(_backbone()))
    pm = ml.compile(model, ml.NumpyBackend(), shapes={"input": [3, 4]})
    params = {k: np.asarray(v) for k, v in pm.randomize_params().items()}
    params.update(model.backbone.pretrained_params())
    x = sign * np.abs(RNG.standard_normal((3, 4))).astype(np.float32)
    out = pm.evaluate(params, {"input": x})
    np.testing.assert_allclose(out["features"], _reference(x), rtol=1e-6, atol=1e-6)
    head = out["features"] @ params["linear_0.weight"].T + params["linear_0.bias"]
    np.testing.assert_allclose(out["output"], head, rtol=1e-5, atol=1e-6)

    proto = ml.export_onnx(model, params=params, dynamic_axes={"input": [0]})
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    got = dict(zip([o.name for o in session.get_outputs()], session.run(None, {"input": x})))
    np.testing.assert_allclose(got["output"], out["output"], rtol=1e-5, atol=1e-6)
    # the batch axis stays dynamic through the imported graph
    x5 = sign * np.abs(RNG.standard_normal((5, 4))).astype(np.float32)
    np.testing.assert_allclose(session.run(["features"], {"input": x5})[0], _reference(x5), rtol=1e-6, atol=1e-6)
    # value names inside the copied graph (subgraphs too) are prefixed by the block's path
    names = {o for n in proto.graph.node for o in n.output}
    assert "backbone/h" in names and "backbone/r" in names
    if_node = next(n for n in proto.graph.node if n.op_type == "If")
    assert list(if_node.attribute[0].g.node[0].input) == ["backbone/r", "backbone.W2"]


def test_composed_with_a_loss_on_every_backend():
    model = _with_head(ml.load_onnx(_backbone()))
    model |= SquaredError()(input=model.linear_0.output, target="target")
    model += Mean()(output="loss")
    x = np.abs(RNG.standard_normal((2, 4))).astype(np.float32)
    target = RNG.standard_normal((2, 3)).astype(np.float32)
    shapes = {"input": [2, 4], "target": [2, 3]}
    ref_pm = ml.compile(model, ml.NumpyBackend(), shapes=shapes)
    params = {k: np.asarray(v) for k, v in ref_pm.randomize_params().items()}
    params.update(model.backbone.pretrained_params())
    head = _reference(x) @ params["linear_0.weight"].T + params["linear_0.bias"]
    want = np.mean((head - target) ** 2)
    for name, cls in available_backends().items():
        try:
            backend = cls()
        except ml.MithrilError:
            continue
        pm = ml.compile(model, backend, shapes=shapes)
        out = pm.evaluate({k: backend.from_numpy(v) for k, v in params.items()},
                          {"input": backend.from_numpy(x), "target": backend.from_numpy(target)})
        np.testing.assert_allclose(backend.to_numpy(out["loss"]), want, rtol=1e-5, err_msg=name)


def test_onnx_model_is_usable_directly_in_composition():
    backbone = ml.load_onnx(_backbone())
    model = Model()
    model |= backbone(x="input", y="features")
    model += Relu()
    model += Linear(dimension=2).connect(output="output")
    assert model.shape_of("output") == "[N, 2]"
    pm = ml.compile(model, ml.NumpyBackend(), shapes={"input": [2, 4]})
    assert "onnx_model_0.W" in pm.parameter_keys


def test_onnx_model_added_without_bindings_or_with_connect():
    # Loading knows no frontend: calling the loaded model only records the bindings, and the model
    # it is added to makes the OnnxBlock.
    backbone = ml.load_onnx(_backbone())
    model = Model()
    model |= backbone
    assert isinstance(model.onnx_model_0, OnnxBlock)
    other = Model()
    other |= backbone.connect(x="input", y="features")
    assert other.shape_of("features") == "[N, 6]"
    with pytest.raises(ModelError, match="is bound to a block"):
        Model().extend(Relu(), input=backbone)


@pytest.mark.filterwarnings("ignore::mithril.frontend.onnx_export.RandomParamsWarning")
def test_output_shape_inferred_from_concrete_input_shape():
    # The graph declares no output shape: ONNX shape inference fills it from the bound input's.
    model = Model()
    model |= OnnxBlock(_backbone(declare_output_shape=False))(x=IOKey("input", shape=[2, 4]), y="features")
    model += Linear(dimension=3)(output="output")
    assert model.shape_of("output") == "[2, 3]"
    ml.export_onnx(model)


def test_nested_block_parameter_names():
    inner = Model(name="encoder")
    inner |= OnnxBlock(_backbone(), name="backbone")(x="input", y="output")
    model = Model()
    model |= inner(input="input")
    model += Linear(dimension=3)(output="output")
    pm = ml.compile(model, ml.NumpyBackend(), shapes={"input": [2, 4]})
    pretrained = inner.backbone.pretrained_params()
    assert sorted(pretrained) == ["encoder.backbone.W", "encoder.backbone.W2", "encoder.backbone.zero"]
    assert set(pretrained) <= set(pm.parameter_keys)


def test_older_opset_is_converted_where_an_op_changed():
    # ReduceMean's axes move from attribute (13) to input (18): the copy must follow the export opset.
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["x"], ["m"], axes=[1], keepdims=0),
         helper.make_node("Mul", ["m", "s"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"])],
        [numpy_helper.from_array(np.array(2.0, np.float32), "s")])
    old = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model = Model()
    model |= OnnxBlock(old, name="old")(x="input", y="output")
    proto = ml.export_onnx(model, params=model.old.pretrained_params())
    assert proto.opset_import[0].version >= 18
    reduce = next(n for n in proto.graph.node if n.op_type == "ReduceMean")
    assert len(reduce.input) == 2 and not reduce.attribute[0].name == "axes"
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    got = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"input": x})
    np.testing.assert_allclose(got[0], 2 * x.mean(axis=1), rtol=1e-6)


def test_shape_conflict_names_both_terminals():
    model = Model()
    model |= OnnxBlock(_backbone(), name="backbone")(x="input", y="features")
    with pytest.raises(ShapeMismatchError, match=r"linear_0\.weight.*'w'"):
        model |= Linear(dimension=3)(input="features", weight=IOKey("w", shape=[3, 5]))


def test_foreign_domain_is_refused():
    graph = helper.make_graph([helper.make_node("FusedGemm", ["x", "x"], ["y"], domain="com.microsoft")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    with pytest.raises(ModelError, match="com.microsoft"):
        OnnxBlock(proto)


def test_torch_resnet_backbone_keeps_its_weights():
    torch = pytest.importorskip("torch")
    from models_zoo import torch_reference

    spec = torch_reference.build("resnet18", image_size=32)
    backbone = ml.load_onnx(torch_reference.export_onnx(spec, "torchscript"))
    model = Model()
    model |= OnnxBlock(backbone, name="backbone")(input="input", output=IOKey("features", expose=True))
    model += Linear(dimension=10)(output="output")
    assert model.shape_of("features") == "[batch, 1000]"  # the exporter's dim_param
    pm = ml.compile(model, ml.NumpyBackend(), shapes={"input": [2, 3, 32, 32]})
    params = {k: np.asarray(v) for k, v in pm.randomize_params().items()}
    params.update(model.backbone.pretrained_params())
    assert "backbone.fc.weight" in params
    x = spec.numpy_inputs(2)["input"]
    out = pm.evaluate(params, {"input": x})
    with torch.no_grad():
        want = spec.module(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(out["features"], want, rtol=1e-4, atol=1e-5)
