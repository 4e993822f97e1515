/* Causal depthwise conv1d (gdn_conv1d_fwd / _bwd / _update) against the
 * float64 reference (src/ref/ref_conv1d.c): every W in 1..8, SiLU on/off,
 * optional bias / h0 / ht / dht / dbias / dh0, B > 1, T in {0, 1, 3, 64, 65,
 * random}, varlen with empty and 1-token sequences, f32 / bf16 / f16, D = 37
 * and D = 2048. Outputs are poisoned with NaN before every checked call. Also:
 * the reference gradients against central finite differences, the update
 * token by token against the forward, slots and padding, determinism over
 * thread counts, and the bad-input contract. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ref/ref.h"
#include "ref/ref_conv1d.h"
#include "test_util.h"

enum { O_BIAS = 1, O_H0 = 2, O_HT = 4, O_DHT = 8, O_DH0 = 16, O_DBIAS = 32, O_ALL = 63 };

typedef struct ccase {
    int64_t B, T;
    int nseq;              /* > 0: varlen (B = 1), lengths in lens */
    int64_t lens[12];
    int D, W;
    gdn_dtype dt;
    int silu;
    unsigned opt;          /* O_* */
    int threads;
    int inplace;           /* also run the forward with ht == h0 */
    int shift;             /* y and dx this many bytes past a 64-byte line, guard bytes around them */
} ccase;

static double *dalloc(size_t n) { return t_alloc(n * sizeof(double)); }

static void case_ctx(const ccase *tc, const char *op, uint64_t seed, long idx, char *buf, size_t n) {
    char shape[200];
    int len = snprintf(shape, sizeof shape, "B%lld T%lld D%d W%d", (long long)tc->B, (long long)tc->T, tc->D, tc->W);
    if (tc->nseq) {
        len += snprintf(shape + len, sizeof shape - len, " varlen[");
        for (int i = 0; i < tc->nseq; i++)
            len += snprintf(shape + len, sizeof shape - len, "%s%lld", i ? "," : "", (long long)tc->lens[i]);
        len += snprintf(shape + len, sizeof shape - len, "]");
    }
    if (tc->shift) snprintf(shape + len, sizeof shape - len, " (y, dx %d bytes past a line)", tc->shift);
    snprintf(buf, n, "op=%s backend=cpu threads=%d shape=%s dtype=%s silu=%d bias=%d h0=%d ht=%d dht=%d dh0=%d "
             "dbias=%d seed=%llu case=%ld(seed %llu)", op, tc->threads, shape, t_dtype_name(tc->dt), tc->silu,
             !!(tc->opt & O_BIAS), !!(tc->opt & O_H0), !!(tc->opt & O_HT), !!(tc->opt & O_DHT), !!(tc->opt & O_DH0),
             !!(tc->opt & O_DBIAS), (unsigned long long)g_base_seed, idx, (unsigned long long)seed);
}

/* n random values N(0, s^2) rounded to t: the dtype buffer and the doubles */
static void *rand_tensor(rng *r, gdn_dtype t, size_t n, double s, double *d) {
    void *p = t_alloc(n * t_dsize(t));
    for (size_t i = 0; i < n; i++) d[i] = t_store(t, p, i, (float)(s * rng_normal(r)));
    return p;
}

static void to_double_f32(const float *p, double *d, size_t n) { for (size_t i = 0; i < n; i++) d[i] = p[i]; }

/* config of a case; cu must hold nseq + 1 entries */
static gdn_conv1d_config case_config(const ccase *tc, int64_t *cu, int64_t *N) {
    gdn_conv1d_config c;
    memset(&c, 0, sizeof c);
    if (tc->nseq) {
        cu[0] = 0;
        for (int i = 0; i < tc->nseq; i++) cu[i + 1] = cu[i] + tc->lens[i];
        c.B = 1; c.T = cu[tc->nseq]; c.cu_seqlens = cu; c.num_seqs = tc->nseq;
        *N = tc->nseq;
    } else {
        c.B = tc->B; c.T = tc->T;
        *N = tc->B;
    }
    c.D = tc->D; c.W = tc->W; c.dtype = tc->dt; c.silu = tc->silu;
    return c;
}

/* n bytes at shift past a 64-byte line inside raw (n + 128 + shift bytes), every other byte of raw a guard */
enum { GUARD = 0x5a };
static void *shifted(unsigned char *raw, size_t n, int shift) {
    unsigned char *p = (unsigned char *)(((uintptr_t)raw + 63) & ~(uintptr_t)63) + shift;
    memset(raw, GUARD, n + 128 + (size_t)shift);
    return p;
}
static int guards_kept(const unsigned char *raw, const void *p, size_t n, int shift) {
    const unsigned char *q = p;
    for (const unsigned char *g = raw; g < q; g++) if (*g != GUARD) return 0;
    for (const unsigned char *g = q + n; g < raw + n + 128 + shift; g++) if (*g != GUARD) return 0;
    return 1;
}

static void run_case(const ccase *tc, long idx) {
    const uint64_t seed = mix_seed(g_base_seed, 7000 + (uint64_t)idx);
    rng r;
    rng_seed(&r, seed);
    int64_t cu[13], N;
    const gdn_conv1d_config c = case_config(tc, cu, &N);
    ccase shown = *tc;
    shown.B = c.B; shown.T = c.T;
    const int D = tc->D, W = tc->W;
    const gdn_dtype dt = tc->dt;
    const size_t nx = (size_t)(c.B * c.T) * D, nw = (size_t)D * W, nst = (size_t)N * D * W;
    const unsigned o = tc->opt;

    double *xd = dalloc(nx), *dyd = dalloc(nx), *wd = dalloc(nw), *bd = dalloc(D), *h0d = dalloc(nst),
           *dhtd = dalloc(nst);
    void *x = rand_tensor(&r, dt, nx, 1.0, xd), *dy = rand_tensor(&r, dt, nx, 1.0, dyd);
    float *w = rand_tensor(&r, GDN_F32, nw, 0.6, wd), *bias = rand_tensor(&r, GDN_F32, D, 0.5, bd);
    float *h0 = rand_tensor(&r, GDN_F32, nst, 1.0, h0d), *dht = rand_tensor(&r, GDN_F32, nst, 1.0, dhtd);

    double *yr = dalloc(nx), *htr = dalloc(nst), *dxr = dalloc(nx), *dwr = dalloc(nw), *dbr = dalloc(D),
           *dh0r = dalloc(nst);
    const double *bref = (o & O_BIAS) ? bd : NULL, *h0ref = (o & O_H0) ? h0d : NULL;
    gdn_ref_conv1d_fwd(&c, xd, wd, bref, h0ref, yr, htr);
    gdn_ref_conv1d_bwd(&c, xd, wd, bref, h0ref, dyd, (o & O_DHT) ? dhtd : NULL, dxr, dwr, dbr, dh0r);
    /* dweight and dbias sum one term per token over every token; with a few
     * channels (D <= 4) they can all cancel at once, so there they are
     * measured against those terms (docs/DESIGN.md §5), each from the
     * reference with dy kept at one token alone (dht adds to neither) */
    double *dw_terms2 = NULL, *db_terms2 = NULL;
    if (D <= 4) {
        dw_terms2 = dalloc(nw); db_terms2 = dalloc(D);
        double *dy1 = dalloc(nx), *t_dx = dalloc(nx), *t_dw = dalloc(nw), *t_db = dalloc(D), *t_dh0 = dalloc(nst);
        for (size_t i = 0; i < nw; i++) dw_terms2[i] = 0;
        for (int i = 0; i < D; i++) db_terms2[i] = 0;
        for (int64_t t = 0; t < c.B * c.T; t++) {
            for (size_t i = 0; i < nx; i++) dy1[i] = 0;
            for (int i = 0; i < D; i++) dy1[(size_t)t * D + i] = dyd[(size_t)t * D + i];
            gdn_ref_conv1d_bwd(&c, xd, wd, bref, h0ref, dy1, NULL, t_dx, t_dw, t_db, t_dh0);
            for (size_t i = 0; i < nw; i++) dw_terms2[i] += t_dw[i] * t_dw[i];
            for (int i = 0; i < D; i++) db_terms2[i] += t_db[i] * t_db[i];
        }
        free(dy1); free(t_dx); free(t_dw); free(t_db); free(t_dh0);
    }

    const gdn_exec ex = {GDN_BACKEND_CPU, NULL, tc->threads, 0};
    char ctx[600];

    /* ---- forward ---- */
    const size_t ny = nx * t_dsize(dt);
    unsigned char *y_raw = t_alloc(ny + 128 + (size_t)tc->shift), *dx_raw = t_alloc(ny + 128 + (size_t)tc->shift);
    void *y = shifted(y_raw, ny, tc->shift);
    float *ht = t_alloc(nst * sizeof(float));
    t_poison_nan(dt, y, nx);
    t_poison_nan(GDN_F32, ht, nst);
    gdn_conv1d_args fa = {x, w, (o & O_BIAS) ? bias : NULL, (o & O_H0) ? h0 : NULL, y, (o & O_HT) ? ht : NULL};
    case_ctx(&shown, "conv1d_fwd", seed, idx, ctx, sizeof ctx);
    gdn_status s = gdn_conv1d_fwd(&ex, &c, &fa);
    if (check(s == GDN_OK, ctx, "status %s: %s", gdn_status_string(s), gdn_last_error())) {
        check_close(ctx, "y", dt, y, yr, nx, bound_fwd(dt));
        check(guards_kept(y_raw, y, ny, tc->shift), ctx, "no byte written outside y (y %d bytes past a line)", tc->shift);
        if (o & O_HT) check_close(ctx, "ht", GDN_F32, ht, htr, nst, bound_fwd(GDN_F32));
    }
    if (tc->inplace && (o & O_H0)) {   /* ht written over h0: an in-place state update */
        float *st = t_alloc(nst * sizeof(float));
        memcpy(st, h0, nst * sizeof(float));
        t_poison_nan(dt, y, nx);
        gdn_conv1d_args ia = fa;
        ia.h0 = st; ia.ht = st;
        s = gdn_conv1d_fwd(&ex, &c, &ia);
        if (check(s == GDN_OK, ctx, "in-place ht = h0: status %s: %s", gdn_status_string(s), gdn_last_error())) {
            check_close(ctx, "y (ht = h0 in place)", dt, y, yr, nx, bound_fwd(dt));
            check_close(ctx, "ht (ht = h0 in place)", GDN_F32, st, htr, nst, bound_fwd(GDN_F32));
        }
        free(st);
    }

    /* ---- backward ---- */
    void *dx = shifted(dx_raw, ny, tc->shift);
    float *dw = t_alloc(nw * sizeof(float)), *db = t_alloc(D * sizeof(float)), *dh0 = t_alloc(nst * sizeof(float));
    t_poison_nan(dt, dx, nx);
    t_poison_nan(GDN_F32, dw, nw);
    t_poison_nan(GDN_F32, db, D);
    t_poison_nan(GDN_F32, dh0, nst);
    gdn_conv1d_bwd_args ba = {x, w, (o & O_BIAS) ? bias : NULL, (o & O_H0) ? h0 : NULL, dy,
                              (o & O_DHT) ? dht : NULL, dx, dw, (o & O_DBIAS) ? db : NULL, (o & O_DH0) ? dh0 : NULL};
    case_ctx(&shown, "conv1d_bwd", seed, idx, ctx, sizeof ctx);
    s = gdn_conv1d_bwd(&ex, &c, &ba);
    if (check(s == GDN_OK, ctx, "status %s: %s", gdn_status_string(s), gdn_last_error())) {
        check_close(ctx, "dx", dt, dx, dxr, nx, bound_grad(dt));
        check(guards_kept(dx_raw, dx, ny, tc->shift), ctx, "no byte written outside dx (dx %d bytes past a line)", tc->shift);
        check_close_terms(ctx, "dweight", GDN_F32, dw, dwr, dw_terms2, nw, bound_grad(dt));
        if (o & O_DBIAS) check_close_terms(ctx, "dbias", GDN_F32, db, dbr, db_terms2, D, bound_grad(dt));
        if (o & O_DH0) check_close(ctx, "dh0", GDN_F32, dh0, dh0r, nst, bound_grad(dt));
    }

    free(xd); free(dyd); free(wd); free(bd); free(h0d); free(dhtd);
    free(x); free(dy); free(w); free(bias); free(h0); free(dht);
    free(yr); free(htr); free(dxr); free(dwr); free(dbr); free(dh0r);
    free(y_raw); free(ht); free(dx_raw); free(dw); free(db); free(dh0); free(dw_terms2); free(db_terms2);
}

/* ---- the reference against central finite differences (double) ---- */

static double loss(const gdn_conv1d_config *c, const double *x, const double *w, const double *b,
                   const double *h0, const double *dy, const double *dht, size_t nx, size_t nst) {
    double *y = dalloc(nx), *ht = dalloc(nst);
    gdn_ref_conv1d_fwd(c, x, w, b, h0, y, ht);
    double L = 0;
    for (size_t i = 0; i < nx; i++) L += dy[i] * y[i];
    for (size_t i = 0; i < nst; i++) L += dht[i] * ht[i];
    free(y); free(ht);
    return L;
}

/* d loss / d p[i] for every i, central differences */
static void fd_grad(const gdn_conv1d_config *c, double *x, double *w, double *b, double *h0, const double *dy,
                    const double *dht, size_t nx, size_t nst, double *p, size_t n, double *g) {
    const double eps = 1e-6;
    for (size_t i = 0; i < n; i++) {
        const double keep = p[i];
        p[i] = keep + eps;
        const double lp = loss(c, x, w, b, h0, dy, dht, nx, nst);
        p[i] = keep - eps;
        const double lm = loss(c, x, w, b, h0, dy, dht, nx, nst);
        p[i] = keep;
        g[i] = (lp - lm) / (2 * eps);
    }
}

static void test_fd(void) {
    static const int Ws[] = {1, 2, 3, 4, 8};
    long idx = 0;
    for (int wi = 0; wi < 5; wi++)
        for (int varlen = 0; varlen < 2; varlen++)
            for (int silu = 0; silu < 2; silu++, idx++) {
                const uint64_t seed = mix_seed(g_base_seed, 7900 + (uint64_t)idx);
                rng r;
                rng_seed(&r, seed);
                gdn_conv1d_config c;
                memset(&c, 0, sizeof c);
                int64_t cu[5] = {0, 2, 2, 3, 8};
                const int D = 3, W = Ws[wi];
                int64_t N;
                if (varlen) { c.B = 1; c.T = 8; c.cu_seqlens = cu; c.num_seqs = 4; N = 4; }
                else { c.B = 2; c.T = 3; N = 2; }
                c.D = D; c.W = W; c.dtype = GDN_F32; c.silu = silu;
                const size_t nx = (size_t)(c.B * c.T) * D, nw = (size_t)D * W, nst = (size_t)N * D * W;
                double *x = dalloc(nx), *dy = dalloc(nx), *w = dalloc(nw), *b = dalloc(D), *h0 = dalloc(nst),
                       *dht = dalloc(nst);
                for (size_t i = 0; i < nx; i++) { x[i] = rng_normal(&r); dy[i] = rng_normal(&r); }
                for (size_t i = 0; i < nw; i++) w[i] = 0.6 * rng_normal(&r);
                for (int i = 0; i < D; i++) b[i] = 0.5 * rng_normal(&r);
                for (size_t i = 0; i < nst; i++) { h0[i] = rng_normal(&r); dht[i] = rng_normal(&r); }
                double *gx = dalloc(nx), *gw = dalloc(nw), *gb = dalloc(D), *gh = dalloc(nst);
                double *fx = dalloc(nx), *fw = dalloc(nw), *fb = dalloc(D), *fh = dalloc(nst);
                gdn_ref_conv1d_bwd(&c, x, w, b, h0, dy, dht, gx, gw, gb, gh);
                fd_grad(&c, x, w, b, h0, dy, dht, nx, nst, x, nx, fx);
                fd_grad(&c, x, w, b, h0, dy, dht, nx, nst, w, nw, fw);
                fd_grad(&c, x, w, b, h0, dy, dht, nx, nst, b, D, fb);
                fd_grad(&c, x, w, b, h0, dy, dht, nx, nst, h0, nst, fh);
                char ctx[200];
                snprintf(ctx, sizeof ctx, "op=conv1d_ref_vs_fd W%d %s silu=%d seed=%llu case=%ld(seed %llu)", W,
                         varlen ? "varlen[2,0,1,5]" : "B2 T3", silu, (unsigned long long)g_base_seed, idx,
                         (unsigned long long)seed);
                const double bound = 1e-7;
                const char *names[4] = {"dx", "dweight", "dbias", "dh0"};
                const double *an[4] = {gx, gw, gb, gh}, *fd[4] = {fx, fw, fb, fh};
                const size_t ns[4] = {nx, nw, (size_t)D, nst};
                for (int k = 0; k < 4; k++) {
                    int bad = 0;
                    const double e = rel_err_d(an[k], fd[k], ns[k], &bad);
                    check(!bad && e <= bound, ctx, "%s: reverse mode vs finite differences rel error %.3e (bound %.0e)",
                          names[k], e, bound);
                }
                free(x); free(dy); free(w); free(b); free(h0); free(dht);
                free(gx); free(gw); free(gb); free(gh); free(fx); free(fw); free(fb); free(fh);
            }
}

/* ---- update ---- */

/* Token by token from h0 (slots: a pool of B+2 rows, row b in slot perm[b])
 * equals the forward's y and ht. */
static void test_update_consistency(int W, gdn_dtype dt, int silu, int D, long idx) {
    const uint64_t seed = mix_seed(g_base_seed, 8100 + (uint64_t)idx);
    rng r;
    rng_seed(&r, seed);
    const int64_t B = 3, T = 9, NS = B + 2;
    const int32_t perm[3] = {4, 0, 2};
    const size_t nx = (size_t)(B * T) * D, nst = (size_t)B * D * W, row = (size_t)D * W;
    double *xd = dalloc(nx), *wd = dalloc((size_t)D * W), *bd = dalloc(D), *h0d = dalloc(nst);
    void *x = rand_tensor(&r, dt, nx, 1.0, xd);
    float *w = rand_tensor(&r, GDN_F32, (size_t)D * W, 0.6, wd), *bias = rand_tensor(&r, GDN_F32, D, 0.5, bd);
    float *h0 = rand_tensor(&r, GDN_F32, nst, 1.0, h0d);
    const gdn_exec ex = {GDN_BACKEND_CPU, NULL, 2, 0};
    gdn_conv1d_config c;
    memset(&c, 0, sizeof c);
    c.B = B; c.T = T; c.D = D; c.W = W; c.dtype = dt; c.silu = silu;
    void *y = t_alloc(nx * t_dsize(dt));
    float *ht = t_alloc(nst * sizeof(float));
    gdn_conv1d_args fa = {x, w, bias, h0, y, ht};
    char ctx[300];
    snprintf(ctx, sizeof ctx, "op=conv1d_update(vs fwd) B%lld T%lld D%d W%d dtype=%s silu=%d seed=%llu case=%ld(seed %llu)",
             (long long)B, (long long)T, D, W, t_dtype_name(dt), silu, (unsigned long long)g_base_seed, idx,
             (unsigned long long)seed);
    gdn_status s = gdn_conv1d_fwd(&ex, &c, &fa);
    check(s == GDN_OK, ctx, "forward status %s: %s", gdn_status_string(s), gdn_last_error());
    double *yd = dalloc(nx), *htd = dalloc(nst);
    for (size_t i = 0; i < nx; i++) yd[i] = t_get(dt, y, i);
    to_double_f32(ht, htd, nst);

    const size_t es = t_dsize(dt);
    for (int mode = 0; mode < 2; mode++) {   /* 0: slots NULL, pool = B rows; 1: slots perm into NS rows */
        const int64_t ns = mode ? NS : B;
        float *pool = t_alloc((size_t)ns * row * sizeof(float)), *keep = t_alloc((size_t)ns * row * sizeof(float));
        for (size_t i = 0; i < (size_t)ns * row; i++) pool[i] = (float)(100 + i % 13);  /* unused rows: a pattern */
        for (int64_t b = 0; b < B; b++) memcpy(pool + (mode ? perm[b] : b) * row, h0 + b * row, row * sizeof(float));
        memcpy(keep, pool, (size_t)ns * row * sizeof(float));
        void *yu = t_alloc(nx * es), *xt = t_alloc((size_t)B * D * es), *yt = t_alloc((size_t)B * D * es);
        gdn_conv1d_config uc = c;
        uc.T = 0;
        int ok = 1;
        for (int64_t t = 0; t < T && ok; t++) {
            for (int64_t b = 0; b < B; b++)
                memcpy((char *)xt + (size_t)b * D * es, (char *)x + ((size_t)(b * T + t) * D) * es, (size_t)D * es);
            t_poison_nan(dt, yt, (size_t)B * D);
            s = gdn_conv1d_update(&ex, &uc, xt, w, bias, pool, ns, mode ? perm : NULL, yt);
            ok = check(s == GDN_OK, ctx, "update status %s: %s", gdn_status_string(s), gdn_last_error());
            for (int64_t b = 0; b < B; b++)
                memcpy((char *)yu + ((size_t)(b * T + t) * D) * es, (char *)yt + (size_t)b * D * es, (size_t)D * es);
        }
        if (!ok) { free(pool); free(keep); free(yu); free(xt); free(yt); continue; }
        const double bound = bound_fwd(dt);
        check_close(ctx, mode ? "y (slots) vs forward y" : "y vs forward y", dt, yu, yd, nx, bound);
        float *fin = t_alloc(nst * sizeof(float));
        for (int64_t b = 0; b < B; b++) memcpy(fin + b * row, pool + (mode ? perm[b] : b) * row, row * sizeof(float));
        check_close(ctx, mode ? "state (slots) vs forward ht" : "state vs forward ht", GDN_F32, fin, htd, nst, bound);
        if (mode) {
            int same = 1;
            for (int64_t sl = 0; sl < ns; sl++)
                if (sl != 4 && sl != 0 && sl != 2) same &= !memcmp(pool + sl * row, keep + sl * row, row * sizeof(float));
            check(same, ctx, "slots not in use are unchanged");
        }
        free(fin); free(pool); free(keep); free(yu); free(xt); free(yt);
    }
    free(xd); free(wd); free(bd); free(h0d); free(x); free(w); free(bias); free(h0); free(y); free(ht);
    free(yd); free(htd);
}

/* Random pool, slots with padding (-1) and a repeated slot, against the
 * reference update; padding rows of y are 0 and unused slots keep their bytes. */
static void test_update_slots(int W, gdn_dtype dt, int silu, int with_bias, int D, long idx) {
    const uint64_t seed = mix_seed(g_base_seed, 8300 + (uint64_t)idx);
    rng r;
    rng_seed(&r, seed);
    const int64_t B = 7, NS = 6;
    const int32_t slots[7] = {3, -1, 0, 5, -1, 1, 3};   /* slot 3 twice: rows apply in order; 2, 4 unused */
    const size_t nxr = (size_t)B * D, row = (size_t)D * W, npool = (size_t)NS * row;
    double *xd = dalloc(nxr), *wd = dalloc(row), *bd = dalloc(D), *pd = dalloc(npool), *yr = dalloc(nxr);
    void *x = rand_tensor(&r, dt, nxr, 1.0, xd);
    float *w = rand_tensor(&r, GDN_F32, row, 0.6, wd), *bias = rand_tensor(&r, GDN_F32, D, 0.5, bd);
    float *pool = rand_tensor(&r, GDN_F32, npool, 1.0, pd), *keep = t_alloc(npool * sizeof(float));
    memcpy(keep, pool, npool * sizeof(float));
    gdn_ref_conv1d_update(B, D, W, silu, xd, wd, with_bias ? bd : NULL, pd, slots, yr);
    gdn_conv1d_config c;
    memset(&c, 0, sizeof c);
    c.B = B; c.T = 5; c.D = D; c.W = W; c.dtype = dt; c.silu = silu;   /* T is ignored */
    void *y = t_alloc(nxr * t_dsize(dt));
    t_poison_nan(dt, y, nxr);
    const gdn_exec ex = {GDN_BACKEND_CPU, NULL, 2, 0};
    char ctx[300];
    snprintf(ctx, sizeof ctx, "op=conv1d_update(slots) B%lld slots[3,-1,0,5,-1,1,3] num_slots%lld D%d W%d dtype=%s "
             "silu=%d bias=%d seed=%llu case=%ld(seed %llu)", (long long)B, (long long)NS, D, W, t_dtype_name(dt),
             silu, with_bias, (unsigned long long)g_base_seed, idx, (unsigned long long)seed);
    const gdn_status s = gdn_conv1d_update(&ex, &c, x, w, with_bias ? bias : NULL, pool, NS, slots, y);
    if (check(s == GDN_OK, ctx, "status %s: %s", gdn_status_string(s), gdn_last_error())) {
        check_close(ctx, "y", dt, y, yr, nxr, bound_fwd(dt));
        check_close(ctx, "state pool", GDN_F32, pool, pd, npool, bound_fwd(GDN_F32));
        int zero = 1;
        for (int64_t b = 0; b < B; b++)
            if (slots[b] < 0)
                for (int d = 0; d < D; d++) zero &= t_get(dt, y, (size_t)b * D + d) == 0.0;
        check(zero, ctx, "padding rows of y are 0");
        check(!memcmp(pool + 2 * row, keep + 2 * row, row * sizeof(float)) &&
              !memcmp(pool + 4 * row, keep + 4 * row, row * sizeof(float)), ctx, "unused slots 2, 4 keep their bytes");
    }
    free(xd); free(wd); free(bd); free(pd); free(yr); free(x); free(w); free(bias); free(pool); free(keep); free(y);
}

/* ---- determinism: the same bits for 1, 2, 3, 4 threads ---- */

static void test_determinism_d(int D, uint64_t seed) {
    rng r;
    rng_seed(&r, seed);
    const int W = 4;
    const int64_t B = 2, T = 301;
    const size_t nx = (size_t)(B * T) * D, nw = (size_t)D * W, nst = (size_t)B * D * W;
    double *tmp = dalloc(nx);
    void *x = rand_tensor(&r, GDN_BF16, nx, 1.0, tmp), *dy = rand_tensor(&r, GDN_BF16, nx, 1.0, tmp);
    float *w = rand_tensor(&r, GDN_F32, nw, 0.6, tmp), *bias = rand_tensor(&r, GDN_F32, D, 0.5, tmp);
    float *h0 = rand_tensor(&r, GDN_F32, nst, 1.0, tmp), *dht = rand_tensor(&r, GDN_F32, nst, 1.0, tmp);
    gdn_conv1d_config c;
    memset(&c, 0, sizeof c);
    c.B = B; c.T = T; c.D = D; c.W = W; c.dtype = GDN_BF16; c.silu = 1;
    void *y[4], *dx[4];
    float *ht[4], *dw[4], *db[4], *dh0[4];
    char ctx[200];
    snprintf(ctx, sizeof ctx, "op=conv1d determinism B%lld T%lld D%d W%d bf16 silu seed=%llu",
             (long long)B, (long long)T, D, W, (unsigned long long)seed);
    int ok = 1;
    for (int k = 0; k < 4; k++) {
        y[k] = t_alloc(nx * 2); dx[k] = t_alloc(nx * 2);
        ht[k] = t_alloc(nst * 4); dw[k] = t_alloc(nw * 4); db[k] = t_alloc((size_t)D * 4); dh0[k] = t_alloc(nst * 4);
        const gdn_exec ex = {GDN_BACKEND_CPU, NULL, k + 1, 0};
        gdn_conv1d_args fa = {x, w, bias, h0, y[k], ht[k]};
        gdn_conv1d_bwd_args ba = {x, w, bias, h0, dy, dht, dx[k], dw[k], db[k], dh0[k]};
        ok &= gdn_conv1d_fwd(&ex, &c, &fa) == GDN_OK && gdn_conv1d_bwd(&ex, &c, &ba) == GDN_OK;
    }
    if (check(ok, ctx, "a call failed: %s", gdn_last_error()))
        for (int k = 1; k < 4; k++)
            check(!memcmp(y[0], y[k], nx * 2) && !memcmp(ht[0], ht[k], nst * 4) && !memcmp(dx[0], dx[k], nx * 2) &&
                  !memcmp(dw[0], dw[k], nw * 4) && !memcmp(db[0], db[k], (size_t)D * 4) &&
                  !memcmp(dh0[0], dh0[k], nst * 4), ctx, "threads 1 vs %d: y, ht, dx, dweight, dbias, dh0 bit-identical",
                  k + 1);
    for (int k = 0; k < 4; k++) { free(y[k]); free(dx[k]); free(ht[k]); free(dw[k]); free(db[k]); free(dh0[k]); }
    free(tmp); free(x); free(dy); free(w); free(bias); free(h0); free(dht);
}

/* D = 300: the channel blocks; D = 320: the backward's direct walk (bf16, whole vectors) */
static void test_determinism(void) {
    test_determinism_d(300, mix_seed(g_base_seed, 8500));
    test_determinism_d(320, mix_seed(g_base_seed, 8501));
}

/* ---- the backward's staged dx: the same bits as in place ----
 * B2 T4096 D2048 bf16 makes dx 32 MiB, at the size from which the direct
 * walk stages its dx rows and streams them out (src/cpu/conv1d.c,
 * BWD_STAGE_BYTES); each batch row alone (16 MiB) is stored in place. The
 * walk sums and stores the same values either way, so dx and dh0 must match
 * bit for bit, with h0, dht and SiLU (every edge of a sequence); dweight and
 * dbias, summed over both rows in one call, within fp32 rounding of the two
 * calls' parts. Outputs poisoned first. */
static void test_staged_dx(void) {
    rng r;
    const uint64_t seed = mix_seed(g_base_seed, 8600);
    rng_seed(&r, seed);
    const int D = 2048, W = 4;
    const int64_t B = 2, T = 4096;
    const size_t nx = (size_t)(B * T) * D, nr = (size_t)T * D, nw = (size_t)D * W, nst = (size_t)B * D * W;
    double *tmp = dalloc(nx);
    uint16_t *x = rand_tensor(&r, GDN_BF16, nx, 1.0, tmp), *dy = rand_tensor(&r, GDN_BF16, nx, 1.0, tmp);
    float *w = rand_tensor(&r, GDN_F32, nw, 0.6, tmp), *bias = rand_tensor(&r, GDN_F32, D, 0.5, tmp);
    float *h0 = rand_tensor(&r, GDN_F32, nst, 1.0, tmp), *dht = rand_tensor(&r, GDN_F32, nst, 1.0, tmp);
    uint16_t *dx = t_alloc(nx * 2), *dx1 = t_alloc(nx * 2);
    float *dw = t_alloc(nw * 4), *db = t_alloc((size_t)D * 4), *dh0 = t_alloc(nst * 4), *dh01 = t_alloc(nst * 4);
    float *dw1 = t_alloc(2 * nw * 4), *db1 = t_alloc((size_t)2 * D * 4);
    t_poison_nan(GDN_BF16, dx, nx); t_poison_nan(GDN_BF16, dx1, nx);
    t_poison_nan(GDN_F32, dh0, nst); t_poison_nan(GDN_F32, dh01, nst);
    char ctx[200];
    snprintf(ctx, sizeof ctx, "op=conv1d_bwd staged dx B%lld T%lld D%d W%d bf16 silu h0 dht seed=%llu", (long long)B, (long long)T, D, W,
             (unsigned long long)seed);
    const gdn_exec ex = {GDN_BACKEND_CPU, NULL, 2, 0};
    gdn_conv1d_config c;
    memset(&c, 0, sizeof c);
    c.B = B; c.T = T; c.D = D; c.W = W; c.dtype = GDN_BF16; c.silu = 1;
    gdn_conv1d_bwd_args ba = {x, w, bias, h0, dy, dht, dx, dw, db, dh0};
    int ok = gdn_conv1d_bwd(&ex, &c, &ba) == GDN_OK;
    c.B = 1;
    for (int b = 0; b < 2; b++) {
        gdn_conv1d_bwd_args bb = {x + b * nr, w, bias, h0 + (size_t)b * D * W, dy + b * nr, dht + (size_t)b * D * W, dx1 + b * nr,
                                  dw1 + (size_t)b * nw, db1 + (size_t)b * D, dh01 + (size_t)b * D * W};
        ok &= gdn_conv1d_bwd(&ex, &c, &bb) == GDN_OK;
    }
    if (check(ok, ctx, "a call failed: %s", gdn_last_error())) {
        check(!memcmp(dx, dx1, nx * 2), ctx, "dx staged (one call of 32 MiB) and in place (two of 16 MiB) bit-identical");
        check(!memcmp(dh0, dh01, nst * 4), ctx, "dh0 staged and in place bit-identical");
        double e = 0;
        /* each call rounds its fp64 sums to fp32 once: the difference within a few ulps of the two parts */
        for (size_t i = 0; i < nw; i++)
            e = fmax(e, fabs(dw[i] - ((double)dw1[i] + dw1[nw + i])) / (fabs(dw1[i]) + fabs(dw1[nw + i]) + 1e-30));
        for (int i = 0; i < D; i++) e = fmax(e, fabs(db[i] - ((double)db1[i] + db1[D + i])) / (fabs(db1[i]) + fabs(db1[D + i]) + 1e-30));
        check(e < 4e-7, ctx, "dweight, dbias of one call against the two calls' sums: %.2e of the parts (bound 4e-7)", e);
    }
    free(tmp); free(x); free(dy); free(w); free(bias); free(h0); free(dht); free(dx); free(dx1);
    free(dw); free(db); free(dh0); free(dh01); free(dw1); free(db1);
}

/* ---- bad input: status, a message, not one byte written ---- */

#define EBUF 4096
enum { E_FWD, E_BWD, E_UPD };

typedef struct eenv {
    gdn_conv1d_config c;
    gdn_exec ex;
    int64_t cu[4];
    int32_t slots[2];
    int64_t num_slots;
    gdn_conv1d_args fa;
    gdn_conv1d_bwd_args ba;
    const gdn_exec *exp;
    const gdn_conv1d_config *cp;
    const gdn_conv1d_args *fap;
    const gdn_conv1d_bwd_args *bap;
    const int32_t *slotsp;
    const void *ux;
    const float *uw;
    float *ustate;
    void *uy;
} eenv;

static void *e_in, *e_out[7];   /* y, ht, dx, dweight, dbias, dh0, update y; e_state the pool */
static float *e_state;

static void eenv_reset(eenv *e) {
    memset(e, 0, sizeof *e);
    gdn_conv1d_config *c = &e->c;
    c->B = 2; c->T = 5; c->D = 6; c->W = 4; c->dtype = GDN_F32; c->silu = 1;
    e->cu[0] = 0; e->cu[1] = 2; e->cu[2] = 2; e->cu[3] = 5;
    e->ex.backend = GDN_BACKEND_CPU; e->ex.threads = 1;
    e->exp = &e->ex; e->cp = &e->c;
    const float *in = e_in;
    e->fa = (gdn_conv1d_args){in, in, in, in, e_out[0], e_out[1]};
    e->ba = (gdn_conv1d_bwd_args){in, in, in, in, in, in, e_out[2], e_out[3], e_out[4], e_out[5]};
    e->fap = &e->fa; e->bap = &e->ba;
    e->slots[0] = 1; e->slots[1] = -1;
    e->num_slots = 2;
    e->slotsp = e->slots;
    e->ux = in; e->uw = in; e->ustate = e_state; e->uy = e_out[6];
}

static gdn_status eenv_call(const eenv *e, int op) {
    switch (op) {
    case E_FWD: return gdn_conv1d_fwd(e->exp, e->cp, e->fap);
    case E_BWD: return gdn_conv1d_bwd(e->exp, e->cp, e->bap);
    default: return gdn_conv1d_update(e->exp, e->cp, e->ux, e->uw, NULL, e->ustate, e->num_slots, e->slotsp, e->uy);
    }
}

typedef void (*mutator)(eenv *e);
#define MUT(name, body) static void name(eenv *e) { body; }
MUT(m_cfg_null, e->cp = NULL)
MUT(m_args_null, e->fap = NULL; e->bap = NULL)
MUT(m_x_null, e->fa.x = NULL; e->ba.x = NULL; e->ux = NULL)
MUT(m_w_null, e->fa.weight = NULL; e->ba.weight = NULL; e->uw = NULL)
MUT(m_y_null, e->fa.y = NULL; e->uy = NULL)
MUT(m_dy_null, e->ba.dy = NULL)
MUT(m_dx_null, e->ba.dx = NULL)
MUT(m_dw_null, e->ba.dweight = NULL)
MUT(m_state_null, e->ustate = NULL)
MUT(m_B_neg, e->c.B = -1)
MUT(m_T_neg, e->c.T = -1)
MUT(m_D_zero, e->c.D = 0)
MUT(m_W_zero, e->c.W = 0)
MUT(m_W_nine, e->c.W = 9)
MUT(m_dtype, e->c.dtype = (gdn_dtype)7)
MUT(m_silu, e->c.silu = 2)
MUT(m_threads, e->ex.threads = -1)
MUT(m_backend, e->ex.backend = (gdn_backend)99)
MUT(m_cu_B2, e->c.cu_seqlens = e->cu; e->c.num_seqs = 3)
MUT(m_cu_first, e->c.B = 1; e->c.cu_seqlens = e->cu; e->c.num_seqs = 3; e->cu[0] = 1)
MUT(m_cu_unsorted, e->c.B = 1; e->c.cu_seqlens = e->cu; e->c.num_seqs = 3; e->cu[2] = 1)
MUT(m_cu_last, e->c.B = 1; e->c.cu_seqlens = e->cu; e->c.num_seqs = 3; e->cu[3] = 4)
MUT(m_cu_past, e->c.B = 1; e->c.cu_seqlens = e->cu; e->c.num_seqs = 3; e->cu[2] = 7; e->cu[3] = 7)
MUT(m_cu_nseq, e->c.B = 1; e->c.cu_seqlens = e->cu; e->c.num_seqs = 0)
MUT(m_nslots_zero, e->num_slots = 0)
MUT(m_nslots_small, e->slotsp = NULL; e->num_slots = 1)
MUT(m_slot_high, e->slots[1] = 2)
MUT(m_slot_low, e->slots[1] = -2)

/* a valid call (no tokens) leaves gdn_last_error() empty */
static void clear_error(void) {
    const float wt[4] = {0};
    gdn_conv1d_config c = {0};
    c.D = 1; c.W = 4; c.dtype = GDN_F32;
    const gdn_conv1d_args a = {NULL, wt, NULL, NULL, NULL, NULL};
    gdn_conv1d_fwd(NULL, &c, &a);
}

typedef struct emut { const char *name; mutator fn; gdn_status want; unsigned ops; } emut;

static void test_bad_input(void) {
    e_in = t_alloc(EBUF);
    for (size_t i = 0; i < EBUF / 4; i++) ((float *)e_in)[i] = 0.25f;
    for (int k = 0; k < 7; k++) e_out[k] = t_alloc(EBUF);
    e_state = t_alloc(EBUF);
    const unsigned F = 1u << E_FWD, Bw = 1u << E_BWD, U = 1u << E_UPD, ALL = F | Bw | U;
    const emut muts[] = {
        {"cfg NULL", m_cfg_null, GDN_ERR_NULL, ALL},
        {"args NULL", m_args_null, GDN_ERR_NULL, F | Bw},
        {"x NULL", m_x_null, GDN_ERR_NULL, ALL},
        {"weight NULL", m_w_null, GDN_ERR_NULL, ALL},
        {"y NULL", m_y_null, GDN_ERR_NULL, F | U},
        {"dy NULL", m_dy_null, GDN_ERR_NULL, Bw},
        {"dx NULL", m_dx_null, GDN_ERR_NULL, Bw},
        {"dweight NULL", m_dw_null, GDN_ERR_NULL, Bw},
        {"state NULL", m_state_null, GDN_ERR_NULL, U},
        {"B < 0", m_B_neg, GDN_ERR_SHAPE, ALL},
        {"T < 0", m_T_neg, GDN_ERR_SHAPE, F | Bw},
        {"D = 0", m_D_zero, GDN_ERR_SHAPE, ALL},
        {"W = 0", m_W_zero, GDN_ERR_SHAPE, ALL},
        {"W = 9", m_W_nine, GDN_ERR_SHAPE, ALL},
        {"dtype 7", m_dtype, GDN_ERR_DTYPE, ALL},
        {"silu 2", m_silu, GDN_ERR_OPTION, ALL},
        {"threads -1", m_threads, GDN_ERR_OPTION, ALL},
        {"backend 99", m_backend, GDN_ERR_BACKEND, ALL},
        {"cu_seqlens with B 2", m_cu_B2, GDN_ERR_SEQLENS, F | Bw},
        {"cu_seqlens[0] 1", m_cu_first, GDN_ERR_SEQLENS, F | Bw},
        {"cu_seqlens unsorted", m_cu_unsorted, GDN_ERR_SEQLENS, F | Bw},
        {"cu_seqlens last != T", m_cu_last, GDN_ERR_SEQLENS, F | Bw},
        {"cu_seqlens past T", m_cu_past, GDN_ERR_SEQLENS, F | Bw},
        {"num_seqs 0", m_cu_nseq, GDN_ERR_SEQLENS, F | Bw},
        {"num_slots 0", m_nslots_zero, GDN_ERR_SHAPE, U},
        {"num_slots < B, slots NULL", m_nslots_small, GDN_ERR_SHAPE, U},
        {"slot = num_slots", m_slot_high, GDN_ERR_SHAPE, U},
        {"slot -2", m_slot_low, GDN_ERR_SHAPE, U},
    };
    static const char *op_names[] = {"conv1d_fwd", "conv1d_bwd", "conv1d_update"};
    unsigned char *snap = t_alloc(8 * EBUF);
    for (int op = 0; op < 3; op++) {
        eenv e;
        char ctx[200];
        /* the valid call succeeds and clears the message */
        for (int k = 0; k < 7; k++) memset(e_out[k], 0xA5, EBUF);
        eenv_reset(&e);
        gdn_conv1d_fwd(NULL, NULL, NULL);   /* leave an error behind */
        gdn_status s = eenv_call(&e, op);
        snprintf(ctx, sizeof ctx, "op=%s bad-input baseline", op_names[op]);
        check(s == GDN_OK && gdn_last_error()[0] == 0, ctx, "valid call: status %s, last error \"%s\"",
              gdn_status_string(s), gdn_last_error());
        for (size_t m = 0; m < sizeof muts / sizeof muts[0]; m++) {
            if (!(muts[m].ops & (1u << op))) continue;
            for (int k = 0; k < 7; k++) memset(e_out[k], 0xA5, EBUF);
            memset(e_state, 0x5A, EBUF);
            for (int k = 0; k < 7; k++) memcpy(snap + k * EBUF, e_out[k], EBUF);
            memcpy(snap + 7 * EBUF, e_state, EBUF);
            eenv_reset(&e);
            muts[m].fn(&e);
            clear_error();
            s = eenv_call(&e, op);
            snprintf(ctx, sizeof ctx, "op=%s bad input: %s", op_names[op], muts[m].name);
            int same = !memcmp(snap + 7 * EBUF, e_state, EBUF);
            for (int k = 0; k < 7; k++) same &= !memcmp(snap + k * EBUF, e_out[k], EBUF);
            check(s == muts[m].want && gdn_last_error()[0] != 0 && same, ctx,
                  "status %s (want %s), message \"%s\", outputs %s", gdn_status_string(s),
                  gdn_status_string(muts[m].want), gdn_last_error(), same ? "unchanged" : "WRITTEN");
        }
    }
    free(snap);
    free(e_in);
    for (int k = 0; k < 7; k++) free(e_out[k]);
    free(e_state);
}

/* ---- the sweep ---- */

void test_conv1d(void) {
    long idx = 0;
    static const gdn_dtype dts[3] = {GDN_F32, GDN_BF16, GDN_F16};
    rng r;
    rng_seed(&r, mix_seed(g_base_seed, 6999));

    /* every W x dtype x T, B = 2, D = 37; option sets cycle over all 64 */
    const int64_t Ts[6] = {0, 1, 3, 64, 65, 2 + rng_int(&r, 0, 150)};
    for (int W = 1; W <= 8; W++)
        for (int di = 0; di < 3; di++)
            for (int ti = 0; ti < 6; ti++, idx++) {
                if (g_quick && ti % 2) continue;
                ccase tc = {0};
                tc.B = 2; tc.T = Ts[ti]; tc.D = 37; tc.W = W; tc.dt = dts[di];
                tc.silu = (int)(idx % 2);
                tc.opt = (unsigned)(idx * 23 % 64);
                if (ti == 3) tc.opt = O_ALL;
                if (ti == 4) tc.opt = 0;
                tc.threads = 1 + (int)(idx % 3);
                tc.inplace = (int)(idx % 4 == 1);
                run_case(&tc, idx);
            }

    /* varlen: empty, 1-token and ragged sequences */
    const int64_t sets[5][8] = {{0, 1, 5, 0, 17, 1, 64, 3}, {1}, {0}, {70, 0, 1, 130, 2}, {0}};
    const int set_n[5] = {8, 1, 1, 5, 6};
    for (int si = 0; si < 5; si++)
        for (int W = 1; W <= 8; W++)
            for (int di = 0; di < 3; di++, idx++) {
                if (g_quick && (W + di) % 2) continue;
                ccase tc = {0};
                tc.nseq = set_n[si];
                for (int i = 0; i < tc.nseq; i++)
                    tc.lens[i] = si == 4 ? rng_int(&r, 0, 80) : sets[si][i];   /* set 4: random ragged */
                tc.D = si == 3 ? 19 : 37; tc.W = W; tc.dt = dts[di];
                tc.silu = (int)((idx / 3) % 2);
                tc.opt = (unsigned)(idx * 29 % 64);
                if (di == 0) tc.opt = O_ALL;
                tc.threads = 1 + (int)(idx % 2);
                tc.inplace = (int)(idx % 3 == 0);
                run_case(&tc, idx);
            }

    /* D = 2048 and channel counts around the block size */
    const struct { int D, W; gdn_dtype dt; int silu; int64_t B, T; } big[] = {
        {2048, 4, GDN_BF16, 1, 2, 65}, {2048, 3, GDN_F32, 0, 1, 100}, {2048, 8, GDN_F16, 1, 1, 64},
        {2048, 4, GDN_F32, 1, 3, 33}, {1, 4, GDN_F32, 1, 2, 40}, {16, 2, GDN_BF16, 0, 2, 17},
        {64, 4, GDN_F32, 1, 2, 70}, {65, 5, GDN_F16, 1, 2, 9}, {127, 4, GDN_BF16, 1, 1, 200},
        /* bf16 full channel blocks (the one-pass rows) with every W class and without SiLU */
        {2048, 2, GDN_BF16, 0, 2, 40}, {128, 7, GDN_BF16, 1, 2, 50}, {192, 1, GDN_BF16, 0, 1, 30}, {256, 8, GDN_BF16, 1, 1, 100},
        /* bf16, D a whole number of vectors: the backward's direct walk (every W, sequences shorter than W) */
        {48, 3, GDN_BF16, 1, 3, 2}, {80, 5, GDN_BF16, 1, 2, 41}, {96, 6, GDN_BF16, 0, 2, 5}, {32, 8, GDN_BF16, 1, 2, 7},
        /* bf16 y, dx of 8.4 MB: the streaming stores (GDN_STREAM_BYTES, src/cpu/stream.h), on and off a line */
        {2048, 4, GDN_BF16, 1, 1, 2050}, {2048, 4, GDN_BF16, 1, 1, 2050},
    };
    const int nbig = (int)(sizeof big / sizeof big[0]);
    for (int i = 0; i < nbig; i++, idx++) {
        ccase tc = {0};
        if (i == nbig - 1) tc.shift = 48;
        tc.B = big[i].B; tc.T = big[i].T; tc.D = big[i].D; tc.W = big[i].W; tc.dt = big[i].dt;
        tc.silu = big[i].silu; tc.opt = i % 2 ? (unsigned)(idx * 23 % 64) : O_ALL; tc.threads = 2; tc.inplace = 1;
        run_case(&tc, idx);
    }
    {   /* varlen at D = 2048 */
        ccase tc = {0};
        tc.nseq = 4; tc.lens[0] = 0; tc.lens[1] = 1; tc.lens[2] = 77; tc.lens[3] = 3;
        tc.D = 2048; tc.W = 4; tc.dt = GDN_BF16; tc.silu = 1; tc.opt = O_ALL; tc.threads = 2;
        run_case(&tc, idx++);
    }

    test_fd();
    for (int W = 1; W <= 8; W++)
        for (int di = 0; di < 3; di++) {
            test_update_consistency(W, dts[di], (W + di) % 2, 37, idx++);
            test_update_slots(W, dts[di], (W + di + 1) % 2, W % 2, 37, idx++);
        }
    test_update_consistency(4, GDN_F32, 1, 2048, idx++);
    test_update_consistency(4, GDN_BF16, 1, 2048, idx++);
    test_update_consistency(3, GDN_BF16, 0, 128, idx++);
    test_update_slots(4, GDN_BF16, 1, 1, 2048, idx++);
    test_determinism();
    test_staged_dx();
    test_bad_input();
}
