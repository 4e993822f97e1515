/* The CUDA backend's own bad input (gdn.h, "The CUDA backend"): pointers the
 * kernels cannot take misaligned, the decode step's slots, a stream of another
 * device. Called by test_cuda() (tests/test_cuda.c); device only. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "test_util.h"

#ifdef GDN_HAVE_CUDA
#include <cuda_runtime_api.h>
#include "test_cuda_util.h"

static const gdn_exec cuda_ex = {GDN_BACKEND_CUDA, NULL, 0, 0};

/* ---- bad input the CUDA backend adds (gdn.h, "The CUDA backend") ----
 * Pointers the kernels cannot take, the decode step's slots, a stream of
 * another device. Every buffer is a fresh cudaMalloc (256-byte aligned) of
 * its size + AL_SLACK bytes, all of it one byte pattern; a case moves one
 * pointer a few bytes off. A refused call: the status, a message that starts
 * with the pointer's name and says why, and not one byte of any output
 * buffer (the slack included) changed. */
enum { AL_SLACK = 64, AL_PAT = 0x5a };

/* n bytes + AL_SLACK of the pattern on the device */
static void *al_buf(size_t n) {
    unsigned char *h = t_alloc(n + AL_SLACK);
    memset(h, AL_PAT, n + AL_SLACK);
    void *d = dput(h, n + AL_SLACK);
    free(h);
    return d;
}
/* 1 when the n + AL_SLACK bytes at d are all the pattern */
static int al_untouched(const void *d, size_t n) {
    unsigned char *h = t_alloc(n + AL_SLACK);
    dget(h, d, n + AL_SLACK);
    int same = 1;
    for (size_t i = 0; i < n + AL_SLACK; i++) same &= h[i] == AL_PAT;
    free(h);
    return same;
}
/* p moved off bytes */
static void *al_off(const void *p, size_t off) { return (char *)p + off; }

/* one refused call: status want, the message starts with "<name> (" and contains must, outputs untouched */
static void al_expect(const char *op, const char *what, gdn_status s, gdn_status want, const char *name, const char *must,
                      int untouched) {
    const char *m = gdn_last_error();
    const size_t ln = strlen(name);
    const int named = !strncmp(m, name, ln) && !strncmp(m + ln, " (", 2) && strstr(m, must) != NULL;
    char ctx[240];
    snprintf(ctx, sizeof ctx, "op=%s backend=cuda bad input: %s", op, what);
    check(s == want && named && untouched, ctx, "status %s (want %s), message \"%s\" (want \"%s (...\" with \"%s\"), outputs %s",
          gdn_status_string(s), gdn_status_string(want), m, name, must, untouched ? "unchanged" : "WRITTEN");
}

/* chunk forward, bf16, K = V = 64: q, k, v, o need 16 bytes (K, V multiples
 * of 8), the workspace 16, every other pointer its elements */
static void chunk_align_bad_input(void) {
    enum { B = 1, T = 100, H = 2, HV = 4, K = 64, V = 64 };
    const size_t nq = (size_t)B * T * H * K * 2, nv = (size_t)B * T * HV * V * 2, ng = (size_t)B * T * HV * 4,
                 ns = (size_t)B * HV * K * V * 4;
    int64_t cu[3 + AL_SLACK / 8] = {0, 40, T};   /* + the slack the device copy has */
    gdn_config c = {.B = B, .T = T, .H = H, .HV = HV, .K = K, .V = V, .dtype = GDN_BF16, .gate_dtype = GDN_F32,
                    .flags = GDN_QK_L2NORM | GDN_GATE_FUSED | GDN_BETA_SIGMOID};
    gdn_config cv = c;
    cv.cu_seqlens = cu; cv.num_seqs = 2;
    const size_t sv = gdn_chunk_saved_size(&c), nws = gdn_chunk_fwd_workspace_size(&cuda_ex, &c),
                 nwsv = gdn_chunk_fwd_workspace_size(&cuda_ex, &cv), nwm = nws > nwsv ? nws : nwsv;
    void *q = al_buf(nq), *k = al_buf(nq), *v = al_buf(nv), *g = al_buf(ng), *b = al_buf(ng), *A = al_buf(4 * HV),
         *h0 = al_buf(ns), *o = al_buf(nv), *ht = al_buf(ns), *saved = al_buf(sv), *ws = al_buf(nwm),
         *dcu = dput(cu, sizeof cu);
    const gdn_fwd_args good = {.q = q, .k = k, .v = v, .g = g, .beta = b, .A_log = A, .h0 = h0, .o = o, .ht = ht,
                               .saved = saved, .saved_bytes = sv, .workspace = ws, .workspace_bytes = nws};
    enum { NC = 14 };
    for (int cs = 0; cs < NC; cs++) {
        gdn_config cc = c;
        gdn_fwd_args a = good;
        const char *what = "", *name = "";
        switch (cs) {
        case 0: a.q = al_off(q, 2); what = "q 2 bytes off 16 (K % 8 == 0)"; name = "q"; break;
        case 1: a.q = al_off(q, 1); what = "q 1 byte off (not a bf16 element)"; name = "q"; break;
        case 2: a.k = al_off(k, 8); what = "k 8 bytes off 16 (K % 8 == 0)"; name = "k"; break;
        case 3: a.v = al_off(v, 2); what = "v 2 bytes off 16 (V % 8 == 0)"; name = "v"; break;
        case 4: a.o = al_off(o, 2); what = "o 2 bytes off 16 (V % 8 == 0)"; name = "o"; break;
        case 5: a.o = al_off(o, 1); what = "o 1 byte off (not a bf16 element)"; name = "o"; break;
        case 6: a.workspace = al_off(ws, 8); what = "workspace 8 bytes off 16"; name = "workspace"; break;
        case 7: a.g = al_off(g, 2); what = "g 2 bytes off (not an f32 element)"; name = "g"; break;
        case 8: a.beta = al_off(b, 1); what = "beta 1 byte off (not an f32 element)"; name = "beta"; break;
        case 9: a.A_log = al_off(A, 2); what = "A_log 2 bytes off"; name = "A_log"; break;
        case 10: a.h0 = al_off(h0, 2); what = "h0 2 bytes off"; name = "h0"; break;
        case 11: a.ht = al_off(ht, 2); what = "ht 2 bytes off"; name = "ht"; break;
        case 12: a.saved = al_off(saved, 2); what = "saved 2 bytes off"; name = "saved"; break;
        default:
            cc = cv; cc.cu_seqlens_dev = al_off(dcu, 4); a.workspace_bytes = nwsv;
            what = "cu_seqlens_dev 4 bytes off (not an int64 element)"; name = "cu_seqlens_dev"; break;
        }
        const gdn_status s = gdn_chunk_fwd(&cuda_ex, &cc, &a);
        cudaDeviceSynchronize();
        const int same = al_untouched(o, nv) && al_untouched(ht, ns) && al_untouched(saved, sv);
        al_expect("chunk_fwd", what, s, GDN_ERR_OPTION, name, "aligned", same);
    }
    void *dev[] = {q, k, v, g, b, A, h0, o, ht, saved, ws, dcu};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
}

/* n bytes of h on the device, off bytes into a fresh buffer (*base: what to free) */
static void *dev_put_at(const void *h, size_t n, size_t off, void **base) {
    *base = al_buf(n + off);
    char *p = (char *)*base + off;
    if (n) cudaMemcpy(p, h, n, cudaMemcpyHostToDevice);
    return p;
}

/* Misaligned but allowed: with K = 36 and V = 20 (not multiples of 8) the
 * chunk forward moves q, k, v and o element by element, so with all four one
 * bf16 element off 16 bytes (g, beta, h0, ht one float off) it runs, and gives
 * the very bits of the same call on aligned buffers. */
static void chunk_align_fallback(rng *r) {
    enum { B = 2, T = 130, H = 2, HV = 4, K = 36, V = 20 };
    const size_t nq = (size_t)B * T * H * K, nv = (size_t)B * T * HV * V, ng = (size_t)B * T * HV, ns = (size_t)B * HV * K * V;
    const char *ctx = "op=chunk_fwd backend=cuda misaligned but allowed: B2 T130 H2 HV4 K36 V20 bf16, q k v o 2 bytes off 16";
    uint16_t *q = t_alloc(2 * nq), *k = t_alloc(2 * nq), *v = t_alloc(2 * nv);
    float *g = t_alloc(4 * ng), *b = t_alloc(4 * ng), *h0 = t_alloc(4 * ns);
    for (size_t i = 0; i < nq; i++) { t_store(GDN_BF16, q, i, (float)rng_normal(r)); t_store(GDN_BF16, k, i, (float)rng_normal(r)); }
    for (size_t i = 0; i < nv; i++) t_store(GDN_BF16, v, i, (float)rng_normal(r));
    for (size_t i = 0; i < ng; i++) { g[i] = (float)(-0.1 * fabs(rng_normal(r))); b[i] = (float)rng_uniform(r); }
    for (size_t i = 0; i < ns; i++) h0[i] = (float)(0.3 * rng_normal(r));
    gdn_config c = {.B = B, .T = T, .H = H, .HV = HV, .K = K, .V = V, .dtype = GDN_BF16, .gate_dtype = GDN_F32,
                    .flags = GDN_QK_L2NORM};
    const size_t sv = gdn_chunk_saved_size(&c), nws = gdn_chunk_fwd_workspace_size(&cuda_ex, &c);
    unsigned char *o_out[2], *ht_out[2];
    for (int run = 0; run < 2; run++) {   /* run 0 aligned, run 1 shifted */
        const size_t o16 = run ? 2 : 0, o32 = run ? 4 : 0;
        void *bq, *bk, *bv, *bg, *bb, *bh0;
        void *dq = dev_put_at(q, 2 * nq, o16, &bq), *dk = dev_put_at(k, 2 * nq, o16, &bk), *dv = dev_put_at(v, 2 * nv, o16, &bv),
             *dg = dev_put_at(g, 4 * ng, o32, &bg), *db = dev_put_at(b, 4 * ng, o32, &bb),
             *dh0 = dev_put_at(h0, 4 * ns, o32, &bh0);
        void *bo = al_buf(2 * nv + o16), *bht = al_buf(4 * ns + o32), *dsv = al_buf(sv), *dws = al_buf(nws);
        void *dO = al_off(bo, o16), *dht = al_off(bht, o32);
        gdn_fwd_args a = {.q = dq, .k = dk, .v = dv, .g = dg, .beta = db, .h0 = dh0, .o = dO, .ht = dht, .saved = dsv,
                          .saved_bytes = sv, .workspace = dws, .workspace_bytes = nws};
        const gdn_status s = gdn_chunk_fwd(&cuda_ex, &c, &a);
        const cudaError_t e = cudaDeviceSynchronize();
        check(s == GDN_OK && e == cudaSuccess, ctx, "%s run: status %s (%s), cuda %s", run ? "shifted" : "aligned",
              gdn_status_string(s), gdn_last_error(), cudaGetErrorString(e));
        o_out[run] = t_alloc(2 * nv);
        ht_out[run] = t_alloc(4 * ns);
        dget(o_out[run], dO, 2 * nv);
        dget(ht_out[run], dht, 4 * ns);
        void *dev[] = {bq, bk, bv, bg, bb, bh0, bo, bht, dsv, dws};
        for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
    }
    check(!memcmp(o_out[0], o_out[1], 2 * nv) && !memcmp(ht_out[0], ht_out[1], 4 * ns), ctx,
          "o and ht of the shifted run differ from the aligned run's");
    free(o_out[0]); free(o_out[1]); free(ht_out[0]); free(ht_out[1]);
    free(q); free(k); free(v); free(g); free(b); free(h0);
}

/* chunk backward, bf16, K = 32, V = 48: q, k, dq, dk and v, dout, dv need 16
 * bytes (K, V multiples of 8), the workspace 16, every other pointer its elements */
static void chunk_bwd_align_bad_input(void) {
    enum { B = 1, T = 100, H = 2, HV = 4, K = 32, V = 48 };
    int64_t cu[3 + AL_SLACK / 8] = {0, 40, T};   /* + the slack the device copy has */
    gdn_config c = {.B = B, .T = T, .H = H, .HV = HV, .K = K, .V = V, .dtype = GDN_BF16, .gate_dtype = GDN_F32,
                    .flags = GDN_QK_L2NORM | GDN_GATE_FUSED | GDN_BETA_SIGMOID};
    gdn_config cv = c;
    cv.cu_seqlens = cu; cv.num_seqs = 2;
    const size_t nq = (size_t)B * T * H * K * 2, nv = (size_t)B * T * HV * V * 2, ng = (size_t)B * T * HV * 4,
                 ns = (size_t)B * HV * K * V * 4;
    const size_t sv = gdn_chunk_saved_size(&c), nws = gdn_chunk_bwd_workspace_size(&cuda_ex, &c),
                 nwsv = gdn_chunk_bwd_workspace_size(&cuda_ex, &cv), nwm = nws > nwsv ? nws : nwsv;
    size_t big = nq > nv ? nq : nv;
    if (ns > big) big = ns;
    void *in = al_buf(big), *dq = al_buf(nq), *dk = al_buf(nq), *dv = al_buf(nv), *dg = al_buf(ng), *db = al_buf(ng),
         *dA = al_buf(4 * HV), *dd = al_buf(4 * HV), *dh0 = al_buf(ns), *ws = al_buf(nwm), *dcu = dput(cu, sizeof cu);
    const gdn_bwd_args good = {.q = in, .k = in, .v = in, .g = in, .beta = in, .A_log = (const float *)in, .saved = in,
                               .saved_bytes = sv, .dout = in, .dq = dq, .dk = dk, .dv = dv, .dg = dg, .dbeta = db,
                               .dA_log = (float *)dA, .ddt_bias = (float *)dd, .dh0 = (float *)dh0, .workspace = ws,
                               .workspace_bytes = nws};
    for (int cs = 0; cs < 13; cs++) {
        gdn_config cc = c;
        gdn_bwd_args a = good;
        const char *what = "", *name = "";
        switch (cs) {
        case 0: a.q = al_off(in, 1); what = "q 1 byte off (not a bf16 element)"; name = "q"; break;
        case 1: a.dout = al_off(in, 1); what = "dout 1 byte off"; name = "dout"; break;
        case 2: a.dq = al_off(dq, 1); what = "dq 1 byte off"; name = "dq"; break;
        case 3: a.dg = al_off(dg, 2); what = "dg 2 bytes off (not an f32 element)"; name = "dg"; break;
        case 4: a.dA_log = al_off(dA, 2); what = "dA_log 2 bytes off"; name = "dA_log"; break;
        case 5: a.dh0 = al_off(dh0, 2); what = "dh0 2 bytes off"; name = "dh0"; break;
        case 6: a.saved = al_off(in, 2); what = "saved 2 bytes off"; name = "saved"; break;
        case 7: a.workspace = al_off(ws, 8); what = "workspace 8 bytes off 16"; name = "workspace"; break;
        case 8: a.dout = al_off(in, 2); what = "dout 2 bytes off 16 (V % 8 == 0)"; name = "dout"; break;
        case 9: a.dk = al_off(dk, 2); what = "dk 2 bytes off 16 (K % 8 == 0)"; name = "dk"; break;
        case 10: a.dv = al_off(dv, 8); what = "dv 8 bytes off 16 (V % 8 == 0)"; name = "dv"; break;
        case 11: a.k = al_off(in, 4); what = "k 4 bytes off 16 (K % 8 == 0)"; name = "k"; break;
        default:
            cc = cv; cc.cu_seqlens_dev = al_off(dcu, 4); a.workspace_bytes = nwsv;
            what = "cu_seqlens_dev 4 bytes off (not an int64 element)"; name = "cu_seqlens_dev"; break;
        }
        const gdn_status s = gdn_chunk_bwd(&cuda_ex, &cc, &a);
        cudaDeviceSynchronize();
        const int same = al_untouched(dq, nq) && al_untouched(dk, nq) && al_untouched(dv, nv) && al_untouched(dg, ng) &&
                         al_untouched(db, ng) && al_untouched(dA, 4 * HV) && al_untouched(dd, 4 * HV) && al_untouched(dh0, ns);
        al_expect("chunk_bwd", what, s, GDN_ERR_OPTION, name, "aligned", same);
    }
    void *dev[] = {in, dq, dk, dv, dg, db, dA, dd, dh0, ws, dcu};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
}

/* The decode step: misaligned pointers refused; slots out of range are
 * padding on CUDA (the CPU refuses them: compared with the CPU run where
 * they are -1); a slot used twice (outside the contract) runs and touches no
 * other pool row. */
static void decode_bad_input(rng *r) {
    enum { B = 4, H = 1, HV = 2, K = 16, V = 16, NS = 3, D = 2 * H * K + HV * V };
    const gdn_dtype dt = GDN_BF16;
    const size_t nx = (size_t)B * D * 2, nab = (size_t)B * HV * 2, no = (size_t)B * HV * V * 2, row = (size_t)HV * K * V,
                 nst = NS * row * 4;
    char ctx[240];
    /* misaligned pointers */
    {
        void *x = al_buf(nx), *ga = al_buf(nab), *gb = al_buf(nab), *A = al_buf(4 * HV), *st = al_buf(nst), *o = al_buf(no),
             *sl = al_buf(4 * B);
        gdn_decode_config c = {.B = B, .H = H, .HV = HV, .K = K, .V = V, .dtype = dt, .flags = GDN_QK_L2NORM, .num_slots = NS};
        const gdn_decode_args good = {.mixed_qkv = x, .a = ga, .b = gb, .A_log = A, .state = st, .slots = sl, .o = o};
        for (int cs = 0; cs < 6; cs++) {
            gdn_decode_args a = good;
            const char *what = "", *name = "";
            switch (cs) {
            case 0: a.mixed_qkv = al_off(x, 1); what = "mixed_qkv 1 byte off (not a bf16 element)"; name = "mixed_qkv"; break;
            case 1: a.b = al_off(gb, 1); what = "b 1 byte off"; name = "b"; break;
            case 2: a.o = al_off(o, 1); what = "o 1 byte off"; name = "o"; break;
            case 3: a.A_log = al_off(A, 2); what = "A_log 2 bytes off (not an f32 element)"; name = "A_log"; break;
            case 4: a.state = al_off(st, 2); what = "state 2 bytes off"; name = "state"; break;
            default: a.slots = al_off(sl, 2); what = "slots 2 bytes off (not an int32 element)"; name = "slots"; break;
            }
            const gdn_status s = gdn_decode_step(&cuda_ex, &c, &a);
            cudaDeviceSynchronize();
            al_expect("decode_step", what, s, GDN_ERR_OPTION, name, "aligned", al_untouched(o, no) && al_untouched(st, nst));
        }
        void *dev[] = {x, ga, gb, A, st, o, sl};
        for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
    }
    /* slots on the device: out of range = padding; a repeat stays in its pool row */
    void *x = t_alloc(nx), *ga = t_alloc(nab), *gb = t_alloc(nab);
    for (size_t i = 0; i < (size_t)B * D; i++) t_store(dt, x, i, (float)rng_normal(r));
    for (size_t i = 0; i < (size_t)B * HV; i++) { t_store(dt, ga, i, (float)rng_normal(r)); t_store(dt, gb, i, (float)rng_normal(r)); }
    float A_log[HV], *st0 = t_alloc(nst), *st_cpu = t_alloc(nst), *st_gpu = t_alloc(nst);
    for (int j = 0; j < HV; j++) A_log[j] = (float)log(1 + 15 * rng_uniform(r));
    for (size_t i = 0; i < NS * row; i++) st0[i] = (float)(0.3 * rng_normal(r));
    void *o_cpu = t_alloc(no), *o_gpu = t_alloc(no);
    const int32_t cpu_slots[2][B] = {{-1, -1, 1, -1}, {-1, -1, -1, 0}};
    const int32_t gpu_slots[2][B] = {{NS, -7, 1, 1000}, {2, 2, -1, 0}};
    for (int cs = 0; cs < 2; cs++) {
        snprintf(ctx, sizeof ctx, "op=decode_step backend=cuda slots {%d, %d, %d, %d} (num_slots %d): %s", gpu_slots[cs][0],
                 gpu_slots[cs][1], gpu_slots[cs][2], gpu_slots[cs][3], NS,
                 cs ? "slot 2 twice (outside the contract): runs, pool row 1 untouched, row 3 as on the CPU"
                    : "out of range = padding, as -1 on the CPU");
        gdn_decode_config c = {.B = B, .H = H, .HV = HV, .K = K, .V = V, .dtype = dt, .flags = GDN_QK_L2NORM, .num_slots = NS};
        memcpy(st_cpu, st0, nst);
        gdn_decode_args a = {.mixed_qkv = x, .a = ga, .b = gb, .A_log = A_log, .state = st_cpu, .slots = cpu_slots[cs], .o = o_cpu};
        gdn_status s = gdn_decode_step(NULL, &c, &a);
        check(s == GDN_OK, ctx, "CPU decode: %s", gdn_last_error());
        gdn_decode_args cpu_bad = a;
        cpu_bad.slots = gpu_slots[cs];
        check(gdn_decode_step(NULL, &c, &cpu_bad) == GDN_ERR_SHAPE, ctx, "the CPU backend accepts these slots (%s)",
              gdn_last_error());
        t_poison_nan(dt, o_gpu, no / 2);
        void *dx = dput(x, nx), *dga = dput(ga, nab), *dgb = dput(gb, nab), *dA = dput(A_log, 4 * HV),
             *dst = dput(st0, nst), *dsl = dput(gpu_slots[cs], 4 * B), *dO = dput(o_gpu, no);
        gdn_decode_args ad = {.mixed_qkv = dx, .a = dga, .b = dgb, .A_log = dA, .state = dst, .slots = dsl, .o = dO};
        s = gdn_decode_step(&cuda_ex, &c, &ad);
        const cudaError_t e = cudaDeviceSynchronize();
        if (check(s == GDN_OK && e == cudaSuccess, ctx, "status %s (%s), cuda %s", gdn_status_string(s), gdn_last_error(),
                  cudaGetErrorString(e))) {
            dget(o_gpu, dO, no);
            dget(st_gpu, dst, nst);
            const size_t orow = (size_t)HV * V;   /* o elements per row */
            double ref[B * HV * V];
            for (size_t i = 0; i < (size_t)B * HV * V; i++) ref[i] = t_get(dt, o_cpu, i);
            if (cs == 0) {
                check_close(ctx, "o vs CPU", dt, o_gpu, ref, (size_t)B * HV * V, 1e-2);
                double sref[NS * HV * K * V];
                for (size_t i = 0; i < NS * row; i++) sref[i] = st_cpu[i];
                check_close(ctx, "state vs CPU", GDN_F32, st_gpu, sref, NS * row, 1e-5);
                check(!memcmp(st_gpu, st0, 4 * row) && !memcmp(st_gpu + 2 * row, st0 + 2 * row, 4 * row), ctx,
                      "pool rows 0 and 2 (no valid slot points at them) changed");
            } else {
                int zero = 1;
                for (size_t i = 2 * orow; i < 3 * orow; i++) zero &= t_get(dt, o_gpu, i) == 0.0;
                check(zero, ctx, "o row 2 (padding) is not 0");
                check(!memcmp(st_gpu + row, st0 + row, 4 * row), ctx, "pool row 1 (no slot points at it) changed");
                check_close(ctx, "o row 3 vs CPU", dt, (const char *)o_gpu + 3 * orow * 2, ref + 3 * orow, orow, 1e-2);
                double sref[HV * K * V];
                for (size_t i = 0; i < row; i++) sref[i] = st_cpu[i];
                check_close(ctx, "pool row 0 vs CPU", GDN_F32, st_gpu, sref, row, 1e-5);
            }
        }
        void *dev[] = {dx, dga, dgb, dA, dst, dsl, dO};
        for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
    }
    free(x); free(ga); free(gb); free(st0); free(st_cpu); free(st_gpu); free(o_cpu); free(o_gpu);
}

/* gdn_exec.stream: one of the current device runs; one of another device is
 * refused (GDN_ERR_BACKEND) where more than one device is visible */
static void stream_device_bad_input(void) {
    enum { ROWS = 4, HV = 2 };
    const float a[ROWS * HV] = {0.1f, -0.2f, 0.3f, 0.4f, -0.5f, 0.6f, 0.7f, -0.8f}, A_log[HV] = {0.5f, 1.0f};
    void *da = dput(a, sizeof a), *dA = dput(A_log, sizeof A_log), *dg = al_buf(sizeof a);
    cudaStream_t mine = NULL;
    if (cudaStreamCreate(&mine) != cudaSuccess) { fprintf(stderr, "cudaStreamCreate failed\n"); exit(1); }
    gdn_exec ex = cuda_ex;
    ex.stream = mine;
    gdn_status s = gdn_gate_fwd(&ex, ROWS, HV, GDN_F32, da, dA, NULL, dg);
    cudaError_t e = cudaStreamSynchronize(mine);
    check(s == GDN_OK && e == cudaSuccess, "op=gate_fwd backend=cuda a stream of the current device",
          "status %s (%s), cuda %s", gdn_status_string(s), gdn_last_error(), cudaGetErrorString(e));
    cudaStreamDestroy(mine);
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
#if CUDART_VERSION >= 12080
    if (n >= 2) {
        cudaFree(dg);
        dg = al_buf(sizeof a);
        int cur = 0;
        cudaGetDevice(&cur);
        const int other = cur == 0 ? 1 : 0;
        cudaStream_t theirs = NULL;
        cudaSetDevice(other);
        e = cudaStreamCreate(&theirs);
        cudaSetDevice(cur);
        if (check(e == cudaSuccess, "op=gate_fwd backend=cuda bad input: a stream of another device",
                  "cudaStreamCreate on device %d: %s", other, cudaGetErrorString(e))) {
            ex.stream = theirs;
            s = gdn_gate_fwd(&ex, ROWS, HV, GDN_F32, da, dA, NULL, dg);
            cudaDeviceSynchronize();
            al_expect("gate_fwd", "a stream of another device", s, GDN_ERR_BACKEND, "gdn_exec.stream", "device",
                      al_untouched(dg, sizeof a));
            /* the decode step: B 1, H 1, HV 2, K = V = 8, f32 (D = 32) */
            gdn_decode_config dc = {.B = 1, .H = 1, .HV = HV, .K = 8, .V = 8, .dtype = GDN_F32, .num_slots = 1};
            void *dx = al_buf(4 * 32), *dst = al_buf(4 * HV * 64), *dO = al_buf(4 * HV * 8);
            gdn_decode_args dargs = {.mixed_qkv = dx, .a = da, .b = da, .A_log = dA, .state = dst, .o = dO};
            s = gdn_decode_step(&ex, &dc, &dargs);
            cudaDeviceSynchronize();
            al_expect("decode_step", "a stream of another device", s, GDN_ERR_BACKEND, "gdn_exec.stream", "device",
                      al_untouched(dst, 4 * HV * 64) && al_untouched(dO, 4 * HV * 8));
            cudaFree(dx); cudaFree(dst); cudaFree(dO);
            cudaSetDevice(other);
            cudaStreamDestroy(theirs);
            cudaSetDevice(cur);
        }
    } else {
        printf("  cuda: a stream of another device: skipped (%d device visible)\n", n);
    }
#else
    printf("  cuda: a stream of another device: skipped (built with CUDA %d, before cudaStreamGetDevice: not detected)\n",
           CUDART_VERSION);
#endif
    cudaFree(da); cudaFree(dA); cudaFree(dg);
}

void test_cuda_bad_input(rng *ra) {
    chunk_align_bad_input();
    chunk_align_fallback(ra);
    chunk_bwd_align_bad_input();
    decode_bad_input(ra);
    stream_device_bad_input();
}
#endif
