"""The C backend's channel-blocked layout (mithril/backends/c/nchwc.py, lib/mt_nchwc_t.h): chains
of 1x1 and depthwise convolutions with constant weights run in NCHWc, with reorders where a value
enters or leaves the chain, and give what NumPy and onnxruntime give."""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest
from onnx import TensorProto, helper

import mithril as ml
from tests.conftest import make_model
from tests.backends.c.test_depthwise import matches_numpy_and_onnxruntime
from tests.backends.c.test_sanitize import CC, SANITIZE, sanitizers  # noqa: F401 - the fixture, used by name

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no C compiler (cc or gcc) on PATH")

ONNX_TYPE = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE}


def _chain(dtype):
    """A MobileNet-like chain on a 10x9 plane (90 positions: register tiles of 12, 4 and 1), batch
    2, channel counts that are not whole blocks (24, 40): 1x1 from NCHW into blocks, depthwise
    convolutions (stride 2 with uneven pads, 5x5, dilation 2, no bias), a residual fused into a
    1x1 convolution whose output is read blocked, a grouped 1x1 and a GlobalAveragePool reading
    blocked values, and blocked values as outputs."""
    rng = np.random.default_rng(7)
    inits = {}

    def conv(x, y, cin, cout, k=1, group=1, bias=True, **attrs):
        inits[f"{y}_w"] = rng.standard_normal((cout, cin // group, k, k)) / np.sqrt(cin // group * k * k)
        ins = [x, f"{y}_w"]
        if bias:
            inits[f"{y}_b"] = rng.standard_normal(cout)
            ins.append(f"{y}_b")
        return helper.make_node("Conv", ins, [y], group=group, name=y, **attrs)

    inits["lo"], inits["hi"] = np.array(0.0), np.array(6.0)
    nodes = [
        conv("x", "c1", 24, 48), helper.make_node("Clip", ["c1", "lo", "hi"], ["a1"]),
        conv("a1", "c2", 48, 48, k=3, group=48, pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c2"], ["a2"]),
        conv("a2", "c3", 48, 24, bias=False), helper.make_node("Add", ["c3", "x"], ["a3"]),
        conv("a3", "a4", 24, 40),
        conv("a4", "a5", 40, 40, k=3, group=40, strides=[2, 2], pads=[0, 1, 1, 2]),
        conv("a5", "a6", 40, 40, k=3, group=40, bias=False, dilations=[2, 2], pads=[2, 2, 2, 2]),
        conv("a6", "a7", 40, 16),
        conv("a6", "a8", 40, 40, k=5, group=40, pads=[2, 2, 2, 2]),
        conv("a4", "g1", 40, 20, group=2),
        helper.make_node("GlobalAveragePool", ["a8"], ["gap"]),
    ]
    ty = ONNX_TYPE[np.dtype(dtype)]
    outs = ["a7", "gap", "a5", "g1"]
    model = make_model(nodes, [("x", ty, [2, 24, 10, 9])], [(o, ty, None) for o in outs],
                       {k: v.astype(dtype) for k, v in inits.items()})
    x = (rng.standard_normal((2, 24, 10, 9)) * 2).astype(dtype)
    return model, {"x": x}, sorted(inits)


def _compile(model, dtype, constants):
    mdt = ml.float64 if dtype == np.float64 else ml.float32
    keys = {"constant_keys": constants} if constants else {}
    return ml.compile(ml.load_onnx(model), ml.CBackend(dtype=mdt, fallback=None), inference=True, **keys)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_chain_runs_blocked_and_matches(dtype):
    model, feeds, weights = _chain(dtype)
    pm = _compile(model, dtype, weights)
    src, sfx = pm.program.source, "f32" if dtype == np.float32 else "f64"
    # the eight 1x1 and depthwise convolutions blocked, the grouped one not; x enters blocks once
    # (the residual; c1 reads it in NCHW), a4 (read by the grouped conv), a8 (by the pool) and the
    # outputs a5 and a7 leave them
    assert src.count(f"mt_conv1x1_nchwc_{sfx}(") == 4 and src.count(f"mt_dw_nchwc_{sfx}(") == 4
    assert src.count(f"mt_nchwc_to_{sfx}(") == 1 and src.count(f"mt_nchwc_from_{sfx}(") == 4
    assert src.count(f"mt_conv_{sfx}(") == 1
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-10)
    matches_numpy_and_onnxruntime(pm.evaluate({}, feeds), model, feeds, dtype, tol)
    np.testing.assert_array_equal(feeds["x"], _chain(dtype)[1]["x"])  # the caller's input untouched


def test_parameters_are_never_packed():
    """Weights given at run time (parameters, the default) may change between calls: the plain
    kernels run, and new weights take effect."""
    model, feeds, _ = _chain(np.float32)
    pm = _compile(model, np.float32, None)
    assert "nchwc" not in pm.program.source
    params = pm.get_parameters()
    ref = ml.compile(ml.load_onnx(model), ml.NumpyBackend(), inference=True)
    params = {k: v * 0.5 for k, v in params.items()}
    got, want = pm.evaluate(params, feeds), ref.evaluate(params, feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-4, err_msg=k)


def test_switched_off(monkeypatch):
    model, feeds, weights = _chain(np.float32)
    monkeypatch.setenv("MITHRIL_C_NCHWC", "0")
    pm = _compile(model, np.float32, weights)
    assert "nchwc" not in pm.program.source and pm.program.source.count("mt_conv_f32(") == 5


def test_whole_blocks_stay_blocked_between_convolutions():
    """Channels a whole number of blocks (64 -> 384 -> 64, MobileNetV2's 14x14 block): the first
    1x1 convolution reads NCHW; the residual enters blocks and the result leaves them, once each."""
    rng = np.random.default_rng(3)
    inits = {"w1": rng.standard_normal((384, 64, 1, 1)) / 8, "w2": rng.standard_normal((384, 1, 3, 3)) / 3,
             "w3": rng.standard_normal((64, 384, 1, 1)) / 20}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["e"]), helper.make_node("Relu", ["e"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["d"], group=384, pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["d", "w3"], ["p"]), helper.make_node("Add", ["p", "x"], ["y"])]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [1, 64, 14, 14])], [("y", TensorProto.FLOAT, None)],
                       {k: v.astype(np.float32) for k, v in inits.items()})
    pm = _compile(model, np.float32, list(inits))
    src = pm.program.source
    assert src.count("mt_nchwc_to_f32(") == 1 and src.count("mt_nchwc_from_f32(") == 1
    assert src.count("mt_conv1x1_nchwc_f32(") == 2 and src.count("mt_dw_nchwc_f32(") == 1
    x = rng.standard_normal((1, 64, 14, 14)).astype(np.float32)
    ort = pytest.importorskip("onnxruntime")
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(pm.evaluate({}, {"x": x})["y"], want, rtol=1e-4, atol=1e-4)


DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include "mithril_kernels.h"
#define B 16 /* float32 channels per block */
static unsigned seed = 1;
static float rnd(void) { seed = seed * 1103515245u + 12345u; return (float)((seed >> 8) & 0xffff) / 65536.0f - 0.5f; }
static float *fill(mt_i n) {
    float *p = malloc(sizeof(float) * (size_t)(n ? n : 1));
    for (mt_i i = 0; i < n; i++) p[i] = rnd();
    return p;
}
static float *zeros(mt_i n) { return calloc((size_t)(n ? n : 1), sizeof(float)); }
static mt_i pad(mt_i c) { return (c + B - 1) / B * B; }
static int off(float got, float want) { return fabsf(got - want) > 1e-4f + 1e-4f * fabsf(want); }
static float clampf(float v, float lo, float hi) { return v < lo ? lo : (v > hi ? hi : v); }

/* 1x1 convolution of x [N][Cin][P] through the blocked kernel (x given blocked when xb), every
 * buffer its own allocation of exactly its size; the number of outputs off the direct sum. */
static int pw(mt_i N, mt_i Cin, mt_i Cout, mt_i P, int xb, int res) {
    float *x = fill(N * Cin * P), *w = fill(Cout * Cin), *bias = fill(Cout), *r = fill(N * Cout * P);
    float *wp = zeros(pad(Cout) * Cin), *bp = zeros(pad(Cout)), *rb = zeros(N * pad(Cout) * P);
    float *yb = zeros(N * pad(Cout) * P), *y = zeros(N * Cout * P), *xin = x;
    for (mt_i co = 0; co < Cout; co++) {
        bp[co] = bias[co];
        for (mt_i ci = 0; ci < Cin; ci++) wp[(co / B * Cin + ci) * B + co % B] = w[co * Cin + ci];
    }
    if (xb) { xin = zeros(N * pad(Cin) * P); mt_nchwc_to_f32(x, xin, N, Cin, P); }
    mt_nchwc_to_f32(r, rb, N, Cout, P);
    mt_conv1x1_nchwc_f32(xin, xb, wp, bp, res ? rb : 0, yb, N, Cin, Cout, P, -1.0f, 1.0f);
    mt_nchwc_from_f32(yb, y, N, Cout, P);
    int bad = 0;
    for (mt_i n = 0; n < N; n++)
        for (mt_i co = 0; co < Cout; co++)
            for (mt_i p = 0; p < P; p++) {
                float v = bias[co] + (res ? r[(n * Cout + co) * P + p] : 0.0f);
                for (mt_i ci = 0; ci < Cin; ci++) v += x[(n * Cin + ci) * P + p] * w[co * Cin + ci];
                bad += off(y[(n * Cout + co) * P + p], clampf(v, -1.0f, 1.0f));
            }
    if (xin != x) free(xin);
    free(x); free(w); free(bias); free(r); free(wp); free(bp); free(rb); free(yb); free(y);
    if (bad) printf("pw N%ld Cin%ld Cout%ld P%ld xb%d res%d: %d off\n", N, Cin, Cout, P, xb, res, bad);
    return bad;
}

/* Depthwise KxK convolution, stride s, pads top/left/bottom/right, dilation d, through the
 * blocked kernel and the reorders; the number of outputs off the direct sum. */
static int dw(mt_i N, mt_i C, mt_i H, mt_i W, mt_i K, mt_i s, mt_i pt, mt_i pl, mt_i pb, mt_i pr, mt_i d) {
    const mt_i OH = (H + pt + pb - d * (K - 1) - 1) / s + 1, OW = (W + pl + pr - d * (K - 1) - 1) / s + 1;
    float *x = fill(N * C * H * W), *w = fill(C * K * K), *bias = fill(C);
    float *wp = zeros(pad(C) * K * K), *bp = zeros(pad(C)), *xb = zeros(N * pad(C) * H * W);
    float *yb = zeros(N * pad(C) * OH * OW), *y = zeros(N * C * OH * OW);
    for (mt_i c = 0; c < C; c++) {
        bp[c] = bias[c];
        for (mt_i k = 0; k < K * K; k++) wp[(c / B * K * K + k) * B + c % B] = w[c * K * K + k];
    }
    mt_i g[21] = {1, H, W, 1, OH, OW, 1, K, K, 1, s, s, 0, pt, pl, 1, d, d, 0, pb, pr};
    mt_nchwc_to_f32(x, xb, N, C, H * W);
    mt_dw_nchwc_f32(xb, wp, bp, yb, N, C, g, -INFINITY, INFINITY);
    mt_nchwc_from_f32(yb, y, N, C, OH * OW);
    int bad = 0;
    for (mt_i n = 0; n < N; n++)
        for (mt_i c = 0; c < C; c++)
            for (mt_i oh = 0; oh < OH; oh++)
                for (mt_i ow = 0; ow < OW; ow++) {
                    float v = bias[c];
                    for (mt_i kh = 0; kh < K; kh++)
                        for (mt_i kw = 0; kw < K; kw++) {
                            mt_i ih = oh * s - pt + kh * d, iw = ow * s - pl + kw * d;
                            if (ih >= 0 && ih < H && iw >= 0 && iw < W)
                                v += x[((n * C + c) * H + ih) * W + iw] * w[(c * K + kh) * K + kw];
                        }
                    bad += off(y[((n * C + c) * OH + oh) * OW + ow], v);
                }
    free(x); free(w); free(bias); free(wp); free(bp); free(xb); free(yb); free(y);
    if (bad) printf("dw N%ld C%ld %ldx%ld K%ld s%ld d%ld: %d off\n", N, C, H, W, K, s, d, bad);
    return bad;
}

int main(void) {
    int bad = 0;
    bad += pw(2, 24, 40, 90, 0, 1);  /* NCHW in, 3 output blocks (a pair and one), tiles 12, 4, 1 */
    bad += pw(2, 40, 40, 90, 1, 1);  /* blocked in, padded */
    bad += pw(1, 33, 48, 37, 1, 0);
    bad += pw(1, 3, 17, 1, 0, 0);    /* one position */
    bad += pw(1, 16, 16, 5, 1, 0);
    bad += dw(2, 40, 10, 9, 3, 2, 0, 1, 1, 2, 1);   /* stride 2, uneven pads */
    bad += dw(1, 16, 7, 7, 3, 1, 1, 1, 1, 1, 1);
    bad += dw(1, 16, 20, 37, 3, 1, 1, 1, 1, 1, 1);  /* rows of 8-column groups */
    bad += dw(2, 24, 12, 11, 5, 1, 2, 2, 2, 2, 1);
    bad += dw(1, 40, 9, 8, 3, 1, 2, 2, 2, 2, 2);    /* dilation 2 */
    bad += dw(1, 16, 1, 1, 3, 2, 1, 1, 1, 1, 1);    /* a 1x1 plane: every tap but the centre on padding */
    bad += dw(1, 17, 4, 3, 3, 1, 0, 0, 0, 0, 1);    /* no padding, one column out */
    printf("%d off\n", bad);
    return bad != 0;
}
"""


def test_kernels_under_sanitizers(sanitizers, tmp_path):
    """The blocked kernels and reorders (padded last blocks, every tile width, edge columns,
    strides, dilation, a 1x1 plane) on buffers allocated to their exact sizes, built with
    AddressSanitizer and UBSan, equal to the direct sums."""
    from mithril.backends.c.build import LIB_DIR

    (tmp_path / "nchwc.c").write_text(DRIVER)
    exe = tmp_path / "nchwc"
    subprocess.run([CC, "-O1", "-std=c11", "-fopenmp", *SANITIZE, f"-I{LIB_DIR}", "-o", str(exe),
                    str(tmp_path / "nchwc.c"), "-lm"], check=True, capture_output=True)
    done = subprocess.run([str(exe)], capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert done.stdout.strip().endswith("0 off")


@pytest.mark.skipif(shutil.which("make") is None, reason="building the export needs make on PATH")
def test_export_packs_its_weights(tmp_path):
    """An export's weights are fixed once written: its 1x1 and depthwise convolutions run blocked
    (weights packed into model.bin, listed in model.h), and the tree built with make alone gives
    NumPy's outputs, with the params= given to export_c (they replace the model's own, then are
    packed)."""
    model, feeds, _ = _chain(np.float32)
    (tmp_path / "chain.onnx").write_bytes(model.SerializeToString())
    pm = ml.compile(ml.load_onnx(model), ml.NumpyBackend(), inference=True)
    params = {k: (v * 0.5).astype(v.dtype) for k, v in pm.get_parameters().items()}
    out = ml.export_c(tmp_path / "chain.onnx", tmp_path / "c", params=params, weights="file")
    # c1 stays a GEMM: the Clip's bounds are parameters here (fixed too, but the Clip is not fused
    # into it), so c1's result is read by the Clip, not by a convolution
    assert out.directory.joinpath("model.c").read_text().count("mt_conv1x1_nchwc_f32(") == 3
    assert "a4_w@nchwc" in out.directory.joinpath("model.h").read_text()
    done = subprocess.run(["make", "-C", str(out.directory)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    feeds["x"].tofile(tmp_path / "x.bin")
    outs = ["a7", "gap", "a5", "g1"]
    done = subprocess.run([str(out.directory / "model"), str(tmp_path / "x.bin"),
                           *(str(tmp_path / f"{o}.bin") for o in outs)],
                          capture_output=True, text=True, cwd=out.directory, timeout=120)
    assert done.returncode == 0, done.stderr
    want = pm.evaluate(params, feeds)
    for o in outs:
        got = np.fromfile(tmp_path / f"{o}.bin", np.float32).reshape(want[o].shape)
        np.testing.assert_allclose(got, want[o], rtol=1e-4, atol=1e-4, err_msg=o)
