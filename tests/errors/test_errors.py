"""Bad input of every kind raises a MithrilError subclass that names what is wrong."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mithril as ml
from mithril import errors

from tests.conftest import make_model


def test_malformed_bytes():
    with pytest.raises(errors.OnnxLoadError, match="not a valid ONNX protobuf"):
        ml.load_onnx(b"\x08\x07\x12\xff\xff\xffgarbage")


def test_truncated_file(tmp_path, conv_model):
    data = conv_model.SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(errors.OnnxLoadError, match="cut.onnx"):
        ml.load_onnx(path)


def test_missing_file(tmp_path):
    with pytest.raises(errors.OnnxLoadError, match="no such file"):
        ml.load_onnx(tmp_path / "absent.onnx")


def test_unsupported_op_lists_every_node():
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="ok"),
        helper.make_node("NotAnOnnxOp", ["a"], ["b"], name="first_bad"),
        helper.make_node("AlsoMissing", ["b"], ["y"]),
    ]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, [2])])
    with pytest.raises(errors.UnsupportedOpsError) as info:
        ml.compile(ml.load_onnx(model), ml.NumpyBackend())
    msg = str(info.value)
    assert "first_bad: NotAnOnnxOp (opset 17)" in msg
    assert "AlsoMissing#2: AlsoMissing (opset 17)" in msg
    assert isinstance(info.value, ml.MithrilError)


def test_unsupported_domain_lists_nodes():
    nodes = [
        helper.make_node("FusedMatMul", ["x", "x"], ["a"], domain="com.example.first", name="fused"),
        helper.make_node("Binarizer", ["a"], ["y"], domain="com.example.second"),
    ]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [2, 2])], [("y", TensorProto.FLOAT, [2, 2])],
                       domains=("com.example.first", "com.example.second"))
    with pytest.raises(errors.UnsupportedDomainError) as info:
        ml.compile(ml.load_onnx(model), ml.NumpyBackend())
    msg = str(info.value)
    assert "unsupported domain" in msg and "com.example.first" in msg and "com.example.second" in msg
    assert "fused: com.example.first::FusedMatMul" in msg and "Binarizer#1" in msg


def test_missing_input(conv_model):
    pm = ml.compile(ml.load_onnx(conv_model), ml.NumpyBackend())
    with pytest.raises(errors.InputError, match=r"missing input\(s\) \['x'\]"):
        pm.evaluate(None, {})


def test_wrong_dtype_is_not_cast(conv_model):
    pm = ml.compile(ml.load_onnx(conv_model), ml.NumpyBackend())
    with pytest.raises(errors.DTypeError, match="expects float32 but got float64"):
        pm.evaluate(None, {"x": np.zeros((1, 4, 8, 8))})


def test_wrong_shape(conv_model):
    pm = ml.compile(ml.load_onnx(conv_model), ml.NumpyBackend(), shapes={"x": [2, 4, 8, 8]})
    with pytest.raises(errors.ShapeError, match=r"expects shape \[2, 4, 8, 8\] but got \[2, 4, 8, 9\]"):
        pm.evaluate(None, {"x": np.zeros((2, 4, 8, 9), np.float32)})


def test_shapes_that_contradict_the_model(conv_model):
    with pytest.raises(errors.ShapeError, match="dim 1 is fixed to 4"):
        ml.compile(ml.load_onnx(conv_model), ml.NumpyBackend(), shapes={"x": [2, 3, 8, 8]})


def test_kernel_failure_names_node_shapes_and_dtypes():
    # Static shapes that cannot broadcast: the failure is reported against the node.
    nodes = [helper.make_node("Add", ["a", "b"], ["y"], name="the_add")]
    model = make_model(nodes, [("a", TensorProto.FLOAT, ["N"]), ("b", TensorProto.FLOAT, ["M"])],
                       [("y", TensorProto.FLOAT, ["K"])])
    pm = ml.compile(ml.load_onnx(model), ml.NumpyBackend())
    with pytest.raises(errors.KernelError) as info:
        pm.evaluate(None, {"a": np.zeros(3, np.float32), "b": np.zeros(4, np.float32)})
    msg = str(info.value)
    assert "node 'the_add'" in msg and "op Add" in msg and "opset 17" in msg
    assert "[[3], [4]]" in msg and "float32" in msg


def test_external_data_loads_relative_to_model(tmp_path, conv_model):
    path = tmp_path / "ext.onnx"
    copy = onnx.ModelProto()
    copy.CopyFrom(conv_model)  # onnx.save moves the data out of the proto it is given
    onnx.save(copy, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location="weights.bin", size_threshold=0)
    x = np.ones((1, 4, 8, 8), np.float32)
    ref = ml.compile(ml.load_onnx(conv_model), ml.NumpyBackend()).evaluate(None, {"x": x})["y"]
    got = ml.compile(ml.load_onnx(path), ml.NumpyBackend()).evaluate(None, {"x": x})["y"]
    np.testing.assert_array_equal(ref, got)


def test_external_data_escaping_the_folder_is_refused(tmp_path, conv_model):
    (tmp_path / "secret.bin").write_bytes(b"\0" * 1152)
    inner = tmp_path / "models"
    inner.mkdir()
    model = onnx.ModelProto()
    model.CopyFrom(conv_model)
    tensor = model.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.ClearField("float_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value="../secret.bin")
    (inner / "evil.onnx").write_bytes(model.SerializeToString())
    with pytest.raises(errors.UnsafeExternalDataError, match="escapes the model folder"):
        ml.load_onnx(inner / "evil.onnx")


def test_unsupported_attribute_value_names_node(monkeypatch):
    from mithril.backends.registry import REGISTRY, kernel

    @kernel("MithrilTestOnly", since=1, domain="ai.onnx.preview")
    def only_x(x):
        return x

    try:
        node = helper.make_node("MithrilTestOnly", ["x"], ["y"], domain="ai.onnx.preview", name="n", mode=3)
        model = make_model([node], [("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, [2])],
                           domains=("ai.onnx.preview",))
        with pytest.raises(errors.UnsupportedAttributeError, match="node 'n'.*attribute mode=3"):
            ml.compile(ml.load_onnx(model), ml.NumpyBackend())
    finally:
        REGISTRY.unregister("*", "MithrilTestOnly", 1, "ai.onnx.preview")
