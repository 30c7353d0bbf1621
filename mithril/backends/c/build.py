"""Building generated C: the system compiler (``CC``, default ``cc``), a shared library cached
on disk by a hash of the source, the kernel library, the compiler's version and the flags
(``MITHRIL_CACHE_DIR``, else the user cache dir), loaded with ctypes."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shlex
import subprocess
import tempfile
from pathlib import Path

from ...errors import MithrilError

LIB_DIR = Path(__file__).parent / "lib"
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=c11", "-Wall", "-Wextra")


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


def build_library(source: str, flags: tuple[str, ...] = FLAGS) -> Path:
    """The shared library of ``source``, from the cache or built now."""
    cc = tuple(compiler())
    key = library_key(source, cc, flags)
    directory = cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"mithril_{key}.so"
    if target.exists():
        return target
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        src = Path(tmp) / f"mithril_{key}.c"
        src.write_text(source)
        out = Path(tmp) / target.name
        BUILDS["count"] += 1
        done = subprocess.run([*cc, *flags, f"-I{LIB_DIR}", "-o", str(out), str(src), "-lm"],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise CCompilerError(f"CBackend: the C compiler refused the generated source "
                                 f"({' '.join(cc)}):\n{done.stderr.strip()[-2000:]}")
        os.replace(out, target)  # atomic: a concurrent build of the same key writes the same bytes
    return target


def load_library(path: Path) -> ctypes.CDLL:
    return ctypes.CDLL(str(path))


__all__ = ["BUILDS", "CCompilerError", "build_library", "cache_dir", "compiler", "load_library"]
