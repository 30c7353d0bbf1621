/* Signal, contraction and detection kernels: Einsum, DFT, STFT, Col2Im, DeformConv, RoiAlign and
 * NonMaxSuppression (see mithril/backends/c/ops/signal.py).
 *
 * The rest of this file is a template, included again per element type T with MT_SFX and
 * MT_SIG_K (0 float, 1 signed, 2 unsigned) defined, as mt_rowwise.h does, in two parts: first the
 * FFT and the DFT and STFT line drivers per float type (MT_SIG_PART 1; ops/signal.py calls the
 * precision NumPy computes in, whatever the data's type), then the kernels per element type
 * (MT_SIG_PART 2). Einsum and Col2Im exist for every number; the others for float types only.
 *
 * Kernels whose geometry comes partly at run time (DFT's axis and dft_length, STFT's frame step,
 * Col2Im's block shape, RoiAlign's batch indices, NonMaxSuppression's count) return nonzero when
 * the values do not give the shapes the model was compiled for.
 */
#ifndef MT_SIGNAL_T
#ifndef MT_SIGNAL_H
#define MT_SIGNAL_H

#include "mt_base.h"
#include "mt_gemm.h" /* Einsum's contractions and DeformConv are GEMMs; mt_threads */

#ifdef _OPENMP
#define MT_SIG_THREAD omp_get_thread_num()
#else
#define MT_SIG_THREAD 0
#endif

#define MT_EIN_MAXOPS 8   /* Einsum operands one call takes */
#define MT_EIN_MAXDIMS 32 /* Einsum summed dims */
#define MT_COL_MAXDIMS 8  /* Col2Im spatial axes */
#define MT_ROI_CB 64      /* RoiAlign channels that share one pass over a bin's sample points */
#define MT_FFT_MAXF 64    /* factors of an FFT length */

/* ---- The FFT: pocketfft's complex transform (the C++ header NumPy and SciPy ship), following its
 * operations so that results round as NumPy's do, to an ulp or two (an inverse DFT's near-zero
 * outputs are NumPy's rounding): the length in factors 8, 4, 2, 3, 5, 7, 11 and larger primes
 * (FFTPACK's passes), or Bluestein's algorithm over a good length when a large prime factor makes
 * that cheaper. NumPy runs a forward transform of float32 data in double (its scale, the integer 1,
 * picks the double loop) and an inverse in float32 (its scale 1/n is a float32); ops/signal.py
 * calls the same. What the plan and the passes share, over every float type: ---------------------- */

/* pocketfft's util::largest_prime_factor, cost_guess and good_size_cmplx. */
static inline mt_i mt_fft_largest_prime(mt_i n) {
    mt_i res = 1;
    while ((n & 1) == 0) res = 2, n >>= 1;
    for (mt_i x = 3; x * x <= n; x += 2)
        while (n % x == 0) res = x, n /= x;
    return n > 1 ? n : res;
}

static inline double mt_fft_cost(mt_i n) {
    const double lfp = 1.1; /* penalty for the generic pass of larger primes */
    const mt_i ni = n;
    double result = 0;
    while ((n & 1) == 0) result += 2, n >>= 1;
    for (mt_i x = 3; x * x <= n; x += 2)
        while (n % x == 0) result += x <= 5 ? (double)x : lfp * (double)x, n /= x;
    if (n > 1) result += n <= 5 ? (double)n : lfp * (double)n;
    return result * (double)ni;
}

static inline mt_i mt_fft_good_size(mt_i n) { /* the smallest 2^a 3^b 5^c 7^d 11^e >= n */
    if (n <= 12) return n;
    mt_i best = 2 * n;
    for (mt_i f11 = 1; f11 < best; f11 *= 11)
        for (mt_i f117 = f11; f117 < best; f117 *= 7)
            for (mt_i f1175 = f117; f1175 < best; f1175 *= 5) {
                mt_i x = f1175;
                while (x < n) x *= 2;
                for (;;) {
                    if (x < n)
                        x *= 3;
                    else if (x > n) {
                        if (x < best) best = x;
                        if (x & 1) break;
                        x >>= 1;
                    } else
                        return n;
                }
            }
    return best;
}

/* Whether a transform of length n runs as Bluestein's (pocketfft_c's choice). */
static inline int mt_fft_bluestein(mt_i n) {
    const mt_i p = n < 50 ? 0 : mt_fft_largest_prime(n);
    if (p * p <= n) return 0;
    return 1.5 * 2 * mt_fft_cost(mt_fft_good_size(2 * n - 1)) < mt_fft_cost(n);
}

/* The factors of n in the order the passes take them; their count. */
static inline int mt_fft_factors(mt_i n, mt_i *f) {
    int k = 0;
    while ((n & 7) == 0) f[k++] = 8, n >>= 3;
    while ((n & 3) == 0) f[k++] = 4, n >>= 2;
    if ((n & 1) == 0) { /* a factor 2 goes first */
        n >>= 1;
        f[k++] = 2;
        const mt_i t = f[0];
        f[0] = f[k - 1], f[k - 1] = t;
    }
    for (mt_i d = 3; d * d <= n; d += 2)
        while (n % d == 0) f[k++] = d, n /= d;
    if (n > 1) f[k++] = n;
    return k;
}

/* Complex twiddles of the FFTPACK plan of length n (cfftp::twsize). */
static inline mt_i mt_fft_twsize(mt_i n) {
    mt_i f[MT_FFT_MAXF], size = 0, l1 = 1;
    const int k = n > 1 ? mt_fft_factors(n, f) : 0;
    for (int j = 0; j < k; j++) {
        const mt_i ip = f[j], ido = n / (l1 * ip);
        size += (ip - 1) * (ido - 1) + (ip > 11 ? ip : 0);
        l1 *= ip;
    }
    return size;
}

/* Complex values of a plan of length n; of one line's buffers (its values and the passes' other
 * buffer, or Bluestein's two). ops/signal.py mirrors both to size the scratch. */
static inline mt_i mt_fft_plan_size(mt_i n) {
    if (!mt_fft_bluestein(n)) return mt_fft_twsize(n);
    const mt_i n2 = mt_fft_good_size(2 * n - 1);
    return mt_fft_twsize(n2) + n + n2 / 2 + 1;
}

static inline mt_i mt_fft_line_size(mt_i n) {
    return n + (mt_fft_bluestein(n) ? 2 * mt_fft_good_size(2 * n - 1) : n);
}

/* exp(2 pi i idx / n) as pocketfft's sincos_2pibyn gives it: the product of two table entries,
 * each a cosine and sine of at most an eighth of a turn, in double. */
typedef struct {
    mt_i n, mask, shift;
    double ang;
} mt_sincos;

static inline mt_sincos mt_sincos_make(mt_i n) {
    mt_sincos s;
    s.n = n;
    s.ang = (double)(0.25L * 3.141592653589793238462643383279502884197L / (long double)n);
    const mt_i nval = (n + 2) / 2;
    s.shift = 1;
    while (((mt_i)1 << s.shift) * ((mt_i)1 << s.shift) < nval) s.shift++;
    s.mask = ((mt_i)1 << s.shift) - 1;
    return s;
}

static inline void mt_sincos_calc(mt_i x, mt_i n, double ang, double *re, double *im) {
    x <<= 3;
    if (x < 4 * n) {
        if (x < 2 * n) {
            if (x < n) *re = cos((double)x * ang), *im = sin((double)x * ang);
            else *re = sin((double)(2 * n - x) * ang), *im = cos((double)(2 * n - x) * ang);
        } else {
            x -= 2 * n;
            if (x < n) *re = -sin((double)x * ang), *im = cos((double)x * ang);
            else *re = -cos((double)(2 * n - x) * ang), *im = sin((double)(2 * n - x) * ang);
        }
    } else {
        x = 8 * n - x;
        if (x < 2 * n) {
            if (x < n) *re = cos((double)x * ang), *im = -sin((double)x * ang);
            else *re = sin((double)(2 * n - x) * ang), *im = -cos((double)(2 * n - x) * ang);
        } else {
            x -= 2 * n;
            if (x < n) *re = -sin((double)x * ang), *im = -cos((double)x * ang);
            else *re = -cos((double)(2 * n - x) * ang), *im = -sin((double)(2 * n - x) * ang);
        }
    }
}

/* The twiddle idx of the table (re, im in double; the caller rounds each to its type). */
static inline void mt_sincos_at(const mt_sincos *s, mt_i idx, double *re, double *im) {
    const int conj = 2 * idx > s->n;
    if (conj) idx = s->n - idx;
    double ar, ai, br, bi;
    mt_sincos_calc(idx & s->mask, s->n, s->ang, &ar, &ai);
    mt_sincos_calc((idx >> s->shift) * (s->mask + 1), s->n, s->ang, &br, &bi);
    *re = ar * br - ai * bi;
    *im = ar * bi + ai * br;
    if (conj) *im = -*im; /* pocketfft negates after rounding; negation is exact either way */
}

/* The threads a transform over `lines` lines may use: each needs its own line buffers (`per`
 * bytes), and `cap` bytes of scratch hold the plan (`plan` bytes) and as many of those as fit.
 * 0: not even one fits. */
static inline mt_i mt_fft_slots(mt_i plan, mt_i per, mt_i lines, mt_i work, mt_i cap) {
    const mt_i room = cap - plan;
    mt_i slots = room < per ? 0 : room / per, threads = work > 4096 ? mt_threads() : 1;
    if (slots > threads) slots = threads;
    if (slots > lines && lines > 0) slots = lines;
    return slots;
}

/* ---- DFT's and STFT's geometry from their (possibly run-time) arguments, shared by every type:
 * the generated code checks it, then calls the line driver of the precision NumPy computes in
 * (mt_dft_lines_f32 or _f64; see the FFT's comment), so that only that FFT is compiled. */
typedef struct {
    mt_i L, n, inner, lines, cin, nout, cout;
    int inverse, irfft;
} mt_dft_geom;

/* The DFT along `axis` of an input of rank dims xs (the last the real/imaginary pair of 1 or 2): n
 * the transform length (< 0: the default), forward or inverse (scaled by 1/n), one-sided (the
 * first n/2 + 1 bins; inverse: a real signal from them, as irfft). Nonzero when axis and n do not
 * give the output ys. */
static inline int mt_dft_geometry(int rank, const mt_i *xs, const mt_i *ys, mt_i axis, mt_i n, int inverse,
                                  int onesided, mt_dft_geom *g) {
    if (axis < 0) axis += rank;
    if (axis < 0 || axis > rank - 2) return 1;
    g->L = xs[axis], g->cin = xs[rank - 1], g->inverse = inverse, g->irfft = inverse && onesided;
    if (n < 0) n = g->irfft ? 2 * (g->L - 1) : g->L;
    if (n < 1) return 1;
    g->n = n, g->nout = g->irfft || !onesided ? n : n / 2 + 1, g->cout = g->irfft ? 1 : 2;
    mt_i outer = 1;
    g->inner = 1;
    for (int d = 0; d < rank - 1; d++) {
        if (ys[d] != (d == axis ? g->nout : xs[d])) return 1;
        if (d < axis) outer *= xs[d];
        if (d > axis) g->inner *= xs[d];
    }
    g->lines = outer * g->inner;
    return ys[rank - 1] != g->cout;
}

/* STFT of [B, L, 1|2] signals in frames of n (< 0: the window's length wlen, or L without one)
 * `step` apart: the frame length, or 0 when step and n do not give `frames` frames of `bins` bins
 * or the window's length. */
static inline mt_i mt_stft_length(mt_i L, mt_i step, mt_i n, mt_i wlen, mt_i frames, mt_i bins, int onesided) {
    if (n < 0) n = wlen >= 0 ? wlen : L;
    if ((wlen >= 0 && wlen != n) || n < 1 || n > L || step < 1) return 0;
    if ((L - n) / step + 1 != frames || (onesided ? n / 2 + 1 : n) != bins) return 0;
    return n;
}

#define MT_SIGNAL_T

#define MT_SIG_PART 1
#define MT_SIG_K 0
#define T float
#define MT_SFX f32
#include "mt_signal.h"
#undef T
#undef MT_SFX
#define T double
#define MT_SFX f64
#include "mt_signal.h"
#undef T
#undef MT_SFX
#undef MT_SIG_K
#undef MT_SIG_PART

#define MT_SIG_PART 2

#define T float
#define MT_SFX f32
#define MT_SIG_K 0
#include "mt_signal.h"
#undef T
#undef MT_SFX
#undef MT_SIG_K

#define T double
#define MT_SFX f64
#define MT_SIG_K 0
#include "mt_signal.h"
#undef T
#undef MT_SFX
#undef MT_SIG_K

#define T int8_t
#define MT_SFX i8
#define MT_SIG_K 1
#include "mt_signal.h"
#undef T
#undef MT_SFX
#undef MT_SIG_K

#define T int16_t
#define MT_SFX i16
#define MT_SIG_K 1
#include "mt_signal.h"
#undef T
#undef MT_SFX
#undef MT_SIG_K

#define T int32_t
#define MT_SFX i32
#define MT_SIG_K 1
#include "mt_signal.h"
#undef T
#undef MT_SFX
#undef MT_SIG_K

#define T int64_t
#define MT_SFX i64
#define MT_SIG_K 1
#include "mt_signal.h"
#undef T
#undef MT_SFX
#undef MT_SIG_K

#define T uint8_t
#define MT_SFX u8
#define MT_SIG_K 2
#include "mt_signal.h"
#undef T
#undef MT_SFX
#undef MT_SIG_K

#define T uint16_t
#define MT_SFX u16
#define MT_SIG_K 2
#include "mt_signal.h"
#undef T
#undef MT_SFX
#undef MT_SIG_K

#define T uint32_t
#define MT_SFX u32
#define MT_SIG_K 2
#include "mt_signal.h"
#undef T
#undef MT_SFX
#undef MT_SIG_K

#define T uint64_t
#define MT_SFX u64
#define MT_SIG_K 2
#include "mt_signal.h"
#undef T
#undef MT_SFX
#undef MT_SIG_K

#undef MT_SIG_PART
#undef MT_SIGNAL_T
#endif /* MT_SIGNAL_H */

#else /* ---- the template ------------------------------------------------------------------- */
#if MT_SIG_PART == 1
/* ---- Part 1: pocketfft's complex FFT over T (cfftp, fftblue and pocketfft_c's choice between
 * them). Complex values are T pairs; `fwd` picks the direction (the inverse is unnormalized: the
 * caller's fct scales it). */

typedef struct {
    T r, i;
} MT_FN(mt_cx);
#define MT_CX MT_FN(mt_cx)

MT_INNER MT_CX MT_FN(mt_cx_add)(MT_CX a, MT_CX b) {
    MT_CX c = {a.r + b.r, a.i + b.i};
    return c;
}
MT_INNER MT_CX MT_FN(mt_cx_sub)(MT_CX a, MT_CX b) {
    MT_CX c = {a.r - b.r, a.i - b.i};
    return c;
}
MT_INNER MT_CX MT_FN(mt_cx_scale)(MT_CX a, T s) {
    MT_CX c = {a.r * s, a.i * s};
    return c;
}
/* v times w (forward: times conj(w)) */
MT_INNER MT_CX MT_FN(mt_cx_mul)(MT_CX v, MT_CX w, int fwd) {
    MT_CX c;
    if (fwd) c.r = v.r * w.r + v.i * w.i, c.i = v.i * w.r - v.r * w.i;
    else c.r = v.r * w.r - v.i * w.i, c.i = v.r * w.i + v.i * w.r;
    return c;
}
MT_INNER void MT_FN(mt_cx_rot90)(MT_CX *a, int fwd) {
    const T t = fwd ? -a->r : a->r;
    a->r = fwd ? a->i : -a->i;
    a->i = t;
}
#define MT_ADD MT_FN(mt_cx_add)
#define MT_SUB MT_FN(mt_cx_sub)
#define MT_SCALE MT_FN(mt_cx_scale)
#define MT_MUL MT_FN(mt_cx_mul)
#define MT_PM(a, b, c, d)                                                                              \
    do {                                                                                               \
        const MT_CX pc_ = (c), pd_ = (d);                                                              \
        (a) = MT_ADD(pc_, pd_), (b) = MT_SUB(pc_, pd_);                                                \
    } while (0)
#define MT_PMIN(a, b) do { const MT_CX pt_ = (a); (a) = MT_ADD((a), (b)); (b) = MT_SUB(pt_, (b)); } while (0)
#define MT_ROT90(a) MT_FN(mt_cx_rot90)(&(a), fwd)
/* The passes' views (pocketfft's lambdas): CC(a, b, c) reads cc of cdim, CH(a, b, c) writes ch, WA twiddles */
#define CH(a, b, c) ch[(a) + ido * ((b) + l1 * (c))]
#define CC(a, b, c) cc[(a) + ido * ((b) + cdim * (c))]
#define WA(x, i) wa[(i) - 1 + (x) * (ido - 1)]

/* An FFTPACK plan: the factors and each one's twiddles in `mem`. */
typedef struct {
    mt_i n;
    int nf;
    mt_i f[MT_FFT_MAXF];
    const MT_CX *tw[MT_FFT_MAXF], *tws[MT_FFT_MAXF];
} MT_FN(mt_cfftp);

static inline void MT_FN(mt_pass2)(mt_i ido, mt_i l1, const MT_CX *restrict cc, MT_CX *restrict ch,
                                   const MT_CX *restrict wa, int fwd) {
    const mt_i cdim = 2;
    for (mt_i k = 0; k < l1; k++) {
        CH(0, k, 0) = MT_ADD(CC(0, 0, k), CC(0, 1, k));
        CH(0, k, 1) = MT_SUB(CC(0, 0, k), CC(0, 1, k));
        for (mt_i i = 1; i < ido; i++) {
            CH(i, k, 0) = MT_ADD(CC(i, 0, k), CC(i, 1, k));
            CH(i, k, 1) = MT_MUL(MT_SUB(CC(i, 0, k), CC(i, 1, k)), WA(0, i), fwd);
        }
    }
}

static inline void MT_FN(mt_pass3)(mt_i ido, mt_i l1, const MT_CX *restrict cc, MT_CX *restrict ch,
                                   const MT_CX *restrict wa, int fwd) {
    const mt_i cdim = 3;
    const T twr = (T)-0.5, twi = (fwd ? -1 : 1) * (T)0.8660254037844386467637231707529362L;
    for (mt_i k = 0; k < l1; k++)
        for (mt_i i = 0; i < ido; i++) {
            const MT_CX t0 = CC(i, 0, k);
            MT_CX t1, t2;
            MT_PM(t1, t2, CC(i, 1, k), CC(i, 2, k));
            CH(i, k, 0) = MT_ADD(t0, t1);
            const MT_CX ca = MT_ADD(t0, MT_SCALE(t1, twr)), cb = {-t2.i * twi, t2.r * twi};
            if (i == 0) {
                MT_PM(CH(0, k, 1), CH(0, k, 2), ca, cb);
            } else {
                CH(i, k, 1) = MT_MUL(MT_ADD(ca, cb), WA(0, i), fwd);
                CH(i, k, 2) = MT_MUL(MT_SUB(ca, cb), WA(1, i), fwd);
            }
        }
}

static inline void MT_FN(mt_pass4)(mt_i ido, mt_i l1, const MT_CX *restrict cc, MT_CX *restrict ch,
                                   const MT_CX *restrict wa, int fwd) {
    const mt_i cdim = 4;
    for (mt_i k = 0; k < l1; k++) {
        {
            MT_CX t1, t2, t3, t4;
            MT_PM(t2, t1, CC(0, 0, k), CC(0, 2, k));
            MT_PM(t3, t4, CC(0, 1, k), CC(0, 3, k));
            MT_ROT90(t4);
            MT_PM(CH(0, k, 0), CH(0, k, 2), t2, t3);
            MT_PM(CH(0, k, 1), CH(0, k, 3), t1, t4);
        }
        for (mt_i i = 1; i < ido; i++) {
            MT_CX t1, t2, t3, t4;
            const MT_CX c0 = CC(i, 0, k), c1 = CC(i, 1, k), c2 = CC(i, 2, k), c3 = CC(i, 3, k);
            MT_PM(t2, t1, c0, c2);
            MT_PM(t3, t4, c1, c3);
            MT_ROT90(t4);
            CH(i, k, 0) = MT_ADD(t2, t3);
            CH(i, k, 1) = MT_MUL(MT_ADD(t1, t4), WA(0, i), fwd);
            CH(i, k, 2) = MT_MUL(MT_SUB(t2, t3), WA(1, i), fwd);
            CH(i, k, 3) = MT_MUL(MT_SUB(t1, t4), WA(2, i), fwd);
        }
    }
}

static inline void MT_FN(mt_pass5)(mt_i ido, mt_i l1, const MT_CX *restrict cc, MT_CX *restrict ch,
                                   const MT_CX *restrict wa, int fwd) {
    const mt_i cdim = 5;
    const T s = fwd ? -1 : 1;
    const T tw1r = (T)0.3090169943749474241022934171828191L, tw1i = s * (T)0.9510565162951535721164393333793821L;
    const T tw2r = (T)-0.8090169943749474241022934171828191L, tw2i = s * (T)0.5877852522924731291687059546390728L;
    /* (u1, u2) with the real and imaginary twiddles of t1, t2 and of t4, t3 */
    const mt_i u[2][2] = {{1, 4}, {2, 3}};
    const T xr[2][2] = {{tw1r, tw2r}, {tw2r, tw1r}}, yi[2][2] = {{tw1i, tw2i}, {tw2i, -tw1i}};
    for (mt_i k = 0; k < l1; k++)
        for (mt_i i = 0; i < ido; i++) {
            const MT_CX t0 = CC(i, 0, k);
            MT_CX t1, t2, t3, t4;
            MT_PM(t1, t4, CC(i, 1, k), CC(i, 4, k));
            MT_PM(t2, t3, CC(i, 2, k), CC(i, 3, k));
            CH(i, k, 0).r = t0.r + t1.r + t2.r;
            CH(i, k, 0).i = t0.i + t1.i + t2.i;
            for (int p = 0; p < 2; p++) {
                MT_CX ca, cb;
                ca.r = t0.r + xr[p][0] * t1.r + xr[p][1] * t2.r;
                ca.i = t0.i + xr[p][0] * t1.i + xr[p][1] * t2.i;
                cb.i = yi[p][0] * t4.r + yi[p][1] * t3.r;
                cb.r = -(yi[p][0] * t4.i + yi[p][1] * t3.i);
                if (i == 0) {
                    MT_PM(CH(0, k, u[p][0]), CH(0, k, u[p][1]), ca, cb);
                } else {
                    CH(i, k, u[p][0]) = MT_MUL(MT_ADD(ca, cb), WA(u[p][0] - 1, i), fwd);
                    CH(i, k, u[p][1]) = MT_MUL(MT_SUB(ca, cb), WA(u[p][1] - 1, i), fwd);
                }
            }
        }
}

static inline void MT_FN(mt_pass7)(mt_i ido, mt_i l1, const MT_CX *restrict cc, MT_CX *restrict ch,
                                   const MT_CX *restrict wa, int fwd) {
    const mt_i cdim = 7;
    const T s = fwd ? -1 : 1;
    const T tw1r = (T)0.6234898018587335305250048840042398L, tw1i = s * (T)0.7818314824680298087084445266740578L;
    const T tw2r = (T)-0.2225209339563144042889025644967948L, tw2i = s * (T)0.9749279121818236070181316829939312L;
    const T tw3r = (T)-0.9009688679024191262361023195074451L, tw3i = s * (T)0.433883739117558120475768332848359L;
    const mt_i u[3][2] = {{1, 6}, {2, 5}, {3, 4}};
    const T xr[3][3] = {{tw1r, tw2r, tw3r}, {tw2r, tw3r, tw1r}, {tw3r, tw1r, tw2r}};
    const T yi[3][3] = {{tw1i, tw2i, tw3i}, {tw2i, -tw3i, -tw1i}, {tw3i, -tw1i, tw2i}};
    for (mt_i k = 0; k < l1; k++)
        for (mt_i i = 0; i < ido; i++) {
            const MT_CX t1 = CC(i, 0, k);
            MT_CX t2, t3, t4, t5, t6, t7;
            MT_PM(t2, t7, CC(i, 1, k), CC(i, 6, k));
            MT_PM(t3, t6, CC(i, 2, k), CC(i, 5, k));
            MT_PM(t4, t5, CC(i, 3, k), CC(i, 4, k));
            CH(i, k, 0).r = t1.r + t2.r + t3.r + t4.r;
            CH(i, k, 0).i = t1.i + t2.i + t3.i + t4.i;
            for (int p = 0; p < 3; p++) {
                MT_CX ca, cb, da, db;
                ca.r = t1.r + xr[p][0] * t2.r + xr[p][1] * t3.r + xr[p][2] * t4.r;
                ca.i = t1.i + xr[p][0] * t2.i + xr[p][1] * t3.i + xr[p][2] * t4.i;
                cb.i = yi[p][0] * t7.r + yi[p][1] * t6.r + yi[p][2] * t5.r;
                cb.r = -(yi[p][0] * t7.i + yi[p][1] * t6.i + yi[p][2] * t5.i);
                MT_PM(da, db, ca, cb);
                if (i == 0) {
                    CH(0, k, u[p][0]) = da, CH(0, k, u[p][1]) = db;
                } else {
                    CH(i, k, u[p][0]) = MT_MUL(da, WA(u[p][0] - 1, i), fwd);
                    CH(i, k, u[p][1]) = MT_MUL(db, WA(u[p][1] - 1, i), fwd);
                }
            }
        }
}

MT_INNER void MT_FN(mt_rot45)(MT_CX *a, int fwd) {
    const T h = (T)0.707106781186547524400844362104849L, t = a->r;
    if (fwd) a->r = h * (a->r + a->i), a->i = h * (a->i - t);
    else a->r = h * (a->r - a->i), a->i = h * (a->i + t);
}
MT_INNER void MT_FN(mt_rot135)(MT_CX *a, int fwd) {
    const T h = (T)0.707106781186547524400844362104849L, t = a->r;
    if (fwd) a->r = h * (a->i - a->r), a->i = h * (-t - a->i);
    else a->r = h * (-a->r - a->i), a->i = h * (t - a->i);
}

static inline void MT_FN(mt_pass8)(mt_i ido, mt_i l1, const MT_CX *restrict cc, MT_CX *restrict ch,
                                   const MT_CX *restrict wa, int fwd) {
    const mt_i cdim = 8;
    for (mt_i k = 0; k < l1; k++) {
        {
            MT_CX a0, a1, a2, a3, a4, a5, a6, a7;
            MT_PM(a1, a5, CC(0, 1, k), CC(0, 5, k));
            MT_PM(a3, a7, CC(0, 3, k), CC(0, 7, k));
            MT_PMIN(a1, a3);
            MT_ROT90(a3);
            MT_ROT90(a7);
            MT_PMIN(a5, a7);
            MT_FN(mt_rot45)(&a5, fwd);
            MT_FN(mt_rot135)(&a7, fwd);
            MT_PM(a0, a4, CC(0, 0, k), CC(0, 4, k));
            MT_PM(a2, a6, CC(0, 2, k), CC(0, 6, k));
            MT_PM(CH(0, k, 0), CH(0, k, 4), MT_ADD(a0, a2), a1);
            MT_PM(CH(0, k, 2), CH(0, k, 6), MT_SUB(a0, a2), a3);
            MT_ROT90(a6);
            MT_PM(CH(0, k, 1), CH(0, k, 5), MT_ADD(a4, a6), a5);
            MT_PM(CH(0, k, 3), CH(0, k, 7), MT_SUB(a4, a6), a7);
        }
        for (mt_i i = 1; i < ido; i++) {
            MT_CX a0, a1, a2, a3, a4, a5, a6, a7;
            MT_PM(a1, a5, CC(i, 1, k), CC(i, 5, k));
            MT_PM(a3, a7, CC(i, 3, k), CC(i, 7, k));
            MT_ROT90(a7);
            MT_PMIN(a1, a3);
            MT_ROT90(a3);
            MT_PMIN(a5, a7);
            MT_FN(mt_rot45)(&a5, fwd);
            MT_FN(mt_rot135)(&a7, fwd);
            MT_PM(a0, a4, CC(i, 0, k), CC(i, 4, k));
            MT_PM(a2, a6, CC(i, 2, k), CC(i, 6, k));
            MT_PMIN(a0, a2);
            CH(i, k, 0) = MT_ADD(a0, a1);
            CH(i, k, 4) = MT_MUL(MT_SUB(a0, a1), WA(3, i), fwd);
            CH(i, k, 2) = MT_MUL(MT_ADD(a2, a3), WA(1, i), fwd);
            CH(i, k, 6) = MT_MUL(MT_SUB(a2, a3), WA(5, i), fwd);
            MT_ROT90(a6);
            MT_PMIN(a4, a6);
            CH(i, k, 1) = MT_MUL(MT_ADD(a4, a5), WA(0, i), fwd);
            CH(i, k, 5) = MT_MUL(MT_SUB(a4, a5), WA(4, i), fwd);
            CH(i, k, 3) = MT_MUL(MT_ADD(a6, a7), WA(2, i), fwd);
            CH(i, k, 7) = MT_MUL(MT_SUB(a6, a7), WA(6, i), fwd);
        }
    }
}

static inline void MT_FN(mt_pass11)(mt_i ido, mt_i l1, const MT_CX *restrict cc, MT_CX *restrict ch,
                                    const MT_CX *restrict wa, int fwd) {
    const mt_i cdim = 11;
    const T s = fwd ? -1 : 1;
    const T w1r = (T)0.8412535328311811688618116489193677L, w1i = s * (T)0.5406408174555975821076359543186917L;
    const T w2r = (T)0.4154150130018864255292741492296232L, w2i = s * (T)0.9096319953545183714117153830790285L;
    const T w3r = (T)-0.1423148382732851404437926686163697L, w3i = s * (T)0.9898214418809327323760920377767188L;
    const T w4r = (T)-0.6548607339452850640569250724662936L, w4i = s * (T)0.7557495743542582837740358439723444L;
    const T w5r = (T)-0.9594929736144973898903680570663277L, w5i = s * (T)0.2817325568414296977114179153466169L;
    const T xr[5][5] = {{w1r, w2r, w3r, w4r, w5r}, {w2r, w4r, w5r, w3r, w1r}, {w3r, w5r, w2r, w1r, w4r},
                        {w4r, w3r, w1r, w5r, w2r}, {w5r, w1r, w4r, w2r, w3r}};
    const T yi[5][5] = {{w1i, w2i, w3i, w4i, w5i}, {w2i, w4i, -w5i, -w3i, -w1i}, {w3i, -w5i, -w2i, w1i, w4i},
                        {w4i, -w3i, w1i, w5i, -w2i}, {w5i, -w1i, w4i, -w2i, w3i}};
    for (mt_i k = 0; k < l1; k++)
        for (mt_i i = 0; i < ido; i++) {
            MT_CX t[12];
            t[1] = CC(i, 0, k);
            for (int j = 1; j <= 5; j++) MT_PM(t[j + 1], t[12 - j], CC(i, j, k), CC(i, 11 - j, k));
            CH(i, k, 0).r = t[1].r + t[2].r + t[3].r + t[4].r + t[5].r + t[6].r;
            CH(i, k, 0).i = t[1].i + t[2].i + t[3].i + t[4].i + t[5].i + t[6].i;
            for (int p = 0; p < 5; p++) {
                MT_CX ca = t[1], cb, da, db;
                for (int j = 0; j < 5; j++) ca = MT_ADD(ca, MT_SCALE(t[j + 2], xr[p][j]));
                cb.i = yi[p][0] * t[11].r + yi[p][1] * t[10].r + yi[p][2] * t[9].r + yi[p][3] * t[8].r +
                       yi[p][4] * t[7].r;
                cb.r = -(yi[p][0] * t[11].i + yi[p][1] * t[10].i + yi[p][2] * t[9].i + yi[p][3] * t[8].i +
                         yi[p][4] * t[7].i);
                MT_PM(da, db, ca, cb);
                if (i == 0) {
                    CH(0, k, p + 1) = da, CH(0, k, 10 - p) = db;
                } else {
                    CH(i, k, p + 1) = MT_MUL(da, WA(p, i), fwd);
                    CH(i, k, 10 - p) = MT_MUL(db, WA(9 - p, i), fwd);
                }
            }
        }
}

/* Any other factor ip (FFTPACK's generic pass): the result lands in cc. */
static inline void MT_FN(mt_passg)(mt_i ido, mt_i ip, mt_i l1, MT_CX *restrict cc, MT_CX *restrict ch,
                                   const MT_CX *restrict wa, const MT_CX *restrict csarr, int fwd) {
    const mt_i cdim = ip, ipph = (ip + 1) / 2, idl1 = ido * l1;
    const T s = fwd ? -1 : 1;
#define CX(a, b, c) cc[(a) + ido * ((b) + l1 * (c))]
#define CX2(a, b) cc[(a) + idl1 * (b)]
#define CH2(a, b) ch[(a) + idl1 * (b)]
#define WAL(j) ((MT_CX){csarr[j].r, s * csarr[j].i})
    for (mt_i k = 0; k < l1; k++)
        for (mt_i i = 0; i < ido; i++) CH(i, k, 0) = CC(i, 0, k);
    for (mt_i j = 1, jc = ip - 1; j < ipph; j++, jc--)
        for (mt_i k = 0; k < l1; k++)
            for (mt_i i = 0; i < ido; i++) MT_PM(CH(i, k, j), CH(i, k, jc), CC(i, j, k), CC(i, jc, k));
    for (mt_i k = 0; k < l1; k++)
        for (mt_i i = 0; i < ido; i++) {
            MT_CX tmp = CH(i, k, 0);
            for (mt_i j = 1; j < ipph; j++) tmp = MT_ADD(tmp, CH(i, k, j));
            CX(i, k, 0) = tmp;
        }
    for (mt_i l = 1, lc = ip - 1; l < ipph; l++, lc--) {
        const MT_CX wl = WAL(l), w2l = WAL(2 * l);
        for (mt_i ik = 0; ik < idl1; ik++) {
            CX2(ik, l).r = CH2(ik, 0).r + wl.r * CH2(ik, 1).r + w2l.r * CH2(ik, 2).r;
            CX2(ik, l).i = CH2(ik, 0).i + wl.r * CH2(ik, 1).i + w2l.r * CH2(ik, 2).i;
            CX2(ik, lc).r = -wl.i * CH2(ik, ip - 1).i - w2l.i * CH2(ik, ip - 2).i;
            CX2(ik, lc).i = wl.i * CH2(ik, ip - 1).r + w2l.i * CH2(ik, ip - 2).r;
        }
        mt_i iwal = 2 * l, j = 3, jc = ip - 3;
        for (; j < ipph - 1; j += 2, jc -= 2) {
            iwal += l;
            if (iwal > ip) iwal -= ip;
            const MT_CX xw = WAL(iwal);
            iwal += l;
            if (iwal > ip) iwal -= ip;
            const MT_CX xw2 = WAL(iwal);
            for (mt_i ik = 0; ik < idl1; ik++) {
                CX2(ik, l).r += CH2(ik, j).r * xw.r + CH2(ik, j + 1).r * xw2.r;
                CX2(ik, l).i += CH2(ik, j).i * xw.r + CH2(ik, j + 1).i * xw2.r;
                CX2(ik, lc).r -= CH2(ik, jc).i * xw.i + CH2(ik, jc - 1).i * xw2.i;
                CX2(ik, lc).i += CH2(ik, jc).r * xw.i + CH2(ik, jc - 1).r * xw2.i;
            }
        }
        for (; j < ipph; j++, jc--) {
            iwal += l;
            if (iwal > ip) iwal -= ip;
            const MT_CX xw = WAL(iwal);
            for (mt_i ik = 0; ik < idl1; ik++) {
                CX2(ik, l).r += CH2(ik, j).r * xw.r;
                CX2(ik, l).i += CH2(ik, j).i * xw.r;
                CX2(ik, lc).r -= CH2(ik, jc).i * xw.i;
                CX2(ik, lc).i += CH2(ik, jc).r * xw.i;
            }
        }
    }
    if (ido == 1) /* shuffling and twiddling */
        for (mt_i j = 1, jc = ip - 1; j < ipph; j++, jc--)
            for (mt_i ik = 0; ik < idl1; ik++) {
                const MT_CX t1 = CX2(ik, j), t2 = CX2(ik, jc);
                MT_PM(CX2(ik, j), CX2(ik, jc), t1, t2);
            }
    else
        for (mt_i j = 1, jc = ip - 1; j < ipph; j++, jc--)
            for (mt_i k = 0; k < l1; k++) {
                const MT_CX t1 = CX(0, k, j), t2 = CX(0, k, jc);
                MT_PM(CX(0, k, j), CX(0, k, jc), t1, t2);
                for (mt_i i = 1; i < ido; i++) {
                    MT_CX x1, x2;
                    MT_PM(x1, x2, CX(i, k, j), CX(i, k, jc));
                    CX(i, k, j) = MT_MUL(x1, wa[(j - 1) * (ido - 1) + i - 1], fwd);
                    CX(i, k, jc) = MT_MUL(x2, wa[(jc - 1) * (ido - 1) + i - 1], fwd);
                }
            }
#undef CX
#undef CX2
#undef CH2
#undef WAL
}

/* Fills the plan of length n: its factors and twiddles (mt_fft_twsize(n) values at mem). */
static inline void MT_FN(mt_cfftp_make)(MT_FN(mt_cfftp) *p, mt_i n, MT_CX *mem) {
    p->n = n;
    p->nf = n > 1 ? mt_fft_factors(n, p->f) : 0;
    const mt_sincos sc = mt_sincos_make(n);
    mt_i l1 = 1, at = 0;
    for (int k = 0; k < p->nf; k++) {
        const mt_i ip = p->f[k], ido = n / (l1 * ip);
        MT_CX *tw = mem + at;
        p->tw[k] = tw;
        at += (ip - 1) * (ido - 1);
        for (mt_i j = 1; j < ip; j++)
            for (mt_i i = 1; i < ido; i++) {
                double re, im;
                mt_sincos_at(&sc, j * l1 * i, &re, &im);
                tw[(j - 1) * (ido - 1) + i - 1].r = (T)re, tw[(j - 1) * (ido - 1) + i - 1].i = (T)im;
            }
        p->tws[k] = 0;
        if (ip > 11) {
            MT_CX *tws = mem + at;
            p->tws[k] = tws;
            at += ip;
            for (mt_i j = 0; j < ip; j++) {
                double re, im;
                mt_sincos_at(&sc, j * l1 * ido, &re, &im);
                tws[j].r = (T)re, tws[j].i = (T)im;
            }
        }
        l1 *= ip;
    }
}

/* c = the transform of c, times fct; ch holds n values of work. */
static inline void MT_FN(mt_cfftp_exec)(const MT_FN(mt_cfftp) *p, MT_CX *c, MT_CX *ch, T fct, int fwd) {
    const mt_i n = p->n;
    if (n == 1) {
        c[0] = MT_SCALE(c[0], fct);
        return;
    }
    MT_CX *p1 = c, *p2 = ch;
    mt_i l1 = 1;
    for (int k = 0; k < p->nf; k++) {
        const mt_i ip = p->f[k], ido = n / (l1 * ip);
        MT_CX *t;
        if (ip == 4) MT_FN(mt_pass4)(ido, l1, p1, p2, p->tw[k], fwd);
        else if (ip == 8) MT_FN(mt_pass8)(ido, l1, p1, p2, p->tw[k], fwd);
        else if (ip == 2) MT_FN(mt_pass2)(ido, l1, p1, p2, p->tw[k], fwd);
        else if (ip == 3) MT_FN(mt_pass3)(ido, l1, p1, p2, p->tw[k], fwd);
        else if (ip == 5) MT_FN(mt_pass5)(ido, l1, p1, p2, p->tw[k], fwd);
        else if (ip == 7) MT_FN(mt_pass7)(ido, l1, p1, p2, p->tw[k], fwd);
        else if (ip == 11) MT_FN(mt_pass11)(ido, l1, p1, p2, p->tw[k], fwd);
        else {
            MT_FN(mt_passg)(ido, ip, l1, p1, p2, p->tw[k], p->tws[k], fwd);
            t = p1, p1 = p2, p2 = t;
        }
        t = p1, p1 = p2, p2 = t;
        l1 *= ip;
    }
    if (p1 != c) {
        if (fct != 1)
            for (mt_i i = 0; i < n; i++) c[i] = MT_SCALE(p1[i], fct);
        else
            memcpy(c, p1, (size_t)n * sizeof(MT_CX));
    } else if (fct != 1)
        for (mt_i i = 0; i < n; i++) c[i] = MT_SCALE(c[i], fct);
}

/* A transform of length n: FFTPACK's, or Bluestein's over the FFTPACK plan of length n2 with the
 * chirp bk[n] and its transform bkf[n2 / 2 + 1]. */
typedef struct {
    mt_i n, n2;
    int blue;
    MT_FN(mt_cfftp) plan;
    MT_CX *bk, *bkf;
} MT_FN(mt_fft);

/* Fills the plan in mem (mt_fft_plan_size(n) values); tmp: 2 * n2 values of work (Bluestein). */
static inline void MT_FN(mt_fft_make)(MT_FN(mt_fft) *f, mt_i n, MT_CX *mem, MT_CX *tmp) {
    f->n = n, f->blue = mt_fft_bluestein(n), f->n2 = f->blue ? mt_fft_good_size(2 * n - 1) : n;
    MT_FN(mt_cfftp_make)(&f->plan, f->n2, mem);
    if (!f->blue) return;
    const mt_i n2 = f->n2;
    f->bk = mem + mt_fft_twsize(n2), f->bkf = f->bk + n;
    const mt_sincos sc = mt_sincos_make(2 * n);
    f->bk[0].r = 1, f->bk[0].i = 0;
    for (mt_i m = 1, coeff = 0; m < n; m++) {
        coeff += 2 * m - 1;
        if (coeff >= 2 * n) coeff -= 2 * n;
        double re, im;
        mt_sincos_at(&sc, coeff, &re, &im);
        f->bk[m].r = (T)re, f->bk[m].i = (T)im;
    }
    MT_CX *tbkf = tmp, *ch = tmp + n2;
    const T xn2 = (T)1 / (T)n2;
    tbkf[0] = MT_SCALE(f->bk[0], xn2);
    for (mt_i m = 1; m < n; m++) tbkf[m] = tbkf[n2 - m] = MT_SCALE(f->bk[m], xn2);
    for (mt_i m = n; m <= n2 - n; m++) tbkf[m].r = 0, tbkf[m].i = 0;
    MT_FN(mt_cfftp_exec)(&f->plan, tbkf, ch, (T)1, 1);
    for (mt_i i = 0; i < n2 / 2 + 1; i++) f->bkf[i] = tbkf[i];
}

/* c = the transform of c times fct; work holds mt_fft_line_size(n) - n values. */
static inline void MT_FN(mt_fft_exec)(const MT_FN(mt_fft) *f, MT_CX *c, MT_CX *work, T fct, int fwd) {
    if (!f->blue) {
        MT_FN(mt_cfftp_exec)(&f->plan, c, work, fct, fwd);
        return;
    }
    const mt_i n = f->n, n2 = f->n2;
    MT_CX *akf = work, *ch = work + n2;
    for (mt_i m = 0; m < n; m++) akf[m] = MT_MUL(c[m], f->bk[m], fwd);
    const MT_CX zero = MT_SCALE(akf[0], (T)0);
    for (mt_i m = n; m < n2; m++) akf[m] = zero;
    MT_FN(mt_cfftp_exec)(&f->plan, akf, ch, (T)1, 1);
    akf[0] = MT_MUL(akf[0], f->bkf[0], !fwd);
    for (mt_i m = 1; m < (n2 + 1) / 2; m++) {
        akf[m] = MT_MUL(akf[m], f->bkf[m], !fwd);
        akf[n2 - m] = MT_MUL(akf[n2 - m], f->bkf[m], !fwd);
    }
    if ((n2 & 1) == 0) akf[n2 / 2] = MT_MUL(akf[n2 / 2], f->bkf[n2 / 2], !fwd);
    MT_FN(mt_cfftp_exec)(&f->plan, akf, ch, (T)1, 0);
    for (mt_i m = 0; m < n; m++) c[m] = MT_SCALE(MT_MUL(akf[m], f->bk[m], fwd), fct);
}

/* ---- The line drivers of DFT and STFT, computing in T; the data are float, or double when
 * `x64`. Scratch (cap bytes): the plan, then one line's buffers per thread. --------------------- */
#define MT_RD(p, k) (x64 ? (T)((const double *)(p))[k] : (T)((const float *)(p))[k])
#define MT_WR(p, k, v) do { if (x64) ((double *)(p))[k] = (double)(v); else ((float *)(p))[k] = (float)(v); } while (0)

/* Sets up the plan of length n and the threads' lanes; 0 when the scratch is too small. */
static inline mt_i MT_FN(mt_fft_setup)(MT_FN(mt_fft) *f, mt_i n, mt_i lines, char *scratch, mt_i cap, char **lanes,
                                       mt_i *per) {
    const mt_i plan = (mt_fft_plan_size(n) * (mt_i)sizeof(MT_FN(mt_cx)) + 63) / 64 * 64;
    *per = (mt_fft_line_size(n) * (mt_i)sizeof(MT_FN(mt_cx)) + 63) / 64 * 64;
    const mt_i slots = mt_fft_slots(plan, *per, lines, lines * n, cap);
    if (slots < 1) return 0;
    *lanes = scratch + plan;
    MT_FN(mt_fft_make)(f, n, (MT_FN(mt_cx) *)scratch, (MT_FN(mt_cx) *)*lanes);
    return slots;
}

/* The DFT of geometry g of X (float data, or double when x64) into Y: each line gathered, padded or
 * cut to n, transformed, its first nout bins written. Nonzero when the scratch is too small. */
static inline int MT_FN(mt_dft_lines)(const void *X, void *Y, int x64, const mt_dft_geom *g, char *scratch, mt_i cap) {
    const mt_i n = g->n, lines = g->lines, inner = g->inner, L = g->L, cin = g->cin, nout = g->nout, cout = g->cout;
    const int inverse = g->inverse, irfft = g->irfft;
    if (lines == 0) return 0;
    MT_FN(mt_fft) f;
    char *lanes;
    mt_i per;
    const mt_i slots = MT_FN(mt_fft_setup)(&f, n, lines, scratch, cap, &lanes, &per);
    if (slots < 1) return 1;
    const mt_i h = n / 2 + 1, take = irfft ? (L < h ? L : h) : (L < n ? L : n), xs = inner * cin, ys = inner * cout;
    const T fct = inverse ? (T)1 / (T)n : (T)1;
    _Pragma("omp parallel num_threads(slots) if(slots > 1)")
    {
        MT_FN(mt_cx) *z = (MT_FN(mt_cx) *)(lanes + MT_SIG_THREAD * per), *work = z + n;
        _Pragma("omp for")
        for (mt_i line = 0; line < lines; line++) {
            const mt_i o = line / inner, i = line % inner, x0 = (o * L * inner + i) * cin;
            for (mt_i t = 0; t < take; t++) {
                z[t].r = MT_RD(X, x0 + t * xs);
                z[t].i = cin == 2 ? MT_RD(X, x0 + t * xs + 1) : (T)0;
            }
            for (mt_i t = take; t < n; t++) z[t].r = 0, z[t].i = 0;
            if (irfft) /* the bins above n / 2 mirror those below */
                for (mt_i t = h; t < n; t++) z[t].r = z[n - t].r, z[t].i = -z[n - t].i;
            MT_FN(mt_fft_exec)(&f, z, work, fct, !inverse);
            const mt_i y0 = (o * nout * inner + i) * cout;
            for (mt_i t = 0; t < nout; t++) {
                MT_WR(Y, y0 + t * ys, z[t].r);
                if (cout == 2) MT_WR(Y, y0 + t * ys + 1, z[t].i);
            }
        }
    }
    return 0;
}

/* STFT: the frames of n values `step` apart of each of B signals of L elements (cin values each,
 * float data or double when x64), times the window Wn (null: none), transformed into `bins` bins of
 * 2 values. Nonzero when the scratch is too small. */
static inline int MT_FN(mt_stft_lines)(const void *X, const void *Wn, void *Y, int x64, mt_i B, mt_i L, mt_i cin,
                                       mt_i step, mt_i n, mt_i frames, mt_i bins, char *scratch, mt_i cap) {
    if (B * frames == 0) return 0;
    MT_FN(mt_fft) f;
    char *lanes;
    mt_i per;
    const mt_i lines = B * frames, slots = MT_FN(mt_fft_setup)(&f, n, lines, scratch, cap, &lanes, &per);
    if (slots < 1) return 1;
    _Pragma("omp parallel num_threads(slots) if(slots > 1)")
    {
        MT_FN(mt_cx) *z = (MT_FN(mt_cx) *)(lanes + MT_SIG_THREAD * per), *work = z + n;
        _Pragma("omp for")
        for (mt_i line = 0; line < lines; line++) {
            const mt_i x0 = (line / frames * L + line % frames * step) * cin;
            for (mt_i t = 0; t < n; t++) {
                const T wt = Wn ? MT_RD(Wn, t) : (T)1;
                z[t].r = MT_RD(X, x0 + t * cin) * wt;
                z[t].i = cin == 2 ? MT_RD(X, x0 + t * cin + 1) * wt : (T)0;
            }
            MT_FN(mt_fft_exec)(&f, z, work, (T)1, 1);
            for (mt_i t = 0; t < bins; t++) {
                MT_WR(Y, (line * bins + t) * 2, z[t].r);
                MT_WR(Y, (line * bins + t) * 2 + 1, z[t].i);
            }
        }
    }
    return 0;
}
#undef MT_RD
#undef MT_WR

#undef CH
#undef CC
#undef WA
#undef MT_ADD
#undef MT_SUB
#undef MT_SCALE
#undef MT_MUL
#undef MT_PM
#undef MT_PMIN
#undef MT_ROT90
#undef MT_CX

#else /* ---- Part 2: the kernels over one element type T --------------------------------------- */

/* Sums in double for floats; integers in uint64_t, whose wrap-around keeps the low bits NumPy's
 * integer arithmetic keeps. */
#if MT_SIG_K == 0
#define MT_SIG_ACC double
#else
#define MT_SIG_ACC uint64_t
#endif

/* ---- Einsum as one loop nest: Y (no dims, C-contiguous) [e] = sum over the ns summed dims of the
 * product of the operands; st holds nops rows of no + ns element strides (output dims, then the
 * summed ones; 0 where an operand lacks the label; a repeated label's strides added). ---------- */

/* One output element: the sum over the summed dims (outer rows of `inner`, the last dim `step[k]`
 * apart) of the operands' products, from their offsets off[]. */
MT_INNER MT_SIG_ACC MT_FN(mt_einsum_one)(int nops, const T *const *ops, mt_i *off, const mt_i *step, int w, int no,
                                         int ns, const mt_i *sshape, const mt_i *st, mt_i outer, mt_i inner) {
    mt_i idx[MT_EIN_MAXDIMS];
    for (int d = 0; d < ns; d++) idx[d] = 0;
    MT_SIG_ACC acc = 0;
    for (mt_i it = 0; it < outer; it++) {
        if (nops == 1) {
            const T *a = ops[0] + off[0];
            for (mt_i j = 0; j < inner; j++) acc += (MT_SIG_ACC)a[j * step[0]];
        } else if (nops == 2) {
            const T *a = ops[0] + off[0], *b = ops[1] + off[1];
            for (mt_i j = 0; j < inner; j++) acc += (MT_SIG_ACC)a[j * step[0]] * (MT_SIG_ACC)b[j * step[1]];
        } else {
            for (mt_i j = 0; j < inner; j++) {
                MT_SIG_ACC p = (MT_SIG_ACC)ops[0][off[0] + j * step[0]];
                for (int k = 1; k < nops; k++) p *= (MT_SIG_ACC)ops[k][off[k] + j * step[k]];
                acc += p;
            }
        }
        for (int d = ns - 2; d >= 0; d--) { /* the next row of the summed dims */
            idx[d]++;
            for (int k = 0; k < nops; k++) off[k] += st[k * w + no + d];
            if (idx[d] < sshape[d]) break;
            for (int k = 0; k < nops; k++) off[k] -= idx[d] * st[k * w + no + d];
            idx[d] = 0;
        }
    }
    return acc; /* the last row's step wrapped every dim back: off[] is where it began */
}

static inline void MT_FN(mt_einsum)(int nops, const T *const *ops, T *restrict Y, int no, const mt_i *oshape, int ns,
                                    const mt_i *sshape, const mt_i *st) {
    const int w = no + ns;
    mt_i ny = 1, nsum = 1;
    for (int d = 0; d < no; d++) ny *= oshape[d];
    for (int d = 0; d < ns; d++) nsum *= sshape[d];
    if (nsum == 0) {
        for (mt_i e = 0; e < ny; e++) Y[e] = 0;
        return;
    }
    if (ny == 0) return;
    const mt_i inner = ns ? sshape[ns - 1] : 1, outer = nsum / inner, last = no ? oshape[no - 1] : 1, rows = ny / last;
    _Pragma("omp parallel for if(ny * nsum > MT_PAR_MIN)")
    for (mt_i row = 0; row < rows; row++) { /* the output's last dim is the loop inside */
        mt_i off[MT_EIN_MAXOPS], step[MT_EIN_MAXOPS], ostep[MT_EIN_MAXOPS];
        for (int k = 0; k < nops; k++)
            off[k] = 0, step[k] = ns ? st[k * w + w - 1] : 0, ostep[k] = no ? st[k * w + no - 1] : 0;
        mt_i r = row;
        for (int d = no - 2; d >= 0; d--) {
            const mt_i q = r % oshape[d];
            r /= oshape[d];
            for (int k = 0; k < nops; k++) off[k] += q * st[k * w + d];
        }
        T *restrict y = Y + row * last;
        if (ns == 0 && nops == 1) { /* a strided copy */
            const T *a = ops[0] + off[0];
            for (mt_i j = 0; j < last; j++) y[j] = a[j * ostep[0]];
            continue;
        }
        for (mt_i j = 0; j < last; j++) {
            y[j] = (T)MT_FN(mt_einsum_one)(nops, ops, off, step, w, no, ns, sshape, st, outer, inner);
            for (int k = 0; k < nops; k++) off[k] += ostep[k];
        }
    }
}

#if MT_SIG_K == 0
/* ---- Einsum's two-operand contractions as GEMMs: for each of the nb batch dims' positions,
 * Y[M, N] (C-contiguous) = A(i, k) @ B(k, j), A(i, k) = A[i*ar + k*ac], B(k, j) = B[k*br + j*bc];
 * bst holds the batch dims' strides for A, then B, then Y (3 rows of nb). ---------------------- */
static inline void MT_FN(mt_einsum_gemm)(const T *A, const T *B, T *Y, int nb, const mt_i *bshape, const mt_i *bst,
                                         mt_i M, mt_i N, mt_i K, mt_i ar, mt_i ac, mt_i br, mt_i bc) {
    mt_i total = 1;
    for (int d = 0; d < nb; d++) total *= bshape[d];
    /* many batches: one per thread, each GEMM on one (mt_threads is 1 inside a parallel region) */
    const int spread = total > 1 && total >= mt_threads();
    (void)spread; /* read only by the pragma: unused without OpenMP */
    _Pragma("omp parallel for if(spread)")
    for (mt_i t = 0; t < total; t++) {
        mt_i r = t, oa = 0, ob = 0, oy = 0;
        for (int d = nb - 1; d >= 0; d--) {
            const mt_i q = r % bshape[d];
            r /= bshape[d];
            oa += q * bst[d], ob += q * bst[nb + d], oy += q * bst[2 * nb + d];
        }
        MT_FN(mt_gemm)(A + oa, B + ob, 0, Y + oy, M, N, K, ar, ac, br, bc, 0, 0, (T)1, (T)0);
    }
}
#endif

/* ---- Col2Im: Y[N, C, image...] = the sum of the columns X[N, C * prod(block), L] over each
 * block's taps. image_shape and block_shape are read here: image_shape must be the compiled
 * image, and the block must give X's C * prod(block) rows and L columns. g holds nd, then the
 * image, dilations, pads (begin, then end) and strides, nd each. ------------------------------- */
static inline int MT_FN(mt_col2im_image)(const T *X, T *restrict Y, const int64_t *image_shape, const int64_t *block_shape,
                                   mt_i N, mt_i C, mt_i rows, mt_i L, const mt_i *g) {
    const int nd = (int)g[0];
    const mt_i *size = g + 1, *dil = g + 1 + nd, *pad = g + 1 + 2 * nd, *str = g + 1 + 4 * nd;
    mt_i k[MT_COL_MAXDIMS], out[MT_COL_MAXDIMS], istr[MT_COL_MAXDIMS], taps = 1, cols = 1, img = 1;
    for (int d = nd - 1; d >= 0; d--) {
        istr[d] = img;
        if (image_shape[d] != size[d] || block_shape[d] < 1) return 1;
        k[d] = (mt_i)block_shape[d];
        const mt_i room = size[d] + pad[d] + pad[nd + d] - dil[d] * (k[d] - 1) - 1;
        if (room < 0) return 1;
        out[d] = room / str[d] + 1;
        taps *= k[d], cols *= out[d], img *= size[d];
    }
    if (taps * C != rows || cols != L) return 1;
    const mt_i last = out[nd - 1], lines = L / last;
    _Pragma("omp parallel for if(N * C * img > MT_PAR_MIN)")
    for (mt_i p = 0; p < N * C; p++) {
        T *restrict y = Y + p * img;
        for (mt_i i = 0; i < img; i++) y[i] = 0;
        for (mt_i t = 0; t < taps; t++) {
            mt_i kt[MT_COL_MAXDIMS], rem = t;
            for (int d = nd - 1; d >= 0; d--) kt[d] = rem % k[d], rem /= k[d];
            const T *x = X + ((p / C) * rows + (p % C) * taps + t) * L;
            for (mt_i line = 0; line < lines; line++) {
                mt_i at = 0, ok = 1, lr = line;
                for (int d = nd - 2; d >= 0; d--) { /* the position of this line on the leading axes */
                    const mt_i o = lr % out[d];
                    lr /= out[d];
                    const mt_i pos = o * str[d] + kt[d] * dil[d] - pad[d];
                    if (pos < 0 || pos >= size[d]) ok = 0;
                    at += pos * istr[d];
                }
                if (!ok) continue;
                const int d = nd - 1;
                const T *xl = x + line * last;
                for (mt_i o = 0; o < last; o++) {
                    const mt_i pos = o * str[d] + kt[d] * dil[d] - pad[d];
                    if (pos >= 0 && pos < size[d]) {
#if MT_SIG_K == 0
                        y[at + pos] += xl[o];
#else
                        y[at + pos] = (T)((uint64_t)y[at + pos] + (uint64_t)xl[o]);
#endif
                    }
                }
            }
        }
    }
    return 0;
}

#if MT_SIG_K == 0
/* ---- DeformConv, 2-D: each (channel, tap) row of the columns col [C * kh * kw, oh * ow] samples
 * X bilinearly (zero outside) at the tap's place plus its learned offset, times the mask; then
 * each group's GEMM with W and the bias. g: N, C, H, W, M, group, offset_group, kh, kw, oh, ow,
 * stride h, w, pad h, w, dilation h, w. ----------------------------------------------------------- */
static inline void MT_FN(mt_deform_conv)(const T *X, const T *Wt, const T *Off, const T *Bias, const T *Mask,
                                         T *restrict Y, T *restrict col, const mt_i *g) {
    const mt_i N = g[0], C = g[1], H = g[2], W = g[3], M = g[4], group = g[5], og = g[6], kh = g[7], kw = g[8];
    const mt_i oh = g[9], ow = g[10], sh = g[11], sw = g[12], ph = g[13], pw = g[14], dh = g[15], dw = g[16];
    const mt_i taps = kh * kw, L = oh * ow, cg = C / group, mg = M / group, cog = C / og;
    for (mt_i n = 0; n < N; n++) {
        _Pragma("omp parallel for if(C * taps * L > MT_PAR_MIN / 4)")
        for (mt_i row = 0; row < C * taps; row++) {
            const mt_i c = row / taps, t = row % taps, ki = t / kw, kj = t % kw, o = c / cog;
            const T *offy = Off + ((n * og + o) * taps + t) * 2 * L, *offx = offy + L;
            const T *mask = Mask ? Mask + ((n * og + o) * taps + t) * L : 0;
            const T *img = X + (n * C + c) * H * W;
            T *restrict cr = col + row * L;
            for (mt_i l = 0; l < L; l++) {
                const T py = (T)((l / ow) * sh - ph + ki * dh) + offy[l];
                const T px = (T)((l % ow) * sw - pw + kj * dw) + offx[l];
                const T fy = floor(py), fx = floor(px), ay = py - fy, ax = px - fx;
                T v = 0;
                for (int cy = 0; cy < 2; cy++) {
                    const T yy = fy + cy;
                    if (!(yy >= 0 && yy < (T)H)) continue;
                    for (int cx = 0; cx < 2; cx++) {
                        const T xx = fx + cx;
                        if (!(xx >= 0 && xx < (T)W)) continue;
                        const T wgt = (cy ? ay : 1 - ay) * (cx ? ax : 1 - ax);
                        v += img[(mt_i)yy * W + (mt_i)xx] * wgt;
                    }
                }
                cr[l] = mask ? v * mask[l] : v;
            }
        }
        for (mt_i gi = 0; gi < group; gi++)
            MT_FN(mt_gemm)(Wt + gi * mg * cg * taps, col + gi * cg * taps * L, Bias ? Bias + gi * mg : 0,
                           Y + (n * M + gi * mg) * L, mg, L, cg * taps, cg * taps, 1, L, 1, 1, 0, (T)1, (T)1);
    }
}

/* One axis of a RoiAlign sample point, as onnxruntime takes it: the two pixels and weights, and
 * whether the point lies outside the map (then it adds nothing). */
MT_INNER int MT_FN(mt_roi_axis)(double c, mt_i size, mt_i *lo, mt_i *hi, double *wlo, double *whi) {
    const int empty = c < -1.0 || c > (double)size;
    if (c < 0) c = 0;
    mt_i l = (mt_i)floor(c);
    if (l >= size - 1) {
        l = size - 1;
        *lo = *hi = l;
        c = (double)l;
    } else {
        *lo = l;
        *hi = l + 1;
    }
    *whi = c - (double)l;
    *wlo = 1 - *whi;
    return empty;
}

/* ---- RoiAlign: Y[R, C, oh, ow] from X[N, C, H, W] over each ROI (x1, y1, x2, y2) of its batch
 * image, averaging (or, max_mode, taking the largest weighted corner of) the sample points of
 * each bin; in double. Returns nonzero when a batch index is outside [0, N). --------------------- */
static inline int MT_FN(mt_roi_align)(const T *X, const T *rois, const int64_t *bidx, T *restrict Y, mt_i N, mt_i C,
                                      mt_i H, mt_i W, mt_i R, mt_i oh, mt_i ow, mt_i sampling, double scale,
                                      int half_pixel, int max_mode) {
    for (mt_i r = 0; r < R; r++)
        if (bidx[r] < 0 || bidx[r] >= N) return 1;
    const mt_i blocks = (C + MT_ROI_CB - 1) / MT_ROI_CB, HW = H * W;
    _Pragma("omp parallel for if(R * C * oh * ow * 4 > MT_PAR_MIN)")
    for (mt_i item = 0; item < R * oh * ow * blocks; item++) { /* (ROI, bin, block of channels) */
        const mt_i r = item / (oh * ow * blocks), p = item / blocks % (oh * ow), c0 = item % blocks * MT_ROI_CB;
        const mt_i py = p / ow, px = p % ow, nc = C - c0 < MT_ROI_CB ? C - c0 : MT_ROI_CB;
        const double off = half_pixel ? 0.5 : 0.0;
        const double x1 = (double)rois[4 * r] * scale - off, y1 = (double)rois[4 * r + 1] * scale - off;
        const double x2 = (double)rois[4 * r + 2] * scale - off, y2 = (double)rois[4 * r + 3] * scale - off;
        double rw = x2 - x1, rh = y2 - y1;
        if (!half_pixel) rw = rw > 1.0 ? rw : 1.0, rh = rh > 1.0 ? rh : 1.0;
        const double bh = rh / (double)oh, bw = rw / (double)ow;
        const mt_i gh = sampling > 0 ? sampling : (mt_i)ceil(rh / (double)oh);
        const mt_i gw = sampling > 0 ? sampling : (mt_i)ceil(rw / (double)ow);
        const double count = gh * gw > 1 ? (double)(gh * gw) : 1.0;
        const T *img = X + (bidx[r] * C + c0) * HW;
        T *restrict y = Y + (r * C + c0) * oh * ow + p;
        double acc[MT_ROI_CB];
        for (mt_i c = 0; c < nc; c++) acc[c] = max_mode ? -INFINITY : 0.0;
        if (gh <= 0 || gw <= 0) { /* an inverted half-pixel ROI has no sample points */
            for (mt_i c = 0; c < nc; c++) y[c * oh * ow] = 0;
            continue;
        }
        for (mt_i iy = 0; iy < gh; iy++) {
            mt_i ylo, yhi;
            double wylo, wyhi;
            const int ye = MT_FN(mt_roi_axis)(y1 + ((double)py + ((double)iy + 0.5) / (double)gh) * bh, H, &ylo,
                                              &yhi, &wylo, &wyhi);
            for (mt_i ix = 0; ix < gw; ix++) {
                mt_i xlo, xhi;
                double wxlo, wxhi;
                const int xe = MT_FN(mt_roi_axis)(x1 + ((double)px + ((double)ix + 0.5) / (double)gw) * bw, W, &xlo,
                                                  &xhi, &wxlo, &wxhi);
                const int empty = ye || xe; /* the point adds nothing (a zero to the max) */
                const double w1 = wylo * wxlo, w2 = wylo * wxhi, w3 = wyhi * wxlo, w4 = wyhi * wxhi;
                const mt_i i1 = ylo * W + xlo, i2 = ylo * W + xhi, i3 = yhi * W + xlo, i4 = yhi * W + xhi;
                for (mt_i c = 0; c < nc; c++) {
                    const T *im = img + c * HW;
                    double c1 = 0, c2 = 0, c3 = 0, c4 = 0;
                    if (!empty)
                        c1 = w1 * (double)im[i1], c2 = w2 * (double)im[i2], c3 = w3 * (double)im[i3],
                        c4 = w4 * (double)im[i4];
                    if (max_mode) {
                        const double a = c1 > c2 ? c1 : c2, b = c3 > c4 ? c3 : c4, m = a > b ? a : b;
                        if (m > acc[c]) acc[c] = m;
                    } else {
                        acc[c] += c1 + c2 + c3 + c4;
                    }
                }
            }
        }
        for (mt_i c = 0; c < nc; c++) y[c * oh * ow] = (T)(max_mode ? acc[c] : acc[c] / count);
    }
    return 0;
}

/* Whether box a ranks before box b: the higher score, NaN last, equal scores by index (NumPy's
 * stable argsort of the negated scores). */
MT_INNER int MT_FN(mt_nms_before)(const T *s, mt_i a, mt_i b) {
    const int an = s[a] != s[a], bn = s[b] != s[b];
    if (an || bn) return an && bn ? a < b : bn;
    return s[a] != s[b] ? s[a] > s[b] : a < b;
}

/* ---- NonMaxSuppression: for each batch and class, the boxes by falling score (above
 * score_thr when has_thr), each kept unless its IoU with a kept one exceeds iou_thr, at most
 * max_out; rows (batch, class, box) into Y [K, 3]. In double. scratch: 5 doubles and 3 indices a
 * box. Returns nonzero when the count is not K. ------------------------------------------------- */
static inline int MT_FN(mt_nms)(const T *boxes, const T *scores, int64_t *restrict Y, mt_i B, mt_i C, mt_i S,
                                int center, int64_t max_out, double iou_thr, int has_thr, double score_thr, mt_i K,
                                char *scratch) {
    double *y1 = (double *)scratch, *x1 = y1 + S, *y2 = x1 + S, *x2 = y2 + S, *area = x2 + S;
    mt_i *order = (mt_i *)(area + S), *tmp = order + S, *kept = tmp + S;
    mt_i count = 0;
    for (mt_i b = 0; b < B && max_out > 0; b++) {
        for (mt_i j = 0; j < S; j++) {
            const T *bx = boxes + (b * S + j) * 4;
            const double a = bx[0], c = bx[1], d = bx[2], e = bx[3];
            if (center) /* (x center, y center, width, height) */
                y1[j] = c - e / 2, x1[j] = a - d / 2, y2[j] = c + e / 2, x2[j] = a + d / 2;
            else
                y1[j] = a < d ? a : d, x1[j] = c < e ? c : e, y2[j] = a < d ? d : a, x2[j] = c < e ? e : c;
            area[j] = (y2[j] - y1[j]) * (x2[j] - x1[j]);
        }
        for (mt_i cl = 0; cl < C; cl++) {
            const T *s = scores + (b * C + cl) * S;
            for (mt_i j = 0; j < S; j++) order[j] = j;
            for (mt_i w = 1; w < S; w *= 2) { /* bottom-up merge sort: stable */
                for (mt_i lo = 0; lo < S; lo += 2 * w) {
                    const mt_i mid = lo + w < S ? lo + w : S, hi = lo + 2 * w < S ? lo + 2 * w : S;
                    mt_i i = lo, j = mid, o = lo;
                    while (i < mid && j < hi)
                        tmp[o++] = MT_FN(mt_nms_before)(s, order[j], order[i]) ? order[j++] : order[i++];
                    while (i < mid) tmp[o++] = order[i++];
                    while (j < hi) tmp[o++] = order[j++];
                }
                for (mt_i j = 0; j < S; j++) order[j] = tmp[j];
            }
            mt_i nk = 0;
            for (mt_i q = 0; q < S && nk < max_out; q++) {
                const mt_i j = order[q];
                if (has_thr && !((double)s[j] > score_thr)) continue;
                int keep = 1;
                for (mt_i u = 0; u < nk && keep; u++) {
                    const mt_i i = kept[u];
                    const double ih = (y2[i] < y2[j] ? y2[i] : y2[j]) - (y1[i] > y1[j] ? y1[i] : y1[j]);
                    const double iw = (x2[i] < x2[j] ? x2[i] : x2[j]) - (x1[i] > x1[j] ? x1[i] : x1[j]);
                    const double inter = ih > 0 && iw > 0 ? ih * iw : 0.0, uni = area[i] + area[j] - inter;
                    const double iou = area[i] > 0 && area[j] > 0 && uni > 0 && inter > 0 ? inter / uni : 0.0;
                    if (iou > iou_thr) keep = 0;
                }
                if (!keep) continue;
                kept[nk++] = j;
                if (count < K) Y[3 * count] = b, Y[3 * count + 1] = cl, Y[3 * count + 2] = j;
                count++;
            }
        }
    }
    return count != K;
}
#endif

#undef MT_SIG_ACC
#endif /* MT_SIG_PART */
#endif /* MT_SIGNAL_T */
