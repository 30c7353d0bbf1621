"""The MLX backend: tensor API, parity with NumPy, whole-graph compile, gradients, devices, dtypes."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper

import mithril as ml
from mithril.compile import JitFallbackWarning
from mithril.errors import BackendUnavailableError, DTypeError, UnsupportedDTypeError

from tests.conftest import make_model

mx = pytest.importorskip("mlx.core", reason="the MLX backend needs mlx: pip install mithril[mlx]")
from mithril.backends.mlx import xp as mlx_xp  # noqa: E402


@pytest.fixture
def backend():
    return ml.MlxBackend(dtype=ml.float32, device="cpu")


def test_mlxbackend_alias_and_repr():
    assert ml.MLXBackend is ml.MlxBackend
    assert repr(ml.MlxBackend()) == "MlxBackend(dtype=ml.float32, device='cpu')"


def test_tensor_api_takes_and_returns_mx_arrays(backend):
    a, b = backend.ones(2, 3), backend.arange(6.0)
    assert isinstance(a, mx.array) and a.dtype == mx.float32 and backend.dtype_of(a) == np.float32
    assert backend.dtype_of(a.astype(mx.bfloat16)) == ml_dtypes.bfloat16
    assert a.shape == (2, 3)
    s = backend.add(a, backend.reshape(b, (2, 3)))
    assert isinstance(s, mx.array)
    np.testing.assert_array_equal(np.array(s), np.arange(6.0).reshape(2, 3) + 1)
    np.testing.assert_array_equal(np.array(backend.sum(s, axis=1)), [6, 15])
    np.testing.assert_array_equal(np.array(backend.relu(backend.array([-1.0, 2.0]))), [0, 2])
    m = backend.matmul(a, backend.transpose(a))
    np.testing.assert_array_equal(np.array(m), np.full((2, 2), 3.0))
    assert backend.concat([a, a], axis=1).shape == (2, 6)
    assert backend.arange(3).dtype == mx.int64
    assert backend.array([1, 2], dtype=ml.int32).dtype == mx.int32
    assert backend.zeros_like(a, dtype=ml.int32).dtype == mx.int32
    assert backend.from_numpy(np.ones(2, np.int16)).dtype == mx.int16  # the exact dtype
    # to_numpy takes mx.arrays and facade arrays alike
    assert backend.to_numpy(a).dtype == np.float32 and backend.to_numpy(mlx_xp.MlxArray(a)).shape == (2, 3)
    with pytest.raises(UnsupportedDTypeError, match="float64"):
        backend.from_numpy(np.ones(2))  # never cast silently


@pytest.mark.parametrize("jit", [True, False], ids=["mx.compile", "eager"])
def test_evaluate_takes_and_returns_mx_arrays(conv_model, backend, jit):
    x = np.random.default_rng(1).standard_normal((2, 4, 8, 8)).astype(np.float32)
    pm = ml.compile(ml.load_onnx(conv_model), backend, shapes={"x": x.shape}, data_keys=["x"], jit=jit)
    params = pm.get_parameters()
    assert all(isinstance(v, mx.array) for v in params.values())
    from_native = pm.evaluate(params, {"x": mx.array(x)})["y"]
    from_numpy = pm.evaluate({k: np.array(v) for k, v in params.items()}, {"x": x})["y"]
    assert type(from_native) is mx.array and type(from_numpy) is mx.array
    np.testing.assert_array_equal(np.array(from_native), np.array(from_numpy))
    assert (pm._jitted is not None and pm._jitted.compiled) == jit
    out, grads = pm.evaluate(params, {"x": mx.array(x)}, output_gradients={"y": mx.ones((2, 8))})
    assert type(out["y"]) is mx.array
    assert set(grads) == {"W", "x"} and all(type(g) is mx.array for g in grads.values())
    assert grads["x"].shape == (2, 4, 8, 8)
    # a float16 or float64 array for a float32 input is refused, not cast
    for wrong in (mx.float16, mx.float64):
        with pytest.raises(DTypeError, match="expects float32"):
            pm.evaluate(params, {"x": mx.array(x).astype(wrong)})


def test_facade_follows_numpy():
    xp = mlx_xp
    i32 = xp.asarray(np.array([-7, 7, -7, 7], np.int32))
    assert (i32 * 2).dtype == np.int32 and (i32 * 1.5).dtype == np.float32  # Python scalars are weak
    assert (i32 + np.int64(1)).dtype == np.int64  # NumPy scalars are not
    np.testing.assert_array_equal(xp.fmod(i32, np.array([2, -2, -2, 2], np.int32)), np.fmod([-7, 7, -7, 7], [2, -2, -2, 2]))
    x = xp.asarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    ref = np.arange(12, dtype=np.float32).reshape(3, 4)
    for key in [(slice(None), slice(None, None, -2)), (np.array([2, 0]),), (Ellipsis, None, 1), (ref > 5,)]:
        np.testing.assert_array_equal(np.asarray(x[key]), ref[key])
    assert x.argmax(axis=1).dtype == np.int64 and x.sum(axis=(0, 1), keepdims=True).shape == (1, 1)
    np.testing.assert_array_equal(np.asarray(np.float32(2) * x), 2 * ref)  # numpy defers to the facade
    y = x.copy()
    y[0] = 0
    assert float(x[0, 1]) == 1.0 and float(y[0, 1]) == 0.0  # writes never reach other holders
    np.testing.assert_array_equal(np.asarray(xp.pad(x, [(1, 1), (2, 0)], mode="reflect")),
                                  np.pad(ref, [(1, 1), (2, 0)], mode="reflect"))


def test_parity_with_numpy_conv_model(conv_model, backend):
    x = np.random.default_rng(1).standard_normal((2, 4, 8, 8)).astype(np.float32)
    ref = ml.compile(ml.load_onnx(conv_model), ml.NumpyBackend(), shapes={"x": x.shape}, inference=True).evaluate(None, {"x": x})
    pm = ml.compile(ml.load_onnx(conv_model), backend, shapes={"x": x.shape})
    got = pm.evaluate(None, {"x": backend.array(x)})
    assert pm._jitted.compiled  # the whole graph ran as one mx.compile program
    np.testing.assert_allclose(backend.to_numpy(got["y"]), ref["y"], rtol=1e-5, atol=1e-5)


def test_parity_with_numpy_small_resnet(backend):
    pytest.importorskip("torch")
    try:
        from models_zoo import torch_reference as models
    except ImportError:  # before the model zoo moved out of tests/
        from . import models

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = models.build("resnet18", image_size=32)
        onnx_bytes = models.export_onnx(spec, "torchscript")
    x = spec.numpy_inputs(2)["input"]
    ref = ml.compile(ml.load_onnx(onnx_bytes), ml.NumpyBackend(), shapes={"input": x.shape}, inference=True).evaluate(None, {"input": x})
    pm = ml.compile(ml.load_onnx(onnx_bytes), backend, shapes={"input": x.shape})
    got = backend.to_numpy(pm.evaluate(None, {"input": backend.array(x)})["output"])
    assert pm._jitted.compiled
    # float32 with different summation orders (MLX convolution vs im2col matmul).
    np.testing.assert_allclose(got, ref["output"], rtol=1e-4, atol=1e-4)


def _mlp():
    rng = np.random.default_rng(0)
    inits = {"W": rng.standard_normal((4, 3)).astype(np.float32), "B": rng.standard_normal(3).astype(np.float32)}
    nodes = [helper.make_node("Gemm", ["x", "W", "B"], ["h"]), helper.make_node("Tanh", ["h"], ["t"]),
             helper.make_node("Mul", ["t", "t"], ["y"])]
    return make_model(nodes, [("x", TensorProto.FLOAT, [2, 4])], [("y", TensorProto.FLOAT, [2, 3])], inits)


def test_gradients_match_finite_differences(backend):
    # Central differences in float64 on the NumPy backend's program as the reference; MLX computes
    # in float32, so the tolerance is float32's (observed max rel err ~1e-6).
    model = ml.load_onnx(_mlp())
    pm = ml.compile(model, backend, data_keys=["x"])
    x = np.random.default_rng(2).standard_normal((2, 4)).astype(np.float32)
    g = np.random.default_rng(3).standard_normal((2, 3)).astype(np.float32)
    params = pm.get_parameters()
    outputs, grads = pm.evaluate(params, {"x": backend.array(x)}, output_gradients={"y": backend.array(g)})
    assert set(grads) == {"W", "B", "x"}
    W, B = (backend.to_numpy(params[k]).astype(np.float64) for k in ("W", "B"))

    def loss(W, B, x):
        return float(np.sum(np.tanh(x @ W + B) ** 2 * g))

    eps = 1e-6
    for name, value in (("W", W), ("B", B), ("x", x.astype(np.float64))):
        numeric = np.zeros_like(value)
        for idx in np.ndindex(value.shape):
            args = {"W": W, "B": B, "x": x.astype(np.float64)}
            hi, lo = value.copy(), value.copy()
            hi[idx] += eps
            lo[idx] -= eps
            numeric[idx] = (loss(**{**args, name: hi}) - loss(**{**args, name: lo})) / (2 * eps)
        np.testing.assert_allclose(backend.to_numpy(grads[name]), numeric, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(backend.to_numpy(outputs["y"]), np.tanh(x @ W + B) ** 2, rtol=1e-5, atol=1e-6)


def test_gradients_match_jax(backend):
    if getattr(ml, "JaxBackend", None) is None:
        pytest.skip("the JAX backend is not in this build")
    pytest.importorskip("jax")
    x = np.random.default_rng(2).standard_normal((2, 4)).astype(np.float32)
    g = np.ones((2, 3), np.float32)
    results = []
    for b in (backend, ml.JaxBackend()):
        pm = ml.compile(ml.load_onnx(_mlp()), b, data_keys=["x"])
        _, grads = pm.evaluate(None, {"x": b.from_numpy(x)}, output_gradients={"y": b.from_numpy(g)})
        results.append({k: np.asarray(b.to_numpy(v)) for k, v in grads.items()})
    for k in results[1]:
        np.testing.assert_allclose(results[0][k], results[1][k], rtol=1e-5, atol=1e-6)


def test_missing_device_warns_and_runs_on_cpu():
    if mx.is_available(mx.gpu):
        pytest.skip("this machine has an MLX GPU")
    with pytest.warns(ml.errors.DeviceFallbackWarning, match=r"'gpu' is not present \(present devices: cpu\); running on cpu"):
        b = ml.MlxBackend(device="gpu")
    assert b.device == "cpu"
    with pytest.raises(ml.errors.BackendOptionError, match="'tpu' is not a device"):
        ml.MlxBackend(device="tpu")


def test_float64_model_is_unsupported_with_reason(backend):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", TensorProto.DOUBLE, [2])],
                       [("y", TensorProto.DOUBLE, [2])])
    with pytest.raises(UnsupportedDTypeError, match="no float64 on its default CPU path"):
        ml.compile(ml.load_onnx(model), backend)
    with pytest.raises(BackendUnavailableError, match="float64"):
        ml.MlxBackend(dtype=ml.float64)


def test_untraceable_graph_falls_back_to_op_by_op(backend):
    # NonZero's output shape depends on values: compile warns and runs it eagerly.
    model = make_model([helper.make_node("NonZero", ["x"], ["y"])], [("x", TensorProto.FLOAT, [4])],
                       [("y", TensorProto.INT64, [1, "n"])])
    with pytest.warns(JitFallbackWarning):
        pm = ml.compile(ml.load_onnx(model), backend)
    out = pm.evaluate(None, {"x": backend.array(np.array([0, 1, 0, 2], np.float32))})
    np.testing.assert_array_equal(backend.to_numpy(out["y"]), [[1, 3]])


def test_a_failed_trace_falls_back_at_first_call_once(backend):
    # Reshape's shape arrives as data: mx.compile cannot read it, so the runner runs the program
    # op by op, warns once naming the node, and stays op by op.
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape_by_data")]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [6]), ("shape", TensorProto.INT64, [2])],
                       [("y", TensorProto.FLOAT, None)])
    pm = ml.compile(ml.load_onnx(model), backend)
    assert pm._jitted.compiled
    data = {"x": np.arange(6, dtype=np.float32), "shape": np.array([2, 3])}
    with pytest.warns(JitFallbackWarning, match="reshape_by_data"):
        y = pm.evaluate(None, data)["y"]
    assert pm._jitted is None and y.shape == (2, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", JitFallbackWarning)
        assert pm.evaluate(None, data)["y"].shape == (2, 3)


def test_strings_stay_on_the_host(backend):
    """Like JAX and Torch, MLX keeps strings as NumPy object arrays: the string graph runs, its
    string outputs come back as NumPy, and numbers computed from strings become mx.arrays."""
    S, F, I = TensorProto.STRING, TensorProto.FLOAT, TensorProto.INT64
    model = make_model(
        [helper.make_node("Concat", ["s", "s"], ["both"], axis=0),
         helper.make_node("Gather", ["both", "idx"], ["picked"], axis=0),
         helper.make_node("Equal", ["picked", "t"], ["same"]),
         helper.make_node("Cast", ["same"], ["same_f"], to=F),
         helper.make_node("Mul", ["same_f", "w"], ["y"])],
        [("s", S, [2]), ("t", S, [3]), ("idx", I, [3]), ("w", F, [3])],
        [("picked", S, [3]), ("y", F, [3])],
    )
    assert backend.unsupported_dtype_reason(np.dtype(object)) is None
    strings = np.array(["cat", "dog"], dtype=object)
    assert backend.from_numpy(strings) is strings
    with warnings.catch_warnings():
        warnings.simplefilter("error", JitFallbackWarning)  # string inputs run op by op, silently
        pm = ml.compile(ml.load_onnx(model), backend)
        out = pm.evaluate(None, {"s": strings, "t": np.array(["dog", "cat", "cat"], dtype=object),
                                 "idx": np.array([3, 1, 0]), "w": np.array([1.0, 2.0, 3.0], np.float32)})
    assert isinstance(out["picked"], np.ndarray) and out["picked"].tolist() == ["dog", "dog", "cat"]
    assert isinstance(out["y"], mx.array)
    np.testing.assert_array_equal(backend.to_numpy(out["y"]), [1.0, 0.0, 3.0])
    # The facade hands any call holding a string array to NumPy.
    assert mlx_xp.take(strings, mlx_xp.asarray(np.array([1, 0]))).tolist() == ["dog", "cat"]
    assert mlx_xp.where(mlx_xp.asarray(np.array([True, False])), strings, strings[::-1]).tolist() == ["cat", "cat"]
    assert mlx_xp.concatenate([strings, strings]).shape == (4,)
