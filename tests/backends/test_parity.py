"""Every pair of installed backends agrees: outputs with parameters moved between them, gradients
(StopGradient and a ResNet export on every backend that differentiates, NumPy's vector-Jacobian
rules included; If and Loop across jax/torch/mlx), and `mithril validate --backend all`.

Tolerances are float32's. Backends sum in different orders (im2col matmuls in NumPy, native
convolutions in XLA/torch/MLX, fused softmax and layer norm), so outputs differ by a few ulps of
the values summed: measured 6e-8 absolute on the conv graph (outputs ~0.8) and 5e-7 on the
transformer block (outputs ~4). The assertions allow 1e-5 relative plus 1e-5 (conv) or 2e-5
(transformer: softmax, layer norm and erf on top) absolute. Gradients sum over the batch and
every spatial position: each is compared relative to its largest entry, within 1e-4 of it
(measured 1.2e-6 on the ResNet; the If/Loop graph agrees exactly).
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper

import mithril as ml
from mithril.backends.table import BACKENDS

from tests.conftest import make_model

AVAILABLE = [name for name, entry in BACKENDS.items() if entry.installed()]
# Backends that compute gradients: NumPy through its vector-Jacobian rules, the others by autodiff.
GRADIENTS = [n for n in AVAILABLE if BACKENDS[n].load().supports_gradients]
# Framework autodiff traces control flow; NumPy has no rule for If or Loop.
# The frameworks' own autodiff. NumPy and C differentiate with Mithril's hand-written rules
# (mithril/backends/vjp; C renders them, or runs NumPy's), which have none for If and Loop.
AUTODIFF = [n for n in GRADIENTS if n not in ("numpy", "c")]
PAIRS = list(itertools.permutations(AVAILABLE, 2))
F32 = TensorProto.FLOAT


def make_backend(name: str):
    return BACKENDS[name].load()()


def native_types(name: str) -> tuple[type, ...]:
    """What users hold from backend ``name``: its framework's own array type."""
    if BACKENDS[name].array_modules[0] == "numpy":  # C and GGML compute on NumPy buffers
        return (np.ndarray,)
    if name == "jax":
        import jax

        return (jax.Array,)
    if name == "torch":
        import torch

        return (torch.Tensor,)
    import mlx.core as mx

    return (mx.array,)


# -- the models --------------------------------------------------------------------------------
def conv_model():
    """Conv -> BatchNorm -> Relu -> MaxPool -> GlobalAveragePool -> Flatten -> Gemm."""
    rng = np.random.default_rng(0)
    inits = {
        "W": rng.standard_normal((6, 3, 3, 3)).astype(np.float32) * 0.3, "B": rng.standard_normal(6).astype(np.float32),
        "scale": rng.uniform(0.5, 1.5, 6).astype(np.float32), "shift": rng.standard_normal(6).astype(np.float32),
        "mean": rng.standard_normal(6).astype(np.float32) * 0.1, "var": rng.uniform(0.5, 2, 6).astype(np.float32),
        "G": rng.standard_normal((4, 6)).astype(np.float32), "g": rng.standard_normal(4).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["n"], name="bn"),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
        helper.make_node("GlobalAveragePool", ["p"], ["a"]),
        helper.make_node("Flatten", ["a"], ["f"]),
        helper.make_node("Gemm", ["f", "G", "g"], ["y"], transB=1, name="fc"),
    ]
    return make_model(nodes, [("x", F32, [2, 3, 8, 8])], [("y", F32, [2, 4])], inits)


def transformer_model():
    """A pre-LN GPT block (layer norms, causal multi-head attention, Gelu MLP) from the frontend."""
    from mithril.models import Model, TransformerBlock

    model = Model()
    model |= TransformerBlock(dims=8, num_heads=2)(input="input", output="output")
    return model


MODELS = {
    "conv": (conv_model, {"x": (2, 3, 8, 8)}, 1e-5),
    "transformer": (transformer_model, {"input": (2, 5, 8)}, 2e-5),
}


@pytest.fixture(scope="module")
def compiled():
    """(backend name, model name) -> compiled model, built once for the module."""
    cache = {}

    def get(backend: str, model: str):
        key = (backend, model)
        if key not in cache:
            build, shapes, _ = MODELS[model]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the frontend block's random-parameter notice
                # NumPy only runs forward here: no gradient program to build.
                cache[key] = ml.compile(build(), make_backend(backend), shapes=shapes, inference=backend == "numpy")
        return cache[key]

    return get


# -- parameters moved between backends give the same outputs ------------------------------------
@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("src,dst", PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
def test_params_moved_through_numpy_give_the_same_outputs(compiled, src, dst, model):
    _, shapes, atol = MODELS[model]
    src_pm, dst_pm = compiled(src, model), compiled(dst, model)
    sb, db = src_pm.backend, dst_pm.backend
    rng = np.random.default_rng(1)
    data = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    params = src_pm.randomize_params()
    moved = {k: db.from_numpy(sb.to_numpy(v)) for k, v in params.items()}
    for k, v in moved.items():
        assert isinstance(v, native_types(dst)), (k, type(v))
        assert db.dtype_of(v) == sb.dtype_of(params[k]), k
    want = src_pm.evaluate(params, {k: sb.from_numpy(v) for k, v in data.items()})
    got = dst_pm.evaluate(moved, {k: db.from_numpy(v) for k, v in data.items()})
    assert set(got) == set(want)
    for name in want:
        assert isinstance(got[name], native_types(dst)), type(got[name])
        np.testing.assert_allclose(db.to_numpy(got[name]), sb.to_numpy(want[name]), rtol=1e-5, atol=atol)


# -- StopGradient --------------------------------------------------------------------------------
@pytest.mark.parametrize("backend_name", GRADIENTS)
def test_stop_gradient_stops_the_gradient(backend_name):
    from mithril.models import Linear, Model, Multiply, StopGradient

    model = Model()
    model |= Linear(dimension=3)(input="input", output="h")
    model |= StopGradient()(input="h", output="hs")
    model |= Multiply()(left="h", right="hs", output="output")
    backend = make_backend(backend_name)
    pm = ml.compile(model, backend, shapes={"input": [2, 4]})
    assert "StopGradient" in pm.code
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4)).astype(np.float32)
    g = rng.standard_normal((2, 3)).astype(np.float32)
    params = pm.randomize_params()
    out, grads = pm.evaluate(params, {"input": x}, output_gradients={"output": g})
    W, b = (backend.to_numpy(params[k]).astype(np.float64) for k in ("linear_0.weight", "linear_0.bias"))
    h = x @ W.T + b
    np.testing.assert_allclose(backend.to_numpy(out["output"]), h * h, rtol=1e-5, atol=1e-6)
    # d/dW of h * stop(h) is hs * dh/dW: half of d/dW (h * h).
    np.testing.assert_allclose(backend.to_numpy(grads["linear_0.weight"]), (g * h).T @ x, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(backend.to_numpy(grads["linear_0.bias"]), (g * h).sum(0), rtol=1e-5, atol=1e-5)


# -- gradients agree across the autodiff backends -------------------------------------------------
def _gradients(backend_name, onnx_model, data, cotangents, shapes=None):
    backend = make_backend(backend_name)
    pm = ml.compile(ml.load_onnx(onnx_model), backend, shapes=shapes, data_keys=list(data))
    _, grads = pm.evaluate(None, {k: backend.from_numpy(v) for k, v in data.items()},
                           output_gradients={k: backend.from_numpy(v) for k, v in cotangents.items()})
    for k, v in grads.items():
        assert isinstance(v, native_types(backend_name)), (k, type(v))
    return {k: backend.to_numpy(v) for k, v in grads.items()}


def _assert_gradients_agree(results):
    (ref_name, ref), *others = results.items()
    assert ref, "no gradients"
    for name, got in others:
        assert set(got) == set(ref), (name, ref_name)
        for k, want in ref.items():
            scale = float(np.max(np.abs(want))) or 1.0
            np.testing.assert_allclose(got[k], want, rtol=1e-4, atol=1e-4 * scale, err_msg=f"{k}: {name} vs {ref_name}")


@pytest.fixture(scope="module")
def small_resnet():
    """models_zoo's torch ResNet with one BasicBlock per stage and ten classes, exported at 32x32."""
    torch = pytest.importorskip("torch", reason="the ResNet export needs torch")
    from models_zoo import torch_reference as models

    torch.manual_seed(0)
    module = models.ResNet((1, 1, 1, 1), num_classes=10)
    models._randomize_batchnorm(module, 0)
    module.eval()
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32))
    spec = models.ModelSpec("resnet", module, {"input": x}, ("output",), {"input": {0: "batch"}, "output": {0: "batch"}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation notices
        return models.export_onnx(spec, "torchscript")


@pytest.mark.skipif(len(GRADIENTS) < 2, reason="needs two backends that compute gradients")
def test_resnet_gradients_agree(small_resnet):
    rng = np.random.default_rng(0)
    data = {"input": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)}
    cot = {"output": rng.standard_normal((1, 10)).astype(np.float32)}
    results = {b: _gradients(b, small_resnet, data, cot, shapes={"input": (1, 3, 32, 32)}) for b in GRADIENTS}
    # The exporter folds each BatchNorm into its conv: 12 convs' weights and biases, fc, the input.
    assert {"input", "fc.weight", "fc.bias"} <= set(results[GRADIENTS[0]]) and len(results[GRADIENTS[0]]) == 27
    _assert_gradients_agree(results)


def if_loop_model():
    """If (on a data flag: x * W or x + W), then a Loop of three steps v <- sin(v * W2) + y."""
    then_g = helper.make_graph([helper.make_node("Mul", ["x", "W"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", F32, [3])])
    else_g = helper.make_graph([helper.make_node("Add", ["x", "W"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", F32, [3])])
    body = helper.make_graph(
        [helper.make_node("Mul", ["v", "W2"], ["m"]), helper.make_node("Sin", ["m"], ["s"]),
         helper.make_node("Add", ["s", "y"], ["v_out"]), helper.make_node("Identity", ["c"], ["c_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v", F32, [3])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []), helper.make_tensor_value_info("v_out", F32, [3])],
    )
    nodes = [helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g, name="branch"),
             helper.make_node("Loop", ["M", "keep", "y"], ["z"], body=body, name="loop")]
    inits = {"W": np.array([0.5, -1.0, 2.0], np.float32), "W2": np.array([1.5, 0.3, -0.7], np.float32),
             "M": np.array(3, np.int64), "keep": np.array(True)}
    return make_model(nodes, [("x", F32, [3]), ("cond", TensorProto.BOOL, [])], [("z", F32, [3])], inits)


@pytest.mark.skipif(len(AUTODIFF) < 2, reason="needs two of jax, torch, mlx")
@pytest.mark.parametrize("cond", [True, False], ids=["then", "else"])
def test_if_loop_gradients_agree(cond):
    data = {"x": np.array([0.2, -0.4, 0.9], np.float32), "cond": np.array(cond)}
    cot = {"z": np.array([1.0, -0.5, 2.0], np.float32)}
    results = {b: _gradients(b, if_loop_model(), data, cot) for b in AUTODIFF}
    assert set(results[AUTODIFF[0]]) == {"W", "W2", "x"}
    _assert_gradients_agree(results)


# -- mithril validate --backend all ---------------------------------------------------------------
def test_cli_validate_all_backends_prints_one_table(tmp_path, capsys, monkeypatch):
    pytest.importorskip("onnxruntime")
    from mithril.cli import main

    monkeypatch.setenv("COLUMNS", "200")  # rich wraps narrower tables; one row per line here
    path = tmp_path / "conv.onnx"
    path.write_bytes(conv_model().SerializeToString())
    assert main(["validate", str(path), "--backend", "all"]) == 0
    out = capsys.readouterr().out
    assert out.count("Validation against onnxruntime") == 1
    rows = [line.split("│")[1].strip() for line in out.splitlines() if line.count("│") > 2]
    assert rows == AVAILABLE, out  # one row per backend: the model has one output
    assert "all outputs pass" in out


@pytest.fixture(scope="module")
def small_transformers():
    """The small BERT and GPT-2 (transformers configs, random weights) exported at sequence 16."""
    pytest.importorskip("transformers", reason="BERT and GPT-2 come from transformers configs")
    from models_zoo import torch_reference as models

    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in ("bert", "gpt2"):
            spec = models.build(name, seq=16)
            out[name] = (models.export_onnx(spec, "torchscript"), spec)
    return out


@pytest.mark.skipif(len(AUTODIFF) < 2, reason="needs two of jax, torch, mlx")
@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_transformer_gradients_agree(small_transformers, name):
    # Gradients of every floating initializer (embeddings, attention, MLP, layer norms) agree across
    # the autodiff backends; token ids and the mask are integer data, not differentiated.
    proto, spec = small_transformers[name]
    data = spec.numpy_inputs(batch=2)
    rng = np.random.default_rng(1)
    outs = {k: rng.standard_normal((2, 16, 64 if k == "last_hidden_state" else (1000 if k == "logits" else 64)))
            .astype(np.float32) for k in spec.output_names if k != "pooler_output"}
    shapes = {k: v.shape for k, v in data.items()}
    results = {}
    for b in AUTODIFF:
        backend = make_backend(b)
        pm = ml.compile(ml.load_onnx(proto), backend, shapes=shapes)
        _, grads = pm.evaluate(None, {k: backend.from_numpy(v) for k, v in data.items()},
                               output_gradients={k: backend.from_numpy(v) for k, v in outs.items()})
        results[b] = {k: backend.to_numpy(v) for k, v in grads.items()}
    assert len(results[AUTODIFF[0]]) > 10
    _assert_gradients_agree(results)


def test_a_backend_without_gradients_refuses_them():
    """supports_gradients is read: Backend.lower_backward refuses, so a model compiled to train
    fails at compile and one compiled for inference-or-training fails at its first gradient."""
    from mithril.backends.backend import Backend
    from mithril.errors import MithrilError

    class NoGradients(ml.NumpyBackend):
        supports_gradients = False
        lower_backward = Backend.lower_backward

    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", F32, [3])], [("y", F32, [3])])
    with pytest.raises(MithrilError, match="NoGradients does not compute gradients"):
        ml.compile(ml.load_onnx(model), NoGradients(), data_keys=["x"])
    pm = ml.compile(ml.load_onnx(model), NoGradients())
    x = np.array([-1.0, 0.0, 2.0], np.float32)
    np.testing.assert_array_equal(pm.evaluate(None, {"x": x})["y"], [0.0, 0.0, 2.0])
    with pytest.raises(MithrilError, match="NoGradients does not compute gradients"):
        pm.evaluate(None, {"x": x}, output_gradients={"y": np.ones(3, np.float32)})
