"""The design documents' compile, evaluate and training examples, typed in as a user would.

Each test names the document and section it types in. Where a snippet leaves ``model`` (or
``train_model``, ``compute_loss``...) to the reader, the test adds a small one; "cuda"/"gpu"
stay as written where the backend falls back to the CPU with a warning.
"""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest

import mithril as ml
from mithril.models import IOKey, Linear, Model, Relu

from .test_model_building import classification_model


def small_model(features: int = 8, hidden: int = 16, classes: int = 4) -> Model:
    """What a reader adds for ``model``: a two-layer perceptron over [N, features]."""
    model = Model()
    model |= Linear(dimension=hidden)(input=IOKey("input", shape=["N", features]), output="hidden")
    model += Relu()(input="hidden", output="hidden_act")
    model += Linear(dimension=classes)(input="hidden_act", output="output")
    return model


def reference_forward(params: dict, x: np.ndarray) -> np.ndarray:
    """The same perceptron in NumPy, reading the compiled model's parameters by shape."""
    weights = sorted((k for k, v in params.items() if np.asarray(v).ndim == 2), key=lambda k: -np.asarray(params[k]).shape[0])
    hidden_w, out_w = (np.asarray(params[k], np.float64) for k in weights)
    biases = {np.asarray(v).shape[0]: np.asarray(v, np.float64) for v in params.values() if np.asarray(v).ndim == 1}
    h = np.maximum(x @ hidden_w.T + biases[hidden_w.shape[0]], 0)
    return h @ out_w.T + biases[out_w.shape[0]]


def as_numpy(backend, value) -> np.ndarray:
    return np.asarray(backend.to_numpy(value), np.float64)


# -- 000 backend comparison -----------------------------------------------------------------

def test_numpy_inference_only_compile():
    """000 backend comparison, "NumPy Backend / Usage Example": inference=True builds no
    gradient program, so a gradient request is refused with the reason."""
    model = small_model()
    backend = ml.NumpyBackend(dtype=ml.float32)
    compiled_model = ml.compile(model=model, backend=backend, inference=True)
    params = compiled_model.get_parameters()
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    out = compiled_model.evaluate(params, {"input": x})["output"]
    np.testing.assert_allclose(out, reference_forward(params, x), rtol=1e-5, atol=1e-5)
    assert compiled_model.backward is None
    with pytest.raises(ml.MithrilError, match="inference=True"):
        compiled_model.evaluate(params, {"input": x}, output_gradients={"output": np.ones_like(out)})


def test_numpy_float64_backend():
    """000 backend comparison, "Backend Initialization Reference / NumPy Backend": a float64
    backend holds the model's parameters and computes in float64."""
    backend = ml.NumpyBackend(dtype=ml.float64)
    pm = ml.compile(small_model(), backend)
    params = pm.get_parameters()
    assert {v.dtype for v in params.values()} == {np.dtype(np.float64)}
    x = np.random.default_rng(1).standard_normal((2, 8))
    out = pm.evaluate(params, {"input": x})["output"]
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, reference_forward(params, x), rtol=1e-12)


def migrate(source_backend, target_backend, seed: int) -> tuple[np.ndarray, np.ndarray, dict]:
    """The guide's migration: compile on the source, randomize_params there, to_numpy, compile on
    the target, ``target_backend.array`` of each; both evaluated on one input."""
    model = small_model()
    source_model = ml.compile(model, source_backend)
    source_params = source_model.randomize_params()
    numpy_params = {k: source_backend.to_numpy(v) for k, v in source_params.items()}
    target_model = ml.compile(model, target_backend)
    target_params = {k: target_backend.array(v) for k, v in numpy_params.items()}

    x = np.random.default_rng(seed).standard_normal((4, 8)).astype(np.float32)
    source_out = source_model.evaluate(source_params, {"input": source_backend.array(x)})["output"]
    target_out = target_model.evaluate(target_params, {"input": target_backend.array(x)})["output"]
    expected = reference_forward(numpy_params, x)
    return source_backend.to_numpy(source_out), target_backend.to_numpy(target_out), expected


def test_migration_jax_to_torch():
    """000 backend comparison, "Migration Between Backends / JAX to PyTorch": parameters made
    on JAX, moved through NumPy, give the same outputs on Torch."""
    jax_out, torch_out, expected = migrate(ml.JaxBackend(dtype=ml.float32), ml.TorchBackend(dtype=ml.float32), 2)
    np.testing.assert_allclose(torch_out, jax_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(torch_out, expected, rtol=1e-4, atol=1e-5)


def test_migration_torch_to_mlx():
    """000 backend comparison, "Migration Between Backends / PyTorch to MLX"."""
    torch_out, mlx_out, expected = migrate(ml.TorchBackend(dtype=ml.float32), ml.MLXBackend(dtype=ml.float32), 3)
    np.testing.assert_allclose(mlx_out, torch_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mlx_out, expected, rtol=1e-4, atol=1e-5)


# -- 003 JAX backend: compile, run, differentiate --------------------------------------------

@pytest.fixture
def linear_on_jax():
    """003 JAX backend, "Compiling Models with JAX Backend": a bare Linear block compiles."""
    model = Linear(dimension=64)
    backend = ml.JaxBackend(dtype=ml.float32)
    compiled_model = ml.compile(model=model, backend=backend, shapes={"input": [32, 128]}, jit=True)
    return backend, compiled_model


def test_compile_bare_block_and_run_inference(linear_on_jax):
    """003 JAX backend, "Compiling Models with JAX Backend" and "Running Inference"."""
    backend, compiled_model = linear_on_jax
    assert compiled_model.input_keys == ["input"] and compiled_model.output_keys == ["output"]
    params = compiled_model.randomize_params()
    inputs = {"input": backend.randn(32, 128)}
    outputs = compiled_model.evaluate(params, inputs)
    output_tensor = outputs["output"]
    assert backend.shape(output_tensor) == (32, 64)
    x, w, b = (np.asarray(backend.to_numpy(v), np.float64) for v in (inputs["input"], params["weight"], params["bias"]))
    np.testing.assert_allclose(backend.to_numpy(output_tensor), x @ w.T + b, rtol=1e-4, atol=1e-4)


def test_compute_gradients(linear_on_jax):
    """003 JAX backend, "Computing Gradients": ones as the output gradient give the weight
    gradient g^T x and the bias gradient sum(g)."""
    backend, compiled_model = linear_on_jax
    params = compiled_model.randomize_params()
    inputs = {"input": backend.randn(32, 128)}
    outputs = compiled_model.evaluate(params, inputs)
    output_gradients = {"output": backend.ones_like(outputs["output"])}
    outputs, gradients = compiled_model.evaluate(params, inputs, output_gradients=output_gradients)
    weight_grad = gradients["weight"]
    bias_grad = gradients["bias"]
    x = np.asarray(backend.to_numpy(inputs["input"]), np.float64)
    np.testing.assert_allclose(backend.to_numpy(weight_grad), np.ones((32, 64)).T @ x, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(backend.to_numpy(bias_grad), np.full(64, 32.0), rtol=1e-6)


def test_jit_on_and_off_agree():
    """003 JAX backend, "Enabling JIT" and "Troubleshooting / Performance Issues": jit=True
    gives the eager numbers, and ``jit=None`` follows the backend's default."""
    model = small_model()
    backend = ml.JaxBackend(jit=True)
    compiled_model = ml.compile(model=model, backend=backend, jit=True)
    eager = ml.compile(model, backend, jit=False)
    assert compiled_model._jitted is not None and eager._jitted is None
    params = compiled_model.randomize_params()
    x = backend.randn(5, 8)
    np.testing.assert_allclose(backend.to_numpy(compiled_model.evaluate(params, {"input": x})["output"]),
                               backend.to_numpy(eager.evaluate(params, {"input": x})["output"]), rtol=1e-5, atol=1e-6)
    assert ml.compile(model, ml.JaxBackend())._jitted is not None  # JAX jits by default
    assert ml.compile(model, ml.NumpyBackend())._jitted is None  # NumPy has nothing to jit


def test_float16_backend_for_memory():
    """003 JAX backend, "Troubleshooting / Memory Issues": a float16 backend makes a float16
    model (half the parameter bytes)."""
    backend = ml.JaxBackend(dtype=ml.float16)
    pm = ml.compile(small_model(), backend)
    params = pm.randomize_params()
    assert {str(v.dtype) for v in params.values()} == {"float16"}
    out = pm.evaluate(params, {"input": backend.randn(3, 8, dtype=ml.float16)})["output"]
    assert str(out.dtype) == "float16" and np.isfinite(backend.to_numpy(out)).all()
    full = ml.compile(small_model(), ml.JaxBackend(dtype=ml.float32)).randomize_params()
    assert sum(v.nbytes for v in params.values()) * 2 == sum(v.nbytes for v in full.values())


def test_verbose_compile_prints_each_stage(capsys):
    """003 JAX backend, "Troubleshooting / Shape Errors" (and 004 MLX, "Enable verbose
    logging"): verbose=True prints each stage with its time, and the shapes."""
    backend = ml.JaxBackend()
    ml.compile(small_model(), backend, verbose=True)
    out = capsys.readouterr().out
    for stage in ("build", "specialize", "plan", "lower", "gradients", "jit"):
        assert f"[mithril.compile] {stage}" in out, out
    assert "input input: [N, 8] float32" in out and "output output: [N, 4] float32" in out
    assert " ms" in out
    ml.compile(small_model(), backend)
    assert capsys.readouterr().out == ""  # quiet by default


def test_optax_training_loop():
    """003 JAX backend, "Optimization with Optax": the documented MLP, Adam from optax over the
    gradients dict, and a cross-entropy gradient as the output gradient; the loss falls."""
    optax = pytest.importorskip("optax", reason="the Optax example needs optax (in the test extra)")
    model = ml.models.MLP(input_size=784, hidden_sizes=[256, 128], output_size=10)
    backend = ml.JaxBackend(dtype=ml.float32)
    compiled_model = ml.compile(model, backend)
    params = compiled_model.randomize_params()
    optimizer = optax.adam(learning_rate=0.001)
    opt_state = optimizer.init(params)

    rng = np.random.default_rng(0)
    X_batch = rng.standard_normal((64, 784)).astype(np.float32)
    y_batch = rng.integers(0, 10, size=64)

    def softmax(z):
        e = np.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    def loss_of(logits):
        return float(-np.log(softmax(np.asarray(logits, np.float64))[np.arange(64), y_batch]).mean())

    def compute_loss_gradient(logits, labels):
        p = softmax(np.asarray(logits, np.float64))
        p[np.arange(len(labels)), labels] -= 1
        return backend.array((p / len(labels)).astype(np.float32))

    losses = []
    num_epochs = 20
    for epoch in range(num_epochs):
        inputs = {"input": backend.array(X_batch)}
        outputs = compiled_model.evaluate(params, inputs)
        losses.append(loss_of(outputs["output"]))
        outputs, gradients = compiled_model.evaluate(
            params, inputs, output_gradients={"output": compute_loss_gradient(outputs["output"], y_batch)})
        updates, opt_state = optimizer.update(gradients, opt_state)
        params = optax.apply_updates(params, updates)
    assert losses[-1] < 0.5 * losses[0], losses


# -- 002 multi-backend deployment ---------------------------------------------------------------

def test_cross_backend_transfer_learning():
    """002 multi-backend deployment, "Cross-Backend Transfer Learning": train on Torch
    (``train_model`` is the reader's: plain SGD on a squared error), move the parameters through
    ``.cpu().numpy()``, and JAX gives Torch's outputs with the trained weights."""
    model = small_model()
    rng = np.random.default_rng(4)
    training_data = [(rng.standard_normal((16, 8)).astype(np.float32), rng.standard_normal((16, 4)).astype(np.float32))
                     for _ in range(5)]

    def train_model(compiled, backend, data, steps=30, lr=0.05):
        params = compiled.randomize_params()
        first = last = None
        for _ in range(steps):
            for x, y in data:
                out = compiled.evaluate(params, {"input": backend.array(x)})["output"]
                err = out - backend.array(y)
                loss = float((err * err).mean())
                first = loss if first is None else first
                last = loss
                _, grads = compiled.evaluate(params, {"input": backend.array(x)},
                                             output_gradients={"output": 2 * err / err.numel()})
                params = {k: params[k] - lr * grads[k] for k in params}
        assert last < first
        return params

    with pytest.warns(ml.errors.DeviceFallbackWarning, match="'cuda' is not present.*running on cpu"):
        torch_backend = ml.TorchBackend(device="cuda")  # no CUDA here: one warning, then the CPU
    torch_model = ml.compile(model, backend=torch_backend, data_keys={"input"})
    torch_params = train_model(torch_model, torch_backend, training_data)
    numpy_params = {k: v.cpu().numpy() for k, v in torch_params.items()}

    jax_backend = ml.JaxBackend()
    jax_model = ml.compile(model, backend=jax_backend, data_keys={"input"})
    jax_params = {k: jax_backend.array(v) for k, v in numpy_params.items()}
    jax_input = jax_backend.array(training_data[0][0])
    outputs = jax_model.evaluate(jax_params, {"input": jax_input})
    torch_out = torch_model.evaluate(torch_params, {"input": torch_backend.array(training_data[0][0])})["output"]
    np.testing.assert_allclose(jax_backend.to_numpy(outputs["output"]), torch_out.numpy(), rtol=1e-5, atol=1e-5)


def scaled_model() -> Model:
    """A model with a scalar input, for auto_scalar_promotion: ``output = input * scale``."""
    model = Model()
    model |= ml.models.Multiply()(left=IOKey("input", shape=["N", 3]), right=IOKey("scale", shape=[]), output="output")
    return model


@pytest.mark.parametrize("make_backend", [ml.JaxBackend, ml.TorchBackend, ml.MlxBackend], ids=["jax", "torch", "mlx"])
def test_backend_specific_compile_options(make_backend):
    """002 multi-backend deployment, "Backend-Specific Optimizations": jit=True and
    auto_scalar_promotion=True on each backend; a Python scalar takes the input's dtype."""
    backend = make_backend()
    pm = ml.compile(scaled_model(), backend=backend, data_keys={"input"}, jit=True, auto_scalar_promotion=True)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = pm.evaluate({}, {"input": backend.array(x), "scale": 2})["output"]
    np.testing.assert_allclose(backend.to_numpy(out), 2 * x)
    assert backend.to_numpy(out).dtype == np.float32

    strict = ml.compile(scaled_model(), backend=backend, data_keys={"input"}, auto_scalar_promotion=False)
    with pytest.raises(ml.errors.DTypeError, match="auto_scalar_promotion=False.*float32"):
        strict.evaluate({}, {"input": backend.array(x), "scale": 2.0})
    out = strict.evaluate({}, {"input": backend.array(x), "scale": backend.array(np.float32(3))})["output"]
    np.testing.assert_allclose(backend.to_numpy(out), 3 * x)


# -- compile's options: what each refuses -----------------------------------------------------

def test_unknown_compile_option_lists_the_valid_ones():
    with pytest.raises(ml.errors.CompileError, match=r"unknown compile option\(s\) \['gradient_chekpointing'\]; valid options: .*static_shapes"):
        ml.compile(small_model(), ml.NumpyBackend(), gradient_chekpointing=True)


def test_backend_class_instead_of_instance():
    with pytest.raises(ml.errors.CompileError, match=r"backend instance: JaxBackend\(\)"):
        ml.compile(small_model(), ml.JaxBackend)


def test_data_keys_must_name_inputs():
    with pytest.raises(ml.errors.CompileError, match=r"data_keys names \['inputs'\], which the model does not take; its inputs are \['input'\]"):
        ml.compile(small_model(), ml.NumpyBackend(), data_keys={"inputs"})
    with pytest.raises(ml.errors.CompileError, match="parameters of the model, not inputs"):
        ml.compile(Linear(dimension=4), ml.NumpyBackend(), shapes={"input": [2, 3]}, data_keys={"input", "weight"})


def test_static_shapes_needs_fixed_inputs():
    """000 backend comparison, "JAX Backend / Optimization Techniques" compiles with
    static_shapes=True: every input dim must be fixed, and the program then takes that shape only."""
    with pytest.raises(ml.errors.CompileError, match=r"static_shapes=True needs every input dim fixed; give shapes= for input: \[N, 8\]"):
        ml.compile(small_model(), ml.JaxBackend(), static_shapes=True)
    pm = ml.compile(small_model(), ml.JaxBackend(), static_shapes=True, shapes={"input": [4, 8]})
    assert pm.evaluate(None, {"input": np.zeros((4, 8), np.float32)})["output"].shape == (4, 4)
    with pytest.raises(ml.errors.ShapeError, match=r"expects shape \[4, 8\] but got \[5, 8\]"):
        pm.evaluate(None, {"input": np.zeros((5, 8), np.float32)})


def test_static_inference_drops_the_gradient_program():
    pm = ml.compile(small_model(), ml.NumpyBackend(), static_inference=True)
    assert pm.inference and pm.backward is None
    with pytest.raises(ml.MithrilError, match="inference=True"):
        pm.evaluate(None, {"input": np.zeros((1, 8), np.float32)}, output_gradients={"output": np.ones((1, 4), np.float32)})


def test_jit_options_need_jit():
    with pytest.raises(ml.errors.CompileError, match="jit_options were given with jit=False"):
        ml.compile(small_model(), ml.JaxBackend(), jit=False, jit_options={"compiler_options": {}})


def test_empty_params_mean_the_models_own():
    """002 multi-backend deployment, "Benchmarking Across Backends" evaluates with ``{}`` as
    params: the model's own parameters, as ``None`` gives."""
    pm = ml.compile(small_model(), ml.NumpyBackend())
    x = np.ones((2, 8), np.float32)
    np.testing.assert_array_equal(pm.evaluate({}, {"input": x})["output"], pm.evaluate(None, {"input": x})["output"])
    with pytest.raises(ml.errors.InputError, match="missing parameter"):
        pm.evaluate({"bogus": 1}, {"input": x})


# -- 004 MLX backend: training ----------------------------------------------------------------

def test_mlx_basic_training_loop():
    """004 MLX backend, "Training with MLX Backend / Basic Training Loop" (with "Automatic
    Differentiation"): parameters from get_parameters, a squared-error gradient, plain SGD
    over the gradients dict; the loss falls."""
    model = small_model()
    backend = ml.MLXBackend()
    compiled_model = ml.compile(model, backend)
    params = compiled_model.get_parameters()
    rng = np.random.default_rng(5)
    data_loader = [(backend.array(rng.standard_normal((16, 8)).astype(np.float32)),
                    backend.array(rng.standard_normal((16, 4)).astype(np.float32))) for _ in range(4)]
    learning_rate = 0.02
    losses = []
    num_epochs = 15
    for epoch in range(num_epochs):
        for batch_inputs, batch_targets in data_loader:
            outputs = compiled_model.evaluate(params, {"input": batch_inputs})  # the reader's forward pass
            losses.append(float(((outputs["output"] - batch_targets) ** 2).mean()))
            outputs, gradients = compiled_model.evaluate(
                params, {"input": batch_inputs},
                output_gradients={"output": 2 * (outputs["output"] - batch_targets)})
            for name, grad in gradients.items():
                params[name] = params[name] - learning_rate * grad
    assert np.mean(losses[-4:]) < 0.7 * np.mean(losses[:4])


def test_pickle_serialization_round_trip(tmp_path):
    """004 MLX backend, "Serialization": parameters pickled as NumPy and read back give the same
    outputs."""
    backend = ml.MLXBackend()
    pm = ml.compile(small_model(), backend)
    params = pm.randomize_params()
    path = tmp_path / "model_params.pkl"
    with open(path, "wb") as f:
        pickle.dump({k: backend.to_numpy(v) for k, v in params.items()}, f)
    with open(path, "rb") as f:
        loaded_params = pickle.load(f)
        loaded = {k: backend.array(v) for k, v in loaded_params.items()}
    x = backend.array(np.ones((2, 8), np.float32))
    np.testing.assert_array_equal(backend.to_numpy(pm.evaluate(loaded, {"input": x})["output"]),
                                  backend.to_numpy(pm.evaluate(params, {"input": x})["output"]))


def test_mlx_classification_example_trains():
    """004 MLX backend, "Examples / Basic Classification Model", its training loop as written.

    The guide feeds ``np.random.randn`` (float64) to a float32 model: Mithril never casts
    silently, so that call is refused with the fix; the loop then runs on float32 data as the
    error says, and the training accuracy rises."""
    model = classification_model()
    backend = ml.MLXBackend()
    compiled_model = ml.compile(model, backend, shapes={"input": [100, 784]})
    np.random.seed(0)
    X = np.random.randn(100, 784)
    y = np.random.randint(0, 10, size=(100,))
    y_one_hot = np.zeros((100, 10))
    y_one_hot[np.arange(100), y] = 1
    params = compiled_model.get_parameters()
    with pytest.raises(ml.errors.DTypeError, match="expects float32 but got float64; cast it explicitly"):
        compiled_model.evaluate(params, {"input": X})

    X = X.astype(np.float32)
    y_one_hot = y_one_hot.astype(np.float32)
    learning_rate = 0.01
    accuracies = []
    for epoch in range(10):
        outputs = compiled_model.evaluate(params, {"input": X})
        predictions = outputs["output"]
        loss_grad = predictions - y_one_hot
        _, gradients = compiled_model.evaluate(params, {"input": X}, output_gradients={"output": loss_grad})
        for name, grad in gradients.items():
            params[name] = params[name] - learning_rate * grad
        pred_classes = np.argmax(predictions, axis=1)
        accuracy = np.mean(pred_classes == y)
        accuracies.append(accuracy)
    assert all(0.0 <= a <= 1.0 for a in accuracies)
    assert accuracies[-1] > accuracies[0], accuracies


def test_no_warnings_on_plain_numpy_compile():
    """The options' warnings are for what cannot apply; a plain compile warns about nothing."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ml.compile(small_model(), ml.NumpyBackend())
