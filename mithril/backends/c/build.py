"""Building generated C: the system compiler (``CC``, default ``cc``), a shared library cached
on disk by a hash of the source, the kernel library, the compiler's version and the flags
(``MITHRIL_CACHE_DIR``, else the user cache dir), loaded with ctypes.

BLAS is optional: when the ``scipy-openblas32`` wheel is installed (``pip install
'mithril[blas]'``), libraries are linked against it and built with ``MT_BLAS``, so large GEMMs
call ``cblas_?gemm`` (lib/mt_gemm.h); without it the kernel library's own blocked GEMM runs.
``MITHRIL_C_BLAS=0`` turns it off, ``MITHRIL_C_BLAS=1`` requires it (``build_library(blas=...)``
overrides the variable)."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
import weakref
from pathlib import Path

from ...errors import BackendOptionError, BackendUnavailableError, MithrilError

LIB_DIR = Path(__file__).parent / "lib"
# -O3: the kernels' register tiles (GEMM, NCHWc 1x1, depthwise, Winograd's transforms) are fixed-size
# arrays that only -O3's early complete unrolling turns into vector registers. At -O2 (even with
# -O3's vectorizer cost model) they stay in memory: without BLAS, ResNet-18 at 1 thread 23 -> 43 ms,
# MobileNetV2 with constant weights 4.5 -> 38 ms (its 16->96 1x1 layer 145 -> 5 GFLOP/s).
# -fno-inline: each kernel is compiled once, not again at every call site of the generated function
# (helpers called inside a kernel's loops are MT_INNER, always inlined): the four peer models build in
# 2.3-3.4 s instead of 4.5-6.7 and run as fast (1 thread, within this host's noise). -fno-math-errno:
# libm calls set no errno, so loops calling exp/tanh/sqrt vectorize (mt_base.h).
FLAGS = ("-O3", "-fno-inline", "-march=native", "-fno-math-errno", "-fopenmp", "-fPIC", "-shared", "-std=c11", "-Wall",
         "-Wextra")


class CCompilerError(MithrilError):
    """No C compiler, or the compiler refused the generated source."""


def compiler() -> list[str]:
    """The compiler command: ``$CC`` split like a shell would, ``cc`` when unset."""
    return shlex.split(os.environ.get("CC") or "cc")


@functools.lru_cache(maxsize=None)
def compiler_version(cc: tuple[str, ...]) -> str:
    """The compiler's ``--version`` first line; a missing compiler is one clear error."""
    try:
        done = subprocess.run([*cc, "--version"], capture_output=True, text=True, timeout=60)
    except (FileNotFoundError, PermissionError, OSError) as exc:
        raise CCompilerError(
            f"CBackend needs a C compiler and found none: CC={' '.join(cc)!r} cannot be run ({exc.strerror or exc}). "
            "Install gcc or clang, or set CC to a compiler's path.") from None
    if done.returncode != 0:
        raise CCompilerError(f"CBackend: {' '.join(cc)} --version failed: {done.stderr.strip()[:500]}")
    return done.stdout.splitlines()[0] if done.stdout else ""


def cache_dir() -> Path:
    """Where built libraries live: ``$MITHRIL_CACHE_DIR``, else ``$XDG_CACHE_HOME/mithril/c``
    (``~/.cache/mithril/c``)."""
    if os.environ.get("MITHRIL_CACHE_DIR"):
        return Path(os.environ["MITHRIL_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mithril" / "c"


_BLAS_OFF = ("0", "off", "false", "no")
_BLAS_ON = ("1", "on", "true", "yes")


@functools.lru_cache(maxsize=None)
def _openblas() -> tuple[tuple[str, ...], tuple[str, ...], str] | None:
    try:
        import scipy_openblas32 as ob
    except ImportError:
        return None
    lib_dir = ob.get_lib_dir()
    cflags = ("-DMT_BLAS", f"-I{ob.get_include_dir()}")
    ldflags = (f"-L{lib_dir}", f"-l{ob.get_library()}", f"-Wl,-rpath,{lib_dir}")
    return cflags, ldflags, f"scipy-openblas32 {getattr(ob, '__version__', '?')}"


def blas_flags(blas: bool | None = None) -> tuple[tuple[str, ...], tuple[str, ...], str]:
    """(compile flags, link flags, label) for BLAS: ``((), (), "")`` when it is not used.
    ``blas``: True requires scipy-openblas32, False never links it, None (the default) reads
    ``MITHRIL_C_BLAS`` and links it when installed."""
    if blas is None:
        env = os.environ.get("MITHRIL_C_BLAS", "").strip().lower()
        if env and env not in _BLAS_OFF + _BLAS_ON + ("auto",):
            raise BackendOptionError(f"MITHRIL_C_BLAS={env!r}: expected one of 0, 1, auto (unset means auto)")
        blas = False if env in _BLAS_OFF else True if env in _BLAS_ON else None
    if blas is False:
        return (), (), ""
    found = _openblas()
    if found is None:
        if blas:
            raise BackendUnavailableError("CBackend: BLAS was asked for (blas=True or MITHRIL_C_BLAS=1) and scipy-openblas32 "
                               "is not installed: pip install scipy-openblas32 (or \"mithril[blas]\"), or leave BLAS "
                               "off (the kernel library's own GEMM)")
        return (), (), ""
    return found


def library_key(source: str, cc: tuple[str, ...], flags: tuple[str, ...]) -> str:
    """The cache key: source, every kernel-library file, compiler version and flags."""
    h = hashlib.sha256()
    h.update(source.encode())
    for path in sorted(LIB_DIR.iterdir()):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    h.update(compiler_version(cc).encode())
    h.update(" ".join((*cc, *flags)).encode())
    return h.hexdigest()[:32]


# Counts compiler runs (tests check that a second compile of the same model reuses the cache).
BUILDS = {"count": 0}


def _abandon(process: subprocess.Popen, tmp: str) -> None:
    """A build nobody waited for (its model's compile failed after lower started it, or the
    interpreter is leaving): the compiler stopped and its temporary folder removed."""
    if process.poll() is None:
        process.kill()
    process.communicate()  # reaped, its pipes drained and closed
    shutil.rmtree(tmp, ignore_errors=True)


class PendingBuild:
    """A library from the cache, or being built: the C compiler runs in the background while
    Python goes on (the forward program's compiler beside the gradient program's rendering and
    compiler, on two CPUs: ResNet-50's cold compile 7.3-7.7 s where one after the other took
    9.5). :meth:`path` waits for it; a build dropped unwaited is stopped and its folder removed."""

    def __init__(self, target: Path, cc: tuple[str, ...] = (), process=None, tmp: str | None = None,
                 out: Path | None = None):
        self.target, self._cc, self._process, self._tmp, self._out = target, cc, process, tmp, out
        self._abandon = weakref.finalize(self, _abandon, process, tmp) if process is not None else None

    def path(self) -> Path:
        """The built library; a CCompilerError when the compiler refused the source."""
        if self._process is not None:
            self._abandon.detach()  # waited for here, whatever comes of it
            process, self._process = self._process, None
            try:
                _, stderr = process.communicate()
                if process.returncode != 0:
                    raise CCompilerError(f"CBackend: the C compiler refused the generated source "
                                         f"({' '.join(self._cc)}):\n{stderr.strip()[-2000:]}")
                os.replace(self._out, self.target)  # atomic: a concurrent build of the same key writes the same bytes
            finally:
                shutil.rmtree(self._tmp, ignore_errors=True)
        return self.target


def start_build(source: str, flags: tuple[str, ...] | None = None, blas: bool | None = None) -> PendingBuild:
    """The shared library of ``source``, from the cache or with the compiler started now;
    ``flags`` default to :data:`FLAGS` as it is when called; ``blas`` as in :func:`blas_flags`."""
    flags = FLAGS if flags is None else tuple(flags)
    cc = tuple(compiler())
    cflags, ldflags, blas_label = blas_flags(blas)
    if os.environ.get("MITHRIL_C_PROFILE", "").strip() in _BLAS_ON:  # seconds per node: CProgram.profile()
        cflags = (*cflags, "-DMT_PROFILE", "-D_POSIX_C_SOURCE=199309L")
    key = library_key(source, cc, (*flags, *cflags, *ldflags, blas_label))
    directory = cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"mithril_{key}.so"
    if target.exists():
        return PendingBuild(target)
    tmp = tempfile.mkdtemp(dir=directory)
    src = Path(tmp) / f"mithril_{key}.c"
    src.write_text(source)
    out = Path(tmp) / target.name
    BUILDS["count"] += 1
    # (a compiler that cannot be run was refused by library_key's compiler_version already)
    process = subprocess.Popen([*cc, *flags, *cflags, f"-I{LIB_DIR}", "-o", str(out), str(src), *ldflags, "-lm"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return PendingBuild(target, cc, process, tmp, out)


def build_library(source: str, flags: tuple[str, ...] | None = None, blas: bool | None = None) -> Path:
    """The shared library of ``source``, from the cache or built now; ``blas`` as in :func:`blas_flags`."""
    return start_build(source, flags, blas).path()


# libgomp reads its settings once, when it is loaded (with the first model's library). After each
# parallel region its workers spin for 300,000 iterations by default; on a busy machine they take
# the CPU from the threads still working (ResNet-18 on 2 threads with the 2 CPUs oversubscribed:
# 555 ms spinning, 175 ms with a 10,000 spin). A user's own GOMP_SPINCOUNT or OMP_WAIT_POLICY wins,
# and a libgomp loaded before (torch ships one with the same soname) keeps what it read then.
OPENMP_ENV = {"GOMP_SPINCOUNT": "10000"}


def load_library(path: Path) -> ctypes.CDLL:
    if "OMP_WAIT_POLICY" not in os.environ:
        for key, value in OPENMP_ENV.items():
            os.environ.setdefault(key, value)
    return ctypes.CDLL(str(path))


class LazyLibrary:
    """The library of a :class:`PendingBuild`, loaded when first used (any attribute), or by
    :meth:`wait` (``ml.compile`` waits before it returns: its time includes the compiler's)."""

    def __init__(self, pending: PendingBuild):
        self._pending, self._lib = pending, None

    def wait(self) -> None:
        if self._lib is None:
            self._lib = load_library(self._pending.path())

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        self.wait()
        return getattr(self._lib, name)


__all__ = ["BUILDS", "CCompilerError", "LazyLibrary", "PendingBuild", "blas_flags", "build_library", "cache_dir",
           "compiler", "load_library", "start_build"]
