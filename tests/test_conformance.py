"""The ONNX backend test suite on NumPy: no case recorded as passing may regress.

The record is docs/conformance.json, written by `python scripts/conformance.py --backend numpy`.
"""

import os

import pytest

from mithril import conformance


@pytest.fixture(scope="module")
def numpy_results():
    return {r.name: r for r in conformance.run_suite("numpy", jobs=os.cpu_count() or 1, progress=False)}


def test_no_recorded_pass_regresses(numpy_results):
    record = conformance.load_record()["backends"]["numpy"]["cases"]
    recorded_pass = {n for n, c in record.items() if c["status"] == "pass"}
    regressed = {n: numpy_results[n].reason for n in recorded_pass if n in numpy_results
                 and numpy_results[n].status != "pass"}
    assert not regressed, f"{len(regressed)} case(s) passed before and fail now: {regressed}"
    now_pass = sum(r.status == "pass" for r in numpy_results.values())
    assert now_pass >= len(recorded_pass)


def test_node_pass_count_meets_target(numpy_results):
    node_pass = sum(r.status == "pass" for r in numpy_results.values() if r.kind == "node")
    assert node_pass >= 1780, f"NumPy passes {node_pass} of the node cases; the target is 1,780"


def test_every_failure_has_a_reason(numpy_results):
    documented = conformance.expected_failures("numpy")
    silent = [n for n, r in numpy_results.items() if r.status != "pass" and not (r.reason or documented.get(n))]
    assert not silent


def test_expected_failure_entries_are_not_stale(numpy_results):
    documented = conformance.expected_failures("numpy")
    stale = [n for n in documented if n in numpy_results and numpy_results[n].status == "pass"]
    assert not stale, f"expected-failure entries that now pass (remove them): {stale}"
    unknown = [n for n in documented if n not in numpy_results]
    assert not unknown, f"expected-failure entries naming no case: {unknown}"
