"""NumPy's Conv override (mithril/backends/numpy/conv.py) against the shared im2col kernel:
depthwise in both layouts (channels first for large images, channels last for small ones) and
dense (group 1) over one or many blocks of output rows; strides, dilations, asymmetric and auto
pads, odd sizes, batches, float32 and float64, and through a compiled model under
NumpyBackend(num_threads=2) against onnxruntime. Also NumPy's separable MaxPool
(mithril/backends/numpy/pool.py) against the shared kernel, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import mithril as ml
from mithril.backends.kernels.geometry import window
from mithril.backends.kernels.nn import conv as shared_conv
from mithril.backends.numpy import conv as fast
from mithril.backends.numpy.overrides import conv as numpy_conv

# name, (n, c, h, w), kernel, Conv attributes
CASES = [
    ("s1_3x3", (1, 8, 17, 13), (3, 3), dict(pads=[1, 1, 1, 1])),
    ("s2_3x3", (1, 8, 17, 13), (3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2])),
    ("s2_even", (1, 6, 16, 16), (3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2])),
    ("s3_5x5", (1, 5, 23, 19), (5, 5), dict(pads=[2, 1, 0, 2], strides=[3, 3])),
    ("s1x2", (1, 4, 11, 14), (3, 3), dict(pads=[1, 1, 1, 1], strides=[1, 2])),
    ("dil2", (1, 6, 15, 15), (3, 3), dict(pads=[2, 2, 2, 2], dilations=[2, 2])),
    ("dil2_s2", (1, 6, 15, 15), (3, 3), dict(pads=[2, 2, 2, 2], dilations=[2, 2], strides=[2, 2])),
    ("dil3x1_s2x1", (1, 3, 20, 9), (3, 2), dict(pads=[0, 1, 3, 0], dilations=[3, 1], strides=[2, 1])),
    ("no_pad", (1, 7, 9, 9), (3, 3), dict()),
    ("pad_only_end", (1, 7, 9, 9), (3, 3), dict(pads=[0, 0, 2, 2], strides=[2, 2])),
    ("same_upper", (1, 5, 10, 7), (3, 3), dict(auto_pad="SAME_UPPER", strides=[2, 2])),
    ("same_lower", (1, 5, 10, 7), (4, 4), dict(auto_pad="SAME_LOWER")),
    ("valid", (1, 5, 10, 7), (3, 3), dict(auto_pad="VALID", strides=[2, 2])),
    ("1x1", (1, 4, 6, 5), (1, 1), dict(strides=[2, 2])),
    ("wide_kernel", (1, 3, 4, 40), (1, 7), dict(pads=[0, 3, 0, 3])),
    ("tiny", (1, 3, 1, 1), (3, 3), dict(pads=[1, 1, 1, 1])),
    ("batch", (3, 4, 12, 10), (3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2])),
    # many channels over a small image: the channels-last path
    ("cl_s1", (1, 96, 7, 7), (3, 3), dict(pads=[1, 1, 1, 1])),
    ("cl_s2", (2, 80, 9, 8), (3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2])),
    ("cl_dil", (1, 64, 6, 6), (3, 3), dict(pads=[2, 2, 2, 2], dilations=[2, 2])),
    # channels-first blocks with several blocks and a short last one
    ("cf_blocks", (1, 37, 60, 61), (3, 3), dict(pads=[1, 1, 1, 1])),
]


def _inputs(name, shape, kernel, dtype, bias=True):
    rng = np.random.default_rng(sum(map(ord, name)))
    c = shape[1]
    x = (rng.standard_normal(shape) * 2).astype(dtype)
    w = rng.standard_normal((c, 1) + kernel).astype(dtype)
    b = rng.standard_normal(c).astype(dtype) if bias else None
    return x, w, b


def _attrs(attrs, kernel, group):
    full = dict(auto_pad="NOTSET", dilations=None, pads=None, strides=None)
    full.update(attrs)
    return dict(full, group=group, kernel_shape=list(kernel))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name,shape,kernel,attrs", CASES, ids=[c[0] for c in CASES])
def test_depthwise_equals_shared_kernel(name, shape, kernel, attrs, dtype):
    x, w, b = _inputs(name, shape, kernel, dtype, bias=not name.startswith("no_"))
    kw = _attrs(attrs, kernel, shape[1])
    assert fast.is_depthwise_2d(x, w, b, shape[1])
    want = shared_conv(x, w, b, xp=np, **kw)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    win = window(x.shape[2:], w.shape[2:], kw["strides"], kw["dilations"], kw["pads"], kw["auto_pad"])
    got = fast.depthwise_2d(x, w, b, win)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, **tol)
    got = numpy_conv(x, w, b, xp=np, **kw)  # the registered override, through its dispatch
    np.testing.assert_allclose(got, want, **tol)


def test_mobilenet_layers_both_layouts():
    # MobileNetV2's depthwise shapes at stride 1 and 2: a 112x112 image (channels first, several
    # blocks) and a 14x14 one with 576 channels (channels last).
    for shape in [(1, 32, 112, 112), (1, 576, 14, 14)]:
        x, w, b = _inputs(str(shape), shape, (3, 3), np.float32)
        for s in (1, 2):
            kw = _attrs(dict(pads=[1, 1, 1, 1], strides=[s, s]), (3, 3), shape[1])
            want = shared_conv(x, w, b, xp=np, **kw)
            assert want.shape[2:] == (shape[2] // s, shape[3] // s)
            np.testing.assert_allclose(numpy_conv(x, w, b, xp=np, **kw), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", [
    ("grouped_not_depthwise", (1, 8, 9, 9), (8, 2, 3, 3), 4, np.float32),
    ("channel_multiplier", (1, 4, 9, 9), (8, 1, 3, 3), 4, np.float32),
    ("conv1d", (1, 4, 9), (4, 1, 3), 4, np.float32),
    ("float16", (1, 4, 9, 9), (4, 1, 3, 3), 4, np.float16),
    ("dense_1x1", (1, 4, 9, 9), (6, 4, 1, 1), 1, np.float32),
    ("dense_float16", (1, 4, 9, 9), (6, 4, 3, 3), 1, np.float16),
    ("dense_conv3d", (1, 2, 5, 5, 5), (3, 2, 3, 3, 3), 1, np.float32),
], ids=lambda c: c[0])
def test_other_convs_take_the_shared_kernel(case):
    name, xshape, wshape, group, dtype = case
    rng = np.random.default_rng(len(name))
    x = rng.standard_normal(xshape).astype(dtype)
    w = rng.standard_normal(wshape).astype(dtype)
    assert not fast.is_depthwise_2d(x, w, None, group) and not fast.is_dense_2d(x, w, None, group)
    nd = len(xshape) - 2
    kw = dict(auto_pad="NOTSET", dilations=None, group=group, kernel_shape=list(wshape[2:]), pads=[1] * 2 * nd,
              strides=None)
    np.testing.assert_array_equal(numpy_conv(x, w, None, xp=np, **kw), shared_conv(x, w, None, xp=np, **kw))


@pytest.mark.parametrize("cols_bytes", [1 << 20, 3000], ids=["one_block", "many_blocks"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name,shape,kernel,attrs", [c for c in CASES if c[2] != (1, 1)],
                         ids=[c[0] for c in CASES if c[2] != (1, 1)])
def test_dense_equals_shared_kernel(name, shape, kernel, attrs, dtype, cols_bytes, monkeypatch):
    # 3000 bytes of columns a block: several blocks of output rows on every case with more than a
    # few rows, most with a shorter last block.
    monkeypatch.setattr(fast, "_COLS_BYTES", cols_bytes)
    rng = np.random.default_rng(sum(map(ord, name)) + 1)
    x = (rng.standard_normal(shape) * 2).astype(dtype)
    w = rng.standard_normal((5, shape[1]) + kernel).astype(dtype)
    b = None if name.startswith("no_") else rng.standard_normal(5).astype(dtype)
    kw = _attrs(attrs, kernel, 1)
    assert fast.is_dense_2d(x, w, b, 1)
    want = shared_conv(x, w, b, xp=np, **kw)
    win = window(x.shape[2:], w.shape[2:], kw["strides"], kw["dilations"], kw["pads"], kw["auto_pad"])
    got = fast.dense_2d(x, w, b, win)
    assert got.shape == want.shape and got.dtype == want.dtype and got.flags.c_contiguous
    tol = dict(rtol=1e-5, atol=1e-4) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-11)
    np.testing.assert_allclose(got, want, **tol)
    np.testing.assert_allclose(numpy_conv(x, w, b, xp=np, **kw), want, **tol)


def test_dense_blocks_split_resnet_layers():
    # ResNet-18's first 3x3 layer: 2.3 MiB of float32 columns, two blocks of 28 rows; the 7x7 stem
    # with stride 2: 7.4 MiB, seven blocks of 16 rows. Both against the shared kernel.
    for shape, m, kernel, stride, pad in [((1, 64, 56, 56), 64, 3, 1, 1), ((1, 3, 224, 224), 64, 7, 2, 3)]:
        rng = np.random.default_rng(m + kernel)
        x = rng.standard_normal(shape).astype(np.float32)
        w = (rng.standard_normal((m, shape[1], kernel, kernel)) * 0.1).astype(np.float32)
        b = rng.standard_normal(m).astype(np.float32)
        kw = _attrs(dict(pads=[pad] * 4, strides=[stride] * 2), (kernel, kernel), 1)
        oh = (shape[2] + 2 * pad - kernel) // stride + 1
        assert shape[1] * kernel * kernel * oh * oh * 4 // fast._COLS_BYTES >= 2  # more than one block
        np.testing.assert_allclose(numpy_conv(x, w, b, xp=np, **kw), shared_conv(x, w, b, xp=np, **kw),
                                   rtol=1e-4, atol=1e-4)


# name, input shape, dtype, MaxPool attributes
POOLS = [
    ("resnet_stem", (1, 4, 112, 112), np.float32, dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])),
    ("2x2", (2, 3, 9, 8), np.float32, dict(kernel_shape=[2, 2], strides=[2, 2])),
    ("ceil", (1, 3, 9, 8), np.float64, dict(kernel_shape=[3, 2], strides=[2, 2], ceil_mode=1)),
    ("dilated", (1, 2, 13, 11), np.float32, dict(kernel_shape=[3, 3], dilations=[2, 3], pads=[1, 2, 2, 0])),
    ("same_upper", (1, 2, 10, 7), np.float32, dict(kernel_shape=[3, 3], auto_pad="SAME_UPPER", strides=[2, 1])),
    ("1d", (2, 3, 17), np.float32, dict(kernel_shape=[4], strides=[3], pads=[1, 2])),
    ("3d", (1, 2, 6, 7, 5), np.float32, dict(kernel_shape=[2, 3, 2], pads=[0, 1, 0, 1, 1, 1])),
    ("int8", (1, 3, 8, 8), np.int8, dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])),
    ("uint8", (1, 3, 8, 8), np.uint8, dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])),
    ("1x1", (1, 3, 5, 5), np.float32, dict(kernel_shape=[1, 1], strides=[2, 2])),
]


@pytest.mark.parametrize("name,shape,dtype,attrs", POOLS, ids=[p[0] for p in POOLS])
def test_separable_max_pool_equals_shared_kernel(name, shape, dtype, attrs):
    from mithril.backends.kernels.nn import max_pool as shared_max_pool
    from mithril.backends.numpy.overrides import max_pool

    rng = np.random.default_rng(sum(map(ord, name)))
    if np.dtype(dtype).kind == "f":
        x = (rng.standard_normal(shape) * 4).astype(dtype)
        x.flat[::17] = -np.inf  # windows of -inf and padding: the pad value must not win or lose
        x.flat[5] = np.nan  # propagates through np.maximum along both axes, as in the shared kernel
    else:
        x = rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max, shape, endpoint=True).astype(dtype)
    kw = dict(dict(auto_pad="NOTSET", pads=None, strides=None), **attrs)
    want = shared_max_pool(x, xp=np, **kw)
    got = max_pool(x, xp=np, **kw)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)  # the same maxima, bit for bit, NaN where the shared has NaN
    # With the Indices output the override hands the node to the shared kernel.
    got_y, got_i = max_pool(x, xp=np, num_outputs=2, **kw)
    want_y, want_i = shared_max_pool(x, xp=np, num_outputs=2, **kw)
    np.testing.assert_array_equal(got_y, want_y)
    np.testing.assert_array_equal(got_i, want_i)


def test_compiled_model_under_two_threads_matches_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    c = 48
    rng = np.random.default_rng(3)
    w = rng.standard_normal((c, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y1"], group=c, pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["y1", "lo", "hi"], ["y2"]),
             helper.make_node("Conv", ["y2", "w", "b"], ["y"], group=c, pads=[1, 1, 1, 1], strides=[2, 2])]
    graph = helper.make_graph(
        nodes, "dw", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 56, 56])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 28, 28])],
        initializer=[helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel()),
                     helper.make_tensor("b", TensorProto.FLOAT, b.shape, b),
                     helper.make_tensor("lo", TensorProto.FLOAT, [], [0.0]),
                     helper.make_tensor("hi", TensorProto.FLOAT, [], [6.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((1, c, 56, 56)).astype(np.float32)
    pm = ml.compile(model, ml.NumpyBackend(num_threads=2))
    got = pm.evaluate(pm.get_parameters(), {"x": x})["y"]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# NumPy's float32 Erf (mithril/backends/numpy/overrides.py), the other speed override BERT's Gelu runs
# through: this file holds the NumPy backend's fast-path checks.


def test_float32_erf_close_to_exact_erf():
    from scipy import special

    from mithril.backends.numpy.overrides import erf

    x = np.concatenate([np.linspace(-6, 6, 200001), [0.0, -0.0, 1e-30, 3.99, 4.0, 4.01, 50.0]]).astype(np.float32)
    got = erf(x, xp=np)
    exact = special.erf(x.astype(np.float64))
    assert got.dtype == np.float32 and got.shape == x.shape
    assert np.max(np.abs(got - exact)) < 5e-7
    assert np.max(np.abs(got)) <= 1.0
    # Signs, zeros, infinities and NaN as erf has them.
    special_x = np.array([np.inf, -np.inf, np.nan, -0.0, 0.0], np.float32)
    out = erf(special_x, xp=np)
    assert out[:2].tolist() == [1.0, -1.0] and np.isnan(out[2]) and np.signbit(out[3]) and not np.signbit(out[4])
    # Shapes of every rank, blocks included (more elements than one block).
    big = np.random.default_rng(0).standard_normal((3, 70001)).astype(np.float32)
    np.testing.assert_allclose(erf(big, xp=np), special.erf(big.astype(np.float64)), rtol=0, atol=5e-7)
    assert erf(np.float32(0.5).reshape(()), xp=np).shape == ()
    # float64 keeps scipy's erf.
    np.testing.assert_array_equal(erf(x.astype(np.float64), xp=np), exact)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("power", [2, 3, 4, 2.5, -1])
def test_pow_by_small_integer_is_multiplication(dtype, power):
    from mithril.backends.kernels.elementwise import pow_ as shared_pow
    from mithril.backends.numpy.overrides import pow_

    x = np.concatenate([np.random.default_rng(power != 3).standard_normal(1000) * 10,
                        [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -3e12]]).astype(dtype).reshape(1, 1007)
    with np.errstate(all="ignore"):
        exact = np.power(x.astype(np.longdouble), power)
        for y in (np.array(power, dtype), np.array([power], np.float64), np.array([[power]], np.int64)):
            if isinstance(power, float) and y.dtype.kind == "i":
                continue
            got = pow_(x, y, xp=np)
            want = shared_pow(x, y, xp=np)
            assert got.dtype == dtype and got.shape == want.shape == x.shape
            # Within two ulp of the exact power; infinities, NaN and the sign of zero as pow has them.
            np.testing.assert_allclose(got, want, rtol=4 * np.finfo(dtype).eps, atol=0)
            np.testing.assert_allclose(got, exact.astype(dtype), rtol=4 * np.finfo(dtype).eps, atol=0)
            assert np.array_equal(np.signbit(got), np.signbit(want))
    # A base broadcast against a larger exponent keeps the shared kernel's shape.
    assert pow_(np.ones(3, dtype), np.full((2, 3), 2.0, dtype), xp=np).shape == (2, 3)
