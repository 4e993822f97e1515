#include <string.h>
#include "cpu/gemm.h"
#include "cpu/load.h"

void gdn_cpu_load_qk(const gdn_plan *p, const void *x, int64_t r0, int c, int h, float *dst,
                     const float *rstd_in, float *rstd_out) {
    const int K = p->c.K, H = p->c.H;
    for (int t = 0; t < c; t++) {
        float *row = dst + (int64_t)t * K;
        gdn_load(p->c.dtype, x, ((r0 + t) * H + h) * K, row, K);
        if (!(p->c.flags & GDN_QK_L2NORM)) continue;
        float r;
        if (rstd_in) r = rstd_in[(r0 + t) * H + h];
        else {
            r = 1.0f / sqrtf(gdn_dot(row, row, K) + GDN_L2_EPS);
            if (rstd_out) rstd_out[(r0 + t) * H + h] = r;
        }
        for (int i = 0; i < K; i++) row[i] *= r;
    }
}

void gdn_cpu_load_v(const gdn_plan *p, const void *v, int64_t r0, int c, int j, float *dst) {
    const int V = p->c.V, HV = p->c.HV;
    for (int t = 0; t < c; t++) gdn_load(p->c.dtype, v, ((r0 + t) * HV + j) * V, dst + (int64_t)t * V, V);
}

void gdn_cpu_load_gate(const gdn_plan *p, const void *g, const float *A_log, const float *dt_bias,
                       int64_t r0, int c, int j, float *dst) {
    if (!g) { memset(dst, 0, (size_t)c * sizeof(float)); return; }
    gdn_load_strided(p->c.gate_dtype, g, r0 * p->c.HV + j, p->c.HV, dst, c);
    if (!(p->c.flags & GDN_GATE_FUSED)) return;
    const float A = -expf(A_log[j]), bias = dt_bias ? dt_bias[j] : 0.f;
    for (int t = 0; t < c; t++) dst[t] = A * gdn_softplus(dst[t] + bias);
}

void gdn_cpu_load_beta(const gdn_plan *p, const void *b, int64_t r0, int c, int j, float *dst) {
    gdn_load_strided(p->c.gate_dtype, b, r0 * p->c.HV + j, p->c.HV, dst, c);
    if (!(p->c.flags & GDN_BETA_SIGMOID)) return;
    const float m = (p->c.flags & GDN_BETA_NEGATIVE) ? 2.f : 1.f;
    for (int t = 0; t < c; t++) dst[t] = m * gdn_sigmoid(dst[t]);
}

static void prefetch_rows(const void *x, size_t esz, int64_t r0, int c, int64_t row_elems, int64_t off, int n,
                          int write) {
    const char *base = (const char *)x + (size_t)(r0 * row_elems + off) * esz;
    const size_t bytes = (size_t)n * esz, stride = (size_t)row_elems * esz;
    for (int t = 0; t < c; t++)
        for (size_t b = 0; b < bytes; b += 64) {
            if (write) __builtin_prefetch(base + t * stride + b, 1, 2);
            else __builtin_prefetch(base + t * stride + b, 0, 2);
        }
}

void gdn_cpu_prefetch_chunk(const gdn_plan *p, const void *q, const void *k, const void *v,
                            const void *o, int64_t r0, int c, int h, int j) {
    const size_t es = gdn_dtype_size(p->c.dtype);
    const int64_t qrow = (int64_t)p->c.H * p->c.K, vrow = (int64_t)p->c.HV * p->c.V;
    if (q) prefetch_rows(q, es, r0, c, qrow, (int64_t)h * p->c.K, p->c.K, 0);
    if (k) prefetch_rows(k, es, r0, c, qrow, (int64_t)h * p->c.K, p->c.K, 0);
    if (v) prefetch_rows(v, es, r0, c, vrow, (int64_t)j * p->c.V, p->c.V, 0);
    if (o) prefetch_rows(o, es, r0, c, vrow, (int64_t)j * p->c.V, p->c.V, 1);
}

/* dst [cols][rows] = src [rows][cols] transposed, in 8 x 8 tiles (a tile's
 * rows read and written whole, so each touches 8 lines each way: the
 * element-by-element form writes a new line every element). A tile is
 * transposed in registers by three rounds of two-vector shuffles (GCC and
 * Clang vector extensions; plain loops elsewhere). */
#if defined(__GNUC__)
typedef float v8f __attribute__((vector_size(32), aligned(4)));
typedef int v8i __attribute__((vector_size(32)));
#if defined(__clang__)
#define SHUF(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define SHUF(a, b, ...) __builtin_shuffle(a, b, (v8i){__VA_ARGS__})
#endif
static inline void tile8(const float *src, int64_t ls, float *dst, int64_t ld) {
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
#else
static inline void tile8(const float *src, int64_t ls, float *dst, int64_t ld) {
    for (int c = 0; c < 8; c++)
        for (int r = 0; r < 8; r++) dst[c * ld + r] = src[r * ls + c];
}
#endif

static void transpose(const float *restrict src, int rows, int cols, float *restrict dst) {
    int r0 = 0;
    for (; r0 + 8 <= rows; r0 += 8) {
        int c0 = 0;
        for (; c0 + 8 <= cols; c0 += 8) tile8(src + (int64_t)r0 * cols + c0, cols, dst + (int64_t)c0 * rows + r0, rows);
        for (; c0 < cols; c0++)
            for (int r = r0; r < r0 + 8; r++) dst[(int64_t)c0 * rows + r] = src[(int64_t)r * cols + c0];
    }
    for (; r0 < rows; r0++)
        for (int c = 0; c < cols; c++) dst[(int64_t)c * rows + r0] = src[(int64_t)r0 * cols + c];
}

void gdn_cpu_load_state(const gdn_plan *p, const float *src, int64_t n, int j, float *S) {
    const int K = p->c.K, V = p->c.V;
    if (!src) { memset(S, 0, (size_t)K * V * sizeof(float)); return; }
    const float *s = src + (n * p->c.HV + j) * (int64_t)K * V;
    if (!(p->c.flags & GDN_STATE_V_FIRST)) { memcpy(S, s, (size_t)K * V * sizeof(float)); return; }
    transpose(s, V, K, S);   /* s [V][K] -> S [K][V] */
}

void gdn_cpu_store_state(const gdn_plan *p, float *dst, int64_t n, int j, const float *S) {
    const int K = p->c.K, V = p->c.V;
    float *d = dst + (n * p->c.HV + j) * (int64_t)K * V;
    if (!(p->c.flags & GDN_STATE_V_FIRST)) { memcpy(d, S, (size_t)K * V * sizeof(float)); return; }
    transpose(S, K, V, d);   /* S [K][V] -> d [V][K] */
}
