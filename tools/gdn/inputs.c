/* The tensors of a run on the host: dtype rounding (elem_store / elem_get),
 * the counter-based random generator and fill(), host memory, the random
 * inputs of the gated delta rule and of the layer pieces, their upload to
 * the backend, the NaN-filled outputs, and the ragged sequence lengths.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"

/* ---- dtypes and random numbers ------------------------------------------- */

static uint16_t f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    x += 0x7fffu + ((x >> 16) & 1u);   /* round to nearest even */
    return (uint16_t)(x >> 16);
}
static float bf16_to_f32(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}
static uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);       /* >= 65520 rounds to inf */
    if (ax < 0x38800000u) {                                          /* below 2^-14: subnormal */
        float a;
        memcpy(&a, &ax, 4);
        return (uint16_t)(sign | (uint32_t)lrintf(a * 16777216.0f)); /* exact scaling, nearest even */
    }
    const uint32_t r = ax - 0x38000000u + 0x0fffu + ((ax >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}
static float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        const float f = ldexpf((float)m, -24);
        return sign ? -f : f;
    }
    const uint32_t x = e == 31 ? sign | 0x7f800000u | (m << 13) : sign | ((e + 112) << 23) | (m << 13);
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* store f rounded to dtype t as element i of p; returns the stored value */
double elem_store(gdn_dtype t, void *p, size_t i, float f) {
    switch (t) {
    case GDN_BF16: ((uint16_t *)p)[i] = f32_to_bf16(f); return bf16_to_f32(((uint16_t *)p)[i]);
    case GDN_F16: ((uint16_t *)p)[i] = f32_to_f16(f); return f16_to_f32(((uint16_t *)p)[i]);
    default: ((float *)p)[i] = f; return f;
    }
}
double elem_get(gdn_dtype t, const void *p, size_t i) {
    switch (t) {
    case GDN_BF16: return bf16_to_f32(((const uint16_t *)p)[i]);
    case GDN_F16: return f16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

/* Random inputs from a counter-based generator: element i of a tensor is a
 * hash of (the tensor's key, i), so tensors fill in parallel and the values
 * do not depend on the thread count. Keys come from the seed in order. */
static uint64_t rng_state;
void rng_seed(uint64_t seed) { rng_state = seed * 0x2545f4914f6cdd1dULL + 12345; }
static uint64_t mix64(uint64_t z) {   /* splitmix64's finaliser */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static uint64_t rng_key(void) { return mix64(rng_state += 0x9e3779b97f4a7c15ULL); }
static double uniform_at(uint64_t key, uint64_t i) { return ((mix64(key + i * 0x9e3779b97f4a7c15ULL) >> 11) + 0.5) * 0x1.0p-53; }
static double normal_at(uint64_t key, uint64_t i) {   /* Box-Muller on two uniforms in (0, 1), in float */
    const uint64_t h = mix64(key + i * 0x9e3779b97f4a7c15ULL);
    const float u1 = ((float)(h >> 40) + 0.5f) * 0x1.0p-24f, u2 = ((float)((h >> 16) & 0xffffff) + 0.5f) * 0x1.0p-24f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}
static double rng_uniform(void) { return uniform_at(rng_key(), 0); }
static double rng_normal(void) { return normal_at(rng_key(), 0); }
static double logsigmoid(double x) { return x >= 0 ? -log1p(exp(-x)) : x - log1p(exp(x)); }

enum { R_NORMAL, R_LOGSIG_NORMAL, R_UNIFORM };
/* p[i] = offset + scale * (a draw of kind `kind`) for i < n, dtype t, in parallel */
static void fill(gdn_dtype t, void *p, size_t n, int kind, double scale, double offset) {
    const uint64_t key = rng_key();
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        double x = kind == R_UNIFORM ? uniform_at(key, i) : normal_at(key, i);
        if (kind == R_LOGSIG_NORMAL) x = logsigmoid(x);
        elem_store(t, p, i, (float)(offset + scale * x));
    }
}

void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "gdn: out of host memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

double *dalloc(size_t n) { return xmalloc(n * sizeof(double)); }

/* ---- the problem's tensors ------------------------------------------------- */

sizes sizes_of(const gdn_config *c) {
    const int64_t N = c->cu_seqlens ? c->num_seqs : c->B;
    sizes s;
    s.rows = c->B * c->T;
    s.nqk = (size_t)s.rows * c->H * c->K;
    s.nv = (size_t)s.rows * c->HV * c->V;
    s.ng = (size_t)s.rows * c->HV;
    s.nst = (size_t)N * c->HV * c->K * c->V;
    return s;
}

/* ---- outputs: every one NaN until the op writes it -------------------------- */

void outputs_alloc(call *c) {
    const gdn_config *g = &c->cfg;
    const sizes *s = &c->sz;
    outputs *o = &c->out;
    const gdn_dtype dt = g->dtype, gt = g->gate_dtype;
    o->o = dev_nan(dt, s->nv);
    o->ht = dev_nan(GDN_F32, s->nst);
    o->saved_bytes = gdn_chunk_saved_size(g);
    o->saved = dev_nan(GDN_F32, o->saved_bytes / 4);
    o->ws_fwd_bytes = gdn_chunk_fwd_workspace_size(&c->ex, g);
    o->ws_bwd_bytes = gdn_chunk_bwd_workspace_size(&c->ex, g);
    o->ws_fwd = dev_nan(GDN_F32, o->ws_fwd_bytes / 4 + 1);
    o->ws_bwd = dev_nan(GDN_F32, o->ws_bwd_bytes / 4 + 1);
    o->dq = dev_nan(dt, s->nqk);
    o->dk = dev_nan(dt, s->nqk);
    o->dv = dev_nan(dt, s->nv);
    o->dg = dev_nan(gt, s->ng);
    o->dbeta = dev_nan(gt, s->ng);
    o->dA_log = dev_nan(GDN_F32, (size_t)g->HV);
    o->ddt_bias = dev_nan(GDN_F32, (size_t)g->HV);
    o->dh0 = dev_nan(GDN_F32, s->nst);
    o->gate_g = dev_nan(GDN_F32, s->ng);
    o->l2_y = dev_nan(dt, s->nqk);
    o->l2_rstd = dev_nan(GDN_F32, (size_t)s->rows * g->H);
}

void layer_outputs_alloc(call *c) {
    outputs *o = &c->out;
    const gdn_dtype dt = c->cfg.dtype;
    const size_t nx = (size_t)(c->conv.B * c->conv.T) * c->conv.D,
                 nst = (size_t)gdn_conv1d_seqs(&c->conv) * c->conv.D * c->conv.W,
                 nn = (size_t)c->norm.rows * c->norm.V, no = (size_t)c->dec.B * c->dec.HV * c->dec.V;
    o->dec_o = dev_nan(dt, no);
    o->dec2_o = dev_nan(dt, no);
    o->cv_y = dev_nan(dt, nx);
    o->cv_dx = dev_nan(dt, nx);
    o->cv_ht = dev_nan(GDN_F32, nst);
    o->cv_dw = dev_nan(GDN_F32, (size_t)c->conv.D * c->conv.W);
    o->cv_db = dev_nan(GDN_F32, (size_t)c->conv.D);
    o->cv_dh0 = dev_nan(GDN_F32, nst);
    o->nm_y = dev_nan(dt, nn);
    o->nm_dx = dev_nan(dt, nn);
    o->nm_dz = dev_nan(dt, nn);
    o->nm_rstd = dev_nan(GDN_F32, (size_t)c->norm.rows);
    o->nm_dw = dev_nan(GDN_F32, (size_t)c->norm.V);
}

void outputs_free(outputs *o) {
    void *p[] = {o->o, o->saved, o->ws_fwd, o->ws_bwd, o->ht, o->dq, o->dk, o->dv, o->dg, o->dbeta,
                 o->dA_log, o->ddt_bias, o->dh0, o->gate_g, o->l2_y, o->l2_rstd,
                 o->dec_o, o->dec2_o, o->cv_y, o->cv_dx, o->cv_ht, o->cv_dw, o->cv_db, o->cv_dh0,
                 o->nm_y, o->nm_dx, o->nm_dz, o->nm_rstd, o->nm_dw};
    for (size_t i = 0; i < sizeof p / sizeof *p; i++) be->release(p[i]);
}

/* ---- inputs --------------------------------------------------------------- */

/* random inputs like the tests': k rows of norm ~1 when the kernel does not
 * normalise (else the recurrence is not contractive), raw gates around 0,
 * A_log in log(1..16) */
void inputs_random(const gdn_config *c, int bwd, inputs *h) {
    const sizes s = sizes_of(c);
    const gdn_dtype dt = c->dtype, gt = c->gate_dtype;
    const unsigned f = c->flags;
    h->q = xmalloc(s.nqk * gdn_dtype_size(dt)); h->k = xmalloc(s.nqk * gdn_dtype_size(dt));
    h->v = xmalloc(s.nv * gdn_dtype_size(dt));
    h->g = xmalloc(s.ng * gdn_dtype_size(gt)); h->beta = xmalloc(s.ng * gdn_dtype_size(gt));
    h->A_log = xmalloc(sizeof(float) * (size_t)c->HV); h->dt_bias = xmalloc(sizeof(float) * (size_t)c->HV);
    h->h0 = xmalloc(sizeof(float) * s.nst);
    fill(dt, h->q, s.nqk, R_NORMAL, 1, 0);
    const double target = dt == GDN_F32 ? 1.0 : 0.99;   /* rounding must not push |k| over 1 */
    const uint64_t kkey = rng_key();
    const int K = c->K;
    #pragma omp parallel for schedule(static)
    for (size_t rw = 0; rw < s.nqk / (size_t)K; rw++) {
        float row[256];   /* K <= 256 (--K) */
        double ss = 0;
        for (int i = 0; i < K; i++) {
            row[i] = (float)normal_at(kkey, rw * K + i);
            ss += (double)row[i] * row[i];
        }
        for (int i = 0; i < K; i++)
            elem_store(dt, h->k, rw * K + i, (f & GDN_QK_L2NORM) ? row[i] : (float)(row[i] * target / sqrt(ss)));
    }
    fill(dt, h->v, s.nv, R_NORMAL, 1, 0);
    fill(gt, h->g, s.ng, (f & GDN_GATE_FUSED) ? R_NORMAL : R_LOGSIG_NORMAL, 1, 0);
    fill(gt, h->beta, s.ng, (f & GDN_BETA_SIGMOID) ? R_NORMAL : R_UNIFORM, 1, 0);
    for (int j = 0; j < c->HV; j++) {
        h->A_log[j] = (float)log(1.0 + 15.0 * rng_uniform());
        h->dt_bias[j] = (float)(0.5 * rng_normal());
    }
    fill(GDN_F32, h->h0, s.nst, R_NORMAL, 1, 0);
    if (bwd) {   /* the backward's inputs only where it runs */
        h->dout = xmalloc(s.nv * gdn_dtype_size(dt));
        h->dht = xmalloc(sizeof(float) * s.nst);
        fill(dt, h->dout, s.nv, R_NORMAL, 1, 0);
        fill(GDN_F32, h->dht, s.nst, R_NORMAL, 1, 0);
    }
}

void inputs_upload(const gdn_config *c, const inputs *h, inputs *d) {
    const sizes s = sizes_of(c);
    const size_t ds = gdn_dtype_size(c->dtype), gs = gdn_dtype_size(c->gate_dtype);
    d->q = dev_copy(h->q, s.nqk * ds); d->k = dev_copy(h->k, s.nqk * ds);
    d->v = dev_copy(h->v, s.nv * ds); d->dout = dev_copy(h->dout, s.nv * ds);
    d->g = dev_copy(h->g, s.ng * gs); d->beta = dev_copy(h->beta, s.ng * gs);
    d->A_log = dev_copy(h->A_log, sizeof(float) * (size_t)c->HV);
    d->dt_bias = dev_copy(h->dt_bias, sizeof(float) * (size_t)c->HV);
    d->h0 = dev_copy(h->h0, sizeof(float) * s.nst); d->dht = dev_copy(h->dht, sizeof(float) * s.nst);
}

void inputs_free(inputs *x, void (*release)(void *)) {
    void *p[] = {x->q, x->k, x->v, x->g, x->beta, x->dout, x->A_log, x->dt_bias, x->h0, x->dht};
    for (size_t i = 0; i < sizeof p / sizeof *p; i++) release(p[i]);
}

/* the GDN layer pieces' inputs, for the full call: like the tests', raw
 * gates and projections N(0,1), decode states 0.3 N(0,1), conv weights
 * 0.5 N(0,1) and biases 0.1 N(0,1), norm weights 1 + 0.1 N(0,1) */
void layer_inputs_random(const call *c, unsigned ops, layer_in *h) {
    const gdn_dtype dt = c->cfg.dtype;
    const gdn_decode_config *dc = &c->dec;
    const size_t dB = (size_t)dc->B, D = (size_t)gdn_decode_dim(dc), HV = (size_t)dc->HV,
                 npool = (size_t)dc->num_slots * HV * dc->K * dc->V, ncpool = (size_t)dc->num_slots * D * CONV_W,
                 nx = (size_t)(c->conv.B * c->conv.T) * D, nst = (size_t)gdn_conv1d_seqs(&c->conv) * D * CONV_W,
                 nn = (size_t)c->norm.rows * c->norm.V, V = (size_t)c->norm.V;
    memset(h, 0, sizeof *h);
    const size_t ds = gdn_dtype_size(dt);
    /* only what the chosen ops read (the others stay NULL) */
    const int dec = (ops & (1u << OP_DECODE | 1u << OP_DECODE_CONV)) != 0, dconv = (ops & 1u << OP_DECODE_CONV) != 0,
              conv = (ops & (1u << OP_CONV_FWD | 1u << OP_CONV_BWD)) != 0,
              norm = (ops & (1u << OP_NORM_FWD | 1u << OP_NORM_BWD)) != 0;
    if (dec) {
        h->mqkv = xmalloc(dB * D * ds);
        h->da = xmalloc(dB * HV * ds); h->db = xmalloc(dB * HV * ds);
        h->A_log = xmalloc(sizeof(float) * HV); h->dt_bias = xmalloc(sizeof(float) * HV);
        h->pool = xmalloc(sizeof(float) * npool);
        h->slots = xmalloc(sizeof(int32_t) * dB);
        fill(dt, h->mqkv, dB * D, R_NORMAL, 1, 0);
        fill(dt, h->da, dB * HV, R_NORMAL, 1, 0);
        fill(dt, h->db, dB * HV, R_NORMAL, 1, 0);
        for (size_t j = 0; j < HV; j++) {
            h->A_log[j] = (float)log(1.0 + 15.0 * rng_uniform());
            h->dt_bias[j] = (float)(0.5 * rng_normal());
        }
        fill(GDN_F32, h->pool, npool, R_NORMAL, 0.3, 0);
        /* a pool of 2*dB slots: row b in slot 2*dB-1-2b (reversed, every other slot unused) */
        for (size_t b = 0; b < dB; b++) h->slots[b] = (int32_t)(dc->num_slots - 1 - 2 * (int64_t)b);
    }
    if (dconv) {
        h->cpool = xmalloc(sizeof(float) * ncpool);
        fill(GDN_F32, h->cpool, ncpool, R_NORMAL, 1, 0);
    }
    if (conv) {
        h->x = xmalloc(nx * ds); h->dy = xmalloc(nx * ds);
        h->h0 = xmalloc(sizeof(float) * nst); h->dht = xmalloc(sizeof(float) * nst);
        fill(dt, h->x, nx, R_NORMAL, 1, 0);
        fill(dt, h->dy, nx, R_NORMAL, 1, 0);
        fill(GDN_F32, h->h0, nst, R_NORMAL, 1, 0);
        fill(GDN_F32, h->dht, nst, R_NORMAL, 1, 0);
    }
    if (conv || dconv) {
        h->cw = xmalloc(sizeof(float) * D * CONV_W); h->cb = xmalloc(sizeof(float) * D);
        fill(GDN_F32, h->cw, D * CONV_W, R_NORMAL, 0.5, 0);
        fill(GDN_F32, h->cb, D, R_NORMAL, 0.1, 0);
    }
    if (norm) {
        h->nx = xmalloc(nn * ds); h->nz = xmalloc(nn * ds);
        h->ndy = xmalloc(nn * ds); h->nw = xmalloc(sizeof(float) * V);
        fill(dt, h->nx, nn, R_NORMAL, 1, 0);
        fill(dt, h->nz, nn, R_NORMAL, 1, 0);
        fill(dt, h->ndy, nn, R_NORMAL, 1, 0);
        fill(GDN_F32, h->nw, V, R_NORMAL, 0.1, 1.0);
    }
}

void layer_inputs_upload(const call *c, const layer_in *h, layer_in *d) {
    const size_t ds = gdn_dtype_size(c->cfg.dtype);
    const gdn_decode_config *dc = &c->dec;
    const size_t dB = (size_t)dc->B, D = (size_t)gdn_decode_dim(dc), HV = (size_t)dc->HV,
                 npool = (size_t)dc->num_slots * HV * dc->K * dc->V, ncpool = (size_t)dc->num_slots * D * CONV_W,
                 nx = (size_t)(c->conv.B * c->conv.T) * D, nst = (size_t)gdn_conv1d_seqs(&c->conv) * D * CONV_W,
                 nn = (size_t)c->norm.rows * c->norm.V, V = (size_t)c->norm.V;
    d->mqkv = dev_copy(h->mqkv, dB * D * ds);
    d->da = dev_copy(h->da, dB * HV * ds); d->db = dev_copy(h->db, dB * HV * ds);
    d->A_log = dev_copy(h->A_log, sizeof(float) * HV); d->dt_bias = dev_copy(h->dt_bias, sizeof(float) * HV);
    d->pool = dev_copy(h->pool, sizeof(float) * npool); d->cpool = dev_copy(h->cpool, sizeof(float) * ncpool);
    d->slots = dev_copy(h->slots, sizeof(int32_t) * dB);
    d->x = dev_copy(h->x, nx * ds); d->dy = dev_copy(h->dy, nx * ds);
    d->cw = dev_copy(h->cw, sizeof(float) * D * CONV_W); d->cb = dev_copy(h->cb, sizeof(float) * D);
    d->h0 = dev_copy(h->h0, sizeof(float) * nst); d->dht = dev_copy(h->dht, sizeof(float) * nst);
    d->nx = dev_copy(h->nx, nn * ds); d->nz = dev_copy(h->nz, nn * ds); d->ndy = dev_copy(h->ndy, nn * ds);
    d->nw = dev_copy(h->nw, sizeof(float) * V);
}

void layer_inputs_free(layer_in *x, void (*release)(void *)) {
    void *p[] = {x->mqkv, x->da, x->db, x->A_log, x->dt_bias, x->pool, x->cpool, x->slots, x->x, x->dy,
                 x->cw, x->cb, x->h0, x->dht, x->nx, x->nz, x->ndy, x->nw};
    for (size_t i = 0; i < sizeof p / sizeof *p; i++) release(p[i]);
}

/* N ragged lengths summing to T: weights uniform in [0.2, 1.8] */
void ragged_seqlens(int64_t T, int n, int64_t *cu) {
    double *w = dalloc((size_t)n), sum = 0;
    for (int i = 0; i < n; i++) { w[i] = 0.2 + 1.6 * rng_uniform(); sum += w[i]; }
    cu[0] = 0;
    double acc = 0;
    for (int i = 0; i < n; i++) {
        acc += w[i];
        cu[i + 1] = i == n - 1 ? T : (int64_t)llround(acc / sum * (double)T);
        if (cu[i + 1] < cu[i]) cu[i + 1] = cu[i];
    }
    free(w);
}
