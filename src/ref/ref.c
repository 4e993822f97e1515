/* float64 reference for the gated delta rule (DESIGN.md §2), literally, token by
 * token; and its reverse mode. Plain loops, no cleverness: this file is what
 * every fast path is checked against.
 *
 * Per sequence n and value head j (q/k head h = j / G), for t in the sequence:
 *     Sa  = exp(g_t) * S                       (decay)
 *     w   = Sa^T k_t                            (V)
 *     u   = beta_t * (v_t - w)                  (V)
 *     S   = Sa + k_t u^T                        (K x V)
 *     o_t = scale * S^T q_t                     (V)
 * with the optional in-kernel pre-processing
 *     q^ = q / sqrt(sum q^2 + 1e-6), k^ likewise          (GDN_QK_L2NORM)
 *     g  = -exp(A_log[j]) * softplus(a + dt_bias[j])       (GDN_GATE_FUSED)
 *     beta = sigmoid(b), or 2*sigmoid(b)                   (GDN_BETA_SIGMOID[/NEGATIVE])
 * The state is held internally as [K][V]; h0/ht/dht/dh0 may be [V][K]
 * (GDN_STATE_V_FIRST). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "ref/ref.h"

#define L2_EPS 1e-6

/* ---- scalar pieces ---- */

double gdn_ref_softplus(double x) { return x > 20.0 ? x : log1p(exp(x)); }
static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
/* d softplus / dx, consistent with the x > 20 branch of softplus */
static double softplus_grad(double x) { return x > 20.0 ? 1.0 : sigmoid(x); }

static void *xcalloc(size_t n, size_t sz) {
    void *p = calloc(n ? n : 1, sz);
    if (!p) abort();
    return p;
}

/* ---- shape helpers ---- */

static double resolved_scale(const gdn_config *c) {
    return c->scale == 0.f ? 1.0 / sqrt((double)c->K) : (double)c->scale;
}

static int64_t num_seqs(const gdn_config *c) { return c->cu_seqlens ? c->num_seqs : c->B; }

static void seq_range(const gdn_config *c, int64_t n, int64_t *bos, int64_t *len) {
    if (c->cu_seqlens) { *bos = c->cu_seqlens[n]; *len = c->cu_seqlens[n + 1] - c->cu_seqlens[n]; }
    else { *bos = n * c->T; *len = c->T; }
}

/* Index of state element (i in K, c in V) of (n, j) in the caller's layout. */
static size_t state_index(const gdn_config *c, int64_t n, int j, int i, int col) {
    size_t base = (size_t)(n * c->HV + j) * (size_t)c->K * (size_t)c->V;
    if (c->flags & GDN_STATE_V_FIRST) return base + (size_t)col * c->K + i;
    return base + (size_t)i * c->V + col;
}

/* ---- per-token pre-processing (forward) ---- */

/* Effective g and beta of token r, value head j. */
static double eff_g(const gdn_config *c, const gdn_ref_inputs *in, int64_t r, int j) {
    if (!in->g) return 0.0;
    double x = in->g[r * c->HV + j];
    if (!(c->flags & GDN_GATE_FUSED)) return x;
    double bias = in->dt_bias ? in->dt_bias[j] : 0.0;
    return -exp(in->A_log[j]) * gdn_ref_softplus(x + bias);
}

static double eff_beta(const gdn_config *c, const gdn_ref_inputs *in, int64_t r, int j) {
    double b = in->beta[r * c->HV + j];
    if (!(c->flags & GDN_BETA_SIGMOID)) return b;
    return ((c->flags & GDN_BETA_NEGATIVE) ? 2.0 : 1.0) * sigmoid(b);
}

/* dst = x (K values), l2-normalized when GDN_QK_L2NORM. */
static void eff_qk(const gdn_config *c, const double *x, double *dst) {
    const int K = c->K;
    if (c->flags & GDN_QK_L2NORM) {
        double ss = 0.0;
        for (int i = 0; i < K; i++) ss += x[i] * x[i];
        double rs = 1.0 / sqrt(ss + L2_EPS);
        for (int i = 0; i < K; i++) dst[i] = x[i] * rs;
    } else {
        for (int i = 0; i < K; i++) dst[i] = x[i];
    }
}

/* ---- forward ---- */

static void fwd(const gdn_config *c, const gdn_ref_inputs *in, double *o, double *ht, double *o_terms2) {
    const int H = c->H, HV = c->HV, K = c->K, V = c->V, G = HV / H;
    const double scale = resolved_scale(c);
    double *S = xcalloc((size_t)K * V, sizeof(double));
    double *q = xcalloc(K, sizeof(double)), *k = xcalloc(K, sizeof(double));
    double *u = xcalloc(V, sizeof(double));
    for (int64_t n = 0; n < num_seqs(c); n++) {
        int64_t bos, len;
        seq_range(c, n, &bos, &len);
        for (int j = 0; j < HV; j++) {
            const int h = j / G;
            for (int i = 0; i < K; i++)
                for (int col = 0; col < V; col++)
                    S[i * V + col] = in->h0 ? in->h0[state_index(c, n, j, i, col)] : 0.0;
            for (int64_t t = 0; t < len; t++) {
                const int64_t r = bos + t;
                eff_qk(c, in->q + (r * H + h) * K, q);
                eff_qk(c, in->k + (r * H + h) * K, k);
                const double *v = in->v + (r * HV + j) * V;
                const double decay = exp(eff_g(c, in, r, j));
                const double beta = eff_beta(c, in, r, j);
                /* S = exp(g) S */
                for (int e = 0; e < K * V; e++) S[e] *= decay;
                /* u = beta (v - S^T k) */
                for (int col = 0; col < V; col++) {
                    double w = 0.0;
                    for (int i = 0; i < K; i++) w += S[i * V + col] * k[i];
                    u[col] = beta * (v[col] - w);
                }
                /* S = S + k u^T */
                for (int i = 0; i < K; i++)
                    for (int col = 0; col < V; col++) S[i * V + col] += k[i] * u[col];
                /* o = scale S^T q */
                double *ot = o + (r * HV + j) * V;
                for (int col = 0; col < V; col++) {
                    double acc = 0.0, acc2 = 0.0;
                    for (int i = 0; i < K; i++) {
                        const double term = S[i * V + col] * q[i];
                        acc += term;
                        acc2 += term * term;
                    }
                    ot[col] = scale * acc;
                    if (o_terms2) o_terms2[(r * HV + j) * V + col] = scale * scale * acc2;
                }
            }
            if (ht)
                for (int i = 0; i < K; i++)
                    for (int col = 0; col < V; col++) ht[state_index(c, n, j, i, col)] = S[i * V + col];
        }
    }
    free(S); free(q); free(k); free(u);
}

void gdn_ref_fwd(const gdn_config *c, const gdn_ref_inputs *in, double *o, double *ht) { fwd(c, in, o, ht, NULL); }

void gdn_ref_fwd_terms(const gdn_config *c, const gdn_ref_inputs *in, double *o, double *ht, double *o_terms2) {
    fwd(c, in, o, ht, o_terms2);
}

/* ---- backward ---- */

static void bwd(const gdn_config *c, const gdn_ref_inputs *in,
                const double *dout, const double *dht,
                double *dq_out, double *dk_out, double *dv_out, double *dg_out, double *dbeta_out,
                double *dA_log_out, double *ddt_bias_out, double *dh0_out, double *dh0_terms2,
                double *dg_terms2, double *dbeta_terms2) {
    const int H = c->H, HV = c->HV, K = c->K, V = c->V, G = HV / H;
    const double scale = resolved_scale(c);
    const int64_t rows = c->B * c->T;
    const size_t KV = (size_t)K * V;

    /* gradients w.r.t. the effective (normalized / gated / sigmoided) values,
     * accumulated here, chained through the pre-processing at the end */
    double *dqh = xcalloc((size_t)rows * H * K, sizeof(double));   /* dL/dq^ */
    double *dkh = xcalloc((size_t)rows * H * K, sizeof(double));   /* dL/dk^ */
    double *dgeff = xcalloc((size_t)rows * HV, sizeof(double));    /* dL/dg  */
    double *dbeff = xcalloc((size_t)rows * HV, sizeof(double));    /* dL/dbeta */
    /* the squared L2 norms of the terms summed into each token's dg and dbeta */
    double *gt2 = xcalloc((size_t)rows * HV, sizeof(double)), *bt2 = xcalloc((size_t)rows * HV, sizeof(double));

    int64_t max_len = 0;
    for (int64_t n = 0; n < num_seqs(c); n++) {
        int64_t bos, len;
        seq_range(c, n, &bos, &len);
        if (len > max_len) max_len = len;
    }
    /* states[t] = S after token t-1 (states[0] = h0); per token also the
     * effective q^, k^, decay, beta and the u computed in forward */
    double *states = xcalloc((size_t)(max_len + 1) * KV, sizeof(double));
    double *qs = xcalloc((size_t)max_len * K + 1, sizeof(double));
    double *ks = xcalloc((size_t)max_len * K + 1, sizeof(double));
    double *us = xcalloc((size_t)max_len * V + 1, sizeof(double));
    double *ws = xcalloc((size_t)max_len * V + 1, sizeof(double));
    double *decays = xcalloc((size_t)max_len + 1, sizeof(double));
    double *reach = xcalloc((size_t)max_len + 1, sizeof(double));   /* prod of decays[0..t] */
    double *betas = xcalloc((size_t)max_len + 1, sizeof(double));
    double *dS = xcalloc(KV, sizeof(double));
    double *Sa = xcalloc(KV, sizeof(double));
    double *du = xcalloc(V, sizeof(double)), *dw = xcalloc(V, sizeof(double));

    for (int64_t n = 0; n < num_seqs(c); n++) {
        int64_t bos, len;
        seq_range(c, n, &bos, &len);
        for (int j = 0; j < HV; j++) {
            const int h = j / G;
            /* forward sweep, keeping every state */
            for (int i = 0; i < K; i++)
                for (int col = 0; col < V; col++)
                    states[i * V + col] = in->h0 ? in->h0[state_index(c, n, j, i, col)] : 0.0;
            for (int64_t t = 0; t < len; t++) {
                const int64_t r = bos + t;
                double *q = qs + t * K, *k = ks + t * K, *u = us + t * V, *w = ws + t * V;
                eff_qk(c, in->q + (r * H + h) * K, q);
                eff_qk(c, in->k + (r * H + h) * K, k);
                const double *v = in->v + (r * HV + j) * V;
                decays[t] = exp(eff_g(c, in, r, j));
                betas[t] = eff_beta(c, in, r, j);
                const double *Sp = states + (size_t)t * KV;
                double *Sn = states + (size_t)(t + 1) * KV;
                for (size_t e = 0; e < KV; e++) Sn[e] = decays[t] * Sp[e];
                for (int col = 0; col < V; col++) {
                    double acc = 0.0;
                    for (int i = 0; i < K; i++) acc += Sn[i * V + col] * k[i];
                    w[col] = acc;
                    u[col] = betas[t] * (v[col] - acc);
                }
                for (int i = 0; i < K; i++)
                    for (int col = 0; col < V; col++) Sn[i * V + col] += k[i] * u[col];
            }

            /* reverse sweep: dS = dL/dS after the current token */
            for (int64_t t = 0; t < len; t++) reach[t] = (t ? reach[t - 1] : 1.0) * decays[t];
            double most2 = 0.0;   /* max over tokens of reach^2 ||dS before the removal||^2 */
            for (int i = 0; i < K; i++)
                for (int col = 0; col < V; col++)
                    dS[i * V + col] = dht ? dht[state_index(c, n, j, i, col)] : 0.0;
            for (int64_t t = len - 1; t >= 0; t--) {
                const int64_t r = bos + t;
                const double *q = qs + t * K, *k = ks + t * K, *u = us + t * V, *w = ws + t * V;
                const double *v = in->v + (r * HV + j) * V;
                const double *S = states + (size_t)(t + 1) * KV;   /* S after token t */
                const double *Sp = states + (size_t)t * KV;        /* S before token t */
                const double decay = decays[t], beta = betas[t];
                const double *dot = dout ? dout + (r * HV + j) * V : NULL;
                double *dq = dqh + (r * H + h) * K, *dk = dkh + (r * H + h) * K;

                /* o = scale S^T q:  dq += scale S do;  dS += scale q do^T */
                if (dot) {
                    for (int i = 0; i < K; i++) {
                        double acc = 0.0;
                        for (int col = 0; col < V; col++) acc += S[i * V + col] * dot[col];
                        dq[i] += scale * acc;
                    }
                    for (int i = 0; i < K; i++)
                        for (int col = 0; col < V; col++) dS[i * V + col] += scale * q[i] * dot[col];
                }
                /* S = Sa + k u^T:  dSa = dS;  dk += dS u;  du = dS^T k */
                for (int i = 0; i < K; i++) {
                    double acc = 0.0;
                    for (int col = 0; col < V; col++) acc += dS[i * V + col] * u[col];
                    dk[i] += acc;
                }
                for (int col = 0; col < V; col++) {
                    double acc = 0.0;
                    for (int i = 0; i < K; i++) acc += dS[i * V + col] * k[i];
                    du[col] = acc;
                }
                if (dh0_terms2) {
                    double ss = 0.0;
                    for (size_t e = 0; e < KV; e++) ss += dS[e] * dS[e];
                    if (reach[t] * reach[t] * ss > most2) most2 = reach[t] * reach[t] * ss;
                }
                /* u = beta (v - w):  dbeta = du . (v - w);  dv = beta du;  dw = -beta du */
                double db = 0.0, db2 = 0.0;
                for (int col = 0; col < V; col++) {
                    const double x = du[col] * (v[col] - w[col]);
                    db += x;
                    db2 += x * x;
                }
                dbeff[r * HV + j] += db;
                bt2[r * HV + j] = db2;
                if (dv_out)
                    for (int col = 0; col < V; col++) dv_out[(r * HV + j) * V + col] = beta * du[col];
                for (int col = 0; col < V; col++) dw[col] = -beta * du[col];
                /* w = Sa^T k:  dSa += k dw^T;  dk += Sa dw   (Sa = decay * Sp) */
                for (int e = 0; e < (int)KV; e++) Sa[e] = decay * Sp[e];
                for (int i = 0; i < K; i++) {
                    double acc = 0.0;
                    for (int col = 0; col < V; col++) acc += Sa[i * V + col] * dw[col];
                    dk[i] += acc;
                }
                for (int i = 0; i < K; i++)
                    for (int col = 0; col < V; col++) dS[i * V + col] += k[i] * dw[col];
                /* Sa = exp(g) Sp:  dg = <dSa, Sa>;  dSp = exp(g) dSa */
                double dgv = 0.0, dg2 = 0.0;
                for (size_t e = 0; e < KV; e++) {
                    const double x = dS[e] * Sa[e];
                    dgv += x;
                    dg2 += x * x;
                }
                dgeff[r * HV + j] += dgv;
                gt2[r * HV + j] = dg2;
                for (size_t e = 0; e < KV; e++) dS[e] *= decay;
            }
            /* dS is now dL/dh0 */
            if (dh0_out)
                for (int i = 0; i < K; i++)
                    for (int col = 0; col < V; col++) dh0_out[state_index(c, n, j, i, col)] = dS[i * V + col];
            if (dh0_terms2) {
                if (len == 0) { most2 = 0.0; for (size_t e = 0; e < KV; e++) most2 += dS[e] * dS[e]; }
                for (int i = 0; i < K; i++)
                    for (int col = 0; col < V; col++) dh0_terms2[state_index(c, n, j, i, col)] = most2 / (double)KV;
            }
        }
    }

    /* chain through the l2norm: q^ = q r, r = 1/sqrt(sum q^2 + eps):
     * dq = r (dq^ - q^ (q^ . dq^)) */
    if (c->flags & GDN_QK_L2NORM) {
        if (dq_out) gdn_ref_l2norm_bwd(rows * H, K, in->q, dqh, dq_out);
        if (dk_out) gdn_ref_l2norm_bwd(rows * H, K, in->k, dkh, dk_out);
    } else {
        if (dq_out) memcpy(dq_out, dqh, sizeof(double) * (size_t)rows * H * K);
        if (dk_out) memcpy(dk_out, dkh, sizeof(double) * (size_t)rows * H * K);
    }

    /* chain through the gate: g = -exp(A_log) softplus(a + dt_bias) */
    if (c->flags & GDN_GATE_FUSED) {
        double *da = xcalloc((size_t)rows * HV, sizeof(double));
        double *dA = xcalloc(HV, sizeof(double)), *ddt = xcalloc(HV, sizeof(double));
        if (in->g) gdn_ref_gate_bwd(rows, HV, in->g, in->A_log, in->dt_bias, dgeff, da, dA, ddt);
        if (dg_out) memcpy(dg_out, da, sizeof(double) * (size_t)rows * HV);
        if (dg_terms2) {   /* da = dg g'(a): the terms' norm through the same chain */
            for (int64_t e = 0; e < rows * HV; e++) gt2[e] = sqrt(gt2[e]);
            memset(dg_terms2, 0, sizeof(double) * (size_t)rows * HV);
            if (in->g) gdn_ref_gate_bwd(rows, HV, in->g, in->A_log, in->dt_bias, gt2, dg_terms2, NULL, NULL);
            for (int64_t e = 0; e < rows * HV; e++) dg_terms2[e] *= dg_terms2[e];
        }
        if (dA_log_out) memcpy(dA_log_out, dA, sizeof(double) * HV);
        if (ddt_bias_out) memcpy(ddt_bias_out, ddt, sizeof(double) * HV);
        free(da); free(dA); free(ddt);
    } else if (dg_out) {
        memcpy(dg_out, dgeff, sizeof(double) * (size_t)rows * HV);
    }
    if (dg_terms2 && !(c->flags & GDN_GATE_FUSED)) memcpy(dg_terms2, gt2, sizeof(double) * (size_t)rows * HV);

    /* chain through beta = m sigmoid(b): db = dbeta * m * s (1 - s) */
    if (dbeta_out) {
        for (int64_t e = 0; e < rows * HV; e++) {
            if (c->flags & GDN_BETA_SIGMOID) {
                const double m = (c->flags & GDN_BETA_NEGATIVE) ? 2.0 : 1.0;
                const double s = sigmoid(in->beta[e]), f = m * s * (1.0 - s);
                dbeta_out[e] = dbeff[e] * f;
                if (dbeta_terms2) dbeta_terms2[e] = bt2[e] * f * f;
            } else {
                dbeta_out[e] = dbeff[e];
                if (dbeta_terms2) dbeta_terms2[e] = bt2[e];
            }
        }
    }

    free(dqh); free(dkh); free(dgeff); free(dbeff); free(gt2); free(bt2);
    free(states); free(qs); free(ks); free(us); free(ws); free(decays); free(reach); free(betas);
    free(dS); free(Sa); free(du); free(dw);
}

void gdn_ref_bwd(const gdn_config *c, const gdn_ref_inputs *in, const double *dout, const double *dht,
                 double *dq, double *dk, double *dv, double *dg, double *dbeta,
                 double *dA_log, double *ddt_bias, double *dh0) {
    bwd(c, in, dout, dht, dq, dk, dv, dg, dbeta, dA_log, ddt_bias, dh0, NULL, NULL, NULL);
}

void gdn_ref_bwd_terms(const gdn_config *c, const gdn_ref_inputs *in, const double *dout, const double *dht,
                       double *dq, double *dk, double *dv, double *dg, double *dbeta,
                       double *dA_log, double *ddt_bias, double *dh0, double *dh0_terms2,
                       double *dg_terms2, double *dbeta_terms2) {
    bwd(c, in, dout, dht, dq, dk, dv, dg, dbeta, dA_log, ddt_bias, dh0, dh0_terms2, dg_terms2, dbeta_terms2);
}

/* ---- standalone gate ---- */

void gdn_ref_gate_fwd(int64_t rows, int HV, const double *a, const double *A_log,
                      const double *dt_bias, double *g) {
    for (int64_t r = 0; r < rows; r++)
        for (int j = 0; j < HV; j++) {
            const double x = a[r * HV + j] + (dt_bias ? dt_bias[j] : 0.0);
            g[r * HV + j] = -exp(A_log[j]) * gdn_ref_softplus(x);
        }
}

/* g = -exp(A_log) sp(x), x = a + dt_bias:
 *   da = dg * -exp(A_log) * sp'(x);  dA_log = sum dg * g;  ddt_bias = sum da */
void gdn_ref_gate_bwd(int64_t rows, int HV, const double *a, const double *A_log,
                      const double *dt_bias, const double *dg,
                      double *da, double *dA_log, double *ddt_bias) {
    for (int j = 0; j < HV; j++) {
        const double mA = -exp(A_log[j]);
        double sA = 0.0, sb = 0.0;
        for (int64_t r = 0; r < rows; r++) {
            const double x = a[r * HV + j] + (dt_bias ? dt_bias[j] : 0.0);
            const double d = dg[r * HV + j];
            const double dx = d * mA * softplus_grad(x);
            if (da) da[r * HV + j] = dx;
            sA += d * mA * gdn_ref_softplus(x);
            sb += dx;
        }
        if (dA_log) dA_log[j] = sA;
        if (ddt_bias) ddt_bias[j] = sb;
    }
}

/* ---- standalone l2norm ---- */

void gdn_ref_l2norm_fwd(int64_t rows, int dim, const double *x, double *y, double *rstd) {
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * dim;
        double ss = 0.0;
        for (int i = 0; i < dim; i++) ss += xr[i] * xr[i];
        const double rs = 1.0 / sqrt(ss + L2_EPS);
        if (y) for (int i = 0; i < dim; i++) y[r * dim + i] = xr[i] * rs;
        if (rstd) rstd[r] = rs;
    }
}

/* y = x r:  dx = r (dy - y (y . dy)) */
void gdn_ref_l2norm_bwd(int64_t rows, int dim, const double *x, const double *dy, double *dx) {
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * dim, *dyr = dy + r * dim;
        double ss = 0.0;
        for (int i = 0; i < dim; i++) ss += xr[i] * xr[i];
        const double rs = 1.0 / sqrt(ss + L2_EPS);
        double dot = 0.0;
        for (int i = 0; i < dim; i++) dot += xr[i] * rs * dyr[i];
        for (int i = 0; i < dim; i++) dx[r * dim + i] = rs * (dyr[i] - xr[i] * rs * dot);
    }
}
