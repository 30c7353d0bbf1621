/* Template: GEMM over element type T (see mt_base.h and mt_gemm.h). Included once per float type
 * by mt_gemm.h; no guard.
 *
 * Y[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] (+ beta * C broadcast). A(i,k) = A[i*ar + k*ac],
 * B(k,j) = B[k*br + j*bc], C (may be NULL) C(i,j) = C[i*cr + j*cc]; Y is C-contiguous and shares
 * no memory with A, B or C. */

#define MT_GEMM_NR ((mt_i)(2 * MT_GEMM_VBYTES / sizeof(T))) /* two vectors of T */
#define MT_GEMM_NC (MT_GEMM_NR * MT_GEMM_NBLK)

/* y += a * b as one fused multiply-add where the target has one (-std=c11 turns off contraction). */
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
#define MT_GEMM_MAC(y, a, b) ((y) = fma((a), (b), (y)))
#else
#define MT_GEMM_MAC(y, a, b) ((y) += (a) * (b))
#endif

/* The plain loops: small products, where packing costs more than it saves. */
/* The epilogue's clamp: min(max(v, lo), hi), NaN kept (Relu and Clip fused into the product). */
#define MT_GEMM_CLAMP(v, lo, hi) ((v) < (lo) ? (lo) : ((v) > (hi) ? (hi) : (v)))

static inline void MT_FN(mt_gemm_plain)(const T *A, const T *B, const T *C, T *restrict Y, mt_i M, mt_i N, mt_i K,
                                        mt_i ar, mt_i ac, mt_i br, mt_i bc, mt_i cr, mt_i cc, T alpha, T beta,
                                        T lo, T hi) {
    for (mt_i i = 0; i < M; i++) {
        T *restrict y = Y + i * N;
        if (bc == 1) {
            for (mt_i j = 0; j < N; j++) y[j] = 0;
            for (mt_i k = 0; k < K; k++) {
                T s = A[i * ar + k * ac];
                const T *restrict b = B + k * br;
                _Pragma("omp simd")
                for (mt_i j = 0; j < N; j++) MT_GEMM_MAC(y[j], s, b[j]);
            }
        } else if (br == 1 && ac == 1) { /* dot products of contiguous rows (B stored transposed) */
            const T *a = A + i * ar;
            _Pragma("omp parallel for if(N * K > 8 * MT_GEMM_SMALL && mt_threads() > 1)")
            for (mt_i j = 0; j < N; j++) {
                const T *b = B + j * bc;
                T acc = 0;
                _Pragma("omp simd reduction(+:acc)")
                for (mt_i k = 0; k < K; k++) acc += a[k] * b[k];
                y[j] = acc;
            }
        } else {
            for (mt_i j = 0; j < N; j++) {
                T acc = 0;
                for (mt_i k = 0; k < K; k++) MT_GEMM_MAC(acc, A[i * ar + k * ac], B[k * br + j * bc]);
                y[j] = acc;
            }
        }
        if (alpha != (T)1)
            for (mt_i j = 0; j < N; j++) y[j] *= alpha;
        if (C)
            for (mt_i j = 0; j < N; j++) y[j] += beta * C[i * cr + j * cc];
        if (lo > -(T)INFINITY || hi < (T)INFINITY)
            for (mt_i j = 0; j < N; j++) y[j] = MT_GEMM_CLAMP(y[j], lo, hi);
    }
}

/* Packs rows [0, mc) x depth [0, kc) of op(A) (already offset to the block) in panels of MR rows:
 * pa[(p * kc + k) * MR + r] = A(p*MR + r, k), rows past mc zero. */
static inline void MT_FN(mt_gemm_pack_a)(const T *A, T *restrict pa, mt_i mc, mt_i kc, mt_i ar, mt_i ac) {
    for (mt_i p = 0; p * MT_GEMM_MR < mc; p++) {
        mt_i rows = mc - p * MT_GEMM_MR < MT_GEMM_MR ? mc - p * MT_GEMM_MR : MT_GEMM_MR;
        const T *a = A + p * MT_GEMM_MR * ar;
        T *restrict dst = pa + p * kc * MT_GEMM_MR;
        if (ac == 1) { /* row by row: one read stream (rows a power-of-two apart would share cache sets) */
            for (mt_i r = 0; r < MT_GEMM_MR; r++) {
                const T *ar_ = a + r * ar;
                if (r < rows)
                    for (mt_i k = 0; k < kc; k++) dst[k * MT_GEMM_MR + r] = ar_[k];
                else
                    for (mt_i k = 0; k < kc; k++) dst[k * MT_GEMM_MR + r] = 0;
            }
        } else {
            for (mt_i k = 0; k < kc; k++)
                for (mt_i r = 0; r < MT_GEMM_MR; r++) dst[k * MT_GEMM_MR + r] = r < rows ? a[r * ar + k * ac] : (T)0;
        }
    }
}

/* Packs depth [0, kc) x columns [0, nc) of op(B) in micro-panels of NR columns:
 * pb[(q * kc + k) * NR + c] = B(k, q*NR + c), columns past nc zero. */
static inline void MT_FN(mt_gemm_pack_b)(const T *B, T *restrict pb, mt_i kc, mt_i nc, mt_i br, mt_i bc) {
    mt_i whole = nc / MT_GEMM_NR; /* full micro-panels */
    if (bc == 1) { /* row by row: B's rows are read contiguously, whatever their stride */
        for (mt_i k = 0; k < kc; k++) {
            const T *b = B + k * br;
            for (mt_i q = 0; q < whole; q++) /* a constant size: inlined as vector moves, not a call */
                memcpy(pb + (q * kc + k) * MT_GEMM_NR, b + q * MT_GEMM_NR, sizeof(T) * MT_GEMM_NR);
        }
    } else {
        for (mt_i q = 0; q < whole; q++)
            for (mt_i k = 0; k < kc; k++)
                for (mt_i c = 0; c < MT_GEMM_NR; c++)
                    pb[(q * kc + k) * MT_GEMM_NR + c] = B[k * br + (q * MT_GEMM_NR + c) * bc];
    }
    if (whole * MT_GEMM_NR < nc) { /* the ragged last micro-panel, zero past nc */
        mt_i cols = nc - whole * MT_GEMM_NR;
        for (mt_i k = 0; k < kc; k++)
            for (mt_i c = 0; c < MT_GEMM_NR; c++)
                pb[(whole * kc + k) * MT_GEMM_NR + c] = c < cols ? B[k * br + (whole * MT_GEMM_NR + c) * bc] : (T)0;
    }
}

/* The register tile: Y[0:mr, 0:nr] (row stride ldy) = (add ? Y : 0) + A-panel @ pb-panel, where
 * A(r, k) = a[r*rs + k*ks]: a packed panel (rs 1, ks MR) or rows of A read in place (rs ar, ks 1).
 * The accumulators are a fixed-size array the compiler keeps in vector registers; the two layouts
 * are separate functions so each gets constant strides. */
#define MT_GEMM_MICRO_BODY(RS, KS)                                                                     \
    T acc[MT_GEMM_MR][2 * MT_GEMM_VBYTES / sizeof(T)];                                                 \
    const T *b = __builtin_assume_aligned(pb, 64);                                                     \
    for (mt_i r = 0; r < MT_GEMM_MR; r++)                                                              \
        for (mt_i c = 0; c < MT_GEMM_NR; c++) acc[r][c] = 0;                                           \
    for (mt_i k = 0; k < kc; k++) {                                                                    \
        const T *bk = b + k * MT_GEMM_NR;                                                              \
        for (mt_i r = 0; r < MT_GEMM_MR; r++) {                                                        \
            T ark = a[r * (RS) + k * (KS)];                                                            \
            _Pragma("omp simd")                                                                        \
            for (mt_i c = 0; c < MT_GEMM_NR; c++) MT_GEMM_MAC(acc[r][c], ark, bk[c]);                  \
        }                                                                                              \
    }                                                                                                  \
    MT_FN(mt_gemm_store)(&acc[0][0], y, ldy, mr, nr, add);

static inline void MT_FN(mt_gemm_store)(const T *restrict acc, T *restrict y, mt_i ldy, mt_i mr, mt_i nr, int add) {
    if (mr == MT_GEMM_MR && nr == MT_GEMM_NR) {
        for (mt_i r = 0; r < MT_GEMM_MR; r++) {
            T *yr = y + r * ldy;
            const T *ar = acc + r * MT_GEMM_NR;
            if (add) {
                _Pragma("omp simd")
                for (mt_i c = 0; c < MT_GEMM_NR; c++) yr[c] += ar[c];
            } else {
                _Pragma("omp simd")
                for (mt_i c = 0; c < MT_GEMM_NR; c++) yr[c] = ar[c];
            }
        }
    } else {
        for (mt_i r = 0; r < mr; r++)
            for (mt_i c = 0; c < nr; c++)
                y[r * ldy + c] = add ? y[r * ldy + c] + acc[r * MT_GEMM_NR + c] : acc[r * MT_GEMM_NR + c];
    }
}

static inline void MT_FN(mt_gemm_micro)(mt_i kc, const T *restrict pa, const T *restrict pb, T *restrict y,
                                        mt_i ldy, mt_i mr, mt_i nr, int add) {
    const T *a = __builtin_assume_aligned(pa, 64);
    MT_GEMM_MICRO_BODY(1, MT_GEMM_MR)
}

/* A's rows in place (row stride lda, unit column stride; all MR rows exist). */
static inline void MT_FN(mt_gemm_micro_rows)(mt_i kc, const T *restrict a, mt_i lda, const T *restrict pb,
                                             T *restrict y, mt_i ldy, mt_i nr, int add) {
    const mt_i mr = MT_GEMM_MR;
    MT_GEMM_MICRO_BODY(lda, 1)
}
#undef MT_GEMM_MICRO_BODY

/* One MC x NC tile of Y: over K in KC steps, pack the A block and the B panel into this thread's
 * scratch, run the register tiles, then apply alpha and beta * C while the tile is in cache.
 * The scratch is static thread-local (allocated once per thread, never per call), so threads of
 * one GEMM and GEMMs running in different threads never share it. */
static inline void MT_FN(mt_gemm_tile)(const T *A, const T *B, const T *C, T *restrict Y, mt_i N, mt_i K,
                                       mt_i ar, mt_i ac, mt_i br, mt_i bc, mt_i cr, mt_i cc, T alpha, T beta,
                                       T lo, T hi, mt_i i0, mt_i mc, mt_i j0, mt_i nc) {
    static _Thread_local _Alignas(64) T pa[MT_GEMM_MC * MT_GEMM_KC];
    static _Thread_local _Alignas(64) T pb[MT_GEMM_KC * 2 * MT_GEMM_VBYTES / sizeof(T) * MT_GEMM_NBLK];
    /* A tile has at most NBLK B micro-panels, so each A element is used a few times only: packing
     * A costs more than it saves (measured: 512x49x4608 float 26 -> 78 GFLOP/s, ResNet-18's conv
     * GEMMs 47 -> 43 ms on one thread), and full row panels of a row-major A are read in place;
     * unless its rows are a multiple of 2 KiB apart (the MR rows would share a few cache sets:
     * 1024^3 float 35 GFLOP/s in place) and the tile is wide enough to repay the packing. */
    int direct = ac == 1 && (nc <= 2 * MT_GEMM_NR || (ar * (mt_i)sizeof(T)) % 2048 != 0);
    mt_i full = direct ? mc / MT_GEMM_MR * MT_GEMM_MR : 0; /* rows read in place; the rest is packed */
    for (mt_i k0 = 0; k0 < K; k0 += MT_GEMM_KC) {
        mt_i kc = K - k0 < MT_GEMM_KC ? K - k0 : MT_GEMM_KC;
        MT_FN(mt_gemm_pack_b)(B + k0 * br + j0 * bc, pb, kc, nc, br, bc);
        if (full < mc) MT_FN(mt_gemm_pack_a)(A + (i0 + full) * ar + k0 * ac, pa, mc - full, kc, ar, ac);
        for (mt_i q = 0; q * MT_GEMM_NR < nc; q++) {
            mt_i nr = nc - q * MT_GEMM_NR < MT_GEMM_NR ? nc - q * MT_GEMM_NR : MT_GEMM_NR;
            for (mt_i p = 0; p * MT_GEMM_MR < mc; p++) {
                mt_i row = p * MT_GEMM_MR, mr = mc - row < MT_GEMM_MR ? mc - row : MT_GEMM_MR;
                T *y = Y + (i0 + row) * N + j0 + q * MT_GEMM_NR;
                if (row < full)
                    MT_FN(mt_gemm_micro_rows)(kc, A + (i0 + row) * ar + k0, ar, pb + q * kc * MT_GEMM_NR, y, N, nr,
                                              k0 > 0);
                else
                    MT_FN(mt_gemm_micro)(kc, pa + (row - full) * kc, pb + q * kc * MT_GEMM_NR, y, N, mr, nr, k0 > 0);
            }
        }
    }
    int clamp = lo > -(T)INFINITY || hi < (T)INFINITY;
    if (alpha != (T)1 || C || clamp)
        for (mt_i i = i0; i < i0 + mc; i++) {
            T *restrict y = Y + i * N;
            if (alpha != (T)1)
                for (mt_i j = j0; j < j0 + nc; j++) y[j] *= alpha;
            if (C && cc == 0) { /* one value per row: a convolution's bias */
                T ci = beta * C[i * cr];
                _Pragma("omp simd")
                for (mt_i j = j0; j < j0 + nc; j++) y[j] += ci;
            } else if (C) {
                for (mt_i j = j0; j < j0 + nc; j++) y[j] += beta * C[i * cr + j * cc];
            }
            if (clamp) {
                _Pragma("omp simd")
                for (mt_i j = j0; j < j0 + nc; j++) y[j] = MT_GEMM_CLAMP(y[j], lo, hi);
            }
        }
}

/* mt_gemm with every result clamped to [lo, hi] in the epilogue (-inf, inf: no clamp). */
static inline void MT_FN(mt_gemm_clamp)(const T *A, const T *B, const T *C, T *restrict Y, mt_i M, mt_i N, mt_i K,
                                        mt_i ar, mt_i ac, mt_i br, mt_i bc, mt_i cr, mt_i cc, T alpha, T beta, T lo,
                                        T hi) {
    if (M <= 0 || N <= 0) return;
#ifdef MT_BLAS
    /* cblas needs one unit stride per operand; Y is row-major contiguous. C is added after. */
    if (M * N * K >= MT_BLAS_MIN && M < 0x7fffffff && N < 0x7fffffff && K < 0x7fffffff) {
        int ta = ac != 1, tb = bc != 1; /* op(A) stored transposed: A(i,k) = A[i + k*lda] */
        mt_i lda = ta ? ac : ar, ldb = tb ? bc : br;
        if ((!ta || ar == 1) && (!tb || br == 1) && lda >= (ta ? M : K) && ldb >= (tb ? K : N) && lda >= 1 &&
            ldb >= 1 && lda < 0x7fffffff && ldb < 0x7fffffff) {
            /* OpenBLAS runs single-threaded inside OpenMP's threads, each on a slab of Y: its own
             * pool beside OpenMP's spinning workers oversubscribed the CPUs (ResNet-18 12x slower). */
            mt_blas_single_thread();
            mt_i parts = M * N * K >= 8 * MT_GEMM_SMALL ? mt_threads() : 1, by_rows = M >= N;
            mt_i len = by_rows ? M : N, step = (len + parts - 1) / parts;
            _Pragma("omp parallel for if(parts > 1)")
            for (mt_i part = 0; part < parts; part++) {
                mt_i s0 = part * step, s1 = s0 + step < len ? s0 + step : len;
                if (s0 >= s1) continue;
                mt_i i0 = by_rows ? s0 : 0, m = by_rows ? s1 - s0 : M, j0 = by_rows ? 0 : s0, n = by_rows ? N : s1 - s0;
                MT_CBLAS_GEMM(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                              (int)m, (int)n, (int)K, alpha, A + i0 * ar, (int)lda, B + j0 * bc, (int)ldb, (T)0,
                              Y + i0 * N + j0, (int)N);
                if (C)
                    for (mt_i i = i0; i < i0 + m; i++)
                        for (mt_i j = j0; j < j0 + n; j++) Y[i * N + j] += beta * C[i * cr + j * cc];
                if (lo > -(T)INFINITY || hi < (T)INFINITY)
                    for (mt_i i = i0; i < i0 + m; i++)
                        for (mt_i j = j0; j < j0 + n; j++) Y[i * N + j] = MT_GEMM_CLAMP(Y[i * N + j], lo, hi);
            }
            return;
        }
    }
#endif
    /* A few rows over contiguous B rows: streaming B once beats padding the register tile. */
    if (K == 0 || M * N * K < MT_GEMM_SMALL || (M < MT_GEMM_MR / 2 && (bc == 1 || (br == 1 && ac == 1)))) {
        MT_FN(mt_gemm_plain)(A, B, C, Y, M, N, K, ar, ac, br, bc, cr, cc, alpha, beta, lo, hi);
        return;
    }
    mt_i mc = MT_GEMM_MC, nc = MT_GEMM_NC, threads = 1;
    if (M * N * K > 8 * MT_GEMM_SMALL) threads = mt_threads();
    if (threads > 1) mt_gemm_balance(M, N, threads, MT_GEMM_MR, MT_GEMM_NR, MT_GEMM_MC, MT_GEMM_NC, &mc, &nc);
    mt_i mt = (M + mc - 1) / mc, nt = (N + nc - 1) / nc;
    _Pragma("omp parallel for collapse(2) schedule(dynamic) if(threads > 1 && mt * nt > 1)")
    for (mt_i ib = 0; ib < mt; ib++)
        for (mt_i jb = 0; jb < nt; jb++) {
            mt_i i0 = ib * mc, j0 = jb * nc;
            MT_FN(mt_gemm_tile)(A, B, C, Y, N, K, ar, ac, br, bc, cr, cc, alpha, beta, lo, hi, i0, M - i0 < mc ? M - i0 : mc,
                                j0, N - j0 < nc ? N - j0 : nc);
        }
}

static inline void MT_FN(mt_gemm)(const T *A, const T *B, const T *C, T *restrict Y, mt_i M, mt_i N, mt_i K,
                                  mt_i ar, mt_i ac, mt_i br, mt_i bc, mt_i cr, mt_i cc, T alpha, T beta) {
    MT_FN(mt_gemm_clamp)(A, B, C, Y, M, N, K, ar, ac, br, bc, cr, cc, alpha, beta, -(T)INFINITY, (T)INFINITY);
}

#undef MT_GEMM_CLAMP
#undef MT_GEMM_NR
#undef MT_GEMM_NC
#undef MT_GEMM_MAC
