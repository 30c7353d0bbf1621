"""The C backend's attention kernels (lib/mt_attention.h): Attention and RotaryEmbedding on
CBackend(fallback=None) equal NumPy in float32 and float64, what C cannot run is refused with its
reason, and a few ONNX node-suite cases pass strictly (no NumPy fallback)."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from onnx import TensorProto, helper

import mithril as ml
from mithril import conformance
from mithril.backends.c import build
from mithril.errors import CompileError, NodeError
from tests.conftest import make_model

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no C compiler (cc or gcc) on PATH")

ONNX_TYPE = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
             np.dtype(np.int64): TensorProto.INT64, np.dtype(np.bool_): TensorProto.BOOL}


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def _compile(nodes, feeds: dict, outputs, dtype, opset, backend, **options):
    """The graph compiled on ``backend(dtype=..., **options)``. ``outputs``: names, or (name, shape)
    where shape inference leaves the shape open."""
    dt = np.dtype(dtype)
    outputs = [o if isinstance(o, tuple) else (o, None) for o in outputs]
    model = make_model(nodes, [(k, ONNX_TYPE[v.dtype], list(v.shape)) for k, v in feeds.items()],
                       [(k, ONNX_TYPE[dt], shape) for k, shape in outputs], opset=opset)
    flt = ml.float64 if dt == np.float64 else ml.float32
    return ml.compile(ml.load_onnx(model), backend(dtype=flt, **options), inference=True)


def _assert_same(got, want, dtype):
    tol = dict(rtol=1e-5, atol=1e-5) if np.dtype(dtype) == np.float32 else dict(rtol=1e-11, atol=1e-12)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].shape == want[k].shape, k
        assert got[k].dtype == want[k].dtype, k
        np.testing.assert_allclose(got[k], want[k], err_msg=k, **tol)


def _graph(dtype):
    """Four Attention nodes and three RotaryEmbedding nodes, and their feeds."""
    mk, dt = helper.make_node, np.dtype(dtype)
    nodes = [
        # 4-D, 6 query heads over 2 key heads, causal after 4 past keys, softcap, a float mask 1 key
        # short of the 7 (the last key is masked), V's head size 4; scores after the mask
        mk("Attention", ["q1", "k1", "v1", "m1", "pk1", "pv1"], ["y1", "present_k1", "present_v1", "qk1"],
           is_causal=1, softcap=2.5, qk_matmul_output_mode=2),
        # 3-D, 4 query heads over 2, a bool mask whose second row masks every key (zeros), the
        # present keys and values without past ones (the heads split out), the softmax as output 4
        mk("Attention", ["q2", "k2", "v2", "m2"], ["y2", "present_k2", "present_v2", "qk2"], q_num_heads=4,
           kv_num_heads=2, scale=0.3, qk_matmul_output_mode=3),
        # 70 query rows (three blocks) over 90 keys, threads: causal from nonpad_kv_seqlen - 70
        mk("Attention", ["q3", "k3", "v3", "", "", "", "nonpad3"], ["y3"], is_causal=1),
        # 3-D with past keys but no present outputs (they go to scratch), softmax in float64
        mk("Attention", ["q4", "k4", "v4", "", "pk4", "pv4"], ["y4"], q_num_heads=3, kv_num_heads=1, softcap=1.5,
           softmax_precision=TensorProto.DOUBLE),
        mk("RotaryEmbedding", ["x5", "cos5", "sin5", "pos5"], ["r5"], interleaved=1, name="rope"),
        mk("RotaryEmbedding", ["x6", "cos6", "sin6", "pos6"], ["r6"], num_heads=3, rotary_embedding_dim=4),
        mk("RotaryEmbedding", ["x5", "cos7", "sin7"], ["r7"]),
    ]
    m2 = np.ones((3, 6), bool)
    m2[1] = False
    m2[2, :2] = False
    angles = np.arange(20)[:, None] * np.array([1.0, 0.3, 0.1, 0.03])
    feeds = {"q1": _rand(2, 6, 5, 8, seed=1), "k1": _rand(2, 2, 3, 8, seed=2), "v1": _rand(2, 2, 3, 4, seed=3),
             "m1": _rand(2, 1, 5, 6, seed=4), "pk1": _rand(2, 2, 4, 8, seed=5), "pv1": _rand(2, 2, 4, 4, seed=6),
             "q2": _rand(2, 3, 32, seed=7), "k2": _rand(2, 6, 16, seed=8), "v2": _rand(2, 6, 10, seed=9), "m2": m2,
             "q3": _rand(1, 4, 70, 16, seed=10), "k3": _rand(1, 4, 90, 16, seed=11),
             "v3": _rand(1, 4, 90, 16, seed=12), "nonpad3": np.array([80]),
             "q4": _rand(2, 40, 24, seed=13), "k4": _rand(2, 40, 8, seed=14), "v4": _rand(2, 40, 8, seed=15),
             "pk4": _rand(2, 1, 10, 8, seed=16), "pv4": _rand(2, 1, 10, 8, seed=17),
             "x5": _rand(2, 3, 5, 8, seed=18), "cos5": np.cos(angles), "sin5": np.sin(angles),
             "pos5": np.array([[0, 3, 7, 19, 2], [5, 5, 1, 0, 11]]),
             "x6": _rand(2, 5, 24, seed=19), "cos6": np.cos(angles[:, :2]), "sin6": np.sin(angles[:, :2]),
             "pos6": np.array([[4, 0, 9, 1, 2]]),
             "cos7": np.cos(_rand(2, 5, 4, seed=20)), "sin7": np.sin(_rand(2, 5, 4, seed=20))}
    feeds = {k: v.astype(dt) if v.dtype.kind == "f" else v.astype(np.int64) if v.dtype.kind == "i" else v
             for k, v in feeds.items()}
    outputs = ["y1", "present_k1", "present_v1", "qk1", "y2", ("present_k2", [2, 2, 6, 8]),
               ("present_v2", [2, 2, 6, 5]), "qk2", "y3", "y4", "r5", "r6", "r7"]
    return nodes, feeds, outputs


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_attention_and_rotary_embedding_equal_numpy(dtype):
    nodes, feeds, outputs = _graph(dtype)
    pm = _compile(nodes, feeds, outputs, dtype, 24, ml.CBackend, fallback=None)
    ref = _compile(nodes, feeds, outputs, dtype, 24, ml.NumpyBackend)
    got, want = pm.evaluate({}, feeds), ref.evaluate({}, feeds)
    _assert_same(got, want, dtype)
    assert not got["y2"][:, 1].any() and not got["qk2"][:, :, 1].any()  # the fully masked row
    assert np.isfinite(got["y1"]).all()
    # a position id past the caches' rows stops the segment with an error naming the node
    feeds["pos5"][1, 2] = 20
    with pytest.raises(NodeError, match=r"node 'rope', op RotaryEmbedding, opset 24: "
                                        r"CBackend: a position id is outside the caches' 20 rows"):
        pm.evaluate({}, feeds)
    cc = shutil.which("cc") or shutil.which("gcc")
    done = subprocess.run([cc, "-fsyntax-only", "-fopenmp", "-Wall", "-Wextra", "-Werror", f"-I{build.LIB_DIR}",
                           "-x", "c", "-"], input=pm.program.source, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_what_c_cannot_run_is_refused_with_its_reason():
    mk = helper.make_node
    feeds = {"q": _rand(1, 2, 3, 4).astype(np.float32), "k": _rand(1, 2, 3, 4).astype(np.float32),
             "v": _rand(1, 2, 3, 4).astype(np.float32)}
    half = mk("Attention", ["q", "k", "v"], ["y"], softmax_precision=TensorProto.FLOAT16)
    with pytest.raises(CompileError, match=r"softmax_precision 10 \(C computes the softmax in float32 or float64\)"):
        _compile([half], feeds, ["y"], np.float32, 23, ml.CBackend, fallback=None)
    odd = mk("RotaryEmbedding", ["q", "cos", "sin"], ["y"], rotary_embedding_dim=3)
    feeds = {"q": feeds["q"], "cos": np.ones((1, 3, 1), np.float32), "sin": np.ones((1, 3, 1), np.float32)}
    with pytest.raises(CompileError, match=r"rotary_embedding_dim 3 is odd or above the head size 4"):
        _compile([odd], feeds, ["y"], np.float32, 23, ml.CBackend, fallback=None)


# Two cases: each Attention case builds a training program too (~8 s); the graphs above cover the rest.
NODE_CASES = ["test_attention_4d_with_past_and_present_qk_matmul_bias_3d_mask_causal",
              "test_rotary_embedding_with_interleaved_rotary_dim"]


def test_node_suite_cases_pass_strictly():
    results = {name: conformance.run_case(name, "c") for name in NODE_CASES}
    bad = {n: (r.status, r.reason[:200]) for n, r in results.items() if r.status != "pass"}
    assert not bad
