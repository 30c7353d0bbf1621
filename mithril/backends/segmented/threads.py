"""The threads each call of an OpenMP-threaded program (C, GGML) runs on: all it was given while
the CPUs are free, one while other processes hold them (:class:`ThreadGovernor`)."""

from __future__ import annotations

import os
import time


def default_threads() -> int:
    """The threads an OpenMP region gets by default: ``OMP_NUM_THREADS`` (its first level), else
    the CPUs this process may run on."""
    env = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class OtherLoad:
    """How many CPUs other processes kept busy lately: the machine's busy time (``/proc/stat``'s
    first line: user, nice, system, irq, softirq and steal, which a hypervisor's neighbours take)
    less this process's own CPU time (``time.process_time``, every thread of it), over at least
    ``WINDOW`` seconds. ``busy()`` answers from the last full window (None before the first, and
    on a system without ``/proc/stat``); within a window it reads nothing (a read costs ~30 us,
    a tenth of a small model's call). ``read``: a callable giving (busy CPU seconds, own CPU
    seconds, wall seconds) and ``clock`` the wall seconds, for tests."""

    WINDOW = 0.1
    BUSY = 0.5  # other processes' CPUs from which a call runs on one thread

    def __init__(self, read=None, clock=time.monotonic):
        self._read = read or _cpu_times
        self._clock = clock
        self._start = self._read()
        self.others: float | None = None  # CPUs the others kept busy over the last full window

    def busy(self) -> bool | None:
        if self._start is None:
            return None
        if self._clock() - self._start[2] >= self.WINDOW:
            now = self._read()
            if now is None:
                return None
            wall = now[2] - self._start[2]
            self.others = max(0.0, (now[0] - self._start[0]) - (now[1] - self._start[1])) / wall
            self._start = now
        return None if self.others is None else self.others >= self.BUSY


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_times() -> tuple[float, float, float] | None:
    """(CPU seconds the machine has been busy, this process's CPU seconds, monotonic seconds)."""
    try:
        with open("/proc/stat", "rb") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    if len(v) < 8:
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = v
    return (user + nice + system + irq + softirq + steal) / _TICK, time.process_time(), time.monotonic()


class ThreadGovernor:
    """The threads each call of a program runs on: all it was given, or one while other
    processes hold the CPUs.

    Every OpenMP region ends at a barrier that waits for each thread of its team (ggml runs one
    region per graph with a barrier after every node); with another process busy on one of the
    CPUs, a team of two waits for a scheduler time slice at each of a model's dozens of regions,
    and two threads run slower than one. onnxruntime's own pool does not wait: its calling thread runs the
    work a descheduled worker has not claimed. Here the calls are watched instead: STRIKES calls in
    a row slower than SLOW times the fastest seen on all threads (and than the fastest on one,
    once known) move the calls of the next HOLD_S seconds (two at least) to one thread; then one
    call tries all threads again, and a try slower than the recent one-thread calls goes back for
    twice the hold (up to HOLD_MAX_S, or HOLD_MAX_CALLS one-thread calls where those are longer).
    A short hold lets a passing neighbour (another runtime's pool spinning for tens of
    milliseconds after its own calls) cost little; a lasting one costs one slow try per
    HOLD_MAX_S (per HOLD_MAX_CALLS calls of a model whose calls take longer).

    ``probe_one``: the third call runs on one thread, so one thread's time is known from the
    start, and a call on all threads slower than the recent one-thread calls strikes too: without
    it a machine already busy when the calls begin (every call on all threads equally slow) goes
    unnoticed. ``watch_load``: besides the timings, other processes' use of the CPUs is read
    (:class:`OtherLoad`, on Linux): while they keep half a CPU busy every call runs on one thread,
    and no call tries all threads (a try beside two busy processes cost C's GPT-2 Mini 1.3 s
    where one thread takes 0.25). ``switch``: the environment variable whose ``0`` keeps every call
    on all threads; ``enabled=False`` does too."""

    SLOW = 2.0
    STRIKES = 2
    HOLD_S, HOLD_MAX_S = 0.02, 0.5
    HOLD_MAX_CALLS = 20
    PROBE_AT = 3  # the call that runs on one thread when probe_one

    def __init__(self, num_threads: int | None, *, switch: str = "MITHRIL_C_ADAPTIVE_THREADS",
                 probe_one: bool = False, watch_load: bool = False, enabled: bool = True):
        self.configured = num_threads
        self.want = num_threads if num_threads is not None else default_threads()
        off = os.environ.get(switch, "").strip().lower() in ("0", "off", "false", "no")
        self.enabled = enabled and self.want > 1 and not off
        self.threads = self.want
        self.best: dict[int, float] = {}
        self.recent_one: float | None = None  # moving average of the one-thread calls
        self.strikes = 0
        self.held = (0, 0.0)  # calls and seconds on one thread since the last move there
        self.backoff = self.HOLD_S
        self.probing = False
        self.calls = 0
        self.probe_one = probe_one
        self.load = OtherLoad() if watch_load and self.enabled else None
        self.forced = False  # this call runs on one thread because other processes hold the CPUs

    def begin(self) -> int | None:
        """The thread count to set for the next call (None: leave OpenMP's default)."""
        if not self.enabled:
            return self.configured
        self.calls += 1
        self.forced = self.load is not None and bool(self.load.busy())
        if self.forced:
            return 1
        if self.probe_one and self.calls == self.PROBE_AT and self.threads == self.want:
            return 1
        return self.threads

    def end(self, seconds: float) -> None:
        """Account the call just made, which took ``seconds``."""
        if not self.enabled:
            return
        if self.forced:  # one thread's time, beside the others' load: nothing else moves
            self.best[1] = min(self.best.get(1, seconds), seconds)
            return
        if self.probe_one and self.calls == self.PROBE_AT and self.threads == self.want:
            self.best[1] = min(self.best.get(1, seconds), seconds)  # the probe: nothing else moves
            self.recent_one = seconds if self.recent_one is None else self.recent_one
            return
        n = self.threads
        self.best[n] = min(self.best.get(n, seconds), seconds)
        if n == 1:
            self.recent_one = seconds if self.recent_one is None else 0.75 * self.recent_one + 0.25 * seconds
            calls, spent = self.held[0] + 1, self.held[1] + seconds
            self.held = (calls, spent)
            if calls >= 2 and spent >= self.backoff:
                self.threads, self.probing, self.strikes = self.want, True, 0
            return
        limit = max(self.SLOW * self.best[n], self.best.get(1, 0.0))
        if (self.probing or self.probe_one) and self.recent_one is not None:
            limit = min(limit, self.recent_one)  # worth it only if it beats one thread now
        self.strikes = self.strikes + 1 if seconds > limit else 0
        if self.strikes >= (1 if self.probing else self.STRIKES):
            longest = max(self.HOLD_MAX_S, self.HOLD_MAX_CALLS * (self.recent_one or 0.0))
            self.backoff = min(2 * self.backoff, longest) if self.probing else self.HOLD_S
            self.threads, self.held, self.strikes, self.probing = 1, (0, 0.0), 0, False
        elif self.probing and self.strikes == 0:
            self.probing, self.backoff = False, self.HOLD_S
