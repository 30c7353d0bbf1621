/* Template: data movement (Transpose, Concat) over element type T (see mt_base.h). Included once per type; no guard. */

/* ---- Transpose: y's dim d walks x with stride sx[d] (x's stride of axis perm[d]) ------------ */
static inline void MT_FN(mt_transpose)(const T *X, T *restrict Y, int rank, const mt_i *shape, const mt_i *sx) {
    mt_i n = 1;
    for (int d = 0; d < rank; d++) n *= shape[d];
    _Pragma("omp parallel for if(n > MT_PAR_MIN)")
    for (mt_i i = 0; i < n; i++) {
        mt_i r = i, o = 0;
        for (int d = rank - 1; d >= 0; d--) { o += (r % shape[d]) * sx[d]; r /= shape[d]; }
        Y[i] = X[o];
    }
}

/* ---- Concat: one input's (outer, chunk) block into y's (outer, total) rows at `offset` ------- */
static inline void MT_FN(mt_concat_part)(const T *X, T *restrict Y, mt_i outer, mt_i chunk, mt_i total, mt_i offset) {
    for (mt_i o = 0; o < outer; o++) memcpy(Y + o * total + offset, X + o * chunk, (size_t)chunk * sizeof(T));
}

