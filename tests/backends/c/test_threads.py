"""The C backend's thread governor (segmented.threads.ThreadGovernor): each call runs on all the threads it
was given until calls slow down as other processes take the CPUs (OpenMP's barriers then wait for
a descheduled thread at every region), then on one thread for a while, trying all again after.
Driven here with made-up call times (and made-up CPU times for the load watch), so the decisions
are exact."""

from __future__ import annotations

import pytest

from mithril.backends.segmented.threads import OtherLoad, ThreadGovernor, default_threads


def _run(gov: ThreadGovernor, seconds: float, calls: int = 1) -> list[int]:
    """Make ``calls`` calls of ``seconds`` each; the thread count each ran on."""
    used = []
    for _ in range(calls):
        used.append(gov.begin())
        gov.end(seconds)
    return used


def test_quiet_calls_stay_on_all_threads(monkeypatch):
    monkeypatch.delenv("MITHRIL_C_ADAPTIVE_THREADS", raising=False)
    gov = ThreadGovernor(2)
    assert _run(gov, 0.005, 50) == [2] * 50
    # one slow call alone (a page fault, a passing interrupt) moves nothing
    assert _run(gov, 0.05) == [2] and _run(gov, 0.005, 3) == [2] * 3


def test_slowed_calls_move_to_one_thread_and_back_when_the_cpus_free(monkeypatch):
    monkeypatch.delenv("MITHRIL_C_ADAPTIVE_THREADS", raising=False)
    gov = ThreadGovernor(2)
    _run(gov, 0.005, 5)
    assert _run(gov, 0.022, 2) == [2, 2]  # two calls in a row over twice the fastest
    # on one thread for HOLD_S seconds of calls (two at least), then all threads again
    held = _run(gov, 0.008, 3)
    assert held == [1, 1, 1] and gov.begin() == 2
    assert _run(gov, 0.005, 5) == [2] * 5  # the try was fast: all threads stay


def test_a_slow_try_doubles_the_hold(monkeypatch):
    monkeypatch.delenv("MITHRIL_C_ADAPTIVE_THREADS", raising=False)
    gov = ThreadGovernor(2)
    _run(gov, 0.005, 5)
    _run(gov, 0.022, 2)
    _run(gov, 0.008, 3)  # 24 ms held: the try comes
    assert _run(gov, 0.012) == [2]  # slower than one thread's recent calls (8 ms): back at once
    assert gov.begin() == 1 and gov.backoff == pytest.approx(2 * ThreadGovernor.HOLD_S)
    assert _run(gov, 0.008, 5) == [1] * 5  # 40 ms now, not 20
    assert gov.begin() == 2
    for _ in range(10):  # a neighbour that stays: the hold doubles up to HOLD_MAX_S
        _run(gov, 0.012)
        while gov.begin() == 1:
            _run(gov, 0.008)
    assert gov.backoff == ThreadGovernor.HOLD_MAX_S


def test_governor_off_and_single_thread(monkeypatch):
    monkeypatch.setenv("MITHRIL_C_ADAPTIVE_THREADS", "0")
    gov = ThreadGovernor(2)
    _run(gov, 0.005, 3)
    assert _run(gov, 0.05, 10) == [2] * 10
    gov = ThreadGovernor(None)  # OpenMP's default stays OpenMP's
    assert _run(gov, 0.05, 3) == [None] * 3
    monkeypatch.delenv("MITHRIL_C_ADAPTIVE_THREADS")
    gov = ThreadGovernor(1)
    assert not gov.enabled and _run(gov, 0.05, 3) == [1] * 3


def test_default_threads_reads_omp_num_threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3,2")
    assert default_threads() == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "")
    assert default_threads() >= 1


class _Machine:
    """Made-up CPU accounting for OtherLoad: the machine's busy CPU seconds, this process's own and
    the clock, advanced by :meth:`run`."""

    def __init__(self):
        self.busy = self.own = self.now = 0.0

    def run(self, seconds: float, own_cpus: float, other_cpus: float) -> None:
        self.now += seconds
        self.own += own_cpus * seconds
        self.busy += (own_cpus + other_cpus) * seconds

    def read(self):
        return self.busy, self.own, self.now


def test_other_load_counts_only_other_processes():
    m = _Machine()
    load = OtherLoad(m.read, lambda: m.now)
    m.run(0.05, own_cpus=2.0, other_cpus=0.0)
    assert load.busy() is None  # no full window yet
    m.run(0.05, own_cpus=2.0, other_cpus=0.0)
    assert load.busy() is False and load.others == pytest.approx(0.0)  # our own two threads: quiet
    m.run(0.2, own_cpus=1.0, other_cpus=1.0)
    assert load.busy() is True and load.others == pytest.approx(1.0)
    m.run(0.05, own_cpus=1.0, other_cpus=0.0)  # under a window since the last reading: the answer stands
    assert load.busy() is True
    m.run(0.1, own_cpus=1.0, other_cpus=0.2)
    assert load.busy() is False and load.others == pytest.approx(0.2 * 0.1 / 0.15)  # the whole 0.15 s window
    assert OtherLoad(lambda: None).busy() is None  # no /proc/stat: no answer


def test_calls_run_on_one_thread_while_others_hold_the_cpus(monkeypatch):
    """With the load watched, a machine busy from the first call never gets a call on all threads
    (each such call waits at every barrier for a descheduled thread), and a quiet one keeps them."""
    monkeypatch.delenv("MITHRIL_C_ADAPTIVE_THREADS", raising=False)
    m = _Machine()
    gov = ThreadGovernor(2, probe_one=True, watch_load=True)
    gov.load = OtherLoad(m.read, lambda: m.now)
    used = []
    for _ in range(40):  # another process holds a whole CPU throughout
        n = gov.begin()
        used.append(n)
        m.run(0.03, own_cpus=1.0 if n == 1 else 2.0, other_cpus=1.0)
        gov.end(0.03 if n == 1 else 0.3)
    # until the first full window the timings decide (the third call is the one-thread probe)
    assert used[:4] == [2, 2, 1, 2] and used[4:] == [1] * 36
    for _ in range(10):  # the other process stops: all threads again after a window
        n = gov.begin()
        used.append(n)
        m.run(0.03, own_cpus=n, other_cpus=0.0)
        gov.end(0.02)
    assert used[-6:] == [2] * 6
    gov = ThreadGovernor(2, watch_load=True)  # on a quiet machine nothing changes
    gov.load = OtherLoad(m.read, lambda: m.now)
    for _ in range(20):
        assert gov.begin() == 2
        m.run(0.01, own_cpus=2.0, other_cpus=0.05)
        gov.end(0.01)
