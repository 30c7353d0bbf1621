"""The C backend's depthwise convolution (lib/mt_nn_t.h, mt_conv_depthwise): group == C Conv in
each of its paths (3x3 planes that fit the stack: flat for stride 1 with one column of padding
each side, flat2 for stride 2 over even planes, small for the other strides 1 and 2; outputs up
to 8x8 (16x16 in float32 on AVX-512) by blocks of channels; larger 3x3 planes by output rows, through a ring of padded input
rows or, too wide for it or with unequal strides, from the input rows; the generic loop for other
kernels, strides and dilations), with odd and tiny planes, asymmetric pads, channel multipliers
and fused Relu / Clip, equal to NumPy and to onnxruntime."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from onnx import TensorProto, helper

import mithril as ml
from tests.conftest import make_model

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no C compiler (cc or gcc) on PATH")

ONNX_TYPE = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE}


def _case(name, C, H, W, *, M=None, k=3, bias=True, **attrs):
    """One depthwise Conv ``name``: its node and its inputs (x, weights, bias), seeded by name."""
    M = M or C
    rng = np.random.default_rng(sum(map(ord, name)))
    feeds = {f"x_{name}": rng.standard_normal((1, C, H, W)) * 2, f"w_{name}": rng.standard_normal((M, 1, k, k))}
    if bias:
        feeds[f"b_{name}"] = rng.standard_normal(M)
    node = helper.make_node("Conv", list(feeds), [name], group=C, **attrs)
    return node, feeds


# name, channels, input height and width, Conv options: every path and edge of mt_conv_depthwise
CASES = [
    ("s1_112", 3, 112, 112, dict(pads=[1, 1, 1, 1])),                 # ring path
    ("s2_112", 3, 112, 112, dict(pads=[1, 1, 1, 1], strides=[2, 2])),  # ring path, stride 2
    ("s1_100", 2, 100, 70, dict(pads=[1, 1, 1, 1], bias=False)),      # ring path, no bias
    ("s1_56", 5, 56, 56, dict(pads=[1, 1, 1, 1])),                    # flat path (rows in float64)
    ("s2_56", 5, 56, 56, dict(pads=[1, 1, 1, 1], strides=[2, 2])),    # flat2 path (parity planes)
    ("s2_2x2", 3, 2, 2, dict(pads=[1, 1, 1, 1], strides=[2, 2])),
    ("s2_2x20", 3, 2, 20, dict(pads=[1, 1, 1, 1], strides=[2, 2])),
    ("s2_end0", 3, 8, 10, dict(pads=[1, 1, 0, 0], strides=[2, 2])),
    ("s2_7", 6, 7, 7, dict(pads=[1, 1, 1, 1], strides=[2, 2], bias=False)),  # small path, 4 phases
    ("s2_31", 3, 30, 31, dict(pads=[1, 1, 1, 1], strides=[2, 2])),
    ("s1_7", 6, 7, 7, dict(pads=[1, 1, 1, 1])),
    ("s1_5x6", 4, 5, 6, dict(pads=[1, 1, 1, 1])),
    ("s2_5x6", 4, 5, 6, dict(pads=[1, 1, 1, 1], strides=[2, 2])),
    ("s1_1x1", 3, 1, 1, dict(pads=[1, 1, 1, 1])),
    ("s2_1x1", 3, 1, 1, dict(pads=[1, 1, 1, 1], strides=[2, 2])),
    ("s1_2x9", 3, 2, 9, dict(pads=[1, 1, 1, 1])),
    ("s1_2x3000", 3, 2, 3000, dict(pads=[1, 1, 1, 1])),               # ring path: no row has all 3 taps
    ("s1_2x3100", 3, 2, 3100, dict(pads=[1, 1, 1, 1])),               # rows path (too wide for the ring in float32)
    ("s2_9x2000", 2, 9, 2000, dict(pads=[0, 2, 1, 1], strides=[2, 2])),  # ring in float32, rows in float64
    ("asym_s1", 3, 9, 8, dict(pads=[0, 2, 2, 1])),                    # pads: top, left, bottom, right
    ("flat_top0", 3, 9, 8, dict(pads=[0, 1, 2, 1])),
    ("flat_top2", 3, 9, 8, dict(pads=[2, 1, 0, 1])),
    ("flat_1x5", 3, 1, 5, dict(pads=[1, 1, 1, 1])),
    ("asym_s2", 3, 9, 8, dict(pads=[2, 0, 1, 2], strides=[2, 2])),
    ("asym_rows", 3, 100, 130, dict(pads=[0, 2, 1, 0], strides=[2, 2])),  # ring path, stride 2
    ("asym_ring", 3, 90, 120, dict(pads=[2, 0, 0, 2])),               # ring path, stride 1
    ("nopad", 3, 8, 8, dict()),
    ("s21", 3, 9, 10, dict(pads=[1, 1, 1, 1], strides=[2, 1])),       # unequal strides: rows path
    ("s12", 3, 9, 10, dict(pads=[1, 1, 1, 1], strides=[1, 2])),
    ("s21_1x1", 3, 1, 1, dict(pads=[1, 1, 1, 1], strides=[2, 1])),
    ("s3", 3, 11, 11, dict(pads=[1, 1, 1, 1], strides=[3, 3])),       # generic loop
    ("mult", 3, 10, 10, dict(pads=[1, 1, 1, 1], M=6)),                # channel multiplier 2
    ("mult_s2", 3, 10, 10, dict(pads=[1, 1, 1, 1], strides=[2, 2], M=6)),
    ("k5", 3, 12, 11, dict(pads=[2, 2, 2, 2], k=5)),                  # generic loop
    ("dil2", 3, 12, 11, dict(pads=[2, 2, 2, 2], dilations=[2, 2])),   # generic loop
    ("same", 3, 13, 13, dict(auto_pad="SAME_UPPER", strides=[2, 2])),
    # block path (outputs up to 8x8, 16x16 in float32 on AVX-512; channels a vector at a time):
    # whole blocks and a ragged one, planes not a multiple of 16 pixels
    ("blk_7", 37, 7, 7, dict(pads=[1, 1, 1, 1])),
    ("blk_s2_14", 20, 14, 14, dict(pads=[1, 1, 1, 1], strides=[2, 2])),
    ("blk_s2_odd", 18, 7, 9, dict(pads=[1, 1, 1, 1], strides=[2, 2], bias=False)),
    ("blk_asym", 17, 6, 9, dict(pads=[2, 0, 1, 2])),
    ("blk_nopad", 16, 8, 8, dict()),
    ("blk_mult", 16, 7, 7, dict(pads=[1, 1, 1, 1], M=32)),            # channel multiplier 2
    ("blk_14", 33, 14, 14, dict(pads=[1, 1, 1, 1])),                  # float32 AVX-512: transposed blocks
    ("blk_15x13", 16, 15, 13, dict(pads=[1, 0, 1, 2])),
]


def _model(cases, dtype, after=None):
    """One graph with a depthwise Conv per case; ``after(name)`` returns the nodes that read it."""
    nodes, feeds, outputs = [], {}, []
    for name, C, H, W, attrs in cases:
        attrs = dict(attrs)
        node, f = _case(name, C, H, W, M=attrs.pop("M", None), k=attrs.pop("k", 3), bias=attrs.pop("bias", True),
                        **attrs)
        nodes.append(node)
        feeds.update({k: v.astype(dtype) for k, v in f.items()})
        if after:
            more, out = after(name)
            nodes += more
            outputs.append(out)
        else:
            outputs.append(name)
    ty = ONNX_TYPE[np.dtype(dtype)]
    model = make_model(nodes, [(k, ty, list(v.shape)) for k, v in feeds.items()], [(o, ty, None) for o in outputs])
    return model, feeds


def _check(model, feeds, dtype):
    """CBackend(fallback=None) against NumPy (and onnxruntime in float32); the C program."""
    mdt = ml.float64 if dtype == np.float64 else ml.float32
    pm = ml.compile(ml.load_onnx(model), ml.CBackend(dtype=mdt, fallback=None), inference=True)
    assert not pm.program.fallback
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-11, atol=1e-12)
    matches_numpy_and_onnxruntime(pm.evaluate({}, feeds), model, feeds, dtype, tol)
    return pm.program


def matches_numpy_and_onnxruntime(got, model, feeds, dtype, tol):
    """``got`` (a C program's outputs) against NumPy's, and onnxruntime's in float32."""
    mdt = ml.float64 if dtype == np.float64 else ml.float32
    ref = ml.compile(ml.load_onnx(model), ml.NumpyBackend(dtype=mdt), inference=True)
    want = ref.evaluate({}, feeds)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].shape == want[k].shape and got[k].dtype == want[k].dtype, k
        np.testing.assert_allclose(got[k], want[k], err_msg=k, **tol)
    if dtype == np.float32:
        ort = pytest.importorskip("onnxruntime")
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        for k, v in zip(names, sess.run(names, feeds)):
            np.testing.assert_allclose(got[k], v, err_msg=k, **tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_depthwise_paths(dtype):
    program = _check(*_model(CASES, dtype), dtype)
    sfx = "f32" if dtype == np.float32 else "f64"
    assert program.source.count(f"mt_conv_depthwise_{sfx}(") == len(CASES)


def _clip(name):
    lo, hi = (helper.make_tensor(f"{name}_{b}", TensorProto.FLOAT, [], [v]) for b, v in (("lo", 0.0), ("hi", 6.0)))
    return [helper.make_node("Constant", [], [f"{name}_lo"], value=lo),
            helper.make_node("Constant", [], [f"{name}_hi"], value=hi),
            helper.make_node("Clip", [name, f"{name}_lo", f"{name}_hi"], [f"{name}_y"])], f"{name}_y"


def _relu(name):
    return [helper.make_node("Relu", [name], [f"{name}_y"])], f"{name}_y"


@pytest.mark.parametrize("after", [_clip, _relu])
def test_depthwise_with_fused_activation(after):
    """MobileNet's Conv -> Clip(0, 6) (and Relu): clamped inside the kernel, in every path."""
    model, feeds = _model(CASES, np.float32, after)
    for k in feeds:
        if k.startswith("x_"):
            feeds[k] = feeds[k] * 2  # outputs on both sides of 0 and 6
    program = _check(model, feeds, np.float32)
    assert program.source.count("mt_clip_f32(") == 0 and program.source.count("mt_relu_f32(") == 0
    bounds = "(float)0.0, (float)6.0" if after is _clip else "(float)0.0, (float)(INFINITY)"
    assert program.source.count(bounds) == len(CASES)


def test_depthwise_nan_and_inf_propagate():
    """A NaN or infinite input reaches exactly the outputs whose windows hold it, in each path."""
    cases = [c for c in CASES if c[0] in ("s1_112", "s1_56", "s2_56", "s1_7", "s1_5x6", "blk_7", "blk_s2_14", "blk_14")]
    model, feeds = _model(cases, np.float32)
    for k in feeds:
        if k.startswith("x_"):
            x = feeds[k]
            x[0, 0, 0, 0], x[0, -1, -1, -1], x[0, 0, x.shape[2] // 2, 1] = np.nan, np.inf, -np.inf
    _check(model, feeds, np.float32)
