"""The nn family (mithril/backends/kernels/nn.py) on every installed backend: one-node models
compared with the shared NumPy kernel itself, and gradients through Conv, Gemm and Softmax against
central differences on every backend that differentiates."""

import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper

import mithril as ml
from mithril.backends.kernels import nn
from mithril.backends.table import BACKENDS
from mithril.errors import BackendUnavailableError

from tests.conftest import make_model

AVAILABLE = [name for name, entry in BACKENDS.items() if entry.installed()]
F = TensorProto.FLOAT


def _run(model, backend_name, x):
    backend = BACKENDS[backend_name].load()()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a node C or GGML leaves to NumPy warns once; values are the test
        pm = ml.compile(ml.load_onnx(model), backend, shapes={"x": x.shape}, inference=True)
        return backend.to_numpy(pm.evaluate(None, {"x": backend.from_numpy(x)})["y"])


@pytest.mark.parametrize("size, pads, strides", [
    (8, (1, 1, 1, 1), (2, 2)),  # the end pixel no window reads: symmetric padding still fits
    (9, (1, 1, 1, 1), (2, 2)),
    (8, (0, 1, 1, 0), (1, 2)),  # truly asymmetric
    (7, (2, 0, 0, 2), (3, 1)),
])
@pytest.mark.parametrize("backend_name", AVAILABLE)
def test_conv_and_pool_padding_geometries_match_the_shared_kernels(backend_name, size, pads, strides):
    # tests/backends/torch/test_backend.py calls Torch's own Conv and MaxPool kernels on these
    # geometries; here every backend runs them as compiled models.
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, size, size)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    attrs = dict(auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=pads, strides=strides)
    conv = helper.make_node("Conv", ["x", "W"], ["y"], pads=list(pads), strides=list(strides), name="conv")
    got = _run(make_model([conv], [("x", F, list(x.shape))], [("y", F, None)], {"W": w}), backend_name, x)
    np.testing.assert_allclose(got, nn.conv(x, w, None, xp=np, **attrs), rtol=1e-5, atol=1e-5)
    for ceil_mode in (0, 1):
        pool = dict(auto_pad="NOTSET", kernel_shape=(3, 3), pads=pads, strides=strides, ceil_mode=ceil_mode)
        node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], pads=list(pads),
                                strides=list(strides), ceil_mode=ceil_mode, name="pool")
        got = _run(make_model([node], [("x", F, list(x.shape))], [("y", F, None)]), backend_name, x)
        np.testing.assert_array_equal(got, nn.max_pool(x, xp=np, **pool))


GRADIENTS = [name for name in AVAILABLE if BACKENDS[name].load().supports_gradients]


@pytest.mark.parametrize("backend_name", GRADIENTS)
def test_conv_gemm_softmax_gradients_match_finite_differences(backend_name):
    # Conv (padded, strided) -> Tanh -> Flatten -> Gemm (transB) -> Softmax in float64: each
    # parameter's and the input's gradient against central differences, along a random direction
    # and at three sampled elements. A backend that jits (JAX) must differentiate the jitted program.
    from mithril.compile import JitFallbackWarning

    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv"),
        helper.make_node("Tanh", ["c"], ["t"]),
        helper.make_node("Flatten", ["t"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "G", "g"], ["z"], transB=1, name="gemm"),
        helper.make_node("Softmax", ["z"], ["y"], axis=-1, name="softmax"),
    ]
    inits = {"W": rng.standard_normal((3, 2, 3, 3)), "B": rng.standard_normal(3),
             "G": rng.standard_normal((5, 27)) * 0.3, "g": rng.standard_normal(5)}
    model = make_model(nodes, [("x", TensorProto.DOUBLE, [2, 2, 5, 5])], [("y", TensorProto.DOUBLE, [2, 5])], inits)
    try:
        backend = BACKENDS[backend_name].load()(dtype=ml.float64)
    except BackendUnavailableError as exc:  # MLX: no float64, and float32 differences cannot hold 1e-5
        pytest.skip(str(exc))
    eps = 1e-6
    with warnings.catch_warnings():
        warnings.simplefilter("error", JitFallbackWarning)
        pm = ml.compile(ml.load_onnx(model), backend, data_keys=["x"])
        params = {k: backend.to_numpy(v) for k, v in pm.get_parameters().items()}
        data = {"x": rng.standard_normal((2, 2, 5, 5))}
        cot = rng.standard_normal((2, 5))

        def objective(p, d):
            out = pm.evaluate({k: backend.from_numpy(v) for k, v in p.items()},
                              {k: backend.from_numpy(v) for k, v in d.items()})
            return float(np.sum(backend.to_numpy(out["y"]) * cot))

        _, grads = pm.evaluate({k: backend.from_numpy(v) for k, v in params.items()},
                               {k: backend.from_numpy(v) for k, v in data.items()},
                               output_gradients={"y": backend.from_numpy(cot)})
        assert set(grads) == set(pm.trainable_keys) | set(data) and {"W", "B", "G", "g", "x"} <= set(grads)
        for name, grad in grads.items():
            grad = backend.to_numpy(grad)
            is_param = name in params
            base = params if is_param else data

            def difference(step):
                plus, minus = dict(base), dict(base)
                plus[name], minus[name] = base[name] + step, base[name] - step
                if is_param:
                    return (objective(plus, data) - objective(minus, data)) / (2 * eps)
                return (objective(params, plus) - objective(params, minus)) / (2 * eps)

            direction = rng.standard_normal(base[name].shape)
            assert np.isclose(np.sum(grad * direction), difference(eps * direction), rtol=1e-5, atol=1e-7), name
            for i in rng.choice(base[name].size, size=min(3, base[name].size), replace=False):
                step = np.zeros(base[name].size)
                step[i] = eps
                fd = difference(step.reshape(base[name].shape))
                assert float(grad.reshape(-1)[i]) == pytest.approx(fd, rel=1e-5, abs=1e-8), (name, i)
    if backend_name == "jax":
        assert pm._jitted is not None  # the gradients came from the jitted program
