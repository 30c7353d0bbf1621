"""Every example in examples/ runs as a script with small sizes and reports success."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = {
    "backends_timing.py": (["--model", "lenet", "--batch", "2", "--repeats", "2"], "median run ms"),
    "weight_transfer.py": (["--batch", "2"], "-> onnx"),
    "export_validate.py": (["--model", "gpt", "--seq", "8"], "every backend matches onnxruntime"),
    # two backends keep it quick: whole-ResNet jit compiles on JAX and MLX take ~10 s each
    "onnx_backbone.py": (["--image-size", "32", "--batch", "4", "--steps", "3", "--backends", "numpy,torch"],
                         "onnxruntime agrees: True"),
    "train_lenet_digits.py": (["--backend", "torch", "--epochs", "1"], "onnxruntime agrees: True"),
}


def test_every_example_is_exercised():
    # examples/__init__.py makes the model packages (examples.gpt, examples.t5) importable; it is no script
    scripts = [p.name for p in (ROOT / "examples").glob("*.py") if p.name != "__init__.py"]
    assert sorted(scripts) == sorted(EXAMPLES)


@pytest.mark.parametrize("script", list(EXAMPLES))
def test_example_runs(script):
    if script == "onnx_backbone.py":
        pytest.importorskip("torch", reason="the example exports its backbone from a torch.nn ResNet-18")
    args, expect = EXAMPLES[script]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / script), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert expect in proc.stdout


def test_readme_training_snippet_runs(tmp_path, monkeypatch):
    """The README's Training section is code users paste: it must run as written."""
    pytest.importorskip("torch", reason="the snippet trains on TorchBackend")
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("### Training"):].split("```python", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))
    scope: dict = {}
    exec(compile(block, "README.md#training", "exec"), scope)
    assert len(scope["losses"]) == 8 and (tmp_path / "lenet_train.onnx").exists()


def test_architecture_doc_example_runs(capsys):
    """docs/architecture.md walks Conv from node to generated line; its script must run as written."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    block = doc.split("You can see all of this from Python:", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    exec(compile(block, "docs/architecture.md", "exec"), {})
    out = capsys.readouterr().out
    assert "conv1 mithril/backends/kernels/nn.py:" in out and "(2, 2) (1, 8, 16, 16)" in out
    assert "# Conv 'conv1': mithril/backends/kernels/nn.py:" in out
