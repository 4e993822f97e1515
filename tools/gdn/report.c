/* The gdn command's output: the results as a table or as one JSON object on
 * stdout, and copy_gbps(), the plain memcpy rate the memory-bound ops' GB/s
 * stand beside.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"

#ifdef _OPENMP
#include <omp.h>
#endif

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

/* a plain memcpy of n bytes split evenly over the threads */
void copy_on_threads(char *dst, const char *src, size_t n, int threads) {
#ifdef _OPENMP
    #pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
        const size_t nt = (size_t)omp_get_num_threads(), id = (size_t)omp_get_thread_num();
        const size_t lo = n / nt * id, hi = id + 1 == nt ? n : n / nt * (id + 1);
        memcpy(dst + lo, src + lo, hi - lo);
    }
#else
    (void)threads;
    memcpy(dst, src, n);
#endif
}

/* GB/s (bytes read + written) of a plain memcpy of 64 MiB split over the
 * threads, best of 5: the ceiling the memory-bound ops' GB/s stand beside */
double copy_gbps(int threads) {
    const size_t n = (size_t)64 << 20;
    char *a = malloc(n), *b = malloc(n);
    if (!a || !b) { free(a); free(b); return NAN; }
    memset(a, 1, n);
    memset(b, 0, n);
    double best = INFINITY;
    for (int r = 0; r < 5; r++) {
        const double t0 = now_ms();
        copy_on_threads(b, a, n, threads);
        const double t = (now_ms() - t0) * 1e-3;
        if (t < best) best = t;
    }
    free(a);
    free(b);
    return 2.0 * n / best * 1e-9;
}

void print_json(const opts *o, const gdn_config *full, const gdn_config *slice, const call *lf,
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
    if (o->no_check)
        printf("  \"check\": null,\n");
    else
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
        printf(", \"of_copy\": "); json_num(r->status == GDN_OK ? r->of_copy : NAN);
        printf(", \"rel_err\": "); json_num(r->status == GDN_OK ? r->err : NAN);
        printf(", \"worst\": "); json_str(r->worst);
        printf(", \"bound\": "); json_num(r->bound);
        printf(", \"status\": \"%s\", \"error\": ", gdn_status_string(r->status));
        json_str(r->message);
        printf(", \"ok\": %s}%s\n", r->ok ? "true" : "false", i + 1 < nres ? "," : "");
    }
    printf("  ],\n  \"ok\": %s\n}\n", all_ok ? "true" : "false");
}

void print_table(const opts *o, const gdn_config *full, const gdn_config *slice, const call *lf,
                        const call *ls, int threads, double copy, const result *res, int nres, int all_ok) {
    char fl[128];
    flags_str(full->flags, fl, sizeof fl);
    printf("gdn %d.%d  backend %s, %d threads  dtype %s (gates %s)  flags %s  h0, ht", GDN_VERSION_MAJOR,
           GDN_VERSION_MINOR, be->name, threads, gdn_dtype_name(full->dtype), gdn_dtype_name(full->gate_dtype), fl);
    if (o->varlen) printf("  varlen %d sequences", o->varlen);
    if (o->no_check)
        printf("\ntime: median of %d after %d warm-up; rel.err: not checked (--no-check)", o->reps, o->warmup);
    else
        printf("\ntime: median of %d after %d warm-up; rel.err: ||out-ref||/||ref|| vs float64 on a T=%lld slice",
               o->reps, o->warmup, (long long)slice->T);
    if (o->ops & (1u << OP_DECODE | 1u << OP_DECODE_CONV))
        printf(" (decode: first %d rows)", ls->dec.B);
    printf("\nGB/s: every input read once, every output written once (tools/flops.h)");
    if (isfinite(copy)) printf("; a plain copy on the same threads: %.1f GB/s", copy);
    printf("\n");
    int vs = 0;
    for (int i = 0; i < nres; i++) vs |= isfinite(res[i].of_copy);
    if (vs)
        printf("%%copy: the op's GB/s against the copy's, the two run in alternation (each from memory), "
               "the median of %d pairs' ratios\n", 2 * o->reps + 1);
    if (o->ops & ~((1u << OP_DECODE) - 1))
        printf("layer: decode %d rows, pool of %lld slots, fp32 state; conv1d D=%d W=%d bias SiLU h0/ht; "
               "rmsnorm SiLU gate eps %g\n", lf->dec.B, (long long)lf->dec.num_slots, lf->conv.D, lf->conv.W,
               (double)lf->norm.eps);
    printf("\n%-17s %-7s %-28s %10s %9s %8s %6s %9s %7s %s\n", "op", "backend", "shape", "time ms", "GFLOP/s", "GB/s",
           "%copy", "rel.err", "bound", "ok");
    for (int i = 0; i < nres; i++) {
        const result *r = &res[i];
        if (r->status != GDN_OK) {
            printf("%-17s %-7s %-28s %10s %9s %8s %6s %9s %7.0e %-4s %s: %s\n", op_name[r->op], be->name, r->shape, "-",
                   "-", "-", "-", "-", r->bound, r->ok ? "skip" : "FAIL", gdn_status_string(r->status), r->message);
            continue;
        }
        char err[32], gf[32], vc[16];
        if (o->no_check) snprintf(err, sizeof err, "%9s", "-");
        else if (isfinite(r->err)) snprintf(err, sizeof err, "%9.2e", r->err);
        else snprintf(err, sizeof err, "%9s", "non-finite");
        if (op_has_flops(r->op)) snprintf(gf, sizeof gf, "%9.2f", r->gflops);
        else snprintf(gf, sizeof gf, "%9s", "-");
        if (isfinite(r->of_copy)) snprintf(vc, sizeof vc, "%5.0f%%", 100 * r->of_copy);
        else snprintf(vc, sizeof vc, "%6s", "-");
        printf("%-17s %-7s %-28s %10.3f %s %8.2f %s %s %7.0e %s", op_name[r->op], be->name, r->shape, r->ms, gf,
               r->gbps, vc, err, r->bound, o->no_check ? "-" : r->ok ? "ok" : "FAIL");
        if (!r->ok) printf(" (%s)", r->worst);
        printf("\n");
    }
    int skipped = 0;
    for (int i = 0; i < nres; i++) skipped += res[i].status == GDN_ERR_UNSUPPORTED;
    if (o->no_check) printf("\n%s", all_ok ? "every call ran (not checked: --no-check)" : "FAILED: a call failed");
    else printf("\n%s", all_ok ? "all within bounds" : "FAILED: an error is over its bound or a call failed");
    if (skipped) printf(" (%d op%s not on the %s backend: skipped)", skipped, skipped > 1 ? "s" : "", be->name);
    printf("\n");
}
