"""The command line with the C backend: validate --backend c against onnxruntime, and the
conformance command counting C strictly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
REAL = ROOT / "tests" / "data" / "real"


def _run(*args, cwd):
    return subprocess.run([sys.executable, "-m", "mithril", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600)


def test_validate_backend_c_passes_on_a_real_file(tmp_path):
    proc = _run("validate", str(REAL / "paddle_cnn.onnx"), "--backend", "c", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "│ c " in proc.stdout and "all outputs pass" in proc.stdout
    assert "Warning" not in proc.stderr  # inference only: no gradient program, no backward fallback warned


def test_conformance_counts_c_strictly(tmp_path):
    out = tmp_path / "c.json"
    proc = _run("conformance", "--backend", "c", "-k", "^test_(relu|cos|bernoulli)$", "--no-models",
                "--no-progress", "--output", str(out), "--expected-failures", "none", cwd=tmp_path)
    results = json.loads(out.read_text())["backends"]["c"]["cases"] if out.exists() else {}
    assert set(results) == {"test_relu", "test_cos", "test_bernoulli"}, proc.stderr
    assert results["test_relu"]["status"] == "pass" and results["test_cos"]["status"] == "pass"
    # An op without a C kernel (a random op: NumPy's generator) is refused (fallback=None), recorded
    # with the node and the reason.
    assert results["test_bernoulli"]["status"] == "unsupported"
    assert "no C kernel" in results["test_bernoulli"]["reason"]
    assert proc.returncode == 1  # an unsupported case not in an expected-failure list
