/* Self-check of the float64 reference (src/ref):
 *   - gdn_ref_bwd against central finite differences of gdn_ref_fwd, for every
 *     option (per element on tiny shapes, along random directions on larger ones);
 *   - the standalone gate / l2norm backward against finite differences;
 *   - forward consistency: each in-kernel option equals doing it outside
 *     (l2norm, gate, sigmoid, GVA head repeat, v-first transpose, varlen split,
 *     default scale) and one token worked out by hand. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ref/ref.h"
#include "test_util.h"

typedef struct prob {
    gdn_config c;
    int64_t rows, N;
    size_t nqk, nv, ng, nst;
    double *q, *k, *v, *g, *beta, *A_log, *dt_bias, *h0, *dout, *dht;
    int64_t cu[16];
} prob;

static double *dalloc(size_t n) { return t_alloc(n * sizeof(double)); }

static void prob_free(prob *p) {
    free(p->q); free(p->k); free(p->v); free(p->g); free(p->beta); free(p->A_log);
    free(p->dt_bias); free(p->h0); free(p->dout); free(p->dht);
}

/* Allocate and fill a problem. lens: varlen sequence lengths (nseq > 0) or NULL. */
static void prob_make(prob *p, rng *r, int64_t B, int64_t T, int H, int HV, int K, int V,
                      const int64_t *lens, int nseq, unsigned flags, float scale,
                      int has_g, int has_dtb, int has_h0, int has_dht) {
    memset(p, 0, sizeof *p);
    gdn_config *c = &p->c;
    c->H = H; c->HV = HV; c->K = K; c->V = V; c->flags = flags; c->scale = scale;
    c->dtype = GDN_F32; c->gate_dtype = GDN_F32;
    if (nseq > 0) {
        p->cu[0] = 0;
        for (int n = 0; n < nseq; n++) p->cu[n + 1] = p->cu[n] + lens[n];
        c->B = 1; c->T = p->cu[nseq]; c->cu_seqlens = p->cu; c->num_seqs = nseq; p->N = nseq;
    } else {
        c->B = B; c->T = T; p->N = B;
    }
    p->rows = c->B * c->T;
    p->nqk = (size_t)p->rows * H * K; p->nv = (size_t)p->rows * HV * V;
    p->ng = (size_t)p->rows * HV; p->nst = (size_t)p->N * HV * K * V;
    p->q = dalloc(p->nqk); p->k = dalloc(p->nqk); p->v = dalloc(p->nv);
    p->beta = dalloc(p->ng); p->dout = dalloc(p->nv);
    for (size_t i = 0; i < p->nqk; i++) { p->q[i] = rng_normal(r); p->k[i] = rng_normal(r); }
    if (!(flags & GDN_QK_L2NORM))   /* keep the recurrence stable: unit-norm k rows */
        for (size_t row = 0; row < p->nqk / (size_t)K; row++) {
            double ss = 0;
            for (int i = 0; i < K; i++) ss += p->k[row * K + i] * p->k[row * K + i];
            for (int i = 0; i < K; i++) p->k[row * K + i] /= sqrt(ss);
        }
    for (size_t i = 0; i < p->nv; i++) { p->v[i] = rng_normal(r); p->dout[i] = rng_normal(r); }
    if (has_g || (flags & GDN_GATE_FUSED)) {
        p->g = dalloc(p->ng);
        for (size_t i = 0; i < p->ng; i++) {
            const double x = rng_normal(r);
            p->g[i] = (flags & GDN_GATE_FUSED) ? x : -log1p(exp(-x)) * 0.5;   /* raw a, or log-sigmoid */
        }
    }
    if (flags & GDN_GATE_FUSED) {
        p->A_log = dalloc(HV);
        for (int j = 0; j < HV; j++) p->A_log[j] = log(1.0 + 3.0 * rng_uniform(r)) - 1.0;
        if (has_dtb) {
            p->dt_bias = dalloc(HV);
            for (int j = 0; j < HV; j++) p->dt_bias[j] = 0.5 * rng_normal(r);
        }
    }
    for (size_t i = 0; i < p->ng; i++)
        p->beta[i] = (flags & GDN_BETA_SIGMOID) ? rng_normal(r) : 0.1 + 0.8 * rng_uniform(r);
    if (has_h0) { p->h0 = dalloc(p->nst); for (size_t i = 0; i < p->nst; i++) p->h0[i] = 0.5 * rng_normal(r); }
    if (has_dht) { p->dht = dalloc(p->nst); for (size_t i = 0; i < p->nst; i++) p->dht[i] = rng_normal(r); }
}

static gdn_ref_inputs prob_inputs(const prob *p) {
    gdn_ref_inputs in = {p->q, p->k, p->v, p->g, p->beta, p->A_log, p->dt_bias, p->h0};
    return in;
}

/* L = <dout, o> + <dht, ht> */
static double prob_loss(const prob *p) {
    double *o = dalloc(p->nv), *ht = dalloc(p->nst);
    gdn_ref_inputs in = prob_inputs(p);
    gdn_ref_fwd(&p->c, &in, o, ht);
    double L = 0;
    for (size_t i = 0; i < p->nv; i++) L += p->dout[i] * o[i];
    if (p->dht) for (size_t i = 0; i < p->nst; i++) L += p->dht[i] * ht[i];
    free(o); free(ht);
    return L;
}

static void prob_ctx(const prob *p, const char *what, char *buf, size_t n) {
    char fl[128];
    flags_str(p->c.flags, fl, sizeof fl);
    snprintf(buf, n, "op=ref_bwd_vs_fd(%s) flags=%s shape=B%lld T%lld H%d HV%d K%d V%d%s g=%s dt_bias=%s h0=%d dht=%d scale=%g seed=%llu",
             what, fl, (long long)p->c.B, (long long)p->c.T, p->c.H, p->c.HV, p->c.K, p->c.V,
             p->c.cu_seqlens ? " varlen" : "", p->g ? "yes" : "NULL", p->dt_bias ? "yes" : "NULL",
             p->h0 != NULL, p->dht != NULL, (double)p->c.scale, (unsigned long long)g_base_seed);
}

/* Check the gradient grad of tensor x (n elements) of problem p by finite
 * differences: per element when per_elem, else along ndir random directions. */
static void fd_check_tensor(prob *p, rng *r, const char *name, double *x, const double *grad, size_t n,
                            int per_elem, int ndir) {
    if (!x || n == 0) return;
    const double eps = 1e-5;
    char ctx[512];
    prob_ctx(p, name, ctx, sizeof ctx);
    if (per_elem) {
        double *fd = dalloc(n);
        for (size_t i = 0; i < n; i++) {
            const double x0 = x[i];
            x[i] = x0 + eps; const double Lp = prob_loss(p);
            x[i] = x0 - eps; const double Lm = prob_loss(p);
            x[i] = x0;
            fd[i] = (Lp - Lm) / (2 * eps);
        }
        double num = 0, den = 0;
        size_t worst = 0;
        for (size_t i = 0; i < n; i++) {
            const double d = fabs(grad[i] - fd[i]);
            num += d * d; den += fd[i] * fd[i];
            if (d > fabs(grad[worst] - fd[worst])) worst = i;
        }
        const double err = sqrt(num) / (sqrt(den) + 1e-6);
        check(err < 1e-6, ctx, "per-element: rel error %.3e vs bound 1e-6 (worst %zu: bwd %.9g fd %.9g)",
              err, worst, grad[worst], fd[worst]);
        free(fd);
        return;
    }
    double *d = dalloc(n), *x0 = dalloc(n);
    memcpy(x0, x, n * sizeof(double));
    for (int k = 0; k < ndir; k++) {
        double an = 0, gn = 0, dn = 0;
        for (size_t i = 0; i < n; i++) {
            d[i] = rng_normal(r);
            an += grad[i] * d[i]; gn += grad[i] * grad[i]; dn += d[i] * d[i];
        }
        for (size_t i = 0; i < n; i++) x[i] = x0[i] + eps * d[i];
        const double Lp = prob_loss(p);
        for (size_t i = 0; i < n; i++) x[i] = x0[i] - eps * d[i];
        const double Lm = prob_loss(p);
        memcpy(x, x0, n * sizeof(double));
        const double fd = (Lp - Lm) / (2 * eps);
        const double tol = 1e-6 * (sqrt(gn) * sqrt(dn) + 1e-3);
        check(fabs(fd - an) <= tol, ctx, "direction %d: bwd %.12g fd %.12g |diff| %.3e vs tol %.3e",
              k, an, fd, fabs(fd - an), tol);
    }
    free(d); free(x0);
}

static void fd_check_prob(prob *p, rng *r, int per_elem) {
    const int HV = p->c.HV;
    double *dq = dalloc(p->nqk), *dk = dalloc(p->nqk), *dv = dalloc(p->nv), *dg = dalloc(p->ng),
           *db = dalloc(p->ng), *dA = dalloc(HV), *ddt = dalloc(HV), *dh0 = dalloc(p->nst);
    gdn_ref_inputs in = prob_inputs(p);
    gdn_ref_bwd(&p->c, &in, p->dout, p->dht, dq, dk, dv, dg, db, dA, ddt, dh0);
    const int nd = 2;
    fd_check_tensor(p, r, "q", p->q, dq, p->nqk, per_elem, nd);
    fd_check_tensor(p, r, "k", p->k, dk, p->nqk, per_elem, nd);
    fd_check_tensor(p, r, "v", p->v, dv, p->nv, per_elem, nd);
    fd_check_tensor(p, r, (p->c.flags & GDN_GATE_FUSED) ? "a" : "g", p->g, dg, p->ng, per_elem, nd);
    fd_check_tensor(p, r, (p->c.flags & GDN_BETA_SIGMOID) ? "b" : "beta", p->beta, db, p->ng, per_elem, nd);
    if (p->c.flags & GDN_GATE_FUSED) {
        fd_check_tensor(p, r, "A_log", p->A_log, dA, HV, 1, nd);
        if (p->dt_bias) fd_check_tensor(p, r, "dt_bias", p->dt_bias, ddt, HV, 1, nd);
    }
    if (p->h0) {
        fd_check_tensor(p, r, "h0", p->h0, dh0, p->nst, per_elem, nd);
    } else {
        /* dh0 with h0 NULL is the gradient at a zero initial state */
        p->h0 = dalloc(p->nst);
        fd_check_tensor(p, r, "h0(zero)", p->h0, dh0, p->nst, per_elem, nd);
        free(p->h0); p->h0 = NULL;
    }
    /* every output pointer may be NULL: the others must not change */
    double *dq2 = dalloc(p->nqk);
    gdn_ref_bwd(&p->c, &in, p->dout, p->dht, dq2, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
    char ctx[512];
    prob_ctx(p, "NULL outputs", ctx, sizeof ctx);
    check(memcmp(dq, dq2, p->nqk * sizeof(double)) == 0, ctx, "dq differs when the other outputs are NULL");
    free(dq2);
    free(dq); free(dk); free(dv); free(dg); free(db); free(dA); free(ddt); free(dh0);
}

/* the 24 valid flag sets: {l2norm} x {fused} x {beta: raw, sigmoid, 2*sigmoid} x {v-first} */
static unsigned flag_set(int i) {
    unsigned f = 0;
    if (i & 1) f |= GDN_QK_L2NORM;
    if (i & 2) f |= GDN_GATE_FUSED;
    if (i & 4) f |= GDN_STATE_V_FIRST;
    const int b = (i >> 3) % 3;
    if (b >= 1) f |= GDN_BETA_SIGMOID;
    if (b == 2) f |= GDN_BETA_NEGATIVE;
    return f;
}

static void fd_sweep(void) {
    rng r;
    rng_seed(&r, mix_seed(g_base_seed, 101));
    for (int fi = 0; fi < 24; fi++) {
        const unsigned f = flag_set(fi);
        prob p;
        /* tiny, per element: B = 2, GVA G = 2 */
        prob_make(&p, &r, 2, 3, 1, 2, 3, 2, NULL, 0, f, fi % 2 ? 0.7f : 0.f,
                  1, fi % 4 != 3, fi % 3 != 0, fi % 2 == 0);
        fd_check_prob(&p, &r, 1);
        prob_free(&p);
        /* varlen with empty and 1-token sequences, G = 2, directions */
        const int64_t lens[] = {2, 0, 1, 4};
        prob_make(&p, &r, 1, 0, 2, 4, 4, 3, lens, 4, f, 0.f, fi % 5 != 4, 1, 1, 1);
        fd_check_prob(&p, &r, 0);
        prob_free(&p);
        /* G = 4, longer, K != V */
        prob_make(&p, &r, 1, 9, 1, 4, 5, 6, NULL, 0, f, 0.3f, 1, fi % 2, fi % 2 == 1, fi % 3 != 1);
        fd_check_prob(&p, &r, 0);
        prob_free(&p);
    }
    /* no gate at all (g NULL) */
    prob p;
    prob_make(&p, &r, 1, 5, 2, 2, 3, 4, NULL, 0, GDN_QK_L2NORM | GDN_BETA_SIGMOID, 0.f, 0, 0, 1, 1);
    fd_check_prob(&p, &r, 1);
    prob_free(&p);
}

/* ---- standalone gate / l2norm reference vs finite differences ---- */

static void fd_standalone(void) {
    rng r;
    rng_seed(&r, mix_seed(g_base_seed, 102));
    const double eps = 1e-6;
    char ctx[256];
    /* gate: L = <dg, g> */
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        const int rows = 5, HV = 3;
        double a[15], A[3], bias[3], dg[15], da[15], dA[3], ddt[3], g[15];
        for (int i = 0; i < rows * HV; i++) { a[i] = 3 * rng_normal(&r); dg[i] = rng_normal(&r); }
        a[4] = 25.0;   /* the softplus(x) = x branch */
        for (int j = 0; j < HV; j++) { A[j] = log(1 + 15 * rng_uniform(&r)); bias[j] = 0.5 * rng_normal(&r); }
        const double *bp = with_bias ? bias : NULL;
        gdn_ref_gate_bwd(rows, HV, a, A, bp, dg, da, dA, ddt);
        double *xs[3] = {a, A, bias}, *gs[3] = {da, dA, ddt};
        const int ns[3] = {rows * HV, HV, HV};
        const char *names[3] = {"a", "A_log", "dt_bias"};
        for (int t = 0; t < (with_bias ? 3 : 2); t++) {
            double num = 0, den = 0;
            for (int i = 0; i < ns[t]; i++) {
                const double x0 = xs[t][i];
                double Lp = 0, Lm = 0;
                xs[t][i] = x0 + eps; gdn_ref_gate_fwd(rows, HV, a, A, bp, g);
                for (int e = 0; e < rows * HV; e++) Lp += dg[e] * g[e];
                xs[t][i] = x0 - eps; gdn_ref_gate_fwd(rows, HV, a, A, bp, g);
                for (int e = 0; e < rows * HV; e++) Lm += dg[e] * g[e];
                xs[t][i] = x0;
                const double fd = (Lp - Lm) / (2 * eps);
                num += (fd - gs[t][i]) * (fd - gs[t][i]); den += fd * fd;
            }
            snprintf(ctx, sizeof ctx, "op=ref_gate_bwd_vs_fd(%s) dt_bias=%s seed=%llu", names[t],
                     with_bias ? "yes" : "NULL", (unsigned long long)g_base_seed);
            const double err = sqrt(num) / (sqrt(den) + 1e-12);
            check(err < 1e-6, ctx, "rel error %.3e vs bound 1e-6", err);
        }
    }
    /* l2norm: L = <dy, y> */
    {
        const int rows = 4, dim = 7;
        double x[28], dy[28], dx[28], y[28], rs[4];
        for (int i = 0; i < rows * dim; i++) { x[i] = rng_normal(&r); dy[i] = rng_normal(&r); }
        for (int i = 0; i < dim; i++) x[3 * dim + i] *= 1e-2;   /* a small row: eps matters */
        gdn_ref_l2norm_bwd(rows, dim, x, dy, dx);
        double num = 0, den = 0;
        for (int i = 0; i < rows * dim; i++) {
            const double x0 = x[i];
            double Lp = 0, Lm = 0;
            x[i] = x0 + eps; gdn_ref_l2norm_fwd(rows, dim, x, y, rs);
            for (int e = 0; e < rows * dim; e++) Lp += dy[e] * y[e];
            x[i] = x0 - eps; gdn_ref_l2norm_fwd(rows, dim, x, y, rs);
            for (int e = 0; e < rows * dim; e++) Lm += dy[e] * y[e];
            x[i] = x0;
            const double fd = (Lp - Lm) / (2 * eps);
            num += (fd - dx[i]) * (fd - dx[i]); den += fd * fd;
        }
        snprintf(ctx, sizeof ctx, "op=ref_l2norm_bwd_vs_fd seed=%llu", (unsigned long long)g_base_seed);
        const double err = sqrt(num) / (sqrt(den) + 1e-12);
        check(err < 1e-6, ctx, "rel error %.3e vs bound 1e-6", err);
        gdn_ref_l2norm_fwd(rows, dim, x, y, rs);
        double ss = 0;
        for (int i = 0; i < dim; i++) ss += x[i] * x[i];
        check(fabs(rs[0] - 1.0 / sqrt(ss + 1e-6)) < 1e-15 && fabs(y[1] - x[1] / sqrt(ss + 1e-6)) < 1e-15,
              "op=ref_l2norm_fwd", "rstd/y formula");
    }
    check(gdn_ref_softplus(30.0) == 30.0 && fabs(gdn_ref_softplus(0.0) - log(2.0)) < 1e-15 &&
          fabs(gdn_ref_softplus(-3.0) - log1p(exp(-3.0))) < 1e-16, "op=ref_softplus", "values");
}

/* ---- forward consistency ---- */

static void run_fwd(const prob *p, double *o, double *ht) {
    gdn_ref_inputs in = prob_inputs(p);
    gdn_ref_fwd(&p->c, &in, o, ht);
}

static void check_same(const char *what, const double *a, const double *b, size_t n, double tol) {
    int nf;
    const double e = rel_err_d(a, b, n, &nf);
    char ctx[128];
    snprintf(ctx, sizeof ctx, "op=ref_fwd_consistency(%s) seed=%llu", what, (unsigned long long)g_base_seed);
    check(!nf && e <= tol, ctx, "rel error %.3e vs %.1e", e, tol);
}

static void fwd_consistency(void) {
    rng r;
    rng_seed(&r, mix_seed(g_base_seed, 103));
    prob p;
    const unsigned all = GDN_QK_L2NORM | GDN_GATE_FUSED | GDN_BETA_SIGMOID | GDN_BETA_NEGATIVE;
    prob_make(&p, &r, 2, 7, 2, 4, 5, 3, NULL, 0, all, 0.f, 1, 1, 1, 1);
    double *o = dalloc(p.nv), *ht = dalloc(p.nst), *o2 = dalloc(p.nv), *ht2 = dalloc(p.nst);
    run_fwd(&p, o, ht);
    const int K = p.c.K, V = p.c.V, H = p.c.H, HV = p.c.HV, G = HV / H;

    /* default scale == explicit 1/sqrt(K) */
    {
        prob p2 = p;
        p2.c.scale = (float)(1.0 / sqrt((double)K));
        run_fwd(&p2, o2, ht2);
        check_same("scale default", o2, o, p.nv, 1e-7);   /* float rounding of the explicit scale */
    }
    /* in-kernel options == the same done outside */
    {
        prob p2 = p;
        double *qn = dalloc(p.nqk), *kn = dalloc(p.nqk), *g = dalloc(p.ng), *b = dalloc(p.ng);
        gdn_ref_l2norm_fwd(p.rows * H, K, p.q, qn, NULL);
        gdn_ref_l2norm_fwd(p.rows * H, K, p.k, kn, NULL);
        gdn_ref_gate_fwd(p.rows, HV, p.g, p.A_log, p.dt_bias, g);
        for (size_t i = 0; i < p.ng; i++) b[i] = 2.0 / (1.0 + exp(-p.beta[i]));
        p2.q = qn; p2.k = kn; p2.g = g; p2.beta = b; p2.c.flags = 0;
        run_fwd(&p2, o2, ht2);
        check_same("options outside: o", o2, o, p.nv, 1e-13);
        check_same("options outside: ht", ht2, ht, p.nst, 1e-13);
        /* GVA == q, k repeated per value head (H = HV) */
        prob p3 = p2;
        double *qr = dalloc(p.rows * HV * K), *kr = dalloc(p.rows * HV * K);
        for (int64_t t = 0; t < p.rows; t++)
            for (int j = 0; j < HV; j++)
                for (int i = 0; i < K; i++) {
                    qr[(t * HV + j) * K + i] = qn[(t * H + j / G) * K + i];
                    kr[(t * HV + j) * K + i] = kn[(t * H + j / G) * K + i];
                }
        p3.q = qr; p3.k = kr; p3.c.H = HV;
        double *o3 = dalloc(p.nv), *ht3 = dalloc(p.nst);
        run_fwd(&p3, o3, ht3);
        check_same("GVA repeat: o", o3, o, p.nv, 1e-13);
        check_same("GVA repeat: ht", ht3, ht, p.nst, 1e-13);
        /* v-first == transposed states */
        prob p4 = p;
        double *h0t = dalloc(p.nst);
        for (int64_t s = 0; s < p.N * HV; s++)
            for (int i = 0; i < K; i++)
                for (int c = 0; c < V; c++) h0t[s * K * V + c * K + i] = p.h0[s * K * V + i * V + c];
        p4.h0 = h0t; p4.c.flags |= GDN_STATE_V_FIRST;
        run_fwd(&p4, o3, ht3);
        check_same("v-first: o", o3, o, p.nv, 0);
        for (int64_t s = 0; s < p.N * HV; s++)
            for (int i = 0; i < K; i++)
                for (int c = 0; c < V; c++) ht2[s * K * V + i * V + c] = ht3[s * K * V + c * K + i];
        check_same("v-first: ht", ht2, ht, p.nst, 0);
        /* B rows == varlen with equal lengths */
        prob p5 = p;
        int64_t cu[3] = {0, p.c.T, 2 * p.c.T};
        p5.c.B = 1; p5.c.T = 2 * p.c.T; p5.c.cu_seqlens = cu; p5.c.num_seqs = 2;
        run_fwd(&p5, o3, ht3);
        check_same("varlen == batch: o", o3, o, p.nv, 0);
        check_same("varlen == batch: ht", ht3, ht, p.nst, 0);
        free(qn); free(kn); free(g); free(b); free(qr); free(kr); free(o3); free(ht3); free(h0t);
    }
    prob_free(&p);
    free(o); free(ht); free(o2); free(ht2);

    /* one token by hand: K = 2, V = 1, no options */
    {
        const double q[2] = {0.3, -1.2}, k[2] = {0.6, 0.8}, v[1] = {2.0}, g[1] = {-0.5}, beta[1] = {0.25},
                     h0[2] = {1.5, -0.5};
        gdn_config c = {0};
        c.B = 1; c.T = 1; c.H = 1; c.HV = 1; c.K = 2; c.V = 1; c.scale = 0.5f;
        gdn_ref_inputs in = {q, k, v, g, beta, NULL, NULL, h0};
        double o1[1], ht1[2];
        gdn_ref_fwd(&c, &in, o1, ht1);
        const double d = exp(-0.5);
        const double S0 = d * 1.5, S1 = d * -0.5;
        const double u = 0.25 * (2.0 - (S0 * 0.6 + S1 * 0.8));
        const double T0 = S0 + 0.6 * u, T1 = S1 + 0.8 * u;
        const double oo = 0.5 * (T0 * 0.3 + T1 * -1.2);
        check(fabs(o1[0] - oo) < 1e-15 && fabs(ht1[0] - T0) < 1e-15 && fabs(ht1[1] - T1) < 1e-15,
              "op=ref_fwd_by_hand", "o %.17g vs %.17g, ht %.17g %.17g vs %.17g %.17g", o1[0], oo, ht1[0], ht1[1], T0, T1);
    }
}

void test_ref_selfcheck(void) {
    fd_standalone();
    fwd_consistency();
    fd_sweep();
}
