/* The gdn command's flags: usage() (the --help text), the value parsers and
 * parse_args(), which fills an opts from argv with the defaults, checks the
 * shape, and reports bad flags on stderr (exit status 2).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"

static void usage(FILE *f) {
    fprintf(f,
"usage: gdn [flags]\n"
"\n"
"Runs each op of the gdn library on one shape. For each it prints the median\n"
"time of --reps runs after --warmup runs, GFLOP/s and GB/s (FLOP and byte\n"
"models of tools/flops.h; bytes = every input read once, every output written\n"
"once; on the CPU the streaming ops' %%copy, their GB/s against a plain copy's\n"
"on the same threads, the two run in alternation, the median of the pairs'\n"
"ratios), and the relative error ||out - ref|| / ||ref|| against a float64\n"
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
"  --hash             after timing chunk_fwd, chunk_fwd+bwd, recurrent_fwd,\n"
"                     conv1d_fwd or conv1d_bwd, print a hash of each\n"
"                     full output (the same bits between builds)\n"
"  --no-check         no float64 reference and no run on the slice: the ops are\n"
"                     timed (and hashed) only, rel.err shows '-' and nothing is\n"
"                     checked (for timing rounds; the default checks every op)\n"
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
int parse_args(int argc, char **argv, opts *o) {
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
                                         "--v-first", "--json", "--quick", "--hash", "--no-check"};
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
            if (!strcmp(name, "--hash")) o->hash = 1;
            if (!strcmp(name, "--no-check")) o->no_check = 1;
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
