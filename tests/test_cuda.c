/* The CUDA backend on the device: the chunk and recurrent forward against
 * the float64 reference (o, ht and the saved rstd; chunk sequences also split
 * across blocks), the decode step against the CPU backend, itself checked
 * against the reference by the other groups; the layer ops in
 * test_cuda_layer.c. Fresh random inputs, poisoned outputs. Skipped, and said
 * so, where no device is visible. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    double *o_ref = t_alloc(8 * nv), *ht_ref = t_alloc(8 * ns);
    gdn_ref_inputs in = {qd, kd, vd, gd, bd, A_logd, dt_biasd, with_h0 ? h0d : NULL};
    gdn_ref_fwd(&c, &in, o_ref, ht_ref);
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
        check_close(ctx, "o", dt, o, o_ref, nv, bound_fwd(dt));
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
    free(h0); free(h0d); free(o_ref); free(ht_ref); free(o); free(ht);
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
    const char *co = getenv("GDN_TEST_CUDA_CHUNK_ONLY");
    const int chunk_only = co && *co == '1';
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
}
#endif
