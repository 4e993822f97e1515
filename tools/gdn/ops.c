/* The ops and where they run: the op names, the backends (host memory for the
 * CPU, device memory for CUDA with -DGDN_CLI_CUDA), run_op() / prepare_op()
 * (one call of an op into the library), time_op(), and each op's FLOPs and
 * bytes from the models of tools/flops.h.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cli.h"

#ifdef GDN_CLI_CUDA
#include <cuda_runtime.h>
#endif

const char *op_name[N_OPS] = {"chunk_fwd", "chunk_fwd+bwd", "recurrent_fwd", "gate_fwd", "l2norm_fwd",
                              "decode_step", "decode_step+conv", "conv1d_fwd", "conv1d_bwd",
                              "rmsnorm_gated_fwd", "rmsnorm_gated_bwd"};

/* ---- backends: where the tensors live ------------------------------------ */

static void *cpu_alloc(size_t n) { return xmalloc(n); }
static void cpu_release(void *p) { free(p); }
static void cpu_copy(void *dst, const void *src, size_t n) { if (n) memcpy(dst, src, n); }
static void cpu_sync(void) {}
const backend cpu_backend = {"cpu", GDN_BACKEND_CPU, cpu_alloc, cpu_release, cpu_copy, cpu_copy, cpu_sync};

#ifdef GDN_CLI_CUDA
static void cuda_check(cudaError_t e, const char *what) {
    if (e != cudaSuccess) {
        fprintf(stderr, "gdn: %s: %s\n", what, cudaGetErrorString(e));
        exit(1);
    }
}
static void *cuda_alloc(size_t n) {
    void *p = NULL;
    cuda_check(cudaMalloc(&p, n ? n : 1), "cudaMalloc");
    return p;
}
static void cuda_release(void *p) { cudaFree(p); }
static void cuda_upload(void *d, const void *h, size_t n) {
    if (n) cuda_check(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice), "cudaMemcpy to device");
}
static void cuda_download(void *h, const void *d, size_t n) {
    if (n) cuda_check(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
}
static void cuda_sync(void) { cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }
const backend cuda_backend = {"cuda", GDN_BACKEND_CUDA, cuda_alloc, cuda_release, cuda_upload,
                              cuda_download, cuda_sync};
#endif

const backend *be;            /* the backend of the run (main sets it) */
const layer_in *lay_host;     /* host copy: the initial state pools (main sets it) */

/* a device copy of n bytes of host memory */
void *dev_copy(const void *host, size_t n) {   /* NULL for NULL: an input no chosen op reads */
    if (!host) return NULL;
    void *d = be->alloc(n);
    be->upload(d, host, n);
    return d;
}
/* a device buffer of n elements of dtype t filled with NaN (unwritten output fails) */
void *dev_nan(gdn_dtype t, size_t n) {
    const size_t bytes = n * gdn_dtype_size(t);
    void *h = xmalloc(bytes);
    for (size_t i = 0; i < n; i++) elem_store(t, h, i, NAN);
    void *d = dev_copy(h, bytes);
    free(h);
    return d;
}

/* ---- the ops ---------------------------------------------------------------- */

static gdn_status call_fwd(call *c, int recurrent, int keep) {
    const inputs *in = c->in;
    const int fused = (c->cfg.flags & GDN_GATE_FUSED) != 0;
    gdn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.q = in->q; a.k = in->k; a.v = in->v; a.g = in->g; a.beta = in->beta;
    a.A_log = fused ? in->A_log : NULL; a.dt_bias = fused ? in->dt_bias : NULL;
    a.h0 = in->h0; a.o = c->out.o; a.ht = c->out.ht;
    if (recurrent) return gdn_recurrent_fwd(&c->ex, &c->cfg, &a);
    if (keep) { a.saved = c->out.saved; a.saved_bytes = c->out.saved_bytes; }
    a.workspace = c->out.ws_fwd; a.workspace_bytes = c->out.ws_fwd_bytes;
    return gdn_chunk_fwd(&c->ex, &c->cfg, &a);
}

static gdn_status call_bwd(call *c) {
    const inputs *in = c->in;
    const outputs *o = &c->out;
    const int fused = (c->cfg.flags & GDN_GATE_FUSED) != 0;
    gdn_bwd_args a;
    memset(&a, 0, sizeof a);
    a.q = in->q; a.k = in->k; a.v = in->v; a.g = in->g; a.beta = in->beta;
    a.A_log = fused ? in->A_log : NULL; a.dt_bias = fused ? in->dt_bias : NULL; a.h0 = in->h0;
    a.saved = o->saved; a.saved_bytes = o->saved_bytes;
    a.dout = in->dout; a.dht = in->dht;
    a.dq = o->dq; a.dk = o->dk; a.dv = o->dv; a.dg = o->dg; a.dbeta = o->dbeta;
    a.dA_log = fused ? o->dA_log : NULL; a.ddt_bias = fused ? o->ddt_bias : NULL; a.dh0 = o->dh0;
    a.workspace = o->ws_bwd; a.workspace_bytes = o->ws_bwd_bytes;
    return gdn_chunk_bwd(&c->ex, &c->cfg, &a);
}

/* one run of an op, finished (synchronised) when it returns */
gdn_status run_op(int op, call *c) {
    gdn_status s = GDN_OK;
    switch (op) {
    case OP_CHUNK_FWD: s = call_fwd(c, 0, 0); break;
    case OP_CHUNK_FWDBWD:
        s = call_fwd(c, 0, 1);
        if (s == GDN_OK) s = call_bwd(c);
        break;
    case OP_RECURRENT_FWD: s = call_fwd(c, 1, 0); break;
    case OP_GATE_FWD:
        s = gdn_gate_fwd(&c->ex, c->sz.rows, c->cfg.HV, c->cfg.gate_dtype, c->in->g, c->in->A_log,
                         c->in->dt_bias, c->out.gate_g);
        break;
    case OP_L2NORM_FWD:
        s = gdn_l2norm_fwd(&c->ex, c->sz.rows * c->cfg.H, c->cfg.K, c->cfg.dtype, c->in->q, c->out.l2_y,
                           c->out.l2_rstd);
        break;
    case OP_DECODE:
    case OP_DECODE_CONV: {
        const layer_in *l = c->lin;
        gdn_decode_config dc = c->dec;
        gdn_decode_args a;
        memset(&a, 0, sizeof a);
        a.a = l->da; a.b = l->db; a.A_log = l->A_log; a.dt_bias = l->dt_bias;
        a.state = l->pool; a.slots = l->slots;
        if (op == OP_DECODE_CONV) {
            dc.conv_W = CONV_W;
            a.proj = l->mqkv; a.conv_state = l->cpool; a.conv_weight = l->cw; a.conv_bias = l->cb;
            a.o = c->out.dec2_o;
        } else {
            a.mixed_qkv = l->mqkv;
            a.o = c->out.dec_o;
        }
        s = gdn_decode_step(&c->ex, &dc, &a);
        break;
    }
    case OP_CONV_FWD: {
        const layer_in *l = c->lin;
        const gdn_conv1d_args a = {l->x, l->cw, l->cb, l->h0, c->out.cv_y, c->out.cv_ht};
        s = gdn_conv1d_fwd(&c->ex, &c->conv, &a);
        break;
    }
    case OP_CONV_BWD: {
        const layer_in *l = c->lin;
        const gdn_conv1d_bwd_args a = {l->x, l->cw, l->cb, l->h0, l->dy, l->dht,
                                       c->out.cv_dx, c->out.cv_dw, c->out.cv_db, c->out.cv_dh0};
        s = gdn_conv1d_bwd(&c->ex, &c->conv, &a);
        break;
    }
    case OP_NORM_FWD:
        s = gdn_rmsnorm_gated_fwd(&c->ex, &c->norm, c->lin->nx, c->lin->nz, c->lin->nw, c->out.nm_y,
                                  c->out.nm_rstd);
        break;
    case OP_NORM_BWD:
        s = gdn_rmsnorm_gated_bwd(&c->ex, &c->norm, c->lin->nx, c->lin->nz, c->lin->nw, c->out.nm_rstd,
                                  c->lin->ndy, c->out.nm_dx, c->out.nm_dz, c->out.nm_dw);
        break;
    }
    be->sync();
    return s;
}

/* before the checked run and before the timed runs: the decode steps start
 * from the initial state pools; the norm's backward reads the forward's rstd */
gdn_status prepare_op(int op, call *c) {
    if (op == OP_DECODE || op == OP_DECODE_CONV) {
        const int D = gdn_decode_dim(&c->dec);
        be->upload(c->lin->pool, lay_host->pool, sizeof(float) * (size_t)c->dec.num_slots * c->dec.HV * c->dec.K * c->dec.V);
        if (op == OP_DECODE_CONV)
            be->upload(c->lin->cpool, lay_host->cpool, sizeof(float) * (size_t)c->dec.num_slots * D * CONV_W);
        be->sync();
    }
    if (op == OP_NORM_BWD) return run_op(OP_NORM_FWD, c);
    return GDN_OK;
}

double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* median of reps timed runs after warmup runs */
gdn_status time_op(int op, call *c, int warmup, int reps, double *ms) {
    double *t = xmalloc(sizeof(double) * (size_t)reps);
    gdn_status s = prepare_op(op, c);
    for (int i = 0; i < warmup && s == GDN_OK; i++) s = run_op(op, c);
    for (int i = 0; i < reps && s == GDN_OK; i++) {
        const double t0 = now_ms();
        s = run_op(op, c);
        t[i] = now_ms() - t0;
    }
    if (s == GDN_OK) {
        qsort(t, (size_t)reps, sizeof(double), cmp_double);
        *ms = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
    }
    free(t);
    return s;
}

/* The op and the header's copy (64 MiB, more than the last-level cache:
 * each run of either starts from memory) alternate, pairs times; each
 * pair's ratio of the two rates (the op's bytes by op_bytes) is the op's
 * fraction of the copy's rate at that moment, and their median is printed.
 * Measured in the same moments, the ratio is not moved by the copy rate's
 * drift from run to run as two rates measured apart are (the op's own speed
 * can still move with the machine: bench/NOTES.md, stop 57). */
gdn_status time_op_vs_copy(int op, call *c, int pairs, int threads, double *frac) {
    const size_t n = (size_t)64 << 20;
    const double bytes = op_bytes(op, c);
    char *a = xmalloc(n), *b = xmalloc(n);
    double *r = xmalloc(sizeof(double) * (size_t)pairs);
    memset(a, 1, n);
    memset(b, 0, n);
    gdn_status s = prepare_op(op, c);
    for (int i = 0; i < pairs && s == GDN_OK; i++) {
        copy_on_threads(b, a, n, threads);
        const double t0 = now_ms();
        s = run_op(op, c);
        const double t1 = now_ms();
        copy_on_threads(b, a, n, threads);
        const double t2 = now_ms();
        r[i] = bytes / (t1 - t0) / (2.0 * n / (t2 - t1));
    }
    if (s == GDN_OK) {
        qsort(r, (size_t)pairs, sizeof(double), cmp_double);
        *frac = pairs % 2 ? r[pairs / 2] : 0.5 * (r[pairs / 2 - 1] + r[pairs / 2]);
    }
    free(a);
    free(b);
    free(r);
    return s;
}

double op_flops(int op, const call *c) {
    switch (op) {
    case OP_CHUNK_FWD: return gdn_flops_chunk_fwd(&c->cfg);
    case OP_CHUNK_FWDBWD: return gdn_flops_chunk_fwd(&c->cfg) + gdn_flops_chunk_bwd(&c->cfg);
    case OP_RECURRENT_FWD: return gdn_flops_recurrent_fwd(&c->cfg);
    case OP_GATE_FWD: return gdn_flops_gate_fwd(c->sz.rows, c->cfg.HV);
    case OP_L2NORM_FWD: return gdn_flops_l2norm_fwd(c->sz.rows * c->cfg.H, c->cfg.K);
    case OP_DECODE: return gdn_flops_decode_step(&c->dec);
    case OP_DECODE_CONV: {
        gdn_decode_config dc = c->dec;
        dc.conv_W = CONV_W;
        return gdn_flops_decode_step(&dc);
    }
    default: return 0;   /* no FLOP model */
    }
}

double op_bytes(int op, const call *c) {
    switch (op) {
    case OP_CHUNK_FWD: return gdn_bytes_chunk_fwd(&c->cfg, 1, 1);
    case OP_CHUNK_FWDBWD: return gdn_bytes_chunk_fwd(&c->cfg, 1, 1) + gdn_bytes_chunk_bwd(&c->cfg, 1, 1, 1);
    case OP_RECURRENT_FWD: return gdn_bytes_recurrent_fwd(&c->cfg, 1, 1);
    case OP_GATE_FWD: return gdn_bytes_gate_fwd(c->sz.rows, c->cfg.HV, c->cfg.gate_dtype);
    case OP_L2NORM_FWD: return gdn_bytes_l2norm_fwd(c->sz.rows * c->cfg.H, c->cfg.K, c->cfg.dtype, 1);
    case OP_DECODE: return gdn_bytes_decode_step(&c->dec, 1, 1, 1);
    case OP_DECODE_CONV: {
        gdn_decode_config dc = c->dec;
        dc.conv_W = CONV_W;
        return gdn_bytes_decode_step(&dc, 1, 1, 1);
    }
    case OP_CONV_FWD: return gdn_bytes_conv1d_fwd(&c->conv, 1, 1, 1);
    case OP_CONV_BWD: return gdn_bytes_conv1d_bwd(&c->conv, 1, 1, 1, 1, 1);
    case OP_NORM_FWD: return gdn_bytes_rmsnorm_gated_fwd(&c->norm, 1);
    default: return gdn_bytes_rmsnorm_gated_bwd(&c->norm, 1);
    }
}
