/* GEMM, per float type: Y = alpha * op(A) @ op(B) + beta * C (see mt_gemm_t.h).
 *
 * Blocked and packed (the BLIS/GotoBLAS structure): op(A) is copied in MC x KC blocks and op(B) in
 * KC x NC panels into aligned per-thread scratch, laid out so an MR x NR register tile of Y is
 * updated by plain loops the compiler vectorizes (-O3 -march=native). Every stride of A and B goes
 * through the packing, so transposed and strided operands run on the same micro-kernel. Threads
 * (OpenMP) take MC x NC tiles of Y. With MT_BLAS defined (build.py links scipy-openblas32 when it
 * is installed), large products call cblas_?gemm instead.
 */
#ifndef MT_GEMM_H
#define MT_GEMM_H

#include "mt_base.h"

/* Register tile: NV vectors of the widest unit the target has by MR rows, the accumulators
 * filling the registers (AVX-512: 8 x 2 of 32 zmm; 6 x 4 measured no faster on MobileNetV2's 1x1
 * convolutions, and slower where M is 32 or 64; AVX2: 6 x 2 of 16 ymm). NV <= 4. */
#if defined(__AVX512F__)
#define MT_GEMM_VBYTES 64
#define MT_GEMM_MR 8
#elif defined(__AVX__)
#define MT_GEMM_VBYTES 32
#define MT_GEMM_MR 6
#else
#define MT_GEMM_VBYTES 16
#define MT_GEMM_MR 4
#endif
#ifndef MT_GEMM_NV
#define MT_GEMM_NV 2                   /* vectors per register-tile row (NR = NV vectors of T) */
#endif
#if MT_GEMM_NV < 1 || MT_GEMM_NV > 4
#error "MT_GEMM_NV: 1 to 4 vectors per register-tile row"
#endif
#ifndef MT_GEMM_DOT
#define MT_GEMM_DOT 4                  /* a ragged panel's columns past whole vectors done as dot products */
#endif
#ifndef MT_GEMM_KC
#define MT_GEMM_KC 128                 /* depth of a packed block: a B micro-panel fills half of L1 */
#endif
#ifndef MT_GEMM_MC
#define MT_GEMM_MC (MT_GEMM_MR * 12)   /* rows of a packed A block (L2) */
#endif
#ifndef MT_GEMM_MC_DIRECT
#define MT_GEMM_MC_DIRECT 256          /* rows of a tile whose A rows are read in place (no A block) */
#endif
#ifndef MT_GEMM_NBLK
#define MT_GEMM_NBLK 8                 /* micro-panels per packed B panel (NC = NBLK * NR) */
#endif
#define MT_GEMM_SMALL (32 * 32 * 32)   /* M*N*K below which the plain loops win over packing */

#ifdef _OPENMP
#include <omp.h>
#endif

/* The threads a parallel region started here would get. */
static inline mt_i mt_threads(void) {
#ifdef _OPENMP
    return omp_in_parallel() ? 1 : omp_get_max_threads();
#else
    return 1;
#endif
}

/* Tile sizes for `threads` threads (mc <= MC a multiple of MR, nc <= NC a multiple of NR) that
 * minimize the rows x columns the busiest thread computes, counting whole register tiles: the
 * default tiles left threads idle on convolution GEMMs (64x3136: 13 tiles on 2 threads; 512x49:
 * 6 row blocks, the last a third full). Ties go to bigger tiles. */
static inline void mt_gemm_balance(mt_i M, mt_i N, mt_i threads, mt_i MR, mt_i NR, mt_i MC, mt_i NC, mt_i *mc,
                                   mt_i *nc) {
    mt_i m0 = (M + MC - 1) / MC, n0 = (N + NC - 1) / NC, best = -1;
    mt_i mmax = (M + MR - 1) / MR, nmax = (N + NR - 1) / NR;
    for (mt_i mt = m0; mt <= 4 * m0 && mt <= mmax; mt++)
        for (mt_i nt = n0; nt <= 4 * n0 && nt <= nmax; nt++) {
            mt_i tm = ((M + mt - 1) / mt + MR - 1) / MR * MR, tn = ((N + nt - 1) / nt + NR - 1) / NR * NR;
            mt_i tiles = ((M + tm - 1) / tm) * ((N + tn - 1) / tn);
            mt_i cost = (tiles + threads - 1) / threads * tm * tn;
            if (best < 0 || cost < best) {
                best = cost;
                *mc = tm;
                *nc = tn;
            }
        }
}

#ifdef MT_BLAS
#include <cblas.h> /* scipy-openblas32 prefixes its symbols: scipy_cblas_sgemm */
/* OpenBLAS keeps its own thread pool: mt_gemm calls it single-threaded from OpenMP's threads. */
static inline void mt_blas_single_thread(void) {
    static _Thread_local int done = 0; /* OpenBLAS's setting is global; a flag per thread never races */
    if (!done) {
        scipy_openblas_set_num_threads(1);
        done = 1;
    }
}
#ifndef MT_BLAS_MIN
#define MT_BLAS_MIN (64L * 64 * 64) /* M*N*K from which the BLAS call pays for itself */
#endif
#endif

#define T float
#define MT_SFX f32
#define MT_CBLAS_GEMM scipy_cblas_sgemm
#include "mt_gemm_t.h"
#undef T
#undef MT_SFX
#undef MT_CBLAS_GEMM

#define T double
#define MT_SFX f64
#define MT_CBLAS_GEMM scipy_cblas_dgemm
#include "mt_gemm_t.h"
#undef T
#undef MT_SFX
#undef MT_CBLAS_GEMM

#endif /* MT_GEMM_H */
