"""The lowering plan: what it binds, and that every consumer (emitter, interpreter, folding,
gradients, another renderer) reads it alone."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mithril as ml
from mithril.backends import kernels  # noqa: F401  (registers the shared kernels)
from mithril.backends.emit_python import emit_python
from mithril.backends.interpret import Interpreter, fold_constants
from mithril.backends.plan import Plan, PlanValue, build_plan
from mithril.backends.vjp import plan_gradients
from mithril.errors import UnsupportedAttributeError, UnsupportedOpsError


def _model(nodes, inputs, outputs, initializers=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return ml.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]))


def _conv_model():
    w = numpy_helper.from_array(np.ones((2, 1, 3, 3), np.float32), "w")
    return _model(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["r"]),
         helper.make_node("Add", ["r", "c"], ["y"], name="add")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w],
    )


def _specialized_plan(m) -> Plan:
    """The plan compile builds: of the specialized graph, where shape inference has run."""
    pm = ml.compile(m, ml.NumpyBackend(), inference=True)
    return build_plan(pm.ir.graph, m.opset_imports, "numpy", param_names=set(pm.parameter_keys))


def test_plan_binds_kernels_attributes_and_values_once():
    m = _conv_model()
    plan = _specialized_plan(m)
    conv, relu, add = plan.nodes
    assert [pn.label for pn in plan.nodes] == ["conv", "Relu#1", "add"]
    assert conv.spec.op_type == "Conv" and conv.spec.location.startswith("mithril/backends/")
    # Set attributes as Python values, the schema's defaults for the others.
    assert conv.kwargs["pads"] == (1, 1, 1, 1) and conv.kwargs["group"] == 1
    assert conv.kwargs["auto_pad"] == "NOTSET"
    assert "pads" in conv.attributes and "group" not in conv.attributes
    # Values carry what the graph knows of them.
    x, w = conv.inputs[0], conv.inputs[1]
    assert (x.kind, x.shape, x.dtype) == ("input", (1, 1, 4, 4), np.dtype(np.float32))
    assert w.kind == "param" and plan.params == [w]
    assert relu.outputs[0].dtype == np.dtype(np.float32)
    # Lifetimes: x dies after conv; c is read by relu and add, so it dies after add.
    assert conv.frees == (x,)
    c = conv.outputs[0]
    assert c not in relu.frees and set(add.frees) == {relu.outputs[0], c}


def test_plan_lists_every_missing_kernel_at_once():
    m = _model(
        [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("NoSuchOp", ["a"], ["b"], name="n1"),
         helper.make_node("NoSuchOp", ["b"], ["y"], name="n2")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    with pytest.raises(UnsupportedOpsError) as info:
        build_plan(m.ir.graph, m.opset_imports, "numpy")
    assert [label for label, _, _ in info.value.missing] == ["n1", "n2"]
    plan = build_plan(m.ir.graph, m.opset_imports, "numpy", strict=False)
    assert [pn.problem for pn in plan.nodes] == [None, "no kernel", "no kernel"]


def test_plan_refuses_an_attribute_the_kernel_does_not_implement():
    m = _model(
        [helper.make_node("Relu", ["x"], ["y"], name="r", not_an_attribute=3)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    with pytest.raises(UnsupportedAttributeError, match="not_an_attribute"):
        build_plan(m.ir.graph, m.opset_imports, "numpy")
    assert "not_an_attribute" in build_plan(m.ir.graph, m.opset_imports, "numpy", strict=False).nodes[0].problem


def test_subgraph_plans_know_the_outer_values_they_read():
    then_g = helper.make_graph([helper.make_node("Neg", ["a"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])])
    else_g = helper.make_graph([helper.make_node("Identity", ["a"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])])
    m = _model(
        [helper.make_node("Relu", ["x"], ["a"]),
         helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    plan = build_plan(m.ir.graph, m.opset_imports, "numpy")
    relu, if_node = plan.nodes
    a = relu.outputs[0]
    assert set(if_node.subgraphs) == {"then_branch", "else_branch"}
    assert if_node.subgraphs["then_branch"].outer == [a]
    # A value read only inside a subgraph lives until the node that holds the subgraph.
    assert a in if_node.frees
    assert [pn.index for pn in plan.all_nodes()] == [0, 1, 2, 3]
    x = np.array([-1.0, 2.0], np.float32)
    out = Interpreter(plan).run({}, {"x": x, "cond": np.array(True)})
    np.testing.assert_array_equal(out["y"], [-0.0, -2.0])


def test_the_emitter_and_the_interpreter_agree_on_one_plan():
    m = _conv_model()
    plan = build_plan(m.ir.graph, m.opset_imports, "numpy", param_names={"w"})
    program = emit_python(plan, namespace={"xp": np})
    x = np.random.default_rng(0).standard_normal((1, 1, 4, 4)).astype(np.float32)
    w = np.ones((2, 1, 3, 3), np.float32)
    got = program.forward({"w": w}, {"x": x})["y"]
    want = Interpreter(plan).run({"w": w}, {"x": x})["y"]
    np.testing.assert_array_equal(got, want)
    # The generated line names the kernel that runs and where it is defined.
    conv_line = next(line for line in program.source.splitlines() if "# Conv 'conv'" in line)
    assert plan.nodes[0].spec.location in conv_line


def test_constant_folding_runs_the_plan():
    shape = numpy_helper.from_array(np.array([2, 3], np.int64), "shape")
    m = _model(
        [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Mul", ["s", "shape"], ["s2"]),
         helper.make_node("Reshape", ["x", "s2"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [shape],
    )
    model = m.ir.clone()
    _, folded = fold_constants(model, {"shape"}, m.opset_imports)
    assert folded == 2  # Shape of a static shape, then Mul of two constants
    assert [n.op_type for n in model.graph] == ["Reshape"]
    s2 = model.graph.node(0).inputs[1]
    np.testing.assert_array_equal(s2.const_value.numpy(), [4, 9])


def test_the_gradient_program_is_a_plan_too():
    plan = _specialized_plan(_conv_model())
    gp = plan_gradients(plan, ["w"])
    assert [step.node.label for step in gp.rules] == ["add", "Relu#1", "conv"]
    conv_rule = gp.rules[-1]
    assert conv_rule.needs == (False, True) and conv_rule.kwargs["pads"] == (1, 1, 1, 1)
    # x is read by the conv rule, so the forward half keeps it.
    assert plan.nodes[0].inputs[0] not in gp.forward_frees[0]


def _render_pseudo_c(plan: Plan) -> str:
    """A renderer for another language sees the plan and nothing else."""
    names: dict[PlanValue, str] = {}

    def name(v: PlanValue) -> str:
        return names.setdefault(v, f"t{len(names)}")

    def decl(v: PlanValue) -> str:
        return f"{v.dtype}[{'x'.join(map(str, v.shape))}] {name(v)}"

    lines = [f"in {decl(v)};" for v in plan.inputs + plan.params]
    for pn in plan.nodes:
        args = ", ".join(name(v) for v in pn.inputs if v is not None)
        attrs = ", ".join(f"{k}={v}" for k, v in sorted(pn.kwargs.items()) if k in pn.attributes)
        lines.append(f"{decl(pn.outputs[0])} = {pn.op_type.lower()}({args}{'; ' + attrs if attrs else ''});")
        lines += [f"free({name(v)});" for v in pn.frees]
    return "\n".join(lines)


def test_a_renderer_needs_only_the_plan():
    plan = _specialized_plan(_conv_model())
    assert _render_pseudo_c(plan).splitlines() == [
        "in float32[1x1x4x4] t0;",
        "in float32[2x1x3x3] t1;",
        "float32[1x2x4x4] t2 = conv(t0, t1; pads=(1, 1, 1, 1));",
        "free(t0);",
        "float32[1x2x4x4] t3 = relu(t2);",
        "float32[1x2x4x4] t4 = add(t3, t2);",
        "free(t2);",
        "free(t3);",
    ]


def test_a_constant_without_a_value_is_named_when_read():
    import onnx_ir as ir

    from mithril.errors import MithrilError

    w = ir.Value(name="w", shape=ir.Shape([2]), type=ir.TensorType(ir.DataType.FLOAT))  # no const_value
    x = ir.Value(name="x", shape=ir.Shape([2]), type=ir.TensorType(ir.DataType.FLOAT))
    node = ir.node("Add", [x, w], num_outputs=1)
    node.outputs[0].name = "y"
    graph = ir.Graph([x], [node.outputs[0]], nodes=[node], initializers=[w], opset_imports={"": 17})
    plan = build_plan(graph, {"": 17}, "numpy")
    with pytest.raises(MithrilError, match="initializer 'w' has no value"):
        emit_python(plan, namespace={"xp": np})
