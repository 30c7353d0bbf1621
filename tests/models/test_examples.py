"""Every command the docs give for an example runs here, with exactly the documented arguments (the
slow ones, 15-40 s each, in the long tier).

The commands are read from the docs themselves (README.md, docs/*.md, examples/**/*.py and
examples/**/README.md): a documented command without an entry in COMMANDS below fails
test_documented_commands_are_the_tested_ones, and so does an entry the docs no longer show. Each
command runs from an empty working folder with an empty TMPDIR; it must exit 0, print what it
promises, leave only the files its arguments ask for, and change nothing in the repository.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import pytest

ROOT = Path(__file__).resolve().parents[2]

# "python examples/x.py ...", "python3 -m examples.x ...", in a code block, a docstring or a `code span`.
COMMAND = re.compile(r"python3? (?:-m examples\.[\w.]+|examples/[\w/]+\.py)[^\n`]*")


def documented_commands() -> dict[str, set[str]]:
    """Each documented example command (trailing comments dropped) -> the files that show it."""
    files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "examples").rglob("*.py"),
             *(ROOT / "examples").rglob("README.md")]
    found: dict[str, set[str]] = {}
    for f in files:
        for m in COMMAND.finditer(f.read_text()):
            command = " ".join(m.group(0).split("#", 1)[0].split())
            found.setdefault(command, set()).add(str(f.relative_to(ROOT)))
    return found


@dataclass
class Expect:
    prints: list[str]  # regular expressions the standard output must match
    keeps: set[str] = field(default_factory=set)  # files the command's own arguments ask to write in the cwd
    needs: tuple[str, ...] = ()  # modules the example imports beyond the core dependencies
    slow: bool = False  # 15-40 s on a 2-core machine: the long tier runs it


COMMANDS = {
    "python examples/backends_timing.py --model resnet18 --batch 4 --image-size 64 --repeats 5":
        Expect([r"resnet18: input \[4, 3, 64, 64\]", r"median run ms", r"\nnumpy +\d"], slow=True),
    "python examples/weight_transfer.py --source torch":
        Expect([r"torch -> numpy +max \|diff\|", r"torch -> onnx +max \|diff\|"], needs=("torch",)),
    "python examples/export_validate.py --model gpt --out gpt.onnx":
        Expect([r"wrote gpt\.onnx", r"every backend matches onnxruntime"], keeps={"gpt.onnx"}),
    "python examples/onnx_backbone.py --image-size 64 --steps 20":
        Expect([r"trained the head on \w+ for 20 steps", r"onnxruntime agrees: True"], needs=("torch",), slow=True),
    "python examples/distributed_jax.py --steps 10":
        Expect([r"one device: loss", *(rf"{s} +mesh \(.*\): loss curve differs by (\d\.\de-0[5-9]|0\.0e\+00)"
                                       for s in ("data", "fsdp", "tensor", "data\\+tensor", "pipeline"))],
               needs=("jax",), slow=True),
    "python examples/train_lenet_digits.py --backend jax --epochs 15":
        Expect([r"jax: 345 steps", r"onnxruntime agrees: True"], needs=("jax", "sklearn"), slow=True),
    "python examples/validate_walkthrough.py --out block.onnx":
        Expect([r"wrote block\.onnx: 13 nodes, opset 18"], keeps={"block.onnx"}),
    "python examples/validate_walkthrough.py --norm fused --out fused.onnx":
        Expect([r"wrote fused\.onnx: 7 nodes, opset 23"], keeps={"fused.onnx"}),
    "python examples/train_lenet_digits.py --backend torch --epochs 2 --out lenet":
        Expect([r"torch: 46 steps", r"onnxruntime agrees: True"], keeps={"lenet/lenet.safetensors", "lenet/lenet.onnx"},
               needs=("torch", "sklearn")),
}


# Files libraries keep in TMPDIR on purpose, which no example creates or can remove.
LIBRARY_STATE = {
    ".ses": "onnxruntime's telemetry session id (its 1DS SDK, written at import on POSIX)",
    "mlx": "MLX's cache of CPU kernels it compiled (mlx/<version>/cpu/*.so), kept for the next run",
}


def repo_state() -> dict[str, str]:
    """Each file `git status` lists (tracked and changed, or untracked and not ignored) -> its content's hash."""
    listing = subprocess.run(["git", "status", "--porcelain", "-z", "--untracked-files=all"], cwd=ROOT,
                             check=True, capture_output=True).stdout.decode()
    state = {}
    for path in (entry[3:] for entry in listing.split("\0") if len(entry) > 3):
        f = ROOT / path
        state[path] = hashlib.sha256(f.read_bytes()).hexdigest() if f.is_file() else "absent"
    return state


def run_documented(command: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess, Path]:
    """Run a documented command from an empty folder, with an empty TMPDIR; check what it leaves."""
    argv = shlex.split(command)
    assert argv[0] in ("python", "python3") and argv[1].startswith("examples/"), f"not a script command: {command}"
    cwd, tmp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir()
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    before = repo_state()
    proc = subprocess.run([sys.executable, str(ROOT / argv[1]), *argv[2:]], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{command} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    after = repo_state()
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"{command} changed files in the repository: {changed}"
    left_in_tmp = sorted(p.name for p in tmp.iterdir() if p.name not in LIBRARY_STATE)
    assert not left_in_tmp, f"{command} left temporary files: {left_in_tmp[:10]}"
    return proc, cwd


def test_documented_commands_are_the_tested_ones():
    documented = documented_commands()
    assert set(documented) == set(COMMANDS), (
        f"documented but not tested: {sorted(set(documented) - set(COMMANDS))}; "
        f"tested but no longer documented: {sorted(set(COMMANDS) - set(documented))}")


def test_every_example_script_has_a_documented_command():
    # examples/__init__.py makes the model packages (examples.gpt, examples.t5) importable; it is no script
    scripts = {f"examples/{p.name}" for p in (ROOT / "examples").glob("*.py") if p.name != "__init__.py"}
    assert scripts == {shlex.split(c)[1] for c in COMMANDS}


_LONG_EXAMPLE = pytest.mark.long(reason="a documented command of 15-40 s; the fast tier runs the quick ones, "
                                         "onnx_backbone.py in test_failed_check_exits_with_its_reason, and "
                                         "tests/distributed and tests/frontend/test_training.py what the others do")


@pytest.mark.parametrize("command", [pytest.param(c, marks=[pytest.mark.slow, _LONG_EXAMPLE] if e.slow else [])
                                     for c, e in COMMANDS.items()])
def test_documented_command_runs(command, tmp_path):
    expect = COMMANDS[command]
    for module in expect.needs:
        pytest.importorskip(module, reason=f"{command} imports {module}")
    proc, cwd = run_documented(command, tmp_path)
    for pattern in expect.prints:
        assert re.search(pattern, proc.stdout), f"{command}: no {pattern!r} in\n{proc.stdout[-3000:]}"
    kept = {str(p.relative_to(cwd)) for p in cwd.rglob("*") if p.is_file()}
    assert kept == expect.keeps, f"{command} left {sorted(kept)} in its working folder, expected {sorted(expect.keeps)}"
    if "onnx_backbone" in command:
        first, last = map(float, re.search(r"loss (\d+\.\d+) -> (\d+\.\d+)", proc.stdout).groups())
        assert last < 0.6 * first, f"the head's loss should fall well below its start: {first} -> {last}"
    if "--epochs 15" in command:  # the docs promise about 96%
        accuracy = float(re.search(r"test accuracy (\d+\.\d)%", proc.stdout).group(1))
        assert accuracy >= 95.0, accuracy
    for onnx_file in (f for f in expect.keeps if f.endswith(".onnx")):
        onnx.checker.check_model(onnx.load(cwd / onnx_file))


def test_failed_check_exits_with_its_reason(tmp_path):
    """A check that fails says which and why on stderr, with a non-zero exit, and still cleans up."""
    pytest.importorskip("torch", reason="the example exports its backbone from a torch.nn ResNet-18")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    # a negative rate climbs the loss instead of descending it
    args = ["--image-size", "32", "--batch", "4", "--steps", "2", "--lr", "-0.01", "--backends", "torch"]
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "onnx_backbone.py"), *args], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert re.fullmatch(r"onnx_backbone: the head's loss did not go down in 2 steps \(2\.\d+ -> \d+\.\d+, "
                        r"Adam lr -0\.01\); try a smaller --lr\n", proc.stderr), proc.stderr
    assert [p.name for p in tmp.iterdir() if p.name not in LIBRARY_STATE] == []


@pytest.mark.torch
@pytest.mark.jax
@pytest.mark.c
@pytest.mark.ggml
def test_readme_examples_run(tmp_path, monkeypatch, capsys):
    """The README's Python blocks are code users paste: they run in order, as one session, and
    print what their comments say."""
    for module in ("torch", "jax", "ggml"):
        pytest.importorskip(module, reason=f"the README's examples run on every backend but MLX ({module})")
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert len(blocks) == 5, "one example per job: load and run, validate, compose and export, train, deploy"
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))
    scope: dict = {}
    for i, block in enumerate(blocks):
        exec(compile(block, f"README.md#example-{i}", "exec"), scope)
    out = capsys.readouterr().out
    assert out.count("(1, 10)") == 3, out[-2000:]
    assert "pass" in str(scope["report"]) and "fail" not in str(scope["report"])
    first, last = map(float, re.search(r"loss (\d+\.\d+) -> (\d+\.\d+)", out).groups())
    assert last < first and len(scope["losses"]) == 3
    assert {"resnet18.onnx", "mlp.onnx", "resnet18.gguf"} <= {p.name for p in tmp_path.iterdir()}
    assert (tmp_path / "resnet18_c" / "Makefile").exists()


def test_architecture_doc_example_runs(capsys):
    """docs/architecture.md walks Conv from node to generated line; its script must run as written."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    block = doc.split("You can see all of this from Python:", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    exec(compile(block, "docs/architecture.md", "exec"), {})
    out = capsys.readouterr().out
    # NumPy's Conv is its override (depthwise fast path; the shared kernel for the rest).
    assert "conv1 mithril/backends/numpy/overrides.py:" in out and "(2, 2) (1, 8, 16, 16)" in out
    assert "# Conv 'conv1': mithril/backends/numpy/overrides.py:" in out
