"""003 JAX backend, "Advanced Features / Custom JAX Operations": ``@backend.register_op("gelu")`` on
a JaxBackend, then the op used in a model between two Linear layers.

The guide's ``model += "gelu"(input="hidden", output="hidden_act")`` calls a string, which Python
cannot do; the block that does what it means is ``ml.CustomOp("gelu")(input=..., output=...)``."""

from __future__ import annotations

import numpy as np
import pytest

import mithril as ml

jax = pytest.importorskip("jax", reason="the JAX guide's examples need jax (the jax extra)")
import jax.numpy as jnp  # noqa: E402


@pytest.fixture(autouse=True)
def _isolated():
    with ml.scoped_ops():
        yield


def gelu_reference(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def test_custom_jax_operation_as_written():
    """003 JAX backend, "Advanced Features / Custom JAX Operations": the registration as typed, the
    model with ml.CustomOp in place of the string call; it compiles on the backend that registered
    the op, runs, differentiates through the op with JAX's autodiff, and exports a node of the
    custom domain."""
    backend = ml.JaxBackend()

    # Register a custom operation
    @backend.register_op("gelu")
    def gelu_jax(x):
        return 0.5 * x * (1 + jnp.tanh(jnp.sqrt(2 / jnp.pi) * (x + 0.044715 * x**3)))

    # Use in a model
    from mithril.models import Model, Linear

    model = Model()
    model |= Linear(dimension=64)(input="input", output="hidden")
    model += ml.CustomOp("gelu")(input="hidden", output="hidden_act")  # Use custom op
    model += Linear(dimension=10)(input="hidden_act", output="output")

    assert gelu_jax.__name__ == "gelu_jax"  # the decorator hands the function back
    assert model.shape_of("hidden_act") == "[...v, 64]"
    pm = ml.compile(model, backend, shapes={"input": [8, 32]})
    params = pm.randomize_params()
    x = np.random.default_rng(0).standard_normal((8, 32)).astype(np.float32)
    outputs, grads = pm.evaluate(params, {"input": backend.array(x)},
                                 output_gradients={"output": backend.ones(8, 10)})
    p = {k: np.asarray(backend.to_numpy(v)) for k, v in params.items()}
    hidden = gelu_reference(x @ p["linear_0.weight"].T + p["linear_0.bias"])
    want = hidden @ p["linear_1.weight"].T + p["linear_1.bias"]
    np.testing.assert_allclose(np.asarray(backend.to_numpy(outputs["output"])), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(backend.to_numpy(grads["linear_1.weight"])),
                               np.ones((10, 8), np.float32) @ hidden, rtol=1e-4, atol=1e-4)
    assert set(grads) == set(params)

    proto = ml.export_onnx(model, shapes={"input": [8, 32]}, params=params)
    assert [(n.domain, n.op_type) for n in proto.graph.node if n.domain] == [("mithril.custom", "gelu")]
    assert ("mithril.custom", 1) in [(o.domain, o.version) for o in proto.opset_import]


def test_custom_jax_operation_is_jax_only_until_registered_elsewhere():
    """The guide registers the op on the JAX backend: compiled on NumPy the model is refused,
    naming the node, its domain, the backend and where the op is registered; once NumPy has the
    op too, both backends agree."""
    backend = ml.JaxBackend()
    backend.register_op("gelu", lambda x: 0.5 * x * (1 + jnp.tanh(jnp.sqrt(2 / jnp.pi) * (x + 0.044715 * x**3))))
    model = ml.Model()
    model |= ml.Linear(dimension=4)(input="input", output="hidden")
    model += ml.CustomOp("gelu")(input="hidden", output="output")
    with pytest.raises(ml.errors.UnsupportedDomainError) as info:
        ml.compile(model, ml.NumpyBackend(), shapes={"input": [2, 3]})
    msg = str(info.value)
    assert "unsupported domain(s) mithril.custom on backend 'numpy'" in msg
    assert "mithril.custom::gelu (opset 1); registered for jax only" in msg
    assert "ml.NumpyBackend.register_op('gelu', fn)" in msg

    ml.NumpyBackend.register_op("gelu", gelu_reference)
    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    results = []
    for b in (ml.NumpyBackend(), backend):
        pm = ml.compile(model, b, shapes={"input": [2, 3]})
        params = {"linear_0.weight": np.eye(4, 3, dtype=np.float32), "linear_0.bias": np.zeros(4, np.float32)}
        out = pm.evaluate({k: b.array(v) for k, v in params.items()}, {"input": b.array(x)})["output"]
        results.append(np.asarray(b.to_numpy(out)))
    np.testing.assert_allclose(results[0], results[1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(results[0][:, :3], gelu_reference(x), rtol=1e-5, atol=1e-6)


def test_the_string_call_cannot_run():
    """The guide's ``model += "gelu"(input="hidden", output="hidden_act")`` calls a str: Python warns
    when it compiles the line and raises TypeError when it runs, before Mithril sees anything.
    ``ml.CustomOp("gelu")`` is the block the line means."""
    model = ml.Model()
    model |= ml.Linear(dimension=64)(input="input", output="hidden")
    line = 'model += "gelu"(input="hidden", output="hidden_act")  # Use custom op'
    with pytest.warns(SyntaxWarning, match="'str' object is not callable"):
        code = compile(line, "003 Custom JAX Operations", "exec")
    with pytest.raises(TypeError, match="'str' object is not callable"):
        exec(code, {"model": model})
    model += ml.CustomOp("gelu")(input="hidden", output="hidden_act")  # Use custom op
    assert model.shape_of("hidden_act") == "[...v, 64]"
