"""A short fuzzing run: about 2,000 generated cases (valid graphs, protobuf-field mutations, byte
mutations) through load + compile + evaluate on NumpyBackend in a worker process, compared with
onnxruntime where both run a model. Every case must end as ``ok`` or a MithrilError refusal:
no other exception, no hang, no crash, no mismatch. ``scripts/fuzz.py`` runs the long version.
The GGML target runs its cases on GGMLBackend, where a crash is ggml aborting the process: 300
cases here, 20,000 in the long tier.
"""

from __future__ import annotations

import pytest

pytest.importorskip("hypothesis", reason="the fuzzer draws its cases with hypothesis (the test extra)")

from mithril.testing import fuzz  # noqa: E402

SHORT_RUN_CASES = 2000
SHORT_RUN_SEED = 20261123


def describe(stats: fuzz.FuzzStats) -> str:
    return "\n".join(f"{b.outcome}: {b.signature} x{b.count} (example {b.example}): {b.message[:400]}"
                     for b in stats.bugs.values())


def test_short_fuzz_run_finds_no_bug(tmp_path):
    stats = fuzz.run_fuzz(SHORT_RUN_CASES, seed=SHORT_RUN_SEED, workers=1, time_limit=30.0, failure_dir=tmp_path)
    assert stats.cases == SHORT_RUN_CASES
    for outcome in fuzz.BUG_OUTCOMES:
        assert stats.outcomes[outcome] == 0, f"{stats.outcomes[outcome]} case(s) ended as {outcome}:\n{describe(stats)}"
    # The run exercised every kind and both ends: models that run (and were compared with
    # onnxruntime) and models refused.
    for kind in fuzz.KINDS:
        assert sum(stats.by_kind[kind].values()) > SHORT_RUN_CASES // 4
    assert stats.by_kind["valid"]["ok"] > 0.9 * sum(stats.by_kind["valid"].values())
    assert stats.outcomes["refused"] > 0 and stats.compared > SHORT_RUN_CASES // 4


# -- the GGML target (issue 57, Must 1): no case may abort the interpreter ----------------------
GGML_SHORT_CASES = 300
GGML_LONG_CASES = 20_000
GGML_SEED = 20261207


def _ggml_run(tmp_path, cases: int) -> fuzz.FuzzStats:
    pytest.importorskip("ggml", reason="GGMLBackend needs ggml-python (installed by scripts/dev.sh)")
    stats = fuzz.run_fuzz(cases, seed=GGML_SEED, workers=2, time_limit=60.0, failure_dir=tmp_path, backend="ggml")
    assert stats.cases == cases
    # An abort (GGML_ASSERT: SIGABRT) kills its worker: a crash. None, nor a hang or an exception
    # outside Mithril's errors, nor a result other than onnxruntime's.
    for outcome in fuzz.BUG_OUTCOMES:
        assert stats.outcomes[outcome] == 0, f"{stats.outcomes[outcome]} case(s) ended as {outcome}:\n{describe(stats)}"
    assert stats.aborts == 0
    # The cases ran on ggml and were compared (not all refused), mutated files were refused too.
    assert stats.by_kind["valid"]["ok"] > 0.9 * sum(stats.by_kind["valid"].values())
    assert stats.outcomes["refused"] > 0 and stats.compared > cases // 4
    return stats


def test_short_ggml_fuzz_run_has_no_abort(tmp_path):
    """A few hundred generated graphs and mutated files on GGMLBackend (the GGML ops of
    fuzz.GGML_OPS among them: oversized and grouped Convs, long recurrences, indices computed in
    the graph, NaN in TopK, negative epsilons), each in a worker process."""
    _ggml_run(tmp_path, GGML_SHORT_CASES)


@pytest.mark.long(reason="20,000 GGML cases (~10 min on two workers); the fast tier runs 300")
def test_long_ggml_fuzz_run_has_no_abort(tmp_path):
    _ggml_run(tmp_path, GGML_LONG_CASES)


def test_watchdog_replaces_hung_and_crashed_workers(tmp_path):
    valid = fuzz.generate_cases(1, seed=0, kinds=("valid",))[0]
    source = [("valid", fuzz.SELF_TEST_HANG), ("valid", fuzz.SELF_TEST_CRASH), valid]
    stats = fuzz.run_fuzz(len(source), workers=1, time_limit=3.0, failure_dir=tmp_path, source=source)
    assert (stats.outcomes["hang"], stats.outcomes["crash"], stats.outcomes["ok"]) == (1, 1, 1)
    assert stats.restarts == 2
    crash = next(b for b in stats.bugs.values() if b.outcome == "crash")
    assert "exit code -6" in crash.signature  # SIGABRT, reported by the replaced worker's pipe
