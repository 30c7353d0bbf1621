"""GGMLBackend never takes the interpreter down (issue 57, Must 1). ggml answers a call it cannot
do with GGML_ASSERT, which aborts the process: every segment's context and graph are sized from
what its build makes, exactly (no budget to outgrow), and every ggml call is checked in Python
before the graph is built (mithril.backends.ggml.guard), so a model ggml cannot run is refused
like onnxruntime refuses it or runs on NumPy with the usual warning. Each case below aborted, or
was refused for an exhausted budget, before. The fuzz tier is in tests/onnx_bridge/test_fuzz.py;
real exports (timm, Ultralytics, optimum-onnx) in test_exports.py."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper

import mithril as ml
from mithril.errors import MithrilError
from tests.conftest import make_model

ggml = pytest.importorskip("ggml", reason="GGMLBackend needs ggml-python (installed by scripts/dev.sh)")
ort = pytest.importorskip("onnxruntime")

from mithril.backends.ggml import guard  # noqa: E402
from mithril.backends.ggml import program as ggml_program  # noqa: E402
from mithril.backends.ggml.program import GGMLFallbackWarning  # noqa: E402

F = TensorProto.FLOAT
RNG = np.random.default_rng(0)


def _w(*shape, scale=0.3):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _compile(model, shapes, **options):
    """(compiled model, fallback warnings' texts)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pm = ml.compile(ml.load_onnx(model), ml.GGMLBackend(**options), shapes=shapes)
    return pm, [str(w.message) for w in caught if issubclass(w.category, GGMLFallbackWarning)]


def _reference(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def _check_against_onnxruntime(model, feeds, *, native=True, rtol=1e-4, atol=1e-5):
    pm, fallbacks = _compile(model, {k: list(v.shape) for k, v in feeds.items()})
    if native:
        assert not fallbacks and not pm.program.fallback, fallbacks
    got = pm.evaluate(None, feeds)
    for name, want in _reference(model, feeds).items():
        np.testing.assert_allclose(got[name], want, rtol=rtol, atol=atol, err_msg=name)
    return pm, fallbacks


# ---- sizes: from the build, exactly ---------------------------------------------------------
def _grouped_conv(channels=256, multiplier=2, size=6):
    """A grouped Conv with a channel multiplier (each group its own ggml_conv_2d, ~11 tensors):
    the old per-node budget refused this one ('a graph of 2821 ggml tensors is larger than the
    2048 planned', as RegNetX-002), and FastViT's many such ran ggml's context out of memory
    ('not enough space in the context's memory pool', an abort)."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], group=channels, pads=[1, 1, 1, 1], name="conv")]
    model = make_model(nodes, [("x", F, [1, channels, size, size])], [("y", F, None)],
                       {"w": _w(channels * multiplier, 1, 3, 3), "b": _w(channels * multiplier)})
    return model, {"x": _w(1, channels, size, size, scale=1.0)}


def _lstm(steps=300, hidden=8):
    """A bidirectional LSTM unrolled over 300 steps: about 100 tensors a step."""
    nodes = [helper.make_node("LSTM", ["x", "w", "r", "b"], ["y"], hidden_size=hidden, direction="bidirectional",
                              name="lstm")]
    model = make_model(nodes, [("x", F, [steps, 2, 4])], [("y", F, None)],
                       {"w": _w(2, 4 * hidden, 4), "r": _w(2, 4 * hidden, hidden), "b": _w(2, 8 * hidden)})
    return model, {"x": _w(steps, 2, 4, scale=1.0)}


def test_grouped_conv_with_a_channel_multiplier_runs_in_ggml():
    model, feeds = _grouped_conv()
    _check_against_onnxruntime(model, feeds)


def test_a_long_recurrence_runs_in_ggml():
    """300 steps both ways: its step outputs stacked as they are made, the graph scheduled in
    the order the rule made it (ggml's depth-first order put every step's input projection
    first, all alive at once: ggml-alloc ran out of free blocks, an abort)."""
    model, feeds = _lstm()
    _check_against_onnxruntime(model, feeds)


def test_each_segment_context_and_graph_are_exactly_what_its_build_made():
    for model, feeds in (_grouped_conv(), _lstm(steps=40)):
        pm, _ = _compile(model, {k: list(v.shape) for k, v in feeds.items()})
        program = pm.program
        assert len(program._contexts) == len(program.segments) == 1
        for ctx, seg in zip(program._contexts, program.segments):
            assert ggml.ggml_used_mem(ctx) == ggml.ggml_get_mem_size(ctx)  # not a byte to spare
            nodes = ggml.ggml_graph_n_nodes(seg.graph)
            assert ggml.ggml_graph_size(seg.graph) == max(nodes, guard.graph_size(list(seg.results.values()))[1])


def test_a_graph_whose_build_differs_the_second_time_is_an_error_not_an_abort(monkeypatch):
    """The real build is checked call by call against the counting build (the context has no
    byte more than the counting build took)."""
    from mithril.backends.ggml.ops import OPS

    model, feeds = _grouped_conv(channels=4)
    rule = OPS.resolve("Conv", 17)
    builds = []

    def build(pn, g):
        builds.append(pn)
        y = rule.build(pn, g)
        return g.ggml.ggml_cont(g.ctx, y) if len(builds) > 1 else y  # one tensor more the second time

    monkeypatch.setattr(OPS, "_rules", {**OPS._rules, ("", "Conv"): [dataclasses.replace(rule, build=build)]})
    with pytest.raises(MithrilError, match="second build differs from its first"):
        _compile(model, {"x": [1, 4, 6, 6]})


# ---- preconditions: refused in Python, like onnxruntime, or run on NumPy ----------------------
def test_conv_kernel_larger_than_its_padded_input_is_refused_like_onnxruntime():
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 0, 1, 0], name="big")]
    model = make_model(nodes, [("x", F, [1, 3, 3, 3])], [("y", F, None)], {"w": _w(2, 3, 6, 5)})
    feeds = {"x": _w(1, 3, 3, 3)}
    with pytest.raises(Exception):  # onnxruntime refuses it (at load or run)
        _reference(model, feeds)
    pm, fallbacks = _compile(model, {"x": [1, 3, 3, 3]})
    assert any("big (Conv:" in f for f in fallbacks)  # its output has no pixel: empty, or the kernel too large
    with pytest.raises(MithrilError, match="big"):  # NumPy refuses it as NumpyBackend does
        pm.evaluate(None, feeds)
    with pytest.raises(MithrilError, match="big"):
        _compile(model, {"x": [1, 3, 3, 3]}, fallback=None)


def test_gemm_scaled_output_of_a_padded_weight_runs_in_ggml():
    """Gemm with alpha over a weight of 5 columns (stored padded to 8 rows for ggml's fast
    matmul, read back as a view): ggml_scale computes only a contiguous tensor and asserted.
    Found by the GGML fuzz tier."""
    nodes = [helper.make_node("Gemm", ["x", "w", "c"], ["y"], alpha=2.0, beta=0.5, name="gemm")]
    model = make_model(nodes, [("x", F, [2, 3])], [("y", F, [2, 5])], {"w": _w(3, 5), "c": _w(5)})
    _check_against_onnxruntime(model, {"x": _w(2, 3, scale=1.0)})


@pytest.mark.parametrize("op", ["LayerNormalization", "InstanceNormalization"])
def test_a_negative_epsilon_runs_on_numpy(op):
    """ggml's norms assert epsilon >= 0; onnxruntime computes with it."""
    n = 8 if op == "LayerNormalization" else 3  # scale and bias: per last-axis value, or per channel
    nodes = [helper.make_node(op, ["x", "s", "b"], ["y"], epsilon=-1e-4, name="norm")]
    model = make_model(nodes, [("x", F, [2, 3, 8])], [("y", F, None)], {"s": _w(n), "b": _w(n)})
    _, fallbacks = _check_against_onnxruntime(model, {"x": _w(2, 3, 8, scale=1.0)}, native=False)
    assert any("norm (" + op + ": epsilon=-" in f for f in fallbacks)


def test_indices_computed_in_the_graph_past_the_table_leave_the_gather_to_numpy():
    """ArgMax over 6 values picks rows of a 4-row table: ggml_get_rows would assert while
    computing if an index reached past it, which no check can catch then; the Gather runs on
    NumPy, which raises where onnxruntime does (here every index is in range)."""
    nodes = [helper.make_node("ArgMax", ["x"], ["i"], axis=1, keepdims=0, name="argmax"),
             helper.make_node("Gather", ["t", "i"], ["y"], axis=0, name="gather")]
    model = make_model(nodes, [("x", F, [3, 6])], [("y", F, None)], {"t": _w(4, 5)})
    x = np.zeros((3, 6), np.float32)
    x[[0, 1, 2], [3, 0, 2]] = 1.0
    _, fallbacks = _check_against_onnxruntime(model, {"x": x}, native=False)
    assert any("gather (Gather: ggml would abort on ggml_get_rows: indices 'i' computed in the graph, in [0, 5], "
               "for a table of 4 rows" in f for f in fallbacks)


def test_topk_of_nan_keeps_its_indices_in_range():
    """NaN makes every comparison false: ranks repeat and a slot could sum two positions; the
    indices are kept in range (ggml_get_rows asserts on a row past the table)."""
    nodes = [helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1, name="topk"),
             helper.make_node("GatherElements", ["x", "i"], ["y"], axis=1, name="pick")]
    model = make_model(nodes, [("x", F, [2, 5])], [("y", F, None), ("v", F, None)],
                       {"k": np.array([3], np.int64)})
    x = np.array([[np.nan, 1, np.nan, 2, 0], [np.nan] * 5], np.float32)
    pm, fallbacks = _compile(model, {"x": [2, 5]})
    assert not fallbacks
    out = pm.evaluate(None, {"x": x})
    assert out["y"].shape == (2, 3) and out["v"].shape == (2, 3)


# ---- the backstop: whatever a rule's check lets through ----------------------------------------
@pytest.fixture
def calls():
    mem = 64 * ggml.ggml_tensor_overhead()
    ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=mem, mem_buffer=None, no_alloc=True))
    c = guard.Calls(ggml)
    c.counting(lambda: ctx)
    yield c
    ggml.ggml_free(ctx)


def _tensor(calls, *shape, type_=None):
    return calls.ggml_new_tensor_4d(calls.ctx, ggml.GGML_TYPE_F32 if type_ is None else type_,
                                    *(list(reversed(shape)) + [1] * (4 - len(shape))))


@pytest.mark.parametrize("case, message", [
    (lambda c: c.ggml_add(c.ctx, _tensor(c, 2, 3), _tensor(c, 2, 2)), "does not repeat"),
    (lambda c: c.ggml_mul_mat(c.ctx, _tensor(c, 4, 3), _tensor(c, 4, 5)), "ggml_can_mul_mat"),
    (lambda c: c.ggml_conv_2d(c.ctx, _tensor(c, 2, 3, 5, 5), _tensor(c, 1, 3, 3, 3), 1, 1, 0, 0, 1, 1),
     "larger than the 3x3"),
    (lambda c: c.ggml_conv_2d(c.ctx, _tensor(c, 2, 3, 1, 1), _tensor(c, 1, 3, 3, 3), 0, 1, 0, 0, 1, 1),
     "each an int in"),
    (lambda c: c.ggml_pool_2d(c.ctx, _tensor(c, 1, 1, 4, 4), ggml.GGML_OP_POOL_MAX, 2, 2, 0, 1, 0.0, 0.0),
     "each an int in"),
    (lambda c: c.ggml_norm(c.ctx, _tensor(c, 2, 3), -1.0), "eps >= 0"),
    (lambda c: c.ggml_view_2d(c.ctx, _tensor(c, 2, 3), 3, 2, 16, 8), "view"),
    (lambda c: c.ggml_pad_ext(c.ctx, _tensor(c, 2, 3), -1, 0, 0, 0, 0, 0, 0, 0), "pads"),
    (lambda c: c.ggml_get_rows(c.ctx, _tensor(c, 4, 3), _tensor(c, 2)), "indices"),
    (lambda c: c.ggml_reshape_2d(c.ctx, c.ggml_transpose(c.ctx, _tensor(c, 2, 3)), 2, 3), "non-contiguous"),
    (lambda c: c.ggml_upscale(c.ctx, _tensor(c, 2, 3), 2, 0), "no audited preconditions"),
])
def test_the_backstop_refuses_what_ggml_asserts_on(calls, case, message):
    with pytest.raises(guard.GGMLPreconditionError, match=message):
        case(calls)


def test_a_node_its_check_let_through_runs_on_numpy_with_the_reason(monkeypatch):
    """Without the Conv check's window test, the backstop meets ggml_im2col's assertion and the
    node runs on NumPy, its warning giving the ggml function and the condition."""
    from mithril.backends.ggml.ops import OPS

    rule = OPS.resolve("Conv", 17)
    monkeypatch.setattr(OPS, "_rules", {**OPS._rules, ("", "Conv"): [dataclasses.replace(rule, check=None)]})
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], name="big")]
    model = make_model(nodes, [("x", F, [1, 1, 3, 3])], [("y", F, None)], {"w": _w(1, 1, 5, 5)})
    _, fallbacks = _compile(model, {"x": [1, 1, 3, 3]})
    assert any("big (Conv: ggml would abort on ggml_conv_2d: a 5x5 kernel larger than the 3x3 (padded) input"
               in f for f in fallbacks)


def test_graph_depth_and_live_allocations_are_bounded(monkeypatch):
    """A graph deeper than ggml's recursive walk may go (a stack overflow), or holding more
    intermediates at once than ggml-alloc has free blocks for (an assertion), moves the node
    where it happens to NumPy: here with the bounds lowered."""
    nodes = [helper.make_node("Relu" if i % 2 else "Neg", [f"v{i}"], [f"v{i + 1}"], name=f"n{i}") for i in range(12)]
    model = make_model(nodes, [("v0", F, [4])], [("v12", F, [4])])
    feeds = {"v0": _w(4, scale=1.0)}
    monkeypatch.setattr(ggml_program, "MAX_GRAPH_DEPTH", 6)
    _, fallbacks = _check_against_onnxruntime(model, feeds, native=False)
    assert any("tensors deep" in f for f in fallbacks)
    monkeypatch.undo()
    monkeypatch.setattr(ggml_program, "MAX_LIVE_ALLOCATIONS", 1)
    nodes = [helper.make_node("Split", ["x"], ["a", "b", "c"], axis=0, name="split"),
             helper.make_node("Sum", ["a", "b", "c"], ["y"], name="sum")]
    model = make_model(nodes, [("x", F, [6])], [("y", F, None)], opset=13)
    _, fallbacks = _check_against_onnxruntime(model, {"x": _w(6, scale=1.0)}, native=False)
    assert any("intermediates allocated at once" in f for f in fallbacks)
