"""3x3 convolutions by Winograd's F(2x2, 3x3) on the C backend (lib/mt_nn_winograd_t.h): which
convolutions take it, and that they equal NumPy's direct convolution on odd and even sizes,
every padding, with and without bias, a fused Relu, batches, and float64."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from onnx import TensorProto, helper

import mithril as ml
from mithril.backends.c.ops.nn import WINOGRAD_MIN_CHANNELS, WINOGRAD_MIN_OUTPUT
from tests.conftest import make_model

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no C compiler (cc or gcc) on PATH")

ONNX = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE}


def _conv(x_shape, m, *, pads=(1, 1, 1, 1), bias=True, relu=False, dtype=np.float32, strides=(1, 1), group=1):
    """A Conv (3x3) model over x_shape with m output channels, its inputs, and the C program's
    source with its outputs against NumPy's."""
    rng = np.random.default_rng(0)
    c = x_shape[1]
    w = rng.standard_normal((m, c // group, 3, 3)).astype(dtype)
    nodes = [helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["c" if relu else "y"],
                              pads=list(pads), strides=list(strides), group=group)]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    inputs = [("x", ONNX[dtype], list(x_shape)), ("w", ONNX[dtype], list(w.shape))]
    feeds = {"x": rng.standard_normal(x_shape).astype(dtype), "w": w}
    if bias:
        inputs.append(("b", ONNX[dtype], [m]))
        feeds["b"] = rng.standard_normal(m).astype(dtype)
    model = make_model(nodes, inputs, [("y", ONNX[dtype], None)], opset=17)
    ml_dtype = ml.float64 if dtype == np.float64 else ml.float32
    pm = ml.compile(ml.load_onnx(model), ml.CBackend(dtype=ml_dtype, fallback=None), inference=True)
    ref = ml.compile(ml.load_onnx(model), ml.NumpyBackend(dtype=ml_dtype), inference=True)
    got, want = pm.evaluate({}, feeds)["y"], ref.evaluate({}, feeds)["y"]
    return pm.program.source, got, want


@pytest.mark.parametrize("size", [(16, 16), (17, 19), (20, 23)])
@pytest.mark.parametrize("pads", [(1, 1, 1, 1), (0, 0, 0, 0), (2, 1, 0, 2)])
def test_winograd_equals_direct_convolution(size, pads):
    source, got, want = _conv((1, 16, *size), 24, pads=pads)
    assert "mt_conv_winograd_f32(" in source
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_winograd_without_bias_with_fused_relu_and_a_batch():
    source, got, want = _conv((3, 16, 14, 14), 16, bias=False, relu=True)
    assert "mt_conv_winograd_f32(" in source and "mt_relu_f32(" not in source
    assert (got >= 0).all()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_winograd_in_float64_is_as_exact_as_float64_allows():
    source, got, want = _conv((1, 32, 16, 16), 32, dtype=np.float64)
    assert "mt_conv_winograd_f64(" in source
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("case", [
    dict(x_shape=(1, WINOGRAD_MIN_CHANNELS - 1, 16, 16), m=16),  # too few input channels
    dict(x_shape=(1, 16, 16, 16), m=WINOGRAD_MIN_CHANNELS - 1),  # too few output channels
    dict(x_shape=(1, 16, 8, 8), m=16),  # too little output for the transforms to pay
    dict(x_shape=(1, 16, 30, 30), m=16, strides=(2, 2)),  # strided
    dict(x_shape=(1, 32, 16, 16), m=32, group=2),  # grouped
])
def test_other_convolutions_stay_direct(case):
    source, got, want = _conv(**case)
    assert "mt_conv_winograd" not in source
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert 8 * 8 < WINOGRAD_MIN_OUTPUT
