"""tests/design/README.md indexes the design documents' 87 examples: each row names tests that
must exist here, or the issue an example belongs to."""

from __future__ import annotations

import ast
import re
from pathlib import Path

HERE = Path(__file__).parent


def index_rows() -> list[tuple[str, str]]:
    rows = []
    for line in (HERE / "README.md").read_text().splitlines():
        m = re.match(r"\| (00\d #\d\d) \| [^|]+ \| (.+) \|$", line)
        if m:
            rows.append((m.group(1), m.group(2)))
    return rows


def defined_tests() -> set[str]:
    names = set()
    for path in HERE.glob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                names.add(f"{path.stem}::{node.name}")
    return names


def test_every_example_has_a_row():
    examples = [e for e, _ in index_rows()]
    counts = {"000": 13, "001": 14, "002": 7, "003": 19, "004": 34}
    assert len(examples) == len(set(examples)) == sum(counts.values())
    for doc, count in counts.items():
        assert sorted(e for e in examples if e.startswith(doc)) == [f"{doc} #{i:02d}" for i in range(1, count + 1)]


def test_every_named_test_exists():
    tests = defined_tests()
    named = [(example, t) for example, cell in index_rows() for t in re.findall(r"test_\w+::test_\w+", cell)]
    missing = [f"{example}: {t}" for example, t in named if t not in tests]
    assert not missing, missing


def test_rows_without_tests_say_why():
    for example, cell in index_rows():
        if not re.search(r"test_\w+::test_\w+", cell):
            assert re.search(r"issues? \d+|no Mithril call|no code", cell), (example, cell)
