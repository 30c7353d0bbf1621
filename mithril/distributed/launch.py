"""Start local worker processes for ``torch.distributed``: :func:`spawn` for a function (tests,
notebooks), :func:`run_script` and ``mithril launch --nproc N script.py`` for a script (torchrun).

Each worker gets the environment torchrun gives (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), so ``TorchBackend(device_mesh=(N,))``
inside it joins the process group by itself. When a worker fails, or the time is up, every
worker is ended and a :class:`WorkerError` names the first failing rank with its traceback.

>>> from mithril.distributed.launch import spawn
>>> def hello(greeting):
...     import os
...     return f"{greeting} from rank {os.environ['RANK']}"
>>> spawn(hello, 2, args=("hi",), start_method="fork")  # doctest: +SKIP
['hi from rank 0', 'hi from rank 1']
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import queue as _queue
import signal
import socket
import subprocess
import sys
import time
import traceback

from ..errors import MithrilError

# How much of a failing rank's traceback the error quotes.
_TAIL_LINES = 25


class WorkerError(MithrilError):
    """A worker process failed (``rank``, its ``traceback``), died, or ran past the timeout."""

    def __init__(self, message: str, rank: int | None = None, traceback: str = ""):
        super().__init__(message)
        self.rank, self.traceback = rank, traceback


def free_port() -> int:
    """A TCP port free on this host now (the OS's choice), for ``MASTER_PORT``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(fn, args, rank: int, nproc: int, env: dict, results) -> None:
    os.environ.update(env, RANK=str(rank), LOCAL_RANK=str(rank))
    torch = sys.modules.get("torch")  # imported by the fork server: its thread count is set here
    if torch is not None and os.environ.get("OMP_NUM_THREADS", "").isdigit():
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    try:
        value = fn(*args)
    except BaseException:  # noqa: BLE001 - every failure goes back to the parent, named by rank
        results.put((rank, False, traceback.format_exc()))
        _leave_group()
        sys.exit(1)
    try:
        # Pickled here with the plain pickler: the queue's (torch's, once imported) shares a tensor's
        # memory through a file descriptor that dies with this process.
        results.put((rank, True, pickle.dumps(value)))
    finally:
        _leave_group()


def _leave_group() -> None:
    """Destroy the process group a worker built (a process that exits with one open warns)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
        try:
            torch.distributed.destroy_process_group()
        except Exception:  # noqa: BLE001 - the worker's own result is what counts
            pass


def spawn(fn, nproc: int, args: tuple = (), timeout: float = 120.0, start_method: str = "forkserver",
          env: dict | None = None) -> list:
    """Run ``fn(*args)`` in ``nproc`` local worker processes (ranks 0..nproc-1, one process
    group's environment: ``TorchBackend(device_mesh=(nproc,))`` in ``fn`` joins it); returns
    the ``nproc`` return values by rank (they must pickle).

    Each worker computes on one thread (``OMP_NUM_THREADS=1``, as torchrun sets) unless the
    environment or ``env`` says otherwise.

    ``start_method``: ``"forkserver"`` (the default: workers fork from a clean server process
    that imported torch and mithril once), ``"spawn"`` (a fresh interpreter per worker) or
    ``"fork"`` (only from a process that has no threads holding locks). With the first two,
    ``fn`` must be importable (a module-level function) and ``args`` must pickle. On the first
    failure, a worker that dies, or ``timeout`` seconds, every worker is ended and
    :class:`WorkerError` names the rank and its traceback.
    """
    if not isinstance(nproc, int) or nproc < 1:
        raise MithrilError(f"spawn: nproc must be a positive int, got {nproc!r}")
    ctx = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
        # Workers fork from a server that imported torch and mithril once (2.5 s for 2 workers here,
        # against 9-11 s for "spawn"'s fresh interpreters); a server already running keeps its own.
        ctx.set_forkserver_preload(["torch", "mithril"])
    results = ctx.Queue()
    shared = {"WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1",
              "MASTER_PORT": str(free_port())}
    if nproc > 1 and "OMP_NUM_THREADS" not in os.environ:
        # One compute thread per worker, as torchrun sets: N workers of several threads each on
        # the same cores made a 2-process GPT step 30x slower here (2.6 s against 84 ms).
        shared["OMP_NUM_THREADS"] = "1"
    shared.update(env or {})
    procs = [ctx.Process(target=_worker, args=(fn, args, rank, nproc, shared, results), daemon=False,
                         name=f"mithril-worker-{rank}") for rank in range(nproc)]
    deadline = time.monotonic() + timeout
    values: dict[int, object] = {}
    try:
        for p in procs:
            p.start()
        while len(values) < nproc:
            try:
                rank, ok, value = results.get(timeout=0.2)
            except _queue.Empty:
                dead = [(r, p.exitcode) for r, p in enumerate(procs)
                        if p.exitcode not in (None, 0) and r not in values]
                if dead:
                    time.sleep(0.5)  # its own report may still be in the queue
                    try:
                        rank, ok, value = results.get_nowait()
                    except _queue.Empty:
                        r, code = dead[0]
                        how = f"signal {-code}" if code < 0 else f"exit status {code}"
                        raise WorkerError(f"spawn: rank {r} of {nproc} died ({how}) without an error report",
                                          rank=r) from None
                elif time.monotonic() > deadline:
                    left = [r for r in range(nproc) if r not in values]
                    raise WorkerError(f"spawn: {fn.__name__} ran past the timeout of {timeout:g} s on rank(s) "
                                      f"{left} of {nproc}; all workers ended") from None
                else:
                    continue
            if not ok:
                tail = "\n".join(value.rstrip().splitlines()[-_TAIL_LINES:])
                raise WorkerError(f"spawn: rank {rank} of {nproc} failed:\n{tail}", rank=rank, traceback=value)
            values[rank] = pickle.loads(value)
        for p in procs:
            p.join(max(1.0, deadline - time.monotonic()))
    finally:
        _end(procs)
        results.close()
    return [values[r] for r in range(nproc)]


def _end(procs, grace: float = 3.0) -> None:
    """Terminate the workers still running (SIGTERM, then SIGKILL after ``grace`` s)."""
    alive = [p for p in procs if p.pid is not None and p.is_alive()]
    for p in alive:
        p.terminate()
    stop = time.monotonic() + grace
    for p in alive:
        p.join(max(0.0, stop - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(1.0)


def torchrun_command(script: str, script_args=(), nproc: int = 1, nnodes: int | str = 1, node_rank: int = 0,
                     master_addr: str | None = None, master_port: int | None = None) -> list[str]:
    """The ``python -m torch.distributed.run`` command line running ``script`` on ``nproc``
    processes per node: one node alone is ``--standalone`` (torchrun picks a free port itself),
    several nodes need ``master_addr`` and ``master_port`` (the rank-0 node's address). Each
    process runs the script through :mod:`mithril.backends.torch.worker`, inside torch's
    ``record``, so torchrun's summary quotes the first failing rank's traceback."""
    if not isinstance(nproc, int) or nproc < 1:
        raise MithrilError(f"launch: --nproc must be a positive int, got {nproc!r}")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
    multi = str(nnodes) != "1"
    if multi or master_addr is not None or master_port is not None:
        if master_port is not None and int(master_port) == 0:
            raise MithrilError("launch: --master-port 0 lets every node pick a different port; give one port that "
                               "the rank-0 node listens on (e.g. 29500)")
        if multi and master_addr is None:
            raise MithrilError(f"launch: --nnodes {nnodes} needs --master-addr (the rank-0 node's address) and "
                               "--master-port")
        cmd += [f"--nnodes={nnodes}", f"--node-rank={node_rank}", f"--master-addr={master_addr or '127.0.0.1'}",
                f"--master-port={master_port or 29500}"]
    else:
        cmd.append("--standalone")
    return cmd + ["-m", "mithril.backends.torch.worker", str(script), *map(str, script_args)]


def run_script(script: str, nproc: int, args=(), timeout: float | None = None, **torchrun_options) -> int:
    """Run ``script`` on ``nproc`` local processes through torchrun and wait; returns its exit
    status. Past ``timeout`` seconds, torchrun and every worker are ended and :class:`WorkerError`
    is raised. Interrupted (Ctrl-C, or SIGTERM to this process), it ends them too."""
    import threading

    cmd = torchrun_command(script, args, nproc, **torchrun_options)
    proc = subprocess.Popen(cmd, start_new_session=True)  # its own process group: ended as one
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        raise WorkerError(f"launch: {script} ran past the timeout of {timeout:g} s; all workers ended") from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)  # unwinds run_script, which ends torchrun's process group
