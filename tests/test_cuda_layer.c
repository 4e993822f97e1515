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
 * bad input on CUDA (status, message, no device byte written; pointers
 * misaligned for their elements), bit-identical
 * reruns and a CUDA-graph capture of every op, forwards and backwards (no
 * host sync, no allocation).
 * Called at the end of test_cuda(); skipped where no device is visible.
 * Split over: test_cuda_conv1d.c (conv1d forward, update, backward),
 * test_cuda_norm.c (gated RMSNorm, gate, L2 norm, forward and backward) and
 * test_cuda_util.h (the shared helpers); here: the decode step with its conv,
 * bad input, the rerun and CUDA-graph check, and the entry points. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ref/ref.h"
#include "test_util.h"

#ifndef GDN_HAVE_CUDA
void test_cuda_layer(void) { printf("  cuda layer ops: not built (no nvcc at build time): skipped\n"); }
void test_cuda_layer_bwd(void) { test_cuda_layer(); }
#else
#include <cuda_runtime_api.h>
#include "test_cuda_util.h"

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

/* ---- misaligned pointers on CUDA: every pointer must be aligned to its
 * elements (gdn.h, "The CUDA backend"); the vector widths the kernels pick
 * from the alignment themselves are tested with one element off
 * (test_cuda_conv1d.c, test_cuda_norm.c: misalign = 1) ---- */

static void test_bad_align(void) {
    enum { NB = 4096 };
    unsigned char pat[NB];
    memset(pat, 0x5A, NB);
    float *din = dalloc_dev(NB), *dout = dput(pat, NB), *dout2 = dput(pat, NB), *dst = dput(pat, NB);
    float hin[NB / 4];
    for (int i = 0; i < NB / 4; i++) hin[i] = 0.25f;
    cudaMemcpy(din, hin, NB, cudaMemcpyHostToDevice);
    const int32_t hsl[4] = {0, 1, 2, -1};
    int32_t *dsl = dput(hsl, sizeof hsl);
    int64_t hcu[3 + 8] = {0, 2, 5};
    int64_t *dcu = dput(hcu, sizeof hcu);
    char *ci = (char *)din, *co = (char *)dout, *co2 = (char *)dout2, *cs = (char *)dst;
    const gdn_exec ex = {GDN_BACKEND_CUDA, NULL, 0, 0};
    char ctx[200];
    /* GDN_ERR_OPTION, a message "<name> (0x...) must be N-byte aligned ...", no output byte written */
#define BADA(what, name, call) do { \
        const gdn_status s_ = (call); \
        cudaDeviceSynchronize(); \
        const int same_ = dsame(dout, pat, NB) && dsame(dout2, pat, NB) && dsame(dst, pat, NB); \
        const char *m_ = gdn_last_error(); \
        const int named_ = !strncmp(m_, name " (", strlen(name " (")) && strstr(m_, "aligned") != NULL; \
        snprintf(ctx, sizeof ctx, "op=%s backend=cuda bad input (misaligned)", what); \
        check(s_ == GDN_ERR_OPTION && named_ && same_, ctx, "status %s (want GDN_ERR_OPTION), message \"%s\" (want \"%s (...\"), outputs %s", \
              gdn_status_string(s_), m_, name, same_ ? "unchanged" : "WRITTEN"); \
    } while (0)
    /* conv1d forward, backward, update (f32, then bf16 for 1-byte offsets) */
    gdn_conv1d_config cc = {.B = 1, .T = 5, .D = 6, .W = 4, .dtype = GDN_F32, .silu = 1};
    gdn_conv1d_config cv = cc;
    cv.cu_seqlens = hcu; cv.num_seqs = 2; cv.cu_seqlens_dev = (const int64_t *)((char *)dcu + 4);
    gdn_conv1d_config cb16 = cc;
    cb16.dtype = GDN_BF16;
    const gdn_conv1d_args ca = {din, din, NULL, din, dout, dout2};
    gdn_conv1d_args a = ca;
    a.x = ci + 2;
    BADA("conv1d_fwd x 2 bytes off (f32)", "x", gdn_conv1d_fwd(&ex, &cc, &a));
    a = ca; a.x = ci + 1;
    BADA("conv1d_fwd x 1 byte off (bf16)", "x", gdn_conv1d_fwd(&ex, &cb16, &a));
    a = ca; a.y = co + 2;
    BADA("conv1d_fwd y 2 bytes off", "y", gdn_conv1d_fwd(&ex, &cc, &a));
    a = ca; a.weight = (const float *)(ci + 2);
    BADA("conv1d_fwd weight 2 bytes off", "weight", gdn_conv1d_fwd(&ex, &cc, &a));
    a = ca; a.ht = (float *)(co2 + 2);
    BADA("conv1d_fwd ht 2 bytes off", "ht", gdn_conv1d_fwd(&ex, &cc, &a));
    a = ca;
    BADA("conv1d_fwd cu_seqlens_dev 4 bytes off", "cu_seqlens_dev", gdn_conv1d_fwd(&ex, &cv, &a));
    const gdn_conv1d_bwd_args cba = {din, din, NULL, NULL, din, NULL, dout, dout2, NULL, dst};
    gdn_conv1d_bwd_args b = cba;
    b.dx = co + 2;
    BADA("conv1d_bwd dx 2 bytes off", "dx", gdn_conv1d_bwd(&ex, &cc, &b));
    b = cba; b.dweight = (float *)(co2 + 2);
    BADA("conv1d_bwd dweight 2 bytes off", "dweight", gdn_conv1d_bwd(&ex, &cc, &b));
    b = cba; b.dh0 = (float *)(cs + 2);
    BADA("conv1d_bwd dh0 2 bytes off", "dh0", gdn_conv1d_bwd(&ex, &cc, &b));
    b = cba; b.dy = ci + 1;
    BADA("conv1d_bwd dy 1 byte off (bf16)", "dy", gdn_conv1d_bwd(&ex, &cb16, &b));
    gdn_conv1d_config uc = cc;
    uc.B = 3;
    BADA("conv1d_update state 2 bytes off", "state",
         gdn_conv1d_update(&ex, &uc, din, din, NULL, (float *)(cs + 2), 3, NULL, dout));
    BADA("conv1d_update slots 2 bytes off", "slots",
         gdn_conv1d_update(&ex, &uc, din, din, NULL, dst, 3, (const int32_t *)((char *)dsl + 2), dout));
    uc.dtype = GDN_F16;
    BADA("conv1d_update y 1 byte off (f16)", "y", gdn_conv1d_update(&ex, &uc, din, din, NULL, dst, 3, dsl, co + 1));
    /* gated RMSNorm */
    const gdn_rmsnorm_config rc = {4, 16, GDN_BF16, 1e-6f, GDN_NORM_GATE_SILU};
    BADA("rmsnorm_fwd y 1 byte off (bf16)", "y", gdn_rmsnorm_gated_fwd(&ex, &rc, din, din, din, co + 1, (float *)dout2));
    BADA("rmsnorm_fwd w 2 bytes off", "w",
         gdn_rmsnorm_gated_fwd(&ex, &rc, din, din, (const float *)(ci + 2), dout, (float *)dout2));
    BADA("rmsnorm_fwd rstd 2 bytes off", "rstd", gdn_rmsnorm_gated_fwd(&ex, &rc, din, din, din, dout, (float *)(co2 + 2)));
    BADA("rmsnorm_bwd dz 1 byte off", "dz", gdn_rmsnorm_gated_bwd(&ex, &rc, din, din, din, NULL, din, dout, co2 + 1, dst));
    BADA("rmsnorm_bwd dw 2 bytes off", "dw",
         gdn_rmsnorm_gated_bwd(&ex, &rc, din, din, din, NULL, din, dout, dout2, (float *)(cs + 2)));
    /* gate and L2 norm */
    BADA("gate_fwd g 2 bytes off", "g", gdn_gate_fwd(&ex, 4, 2, GDN_F32, din, din, NULL, (float *)(co + 2)));
    BADA("gate_fwd a 1 byte off (bf16)", "a", gdn_gate_fwd(&ex, 4, 2, GDN_BF16, ci + 1, din, NULL, dout));
    BADA("gate_bwd da 1 byte off (f16)", "da", gdn_gate_bwd(&ex, 4, 2, GDN_F16, din, din, NULL, din, co + 1, dout2, dst));
    BADA("gate_bwd dA_log 2 bytes off", "dA_log",
         gdn_gate_bwd(&ex, 4, 2, GDN_F32, din, din, NULL, din, dout, (float *)(co2 + 2), dst));
    BADA("l2norm_fwd y 1 byte off (f16)", "y", gdn_l2norm_fwd(&ex, 4, 8, GDN_F16, din, co + 1, dout2));
    BADA("l2norm_fwd rstd 2 bytes off", "rstd", gdn_l2norm_fwd(&ex, 4, 8, GDN_F16, din, dout, (float *)(co2 + 2)));
    BADA("l2norm_bwd dx 1 byte off (f16)", "dx", gdn_l2norm_bwd(&ex, 4, 8, GDN_F16, din, din, din, co + 1));
    /* the decode step with its conv */
    gdn_decode_config dc = {.B = 2, .H = 1, .HV = 2, .K = 8, .V = 8, .dtype = GDN_F32, .num_slots = 2, .conv_W = 4};
    const gdn_decode_args dgood = {.proj = din, .conv_state = dout2, .conv_weight = din, .a = din, .b = din, .A_log = din,
                                   .state = dst, .o = dout};
    gdn_decode_args da = dgood;
    da.proj = ci + 2;
    BADA("decode_step proj 2 bytes off", "proj", gdn_decode_step(&ex, &dc, &da));
    da = dgood; da.conv_state = (float *)(co2 + 2);
    BADA("decode_step conv_state 2 bytes off", "conv_state", gdn_decode_step(&ex, &dc, &da));
    da = dgood; da.conv_weight = (const float *)(ci + 2);
    BADA("decode_step conv_weight 2 bytes off", "conv_weight", gdn_decode_step(&ex, &dc, &da));
#undef BADA
    cudaFree(din); cudaFree(dout); cudaFree(dout2); cudaFree(dst); cudaFree(dsl); cudaFree(dcu);
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
    test_bad_align();
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
