/* The check of each op on the slice: the float64 reference of the gated
 * delta rule ops (src/ref), the error measures (relative, per-head reduction,
 * state pool) and check_op(), which runs an op once and returns its error.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "ref/ref.h"

/* host tensor of dtype t -> doubles (the rounded values the library sees) */
static double *to_double(gdn_dtype t, const void *p, size_t n) {
    double *d = dalloc(n);
    for (size_t i = 0; i < n; i++) d[i] = elem_get(t, p, i);
    return d;
}

void refs_compute(const gdn_config *c, int bwd, const inputs *host, refs *r) {
    const sizes s = sizes_of(c);
    const int fused = (c->flags & GDN_GATE_FUSED) != 0;
    double *q = to_double(c->dtype, host->q, s.nqk), *k = to_double(c->dtype, host->k, s.nqk),
           *v = to_double(c->dtype, host->v, s.nv), *g = to_double(c->gate_dtype, host->g, s.ng),
           *b = to_double(c->gate_dtype, host->beta, s.ng),
           *dout = bwd ? to_double(c->dtype, host->dout, s.nv) : NULL,
           *A = to_double(GDN_F32, host->A_log, (size_t)c->HV), *dtb = to_double(GDN_F32, host->dt_bias, (size_t)c->HV),
           *h0 = to_double(GDN_F32, host->h0, s.nst), *dht = bwd ? to_double(GDN_F32, host->dht, s.nst) : NULL;
    gdn_ref_inputs in = {q, k, v, g, b, fused ? A : NULL, fused ? dtb : NULL, h0};
    r->o = dalloc(s.nv); r->ht = dalloc(s.nst);
    gdn_ref_fwd(c, &in, r->o, r->ht);
    if (bwd) {
        r->dq = dalloc(s.nqk); r->dk = dalloc(s.nqk); r->dv = dalloc(s.nv); r->dg = dalloc(s.ng);
        r->db = dalloc(s.ng); r->dA = dalloc((size_t)c->HV); r->ddt = dalloc((size_t)c->HV); r->dh0 = dalloc(s.nst);
        gdn_ref_bwd(c, &in, dout, dht, r->dq, r->dk, r->dv, r->dg, r->db, r->dA, r->ddt, r->dh0);
    }
    /* dA_log = sum_t da_t * softplus(x_t) / softplus'(x_t), ddt_bias = sum_t da_t:
     * sums whose terms cancel, measured against the size of the terms */
    r->dA_terms2 = dalloc((size_t)c->HV); r->ddt_terms2 = dalloc((size_t)c->HV);
    for (int j = 0; j < c->HV; j++) r->dA_terms2[j] = r->ddt_terms2[j] = 0;
    if (fused && bwd) {
        for (size_t i = 0; i < s.ng; i++) {
            const int j = (int)(i % (size_t)c->HV);
            const double x = g[i] + dtb[j];
            const double sp = gdn_ref_softplus(x), dsp = x > 20 ? 1.0 : 1.0 / (1.0 + exp(-x));
            const double term = r->dg[i] * sp / dsp;
            r->dA_terms2[j] += term * term;
            r->ddt_terms2[j] += r->dg[i] * r->dg[i];
        }
    }
    r->gate_g = dalloc(s.ng);
    gdn_ref_gate_fwd(s.rows, c->HV, g, A, dtb, r->gate_g);
    r->l2_y = dalloc(s.nqk);
    gdn_ref_l2norm_fwd(s.rows * c->H, c->K, q, r->l2_y, NULL);
    free(q); free(k); free(v); free(g); free(b); free(dout); free(A); free(dtb); free(h0); free(dht);
}

void refs_free(refs *r) {
    double *p[] = {r->o, r->ht, r->dq, r->dk, r->dv, r->dg, r->db, r->dA, r->ddt, r->dh0, r->gate_g, r->l2_y,
                   r->dA_terms2, r->ddt_terms2};
    for (size_t i = 0; i < sizeof p / sizeof *p; i++) free(p[i]);
}

/* ||out - ref|| / ||ref|| for a device tensor of dtype t; absolute when
 * ||ref|| is ~0; infinity on any non-finite element (NaN never passes) */
static double rel_err(gdn_dtype t, const void *dev, const double *ref, size_t n) {
    const size_t bytes = n * gdn_dtype_size(t);
    void *h = xmalloc(bytes);
    be->download(h, dev, bytes);
    double num = 0, den = 0;
    int bad_value = 0;
    for (size_t i = 0; i < n; i++) {
        const double x = elem_get(t, h, i);
        if (!isfinite(x)) bad_value = 1;
        num += (x - ref[i]) * (x - ref[i]);
        den += ref[i] * ref[i];
    }
    free(h);
    if (bad_value) return INFINITY;
    return den < 1e-18 ? sqrt(num) : sqrt(num / den);
}

/* a per-head reduction: error against max(|sum|, |terms|), as the tests measure it */
static double reduction_err(const float *dev, const double *ref, const double *terms2, int HV) {
    float *h = xmalloc(sizeof(float) * (size_t)HV);
    be->download(h, dev, sizeof(float) * (size_t)HV);
    double num = 0, den = 0;
    int bad_value = 0;
    for (int j = 0; j < HV; j++) {
        if (!isfinite(h[j])) bad_value = 1;
        num += (h[j] - ref[j]) * (h[j] - ref[j]);
        den += fmax(ref[j] * ref[j], terms2[j]);
    }
    free(h);
    if (bad_value) return INFINITY;
    return den < 1e-18 ? sqrt(num) : sqrt(num / den);
}

static double worse(double a, double b) { return (a > b || isnan(a)) ? a : b; }

/* a state pool after a decode step of B rows: the rows slots[0..B) against
 * ref (the rows in slot order), relative; every other pool row must be byte
 * for byte the initial one (else infinity, *moved set) */
static double pool_err(const float *dev, const float *init, const int32_t *slots, int B, int64_t nslots,
                       size_t row, const double *ref, int *moved) {
    const size_t n = (size_t)nslots * row;
    float *h = xmalloc(sizeof(float) * n);
    char *used = xmalloc((size_t)nslots);
    be->download(h, dev, sizeof(float) * n);
    memset(used, 0, (size_t)nslots);
    double num = 0, den = 0;
    int bad_value = 0;
    *moved = 0;
    for (int b = 0; b < B; b++) {
        const int32_t sl = slots[b];
        if (sl < 0) continue;
        used[sl] = 1;
        for (size_t i = 0; i < row; i++) {
            const double x = h[(size_t)sl * row + i], rf = ref[(size_t)b * row + i];
            if (!isfinite(x)) bad_value = 1;
            num += (x - rf) * (x - rf);
            den += rf * rf;
        }
    }
    for (int64_t sl = 0; sl < nslots; sl++)
        if (!used[sl] && memcmp(h + (size_t)sl * row, init + (size_t)sl * row, sizeof(float) * row)) *moved = 1;
    free(h); free(used);
    if (bad_value || *moved) return INFINITY;
    return den < 1e-18 ? sqrt(num) : sqrt(num / den);
}

/* keep the larger error and its name */
static void pick(double x, const char *name, double *e, const char **what) {
    if (worse(x, *e) == x && x != *e) { *e = x; *what = name; }
}

static double check_layer(int op, call *c, const lrefs *r, const char **what) {
    const gdn_dtype dt = c->cfg.dtype;
    double e = -1;
    switch (op) {
    case OP_DECODE:
    case OP_DECODE_CONV: {
        const int cv = op == OP_DECODE_CONV;
        const gdn_decode_config *dc = &c->dec;
        const size_t D = (size_t)gdn_decode_dim(dc), row = (size_t)dc->HV * dc->K * dc->V;
        int moved = 0;
        pick(rel_err(dt, cv ? c->out.dec2_o : c->out.dec_o, r->dec_o[cv], (size_t)dc->B * dc->HV * dc->V), "o", &e,
             what);
        double x = pool_err(c->lin->pool, lay_host->pool, lay_host->slots, dc->B, dc->num_slots, row, r->dec_st[cv],
                            &moved);
        pick(x, moved ? "state: a pool row not in slots changed" : "state", &e, what);
        if (cv) {
            x = pool_err(c->lin->cpool, lay_host->cpool, lay_host->slots, dc->B, dc->num_slots, D * CONV_W, r->dec_cst,
                         &moved);
            pick(x, moved ? "conv_state: a pool row not in slots changed" : "conv_state", &e, what);
        }
        return e;
    }
    case OP_CONV_FWD: {
        const size_t nx = (size_t)(c->conv.B * c->conv.T) * c->conv.D,
                     nst = (size_t)gdn_conv1d_seqs(&c->conv) * c->conv.D * c->conv.W;
        pick(rel_err(dt, c->out.cv_y, r->cv_y, nx), "y", &e, what);
        pick(rel_err(GDN_F32, c->out.cv_ht, r->cv_ht, nst), "ht", &e, what);
        return e;
    }
    case OP_CONV_BWD: {
        const size_t nx = (size_t)(c->conv.B * c->conv.T) * c->conv.D,
                     nst = (size_t)gdn_conv1d_seqs(&c->conv) * c->conv.D * c->conv.W;
        pick(rel_err(dt, c->out.cv_dx, r->cv_dx, nx), "dx", &e, what);
        pick(rel_err(GDN_F32, c->out.cv_dw, r->cv_dw, (size_t)c->conv.D * c->conv.W), "dweight", &e, what);
        pick(rel_err(GDN_F32, c->out.cv_db, r->cv_db, (size_t)c->conv.D), "dbias", &e, what);
        pick(rel_err(GDN_F32, c->out.cv_dh0, r->cv_dh0, nst), "dh0", &e, what);
        return e;
    }
    case OP_NORM_FWD: {
        const size_t n = (size_t)c->norm.rows * c->norm.V;
        pick(rel_err(dt, c->out.nm_y, r->nm_y, n), "y", &e, what);
        pick(rel_err(GDN_F32, c->out.nm_rstd, r->nm_rstd, (size_t)c->norm.rows), "rstd", &e, what);
        return e;
    }
    default: {
        const size_t n = (size_t)c->norm.rows * c->norm.V;
        pick(rel_err(dt, c->out.nm_dx, r->nm_dx, n), "dx", &e, what);
        pick(rel_err(dt, c->out.nm_dz, r->nm_dz, n), "dz", &e, what);
        pick(rel_err(GDN_F32, c->out.nm_dw, r->nm_dw, (size_t)c->norm.V), "dw", &e, what);
        return e;
    }
    }
}

/* run op once on the slice and return its error against the reference
 * (-1 when the call failed; status in *st) */
double check_op(int op, call *c, const refs *r, const lrefs *lr, gdn_status *st, const char **what) {
    const gdn_config *g = &c->cfg;
    const sizes *s = &c->sz;
    *what = "";
    *st = prepare_op(op, c);
    if (*st == GDN_OK) *st = run_op(op, c);
    if (*st != GDN_OK) return -1;
    if (op_is_layer(op)) return check_layer(op, c, lr, what);
    double e = 0, x;
    switch (op) {
    case OP_CHUNK_FWD:
    case OP_RECURRENT_FWD:
        e = rel_err(g->dtype, c->out.o, r->o, s->nv); *what = "o";
        x = rel_err(GDN_F32, c->out.ht, r->ht, s->nst); if (worse(x, e) == x && x != e) { e = x; *what = "ht"; }
        return e;
    case OP_CHUNK_FWDBWD: {
        const int fused = (g->flags & GDN_GATE_FUSED) != 0;
        struct { const char *name; double err; } gr[8] = {
            {"dq", rel_err(g->dtype, c->out.dq, r->dq, s->nqk)},
            {"dk", rel_err(g->dtype, c->out.dk, r->dk, s->nqk)},
            {"dv", rel_err(g->dtype, c->out.dv, r->dv, s->nv)},
            {fused ? "da" : "dg", rel_err(g->gate_dtype, c->out.dg, r->dg, s->ng)},
            {(g->flags & GDN_BETA_SIGMOID) ? "db" : "dbeta", rel_err(g->gate_dtype, c->out.dbeta, r->db, s->ng)},
            {"dh0", rel_err(GDN_F32, c->out.dh0, r->dh0, s->nst)},
            {"dA_log", fused ? reduction_err(c->out.dA_log, r->dA, r->dA_terms2, g->HV) : 0},
            {"ddt_bias", fused ? reduction_err(c->out.ddt_bias, r->ddt, r->ddt_terms2, g->HV) : 0}};
        e = gr[0].err; *what = gr[0].name;
        for (int i = 1; i < 8; i++)
            if (worse(gr[i].err, e) == gr[i].err && gr[i].err != e) { e = gr[i].err; *what = gr[i].name; }
        return e;
    }
    case OP_GATE_FWD: *what = "g"; return rel_err(GDN_F32, c->out.gate_g, r->gate_g, s->ng);
    default: *what = "y"; return rel_err(g->dtype, c->out.l2_y, r->l2_y, s->nqk);   /* OP_L2NORM_FWD */
    }
}
