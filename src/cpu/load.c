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

void gdn_cpu_load_state(const gdn_plan *p, const float *src, int64_t n, int j, float *S) {
    const int K = p->c.K, V = p->c.V;
    if (!src) { memset(S, 0, (size_t)K * V * sizeof(float)); return; }
    const float *s = src + (n * p->c.HV + j) * (int64_t)K * V;
    if (!(p->c.flags & GDN_STATE_V_FIRST)) { memcpy(S, s, (size_t)K * V * sizeof(float)); return; }
    gdn_transpose(s, K, V, K, S, V);   /* s [V][K] -> S [K][V] */
}

void gdn_cpu_store_state(const gdn_plan *p, float *dst, int64_t n, int j, const float *S) {
    const int K = p->c.K, V = p->c.V;
    float *d = dst + (n * p->c.HV + j) * (int64_t)K * V;
    if (!(p->c.flags & GDN_STATE_V_FIRST)) { memcpy(d, S, (size_t)K * V * sizeof(float)); return; }
    gdn_transpose(S, V, K, V, d, K);   /* S [K][V] -> d [V][K] */
}
