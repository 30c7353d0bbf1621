/* Template: neural-network kernels (convolution, pooling, normalization, Softmax) over float type T
 * (see mt_base.h; window geometry `g` in mt_nn.h). Included once per type; no guard.
 * GEMM (mt_gemm) lives in mt_gemm_t.h; mt_nn.h includes mt_gemm.h first. */

/* ---- convolution: im2col into `col` (arena scratch, (C/groups)*K x P), then one GEMM per group;
 * col == NULL when the im2col matrix is the input itself (1x1 kernel, stride 1, no padding) ---- */
static inline void MT_FN(mt_im2col)(const T *x, T *restrict col, const mt_i *g, mt_i Cg) {
    const mt_i ID = g[0], IH = g[1], IW = g[2], OD = g[3], OH = g[4], OW = g[5];
    const mt_i KD = g[6], KH = g[7], KW = g[8], sd = g[9], sh = g[10], sw = g[11];
    const mt_i pd = g[12], ph = g[13], pw = g[14], dd = g[15], dh = g[16], dw = g[17];
    const mt_i K = KD * KH * KW, P = OD * OH * OW, R = Cg * K;
    _Pragma("omp parallel for if(R * P > MT_PAR_MIN)")
    for (mt_i r = 0; r < R; r++) {
        mt_i c = r / K, kd = (r / (KH * KW)) % KD, kh = (r / KW) % KH, kw = r % KW;
        mt_i lo, hi;
        mt_window_range(OW, IW, sw, kw * dw - pw, &lo, &hi);
        for (mt_i od = 0; od < OD; od++) {
            mt_i id = od * sd - pd + kd * dd;
            for (mt_i oh = 0; oh < OH; oh++) {
                mt_i ih = oh * sh - ph + kh * dh;
                T *restrict dst = col + r * P + (od * OH + oh) * OW;
                if (id < 0 || id >= ID || ih < 0 || ih >= IH) {
                    for (mt_i ow = 0; ow < OW; ow++) dst[ow] = 0;
                    continue;
                }
                const T *src = x + ((c * ID + id) * IH + ih) * IW;
                for (mt_i ow = 0; ow < lo; ow++) dst[ow] = 0;
                if (sw == 1 && hi > lo) {
                    const T *s = src + (lo - pw + kw * dw);
                    _Pragma("omp simd")
                    for (mt_i ow = lo; ow < hi; ow++) dst[ow] = s[ow - lo];
                } else {
                    for (mt_i ow = lo; ow < hi; ow++) dst[ow] = src[ow * sw - pw + kw * dw];
                }
                for (mt_i ow = hi; ow < OW; ow++) dst[ow] = 0;
            }
        }
    }
}

/* Y = clamp(conv(X, W) + Bias, lo, hi): lo, hi -inf, inf unless a Relu or Clip was fused in. */
static inline void MT_FN(mt_conv)(const T *X, const T *W, const T *Bias, T *restrict Y, T *restrict col,
                                  mt_i N, mt_i C, mt_i M, mt_i groups, const mt_i *g, T lo, T hi) {
    const mt_i Cg = C / groups, Mg = M / groups, S = g[0] * g[1] * g[2], P = g[3] * g[4] * g[5];
    const mt_i R = Cg * g[6] * g[7] * g[8];
    for (mt_i n = 0; n < N; n++)
        for (mt_i grp = 0; grp < groups; grp++) {
            const T *x = X + (n * C + grp * Cg) * S;
            if (col) MT_FN(mt_im2col)(x, col, g, Cg);
            /* Y_g[Mg, P] = W_g[Mg, R] @ col[R, P] + bias (one value per row) */
            MT_FN(mt_gemm_clamp)(W + grp * Mg * R, col ? col : x, Bias ? Bias + grp * Mg : 0,
                                 Y + (n * M + grp * Mg) * P, Mg, P, R, R, 1, P, 1, 1, 0, (T)1, (T)1, lo, hi);
        }
}

/* Depthwise (one input channel per group): each output plane accumulates its K taps as shifted
 * rows of its input plane, contiguous when the stride is 1. No scratch. */
static inline void MT_FN(mt_conv_depthwise)(const T *X, const T *W, const T *Bias, T *restrict Y, mt_i N, mt_i C,
                                            mt_i M, const mt_i *g, T clo, T chi) {
    const mt_i ID = g[0], IH = g[1], IW = g[2], OD = g[3], OH = g[4], OW = g[5];
    const mt_i KD = g[6], KH = g[7], KW = g[8], sd = g[9], sh = g[10], sw = g[11];
    const mt_i pd = g[12], ph = g[13], pw = g[14], dd = g[15], dh = g[16], dw = g[17];
    const mt_i Mg = M / C, S = ID * IH * IW, P = OD * OH * OW, K = KD * KH * KW;
    _Pragma("omp parallel for if(N * M * P * K > MT_PAR_MIN)")
    for (mt_i nm = 0; nm < N * M; nm++) {
        mt_i n = nm / M, m = nm % M;
        const T *x = X + (n * C + m / Mg) * S, *w = W + m * K;
        T *restrict y = Y + nm * P;
        T b = Bias ? Bias[m] : (T)0;
        for (mt_i p = 0; p < P; p++) y[p] = b;
        for (mt_i kw = 0; kw < KW; kw++) {
            mt_i lo, hi, off = kw * dw - pw;
            mt_window_range(OW, IW, sw, off, &lo, &hi);
            for (mt_i kd = 0; kd < KD; kd++)
                for (mt_i kh = 0; kh < KH; kh++) {
                    T wt = w[(kd * KH + kh) * KW + kw];
                    for (mt_i od = 0; od < OD; od++) {
                        mt_i id = od * sd - pd + kd * dd;
                        if (id < 0 || id >= ID) continue;
                        for (mt_i oh = 0; oh < OH; oh++) {
                            mt_i ih = oh * sh - ph + kh * dh;
                            if (ih < 0 || ih >= IH) continue;
                            const T *src = x + (id * IH + ih) * IW;
                            T *restrict dst = y + (od * OH + oh) * OW;
                            if (sw == 1 && hi > lo) {
                                const T *s = src + (lo + off);
                                _Pragma("omp simd")
                                for (mt_i ow = lo; ow < hi; ow++) dst[ow] += wt * s[ow - lo];
                            } else {
                                for (mt_i ow = lo; ow < hi; ow++) dst[ow] += wt * src[ow * sw + off];
                            }
                        }
                    }
                }
        }
        if (clo > -(T)INFINITY || chi < (T)INFINITY) {
            _Pragma("omp simd")
            for (mt_i p = 0; p < P; p++) y[p] = y[p] < clo ? clo : (y[p] > chi ? chi : y[p]);
        }
    }
}

/* ---- ConvTranspose: col[Mg*K, P] = W_g^T @ X_g (W is C x Mg x K), then col2im adds each tap's
 * row into the output at o = i * stride + k * dilation - begin (g: input size, output size,
 * kernel, strides, begin, dilations) ------------------------------------------------------------ */
static inline void MT_FN(mt_conv_transpose)(const T *X, const T *W, const T *Bias, T *restrict Y, T *restrict col,
                                            mt_i N, mt_i C, mt_i M, mt_i groups, const mt_i *g) {
    const mt_i ID = g[0], IH = g[1], IW = g[2], OD = g[3], OH = g[4], OW = g[5];
    const mt_i KD = g[6], KH = g[7], KW = g[8], sd = g[9], sh = g[10], sw = g[11];
    const mt_i bd = g[12], bh = g[13], bw = g[14], dd = g[15], dh = g[16], dw = g[17];
    const mt_i Cg = C / groups, Mg = M / groups, P = ID * IH * IW, Q = OD * OH * OW, K = KD * KH * KW;
    for (mt_i n = 0; n < N; n++)
        for (mt_i grp = 0; grp < groups; grp++) {
            MT_FN(mt_gemm)(W + grp * Cg * Mg * K, X + (n * C + grp * Cg) * P, 0, col, Mg * K, P, Cg, 1, Mg * K, P, 1,
                           0, 0, (T)1, (T)0);
            _Pragma("omp parallel for if(Mg * K * P > MT_PAR_MIN)")
            for (mt_i m = 0; m < Mg; m++) {
                T *restrict y = Y + (n * M + grp * Mg + m) * Q;
                T b = Bias ? Bias[grp * Mg + m] : (T)0;
                for (mt_i q = 0; q < Q; q++) y[q] = b;
                for (mt_i kd = 0; kd < KD; kd++)
                    for (mt_i kh = 0; kh < KH; kh++)
                        for (mt_i kw = 0; kw < KW; kw++) {
                            const T *src = col + (m * K + (kd * KH + kh) * KW + kw) * P;
                            mt_i lo, hi, off = kw * dw - bw;
                            mt_window_range(IW, OW, sw, off, &lo, &hi);
                            for (mt_i id = 0; id < ID; id++) {
                                mt_i od = id * sd + kd * dd - bd;
                                if (od < 0 || od >= OD) continue;
                                for (mt_i ih = 0; ih < IH; ih++) {
                                    mt_i oh = ih * sh + kh * dh - bh;
                                    if (oh < 0 || oh >= OH) continue;
                                    const T *s = src + (id * IH + ih) * IW;
                                    T *restrict dst = y + (od * OH + oh) * OW;
                                    for (mt_i iw = lo; iw < hi; iw++) dst[iw * sw + off] += s[iw];
                                }
                            }
                        }
            }
        }
}

/* ---- AveragePool (mode 0: pixels of the input, 1: of the padded input, count_include_pad) and
 * LpPool (mode 2: (sum |x|^p)^(1/p)) over NC planes; taps outside the input add nothing -------- */
static inline void MT_FN(mt_pool)(const T *X, T *restrict Y, mt_i NC, const mt_i *g, int mode, T p) {
    const mt_i ID = g[0], IH = g[1], IW = g[2], OD = g[3], OH = g[4], OW = g[5];
    const mt_i KD = g[6], KH = g[7], KW = g[8], sd = g[9], sh = g[10], sw = g[11];
    const mt_i pd = g[12], ph = g[13], pw = g[14], dd = g[15], dh = g[16], dw = g[17];
    const mt_i ed = g[18], eh = g[19], ew = g[20];
    const mt_i S = ID * IH * IW, P = OD * OH * OW;
    (void)P; /* read only by the OpenMP clause: unused without -fopenmp */
    _Pragma("omp parallel for if(NC * P * KD * KH * KW > MT_PAR_MIN)")
    for (mt_i c = 0; c < NC; c++) {
        const T *x = X + c * S;
        for (mt_i od = 0; od < OD; od++)
            for (mt_i oh = 0; oh < OH; oh++)
                for (mt_i ow = 0; ow < OW; ow++) {
                    T s = 0;
                    mt_i cnt = 0, cnt_pad = 0;
                    for (mt_i kd = 0; kd < KD; kd++) {
                        mt_i id = od * sd - pd + kd * dd;
                        if (id < -pd || id >= ID + ed) continue;
                        for (mt_i kh = 0; kh < KH; kh++) {
                            mt_i ih = oh * sh - ph + kh * dh;
                            if (ih < -ph || ih >= IH + eh) continue;
                            for (mt_i kw = 0; kw < KW; kw++) {
                                mt_i iw = ow * sw - pw + kw * dw;
                                if (iw < -pw || iw >= IW + ew) continue;
                                cnt_pad++;
                                if (id < 0 || id >= ID || ih < 0 || ih >= IH || iw < 0 || iw >= IW) continue;
                                T v = x[(id * IH + ih) * IW + iw];
                                s += mode == 2 ? pow(fabs(v), p) : v;
                                cnt++;
                            }
                        }
                    }
                    mt_i o = (c * OD + od) * OH * OW + oh * OW + ow;
                    Y[o] = mode == 2 ? pow(s, (T)1 / p) : s / (T)(mode ? cnt_pad : cnt);
                }
    }
}

/* ---- GlobalAveragePool (mode 0), GlobalMaxPool (1), GlobalLpPool (2) over NC planes of S ----- */
static inline void MT_FN(mt_global_pool)(const T *X, T *restrict Y, mt_i NC, mt_i S, int mode, T p) {
    _Pragma("omp parallel for if(NC * S > MT_PAR_MIN)")
    for (mt_i c = 0; c < NC; c++) {
        const T *x = X + c * S;
        T s = 0;
        if (mode == 0) {
            _Pragma("omp simd reduction(+:s)")
            for (mt_i i = 0; i < S; i++) s += x[i];
            Y[c] = s / (T)S;
        } else if (mode == 1) {
            T m = -INFINITY;
            for (mt_i i = 0; i < S; i++)
                if (x[i] > m || x[i] != x[i]) m = x[i];
            Y[c] = m;
        } else {
            for (mt_i i = 0; i < S; i++) s += pow(fabs(x[i]), p);
            Y[c] = pow(s, (T)1 / p);
        }
    }
}

/* ---- inference BatchNormalization over (N, C, S) -------------------------------------------- */
static inline void MT_FN(mt_batchnorm)(const T *X, const T *scale, const T *bias, const T *mean, const T *var,
                                       T *restrict Y, mt_i N, mt_i C, mt_i S, T eps) {
    _Pragma("omp parallel for if(N * C * S > MT_PAR_MIN)")
    for (mt_i nc = 0; nc < N * C; nc++) {
        mt_i c = nc % C;
        T a = scale[c] / sqrt(var[c] + eps), b = bias[c] - mean[c] * a;
        const T *x = X + nc * S;
        T *restrict y = Y + nc * S;
        _Pragma("omp simd")
        for (mt_i i = 0; i < S; i++) y[i] = x[i] * a + b;
    }
}

/* Mean and 1/sqrt(var + eps) of n values (two passes, accumulated in double). */
static inline void MT_FN(mt_moments)(const T *x, mt_i n, double eps, double *mean, double *inv) {
    double s = 0, v = 0;
    _Pragma("omp simd reduction(+:s)")
    for (mt_i i = 0; i < n; i++) s += (double)x[i];
    double m = s / (double)n;
    _Pragma("omp simd reduction(+:v)")
    for (mt_i i = 0; i < n; i++) {
        double d = (double)x[i] - m;
        v += d * d;
    }
    *mean = m;
    *inv = 1.0 / sqrt(v / (double)n + eps);
}

/* ---- LayerNormalization over rows of `inner`: Y = normalized * scale + bias, scale and bias
 * (bias may be NULL) stepping ss and bs (1, or 0 for one value); Mean and InvStdDev (may be
 * NULL) get one value per row ----------------------------------------------------------------- */
static inline void MT_FN(mt_layernorm)(const T *X, const T *scale, const T *bias, T *restrict Y, T *restrict Mean,
                                       T *restrict Inv, mt_i outer, mt_i inner, mt_i ss, mt_i bs, double eps) {
    _Pragma("omp parallel for if(outer * inner > MT_PAR_MIN)")
    for (mt_i o = 0; o < outer; o++) {
        const T *x = X + o * inner;
        T *restrict y = Y + o * inner;
        double m, inv;
        MT_FN(mt_moments)(x, inner, eps, &m, &inv);
        if (Mean) Mean[o] = (T)m;
        if (Inv) Inv[o] = (T)inv;
        T tm = (T)m, ti = (T)inv;
        if (bias) {
            for (mt_i i = 0; i < inner; i++) y[i] = (T)((x[i] - tm) * ti) * scale[i * ss] + bias[i * bs];
        } else {
            for (mt_i i = 0; i < inner; i++) y[i] = (T)((x[i] - tm) * ti) * scale[i * ss];
        }
    }
}

/* ---- GroupNormalization (and InstanceNormalization: G = C): statistics per (n, group) over
 * Cg channels of S; scale and bias per channel, or per group when per_group -------------------- */
static inline void MT_FN(mt_groupnorm)(const T *X, const T *scale, const T *bias, T *restrict Y, mt_i N, mt_i G,
                                       mt_i Cg, mt_i S, int per_group, double eps) {
    _Pragma("omp parallel for if(N * G * Cg * S > MT_PAR_MIN)")
    for (mt_i ng = 0; ng < N * G; ng++) {
        mt_i grp = ng % G;
        const T *x = X + ng * Cg * S;
        T *restrict y = Y + ng * Cg * S;
        double m, inv;
        MT_FN(mt_moments)(x, Cg * S, eps, &m, &inv);
        for (mt_i c = 0; c < Cg; c++) {
            mt_i k = per_group ? grp : grp * Cg + c;
            double a = (double)scale[k] * inv, b = (double)bias[k] - m * a;
            _Pragma("omp simd")
            for (mt_i i = 0; i < S; i++) y[c * S + i] = (T)((double)x[c * S + i] * a + b);
        }
    }
}

/* ---- LRN across channels: x / (bias + alpha / size * sum of squares over
 * [c - (size-1)/2, c + ceil((size-1)/2)]) ^ beta ----------------------------------------------- */
static inline void MT_FN(mt_lrn)(const T *X, T *restrict Y, mt_i N, mt_i C, mt_i S, mt_i size, double alpha,
                                 double beta, double bias) {
    const mt_i before = (size - 1) / 2, after = size - 1 - before;
    _Pragma("omp parallel for if(N * C * S * size > MT_PAR_MIN)")
    for (mt_i nc = 0; nc < N * C; nc++) {
        mt_i n = nc / C, c = nc % C;
        mt_i lo = c - before < 0 ? 0 : c - before, hi = c + after >= C ? C - 1 : c + after;
        for (mt_i i = 0; i < S; i++) {
            double s = 0;
            for (mt_i k = lo; k <= hi; k++) {
                double v = (double)X[(n * C + k) * S + i];
                s += v * v;
            }
            Y[nc * S + i] = (T)((double)X[nc * S + i] / pow(bias + alpha / (double)size * s, beta));
        }
    }
}

/* ---- MeanVarianceNormalization: (x - mean) / (std + 1e-9) per group of `count` elements (groups
 * from mt_group_of); stats: 2 * ngroups doubles of arena scratch ------------------------------- */
static inline void MT_FN(mt_mvn)(const T *X, T *restrict Y, double *restrict stats, int rank, const mt_i *shape,
                                 const mt_i *gstr, mt_i ngroups, mt_i count) {
    mt_i n = 1;
    for (int d = 0; d < rank; d++) n *= shape[d];
    for (mt_i j = 0; j < 2 * ngroups; j++) stats[j] = 0;
    for (mt_i i = 0; i < n; i++) stats[mt_group_of(i, rank, shape, gstr)] += (double)X[i];
    for (mt_i j = 0; j < ngroups; j++) stats[j] /= (double)count;
    for (mt_i i = 0; i < n; i++) {
        mt_i o = mt_group_of(i, rank, shape, gstr);
        double d = (double)X[i] - stats[o];
        stats[ngroups + o] += d * d;
    }
    for (mt_i j = 0; j < ngroups; j++) stats[ngroups + j] = sqrt(stats[ngroups + j] / (double)count) + 1e-9;
    for (mt_i i = 0; i < n; i++) {
        mt_i o = mt_group_of(i, rank, shape, gstr);
        Y[i] = (T)(((double)X[i] - stats[o]) / stats[ngroups + o]);
    }
}

/* ---- Softmax / LogSoftmax / Hardmax over the middle dim of (outer, n, inner); mode 0 Softmax,
 * 1 LogSoftmax, 2 Hardmax (1 at the first maximum, a NaN counting as the maximum) ------------- */
static inline void MT_FN(mt_softmax)(const T *X, T *restrict Y, mt_i outer, mt_i n, mt_i inner, int mode) {
    _Pragma("omp parallel for if(outer * n * inner > MT_PAR_MIN)")
    for (mt_i o = 0; o < outer; o++)
        for (mt_i k = 0; k < inner; k++) {
            const T *x = X + o * n * inner + k;
            T *restrict y = Y + o * n * inner + k;
            if (mode == 2) {
                mt_i at = 0;
                for (mt_i i = 1; i < n; i++)
                    if ((x[i * inner] > x[at * inner] || x[i * inner] != x[i * inner]) && x[at * inner] == x[at * inner])
                        at = i;
                for (mt_i i = 0; i < n; i++) y[i * inner] = (T)(i == at);
                continue;
            }
            T m = -INFINITY, s = 0;
            if (inner == 1) {
                /* The last axis: contiguous rows, vectorized (exp through libmvec). x - m below
                 * MT_EXP_LOW (where exp is under T's smallest normal) gives 0: libmvec computes such
                 * lanes one by one, and masked attention has half its scores there. The clamp is
                 * a loop of its own: GCC 12 vectorizes no loop holding both a select and a call. */
                _Pragma("omp simd reduction(max:m)")
                for (mt_i i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
                if (m != m || m == (T)INFINITY || m == -(T)INFINITY) goto strided; /* NaN and inf: the rules below */
                _Pragma("omp simd")
                for (mt_i i = 0; i < n; i++) y[i] = x[i] - m < MT_EXP_LOW ? MT_EXP_LOW : x[i] - m;
                _Pragma("omp simd reduction(+:s)")
                for (mt_i i = 0; i < n; i++) {
                    T e = exp(y[i]);
                    y[i] = e;
                    s += e;
                }
                if (mode == 1) {
                    T ls = log(s);
                    _Pragma("omp simd")
                    for (mt_i i = 0; i < n; i++) y[i] = x[i] - m - ls;
                } else {
                    T r = (T)1 / s;
                    _Pragma("omp simd")
                    for (mt_i i = 0; i < n; i++) y[i] = x[i] - m < MT_EXP_LOW ? (T)0 : y[i] * r;
                }
                continue;
            }
        strided:
            m = -INFINITY;
            for (mt_i i = 0; i < n; i++) m = x[i * inner] > m ? x[i * inner] : m;
            if (mode == 1) {
                for (mt_i i = 0; i < n; i++) s += exp(x[i * inner] - m);
                T ls = log(s);
                for (mt_i i = 0; i < n; i++) y[i * inner] = x[i * inner] - m - ls;
            } else { /* one exp per element: y holds them until the sum is known */
                for (mt_i i = 0; i < n; i++) {
                    y[i * inner] = exp(x[i * inner] - m);
                    s += y[i * inner];
                }
                for (mt_i i = 0; i < n; i++) y[i * inner] /= s;
            }
        }
}

/* ---- Dropout's mask in opsets 7-9 (the input's type, all ones) ------------------------------- */
static inline void MT_FN(mt_fill_one)(T *restrict y, mt_i n) {
    for (mt_i i = 0; i < n; i++) y[i] = (T)1;
}

/* ---- onnxruntime contrib (com.microsoft) ------------------------------------------------------ */

/* Gelu, BiasGelu, FastGelu: y = gelu(x + bias) over a (rows, cols) view, bias (may be NULL) one
 * value per column; tanh_approx: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), else the erf form. */
static inline void MT_FN(mt_gelu_bias)(const T *X, const T *bias, T *restrict Y, mt_i rows, mt_i cols,
                                       int tanh_approx) {
    _Pragma("omp parallel for if(rows * cols > MT_PAR_MIN)")
    for (mt_i r = 0; r < rows; r++) {
        const T *x = X + r * cols;
        T *restrict y = Y + r * cols;
        for (mt_i j = 0; j < cols; j++) {
            T v = bias ? x[j] + bias[j] : x[j];
            y[j] = tanh_approx ? (T)0.5 * v * ((T)1 + tanh((T)0.7978845608028654 * (v + (T)0.044715 * v * v * v)))
                               : (T)0.5 * v * ((T)1 + erf(v * (T)0.7071067811865476));
        }
    }
}

/* SkipLayerNormalization over rows of `cols`: s = x + skip (+ bias), y = normalized(s) * gamma
 * (+ beta); Mean, Inv, Sum (each may be NULL) get the row statistics and s. */
static inline void MT_FN(mt_skip_layernorm)(const T *X, const T *Skip, const T *gamma, const T *beta, const T *bias,
                                            T *restrict Y, T *restrict Mean, T *restrict Inv, T *restrict Sum,
                                            mt_i rows, mt_i cols, double eps) {
    _Pragma("omp parallel for if(rows * cols > MT_PAR_MIN)")
    for (mt_i r = 0; r < rows; r++) {
        const T *x = X + r * cols, *s = Skip + r * cols;
        T *restrict y = Y + r * cols;
        for (mt_i j = 0; j < cols; j++) y[j] = bias ? x[j] + s[j] + bias[j] : x[j] + s[j];
        if (Sum)
            for (mt_i j = 0; j < cols; j++) Sum[r * cols + j] = y[j];
        double m, inv;
        MT_FN(mt_moments)(y, cols, eps, &m, &inv);
        if (Mean) Mean[r] = (T)m;
        if (Inv) Inv[r] = (T)inv;
        T tm = (T)m, ti = (T)inv;
        for (mt_i j = 0; j < cols; j++) y[j] = (y[j] - tm) * ti * gamma[j] + (beta ? beta[j] : (T)0);
    }
}

/* ---- training-mode BatchNormalization (opset 14+): statistics of the batch per channel over
 * (N, S); RMean and RVar (may be NULL) get the running statistics updated with `momentum` ---- */
static inline void MT_FN(mt_batchnorm_train)(const T *X, const T *scale, const T *bias, const T *mean,
                                             const T *var, T *restrict Y, T *restrict RMean, T *restrict RVar,
                                             mt_i N, mt_i C, mt_i S, double eps, double momentum) {
    _Pragma("omp parallel for if(N * C * S > MT_PAR_MIN)")
    for (mt_i c = 0; c < C; c++) {
        double s = 0, v = 0, cnt = (double)(N * S);
        for (mt_i n = 0; n < N; n++)
            for (mt_i i = 0; i < S; i++) s += (double)X[(n * C + c) * S + i];
        double m = s / cnt;
        for (mt_i n = 0; n < N; n++)
            for (mt_i i = 0; i < S; i++) {
                double d = (double)X[(n * C + c) * S + i] - m;
                v += d * d;
            }
        double bv = v / cnt;
        T tm = (T)m, ti = (T)(1.0 / sqrt(bv + eps));
        for (mt_i n = 0; n < N; n++)
            for (mt_i i = 0; i < S; i++) {
                mt_i k = (n * C + c) * S + i;
                Y[k] = (X[k] - tm) * ti * scale[c] + bias[c];
            }
        if (RMean) RMean[c] = (T)((double)mean[c] * momentum + (double)(T)m * (1.0 - momentum));
        if (RVar) RVar[c] = (T)((double)var[c] * momentum + (double)(T)bv * (1.0 - momentum));
    }
}

/* ---- MaxUnpool: Y (zeros) gets X[i] at Ind[i], a flat position in the shape the pool would
 * invert (NC planes of from[0..2]), kept at the same coordinates in Y's planes of to[0..2] and
 * dropped outside them. Returns 1 on an index outside that shape. ------------------------------- */
static inline int MT_FN(mt_maxunpool)(const T *X, const int64_t *Ind, T *restrict Y, mt_i n, mt_i NC,
                                      const mt_i *from, const mt_i *to) {
    const mt_i FS = from[0] * from[1] * from[2], TS = to[0] * to[1] * to[2];
    for (mt_i i = 0; i < NC * TS; i++) Y[i] = 0;
    for (mt_i i = 0; i < n; i++) {
        int64_t idx = Ind[i];
        if (idx < 0 || idx >= (int64_t)(NC * FS)) return 1;
        mt_i plane = (mt_i)idx / FS, r = (mt_i)idx % FS;
        mt_i d = r / (from[1] * from[2]), h = (r / from[2]) % from[1], w = r % from[2];
        if (d >= to[0] || h >= to[1] || w >= to[2]) continue;
        Y[plane * TS + (d * to[1] + h) * to[2] + w] = X[i];
    }
    return 0;
}

/* ---- NegativeLogLikelihoodLoss over log-probabilities P (N, C, D): loss[n, d] = -P[n, t, d] * w[t]
 * (w = 1 without weights; 0 where t == ignore); reduction 0 none (L holds N * D values), 1 sum,
 * 2 mean (the sum over the weights that count). Returns 1 on a target outside [0, C). ---------- */
static inline int MT_FN(mt_nll)(const T *P, const int64_t *Tg, const T *Wt, T *restrict L, mt_i N, mt_i C, mt_i D,
                                int has_ignore, int64_t ignore, int reduction) {
    double total = 0, wsum = 0;
    for (mt_i n = 0; n < N; n++)
        for (mt_i d = 0; d < D; d++) {
            int64_t t = Tg[n * D + d];
            T w = 0, v = 0;
            if (!(has_ignore && t == ignore)) {
                if (t < 0 || t >= (int64_t)C) return 1;
                w = Wt ? Wt[t] : (T)1;
                v = -P[(n * C + (mt_i)t) * D + d] * w;
            }
            if (reduction == 0) L[n * D + d] = v;
            total += (double)v;
            wsum += (double)w;
        }
    if (reduction == 1) L[0] = (T)total;
    if (reduction == 2) L[0] = (T)(total / wsum);
    return 0;
}
