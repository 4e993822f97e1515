/* gdn — run every op of the library on one shape, time it, and check it
 * against the float64 reference.
 *
 * For each op: the median time of a few runs after warm-up on the full shape,
 * the rates from the FLOP and byte models of tools/flops.h, and the relative
 * error ||out - ref|| / ||ref|| against the float64 reference on a slice of
 * the same call (the first sequence, its first min(T, 256) tokens; with
 * --varlen every sequence clipped to the first 256 tokens; the decode step on
 * its first rows). The gated delta rule ops are checked against src/ref; the
 * GDN layer pieces (decode step, conv1d, gated RMSNorm) against plain double
 * loops below, written from the math in gdn.h. Exits 1 when an error is over
 * the bound of DESIGN.md §5 or a call fails, 2 on bad flags.
 *
 * The tensors live where the backend wants them: host memory for the CPU,
 * device memory for CUDA (built in with -DGDN_CLI_CUDA, linking cudart).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "gdn.h"
#include "ref/ref.h"
#include "flops.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef GDN_CLI_CUDA
#include <cuda_runtime.h>
#endif

#define SLICE_T 256

/* the GDN layer pieces */
#define DECODE_B 32            /* default rows of the decode step                  */
#define DECODE_CHECK_ROWS 8    /* rows of the decode step checked on the slice     */
#define CONV_W 4               /* conv1d width, here and in decode_step+conv       */
#define NORM_EPS 1e-6f         /* gated RMSNorm eps                                */

/* ---- the ops -------------------------------------------------------------- */

enum { OP_CHUNK_FWD, OP_CHUNK_FWDBWD, OP_RECURRENT_FWD, OP_GATE_FWD, OP_L2NORM_FWD,
       OP_DECODE, OP_DECODE_CONV, OP_CONV_FWD, OP_CONV_BWD, OP_NORM_FWD, OP_NORM_BWD, N_OPS };
static const char *op_name[N_OPS] = {"chunk_fwd", "chunk_fwd+bwd", "recurrent_fwd", "gate_fwd", "l2norm_fwd",
                                     "decode_step", "decode_step+conv", "conv1d_fwd", "conv1d_bwd",
                                     "rmsnorm_gated_fwd", "rmsnorm_gated_bwd"};
static int op_is_layer(int op) { return op >= OP_DECODE; }
static int op_has_grads(int op) { return op == OP_CHUNK_FWDBWD || op == OP_CONV_BWD || op == OP_NORM_BWD; }
/* conv1d and the norm have no FLOP model: GB/s only */
static int op_has_flops(int op) { return !(op >= OP_CONV_FWD && op <= OP_NORM_BWD); }

/* ---- options -------------------------------------------------------------- */

typedef struct opts {
    int64_t B, T;
    int H, HV, K, V;
    gdn_dtype dtype, gate_dtype;
    int gate_dtype_set;
    int threads, seq_split;
    unsigned flags;
    int varlen;                 /* number of ragged sequences, 0 = none */
    int reps, warmup;
    int reps_set, T_set, B_set;
    gdn_backend backend;
    int backend_set;
    int json, quick;
    uint64_t seed;
    int decode_B;               /* rows of the decode step */
    unsigned ops;               /* bit op: run op */
} opts;

static void usage(FILE *f) {
    fprintf(f,
"usage: gdn [flags]\n"
"\n"
"Runs each op of the gdn library on one shape. For each it prints the median\n"
"time of --reps runs after --warmup runs, GFLOP/s and GB/s (FLOP and byte\n"
"models of tools/flops.h; bytes = every input read once, every output written\n"
"once), and the relative error ||out - ref|| / ||ref|| against a float64\n"
"reference on a slice of the call (first sequence, first min(T, 256) tokens;\n"
"with --varlen all sequences clipped to the first 256 tokens), the largest\n"
"over all outputs or gradients of the op. Exit status: 0 all within the bounds\n"
"of DESIGN.md section 5 (f32: 1e-5 fwd, 1e-4 grads; bf16/f16: 5e-3 fwd, 1e-2\n"
"grads), 1 an error over its bound or a failed call, 2 bad flags.\n"
"\n"
"ops (all by default; pick with --ops)\n"
"  chunk_fwd          chunked forward, q k v [B,T,..], h0 -> o, ht\n"
"  chunk_fwd+bwd      chunked forward keeping what backward needs, then the\n"
"                     backward: dq dk dv, da/dg, db/dbeta, dA_log, ddt_bias, dh0\n"
"  recurrent_fwd      token-by-token forward, same inputs and outputs\n"
"  gate_fwd           g = -exp(A_log)*softplus(a + dt_bias) over [B*T, HV]\n"
"  l2norm_fwd         L2 norm of q's rows [B*T*H, K]\n"
"  decode_step        fused decode step: --decode-B rows (default 32), one token\n"
"                     each, mixed_qkv [rows, 2*H*K + HV*V] in the dtype, raw a, b\n"
"                     in the dtype, fp32 state pool of 2*rows slots (rows picked\n"
"                     through slots), q/k l2norm (unless --no-l2norm), o and the\n"
"                     state in place; checked on the first 8 rows (o, state rows\n"
"                     written, every other pool row unchanged)\n"
"  decode_step+conv   the same from the raw projection: conv1d update (W=4,\n"
"                     bias, SiLU) of an fp32 conv state pool first\n"
"  conv1d_fwd         causal depthwise conv1d over x [B,T,D], D = 2*H*K + HV*V,\n"
"                     W=4, bias, SiLU, h0 -> y, ht (cu_seqlens with --varlen)\n"
"  conv1d_bwd         its backward alone: dx, dweight, dbias, dh0 from dy, dht\n"
"  rmsnorm_gated_fwd  gated RMSNorm over rows = B*T*HV of V, SiLU gate, eps\n"
"                     1e-6, f32 weight -> y, rstd\n"
"  rmsnorm_gated_bwd  its backward alone (rstd from the forward): dx, dz, dw\n"
"decode_step, conv1d and rmsnorm are memory bound: their rate is GB/s; conv1d\n"
"and rmsnorm have no FLOP model (GFLOP/s '-').\n"
"\n"
"Default: B=1 T=4096 H=4 HV=8 K=V=128 bf16, q/k l2norm, fused gate and beta\n"
"sigmoid in the kernel, with h0 and ht (a Qwen3-Next-like layer scaled for a\n"
"small CPU).\n"
"\n"
"shape\n"
"  --B N              batch rows (default 1)\n"
"  --T N              tokens per row, >= 0 (default 4096; 256 with --quick)\n"
"  --H N              q/k heads (default 4)\n"
"  --HV N             value heads, a multiple of H (default 8)\n"
"  --K N, --V N       q/k and value head dims, 1..256 (default 128)\n"
"  --varlen N         N ragged sequences over the T tokens (cu_seqlens, B = 1)\n"
"  --decode-B N       rows of decode_step and decode_step+conv (default 32)\n"
"types and options\n"
"  --dtype f32|bf16|f16       q, k, v, o and their gradients (default bf16)\n"
"  --gate-dtype f32|bf16|f16  g/a and beta/b: f32 or the dtype (default f32)\n"
"  --no-l2norm        q, k are given normalized (no in-kernel L2 norm)\n"
"  --no-gate          g is the log decay itself (no fused -exp(A_log)*softplus)\n"
"  --no-beta-sigmoid  beta is given directly (no in-kernel sigmoid)\n"
"  --v-first          states h0, ht are [N,HV,V,K] instead of [N,HV,K,V]\n"
"execution\n"
"  --backend cpu|cuda where the ops run (default: cuda when a device is visible, else cpu;\n"
"                     ops the backend does not have are listed as skipped)\n"
"  --threads N        CPU threads, 0 = OpenMP's default (default 0)\n"
"  --seq-split N      chunk path: segments per sequence, 0 = automatic, 1 = never\n"
"  --reps N           timed runs, the median is reported (default 5)\n"
"  --warmup N         untimed runs before them (default 1)\n"
"  --seed N           random inputs (default 1)\n"
"  --quick            T=256 (unless --T is given), 1 rep, no warm-up\n"
"  --ops LIST         only these ops, comma-separated names from the list above\n"
"                     (e.g. --ops decode_step,conv1d_fwd); default all\n"
"output\n"
"  --json             the same results as one JSON object on stdout\n"
"  --help             this text\n");
}

static int bad(const char *fmt, const char *a, const char *b) {
    fprintf(stderr, "gdn: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n(gdn --help lists the flags)\n");
    return 2;
}

static int parse_int(const char *name, const char *s, long long lo, long long hi, long long *out) {
    char *end = NULL;
    if (!s || !*s) return bad("%s needs a value", name, "");
    long long x = strtoll(s, &end, 10);
    if (*end) return bad("%s: '%s' is not an integer", name, s);
    if (x < lo || x > hi) {
        char range[96];
        snprintf(range, sizeof range, "'%s' is out of range %lld..%lld", s, lo, hi);
        return bad("%s: %s", name, range);
    }
    *out = x;
    return 0;
}

static int parse_dtype(const char *name, const char *s, gdn_dtype *t) {
    if (!s) return bad("%s needs a value", name, "");
    if (!strcmp(s, "f32") || !strcmp(s, "fp32") || !strcmp(s, "float32")) *t = GDN_F32;
    else if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16")) *t = GDN_BF16;
    else if (!strcmp(s, "f16") || !strcmp(s, "fp16") || !strcmp(s, "float16")) *t = GDN_F16;
    else return bad("%s: '%s' is not one of f32, bf16, f16", name, s);
    return 0;
}

/* comma-separated op names -> bit set */
static int parse_ops(const char *s, unsigned *ops) {
    *ops = 0;
    if (!*s) return bad("--ops needs at least one op name%s%s", "", "");
    const char *p = s;
    while (1) {
        const char *e = strchr(p, ',');
        const size_t n = e ? (size_t)(e - p) : strlen(p);
        int found = -1;
        for (int op = 0; op < N_OPS; op++)
            if (strlen(op_name[op]) == n && !strncmp(op_name[op], p, n)) found = op;
        if (found < 0) {
            char word[80], known[400] = "";
            snprintf(word, sizeof word, "%.*s", (int)(n < 60 ? n : 60), p);
            for (int op = 0; op < N_OPS; op++) {
                strcat(known, op_name[op]);
                if (op + 1 < N_OPS) strcat(known, ", ");
            }
            return bad("--ops: '%s' is not an op; the ops are %s", word, known);
        }
        *ops |= 1u << found;
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

/* returns 0, 2 (bad flags) or -1 (--help printed) */
static int parse(int argc, char **argv, opts *o) {
    memset(o, 0, sizeof *o);
    o->B = 1; o->T = 4096; o->H = 4; o->HV = 8; o->K = 128; o->V = 128;
    o->dtype = GDN_BF16; o->gate_dtype = GDN_F32;
    o->flags = GDN_QK_L2NORM | GDN_GATE_FUSED | GDN_BETA_SIGMOID;
    o->reps = 5; o->warmup = 1; o->seed = 1; o->backend = GDN_BACKEND_CPU;
    o->decode_B = DECODE_B; o->ops = (1u << N_OPS) - 1;
    for (int i = 1; i < argc; i++) {
        char name[64];
        const char *arg = argv[i], *val = NULL, *eq = strchr(arg, '=');
        if (strncmp(arg, "--", 2) != 0 && strcmp(arg, "-h") != 0) return bad("unexpected argument '%s'%s", arg, "");
        if (eq) {
            snprintf(name, sizeof name, "%.*s", (int)(eq - arg), arg);
            val = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", arg);
        }
        /* switches */
        static const char *switches[] = {"--help", "-h", "--no-l2norm", "--no-gate", "--no-beta-sigmoid",
                                         "--v-first", "--json", "--quick"};
        int is_switch = 0;
        for (size_t s = 0; s < sizeof switches / sizeof *switches; s++)
            if (!strcmp(name, switches[s])) is_switch = 1;
        if (is_switch) {
            if (val) return bad("%s takes no value (got '%s')", name, val);
            if (!strcmp(name, "--help") || !strcmp(name, "-h")) { usage(stdout); return -1; }
            if (!strcmp(name, "--no-l2norm")) o->flags &= ~(unsigned)GDN_QK_L2NORM;
            if (!strcmp(name, "--no-gate")) o->flags &= ~(unsigned)GDN_GATE_FUSED;
            if (!strcmp(name, "--no-beta-sigmoid")) o->flags &= ~(unsigned)GDN_BETA_SIGMOID;
            if (!strcmp(name, "--v-first")) o->flags |= GDN_STATE_V_FIRST;
            if (!strcmp(name, "--json")) o->json = 1;
            if (!strcmp(name, "--quick")) o->quick = 1;
            continue;
        }
        static const char *valued[] = {"--B", "--T", "--H", "--HV", "--K", "--V", "--varlen", "--threads",
                                       "--seq-split", "--reps", "--warmup", "--seed", "--dtype", "--gate-dtype",
                                       "--backend", "--decode-B", "--ops"};
        int known = 0;
        for (size_t s = 0; s < sizeof valued / sizeof *valued; s++)
            if (!strcmp(name, valued[s])) known = 1;
        if (!known) return bad("unknown flag '%s'%s", name, "");
        if (!val) {
            if (i + 1 >= argc) return bad("%s needs a value", name, "");
            val = argv[++i];
        }
        long long x = 0;
        int rc = 0;
        if (!strcmp(name, "--B")) { rc = parse_int(name, val, 1, 1 << 20, &x); o->B = x; o->B_set = 1; }
        else if (!strcmp(name, "--T")) { rc = parse_int(name, val, 0, 1LL << 32, &x); o->T = x; o->T_set = 1; }
        else if (!strcmp(name, "--H")) { rc = parse_int(name, val, 1, 4096, &x); o->H = (int)x; }
        else if (!strcmp(name, "--HV")) { rc = parse_int(name, val, 1, 4096, &x); o->HV = (int)x; }
        else if (!strcmp(name, "--K")) { rc = parse_int(name, val, 1, 256, &x); o->K = (int)x; }
        else if (!strcmp(name, "--V")) { rc = parse_int(name, val, 1, 256, &x); o->V = (int)x; }
        else if (!strcmp(name, "--varlen")) { rc = parse_int(name, val, 1, 1 << 20, &x); o->varlen = (int)x; }
        else if (!strcmp(name, "--threads")) { rc = parse_int(name, val, 0, 4096, &x); o->threads = (int)x; }
        else if (!strcmp(name, "--seq-split")) { rc = parse_int(name, val, 0, 1 << 20, &x); o->seq_split = (int)x; }
        else if (!strcmp(name, "--reps")) { rc = parse_int(name, val, 1, 100000, &x); o->reps = (int)x; o->reps_set = 1; }
        else if (!strcmp(name, "--warmup")) { rc = parse_int(name, val, 0, 100000, &x); o->warmup = (int)x; }
        else if (!strcmp(name, "--seed")) { rc = parse_int(name, val, 0, (long long)(~0ULL >> 1), &x); o->seed = (uint64_t)x; }
        else if (!strcmp(name, "--dtype")) rc = parse_dtype(name, val, &o->dtype);
        else if (!strcmp(name, "--gate-dtype")) { rc = parse_dtype(name, val, &o->gate_dtype); o->gate_dtype_set = 1; }
        else if (!strcmp(name, "--decode-B")) { rc = parse_int(name, val, 1, 1 << 20, &x); o->decode_B = (int)x; }
        else if (!strcmp(name, "--ops")) rc = parse_ops(val, &o->ops);
        else if (!strcmp(name, "--backend")) {
            o->backend_set = 1;
            if (!strcmp(val, "cpu")) o->backend = GDN_BACKEND_CPU;
            else if (!strcmp(val, "cuda")) o->backend = GDN_BACKEND_CUDA;
            else rc = bad("--backend: '%s' is not one of cpu, cuda%s", val, "");
        }
        if (rc) return rc;
    }
    if (o->quick) {
        if (!o->T_set) o->T = 256;
        if (!o->reps_set) o->reps = 1;
        o->warmup = 0;
    }
    char buf[160];
    if (o->HV % o->H != 0) {
        snprintf(buf, sizeof buf, "HV (%d) is not a multiple of H (%d)", o->HV, o->H);
        return bad("%s%s", buf, "");
    }
    if (o->gate_dtype != GDN_F32 && o->gate_dtype != o->dtype) {
        snprintf(buf, sizeof buf, "--gate-dtype %s must be f32 or the --dtype (%s)", gdn_dtype_name(o->gate_dtype),
                 gdn_dtype_name(o->dtype));
        return bad("%s%s", buf, "");
    }
    if (o->varlen && o->B != 1) {
        snprintf(buf, sizeof buf, "--varlen needs B = 1 (got --B %lld)", (long long)o->B);
        return bad("%s%s", buf, "");
    }
    return 0;
}

/* ---- dtypes and random numbers ------------------------------------------- */

static uint16_t f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    x += 0x7fffu + ((x >> 16) & 1u);   /* round to nearest even */
    return (uint16_t)(x >> 16);
}
static float bf16_to_f32(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}
static uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);       /* >= 65520 rounds to inf */
    if (ax < 0x38800000u) {                                          /* below 2^-14: subnormal */
        float a;
        memcpy(&a, &ax, 4);
        return (uint16_t)(sign | (uint32_t)lrintf(a * 16777216.0f)); /* exact scaling, nearest even */
    }
    const uint32_t r = ax - 0x38000000u + 0x0fffu + ((ax >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}
static float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        const float f = ldexpf((float)m, -24);
        return sign ? -f : f;
    }
    const uint32_t x = e == 31 ? sign | 0x7f800000u | (m << 13) : sign | ((e + 112) << 23) | (m << 13);
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* store f rounded to dtype t as element i of p; returns the stored value */
static double store(gdn_dtype t, void *p, size_t i, float f) {
    switch (t) {
    case GDN_BF16: ((uint16_t *)p)[i] = f32_to_bf16(f); return bf16_to_f32(((uint16_t *)p)[i]);
    case GDN_F16: ((uint16_t *)p)[i] = f32_to_f16(f); return f16_to_f32(((uint16_t *)p)[i]);
    default: ((float *)p)[i] = f; return f;
    }
}
static double get(gdn_dtype t, const void *p, size_t i) {
    switch (t) {
    case GDN_BF16: return bf16_to_f32(((const uint16_t *)p)[i]);
    case GDN_F16: return f16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

/* Random inputs from a counter-based generator: element i of a tensor is a
 * hash of (the tensor's key, i), so tensors fill in parallel and the values
 * do not depend on the thread count. Keys come from the seed in order. */
static uint64_t rng_state;
static uint64_t mix64(uint64_t z) {   /* splitmix64's finaliser */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static uint64_t rng_key(void) { return mix64(rng_state += 0x9e3779b97f4a7c15ULL); }
static double uniform_at(uint64_t key, uint64_t i) { return ((mix64(key + i * 0x9e3779b97f4a7c15ULL) >> 11) + 0.5) * 0x1.0p-53; }
static double normal_at(uint64_t key, uint64_t i) {   /* Box-Muller on two uniforms in (0, 1), in float */
    const uint64_t h = mix64(key + i * 0x9e3779b97f4a7c15ULL);
    const float u1 = ((float)(h >> 40) + 0.5f) * 0x1.0p-24f, u2 = ((float)((h >> 16) & 0xffffff) + 0.5f) * 0x1.0p-24f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}
static double rng_uniform(void) { return uniform_at(rng_key(), 0); }
static double rng_normal(void) { return normal_at(rng_key(), 0); }
static double logsigmoid(double x) { return x >= 0 ? -log1p(exp(-x)) : x - log1p(exp(x)); }

enum { R_NORMAL, R_LOGSIG_NORMAL, R_UNIFORM };
/* p[i] = offset + scale * (a draw of kind `kind`) for i < n, dtype t, in parallel */
static void fill(gdn_dtype t, void *p, size_t n, int kind, double scale, double offset) {
    const uint64_t key = rng_key();
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        double x = kind == R_UNIFORM ? uniform_at(key, i) : normal_at(key, i);
        if (kind == R_LOGSIG_NORMAL) x = logsigmoid(x);
        store(t, p, i, (float)(offset + scale * x));
    }
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "gdn: out of host memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

/* ---- backends: where the tensors live ------------------------------------ */

typedef struct backend {
    const char *name;
    gdn_backend id;
    void *(*alloc)(size_t);
    void (*release)(void *);
    void (*upload)(void *dev, const void *host, size_t n);
    void (*download)(void *host, const void *dev, size_t n);
    void (*sync)(void);
} backend;

static void *cpu_alloc(size_t n) { return xmalloc(n); }
static void cpu_release(void *p) { free(p); }
static void cpu_copy(void *dst, const void *src, size_t n) { if (n) memcpy(dst, src, n); }
static void cpu_sync(void) {}
static const backend cpu_backend = {"cpu", GDN_BACKEND_CPU, cpu_alloc, cpu_release, cpu_copy, cpu_copy, cpu_sync};

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
static const backend cuda_backend = {"cuda", GDN_BACKEND_CUDA, cuda_alloc, cuda_release, cuda_upload,
                                     cuda_download, cuda_sync};
#endif

static const backend *be;

/* a device copy of n bytes of host memory */
static void *dev_copy(const void *host, size_t n) {   /* NULL for NULL: an input no chosen op reads */
    if (!host) return NULL;
    void *d = be->alloc(n);
    be->upload(d, host, n);
    return d;
}
/* a device buffer of n elements of dtype t filled with NaN (unwritten output fails) */
static void *dev_nan(gdn_dtype t, size_t n) {
    const size_t bytes = n * gdn_dtype_size(t);
    void *h = xmalloc(bytes);
    for (size_t i = 0; i < n; i++) store(t, h, i, NAN);
    void *d = dev_copy(h, bytes);
    free(h);
    return d;
}

/* ---- the problem ------------------------------------------------------------ */

typedef struct sizes { int64_t rows; size_t nqk, nv, ng, nst; } sizes;

static sizes sizes_of(const gdn_config *c) {
    const int64_t N = c->cu_seqlens ? c->num_seqs : c->B;
    sizes s;
    s.rows = c->B * c->T;
    s.nqk = (size_t)s.rows * c->H * c->K;
    s.nv = (size_t)s.rows * c->HV * c->V;
    s.ng = (size_t)s.rows * c->HV;
    s.nst = (size_t)N * c->HV * c->K * c->V;
    return s;
}

/* the inputs (device or host pointers, one set for the full call; the slice
 * reads a prefix of each) */
typedef struct inputs {
    void *q, *k, *v, *g, *beta, *dout;
    float *A_log, *dt_bias, *h0, *dht;
} inputs;

/* the outputs of one call, all ops */
typedef struct outputs {
    void *o, *saved, *ws_fwd, *ws_bwd;
    float *ht;
    size_t saved_bytes, ws_fwd_bytes, ws_bwd_bytes;
    void *dq, *dk, *dv, *dg, *dbeta;
    float *dA_log, *ddt_bias, *dh0;
    float *gate_g;
    void *l2_y;
    float *l2_rstd;
    /* the GDN layer pieces */
    void *dec_o, *dec2_o;                      /* [dB,HV,V] decode_step, decode_step+conv */
    void *cv_y, *cv_dx;                        /* [B,T,D] */
    float *cv_ht, *cv_dw, *cv_db, *cv_dh0;     /* [N,D,W], [D,W], [D], [N,D,W] */
    void *nm_y, *nm_dx, *nm_dz;                /* [rows,V] */
    float *nm_rstd, *nm_dw;                    /* [rows], [V] */
} outputs;

/* the inputs of the GDN layer pieces (device or host pointers, one set for
 * the full call; the slice reads a prefix of each) */
typedef struct layer_in {
    void *mqkv, *da, *db;        /* [dB,D] mixed_qkv (the proj of decode_step+conv), [dB,HV] raw a, b */
    float *A_log, *dt_bias;      /* [HV] */
    float *pool, *cpool;         /* [slots,HV,K,V] state pool, [slots,D,W] conv state pool (in place) */
    int32_t *slots;              /* [dB] */
    void *x, *dy;                /* [B,T,D] conv1d input and output gradient */
    float *cw, *cb, *h0, *dht;   /* [D,W], [D], [N,D,W], [N,D,W] (cw, cb also for decode_step+conv) */
    void *nx, *nz, *ndy;         /* [rows,V] norm input, gate, output gradient */
    float *nw;                   /* [V] */
} layer_in;

typedef struct call {
    gdn_exec ex;
    gdn_config cfg;
    sizes sz;
    const inputs *in;
    outputs out;
    /* the GDN layer pieces */
    gdn_decode_config dec;       /* conv_W 0; decode_step+conv sets it */
    gdn_conv1d_config conv;
    gdn_rmsnorm_config norm;
    const layer_in *lin;
} call;

static const layer_in *lay_host;   /* host copy: the initial state pools */

static void outputs_alloc(call *c) {
    const gdn_config *g = &c->cfg;
    const sizes *s = &c->sz;
    outputs *o = &c->out;
    const gdn_dtype dt = g->dtype, gt = g->gate_dtype;
    o->o = dev_nan(dt, s->nv);
    o->ht = dev_nan(GDN_F32, s->nst);
    o->saved_bytes = gdn_chunk_saved_size(g);
    o->saved = dev_nan(GDN_F32, o->saved_bytes / 4);
    o->ws_fwd_bytes = gdn_chunk_fwd_workspace_size(&c->ex, g);
    o->ws_bwd_bytes = gdn_chunk_bwd_workspace_size(&c->ex, g);
    o->ws_fwd = dev_nan(GDN_F32, o->ws_fwd_bytes / 4 + 1);
    o->ws_bwd = dev_nan(GDN_F32, o->ws_bwd_bytes / 4 + 1);
    o->dq = dev_nan(dt, s->nqk);
    o->dk = dev_nan(dt, s->nqk);
    o->dv = dev_nan(dt, s->nv);
    o->dg = dev_nan(gt, s->ng);
    o->dbeta = dev_nan(gt, s->ng);
    o->dA_log = dev_nan(GDN_F32, (size_t)g->HV);
    o->ddt_bias = dev_nan(GDN_F32, (size_t)g->HV);
    o->dh0 = dev_nan(GDN_F32, s->nst);
    o->gate_g = dev_nan(GDN_F32, s->ng);
    o->l2_y = dev_nan(dt, s->nqk);
    o->l2_rstd = dev_nan(GDN_F32, (size_t)s->rows * g->H);
}

static void layer_outputs_alloc(call *c) {
    outputs *o = &c->out;
    const gdn_dtype dt = c->cfg.dtype;
    const size_t nx = (size_t)(c->conv.B * c->conv.T) * c->conv.D,
                 nst = (size_t)gdn_conv1d_seqs(&c->conv) * c->conv.D * c->conv.W,
                 nn = (size_t)c->norm.rows * c->norm.V, no = (size_t)c->dec.B * c->dec.HV * c->dec.V;
    o->dec_o = dev_nan(dt, no);
    o->dec2_o = dev_nan(dt, no);
    o->cv_y = dev_nan(dt, nx);
    o->cv_dx = dev_nan(dt, nx);
    o->cv_ht = dev_nan(GDN_F32, nst);
    o->cv_dw = dev_nan(GDN_F32, (size_t)c->conv.D * c->conv.W);
    o->cv_db = dev_nan(GDN_F32, (size_t)c->conv.D);
    o->cv_dh0 = dev_nan(GDN_F32, nst);
    o->nm_y = dev_nan(dt, nn);
    o->nm_dx = dev_nan(dt, nn);
    o->nm_dz = dev_nan(dt, nn);
    o->nm_rstd = dev_nan(GDN_F32, (size_t)c->norm.rows);
    o->nm_dw = dev_nan(GDN_F32, (size_t)c->norm.V);
}

static void outputs_free(outputs *o) {
    void *p[] = {o->o, o->saved, o->ws_fwd, o->ws_bwd, o->ht, o->dq, o->dk, o->dv, o->dg, o->dbeta,
                 o->dA_log, o->ddt_bias, o->dh0, o->gate_g, o->l2_y, o->l2_rstd,
                 o->dec_o, o->dec2_o, o->cv_y, o->cv_dx, o->cv_ht, o->cv_dw, o->cv_db, o->cv_dh0,
                 o->nm_y, o->nm_dx, o->nm_dz, o->nm_rstd, o->nm_dw};
    for (size_t i = 0; i < sizeof p / sizeof *p; i++) be->release(p[i]);
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
static gdn_status run_op(int op, call *c) {
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
static gdn_status prepare_op(int op, call *c) {
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

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* a step that took seconds says so on stderr (large shapes take a while) */
static void progress(const char *what, double t0_ms) {
    const double s = (now_ms() - t0_ms) * 1e-3;
    if (s >= 2.0) fprintf(stderr, "gdn: %s made and checked on the host in %.1f s\n", what, s);
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* median of reps timed runs after warmup runs */
static gdn_status time_op(int op, call *c, int warmup, int reps, double *ms) {
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

static double op_flops(int op, const call *c) {
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

static double op_bytes(int op, const call *c) {
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

/* ---- the reference on the slice ------------------------------------------- */

typedef struct refs {
    double *o, *ht, *dq, *dk, *dv, *dg, *db, *dA, *ddt, *dh0, *gate_g, *l2_y;
    double *dA_terms2, *ddt_terms2;   /* squared norms of the per-token terms of dA_log, ddt_bias */
} refs;

static double *dalloc(size_t n) { return xmalloc(n * sizeof(double)); }

/* host tensor of dtype t -> doubles (the rounded values the library sees) */
static double *to_double(gdn_dtype t, const void *p, size_t n) {
    double *d = dalloc(n);
    for (size_t i = 0; i < n; i++) d[i] = get(t, p, i);
    return d;
}

static void refs_compute(const gdn_config *c, int bwd, const inputs *host, refs *r) {
    const sizes s = sizes_of(c);
    const int fused = (c->flags & GDN_GATE_FUSED) != 0;
    double *q = to_double(c->dtype, host->q, s.nqk), *k = to_double(c->dtype, host->k, s.nqk),
           *v = to_double(c->dtype, host->v, s.nv), *g = to_double(c->gate_dtype, host->g, s.ng),
           *b = to_double(c->gate_dtype, host->beta, s.ng),
           *dout = bwd ? to_double(c->dtype, host->dout, s.nv) : NULL,
           *A = to_double(GDN_F32, host->A_log, (size_t)c->HV), *dtb = to_double(GDN_F32, host->dt_bias, (size_t)c->HV),
           *h0 = to_double(GDN_F32, host->h0, s.nst), *dht = bwd ? to_double(GDN_F32, host->dht, s.nst) : NULL;
    gdn_ref_inputs in = {q, k, v, g, b, fused ? A : NULL, fused ? dtb : NULL, h0};
    r->o = dalloc(s.nv); r->ht = dalloc(s.nst);
    gdn_ref_fwd(c, &in, r->o, r->ht);
    if (bwd) {
        r->dq = dalloc(s.nqk); r->dk = dalloc(s.nqk); r->dv = dalloc(s.nv); r->dg = dalloc(s.ng);
        r->db = dalloc(s.ng); r->dA = dalloc((size_t)c->HV); r->ddt = dalloc((size_t)c->HV); r->dh0 = dalloc(s.nst);
        gdn_ref_bwd(c, &in, dout, dht, r->dq, r->dk, r->dv, r->dg, r->db, r->dA, r->ddt, r->dh0);
    }
    /* dA_log = sum_t da_t * softplus(x_t) / softplus'(x_t), ddt_bias = sum_t da_t:
     * sums whose terms cancel, measured against the size of the terms */
    r->dA_terms2 = dalloc((size_t)c->HV); r->ddt_terms2 = dalloc((size_t)c->HV);
    for (int j = 0; j < c->HV; j++) r->dA_terms2[j] = r->ddt_terms2[j] = 0;
    if (fused && bwd) {
        for (size_t i = 0; i < s.ng; i++) {
            const int j = (int)(i % (size_t)c->HV);
            const double x = g[i] + dtb[j];
            const double sp = gdn_ref_softplus(x), dsp = x > 20 ? 1.0 : 1.0 / (1.0 + exp(-x));
            const double term = r->dg[i] * sp / dsp;
            r->dA_terms2[j] += term * term;
            r->ddt_terms2[j] += r->dg[i] * r->dg[i];
        }
    }
    r->gate_g = dalloc(s.ng);
    gdn_ref_gate_fwd(s.rows, c->HV, g, A, dtb, r->gate_g);
    r->l2_y = dalloc(s.nqk);
    gdn_ref_l2norm_fwd(s.rows * c->H, c->K, q, r->l2_y, NULL);
    free(q); free(k); free(v); free(g); free(b); free(dout); free(A); free(dtb); free(h0); free(dht);
}

static void refs_free(refs *r) {
    double *p[] = {r->o, r->ht, r->dq, r->dk, r->dv, r->dg, r->db, r->dA, r->ddt, r->dh0, r->gate_g, r->l2_y,
                   r->dA_terms2, r->ddt_terms2};
    for (size_t i = 0; i < sizeof p / sizeof *p; i++) free(p[i]);
}

/* ||out - ref|| / ||ref|| for a device tensor of dtype t; absolute when
 * ||ref|| is ~0; infinity on any non-finite element (NaN never passes) */
static double rel_err(gdn_dtype t, const void *dev, const double *ref, size_t n) {
    const size_t bytes = n * gdn_dtype_size(t);
    void *h = xmalloc(bytes);
    be->download(h, dev, bytes);
    double num = 0, den = 0;
    int bad_value = 0;
    for (size_t i = 0; i < n; i++) {
        const double x = get(t, h, i);
        if (!isfinite(x)) bad_value = 1;
        num += (x - ref[i]) * (x - ref[i]);
        den += ref[i] * ref[i];
    }
    free(h);
    if (bad_value) return INFINITY;
    return den < 1e-18 ? sqrt(num) : sqrt(num / den);
}

/* a per-head reduction: error against max(|sum|, |terms|), as the tests measure it */
static double reduction_err(const float *dev, const double *ref, const double *terms2, int HV) {
    float *h = xmalloc(sizeof(float) * (size_t)HV);
    be->download(h, dev, sizeof(float) * (size_t)HV);
    double num = 0, den = 0;
    int bad_value = 0;
    for (int j = 0; j < HV; j++) {
        if (!isfinite(h[j])) bad_value = 1;
        num += (h[j] - ref[j]) * (h[j] - ref[j]);
        den += fmax(ref[j] * ref[j], terms2[j]);
    }
    free(h);
    if (bad_value) return INFINITY;
    return den < 1e-18 ? sqrt(num) : sqrt(num / den);
}

static double worse(double a, double b) { return (a > b || isnan(a)) ? a : b; }

/* ---- the float64 reference of the GDN layer pieces ------------------------- */

/* Plain double loops, written from the math in gdn.h, on the slice:
 * the decode step on its first rows, conv1d and the norm on the slice's tokens. */
typedef struct lrefs {
    double *dec_o[2], *dec_st[2];   /* [0] decode_step, [1] decode_step+conv: o [Bs,HV,V], new state rows [Bs,HV*K*V] */
    double *dec_cst;                /* decode_step+conv: new conv state rows [Bs,D*W] */
    double *cv_y, *cv_ht, *cv_dx, *cv_dw, *cv_db, *cv_dh0;
    double *nm_y, *nm_rstd, *nm_dx, *nm_dz, *nm_dw;
} lrefs;

static double sigmoid_d(double x) { return 1.0 / (1.0 + exp(-x)); }
static double softplus_d(double x) { return x > 20 ? x : log1p(exp(x)); }

/* rows 0..c->B-1 of the decode step (conv update first when c->conv_W > 0);
 * st, cst: the rows' states after the step, in the pool's layout */
static void lref_decode(const gdn_decode_config *c, const layer_in *h, double *o, double *st, double *cst) {
    const int H = c->H, HV = c->HV, K = c->K, V = c->V, G = HV / H, D = gdn_decode_dim(c), W = c->conv_W;
    const int vf = (c->flags & GDN_STATE_V_FIRST) != 0;
    const double scale = c->scale != 0 ? c->scale : 1.0 / sqrt((double)K);
    const double bmul = (c->flags & GDN_BETA_NEGATIVE) ? 2.0 : 1.0;
    const size_t kv = (size_t)K * V;
    double *x = dalloc((size_t)D), *q = dalloc((size_t)K), *k = dalloc((size_t)K), *u = dalloc((size_t)V);
    for (int b = 0; b < c->B; b++) {
        const int64_t sl = h->slots[b];
        double *S = st + (size_t)b * HV * kv;
        for (size_t i = 0; i < HV * kv; i++) S[i] = h->pool[(size_t)sl * HV * kv + i];
        for (int d = 0; d < D; d++) x[d] = get(c->dtype, h->mqkv, (size_t)b * D + d);
        if (W > 0) {   /* conv update: shift in the new input, y = silu(bias + weight . state) */
            double *cs = cst + (size_t)b * D * W;
            for (int i = 0; i < D * W; i++) cs[i] = h->cpool[(size_t)sl * D * W + i];
            for (int d = 0; d < D; d++) {
                double *sd = cs + (size_t)d * W, acc = h->cb[d];
                for (int w = 0; w + 1 < W; w++) sd[w] = sd[w + 1];
                sd[W - 1] = x[d];
                for (int w = 0; w < W; w++) acc += (double)h->cw[(size_t)d * W + w] * sd[w];
                x[d] = acc * sigmoid_d(acc);
            }
        }
        for (int j = 0; j < HV; j++) {
            const int hh = j / G;
            double qq = 0, kk = 0;
            for (int i = 0; i < K; i++) {
                q[i] = x[hh * K + i];
                k[i] = x[H * K + hh * K + i];
                qq += q[i] * q[i];
                kk += k[i] * k[i];
            }
            if (c->flags & GDN_QK_L2NORM) {
                const double rq = 1.0 / sqrt(qq + 1e-6), rk = 1.0 / sqrt(kk + 1e-6);
                for (int i = 0; i < K; i++) { q[i] *= rq; k[i] *= rk; }
            }
            const double *v = x + 2 * H * K + j * V;
            const double ga = get(c->dtype, h->da, (size_t)b * HV + j), gb = get(c->dtype, h->db, (size_t)b * HV + j);
            const double g = -exp((double)h->A_log[j]) * softplus_d(ga + (double)h->dt_bias[j]);
            const double beta = bmul * sigmoid_d(gb), decay = exp(g);
            double *Sj = S + (size_t)j * kv;
#define AT(i, e) Sj[vf ? (size_t)(e) * K + (i) : (size_t)(i) * V + (e)]
            for (size_t i = 0; i < kv; i++) Sj[i] *= decay;
            for (int e = 0; e < V; e++) {
                double dot = 0;
                for (int i = 0; i < K; i++) dot += AT(i, e) * k[i];
                u[e] = beta * (v[e] - dot);
            }
            for (int i = 0; i < K; i++)
                for (int e = 0; e < V; e++) AT(i, e) += k[i] * u[e];
            for (int e = 0; e < V; e++) {
                double dot = 0;
                for (int i = 0; i < K; i++) dot += AT(i, e) * q[i];
                o[((size_t)b * HV + j) * V + e] = scale * dot;
            }
#undef AT
        }
    }
    free(x); free(q); free(k); free(u);
}

/* conv1d forward and backward over the slice (every sequence of c):
 * xx[tau + W] is the input at token tau of the sequence, tau in -W..len-1,
 * tau < 0 from h0 (newest last); y[t] = silu(bias + sum_w weight[w] xx[t+1+w]),
 * ht[w] = xx[len + w]; backward through the same indices. */
static void lref_conv(const gdn_conv1d_config *c, const layer_in *h, lrefs *r) {
    const int D = c->D, W = c->W;
    const int64_t N = (int64_t)gdn_conv1d_seqs(c), T = c->T;
    const size_t nx = (size_t)(c->B * T) * D, nst = (size_t)N * D * W;
    r->cv_y = dalloc(nx); r->cv_dx = dalloc(nx); r->cv_ht = dalloc(nst); r->cv_dh0 = dalloc(nst);
    r->cv_dw = dalloc((size_t)D * W); r->cv_db = dalloc((size_t)D);
    for (int i = 0; i < D * W; i++) r->cv_dw[i] = 0;
    for (int d = 0; d < D; d++) r->cv_db[d] = 0;
    int64_t maxlen = 0;
    for (int64_t n = 0; n < N; n++) {
        const int64_t len = c->cu_seqlens ? c->cu_seqlens[n + 1] - c->cu_seqlens[n] : T;
        if (len > maxlen) maxlen = len;
    }
    double *xx = dalloc((size_t)(maxlen + W)), *dxx = dalloc((size_t)(maxlen + W)), *pre = dalloc((size_t)maxlen + 1);
    for (int64_t n = 0; n < N; n++) {
        const int64_t t0 = c->cu_seqlens ? c->cu_seqlens[n] : n * T;
        const int64_t len = c->cu_seqlens ? c->cu_seqlens[n + 1] - t0 : T;
        for (int d = 0; d < D; d++) {
            const size_t so = ((size_t)n * D + d) * W;
            const float *wd = h->cw + (size_t)d * W;
            for (int w = 0; w < W; w++) xx[w] = h->h0[so + w];
            for (int64_t t = 0; t < len; t++) xx[W + t] = get(c->dtype, h->x, (size_t)(t0 + t) * D + d);
            for (int64_t t = 0; t < len; t++) {
                double acc = h->cb[d];
                for (int w = 0; w < W; w++) acc += (double)wd[w] * xx[t + 1 + w];
                pre[t] = acc;
                r->cv_y[(size_t)(t0 + t) * D + d] = acc * sigmoid_d(acc);
            }
            for (int w = 0; w < W; w++) r->cv_ht[so + w] = xx[len + w];
            /* backward */
            for (int64_t i = 0; i < len + W; i++) dxx[i] = 0;
            for (int w = 0; w < W; w++) dxx[len + w] += h->dht[so + w];
            for (int64_t t = 0; t < len; t++) {
                const double sg = sigmoid_d(pre[t]);
                const double dp = get(c->dtype, h->dy, (size_t)(t0 + t) * D + d) * sg * (1.0 + pre[t] * (1.0 - sg));
                for (int w = 0; w < W; w++) {
                    dxx[t + 1 + w] += (double)wd[w] * dp;
                    r->cv_dw[(size_t)d * W + w] += dp * xx[t + 1 + w];
                }
                r->cv_db[d] += dp;
            }
            for (int64_t t = 0; t < len; t++) r->cv_dx[(size_t)(t0 + t) * D + d] = dxx[W + t];
            for (int w = 0; w < W; w++) r->cv_dh0[so + w] = dxx[w];
        }
    }
    free(xx); free(dxx); free(pre);
}

/* gated RMSNorm over the slice's rows: r = 1/sqrt(mean(x^2) + eps), n = x r,
 * y = n w gate(z); backward dx = r (dn - n mean(dn n)), dn = dy w gate(z),
 * dz = dy n w gate'(z), dw = sum over rows of dy n gate(z) */
static void lref_norm(const gdn_rmsnorm_config *c, const layer_in *h, lrefs *r) {
    const int V = c->V;
    const size_t n = (size_t)c->rows * V;
    r->nm_y = dalloc(n); r->nm_dx = dalloc(n); r->nm_dz = dalloc(n);
    r->nm_rstd = dalloc((size_t)c->rows); r->nm_dw = dalloc((size_t)V);
    double *nn = dalloc((size_t)V), *dn = dalloc((size_t)V);
    for (int e = 0; e < V; e++) r->nm_dw[e] = 0;
    for (int64_t row = 0; row < c->rows; row++) {
        const size_t o = (size_t)row * V;
        double ss = 0;
        for (int e = 0; e < V; e++) { const double x = get(c->dtype, h->nx, o + e); ss += x * x; }
        const double rs = 1.0 / sqrt(ss / V + (double)c->eps);
        r->nm_rstd[row] = rs;
        double m = 0;
        for (int e = 0; e < V; e++) {
            const double x = get(c->dtype, h->nx, o + e), z = get(c->dtype, h->nz, o + e);
            const double dy = get(c->dtype, h->ndy, o + e), w = h->nw[e], sg = sigmoid_d(z);
            const double gt = c->gate == GDN_NORM_GATE_SILU ? z * sg : sg;
            const double dgt = c->gate == GDN_NORM_GATE_SILU ? sg * (1.0 + z * (1.0 - sg)) : sg * (1.0 - sg);
            nn[e] = x * rs;
            r->nm_y[o + e] = nn[e] * w * gt;
            dn[e] = dy * w * gt;
            r->nm_dz[o + e] = dy * nn[e] * w * dgt;
            r->nm_dw[e] += dy * nn[e] * gt;
            m += dn[e] * nn[e];
        }
        m /= V;
        for (int e = 0; e < V; e++) r->nm_dx[o + e] = rs * (dn[e] - nn[e] * m);
    }
    free(nn); free(dn);
}

static void lrefs_compute(const call *cs, const layer_in *h, unsigned ops, lrefs *r) {
    memset(r, 0, sizeof *r);
    for (int cv = 0; cv < 2; cv++) {
        if (!(ops & (1u << (cv ? OP_DECODE_CONV : OP_DECODE)))) continue;
        gdn_decode_config dc = cs->dec;
        dc.conv_W = cv ? CONV_W : 0;
        const size_t D = (size_t)gdn_decode_dim(&dc);
        r->dec_o[cv] = dalloc((size_t)dc.B * dc.HV * dc.V);
        r->dec_st[cv] = dalloc((size_t)dc.B * dc.HV * dc.K * dc.V);
        if (cv) r->dec_cst = dalloc((size_t)dc.B * D * CONV_W);
        lref_decode(&dc, h, r->dec_o[cv], r->dec_st[cv], cv ? r->dec_cst : NULL);
    }
    if (ops & ((1u << OP_CONV_FWD) | (1u << OP_CONV_BWD))) lref_conv(&cs->conv, h, r);
    if (ops & ((1u << OP_NORM_FWD) | (1u << OP_NORM_BWD))) lref_norm(&cs->norm, h, r);
}

static void lrefs_free(lrefs *r) {
    double *p[] = {r->dec_o[0], r->dec_o[1], r->dec_st[0], r->dec_st[1], r->dec_cst, r->cv_y, r->cv_ht, r->cv_dx,
                   r->cv_dw, r->cv_db, r->cv_dh0, r->nm_y, r->nm_rstd, r->nm_dx, r->nm_dz, r->nm_dw};
    for (size_t i = 0; i < sizeof p / sizeof *p; i++) free(p[i]);
}

/* a state pool after a decode step of B rows: the rows slots[0..B) against
 * ref (the rows in slot order), relative; every other pool row must be byte
 * for byte the initial one (else infinity, *moved set) */
static double pool_err(const float *dev, const float *init, const int32_t *slots, int B, int64_t nslots,
                       size_t row, const double *ref, int *moved) {
    const size_t n = (size_t)nslots * row;
    float *h = xmalloc(sizeof(float) * n);
    char *used = xmalloc((size_t)nslots);
    be->download(h, dev, sizeof(float) * n);
    memset(used, 0, (size_t)nslots);
    double num = 0, den = 0;
    int bad_value = 0;
    *moved = 0;
    for (int b = 0; b < B; b++) {
        const int32_t sl = slots[b];
        if (sl < 0) continue;
        used[sl] = 1;
        for (size_t i = 0; i < row; i++) {
            const double x = h[(size_t)sl * row + i], rf = ref[(size_t)b * row + i];
            if (!isfinite(x)) bad_value = 1;
            num += (x - rf) * (x - rf);
            den += rf * rf;
        }
    }
    for (int64_t sl = 0; sl < nslots; sl++)
        if (!used[sl] && memcmp(h + (size_t)sl * row, init + (size_t)sl * row, sizeof(float) * row)) *moved = 1;
    free(h); free(used);
    if (bad_value || *moved) return INFINITY;
    return den < 1e-18 ? sqrt(num) : sqrt(num / den);
}

/* keep the larger error and its name */
static void pick(double x, const char *name, double *e, const char **what) {
    if (worse(x, *e) == x && x != *e) { *e = x; *what = name; }
}

static double check_layer(int op, call *c, const lrefs *r, const char **what) {
    const gdn_dtype dt = c->cfg.dtype;
    double e = -1;
    switch (op) {
    case OP_DECODE:
    case OP_DECODE_CONV: {
        const int cv = op == OP_DECODE_CONV;
        const gdn_decode_config *dc = &c->dec;
        const size_t D = (size_t)gdn_decode_dim(dc), row = (size_t)dc->HV * dc->K * dc->V;
        int moved = 0;
        pick(rel_err(dt, cv ? c->out.dec2_o : c->out.dec_o, r->dec_o[cv], (size_t)dc->B * dc->HV * dc->V), "o", &e,
             what);
        double x = pool_err(c->lin->pool, lay_host->pool, lay_host->slots, dc->B, dc->num_slots, row, r->dec_st[cv],
                            &moved);
        pick(x, moved ? "state: a pool row not in slots changed" : "state", &e, what);
        if (cv) {
            x = pool_err(c->lin->cpool, lay_host->cpool, lay_host->slots, dc->B, dc->num_slots, D * CONV_W, r->dec_cst,
                         &moved);
            pick(x, moved ? "conv_state: a pool row not in slots changed" : "conv_state", &e, what);
        }
        return e;
    }
    case OP_CONV_FWD: {
        const size_t nx = (size_t)(c->conv.B * c->conv.T) * c->conv.D,
                     nst = (size_t)gdn_conv1d_seqs(&c->conv) * c->conv.D * c->conv.W;
        pick(rel_err(dt, c->out.cv_y, r->cv_y, nx), "y", &e, what);
        pick(rel_err(GDN_F32, c->out.cv_ht, r->cv_ht, nst), "ht", &e, what);
        return e;
    }
    case OP_CONV_BWD: {
        const size_t nx = (size_t)(c->conv.B * c->conv.T) * c->conv.D,
                     nst = (size_t)gdn_conv1d_seqs(&c->conv) * c->conv.D * c->conv.W;
        pick(rel_err(dt, c->out.cv_dx, r->cv_dx, nx), "dx", &e, what);
        pick(rel_err(GDN_F32, c->out.cv_dw, r->cv_dw, (size_t)c->conv.D * c->conv.W), "dweight", &e, what);
        pick(rel_err(GDN_F32, c->out.cv_db, r->cv_db, (size_t)c->conv.D), "dbias", &e, what);
        pick(rel_err(GDN_F32, c->out.cv_dh0, r->cv_dh0, nst), "dh0", &e, what);
        return e;
    }
    case OP_NORM_FWD: {
        const size_t n = (size_t)c->norm.rows * c->norm.V;
        pick(rel_err(dt, c->out.nm_y, r->nm_y, n), "y", &e, what);
        pick(rel_err(GDN_F32, c->out.nm_rstd, r->nm_rstd, (size_t)c->norm.rows), "rstd", &e, what);
        return e;
    }
    default: {
        const size_t n = (size_t)c->norm.rows * c->norm.V;
        pick(rel_err(dt, c->out.nm_dx, r->nm_dx, n), "dx", &e, what);
        pick(rel_err(dt, c->out.nm_dz, r->nm_dz, n), "dz", &e, what);
        pick(rel_err(GDN_F32, c->out.nm_dw, r->nm_dw, (size_t)c->norm.V), "dw", &e, what);
        return e;
    }
    }
}

/* run op once on the slice and return its error against the reference
 * (-1 when the call failed; status in *st) */
static double check_op(int op, call *c, const refs *r, const lrefs *lr, gdn_status *st, const char **what) {
    const gdn_config *g = &c->cfg;
    const sizes *s = &c->sz;
    *what = "";
    *st = prepare_op(op, c);
    if (*st == GDN_OK) *st = run_op(op, c);
    if (*st != GDN_OK) return -1;
    if (op_is_layer(op)) return check_layer(op, c, lr, what);
    double e = 0, x;
    switch (op) {
    case OP_CHUNK_FWD:
    case OP_RECURRENT_FWD:
        e = rel_err(g->dtype, c->out.o, r->o, s->nv); *what = "o";
        x = rel_err(GDN_F32, c->out.ht, r->ht, s->nst); if (worse(x, e) == x && x != e) { e = x; *what = "ht"; }
        return e;
    case OP_CHUNK_FWDBWD: {
        const int fused = (g->flags & GDN_GATE_FUSED) != 0;
        struct { const char *name; double err; } gr[8] = {
            {"dq", rel_err(g->dtype, c->out.dq, r->dq, s->nqk)},
            {"dk", rel_err(g->dtype, c->out.dk, r->dk, s->nqk)},
            {"dv", rel_err(g->dtype, c->out.dv, r->dv, s->nv)},
            {fused ? "da" : "dg", rel_err(g->gate_dtype, c->out.dg, r->dg, s->ng)},
            {(g->flags & GDN_BETA_SIGMOID) ? "db" : "dbeta", rel_err(g->gate_dtype, c->out.dbeta, r->db, s->ng)},
            {"dh0", rel_err(GDN_F32, c->out.dh0, r->dh0, s->nst)},
            {"dA_log", fused ? reduction_err(c->out.dA_log, r->dA, r->dA_terms2, g->HV) : 0},
            {"ddt_bias", fused ? reduction_err(c->out.ddt_bias, r->ddt, r->ddt_terms2, g->HV) : 0}};
        e = gr[0].err; *what = gr[0].name;
        for (int i = 1; i < 8; i++)
            if (worse(gr[i].err, e) == gr[i].err && gr[i].err != e) { e = gr[i].err; *what = gr[i].name; }
        return e;
    }
    case OP_GATE_FWD: *what = "g"; return rel_err(GDN_F32, c->out.gate_g, r->gate_g, s->ng);
    default: *what = "y"; return rel_err(g->dtype, c->out.l2_y, r->l2_y, s->nqk);   /* OP_L2NORM_FWD */
    }
}

/* ---- inputs --------------------------------------------------------------- */

/* random inputs like the tests': k rows of norm ~1 when the kernel does not
 * normalise (else the recurrence is not contractive), raw gates around 0,
 * A_log in log(1..16) */
static void inputs_random(const gdn_config *c, int bwd, inputs *h) {
    const sizes s = sizes_of(c);
    const gdn_dtype dt = c->dtype, gt = c->gate_dtype;
    const unsigned f = c->flags;
    h->q = xmalloc(s.nqk * gdn_dtype_size(dt)); h->k = xmalloc(s.nqk * gdn_dtype_size(dt));
    h->v = xmalloc(s.nv * gdn_dtype_size(dt));
    h->g = xmalloc(s.ng * gdn_dtype_size(gt)); h->beta = xmalloc(s.ng * gdn_dtype_size(gt));
    h->A_log = xmalloc(sizeof(float) * (size_t)c->HV); h->dt_bias = xmalloc(sizeof(float) * (size_t)c->HV);
    h->h0 = xmalloc(sizeof(float) * s.nst);
    fill(dt, h->q, s.nqk, R_NORMAL, 1, 0);
    const double target = dt == GDN_F32 ? 1.0 : 0.99;   /* rounding must not push |k| over 1 */
    const uint64_t kkey = rng_key();
    const int K = c->K;
    #pragma omp parallel for schedule(static)
    for (size_t rw = 0; rw < s.nqk / (size_t)K; rw++) {
        float row[256];   /* K <= 256 (--K) */
        double ss = 0;
        for (int i = 0; i < K; i++) {
            row[i] = (float)normal_at(kkey, rw * K + i);
            ss += (double)row[i] * row[i];
        }
        for (int i = 0; i < K; i++)
            store(dt, h->k, rw * K + i, (f & GDN_QK_L2NORM) ? row[i] : (float)(row[i] * target / sqrt(ss)));
    }
    fill(dt, h->v, s.nv, R_NORMAL, 1, 0);
    fill(gt, h->g, s.ng, (f & GDN_GATE_FUSED) ? R_NORMAL : R_LOGSIG_NORMAL, 1, 0);
    fill(gt, h->beta, s.ng, (f & GDN_BETA_SIGMOID) ? R_NORMAL : R_UNIFORM, 1, 0);
    for (int j = 0; j < c->HV; j++) {
        h->A_log[j] = (float)log(1.0 + 15.0 * rng_uniform());
        h->dt_bias[j] = (float)(0.5 * rng_normal());
    }
    fill(GDN_F32, h->h0, s.nst, R_NORMAL, 1, 0);
    if (bwd) {   /* the backward's inputs only where it runs */
        h->dout = xmalloc(s.nv * gdn_dtype_size(dt));
        h->dht = xmalloc(sizeof(float) * s.nst);
        fill(dt, h->dout, s.nv, R_NORMAL, 1, 0);
        fill(GDN_F32, h->dht, s.nst, R_NORMAL, 1, 0);
    }
}

static void inputs_upload(const gdn_config *c, const inputs *h, inputs *d) {
    const sizes s = sizes_of(c);
    const size_t ds = gdn_dtype_size(c->dtype), gs = gdn_dtype_size(c->gate_dtype);
    d->q = dev_copy(h->q, s.nqk * ds); d->k = dev_copy(h->k, s.nqk * ds);
    d->v = dev_copy(h->v, s.nv * ds); d->dout = dev_copy(h->dout, s.nv * ds);
    d->g = dev_copy(h->g, s.ng * gs); d->beta = dev_copy(h->beta, s.ng * gs);
    d->A_log = dev_copy(h->A_log, sizeof(float) * (size_t)c->HV);
    d->dt_bias = dev_copy(h->dt_bias, sizeof(float) * (size_t)c->HV);
    d->h0 = dev_copy(h->h0, sizeof(float) * s.nst); d->dht = dev_copy(h->dht, sizeof(float) * s.nst);
}

static void inputs_free(inputs *x, void (*release)(void *)) {
    void *p[] = {x->q, x->k, x->v, x->g, x->beta, x->dout, x->A_log, x->dt_bias, x->h0, x->dht};
    for (size_t i = 0; i < sizeof p / sizeof *p; i++) release(p[i]);
}

/* the GDN layer pieces' inputs, for the full call: like the tests', raw
 * gates and projections N(0,1), decode states 0.3 N(0,1), conv weights
 * 0.5 N(0,1) and biases 0.1 N(0,1), norm weights 1 + 0.1 N(0,1) */
static void layer_inputs_random(const call *c, unsigned ops, layer_in *h) {
    const gdn_dtype dt = c->cfg.dtype;
    const gdn_decode_config *dc = &c->dec;
    const size_t dB = (size_t)dc->B, D = (size_t)gdn_decode_dim(dc), HV = (size_t)dc->HV,
                 npool = (size_t)dc->num_slots * HV * dc->K * dc->V, ncpool = (size_t)dc->num_slots * D * CONV_W,
                 nx = (size_t)(c->conv.B * c->conv.T) * D, nst = (size_t)gdn_conv1d_seqs(&c->conv) * D * CONV_W,
                 nn = (size_t)c->norm.rows * c->norm.V, V = (size_t)c->norm.V;
    memset(h, 0, sizeof *h);
    const size_t ds = gdn_dtype_size(dt);
    /* only what the chosen ops read (the others stay NULL) */
    const int dec = (ops & (1u << OP_DECODE | 1u << OP_DECODE_CONV)) != 0, dconv = (ops & 1u << OP_DECODE_CONV) != 0,
              conv = (ops & (1u << OP_CONV_FWD | 1u << OP_CONV_BWD)) != 0,
              norm = (ops & (1u << OP_NORM_FWD | 1u << OP_NORM_BWD)) != 0;
    if (dec) {
        h->mqkv = xmalloc(dB * D * ds);
        h->da = xmalloc(dB * HV * ds); h->db = xmalloc(dB * HV * ds);
        h->A_log = xmalloc(sizeof(float) * HV); h->dt_bias = xmalloc(sizeof(float) * HV);
        h->pool = xmalloc(sizeof(float) * npool);
        h->slots = xmalloc(sizeof(int32_t) * dB);
        fill(dt, h->mqkv, dB * D, R_NORMAL, 1, 0);
        fill(dt, h->da, dB * HV, R_NORMAL, 1, 0);
        fill(dt, h->db, dB * HV, R_NORMAL, 1, 0);
        for (size_t j = 0; j < HV; j++) {
            h->A_log[j] = (float)log(1.0 + 15.0 * rng_uniform());
            h->dt_bias[j] = (float)(0.5 * rng_normal());
        }
        fill(GDN_F32, h->pool, npool, R_NORMAL, 0.3, 0);
        /* a pool of 2*dB slots: row b in slot 2*dB-1-2b (reversed, every other slot unused) */
        for (size_t b = 0; b < dB; b++) h->slots[b] = (int32_t)(dc->num_slots - 1 - 2 * (int64_t)b);
    }
    if (dconv) {
        h->cpool = xmalloc(sizeof(float) * ncpool);
        fill(GDN_F32, h->cpool, ncpool, R_NORMAL, 1, 0);
    }
    if (conv) {
        h->x = xmalloc(nx * ds); h->dy = xmalloc(nx * ds);
        h->h0 = xmalloc(sizeof(float) * nst); h->dht = xmalloc(sizeof(float) * nst);
        fill(dt, h->x, nx, R_NORMAL, 1, 0);
        fill(dt, h->dy, nx, R_NORMAL, 1, 0);
        fill(GDN_F32, h->h0, nst, R_NORMAL, 1, 0);
        fill(GDN_F32, h->dht, nst, R_NORMAL, 1, 0);
    }
    if (conv || dconv) {
        h->cw = xmalloc(sizeof(float) * D * CONV_W); h->cb = xmalloc(sizeof(float) * D);
        fill(GDN_F32, h->cw, D * CONV_W, R_NORMAL, 0.5, 0);
        fill(GDN_F32, h->cb, D, R_NORMAL, 0.1, 0);
    }
    if (norm) {
        h->nx = xmalloc(nn * ds); h->nz = xmalloc(nn * ds);
        h->ndy = xmalloc(nn * ds); h->nw = xmalloc(sizeof(float) * V);
        fill(dt, h->nx, nn, R_NORMAL, 1, 0);
        fill(dt, h->nz, nn, R_NORMAL, 1, 0);
        fill(dt, h->ndy, nn, R_NORMAL, 1, 0);
        fill(GDN_F32, h->nw, V, R_NORMAL, 0.1, 1.0);
    }
}

static void layer_inputs_upload(const call *c, const layer_in *h, layer_in *d) {
    const size_t ds = gdn_dtype_size(c->cfg.dtype);
    const gdn_decode_config *dc = &c->dec;
    const size_t dB = (size_t)dc->B, D = (size_t)gdn_decode_dim(dc), HV = (size_t)dc->HV,
                 npool = (size_t)dc->num_slots * HV * dc->K * dc->V, ncpool = (size_t)dc->num_slots * D * CONV_W,
                 nx = (size_t)(c->conv.B * c->conv.T) * D, nst = (size_t)gdn_conv1d_seqs(&c->conv) * D * CONV_W,
                 nn = (size_t)c->norm.rows * c->norm.V, V = (size_t)c->norm.V;
    d->mqkv = dev_copy(h->mqkv, dB * D * ds);
    d->da = dev_copy(h->da, dB * HV * ds); d->db = dev_copy(h->db, dB * HV * ds);
    d->A_log = dev_copy(h->A_log, sizeof(float) * HV); d->dt_bias = dev_copy(h->dt_bias, sizeof(float) * HV);
    d->pool = dev_copy(h->pool, sizeof(float) * npool); d->cpool = dev_copy(h->cpool, sizeof(float) * ncpool);
    d->slots = dev_copy(h->slots, sizeof(int32_t) * dB);
    d->x = dev_copy(h->x, nx * ds); d->dy = dev_copy(h->dy, nx * ds);
    d->cw = dev_copy(h->cw, sizeof(float) * D * CONV_W); d->cb = dev_copy(h->cb, sizeof(float) * D);
    d->h0 = dev_copy(h->h0, sizeof(float) * nst); d->dht = dev_copy(h->dht, sizeof(float) * nst);
    d->nx = dev_copy(h->nx, nn * ds); d->nz = dev_copy(h->nz, nn * ds); d->ndy = dev_copy(h->ndy, nn * ds);
    d->nw = dev_copy(h->nw, sizeof(float) * V);
}

static void layer_inputs_free(layer_in *x, void (*release)(void *)) {
    void *p[] = {x->mqkv, x->da, x->db, x->A_log, x->dt_bias, x->pool, x->cpool, x->slots, x->x, x->dy,
                 x->cw, x->cb, x->h0, x->dht, x->nx, x->nz, x->ndy, x->nw};
    for (size_t i = 0; i < sizeof p / sizeof *p; i++) release(p[i]);
}

/* N ragged lengths summing to T: weights uniform in [0.2, 1.8] */
static void ragged(int64_t T, int n, int64_t *cu) {
    double *w = dalloc((size_t)n), sum = 0;
    for (int i = 0; i < n; i++) { w[i] = 0.2 + 1.6 * rng_uniform(); sum += w[i]; }
    cu[0] = 0;
    double acc = 0;
    for (int i = 0; i < n; i++) {
        acc += w[i];
        cu[i + 1] = i == n - 1 ? T : (int64_t)llround(acc / sum * (double)T);
        if (cu[i + 1] < cu[i]) cu[i + 1] = cu[i];
    }
    free(w);
}

/* ---- output --------------------------------------------------------------- */

typedef struct result {
    int op;
    char shape[96];
    double ms, gflops, gbps, err, bound;
    const char *worst;          /* which output the error is of */
    gdn_status status;
    char message[512];
    int ok;
} result;

static void flags_str(unsigned f, char *buf, size_t n) {
    snprintf(buf, n, "%s%s%s%s%s", (f & GDN_QK_L2NORM) ? "l2norm " : "", (f & GDN_GATE_FUSED) ? "gate " : "",
             (f & GDN_BETA_SIGMOID) ? "beta_sigmoid " : "", (f & GDN_BETA_NEGATIVE) ? "beta_negative " : "",
             (f & GDN_STATE_V_FIRST) ? "v_first " : "");
    size_t len = strlen(buf);
    if (len) buf[len - 1] = 0;
    else snprintf(buf, n, "none");
}

static void json_str(const char *s) {
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20) printf("\\u%04x", *s);
        else putchar(*s);
    }
    putchar('"');
}

static void json_num(double x) {
    if (isfinite(x)) printf("%.6g", x);
    else printf("null");
}

/* GB/s (bytes read + written) of a plain memcpy of 64 MiB split over the
 * threads, best of 5: the ceiling the memory-bound ops' GB/s stand beside */
static double copy_gbps(int threads) {
    const size_t n = (size_t)64 << 20;
    char *a = malloc(n), *b = malloc(n);
    if (!a || !b) { free(a); free(b); return NAN; }
    memset(a, 1, n);
    memset(b, 0, n);
    double best = INFINITY;
    for (int r = 0; r < 5; r++) {
        const double t0 = now_ms();
#ifdef _OPENMP
        #pragma omp parallel num_threads(threads > 0 ? threads : 1)
        {
            const size_t nt = (size_t)omp_get_num_threads(), id = (size_t)omp_get_thread_num();
            const size_t lo = n / nt * id, hi = id + 1 == nt ? n : n / nt * (id + 1);
            memcpy(b + lo, a + lo, hi - lo);
        }
#else
        (void)threads;
        memcpy(b, a, n);
#endif
        const double t = (now_ms() - t0) * 1e-3;
        if (t < best) best = t;
    }
    free(a);
    free(b);
    return 2.0 * n / best * 1e-9;
}

static void print_json(const opts *o, const gdn_config *full, const gdn_config *slice, const call *lf,
                       const call *ls, int threads, double copy, const result *res, int nres, int all_ok) {
    char fl[128];
    flags_str(full->flags, fl, sizeof fl);
    printf("{\n  \"version\": \"%d.%d\",\n  \"backend\": \"%s\",\n  \"threads\": %d,\n", GDN_VERSION_MAJOR,
           GDN_VERSION_MINOR, be->name, threads);
    printf("  \"copy_gbytes_per_s\": ");
    json_num(copy);
    printf(",\n");
    printf("  \"config\": {\"B\": %lld, \"T\": %lld, \"H\": %d, \"HV\": %d, \"K\": %d, \"V\": %d, "
           "\"varlen\": %d, \"dtype\": \"%s\", \"gate_dtype\": \"%s\", \"flags\": \"%s\", \"h0\": true, \"ht\": true, "
           "\"seq_split\": %d, \"seed\": %llu},\n",
           (long long)full->B, (long long)full->T, full->H, full->HV, full->K, full->V, o->varlen,
           gdn_dtype_name(full->dtype), gdn_dtype_name(full->gate_dtype), fl, o->seq_split,
           (unsigned long long)o->seed);
    printf("  \"layer\": {\"decode_B\": %d, \"decode_slots\": %lld, \"decode_flags\": \"%s\", \"conv_D\": %d, "
           "\"conv_W\": %d, \"conv_act\": \"silu\", \"conv_bias\": true, \"conv_h0\": true, \"conv_ht\": true, "
           "\"norm_rows\": %lld, \"norm_V\": %d, \"norm_gate\": \"silu\", \"norm_eps\": %g},\n",
           lf->dec.B, (long long)lf->dec.num_slots,
           (lf->dec.flags & GDN_QK_L2NORM) ? ((lf->dec.flags & GDN_STATE_V_FIRST) ? "l2norm v_first" : "l2norm")
                                           : ((lf->dec.flags & GDN_STATE_V_FIRST) ? "v_first" : "none"),
           lf->conv.D, lf->conv.W, (long long)lf->norm.rows, lf->norm.V, (double)lf->norm.eps);
    printf("  \"timing\": {\"reps\": %d, \"warmup\": %d, \"statistic\": \"median\"},\n", o->reps, o->warmup);
    printf("  \"check\": {\"reference\": \"float64\", \"slice_B\": 1, \"slice_T\": %lld, \"metric\": "
           "\"||out-ref||/||ref||\", \"decode_rows\": %d},\n", (long long)slice->T, ls->dec.B);
    printf("  \"results\": [\n");
    for (int i = 0; i < nres; i++) {
        const result *r = &res[i];
        printf("    {\"op\": \"%s\", \"backend\": \"%s\", \"shape\": ", op_name[r->op], be->name);
        json_str(r->shape);
        printf(", \"time_ms\": "); json_num(r->status == GDN_OK ? r->ms : NAN);
        printf(", \"gflops\": "); json_num(r->status == GDN_OK && op_has_flops(r->op) ? r->gflops : NAN);
        printf(", \"gbytes_per_s\": "); json_num(r->status == GDN_OK ? r->gbps : NAN);
        printf(", \"rel_err\": "); json_num(r->status == GDN_OK ? r->err : NAN);
        printf(", \"worst\": "); json_str(r->worst);
        printf(", \"bound\": "); json_num(r->bound);
        printf(", \"status\": \"%s\", \"error\": ", gdn_status_string(r->status));
        json_str(r->message);
        printf(", \"ok\": %s}%s\n", r->ok ? "true" : "false", i + 1 < nres ? "," : "");
    }
    printf("  ],\n  \"ok\": %s\n}\n", all_ok ? "true" : "false");
}

static void print_table(const opts *o, const gdn_config *full, const gdn_config *slice, const call *lf,
                        const call *ls, int threads, double copy, const result *res, int nres, int all_ok) {
    char fl[128];
    flags_str(full->flags, fl, sizeof fl);
    printf("gdn %d.%d  backend %s, %d threads  dtype %s (gates %s)  flags %s  h0, ht", GDN_VERSION_MAJOR,
           GDN_VERSION_MINOR, be->name, threads, gdn_dtype_name(full->dtype), gdn_dtype_name(full->gate_dtype), fl);
    if (o->varlen) printf("  varlen %d sequences", o->varlen);
    printf("\ntime: median of %d after %d warm-up; rel.err: ||out-ref||/||ref|| vs float64 on a T=%lld slice",
           o->reps, o->warmup, (long long)slice->T);
    if (o->ops & (1u << OP_DECODE | 1u << OP_DECODE_CONV))
        printf(" (decode: first %d rows)", ls->dec.B);
    printf("\nGB/s: every input read once, every output written once (tools/flops.h)");
    if (isfinite(copy)) printf("; a plain copy on the same threads: %.1f GB/s", copy);
    printf("\n");
    if (o->ops & ~((1u << OP_DECODE) - 1))
        printf("layer: decode %d rows, pool of %lld slots, fp32 state; conv1d D=%d W=%d bias SiLU h0/ht; "
               "rmsnorm SiLU gate eps %g\n", lf->dec.B, (long long)lf->dec.num_slots, lf->conv.D, lf->conv.W,
               (double)lf->norm.eps);
    printf("\n%-17s %-7s %-28s %10s %9s %8s %9s %7s %s\n", "op", "backend", "shape", "time ms", "GFLOP/s", "GB/s",
           "rel.err", "bound", "ok");
    for (int i = 0; i < nres; i++) {
        const result *r = &res[i];
        if (r->status != GDN_OK) {
            printf("%-17s %-7s %-28s %10s %9s %8s %9s %7.0e %-4s %s: %s\n", op_name[r->op], be->name, r->shape, "-",
                   "-", "-", "-", r->bound, r->ok ? "skip" : "FAIL", gdn_status_string(r->status), r->message);
            continue;
        }
        char err[32], gf[32];
        if (isfinite(r->err)) snprintf(err, sizeof err, "%9.2e", r->err);
        else snprintf(err, sizeof err, "%9s", "non-finite");
        if (op_has_flops(r->op)) snprintf(gf, sizeof gf, "%9.2f", r->gflops);
        else snprintf(gf, sizeof gf, "%9s", "-");
        printf("%-17s %-7s %-28s %10.3f %s %8.2f %s %7.0e %s", op_name[r->op], be->name, r->shape, r->ms, gf,
               r->gbps, err, r->bound, r->ok ? "ok" : "FAIL");
        if (!r->ok) printf(" (%s)", r->worst);
        printf("\n");
    }
    int skipped = 0;
    for (int i = 0; i < nres; i++) skipped += res[i].status == GDN_ERR_UNSUPPORTED;
    printf("\n%s", all_ok ? "all within bounds" : "FAILED: an error is over its bound or a call failed");
    if (skipped) printf(" (%d op%s not on the %s backend: skipped)", skipped, skipped > 1 ? "s" : "", be->name);
    printf("\n");
}

/* ---- main ------------------------------------------------------------------ */

int main(int argc, char **argv) {
    opts o;
    const int prc = parse(argc, argv, &o);
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
    rng_state = o.seed * 0x2545f4914f6cdd1dULL + 12345;

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
        ragged(o.T, o.varlen, cu);
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
    cc->cu_seqlens = c->cu_seqlens; cc->num_seqs = c->num_seqs; cc->dtype = o.dtype; cc->silu = 1;
    gdn_rmsnorm_config *nc = &full.norm;
    nc->rows = c->B * c->T * c->HV; nc->V = o.V; nc->dtype = o.dtype; nc->eps = NORM_EPS; nc->gate = GDN_NORM_GATE_SILU;
    slice.dec = full.dec;
    slice.dec.B = o.decode_B < DECODE_CHECK_ROWS ? o.decode_B : DECODE_CHECK_ROWS;
    slice.conv = full.conv;
    slice.conv.B = cs->B; slice.conv.T = cs->T; slice.conv.cu_seqlens = cs->cu_seqlens;
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
        refs_compute(cs, bwd, &host, &r);
        progress("inputs of the gated delta rule", t0);   /* the slice reads a prefix of each host tensor */
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
        lrefs_compute(&slice, &lhost, layer_ops, &lr);
        progress("inputs of the layer pieces", t0);   /* the slice reads a prefix of each host tensor */
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

        x->err = check_op(op, &slice, &r, &lr, &x->status, &x->worst);
        if (x->status == GDN_OK) x->status = time_op(op, &full, o.warmup, o.reps, &x->ms);
        if (x->status != GDN_OK) {
            snprintf(x->message, sizeof x->message, "%s", gdn_last_error());
            x->ok = x->status == GDN_ERR_UNSUPPORTED;   /* not on this backend: skipped, not failed */
        } else {
            const double s = x->ms * 1e-3;
            x->gflops = s > 0 ? op_flops(op, &full) / s * 1e-9 : 0;
            x->gbps = s > 0 ? op_bytes(op, &full) / s * 1e-9 : 0;
            x->ok = isfinite(x->err) && x->err <= x->bound;
        }
        all_ok &= x->ok;
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
