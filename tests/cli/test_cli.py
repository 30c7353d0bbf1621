"""The command line keeps its word (issue 17, "Honest commands"): a failure exits non-zero, bad
arguments are one clear line without a traceback, nothing is written into the checkout unless asked
(--write-docs), tables keep every figure in a pipe, long work shows progress, `python -m mithril` works.
"""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import mithril as ml
from mithril import conformance
from mithril.backends.table import BACKENDS
from mithril.cli import main

from tests.conftest import make_model

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "reports" / "conformance.json", ROOT / "docs" / "conformance.md"]


def run(*args, cwd):
    """``python -m mithril ARGS`` in a subprocess, stdout and stderr piped (not a terminal)."""
    return subprocess.run([sys.executable, "-m", "mithril", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)


@pytest.fixture
def docs_untouched():
    """The tracked reports/conformance.json and docs/conformance.md are byte for byte the same after the test."""
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in DOCS}
    yield
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in DOCS} == before


def one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert lines[0].startswith("mithril: error: "), stderr
    return lines[0].removeprefix("mithril: error: ")


# -- python -m mithril, --help ------------------------------------------------------------------
def test_python_dash_m_mithril_prints_help_with_exit_statuses(tmp_path):
    proc = run("--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: mithril ")
    for line in ("0    success", "1    a check failed", "2    a usage or input error", "3    an internal error",
                 "130  interrupted"):
        assert line in proc.stdout


# -- conformance ------------------------------------------------------------------------------
def test_conformance_unknown_backend_fails_before_running(tmp_path, docs_untouched):
    # Run from another folder, as the issue did: nothing runs, nothing is written.
    proc = run("conformance", "--backend", "bogus", cwd=tmp_path)
    assert proc.returncode == 2
    assert one_error_line(proc.stderr) == "unknown backend 'bogus'; choose from " + ", ".join(BACKENDS)
    assert proc.stdout == "" and list(tmp_path.iterdir()) == []


def test_conformance_script_is_the_same_command(tmp_path, docs_untouched):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "conformance.py"), "--backend", "numpy,bogus"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2
    assert one_error_line(proc.stderr).startswith("unknown backend 'bogus'")


def _case(name, node, x, expected):
    model = make_model([node], [("x", TensorProto.FLOAT, list(x.shape))], [("y", TensorProto.FLOAT, list(x.shape))])
    return SimpleNamespace(name=name, model=model, data_sets=[([x], [expected])], rtol=1e-3, atol=1e-7)


@pytest.fixture
def two_cases(monkeypatch):
    """The node suite replaced by two hand-made cases: Relu (passes) and Abs whose expected output
    is wrong by 1 (fails)."""
    x = np.array([[-1.0, 2.0, -3.0]], np.float32)
    cases = {"test_fake_relu": _case("test_fake_relu", helper.make_node("Relu", ["x"], ["y"]), x, np.maximum(x, 0)),
             "test_fake_abs_wrong": _case("test_fake_abs_wrong", helper.make_node("Abs", ["x"], ["y"]), x,
                                          np.abs(x) + 1)}
    monkeypatch.setattr(conformance, "_NODE_CASES", cases)
    return ["conformance", "--backend", "numpy", "-j", "1", "--no-models"]


def test_conformance_failing_case_exits_1(two_cases, capsys, docs_untouched):
    assert main([*two_cases, "--expected-failures", "none"]) == 1
    out, err = capsys.readouterr()
    assert "FAIL         test_fake_abs_wrong  AssertionError: output 'y': values differ (max abs err 1" in out
    assert "numpy: 1 passed, 1 failed, 0 unsupported (node cases: 1 / 2); 0 expected failure(s), 1 unexpected" in out
    assert "test_fake_relu" not in out
    # Not a terminal: plain progress lines on stderr.
    assert "numpy conformance: 2/2 cases, 1 passed" in err


def test_conformance_expected_failure_exits_0_and_names_stale_entries(two_cases, tmp_path, capsys, docs_untouched):
    (tmp_path / "lists.py").write_text('NUMPY = {"test_fake_abs_wrong": "wrong on purpose",\n'
                                       '         "test_fake_relu": "an entry whose case now passes"}\n')
    assert main([*two_cases, "--expected-failures", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "1 expected failure(s), 0 unexpected" in out
    assert f"numpy: 1 expected failure(s) now pass (remove them from {tmp_path}): test_fake_relu" in out


def test_conformance_output_is_this_runs_json(two_cases, tmp_path, capsys, docs_untouched):
    path = tmp_path / "run.json"
    assert main([*two_cases, "-k", "relu", "--output", str(path)]) == 0
    record = json.loads(path.read_text())
    assert record["backends"]["numpy"]["cases"] == {
        "test_fake_relu": {"kind": "node", "ops": ["Relu"], "reason": "", "status": "pass"}}
    assert record["backends"]["numpy"]["unexpected_failures"] == []
    assert f"wrote {path}" in capsys.readouterr().out


@pytest.mark.parametrize("pattern, message", [("zzz", "-k 'zzz' matches no case"),
                                              ("(", "-k '(' is not a regular expression: missing ), ")])
def test_conformance_bad_filter_is_one_line(two_cases, pattern, message, capsys, docs_untouched):
    assert main([*two_cases, "-k", pattern]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(message)


def test_conformance_write_docs_merges_a_filtered_run(two_cases, tmp_path, monkeypatch, capsys):
    docs, reports = tmp_path / "docs", tmp_path / "reports"
    docs.mkdir()
    reports.mkdir()
    (reports / "conformance.json").write_text(json.dumps({"onnx_version": "0", "backends": {"numpy": {"cases": {
        "test_other": {"kind": "node", "ops": ["Neg"], "reason": "", "status": "pass"}}}}}))
    monkeypatch.setattr(conformance, "DOCS", docs)
    monkeypatch.setattr(conformance, "REPORTS", reports)
    assert main([*two_cases, "-k", "relu", "--write-docs"]) == 0
    cases = json.loads((reports / "conformance.json").read_text())["backends"]["numpy"]["cases"]
    assert sorted(cases) == ["test_fake_relu", "test_other"]  # -k updates only the cases that ran
    assert "| Relu | 1 / 1 |" in (docs / "conformance.md").read_text()
    assert "(numpy: 1 case(s) updated)" in capsys.readouterr().out


def test_conformance_write_docs_outside_a_checkout_is_refused(two_cases, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(conformance, "REPO", tmp_path)
    assert main([*two_cases, "--write-docs"]) == 2
    assert one_error_line(capsys.readouterr().err).endswith("is not one (this is an installed package): use --output FILE")


# -- validate: arguments ----------------------------------------------------------------------
@pytest.fixture
def relu_file(tmp_path):
    path = tmp_path / "relu.onnx"
    onnx.save(make_model([helper.make_node("Relu", ["input"], ["y"])], [("input", TensorProto.FLOAT, ["N", 3, 4])],
                         [("y", TensorProto.FLOAT, ["N", 3, 4])]), path)
    return str(path)


@pytest.mark.parametrize("args, message", [
    (["--shape", "inpt=2,3,4"], "--shape: the model has no input 'inpt'; its inputs: input (did you mean 'input'?)"),
    (["--input", "inpt=x.npy"], "--input: the model has no input 'inpt'; its inputs: input (did you mean 'input'?)"),
    (["--shape", "input=1,3,x"], "--shape input=1,3,x: dims must be integers separated by commas"),
    (["--shape", "input"], "--shape expects NAME=VALUE, got 'input'"),
    (["--shape", "input=2,5,4"], "--shape input: shape [2, 5, 4] has 5 at dim 1; the model's input 'input' is [N, 3, 4]"),
    (["--shape", "input=2,3"], "--shape input: shape [2, 3] has rank 2; the model's input 'input' has rank 3: [N, 3, 4]"),
    (["--input", "input=missing.npy"], "--input input=missing.npy: cannot read a .npy array: no such file"),
    (["--backend", "bogus"], "unknown backend 'bogus'; choose from " + ", ".join(BACKENDS) + " or 'all'"),
    (["--dtype", "half"], "--dtype half: choose from float16, bfloat16, float32, float64"),
    (["--backend", "numpy:bogus=1"], "'numpy:bogus=1': NumpyBackend has no option 'bogus'; valid options: dtype, "
                                     "device, num_threads, device_mesh"),
    (["--reference", "bogus:x=1"], "unknown backend 'bogus' in 'bogus:x=1'; choose onnxruntime or one of "
                                   + ", ".join(BACKENDS)),
    (["--atol", "y=abc"], "--atol y=abc: expected a number or NAME=NUMBER"),
    (["--rtol", "yy=1e-3"], "rtol: the model has no output or value 'yy'; its outputs: y (did you mean 'y'?)"),
    (["--load-outputs", "o.npz", "--per-node"],
     "--per-node needs a reference that runs: --load-outputs holds only the model's outputs"),
    (["--load-inputs", "saved"], "inputs file saved: no such folder"),
    (["--per-node-memory", "0"], "--per-node-memory 0: a number of MiB above 0"),
])
def test_validate_bad_arguments_are_one_line(relu_file, args, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["validate", relu_file, *args]) == 2
    out, err = capsys.readouterr()
    assert one_error_line(err) == message and out == ""


def test_validate_input_of_the_wrong_dtype_is_one_line(relu_file, tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.zeros((2, 3, 4)))
    assert main(["validate", relu_file, "--input", f"input={tmp_path / 'x.npy'}"]) == 2
    assert one_error_line(capsys.readouterr().err) == "--input input: a float64 array; the model's input 'input' is float32"


def test_validate_bad_arguments_in_a_subprocess_have_no_traceback(relu_file, tmp_path):
    proc = run("validate", relu_file, "--shape", "input=1,3,x", cwd=tmp_path)
    assert proc.returncode == 2
    assert one_error_line(proc.stderr) == "--shape input=1,3,x: dims must be integers separated by commas"


def test_library_validate_refuses_unknown_names_like_compile(relu_file):
    with pytest.raises(ml.errors.InputError, match=r"shapes: the model has no input 'inpt'; its inputs: input"):
        ml.validate(relu_file, ml.NumpyBackend(), shapes={"inpt": [2, 3, 4]})


# -- validate: --backend all, failures, progress, tables ----------------------------------------
def test_validate_all_reports_every_backend_that_can_run_float64(tmp_path, capsys):
    path = tmp_path / "f64.onnx"
    onnx.save(make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", TensorProto.DOUBLE, [2, 3])],
                         [("y", TensorProto.DOUBLE, [2, 3])]), path)
    assert main(["validate", str(path), "--backend", "all"]) == 0
    out = capsys.readouterr().out
    rows = [line.split("│")[1].strip() for line in out.splitlines() if line.count("│") > 2]
    installed = [b for b, entry in BACKENDS.items() if entry.installed()]
    # MLX has no float64: it is listed with its reason and the others still report.
    assert rows == [b for b in installed if b != "mlx"]
    if "mlx" in installed:
        assert "mlx: not run: MlxBackend cannot hold float64" in out
    else:
        assert "mlx: not run: not installed (no mlx package)" in out
    assert "all outputs pass" in out


def test_validate_dtype_runs_a_float32_file_in_that_dtype(tmp_path, capsys):
    """--dtype float64 converts the float32 file (the precision pass); outputs stay float32 as
    onnxruntime's and the float32 tolerance (the coarser) applies."""
    path = tmp_path / "tanh.onnx"
    onnx.save(make_model([helper.make_node("Tanh", ["x"], ["y"])], [("x", TensorProto.FLOAT, [2, 3])],
                         [("y", TensorProto.FLOAT, [2, 3])]), path)
    assert main(["validate", str(path), "--dtype", "float64", "--no-progress"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.count("│") > 2 and "numpy" in line)
    assert "float32" in row and "0.001 / 0.0001" in row and "pass" in row


def test_validate_no_backend_can_run_the_model_is_an_error(tmp_path, monkeypatch, capsys):
    import mithril.cli as cli

    monkeypatch.setattr(cli, "make_runners", lambda spec, dtype=None: ([], {"numpy": "switched off for the test"}))
    path = tmp_path / "relu.onnx"
    onnx.save(make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", TensorProto.FLOAT, [2])],
                         [("y", TensorProto.FLOAT, [2])]), path)
    assert main(["validate", str(path), "--backend", "all", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert one_error_line(err) == "no backend could run the model: numpy: switched off for the test"


@pytest.fixture
def wrong_sigmoid():
    """A NumPy Sigmoid that is wrong by 1e-2, registered for the test only."""
    from mithril.backends.registry import REGISTRY, override

    @override("numpy", "Sigmoid", since=13)
    def bad_sigmoid(x, *, xp):
        return (1 / (1 + xp.exp(-x)) + 1e-2).astype(x.dtype)

    yield
    REGISTRY.unregister("numpy", "Sigmoid", 13)


def test_validate_per_node_shows_progress_and_exits_1(tmp_path, conv_model, wrong_sigmoid, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(conv_model, path)
    assert main(["validate", str(path), "--shape", "x=2,4,8,8", "--per-node"]) == 1
    out, err = capsys.readouterr()
    assert "numpy: first divergent node 'sig' (Sigmoid)" in out and "validation failed" in out
    assert "numpy per-node: 4 values in 1 chunk(s) of at most 512 MiB, against onnxruntime" in err
    assert "numpy per-node: chunk 1/1: values 1-4 of 4 (0.0 MiB), up to node 'gap' (ReduceMean)" in err
    assert "numpy per-node: node 'sig' (Sigmoid) leaves tolerance; running it alone" in err


def test_validate_table_keeps_every_figure_in_a_pipe(tmp_path):
    # A long output name and path make the table wider than 80 columns: a pipe (or a CI log)
    # must still get every figure in full, not "1.58e-…".
    name = "a_long_output_name_that_makes_the_table_wider_than_a_terminal"
    rng = np.random.default_rng(0)
    w = rng.standard_normal((256, 64)).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Tanh", ["h"], [name])],
                       [("x", TensorProto.FLOAT, [16, 256])], [(name, TensorProto.FLOAT, [16, 64])], {"W": w})
    path = tmp_path / "a_model_file_with_a_long_name_too.onnx"
    onnx.save(model, path)
    proc = run("validate", str(path), "--backend", "numpy", "--seed", "3", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (row,) = ml.validate(str(path), ml.NumpyBackend(), seed=3).outputs
    for figure in (name, str(path), "[16, 64]", "float32", f"{row.max_abs_err:.3g}", f"{row.max_rel_err:.3g}",
                   "0.001 / 0.0001", "tolerance (rtol/atol)", "worst element (got / ref)", "p99 ulp"):
        assert figure in proc.stdout, (figure, proc.stdout)
    # the row is one line, every figure of it whole: nothing folded onto a next line
    (line,) = [line for line in proc.stdout.splitlines() if name in line]
    for figure in ("numpy", "[16, 64]", f"{row.max_abs_err:.3g}", f"{row.max_ulp:.4g}", f"{row.p99_ulp:.4g}",
                   f"{row.mismatches}/{row.elements}", f"{list(row.worst_index)}: {row.worst_got:.6g} / "
                   f"{row.worst_ref:.6g}", "0.001 / 0.0001", "pass"):
        assert figure in line, (figure, line)
    assert len(line) > 200 and "…" not in proc.stdout
    assert "numpy: compiling and running" in proc.stderr


def test_validate_all_a_backend_that_raises_fails_and_the_others_still_report(tmp_path, capsys):
    from mithril.backends.registry import REGISTRY, override

    @override("numpy", "Relu", since=14)
    def broken_relu(x, *, xp):
        raise ValueError("broken on purpose")

    path = tmp_path / "relu.onnx"
    onnx.save(make_model([helper.make_node("Relu", ["x"], ["y"], name="r")], [("x", TensorProto.FLOAT, [2, 3])],
                         [("y", TensorProto.FLOAT, [2, 3])]), path)
    try:
        assert main(["validate", str(path), "--backend", "all", "--no-progress"]) == 1
    finally:
        REGISTRY.unregister("numpy", "Relu", 14)
    out = capsys.readouterr().out
    rows = [line.split("│")[1].strip() for line in out.splitlines() if line.count("│") > 2]
    assert rows == [b for b, entry in BACKENDS.items() if entry.installed() and b != "numpy"]
    (failed,) = [line for line in out.splitlines() if line.startswith("numpy: FAILED: ")]
    assert "node 'r', op Relu" in failed and "broken on purpose" in failed
    assert "validation failed" in out


# -- validate: any two runtimes, saved arrays, reports -------------------------------------------
def test_validate_backend_specs_with_options_against_another_backend(relu_file, capsys):
    assert main(["validate", relu_file, "--shape", "input=2,3,4", "--backend", "numpy:dtype=float64,numpy",
                 "--reference", "numpy:dtype=float64", "--atol", "1e-6", "--atol", "y=0.5", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "Validation against numpy:dtype=float64: " in out
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines() if line.count("│") > 2]
    assert [r[0] for r in rows] == ["numpy:dtype=float64", "numpy"]
    assert all(r[-2] == "0.001 / 0.5" for r in rows)  # the output's own atol over the bare one


def test_validate_saves_then_loads_inputs_and_outputs(relu_file, tmp_path, capsys, monkeypatch):
    """A first run saves its inputs and onnxruntime's outputs to folders; a second, on another
    seed, compares with them and runs no reference at all."""
    saved_in, saved_out = tmp_path / "inputs", tmp_path / "outputs"
    assert main(["validate", relu_file, "--shape", "input=2,3,4", "--seed", "5", "--save-inputs", str(saved_in),
                 "--save-outputs", str(saved_out), "--no-progress"]) == 0
    assert sorted(p.name for p in saved_in.iterdir()) == ["input.npy"]
    assert sorted(p.name for p in saved_out.iterdir()) == ["y.npy"]
    capsys.readouterr()

    import mithril.runners

    def no_reference(*args, **kwargs):
        raise AssertionError("a reference ran")

    monkeypatch.setattr(mithril.runners.OnnxruntimeRunner, "run", no_reference)
    assert main(["validate", relu_file, "--seed", "6", "--load-inputs", str(saved_in), "--load-outputs",
                 str(saved_out), "--no-progress"]) == 0
    assert f"Validation against outputs saved in {saved_out}: " in capsys.readouterr().out
    np.save(saved_out / "y.npy", np.load(saved_out / "y.npy") + 1)
    assert main(["validate", relu_file, "--load-inputs", str(saved_in), "--load-outputs", str(saved_out),
                 "--no-progress"]) == 1
    assert "24/24" in capsys.readouterr().out  # every element out of tolerance


def test_validate_writes_json_and_html_reports(tmp_path, conv_model, wrong_sigmoid, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(conv_model, path)
    report_json, report_html = tmp_path / "r.json", tmp_path / "r.html"
    assert main(["validate", str(path), "--shape", "x=2,4,8,8", "--per-node", "--per-node-memory", "0.001",
                 "--json", str(report_json), "--report", str(report_html)]) == 1
    out, err = capsys.readouterr()
    assert f"report written to {report_json}" in out and f"report written to {report_html}" in out
    assert "numpy per-node: 4 values in 4 chunk(s) of at most 0.001 MiB" in err
    data = json.loads(report_json.read_text())
    assert data["passed"] is False and data["first_divergence"]["numpy"]["node"] == "sig"
    assert [c["value"] for c in data["node_errors"]["numpy"]] == ["c", "s"]  # the search stopped at the Sigmoid
    page = report_html.read_text()
    assert page.count("data:image/png;base64,") == 1 and "first divergent node &#x27;sig&#x27;" in page
