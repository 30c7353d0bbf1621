/* Template: GEMM over element type T (see mt_base.h and mt_gemm.h). Included once per float type
 * by mt_gemm.h; no guard.
 *
 * Y[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] (+ beta * C broadcast). A(i,k) = A[i*ar + k*ac],
 * B(k,j) = B[k*br + j*bc], C (may be NULL) C(i,j) = C[i*cr + j*cc]; Y is C-contiguous and shares
 * no memory with A, B or C. mt_gemm_clamp also adds R (may be NULL; C-contiguous like Y, sharing
 * no memory with it: a residual connection fused into the product) and clamps. */

#define MT_GEMM_VL ((mt_i)(MT_GEMM_VBYTES / sizeof(T)))  /* elements of T per vector */
#define MT_GEMM_NR (MT_GEMM_NV * MT_GEMM_VL)               /* NV vectors of T */
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

#define MT_GEMM_DOTROWS 8 /* rows of a transposed B per step of mt_gemm_plain's dot products */
static inline void MT_FN(mt_gemm_plain)(const T *A, const T *B, const T *C, const T *R, T *restrict Y, mt_i M,
                                        mt_i N, mt_i K, mt_i ar, mt_i ac, mt_i br, mt_i bc, mt_i cr, mt_i cc, T alpha,
                                        T beta, T lo, T hi) {
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
        } else if (br == 1 && ac == 1) {
            /* Dot products of contiguous rows (B stored transposed), MT_GEMM_DOTROWS rows at a time:
             * as many sums in flight and rows streaming at once. One at a time, each row's sum waited
             * on its own additions and B (the weights, from memory) came one stream at a time:
             * MobileNetV2's classifier (1x1280 by 1000x1280) 0.63 ms on one core where onnxruntime
             * takes 0.32. */
            const T *a = A + i * ar;
            _Pragma("omp parallel for if(N * K > 8 * MT_GEMM_SMALL && mt_threads() > 1)")
            for (mt_i jq = 0; jq < (N + MT_GEMM_DOTROWS - 1) / MT_GEMM_DOTROWS; jq++) {
                const mt_i j0 = jq * MT_GEMM_DOTROWS;
                if (j0 + MT_GEMM_DOTROWS <= N) {
                    const T *b = B + j0 * bc;
                    T s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
                    _Pragma("omp simd reduction(+:s0,s1,s2,s3,s4,s5,s6,s7)")
                    for (mt_i k = 0; k < K; k++) {
                        const T ak = a[k];
                        s0 += ak * b[k]; s1 += ak * b[bc + k]; s2 += ak * b[2 * bc + k]; s3 += ak * b[3 * bc + k];
                        s4 += ak * b[4 * bc + k]; s5 += ak * b[5 * bc + k]; s6 += ak * b[6 * bc + k]; s7 += ak * b[7 * bc + k];
                    }
                    y[j0] = s0; y[j0 + 1] = s1; y[j0 + 2] = s2; y[j0 + 3] = s3;
                    y[j0 + 4] = s4; y[j0 + 5] = s5; y[j0 + 6] = s6; y[j0 + 7] = s7;
                    continue;
                }
                for (mt_i j = j0; j < N; j++) {
                    const T *b = B + j * bc;
                    T acc = 0;
                    _Pragma("omp simd reduction(+:acc)")
                    for (mt_i k = 0; k < K; k++) acc += a[k] * b[k];
                    y[j] = acc;
                }
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
        if (R)
            for (mt_i j = 0; j < N; j++) y[j] += R[i * N + j];
        if (lo > -(T)INFINITY || hi < (T)INFINITY)
            for (mt_i j = 0; j < N; j++) y[j] = MT_GEMM_CLAMP(y[j], lo, hi);
    }
}

/* Packs rows [0, mc) x depth [0, kc) of op(A) (already offset to the block) in panels of MR rows:
 * pa[(p * kc + k) * MR + r] = A(p*MR + r, k), rows past mc zero. */
MT_INNER void MT_FN(mt_gemm_pack_a)(const T *A, T *restrict pa, mt_i mc, mt_i kc, mt_i ar, mt_i ac) {
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
MT_INNER void MT_FN(mt_gemm_pack_b)(const T *B, T *restrict pb, mt_i kc, mt_i nc, mt_i br, mt_i bc) {
    mt_i whole = nc / MT_GEMM_NR; /* full micro-panels */
    if (bc == 1) { /* row by row: B's rows are read contiguously, whatever their stride */
        for (mt_i k = 0; k < kc; k++) {
            const T *b = B + k * br;
            for (mt_i q = 0; q < whole; q++) /* a constant size: inlined as vector moves, not a call */
                memcpy(pb + (q * kc + k) * MT_GEMM_NR, b + q * MT_GEMM_NR, sizeof(T) * MT_GEMM_NR);
        }
    } else if (br == 1) { /* a transposed B: column by column, each read contiguously along K */
        for (mt_i q = 0; q < whole; q++)
            for (mt_i c = 0; c < MT_GEMM_NR; c++) {
                const T *b = B + (q * MT_GEMM_NR + c) * bc;
                T *p = pb + q * kc * MT_GEMM_NR + c;
                for (mt_i k = 0; k < kc; k++)
                    p[k * MT_GEMM_NR] = b[k];
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

/* The epilogue a register tile applies as it stores its last K block: y = clamp(y * alpha + the
 * row's C value + R, lo, hi), the operations in the order of the passes over Y it replaces. */
typedef struct {
    T alpha, beta, lo, hi;
    const T *c; /* C at the tile's first row (one value per row, cc == 0), or NULL */
    mt_i cr;
    const T *r; /* R at the tile's first element (rows lr apart), or NULL */
    mt_i lr;
} MT_FN(mt_gemm_ep);

/* Y[0:mr, 0:nr] = (add ? Y : 0) + acc (rows W apart), then the epilogue when ep is given. */
MT_INNER void MT_FN(mt_gemm_store)(const T *restrict acc, mt_i W, T *restrict y, mt_i ldy, mt_i mr, mt_i nr,
                                   int add, const MT_FN(mt_gemm_ep) *ep) {
    if (ep) {
        const T alpha = ep->alpha, lo = ep->lo, hi = ep->hi;
        for (mt_i r = 0; r < mr; r++) {
            T *yr = y + r * ldy;
            const T *ar = acc + r * W;
            const T ci = ep->c ? ep->beta * ep->c[r * ep->cr] : (T)0;
            const T *rr = ep->r ? ep->r + r * ep->lr : 0;
            /* each case its own vector loop, full width with a constant trip count; Y is not read
             * unless added to (a load of Y's line, not yet in cache, would wait where a store does not) */
#define MT_GEMM_EP_LOOP(n, V, BIAS, RES)                                                               \
    _Pragma("omp simd")                                                                               \
    for (mt_i c = 0; c < (n); c++) {                                                                  \
        T v = V;                                                                                      \
        v *= alpha;                                                                                   \
        BIAS;                                                                                         \
        RES;                                                                                          \
        yr[c] = MT_GEMM_CLAMP(v, lo, hi);                                                             \
    }
#define MT_GEMM_EP_CASES(n, RES)                                                                       \
    if (add && ep->c) { MT_GEMM_EP_LOOP(n, yr[c] + ar[c], v += ci, RES) }                             \
    else if (add) { MT_GEMM_EP_LOOP(n, yr[c] + ar[c], (void)0, RES) }                                 \
    else if (ep->c) { MT_GEMM_EP_LOOP(n, ar[c], v += ci, RES) }                                       \
    else { MT_GEMM_EP_LOOP(n, ar[c], (void)0, RES) }
            if (rr && nr == W) {
                MT_GEMM_EP_CASES(W, v += rr[c])
            } else if (rr) {
                MT_GEMM_EP_CASES(nr, v += rr[c])
            } else if (nr == W) {
                MT_GEMM_EP_CASES(W, (void)0)
            } else {
                MT_GEMM_EP_CASES(nr, (void)0)
            }
#undef MT_GEMM_EP_CASES
#undef MT_GEMM_EP_LOOP
        }
        return;
    }
    if (mr == MT_GEMM_MR && nr == W) {
        for (mt_i r = 0; r < MT_GEMM_MR; r++) {
            T *yr = y + r * ldy;
            const T *ar = acc + r * W;
            if (add) {
                _Pragma("omp simd")
                for (mt_i c = 0; c < W; c++) yr[c] += ar[c];
            } else {
                _Pragma("omp simd")
                for (mt_i c = 0; c < W; c++) yr[c] = ar[c];
            }
        }
    } else {
        for (mt_i r = 0; r < mr; r++)
            for (mt_i c = 0; c < nr; c++) y[r * ldy + c] = add ? y[r * ldy + c] + acc[r * W + c] : acc[r * W + c];
    }
}

/* The register tile: Y[0:mr, 0:nr] (row stride ldy) = (add ? Y : 0) + A-panel @ the first W
 * columns of a pb micro-panel, where A(r, k) = a[r*rs + k*ks]: a packed panel (rs 1, ks MR) or
 * rows of A read in place (rs ar, ks 1). The accumulators are a fixed-size array the compiler
 * keeps in vector registers; each layout and width is a function of its own so that its strides
 * and trip counts are constants: W is NR (NV vectors) for whole micro-panels, fewer vectors for
 * the ragged last one (N = 49 on AVX-512: 48 columns computed, not 64). */
#define MT_GEMM_MICRO_BODY(RS, KS, W, PREFETCH)                                                        \
    T acc[MT_GEMM_MR][W];                                                                              \
    const T *b = __builtin_assume_aligned(pb, 64);                                                     \
    for (mt_i r = 0; r < MT_GEMM_MR; r++)                                                              \
        for (mt_i c = 0; c < (W); c++) acc[r][c] = 0;                                                  \
    for (mt_i k = 0; k < kc; k++) {                                                                    \
        PREFETCH;                                                                                      \
        const T *bk = b + k * MT_GEMM_NR;                                                              \
        for (mt_i r = 0; r < MT_GEMM_MR; r++) {                                                        \
            T ark = a[r * (RS) + k * (KS)];                                                            \
            _Pragma("omp simd")                                                                        \
            for (mt_i c = 0; c < (W); c++) MT_GEMM_MAC(acc[r][c], ark, bk[c]);                         \
        }                                                                                              \
    }                                                                                                  \
    MT_FN(mt_gemm_store)(&acc[0][0], (W), y, ldy, mr, nr, add, ep);

/* A's next rows read in place (pf, NULL for none), a cache line of each per line of the rows in
 * use: they come from memory while this tile computes. The weights of a 1x1 convolution are read
 * in place, MR rows of a few hundred values each, runs too short for the hardware prefetcher
 * (320x49x1280 with the weights out of cache 0.59 ms, in cache 0.34). */
#define MT_GEMM_PREFETCH_ROWS                                                                          \
    if (pf && k % (mt_i)(64 / sizeof(T)) == 0)                                                         \
        for (mt_i r = 0; r < MT_GEMM_MR; r++) __builtin_prefetch(pf + r * lda + k, 0, 3)

/* mt_gemm_micro<V>: a packed A panel; mt_gemm_micro<V>_rows: A's rows in place (row stride lda,
 * unit column stride; all MR rows exist); V vectors wide. */
#define MT_GEMM_MICRO_FNS(V)                                                                           \
    static inline void MT_FN(mt_gemm_micro##V)(mt_i kc, const T *restrict pa, const T *restrict pb,    \
                                               T *restrict y, mt_i ldy, mt_i mr, mt_i nr, int add,     \
                                               const MT_FN(mt_gemm_ep) *ep) {                          \
        const T *a = __builtin_assume_aligned(pa, 64);                                                 \
        MT_GEMM_MICRO_BODY(1, MT_GEMM_MR, (V) * MT_GEMM_VL, (void)0)                                   \
    }                                                                                                  \
    static inline void MT_FN(mt_gemm_micro##V##_rows)(mt_i kc, const T *restrict a, mt_i lda,          \
                                                      const T *restrict pb, T *restrict y, mt_i ldy,   \
                                                      mt_i nr, int add, const MT_FN(mt_gemm_ep) *ep,   \
                                                      const T *pf) {                                   \
        const mt_i mr = MT_GEMM_MR;                                                                    \
        MT_GEMM_MICRO_BODY(lda, 1, (V) * MT_GEMM_VL, MT_GEMM_PREFETCH_ROWS)                            \
    }
MT_GEMM_MICRO_FNS(1)
#if MT_GEMM_NV >= 2
MT_GEMM_MICRO_FNS(2)
#endif
#if MT_GEMM_NV >= 3
MT_GEMM_MICRO_FNS(3)
#endif
#if MT_GEMM_NV >= 4
MT_GEMM_MICRO_FNS(4)
#endif
#undef MT_GEMM_MICRO_FNS
#undef MT_GEMM_MICRO_BODY
#undef MT_GEMM_PREFETCH_ROWS

/* The register tile nr columns need: ceil(nr / VL) vectors wide (A packed: apack, mr rows; in
 * place: arow, lda). */
static inline void MT_FN(mt_gemm_micro_any)(mt_i kc, const T *apack, const T *arow, mt_i lda, const T *pb,
                                            T *restrict y, mt_i ldy, mt_i mr, mt_i nr, int add,
                                            const MT_FN(mt_gemm_ep) *ep, const T *pf) {
    switch ((nr + MT_GEMM_VL - 1) / MT_GEMM_VL) {
#define MT_GEMM_CASE(V)                                                                                \
    case V:                                                                                            \
        if (arow)                                                                                      \
            MT_FN(mt_gemm_micro##V##_rows)(kc, arow, lda, pb, y, ldy, nr, add, ep, pf);                 \
        else                                                                                           \
            MT_FN(mt_gemm_micro##V)(kc, apack, pb, y, ldy, mr, nr, add, ep);                           \
        break;
        MT_GEMM_CASE(1)
#if MT_GEMM_NV >= 2
        MT_GEMM_CASE(2)
#endif
#if MT_GEMM_NV >= 3
        MT_GEMM_CASE(3)
#endif
#if MT_GEMM_NV >= 4
        MT_GEMM_CASE(4)
#endif
#undef MT_GEMM_CASE
    default:
        break;
    }
}

/* The last few columns of a ragged panel (nr <= MT_GEMM_DOT), as dot products over k: bt holds
 * them k-contiguous (bt[c*kc + k]). A register tile would spend a whole vector per row on them
 * (N = 49, a 7x7 plane: 64 columns computed for 49). Same epilogue as mt_gemm_store. */
MT_INNER void MT_FN(mt_gemm_dot)(mt_i kc, const T *a, mt_i rs, mt_i ks, const T *restrict bt, T *restrict y,
                                 mt_i ldy, mt_i mr, mt_i nr, int add, const MT_FN(mt_gemm_ep) *ep) {
    for (mt_i r = 0; r < mr; r++) {
        const T *ar = a + r * rs;
        for (mt_i c = 0; c < nr; c++) {
            const T *b = bt + c * kc;
            T s = 0;
            if (ks == 1) {
                _Pragma("omp simd reduction(+:s)")
                for (mt_i k = 0; k < kc; k++) s += ar[k] * b[k];
            } else {
                for (mt_i k = 0; k < kc; k++) MT_GEMM_MAC(s, ar[k * ks], b[k]);
            }
            T v = add ? y[r * ldy + c] + s : s;
            if (ep) {
                v *= ep->alpha;
                if (ep->c) v += ep->beta * ep->c[r * ep->cr];
                if (ep->r) v += ep->r[r * ep->lr + c];
                v = MT_GEMM_CLAMP(v, ep->lo, ep->hi);
            }
            y[r * ldy + c] = v;
        }
    }
}

/* One MC x NC tile of Y: over K in KC steps, pack the A block and the B panel into this thread's
 * scratch and run the register tiles, which apply alpha, a per-row C and the clamp as they store.
 * A ragged last panel runs one vector wide when its columns fit one, and leaves its last
 * columns past whole vectors, up to MT_GEMM_DOT of them, to mt_gemm_dot.
 * The scratch is static thread-local (allocated once per thread, never per call), so threads of
 * one GEMM and GEMMs running in different threads never share it. */
static inline void MT_FN(mt_gemm_tile)(const T *A, const T *B, const T *C, const T *R, T *restrict Y, mt_i N, mt_i K,
                                       mt_i ar, mt_i ac, mt_i br, mt_i bc, mt_i cr, mt_i cc, T alpha, T beta,
                                       T lo, T hi, mt_i i0, mt_i mc, mt_i j0, mt_i nc, mt_i jn, mt_i ncn) {
    static _Thread_local _Alignas(64) T pa[MT_GEMM_MC * MT_GEMM_KC];
    static _Thread_local _Alignas(64) T pb[MT_GEMM_KC * MT_GEMM_NR * MT_GEMM_NBLK];
    static _Thread_local _Alignas(64) T bt[MT_GEMM_KC * MT_GEMM_NBLK * MT_GEMM_DOT / 2];
    /* A tile has at most NBLK B micro-panels, so each A element is used a few times only: packing
     * A costs more than it saves (measured: 512x49x4608 float 26 -> 78 GFLOP/s, ResNet-18's conv
     * GEMMs 47 -> 43 ms on one thread), and full row panels of a row-major A are read in place;
     * unless its rows are a multiple of 2 KiB apart (the MR rows would share a few cache sets:
     * 1024^3 float 35 GFLOP/s in place) and the tile is wide enough to repay the packing. */
    int direct = ac == 1 && (nc <= 2 * MT_GEMM_NR || (ar * (mt_i)sizeof(T)) % 2048 != 0);
    mt_i full = direct ? mc / MT_GEMM_MR * MT_GEMM_MR : 0; /* rows read in place; the rest is packed */
    int clamp = lo > -(T)INFINITY || hi < (T)INFINITY;
    /* alpha, a C value per row and the clamp are applied by the register tiles as they store the
     * last K block, while the tile is in registers; a C varying along rows takes a pass over Y. */
    int fuse = (alpha != (T)1 || C || R || clamp) && (!C || cc == 0);
    /* The ragged last panel: its first `head` columns go to a register tile, `tail` to mt_gemm_dot. */
    const mt_i qlast = (nc - 1) / MT_GEMM_NR, last = nc - qlast * MT_GEMM_NR;
    const mt_i tail = last % MT_GEMM_VL <= MT_GEMM_DOT ? last % MT_GEMM_VL : 0, head = last - tail;
    /* K blocks: KC deep, or for a tile of a micro-panel or two with A's rows in place (N = 49) as
     * deep as the B scratch holds, 4 * KC: fewer passes adding into Y and longer runs of A's rows
     * (the rows packed stay under MR: their scratch holds MC / MR times that). */
    const mt_i kwide = MT_GEMM_KC * MT_GEMM_NBLK / 2 < MT_GEMM_KC * (MT_GEMM_MC / MT_GEMM_MR)
                           ? MT_GEMM_KC * MT_GEMM_NBLK / 2 : MT_GEMM_KC * (MT_GEMM_MC / MT_GEMM_MR);
    const mt_i kcap = direct && qlast < 2 && kwide > MT_GEMM_KC ? kwide : MT_GEMM_KC;
    /* blocks of equal depth rounded up to whole cache lines of A's rows, never deeper than kcap */
    const mt_i nkb = (K + kcap - 1) / kcap, kline = (mt_i)(64 / sizeof(T));
    const mt_i kround = ((K + nkb - 1) / nkb + kline - 1) / kline * kline, kstep = kround < kcap ? kround : kcap;
    for (mt_i k0 = 0; k0 < K; k0 += kstep) {
        mt_i kc = K - k0 < kstep ? K - k0 : kstep;
        MT_FN(mt_gemm_pack_b)(B + k0 * br + j0 * bc, pb, kc, nc, br, bc);
        if (full < mc) MT_FN(mt_gemm_pack_a)(A + (i0 + full) * ar + k0 * ac, pa, mc - full, kc, ar, ac);
        for (mt_i c = 0; c < tail; c++)
            for (mt_i k = 0; k < kc; k++) bt[c * kc + k] = pb[(qlast * kc + k) * MT_GEMM_NR + head + c];
        /* Micro-panels outer (each stays in L1 while A's rows stream past), except for a tile of a
         * micro-panel or two with A's rows in place (the weights of a 1x1 convolution of a 7x7
         * plane): there rows outer, so that each row panel of A comes from memory once and serves
         * every micro-panel from L1, and the next row panel is prefetched (see MT_GEMM_PREFETCH_ROWS). */
        const mt_i np = (mc + MT_GEMM_MR - 1) / MT_GEMM_MR, nq = qlast + 1;
        const int rows_outer = direct && qlast < 2;
        /* ... and with the rows big enough to have left the cache since they were last read (the
         * weights of a model's layer; a few percent slower where they are still in L1 or L2) */
        const int prefetch = rows_outer && mc * K >= 65536;
        /* The B block packed next (this tile's next K block, else the first of the tile after it,
         * columns jn.. when ncn > 0), a share of its lines before each register tile: packed from
         * the cache, not from memory a line at a time (a layer's weights, rows far apart). */
        const int more = k0 + kc < K;
        const mt_i k1 = more ? k0 + kc : 0, j1 = more ? j0 : jn, nc1 = more ? nc : ncn;
        const mt_i kc1 = K - k1 < kstep ? K - k1 : kstep, per = (mt_i)(64 / sizeof(T));
        const int by_rows = bc == 1, by_cols = br == 1 && bc != 1; /* B's rows, or a transposed B's columns */
        const mt_i run = by_rows ? (nc1 + per - 1) / per : (kc1 + per - 1) / per; /* lines per row or column */
        const mt_i lines = nc1 <= 0 ? 0 : by_rows ? kc1 * run : by_cols ? nc1 * run : 0;
        const mt_i share = (lines + np * nq - 1) / (np * nq);
        mt_i fetched = 0, outer = 0, inner = 0; /* the next line: row or column `outer`, `inner` lines in */
        for (mt_i it = 0; it < np * nq; it++) {
            for (mt_i f = 0; f < share && fetched < lines; f++, fetched++) {
                __builtin_prefetch(by_rows ? B + (k1 + outer) * br + j1 + inner * per
                                           : B + (j1 + outer) * bc + k1 + inner * per, 0, 2);
                if (++inner == run) inner = 0, outer++;
            }
            const mt_i q = rows_outer ? it % nq : it / np, p = rows_outer ? it / nq : it % np;
            mt_i nr = q < qlast ? MT_GEMM_NR : head;
            const T *pq = pb + q * kc * MT_GEMM_NR;
            {
                mt_i row = p * MT_GEMM_MR, mr = mc - row < MT_GEMM_MR ? mc - row : MT_GEMM_MR;
                T *y = Y + (i0 + row) * N + j0 + q * MT_GEMM_NR;
                const T *rq = R ? R + (i0 + row) * N + j0 + q * MT_GEMM_NR : 0;
                MT_FN(mt_gemm_ep) ep = {alpha, beta, lo, hi, C ? C + (i0 + row) * cr : 0, cr, rq, N};
                const MT_FN(mt_gemm_ep) *epp = fuse && k0 + kc >= K ? &ep : 0;
                const T *arow = A + (i0 + row) * ar + k0, *apack = pa + (row - full) * kc;
                /* rows outer: the next row panel, prefetched while the first micro-panel runs */
                const T *pf = prefetch && q == 0 && row + 2 * MT_GEMM_MR <= full ? arow + MT_GEMM_MR * ar : 0;
                if (nr > 0)
                    MT_FN(mt_gemm_micro_any)(kc, apack, row < full ? arow : 0, ar, pq, y, N, mr, nr, k0 > 0, epp, pf);
                if (q == qlast && tail > 0) {
                    MT_FN(mt_gemm_ep) ept = ep; /* the tail's columns start `head` in */
                    ept.r = rq ? rq + head : 0;
                    const MT_FN(mt_gemm_ep) *eptp = epp ? &ept : 0;
                    if (row < full)
                        MT_FN(mt_gemm_dot)(kc, arow, ar, 1, bt, y + head, N, mr, tail, k0 > 0, eptp);
                    else
                        MT_FN(mt_gemm_dot)(kc, apack, 1, MT_GEMM_MR, bt, y + head, N, mr, tail, k0 > 0, eptp);
                }
            }
        }
    }
    if (!fuse && (alpha != (T)1 || C || R || clamp))
        for (mt_i i = i0; i < i0 + mc; i++) {
            T *restrict y = Y + i * N;
            if (alpha != (T)1)
                for (mt_i j = j0; j < j0 + nc; j++) y[j] *= alpha;
            for (mt_i j = j0; j < j0 + nc; j++) y[j] += beta * C[i * cr + j * cc];
            if (R)
                for (mt_i j = j0; j < j0 + nc; j++) y[j] += R[i * N + j];
            if (clamp) {
                _Pragma("omp simd")
                for (mt_i j = j0; j < j0 + nc; j++) y[j] = MT_GEMM_CLAMP(y[j], lo, hi);
            }
        }
}

/* mt_gemm plus R (NULL: none) with every result clamped to [lo, hi] in the epilogue (-inf, inf:
 * no clamp). */
static inline void MT_FN(mt_gemm_clamp)(const T *A, const T *B, const T *C, const T *R, T *restrict Y, mt_i M,
                                        mt_i N, mt_i K, mt_i ar, mt_i ac, mt_i br, mt_i bc, mt_i cr, mt_i cc, T alpha,
                                        T beta, T lo, T hi) {
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
                if (R)
                    for (mt_i i = i0; i < i0 + m; i++)
                        for (mt_i j = j0; j < j0 + n; j++) Y[i * N + j] += R[i * N + j];
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
        MT_FN(mt_gemm_plain)(A, B, C, R, Y, M, N, K, ar, ac, br, bc, cr, cc, alpha, beta, lo, hi);
        return;
    }
    mt_i mc = MT_GEMM_MC, nc = MT_GEMM_NC, threads = 1;
    if (M * N * K > 8 * MT_GEMM_SMALL) threads = mt_threads();
    /* Y one tile wide and A's rows read in place (mt_gemm_tile's `direct`; the packed rows stay
     * under MR): the rows in one tile per thread, so that each thread packs B once, not once per MC
     * rows (1x1 convolutions of 7x7 and 14x14 planes: 1280x49x320 on 2 threads packed B 16 times). */
    const int in_place = ac == 1 && (ar * (mt_i)sizeof(T)) % 2048 != 0;
    /* A's rows read in place need no A scratch: a tile may then take up to MT_GEMM_MC_DIRECT rows,
     * so that B is packed (and, for a layer's weights, read from memory) once per column panel
     * rather than once per MC rows (GPT-2's 128-row products packed each weight matrix twice). */
    const mt_i mc_max =
        in_place && M <= MT_GEMM_MC_DIRECT ? (M + MT_GEMM_MR - 1) / MT_GEMM_MR * MT_GEMM_MR : MT_GEMM_MC;
    if (N <= nc && in_place && M >= threads * MT_GEMM_MR)
        mc = threads > 1 ? ((M + threads - 1) / threads + MT_GEMM_MR - 1) / MT_GEMM_MR * MT_GEMM_MR : M;
    else if (threads > 1)
        mt_gemm_balance(M, N, threads, MT_GEMM_MR, MT_GEMM_NR, mc_max, MT_GEMM_NC, &mc, &nc);
    else if (N <= nc && in_place)
        mc = M;
    else
        mc = mc_max;
    mt_i mt = (M + mc - 1) / mc, nt = (N + nc - 1) / nc;
#define MT_GEMM_TILES(PRAGMA)                                                                          \
    _Pragma(PRAGMA)                                                                                    \
    for (mt_i ib = 0; ib < mt; ib++)                                                                   \
        for (mt_i jb = 0; jb < nt; jb++) {                                                             \
            mt_i i0 = ib * mc, j0 = jb * nc, jn = jb + 1 < nt ? j0 + nc : 0;                          \
            /* the tile after this one in the order the static schedule hands them out */              \
            mt_i ncn = jb + 1 < nt || ib + 1 < mt ? (N - jn < nc ? N - jn : nc) : 0;                   \
            MT_FN(mt_gemm_tile)(A, B, C, R, Y, N, K, ar, ac, br, bc, cr, cc, alpha, beta, lo, hi, i0,  \
                                M - i0 < mc ? M - i0 : mc, j0, N - j0 < nc ? N - j0 : nc, jn, ncn);    \
        }
    /* Tiles in whole rounds: each thread the same contiguous run of them on every call (static), so
     * that a thread finds in its own cache the rows of Y it wrote last time and the next kernel's
     * static split of channels (the depthwise convolution after a 1x1 one) reads what it wrote. */
    if ((mt * nt) % threads == 0) {
        MT_GEMM_TILES("omp parallel for collapse(2) schedule(static) if(threads > 1 && mt * nt > 1)")
    } else {
        MT_GEMM_TILES("omp parallel for collapse(2) schedule(dynamic) if(threads > 1 && mt * nt > 1)")
    }
#undef MT_GEMM_TILES
}

static inline void MT_FN(mt_gemm)(const T *A, const T *B, const T *C, T *restrict Y, mt_i M, mt_i N, mt_i K,
                                  mt_i ar, mt_i ac, mt_i br, mt_i bc, mt_i cr, mt_i cc, T alpha, T beta) {
    MT_FN(mt_gemm_clamp)(A, B, C, 0, Y, M, N, K, ar, ac, br, bc, cr, cc, alpha, beta, -(T)INFINITY, (T)INFINITY);
}

#undef MT_GEMM_CLAMP
#undef MT_GEMM_DOTROWS
#undef MT_GEMM_NR
#undef MT_GEMM_VL
#undef MT_GEMM_NC
#undef MT_GEMM_MAC
