/* Template: 3x3 convolution by Winograd's minimal filtering F(2x2, 3x3) over float type T (see
 * mt_nn.h, which includes it once per float type after mt_nn_t.h; no guard).
 *
 * Each 2x2 block of outputs ("tile") comes from a 4x4 input patch d and the 3x3 filter g as
 * Y = A^T [(G g G^T) (.) (B^T d B)] A: 16 products per tile and channel pair where direct
 * convolution needs 36. Batched over tiles, the 16 elementwise products become 16 GEMMs
 * U[xi] (M x C) @ V[xi] (C x tiles) on the kernel library's GEMM, so the multiply count is 2.25x
 * smaller (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks", 2016). Rounding
 * grows by a few ulp of the inputs' magnitude (the transforms add and halve), well inside float32
 * tolerances against onnxruntime.
 *
 *   G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1]
 *   B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]      A^T = [1 1 1 0; 0 1 -1 -1]
 *
 * Scratch (arena): U, V and Mo, 16 blocks each of M*C, C*T and M*T values of T, every block padded
 * by mt_winograd_stride (the 16 blocks are written and read together: blocks a multiple of 4 KiB
 * apart fall in the same L1 sets, which made the transforms 10x slower). The filter transform
 * runs on every call, so trained or replaced weights need nothing redone. */

#ifndef MT_WINOGRAD_STRIDE
#define MT_WINOGRAD_STRIDE
/* Elements from one block to the next for blocks of n: n rounded up to 16, plus 16. */
static inline mt_i mt_winograd_stride(mt_i n) { return (n + 15) / 16 * 16 + 16; }
#endif

/* U[xi][m][c] = (G g G^T)[xi] for the filter W[m][c] (3x3). */
static inline void MT_FN(mt_winograd_filter)(const T *W, T *restrict U, mt_i M, mt_i C) {
    const mt_i MC = M * C, S = mt_winograd_stride(MC);
    _Pragma("omp parallel for if(MC * 16 > MT_PAR_MIN)")
    for (mt_i mc = 0; mc < MC; mc++) {
        const T *g = W + mc * 9;
        T t[4][3]; /* G g */
        for (int j = 0; j < 3; j++) {
            T g0 = g[j], g1 = g[3 + j], g2 = g[6 + j];
            t[0][j] = g0;
            t[1][j] = (T)0.5 * (g0 + g1 + g2);
            t[2][j] = (T)0.5 * (g0 - g1 + g2);
            t[3][j] = g2;
        }
        for (int i = 0; i < 4; i++) { /* (G g) G^T */
            T a = t[i][0], b = t[i][1], c = t[i][2];
            U[(i * 4 + 0) * S + mc] = a;
            U[(i * 4 + 1) * S + mc] = (T)0.5 * (a + b + c);
            U[(i * 4 + 2) * S + mc] = (T)0.5 * (a - b + c);
            U[(i * 4 + 3) * S + mc] = c;
        }
    }
}

/* V[xi][c][t] = (B^T d B)[xi] for the 4x4 patch d of plane c at tile t = th * TW + tw, whose first
 * row and column are 2 th - ph and 2 tw - pw (outside the plane: zero padding). */
static inline void MT_FN(mt_winograd_input)(const T *X, T *restrict V, mt_i C, mt_i H, mt_i Wd, mt_i TH, mt_i TW,
                                            mt_i ph, mt_i pw) {
    const mt_i TT = TH * TW, CT = C * TT, S = mt_winograd_stride(CT);
    _Pragma("omp parallel for if(CT * 16 > MT_PAR_MIN)")
    for (mt_i c = 0; c < C; c++) {
        const T *x = X + c * H * Wd;
        for (mt_i th = 0; th < TH; th++) {
            const mt_i y0 = 2 * th - ph;
            const int rows_inside = y0 >= 0 && y0 + 4 <= H;
            for (mt_i tw = 0; tw < TW; tw++) {
                const mt_i x0 = 2 * tw - pw;
                T d[4][4];
                if (rows_inside && x0 >= 0 && x0 + 4 <= Wd) {
                    for (int i = 0; i < 4; i++)
                        for (int j = 0; j < 4; j++) d[i][j] = x[(y0 + i) * Wd + x0 + j];
                } else {
                    for (int i = 0; i < 4; i++)
                        for (int j = 0; j < 4; j++) {
                            mt_i y = y0 + i, xx = x0 + j;
                            d[i][j] = y >= 0 && y < H && xx >= 0 && xx < Wd ? x[y * Wd + xx] : (T)0;
                        }
                }
                T s[4][4]; /* B^T d */
                for (int j = 0; j < 4; j++) {
                    s[0][j] = d[0][j] - d[2][j];
                    s[1][j] = d[1][j] + d[2][j];
                    s[2][j] = d[2][j] - d[1][j];
                    s[3][j] = d[1][j] - d[3][j];
                }
                T *v = V + c * TT + th * TW + tw;
                for (int i = 0; i < 4; i++) { /* (B^T d) B */
                    v[(i * 4 + 0) * S] = s[i][0] - s[i][2];
                    v[(i * 4 + 1) * S] = s[i][1] + s[i][2];
                    v[(i * 4 + 2) * S] = s[i][2] - s[i][1];
                    v[(i * 4 + 3) * S] = s[i][1] - s[i][3];
                }
            }
        }
    }
}

/* Y[m] = clamp(A^T Mo[.][m][t] A + bias[m], lo, hi), each tile's 2x2 outputs inside OH x OW. */
static inline void MT_FN(mt_winograd_output)(const T *Mo, const T *Bias, T *restrict Y, mt_i M, mt_i OH, mt_i OW,
                                             mt_i TH, mt_i TW, T lo, T hi) {
    const mt_i TT = TH * TW, MT = M * TT, S = mt_winograd_stride(MT);
    _Pragma("omp parallel for if(MT * 16 > MT_PAR_MIN)")
    for (mt_i m = 0; m < M; m++) {
        const T b = Bias ? Bias[m] : (T)0;
        T *restrict y = Y + m * OH * OW;
        for (mt_i th = 0; th < TH; th++)
            for (mt_i tw = 0; tw < TW; tw++) {
                const T *p = Mo + m * TT + th * TW + tw;
                T q[4][4];
                for (int xi = 0; xi < 16; xi++) q[xi / 4][xi % 4] = p[xi * S];
                T r[2][4]; /* A^T q */
                for (int j = 0; j < 4; j++) {
                    r[0][j] = q[0][j] + q[1][j] + q[2][j];
                    r[1][j] = q[1][j] - q[2][j] - q[3][j];
                }
                for (int i = 0; i < 2; i++) {
                    mt_i oy = 2 * th + i;
                    if (oy >= OH) break;
                    T o0 = r[i][0] + r[i][1] + r[i][2] + b, o1 = r[i][1] - r[i][2] - r[i][3] + b;
                    o0 = o0 < lo ? lo : (o0 > hi ? hi : o0);
                    o1 = o1 < lo ? lo : (o1 > hi ? hi : o1);
                    y[oy * OW + 2 * tw] = o0;
                    if (2 * tw + 1 < OW) y[oy * OW + 2 * tw + 1] = o1;
                }
            }
    }
}

/* A 2-D 3x3 convolution, stride 1, dilation 1, one group: X [N, C, H, Wd] -> Y [N, M, OH, OW] with
 * padding ph, pw before (the output size says how much after), Y = clamp(conv + Bias, lo, hi).
 * `scratch` holds 16 * (stride(M*C) + stride(C*T) + stride(M*T)) values (mt_winograd_stride),
 * T = ceil(OH/2) * ceil(OW/2). */
static inline void MT_FN(mt_conv_winograd)(const T *X, const T *W, const T *Bias, T *restrict Y, T *restrict scratch,
                                           mt_i N, mt_i C, mt_i M, mt_i H, mt_i Wd, mt_i OH, mt_i OW, mt_i ph,
                                           mt_i pw, T lo, T hi) {
    const mt_i TH = (OH + 1) / 2, TW = (OW + 1) / 2, TT = TH * TW;
    const mt_i SU = mt_winograd_stride(M * C), SV = mt_winograd_stride(C * TT), SM = mt_winograd_stride(M * TT);
    T *U = scratch, *V = U + 16 * SU, *Mo = V + 16 * SV;
    MT_FN(mt_winograd_filter)(W, U, M, C);
    for (mt_i n = 0; n < N; n++) {
        MT_FN(mt_winograd_input)(X + n * C * H * Wd, V, C, H, Wd, TH, TW, ph, pw);
        /* Mo[xi] (M x TT) = U[xi] (M x C) @ V[xi] (C x TT): the 16 GEMMs share the threads out
         * whole (each runs on one; mt_threads() is 1 inside the region), evenly, with no fork per GEMM. */
        _Pragma("omp parallel for schedule(dynamic)")
        for (int xi = 0; xi < 16; xi++)
            MT_FN(mt_gemm)(U + xi * SU, V + xi * SV, 0, Mo + xi * SM, M, TT, C, C, 1, TT, 1, 0, 0, (T)1, (T)0);
        MT_FN(mt_winograd_output)(Mo, Bias, Y + n * M * OH * OW, M, OH, OW, TH, TW, lo, hi);
    }
}
