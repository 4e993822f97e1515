/* gdn — run every op of the library on one shape, time it, and check it
 * against the float64 reference. main(): the flow, from the flags through the
 * inputs and references to the checked and timed ops and the printed results.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* a step that took seconds says so on stderr (large shapes take a while) */
static void progress(const char *what, double t0_ms) {
    const double s = (now_ms() - t0_ms) * 1e-3;
    if (s >= 2.0) fprintf(stderr, "gdn: %s on the host in %.1f s\n", what, s);
}

/* For each op: the median time of a few runs after warm-up on the full shape,
 * the rates from the FLOP and byte models of tools/flops.h, and the relative
 * error ||out - ref|| / ||ref|| against the float64 reference on a slice of
 * the same call (the first sequence, its first min(T, 256) tokens; with
 * --varlen every sequence clipped to the first 256 tokens; the decode step on
 * its first rows). The gated delta rule ops are checked against src/ref (in
 * check.c); the GDN layer pieces (decode step, conv1d, gated RMSNorm) against
 * plain double loops (lref.c), written from the math in gdn.h. Exits 1 when an
 * error is over the bound of DESIGN.md §5 or a call fails, 2 on bad flags.
 *
 * The tensors live where the backend wants them: host memory for the CPU,
 * device memory for CUDA (built in with -DGDN_CLI_CUDA, linking cudart).
 */

/* FNV-1a over the 64-bit little-endian words of n bytes (the last word
 * zero-padded) in four interleaved lanes, folded into one, then n: not the
 * bytewise FNV-1a (whose multiply chain took seconds a GB) */
static uint64_t fnv_words(const unsigned char *p, size_t n) {
    const uint64_t P = 1099511628211ull;
    uint64_t h[4] = {1469598103934665603ull, 1469598103934665603ull ^ 1, 1469598103934665603ull ^ 2, 1469598103934665603ull ^ 3};
    const size_t nw = n / 8;
    size_t i = 0;
    for (; i + 4 <= nw; i += 4)
        for (int l = 0; l < 4; l++) {
            uint64_t w;
            memcpy(&w, p + 8 * (i + l), 8);
            h[l] = (h[l] ^ w) * P;
        }
    for (; i < nw; i++) {
        uint64_t w;
        memcpy(&w, p + 8 * i, 8);
        h[i & 3] = (h[i & 3] ^ w) * P;
    }
    if (n % 8) {
        uint64_t w = 0;
        memcpy(&w, p + 8 * nw, n % 8);
        h[0] = (h[0] ^ w) * P;
    }
    uint64_t x = 1469598103934665603ull;
    for (int l = 0; l < 4; l++) x = (x ^ h[l]) * P;
    return (x ^ (uint64_t)n) * P;
}

/* a tensor's hash: fnv_words of each 1 MiB block (in parallel), then
 * fnv_words of the blocks' hashes in order; the same for any thread count */
static uint64_t hash_bytes(const unsigned char *p, size_t n) {
    const size_t blk = (size_t)1 << 20, nb = (n + blk - 1) / blk;
    if (nb <= 1) return fnv_words(p, n);
    uint64_t *bh = xmalloc(nb * sizeof *bh);
    #pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < (int64_t)nb; b++) {
        const size_t o = (size_t)b * blk;
        bh[b] = fnv_words(p + o, n - o < blk ? n - o : blk);
    }
    const uint64_t x = fnv_words((const unsigned char *)bh, nb * sizeof *bh);
    free(bh);
    return x;
}

/* --hash: a hash of each full output of a chunk op, recurrent_fwd, conv1d_fwd or
 * conv1d_bwd (after its timed runs), so two builds can be checked for the same bits */
static void print_hashes(int op, const call *c) {
    const outputs *u = &c->out;
    const sizes *z = &c->sz;
    const size_t e = gdn_dtype_size(c->cfg.dtype), ge = gdn_dtype_size(c->cfg.gate_dtype), hv = (size_t)c->cfg.HV;
    struct { const char *name; const void *p; size_t bytes; } t[10];
    int n = 0;
#define HASHED(nm, ptr, nb) do { t[n].name = nm; t[n].p = ptr; t[n].bytes = nb; n++; } while (0)
    if (op == OP_CONV_FWD) {
        HASHED("y", u->cv_y, (size_t)(c->conv.B * c->conv.T) * c->conv.D * e);
        HASHED("ht", u->cv_ht, (size_t)gdn_conv1d_seqs(&c->conv) * c->conv.D * c->conv.W * 4);
    } else if (op == OP_CONV_BWD) {
        HASHED("dx", u->cv_dx, (size_t)(c->conv.B * c->conv.T) * c->conv.D * e);
        HASHED("dweight", u->cv_dw, (size_t)c->conv.D * c->conv.W * 4);
        HASHED("dbias", u->cv_db, (size_t)c->conv.D * 4);
        HASHED("dh0", u->cv_dh0, (size_t)gdn_conv1d_seqs(&c->conv) * c->conv.D * c->conv.W * 4);
    } else {   /* chunk_fwd, recurrent_fwd: o, ht; chunk_fwd+bwd also every gradient */
        HASHED("o", u->o, z->nv * e);
        HASHED("ht", u->ht, z->nst * 4);
        if (op == OP_CHUNK_FWDBWD) {
            HASHED("dq", u->dq, z->nqk * e); HASHED("dk", u->dk, z->nqk * e); HASHED("dv", u->dv, z->nv * e);
            HASHED("dg", u->dg, z->ng * ge); HASHED("dbeta", u->dbeta, z->ng * ge); HASHED("dA_log", u->dA_log, hv * 4);
            HASHED("ddt_bias", u->ddt_bias, hv * 4); HASHED("dh0", u->dh0, z->nst * 4);
        }
    }
#undef HASHED
    for (int i = 0; i < n; i++) {
        unsigned char *h = xmalloc(t[i].bytes ? t[i].bytes : 1);
        be->download(h, t[i].p, t[i].bytes);
        const uint64_t x = hash_bytes(h, t[i].bytes);
        free(h);
        printf("hash %s %s %016llx\n", op_name[op], t[i].name, (unsigned long long)x);
    }
}

int main(int argc, char **argv) {
    opts o;
    const int prc = parse_args(argc, argv, &o);
    if (prc == -1) return 0;
    if (prc) return prc;

#ifdef GDN_CLI_CUDA
    if (!o.backend_set && gdn_backend_available(GDN_BACKEND_CUDA)) o.backend = GDN_BACKEND_CUDA;   /* the GPU when present */
#endif
    if (o.backend == GDN_BACKEND_CUDA) {
        if (!gdn_backend_available(GDN_BACKEND_CUDA)) {
            fprintf(stderr, "gdn: the CUDA backend is not available: this libgdn was built without it, or no "
                            "CUDA device is visible. Use --backend cpu.\n");
            return 2;
        }
#ifdef GDN_CLI_CUDA
        be = &cuda_backend;
#else
        fprintf(stderr, "gdn: libgdn has the CUDA backend, but this gdn tool was built without device memory "
                        "support (-DGDN_CLI_CUDA). Use --backend cpu.\n");
        return 2;
#endif
    } else {
        if (!gdn_backend_available(GDN_BACKEND_CPU)) {
            fprintf(stderr, "gdn: the CPU backend is not available in this libgdn\n");
            return 2;
        }
        be = &cpu_backend;
    }
    rng_seed(o.seed);

    /* the full call */
    call full;
    memset(&full, 0, sizeof full);
    full.ex.backend = o.backend; full.ex.threads = o.threads; full.ex.seq_split = o.seq_split;
    gdn_config *c = &full.cfg;
    c->B = o.B; c->T = o.T; c->H = o.H; c->HV = o.HV; c->K = o.K; c->V = o.V;
    c->dtype = o.dtype; c->gate_dtype = o.gate_dtype; c->flags = o.flags;
    int64_t *cu = NULL, *cu_slice = NULL;
    void *cu_dev = NULL, *cu_slice_dev = NULL;
    if (o.varlen) {
        cu = xmalloc(sizeof(int64_t) * (size_t)(o.varlen + 1));
        ragged_seqlens(o.T, o.varlen, cu);
        c->cu_seqlens = cu; c->num_seqs = o.varlen;
    }
    full.sz = sizes_of(c);

    /* the slice: the first sequence's first SLICE_T tokens; with varlen, every
     * sequence clipped to the first SLICE_T tokens (a prefix of each tensor) */
    call slice = full;
    gdn_config *cs = &slice.cfg;
    cs->B = 1;
    if (o.varlen) {
        cs->T = o.T < SLICE_T ? o.T : SLICE_T;
        cu_slice = xmalloc(sizeof(int64_t) * (size_t)(o.varlen + 1));
        for (int i = 0; i <= o.varlen; i++) cu_slice[i] = cu[i] < cs->T ? cu[i] : cs->T;
        cs->cu_seqlens = cu_slice;
    } else {
        cs->T = o.T < SLICE_T ? o.T : SLICE_T;
    }
    slice.sz = sizes_of(cs);
    if (be->id == GDN_BACKEND_CUDA && o.varlen) {
        const size_t n = sizeof(int64_t) * (size_t)(o.varlen + 1);
        cu_dev = dev_copy(cu, n); cu_slice_dev = dev_copy(cu_slice, n);
        c->cu_seqlens_dev = cu_dev; cs->cu_seqlens_dev = cu_slice_dev;
    }

    /* the GDN layer pieces: the decode step on its own rows (a pool of twice
     * as many slots); conv1d over the channels of mixed_qkv for the same
     * tokens and sequences; the norm over every token's value heads. The slice
     * is the same as above (decode: its first rows). */
    const unsigned core_ops = (1u << OP_DECODE) - 1, layer_ops = o.ops & ~core_ops;
    gdn_decode_config *dc = &full.dec;
    dc->B = o.decode_B; dc->H = o.H; dc->HV = o.HV; dc->K = o.K; dc->V = o.V; dc->dtype = o.dtype;
    dc->flags = o.flags & (GDN_QK_L2NORM | GDN_STATE_V_FIRST);
    dc->num_slots = 2 * (int64_t)o.decode_B;
    dc->conv_W = 0;
    gdn_conv1d_config *cc = &full.conv;
    cc->B = c->B; cc->T = c->T; cc->D = gdn_decode_dim(dc); cc->W = CONV_W;
    cc->cu_seqlens = c->cu_seqlens; cc->cu_seqlens_dev = c->cu_seqlens_dev; cc->num_seqs = c->num_seqs;
    cc->dtype = o.dtype; cc->silu = 1;
    gdn_rmsnorm_config *nc = &full.norm;
    nc->rows = c->B * c->T * c->HV; nc->V = o.V; nc->dtype = o.dtype; nc->eps = NORM_EPS; nc->gate = GDN_NORM_GATE_SILU;
    slice.dec = full.dec;
    slice.dec.B = o.decode_B < DECODE_CHECK_ROWS ? o.decode_B : DECODE_CHECK_ROWS;
    slice.conv = full.conv;
    slice.conv.B = cs->B; slice.conv.T = cs->T; slice.conv.cu_seqlens = cs->cu_seqlens;
    slice.conv.cu_seqlens_dev = cs->cu_seqlens_dev;
    slice.norm = full.norm;
    slice.norm.rows = cs->B * cs->T * cs->HV;

    inputs host, dev;
    memset(&host, 0, sizeof host); memset(&dev, 0, sizeof dev);
    refs r;
    memset(&r, 0, sizeof r);
    if (o.ops & core_ops) {
        const int bwd = (o.ops & 1u << OP_CHUNK_FWDBWD) != 0;
        const double t0 = now_ms();
        inputs_random(c, bwd, &host);
        inputs_upload(c, &host, &dev);
        if (!o.no_check) refs_compute(cs, bwd, &host, &r);
        progress(o.no_check ? "inputs of the gated delta rule made" : "inputs of the gated delta rule made and checked", t0);   /* the slice reads a prefix of each host tensor */
        outputs_alloc(&slice);
        outputs_alloc(&full);
    }
    full.in = &dev; slice.in = &dev;
    layer_in lhost, ldev;
    memset(&lhost, 0, sizeof lhost); memset(&ldev, 0, sizeof ldev);
    lrefs lr;
    memset(&lr, 0, sizeof lr);
    lay_host = &lhost;
    if (layer_ops) {
        const double t0 = now_ms();
        layer_inputs_random(&full, layer_ops, &lhost);
        layer_inputs_upload(&full, &lhost, &ldev);
        if (!o.no_check) lrefs_compute(&slice, &lhost, layer_ops, &lr);
        progress(o.no_check ? "inputs of the layer pieces made" : "inputs of the layer pieces made and checked", t0);   /* the slice reads a prefix of each host tensor */
        layer_outputs_alloc(&slice);
        layer_outputs_alloc(&full);
    }
    full.lin = &ldev; slice.lin = &ldev;

    int threads = o.threads;   /* 0: what the library resolves it to, OpenMP's default */
#ifdef _OPENMP
    if (be->id == GDN_BACKEND_CPU && threads == 0) threads = omp_get_max_threads();
#endif

    result res[N_OPS];
    int all_ok = 1, nres = 0;
    for (int op = 0; op < N_OPS; op++) {
        if (!(o.ops & (1u << op))) continue;
        result *x = &res[nres++];
        memset(x, 0, sizeof *x);
        x->op = op;
        x->worst = "";
        x->of_copy = NAN;
        const int grads = op_has_grads(op);
        const gdn_dtype et = op == OP_GATE_FWD ? c->gate_dtype : c->dtype;
        x->bound = et == GDN_F32 ? (grads ? 1e-4 : 1e-5) : (grads ? 1e-2 : 5e-3);
        if (op == OP_GATE_FWD)
            snprintf(x->shape, sizeof x->shape, "rows %lld x HV %d", (long long)full.sz.rows, c->HV);
        else if (op == OP_L2NORM_FWD)
            snprintf(x->shape, sizeof x->shape, "rows %lld x %d", (long long)full.sz.rows * c->H, c->K);
        else if (op == OP_DECODE || op == OP_DECODE_CONV)
            snprintf(x->shape, sizeof x->shape, "B%d H%d HV%d K%d V%d%s", dc->B, c->H, c->HV, c->K, c->V,
                     op == OP_DECODE_CONV ? " W4" : "");
        else if ((op == OP_CONV_FWD || op == OP_CONV_BWD) && o.varlen)
            snprintf(x->shape, sizeof x->shape, "T%lld/%dseq D%d W%d", (long long)cc->T, o.varlen, cc->D, cc->W);
        else if (op == OP_CONV_FWD || op == OP_CONV_BWD)
            snprintf(x->shape, sizeof x->shape, "B%lld T%lld D%d W%d", (long long)cc->B, (long long)cc->T, cc->D,
                     cc->W);
        else if (op == OP_NORM_FWD || op == OP_NORM_BWD)
            snprintf(x->shape, sizeof x->shape, "rows %lld x V%d", (long long)nc->rows, nc->V);
        else if (o.varlen)
            snprintf(x->shape, sizeof x->shape, "T%lld/%dseq H%d HV%d K%d V%d", (long long)c->T, o.varlen, c->H,
                     c->HV, c->K, c->V);
        else
            snprintf(x->shape, sizeof x->shape, "B%lld T%lld H%d HV%d K%d V%d", (long long)c->B, (long long)c->T,
                     c->H, c->HV, c->K, c->V);

        if (o.no_check) { x->err = NAN; x->status = GDN_OK; }
        else x->err = check_op(op, &slice, &r, &lr, &x->status, &x->worst);
        if (x->status == GDN_OK) x->status = time_op(op, &full, o.warmup, o.reps, &x->ms);
        if (x->status != GDN_OK) {
            snprintf(x->message, sizeof x->message, "%s", gdn_last_error());
            x->ok = x->status == GDN_ERR_UNSUPPORTED;   /* not on this backend: skipped, not failed */
        } else {
            const double s = x->ms * 1e-3;
            x->gflops = s > 0 ? op_flops(op, &full) / s * 1e-9 : 0;
            x->gbps = s > 0 ? op_bytes(op, &full) / s * 1e-9 : 0;
            x->ok = o.no_check || (isfinite(x->err) && x->err <= x->bound);
            if (be->id == GDN_BACKEND_CPU && op_vs_copy(op))   /* of_copy stays NAN if a run fails */
                time_op_vs_copy(op, &full, 2 * o.reps + 1, threads, &x->of_copy);
        }
        all_ok &= x->ok;
        if (o.hash && x->status == GDN_OK && (op == OP_CHUNK_FWD || op == OP_CHUNK_FWDBWD || op == OP_RECURRENT_FWD ||
                                                    op == OP_CONV_FWD || op == OP_CONV_BWD))
            print_hashes(op, &full);
    }

    const double copy = be->id == GDN_BACKEND_CPU ? copy_gbps(threads) : NAN;
    if (o.json) print_json(&o, c, cs, &full, &slice, threads, copy, res, nres, all_ok);
    else print_table(&o, c, cs, &full, &slice, threads, copy, res, nres, all_ok);

    outputs_free(&full.out);
    outputs_free(&slice.out);
    inputs_free(&dev, be->release);
    inputs_free(&host, free);
    refs_free(&r);
    layer_inputs_free(&ldev, be->release);
    layer_inputs_free(&lhost, free);
    lrefs_free(&lr);
    if (cu_dev) be->release(cu_dev);
    if (cu_slice_dev) be->release(cu_slice_dev);
    free(cu); free(cu_slice);
    return all_ok ? 0 : 1;
}
