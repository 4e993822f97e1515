/* GPU bench (first part): the fused decode step on the device against the
 * card's copy bandwidth measured in the same run (cudaMemcpy device to
 * device, bytes read + written), CUDA events, median after warm-up, the
 * state pools rotated so L2 (50 MiB) does not flatter. B = 1 is also timed
 * as a CUDA graph replay, the way a serving engine runs it. The chunk rows
 * give forward, then backward alone (after a forward that saved for it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include "gdn.h"
#include "../tools/flops.h"

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

static int cmp_f(const void *a, const void *b) { const float x = *(const float *)a, y = *(const float *)b; return x < y ? -1 : x > y; }

int main(void) {
    if (!gdn_backend_available(GDN_BACKEND_CUDA)) { printf("no CUDA device\n"); return 0; }
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    /* copy bandwidth */
    const size_t cb = (size_t)2 << 30;
    void *ca, *cbuf;
    CK(cudaMalloc(&ca, cb)); CK(cudaMalloc(&cbuf, cb));
    CK(cudaMemsetAsync(ca, 1, cb, st));
    float best = 1e30f;
    for (int r = 0; r < 10; r++) {
        CK(cudaEventRecord(e0, st));
        CK(cudaMemcpyAsync(cbuf, ca, cb, cudaMemcpyDeviceToDevice, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
        if (ms < best) best = ms;
    }
    const double copy = 2.0 * cb / (best * 1e-3) * 1e-9;
    CK(cudaFree(ca)); CK(cudaFree(cbuf));
    printf("copy bandwidth (D2D memcpy 2 GiB, read+write)   %8.1f GB/s\n\n", copy);
    printf("%-40s %10s %9s %8s\n", "op", "time us", "GB/s", "% copy");

    /* chunk forward at the DESIGN §7 shapes */
    {
        static const int64_t vl_lens[8] = {1000, 7000, 2500, 6000, 3100, 4900, 5200, 3068};   /* 32768 tokens */
        struct { const char *name; int64_t B, T; int H, HV, K; gdn_dtype dt; unsigned flags; int varlen; } cs[] = {
            {"qwen3next", 4, 8192, 16, 32, 128, GDN_BF16, GDN_QK_L2NORM | GDN_GATE_FUSED | GDN_BETA_SIGMOID, 0},
            {"long1", 1, 65536, 2, 8, 128, GDN_BF16, GDN_QK_L2NORM | GDN_GATE_FUSED | GDN_BETA_SIGMOID, 0},
            {"tp8_4k", 8, 4096, 2, 4, 128, GDN_BF16, GDN_QK_L2NORM | GDN_GATE_FUSED | GDN_BETA_SIGMOID, 0},
            {"varlen", 1, 32768, 16, 32, 128, GDN_BF16, GDN_QK_L2NORM | GDN_GATE_FUSED | GDN_BETA_SIGMOID, 1},
            {"d256", 16, 4096, 8, 8, 256, GDN_F16, 0, 0}};
        printf("%-40s %10s %9s %9s\n", "chunk forward", "time us", "TFLOP/s", "GB/s");
        for (size_t ci = 0; ci < sizeof cs / sizeof *cs; ci++) {
            gdn_config c = {.B = cs[ci].B, .T = cs[ci].T, .H = cs[ci].H, .HV = cs[ci].HV, .K = cs[ci].K, .V = cs[ci].K,
                            .dtype = cs[ci].dt, .gate_dtype = GDN_F32, .flags = cs[ci].flags};
            int64_t cu[9] = {0}, *dcu = NULL;
            if (cs[ci].varlen) {
                for (int i = 0; i < 8; i++) cu[i + 1] = cu[i] + vl_lens[i];
                CK(cudaMalloc((void **)&dcu, sizeof cu));
                CK(cudaMemcpy(dcu, cu, sizeof cu, cudaMemcpyHostToDevice));
                c.cu_seqlens = cu; c.cu_seqlens_dev = dcu; c.num_seqs = 8;
            }
            const int64_t N = cs[ci].varlen ? 8 : c.B, rows = c.B * c.T;
            const size_t nq = (size_t)rows * c.H * c.K * 2, nv = (size_t)rows * c.HV * c.V * 2, ng = (size_t)rows * c.HV * 4,
                         ns = (size_t)N * c.HV * c.K * c.V * 4;
            gdn_exec ex = {GDN_BACKEND_CUDA, st, 0, 0};
            const size_t sv = gdn_chunk_saved_size(&c), nws = gdn_chunk_fwd_workspace_size(&ex, &c);
            void *q, *k, *v, *g, *b, *o, *h0, *ht, *A_log, *dtb, *saved, *ws;
            CK(cudaMalloc(&q, nq)); CK(cudaMalloc(&k, nq)); CK(cudaMalloc(&v, nv)); CK(cudaMalloc(&o, nv));
            CK(cudaMalloc(&g, ng)); CK(cudaMalloc(&b, ng)); CK(cudaMalloc(&h0, ns)); CK(cudaMalloc(&ht, ns));
            CK(cudaMalloc(&A_log, 4 * c.HV)); CK(cudaMalloc(&dtb, 4 * c.HV)); CK(cudaMalloc(&saved, sv + 4)); CK(cudaMalloc(&ws, nws + 4));
            CK(cudaMemsetAsync(q, 0x3c, nq, st)); CK(cudaMemsetAsync(k, 0x3b, nq, st)); CK(cudaMemsetAsync(v, 0x3c, nv, st));
            CK(cudaMemsetAsync(g, 0, ng, st)); CK(cudaMemsetAsync(b, 0, ng, st)); CK(cudaMemsetAsync(h0, 0, ns, st));
            CK(cudaMemsetAsync(A_log, 0, 4 * c.HV, st)); CK(cudaMemsetAsync(dtb, 0, 4 * c.HV, st));
            gdn_fwd_args a = {.q = q, .k = k, .v = v, .g = g, .beta = b, .A_log = A_log, .dt_bias = dtb, .h0 = h0, .o = o,
                              .ht = ht, .saved = saved, .saved_bytes = sv, .workspace = ws, .workspace_bytes = nws};
            enum { CREPS = 20 };
            float t[CREPS];
            int ok = 1;
            for (int r = -3; r < CREPS && ok; r++) {
                CK(cudaEventRecord(e0, st));
                if (gdn_chunk_fwd(&ex, &c, &a) != GDN_OK) { printf("%-40s %s\n", cs[ci].name, gdn_last_error()); ok = 0; }
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                if (r >= 0) CK(cudaEventElapsedTime(&t[r], e0, e1));
            }
            if (ok) {
                qsort(t, CREPS, sizeof *t, cmp_f);
                const double us = t[CREPS / 2] * 1e3;
                printf("%-40s %10.1f %9.1f %9.1f\n", cs[ci].name, us, gdn_flops_chunk_fwd(&c) / (us * 1e-6) * 1e-12,
                       gdn_bytes_chunk_fwd(&c, 1, 1) / (us * 1e-6) * 1e-9);
            }
            if (ok) {   /* backward after the forward that saved for it (the forward is not in the time) */
                const size_t nbws = gdn_chunk_bwd_workspace_size(&ex, &c);
                void *dout, *dq, *dk, *dv, *dg, *db, *dh0, *dht, *dAl, *ddt, *bws;
                CK(cudaMalloc(&dout, nv)); CK(cudaMalloc(&dq, nq)); CK(cudaMalloc(&dk, nq)); CK(cudaMalloc(&dv, nv));
                CK(cudaMalloc(&dg, ng)); CK(cudaMalloc(&db, ng)); CK(cudaMalloc(&dh0, ns)); CK(cudaMalloc(&dht, ns));
                CK(cudaMalloc(&dAl, 4 * c.HV)); CK(cudaMalloc(&ddt, 4 * c.HV)); CK(cudaMalloc(&bws, nbws + 4));
                CK(cudaMemsetAsync(dout, 0x3c, nv, st)); CK(cudaMemsetAsync(dht, 0, ns, st));
                gdn_bwd_args ba = {.q = q, .k = k, .v = v, .g = g, .beta = b, .A_log = A_log, .dt_bias = dtb, .h0 = h0,
                                   .saved = saved, .saved_bytes = sv, .dout = dout, .dht = dht, .dq = dq, .dk = dk, .dv = dv,
                                   .dg = dg, .dbeta = db, .dA_log = dAl, .ddt_bias = ddt, .dh0 = dh0, .workspace = bws,
                                   .workspace_bytes = nbws};
                enum { BREPS = 5 };
                float tb[BREPS];
                for (int r = -1; r < BREPS && ok; r++) {
                    CK(cudaEventRecord(e0, st));
                    if (gdn_chunk_bwd(&ex, &c, &ba) != GDN_OK) { printf("%-40s %s\n", cs[ci].name, gdn_last_error()); ok = 0; }
                    CK(cudaEventRecord(e1, st));
                    CK(cudaEventSynchronize(e1));
                    if (r >= 0) CK(cudaEventElapsedTime(&tb[r], e0, e1));
                }
                if (ok) {
                    qsort(tb, BREPS, sizeof *tb, cmp_f);
                    const double us = tb[BREPS / 2] * 1e3;
                    char nm[64];
                    snprintf(nm, sizeof nm, "%s backward (ws %.2f GiB)", cs[ci].name, nbws / 1073741824.0);
                    printf("%-40s %10.1f %9.1f %9.1f\n", nm, us, gdn_flops_chunk_bwd(&c) / (us * 1e-6) * 1e-12,
                           gdn_bytes_chunk_bwd(&c, 1, 1, 1) / (us * 1e-6) * 1e-9);
                }
                void *fb[] = {dout, dq, dk, dv, dg, db, dh0, dht, dAl, ddt, bws};
                for (size_t i = 0; i < sizeof fb / sizeof *fb; i++) CK(cudaFree(fb[i]));
            }
            void *fr[] = {q, k, v, o, g, b, h0, ht, A_log, dtb, saved, ws, dcu};
            for (size_t i = 0; i < sizeof fr / sizeof *fr; i++) CK(cudaFree(fr[i]));
        }
        printf("\n");
    }

    const int H = 16, HV = 32, K = 128, V = 128, D = 2 * H * K + HV * V, Bs[3] = {1, 32, 256};
    for (int bi = 0; bi < 3; bi++) {
        const int B = Bs[bi];
        const size_t st_bytes = (size_t)B * HV * K * V * 4;
        const int npool = st_bytes < ((size_t)256 << 20) ? (int)(((size_t)512 << 20) / st_bytes) : 2;
        float *state;
        void *x, *ga, *gb, *o;
        float *A_log, *dt_bias;
        CK(cudaMalloc((void **)&state, st_bytes * npool));
        CK(cudaMemsetAsync(state, 0, st_bytes * npool, st));
        CK(cudaMalloc(&x, 2 * (size_t)B * D)); CK(cudaMemsetAsync(x, 0x3c, 2 * (size_t)B * D, st));
        CK(cudaMalloc(&ga, 2 * (size_t)B * HV)); CK(cudaMemsetAsync(ga, 0, 2 * (size_t)B * HV, st));
        CK(cudaMalloc(&gb, 2 * (size_t)B * HV)); CK(cudaMemsetAsync(gb, 0, 2 * (size_t)B * HV, st));
        CK(cudaMalloc(&o, 2 * (size_t)B * HV * V));
        CK(cudaMalloc((void **)&A_log, 4 * HV)); CK(cudaMemsetAsync(A_log, 0, 4 * HV, st));
        CK(cudaMalloc((void **)&dt_bias, 4 * HV)); CK(cudaMemsetAsync(dt_bias, 0, 4 * HV, st));
        gdn_exec ex = {GDN_BACKEND_CUDA, st, 0, 0};
        gdn_decode_config c = {.B = B, .H = H, .HV = HV, .K = K, .V = V, .dtype = GDN_BF16, .flags = GDN_QK_L2NORM, .num_slots = B};
        gdn_decode_args a = {.mixed_qkv = x, .a = ga, .b = gb, .A_log = A_log, .dt_bias = dt_bias, .o = o};
        enum { REPS = 50 };
        float t[REPS];
        for (int r = -5; r < REPS; r++) {
            a.state = state + (size_t)((r + 5) % npool) * B * HV * K * V;
            CK(cudaEventRecord(e0, st));
            if (gdn_decode_step(&ex, &c, &a) != GDN_OK) { fprintf(stderr, "%s\n", gdn_last_error()); return 1; }
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            if (r >= 0) CK(cudaEventElapsedTime(&t[r], e0, e1));
        }
        qsort(t, REPS, sizeof *t, cmp_f);
        const double us = t[REPS / 2] * 1e3, gbs = 2.0 * st_bytes / (us * 1e-6) * 1e-9;
        char name[64];
        snprintf(name, sizeof name, "decode_step B%d H%d HV%d K%d V%d", B, H, HV, K, V);
        printf("%-40s %10.2f %9.1f %7.1f%%\n", name, us, gbs, 100.0 * gbs / copy);
        if (B == 1) {   /* graph replay: 20 steps captured, per-step time */
            cudaGraph_t g;
            cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
            for (int s = 0; s < 20; s++) {
                a.state = state + (size_t)(s % npool) * B * HV * K * V;
                if (gdn_decode_step(&ex, &c, &a) != GDN_OK) { fprintf(stderr, "%s\n", gdn_last_error()); return 1; }
            }
            CK(cudaStreamEndCapture(st, &g));
            CK(cudaGraphInstantiate(&ge, g, 0));
            for (int r = -3; r < REPS; r++) {
                CK(cudaEventRecord(e0, st));
                CK(cudaGraphLaunch(ge, st));
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                if (r >= 0) CK(cudaEventElapsedTime(&t[r], e0, e1));
            }
            qsort(t, REPS, sizeof *t, cmp_f);
            const double us1 = t[REPS / 2] * 1e3 / 20;
            printf("%-40s %10.2f %9.1f %7.1f%%\n", "decode_step B1, graph replay (per step)", us1,
                   2.0 * st_bytes / (us1 * 1e-6) * 1e-9, 100.0 * 2.0 * st_bytes / (us1 * 1e-6) * 1e-9 / copy);
            CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(g));
        }
        CK(cudaFree(state)); CK(cudaFree(x)); CK(cudaFree(ga)); CK(cudaFree(gb)); CK(cudaFree(o));
        CK(cudaFree(A_log)); CK(cudaFree(dt_bias));
    }
    return 0;
}
