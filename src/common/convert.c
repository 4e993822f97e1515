/* f32 <-> bf16 / f16 conversion, round to nearest even. Written out by hand
 * so the library needs no compiler support for half types. */
#include <string.h>
#if defined(__F16C__)
#include <immintrin.h>
#endif
#include "common/common.h"

static inline uint32_t bits_of(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float float_of(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float gdn_bf16_to_f32(uint16_t h) { return float_of((uint32_t)h << 16); }

uint16_t gdn_f32_to_bf16(float f) {
    uint32_t u = bits_of(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float gdn_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) return float_of(sign | 0x7f800000u | (man << 13));       /* inf, NaN */
    if (exp == 0) {                                                          /* zero, subnormal */
        float m = (float)man * (1.0f / 16777216.0f);                         /* man * 2^-24 */
        return sign ? -m : m;
    }
    return float_of(sign | ((exp + 112u) << 23) | (man << 13));
}

uint16_t gdn_f32_to_f16(float f) {
    uint32_t u = bits_of(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u;                 /* NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00u;                /* >= 65520 rounds to inf */
    if (a < 0x38800000u) {                                      /* below 2^-14: subnormal */
        /* value * 2^24 rounded to an integer, nearest even: the float adder does it */
        float v = float_of(a) * 16777216.0f;                    /* exact: scales by 2^24 */
        float r = v + 12582912.0f - 12582912.0f;                /* 1.5*2^23 rounds to integer */
        return sign | (uint16_t)(uint32_t)r;
    }
    uint32_t e = ((a >> 23) - 112u) << 10, m = (a >> 13) & 0x3ffu;
    uint32_t h = e | m, rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;  /* carry may bump the exponent: fine */
    return sign | (uint16_t)h;
}

void gdn_load_strided(gdn_dtype t, const void *src, int64_t off, int64_t stride, float *dst, int64_t n) {
    switch (t) {
    case GDN_F32: { const float *s = (const float *)src + off;
        for (int64_t i = 0; i < n; i++) dst[i] = s[i * stride];
        break; }
    case GDN_BF16: { const uint16_t *s = (const uint16_t *)src + off;
        for (int64_t i = 0; i < n; i++) dst[i] = gdn_bf16_to_f32(s[i * stride]);
        break; }
    case GDN_F16: { const uint16_t *s = (const uint16_t *)src + off;
        for (int64_t i = 0; i < n; i++) dst[i] = gdn_f16_to_f32(s[i * stride]);
        break; }
    }
}

void gdn_store_strided(gdn_dtype t, void *dst, int64_t off, int64_t stride, const float *src, int64_t n) {
    switch (t) {
    case GDN_F32: { float *d = (float *)dst + off;
        for (int64_t i = 0; i < n; i++) d[i * stride] = src[i];
        break; }
    case GDN_BF16: { uint16_t *d = (uint16_t *)dst + off;
        for (int64_t i = 0; i < n; i++) d[i * stride] = gdn_f32_to_bf16(src[i]);
        break; }
    case GDN_F16: { uint16_t *d = (uint16_t *)dst + off;
        for (int64_t i = 0; i < n; i++) d[i * stride] = gdn_f32_to_f16(src[i]);
        break; }
    }
}

/* Contiguous rows: f16 through the F16C unit where the build has it (the
 * portable bit conversion above branches per element and does not
 * vectorise), bf16 as a vectorisable shift. Same results as the scalar code. */
void gdn_load(gdn_dtype t, const void *src, int64_t off, float *dst, int64_t n) {
    int64_t i = 0;
    if (t == GDN_F32) { memcpy(dst, (const float *)src + off, (size_t)n * sizeof(float)); return; }
    const uint16_t *s = (const uint16_t *)src + off;
    if (t == GDN_BF16) { gdn_bf16_row_load(s, dst, n); return; }
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
#endif
    for (; i < n; i++) dst[i] = gdn_f16_to_f32(s[i]);
}

void gdn_store(gdn_dtype t, void *dst, int64_t off, const float *src, int64_t n) {
    int64_t i = 0;
    if (t == GDN_F32) { memcpy((float *)dst + off, src, (size_t)n * sizeof(float)); return; }
    uint16_t *d = (uint16_t *)dst + off;
    if (t == GDN_BF16) { gdn_bf16_row_store(src, d, n); return; }   /* gdn_f32_to_bf16, branch-free */
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) d[i] = gdn_f32_to_f16(src[i]);
}
