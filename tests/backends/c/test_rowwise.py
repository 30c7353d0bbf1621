"""The C backend's row-wise kernels (lib/mt_rowwise.h): RMSNormalization, LpNormalization, CumProd
and TopK on CBackend(fallback=None) equal NumPy, in float32 and float64 (and the integer types for
CumProd and TopK), and a fixed list of ONNX node-suite cases passes strictly (no NumPy fallback)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from onnx import TensorProto, helper

import mithril as ml
from mithril import conformance
from mithril.backends.c.program import CKernelMissingError
from mithril.errors import NodeError
from tests.conftest import make_model

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no C compiler (cc or gcc) on PATH")

ELEM = {np.dtype(k): v for k, v in {
    np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE, np.int8: TensorProto.INT8,
    np.int16: TensorProto.INT16, np.int32: TensorProto.INT32, np.int64: TensorProto.INT64,
    np.uint8: TensorProto.UINT8, np.uint16: TensorProto.UINT16, np.uint32: TensorProto.UINT32,
    np.uint64: TensorProto.UINT64}.items()}


def _model(nodes, feeds: dict, outputs: dict, opset: int, initializers=()):
    """outputs: name -> (dtype, shape)."""
    ins = [(k, ELEM[v.dtype], list(v.shape)) for k, v in feeds.items()]
    outs = [(k, ELEM[np.dtype(dt)], list(s)) for k, (dt, s) in outputs.items()]
    return make_model(nodes, ins, outs, initializers, opset=opset)


def _compile(model, backend):
    return ml.compile(ml.load_onnx(model), backend, inference=True)


def _c_equals_numpy(model, feeds, rtol=1e-5, atol=1e-6):
    """Compiles strictly in C, runs, and compares every output with NumPy's (dtype, shape, values)."""
    pm = _compile(model, ml.CBackend(fallback=None))
    assert not pm.program.fallback
    got = {k: np.asarray(v) for k, v in pm.evaluate(None, feeds).items()}
    with np.errstate(all="ignore"):
        ref = {k: np.asarray(v) for k, v in _compile(model, ml.NumpyBackend()).evaluate(None, feeds).items()}
    assert got.keys() == ref.keys()
    for k in ref:
        assert got[k].dtype == ref[k].dtype, k
        assert got[k].shape == ref[k].shape, k
        if ref[k].dtype.kind == "f":
            np.testing.assert_allclose(got[k], ref[k], rtol=rtol, atol=atol, equal_nan=True, err_msg=k)
        else:
            np.testing.assert_array_equal(got[k], ref[k], err_msg=k)
    return got


def _rand(*shape, seed=0):
    return np.random.default_rng(seed + len(shape)).standard_normal(shape)


def _tol(dtype):
    return dict(rtol=1e-5, atol=1e-6) if np.dtype(dtype) == np.float32 else dict(rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rms_and_lp_normalization(dtype):
    """RMSNormalization over the last dims and from axis 0, scale whole, one value, broadcast along a
    normalized dim, with leading 1s; epsilon and stash_type=DOUBLE. LpNormalization p=1 and p=2
    along every kind of axis, a zero vector staying zero; one large input takes the threaded path."""
    mk = helper.make_node
    nodes = [mk("RMSNormalization", ["x", "s5"], ["r_last"]),
             mk("RMSNormalization", ["x", "s345"], ["r_axis1"], axis=1, epsilon=0.25),
             mk("RMSNormalization", ["x", "s1"], ["r_scalar"], axis=-2, stash_type=TensorProto.DOUBLE),
             mk("RMSNormalization", ["x", "s3_1_1"], ["r_rows"], axis=-3),
             mk("RMSNormalization", ["x", "s1_4_1"], ["r_mid"], axis=0),
             mk("RMSNormalization", ["x", "s_1_1_5"], ["r_lead"], axis=2),
             mk("RMSNormalization", ["big", "sbig"], ["r_big"]),
             mk("LpNormalization", ["z"], ["l_default"]),
             mk("LpNormalization", ["z"], ["l1_axis0"], axis=0, p=1),
             mk("LpNormalization", ["x"], ["l2_axis1"], axis=1, p=2),
             mk("LpNormalization", ["x"], ["l1_neg"], axis=-2, p=1),
             mk("LpNormalization", ["big"], ["l2_big"], axis=0)]
    z = _rand(3, 4)
    z[1] = 0.0
    z[:, 2] = 0.0
    feeds = {k: v.astype(dtype) for k, v in {
        "x": _rand(2, 3, 4, 5), "z": z, "big": _rand(64, 700),
        "s5": _rand(5, seed=1), "s345": _rand(3, 4, 5, seed=2), "s1": _rand(1, seed=3),
        "s3_1_1": _rand(3, 1, 1, seed=4), "s1_4_1": _rand(1, 4, 1, seed=5), "s_1_1_5": _rand(1, 1, 5, seed=6),
        "sbig": _rand(700, seed=7)}.items()}
    shapes = {"r_last": (2, 3, 4, 5), "r_axis1": (2, 3, 4, 5), "r_scalar": (2, 3, 4, 5), "r_rows": (2, 3, 4, 5),
              "r_mid": (2, 3, 4, 5), "r_lead": (2, 3, 4, 5), "r_big": (64, 700), "l_default": (3, 4),
              "l1_axis0": (3, 4), "l2_axis1": (2, 3, 4, 5), "l1_neg": (2, 3, 4, 5), "l2_big": (64, 700)}
    got = _c_equals_numpy(_model(nodes, feeds, {k: (dtype, s) for k, s in shapes.items()}, opset=23), feeds,
                          **_tol(dtype))
    assert not got["l_default"][1].any() and not got["l1_axis0"][:, 2].any()  # zero vectors stay zero
    x = feeds["x"].astype(np.float64)
    want = x / np.sqrt((x * x).mean(axis=(1, 2, 3), keepdims=True) + 0.25) * feeds["s345"]
    np.testing.assert_allclose(got["r_axis1"], want, rtol=1e-5)


def test_cumprod():
    """CumProd along each axis, exclusive, reverse and both, the axis a constant or given at run
    time (negative too), in float32, float64 and integer types whose products wrap as NumPy's do."""
    mk = helper.make_node
    rng = np.random.default_rng(3)
    nodes, feeds, outs = [], {"ax": np.array(1, np.int32)}, {}
    for dt in (np.float32, np.float64, np.int32, np.int64, np.uint8, np.int8):
        t = np.dtype(dt).name
        if np.dtype(dt).kind == "f":
            feeds[t] = rng.uniform(0.5, 1.5, (3, 4, 5)).astype(dt)
        else:
            feeds[t] = rng.integers(1 if np.dtype(dt).kind == "u" else -7, 8, (3, 4, 5)).astype(dt)
        nodes += [mk("CumProd", [t, "ax0"], [f"c0_{t}"]),
                  mk("CumProd", [t, "ax"], [f"run_{t}"]),
                  mk("CumProd", [t, "ax_neg"], [f"ex_{t}"], exclusive=1),
                  mk("CumProd", [t, "ax_neg"], [f"rev_{t}"], reverse=1),
                  mk("CumProd", [t, "ax0"], [f"both_{t}"], exclusive=1, reverse=1)]
        outs.update({f"{o}_{t}": (dt, (3, 4, 5)) for o in ("c0", "run", "ex", "rev", "both")})
    inits = {"ax0": np.array(0, np.int64), "ax_neg": np.array([-1], np.int64)}
    got = _c_equals_numpy(_model(nodes, feeds, outs, opset=26, initializers=inits), feeds, rtol=1e-6, atol=0)
    np.testing.assert_array_equal(got["ex_float32"][..., 0], 1)
    for t in ("int8", "uint8"):  # 5 factors up to 7 overflow: the products wrap
        assert got[f"rev_{t}"][..., 0].tolist() == np.prod(feeds[t], axis=-1, dtype=t).tolist()


def test_cumprod_axis_given_at_run_time_is_checked():
    x = np.arange(1, 7, dtype=np.float32).reshape(2, 3)
    model = _model([helper.make_node("CumProd", ["x", "axis"], ["y"], name="cp")],
                   {"x": x, "axis": np.array(0, np.int64)}, {"y": (np.float32, (2, 3))}, opset=26)
    pm = _compile(model, ml.CBackend(fallback=None))
    np.testing.assert_array_equal(pm.evaluate(None, {"x": x, "axis": np.array(-1)})["y"], np.cumprod(x, axis=1))
    with pytest.raises(NodeError, match="node 'cp'.*the axis is out of range"):
        pm.evaluate(None, {"x": x, "axis": np.array(2)})


def test_top_k():
    """TopK largest and smallest along the last, a middle and the first axis (rows `inner` apart),
    sorted=0, K a constant or given at run time, ties to the lower index, in float32, float64, int8
    and uint64; one large input takes the threaded path."""
    mk = helper.make_node
    rng = np.random.default_rng(5)
    nodes, feeds, outs = [], {"k_run": np.array([2], np.int64)}, {}
    for dt in (np.float32, np.float64, np.int8, np.uint64):
        t = np.dtype(dt).name
        feeds[t] = rng.integers(0, 6, (4, 7, 3)).astype(dt)  # few distinct values: many ties
        nodes += [mk("TopK", [t, "k3"], [f"v_last_{t}", f"i_last_{t}"]),
                  mk("TopK", [t, "k3"], [f"v_small_{t}", f"i_small_{t}"], axis=1, largest=0),
                  mk("TopK", [t, "k_run"], [f"v_first_{t}", f"i_first_{t}"], axis=0, sorted=0),
                  mk("TopK", [t, "k7"], [f"v_all_{t}", f"i_all_{t}"], axis=-2, largest=0)]
        shapes = {"last": (4, 7, 3), "small": (4, 3, 3), "first": (2, 7, 3), "all": (4, 7, 3)}
        outs.update({f"{p}_{o}_{t}": (dt if p == "v" else np.int64, s) for o, s in shapes.items() for p in "vi"})
    feeds["big"] = rng.integers(0, 50, (64, 900)).astype(np.float32)
    nodes.append(mk("TopK", ["big", "k3"], ["v_big", "i_big"], largest=0))
    outs.update({"v_big": (np.float32, (64, 3)), "i_big": (np.int64, (64, 3))})
    inits = {"k3": np.array([3], np.int64), "k7": np.array([7], np.int64)}
    got = _c_equals_numpy(_model(nodes, feeds, outs, opset=24, initializers=inits), feeds, rtol=0, atol=0)
    # A full smallest-first TopK is a stable sort of each row: equal values keep their order.
    np.testing.assert_array_equal(got["i_all_int8"], np.argsort(feeds["int8"], axis=1, stable=True))


def test_top_k_orders_nan_first_and_ties_by_index():
    x = np.array([[1.0, 3.0, np.nan, 3.0, -0.0, 0.0, np.nan, 2.0]], np.float32)
    nodes = [helper.make_node("TopK", ["x", "k"], ["v", "i"]),
             helper.make_node("TopK", ["x", "k"], ["vs", "is"], largest=0)]
    outs = {"v": (np.float32, (1, 8)), "i": (np.int64, (1, 8)), "vs": (np.float32, (1, 8)), "is": (np.int64, (1, 8))}
    got = _c_equals_numpy(_model(nodes, {"x": x}, outs, opset=24, initializers={"k": np.array([8], np.int64)}),
                          {"x": x})
    assert got["i"].tolist() == [[2, 6, 1, 3, 7, 0, 4, 5]]
    assert got["is"].tolist() == [[4, 5, 0, 7, 1, 3, 2, 6]]


def test_top_k_with_k_attribute_before_opset_10():
    x = _rand(3, 6).astype(np.float32)
    nodes = [helper.make_node("TopK", ["x"], ["v", "i"], k=2, axis=0)]
    got = _c_equals_numpy(_model(nodes, {"x": x}, {"v": (np.float32, (2, 6)), "i": (np.int64, (2, 6))}, opset=9),
                          {"x": x})
    np.testing.assert_array_equal(got["i"], np.argsort(-x, axis=0, stable=True)[:2])


def test_top_k_given_another_k_at_run_time_raises():
    x = _rand(2, 5).astype(np.float32)
    model = _model([helper.make_node("TopK", ["x", "k"], ["v", "i"], name="top")],
                   {"x": x, "k": np.array([2], np.int64)}, {"v": (np.float32, (2, 2)), "i": (np.int64, (2, 2))},
                   opset=24)
    pm = _compile(model, ml.CBackend(fallback=None))
    np.testing.assert_array_equal(pm.evaluate(None, {"x": x, "k": np.array([2])})["v"], -np.sort(-x, axis=1)[:, :2])
    with pytest.raises(NodeError, match="node 'top'.*K is not 2"):
        pm.evaluate(None, {"x": x, "k": np.array([3])})


@pytest.mark.parametrize("node, opset, reason", [
    (helper.make_node("LpNormalization", ["x"], ["y"], p=3), 22, r"p=3 \(ONNX allows 1 and 2\)"),
    (helper.make_node("RMSNormalization", ["x", "s"], ["y"]), 23, r"scale \(2, 1\) does not broadcast"),
])
def test_nodes_c_cannot_run_are_refused_with_the_reason(node, opset, reason):
    feeds = {"x": _rand(2, 3).astype(np.float32), "s": _rand(2, 1).astype(np.float32)}
    feeds = {k: v for k, v in feeds.items() if k in node.input}
    model = _model([node], feeds, {"y": (np.float32, (2, 3))}, opset=opset)
    with pytest.raises(CKernelMissingError, match=f"{node.op_type}#0 .*{reason}"):
        _compile(model, ml.CBackend(fallback=None))


# Node-suite cases of the row-wise family that pass strictly (CBackend(fallback=None)), one per op and option.
NODE_CASES = ["test_rms_normalization_3d_axis_negative_2_epsilon", "test_l1normalization_axis_last",
              "test_cumprod_1d_int32_exclusive", "test_top_k_smallest"]


def test_node_suite_cases_pass_strictly():
    results = {name: conformance.run_case(name, "c") for name in NODE_CASES}
    bad = {n: (r.status, r.reason[:200]) for n, r in results.items() if r.status != "pass"}
    assert not bad
