"""004 MLX backend (and 000's MLX rows): the examples that mix Mithril with MLX's own
transformations and optimizers, typed in as written."""

from __future__ import annotations

import numpy as np
import pytest

import mithril as ml

from .test_compile_and_train import small_model

mx = pytest.importorskip("mlx.core", reason="the MLX guide's examples need mlx (the mlx extra)")


@pytest.fixture
def compiled():
    backend = ml.MLXBackend()
    compiled_model = ml.compile(small_model(), backend)
    return backend, compiled_model


def test_evaluate_inside_mx_compile_and_mx_grad(compiled):
    """004, "Performance Optimization / Computational Graphs": a compiled model's ``evaluate``
    is a function of MLX arrays, so MLX's own ``mx.compile`` and ``mx.grad`` trace through it;
    the gradients equal Mithril's."""
    backend, compiled_model = compiled
    params = compiled_model.randomize_params()
    inputs, targets = backend.randn(4, 8), backend.randn(4, 4)

    def model_fn(params, inputs):  # the reader's: the compiled model as a function
        return compiled_model.evaluate(params, {"input": inputs})["output"]

    def loss_fn(outputs, targets):
        return ((outputs - targets) ** 2).mean()

    @mx.compile
    def forward_backward(params, inputs, targets):
        outputs = model_fn(params, inputs)
        loss = loss_fn(outputs, targets)
        grads = mx.grad(lambda p, x: loss_fn(model_fn(p, x), targets))(params, inputs)
        return loss, grads

    loss, grads = forward_backward(params, inputs, targets)
    out = model_fn(params, inputs)
    _, expected = compiled_model.evaluate(params, {"input": inputs},
                                          output_gradients={"output": 2 * (out - targets) / targets.size})
    assert float(loss) == pytest.approx(float(loss_fn(out, targets)), rel=1e-5)
    assert set(grads) == set(expected)
    for name in grads:
        np.testing.assert_allclose(np.array(grads[name]), np.array(expected[name]), rtol=1e-5, atol=1e-6)


def test_mlx_optimizers_over_the_parameter_dict(compiled):
    """004, "Training with MLX Backend / Using MLX Optimizers".

    The guide writes ``mlx_params = optimizer.update(mlx_params, mlx_gradients)``. MLX's
    ``Optimizer.update(model, gradients)`` updates its first argument in place (a dict's own
    ``update``) and returns None, so that assignment would lose the parameters; the loop below
    keeps the guide's conversions (to_mlx / from_mlx) and calls update for its effect, and Adam
    then trains the model."""
    import mlx.optimizers as optim

    backend, compiled_model = compiled
    params = compiled_model.randomize_params()
    optimizer = optim.Adam(learning_rate=0.01)
    rng = np.random.default_rng(0)
    inputs = backend.array(rng.standard_normal((32, 8)).astype(np.float32))
    targets = backend.array(rng.standard_normal((32, 4)).astype(np.float32))

    def compute_loss(outputs, targets):
        return float(((outputs - targets) ** 2).mean())

    losses = []
    for epoch in range(40):
        outputs = compiled_model.evaluate(params, {"input": inputs})
        loss = compute_loss(outputs["output"], targets)
        losses.append(loss)
        loss_gradients = 2 * (outputs["output"] - targets) / targets.size
        _, gradients = compiled_model.evaluate(params, {"input": inputs}, output_gradients={"output": loss_gradients})
        mlx_gradients = {name: backend.to_mlx(grad) for name, grad in gradients.items()}
        mlx_params = {name: backend.to_mlx(param) for name, param in params.items()}
        assert optimizer.update(mlx_params, mlx_gradients) is None  # in place, as MLX defines it
        params = {name: backend.from_mlx(param) for name, param in mlx_params.items()}
    assert losses[-1] < 0.6 * losses[0], losses


def test_from_mlx_shares_an_mlx_array():
    """004, "Memory Sharing with Other Frameworks": Core ML tensors are Apple-only
    (coremltools' ``ml_program.Tensor`` is not a class it ships), so only the MLX half runs here:
    ``backend.from_mlx(mx.array(...))`` gives the backend an MLX array with the same values."""
    backend = ml.MLXBackend()
    np_array = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    x = backend.from_mlx(mx.array(np_array))
    assert isinstance(x, mx.array)
    np.testing.assert_array_equal(backend.to_numpy(x), np_array)


@pytest.mark.parametrize("dtype", [ml.float16, ml.bfloat16])
def test_mlx_half_precision_compile(dtype):
    """000 backend comparison, "MLX Backend / Optimization Techniques" and "Backend
    Initialization Reference / MLX Backend": a half-precision MLX backend over a one-device mesh,
    jitted; parameters, data and outputs are in that dtype and close to float32's."""
    model = small_model()
    backend = ml.MLXBackend(
        dtype=dtype,
        device_mesh=(1,),
    )
    compiled_model = ml.compile(model=model, backend=backend, jit=True)
    reference = ml.compile(model, ml.MLXBackend(dtype=ml.float32))
    params32 = reference.randomize_params()
    mx_dtype = getattr(mx, dtype.name)
    params = {k: v.astype(mx_dtype) for k, v in params32.items()}
    x = np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32)
    out = compiled_model.evaluate(params, {"input": mx.array(x).astype(mx_dtype)})["output"]
    assert out.dtype == mx_dtype
    expected = reference.evaluate(params32, {"input": mx.array(x)})["output"]
    np.testing.assert_allclose(np.array(out.astype(mx.float32)), np.array(expected), rtol=0.05, atol=0.05)
