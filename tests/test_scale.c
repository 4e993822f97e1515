/* gdn_test_scale: the chunk path past 2^31 elements and at a million tokens.
 * Not part of gdn_tests (it needs ~15 GB of memory and minutes); run it by
 * hand or on the device:
 *
 *   gdn_test_scale [--backend cpu|cuda] [--case big|long|all] [--T N]
 *
 * big:  one sequence whose v/o/dv tensors hold more than 2^31 elements
 *       (CPU: T = 2^20+256, H 1, HV 8, K 16, V 256; CUDA: the qwen3next heads
 *       H 16, HV 32, K = V = 128, T = 524544, ~63 GiB of device memory with
 *       the backward's workspace), bf16, in-kernel L2 norm. The
 *       forward and backward in one call equal the same call run in 4 pieces
 *       (each under 2^31 elements, states handed on: ht -> h0 forward,
 *       dh0 -> dht backward): bitwise on the CPU with seq_split = 1, within
 *       the DESIGN.md §5 bounds on the device. A wrapped 32-bit index shows as
 *       a mismatch in the last pieces.
 * long: T = 2^20 in one sequence with no decay (g = 0) and with hard decay
 *       (g = -20), h0 given: every output and gradient finite, the sequence cut into
 *       segments (seq_split 0) equal to uncut (seq_split 1) within §5.
 * Every output is filled with NaN before its call. Ends with "N passed, M
 * failed"; exit status 1 if any check failed. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "gdn.h"
#ifdef GDN_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

static long passed, failed;
static int on_cuda;

static int check(int ok, const char *what, const char *fmt, double x) {
    if (ok) passed++; else failed++;
    printf("%s %s: ", ok ? "ok  " : "FAIL", what);
    printf(fmt, x);
    printf("\n");
    fflush(stdout);
    return ok;
}

static double now_s(void) {
    struct timespec t;
    timespec_get(&t, TIME_UTC);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) { fprintf(stderr, "gdn_test_scale: out of host memory (%zu bytes)\n", n); exit(2); }
    return p;
}

/* ---- memory where the backend runs ---- */
static void *dev_alloc(size_t n) {
#ifdef GDN_HAVE_CUDA
    if (on_cuda) {
        void *d = NULL;
        if (cudaMalloc(&d, n ? n : 4) != cudaSuccess) { fprintf(stderr, "cudaMalloc(%zu) failed\n", n); exit(2); }
        return d;
    }
#endif
    return xmalloc(n);
}
static void dev_free(void *p) {
#ifdef GDN_HAVE_CUDA
    if (on_cuda) { cudaFree(p); return; }
#endif
    free(p);
}
static void to_dev(void *d, const void *h, size_t n) {
#ifdef GDN_HAVE_CUDA
    if (on_cuda) { cudaMemcpy(d, h, n, cudaMemcpyHostToDevice); return; }
#endif
    memcpy(d, h, n);
}
static void to_host(void *h, const void *d, size_t n) {
#ifdef GDN_HAVE_CUDA
    if (on_cuda) { cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost); return; }
#endif
    memcpy(h, d, n);
}
static void dev_copy(void *d, const void *s, size_t n) {
#ifdef GDN_HAVE_CUDA
    if (on_cuda) { cudaMemcpy(d, s, n, cudaMemcpyDeviceToDevice); return; }
#endif
    memcpy(d, s, n);
}
static void sync_dev(void) {   /* for timings: the backend's work done */
#ifdef GDN_HAVE_CUDA
    if (on_cuda) cudaDeviceSynchronize();
#endif
}

/* ---- inputs: counter-based, so any element is made on any thread ---- */
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double uniform_at(uint64_t key, uint64_t i) {   /* (0, 1) */
    return ((mix64(key + i * 0x9e3779b97f4a7c15ull) >> 11) + 0.5) * 0x1.0p-53;
}
static float normal_at(uint64_t key, uint64_t i) {
    const double u1 = uniform_at(key, 2 * i), u2 = uniform_at(key, 2 * i + 1);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}
static uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
enum { NORMAL, UNIFORM, CONST };
/* n elements of dtype t at device pointer d: scale*N(0,1), scale*U(0,1) or the constant scale */
static void fill(gdn_dtype t, void *d, size_t n, int kind, double scale, uint64_t key) {
    const size_t block = (size_t)1 << 24, es = t == GDN_F32 ? 4 : 2;
    void *h = xmalloc(block * es);
    for (size_t b0 = 0; b0 < n; b0 += block) {
        const size_t m = n - b0 < block ? n - b0 : block;
        #pragma omp parallel for schedule(static)
        for (size_t i = 0; i < m; i++) {
            const float x = (float)(kind == NORMAL ? scale * normal_at(key, b0 + i)
                                    : kind == UNIFORM ? scale * uniform_at(key, b0 + i) : scale);
            if (t == GDN_F32) ((float *)h)[i] = x;
            else ((uint16_t *)h)[i] = f32_to_bf16(x);
        }
        to_dev((char *)d + b0 * es, h, m * es);
    }
    free(h);
}

/* ---- comparisons (on the host, a block at a time) ---- */
static double get(gdn_dtype t, const void *p, size_t i) {
    return t == GDN_F32 ? ((const float *)p)[i] : bf16_to_f32(((const uint16_t *)p)[i]);
}
/* a (device) and b (device) of n elements: 1 if bitwise equal; *rel = ||a-b||/||b||; *finite */
static int compare(gdn_dtype t, const void *a, const void *b, size_t n, double *rel, int *finite) {
    const size_t block = (size_t)1 << 24, es = t == GDN_F32 ? 4 : 2;
    char *ha = xmalloc(block * es), *hb = xmalloc(block * es);
    int same = 1;
    double num = 0, den = 0;
    long bad = 0;
    for (size_t b0 = 0; b0 < n; b0 += block) {
        const size_t m = n - b0 < block ? n - b0 : block;
        to_host(ha, (const char *)a + b0 * es, m * es);
        to_host(hb, (const char *)b + b0 * es, m * es);
        if (memcmp(ha, hb, m * es)) same = 0;
        #pragma omp parallel for reduction(+ : num, den, bad)
        for (size_t i = 0; i < m; i++) {
            const double x = get(t, ha, i), y = get(t, hb, i);
            if (!isfinite(x) || !isfinite(y)) { bad++; continue; }
            num += (x - y) * (x - y);
            den += y * y;
        }
    }
    free(ha); free(hb);
    *rel = den > 0 ? sqrt(num / den) : sqrt(num);
    *finite = bad == 0;
    return same;
}
static int all_finite(gdn_dtype t, const void *a, size_t n) {
    double rel;
    int fin;
    compare(t, a, a, n, &rel, &fin);
    return fin;
}

static void must(gdn_status s, const char *what) {
    if (s != GDN_OK) {
        fprintf(stderr, "gdn_test_scale: %s: %s: %s\n", what, gdn_status_string(s), gdn_last_error());
        exit(1);
    }
}

/* a call's buffers, on the backend's side */
typedef struct bufs {
    void *q, *k, *v, *g, *beta, *o, *dout, *dq, *dk, *dv, *dg, *dbeta;
    float *h0, *ht, *dht, *dh0;
    void *saved, *ws;
    size_t saved_bytes, ws_bytes;
} bufs;

static void run_fwd(const gdn_exec *ex, const gdn_config *c, const bufs *b) {
    gdn_fwd_args a = {.q = b->q, .k = b->k, .v = b->v, .g = b->g, .beta = b->beta, .h0 = b->h0, .o = b->o,
                      .ht = b->ht, .saved = b->saved, .saved_bytes = b->saved_bytes,
                      .workspace = b->ws, .workspace_bytes = b->ws_bytes};
    must(gdn_chunk_fwd(ex, c, &a), "gdn_chunk_fwd");
}
static void run_bwd(const gdn_exec *ex, const gdn_config *c, const bufs *b) {
    gdn_bwd_args a = {.q = b->q, .k = b->k, .v = b->v, .g = b->g, .beta = b->beta, .h0 = b->h0,
                      .saved = b->saved, .saved_bytes = b->saved_bytes, .dout = b->dout, .dht = b->dht,
                      .dq = b->dq, .dk = b->dk, .dv = b->dv, .dg = b->dg, .dbeta = b->dbeta, .dh0 = b->dh0,
                      .workspace = b->ws, .workspace_bytes = b->ws_bytes};
    must(gdn_chunk_bwd(ex, c, &a), "gdn_chunk_bwd");
}
static void *offset(const void *p, size_t elems, size_t es) { return (char *)p + elems * es; }

/* ---- big: one call = the same call in pieces ---- */
static void case_big(gdn_backend be, int64_t T) {
    const int cpu = be == GDN_BACKEND_CPU;
    const int H = cpu ? 1 : 16, HV = cpu ? 8 : 32, K = cpu ? 16 : 128, V = cpu ? 256 : 128, NP = 4;
    if (T <= 0) T = cpu ? ((int64_t)1 << 20) + 256 : 524544;   /* CUDA: ~63 GiB with the backward's workspace */
    T = (T + 64 * NP - 1) / (64 * NP) * (64 * NP);           /* pieces start on a chunk boundary */
    const int64_t TP = T / NP;
    const gdn_dtype dt = GDN_BF16;
    const size_t es = 2, nq = (size_t)T * H * K, nv = (size_t)T * HV * V, ng = (size_t)T * HV,
                 ns = (size_t)HV * K * V;
    printf("big: backend %s, T %lld (%d pieces of %lld), H %d HV %d K %d V %d, bf16, L2 norm: "
           "v, o, dv hold %zu elements (2^31 = %lld)\n", cpu ? "cpu" : "cuda", (long long)T, NP, (long long)TP,
           H, HV, K, V, nv, 1LL << 31);
    fflush(stdout);
    gdn_exec ex = {be, NULL, 0, cpu ? 1 : 0};                 /* CPU: seq_split 1, so the bits can agree */
    gdn_config c = {.B = 1, .T = T, .H = H, .HV = HV, .K = K, .V = V, .dtype = dt, .gate_dtype = GDN_F32,
                    .flags = GDN_QK_L2NORM};
    gdn_config cp = c;
    cp.T = TP;
    double t0 = now_s();
    bufs w = {0}, p = {0};
    w.q = dev_alloc(nq * es); w.k = dev_alloc(nq * es); w.v = dev_alloc(nv * es);
    w.g = dev_alloc(ng * 4); w.beta = dev_alloc(ng * 4);
    w.h0 = dev_alloc(ns * 4); w.ht = dev_alloc(ns * 4);
    fill(dt, w.q, nq, NORMAL, 1, 1); fill(dt, w.k, nq, NORMAL, 1, 2); fill(dt, w.v, nv, NORMAL, 1, 3);
    fill(GDN_F32, w.g, ng, UNIFORM, -0.05, 4); fill(GDN_F32, w.beta, ng, UNIFORM, 1, 5);
    fill(GDN_F32, w.h0, ns, NORMAL, 0.3, 6);
    w.saved_bytes = gdn_chunk_saved_size(&c); w.saved = dev_alloc(w.saved_bytes);
    size_t wf = gdn_chunk_fwd_workspace_size(&ex, &c), wb = gdn_chunk_bwd_workspace_size(&ex, &c);
    w.ws_bytes = wf > wb ? wf : wb; w.ws = dev_alloc(w.ws_bytes);
    w.o = dev_alloc(nv * es);
    fill(dt, w.o, nv, CONST, NAN, 0); fill(GDN_F32, w.ht, ns, CONST, NAN, 0);   /* outputs poisoned */
    printf("  inputs made (%.1f s)\n", now_s() - t0);
    t0 = now_s();
    run_fwd(&ex, &c, &w);
    sync_dev();
    printf("  forward, one call (%.1f s)\n", now_s() - t0);

    /* forward in pieces: o into one piece buffer, compared with the slice of the whole */
    const size_t pq = (size_t)TP * H * K, pv = (size_t)TP * HV * V, pg = (size_t)TP * HV;
    p.o = dev_alloc(pv * es);
    p.saved_bytes = gdn_chunk_saved_size(&cp); p.saved = dev_alloc(p.saved_bytes);
    wf = gdn_chunk_fwd_workspace_size(&ex, &cp); wb = gdn_chunk_bwd_workspace_size(&ex, &cp);
    if ((wf > wb ? wf : wb) > w.ws_bytes) { fprintf(stderr, "gdn_test_scale: a piece needs more workspace than the whole call\n"); exit(2); }
    p.ws_bytes = w.ws_bytes; p.ws = w.ws;   /* the pieces run after the whole call: its workspace serves them */
    float *states = dev_alloc((size_t)(NP + 1) * ns * 4);     /* the state entering each piece, and the last ht */
    dev_copy(states, w.h0, ns * 4);
    int same = 1, fin = 1;
    double worst = 0;
    t0 = now_s();
    for (int i = 0; i < NP; i++) {
        p.q = offset(w.q, i * pq, es); p.k = offset(w.k, i * pq, es); p.v = offset(w.v, i * pv, es);
        p.g = offset(w.g, i * pg, 4); p.beta = offset(w.beta, i * pg, 4);
        p.h0 = states + (size_t)i * ns; p.ht = states + (size_t)(i + 1) * ns;
        fill(dt, p.o, pv, CONST, NAN, 0); fill(GDN_F32, p.ht, ns, CONST, NAN, 0);
        run_fwd(&ex, &cp, &p);
        double rel;
        int f;
        same &= compare(dt, p.o, offset(w.o, i * pv, es), pv, &rel, &f);
        fin &= f;
        if (rel > worst) worst = rel;
    }
    double rel_ht;
    int f_ht;
    const int same_ht = compare(GDN_F32, states + (size_t)NP * ns, w.ht, ns, &rel_ht, &f_ht);
    printf("  forward, %d pieces (%.1f s)\n", NP, now_s() - t0);
    check(fin && f_ht, "big forward: o and ht finite", "%g", 0.0);
    if (cpu) {
        check(same, "big forward: o of one call bitwise = o of 4 pieces", "max piece rel diff %.3e", worst);
        check(same_ht, "big forward: ht of one call bitwise = ht after 4 pieces", "rel diff %.3e", rel_ht);
    } else {
        check(worst <= 5e-3, "big forward: o of one call = o of 4 pieces (bf16 bound 5e-3)", "max piece rel diff %.3e", worst);
        check(rel_ht <= 1e-3, "big forward: ht of one call = ht after 4 pieces", "rel diff %.3e", rel_ht);
    }
    dev_free(w.o); w.o = NULL;

    /* backward: one call, then the pieces last to first (each re-runs its forward for its saved rstd) */
    w.dout = dev_alloc(nv * es); w.dht = dev_alloc(ns * 4);
    fill(dt, w.dout, nv, NORMAL, 1, 7); fill(GDN_F32, w.dht, ns, NORMAL, 0.3, 8);
    w.dq = dev_alloc(nq * es); w.dk = dev_alloc(nq * es); w.dv = dev_alloc(nv * es);
    w.dg = dev_alloc(ng * 4); w.dbeta = dev_alloc(ng * 4); w.dh0 = dev_alloc(ns * 4);
    fill(dt, w.dq, nq, CONST, NAN, 0); fill(dt, w.dk, nq, CONST, NAN, 0); fill(dt, w.dv, nv, CONST, NAN, 0);
    fill(GDN_F32, w.dg, ng, CONST, NAN, 0); fill(GDN_F32, w.dbeta, ng, CONST, NAN, 0);
    fill(GDN_F32, w.dh0, ns, CONST, NAN, 0);
    t0 = now_s();
    run_bwd(&ex, &c, &w);
    sync_dev();
    printf("  backward, one call (%.1f s)\n", now_s() - t0);
    p.dq = dev_alloc(pq * es); p.dk = dev_alloc(pq * es); p.dv = dev_alloc(pv * es);
    p.dg = dev_alloc(pg * 4); p.dbeta = dev_alloc(pg * 4);
    float *dstate = dev_alloc(2 * ns * 4), *dcur = dstate, *dnext = dstate + ns;   /* dht in, dh0 out, swapped */
    dev_copy(dcur, w.dht, ns * 4);
    double worst_g[5] = {0};
    int same_g = 1;
    fin = 1;
    t0 = now_s();
    for (int i = NP - 1; i >= 0; i--) {
        p.q = offset(w.q, i * pq, es); p.k = offset(w.k, i * pq, es); p.v = offset(w.v, i * pv, es);
        p.g = offset(w.g, i * pg, 4); p.beta = offset(w.beta, i * pg, 4);
        p.h0 = states + (size_t)i * ns; p.ht = NULL;
        run_fwd(&ex, &cp, &p);
        p.dout = offset(w.dout, i * pv, es);
        p.dht = dcur;
        p.dh0 = dnext;
        fill(dt, p.dq, pq, CONST, NAN, 0); fill(dt, p.dk, pq, CONST, NAN, 0); fill(dt, p.dv, pv, CONST, NAN, 0);
        fill(GDN_F32, p.dg, pg, CONST, NAN, 0); fill(GDN_F32, p.dbeta, pg, CONST, NAN, 0);
        fill(GDN_F32, p.dh0, ns, CONST, NAN, 0);
        run_bwd(&ex, &cp, &p);
        float *t = dcur; dcur = dnext; dnext = t;
        const void *mine[5] = {p.dq, p.dk, p.dv, p.dg, p.dbeta};
        const void *whole[5] = {offset(w.dq, i * pq, es), offset(w.dk, i * pq, es), offset(w.dv, i * pv, es),
                                offset(w.dg, i * pg, 4), offset(w.dbeta, i * pg, 4)};
        const size_t n[5] = {pq, pq, pv, pg, pg};
        for (int x = 0; x < 5; x++) {
            double rel;
            int f;
            same_g &= compare(x < 3 ? dt : GDN_F32, mine[x], whole[x], n[x], &rel, &f);
            fin &= f;
            if (rel > worst_g[x]) worst_g[x] = rel;
        }
    }
    double rel_h0;
    int f_h0;
    const int same_h0 = compare(GDN_F32, dcur, w.dh0, ns, &rel_h0, &f_h0);
    printf("  backward, %d pieces (%.1f s); max rel diff dq %.2e dk %.2e dv %.2e dg %.2e dbeta %.2e dh0 %.2e\n", NP,
           now_s() - t0, worst_g[0], worst_g[1], worst_g[2], worst_g[3], worst_g[4], rel_h0);
    check(fin && f_h0, "big backward: every gradient finite", "%g", 0.0);
    if (cpu) {
        check(same_g, "big backward: dq dk dv dg dbeta of one call bitwise = 4 pieces", "max rel diff dv %.3e", worst_g[2]);
        check(same_h0, "big backward: dh0 of one call bitwise = after 4 pieces", "rel diff %.3e", rel_h0);
    } else {
        double m = 0;
        for (int x = 0; x < 5; x++) if (worst_g[x] > m) m = worst_g[x];
        check(m <= 1e-2, "big backward: gradients of one call = 4 pieces (bf16 bound 1e-2)", "max rel diff %.3e", m);
        check(rel_h0 <= 1e-2, "big backward: dh0 of one call = after 4 pieces", "rel diff %.3e", rel_h0);
    }
    void *all[] = {w.q, w.k, w.v, w.g, w.beta, w.h0, w.ht, w.saved, w.ws, w.dout, w.dht, w.dq, w.dk, w.dv, w.dg,
                   w.dbeta, w.dh0, p.o, p.saved, p.dq, p.dk, p.dv, p.dg, p.dbeta, states, dstate};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) dev_free(all[i]);
}

/* ---- long: a million tokens, no decay and hard decay ---- */
static void case_long(gdn_backend be, int64_t T, float g_value) {
    const int H = 1, HV = 2, K = 64, V = 64;
    if (T <= 0) T = (int64_t)1 << 20;
    const gdn_dtype dt = GDN_F32;
    const size_t nq = (size_t)T * H * K, nv = (size_t)T * HV * V, ng = (size_t)T * HV, ns = (size_t)HV * K * V;
    char what[160];
    printf("long: backend %s, T %lld, H %d HV %d K %d V %d, f32, L2 norm, g = %g\n", be == GDN_BACKEND_CPU ? "cpu" : "cuda",
           (long long)T, H, HV, K, V, (double)g_value);
    gdn_config c = {.B = 1, .T = T, .H = H, .HV = HV, .K = K, .V = V, .dtype = dt, .gate_dtype = GDN_F32,
                    .flags = GDN_QK_L2NORM};
    bufs w[2] = {{0}};
    for (int s = 0; s < 2; s++) {          /* s = 0: seq_split 0 (automatic: cut); s = 1: seq_split 1 (uncut) */
        bufs *b = &w[s];
        gdn_exec ex = {be, NULL, 0, s};
        if (s == 0) {
            b->q = dev_alloc(nq * 4); b->k = dev_alloc(nq * 4); b->v = dev_alloc(nv * 4);
            b->g = dev_alloc(ng * 4); b->beta = dev_alloc(ng * 4); b->dout = dev_alloc(nv * 4); b->dht = dev_alloc(ns * 4);
            b->h0 = dev_alloc(ns * 4);
            fill(GDN_F32, b->h0, ns, NORMAL, 0.3, 14);
            fill(dt, b->q, nq, NORMAL, 1, 11); fill(dt, b->k, nq, NORMAL, 1, 12); fill(dt, b->v, nv, NORMAL, 1, 13);
            fill(GDN_F32, b->g, ng, CONST, g_value, 0); fill(GDN_F32, b->beta, ng, UNIFORM, 1, 15);
            fill(dt, b->dout, nv, NORMAL, 1, 16); fill(GDN_F32, b->dht, ns, NORMAL, 1, 17);
        } else {
            b->q = w[0].q; b->k = w[0].k; b->v = w[0].v; b->g = w[0].g; b->beta = w[0].beta;
            b->dout = w[0].dout; b->dht = w[0].dht; b->h0 = w[0].h0;
        }
        b->o = dev_alloc(nv * 4); b->ht = dev_alloc(ns * 4);
        b->saved_bytes = gdn_chunk_saved_size(&c); b->saved = dev_alloc(b->saved_bytes);
        const size_t wf = gdn_chunk_fwd_workspace_size(&ex, &c), wb = gdn_chunk_bwd_workspace_size(&ex, &c);
        b->ws_bytes = wf > wb ? wf : wb; b->ws = dev_alloc(b->ws_bytes);
        b->dq = dev_alloc(nq * 4); b->dk = dev_alloc(nq * 4); b->dv = dev_alloc(nv * 4);
        b->dg = dev_alloc(ng * 4); b->dbeta = dev_alloc(ng * 4); b->dh0 = dev_alloc(ns * 4);
        void *outs[] = {b->o, b->ht, b->dq, b->dk, b->dv, b->dg, b->dbeta, b->dh0};
        const size_t nout[] = {nv, ns, nq, nq, nv, ng, ng, ns};
        for (int x = 0; x < 8; x++) fill(GDN_F32, outs[x], nout[x], CONST, NAN, 0);   /* outputs poisoned */
        const double t0 = now_s();
        run_fwd(&ex, &c, b);
        run_bwd(&ex, &c, b);
        sync_dev();
        printf("  seq_split %d: forward + backward %.1f s\n", s, now_s() - t0);
    }
    const void *x0[] = {w[0].o, w[0].ht, w[0].dq, w[0].dk, w[0].dv, w[0].dg, w[0].dbeta, w[0].dh0};
    const void *x1[] = {w[1].o, w[1].ht, w[1].dq, w[1].dk, w[1].dv, w[1].dg, w[1].dbeta, w[1].dh0};
    const char *name[] = {"o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dh0"};
    const size_t n[] = {nv, ns, nq, nq, nv, ng, ng, ns};
    for (int x = 0; x < 8; x++) {
        double rel;
        int f0 = all_finite(GDN_F32, x0[x], n[x]), f;
        compare(GDN_F32, x0[x], x1[x], n[x], &rel, &f);
        const double bound = x < 2 ? 1e-5 : 1e-4;
        snprintf(what, sizeof what, "long g=%g %s: finite, cut = uncut (bound %.0e)", (double)g_value, name[x], bound);
        check(f0 && f && rel <= bound, what, "rel diff %.3e", rel);
    }
    for (int s = 0; s < 2; s++) {
        bufs *b = &w[s];
        if (s == 0) { dev_free(b->q); dev_free(b->k); dev_free(b->v); dev_free(b->g); dev_free(b->beta); dev_free(b->dout); dev_free(b->dht); dev_free(b->h0); }
        void *own[] = {b->o, b->ht, b->saved, b->ws, b->dq, b->dk, b->dv, b->dg, b->dbeta, b->dh0};
        for (size_t i = 0; i < sizeof own / sizeof *own; i++) dev_free(own[i]);
    }
}

int main(int argc, char **argv) {
    gdn_backend be = GDN_BACKEND_CPU;
    const char *which = "all";
    int64_t T = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--backend") && i + 1 < argc) {
            const char *b = argv[++i];
            if (!strcmp(b, "cuda")) be = GDN_BACKEND_CUDA;
            else if (strcmp(b, "cpu")) { fprintf(stderr, "--backend: cpu or cuda, not '%s'\n", b); return 2; }
        } else if (!strcmp(argv[i], "--case") && i + 1 < argc) {
            which = argv[++i];
            if (strcmp(which, "big") && strcmp(which, "long") && strcmp(which, "all")) {
                fprintf(stderr, "--case: big, long or all, not '%s'\n", which);
                return 2;
            }
        } else if (!strcmp(argv[i], "--T") && i + 1 < argc) {
            T = strtoll(argv[++i], NULL, 10);
            if (T < 256) { fprintf(stderr, "--T: at least 256\n"); return 2; }
        } else {
            fprintf(stderr, "usage: %s [--backend cpu|cuda] [--case big|long|all] [--T N]\n", argv[0]);
            return 2;
        }
    }
    if (!gdn_backend_available(be)) {
        printf("gdn_test_scale: backend %s not available here: skipped\n", be == GDN_BACKEND_CUDA ? "cuda" : "cpu");
        return 0;
    }
    on_cuda = be == GDN_BACKEND_CUDA;
    if (!strcmp(which, "big") || !strcmp(which, "all")) case_big(be, T);
    if (!strcmp(which, "long") || !strcmp(which, "all")) {
        case_long(be, T, 0.f);
        case_long(be, T, -20.f);
    }
    printf("%ld passed, %ld failed\n", passed, failed);
    return failed ? 1 : 0;
}
