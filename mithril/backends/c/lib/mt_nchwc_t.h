/* Template: NCHWc kernels over element type T (see mt_nchwc.h). Included once per float type by
 * mt_nchwc.h; no guard. */

#define MT_B MT_NCB(T)
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
#define MT_NC_MAC(y, a, b) ((y) = fma((a), (b), (y))) /* -std=c11 turns contraction off */
#else
#define MT_NC_MAC(y, a, b) ((y) += (a) * (b))
#endif
#define MT_NC_CLAMP(v, lo, hi) ((v) < (lo) ? (lo) : ((v) > (hi) ? (hi) : (v)))

/* NCHW -> blocked: y[n][cb][p][b] = x[n][cb * B + b][p] (P positions); channels past C, in the
 * last block, are zero. */
static inline void MT_FN(mt_nchwc_to)(const T *x, T *restrict y, mt_i N, mt_i C, mt_i P) {
    const mt_i CB = (C + MT_B - 1) / MT_B;
    _Pragma("omp parallel for collapse(2) if(N * C * P > MT_PAR_MIN)")
    for (mt_i n = 0; n < N; n++)
        for (mt_i cb = 0; cb < CB; cb++) {
            const T *xs = x + (n * C + cb * MT_B) * P;
            T *ys = y + (n * CB + cb) * MT_B * P;
            const mt_i valid = C - cb * MT_B < MT_B ? C - cb * MT_B : MT_B;
            mt_i p = 0;
#if MT_TR16
            if (sizeof(T) == sizeof(float) && valid == MT_B) /* 16 positions of 16 channels at a time */
                for (; p + 16 <= P; p += 16) mt_tr16_f32((const float *)xs + p, P, (float *)ys + p * 16, 16);
#endif
            for (; p < P; p++)
                for (mt_i b = 0; b < MT_B; b++) ys[p * MT_B + b] = b < valid ? xs[b * P + p] : (T)0;
        }
}

/* Blocked -> NCHW: y[n][cb * B + b][p] = x[n][cb][p][b], channels past C dropped. */
static inline void MT_FN(mt_nchwc_from)(const T *x, T *restrict y, mt_i N, mt_i C, mt_i P) {
    const mt_i CB = (C + MT_B - 1) / MT_B;
    _Pragma("omp parallel for collapse(2) if(N * C * P > MT_PAR_MIN)")
    for (mt_i n = 0; n < N; n++)
        for (mt_i cb = 0; cb < CB; cb++) {
            const T *xs = x + (n * CB + cb) * MT_B * P;
            T *ys = y + (n * C + cb * MT_B) * P;
            const mt_i valid = C - cb * MT_B < MT_B ? C - cb * MT_B : MT_B;
            mt_i p = 0;
#if MT_TR16
            if (sizeof(T) == sizeof(float) && valid == MT_B)
                for (; p + 16 <= P; p += 16) mt_tr16_f32((const float *)xs + p * 16, 16, (float *)ys + p, P);
#endif
            for (; p < P; p++)
                for (mt_i b = 0; b < valid; b++) ys[b * P + p] = xs[p * MT_B + b];
        }
}

/* The 1x1 convolution's register tile: PT positions by NB blocks of output channels, summed over
 * every input channel ci of X(ci, p) = x[(ci / B) * B * P + (ci % B) * xc + p * xp] (x at the
 * tile's first position; blocked: xc 1, xp B; NCHW: xc P, xp 1) times w[nb * wn + ci * B + b];
 * then bias, R and the clamp, stored blocked: y[nb * P * B + j * B + b]. */
#define MT_PW_TILE(PT, NB)                                                                             \
    static inline void MT_FN(mt_pw_tile_##PT##_##NB)(const T *x, mt_i xc, mt_i xp, mt_i Cin,           \
                                                     const T *w, mt_i wn, const T *bias, const T *r,   \
                                                     T *restrict y, mt_i P, T lo, T hi) {              \
        T acc[NB][PT][MT_B];                                                                           \
        for (mt_i nb = 0; nb < (NB); nb++)                                                             \
            for (mt_i j = 0; j < (PT); j++)                                                            \
                for (mt_i b = 0; b < MT_B; b++) acc[nb][j][b] = 0;                                     \
        for (mt_i ci0 = 0; ci0 < Cin; ci0 += MT_B) {                                                   \
            const T *xs = x + ci0 * P;                                                                 \
            const mt_i cn = Cin - ci0 < MT_B ? Cin - ci0 : MT_B;                                       \
            for (mt_i c = 0; c < cn; c++) {                                                            \
                const T *xr = xs + c * xc, *wk = w + (ci0 + c) * MT_B;                                 \
                for (mt_i j = 0; j < (PT); j++) {                                                      \
                    const T xv = xr[j * xp];                                                           \
                    for (mt_i nb = 0; nb < (NB); nb++) {                                               \
                        _Pragma("omp simd")                                                            \
                        for (mt_i b = 0; b < MT_B; b++) MT_NC_MAC(acc[nb][j][b], xv, wk[nb * wn + b]); \
                    }                                                                                  \
                }                                                                                      \
            }                                                                                          \
        }                                                                                              \
        for (mt_i nb = 0; nb < (NB); nb++) {                                                           \
            const T *bb = bias + nb * MT_B, *rt = r ? r + nb * P * MT_B : 0;                           \
            T *yt = y + nb * P * MT_B;                                                                 \
            for (mt_i j = 0; j < (PT); j++) {                                                          \
                _Pragma("omp simd")                                                                    \
                for (mt_i b = 0; b < MT_B; b++) {                                                      \
                    T v = acc[nb][j][b] + bb[b];                                                       \
                    if (rt) v += rt[j * MT_B + b];                                                     \
                    yt[j * MT_B + b] = MT_NC_CLAMP(v, lo, hi);                                         \
                }                                                                                      \
            }                                                                                          \
        }                                                                                              \
    }
MT_PW_TILE(12, 2)
MT_PW_TILE(12, 1)
MT_PW_TILE(4, 2)
MT_PW_TILE(4, 1)
MT_PW_TILE(1, 2)
MT_PW_TILE(1, 1)
#undef MT_PW_TILE

#define MT_PW_PT 12 /* positions per register tile: 2 x 12 vector accumulators of 32 registers */

/* 1x1 convolution (stride 1, no padding) of N images of P positions into blocks: Y(co, p) =
 * clamp(Bp[co] + R(co, p) + sum_ci X(ci, p) * Wp[co / B][ci][co % B], lo, hi). X blocked (xb) or
 * NCHW; Y and R (NULL: none) blocked; Bp holds the bias padded to whole blocks (zeros where the
 * node has none). Blocked X's padding channels are not read; Y's are written (zero weights: the
 * clamped bias padding plus R's). Threads take runs of (pair of output blocks, tile of
 * positions), pairs outer: a pair's weights stay in cache while X streams past. */
static inline void MT_FN(mt_conv1x1_nchwc)(const T *X, int xb, const T *Wp, const T *Bp, const T *R, T *restrict Y,
                                           mt_i N, mt_i Cin, mt_i Cout, mt_i P, T lo, T hi) {
    const mt_i CBi = (Cin + MT_B - 1) / MT_B, CBo = (Cout + MT_B - 1) / MT_B, pairs = (CBo + 1) / 2;
    const mt_i tiles = (P + MT_PW_PT - 1) / MT_PW_PT, xc = xb ? 1 : P, xp = xb ? MT_B : 1, wn = Cin * MT_B;
    const mt_i items = N * pairs * tiles;
    _Pragma("omp parallel for schedule(static) if(items > 1 && N * Cout * Cin * P > 8 * 32768)")
    for (mt_i it = 0; it < items; it++) {
        const mt_i n = it / (pairs * tiles), pr = it % (pairs * tiles) / tiles, t = it % tiles;
        const mt_i cob = 2 * pr, p0 = t * MT_PW_PT, pt = P - p0 < MT_PW_PT ? P - p0 : MT_PW_PT;
        const int two = cob + 1 < CBo;
        const T *w = Wp + cob * wn, *bias = Bp + cob * MT_B;
        for (mt_i p = p0; p < p0 + pt;) {
            const T *x = X + n * (xb ? CBi * MT_B : Cin) * P + p * xp;
            const mt_i yo = (n * CBo + cob) * MT_B * P + p * MT_B;
            T *y = Y + yo;
            const T *r = R ? R + yo : 0;
            const mt_i left = p0 + pt - p;
#define MT_PW_CALL(PT)                                                                                 \
    if (two)                                                                                           \
        MT_FN(mt_pw_tile_##PT##_2)(x, xc, xp, Cin, w, wn, bias, r, y, P, lo, hi);                      \
    else                                                                                               \
        MT_FN(mt_pw_tile_##PT##_1)(x, xc, xp, Cin, w, wn, bias, r, y, P, lo, hi);                      \
    p += PT;
            if (left >= 12) {
                MT_PW_CALL(12)
            } else if (left >= 4) {
                MT_PW_CALL(4)
            } else {
                MT_PW_CALL(1)
            }
#undef MT_PW_CALL
        }
    }
}
#undef MT_PW_PT

/* Depthwise convolution (one filter per channel; the last block padded), X and Y blocked: Y[n][cb][o][b]
 * = clamp(Bp[c] + sum over the window's taps X[n][cb][i][b] * Wp[cb][tap][b], lo, hi). g is the
 * window geometry of mt_nn.h (2-D: unit first axis). Each output row of each block is one task:
 * columns whose whole window lies in the row go 8 or 4 at a time (as many sums in flight), the
 * others one by one with their taps checked. */
static inline void MT_FN(mt_dw_nchwc_cols)(const T *xs, const T *w, const T *bias, T *restrict y, mt_i ow, mt_i n,
                                          mt_i IW, mt_i ih0, mt_i khlo, mt_i khhi, mt_i KW, mt_i sw, mt_i pw,
                                          mt_i dh, mt_i dw, T lo, T hi) {
#define MT_DW_GROUP(G)                                                                                 \
    {                                                                                                  \
        T acc[G][MT_B];                                                                                \
        for (mt_i j = 0; j < (G); j++)                                                                 \
            for (mt_i b = 0; b < MT_B; b++) acc[j][b] = bias[b];                                       \
        for (mt_i kh = khlo; kh < khhi; kh++) {                                                        \
            const T *xrow = xs + (ih0 + kh * dh) * IW * MT_B;                                          \
            for (mt_i kw = 0; kw < KW; kw++) {                                                         \
                const T *wk = w + (kh * KW + kw) * MT_B, *xq = xrow + (ow * sw - pw + kw * dw) * MT_B;  \
                for (mt_i j = 0; j < (G); j++) {                                                       \
                    _Pragma("omp simd")                                                                \
                    for (mt_i b = 0; b < MT_B; b++) MT_NC_MAC(acc[j][b], xq[j * sw * MT_B + b], wk[b]); \
                }                                                                                      \
            }                                                                                          \
        }                                                                                              \
        for (mt_i j = 0; j < (G); j++) {                                                               \
            _Pragma("omp simd")                                                                        \
            for (mt_i b = 0; b < MT_B; b++) y[(ow + j) * MT_B + b] = MT_NC_CLAMP(acc[j][b], lo, hi);   \
        }                                                                                              \
    }
    mt_i end = ow + n;
    for (; ow + 8 <= end; ow += 8) MT_DW_GROUP(8)
    for (; ow + 4 <= end; ow += 4) MT_DW_GROUP(4)
    for (; ow < end; ow++) MT_DW_GROUP(1)
#undef MT_DW_GROUP
}

static inline void MT_FN(mt_dw_nchwc)(const T *X, const T *Wp, const T *Bp, T *restrict Y, mt_i N, mt_i C,
                                      const mt_i *g, T lo, T hi) {
    const mt_i IH = g[1], IW = g[2], OH = g[4], OW = g[5], KH = g[7], KW = g[8];
    const mt_i sh = g[10], sw = g[11], ph = g[13], pw = g[14], dh = g[16], dw = g[17], CB = (C + MT_B - 1) / MT_B;
    mt_i clo, chi; /* columns whose whole window lies inside the row */
    mt_window_range(OW, IW - (KW - 1) * dw, sw, -pw, &clo, &chi);
    _Pragma("omp parallel for collapse(3) schedule(static) if(N * C * OH * OW * KH * KW > MT_PAR_MIN)")
    for (mt_i n = 0; n < N; n++)
        for (mt_i cb = 0; cb < CB; cb++)
            for (mt_i oh = 0; oh < OH; oh++) {
                const T *xs = X + (n * CB + cb) * MT_B * IH * IW, *w = Wp + cb * KH * KW * MT_B, *bias = Bp + cb * MT_B;
                T *y = Y + (n * CB + cb) * MT_B * OH * OW + oh * OW * MT_B;
                const mt_i ih0 = oh * sh - ph;
                mt_i khlo = 0, khhi = KH; /* the window's rows inside the plane */
                while (khlo < KH && ih0 + khlo * dh < 0) khlo++;
                while (khhi > khlo && ih0 + (khhi - 1) * dh >= IH) khhi--;
                MT_FN(mt_dw_nchwc_cols)(xs, w, bias, y, clo, chi - clo, IW, ih0, khlo, khhi, KW, sw, pw, dh, dw, lo,
                                        hi);
                for (mt_i ow = 0; ow < OW; ow++) { /* the columns whose window leaves the row */
                    if (ow == clo) ow = chi > clo ? chi : clo;
                    if (ow >= OW) break;
                    T acc[MT_B];
                    for (mt_i b = 0; b < MT_B; b++) acc[b] = bias[b];
                    for (mt_i kh = khlo; kh < khhi; kh++) {
                        const T *xrow = xs + (ih0 + kh * dh) * IW * MT_B;
                        for (mt_i kw = 0; kw < KW; kw++) {
                            const mt_i iw = ow * sw - pw + kw * dw;
                            if (iw < 0 || iw >= IW) continue;
                            const T *wk = w + (kh * KW + kw) * MT_B, *xq = xrow + iw * MT_B;
                            _Pragma("omp simd")
                            for (mt_i b = 0; b < MT_B; b++) MT_NC_MAC(acc[b], xq[b], wk[b]);
                        }
                    }
                    _Pragma("omp simd")
                    for (mt_i b = 0; b < MT_B; b++) y[ow * MT_B + b] = MT_NC_CLAMP(acc[b], lo, hi);
                }
            }
}

#undef MT_NC_CLAMP
#undef MT_NC_MAC
#undef MT_B
