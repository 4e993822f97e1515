/* Register-blocked SIMD matrix product for the chunk sizes gdn uses
 * (M, N <= 256 typically, any Kd). The micro-kernel keeps an MR x NR block of
 * C in registers and reads op(A) in place (row-major or transposed: either
 * way MR scalar broadcasts per step) and op(B) as NR-wide vector rows. op(B)
 * is packed only when it is transposed or its last panel is ragged; A is
 * never packed, so a 64 x 128 x 128 product spends its time in FMAs. Vector
 * width follows the build target (AVX-512: 16 floats, else 8) through
 * GCC/Clang vector extensions, so the same source compiles everywhere. */
#include <string.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#include "cpu/gemm.h"

#define VL GDN_VL
#define MR 8
#define NR (2 * VL)
#define KMAX 256

typedef gdn_vf vf;

static inline vf vload(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
static inline void vstore(float *p, vf v) { memcpy(p, &v, sizeof v); }

/* C block (mr x nr) = alpha * op(A) B (+ C). Element (i, p) of op(A) is
 * A[i*ars + p*acs]; row p of the B panel is B + p*bs (NR floats). Rows of A
 * past mr repeat row mr-1 (valid memory; their results are dropped). */
static inline __attribute__((always_inline)) void
micro(int Kd, const float *A, int64_t ars, int64_t acs, const float *B, int64_t bs, float alpha,
      int accumulate, float *C, int64_t ldc, int mr, int nr) {
    vf c0[MR], c1[MR];
    const float *ar[MR];
    for (int i = 0; i < MR; i++) {
        c0[i] = (vf){0}; c1[i] = (vf){0};
        ar[i] = A + (int64_t)(i < mr ? i : mr - 1) * ars;
    }
    for (int p = 0; p < Kd; p++) {
        const vf b0 = vload(B + (int64_t)p * bs), b1 = vload(B + (int64_t)p * bs + VL);
        for (int i = 0; i < MR; i++) {
            const float a = ar[i][(int64_t)p * acs];
            c0[i] += a * b0;   /* scalar * vector broadcasts */
            c1[i] += a * b1;
        }
    }
    if (mr == MR && nr == NR) {
        for (int i = 0; i < MR; i++) {
            float *ci = C + i * ldc;
            vf r0 = c0[i] * alpha, r1 = c1[i] * alpha;
            if (accumulate) { r0 += vload(ci); r1 += vload(ci + VL); }
            vstore(ci, r0); vstore(ci + VL, r1);
        }
        return;
    }
    float tmp[NR];
    for (int i = 0; i < mr; i++) {
        vstore(tmp, c0[i] * alpha); vstore(tmp + VL, c1[i] * alpha);
        float *ci = C + i * ldc;
        if (accumulate) for (int j = 0; j < nr; j++) ci[j] += tmp[j];
        else for (int j = 0; j < nr; j++) ci[j] = tmp[j];
    }
}

/* the two layouts of A, so that the stride of the inner loop is a constant */
static void micro_rowA(int Kd, const float *A, int64_t lda, const float *B, int64_t bs, float alpha,
                       int acc, float *C, int64_t ldc, int mr, int nr) {
    micro(Kd, A, lda, 1, B, bs, alpha, acc, C, ldc, mr, nr);
}
static void micro_colA(int Kd, const float *A, int64_t lda, const float *B, int64_t bs, float alpha,
                       int acc, float *C, int64_t ldc, int mr, int nr) {
    micro(Kd, A, 1, lda, B, bs, alpha, acc, C, ldc, mr, nr);
}

/* dst[p*ld + j] = src[j*ls + p] for j < nj, p < np (gemm.h): the transposed
 * pack of op(B), and the v-first states' transposes. Scalar moves cost as
 * much as the product itself for a 64 x 128 x 128 block, so full tiles go
 * through registers: 16 x 16 with AVX-512, else 8 x 8 by three rounds of
 * two-vector shuffles (GCC / Clang vector extensions). */
#if defined(__AVX512F__)
#define TB 16
static void tile(const float *s, int64_t ls, float *d, int64_t ld) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(s + i * ls);
    for (int i = 0; i < 16; i += 2) {          /* 32-bit interleave of row pairs */
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {          /* 64-bit interleave: 4 rows per 128-bit lane */
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    }
    /* r[4g + m] holds columns m, m+4, m+8, m+12 of rows 4g..4g+3, one per lane */
    for (int m = 0; m < 4; m++) {
        const __m512 v0 = _mm512_shuffle_f32x4(r[m], r[4 + m], 0x88);      /* col m, m+8 of rows 0-7  */
        const __m512 v1 = _mm512_shuffle_f32x4(r[m], r[4 + m], 0xDD);      /* col m+4, m+12           */
        const __m512 v2 = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0x88); /* col m, m+8 of rows 8-15 */
        const __m512 v3 = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0xDD);
        _mm512_storeu_ps(d + (m) * ld, _mm512_shuffle_f32x4(v0, v2, 0x88));
        _mm512_storeu_ps(d + (m + 8) * ld, _mm512_shuffle_f32x4(v0, v2, 0xDD));
        _mm512_storeu_ps(d + (m + 4) * ld, _mm512_shuffle_f32x4(v1, v3, 0x88));
        _mm512_storeu_ps(d + (m + 12) * ld, _mm512_shuffle_f32x4(v1, v3, 0xDD));
    }
}
#else
#define TB 8
typedef float v8f __attribute__((vector_size(32), aligned(4)));
typedef int v8i __attribute__((vector_size(32)));
#if defined(__clang__)
#define SHUF(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define SHUF(a, b, ...) __builtin_shuffle(a, b, (v8i){__VA_ARGS__})
#endif
static void tile(const float *src, int64_t ls, float *dst, int64_t ld) {
    v8f r[8], t[8];
    for (int i = 0; i < 8; i++) memcpy(&r[i], src + i * ls, sizeof(v8f));
    for (int i = 0; i < 8; i += 2) {   /* pairs of rows interleaved */
        t[i] = SHUF(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
        t[i + 1] = SHUF(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
    }
    for (int i = 0; i < 8; i += 4)     /* pairs of pairs */
        for (int k = 0; k < 2; k++) {
            r[i + k] = SHUF(t[i + k], t[i + k + 2], 0, 1, 8, 9, 4, 5, 12, 13);
            r[i + k + 2] = SHUF(t[i + k], t[i + k + 2], 2, 3, 10, 11, 6, 7, 14, 15);
        }
    for (int k = 0; k < 4; k++) {      /* 128-bit halves */
        t[k] = SHUF(r[k], r[k + 4], 0, 1, 2, 3, 8, 9, 10, 11);
        t[k + 4] = SHUF(r[k], r[k + 4], 4, 5, 6, 7, 12, 13, 14, 15);
    }
    /* t[k] holds column c of the tile for k = 0, 2, 1, 3, 4, 6, 5, 7 -> c = 0, 1, 2, 3, 4, 5, 6, 7 */
    static const int col[8] = {0, 2, 1, 3, 4, 6, 5, 7};
    for (int k = 0; k < 8; k++) memcpy(dst + col[k] * ld, &t[k], sizeof(v8f));
}
#undef SHUF
#endif

void gdn_transpose(const float *src, int64_t ls, int nj, int np, float *dst, int64_t ld) {
    const int j1 = nj / TB * TB, p1 = np / TB * TB;
    for (int j0 = 0; j0 < j1; j0 += TB)
        for (int p = 0; p < p1; p += TB) tile(src + (int64_t)j0 * ls + p, ls, dst + (int64_t)p * ld + j0, ld);
    /* ragged edges: columns p >= p1 of the tiled rows, then the leftover rows */
    for (int j = 0; j < j1; j++)
        for (int p = p1; p < np; p++) dst[(int64_t)p * ld + j] = src[(int64_t)j * ls + p];
    for (int j = j1; j < nj; j++)
        for (int p = 0; p < np; p++) dst[(int64_t)p * ld + j] = src[(int64_t)j * ls + p];
}

/* one packed B panel per thread: Kd <= KMAX rows of NR floats */
static _Thread_local float Bpack[KMAX * NR] __attribute__((aligned(64)));

static void gemm_block(int tri, int M, int N, int Kd, float alpha, const float *A, int64_t lda, int ta,
                       const float *B, int64_t ldb, int tb, int accumulate, float *C, int64_t ldc) {
    for (int j0 = 0; j0 < N; j0 += NR) {
        const int nr = N - j0 < NR ? N - j0 : NR;
        const float *Bp = B + j0;
        int64_t bs = ldb;
        if (tb || nr < NR) {
            if (tb) gdn_transpose(B + (int64_t)j0 * ldb, ldb, nr, Kd, Bpack, NR);
            for (int p = 0; p < Kd; p++) {
                float *dst = Bpack + (int64_t)p * NR;
                if (!tb) memcpy(dst, B + (int64_t)p * ldb + j0, sizeof(float) * nr);
                for (int j = nr; j < NR; j++) dst[j] = 0.f;
            }
            Bp = Bpack;
            bs = NR;
        }
        for (int i0 = 0; i0 < M; i0 += MR) {
            const int mr = M - i0 < MR ? M - i0 : MR;
            if ((tri & GDN_TRI_LOWER_C) && j0 > i0 + mr - 1) continue;
            /* the reduction range [p0, p1) this row block needs */
            int p0 = 0, p1 = Kd;
            if ((tri & GDN_TRI_LOWER_A) && i0 + mr < p1) p1 = i0 + mr;
            if (tri & GDN_TRI_UPPER_A) p0 = i0;
            float *Cb = C + (int64_t)i0 * ldc + j0;
            const float *Bq = Bp + (int64_t)p0 * bs;
            if (p1 <= p0) {   /* nothing to sum: C block = 0 (or unchanged) */
                if (!accumulate) for (int i = 0; i < mr; i++) memset(Cb + (int64_t)i * ldc, 0, sizeof(float) * nr);
                continue;
            }
            if (!ta) micro_rowA(p1 - p0, A + (int64_t)i0 * lda + p0, lda, Bq, bs, alpha, accumulate, Cb, ldc, mr, nr);
            else micro_colA(p1 - p0, A + (int64_t)p0 * lda + i0, lda, Bq, bs, alpha, accumulate, Cb, ldc, mr, nr);
        }
    }
}

void gdn_gemm(int M, int N, int Kd, float alpha, const float *A, int64_t lda, int ta,
              const float *B, int64_t ldb, int tb, int accumulate, float *C, int64_t ldc) {
    gdn_gemm_tri(0, M, N, Kd, alpha, A, lda, ta, B, ldb, tb, accumulate, C, ldc);
}

void gdn_gemm_tri(int tri, int M, int N, int Kd, float alpha, const float *A, int64_t lda, int ta,
                  const float *B, int64_t ldb, int tb, int accumulate, float *C, int64_t ldc) {
    if (M <= 0 || N <= 0) return;
    /* triangular factors are square chunk blocks, never split below */
    if (Kd > KMAX) tri = 0;
    if (Kd <= 0) {
        if (!accumulate) for (int i = 0; i < M; i++) memset(C + (int64_t)i * ldc, 0, (size_t)N * sizeof(float));
        return;
    }
    /* split the reduction so a packed panel fits its buffer; the split is a
     * function of the shape only, so results do not depend on threads */
    for (int p0 = 0; p0 < Kd; p0 += KMAX) {
        const int kd = Kd - p0 < KMAX ? Kd - p0 : KMAX;
        const float *Ak = ta ? A + (int64_t)p0 * lda : A + p0;
        const float *Bk = tb ? B + p0 : B + (int64_t)p0 * ldb;
        gemm_block(tri, M, N, kd, alpha, Ak, lda, ta, Bk, ldb, tb, accumulate || p0 > 0, C, ldc);
    }
}

float gdn_dot(const float *a, const float *b, int n) {
    vf acc0 = (vf){0}, acc1 = (vf){0};
    int i = 0;
    for (; i + 2 * VL <= n; i += 2 * VL) {
        acc0 += vload(a + i) * vload(b + i);
        acc1 += vload(a + i + VL) * vload(b + i + VL);
    }
    for (; i + VL <= n; i += VL) acc0 += vload(a + i) * vload(b + i);
    acc0 += acc1;
    float s = 0.f;
    for (int l = 0; l < VL; l++) s += acc0[l];
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

void gdn_delta_rows4(float *s, int64_t ld, const float *k, const float *q, int K, float decay, float beta, const float *ve, float *o) {
    if (K % VL) {   /* scalar tails: row by row (contracted as gdn_delta_row's, for the same bits) */
        for (int r = 0; r < 4; r++) o[r] = gdn_delta_row(s + r * ld, k, q, K, decay, beta, ve[r]);
        return;
    }
    vf a0[4], a1[4];
    for (int r = 0; r < 4; r++) a0[r] = a1[r] = (vf){0};
    int i = 0;   /* the dots, as gdn_dot */
    for (; i + 2 * VL <= K; i += 2 * VL)
        for (int r = 0; r < 4; r++) {
            a0[r] += vload(s + r * ld + i) * vload(k + i);
            a1[r] += vload(s + r * ld + i + VL) * vload(k + i + VL);
        }
    for (; i + VL <= K; i += VL)
        for (int r = 0; r < 4; r++) a0[r] += vload(s + r * ld + i) * vload(k + i);
    float x[4] = {0.f, 0.f, 0.f, 0.f};
    for (int r = 0; r < 4; r++) a0[r] += a1[r];
    for (int l = 0; l < VL; l++)
        for (int r = 0; r < 4; r++) x[r] += a0[r][l];
    vf uv[4], acc[4];
    float u[4];
    const vf dv = (vf){0} + decay;
    for (int r = 0; r < 4; r++) {   /* the update and s.q, as gdn_delta_row */
        u[r] = beta * (ve[r] - decay * x[r]);
        uv[r] = (vf){0} + u[r];
        acc[r] = (vf){0};
    }
    i = 0;
    for (; i + VL <= K; i += VL)
        for (int r = 0; r < 4; r++) {
            const vf y = dv * vload(s + r * ld + i) + uv[r] * vload(k + i);
            memcpy(s + r * ld + i, &y, sizeof y);
            acc[r] += y * vload(q + i);
        }
    for (int r = 0; r < 4; r++) o[r] = 0.f;
    for (int l = 0; l < VL; l++)
        for (int r = 0; r < 4; r++) o[r] += acc[r][l];
}

float gdn_delta_row(float *s, const float *k, const float *q, int K, float decay, float beta, float ve) {
    const float u = beta * (ve - decay * gdn_dot(s, k, K));
    const vf dv = (vf){0} + decay, uv = (vf){0} + u;
    vf acc = (vf){0};
    int i = 0;
    for (; i + VL <= K; i += VL) {
        const vf x = dv * vload(s + i) + uv * vload(k + i);
        memcpy(s + i, &x, sizeof x);
        acc += x * vload(q + i);
    }
    float o = 0.f;
    for (int l = 0; l < VL; l++) o += acc[l];
    for (; i < K; i++) {
        s[i] = decay * s[i] + u * k[i];
        o += s[i] * q[i];
    }
    return o;
}
