/* Resize/Upsample: per-axis tap tables, computed at run time from scales/sizes/roi exactly as
 * Mithril's NumPy kernel does (float32 source coordinates, as onnxruntime, so a coordinate on a
 * .5 boundary picks the same pixel), then one gather-and-weight pass (mt_resize_<sfx>). */
#ifndef MT_MOVEMENT_RESIZE_H
#define MT_MOVEMENT_RESIZE_H

#include "mt_base.h"

enum { MT_RS_NEAREST = 0, MT_RS_LINEAR = 1, MT_RS_CUBIC = 2 };
enum { MT_CT_HALF_PIXEL = 0, MT_CT_HALF_PIXEL_SYMMETRIC = 1, MT_CT_PYTORCH_HALF_PIXEL = 2, MT_CT_ALIGN_CORNERS = 3,
       MT_CT_ASYMMETRIC = 4, MT_CT_TF_HALF_PIXEL_FOR_NN = 5, MT_CT_TF_CROP_AND_RESIZE = 6 };
enum { MT_NM_ROUND_PREFER_FLOOR = 0, MT_NM_ROUND_PREFER_CEIL = 1, MT_NM_FLOOR = 2, MT_NM_CEIL = 3, MT_NM_LEGACY = 4 };
enum { MT_KA_STRETCH = 0, MT_KA_NOT_LARGER = 1, MT_KA_NOT_SMALLER = 2 };

static inline float mt_resize_coord(mt_i o, mt_i out_len, mt_i in_len, float scale, int ctm, float rs, float re) {
    float of = (float)o, inl = (float)in_len;
    switch (ctm) {
    case MT_CT_HALF_PIXEL: return (of + 0.5f) / scale - 0.5f;
    case MT_CT_HALF_PIXEL_SYMMETRIC: {
        float adjustment = (float)out_len / (scale * inl);
        float offset = inl / 2.0f * (1.0f - adjustment);
        return offset + (of + 0.5f) / scale - 0.5f;
    }
    case MT_CT_PYTORCH_HALF_PIXEL: return out_len > 1 ? (of + 0.5f) / scale - 0.5f : 0.0f;
    case MT_CT_ALIGN_CORNERS: {
        float resized = scale * inl;
        return resized != 1.0f ? of * (inl - 1.0f) / (resized - 1.0f) : 0.0f;
    }
    case MT_CT_TF_HALF_PIXEL_FOR_NN: return (of + 0.5f) / scale;
    case MT_CT_TF_CROP_AND_RESIZE:
        if (out_len > 1) return rs * (inl - 1.0f) + of * (re - rs) * (inl - 1.0f) / (float)(out_len - 1);
        return 0.5f * (rs + re) * (inl - 1.0f);
    default: return of / scale; /* asymmetric */
    }
}

static inline double mt_keys_cubic(double d, double a) {
    d = fabs(d);
    if (d <= 1) return ((a + 2) * d - (a + 3)) * d * d + 1;
    if (d < 2) return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a;
    return 0;
}

/* One axis' taps: out_len rows of nt taps (at most ntmax), source index idx (clamped) and weight
 * w; outside[o] marks tf_crop_and_resize coordinates outside the input. Returns 3 when the
 * filter needs more than ntmax taps. */
static inline int mt_resize_axis_taps(mt_i out_len, mt_i in_len, double scale, int ctm, float rs, float re, int mode,
                                      int nearest_mode, double cubic_a, int antialias, int exclude_outside,
                                      mt_i ntmax, mt_i *nt, mt_i *idx, double *w, mt_bool *outside) {
    float sf = (float)scale;
    double s = antialias && scale < 1.0 ? scale : 1.0;
    mt_i start = mode == MT_RS_CUBIC ? (mt_i)floor(-2.0 / s) + 1 : (mt_i)floor(-1.0 / s) + 1;
    mt_i taps = mode == MT_RS_NEAREST ? 1 : 2 - 2 * start;
    if (taps > ntmax) return 3;
    *nt = taps;
    for (mt_i o = 0; o < out_len; o++) {
        float c = mt_resize_coord(o, out_len, in_len, sf, ctm, rs, re);
        mt_i *ix = idx + o * ntmax;
        double *wx = w + o * ntmax;
        outside[o] = ctm == MT_CT_TF_CROP_AND_RESIZE && (c < 0.0f || c > (float)in_len - 1.0f);
        if (mode == MT_RS_NEAREST) {
            float r;
            switch (nearest_mode) {
            case MT_NM_ROUND_PREFER_FLOOR: r = ceilf(c - 0.5f); break;
            case MT_NM_ROUND_PREFER_CEIL: r = floorf(c + 0.5f); break;
            case MT_NM_FLOOR: r = floorf(c); break;
            case MT_NM_CEIL: r = ceilf(c); break;
            default: r = scale < 1.0 ? ceilf(c) : truncf(c);
            }
            ix[0] = mt_clamp_i((mt_i)r, 0, in_len - 1);
            wx[0] = 1.0;
            continue;
        }
        float left = ceilf(c) - 1.0f, ratio = c - left;
        double sum = 0.0;
        for (mt_i k = 0; k < taps; k++) {
            double dist = ((double)(start + k) - (double)ratio) * s;
            double wk = mode == MT_RS_LINEAR ? (fabs(dist) < 1.0 ? 1.0 - fabs(dist) : 0.0) : mt_keys_cubic(dist, cubic_a);
            ix[k] = (mt_i)left + start + k;
            wx[k] = wk;
            sum += wk;
        }
        if (antialias)
            for (mt_i k = 0; k < taps; k++) wx[k] /= sum;
        if (exclude_outside) {
            sum = 0.0;
            for (mt_i k = 0; k < taps; k++) {
                if (ix[k] < 0 || ix[k] >= in_len) wx[k] = 0.0;
                sum += wx[k];
            }
            for (mt_i k = 0; k < taps; k++) wx[k] /= sum;
        }
        for (mt_i k = 0; k < taps; k++) ix[k] = mt_clamp_i(ix[k], 0, in_len - 1);
    }
    return 0;
}

/* Every axis' taps (axes not resized: one tap, the identity). scales (float32), sizes (int64)
 * and roi (float32 or float64) are the node's inputs, NULL when absent; axes[i] is the axis of
 * their i-th entry. Returns 2 when they do not give y's shape, 3 on too many taps. */
static inline int mt_resize_setup(int rank, const mt_i *xshape, const mt_i *yshape, int naxes, const mt_i *axes,
                                  const float *scales, const int64_t *sizes, const void *roi, int roi_f64, int policy,
                                  int mode, int ctm, int nearest_mode, double cubic_a, int antialias,
                                  int exclude_outside, const mt_i *ntmax, const mt_i *tbase, const mt_i *obase,
                                  mt_i *nt, mt_i *idx, double *w, mt_bool *outside) {
    double s_all = 0.0;
    if (!scales && policy != MT_KA_STRETCH) {
        for (int i = 0; i < naxes; i++) {
            double r = (double)sizes[i] / (double)xshape[axes[i]];
            if (i == 0 || (policy == MT_KA_NOT_LARGER ? r < s_all : r > s_all)) s_all = r;
        }
    }
    for (int d = 0; d < rank; d++) {
        nt[d] = 1;
        for (mt_i o = 0; o < yshape[d]; o++) {
            idx[tbase[d] + o * ntmax[d]] = o < xshape[d] ? o : xshape[d] - 1;
            w[tbase[d] + o * ntmax[d]] = 1.0;
            outside[obase[d] + o] = 0;
        }
    }
    for (int i = 0; i < naxes; i++) {
        mt_i a = axes[i], in_len = xshape[a], out_len;
        double scale;
        if (scales) {
            scale = (double)scales[i];
            out_len = (mt_i)floor((double)in_len * scale);
        } else if (policy == MT_KA_STRETCH) {
            out_len = (mt_i)sizes[i];
            scale = (double)out_len / (double)in_len;
        } else {
            scale = s_all;
            out_len = (mt_i)floor(s_all * (double)in_len + 0.5);
        }
        if (out_len != yshape[a]) return 2;
        float rs = 0.0f, re = 1.0f;
        if (roi && ctm == MT_CT_TF_CROP_AND_RESIZE) {
            rs = roi_f64 ? (float)((const double *)roi)[i] : ((const float *)roi)[i];
            re = roi_f64 ? (float)((const double *)roi)[i + naxes] : ((const float *)roi)[i + naxes];
        }
        if (out_len == in_len && scale == 1.0 && (ctm != MT_CT_TF_CROP_AND_RESIZE || (rs == 0.0f && re == 1.0f)))
            continue;
        if (out_len == 0 || in_len == 0) continue;
        int bad = mt_resize_axis_taps(out_len, in_len, scale, ctm, rs, re, mode, nearest_mode, cubic_a, antialias,
                                      exclude_outside, ntmax[a], nt + a, idx + tbase[a], w + tbase[a], outside + obase[a]);
        if (bad) return bad;
    }
    return 0;
}

/* GridSample's reflection: fold c into [lo, hi], bouncing off each border in turn. */
static inline double mt_grid_reflect(double c, double lo, double hi) {
    double span = hi - lo, dist;
    if (span <= 0) return lo;
    if (c >= lo && c <= hi) return c;
    int below = c < lo;
    dist = below ? lo - c : c - hi;
    double folds = floor(dist / span), rest = dist - folds * span;
    int even = fmod(folds, 2.0) == 0.0;
    return below ? (even ? lo + rest : hi - rest) : (even ? hi - rest : lo + rest);
}

enum { MT_GS_ZEROS = 0, MT_GS_BORDER = 1, MT_GS_REFLECTION = 2 };

/* One axis' taps (at most 4) of GridSample at normalised coordinate u in [-1, 1]: indices and
 * weights as Mithril's NumPy kernel (torch's and onnxruntime's conventions). Returns the count. */
static inline int mt_grid_taps(double u, mt_i size, int align, int mode, int pad, mt_i *idx, double *w) {
    double lo = align ? 0.0 : -0.5, hi = align ? (double)size - 1.0 : (double)size - 0.5;
    double c = align ? (u + 1) / 2 * (double)(size - 1) : ((u + 1) * (double)size - 1) / 2, base[4];
    int n;
    if (mode == MT_RS_NEAREST) c = nearbyint(c); /* round half to even, as NumPy */
    int outside = c < lo || c > hi;
    if (pad == MT_GS_BORDER && mode != MT_RS_CUBIC) {
        if (outside) c = c < 0 ? 0 : (c > (double)(size - 1) ? (double)(size - 1) : c);
    } else if (pad == MT_GS_REFLECTION) {
        c = mt_grid_reflect(c, lo, hi);
    }
    if (mode == MT_RS_NEAREST) {
        n = 1; base[0] = trunc(c); w[0] = 1.0;
    } else {
        double f = floor(c), t = c - f;
        if (mode == MT_RS_LINEAR) {
            n = 2; base[0] = f; base[1] = f + 1; w[0] = 1 - t; w[1] = t;
        } else {
            n = 4;
            for (int k = 0; k < 4; k++) base[k] = f - 1 + k;
            w[0] = mt_keys_cubic(t + 1, -0.75); w[1] = mt_keys_cubic(t, -0.75);
            w[2] = mt_keys_cubic(1 - t, -0.75); w[3] = mt_keys_cubic(2 - t, -0.75);
        }
    }
    for (int k = 0; k < n; k++) {
        double b = base[k];
        if (pad == MT_GS_ZEROS && !(b >= 0 && b <= (double)(size - 1))) w[k] = 0.0;
        else if (pad == MT_GS_REFLECTION) b = trunc(mt_grid_reflect(b, lo, hi));
        b = b < 0 ? 0 : (b > (double)(size - 1) ? (double)(size - 1) : b);
        idx[k] = (mt_i)b;
    }
    return n;
}

#endif /* MT_MOVEMENT_RESIZE_H */
