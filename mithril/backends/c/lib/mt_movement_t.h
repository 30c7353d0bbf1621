/* Template: data movement over element type T (see mt_base.h and mt_movement.h). Included once per type; no guard. */

/* ---- Strided copy: y (C-contiguous, `shape`) reads x at off + sum(i_d * sx[d]). Transpose,
 * Slice, Expand (stride 0), Tile, DepthToSpace and Split are this copy with other strides; rows
 * whose last stride is 1 are memcpy. */
static inline void MT_FN(mt_strided)(const T *X, T *restrict Y, int rank, const mt_i *shape, const mt_i *sx, mt_i off) {
    mt_i inner = rank ? shape[rank - 1] : 1, si = rank ? sx[rank - 1] : 0, outer = 1;
    for (int d = 0; d < rank - 1; d++) outer *= shape[d];
    if (outer == 0 || inner == 0) return;
    _Pragma("omp parallel for if(outer * inner > MT_PAR_MIN)")
    for (mt_i o = 0; o < outer; o++) {
        mt_i r = o, p = off;
        for (int d = rank - 2; d >= 0; d--) { p += (r % shape[d]) * sx[d]; r /= shape[d]; }
        T *y = Y + o * inner;
        if (si == 1) memcpy(y, X + p, (size_t)inner * sizeof(T));
        else for (mt_i j = 0; j < inner; j++) y[j] = X[p + j * si];
    }
}

/* ---- Strided copy whose y-innermost dim is strided in x while x's unit-stride dim is q (a
 * transpose of the last two axes, NCHW <-> NHWC): 32x32 tiles of the (q, last) plane, so both
 * sides stay in cache. Same arguments as mt_strided, plus q (< rank - 1, sx[q] == 1). */
static inline void MT_FN(mt_strided_tiled)(const T *X, T *restrict Y, int rank, const mt_i *shape, const mt_i *sx,
                                           mt_i off, int q) {
    mt_i nq = shape[q], nl = shape[rank - 1], sl = sx[rank - 1], syq = 1, outer = 1;
    for (int d = q + 1; d < rank; d++) syq *= shape[d];
    for (int d = 0; d < rank - 1; d++) if (d != q) outer *= shape[d];
    if (outer == 0 || nq == 0 || nl == 0) return;
    _Pragma("omp parallel for if(outer * nq * nl > MT_PAR_MIN)")
    for (mt_i o = 0; o < outer; o++) {
        mt_i r = o, px = off, py = 0, ystride = nl;
        for (int d = rank - 2; d >= 0; d--) {
            if (d == q) { ystride *= nq; continue; }
            mt_i c = r % shape[d];
            r /= shape[d];
            px += c * sx[d];
            py += c * ystride;
            ystride *= shape[d];
        }
        for (mt_i i0 = 0; i0 < nq; i0 += 32)
            for (mt_i j0 = 0; j0 < nl; j0 += 32) {
                mt_i i1 = i0 + 32 < nq ? i0 + 32 : nq, j1 = j0 + 32 < nl ? j0 + 32 : nl;
                for (mt_i i = i0; i < i1; i++)
                    for (mt_i j = j0; j < j1; j++) Y[py + i * syq + j] = X[px + i + j * sl];
            }
    }
}

/* ---- Concat: one input's (outer, chunk) block into y's (outer, total) rows at `offset` ------- */
static inline void MT_FN(mt_concat_part)(const T *X, T *restrict Y, mt_i outer, mt_i chunk, mt_i total, mt_i offset) {
    if (chunk == 0) return;
    _Pragma("omp parallel for if(outer * chunk > MT_PAR_MIN && outer > 1)")
    for (mt_i o = 0; o < outer; o++) memcpy(Y + o * total + offset, X + o * chunk, (size_t)chunk * sizeof(T));
}

/* ---- Split: y's (outer, chunk) block from x's (outer, total) rows at `offset` --------------- */
static inline void MT_FN(mt_split_part)(const T *X, T *restrict Y, mt_i outer, mt_i chunk, mt_i total, mt_i offset) {
    if (chunk == 0) return;
    _Pragma("omp parallel for if(outer * chunk > MT_PAR_MIN && outer > 1)")
    for (mt_i o = 0; o < outer; o++) memcpy(Y + o * chunk, X + o * total + offset, (size_t)chunk * sizeof(T));
}

/* ---- Gather: x as (outer, dim, inner), n indices -> y (outer, n, inner). 1: index out of range */
static inline int MT_FN(mt_gather)(const T *X, const void *Ix, int code, T *restrict Y, mt_i outer, mt_i dim, mt_i n,
                                   mt_i inner) {
    if (!mt_indices_ok(Ix, code, n, dim)) return 1;
    mt_i rows = outer * n;
    if (inner == 0) return 0;
    _Pragma("omp parallel for if(rows * inner > MT_PAR_MIN)")
    for (mt_i r = 0; r < rows; r++) {
        mt_i o = r / n, j = mt_index_at(Ix, code, r % n);
        if (j < 0) j += dim;
        memcpy(Y + r * inner, X + (o * dim + j) * inner, (size_t)inner * sizeof(T));
    }
    return 0;
}

/* ---- GatherElements: y (shape = indices' shape) reads x (strides sx) with the coordinate on
 * `axis` (of size dim in x) replaced by the index. 1: index out of range */
static inline int MT_FN(mt_gather_elements)(const T *X, const void *Ix, int code, T *restrict Y, int rank,
                                            const mt_i *shape, const mt_i *sx, int axis, mt_i dim) {
    mt_i n = 1;
    for (int d = 0; d < rank; d++) n *= shape[d];
    if (!mt_indices_ok(Ix, code, n, dim)) return 1;
    _Pragma("omp parallel for if(n > MT_PAR_MIN)")
    for (mt_i i = 0; i < n; i++) {
        mt_i r = i, p = 0;
        for (int d = rank - 1; d >= 0; d--) {
            mt_i c = r % shape[d];
            r /= shape[d];
            if (d == axis) { c = mt_index_at(Ix, code, i); if (c < 0) c += dim; }
            p += c * sx[d];
        }
        Y[i] = X[p];
    }
    return 0;
}

/* ---- GatherND: per batch b (of nb, x's batch block xb elements), m index tuples of k entries
 * (x dims dims[], strides sx[]) each select a slice of `slice` elements. 1: index out of range */
static inline int MT_FN(mt_gathernd)(const T *X, const void *Ix, int code, T *restrict Y, mt_i nb, mt_i xb, mt_i m,
                                     int k, const mt_i *dims, const mt_i *sx, mt_i slice) {
    for (mt_i t = 0; t < nb * m; t++)
        for (int j = 0; j < k; j++) {
            mt_i v = mt_index_at(Ix, code, t * k + j);
            if (v < -dims[j] || v >= dims[j]) return 1;
        }
    if (slice == 0) return 0;
    _Pragma("omp parallel for if(nb * m * slice > MT_PAR_MIN)")
    for (mt_i t = 0; t < nb * m; t++) {
        mt_i p = (t / m) * xb;
        for (int j = 0; j < k; j++) {
            mt_i v = mt_index_at(Ix, code, t * k + j);
            p += (v < 0 ? v + dims[j] : v) * sx[j];
        }
        memcpy(Y + t * slice, X + p, (size_t)slice * sizeof(T));
    }
    return 0;
}

/* Scatter reductions: none, add, mul, max, min. */
static inline void MT_FN(mt_scatter_apply)(T *y, T u, int reduction) {
    switch (reduction) {
    case 1: *y = (T)(*y + u); break;
    case 2: *y = (T)(*y * u); break;
    case 3: if (u > *y) *y = u; break;
    case 4: if (u < *y) *y = u; break;
    default: *y = u;
    }
}

/* ---- ScatterElements (y already holds data): updates (shape = indices' shape) go to y (strides
 * sy) with the coordinate on `axis` replaced by the index. In order, so duplicates reduce. */
static inline int MT_FN(mt_scatter_elements)(T *Y, const void *Ix, int code, const T *U, int rank, const mt_i *shape,
                                             const mt_i *sy, int axis, mt_i dim, int reduction) {
    mt_i n = 1;
    for (int d = 0; d < rank; d++) n *= shape[d];
    if (!mt_indices_ok(Ix, code, n, dim)) return 1;
    for (mt_i i = 0; i < n; i++) {
        mt_i r = i, p = 0;
        for (int d = rank - 1; d >= 0; d--) {
            mt_i c = r % shape[d];
            r /= shape[d];
            if (d == axis) { c = mt_index_at(Ix, code, i); if (c < 0) c += dim; }
            p += c * sy[d];
        }
        MT_FN(mt_scatter_apply)(Y + p, U[i], reduction);
    }
    return 0;
}

/* ---- ScatterND (y already holds data): m index tuples of k entries (y dims dims[], strides
 * sy[]) each take a slice of `slice` update elements. */
static inline int MT_FN(mt_scatternd)(T *Y, const void *Ix, int code, const T *U, mt_i m, int k, const mt_i *dims,
                                      const mt_i *sy, mt_i slice, int reduction) {
    for (mt_i t = 0; t < m * k; t++) {
        mt_i v = mt_index_at(Ix, code, t);
        if (v < -dims[t % k] || v >= dims[t % k]) return 1;
    }
    for (mt_i t = 0; t < m; t++) {
        mt_i p = 0;
        for (int j = 0; j < k; j++) {
            mt_i v = mt_index_at(Ix, code, t * k + j);
            p += (v < 0 ? v + dims[j] : v) * sy[j];
        }
        for (mt_i e = 0; e < slice; e++) MT_FN(mt_scatter_apply)(Y + p + e, U[t * slice + e], reduction);
    }
    return 0;
}

/* ---- Pad: y's coordinate c reads x at mt_pad_source(c - begin[d]); constant mode writes *value */
static inline void MT_FN(mt_pad)(const T *X, T *restrict Y, int rank, const mt_i *xshape, const mt_i *yshape,
                                 const mt_i *begin, int mode, T value) {
    mt_i n = 1;
    for (int d = 0; d < rank; d++) n *= yshape[d];
    _Pragma("omp parallel for if(n > MT_PAR_MIN)")
    for (mt_i i = 0; i < n; i++) {
        mt_i r = i, p = 0, stride = 1;
        int outside = 0;
        for (int d = rank - 1; d >= 0; d--) {
            mt_i c = mt_pad_source(r % yshape[d] - begin[d], xshape[d], mode);
            r /= yshape[d];
            if (c < 0) { outside = 1; break; }
            p += c * stride;
            stride *= xshape[d];
        }
        Y[i] = outside ? value : X[p];
    }
}

/* ---- Trilu: batches of (rows, cols); keep j - i >= k (upper) or j - i <= k (lower), else 0 */
static inline void MT_FN(mt_trilu)(const T *X, T *restrict Y, mt_i batch, mt_i rows, mt_i cols, mt_i k, int upper) {
    for (mt_i b = 0; b < batch; b++)
        for (mt_i i = 0; i < rows; i++)
            for (mt_i j = 0; j < cols; j++) {
                mt_i at = (b * rows + i) * cols + j;
                Y[at] = ((upper && j - i >= k) || (!upper && j - i <= k)) ? X[at] : (T)0;
            }
}

/* ---- Fill, EyeLike, Range ------------------------------------------------------------------ */
static inline void MT_FN(mt_fill)(T *restrict Y, mt_i n, T value) {
    for (mt_i i = 0; i < n; i++) Y[i] = value;
}

static inline void MT_FN(mt_eye)(T *restrict Y, mt_i rows, mt_i cols, mt_i k) {
    for (mt_i i = 0; i < rows; i++)
        for (mt_i j = 0; j < cols; j++) Y[i * cols + j] = (T)(j - i == k);
}

static inline void MT_FN(mt_range)(T *restrict Y, mt_i n, T start, T delta) {
    for (mt_i i = 0; i < n; i++) Y[i] = (T)(start + (T)i * delta);
}

/* ---- OneHot: indices (outer, inner) -> y (outer, depth, inner); negative indices count from
 * depth; an index out of range gives a row of `off`. */
static inline void MT_FN(mt_onehot)(const void *Ix, int code, const T *values, T *restrict Y, mt_i outer, mt_i depth,
                                    mt_i inner) {
    T off = values[0], on = values[1];
    for (mt_i o = 0; o < outer; o++)
        for (mt_i i = 0; i < inner; i++) {
            double v = mt_value_at(Ix, code, o * inner + i);
            if (v < 0) v += (double)depth;
            for (mt_i d = 0; d < depth; d++) Y[(o * depth + d) * inner + i] = (double)d == v ? on : off;
        }
}

/* ---- ReverseSequence: x as (dims[0], dims[1], inner); the first `lens[b]` steps of each batch
 * b are reversed on the time axis (0 or 1, the batch axis the other). 1: a length out of range */
static inline int MT_FN(mt_reverse_sequence)(const T *X, T *restrict Y, const void *L, int code, const mt_i *dims,
                                             mt_i inner, int time_axis) {
    mt_i nb = dims[1 - time_axis], nt = dims[time_axis];
    for (mt_i b = 0; b < nb; b++) {
        mt_i len = mt_index_at(L, code, b);
        if (len < 0 || len > nt) return 1;
    }
    for (mt_i a = 0; a < dims[0]; a++)
        for (mt_i c = 0; c < dims[1]; c++) {
            mt_i b = time_axis ? a : c, t = time_axis ? c : a, len = mt_index_at(L, code, b);
            mt_i src = t < len ? len - 1 - t : t;
            mt_i sa = time_axis ? a : src, sc = time_axis ? src : c;
            memcpy(Y + (a * dims[1] + c) * inner, X + (sa * dims[1] + sc) * inner, (size_t)inner * sizeof(T));
        }
    return 0;
}

/* ---- Resize: y[o] = sum over the taps of every axis of prod(w) * x[idx] (tables from
 * mt_resize_setup); a row outside tf_crop_and_resize's box is `extrapolation`. One tap on every
 * axis (nearest) copies the element as is. */
static inline void MT_FN(mt_resize)(const T *X, T *restrict Y, int rank, const mt_i *yshape, const mt_i *sx,
                                    const mt_i *nt, const mt_i *ntmax, const mt_i *tbase, const mt_i *obase,
                                    const mt_i *idx, const double *w, const mt_bool *outside, double extrapolation) {
    mt_i n = 1;
    int act[16], na = 0;
    for (int d = 0; d < rank; d++) {
        n *= yshape[d];
        if (nt[d] > 1) act[na++] = d;
    }
    _Pragma("omp parallel for if(n > MT_PAR_MIN / 4)")
    for (mt_i i = 0; i < n; i++) {
        mt_i o[16], base = 0, r = i;
        int out = 0;
        for (int d = rank - 1; d >= 0; d--) {
            o[d] = r % yshape[d];
            r /= yshape[d];
            out |= outside[obase[d] + o[d]];
            base += idx[tbase[d] + o[d] * ntmax[d]] * sx[d]; /* tap 0 of every axis */
        }
        if (out) { Y[i] = (T)extrapolation; continue; }
        if (na == 0) { Y[i] = X[base]; continue; }
        /* walk the taps of the active axes like an odometer */
        mt_i k[16] = {0};
        double acc = 0.0;
        for (;;) {
            mt_i p = base;
            double wt = 1.0;
            for (int j = 0; j < na; j++) {
                int d = act[j];
                mt_i at = tbase[d] + o[d] * ntmax[d];
                p += (idx[at + k[j]] - idx[at]) * sx[d];
                wt *= w[at + k[j]];
            }
            acc += wt * (double)X[p];
            int j = 0;
            while (j < na && ++k[j] == nt[act[j]]) k[j++] = 0;
            if (j == na) break;
        }
        Y[i] = (T)acc;
    }
}

/* ---- Compress: x as (outer, dim, inner); the rows of `dim` whose condition is true (the first
 * ncond of them have one). 1: their count differs from the compiled out_dim */
static inline int MT_FN(mt_compress)(const T *X, const mt_bool *cond, mt_i ncond, T *restrict Y, mt_i outer, mt_i dim,
                                     mt_i inner, mt_i out_dim) {
    mt_i n = ncond < dim ? ncond : dim, count = 0;
    for (mt_i j = 0; j < n; j++) count += cond[j] != 0;
    if (count != out_dim) return 1;
    for (mt_i o = 0; o < outer; o++) {
        mt_i k = 0;
        for (mt_i j = 0; j < n; j++)
            if (cond[j]) memcpy(Y + (o * out_dim + k++) * inner, X + (o * dim + j) * inner, (size_t)inner * sizeof(T));
    }
    return 0;
}

/* ---- NonZero: the coordinates (rank rows of `count`) of x's nonzero elements, in C order.
 * 1: their number differs from the compiled count */
static inline int MT_FN(mt_nonzero)(const T *X, int64_t *restrict Y, int rank, const mt_i *shape, mt_i count) {
    mt_i n = 1, k = 0;
    for (int d = 0; d < rank; d++) n *= shape[d];
    for (mt_i i = 0; i < n; i++) k += X[i] != (T)0;
    if (k != count) return 1;
    k = 0;
    for (mt_i i = 0; i < n; i++) {
        if (X[i] == (T)0) continue;
        mt_i r = i;
        for (int d = rank - 1; d >= 0; d--) { Y[d * count + k] = (int64_t)(r % shape[d]); r /= shape[d]; }
        k++;
    }
    return 0;
}

/* ---- GridSample: x (n, ch, dims[0..r)), grid (n, npts, r) with coordinates innermost axis
 * first, y (n, ch, npts): per point, the taps of every axis (mt_grid_taps) weighted together. */
static inline void MT_FN(mt_grid_sample)(const T *X, const T *G, T *restrict Y, mt_i n, mt_i ch, int r,
                                         const mt_i *dims, mt_i npts, int align, int mode, int pad) {
    mt_i plane = 1;
    for (int i = 0; i < r; i++) plane *= dims[i];
    _Pragma("omp parallel for if(n * npts * ch > MT_PAR_MIN / 16)")
    for (mt_i bp = 0; bp < n * npts; bp++) {
        mt_i b = bp / npts, p = bp % npts, idx[8][4], k[8] = {0};
        double w[8][4];
        int nt[8];
        for (int i = 0; i < r; i++)
            nt[i] = mt_grid_taps((double)G[bp * r + (r - 1 - i)], dims[i], align, mode, pad, idx[i], w[i]);
        for (mt_i c = 0; c < ch; c++) Y[(b * ch + c) * npts + p] = (T)0;
        for (;;) {
            mt_i at = 0;
            double wt = 1.0;
            for (int i = 0; i < r; i++) { at = at * dims[i] + idx[i][k[i]]; wt *= w[i][k[i]]; }
            if (wt != 0.0)
                for (mt_i c = 0; c < ch; c++)
                    Y[(b * ch + c) * npts + p] += (T)(wt * (double)X[(b * ch + c) * plane + at]);
            int j = 0;
            while (j < r && ++k[j] == nt[j]) k[j++] = 0;
            if (j == r) break;
        }
    }
}

/* ---- AffineGrid: grid (n, dims[0..r), r) = theta (n, r, r + 1) applied to each point's
 * normalised coordinates (x, y[, z], 1), innermost axis first. */
static inline void MT_FN(mt_affine_grid)(const T *theta, T *restrict G, mt_i n, int r, const mt_i *dims, int align) {
    mt_i npts = 1;
    for (int i = 0; i < r; i++) npts *= dims[i];
    for (mt_i b = 0; b < n; b++)
        for (mt_i p = 0; p < npts; p++) {
            double base[9];
            mt_i q = p;
            for (int i = r - 1; i >= 0; i--) { /* base[r - 1 - i]: axis i's coordinate */
                mt_i at = q % dims[i], s = dims[i];
                q /= dims[i];
                base[r - 1 - i] = align ? (s == 1 ? 0.0 : -1.0 + 2.0 * (double)at / (double)(s - 1))
                                        : (2.0 * (double)at + 1.0) / (double)s - 1.0;
            }
            base[r] = 1.0;
            for (int j = 0; j < r; j++) {
                T acc = (T)0;
                for (int k = 0; k <= r; k++) acc += (T)base[k] * theta[(b * r + j) * (r + 1) + k];
                G[(b * npts + p) * r + j] = acc;
            }
        }
}
