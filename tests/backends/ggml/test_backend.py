"""GGMLBackend: the zoo's models as ggml graphs equal NumPy's; weight types and quantization;
the memory budget; the NumPy fallback; and inputs that would trip a GGML_ASSERT (which aborts
the process) refused with a MithrilError in this same process."""

import warnings

import numpy as np
import pytest

import mithril as ml
import models_zoo
from mithril.backends.ggml.program import GGMLFallbackWarning, GGMLKernelMissingError, GGMLMemoryError
from mithril.errors import CompileError, MithrilError, NodeError

pytest.importorskip("ggml", reason="GGMLBackend needs ggml-python (installed by scripts/dev.sh)")


def _gpt():
    return models_zoo.create_gpt(bias=True, block_size=16, dims=64, num_heads=4, num_layers=2, vocab_size=96)


CASES = {
    "mlp": (lambda: models_zoo.mlp([16, 8, 4]), (2, 12)),
    "lenet": (lambda: models_zoo.lenet(num_classes=10), (2, 1, 32, 32)),
    "resnet18": (lambda: models_zoo.resnet18(num_classes=10), (1, 3, 32, 32)),
    "gpt": (_gpt, (1, 16)),
}


def _setup(name):
    build, shape = CASES[name]
    model = build()
    ref = ml.compile(model, ml.NumpyBackend(), shapes={"input": shape}, inference=True)
    params = {k: np.asarray(v) for k, v in ref.randomize_params().items()}
    for k in params:
        if k.endswith("running_var"):
            params[k] = np.abs(params[k]) + 0.5
    rng = np.random.default_rng(0)
    x = rng.integers(0, 96, shape) if name == "gpt" else rng.standard_normal(shape).astype(np.float32)
    return model, shape, params, x, ref.evaluate(params, {"input": x})["output"]


def _compile(model, shape, backend):
    with warnings.catch_warnings():
        warnings.simplefilter("error", GGMLFallbackWarning)  # every node of the zoo's models has a ggml rule
        return ml.compile(model, backend, shapes={"input": shape}, inference=True, static_shapes=True)


@pytest.mark.parametrize("name", list(CASES))
def test_zoo_model_in_ggml_equals_numpy(name):
    model, shape, params, x, want = _setup(name)
    pm = _compile(model, shape, ml.GGMLBackend())
    assert not pm.program.fallback and len(pm.program.segments) == 1
    got = pm.evaluate(params, {"input": x})["output"]
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
    again = pm.evaluate(params, {"input": x})["output"]  # the graph is built once and reused
    np.testing.assert_array_equal(again, got)


@pytest.mark.parametrize("weights, quantize, bound, stored", [
    (ml.float16, None, 2e-3, "f16"), (ml.bfloat16, None, 2e-2, "bf16"),
    (None, "int8", 3e-2, "q8_0"), (None, "q4_0", 0.2, "q4_0"), (None, "q4_K", 0.2, "f32"),
])
def test_weight_types_and_quantization(weights, quantize, bound, stored):
    model, shape, params, x, want = _setup("gpt")
    pm = _compile(model, shape, ml.GGMLBackend(dtype=weights, quantize=quantize))
    got = pm.evaluate(params, {"input": x})["output"]
    err = np.abs(got - want).max() / np.abs(want).max()
    assert 0 < err < bound
    report = pm.memory_report()
    assert stored in report.weights_by_dtype
    if quantize == "q4_K":  # rows of 64 values: not whole 256-value blocks, kept float and named
        assert pm.program.format.kept_float and "256-value blocks" in pm.program.format.kept_float[0][1]


def test_q4_0_weights_are_under_30_percent_of_float32():
    model = models_zoo.create_gpt(bias=True, block_size=32, dims=256, num_heads=4, num_layers=2, vocab_size=512)
    sizes = {}
    for q in (None, "q4_0"):
        pm = _compile(model, (1, 32), ml.GGMLBackend(quantize=q))
        sizes[q] = pm.memory_report()
    quantized = sizes["q4_0"].weights_by_dtype["q4_0"]
    assert quantized < 0.3 * sizes[None].weight_bytes
    assert sizes["q4_0"].weight_bytes < 0.3 * sizes[None].weight_bytes  # norms and biases stay float32


def test_parameters_given_later_replace_the_earlier_ones():
    model, shape, params, x, want = _setup("mlp")
    pm = _compile(model, shape, ml.GGMLBackend(quantize="q8_0"))
    first = pm.evaluate(params, {"input": x})["output"]
    doubled = {k: v * 2 for k, v in params.items()}  # new arrays: re-read (and re-quantized)
    want = ml.compile(model, ml.NumpyBackend(), shapes={"input": shape}, inference=True).evaluate(
        doubled, {"input": x})["output"]
    got = pm.evaluate(doubled, {"input": x})["output"]
    assert np.abs(got - want).max() < 0.03 * np.abs(want).max() < np.abs(got - first).max()


def test_mem_size_is_a_budget():
    model, shape, params, x, _ = _setup("lenet")
    need = _compile(model, shape, ml.GGMLBackend()).memory_report().total_bytes
    assert need > 246_000  # LeNet's float32 weights alone
    with pytest.raises(GGMLMemoryError, match=rf"needs {need:,} bytes \(weights .*raise mem_size or quantize"):
        _compile(model, shape, ml.GGMLBackend(mem_size=need - 1))
    pm = _compile(model, shape, ml.GGMLBackend(mem_size=need))
    assert pm.evaluate(params, {"input": x})["output"].shape == (2, 10)


def test_memory_report_tells_weights_per_type_work_and_total():
    model, shape, params, x, _ = _setup("gpt")
    report = _compile(model, shape, ml.GGMLBackend(quantize="q8_0")).memory_report()
    assert set(report.weights_by_dtype) == {"f32", "q8_0"}
    assert report.weight_bytes == sum(report.weights_by_dtype.values())
    assert report.total_bytes == report.weight_bytes + report.arena_bytes + report.work_bytes
    assert "q8_0" in str(report) and "total" in str(report)


def _one_node(op, inputs, output_shape, **attrs):
    import onnx
    from onnx import TensorProto, helper

    names = [f"x{i}" for i in range(len(inputs))]
    node = helper.make_node(op, names, ["y"], **attrs)
    graph = helper.make_graph([node], op, [helper.make_tensor_value_info(n, t, s) for n, (t, s) in zip(names, inputs)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, output_shape)])
    return onnx.helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_nodes_without_a_ggml_rule_run_on_numpy_or_are_refused():
    from onnx import TensorProto

    model = _one_node("Acos", [(TensorProto.FLOAT, [3, 4])], [3, 4])
    with pytest.warns(GGMLFallbackWarning,
                      match=r"1 node\(s\) run on NumPy \(no ggml rule\): Acos#0 \(Acos: no ggml rule\)"):
        pm = ml.compile(model, ml.GGMLBackend(), inference=True)
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_allclose(pm.evaluate({}, {"x0": x})["y"], np.arccos(x), rtol=1e-6)
    with pytest.raises(GGMLKernelMissingError, match=r"GGMLBackend\(fallback=None\): 1 node\(s\) have no ggml rule: "
                                                      r"Acos#0 \(Acos: no ggml rule\)"):
        ml.compile(model, ml.GGMLBackend(fallback=None), inference=True)


@pytest.mark.filterwarnings("ignore::mithril.backends.ggml.program.GGMLFallbackWarning")
def test_training_is_refused_with_the_backends_that_train():
    from mithril.models import CrossEntropy, Mean, TrainModel

    train = TrainModel(models_zoo.mlp([8, 4]))
    train.add_loss(CrossEntropy(input_type="logits"), input="output", target="target", reduce_steps=[Mean()])
    with pytest.raises(MithrilError, match="GGMLBackend runs inference only.*NumpyBackend, JaxBackend, TorchBackend"):
        ml.compile(train, ml.GGMLBackend(), shapes={"input": (2, 6), "target": (2,)}, static_shapes=True)


# ---- what would trip a GGML_ASSERT (abort) is refused in Python, in this process -------------

def test_two_way_broadcast_and_a_smaller_first_operand_compute_right():
    from onnx import TensorProto

    f = TensorProto.FLOAT
    for op, a, b, fn in (("Add", [3, 1], [1, 4], np.add), ("Sub", [4], [3, 4], np.subtract),
                         ("Div", [1, 4], [3, 1], np.divide), ("Mul", [2, 1, 4], [3, 1], np.multiply)):
        out = list(np.broadcast_shapes(tuple(a), tuple(b)))
        pm = ml.compile(_one_node(op, [(f, a), (f, b)], out), ml.GGMLBackend(fallback=None), inference=True)
        rng = np.random.default_rng(1)
        x0, x1 = rng.random(a, dtype=np.float32) + 0.5, rng.random(b, dtype=np.float32) + 0.5
        np.testing.assert_allclose(pm.evaluate({}, {"x0": x0, "x1": x1})["y"], fn(x0, x1), rtol=1e-6)


@pytest.mark.parametrize("a, b", [([8, 1], [1, 1]), ([9, 7], [7, 5]), ([17, 33], [33, 13]), ([128, 96], [96, 70]),
                                  ([7, 64], [64, 16]), ([3, 20, 24], [3, 24, 11]), ([2, 1, 40, 16], [1, 3, 16, 8])])
@pytest.mark.parametrize("threads", [1, 2])
def test_float32_matmul_of_any_shape_equals_numpys(a, b, threads):
    """ggml's float32 matmul on the shapes its kernels tile unevenly: activation rows from 8 on
    (scripts/patches' packed AVX2 kernel: panels of 16 rows, tiles of 6 weight rows) and under 8
    (tinyBLAS), odd inner lengths, batches and broadcast batches; against float64 NumPy."""
    from onnx import TensorProto

    f = TensorProto.FLOAT
    out = [*np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2])), a[-2], b[-1]]
    pm = ml.compile(_one_node("MatMul", [(f, a), (f, b)], out), ml.GGMLBackend(fallback=None, num_threads=threads),
                    inference=True)
    rng = np.random.default_rng(2)
    x0, x1 = rng.standard_normal(a, dtype=np.float32), rng.standard_normal(b, dtype=np.float32)
    want = np.matmul(x0.astype(np.float64), x1.astype(np.float64))
    np.testing.assert_allclose(pm.evaluate({}, {"x0": x0, "x1": x1})["y"], want, rtol=1e-5, atol=1e-5 * np.sqrt(a[-1]))


@pytest.mark.parametrize("x, k, n", [((1, 5), 5, 1), ((3, 7), 7, 40), ((8, 300), 300, 33), ((9, 64), 64, 70),
                                     ((2, 20, 24), 24, 11), ((128, 600), 600, 100), ((1, 513), 513, 1030)])
@pytest.mark.parametrize("threads", [1, 2])
def test_float32_matmul_reads_its_weight_in_place(x, k, n, threads):
    """A MatMul's float32 [K, N] weight is read where it lies (its transposed view, the kernel
    scripts/patches/ggml-f32-packed.patch adds): up to 8 activation rows by rows of the weight
    streamed into sums, more by panels of its columns in blocks of 256 rows; panels narrower
    than a full one, inner lengths not a multiple of 4, batches; against float64 NumPy."""
    from onnx import TensorProto, helper, numpy_helper

    from mithril.backends.ggml.threads import reads_f32_in_place

    if not reads_f32_in_place():
        pytest.skip("this ggml-python build has no in-place float32 matmul (scripts/dev.sh builds it patched)")
    rng = np.random.default_rng(3)
    w = rng.standard_normal((k, n), dtype=np.float32)
    f = TensorProto.FLOAT
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "matmul",
                              [helper.make_tensor_value_info("x", f, list(x))],
                              [helper.make_tensor_value_info("y", f, [*x[:-1], n])], [numpy_helper.from_array(w, "w")])
    pm = ml.compile(ml.load_onnx(helper.make_model(graph)), ml.GGMLBackend(fallback=None, num_threads=threads),
                    inference=True)
    a = rng.standard_normal(x, dtype=np.float32)
    y = pm.evaluate(None, {"x": a})["y"]
    np.testing.assert_allclose(y, a.astype(np.float64) @ w, rtol=1e-5, atol=1e-5 * np.sqrt(k))
    (stored,) = pm.program._weights.values()
    assert stored.layout == "plain" and stored.buffer.shape == (k, n)  # as given, not transposed


def test_out_of_range_row_index_is_an_error_naming_the_node():
    from onnx import TensorProto

    model = _one_node("Gather", [(TensorProto.FLOAT, [5, 3]), (TensorProto.INT64, [4])], [4, 3])
    pm = ml.compile(model, ml.GGMLBackend(fallback=None), inference=True)
    table = np.arange(15, dtype=np.float32).reshape(5, 3)
    np.testing.assert_array_equal(pm.evaluate({}, {"x0": table, "x1": np.array([0, 4, -1, 2])})["y"],
                                  table[[0, 4, -1, 2]])
    for bad in (5, -6, 2**40):
        with pytest.raises(NodeError, match=rf"node 'Gather#0', op Gather.*index {bad} of 'x1' is out of range for 5 rows"):
            pm.evaluate({}, {"x0": table, "x1": np.array([0, bad, 1, 2])})


def test_wrong_input_shape_or_dtype_is_an_error():
    from onnx import TensorProto

    pm = ml.compile(_one_node("Relu", [(TensorProto.FLOAT, [2, 3])], [2, 3]), ml.GGMLBackend(), inference=True)
    with pytest.raises(MithrilError, match=r"input 'x0' expects shape \[2, 3\] but got \[3, 2\]"):
        pm.evaluate({}, {"x0": np.ones((3, 2), np.float32)})
    with pytest.raises(MithrilError, match=r"'x0'.*float64"):
        pm.evaluate({}, {"x0": np.ones((2, 3))})
    with pytest.raises(MithrilError, match=r"float32 array of shape \(2, 3\).*got float32 \(3, 2\)"):
        pm.program.forward({}, {"x0": np.ones((3, 2), np.float32)})  # the program's own check, below compile's


def test_five_dims_and_float64_values_stay_out_of_ggml():
    from onnx import TensorProto

    pm = None
    with pytest.warns(GGMLFallbackWarning, match=r"has 5 dims \(ggml has at most 4\)"):
        pm = ml.compile(_one_node("Relu", [(TensorProto.FLOAT, [1, 2, 1, 2, 3])], [1, 2, 1, 2, 3]),
                        ml.GGMLBackend(), inference=True)
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(1, 2, 1, 2, 3)
    np.testing.assert_array_equal(pm.evaluate({}, {"x0": x})["y"], np.maximum(x, 0))
    with pytest.raises(CompileError, match=r"dtype float64 of 'x0'"):
        ml.compile(_one_node("Relu", [(TensorProto.DOUBLE, [2])], [2]), ml.GGMLBackend(fallback=None), inference=True)


def test_unknown_options_are_refused():
    with pytest.raises(MithrilError, match="quantize must be None, 'int8' or one of q8_0"):
        ml.GGMLBackend(quantize="q3")
    with pytest.raises(MithrilError, match="float32, float16 or bfloat16 weights"):
        ml.GGMLBackend(dtype=ml.float64)
    with pytest.raises(MithrilError, match="mem_size must be a positive number of bytes"):
        ml.GGMLBackend(mem_size=-1)


def test_docs_example_runs(capsys):
    """docs/backends.md's GGML example runs as written and prints the output shape and the report."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[3] / "docs" / "backends.md").read_text()
    section = text[text.index("## GGML"):]
    block = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    exec(compile(block, "docs/backends.md", "exec"), {})
    printed = capsys.readouterr().out
    assert printed.startswith("(1, 10)\n") and "q8_0" in printed and "total:" in printed


def _gelu_chain(scalars_as_initializers: bool):
    import onnx
    from onnx import TensorProto, helper

    consts = {"sqrt2": np.sqrt(2.0), "one": 1.0, "half": 0.5}
    nodes = [helper.make_node("Div", ["x", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["x", "a"], ["m"]),
             helper.make_node("Mul", ["m", "half"], ["y"])]
    inits = [helper.make_tensor(k, TensorProto.FLOAT, [], [v]) for k, v in consts.items()]
    if not scalars_as_initializers:  # Constant nodes: constants in the plan
        nodes = [helper.make_node("Constant", [], [k], value=t) for k, t in zip(consts, inits)] + nodes
        inits = []
    graph = helper.make_graph(nodes, "gelu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], inits)
    return onnx.helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_erf_gelu_chain_runs_as_one_ggml_op_when_its_scalars_are_fixed():
    from scipy.special import erf

    x = np.linspace(-4, 4, 32, dtype=np.float32).reshape(4, 8)
    want = 0.5 * x * (1 + erf(x / np.sqrt(2)))
    pm = ml.compile(_gelu_chain(False), ml.GGMLBackend(fallback=None), inference=True)
    assert [pn.op_type for seg in pm.program.segments for pn in seg.nodes] == ["Gelu"]
    np.testing.assert_allclose(pm.evaluate({}, {"x": x})["y"], want, rtol=1e-6, atol=1e-6)
    # Scalars written as initializers (torch.onnx's dynamo exporter) that nothing trains in this
    # compile are read from the file too, and evaluate holds them to it (pm.baked_params).
    pm = ml.compile(_gelu_chain(True), ml.GGMLBackend(fallback=None), inference=True)
    assert [pn.op_type for seg in pm.program.segments for pn in seg.nodes] == ["Gelu"]
    assert set(pm.baked_params) == {"sqrt2", "one", "half"}
    np.testing.assert_allclose(pm.evaluate(pm.get_parameters(), {"x": x})["y"], want, rtol=1e-6, atol=1e-6)
    # One kept changeable: the chain stays as written (Erf's own rule).
    pm = ml.compile(_gelu_chain(True), ml.GGMLBackend(fallback=None), inference=True, trainable_keys=["sqrt2"])
    assert "Erf" in [pn.op_type for seg in pm.program.segments for pn in seg.nodes] and pm.baked_params == {}
    np.testing.assert_allclose(pm.evaluate(pm.get_parameters(), {"x": x})["y"], want, rtol=1e-6, atol=1e-6)


def _tanh_gelu_chain(form: int):
    """GPT-2's GELU as exporters write it, halving ``x`` (form 0, transformers' export), the
    product (1) or ``1 + tanh`` (2)."""
    import onnx
    from onnx import TensorProto, helper

    consts = {"three": 3.0, "k": 0.044715, "s": np.sqrt(2 / np.pi), "one": 1.0, "half": 0.5}
    nodes = [helper.make_node("Pow", ["x", "three"], ["p"]), helper.make_node("Mul", ["k", "p"], ["m1"]),
             helper.make_node("Add", ["m1", "x"], ["a"]), helper.make_node("Mul", ["a", "s"], ["m2"]),
             helper.make_node("Tanh", ["m2"], ["t"]), helper.make_node("Add", ["one", "t"], ["a1"])]
    nodes += {0: [helper.make_node("Mul", ["x", "half"], ["h"]), helper.make_node("Mul", ["h", "a1"], ["y"])],
              1: [helper.make_node("Mul", ["x", "a1"], ["h"]), helper.make_node("Mul", ["h", "half"], ["y"])],
              2: [helper.make_node("Mul", ["half", "a1"], ["h"]), helper.make_node("Mul", ["h", "x"], ["y"])]}[form]
    inits = [helper.make_tensor(k, TensorProto.FLOAT, [], [v]) for k, v in consts.items()]
    nodes = [helper.make_node("Constant", [], [k], value=t) for k, t in zip(consts, inits)] + nodes
    graph = helper.make_graph(nodes, "gelu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])])
    return onnx.helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("form", [0, 1, 2])
def test_tanh_gelu_chain_runs_as_one_ggml_op(form):
    """The nine-node tanh GELU becomes one Gelu(approximate="tanh"), computed as silu(x d) / d
    (ggml's vectorized silu): float32-close to the formula in float64, large |x| included."""
    x = np.concatenate([np.linspace(-8, 8, 30), [-30, 30]]).astype(np.float32).reshape(4, 8)
    xd = x.astype(np.float64)
    want = 0.5 * xd * (1 + np.tanh(np.sqrt(2 / np.pi) * (xd + 0.044715 * xd ** 3)))
    pm = ml.compile(_tanh_gelu_chain(form), ml.GGMLBackend(fallback=None), inference=True)
    assert [pn.op_type for seg in pm.program.segments for pn in seg.nodes] == ["Gelu"]
    np.testing.assert_allclose(pm.evaluate({}, {"x": x})["y"], want, rtol=2e-6, atol=1e-6)


def test_tanh_gelu_chain_with_another_reader_stays_as_written():
    """A value inside the chain that the graph also outputs keeps the nodes (no fusion), same values."""
    import onnx

    model = _tanh_gelu_chain(0)
    model.graph.output.append(onnx.helper.make_tensor_value_info("t", onnx.TensorProto.FLOAT, [4, 8]))
    x = np.linspace(-3, 3, 32, dtype=np.float32).reshape(4, 8)
    pm = ml.compile(model, ml.GGMLBackend(fallback=None), inference=True)
    ops = [pn.op_type for seg in pm.program.segments for pn in seg.nodes]
    assert "Tanh" in ops and "Gelu" not in ops
    out = pm.evaluate({}, {"x": x})
    inner = np.sqrt(2 / np.pi) * (x + 0.044715 * x.astype(np.float64) ** 3)
    np.testing.assert_allclose(out["t"], np.tanh(inner), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["y"], 0.5 * x * (1 + np.tanh(inner)), rtol=1e-5, atol=1e-6)


def test_docs_gguf_example_runs(capsys):
    """docs/backends.md's GGUF example runs as written: the file reloads bit for bit on GGML and
    dequantized on NumPy."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[3] / "docs" / "backends.md").read_text()
    block = re.findall(r"```python\n(.*?)```", text[text.index("### GGUF files"):], re.S)[0]
    exec(compile(block, "docs/backends.md", "exec"), {})
    assert capsys.readouterr().out == ("{'input': {'shape': [1, 3, 32, 32], 'dtype': 'float32'}}\nTrue\n(1, 10)\n")


def test_docs_generation_example_runs(capsys):
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[3] / "docs" / "backends.md").read_text()
    block = re.findall(r"```python\n(.*?)```", text[text.index("### Generation"):], re.S)[0]
    exec(compile(block, "docs/backends.md", "exec"), {})
    assert capsys.readouterr().out == "(16,)\n"
