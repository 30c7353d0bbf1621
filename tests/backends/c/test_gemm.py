"""The C kernel library's GEMM (mithril/backends/c/lib/mt_gemm.h) against NumPy: the blocked,
packed kernel and its plain-loop path, every stride the signature allows (transposes, sliced and
broadcast operands), alpha, beta and C broadcasts, float32 and float64, 1 and 2 threads; and the
optional BLAS path (scipy-openblas32) when it is installed."""

from __future__ import annotations

import ctypes
import importlib.util
import os
import platform
import re
import subprocess

import numpy as np
import pytest

from mithril.backends.c import build
from mithril.errors import BackendOptionError, BackendUnavailableError

SOURCE = """
#include "mt_gemm.h"
#ifdef _OPENMP
#include <omp.h>
#endif
#define WRAP(S, T)                                                                                        \\
    void gemm_##S(const T *A, const T *B, const T *C, T *Y, mt_i M, mt_i N, mt_i K, mt_i ar, mt_i ac,  \\
                  mt_i br, mt_i bc, mt_i cr, mt_i cc, T alpha, T beta, int threads) {                    \\
        set_threads(threads);                                                                             \\
        mt_gemm_##S(A, B, C, Y, M, N, K, ar, ac, br, bc, cr, cc, alpha, beta);                           \\
    }
static void set_threads(int n) {
#ifdef _OPENMP
    omp_set_num_threads(n);
#else
    (void)n;
#endif
}
WRAP(f32, float)
WRAP(f64, double)
"""

HAS_BLAS = importlib.util.find_spec("scipy_openblas32") is not None


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    """The wrapper built without BLAS, and with it where installed (-Werror: the header is
    warning-free): name -> (loaded library, path)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("MITHRIL_CACHE_DIR", str(tmp_path_factory.mktemp("c_cache")))
    out = {}
    for name, blas in (("own", False), ("blas", True))[:2 if HAS_BLAS else 1]:
        path = build.build_library(SOURCE, FLAGS, blas=blas)
        out[name] = build.load_library(path)
        out[name + "_path"] = path
    yield out
    mp.undo()


FLAGS = (*build.FLAGS, "-Werror")


def _view(rng, shape, dtype, layout):
    """A float array of ``shape`` laid out as asked: C order, transposed storage, every other
    element of a bigger array, or broadcast (stride 0) along the first axis."""
    if layout == "c":
        return rng.uniform(-1, 1, shape).astype(dtype)
    if layout == "t":
        return rng.uniform(-1, 1, shape[::-1]).astype(dtype).T
    if layout == "step":
        return rng.uniform(-1, 1, (shape[0], 2 * shape[1] + 1)).astype(dtype)[:, 1::2]
    if layout == "bcast":
        return np.broadcast_to(rng.uniform(-1, 1, (1, shape[1])).astype(dtype), shape)
    raise ValueError(layout)


def _strides(a):
    return [s // a.itemsize for s in a.strides]


def _gemm(lib, a, b, c=None, alpha=1.0, beta=1.0, threads=1):
    """Calls mt_gemm on NumPy views (their strides in elements), returns Y."""
    M, K = a.shape
    N = b.shape[1]
    dtype = a.dtype
    ctype = ctypes.c_float if dtype == np.float32 else ctypes.c_double
    fn = getattr(lib, "gemm_f32" if dtype == np.float32 else "gemm_f64")
    fn.restype = None
    y = np.full((M, N), np.nan, dtype)  # every element must be written
    ptr = lambda x: ctypes.c_void_p(x.__array_interface__["data"][0]) if x is not None else None  # noqa: E731
    (ar, ac), (br, bc) = _strides(a), _strides(b)
    if c is None:
        cr = cc = 0
    else:
        cb = np.broadcast_to(c, (M, N))
        cr, cc = _strides(cb)
    L = ctypes.c_long
    fn(ptr(a), ptr(b), ptr(c), ptr(y), L(M), L(N), L(K), L(ar), L(ac), L(br), L(bc), L(cr), L(cc),
       ctype(alpha), ctype(beta), ctypes.c_int(threads))
    return y


def _reference(a, b, c, alpha, beta):
    y = alpha * (a.astype(np.float64) @ b.astype(np.float64))
    if c is not None:
        y = y + beta * np.broadcast_to(c, y.shape)
    return y


def _check(y, ref, K):
    if y.dtype == np.float32:
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=2e-6 * max(K, 1))
    else:
        np.testing.assert_allclose(y, ref, rtol=1e-12, atol=1e-14 * max(K, 1))


# (M, N, K): the plain loops (small, few rows), the packed kernel with ragged edges in every
# dimension, more than one K block (KC = 256), more than one tile each way, A's rows read in place
# and (rows 2 KiB apart, K = 512 float) packed, a narrow Y with A's rows in place and big enough
# to be prefetched (a 1x1 convolution of a 7x7 plane: rows outer), and degenerate sizes.
SHAPES = [(1, 1, 1), (1, 7, 3), (5, 1, 9), (1, 300, 200), (3, 500, 100), (200, 1, 300), (7, 13, 5),
          (37, 45, 300), (100, 300, 70), (97, 257, 513), (130, 600, 40), (20, 300, 512), (601, 49, 330),
          (4, 4, 0), (0, 3, 2), (3, 0, 2)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("M,N,K", SHAPES)
def test_gemm_equals_numpy(libs, M, N, K, threads, dtype):
    rng = np.random.default_rng(M * 1000 + N * 10 + K)
    a, b = _view(rng, (M, K), dtype, "c"), _view(rng, (K, N), dtype, "c")
    y = _gemm(libs["own"], a, b, threads=threads)
    _check(y, _reference(a, b, None, 1.0, 1.0), K)


@pytest.mark.parametrize("la,lb", [("t", "c"), ("c", "t"), ("t", "t"), ("step", "step"), ("bcast", "c"),
                                   ("c", "bcast")])
@pytest.mark.parametrize("M,N,K", [(6, 5, 4), (70, 90, 300), (130, 260, 33)])
def test_every_layout_equals_numpy(libs, M, N, K, la, lb):
    rng = np.random.default_rng(7)
    for dtype in (np.float32, np.float64):
        a, b = _view(rng, (M, K), dtype, la), _view(rng, (K, N), dtype, lb)
        _check(_gemm(libs["own"], a, b, threads=2), _reference(a, b, None, 1.0, 1.0), K)


# A few rows against a transposed B (a classifier's Gemm, transB=1): the plain loops' dot products,
# eight rows of B at a time, then the rest one by one; threaded when N * K is large.
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("M,N,K", [(1, 7, 5), (1, 8, 1), (3, 9, 33), (1, 1000, 1280), (2, 1003, 300)])
def test_few_rows_transposed_b_equals_numpy(libs, M, N, K, threads):
    rng = np.random.default_rng(N + K)
    for dtype in (np.float32, np.float64):
        a, b = _view(rng, (M, K), dtype, "c"), _view(rng, (K, N), dtype, "t")
        _check(_gemm(libs["own"], a, b, threads=threads), _reference(a, b, None, 1.0, 1.0), K)


@pytest.mark.parametrize("cshape", [(), (1,), (1, "N"), ("M", 1), ("M", "N")])
@pytest.mark.parametrize("M,N,K", [(5, 7, 3), (70, 90, 300), (4, 4, 0)])
def test_alpha_beta_and_c_broadcasts(libs, M, N, K, cshape):
    rng = np.random.default_rng(11)
    shape = tuple({"M": M, "N": N}.get(d, d) for d in cshape)
    for dtype in (np.float32, np.float64):
        a, b = _view(rng, (M, K), dtype, "c"), _view(rng, (K, N), dtype, "c")
        c = rng.uniform(-1, 1, shape).astype(dtype)
        y = _gemm(libs["own"], a, b, c, alpha=0.5, beta=-2.0, threads=2)
        _check(y, _reference(a, b, c, 0.5, -2.0), K)


@pytest.mark.skipif(not HAS_BLAS, reason="scipy-openblas32 is not installed (pip install scipy-openblas32)")
@pytest.mark.parametrize("la,lb", [("c", "c"), ("t", "c"), ("c", "t"), ("step", "c"), ("bcast", "c")])
@pytest.mark.parametrize("M,N,K", [(70, 90, 300), (128, 64, 64), (3, 500, 100)])
def test_blas_path_equals_numpy(libs, M, N, K, la, lb):
    rng = np.random.default_rng(5)
    for dtype in (np.float32, np.float64):
        a, b = _view(rng, (M, K), dtype, la), _view(rng, (K, N), dtype, lb)
        c = rng.uniform(-1, 1, (N,)).astype(dtype)
        _check(_gemm(libs["blas"], a, b, c, alpha=0.5, beta=2.0, threads=2), _reference(a, b, c, 0.5, 2.0), K)


@pytest.mark.skipif(not HAS_BLAS, reason="scipy-openblas32 is not installed (pip install scipy-openblas32)")
def test_blas_is_linked_only_when_asked(libs, monkeypatch):
    assert b"scipy_cblas_sgemm" in libs["blas_path"].read_bytes()
    assert b"scipy_cblas_dgemm" in libs["blas_path"].read_bytes()
    assert b"scipy_cblas_sgemm" not in libs["own_path"].read_bytes()
    count = build.BUILDS["count"]
    monkeypatch.setenv("MITHRIL_C_BLAS", "0")  # the variable picks the cached library without BLAS
    assert build.build_library(SOURCE, FLAGS) == libs["own_path"]
    monkeypatch.setenv("MITHRIL_C_BLAS", "auto")  # installed: linked
    assert build.build_library(SOURCE, FLAGS) == libs["blas_path"]
    assert build.BUILDS["count"] == count


def test_blas_setting_errors(monkeypatch):
    monkeypatch.setenv("MITHRIL_C_BLAS", "maybe")
    with pytest.raises(BackendOptionError, match=r"MITHRIL_C_BLAS='maybe': expected one of 0, 1, auto"):
        build.blas_flags()
    monkeypatch.setattr(build, "_openblas", lambda: None)
    with pytest.raises(BackendUnavailableError, match="scipy-openblas32 is not installed: pip install"):
        build.blas_flags(True)
    monkeypatch.setenv("MITHRIL_C_BLAS", "auto")
    assert build.blas_flags() == ((), (), "")


def test_loading_a_library_shortens_openmp_spin_unless_the_user_chose(libs, monkeypatch):
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    build.load_library(libs["own_path"])
    assert os.environ["GOMP_SPINCOUNT"] == "10000"
    monkeypatch.setenv("GOMP_SPINCOUNT", "infinite")
    build.load_library(libs["own_path"])
    assert os.environ["GOMP_SPINCOUNT"] == "infinite"
    monkeypatch.delenv("GOMP_SPINCOUNT")
    monkeypatch.setenv("OMP_WAIT_POLICY", "active")
    build.load_library(libs["own_path"])
    assert "GOMP_SPINCOUNT" not in os.environ


def test_register_tile_stays_in_registers(tmp_path):
    """The micro-kernel's accumulators (a fixed-size array per register tile) must live in vector
    registers under build.FLAGS: their fused multiply-adds take three registers, no memory
    operand. At -O2 none did (the tile stayed in memory: the GEMM 3x slower, the NCHWc 1x1 kernel
    up to 27x), and a timing test would not say why. Read from the assembly GCC or clang writes for
    x86-64 with FMA; elsewhere skipped."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip(f"the check reads x86-64 assembly; this machine is {platform.machine()}")
    src, asm = tmp_path / "gemm.c", tmp_path / "gemm.s"
    src.write_text(SOURCE)
    flags = [f for f in build.FLAGS if f not in ("-shared", "-fPIC")]
    done = subprocess.run([*build.compiler(), *flags, f"-I{build.LIB_DIR}", "-S", "-o", str(asm), str(src)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    text = asm.read_text()
    fmas = re.findall(r"^\s*vfmadd\d{3}ps\s+(\S+), %[xyz]mm\d+, %[xyz]mm\d+\s*$", text, flags=re.M)
    if not fmas:
        pytest.skip("-march=native targets no FMA instructions on this CPU")
    in_registers = [op for op in fmas if op.startswith("%")]
    # One AVX2 register tile is 6 rows x 2 vectors (AVX-512: 8 x 2): at least that many FMAs on
    # registers alone, in the float micro-kernels.
    assert len(in_registers) >= 12, (len(in_registers), len(fmas))
