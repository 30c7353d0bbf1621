"""The control-flow family (mithril/backends/kernels/control_flow.py): gradients through If and
Loop on every backend whose framework differentiates them (NumPy and C have no rule for either),
in float64 against central differences and the closed form."""

import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import mithril as ml
from mithril.backends.table import BACKENDS
from mithril.errors import BackendUnavailableError

from tests.backends.test_parity import AUTODIFF
from tests.conftest import make_model

D, I64 = TensorProto.DOUBLE, TensorProto.INT64


def _float64(backend_name):
    try:
        return BACKENDS[backend_name].load()(dtype=ml.float64)
    except BackendUnavailableError as exc:  # MLX: no float64
        pytest.skip(str(exc))


def _compile(model, backend, **kw):
    """Compiled so that a backend that jits must differentiate its jitted program (a fallback
    warning fails the test)."""
    from mithril.compile import JitFallbackWarning

    with warnings.catch_warnings():
        warnings.simplefilter("error", JitFallbackWarning)
        pm = ml.compile(ml.load_onnx(model), backend, **kw)
    return _Strict(pm)


class _Strict:
    """A compiled model whose every evaluation must not fall back from its jitted program."""

    def __init__(self, pm):
        self.pm = pm

    def __getattr__(self, name):
        return getattr(self.pm, name)

    def evaluate(self, *args, **kwargs):
        from mithril.compile import JitFallbackWarning

        with warnings.catch_warnings():
            warnings.simplefilter("error", JitFallbackWarning)
            return self.pm.evaluate(*args, **kwargs)


def _finite_difference_check(pm, backend, params, data, cot, out_name, names, rng, eps=1e-6):
    out, grads = pm.evaluate(params, data, output_gradients={out_name: cot})
    assert set(names) <= set(grads)

    def loss(p, d):
        return float(np.sum(backend.to_numpy(pm.evaluate(p, d)[out_name]) * backend.to_numpy(cot)))

    for name in names:
        src = params if name in params else data
        base = backend.to_numpy(src[name])
        for i in rng.choice(base.size, size=min(3, base.size), replace=False):
            step = np.zeros(base.size)
            step[i] = eps
            plus, minus = dict(src), dict(src)
            plus[name] = backend.from_numpy(base + step.reshape(base.shape))
            minus[name] = backend.from_numpy(base - step.reshape(base.shape))
            if src is params:
                fd = (loss(plus, data) - loss(minus, data)) / (2 * eps)
            else:
                fd = (loss(params, plus) - loss(params, minus)) / (2 * eps)
            got = float(backend.to_numpy(grads[name]).reshape(-1)[i])
            assert got == pytest.approx(fd, rel=1e-5, abs=1e-8), (name, i)
    return out, grads


# -- Loop, then If on the loop's result -------------------------------------------------------
def _loop_then_if_model():
    # Loop: three steps of x <- tanh(x * w); If: the sum's sign picks x * w or x * x.
    body = helper.make_graph(
        [helper.make_node("Mul", ["x_in", "w"], ["t"]), helper.make_node("Tanh", ["t"], ["x_out"]),
         helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body",
        [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_in", D, [3])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []), helper.make_tensor_value_info("x_out", D, [3])],
    )
    then = helper.make_graph([helper.make_node("Mul", ["h", "w"], ["a"])], "then", [],
                             [helper.make_tensor_value_info("a", D, [3])])
    other = helper.make_graph([helper.make_node("Mul", ["h", "h"], ["b"])], "else", [],
                              [helper.make_tensor_value_info("b", D, [3])])
    nodes = [
        helper.make_node("Loop", ["trips", "", "x"], ["h"], body=body, name="loop"),
        helper.make_node("ReduceSum", ["h"], ["s"], keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["positive"]),
        helper.make_node("If", ["positive"], ["y"], then_branch=then, else_branch=other, name="branch"),
    ]
    inits = {"w": np.array([0.7, -1.3, 0.4]), "trips": np.array(3, np.int64), "zero": np.array(0.0)}
    return make_model(nodes, [("x", D, [3])], [("y", D, [3])], inits)


@pytest.mark.parametrize("x", [[0.5, 0.2, 0.9], [-0.5, 0.2, -0.9]], ids=["then", "else"])
@pytest.mark.parametrize("backend_name", AUTODIFF)
def test_gradients_through_if_and_loop(backend_name, x):
    rng = np.random.default_rng(1)
    backend = _float64(backend_name)
    pm = _compile(_loop_then_if_model(), backend, data_keys=["x"])
    assert "lax" not in pm.code  # control flow is the kernels' business, the program stays one line per node
    data = {"x": backend.from_numpy(np.array(x))}
    cot = backend.from_numpy(rng.standard_normal(3))
    out, _ = _finite_difference_check(pm, backend, pm.get_parameters(), data, cot, "y", ["w", "x"], rng)
    want = ml.compile(ml.load_onnx(_loop_then_if_model()), ml.NumpyBackend(), inference=True).evaluate(None, {"x": np.array(x)})["y"]
    np.testing.assert_allclose(backend.to_numpy(out["y"]), want, rtol=1e-12)
    if backend_name == "jax":
        assert pm.pm._jitted is not None  # the gradients came from the jitted program


# -- If, then Loop over the branch's result ----------------------------------------------------
def _if_then_loop_model():
    d = TensorProto.DOUBLE
    then_g = helper.make_graph([helper.make_node("Mul", ["x", "W"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", d, [3])])
    else_g = helper.make_graph([helper.make_node("Add", ["x", "W"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", d, [3])])
    body = helper.make_graph(
        [helper.make_node("Mul", ["v", "W2"], ["m"]), helper.make_node("Sin", ["m"], ["s"]),
         helper.make_node("Add", ["s", "y"], ["v_out"]), helper.make_node("Identity", ["c"], ["c_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v", d, [3])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []), helper.make_tensor_value_info("v_out", d, [3])],
    )
    nodes = [
        helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g),
        helper.make_node("Loop", ["M", "keep", "y"], ["z"], body=body),
    ]
    graph = helper.make_graph(
        nodes, "if_loop",
        [helper.make_tensor_value_info("x", d, [3]), helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("z", d, [3])],
        initializer=[numpy_helper.from_array(np.array([0.5, -1.0, 2.0]), "W"),
                     numpy_helper.from_array(np.array([1.5, 0.3, -0.7]), "W2"),
                     numpy_helper.from_array(np.array(3, np.int64), "M"),
                     numpy_helper.from_array(np.array(True), "keep")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


@pytest.mark.parametrize("cond", [True, False])
@pytest.mark.parametrize("backend_name", AUTODIFF)
def test_gradients_if_and_loop(backend_name, cond):
    model = _if_then_loop_model()
    backend = _float64(backend_name)
    pm = _compile(model, backend, data_keys={"x"})
    x = np.array([0.2, -0.4, 0.9])
    out, grads = pm.evaluate(None, {"x": backend.array(x), "cond": backend.array(np.array(cond))},
                             output_gradients={"z": backend.array(np.ones(3))})
    assert set(grads) == {"W", "W2", "x"}
    params = {k: backend.to_numpy(v) for k, v in pm.get_parameters().items()}

    def z(p, xv):
        y = xv * p["W"] if cond else xv + p["W"]
        v = y
        for _ in range(3):
            v = np.sin(v * p["W2"]) + y
        return v.sum()

    eps = 1e-6
    np.testing.assert_allclose(backend.to_numpy(out["z"]).sum(), z(params, x))
    for name in ("W", "W2"):
        for i in range(3):
            p1, p2 = dict(params), dict(params)
            p1[name] = params[name] + eps * np.eye(3)[i]
            p2[name] = params[name] - eps * np.eye(3)[i]
            assert np.isclose(backend.to_numpy(grads[name])[i], (z(p1, x) - z(p2, x)) / (2 * eps), rtol=1e-6)
    num_x = [(z(params, x + eps * e) - z(params, x - eps * e)) / (2 * eps) for e in np.eye(3)]
    np.testing.assert_allclose(backend.to_numpy(grads["x"]), num_x, rtol=1e-6)
