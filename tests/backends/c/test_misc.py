"""The C backend's kernels of lib/mt_misc.h: Adagrad, Adam and Momentum (ai.onnx.preview.training),
HannWindow, HammingWindow, BlackmanWindow, Det and TensorScatter on CBackend(fallback=None) equal
NumPy's kernels (the optimizers and TensorScatter exactly, the windows and Det within rounding) in
float32 and float64; a window size that differs at run time from the compiled one stops the run; a
fixed list of ONNX node-suite cases passes strictly."""

from __future__ import annotations

import shutil
import subprocess

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
TRAINING = "ai.onnx.preview.training"


def _onnx_type(dt) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dt))


def _compile(nodes, feeds: dict, outputs: dict, initializers=(), opset=24):
    """The graph of ``nodes`` on CBackend(fallback=None) and on NumPy. ``outputs`` maps names to
    dtypes, or to (dtype, shape) where the shape is not inferred (a window's size given at run time)."""
    outs = [(k, _onnx_type(v[0] if isinstance(v, tuple) else v), v[1] if isinstance(v, tuple) else None)
            for k, v in outputs.items()]
    model = make_model(nodes, [(k, _onnx_type(v.dtype), list(v.shape)) for k, v in feeds.items()], outs,
                       initializers, opset=opset, domains=(TRAINING,))
    pm = ml.compile(ml.load_onnx(model), ml.CBackend(fallback=None), inference=True)
    assert not pm.program.fallback
    return pm, ml.compile(ml.load_onnx(model), ml.NumpyBackend(), inference=True)


def _compiles_with_warnings_as_errors(source: str) -> None:
    cc = shutil.which("cc") or shutil.which("gcc")
    done = subprocess.run([cc, "-fsyntax-only", "-std=c11", "-fopenmp", "-Wall", "-Wextra", "-Werror",
                           f"-I{build.LIB_DIR}", "-x", "c", "-"], input=source, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def _graph(dt):
    """Every op of the family in one graph of float type ``dt``: its nodes, feeds, outputs and
    initializers, and the outputs compared within rounding (the rest exactly)."""
    f = lambda *shape: RNG.standard_normal(shape).astype(dt)  # noqa: E731
    nodes = [
        mk("Adagrad", ["r", "t", "x1", "x2", "g1", "g2", "h1", "h2"], ["ag_x1", "ag_x2", "ag_h1", "ag_h2"],
           domain=TRAINING, decay_factor=0.1, epsilon=1e-5, norm_coefficient=0.001),
        mk("Adam", ["r", "t", "x1", "g1", "v1", "h1"], ["ad_x", "ad_v", "ad_h"], domain=TRAINING, alpha=0.9,
           beta=0.85, epsilon=1e-3, norm_coefficient=0.01, norm_coefficient_post=0.02),
        mk("Adam", ["r", "t0", "x2", "g2", "v2", "h2"], ["ad0_x", "ad0_v", "ad0_h"], domain=TRAINING),  # first step
        mk("Momentum", ["r", "t0", "x1", "g1", "v1"], ["mo_x", "mo_v"], domain=TRAINING, alpha=0.95, beta=0.1,
           mode="standard", norm_coefficient=0.001),  # T = 0: the whole gradient
        mk("Momentum", ["r", "t", "x2", "g2", "v2"], ["ne_x", "ne_v"], domain=TRAINING, alpha=0.95, beta=0.7,
           mode="nesterov", norm_coefficient=0.01),
        mk("HannWindow", ["n7"], ["hann"], output_datatype=_onnx_type(dt)),  # size a constant
        mk("HammingWindow", ["n"], ["hamming"], periodic=0, output_datatype=_onnx_type(dt)),  # size at run time
        mk("BlackmanWindow", ["n1"], ["blackman1"], periodic=0, output_datatype=_onnx_type(dt)),  # [1]
        mk("Det", ["m3"], ["det3"]),
        mk("Det", ["m5"], ["det5"]),
        mk("TensorScatter", ["cache", "upd", "wi"], ["ts_lin"]),  # past the end dropped
        mk("TensorScatter", ["cache", "upd", "wi"], ["ts_circ"], mode="circular"),
        mk("TensorScatter", ["cache3", "upd3"], ["ts_ax1"], axis=1),
        mk("TensorScatter", ["cache16", "upd16", "wi"], ["ts_f16"], mode="circular"),
    ]
    singular = np.array([[1, 2, 3], [2, 4, 6], [0, 1, 1]], dt)
    feeds = {"r": np.array(0.1, np.float32), "t": np.array(3, np.int64), "t0": np.array(0, np.int64),
             "x1": f(2, 3), "x2": f(5), "g1": f(2, 3), "g2": f(5), "v1": f(2, 3), "v2": f(5),
             "h1": np.abs(f(2, 3)), "h2": np.abs(f(5)), "n": np.array(10, np.int64),
             "n1": np.array(1, np.int32), "m3": np.stack([f(3, 3), singular, np.eye(3, dtype=dt)]), "m5": f(5, 5),
             "cache": f(3, 2, 6, 4), "upd": f(3, 2, 3, 4), "wi": np.array([1, 4, -2], np.int64),
             "cache3": f(2, 5, 3), "upd3": f(2, 2, 3), "cache16": f(3, 2, 6, 4).astype(np.float16),
             "upd16": f(3, 2, 3, 4).astype(np.float16)}
    outputs = {k: dt for k in ("ag_x1", "ag_x2", "ag_h1", "ag_h2", "ad_x", "ad_v", "ad_h", "ad0_x", "ad0_v", "ad0_h",
                               "mo_x", "mo_v", "ne_x", "ne_v", "hann", "det3", "det5", "ts_lin",
                               "ts_circ", "ts_ax1")}
    outputs.update({"hamming": (dt, [10]), "blackman1": (dt, [1]), "ts_f16": np.float16})
    return nodes, feeds, outputs, {"n7": np.array(7, np.int64)}, ("hann", "hamming", "blackman1", "det3", "det5")


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_ops_match_numpy(dt):
    nodes, feeds, outputs, initializers, rounded = _graph(dt)
    pm, ref = _compile(nodes, feeds, outputs, initializers)
    got, want = pm.evaluate({}, feeds), ref.evaluate({}, feeds)
    assert got.keys() == want.keys()
    tol = 1e-6 if dt == np.float32 else 1e-13
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        if k in rounded:
            np.testing.assert_allclose(got[k], want[k], rtol=tol, atol=tol, err_msg=k)
        else:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    assert got["det3"][1] == 0 and got["det3"][2] == 1 and got["blackman1"].tolist() == [1]
    assert not np.array_equal(got["ts_lin"], feeds["cache"]) and not np.array_equal(got["ts_lin"], got["ts_circ"])
    if dt == np.float32:
        _compiles_with_warnings_as_errors(pm.program.source)
    # A run-time size other than the compiled length is an error naming the node, not a wrong window.
    with pytest.raises(MithrilError, match="size is not 10"):
        pm.evaluate({}, {**feeds, "n": np.array(9, np.int64)})


def test_refusals_name_the_reason():
    """What the kernels do not take is refused at compile (strict), with the reason."""
    x = np.ones(3, np.float32)
    scalars = {"r": np.array(0.1, np.float32), "t": np.array(1, np.int64)}
    cases = [
        (mk("Momentum", ["r", "t", "x", "g", "v"], ["xo", "vo"], domain=TRAINING, alpha=0.9, beta=0.1, mode="heavy",
            norm_coefficient=0.0), {**scalars, "x": x, "g": x, "v": x}, {"xo": np.float32, "vo": np.float32},
         "mode 'heavy'"),
        (mk("Adagrad", ["r", "t", "x", "g", "h"], ["xo", "ho"], domain=TRAINING),
         {**scalars, "x": x, "g": x, "h": np.ones(3, np.float64)}, {"xo": np.float32, "ho": np.float64},
         "'h' is float64"),
        (mk("HannWindow", ["n"], ["w"], output_datatype=_onnx_type(np.int32)), {"n": np.array(4, np.int64)},
         {"w": (np.int32, [4])}, "output_datatype int32"),
        (mk("TensorScatter", ["c", "u"], ["y"], axis=0), {"c": np.ones((4, 3), np.float32),
                                                         "u": np.ones((2, 3), np.float32)}, {"y": (np.float32, [4, 3])},
         "sequence axis"),
    ]
    for node, feeds, outputs, reason in cases:
        with pytest.raises(MithrilError, match=reason):
            _compile([node], feeds, outputs)


NODE_CASES = ["test_adam_multiple", "test_nesterov_momentum", "test_blackmanwindow", "test_det_nd",
              "test_tensorscatter_circular"]


def test_node_suite_cases_pass_strictly():
    results = {name: conformance.run_case(name, "c") for name in NODE_CASES}
    bad = {n: (r.status, r.reason[:200]) for n, r in results.items() if r.status != "pass"}
    assert not bad
