"""`mithril profile` and ml.profile (issue 21, Must 3: "Where the time goes"): per-op-type and
per-node time of a run on every backend, shares that add up, the un-instrumented wall time beside
them, and the command's exit statuses and JSON."""

import json
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mithril as ml
from mithril.backends.table import BACKENDS
from mithril.cli import main
from mithril.profile import ProfileReport, profile

# conv1 relu1 conv2 relu2 pool flatten fc softmax: the op types every backend must report.
MODEL_OPS = {"Conv", "Relu", "GlobalAveragePool", "Flatten", "Gemm", "Softmax"}
SHAPE = (2, 3, 16, 16)


def small_cnn() -> onnx.ModelProto:
    rng = np.random.default_rng(0)

    def init(name, shape):
        return numpy_helper.from_array((0.1 * rng.standard_normal(shape)).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["a"], name="fc"),
        helper.make_node("Softmax", ["a"], ["y"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes, "small_cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])],
        [init("w1", (8, 3, 3, 3)), init("b1", (8,)), init("w2", (8, 8, 3, 3)), init("b2", (8,)),
         init("w3", (8, 10)), init("b3", (10,))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("profile") / "small_cnn.onnx"
    onnx.save(small_cnn(), path)
    return str(path)


def installed(name: str):
    if not BACKENDS[name].installed():
        pytest.skip(f"{name} is not installed here (no {BACKENDS[name].array_modules[0]} package)")


def make_backend(name: str):
    installed(name)
    # One thread: ggml's pool spins on a shared machine; the others run as they are.
    return BACKENDS[name].load()(num_threads=1) if name == "ggml" else BACKENDS[name].load()()


def check_sums(report: ProfileReport) -> None:
    assert sum(r.share for r in report.op_types) == pytest.approx(100, abs=0.01)
    assert sum(r.share for r in report.nodes) == pytest.approx(100, abs=0.01)
    assert sum(r.ms for r in report.op_types) == pytest.approx(report.nodes_ms, rel=1e-9)
    assert [r.ms for r in report.op_types] == sorted((r.ms for r in report.op_types), reverse=True)
    assert report.wall_ms > 0 and report.instrumented_ms > 0
    assert 0 < report.nodes_ms


@pytest.mark.parametrize("name", ["numpy", "torch", "jax", "mlx", "c"])
def test_every_node_gets_its_time_on_each_backend(name, monkeypatch):
    if name == "c":  # one build, with clocks (a model built without them gets a profiled copy: below)
        monkeypatch.setenv("MITHRIL_C_PROFILE", "1")
    backend = make_backend(name)
    pm = ml.compile(ml.load_onnx(small_cnn()), backend, shapes={"x": SHAPE}, inference=True)
    x = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)
    report = profile(pm, None, {"x": backend.from_numpy(x)}, runs=3)
    assert report.backend == name
    assert {r.op_type for r in report.op_types} == MODEL_OPS
    by_type = {r.op_type: r for r in report.op_types}
    if name == "jax":  # calls are XLA instructions: a convolution is its im2col's copies and a dot
        assert by_type["Conv"].calls >= 2 and by_type["Gemm"].calls >= 1
    else:
        assert by_type["Conv"].calls == 2 and by_type["Gemm"].calls == 1
    check_sums(report)
    nodes = {r.name.split(" ")[0]: r for r in report.nodes}
    assert set(nodes) == {"conv1", "relu1", "conv2", "relu2", "pool", "flatten", "fc", "softmax"}
    assert nodes["conv2"].input_shapes == [[2, 8, 16, 16], [8, 8, 3, 3], [8]]
    if name == "jax":  # jitted by default: the rows are the jitted program's XLA instructions
        assert report.method == "XLA op" and report.jitted and report.eager_ms is None
        assert "XLA's profiler" in report.note
        for r in report.nodes:  # a row ran, or says where its work went
            assert (r.ms > 0 and r.calls >= 1) or (r.ms == 0 and r.calls == 0 and (
                "(no XLA work)" in r.name or "(fused into " in r.name)), r
            if "(fused into " in r.name:  # and its host's row names it
                host = r.name.split("(fused into ")[1].rstrip(")")
                assert f"(+ {r.name.split(' ')[0]})" in nodes[host].name
        assert all(nodes[n].ms > 0 for n in ("conv1", "conv2", "fc"))
    elif name in ("c", "torch"):  # C and Torch (on the CPU) run each Relu inside the Conv before it
        assert name != "c" or report.method == "C node"
        assert nodes["relu1"].calls == 0 and "fused into conv1" in nodes["relu1"].name
        assert nodes["conv1"].name == "conv1 (+ relu1)"
        # A movement op may be a few nanoseconds in C (Flatten of a contiguous buffer): only >= 0.
        assert all(r.ms > 0 for r in report.nodes if r.op_type in ("Conv", "Gemm", "Softmax"))
        assert all(r.ms >= 0 for r in report.nodes)
    else:
        assert all(r.ms > 0 and r.calls == 1 for r in report.nodes)
    if name == "mlx":  # compiled by default: the rows are eager per-op times, the wall the compiled one
        assert report.method == "eager op" and report.jitted and "eager per-op time" in report.note
        assert report.eager_ms > 0
    elif name not in ("c", "jax"):
        assert report.method == "kernel" and not report.jitted


def test_ggml_is_profiled_per_partition():
    backend = make_backend("ggml")
    pm = ml.compile(ml.load_onnx(small_cnn()), backend, shapes={"x": SHAPE}, inference=True)
    report = profile(pm, None, {"x": np.ones(SHAPE, np.float32)}, runs=2)
    assert report.method == "partition" and "per partition" in report.note
    check_sums(report)
    # Every node has a ggml rule here: one segment, which names the op types it ran.
    (segment,) = report.nodes
    assert segment.op_type == "ggml segment" and segment.calls == 1 and segment.ms > 0
    for op in MODEL_OPS:
        assert op in segment.name


def looped_model() -> onnx.ModelProto:
    """y = (tanh(.) @ eye) applied 5 times by a Loop."""
    body = helper.make_graph(
        [helper.make_node("Tanh", ["v_in"], ["t"], name="body_tanh"),
         helper.make_node("MatMul", ["t", "w"], ["v_out"], name="body_matmul"),
         helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond")], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [192, 192])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [192, 192])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "", "x"], ["y"], name="loop", body=body)], "looped",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [192, 192])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [192, 192])],
        [numpy_helper.from_array(np.array(5, np.int64), "n"),
         numpy_helper.from_array(np.eye(192, dtype=np.float32), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("name", ["numpy", "torch", "mlx"])
def test_a_loop_body_is_counted_once_per_iteration_and_not_twice(name):
    """Nodes of a Loop body are rows of their own (calls = iterations), and the Loop's own row
    leaves their time out, so the rows never add up to more than the profiled run."""
    pm = ml.compile(ml.load_onnx(looped_model()), make_backend(name), inference=True)
    report = profile(pm, None, {"x": np.ones((192, 192), np.float32)}, runs=3)
    calls = {r.name: r.calls for r in report.nodes}
    assert calls["loop"] == 1 and calls["body_tanh"] == 5 and calls["body_matmul"] == 5
    assert {r.op_type for r in report.op_types} == {"Loop", "Tanh", "MatMul", "Identity"}
    check_sums(report)
    # Own times: the rows together stay within the profiled run (medians, so a little slack).
    assert report.nodes_ms <= 1.5 * report.instrumented_ms


def test_a_loop_body_that_jax_traces_is_the_loops_time():
    """Eager JAX runs a Loop through lax, which calls the body with tracers: tracing is no node's
    run, so the body adds no rows and its time stays in the Loop's."""
    pm = ml.compile(ml.load_onnx(looped_model()), make_backend("jax"), inference=True, jit=False)
    report = profile(pm, None, {"x": np.ones((192, 192), np.float32)}, runs=2)
    assert report.method == "eager op" and not report.jitted
    (row,) = report.nodes
    assert row.name == "loop" and row.calls == 1 and row.ms > 0
    check_sums(report)


def test_a_jitted_loop_body_s_xla_instructions_are_its_nodes_rows():
    """Jitted, the Loop is an XLA while: its body's dot and tanh run once per iteration, each
    given to its node, and the while's own event (which encloses them) is not counted again."""
    pm = ml.compile(ml.load_onnx(looped_model()), make_backend("jax"), inference=True)
    report = profile(pm, None, {"x": np.ones((192, 192), np.float32)}, runs=3)
    assert report.method == "XLA op"
    rows = {r.name: r for r in report.nodes}
    assert rows["body_matmul"].calls == 5 and rows["body_tanh"].calls == 5
    assert rows["body_matmul"].ms > 0 and rows["body_tanh"].ms > 0
    check_sums(report)
    # The rows (the body's own instructions) stay within the profiled run.
    assert report.nodes_ms <= 1.5 * report.instrumented_ms


def test_jax_without_a_readable_trace_times_its_nodes_eagerly(monkeypatch):
    """XLA's profiler is one per process, and older jax cannot read its traces: then the nodes
    run op by op, and the report says so."""
    jax = pytest.importorskip("jax")
    backend = make_backend("jax")
    pm = ml.compile(ml.load_onnx(small_cnn()), backend, shapes={"x": SHAPE}, inference=True)
    data = {"x": backend.from_numpy(np.ones(SHAPE, np.float32))}
    with monkeypatch.context() as m:
        m.delattr(jax.profiler, "ProfileData")
        report = profile(pm, None, data, runs=2)
    assert report.method == "eager op" and "eager per-op time" in report.note and report.eager_ms > 0
    check_sums(report)
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        jax.profiler.start_trace(directory)  # the user's own trace: left running, and untouched
        try:
            report = profile(pm, None, data, runs=2)
        finally:
            jax.profiler.stop_trace()
    assert report.method == "eager op"


@pytest.mark.parametrize("name", ["c", "ggml"])
def test_nodes_left_to_numpy_are_rows_named_so(name):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"),
         helper.make_node("Bernoulli", ["r"], ["y"], name="coin", seed=1.0)], "fallback",  # neither C nor ggml runs it
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.warns(UserWarning, match="run on NumPy"):
        pm = ml.compile(ml.load_onnx(model), make_backend(name), inference=True)
    report = profile(pm, None, {"x": np.ones((8, 4), np.float32)}, runs=2)
    rows = {r.op_type: r for r in report.nodes}
    assert rows["Bernoulli"].name == "coin (on NumPy)" and rows["Bernoulli"].calls == 1 and rows["Bernoulli"].ms > 0
    assert rows["Bernoulli"].input_shapes == [[8, 4]]
    assert set(rows) == ({"Relu", "Bernoulli"} if name == "c" else {"ggml segment", "Bernoulli"})
    check_sums(report)


def test_rows_by_signature_tell_nodes_of_one_op_type_apart():
    """The bench's question: which Conv (shape, group, strides) takes the time."""
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["d"], name="depthwise", group=8, pads=[1, 1, 1, 1]),
         helper.make_node("Conv", ["d", "p"], ["y"], name="pointwise", strides=[2, 2])], "dw",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [numpy_helper.from_array(np.ones((8, 1, 3, 3), np.float32), "w"),
         numpy_helper.from_array(np.ones((4, 8, 1, 1), np.float32), "p")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    pm = ml.compile(ml.load_onnx(model), ml.NumpyBackend(), inference=True)
    report = profile(pm, None, {"x": np.ones((1, 8, 16, 16), np.float32)}, runs=2)
    nodes = {r.name: r for r in report.nodes}
    assert nodes["depthwise"].attributes == {"group": 8, "pads": [1, 1, 1, 1]}
    assert nodes["pointwise"].attributes == {"strides": [2, 2]}
    signatures = {r.op_type: r for r in report.by_signature()}
    assert set(signatures) == {"Conv [1, 8, 16, 16]x[8, 1, 3, 3] group=8", "Conv [1, 8, 16, 16]x[4, 8, 1, 1] strides=[2, 2]"}
    assert sum(r.share for r in signatures.values()) == pytest.approx(100, abs=0.01)
    assert all(r.calls == 1 and r.ms > 0 for r in signatures.values())


def test_runs_must_be_positive():
    pm = ml.compile(ml.load_onnx(small_cnn()), ml.NumpyBackend(), shapes={"x": SHAPE}, inference=True)
    with pytest.raises(ml.MithrilError, match="runs must be at least 1"):
        profile(pm, None, {"x": np.ones(SHAPE, np.float32)}, runs=0)


# -- the command ----------------------------------------------------------------------------
def test_cli_prints_the_op_table_and_top_nodes(model_file, capsys):
    assert main(["profile", model_file, "--backend", "numpy", "--shape", "x=1x3x16x16", "--runs", "3",
                 "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "Time per op type (numpy, kernel clocks, per run)" in out
    assert "x 1x3x16x16 float32" in out  # the --shape given, in either syntax
    for op in MODEL_OPS:
        assert op in out
    assert "Top 2 nodes" in out
    assert "wall" in out and "profiled run" in out


def test_cli_json_is_parseable_data(model_file, tmp_path, capsys):
    path = tmp_path / "profile.json"
    assert main(["profile", model_file, "--backend", "numpy", "--runs", "2", "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    assert data["backend"] == "numpy" and data["runs"] == 2 and data["method"] == "kernel"
    assert data["inputs"] == {"x": {"shape": [1, 3, 16, 16], "dtype": "float32"}}  # the symbolic N as 1
    assert {r["op_type"] for r in data["op_types"]} == MODEL_OPS
    assert sum(r["share"] for r in data["op_types"]) == pytest.approx(100, abs=0.01)
    assert len(data["nodes"]) == 8 and all(r["ms"] > 0 for r in data["nodes"])
    assert data["nodes_ms"] == pytest.approx(sum(r["ms"] for r in data["nodes"]))


@pytest.mark.parametrize("args, message", [
    (["--backend", "nope"], "unknown backend 'nope'"),
    (["--backend", "numpy,c"], "profile runs one backend"),
    (["--backend", "all"], "profile runs one backend"),
    (["--shape", "y=1,3,16,16"], "the model has no input 'y'"),
    (["--shape", "x=1,3,a,16"], "dims must be integers"),
    (["--runs", "0"], "must be at least 1"),
])
def test_cli_bad_arguments_exit_2_with_one_line(model_file, args, message, capsys):
    assert main(["profile", model_file, *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mithril: error: ") and message in err[0], err


def test_cli_missing_file_exits_2(tmp_path, capsys):
    assert main(["profile", str(tmp_path / "absent.onnx"), "--backend", "numpy"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_cli_unwritable_json_exits_2(model_file, tmp_path, capsys):
    assert main(["profile", model_file, "--runs", "1", "--json", str(tmp_path / "no" / "dir.json")]) == 2
    assert "--json" in capsys.readouterr().err


def test_module_docstring_example_runs():
    import doctest
    import importlib

    module = importlib.import_module("mithril.profile")  # ml.profile is the function, as ml.validate
    tests = [t for t in doctest.DocTestFinder().find(module) if t.examples]
    assert tests
    runner = doctest.DocTestRunner()
    for t in tests:
        runner.run(t)
    assert runner.summarize(verbose=False).failed == 0


# An XLA:CPU module as `Compiled.as_text()` prints it: a dot (node 0), a fusion of node 0's bias,
# node 1's Relu and node 2's pooling reduction, a dot XLA rewrote without metadata, read by node
# 3's fusion, and a copy no node names.
HLO = """HloModule jit_main, entry_computation_layout={(f32[8,4]{1,0})->f32[8]{0}}

%region_0.3 (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add.9 = f32[] add(%a, %b), metadata={op_name="jit(main)/mithril_node2/reduce_sum"}
}

%fused_computation.1 (param_0.1: f32[8,4], param_1.1: f32[4]) -> f32[8] {
  %param_0.1 = f32[8,4]{1,0} parameter(0)
  %param_1.1 = f32[4]{0} parameter(1)
  %broadcast.1 = f32[8,4]{1,0} broadcast(%param_1.1), dimensions={1}, metadata={op_name="jit(main)/mithril_node0/add"}
  %add.1 = f32[8,4]{1,0} add(%param_0.1, %broadcast.1), metadata={op_name="jit(main)/mithril_node0/add"}
  %constant.1 = f32[] constant(0)
  %broadcast.2 = f32[8,4]{1,0} broadcast(%constant.1), dimensions={}
  %max.1 = f32[8,4]{1,0} maximum(%add.1, %broadcast.2), metadata={op_name="jit(main)/mithril_node1/max"}
  ROOT %reduce.1 = f32[8]{0} reduce(%max.1, %constant.1), dimensions={1}, to_apply=%region_0.3, metadata={op_name="jit(main)/mithril_node2/reduce_sum"}
}

%fused_computation.2 (param_0.2: f32[8]) -> f32[8] {
  %param_0.2 = f32[8]{0} parameter(0)
  ROOT %tanh.1 = f32[8]{0} tanh(%param_0.2), metadata={op_name="jit(main)/mithril_node3/tanh"}
}

ENTRY %main.5 (x.1: f32[8,4], w.1: f32[4,4], b.1: f32[4]) -> (f32[8], f32[8]) {
  %x.1 = f32[8,4]{1,0} parameter(0)
  %w.1 = f32[4,4]{1,0} parameter(1)
  %b.1 = f32[4]{0} parameter(2)
  %dot.1 = f32[8,4]{1,0} dot(%x.1, %w.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(main)/mithril_node0/dot_general"}
  %add_reduce_fusion = f32[8]{0} fusion(%dot.1, %b.1), kind=kLoop, calls=%fused_computation.1, metadata={op_name="jit(main)/mithril_node2/reduce_sum"}
  %dot.2 = f32[8]{0} dot(%add_reduce_fusion, %add_reduce_fusion), lhs_contracting_dims={}, rhs_contracting_dims={}
  %tanh_fusion = f32[8]{0} fusion(%dot.2), kind=kLoop, calls=%fused_computation.2, metadata={op_name="jit(main)/mithril_node3/tanh"}
  %copy.1 = f32[8]{0} copy(%tanh_fusion)
  ROOT %tuple.1 = (f32[8]{0}, f32[8]{0}) tuple(%copy.1, %tanh_fusion)
}
"""


def test_each_xla_instruction_goes_to_the_node_with_the_most_arithmetic_in_it():
    pytest.importorskip("jax")
    from mithril.backends.jax.xla_profile import attribute, parse_hlo

    instructions = parse_hlo(HLO)
    assert instructions["add_reduce_fusion"].opcode == "fusion"
    assert instructions["add_reduce_fusion"].calls == ["fused_computation.1"]
    assert instructions["max.1"].node == 1 and instructions["max.1"].computation == "fused_computation.1"
    assert instructions["tuple.1"].opcode == "tuple" and instructions["dot.2"].node is None
    owner, fused = attribute(instructions)
    # The reduction outweighs the bias add and the Relu: the fusion is node 2's, the Relu is fused
    # into it; node 0 owns its dot, so it is a host of its own and not listed as fused.
    assert owner["dot.1"] == 0 and owner["add_reduce_fusion"] == 2 and fused == {1: 2}
    assert owner["dot.2"] == 3  # no metadata: the node that reads its result
    assert owner["copy.1"] == "XLA copy"
    assert "max.1" not in owner and "add.9" not in owner  # inside a fusion or a reduction: no thunks


def test_an_xla_instruction_is_done_by_its_end_mark_or_its_readers_launch():
    """XLA's "end: <name>" mark can come late (recorded once the launching thread is free again:
    GPT-2's last GELU fusion after the 27 ms LM head), or in another run (a loaded machine's XNNPACK
    convolution, marked 0.03 ms after its run returned); a reader's launch bounds
    an instruction's time, through instructions with no events of their own (a bitcast)."""
    pytest.importorskip("jax")
    from mithril.backends.jax.xla_profile import Instruction, timed

    def ins(name, *operands, opcode="fusion"):
        return Instruction(name, opcode, 0, "main", [], list(operands))

    instructions = {i.name: i for i in [
        ins("gelu"), ins("down", "gelu", opcode="dot"), ins("head", "down", opcode="dot"),
        ins("conv", opcode="convolution"), ins("relu", "conv"),
        ins("alone"), ins("early"),
        ins("pad"), ins("view", "pad", opcode="bitcast"), ins("use", "view"),
        ins("xnn", opcode="convolution"), ins("layout", "xnn")]}
    spans = [(0, 1000), (2000, 3000)]
    starts = {
        "gelu": [(0, 5)], "down": [(10, 20)], "head": [(20, 90)],  # gelu's mark lands after head
        "conv": [(200, 202), (2200, 2202)], "relu": [(251, 260), (2251, 2260)],  # a pool's work
        "alone": [(300, 310)],  # no end mark
        "early": [(400, 405)],  # its mark is in the next run
        "pad": [(500, 505)], "use": [(530, 540)],
        "xnn": [(600, 601), (2400, 2401)], "layout": [(990, 995), (2800, 2805)]}  # marked a run late
    ends = {"gelu": [95], "conv": [250, 2250], "early": [2100], "pad": [900], "xnn": [2410, 2900]}
    got = {(name, a): d for a, d, name in timed(starts, ends, instructions, spans)}
    assert got[("gelu", 0)] == 10  # its reader launched at 10, not its mark at 95
    assert got[("conv", 200)] == 50 and got[("conv", 2200)] == 50  # up to each run's own mark
    assert got[("alone", 300)] == 10 and got[("early", 400)] == 5  # the launch's span
    assert got[("pad", 500)] == 30  # through the bitcast, to its reader's launch
    assert got[("head", 20)] == 70
    assert got[("xnn", 600)] == 390  # its mark in the next run: done by its reader's launch
    assert got[("xnn", 2400)] == 400  # the next mark is its own, not the first one after its launch


def test_jax_rows_cover_work_xla_hands_to_its_threads():
    """XLA:CPU launches a library convolution (XNNPACK's) on its thread pool and goes on: the
    instruction's own event is its launch, and its time runs until XLA's "end: <name>" event. The
    rows must cover that time, not the launches (5.8 of a 27.6 ms ResNet-18 run at 2 threads).
    The row is set beside the fastest of ten plain calls: the profiled run's own time grows with
    the profiler's work and with other processes on the CPUs, the fastest plain call does not."""
    jax = pytest.importorskip("jax")
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])]
    graph = helper.make_graph(
        nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 56, 56])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 56, 56])],
        [numpy_helper.from_array((0.05 * rng.standard_normal((64, 64, 3, 3))).astype(np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    backend = make_backend("jax")
    pm = ml.compile(ml.load_onnx(model), backend, inference=True)
    data = {"x": backend.from_numpy(np.ones((1, 64, 56, 56), np.float32))}
    report = profile(pm, None, data, runs=5)
    assert report.method == "XLA op"
    row = {r.name: r for r in report.nodes}["conv"]  # beside it, a copy XLA may add (a row "XLA copy")
    fastest = float("inf")
    for _ in range(10):
        started = time.perf_counter()
        jax.block_until_ready(pm.evaluate(None, data)["y"])
        fastest = min(fastest, (time.perf_counter() - started) * 1e3)
    assert row.calls >= 1 and row.ms >= 0.5 * fastest, [fastest, report.summary(), report.nodes]
