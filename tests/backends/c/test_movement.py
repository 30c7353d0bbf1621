"""The C backend's data-movement kernels (issue 18, lib/mt_movement*.h): every op strictly in C
(``fallback=None``) equal to NumPy for every element type, run-time Slice/Pad arguments, checked
indices (an out-of-range Gather is a NodeError naming the node, never a crash), and a fixed list
of ONNX node-suite cases that must pass strictly."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from onnx import TensorProto, helper

import mithril as ml
from tests.conftest import make_model
from mithril.errors import NodeError

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no C compiler (cc or gcc) on PATH")



def _run_both(model, feeds):
    """Outputs of ``model`` on CBackend(fallback=None) and on NumPy."""
    loaded = ml.load_onnx(model)
    pm = ml.compile(loaded, ml.CBackend(fallback=None))
    assert not pm.program.fallback
    ref = ml.compile(ml.load_onnx(model), ml.NumpyBackend())
    return pm.evaluate(None, feeds), ref.evaluate(None, feeds)


def _i64(name, values):
    return helper.make_tensor(name, TensorProto.INT64, [len(values)], values)


ONNX_TYPE = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE, np.int64: TensorProto.INT64,
             np.int32: TensorProto.INT32, np.int8: TensorProto.INT8, np.uint8: TensorProto.UINT8,
             np.uint16: TensorProto.UINT16, np.bool_: TensorProto.BOOL}


def _movement_graph(dt):
    """One graph with every movement op on a (2, 3, 4) input of element type ``dt``."""
    t = ONNX_TYPE[dt]
    consts = {
        "perm_shape": np.array([4, 6], np.int64), "sl_s": np.array([-1, 0], np.int64),
        "sl_e": np.array([-10, 10], np.int64), "sl_a": np.array([2, 1], np.int64),
        "sl_st": np.array([-2, 2], np.int64), "gi": np.array([[2, -1], [0, -3]], np.int64),
        "ge": np.array([[[1, 0, 2, 1]] * 3] * 2, np.int32), "gnd": np.array([[1, 2], [0, -1]], np.int64),
        "ex": np.array([2, 2, 3, 4], np.int64), "rep": np.array([1, 2, 1], np.int64),
        "pads": np.array([0, 2, 1, 0, 3, 1], np.int64), "split": np.array([1, 3], np.int64),
        "ax0": np.array([0], np.int64), "seql": np.array([3, 1], np.int64),
        "sci": np.array([[[2, 0, 1, 1]]], np.int64), "sndi": np.array([[1, 0], [0, 2]], np.int64),
        "oh": np.array([[1, 0, -1]], np.int64), "k1": np.array(1, np.int64),
        "shape4": np.array([1, 8, 1, 3], np.int64), "depth": np.array(4, np.int64),
    }
    nodes = [
        helper.make_node("Transpose", ["x"], ["tr"], perm=[2, 0, 1]),
        helper.make_node("Reshape", ["tr", "perm_shape"], ["rs"]),
        helper.make_node("Concat", ["x", "x"], ["cat"], axis=-2),
        helper.make_node("Slice", ["x", "sl_s", "sl_e", "sl_a", "sl_st"], ["sl"]),
        helper.make_node("Gather", ["x", "gi"], ["ga"], axis=1),
        helper.make_node("GatherElements", ["x", "ge"], ["gel"], axis=2),
        helper.make_node("GatherND", ["x", "gnd"], ["gnd_y"], batch_dims=0),
        helper.make_node("Unsqueeze", ["x", "ax0"], ["us"]),
        helper.make_node("Expand", ["us", "ex"], ["exp"]),
        helper.make_node("Tile", ["x", "rep"], ["til"]),
        helper.make_node("Pad", ["x", "pads"], ["pr"], mode="reflect"),
        helper.make_node("Pad", ["x", "pads"], ["pe"], mode="edge"),
        helper.make_node("Pad", ["x", "pads"], ["pw"], mode="wrap"),
        helper.make_node("Split", ["x", "split"], ["sp0", "sp1"], axis=2),
        helper.make_node("Flatten", ["x"], ["fl"], axis=2),
        helper.make_node("Squeeze", ["us", "ax0"], ["sq"]),
        helper.make_node("ReverseSequence", ["x", "seql"], ["rev"], batch_axis=0, time_axis=1),
        helper.make_node("Trilu", ["x", "k1"], ["tri"], upper=0),
        helper.make_node("ScatterElements", ["x", "sci", "sci_u"], ["sce"], axis=1),
        helper.make_node("ScatterND", ["x", "sndi", "snd_u"], ["snd"]),
        helper.make_node("OneHot", ["oh", "depth", "ohv"], ["ohy"], axis=1),
        helper.make_node("Reshape", ["x", "shape4"], ["us4"]),
        helper.make_node("DepthToSpace", ["us4"], ["d2s"], blocksize=2, mode="CRD"),
        helper.make_node("SpaceToDepth", ["d2s"], ["s2d"], blocksize=2),
        helper.make_node("Identity", ["x"], ["idn"]),
    ]
    outs = ["rs", "cat", "sl", "ga", "gel", "gnd_y", "exp", "til", "pr", "pe", "pw", "sp0", "sp1", "fl", "sq", "rev",
            "tri", "sce", "snd", "ohy", "d2s", "s2d", "idn"]
    inputs = [("x", t, [2, 3, 4]), ("sci_u", t, [1, 1, 4]), ("snd_u", t, [2, 4]), ("ohv", t, [2])]
    # Output types and shapes come from shape inference.
    model = make_model(nodes, inputs, [(o, t, None) for o in outs], consts)
    rng = np.random.default_rng(0)

    def data(shape):
        if dt == np.bool_:
            return rng.random(shape) > 0.5
        if np.dtype(dt).kind == "f":
            return (rng.standard_normal(shape) * 50).astype(dt)
        return rng.integers(0, 100, shape).astype(dt)

    feeds = {"x": data((2, 3, 4)), "sci_u": data((1, 1, 4)), "snd_u": data((2, 4)),
             "ohv": np.array([0, 1], dt) if dt != np.bool_ else np.array([False, True])}
    return model, feeds, outs


@pytest.mark.parametrize("dt", [np.float32, np.float64, np.int64, np.int8, np.uint16, np.bool_],
                         ids=lambda d: np.dtype(d).name)
def test_every_movement_op_equals_numpy_for_each_element_type(dt):
    model, feeds, outs = _movement_graph(dt)
    got, want = _run_both(model, feeds)
    for o in outs:
        assert got[o].dtype == want[o].dtype == np.dtype(dt), o
        np.testing.assert_array_equal(got[o], want[o], err_msg=o)
    # Spot checks against NumPy itself, so a shared mistake cannot pass.
    x = feeds["x"]
    np.testing.assert_array_equal(got["sl"], x[:, 0:3:2, ::-2])
    np.testing.assert_array_equal(got["ga"], x[:, [[2, 2], [0, 0]]])
    np.testing.assert_array_equal(got["pr"], np.pad(x, [(0, 0), (2, 3), (1, 1)], mode="reflect"))
    np.testing.assert_array_equal(got["pw"], np.pad(x, [(0, 0), (2, 3), (1, 1)], mode="wrap"))
    np.testing.assert_array_equal(got["tri"], np.tril(x, 1))


def test_transpose_every_permutation_plain_and_tiled():
    """Permutations moving x's contiguous axis inward run in tiles (mt_strided_tiled); all equal NumPy."""
    import itertools

    shape, perms = (2, 9, 10, 11), list(itertools.permutations(range(4)))
    nodes = [helper.make_node("Transpose", ["x"], [f"y{k}"], perm=list(p)) for k, p in enumerate(perms)]
    outs = [(f"y{k}", TensorProto.INT16, [shape[d] for d in p]) for k, p in enumerate(perms)]
    pm = ml.compile(ml.load_onnx(make_model(nodes, [("x", TensorProto.INT16, list(shape))], outs)),
                    ml.CBackend(fallback=None))
    assert "mt_strided_tiled_i16(" in pm.program.source
    x = np.random.default_rng(0).integers(-1000, 1000, shape).astype(np.int16)
    got = pm.evaluate(None, {"x": x})
    for k, p in enumerate(perms):
        np.testing.assert_array_equal(got[f"y{k}"], x.transpose(p), err_msg=str(p))


def test_fills_range_eyelike_constant_pad_and_nonzero():
    nodes = [
        helper.make_node("Range", ["start", "limit", "delta"], ["r"]),
        helper.make_node("ConstantOfShape", ["shape"], ["cos"], value=helper.make_tensor("v", TensorProto.INT32,
                                                                                         [1], [7])),
        helper.make_node("EyeLike", ["m"], ["eye"], k=-1, dtype=TensorProto.DOUBLE),
        helper.make_node("Pad", ["m", "pads", "cval"], ["pc"], mode="constant"),
        helper.make_node("NonZero", ["m"], ["nz"], name="nonzero"),
    ]
    consts = {"start": np.array(10, np.int64), "limit": np.array(-3, np.int64), "delta": np.array(-4, np.int64),
              "shape": np.array([2, 3], np.int64), "pads": np.array([1, -1, 0, 2], np.int64),
              "cval": np.array(-5.0, np.float32)}
    model = make_model(nodes, [("m", TensorProto.FLOAT, [3, 4])],
                       [("r", TensorProto.INT64, None), ("cos", TensorProto.INT32, None),
                        ("eye", TensorProto.DOUBLE, None), ("pc", TensorProto.FLOAT, None),
                        ("nz", TensorProto.INT64, [2, 11])], consts)
    m = np.arange(12, dtype=np.float32).reshape(3, 4)
    got, _ = _run_both(model, {"m": m})
    np.testing.assert_array_equal(got["nz"], np.array(np.nonzero(m)))
    pm = ml.compile(ml.load_onnx(model), ml.CBackend(fallback=None))
    with pytest.raises(NodeError, match=r"nonzero.*another number of nonzero elements than the compiled 11"):
        pm.evaluate(None, {"m": np.ones((3, 4), np.float32)})
    np.testing.assert_array_equal(got["r"], np.arange(10, -3, -4))
    np.testing.assert_array_equal(got["cos"], np.full((2, 3), 7, np.int32))
    np.testing.assert_array_equal(got["eye"], np.eye(3, 4, k=-1))
    np.testing.assert_array_equal(got["pc"], np.pad(m[:, 1:], [(1, 0), (0, 2)], constant_values=-5))


def _runtime_slice_pad_model():
    nodes = [helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"], name="slice_rt"),
             helper.make_node("Pad", ["x", "pads"], ["p"], mode="edge", name="pad_rt"),
             helper.make_node("Compress", ["x", "cond"], ["cx"], axis=1, name="compress_rt")]
    ins = [("x", TensorProto.FLOAT, [4, 5]), ("starts", TensorProto.INT64, [2]), ("ends", TensorProto.INT64, [2]),
           ("axes", TensorProto.INT64, [2]), ("steps", TensorProto.INT64, [2]), ("pads", TensorProto.INT64, [4]),
           ("cond", TensorProto.BOOL, [4])]
    return make_model(nodes, ins, [("y", TensorProto.FLOAT, [2, 2]), ("p", TensorProto.FLOAT, [5, 8]),
                                   ("cx", TensorProto.FLOAT, [4, 3])])


def test_slice_pad_compress_arguments_given_at_run_time():
    model = _runtime_slice_pad_model()
    pm = ml.compile(ml.load_onnx(model), ml.CBackend(fallback=None))
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    feeds = {"x": x, "starts": np.array([-1, 100], np.int64), "ends": np.array([0, -100], np.int64),
             "axes": np.array([1, 0], np.int64), "steps": np.array([-2, -2], np.int64),
             "pads": np.array([1, 0, 0, 3], np.int64), "cond": np.array([True, False, True, True])}
    out = pm.evaluate(None, feeds)
    np.testing.assert_array_equal(out["cx"], x[:, [0, 2, 3]])
    np.testing.assert_array_equal(out["y"], x[3::-2, 4:0:-2])
    np.testing.assert_array_equal(out["p"], np.pad(x, [(1, 0), (0, 3)], mode="edge"))
    # Arguments that do not give the compiled output shape stop the node, naming it.
    with pytest.raises(NodeError, match=r"slice_rt.*steps do not give the output.s shape \(2, 2\)"):
        pm.evaluate(None, {**feeds, "steps": np.array([-1, -2], np.int64)})
    with pytest.raises(NodeError, match=r"pad_rt.*pads do not give the output's shape \(5, 8\)"):
        pm.evaluate(None, {**feeds, "pads": np.array([1, 1, 0, 3], np.int64)})
    with pytest.raises(NodeError, match=r"compress_rt.*the condition selects another count than the compiled 3"):
        pm.evaluate(None, {**feeds, "cond": np.array([True, False, False, True])})


@pytest.mark.parametrize("bad", [3, -4])
def test_gather_index_out_of_range_is_a_node_error(bad):
    model = make_model([helper.make_node("Gather", ["x", "i"], ["y"], axis=1, name="embed")],
                       [("x", TensorProto.FLOAT, [2, 3]), ("i", TensorProto.INT32, [2])],
                       [("y", TensorProto.FLOAT, [2, 2])])
    pm = ml.compile(ml.load_onnx(model), ml.CBackend(fallback=None))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(pm.evaluate(None, {"x": x, "i": np.array([2, -3], np.int32)})["y"], x[:, [2, 0]])
    with pytest.raises(NodeError, match=r"embed.*Gather.*an index is out of range"):
        pm.evaluate(None, {"x": x, "i": np.array([0, bad], np.int32)})


def test_run_time_shape_inputs_need_no_constant():
    """Reshape/Expand/Split read their shape from the static output, so a run-time shape input is fine."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Expand", ["b", "eshape"], ["e"])]
    model = make_model(nodes, [("x", TensorProto.INT64, [2, 6]), ("shape", TensorProto.INT64, [3]),
                               ("b", TensorProto.BOOL, [3, 1]), ("eshape", TensorProto.INT64, [2])],
                       [("r", TensorProto.INT64, [3, 2, 2]), ("e", TensorProto.BOOL, [3, 4])])
    pm = ml.compile(ml.load_onnx(model), ml.CBackend(fallback=None))
    x, b = np.arange(12).reshape(2, 6), np.array([[True], [False], [True]])
    out = pm.evaluate(None, {"x": x, "shape": np.array([3, 2, -1]), "b": b, "eshape": np.array([3, 4])})
    np.testing.assert_array_equal(out["r"], x.reshape(3, 2, 2))
    np.testing.assert_array_equal(out["e"], np.broadcast_to(b, (3, 4)))
    # A shape argument asking for another shape than the compiled one stops the node.
    feeds = {"x": x, "shape": np.array([3, 2, -1]), "b": b, "eshape": np.array([3, 4])}
    with pytest.raises(NodeError, match=r"Reshape.*asks for another shape than the compiled \(3, 2, 2\)"):
        pm.evaluate(None, {**feeds, "shape": np.array([2, 3, -1])})
    with pytest.raises(NodeError, match=r"Expand.*asks for another shape than the compiled \(3, 4\)"):
        pm.evaluate(None, {**feeds, "eshape": np.array([3, 5])})


def test_resize_nearest_on_ints_and_linear_on_float64():
    nodes = [helper.make_node("Resize", ["img", "", "scales"], ["near"], mode="nearest",
                              coordinate_transformation_mode="half_pixel", nearest_mode="round_prefer_ceil"),
             helper.make_node("Resize", ["xf", "", "", "sizes"], ["lin"], mode="linear",
                              coordinate_transformation_mode="align_corners")]
    consts = {"scales": np.array([1, 1, 2, 1.5], np.float32), "sizes": np.array([1, 1, 5, 7], np.int64)}
    model = make_model(nodes, [("img", TensorProto.UINT8, [1, 1, 3, 4]), ("xf", TensorProto.DOUBLE, [1, 1, 3, 4])],
                       [("near", TensorProto.UINT8, [1, 1, 6, 6]), ("lin", TensorProto.DOUBLE, [1, 1, 5, 7])], consts)
    rng = np.random.default_rng(3)
    img, xf = rng.integers(0, 255, (1, 1, 3, 4)).astype(np.uint8), rng.standard_normal((1, 1, 3, 4))
    got, want = _run_both(model, {"img": img, "xf": xf})
    np.testing.assert_array_equal(got["near"], want["near"])
    np.testing.assert_allclose(got["lin"], want["lin"], rtol=1e-12)
    # align_corners keeps the corners exactly
    np.testing.assert_allclose(got["lin"][0, 0, [0, -1]][:, [0, -1]], xf[0, 0, [0, -1]][:, [0, -1]], rtol=1e-12)


def test_affine_grid_then_grid_sample_equal_numpy():
    theta = np.array([[[0.9, -0.3, 0.1], [0.2, 1.1, -0.2]]], np.float32)
    nodes = [helper.make_node("AffineGrid", ["theta", "size"], ["grid"], align_corners=0),
             helper.make_node("GridSample", ["x", "grid"], ["y"], mode="cubic", padding_mode="reflection")]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [1, 2, 5, 6])],
                       [("grid", TensorProto.FLOAT, [1, 4, 7, 2]), ("y", TensorProto.FLOAT, [1, 2, 4, 7])],
                       {"theta": theta, "size": np.array([1, 2, 4, 7], np.int64)}, opset=20)
    x = np.random.default_rng(5).standard_normal((1, 2, 5, 6)).astype(np.float32)
    got, want = _run_both(model, {"x": x})
    np.testing.assert_allclose(got["grid"], want["grid"], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-6)


# Node-suite cases these kernels must pass strictly (CBackend(fallback=None)), one per op and mode.
NODE_CASES = [
    "test_reshape_negative_extended_dims", "test_unsqueeze_unsorted_axes", "test_gather_2d_indices",
    "test_gather_elements_negative_indices", "test_gathernd_example_int32_batch_dim1",
    "test_scatter_elements_with_reduction_max", "test_scatternd_multiply", "test_slice_neg_steps",
    "test_slice_end_out_of_bounds", "test_split_variable_parts_2d_opset18", "test_constant_pad_negative_axes",
    "test_reflect_pad", "test_expand_dim_changed", "test_tile_precomputed", "test_depthtospace_crd_mode_example",
    "test_spacetodepth_crd_mode_example", "test_tril_neg", "test_eyelike_populate_off_main_diagonal",
    "test_onehot_with_axis", "test_reversesequence_batch", "test_range_int32_type_negative_delta",
    "test_center_crop_pad_crop_and_pad", "test_resize_downsample_scales_cubic_antialias",
    "test_resize_tf_crop_and_resize_extrapolation_value", "test_resize_upsample_sizes_nearest_not_larger",
    "test_upsample_nearest", "test_compress_negative_axis", "test_nonzero_example", "test_bitcast_bool_to_uint8",
    "test_gridsample_reflection_padding",
]


def test_node_suite_movement_cases_pass_strictly():
    from mithril import conformance

    results = {n: conformance.run_case(n, "c") for n in NODE_CASES}
    bad = {n: f"{r.status}: {r.reason}" for n, r in results.items() if r.status != "pass"}
    assert not bad
