/* What the API layer and the backends share, below both (not installed):
 * error reporting, dtype conversion, a validated call as the backends see it
 * (gdn_plan), the saved-for-backward layout, FTZ and fp32 scalar math.
 * Nothing here validates input; that is the API layer's (src/api/). */
#ifndef GDN_COMMON_H
#define GDN_COMMON_H

#include <stdint.h>
#include <stddef.h>
#include <math.h>
#include <string.h>
#include "gdn.h"
#if defined(__SSE2__)
#include <xmmintrin.h>
#endif
#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors (common/status.c) ---- */
gdn_status gdn_fail(gdn_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Clear the last error and return GDN_OK: the end of every successful call. */
gdn_status gdn_ok(void);

/* ---- dtype conversion (common/convert.c) ---- */
float gdn_bf16_to_f32(uint16_t h);
uint16_t gdn_f32_to_bf16(float f);   /* round to nearest even, NaN kept */
float gdn_f16_to_f32(uint16_t h);
uint16_t gdn_f32_to_f16(float f);    /* round to nearest even, overflow -> inf */
/* dst[i] = (float)src[off + i] for i < n */
void gdn_load(gdn_dtype t, const void *src, int64_t off, float *dst, int64_t n);
/* dst[off + i] = src[i] for i < n, rounded to t */
void gdn_store(gdn_dtype t, void *dst, int64_t off, const float *src, int64_t n);
/* one bf16 value to / from fp32, inline and branch-free so the loops that
 * use them vectorise; NaN kept quiet, round to nearest even */
static inline float gdn_bf16_f32(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t gdn_f32_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, q = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? q : r);
}
/* the bf16 rows of gdn_load / gdn_store, inline for callers that move short
 * rows (a call per 64-element row costs as much as its work) */
static inline void gdn_bf16_row_load(const uint16_t *s, float *d, int64_t n) {
    for (int64_t i = 0; i < n; i++) d[i] = gdn_bf16_f32(s[i]);
}
static inline void gdn_bf16_row_store(const float *s, uint16_t *d, int64_t n) {
    for (int64_t i = 0; i < n; i++) d[i] = gdn_f32_bf16(s[i]);
}
/* strided variants: element i is at off + i*stride */
void gdn_load_strided(gdn_dtype t, const void *src, int64_t off, int64_t stride, float *dst, int64_t n);
void gdn_store_strided(gdn_dtype t, void *dst, int64_t off, int64_t stride, const float *src, int64_t n);

/* ---- a validated call, as the backends see it ---- */
#define GDN_CHUNK 64
#define GDN_L2_EPS 1e-6f

typedef struct gdn_plan {
    gdn_config c;        /* copy of the caller's config, scale resolved       */
    int64_t N;           /* sequences                                         */
    int G;               /* HV / H                                            */
    int threads;         /* resolved CPU threads (>= 1)                       */
    int seq_split;       /* gdn_exec.seq_split                                 */
    int64_t max_len;     /* longest sequence                                  */
} gdn_plan;

/* Sequence n: first token row (flattened over B*T) and length. */
static inline void gdn_seq(const gdn_plan *p, int64_t n, int64_t *bos, int64_t *len) {
    if (p->c.cu_seqlens) { *bos = p->c.cu_seqlens[n]; *len = p->c.cu_seqlens[n + 1] - *bos; }
    else { *bos = n * p->c.T; *len = p->c.T; }
}

/* saved-for-backward layout: [rstd_q B*T*H][rstd_k B*T*H] with L2NORM, else
 * nothing; then, where gdn_saved_ckpts or gdn_saved_maps says, at the next 256
 * bytes a tag block (three ints, 256 bytes), then nck states [nck][N][HV][K][V]
 * fp32 in h0's layout: the CUDA forward's checkpoints for the backward's
 * windows (tag[0] says which windows they are, 0: none), then room for nmaps
 * segment slots of the CUDA forward's pass-1 maps for the backward's sequence
 * split ([nmaps][HV] x K x K, then [nmaps][HV] x K x V, fp32; tag[1] says for
 * which segment length, 0: none), then at the next 256 bytes room for nkeep
 * chunks a (sequence, value head) of the CUDA forward's states as the fused
 * backward's bf16 tiles (32 KB each) for the backward's last windows
 * (tag[2] says which, 0: none; src/cuda/chunk_bwd.cu kept_windows). The CPU
 * backend leaves them unused and zeroes the tags. */
typedef struct gdn_saved_layout {
    float *rstd_q, *rstd_k;
    int *ckpt_tag;   /* the tag block: [0] the checkpoints', [1] the maps', [2] the kept tiles' */
    float *ckpt;
    int nck;
    float *maps;
    int64_t nmaps;
    char *keep;      /* the kept state tiles, nkeep chunks a (sequence, value head) */
    int64_t nkeep;
} gdn_saved_layout;
size_t gdn_saved_bytes(const gdn_config *c);   /* common/saved.c */
gdn_saved_layout gdn_saved_at(const gdn_config *c, void *saved);
int gdn_saved_ckpts(const gdn_config *c);
int64_t gdn_saved_keep(const gdn_config *c);
int64_t gdn_saved_maps(const gdn_config *c);

/* Denormals flushed to zero inside the CPU kernels' threads, restored on
 * exit: a state under hard decay (g ~ -20) drifts into the denormal range,
 * where x86 arithmetic is ~100x slower; values below 1.2e-38 change nothing
 * at the tolerances of DESIGN.md. */
#if defined(__SSE2__)
static inline unsigned gdn_ftz_begin(void) { unsigned m = _mm_getcsr(); _mm_setcsr(m | 0x8040u); return m; }
static inline void gdn_ftz_end(unsigned m) { _mm_setcsr(m); }
#else
static inline unsigned gdn_ftz_begin(void) { return 0; }
static inline void gdn_ftz_end(unsigned m) { (void)m; }
#endif

/* scalar math shared by every path (fp32) */
static inline float gdn_softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }
static inline float gdn_sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

#ifdef __cplusplus
}
#endif
#endif
