"""The design documents' model definitions built with the documented names: the MLX guide's
classification model and convolutional net, its ``ml.Lambda`` custom operation, ResNet-18 from
``mithril.models`` and the JAX guide's ``ml.models.MLP(input_size=..., hidden_sizes=...,
output_size=...)``."""

from __future__ import annotations

import numpy as np
import pytest

import mithril as ml
from mithril.backends import MLXBackend

mx = pytest.importorskip("mlx.core", reason="the MLX guide's examples need mlx (the mlx extra)")

ALL_BACKENDS = [ml.NumpyBackend, ml.JaxBackend, ml.TorchBackend, ml.MlxBackend]


def _as_numpy(backend, tree: dict) -> dict:
    return {k: np.asarray(backend.to_numpy(v)) for k, v in tree.items()}


# -- 004 "Examples / Basic Classification Model" ------------------------------------------------
def classification_model():
    model = ml.Model()
    model |= ml.Linear(dimension=128)(input="input", output="hidden1")
    model += ml.Relu()(input="hidden1", output="hidden1_act")
    model += ml.Linear(dimension=64)(input="hidden1_act", output="hidden2")
    model += ml.Relu()(input="hidden2", output="hidden2_act")
    model += ml.Linear(dimension=10)(input="hidden2_act", output="logits")
    model += ml.Softmax()(input="logits", output="output")
    return model


def test_classification_model_on_numpy_and_mlx():
    """004 MLX backend, "Examples / Basic Classification Model": the model built with ml.Model,
    ml.Linear, ml.Relu and ml.Softmax compiles on NumpyBackend and MLXBackend (the reader adds
    the input's shape, [100, 784] as the guide's data) and gives the same probabilities."""
    model = classification_model()
    assert model.shape_of("output") == model.shape_of("logits")
    X = np.random.default_rng(0).standard_normal((100, 784)).astype(np.float32)
    results = []
    params = None
    for backend in (ml.NumpyBackend(), MLXBackend()):
        compiled_model = ml.compile(model, backend, shapes={"input": [100, 784]})
        if params is None:
            params = _as_numpy(backend, compiled_model.get_parameters())
        outputs = compiled_model.evaluate({k: backend.array(v) for k, v in params.items()}, {"input": X})
        results.append(np.asarray(backend.to_numpy(outputs["output"])))
    for predictions in results:
        assert predictions.shape == (100, 10) and np.isfinite(predictions).all()
        np.testing.assert_allclose(predictions.sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(results[1], results[0], rtol=1e-4, atol=1e-6)


# -- 004 "Examples / Image Processing Model" ----------------------------------------------------
def image_model():
    model = ml.Model()
    model |= ml.Conv2d(filters=16, kernel_size=3, stride=1, padding="same")(
        input="input", output="conv1"
    )
    model += ml.Relu()(input="conv1", output="conv1_act")
    model += ml.MaxPool2d(kernel_size=2)(input="conv1_act", output="pool1")
    model += ml.Conv2d(filters=32, kernel_size=3, stride=1, padding="same")(
        input="pool1", output="conv2"
    )
    model += ml.Relu()(input="conv2", output="conv2_act")
    model += ml.MaxPool2d(kernel_size=2)(input="conv2_act", output="pool2")
    model += ml.Flatten()(input="pool2", output="flat")
    model += ml.Linear(dimension=64)(input="flat", output="hidden")
    model += ml.Relu()(input="hidden", output="hidden_act")
    model += ml.Linear(dimension=10)(input="hidden_act", output="output")
    return model


def test_image_model_on_numpy_and_mlx_float16():
    """004 MLX backend, "Examples / Image Processing Model": the convolutional net built with
    ml.Conv2d(padding="same"), ml.MaxPool2d, ml.Flatten and ml.Linear compiles for
    ``MLXBackend(dtype=mx.float16)`` as written and for NumpyBackend; "same" keeps each stage's
    size, the pools halve it, Flatten keeps the batch, and float16 is close to float32."""
    model = image_model()
    x = np.random.default_rng(1).standard_normal((2, 3, 16, 16)).astype(np.float32)
    shapes = {"input": list(x.shape)}

    reference = ml.compile(model, ml.NumpyBackend(), shapes=shapes)
    params = reference.get_parameters()
    expected = reference.evaluate(params, {"input": x})["output"]
    assert expected.shape == (2, 10) and np.isfinite(expected).all()

    backend = MLXBackend(dtype=mx.float16)
    compiled_model = ml.compile(model, backend, shapes=shapes)
    half = {k: backend.array(v.astype(np.float16)) for k, v in params.items()}
    got = compiled_model.evaluate(half, {"input": backend.array(x.astype(np.float16))})["output"]
    assert got.dtype == mx.float16
    got = np.asarray(backend.to_numpy(got), dtype=np.float32)
    assert got.shape == (2, 10) and np.isfinite(got).all()
    np.testing.assert_allclose(got, expected, rtol=0.05, atol=0.05)

    # The shapes each stage infers, once the input's is known (a Buffer reading the input gives it).
    model |= ml.models.Buffer()(input=ml.IOKey("input", shape=[2, 3, 16, 16]), output="seen")
    assert [model.shape_of(k) for k in ("conv1", "pool1", "conv2", "pool2", "flat", "output")] == [
        "[2, 16, 16, 16]", "[2, 16, 8, 8]", "[2, 32, 8, 8]", "[2, 32, 4, 4]", "[2, 512]", "[2, 10]"]


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths")  # torch's, about its copy
@pytest.mark.parametrize("kernel_size", [3, 4, (2, 5)])
def test_conv2d_same_padding_matches_torch(kernel_size):
    """004 MLX backend, "Examples / Image Processing Model": ``ml.Conv2d(..., padding="same")``
    pads as ``torch.nn.functional.conv2d(padding="same")``, odd and even kernels alike (an even
    kernel's extra row and column at the bottom and right), and keeps H and W."""
    torch = pytest.importorskip("torch", reason="torch is the reference for padding='same'")
    model = ml.Model()
    model |= ml.Conv2d(filters=4, kernel_size=kernel_size, padding="same")(input="input", output="output")
    x = np.random.default_rng(2).standard_normal((1, 3, 7, 6)).astype(np.float32)
    pm = ml.compile(model, ml.NumpyBackend(), shapes={"input": list(x.shape)})
    params = pm.get_parameters()
    got = pm.evaluate(params, {"input": x})["output"]
    weight, bias = (torch.from_numpy(params[k]) for k in ("conv2d_0.weight", "conv2d_0.bias"))
    want = torch.nn.functional.conv2d(torch.from_numpy(x), weight, bias, padding="same").numpy()
    assert got.shape == want.shape == (1, 4, 7, 6)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_maxpool2d_stride_defaults_to_kernel_and_flatten_keeps_the_batch():
    """004 MLX backend, "Examples / Image Processing Model": ``ml.MaxPool2d(kernel_size=2)``
    pools 2x2 windows with stride 2 (torch's default) and ``ml.Flatten()`` flattens each sample,
    as ``torch.nn.Flatten``, so it feeds ``ml.Linear``."""
    torch = pytest.importorskip("torch", reason="torch is the reference for MaxPool2d and Flatten")
    model = ml.Model()
    model |= ml.MaxPool2d(kernel_size=2)(input="input", output="pool")
    model += ml.Flatten()(input="pool", output="output")
    x = np.random.default_rng(3).standard_normal((2, 3, 6, 8)).astype(np.float32)
    got = ml.compile(model, ml.NumpyBackend(), shapes={"input": list(x.shape)}).evaluate({}, {"input": x})
    want = torch.nn.Flatten()(torch.nn.MaxPool2d(kernel_size=2)(torch.from_numpy(x))).numpy()
    assert got["output"].shape == want.shape == (2, 3 * 3 * 4)
    np.testing.assert_array_equal(got["output"], want)


# -- 004 "Advanced Features / Custom MLX Operations" ---------------------------------------------
def custom_operation_model(backend):
    """The guide's three lines, with the ``model`` and ``backend`` its earlier sections made."""

    def custom_activation(x):
        # Implementation using MLX operations
        return backend.maximum(0.01 * x, x)

    model = ml.Model()
    model |= ml.Linear(dimension=64)(input="input", output="hidden")
    model += ml.Lambda(custom_activation)(input="hidden", output="hidden_act")
    model += ml.Linear(dimension=10)(input="hidden_act", output="output")
    return model


def test_custom_operation_shapes():
    """004 MLX backend, "Custom MLX Operations": the Lambda's output has its input's shape, so
    the model's shapes are known before compiling."""
    model = custom_operation_model(MLXBackend())
    assert model.shape_of("hidden_act") == model.shape_of("hidden")
    assert model.shape_of("hidden_act").endswith(", 64]") and model.shape_of("output").endswith(", 10]")


def test_custom_operation_runs_and_differentiates_on_every_backend():
    """004 MLX backend, "Custom MLX Operations": the model whose Lambda calls
    ``backend.maximum`` of an MLXBackend runs on NumPy, JAX, Torch and MLX with the same outputs
    and the same gradients (the function is traced into ONNX Mul and Max nodes)."""
    model = custom_operation_model(MLXBackend())
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, 16)).astype(np.float32)
    cotangent = rng.standard_normal((4, 10)).astype(np.float32)
    params = None
    results = {}
    for cls in ALL_BACKENDS:
        backend = cls()
        pm = ml.compile(model, backend, shapes={"input": [4, 16]})
        if params is None:
            params = _as_numpy(backend, pm.get_parameters())
        outputs, gradients = pm.evaluate({k: backend.array(v) for k, v in params.items()}, {"input": backend.array(x)},
                                         output_gradients={"output": backend.array(cotangent)})
        results[cls.__name__] = (_as_numpy(backend, outputs)["output"], _as_numpy(backend, gradients))
    out, grads = results.pop("NumpyBackend")
    h = x @ params["linear_0.weight"].T + params["linear_0.bias"]
    want = np.maximum(0.01 * h, h) @ params["linear_1.weight"].T + params["linear_1.bias"]
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    assert sorted(grads) == sorted(params)
    for name, (o, g) in results.items():
        np.testing.assert_allclose(o, out, rtol=1e-5, atol=1e-5, err_msg=name)
        for k in grads:
            np.testing.assert_allclose(g[k], grads[k], rtol=1e-4, atol=1e-5, err_msg=f"{name} {k}")


def test_custom_operation_exports_to_onnx_and_matches_onnxruntime(tmp_path):
    """004 MLX backend, "Custom MLX Operations": the model with the Lambda exports to an .onnx
    file of standard nodes, and onnxruntime computes what Mithril's NumPy backend does."""
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the reference runtime")
    model = custom_operation_model(MLXBackend())
    x = np.random.default_rng(5).standard_normal((3, 8)).astype(np.float32)
    pm = ml.compile(model, ml.NumpyBackend(), shapes={"input": [3, 8]})
    params = pm.get_parameters()
    path = tmp_path / "custom_activation.onnx"
    proto = ml.export_onnx(model, path, shapes={"input": [3, 8]}, params=params)
    assert {"Mul", "Max"} <= {n.op_type for n in proto.graph.node}
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = session.run(["output"], {"input": x})
    np.testing.assert_allclose(got, pm.evaluate(params, {"input": x})["output"], rtol=1e-5, atol=1e-6)


def test_custom_operation_with_mlx_functions_says_what_to_write():
    """004 MLX backend, "Custom MLX Operations": the snippet's comment says "using MLX
    operations"; a reader calling ``mx.maximum`` directly gets an error when the block is made,
    naming the Lambda, the line, and ``backend.maximum`` as the fix."""

    def custom_activation(x):
        return mx.maximum(0.01 * x, x)

    with pytest.raises(ml.MithrilError) as info:
        ml.Lambda(custom_activation)
    message = str(info.value)
    assert "Lambda(test_custom_operation_with_mlx_functions_says_what_to_write.<locals>.custom_activation)" in message
    assert "`return mx.maximum(0.01 * x, x)` (test_model_building.py:" in message
    assert "Write backend.maximum(...) instead of mx.maximum(...)" in message


@pytest.mark.parametrize("fn,match", [
    (lambda x: x if x > 0 else -x, "has no truth value.*backend.where"),
    (lambda x: float(x) * 2, "not a Python number"),
    (lambda x: np.exp(x), "Write backend.exp"),
    (lambda x: 3.0, "returned float, not a value computed from its input"),
], ids=["python-if", "float", "numpy", "constant"])
def test_untraceable_functions_are_refused(fn, match):
    """004 MLX backend, "Custom MLX Operations": what a traced function cannot do (branch on a
    tensor, read a number, call a framework, return no tensor) is refused when the block is made."""
    with pytest.raises(ml.MithrilError, match=match):
        ml.Lambda(fn)


def test_lambda_beyond_elementwise():
    """004 MLX backend, "Custom MLX Operations", further: a Lambda of two inputs (terminals named
    by its arguments) using matmul, a keepdim sum, comparisons and NumPy constants; its output
    shape comes from ONNX shape inference of the trace, and a comparison's output is bool."""
    backend = ml.NumpyBackend()

    def scores(a, w):
        s = backend.matmul(a, w) + np.arange(4)
        return s / backend.sum(backend.maximum(s, 0.0), axis=-1, keepdim=True)

    model = ml.Model()
    model |= ml.Lambda(scores)(a=ml.IOKey("a", shape=["N", 3]), w=ml.IOKey("w", shape=[3, 4]), output="s")
    model += ml.Lambda(lambda s: s > 0.1)(input="s", output="output")
    assert model.shape_of("s") == "[N, 4]"
    pm = ml.compile(model, ml.JaxBackend(), shapes={"a": [2, 3]})
    a = np.abs(np.random.default_rng(6).standard_normal((2, 3))).astype(np.float32)
    w = np.ones((3, 4), np.float32)
    out = pm.evaluate({}, {"a": a, "w": w})["output"]
    s = a @ w + np.arange(4)
    np.testing.assert_array_equal(np.asarray(out), s / s.sum(-1, keepdims=True) > 0.1)
    # Constants take the dtype of the value they meet; one that does not fit it is refused at export.
    ints = ml.Model()
    ints |= ml.Lambda(lambda i: i + 0.5)(input=ml.IOKey("i", type=ml.int64), output="o")
    with pytest.raises(ml.MithrilError, match="the constant 0.5 meets a value of dtype int64 and is not one"):
        ml.compile(ints, ml.NumpyBackend(), shapes={"i": [2]})


def test_lambda_array_methods_and_identity():
    """004 MLX backend, "Custom MLX Operations", further: NumPy-style methods of the traced value
    (``x.reshape(-1)``, ``.T``, ``.sum(axis, keepdims)``) trace like the tensor API, and a
    function returning its input is an identity."""
    model = ml.Model()
    model |= ml.Lambda(lambda x: x)(input=ml.IOKey("x", shape=[2, 3]), output="same")
    model |= ml.Lambda(lambda x: x.reshape(-1) * 2)(input="x", output="flat")
    model |= ml.Lambda(lambda x: x.reshape(3, 2).T.sum(0, True))(input="x", output="summed")
    assert [model.shape_of(k) for k in ("same", "flat", "summed")] == ["[2, 3]", "[6]", "[1, 3]"]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = ml.compile(model, ml.TorchBackend()).evaluate({}, {"x": x})
    np.testing.assert_array_equal(out["same"].numpy(), x)
    np.testing.assert_array_equal(out["flat"].numpy(), x.reshape(-1) * 2)
    np.testing.assert_array_equal(out["summed"].numpy(), x.reshape(3, 2).T.sum(0, keepdims=True))


# -- 002 "Same Model, Multiple Backends" and 003 MLP ----------------------------------------------
def test_resnet18_from_mithril_models():
    """002 multi-backend deployment, "Same Model, Multiple Backends": ``from mithril.models
    import resnet18; resnet18(num_classes=1000)`` compiles (a small image) and runs."""
    from mithril.models import resnet18

    model = resnet18(num_classes=1000)
    pm = ml.compile(model, ml.NumpyBackend(), shapes={"input": [1, 3, 32, 32]}, inference=True)
    x = np.random.default_rng(7).standard_normal((1, 3, 32, 32)).astype(np.float32)
    out = pm.evaluate(pm.get_parameters(), {"input": x})["output"]
    assert out.shape == (1, 1000) and np.isfinite(out).all()


def test_documented_mlp_constructor():
    """003 JAX backend, "Distributed Training with JAX": ``ml.models.MLP(input_size=1024,
    hidden_sizes=[2048, 2048], output_size=1024)``: Relu after each hidden layer, a linear
    output, and the input size fixed, so it compiles without shapes and runs on any batch."""
    model = ml.models.MLP(input_size=1024, hidden_sizes=[2048, 2048], output_size=1024)
    assert model.shape_of("input").endswith(", 1024]") and model.shape_of("output").endswith(", 1024]")
    pm = ml.compile(model, ml.NumpyBackend(), inference=True)
    params = pm.get_parameters()
    assert {k: v.shape for k, v in params.items()} == {
        "linear_0.weight": (2048, 1024), "linear_0.bias": (2048,), "linear_1.weight": (2048, 2048),
        "linear_1.bias": (2048,), "linear_2.weight": (1024, 2048), "linear_2.bias": (1024,)}
    x = np.random.default_rng(8).standard_normal((2, 1024)).astype(np.float32)
    h = x
    for i in range(3):
        h = h @ params[f"linear_{i}.weight"].T + params[f"linear_{i}.bias"]
        h = np.maximum(h, 0) if i < 2 else h
    np.testing.assert_allclose(pm.evaluate(params, {"input": x})["output"], h, rtol=1e-4, atol=1e-4)


def test_mlp_constructors_side_by_side():
    """003 JAX backend, "Optimization with Optax" (``MLP(input_size=784, hidden_sizes=[256, 128],
    output_size=10)``) beside the existing ``MLP(activations, dimensions)``: both build the same
    layers; mixing the two forms, or leaving out output_size, is an error saying what to give."""
    documented = ml.models.MLP(input_size=784, hidden_sizes=[256, 128], output_size=10)
    classic = ml.models.MLP(activations=[ml.Relu, ml.Relu, None], dimensions=[256, 128, 10])
    assert [type(b).__name__ for b in documented._blocks] == [type(b).__name__ for b in classic._blocks] == [
        "Linear", "Relu", "Linear", "Relu", "Linear"]
    with pytest.raises(ml.errors.ModelError, match="either activations and dimensions, or input_size"):
        ml.models.MLP(activations=[None], dimensions=[4], input_size=3)
    with pytest.raises(ml.errors.ModelError, match="needs output_size"):
        ml.models.MLP(input_size=3, hidden_sizes=[4])
