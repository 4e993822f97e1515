/* Gated RMSNorm (DESIGN.md §4 item 5): the float64 reference against central
 * finite differences, the CPU backend against the reference (forward and
 * backward, every dtype, both gates, rstd kept or recomputed, poisoned
 * outputs), dw bit-identical across thread counts, and the bad-input contract. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "test_util.h"
#include "ref/ref_rmsnorm.h"

static double *dalloc(size_t n) { return t_alloc(n * sizeof(double)); }

static const char *gate_name(gdn_norm_gate g) { return g == GDN_NORM_GATE_SILU ? "silu" : "sigmoid"; }

/* ---- the reference's gradients against central differences of L = <dy, y> ---- */

static double ref_loss(int64_t rows, int V, double eps, gdn_norm_gate g, const double *x, const double *z,
                       const double *w, const double *dy, double *y) {
    gdn_ref_rmsnorm_fwd(rows, V, eps, g, x, z, w, y, NULL);
    double L = 0;
    for (int64_t i = 0; i < rows * V; i++) L += dy[i] * y[i];
    return L;
}

/* d L / d p[i] for every i, by central differences */
static void fd_grad(int64_t rows, int V, double eps, gdn_norm_gate g, double *x, double *z, double *w,
                    const double *dy, double *p, size_t n, double *out, double *y) {
    for (size_t i = 0; i < n; i++) {
        const double keep = p[i], h = 1e-6 * (1.0 + fabs(keep));
        p[i] = keep + h;
        const double lp = ref_loss(rows, V, eps, g, x, z, w, dy, y);
        p[i] = keep - h;
        const double lm = ref_loss(rows, V, eps, g, x, z, w, dy, y);
        p[i] = keep;
        out[i] = (lp - lm) / (2 * h);
    }
}

static void test_ref_fd(rng *r) {
    char ctx[256];
    const int shapes[3][2] = {{1, 1}, {3, 4}, {2, 7}};
    for (int si = 0; si < 3; si++)
        for (int gi = 0; gi < 2; gi++) {
            const gdn_norm_gate g = (gdn_norm_gate)gi;
            const int64_t rows = shapes[si][0];
            const int V = shapes[si][1];
            const double eps = si == 0 ? 0.3 : 1e-5;  /* V = 1: dx ~ eps, visible only for a large eps */
            const size_t n = (size_t)rows * V;
            double *x = dalloc(n), *z = dalloc(n), *w = dalloc(V), *dy = dalloc(n), *y = dalloc(n);
            double *dx = dalloc(n), *dz = dalloc(n), *dw = dalloc(V), *fx = dalloc(n), *fz = dalloc(n), *fw = dalloc(V);
            for (size_t i = 0; i < n; i++) { x[i] = rng_normal(r); z[i] = 2 * rng_normal(r); dy[i] = rng_normal(r); }
            for (int i = 0; i < V; i++) w[i] = 1 + 0.3 * rng_normal(r);
            gdn_ref_rmsnorm_bwd(rows, V, eps, g, x, z, w, dy, dx, dz, dw);
            fd_grad(rows, V, eps, g, x, z, w, dy, x, n, fx, y);
            fd_grad(rows, V, eps, g, x, z, w, dy, z, n, fz, y);
            fd_grad(rows, V, eps, g, x, z, w, dy, w, V, fw, y);
            snprintf(ctx, sizeof ctx, "op=rmsnorm ref-vs-finite-differences rows=%lld V=%d gate=%s eps=%g seed=%llu",
                     (long long)rows, V, gate_name(g), eps, (unsigned long long)g_base_seed);
            const double ex = rel_err_d(dx, fx, n, NULL), ez = rel_err_d(dz, fz, n, NULL), ew = rel_err_d(dw, fw, V, NULL);
            check(ex < 1e-6 && ez < 1e-6 && ew < 1e-6, ctx, "rel err dx %.2e dz %.2e dw %.2e (bound 1e-6)", ex, ez, ew);
            free(x); free(z); free(w); free(dy); free(y); free(dx); free(dz); free(dw); free(fx); free(fz); free(fw);
        }
}

/* ---- CPU vs reference ---- */

static void run_case(rng *r, gdn_dtype t, gdn_norm_gate g, int64_t rows, int V, float eps, int keep_rstd) {
    char ctx[320];
    const size_t n = (size_t)rows * V, ds = t_dsize(t);
    void *x = t_alloc(n * ds), *z = t_alloc(n * ds), *dy = t_alloc(n * ds), *y = t_alloc(n * ds);
    void *dx[2] = {t_alloc(n * ds), t_alloc(n * ds)}, *dz[2] = {t_alloc(n * ds), t_alloc(n * ds)};
    float *w = t_alloc((size_t)V * 4), *rs = t_alloc((size_t)rows * 4);
    float *dw[2] = {t_alloc((size_t)V * 4), t_alloc((size_t)V * 4)};
    double *xd = dalloc(n), *zd = dalloc(n), *dyd = dalloc(n), *wd = dalloc(V), *y_ref = dalloc(n),
           *rs_ref = dalloc(rows), *dx_ref = dalloc(n), *dz_ref = dalloc(n), *dw_ref = dalloc(V);
    for (size_t i = 0; i < n; i++) {
        const int64_t row = (int64_t)(i / V);
        /* every 7th row tiny, so that mean(x^2) ~ eps and eps matters (f16: less
         * tiny, dx ~ r * z must stay below 65504) */
        xd[i] = t_store(t, x, i, (float)(rng_normal(r) * (row % 7 == 3 ? (t == GDN_F16 ? 3e-3 : 1e-3) : 1.0)));
        double zz = 2.5 * rng_normal(r);
        if (i % 23 == 11)   /* saturated gate: sigmoid(z) = 0 or 1 in fp32 */
            zz = (i % 2 ? 1 : -1) * (g == GDN_NORM_GATE_SILU ? 10 + 10 * rng_uniform(r) : 20 + 20 * rng_uniform(r));
        zd[i] = t_store(t, z, i, (float)zz);
        dyd[i] = t_store(t, dy, i, (float)rng_normal(r));
    }
    for (int i = 0; i < V; i++) { w[i] = (float)(1 + 0.2 * rng_normal(r)); wd[i] = w[i]; }
    gdn_ref_rmsnorm_fwd(rows, V, eps, g, xd, zd, wd, y_ref, rs_ref);
    gdn_ref_rmsnorm_bwd(rows, V, eps, g, xd, zd, wd, dyd, dx_ref, dz_ref, dw_ref);
    /* the terms of the sums that can cancel (docs/DESIGN.md §5) */
    double *dx_terms2 = dalloc(n), *dw_terms2 = dalloc(V);
    gdn_ref_rmsnorm_bwd_terms(rows, V, eps, g, xd, zd, wd, dyd, dx_terms2, dw_terms2);
    const gdn_rmsnorm_config c = {rows, V, t, eps, g};

    snprintf(ctx, sizeof ctx, "op=rmsnorm_fwd backend=cpu dtype=%s gate=%s rows=%lld V=%d eps=%g rstd=%s seed=%llu",
             t_dtype_name(t), gate_name(g), (long long)rows, V, (double)eps, keep_rstd ? "kept" : "NULL",
             (unsigned long long)g_base_seed);
    t_poison_nan(t, y, n);
    t_poison_nan(GDN_F32, rs, rows);
    gdn_exec ex2 = {GDN_BACKEND_CPU, NULL, 2, 0};
    gdn_status st = gdn_rmsnorm_gated_fwd(&ex2, &c, x, z, w, y, keep_rstd ? rs : NULL);
    if (check(st == GDN_OK, ctx, "status %s (%s)", gdn_status_string(st), gdn_last_error())) {
        check(gdn_last_error()[0] == 0, ctx, "gdn_last_error() not empty after success");
        check_close(ctx, "y", t, y, y_ref, n, bound_fwd(t));
        if (keep_rstd) check_close(ctx, "rstd", GDN_F32, rs, rs_ref, rows, bound_fwd(t));
    }

    /* backward with 1 and 2 threads: both against the reference, and bit-identical */
    for (int ti = 0; ti < 2; ti++) {
        const gdn_exec ex = {GDN_BACKEND_CPU, NULL, ti + 1, 0};
        snprintf(ctx, sizeof ctx, "op=rmsnorm_bwd backend=cpu threads=%d dtype=%s gate=%s rows=%lld V=%d eps=%g rstd=%s seed=%llu",
                 ti + 1, t_dtype_name(t), gate_name(g), (long long)rows, V, (double)eps,
                 keep_rstd ? "kept" : "NULL", (unsigned long long)g_base_seed);
        t_poison_nan(t, dx[ti], n);
        t_poison_nan(t, dz[ti], n);
        t_poison_nan(GDN_F32, dw[ti], V);
        st = gdn_rmsnorm_gated_bwd(&ex, &c, x, z, w, keep_rstd ? rs : NULL, dy, dx[ti], dz[ti], dw[ti]);
        if (check(st == GDN_OK, ctx, "status %s (%s)", gdn_status_string(st), gdn_last_error())) {
            check(gdn_last_error()[0] == 0, ctx, "gdn_last_error() not empty after success");
            check_close_terms(ctx, "dx", t, dx[ti], dx_ref, dx_terms2, n, bound_grad(t));
            check_close(ctx, "dz", t, dz[ti], dz_ref, n, bound_grad(t));
            check_close_terms(ctx, "dw", GDN_F32, dw[ti], dw_ref, dw_terms2, V, bound_grad(t));
        }
    }
    snprintf(ctx, sizeof ctx, "op=rmsnorm_bwd backend=cpu dtype=%s gate=%s rows=%lld V=%d seed=%llu [determinism]",
             t_dtype_name(t), gate_name(g), (long long)rows, V, (unsigned long long)g_base_seed);
    check(!memcmp(dw[0], dw[1], (size_t)V * 4) && !memcmp(dx[0], dx[1], n * ds) && !memcmp(dz[0], dz[1], n * ds),
          ctx, "threads=1 and threads=2 differ (dw %s, dx %s, dz %s)",
          memcmp(dw[0], dw[1], (size_t)V * 4) ? "differs" : "same", memcmp(dx[0], dx[1], n * ds) ? "differs" : "same",
          memcmp(dz[0], dz[1], n * ds) ? "differs" : "same");

    free(x); free(z); free(dy); free(y); free(dx[0]); free(dx[1]); free(dz[0]); free(dz[1]);
    free(w); free(rs); free(dw[0]); free(dw[1]);
    free(xd); free(zd); free(dyd); free(wd); free(y_ref); free(rs_ref); free(dx_ref); free(dz_ref); free(dw_ref);
    free(dx_terms2); free(dw_terms2);
}

/* ---- bad input: status, message, no output byte changed ---- */

enum { B_X, B_Z, B_DY, B_W, B_RS_IN, B_Y, B_RS, B_DX, B_DZ, B_DW, NB };
#define BAD_BYTES 4096
#define PATTERN 0x5A

static void bad_case(const char *what, int bwd, const gdn_exec *ex, const gdn_rmsnorm_config *c,
                     void **b, int null_which, gdn_status want) {
    char ctx[256];
    void *p[NB];
    for (int i = 0; i < NB; i++) p[i] = i == null_which ? NULL : b[i];
    for (int i = B_Y; i < NB; i++) if (p[i]) memset(p[i], PATTERN, BAD_BYTES);
    const gdn_status st = bwd ? gdn_rmsnorm_gated_bwd(ex, c, p[B_X], p[B_Z], p[B_W], p[B_RS_IN], p[B_DY], p[B_DX], p[B_DZ], p[B_DW])
                              : gdn_rmsnorm_gated_fwd(ex, c, p[B_X], p[B_Z], p[B_W], p[B_Y], p[B_RS]);
    snprintf(ctx, sizeof ctx, "op=rmsnorm_%s bad input: %s", bwd ? "bwd" : "fwd", what);
    int same = 1;
    for (int i = B_Y; i < NB; i++)
        if (p[i]) for (int k = 0; k < BAD_BYTES; k++) same &= ((unsigned char *)p[i])[k] == PATTERN;
    check(st == want && gdn_last_error()[0] != 0 && same, ctx, "status %s (want %s), message \"%s\", outputs %s",
          gdn_status_string(st), gdn_status_string(want), gdn_last_error(), same ? "unchanged" : "CHANGED");
}

static void test_bad_input(void) {
    void *b[NB];
    for (int i = 0; i < NB; i++) b[i] = t_alloc(BAD_BYTES);
    for (int i = 0; i < BAD_BYTES / 4; i++) {
        ((float *)b[B_X])[i] = 0.5f; ((float *)b[B_Z])[i] = 0.25f; ((float *)b[B_DY])[i] = 1.f;
        ((float *)b[B_W])[i] = 1.f; ((float *)b[B_RS_IN])[i] = 1.f;
    }
    const gdn_rmsnorm_config ok = {4, 16, GDN_F32, 1e-6f, GDN_NORM_GATE_SILU};
    for (int bwd = 0; bwd < 2; bwd++) {
        gdn_rmsnorm_config c;
        c = ok; bad_case("cfg NULL", bwd, NULL, NULL, b, -1, GDN_ERR_NULL);
        c = ok; c.rows = -1; bad_case("rows -1", bwd, NULL, &c, b, -1, GDN_ERR_SHAPE);
        c = ok; c.V = 0; bad_case("V 0", bwd, NULL, &c, b, -1, GDN_ERR_SHAPE);
        c = ok; c.V = -3; bad_case("V -3", bwd, NULL, &c, b, -1, GDN_ERR_SHAPE);
        c = ok; c.dtype = (gdn_dtype)7; bad_case("dtype 7", bwd, NULL, &c, b, -1, GDN_ERR_DTYPE);
        c = ok; c.eps = 0.f; bad_case("eps 0", bwd, NULL, &c, b, -1, GDN_ERR_OPTION);
        c = ok; c.eps = -1e-6f; bad_case("eps -1e-6", bwd, NULL, &c, b, -1, GDN_ERR_OPTION);
        c = ok; c.eps = NAN; bad_case("eps NaN", bwd, NULL, &c, b, -1, GDN_ERR_OPTION);
        c = ok; c.eps = INFINITY; bad_case("eps inf", bwd, NULL, &c, b, -1, GDN_ERR_OPTION);
        c = ok; c.gate = (gdn_norm_gate)2; bad_case("gate 2", bwd, NULL, &c, b, -1, GDN_ERR_OPTION);
        const gdn_exec neg = {GDN_BACKEND_CPU, NULL, -1, 0};
        bad_case("threads -1", bwd, &neg, &ok, b, -1, GDN_ERR_OPTION);
        const gdn_exec cuda = {GDN_BACKEND_CUDA, NULL, 0, 0};
        if (!gdn_backend_available(GDN_BACKEND_CUDA)) bad_case("CUDA not built", bwd, &cuda, &ok, b, -1, GDN_ERR_BACKEND);
        const gdn_exec unk = {(gdn_backend)9, NULL, 0, 0};
        bad_case("backend 9", bwd, &unk, &ok, b, -1, GDN_ERR_BACKEND);
        const int need_fwd[] = {B_X, B_Z, B_W, B_Y}, need_bwd[] = {B_X, B_Z, B_W, B_DY, B_DX, B_DZ, B_DW};
        const char *names[NB] = {"x NULL", "z NULL", "dy NULL", "w NULL", "rstd NULL", "y NULL", "rstd NULL",
                                 "dx NULL", "dz NULL", "dw NULL"};
        const int *need = bwd ? need_bwd : need_fwd, nn = bwd ? 7 : 4;
        for (int k = 0; k < nn; k++) bad_case(names[need[k]], bwd, NULL, &ok, b, need[k], GDN_ERR_NULL);
    }
    /* dw is written even with rows == 0, so it is required there too */
    const gdn_rmsnorm_config empty = {0, 16, GDN_BF16, 1e-6f, GDN_NORM_GATE_SIGMOID};
    bad_case("rows 0, dw NULL", 1, NULL, &empty, b, B_DW, GDN_ERR_NULL);
    /* rows == 0 is legal with NULL tensors; backward writes dw = 0 */
    gdn_status st = gdn_rmsnorm_gated_fwd(NULL, &empty, NULL, NULL, NULL, NULL, NULL);
    check(st == GDN_OK && gdn_last_error()[0] == 0, "op=rmsnorm_fwd rows=0 all NULL", "status %s (%s)",
          gdn_status_string(st), gdn_last_error());
    float dw[16];
    t_poison_nan(GDN_F32, dw, 16);
    st = gdn_rmsnorm_gated_bwd(NULL, &empty, NULL, NULL, NULL, NULL, NULL, NULL, NULL, dw);
    int zero = 1;
    for (int i = 0; i < 16; i++) zero &= dw[i] == 0.f;
    check(st == GDN_OK && zero, "op=rmsnorm_bwd rows=0 tensors NULL", "status %s (%s), dw %s",
          gdn_status_string(st), gdn_last_error(), zero ? "zeros" : "NOT zeros");
    for (int i = 0; i < NB; i++) free(b[i]);
}

void test_rmsnorm(void) {
    rng r;
    rng_seed(&r, mix_seed(g_base_seed, 0x726d73));
    test_ref_fd(&r);
    const gdn_dtype dts[3] = {GDN_F32, GDN_BF16, GDN_F16};
    const int64_t rows_list[4] = {0, 1, 37, 1000};
    const int Vs[5] = {1, 5, 64, 128, 256};
    int k = 0;
    for (int di = 0; di < 3; di++)
        for (int gi = 0; gi < 2; gi++)
            for (int ri = 0; ri < 4; ri++)
                for (int vi = 0; vi < 5; vi++, k++) {
                    const int64_t rows = (g_quick && vi >= 3) ? rows_list[ri] / 4 : rows_list[ri];
                    run_case(&r, dts[di], (gdn_norm_gate)gi, rows, Vs[vi], k % 2 ? 1e-5f : 1e-6f, (k / 2) % 2);
                }
    test_bad_input();
}
