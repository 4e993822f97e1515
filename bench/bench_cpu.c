/* CPU benchmark: gdn's chunk forward, forward+backward and recurrent forward
 * at the shapes of DESIGN.md §7 scaled for a small CPU, beside OpenBLAS sgemm
 * measured in the same run with the same thread count (DESIGN.md §7: "report
 * GFLOP/s against the same machine's OpenBLAS sgemm rate").
 *
 *   sgemm 1024^3               the machine's matmul rate: the denominator
 *   sgemm 64x128x128 batch     the chunk path's typical product (U = Wk S for
 *                              one chunk and head), a batch of them spread over
 *                              the threads, one thread each: a closer ceiling
 *
 * Every time is the median of --reps runs after one warm-up. FLOPs come from
 * the model in tools/flops.h (a multiply-add is 2 FLOPs).
 *
 * usage: gdn_bench_cpu [--threads N] [--reps N] [--only NAME]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cblas.h>
#include "gdn.h"
#include "flops.h"
#ifdef _OPENMP
#include <omp.h>
#endif

/* OpenBLAS's own thread control; declared here so that any cblas.h will do */
void openblas_set_num_threads(int n);

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *t, int n) {
    qsort(t, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "gdn_bench_cpu: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

/* ---- random inputs ---- */

static uint64_t rng_state = 0x1234567;
static double rng_uniform(void) {   /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return (double)((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
}
static double rng_normal(void) {
    const double u1 = rng_uniform(), u2 = rng_uniform();
    return sqrt(-2.0 * log(u1 + 0x1.0p-60)) * cos(6.283185307179586 * u2);
}

static uint16_t to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}
static uint16_t to_f16(float f) {   /* inputs here are normal-range: no inf/NaN handling needed */
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax < 0x38800000u) {
        float a;
        memcpy(&a, &ax, 4);
        return (uint16_t)(sign | (uint32_t)lrintf(a * 16777216.0f));
    }
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    return (uint16_t)(sign | ((ax - 0x38000000u + 0x0fffu + ((ax >> 13) & 1u)) >> 13));
}
static void store(gdn_dtype t, void *p, size_t i, float f) {
    if (t == GDN_BF16) ((uint16_t *)p)[i] = to_bf16(f);
    else if (t == GDN_F16) ((uint16_t *)p)[i] = to_f16(f);
    else ((float *)p)[i] = f;
}

/* ---- sgemm ---- */

static double bench_sgemm_square(int n, int threads, int reps) {
    float *A = xmalloc(sizeof(float) * (size_t)n * n), *B = xmalloc(sizeof(float) * (size_t)n * n),
          *C = xmalloc(sizeof(float) * (size_t)n * n);
    for (size_t i = 0; i < (size_t)n * n; i++) { A[i] = (float)rng_normal(); B[i] = (float)rng_normal(); }
    openblas_set_num_threads(threads);
    double *t = xmalloc(sizeof(double) * (size_t)reps);
    for (int r = -1; r < reps; r++) {
        const double t0 = now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, A, n, B, n, 0.f, C, n);
        if (r >= 0) t[r] = now_s() - t0;
    }
    const double s = median(t, reps);
    free(A); free(B); free(C); free(t);
    return 2.0 * n * n * (double)n / s * 1e-9;
}

/* nb independent [m,k] x [k,n] products, spread over the threads with one
 * OpenBLAS thread each (the way the chunk path runs its products) */
static double bench_sgemm_batch(int m, int n, int k, int nb, int threads, int reps) {
    float *A = xmalloc(sizeof(float) * (size_t)nb * m * k), *B = xmalloc(sizeof(float) * (size_t)nb * k * n),
          *C = xmalloc(sizeof(float) * (size_t)nb * m * n);
    for (size_t i = 0; i < (size_t)nb * m * k; i++) A[i] = (float)rng_normal();
    for (size_t i = 0; i < (size_t)nb * k * n; i++) B[i] = (float)rng_normal();
    openblas_set_num_threads(1);
    double *t = xmalloc(sizeof(double) * (size_t)reps);
    for (int r = -1; r < reps; r++) {
        const double t0 = now_s();
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int b = 0; b < nb; b++)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.f, A + (size_t)b * m * k, k,
                        B + (size_t)b * k * n, n, 0.f, C + (size_t)b * m * n, n);
        if (r >= 0) t[r] = now_s() - t0;
    }
    const double s = median(t, reps);
    openblas_set_num_threads(threads);
    free(A); free(B); free(C); free(t);
    return 2.0 * m * n * (double)k * nb / s * 1e-9;
}

/* ---- gdn ---- */

typedef struct shape {
    const char *name;
    int64_t B, T;
    int H, HV, K, V;
    gdn_dtype dtype;
    unsigned flags;
    int nseq;           /* > 0: ragged varlen over T tokens, B = 1 */
} shape;

#define ALL_IN_KERNEL (GDN_QK_L2NORM | GDN_GATE_FUSED | GDN_BETA_SIGMOID)

/* DESIGN.md §7 shapes, scaled for a 2-core CPU */
static const shape shapes[] = {
    {"qwen3next", 1, 4096, 4, 8, 128, 128, GDN_BF16, ALL_IN_KERNEL, 0},
    {"long1", 1, 16384, 2, 8, 128, 128, GDN_BF16, ALL_IN_KERNEL, 0},
    {"varlen", 1, 8192, 4, 8, 128, 128, GDN_BF16, ALL_IN_KERNEL, 8},
    {"d256", 2, 2048, 4, 4, 256, 256, GDN_F16, 0, 0},
};

typedef struct problem {
    gdn_config cfg;
    gdn_exec ex;
    int64_t *cu;
    void *q, *k, *v, *g, *beta, *o, *dout, *dq, *dk, *dv, *dg, *dbeta, *saved, *wsf, *wsb;
    float *A_log, *dt_bias, *h0, *ht, *dht, *dh0, *dA_log, *ddt_bias;
    size_t saved_bytes, wsf_bytes, wsb_bytes;
} problem;

static void problem_init(problem *p, const shape *s, int threads) {
    memset(p, 0, sizeof *p);
    gdn_config *c = &p->cfg;
    c->B = s->B; c->T = s->T; c->H = s->H; c->HV = s->HV; c->K = s->K; c->V = s->V;
    c->dtype = s->dtype; c->gate_dtype = GDN_F32; c->flags = s->flags;
    p->ex.backend = GDN_BACKEND_CPU; p->ex.threads = threads;
    int64_t N = s->B;
    if (s->nseq) {
        /* ragged lengths: weights uniform in [0.2, 1.8] */
        p->cu = xmalloc(sizeof(int64_t) * (size_t)(s->nseq + 1));
        double *w = xmalloc(sizeof(double) * (size_t)s->nseq), sum = 0, acc = 0;
        for (int i = 0; i < s->nseq; i++) { w[i] = 0.2 + 1.6 * rng_uniform(); sum += w[i]; }
        p->cu[0] = 0;
        for (int i = 0; i < s->nseq; i++) {
            acc += w[i];
            p->cu[i + 1] = i == s->nseq - 1 ? s->T : (int64_t)llround(acc / sum * (double)s->T);
        }
        free(w);
        c->cu_seqlens = p->cu; c->num_seqs = s->nseq; N = s->nseq;
    }
    const size_t rows = (size_t)(s->B * s->T), nqk = rows * s->H * s->K, nv = rows * s->HV * s->V,
                 ng = rows * s->HV, nst = (size_t)N * s->HV * s->K * s->V, ds = gdn_dtype_size(s->dtype);
    p->q = xmalloc(nqk * ds); p->k = xmalloc(nqk * ds); p->v = xmalloc(nv * ds); p->dout = xmalloc(nv * ds);
    p->o = xmalloc(nv * ds); p->dq = xmalloc(nqk * ds); p->dk = xmalloc(nqk * ds); p->dv = xmalloc(nv * ds);
    p->g = xmalloc(ng * 4); p->beta = xmalloc(ng * 4); p->dg = xmalloc(ng * 4); p->dbeta = xmalloc(ng * 4);
    p->A_log = xmalloc(4 * (size_t)s->HV); p->dt_bias = xmalloc(4 * (size_t)s->HV);
    p->dA_log = xmalloc(4 * (size_t)s->HV); p->ddt_bias = xmalloc(4 * (size_t)s->HV);
    p->h0 = xmalloc(4 * nst); p->ht = xmalloc(4 * nst); p->dht = xmalloc(4 * nst); p->dh0 = xmalloc(4 * nst);
    const int l2 = (s->flags & GDN_QK_L2NORM) != 0;
    for (size_t i = 0; i < nqk; i++) store(s->dtype, p->q, i, (float)rng_normal());
    /* without in-kernel l2norm, k rows are given with norm 0.99 */
    double *row = xmalloc(sizeof(double) * (size_t)s->K);
    for (size_t r = 0; r < nqk / (size_t)s->K; r++) {
        double ss = 0;
        for (int i = 0; i < s->K; i++) { row[i] = rng_normal(); ss += row[i] * row[i]; }
        for (int i = 0; i < s->K; i++)
            store(s->dtype, p->k, r * s->K + i, (float)(l2 ? row[i] : 0.99 * row[i] / sqrt(ss)));
    }
    free(row);
    for (size_t i = 0; i < nv; i++) store(s->dtype, p->v, i, (float)rng_normal());
    for (size_t i = 0; i < nv; i++) store(s->dtype, p->dout, i, (float)rng_normal());
    for (size_t i = 0; i < ng; i++) {
        const double x = rng_normal();
        ((float *)p->g)[i] = (float)((s->flags & GDN_GATE_FUSED) ? x : -log1p(exp(-x)));  /* raw a or logsigmoid */
        ((float *)p->beta)[i] = (float)((s->flags & GDN_BETA_SIGMOID) ? rng_normal() : rng_uniform());
    }
    for (int j = 0; j < s->HV; j++) {
        p->A_log[j] = (float)log(1.0 + 15.0 * rng_uniform());
        p->dt_bias[j] = (float)(0.5 * rng_normal());
    }
    for (size_t i = 0; i < nst; i++) { p->h0[i] = (float)rng_normal(); p->dht[i] = (float)rng_normal(); }
    p->saved_bytes = gdn_chunk_saved_size(c);
    p->wsf_bytes = gdn_chunk_fwd_workspace_size(&p->ex, c);
    p->wsb_bytes = gdn_chunk_bwd_workspace_size(&p->ex, c);
    p->saved = xmalloc(p->saved_bytes); p->wsf = xmalloc(p->wsf_bytes); p->wsb = xmalloc(p->wsb_bytes);
}

static void problem_free(problem *p) {
    void *b[] = {p->cu, p->q, p->k, p->v, p->g, p->beta, p->o, p->dout, p->dq, p->dk, p->dv, p->dg, p->dbeta,
                 p->saved, p->wsf, p->wsb, p->A_log, p->dt_bias, p->h0, p->ht, p->dht, p->dh0, p->dA_log,
                 p->ddt_bias};
    for (size_t i = 0; i < sizeof b / sizeof *b; i++) free(b[i]);
}

enum { OP_FWD, OP_FWDBWD, OP_RECURRENT, N_OPS };
static const char *op_names[N_OPS] = {"chunk_fwd", "chunk_fwd+bwd", "recurrent_fwd"};

static gdn_status run_op(problem *p, int op) {
    const int fused = (p->cfg.flags & GDN_GATE_FUSED) != 0;
    gdn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.q = p->q; a.k = p->k; a.v = p->v; a.g = p->g; a.beta = p->beta;
    a.A_log = fused ? p->A_log : NULL; a.dt_bias = fused ? p->dt_bias : NULL;
    a.h0 = p->h0; a.o = p->o; a.ht = p->ht;
    if (op == OP_RECURRENT) return gdn_recurrent_fwd(&p->ex, &p->cfg, &a);
    a.workspace = p->wsf; a.workspace_bytes = p->wsf_bytes;
    if (op == OP_FWDBWD) { a.saved = p->saved; a.saved_bytes = p->saved_bytes; }
    gdn_status s = gdn_chunk_fwd(&p->ex, &p->cfg, &a);
    if (s != GDN_OK || op == OP_FWD) return s;
    gdn_bwd_args b;
    memset(&b, 0, sizeof b);
    b.q = p->q; b.k = p->k; b.v = p->v; b.g = p->g; b.beta = p->beta;
    b.A_log = a.A_log; b.dt_bias = a.dt_bias; b.h0 = p->h0;
    b.saved = p->saved; b.saved_bytes = p->saved_bytes; b.dout = p->dout; b.dht = p->dht;
    b.dq = p->dq; b.dk = p->dk; b.dv = p->dv; b.dg = p->dg; b.dbeta = p->dbeta;
    b.dA_log = fused ? p->dA_log : NULL; b.ddt_bias = fused ? p->ddt_bias : NULL; b.dh0 = p->dh0;
    b.workspace = p->wsb; b.workspace_bytes = p->wsb_bytes;
    return gdn_chunk_bwd(&p->ex, &p->cfg, &b);
}

static double op_flops(const problem *p, int op) {
    if (op == OP_FWD) return gdn_flops_chunk_fwd(&p->cfg);
    if (op == OP_FWDBWD) return gdn_flops_chunk_fwd(&p->cfg) + gdn_flops_chunk_bwd(&p->cfg);
    return gdn_flops_recurrent_fwd(&p->cfg);
}

int main(int argc, char **argv) {
    int threads = 0, reps = 5;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else {
            fprintf(stderr, "usage: gdn_bench_cpu [--threads N] [--reps N] [--only qwen3next|long1|varlen|d256]\n");
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    if (threads <= 0) {
#ifdef _OPENMP
        threads = omp_get_max_threads();
#else
        threads = 1;
#endif
    }

    /* sgemm before and after the gdn runs: the larger is the 100 %, the two
     * together show how steady the machine was */
    const double sq = bench_sgemm_square(1024, threads, 40);
    const double bt = bench_sgemm_batch(64, 128, 128, 512, threads, 20);
    printf("gdn CPU bench, %d threads, median of %d after 1 warm-up\n", threads, reps);
    printf("OpenBLAS sgemm 1024x1024x1024            %8.1f GFLOP/s\n", sq);
    printf("OpenBLAS sgemm 64x128x128, batch of 512  %8.1f GFLOP/s   (%.0f%% of sgemm 1024)\n", bt, 100 * bt / sq);
    fflush(stdout);
    typedef struct row {
        char shape[16], desc[96], message[512];
        int op;
        gdn_status status;
        double ms, gflops;
    } row;
    row rows[sizeof shapes / sizeof *shapes * N_OPS];
    int nrows = 0, failed = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const shape *s = &shapes[si];
        if (only && strcmp(only, s->name)) continue;
        problem p;
        problem_init(&p, s, threads);
        char desc[96];
        if (s->nseq)
            snprintf(desc, sizeof desc, "T%lld/%dseq H%d HV%d K%d V%d %s", (long long)s->T, s->nseq, s->H, s->HV,
                     s->K, s->V, gdn_dtype_name(s->dtype));
        else
            snprintf(desc, sizeof desc, "B%lld T%lld H%d HV%d K%d V%d %s", (long long)s->B, (long long)s->T, s->H,
                     s->HV, s->K, s->V, gdn_dtype_name(s->dtype));
        for (int op = 0; op < N_OPS; op++) {
            double *t = xmalloc(sizeof(double) * (size_t)reps);
            gdn_status st = run_op(&p, op);  /* warm-up */
            for (int r = 0; r < reps && st == GDN_OK; r++) {
                const double t0 = now_s();
                st = run_op(&p, op);
                t[r] = now_s() - t0;
            }
            row *w = &rows[nrows++];
            snprintf(w->shape, sizeof w->shape, "%s", s->name);
            snprintf(w->desc, sizeof w->desc, "%s", desc);
            w->op = op;
            w->status = st;
            if (st != GDN_OK) {
                snprintf(w->message, sizeof w->message, "%s", gdn_last_error());
                failed = 1;
            } else {
                w->ms = median(t, reps) * 1e3;
                w->gflops = op_flops(&p, op) / w->ms * 1e-6;
            }
            fprintf(stderr, ".");
            free(t);
        }
        problem_free(&p);
    }
    fprintf(stderr, "\n");
    const double sq2 = bench_sgemm_square(1024, threads, 40), best = sq > sq2 ? sq : sq2;
    printf("OpenBLAS sgemm 1024x1024x1024, again     %8.1f GFLOP/s   (%% sgemm below: of %.1f, the larger)\n\n",
           sq2, best);
    printf("%-11s %-38s %-14s %10s %9s %9s\n", "shape", "config", "op", "ms", "GFLOP/s", "% sgemm");
    for (int i = 0; i < nrows; i++) {
        const row *w = &rows[i];
        if (w->status != GDN_OK)
            printf("%-11s %-38s %-14s FAILED: %s: %s\n", w->shape, w->desc, op_names[w->op],
                   gdn_status_string(w->status), w->message);
        else
            printf("%-11s %-38s %-14s %10.2f %9.1f %8.1f%%\n", w->shape, w->desc, op_names[w->op], w->ms, w->gflops,
                   100 * w->gflops / best);
    }
    return failed;
}
