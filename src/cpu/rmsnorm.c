/* Gated RMSNorm, CPU. Per row of V (notation of ref/ref_rmsnorm.c):
 *   r = 1/sqrt(sum x^2 / V + eps),  y_i = x_i r w_i gate(z_i)
 * backward, a_i = dy_i w_i gate(z_i):
 *   dx_j = r (a_j - x_j c),  c = r^2 (sum_i a_i x_i) / V
 *   dz_i = dy_i x_i r w_i gate'(z_i),   dw_i = sum over rows of dy_i x_i r gate(z_i)
 *
 * Layout of the work: threads take rows (OpenMP, static). f32 / f16 rows are
 * loaded into fp32 scratch, every loop over V branch-free so the compiler
 * vectorises it (sums with 16 fixed partial accumulators; the gates through
 * cpu/act.h). bf16 rows are read in place on cpu/act.h's vectors, converted
 * where used and rounded where formed (fwd_rows_bf16, bwd_pass1_bf16 and
 * bwd_pass2_bf16: the same arithmetic but the forward's SiLU, which is
 * gdn_silu_bf16_v there): the compiler's own vectorisation of such
 * mixed 16 / 32-bit loops ran at half width and peeled each row's start for
 * alignment, which made the op's speed depend on where the caller's buffers
 * lie (bench/NOTES.md v10). dw: rows are cut into blocks of GDN_RMSNORM_ROW_BLOCK (64),
 * each block sums its rows in row order into an fp32 partial (64 terms: a
 * rounding of ~4e-6 of their norm at most, far inside the bounds), and the
 * partials are added in block order in double: the bits do not depend on
 * the thread count. */
#include <stdlib.h>
#include <string.h>
#include "cpu/rmsnorm.h"
#include "cpu/act.h"
#ifdef _OPENMP
#include <omp.h>
#endif

/* rows in and out through the shared converters (F16C for f16, vector shift for bf16) */
static inline void load_row(gdn_dtype t, const void *src, int64_t off, float *dst, int n) { gdn_load(t, src, off, dst, n); }
static inline void store_row(gdn_dtype t, void *dst, int64_t off, const float *src, int n) { gdn_store(t, dst, off, src, n); }

/* ---- math ---- */


/* sum of squares in a fixed order: 16 running partials, then a fixed tree */
static float sum_sq(const float *restrict x, int n) {
    float acc[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 16; k++) acc[k] += x[i + k] * x[i + k];
    for (int k = 0; i < n; i++, k++) acc[k] += x[i] * x[i];
    for (int h = 8; h >= 1; h /= 2)
        for (int k = 0; k < h; k++) acc[k] += acc[k + h];
    return acc[0];
}

static float sum_prod(const float *restrict a, const float *restrict b, int n) {
    float acc[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 16; k++) acc[k] += a[i + k] * b[i + k];
    for (int k = 0; i < n; i++, k++) acc[k] += a[i] * b[i];
    for (int h = 8; h >= 1; h /= 2)
        for (int k = 0; k < h; k++) acc[k] += acc[k + h];
    return acc[0];
}

/* forward and backward compute r the same way, so a recomputed rstd has the
 * bits of the one forward wrote */
static inline float row_rstd(const float *x, int V, float eps) {
    return 1.0f / sqrtf(sum_sq(x, V) / (float)V + eps);
}

/* row_rstd of a bf16 row, converted where read: sum_sq's order (lane k of
 * the 16 partials takes the elements i = k mod 16), so the same bits */
static float row_rstd_bf16(const uint16_t *restrict x, int V, float eps) {
    gdn_av acc[16 / GDN_AVL] = {{0}};
    int i = 0;
    for (; i + 16 <= V; i += 16)
        for (int j = 0; j < 16 / GDN_AVL; j++) {
            const gdn_av v = gdn_bf16_load_v(x + i + j * GDN_AVL);
            acc[j] += v * v;
        }
    float a[16];
    memcpy(a, acc, sizeof a);
    for (int k = 0; i < V; i++, k++) {
        const float v = gdn_bf16_f32(x[i]);
        a[k] += v * v;
    }
    for (int h = 8; h >= 1; h /= 2)
        for (int k = 0; k < h; k++) a[k] += a[k + h];
    return 1.0f / sqrtf(a[0] / (float)V + eps);
}

/* row_rstd_bf16 of RSTD_ROWS rows at once (x's rows V apart): the same arithmetic a
 * row, so the same bits, with the rows' chains (their sums, the reduction,
 * the square root and division) interleaved instead of one after another */
#define RSTD_ROWS 4
static void rows_rstd_bf16(const uint16_t *restrict x, int V, float eps, float *rs) {
    gdn_av acc[RSTD_ROWS][16 / GDN_AVL] = {{{0}}};
    int i = 0;
    for (; i + 16 <= V; i += 16)
        for (int q = 0; q < RSTD_ROWS; q++)
            for (int j = 0; j < 16 / GDN_AVL; j++) {
                const gdn_av v = gdn_bf16_load_v(x + (int64_t)q * V + i + j * GDN_AVL);
                acc[q][j] += v * v;
            }
    float a[RSTD_ROWS][16];
    memcpy(a, acc, sizeof a);
    for (int q = 0; q < RSTD_ROWS; q++) {
        for (int k = 0, t = i; t < V; t++, k++) {
            const float v = gdn_bf16_f32(x[(int64_t)q * V + t]);
            a[q][k] += v * v;
        }
        for (int h = 8; h >= 1; h /= 2)
            for (int k = 0; k < h; k++) a[q][k] += a[q][k + h];
        rs[q] = 1.0f / sqrtf(a[q][0] / (float)V + eps);
    }
}

/* ---- forward ---- */

static void fwd_rows(const gdn_rmsnorm_config *c, const void *x, const void *z, const float *restrict w,
                     void *y, float *rstd, int64_t r, float *restrict xr, float *restrict zr) {
    const int V = c->V;
    load_row(c->dtype, x, r * V, xr, V);
    load_row(c->dtype, z, r * V, zr, V);
    const float rs = row_rstd(xr, V, c->eps);
    if (c->gate == GDN_NORM_GATE_SILU) gdn_silu_rows(zr, V);
    else for (int i = 0; i < V; i++) zr[i] = gdn_sigmoidf(zr[i]);
    for (int i = 0; i < V; i++) xr[i] = xr[i] * rs * w[i] * zr[i];
    store_row(c->dtype, y, r * V, xr, V);
    if (rstd) rstd[r] = rs;
}

/* fwd_rows for bf16 without scratch, on the widest vectors (cpu/act.h): x
 * converted where read (twice: r, then y), the gate inline, y rounded where
 * formed; r as fwd_rows forms it (RSTD_ROWS rows' at once). With SiLU the
 * gate is gdn_silu_bf16_v (no division; y is rounded to bf16), with the
 * sigmoid gdn_sigmoid_v, fwd_rows' own. */
static void fwd_rows_bf16(const gdn_rmsnorm_config *c, const uint16_t *restrict x, const uint16_t *restrict z,
                          const float *restrict w, uint16_t *restrict y, float *rstd, int64_t r0, int64_t r1) {
    const int V = c->V, silu = c->gate == GDN_NORM_GATE_SILU;
    for (int64_t rb = r0; rb < r1; rb += RSTD_ROWS) {
        const int nr = r1 - rb < RSTD_ROWS ? (int)(r1 - rb) : RSTD_ROWS;
        float rsb[RSTD_ROWS];
        if (nr == RSTD_ROWS) rows_rstd_bf16(x + rb * V, V, c->eps, rsb);
        else
            for (int q = 0; q < nr; q++) rsb[q] = row_rstd_bf16(x + (rb + q) * V, V, c->eps);
        for (int q = 0; q < nr; q++) {
            const int64_t r = rb + q, o = r * V;
            const float rs = rsb[q];
            int i = 0;
            for (; i + GDN_AVL <= V; i += GDN_AVL) {
                const gdn_av zi = gdn_bf16_load_v(z + o + i);
                gdn_av wi;
                memcpy(&wi, w + i, sizeof wi);
                const gdn_av g = silu ? gdn_silu_bf16_v(zi) : gdn_sigmoid_v(zi);
                gdn_bf16_store_v(y + o + i, gdn_bf16_load_v(x + o + i) * rs * wi * g);
            }
            for (; i < V; i++) {
                const float zi = gdn_bf16_f32(z[o + i]);
                const float g = silu ? zi / (1.f + gdn_expf(-zi)) : gdn_sigmoidf(zi);
                y[o + i] = gdn_f32_bf16(gdn_bf16_f32(x[o + i]) * rs * w[i] * g);
            }
            if (rstd) rstd[r] = rs;
        }
    }
}

int gdn_cpu_rmsnorm_fwd(int threads, const gdn_rmsnorm_config *c, const void *x, const void *z,
                        const float *w, void *y, float *rstd) {
    const int64_t rows = c->rows;
    const int V = c->V;
    if (rows == 0) return 0;
    const int nt = (int64_t)threads > rows ? (int)rows : threads, bf = c->dtype == GDN_BF16;
    float *scratch = bf ? NULL : malloc((size_t)nt * 2 * (size_t)V * sizeof(float));   /* bf16 rows need none */
    if (!bf && !scratch) return -1;
    #pragma omp parallel num_threads(nt)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        const unsigned m = gdn_ftz_begin();
        if (bf) {   /* a contiguous share of the rows a thread (rows are independent: no bit depends on it) */
            int nth = 1;
#ifdef _OPENMP
            nth = omp_get_num_threads();
#endif
            fwd_rows_bf16(c, x, z, w, y, rstd, rows * tid / nth, rows * (tid + 1) / nth);
        } else {
            float *xr = scratch + (size_t)tid * 2 * V, *zr = xr + V;
            #pragma omp for schedule(static)
            for (int64_t r = 0; r < rows; r++) fwd_rows(c, x, z, w, y, rstd, r, xr, zr);
        }
        gdn_ftz_end(m);
    }
    free(scratch);
    return 0;
}

/* ---- backward ---- */

/* bwd_row for bf16 in two passes on the widest vectors (cpu/act.h): z, dy
 * and x converted where used, the gate's sigmoid pair (cpu/act.h's form),
 * dz rounded and stored where formed, a . x summed as a is formed (sum_prod's
 * 16 partials, lane k taking i = k mod 16), then dx; the same arithmetic as
 * bwd_row, so the same bits. The first pass (a into ar, its row's r in *rs;
 * returns c of dx = r (a - x c)), then the second: the caller runs the
 * first of a few rows before their seconds, so that one row's sum, its
 * reduction and c do not hold up the next row's work (bench/NOTES.md CPU
 * v28) */
static float bwd_pass1_bf16(const gdn_rmsnorm_config *c, const uint16_t *restrict x, const uint16_t *restrict z,
                            const float *restrict w, const float *rstd, const uint16_t *restrict dy, uint16_t *restrict dz, int64_t r,
                            float *restrict ar, float *restrict dwp, float *rs_out) {
    const int V = c->V;
    const int64_t o = r * V;
    x += o; z += o; dy += o; dz += o;
    const float rs = rstd ? rstd[r] : row_rstd_bf16(x, V, c->eps);
    *rs_out = rs;
    const int silu = c->gate == GDN_NORM_GATE_SILU;
    gdn_av acc[16 / GDN_AVL] = {{0}};
    int i = 0;
    for (; i + 16 <= V; i += 16)
        for (int j = 0; j < 16 / GDN_AVL; j++) {
            const int e = i + j * GDN_AVL;
            const gdn_av zi = gdn_bf16_load_v(z + e), a0 = gdn_bf16_load_v(dy + e), xi = gdn_bf16_load_v(x + e);
            gdn_av wi, dw;
            memcpy(&wi, w + e, sizeof wi);
            memcpy(&dw, dwp + e, sizeof dw);
            const gdn_av ex = gdn_expf_v(-zi), s = 1.f / (1.f + ex), sn = ex * s;
            const gdn_av g = silu ? zi * s : s;
            const gdn_av dg = silu ? s * (1.f + zi * sn) : s * sn;
            const gdn_av dyx = a0 * (xi * rs);
            dw += dyx * g;
            memcpy(dwp + e, &dw, sizeof dw);
            gdn_bf16_store_v(dz + e, dyx * wi * dg);
            const gdn_av a = a0 * wi * g;
            memcpy(ar + e, &a, sizeof a);
            acc[j] += a * xi;
        }
    float ax[16];
    memcpy(ax, acc, sizeof ax);
    for (int k = 0; i < V; i++, k++) {
        const float zi = gdn_bf16_f32(z[i]), a0 = gdn_bf16_f32(dy[i]), xi = gdn_bf16_f32(x[i]);
        const float e = gdn_expf(-zi), s = 1.f / (1.f + e), sn = e * s;
        const float g = silu ? zi * s : s;
        const float dg = silu ? s * (1.f + zi * sn) : s * sn;
        const float dyx = a0 * (xi * rs);
        dwp[i] += dyx * g;
        dz[i] = gdn_f32_bf16(dyx * w[i] * dg);
        ar[i] = a0 * w[i] * g;
        ax[k] += ar[i] * xi;
    }
    for (int h = 8; h >= 1; h /= 2)
        for (int k = 0; k < h; k++) ax[k] += ax[k + h];
    return ax[0] / (float)V * rs * rs;
}
static void bwd_pass2_bf16(const gdn_rmsnorm_config *c, const uint16_t *restrict x, uint16_t *restrict dx, int64_t r,
                           const float *restrict ar, float rs, float cc) {
    const int V = c->V;
    x += r * V; dx += r * V;
    if (V == 1) {
        dx[0] = gdn_f32_bf16(rs * ar[0] * (c->eps * rs * rs));   /* as bwd_row */
        return;
    }
    int i = 0;
    for (; i + GDN_AVL <= V; i += GDN_AVL) {
        gdn_av a;
        memcpy(&a, ar + i, sizeof a);
        gdn_bf16_store_v(dx + i, rs * (a - gdn_bf16_load_v(x + i) * cc));
    }
    for (; i < V; i++) dx[i] = gdn_f32_bf16(rs * (ar[i] - gdn_bf16_f32(x[i]) * cc));
}

/* One row: dx, dz written, dy x r gate(z) added to the block's fp32 partial dwp. */
static void bwd_row(const gdn_rmsnorm_config *c, const void *x, const void *z, const float *restrict w,
                    const float *rstd, const void *dy, void *dx, void *dz, int64_t r,
                    float *restrict xr, float *restrict zr, float *restrict ar, float *restrict sr,
                    float *restrict snr, float *restrict dwp) {
    const int V = c->V;
    load_row(c->dtype, x, r * V, xr, V);
    load_row(c->dtype, z, r * V, zr, V);
    load_row(c->dtype, dy, r * V, ar, V);
    const float rs = rstd ? rstd[r] : row_rstd(xr, V, c->eps);
    const int silu = c->gate == GDN_NORM_GATE_SILU;
    gdn_sigmoid_pair_rows(zr, sr, snr, V);   /* sigmoid(z), sigmoid(-z) */
    for (int i = 0; i < V; i++) {
        const float s = sr[i], sn = snr[i];
        const float g = silu ? zr[i] * s : s;
        const float dg = silu ? s * (1.f + zr[i] * sn) : s * sn;
        const float dyx = ar[i] * (xr[i] * rs);
        dwp[i] += dyx * g;
        zr[i] = dyx * w[i] * dg;        /* dz */
        ar[i] = ar[i] * w[i] * g;       /* a = dL/dxhat */
    }
    store_row(c->dtype, dz, r * V, zr, V);
    if (V == 1) {
        /* a - x c = a (1 - x^2 r^2) = a eps r^2 exactly when V == 1: the
         * general form would cancel all of its ~eps-sized digits */
        ar[0] = rs * ar[0] * (c->eps * rs * rs);
    } else {
        const float cc = sum_prod(ar, xr, V) / (float)V * rs * rs;
        for (int i = 0; i < V; i++) ar[i] = rs * (ar[i] - xr[i] * cc);
    }
    store_row(c->dtype, dx, r * V, ar, V);
}

int gdn_cpu_rmsnorm_bwd(int threads, const gdn_rmsnorm_config *c, const void *x, const void *z,
                        const float *w, const float *rstd, const void *dy, void *dx, void *dz,
                        float *dw) {
    const int64_t rows = c->rows;
    const int V = c->V;
    const int64_t RB = GDN_RMSNORM_ROW_BLOCK, nb = (rows + RB - 1) / RB;
    const int nt = nb == 0 ? 1 : (int64_t)threads > nb ? (int)nb : threads;
    /* [nb, V] double partials of dw, then [nt, 6V] fp32 row scratch (the last V: the block's fp32 sums) */
    _Static_assert(RSTD_ROWS <= 5, "bf16's rows of a fit the scratch before the sums");
    double *part = malloc((size_t)nb * V * sizeof(double) + (size_t)nt * 6 * V * sizeof(float));
    if (!part) return -1;
    float *scratch = (float *)(part + (size_t)nb * V);
    #pragma omp parallel num_threads(nt)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        /* bf16: xr .. snr hold RSTD_ROWS rows' a instead */
        float *xr = scratch + (size_t)tid * 6 * V, *zr = xr + V, *ar = zr + V, *sr = ar + V, *snr = sr + V, *dwf = snr + V;
        const unsigned m = gdn_ftz_begin();
        #pragma omp for schedule(static)
        for (int64_t b = 0; b < nb; b++) {
            for (int i = 0; i < V; i++) dwf[i] = 0.f;
            const int64_t r1 = (b + 1) * RB < rows ? (b + 1) * RB : rows;
            if (c->dtype == GDN_BF16)   /* RSTD_ROWS rows' first passes, in row order (dwf's), then their seconds */
                for (int64_t r = b * RB; r < r1; r += RSTD_ROWS) {
                    const int nr = r1 - r < RSTD_ROWS ? (int)(r1 - r) : RSTD_ROWS;
                    float rsq[RSTD_ROWS], ccq[RSTD_ROWS];
                    for (int q = 0; q < nr; q++) ccq[q] = bwd_pass1_bf16(c, x, z, w, rstd, dy, dz, r + q, xr + q * V, dwf, &rsq[q]);
                    for (int q = 0; q < nr; q++) bwd_pass2_bf16(c, x, dx, r + q, xr + q * V, rsq[q], ccq[q]);
                }
            else
                for (int64_t r = b * RB; r < r1; r++)
                    bwd_row(c, x, z, w, rstd, dy, dx, dz, r, xr, zr, ar, sr, snr, dwf);
            for (int i = 0; i < V; i++) part[b * V + i] = dwf[i];
        }
        gdn_ftz_end(m);
    }
    for (int i = 0; i < V; i++) {
        double s = 0;
        for (int64_t b = 0; b < nb; b++) s += part[b * V + i];
        dw[i] = (float)s;
    }
    free(part);
    return 0;
}
