/* Template: backward kernels over float type T (see mt_grad.h). Included once per type; no guard. */

/* ---- elementwise: dx from the cotangent g and the forward value a (x or y) ------------------- */
static inline void MT_FN(mt_grad_add)(const T *a, const T *b, T *restrict y, mt_i n) {
    MT_FOR_SIMD(n, i, y[i] = a[i] + b[i])
}

static inline void MT_FN(mt_grad_scale)(const T *g, T *restrict dx, mt_i n, T s) {
    MT_FOR_SIMD(n, i, dx[i] = s * g[i])
}

static inline void MT_FN(mt_grad_relu)(const T *g, const T *x, T *restrict dx, mt_i n) {
    MT_FOR_SIMD(n, i, dx[i] = x[i] > 0 ? g[i] : (T)0)
}

/* Clip: from_x (opset < 11, NumPy's rule): g where lo <= x <= hi; else (opset 11+, a = y): g where y
 * is neither bound, and the scalar bounds' gradients (dlo, dhi; NULL: not wanted) sum g where y is
 * that bound (hi wins a tie: it is applied last). */
static inline void MT_FN(mt_grad_clip)(const T *g, const T *a, T *restrict dx, mt_i n, T lo, T hi, int from_x,
                                       T *dlo, T *dhi) {
    if (from_x) {
        MT_FOR_SIMD(n, i, dx[i] = (a[i] >= lo && a[i] <= hi) ? g[i] : (T)0)
        return;
    }
    if (dx) {
        MT_FOR_SIMD(n, i, dx[i] = (a[i] == lo || a[i] == hi) ? (T)0 : g[i])
    }
    T sl = 0, sh = 0;
    if (dlo || dhi)
        for (mt_i i = 0; i < n; i++) {
            if (a[i] == hi) sh += g[i];
            else if (a[i] == lo) sl += g[i];
        }
    if (dlo) dlo[0] = sl;
    if (dhi) dhi[0] = sh;
}

static inline void MT_FN(mt_grad_tanh)(const T *g, const T *y, T *restrict dx, mt_i n) {
    MT_FOR_SIMD(n, i, dx[i] = g[i] * ((T)1 - y[i] * y[i]))
}

static inline void MT_FN(mt_grad_sigmoid)(const T *g, const T *y, T *restrict dx, mt_i n) {
    MT_FOR_SIMD(n, i, dx[i] = g[i] * y[i] * ((T)1 - y[i]))
}

static inline void MT_FN(mt_grad_exp)(const T *g, const T *y, T *restrict dx, mt_i n) {
    MT_FOR_SIMD(n, i, dx[i] = g[i] * y[i])
}

/* Dropout in training: y = x * keep * s, keep read back from y (an input exactly 0 gets 0). */
static inline void MT_FN(mt_grad_dropout)(const T *g, const T *y, T *restrict dx, mt_i n, T s) {
    MT_FOR_SIMD(n, i, dx[i] = y[i] != 0 ? g[i] * s : (T)0)
}

/* ---- broadcasting: dx[nx] = sum over the broadcast dims of s * g * mul / div^(1 + twice) -------
 * g, mul and div (each NULL: 1) walk `shape` (g's, C-contiguous); `sm`, `sd` and `sx` are mul's,
 * div's and dx's strides along it (0 where broadcast). Add/Sub/Mul/Div's operands, and a
 * Transpose's inverse (sx: the permuted strides). */
static inline void MT_FN(mt_grad_unbroadcast)(const T *g, const T *mul, const T *div, T *restrict dx, mt_i nx,
                                              int rank, const mt_i *shape, const mt_i *sm, const mt_i *sd,
                                              const mt_i *sx, T s, int twice) {
    mt_i n = 1;
    for (int d = 0; d < rank; d++) n *= shape[d];
    for (mt_i i = 0; i < nx; i++) dx[i] = 0;
    for (mt_i i = 0; i < n; i++) {
        T v = s * g[i];
        if (mul) v *= mul[mt_grad_offset(i, rank, shape, sm)];
        if (div) {
            T q = div[mt_grad_offset(i, rank, shape, sd)];
            v /= twice ? q * q : q;
        }
        dx[mt_grad_offset(i, rank, shape, sx)] += v;
    }
}

static inline void MT_FN(mt_grad_sqrt)(const T *g, const T *y, T *restrict dx, mt_i n) {
    MT_FOR_SIMD(n, i, dx[i] = g[i] * (T)0.5 / y[i])
}

/* dx (C-contiguous, `shape`) = s * g read with strides `sg` along shape (ReduceMean/ReduceSum). */
static inline void MT_FN(mt_grad_expand)(const T *g, T *restrict dx, int rank, const mt_i *shape, const mt_i *sg,
                                         T s) {
    mt_i n = 1;
    for (int d = 0; d < rank; d++) n *= shape[d];
    _Pragma("omp parallel for if(n > MT_PAR_MIN)")
    for (mt_i i = 0; i < n; i++) dx[i] = s * g[mt_grad_offset(i, rank, shape, sg)];
}

/* db[N] = column sums of g[M, N] (MatMulAdd's bias). */
static inline void MT_FN(mt_grad_colsum)(const T *g, T *restrict db, mt_i M, mt_i N) {
    for (mt_i j = 0; j < N; j++) db[j] = 0;
    for (mt_i i = 0; i < M; i++)
        for (mt_i j = 0; j < N; j++) db[j] += g[i * N + j];
}

/* ---- Softmax (log = 0) and LogSoftmax (log = 1) over the middle axis of (outer, n, inner) ---- */
static inline void MT_FN(mt_grad_softmax)(const T *g, const T *y, T *restrict dx, mt_i outer, mt_i n, mt_i inner,
                                          int log) {
    _Pragma("omp parallel for if(outer * n * inner > MT_PAR_MIN)")
    for (mt_i o = 0; o < outer; o++)
        for (mt_i j = 0; j < inner; j++) {
            const mt_i base = o * n * inner + j;
            T s = 0;
            for (mt_i k = 0; k < n; k++) s += log ? g[base + k * inner] : g[base + k * inner] * y[base + k * inner];
            for (mt_i k = 0; k < n; k++) {
                mt_i at = base + k * inner;
                dx[at] = log ? g[at] - exp(y[at]) * s : y[at] * (g[at] - s);
            }
        }
}

/* ---- GatherElements: dx (xshape) = 0, then g added at the gathered places; 1 when an index is
 * out of range. g and idx have `ishape`. */
static inline int MT_FN(mt_grad_gather_elements)(const T *g, const int64_t *idx, T *restrict dx, int rank,
                                                 const mt_i *ishape, const mt_i *xshape, int axis) {
    mt_i n = 1, nx = 1;
    for (int d = 0; d < rank; d++) {
        n *= ishape[d];
        nx *= xshape[d];
    }
    for (mt_i i = 0; i < nx; i++) dx[i] = 0;
    for (mt_i i = 0; i < n; i++) {
        mt_i rest = i, o = 0, step = 1;
        for (int d = rank - 1; d >= 0; d--) {
            mt_i c = rest % ishape[d];
            rest /= ishape[d];
            if (d == axis) {
                int64_t k = idx[i];
                if (k < 0) k += xshape[d];
                if (k < 0 || k >= xshape[d]) return 1;
                c = (mt_i)k;
            }
            o += c * step;
            step *= xshape[d];
        }
        dx[o] += g[i];
    }
    return 0;
}

/* ---- convolution (groups of Cg input and Mg output channels) --------------------------------
 * col2im: columns (Cg*K rows of P, row stride ld) added back into x (Cg planes), the inverse of
 * mt_im2col. */
static inline void MT_FN(mt_col2im)(const T *col, mt_i ld, T *restrict x, const mt_i *g, mt_i Cg) {
    const mt_i ID = g[0], IH = g[1], IW = g[2], OD = g[3], OH = g[4], OW = g[5];
    const mt_i KD = g[6], KH = g[7], KW = g[8], sd = g[9], sh = g[10], sw = g[11];
    const mt_i pd = g[12], ph = g[13], pw = g[14], dd = g[15], dh = g[16], dw = g[17];
    const mt_i K = KD * KH * KW, P = OD * OH * OW;
    /* Rows of one channel write only that channel's plane: channels in parallel. */
    _Pragma("omp parallel for if(Cg * K * P > MT_PAR_MIN)")
    for (mt_i c = 0; c < Cg; c++)
        for (mt_i k = 0; k < K; k++) {
            mt_i r = c * K + k, kd = (k / (KH * KW)) % KD, kh = (k / KW) % KH, kw = k % KW;
            for (mt_i od = 0; od < OD; od++) {
                mt_i id = od * sd - pd + kd * dd;
                if (id < 0 || id >= ID) continue;
                for (mt_i oh = 0; oh < OH; oh++) {
                    mt_i ih = oh * sh - ph + kh * dh;
                    if (ih < 0 || ih >= IH) continue;
                    const T *src = col + r * ld + (od * OH + oh) * OW;
                    T *dst = x + ((c * ID + id) * IH + ih) * IW;
                    for (mt_i ow = 0; ow < OW; ow++) {
                        mt_i iw = ow * sw - pw + kw * dw;
                        if (iw >= 0 && iw < IW) dst[iw] += src[ow];
                    }
                }
            }
        }
}

/* dX, dW, dB (each NULL when not wanted) of Y = Conv(X, W, B), `nb` images at a time: per group,
 * the chunk's cotangents G' [Mg, nb*P] and columns C' [R, nb*P] side by side, so each gradient is
 * one GEMM over the whole chunk (dW_g = G' C'^T, C' = W_g^T G' then col2im). Scratch `work`:
 * R*nb*P (C') + Mg*nb*P (G') + R*P (one image's im2col) + Mg*R (a later chunk's dW, added). */
static inline void MT_FN(mt_grad_conv)(const T *X, const T *W, const T *G, T *restrict dX, T *restrict dW,
                                       T *restrict dB, T *restrict work, int pointwise, mt_i nb, mt_i N, mt_i C,
                                       mt_i M, mt_i groups, const mt_i *g) {
    const mt_i Cg = C / groups, Mg = M / groups, S = g[0] * g[1] * g[2], P = g[3] * g[4] * g[5];
    const mt_i R = Cg * g[6] * g[7] * g[8];
    T *cols = work, *gs = work + R * nb * P, *col = gs + Mg * nb * P, *tmp = col + R * P;
    if (dB) {
        for (mt_i m = 0; m < M; m++) dB[m] = 0;
        for (mt_i n = 0; n < N; n++)
            for (mt_i m = 0; m < M; m++) {
                const T *gp = G + (n * M + m) * P;
                T s = 0;
                for (mt_i p = 0; p < P; p++) s += gp[p];
                dB[m] += s;
            }
    }
    if (dX) memset(dX, 0, (size_t)(N * C * S) * sizeof(T));
    for (mt_i n0 = 0; n0 < N; n0 += nb) {
        const mt_i nn = N - n0 < nb ? N - n0 : nb, L = nn * P;
        for (mt_i grp = 0; grp < groups; grp++) {
            for (mt_i j = 0; j < nn; j++)
                for (mt_i m = 0; m < Mg; m++)
                    memcpy(gs + m * L + j * P, G + ((n0 + j) * M + grp * Mg + m) * P, (size_t)P * sizeof(T));
            T *dw = dW ? dW + grp * Mg * R : 0;
            if (dw) {
                for (mt_i j = 0; j < nn; j++) {
                    const T *x = X + ((n0 + j) * C + grp * Cg) * S;
                    const T *src = x;
                    if (!pointwise) {
                        MT_FN(mt_im2col)(x, col, g, Cg);
                        src = col;
                    }
                    for (mt_i r = 0; r < R; r++) memcpy(cols + r * L + j * P, src + r * P, (size_t)P * sizeof(T));
                }
                /* dW_g[Mg, R] (+)= G'[Mg, L] @ C'[R, L]^T */
                MT_FN(mt_gemm)(gs, cols, 0, n0 ? tmp : dw, Mg, R, L, L, 1, 1, L, 0, 0, (T)1, (T)0);
                if (n0)
                    for (mt_i i = 0; i < Mg * R; i++) dw[i] += tmp[i];
            }
            if (dX) {
                /* C'[R, L] = W_g[Mg, R]^T @ G'[Mg, L], each image's columns added back into its dX */
                MT_FN(mt_gemm)(W + grp * Mg * R, gs, 0, cols, R, L, Mg, 1, R, L, 1, 0, 0, (T)1, (T)0);
                for (mt_i j = 0; j < nn; j++) {
                    T *dx = dX + ((n0 + j) * C + grp * Cg) * S;
                    if (pointwise)
                        for (mt_i r = 0; r < R; r++)
                            for (mt_i p = 0; p < P; p++) dx[r * S + p] += cols[r * L + j * P + p];
                    else
                        MT_FN(mt_col2im)(cols + j * P, L, dx, g, Cg);
                }
            }
        }
    }
}

/* ---- pools over NC planes: the cotangent of each window goes back to its taps ---------------- */
/* AveragePool (mode 0: divided by the input pixels in the window, 1: count_include_pad). */
static inline void MT_FN(mt_grad_avgpool)(const T *G, T *restrict dX, mt_i NC, const mt_i *g, int mode) {
    const mt_i ID = g[0], IH = g[1], IW = g[2], OD = g[3], OH = g[4], OW = g[5];
    const mt_i KD = g[6], KH = g[7], KW = g[8], sd = g[9], sh = g[10], sw = g[11];
    const mt_i pd = g[12], ph = g[13], pw = g[14], dd = g[15], dh = g[16], dw = g[17];
    const mt_i ed = g[18], eh = g[19], ew = g[20];
    const mt_i S = ID * IH * IW, P = OD * OH * OW;
    /* No padding and every window inside the input (LeNet's 2x2): one count, no bounds checks. */
    const int inside = !(pd | ph | pw | ed | eh | ew) && (OD - 1) * sd + (KD - 1) * dd < ID &&
                       (OH - 1) * sh + (KH - 1) * dh < IH && (OW - 1) * sw + (KW - 1) * dw < IW;
    _Pragma("omp parallel for if(NC * P * KD * KH * KW > MT_PAR_MIN)")
    for (mt_i c = 0; c < NC; c++) {
        T *dx = dX + c * S;
        for (mt_i i = 0; i < S; i++) dx[i] = 0;
        if (inside) {
            const T inv = (T)1 / (T)(KD * KH * KW);
            for (mt_i od = 0; od < OD; od++)
                for (mt_i oh = 0; oh < OH; oh++)
                    for (mt_i ow = 0; ow < OW; ow++) {
                        const T share = G[c * P + (od * OH + oh) * OW + ow] * inv;
                        for (mt_i kd = 0; kd < KD; kd++)
                            for (mt_i kh = 0; kh < KH; kh++) {
                                T *row = dx + ((od * sd + kd * dd) * IH + oh * sh + kh * dh) * IW + ow * sw;
                                for (mt_i kw = 0; kw < KW; kw++) row[kw * dw] += share;
                            }
                    }
            continue;
        }
        for (mt_i od = 0; od < OD; od++)
            for (mt_i oh = 0; oh < OH; oh++)
                for (mt_i ow = 0; ow < OW; ow++) {
                    mt_i cnt = 0, cnt_pad = 0;
                    for (int pass = 0; pass < 2; pass++) {
                        T share = pass ? G[c * P + (od * OH + oh) * OW + ow] / (T)(mode ? cnt_pad : cnt) : 0;
                        for (mt_i kd = 0; kd < KD; kd++) {
                            mt_i id = od * sd - pd + kd * dd;
                            if (id < -pd || id >= ID + ed) continue;
                            for (mt_i kh = 0; kh < KH; kh++) {
                                mt_i ih = oh * sh - ph + kh * dh;
                                if (ih < -ph || ih >= IH + eh) continue;
                                for (mt_i kw = 0; kw < KW; kw++) {
                                    mt_i iw = ow * sw - pw + kw * dw;
                                    if (iw < -pw || iw >= IW + ew) continue;
                                    if (!pass) cnt_pad++;
                                    if (id < 0 || id >= ID || ih < 0 || ih >= IH || iw < 0 || iw >= IW) continue;
                                    if (pass) dx[(id * IH + ih) * IW + iw] += share;
                                    else cnt++;
                                }
                            }
                        }
                        if (!pass && (mode ? cnt_pad : cnt) == 0) break;
                    }
                }
    }
}

/* MaxPool: each window's cotangent goes to its first maximum (taps in row-major order). */
static inline void MT_FN(mt_grad_maxpool)(const T *X, const T *G, T *restrict dX, mt_i NC, const mt_i *g) {
    const mt_i ID = g[0], IH = g[1], IW = g[2], OD = g[3], OH = g[4], OW = g[5];
    const mt_i KD = g[6], KH = g[7], KW = g[8], sd = g[9], sh = g[10], sw = g[11];
    const mt_i pd = g[12], ph = g[13], pw = g[14], dd = g[15], dh = g[16], dw = g[17];
    const mt_i S = ID * IH * IW, P = OD * OH * OW;
    _Pragma("omp parallel for if(NC * P * KD * KH * KW > MT_PAR_MIN)")
    for (mt_i c = 0; c < NC; c++) {
        const T *x = X + c * S;
        T *dx = dX + c * S;
        for (mt_i i = 0; i < S; i++) dx[i] = 0;
        for (mt_i od = 0; od < OD; od++)
            for (mt_i oh = 0; oh < OH; oh++)
                for (mt_i ow = 0; ow < OW; ow++) {
                    mt_i best = -1;
                    T m = 0;
                    for (mt_i kd = 0; kd < KD; kd++) {
                        mt_i id = od * sd - pd + kd * dd;
                        if (id < 0 || id >= ID) continue;
                        for (mt_i kh = 0; kh < KH; kh++) {
                            mt_i ih = oh * sh - ph + kh * dh;
                            if (ih < 0 || ih >= IH) continue;
                            for (mt_i kw = 0; kw < KW; kw++) {
                                mt_i iw = ow * sw - pw + kw * dw;
                                if (iw < 0 || iw >= IW) continue;
                                mt_i at = (id * IH + ih) * IW + iw;
                                if (best < 0 || x[at] > m) {
                                    best = at;
                                    m = x[at];
                                }
                            }
                        }
                    }
                    if (best >= 0) dx[best] += G[c * P + (od * OH + oh) * OW + ow];
                }
    }
}

/* ---- BatchNormalization over (N, C, S) -----------------------------------------------------
 * training == 0: the running statistics (mean, var) normalize; dX = G * scale / sqrt(var + eps).
 * training == 1: the batch's own (biased) statistics, recomputed from X as the forward did; dX =
 * scale * inv / (N*S) * (N*S*G - sum G - xhat * sum G*xhat). Both: dscale = sum G * xhat and
 * dbias = sum G per channel. Statistics accumulate in double. */
static inline void MT_FN(mt_grad_batchnorm)(const T *X, const T *G, const T *scale, const T *mean, const T *var,
                                            T *restrict dX, T *restrict dscale, T *restrict dbias, mt_i N, mt_i C,
                                            mt_i S, T eps, int training) {
    _Pragma("omp parallel for if(N * C * S > MT_PAR_MIN)")
    for (mt_i c = 0; c < C; c++) {
        double m = training ? 0 : (double)mean[c], v = training ? 0 : (double)var[c];
        if (training) {
            for (mt_i n = 0; n < N; n++)
                for (mt_i i = 0; i < S; i++) m += X[(n * C + c) * S + i];
            m /= (double)(N * S);
            for (mt_i n = 0; n < N; n++)
                for (mt_i i = 0; i < S; i++) {
                    double d = X[(n * C + c) * S + i] - m;
                    v += d * d;
                }
            v /= (double)(N * S);
        }
        double inv = 1.0 / sqrt(v + (double)eps), sg = 0, sgx = 0;
        for (mt_i n = 0; n < N; n++) {
            const T *x = X + (n * C + c) * S, *gy = G + (n * C + c) * S;
            for (mt_i i = 0; i < S; i++) {
                sg += gy[i];
                sgx += gy[i] * ((x[i] - m) * inv);
            }
        }
        if (dX) {
            double a = scale[c] * inv, cnt = (double)(N * S);
            for (mt_i n = 0; n < N; n++) {
                const T *x = X + (n * C + c) * S, *gy = G + (n * C + c) * S;
                T *dx = dX + (n * C + c) * S;
                if (training)
                    for (mt_i i = 0; i < S; i++)
                        dx[i] = (T)(a * (gy[i] - sg / cnt - (x[i] - m) * inv * sgx / cnt));
                else
                    for (mt_i i = 0; i < S; i++) dx[i] = (T)(gy[i] * a);
            }
        }
        if (dscale) dscale[c] = (T)sgx;
        if (dbias) dbias[c] = (T)sg;
    }
}
