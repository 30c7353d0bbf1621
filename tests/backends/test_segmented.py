"""The segmented-backend layer (mithril/backends/segmented/), through a toy emit backend defined
here: a folder-like set of rules (Relu, Add, Sigmoid from opset 13) and a renderer that prints
each segment as Python source over NumPy, built with ``compile`` and run. Everything else (the
capability step, the partition, the fallback policy and its warning, the run loop and its
profiling hook, what runs an op) is the layer's."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import mithril as ml
from mithril.backends.interpret import Interpreter
from mithril.backends.plan import PlanNode, PlanValue
from mithril.backends.segmented import (NativeRule, RuleTable, Segment, SegmentedBackend, SegmentedProgram,
                                        later_reads, segment_io, why_not)
from mithril.errors import FallbackWarning, KernelMissingError

F32 = np.dtype(np.float32)


# -- the toy backend: its rules, its renderer, its program, its class -------------------------------


@dataclass(frozen=True, kw_only=True)
class ToyRule(NativeRule):
    """A toy rule: ``emit(pn, args)`` is the Python expression computing the node's output."""

    emit: Callable[[PlanNode, list[str]], str]

    @property
    def function(self):
        return self.emit

    def value_problem(self, pn, position, v):
        return None if v.dtype == F32 else f"dtype {v.dtype} of {v.name!r} (the toy has float32)"


RULES = RuleTable("toy rule")


def toy_rule(op_type: str, since: int = 1, check=None, folded=()):
    def register(emit):
        RULES.add(ToyRule(op_type=op_type, since=since, emit=emit, check=check, folded=tuple(folded)))
        return emit

    return register


@toy_rule("Relu")
def relu(pn, args):
    return f"np.maximum({args[0]}, np.float32(0))"


@toy_rule("Add", check=lambda pn: None if pn.inputs[0].static_shape == pn.inputs[1].static_shape
          else "no broadcasting in the toy")
def add(pn, args):
    return f"{args[0]} + {args[1]}"


@toy_rule("Sigmoid", since=13)
def sigmoid(pn, args):
    return f"1 / (1 + np.exp(-{args[0]}))"


@toy_rule("Reshape", folded=(1,))
def reshape(pn, args):
    return f"{args[0]}.reshape({pn.outputs[0].static_shape})"


def render(seg: Segment) -> tuple[str, Callable]:
    """The segment as the source of one Python function over its inputs, and that function."""
    names = {v: f"v{i}" for i, v in enumerate(seg.inputs)}
    lines = [f"def seg{seg.index}({', '.join(names.values())}):"]
    for pn in seg.nodes:
        rule = RULES.rule_for(pn)
        args = [names[v] for i, v in enumerate(pn.inputs) if v is not None and i not in rule.folded]
        names[pn.outputs[0]] = f"v{len(names)}"
        lines.append(f"    {names[pn.outputs[0]]} = {rule.emit(pn, args)}")
    lines.append(f"    return ({''.join(names[v] + ', ' for v in seg.outputs)})")
    source = "\n".join(lines) + "\n"
    namespace = {"np": np}
    exec(compile(source, f"<toy segment {seg.index}>", "exec"), namespace)
    return source, namespace[f"seg{seg.index}"]


class ToyProgram(SegmentedProgram):
    segment_noun = "toy segments"
    segment_label = "toy segment"

    def __init__(self, plan, steps):
        self.plan, self.steps = plan, steps
        self.fallback = [s for s in steps if not isinstance(s, Segment)]
        self.interpreter = Interpreter(plan)
        needed = later_reads(steps, plan.outputs)
        self.built = {}
        for si, seg in enumerate(steps):
            if isinstance(seg, Segment):
                segment_io(seg, lambda v, si=si: needed(si, v),
                           lambda pn: [v for i, v in RULES.rule_for(pn).buffers(pn) if i is not None])
                self.built[seg.index] = render(seg)

    def run_segment(self, seg, env):
        outputs = self.built[seg.index][1](*(self.read(v, env) for v in seg.inputs))
        env.update(zip(seg.outputs, outputs))

    def memory_bytes(self):
        return {"arena_bytes": 0}


class ToyBackend(SegmentedBackend):
    name = "toy"

    @classmethod
    def native_rules(cls):
        return RULES

    def compile_segments(self, part, *, file_path=None):
        return ToyProgram(part.plan, part.steps)


# -- a model with ops the toy lacks ----------------------------------------------------------------


def _model(opset: int = 17):
    """relu -> add -> exp (no toy rule) -> relu -> neg (no toy rule) -> add: three toy segments."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("Add", ["a", "b"], ["c"], name="add"),
             helper.make_node("Exp", ["c"], ["d"], name="exp"),
             helper.make_node("Relu", ["d"], ["e"], name="relu2"),
             helper.make_node("Neg", ["e"], ["f"], name="neg"),
             helper.make_node("Add", ["f", "a"], ["y"], name="add2")]
    b = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    graph = helper.make_graph(nodes, "toy", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
                              [numpy_helper.from_array(b, "b")])
    return ml.load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]))


X = {"x": np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)}


def _compile(**options):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pm = ml.compile(_model(), ToyBackend(**options), inference=True)
    return pm, [w for w in caught if issubclass(w.category, FallbackWarning)]


def test_the_partition_runs_what_the_rules_take_in_segments_and_the_rest_on_numpy():
    pm, _ = _compile()
    steps = [[pn.label for pn in s.nodes] if isinstance(s, Segment) else s.label for s in pm.program.steps]
    assert steps == [["relu", "add"], "exp", ["relu2"], "neg", ["add2"]]
    assert [pn.label for pn in pm.program.fallback] == ["exp", "neg"]
    first, last = pm.program.steps[0], pm.program.steps[4]
    # Inputs: read before the segment writes them (the constant too); outputs: read later or by the caller.
    assert [v.name for v in first.inputs] == ["x", "b"] and [v.name for v in first.outputs] == ["a", "c"]
    assert [v.name for v in last.inputs] == ["f", "a"] and [v.name for v in last.outputs] == ["y"]
    assert "def seg0(v0, v1):" in pm.program.built[0][0]


def test_one_warning_names_every_node_left_to_numpy():
    _, caught = _compile()
    assert len(caught) == 1
    assert str(caught[0].message) == ("ToyBackend: 2 node(s) run on NumPy (no toy rule): exp (Exp: no toy rule), "
                                      "neg (Neg: no toy rule)")


def test_fallback_none_refuses_them_all():
    with pytest.raises(KernelMissingError, match=r"^ToyBackend\(fallback=None\): 2 node\(s\) have no toy rule: "
                                                 r"exp \(Exp: no toy rule\), neg \(Neg: no toy rule\)$"):
        ml.compile(_model(), ToyBackend(fallback=None), inference=True)
    with pytest.raises(ml.MithrilError, match="fallback must be 'numpy' or None"):
        ToyBackend(fallback="jax")


def test_results_equal_numpys():
    pm, _ = _compile()
    want = ml.compile(_model(), ml.NumpyBackend(), inference=True).evaluate(None, X)["y"]
    np.testing.assert_allclose(pm.evaluate(None, X)["y"], want, rtol=1e-6)


def test_an_unfixed_input_shape_is_refused_by_name():
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "loose",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    with pytest.raises(ml.MithrilError, match=r"ToyBackend needs every input shape fixed; .* for: x \['N', 4\]"):
        ml.compile(ml.load_onnx(helper.make_model(graph)), ToyBackend(), inference=True)


def test_the_hook_sees_each_segment_and_each_fallback_node():
    pm, _ = _compile()
    seen = []

    def hook(step, fn, *args):
        seen.append([pn.label for pn in step.nodes] if isinstance(step, Segment) else step.label)
        return fn(*args)

    out = pm.program.run(pm.get_parameters(), X, hook=hook)
    assert seen == [["relu", "add"], "exp", ["relu2"], "neg", ["add2"]]
    np.testing.assert_allclose(out["y"], pm.evaluate(None, X)["y"])


def test_profile_times_each_segment_and_each_fallback_node():
    from mithril.profile import profile

    pm, _ = _compile()
    report = profile(pm, None, X, runs=2, warmup=1)
    assert report.method == "partition"
    names = sorted(r.name for r in report.nodes)
    assert names == ["exp (on NumPy)", "neg (on NumPy)", "toy segment 0: 2 nodes (Relu, Add)",
                     "toy segment 1: 1 nodes (Relu)", "toy segment 2: 1 nodes (Add)"]
    assert all(r.calls == 1 for r in report.nodes)


def test_memory_report_takes_the_programs_labels():
    pm, _ = _compile()
    text = str(pm.memory_report())
    assert "arena:" in text and "(NumPy nodes between toy segments allocate their own outputs)" in text


def test_what_runs_an_op_is_the_backends_answer():
    [relu_range] = ToyBackend.op_ranges("Relu")
    assert (relu_range.first, relu_range.last, relu_range.kind) == (6, None, "toy rule")  # Relu's first opset
    assert relu_range.function.endswith("test_segmented.relu")
    path, line = relu_range.location.rsplit(":", 1)
    assert path.endswith("tests/backends/test_segmented.py") and int(line) == relu.__code__.co_firstlineno
    assert ToyBackend.op_support("Exp", "", 17).kind == "NumPy fallback"
    # Opset-aware: the Sigmoid rule starts at 13; before it NumPy's kernel runs as the fallback.
    assert ToyBackend.op_support("Sigmoid", "", 11).kind == "NumPy fallback"
    assert ToyBackend.op_support("Sigmoid", "", 13).kind == "toy rule"
    assert ToyBackend.op_support("NoSuchOp", "", 17) is None
    assert {("", "Relu"), ("", "Exp")} <= ToyBackend.op_keys()
    # A backend over xp answers from the kernel registry.
    assert ml.NumpyBackend.op_support("Exp", "", 17).kind == "shared"


# -- capability, node by node ------------------------------------------------------------------------


def _value(name, shape=(3, 4), dtype=F32, kind="node", array=None):
    return PlanValue(0, name, shape, None if dtype is None else np.dtype(dtype), kind, _array=array)


def _node(op_type, inputs, outputs, opset=17, subgraphs=None):
    return PlanNode(0, f"{op_type.lower()}", op_type, "", opset, None, tuple(inputs), tuple(outputs), {}, {}, {}, (),
                    subgraphs or {}, False)


def test_capability_says_why_not_for_each_check():
    x, y = _value("x"), _value("y")
    assert why_not(_node("Relu", [x], [y]), RULES) is None
    assert why_not(_node("Exp", [x], [y]), RULES) == "no toy rule"
    assert why_not(_node("Relu", [x], [y], subgraphs={"body": object()}), RULES) == "no toy rule"
    assert why_not(_node("Relu", [_value("x", dtype=np.float64)], [y]), RULES) == \
        "dtype float64 of 'x' (the toy has float32)"
    assert why_not(_node("Relu", [_value("x", shape=("N", 4))], [y]), RULES) == "shape of 'x' not fixed"
    bad = _value("w", shape=(3, 4), kind="constant", array=np.zeros((2, 2), np.float32))
    assert why_not(_node("Relu", [bad], [y]), RULES) == "constant 'w' holds shape (2, 2), typed (3, 4)"
    assert why_not(_node("Add", [x, _value("z", shape=(1, 4))], [y]), RULES) == "no broadcasting in the toy"
    shape = _value("shape", shape=(2,), dtype=np.int64, kind="input")
    assert why_not(_node("Reshape", [x, shape], [_value("r", shape=(4, 3))]), RULES) == \
        "input 1 ('shape') given at run time"
    # Values known only at the first evaluate (the shape, and the output whose shape follows from it)
    # pass for now: GGML builds its graphs then.
    r = _value("r", shape=None)
    assert why_not(_node("Reshape", [x, shape], [r]), RULES, pending={shape, r}) is None


def test_capability_resolves_the_rule_at_the_nodes_opset():
    x, y = _value("x"), _value("y")
    assert why_not(_node("Sigmoid", [x], [y], opset=11), RULES) == "no toy rule"
    assert why_not(_node("Sigmoid", [x], [y], opset=13), RULES) is None
    assert RULES.resolve("Sigmoid", 12) is None and RULES.resolve("Sigmoid", 21).since == 13
    with pytest.raises(ValueError, match="registered twice"):
        toy_rule("Sigmoid", since=13)(sigmoid)


def test_a_model_at_an_older_opset_leaves_the_newer_rule_unused():
    graph = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["s"], name="sig"),
                               helper.make_node("Relu", ["s"], ["y"], name="relu")], "old",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])])
    model = ml.load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)]))
    with pytest.warns(FallbackWarning, match=r"1 node\(s\) run on NumPy \(no toy rule\): sig \(Sigmoid: no toy rule\)"):
        pm = ml.compile(model, ToyBackend(), inference=True)
    assert [pn.label for pn in pm.program.fallback] == ["sig"]
    np.testing.assert_allclose(pm.evaluate(None, X)["y"], 1 / (1 + np.exp(-X["x"])), rtol=1e-6)


def test_c_and_ggml_are_clients_of_the_layer():
    from mithril.backends.c.program import CFallbackWarning, CKernelMissingError
    from mithril.backends.ggml.program import GGMLFallbackWarning, GGMLKernelMissingError

    assert issubclass(ml.CBackend, SegmentedBackend) and issubclass(ml.GGMLBackend, SegmentedBackend)
    assert issubclass(CFallbackWarning, FallbackWarning) and issubclass(GGMLFallbackWarning, FallbackWarning)
    assert issubclass(CKernelMissingError, KernelMissingError) and issubclass(GGMLKernelMissingError,
                                                                              KernelMissingError)
    conv = ml.CBackend.op_support("Conv", "", 22)
    assert conv.kind == "C kernel" and conv.location.startswith("mithril/backends/c/ops/nn.py:")
