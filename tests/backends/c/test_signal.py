"""The C backend's signal, contraction and detection kernels (lib/mt_signal.h): Einsum, DFT, STFT,
Col2Im, DeformConv, RoiAlign and NonMaxSuppression on CBackend(fallback=None) equal NumPy's, in
float32 and float64 (and integer types for Einsum); transforms round within an ulp or two of
NumPy's pocketfft; values given at run time that do not fit the compiled shapes stop the run with
the node's name; what C cannot run is refused with the reason; a few node-suite cases pass strictly.

Every op and type runs in one graph, built once for the module (each C build costs seconds)."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from onnx import TensorProto, helper

import mithril as ml
from mithril import conformance
from mithril.backends.c import build
from mithril.backends.c.program import CKernelMissingError
from mithril.errors import NodeError
from tests.conftest import make_model

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no C compiler (cc or gcc) on PATH")

ELEM = {np.dtype(k): v for k, v in {
    np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE, np.int8: TensorProto.INT8,
    np.int32: TensorProto.INT32, np.int64: TensorProto.INT64, np.uint8: TensorProto.UINT8}.items()}
FLOATS = ("float32", "float64")
mk = helper.make_node


def _rand(*shape, seed=0):
    return np.random.default_rng(seed + 7 * len(shape) + sum(shape)).standard_normal(shape)


def _complex(*shape, seed=0):
    return np.stack([_rand(*shape, seed=seed), _rand(*shape, seed=seed + 1)], axis=-1)


class _Graph:
    """Nodes over named inputs; each output's dtype, and those compared within an ulp or two."""

    def __init__(self):
        self.nodes, self.feeds, self.outs, self.tight = [], {}, {}, set()
        self.inits = {"ax1": np.array(1, np.int64), "ax2": np.array(2, np.int64), "axm3": np.array(-3, np.int64),
                      "len7": np.array(7, np.int64), "len16": np.array(16, np.int32), "step3": np.array(3, np.int64),
                      "flen8": np.array(8, np.int64)}

    def add(self, op, inputs, output, dtype, **attrs):
        self.nodes.append(mk(op, inputs, [output], **attrs))
        self.outs[output] = np.dtype(dtype)


# Einsum equations over operands named by their shapes.
EINSUM = [
    ("ij->ji", ["a3_4"]), ("ij->i", ["a3_4"]), ("...ii->...i", ["d3_5_5"]), ("i,i", ["v5", "w5"]), ("->", ["s"]),
    ("ii", ["q5_5"]), ("bij,bjk->bik", ["x5_2_3", "y5_3_4"]), ("ij,jk", ["a3_4", "a4_5"]),
    ("ij,jk,kl->il", ["a3_4", "a4_5", "a5_6"]), ("...ij,...jk->...ik", ["e2_1_3_4", "e3_4_5"]),
    ("ijk,k->", ["d3_5_5", "v5"]), ("i,j->ij", ["v5", "a6"]),
    # the GEMM paths (M * N * K >= 4096): in place, B transposed, operands swapped, A packed, the output
    # through scratch, a summed label only one operand has
    ("bij,bjk->bik", ["g3_16_16", "h3_16_16"]), ("bhqd,bhkd->bhqk", ["q2_2_16_16", "k2_2_16_16"]),
    ("ik,jk->ji", ["m16_16", "n16_16"]), ("ixk,kj->xij", ["p8_4_16", "n16_16"]),
    ("bik,bkj->jbi", ["g3_16_16", "h3_16_16"]), ("ijx,jk->ik", ["r16_16_4", "n16_16"]),
]


def _einsum(g: _Graph):
    def operand(name, dtype):
        shape = [] if name == "s" else [int(d) for d in name[1:].split("_")]
        seed = len(g.feeds)
        if np.dtype(dtype).kind == "f":
            return _rand(*shape, seed=seed).astype(dtype)
        return np.random.default_rng(seed).integers(-9, 10, shape).astype(dtype)

    for t in FLOATS:
        for i, (eq, names) in enumerate(EINSUM):
            for name in names:
                g.feeds.setdefault(f"{t}_{name}", operand(name, t))
            g.add("Einsum", [f"{t}_{name}" for name in names], f"{t}_einsum{i}", t, equation=eq)
    for t in ("int8", "int32", "uint8"):  # products and sums that overflow wrap
        g.feeds[f"{t}_a"], g.feeds[f"{t}_b"] = operand("a3_4", t), operand("a4_5", t)
        g.add("Einsum", [f"{t}_a", f"{t}_b"], f"{t}_einsum_mm", t, equation="ij,jk->ik")
        g.add("Einsum", [f"{t}_a"], f"{t}_einsum_sum", t, equation="ij->")


def _dft(g: _Graph):
    g.feeds["axis_in"] = np.array(-3, np.int64)
    for t in FLOATS:
        for n in (2, 3, 4, 5, 7, 8, 11, 12, 13, 22, 53, 64, 97):  # every pass, a generic prime, Bluestein
            g.feeds[f"{t}_c{n}"] = _complex(2, n, 3, seed=n).astype(t)
            g.add("DFT", [f"{t}_c{n}", "", "ax1"], f"{t}_dft{n}", t)
            g.add("DFT", [f"{t}_c{n}", "", "ax1"], f"{t}_dft_inverse{n}", t, inverse=1)
            g.tight |= {f"{t}_dft{n}", f"{t}_dft_inverse{n}"}
        r = f"{t}_r"
        g.feeds[r] = _rand(3, 10, 4, 1).astype(t)
        g.add("DFT", [r, "", "ax1"], f"{t}_dft_rfft", t, onesided=1)
        g.add("DFT", [r, "", "axis_in"], f"{t}_dft_runtime_axis", t)
        g.add("DFT", [r, "len16", "ax2"], f"{t}_dft_padded", t)
        g.add("DFT", [r, "len7", "ax1"], f"{t}_dft_truncated", t, onesided=1)
        g.add("DFT", [r, "", "ax1"], f"{t}_dft_real_inverse", t, inverse=1)
        g.add("DFT", [f"{t}_c12", "len7", "ax1"], f"{t}_dft_irfft_odd", t, inverse=1, onesided=1)
        g.add("DFT", [f"{t}_c12", "", "axm3"], f"{t}_dft_irfft_neg_axis", t, inverse=1, onesided=1)
        g.add("DFT", [f"{t}_c8"], f"{t}_dft_complex_onesided", t, onesided=1)
        g.feeds.update({f"{t}_sig": _rand(2, 40, 1).astype(t), f"{t}_csig": _complex(1, 30, seed=3).astype(t),
                        f"{t}_win": np.hanning(8).astype(t)})
        g.add("STFT", [f"{t}_sig", "step3", f"{t}_win"], f"{t}_stft_window", t)
        g.add("STFT", [f"{t}_sig", "step3", "", "flen8"], f"{t}_stft_length", t, onesided=0)
        g.add("STFT", [f"{t}_csig", "step3", f"{t}_win"], f"{t}_stft_complex", t, onesided=0)


def _windows(g: _Graph):
    rng = np.random.default_rng(11)
    g.feeds.update({"img": np.array([5, 6], np.int64), "blk": np.array([2, 2], np.int64),
                    "img3": np.array([3, 3, 4], np.int64), "blk3": np.array([2, 2, 2], np.int64),
                    "bi": np.array([1, 0, 1, 0], np.int64)})
    N, C, H, W, M, G, OG = 2, 4, 7, 6, 6, 2, 2
    oh, ow = 3, 6  # pads (1, 0, 1, 1), dilations (2, 1), strides (2, 1) over 7 x 6 with a 3 x 2 kernel
    conv = dict(group=G, offset_group=OG, strides=[2, 1], dilations=[2, 1], pads=[1, 0, 1, 1])
    for t in FLOATS:
        g.feeds.update({f"{t}_cols": _rand(2, 3 * 4, 9).astype(t), f"{t}_cols3": _rand(1, 2 * 8, 16).astype(t),
                        f"{t}_x": _rand(N, C, H, W).astype(t), f"{t}_w": _rand(M, C // G, 3, 2).astype(t),
                        f"{t}_b": _rand(M).astype(t), f"{t}_off": (2.5 * _rand(N, OG * 6 * 2, oh, ow)).astype(t),
                        f"{t}_mask": rng.uniform(0, 1, (N, OG * 6, oh, ow)).astype(t),
                        f"{t}_rois": np.array([[0.5, 1.0, 4.2, 5.5], [-2.0, -1.0, 3.0, 2.0], [7.0, 8.0, 9.0, 9.5],
                                               [2, 3, 2.5, 3.2]], t)})
        g.add("Col2Im", [f"{t}_cols", "img", "blk"], f"{t}_col2im", t, strides=[2, 2], pads=[1, 0, 0, 1],
              dilations=[1, 2])
        g.add("Col2Im", [f"{t}_cols3", "img3", "blk3"], f"{t}_col2im_3d", t, pads=[0, 0, 0, 0, 0, 1])
        g.add("DeformConv", [f"{t}_{k}" for k in ("x", "w", "off", "b", "mask")], f"{t}_deform", t, **conv)
        g.add("DeformConv", [f"{t}_x", f"{t}_w", f"{t}_off"], f"{t}_deform_plain", t, kernel_shape=[3, 2], **conv)
        g.add("RoiAlign", [f"{t}_x", f"{t}_rois", "bi"], f"{t}_roi", t, output_height=3, output_width=2,
              spatial_scale=0.8)
        g.add("RoiAlign", [f"{t}_x", f"{t}_rois", "bi"], f"{t}_roi_max", t, mode="max", output_height=2,
              output_width=3, sampling_ratio=2, coordinate_transformation_mode="output_half_pixel")


def _nms(g: _Graph):
    rng = np.random.default_rng(5)
    xy = rng.uniform(0, 10, (2, 12, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(1, 4, (2, 12, 2))], axis=-1).astype(np.float32)
    boxes[0, 3] = boxes[0, 3, [2, 3, 0, 1]]  # flipped corners
    scores = rng.uniform(0, 1, (2, 3, 12)).astype(np.float32)
    scores[1, 2, 4] = scores[1, 2, 5]  # a tie: the lower index first
    g.feeds.update({"boxes": boxes, "scores": scores, "k": np.array([4], np.int64),
                    "iou": np.array([0.3], np.float32), "thr": np.array([0.2], np.float32)})
    g.nodes.append(mk("NonMaxSuppression", ["boxes", "scores", "k", "iou", "thr"], ["nms"], name="nms"))
    g.nodes.append(mk("NonMaxSuppression", ["boxes", "scores", "k", "iou"], ["nms_center"], center_point_box=1))
    g.outs.update({"nms": np.dtype(np.int64), "nms_center": np.dtype(np.int64)})


def _compile(model, backend):
    return ml.compile(ml.load_onnx(model), backend, inference=True)


def _model(g: _Graph, shapes=None):
    ins = [(k, ELEM[v.dtype], list(v.shape)) for k, v in g.feeds.items()]
    outs = [(k, ELEM[dt], None if shapes is None else list(shapes[k])) for k, dt in g.outs.items()]
    return make_model(g.nodes, ins, outs, g.inits, opset=22)


@pytest.fixture(scope="module")
def run():
    """The graph of every op, its NumPy outputs (which give the declared output shapes), and the
    same model compiled strictly in C with its outputs."""
    g = _Graph()
    for part in (_einsum, _dft, _windows, _nms):
        part(g)
    with np.errstate(all="ignore"):
        ref = _compile(_model(g), ml.NumpyBackend()).evaluate(None, g.feeds)
    ref = {k: np.asarray(v) for k, v in ref.items()}
    pm = _compile(_model(g, {k: v.shape for k, v in ref.items()}), ml.CBackend(fallback=None))
    assert not pm.program.fallback
    got = {k: np.asarray(v) for k, v in pm.evaluate(None, g.feeds).items()}
    return g, pm, ref, got


def _tol(dtype):
    return dict(rtol=2e-5, atol=2e-5) if np.dtype(dtype) == np.float32 else dict(rtol=1e-11, atol=1e-11)


def _assert_equal(run, op: str):
    """The C outputs of ``op``'s nodes have NumPy's dtype, shape and values (floats within a tolerance
    of their type; the tight ones within an ulp or two)."""
    g, _, ref, got = run
    names = [k for k in g.outs if k.split("_", 1)[-1].startswith(op) or k.startswith(op)]
    assert names
    for k in names:
        assert got[k].dtype == ref[k].dtype and got[k].shape == ref[k].shape, k
        if ref[k].dtype.kind != "f":
            np.testing.assert_array_equal(got[k], ref[k], err_msg=k)
        elif k in g.tight:
            ulp = np.finfo(ref[k].dtype).eps
            np.testing.assert_allclose(got[k], ref[k], rtol=2 * ulp, atol=8 * ulp, err_msg=k)
        else:
            np.testing.assert_allclose(got[k], ref[k], **_tol(ref[k].dtype), err_msg=k)


def test_einsum(run):
    """Transposes, sums, diagonals, inner and outer products, implicit outputs, ellipses that
    broadcast, three operands, a 0-d operand and the GEMM paths; integer types wrap as NumPy's."""
    _assert_equal(run, "einsum")
    assert "mt_einsum_gemm_f64" in run[1].program.source


def test_dft_and_stft(run):
    """DFT of complex signals of lengths that take each of pocketfft's passes (2, 3, 4, 5, 7, 8, 11,
    a generic prime and Bluestein's algorithm), forward and inverse, within an ulp or two of
    NumPy's; real signals one- and two-sided, irfft, dft_length padding and truncating (int32 and
    int64), the axis a constant, negative or given at run time; STFT with and without a window,
    complex, two-sided and with frame_length."""
    _assert_equal(run, "dft")
    _assert_equal(run, "stft")
    g, pm, _, got = run
    assert got["float32_dft_irfft_odd"].shape == (2, 7, 3, 1) and got["float64_stft_length"].shape == (2, 11, 8, 2)
    # the axis given at run time is read there: another one that gives the same shapes is obeyed
    other = pm.evaluate(None, dict(g.feeds, axis_in=np.array(2, np.int64)))
    for t in FLOATS:
        want = np.fft.fft(g.feeds[f"{t}_r"][..., 0].astype(np.float64), axis=2)
        np.testing.assert_allclose(other[f"{t}_dft_runtime_axis"][..., 0], want.real, **_tol(t))


def test_col2im_deform_conv_roi_align(run):
    """Col2Im in 2-D (strides, pads, dilations) and 3-D, its shapes given at run time; DeformConv with
    groups, offset groups, stride, dilation, padding, a mask and a bias, offsets reaching outside
    the image; RoiAlign averaging and taking the maximum, half-pixel and not, an adaptive sampling
    grid, ROIs partly and wholly outside the map."""
    for op in ("col2im", "deform", "roi"):
        _assert_equal(run, op)
    assert run[3]["float64_col2im_3d"].shape == (1, 2, 3, 3, 4)


def test_non_max_suppression(run):
    """Two batches, three classes, corner and center boxes, a score threshold or none."""
    _assert_equal(run, "nms")
    assert len(run[3]["nms"]) > 6


@pytest.mark.parametrize("feed, value, message", [
    ("axis_in", np.array(3, np.int64), r"DFT#\d+.*axis and dft_length do not give the output shape"),
    ("blk", np.array([4, 1], np.int64), r"Col2Im#\d+.*image_shape and block_shape do not give the shapes"),
    ("bi", np.array([1, 0, 2, 0], np.int64), r"RoiAlign#\d+.*a batch index is outside \[0, 2\)"),
    ("thr", np.array([0.9], np.float32), r"node 'nms'.*the boxes select another count"),
])
def test_values_given_at_run_time_that_do_not_fit_stop_the_run(run, feed, value, message):
    g, pm, _, _ = run
    with pytest.raises(NodeError, match=message):
        pm.evaluate(None, dict(g.feeds, **{feed: value}))


def test_generated_source_compiles_without_warnings(run):
    cc = shutil.which("cc") or shutil.which("gcc")
    done = subprocess.run([cc, "-fsyntax-only", "-fopenmp", "-Wall", "-Wextra", "-Werror", f"-I{build.LIB_DIR}",
                           "-x", "c", "-"], input=run[1].program.source, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("node, feeds, reason", [
    (mk("DeformConv", ["x", "w", "off"], ["y"]),
     {"x": (1, 2, 5), "w": (2, 2, 3), "off": (1, 6, 3)}, r"1-D DeformConv \(C has 2-D\)"),
    (mk("Einsum", [f"v{i}" for i in range(9)], ["y"], equation=",".join("i" * 9)),
     {f"v{i}": (3,) for i in range(9)}, r"9 operands \(C takes 1 to 8\)"),
    (mk("RoiAlign", ["x", "rois", "bi"], ["y"], coordinate_transformation_mode="corners"),
     {"x": (1, 1, 4, 4), "rois": (1, 4), "bi": (1,)}, r"coordinate_transformation_mode 'corners'"),
])
def test_nodes_c_cannot_run_are_refused_with_the_reason(node, feeds, reason):
    feeds = {k: (np.zeros(s, np.int64) if k == "bi" else _rand(*s).astype(np.float32)) for k, s in feeds.items()}
    model = make_model([node], [(k, ELEM[v.dtype], list(v.shape)) for k, v in feeds.items()],
                       [("y", TensorProto.FLOAT, None)], opset=22)
    with pytest.raises(CKernelMissingError, match=f"{node.op_type}#0 .*{reason}"):
        _compile(model, ml.CBackend(fallback=None))


# Node-suite cases that pass strictly (CBackend(fallback=None)): the inverse DFT's expected values
# carry NumPy's float32 rounding; STFT's window; RoiAlign's max mode; NonMaxSuppression's count.
NODE_CASES = ["test_dft_inverse_opset19", "test_stft_with_window", "test_roialign_mode_max",
              "test_nonmaxsuppression_two_batches"]


def test_node_suite_cases_pass_strictly():
    results = {name: conformance.run_case(name, "c") for name in NODE_CASES}
    bad = {n: (r.status, r.reason[:200]) for n, r in results.items() if r.status != "pass"}
    assert not bad
