/* float64 reference of the causal depthwise conv1d, literally. For sequence n
 * (tokens bos..bos+L-1) and channel d, the extended input is
 *     xx[s] = x[bos+s, d]          0 <= s < L
 *     xx[s] = h0[n, d, W+s]        -W <= s < 0   (0 without h0)
 * and
 *     z[t]  = bias[d] + sum_{w<W} weight[d,w] * xx[t-W+1+w]
 *     y[t]  = act(z[t]),   act = SiLU (z*sigmoid(z)) or identity
 *     ht[n, d, j] = xx[L-W+j]            (the last W inputs, newest last)
 * Reverse mode, dz[t] = dy[t] * act'(z[t]), act'(z) = s (1 + z (1 - s)):
 *     dweight[d,w] += dz[t] xx[t-W+1+w],  dbias[d] += dz[t],
 *     dxx[t-W+1+w] += dz[t] weight[d,w],  dxx[L-W+j] += dht[n,d,j],
 *     dx[bos+s, d] = dxx[s] (s >= 0),     dh0[n,d,W+s] = dxx[s] (s < 0). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "ref/ref_conv1d.h"

static double sigmoid(double z) { return 1.0 / (1.0 + exp(-z)); }
static double act(int silu, double z) { return silu ? z * sigmoid(z) : z; }
static double act_grad(int silu, double z) {
    if (!silu) return 1.0;
    const double s = sigmoid(z);
    return s * (1.0 + z * (1.0 - s));
}

static void *xcalloc(size_t n, size_t sz) {
    void *p = calloc(n ? n : 1, sz);
    if (!p) abort();
    return p;
}

static int64_t num_seqs(const gdn_conv1d_config *c) { return c->cu_seqlens ? c->num_seqs : c->B; }

static void seq_range(const gdn_conv1d_config *c, int64_t n, int64_t *bos, int64_t *len) {
    if (c->cu_seqlens) { *bos = c->cu_seqlens[n]; *len = c->cu_seqlens[n + 1] - *bos; }
    else { *bos = n * c->T; *len = c->T; }
}

/* xx[s + W] for s in -W..L-1 of sequence n, channel d */
static void extended(const gdn_conv1d_config *c, const double *x, const double *h0, int64_t n, int64_t bos,
                     int64_t L, int d, double *xx) {
    const int W = c->W, D = c->D;
    for (int s = -W; s < 0; s++) xx[s + W] = h0 ? h0[(n * D + d) * W + W + s] : 0.0;
    for (int64_t s = 0; s < L; s++) xx[s + W] = x[(bos + s) * D + d];
}

void gdn_ref_conv1d_fwd(const gdn_conv1d_config *c, const double *x, const double *weight,
                        const double *bias, const double *h0, double *y, double *ht) {
    const int W = c->W, D = c->D;
    const int64_t N = num_seqs(c);
    for (int64_t n = 0; n < N; n++) {
        int64_t bos, L;
        seq_range(c, n, &bos, &L);
        double *xx = xcalloc((size_t)(L + W), sizeof(double));
        for (int d = 0; d < D; d++) {
            extended(c, x, h0, n, bos, L, d, xx);
            for (int64_t t = 0; t < L; t++) {
                double z = bias ? bias[d] : 0.0;
                for (int w = 0; w < W; w++) z += weight[d * W + w] * xx[t - W + 1 + w + W];
                y[(bos + t) * D + d] = act(c->silu, z);
            }
            if (ht)
                for (int j = 0; j < W; j++) ht[(n * D + d) * W + j] = xx[L - W + j + W];
        }
        free(xx);
    }
}

void gdn_ref_conv1d_bwd(const gdn_conv1d_config *c, const double *x, const double *weight,
                        const double *bias, const double *h0, const double *dy, const double *dht,
                        double *dx, double *dweight, double *dbias, double *dh0) {
    const int W = c->W, D = c->D;
    const int64_t N = num_seqs(c);
    if (dweight) memset(dweight, 0, sizeof(double) * (size_t)D * W);
    if (dbias) memset(dbias, 0, sizeof(double) * (size_t)D);
    for (int64_t n = 0; n < N; n++) {
        int64_t bos, L;
        seq_range(c, n, &bos, &L);
        double *xx = xcalloc((size_t)(L + W), sizeof(double)), *dxx = xcalloc((size_t)(L + W), sizeof(double));
        for (int d = 0; d < D; d++) {
            extended(c, x, h0, n, bos, L, d, xx);
            memset(dxx, 0, sizeof(double) * (size_t)(L + W));
            for (int64_t t = 0; t < L; t++) {
                double z = bias ? bias[d] : 0.0;
                for (int w = 0; w < W; w++) z += weight[d * W + w] * xx[t - W + 1 + w + W];
                const double dz = dy[(bos + t) * D + d] * act_grad(c->silu, z);
                for (int w = 0; w < W; w++) {
                    if (dweight) dweight[d * W + w] += dz * xx[t - W + 1 + w + W];
                    dxx[t - W + 1 + w + W] += dz * weight[d * W + w];
                }
                if (dbias) dbias[d] += dz;
            }
            if (dht)
                for (int j = 0; j < W; j++) dxx[L - W + j + W] += dht[(n * D + d) * W + j];
            if (dx)
                for (int64_t s = 0; s < L; s++) dx[(bos + s) * D + d] = dxx[s + W];
            if (dh0)
                for (int s = -W; s < 0; s++) dh0[(n * D + d) * W + W + s] = dxx[s + W];
        }
        free(xx);
        free(dxx);
    }
}

void gdn_ref_conv1d_update(int64_t B, int D, int W, int silu, const double *x, const double *weight,
                           const double *bias, double *state, const int32_t *slots, double *y) {
    for (int64_t b = 0; b < B; b++) {
        const int64_t s = slots ? slots[b] : b;
        for (int d = 0; d < D; d++) {
            if (s < 0) { y[b * D + d] = 0.0; continue; }
            double *st = state + (s * D + d) * W;
            for (int w = 0; w + 1 < W; w++) st[w] = st[w + 1];
            st[W - 1] = x[b * D + d];
            double z = bias ? bias[d] : 0.0;
            for (int w = 0; w < W; w++) z += weight[d * W + w] * st[w];
            y[b * D + d] = act(silu, z);
        }
    }
}
