"""The C backend's MaxPool fast path (lib/mt_nn_pool_t.h: 2-D, no Indices, width dilation 1): its
border columns and vectorized interior equal onnxruntime exactly in float32, float64, int8 and
uint8; NaN propagates as on NumPy; and its output is bit-identical to the generic loop's (which
the Indices output still takes), signed zeros included."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from onnx import TensorProto, helper

import mithril as ml
from tests.conftest import make_model

ort = pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no C compiler (cc or gcc) on PATH")

ONNX_TYPE = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
             np.dtype(np.int8): TensorProto.INT8, np.dtype(np.uint8): TensorProto.UINT8}

# (input name, MaxPool attributes): each hits the fast path's borders and interior differently.
CASES = [
    ("wide", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),  # ResNet's stem pool
    ("wide", dict(kernel_shape=[2, 2], strides=[2, 2])),
    ("wide", dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])),  # stride 1
    ("wide", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),  # last window past the edge
    ("wide", dict(kernel_shape=[2, 5], strides=[1, 3], pads=[1, 2, 0, 4])),  # generic stride, pads
    ("wide", dict(kernel_shape=[3, 2], dilations=[2, 1], pads=[2, 0, 2, 1])),  # row dilation only
    ("wide", dict(kernel_shape=[3, 3], pads=[2, 2, 2, 2])),  # whole windows in the padding
    ("odd", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("odd", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 1, 2, 0], ceil_mode=1)),
    ("odd", dict(kernel_shape=[2, 2])),
    ("odd", dict(kernel_shape=[4, 3], strides=[3, 1], auto_pad="SAME_UPPER")),
    ("odd", dict(kernel_shape=[2, 3], dilations=[1, 2], pads=[1, 2, 1, 2])),  # width dilation: generic
    ("line", dict(kernel_shape=[3], strides=[2], pads=[1, 1])),  # 1-D: a plane of one row
    ("line", dict(kernel_shape=[5], pads=[2, 3])),
]


def _inputs(dtype, rng):
    shapes = {"wide": (2, 3, 11, 45), "odd": (1, 2, 7, 9), "line": (2, 2, 40)}
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return {k: rng.integers(info.min, info.max, s, endpoint=True).astype(dtype) for k, s in shapes.items()}
    return {k: rng.standard_normal(s).astype(dtype) for k, s in shapes.items()}


def _model(x: dict, cases, indices=False):
    nodes = [helper.make_node("MaxPool", [name], [f"y{i}"] + ([f"i{i}"] if indices else []), **attrs)
             for i, (name, attrs) in enumerate(cases)]
    outputs = [(f"y{i}", ONNX_TYPE[x[name].dtype], None) for i, (name, _) in enumerate(cases)]
    outputs += [(f"i{i}", TensorProto.INT64, None) for i in range(len(cases))] if indices else []
    used = {name for name, _ in cases}
    return make_model(nodes, [(k, ONNX_TYPE[v.dtype], list(v.shape)) for k, v in x.items() if k in used],
                      outputs, opset=12 if any(v.dtype.kind in "iu" for v in x.values()) else 17)


def _c(model, dtype):
    backend = ml.CBackend(dtype=ml.float64 if np.dtype(dtype) == np.float64 else ml.float32, fallback=None)
    pm = ml.compile(ml.load_onnx(model), backend, inference=True)
    assert not pm.program.fallback
    return pm


def _feeds(x, cases):
    return {k: v for k, v in x.items() if k in {name for name, _ in cases}}


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.uint8])
def test_maxpool_equals_onnxruntime(dtype):
    x = _inputs(dtype, np.random.default_rng(1))
    model = _model(x, CASES)
    got = _c(model, dtype).evaluate({}, x)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, x)
    for i, w in enumerate(want):
        assert got[f"y{i}"].dtype == w.dtype, CASES[i]
        np.testing.assert_array_equal(got[f"y{i}"], w, err_msg=str(CASES[i]))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_maxpool_propagates_nan(dtype):
    """Without Indices a window holding a NaN gives NaN (NumPy's maximum), in the border columns
    and the interior; -inf windows stay -inf."""
    rng = np.random.default_rng(2)
    x = _inputs(dtype, rng)
    for v in x.values():
        flat = v.reshape(-1)
        flat[rng.choice(flat.size, flat.size // 25, replace=False)] = np.nan
        flat[rng.choice(flat.size, flat.size // 25, replace=False)] = -np.inf
    model = _model(x, CASES)
    got = _c(model, dtype).evaluate({}, x)
    numpy = ml.compile(ml.load_onnx(model), ml.NumpyBackend(dtype=ml.float64 if np.dtype(dtype) == np.float64
                                                             else ml.float32), inference=True)
    want = numpy.evaluate({}, x)
    assert any(np.isnan(v).any() for v in got.values())
    for i in range(len(CASES)):
        np.testing.assert_array_equal(got[f"y{i}"], want[f"y{i}"], err_msg=str(CASES[i]))
    # Column 0 of the ResNet case: window rows 0-1 (of 2), columns 0-1 of "wide".
    w = x["wide"][:, :, :2, :2]
    np.testing.assert_array_equal(np.isnan(got["y0"][:, :, 0, 0]), np.isnan(w).any(axis=(2, 3)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_maxpool_fast_path_is_bit_identical_to_the_generic_loop(dtype):
    """MaxPool with an Indices output takes the generic loop (and equals onnxruntime's indices);
    its Y has the same bits as the fast path's, on data full of ties between 0.0 and -0.0."""
    rng = np.random.default_rng(3)
    x = {k: (rng.integers(-1, 2, v.shape) * rng.choice([0.0, -0.0, 1.5], v.shape)).astype(dtype)
         for k, v in _inputs(dtype, rng).items()}
    assert any(np.signbit(v[v == 0]).any() and (~np.signbit(v[v == 0])).any() for v in x.values())
    fast = _c(_model(x, CASES), dtype).evaluate({}, x)
    generic = _c(_model(x, CASES, indices=True), dtype).evaluate({}, x)
    for i in range(len(CASES)):
        assert fast[f"y{i}"].tobytes() == generic[f"y{i}"].tobytes(), CASES[i]
    # Indices against onnxruntime on ties-free data (the first maximum's position is unambiguous).
    x = _inputs(dtype, rng)
    model = _model(x, CASES, indices=True)
    got = _c(model, dtype).evaluate({}, x)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, x)
    names = [f"y{i}" for i in range(len(CASES))] + [f"i{i}" for i in range(len(CASES))]
    for name, w in zip(names, want):
        np.testing.assert_array_equal(got[name], w, err_msg=name)
