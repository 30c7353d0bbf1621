/* Template: MaxPool over element type T (see mt_base.h); MT_LOWEST is T's lowest value and
 * MT_ISNAN(v) tells a NaN (0 for integers). Included once per type by mt_nn.h; no guard. */

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
    (void)P; /* read only by the OpenMP clause: unused without -fopenmp */
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
