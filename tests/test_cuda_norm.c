/* The gated RMSNorm, gate and L2 norm device tests on the CUDA backend, forward
 * and backward, against the float64 reference (and the CPU backend), run by
 * test_cuda_layer() (test_cuda_layer.c) through test_norms and test_norms_bwd. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ref/ref.h"
#include "ref/ref_rmsnorm.h"
#include "test_util.h"

#ifndef GDN_HAVE_CUDA
/* not built without nvcc: test_cuda_layer() (test_cuda_layer.c) says skipped */
#else
#include <cuda_runtime_api.h>
#include "test_cuda_util.h"

/* ---- gated RMSNorm, gate, L2 norm ---- */

static void rmsnorm_case(int64_t rows, int V, gdn_dtype dt, gdn_norm_gate g, float eps, int want_rstd, int misalign,
                         uint64_t seed) {
    rng r;
    rng_seed(&r, seed);
    char ctx[300];
    snprintf(ctx, sizeof ctx, "op=rmsnorm_fwd backend=cuda dtype=%s gate=%s rows=%lld V=%d eps=%g rstd=%s misalign=%d "
             "seed=%llu", t_dtype_name(dt), g == GDN_NORM_GATE_SILU ? "silu" : "sigmoid", (long long)rows, V, (double)eps,
             want_rstd ? "kept" : "NULL", misalign, (unsigned long long)seed);
    const size_t n = (size_t)rows * V;
    double *xd = dvec(n), *zd = dvec(n), *wd = dvec(V), *yr = dvec(n), *rsr = dvec((size_t)rows);
    void *x = rnd(&r, dt, n, 1.0, xd), *z = rnd(&r, dt, n, 1.5, zd);
    float *w = rnd(&r, GDN_F32, V, 1.0, wd);
    for (int64_t i = 0; i < rows; i += 5)   /* some rows tiny: eps matters */
        for (int v = 0; v < V; v++) xd[i * V + v] = t_store(dt, x, (size_t)i * V + v, (float)(1e-3 * xd[i * V + v]));
    gdn_ref_rmsnorm_fwd(rows, V, eps, g, xd, zd, wd, yr, rsr);
    void *xb, *zb, *yb, *rb;
    const void *dx = dput_at(x, n, dt, misalign, &xb), *dz = dput_at(z, n, dt, 0, &zb);
    void *dy = dnan_at(dt, n, misalign, &yb);
    float *drs = dnan_at(GDN_F32, (size_t)rows, 0, &rb), *dw = dput(w, (size_t)V * 4);
    const gdn_rmsnorm_config c = {rows, V, dt, eps, g};
    const gdn_exec ex = {GDN_BACKEND_CUDA, NULL, 0, 0};
    const gdn_status s = gdn_rmsnorm_gated_fwd(&ex, &c, dx, dz, dw, dy, want_rstd ? drs : NULL);
    if (ran(ctx, s)) {
        dclose(ctx, "y", dt, dy, yr, n, bound_fwd(dt));
        if (want_rstd) dclose(ctx, "rstd", GDN_F32, drs, rsr, (size_t)rows, bound_fwd(GDN_F32));
    }
    void *dev[] = {xb, zb, yb, rb, dw};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
    free(xd); free(zd); free(wd); free(yr); free(rsr); free(x); free(z); free(w);
}

static void gate_case(int64_t rows, int HV, gdn_dtype dt, int with_bias, int misalign, uint64_t seed) {
    rng r;
    rng_seed(&r, seed);
    char ctx[300];
    snprintf(ctx, sizeof ctx, "op=gate_fwd backend=cuda rows=%lld HV=%d dtype=%s dt_bias=%s misalign=%d seed=%llu",
             (long long)rows, HV, t_dtype_name(dt), with_bias ? "yes" : "NULL", misalign, (unsigned long long)seed);
    const size_t n = (size_t)rows * HV;
    double *ad = dvec(n), *gr = dvec(n), *Ad = dvec(HV), *bd = dvec(HV);
    void *a = t_alloc(n * t_dsize(dt) + 2);
    for (size_t i = 0; i < n; i++) {
        double v = 3.0 * rng_normal(&r);
        if (i % 17 == 5) v = 21.0 + 5.0 * rng_uniform(&r);   /* the softplus(x) = x branch */
        ad[i] = t_store(dt, a, i, (float)v);
    }
    float *A = t_alloc((size_t)HV * 4), *bias = t_alloc((size_t)HV * 4);
    for (int j = 0; j < HV; j++) {
        A[j] = (float)log(1.0 + 15.0 * rng_uniform(&r)); Ad[j] = A[j];
        bias[j] = (float)(0.5 * rng_normal(&r)); bd[j] = bias[j];
    }
    gdn_ref_gate_fwd(rows, HV, ad, Ad, with_bias ? bd : NULL, gr);
    void *ab, *gb;
    const void *da = dput_at(a, n, dt, misalign, &ab);
    float *dg = dnan_at(GDN_F32, n, misalign, &gb), *dA = dput(A, (size_t)HV * 4), *dbias = dput(bias, (size_t)HV * 4);
    const gdn_exec ex = {GDN_BACKEND_CUDA, NULL, 0, 0};
    const gdn_status s = gdn_gate_fwd(&ex, rows, HV, dt, da, dA, with_bias ? dbias : NULL, dg);
    if (ran(ctx, s)) dclose(ctx, "g", GDN_F32, dg, gr, n, bound_fwd(dt));
    void *dev[] = {ab, gb, dA, dbias};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
    free(ad); free(gr); free(Ad); free(bd); free(a); free(A); free(bias);
}

static void l2norm_case(int64_t rows, int dim, gdn_dtype dt, int want_rstd, int misalign, uint64_t seed) {
    rng r;
    rng_seed(&r, seed);
    char ctx[300];
    snprintf(ctx, sizeof ctx, "op=l2norm_fwd backend=cuda rows=%lld dim=%d dtype=%s rstd=%s misalign=%d seed=%llu",
             (long long)rows, dim, t_dtype_name(dt), want_rstd ? "kept" : "NULL", misalign, (unsigned long long)seed);
    const size_t n = (size_t)rows * dim;
    double *xd = dvec(n), *yr = dvec(n), *rsr = dvec((size_t)rows);
    void *x = t_alloc(n * t_dsize(dt) + 2);
    for (size_t i = 0; i < n; i++) xd[i] = t_store(dt, x, i, (float)(rng_normal(&r) * ((i / dim) % 7 == 3 ? 1e-3 : 1.0)));
    gdn_ref_l2norm_fwd(rows, dim, xd, yr, rsr);
    void *xb, *yb, *rb;
    const void *dx = dput_at(x, n, dt, misalign, &xb);
    void *dy = dnan_at(dt, n, misalign, &yb);
    float *drs = dnan_at(GDN_F32, (size_t)rows, 0, &rb);
    const gdn_exec ex = {GDN_BACKEND_CUDA, NULL, 0, 0};
    const gdn_status s = gdn_l2norm_fwd(&ex, rows, dim, dt, dx, dy, want_rstd ? drs : NULL);
    if (ran(ctx, s)) {
        dclose(ctx, "y", dt, dy, yr, n, bound_fwd(dt));
        if (want_rstd) dclose(ctx, "rstd", GDN_F32, drs, rsr, (size_t)rows, bound_fwd(dt));
    }
    void *dev[] = {xb, yb, rb};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
    free(xd); free(yr); free(rsr); free(x);
}

void test_norms(rng *r) {
    const int64_t rows_list[4] = {0, 1, 37, 1000};
    const int Vs[10] = {1, 5, 64, 128, 130, 256, 1000, 1024, 2048, 4100};
    long k = 0;
    for (int di = 0; di < 3; di++)
        for (int gi = 0; gi < 2; gi++)
            for (int ri = 0; ri < 4; ri++)
                for (int vi = 0; vi < 10; vi++, k++) {
                    if (g_quick && k % 3) continue;
                    const int64_t rows = Vs[vi] >= 1000 ? rows_list[ri] / 8 : rows_list[ri];
                    rmsnorm_case(rows, Vs[vi], dts[di], (gdn_norm_gate)gi, k % 2 ? 1e-5f : 1e-6f, (int)(k / 2 % 2),
                                 k % 11 == 4, rng_u64(r));
                }
    const int HVs[4] = {1, 3, 4, 32};
    for (int di = 0; di < 3; di++)
        for (int ri = 0; ri < 4; ri++)
            for (int hi = 0; hi < 4; hi++, k++)
                gate_case(rows_list[ri] + (ri == 3 ? 3 : 0), HVs[hi], dts[di], (int)(k % 2), k % 5 == 1, rng_u64(r));
    const int dims[8] = {1, 2, 24, 64, 128, 256, 1000, 3000};
    for (int di = 0; di < 3; di++)
        for (int ri = 0; ri < 4; ri++)
            for (int mi = 0; mi < 8; mi++, k++) {
                if (g_quick && k % 3) continue;
                l2norm_case(dims[mi] >= 1000 ? rows_list[ri] / 8 : rows_list[ri], dims[mi], dts[di], (int)(k % 2 == 0),
                            k % 7 == 2, rng_u64(r));
            }
}

/* ---- gated RMSNorm, gate and L2 norm backward ---- */

static void rmsnorm_bwd_case(int64_t rows, int V, gdn_dtype dt, gdn_norm_gate g, float eps, int give_rstd, int misalign,
                             uint64_t seed) {
    rng r;
    rng_seed(&r, seed);
    char ctx[300];
    snprintf(ctx, sizeof ctx, "op=rmsnorm_bwd backend=cuda dtype=%s gate=%s rows=%lld V=%d eps=%g rstd=%s misalign=%d "
             "seed=%llu", t_dtype_name(dt), g == GDN_NORM_GATE_SILU ? "silu" : "sigmoid", (long long)rows, V, (double)eps,
             give_rstd ? "given" : "NULL", misalign, (unsigned long long)seed);
    const size_t n = (size_t)rows * V, es = t_dsize(dt);
    double *xd = dvec(n), *zd = dvec(n), *dyd = dvec(n), *wd = dvec(V), *yr = dvec(n), *rsr = dvec((size_t)rows);
    double *dxr = dvec(n), *dzr = dvec(n), *dwr = dvec(V);
    void *x = t_alloc(n * es + 2), *z = t_alloc(n * es + 2), *dy = t_alloc(n * es + 2);
    for (size_t i = 0; i < n; i++) {
        const int64_t row = (int64_t)(i / V);
        /* every 7th row tiny, so that mean(x^2) ~ eps (f16: less tiny, dx ~ r must stay in range) */
        xd[i] = t_store(dt, x, i, (float)(rng_normal(&r) * (row % 7 == 3 ? (dt == GDN_F16 ? 3e-3 : 1e-3) : 1.0)));
        double zz = 2.5 * rng_normal(&r);
        if (i % 23 == 11)   /* saturated gate: sigmoid(z) = 0 or 1 in fp32 */
            zz = (i % 2 ? 1 : -1) * (g == GDN_NORM_GATE_SILU ? 10 + 10 * rng_uniform(&r) : 20 + 20 * rng_uniform(&r));
        zd[i] = t_store(dt, z, i, (float)zz);
        dyd[i] = t_store(dt, dy, i, (float)rng_normal(&r));
    }
    float *w = t_alloc((size_t)V * 4), *rs = t_alloc((size_t)rows * 4 + 4);
    for (int i = 0; i < V; i++) { w[i] = (float)(1 + 0.2 * rng_normal(&r)); wd[i] = w[i]; }
    gdn_ref_rmsnorm_fwd(rows, V, eps, g, xd, zd, wd, yr, rsr);
    gdn_ref_rmsnorm_bwd(rows, V, eps, g, xd, zd, wd, dyd, dxr, dzr, dwr);
    double *dx_terms2 = dvec(n), *dw_terms2 = dvec(V);   /* dx and dw are sums that can cancel (DESIGN.md §5) */
    gdn_ref_rmsnorm_bwd_terms(rows, V, eps, g, xd, zd, wd, dyd, dx_terms2, dw_terms2);
    for (int64_t i = 0; i < rows; i++) rs[i] = (float)rsr[i];   /* the forward's rstd */
    const gdn_rmsnorm_config c = {rows, V, dt, eps, g};

    /* the CPU backend on the same inputs */
    void *hdx = t_alloc(n * es), *hdz = t_alloc(n * es);
    float *hdw = t_alloc((size_t)V * 4);
    const gdn_status hs = gdn_rmsnorm_gated_bwd(NULL, &c, x, z, w, give_rstd ? rs : NULL, dy, hdx, hdz, hdw);
    check(hs == GDN_OK, ctx, "CPU backward: status %s (%s)", gdn_status_string(hs), gdn_last_error());
    double *cdx = as_d(dt, hdx, n), *cdz = as_d(dt, hdz, n), *cdw = as_d(GDN_F32, hdw, V);

    void *xb, *zb, *gb, *dxb, *dzb, *dwb;
    const void *ddx_in = dput_at(x, n, dt, misalign, &xb), *dzin = dput_at(z, n, dt, 0, &zb);
    const void *ddy = dput_at(dy, n, dt, misalign, &gb);
    void *ddx = dnan_at(dt, n, misalign, &dxb), *ddz = dnan_at(dt, n, 0, &dzb);
    float *ddw = dnan_at(GDN_F32, V, 0, &dwb), *dw_in = dput(w, (size_t)V * 4), *drs = dput(rs, (size_t)rows * 4);
    const gdn_exec ex = {GDN_BACKEND_CUDA, NULL, 0, 0};
    gdn_status s = gdn_rmsnorm_gated_bwd(&ex, &c, ddx_in, dzin, dw_in, give_rstd ? drs : NULL, ddy, ddx, ddz, ddw);
    if (ran(ctx, s)) {
        const double bg = bound_grad(dt);
        dclose_terms(ctx, "dx", dt, ddx, dxr, dx_terms2, n, bg);
        dclose(ctx, "dz", dt, ddz, dzr, n, bg);
        dclose_terms(ctx, "dw", GDN_F32, ddw, dwr, dw_terms2, V, bg);
        if (hs == GDN_OK) {
            dclose_terms(ctx, "dx vs the CPU backend", dt, ddx, cdx, dx_terms2, n, bg);
            dclose(ctx, "dz vs the CPU backend", dt, ddz, cdz, n, bg);
            dclose_terms(ctx, "dw vs the CPU backend", GDN_F32, ddw, cdw, dw_terms2, V, bg);
        }
        const obuf o[3] = {{ddx, dt, n}, {ddz, dt, n}, {ddw, GDN_F32, (size_t)V}};
        void *keep[3];
        obuf_keep(o, 3, keep);
        s = gdn_rmsnorm_gated_bwd(&ex, &c, ddx_in, dzin, dw_in, give_rstd ? drs : NULL, ddy, ddx, ddz, ddw);
        if (ran(ctx, s)) check(obuf_same(o, 3, keep), ctx, "a second run gave other bits");
        else for (int i = 0; i < 3; i++) free(keep[i]);
    }
    void *dev[] = {xb, zb, gb, dxb, dzb, dwb, dw_in, drs};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
    free(xd); free(zd); free(dyd); free(wd); free(yr); free(rsr); free(dxr); free(dzr); free(dwr);
    free(x); free(z); free(dy); free(w); free(rs); free(hdx); free(hdz); free(hdw); free(cdx); free(cdz); free(cdw);
    free(dx_terms2); free(dw_terms2);
}

static void gate_bwd_case(int64_t rows, int HV, gdn_dtype dt, int with_bias, int want_ddt, int misalign, uint64_t seed) {
    rng r;
    rng_seed(&r, seed);
    char ctx[300];
    snprintf(ctx, sizeof ctx, "op=gate_bwd backend=cuda rows=%lld HV=%d dtype=%s dt_bias=%s ddt_bias=%s misalign=%d seed=%llu",
             (long long)rows, HV, t_dtype_name(dt), with_bias ? "yes" : "NULL", want_ddt ? "wanted" : "NULL", misalign,
             (unsigned long long)seed);
    const size_t n = (size_t)rows * HV;
    double *ad = dvec(n), *dgd = dvec(n), *Ad = dvec(HV), *bd = dvec(HV), *dar = dvec(n), *dAr = dvec(HV), *ddtr = dvec(HV);
    void *a = t_alloc(n * t_dsize(dt) + 2);
    float *dg = t_alloc(n * 4 + 4);
    for (size_t i = 0; i < n; i++) {
        double v = 3.0 * rng_normal(&r);
        if (i % 17 == 5) v = 21.0 + 5.0 * rng_uniform(&r);   /* the softplus(x) = x branch */
        ad[i] = t_store(dt, a, i, (float)v);
        dg[i] = (float)rng_normal(&r); dgd[i] = dg[i];
    }
    float *A = t_alloc((size_t)HV * 4), *bias = t_alloc((size_t)HV * 4);
    for (int j = 0; j < HV; j++) {
        A[j] = (float)log(1.0 + 15.0 * rng_uniform(&r)); Ad[j] = A[j];
        bias[j] = (float)(0.5 * rng_normal(&r)); bd[j] = bias[j];
    }
    gdn_ref_gate_bwd(rows, HV, ad, Ad, with_bias ? bd : NULL, dgd, dar, dAr, ddtr);

    /* the CPU backend on the same inputs */
    void *hda = t_alloc(n * t_dsize(dt));
    float *hdA = t_alloc((size_t)HV * 4), *hddt = t_alloc((size_t)HV * 4);
    const gdn_status hs = gdn_gate_bwd(NULL, rows, HV, dt, a, A, with_bias ? bias : NULL, dg, hda, hdA, want_ddt ? hddt : NULL);
    check(hs == GDN_OK, ctx, "CPU backward: status %s (%s)", gdn_status_string(hs), gdn_last_error());
    double *cda = as_d(dt, hda, n), *cdA = as_d(GDN_F32, hdA, HV), *cddt = as_d(GDN_F32, hddt, HV);

    void *ab, *gb, *dab, *dAb, *ddtb;
    const void *da_in = dput_at(a, n, dt, misalign, &ab);
    const float *ddg = dput_at(dg, n, GDN_F32, misalign, &gb);
    void *dda = dnan_at(dt, n, misalign, &dab);
    float *ddA = dnan_at(GDN_F32, HV, 0, &dAb), *dddt = dnan_at(GDN_F32, HV, 0, &ddtb);
    float *dA_in = dput(A, (size_t)HV * 4), *dbias = dput(bias, (size_t)HV * 4);
    const gdn_exec ex = {GDN_BACKEND_CUDA, NULL, 0, 0};
    gdn_status s = gdn_gate_bwd(&ex, rows, HV, dt, da_in, dA_in, with_bias ? dbias : NULL, ddg, dda, ddA,
                                want_ddt ? dddt : NULL);
    if (ran(ctx, s)) {
        const double bg = bound_grad(dt);
        dclose(ctx, "da", dt, dda, dar, n, bg);
        dclose(ctx, "dA_log", GDN_F32, ddA, dAr, HV, bg);
        if (want_ddt) dclose(ctx, "ddt_bias", GDN_F32, dddt, ddtr, HV, bg);
        if (hs == GDN_OK) {
            dclose(ctx, "da vs the CPU backend", dt, dda, cda, n, bg);
            dclose(ctx, "dA_log vs the CPU backend", GDN_F32, ddA, cdA, HV, bg);
            if (want_ddt) dclose(ctx, "ddt_bias vs the CPU backend", GDN_F32, dddt, cddt, HV, bg);
        }
        const obuf o[3] = {{dda, dt, n}, {ddA, GDN_F32, (size_t)HV}, {want_ddt ? dddt : NULL, GDN_F32, (size_t)HV}};
        void *keep[3];
        obuf_keep(o, 3, keep);
        s = gdn_gate_bwd(&ex, rows, HV, dt, da_in, dA_in, with_bias ? dbias : NULL, ddg, dda, ddA, want_ddt ? dddt : NULL);
        if (ran(ctx, s)) check(obuf_same(o, 3, keep), ctx, "a second run gave other bits");
        else for (int i = 0; i < 3; i++) free(keep[i]);
    }
    void *dev[] = {ab, gb, dab, dAb, ddtb, dA_in, dbias};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
    free(ad); free(dgd); free(Ad); free(bd); free(dar); free(dAr); free(ddtr); free(a); free(dg); free(A); free(bias);
    free(hda); free(hdA); free(hddt); free(cda); free(cdA); free(cddt);
}

static void l2norm_bwd_case(int64_t rows, int dim, gdn_dtype dt, int misalign, uint64_t seed) {
    rng r;
    rng_seed(&r, seed);
    char ctx[300];
    snprintf(ctx, sizeof ctx, "op=l2norm_bwd backend=cuda rows=%lld dim=%d dtype=%s misalign=%d seed=%llu", (long long)rows,
             dim, t_dtype_name(dt), misalign, (unsigned long long)seed);
    const size_t n = (size_t)rows * dim;
    double *xd = dvec(n), *dyd = dvec(n), *yr = dvec(n), *rsr = dvec((size_t)rows), *dxr = dvec(n);
    void *x = t_alloc(n * t_dsize(dt) + 2), *dy = t_alloc(n * t_dsize(dt) + 2);
    for (size_t i = 0; i < n; i++) {
        xd[i] = t_store(dt, x, i, (float)(rng_normal(&r) * ((i / dim) % 7 == 3 ? 1e-3 : 1.0)));
        dyd[i] = t_store(dt, dy, i, (float)rng_normal(&r));
    }
    gdn_ref_l2norm_fwd(rows, dim, xd, yr, rsr);
    gdn_ref_l2norm_bwd(rows, dim, xd, dyd, dxr);
    float *rs = t_alloc((size_t)rows * 4 + 4);
    for (int64_t i = 0; i < rows; i++) rs[i] = (float)rsr[i];   /* the forward's rstd */

    /* the CPU backend on the same inputs */
    void *hdx = t_alloc(n * t_dsize(dt));
    const gdn_status hs = gdn_l2norm_bwd(NULL, rows, dim, dt, x, rs, dy, hdx);
    check(hs == GDN_OK, ctx, "CPU backward: status %s (%s)", gdn_status_string(hs), gdn_last_error());
    double *cdx = as_d(dt, hdx, n);

    void *xb, *yb, *dxb;
    const void *dx_in = dput_at(x, n, dt, misalign, &xb), *ddy = dput_at(dy, n, dt, misalign, &yb);
    void *ddx = dnan_at(dt, n, misalign, &dxb);
    float *drs = dput(rs, (size_t)rows * 4);
    const gdn_exec ex = {GDN_BACKEND_CUDA, NULL, 0, 0};
    gdn_status s = gdn_l2norm_bwd(&ex, rows, dim, dt, dx_in, drs, ddy, ddx);
    if (ran(ctx, s)) {
        dclose(ctx, "dx", dt, ddx, dxr, n, bound_grad(dt));
        if (hs == GDN_OK) dclose(ctx, "dx vs the CPU backend", dt, ddx, cdx, n, bound_grad(dt));
        const obuf o[1] = {{ddx, dt, n}};
        void *keep[1];
        obuf_keep(o, 1, keep);
        s = gdn_l2norm_bwd(&ex, rows, dim, dt, dx_in, drs, ddy, ddx);
        if (ran(ctx, s)) check(obuf_same(o, 1, keep), ctx, "a second run gave other bits");
        else free(keep[0]);
    }
    void *dev[] = {xb, yb, dxb, drs};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
    free(xd); free(dyd); free(yr); free(rsr); free(dxr); free(x); free(dy); free(rs); free(hdx); free(cdx);
}

void test_norms_bwd(rng *r) {
    const int64_t rows_list[4] = {0, 1, 37, 1000};
    const int Vs[10] = {1, 5, 64, 128, 130, 256, 1000, 1024, 2048, 4100};
    long k = 0;
    for (int di = 0; di < 3; di++)
        for (int gi = 0; gi < 2; gi++)
            for (int ri = 0; ri < 4; ri++)
                for (int vi = 0; vi < 10; vi++, k++) {
                    if (g_quick && k % 3) continue;
                    const int64_t rows = Vs[vi] >= 1000 ? rows_list[ri] / 8 : rows_list[ri];
                    rmsnorm_bwd_case(rows, Vs[vi], dts[di], (gdn_norm_gate)gi, k % 2 ? 1e-5f : 1e-6f, (int)(k / 2 % 2),
                                     k % 11 == 4, rng_u64(r));
                }
    /* many rows: every rank of the dw cluster walks several batches, with and without rstd */
    for (int give = 0; give < 2; give++) {
        rmsnorm_bwd_case(20000, 128, GDN_BF16, GDN_NORM_GATE_SILU, 1e-6f, give, 0, rng_u64(r));
        rmsnorm_bwd_case(9001, 96, GDN_F32, GDN_NORM_GATE_SIGMOID, 1e-5f, give, give, rng_u64(r));
        rmsnorm_bwd_case(5000, 3, GDN_F16, GDN_NORM_GATE_SILU, 1e-6f, give, 0, rng_u64(r));
    }
    const int64_t grows[5] = {0, 1, 37, 1003, 30000};
    const int HVs[5] = {1, 3, 4, 32, 48};
    for (int di = 0; di < 3; di++)
        for (int ri = 0; ri < 5; ri++)
            for (int hi = 0; hi < 5; hi++, k++) {
                if (g_quick && ri == 4 && hi != 3) continue;
                gate_bwd_case(grows[ri], HVs[hi], dts[di], (int)(k % 2), (int)(k % 3 != 1), k % 5 == 1, rng_u64(r));
            }
    const int dims[8] = {2, 5, 24, 64, 128, 256, 1000, 3000};   /* not 1: dx there is all cancellation (test_backend.c) */
    for (int di = 0; di < 3; di++)
        for (int ri = 0; ri < 4; ri++)
            for (int mi = 0; mi < 8; mi++, k++) {
                if (g_quick && k % 3) continue;
                l2norm_bwd_case(dims[mi] >= 1000 ? rows_list[ri] / 8 : rows_list[ri], dims[mi], dts[di], k % 7 == 2,
                                rng_u64(r));
            }
}
#endif
