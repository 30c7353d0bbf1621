"""The elementwise family (mithril/backends/kernels/elementwise.py) on every backend.

Pow by a one-element exponent that is a parameter (a float initializer, as GPT-2's Gelu exports
``x ** 3``): JAX picks a multiplication for 2 and 3 at run time, Torch hands the exponent to its
scalar kernel. Values on every backend and gradients (the exponent's included) must stay NumPy's."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import mithril as ml
from mithril.backends.table import BACKENDS

from tests.conftest import make_model

EXPONENTS = [2.0, 3.0, 0.5, 2.5, -1.0]


def _model(shape=(2, 3, 4), exponent_shape=()):
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Pow", ["x", "p"], ["y"])]
    return make_model(nodes, [("x", f, list(shape))], [("y", f, list(shape))],
                      {"p": np.full(exponent_shape, 3.0, np.float32)})


def _backend(name):
    if not BACKENDS[name].installed():
        pytest.skip(f"the {name} backend needs {BACKENDS[name].array_modules[0]}")
    return BACKENDS[name].load()()


def _x(shape=(2, 3, 4)):
    # Positive bases: a fractional exponent of a negative base is NaN on every backend alike.
    return np.random.default_rng(0).uniform(0.2, 2.0, shape).astype(np.float32)


@pytest.mark.parametrize("name,jit", [("jax", True), ("jax", False), *((n, None) for n in BACKENDS if n != "jax")])
@pytest.mark.parametrize("exponent_shape", [(), (1,)])
def test_a_parameter_exponent_gives_numpy_values(name, jit, exponent_shape):
    x = _x()
    backend = _backend(name)
    pm = ml.compile(ml.load_onnx(_model(exponent_shape=exponent_shape)), backend, inference=True, jit=jit)
    for e in EXPONENTS:  # one compiled program: the exponent changes between calls
        params = {"p": np.full(exponent_shape, e, np.float32)}
        got = backend.to_numpy(pm.evaluate(params, {"x": x})["y"])
        np.testing.assert_allclose(got, np.power(x.astype(np.float64), e), rtol=2e-6, err_msg=f"exponent {e}")


def test_jax_compiles_one_program_for_every_exponent():
    pytest.importorskip("jax", reason="the JAX backend needs jax")
    x = _x()
    pm = ml.compile(ml.load_onnx(_model()), ml.JaxBackend(), inference=True)
    for e in EXPONENTS:
        pm.evaluate({"p": np.float32(e)}, {"x": x})
    assert len(pm._jitted._compiled._programs) == 1  # the exponent is data to the program, not a constant


@pytest.mark.parametrize("name", ["jax", "torch"])
@pytest.mark.parametrize("exponent", [2.0, 3.0, 2.5])
def test_gradients_with_respect_to_base_and_exponent_are_pow_s(name, exponent):
    x = _x()
    params = {"p": np.float32(exponent)}
    cot = {"y": np.random.default_rng(1).standard_normal(x.shape).astype(np.float32)}
    backend = _backend(name)
    pm = ml.compile(ml.load_onnx(_model()), backend, data_keys=["x"])
    ref = ml.compile(ml.load_onnx(_model()), ml.NumpyBackend(), data_keys=["x"])
    _, grads = pm.evaluate(params, {"x": x}, output_gradients={"y": backend.array(cot["y"])})
    _, want = ref.evaluate(params, {"x": x}, output_gradients=cot)
    # d/dx = p * x ** (p - 1); d/dp = sum(x ** p * log(x)): the fast path's gradient is pow's.
    assert set(grads) == set(want) == {"p", "x"}
    for k in want:
        np.testing.assert_allclose(np.asarray(grads[k]), want[k], rtol=1e-4, atol=1e-5, err_msg=k)


def test_jax_chooses_the_multiplication_in_the_program():
    jax = pytest.importorskip("jax", reason="the JAX backend needs jax")
    import jax.numpy as jnp

    from mithril.backends.jax.overrides import pow_

    x, p = jnp.asarray(_x()), jnp.asarray(np.float32(3.0))
    jaxpr = str(jax.make_jaxpr(lambda x, p: pow_(x, p, xp=jnp))(x, p))
    assert "cond[" in jaxpr  # lax.switch between pow, x * x and x * x * x on the traced exponent


def test_torch_hands_the_exponent_to_its_scalar_kernel():
    import torch

    from mithril.backends.torch.overrides import pow_
    from mithril.backends.torch.xp import TorchArray

    x = torch.from_numpy(np.random.default_rng(2).uniform(0.2, 2.0, 4096).astype(np.float32))
    got = pow_(TorchArray(x), TorchArray(torch.tensor(3.0)), xp=None).native
    # torch's scalar kernel computes x ** 3 as x * x * x (bit for bit); its tensor kernel calls powf.
    assert torch.equal(got, x * x * x)
    assert not torch.equal(torch.pow(x, torch.tensor(3.0)), x * x * x)
