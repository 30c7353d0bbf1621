"""Issue 21, Must 5: a model's weights held once on MlxBackend.

MLX cannot compute on NumPy's memory (``mx.array(np_array)`` copies), so holding the model's NumPy
weights and handing MLX copies to the program keeps every weight twice. ``MlxBackend.share`` puts a
weight into MLX's memory once and gives the model a read-only NumPy view of it to keep in place of
its own array; ``MlxBackend.hold`` then runs that mx.array itself, no copy."""

from __future__ import annotations

import gc

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper

import mithril as ml

from tests.conftest import make_model

mx = pytest.importorskip("mlx.core", reason="the MLX backend needs mlx: pip install mithril[mlx]")


@pytest.fixture
def backend():
    return ml.MlxBackend(device="cpu")


def test_share_gives_a_read_only_numpy_view_of_one_mx_array(backend):
    arr = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    shared = backend.share(arr)
    assert shared is not arr
    assert isinstance(shared, np.ndarray) and shared.dtype == arr.dtype and shared.shape == arr.shape
    np.testing.assert_array_equal(shared, arr)
    assert not shared.flags.writeable  # nobody writes into MLX's memory through the model's view
    with pytest.raises(ValueError):
        shared[0, 0] = 1.0
    held = backend.hold(shared)
    assert isinstance(held, mx.array)
    # The very array whose memory the view shows: same address, and hold made nothing new.
    assert np.asarray(memoryview(held)).__array_interface__["data"][0] == shared.__array_interface__["data"][0]
    assert backend.hold(shared) is held
    # A read-only view of the whole view (what compile passes to hold) is the same weight too.
    view = shared.view()
    view.flags.writeable = False
    assert backend.hold(view) is held


def test_hold_allocates_nothing_for_shared_weights(backend):
    rng = np.random.default_rng(1)
    weights = [rng.standard_normal((256, 256)).astype(np.float32) for _ in range(4)]
    nbytes = sum(w.nbytes for w in weights)
    gc.collect()
    start = mx.get_active_memory()
    shared = [backend.share(w) for w in weights]
    after_share = mx.get_active_memory()
    assert after_share - start >= nbytes  # each weight copied into MLX once...
    held = [backend.hold(s) for s in shared]
    mx.eval(held)
    assert mx.get_active_memory() == after_share  # ...and not again when the program holds it
    for h, w in zip(held, weights):
        np.testing.assert_array_equal(np.asarray(h), w)


def test_hold_copies_what_is_not_a_whole_mx_array(backend):
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    shared = backend.share(arr)
    owner = backend.hold(shared)
    # A part of the view, or a plain NumPy array, is not the mx.array itself: an mx.array copy.
    part = backend.hold(shared[1:])
    assert part is not owner
    np.testing.assert_array_equal(np.asarray(part), arr[1:])
    plain = backend.hold(arr)
    assert plain is not owner
    np.testing.assert_array_equal(np.asarray(plain), arr)
    other = np.asarray(shared, dtype=np.int32)  # another dtype: a new array, not the weight
    np.testing.assert_array_equal(np.asarray(backend.hold(other)), arr.astype(np.int32))


@pytest.mark.parametrize("arr", [np.ones(3, np.float64), np.array(["a", "b"], dtype=object),
                                 np.ones(3, ml_dtypes.bfloat16)], ids=["float64", "strings", "bfloat16"])
def test_share_keeps_what_mlx_cannot_show_numpy(backend, arr):
    # float64 MLX does not hold here, strings stay on the host, bfloat16 has no buffer format NumPy reads.
    assert backend.share(arr) is arr


@pytest.mark.parametrize("arr", [np.array(2.5, np.float32), np.zeros((0, 3), np.float32),
                                 np.arange(5, dtype=np.int64), np.ones((2, 2), np.float16),
                                 np.array([True, False])], ids=["scalar", "empty", "int64", "float16", "bool"])
def test_share_keeps_values_shape_and_dtype(backend, arr):
    shared = backend.share(arr)
    assert shared.dtype == arr.dtype and shared.shape == arr.shape
    np.testing.assert_array_equal(shared, arr)
    np.testing.assert_array_equal(np.asarray(backend.hold(shared)), arr)


def test_base_backend_share_is_the_array_itself():
    arr = np.ones((2, 2), np.float32)
    assert ml.NumpyBackend().share(arr) is arr


def _mlp():
    rng = np.random.default_rng(0)
    inits = {"W": rng.standard_normal((64, 32)).astype(np.float32), "B": rng.standard_normal(32).astype(np.float32)}
    nodes = [helper.make_node("Gemm", ["x", "W", "B"], ["h"]), helper.make_node("Tanh", ["h"], ["y"])]
    return make_model(nodes, [("x", TensorProto.FLOAT, [2, 64])], [("y", TensorProto.FLOAT, [2, 32])], inits)


def test_evaluate_with_shared_weights_matches_and_keeps_parameters(backend):
    # The model's parameters replaced by shared views (what compile does with Backend.share):
    # evaluate(None) runs the mx.arrays behind them, with the same results, and get_parameters
    # still gives the weights' values.
    pm = ml.compile(ml.load_onnx(_mlp()), backend)
    x = np.random.default_rng(2).standard_normal((2, 64)).astype(np.float32)
    want = np.asarray(pm.evaluate(pm.get_parameters(), {"x": x})["y"])
    originals = {k: np.array(v) for k, v in pm._params_numpy.items()}
    pm._params_numpy = {k: backend.share(v) for k, v in pm._params_numpy.items()}
    pm._placed = None
    got = np.asarray(pm.evaluate(None, {"x": x})["y"])
    np.testing.assert_array_equal(got, want)
    for k, native in pm._own_parameters().items():
        assert native is backend.hold(pm._params_numpy[k])  # the view's own mx.array, not a copy
    for k, v in pm.get_parameters().items():
        np.testing.assert_array_equal(np.asarray(v), originals[k])


def test_compiled_model_holds_its_weights_once(backend):
    model = ml.load_onnx(_mlp())
    pm = ml.compile(model, backend)
    x = np.zeros((2, 64), np.float32)
    pm.evaluate(None, {"x": x})
    for k, native in pm._own_parameters().items():
        # The NumPy array the model keeps is a view of the very mx.array the program runs.
        assert np.asarray(memoryview(native)).__array_interface__["data"][0] == \
            pm._params_numpy[k].__array_interface__["data"][0]
    # Compiled again, the same model keeps those arrays (no third copy).
    pm2 = ml.compile(model, backend)
    for k, arr in pm2._params_numpy.items():
        assert arr.__array_interface__["data"][0] == pm._params_numpy[k].__array_interface__["data"][0]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 16, 12, 12), (2, 8, 5, 7), (3, 6, 9)], ids=["2d", "2d-batch", "1d"])
def test_pointwise_conv_is_one_matmul_with_conv_generals_values(shape, bias):
    # A 1x1 convolution runs as (O, C) @ (N, C, H*W) on the NCHW layout: the same values as
    # conv_general on the channels-last copy, bit for bit, without that copy.
    from mithril.backends.mlx.overrides import _channels_first, _channels_last, _pointwise

    rng = np.random.default_rng(3)
    x = mx.array(rng.standard_normal(shape).astype(np.float32))
    w = mx.array(rng.standard_normal((5, shape[1]) + (1,) * (len(shape) - 2)).astype(np.float32))
    b = mx.array(rng.standard_normal(5).astype(np.float32)) if bias else None
    want = mx.conv_general(_channels_last(x), _channels_last(w))
    want = _channels_first(want + b if bias else want)
    got = _pointwise(x, w, b)
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_pointwise_conv_needs_no_channels_last_copy():
    from mithril.backends.mlx.overrides import _channels_first, _channels_last, _pointwise

    x = mx.random.normal((1, 96, 56, 56), key=mx.random.key(0))
    w = mx.random.normal((24, 96, 1, 1), key=mx.random.key(1))
    mx.eval(x, w)

    def peak_added(f):
        gc.collect()
        mx.clear_cache()
        mx.reset_peak_memory()
        start = mx.get_active_memory()
        y = f()
        mx.eval(y)
        return mx.get_peak_memory() - start, y.nbytes

    added, out = peak_added(lambda: _pointwise(x, w, None))
    assert added <= out + w.nbytes  # the output (and at most a cast of the weight), no copy of x
    conv_added, _ = peak_added(lambda: _channels_first(mx.conv_general(_channels_last(x), _channels_last(w))))
    assert conv_added > added + x.nbytes // 2  # what conv_general needed beside it: x channels-last


def test_compiled_pointwise_conv_model_matches_the_numpy_backend(monkeypatch):
    from mithril.backends.mlx import overrides

    calls = []
    pointwise = overrides._pointwise
    monkeypatch.setattr(overrides, "_pointwise", lambda *a: calls.append(a[1].shape) or pointwise(*a))
    rng = np.random.default_rng(4)
    inits = {"W": rng.standard_normal((8, 4, 1, 1)).astype(np.float32), "B": rng.standard_normal(8).astype(np.float32)}
    model = make_model([helper.make_node("Conv", ["x", "W", "B"], ["y"])], [("x", TensorProto.FLOAT, [2, 4, 5, 5])],
                       [("y", TensorProto.FLOAT, [2, 8, 5, 5])], inits)
    x = rng.standard_normal((2, 4, 5, 5)).astype(np.float32)
    mlx_pm = ml.compile(ml.load_onnx(model), ml.MlxBackend(device="cpu"))
    ref_pm = ml.compile(ml.load_onnx(model), ml.NumpyBackend())
    got = np.asarray(mlx_pm.evaluate(None, {"x": x})["y"])
    np.testing.assert_allclose(got, ref_pm.evaluate(None, {"x": x})["y"], rtol=1e-5, atol=1e-5)
    assert calls and all(tuple(c) == (8, 4, 1, 1) for c in calls)  # the Conv ran as the matmul
