"""GGMLBackend with bools and small integers inside ggml graphs (float32 0/1 and exact float32
values, converted back to the ONNX dtype at the graph's edge), and with inputs a ggml rule
reads when it builds the graph (a Reshape's shape, a ReduceSum's axes) given as data: the graph
is built at the first evaluate and rebuilt for other values."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("ggml")

import mithril as ml  # noqa: E402
from mithril.backends.ggml.program import GGMLKernelMissingError  # noqa: E402

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

NP = {TensorProto.FLOAT: np.float32, TensorProto.BOOL: np.bool_, TensorProto.INT8: np.int8,
      TensorProto.INT16: np.int16, TensorProto.UINT8: np.uint8, TensorProto.UINT16: np.uint16,
      TensorProto.INT64: np.int64}


def _model(nodes, inputs, outputs, opset=17):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _strict(model):
    return ml.compile(model, ml.GGMLBackend(fallback=None), inference=True)


EDGES = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3e38, -3e38, 2.5],
                 np.float32)


@pytest.mark.parametrize("op, fn", [("Greater", np.greater), ("Less", np.less), ("GreaterOrEqual", np.greater_equal),
                                    ("LessOrEqual", np.less_equal), ("Equal", np.equal)])
def test_comparisons_give_bools_equal_to_numpy_on_inf_nan_and_subnormals(op, fn):
    n = EDGES.size
    a = np.repeat(EDGES, n).reshape(n, n)
    b = np.tile(EDGES, n).reshape(n, n)
    model = _model([helper.make_node(op, ["a", "b"], ["y"])],
                   [("a", TensorProto.FLOAT, [n, n]), ("b", TensorProto.FLOAT, [n])], [("y", TensorProto.BOOL, [n, n])])
    y = _strict(model).evaluate({}, {"a": a, "b": EDGES})["y"]
    assert y.dtype == np.bool_
    np.testing.assert_array_equal(y, fn(a, b))


def test_isnan_isinf_and_cast_to_bool():
    n = EDGES.size
    nodes = [helper.make_node("IsNaN", ["x"], ["nan"]), helper.make_node("IsInf", ["x"], ["inf"]),
             helper.make_node("IsInf", ["x"], ["pos"], detect_negative=0),
             helper.make_node("IsInf", ["x"], ["neg"], detect_positive=0),
             helper.make_node("Cast", ["x"], ["nonzero"], to=TensorProto.BOOL)]
    outs = [(name, TensorProto.BOOL, [n]) for name in ("nan", "inf", "pos", "neg", "nonzero")]
    got = _strict(_model(nodes, [("x", TensorProto.FLOAT, [n])], outs)).evaluate({}, {"x": EDGES})
    np.testing.assert_array_equal(got["nan"], np.isnan(EDGES))
    np.testing.assert_array_equal(got["inf"], np.isinf(EDGES))
    np.testing.assert_array_equal(got["pos"], np.isposinf(EDGES))
    np.testing.assert_array_equal(got["neg"], np.isneginf(EDGES))
    np.testing.assert_array_equal(got["nonzero"], EDGES.astype(bool))
    assert all(v.dtype == np.bool_ for v in got.values())


def test_where_with_a_computed_condition_keeps_infinite_branches_not_taken_out():
    # Where(x > 0, x, -inf) and Where(mask, -inf, x): x * c + y * (1 - c) would give NaN.
    nodes = [helper.make_node("Greater", ["x", "zero"], ["c"]), helper.make_node("Where", ["c", "x", "fill"], ["y"]),
             helper.make_node("Where", ["mask", "fill", "x"], ["z"])]
    model = _model(nodes, [("x", TensorProto.FLOAT, [3, 4]), ("mask", TensorProto.BOOL, [4])],
                   [("y", TensorProto.FLOAT, [3, 4]), ("z", TensorProto.FLOAT, [3, 4])])
    model.graph.initializer.extend([onnx.numpy_helper.from_array(np.zeros(1, np.float32), "zero"),
                                    onnx.numpy_helper.from_array(np.array([-np.inf], np.float32), "fill")])
    x = np.array([[1, -2, np.inf, 0], [-np.inf, 3, -1, 5], [np.nan, 2, -3, 4]], np.float32)
    mask = np.array([True, False, False, True])
    got = ml.compile(model, ml.GGMLBackend(fallback=None), inference=True, constant_keys=["zero", "fill"]).evaluate(
        {}, {"x": x, "mask": mask})
    np.testing.assert_array_equal(got["y"], np.where(x > 0, x, -np.inf))
    np.testing.assert_array_equal(got["z"], np.where(mask, -np.inf, x))


@pytest.mark.parametrize("op, fn", [("And", np.logical_and), ("Or", np.logical_or), ("Xor", np.logical_xor)])
def test_logic_ops_broadcast_on_bools(op, fn):
    rng = np.random.default_rng(0)
    a, b = rng.random((2, 3, 4)) > 0.5, rng.random((4,)) > 0.5
    nodes = [helper.make_node(op, ["a", "b"], ["t"]), helper.make_node("Not", ["t"], ["y"])]
    model = _model(nodes, [("a", TensorProto.BOOL, [2, 3, 4]), ("b", TensorProto.BOOL, [4])],
                   [("y", TensorProto.BOOL, [2, 3, 4])])
    y = _strict(model).evaluate({}, {"a": a, "b": b})["y"]
    assert y.dtype == np.bool_
    np.testing.assert_array_equal(y, ~fn(a, b))


@pytest.mark.parametrize("dtype", [TensorProto.INT8, TensorProto.INT16, TensorProto.UINT8])
def test_small_integers_compare_pick_and_clip_exactly_and_keep_their_dtype(dtype):
    t = np.dtype(NP[dtype])
    info = np.iinfo(t)
    a = np.array([info.min, info.min + 1, -1 if info.min else 0, 0, 1, info.max - 1, info.max], t)
    b = a[::-1].copy()
    nodes = [helper.make_node("Max", ["a", "b"], ["hi"]), helper.make_node("Min", ["a", "b"], ["lo"]),
             helper.make_node("Less", ["a", "b"], ["less"]), helper.make_node("Equal", ["a", "b"], ["eq"]),
             helper.make_node("Clip", ["a", "cmin", "cmax"], ["clip"])]
    model = _model(nodes, [("a", dtype, [7]), ("b", dtype, [7])],
                   [("hi", dtype, [7]), ("lo", dtype, [7]), ("less", TensorProto.BOOL, [7]),
                    ("eq", TensorProto.BOOL, [7]), ("clip", dtype, [7])])
    cmin, cmax = np.array(info.min + 1, t), np.array(info.max - 1, t)
    model.graph.initializer.extend([onnx.numpy_helper.from_array(cmin, "cmin"),
                                    onnx.numpy_helper.from_array(cmax, "cmax")])
    got = _strict(model).evaluate({}, {"a": a, "b": b})
    np.testing.assert_array_equal(got["hi"], np.maximum(a, b))
    np.testing.assert_array_equal(got["lo"], np.minimum(a, b))
    np.testing.assert_array_equal(got["less"], a < b)
    np.testing.assert_array_equal(got["eq"], a == b)
    np.testing.assert_array_equal(got["clip"], np.clip(a, cmin, cmax))
    assert got["hi"].dtype == got["lo"].dtype == got["clip"].dtype == t


def test_integer_arithmetic_and_wide_integers_stay_out_of_ggml():
    # int8 sums wrap and int32 values past 2**24 are not exact in float32: both refused.
    add = _model([helper.make_node("Add", ["a", "b"], ["y"])],
                 [("a", TensorProto.INT8, [3]), ("b", TensorProto.INT8, [3])], [("y", TensorProto.INT8, [3])])
    with pytest.raises(GGMLKernelMissingError, match="Add#0"):
        _strict(add)
    eq = _model([helper.make_node("Equal", ["a", "b"], ["y"])],
                [("a", TensorProto.INT32, [3]), ("b", TensorProto.INT32, [3])], [("y", TensorProto.BOOL, [3])])
    with pytest.raises(GGMLKernelMissingError, match="dtype int32"):
        _strict(eq)


def test_reshape_shape_and_reduce_axes_given_as_data_build_the_graph_per_value():
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("ReduceSum", ["r", "axes"], ["y"], keepdims=0)]
    model = _model(nodes, [("x", TensorProto.FLOAT, [2, 3, 4]), ("shape", TensorProto.INT64, [2]),
                           ("axes", TensorProto.INT64, [1])], [("y", TensorProto.FLOAT, None)], opset=13)
    pm = ml.compile(model, ml.GGMLBackend(fallback=None), inference=True,
                    shapes={"x": [2, 3, 4], "shape": [2], "axes": [1]})
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    for shape, axis in [((6, 4), 1), ((6, 4), 0), ((4, -1), 1), ((6, 4), 1)]:
        got = pm.evaluate({}, {"x": x, "shape": np.array(shape, np.int64), "axes": np.array([axis], np.int64)})["y"]
        np.testing.assert_allclose(got, x.reshape(shape).sum(axis=axis), rtol=1e-6)
    assert len(pm.program._built) == 3  # one graph per distinct (shape, axes)
    assert pm.program.current.segments  # the built program ran in ggml


def test_a_node_refused_once_its_data_is_known_is_an_error_at_evaluate():
    # Slice's steps arrive as data; ggml here slices with step 1 only.
    node = helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"])
    model = _model([node], [("x", TensorProto.FLOAT, [8]), ("starts", TensorProto.INT64, [1]),
                            ("ends", TensorProto.INT64, [1]), ("axes", TensorProto.INT64, [1]),
                            ("steps", TensorProto.INT64, [1])], [("y", TensorProto.FLOAT, None)], opset=13)
    pm = ml.compile(model, ml.GGMLBackend(fallback=None), inference=True,
                    shapes={"x": [8], "starts": [1], "ends": [1], "axes": [1], "steps": [1]})
    x = np.arange(8, dtype=np.float32)
    data = {"x": x, "starts": np.array([1]), "ends": np.array([7]), "axes": np.array([0])}
    np.testing.assert_array_equal(pm.evaluate({}, {**data, "steps": np.array([1])})["y"], x[1:7])
    with pytest.raises(Exception, match="steps other than 1"):
        pm.evaluate({}, {**data, "steps": np.array([2])})


def test_omitted_optional_outputs_are_not_computed():
    rng = np.random.default_rng(1)
    w, r = rng.standard_normal((1, 12, 3), np.float32), rng.standard_normal((1, 12, 4), np.float32)
    node = helper.make_node("GRU", ["x", "w", "r"], ["", "h"], hidden_size=4)
    model = _model([node], [("x", TensorProto.FLOAT, [5, 2, 3])], [("h", TensorProto.FLOAT, [1, 2, 4])])
    model.graph.initializer.extend([onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(r, "r")])
    x = rng.standard_normal((5, 2, 3), np.float32)
    got = ml.compile(model, ml.GGMLBackend(fallback=None), inference=True).evaluate({}, {"x": x})["h"]
    want = ml.compile(model, ml.NumpyBackend(), inference=True).evaluate({}, {"x": x})["h"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("last", [0, 1])
def test_argmax_argmin_pick_the_first_or_last_tie_as_int64(op, last):
    x = np.array([[[1, 3, 3, 0], [-np.inf, -np.inf, -np.inf, -np.inf], [2, 2, 2, 5]],
                  [[0, 0, 0, 0], [4, -1, 4, -1], [np.inf, 1, np.inf, 0]]], np.float32)
    nodes = [helper.make_node(op, ["x"], ["y"], axis=axis, keepdims=keep, select_last_index=last)
             for axis, keep in [(2, 1)]] + [helper.make_node(op, ["x"], ["z"], axis=1, keepdims=0,
                                                              select_last_index=last)]
    model = _model(nodes, [("x", TensorProto.FLOAT, [2, 3, 4])],
                   [("y", TensorProto.INT64, [2, 3, 1]), ("z", TensorProto.INT64, [2, 4])], opset=13)
    got = _strict(model).evaluate({}, {"x": x})
    want = ml.compile(model, ml.NumpyBackend(), inference=True).evaluate({}, {"x": x})
    for k in ("y", "z"):
        assert got[k].dtype == np.int64
        np.testing.assert_array_equal(got[k], want[k])


def test_pad_expand_tile_shrink_and_dropout_mask():
    x = np.array([[1.0, -np.inf], [np.inf, 0.25], [-3.0, 2.0]], np.float32)
    nodes = [helper.make_node("Pad", ["x", "pads", "value"], ["pad"]),
             helper.make_node("Expand", ["x", "shape"], ["expand"]),
             helper.make_node("Tile", ["x", "repeats"], ["tile"]),
             helper.make_node("Shrink", ["x"], ["shrink"], lambd=1.5, bias=0.5),
             helper.make_node("Dropout", ["x"], ["drop", "mask"])]
    model = _model(nodes, [("x", TensorProto.FLOAT, [3, 2]), ("pads", TensorProto.INT64, [4]),
                           ("value", TensorProto.FLOAT, []), ("shape", TensorProto.INT64, [3]),
                           ("repeats", TensorProto.INT64, [2])],
                   [("pad", TensorProto.FLOAT, None), ("expand", TensorProto.FLOAT, None),
                    ("tile", TensorProto.FLOAT, None), ("shrink", TensorProto.FLOAT, [3, 2]),
                    ("drop", TensorProto.FLOAT, [3, 2]), ("mask", TensorProto.BOOL, [3, 2])], opset=13)
    pm = ml.compile(model, ml.GGMLBackend(fallback=None), inference=True,
                    shapes={"x": [3, 2], "pads": [4], "value": [], "shape": [3], "repeats": [2]})
    data = {"x": x, "pads": np.array([1, 0, 0, 2]), "value": np.array(-np.inf, np.float32),
            "shape": np.array([2, 3, 2]), "repeats": np.array([2, 3])}
    got = pm.evaluate({}, data)
    np.testing.assert_array_equal(got["pad"], np.pad(x, [(1, 0), (0, 2)], constant_values=-np.inf))
    np.testing.assert_array_equal(got["expand"], np.broadcast_to(x, (2, 3, 2)))
    np.testing.assert_array_equal(got["tile"], np.tile(x, (2, 3)))
    np.testing.assert_array_equal(got["shrink"], np.where(x < -1.5, x + 0.5, np.where(x > 1.5, x - 0.5, 0)))
    np.testing.assert_array_equal(got["drop"], x)
    assert got["mask"].dtype == np.bool_ and got["mask"].all()


@pytest.mark.parametrize("attrs", [
    dict(mode="nearest", coordinate_transformation_mode="half_pixel", nearest_mode="round_prefer_ceil"),
    dict(mode="linear", coordinate_transformation_mode="align_corners"),
    dict(mode="cubic", coordinate_transformation_mode="half_pixel", exclude_outside=1, cubic_coeff_a=-0.5),
    dict(mode="linear", antialias=1),
    dict(mode="linear", coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=-7.0),
    dict(mode="nearest", coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=-7.0),
])
def test_resize_matches_the_numpy_kernel(attrs):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 5, 6)).astype(np.float32)
    roi = np.array([0, 0, -0.2, 0.1, 1, 1, 0.9, 1.3], np.float32)
    node = helper.make_node("Resize", ["x", "roi", "", "sizes"], ["y"], **attrs)
    model = _model([node], [("x", TensorProto.FLOAT, [2, 3, 5, 6]), ("roi", TensorProto.FLOAT, [8]),
                            ("sizes", TensorProto.INT64, [4])], [("y", TensorProto.FLOAT, None)], opset=19)
    data = {"x": x, "roi": roi, "sizes": np.array([2, 3, 4, 9])}
    shapes = {k: list(v.shape) for k, v in data.items()}
    got = ml.compile(model, ml.GGMLBackend(fallback=None), inference=True, shapes=shapes).evaluate({}, data)["y"]
    want = ml.compile(model, ml.NumpyBackend(), inference=True).evaluate({}, data)["y"]
    assert got.shape == want.shape == (2, 3, 4, 9)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_float16_and_bfloat16_casts_are_made_by_ggml():
    import ml_dtypes

    x = np.array([1.0, 1 + 2 ** -11, 65504.0, 1e5, -3.14159, np.inf, np.nan, 2 ** -20], np.float32)
    nodes = [helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
             helper.make_node("Cast", ["x"], ["b"], to=TensorProto.BFLOAT16),
             helper.make_node("Cast", ["h"], ["back"], to=TensorProto.FLOAT),
             helper.make_node("CastLike", ["hin", "x"], ["widened"])]
    model = _model(nodes, [("x", TensorProto.FLOAT, [8]), ("hin", TensorProto.FLOAT16, [8])],
                   [("h", TensorProto.FLOAT16, [8]), ("b", TensorProto.BFLOAT16, [8]),
                    ("back", TensorProto.FLOAT, [8]), ("widened", TensorProto.FLOAT, [8])])
    with np.errstate(over="ignore"):  # 1e5 is inf in float16
        hin = x.astype(np.float16)
    got = _strict(model).evaluate({}, {"x": x, "hin": hin})
    assert got["h"].dtype == np.float16 and got["b"].dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(got["h"], hin)  # round to nearest even, subnormals and overflow too
    np.testing.assert_array_equal(got["b"].astype(np.float32), x.astype(ml_dtypes.bfloat16).astype(np.float32))
    np.testing.assert_array_equal(got["back"], hin.astype(np.float32))
    np.testing.assert_array_equal(got["widened"], hin.astype(np.float32))


@pytest.mark.parametrize("exponents", [[0.0, 1.0, 2.0, 3.0, -1.0, 0.5, 2.5, -3.0],
                                       list(np.linspace(-3, 3, 13)) + [5.0, 7.0, -2.5]])
def test_pow_with_exponents_given_as_data_matches_numpy(exponents):
    # Eight values or fewer: one power per value; more: exp(e * log|x|) with the odd powers' sign.
    x = np.array([-2.0, -0.5, 0.0, 0.5, 2.0, 3.0, np.inf, -np.inf, np.nan], np.float32)
    e = np.array(exponents, np.float32)
    xs, es = np.meshgrid(x, e)
    model = _model([helper.make_node("Pow", ["x", "e"], ["y"])],
                   [("x", TensorProto.FLOAT, list(xs.shape)), ("e", TensorProto.FLOAT, list(es.shape))],
                   [("y", TensorProto.FLOAT, list(xs.shape))])
    got = _strict(model).evaluate({}, {"x": xs.astype(np.float32), "e": es.astype(np.float32)})["y"]
    with np.errstate(all="ignore"):
        want = np.power(xs, es)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=0)


def test_clip_leaves_its_input_as_it_was():
    # ggml_clamp writes into its operand: the rule clamps a copy (the caller's array and a second
    # reader of the same value see it unchanged).
    nodes = [helper.make_node("Clip", ["x", "lo", "hi"], ["y"]), helper.make_node("Relu", ["x"], ["z"])]
    model = _model(nodes, [("x", TensorProto.FLOAT, [5])],
                   [("y", TensorProto.FLOAT, [5]), ("z", TensorProto.FLOAT, [5])])
    model.graph.initializer.extend([onnx.numpy_helper.from_array(np.array(-1.0, np.float32), "lo"),
                                    onnx.numpy_helper.from_array(np.array(1.0, np.float32), "hi")])
    x = np.array([-3.0, -0.5, 0.0, 0.5, 3.0], np.float32)
    before = x.copy()
    got = ml.compile(model, ml.GGMLBackend(fallback=None), inference=True, constant_keys=["lo", "hi"]).evaluate(
        {}, {"x": x})
    np.testing.assert_array_equal(x, before)
    np.testing.assert_array_equal(got["y"], np.clip(before, -1, 1))
    np.testing.assert_array_equal(got["z"], np.maximum(before, 0))


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_matches_the_numpy_kernel(mode, padding, align):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    grid = rng.uniform(-1.6, 1.6, (2, 3, 6, 2)).astype(np.float32)
    grid[0, 0, :4] = [[-1, -1], [1, 1], [0.25, -0.2], [-0.6, 0.75]]  # corners and half-pixel ties
    node = helper.make_node("GridSample", ["x", "g"], ["y"], mode=mode, padding_mode=padding, align_corners=align)
    model = _model([node], [("x", TensorProto.FLOAT, [2, 3, 4, 5]), ("g", TensorProto.FLOAT, [2, 3, 6, 2])],
                   [("y", TensorProto.FLOAT, [2, 3, 3, 6])], opset=20)
    got = _strict(model).evaluate({}, {"x": x, "g": grid})["y"]
    want = ml.compile(model, ml.NumpyBackend(), inference=True).evaluate({}, {"x": x, "g": grid})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("block", [0, 2])
@pytest.mark.parametrize("qtype", [TensorProto.UINT8, TensorProto.INT8, TensorProto.INT16])
def test_quantize_dequantize_round_half_to_even_and_saturate_as_numpy(block, qtype):
    t = NP[qtype]
    x = np.array([[-300.0, -2.5, -1.5, -0.5, 0.5], [1.5, 2.5, 3.49, 1e6, -1e6], [0.0, 7.5, -7.5, 126.5, 127.5],
                  [250.5, 255.5, -128.5, 33.3, -1.0]], np.float32)
    scale = np.array([[1.0, 0.5, 2.0], [1.0, 1.0, 0.25], [0.5, 2.0, 1.0], [1.0, 3.0, 0.5]], np.float32)
    zp = np.array([[3, 0, 1], [0, 2, 0], [1, 1, 0], [0, 0, 5]], t)
    if not block:  # per axis 0
        scale, zp = scale[:, 0].copy(), zp[:, 0].copy()
    attrs = dict(axis=1, block_size=block) if block else dict(axis=0)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **attrs),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], **attrs),
             helper.make_node("Round", ["x"], ["r"])]
    model = _model(nodes, [("x", TensorProto.FLOAT, [4, 5]), ("s", TensorProto.FLOAT, list(scale.shape)),
                           ("z", qtype, list(zp.shape))],
                   [("q", qtype, [4, 5]), ("d", TensorProto.FLOAT, [4, 5]), ("r", TensorProto.FLOAT, [4, 5])],
                   opset=21)
    if block:  # a block of 2 over 5 columns is not whole: refused
        with pytest.raises(GGMLKernelMissingError, match="blocked"):
            _strict(model)
        return
    data = {"x": x, "s": scale, "z": zp}
    got = _strict(model).evaluate({}, data)
    want = ml.compile(model, ml.NumpyBackend(), inference=True).evaluate({}, data)
    assert got["q"].dtype == t
    for k in ("q", "d", "r"):
        np.testing.assert_array_equal(got[k], want[k])


def test_dynamic_quantize_linear_matches_numpy():
    x = np.array([[-3.3, 0.0, 2.5], [7.1, -0.2, 1.0]], np.float32)
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])
    model = _model([node], [("x", TensorProto.FLOAT, [2, 3])],
                   [("y", TensorProto.UINT8, [2, 3]), ("s", TensorProto.FLOAT, []), ("z", TensorProto.UINT8, [])])
    for data in (x, np.abs(x), -np.abs(x), np.zeros_like(x)):
        got = _strict(model).evaluate({}, {"x": data})
        want = ml.compile(model, ml.NumpyBackend(), inference=True).evaluate({}, {"x": data})
        for k in ("y", "s", "z"):
            assert got[k].dtype == want[k].dtype
            np.testing.assert_array_equal(got[k], want[k])


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample_legacy_matches_numpy(mode):
    x = np.random.default_rng(4).standard_normal((1, 2, 3, 4)).astype(np.float32)
    node = helper.make_node("Upsample", ["x", "scales"], ["y"], mode=mode)
    model = _model([node], [("x", TensorProto.FLOAT, [1, 2, 3, 4]), ("scales", TensorProto.FLOAT, [4])],
                   [("y", TensorProto.FLOAT, None)], opset=9)
    data = {"x": x, "scales": np.array([1, 1, 2, 1.5], np.float32)}
    got = ml.compile(model, ml.GGMLBackend(fallback=None), inference=True,
                     shapes={"x": [1, 2, 3, 4], "scales": [4]}).evaluate({}, data)["y"]
    want = ml.compile(model, ml.NumpyBackend(), inference=True).evaluate({}, data)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_constant_of_shape_and_eye_like_give_their_dtype():
    value = onnx.numpy_helper.from_array(np.array([7], np.int64), "value")
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["c"], value=value),
             helper.make_node("EyeLike", ["m"], ["e"], k=1)]
    model = _model(nodes, [("shape", TensorProto.INT64, [2]), ("m", TensorProto.INT32, [3, 4])],
                   [("c", TensorProto.INT64, None), ("e", TensorProto.INT32, [3, 4])])
    pm = ml.compile(model, ml.GGMLBackend(fallback=None), inference=True, shapes={"shape": [2], "m": [3, 4]})
    got = pm.evaluate({}, {"shape": np.array([2, 5]), "m": np.zeros((3, 4), np.int32)})
    assert got["c"].dtype == np.int64 and got["e"].dtype == np.int32
    np.testing.assert_array_equal(got["c"], np.full((2, 5), 7))
    np.testing.assert_array_equal(got["e"], np.eye(3, 4, k=1))


@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("axis", [0, 1])
def test_top_k_keeps_the_lower_index_first_on_ties(largest, axis):
    x = np.array([[3, 1, 3, 2, 1], [0, 0, 5, 5, -1], [2, 2, 2, 2, 2]], np.float32)
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=largest)
    model = _model([node], [("x", TensorProto.FLOAT, [3, 5]), ("k", TensorProto.INT64, [1])],
                   [("v", TensorProto.FLOAT, None), ("i", TensorProto.INT64, None)], opset=11)
    data = {"x": x, "k": np.array([2])}
    got = ml.compile(model, ml.GGMLBackend(fallback=None), inference=True, shapes={"x": [3, 5], "k": [1]}).evaluate(
        {}, data)
    want = ml.compile(model, ml.NumpyBackend(), inference=True).evaluate({}, data)
    assert got["i"].dtype == np.int64
    np.testing.assert_array_equal(got["v"], want["v"])
    np.testing.assert_array_equal(got["i"], want["i"])


def test_erf_is_within_a_few_ulps_of_scipy():
    from scipy.special import erf

    z = np.concatenate([np.linspace(-7, 7, 4001), [0.0, -0.0, 1e-30, 1e-8, 0.5, -0.5, np.inf, -np.inf, np.nan]])
    z = z.astype(np.float32)
    model = _model([helper.make_node("Erf", ["x"], ["y"])], [("x", TensorProto.FLOAT, [z.size])],
                   [("y", TensorProto.FLOAT, [z.size])])
    got = _strict(model).evaluate({}, {"x": z})["y"]
    np.testing.assert_allclose(got, erf(z.astype(np.float64)), rtol=2e-6, atol=1e-37)


@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")  # NumPy's own x % 0, the reference
@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("qtype", [TensorProto.INT8, TensorProto.INT16, TensorProto.UINT16])
def test_mod_of_small_integers_is_exact(fmod, qtype):
    t = np.dtype(NP[qtype])
    info = np.iinfo(t)
    rng = np.random.default_rng(5)
    a = rng.integers(info.min, info.max, 64, endpoint=True).astype(t)
    b = rng.integers(info.min, info.max, 64, endpoint=True).astype(t)
    b[:8] = [1, 0, 3, info.max, info.min or 2, 7, 0, 2]
    a[:8] = [info.max, 5, info.min, info.max - 1, info.max, 0, 0, info.min]
    model = _model([helper.make_node("Mod", ["a", "b"], ["y"], fmod=fmod)], [("a", qtype, [64]), ("b", qtype, [64])],
                   [("y", qtype, [64])], opset=13)
    got = _strict(model).evaluate({}, {"a": a, "b": b})["y"]
    want = ml.compile(model, ml.NumpyBackend(), inference=True).evaluate({}, {"a": a, "b": b})["y"]
    assert got.dtype == t
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements_wraps_negative_indices_and_refuses_out_of_range(axis):
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    idx = np.array([[[0, -1, 1], [1, 0, -2]], [[-1, 0, 0], [1, 1, 1]]], np.int64)  # (2, 2, 3)
    node = helper.make_node("GatherElements", ["x", "i"], ["y"], axis=axis)
    model = _model([node], [("x", TensorProto.FLOAT, [2, 3, 4]), ("i", TensorProto.INT64, [2, 2, 3])],
                   [("y", TensorProto.FLOAT, [2, 2, 3])], opset=13)
    pm = _strict(model)
    got = pm.evaluate({}, {"x": x, "i": idx})["y"]
    want = ml.compile(model, ml.NumpyBackend(), inference=True).evaluate({}, {"x": x, "i": idx})["y"]
    np.testing.assert_array_equal(got, want)
    with pytest.raises(Exception, match="out of range"):
        pm.evaluate({}, {"x": x, "i": np.full((2, 2, 3), 5, np.int64)})


@pytest.mark.parametrize("sizes, axes", [([5, 9, 3], None), ([4, 2], [0, -1]), ([11, 3], [1, 2])])
def test_center_crop_pad_matches_numpy(sizes, axes):
    x = np.arange(7 * 6 * 3, dtype=np.float32).reshape(7, 6, 3)
    node = helper.make_node("CenterCropPad", ["x", "s"], ["y"], **({} if axes is None else {"axes": axes}))
    model = _model([node], [("x", TensorProto.FLOAT, [7, 6, 3]), ("s", TensorProto.INT64, [len(sizes)])],
                   [("y", TensorProto.FLOAT, None)], opset=18)
    data = {"x": x, "s": np.array(sizes)}
    got = ml.compile(model, ml.GGMLBackend(fallback=None), inference=True,
                     shapes={"x": [7, 6, 3], "s": [len(sizes)]}).evaluate({}, data)["y"]
    want = ml.compile(model, ml.NumpyBackend(), inference=True).evaluate({}, data)["y"]
    np.testing.assert_array_equal(got, want)


def test_gelu_keeps_its_accuracy_in_the_negative_tail():
    """GELU (erf form) within 4e-7 of float64 on [-14, 10], and relative to its value where that is
    tiny: 0.5 x (1 + erff(x / sqrt 2)) rounds 1 + erf to 0 from about x = -5.5 down, so ggml's
    kernel computes Phi from erfc (scripts/patches/ggml-f32-elementwise.patch)."""
    from scipy.special import erfc

    x = np.concatenate([np.linspace(-14, 10, 24001), [0.0, -0.0, np.inf, np.nan]]).astype(np.float32)
    model = _model([helper.make_node("Gelu", ["x"], ["y"])], [("x", TensorProto.FLOAT, [x.size])],
                   [("y", TensorProto.FLOAT, [x.size])], opset=20)
    got = _strict(model).evaluate({}, {"x": x})["y"].astype(np.float64)
    xd = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        want = xd * 0.5 * erfc(-xd / np.sqrt(2))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=4e-7)
    tail = (xd < -6) & (np.abs(want) > 1e-30)
    assert tail.sum() > 1000 and np.all(np.abs(got[tail] - want[tail]) <= 2e-5 * np.abs(want[tail]))
