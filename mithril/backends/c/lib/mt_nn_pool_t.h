/* Template: MaxPool over element type T (see mt_base.h); MT_LOWEST is T's lowest value and
 * MT_ISNAN(v) tells a NaN (0 for integers). Included once per type by mt_nn.h; no guard. */

/* m = v where v > m or v is NaN: the generic loop's rule without Ind, as two selects so that GCC
 * compiles it without branches (maxss and a conditional move; blends when vectorized). */
#define MT_MAXPOOL_TAKE(m, v) \
    m = (v) > (m) ? (v) : (m); \
    m = MT_ISNAN(v) ? (v) : (m)

/* MaxPool of one 2-D plane x (IH x IW) into y (OH x OW), width dilation 1, no indices. Each
 * output row starts at T's lowest value and takes the in-bounds input rows (kh) one at a time:
 * the border columns, where some tap falls outside the row, with checks; the interior [lo, hi),
 * where every tap is inside, without, so it vectorizes (MT_MAXPOOL_ROW: width stride S and kernel
 * width K as constants for the common cases). Every output sees its taps in the generic loop's
 * order (kh, then kw), so results are the same to the bit (signed zeros, which NaN). */
#define MT_MAXPOOL_ROW(S, K)                                                                           \
    for (mt_i ow = lo; ow < hi; ow++) {                                                                \
        T m = yr[ow];                                                                                  \
        for (mt_i kw = 0; kw < (K); kw++) {                                                            \
            const T v = xr[ow * (S) + kw - pw];                                                        \
            MT_MAXPOOL_TAKE(m, v);                                                                     \
        }                                                                                              \
        yr[ow] = m;                                                                                    \
    }

static inline void MT_FN(mt_maxpool_2d)(const T *restrict x, T *restrict y, mt_i IH, mt_i IW, mt_i OH, mt_i OW,
                                        mt_i KH, mt_i KW, mt_i sh, mt_i sw, mt_i ph, mt_i pw, mt_i dh) {
    /* [lo, hi): the output columns whose first and last taps (so all) are inside the row. */
    mt_i lo, hi, lo2, hi2;
    mt_window_range(OW, IW, sw, -pw, &lo, &hi);
    mt_window_range(OW, IW, sw, KW - 1 - pw, &lo2, &hi2);
    hi = hi2 > lo ? hi2 : lo;
    for (mt_i oh = 0; oh < OH; oh++) {
        T *restrict yr = y + oh * OW;
        for (mt_i ow = 0; ow < OW; ow++) yr[ow] = MT_LOWEST;
        for (mt_i kh = 0; kh < KH; kh++) {
            const mt_i ih = oh * sh - ph + kh * dh;
            if (ih < 0 || ih >= IH) continue;
            const T *restrict xr = x + ih * IW;
            for (mt_i ow = 0; ow < OW; ow++) {
                if (ow == lo) ow = hi; /* the interior, below */
                if (ow >= OW) break;
                T m = yr[ow];
                for (mt_i kw = 0; kw < KW; kw++) {
                    const mt_i iw = ow * sw + kw - pw;
                    if (iw < 0 || iw >= IW) continue;
                    const T v = xr[iw];
                    MT_MAXPOOL_TAKE(m, v);
                }
                yr[ow] = m;
            }
            if (sw == 1 && KW == 3) {
                MT_MAXPOOL_ROW(1, 3)
            } else if (sw == 2 && KW == 3) {
                MT_MAXPOOL_ROW(2, 3)
            } else if (sw == 2 && KW == 2) {
                MT_MAXPOOL_ROW(2, 2)
            } else {
                MT_MAXPOOL_ROW(sw, KW)
            }
        }
    }
}
#undef MT_MAXPOOL_TAKE
#undef MT_MAXPOOL_ROW

/* MaxPool over NC planes with the window geometry g (mt_nn.h). Ind (may be NULL): the flat
 * position in X of each window's first maximum: the plane times its size plus
 * sum(coord[a] * istr[a]) (row- or column-major per storage_order). Without Ind, NaN propagates
 * (NumPy's maximum); with it, the first strictly greater value wins. */
static inline void MT_FN(mt_maxpool)(const T *X, T *restrict Y, int64_t *restrict Ind, mt_i NC, const mt_i *g,
                                     const mt_i *istr) {
    const mt_i ID = g[0], IH = g[1], IW = g[2], OD = g[3], OH = g[4], OW = g[5];
    const mt_i KD = g[6], KH = g[7], KW = g[8], sd = g[9], sh = g[10], sw = g[11];
    const mt_i pd = g[12], ph = g[13], pw = g[14], dd = g[15], dh = g[16], dw = g[17];
    const mt_i S = ID * IH * IW, P = OD * OH * OW;
    /* 2-D and 1-D pools without Ind (ResNet's, most CNNs'): mt_maxpool_2d per plane, same results.
     * (pd > 0 with one input and one output plane puts the only window in the padding.) */
    if (!Ind && ID == 1 && OD == 1 && KD == 1 && pd == 0 && dw == 1) {
        _Pragma("omp parallel for if(NC * P * KH * KW > MT_PAR_MIN)")
        for (mt_i c = 0; c < NC; c++)
            MT_FN(mt_maxpool_2d)(X + c * S, Y + c * P, IH, IW, OH, OW, KH, KW, sh, sw, ph, pw, dh);
        return;
    }
    _Pragma("omp parallel for if(NC * P * KD * KH * KW > MT_PAR_MIN)")
    for (mt_i c = 0; c < NC; c++) {
        const T *x = X + c * S;
        for (mt_i od = 0; od < OD; od++)
            for (mt_i oh = 0; oh < OH; oh++)
                for (mt_i ow = 0; ow < OW; ow++) {
                    T m = MT_LOWEST;
                    int64_t at = -1;
                    for (mt_i kd = 0; kd < KD; kd++) {
                        mt_i id = od * sd - pd + kd * dd;
                        if (id < 0 || id >= ID) continue;
                        for (mt_i kh = 0; kh < KH; kh++) {
                            mt_i ih = oh * sh - ph + kh * dh;
                            if (ih < 0 || ih >= IH) continue;
                            for (mt_i kw = 0; kw < KW; kw++) {
                                mt_i iw = ow * sw - pw + kw * dw;
                                if (iw < 0 || iw >= IW) continue;
                                T v = x[(id * IH + ih) * IW + iw];
                                if (Ind) {
                                    if (at < 0 || v > m) {
                                        m = v;
                                        at = id * istr[0] + ih * istr[1] + iw * istr[2];
                                    }
                                } else if (v > m || MT_ISNAN(v)) {
                                    m = v;
                                }
                            }
                        }
                    }
                    mt_i o = (c * OD + od) * OH * OW + oh * OW + ow;
                    Y[o] = m;
                    if (Ind) Ind[o] = c * S + (at < 0 ? 0 : at);
                }
    }
}
