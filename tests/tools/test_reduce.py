"""``ml.reduce`` and ``mithril reduce``: a wrong kernel planted on the NumPy backend (an override
off by a small factor, or one that raises) in real exported models (ResNet-18, BERT, optimum's
GPT-2 with its key/value cache) is reduced to a file of at most three nodes, the planted op among
them, that passes ``onnx.checker`` and fails the same way on its own."""

from __future__ import annotations

import contextlib
import functools
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mithril as ml
from mithril.array_files import load_arrays
from mithril.backends.registry import REGISTRY
from mithril.cli import main as cli_main
from mithril.runners import parse_runner
from mithril.validate import compare

from tests.conftest import make_model

ort = pytest.importorskip("onnxruntime")

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def planted(op_type: str, factor: float = 1.01, raises: bool = False):
    """The NumPy backend's kernel of ``op_type`` (opset 18) off by ``factor``, or raising, for the block."""
    ml.NumpyBackend()  # its overrides are registered when the first one is made
    spec = REGISTRY.resolve(op_type, 18, "", "numpy")

    @functools.wraps(spec.fn)  # the same signature: the same inputs and attributes reach it
    def wrong(*args, **kwargs):
        if raises:
            raise RuntimeError(f"planted failure in {op_type}")
        return spec.fn(*args, **kwargs) * factor

    with ml.scoped_ops():
        ml.register_op(op_type, wrong, backend="numpy", domain="", since=spec.since, replace=True,
                       static_inputs=spec.static_inputs)
        yield


def assert_reduced(result: ml.ReduceResult, op_type: str, kind: str = "numeric") -> None:
    """At most three nodes, one of them ``op_type``; checker-valid; failing the same way from the
    written file and inputs alone (the backend against onnxruntime, fresh runners)."""
    assert result.failed and result.failure.kind == kind, str(result)
    reduced = onnx.load(result.path)
    onnx.checker.check_model(reduced, full_check=True)
    ops = [n.op_type for n in reduced.graph.node]
    assert len(ops) <= 3 and op_type in ops, ops
    assert [op for _, op in result.kept] == ops
    assert result.inputs_path == str(Path(result.path).with_suffix(".npz"))
    inputs = load_arrays(result.inputs_path)
    assert set(inputs) == {i.name for i in reduced.graph.input}
    outputs = [o.name for o in reduced.graph.output]
    backend, reference = parse_runner("numpy"), parse_runner("onnxruntime")
    if kind == "error":
        with pytest.raises(ml.MithrilError, match=f"op {op_type}"):
            backend.run(result.path, inputs, outputs)
        return
    got, want = backend.run(result.path, inputs, outputs), reference.run(result.path, inputs, outputs)
    assert not all(compare(n, "numpy", got[n], want[n]).passed for n in outputs)


# -- real models, exported once per module ------------------------------------------------------------
@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """exported(name) -> (path, inputs): models_zoo's ResNet-18 (torchvision's architecture) at
    32x32 or small BERT at 8 tokens, random weights, by torch.onnx's TorchScript exporter."""
    pytest.importorskip("torch")
    from models_zoo import torch_reference

    cache = {}

    def get(name: str):
        if name not in cache:
            if name == "bert":
                pytest.importorskip("transformers", reason="transformers builds the BERT model")
            spec = torch_reference.build(name, image_size=32, seq=8)
            path = tmp_path_factory.mktemp("reduce") / f"{name}.onnx"
            with warnings.catch_warnings():  # the exporter's tracer notes
                warnings.simplefilter("ignore")
                torch_reference.export_onnx(spec, "torchscript", str(path))
            cache[name] = (path, spec.numpy_inputs(1))
        return cache[name]

    return get


@pytest.mark.parametrize("name, op_type", [("resnet18", "Add"), ("bert", "Softmax")])
def test_a_planted_wrong_kernel_reduces_to_its_node(exported, tmp_path, name, op_type):
    path, inputs = exported(name)
    with planted(op_type):
        result = ml.reduce(path, "numpy", inputs=inputs, out=tmp_path / "small.onnx")
        assert_reduced(result, op_type)
    assert result.original_nodes > 40 and sum(result.removed.values()) == result.original_nodes - len(result.kept)
    assert result.reduced_failure is not None and result.reduced_failure.kind == "numeric"
    print(f"{name}: {result.original_nodes} nodes -> {len(result.kept)}: {result.kept}")


def test_a_model_that_does_not_fail_is_said_so(exported, tmp_path):
    path, inputs = exported("bert")
    result = ml.reduce(path, "numpy", inputs=inputs, out=tmp_path / "small.onnx")
    assert not result.failed and result.model is None
    assert "does not fail" in str(result)
    assert not (tmp_path / "small.onnx").exists()


def test_a_planted_raising_kernel_reduces_to_the_node_raising_the_same_error(exported, tmp_path):
    path, inputs = exported("bert")
    with planted("Erf", raises=True):
        result = ml.reduce(path, "numpy", inputs=inputs, out=tmp_path / "small.onnx")
        assert result.failure.error == "KernelError" and result.failure.ops == {"Erf"}
        assert_reduced(result, "Erf", kind="error")
        assert result.reduced_failure.error == "KernelError"


@pytest.fixture(scope="module")
def optimum_gpt2(tmp_path_factory):
    sys.path.insert(0, str(ROOT / "scripts"))
    import optimum_export

    if not optimum_export.available():
        pytest.skip("optimum-onnx is not installed (scripts/dev.sh installs it in .venv/optimum-onnx)")
    out = tmp_path_factory.mktemp("optimum")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "optimum_export.py"), "--arch", "gpt2",
                           "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    path = out / "gpt2" / "onnx" / "model.onnx"
    rng = np.random.default_rng(0)
    past, new = 5, 3
    feeds = {"input_ids": rng.integers(0, 300, (1, new)), "attention_mask": np.ones((1, past + new), np.int64)}
    for v in onnx.load(str(path), load_external_data=False).graph.input:
        if v.name == "position_ids":
            feeds[v.name] = np.arange(past, past + new, dtype=np.int64)[None]
        elif v.name.startswith("past"):
            heads, head = (d.dim_value for d in (v.type.tensor_type.shape.dim[1], v.type.tensor_type.shape.dim[3]))
            feeds[v.name] = rng.standard_normal((1, heads, past, head)).astype(np.float32)
    return path, feeds


@pytest.mark.long(reason="exports GPT-2 through optimum-onnx in a child process (15 s); the fast tier reduces "
                         "ResNet-18 and BERT")
def test_a_planted_wrong_kernel_in_optimum_gpt2_with_past_reduces_to_its_node(optimum_gpt2, tmp_path):
    path, feeds = optimum_gpt2
    assert any(k.startswith("past_key_values") for k in feeds)
    with planted("Tanh"):  # GPT-2's tanh GELU
        result = ml.reduce(path, "numpy", inputs=feeds, out=tmp_path / "small.onnx")
        assert_reduced(result, "Tanh")
    assert result.original_nodes > 400
    print(f"gpt2 with past: {result.original_nodes} nodes -> {len(result.kept)}: {result.kept}")


# -- small graphs: drift, subgraphs, an op the backend lacks ------------------------------------------
def _mul_chain(n: int) -> onnx.ModelProto:
    nodes = [helper.make_node("Mul", [f"v{i}", f"w{i}"], [f"v{i + 1}"], name=f"mul{i}") for i in range(n)]
    inits = {f"w{i}": np.full(16, 1.0 + 0.01 * i, np.float32) for i in range(n)}
    model = make_model(nodes, [("v0", TensorProto.FLOAT, [4, 16])], [(f"v{n}", TensorProto.FLOAT, [4, 16])], inits)
    model.graph.initializer.append(numpy_helper.from_array(np.zeros(3, np.float32), "unused"))
    return model


def test_drift_reduces_to_the_short_chain_that_leaves_tolerance(tmp_path):
    """Each Mul off by 6e-4 stays within float32's rtol of 1e-3; two in a row leave it: the
    reduced model is those two, fed the reference's value before them."""
    with planted("Mul", factor=1.0006):
        result = ml.reduce(_mul_chain(6), "numpy", inputs={"v0": np.full((4, 16), 3.0, np.float32)},
                           out=tmp_path / "drift.onnx")
        assert_reduced(result, "Mul")
    assert [label for label, _ in result.kept] == ["mul0", "mul1"]
    assert result.failure.output == "v6" and result.reduced_failure.output == "v2"
    assert [t.name for t in result.model.graph.initializer] == ["w0", "w1"]  # used ones stay, unused drop


def test_a_node_with_a_subgraph_is_one_node_with_its_outer_reads():
    """The planted Softmax runs in an If branch that reads ``a`` from the main graph: the reduced
    model keeps the If whole and feeds ``a``."""
    branch = helper.make_graph([helper.make_node("Softmax", ["a"], ["s"], axis=-1)], "then", [],
                               [helper.make_tensor_value_info("s", TensorProto.FLOAT, [2, 8])])
    other = helper.make_graph([helper.make_node("Identity", ["a"], ["t"])], "else", [],
                              [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2, 8])])
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("If", ["c"], ["b"], then_branch=branch, else_branch=other, name="if"),
             helper.make_node("Tanh", ["b"], ["y"], name="tanh")]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [2, 8]), ("c", TensorProto.BOOL, [])],
                       [("y", TensorProto.FLOAT, [2, 8])])
    with planted("Softmax"):
        result = ml.reduce(model, "numpy", inputs={"c": np.array(True)})
    assert [label for label, _ in result.kept] == ["if"]
    assert sorted(i.name for i in result.model.graph.input) == ["a", "c"]
    onnx.checker.check_model(result.model, full_check=True)


def test_an_op_the_backend_lacks_reduces_to_that_node_though_the_reference_lacks_it_too(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("Frobnicate", ["a"], ["b"], name="frob", domain="com.example"),
             helper.make_node("Tanh", ["b"], ["y"], name="tanh")]
    model = make_model(nodes, [("x", TensorProto.FLOAT, ["N", 8])], [("y", TensorProto.FLOAT, ["N", 8])],
                       domains=("com.example",))
    result = ml.reduce(model, "numpy", out=tmp_path / "frob.onnx")
    assert result.failure.kind == "error" and result.failure.error == result.reduced_failure.error
    assert result.kept == [("frob", "Frobnicate")]
    onnx.checker.check_model(onnx.load(result.path), full_check=True)
    assert "reduced 3 nodes to 1: frob (Frobnicate)" in str(result)


# -- the command line --------------------------------------------------------------------------------
def test_cli_reduce_writes_the_reduced_model_and_says_what_it_removed(tmp_path, capsys):
    model_path = tmp_path / "chain.onnx"
    onnx.save(_mul_chain(4), model_path)
    np.save(tmp_path / "v0.npy", np.full((4, 16), 2.0, np.float32))
    with planted("Mul", factor=1.01):
        rc = cli_main(["reduce", str(model_path), "--backend", "numpy", "--reference", "onnxruntime",
                       "--input", f"v0={tmp_path / 'v0.npy'}", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "reduced 4 nodes to 1: mul0 (Mul)" in out and "removed 3 nodes: Mul x3" in out
    assert f"wrote {tmp_path / 'chain.reduced.onnx'}" in out
    # The reduced file and its inputs fail `validate` on their own, with the kernel still wrong.
    reduced = ["validate", str(tmp_path / "chain.reduced.onnx"), "--backend", "numpy",
               "--load-inputs", str(tmp_path / "chain.reduced.npz"), "--no-progress"]
    with planted("Mul", factor=1.01):
        assert cli_main(reduced) == 1
    assert cli_main(reduced) == 0


def test_cli_reduce_exit_status(tmp_path, capsys):
    model_path = tmp_path / "chain.onnx"
    onnx.save(_mul_chain(2), model_path)
    assert cli_main(["reduce", str(model_path), "--backend", "numpy", "-o", str(tmp_path / "o.onnx")]) == 1
    assert "does not fail" in capsys.readouterr().out
    assert not (tmp_path / "o.onnx").exists()
    assert cli_main(["reduce", str(model_path), "--backend", "nosuch"]) == 2
    assert "unknown backend 'nosuch'" in capsys.readouterr().err
    assert cli_main(["reduce", str(model_path), "--backend", "numpy", "--shape", "nope=1,2"]) == 2
    assert "no input 'nope'" in capsys.readouterr().err
    assert cli_main(["reduce", str(model_path)]) == 2  # --backend is required
