/* The gates of the CPU layer ops over rows of fp32: sigmoid, SiLU, and the
 * pair sigmoid(z), sigmoid(-z) from one exp. Plain loops over gdn_expf
 * (cpu/gemm.h) that the compiler vectorises (the library's C is built with
 * -fno-trapping-math for that). On the 2-core Zen 1 machine of bench/NOTES.md
 * v7 one SiLU costs ~1.4 ns per element and core whatever the form (a
 * reciprocal estimate + Newton step instead of the division was slower):
 * the gated layer ops are bound by it, not by memory. */
#ifndef GDN_CPU_ACT_H
#define GDN_CPU_ACT_H
#include <string.h>
#include "cpu/gemm.h"
#if defined(__AVX__)
#include <immintrin.h>
#endif

static inline float gdn_sigmoidf(float z) { return 1.f / (1.f + gdn_expf(-z)); }

/* z[i] = silu(z[i]) */
static inline void gdn_silu_rows(float *restrict z, int64_t n) {
    for (int64_t i = 0; i < n; i++) z[i] = z[i] / (1.f + gdn_expf(-z[i]));
}


/* s[i] = sigmoid(z[i]) and sn[i] = sigmoid(-z[i]) = exp(-z) s, from one exp:
 * sn formed as 1 - s would keep only eps / (1 - s) of its digits where the
 * gate saturates (s (1 - s) at z = 8: 1e-4) */
static inline void gdn_sigmoid_pair_rows(const float *restrict z, float *restrict s, float *restrict sn, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float e = gdn_expf(-z[i]), r = 1.f / (1.f + e);
        s[i] = r;
        sn[i] = e * r;
    }
}

/* ---- the same gates on the widest vectors of the build (gdn_av, GDN_AVL lanes) ----
 * For the bf16 rows of the layer ops, written out because gcc vectorises a
 * loop that mixes 16-bit and fp32 elements at half the vector width (8
 * lanes on AVX-512) and peels a short row's start for alignment. Every step
 * is the scalar code's (the polynomial's FMAs by contraction, the rounding
 * of k by the vector round instruction), so the results have the same bits. */
#if defined(__AVX512F__)
#define GDN_AVL 16
#elif defined(__AVX__)
#define GDN_AVL 8
#else
#define GDN_AVL 4
#endif
typedef float gdn_av __attribute__((vector_size(GDN_AVL * 4)));
typedef int32_t gdn_vi __attribute__((vector_size(GDN_AVL * 4)));
typedef uint32_t gdn_vu __attribute__((vector_size(GDN_AVL * 4)));
typedef uint16_t gdn_vh __attribute__((vector_size(GDN_AVL * 2)));

/* GDN_AVL bf16 values at p (any alignment) as fp32 */
static inline gdn_av gdn_bf16_load_v(const uint16_t *p) {
#if defined(__AVX512F__) && GDN_AVL == 16
    return (gdn_av)_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16);
#else
    gdn_vh h;
    memcpy(&h, p, sizeof h);
    return (gdn_av)(__builtin_convertvector(h, gdn_vu) << 16);
#endif
}

/* gdn_f32_bf16 of each lane, in the low 16 bits of a 32-bit lane */
static inline gdn_vu gdn_f32_bf16_u(gdn_av f) {
    const gdn_vu u = (gdn_vu)f;
    const gdn_vu r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, q = (u >> 16) | 0x40u;
    const gdn_vu nan = (gdn_vu)((u & 0x7fffffffu) > 0x7f800000u);
    return (q & nan) | (r & ~nan);
}
/* With AVX512-BF16 one vcvtneps2bf16: the same rounding and the same quiet
 * NaN, but denormal inputs flushed to zero, which no input here is: the CPU
 * kernels run with FTZ / DAZ (common/common.h), so their arithmetic forms
 * none. 13 instructions fewer a vector than the integer form, which bound
 * the gated RMSNorm (bench/NOTES.md v11). */
static inline void gdn_bf16_store_v(uint16_t *p, gdn_av f) {
#if defined(__AVX512BF16__) && GDN_AVL == 16
    _mm256_storeu_si256((__m256i *)p, (__m256i)_mm512_cvtneps_pbh((__m512)f));
#elif defined(__AVX512F__) && GDN_AVL == 16
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16((__m512i)gdn_f32_bf16_u(f)));
#else
    const gdn_vh h = __builtin_convertvector(gdn_f32_bf16_u(f), gdn_vh);
    memcpy(p, &h, sizeof h);
#endif
}

/* the same, by a streaming store where st (p then 32-byte aligned, GDN_AVL 16 with AVX512-BF16) */
static inline void gdn_bf16_store_stream_v(uint16_t *p, gdn_av f, int st) {
#if defined(__AVX512BF16__) && GDN_AVL == 16
    if (st) {
        _mm256_stream_si256((__m256i *)p, (__m256i)_mm512_cvtneps_pbh((__m512)f));
        return;
    }
#endif
    (void)st;
    gdn_bf16_store_v(p, f);
}

/* a * b + c rounded once in each lane, for chains whose order must hold:
 * the compiler contracts a sum of two products with either product */
static inline gdn_av gdn_fma_v(gdn_av a, gdn_av b, gdn_av c) {
#if defined(__AVX512F__) && GDN_AVL == 16
    return (gdn_av)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__) && GDN_AVL == 8
    return (gdn_av)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
    for (int l = 0; l < GDN_AVL; l++) c[l] = __builtin_fmaf(a[l], b[l], c[l]);
    return c;
#endif
}

static inline gdn_av gdn_select_v(gdn_vi m, gdn_av a, gdn_av b) { return (gdn_av)((m & (gdn_vi)a) | (~m & (gdn_vi)b)); }

/* x < lo ? lo : (x > hi ? hi : x) in each lane, NaN kept (as gdn_expf's
 * clamp): vmaxps / vminps return their second operand unless the first
 * compares greater / less */
static inline gdn_av gdn_clamp_v(gdn_av x, float lo, float hi) {
#if defined(__AVX512F__) && GDN_AVL == 16
    return (gdn_av)_mm512_min_ps(_mm512_set1_ps(hi), _mm512_max_ps(_mm512_set1_ps(lo), (__m512)x));
#elif defined(__AVX__) && GDN_AVL == 8
    return (gdn_av)_mm256_min_ps(_mm256_set1_ps(hi), _mm256_max_ps(_mm256_set1_ps(lo), (__m256)x));
#else
    x = gdn_select_v(x < lo, (gdn_av){0} + lo, x);
    return gdn_select_v(x > hi, (gdn_av){0} + hi, x);
#endif
}

/* rint of each lane, to nearest even (as __builtin_rintf in gdn_expf) */
static inline gdn_av gdn_rint_v(gdn_av t) {
#if defined(__AVX512F__) && GDN_AVL == 16
    return (gdn_av)_mm512_roundscale_ps((__m512)t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#elif defined(__AVX__) && GDN_AVL == 8
    return (gdn_av)_mm256_round_ps((__m256)t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
    for (int l = 0; l < GDN_AVL; l++) t[l] = __builtin_rintf(t[l]);
    return t;
#endif
}

static inline gdn_av gdn_expf_v(gdn_av x);
/* silu and sigmoid of each lane, as gdn_silu_rows and gdn_sigmoidf */
static inline gdn_av gdn_expf_silu_neg_v(gdn_av z);
static inline gdn_av gdn_silu_v(gdn_av z) { return z / (1.f + gdn_expf_silu_neg_v(z)); }
static inline gdn_av gdn_sigmoid_v(gdn_av z) { return 1.f / (1.f + gdn_expf_v(-z)); }

/* exp(r) on the reduced range, gdn_expf's polynomial */
static inline gdn_av gdn_expf_poly_r_v(gdn_av r) {
    gdn_av p = r * 0.008290315046906471f + 0.04189793020486832f;
    p = p * r + 0.1666763573884964f;
    p = p * r + 0.4999915063381195f;
    p = p * r + 0.9999997019767761f;
    return p * r + 1.0f;
}
/* exp(x) = p 2^k from x clamped to [-87, 88], as gdn_expf forms them */
static inline gdn_av gdn_expf_poly_v(gdn_av x, gdn_av *kout) {
    const gdn_av xc = gdn_clamp_v(x, -87.0f, 88.0f);
    const gdn_av k = gdn_rint_v(xc * 1.44269504088896341f);
    gdn_av r = k * -0.693145751953125f + xc;
    r = k * -1.428606765330187e-06f + r;
    *kout = k;
    return gdn_expf_poly_r_v(r);
}

/* gdn_expf of each lane */
static inline gdn_av gdn_expf_v(gdn_av x) {
    const gdn_vi under = x < -87.0f;
    gdn_av k;
    const gdn_av p = gdn_expf_poly_v(x, &k);
    const gdn_av s = (gdn_av)((__builtin_convertvector(k, gdn_vi) + 127) << 23);
    return (gdn_av)(~under & (gdn_vi)(p * s));
}

/* gdn_expf_v(-z) where only 1 + exp(-z) is used (SiLU and its derivative):
 * where exp(-z) < 2^-24, 1 + exp(-z) = 1 whatever it is, so no mask; 2^k
 * applied by vscalefps (exact, as the product with the exact power of two).
 * The same bits as 1 + gdn_expf(-z) for every non-NaN z. With AVX512DQ, z
 * clamped to [-88, 88] by one vrangeps (the smaller magnitude of z and 88,
 * z's sign; below -87 gdn_expf's zero and exp(-88) both leave 1) and -z taken
 * inside the reduction's products: the clamp's max, min and the negation they
 * kept were ~1/8 of the SiLU's time (bench/NOTES.md CPU v23). The clamp
 * stays: past 2^23 the reduction's k is no longer exact and r, p would be
 * garbage. A NaN z gives 1 + exp(+-88) there, not NaN: the callers' results
 * stay NaN through z itself. */
static inline gdn_av gdn_expf_silu_neg_v(gdn_av z) {
#if defined(__AVX512DQ__) && GDN_AVL == 16
    const gdn_av zc = (gdn_av)_mm512_range_ps((__m512)z, _mm512_set1_ps(88.0f), 0x02);
    const gdn_av k = gdn_rint_v(zc * -1.44269504088896341f);
    gdn_av r = k * -0.693145751953125f - zc;
    r = k * -1.428606765330187e-06f + r;
    return (gdn_av)_mm512_scalef_ps((__m512)gdn_expf_poly_r_v(r), (__m512)k);
#elif defined(__AVX512F__) && GDN_AVL == 16
    gdn_av k;
    const gdn_av p = gdn_expf_poly_v(-z, &k);
    return (gdn_av)_mm512_scalef_ps((__m512)p, (__m512)k);
#else
    return gdn_expf_v(-z);
#endif
}


#if defined(__AVX512DQ__) && GDN_AVL == 16
/* exp(-z) = 2^f 2^floor(t) with t = -z log2(e) (*t) and f = t - floor(t) in
 * [0, 1) (returned, one vreduceps); the callers take 2^f by a polynomial
 * and 2^floor(t) by vscalefps(2^f, t) */
static inline gdn_av gdn_exp_neg_split_v(gdn_av z, __m512 *t) {
    *t = _mm512_mul_ps((__m512)z, _mm512_set1_ps(-1.44269504088896341f));
    return (gdn_av)_mm512_reduce_ps(*t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
}
#endif

/* 1 + exp(-z) as the conv1d backward's sigmoid takes it (bf16 inputs),
 * in fewer steps than gdn_expf_silu_neg_v and not its bits: t = -z log2(e),
 * f = t - floor(t) in [0, 1) by one vreduceps, 2^f by a degree-4
 * polynomial (relative error 2.7e-6 evaluated in fp32, ~1/1500 of a bf16
 * input's rounding), 2^floor(t) by vscalefps; no clamp (vscalefps gives 0
 * and inf past the range, so the sigmoid's 1 / (1 + e) gives 1 and 0). t's
 * own rounding adds |t| 2^-24 ln 2 (at most 5e-6 at |t| = 127, where the
 * sigmoid is within 1e-38 of 0 or 1). 8 instructions where
 * gdn_expf_silu_neg_v has 11: the conv1d backward -7 % (bench/NOTES.md CPU
 * v25). Without AVX512DQ it is gdn_expf_silu_neg_v. */
static inline gdn_av gdn_exp_silu_neg_fast_v(gdn_av z) {
#if defined(__AVX512DQ__) && GDN_AVL == 16
    __m512 t;
    const gdn_av f = gdn_exp_neg_split_v(z, &t);
    gdn_av p = f * 0.013534167781472206f + 0.05201146379113197f;
    p = p * f + 0.2414427548646927f;
    p = p * f + 0.6930038332939148f;
    p = p * f + 1.0000026226043701f;
    return (gdn_av)_mm512_scalef_ps((__m512)p, t);
#else
    return gdn_expf_silu_neg_v(z);
#endif
}

/* silu(z) for a result rounded to bf16 (the conv1d forward's bf16 rows):
 * z r, r = vrcp14ps(1 + e), e = exp(-z) as gdn_exp_silu_neg_fast_v forms it
 * (t = -z log2(e), 2^(t - floor(t)) by a polynomial, 2^floor(t) by
 * vscalefps) with the polynomial of degree 3 (relative error 7.5e-5), no
 * division. Relative error below 1.4e-4 (with r's 2^-14), 1/14 of bf16's
 * half ulp (2^-9): the rounded result is the exact one's but near ties; not
 * gdn_silu_v's bits. Past the range e is inf (r = 0: silu -> -0, where
 * gdn_silu_v's clamp gives z / (1 + e^88), -6e-9 at z = -1e30) or 0 (r ~ 1:
 * silu -> z within the bound, +inf at +inf); a NaN z stays NaN and -inf
 * gives NaN (-inf x 0, as IEEE's silu). The division and the
 * clamped exp were 40 % of the forward's time (bench/NOTES.md CPU v27).
 * Without AVX512DQ it is gdn_silu_v. */
static inline gdn_av gdn_silu_bf16_v(gdn_av z) {
#if defined(__AVX512DQ__) && GDN_AVL == 16
    __m512 t;
    const gdn_av f = gdn_exp_neg_split_v(z, &t);
    gdn_av p = f * 0.07802452147006989f + 0.22606715559959412f;
    p = p * f + 0.6958335638046265f;
    p = p * f + 0.9999251961708069f;
    return z * (gdn_av)_mm512_rcp14_ps((__m512)(1.f + (gdn_av)_mm512_scalef_ps((__m512)p, t)));
#else
    return gdn_silu_v(z);
#endif
}

#endif
