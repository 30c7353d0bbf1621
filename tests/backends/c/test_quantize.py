"""The C backend's quantization kernels (lib/mt_quantize.h): QuantizeLinear, DequantizeLinear,
DynamicQuantizeLinear, MatMulInteger, QLinearMatMul, ConvInteger and QLinearConv on
CBackend(fallback=None) equal NumPy's kernels exactly (per tensor, per axis and blocked; ties
rounding to even; saturation), and a fixed list of ONNX node-suite cases passes strictly."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from onnx import helper

import mithril as ml
from mithril import conformance
from mithril.errors import MithrilError
from tests.conftest import make_model

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no C compiler (cc or gcc) on PATH")

mk = helper.make_node
RNG = np.random.default_rng(0)


def _onnx_type(dt) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dt))


def _run(nodes, feeds: dict, outputs: dict, opset=21, initializers=()):
    """The graph of ``nodes`` on CBackend(fallback=None) and on NumPy: both results per output.
    ``outputs`` maps names to their dtypes."""
    model = make_model(nodes, [(k, _onnx_type(v.dtype), list(v.shape)) for k, v in feeds.items()],
                       [(k, _onnx_type(dt), None) for k, dt in outputs.items()], initializers, opset=opset)
    pm = ml.compile(ml.load_onnx(model), ml.CBackend(fallback=None), inference=True)
    assert not pm.program.fallback
    ref = ml.compile(ml.load_onnx(model), ml.NumpyBackend(), inference=True)
    return pm.evaluate({}, feeds), ref.evaluate({}, feeds)


def _assert_equal(got, want):
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype, k
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def _ints(dtype, *shape):
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max, shape, endpoint=True).astype(dtype)


def _scales(*shape, dtype=np.float32):
    return RNG.uniform(0.01, 0.2, shape).astype(dtype)


def test_quantize_rounds_half_to_even_and_saturates():
    """Ties (x.5 after the division) go to the even neighbour, values past the range clip to it,
    the zero point is added after rounding; per tensor into each output type, and output_dtype."""
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 1e6, -1e6, 0.0, 126.5, -127.5], np.float32)
    nodes = [mk("QuantizeLinear", ["x", "s", f"z_{t}"], [f"q_{t}"]) for t in ("i8", "u8", "i16", "u16")]
    nodes += [mk("QuantizeLinear", ["x", "s"], ["q_none"]),
              mk("QuantizeLinear", ["x", "s"], ["q_out"], output_dtype=_onnx_type(np.int16))]
    feeds = {"x": x, "s": np.float32(1.0), "z_i8": np.int8(0), "z_u8": np.uint8(10), "z_i16": np.int16(-3),
             "z_u16": np.uint16(65530)}
    outputs = {"q_i8": np.int8, "q_u8": np.uint8, "q_i16": np.int16, "q_u16": np.uint16, "q_none": np.uint8,
               "q_out": np.int16}
    got, want = _run(nodes, feeds, outputs)
    _assert_equal(got, want)
    assert got["q_i8"].tolist() == [0, 2, 2, 0, -2, -2, 4, 127, -128, 0, 126, -128]
    assert got["q_u8"].tolist() == [10, 12, 12, 10, 8, 8, 14, 255, 0, 10, 136, 0]
    assert got["q_u16"].tolist()[:3] == [65530, 65532, 65532] and got["q_u16"][7] == 65535
    assert got["q_out"].tolist()[6:9] == [4, 32767, -32768]


def test_quantize_and_dequantize_layouts():
    """Per axis (first, middle and last axis), blocked (a partial last block; the last axis with
    whole and partial blocks), float64 scales, int32 x, and round trips through DequantizeLinear."""
    x3 = RNG.standard_normal((2, 3, 5)).astype(np.float32) * 4
    x2 = RNG.standard_normal((4, 6)).astype(np.float32) * 4
    nodes = [
        mk("QuantizeLinear", ["x3", "s3", "z3"], ["pa"], axis=1),
        mk("QuantizeLinear", ["x3", "s5", "z5"], ["pl"], axis=-1),
        mk("QuantizeLinear", ["x3", "s2"], ["pf"], axis=0),
        mk("QuantizeLinear", ["x3", "sb", "zb"], ["bm"], axis=1, block_size=2),  # blocks of 2 over 3: [2, 1]
        mk("QuantizeLinear", ["x2", "sw", "zw"], ["bw"], axis=1, block_size=3),  # whole blocks on the last axis
        mk("QuantizeLinear", ["x2", "sp"], ["bp"], axis=-1, block_size=4, output_dtype=_onnx_type(np.int8)),  # 4 + 2
        mk("QuantizeLinear", ["x64", "s64", "z16"], ["q64"], axis=0),
        mk("DequantizeLinear", ["pa", "s3", "z3"], ["da"], axis=1),
        mk("DequantizeLinear", ["pl", "s5", "z5"], ["dl"], axis=2),
        mk("DequantizeLinear", ["bm", "sb", "zb"], ["dbm"], axis=1, block_size=2),
        mk("DequantizeLinear", ["bp", "sp"], ["dbp"], axis=1, block_size=4),
        mk("DequantizeLinear", ["q64", "s64", "z16"], ["d64"], axis=0),
        mk("DequantizeLinear", ["xi32", "si"], ["di32"]),
        mk("DequantizeLinear", ["xu16", "su", "zu16"], ["du16"], axis=-1),
    ]
    feeds = {"x3": x3, "x2": x2, "x64": RNG.standard_normal((3, 4)) * 100,
             "s3": _scales(3), "z3": _ints(np.uint8, 3), "s5": _scales(5), "z5": _ints(np.int8, 5), "s2": _scales(2),
             "sb": _scales(2, 2, 5), "zb": _ints(np.int8, 2, 2, 5), "sw": _scales(4, 2), "zw": _ints(np.uint8, 4, 2),
             "sp": _scales(4, 2), "s64": _scales(3, dtype=np.float64), "z16": _ints(np.int16, 3),
             "xi32": _ints(np.int32, 7), "si": np.float32(1e-3), "xu16": _ints(np.uint16, 2, 3),
             "su": _scales(3), "zu16": _ints(np.uint16, 3)}
    outputs = {"pa": np.uint8, "pl": np.int8, "pf": np.uint8, "bm": np.int8, "bw": np.uint8, "bp": np.int8,
               "q64": np.int16, "da": np.float32, "dl": np.float32, "dbm": np.float32, "dbp": np.float32,
               "d64": np.float64, "di32": np.float32, "du16": np.float32}
    got, want = _run(nodes, feeds, outputs)
    _assert_equal(got, want)
    assert np.abs(got["da"] - x3).max() <= feeds["s3"].max()  # saturation aside, a round trip is within a step


def test_quantize_int32_input_and_large_tensors():
    """int32 x (opset 13), and tensors past the threading threshold: pieces that start inside a
    row, per tensor, per axis and blocked."""
    nodes = [mk("QuantizeLinear", ["xi", "s", "z"], ["qi"]),
             mk("QuantizeLinear", ["big", "s", "z"], ["qt"]),
             mk("QuantizeLinear", ["big", "sa", "za"], ["qa"], axis=1),
             mk("DequantizeLinear", ["qa", "sa", "za"], ["da"], axis=1),
             mk("QuantizeLinear", ["wide", "sl"], ["ql"], axis=1)]
    feeds = {"xi": _ints(np.int32, 9) // 1000, "s": np.float32(0.37), "z": np.uint8(128),
             "big": RNG.standard_normal((300, 7, 19)).astype(np.float32) * 50, "sa": _scales(7),
             "za": _ints(np.uint8, 7),
             "wide": RNG.standard_normal((3, 20000)).astype(np.float32), "sl": _scales(20000)}
    got, want = _run(nodes, feeds, {"qi": np.uint8, "qt": np.uint8, "qa": np.uint8, "da": np.float32, "ql": np.uint8},
                     opset=13)
    _assert_equal(got, want)
    # Blocked past the threshold (opset 21), through a constant scale.
    x = RNG.standard_normal((257, 130)).astype(np.float32)
    got, want = _run([mk("QuantizeLinear", ["x", "s", "z"], ["q"], axis=0, block_size=7)], {"x": x}, {"q": np.int8},
                     initializers={"s": _scales(37, 130), "z": _ints(np.int8, 37, 130)})
    _assert_equal(got, want)


def test_dynamic_quantize_linear():
    """Ranges that straddle zero, all positive (the minimum clamps to 0), all zero (scale 0 -> 1
    for the division), and one past the threading threshold."""
    nodes = [mk("DynamicQuantizeLinear", [x], [f"y_{x}", f"s_{x}", f"z_{x}"]) for x in ("a", "b", "c", "d")]
    feeds = {"a": RNG.standard_normal((4, 5)).astype(np.float32), "b": RNG.uniform(1, 3, 9).astype(np.float32),
             "c": np.zeros(6, np.float32), "d": RNG.standard_normal((200, 300)).astype(np.float32) * 7}
    outputs = {}
    for x in feeds:
        outputs.update({f"y_{x}": np.uint8, f"s_{x}": np.float32, f"z_{x}": np.uint8})
    got, want = _run(nodes, feeds, outputs)
    _assert_equal(got, want)
    assert got["z_b"] == 0 and got["s_c"] == 0 and got["y_c"].tolist() == [0] * 6


def test_integer_matmuls():
    """QLinearMatMul and MatMulInteger: int8 and uint8 operands, per-row (A) and per-column (B, y)
    scales and zero points, more columns than one tile, a 1-D A, batches (shared B, broadcast)."""
    nodes = [
        mk("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"]),
        mk("QLinearMatMul", ["a", "asr", "azr", "bu", "bsc", "bzc", "ysc", "yzc"], ["yc"]),
        mk("QLinearMatMul", ["a3", "as", "az", "b", "bs", "bz", "ys", "yzu"], ["y3"]),
        mk("QLinearMatMul", ["a4", "as", "az", "b3", "bs", "bz", "ys", "yz"], ["y4"]),
        mk("QLinearMatMul", ["a1", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y1"]),
        mk("MatMulInteger", ["a", "bu", "azr", "bzc"], ["m"]),
        mk("MatMulInteger", ["au", "b"], ["m0"]),
        mk("MatMulInteger", ["a4", "b3", "az"], ["m4"]),
    ]
    M, K, N = 5, 33, 300
    feeds = {"a": _ints(np.int8, M, K), "au": _ints(np.uint8, M, K), "a3": _ints(np.int8, 2, 3, M, K),
             "a4": _ints(np.int8, 2, 1, M, K), "a1": _ints(np.int8, K), "b": _ints(np.int8, K, N),
             "bu": _ints(np.uint8, K, N), "b3": _ints(np.int8, 3, K, N),
             "as": np.float32(0.05), "az": np.int8(3), "bs": np.float32(0.02), "bz": np.int8(-2),
             "ys": np.float32(2.5), "yz": np.int8(-5), "yzu": np.uint8(100),
             "asr": _scales(M), "azr": _ints(np.int8, M), "bsc": _scales(N), "bzc": _ints(np.uint8, N),
             "ysc": _scales(N) * 40, "yzc": _ints(np.uint8, N)}
    outputs = {"y": np.int8, "yc": np.uint8, "y3": np.uint8, "y4": np.int8, "y1": np.int8, "m": np.int32,
               "m0": np.int32, "m4": np.int32}
    got, want = _run(nodes, feeds, outputs)
    _assert_equal(got, want)
    assert got["y4"].shape == (2, 3, M, N) and got["y1"].shape == (N,)
    assert 0 < np.count_nonzero(got["yc"] == 255) < got["yc"].size  # some saturate, not all


def test_integer_convolutions():
    """ConvInteger and QLinearConv: 1-D to 3-D, pads, strides, dilations, groups, SAME_UPPER,
    1x1 windows (read in place, and strided), per-output-channel weight zero points and scales, a
    bias, both signednesses."""
    nodes = [
        mk("ConvInteger", ["x2", "w2", "xz", "wz"], ["c2"], pads=[1, 2, 0, 1], strides=[2, 1], dilations=[1, 2]),
        mk("ConvInteger", ["x1", "w1"], ["c1"], auto_pad="SAME_UPPER", strides=[2]),
        mk("ConvInteger", ["x3", "w3", "xz"], ["c3"], pads=[1, 0, 1, 1, 0, 1], group=2),
        mk("QLinearConv", ["x2", "xs", "xz", "w2", "ws", "wzc", "ys", "yz", "bias"], ["q2"], pads=[1, 1, 1, 1]),
        mk("QLinearConv", ["x2s", "xs", "xzs", "wg", "wsg", "wzg", "ys", "yzs"], ["qg"], group=2, strides=[2, 2]),
        mk("ConvInteger", ["x2", "wp", "xz"], ["cp"]),
        mk("QLinearConv", ["x2", "xs", "xz", "wp", "ws", "wzp", "ys", "yz"], ["qp"], strides=[2, 1]),
    ]
    feeds = {"x2": _ints(np.uint8, 2, 4, 7, 6), "w2": _ints(np.uint8, 3, 4, 3, 2), "xz": np.uint8(128),
             "wz": np.uint8(7), "x1": _ints(np.uint8, 1, 2, 9), "w1": _ints(np.int8, 4, 2, 3),
             "x3": _ints(np.uint8, 1, 4, 3, 4, 5), "w3": _ints(np.int8, 2, 2, 2, 2, 2),
             "xs": np.float32(0.02), "ws": _scales(3), "wzc": _ints(np.uint8, 3), "ys": np.float32(3.0),
             "yz": np.uint8(120), "bias": RNG.integers(-5000, 5000, 3).astype(np.int32),
             "x2s": _ints(np.int8, 1, 4, 6, 6), "xzs": np.int8(-1), "wg": _ints(np.int8, 4, 2, 3, 3),
             "wsg": np.float32(0.01), "wzg": np.int8(0), "yzs": np.int8(0), "wp": _ints(np.int8, 3, 4, 1, 1),
             "wzp": _ints(np.int8, 3)}
    outputs = {"c2": np.int32, "c1": np.int32, "c3": np.int32, "q2": np.uint8, "qg": np.int8, "cp": np.int32,
               "qp": np.uint8}
    got, want = _run(nodes, feeds, outputs)
    _assert_equal(got, want)


def test_refusals_name_the_reason():
    """What the kernels do not take is refused at compile (strict), with the reason."""
    cases = [
        (mk("QuantizeLinear", ["x", "s"], ["y"], precision=11), {"x": np.ones(4, np.float32), "s": np.float32(1)},
         {"y": np.uint8}, 25, "precision"),
        (mk("QuantizeLinear", ["x", "s"], ["y"], axis=0, block_size=2),
         {"x": np.ones((4, 3), np.float32), "s": np.ones((3, 3), np.float32)}, {"y": np.uint8}, 21, "blocks of 2"),
        (mk("DequantizeLinear", ["x", "s"], ["y"]), {"x": np.ones(4, np.int8), "s": np.ones(4, np.float16)},
         {"y": np.float16}, 21, "float16"),
    ]
    for node, feeds, outputs, opset, reason in cases:
        with pytest.raises(MithrilError, match=reason):
            _run([node], feeds, outputs, opset=opset)


NODE_CASES = [
    "test_quantizelinear_axis", "test_quantizelinear_blocked_symmetric",
    "test_dequantizelinear_blocked", "test_dynamicquantizelinear_min_adjusted",
    "test_dynamicquantizelinear_expanded", "test_qlinearmatmul_3D_int8_float32", "test_matmulinteger",
    "test_convinteger_with_padding", "test_qlinearconv",
]


def test_node_suite_cases_pass_strictly():
    results = {name: conformance.run_case(name, "c") for name in NODE_CASES}
    bad = {n: (r.status, r.reason[:200]) for n, r in results.items() if r.status != "pass"}
    assert not bad


def test_narrow_types_are_refused_by_the_dtype_check():
    """float8 and int4 have no C element type: the shared check says so (no kernel runs)."""
    for name, dtype in (("test_quantizelinear_e4m3fn", "float8_e4m3fn"), ("test_dequantizelinear_int4", "int4"),
                        ("test_qlinearmatmul_2D_uint8_float16", "float16")):
        r = conformance.run_case(name, "c")
        assert r.status == "unsupported" and f"dtype {dtype}" in r.reason, (name, r.reason)
