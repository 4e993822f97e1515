/* The GDN layer ops on the CUDA backend: conv1d forward (every W, bias,
 * SiLU, h0, ht, ht = h0 in place, varlen with empty and 1-token sequences)
 * and single-token update (slots, -1 padding, repeated slots, slots out of
 * range), gated RMSNorm forward, standalone gate and L2 norm forward, and the
 * decode step with its fused conv, each against the float64 reference
 * (src/ref) on fresh random inputs, outputs poisoned with NaN on the device,
 * bounds of DESIGN.md §5, every dtype, odd sizes and misaligned pointers (the
 * kernels' 1-element paths). The backwards: conv1d (dx, dweight, dbias, dh0;
 * every W, SiLU, optional bias / h0 / dht / dbias / dh0, varlen with empty,
 * 1-token and shorter-than-W sequences, enough rows that every block of the
 * reduction cluster walks many tiles), gated RMSNorm (dx, dz, dw; both gates,
 * rstd given or recomputed, tiny rows, saturated gates), gate (da, dA_log,
 * ddt_bias) and L2 norm (dx), each against the reference and against the CPU
 * backend on the same inputs, then run a second time: the same bits. Also:
 * bad input on CUDA (status, message, no device byte written), bit-identical
 * reruns and a CUDA-graph capture of every op, forwards and backwards (no
 * host sync, no allocation).
 * Called at the end of test_cuda(); skipped where no device is visible. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ref/ref.h"
#include "ref/ref_conv1d.h"
#include "ref/ref_rmsnorm.h"
#include "test_util.h"

#ifndef GDN_HAVE_CUDA
void test_cuda_layer(void) { printf("  cuda layer ops: not built (no nvcc at build time): skipped\n"); }
void test_cuda_layer_bwd(void) { test_cuda_layer(); }
#else
#include <cuda_runtime_api.h>

/* ---- device buffers ---- */

static void *dalloc_dev(size_t n) {
    void *d = NULL;
    if (cudaMalloc(&d, n ? n : 4) != cudaSuccess) { fprintf(stderr, "cudaMalloc failed\n"); exit(1); }
    return d;
}
static void *dput(const void *h, size_t n) {
    void *d = dalloc_dev(n);
    if (n) cudaMemcpy(d, h, n, cudaMemcpyHostToDevice);
    return d;
}
static void dget(void *h, const void *d, size_t n) { if (n) cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost); }
/* 1 when the n device bytes at d equal the host bytes at h */
static int dsame(const void *d, const void *h, size_t n) {
    if (!n) return 1;
    void *t = t_alloc(n);
    dget(t, d, n);
    const int same = !memcmp(t, h, n);
    free(t);
    return same;
}
/* a device copy of h (n elements of t) placed `off` elements into a fresh buffer: off = 1 misaligns it */
static void *dput_at(const void *h, size_t n, gdn_dtype t, int off, void **base) {
    const size_t es = t_dsize(t);
    *base = dalloc_dev((n + 1) * es);
    char *p = (char *)*base + (size_t)off * es;
    if (n) cudaMemcpy(p, h, n * es, cudaMemcpyHostToDevice);
    return p;
}
/* n NaNs of dtype t on the device (at offset off, as dput_at) */
static void *dnan_at(gdn_dtype t, size_t n, int off, void **base) {
    void *h = t_alloc(n * t_dsize(t) + 1);
    t_poison_nan(t, h, n);
    void *p = dput_at(h, n, t, off, base);
    free(h);
    return p;
}
static double *dvec(size_t n) { return t_alloc(n * sizeof(double)); }

/* n random values N(0, s^2) rounded to t: host buffer and the doubles */
static void *rnd(rng *r, gdn_dtype t, size_t n, double s, double *d) {
    void *p = t_alloc(n * t_dsize(t) + 1);
    for (size_t i = 0; i < n; i++) d[i] = t_store(t, p, i, (float)(s * rng_normal(r)));
    return p;
}

/* status OK and the stream's work done without a CUDA error; counts one check */
static int ran(const char *ctx, gdn_status s) {
    const cudaError_t e = cudaDeviceSynchronize();
    return check(s == GDN_OK && e == cudaSuccess, ctx, "status %s (%s), cuda %s", gdn_status_string(s), gdn_last_error(),
                 cudaGetErrorString(e));
}

/* check_close on a device tensor */
static void dclose(const char *ctx, const char *what, gdn_dtype t, const void *d, const double *ref, size_t n,
                   double bound) {
    void *h = t_alloc(n * t_dsize(t));
    dget(h, d, n * t_dsize(t));
    check_close(ctx, what, t, h, ref, n, bound);
    free(h);
}

/* check_close_terms on a device tensor (docs/DESIGN.md §5: sums that cancel) */
static void dclose_terms(const char *ctx, const char *what, gdn_dtype t, const void *d, const double *ref,
                         const double *terms2, size_t n, double bound) {
    void *h = t_alloc(n * t_dsize(t));
    dget(h, d, n * t_dsize(t));
    check_close_terms(ctx, what, t, h, ref, terms2, n, bound);
    free(h);
}

/* the n elements of host tensor h (dtype t) as doubles: another backend's output as a reference */
static double *as_d(gdn_dtype t, const void *h, size_t n) {
    double *d = dvec(n);
    for (size_t i = 0; i < n; i++) d[i] = t_get(t, h, i);
    return d;
}

/* A call's device outputs (d NULL: not wanted), for the rerun check: keep()
 * saves their bytes and poisons them with NaN, same() then says whether a
 * second run wrote the very same bits, and frees what keep() saved. */
typedef struct obuf { void *d; gdn_dtype t; size_t n; } obuf;

static void obuf_keep(const obuf *o, int no, void **keep) {
    for (int i = 0; i < no; i++) {
        keep[i] = NULL;
        if (!o[i].d) continue;
        const size_t bytes = o[i].n * t_dsize(o[i].t);
        keep[i] = t_alloc(bytes);
        dget(keep[i], o[i].d, bytes);
        void *nan = t_alloc(bytes + 1);
        t_poison_nan(o[i].t, nan, o[i].n);
        if (bytes) cudaMemcpy(o[i].d, nan, bytes, cudaMemcpyHostToDevice);
        free(nan);
    }
}

static int obuf_same(const obuf *o, int no, void **keep) {
    int same = 1;
    for (int i = 0; i < no; i++) {
        if (!o[i].d) continue;
        same &= dsame(o[i].d, keep[i], o[i].n * t_dsize(o[i].t));
        free(keep[i]);
    }
    return same;
}

static const gdn_dtype dts[3] = {GDN_F32, GDN_BF16, GDN_F16};

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

static void test_conv_fwd(rng *r) {
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

static void test_conv_update(rng *r) {
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

static void test_conv_bwd(rng *r) {
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

/* ---- gated RMSNorm, gate, L2 norm ---- */

static void rmsnorm_case(int64_t rows, int V, gdn_dtype dt, gdn_norm_gate g, float eps, int want_rstd, int misalign,
                         uint64_t seed) {
    rng r;
    rng_seed(&r, seed);
    char ctx[300];
    snprintf(ctx, sizeof ctx, "op=rmsnorm_fwd backend=cuda dtype=%s gate=%s rows=%lld V=%d eps=%g rstd=%s misalign=%d "
             "seed=%llu", t_dtype_name(dt), g == GDN_NORM_GATE_SILU ? "silu" : "sigmoid", (long long)rows, V, (double)eps,
             want_rstd ? "kept" : "NULL", misalign, (unsigned long long)seed);
    const size_t n = (size_t)rows * V;
    double *xd = dvec(n), *zd = dvec(n), *wd = dvec(V), *yr = dvec(n), *rsr = dvec((size_t)rows);
    void *x = rnd(&r, dt, n, 1.0, xd), *z = rnd(&r, dt, n, 1.5, zd);
    float *w = rnd(&r, GDN_F32, V, 1.0, wd);
    for (int64_t i = 0; i < rows; i += 5)   /* some rows tiny: eps matters */
        for (int v = 0; v < V; v++) xd[i * V + v] = t_store(dt, x, (size_t)i * V + v, (float)(1e-3 * xd[i * V + v]));
    gdn_ref_rmsnorm_fwd(rows, V, eps, g, xd, zd, wd, yr, rsr);
    void *xb, *zb, *yb, *rb;
    const void *dx = dput_at(x, n, dt, misalign, &xb), *dz = dput_at(z, n, dt, 0, &zb);
    void *dy = dnan_at(dt, n, misalign, &yb);
    float *drs = dnan_at(GDN_F32, (size_t)rows, 0, &rb), *dw = dput(w, (size_t)V * 4);
    const gdn_rmsnorm_config c = {rows, V, dt, eps, g};
    const gdn_exec ex = {GDN_BACKEND_CUDA, NULL, 0, 0};
    const gdn_status s = gdn_rmsnorm_gated_fwd(&ex, &c, dx, dz, dw, dy, want_rstd ? drs : NULL);
    if (ran(ctx, s)) {
        dclose(ctx, "y", dt, dy, yr, n, bound_fwd(dt));
        if (want_rstd) dclose(ctx, "rstd", GDN_F32, drs, rsr, (size_t)rows, bound_fwd(GDN_F32));
    }
    void *dev[] = {xb, zb, yb, rb, dw};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
    free(xd); free(zd); free(wd); free(yr); free(rsr); free(x); free(z); free(w);
}

static void gate_case(int64_t rows, int HV, gdn_dtype dt, int with_bias, int misalign, uint64_t seed) {
    rng r;
    rng_seed(&r, seed);
    char ctx[300];
    snprintf(ctx, sizeof ctx, "op=gate_fwd backend=cuda rows=%lld HV=%d dtype=%s dt_bias=%s misalign=%d seed=%llu",
             (long long)rows, HV, t_dtype_name(dt), with_bias ? "yes" : "NULL", misalign, (unsigned long long)seed);
    const size_t n = (size_t)rows * HV;
    double *ad = dvec(n), *gr = dvec(n), *Ad = dvec(HV), *bd = dvec(HV);
    void *a = t_alloc(n * t_dsize(dt) + 2);
    for (size_t i = 0; i < n; i++) {
        double v = 3.0 * rng_normal(&r);
        if (i % 17 == 5) v = 21.0 + 5.0 * rng_uniform(&r);   /* the softplus(x) = x branch */
        ad[i] = t_store(dt, a, i, (float)v);
    }
    float *A = t_alloc((size_t)HV * 4), *bias = t_alloc((size_t)HV * 4);
    for (int j = 0; j < HV; j++) {
        A[j] = (float)log(1.0 + 15.0 * rng_uniform(&r)); Ad[j] = A[j];
        bias[j] = (float)(0.5 * rng_normal(&r)); bd[j] = bias[j];
    }
    gdn_ref_gate_fwd(rows, HV, ad, Ad, with_bias ? bd : NULL, gr);
    void *ab, *gb;
    const void *da = dput_at(a, n, dt, misalign, &ab);
    float *dg = dnan_at(GDN_F32, n, misalign, &gb), *dA = dput(A, (size_t)HV * 4), *dbias = dput(bias, (size_t)HV * 4);
    const gdn_exec ex = {GDN_BACKEND_CUDA, NULL, 0, 0};
    const gdn_status s = gdn_gate_fwd(&ex, rows, HV, dt, da, dA, with_bias ? dbias : NULL, dg);
    if (ran(ctx, s)) dclose(ctx, "g", GDN_F32, dg, gr, n, bound_fwd(dt));
    void *dev[] = {ab, gb, dA, dbias};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
    free(ad); free(gr); free(Ad); free(bd); free(a); free(A); free(bias);
}

static void l2norm_case(int64_t rows, int dim, gdn_dtype dt, int want_rstd, int misalign, uint64_t seed) {
    rng r;
    rng_seed(&r, seed);
    char ctx[300];
    snprintf(ctx, sizeof ctx, "op=l2norm_fwd backend=cuda rows=%lld dim=%d dtype=%s rstd=%s misalign=%d seed=%llu",
             (long long)rows, dim, t_dtype_name(dt), want_rstd ? "kept" : "NULL", misalign, (unsigned long long)seed);
    const size_t n = (size_t)rows * dim;
    double *xd = dvec(n), *yr = dvec(n), *rsr = dvec((size_t)rows);
    void *x = t_alloc(n * t_dsize(dt) + 2);
    for (size_t i = 0; i < n; i++) xd[i] = t_store(dt, x, i, (float)(rng_normal(&r) * ((i / dim) % 7 == 3 ? 1e-3 : 1.0)));
    gdn_ref_l2norm_fwd(rows, dim, xd, yr, rsr);
    void *xb, *yb, *rb;
    const void *dx = dput_at(x, n, dt, misalign, &xb);
    void *dy = dnan_at(dt, n, misalign, &yb);
    float *drs = dnan_at(GDN_F32, (size_t)rows, 0, &rb);
    const gdn_exec ex = {GDN_BACKEND_CUDA, NULL, 0, 0};
    const gdn_status s = gdn_l2norm_fwd(&ex, rows, dim, dt, dx, dy, want_rstd ? drs : NULL);
    if (ran(ctx, s)) {
        dclose(ctx, "y", dt, dy, yr, n, bound_fwd(dt));
        if (want_rstd) dclose(ctx, "rstd", GDN_F32, drs, rsr, (size_t)rows, bound_fwd(dt));
    }
    void *dev[] = {xb, yb, rb};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
    free(xd); free(yr); free(rsr); free(x);
}

static void test_norms(rng *r) {
    const int64_t rows_list[4] = {0, 1, 37, 1000};
    const int Vs[10] = {1, 5, 64, 128, 130, 256, 1000, 1024, 2048, 4100};
    long k = 0;
    for (int di = 0; di < 3; di++)
        for (int gi = 0; gi < 2; gi++)
            for (int ri = 0; ri < 4; ri++)
                for (int vi = 0; vi < 10; vi++, k++) {
                    if (g_quick && k % 3) continue;
                    const int64_t rows = Vs[vi] >= 1000 ? rows_list[ri] / 8 : rows_list[ri];
                    rmsnorm_case(rows, Vs[vi], dts[di], (gdn_norm_gate)gi, k % 2 ? 1e-5f : 1e-6f, (int)(k / 2 % 2),
                                 k % 11 == 4, rng_u64(r));
                }
    const int HVs[4] = {1, 3, 4, 32};
    for (int di = 0; di < 3; di++)
        for (int ri = 0; ri < 4; ri++)
            for (int hi = 0; hi < 4; hi++, k++)
                gate_case(rows_list[ri] + (ri == 3 ? 3 : 0), HVs[hi], dts[di], (int)(k % 2), k % 5 == 1, rng_u64(r));
    const int dims[8] = {1, 2, 24, 64, 128, 256, 1000, 3000};
    for (int di = 0; di < 3; di++)
        for (int ri = 0; ri < 4; ri++)
            for (int mi = 0; mi < 8; mi++, k++) {
                if (g_quick && k % 3) continue;
                l2norm_case(dims[mi] >= 1000 ? rows_list[ri] / 8 : rows_list[ri], dims[mi], dts[di], (int)(k % 2 == 0),
                            k % 7 == 2, rng_u64(r));
            }
}

/* ---- gated RMSNorm, gate and L2 norm backward ---- */

static void rmsnorm_bwd_case(int64_t rows, int V, gdn_dtype dt, gdn_norm_gate g, float eps, int give_rstd, int misalign,
                             uint64_t seed) {
    rng r;
    rng_seed(&r, seed);
    char ctx[300];
    snprintf(ctx, sizeof ctx, "op=rmsnorm_bwd backend=cuda dtype=%s gate=%s rows=%lld V=%d eps=%g rstd=%s misalign=%d "
             "seed=%llu", t_dtype_name(dt), g == GDN_NORM_GATE_SILU ? "silu" : "sigmoid", (long long)rows, V, (double)eps,
             give_rstd ? "given" : "NULL", misalign, (unsigned long long)seed);
    const size_t n = (size_t)rows * V, es = t_dsize(dt);
    double *xd = dvec(n), *zd = dvec(n), *dyd = dvec(n), *wd = dvec(V), *yr = dvec(n), *rsr = dvec((size_t)rows);
    double *dxr = dvec(n), *dzr = dvec(n), *dwr = dvec(V);
    void *x = t_alloc(n * es + 2), *z = t_alloc(n * es + 2), *dy = t_alloc(n * es + 2);
    for (size_t i = 0; i < n; i++) {
        const int64_t row = (int64_t)(i / V);
        /* every 7th row tiny, so that mean(x^2) ~ eps (f16: less tiny, dx ~ r must stay in range) */
        xd[i] = t_store(dt, x, i, (float)(rng_normal(&r) * (row % 7 == 3 ? (dt == GDN_F16 ? 3e-3 : 1e-3) : 1.0)));
        double zz = 2.5 * rng_normal(&r);
        if (i % 23 == 11)   /* saturated gate: sigmoid(z) = 0 or 1 in fp32 */
            zz = (i % 2 ? 1 : -1) * (g == GDN_NORM_GATE_SILU ? 10 + 10 * rng_uniform(&r) : 20 + 20 * rng_uniform(&r));
        zd[i] = t_store(dt, z, i, (float)zz);
        dyd[i] = t_store(dt, dy, i, (float)rng_normal(&r));
    }
    float *w = t_alloc((size_t)V * 4), *rs = t_alloc((size_t)rows * 4 + 4);
    for (int i = 0; i < V; i++) { w[i] = (float)(1 + 0.2 * rng_normal(&r)); wd[i] = w[i]; }
    gdn_ref_rmsnorm_fwd(rows, V, eps, g, xd, zd, wd, yr, rsr);
    gdn_ref_rmsnorm_bwd(rows, V, eps, g, xd, zd, wd, dyd, dxr, dzr, dwr);
    for (int64_t i = 0; i < rows; i++) rs[i] = (float)rsr[i];   /* the forward's rstd */
    const gdn_rmsnorm_config c = {rows, V, dt, eps, g};

    /* the CPU backend on the same inputs */
    void *hdx = t_alloc(n * es), *hdz = t_alloc(n * es);
    float *hdw = t_alloc((size_t)V * 4);
    const gdn_status hs = gdn_rmsnorm_gated_bwd(NULL, &c, x, z, w, give_rstd ? rs : NULL, dy, hdx, hdz, hdw);
    check(hs == GDN_OK, ctx, "CPU backward: status %s (%s)", gdn_status_string(hs), gdn_last_error());
    double *cdx = as_d(dt, hdx, n), *cdz = as_d(dt, hdz, n), *cdw = as_d(GDN_F32, hdw, V);

    void *xb, *zb, *gb, *dxb, *dzb, *dwb;
    const void *ddx_in = dput_at(x, n, dt, misalign, &xb), *dzin = dput_at(z, n, dt, 0, &zb);
    const void *ddy = dput_at(dy, n, dt, misalign, &gb);
    void *ddx = dnan_at(dt, n, misalign, &dxb), *ddz = dnan_at(dt, n, 0, &dzb);
    float *ddw = dnan_at(GDN_F32, V, 0, &dwb), *dw_in = dput(w, (size_t)V * 4), *drs = dput(rs, (size_t)rows * 4);
    const gdn_exec ex = {GDN_BACKEND_CUDA, NULL, 0, 0};
    gdn_status s = gdn_rmsnorm_gated_bwd(&ex, &c, ddx_in, dzin, dw_in, give_rstd ? drs : NULL, ddy, ddx, ddz, ddw);
    if (ran(ctx, s)) {
        const double bg = bound_grad(dt);
        dclose(ctx, "dx", dt, ddx, dxr, n, bg);
        dclose(ctx, "dz", dt, ddz, dzr, n, bg);
        dclose(ctx, "dw", GDN_F32, ddw, dwr, V, bg);
        if (hs == GDN_OK) {
            dclose(ctx, "dx vs the CPU backend", dt, ddx, cdx, n, bg);
            dclose(ctx, "dz vs the CPU backend", dt, ddz, cdz, n, bg);
            dclose(ctx, "dw vs the CPU backend", GDN_F32, ddw, cdw, V, bg);
        }
        const obuf o[3] = {{ddx, dt, n}, {ddz, dt, n}, {ddw, GDN_F32, (size_t)V}};
        void *keep[3];
        obuf_keep(o, 3, keep);
        s = gdn_rmsnorm_gated_bwd(&ex, &c, ddx_in, dzin, dw_in, give_rstd ? drs : NULL, ddy, ddx, ddz, ddw);
        if (ran(ctx, s)) check(obuf_same(o, 3, keep), ctx, "a second run gave other bits");
        else for (int i = 0; i < 3; i++) free(keep[i]);
    }
    void *dev[] = {xb, zb, gb, dxb, dzb, dwb, dw_in, drs};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
    free(xd); free(zd); free(dyd); free(wd); free(yr); free(rsr); free(dxr); free(dzr); free(dwr);
    free(x); free(z); free(dy); free(w); free(rs); free(hdx); free(hdz); free(hdw); free(cdx); free(cdz); free(cdw);
}

static void gate_bwd_case(int64_t rows, int HV, gdn_dtype dt, int with_bias, int want_ddt, int misalign, uint64_t seed) {
    rng r;
    rng_seed(&r, seed);
    char ctx[300];
    snprintf(ctx, sizeof ctx, "op=gate_bwd backend=cuda rows=%lld HV=%d dtype=%s dt_bias=%s ddt_bias=%s misalign=%d seed=%llu",
             (long long)rows, HV, t_dtype_name(dt), with_bias ? "yes" : "NULL", want_ddt ? "wanted" : "NULL", misalign,
             (unsigned long long)seed);
    const size_t n = (size_t)rows * HV;
    double *ad = dvec(n), *dgd = dvec(n), *Ad = dvec(HV), *bd = dvec(HV), *dar = dvec(n), *dAr = dvec(HV), *ddtr = dvec(HV);
    void *a = t_alloc(n * t_dsize(dt) + 2);
    float *dg = t_alloc(n * 4 + 4);
    for (size_t i = 0; i < n; i++) {
        double v = 3.0 * rng_normal(&r);
        if (i % 17 == 5) v = 21.0 + 5.0 * rng_uniform(&r);   /* the softplus(x) = x branch */
        ad[i] = t_store(dt, a, i, (float)v);
        dg[i] = (float)rng_normal(&r); dgd[i] = dg[i];
    }
    float *A = t_alloc((size_t)HV * 4), *bias = t_alloc((size_t)HV * 4);
    for (int j = 0; j < HV; j++) {
        A[j] = (float)log(1.0 + 15.0 * rng_uniform(&r)); Ad[j] = A[j];
        bias[j] = (float)(0.5 * rng_normal(&r)); bd[j] = bias[j];
    }
    gdn_ref_gate_bwd(rows, HV, ad, Ad, with_bias ? bd : NULL, dgd, dar, dAr, ddtr);

    /* the CPU backend on the same inputs */
    void *hda = t_alloc(n * t_dsize(dt));
    float *hdA = t_alloc((size_t)HV * 4), *hddt = t_alloc((size_t)HV * 4);
    const gdn_status hs = gdn_gate_bwd(NULL, rows, HV, dt, a, A, with_bias ? bias : NULL, dg, hda, hdA, want_ddt ? hddt : NULL);
    check(hs == GDN_OK, ctx, "CPU backward: status %s (%s)", gdn_status_string(hs), gdn_last_error());
    double *cda = as_d(dt, hda, n), *cdA = as_d(GDN_F32, hdA, HV), *cddt = as_d(GDN_F32, hddt, HV);

    void *ab, *gb, *dab, *dAb, *ddtb;
    const void *da_in = dput_at(a, n, dt, misalign, &ab);
    const float *ddg = dput_at(dg, n, GDN_F32, misalign, &gb);
    void *dda = dnan_at(dt, n, misalign, &dab);
    float *ddA = dnan_at(GDN_F32, HV, 0, &dAb), *dddt = dnan_at(GDN_F32, HV, 0, &ddtb);
    float *dA_in = dput(A, (size_t)HV * 4), *dbias = dput(bias, (size_t)HV * 4);
    const gdn_exec ex = {GDN_BACKEND_CUDA, NULL, 0, 0};
    gdn_status s = gdn_gate_bwd(&ex, rows, HV, dt, da_in, dA_in, with_bias ? dbias : NULL, ddg, dda, ddA,
                                want_ddt ? dddt : NULL);
    if (ran(ctx, s)) {
        const double bg = bound_grad(dt);
        dclose(ctx, "da", dt, dda, dar, n, bg);
        dclose(ctx, "dA_log", GDN_F32, ddA, dAr, HV, bg);
        if (want_ddt) dclose(ctx, "ddt_bias", GDN_F32, dddt, ddtr, HV, bg);
        if (hs == GDN_OK) {
            dclose(ctx, "da vs the CPU backend", dt, dda, cda, n, bg);
            dclose(ctx, "dA_log vs the CPU backend", GDN_F32, ddA, cdA, HV, bg);
            if (want_ddt) dclose(ctx, "ddt_bias vs the CPU backend", GDN_F32, dddt, cddt, HV, bg);
        }
        const obuf o[3] = {{dda, dt, n}, {ddA, GDN_F32, (size_t)HV}, {want_ddt ? dddt : NULL, GDN_F32, (size_t)HV}};
        void *keep[3];
        obuf_keep(o, 3, keep);
        s = gdn_gate_bwd(&ex, rows, HV, dt, da_in, dA_in, with_bias ? dbias : NULL, ddg, dda, ddA, want_ddt ? dddt : NULL);
        if (ran(ctx, s)) check(obuf_same(o, 3, keep), ctx, "a second run gave other bits");
        else for (int i = 0; i < 3; i++) free(keep[i]);
    }
    void *dev[] = {ab, gb, dab, dAb, ddtb, dA_in, dbias};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
    free(ad); free(dgd); free(Ad); free(bd); free(dar); free(dAr); free(ddtr); free(a); free(dg); free(A); free(bias);
    free(hda); free(hdA); free(hddt); free(cda); free(cdA); free(cddt);
}

static void l2norm_bwd_case(int64_t rows, int dim, gdn_dtype dt, int misalign, uint64_t seed) {
    rng r;
    rng_seed(&r, seed);
    char ctx[300];
    snprintf(ctx, sizeof ctx, "op=l2norm_bwd backend=cuda rows=%lld dim=%d dtype=%s misalign=%d seed=%llu", (long long)rows,
             dim, t_dtype_name(dt), misalign, (unsigned long long)seed);
    const size_t n = (size_t)rows * dim;
    double *xd = dvec(n), *dyd = dvec(n), *yr = dvec(n), *rsr = dvec((size_t)rows), *dxr = dvec(n);
    void *x = t_alloc(n * t_dsize(dt) + 2), *dy = t_alloc(n * t_dsize(dt) + 2);
    for (size_t i = 0; i < n; i++) {
        xd[i] = t_store(dt, x, i, (float)(rng_normal(&r) * ((i / dim) % 7 == 3 ? 1e-3 : 1.0)));
        dyd[i] = t_store(dt, dy, i, (float)rng_normal(&r));
    }
    gdn_ref_l2norm_fwd(rows, dim, xd, yr, rsr);
    gdn_ref_l2norm_bwd(rows, dim, xd, dyd, dxr);
    float *rs = t_alloc((size_t)rows * 4 + 4);
    for (int64_t i = 0; i < rows; i++) rs[i] = (float)rsr[i];   /* the forward's rstd */

    /* the CPU backend on the same inputs */
    void *hdx = t_alloc(n * t_dsize(dt));
    const gdn_status hs = gdn_l2norm_bwd(NULL, rows, dim, dt, x, rs, dy, hdx);
    check(hs == GDN_OK, ctx, "CPU backward: status %s (%s)", gdn_status_string(hs), gdn_last_error());
    double *cdx = as_d(dt, hdx, n);

    void *xb, *yb, *dxb;
    const void *dx_in = dput_at(x, n, dt, misalign, &xb), *ddy = dput_at(dy, n, dt, misalign, &yb);
    void *ddx = dnan_at(dt, n, misalign, &dxb);
    float *drs = dput(rs, (size_t)rows * 4);
    const gdn_exec ex = {GDN_BACKEND_CUDA, NULL, 0, 0};
    gdn_status s = gdn_l2norm_bwd(&ex, rows, dim, dt, dx_in, drs, ddy, ddx);
    if (ran(ctx, s)) {
        dclose(ctx, "dx", dt, ddx, dxr, n, bound_grad(dt));
        if (hs == GDN_OK) dclose(ctx, "dx vs the CPU backend", dt, ddx, cdx, n, bound_grad(dt));
        const obuf o[1] = {{ddx, dt, n}};
        void *keep[1];
        obuf_keep(o, 1, keep);
        s = gdn_l2norm_bwd(&ex, rows, dim, dt, dx_in, drs, ddy, ddx);
        if (ran(ctx, s)) check(obuf_same(o, 1, keep), ctx, "a second run gave other bits");
        else free(keep[0]);
    }
    void *dev[] = {xb, yb, dxb, drs};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
    free(xd); free(dyd); free(yr); free(rsr); free(dxr); free(x); free(dy); free(rs); free(hdx); free(cdx);
}

static void test_norms_bwd(rng *r) {
    const int64_t rows_list[4] = {0, 1, 37, 1000};
    const int Vs[10] = {1, 5, 64, 128, 130, 256, 1000, 1024, 2048, 4100};
    long k = 0;
    for (int di = 0; di < 3; di++)
        for (int gi = 0; gi < 2; gi++)
            for (int ri = 0; ri < 4; ri++)
                for (int vi = 0; vi < 10; vi++, k++) {
                    if (g_quick && k % 3) continue;
                    const int64_t rows = Vs[vi] >= 1000 ? rows_list[ri] / 8 : rows_list[ri];
                    rmsnorm_bwd_case(rows, Vs[vi], dts[di], (gdn_norm_gate)gi, k % 2 ? 1e-5f : 1e-6f, (int)(k / 2 % 2),
                                     k % 11 == 4, rng_u64(r));
                }
    /* many rows: every rank of the dw cluster walks several batches, with and without rstd */
    for (int give = 0; give < 2; give++) {
        rmsnorm_bwd_case(20000, 128, GDN_BF16, GDN_NORM_GATE_SILU, 1e-6f, give, 0, rng_u64(r));
        rmsnorm_bwd_case(9001, 96, GDN_F32, GDN_NORM_GATE_SIGMOID, 1e-5f, give, give, rng_u64(r));
        rmsnorm_bwd_case(5000, 3, GDN_F16, GDN_NORM_GATE_SILU, 1e-6f, give, 0, rng_u64(r));
    }
    const int64_t grows[5] = {0, 1, 37, 1003, 30000};
    const int HVs[5] = {1, 3, 4, 32, 48};
    for (int di = 0; di < 3; di++)
        for (int ri = 0; ri < 5; ri++)
            for (int hi = 0; hi < 5; hi++, k++) {
                if (g_quick && ri == 4 && hi != 3) continue;
                gate_bwd_case(grows[ri], HVs[hi], dts[di], (int)(k % 2), (int)(k % 3 != 1), k % 5 == 1, rng_u64(r));
            }
    const int dims[8] = {2, 5, 24, 64, 128, 256, 1000, 3000};   /* not 1: dx there is all cancellation (test_backend.c) */
    for (int di = 0; di < 3; di++)
        for (int ri = 0; ri < 4; ri++)
            for (int mi = 0; mi < 8; mi++, k++) {
                if (g_quick && k % 3) continue;
                l2norm_bwd_case(dims[mi] >= 1000 ? rows_list[ri] / 8 : rows_list[ri], dims[mi], dts[di], k % 7 == 2,
                                rng_u64(r));
            }
}

/* ---- the decode step with its conv (conv_W > 0), and the wide kernel at odd K ---- */

static double silu_d(double x) { return x / (1.0 + exp(-x)); }

static void decode_case(int B, int H, int HV, int K, int V, int W, gdn_dtype dt, unsigned flags, int use_slots,
                        uint64_t seed) {
    rng r;
    rng_seed(&r, seed);
    char ctx[400], fl[96];
    flags_str(flags, fl, sizeof fl);
    snprintf(ctx, sizeof ctx, "op=decode_step backend=cuda B%d H%d HV%d K%d V%d conv_W=%d dtype=%s flags=%s slots=%d "
             "seed=%llu", B, H, HV, K, V, W, t_dtype_name(dt), fl, use_slots, (unsigned long long)seed);
    const int D = 2 * H * K + HV * V, Wc = W ? W : 1;
    const int64_t pool = use_slots ? B + 3 : B;
    const size_t dsz = t_dsize(dt), st_n = (size_t)K * V, nst = (size_t)pool * HV * st_n, ncs = (size_t)pool * D * Wc,
                 no = (size_t)B * HV * V;
    /* slots: distinct pool rows, every third row padding, one row out of range (padding on CUDA) */
    int32_t *slots = t_alloc(sizeof(int32_t) * (size_t)B), *sref = t_alloc(sizeof(int32_t) * (size_t)B);
    for (int b = 0; b < B; b++) slots[b] = use_slots ? (int32_t)((pool - 1 - b + pool) % pool) : b;
    if (use_slots) {
        for (int b = 1; b < B; b += 3) slots[b] = -1;
        if (B > 2) slots[B - 1] = (int32_t)(pool + 5);
    }
    for (int b = 0; b < B; b++) sref[b] = slots[b] >= 0 && slots[b] < pool ? slots[b] : -1;
    double *ind = dvec((size_t)B * D), *gad = dvec((size_t)B * HV), *gbd = dvec((size_t)B * HV);
    void *in = rnd(&r, dt, (size_t)B * D, 1.0, ind), *ga = rnd(&r, dt, (size_t)B * HV, 1.0, gad),
         *gb = rnd(&r, dt, (size_t)B * HV, 1.0, gbd);
    float A_log[64], dt_bias[64];
    double A_logd[64], dt_biasd[64];
    for (int j = 0; j < HV; j++) {
        A_log[j] = (float)log(1.0 + 15.0 * rng_uniform(&r)); A_logd[j] = A_log[j];
        dt_bias[j] = (float)(0.5 * rng_normal(&r)); dt_biasd[j] = dt_bias[j];
    }
    double *std0 = dvec(nst), *cwd = dvec((size_t)D * Wc), *cbd = dvec(D), *csd = dvec(ncs);
    float *state = rnd(&r, GDN_F32, nst, 0.3, std0), *cw = rnd(&r, GDN_F32, (size_t)D * Wc, 0.5, cwd),
          *cb = rnd(&r, GDN_F32, D, 0.1, cbd), *cst = rnd(&r, GDN_F32, ncs, 1.0, csd);
    /* reference: per row, the conv update written out, then the recurrence with T = 1 */
    double *o_ref = dvec(no), *o_terms2 = dvec(no), *st_ref = dvec(nst), *x = dvec(D), *q = dvec((size_t)H * K), *k = dvec((size_t)H * K),
           *v = dvec((size_t)HV * V), *ht = dvec((size_t)HV * st_n);
    memcpy(st_ref, std0, nst * sizeof(double));
    gdn_config rc = {.B = 1, .T = 1, .H = H, .HV = HV, .K = K, .V = V, .dtype = GDN_F32, .gate_dtype = GDN_F32,
                     .flags = flags | GDN_GATE_FUSED | GDN_BETA_SIGMOID};
    for (int b = 0; b < B; b++) {
        const int64_t s = sref[b];
        if (s < 0) {
            memset(o_ref + (size_t)b * HV * V, 0, sizeof(double) * HV * V);
            memset(o_terms2 + (size_t)b * HV * V, 0, sizeof(double) * HV * V);
            continue;
        }
        for (int i = 0; i < D; i++) x[i] = ind[(size_t)b * D + i];
        if (W)
            for (int c = 0; c < D; c++) {
                double *sc = csd + (s * D + c) * W, acc = cbd[c];
                for (int w = 0; w + 1 < W; w++) { sc[w] = sc[w + 1]; acc += cwd[(size_t)c * W + w] * sc[w]; }
                sc[W - 1] = x[c];
                acc += cwd[(size_t)c * W + W - 1] * x[c];
                x[c] = silu_d(acc);
            }
        memcpy(q, x, sizeof(double) * H * K);
        memcpy(k, x + H * K, sizeof(double) * H * K);
        memcpy(v, x + 2 * H * K, sizeof(double) * HV * V);
        gdn_ref_inputs ri = {q, k, v, gad + (size_t)b * HV, gbd + (size_t)b * HV, A_logd, dt_biasd, st_ref + s * HV * st_n};
        gdn_ref_fwd_terms(&rc, &ri, o_ref + (size_t)b * HV * V, ht, o_terms2 + (size_t)b * HV * V);
        memcpy(st_ref + s * HV * st_n, ht, sizeof(double) * HV * st_n);
    }
    void *ob;
    void *din = dput(in, (size_t)B * D * dsz), *dga = dput(ga, (size_t)B * HV * dsz), *dgb = dput(gb, (size_t)B * HV * dsz),
         *dA = dput(A_log, (size_t)HV * 4), *ddt = dput(dt_bias, (size_t)HV * 4), *dst = dput(state, nst * 4),
         *dcw = dput(cw, (size_t)D * Wc * 4), *dcb = dput(cb, (size_t)D * 4), *dcs = dput(cst, ncs * 4),
         *dsl = dput(slots, sizeof(int32_t) * (size_t)B), *dO = dnan_at(dt, no, 0, &ob);
    gdn_decode_config c = {.B = B, .H = H, .HV = HV, .K = K, .V = V, .dtype = dt, .flags = flags, .num_slots = pool,
                           .conv_W = W};
    gdn_decode_args a = {.a = dga, .b = dgb, .A_log = dA, .dt_bias = ddt, .state = dst, .slots = use_slots ? dsl : NULL,
                         .o = dO};
    if (W) { a.proj = din; a.conv_state = dcs; a.conv_weight = dcw; a.conv_bias = dcb; }
    else a.mixed_qkv = din;
    const gdn_exec ex = {GDN_BACKEND_CUDA, NULL, 0, 0};
    const gdn_status s = gdn_decode_step(&ex, &c, &a);
    if (ran(ctx, s)) {
        dclose_terms(ctx, "o", dt, dO, o_ref, o_terms2, no, bound_fwd(dt));
        dclose(ctx, "state", GDN_F32, dst, st_ref, nst, bound_fwd(dt));
        if (W) dclose(ctx, "conv_state", GDN_F32, dcs, csd, ncs, 1e-7);
        float *st2 = t_alloc(nst * 4), *cs2 = t_alloc(ncs * 4);
        dget(st2, dst, nst * 4);
        dget(cs2, dcs, ncs * 4);
        int same = 1;
        for (int64_t p = 0; p < pool; p++) {
            int used = 0;
            for (int b = 0; b < B; b++) used |= sref[b] == p;
            if (used) continue;
            same &= !memcmp(st2 + p * HV * st_n, state + p * HV * st_n, 4 * HV * st_n);
            same &= !memcmp(cs2 + p * D * Wc, cst + p * D * Wc, (size_t)4 * D * Wc);
        }
        check(same, ctx, "pool rows of padding, out-of-range or unused slots changed");
        free(st2); free(cs2);
    }
    void *dev[] = {din, dga, dgb, dA, ddt, dst, dcw, dcb, dcs, dsl, ob};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
    free(slots); free(sref); free(ind); free(gad); free(gbd); free(in); free(ga); free(gb); free(std0); free(cwd);
    free(cbd); free(csd); free(state); free(cw); free(cb); free(cst); free(o_ref); free(o_terms2); free(st_ref); free(x); free(q);
    free(k); free(v); free(ht);
}

static void test_decode_conv(rng *r) {
    /* B, H, HV, K, V: few rows take the 4-warp k-first kernel (R = 8, 16, 32, 64), many rows with V % 4 == 0
     * the 16-byte one (R = 8, 16, 32), v-first the per-warp one; K odd on both */
    const int shapes[][5] = {{1, 2, 4, 32, 32}, {3, 1, 2, 64, 48}, {5, 2, 4, 128, 128}, {2, 1, 1, 256, 40},
                             {2, 1, 2, 33, 17}, {260, 2, 8, 128, 32}, {260, 1, 8, 64, 128}, {130, 2, 16, 256, 8},
                             {300, 1, 8, 33, 64}};
    long k = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
        for (int v = 0; v < 4; v++, k++) {
            const int *sh = shapes[si];
            if (g_quick && sh[0] >= 100 && v % 2) continue;
            const unsigned f = (v & 1 ? GDN_QK_L2NORM : 0) | (v & 2 ? GDN_STATE_V_FIRST : 0) | (v == 3 ? GDN_BETA_NEGATIVE : 0);
            const int W = 1 + (int)((si * 3 + v) % 8);
            decode_case(sh[0], sh[1], sh[2], sh[3], sh[4], W, dts[k % 3], f, v >= 1, rng_u64(r));
            if (v == 1) decode_case(sh[0], sh[1], sh[2], sh[3], sh[4], 0, dts[(k + 1) % 3], f, 1, rng_u64(r));
        }
}

/* ---- bad input on CUDA ---- */

static void test_bad_input(void) {
    enum { NB = 4096 };
    unsigned char pat[NB];
    memset(pat, 0x5A, NB);
    float *din = dalloc_dev(NB), *dout = dput(pat, NB), *dout2 = dput(pat, NB), *dst = dput(pat, NB);
    float hin[NB / 4];
    for (int i = 0; i < NB / 4; i++) hin[i] = 0.25f;
    cudaMemcpy(din, hin, NB, cudaMemcpyHostToDevice);
    const gdn_exec ex = {GDN_BACKEND_CUDA, NULL, 0, 0};
    char ctx[200];
#define BAD(what, want, call) do { \
        const gdn_status s_ = (call); \
        cudaDeviceSynchronize(); \
        const int same_ = dsame(dout, pat, NB) && dsame(dout2, pat, NB) && dsame(dst, pat, NB); \
        snprintf(ctx, sizeof ctx, "op=%s backend=cuda bad input", what); \
        check(s_ == (want) && gdn_last_error()[0] != 0 && same_, ctx, "status %s (want %s), message \"%s\", outputs %s", \
              gdn_status_string(s_), gdn_status_string(want), gdn_last_error(), same_ ? "unchanged" : "WRITTEN"); \
    } while (0)
    int64_t cu[3] = {0, 2, 5};
    gdn_conv1d_config cc = {.B = 1, .T = 5, .D = 6, .W = 4, .dtype = GDN_F32, .silu = 1};
    gdn_conv1d_args ca = {din, din, NULL, din, dout, dout2};
    gdn_conv1d_config cv = cc;
    cv.cu_seqlens = cu; cv.num_seqs = 2;
    BAD("conv1d_fwd cu_seqlens without cu_seqlens_dev", GDN_ERR_NULL, gdn_conv1d_fwd(&ex, &cv, &ca));
    ca.y = NULL;
    BAD("conv1d_fwd y NULL", GDN_ERR_NULL, gdn_conv1d_fwd(&ex, &cc, &ca));
    ca.y = dout;
    ca.weight = NULL;
    BAD("conv1d_fwd weight NULL", GDN_ERR_NULL, gdn_conv1d_fwd(&ex, &cc, &ca));
    ca.weight = din;
    cc.W = 9;
    BAD("conv1d_fwd W 9", GDN_ERR_SHAPE, gdn_conv1d_fwd(&ex, &cc, &ca));
    cc.W = 4;
    cc.dtype = (gdn_dtype)5;
    BAD("conv1d_fwd dtype 5", GDN_ERR_DTYPE, gdn_conv1d_fwd(&ex, &cc, &ca));
    cc.dtype = GDN_F32;
    gdn_conv1d_bwd_args cb = {din, din, NULL, NULL, din, NULL, dout, dout2, NULL, dst};
    BAD("conv1d_bwd cu_seqlens without cu_seqlens_dev", GDN_ERR_NULL, gdn_conv1d_bwd(&ex, &cv, &cb));
    cb.dx = NULL;
    BAD("conv1d_bwd dx NULL", GDN_ERR_NULL, gdn_conv1d_bwd(&ex, &cc, &cb));
    cb.dx = dout;
    cb.dweight = NULL;
    BAD("conv1d_bwd dweight NULL", GDN_ERR_NULL, gdn_conv1d_bwd(&ex, &cc, &cb));
    cb.dweight = dout2;
    cc.W = 0;
    BAD("conv1d_bwd W 0", GDN_ERR_SHAPE, gdn_conv1d_bwd(&ex, &cc, &cb));
    cc.W = 4;
    cc.silu = 3;
    BAD("conv1d_bwd silu 3", GDN_ERR_OPTION, gdn_conv1d_bwd(&ex, &cc, &cb));
    cc.silu = 1;
    gdn_conv1d_config uc = cc;
    uc.B = 3;
    BAD("conv1d_update state NULL", GDN_ERR_NULL, gdn_conv1d_update(&ex, &uc, din, din, NULL, NULL, 3, NULL, dout));
    BAD("conv1d_update num_slots 2 < B 3, slots NULL", GDN_ERR_SHAPE,
        gdn_conv1d_update(&ex, &uc, din, din, NULL, dst, 2, NULL, dout));
    BAD("conv1d_update y NULL", GDN_ERR_NULL, gdn_conv1d_update(&ex, &uc, din, din, NULL, dst, 3, NULL, NULL));
    const gdn_rmsnorm_config rc = {4, 16, GDN_BF16, 1e-6f, GDN_NORM_GATE_SILU};
    BAD("rmsnorm_fwd x NULL", GDN_ERR_NULL, gdn_rmsnorm_gated_fwd(&ex, &rc, NULL, din, din, dout, (float *)dout2));
    BAD("rmsnorm_fwd w NULL", GDN_ERR_NULL, gdn_rmsnorm_gated_fwd(&ex, &rc, din, din, NULL, dout, (float *)dout2));
    gdn_rmsnorm_config re = rc;
    re.eps = 0.f;
    BAD("rmsnorm_fwd eps 0", GDN_ERR_OPTION, gdn_rmsnorm_gated_fwd(&ex, &re, din, din, din, dout, (float *)dout2));
    BAD("rmsnorm_bwd dz NULL", GDN_ERR_NULL, gdn_rmsnorm_gated_bwd(&ex, &rc, din, din, din, NULL, din, dout, NULL, dst));
    BAD("rmsnorm_bwd dw NULL", GDN_ERR_NULL, gdn_rmsnorm_gated_bwd(&ex, &rc, din, din, din, NULL, din, dout, dout2, NULL));
    BAD("rmsnorm_bwd eps 0", GDN_ERR_OPTION, gdn_rmsnorm_gated_bwd(&ex, &re, din, din, din, NULL, din, dout, dout2, dst));
    BAD("gate_fwd A_log NULL", GDN_ERR_NULL, gdn_gate_fwd(&ex, 4, 2, GDN_F32, din, NULL, NULL, dout));
    BAD("gate_fwd g NULL", GDN_ERR_NULL, gdn_gate_fwd(&ex, 4, 2, GDN_F32, din, din, NULL, NULL));
    BAD("gate_fwd HV 0", GDN_ERR_SHAPE, gdn_gate_fwd(&ex, 4, 0, GDN_F32, din, din, NULL, dout));
    BAD("gate_bwd dA_log NULL", GDN_ERR_NULL, gdn_gate_bwd(&ex, 4, 2, GDN_F32, din, din, NULL, din, dout, NULL, dst));
    BAD("gate_bwd da NULL", GDN_ERR_NULL, gdn_gate_bwd(&ex, 4, 2, GDN_F32, din, din, NULL, din, NULL, dout2, dst));
    BAD("gate_bwd dtype 5", GDN_ERR_DTYPE, gdn_gate_bwd(&ex, 4, 2, (gdn_dtype)5, din, din, NULL, din, dout, dout2, dst));
    BAD("l2norm_fwd y NULL", GDN_ERR_NULL, gdn_l2norm_fwd(&ex, 4, 8, GDN_F16, din, NULL, dout2));
    BAD("l2norm_fwd rows -1", GDN_ERR_SHAPE, gdn_l2norm_fwd(&ex, -1, 8, GDN_F16, din, dout, dout2));
    BAD("l2norm_bwd rstd NULL", GDN_ERR_NULL, gdn_l2norm_bwd(&ex, 4, 8, GDN_F16, din, NULL, din, dout));
    BAD("l2norm_bwd dim 0", GDN_ERR_SHAPE, gdn_l2norm_bwd(&ex, 4, 0, GDN_F16, din, din, din, dout));
    /* decode with conv: the pointers the conv needs */
    gdn_decode_config dc = {.B = 2, .H = 1, .HV = 2, .K = 8, .V = 8, .dtype = GDN_F32, .num_slots = 2, .conv_W = 4};
    gdn_decode_args da = {.proj = din, .conv_state = dout2, .conv_weight = din, .a = din, .b = din, .A_log = din,
                          .state = dst, .o = dout};
    da.proj = NULL;
    BAD("decode_step conv_W 4, proj NULL", GDN_ERR_NULL, gdn_decode_step(&ex, &dc, &da));
    da.proj = din;
    da.conv_weight = NULL;
    BAD("decode_step conv_W 4, conv_weight NULL", GDN_ERR_NULL, gdn_decode_step(&ex, &dc, &da));
    da.conv_weight = din;
    dc.conv_W = 9;
    BAD("decode_step conv_W 9", GDN_ERR_SHAPE, gdn_decode_step(&ex, &dc, &da));
#undef BAD
    cudaFree(din); cudaFree(dout); cudaFree(dout2); cudaFree(dst);
}

/* ---- every op twice directly and once from a captured CUDA graph: the same bits ---- */

typedef struct pipe {
    /* inputs */
    void *x, *z, *gin, *proj, *ga, *gb;
    float *w, *bias, *h0, *nw, *A_log, *dt_bias, *cw, *cb, *st0, *cs0, *pool0;
    int32_t *uslots, *dslots;   /* device: the update's (a slot twice), the decode's (distinct) */
    void *cdy, *ndy, *l2dy;     /* output gradients of the backwards: conv1d, RMSNorm, L2 norm */
    float *cdht, *gdg;          /* conv1d dht, gate dg */
    int64_t *vcu;               /* device cu_seqlens of the varlen conv1d backward */
    /* outputs and states (device) */
    void *y, *ny, *l2y, *o, *uy;
    float *ht, *nrs, *g, *l2rs, *st, *cs, *pool;
    /* backward outputs (device) */
    void *cdx, *vdx, *ndx, *ndz, *gda, *l2dx;
    float *cdw, *cdb, *cdh0, *vdw, *vdh0, *ndw, *gdA, *gddt;
} pipe;

enum { PB = 2, PT = 70, PD = 256, PW = 4, PR = 100, PV = 128, PHV = 4, DB = 4, DH = 2, DHV = 4, DK = 64, DV = 64,
       DD = 2 * DH * DK + DHV * DV, UB = 5, US = 4, VN = 4 };
/* the varlen conv1d backward: the PB*PT tokens of x as VN sequences */
static const int64_t pipe_cu[VN + 1] = {0, 1, 1, 90, PB * PT};

static gdn_status pipe_run(pipe *p, cudaStream_t st) {
    const gdn_exec ex = {GDN_BACKEND_CUDA, st, 0, 0};
    const gdn_conv1d_config cc = {.B = PB, .T = PT, .D = PD, .W = PW, .dtype = GDN_BF16, .silu = 1};
    const gdn_conv1d_args ca = {p->x, p->w, p->bias, p->h0, p->y, p->ht};
    gdn_status s = gdn_conv1d_fwd(&ex, &cc, &ca);
    const gdn_conv1d_config uc = {.B = UB, .D = PD, .W = PW, .dtype = GDN_BF16, .silu = 1};
    if (!s) s = gdn_conv1d_update(&ex, &uc, p->x, p->w, p->bias, p->pool, US, p->uslots, p->uy);
    const gdn_rmsnorm_config rc = {PR, PV, GDN_BF16, 1e-6f, GDN_NORM_GATE_SILU};
    if (!s) s = gdn_rmsnorm_gated_fwd(&ex, &rc, p->x, p->z, p->nw, p->ny, p->nrs);
    if (!s) s = gdn_gate_fwd(&ex, PR, PHV, GDN_BF16, p->gin, p->A_log, p->dt_bias, p->g);
    if (!s) s = gdn_l2norm_fwd(&ex, PR, PV, GDN_BF16, p->x, p->l2y, p->l2rs);
    const gdn_decode_config dc = {.B = DB, .H = DH, .HV = DHV, .K = DK, .V = DV, .dtype = GDN_BF16,
                                  .flags = GDN_QK_L2NORM, .num_slots = DB + 1, .conv_W = PW};
    const gdn_decode_args da = {.proj = p->proj, .conv_state = p->cs, .conv_weight = p->cw, .conv_bias = p->cb,
                                .a = p->ga, .b = p->gb, .A_log = p->A_log, .dt_bias = p->dt_bias, .state = p->st,
                                .slots = p->dslots, .o = p->o};
    if (!s) s = gdn_decode_step(&ex, &dc, &da);
    /* the backwards (rstd from the forwards above) */
    const gdn_conv1d_bwd_args cba = {p->x, p->w, p->bias, p->h0, p->cdy, p->cdht, p->cdx, p->cdw, p->cdb, p->cdh0};
    if (!s) s = gdn_conv1d_bwd(&ex, &cc, &cba);
    const gdn_conv1d_config vc = {.B = 1, .T = PB * PT, .D = PD, .W = PW, .cu_seqlens = pipe_cu, .cu_seqlens_dev = p->vcu,
                                  .num_seqs = VN, .dtype = GDN_BF16, .silu = 1};
    const gdn_conv1d_bwd_args vba = {p->x, p->w, NULL, p->h0, p->cdy, p->cdht, p->vdx, p->vdw, NULL, p->vdh0};
    if (!s) s = gdn_conv1d_bwd(&ex, &vc, &vba);
    if (!s) s = gdn_rmsnorm_gated_bwd(&ex, &rc, p->x, p->z, p->nw, p->nrs, p->ndy, p->ndx, p->ndz, p->ndw);
    if (!s) s = gdn_gate_bwd(&ex, PR, PHV, GDN_BF16, p->gin, p->A_log, p->dt_bias, p->gdg, p->gda, p->gdA, p->gddt);
    if (!s) s = gdn_l2norm_bwd(&ex, PR, PV, GDN_BF16, p->x, p->l2rs, p->l2dy, p->l2dx);
    return s;
}

/* the outputs and states of a run: device pointers and bytes; returns how many */
enum { PIPE_OUTS = 26 };
static int pipe_outs(const pipe *p, const void **src, size_t *n) {
    const void *s[PIPE_OUTS] = {p->y, p->ht, p->uy, p->pool, p->ny, p->nrs, p->g, p->l2y, p->l2rs, p->o, p->st, p->cs,
                                p->cdx, p->cdw, p->cdb, p->cdh0, p->vdx, p->vdw, p->vdh0, p->ndx, p->ndz, p->ndw,
                                p->gda, p->gdA, p->gddt, p->l2dx};
    const size_t b[PIPE_OUTS] = {
        (size_t)PB * PT * PD * 2, (size_t)PB * PD * PW * 4, (size_t)UB * PD * 2, (size_t)US * PD * PW * 4,
        (size_t)PR * PV * 2, PR * 4, (size_t)PR * PHV * 4, (size_t)PR * PV * 2, PR * 4, (size_t)DB * DHV * DV * 2,
        (size_t)(DB + 1) * DHV * DK * DV * 4, (size_t)(DB + 1) * DD * PW * 4,
        (size_t)PB * PT * PD * 2, (size_t)PD * PW * 4, (size_t)PD * 4, (size_t)PB * PD * PW * 4,   /* conv1d bwd */
        (size_t)PB * PT * PD * 2, (size_t)PD * PW * 4, (size_t)VN * PD * PW * 4,                  /* varlen */
        (size_t)PR * PV * 2, (size_t)PR * PV * 2, (size_t)PV * 4,                                 /* RMSNorm bwd */
        (size_t)PR * PHV * 2, (size_t)PHV * 4, (size_t)PHV * 4,                                   /* gate bwd */
        (size_t)PR * PV * 2};                                                                     /* L2 norm bwd */
    for (int i = 0; i < PIPE_OUTS; i++) { src[i] = s[i]; n[i] = b[i]; }
    return PIPE_OUTS;
}
static size_t pipe_bytes(void) {
    pipe p;
    memset(&p, 0, sizeof p);
    const void *src[PIPE_OUTS];
    size_t n[PIPE_OUTS], all = 0;
    for (int i = 0, k = pipe_outs(&p, src, n); i < k; i++) all += n[i];
    return all;
}
static void pipe_get(const pipe *p, unsigned char *h) {
    const void *src[PIPE_OUTS];
    size_t n[PIPE_OUTS];
    for (int i = 0, k = pipe_outs(p, src, n); i < k; i++) { dget(h, src[i], n[i]); h += n[i]; }
}
/* the in-place states back to their start */
static void pipe_reset(pipe *p) {
    cudaMemcpy(p->st, p->st0, (size_t)(DB + 1) * DHV * DK * DV * 4, cudaMemcpyDeviceToDevice);
    cudaMemcpy(p->cs, p->cs0, (size_t)(DB + 1) * DD * PW * 4, cudaMemcpyDeviceToDevice);
    cudaMemcpy(p->pool, p->pool0, (size_t)US * PD * PW * 4, cudaMemcpyDeviceToDevice);
}

static void *rnd_dev(rng *r, gdn_dtype t, size_t n, double s) {
    double *d = dvec(n);
    void *h = rnd(r, t, n, s, d), *dv = dput(h, n * t_dsize(t));
    free(d); free(h);
    return dv;
}

static void test_graph(rng *r) {
    char ctx[200];
    snprintf(ctx, sizeof ctx, "op=layer ops (conv1d fwd+update+bwd, varlen conv1d bwd, rmsnorm fwd+bwd, gate fwd+bwd, "
             "l2norm fwd+bwd, decode+conv) backend=cuda [determinism, CUDA graph] seed=%llu",
             (unsigned long long)g_base_seed);
    pipe p;
    memset(&p, 0, sizeof p);
    p.x = rnd_dev(r, GDN_BF16, (size_t)PB * PT * PD, 1.0);   /* also the update's rows, the norms' x */
    p.z = rnd_dev(r, GDN_BF16, (size_t)PR * PV, 1.0);
    p.gin = rnd_dev(r, GDN_BF16, (size_t)PR * PHV, 2.0);
    p.proj = rnd_dev(r, GDN_BF16, (size_t)DB * DD, 1.0);
    p.ga = rnd_dev(r, GDN_BF16, (size_t)DB * DHV, 1.0);
    p.gb = rnd_dev(r, GDN_BF16, (size_t)DB * DHV, 1.0);
    p.w = rnd_dev(r, GDN_F32, (size_t)DD * PW, 0.5);          /* conv weight [PD,PW] and [DD,PW] */
    p.cw = p.w;
    p.bias = rnd_dev(r, GDN_F32, DD, 0.1);
    p.cb = p.bias;
    p.h0 = rnd_dev(r, GDN_F32, (size_t)VN * PD * PW, 1.0);   /* [N,D,W] for B = PB and for the VN sequences */
    p.nw = rnd_dev(r, GDN_F32, PV, 1.0);
    p.A_log = rnd_dev(r, GDN_F32, PHV, 0.5);
    p.dt_bias = rnd_dev(r, GDN_F32, PHV, 0.5);
    p.st0 = rnd_dev(r, GDN_F32, (size_t)(DB + 1) * DHV * DK * DV, 0.3);
    p.cs0 = rnd_dev(r, GDN_F32, (size_t)(DB + 1) * DD * PW, 1.0);
    p.pool0 = rnd_dev(r, GDN_F32, (size_t)US * PD * PW, 1.0);
    const int32_t uslots[UB] = {2, -1, 0, 2, 3}, dslots[DB] = {2, -1, 0, 4};
    p.uslots = dput(uslots, sizeof uslots);
    p.dslots = dput(dslots, sizeof dslots);
    p.cdy = rnd_dev(r, GDN_BF16, (size_t)PB * PT * PD, 1.0);
    p.ndy = rnd_dev(r, GDN_BF16, (size_t)PR * PV, 1.0);
    p.l2dy = rnd_dev(r, GDN_BF16, (size_t)PR * PV, 1.0);
    p.cdht = rnd_dev(r, GDN_F32, (size_t)VN * PD * PW, 1.0);   /* [N,D,W] for B = PB and for the VN sequences */
    p.gdg = rnd_dev(r, GDN_F32, (size_t)PR * PHV, 1.0);
    p.vcu = dput(pipe_cu, sizeof pipe_cu);
    p.y = dalloc_dev((size_t)PB * PT * PD * 2); p.ht = dalloc_dev((size_t)PB * PD * PW * 4);
    p.uy = dalloc_dev((size_t)UB * PD * 2); p.pool = dalloc_dev((size_t)US * PD * PW * 4);
    p.ny = dalloc_dev((size_t)PR * PV * 2); p.nrs = dalloc_dev(PR * 4); p.g = dalloc_dev((size_t)PR * PHV * 4);
    p.l2y = dalloc_dev((size_t)PR * PV * 2); p.l2rs = dalloc_dev(PR * 4); p.o = dalloc_dev((size_t)DB * DHV * DV * 2);
    p.st = dalloc_dev((size_t)(DB + 1) * DHV * DK * DV * 4); p.cs = dalloc_dev((size_t)(DB + 1) * DD * PW * 4);
    p.cdx = dalloc_dev((size_t)PB * PT * PD * 2); p.cdw = dalloc_dev((size_t)PD * PW * 4); p.cdb = dalloc_dev((size_t)PD * 4);
    p.cdh0 = dalloc_dev((size_t)PB * PD * PW * 4); p.vdx = dalloc_dev((size_t)PB * PT * PD * 2);
    p.vdw = dalloc_dev((size_t)PD * PW * 4); p.vdh0 = dalloc_dev((size_t)VN * PD * PW * 4);
    p.ndx = dalloc_dev((size_t)PR * PV * 2); p.ndz = dalloc_dev((size_t)PR * PV * 2); p.ndw = dalloc_dev((size_t)PV * 4);
    p.gda = dalloc_dev((size_t)PR * PHV * 2); p.gdA = dalloc_dev((size_t)PHV * 4); p.gddt = dalloc_dev((size_t)PHV * 4);
    p.l2dx = dalloc_dev((size_t)PR * PV * 2);
    const size_t nb = pipe_bytes();
    unsigned char *r1 = t_alloc(nb), *r2 = t_alloc(nb), *r3 = t_alloc(nb);
    cudaStream_t st;
    cudaStreamCreate(&st);
    int ok = 1;
    for (int run = 0; run < 2 && ok; run++) {
        pipe_reset(&p);
        ok = ran(ctx, pipe_run(&p, st));
        pipe_get(&p, run ? r2 : r1);
    }
    if (ok) check(!memcmp(r1, r2, nb), ctx, "two runs differ");
    /* the same calls captured into a graph (global mode: any host sync or allocation in a call fails it) */
    cudaGraph_t graph = NULL;
    cudaGraphExec_t gexec = NULL;
    if (ok) {
        pipe_reset(&p);
        cudaDeviceSynchronize();
        cudaError_t e = cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal);
        const gdn_status s = e == cudaSuccess ? pipe_run(&p, st) : GDN_OK;
        const cudaError_t e2 = e == cudaSuccess ? cudaStreamEndCapture(st, &graph) : e;
        if (e == cudaSuccess) e = e2;
        if (e == cudaSuccess) e = cudaGraphInstantiate(&gexec, graph, 0);
        if (e == cudaSuccess) e = cudaGraphLaunch(gexec, st);
        if (e == cudaSuccess) e = cudaStreamSynchronize(st);
        if (check(s == GDN_OK && e == cudaSuccess, ctx, "graph capture: status %s (%s), cuda %s", gdn_status_string(s),
                  gdn_last_error(), cudaGetErrorString(e))) {
            pipe_get(&p, r3);
            check(!memcmp(r1, r3, nb), ctx, "the graph's results differ from the direct run");
        }
        if (gexec) cudaGraphExecDestroy(gexec);
        if (graph) cudaGraphDestroy(graph);
        cudaGetLastError();
    }
    cudaStreamDestroy(st);
    void *dev[] = {p.x, p.z, p.gin, p.proj, p.ga, p.gb, p.w, p.bias, p.h0, p.nw, p.A_log, p.dt_bias, p.st0, p.cs0,
                   p.pool0, p.uslots, p.dslots, p.y, p.ht, p.uy, p.pool, p.ny, p.nrs, p.g, p.l2y, p.l2rs, p.o, p.st, p.cs,
                   p.cdy, p.ndy, p.l2dy, p.cdht, p.gdg, p.vcu, p.cdx, p.cdw, p.cdb, p.cdh0, p.vdx, p.vdw, p.vdh0, p.ndx,
                   p.ndz, p.ndw, p.gda, p.gdA, p.gddt, p.l2dx};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
    free(r1); free(r2); free(r3);
}

void test_cuda_layer(void) {
    if (!gdn_backend_available(GDN_BACKEND_CUDA)) {
        printf("  cuda layer ops: no device visible: skipped\n");
        return;
    }
    rng r;
    rng_seed(&r, mix_seed(g_base_seed, 0xc0da1a7e));
    test_conv_fwd(&r);
    test_conv_update(&r);
    test_conv_bwd(&r);
    test_norms(&r);
    test_norms_bwd(&r);
    test_decode_conv(&r);
    test_bad_input();
    test_graph(&r);
}

/* the backward passes alone (GDN_TEST_CUDA_BWD_ONLY=1, for the sanitizers) */
void test_cuda_layer_bwd(void) {
    if (!gdn_backend_available(GDN_BACKEND_CUDA)) return;
    rng r;
    rng_seed(&r, mix_seed(g_base_seed, 0xc0da1a7e));
    test_conv_bwd(&r);
    test_norms_bwd(&r);
}
#endif
