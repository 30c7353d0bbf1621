/* Template: neural-network kernels (convolution, pooling, normalization, Softmax) over element type T (see mt_base.h). Included once per type; no guard. */

/* GEMM (mt_gemm) lives in mt_gemm_t.h; mt_nn.h includes mt_gemm.h first. */

/* ---- 2-D convolution: im2col into `col` (arena scratch, (C/g)*KH*KW x OH*OW), then the GEMM --- */
static inline void MT_FN(mt_conv2d)(const T *X, const T *W, const T *Bias, T *restrict Y, T *restrict col,
                             mt_i N, mt_i C, mt_i H, mt_i Wd, mt_i M, mt_i KH, mt_i KW, mt_i OH, mt_i OW,
                             mt_i groups, mt_i sh, mt_i sw, mt_i ph, mt_i pw, mt_i dh, mt_i dw) {
    mt_i Cg = C / groups, Mg = M / groups, P = OH * OW, R = Cg * KH * KW;
    for (mt_i n = 0; n < N; n++) {
        for (mt_i g = 0; g < groups; g++) {
            const T *x = X + (n * C + g * Cg) * H * Wd;
            _Pragma("omp parallel for if(R * P > MT_PAR_MIN)")
            for (mt_i r = 0; r < R; r++) {
                mt_i c = r / (KH * KW), kh = (r / KW) % KH, kw = r % KW;
                T *restrict dst = col + r * P;
                for (mt_i oh = 0; oh < OH; oh++) {
                    mt_i ih = oh * sh - ph + kh * dh;
                    for (mt_i ow = 0; ow < OW; ow++) {
                        mt_i iw = ow * sw - pw + kw * dw;
                        dst[oh * OW + ow] = (ih >= 0 && ih < H && iw >= 0 && iw < Wd) ? x[(c * H + ih) * Wd + iw] : (T)0;
                    }
                }
            }
            T *y = Y + (n * M + g * Mg) * P;
            MT_FN(mt_gemm)(W + g * Mg * R, col, 0, y, Mg, P, R, R, 1, P, 1, 0, 0, (T)1, (T)0);
            if (Bias)
                for (mt_i m = 0; m < Mg; m++)
                    for (mt_i p = 0; p < P; p++) y[m * P + p] += Bias[g * Mg + m];
        }
    }
}

/* ---- 2-D pooling over (N*C) planes; out-of-range taps (padding, ceil_mode) are skipped ------- */
static inline void MT_FN(mt_maxpool2d)(const T *X, T *restrict Y, mt_i NC, mt_i H, mt_i Wd, mt_i OH, mt_i OW,
                                mt_i KH, mt_i KW, mt_i sh, mt_i sw, mt_i ph, mt_i pw, mt_i dh, mt_i dw) {
    _Pragma("omp parallel for if(NC * OH * OW * KH * KW > MT_PAR_MIN)")
    for (mt_i p = 0; p < NC; p++) {
        const T *x = X + p * H * Wd;
        for (mt_i oh = 0; oh < OH; oh++)
            for (mt_i ow = 0; ow < OW; ow++) {
                T m = -INFINITY;
                for (mt_i kh = 0; kh < KH; kh++) {
                    mt_i ih = oh * sh - ph + kh * dh;
                    if (ih < 0 || ih >= H) continue;
                    for (mt_i kw = 0; kw < KW; kw++) {
                        mt_i iw = ow * sw - pw + kw * dw;
                        if (iw < 0 || iw >= Wd) continue;
                        T v = x[ih * Wd + iw];
                        if (v > m || v != v) m = v;
                    }
                }
                Y[(p * OH + oh) * OW + ow] = m;
            }
    }
}

/* count_include_pad: divide by the window clipped to the padded input, else to the input. */
static inline void MT_FN(mt_avgpool2d)(const T *X, T *restrict Y, mt_i NC, mt_i H, mt_i Wd, mt_i OH, mt_i OW,
                                mt_i KH, mt_i KW, mt_i sh, mt_i sw, mt_i ph, mt_i pw, mt_i pe_h, mt_i pe_w,
                                int count_include_pad) {
    _Pragma("omp parallel for if(NC * OH * OW * KH * KW > MT_PAR_MIN)")
    for (mt_i p = 0; p < NC; p++) {
        const T *x = X + p * H * Wd;
        for (mt_i oh = 0; oh < OH; oh++)
            for (mt_i ow = 0; ow < OW; ow++) {
                T s = 0;
                mt_i cnt = 0, cnt_pad = 0;
                for (mt_i kh = 0; kh < KH; kh++) {
                    mt_i ih = oh * sh - ph + kh;
                    if (ih >= H + pe_h) continue;
                    for (mt_i kw = 0; kw < KW; kw++) {
                        mt_i iw = ow * sw - pw + kw;
                        if (iw >= Wd + pe_w) continue;
                        cnt_pad++;
                        if (ih < 0 || ih >= H || iw < 0 || iw >= Wd) continue;
                        s += x[ih * Wd + iw];
                        cnt++;
                    }
                }
                Y[(p * OH + oh) * OW + ow] = s / (T)(count_include_pad ? cnt_pad : cnt);
            }
    }
}

static inline void MT_FN(mt_global_avgpool)(const T *X, T *restrict Y, mt_i NC, mt_i S) {
    _Pragma("omp parallel for if(NC * S > MT_PAR_MIN)")
    for (mt_i p = 0; p < NC; p++) {
        T s = 0;
        for (mt_i i = 0; i < S; i++) s += X[p * S + i];
        Y[p] = s / (T)S;
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
        T *y = Y + nc * S;
        _Pragma("omp simd")
        for (mt_i i = 0; i < S; i++) y[i] = x[i] * a + b;
    }
}

/* ---- Softmax / LogSoftmax over the middle dim of (outer, n, inner) -------------------------- */
static inline void MT_FN(mt_softmax)(const T *X, T *restrict Y, mt_i outer, mt_i n, mt_i inner, int log_out) {
    _Pragma("omp parallel for if(outer * n * inner > MT_PAR_MIN)")
    for (mt_i o = 0; o < outer; o++)
        for (mt_i k = 0; k < inner; k++) {
            const T *x = X + o * n * inner + k;
            T *y = Y + o * n * inner + k;
            T m = -INFINITY, s = 0;
            for (mt_i i = 0; i < n; i++) m = x[i * inner] > m ? x[i * inner] : m;
            for (mt_i i = 0; i < n; i++) s += exp(x[i * inner] - m);
            if (log_out) {
                T ls = log(s);
                for (mt_i i = 0; i < n; i++) y[i * inner] = x[i * inner] - m - ls;
            } else {
                for (mt_i i = 0; i < n; i++) y[i * inner] = exp(x[i * inner] - m) / s;
            }
        }
}

