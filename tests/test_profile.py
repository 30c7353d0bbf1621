"""`mithril profile` and ml.profile (issue 21, Must 3: "Where the time goes"): per-op-type and
per-node time of a run on every backend, shares that add up, the un-instrumented wall time beside
them, and the command's exit statuses and JSON."""

import json

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
    assert by_type["Conv"].calls == 2 and by_type["Gemm"].calls == 1
    check_sums(report)
    nodes = {r.name.split(" ")[0]: r for r in report.nodes}
    assert set(nodes) == {"conv1", "relu1", "conv2", "relu2", "pool", "flatten", "fc", "softmax"}
    assert nodes["conv2"].input_shapes == [[2, 8, 16, 16], [8, 8, 3, 3], [8]]
    if name in ("c", "torch"):  # C and Torch (on the CPU) run each Relu inside the Conv before it
        assert name != "c" or report.method == "C node"
        assert nodes["relu1"].calls == 0 and "fused into conv1" in nodes["relu1"].name
        assert nodes["conv1"].name == "conv1 (+ relu1)"
        # A movement op may be a few nanoseconds in C (Flatten of a contiguous buffer): only >= 0.
        assert all(r.ms > 0 for r in report.nodes if r.op_type in ("Conv", "Gemm", "Softmax"))
        assert all(r.ms >= 0 for r in report.nodes)
    else:
        assert all(r.ms > 0 and r.calls == 1 for r in report.nodes)
    if name in ("jax", "mlx"):  # jitted by default: the rows are eager per-op times, the wall the jitted one
        assert report.method == "eager op" and report.jitted and "eager per-op time" in report.note
        assert report.eager_ms > 0
    elif name != "c":
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
    pm = ml.compile(ml.load_onnx(looped_model()), make_backend("jax"), inference=True)
    report = profile(pm, None, {"x": np.ones((192, 192), np.float32)}, runs=2)
    (row,) = report.nodes
    assert row.name == "loop" and row.calls == 1 and row.ms > 0
    check_sums(report)


@pytest.mark.parametrize("name", ["c", "ggml"])
def test_nodes_left_to_numpy_are_rows_named_so(name):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"),
         helper.make_node("Einsum", ["r"], ["y"], name="swap", equation="ij->ji")], "fallback",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.warns(UserWarning, match="run on NumPy"):
        pm = ml.compile(ml.load_onnx(model), make_backend(name), inference=True)
    report = profile(pm, None, {"x": np.ones((8, 4), np.float32)}, runs=2)
    rows = {r.op_type: r for r in report.nodes}
    assert rows["Einsum"].name == "swap (on NumPy)" and rows["Einsum"].calls == 1 and rows["Einsum"].ms > 0
    assert rows["Einsum"].input_shapes == [[8, 4]]
    assert set(rows) == ({"Relu", "Einsum"} if name == "c" else {"ggml segment", "Einsum"})
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
