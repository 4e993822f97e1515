/* Small dense matrix products for the CPU chunk kernels (row-major fp32). */
#ifndef GDN_CPU_GEMM_H
#define GDN_CPU_GEMM_H
#include <stdint.h>

/* C[M,N] = alpha * op(A)[M,Kd] * op(B)[Kd,N] + (accumulate ? C : 0)
 * op(A)[i][p] = ta ? A[p*lda + i] : A[i*lda + p]; likewise op(B)[p][j] with tb.
 * Single-threaded; the callers parallelise over heads and sequences. */
void gdn_gemm(int M, int N, int Kd, float alpha,
              const float *A, int64_t lda, int ta,
              const float *B, int64_t ldb, int tb,
              int accumulate, float *C, int64_t ldc);

/* The same, skipping work that structure makes zero or unneeded (square
 * triangular factors inside a chunk): */
enum {
    GDN_TRI_LOWER_A = 1,  /* op(A)[i][p] = 0 for p > i: row i sums p <= i only        */
    GDN_TRI_UPPER_A = 2,  /* op(A)[i][p] = 0 for p < i: row i sums p >= i only        */
    GDN_TRI_LOWER_C = 4   /* only C[i][j], j <= i is wanted; blocks right of it skipped
                             (elements above the diagonal inside a block are garbage) */
};
void gdn_gemm_tri(int tri, int M, int N, int Kd, float alpha,
                  const float *A, int64_t lda, int ta,
                  const float *B, int64_t ldb, int tb,
                  int accumulate, float *C, int64_t ldc);

/* dst[p*ld + j] = src[j*ls + p] for j < nj, p < np: src's nj rows of np
 * floats become dst's np rows of nj, in register tiles */
void gdn_transpose(const float *src, int64_t ls, int nj, int np, float *dst, int64_t ld);

#endif

/* the build's float vector (AVX-512: 16 lanes, else 8) */
#if defined(__AVX512F__)
#define GDN_VL 16
#else
#define GDN_VL 8
#endif
typedef float gdn_vf __attribute__((vector_size(GDN_VL * 4)));

/* sum_i a[i]*b[i] with vector accumulators (fixed order for a given n) */
float gdn_dot(const float *a, const float *b, int n);

/* One value column of a state kept v-first (s = S[:, e], K floats in a row)
 * through one token of the delta rule, in two passes over the row:
 *     s = decay s;  u = beta (v_e - s.k);  s += u k;  returns s.q
 * (q is read after the update; the caller scales it) */
float gdn_delta_row(float *s, const float *k, const float *q, int K, float decay, float beta, float ve);
/* gdn_delta_row of four rows s + r ld (r < 4), values ve[r], results into
 * o[r]: each row's sums in gdn_delta_row's order (the same bits), the rows'
 * dependent lane sums interleaved (K a whole number of vectors; else row by row) */
void gdn_delta_rows4(float *s, int64_t ld, const float *k, const float *q, int K, float decay, float beta, const float *ve, float *o);

/* exp(x) to 2.8 ulp (every float in (-87, 88) against double exp), written
 * so that loops over it vectorise (libm's expf does not without
 * -ffast-math). Results below 2^-126 are 0; x is meant to be <= 0 (decays)
 * and is clamped at 88 above. exp(r) on |r| <= ln2 / 2 is 1 + r q(r), q of
 * degree 4 fitted for the least largest relative error (exp(0) = 1 exactly):
 * one FMA fewer than the degree-6 Taylor polynomial it replaces (3.9 ulp),
 * which bound the SiLU of the gated layer ops (bench/NOTES.md CPU v23). */
static inline float gdn_expf(float x) {
    const float xc = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float k = __builtin_rintf(xc * 1.44269504088896341f);
    float r = __builtin_fmaf(k, -0.693145751953125f, xc);
    r = __builtin_fmaf(k, -1.428606765330187e-06f, r);
    float p = 0.008290315046906471f;
    p = __builtin_fmaf(p, r, 0.04189793020486832f);
    p = __builtin_fmaf(p, r, 0.1666763573884964f);
    p = __builtin_fmaf(p, r, 0.4999915063381195f);
    p = __builtin_fmaf(p, r, 0.9999997019767761f);
    p = __builtin_fmaf(p, r, 1.0f);
    union { uint32_t i; float f; } s = { (uint32_t)((int)k + 127) << 23 };
    return x < -87.0f ? 0.0f : p * s.f;
}
