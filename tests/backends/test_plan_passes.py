"""Plan passes (mithril/backends/passes/) and the plan's use-def index (PlanIndex in
mithril/backends/plan.py): the index stays what a fresh one says after every rewrite, a
subgraph's read is a use nothing fuses away, each fusion pattern is found once on hand-made
graphs and not where it must not be, and the manager says whether anything changed."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

from mithril.backends import kernels  # noqa: F401  (registers the shared kernels)
from mithril.backends.c.render import fuse as c_fuse
from mithril.backends.c.ops import CLAMP, RESIDUAL
from mithril.backends.numpy.inplace import SWAPS, relu_into
from mithril.backends.passes import (
    ConvChain,
    FuseConvChains,
    FuseGelu,
    InPlaceActivations,
    PassManager,
    PlanPass,
    gelu_kernel_pass,
    match_gelu,
)
from mithril.backends.plan import OUTER, PlanIndex, build_plan
from mithril.backends.registry import REGISTRY

from tests.conftest import make_model

F = TensorProto.FLOAT
X = [1, 2, 4, 4]
GELU_SHAPE = [2, 8]
W = np.full((2, 2, 1, 1), 0.5, np.float32)


def _plan(nodes, inputs, outputs, initializers=()):
    """The plan (NumPy's kernels) of a hand-made graph, shapes inferred; initializers are constants."""
    model = onnx.shape_inference.infer_shapes(make_model(nodes, inputs, outputs, initializers))
    return build_plan(ir.serde.deserialize_model(model).graph, {"": 17}, "numpy")


def _snapshot(index: PlanIndex):
    """What an index says, comparable between two indexes of one plan."""
    values = {v for pn in index.plan.nodes for v in (*pn.inputs, *pn.outputs) if v is not None}
    values |= {v for pn in index.plan.nodes for sub in pn.subgraphs.values()
               for p in (sub if isinstance(sub, tuple) else (sub,)) for v in p.outer}
    return {v.id: (id(index.producer(v)), [(id(pn), pos) for pn, pos in index.uses(v)],
                   id(index.only_reader(v))) for v in values}


def _assert_fresh(plan):
    assert _snapshot(plan.index) == _snapshot(PlanIndex(plan))


def _if_reading(name, shape=X, out="z"):
    """An If node (result ``out``) whose branches read ``name`` from the enclosing graph."""
    result = helper.make_tensor_value_info("b", F, shape)
    then = helper.make_graph([helper.make_node("Identity", [name], ["b"])], "then", [], [result])
    other = helper.make_graph([helper.make_node("Neg", [name], ["b"])], "else", [], [result])
    return helper.make_node("If", ["cond"], [out], then_branch=then, else_branch=other)


def _conv_relu(extra=(), outputs=(("y", F, X),), inputs=()):
    return _plan([helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
                  helper.make_node("Relu", ["c"], ["y"], name="relu"), *extra],
                 [("x", F, X), *inputs], list(outputs), {"w": W})


# -- the index ----------------------------------------------------------------------------------

def test_index_knows_producers_and_uses_in_node_order():
    plan = _plan([helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
                  helper.make_node("Add", ["r", "c"], ["y"])], [("x", F, X)], [("y", F, X)], {"w": W})
    conv, relu, add = plan.nodes
    c = conv.outputs[0]
    index = plan.index
    assert index is plan.index  # built once
    assert index.producer(c) is conv and index.producer(conv.inputs[0]) is None
    assert index.uses(c) == [(relu, 0), (add, 1)] and index.users(c) == [relu, add]
    assert index.only_reader(c) is None  # read twice
    assert index.only_reader(relu.outputs[0]) is add
    assert index.only_reader(add.outputs[0]) is None  # a graph output


def test_a_subgraphs_read_is_a_use_that_is_never_fused_away():
    plan = _conv_relu(extra=[_if_reading("c")], outputs=[("y", F, X), ("z", F, X)],
                      inputs=[("cond", TensorProto.BOOL, [])])
    conv, relu, if_ = plan.nodes
    c = conv.outputs[0]
    # one use by each branch that reads it
    assert plan.index.uses(c) == [(relu, 0), (if_, OUTER), (if_, OUTER)] and plan.index.users(c) == [relu, if_]
    assert plan.index.only_reader(c) is None
    # Read by the subgraph alone: a use still, and no reader a fusion may take.
    alone = _plan([helper.make_node("Conv", ["x", "w"], ["c"]), _if_reading("c")],
                  [("x", F, X), ("cond", TensorProto.BOOL, [])], [("z", F, X)], {"w": W})
    assert alone.index.users(alone.nodes[0].outputs[0]) == [alone.nodes[1]]
    assert alone.index.only_reader(alone.nodes[0].outputs[0]) is None
    # So neither C's fusion nor the in-place activation takes the Relu.
    assert len(c_fuse(plan)[0]) == 3
    assert PassManager([InPlaceActivations(SWAPS)])(plan).changed is False


def test_index_stays_fresh_through_each_rewrite():
    plan = _plan([helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
                  helper.make_node("Neg", ["r"], ["n"]), helper.make_node("Abs", ["x"], ["a"]),
                  helper.make_node("Add", ["n", "a"], ["y"])], [("x", F, X)], [("y", F, X)], {"w": W})
    original = list(plan.nodes)
    work = replace(plan, nodes=list(plan.nodes), outputs=list(plan.outputs))
    index = work.index
    conv, relu, neg, abs_, add = work.nodes
    # replace: one node for another
    swapped = replace(relu, label="relu2")
    index.replace(relu, swapped)
    assert work.nodes[1] is swapped and index.origin(swapped) is relu
    _assert_fresh(work)
    # replace_nodes: a fusion, placed where the last node ran
    fused = replace(conv, outputs=swapped.outputs, label="conv+relu")
    index.replace_nodes([conv, swapped], fused, at=swapped)
    assert work.nodes == [fused, neg, abs_, add] and index.origin(fused) is relu
    assert index.producer(conv.outputs[0]) is None
    _assert_fresh(work)
    # redirect: the Add reads a instead of n; then the Neg is dead and goes
    index.redirect(neg.outputs[0], abs_.outputs[0])
    new_add = work.nodes[-1]
    assert new_add.inputs == (abs_.outputs[0], abs_.outputs[0]) and index.only_reader(neg.outputs[0]) is None
    _assert_fresh(work)
    index.remove([neg])
    assert neg not in index and len(work.nodes) == 3
    _assert_fresh(work)
    # insert: a node that reads the Abs's result, put before the Add and running for it
    copy = replace(abs_, inputs=abs_.outputs, outputs=(replace(abs_.outputs[0], id=-1, name="copy"),))
    index.insert(copy, before=new_add, origin=new_add)
    assert work.nodes[-2] is copy and index.origin(copy) is add and index.producer(copy.outputs[0]) is copy
    _assert_fresh(work)
    # the plan the copy was made of is untouched
    assert plan.nodes == original and plan.nodes[4].inputs[0] is neg.outputs[0]


def test_removing_a_node_whose_result_is_read_is_refused():
    plan = _conv_relu()
    with pytest.raises(ValueError, match="still read"):
        plan.index.remove([plan.nodes[0]])
    with pytest.raises(ValueError):
        plan.index.replace_nodes([plan.nodes[0]], plan.nodes[0], at=plan.nodes[1])


# -- the manager --------------------------------------------------------------------------------

class _Rename(PlanPass):
    name = "rename"

    def __init__(self, op_type):
        self.op_type = op_type

    def run(self, index):
        found = [pn for pn in index.plan.nodes if pn.op_type == self.op_type]
        for pn in found:
            index.replace(pn, replace(pn, label=pn.label + "!"))
        return bool(found)


def test_manager_reports_changed_and_unchanged():
    plan = _conv_relu()
    unchanged = PassManager([_Rename("Tanh")])(plan)
    assert unchanged.changed is False and unchanged.plan is plan and unchanged.changed_by == [("rename", False)]
    result = PassManager([_Rename("Tanh"), _Rename("Relu")])(plan)
    assert result.changed and result.changed_by == [("rename", False), ("rename", True)]
    assert result.plan is not plan and result.plan.nodes[1].label == "relu!" and plan.nodes[1].label == "relu"
    assert result.origins == {id(result.plan.nodes[1]): plan.nodes[1]}
    assert PassManager([])(plan).plan is plan


# -- in-place activations -----------------------------------------------------------------------

def test_in_place_activation_is_swapped_once_and_not_where_the_input_is_read_again():
    plan = _conv_relu()
    result = PassManager([InPlaceActivations(SWAPS)])(plan)
    assert result.changed and result.plan.nodes[1].spec.fn is relu_into
    _assert_fresh(result.plan)
    assert PassManager([InPlaceActivations(SWAPS)])(result.plan).changed is False
    twice = _conv_relu(extra=[helper.make_node("Neg", ["c"], ["n"])], outputs=[("y", F, X), ("n", F, X)])
    assert PassManager([InPlaceActivations(SWAPS)])(twice).changed is False
    output = _conv_relu(outputs=[("y", F, X), ("c", F, X)])
    assert PassManager([InPlaceActivations(SWAPS)])(output).changed is False


# -- Gelu ---------------------------------------------------------------------------------------

def _gelu_plan(kind, extra=(), outputs=(("y", F, GELU_SHAPE),), inputs=(), param=None):
    """x = Neg(input) then a written-out Gelu of x in one of its spellings."""
    c = {"s2": np.float32(np.sqrt(2.0)), "r2": np.float32(1 / np.sqrt(2.0)), "one": np.float32(1.0),
         "half": np.float32(0.5), "three": np.float32(3.0), "cubic": np.float32(0.044715),
         "scale": np.float32(np.sqrt(2 / np.pi))}
    nodes = [helper.make_node("Neg", ["input"], ["x"])]
    erf = kind.startswith("erf")
    if erf:
        nodes += [helper.make_node("Div", ["x", "s2"], ["z"]) if "div" in kind else
                  helper.make_node("Mul", ["r2", "x"], ["z"]),
                  helper.make_node("Erf", ["z"], ["f"])]
    else:
        cube = [helper.make_node("Pow", ["x", "three"], ["p"])] if "pow" in kind else \
            [helper.make_node("Mul", ["x", "x"], ["sq"]), helper.make_node("Mul", ["sq", "x"], ["p"])]
        nodes += [*cube, helper.make_node("Mul", ["p", "cubic"], ["k"]), helper.make_node("Add", ["x", "k"], ["s"]),
                  helper.make_node("Mul", ["s", "scale"], ["u"]), helper.make_node("Tanh", ["u"], ["f"])]
    nodes.append(helper.make_node("Add", ["f", "one"], ["a"]))
    if kind.endswith("half-last"):  # x * (1 + f) * 0.5
        nodes += [helper.make_node("Mul", ["x", "a"], ["m"]), helper.make_node("Mul", ["m", "half"], ["y"])]
    elif kind.endswith("half-first"):  # (0.5 x) * (1 + f)
        nodes += [helper.make_node("Mul", ["x", "half"], ["h"]), helper.make_node("Mul", ["h", "a"], ["y"])]
    else:  # (1 + f) * 0.5 * x
        nodes += [helper.make_node("Mul", ["half", "a"], ["m"]), helper.make_node("Mul", ["m", "x"], ["y"])]
    if param is not None:
        c.pop(param)
    plan = _plan([*nodes, *extra], [("input", F, GELU_SHAPE), *inputs], list(outputs), c)
    if param is not None:  # the constant is given at run time
        pv = next(v for pn in plan.nodes for v in pn.inputs if v is not None and v.name == param)
        assert pv.kind == "input"
    return plan


GELU_FORMS = ["erf-div-half-last", "erf-mul-half-first", "erf-div-half-middle",
              "tanh-pow-half-first", "tanh-mul-half-last", "tanh-pow-half-middle"]


@pytest.mark.parametrize("kind", GELU_FORMS)
def test_each_gelu_form_is_matched_once(kind):
    plan = _gelu_plan(kind)
    act = next(pn for pn in plan.nodes if pn.op_type in ("Erf", "Tanh"))
    found = match_gelu(plan.index, act)
    assert found is not None and found.x is plan.nodes[0].outputs[0]
    assert found.approximate == ("none" if kind.startswith("erf") else "tanh")
    assert found.chain == plan.nodes[1:] and found.last is plan.nodes[-1]
    made = []
    result = PassManager([FuseGelu(lambda m: made.append(m) or replace(
        m.anchor, op_type="Gelu", inputs=(m.x,), outputs=m.last.outputs, frees=m.frees))])(plan)
    assert len(made) == 1 and result.changed
    assert [pn.op_type for pn in result.plan.nodes] == ["Neg", "Gelu"]
    assert result.plan.nodes[1].outputs == plan.nodes[-1].outputs
    _assert_fresh(result.plan)


def test_gelu_kernel_pass_calls_the_kernel():
    gelu = REGISTRY.resolve("Gelu", 20, "", "numpy")
    result = PassManager([gelu_kernel_pass(gelu)])(_gelu_plan("erf-div-half-last"))
    node = result.plan.nodes[-1]
    assert node.spec is gelu and node.kwargs == {"approximate": "none"} and node.label == "Erf#2"


def test_ggml_makes_its_rules_node_where_ggml_runs_it():
    from mithril.backends.ggml.fusion import ggml_gelu_pass

    plan = _gelu_plan("tanh-mul-half-last")
    result = PassManager([ggml_gelu_pass(lambda pn: True)])(plan)
    node = result.plan.nodes[-1]
    assert node.op_type == "Gelu" and node.kwargs == {"approximate": "tanh"}
    assert node.label == "Tanh#6 (tanh GELU of 9 nodes)"
    assert PassManager([ggml_gelu_pass(lambda pn: False)])(plan).changed is False


@pytest.mark.parametrize("case", ["intermediate-read-twice", "intermediate-is-output", "subgraph-reads-it",
                                  "constant-given-at-run-time", "maker-refuses"])
def test_gelu_is_not_matched_where_it_must_not_be(case):
    make = lambda m: replace(m.anchor, op_type="Gelu", inputs=(m.x,), outputs=m.last.outputs)  # noqa: E731
    if case == "intermediate-read-twice":
        plan = _gelu_plan("erf-div-half-last", extra=[helper.make_node("Neg", ["a"], ["n"])],
                          outputs=[("y", F, GELU_SHAPE), ("n", F, GELU_SHAPE)])
    elif case == "intermediate-is-output":
        plan = _gelu_plan("tanh-pow-half-first", outputs=[("y", F, GELU_SHAPE), ("f", F, GELU_SHAPE)])
    elif case == "subgraph-reads-it":
        plan = _gelu_plan("erf-div-half-last", extra=[_if_reading("z", GELU_SHAPE, out="w")],
                          outputs=[("y", F, GELU_SHAPE), ("w", F, GELU_SHAPE)], inputs=[("cond", TensorProto.BOOL, [])])
    elif case == "constant-given-at-run-time":
        plan = _gelu_plan("erf-div-half-last", inputs=[("one", F, [])], param="one")
    else:
        plan = _gelu_plan("erf-div-half-last")
        make = lambda m: None  # noqa: E731
    result = PassManager([FuseGelu(make)])(plan)
    assert result.changed is False and result.plan is plan


# -- Conv (+ Add) (+ Relu/Clip) -----------------------------------------------------------------

class _Toy(FuseConvChains):
    """A backend taking every chain, its fused node named after the chain's ops."""

    def takes_conv(self, index, conv):
        return conv.op_type == "Conv"

    def takes_residual(self, index, conv, add, residual):
        return True

    def takes_activation(self, index, act, chain):
        return True

    def make(self, index, chain: ConvChain):
        return replace(chain.conv, op_type="+".join(pn.op_type for pn in chain.nodes),
                       inputs=(*chain.conv.inputs, chain.residual), outputs=chain.last.outputs)


def _residual_plan(act="Relu", extra=(), outputs=(("y", F, X),), inputs=(), swap=False):
    add = helper.make_node("Add", ["r", "c"] if swap else ["c", "r"], ["s"])
    tail = [helper.make_node(act, ["s"], ["y"])] if act else []
    if not act:
        add = helper.make_node("Add", add.input, ["y"])
    return _plan([helper.make_node("Abs", ["x"], ["r"]), helper.make_node("Conv", ["x", "w"], ["c"]), add,
                  *tail, *extra], [("x", F, X), *inputs], list(outputs), {"w": W})


@pytest.mark.parametrize("shape", ["conv-relu", "conv-add-relu", "conv-add", "conv-add-relu-swapped"])
def test_each_conv_chain_is_matched_once(shape):
    plan = {"conv-relu": lambda: _conv_relu(), "conv-add-relu": lambda: _residual_plan(),
            "conv-add": lambda: _residual_plan(act=None),
            "conv-add-relu-swapped": lambda: _residual_plan(swap=True)}[shape]()
    result = PassManager([_Toy()])(plan)
    want = {"conv-relu": "Conv+Relu", "conv-add": "Conv+Add"}.get(shape, "Conv+Add+Relu")
    assert [pn.op_type for pn in result.plan.nodes if "Conv" in pn.op_type] == [want]
    assert result.plan.nodes[-1].outputs == plan.nodes[-1].outputs
    _assert_fresh(result.plan)
    assert PassManager([_Toy()])(result.plan).changed is False


@pytest.mark.parametrize("case", ["conv-read-twice", "conv-is-output", "subgraph-reads-conv", "add-read-twice"])
def test_conv_chain_is_not_matched_where_it_must_not_be(case):
    if case == "conv-read-twice":
        plan = _conv_relu(extra=[helper.make_node("Neg", ["c"], ["n"])], outputs=[("y", F, X), ("n", F, X)])
    elif case == "conv-is-output":
        plan = _conv_relu(outputs=[("y", F, X), ("c", F, X)])
    elif case == "subgraph-reads-conv":
        plan = _conv_relu(extra=[_if_reading("c")], outputs=[("y", F, X), ("z", F, X)],
                          inputs=[("cond", TensorProto.BOOL, [])])
    else:  # the Add's result read by the Relu and a graph output: Conv+Add is fused, the Relu is not
        plan = _residual_plan(outputs=[("y", F, X), ("s", F, X)])
        result = PassManager([_Toy()])(plan)
        assert [pn.op_type for pn in result.plan.nodes] == ["Abs", "Conv+Add", "Relu"]
        return
    assert PassManager([_Toy()])(plan).changed is False


def test_c_marks_the_fused_conv_its_own_way():
    plan = _residual_plan()
    nodes, fused = c_fuse(plan)
    (conv,) = [pn for pn in nodes if pn.op_type == "Conv"]
    assert conv.kwargs[RESIDUAL] is True and conv.kwargs[CLAMP] == (0.0, float("inf"))
    assert conv.inputs[3] is plan.nodes[0].outputs[0] and conv.outputs == plan.nodes[-1].outputs
    assert fused == {id(conv): plan.nodes[1]}  # the plan's Conv: its profile slot
    # A residual made after the Conv cannot be added where the Conv runs: only the Relu is taken.
    late = _plan([helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Abs", ["x"], ["r"]),
                  helper.make_node("Add", ["c", "r"], ["s"]), helper.make_node("Relu", ["s"], ["y"])],
                 [("x", F, X)], [("y", F, X)], {"w": W})
    assert [pn.op_type for pn in c_fuse(late)[0]] == ["Conv", "Abs", "Add", "Relu"]


# -- a layout change: C's NCHWc blocking ----------------------------------------------------------

def test_nchwc_blocking_rewrites_a_segment_through_the_index():
    from mithril.backends.c.nchwc import BlockNCHWc

    rng = np.random.default_rng(0)
    shape = [1, 16, 8, 8]
    plan = _plan([helper.make_node("Conv", ["x", "dw"], ["d"], group=16, pads=[1, 1, 1, 1], name="depthwise"),
                  helper.make_node("Conv", ["d", "pw"], ["y"], name="pointwise")],
                 [("x", F, shape)], [("y", F, shape)],
                 {"dw": rng.standard_normal((16, 1, 3, 3)).astype(np.float32),
                  "pw": rng.standard_normal((16, 16, 1, 1)).astype(np.float32)})
    result = PassManager([BlockNCHWc(lambda v: v in plan.outputs)])(plan)
    assert [pn.op_type for pn in result.plan.nodes] == ["ToNCHWc", "ConvNCHWc", "ConvNCHWc", "FromNCHWc"]
    assert result.plan.nodes[-1].outputs == plan.nodes[-1].outputs  # the graph output, back in NCHW
    depthwise, pointwise = plan.nodes
    assert [result.origins[id(pn)] for pn in result.plan.nodes] == [depthwise, depthwise, pointwise, pointwise]
    _assert_fresh(result.plan)


# -- an exporter's constants written as initializers --------------------------------------------

def _dynamo_gelu_model():
    """``Gelu(x @ w)`` as torch.onnx's dynamo exporter writes it: the chain's sqrt(2), 1 and 0.5 are
    initializers (val_0, val_1, val_2), like the weight."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Div", ["h", "val_0"], ["z"]),
             helper.make_node("Erf", ["z"], ["f"]), helper.make_node("Add", ["f", "val_1"], ["a"]),
             helper.make_node("Mul", ["val_2", "a"], ["m"]), helper.make_node("Mul", ["h", "m"], ["y"])]
    inits = {"w": rng.standard_normal((8, 16)).astype(np.float32), "val_0": np.float32(np.sqrt(2.0)),
             "val_1": np.float32(1.0), "val_2": np.float32(0.5)}
    return make_model(nodes, [("x", F, [4, 8])], [("y", F, [4, 16])], inits, opset=18), inits


def _gelu_reference(x, inits, sqrt2=None):
    from math import erf

    h = x.astype(np.float64) @ inits["w"]
    z = h / (inits["val_0"] if sqrt2 is None else sqrt2)
    return h * 0.5 * (1 + np.vectorize(erf)(z))


@pytest.mark.parametrize("name", ["torch", "ggml"])
def test_an_exporters_constants_in_initializers_fuse_when_nothing_trains_them(name):
    """An inference compile fuses the chain (its constants read from the file), and evaluate refuses
    another value for them; a compile that trains them, or keeps one changeable through
    ``trainable_keys``, leaves the chain as it is."""
    import mithril as ml
    from mithril.errors import InputError

    if name == "ggml":
        pytest.importorskip("ggml", reason="GGMLBackend needs ggml-python (installed by scripts/dev.sh)")
    else:
        pytest.importorskip("torch")
    backend = ml.GGMLBackend(num_threads=1) if name == "ggml" else ml.TorchBackend()
    model, inits = _dynamo_gelu_model()
    x = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    pm = ml.compile(ml.load_onnx(model), backend, shapes={"x": [4, 8]}, inference=True)
    assert set(pm.baked_params) == {"val_0", "val_1", "val_2"}
    if name == "ggml":
        ran = [pn.op_type for seg in pm.program.segments for pn in seg.nodes]
        assert "Gelu" in ran and "Erf" not in ran, ran
    params = pm.get_parameters()
    assert set(params) == set(inits)  # still parameters, as the file has them
    got = pm.backend.to_numpy(pm.evaluate(params, {"x": x})["y"])
    np.testing.assert_allclose(got, _gelu_reference(x, inits), rtol=1e-4, atol=1e-5)
    changed = {**{k: pm.backend.to_numpy(v) for k, v in params.items()}, "val_0": np.array(2.0, np.float32)}
    with pytest.raises(InputError, match=r"parameter 'val_0' is \[2.0\].*trainable_keys naming 'val_0'"):
        pm.evaluate(changed, {"x": x})
    fresh = pm.randomize_params()  # a new weight; the built-in constants keep their values
    assert float(pm.backend.to_numpy(fresh["val_0"])) == inits["val_0"]
    pm.evaluate(fresh, {"x": x})

    kept = ml.compile(ml.load_onnx(model), backend, shapes={"x": [4, 8]}, inference=True, trainable_keys=["val_0"])
    assert kept.baked_params == {}
    got = kept.backend.to_numpy(kept.evaluate(changed, {"x": x})["y"])
    np.testing.assert_allclose(got, _gelu_reference(x, inits, sqrt2=2.0), rtol=1e-4, atol=1e-5)
    if name == "torch":  # a training compile differentiates them: the chain stays, their gradients are real
        train = ml.compile(ml.load_onnx(model), backend, shapes={"x": [4, 8]})
        assert train.baked_params == {}
        _, grads = train.evaluate(params, {"x": x}, output_gradients={"y": np.ones((4, 16), np.float32)})
        assert float(np.abs(train.backend.to_numpy(grads["val_0"]))) > 0
