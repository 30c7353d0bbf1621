/* Template: GEMM over element type T (see mt_base.h). Included once per float type by mt_gemm.h; no guard. */

/* ---- GEMM: Y[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] (+ beta * C broadcast) ------------------
 * A(i,k) = A[i*ar + k*ac], B(k,j) = B[k*br + j*bc]. When B's rows are contiguous (bc == 1) the
 * i-k-j order vectorizes over j; otherwise each Y(i,j) is a dot product over k. Rows run in
 * parallel. C (may be NULL): C(i,j) = C[i*cr + j*cc]. */
static inline void MT_FN(mt_gemm)(const T *A, const T *B, const T *C, T *restrict Y, mt_i M, mt_i N, mt_i K,
                           mt_i ar, mt_i ac, mt_i br, mt_i bc, mt_i cr, mt_i cc, T alpha, T beta) {
    _Pragma("omp parallel for if(M * N * K > MT_PAR_MIN)")
    for (mt_i i = 0; i < M; i++) {
        T *restrict y = Y + i * N;
        if (bc == 1) {
            for (mt_i j = 0; j < N; j++) y[j] = 0;
            const mt_i KB = 256; /* a block of B's rows stays in cache while y is updated */
            for (mt_i k0 = 0; k0 < K; k0 += KB) {
                mt_i k1 = k0 + KB < K ? k0 + KB : K;
                for (mt_i k = k0; k < k1; k++) {
                    T s = A[i * ar + k * ac];
                    const T *restrict b = B + k * br;
                    _Pragma("omp simd")
                    for (mt_i j = 0; j < N; j++) y[j] += s * b[j];
                }
            }
        } else {
            for (mt_i j = 0; j < N; j++) {
                T acc = 0;
                _Pragma("omp simd reduction(+:acc)")
                for (mt_i k = 0; k < K; k++) acc += A[i * ar + k * ac] * B[k * br + j * bc];
                y[j] = acc;
            }
        }
        if (alpha != (T)1)
            for (mt_i j = 0; j < N; j++) y[j] *= alpha;
        if (C)
            for (mt_i j = 0; j < N; j++) y[j] += beta * C[i * cr + j * cc];
    }
}
