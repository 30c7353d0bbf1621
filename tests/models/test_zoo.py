"""The model zoo: every model builds, exports (full checker), runs on every installed backend and
matches onnxruntime; ResNet-18 and the GPT match their PyTorch equivalents given the same weights."""

from __future__ import annotations

import functools
import os

import numpy as np
import onnx
import pytest

import mithril as ml
import models_zoo
from mithril.cli import available_backends
from models_zoo import weights

ort = pytest.importorskip("onnxruntime")

VOCAB = 50
# name -> (builder, input shape, input kind); sizes small enough for a fast suite.
CASES = {
    "mlp": (lambda: models_zoo.mlp([16, 8, 4]), (2, 12), "float"),
    "lenet": (lambda: models_zoo.lenet(num_classes=10), (2, 1, 32, 32), "float"),
    "resnet18": (lambda: models_zoo.resnet18(num_classes=10), (1, 3, 32, 32), "float"),
    "resnet34": (lambda: models_zoo.resnet34(num_classes=10), (1, 3, 32, 32), "float"),
    "resnet50": (lambda: models_zoo.resnet50(num_classes=10), (1, 3, 32, 32), "float"),
    "gpt": (lambda: models_zoo.create_gpt(bias=True, block_size=16, dims=16, num_heads=2, num_layers=2,
                                          vocab_size=VOCAB), (2, 7), "ids"),
    "lstm_classifier": (lambda: models_zoo.lstm_classifier(vocab_size=VOCAB, embed_dim=8, hidden_size=16,
                                                           num_classes=3), (2, 6), "ids"),
    "vit": (lambda: models_zoo.vit(image_size=16, patch_size=4, dims=16, num_heads=2, num_layers=2,
                                   num_classes=5), (2, 3, 16, 16), "float"),
}
BIG = {"resnet18", "resnet34", "resnet50"}


def _input(shape, kind, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "ids":
        return rng.integers(0, VOCAB, shape).astype(np.int64)
    return rng.standard_normal(shape).astype(np.float32)


def _random_params(pm) -> dict[str, np.ndarray]:
    params = {k: np.asarray(v) for k, v in pm.randomize_params().items()}
    for k in params:
        if k.endswith("running_var"):  # a variance must be positive
            params[k] = np.abs(params[k]) + 0.5
    return params


@functools.lru_cache(maxsize=None)
def _reference(name: str):
    """(model, params, input, onnxruntime output) for one zoo case, computed once."""
    build, shape, kind = CASES[name]
    model = build()
    shapes = {"input": list(shape)}
    pm = ml.compile(model, ml.NumpyBackend(), shapes=shapes)
    params = _random_params(pm)
    proto = ml.export_onnx(model, shapes=shapes, params=params)  # runs check_model(full_check=True)
    onnx.shape_inference.infer_shapes(proto, strict_mode=True)
    x = _input(shape, kind)
    ref = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"input": x})
    return model, params, x, ref[0]


def _backend(name: str):
    try:
        return available_backends()[name]()
    except ml.MithrilError as exc:
        pytest.skip(f"the {name} backend cannot be created here: {exc}")


@pytest.mark.parametrize("name", list(CASES))
def test_zoo_model_takes_input_and_gives_output(name):
    model = CASES[name][0]()
    inputs, outputs = model.external()
    assert [w.key for w in inputs if not w.param] == ["input"]
    assert [w.key for w in outputs] == ["output"]


@pytest.mark.parametrize("backend_name", list(available_backends()))
@pytest.mark.parametrize("name", list(CASES))
def test_zoo_model_matches_onnxruntime(name, backend_name):
    model, params, x, ref = _reference(name)
    backend = _backend(backend_name)
    # mx.compile of a whole ResNet takes ~10 s and torch.compile's 20-50 s; op by op runs the same
    # kernels in well under one. The long tier compiles them too; tests/backends/test_boundary.py
    # checks torch.compile on a CNN and a transformer in the fast tier.
    jit = not (backend_name == "mlx" and name in BIG) and not (
        backend_name == "torch" and name in BIG and os.environ.get("MITHRIL_LONG_TESTS") != "1")
    pm = ml.compile(model, backend, shapes={"input": list(x.shape)}, jit=jit)
    assert sorted(pm.parameter_keys) == sorted(params)
    out = pm.evaluate({k: backend.from_numpy(v) for k, v in params.items()}, {"input": backend.from_numpy(x)})
    got = backend.to_numpy(out["output"])
    assert got.shape == ref.shape and got.dtype == np.float32
    scale = max(1.0, float(np.abs(ref).max()))
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5 * scale)


# -- against PyTorch ---------------------------------------------------------------------------
torch = pytest.importorskip("torch")
from models_zoo import torch_reference  # noqa: E402


def test_resnet18_matches_torchvision_architecture():
    module = torch_reference.resnet18(num_classes=10)
    torch_reference._randomize_batchnorm(module, seed=0)
    module.eval()
    model = models_zoo.resnet18(num_classes=10)
    pm = ml.compile(model, ml.NumpyBackend(), shapes={"input": [2, 3, 32, 32]})
    params = weights.resnet18_params(module.state_dict())
    assert sorted(params) == sorted(pm.parameter_keys)  # same names as the torch state_dict
    x = _input((2, 3, 32, 32), "float", seed=1)
    got = pm.evaluate(params, {"input": x})["output"]
    with torch.no_grad():
        want = module(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bias", [True, False])
def test_gpt_matches_torch_gpt2_style_module(bias):
    cfg = dict(bias=bias, block_size=16, dims=16, num_heads=2, num_layers=2, vocab_size=VOCAB)
    torch.manual_seed(0)
    module = torch_reference.GPT(**cfg).eval()
    model = models_zoo.create_gpt(**cfg)
    pm = ml.compile(model, ml.NumpyBackend(), shapes={"input": [2, 9]})
    params = weights.gpt_params(module.state_dict())
    assert sorted(params) == sorted(pm.parameter_keys)
    ids = _input((2, 9), "ids", seed=2)
    got = pm.evaluate(params, {"input": ids})["output"]
    with torch.no_grad():
        want = module(torch.from_numpy(ids)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_gpt_export_keeps_batch_and_sequence_length_dynamic():
    cfg = dict(bias=True, block_size=16, dims=16, num_heads=2, num_layers=1, vocab_size=VOCAB)
    torch.manual_seed(1)
    module = torch_reference.GPT(**cfg).eval()
    proto = ml.export_onnx(models_zoo.create_gpt(**cfg), params=weights.gpt_params(module.state_dict()),
                           dynamic_axes={"input": {0: "batch", 1: "T"}})
    dims = proto.graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_param for d in dims] == ["N", "T"]  # create_gpt's own symbols, kept symbolic
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    for shape in [(1, 4), (3, 11)]:
        ids = _input(shape, "ids", seed=shape[1])
        with torch.no_grad():
            want = module(torch.from_numpy(ids)).numpy()
        np.testing.assert_allclose(session.run(None, {"input": ids})[0], want, rtol=1e-5, atol=1e-5)
