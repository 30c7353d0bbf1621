"""The C backend's neural-network kernels (issue 18, lib/mt_nn*.h): each op and option on
CBackend(fallback=None) equals NumPy, in float32 and float64, and a fixed list of ONNX node-suite
cases passes strictly (no NumPy fallback)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from onnx import TensorProto, helper

import mithril as ml
from tests.conftest import make_model
from mithril import conformance
from mithril.errors import NodeError

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no C compiler (cc or gcc) on PATH")



ONNX_TYPE = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE}


def _run(nodes, inputs: dict, outputs, dtype, opset=17):
    """One graph of ``nodes`` on CBackend(fallback=None) and on NumPy: both results per output.
    ``inputs`` maps names to arrays (cast to ``dtype``); output shapes come from shape inference."""
    dt = np.dtype(dtype)
    feeds = {k: np.asarray(v).astype(dt) for k, v in inputs.items()}
    model = make_model(nodes, [(k, ONNX_TYPE[dt], list(v.shape)) for k, v in feeds.items()],
                       [(k, ONNX_TYPE[dt], None) for k in outputs], opset=opset)
    loaded = ml.load_onnx(model)
    backend = ml.CBackend(dtype=ml.float64 if dt == np.float64 else ml.float32, fallback=None)
    pm = ml.compile(loaded, backend, inference=True)
    assert not pm.program.fallback
    ref = ml.compile(ml.load_onnx(model), ml.NumpyBackend(dtype=ml.float64 if dt == np.float64 else ml.float32),
                     inference=True)
    return pm.evaluate({}, feeds), ref.evaluate({}, feeds), pm


def _assert_same(got, want, dtype):
    tol = dict(rtol=1e-5, atol=1e-5) if np.dtype(dtype) == np.float32 else dict(rtol=1e-11, atol=1e-12)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].shape == want[k].shape, k
        assert got[k].dtype == want[k].dtype, k
        np.testing.assert_allclose(got[k], want[k], err_msg=k, **tol)


def _rand(*shape, seed=0):
    return np.random.default_rng(seed + len(shape)).standard_normal(shape)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_convolutions(dtype):
    """1-D and 3-D Conv, dilations and strides, SAME_LOWER, grouped, depthwise with a multiplier,
    pointwise (no im2col), and ConvTranspose with output_padding, output_shape, groups and 1-D/3-D."""
    mk = helper.make_node
    nodes = [
        mk("Conv", ["x1", "w1", "b1"], ["c1"], pads=[2, 1], strides=[2], dilations=[2]),
        mk("Conv", ["x3", "w3"], ["c3"], pads=[1, 0, 1, 1, 0, 1], strides=[1, 2, 1]),
        mk("Conv", ["x2", "w2"], ["c2"], auto_pad="SAME_LOWER", strides=[2, 2]),
        mk("Conv", ["x2", "wg", "bg"], ["cg"], group=2, pads=[1, 1, 1, 1]),
        mk("Conv", ["x2", "wd", "bd"], ["cd"], group=4, pads=[1, 2, 1, 0], strides=[1, 2]),
        mk("Conv", ["x2", "wp"], ["cp"]),
        mk("ConvTranspose", ["x2", "wt", "bt"], ["t2"], strides=[2, 3], output_padding=[1, 2], pads=[1, 0, 0, 1]),
        mk("ConvTranspose", ["x2", "wtg"], ["tg"], group=2, strides=[2, 2], output_shape=[10, 9]),
        mk("ConvTranspose", ["x1", "wt1"], ["t1"], strides=[3], dilations=[2]),
        mk("ConvTranspose", ["x3", "wt3"], ["t3"], strides=[2, 1, 2], auto_pad="SAME_UPPER"),
    ]
    inputs = {"x1": _rand(2, 3, 11), "w1": _rand(4, 3, 3), "b1": _rand(4),
              "x3": _rand(1, 2, 5, 6, 4), "w3": _rand(3, 2, 3, 2, 3),
              "x2": _rand(2, 4, 7, 6), "w2": _rand(5, 4, 3, 2), "wg": _rand(6, 2, 3, 3), "bg": _rand(6),
              "wd": _rand(8, 1, 3, 3), "bd": _rand(8), "wp": _rand(3, 4, 1, 1),
              "wt": _rand(4, 3, 3, 2), "bt": _rand(3), "wtg": _rand(4, 2, 2, 3), "wt1": _rand(3, 2, 4),
              "wt3": _rand(2, 3, 2, 2, 3)}
    outputs = ["c1", "c3", "c2", "cg", "cd", "cp", "t2", "tg", "t1", "t3"]
    got, want, pm = _run(nodes, inputs, outputs, dtype)
    _assert_same(got, want, dtype)
    src = pm.program.source
    assert "mt_conv_depthwise_" in src and "mt_conv_transpose_" in src
    assert ", 0, 2, 4, 3, 1, " in src  # the pointwise Conv reads X directly (no im2col scratch)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pools(dtype):
    """Max/Average/LpPool over 1-D, 2-D and 3-D windows with ceil_mode, dilations, auto_pad,
    count_include_pad; MaxPool's Indices (row- and column-major); the global pools."""
    mk = helper.make_node
    nodes = [
        mk("MaxPool", ["x2"], ["m1"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
        mk("MaxPool", ["x2"], ["m2", "i2"], kernel_shape=[2, 3], pads=[1, 1, 0, 1], storage_order=1),
        mk("MaxPool", ["x1"], ["m3", "i3"], kernel_shape=[3], dilations=[2], strides=[2]),
        mk("MaxPool", ["x3"], ["m4"], kernel_shape=[2, 2, 2], auto_pad="SAME_UPPER", strides=[2, 2, 2]),
        mk("AveragePool", ["x2"], ["a1"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1,
           count_include_pad=1),
        mk("AveragePool", ["x2"], ["a2"], kernel_shape=[3, 2], pads=[1, 0, 1, 1], dilations=[2, 1]),
        mk("AveragePool", ["x3"], ["a3"], kernel_shape=[3, 2, 2], auto_pad="SAME_LOWER"),
        mk("AveragePool", ["x1"], ["a4"], kernel_shape=[4], strides=[3], ceil_mode=1),
        mk("LpPool", ["x2"], ["l1"], kernel_shape=[2, 2], p=3, pads=[1, 1, 1, 1]),
        mk("GlobalMaxPool", ["x3"], ["g1"]),
        mk("GlobalAveragePool", ["x1"], ["g2"]),
        mk("GlobalLpPool", ["x2"], ["g3"], p=2),
    ]
    inputs = {"x1": _rand(2, 3, 12), "x2": _rand(1, 3, 8, 7), "x3": _rand(1, 2, 5, 4, 6)}
    outputs = ["m1", "m2", "i2", "m3", "i3", "m4", "a1", "a2", "a3", "a4", "l1", "g1", "g2", "g3"]
    dt = np.dtype(dtype)
    model = make_model(nodes, [(k, ONNX_TYPE[dt], list(v.shape)) for k, v in inputs.items()],
                       [(k, TensorProto.INT64 if k.startswith("i") else ONNX_TYPE[dt], None)
                        for k in outputs])
    feeds = {k: v.astype(dt) for k, v in inputs.items()}
    pm = ml.compile(ml.load_onnx(model), ml.CBackend(dtype=ml.float64 if dt == np.float64 else ml.float32,
                                                     fallback=None), inference=True)
    ref = ml.compile(ml.load_onnx(model), ml.NumpyBackend(dtype=ml.float64 if dt == np.float64 else ml.float32),
                     inference=True)
    got, want = pm.evaluate({}, feeds), ref.evaluate({}, feeds)
    for k in ("i2", "i3"):
        np.testing.assert_array_equal(got.pop(k), want.pop(k), err_msg=k)
    _assert_same(got, want, dtype)


def test_maxpool_on_uint8():
    x = np.random.default_rng(3).integers(0, 255, (1, 2, 6, 5)).astype(np.uint8)
    model = make_model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], pads=[1, 1, 1, 1])],
                       [("x", TensorProto.UINT8, [1, 2, 6, 5])], [("y", TensorProto.UINT8, [1, 2, 7, 6])])
    pm = ml.compile(ml.load_onnx(model), ml.CBackend(fallback=None), inference=True)
    want = ml.compile(ml.load_onnx(model), ml.NumpyBackend(), inference=True).evaluate({}, {"x": x})["y"]
    got = pm.evaluate({}, {"x": x})["y"]
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_normalizations_and_softmax(dtype):
    """LayerNormalization (axis, its Mean and InvStdDev outputs, no bias), Instance/Group/Batch
    normalization, LRN, MeanVarianceNormalization, Softmax/LogSoftmax/Hardmax, Dropout."""
    mk = helper.make_node
    nodes = [
        mk("LayerNormalization", ["x3", "s3", "b3"], ["ln", "ln_mean", "ln_inv"], axis=1, epsilon=1e-3),
        mk("LayerNormalization", ["x3", "s1"], ["ln2"]),
        mk("InstanceNormalization", ["x4", "sc", "bc"], ["inorm"], epsilon=1e-2),
        mk("GroupNormalization", ["x4", "sc", "bc"], ["gn"], num_groups=2),
        mk("BatchNormalization", ["x3", "s3c", "b3c", "m3c", "v3c"], ["bn"]),
        mk("LRN", ["x4"], ["lrn"], size=3, alpha=1e-2, beta=0.6, bias=2.0),
        mk("MeanVarianceNormalization", ["x4"], ["mvn"], axes=[1, 3]),
        mk("Softmax", ["x3"], ["sm"], axis=1),
        mk("LogSoftmax", ["x3"], ["lsm"]),
        mk("Hardmax", ["x3"], ["hm"], axis=0),
        mk("Dropout", ["x3"], ["dr", "mask"], seed=1),
    ]
    inputs = {"x3": _rand(2, 3, 5), "s3": _rand(3, 5), "b3": _rand(3, 5), "s1": _rand(5),
              "x4": _rand(2, 4, 3, 3) * 3 + 1, "sc": _rand(4), "bc": _rand(4),
              "s3c": _rand(3), "b3c": _rand(3), "m3c": _rand(3), "v3c": np.abs(_rand(3)) + 0.5}
    outputs = ["ln", "ln_mean", "ln_inv", "ln2", "inorm", "gn", "bn", "lrn", "mvn", "sm", "lsm", "hm", "dr"]
    # ONNX infers no shapes through GroupNormalization-21 nor for LayerNormalization's statistics
    shapes = {"gn": [2, 4, 3, 3], "ln_mean": [2, 1, 1], "ln_inv": [2, 1, 1], "mask": [2, 3, 5]}
    dt = np.dtype(dtype)
    feeds = {k: np.asarray(v).astype(dt) for k, v in inputs.items()}
    model = make_model(nodes, [(k, ONNX_TYPE[dt], list(v.shape)) for k, v in feeds.items()],
                       [(k, ONNX_TYPE[dt], shapes.get(k)) for k in outputs] + [("mask", TensorProto.BOOL,
                                                                                shapes["mask"])], opset=21)
    flt = ml.float64 if dt == np.float64 else ml.float32
    pm = ml.compile(ml.load_onnx(model), ml.CBackend(dtype=flt, fallback=None), inference=True)
    ref = ml.compile(ml.load_onnx(model), ml.NumpyBackend(dtype=flt), inference=True)
    got, want = pm.evaluate({}, feeds), ref.evaluate({}, feeds)
    assert got["mask"].dtype == np.bool_ and got.pop("mask").all()
    want.pop("mask")
    np.testing.assert_array_equal(got["dr"], feeds["x3"])
    _assert_same(got, want, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matmul_shapes(dtype):
    """MatMul with 1-D operands on either side and broadcast batch dims; Gemm with transposes
    and a row bias."""
    mk = helper.make_node
    nodes = [mk("MatMul", ["v", "m3"], ["mv"]), mk("MatMul", ["m4", "v"], ["vm"]), mk("MatMul", ["v", "v"], ["vv"]),
             mk("MatMul", ["b1", "b2"], ["bb"]), mk("MatMul", ["b2t", "b1t"], ["bt"]),
             mk("Gemm", ["ga", "gb", "gc"], ["gy"], transA=1, transB=1, alpha=0.5, beta=2.0)]
    inputs = {"v": _rand(4), "m3": _rand(2, 4, 3), "m4": _rand(3, 2, 5, 4), "b1": _rand(2, 1, 3, 4),
              "b2": _rand(3, 4, 2), "b2t": _rand(1, 3, 2, 4), "b1t": _rand(2, 1, 4, 5), "ga": _rand(4, 3),
              "gb": _rand(5, 4), "gc": _rand(5)}
    outputs = ["mv", "vm", "vv", "bb", "bt", "gy"]
    got, want, _ = _run(nodes, inputs, outputs, dtype)
    _assert_same(got, want, dtype)


# Node-suite cases of the nn family that pass strictly (CBackend(fallback=None)), one per op and option.
NODE_CASES = [
    "test_conv_with_autopad_same", "test_convtranspose_output_shape", "test_maxpool_with_argmax_2d_precomputed_strides",
    "test_averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_True",
    "test_layer_normalization_4d_axis_negative_2", "test_sce_mean_weight_ii_3d_log_prob",
    "test_maxunpool_export_with_output_shape", "test_batchnorm_example_training_mode",
]


def test_node_suite_cases_pass_strictly():
    results = {name: conformance.run_case(name, "c") for name in NODE_CASES}
    bad = {n: (r.status, r.reason[:200]) for n, r in results.items() if r.status != "pass"}
    assert not bad


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_onnxruntime_contrib_ops(dtype):
    """com.microsoft Gelu, BiasGelu, FastGelu (with and without bias) and SkipLayerNormalization (with
    beta, bias, and its statistics and input+skip sum outputs), as onnxruntime-optimized transformers have them."""
    mk = helper.make_node
    nodes = [mk("Gelu", ["x"], ["g"], domain="com.microsoft"),
             mk("BiasGelu", ["x", "b"], ["bg"], domain="com.microsoft"),
             mk("FastGelu", ["x", "b"], ["fg"], domain="com.microsoft"),
             mk("FastGelu", ["x"], ["fg0"], domain="com.microsoft"),
             mk("SkipLayerNormalization", ["x", "s", "gamma"], ["sl"], domain="com.microsoft")]
    outputs = [(k, [2, 3, 8]) for k in ("g", "bg", "fg", "fg0", "sl")]
    if np.dtype(dtype) == np.float32:  # the statistics are float32 whatever the input
        nodes.append(mk("SkipLayerNormalization", ["x", "s", "gamma", "beta", "b"], ["sl2", "mean", "inv", "sum"],
                        epsilon=1e-5, domain="com.microsoft"))
        outputs += [("sl2", [2, 3, 8]), ("mean", [2, 3, 1]), ("inv", [2, 3, 1]), ("sum", [2, 3, 8])]
    dt = np.dtype(dtype)
    feeds = {k: v.astype(dt) for k, v in
             {"x": _rand(2, 3, 8), "b": _rand(8), "s": _rand(2, 3, 8, seed=1), "gamma": _rand(8, seed=2),
              "beta": _rand(8, seed=3)}.items()}
    model = make_model(nodes, [(k, ONNX_TYPE[dt], list(v.shape)) for k, v in feeds.items()],
                       [(k, ONNX_TYPE[dt], shape) for k, shape in outputs],
                       domains=("com.microsoft",))
    flt = ml.float64 if dt == np.float64 else ml.float32
    pm = ml.compile(ml.load_onnx(model), ml.CBackend(dtype=flt, fallback=None), inference=True)
    ref = ml.compile(ml.load_onnx(model), ml.NumpyBackend(dtype=flt), inference=True)
    _assert_same(pm.evaluate({}, feeds), ref.evaluate({}, feeds), dtype)


def _model(nodes, feeds: dict, outputs: list, opset=17):
    types = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
             np.dtype(np.int64): TensorProto.INT64}
    return make_model(nodes, [(k, types[v.dtype], list(v.shape)) for k, v in feeds.items()],
                      [(k, types[dt], shape) for k, dt, shape in outputs], opset=opset)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_losses_unpool_and_training_batchnorm(dtype):
    """SoftmaxCrossEntropyLoss (weights, ignore_index, its log-probabilities), NegativeLogLikelihoodLoss
    (sum over (N, C, D)), MaxUnpool of MaxPool's indices (with a larger output_shape), and
    training-mode BatchNormalization with its running statistics."""
    mk, dt = helper.make_node, np.dtype(dtype)
    nodes = [mk("SoftmaxCrossEntropyLoss", ["scores", "labels", "w"], ["sce", "logp"], ignore_index=1),
             mk("SoftmaxCrossEntropyLoss", ["scores", "labels"], ["sce_none"], reduction="none"),
             mk("NegativeLogLikelihoodLoss", ["p3", "t3"], ["nll"], reduction="sum"),
             mk("MaxPool", ["img"], ["pooled", "idx"], kernel_shape=[2, 2], strides=[2, 2]),
             mk("MaxUnpool", ["pooled", "idx", "oshape"], ["unpooled"], kernel_shape=[2, 2], strides=[2, 2]),
             mk("BatchNormalization", ["img", "sc", "bc", "mc", "vc"], ["bn", "rm", "rv"], training_mode=1,
                momentum=0.8)]
    feeds = {"scores": _rand(4, 5).astype(dt), "labels": np.array([0, 1, 4, 2], np.int64),
             "w": np.abs(_rand(5)).astype(dt), "p3": _rand(2, 3, 4).astype(dt),
             "t3": np.array([[0, 2, 1, 1], [2, 2, 0, 1]], np.int64), "img": _rand(2, 3, 4, 6).astype(dt),
             "oshape": np.array([2, 3, 5, 7], np.int64), "sc": _rand(3).astype(dt), "bc": _rand(3).astype(dt),
             "mc": _rand(3).astype(dt), "vc": (np.abs(_rand(3)) + 0.5).astype(dt)}
    outputs = [("sce", dt, []), ("logp", dt, [4, 5]), ("sce_none", dt, [4]), ("nll", dt, []),
               ("unpooled", dt, [2, 3, 5, 7]), ("bn", dt, [2, 3, 4, 6]), ("rm", dt, [3]), ("rv", dt, [3])]
    model = _model(nodes, feeds, outputs, opset=15)
    flt = ml.float64 if dt == np.float64 else ml.float32
    pm = ml.compile(ml.load_onnx(model), ml.CBackend(dtype=flt, fallback=None), inference=True)
    ref = ml.compile(ml.load_onnx(model), ml.NumpyBackend(dtype=flt), inference=True)
    _assert_same(pm.evaluate({}, feeds), ref.evaluate({}, feeds), dtype)


def test_a_target_out_of_range_is_a_node_error_not_a_crash():
    feeds = {"p": _rand(3, 4).astype(np.float32), "t": np.array([0, 7, 1], np.int64)}
    model = _model([helper.make_node("NegativeLogLikelihoodLoss", ["p", "t"], ["loss"], name="nll")], feeds,
                   [("loss", np.dtype(np.float32), [])])
    pm = ml.compile(ml.load_onnx(model), ml.CBackend(fallback=None), inference=True)
    with pytest.raises(NodeError, match=r"node 'nll', op NegativeLogLikelihoodLoss, opset 17: "
                                        r"CBackend: a target is outside \[0, classes\)"):
        pm.evaluate({}, feeds)
    feeds["t"][1] = 3
    assert np.isfinite(pm.evaluate({}, feeds)["loss"])
