/* The CUDA backend on the device: the chunk and recurrent forward against
 * the float64 reference (o, ht and the saved rstd; chunk sequences also split
 * across blocks), the chunk backward against the reference and the CPU
 * backend (every option, determinism, a CUDA graph, bad input), the decode step against the CPU backend, itself checked
 * against the reference by the other groups; the layer ops in
 * test_cuda_layer.c. The bad input only the CUDA backend has (gdn.h, "The
 * CUDA backend"): misaligned pointers, the decode step's device slots, a
 * stream of another device. Fresh random inputs, poisoned outputs. Skipped,
 * and said so, where no device is visible. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/common.h"
#include "ref/ref.h"
#include "test_util.h"

#ifndef GDN_HAVE_CUDA
void test_cuda(void) { printf("  cuda: not built (no nvcc at build time): skipped\n"); }
#else
#include <cuda_runtime_api.h>

static void *dev_put(const void *h, size_t n) {
    void *d = NULL;
    if (cudaMalloc(&d, n ? n : 4) != cudaSuccess) { fprintf(stderr, "cudaMalloc failed\n"); exit(1); }
    if (n) cudaMemcpy(d, h, n, cudaMemcpyHostToDevice);
    return d;
}
static void dev_get(void *h, const void *d, size_t n) { if (n) cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost); }
/* dev_put `off` bytes into a fresh buffer (off = one 16-bit element: rows no longer 16-byte aligned); *base to free */
static void *dev_put_at(const void *h, size_t n, size_t off, void **base) {
    *base = NULL;
    if (cudaMalloc(base, n + off + 16) != cudaSuccess) { fprintf(stderr, "cudaMalloc failed\n"); exit(1); }
    char *d = (char *)*base + off;
    if (n) cudaMemcpy(d, h, n, cudaMemcpyHostToDevice);
    return d;
}

static const gdn_exec cuda_ex = {GDN_BACKEND_CUDA, NULL, 0, 0};

/* recurrent or chunk forward on the device vs the float64 reference; the
 * chunk forward's saved rstd vs rstd formed in double */
static void fwd_case(int chunk, int split, int64_t B, int64_t T, int H, int HV, int K, int V, const int64_t *lens, int nseq,
                     gdn_dtype dt, unsigned flags, int with_h0, uint64_t seed) {
    rng r;
    rng_seed(&r, seed);
    char fl[96], ctx[400];
    flags_str(flags, fl, sizeof fl);
    int64_t cu[17] = {0};
    if (nseq) { B = 1; T = 0; for (int i = 0; i < nseq; i++) { T += lens[i]; cu[i + 1] = T; } }
    gdn_exec ex = cuda_ex;
    ex.seq_split = split;
    snprintf(ctx, sizeof ctx, "op=%s seq_split=%d backend=cuda B%lld T%lld H%d HV%d K%d V%d nseq=%d dtype=%s flags=%s h0=%d seed=%llu",
             chunk ? "chunk_fwd" : "recurrent_fwd", split, (long long)B, (long long)T, H, HV, K, V, nseq, t_dtype_name(dt), fl, with_h0, (unsigned long long)seed);
    const int64_t N = nseq ? nseq : B;
    const size_t nq = (size_t)(B * T) * H * K, nv = (size_t)(B * T) * HV * V, ng = (size_t)(B * T) * HV,
                 ns = (size_t)N * HV * K * V, dsz = t_dsize(dt);
    void *q = t_alloc(nq * dsz), *k = t_alloc(nq * dsz), *v = t_alloc(nv * dsz), *g = t_alloc(ng * 4), *b = t_alloc(ng * 4);
    double *qd = t_alloc(8 * nq), *kd = t_alloc(8 * nq), *vd = t_alloc(8 * nv), *gd = t_alloc(8 * ng), *bd = t_alloc(8 * ng);
    for (size_t i = 0; i < nq; i++) { qd[i] = t_store(dt, q, i, (float)rng_normal(&r)); kd[i] = t_store(dt, k, i, (float)(rng_normal(&r) * (flags & GDN_QK_L2NORM ? 1.0 : 0.15))); }
    for (size_t i = 0; i < nv; i++) vd[i] = t_store(dt, v, i, (float)rng_normal(&r));
    for (size_t i = 0; i < ng; i++) {
        gd[i] = t_store(GDN_F32, g, i, (float)(flags & GDN_GATE_FUSED ? rng_normal(&r) : -fabs(rng_normal(&r))));
        bd[i] = t_store(GDN_F32, b, i, (float)(flags & GDN_BETA_SIGMOID ? rng_normal(&r) : rng_uniform(&r)));
    }
    float A_log[64], dt_bias[64], *h0 = t_alloc(4 * ns);
    double A_logd[64], dt_biasd[64], *h0d = t_alloc(8 * ns);
    for (int j = 0; j < HV; j++) { A_log[j] = (float)log(1 + 15 * rng_uniform(&r)); A_logd[j] = A_log[j]; dt_bias[j] = (float)(0.5 * rng_normal(&r)); dt_biasd[j] = dt_bias[j]; }
    for (size_t i = 0; i < ns; i++) { h0[i] = (float)(0.3 * rng_normal(&r)); h0d[i] = h0[i]; }
    gdn_config c = {.B = B, .T = T, .H = H, .HV = HV, .K = K, .V = V, .dtype = dt, .gate_dtype = GDN_F32, .flags = flags};
    if (nseq) { c.cu_seqlens = cu; c.num_seqs = nseq; }
    double *o_ref = t_alloc(8 * nv), *ht_ref = t_alloc(8 * ns), *o_terms2 = t_alloc(8 * nv);
    gdn_ref_inputs in = {qd, kd, vd, gd, bd, A_logd, dt_biasd, with_h0 ? h0d : NULL};
    gdn_ref_fwd_terms(&c, &in, o_ref, ht_ref, o_terms2);
    /* device copies; outputs poisoned with NaN */
    void *o = t_alloc(nv * dsz);
    float *ht = t_alloc(4 * ns);
    t_poison_nan(dt, o, nv);
    t_poison_nan(GDN_F32, ht, ns);
    void *dq = dev_put(q, nq * dsz), *dk = dev_put(k, nq * dsz), *dv = dev_put(v, nv * dsz), *dg = dev_put(g, ng * 4),
         *db = dev_put(b, ng * 4), *dA = dev_put(A_log, 4 * HV), *ddt = dev_put(dt_bias, 4 * HV), *dh0 = dev_put(h0, 4 * ns),
         *dO = dev_put(o, nv * dsz), *dht = dev_put(ht, 4 * ns), *dcu = dev_put(cu, 8 * (size_t)(nseq + 1));
    if (nseq) c.cu_seqlens_dev = dcu;
    gdn_fwd_args a = {.q = dq, .k = dk, .v = dv, .g = dg, .beta = db, .A_log = dA, .dt_bias = ddt,
                      .h0 = with_h0 ? dh0 : NULL, .o = dO, .ht = dht};
    const size_t sv = gdn_chunk_saved_size(&c), nws = gdn_chunk_fwd_workspace_size(&ex, &c);
    float *saved = t_alloc(sv + 4);
    t_poison_nan(GDN_F32, saved, sv / 4);
    void *dsv = dev_put(saved, sv), *dws = NULL;
    if (cudaMalloc(&dws, nws + 4) != cudaSuccess) { fprintf(stderr, "cudaMalloc failed\n"); exit(1); }
    if (chunk) { a.saved = dsv; a.saved_bytes = sv; a.workspace = dws; a.workspace_bytes = nws; }
    const gdn_status s = chunk ? gdn_chunk_fwd(&ex, &c, &a) : gdn_recurrent_fwd(&ex, &c, &a);
    const cudaError_t e = cudaDeviceSynchronize();
    if (check(s == GDN_OK && e == cudaSuccess, ctx, "status %s (%s), cuda %s", gdn_status_string(s), gdn_last_error(),
              cudaGetErrorString(e))) {
        dev_get(o, dO, nv * dsz);
        dev_get(ht, dht, 4 * ns);
        check_close_terms(ctx, "o", dt, o, o_ref, o_terms2, nv, bound_fwd(dt));
        check_close(ctx, "ht", GDN_F32, ht, ht_ref, ns, bound_fwd(dt));
        if (chunk && sv) {   /* rstd of q and k per (token, head) */
            const size_t nr = (size_t)(B * T) * H;
            double *rr = t_alloc(8 * 2 * nr + 8);
            for (size_t x = 0; x < 2 * nr; x++) {
                const double *src = (x < nr ? qd : kd) + (x % nr) * K;
                double ss = 0;
                for (int i = 0; i < K; i++) ss += src[i] * src[i];
                rr[x] = 1.0 / sqrt(ss + 1e-6);
            }
            dev_get(saved, dsv, sv);
            check_close(ctx, "saved rstd", GDN_F32, saved, rr, 2 * nr, 1e-5);
            free(rr);
        }
    }
    free(saved);
    void *dev[] = {dq, dk, dv, dg, db, dA, ddt, dh0, dO, dht, dcu, dsv, dws};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
    free(q); free(k); free(v); free(g); free(b); free(qd); free(kd); free(vd); free(gd); free(bd);
    free(h0); free(h0d); free(o_ref); free(ht_ref); free(o_terms2); free(o); free(ht);
}

/* decode step on the device vs the CPU backend on the same inputs */
static void decode_case(int B, int H, int HV, int K, int V, gdn_dtype dt, unsigned flags, int use_slots, uint64_t seed) {
    rng r;
    rng_seed(&r, seed);
    char fl[96], ctx[400];
    flags_str(flags, fl, sizeof fl);
    snprintf(ctx, sizeof ctx, "op=decode_step backend=cuda B%d H%d HV%d K%d V%d dtype=%s flags=%s slots=%d seed=%llu",
             B, H, HV, K, V, t_dtype_name(dt), fl, use_slots, (unsigned long long)seed);
    const int D = 2 * H * K + HV * V;
    const int64_t pool = use_slots ? B + 2 : B;
    const size_t dsz = t_dsize(dt), ns = (size_t)pool * HV * K * V, no = (size_t)B * HV * V;
    void *x = t_alloc((size_t)B * D * dsz), *ga = t_alloc((size_t)B * HV * dsz), *gb = t_alloc((size_t)B * HV * dsz);
    for (size_t i = 0; i < (size_t)B * D; i++) t_store(dt, x, i, (float)rng_normal(&r));
    for (size_t i = 0; i < (size_t)B * HV; i++) { t_store(dt, ga, i, (float)rng_normal(&r)); t_store(dt, gb, i, (float)rng_normal(&r)); }
    float A_log[64], dt_bias[64], *st_cpu = t_alloc(4 * ns), *st_gpu = t_alloc(4 * ns), *st0 = t_alloc(4 * ns);
    for (int j = 0; j < HV; j++) { A_log[j] = (float)log(1 + 15 * rng_uniform(&r)); dt_bias[j] = (float)(0.5 * rng_normal(&r)); }
    for (size_t i = 0; i < ns; i++) st0[i] = (float)(0.3 * rng_normal(&r));
    memcpy(st_cpu, st0, 4 * ns);
    int32_t slots[512];
    for (int i = 0; i < B; i++) slots[i] = (int32_t)((pool - 1 - i) % pool);
    if (use_slots) for (int i = 1; i < B; i += 3) slots[i] = -1;
    void *o_cpu = t_alloc(no * dsz), *o_gpu = t_alloc(no * dsz);
    gdn_decode_config c = {.B = B, .H = H, .HV = HV, .K = K, .V = V, .dtype = dt, .flags = flags, .num_slots = pool};
    gdn_decode_args a = {.mixed_qkv = x, .a = ga, .b = gb, .A_log = A_log, .dt_bias = dt_bias, .state = st_cpu,
                         .slots = use_slots ? slots : NULL, .o = o_cpu};
    gdn_status s = gdn_decode_step(NULL, &c, &a);
    check(s == GDN_OK, ctx, "CPU decode: %s", gdn_last_error());
    t_poison_nan(dt, o_gpu, no);
    void *dx = dev_put(x, (size_t)B * D * dsz), *dga = dev_put(ga, (size_t)B * HV * dsz), *dgb = dev_put(gb, (size_t)B * HV * dsz),
         *dA = dev_put(A_log, 4 * HV), *ddt = dev_put(dt_bias, 4 * HV), *dst = dev_put(st0, 4 * ns),
         *dsl = dev_put(slots, 4 * (size_t)B), *dO = dev_put(o_gpu, no * dsz);
    gdn_decode_args ad = {.mixed_qkv = dx, .a = dga, .b = dgb, .A_log = dA, .dt_bias = ddt, .state = dst,
                          .slots = use_slots ? dsl : NULL, .o = dO};
    s = gdn_decode_step(&cuda_ex, &c, &ad);
    const cudaError_t e = cudaDeviceSynchronize();
    if (check(s == GDN_OK && e == cudaSuccess, ctx, "status %s (%s), cuda %s", gdn_status_string(s), gdn_last_error(),
              cudaGetErrorString(e))) {
        dev_get(o_gpu, dO, no * dsz);
        dev_get(st_gpu, dst, 4 * ns);
        double *ref = t_alloc(8 * (no > ns ? no : ns));
        for (size_t i = 0; i < no; i++) ref[i] = t_get(dt, o_cpu, i);
        check_close(ctx, "o vs CPU", dt, o_gpu, ref, no, dt == GDN_F32 ? 1e-5 : 1e-2);
        for (size_t i = 0; i < ns; i++) ref[i] = st_cpu[i];
        check_close(ctx, "state vs CPU", GDN_F32, st_gpu, ref, ns, 1e-5);
        /* pool rows of padding and unused slots: unchanged, byte for byte */
        int same = 1;
        for (int64_t p = 0; p < pool; p++) {
            int used = 0;
            for (int i = 0; i < B; i++) used |= (use_slots ? slots[i] : i) == p;
            if (!used) same &= !memcmp(st_gpu + p * HV * K * V, st0 + p * HV * K * V, 4 * (size_t)HV * K * V);
        }
        check(same, ctx, "pool rows no row points at changed");
        free(ref);
    }
    void *dev[] = {dx, dga, dgb, dA, ddt, dst, dsl, dO};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
    free(x); free(ga); free(gb); free(st_cpu); free(st_gpu); free(st0); free(o_cpu); free(o_gpu);
}

/* chunk forward on the device with bad arguments: the status, a message, and
 * o, ht and saved byte for byte as they were */
static void chunk_bad_input(void) {
    enum { B = 1, T = 100, H = 2, HV = 4, K = 64, V = 64 };
    const size_t nq = (size_t)B * T * H * K * 2, nv = (size_t)B * T * HV * V * 2, ng = (size_t)B * T * HV * 4,
                 ns = (size_t)B * HV * K * V * 4;
    int64_t cu[3] = {0, 40, T};
    gdn_config c = {.B = B, .T = T, .H = H, .HV = HV, .K = K, .V = V, .dtype = GDN_BF16, .gate_dtype = GDN_F32,
                    .flags = GDN_QK_L2NORM | GDN_GATE_FUSED | GDN_BETA_SIGMOID};
    gdn_config cv = c;   /* the varlen config asks for its own workspace size */
    cv.cu_seqlens = cu; cv.num_seqs = 2;
    const size_t sv = gdn_chunk_saved_size(&c), nws = gdn_chunk_fwd_workspace_size(&cuda_ex, &c),
                 nwsv = gdn_chunk_fwd_workspace_size(&cuda_ex, &cv);
    size_t big = nv > ns ? nv : ns;
    if (nws > big) big = nws;
    if (nwsv > big) big = nwsv;
    unsigned char *pat = t_alloc(big), *back = t_alloc(big);
    memset(pat, 0x5a, big);
    void *q = dev_put(pat, nq), *k = dev_put(pat, nq), *v = dev_put(pat, nv), *g = dev_put(pat, ng), *b = dev_put(pat, ng),
         *A = dev_put(pat, 4 * HV), *o = dev_put(pat, nv), *ht = dev_put(pat, ns), *saved = dev_put(pat, sv),
         *ws = dev_put(pat, nws > nwsv ? nws : nwsv);
    check(nws > 0, "op=chunk_fwd backend=cuda bad input", "the CUDA workspace size is %zu (the cases below need > 0)", nws);
    const gdn_fwd_args good = {.q = q, .k = k, .v = v, .g = g, .beta = b, .A_log = A, .o = o, .ht = ht,
                               .saved = saved, .saved_bytes = sv, .workspace = ws, .workspace_bytes = nws};
    for (int cs = 0; cs < 5; cs++) {
        gdn_config cc = c;
        gdn_fwd_args a = good;
        gdn_status want = GDN_ERR_NULL;
        const char *what = "";
        switch (cs) {
        case 0: cc = cv; a.workspace_bytes = nwsv; what = "cu_seqlens without cu_seqlens_dev"; break;
        case 1: a.workspace = NULL; what = "workspace NULL"; break;
        case 2: a.workspace_bytes = nws - 1; want = GDN_ERR_WORKSPACE; what = "workspace_bytes one short"; break;
        case 3: a.saved_bytes = sv - 1; want = GDN_ERR_WORKSPACE; what = "saved_bytes one short"; break;
        default: a.q = NULL; what = "q NULL"; break;
        }
        const gdn_status s = gdn_chunk_fwd(&cuda_ex, &cc, &a);
        cudaDeviceSynchronize();
        int same = 1;
        const struct { void *p; size_t n; } outs[3] = {{o, nv}, {ht, ns}, {saved, sv}};
        for (int i = 0; i < 3; i++) { dev_get(back, outs[i].p, outs[i].n); same &= !memcmp(back, pat, outs[i].n); }
        char ctx[160];
        snprintf(ctx, sizeof ctx, "op=chunk_fwd backend=cuda bad input: %s", what);
        check(s == want && gdn_last_error()[0] && same, ctx, "status %s (want %s), message \"%s\", outputs %s",
              gdn_status_string(s), gdn_status_string(want), gdn_last_error(), same ? "unchanged" : "WRITTEN");
    }
    void *dev[] = {q, k, v, g, b, A, o, ht, saved, ws};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
    free(pat); free(back);
}

/* ---- chunk backward on the device ----
 * Forward on the device (its saved rstd is what the backward gets), then the
 * backward against the float64 reference and against the CPU backend's
 * gradients on the same inputs; outputs poisoned with NaN; a second run must
 * give the same bits; optionally a CUDA-graph capture of the call (same bits
 * again). */
enum { BG_NORMAL, BG_HARD, BG_ZERO, BG_NULL };
typedef struct bcase {
    int64_t B, T;
    int H, HV, K, V;
    const int64_t *lens;
    int nseq;
    gdn_dtype dt, gdt;
    unsigned flags;
    int gmode, beta_mode;   /* beta_mode: 0 uniform, 1 near 0, 2 near 1 */
    int h0, dht, dh0, dtb;
    int graph;
    int split;   /* gdn_exec.seq_split of the device calls */
    int mis;     /* dout one element into its buffer (allowed where V % 8 != 0): the backward's unaligned paths */
} bcase;

static double logsig(double x) { return x >= 0 ? -log1p(exp(-x)) : x - log1p(exp(x)); }

static void bwd_case(const bcase *tc, uint64_t seed) {
    rng r;
    rng_seed(&r, seed);
    const unsigned f = tc->flags;
    const int fused = (f & GDN_GATE_FUSED) != 0, H = tc->H, HV = tc->HV, K = tc->K, V = tc->V;
    const int has_g = fused || tc->gmode != BG_NULL;
    char fl[96], ctx[512];
    flags_str(f, fl, sizeof fl);
    int64_t cu[17] = {0}, B = tc->B, T = tc->T;
    if (tc->nseq) { B = 1; T = 0; for (int i = 0; i < tc->nseq; i++) { T += tc->lens[i]; cu[i + 1] = T; } }
    const int64_t N = tc->nseq ? tc->nseq : B;
    snprintf(ctx, sizeof ctx, "op=chunk_bwd backend=cuda B%lld T%lld H%d HV%d K%d V%d nseq=%d dtype=%s gate_dtype=%s flags=%s "
             "g=%d beta=%d h0=%d dht=%d dh0=%d dt_bias=%d seq_split=%d%s seed=%llu", (long long)B, (long long)T, H, HV, K, V,
             tc->nseq, t_dtype_name(tc->dt), t_dtype_name(tc->gdt), fl, tc->gmode, tc->beta_mode, tc->h0, tc->dht, tc->dh0,
             tc->dtb, tc->split, tc->mis ? " misaligned" : "", (unsigned long long)seed);
    gdn_exec bex = cuda_ex;   /* the backward's */
    bex.seq_split = tc->split;
    const size_t nq = (size_t)(B * T) * H * K, nv = (size_t)(B * T) * HV * V, ng = (size_t)(B * T) * HV,
                 ns = (size_t)N * HV * K * V, dsz = t_dsize(tc->dt), gsz = t_dsize(tc->gdt);
    void *q = t_alloc(nq * dsz), *k = t_alloc(nq * dsz), *v = t_alloc(nv * dsz), *dout = t_alloc(nv * dsz);
    void *g = t_alloc(ng * gsz), *b = t_alloc(ng * gsz);
    double *qd = t_alloc(8 * nq), *kd = t_alloc(8 * nq), *vd = t_alloc(8 * nv), *dod = t_alloc(8 * nv), *gd = t_alloc(8 * ng),
           *bd = t_alloc(8 * ng);
    for (size_t i = 0; i < nq; i++) qd[i] = t_store(tc->dt, q, i, (float)rng_normal(&r));
    for (size_t rw = 0; rw < nq / (size_t)K; rw++) {   /* without l2norm: |k| just under 1 */
        float row[256];
        double ss = 0;
        for (int i = 0; i < K; i++) { row[i] = (float)rng_normal(&r); ss += (double)row[i] * row[i]; }
        const double target = tc->dt == GDN_F32 ? 1.0 : 0.99;
        for (int i = 0; i < K; i++)
            kd[rw * K + i] = t_store(tc->dt, k, rw * K + i, (f & GDN_QK_L2NORM) ? row[i] : (float)(row[i] * target / sqrt(ss)));
    }
    for (size_t i = 0; i < nv; i++) vd[i] = t_store(tc->dt, v, i, (float)rng_normal(&r));
    for (size_t i = 0; i < nv; i++) dod[i] = t_store(tc->dt, dout, i, (float)rng_normal(&r));
    for (size_t i = 0; i < ng; i++) {
        double x;
        if (fused) {
            x = rng_normal(&r);
            if (tc->gmode == BG_HARD) x = 0.3 + 0.5 * x;
            if (tc->gmode == BG_ZERO) x = -30.0;
        } else if (tc->gmode == BG_HARD) x = rng_uniform(&r) < 0.5 ? -20.0 * rng_uniform(&r) : logsig(rng_normal(&r));
        else if (tc->gmode == BG_ZERO || tc->gmode == BG_NULL) x = 0.0;
        else x = logsig(rng_normal(&r));
        gd[i] = t_store(tc->gdt, g, i, (float)x);
        if (f & GDN_BETA_SIGMOID)
            x = tc->beta_mode == 1 ? -7.0 + 0.5 * rng_normal(&r) : tc->beta_mode == 2 ? 7.0 + 0.5 * rng_normal(&r) : rng_normal(&r);
        else
            x = tc->beta_mode == 1 ? 0.01 * rng_uniform(&r) : tc->beta_mode == 2 ? 1.0 - 0.01 * rng_uniform(&r) : rng_uniform(&r);
        bd[i] = t_store(tc->gdt, b, i, (float)x);
    }
    float A_log[64], dt_bias[64], *h0 = t_alloc(4 * ns), *dht = t_alloc(4 * ns);
    double A_logd[64], dt_biasd[64], *h0d = t_alloc(8 * ns), *dhtd = t_alloc(8 * ns);
    for (int j = 0; j < HV; j++) { A_log[j] = (float)log(1 + 15 * rng_uniform(&r)); A_logd[j] = A_log[j]; dt_bias[j] = (float)(0.5 * rng_normal(&r)); dt_biasd[j] = dt_bias[j]; }
    for (size_t i = 0; i < ns; i++) { h0[i] = (float)rng_normal(&r); h0d[i] = h0[i]; dht[i] = (float)rng_normal(&r); dhtd[i] = dht[i]; }
    gdn_config c = {.B = B, .T = T, .H = H, .HV = HV, .K = K, .V = V, .dtype = tc->dt, .gate_dtype = tc->gdt, .flags = f};
    if (tc->nseq) { c.cu_seqlens = cu; c.num_seqs = tc->nseq; }

    /* reference */
    gdn_ref_inputs in = {qd, kd, vd, has_g ? gd : NULL, bd, fused ? A_logd : NULL, fused && tc->dtb ? dt_biasd : NULL,
                         tc->h0 ? h0d : NULL};
    double *rf[8];
    const size_t sizes[8] = {nq, nq, nv, ng, ng, (size_t)HV, (size_t)HV, ns};
    for (int i = 0; i < 8; i++) rf[i] = t_alloc(8 * sizes[i]);
    double *dh0_t2 = t_alloc(8 * ns), *dg_t2 = t_alloc(8 * ng), *db_t2 = t_alloc(8 * ng);
    gdn_ref_bwd_terms(&c, &in, dod, tc->dht ? dhtd : NULL, rf[0], rf[1], rf[2], rf[3], rf[4], rf[5], rf[6], rf[7],
                      dh0_t2, dg_t2, db_t2);
    double dA_t2[64] = {0}, ddt_t2[64] = {0};
    if (fused) gate_param_terms2(ng, HV, gd, tc->dtb ? dt_biasd : NULL, rf[3], dA_t2, ddt_t2);
    const gdn_dtype types[8] = {tc->dt, tc->dt, tc->dt, tc->gdt, tc->gdt, GDN_F32, GDN_F32, GDN_F32};
    const char *names[8] = {"dq", "dk", "dv", fused ? "da" : "dg", (f & GDN_BETA_SIGMOID) ? "db" : "dbeta", "dA_log",
                            "ddt_bias", "dh0"};
    const int want[8] = {1, 1, 1, has_g, 1, fused, fused && tc->dh0, tc->dh0};

    /* the CPU backend on the same inputs (its own forward's saved rstd) */
    const size_t sv = gdn_chunk_saved_size(&c);
    void *cpu_out[8];
    for (int i = 0; i < 8; i++) cpu_out[i] = t_alloc(sizes[i] * t_dsize(types[i]));
    {
        void *saved = t_alloc(sv), *o = t_alloc(nv * dsz);
        const size_t wf = gdn_chunk_fwd_workspace_size(NULL, &c), wb = gdn_chunk_bwd_workspace_size(NULL, &c);
        void *wsf = t_alloc(wf), *wsb = t_alloc(wb);
        gdn_fwd_args fa = {.q = q, .k = k, .v = v, .g = has_g ? g : NULL, .beta = b, .A_log = fused ? A_log : NULL,
                           .dt_bias = fused && tc->dtb ? dt_bias : NULL, .h0 = tc->h0 ? h0 : NULL, .o = o,
                           .saved = saved, .saved_bytes = sv, .workspace = wsf, .workspace_bytes = wf};
        gdn_status s = gdn_chunk_fwd(NULL, &c, &fa);
        gdn_bwd_args ba = {.q = q, .k = k, .v = v, .g = has_g ? g : NULL, .beta = b, .A_log = fused ? A_log : NULL,
                           .dt_bias = fused && tc->dtb ? dt_bias : NULL, .h0 = tc->h0 ? h0 : NULL, .saved = saved,
                           .saved_bytes = sv, .dout = dout, .dht = tc->dht ? dht : NULL, .dq = cpu_out[0], .dk = cpu_out[1],
                           .dv = cpu_out[2], .dg = want[3] ? cpu_out[3] : NULL, .dbeta = cpu_out[4],
                           .dA_log = want[5] ? (float *)cpu_out[5] : NULL, .ddt_bias = want[6] ? (float *)cpu_out[6] : NULL,
                           .dh0 = want[7] ? (float *)cpu_out[7] : NULL, .workspace = wsb, .workspace_bytes = wb};
        if (!s) s = gdn_chunk_bwd(NULL, &c, &ba);
        check(s == GDN_OK, ctx, "CPU fwd/bwd: %s (%s)", gdn_status_string(s), gdn_last_error());
        free(saved); free(o); free(wsf); free(wsb);
    }

    /* the device: inputs, the forward (saved rstd), then the backward twice (and from a graph) */
    void *bdo;
    void *dq_ = dev_put(q, nq * dsz), *dk_ = dev_put(k, nq * dsz), *dv_ = dev_put(v, nv * dsz),
         *ddo = dev_put_at(dout, nv * dsz, tc->mis ? dsz : 0, &bdo), *dg_ = dev_put(g, ng * gsz), *db_ = dev_put(b, ng * gsz),
         *dA = dev_put(A_log, 4 * HV), *ddt = dev_put(dt_bias, 4 * HV),
         *dh0in = dev_put(h0, 4 * ns), *ddht = dev_put(dht, 4 * ns), *dcu = dev_put(cu, 8 * (size_t)(tc->nseq + 1));
    if (tc->nseq) c.cu_seqlens_dev = dcu;
    const size_t wf = gdn_chunk_fwd_workspace_size(&cuda_ex, &c), wb = gdn_chunk_bwd_workspace_size(&bex, &c);
    void *dsv = NULL, *dwsf = NULL, *dwsb = NULL, *dO = NULL;
    cudaMalloc(&dsv, sv + 4); cudaMalloc(&dwsf, wf + 4); cudaMalloc(&dO, nv * dsz + 4);
    if (cudaMalloc(&dwsb, wb + 4) != cudaSuccess) { fprintf(stderr, "cudaMalloc of %zu bytes failed\n", wb); exit(1); }
    cudaMemset(dwsb, 0xff, wb + 4);   /* NaN-filled workspace: nothing may be read before it is written */
    gdn_fwd_args fa = {.q = dq_, .k = dk_, .v = dv_, .g = has_g ? dg_ : NULL, .beta = db_, .A_log = fused ? dA : NULL,
                       .dt_bias = fused && tc->dtb ? ddt : NULL, .h0 = tc->h0 ? dh0in : NULL, .o = dO,
                       .saved = dsv, .saved_bytes = sv, .workspace = dwsf, .workspace_bytes = wf};
    gdn_status s = gdn_chunk_fwd(&cuda_ex, &c, &fa);
    check(s == GDN_OK, ctx, "CUDA fwd: %s (%s)", gdn_status_string(s), gdn_last_error());
    void *outs[3][8], *hbuf[3][8];
    for (int run = 0; run < 3; run++)
        for (int i = 0; i < 8; i++) {
            const size_t bytes = sizes[i] * t_dsize(types[i]);
            hbuf[run][i] = t_alloc(bytes);
            t_poison_nan(types[i], hbuf[run][i], sizes[i]);
            outs[run][i] = dev_put(hbuf[run][i], bytes);
        }
    int runs_ok = 1;
    for (int run = 0; run < (tc->graph ? 3 : 2); run++) {
        gdn_bwd_args ba = {.q = dq_, .k = dk_, .v = dv_, .g = has_g ? dg_ : NULL, .beta = db_, .A_log = fused ? dA : NULL,
                           .dt_bias = fused && tc->dtb ? ddt : NULL, .h0 = tc->h0 ? dh0in : NULL, .saved = dsv,
                           .saved_bytes = sv, .dout = ddo, .dht = tc->dht ? ddht : NULL, .dq = outs[run][0],
                           .dk = outs[run][1], .dv = outs[run][2], .dg = want[3] ? outs[run][3] : NULL, .dbeta = outs[run][4],
                           .dA_log = want[5] ? (float *)outs[run][5] : NULL, .ddt_bias = want[6] ? (float *)outs[run][6] : NULL,
                           .dh0 = want[7] ? (float *)outs[run][7] : NULL, .workspace = dwsb, .workspace_bytes = wb};
        cudaError_t e = cudaSuccess;
        if (run < 2) s = gdn_chunk_bwd(&bex, &c, &ba);
        else {   /* captured into a graph (global mode: a host sync or an allocation fails it), then launched */
            cudaStream_t st;
            cudaStreamCreate(&st);
            gdn_exec ex = bex;
            ex.stream = st;
            cudaGraph_t graph = NULL;
            cudaGraphExec_t gexec = NULL;
            e = cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal);
            s = e == cudaSuccess ? gdn_chunk_bwd(&ex, &c, &ba) : GDN_OK;
            const cudaError_t e2 = e == cudaSuccess ? cudaStreamEndCapture(st, &graph) : e;
            if (e == cudaSuccess) e = e2;
            if (e == cudaSuccess) e = cudaGraphInstantiate(&gexec, graph, 0);
            if (e == cudaSuccess) e = cudaGraphLaunch(gexec, st);
            if (e == cudaSuccess) e = cudaStreamSynchronize(st);
            if (gexec) cudaGraphExecDestroy(gexec);
            if (graph) cudaGraphDestroy(graph);
            cudaStreamDestroy(st);
        }
        const cudaError_t e3 = cudaDeviceSynchronize();
        if (e == cudaSuccess) e = e3;
        char c2[600];
        snprintf(c2, sizeof c2, "%s%s", ctx, run == 2 ? " [CUDA graph]" : run == 1 ? " [second run]" : "");
        runs_ok &= check(s == GDN_OK && e == cudaSuccess, c2, "status %s (%s), cuda %s", gdn_status_string(s),
                         gdn_last_error(), cudaGetErrorString(e));
        cudaGetLastError();
        if (!runs_ok) break;
        for (int i = 0; i < 8; i++) dev_get(hbuf[run][i], outs[run][i], sizes[i] * t_dsize(types[i]));
    }
    if (runs_ok) {
        const double bg = bound_grad(tc->dt);
        size_t most = 1;
        for (int i = 0; i < 8; i++) if (sizes[i] > most) most = sizes[i];
        double *cref = t_alloc(8 * most);
        for (int i = 0; i < 8; i++) {
            if (!want[i]) continue;
            char c2[600];
            snprintf(c2, sizeof c2, "%s vs CPU", names[i]);
            for (size_t x = 0; x < sizes[i]; x++) cref[x] = t_get(types[i], cpu_out[i], x);
            if (i >= 3) {   /* sums whose terms cancel (docs/DESIGN.md §5; dg, dbeta, dh0: gdn_ref_bwd_terms) */
                const double *t2 = i == 3 ? dg_t2 : i == 4 ? db_t2 : i == 5 ? dA_t2 : i == 6 ? ddt_t2 : dh0_t2;
                check_close_terms(ctx, names[i], types[i], hbuf[0][i], rf[i], t2, sizes[i], bg);
                check_close_terms(ctx, c2, types[i], hbuf[0][i], cref, t2, sizes[i], bg);
            } else {
                check_close(ctx, names[i], types[i], hbuf[0][i], rf[i], sizes[i], bg);
                check_close(ctx, c2, types[i], hbuf[0][i], cref, sizes[i], bg);
            }
            const size_t bytes = sizes[i] * t_dsize(types[i]);
            snprintf(c2, sizeof c2, "%s [determinism]", ctx);
            check(!memcmp(hbuf[0][i], hbuf[1][i], bytes), c2, "%s: two runs differ", names[i]);
            if (tc->graph) {
                snprintf(c2, sizeof c2, "%s [CUDA graph]", ctx);
                check(!memcmp(hbuf[0][i], hbuf[2][i], bytes), c2, "%s: the graph's result differs", names[i]);
            }
        }
        if (fused)
            check_gate_sums(ctx, ng, HV, gd, tc->dtb ? dt_biasd : NULL, tc->gdt, hbuf[0][3], hbuf[0][5],
                            want[6] ? hbuf[0][6] : NULL);
        free(cref);
    }
    for (int run = 0; run < 3; run++)
        for (int i = 0; i < 8; i++) { cudaFree(outs[run][i]); free(hbuf[run][i]); }
    void *dev[] = {dq_, dk_, dv_, bdo, dg_, db_, dA, ddt, dh0in, ddht, dcu, dsv, dwsf, dwsb, dO};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
    for (int i = 0; i < 8; i++) { free(rf[i]); free(cpu_out[i]); }
    free(dh0_t2); free(dg_t2); free(db_t2);
    free(q); free(k); free(v); free(dout); free(g); free(b); free(qd); free(kd); free(vd); free(dod); free(gd); free(bd);
    free(h0); free(dht); free(h0d); free(dhtd);
}

/* chunk backward on the device with bad arguments: the status, a message, and
 * no output byte written */
static void chunk_bwd_bad_input(void) {
    enum { B = 1, T = 100, H = 2, HV = 4, K = 32, V = 48 };
    int64_t cu[3] = {0, 40, T};
    gdn_config c = {.B = B, .T = T, .H = H, .HV = HV, .K = K, .V = V, .dtype = GDN_BF16, .gate_dtype = GDN_F32,
                    .flags = GDN_QK_L2NORM | GDN_GATE_FUSED | GDN_BETA_SIGMOID};
    gdn_config cv = c;
    cv.cu_seqlens = cu; cv.num_seqs = 2;
    const size_t nq = (size_t)B * T * H * K * 2, nv = (size_t)B * T * HV * V * 2, ng = (size_t)B * T * HV * 4,
                 ns = (size_t)B * HV * K * V * 4;
    const size_t sv = gdn_chunk_saved_size(&c), nws = gdn_chunk_bwd_workspace_size(&cuda_ex, &c),
                 nwsv = gdn_chunk_bwd_workspace_size(&cuda_ex, &cv);
    check(nws > 0, "op=chunk_bwd backend=cuda bad input", "the CUDA workspace size is %zu", nws);
    size_t big = nq > nv ? nq : nv;
    if (ns > big) big = ns;
    unsigned char *pat = t_alloc(big), *back = t_alloc(big);
    memset(pat, 0x5a, big);
    void *in = dev_put(pat, big), *dq = dev_put(pat, nq), *dk = dev_put(pat, nq), *dv = dev_put(pat, nv), *dg = dev_put(pat, ng),
         *db = dev_put(pat, ng), *dA = dev_put(pat, 4 * HV), *dd = dev_put(pat, 4 * HV), *dh0 = dev_put(pat, ns), *ws = NULL;
    cudaMalloc(&ws, (nws > nwsv ? nws : nwsv) + 4);
    const gdn_bwd_args good = {.q = in, .k = in, .v = in, .g = in, .beta = in, .A_log = (const float *)in, .saved = in,
                               .saved_bytes = sv, .dout = in, .dq = dq, .dk = dk, .dv = dv, .dg = dg, .dbeta = db,
                               .dA_log = (float *)dA, .ddt_bias = (float *)dd, .dh0 = (float *)dh0, .workspace = ws,
                               .workspace_bytes = nws};
    for (int cs = 0; cs < 6; cs++) {
        gdn_config cc = c;
        gdn_bwd_args a = good;
        gdn_status want = GDN_ERR_NULL;
        const char *what = "";
        switch (cs) {
        case 0: a.workspace_bytes = nws - 1; want = GDN_ERR_WORKSPACE; what = "workspace_bytes one short"; break;
        case 1: a.saved_bytes = sv - 1; want = GDN_ERR_WORKSPACE; what = "saved_bytes one short"; break;
        case 2: a.workspace = NULL; what = "workspace NULL"; break;
        case 3: cc = cv; a.workspace_bytes = nwsv; what = "cu_seqlens without cu_seqlens_dev"; break;
        case 4: a.dA_log = NULL; what = "dA_log NULL with GDN_GATE_FUSED"; break;
        default: a.saved = NULL; what = "saved NULL with GDN_QK_L2NORM"; break;
        }
        const gdn_status s = gdn_chunk_bwd(&cuda_ex, &cc, &a);
        cudaDeviceSynchronize();
        int same = 1;
        const struct { void *p; size_t n; } outs[8] = {{dq, nq}, {dk, nq}, {dv, nv}, {dg, ng}, {db, ng}, {dA, 4 * HV}, {dd, 4 * HV}, {dh0, ns}};
        for (int i = 0; i < 8; i++) { dev_get(back, outs[i].p, outs[i].n); same &= !memcmp(back, pat, outs[i].n); }
        char ctx[160];
        snprintf(ctx, sizeof ctx, "op=chunk_bwd backend=cuda bad input: %s", what);
        check(s == want && gdn_last_error()[0] && same, ctx, "status %s (want %s), message \"%s\", outputs %s",
              gdn_status_string(s), gdn_status_string(want), gdn_last_error(), same ? "unchanged" : "WRITTEN");
    }
    void *dev[] = {in, dq, dk, dv, dg, db, dA, dd, dh0, ws};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
    free(pat); free(back);
}

/* a backward's random inputs on the device: q, k (nq elements), v, dout (nv)
 * in dt; gate and beta rows (ng), h0 and dht (ns floats), A_log and dt_bias
 * (HV <= 64) fp32 */
typedef struct { void *q, *k, *v, *dout, *g, *b, *A, *dt, *h0, *dht; } bwd_dev;
static bwd_dev bwd_dev_make(rng *rp, gdn_dtype dt, size_t nq, size_t nv, size_t ng, size_t ns, int HV) {
    rng r = *rp;
    const size_t dsz = t_dsize(dt);
    void *q = t_alloc(nq * dsz), *k = t_alloc(nq * dsz), *v = t_alloc(nv * dsz), *dout = t_alloc(nv * dsz);
    float *g = t_alloc(4 * ng), *b = t_alloc(4 * ng), *h0 = t_alloc(4 * ns), *dht = t_alloc(4 * ns), A_log[64], dt_bias[64];
    for (size_t i = 0; i < nq; i++) { t_store(dt, q, i, (float)rng_normal(&r)); t_store(dt, k, i, (float)rng_normal(&r)); }
    for (size_t i = 0; i < nv; i++) { t_store(dt, v, i, (float)rng_normal(&r)); t_store(dt, dout, i, (float)rng_normal(&r)); }
    for (size_t i = 0; i < ng; i++) { g[i] = (float)rng_normal(&r); b[i] = (float)rng_normal(&r); }
    for (size_t i = 0; i < ns; i++) { h0[i] = (float)rng_normal(&r); dht[i] = (float)rng_normal(&r); }
    for (int j = 0; j < HV; j++) { A_log[j] = (float)log(1 + 15 * rng_uniform(&r)); dt_bias[j] = (float)(0.5 * rng_normal(&r)); }
    *rp = r;
    const bwd_dev d = {dev_put(q, nq * dsz), dev_put(k, nq * dsz), dev_put(v, nv * dsz), dev_put(dout, nv * dsz), dev_put(g, 4 * ng),
                       dev_put(b, 4 * ng), dev_put(A_log, 4 * HV), dev_put(dt_bias, 4 * HV), dev_put(h0, 4 * ns), dev_put(dht, 4 * ns)};
    free(q); free(k); free(v); free(dout); free(g); free(b); free(h0); free(dht);
    return d;
}
static void bwd_dev_free(bwd_dev *d) {
    void *dev[] = {d->q, d->k, d->v, d->dout, d->g, d->b, d->A, d->dt, d->h0, d->dht};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
}

/* the backward's sweep: every option on small shapes, the chunk borders,
 * head dims, varlen with empty and 1-token sequences, a long GVA case */
/* The local stage's windows (window_chunks, src/cuda/chunk_bwd.cu: the
 * reverse sweep and the local stage a window of chunks at a time, the last
 * first, the state gradient carried between them) change no bit: four
 * sequences whose items fill the windows' threshold against the first of
 * them alone (too few items for windows), whole sequences (seq_split 1) and
 * the same kernels otherwise; every gradient of sequence 0 and its dh0 the
 * same bits, the four sequences' outputs all written. The batch must take
 * the windows: its workspace under 3.875 times the one sequence's. Where
 * the forward keeps the last windows' states as tiles in saved (bf16, K = V
 * = 128: gdn_saved_keep, src/common/saved.c) its tag says so, and the
 * backward does read them: with the tiles zeroed (their tag kept) the
 * gradients change. */
static void windows_case(gdn_dtype dt, int H, int HV, int K, int V, unsigned flags, uint64_t seed) {
    rng r;
    rng_seed(&r, seed);
    const int64_t T = 8192, B = 4;
    char ctx[256];
    snprintf(ctx, sizeof ctx, "op=chunk_bwd backend=cuda windows B%lld T%lld H%d HV%d K%d V%d dtype=%s flags=0x%x seed=%llu",
             (long long)B, (long long)T, H, HV, K, V, t_dtype_name(dt), flags, (unsigned long long)seed);
    const size_t nq = (size_t)(B * T) * H * K, nv = (size_t)(B * T) * HV * V, ng = (size_t)(B * T) * HV,
                 ns = (size_t)B * HV * K * V, dsz = t_dsize(dt);
    bwd_dev d = bwd_dev_make(&r, dt, nq, nv, ng, ns, HV);
    const size_t sizes[6] = {nq, nq, nv, ng, ng, ns}, esz[6] = {dsz, dsz, dsz, 4, 4, 4};
    const char *names[6] = {"dq", "dk", "dv", "da", "db", "dh0"};
    void *out[4][6] = {{NULL}}, *host[4][6] = {{NULL}}, *dAl = NULL, *ddtb = NULL;   /* dA_log, ddt_bias: sums over every sequence, not compared */
    cudaMalloc(&dAl, 4 * HV); cudaMalloc(&ddtb, 4 * HV);
    size_t wbs[4] = {0, 0, 0, 0};
    gdn_config c4 = {.B = B, .T = T, .H = H, .HV = HV, .K = K, .V = V, .dtype = dt, .gate_dtype = GDN_F32, .flags = flags};
    const gdn_saved_layout sl = gdn_saved_at(&c4, (void *)(uintptr_t)4096);   /* offsets only */
    const int keeps = sl.keep != NULL;
    const size_t tag_off = sl.ckpt_tag ? (size_t)((char *)sl.ckpt_tag - (char *)(uintptr_t)4096) : 0,
                 keep_off = keeps ? (size_t)(sl.keep - (char *)(uintptr_t)4096) : 0;
    check(keeps == (dt == GDN_BF16 && K == 128 && V == 128), ctx, "saved keeps %s state tiles", keeps ? "" : "no");
    gdn_exec ex = cuda_ex;
    ex.seq_split = 1;
    int ok = 1;
    /* 0: the four sequences (the backward's windows start from the forward's checkpoints, the last
     * ones' states kept as tiles where keeps), 1: the first alone (no windows), 2: the four again after
     * a forward cut into segments (which keeps no checkpoints or tiles: the backward walks to them
     * itself), 3: as 0 with the kept tiles zeroed (where keeps) */
    const int runs = keeps ? 4 : 3;
    for (int run = 0; run < runs && ok; run++) {
        gdn_exec exf = ex;
        exf.seq_split = run == 2 ? 2 : 1;
        gdn_config c = {.B = run == 1 ? 1 : B, .T = T, .H = H, .HV = HV, .K = K, .V = V, .dtype = dt, .gate_dtype = GDN_F32, .flags = flags};
        const size_t sv = gdn_chunk_saved_size(&c), wf = gdn_chunk_fwd_workspace_size(&exf, &c), wb = gdn_chunk_bwd_workspace_size(&ex, &c);
        int tag[3] = {0, 0, 0};
        wbs[run] = wb;
        void *dsv = NULL, *dwsf = NULL, *dwsb = NULL, *dO = NULL;
        cudaMalloc(&dsv, sv + 4); cudaMalloc(&dwsf, wf + 4); cudaMalloc(&dwsb, wb + 4); cudaMalloc(&dO, nv * dsz);
        for (int i = 0; i < 6; i++) {
            host[run][i] = t_alloc(sizes[i] * esz[i]);
            t_poison_nan(i < 3 ? dt : GDN_F32, host[run][i], sizes[i]);
            out[run][i] = dev_put(host[run][i], sizes[i] * esz[i]);
        }
        gdn_fwd_args fa = {.q = d.q, .k = d.k, .v = d.v, .g = d.g, .beta = d.b, .A_log = d.A, .dt_bias = d.dt, .h0 = d.h0, .o = dO,
                           .saved = dsv, .saved_bytes = sv, .workspace = dwsf, .workspace_bytes = wf};
        gdn_bwd_args ba = {.q = d.q, .k = d.k, .v = d.v, .g = d.g, .beta = d.b, .A_log = d.A, .dt_bias = d.dt, .h0 = d.h0,
                           .saved = dsv, .saved_bytes = sv, .dout = d.dout, .dht = d.dht, .dq = out[run][0], .dk = out[run][1],
                           .dv = out[run][2], .dg = out[run][3], .dbeta = out[run][4], .dA_log = dAl, .ddt_bias = ddtb,
                           .dh0 = (float *)out[run][5], .workspace = dwsb, .workspace_bytes = wb};
        gdn_status s = gdn_chunk_fwd(&exf, &c, &fa);
        if (s == GDN_OK && run != 1 && sl.ckpt_tag) cudaMemcpy(tag, (char *)dsv + tag_off, sizeof tag, cudaMemcpyDeviceToHost);
        if (run == 3) cudaMemset((char *)dsv + keep_off, 0, sv - keep_off);
        if (s == GDN_OK) s = gdn_chunk_bwd(&ex, &c, &ba);
        const cudaError_t e = cudaDeviceSynchronize();
        ok = check(s == GDN_OK && e == cudaSuccess, ctx, "run %d: status %s (%s), cuda %s", run, gdn_status_string(s),
                   gdn_last_error(), cudaGetErrorString(e));
        if (ok && run != 1)
            ok = check(run == 2 || !keeps ? tag[2] == 0 : tag[2] != 0, ctx, "run %d: the kept tiles' tag in saved is %#x", run, tag[2]);
        for (int i = 0; i < 6; i++) dev_get(host[run][i], out[run][i], sizes[i] * esz[i]);
        void *dev[] = {dsv, dwsf, dwsb, dO};
        for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
    }
    if (ok) {
        /* without windows the four sequences' workspace is ~3.98 times the one's (517 slots against 130) */
        check(8 * wbs[0] + wbs[1] < 32 * wbs[1], ctx, "workspace %zu bytes for 4 sequences, %zu for one: no windows", wbs[0], wbs[1]);
        for (int run = 0; run < 3; run += 2)
            for (int i = 0; i < 6; i++) {
                size_t nan = 0;
                for (size_t x = 0; x < sizes[i]; x++)
                    nan += t_get(i < 3 ? dt : GDN_F32, host[run][i], x) != t_get(i < 3 ? dt : GDN_F32, host[run][i], x);
                check(nan == 0, ctx, "run %d, %s: %zu of %zu elements not written", run, names[i], nan, sizes[i]);
                check(!memcmp(host[run][i], host[1][i], sizes[i] / B * esz[i]), ctx, "run %d, %s of sequence 0: windows change its bits",
                      run, names[i]);
            }
        if (keeps) {
            int changed = 0;
            for (int i = 0; i < 6; i++) changed |= memcmp(host[0][i], host[3][i], sizes[i] * esz[i]) != 0;
            check(changed, ctx, "with saved's kept tiles zeroed no gradient changed: the backward did not read them");
        }
    }
    for (int run = 0; run < 4; run++)
        for (int i = 0; i < 6; i++) { cudaFree(out[run][i]); free(host[run][i]); }
    cudaFree(dAl); cudaFree(ddtb);
    bwd_dev_free(&d);
}

/* The forward's segment maps kept for the backward's split (gdn_saved_maps,
 * src/common/saved.c): a backward that takes them from saved gives the same
 * bits as one that runs its own pass 1 (the forward whole, seq_split 1, which
 * keeps none and clears their tag); and it does read them: with saved's maps
 * zeroed (their tag kept) the gradients change. One sequence of 4096 tokens on
 * four value heads, every call's split automatic but that forward's. */
static void maps_case(gdn_dtype dt, int HV, unsigned flags, uint64_t seed) {
    rng r;
    rng_seed(&r, seed);
    const int64_t T = 4096;
    const int H = 1, K = 128, V = 128;
    char ctx[256];
    snprintf(ctx, sizeof ctx, "op=chunk_bwd backend=cuda saved maps B1 T%lld H%d HV%d K%d V%d dtype=%s flags=0x%x seed=%llu", (long long)T,
             H, HV, K, V, t_dtype_name(dt), flags, (unsigned long long)seed);
    gdn_config c = {.B = 1, .T = T, .H = H, .HV = HV, .K = K, .V = V, .dtype = dt, .gate_dtype = GDN_F32, .flags = flags};
    const size_t nq = (size_t)T * H * K, nv = (size_t)T * HV * V, ng = (size_t)T * HV, ns = (size_t)HV * K * V, dsz = t_dsize(dt);
    const size_t sv = gdn_chunk_saved_size(&c);
    gdn_saved_layout sl = gdn_saved_at(&c, (void *)(uintptr_t)4096);   /* offsets only */
    if (!check(sl.maps != NULL, ctx, "saved keeps no maps for this shape (%zu bytes)", sv)) return;
    const size_t tag_off = (size_t)((char *)sl.ckpt_tag - (char *)(uintptr_t)4096), maps_off = (size_t)((char *)sl.maps - (char *)(uintptr_t)4096);
    bwd_dev d = bwd_dev_make(&r, dt, nq, nv, ng, ns, HV);
    void *dO = NULL, *dsv = NULL, *dwsf = NULL, *dwsb = NULL, *dAl = NULL, *ddtb = NULL;
    const size_t sizes[6] = {nq, nq, nv, ng, ng, ns}, esz[6] = {dsz, dsz, dsz, 4, 4, 4};
    const char *names[6] = {"dq", "dk", "dv", "da", "db", "dh0"};
    void *out[3][6] = {{NULL}}, *host[3][6] = {{NULL}};
    gdn_exec ex = cuda_ex, exw = cuda_ex;
    ex.seq_split = 0;
    exw.seq_split = 1;
    const size_t wf = gdn_chunk_fwd_workspace_size(&ex, &c), wfw = gdn_chunk_fwd_workspace_size(&exw, &c),
                 wb = gdn_chunk_bwd_workspace_size(&ex, &c);
    cudaMalloc(&dO, nv * dsz); cudaMalloc(&dsv, sv); cudaMalloc(&dwsf, (wf > wfw ? wf : wfw) + 16); cudaMalloc(&dwsb, wb + 16);
    cudaMalloc(&dAl, 4 * HV); cudaMalloc(&ddtb, 4 * HV);
    int ok = 1, tag[2] = {0, 0};
    /* 0: the forward split (its maps kept), 1: the forward whole (none kept), 2: as 0 with saved's maps zeroed */
    for (int run = 0; run < 3 && ok; run++) {
        for (int i = 0; i < 6; i++) {
            host[run][i] = t_alloc(sizes[i] * esz[i]);
            t_poison_nan(i < 3 ? dt : GDN_F32, host[run][i], sizes[i]);
            out[run][i] = dev_put(host[run][i], sizes[i] * esz[i]);
        }
        gdn_fwd_args fa = {.q = d.q, .k = d.k, .v = d.v, .g = d.g, .beta = d.b, .A_log = d.A, .dt_bias = d.dt, .h0 = d.h0, .o = dO,
                           .saved = dsv, .saved_bytes = sv, .workspace = dwsf, .workspace_bytes = run == 1 ? wfw : wf};
        gdn_bwd_args ba = {.q = d.q, .k = d.k, .v = d.v, .g = d.g, .beta = d.b, .A_log = d.A, .dt_bias = d.dt, .h0 = d.h0,
                           .saved = dsv, .saved_bytes = sv, .dout = d.dout, .dht = d.dht, .dq = out[run][0], .dk = out[run][1],
                           .dv = out[run][2], .dg = out[run][3], .dbeta = out[run][4], .dA_log = dAl, .ddt_bias = ddtb,
                           .dh0 = (float *)out[run][5], .workspace = dwsb, .workspace_bytes = wb};
        gdn_status s = gdn_chunk_fwd(run == 1 ? &exw : &ex, &c, &fa);
        cudaMemcpy(tag, (char *)dsv + tag_off, sizeof tag, cudaMemcpyDeviceToHost);
        if (run == 2) cudaMemset((char *)dsv + maps_off, 0, sv - maps_off);
        if (s == GDN_OK) s = gdn_chunk_bwd(&ex, &c, &ba);
        const cudaError_t e = cudaDeviceSynchronize();
        ok = check(s == GDN_OK && e == cudaSuccess, ctx, "run %d: status %s (%s), cuda %s", run, gdn_status_string(s), gdn_last_error(),
                   cudaGetErrorString(e));
        if (ok) ok = check(run == 1 ? tag[1] == 0 : tag[1] != 0, ctx, "run %d: the maps' tag in saved is %#x", run, tag[1]);
        for (int i = 0; i < 6; i++) dev_get(host[run][i], out[run][i], sizes[i] * esz[i]);
    }
    if (ok) {
        int changed = 0;
        for (int i = 0; i < 6; i++) {
            size_t nan = 0;
            for (size_t x = 0; x < sizes[i]; x++) nan += t_get(i < 3 ? dt : GDN_F32, host[0][i], x) != t_get(i < 3 ? dt : GDN_F32, host[0][i], x);
            check(nan == 0, ctx, "%s: %zu of %zu elements not written", names[i], nan, sizes[i]);
            check(!memcmp(host[0][i], host[1][i], sizes[i] * esz[i]), ctx, "%s: the saved maps change its bits", names[i]);
            changed |= memcmp(host[0][i], host[2][i], sizes[i] * esz[i]) != 0;
        }
        check(changed, ctx, "with saved's maps zeroed no gradient changed: the backward did not read them");
    }
    for (int run = 0; run < 3; run++)
        for (int i = 0; i < 6; i++) { cudaFree(out[run][i]); free(host[run][i]); }
    void *dev[] = {dAl, ddtb, dO, dsv, dwsf, dwsb};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
    bwd_dev_free(&d);
}

static const int64_t lens_ks[] = {0, 1, 200, 65, 0, 130};
/* uneven sequences whose blocks (12 x 16 value heads) outnumber the SMs: the forward's walk and the
 * fused pass take them longest first (common.cuh longest_first) */
static const int64_t lens_lpt[] = {0, 1, 300, 65, 700, 130, 64, 190, 450, 2, 257, 129};
static void test_cuda_chunk_bwd(rng *r) {
    const gdn_dtype dts[3] = {GDN_F32, GDN_BF16, GDN_F16};
    const unsigned L2 = GDN_QK_L2NORM, GF = GDN_GATE_FUSED, BS = GDN_BETA_SIGMOID, BN = GDN_BETA_NEGATIVE, VF = GDN_STATE_V_FIRST;
    const unsigned fsets[8] = {0, L2, GF, BS, L2 | GF | BS, L2 | GF | BS | BN | VF, VF, GF | BS | BN};
    chunk_bwd_bad_input();
    /* every flag set x dtype x gate dtype on a small GVA shape */
    for (int fi = 0; fi < 8; fi++)
        for (int di = 0; di < 3; di++)
            for (int gi = 0; gi < (di ? 2 : 1); gi++) {
                if (g_quick && (fi + di + gi) % 3) continue;
                bcase tc = {.B = 2, .T = 100, .H = 2, .HV = 4, .K = 40, .V = 24, .dt = dts[di], .gdt = gi ? dts[di] : GDN_F32,
                            .flags = fsets[fi], .gmode = (fi + di) % 3, .beta_mode = (fi + gi) % 3, .h0 = fi % 2 == 0,
                            .dht = fi % 3 != 1, .dh0 = 1, .dtb = fi != 2, .graph = fi == 4 && di == 1};
                bwd_case(&tc, rng_u64(r));
            }
    /* no gate at all (g NULL), hard decays, beta near 0 and 1, T at the chunk borders, G in 1, 2, 4 */
    const int64_t Ts[] = {0, 1, 63, 64, 65, 130};
    for (int ti = 0; ti < 6; ti++)
        for (int gm = 0; gm < 4; gm++) {
            if (g_quick && gm != (ti & 3)) continue;
            const int Gs[3] = {1, 2, 4};
            bcase tc = {.B = 2, .T = Ts[ti], .H = 2, .HV = 2 * Gs[(ti + gm) % 3], .K = 16, .V = 40, .dt = dts[(ti + gm) % 3],
                        .gdt = GDN_F32, .flags = gm == 1 ? (L2 | GF | BS) : (gm == 2 ? L2 : 0), .gmode = gm,
                        .beta_mode = ti % 3, .h0 = 1, .dht = 1, .dh0 = 1, .dtb = 1};
            bwd_case(&tc, rng_u64(r));
        }
    /* head dims */
    const int kv[][2] = {{16, 16}, {40, 72}, {64, 64}, {72, 40}, {128, 128}, {256, 256}, {256, 16}, {16, 256}, {1, 1}, {33, 17},
                         {128, 256}};
    for (size_t si = 0; si < sizeof kv / sizeof *kv; si++)
        for (int di = 0; di < 3; di++) {
            if (g_quick && (si + di) % 3) continue;
            bcase tc = {.B = 1, .T = 150, .H = 1, .HV = 2, .K = kv[si][0], .V = kv[si][1], .dt = dts[di], .gdt = GDN_F32,
                        .flags = fsets[(si + di) % 8], .gmode = (int)(si % 3), .h0 = 1, .dht = 1, .dh0 = 1, .dtb = 1};
            bwd_case(&tc, rng_u64(r));
        }
    /* the K split of the local stage (128 < K <= 256, G <= 4: two blocks an item, the sums over K exchanged
     * between them): K whole and partial halves (256, 200, 136, 130), V below, at and past a panel,
     * every dtype, G = 1, 3, 4, varlen with empty and short sequences, and sequences cut into segments (the
     * second bf16 at K = 256: the transposed reverse sweep's K split on the segments) */
    {
        const int ks[][3] = {{256, 256, 1}, {200, 72, 2}, {136, 40, 0}, {130, 128, 1}, {256, 16, 2}, {192, 256, 1}, {256, 128, 1}};
        for (int si = 0; si < 7; si++) {
            if (g_quick && si % 2) continue;
            bcase tc = {.B = 2, .T = 150 + 60 * si, .H = 2, .HV = 2, .K = ks[si][0], .V = ks[si][1], .dt = dts[ks[si][2]],
                        .gdt = GDN_F32, .flags = fsets[(3 * si + 4) % 8], .gmode = si % 3, .beta_mode = si % 3, .h0 = si != 2,
                        .dht = si != 4, .dh0 = 1, .dtb = 1};
            if (si == 1) { tc.lens = lens_ks; tc.nseq = 6; }
            if (si == 2 || si == 3) { tc.H = 1; tc.HV = si + 1; }   /* G = 3, 4: clusters of 6, 8 blocks */
            if (si >= 5) { tc.B = 1; tc.T = 1500; tc.H = 1; tc.HV = 1; tc.split = 3; }
            bwd_case(&tc, rng_u64(r));
        }
        /* past it (G = 5): the group stage */
        bcase tc = {.B = 2, .T = 130, .H = 1, .HV = 5, .K = 160, .V = 48, .dt = GDN_BF16, .gdt = GDN_F32, .flags = fsets[4],
                    .gmode = 1, .h0 = 1, .dht = 1, .dh0 = 1, .dtb = 1};
        bwd_case(&tc, rng_u64(r));
    }
    /* pinned (a random base seed found it): hard gates leave the last token's da to carry the head's
     * norm, and its dg = <dS, exp(g) S> cancelled to 1/4.9 of its terms; the fused pass (dS a bf16
     * operand of K dS and U dS^T) was 1.35x da's plain bound there, 0.29x against the terms
     * (docs/DESIGN.md §5, bench/NOTES.md "after v5.16") */
    {
        bcase tc = {.B = 1, .T = 150, .H = 1, .HV = 2, .K = 128, .V = 128, .dt = GDN_BF16, .gdt = GDN_F32, .flags = fsets[5],
                    .gmode = 1, .h0 = 1, .dht = 1, .dh0 = 1, .dtb = 1};
        bwd_case(&tc, 5076229035124244363ull);
    }
    /* seed 5050's f16 case (K = 128, V = 256: the transposed reverse sweep in f16): the state
     * gradient decays to ~1e-6 over the 150 tokens, below f16's normal range (6.1e-5), and its
     * dh0 came out 5.1e-2 off (bound 1e-2) until the sweep's operands took a per-warp scale
     * (bench/NOTES.md v5.27) */
    {
        bcase tc = {.B = 1, .T = 150, .H = 1, .HV = 2, .K = 128, .V = 256, .dt = GDN_F16, .gdt = GDN_F32, .flags = fsets[4],
                    .gmode = 1, .h0 = 1, .dht = 1, .dh0 = 1, .dtb = 1};
        bwd_case(&tc, 15051750483247767675ull);
    }
    /* G at the local stage's cluster limit (8) and past it (12, 16: dq, dk through the scratch and grp_qk_kernel) */
    const int bigG[3] = {8, 12, 16};
    for (int gi = 0; gi < 3; gi++) {
        const int w = gi != 1;   /* bf16, K = V = 128: the wgmma kernels */
        bcase tc = {.B = 1, .T = 150, .H = 1, .HV = bigG[gi], .K = w ? 128 : 40, .V = w ? 128 : 24, .dt = w ? GDN_BF16 : GDN_F32,
                    .gdt = GDN_F32, .flags = L2 | GF | BS, .gmode = gi, .h0 = 1, .dht = 1, .dh0 = 1, .dtb = 1};
        bwd_case(&tc, rng_u64(r));
    }
    /* varlen with empty and 1-token sequences */
    const int64_t lens[] = {0, 1, 64, 65, 0, 1, 127, 190};
    for (int fi = 0; fi < 8; fi++)
        for (int di = 0; di < 3; di++) {
            if (g_quick && (fi + di) % 4) continue;
            bcase tc = {.H = 2, .HV = 4, .K = 24, .V = 40, .lens = lens, .nseq = 8, .dt = dts[di], .gdt = GDN_F32,
                        .flags = fsets[fi], .gmode = fi % 3, .h0 = fi % 2, .dht = 1, .dh0 = 1, .dtb = 1, .graph = fi == 5 && di == 2};
            bwd_case(&tc, rng_u64(r));
        }
    /* the same with K = V = 128 in bf16 (the wgmma kernels: prep, the transposed reverse sweep, the walk over V);
     * the last two with V = 124 and dO one element into its buffer (allowed where V % 8 != 0): the 64-column
     * reverse sweep and the chunk-local kernel without wgmma, whole sequences and cut into segments */
    for (int fi = 0; fi < 6; fi++) {
        if (g_quick && fi % 2) continue;
        bcase tc = {.H = 1, .HV = 2 + 2 * (fi & 1), .K = 128, .V = fi >= 4 ? 124 : 128, .lens = lens, .nseq = 8, .dt = GDN_BF16, .gdt = GDN_F32,
                    .flags = fsets[(2 * fi + 1) % 8], .gmode = fi % 3, .h0 = fi != 2, .dht = 1, .dh0 = 1, .dtb = 1,
                    .mis = fi >= 4, .split = fi == 5 ? 3 : 0};
        bwd_case(&tc, rng_u64(r));
    }
    /* the fused pass (bf16, K = V = 128, G <= 4, aligned; its bf16 records and states) on whole sequences of
     * several chunks: G = 1 with hard decays and no dht, G = 2 with v-first states and a last chunk of one token,
     * G = 4 with v-first states and hard decays, and G = 4 on one sequence cut into three segments */
    if (!g_quick) {
        bcase a = {.B = 2, .T = 300, .H = 2, .HV = 2, .K = 128, .V = 128, .dt = GDN_BF16, .gdt = GDN_F32, .flags = L2 | BS,
                   .gmode = BG_HARD, .h0 = 1, .dht = 0, .dh0 = 1, .dtb = 1};
        bwd_case(&a, rng_u64(r));
        bcase b = {.B = 3, .T = 257, .H = 1, .HV = 2, .K = 128, .V = 128, .dt = GDN_BF16, .gdt = GDN_F32,
                   .flags = L2 | GF | BS | BN | VF, .gmode = BG_NORMAL, .h0 = 1, .dht = 1, .dh0 = 1, .dtb = 1};
        bwd_case(&b, rng_u64(r));
        bcase c = {.B = 2, .T = 300, .H = 1, .HV = 4, .K = 128, .V = 128, .dt = GDN_BF16, .gdt = GDN_F32,
                   .flags = L2 | GF | BS | VF, .gmode = BG_HARD, .h0 = 1, .dht = 1, .dh0 = 1, .dtb = 1};
        bwd_case(&c, rng_u64(r));
        bcase d = {.B = 1, .T = 2100, .H = 1, .HV = 4, .K = 128, .V = 128, .dt = GDN_BF16, .gdt = GDN_F32, .flags = L2 | GF | BS,
                   .gmode = BG_NORMAL, .h0 = 1, .dht = 1, .dh0 = 1, .dtb = 1, .split = 3};
        bwd_case(&d, rng_u64(r));
        bcase e = {.H = 8, .HV = 16, .K = 128, .V = 128, .lens = lens_lpt, .nseq = 12, .dt = GDN_BF16, .gdt = GDN_F32,
                   .flags = L2 | GF | BS, .gmode = BG_NORMAL, .h0 = 1, .dht = 1, .dh0 = 1, .dtb = 1};
        bwd_case(&e, rng_u64(r));
    }
    /* sequences split into segments that both sweeps walk at once (bf16 / f16; f32 walks whole sequences):
     * forced counts, one long sequence and varlen with empty, short and long ones, and the automatic
     * split of a long sequence with few heads */
    static const int64_t slens[] = {0, 1, 700, 65, 1500, 130};
    for (int k = 0; k < 6; k++) {
        if (g_quick && k % 2) continue;
        bcase tc = {.H = 1, .HV = 2, .K = 64, .V = 64, .dt = k % 3 == 2 ? GDN_F16 : GDN_BF16, .gdt = GDN_F32,
                    .flags = fsets[(k * 3) % 8 == 0 ? 4 : (k * 3) % 8], .gmode = k % 3, .h0 = k != 3, .dht = k != 1,
                    .dh0 = 1, .dtb = 1, .graph = k == 2, .split = 2 + k};
        if (k < 2) { tc.B = 1 + k; tc.T = 3000 - 700 * k; }
        else if (k < 5) { tc.lens = slens; tc.nseq = 6; tc.H = 2; tc.HV = 4; tc.K = 40; tc.V = 72; }
        else { tc.B = 1; tc.T = 2100; tc.K = 128; tc.V = 128; tc.HV = 1; tc.split = 0; }
        bwd_case(&tc, rng_u64(r));
    }
    /* the local stage's windows: bf16 K = V = 128 (the wgmma kernels), f16 K = V = 64 with v-first states,
     * f16 K = V = 256 (the local stage's K split) */
    windows_case(GDN_BF16, 16, 32, 128, 128, L2 | GF | BS, rng_u64(r));
    windows_case(GDN_F16, 8, 16, 64, 64, L2 | GF | BS | VF, rng_u64(r));
    windows_case(GDN_F16, 8, 16, 256, 256, L2 | GF | BS, rng_u64(r));   /* the K split (G = 2) */
    maps_case(GDN_BF16, 4, L2 | GF | BS, rng_u64(r));
    maps_case(GDN_F16, 2, L2 | GF | BS | VF, rng_u64(r));
    /* the long GVA case: many groups of slots */
    if (!g_quick) {
        bcase tc = {.B = 3, .T = 5000, .H = 6, .HV = 12, .K = 40, .V = 72, .dt = GDN_BF16, .gdt = GDN_F32,
                    .flags = L2 | GF | BS, .gmode = BG_NORMAL, .h0 = 1, .dht = 1, .dh0 = 1, .dtb = 1, .graph = 1};
        bwd_case(&tc, rng_u64(r));
    }
}

/* A probe, not bad input: the state walk of a split sequence (seq_split)
 * fetches v = 0 for the blocks of P's columns through load_rows with 0
 * columns (chunk_fwd.cuh). With HV*V % 8 == 0 but V % 8 != 0 (HV 2, V 4)
 * that is cp.async of 0 source bytes from v + (row*HV + j)*V, 8 bytes off
 * 16 for odd j: whether the hardware faults on the alignment of a 0-byte
 * copy is what this case shows. Run last: a misaligned-address fault ends
 * the CUDA context for everything after it. */
static void chunk_split_narrow_v(rng *r) {
    fwd_case(1, 2, 1, 300, 1, 2, 64, 4, NULL, 0, GDN_BF16, 0, 1, rng_u64(r));
    fwd_case(1, 2, 1, 300, 1, 2, 64, 4, NULL, 0, GDN_F16, GDN_QK_L2NORM | GDN_GATE_FUSED | GDN_BETA_SIGMOID, 1, rng_u64(r));
}

void test_cuda(void) {
    if (!gdn_backend_available(GDN_BACKEND_CUDA)) {
        printf("  cuda: no device visible: skipped\n");
        return;
    }
    rng r;
    rng_seed(&r, mix_seed(g_base_seed, 0xc0da));
    const gdn_dtype dts[3] = {GDN_F32, GDN_BF16, GDN_F16};
    const unsigned fsets[5] = {0, GDN_QK_L2NORM | GDN_GATE_FUSED | GDN_BETA_SIGMOID, GDN_STATE_V_FIRST,
                               GDN_QK_L2NORM | GDN_GATE_FUSED | GDN_BETA_SIGMOID | GDN_BETA_NEGATIVE | GDN_STATE_V_FIRST,
                               GDN_GATE_FUSED};
    const int shapes[][4] = {{1, 1, 16, 16}, {2, 4, 24, 40}, {2, 2, 64, 64}, {1, 2, 128, 128}, {2, 2, 256, 48}, {3, 3, 33, 17}};
    const int64_t Ts[] = {0, 1, 63, 64, 65, 130};
    const int64_t lens[] = {0, 1, 64, 65, 0, 1, 127};
    const char *co = getenv("GDN_TEST_CUDA_CHUNK_ONLY"), *bo = getenv("GDN_TEST_CUDA_BWD_ONLY");
    const int chunk_only = co && *co == '1';
    if (bo && *bo == '1') {   /* only the backward passes (for the sanitizers) */
        void test_cuda_layer_bwd(void);
        test_cuda_chunk_bwd(&r);
        test_cuda_layer_bwd();
        return;
    }
    for (size_t si = 0; si < (chunk_only ? 0 : sizeof shapes / sizeof *shapes); si++)
        for (int fi = 0; fi < 5; fi++) {
            const gdn_dtype dt = dts[(si + fi) % 3];
            fwd_case(0, 0, 2, Ts[(si + fi) % 6], shapes[si][0], shapes[si][1], shapes[si][2], shapes[si][3], NULL, 0, dt,
                     fsets[fi], fi != 2, rng_u64(&r));
            if (fi == 1) fwd_case(0, 0, 1, 0, shapes[si][0], shapes[si][1], shapes[si][2], shapes[si][3], lens, 7, dt,
                                  fsets[fi], 1, rng_u64(&r));
        }
    const int cshapes[][4] = {{1, 1, 16, 16}, {2, 4, 24, 40}, {2, 2, 64, 64}, {1, 2, 64, 128}, {1, 2, 128, 128}, {2, 2, 256, 48},
                              {3, 3, 33, 17}, {2, 4, 128, 128}, {1, 1, 256, 256}, {1, 2, 100, 72}, {1, 2, 128, 256}};
    chunk_bad_input();
    rng ra;   /* the CUDA backend's own bad input (its own seeds: the cases above keep theirs) */
    rng_seed(&ra, mix_seed(g_base_seed, 0xa119));
    if (!chunk_only) { void test_cuda_bad_input(rng *r); test_cuda_bad_input(&ra); }   /* tests/test_cuda_bad_input.c */
    if (!chunk_only) test_cuda_chunk_bwd(&r);
    /* GDN_TEST_CUDA_CHUNK_ONLY=1: only the chunk forward, on the first shapes
     * (racecheck, which is too slow for the whole group); the last two of
     * them take whole chunks by bulk copies */
    const size_t nshapes = chunk_only ? 5 : sizeof cshapes / sizeof *cshapes;
    /* chunk forward: every shape, flag set and dtype (f32 takes the recurrent
     * kernel), T across chunk borders, varlen with empty and 1-token sequences */
    const int64_t cTs[] = {0, 1, 63, 64, 65, 130, 200, 257};
    const int64_t clens[] = {0, 1, 64, 65, 0, 1, 127, 190};
    for (size_t si = 0; si < nshapes; si++)
        for (int fi = 0; fi < 5; fi++)
            for (int di = 0; di < 3; di++) {
                const int *sh = cshapes[si];
                if (di == 0 && fi > 1) continue;   /* f32 is the recurrent kernel, tested above */
                fwd_case(1, 0, 2, cTs[(si + fi + di) % 8], sh[0], sh[1], sh[2], sh[3], NULL, 0, dts[di], fsets[fi], fi != 2,
                         rng_u64(&r));
                if (fi == 1) fwd_case(1, 0, 1, 0, sh[0], sh[1], sh[2], sh[3], clens, 8, dts[di], fsets[fi], 1, rng_u64(&r));
            }
    /* sequences split across blocks (DESIGN §8): forced segment counts, with
     * and without h0, varlen, both state layouts */
    const int splits[] = {2, 3, 5};
    for (size_t si = 0; si < nshapes; si++)
        for (int k = 0; k < 3; k++) {
            const int *sh = cshapes[si];
            const unsigned f = fsets[(si + k) % 5];
            fwd_case(1, splits[k], 1, 300 + 97 * k, sh[0], sh[1], sh[2], sh[3], NULL, 0, dts[1 + (k & 1)], f, k != 1, rng_u64(&r));
            if (k == 0) fwd_case(1, 4, 1, 0, sh[0], sh[1], sh[2], sh[3], clens, 8, GDN_BF16, f, 1, rng_u64(&r));
        }
    /* many (sequence, value head) pairs: the scan over segments at 16 columns a block (fold.cuh's
     * fold_width: 512 blocks at 8 columns, over two an SM on a card of up to 255 SMs) */
    fwd_case(1, 2, 8, 300, 2, 4, 128, 128, NULL, 0, GDN_BF16, fsets[1], 1, rng_u64(&r));
    fwd_case(1, 0, 1, 0, 8, 16, 128, 128, lens_lpt, 12, GDN_BF16, fsets[1], 1, rng_u64(&r));   /* longest first */
    /* few rows take the warp-per-columns kernel, many rows (here 300 x 8 heads x 2
     * column groups) the 4-warp one, K = 256 always the 4-warp one */
    const int dshapes[][5] = {{1, 16, 32, 128, 128}, {5, 2, 4, 24, 40}, {7, 1, 3, 64, 64}, {33, 2, 2, 256, 17},
                              {300, 2, 8, 128, 64}};
    for (size_t si = 0; si < (chunk_only ? 0 : sizeof dshapes / sizeof *dshapes); si++)
        for (int di = 0; di < 3; di++)
            for (int v = 0; v < 4; v++) {
                const unsigned f = (v & 1 ? GDN_QK_L2NORM : 0) | (v & 2 ? GDN_STATE_V_FIRST : 0) | (v == 3 ? GDN_BETA_NEGATIVE : 0);
                decode_case(dshapes[si][0], dshapes[si][1], dshapes[si][2], dshapes[si][3], dshapes[si][4], dts[di], f,
                            v >= 1, rng_u64(&r));
            }
    { void test_cuda_layer(void); test_cuda_layer(); }   /* the layer ops (tests/test_cuda_layer.c) */
    if (!chunk_only) chunk_split_narrow_v(&ra);   /* last: see there */
}
#endif
