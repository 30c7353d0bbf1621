"""How ggml's threads wait for each other.

ggml (as scripts/dev.sh builds it) runs each graph in one OpenMP parallel region with a barrier
after every node. libgomp's threads spin at a barrier (300,000 rounds by default) before they
sleep, so with another process busy on the CPUs a spinning thread holds the CPU its descheduled
partner needs, and a call on 2 threads of a 2-CPU machine runs many times slower than on one;
with passive waiting a thread sleeps at once and its CPU runs the partner
(docs/performance.md, GGML under load: ``scripts/bench.py --ggml-load``). So the first
import of ggml loads libgomp with ``OMP_WAIT_POLICY=PASSIVE`` (libgomp reads it once, when it is
loaded; the variable is set only for that import) unless the user set ``OMP_WAIT_POLICY`` or
``GOMP_SPINCOUNT``, or a libgomp is loaded already (PyTorch's, the C backend's): then the
program's :class:`~mithril.backends.segmented.threads.ThreadGovernor` moves calls to one thread
while other processes hold the CPUs.
"""

from __future__ import annotations

import ctypes
import os
import sys

_STATE: dict = {}  # "passive": what libgomp said, once ggml is imported


def import_ggml():
    """The ``ggml`` module (ggml-python), imported the first time with libgomp's passive wait
    policy where the user chose none and no libgomp is loaded yet (see the module docstring)."""
    if "ggml" in sys.modules and "passive" in _STATE:
        return sys.modules["ggml"]
    chosen = any(os.environ.get(k) for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"))
    if "ggml" in sys.modules or chosen or _libgomp() is not None:
        import ggml
    else:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        try:
            import ggml
        finally:
            os.environ.pop("OMP_WAIT_POLICY", None)
    _STATE["passive"] = _libgomp_waits_passively()
    return ggml


def waits_passively() -> bool:
    """Whether ggml's OpenMP threads sleep at once at a barrier (``OMP_WAIT_POLICY=PASSIVE`` or
    ``GOMP_SPINCOUNT=0`` when libgomp was loaded), as libgomp itself reports; False where ggml
    has no libgomp (a build without OpenMP runs its own spinning pool)."""
    import_ggml()
    return _STATE["passive"]


def _libgomp():
    """The libgomp this process has loaded (PyTorch's copy and the system's share the name
    libgomp.so.1: the first loaded serves both), or None; never loads one."""
    try:
        return ctypes.CDLL("libgomp.so.1", mode=getattr(os, "RTLD_NOLOAD", 4))
    except OSError:
        return None


def _libgomp_waits_passively() -> bool:
    """libgomp's own account of its wait policy (``omp_display_env``, which prints to stderr)."""
    lib = _libgomp()
    display = getattr(lib, "omp_display_env", None) if lib is not None else None
    if display is None:
        return False
    read, write = os.pipe()
    saved = os.dup(2)
    try:
        sys.stderr.flush()
        os.dup2(write, 2)
        display(1)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(write)
    with os.fdopen(read) as f:
        text = f.read()
    return "GOMP_SPINCOUNT = '0'" in text  # the rounds a thread spins before it sleeps (PASSIVE: 0)
