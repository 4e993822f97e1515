/* The conv1d device tests on the CUDA backend: forward, single-token update and
 * backward against the float64 reference (and the CPU backend), run by
 * test_cuda_layer() (test_cuda_layer.c) through test_conv_fwd/_update/_bwd. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ref/ref_conv1d.h"
#include "test_util.h"

#ifndef GDN_HAVE_CUDA
/* not built without nvcc: test_cuda_layer() (test_cuda_layer.c) says skipped */
#else
#include <cuda_runtime_api.h>
#include "test_cuda_util.h"

/* ---- conv1d forward ---- */

typedef struct cfcase {
    int64_t B, T;
    int nseq;                 /* > 0: varlen (B = 1), lengths in lens */
    int64_t lens[10];
    int D, W;
    gdn_dtype dt;
    int silu, bias, h0, ht;
    int inplace;              /* ht written over h0 (needs h0, ht) */
    int misalign;             /* x and y one element off 16-byte alignment */
    int stream;               /* a stream of its own rather than the default one */
} cfcase;

static void conv_fwd_case(const cfcase *k, uint64_t seed) {
    rng r;
    rng_seed(&r, seed);
    int64_t cu[11] = {0}, B = k->B, T = k->T, N = k->B;
    if (k->nseq) {
        B = 1; T = 0;
        for (int i = 0; i < k->nseq; i++) { T += k->lens[i]; cu[i + 1] = T; }
        N = k->nseq;
    }
    const int D = k->D, W = k->W;
    const gdn_dtype dt = k->dt;
    const size_t nx = (size_t)(B * T) * D, nw = (size_t)D * W, nst = (size_t)N * D * W;
    char ctx[400], lens[120] = "";
    for (int i = 0, o = 0; i < k->nseq; i++) o += snprintf(lens + o, sizeof lens - o, "%s%lld", i ? "," : "", (long long)k->lens[i]);
    snprintf(ctx, sizeof ctx, "op=conv1d_fwd backend=cuda B%lld T%lld%s%s%s D%d W%d dtype=%s silu=%d bias=%d h0=%d ht=%d "
             "inplace=%d misalign=%d stream=%d seed=%llu", (long long)B, (long long)T, k->nseq ? " varlen[" : "", lens,
             k->nseq ? "]" : "", D, W, t_dtype_name(dt), k->silu, k->bias, k->h0, k->ht, k->inplace, k->misalign,
             k->stream, (unsigned long long)seed);
    double *xd = dvec(nx), *wd = dvec(nw), *bd = dvec(D), *h0d = dvec(nst), *yr = dvec(nx), *htr = dvec(nst);
    void *x = rnd(&r, dt, nx, 1.0, xd);
    float *w = rnd(&r, GDN_F32, nw, 0.6, wd), *bias = rnd(&r, GDN_F32, D, 0.5, bd), *h0 = rnd(&r, GDN_F32, nst, 1.0, h0d);
    gdn_conv1d_config c = {.B = B, .T = T, .D = D, .W = W, .dtype = dt, .silu = k->silu};
    if (k->nseq) { c.cu_seqlens = cu; c.num_seqs = k->nseq; }
    gdn_ref_conv1d_fwd(&c, xd, wd, k->bias ? bd : NULL, k->h0 ? h0d : NULL, yr, htr);

    void *xb, *yb, *htb, *h0b;
    const void *dx = dput_at(x, nx, dt, k->misalign, &xb);
    void *dy = dnan_at(dt, nx, k->misalign, &yb);
    float *dht = dnan_at(GDN_F32, nst, 0, &htb), *dh0 = dput_at(h0, nst, GDN_F32, 0, &h0b);
    float *dw = dput(w, nw * 4), *dbias = dput(bias, (size_t)D * 4);
    int64_t *dcu = dput(cu, sizeof cu);
    cudaStream_t st = NULL;
    if (k->stream) cudaStreamCreate(&st);
    const gdn_exec ex = {GDN_BACKEND_CUDA, st, 0, 0};
    gdn_conv1d_args a = {dx, dw, k->bias ? dbias : NULL, k->h0 ? dh0 : NULL, dy, k->ht ? dht : NULL};
    if (k->inplace) a.ht = dh0;
    gdn_status s;
    if (k->nseq) c.cu_seqlens_dev = dcu;
    s = gdn_conv1d_fwd(&ex, &c, &a);
    if (ran(ctx, s)) {
        dclose(ctx, "y", dt, dy, yr, nx, bound_fwd(dt));
        if (k->inplace) dclose(ctx, "ht (over h0, in place)", GDN_F32, dh0, htr, nst, bound_fwd(GDN_F32));
        else if (k->ht) dclose(ctx, "ht", GDN_F32, dht, htr, nst, bound_fwd(GDN_F32));
        if (!k->inplace) check(dsame(dh0, h0, nst * 4), ctx, "h0 unchanged");
    }
    if (st) cudaStreamDestroy(st);
    void *dev[] = {xb, yb, htb, h0b, dw, dbias, dcu};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
    free(xd); free(wd); free(bd); free(h0d); free(yr); free(htr); free(x); free(w); free(bias); free(h0);
}

void test_conv_fwd(rng *r) {
    long idx = 0;
    /* every W x dtype x T, B = 2; D = 37 (1-channel path) or 64 (vector path); options cycle */
    const int64_t Ts[6] = {0, 1, 3, 64, 65, 2 + rng_int(r, 0, 150)};
    for (int W = 1; W <= 8; W++)
        for (int di = 0; di < 3; di++)
            for (int ti = 0; ti < 6; ti++, idx++) {
                if (g_quick && ti % 2) continue;
                const unsigned o = (unsigned)(idx * 23 % 32);
                cfcase k = {.B = 2, .T = Ts[ti], .D = (idx % 2) ? 64 : 37, .W = W, .dt = dts[di], .silu = (int)(idx % 3 != 0),
                            .bias = !!(o & 1), .h0 = !!(o & 2), .ht = !!(o & 4), .misalign = (idx % 7 == 3),
                            .stream = (idx % 5 == 2)};
                k.inplace = k.h0 && k.ht && (o & 8);
                if (ti == 3) k.bias = k.h0 = k.ht = 1;
                conv_fwd_case(&k, rng_u64(r));
            }
    /* varlen: empty, 1-token and ragged sequences (runs of rows cross sequence borders) */
    const int64_t sets[5][8] = {{0, 1, 5, 0, 17, 1, 64, 3}, {1}, {0}, {70, 0, 1, 130, 2}, {0}};
    const int set_n[5] = {8, 1, 1, 5, 7};
    for (int si = 0; si < 5; si++)
        for (int W = 1; W <= 8; W++)
            for (int di = 0; di < 3; di++, idx++) {
                if (g_quick && (W + di) % 2) continue;
                cfcase k = {.nseq = set_n[si], .D = si == 3 ? 19 : (W % 2 ? 64 : 40), .W = W, .dt = dts[di],
                            .silu = (int)(idx % 2), .bias = 1, .h0 = (int)(idx % 3 != 1), .ht = 1, .misalign = si == 2};
                for (int i = 0; i < k.nseq; i++) k.lens[i] = si == 4 ? rng_int(r, 0, 80) : sets[si][i];
                k.inplace = k.h0 && idx % 2;
                conv_fwd_case(&k, rng_u64(r));
            }
    /* layer-sized channel counts, and enough rows that a thread runs 32 of them */
    const cfcase big[] = {
        {.B = 2, .T = 65, .D = 2048, .W = 4, .dt = GDN_BF16, .silu = 1, .bias = 1, .h0 = 1, .ht = 1},
        {.B = 1, .T = 100, .D = 8192, .W = 4, .dt = GDN_BF16, .silu = 1, .bias = 1, .h0 = 1, .ht = 1, .inplace = 1},
        {.B = 3, .T = 33, .D = 2048, .W = 3, .dt = GDN_F32, .silu = 0, .ht = 1, .stream = 1},
        {.B = 1, .T = 64, .D = 2048, .W = 8, .dt = GDN_F16, .silu = 1, .bias = 1, .h0 = 1, .ht = 1},
        {.B = 2, .T = 40, .D = 1, .W = 4, .dt = GDN_F32, .silu = 1, .bias = 1, .h0 = 1, .ht = 1},
        {.B = 1, .T = 120000, .D = 37, .W = 4, .dt = GDN_F32, .silu = 1, .bias = 1, .h0 = 1, .ht = 1},
        {.B = 2, .T = 3000, .D = 72, .W = 6, .dt = GDN_BF16, .silu = 1, .h0 = 1, .ht = 1},
        {.nseq = 4, .lens = {60000, 0, 1, 59999}, .D = 37, .W = 4, .dt = GDN_F16, .silu = 1, .bias = 1, .h0 = 1, .ht = 1},
        {.nseq = 4, .lens = {0, 1, 77, 3}, .D = 2048, .W = 4, .dt = GDN_BF16, .silu = 1, .bias = 1, .h0 = 1, .ht = 1},
    };
    for (size_t i = 0; i < sizeof big / sizeof *big; i++) {
        if (g_quick && big[i].B * big[i].T > 10000) continue;
        conv_fwd_case(&big[i], rng_u64(r));
    }
}

/* ---- conv1d single-token update ---- */

/* B rows into a pool of NS slots; slots NULL = row b uses slot b. On CUDA a
 * slot outside -1..NS-1 is padding (the host cannot check device slots). */
static void conv_update_case(int64_t B, int64_t NS, const int32_t *slots, int D, int W, gdn_dtype dt, int silu,
                             int with_bias, int misalign, uint64_t seed) {
    rng r;
    rng_seed(&r, seed);
    char ctx[300];
    snprintf(ctx, sizeof ctx, "op=conv1d_update backend=cuda B%lld num_slots%lld slots=%s D%d W%d dtype=%s silu=%d "
             "bias=%d misalign=%d seed=%llu", (long long)B, (long long)NS, slots ? "given" : "NULL", D, W,
             t_dtype_name(dt), silu, with_bias, misalign, (unsigned long long)seed);
    const size_t nx = (size_t)B * D, row = (size_t)D * W, npool = (size_t)NS * row;
    double *xd = dvec(nx), *wd = dvec(row), *bd = dvec(D), *pd = dvec(npool), *yr = dvec(nx);
    void *x = rnd(&r, dt, nx, 1.0, xd);
    float *w = rnd(&r, GDN_F32, row, 0.6, wd), *bias = rnd(&r, GDN_F32, D, 0.5, bd), *pool = rnd(&r, GDN_F32, npool, 1.0, pd);
    int32_t *sref = t_alloc(sizeof(int32_t) * (size_t)(B + 1));
    for (int64_t b = 0; b < B; b++) {
        const int64_t s = slots ? slots[b] : b;
        sref[b] = (int32_t)(s >= 0 && s < NS ? s : -1);
    }
    gdn_ref_conv1d_update(B, D, W, silu, xd, wd, with_bias ? bd : NULL, pd, sref, yr);
    void *pb, *yb;
    void *dx = dput(x, nx * t_dsize(dt)), *dwt = dput(w, row * 4), *db = dput(bias, (size_t)D * 4);
    float *dpool = dput_at(pool, npool, GDN_F32, misalign, &pb);
    void *dy = dnan_at(dt, nx, 0, &yb);
    int32_t *dsl = slots ? dput(slots, sizeof(int32_t) * (size_t)B) : NULL;
    const gdn_conv1d_config c = {.B = B, .T = 7, .D = D, .W = W, .dtype = dt, .silu = silu};   /* T is ignored */
    const gdn_exec ex = {GDN_BACKEND_CUDA, NULL, 0, 0};
    const gdn_status s = gdn_conv1d_update(&ex, &c, dx, dwt, with_bias ? db : NULL, dpool, NS, dsl, dy);
    if (ran(ctx, s)) {
        dclose(ctx, "y", dt, dy, yr, nx, bound_fwd(dt));
        dclose(ctx, "state pool", GDN_F32, dpool, pd, npool, bound_fwd(GDN_F32));
        void *y = t_alloc(nx * t_dsize(dt));
        float *pool2 = t_alloc(npool * 4);
        dget(y, dy, nx * t_dsize(dt));
        dget(pool2, dpool, npool * 4);
        int zero = 1, same = 1;
        for (int64_t b = 0; b < B; b++)
            if (sref[b] < 0)
                for (int d = 0; d < D; d++) zero &= t_get(dt, y, (size_t)b * D + d) == 0.0;
        for (int64_t sl = 0; sl < NS; sl++) {
            int used = 0;
            for (int64_t b = 0; b < B; b++) used |= sref[b] == sl;
            if (!used) same &= !memcmp(pool2 + sl * row, pool + sl * row, row * 4);
        }
        check(zero, ctx, "padding rows (and slots out of range) of y are 0");
        check(same, ctx, "slots no row points at keep their bytes");
        free(y); free(pool2);
    }
    void *dev[] = {dx, dwt, db, pb, yb, dsl};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
    free(xd); free(wd); free(bd); free(pd); free(yr); free(x); free(w); free(bias); free(pool); free(sref);
}

void test_conv_update(rng *r) {
    static const int32_t rep[7] = {3, -1, 0, 5, -1, 1, 3};   /* slot 3 twice: in row order; 2, 4 unused */
    static const int32_t oor[6] = {7, -1, 2, -3, 2, 0};      /* 7 and -3 out of range: padding on CUDA */
    int32_t many[600];                                       /* repeats more than 256 rows apart */
    for (int b = 0; b < 600; b++) many[b] = (int32_t)((b * 5) % 11) - 2;
    for (int W = 1; W <= 8; W++)
        for (int di = 0; di < 3; di++) {
            const int D = (W + di) % 2 ? 37 : 300;
            conv_update_case(4, 4, NULL, D, W, dts[di], (W + di) % 2, W % 2, 0, rng_u64(r));
            conv_update_case(7, 6, rep, D, W, dts[di], (W + di + 1) % 2, 1, W % 3 == 0, rng_u64(r));
            conv_update_case(6, 4, oor, 65, W, dts[di], 1, 1, 0, rng_u64(r));
        }
    conv_update_case(600, 9, many, 40, 4, GDN_BF16, 1, 1, 0, rng_u64(r));
    conv_update_case(600, 9, many, 33, 3, GDN_F32, 0, 0, 1, rng_u64(r));
    conv_update_case(256, 256, NULL, 8192, 4, GDN_BF16, 1, 1, 0, rng_u64(r));
    conv_update_case(3, 5, rep + 2, 2048, 8, GDN_F16, 1, 0, 0, rng_u64(r));
}

/* ---- conv1d backward ---- */

typedef struct cbcase {
    int64_t B, T;
    int nseq;                 /* > 0: varlen (B = 1), lengths in lens */
    int64_t lens[10];
    int D, W;
    gdn_dtype dt;
    int silu, bias, h0, dht;  /* inputs given */
    int dbias, dh0;           /* outputs wanted */
    int misalign;             /* x, dy and dx one element off 16-byte alignment */
    int stream;               /* a stream of its own rather than the default one */
} cbcase;

/* dx, dweight, dbias, dh0 against the reference and the CPU backend, then a
 * second run: the same bits */
static void conv_bwd_case(const cbcase *k, uint64_t seed) {
    rng r;
    rng_seed(&r, seed);
    int64_t cu[11] = {0}, B = k->B, T = k->T, N = k->B;
    if (k->nseq) {
        B = 1; T = 0;
        for (int i = 0; i < k->nseq; i++) { T += k->lens[i]; cu[i + 1] = T; }
        N = k->nseq;
    }
    const int D = k->D, W = k->W;
    const gdn_dtype dt = k->dt;
    const size_t nx = (size_t)(B * T) * D, nw = (size_t)D * W, nst = (size_t)N * D * W, es = t_dsize(dt);
    char ctx[420], lens[120] = "";
    for (int i = 0, o = 0; i < k->nseq; i++) o += snprintf(lens + o, sizeof lens - o, "%s%lld", i ? "," : "", (long long)k->lens[i]);
    snprintf(ctx, sizeof ctx, "op=conv1d_bwd backend=cuda B%lld T%lld%s%s%s D%d W%d dtype=%s silu=%d bias=%d h0=%d dht=%d "
             "dbias=%d dh0=%d misalign=%d stream=%d seed=%llu", (long long)B, (long long)T, k->nseq ? " varlen[" : "", lens,
             k->nseq ? "]" : "", D, W, t_dtype_name(dt), k->silu, k->bias, k->h0, k->dht, k->dbias, k->dh0, k->misalign,
             k->stream, (unsigned long long)seed);
    double *xd = dvec(nx), *dyd = dvec(nx), *wd = dvec(nw), *bd = dvec(D), *h0d = dvec(nst), *dhtd = dvec(nst);
    double *dxr = dvec(nx), *dwr = dvec(nw), *dbr = dvec(D), *dh0r = dvec(nst);
    void *x = rnd(&r, dt, nx, 1.0, xd), *dy = rnd(&r, dt, nx, 1.0, dyd);
    float *w = rnd(&r, GDN_F32, nw, 0.6, wd), *bias = rnd(&r, GDN_F32, D, 0.5, bd), *h0 = rnd(&r, GDN_F32, nst, 1.0, h0d);
    float *dht = rnd(&r, GDN_F32, nst, 1.0, dhtd);
    gdn_conv1d_config c = {.B = B, .T = T, .D = D, .W = W, .dtype = dt, .silu = k->silu};
    if (k->nseq) { c.cu_seqlens = cu; c.num_seqs = k->nseq; }
    gdn_ref_conv1d_bwd(&c, xd, wd, k->bias ? bd : NULL, k->h0 ? h0d : NULL, dyd, k->dht ? dhtd : NULL, dxr, dwr, dbr, dh0r);

    /* the CPU backend on the same inputs */
    void *hdx = t_alloc(nx * es);
    float *hdw = t_alloc(nw * 4), *hdb = t_alloc((size_t)D * 4), *hdh0 = t_alloc(nst * 4);
    const gdn_conv1d_bwd_args ha = {x, w, k->bias ? bias : NULL, k->h0 ? h0 : NULL, dy, k->dht ? dht : NULL,
                                    hdx, hdw, k->dbias ? hdb : NULL, k->dh0 ? hdh0 : NULL};
    const gdn_status hs = gdn_conv1d_bwd(NULL, &c, &ha);
    check(hs == GDN_OK, ctx, "CPU backward: status %s (%s)", gdn_status_string(hs), gdn_last_error());
    double *cdx = as_d(dt, hdx, nx), *cdw = as_d(GDN_F32, hdw, nw), *cdb = as_d(GDN_F32, hdb, D),
           *cdh0 = as_d(GDN_F32, hdh0, nst);

    void *xb, *yb, *dxb, *dwb, *dbb, *dh0b;
    const void *dxin = dput_at(x, nx, dt, k->misalign, &xb), *ddy = dput_at(dy, nx, dt, k->misalign, &yb);
    void *ddx = dnan_at(dt, nx, k->misalign, &dxb);
    float *ddw = dnan_at(GDN_F32, nw, 0, &dwb), *ddb = dnan_at(GDN_F32, D, 0, &dbb), *ddh0 = dnan_at(GDN_F32, nst, 0, &dh0b);
    float *dwt = dput(w, nw * 4), *dbias = dput(bias, (size_t)D * 4), *dh0in = dput(h0, nst * 4), *ddht = dput(dht, nst * 4);
    int64_t *dcu = dput(cu, sizeof cu);
    cudaStream_t st = NULL;
    if (k->stream) cudaStreamCreate(&st);
    const gdn_exec ex = {GDN_BACKEND_CUDA, st, 0, 0};
    if (k->nseq) c.cu_seqlens_dev = dcu;
    const gdn_conv1d_bwd_args a = {dxin, dwt, k->bias ? dbias : NULL, k->h0 ? dh0in : NULL, ddy, k->dht ? ddht : NULL,
                                   ddx, ddw, k->dbias ? ddb : NULL, k->dh0 ? ddh0 : NULL};
    gdn_status s = gdn_conv1d_bwd(&ex, &c, &a);
    if (ran(ctx, s)) {
        const double bg = bound_grad(dt);
        dclose(ctx, "dx", dt, ddx, dxr, nx, bg);
        dclose(ctx, "dweight", GDN_F32, ddw, dwr, nw, bg);
        if (k->dbias) dclose(ctx, "dbias", GDN_F32, ddb, dbr, D, bg);
        if (k->dh0) dclose(ctx, "dh0", GDN_F32, ddh0, dh0r, nst, bg);
        if (hs == GDN_OK) {
            dclose(ctx, "dx vs the CPU backend", dt, ddx, cdx, nx, bg);
            dclose(ctx, "dweight vs the CPU backend", GDN_F32, ddw, cdw, nw, bg);
            if (k->dbias) dclose(ctx, "dbias vs the CPU backend", GDN_F32, ddb, cdb, D, bg);
            if (k->dh0) dclose(ctx, "dh0 vs the CPU backend", GDN_F32, ddh0, cdh0, nst, bg);
        }
        const obuf o[4] = {{ddx, dt, nx}, {ddw, GDN_F32, nw}, {k->dbias ? ddb : NULL, GDN_F32, D},
                           {k->dh0 ? ddh0 : NULL, GDN_F32, nst}};
        void *keep[4];
        obuf_keep(o, 4, keep);
        s = gdn_conv1d_bwd(&ex, &c, &a);
        if (ran(ctx, s)) check(obuf_same(o, 4, keep), ctx, "a second run gave other bits");
        else for (int i = 0; i < 4; i++) free(keep[i]);
    }
    if (st) cudaStreamDestroy(st);
    void *dev[] = {xb, yb, dxb, dwb, dbb, dh0b, dwt, dbias, dh0in, ddht, dcu};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
    free(xd); free(dyd); free(wd); free(bd); free(h0d); free(dhtd); free(dxr); free(dwr); free(dbr); free(dh0r);
    free(x); free(dy); free(w); free(bias); free(h0); free(dht); free(hdx); free(hdw); free(hdb); free(hdh0);
    free(cdx); free(cdw); free(cdb); free(cdh0);
}

void test_conv_bwd(rng *r) {
    long idx = 0;
    /* every W x dtype x T, B = 2; D = 37 (a partial channel group) or 64; options cycle over all 32 */
    const int64_t Ts[6] = {0, 1, 3, 64, 65, 2 + rng_int(r, 0, 150)};
    for (int W = 1; W <= 8; W++)
        for (int di = 0; di < 3; di++)
            for (int ti = 0; ti < 6; ti++, idx++) {
                if (g_quick && ti % 2) continue;
                const unsigned o = (unsigned)(idx * 23 % 32);
                cbcase k = {.B = 2, .T = Ts[ti], .D = (idx % 2) ? 64 : 37, .W = W, .dt = dts[di], .silu = (int)(idx % 3 != 0),
                            .bias = !!(o & 1), .h0 = !!(o & 2), .dht = !!(o & 4), .dbias = !!(o & 8), .dh0 = !!(o & 16),
                            .misalign = (idx % 7 == 3), .stream = (idx % 5 == 2)};
                if (ti == 3) k.bias = k.h0 = k.dht = k.dbias = k.dh0 = 1;
                conv_bwd_case(&k, rng_u64(r));
            }
    /* varlen: empty, 1-token and ragged sequences (sequences shorter than W: dht reaches dh0) */
    const int64_t sets[5][8] = {{0, 1, 5, 0, 17, 1, 64, 3}, {1}, {0}, {70, 0, 1, 130, 2}, {0}};
    const int set_n[5] = {8, 1, 1, 5, 7};
    for (int si = 0; si < 5; si++)
        for (int W = 1; W <= 8; W++)
            for (int di = 0; di < 3; di++, idx++) {
                if (g_quick && (W + di) % 2) continue;
                cbcase k = {.nseq = set_n[si], .D = si == 3 ? 19 : (W % 2 ? 64 : 40), .W = W, .dt = dts[di],
                            .silu = (int)(idx % 2), .bias = 1, .h0 = (int)(idx % 3 != 1), .dht = (int)(idx % 4 != 2),
                            .dbias = 1, .dh0 = 1, .misalign = si == 2 || (si == 0 && di == 1)};
                for (int i = 0; i < k.nseq; i++) k.lens[i] = si == 4 ? rng_int(r, 0, 80) : sets[si][i];
                conv_bwd_case(&k, rng_u64(r));
            }
    /* layer-sized channel counts, and enough rows that every rank of a cluster walks many tiles */
    const cbcase big[] = {
        {.B = 2, .T = 65, .D = 2048, .W = 4, .dt = GDN_BF16, .silu = 1, .bias = 1, .h0 = 1, .dht = 1, .dbias = 1, .dh0 = 1},
        {.B = 1, .T = 100, .D = 8192, .W = 4, .dt = GDN_BF16, .silu = 1, .bias = 1, .h0 = 1, .dht = 1, .dbias = 1, .dh0 = 1},
        {.B = 3, .T = 33, .D = 2048, .W = 3, .dt = GDN_F32, .silu = 0, .dht = 1, .dh0 = 1, .stream = 1},
        {.B = 1, .T = 64, .D = 2048, .W = 8, .dt = GDN_F16, .silu = 1, .bias = 1, .h0 = 1, .dht = 1, .dbias = 1, .dh0 = 1},
        {.B = 2, .T = 40, .D = 1, .W = 4, .dt = GDN_F32, .silu = 1, .bias = 1, .h0 = 1, .dht = 1, .dbias = 1, .dh0 = 1},
        {.B = 1, .T = 120000, .D = 37, .W = 4, .dt = GDN_F32, .silu = 1, .bias = 1, .h0 = 1, .dht = 1, .dbias = 1, .dh0 = 1},
        {.B = 2, .T = 3000, .D = 72, .W = 6, .dt = GDN_BF16, .silu = 1, .h0 = 1, .dbias = 1, .misalign = 1},
        {.nseq = 4, .lens = {60000, 0, 1, 59999}, .D = 37, .W = 4, .dt = GDN_F16, .silu = 1, .bias = 1, .h0 = 1, .dht = 1,
         .dbias = 1, .dh0 = 1},
        {.nseq = 4, .lens = {0, 1, 77, 3}, .D = 2048, .W = 4, .dt = GDN_BF16, .silu = 1, .bias = 1, .h0 = 1, .dht = 1,
         .dbias = 1, .dh0 = 1},
        {.nseq = 9, .lens = {300, 1, 2, 3, 0, 4, 5, 6, 1000}, .D = 100, .W = 7, .dt = GDN_BF16, .silu = 1, .h0 = 1,
         .dht = 1, .dh0 = 1, .misalign = 1},
    };
    for (size_t i = 0; i < sizeof big / sizeof *big; i++) {
        if (g_quick && big[i].B * big[i].T > 10000) continue;
        if (g_quick && big[i].nseq && big[i].lens[0] > 10000) continue;
        conv_bwd_case(&big[i], rng_u64(r));
    }
}
#endif
