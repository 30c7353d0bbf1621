"""The C renderer's fusions (render.fuse): a Relu or a constant-bound Clip that is the only reader
of a Conv's output is folded into the Conv's kernel, which clamps before storing, and so is an Add
(a residual connection) whose other operand exists before the Conv runs; anything else reading
the Conv's output keeps the nodes apart. And the per-node profile a library built with
MITHRIL_C_PROFILE=1 keeps."""

from __future__ import annotations

import shutil
import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper

import mithril as ml
from mithril.backends.c.backend import CFallbackWarning
from mithril.errors import MithrilError
from tests.conftest import make_model

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no C compiler (cc or gcc) on PATH")

F = TensorProto.FLOAT


def _conv_model(after, extra_inputs=(), outputs=("y",), group=1):
    """x [1, 4, 9, 9] -> Conv (3x3, pad 1, bias, 4 -> 4 channels / group) -> ``after`` nodes."""
    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", F, [4, 4 // group, 3, 3], rng.standard_normal(4 * (4 // group) * 9).tolist())
    b = helper.make_tensor("b", F, [4], rng.standard_normal(4).tolist())
    nodes = [helper.make_node("Constant", [], ["W"], value=w), helper.make_node("Constant", [], ["B"], value=b),
             helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1], group=group), *after]
    return make_model(nodes, [("x", F, [1, 4, 9, 9]), *extra_inputs], [(o, F, None) for o in outputs], opset=17)


def _compare(model, feeds):
    """CBackend(fallback=None) against NumPy on ``model``; the C program."""
    pm = ml.compile(ml.load_onnx(model), ml.CBackend(fallback=None), inference=True)
    ref = ml.compile(ml.load_onnx(model), ml.NumpyBackend(), inference=True)
    got, want = pm.evaluate({}, feeds), ref.evaluate({}, feeds)
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5, err_msg=k)
    return pm.program


def _calls(program, kernel: str) -> int:
    return program.source.count(f"{kernel}_f32(")


X = {"x": (np.random.default_rng(1).standard_normal((1, 4, 9, 9)) * 3).astype(np.float32)}


@pytest.mark.parametrize("group", [1, 4])  # im2col + GEMM, and the depthwise kernel
def test_relu_after_conv_is_fused(group):
    program = _compare(_conv_model([helper.make_node("Relu", ["c"], ["y"])], group=group), X)
    assert _calls(program, "mt_relu") == 0
    assert "(float)0.0, (float)(INFINITY)" in program.source  # the bounds the Conv clamps to


def test_clip_with_constant_bounds_is_fused_and_keeps_its_bounds():
    lo = helper.make_tensor("lo", F, [], [0.0])
    hi = helper.make_tensor("hi", F, [], [6.0])
    after = [helper.make_node("Constant", [], ["lo"], value=lo), helper.make_node("Constant", [], ["hi"], value=hi),
             helper.make_node("Clip", ["c", "lo", "hi"], ["y"])]
    program = _compare(_conv_model(after), X)
    assert _calls(program, "mt_clip") == 0
    assert "(float)0.0, (float)6.0" in program.source


def test_clip_with_bounds_given_at_run_time_is_not_fused():
    after = [helper.make_node("Clip", ["c", "lo", "hi"], ["y"])]
    model = _conv_model(after, extra_inputs=[("lo", F, []), ("hi", F, [])])
    program = _compare(model, {**X, "lo": np.float32(-1.0), "hi": np.float32(2.0)})
    assert _calls(program, "mt_clip") == 1


def test_conv_output_read_twice_is_not_fused():
    after = [helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Add", ["c", "r"], ["y"])]
    program = _compare(_conv_model(after), X)
    assert _calls(program, "mt_relu") == 1


def test_conv_output_that_is_a_graph_output_is_not_fused():
    program = _compare(_conv_model([helper.make_node("Relu", ["c"], ["y"])], outputs=("c", "y")), X)
    assert _calls(program, "mt_relu") == 1


def test_profile_times_each_node(monkeypatch):
    model = _conv_model([helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Sigmoid", ["r"], ["y"])])
    plain = ml.compile(ml.load_onnx(model), ml.CBackend(fallback=None), inference=True)
    with pytest.raises(MithrilError, match="MITHRIL_C_PROFILE=1"):
        plain.program.profile()
    monkeypatch.setenv("MITHRIL_C_PROFILE", "1")
    pm = ml.compile(ml.load_onnx(model), ml.CBackend(fallback=None), inference=True)
    for _ in range(3):
        pm.evaluate({}, X)
    seconds = {pn.op_type: s for pn, s in pm.program.profile()}
    assert seconds["Conv"] > 0 and seconds["Sigmoid"] > 0
    assert seconds["Relu"] == 0  # fused into the Conv: timed there


# -- Conv + Add (the residual connection, render.fuse) ------------------------------------------

def _pointwise_model(before, after, x_shape, groups=1, out="y"):
    """x -> ``before`` nodes; x -> Conv (1x1, bias, C -> C channels in ``groups``) -> c; ``after``."""
    rng = np.random.default_rng(2)
    C = x_shape[1]
    weights = rng.standard_normal(C * C // groups) / C**0.5
    w = helper.make_tensor("w", F, [C, C // groups, 1, 1], weights.tolist())
    b = helper.make_tensor("b", F, [C], rng.standard_normal(C).tolist())
    constants = [helper.make_node("Constant", [], ["W"], value=w), helper.make_node("Constant", [], ["B"], value=b)]
    nodes = [*before, *constants, helper.make_node("Conv", ["x", "W", "B"], ["c"], group=groups), *after]
    return make_model(nodes, [("x", F, x_shape)], [(out, F, None)], opset=17)


def _adds(program) -> int:
    return program.source.count("mt_add_f32(")


@pytest.mark.parametrize("skip_first", [False, True])
def test_add_after_conv_is_fused_either_operand_order(skip_first):
    operands = ["s", "c"] if skip_first else ["c", "s"]
    after = [helper.make_node("Add", operands, ["y"])]
    model = _conv_model(after, extra_inputs=[("s", F, [1, 4, 9, 9])])
    program = _compare(model, {**X, "s": np.random.default_rng(3).standard_normal((1, 4, 9, 9)).astype(np.float32)})
    assert _adds(program) == 0
    assert "mt_conv_f32(" in program.source


def test_add_then_relu_after_conv_are_both_fused():
    """ResNet's basic block ends in Conv, Add (the identity) and Relu: one kernel call."""
    after = [helper.make_node("Add", ["c", "s"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    model = _conv_model(after, extra_inputs=[("s", F, [1, 4, 9, 9])])
    program = _compare(model, {**X, "s": np.random.default_rng(3).standard_normal((1, 4, 9, 9)).astype(np.float32)})
    assert _adds(program) == 0 and _calls(program, "mt_relu") == 0


@pytest.mark.parametrize("groups", [1, 2])
def test_fused_residual_from_the_arena_survives_a_deep_product(groups):
    """The residual is an intermediate (in the arena, alive while the Conv writes its output) and
    the product is deeper than one K block (the output is written before the epilogue adds the
    residual); two images and two groups offset the residual like the output."""
    before = [helper.make_node("Sigmoid", ["x"], ["s"])]
    model = _pointwise_model(before, [helper.make_node("Add", ["c", "s"], ["y"])], [2, 320, 5, 7], groups=groups)
    x = np.random.default_rng(4).standard_normal((2, 320, 5, 7)).astype(np.float32)
    program = _compare(model, {"x": x})
    assert _adds(program) == 0


def test_residual_computed_after_the_conv_is_not_fused():
    """The Add's other operand comes from a node after the Conv: the Conv cannot read it yet."""
    after = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Add", ["c", "s"], ["y"])]
    program = _compare(_pointwise_model([], after, [1, 8, 6, 6]), {"x": X["x"][:, :, :6, :6].repeat(2, axis=1)})
    assert _adds(program) == 1


def test_residual_from_a_multi_output_node_after_the_conv_is_not_fused():
    """The same with the operand one of a Split's outputs (a node with several outputs)."""
    after = [helper.make_node("Concat", ["x", "x"], ["xx"], axis=1),
             helper.make_node("Split", ["xx"], ["s", "t"], axis=1, num_outputs=2),
             helper.make_node("Add", ["c", "s"], ["y"])]
    program = _compare(_pointwise_model([], after, [1, 8, 6, 6]), {"x": X["x"][:, :, :6, :6].repeat(2, axis=1)})
    assert _adds(program) == 1


def test_add_after_relu_or_depthwise_conv_or_with_broadcast_is_not_fused():
    s = {"s": np.random.default_rng(3).standard_normal((1, 4, 9, 9)).astype(np.float32)}
    # the clamp comes before the Add: the epilogue adds first, so the Relu is fused and the Add is not
    relu_then_add = [helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Add", ["r", "s"], ["y"])]
    program = _compare(_conv_model(relu_then_add, extra_inputs=[("s", F, [1, 4, 9, 9])]), {**X, **s})
    assert _adds(program) == 1 and _calls(program, "mt_relu") == 0
    # the depthwise kernel has no residual epilogue
    program = _compare(_conv_model([helper.make_node("Add", ["c", "s"], ["y"])], extra_inputs=[("s", F, [1, 4, 9, 9])],
                                   group=4), {**X, **s})
    assert _adds(program) == 1
    # a broadcast operand is not shaped like the output
    program = _compare(_conv_model([helper.make_node("Add", ["c", "s"], ["y"])], extra_inputs=[("s", F, [1, 4, 1, 1])]),
                       {**X, "s": s["s"][:, :, :1, :1]})
    assert _adds(program) == 1


# -- a weight's Transpose read by MatMuls: folded into them -------------------------------------------


def _tied_model(also_output: bool = False):
    """GPT-2's tied embedding as exporters write it: ``wte`` [V, H] is both the Gather's table and,
    through ``Transpose``, the second operand of the LM head's MatMul (two MatMuls here, one with a
    bias through the fused MatMulAdd)."""
    rng = np.random.default_rng(4)
    V, H = 37, 12
    inits = {"wte": rng.standard_normal((V, H)).astype(np.float32), "bias": rng.standard_normal(V).astype(np.float32)}
    nodes = [helper.make_node("Gather", ["wte", "ids"], ["h"]),
             helper.make_node("Transpose", ["wte"], ["wt"], perm=[1, 0]),
             helper.make_node("MatMul", ["h", "wt"], ["logits"]),
             helper.make_node("MatMul", ["h", "wt"], ["m"]), helper.make_node("Add", ["m", "bias"], ["biased"])]
    outputs = [("logits", F, None), ("biased", F, None)] + ([("wt", F, None)] if also_output else [])
    return make_model(nodes, [("ids", TensorProto.INT64, [2, 5])], outputs, inits, opset=17), inits


def _transposes(program) -> int:
    return sum(pn.op_type == "Transpose" for step in program.steps for pn in getattr(step, "nodes", [step]))


IDS = {"ids": np.array([[0, 3, 36, 7, 7], [1, 2, 30, 11, 5]], np.int64)}


def test_weight_transpose_read_by_matmuls_is_folded_into_them():
    """No transposed copy of the weight on each call: the GEMM reads the [V, H] rows with strides."""
    model, inits = _tied_model()
    program = _compare(model, IDS)
    assert _transposes(program) == 0
    assert sum(pn.kwargs.get("_c_b_transposed", False) for step in program.steps for pn in step.nodes) == 2


def test_folded_weight_follows_the_parameter_given_at_evaluate():
    """The weight stays a parameter: a new value given at evaluate is the one multiplied by."""
    model, inits = _tied_model()
    pm = ml.compile(ml.load_onnx(model), ml.CBackend(fallback=None), inference=True)
    ref = ml.compile(ml.load_onnx(model), ml.NumpyBackend(), inference=True)
    params = {**pm.get_parameters(), "wte": (inits["wte"] * -2 + 1).astype(np.float32)}
    got, want = pm.evaluate(params, IDS), ref.evaluate(params, IDS)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5, err_msg=k)


def test_weight_transpose_also_read_as_an_output_stays():
    model, _ = _tied_model(also_output=True)
    assert _transposes(_compare(model, IDS)) == 1


def test_gradients_through_a_folded_weight_transpose_equal_numpy():
    """Training compiles the backward from the plan as written: the fold is the forward's alone."""
    model, _ = _tied_model()
    m = ml.load_onnx(model)
    ref = ml.compile(m, ml.NumpyBackend(), data_keys={"ids"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CFallbackWarning)  # Gather's backward (the embedding) runs on NumPy
        pm = ml.compile(m, ml.CBackend(), data_keys={"ids"})
    assert not any(pn.op_type == "Transpose" for step in pm.program.steps for pn in getattr(step, "nodes", [step]))
    rng = np.random.default_rng(5)
    cot = {k: rng.standard_normal((2, 5, 37)).astype(np.float32) for k in ("logits", "biased")}
    params = ref.get_parameters()
    want_out, want = ref.evaluate(params, IDS, output_gradients=cot)
    got_out, got = pm.evaluate(params, IDS, output_gradients=cot)
    assert want.keys() == got.keys() and "wte" in got
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-4, err_msg=k)
    for k in want_out:
        np.testing.assert_allclose(got_out[k], want_out[k], rtol=1e-5, atol=1e-5, err_msg=k)
