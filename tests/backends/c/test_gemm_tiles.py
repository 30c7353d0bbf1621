"""The register tiles of the C kernel library's GEMM (mithril/backends/c/lib/mt_gemm_t.h) at the
edges of their widths, through mt_gemm_clamp (the convolutions' entry): a ragged last panel run
one vector wide, its last columns past whole vectors done as dot products (N = 49, a 7x7 plane),
and the epilogue (alpha, a C value per row, a residual R, the clamp) applied as the tiles store, over one K block
and several, with A's rows read in place and packed, against NumPy in float32 and float64."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from mithril.backends.c import build

SOURCE = """
#include "mt_gemm.h"
#ifdef _OPENMP
#include <omp.h>
#endif
#define WRAP(S, T)                                                                                        \\
    void gemm_clamp_##S(const T *A, const T *B, const T *C, const T *R, T *Y, mt_i M, mt_i N, mt_i K,       \\
                        mt_i ar, mt_i ac, mt_i br, mt_i bc, mt_i cr, mt_i cc, T alpha, T beta, T lo, T hi,  \\
                        int threads) {                                                                    \\
        set_threads(threads);                                                                             \\
        mt_gemm_clamp_##S(A, B, C, R, Y, M, N, K, ar, ac, br, bc, cr, cc, alpha, beta, lo, hi);          \\
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


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("MITHRIL_CACHE_DIR", str(tmp_path_factory.mktemp("c_cache")))
    path = build.build_library(SOURCE, (*build.FLAGS, "-Werror"), blas=False)  # the library's own GEMM
    yield build.load_library(path)
    mp.undo()


def _gemm_clamp(lib, a, b, c, alpha, beta, lo, hi, threads=1, r=None):
    """Y = clamp(alpha * a @ b + beta * c + r, lo, hi) by mt_gemm_clamp; c None, one value per row
    (shape (M, 1), stride 0 along N) or (M, N); r None or (M, N) C-contiguous."""
    (M, K), N = a.shape, b.shape[1]
    dtype = a.dtype
    ctype = ctypes.c_float if dtype == np.float32 else ctypes.c_double
    fn = getattr(lib, "gemm_clamp_f32" if dtype == np.float32 else "gemm_clamp_f64")
    fn.restype = None
    y = np.full((M, N), np.nan, dtype)  # every element must be written
    ptr = lambda x: ctypes.c_void_p(x.__array_interface__["data"][0]) if x is not None else None  # noqa: E731
    st = lambda x: [s // x.itemsize for s in x.strides]  # noqa: E731
    (ar, ac), (br, bc) = st(a), st(b)
    cr, cc = st(np.broadcast_to(c, (M, N))) if c is not None else (0, 0)
    L = ctypes.c_long
    fn(ptr(a), ptr(b), ptr(c), ptr(r), ptr(y), L(M), L(N), L(K), L(ar), L(ac), L(br), L(bc), L(cr), L(cc), ctype(alpha),
       ctype(beta), ctype(lo), ctype(hi), ctypes.c_int(threads))
    return y


def _check(lib, M, N, K, dtype, cshape, alpha, lo, hi, threads=1, seed=0, residual=False):
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, (M, K)).astype(dtype)
    b = rng.uniform(-1, 1, (K, N)).astype(dtype)
    c = None if cshape is None else rng.uniform(-1, 1, {"row": (M, 1), "full": (M, N)}[cshape]).astype(dtype)
    r = rng.uniform(-4, 4, (M, N)).astype(dtype) if residual else None
    beta = 1.5
    y = _gemm_clamp(lib, a, b, c, alpha, beta, lo, hi, threads, r)
    ref = alpha * (a.astype(np.float64) @ b.astype(np.float64))
    if c is not None:
        ref = ref + beta * np.broadcast_to(c, ref.shape)
    if r is not None:
        ref = ref + r
    ref = np.clip(ref, lo, hi)
    tol = (1e-5, 2e-6 * K) if dtype == np.float32 else (1e-12, 1e-14 * K)
    np.testing.assert_allclose(y, ref, rtol=tol[0], atol=tol[1])


# N around the vector widths (8, 16 floats; 4, 8 doubles) and the panel (2 vectors): a last panel
# of 1..4 columns (dot products only), one vector plus 1..4 (N = 49), one vector or less, more.
NS = [1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 18, 20, 21, 24, 31, 32, 33, 36, 37, 47, 48, 49, 50, 64, 65, 196]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("N", NS)
def test_ragged_panels_equal_numpy(lib, N, dtype):
    # Big enough for the tiles (M*N*K >= 32^3) at every N: full row panels read in place and a
    # ragged last one, one K block and two (KC 128).
    for M, K in ((203, 200), (40, 1000), (97, 400), (9, 3700)):
        _check(lib, M, N, K, dtype, "row", 1.0, 0.0, 6.0, seed=N)
        _check(lib, M, N, K, dtype, "row", 1.0, -np.inf, np.inf, seed=N, residual=True)


@pytest.mark.parametrize("cshape", [None, "row", "full"])
@pytest.mark.parametrize("alpha,lo,hi", [(1.0, -np.inf, np.inf), (0.5, 0.0, 6.0), (-2.0, -0.25, np.inf)])
@pytest.mark.parametrize("M,N,K", [(64, 49, 160), (40, 196, 64), (17, 33, 129), (24, 100, 16), (8, 20, 16)])
def test_epilogue_in_the_tiles_equals_numpy(lib, M, N, K, cshape, alpha, lo, hi):
    # (8, 20, 16) is below the tiles' threshold (M*N*K < 32^3): the plain loops' epilogue
    for dtype in (np.float32, np.float64):
        for residual in (False, True):
            _check(lib, M, N, K, dtype, cshape, alpha, lo, hi, seed=M + N + K, residual=residual)


@pytest.mark.parametrize("N", [49, 36, 196, 100])
def test_packed_rows_and_threads_equal_numpy(lib, N):
    # K 512 float: rows 2 KiB apart, so A is packed (wide tiles); two threads split the tiles.
    for dtype in (np.float32, np.float64):
        _check(lib, 70, N, 512, dtype, "row", 1.0, 0.0, 6.0, threads=2, seed=N)
        _check(lib, 70, N, 512, dtype, "row", 1.0, 0.0, 6.0, threads=2, seed=N, residual=True)
        _check(lib, 13, N, 512, dtype, None, 2.0, -np.inf, np.inf, threads=1, seed=N)


def test_nan_and_clamp_bounds_kept(lib):
    # A NaN in A reaches Y through the dot-product columns and the tiles alike (the clamp keeps NaN).
    rng = np.random.default_rng(3)
    for dtype in (np.float32, np.float64):
        a = rng.uniform(-1, 1, (16, 40)).astype(dtype)
        b = rng.uniform(-1, 1, (40, 49)).astype(dtype)
        a[3, 5] = np.nan
        y = _gemm_clamp(lib, a, b, np.zeros((16, 1), dtype), 1.0, 1.0, 0.0, 6.0, r=np.ones((16, 49), dtype))
        assert np.isnan(y[3]).all() and not np.isnan(np.delete(y, 3, axis=0)).any()
        assert (np.delete(y, 3, axis=0) >= 0).all() and (np.delete(y, 3, axis=0) <= 6).all()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("M,N,K", [(128, 600, 200), (203, 520, 130), (250, 300, 64)])
def test_tiles_of_up_to_256_rows_read_in_place_equal_numpy(lib, M, N, K, threads):
    # A's rows read in place (row stride not a multiple of 2 KiB) and Y wider than one column panel:
    # a tile takes every row (MT_GEMM_MC_DIRECT), B packed once per panel, ragged row panels last.
    for dtype in (np.float32, np.float64):
        _check(lib, M, N, K, dtype, "row", 1.0, 0.0, 6.0, threads=threads, seed=M + N)
        _check(lib, M, N, K, dtype, None, 1.0, -np.inf, np.inf, threads=threads, seed=M + N, residual=True)
