"""Each graph pass on onnx_ir's contract: a graph it must change (the change is there and
``modified`` is True) and one it must leave alone (``modified`` is False, the model is the same)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_ir.passes import InPlacePass

from mithril.backends.specialize import FoldConstants, InferShapes, run_pass, specialize
from mithril.errors import MithrilError, PassError, ShapeError
from mithril.onnx_bridge.passes import (
    STOP_GRADIENT_MARK,
    FuseMatMulBias,
    InlineConstantIfs,
    InlineFunctions,
    MarkStopGradients,
    ReducePowers,
    RelaxUnknownDims,
    RemoveDeadNodes,
    RemoveIdentities,
    SetInputShapes,
    Toposort,
)

F32 = TensorProto.FLOAT
OPSETS = {"": 17}


def vi(name, shape, elem=F32):
    return helper.make_tensor_value_info(name, elem, shape)


def const(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def make(nodes, inputs, outputs, initializers=(), functions=(), opsets=(("", 17),)) -> ir.Model:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets], ir_version=10,
                              functions=list(functions))
    return ir.serde.deserialize_model(proto)


def ops(model: ir.Model) -> list[str]:
    return [n.op_type for n in model.graph]


def snapshot(model: ir.Model) -> onnx.ModelProto:
    return ir.serde.serialize_model(model)


def assert_untouched(pass_: InPlacePass, model: ir.Model) -> None:
    before = snapshot(model)
    result = pass_(model)
    assert result.model is model
    assert result.modified is False
    assert snapshot(model) == before


def constants(model: ir.Model) -> set[str]:
    return {n for n, v in model.graph.initializers.items() if v.const_value is not None}


# -- RelaxUnknownDims ---------------------------------------------------------------------------
def test_relax_unknown_dims_frees_dims_written_as_minus_one():
    model = make([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [-1, 3])], [vi("y", [0, 3])])
    result = RelaxUnknownDims()(model)
    assert result.modified is True
    assert not isinstance(model.graph.inputs[0].shape[0], int) and model.graph.inputs[0].shape[1] == 3
    assert model.graph.outputs[0].shape[1] == 3 and not isinstance(model.graph.outputs[0].shape[0], int)


def test_relax_unknown_dims_leaves_symbolic_and_fixed_dims():
    assert_untouched(RelaxUnknownDims(), make([helper.make_node("Relu", ["x"], ["y"])],
                                              [vi("x", ["N", 3])], [vi("y", ["N", 3])]))


# -- InlineFunctions ----------------------------------------------------------------------------
def test_inline_functions_expands_local_functions():
    swish = helper.make_function("local", "Swish", ["a"], ["o"],
                                 [helper.make_node("Sigmoid", ["a"], ["s"]), helper.make_node("Mul", ["a", "s"], ["o"])],
                                 [helper.make_opsetid("", 17)])
    model = make([helper.make_node("Swish", ["x"], ["y"], domain="local")], [vi("x", [2])], [vi("y", [2])],
                 functions=[swish], opsets=(("", 17), ("local", 1)))
    result = InlineFunctions()(model)
    assert result.modified is True
    assert ops(model) == ["Sigmoid", "Mul"] and not model.functions


def test_inline_functions_without_functions():
    assert_untouched(InlineFunctions(), make([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [2])], [vi("y", [2])]))


# -- SetInputShapes -----------------------------------------------------------------------------
def test_set_input_shapes_fixes_symbolic_dims():
    model = make([helper.make_node("Relu", ["x"], ["y"])], [vi("x", ["N", 3])], [vi("y", ["N", 3])])
    result = SetInputShapes({"x": [2, 3]})(model)
    assert result.modified is True
    assert tuple(model.graph.inputs[0].shape) == (2, 3)


def test_set_input_shapes_with_the_declared_shape_or_none():
    def relu():
        return make([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [2, 3])], [vi("y", [2, 3])])

    assert_untouched(SetInputShapes({"x": [2, 3]}), relu())
    assert_untouched(SetInputShapes(None), relu())
    with pytest.raises(ShapeError, match="dim 1 is fixed to 3"):
        SetInputShapes({"x": [2, 4]})(relu())
    # A symbolic name is no size: the message says how to keep the model's own dim.
    with pytest.raises(ShapeError, match=r"shapes\['x'\] must be a sequence of ints, got \('N', 3\)"):
        SetInputShapes({"x": ("N", 3)})(relu())


# -- InferShapes --------------------------------------------------------------------------------
def test_infer_shapes_fills_unknown_shapes():
    model = make([helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Neg", ["h"], ["y"])],
                 [vi("x", [2, 3])], [vi("y", None)])
    result = InferShapes()(model)
    assert result.modified is True
    assert tuple(model.graph.outputs[0].shape) == (2, 3)
    assert tuple(model.graph.node(0).outputs[0].shape) == (2, 3)


def test_infer_shapes_on_a_fully_shaped_graph():
    model = make([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [2, 3])], [vi("y", [2, 3])])
    InferShapes()(model)  # intermediate value_info, if any, is settled by a first run
    assert_untouched(InferShapes(), model)


# -- FoldConstants ------------------------------------------------------------------------------
def test_fold_constants_evaluates_constant_nodes_and_static_shapes():
    model = make([helper.make_node("Neg", ["a"], ["n"]), helper.make_node("Shape", ["x"], ["s"]),
                  helper.make_node("Add", ["x", "n"], ["y"])],
                 [vi("x", [2, 3])], [vi("y", [2, 3]), vi("s", [2], TensorProto.INT64)], [const("a", [1.0, 2.0, 3.0])])
    names = constants(model)
    fold = FoldConstants(names, OPSETS)
    result = fold(model)
    assert result.modified is True and fold.count == 2
    assert ops(model) == ["Add"]
    np.testing.assert_array_equal(model.graph.initializers["n"].const_value.numpy(), [-1, -2, -3])
    np.testing.assert_array_equal(model.graph.initializers["s"].const_value.numpy(), [2, 3])
    assert {"n", "s"} <= names


def test_fold_constants_leaves_nodes_of_runtime_values():
    model = make([helper.make_node("Neg", ["x"], ["y"])], [vi("x", ["N", 3])], [vi("y", ["N", 3])])
    fold = FoldConstants(constants(model), OPSETS)
    assert_untouched(fold, model)
    assert fold.count == 0


def test_fold_constants_leaves_parameters():
    # An initializer that is no constant (a trainable weight) is not folded into its readers.
    model = make([helper.make_node("Neg", ["w"], ["y"])], [], [vi("y", [3])], [const("w", [1.0, 2.0, 3.0])])
    assert_untouched(FoldConstants(set(), OPSETS), model)


# -- InlineConstantIfs --------------------------------------------------------------------------
def _if_model(cond_is_constant: bool) -> ir.Model:
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [vi("t", [2])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [vi("e", [2])])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)
    if cond_is_constant:
        return make([node], [vi("x", [2])], [vi("y", [2])], [const("c", True, np.bool_)])
    return make([node], [vi("x", [2]), vi("c", [], TensorProto.BOOL)], [vi("y", [2])])


def test_inline_constant_ifs_takes_the_branch():
    model = _if_model(cond_is_constant=True)
    inline = InlineConstantIfs(constants(model))
    result = inline(model)
    assert result.modified is True and inline.count == 1
    assert ops(model) == ["Relu"]
    assert model.graph.outputs[0].name == "y" and model.graph.outputs[0].producer().op_type == "Relu"


def test_inline_constant_ifs_keeps_a_runtime_condition():
    model = _if_model(cond_is_constant=False)
    inline = InlineConstantIfs(constants(model))
    assert_untouched(inline, model)
    assert inline.count == 0


# -- ReducePowers -------------------------------------------------------------------------------
def test_reduce_powers_squares_by_multiplying():
    model = make([helper.make_node("Pow", ["x", "two"], ["y"])], [vi("x", [2, 3])], [vi("y", [2, 3])],
                 [const("two", 2.0)])
    result = ReducePowers(constants(model), OPSETS)(model)
    assert result.modified is True
    assert ops(model) == ["Mul"]
    assert [v.name for v in model.graph.node(0).inputs] == ["x", "x"]


def test_reduce_powers_leaves_other_exponents():
    model = make([helper.make_node("Pow", ["x", "p"], ["y"])], [vi("x", [2, 3])], [vi("y", [2, 3])],
                 [const("p", 1.7)])
    assert_untouched(ReducePowers(constants(model), OPSETS), model)


# -- FuseMatMulBias -----------------------------------------------------------------------------
def _linear(bias_shape) -> ir.Model:
    return make([helper.make_node("MatMul", ["x", "W"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["y"])],
                [vi("x", ["N", 4])], [vi("y", ["N", 3])],
                [const("W", np.ones((4, 3))), const("b", np.ones(bias_shape))])


def test_fuse_matmul_bias_makes_one_matmul_add():
    model = _linear([3])
    InferShapes()(model)
    result = FuseMatMulBias(constants(model), OPSETS)(model)
    assert result.modified is True
    assert [(n.domain, n.op_type) for n in model.graph] == [("ai.mithril", "MatMulAdd")]
    assert [v.name for v in model.graph.node(0).inputs] == ["x", "W", "b"]


def test_fuse_matmul_bias_leaves_a_bias_that_is_no_row():
    model = _linear([1, 3])  # broadcast over rows, not F.linear's bias
    InferShapes()(model)
    assert_untouched(FuseMatMulBias(constants(model), OPSETS), model)


# -- MarkStopGradients --------------------------------------------------------------------------
def _identity(marked: bool) -> ir.Model:
    node = helper.make_node("Identity", ["h"], ["y"])
    if marked:
        helper.set_metadata_props(node, {STOP_GRADIENT_MARK: "true"})
    return make([helper.make_node("Relu", ["x"], ["h"]), node], [vi("x", [2])], [vi("y", [2])])


def test_mark_stop_gradients_turns_marked_identities_into_stop_gradient():
    model = _identity(marked=True)
    result = MarkStopGradients()(model)
    assert result.modified is True
    assert [(n.domain, n.op_type) for n in model.graph] == [("", "Relu"), ("ai.mithril", "StopGradient")]
    assert model.graph.outputs[0].name == "y"


def test_mark_stop_gradients_leaves_plain_identities():
    assert_untouched(MarkStopGradients(), _identity(marked=False))


# -- RemoveIdentities ---------------------------------------------------------------------------
def test_remove_identities_forwards_the_input():
    model = _identity(marked=False)
    result = RemoveIdentities()(model)
    assert result.modified is True
    assert ops(model) == ["Relu"]
    assert model.graph.outputs[0].name == "y" and model.graph.outputs[0].producer().op_type == "Relu"


def test_remove_identities_keeps_an_identity_from_input_to_output():
    # The output is the input under another name: the IR needs the node for that.
    model = make([helper.make_node("Identity", ["x"], ["y"])], [vi("x", [2])], [vi("y", [2])])
    assert_untouched(RemoveIdentities(), model)


# -- RemoveDeadNodes ----------------------------------------------------------------------------
def test_remove_dead_nodes_drops_unread_nodes():
    model = make([helper.make_node("Neg", ["x"], ["dead"]), helper.make_node("Relu", ["x"], ["y"])],
                 [vi("x", [2])], [vi("y", [2])])
    result = RemoveDeadNodes()(model)
    assert result.modified is True
    assert ops(model) == ["Relu"]


def test_remove_dead_nodes_keeps_live_ones():
    model = make([helper.make_node("Neg", ["x"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                 [vi("x", [2])], [vi("y", [2])])
    assert_untouched(RemoveDeadNodes(), model)


# -- Toposort -----------------------------------------------------------------------------------
def test_toposort_orders_producers_first():
    x = ir.Value(name="x", shape=ir.Shape([2]), type=ir.TensorType(ir.DataType.FLOAT))
    relu = ir.node("Relu", [x], num_outputs=1)
    neg = ir.node("Neg", [relu.outputs[0]], num_outputs=1)
    neg.outputs[0].name = "y"
    model = ir.Model(ir.Graph([x], [neg.outputs[0]], nodes=[neg, relu], opset_imports={"": 17}), ir_version=10)
    result = Toposort()(model)
    assert result.modified is True
    assert ops(model) == ["Relu", "Neg"]


def test_toposort_keeps_a_sorted_graph():
    model = make([helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Neg", ["h"], ["y"])],
                 [vi("x", [2])], [vi("y", [2])])
    assert_untouched(Toposort(), model)


# -- the pipeline -------------------------------------------------------------------------------
def test_specialize_folds_shape_arithmetic_to_a_fixed_point():
    # Reshape(x, Concat(Shape(x)[0], [-1])): the shape folds only once x's shape is fixed, then the
    # If on a condition computed from it inlines, and the dead branch of the graph goes.
    then = helper.make_graph([helper.make_node("Relu", ["r"], ["t"])], "then", [], [vi("t", None)])
    other = helper.make_graph([helper.make_node("Neg", ["r"], ["e"])], "else", [], [vi("e", None)])
    model = make([
        helper.make_node("Shape", ["x"], ["s"], end=1),
        helper.make_node("Concat", ["s", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["r"]),
        helper.make_node("Size", ["x"], ["n"]),
        helper.make_node("Equal", ["n", "six"], ["c"]),
        helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
    ], [vi("x", ["N", 3, 1])], [vi("y", None)],
        [const("minus_one", [-1], np.int64), const("six", 6, np.int64)])
    specialize(model, {"x": [2, 3, 1]}, constants(model), OPSETS)
    assert ops(model) == ["Reshape", "Relu"]
    np.testing.assert_array_equal(model.graph.node(0).inputs[1].const_value.numpy(), [2, -1])
    assert tuple(model.graph.outputs[0].shape) == (2, 3)


def test_a_failing_pass_is_named():
    class Broken(InPlacePass):
        def call(self, model):
            raise ValueError("no good")

    class Refusing(InPlacePass):
        def call(self, model):
            raise ShapeError("a Mithril error passes unchanged")

    model = make([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [2])], [vi("y", [2])])
    with pytest.raises(PassError, match=r"pass Broken failed on this model: ValueError: no good"):
        run_pass(Broken(), model)
    with pytest.raises(ShapeError) as info:
        run_pass(Refusing(), model)
    assert type(info.value) is ShapeError and isinstance(info.value, MithrilError)
