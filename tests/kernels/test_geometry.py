"""The shared window geometry (mithril/backends/kernels/geometry.py) against the ONNX semantics:
where every Conv, pool and ConvTranspose window starts, how many there are and what they read,
checked against onnx's reference evaluator and onnxruntime, and the shared kernels built on it."""

import itertools

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import mithril.backends.kernels  # noqa: F401  (registers the shared kernels)
from mithril.backends.kernels.geometry import grid_window, transposed_window, window
from mithril.backends.registry import REGISTRY

F = TensorProto.FLOAT


def _single_node(op, inputs, **attrs):
    node = helper.make_node(op, [n for n, _ in inputs], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, F, None) for n, _ in inputs],
                              [helper.make_tensor_value_info("y", F, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9), dict(inputs)


def _onnxruntime(op, inputs, **attrs):
    ort = pytest.importorskip("onnxruntime")
    model, feeds = _single_node(op, inputs, **attrs)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def _reference(op, inputs, **attrs):
    model, feeds = _single_node(op, inputs, **attrs)
    return ReferenceEvaluator(model).run(None, feeds)[0]


def _window_cases(ceil_modes=(0,)):
    """1-D windows: (size, kernel, stride, dilation, pad_begin, pad_end, auto_pad, ceil_mode)."""
    autos = ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")
    for n, k, s, d, pb, pe, auto, ceil in itertools.product((5, 6, 7), (1, 2, 3), (1, 2, 3), (1, 2), (0, 1, 2),
                                                           (0, 1), autos, ceil_modes):
        span = (k - 1) * d + 1
        if (auto != "NOTSET" and (pb or pe)) or pb >= span or pe >= span:
            continue
        yield n, k, s, d, pb, pe, auto, ceil


def _attrs(k, s, d, pb, pe, auto, **more):
    attrs = dict(kernel_shape=[k], strides=[s], dilations=[d], auto_pad=auto, **more)
    if auto == "NOTSET":
        attrs["pads"] = [pb, pe]
    return attrs


def test_conv_window_matches_onnx_reference():
    """A one-hot kernel at tap 0 reads x[o * stride - begin]: the reference Conv's output shows
    where every window starts and how many there are."""
    checked = 0
    for n, k, s, d, pb, pe, auto, _ in _window_cases():
        win = window((n,), (k,), (s,), (d,), (pb, pe) if auto == "NOTSET" else None, auto)
        x = np.arange(1, n + 1, dtype=np.float32).reshape(1, 1, n)
        w = np.zeros((1, 1, k), np.float32)
        w[0, 0, 0] = 1
        got = _reference("Conv", [("x", x), ("w", w)], **_attrs(k, s, d, pb, pe, auto))[0, 0]
        starts = [o * s - win.begin[0] for o in range(win.out[0])]
        expected = np.array([x[0, 0, i] if 0 <= i < n else 0 for i in starts], np.float32)
        assert got.tolist() == expected.tolist(), (n, k, s, d, pb, pe, auto, win)
        checked += 1
    assert checked > 300


def test_pool_window_matches_onnxruntime():
    """MaxPool of an increasing input is each window's last tap inside the input: its output
    shows every window's start, taps and count, ceil_mode included. onnxruntime's SAME padding
    of a dilated pool ignores the dilation, against the spec's formula (hand-checked below); it
    refuses pads as wide as the kernel, and SAME windows narrower than their stride (its padding
    formula goes negative there)."""
    checked = 0
    for n, k, s, d, pb, pe, auto, ceil in _window_cases(ceil_modes=(0, 1)):
        if auto.startswith("SAME") and (d > 1 or k < s) or max(pb, pe) >= k:
            continue
        win = window((n,), (k,), (s,), (d,), (pb, pe) if auto == "NOTSET" else None, auto, ceil)
        x = np.arange(1, n + 1, dtype=np.float32).reshape(1, 1, n)
        got = _onnxruntime("MaxPool", [("x", x)], **_attrs(k, s, d, pb, pe, auto, ceil_mode=ceil))[0, 0]
        expected = []
        for o in range(win.out[0]):
            inside = [i for i in (o * s + t * d - win.begin[0] for t in range(k)) if 0 <= i < n]
            expected.append(x[0, 0, max(inside)])
        assert got.tolist() == expected, (n, k, s, d, pb, pe, auto, ceil, win)
        checked += 1
    assert checked > 500


def test_same_padding_of_a_dilated_window_follows_the_spec():
    # pad = (out - 1) * stride + ((kernel - 1) * dilation + 1) - size: 5 taps wide over 5 pixels,
    # stride 1 -> 4 pixels of padding, the odd one at the end (SAME_UPPER) or the start.
    upper = window((5,), (3,), (1,), (2,), None, "SAME_UPPER")
    lower = window((5,), (3,), (1,), (2,), None, "SAME_LOWER")
    assert (upper.begin, upper.end, upper.out) == (lower.begin, lower.end, lower.out) == ((2,), (2,), (5,))
    upper = window((6,), (2,), (2,), (2,), None, "SAME_UPPER")
    lower = window((6,), (2,), (2,), (2,), None, "SAME_LOWER")
    assert (upper.begin, upper.end, upper.out) == ((0,), (1,), (3,))
    assert (lower.begin, lower.end, lower.out) == ((1,), (0,), (3,))


def test_ceil_mode_window_must_start_inside():
    # ceil_mode adds a last window only where it starts inside the input or the begin padding.
    assert window((5,), (2,), (2,), None, (0, 0), "NOTSET", 1).out == (3,)
    assert window((4,), (2,), (2,), None, (0, 0), "NOTSET", 1).out == (2,)
    assert window((5,), (3,), (3,), None, (1, 1), "NOTSET", 1).out == (2,)
    assert window((4,), (3,), (2,), None, (0, 0), "NOTSET", 1).read_pads((4,)) == ((0, 1),)


def _conv_transpose_cases():
    """(size, kernel, stride, dilation, output_padding, pads, auto_pad, output_shape or None)."""
    autos = ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")
    for n, k, s, d, op, pb, pe, auto, extra in itertools.product((3, 4), (1, 2, 3), (1, 2, 3), (1, 2), (0, 1),
                                                                (0, 1, 2), (0, 1), autos, (None, 0, -1, -2)):
        if op >= s or (auto != "NOTSET" or extra is not None) and (pb or pe):
            continue
        full = s * (n - 1) + (k - 1) * d + 1 + op
        out = full + extra if extra is not None else n * s if auto.startswith("SAME") else full - pb - pe
        # An output larger than the full result is where the spec (zeros before it) and
        # onnxruntime (zeros after it) part; a test of its own pins the spec's reading.
        if out <= 0 or out > full:
            continue
        yield n, k, s, d, op, (pb, pe), auto, None if extra is None else (full + extra,)


def _spread(x, w, s, d, geo):
    """ConvTranspose by hand: every input pixel adds its weighted kernel at i * stride."""
    canvas = np.zeros(geo.canvas[0], np.float32)
    for i, t in itertools.product(range(x.size), range(w.size)):
        canvas[geo.shift + i * s + t * d] += x[i] * w[t]
    return canvas[geo.shift + geo.begin[0]: geo.shift + geo.begin[0] + geo.out[0]]


def test_transposed_window_matches_onnxruntime():
    checked = 0
    for n, k, s, d, op, pads, auto, output_shape in _conv_transpose_cases():
        geo = transposed_window((n,), (k,), (s,), (d,), pads if auto == "NOTSET" else None, auto, (op,),
                                output_shape)
        x = np.arange(1, n + 1, dtype=np.float32)
        w = np.arange(k, dtype=np.float32) * 10 + 1
        attrs = dict(kernel_shape=[k], strides=[s], dilations=[d], auto_pad=auto, output_padding=[op])
        if output_shape is not None:
            attrs["output_shape"] = list(output_shape)
        elif auto == "NOTSET":
            attrs["pads"] = list(pads)
        got = _onnxruntime("ConvTranspose", [("x", x.reshape(1, 1, n)), ("w", w.reshape(1, 1, k))], **attrs)[0, 0]
        assert got.tolist() == _spread(x, w, s, d, geo).tolist(), (n, k, s, d, op, pads, auto, output_shape, geo)
        checked += 1
    assert checked > 400


def test_transposed_window_larger_output_pads_with_zeros_first():
    # output_shape past the full result: the spec's formula gives a negative begin pad (zeros
    # before the full result), which the ONNX suite's cases follow.
    geo = transposed_window((3,), (3,), (2,), None, None, "NOTSET", None, (9,))
    assert (geo.full, geo.begin, geo.out, geo.shift, geo.canvas) == ((7,), (-1,), (9,), 1, (9,))
    geo = transposed_window((3,), (3,), (2,), None, None, "SAME_UPPER", None, None)
    assert (geo.full, geo.begin, geo.out) == ((7,), (0,), (6,))
    # MaxUnpool's output is MaxPool's transposed window without dilation.
    assert transposed_window((2, 2), (2, 2), (2, 2), None, (0, 0, 0, 2)).out == (4, 2)
    assert grid_window((2,), (1,), (1,), (3,)).extent == (4,)


def test_shared_kernels_keep_onnx_reference_values():
    # The shared ConvTranspose (host_only) and Conv over the geometry, against the reference.
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 2, 5, 4)).astype(np.float32)
    w = rng.standard_normal((2, 3, 3, 2)).astype(np.float32)
    attrs = dict(strides=[2, 1], pads=[1, 0, 0, 1], output_padding=[1, 0], dilations=[1, 2])
    got = REGISTRY.resolve("ConvTranspose", 11).fn(x, w, auto_pad="NOTSET", group=1, kernel_shape=None,
                                                   output_shape=None, **attrs)
    np.testing.assert_allclose(got, _reference("ConvTranspose", [("x", x), ("w", w)], **attrs), rtol=1e-5, atol=1e-5)
