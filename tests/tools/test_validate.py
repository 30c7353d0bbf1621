"""Validation against onnxruntime, and --per-node localisation of a divergent kernel."""

import numpy as np
import onnx
import pytest

import mithril as ml
from mithril.backends.registry import REGISTRY, override
from mithril.cli import main as cli_main


def test_validate_passes_on_a_correct_model(conv_model):
    report = ml.validate(conv_model, ml.NumpyBackend(), shapes={"x": [2, 4, 8, 8]})
    assert report.passed
    (out,) = report.outputs
    assert out.name == "y" and out.shape == (2, 8) and out.dtype == "float32"
    assert out.max_abs_err < 1e-5


@pytest.fixture
def perturbed_sigmoid():
    """A NumPy Sigmoid that is wrong by 1e-2: a deliberate kernel bug."""
    @override("numpy", "Sigmoid", since=1000)
    def bad_sigmoid(x, *, xp):
        return (1 / (1 + xp.exp(-x)) + 1e-2).astype(x.dtype)

    # Registered at since=1000 so it never resolves; re-register at the real version for the test.
    REGISTRY.unregister("numpy", "Sigmoid", 1000)
    override("numpy", "Sigmoid", since=13)(bad_sigmoid)
    yield
    REGISTRY.unregister("numpy", "Sigmoid", 13)


def test_per_node_names_the_perturbed_node(conv_model, perturbed_sigmoid):
    report = ml.validate(conv_model, ml.NumpyBackend(), shapes={"x": [2, 4, 8, 8]}, per_node=True)
    assert not report.passed
    first = report.first_divergence["numpy"]
    assert first is not None
    assert (first.node, first.op_type, first.output) == ("sig", "Sigmoid", "s")
    assert first.max_abs_err == pytest.approx(1e-2, rel=1e-3)
    # The node alone, fed onnxruntime's inputs, still diverges: a local kernel error, not drift.
    assert first.local_error and first.isolated_max_abs_err == pytest.approx(1e-2, rel=1e-3)


def test_per_node_clean_model_reports_no_divergence(conv_model):
    report = ml.validate(conv_model, ml.NumpyBackend(), shapes={"x": [1, 4, 8, 8]}, per_node=True)
    assert report.passed and report.first_divergence["numpy"] is None


def test_cli_validate_exit_codes(tmp_path, conv_model, perturbed_sigmoid, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(conv_model, path)
    x = np.random.default_rng(1).standard_normal((3, 4, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    rc = cli_main(["validate", str(path), "--backend", "numpy", "--input", f"x={tmp_path / 'x.npy'}", "--per-node"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "'sig' (Sigmoid)" in out and "local kernel error" in out


def test_cli_validate_passes(tmp_path, conv_model, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(conv_model, path)
    assert cli_main(["validate", str(path), "--shape", "x=2,4,8,8"]) == 0
    assert "all outputs pass" in capsys.readouterr().out


def test_cli_inspect_lists_every_unsupported_op(tmp_path, capsys):
    from onnx import TensorProto, helper

    from tests.conftest import make_model

    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Frobnicate", ["a"], ["b"]),
             helper.make_node("Wibble", ["b"], ["y"])]
    path = tmp_path / "m.onnx"
    onnx.save(make_model(nodes, [("x", TensorProto.FLOAT, ["N"])], [("y", TensorProto.FLOAT, ["N"])]), path)
    assert cli_main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "2 unsupported op(s)" in out and "Frobnicate (opset 17)" in out and "Wibble (opset 17)" in out
    assert "Relu" in out and "ai.onnx 17" in out


def test_cli_error_is_clean(tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model at all")
    assert cli_main(["inspect", str(bad)]) == 2
    assert "error:" in capsys.readouterr().err


def test_trailing_empty_optional_input_does_not_reach_onnxruntime():
    # onnxruntime 1.31 aborts the process on LayerNormalization(x, scale, ""): validate must not crash.
    from onnx import TensorProto, helper

    from tests.conftest import make_model

    node = helper.make_node("LayerNormalization", ["x", "scale", ""], ["y"], axis=-1)
    model = make_model([node], [("x", TensorProto.FLOAT, [2, 4])], [("y", TensorProto.FLOAT, [2, 4])],
                       {"scale": np.ones(4, np.float32)})
    assert ml.validate(model, ml.NumpyBackend()).passed


def _masked_model() -> onnx.ModelProto:
    """x @ w plus a float32-lowest mask: what a half-precision backend must clamp (-3.4e38 -> -65504)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w")
    mask = numpy_helper.from_array(np.where(np.tri(8, dtype=bool), 0, np.finfo(np.float32).min).astype(np.float32),
                                   "mask")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
         helper.make_node("Add", ["h", "mask"], ["y"], name="masked")],
        "masked", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 8])], initializer=[w, mask])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("backend, compute, rtol", [
    ("TorchBackend", "bfloat16", 5e-2), ("JaxBackend", "float16", 1e-2), ("NumpyBackend", "float64", 1e-3)])
def test_validate_holds_a_converted_model_to_its_compute_dtype(backend, compute, rtol):
    """A float32 file on a float16/bfloat16/float64 backend runs in that dtype (the precision pass),
    its outputs float32 as onnxruntime's, within the coarser dtype's tolerance; the per-node search
    compares the clamped mask as the dtype holds it, and finds no divergence."""
    if backend != "NumpyBackend":
        pytest.importorskip("torch" if backend == "TorchBackend" else "jax")
    b = getattr(ml, backend)(dtype=getattr(ml, compute))
    report = ml.validate(_masked_model(), b, per_node=True)
    (out,) = report.outputs
    assert report.passed, str(report)
    assert (out.dtype, out.rtol) == ("float32", rtol)
    assert report.first_divergence[b.name] is None
    if compute != "float64":
        assert out.max_abs_err > 1e-5  # it did compute in the half type


def test_relative_error_is_against_the_outputs_scale():
    """An output with zeros in it (a ReLU's, a detector's score map) gets a relative error against
    its largest magnitude, not a division by each zero: 1e-6 off on values up to 2 is 5e-7."""
    from mithril.validate import compare

    ref = np.array([0.0, 0.0, 1.0, -2.0], np.float32)
    got = ref + np.array([1e-6, 0.0, 0.0, 0.0], np.float32)
    row = compare("y", "numpy", got, ref)
    assert row.passed and row.max_abs_err == pytest.approx(1e-6, rel=1e-3)
    assert row.max_rel_err == pytest.approx(5e-7, rel=1e-3)
    assert compare("y", "numpy", ref, ref).max_rel_err == 0.0
    zeros = np.zeros(3, np.float32)
    assert compare("y", "numpy", zeros, zeros).max_rel_err == 0.0
    assert compare("y", "numpy", zeros + 1, zeros).max_rel_err == float("inf")
