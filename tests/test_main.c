/* gdn test program: every op and option of the CPU backend against the float64
 * reference (src/ref), the reference against finite differences, determinism,
 * and the bad-input contract of DESIGN.md §6.
 *
 *   GDN_TEST_SEED=<n>   base seed (default: time based, printed at the start)
 *   GDN_TEST_QUICK=1    lighter sweep (also: argument --quick)
 *   GDN_TEST_VERBOSE=1  print every check
 *
 * Ends with "N passed, M failed"; exit status 1 if any check failed. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "ref/ref.h"
#include "test_util.h"

long g_passed, g_failed;
int g_quick, g_verbose;
uint64_t g_base_seed;

int check(int ok, const char *ctx, const char *fmt, ...) {
    if (ok) g_passed++; else g_failed++;
    if (!ok || g_verbose) {
        va_list ap;
        va_start(ap, fmt);
        printf("%s %s: ", ok ? "ok  " : "FAIL", ctx);
        vprintf(fmt, ap);
        /* every failure names the base seed that repeats it */
        if (!ok) printf(" [repeat: GDN_TEST_SEED=%llu]", (unsigned long long)g_base_seed);
        printf("\n");
        va_end(ap);
        fflush(stdout);
    }
    return ok;
}

/* ---- rng ---- */

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t mix_seed(uint64_t base, uint64_t salt) {
    uint64_t x = base ^ (salt * 0xd1342543de82ef95ull);
    return splitmix(&x);
}

void rng_seed(rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t rng_u64(rng *r) {
    uint64_t *s = r->s;
    const uint64_t res = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t; s[3] = rotl(s[3], 45);
    return res;
}

double rng_uniform(rng *r) { return (double)(rng_u64(r) >> 11) * (1.0 / 9007199254740992.0); }

double rng_normal(rng *r) {
    double u1 = rng_uniform(r), u2 = rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

int64_t rng_int(rng *r, int64_t lo, int64_t hi) {
    return lo + (int64_t)(rng_u64(r) % (uint64_t)(hi - lo + 1));
}

/* ---- dtypes (the test's own conversions, independent of the library's) ---- */

uint16_t t_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float t_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t t_f32_to_f16(float f) {
    if (isnan(f)) return 0x7e00;
    uint16_t s = signbit(f) ? 0x8000 : 0;
    double a = fabs((double)f);
    if (a >= 65520.0) return s | 0x7c00;
    if (a < ldexp(1.0, -14)) return s | (uint16_t)nearbyint(a * ldexp(1.0, 24));  /* subnormal (1024 -> min normal) */
    int e;
    double fr = frexp(a, &e);                       /* a = fr 2^e, fr in [0.5, 1) */
    double m = nearbyint((2.0 * fr - 1.0) * 1024.0);  /* round to nearest even */
    int E = e - 1 + 15;
    if (m == 1024.0) { m = 0.0; E++; }
    return s | (uint16_t)(E << 10) | (uint16_t)m;
}

float t_f16_to_f32(uint16_t h) {
    const int s = h >> 15, E = (h >> 10) & 31, m = h & 1023;
    double v;
    if (E == 31) v = m ? NAN : INFINITY;
    else if (E == 0) v = ldexp((double)m, -24);
    else v = ldexp(1024.0 + m, E - 25);
    return (float)(s ? -v : v);
}

size_t t_dsize(gdn_dtype t) { return t == GDN_F32 ? 4 : 2; }

double t_store(gdn_dtype t, void *p, size_t i, float f) {
    switch (t) {
    case GDN_F32: ((float *)p)[i] = f; return f;
    case GDN_BF16: { uint16_t h = t_f32_to_bf16(f); ((uint16_t *)p)[i] = h; return t_bf16_to_f32(h); }
    case GDN_F16: { uint16_t h = t_f32_to_f16(f); ((uint16_t *)p)[i] = h; return t_f16_to_f32(h); }
    }
    return NAN;
}

double t_get(gdn_dtype t, const void *p, size_t i) {
    switch (t) {
    case GDN_F32: return ((const float *)p)[i];
    case GDN_BF16: return t_bf16_to_f32(((const uint16_t *)p)[i]);
    case GDN_F16: return t_f16_to_f32(((const uint16_t *)p)[i]);
    }
    return NAN;
}

void t_poison_nan(gdn_dtype t, void *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (t == GDN_F32) ((float *)p)[i] = NAN;
        else ((uint16_t *)p)[i] = t == GDN_BF16 ? 0x7fc0 : 0x7e00;
    }
}

/* exact size (no slack, so AddressSanitizer sees any overrun), zeroed */
void *t_alloc(size_t bytes) {
    void *p = calloc(bytes ? bytes : 1, 1);
    if (!p) { fprintf(stderr, "out of memory (%zu bytes)\n", bytes); exit(2); }
    return p;
}

const char *t_dtype_name(gdn_dtype t) {
    return t == GDN_F32 ? "f32" : t == GDN_BF16 ? "bf16" : t == GDN_F16 ? "f16" : "bad";
}

void flags_str(unsigned f, char *buf, size_t n) {
    static const char *names[] = {"QK_L2NORM", "GATE_FUSED", "BETA_SIGMOID", "BETA_NEGATIVE", "STATE_V_FIRST"};
    buf[0] = 0;
    size_t len = 0;
    for (int i = 0; i < 5; i++)
        if (f & (1u << i)) len += snprintf(buf + len, len < n ? n - len : 0, "%s%s", len ? "|" : "", names[i]);
    if (!len) snprintf(buf, n, "none");
}

/* ---- comparison ---- */

double rel_err_d(const double *a, const double *ref, size_t n, int *nonfinite) {
    double num = 0, den = 0;
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(ref[i])) bad++;
        const double d = a[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    if (nonfinite) *nonfinite = bad;
    if (bad) return INFINITY;
    return sqrt(den) < 1e-9 ? sqrt(num) : sqrt(num) / sqrt(den);
}

int check_close(const char *ctx, const char *what, gdn_dtype t, const void *out,
                const double *ref, size_t n, double bound) {
    return check_close_terms(ctx, what, t, out, ref, NULL, n, bound);
}

int check_close_terms(const char *ctx, const char *what, gdn_dtype t, const void *out,
                      const double *ref, const double *terms2, size_t n, double bound) {
    double num = 0, den = 0, den_ref = 0;
    size_t bad = 0, first_bad = 0, worst = 0;
    double worst_d = -1;
    for (size_t i = 0; i < n; i++) {
        const double x = t_get(t, out, i);
        if (!isfinite(x) || !isfinite(ref[i])) { if (!bad++) first_bad = i; continue; }
        const double d = fabs(x - ref[i]);
        if (d > worst_d) { worst_d = d; worst = i; }
        num += d * d;
        den_ref += ref[i] * ref[i];
        den += terms2 ? fmax(ref[i] * ref[i], terms2[i]) : ref[i] * ref[i];
    }
    if (bad)
        return check(0, ctx, "%s: %zu non-finite element(s), first at %zu (out %g, ref %g), n=%zu",
                     what, bad, first_bad, t_get(t, out, first_bad), ref[first_bad], n);
    /* "~0": below what the output dtype can carry (f16 flushes under 6e-8) */
    const int absolute = sqrt(den) < (t == GDN_F16 ? 1e-4 : 1e-9);
    const double err = absolute ? sqrt(num) : sqrt(num) / sqrt(den);
    char terms[64] = "";
    if (terms2) snprintf(terms, sizeof terms, ", ||terms|| %.3e", sqrt(den));
    return check(err <= bound, ctx, "%s: %s error %.3e vs bound %.1e (||ref|| %.3e%s, n=%zu, worst at %zu: out %.6g ref %.6g)",
                 what, absolute ? "abs" : terms2 ? "rel to max(|ref|, |terms|)" : "rel", err, bound, sqrt(den_ref),
                 terms, n, worst, n ? t_get(t, out, worst) : 0.0, n ? ref[worst] : 0.0);
}

double terms_err_d(const double *out, const double *ref, const double *terms2, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(out[i]) || !isfinite(ref[i])) return INFINITY;
        num += (out[i] - ref[i]) * (out[i] - ref[i]);
        den += terms2 ? fmax(ref[i] * ref[i], terms2[i]) : ref[i] * ref[i];
    }
    return sqrt(den) < 1e-9 ? sqrt(num) : sqrt(num) / sqrt(den);
}

void gate_param_terms2(size_t ng, int HV, const double *a, const double *dt_bias, const double *da, double *dA_t2, double *ddt_t2) {
    double da2 = 0.0, w2[64] = {0};
    size_t n[64] = {0};
    for (int j = 0; j < HV; j++) dA_t2[j] = ddt_t2[j] = 0.0;
    for (size_t i = 0; i < ng; i++) {
        const int j = (int)(i % HV);
        const double x = a[i] + (dt_bias ? dt_bias[j] : 0.0);
        const double sp = gdn_ref_softplus(x), dsp = x > 20 ? 1.0 : 1.0 / (1.0 + exp(-x));
        const double term = da[i] * sp / dsp;   /* da = dg * -e^A_log * sp', g = -e^A_log * sp: term = dg g */
        dA_t2[j] += term * term;
        ddt_t2[j] += da[i] * da[i];
        da2 += da[i] * da[i];
        w2[j] += (sp / dsp) * (sp / dsp);
        n[j]++;
    }
    /* what da's own bound lets through: |sum_t (da_t - da_ref_t) w_t| <= ||da - da_ref|| ||w||,
     * w_t = g_t / g'_t for dA_log and 1 for ddt_bias (Cauchy-Schwarz) */
    for (int j = 0; j < HV; j++) { dA_t2[j] += da2 * w2[j]; ddt_t2[j] += da2 * (double)n[j]; }
}

void gate_param_sums(size_t ng, int HV, const double *a, const double *dt_bias, gdn_dtype gdt, const void *da,
                     const unsigned char *skip, double *dA, double *ddt, double *dA_t2, double *ddt_t2) {
    for (int j = 0; j < HV; j++) dA[j] = ddt[j] = dA_t2[j] = ddt_t2[j] = 0.0;
    for (size_t i = 0; i < ng; i++) {
        if (skip && skip[i / HV]) continue;
        const int j = (int)(i % HV);
        const double x = a[i] + (dt_bias ? dt_bias[j] : 0.0);
        const double sp = gdn_ref_softplus(x), dsp = x > 20 ? 1.0 : 1.0 / (1.0 + exp(-x));
        const double d = t_get(gdt, da, i), term = d * sp / dsp;
        dA[j] += term; dA_t2[j] += term * term;
        ddt[j] += d; ddt_t2[j] += d * d;
    }
}

double bound_gate_sums(gdn_dtype gdt) {
    /* da's rounding to its dtype (unit u) in each term: 8u of the terms' norm */
    return gdt == GDN_F32 ? 1e-5 : gdt == GDN_BF16 ? 8.0 / 512 : 8.0 / 4096;
}

int check_gate_sums(const char *ctx, size_t ng, int HV, const double *a, const double *dt_bias, gdn_dtype gdt,
                    const void *da, const float *dA_log, const float *ddt_bias) {
    double dA[64], ddt[64], dA_t2[64], ddt_t2[64];
    gate_param_sums(ng, HV, a, dt_bias, gdt, da, NULL, dA, ddt, dA_t2, ddt_t2);
    const double b = bound_gate_sums(gdt);
    int ok = check_close_terms(ctx, "dA_log (the sum of dg_t g_t over its da)", GDN_F32, dA_log, dA, dA_t2, (size_t)HV, b);
    if (ddt_bias)
        ok &= check_close_terms(ctx, "ddt_bias (the sum of its da)", GDN_F32, ddt_bias, ddt, ddt_t2, (size_t)HV, b);
    return ok;
}

double bound_fwd(gdn_dtype t) { return t == GDN_F32 ? 1e-5 : 5e-3; }
double bound_grad(gdn_dtype t) { return t == GDN_F32 ? 1e-4 : 1e-2; }

/* ---- main ---- */

int main(int argc, char **argv) {
    const char *s = getenv("GDN_TEST_SEED");
    if (s && *s) g_base_seed = strtoull(s, NULL, 0);
    else g_base_seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    const char *qk = getenv("GDN_TEST_QUICK");
    g_quick = qk && *qk && strcmp(qk, "0") != 0;
    const char *vb = getenv("GDN_TEST_VERBOSE");
    g_verbose = vb && *vb && strcmp(vb, "0") != 0;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) g_quick = 1;
        else if (!strcmp(argv[i], "--verbose")) g_verbose = 1;
        else if (!strncmp(argv[i], "--only=", 7)) only = argv[i] + 7;
        else { fprintf(stderr, "usage: %s [--quick] [--verbose] [--only=ref|backend|standalone|errors|conv1d|rmsnorm|decode|cp|cuda]\n", argv[0]); return 2; }
    }
    printf("gdn_tests: base seed %llu (set GDN_TEST_SEED=%llu to repeat)%s\n",
           (unsigned long long)g_base_seed, (unsigned long long)g_base_seed, g_quick ? ", quick mode" : "");
    fflush(stdout);

    struct { const char *name; void (*fn)(void); } groups[] = {
        {"ref", test_ref_selfcheck},
        {"standalone", test_standalone},
        {"errors", test_errors},
        {"backend", test_backend},
        {"conv1d", test_conv1d},
        {"rmsnorm", test_rmsnorm},
        {"decode", test_decode},
        {"cp", test_cp},
        {"cuda", test_cuda},
    };
    for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++) {
        if (only && strcmp(only, groups[i].name)) continue;
        const long p0 = g_passed, f0 = g_failed;
        const clock_t c0 = clock();
        struct timespec w0, w1;
        timespec_get(&w0, TIME_UTC);
        groups[i].fn();
        timespec_get(&w1, TIME_UTC);
        printf("[%s] %ld passed, %ld failed (%.1f s)\n", groups[i].name, g_passed - p0, g_failed - f0,
               (double)(w1.tv_sec - w0.tv_sec) + 1e-9 * (double)(w1.tv_nsec - w0.tv_nsec));
        (void)c0;
        fflush(stdout);
    }
    printf("%ld passed, %ld failed\n", g_passed, g_failed);
    return g_failed ? 1 : 0;
}
