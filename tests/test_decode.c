/* The fused decode step against the float64 reference (the recurrence with
 * T = 1, and the conv update written out), the state pool (slots, padding,
 * errors), and the layer-level check: prefill with the chunk op, then decode
 * steps, equals one chunk call over the whole sequence. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ref/ref.h"
#include "test_util.h"

typedef struct dcase {
    int B, H, HV, K, V, W;   /* W: conv width, 0 = mixed_qkv given */
    gdn_dtype dt;
    unsigned flags;          /* GDN_QK_L2NORM | GDN_BETA_NEGATIVE | GDN_STATE_V_FIRST */
    int use_slots;           /* a permuted pool with padding rows */
    int dtb;                 /* dt_bias given */
} dcase;

static void ctx_of(const dcase *d, uint64_t seed, char *buf, size_t n) {
    char fl[96];
    flags_str(d->flags, fl, sizeof fl);
    snprintf(buf, n, "op=decode_step backend=cpu B%d H%d HV%d K%d V%d conv_W=%d dtype=%s flags=%s slots=%d "
             "dt_bias=%d seed=%llu", d->B, d->H, d->HV, d->K, d->V, d->W, t_dtype_name(d->dt), fl,
             d->use_slots, d->dtb, (unsigned long long)seed);
}

static double silu_d(double x) { return x / (1.0 + exp(-x)); }

static void run_decode_case(const dcase *d, uint64_t seed) {
    rng r;
    rng_seed(&r, seed);
    char ctx[512];
    ctx_of(d, seed, ctx, sizeof ctx);
    const int B = d->B, H = d->H, HV = d->HV, K = d->K, V = d->V, W = d->W;
    const int D = 2 * H * K + HV * V;
    const int64_t pool = d->use_slots ? B + 3 : B;
    const size_t dsz = t_dsize(d->dt), st_n = (size_t)K * V;
    int32_t *slots = t_alloc(sizeof(int32_t) * (B > 0 ? B : 1));
    /* slots: a permutation of pool rows, every third row padding */
    for (int b = 0; b < B; b++) slots[b] = (int32_t)((b * 7 + 2) % pool);
    for (int b = 0; b < B; b++) if (d->use_slots && b % 3 == 1) slots[b] = -1;
    for (int b = 0; b < B; b++)       /* keep them distinct: (7b+2) mod pool may repeat when 7 | pool */
        for (int c = 0; c < b; c++)
            if (slots[b] >= 0 && slots[b] == slots[c]) slots[b] = -1;

    void *in = t_alloc((size_t)B * D * dsz), *ga = t_alloc((size_t)B * HV * dsz), *gb = t_alloc((size_t)B * HV * dsz);
    double *ind = t_alloc(sizeof(double) * B * D), *gad = t_alloc(sizeof(double) * B * HV),
           *gbd = t_alloc(sizeof(double) * B * HV);
    for (size_t i = 0; i < (size_t)B * D; i++) ind[i] = t_store(d->dt, in, i, (float)rng_normal(&r));
    for (size_t i = 0; i < (size_t)B * HV; i++) gad[i] = t_store(d->dt, ga, i, (float)rng_normal(&r));
    for (size_t i = 0; i < (size_t)B * HV; i++) gbd[i] = t_store(d->dt, gb, i, (float)rng_normal(&r));
    float A_log[64], dt_bias[64];
    double A_logd[64], dt_biasd[64];
    for (int j = 0; j < HV; j++) {
        A_log[j] = (float)log(1.0 + 15.0 * rng_uniform(&r)); A_logd[j] = A_log[j];
        dt_bias[j] = (float)(0.5 * rng_normal(&r)); dt_biasd[j] = dt_bias[j];
    }
    float *state = t_alloc(sizeof(float) * pool * HV * st_n), *state0 = t_alloc(sizeof(float) * pool * HV * st_n);
    for (size_t i = 0; i < (size_t)pool * HV * st_n; i++) state[i] = (float)(0.3 * rng_normal(&r));
    float *cw = t_alloc(sizeof(float) * D * (W ? W : 1)), *cb = t_alloc(sizeof(float) * D);
    float *cst = t_alloc(sizeof(float) * pool * D * (W ? W : 1)), *cst0 = t_alloc(sizeof(float) * pool * D * (W ? W : 1));
    for (int i = 0; i < D * W; i++) cw[i] = (float)(0.5 * rng_normal(&r));
    for (int i = 0; i < D; i++) cb[i] = (float)(0.1 * rng_normal(&r));
    for (int64_t i = 0; i < pool * D * W; i++) cst[i] = (float)rng_normal(&r);
    memcpy(state0, state, sizeof(float) * pool * HV * st_n);
    memcpy(cst0, cst, sizeof(float) * pool * D * W);

    /* reference: per row, the conv update written out, then gdn_ref_fwd with T = 1 */
    double *o_ref = t_alloc(sizeof(double) * B * HV * V), *o_terms2 = t_alloc(sizeof(double) * B * HV * V),
           *st_ref = t_alloc(sizeof(double) * pool * HV * st_n);
    double *cst_ref = t_alloc(sizeof(double) * pool * D * (W ? W : 1));
    for (size_t i = 0; i < (size_t)pool * HV * st_n; i++) st_ref[i] = state0[i];
    for (int64_t i = 0; i < pool * D * W; i++) cst_ref[i] = cst0[i];
    gdn_config rc = {.B = 1, .T = 1, .H = H, .HV = HV, .K = K, .V = V, .dtype = GDN_F32, .gate_dtype = GDN_F32,
                     .flags = d->flags | GDN_GATE_FUSED | GDN_BETA_SIGMOID};
    /* two deliberately wrong decodes, to show the bounds catch them: the
     * largest term of each o sum dropped (at least 1/K of |o|, 1/sqrt(K) of
     * its terms: above every bound for K <= 128), and the update skipped */
    double *o_drop = t_alloc(sizeof(double) * B * HV * V), *o_skip = t_alloc(sizeof(double) * B * HV * V),
           *st_skip = t_alloc(sizeof(double) * pool * HV * st_n), *ht_skip = t_alloc(sizeof(double) * HV * st_n),
           *gb_off = t_alloc(sizeof(double) * HV);
    for (int j = 0; j < HV; j++) gb_off[j] = -1e30;   /* beta = sigmoid(-1e30) = 0: no update */
    for (size_t i = 0; i < (size_t)pool * HV * st_n; i++) st_skip[i] = state0[i];
    double *x = t_alloc(sizeof(double) * D), *q = t_alloc(sizeof(double) * H * K), *k = t_alloc(sizeof(double) * H * K),
           *v = t_alloc(sizeof(double) * HV * V), *ht = t_alloc(sizeof(double) * HV * st_n);
    for (int b = 0; b < B; b++) {
        const int64_t s = d->use_slots ? slots[b] : b;
        if (s < 0) {
            for (int i = 0; i < HV * V; i++)
                o_ref[(size_t)b * HV * V + i] = o_terms2[(size_t)b * HV * V + i] = o_drop[(size_t)b * HV * V + i] =
                    o_skip[(size_t)b * HV * V + i] = 0;
            continue;
        }
        for (int i = 0; i < D; i++) x[i] = ind[(size_t)b * D + i];
        if (W) {
            for (int c = 0; c < D; c++) {
                double *sc = cst_ref + (s * D + c) * W, acc = cb[c];
                for (int w = 0; w + 1 < W; w++) { sc[w] = sc[w + 1]; acc += cw[c * W + w] * sc[w]; }
                sc[W - 1] = x[c];
                acc += cw[c * W + W - 1] * x[c];
                x[c] = silu_d(acc);
            }
        }
        memcpy(q, x, sizeof(double) * H * K);
        memcpy(k, x + H * K, sizeof(double) * H * K);
        memcpy(v, x + 2 * H * K, sizeof(double) * HV * V);
        gdn_ref_inputs ri = {q, k, v, gad + (size_t)b * HV, gbd + (size_t)b * HV, A_logd, d->dtb ? dt_biasd : NULL,
                             st_ref + s * HV * st_n};
        gdn_ref_fwd_terms(&rc, &ri, o_ref + (size_t)b * HV * V, ht, o_terms2 + (size_t)b * HV * V);
        gdn_ref_inputs rskip = ri;
        rskip.beta = gb_off;
        gdn_ref_fwd(&rc, &rskip, o_skip + (size_t)b * HV * V, ht_skip);
        memcpy(st_skip + s * HV * st_n, ht_skip, sizeof(double) * HV * st_n);
        memcpy(st_ref + s * HV * st_n, ht, sizeof(double) * HV * st_n);
        for (int j = 0; j < HV; j++) {     /* o without its largest term: scale S[i,e] q^_i, largest over e */
            const double *qh = q + (j / (HV / H)) * K;
            double qn = 1.0;
            if (d->flags & GDN_QK_L2NORM) {
                double ss = 0;
                for (int i = 0; i < K; i++) ss += qh[i] * qh[i];
                qn = 1.0 / sqrt(ss + 1e-6);
            }
            const double sc = qn / sqrt((double)K);
#define S_AT(i, e) ((d->flags & GDN_STATE_V_FIRST) ? ht[((size_t)j * V + (e)) * K + (i)] : ht[((size_t)j * K + (i)) * V + (e)])
            int im = 0;
            double best = -1;
            for (int i = 0; i < K; i++) {
                double t2 = 0;
                for (int e = 0; e < V; e++) t2 += (S_AT(i, e) * qh[i]) * (S_AT(i, e) * qh[i]);
                if (t2 > best) { best = t2; im = i; }
            }
            for (int e = 0; e < V; e++) {
                const size_t oi = ((size_t)b * HV + j) * V + e;
                o_drop[oi] = o_ref[oi] - S_AT(im, e) * qh[im] * sc;
            }
#undef S_AT
        }
    }

    void *o = t_alloc((size_t)B * HV * V * dsz);
    t_poison_nan(d->dt, o, (size_t)B * HV * V);
    gdn_decode_config c = {.B = B, .H = H, .HV = HV, .K = K, .V = V, .dtype = d->dt, .flags = d->flags,
                           .num_slots = pool, .conv_W = W};
    gdn_decode_args a = {.a = ga, .b = gb, .A_log = A_log, .dt_bias = d->dtb ? dt_bias : NULL, .state = state,
                         .slots = d->use_slots ? slots : NULL, .o = o};
    if (W) { a.proj = in; a.conv_state = cst; a.conv_weight = cw; a.conv_bias = cb; }
    else a.mixed_qkv = in;
    gdn_exec ex = {GDN_BACKEND_CPU, NULL, 2, 0};
    const gdn_status s = gdn_decode_step(&ex, &c, &a);
    if (check(s == GDN_OK, ctx, "status %s (%s)", gdn_status_string(s), gdn_last_error())) {
        /* o = scale S^T q is a sum over K that may cancel (with a hard decay
         * the whole row is u (k.q)): measured against its terms */
        check_close_terms(ctx, "o", d->dt, o, o_ref, o_terms2, (size_t)B * HV * V, bound_fwd(d->dt));
        check_close(ctx, "state", GDN_F32, state, st_ref, (size_t)pool * HV * st_n, bound_fwd(d->dt));
        if (W) check_close(ctx, "conv_state", GDN_F32, cst, cst_ref, (size_t)pool * D * W, 1e-7);
        /* pool rows no row points at: byte for byte unchanged */
        int untouched_ok = 1;
        for (int64_t p = 0; p < pool; p++) {
            int used = 0;
            for (int b = 0; b < B; b++) used |= (d->use_slots ? slots[b] : b) == p;
            if (used) continue;
            untouched_ok &= !memcmp(state + p * HV * st_n, state0 + p * HV * st_n, sizeof(float) * HV * st_n);
            if (W) untouched_ok &= !memcmp(cst + p * D * W, cst0 + p * D * W, sizeof(float) * D * W);
        }
        check(untouched_ok, ctx, "pool rows of padding or unused slots changed");
    }
    /* the bounds above fail a decode that drops a term or skips the update */
    const size_t no = (size_t)B * HV * V, ns = (size_t)pool * HV * st_n;
    const double e_drop = terms_err_d(o_drop, o_ref, o_terms2, no);
    const double e_skip = fmax(terms_err_d(o_skip, o_ref, o_terms2, no), rel_err_d(st_skip, st_ref, ns, NULL));
    int any_row = 0;   /* a row that is not padding */
    for (int b = 0; b < B; b++) any_row |= !d->use_slots || slots[b] >= 0;
    if (any_row) {
        check(e_drop > bound_fwd(d->dt), ctx, "[wrong decode] one term of S^T q dropped: error %.3e would pass the bound %.1e",
              e_drop, bound_fwd(d->dt));
        check(e_skip > bound_fwd(d->dt), ctx, "[wrong decode] update skipped: error %.3e would pass the bound %.1e",
              e_skip, bound_fwd(d->dt));
    }
    free(slots); free(in); free(ga); free(gb); free(ind); free(gad); free(gbd); free(state); free(state0);
    free(cw); free(cb); free(cst); free(cst0); free(o_ref); free(o_terms2); free(st_ref);
    free(o_drop); free(o_skip); free(st_skip); free(ht_skip); free(gb_off); free(cst_ref);
    free(x); free(q); free(k); free(v); free(ht); free(o);
}

/* Bad input: status, message, pool and outputs byte for byte unchanged. */
static void decode_errors(void) {
    enum { B = 3, H = 1, HV = 2, K = 8, V = 8, D = 2 * H * K + HV * V, POOL = 4 };
    float in[B * D], ga[B * HV], gb[B * HV], A_log[HV] = {0.5f, 1.0f}, state[POOL * HV * K * V], o[B * HV * V];
    for (int i = 0; i < B * D; i++) in[i] = 0.1f * (float)(i % 7);
    for (int i = 0; i < B * HV; i++) { ga[i] = 0.2f; gb[i] = 0.3f; }
    for (int i = 0; i < POOL * HV * K * V; i++) state[i] = 0.01f * (float)(i % 13);
    float state0[sizeof state / sizeof *state], o0[B * HV * V];
    for (int i = 0; i < B * HV * V; i++) o[i] = 7.f;
    memcpy(state0, state, sizeof state);
    memcpy(o0, o, sizeof o);
    struct { const char *what; int32_t slots[B]; int use_slots; unsigned flags; int Hv; int conv_W; int null_state;
             gdn_status want; const char *needle; } cases[] = {
        {"slot out of range", {0, 4, 1}, 1, 0, HV, 0, 0, GDN_ERR_SHAPE, "slots[1] (4)"},
        {"slot below -1", {0, -2, 1}, 1, 0, HV, 0, 0, GDN_ERR_SHAPE, "slots[1] (-2)"},
        {"slot used twice", {2, 0, 2}, 1, 0, HV, 0, 0, GDN_ERR_SHAPE, "slots[2] (2)"},
        {"flag not for decode", {0, 1, 2}, 0, GDN_GATE_FUSED, HV, 0, 0, GDN_ERR_OPTION, "flags"},
        {"HV not a multiple of H", {0, 1, 2}, 0, 0, 3, 0, 0, GDN_ERR_SHAPE, "HV (3)"},
        {"conv_W too large", {0, 1, 2}, 0, 0, HV, 9, 0, GDN_ERR_SHAPE, "conv_W (9)"},
        {"conv_W without proj", {0, 1, 2}, 0, 0, HV, 4, 0, GDN_ERR_NULL, "proj"},
        {"state NULL", {0, 1, 2}, 0, 0, HV, 0, 1, GDN_ERR_NULL, "state"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char ctx[160];
        snprintf(ctx, sizeof ctx, "op=decode_step [errors] %s", cases[i].what);
        gdn_decode_config c = {.B = B, .H = cases[i].Hv == 3 ? 2 : H, .HV = cases[i].Hv, .K = K, .V = V, .dtype = GDN_F32,
                               .flags = cases[i].flags, .num_slots = POOL, .conv_W = cases[i].conv_W};
        gdn_decode_args a = {.mixed_qkv = in, .a = ga, .b = gb, .A_log = A_log,
                             .state = cases[i].null_state ? NULL : state,
                             .slots = cases[i].use_slots ? cases[i].slots : NULL, .o = o};
        const gdn_status s = gdn_decode_step(NULL, &c, &a);
        check(s == cases[i].want, ctx, "status %s, want %s", gdn_status_string(s), gdn_status_string(cases[i].want));
        check(strstr(gdn_last_error(), cases[i].needle) != NULL, ctx, "message \"%s\" does not name \"%s\"",
              gdn_last_error(), cases[i].needle);
        check(!memcmp(state, state0, sizeof state) && !memcmp(o, o0, sizeof o), ctx, "an output changed");
    }
}

/* Prefill (chunk op over the prompt) + n decode steps == one chunk op over it all. */
static void layer_check(gdn_dtype dt, int64_t P, int W, uint64_t seed) {
    enum { NSTEP = 20 };
    const int H = 2, HV = 4, K = 32, V = 24, D = 2 * H * K + HV * V, NS = 2;
    const int64_t T = P + NSTEP;
    const unsigned flags = GDN_QK_L2NORM;
    rng r;
    rng_seed(&r, seed);
    char ctx[256];
    snprintf(ctx, sizeof ctx, "op=layer prefill+decode backend=cpu prompt=%lld steps=%d sequences=%d conv_W=%d "
             "dtype=%s H%d HV%d K%d V%d seed=%llu", (long long)P, NSTEP, NS, W, t_dtype_name(dt), H, HV, K, V,
             (unsigned long long)seed);
    const size_t dsz = t_dsize(dt);
    /* NS sequences of T tokens: raw rows [NS, T, D] (projections when W > 0), a, b [NS, T, HV] */
    void *raw = t_alloc((size_t)NS * T * D * dsz), *ga = t_alloc((size_t)NS * T * HV * dsz),
         *gb = t_alloc((size_t)NS * T * HV * dsz);
    for (size_t i = 0; i < (size_t)NS * T * D; i++) t_store(dt, raw, i, (float)rng_normal(&r));
    for (size_t i = 0; i < (size_t)NS * T * HV; i++) t_store(dt, ga, i, (float)rng_normal(&r));
    for (size_t i = 0; i < (size_t)NS * T * HV; i++) t_store(dt, gb, i, (float)rng_normal(&r));
    float A_log[4], dt_bias[4], *cw = t_alloc(sizeof(float) * D * (W ? W : 1)), *cb = t_alloc(sizeof(float) * D);
    for (int j = 0; j < HV; j++) { A_log[j] = (float)log(1.0 + 7.0 * rng_uniform(&r)); dt_bias[j] = (float)(0.3 * rng_normal(&r)); }
    for (int i = 0; i < D * W; i++) cw[i] = (float)(0.5 * rng_normal(&r));
    for (int i = 0; i < D; i++) cb[i] = (float)(0.1 * rng_normal(&r));

    /* the GDN inputs of every token: the conv over the whole sequence (conv1d op), or raw itself */
    void *mixed = raw;
    if (W) {
        mixed = t_alloc((size_t)NS * T * D * dsz);
        gdn_conv1d_config cc = {.B = NS, .T = T, .D = D, .W = W, .dtype = dt, .silu = 1};
        gdn_conv1d_args ca = {.x = raw, .weight = cw, .bias = cb, .y = mixed};
        const gdn_status s = gdn_conv1d_fwd(NULL, &cc, &ca);
        if (!check(s == GDN_OK, ctx, "conv1d fwd: %s", gdn_last_error())) return;
    }
    /* split into q, k [NS,T,H,K], v [NS,T,HV,V] for the chunk op */
    void *q = t_alloc((size_t)NS * T * H * K * dsz), *k = t_alloc((size_t)NS * T * H * K * dsz),
         *v = t_alloc((size_t)NS * T * HV * V * dsz);
    for (int64_t t = 0; t < NS * T; t++) {
        const char *row = (const char *)mixed + (size_t)t * D * dsz;
        memcpy((char *)q + (size_t)t * H * K * dsz, row, (size_t)H * K * dsz);
        memcpy((char *)k + (size_t)t * H * K * dsz, row + (size_t)H * K * dsz, (size_t)H * K * dsz);
        memcpy((char *)v + (size_t)t * HV * V * dsz, row + (size_t)2 * H * K * dsz, (size_t)HV * V * dsz);
    }
    const unsigned cflags = flags | GDN_GATE_FUSED | GDN_BETA_SIGMOID;
    const size_t st_n = (size_t)NS * HV * K * V;
    /* one chunk call over everything */
    gdn_config full = {.B = NS, .T = T, .H = H, .HV = HV, .K = K, .V = V, .dtype = dt, .gate_dtype = dt, .flags = cflags};
    void *o_full = t_alloc((size_t)NS * T * HV * V * dsz);
    float *ht_full = t_alloc(sizeof(float) * st_n);
    size_t ws = gdn_chunk_fwd_workspace_size(NULL, &full);
    void *wsp = t_alloc(ws);
    gdn_fwd_args fa = {.q = q, .k = k, .v = v, .g = ga, .beta = gb, .A_log = A_log, .dt_bias = dt_bias,
                       .o = o_full, .ht = ht_full, .workspace = wsp, .workspace_bytes = ws};
    gdn_status s = gdn_chunk_fwd(NULL, &full, &fa);
    check(s == GDN_OK, ctx, "full chunk fwd: %s", gdn_last_error());
    free(wsp);
    /* prefill: the first P tokens of each sequence (varlen rows of a B = 1 call) */
    int64_t cu[3];
    void *qp = t_alloc((size_t)NS * P * H * K * dsz), *kp = t_alloc((size_t)NS * P * H * K * dsz),
         *vp = t_alloc((size_t)NS * P * HV * V * dsz), *gap = t_alloc((size_t)NS * P * HV * dsz),
         *gbp = t_alloc((size_t)NS * P * HV * dsz);
    for (int n = 0; n < NS; n++) {
        cu[n] = n * P;
        memcpy((char *)qp + (size_t)n * P * H * K * dsz, (char *)q + (size_t)n * T * H * K * dsz, (size_t)P * H * K * dsz);
        memcpy((char *)kp + (size_t)n * P * H * K * dsz, (char *)k + (size_t)n * T * H * K * dsz, (size_t)P * H * K * dsz);
        memcpy((char *)vp + (size_t)n * P * HV * V * dsz, (char *)v + (size_t)n * T * HV * V * dsz, (size_t)P * HV * V * dsz);
        memcpy((char *)gap + (size_t)n * P * HV * dsz, (char *)ga + (size_t)n * T * HV * dsz, (size_t)P * HV * dsz);
        memcpy((char *)gbp + (size_t)n * P * HV * dsz, (char *)gb + (size_t)n * T * HV * dsz, (size_t)P * HV * dsz);
    }
    cu[NS] = NS * P;
    gdn_config pre = {.B = 1, .T = NS * P, .H = H, .HV = HV, .K = K, .V = V, .cu_seqlens = cu, .num_seqs = NS,
                      .dtype = dt, .gate_dtype = dt, .flags = cflags};
    void *o_pre = t_alloc((size_t)NS * P * HV * V * dsz);
    float *pool = t_alloc(sizeof(float) * st_n);   /* the state pool, rows = sequences */
    ws = gdn_chunk_fwd_workspace_size(NULL, &pre);
    wsp = t_alloc(ws);
    gdn_fwd_args pa = {.q = qp, .k = kp, .v = vp, .g = gap, .beta = gbp, .A_log = A_log, .dt_bias = dt_bias,
                       .o = o_pre, .ht = pool, .workspace = wsp, .workspace_bytes = ws};
    s = gdn_chunk_fwd(NULL, &pre, &pa);
    check(s == GDN_OK, ctx, "prefill chunk fwd: %s", gdn_last_error());
    free(wsp);
    /* the conv state after the prompt: its last W raw inputs (the conv1d op's ht) */
    float *cpool = t_alloc(sizeof(float) * NS * D * (W ? W : 1));
    if (W) {
        void *rawp = t_alloc((size_t)NS * P * D * dsz), *yp = t_alloc((size_t)NS * P * D * dsz);
        for (int n = 0; n < NS; n++)
            memcpy((char *)rawp + (size_t)n * P * D * dsz, (char *)raw + (size_t)n * T * D * dsz, (size_t)P * D * dsz);
        gdn_conv1d_config cc = {.B = NS, .T = P, .D = D, .W = W, .dtype = dt, .silu = 1};
        gdn_conv1d_args ca = {.x = rawp, .weight = cw, .bias = cb, .y = yp, .ht = cpool};
        s = gdn_conv1d_fwd(NULL, &cc, &ca);
        check(s == GDN_OK, ctx, "prefill conv1d fwd: %s", gdn_last_error());
        free(rawp); free(yp);
    }
    /* NSTEP decode steps; rows are the sequences, in reverse pool order to use slots */
    double *o_dec = t_alloc(sizeof(double) * NS * NSTEP * HV * V), *o_ref = t_alloc(sizeof(double) * NS * NSTEP * HV * V);
    void *row = t_alloc((size_t)NS * D * dsz), *ra = t_alloc((size_t)NS * HV * dsz), *rb = t_alloc((size_t)NS * HV * dsz),
         *o1 = t_alloc((size_t)NS * HV * V * dsz);
    const int32_t slots[2] = {1, 0};   /* NS = 2 */
    for (int step = 0; step < NSTEP; step++) {
        for (int b = 0; b < NS; b++) {
            const int n = slots[b];
            const int64_t t = P + step;
            memcpy((char *)row + (size_t)b * D * dsz, (char *)raw + ((size_t)n * T + t) * D * dsz, (size_t)D * dsz);
            memcpy((char *)ra + (size_t)b * HV * dsz, (char *)ga + ((size_t)n * T + t) * HV * dsz, (size_t)HV * dsz);
            memcpy((char *)rb + (size_t)b * HV * dsz, (char *)gb + ((size_t)n * T + t) * HV * dsz, (size_t)HV * dsz);
        }
        t_poison_nan(dt, o1, (size_t)NS * HV * V);
        gdn_decode_config c = {.B = NS, .H = H, .HV = HV, .K = K, .V = V, .dtype = dt, .flags = flags,
                               .num_slots = NS, .conv_W = W};
        gdn_decode_args a = {.a = ra, .b = rb, .A_log = A_log, .dt_bias = dt_bias, .state = pool, .slots = slots, .o = o1};
        if (W) { a.proj = row; a.conv_state = cpool; a.conv_weight = cw; a.conv_bias = cb; }
        else a.mixed_qkv = row;
        s = gdn_decode_step(NULL, &c, &a);
        if (!check(s == GDN_OK, ctx, "decode step %d: %s", step, gdn_last_error())) break;
        for (int b = 0; b < NS; b++) {
            const int n = slots[b];
            for (int i = 0; i < HV * V; i++) {
                o_dec[((size_t)n * NSTEP + step) * HV * V + i] = t_get(dt, o1, (size_t)b * HV * V + i);
                o_ref[((size_t)n * NSTEP + step) * HV * V + i] = t_get(dt, o_full, ((size_t)n * T + P + step) * HV * V + i);
            }
        }
    }
    /* compare as doubles: the decode outputs against the long call's */
    double err = rel_err_d(o_dec, o_ref, (size_t)NS * NSTEP * HV * V, NULL);
    check(err <= bound_fwd(dt), ctx, "decoded o vs one long chunk call: rel error %.3e vs bound %.1e", err, bound_fwd(dt));
    double *htd = t_alloc(sizeof(double) * st_n);
    for (size_t i = 0; i < st_n; i++) htd[i] = ht_full[i];
    check_close(ctx, "final state", GDN_F32, pool, htd, st_n, bound_fwd(dt));
    free(raw); free(ga); free(gb); free(cw); free(cb); if (mixed != raw) free(mixed);
    free(q); free(k); free(v); free(o_full); free(ht_full); free(qp); free(kp); free(vp); free(gap); free(gbp);
    free(o_pre); free(pool); free(cpool); free(o_dec); free(o_ref); free(row); free(ra); free(rb); free(o1); free(htd);
}

void test_decode(void) {
    rng r;
    rng_seed(&r, mix_seed(g_base_seed, 0xdec0de));
    const gdn_dtype dts[3] = {GDN_F32, GDN_BF16, GDN_F16};
    const int shapes[][5] = {{1, 1, 1, 16, 16}, {4, 2, 4, 24, 40}, {7, 2, 8, 64, 64}, {3, 1, 2, 128, 128}, {5, 3, 3, 17, 9}};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
        for (int di = 0; di < 3; di++)
            for (int variant = 0; variant < 4; variant++) {
                dcase d = {shapes[si][0], shapes[si][1], shapes[si][2], shapes[si][3], shapes[si][4], 0, dts[di],
                           0, 0, 1};
                d.flags = (variant & 1 ? GDN_QK_L2NORM : 0) | (variant == 3 ? GDN_BETA_NEGATIVE : 0) |
                          (variant & 2 ? GDN_STATE_V_FIRST : 0);
                d.use_slots = variant >= 1;
                d.W = variant == 2 ? 4 : variant == 3 ? 1 + (int)(si % 8) : 0;
                d.dtb = variant != 1;
                run_decode_case(&d, rng_u64(&r));
            }
    decode_errors();
    const int64_t prompts[] = {1, 63, 64, 65, 500};
    for (size_t i = 0; i < sizeof prompts / sizeof *prompts; i++)
        for (int di = 0; di < 2; di++)
            for (int W = 0; W <= 4; W += 4) layer_check(dts[di], prompts[i], W, rng_u64(&r));
}
