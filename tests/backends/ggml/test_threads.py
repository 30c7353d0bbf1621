"""How GGML's threads wait and how many a call uses: libgomp's wait policy as the user leaves it
(ggml/threads.py; each policy asked of libgomp in a fresh process); where its threads spin (the
default), the calls watched by segmented.threads.ThreadGovernor (probe_one): every thread while
calls are fast, one while other processes hold the CPUs, each ggml graph's plan following the
choice; where they sleep at once, every call on every thread.
The governor is driven with made-up call times, so the decisions are exact; nothing is timed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mithril as ml
import models_zoo
from mithril.backends.segmented.threads import ThreadGovernor

ROOT = Path(__file__).resolve().parents[3]


def _calls(gov: ThreadGovernor, seconds: dict, n: int) -> list[int]:
    """Make ``n`` calls, each taking ``seconds[threads]``; the thread count each ran on."""
    used = []
    for _ in range(n):
        threads = gov.begin()
        used.append(threads)
        gov.end(seconds[threads])
    return used


def _governor() -> ThreadGovernor:
    return ThreadGovernor(2, switch="MITHRIL_GGML_ADAPTIVE_THREADS", probe_one=True)


def test_quiet_calls_stay_on_all_threads_after_one_probe(monkeypatch):
    monkeypatch.delenv("MITHRIL_GGML_ADAPTIVE_THREADS", raising=False)
    gov = _governor()
    # two threads 20 ms, one 35 ms: the third call learns one thread's time, the rest use two
    assert _calls(gov, {2: 0.020, 1: 0.035}, 40) == [2, 2, 1] + [2] * 37
    assert gov.best == {2: 0.020, 1: 0.035}


def test_a_machine_busy_from_the_start_moves_to_one_thread(monkeypatch):
    # Every call on two threads equally slow (300 ms): never twice the fastest two-thread call,
    # but slower than one thread's (70 ms), which the probe measured.
    monkeypatch.delenv("MITHRIL_GGML_ADAPTIVE_THREADS", raising=False)
    gov = _governor()
    used = _calls(gov, {2: 0.300, 1: 0.070}, 60)
    assert used[:6] == [2, 2, 1, 2, 2, 1]
    assert used[-20:].count(2) <= 1  # the tries of two threads back off to one in 20 one-thread calls
    without = ThreadGovernor(2, switch="MITHRIL_GGML_ADAPTIVE_THREADS")  # what C does: no probe, no move
    assert _calls(without, {2: 0.300, 1: 0.070}, 20) == [2] * 20


def test_long_calls_hold_one_thread_for_calls_not_only_seconds(monkeypatch):
    monkeypatch.delenv("MITHRIL_GGML_ADAPTIVE_THREADS", raising=False)
    gov = _governor()
    used = _calls(gov, {2: 3.0, 1: 0.5}, 200)  # a neighbour that stays; calls of half a second
    tries = [i for i in range(10, 200) if used[i] == 2]
    gaps = [b - a for a, b in zip(tries, tries[1:])]
    assert gaps and max(gaps) >= ThreadGovernor.HOLD_MAX_CALLS  # HOLD_MAX_S alone would try every call


def test_switch_and_one_thread_turn_it_off(monkeypatch):
    monkeypatch.setenv("MITHRIL_GGML_ADAPTIVE_THREADS", "0")
    assert _calls(_governor(), {2: 0.3, 1: 0.07}, 10) == [2] * 10
    monkeypatch.delenv("MITHRIL_GGML_ADAPTIVE_THREADS")
    passive = ThreadGovernor(2, switch="MITHRIL_GGML_ADAPTIVE_THREADS", probe_one=True, enabled=False)
    assert _calls(passive, {2: 0.3, 1: 0.07}, 10) == [2] * 10
    gov = ThreadGovernor(1, switch="MITHRIL_GGML_ADAPTIVE_THREADS", probe_one=True)
    assert not gov.enabled and _calls(gov, {1: 0.07}, 5) == [1] * 5


class _Fixed:
    """A governor that answers ``threads`` and records the call times it is told."""

    def __init__(self, threads):
        self.threads, self.seconds = threads, []

    def begin(self):
        return self.threads

    def end(self, seconds):
        self.seconds.append(seconds)


def test_each_graph_runs_on_the_governors_choice(monkeypatch):
    pytest.importorskip("ggml", reason="GGMLBackend needs ggml-python (installed by scripts/dev.sh)")
    monkeypatch.delenv("MITHRIL_GGML_ADAPTIVE_THREADS", raising=False)
    model = models_zoo.mlp([16, 8, 4])
    pm = ml.compile(model, ml.GGMLBackend(num_threads=2), shapes={"input": (2, 12)}, inference=True)
    program = pm.program
    gov = program._governor
    from mithril.backends.ggml.threads import waits_passively

    assert (gov.want, gov.enabled, gov.probe_one) == (2, not waits_passively(), True)
    assert all(seg.plan.n_threads == 2 for seg in program.segments)
    params = pm.randomize_params()
    x = np.random.default_rng(0).standard_normal((2, 12)).astype(np.float32)
    want = ml.compile(model, ml.NumpyBackend(), shapes={"input": (2, 12)}, inference=True).evaluate(
        params, {"input": x})["output"]
    for threads in (1, 2, 1):
        program._governor = _Fixed(threads)
        out = pm.evaluate(params, {"input": x})["output"]
        assert all(seg.plan.n_threads == threads for seg in program.segments)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
        assert len(program._governor.seconds) == 1 and program._governor.seconds[0] > 0
    monkeypatch.setenv("MITHRIL_GGML_ADAPTIVE_THREADS", "0")
    off = ml.compile(model, ml.GGMLBackend(num_threads=2), shapes={"input": (2, 12)}, inference=True).program
    assert not off._governor.enabled


_POLICY = """
import os, sys
{before}
from mithril.backends.ggml.threads import waits_passively
import mithril as ml, models_zoo
pm = ml.compile(models_zoo.mlp([4, 2]), ml.GGMLBackend(num_threads=2), shapes={{"input": (1, 3)}}, inference=True)
print(waits_passively(), pm.program._governor.enabled, os.environ.get("OMP_WAIT_POLICY"))
"""


@pytest.mark.parametrize("env, before, want", [
    ({}, "", "False True None"),  # libgomp's default: its threads spin; calls watched
    ({}, "import torch", "False True None"),  # PyTorch's libgomp loaded first: the same
    ({"OMP_WAIT_POLICY": "passive"}, "", "True False passive"),  # the user's choice stands: every call on every thread
    ({"GOMP_SPINCOUNT": "0"}, "", "True False None"),
])
def test_ggml_keeps_libgomps_wait_policy_and_watches_calls_where_it_spins(env, before, want):
    pytest.importorskip("ggml", reason="GGMLBackend needs ggml-python (installed by scripts/dev.sh)")
    if before:
        pytest.importorskip("torch")
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    done = subprocess.run([sys.executable, "-c", _POLICY.format(before=before)], capture_output=True, text=True,
                          cwd=ROOT, env={**base, **env, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == want
