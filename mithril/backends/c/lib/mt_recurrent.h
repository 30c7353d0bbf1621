/* Recurrent kernels: RNN, GRU and LSTM (see mithril/backends/c/ops/recurrent.py; NumPy reference
 * mithril/backends/kernels/rnn.py).
 *
 * One function per element type runs the three cells: per direction, the input projection
 * X @ W^T (+ biases) for every time step at once through mt_gemm, then a loop over time whose
 * recurrent product h @ R^T is one mt_gemm over the batch. A reverse direction walks each batch
 * entry's sequence backwards within its own length; steps past a length leave the state alone and
 * write zeros to Y. The second half of this file is the template over one float type T: the first
 * half includes the file again once per type, as mt_rowwise.h does.
 */
#ifndef MT_RECURRENT_T
#ifndef MT_RECURRENT_H
#define MT_RECURRENT_H

#include "mt_base.h"
#include "mt_gemm.h"

/* Cells and activations, numbered as recurrent.py numbers them. */
enum { MT_RNN = 0, MT_GRU = 1, MT_LSTM = 2 };
enum {
    MT_ACT_RELU, MT_ACT_TANH, MT_ACT_SIGMOID, MT_ACT_AFFINE, MT_ACT_LEAKYRELU, MT_ACT_THRESHOLDEDRELU,
    MT_ACT_SCALEDTANH, MT_ACT_HARDSIGMOID, MT_ACT_ELU, MT_ACT_SOFTSIGN, MT_ACT_SOFTPLUS
};

#define MT_RECURRENT_T

#define T float
#define MT_SFX f32
#include "mt_recurrent.h"
#undef T
#undef MT_SFX

#define T double
#define MT_SFX f64
#include "mt_recurrent.h"
#undef T
#undef MT_SFX

#undef MT_RECURRENT_T
#endif /* MT_RECURRENT_H */

#else /* ---- the template: kernels over one float type T ---------------------------------------- */

/* One activation of a recurrent cell: `act` from the enum above with its alpha a and beta b, the
 * input clipped to [-clip, clip] first when clip >= 0. Sigmoid in its tanh form, as NumPy's. A call,
 * not inlined (-fno-inline): inlined at each of the cells' uses, its switch took GCC 28 s to compile
 * for three nodes; called, 4 s. */
static inline T MT_FN(mt_rnn_act)(T x, int act, T a, T b, T clip) {
    if (clip >= 0) x = x < -clip ? -clip : (x > clip ? clip : x);
    switch (act) {
    case MT_ACT_RELU: return x > 0 ? x : (T)0;
    case MT_ACT_TANH: return tanh(x);
    case MT_ACT_SIGMOID: return (T)0.5 * (tanh((T)0.5 * x) + 1);
    case MT_ACT_AFFINE: return a * x + b;
    case MT_ACT_LEAKYRELU: return x >= 0 ? x : a * x;
    case MT_ACT_THRESHOLDEDRELU: return x > a ? x : (T)0;
    case MT_ACT_SCALEDTANH: return a * tanh(b * x);
    case MT_ACT_HARDSIGMOID: { T v = a * x + b; return v < 0 ? (T)0 : (v > 1 ? (T)1 : v); }
    case MT_ACT_ELU: return x >= 0 ? x : a * (exp(x) - 1);
    case MT_ACT_SOFTSIGN: return x / (1 + fabs(x));
    default: return (x > 0 ? x : (T)0) + log1p(exp(-fabs(x))); /* softplus */
    }
}

/* X: (T, B, I) (layout 0) or (B, T, I) (layout 1); W: (D, G*H, I); R: (D, G*H, H); Bias: (D, 2*G*H)
 * or NULL; lens: B int32 lengths or NULL (every one `steps`); H0, C0: initial states shaped as Yh
 * or NULL (zeros); P: LSTM's peepholes (D, 3*H) or NULL. Y: (T, D, B, H) or (B, T, D, H); Yh, Yc:
 * (D, B, H) or (B, D, H); each may be NULL. G is 1, 3 or 4 for `cell`; `reverse` runs the only
 * direction backwards (D = 2 runs the second one backwards). acts, alpha, beta: the activations of
 * direction d at [d * per_direction ...]; clip < 0 is none (LSTM's third activation is never
 * clipped). Scratch: steps*B*G*H + B*G*H + 4*B*H elements of T. Returns 1, touching nothing, when a
 * length is outside [0, steps]. */
static inline int MT_FN(mt_recurrent)(const T *X, const T *W, const T *R, const T *Bias, const int32_t *lens,
                                      const T *H0, const T *C0, const T *P, T *Y, T *Yh, T *Yc, mt_i steps,
                                      mt_i batch, mt_i in, mt_i H, mt_i D, int reverse, int layout, int cell,
                                      int linear_before_reset, int input_forget, const int *acts, const T *alpha,
                                      const T *beta, T clip, T *scratch) {
    if (lens)
        for (mt_i b = 0; b < batch; b++)
            if (lens[b] < 0 || lens[b] > steps) return 1;
    const mt_i G = cell == MT_RNN ? 1 : (cell == MT_GRU ? 3 : 4), GH = G * H;
    const int per = cell == MT_RNN ? 1 : (cell == MT_GRU ? 2 : 3);
    T *xw = scratch;                 /* (rows of X, G*H): the input projection */
    T *gates = xw + steps * batch * GH; /* (B, n <= G*H): h @ R^T of one step */
    T *h = gates + batch * GH, *c = h + batch * H; /* (B, H) each: the state */
    T *rh = c + batch * H, *hh = rh + batch * H;   /* (B, H) each: GRU's reset * h and its product */
    for (mt_i d = 0; d < D; d++) {
        const int back = reverse || d == 1;
        const T *w = W + d * GH * in, *r = R + d * GH * H;
        const T *wb = Bias ? Bias + d * 2 * GH : 0, *rb = Bias ? wb + GH : 0;
        const T *p = P ? P + d * 3 * H : 0;
        const int *act = acts + d * per;
        const T *al = alpha + d * per, *be = beta + d * per;
        /* xw = X @ W^T + biases, rows in X's order; GRU's hidden-gate recurrent bias waits for the step. */
        MT_FN(mt_gemm)(X, w, 0, xw, steps * batch, GH, in, in, 1, 1, in, 0, 0, 1, 0);
        if (Bias)
            for (mt_i i = 0; i < steps * batch; i++)
                for (mt_i j = 0; j < GH; j++)
                    xw[i * GH + j] += wb[j] + (cell == MT_GRU && j >= 2 * H ? (T)0 : rb[j]);
        for (mt_i b = 0; b < batch; b++) {
            const mt_i s0 = layout ? (b * D + d) * H : (d * batch + b) * H; /* this (d, b) in H0, Yh */
            for (mt_i k = 0; k < H; k++) {
                h[b * H + k] = H0 ? H0[s0 + k] : (T)0;
                c[b * H + k] = C0 ? C0[s0 + k] : (T)0;
            }
        }
        for (mt_i s = 0; s < steps; s++) {
            /* The first 2*H columns are GRU's update and reset gates; its hidden gate comes after. */
            const mt_i n = cell == MT_GRU && !linear_before_reset ? 2 * H : GH;
            MT_FN(mt_gemm)(h, r, 0, gates, batch, n, H, H, 1, 1, H, 0, 0, 1, 0);
            if (cell == MT_GRU && !linear_before_reset) {
                for (mt_i b = 0; b < batch; b++)
                    for (mt_i k = 0; k < H; k++) {
                        const mt_i len = lens ? lens[b] : steps, t = back ? len - 1 - s : s;
                        if (s >= len) { /* past the length: nothing reads this row */
                            rh[b * H + k] = 0;
                            continue;
                        }
                        const T *x = xw + (layout ? b * steps + t : t * batch + b) * GH;
                        const T reset = MT_FN(mt_rnn_act)(x[H + k] + gates[b * n + H + k], act[0], al[0], be[0], clip);
                        rh[b * H + k] = reset * h[b * H + k];
                    }
                MT_FN(mt_gemm)(rh, r + 2 * H * H, 0, hh, batch, H, H, H, 1, 1, H, 0, 0, 1, 0);
            }
            for (mt_i b = 0; b < batch; b++) {
                const mt_i len = lens ? lens[b] : steps;
                if (s >= len) {
                    if (Y) /* padding: zeros at the step itself, in either direction */
                        for (mt_i k = 0; k < H; k++)
                            Y[(layout ? (b * steps + s) * D + d : (s * D + d) * batch + b) * H + k] = 0;
                    continue;
                }
                const mt_i t = back ? len - 1 - s : s;
                const T *x = xw + (layout ? b * steps + t : t * batch + b) * GH;
                const T *g = gates + b * n; /* rows n apart, as mt_gemm writes them */
                T *hb = h + b * H, *cb = c + b * H;
                for (mt_i k = 0; k < H; k++) {
                    if (cell == MT_RNN) {
                        hb[k] = MT_FN(mt_rnn_act)(x[k] + g[k], act[0], al[0], be[0], clip);
                    } else if (cell == MT_GRU) {
                        const T z = MT_FN(mt_rnn_act)(x[k] + g[k], act[0], al[0], be[0], clip);
                        T pre;
                        if (linear_before_reset) {
                            const T reset = MT_FN(mt_rnn_act)(x[H + k] + g[H + k], act[0], al[0], be[0], clip);
                            pre = x[2 * H + k] + reset * (g[2 * H + k] + (rb ? rb[2 * H + k] : (T)0));
                        } else {
                            pre = x[2 * H + k] + hh[b * H + k] + (rb ? rb[2 * H + k] : (T)0);
                        }
                        const T cand = MT_FN(mt_rnn_act)(pre, act[1], al[1], be[1], clip);
                        hb[k] = (1 - z) * cand + z * hb[k];
                    } else { /* LSTM: gates i, o, f, c; peepholes P_i, P_o, P_f */
                        T gi = x[k] + g[k], go = x[H + k] + g[H + k];
                        T gf = x[2 * H + k] + g[2 * H + k];
                        const T gc = x[3 * H + k] + g[3 * H + k];
                        if (p) {
                            gi += p[k] * cb[k];
                            gf += p[2 * H + k] * cb[k];
                        }
                        const T i = MT_FN(mt_rnn_act)(gi, act[0], al[0], be[0], clip);
                        const T f = input_forget ? 1 - i : MT_FN(mt_rnn_act)(gf, act[0], al[0], be[0], clip);
                        const T cn = f * cb[k] + i * MT_FN(mt_rnn_act)(gc, act[1], al[1], be[1], clip);
                        if (p) go += p[H + k] * cn;
                        cb[k] = cn;
                        hb[k] = MT_FN(mt_rnn_act)(go, act[0], al[0], be[0], clip) *
                                MT_FN(mt_rnn_act)(cn, act[2], al[2], be[2], (T)-1);
                    }
                }
                if (Y)
                    for (mt_i k = 0; k < H; k++)
                        Y[(layout ? (b * steps + t) * D + d : (t * D + d) * batch + b) * H + k] = hb[k];
            }
        }
        for (mt_i b = 0; b < batch; b++) {
            const mt_i s0 = layout ? (b * D + d) * H : (d * batch + b) * H;
            for (mt_i k = 0; k < H; k++) {
                if (Yh) Yh[s0 + k] = h[b * H + k];
                if (Yc) Yc[s0 + k] = c[b * H + k];
            }
        }
    }
    return 0;
}

#endif /* MT_RECURRENT_T */
