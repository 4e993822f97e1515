/* The float64 reference of the GDN layer pieces: plain double loops, written
 * from the math in gdn.h, on the slice: the decode step on its first rows
 * (with or without the conv update), conv1d forward and backward, and the
 * gated RMSNorm forward and backward.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"

static double sigmoid_d(double x) { return 1.0 / (1.0 + exp(-x)); }
static double softplus_d(double x) { return x > 20 ? x : log1p(exp(x)); }

/* rows 0..c->B-1 of the decode step (conv update first when c->conv_W > 0);
 * st, cst: the rows' states after the step, in the pool's layout */
static void lref_decode(const gdn_decode_config *c, const layer_in *h, double *o, double *st, double *cst) {
    const int H = c->H, HV = c->HV, K = c->K, V = c->V, G = HV / H, D = gdn_decode_dim(c), W = c->conv_W;
    const int vf = (c->flags & GDN_STATE_V_FIRST) != 0;
    const double scale = c->scale != 0 ? c->scale : 1.0 / sqrt((double)K);
    const double bmul = (c->flags & GDN_BETA_NEGATIVE) ? 2.0 : 1.0;
    const size_t kv = (size_t)K * V;
    double *x = dalloc((size_t)D), *q = dalloc((size_t)K), *k = dalloc((size_t)K), *u = dalloc((size_t)V);
    for (int b = 0; b < c->B; b++) {
        const int64_t sl = h->slots[b];
        double *S = st + (size_t)b * HV * kv;
        for (size_t i = 0; i < HV * kv; i++) S[i] = h->pool[(size_t)sl * HV * kv + i];
        for (int d = 0; d < D; d++) x[d] = elem_get(c->dtype, h->mqkv, (size_t)b * D + d);
        if (W > 0) {   /* conv update: shift in the new input, y = silu(bias + weight . state) */
            double *cs = cst + (size_t)b * D * W;
            for (int i = 0; i < D * W; i++) cs[i] = h->cpool[(size_t)sl * D * W + i];
            for (int d = 0; d < D; d++) {
                double *sd = cs + (size_t)d * W, acc = h->cb[d];
                for (int w = 0; w + 1 < W; w++) sd[w] = sd[w + 1];
                sd[W - 1] = x[d];
                for (int w = 0; w < W; w++) acc += (double)h->cw[(size_t)d * W + w] * sd[w];
                x[d] = acc * sigmoid_d(acc);
            }
        }
        for (int j = 0; j < HV; j++) {
            const int hh = j / G;
            double qq = 0, kk = 0;
            for (int i = 0; i < K; i++) {
                q[i] = x[hh * K + i];
                k[i] = x[H * K + hh * K + i];
                qq += q[i] * q[i];
                kk += k[i] * k[i];
            }
            if (c->flags & GDN_QK_L2NORM) {
                const double rq = 1.0 / sqrt(qq + 1e-6), rk = 1.0 / sqrt(kk + 1e-6);
                for (int i = 0; i < K; i++) { q[i] *= rq; k[i] *= rk; }
            }
            const double *v = x + 2 * H * K + j * V;
            const double ga = elem_get(c->dtype, h->da, (size_t)b * HV + j), gb = elem_get(c->dtype, h->db, (size_t)b * HV + j);
            const double g = -exp((double)h->A_log[j]) * softplus_d(ga + (double)h->dt_bias[j]);
            const double beta = bmul * sigmoid_d(gb), decay = exp(g);
            double *Sj = S + (size_t)j * kv;
#define AT(i, e) Sj[vf ? (size_t)(e) * K + (i) : (size_t)(i) * V + (e)]
            for (size_t i = 0; i < kv; i++) Sj[i] *= decay;
            for (int e = 0; e < V; e++) {
                double dot = 0;
                for (int i = 0; i < K; i++) dot += AT(i, e) * k[i];
                u[e] = beta * (v[e] - dot);
            }
            for (int i = 0; i < K; i++)
                for (int e = 0; e < V; e++) AT(i, e) += k[i] * u[e];
            for (int e = 0; e < V; e++) {
                double dot = 0;
                for (int i = 0; i < K; i++) dot += AT(i, e) * q[i];
                o[((size_t)b * HV + j) * V + e] = scale * dot;
            }
#undef AT
        }
    }
    free(x); free(q); free(k); free(u);
}

/* conv1d forward and backward over the slice (every sequence of c):
 * xx[tau + W] is the input at token tau of the sequence, tau in -W..len-1,
 * tau < 0 from h0 (newest last); y[t] = silu(bias + sum_w weight[w] xx[t+1+w]),
 * ht[w] = xx[len + w]; backward through the same indices. */
static void lref_conv(const gdn_conv1d_config *c, const layer_in *h, lrefs *r) {
    const int D = c->D, W = c->W;
    const int64_t N = (int64_t)gdn_conv1d_seqs(c), T = c->T;
    const size_t nx = (size_t)(c->B * T) * D, nst = (size_t)N * D * W;
    r->cv_y = dalloc(nx); r->cv_dx = dalloc(nx); r->cv_ht = dalloc(nst); r->cv_dh0 = dalloc(nst);
    r->cv_dw = dalloc((size_t)D * W); r->cv_db = dalloc((size_t)D);
    for (int i = 0; i < D * W; i++) r->cv_dw[i] = 0;
    for (int d = 0; d < D; d++) r->cv_db[d] = 0;
    int64_t maxlen = 0;
    for (int64_t n = 0; n < N; n++) {
        const int64_t len = c->cu_seqlens ? c->cu_seqlens[n + 1] - c->cu_seqlens[n] : T;
        if (len > maxlen) maxlen = len;
    }
    double *xx = dalloc((size_t)(maxlen + W)), *dxx = dalloc((size_t)(maxlen + W)), *pre = dalloc((size_t)maxlen + 1);
    for (int64_t n = 0; n < N; n++) {
        const int64_t t0 = c->cu_seqlens ? c->cu_seqlens[n] : n * T;
        const int64_t len = c->cu_seqlens ? c->cu_seqlens[n + 1] - t0 : T;
        for (int d = 0; d < D; d++) {
            const size_t so = ((size_t)n * D + d) * W;
            const float *wd = h->cw + (size_t)d * W;
            for (int w = 0; w < W; w++) xx[w] = h->h0[so + w];
            for (int64_t t = 0; t < len; t++) xx[W + t] = elem_get(c->dtype, h->x, (size_t)(t0 + t) * D + d);
            for (int64_t t = 0; t < len; t++) {
                double acc = h->cb[d];
                for (int w = 0; w < W; w++) acc += (double)wd[w] * xx[t + 1 + w];
                pre[t] = acc;
                r->cv_y[(size_t)(t0 + t) * D + d] = acc * sigmoid_d(acc);
            }
            for (int w = 0; w < W; w++) r->cv_ht[so + w] = xx[len + w];
            /* backward */
            for (int64_t i = 0; i < len + W; i++) dxx[i] = 0;
            for (int w = 0; w < W; w++) dxx[len + w] += h->dht[so + w];
            for (int64_t t = 0; t < len; t++) {
                const double sg = sigmoid_d(pre[t]);
                const double dp = elem_get(c->dtype, h->dy, (size_t)(t0 + t) * D + d) * sg * (1.0 + pre[t] * (1.0 - sg));
                for (int w = 0; w < W; w++) {
                    dxx[t + 1 + w] += (double)wd[w] * dp;
                    r->cv_dw[(size_t)d * W + w] += dp * xx[t + 1 + w];
                }
                r->cv_db[d] += dp;
            }
            for (int64_t t = 0; t < len; t++) r->cv_dx[(size_t)(t0 + t) * D + d] = dxx[W + t];
            for (int w = 0; w < W; w++) r->cv_dh0[so + w] = dxx[w];
        }
    }
    free(xx); free(dxx); free(pre);
}

/* gated RMSNorm over the slice's rows: r = 1/sqrt(mean(x^2) + eps), n = x r,
 * y = n w gate(z); backward dx = r (dn - n mean(dn n)), dn = dy w gate(z),
 * dz = dy n w gate'(z), dw = sum over rows of dy n gate(z) */
static void lref_norm(const gdn_rmsnorm_config *c, const layer_in *h, lrefs *r) {
    const int V = c->V;
    const size_t n = (size_t)c->rows * V;
    r->nm_y = dalloc(n); r->nm_dx = dalloc(n); r->nm_dz = dalloc(n);
    r->nm_rstd = dalloc((size_t)c->rows); r->nm_dw = dalloc((size_t)V);
    double *nn = dalloc((size_t)V), *dn = dalloc((size_t)V);
    for (int e = 0; e < V; e++) r->nm_dw[e] = 0;
    for (int64_t row = 0; row < c->rows; row++) {
        const size_t o = (size_t)row * V;
        double ss = 0;
        for (int e = 0; e < V; e++) { const double x = elem_get(c->dtype, h->nx, o + e); ss += x * x; }
        const double rs = 1.0 / sqrt(ss / V + (double)c->eps);
        r->nm_rstd[row] = rs;
        double m = 0;
        for (int e = 0; e < V; e++) {
            const double x = elem_get(c->dtype, h->nx, o + e), z = elem_get(c->dtype, h->nz, o + e);
            const double dy = elem_get(c->dtype, h->ndy, o + e), w = h->nw[e], sg = sigmoid_d(z);
            const double gt = c->gate == GDN_NORM_GATE_SILU ? z * sg : sg;
            const double dgt = c->gate == GDN_NORM_GATE_SILU ? sg * (1.0 + z * (1.0 - sg)) : sg * (1.0 - sg);
            nn[e] = x * rs;
            r->nm_y[o + e] = nn[e] * w * gt;
            dn[e] = dy * w * gt;
            r->nm_dz[o + e] = dy * nn[e] * w * dgt;
            r->nm_dw[e] += dy * nn[e] * gt;
            m += dn[e] * nn[e];
        }
        m /= V;
        for (int e = 0; e < V; e++) r->nm_dx[o + e] = rs * (dn[e] - nn[e] * m);
    }
    free(nn); free(dn);
}

void lrefs_compute(const call *cs, const layer_in *h, unsigned ops, lrefs *r) {
    memset(r, 0, sizeof *r);
    for (int cv = 0; cv < 2; cv++) {
        if (!(ops & (1u << (cv ? OP_DECODE_CONV : OP_DECODE)))) continue;
        gdn_decode_config dc = cs->dec;
        dc.conv_W = cv ? CONV_W : 0;
        const size_t D = (size_t)gdn_decode_dim(&dc);
        r->dec_o[cv] = dalloc((size_t)dc.B * dc.HV * dc.V);
        r->dec_st[cv] = dalloc((size_t)dc.B * dc.HV * dc.K * dc.V);
        if (cv) r->dec_cst = dalloc((size_t)dc.B * D * CONV_W);
        lref_decode(&dc, h, r->dec_o[cv], r->dec_st[cv], cv ? r->dec_cst : NULL);
    }
    if (ops & ((1u << OP_CONV_FWD) | (1u << OP_CONV_BWD))) lref_conv(&cs->conv, h, r);
    if (ops & ((1u << OP_NORM_FWD) | (1u << OP_NORM_BWD))) lref_norm(&cs->norm, h, r);
}

void lrefs_free(lrefs *r) {
    double *p[] = {r->dec_o[0], r->dec_o[1], r->dec_st[0], r->dec_st[1], r->dec_cst, r->cv_y, r->cv_ht, r->cv_dx,
                   r->cv_dw, r->cv_db, r->cv_dh0, r->nm_y, r->nm_rstd, r->nm_dx, r->nm_dz, r->nm_dw};
    for (size_t i = 0; i < sizeof p / sizeof *p; i++) free(p[i]);
}
