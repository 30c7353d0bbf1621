"""The storage-only element types of the C backend (mithril/backends/c/lib/mt_convert.h): float16,
bfloat16, the float8 kinds, float8e8m0, float4e2m1 and the 4- and 2-bit integers, converted by
Cast to and from every C type. mt_cast_any is checked against the NumPy kernel (ml_dtypes
underneath) on every bit pattern of the 16- and 8-bit types and on random and edge values of the
wider ones; then Cast, CastLike and Reshape in float16/bfloat16/float8 run through CBackend with no
fallback."""

from __future__ import annotations

import ctypes
import itertools

import ml_dtypes as mld
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import mithril as ml
from mithril.backends.c import build
from mithril.backends.c.ops import STORAGE, TYPE_CODE
from mithril.backends.kernels.elementwise import _cast

pytestmark = pytest.mark.c

SOURCE = """
#include "mt_base.h"
#include "mt_convert.h"
void cast_any(const void *x, int xc, void *y, int yc, mt_i n, int saturate, int round_mode) {
    mt_cast_any(x, xc, y, yc, n, saturate, round_mode);
}
"""

TYPES = list(TYPE_CODE)
SUB_BYTE = {np.dtype(mld.int4): 16, np.dtype(mld.uint4): 16, np.dtype(mld.int2): 4, np.dtype(mld.uint2): 4,
            np.dtype(mld.float4_e2m1fn): 16}


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("MITHRIL_CACHE_DIR", str(tmp_path_factory.mktemp("c_cache")))
    path = build.build_library(SOURCE, (*build.FLAGS, "-Werror"), blas=False)
    yield build.load_library(path)
    mp.undo()


def c_cast(lib, x, dst, saturate=1, round_mode=0):
    x = np.ascontiguousarray(x)
    y = np.zeros(x.shape, dst)
    lib.cast_any(ctypes.c_void_p(x.ctypes.data), TYPE_CODE[x.dtype], ctypes.c_void_p(y.ctypes.data),
                 TYPE_CODE[np.dtype(dst)], ctypes.c_long(x.size), saturate, round_mode)
    return y


def samples(t: np.dtype, rng) -> np.ndarray:
    """Every bit pattern of a type of 16 bits or fewer; random values and edges of the wider ones."""
    if t in SUB_BYTE:
        return np.arange(SUB_BYTE[t], dtype=np.uint8).view(t)
    if t.itemsize <= 2 and t.kind != "b":
        return np.arange(2 ** (8 * t.itemsize), dtype=np.uint8 if t.itemsize == 1 else np.uint16).view(t)
    if t.kind == "b":
        return np.array([True, False])
    if t.kind == "f":
        edges = [0, -0.0, np.inf, -np.inf, np.nan, 448, 464, 465, 57344, 61440, 65504, 65520, 65519.99, 2**-24,
                 2**-25, 2**-25 * 1.0001, 3e38, 6, 7, -7, 0.25, 0.75, 5.0, 2**-133, 2**-134 * 1.5,
                 1 + 2**-4 + 2**-30, 1 + 2**-8 + 2**-30, 1 + 2**-11 + 2**-40]  # float64: rounded twice by ml_dtypes
        return np.concatenate([rng.standard_normal(3000) * 10.0 ** rng.integers(-12, 12, 3000), edges]).astype(t)
    info = np.iinfo(t)
    return np.concatenate([rng.integers(info.min, info.max, 2000, dtype=t, endpoint=True),
                           np.array([info.min, info.max, 0, 1], t)])


def _pairs():
    return [(a, b) for a, b in itertools.product(TYPES, TYPES) if a != b and (a in STORAGE or b in STORAGE)]


@pytest.mark.parametrize("saturate", [1, 0])
def test_cast_any_equals_numpy_for_every_pair_with_a_storage_type(lib, saturate):
    rng = np.random.default_rng(0)
    wrong = []
    for a, b in _pairs():
        x = samples(a, rng)
        with np.errstate(all="ignore"):
            want = _cast(x, b, saturate=saturate, round_mode="up", xp=np)
            got = c_cast(lib, x, b, saturate)
            w, g = (want, got) if b.kind == "b" else (want.astype(np.float64), got.astype(np.float64))
            same = (w == g) | (np.isnan(w) & np.isnan(g))
            # A float out of an integer's range, or NaN, is undefined in NumPy; C saturates (NaN -> 0).
            if b.kind in "iu" or (b in SUB_BYTE and b != np.dtype(mld.float4_e2m1fn)):
                if x.dtype.kind == "f" or _is_float_storage(x.dtype):
                    xf = x.astype(np.float64)
                    lim = np.iinfo(np.int64 if b in SUB_BYTE else b)
                    same |= ~np.isfinite(xf) | (xf <= lim.min) | (xf >= lim.max)
        if not same.all():
            i = np.flatnonzero(~same)[:3]
            wrong.append(f"{a} -> {b}: {(~same).sum()} of {x.size} differ, x={x[i]} numpy={want[i]} c={got[i]}")
    assert not wrong, "\n".join(wrong)


def _is_float_storage(t: np.dtype) -> bool:
    return t in STORAGE and t not in (np.dtype(mld.int4), np.dtype(mld.uint4), np.dtype(mld.int2), np.dtype(mld.uint2))


@pytest.mark.parametrize("mode", ["up", "down", "nearest"])
def test_float8e8m0_rounding_modes(lib, mode):
    x = np.concatenate([2.0 ** np.arange(-130, 128, 0.25), -(2.0 ** np.arange(-3, 3, 0.25)), [0, np.inf, np.nan]])
    x = x.astype(np.float32)
    code = {"up": 0, "down": 1, "nearest": 2}[mode]
    for saturate in (1, 0):
        with np.errstate(all="ignore"):
            want = _cast(x, np.dtype(mld.float8_e8m0fnu), saturate=saturate, round_mode=mode, xp=np)
        got = c_cast(lib, x, mld.float8_e8m0fnu, saturate, code)
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def _cast_model(src: int, dst: int, shape, like: bool = False) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", src, shape)
    y = helper.make_tensor_value_info("y", dst, [shape[1], shape[0]])
    nodes = [helper.make_node("Reshape", ["x", "s"], ["r"]),
             helper.make_node("CastLike", ["r", "t"], ["y"]) if like else helper.make_node("Cast", ["r"], ["y"], to=dst)]
    inits = [helper.make_tensor("s", TensorProto.INT64, [2], [shape[1], shape[0]])]
    if like:
        inits.append(helper.make_tensor("t", dst, [1], [0]))
    return helper.make_model(helper.make_graph(nodes, "cast", [x], [y], initializer=inits),
                             opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize("src,dst,like", [
    (TensorProto.FLOAT, TensorProto.FLOAT16, False),
    (TensorProto.FLOAT16, TensorProto.FLOAT, True),
    (TensorProto.BFLOAT16, TensorProto.FLOAT8E4M3FN, False),
    (TensorProto.FLOAT8E5M2, TensorProto.DOUBLE, True),
    (TensorProto.INT4, TensorProto.FLOAT16, False),
])
def test_cast_runs_natively_through_the_backend(src, dst, like):
    src_np = helper.tensor_dtype_to_np_dtype(src)
    dst_np = helper.tensor_dtype_to_np_dtype(dst)
    x = (np.arange(12) - 6).astype(np.float32).reshape(3, 4) * (0.3 if np.dtype(src_np).kind != "V" else 1)
    x = x.astype(src_np)
    pm = ml.compile(ml.load_onnx(_cast_model(src, dst, [3, 4], like)), ml.CBackend(fallback=None), shapes={"x": [3, 4]},
                    inference=True)
    got = np.asarray(pm.evaluate(None, {"x": x})["y"])
    want = _cast(x.reshape(4, 3), np.dtype(dst_np), saturate=1, round_mode="up", xp=np)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def test_a_computing_kernel_refuses_a_storage_type_naming_it():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT8E4M3FN, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT8E4M3FN, [4])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 22)])
    with pytest.raises(ml.errors.KernelMissingError, match="float8_e4m3fn.*C stores it but computes in"):
        ml.compile(ml.load_onnx(model), ml.CBackend(fallback=None))


@pytest.mark.parametrize("half", [np.float16, mld.bfloat16])
def test_half_float_nodes_compute_in_float32_between_casts(half):
    """Relu, Add of a constant, MatMul of a weight and Softmax in float16 / bfloat16 run on
    CBackend(fallback=None): each in float32, its half inputs widened and its outputs rounded once,
    as NumPy's float16 kernels round each op's result."""
    rng = np.random.default_rng(1)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(half))
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "c"], ["a"]),
             helper.make_node("MatMul", ["a", "w"], ["m"]), helper.make_node("Softmax", ["m"], ["y"], axis=-1)]
    inits = [onnx.numpy_helper.from_array(rng.standard_normal(4).astype(half), "c"),
             onnx.numpy_helper.from_array(rng.standard_normal((4, 5)).astype(half), "w")]
    graph = helper.make_graph(nodes, "half", [helper.make_tensor_value_info("x", elem, [3, 4])],
                              [helper.make_tensor_value_info("a", elem, [3, 4]), helper.make_tensor_value_info("y", elem, [3, 5])],
                              initializer=inits)
    model = ml.load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    x = rng.standard_normal((3, 4)).astype(half)
    got = ml.compile(model, ml.CBackend(fallback=None), inference=True).evaluate(None, {"x": x})
    want = ml.compile(model, ml.NumpyBackend(), inference=True).evaluate(None, {"x": x})
    assert got["a"].dtype == got["y"].dtype == np.dtype(half)
    np.testing.assert_array_equal(got["a"].astype(np.float32), want["a"].astype(np.float32))  # one rounding each
    tol = 1e-2 if half is mld.bfloat16 else 2e-3
    np.testing.assert_allclose(got["y"].astype(np.float32), want["y"].astype(np.float32), rtol=tol, atol=tol)
