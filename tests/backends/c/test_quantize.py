"""The C backend's quantization kernels (lib/mt_quantize.h): QuantizeLinear, DequantizeLinear,
DynamicQuantizeLinear, MatMulInteger, QLinearMatMul, ConvInteger and QLinearConv on
CBackend(fallback=None) equal NumPy's kernels exactly (per tensor, per axis and blocked; ties
rounding to even; saturation; int4/int2, float8 and float4 values, half scales), and a fixed list
of ONNX node-suite cases passes strictly."""

from __future__ import annotations

import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest
from onnx import helper

import mithril as ml
from mithril import conformance
from mithril.backends.c import build
from mithril.errors import MithrilError
from tests.conftest import make_model

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no C compiler (cc or gcc) on PATH")

mk = helper.make_node
RNG = np.random.default_rng(0)


def _onnx_type(dt) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dt))


def _run(nodes, feeds: dict, outputs: dict, opset=21, initializers=(), warnings_as_errors=False):
    """The graph of ``nodes`` on CBackend(fallback=None) and on NumPy: both results per output.
    ``outputs`` maps names to their dtypes. ``warnings_as_errors``: its C source must also compile
    under -Wall -Wextra -Werror."""
    model = make_model(nodes, [(k, _onnx_type(v.dtype), list(v.shape)) for k, v in feeds.items()],
                       [(k, _onnx_type(dt), None) for k, dt in outputs.items()], initializers, opset=opset)
    pm = ml.compile(ml.load_onnx(model), ml.CBackend(fallback=None), inference=True)
    assert not pm.program.fallback
    if warnings_as_errors:
        cc = shutil.which("cc") or shutil.which("gcc")
        done = subprocess.run([cc, "-fsyntax-only", "-std=c11", "-fopenmp", "-Wall", "-Wextra", "-Werror",
                               f"-I{build.LIB_DIR}", "-x", "c", "-"], input=pm.program.source, capture_output=True,
                              text=True)
        assert done.returncode == 0, done.stderr
    ref = ml.compile(ml.load_onnx(model), ml.NumpyBackend(), inference=True)
    return pm.evaluate({}, feeds), ref.evaluate({}, feeds)


def _assert_equal(got, want):
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype, k
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def _assert_same(got, want):
    """Equal values of each output's dtype, signs of zeros included and NaN equal to NaN (the
    narrow types compared through float64, which holds each of them exactly)."""
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype, k
        g, w = got[k].astype(np.float64), want[k].astype(np.float64)
        np.testing.assert_array_equal(g, w, err_msg=k)
        assert (np.signbit(g) == np.signbit(w))[~np.isnan(w)].all(), k


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


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NumPy's inf * 0
def test_narrow_types():
    """int4/uint4/int2/uint2, the four float8 kinds and float4 through (De)QuantizeLinear: per
    tensor, per axis and blocked; zero points (float8 ones added, as NumPy's kernel does); float16,
    bfloat16 and float8e8m0 scales; half x and outputs; saturate=0 (inf and NaN kept, out of range
    to inf or NaN) and 1; float64 division and precision=float32."""
    f8, t = ml_dtypes, _onnx_type
    x = np.array([[0.5, 1.5, 2.5, -0.5, -1.5, 7.4, -9.0, 0.0],
                  [3.0, -3.0, 1e3, -1e3, 0.26, -0.74, 2.25, 6.5],
                  [-2.5, 0.75, 1.25, 13.0, -13.0, 4.5, -4.5, 0.125]], np.float32)
    xf = np.array([[0.3, -1e6, 500.0, np.inf, -np.inf, np.nan, 1e-4, -0.0],
                   [448.0, 464.0, -480.0, 57344.0, 61440.0, 2.0 ** -10, -3.3, 7.0],
                   [1.0 + 2.0 ** -4, -(1.0 + 2.0 ** -4), 0.0625, 100.0, -0.3, 6.0, 5.0, -7.0]], np.float32)
    x64 = RNG.standard_normal((3, 8)) * 300
    x64[0, 0] = 1 + 2.0 ** -4 + 2.0 ** -30  # float8 1.125 from the double, 1.0 through float32 (as ml_dtypes)
    nodes = [
        mk("QuantizeLinear", ["x", "s3", "z_i4"], ["q_i4"], axis=0),
        mk("QuantizeLinear", ["x", "s", "z_u4"], ["q_u4"]),
        mk("QuantizeLinear", ["x", "sb", "z_i2"], ["q_i2"], axis=1, block_size=3),  # blocks 3, 3, 2
        mk("QuantizeLinear", ["x", "s"], ["q_u2"], output_dtype=t(f8.uint2)),
        mk("QuantizeLinear", ["xf", "s", "z_e4"], ["q_e4"]),
        mk("QuantizeLinear", ["xf", "s"], ["q_e4_ns"], output_dtype=t(f8.float8_e4m3fn), saturate=0),
        mk("QuantizeLinear", ["xf", "s16", "z_e5"], ["q_e5_ns"], saturate=0),
        mk("QuantizeLinear", ["xf", "sbf", "z_e5uz"], ["q_e5uz"], axis=0),
        mk("QuantizeLinear", ["x16", "s"], ["q_e4uz"], output_dtype=t(f8.float8_e4m3fnuz)),
        mk("QuantizeLinear", ["xf", "s", "z_f4"], ["q_f4"]),
        mk("QuantizeLinear", ["x64", "s64", "z_i4"], ["q64_i4"], axis=0),
        mk("QuantizeLinear", ["x64", "s64"], ["q64_e4"], axis=0, output_dtype=t(f8.float8_e4m3fn)),
        mk("QuantizeLinear", ["x", "s64"], ["qp_u4"], axis=0, precision=t(np.float32), output_dtype=t(f8.uint4)),
        mk("QuantizeLinear", ["xbf", "s"], ["qbf_i8"], output_dtype=t(np.int8)),
        mk("DequantizeLinear", ["q_i4", "s3", "z_i4"], ["d_i4"], axis=0),
        mk("DequantizeLinear", ["q_e4", "s16"], ["d_e4_f16"]),
        mk("DequantizeLinear", ["q_e5uz", "sbf", "z_e5uz"], ["d_e5uz_bf16"], axis=0),
        mk("DequantizeLinear", ["q_i2", "sb", "z_i2"], ["d_i2"], axis=1, block_size=3),
        mk("DequantizeLinear", ["q_f4", "sr", "z_f4"], ["d_f4_f16"], output_dtype=t(np.float16)),  # sr rounded first
        mk("DequantizeLinear", ["q_u4", "se8"], ["d_u4_e8"], output_dtype=t(np.float32)),
        mk("DequantizeLinear", ["xi8", "s16"], ["d_i8_f16"]),
        mk("DequantizeLinear", ["q_u2", "sr"], ["d_u2_bf16"], output_dtype=t(ml_dtypes.bfloat16)),
        mk("DequantizeLinear", ["q_e5_ns", "s64"], ["d_e5_f64"], axis=0),
    ]
    feeds = {"x": x, "xf": xf, "x16": (x * 37).astype(np.float16), "xbf": (x * 41).astype(ml_dtypes.bfloat16),
             "x64": x64, "xi8": _ints(np.int8, 3, 8),
             "s": np.float32(0.5), "sr": np.float32(0.3001), "s3": np.array([1.0, 0.5, 0.25], np.float32), "sb": _scales(3, 3) * 10,
             "s16": np.float16(0.3), "sbf": np.array([0.5, 3.0, 0.1], ml_dtypes.bfloat16),
             "s64": np.array([1.0, 1.3, 2.9]), "se8": np.array(2.0 ** -3, ml_dtypes.float8_e8m0fnu),
             "z_i4": np.array([-1, 0, 3], ml_dtypes.int4), "z_u4": np.array(2, ml_dtypes.uint4),
             "z_i2": np.array([[1, -2, 0]] * 3, ml_dtypes.int2), "z_e4": np.array(1.5, ml_dtypes.float8_e4m3fn),
             "z_e5": np.array(-2.0, ml_dtypes.float8_e5m2), "z_f4": np.array(0.5, ml_dtypes.float4_e2m1fn),
             "z_e5uz": np.array([0.0, 1.0, -0.5], ml_dtypes.float8_e5m2fnuz)}
    outputs = {"q_i4": f8.int4, "q_u4": f8.uint4, "q_i2": f8.int2, "q_u2": f8.uint2, "q_e4": f8.float8_e4m3fn,
               "q_e4_ns": f8.float8_e4m3fn, "q_e5_ns": f8.float8_e5m2, "q_e5uz": f8.float8_e5m2fnuz,
               "q_e4uz": f8.float8_e4m3fnuz, "q_f4": f8.float4_e2m1fn, "q64_i4": f8.int4, "q64_e4": f8.float8_e4m3fn,
               "qp_u4": f8.uint4, "qbf_i8": np.int8, "d_i4": np.float32, "d_e4_f16": np.float16,
               "d_e5uz_bf16": f8.bfloat16, "d_i2": np.float32, "d_f4_f16": np.float16, "d_u4_e8": np.float32,
               "d_i8_f16": np.float16, "d_u2_bf16": f8.bfloat16, "d_e5_f64": np.float64}
    got, want = _run(nodes, feeds, outputs, opset=25, warnings_as_errors=True)
    _assert_same(got, want)
    q = {k: got[k].astype(np.float64) for k in got}
    assert q["q_i4"][0].tolist() == [-1, 1, 1, -1, -3, 6, -8, -1]  # ties to even, then the zero point, saturated
    assert np.isnan(q["q_e4_ns"][0, 3:6]).all() and q["q_e4"][0, 3:5].tolist() == [448.0, -448.0]
    assert q["q_e5_ns"][0, 3:5].tolist() == [np.inf, -np.inf]
    assert q["q_f4"][0, :3].tolist() == [1.0, -6.0, 6.0]  # float4 always saturates


def test_refusals_name_the_reason():
    """What the kernels do not take is refused at compile (strict), with the reason."""
    cases = [
        (mk("QuantizeLinear", ["x", "s"], ["y"], precision=10), {"x": np.ones(4, np.float32), "s": np.float32(1)},
         {"y": np.uint8}, 25, "precision float16"),
        (mk("QuantizeLinear", ["x", "s"], ["y"], axis=0, block_size=2),
         {"x": np.ones((4, 3), np.float32), "s": np.ones((3, 3), np.float32)}, {"y": np.uint8}, 21, "blocks of 2"),
        (mk("QuantizeLinear", ["x", "s"], ["y"], output_dtype=_onnx_type(ml_dtypes.float6_e2m3fn)),
         {"x": np.ones(4, np.float32), "s": np.float32(1)}, {"y": ml_dtypes.float6_e2m3fn}, 25,
         "dtype float6_e2m3fn"),
        (mk("DequantizeLinear", ["x", "s"], ["y"]), {"x": np.ones(4, np.int8), "s": np.ones(4, np.float16)},
         {"y": np.float16}, 21, r"\(4,\)"),
    ]
    for node, feeds, outputs, opset, reason in cases:
        with pytest.raises(MithrilError, match=reason):
            _run([node], feeds, outputs, opset=opset)


NODE_CASES = [
    "test_quantizelinear_axis", "test_quantizelinear_blocked_symmetric",
    "test_dequantizelinear_blocked", "test_dynamicquantizelinear_min_adjusted",
    "test_dynamicquantizelinear_expanded", "test_qlinearmatmul_3D_int8_float32", "test_matmulinteger",
    "test_convinteger_with_padding", "test_qlinearconv", "test_quantizelinear_e4m3fn", "test_quantizelinear_int4",
    "test_dequantizelinear_e4m3fn_float16", "test_dequantizelinear_uint4",
]


def test_node_suite_cases_pass_strictly():
    results = {name: conformance.run_case(name, "c") for name in NODE_CASES}
    bad = {n: (r.status, r.reason[:200]) for n, r in results.items() if r.status != "pass"}
    assert not bad

