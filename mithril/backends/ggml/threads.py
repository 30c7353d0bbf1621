"""How ggml's threads wait for each other.

ggml (as scripts/dev.sh builds it) runs each graph in one OpenMP parallel region with a barrier
after every node. libgomp's threads spin at a barrier (300,000 rounds by default) before they
sleep. With the CPUs free that is what a graph of hundreds of small nodes needs (a decode step);
with another process busy on them, a spinning thread holds the CPU its descheduled partner needs,
and the program's :class:`~mithril.backends.segmented.threads.ThreadGovernor` moves calls to one
thread. Passive waiting (``OMP_WAIT_POLICY=PASSIVE``, each thread asleep at once) costs a wake-up
at every node instead: GPT decode steps ran several times slower on 2 threads than on one
(docs/performance.md, GGML under load and GGML backend). So Mithril leaves libgomp's policy as
the user sets it (``OMP_WAIT_POLICY``, ``GOMP_SPINCOUNT``) and watches calls only where the
threads spin.
"""

from __future__ import annotations

import ctypes
import os
import sys

_STATE: dict = {}  # "passive": what libgomp said, once ggml is imported


def import_ggml():
    """The ``ggml`` module (ggml-python), with what its libgomp says of its wait policy noted."""
    import ggml

    if "passive" not in _STATE:
        _STATE["passive"] = _libgomp_waits_passively()
    return ggml


def reads_f32_in_place() -> bool:
    """Whether this ggml build multiplies by a float32 matrix read in place in its ``[K, N]``
    layout (ggml_transpose's view of it as ``mul_mat``'s first operand; the kernel
    scripts/patches/ggml-f32-packed.patch adds). Published ggml asserts on such an operand, so
    without it a MatMul's weight is transposed into a copy when it loads."""
    if "in_place" not in _STATE:
        import pathlib

        ggml = import_ggml()
        found = False
        for lib in sorted((pathlib.Path(ggml.__file__).parent / "lib").glob("libggml-cpu*")):
            try:
                found = found or hasattr(ctypes.CDLL(str(lib)), "mithril_mul_mat_f32_kn")
            except OSError:
                pass
        _STATE["in_place"] = found
    return _STATE["in_place"]


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
