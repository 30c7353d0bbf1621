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
                } else if (sw == 2 && hi > lo) { /* a constant stride: vectorized (a stem's 3x3/2 conv) */
                    const T *s = src + (lo * 2 - pw + kw * dw);
                    _Pragma("omp simd")
                    for (mt_i ow = lo; ow < hi; ow++) dst[ow] = s[2 * (ow - lo)];
                } else {
                    for (mt_i ow = lo; ow < hi; ow++) dst[ow] = src[ow * sw - pw + kw * dw];
                }
                for (mt_i ow = hi; ow < OW; ow++) dst[ow] = 0;
            }
        }
    }
}

/* Y = clamp(conv(X, W) + Bias + Res, lo, hi): Res (NULL: none) is an Add's other operand, shaped
 * like Y, and lo, hi are -inf, inf unless a Relu or Clip was fused in (render.fuse). */
static inline void MT_FN(mt_conv)(const T *X, const T *W, const T *Bias, const T *Res, T *restrict Y, T *restrict col,
                                  mt_i N, mt_i C, mt_i M, mt_i groups, const mt_i *g, T lo, T hi) {
    const mt_i Cg = C / groups, Mg = M / groups, S = g[0] * g[1] * g[2], P = g[3] * g[4] * g[5];
    const mt_i R = Cg * g[6] * g[7] * g[8];
    for (mt_i n = 0; n < N; n++)
        for (mt_i grp = 0; grp < groups; grp++) {
            const T *x = X + (n * C + grp * Cg) * S;
            if (col) MT_FN(mt_im2col)(x, col, g, Cg);
            /* Y_g[Mg, P] = W_g[Mg, R] @ col[R, P] + bias (one value per row) */
            MT_FN(mt_gemm_clamp)(W + grp * Mg * R, col ? col : x, Bias ? Bias + grp * Mg : 0,
                                 Res ? Res + (n * M + grp * Mg) * P : 0,
                                 Y + (n * M + grp * Mg) * P, Mg, P, R, R, 1, P, 1, 1, 0, (T)1, (T)1, lo, hi);
        }
}

/* ---- Depthwise 3x3, dilation 1, strides 1 and 2 (MobileNet's): each output's 9 taps summed in a
 * register and stored once, bias and clamp in the same pass (the generic loop in mt_conv_depthwise
 * makes 9 passes over the output plane). A plane whose copies fit MT_DW3_SMALL elements of stack
 * is copied there zero-padded, laid out so that one unit-stride loop covers the whole plane
 * (mt_dw3_flat, mt_dw3_flat2, mt_dw3_small); a larger one goes by output rows (mt_dw3_plane).
 * Taps are added in the generic loop's order (kw outer, kh inner). The copies add w * 0 for taps
 * on padding, as ONNX's zero padding does, where the rows and the generic loop skip them: the
 * same sums, but for the sign of a zero result and an infinite weight next to padding. ---- */
#define MT_DW3_SMALL (49152 / (mt_i)sizeof(T)) /* 48 KiB */
#ifndef MT_DW3_BLOCK_MAX
#define MT_DW3_BLOCK_MAX 64     /* output planes up to which mt_dw3_block runs (7x7; 14x14 gathered ran as fast by planes) */
#define MT_DW3_BLOCK_MAX_TR 256 /* the same, float with AVX-512 transposes (14x14) */
#endif

/* By output rows, for planes too large for the stack: r0..r2 are the input rows under the window,
 * NULL where outside; mt_dw3_at computes an output whose window leaves the row. */
MT_INNER T MT_FN(mt_dw3_at)(const T *r0, const T *r1, const T *r2, const T *w, T b, mt_i IW, mt_i i,
                           T clo, T chi) {
    T a = b;
    for (mt_i kw = 0; kw < 3; kw++) {
        if (i + kw < 0 || i + kw >= IW) continue;
        if (r0) a += w[kw] * r0[i + kw];
        if (r1) a += w[3 + kw] * r1[i + kw];
        if (r2) a += w[6 + kw] * r2[i + kw];
    }
    return a < clo ? clo : (a > chi ? chi : a);
}

/* Columns [lo, hi) of one output row, every tap inside the row; S the stride (a constant, so
 * that GCC vectorizes each case), TAPS the additions for the rows present. */
#define MT_DW3_COLS(S, TAPS)                                                                           \
    _Pragma("omp simd")                                                                               \
    for (mt_i ow = lo; ow < hi; ow++) {                                                               \
        const mt_i i = ow * (S) - pw;                                                                 \
        T a = b;                                                                                      \
        TAPS;                                                                                         \
        y[ow] = a < clo ? clo : (a > chi ? chi : a);                                                  \
    }
#define MT_DW3_ALL a += w0 * r0[i]; a += w3 * r1[i]; a += w6 * r2[i]; a += w1 * r0[i + 1]; \
    a += w4 * r1[i + 1]; a += w7 * r2[i + 1]; a += w2 * r0[i + 2]; a += w5 * r1[i + 2]; a += w8 * r2[i + 2]
#define MT_DW3_LOW a += w3 * r1[i]; a += w6 * r2[i]; a += w4 * r1[i + 1]; a += w7 * r2[i + 1]; \
    a += w5 * r1[i + 2]; a += w8 * r2[i + 2]
#define MT_DW3_HIGH a += w0 * r0[i]; a += w3 * r1[i]; a += w1 * r0[i + 1]; a += w4 * r1[i + 1]; \
    a += w2 * r0[i + 2]; a += w5 * r1[i + 2]

static inline void MT_FN(mt_dw3_plane)(const T *x, const T *w, T b, T *restrict y, mt_i IH, mt_i IW, mt_i OH,
                                       mt_i OW, mt_i sh, mt_i sw, mt_i ph, mt_i pw, T clo, T chi) {
    const T w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3], w4 = w[4], w5 = w[5], w6 = w[6], w7 = w[7], w8 = w[8];
    mt_i lo, hi; /* columns whose three taps lie in the row */
    mt_window_range(OW, IW - 2, sw, -pw, &lo, &hi);
    for (mt_i oh = 0; oh < OH; oh++, y += OW) {
        const mt_i ih = oh * sh - ph;
        const T *r0 = ih >= 0 && ih < IH ? x + ih * IW : 0;
        const T *r1 = ih + 1 >= 0 && ih + 1 < IH ? x + (ih + 1) * IW : 0;
        const T *r2 = ih + 2 >= 0 && ih + 2 < IH ? x + (ih + 2) * IW : 0;
        mt_i vlo = lo, vhi = hi; /* the vector loop's columns; the others go one by one */
        if (r1 && r2 && r0) {
            if (sw == 1) { MT_DW3_COLS(1, MT_DW3_ALL) } else { MT_DW3_COLS(2, MT_DW3_ALL) }
        } else if (r1 && r2) {
            if (sw == 1) { MT_DW3_COLS(1, MT_DW3_LOW) } else { MT_DW3_COLS(2, MT_DW3_LOW) }
        } else if (r0 && r1) {
            if (sw == 1) { MT_DW3_COLS(1, MT_DW3_HIGH) } else { MT_DW3_COLS(2, MT_DW3_HIGH) }
        } else {
            vlo = vhi = OW;
        }
        for (mt_i ow = 0; ow < vlo; ow++) y[ow] = MT_FN(mt_dw3_at)(r0, r1, r2, w, b, IW, ow * sw - pw, clo, chi);
        for (mt_i ow = vhi; ow < OW; ow++) y[ow] = MT_FN(mt_dw3_at)(r0, r1, r2, w, b, IW, ow * sw - pw, clo, chi);
    }
}
#undef MT_DW3_COLS
#undef MT_DW3_ALL
#undef MT_DW3_LOW
#undef MT_DW3_HIGH

/* Planes too large for the copies below, equal strides s (1 or 2): each input row copied once into
 * a ring of three zero-padded rows (stride 2: its even columns, then its odd ones), so that each
 * output row is one unit-stride loop, every column in it (mt_dw3_plane leaves two per row to a
 * scalar loop: 112x112 planes 1.5x slower). Rows above and below the input read a zero row; w * 0
 * added for padding, as the copies below do. */
static inline int MT_FN(mt_dw3_ring)(const T *x, const T *w, T b, T *restrict y, mt_i IH, mt_i IW, mt_i OH,
                                     mt_i OW, mt_i s, mt_i ph, mt_i pw, T clo, T chi) {
    const mt_i PW = (OW - 1) * s + 3, RW = s == 1 ? PW : 2 * (OW + 1); /* padded width; a stored row */
    if (4 * RW > MT_DW3_SMALL) return 0;
    const T w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3], w4 = w[4], w5 = w[5], w6 = w[6], w7 = w[7], w8 = w[8];
    T buf[MT_DW3_SMALL];
    T *zero = buf + 3 * RW;
    memset(zero, 0, sizeof(T) * (size_t)RW);
    mt_i held[3] = {-1, -1, -1}, e0, e1, o0, o1; /* the padded row in each slot; columns from the input */
    mt_window_range(s == 1 ? PW : OW + 1, IW, s, -pw, &e0, &e1);
    mt_window_range(OW, IW, 2, 1 - pw, &o0, &o1);
    for (mt_i oh = 0; oh < OH; oh++, y += OW) {
        const T *t[3];
        for (mt_i kh = 0; kh < 3; kh++) {
            const mt_i pr = oh * s + kh, ih = pr - ph;
            if (ih < 0 || ih >= IH) {
                t[kh] = zero;
                continue;
            }
            T *restrict row = buf + pr % 3 * RW;
            t[kh] = row;
            if (held[pr % 3] == pr) continue;
            held[pr % 3] = pr;
            const T *src = x + ih * IW - pw; /* padded column c is src[c] */
            if (s == 1) {
                for (mt_i c = 0; c < e0; c++) row[c] = 0;
                _Pragma("omp simd")
                for (mt_i c = e0; c < e1; c++) row[c] = src[c];
                for (mt_i c = e1; c < PW; c++) row[c] = 0;
            } else { /* even columns 2q at row[q], odd 2q + 1 at row[OW + 1 + q] */
                T *restrict od = row + OW + 1;
                for (mt_i q = 0; q < e0; q++) row[q] = 0;
                _Pragma("omp simd")
                for (mt_i q = e0; q < e1; q++) row[q] = src[2 * q];
                for (mt_i q = e1; q <= OW; q++) row[q] = 0;
                for (mt_i q = 0; q < o0; q++) od[q] = 0;
                _Pragma("omp simd")
                for (mt_i q = o0; q < o1; q++) od[q] = src[2 * q + 1];
                for (mt_i q = o1; q < OW; q++) od[q] = 0;
            }
        }
        /* tap kw of row kh: (s 1) t[kh][ow + kw]; (s 2) even half at ow + kw / 2 for kw 0 and 2,
         * odd half at ow for kw 1 */
        const mt_i h1 = s == 1 ? 1 : OW + 1, h2 = s == 1 ? 2 : 1;
        const T *a0 = t[0], *a1 = t[1], *a2 = t[2], *b0 = a0 + h1, *b1 = a1 + h1, *b2 = a2 + h1;
        const T *c0 = a0 + h2, *c1 = a1 + h2, *c2 = a2 + h2;
        _Pragma("omp simd")
        for (mt_i ow = 0; ow < OW; ow++) {
            T a = b;
            a += w0 * a0[ow]; a += w3 * a1[ow]; a += w6 * a2[ow];
            a += w1 * b0[ow]; a += w4 * b1[ow]; a += w7 * b2[ow];
            a += w2 * c0[ow]; a += w5 * c1[ow]; a += w8 * c2[ow];
            y[ow] = a < clo ? clo : (a > chi ? chi : a);
        }
    }
    return 1;
}

/* y[p] = clamp(b + the 9 taps at t[k][p], k = kh*3 + kw), p < P: one unit-stride loop, in 256-bit
 * vectors for short planes (under 256 outputs: 14x14, 7x7), where 512-bit ones would leave much of
 * the plane to the scalar remainder (960x7x7 20%, 576x14x14 10% faster; 144x56x56 was 10% slower). */
#define MT_DW3_SUM(PRAGMA)                                                                             \
    _Pragma(PRAGMA)                                                                                   \
    for (mt_i p = 0; p < P; p++) {                                                                    \
        T a = b;                                                                                      \
        a += w0 * t0[p]; a += w3 * t3[p]; a += w6 * t6[p];                                            \
        a += w1 * t1[p]; a += w4 * t4[p]; a += w7 * t7[p];                                            \
        a += w2 * t2[p]; a += w5 * t5[p]; a += w8 * t8[p];                                            \
        y[p] = a < clo ? clo : (a > chi ? chi : a);                                                   \
    }
static inline void MT_FN(mt_dw3_sum)(const T *const *t, const T *w, T b, T *restrict y, mt_i P, T clo, T chi) {
    const T *t0 = t[0], *t1 = t[1], *t2 = t[2], *t3 = t[3], *t4 = t[4], *t5 = t[5], *t6 = t[6], *t7 = t[7], *t8 = t[8];
    const T w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3], w4 = w[4], w5 = w[5], w6 = w[6], w7 = w[7], w8 = w[8];
    if (P < 256) {
        MT_DW3_SUM("omp simd simdlen(32 / sizeof(T))")
    } else {
        MT_DW3_SUM("omp simd")
    }
}
#undef MT_DW3_SUM

/* Other paddings and equal strides s (1 or 2): the padded plane split by s into s*s phases, phase
 * (a, c) holding padded element (s*r + a, s*q + c) at (r, q) in rows of HW. Output (oh, ow)'s tap
 * (kh, kw) is then phase (kh % s, kw % s) at (oh + kh / s, ow + kw / s): one unit-stride loop over
 * oh*HW + ow into t, whose rows are then copied out (HW > OW). */
static inline int MT_FN(mt_dw3_small)(const T *x, const T *w, T b, T *restrict y, mt_i IH, mt_i IW, mt_i OH,
                                      mt_i OW, mt_i s, mt_i ph, mt_i pw, T clo, T chi) {
    const mt_i HH = OH + 2 / s, HW = OW + 2 / s, Q = (OH - 1) * HW + OW;
    if (s * s * HH * HW + OH * HW > MT_DW3_SMALL) return 0;
    T buf[MT_DW3_SMALL];
    T *restrict t = buf + s * s * HH * HW;
    memset(buf, 0, sizeof(T) * (size_t)(s * s * HH * HW));
    for (mt_i ih = 0; ih < IH; ih++) {
        const mt_i pr = ih + ph;
        if (pr >= s * HH) break; /* rows below every window */
        const T *src = x + ih * IW;
        for (mt_i c = 0; c < s; c++) {
            /* padded columns s*q + c, q in [q0, q1), come from input columns s*q + c - pw */
            mt_i q0, q1;
            mt_window_range(HW, IW, s, c - pw, &q0, &q1);
            T *restrict dst = buf + ((pr % s * s + c) * HH + pr / s) * HW;
            const T *from = src + c - pw;
            if (s == 1) {
                _Pragma("omp simd")
                for (mt_i q = q0; q < q1; q++) dst[q] = from[q];
            } else {
                _Pragma("omp simd")
                for (mt_i q = q0; q < q1; q++) dst[q] = from[2 * q];
            }
        }
    }
    const T *p[9];
    for (mt_i kh = 0; kh < 3; kh++)
        for (mt_i kw = 0; kw < 3; kw++)
            p[kh * 3 + kw] = buf + ((kh % s * s + kw % s) * HH + kh / s) * HW + kw / s;
    MT_FN(mt_dw3_sum)(p, w, b, t, Q, clo, chi);
    for (mt_i oh = 0; oh < OH; oh++) {
        _Pragma("omp simd")
        for (mt_i ow = 0; ow < OW; ow++) y[oh * OW + ow] = t[oh * HW + ow];
    }
    return 1;
}

/* Stride 1, one column of padding each side (OW == IW): the padded plane kept at the input's row
 * pitch, so that output p = oh*OW + ow reads tap (kh, kw) at p + kh*IW + kw and one unit-stride
 * loop writes the output plane. c is the plane with zero rows above and below and one zero each
 * end; the taps that cross a row end (kw 0 at ow 0, kw 2 at ow OW-1) read copies of it whose last
 * (l, for kw 0) or first (r, for kw 2) column is zeroed. */
static inline int MT_FN(mt_dw3_flat)(const T *x, const T *w, T b, T *restrict y, mt_i IH, mt_i IW, mt_i OH,
                                     mt_i ph, T clo, T chi) {
    const mt_i R = (OH + 2) * IW + 2, ih0 = ph > 0 ? 0 : -ph, ih1 = IH < OH + 2 - ph ? IH : OH + 2 - ph;
    if (3 * R > MT_DW3_SMALL) return 0;
    T buf[MT_DW3_SMALL];
    T *c = buf, *l = buf + R, *r = buf + 2 * R;
    memset(c, 0, sizeof(T) * (size_t)R);
    if (ih1 > ih0) memcpy(c + 1 + (ih0 + ph) * IW, x + ih0 * IW, sizeof(T) * (size_t)((ih1 - ih0) * IW));
    memcpy(l, c, sizeof(T) * (size_t)R);
    memcpy(r, c, sizeof(T) * (size_t)R);
    for (mt_i pr = 0; pr < OH + 2; pr++) {
        l[pr * IW + IW] = 0;
        r[1 + pr * IW] = 0;
    }
    const T *t[9] = {l, c + 1, r + 2, l + IW, c + 1 + IW, r + 2 + IW, l + 2 * IW, c + 1 + 2 * IW, r + 2 + 2 * IW};
    MT_FN(mt_dw3_sum)(t, w, b, y, OH * IW, clo, chi);
    return 1;
}

/* Stride 2, one row and column of padding before, even input (OH, OW = IH / 2, IW / 2: MobileNet's
 * downsampling): the input split by row and column parity into planes at the output's pitch, so
 * one unit-stride loop writes the output plane. Tap rows 2oh - 1 (kh 0) and 2oh + 1 (kh 2) are
 * rows oh and oh + 1 of the odd-row planes (a zero row first); tap columns 2ow (kw 1) and
 * 2ow + 1 (kw 2) are column ow of the even- and odd-column planes, and 2ow - 1 (kw 0) is the
 * element before it in an odd-column copy with a zero first and its last column zeroed. */
static inline int MT_FN(mt_dw3_flat2)(const T *x, const T *w, T b, T *restrict y, mt_i IH, mt_i IW, mt_i OH,
                                      mt_i OW, T clo, T chi) {
    const mt_i Po = (OH + 1) * OW + 1, Pe = OH * OW + 1; /* odd- and even-row planes, one spare */
    if (3 * (Po + Pe) > MT_DW3_SMALL) return 0;
    T buf[MT_DW3_SMALL];
    T *oe = buf, *oo = oe + Po, *oz = oo + Po, *ee = oz + Po, *eo = ee + Pe, *ez = eo + Pe;
    for (mt_i q = 0; q <= OW; q++) oe[q] = oo[q] = oz[q] = 0; /* the zero row before the odd rows */
    ez[0] = 0;
    for (mt_i ih = 0; ih < IH; ih++) {
        const T *src = x + ih * IW;
        const mt_i o = ih % 2 ? (ih + 1) / 2 * OW : ih / 2 * OW;
        T *e = (ih % 2 ? oe : ee) + o, *d = (ih % 2 ? oo : eo) + o, *z = (ih % 2 ? oz : ez) + o + 1;
        _Pragma("omp simd")
        for (mt_i q = 0; q < OW; q++) {
            e[q] = src[2 * q];
            d[q] = z[q] = src[2 * q + 1];
        }
        z[OW - 1] = 0;
    }
    const T *t[9] = {oz, oe, oo, ez, ee, eo, oz + OW, oe + OW, oo + OW};
    MT_FN(mt_dw3_sum)(t, w, b, y, OH * OW, clo, chi);
    return 1;
}

/* Small output planes (up to MT_DW3_BLOCK_MAX: MobileNet's 7x7), equal strides s (1 or 2): MT_DW3_CB
 * channels at a time, each output a vector across channels. Their zero-padded planes are copied transposed
 * into t[(pr * PW + pc) * CB + lane], so that output (oh, ow)'s tap (kh, kw) is one vector at
 * ((oh*s + kh) * PW + ow*s + kw) * CB; the outputs go to o[p * CB + lane], then to their planes.
 * A plane at a time, the copies cost more than the 9 taps (960x7x7 in MobileNetV2: 0.10 -> 0.055 ms
 * one thread). Taps in the order of mt_dw3_sum (kw outer, kh inner), w * 0 added for padding as
 * the copies there do: the same sums. */
#define MT_DW3_CB ((mt_i)(64 / sizeof(T)))        /* channels per block: one 512-bit vector */
#define MT_DW3_CB_MAX (49152 / (mt_i)sizeof(T))   /* elements of t and o together: 48 KiB */
static inline int MT_FN(mt_dw3_block)(const T *X, const T *W, const T *Bias, T *restrict Y, mt_i N, mt_i C, mt_i M,
                                      const mt_i *g, T clo, T chi) {
    const mt_i IH = g[1], IW = g[2], OH = g[4], OW = g[5], s = g[10], ph = g[13], pw = g[14];
    const mt_i PH = (OH - 1) * s + 3, PW = (OW - 1) * s + 3, S = IH * IW, P = OH * OW, Mg = M / C;
    const mt_i CB = MT_DW3_CB, nb = (M + CB - 1) / CB;
    /* float blocks (16 lanes) through mt_tr16_f32 where it is fast: its input plane goes to a
     * scratch of S pixels after o (the cast pointers are used only when T is float) */
    const int tr = MT_TR16 && sizeof(T) == sizeof(float) && CB == 16;
    if ((PH * PW + P + (tr ? S : 0)) * CB > MT_DW3_CB_MAX) return 0;
    _Pragma("omp parallel for if(N * M * P * 9 > MT_PAR_MIN)")
    for (mt_i nb_ = 0; nb_ < N * nb; nb_++) {
        const mt_i n = nb_ / nb, m0 = nb_ % nb * CB, cb = M - m0 < CB ? M - m0 : CB;
        _Alignas(64) T t[MT_DW3_CB_MAX];
        T *restrict o = t + PH * PW * CB;
        _Alignas(64) T w[9][MT_DW3_CB], b[MT_DW3_CB];
        for (mt_i k = 0; k < 9; k++)
            for (mt_i l = 0; l < CB; l++) w[k][l] = l < cb ? W[(m0 + l) * 9 + k] : (T)0;
        for (mt_i l = 0; l < CB; l++) b[l] = l < cb && Bias ? Bias[m0 + l] : (T)0;
        memset(t, 0, sizeof(T) * (size_t)(PH * PW * CB));
        mt_i c0, c1; /* input columns inside the padded plane */
        mt_window_range(PW, IW, 1, -pw, &c0, &c1);
        if (tr && Mg == 1 && cb == CB) { /* 16 float planes: transposed 16 pixels at a time, then rows placed */
            const float *x = (const float *)(X + (n * C + m0) * S);
            float *restrict xt = (float *)(o + P * CB);
            mt_i p = 0;
            for (; p + 16 <= S; p += 16) mt_tr16_f32(x + p, S, xt + p * 16, 16);
            for (; p < S; p++)
                for (mt_i l = 0; l < 16; l++) xt[p * 16 + l] = x[l * S + p];
            for (mt_i pr = ph; pr < PH && pr - ph < IH; pr++)
                if (c1 > c0)
                    memcpy(t + (pr * PW + c0) * CB, xt + ((pr - ph) * IW + c0 - pw) * 16,
                           sizeof(T) * (size_t)((c1 - c0) * CB));
        } else if (Mg == 1 && cb == CB) { /* a whole block of planes S apart: gathers across them */
            const T *x = X + (n * C + m0) * S;
            for (mt_i pr = ph; pr < PH && pr - ph < IH; pr++)
                for (mt_i pc = c0; pc < c1; pc++) {
                    const T *src = x + (pr - ph) * IW + pc - pw;
                    T *restrict dst = t + (pr * PW + pc) * CB;
                    _Pragma("omp simd")
                    for (mt_i l = 0; l < MT_DW3_CB; l++) dst[l] = src[l * S];
                }
        } else {
            for (mt_i l = 0; l < cb; l++) {
                const T *x = X + (n * C + (m0 + l) / Mg) * S;
                for (mt_i pr = ph; pr < PH && pr - ph < IH; pr++) {
                    const T *src = x + (pr - ph) * IW - pw;
                    T *restrict dst = t + pr * PW * CB + l;
                    for (mt_i pc = c0; pc < c1; pc++) dst[pc * CB] = src[pc];
                }
            }
        }
        for (mt_i oh = 0; oh < OH; oh++)
            for (mt_i ow = 0; ow < OW; ow++) {
                const T *t0 = t + (oh * s * PW + ow * s) * CB, *t1 = t0 + PW * CB, *t2 = t1 + PW * CB;
                T *restrict op = o + (oh * OW + ow) * CB;
                _Pragma("omp simd")
                for (mt_i l = 0; l < MT_DW3_CB; l++) {
                    T a = b[l];
                    a += w[0][l] * t0[l]; a += w[3][l] * t1[l]; a += w[6][l] * t2[l];
                    a += w[1][l] * t0[CB + l]; a += w[4][l] * t1[CB + l]; a += w[7][l] * t2[CB + l];
                    a += w[2][l] * t0[2 * CB + l]; a += w[5][l] * t1[2 * CB + l]; a += w[8][l] * t2[2 * CB + l];
                    op[l] = a < clo ? clo : (a > chi ? chi : a);
                }
            }
        mt_i p0 = 0; /* pixels gone out by transposes; the rest lane by lane */
        if (tr && cb == CB)
            for (; p0 + 16 <= P; p0 += 16)
                mt_tr16_f32((const float *)(o + p0 * CB), 16, (float *)(Y + (n * M + m0) * P + p0), P);
        for (mt_i l = 0; l < cb; l++) {
            T *restrict y = Y + (n * M + m0 + l) * P;
            _Pragma("omp simd")
            for (mt_i p = p0; p < P; p++) y[p] = o[p * MT_DW3_CB + l];
        }
    }
    return 1;
}
#undef MT_DW3_CB
#undef MT_DW3_CB_MAX

/* Depthwise (one input channel per group): 2-D 3x3 windows, strides 1 and 2, by the mt_dw3_*
 * above; otherwise each output plane accumulates its K taps as shifted rows of its input plane,
 * contiguous when the stride is 1. No scratch (the mt_dw3_* copies live on the stack). */
static inline void MT_FN(mt_conv_depthwise)(const T *X, const T *W, const T *Bias, T *restrict Y, mt_i N, mt_i C,
                                            mt_i M, const mt_i *g, T clo, T chi) {
    const mt_i ID = g[0], IH = g[1], IW = g[2], OD = g[3], OH = g[4], OW = g[5];
    const mt_i KD = g[6], KH = g[7], KW = g[8], sd = g[9], sh = g[10], sw = g[11];
    const mt_i pd = g[12], ph = g[13], pw = g[14], dd = g[15], dh = g[16], dw = g[17];
    const mt_i Mg = M / C, S = ID * IH * IW, P = OD * OH * OW, K = KD * KH * KW;
    if (ID == 1 && OD == 1 && pd == 0 && KH == 3 && KW == 3 && dh == 1 && dw == 1 && sh == sw && (sh == 1 || sh == 2) &&
        P <= (MT_TR16 && sizeof(T) == sizeof(float) ? MT_DW3_BLOCK_MAX_TR : MT_DW3_BLOCK_MAX) &&
        MT_FN(mt_dw3_block)(X, W, Bias, Y, N, C, M, g, clo, chi))
        return;
    _Pragma("omp parallel for if(N * M * P * K > MT_PAR_MIN)")
    for (mt_i nm = 0; nm < N * M; nm++) {
        mt_i n = nm / M, m = nm % M;
        const T *x = X + (n * C + m / Mg) * S, *w = W + m * K;
        T *restrict y = Y + nm * P;
        T b = Bias ? Bias[m] : (T)0;
        if (ID == 1 && OD == 1 && pd == 0 && KH == 3 && KW == 3 && dh == 1 && dw == 1 && (sw == 1 || sw == 2)) {
            if (sh == 1 && sw == 1 && pw == 1 && OW == IW && MT_FN(mt_dw3_flat)(x, w, b, y, IH, IW, OH, ph, clo, chi))
                continue;
            if (sh == 2 && sw == 2 && ph == 1 && pw == 1 && IH % 2 == 0 && IW % 2 == 0 && OH == IH / 2 &&
                OW == IW / 2 && MT_FN(mt_dw3_flat2)(x, w, b, y, IH, IW, OH, OW, clo, chi))
                continue;
            if (sh != sw || !(MT_FN(mt_dw3_small)(x, w, b, y, IH, IW, OH, OW, sw, ph, pw, clo, chi) ||
                              MT_FN(mt_dw3_ring)(x, w, b, y, IH, IW, OH, OW, sw, ph, pw, clo, chi)))
                MT_FN(mt_dw3_plane)(x, w, b, y, IH, IW, OH, OW, sh, sw, ph, pw, clo, chi);
            continue;
        }
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
#undef MT_DW3_SMALL

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
MT_INNER void MT_FN(mt_moments)(const T *x, mt_i n, double eps, double *mean, double *inv) {
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
