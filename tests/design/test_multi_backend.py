"""002 multi-backend deployment: one logical ResNet-18 compiled for several backends, the guide's
benchmark function, and its multi-device training call, typed in as written."""

from __future__ import annotations

import time

import numpy as np
import pytest

import mithril as ml


@pytest.fixture(scope="module")
def resnet():
    from mithril.models import resnet18

    return resnet18(num_classes=1000)


def test_same_model_multiple_backends(resnet):
    """002, "Same Model, Multiple Backends": the zoo's ResNet-18 compiled for Torch ("cuda"
    falls back to the CPU with a warning here), JAX and MLX from one definition, with the same
    parameters giving the same logits on all three."""
    model = resnet
    with pytest.warns(UserWarning, match="cuda.*cpu"):
        torch_backend = ml.TorchBackend(device="cuda")
    torch_model = ml.compile(model, backend=torch_backend, shapes={"input": [1, 3, 224, 224]}, data_keys={"input"})
    jax_backend = ml.JaxBackend()
    jax_model = ml.compile(model, backend=jax_backend, shapes={"input": [1, 3, 224, 224]}, data_keys={"input"})
    mlx_backend = ml.MlxBackend()
    mlx_model = ml.compile(model, backend=mlx_backend, shapes={"input": [1, 3, 224, 224]}, data_keys={"input"})

    params = {k: torch_backend.to_numpy(v) for k, v in torch_model.randomize_params().items()}
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    logits = {}
    for name, backend, pm in (("torch", torch_backend, torch_model), ("jax", jax_backend, jax_model),
                              ("mlx", mlx_backend, mlx_model)):
        out = pm.evaluate({k: backend.array(v) for k, v in params.items()}, {"input": backend.array(x)})["output"]
        logits[name] = backend.to_numpy(out)
        assert logits[name].shape == (1, 1000) and np.isfinite(logits[name]).all()
    np.testing.assert_allclose(logits["jax"], logits["torch"], rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(logits["mlx"], logits["torch"], rtol=1e-3, atol=1e-3)


def benchmark_model(model_name, input_shape, backends, num_runs=100):
    """The guide's benchmark function, as written (a model name, an input shape, backend
    classes), returning the mean seconds per evaluation by backend name."""
    if model_name == "resnet18":
        from mithril.models import resnet18
        model = resnet18(num_classes=1000)
    elif model_name == "transformer":
        from examples.gpt.model import create_gpt
        model = create_gpt(bias=True, block_size=128, dims=768,
                           num_heads=12, num_layers=12, vocab_size=50304)

    numpy_input = np.random.randn(*input_shape).astype(np.float32)

    results = {}
    for backend_name, backend_class in backends.items():
        backend = backend_class()
        compiled_model = ml.compile(
            model,
            backend=backend,
            shapes={"input": input_shape},
            data_keys={"input"},
            jit=True
        )
        backend_input = backend.array(numpy_input)
        for _ in range(10):
            compiled_model.evaluate({}, {"input": backend_input})
        start_time = time.time()
        for _ in range(num_runs):
            compiled_model.evaluate({}, {"input": backend_input})
        end_time = time.time()
        avg_time = (end_time - start_time) / num_runs
        results[backend_name] = avg_time
    return results


@pytest.mark.slow
@pytest.mark.long(reason="times the guide's benchmark loop on every backend (~50 s); the fast tier runs the "
                         "guide's other multi-backend examples")
def test_benchmark_across_backends_as_written():
    """002, "Benchmarking Across Backends": the guide's own call (ResNet-18 at 224x224, 100
    runs after 10 warm-ups, on Torch, JAX and NumPy; ``evaluate({}, ...)`` runs on the model's own
    parameters). Marked slow: about a minute on two cores."""
    backends = {"torch": ml.TorchBackend, "jax": ml.JaxBackend, "numpy": ml.NumpyBackend}
    results = benchmark_model("resnet18", [1, 3, 224, 224], backends)
    assert set(results) == {"torch", "jax", "numpy"}
    assert all(0 < t < 5 for t in results.values()), results


def test_benchmark_function_small_run():
    """002, "Benchmarking Across Backends" with a smaller input and fewer runs (the full call is
    the slow test above): the function runs on every backend and returns positive timings."""
    backends = {"torch": ml.TorchBackend, "jax": ml.JaxBackend, "numpy": ml.NumpyBackend}
    results = benchmark_model("resnet18", [1, 3, 32, 32], backends, num_runs=2)
    assert set(results) == set(backends) and all(t > 0 for t in results.values())


def test_benchmark_transformer_branch_needs_token_ids():
    """002, "Benchmarking Across Backends", the "transformer" branch: GPT reads int64 token ids,
    so the function's float32 ``randn`` input is refused with the reason, naming the dtype it wants."""
    backends = {"numpy": ml.NumpyBackend}
    with pytest.raises(ml.errors.DTypeError, match="expects int64 but got float32"):
        benchmark_model("transformer", [1, 8], backends, num_runs=1)


def test_multi_device_training_call(resnet):
    """002, "Multi-Device Deployment": a data-parallel TorchBackend over two CUDA devices (absent
    here: one warning, then the CPU). ResNet-18 has no "target" input, so data_keys naming it is
    refused with the model's inputs listed; a training model (ResNet-18 with a cross-entropy loss
    reading "target") takes it."""
    with pytest.warns(UserWarning):
        multi_gpu_backend = ml.TorchBackend(parallel_strategy="data_parallel", devices=["cuda:0", "cuda:1"])
    with pytest.raises(ml.errors.CompileError, match=r"data_keys names \['target'\], which the model does not take; its inputs are \['input'\]"):
        ml.compile(resnet, backend=multi_gpu_backend, data_keys={"input", "target"})

    from mithril.models import CrossEntropy, TrainModel, resnet18

    train = TrainModel(resnet18(num_classes=10))
    train.add_loss(CrossEntropy(input_type="logits"), input="output", target="target", reduce_steps=[ml.models.Mean()])
    with pytest.warns(UserWarning, match="data_parallel runs parts of the batch, and compile's shapes fix the batch dim"):
        model = ml.compile(train, backend=multi_gpu_backend, data_keys={"input", "target"},
                           shapes={"input": [2, 3, 32, 32], "target": [2]})
    rng = np.random.default_rng(1)
    outputs, grads = model.evaluate(model.randomize_params(),
                                    {"input": rng.standard_normal((2, 3, 32, 32)).astype(np.float32),
                                     "target": np.array([1, 7])})
    assert np.isfinite(float(outputs["loss"])) and grads and all(np.isfinite(g.numpy()).all() for g in grads.values())
    with pytest.warns(UserWarning):
        model_parallel_backend = ml.TorchBackend(parallel_strategy="model_parallel", devices=["cuda:0", "cuda:1"])
    assert model_parallel_backend.device == "cpu"
