"""The C backend's elementwise family (issue 18): unary math and activations, broadcasting binary
ops for every C element type, logic, Where, Clip, Cast, Reduce*, ArgMax/ArgMin and CumSum, each
compiled strictly (CBackend(fallback=None)) and compared with the NumPy backend; edge values
(NaN, inf, -0.0, integer overflow), the integer-division NodeError, saturating casts, and a fixed
list of ONNX node-suite cases that must pass strictly."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import mithril as ml
from mithril.backends.c import build
from mithril.errors import NodeError

from tests.conftest import make_model

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no C compiler (cc or gcc) on PATH")

ELEM = {np.dtype(k): v for k, v in {
    np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE, np.int8: TensorProto.INT8,
    np.int16: TensorProto.INT16, np.int32: TensorProto.INT32, np.int64: TensorProto.INT64,
    np.uint8: TensorProto.UINT8, np.uint16: TensorProto.UINT16, np.uint32: TensorProto.UINT32,
    np.uint64: TensorProto.UINT64, np.bool_: TensorProto.BOOL}.items()}



def _model(nodes, feeds: dict, outputs: dict, opset=18, initializers=()):
    """outputs: name -> (dtype, shape)."""
    ins = [(k, ELEM[v.dtype], list(v.shape)) for k, v in feeds.items()]
    outs = [(k, ELEM[np.dtype(dt)], list(s)) for k, (dt, s) in outputs.items()]
    return make_model(nodes, ins, outs, initializers, opset=opset)


def _run(model, feeds, backend):
    pm = ml.compile(ml.load_onnx(model), backend, inference=True)
    return pm, {k: np.asarray(v) for k, v in pm.evaluate(None, feeds).items()}


def _c_equals_numpy(model, feeds, rtol=1e-6, atol=0.0):
    """Compiles strictly in C, runs, and compares every output with NumPy's (dtype, shape, values)."""
    _, got = _run(model, feeds, ml.CBackend(fallback=None))
    with np.errstate(all="ignore"):
        _, ref = _run(model, feeds, ml.NumpyBackend())
    for k in ref:
        assert got[k].dtype == ref[k].dtype, k
        assert got[k].shape == ref[k].shape, k
        if ref[k].dtype.kind == "f":
            np.testing.assert_allclose(got[k], ref[k], rtol=rtol, atol=atol, equal_nan=True, err_msg=k)
        else:
            np.testing.assert_array_equal(got[k], ref[k], err_msg=k)
    return got


EDGE = np.array([0.0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 3.7, -3.7, 0.999, -0.999, 20.0, -20.0, 1e-6,
                 np.inf, -np.inf, np.nan])

UNARY = ["Abs", "Neg", "Relu", "Sign", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Erf", "Sin", "Cos", "Tan", "Asin",
         "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Ceil", "Floor", "Round", "Reciprocal",
         "Softplus", "Softsign", "Mish", "HardSwish"]


def test_unary_math_on_edge_values_equals_numpy():
    feeds = {"x32": EDGE.astype(np.float32), "x64": EDGE}
    nodes, outs = [], {}
    for x in feeds:
        dt = feeds[x].dtype
        nodes += [helper.make_node(op, [x], [f"{op}{x}"]) for op in UNARY]
        nodes += [helper.make_node("IsNaN", [x], [f"isnan{x}"]), helper.make_node("IsInf", [x], [f"isinf{x}"]),
                  helper.make_node("IsInf", [x], [f"isposinf{x}"], detect_negative=0)]
        outs |= {f"{op}{x}": (dt, EDGE.shape) for op in UNARY}
        outs |= {f"{k}{x}": (np.bool_, EDGE.shape) for k in ("isnan", "isinf", "isposinf")}
    got = _c_equals_numpy(_model(nodes, feeds, outs), feeds, rtol=1e-6)
    for x in feeds:
        assert got[f"Round{x}"][:8].tolist() == [0.0, -0.0, 0.0, -0.0, 2.0, 2.0, -2.0, 4.0]  # half to even
        assert np.signbit(got[f"Neg{x}"][0]) and not np.signbit(got[f"Neg{x}"][1])  # 0.0 -> -0.0 -> 0.0
        assert got[f"isposinf{x}"].tolist() == [False] * 14 + [True, False, False]


def test_activations_with_attributes_equal_numpy():
    x = EDGE.astype(np.float32)
    spec = [("LeakyRelu", {"alpha": 0.2}), ("Elu", {"alpha": 0.7}), ("Selu", {"alpha": 1.5, "gamma": 1.1}),
            ("Celu", {"alpha": 2.0}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}), ("ThresholdedRelu", {"alpha": 0.6}),
            ("Shrink", {"bias": 0.5, "lambd": 1.0}), ("Gelu", {}), ("Gelu", {"approximate": "tanh"}),
            ("Swish", {"alpha": 1.5})]
    nodes = [helper.make_node(op, ["x"], [f"y{i}"], **kw) for i, (op, kw) in enumerate(spec)]
    nodes.append(helper.make_node("PRelu", ["m", "slope"], ["prelu"]))
    m = np.linspace(-3, 3, 24, dtype=np.float32).reshape(2, 3, 4)
    slope = np.array([[0.1], [0.2], [0.3]], np.float32)
    outs = {f"y{i}": (np.float32, x.shape) for i in range(len(spec))} | {"prelu": (np.float32, m.shape)}
    _c_equals_numpy(_model(nodes, {"x": x, "m": m, "slope": slope}, outs, opset=24),
                    {"x": x, "m": m, "slope": slope}, rtol=2e-6, atol=1e-7)


INT_TYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


ALL_OPS = ["Add", "Sub", "Mul", "Div", "Max", "Min", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"]


def test_binary_ops_broadcast_for_every_numeric_type():
    rng = np.random.default_rng(0)
    out = (3, 2, 4)
    nodes, outs, feeds, wrapped = [], {}, {"c": np.array([True, False, True, False])}, {}
    for dtype in INT_TYPES + [np.float64]:
        t = np.dtype(dtype).name
        # every op on int8, uint32 and float64; the rest of the types the arithmetic that wraps
        ops = ALL_OPS if dtype in (np.int8, np.uint32, np.float64) else ["Add", "Mul", "Div", "Less"]
        info = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else None
        lo, hi = (info.min, info.max) if info else (-100, 100)
        a = rng.integers(max(lo, -1000), min(hi, 1000), (3, 1, 4), endpoint=True).astype(dtype)
        b = rng.integers(max(lo, -1000), min(hi, 1000), (2, 1), endpoint=True).astype(dtype)
        a.flat[0], b.flat[0] = hi, hi  # hi + hi, hi * hi wrap in integers
        b[b == 0] = 1
        feeds |= {f"a{t}": a, f"b{t}": b}
        nodes += [helper.make_node(op, [f"a{t}", f"b{t}"], [f"{op}{t}"]) for op in ops]
        outs |= {f"{op}{t}": (np.bool_ if op in ALL_OPS[6:] else dtype, out) for op in ops}
        if len(ops) > 4:
            nodes += [helper.make_node("Mod", [f"a{t}", f"b{t}"], [f"mod{t}"], fmod=int(info is None)),
                      helper.make_node("Max", [f"a{t}", f"b{t}", f"a{t}"], [f"max3{t}"]),
                      helper.make_node("Where", ["c", f"a{t}", f"b{t}"], [f"where{t}"])]
            outs |= {f"{k}{t}": (dtype, out) for k in ("mod", "max3", "where")}
        if info is not None and len(ops) > 4:
            nodes += [helper.make_node(op, [f"a{t}", f"b{t}"], [f"{op}{t}"])
                      for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor")]
            nodes += [helper.make_node("BitwiseNot", [f"a{t}"], [f"bnot{t}"]),
                      helper.make_node("Abs", [f"a{t}"], [f"abs{t}"])]
            outs |= {f"{op}{t}": (dtype, out) for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor")}
            outs |= {f"bnot{t}": (dtype, a.shape), f"abs{t}": (dtype, a.shape)}
        if info is not None:
            wrapped[t] = np.array(hi, dtype) + np.array(hi, dtype)
    got = _c_equals_numpy(_model(nodes, feeds, outs), feeds)
    for t, w in wrapped.items():
        assert got[f"Add{t}"][0, 0, 0] == w  # wraps like NumPy


def test_integer_div_and_mod_follow_c_and_python_signs():
    a = np.array([7, -7, 7, -7, 0, -128], np.int8)
    b = np.array([2, 2, -2, -2, 3, 3], np.int8)
    nodes = [helper.make_node("Div", ["a", "b"], ["div"]), helper.make_node("Mod", ["a", "b"], ["mod"]),
             helper.make_node("Mod", ["a", "b"], ["fmod"], fmod=1)]
    outs = {k: (np.int8, a.shape) for k in ("div", "mod", "fmod")}
    got = _c_equals_numpy(_model(nodes, {"a": a, "b": b}, outs), {"a": a, "b": b})
    assert got["div"].tolist() == [3, -3, -3, 3, 0, -42]  # toward zero
    assert got["mod"].tolist() == [1, 1, -1, -1, 0, 1]  # the divisor's sign
    assert got["fmod"].tolist() == [1, -1, 1, -1, 0, -2]  # the dividend's sign


def test_integer_division_by_zero_is_a_node_error_not_a_crash():
    a = np.array([4, np.iinfo(np.int32).min], np.int32)
    model = _model([helper.make_node("Div", ["a", "b"], ["q"], name="divide"),
                    helper.make_node("Mod", ["a", "m"], ["r"], name="modulo")],
                   {"a": a, "b": a, "m": a}, {"q": (np.int32, a.shape), "r": (np.int32, a.shape)})
    pm = ml.compile(ml.load_onnx(model), ml.CBackend(fallback=None), inference=True)
    ones = np.ones(2, np.int32)
    for b, m, node in (([1, 0], ones, "divide"), ([1, -1], ones, "divide"), (ones, [0, 1], "modulo")):
        feeds = {"a": a, "b": np.array(b, np.int32), "m": np.array(m, np.int32)}
        with pytest.raises(NodeError, match=rf"node '{node}', op (Div|Mod).*integer division by zero"):
            pm.evaluate(None, feeds)
    out = pm.evaluate(None, {"a": a, "b": np.array([-3, 2], np.int32), "m": np.array([-3, 3], np.int32)})
    assert out["q"].tolist() == [-1, np.iinfo(np.int32).min // 2] and out["r"].tolist() == [-2, 1]


def test_float_mod_pow_and_mixed_type_pow():
    a = np.array([5.5, -5.5, 5.5, -5.5, 0.0, 3.0], np.float32)
    b = np.array([2.0, 2.0, -2.0, -2.0, -1.0, 0.0], np.float32)
    i = np.array([2, 3, -1, 4, 5, 1], np.int64)
    e = np.array([3, 2, -2, 0, 1, 62], np.int64)
    nodes = [helper.make_node("Mod", ["a", "b"], ["mod"]), helper.make_node("Mod", ["a", "b"], ["fmod"], fmod=1),
             helper.make_node("Pow", ["a", "b"], ["pow"]), helper.make_node("Pow", ["a", "e"], ["pow_fi"]),
             helper.make_node("Pow", ["i", "e"], ["pow_ii"]), helper.make_node("Pow", ["i", "b"], ["pow_if"])]
    outs = {"mod": (np.float32, a.shape), "fmod": (np.float32, a.shape), "pow": (np.float32, a.shape),
            "pow_fi": (np.float32, a.shape), "pow_ii": (np.int64, a.shape), "pow_if": (np.int64, a.shape)}
    feeds = {"a": a, "b": b, "i": i, "e": e}
    got = _c_equals_numpy(_model(nodes, feeds, outs, opset=15), feeds)
    assert got["pow_ii"].tolist() == [8, 9, 1, 1, 5, 1]  # (-1) ** -2 = 1


def test_square_and_cube_are_products_as_in_onnxruntime():
    """Pow(x, 2) and Pow(x, 3) run as x * x and x * x * x, bit for bit as onnxruntime computes them,
    whether the exponent is a constant or a parameter (mt_pow checks each row's exponent); another
    exponent, and one that varies along a row, stay pow()."""
    ort = pytest.importorskip("onnxruntime")
    x = np.concatenate([np.random.default_rng(4).standard_normal(1000).astype(np.float32) * 30, EDGE.astype(np.float32)])
    consts = {"two": np.float32(2), "three": np.float32(3), "half": np.float32(0.5),
              "threes": np.full((2, 1), 3, np.float32)}
    nodes = [helper.make_node("Constant", [], [k], value=numpy_helper.from_array(np.asarray(v), k))
             for k, v in consts.items()]
    nodes += [helper.make_node("Pow", ["x", k], [f"pow_{k}"]) for k in [*consts, "param_three", "mixed"]]
    params = {"param_three": np.float32(3).reshape(()), "mixed": np.tile(np.float32([3, 2.5]), x.size // 2 + 1)[:x.size]}
    outs = {f"pow_{k}": (np.float32, np.broadcast_shapes(x.shape, np.shape(v))) for k, v in consts.items()}
    outs |= {"pow_param_three": (np.float32, x.shape), "pow_mixed": (np.float32, x.shape)}
    model = _model(nodes, {"x": x}, outs, initializers=params)
    pm, got = _run(model, {"x": x}, ml.CBackend(fallback=None))
    assert "param_three" in pm.parameter_keys  # read at run time, not compiled in
    mixed = params["mixed"]
    with np.errstate(all="ignore"):
        for name in ("pow_three", "pow_param_three"):
            np.testing.assert_array_equal(got[name], x * x * x, err_msg=name)
        np.testing.assert_array_equal(got["pow_two"], x * x)
        np.testing.assert_allclose(got["pow_half"], np.sqrt(x), rtol=1e-6)
        np.testing.assert_allclose(got["pow_threes"], np.broadcast_to(x ** 3, (2, x.size)), rtol=1e-6)
        np.testing.assert_allclose(got["pow_mixed"], (x.astype(np.float64) ** mixed).astype(np.float32), rtol=1e-6)
    names = ["pow_two", "pow_three", "pow_param_three"]
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(names, {"x": x})
    for name, want in zip(names, ref):
        np.testing.assert_array_equal(got[name], want, err_msg=name)


def test_logic_bitshift_and_where_broadcast_three_ways():
    p = np.array([[True], [False]])
    q = np.array([True, False, True])
    x = np.arange(6, dtype=np.uint8).reshape(2, 3) * 40
    s = np.array([1, 7, 9], np.uint8)
    nodes = [helper.make_node(op, ["p", "q"], [op]) for op in ("And", "Or", "Xor")]
    nodes += [helper.make_node("Not", ["q"], ["not"]),
              helper.make_node("BitShift", ["x", "s"], ["left"], direction="LEFT"),
              helper.make_node("BitShift", ["x", "s"], ["right"], direction="RIGHT"),
              helper.make_node("Where", ["p", "x", "s"], ["where"])]
    outs = {op: (np.bool_, (2, 3)) for op in ("And", "Or", "Xor")} | {"not": (np.bool_, (3,))}
    outs |= {"left": (np.uint8, (2, 3)), "right": (np.uint8, (2, 3)), "where": (np.uint8, (2, 3))}
    feeds = {"p": p, "q": q, "x": x, "s": s}
    got = _c_equals_numpy(_model(nodes, feeds, outs), feeds)
    assert got["left"][:, 2].tolist() == [0, 0]  # a shift by >= the width leaves 0


def test_sum_mean_max_min_are_variadic_and_broadcast():
    a = np.array([1.0, np.nan, -2.0], np.float32)
    b = np.array([[3.0], [-1.0]], np.float32)
    c = np.float32(0.5).reshape(())
    nodes = [helper.make_node(op, ["a", "b", "c"], [op]) for op in ("Sum", "Mean", "Max", "Min")]
    nodes.append(helper.make_node("Sum", ["a"], ["one"]))
    # rows longer than one thread's piece, broadcast and flat
    big = np.random.default_rng(1).standard_normal((3, 40000)).astype(np.float32)
    row = big[0] * 2
    nodes += [helper.make_node("Add", ["big", "row"], ["big_row"]), helper.make_node("Mul", ["big", "big"], ["big_sq"])]
    outs = {op: (np.float32, (2, 3)) for op in ("Sum", "Mean", "Max", "Min")} | {"one": (np.float32, (3,))}
    outs |= {"big_row": (np.float32, big.shape), "big_sq": (np.float32, big.shape)}
    feeds = {"a": a, "b": b, "c": c, "big": big, "row": row}
    got = _c_equals_numpy(_model(nodes, feeds, outs), feeds)
    assert np.isnan(got["Max"][:, 1]).all()  # NaN propagates


def test_clip_bounds_as_inputs_attributes_and_for_ints():
    x = np.array([-3.0, -1.0, 0.0, 2.0, 9.0, np.nan], np.float32)
    lo, hi = np.array(-1.5, np.float32), np.array(4.0, np.float32)
    n = np.array([-100, 0, 100], np.int8)
    nodes = [helper.make_node("Clip", ["x", "lo", "hi"], ["both"]),
             helper.make_node("Clip", ["x", "", "hi"], ["hi_only"]),
             helper.make_node("Clip", ["x", "hi", "lo"], ["crossed"]),
             helper.make_node("Clip", ["n", "k"], ["ints"]), helper.make_node("Clip", ["w", "", "k64"], ["int64s"])]
    w = np.array([np.iinfo(np.int64).min, 0, np.iinfo(np.int64).max], np.int64)
    outs = {k: (np.float32, x.shape) for k in ("both", "hi_only", "crossed")} | {"ints": (np.int8, n.shape)}
    outs["int64s"] = (np.int64, w.shape)
    feeds = {"x": x, "lo": lo, "hi": hi, "n": n, "w": w}
    model = _model(nodes, feeds, outs, initializers={"k": np.array(-7, np.int8), "k64": np.array(5, np.int64)})
    got = _c_equals_numpy(model, feeds)
    assert got["crossed"][:5].tolist() == [-1.5] * 5  # min > max gives max
    assert got["ints"].tolist() == [-7, 0, 100]
    assert got["int64s"].tolist() == [np.iinfo(np.int64).min, 0, 5]
    legacy = _model([helper.make_node("Clip", ["x"], ["y"], min=-1.0, max=1.0)], {"x": x},
                    {"y": (np.float32, x.shape)}, opset=6)
    assert _c_equals_numpy(legacy, {"x": x})["y"][:5].tolist() == [-1, -1, 0, 1, 1]


def test_cast_between_every_c_type_and_float_to_int_saturates():
    types = list(ELEM)
    src = np.array([0, 1, 2, 100, 127], np.int64)
    nodes, outs, feeds = [], {}, {}
    hubs = {np.dtype(t) for t in (np.float32, np.float64, np.int8, np.int64, np.uint8, np.bool_)}
    for s in types:
        feeds[f"x_{s}"] = src.astype(s)
        for d in (types if s in hubs else hubs):  # every type to and from the hubs
            nodes.append(helper.make_node("Cast", [f"x_{s}"], [f"{s}_{d}"], to=ELEM[d]))
            outs[f"{s}_{d}"] = (d, src.shape)
    _c_equals_numpy(_model(nodes, feeds, outs), feeds)

    f = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, 300.7, -300.7, -0.9, 2.9], np.float32)
    to = [np.int8, np.uint8, np.int32, np.int64, np.uint64, np.bool_]
    nodes = [helper.make_node("Cast", ["f"], [f"to_{np.dtype(d)}"], to=ELEM[np.dtype(d)]) for d in to]
    nodes.append(helper.make_node("CastLike", ["f", "like"], ["like_out"]))
    outs = {f"to_{np.dtype(d)}": (d, f.shape) for d in to} | {"like_out": (np.int16, f.shape)}
    model = _model(nodes, {"f": f, "like": np.zeros(1, np.int16)}, outs)
    _, got = _run(model, {"f": f, "like": np.zeros(1, np.int16)}, ml.CBackend(fallback=None))
    assert got["to_int8"].tolist() == [0, 127, -128, 127, -128, 127, -128, 0, 2]
    assert got["to_uint8"].tolist() == [0, 255, 0, 255, 0, 255, 0, 0, 2]
    assert got["to_int64"].tolist() == [0, 2**63 - 1, -2**63, 2**63 - 1, -2**63, 300, -300, 0, 2]
    assert got["to_uint64"].tolist() == [0, 2**64 - 1, 0, 2**64 - 1, 0, 300, 0, 0, 2]
    assert got["to_bool"].tolist() == [True, True, True, True, True, True, True, True, True]
    assert got["like_out"].dtype == np.int16 and got["like_out"][5] == 300


REDUCE = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
          "ReduceLogSumExp", "ReduceSumSquare"]


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_reductions_over_constant_and_attribute_axes(dtype):
    x = (np.arange(1, 25).reshape(2, 3, 4) % 5 + 1).astype(dtype)
    ops = REDUCE if dtype == np.float32 else ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
                                              "ReduceL1", "ReduceSumSquare"]
    axes_sets = {"mid": [1], "outer_inner": [0, -1], "all": None}
    nodes, outs, inits = [], {}, {}
    for op in ops:
        for key, axes in axes_sets.items():
            for keep in (0, 1):
                name = f"{op}_{key}_{keep}"
                ins = ["x"] if axes is None else ["x", f"axes_{key}"]
                nodes.append(helper.make_node(op, ins, [name], keepdims=keep))
                shape = [1 if (axes is None or i in [a % 3 for a in axes]) else d for i, d in enumerate(x.shape)]
                if not keep:
                    shape = [d for i, d in enumerate(x.shape) if axes is not None and i not in [a % 3 for a in axes]]
                outs[name] = (dtype, shape)
        nodes.append(helper.make_node(op, ["x", "empty"], [f"{op}_noop"], noop_with_empty_axes=1))
        outs[f"{op}_noop"] = (dtype, x.shape)
    inits = {f"axes_{k}": np.array(v, np.int64) for k, v in axes_sets.items() if v is not None}
    inits["empty"] = np.zeros(0, np.int64)
    _c_equals_numpy(_model(nodes, {"x": x}, outs, initializers=inits), {"x": x}, rtol=2e-6)

    legacy = _model([helper.make_node("ReduceMax", ["x"], ["y"], axes=[2], keepdims=0)], {"x": x},
                    {"y": (dtype, (2, 3))}, opset=13)
    _c_equals_numpy(legacy, {"x": x})


def test_reductions_with_axes_given_at_run_time_are_checked():
    x = np.arange(24, dtype=np.float64).reshape(2, 3, 4)
    model = _model([helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0, name="rsum")],
                   {"x": x, "axes": np.array([1], np.int64)}, {"y": (np.float64, (2, 4))})
    pm = ml.compile(ml.load_onnx(model), ml.CBackend(fallback=None), inference=True)
    np.testing.assert_array_equal(pm.evaluate(None, {"x": x, "axes": np.array([-2])})["y"], x.sum(1))
    with pytest.raises(NodeError, match="node 'rsum'.*the axes are out of range or reduce to another shape"):
        pm.evaluate(None, {"x": x, "axes": np.array([2])})


def test_argmax_argmin_and_cumsum():
    x = np.array([[1.0, 3.0, 3.0, -1.0], [np.nan, 2.0, 5.0, 5.0], [2.0, np.nan, 0.0, 0.0]], np.float32)
    nodes = [helper.make_node("ArgMax", ["x"], ["amax"], axis=1), helper.make_node("ArgMin", ["x"], ["amin"], axis=1),
             helper.make_node("ArgMax", ["x"], ["amax_last"], axis=1, select_last_index=1, keepdims=0),
             helper.make_node("ArgMin", ["x"], ["amin0"], axis=0),
             helper.make_node("CumSum", ["n", "ax"], ["cum"]),
             helper.make_node("CumSum", ["n", "ax"], ["cum_er"], exclusive=1, reverse=1),
             helper.make_node("ReduceMax", ["flags", "ax1"], ["any_mid"], keepdims=0),
             helper.make_node("ReduceMin", ["flags", "ax2"], ["all_last"], keepdims=0)]
    n = np.arange(12, dtype=np.int32).reshape(3, 4) - 5
    flags = np.random.default_rng(2).random((2, 3, 4)) > 0.6
    outs = {"amax": (np.int64, (3, 1)), "amin": (np.int64, (3, 1)), "amax_last": (np.int64, (3,)),
            "amin0": (np.int64, (1, 4)), "cum": (np.int32, (3, 4)), "cum_er": (np.int32, (3, 4)),
            "any_mid": (np.bool_, (2, 4)), "all_last": (np.bool_, (2, 3))}
    feeds = {"x": x, "n": n, "ax": np.array(-1, np.int32), "flags": flags}
    inits = {"ax1": np.array([1], np.int64), "ax2": np.array([-1], np.int64)}
    got = _c_equals_numpy(_model(nodes, feeds, outs, initializers=inits), feeds)
    assert got["amax"].ravel().tolist() == [1, 0, 0]  # a NaN wins only as the first element
    assert got["amax_last"].tolist() == [2, 0, 0]
    assert got["cum_er"][0].tolist() == [-9, -5, -2, 0]


def test_fused_sequence_compiles_warning_free_and_clean_under_ubsan(tmp_path, capfd):
    """Integer arithmetic wraps in unsigned, casts saturate, shifts are range-checked: nothing is C UB."""
    cc = shutil.which("cc") or shutil.which("gcc")
    a = np.array([127, -128, 100, -100], np.int8)
    b = np.array([127, 2, 9, 3], np.int8)
    f = np.array([np.nan, 1e20, -1e20, 2.5], np.float32)
    big = np.array([np.iinfo(np.int64).max, np.iinfo(np.int64).min, 3, -3], np.int64)
    nodes = [helper.make_node("Mul", ["a", "b"], ["mul"]), helper.make_node("Add", ["a", "b"], ["add"]),
             helper.make_node("Neg", ["big"], ["neg"]), helper.make_node("Abs", ["big"], ["abs"]),
             helper.make_node("Mul", ["big", "big"], ["sq"]),
             helper.make_node("Cast", ["f"], ["cast"], to=TensorProto.INT32),
             helper.make_node("BitShift", ["u", "v"], ["shl"], direction="LEFT"),
             helper.make_node("ReduceSum", ["big"], ["rsum"], keepdims=0), helper.make_node("Div", ["a", "b"], ["div"])]
    u = np.array([1, 2, 3, 4], np.uint32)
    v = np.array([31, 32, 0, 40], np.uint32)
    feeds = {"a": a, "b": b, "f": f, "big": big, "u": u, "v": v}
    outs = {"mul": (np.int8, (4,)), "add": (np.int8, (4,)), "neg": (np.int64, (4,)), "abs": (np.int64, (4,)),
            "sq": (np.int64, (4,)), "cast": (np.int32, (4,)), "shl": (np.uint32, (4,)), "rsum": (np.int64, ()),
            "div": (np.int8, (4,))}
    model = _model(nodes, feeds, outs)
    pm = ml.compile(ml.load_onnx(model), ml.CBackend(fallback=None), inference=True)
    src = tmp_path / "m.c"
    src.write_text(pm.program.source)
    done = subprocess.run([cc, "-fsyntax-only", "-fopenmp", "-Wall", "-Wextra", "-Werror", f"-I{build.LIB_DIR}",
                           str(src)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lib = build.build_library(pm.program.source, flags=tuple(build.FLAGS) + ("-fsanitize=undefined", "-g"))
    try:
        program = type(pm.program)(pm.program.source, "m.c", pm.program.steps, pm.program.arena_bytes,
                                   pm.program.naive_bytes, pm.program.fallback, build.load_library(lib), None,
                                   pm.program.plan, pm.program.failures)
    except OSError as exc:  # the sanitizer runtime cannot be loaded into this interpreter
        pytest.skip(f"libubsan cannot be loaded with ctypes here: {exc}")
    out = program.run({}, feeds)
    assert "runtime error" not in capfd.readouterr().err
    assert out["cast"].tolist() == [0, np.iinfo(np.int32).max, np.iinfo(np.int32).min, 2]
    assert out["shl"].tolist() == [2**31, 0, 3, 0]
    assert out["div"].tolist() == [1, -64, 11, -33]
    assert out["mul"].tolist() == [1, 0, -124, -44]  # wrapped like NumPy's int8


# Node-suite cases the elementwise family must pass strictly (a sample across every op it covers).
NODE_CASES = [
    "test_acosh", "test_and_bcast4v4d", "test_argmax_negative_axis_keepdims_random_select_last_index",
    "test_bitshift_right_uint64", "test_celu", "test_clip_splitbounds", "test_cumsum_1d_reverse_exclusive",
    "test_div_uint8", "test_gelu_tanh_2", "test_isinf_negative", "test_max_int8", "test_mean_example",
    "test_mod_mixed_sign_int32", "test_pow_types_int32_float32", "test_prelu_broadcast",
    "test_reduce_log_sum_exp_negative_axes_keepdims_random", "test_reduce_max_bool_inputs",
    "test_reduce_mean_do_not_keepdims_random", "test_where_long_example",
]


@pytest.mark.slow  # one C build per case
def test_node_suite_sample_passes_strictly():
    from mithril import conformance

    known = conformance.node_cases()
    missing = [n for n in NODE_CASES if n not in known]
    assert not missing, missing
    bad = [(r.name, r.status, r.reason) for r in map(lambda n: conformance.run_case(n, "c"), NODE_CASES)
           if r.status != "pass"]
    assert not bad, bad
