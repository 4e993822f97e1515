/* Bad input (DESIGN.md §6): every rejected call returns the expected status,
 * leaves a non-empty gdn_last_error(), and does not change one byte of any
 * output buffer. A successful call leaves gdn_last_error() == "". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "test_util.h"

#define BUF_BYTES (1u << 20)   /* every buffer: room for any mutated shape below */
#define PATTERN 0xA5

enum { OP_FWD, OP_REC, OP_BWD, OP_GATE_FWD, OP_GATE_BWD, OP_L2_FWD, OP_L2_BWD };
static const char *op_names[] = {"chunk_fwd", "recurrent_fwd", "chunk_bwd", "gate_fwd", "gate_bwd",
                                 "l2norm_fwd", "l2norm_bwd"};

enum { O_O, O_HT, O_SAVED, O_DQ, O_DK, O_DV, O_DG, O_DBETA, O_DALOG, O_DDT, O_DH0, O_Y, O_RSTD, NOUT };

typedef struct env {
    gdn_config c;
    gdn_exec ex;
    const gdn_exec *exp;
    const gdn_config *cfgp;
    int64_t cu[8];
    gdn_fwd_args fa;
    gdn_bwd_args ba;
    const gdn_fwd_args *fap;
    const gdn_bwd_args *bap;
    /* standalone calls */
    int64_t rows;
    int dim;
    gdn_dtype sdt;
    const void *s_x, *s_dy;
    const float *s_A, *s_bias, *s_dg, *s_rstd;
    void *s_y, *s_dx;
    float *s_g, *s_dA, *s_ddt, *s_rs;
} env;

static void *in_q, *in_k, *in_v, *in_g, *in_beta, *in_dout;
static float *in_A, *in_bias, *in_h0, *in_dht, *in_rstd;
static void *outs[NOUT];
static void *ws;
static size_t ws_fwd_bytes, ws_bwd_bytes, saved_bytes;

static void fill_f32(void *p, size_t n, float v) { for (size_t i = 0; i < n; i++) ((float *)p)[i] = v; }

static void setup(void) {
    in_q = t_alloc(BUF_BYTES); in_k = t_alloc(BUF_BYTES); in_v = t_alloc(BUF_BYTES);
    in_g = t_alloc(BUF_BYTES); in_beta = t_alloc(BUF_BYTES); in_dout = t_alloc(BUF_BYTES);
    in_A = t_alloc(BUF_BYTES); in_bias = t_alloc(BUF_BYTES); in_h0 = t_alloc(BUF_BYTES);
    in_dht = t_alloc(BUF_BYTES); in_rstd = t_alloc(BUF_BYTES);
    const size_t n = BUF_BYTES / 4;
    fill_f32(in_q, n, 0.1f); fill_f32(in_k, n, 0.1f); fill_f32(in_v, n, 0.2f); fill_f32(in_g, n, -0.1f);
    fill_f32(in_beta, n, 0.5f); fill_f32(in_dout, n, 0.3f); fill_f32(in_A, n, 0.5f); fill_f32(in_bias, n, 0.1f);
    fill_f32(in_h0, n, 0.01f); fill_f32(in_dht, n, 0.02f); fill_f32(in_rstd, n, 1.0f);
    for (int i = 0; i < NOUT; i++) outs[i] = t_alloc(BUF_BYTES);
    ws = t_alloc(BUF_BYTES);
}

static void teardown(void) {
    free(in_q); free(in_k); free(in_v); free(in_g); free(in_beta); free(in_dout);
    free(in_A); free(in_bias); free(in_h0); free(in_dht); free(in_rstd);
    for (int i = 0; i < NOUT; i++) free(outs[i]);
    free(ws);
}

/* A valid call of every op: B=1 T=6 H=2 HV=4 K=8 V=8 f32, l2norm + fused gate + sigmoid beta. */
static void env_reset(env *e) {
    memset(e, 0, sizeof *e);
    gdn_config *c = &e->c;
    c->B = 1; c->T = 6; c->H = 2; c->HV = 4; c->K = 8; c->V = 8;
    c->dtype = GDN_F32; c->gate_dtype = GDN_F32;
    c->flags = GDN_QK_L2NORM | GDN_GATE_FUSED | GDN_BETA_SIGMOID;
    e->cu[0] = 0; e->cu[1] = 2; e->cu[2] = 2; e->cu[3] = 6;
    e->ex.backend = GDN_BACKEND_CPU; e->ex.threads = 1;
    e->exp = &e->ex; e->cfgp = &e->c;
    ws_fwd_bytes = gdn_chunk_fwd_workspace_size(&e->ex, c);
    ws_bwd_bytes = gdn_chunk_bwd_workspace_size(&e->ex, c);
    saved_bytes = gdn_chunk_saved_size(c);
    gdn_fwd_args *f = &e->fa;
    f->q = in_q; f->k = in_k; f->v = in_v; f->g = in_g; f->beta = in_beta; f->A_log = in_A;
    f->dt_bias = in_bias; f->h0 = in_h0; f->o = outs[O_O]; f->ht = outs[O_HT];
    f->saved = outs[O_SAVED]; f->saved_bytes = saved_bytes;
    f->workspace = ws; f->workspace_bytes = ws_fwd_bytes;
    gdn_bwd_args *b = &e->ba;
    b->q = in_q; b->k = in_k; b->v = in_v; b->g = in_g; b->beta = in_beta; b->A_log = in_A;
    b->dt_bias = in_bias; b->h0 = in_h0; b->saved = in_rstd; b->saved_bytes = saved_bytes;
    b->dout = in_dout; b->dht = in_dht;
    b->dq = outs[O_DQ]; b->dk = outs[O_DK]; b->dv = outs[O_DV]; b->dg = outs[O_DG]; b->dbeta = outs[O_DBETA];
    b->dA_log = outs[O_DALOG]; b->ddt_bias = outs[O_DDT]; b->dh0 = outs[O_DH0];
    b->workspace = ws; b->workspace_bytes = ws_bwd_bytes;
    e->fap = &e->fa; e->bap = &e->ba;
    e->rows = 5; e->dim = 8; e->sdt = GDN_F32;
    e->s_x = in_q; e->s_dy = in_dout; e->s_A = in_A; e->s_bias = in_bias; e->s_dg = in_dout; e->s_rstd = in_rstd;
    e->s_y = outs[O_Y]; e->s_dx = outs[O_DQ]; e->s_g = outs[O_HT]; e->s_dA = outs[O_DALOG]; e->s_ddt = outs[O_DDT];
    e->s_rs = outs[O_RSTD];
    for (int i = 0; i < NOUT; i++) memset(outs[i], PATTERN, BUF_BYTES);
}

static gdn_status call(env *e, int op) {
    switch (op) {
    case OP_FWD: return gdn_chunk_fwd(e->exp, e->cfgp, e->fap);
    case OP_REC: return gdn_recurrent_fwd(e->exp, e->cfgp, e->fap);
    case OP_BWD: return gdn_chunk_bwd(e->exp, e->cfgp, e->bap);
    case OP_GATE_FWD: return gdn_gate_fwd(e->exp, e->rows, e->dim, e->sdt, e->s_x, e->s_A, e->s_bias, e->s_g);
    case OP_GATE_BWD: return gdn_gate_bwd(e->exp, e->rows, e->dim, e->sdt, e->s_x, e->s_A, e->s_bias, e->s_dg,
                                          e->s_dx, e->s_dA, e->s_ddt);
    case OP_L2_FWD: return gdn_l2norm_fwd(e->exp, e->rows, e->dim, e->sdt, e->s_x, e->s_y, e->s_rs);
    case OP_L2_BWD: return gdn_l2norm_bwd(e->exp, e->rows, e->dim, e->sdt, e->s_x, e->s_rstd, e->s_dy, e->s_dx);
    }
    return GDN_OK;
}

static int outputs_untouched(int *which) {
    for (int i = 0; i < NOUT; i++) {
        const unsigned char *p = outs[i];
        for (size_t b = 0; b < BUF_BYTES; b++)
            if (p[b] != PATTERN) { *which = i; return 0; }
    }
    return 1;
}

static const char *out_names[] = {"o", "ht", "saved", "dq/dx", "dk", "dv", "dg", "dbeta", "dA_log",
                                  "ddt_bias", "dh0", "y", "rstd"};

/* Run op on the mutated env e: expect a status in the mask `expect` (bit per
 * status), a non-empty message containing each of the NULL-terminated
 * substrings, and no output byte changed. */
static void expect_err(env *e, int op, const char *what, unsigned expect, const char *must1, const char *must2) {
    char ctx[256];
    snprintf(ctx, sizeof ctx, "op=%s backend=cpu bad input: %s", op_names[op], what);
    const gdn_status st = call(e, op);
    const char *msg = gdn_last_error();
    int which = -1;
    int ok = st != GDN_OK && ((expect >> st) & 1u);
    ok = check(ok, ctx, "status %s, expected %s%s (message \"%s\")", gdn_status_string(st),
               gdn_status_string((gdn_status)__builtin_ctz(expect)), (expect & (expect - 1)) ? " (or similar)" : "", msg);
    if (st != GDN_OK) {
        check(msg && msg[0], ctx, "gdn_last_error() must be non-empty after an error");
        if (must1) check(msg && strstr(msg, must1), ctx, "message \"%s\" must contain \"%s\"", msg, must1);
        if (must2) check(msg && strstr(msg, must2), ctx, "message \"%s\" must contain \"%s\"", msg, must2);
    }
    check(outputs_untouched(&which), ctx, "no output byte may change%s%s", which >= 0 ? ": changed: " : "", which >= 0 ? out_names[which] : "");
    (void)ok;
}

#define M(s) (1u << (s))

/* the config-level mistakes, for chunk_fwd, recurrent_fwd and chunk_bwd */
static void config_errors(int op) {
    env e;
    env_reset(&e); e.cfgp = NULL; expect_err(&e, op, "cfg NULL", M(GDN_ERR_NULL), NULL, NULL);
    env_reset(&e); if (op == OP_BWD) e.bap = NULL; else e.fap = NULL;
    expect_err(&e, op, "args NULL", M(GDN_ERR_NULL), NULL, NULL);
    env_reset(&e); e.c.H = 4; e.c.HV = 6; expect_err(&e, op, "HV 6, H 4", M(GDN_ERR_SHAPE), "HV (6)", "H (4)");
    env_reset(&e); e.c.H = 0; expect_err(&e, op, "H 0", M(GDN_ERR_SHAPE), NULL, NULL);
    env_reset(&e); e.c.HV = 0; expect_err(&e, op, "HV 0", M(GDN_ERR_SHAPE), NULL, NULL);
    env_reset(&e); e.c.K = 0; expect_err(&e, op, "K 0", M(GDN_ERR_SHAPE), "K (0)", NULL);
    env_reset(&e); e.c.K = 257; expect_err(&e, op, "K 257", M(GDN_ERR_SHAPE), "K (257)", NULL);
    env_reset(&e); e.c.V = 0; expect_err(&e, op, "V 0", M(GDN_ERR_SHAPE), "V (0)", NULL);
    env_reset(&e); e.c.V = 257; expect_err(&e, op, "V 257", M(GDN_ERR_SHAPE), "V (257)", NULL);
    env_reset(&e); e.c.T = -1; expect_err(&e, op, "T -1", M(GDN_ERR_SHAPE), "T (-1)", NULL);
    env_reset(&e); e.c.B = -2; expect_err(&e, op, "B -2", M(GDN_ERR_SHAPE), "B (-2)", NULL);
    /* cu_seqlens */
    env_reset(&e); e.c.cu_seqlens = e.cu; e.c.num_seqs = 3; e.c.B = 2; e.c.T = 3;
    expect_err(&e, op, "cu_seqlens with B 2", M(GDN_ERR_SEQLENS), NULL, NULL);
    env_reset(&e); e.c.cu_seqlens = e.cu; e.c.num_seqs = 3; e.cu[1] = 4; e.cu[2] = 3;
    expect_err(&e, op, "cu_seqlens unsorted {0,4,3,6}", M(GDN_ERR_SEQLENS), NULL, NULL);
    env_reset(&e); e.c.cu_seqlens = e.cu; e.c.num_seqs = 3; e.cu[0] = 1;
    expect_err(&e, op, "cu_seqlens[0] 1", M(GDN_ERR_SEQLENS), NULL, NULL);
    env_reset(&e); e.c.cu_seqlens = e.cu; e.c.num_seqs = 3; e.cu[3] = 5;
    expect_err(&e, op, "cu_seqlens last 5 != T 6", M(GDN_ERR_SEQLENS), NULL, NULL);
    env_reset(&e); e.c.cu_seqlens = e.cu; e.c.num_seqs = 3; e.cu[2] = 9; e.cu[3] = 9;
    expect_err(&e, op, "cu_seqlens past T {0,2,9,9}", M(GDN_ERR_SEQLENS), NULL, NULL);
    env_reset(&e); e.c.cu_seqlens = e.cu; e.c.num_seqs = 3; e.cu[1] = -1;
    expect_err(&e, op, "cu_seqlens negative {0,-1,2,6}", M(GDN_ERR_SEQLENS), NULL, NULL);
    env_reset(&e); e.c.cu_seqlens = e.cu; e.c.num_seqs = 0;
    expect_err(&e, op, "cu_seqlens with num_seqs 0", M(GDN_ERR_SEQLENS) | M(GDN_ERR_SHAPE), NULL, NULL);
    /* options and dtypes */
    env_reset(&e); e.c.flags = GDN_BETA_NEGATIVE;
    expect_err(&e, op, "BETA_NEGATIVE without BETA_SIGMOID", M(GDN_ERR_OPTION), NULL, NULL);
    env_reset(&e); e.c.flags |= 1u << 9; expect_err(&e, op, "unknown flag bit", M(GDN_ERR_OPTION), NULL, NULL);
    env_reset(&e); e.c.dtype = (gdn_dtype)7; expect_err(&e, op, "dtype 7", M(GDN_ERR_DTYPE), NULL, NULL);
    env_reset(&e); e.c.dtype = GDN_BF16; e.c.gate_dtype = GDN_F16;
    expect_err(&e, op, "gate_dtype f16 with dtype bf16", M(GDN_ERR_DTYPE), NULL, NULL);
    env_reset(&e); e.c.gate_dtype = GDN_BF16;
    expect_err(&e, op, "gate_dtype bf16 with dtype f32", M(GDN_ERR_DTYPE), NULL, NULL);
    env_reset(&e); e.c.gate_dtype = (gdn_dtype)-1;
    expect_err(&e, op, "gate_dtype -1", M(GDN_ERR_DTYPE), NULL, NULL);
    env_reset(&e); e.c.scale = NAN;
    expect_err(&e, op, "scale NaN", M(GDN_ERR_OPTION) | M(GDN_ERR_SHAPE), NULL, NULL);
    env_reset(&e); e.ex.threads = -1; expect_err(&e, op, "threads -1", M(GDN_ERR_OPTION), NULL, NULL);
    env_reset(&e); e.ex.backend = (gdn_backend)5; expect_err(&e, op, "backend 5", M(GDN_ERR_BACKEND), NULL, NULL);
    if (!gdn_backend_available(GDN_BACKEND_CUDA)) {
        env_reset(&e); e.ex.backend = GDN_BACKEND_CUDA;
        expect_err(&e, op, "CUDA backend not built", M(GDN_ERR_BACKEND), NULL, NULL);
    }
    /* fused gate needs A_log and a */
    env_reset(&e); e.fa.A_log = NULL; e.ba.A_log = NULL;
    expect_err(&e, op, "GATE_FUSED without A_log", M(GDN_ERR_NULL), "A_log", NULL);
    env_reset(&e); e.fa.g = NULL; e.ba.g = NULL;
    expect_err(&e, op, "GATE_FUSED without a (g NULL)", M(GDN_ERR_NULL), NULL, NULL);
}

static void pointer_errors(void) {
    env e;
    const char *fwd_names[] = {"q", "k", "v", "beta", "o"};
    for (int op = OP_FWD; op <= OP_REC; op++) {
        for (int i = 0; i < 5; i++) {
            env_reset(&e);
            switch (i) {
            case 0: e.fa.q = NULL; break;
            case 1: e.fa.k = NULL; break;
            case 2: e.fa.v = NULL; break;
            case 3: e.fa.beta = NULL; break;
            case 4: e.fa.o = NULL; break;
            }
            char what[64];
            snprintf(what, sizeof what, "%s NULL", fwd_names[i]);
            expect_err(&e, op, what, M(GDN_ERR_NULL), fwd_names[i], NULL);
        }
    }
    /* chunk forward: workspace and saved sizes */
    if (ws_fwd_bytes > 0) {
        env_reset(&e); e.fa.workspace_bytes = ws_fwd_bytes - 1;
        expect_err(&e, OP_FWD, "workspace one byte too small", M(GDN_ERR_WORKSPACE), NULL, NULL);
        env_reset(&e); e.fa.workspace = NULL;
        expect_err(&e, OP_FWD, "workspace NULL", M(GDN_ERR_NULL) | M(GDN_ERR_WORKSPACE), NULL, NULL);
    }
    env_reset(&e); e.fa.saved_bytes = saved_bytes - 1;
    expect_err(&e, OP_FWD, "saved one byte too small", M(GDN_ERR_WORKSPACE), NULL, NULL);

    const char *bwd_names[] = {"q", "k", "v", "beta", "dout", "dq", "dk", "dv", "dbeta", "dg", "dA_log", "saved"};
    for (int i = 0; i < 12; i++) {
        env_reset(&e);
        switch (i) {
        case 0: e.ba.q = NULL; break;
        case 1: e.ba.k = NULL; break;
        case 2: e.ba.v = NULL; break;
        case 3: e.ba.beta = NULL; break;
        case 4: e.ba.dout = NULL; break;
        case 5: e.ba.dq = NULL; break;
        case 6: e.ba.dk = NULL; break;
        case 7: e.ba.dv = NULL; break;
        case 8: e.ba.dbeta = NULL; break;
        case 9: e.ba.dg = NULL; break;
        case 10: e.ba.dA_log = NULL; break;
        case 11: e.ba.saved = NULL; break;
        }
        char what[64];
        snprintf(what, sizeof what, "%s NULL", bwd_names[i]);
        expect_err(&e, OP_BWD, what, M(GDN_ERR_NULL), bwd_names[i], NULL);
    }
    /* a non-fused gate given without dg */
    env_reset(&e); e.c.flags = GDN_QK_L2NORM; e.ba.dg = NULL;
    expect_err(&e, OP_BWD, "g given, dg NULL (no GATE_FUSED)", M(GDN_ERR_NULL), "dg", NULL);
    env_reset(&e); e.ba.saved_bytes = saved_bytes - 1;
    expect_err(&e, OP_BWD, "saved one byte too small", M(GDN_ERR_WORKSPACE), NULL, NULL);
    if (ws_bwd_bytes > 0) {
        env_reset(&e); e.ba.workspace_bytes = ws_bwd_bytes - 1;
        expect_err(&e, OP_BWD, "workspace one byte too small", M(GDN_ERR_WORKSPACE), NULL, NULL);
        env_reset(&e); e.ba.workspace_bytes = 0;
        expect_err(&e, OP_BWD, "workspace_bytes 0", M(GDN_ERR_WORKSPACE), NULL, NULL);
        env_reset(&e); e.ba.workspace = NULL;
        expect_err(&e, OP_BWD, "workspace NULL", M(GDN_ERR_NULL) | M(GDN_ERR_WORKSPACE), NULL, NULL);
    }
}

static void standalone_errors(void) {
    env e;
    for (int op = OP_GATE_FWD; op <= OP_L2_BWD; op++) {
        env_reset(&e); e.rows = -1; expect_err(&e, op, "rows -1", M(GDN_ERR_SHAPE), NULL, NULL);
        env_reset(&e); e.dim = 0; expect_err(&e, op, "HV/dim 0", M(GDN_ERR_SHAPE), NULL, NULL);
        env_reset(&e); e.sdt = (gdn_dtype)3; expect_err(&e, op, "dtype 3", M(GDN_ERR_DTYPE), NULL, NULL);
        env_reset(&e); e.ex.threads = -4; expect_err(&e, op, "threads -4", M(GDN_ERR_OPTION), NULL, NULL);
        env_reset(&e); e.s_x = NULL; expect_err(&e, op, "input (a / x) NULL", M(GDN_ERR_NULL), NULL, NULL);
    }
    env_reset(&e); e.s_A = NULL; expect_err(&e, OP_GATE_FWD, "A_log NULL", M(GDN_ERR_NULL), "A_log", NULL);
    env_reset(&e); e.s_g = NULL; expect_err(&e, OP_GATE_FWD, "g NULL", M(GDN_ERR_NULL), NULL, NULL);
    env_reset(&e); e.s_A = NULL; expect_err(&e, OP_GATE_BWD, "A_log NULL", M(GDN_ERR_NULL), "A_log", NULL);
    env_reset(&e); e.s_dg = NULL; expect_err(&e, OP_GATE_BWD, "dg NULL", M(GDN_ERR_NULL), "dg", NULL);
    env_reset(&e); e.s_dx = NULL; expect_err(&e, OP_GATE_BWD, "da NULL", M(GDN_ERR_NULL), "da", NULL);
    env_reset(&e); e.s_dA = NULL; expect_err(&e, OP_GATE_BWD, "dA_log NULL", M(GDN_ERR_NULL), "dA_log", NULL);
    env_reset(&e); e.s_y = NULL; expect_err(&e, OP_L2_FWD, "y NULL", M(GDN_ERR_NULL), NULL, NULL);
    env_reset(&e); e.s_rstd = NULL; expect_err(&e, OP_L2_BWD, "rstd NULL", M(GDN_ERR_NULL), "rstd", NULL);
    env_reset(&e); e.s_dy = NULL; expect_err(&e, OP_L2_BWD, "dy NULL", M(GDN_ERR_NULL), "dy", NULL);
    env_reset(&e); e.s_dx = NULL; expect_err(&e, OP_L2_BWD, "dx NULL", M(GDN_ERR_NULL), "dx", NULL);
}

/* after an error, a successful call of each op clears the message */
static void success_clears(void) {
    env e;
    for (int op = OP_FWD; op <= OP_L2_BWD; op++) {
        env_reset(&e);
        e.c.K = 0;
        (void)call(&e, OP_FWD);   /* leaves an error message */
        env_reset(&e);
        if (op == OP_BWD) {       /* backward gets what forward saved */
            (void)gdn_chunk_fwd(e.exp, e.cfgp, e.fap);
            e.ba.saved = outs[O_SAVED];
            e.c.K = 0; (void)call(&e, OP_FWD); e.c.K = 8;
        }
        const gdn_status st = call(&e, op);
        char ctx[128];
        snprintf(ctx, sizeof ctx, "op=%s backend=cpu valid call after an error", op_names[op]);
        if (check(st == GDN_OK, ctx, "status %s (%s)", gdn_status_string(st), gdn_last_error()))
            check(gdn_last_error()[0] == 0, ctx, "gdn_last_error() is \"%s\", expected \"\"", gdn_last_error());
    }
    /* T = 0 leaves ht = h0 and o untouched */
    env_reset(&e);
    e.c.T = 0;
    e.fa.workspace_bytes = gdn_chunk_fwd_workspace_size(e.exp, &e.c);
    e.fa.saved_bytes = gdn_chunk_saved_size(&e.c);
    const size_t nst = (size_t)e.c.HV * e.c.K * e.c.V;
    for (int op = OP_FWD; op <= OP_REC; op++) {
        memset(outs[O_HT], PATTERN, nst * 4);
        const gdn_status st = call(&e, op);
        char ctx[128];
        snprintf(ctx, sizeof ctx, "op=%s backend=cpu T=0", op_names[op]);
        if (check(st == GDN_OK, ctx, "status %s (%s)", gdn_status_string(st), gdn_last_error()))
            check(memcmp(outs[O_HT], in_h0, nst * 4) == 0, ctx, "ht != h0");
    }
    /* status strings and dtype helpers */
    int ok = 1;
    for (int s = 0; s <= GDN_ERR_UNSUPPORTED; s++) {
        const char *n = gdn_status_string((gdn_status)s);
        ok &= n && !strncmp(n, "GDN_", 4);
    }
    ok &= gdn_dtype_size(GDN_F32) == 4 && gdn_dtype_size(GDN_BF16) == 2 && gdn_dtype_size(GDN_F16) == 2;
    ok &= gdn_backend_available(GDN_BACKEND_CPU) == 1;
    check(ok, "op=misc", "gdn_status_string / gdn_dtype_size / gdn_backend_available");
}

void test_errors(void) {
    setup();
    config_errors(OP_FWD);
    config_errors(OP_REC);
    config_errors(OP_BWD);
    pointer_errors();
    standalone_errors();
    success_clears();
    teardown();
}
