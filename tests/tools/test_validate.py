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


# -- any two runtimes ----------------------------------------------------------------------------
def test_the_reference_can_be_another_backend(conv_model, perturbed_sigmoid):
    """NumPy against Torch: the per-node search runs Torch as the reference, and the isolated re-run
    feeds the node Torch's inputs."""
    pytest.importorskip("torch")
    report = ml.validate(conv_model, ml.NumpyBackend(), shapes={"x": [2, 4, 8, 8]}, per_node=True, reference="torch")
    assert report.reference == "torch" and not report.passed
    assert "Validation against torch: " in report.table().title
    first = report.first_divergence["numpy"]
    assert (first.node, first.reference, first.local_error) == ("sig", "torch", True)
    assert "the node alone, on torch's inputs, diverges" in first.describe()


def test_a_backend_spec_with_options_is_a_reference():
    model = _named_model()
    report = ml.validate(model, ml.NumpyBackend(), reference="numpy:dtype=float64")
    assert report.reference == "numpy:dtype=float64" and report.passed
    # float64 computes the float32 file more exactly than float32: the outputs differ by rounding only
    assert all(o.max_abs_err < 1e-5 for o in report.outputs)


def _named_model() -> onnx.ModelProto:
    """Names a file system cannot hold: an input 'enc/in:0' and two outputs with '/' and ':'."""
    from onnx import TensorProto, helper

    from tests.conftest import make_model

    nodes = [helper.make_node("Tanh", ["enc/in:0"], ["enc/out:0"], name="tanh"),
             helper.make_node("Relu", ["enc/in:0"], ["dec/relu:1"], name="relu")]
    return make_model(nodes, [("enc/in:0", TensorProto.FLOAT, [3, 5])],
                      [("enc/out:0", TensorProto.FLOAT, [3, 5]), ("dec/relu:1", TensorProto.FLOAT, [3, 5])])


@pytest.mark.parametrize("suffix", [".npz", ""])
def test_saved_inputs_and_outputs_round_trip_and_replace_the_reference(tmp_path, suffix):
    """A run saves its inputs and onnxruntime's outputs (one .npz, or a folder of NAME.npy with the
    names percent-encoded); a later run loads both and compares with the saved outputs without
    running a reference: an output altered on disk fails by exactly the alteration."""
    from mithril.array_files import load_arrays, save_arrays

    model = _named_model()
    inputs_path, outputs_path = tmp_path / f"inputs{suffix}", tmp_path / f"outputs{suffix}"
    first = ml.validate(model, ml.NumpyBackend(), seed=7, save_inputs=inputs_path, save_outputs=outputs_path)
    assert first.passed
    if not suffix:
        assert sorted(p.name for p in outputs_path.iterdir()) == ["dec%2Frelu%3A1.npy", "enc%2Fout%3A0.npy"]
    saved_in, saved_out = load_arrays(inputs_path), load_arrays(outputs_path)
    assert list(saved_in) == ["enc/in:0"] and sorted(saved_out) == ["dec/relu:1", "enc/out:0"]
    np.testing.assert_array_equal(saved_in["enc/in:0"], first.inputs["enc/in:0"])

    again = ml.validate(model, ml.NumpyBackend(), seed=99, load_inputs=inputs_path, load_outputs=outputs_path)
    assert again.passed and again.reference == f"outputs saved in {outputs_path}"
    np.testing.assert_array_equal(again.inputs["enc/in:0"], saved_in["enc/in:0"])  # not seed 99's

    saved_out["enc/out:0"] = saved_out["enc/out:0"] + np.float32(0.25)
    altered = tmp_path / "altered.npz"
    save_arrays(altered, saved_out)
    report = ml.validate(model, ml.NumpyBackend(), load_inputs=inputs_path, load_outputs=altered)
    row = next(o for o in report.outputs if o.name == "enc/out:0")
    assert not row.passed and row.max_abs_err == pytest.approx(0.25) and row.mismatches == 15


def test_loading_arrays_that_do_not_fit_the_model_names_the_array(tmp_path):
    from mithril.array_files import save_arrays

    model = _named_model()
    x = np.ones((3, 5), np.float32)
    y = {"enc/out:0": np.tanh(x), "dec/relu:1": x}
    cases = [
        ("load_inputs", {"enc/in:0": x, "extra": x}, r"inputs file .*: the model has no input 'extra'"),
        ("load_inputs", {}, r"inputs file .*: no array for input 'enc/in:0'; it holds: nothing"),
        ("load_inputs", {"enc/in:0": np.ones((3, 4), np.float32)},
         r"inputs file .* enc/in:0: shape \[3, 4\] has 4 at dim 1; the model's input 'enc/in:0' is \[3, 5\]"),
        ("load_outputs", {**y, "logits": x}, r"outputs file .*: holds 'logits', not an output of the model"),
        ("load_outputs", {"enc/out:0": y["enc/out:0"]}, r"outputs file .*: no array for output 'dec/relu:1'"),
        ("load_outputs", {**y, "dec/relu:1": np.ones((5, 3), np.float32)},
         r"outputs file .*: output 'dec/relu:1' has shape \[5, 3\]; the model's is \[3, 5\]"),
        ("load_outputs", {**y, "dec/relu:1": np.ones((3, 5))},
         r"outputs file .*: output 'dec/relu:1' is a float64 array; the model's is float32"),
    ]
    for i, (arg, arrays, message) in enumerate(cases):
        path = tmp_path / f"case{i}.npz"
        save_arrays(path, arrays)
        with pytest.raises(ml.errors.InputError, match=message):
            ml.validate(model, ml.NumpyBackend(), **{arg: path})
    with pytest.raises(ml.errors.InputError, match="no such folder"):
        ml.validate(model, ml.NumpyBackend(), load_inputs=tmp_path / "missing")
    with pytest.raises(ml.errors.ValidationError, match="not both"):
        ml.validate(model, ml.NumpyBackend(), reference="onnxruntime", load_outputs=tmp_path / "case0.npz")


# -- metrics -------------------------------------------------------------------------------------
def test_ulp_distance_counts_floats_between_values():
    import ml_dtypes

    from mithril.validate import ulp_distance

    for dtype in (np.float16, ml_dtypes.bfloat16, np.float32, np.float64):
        one = np.array([1.0], dtype)
        assert ulp_distance(one, one)[0] == 0
        up = one.copy()
        for steps in range(1, 4):  # the next float up, step by step, by its own spacing
            up = (up.astype(np.float64) + ml_dtypes.finfo(dtype).eps * 2 ** np.floor(np.log2(up.astype(np.float64))))
            up = up.astype(dtype)
            assert ulp_distance(up, one)[0] == steps, dtype
        tiny = np.array([ml_dtypes.finfo(dtype).smallest_subnormal], dtype)
        # across zero: -tiny .. -0 == +0 .. +tiny is two steps, and -0 is +0
        assert ulp_distance(-tiny, tiny)[0] == 2 and ulp_distance(-tiny * 0, tiny * 0)[0] == 0
        nan = np.array([np.nan], dtype)
        assert ulp_distance(nan, nan)[0] == 0 and ulp_distance(nan, one)[0] == np.inf
    # the largest distance, -max to +max in float64, counts without overflow
    big = np.array([np.finfo(np.float64).max])
    assert ulp_distance(-big, big)[0] == pytest.approx(2.0 * (0x7FEFFFFFFFFFFFFF))


def test_compare_reports_ulps_mismatches_and_the_worst_element():
    from mithril.validate import compare

    ref = np.linspace(-1, 1, 1000, dtype=np.float32).reshape(20, 50)
    got = ref.copy()
    got[:, 0] = np.nextafter(np.nextafter(ref[:, 0], np.float32(9)), np.float32(9))  # 20 elements 2 ulps off
    got[7, 1] += np.float32(0.5)  # out of tolerance
    got[19, 49] += np.float32(2e-3)  # out of tolerance too, but less
    row = compare("y", "numpy", got, ref)
    assert not row.passed and (row.mismatches, row.elements) == (2, 1000)
    assert row.worst_index == (7, 1) and row.worst_ref == float(ref[7, 1]) and row.worst_got == float(got[7, 1])
    assert row.max_abs_err == pytest.approx(0.5, rel=1e-6) and row.max_rel_err == pytest.approx(0.5, rel=1e-6)
    assert row.max_ulp == compare("y", "numpy", got[7:8, 1:2], ref[7:8, 1:2]).max_ulp > 1000
    assert row.p99_ulp == 2.0  # 978 exact, 20 at 2 ulps, 2 far: the 99th percentile is 2
    # per-output tolerance loosens this output only
    assert compare("y", "numpy", got, ref, atol=1.0).passed
    # NaN where the reference has a number: out of tolerance, inf error, the NaN the worst element
    nan = ref.copy()
    nan[0, 0] = np.nan
    row = compare("y", "numpy", nan, ref)
    assert not row.passed and row.max_abs_err == np.inf and row.max_ulp == np.inf and row.worst_index == (0, 0)
    assert row.note == "NaN positions differ"
    both = compare("y", "numpy", nan, nan)
    assert both.passed and both.max_ulp == 0 and both.mismatches == 0


@pytest.mark.parametrize("ref, got, first", [
    (np.array([[1, 2], [3, 4]], np.int64), np.array([[1, 2], [5, 7]], np.int64), (1, 0)),
    (np.array([True, False, True]), np.array([True, True, False]), (1,)),
    (np.array(["a", "b", "c"], object), np.array(["a", "b", "d"], object), (2,)),
])
def test_integers_bools_and_strings_compare_exactly(ref, got, first):
    from mithril.validate import compare

    row = compare("y", "numpy", got, ref)
    assert not row.passed and (row.rtol, row.atol) == (0.0, 0.0)
    assert row.mismatches == int(np.count_nonzero(got != ref)) and row.worst_index == first
    assert (row.worst_got, row.worst_ref) == (got[first], ref[first])
    assert row.max_ulp is None
    assert compare("y", "numpy", ref, ref).passed


def test_tolerance_per_output(conv_model, perturbed_sigmoid):
    """The Sigmoid off by 1e-2 fails the output at the default tolerance; atol={"y": 1.0} lets
    that output pass (and every other value keeps its dtype's tolerance: the per-node search still
    names the Sigmoid); a name that is no value of the model is refused."""
    strict = ml.validate(conv_model, ml.NumpyBackend(), shapes={"x": [2, 4, 8, 8]})
    assert not strict.passed
    loose = ml.validate(conv_model, ml.NumpyBackend(), shapes={"x": [2, 4, 8, 8]}, atol={"y": 1.0}, per_node=True)
    (row,) = loose.outputs
    assert loose.passed and row.atol == 1.0 and row.rtol == 1e-3
    assert loose.first_divergence["numpy"].node == "sig"
    everything = ml.validate(conv_model, ml.NumpyBackend(), shapes={"x": [2, 4, 8, 8]}, atol=1.0, per_node=True)
    assert everything.passed and everything.first_divergence["numpy"] is None
    with pytest.raises(ml.errors.InputError, match=r"atol: the model has no output or value 'yy'.*did you mean 'y'"):
        ml.validate(conv_model, ml.NumpyBackend(), shapes={"x": [2, 4, 8, 8]}, atol={"yy": 1.0})


def test_the_report_as_json_and_html(tmp_path, conv_model, perturbed_sigmoid):
    """to_json writes strict JSON (non-finite figures as strings), every field of every row;
    to_html a page with the table and the per-node plot, the diverging node marked."""
    import base64
    import json
    import re

    report = ml.validate(conv_model, ml.NumpyBackend(), shapes={"x": [2, 4, 8, 8]}, per_node=True)
    report.errors["ghost"] = "a row with an infinite figure follows"
    from mithril.validate import OutputReport

    report.outputs.append(OutputReport("z", "ghost", (2,), "float32", float("inf"), float("nan"), 0.0, 0.0, False))
    report.to_json(tmp_path / "r.json")

    def refuse(constant):
        raise AssertionError(f"not strict JSON: {constant}")

    data = json.loads((tmp_path / "r.json").read_text(), parse_constant=refuse)
    assert data["reference"] == "onnxruntime" and data["passed"] is False
    assert data["inputs"] == {"x": {"shape": [2, 4, 8, 8], "dtype": "float32"}}
    row = data["outputs"][0]
    assert set(row) >= {"name", "backend", "max_abs_err", "max_rel_err", "max_ulp", "p99_ulp", "mismatches",
                        "elements", "worst_index", "worst_got", "worst_ref", "rtol", "atol", "passed"}
    assert data["outputs"][1]["max_abs_err"] == "inf" and data["outputs"][1]["max_rel_err"] == "nan"
    assert data["first_divergence"]["numpy"]["node"] == "sig"
    assert [c["value"] for c in data["node_errors"]["numpy"]] == ["c", "s", "m", "y"]
    assert [c["passed"] for c in data["node_errors"]["numpy"]][:2] == [True, False]

    page = report.to_html(tmp_path / "r.html")
    assert (tmp_path / "r.html").read_text() == page
    assert "Validation against onnxruntime" in page and "first divergent node &#x27;sig&#x27; (Sigmoid)" in page
    (png,) = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page)
    assert base64.b64decode(png).startswith(b"\x89PNG")
    assert f"<td class='num'>{report.outputs[0].max_abs_err:.4g}</td>" in page


# -- first divergence at bounded memory ----------------------------------------------------------
_CHAIN = r'''
import gc, json, sys
import numpy as np
from onnx import TensorProto, helper, numpy_helper
import mithril as ml
from mithril.backends.registry import override

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

nodes, prev = [], "x"
for i in range(40):  # 40 values of 4 MiB: 160 MiB of intermediates in all
    op = "Sin" if i == 30 else ("Relu" if i % 2 == 0 else "Add")
    nodes.append(helper.make_node(op, [prev, "c"] if op == "Add" else [prev], [f"v{i}"], name=f"n{i}"))
    prev = f"v{i}"
graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1024, 1024])],
                          [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1024, 1024])],
                          initializer=[numpy_helper.from_array(np.array(0.01, np.float32), "c")])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
x = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)
out = {}
with ml.scoped_ops():
    @override("numpy", "Sin", since=7)
    def wrong_sin(x, *, xp):  # 1% off: the planted divergence
        return xp.sin(x) * 1.01

    ml.validate(model, ml.NumpyBackend(), inputs={"x": x})  # imports and first compiles, outside the measure
    for label, budget in (("bounded", 16 * 2**20), ("everything", None)):
        gc.collect()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets the peak resident size (VmHWM) to the current one
        base = status("VmRSS:")
        report = ml.validate(model, ml.NumpyBackend(), inputs={"x": x}, per_node=True, memory_budget=budget)
        first = report.first_divergence["numpy"]
        out[label] = {"peak": status("VmHWM:") - base, "node": first.node, "local": first.local_error,
                      "compared": [c.value for c in report.node_errors["numpy"]]}
print(json.dumps(out))
'''


def test_per_node_search_holds_its_memory_budget(tmp_path):
    """40 intermediates of 4 MiB (160 MiB) under a 16 MiB budget: the peak resident memory of the
    search, measured in a fresh process, stays under half the intermediates' total, while the
    same search with no budget (every value at once) goes over the total: the measure sees it.
    The planted 1% error in node n30 is found, a local kernel error, and the search stops at
    the chunk holding it."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    if not os.access("/proc/self/clear_refs", os.W_OK):
        pytest.skip("needs a writable /proc/self/clear_refs (Linux) to reset the peak resident size")
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", _CHAIN], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(root)}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    total = 40 * 4 * 2**20
    bounded, everything = out["bounded"], out["everything"]
    assert bounded["peak"] < total / 2, (bounded["peak"] / 2**20, everything["peak"] / 2**20)
    assert everything["peak"] > total, (bounded["peak"] / 2**20, everything["peak"] / 2**20)
    for run in (bounded, everything):
        assert (run["node"], run["local"]) == ("n30", True)
    assert bounded["compared"][:31] == [f"v{i}" for i in range(31)] and len(bounded["compared"]) < 40
    assert len(everything["compared"]) == 40


def test_chunks_keep_the_values_an_isolated_rerun_needs():
    """Each chunk stays within the budget counting the earlier values its nodes read (the
    isolated re-run is fed them); a value larger than the budget is a chunk alone."""
    from mithril.validate import _chunks, _Value

    values = [_Value(f"v{i}", i, f"n{i}", "Relu", 4, None) for i in range(6)]
    needs = {f"v{i}": [f"v{i - 1}"] for i in range(1, 6)}
    sizes = {f"v{i}": 4 for i in range(6)}
    sizes["v3"] = 100
    chunks = [([v.name for v in chunk], sorted(held), nbytes) for chunk, held, nbytes in _chunks(values, needs, sizes, 12)]
    assert chunks == [(["v0", "v1", "v2"], ["v0", "v1", "v2"], 12), (["v3"], ["v2", "v3"], 104),
                      (["v4"], ["v3", "v4"], 104), (["v5"], ["v4", "v5"], 8)]


def test_module_examples_run():
    """The docstring examples of the validate and array_files modules run as written."""
    import doctest
    import importlib
    import sys

    for name in ("mithril.validate", "mithril.array_files"):
        importlib.import_module(name)
        result = doctest.testmod(sys.modules[name])  # ml.validate is the function: the module by name
        assert result.attempted > 0 and result.failed == 0, name
