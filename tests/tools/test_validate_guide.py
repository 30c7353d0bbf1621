"""docs/validate.md runs as written: its commands in order, in one empty folder, each with the exit
status below and printing on stdout what the page shows; then its JSON excerpt and Python block.

A ``console`` block holds ``$ COMMAND`` lines, each followed by its output; a ``...`` line in an
output stands for lines left out. ``mithril`` commands run in this process (``mithril.cli.main``),
the example script in a subprocess. Figures are compared exactly, but in a table row of a float32
run against onnxruntime, whose last bits follow the BLAS's summation order on the machine, only
their being numbers is; so that such a row may widen its columns, runs of spaces and of rules
count as one.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from mithril.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "validate.md"

# Each command the guide shows -> its exit status (validate: 1 when an output is out of tolerance).
EXIT_STATUS = {
    "python examples/validate_walkthrough.py --out block.onnx": 0,
    "mithril validate block.onnx --backend numpy,numpy:dtype=float16": 1,
    "mithril validate block.onnx --backend numpy:dtype=float16,numpy:dtype=bfloat16 --reference numpy:dtype=float64": 1,
    "mithril validate block.onnx --backend numpy:dtype=float16 --per-node --json run.json --report page.html": 1,
    "mithril reduce block.onnx --backend numpy:dtype=float16": 0,
    "mithril validate block.reduced.onnx --backend numpy:dtype=float16 --load-inputs block.reduced.npz": 1,
    "python examples/validate_walkthrough.py --norm fused --out fused.onnx": 0,
    "mithril validate fused.onnx --backend numpy:dtype=float16": 0,
    "mithril validate block.onnx --save-inputs run/inputs.npz --save-outputs run/outputs.npz": 0,
    ("mithril validate block.onnx --backend numpy:dtype=float16 --load-inputs run/inputs.npz "
     "--load-outputs run/outputs.npz"): 1,
}
# What the folder holds at the end: the files the commands' arguments ask for, nothing else.
WRITTEN = {"block.onnx", "fused.onnx", "run.json", "page.html", "block.reduced.onnx", "block.reduced.npz",
           "run/inputs.npz", "run/outputs.npz"}

NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[+-]?\d+)?")
# A table row of the float32 NumPy backend (no dtype option): its figures vary with the machine's BLAS.
MACHINE_DEPENDENT_ROW = re.compile(r"│ numpy │")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def guide_sessions() -> list[tuple[str, list[str]]]:
    """Each ``$ command`` of the guide's console blocks, in order, with the output lines it shows."""
    sessions: list[tuple[str, list[str]]] = []
    for block in re.findall(r"```console\n(.*?)```", GUIDE.read_text(), re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                sessions.append((line[2:].strip(), []))
            else:
                assert sessions, f"output before any command in a console block: {line!r}"
                sessions[-1][1].append(line.rstrip())
    return sessions


def line_matches(shown: str, printed: str) -> bool:
    # Column widths follow the widest cell, a machine-dependent one too: runs of spaces and rules count as one.
    shown, printed = (re.sub(r"([ ━─])\1+", r"\1", line) for line in (shown, printed))
    if not MACHINE_DEPENDENT_ROW.match(shown):
        return shown == printed
    return re.fullmatch(NUMBER.sub(lambda _: "\0", re.escape(shown)).replace("\0", NUMBER.pattern),
                        printed) is not None


def assert_shows(command: str, shown: list[str], printed: list[str]) -> None:
    """``printed`` is ``shown``, line for line, a ``...`` line standing for any lines."""
    i, skipping = 0, False
    for line in shown:
        if line == "...":
            skipping = True
            continue
        while skipping and i < len(printed) and not line_matches(line, printed[i]):
            i += 1
        assert i < len(printed) and line_matches(line, printed[i]), (
            f"{command}: the guide shows\n{line}\nbut the command printed\n" + "\n".join(printed))
        i, skipping = i + 1, False
    assert skipping or i == len(printed), f"{command}: printed more than the guide shows:\n" + "\n".join(printed[i:])


def run(command: str, cwd: Path, capsys) -> tuple[int, list[str]]:
    argv = shlex.split(command)
    if argv[0] == "python":
        proc = subprocess.run([sys.executable, str(ROOT / argv[1]), *argv[2:]], cwd=cwd, capture_output=True,
                              text=True, timeout=120)
        return proc.returncode, proc.stdout.splitlines()
    assert argv[0] == "mithril", f"the guide runs python or mithril, not {command!r}"
    capsys.readouterr()
    status = cli_main(argv[1:])
    return status, ANSI.sub("", capsys.readouterr().out).splitlines()


def contains(whole, part) -> bool:
    """``part`` is in ``whole``: a dict's keys with values contained, a list's first items, floats
    to the 3 significant figures the guide prints, anything else equal."""
    if isinstance(part, dict):
        return isinstance(whole, dict) and all(k in whole and contains(whole[k], v) for k, v in part.items())
    if isinstance(part, list):
        return isinstance(whole, list) and len(part) <= len(whole) and all(map(contains, whole, part))
    if isinstance(part, float) and isinstance(whole, float):
        return math.isclose(whole, part, rel_tol=5e-3)
    return whole == part and type(whole) is type(part)


def test_the_guide_shows_the_tested_commands():
    assert [c for c, _ in guide_sessions()] == list(EXIT_STATUS)


@pytest.mark.numpy
@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # the failure the guide follows
def test_the_guide_runs_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for command, shown in guide_sessions():
        status, printed = run(command, tmp_path, capsys)
        assert status == EXIT_STATUS[command], f"{command}: exit {status}\n" + "\n".join(printed)
        assert_shows(command, shown, printed)
    assert {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()} == WRITTEN

    text = GUIDE.read_text()
    (excerpt,) = re.findall(r"```json\n(.*?)```", text, re.S)
    report = json.loads((tmp_path / "run.json").read_text())
    assert contains(report, json.loads(excerpt)), "run.json differs from the guide's excerpt of it"
    page = (tmp_path / "page.html").read_text()
    assert "first divergent node &#x27;norm/Pow&#x27; (Pow)" in page and page.count("data:image/png;base64,") == 1

    (block,) = re.findall(r"```python\n(.*?)```", text, re.S)
    exec(compile(block, "docs/validate.md#the-same-in-python", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out == [c.split("# ", 1)[1] for c in block.splitlines() if c.startswith("print(")], out
