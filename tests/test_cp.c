/* Context parallel (include/gdn.h, DESIGN.md §8) on the CPU: one token stream
 * cut over 2 and 3 simulated ranks in one process. Each rank runs its map
 * calls, the test moves the maps (the all-gather), each rank scans and
 * finishes with gdn_chunk_fwd / gdn_chunk_bwd; the pieces put together must
 * match the float64 reference (DESIGN.md §5 bounds, the same measures as
 * test_backend.c) and the single-call gdn_chunk_fwd / bwd on the whole
 * stream. Uneven cuts, varlen sequences over one and two cuts, a rank holding
 * the middle of one sequence only (and one holding no token of it), cuts on
 * sequence edges, h0 / ht / dht, GVA, every dtype and state layout, segment
 * cuts of a rank's span (seq_split). Every output, map and workspace is
 * poisoned with NaN first; the whole flow runs with 1 and 2 threads and
 * must give the same bits, one of the two runs taking steps 1 and 4, 5 and
 * 8 as gdn_cp_fwd_begin / _finish, gdn_cp_bwd_begin / _finish (the same
 * bits again). With a CUDA device, every map and scan call of
 * the flow also runs on the CUDA backend (device copies of the same
 * arguments, NaN-poisoned outputs and workspace) and must match the CPU's
 * result: the maps within twice the forward (backward) bound, as two
 * results each within the bound of the exact map may differ by that much;
 * the scans of the same maps to fp32 rounding. Then the
 * bad-input contract of the new calls. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ref/ref.h"
#include "test_util.h"
#include "test_cuda_util.h"

enum { MAXR = 4, MAXS = 16 };

typedef struct cpcase {
    const char *name;
    int H, HV, K, V;
    int nseq;                 /* 0: one sequence, no cu_seqlens (global and local) */
    int64_t lens[MAXS];       /* global sequence lengths (nseq > 0) */
    int64_t T;                /* nseq == 0: its length */
    int world;
    int64_t cuts[MAXR + 1];   /* rank r holds global tokens cuts[r] .. cuts[r+1]-1 */
    gdn_dtype dt, gdt;
    unsigned flags;
    int has_g;                /* 0: g NULL (no decay; not with GATE_FUSED) */
    int gmode;                /* 0: log-sigmoid gates; 1: decaying hard (g to -20); 2: weak decay (|g| < 1e-2)
                                 and small beta, so that P carries the state across whole ranks */
    int h0, ht, dht;          /* global h0 given, ht wanted, dht given (dh0 always wanted) */
    int split;                /* gdn_exec.seq_split */
} cpcase;

/* a rank's local view of the global stream */
typedef struct rankview {
    int64_t s, e;             /* global tokens s..e-1 */
    int64_t N;                /* local sequences */
    int64_t n0;               /* global index of local sequence 0 */
    int64_t cu[MAXS + 1];
    int first, last;          /* first_continues, last_continues */
} rankview;

static double *dalloc(size_t n) { return t_alloc(n * sizeof(double)); }
static double logsig(double x) { return x >= 0 ? -log1p(exp(-x)) : x - log1p(exp(x)); }

/* the local sequences of rank r: every global sequence that meets its tokens;
 * an empty one belongs to the first rank that ends after it (the last rank at T) */
static void make_view(const cpcase *tc, const int64_t *gcu, int64_t Nglob, int r, rankview *rv) {
    rv->s = tc->cuts[r]; rv->e = tc->cuts[r + 1];
    rv->N = 0; rv->n0 = -1;
    rv->cu[0] = 0;
    for (int64_t n = 0; n < Nglob; n++) {
        const int64_t a = gcu[n], b = gcu[n + 1];
        int mine;
        if (b > a) mine = a < rv->e && b > rv->s;
        else {
            int owner = tc->world - 1;
            for (int q = 0; q < tc->world; q++) if (a < tc->cuts[q + 1]) { owner = q; break; }
            mine = owner == r;
        }
        if (!mine) continue;
        if (rv->N == 0) rv->n0 = n;
        const int64_t hi = b < rv->e ? b : rv->e;
        rv->cu[++rv->N] = hi - rv->s;
    }
    rv->first = rv->N > 0 && gcu[rv->n0] < rv->s;
    rv->last = rv->N > 0 && gcu[rv->n0 + rv->N] > rv->e;
}

typedef struct tens { void *p; double *d; } tens;
static tens tens_new(gdn_dtype t, size_t n) { tens x = {t_alloc(n * t_dsize(t)), dalloc(n)}; return x; }
static void tens_free(tens *x) { free(x->p); free(x->d); }

static long n_cases;

/* ---- the CUDA twin of each map and scan call (a device present) ---- */
typedef struct twin {
    int on;
#ifdef GDN_HAVE_CUDA
    gdn_exec ex;
    void *q, *k, *v, *g, *beta, *dout;   /* device copies of the global tensors */
    float *A_log, *dt_bias;
    int64_t *cu[MAXR];                   /* each rank's cu_seqlens on the device */
#endif
} twin;

#ifdef GDN_HAVE_CUDA
/* per value head, |got - ref| / (|ref| + 1e-6 sqrt(n)) over P and over S of
 * the maps (or over the [HV][K*V] states where K2 = 0); the worst */
static double map_err(const float *got, const float *ref, int HV, size_t K2, size_t KV) {
    double worst = 0;
    for (int j = 0; j < HV; j++)
        for (int part = 0; part < 2; part++) {
            const size_t n = part ? KV : K2, o = (size_t)j * (K2 + KV) + (part ? K2 : 0);
            if (!n) continue;
            double num = 0, den = 0;
            for (size_t x = 0; x < n; x++) {
                const double d = (double)got[o + x] - ref[o + x];
                num += d * d;
                den += (double)ref[o + x] * ref[o + x];
            }
            const double e = sqrt(num) / (sqrt(den) + 1e-6 * sqrt((double)n));
            if (!(e <= worst)) worst = e;   /* NaN wins */
        }
    return worst;
}

/* the bound of two chunked approximations of one map (CUDA, CPU) over a
 * rank's n tokens: base, grown as sqrt(chunks / 8) past 8 chunks, as the
 * rounding of a product of per-chunk maps grows (random-signed) with their
 * number: a weakly decaying 1200-token segment's f32 maps differed by 2.1e-5
 * against the flat 2e-5 (3 of 51 seeds) */
static double map_bound(double base, int64_t n) {
    const double chunks = (double)((n + 63) / 64);
    return chunks > 8 ? base * sqrt(chunks / 8) : base;
}

/* the device result (n floats at d) against the CPU's */
static void twin_close(const char *ctx, const char *what, int r, const float *d, const float *cpu, int HV, size_t K2, size_t KV,
                       double bound) {
    const size_t n = (size_t)HV * (K2 + KV);
    float *h = t_alloc(n * 4);
    dget(h, d, n * 4);
    const double e = map_err(h, cpu, HV, K2, KV);
    check(e <= bound, ctx, "rank %d %s: CUDA vs CPU rel error %.3e (bound %.0e)", r, what, e, bound);
    free(h);
}
#endif

static void run_case(const cpcase *tc) {
    const long idx = n_cases++;
    const uint64_t seed = mix_seed(g_base_seed, 5000 + (uint64_t)idx);
    rng rg;
    rng_seed(&rg, seed);
    const unsigned f = tc->flags;
    const int fused = (f & GDN_GATE_FUSED) != 0, has_g = fused || tc->has_g;
    const int H = tc->H, HV = tc->HV, K = tc->K, V = tc->V, R = tc->world;
    const gdn_dtype dt = tc->dt, gdt = tc->gdt;
    const size_t dsz = t_dsize(dt), gsz = t_dsize(gdt);

    /* ---- the global stream ---- */
    int64_t gcu[MAXS + 1], Nglob, T;
    gdn_config c;
    memset(&c, 0, sizeof c);
    if (tc->nseq) {
        gcu[0] = 0;
        for (int i = 0; i < tc->nseq; i++) gcu[i + 1] = gcu[i] + tc->lens[i];
        Nglob = tc->nseq; T = gcu[Nglob];
        c.cu_seqlens = gcu; c.num_seqs = Nglob;
    } else {
        Nglob = 1; T = tc->T; gcu[0] = 0; gcu[1] = T;
    }
    c.B = 1; c.T = T; c.H = H; c.HV = HV; c.K = K; c.V = V; c.dtype = dt; c.gate_dtype = gdt; c.flags = f;
    char fl[128], ctx[768];
    flags_str(f, fl, sizeof fl);
    char cuts[96] = "";
    for (int r = 0, len = 0; r <= R; r++) len += snprintf(cuts + len, sizeof cuts - len, "%s%lld", r ? "," : "", (long long)tc->cuts[r]);
    snprintf(ctx, sizeof ctx, "op=cp backend=cpu case=%s T%lld N%lld cuts={%s} H%d HV%d K%d V%d dtype=%s gate_dtype=%s "
             "flags=%s h0=%d ht=%d dht=%d seq_split=%d seed=%llu case=%ld(seed %llu)", tc->name, (long long)T,
             (long long)Nglob, cuts, H, HV, K, V, t_dtype_name(dt), t_dtype_name(gdt), fl, tc->h0, tc->ht, tc->dht,
             tc->split, (unsigned long long)g_base_seed, idx, (unsigned long long)seed);

    const size_t nqk = (size_t)T * H * K, nv = (size_t)T * HV * V, ng = (size_t)T * HV, sst = (size_t)HV * K * V,
                 nst = (size_t)Nglob * sst;
    tens q = tens_new(dt, nqk), k = tens_new(dt, nqk), v = tens_new(dt, nv), dout = tens_new(dt, nv);
    tens g = tens_new(gdt, ng), beta = tens_new(gdt, ng);
    for (size_t i = 0; i < nqk; i++) q.d[i] = t_store(dt, q.p, i, (float)rng_normal(&rg));
    for (size_t row = 0; row < nqk / K; row++) {
        double ss = 0, x[256];
        for (int i = 0; i < K; i++) { x[i] = rng_normal(&rg); ss += x[i] * x[i]; }
        const double target = dt == GDN_F32 ? 1.0 : 0.99;
        for (int i = 0; i < K; i++)
            k.d[row * K + i] = t_store(dt, k.p, row * K + i, (float)((f & GDN_QK_L2NORM) ? x[i] : x[i] * target / sqrt(ss)));
    }
    for (size_t i = 0; i < nv; i++) v.d[i] = t_store(dt, v.p, i, (float)rng_normal(&rg));
    for (size_t i = 0; i < nv; i++) dout.d[i] = t_store(dt, dout.p, i, (float)rng_normal(&rg));
    for (size_t i = 0; i < ng; i++) {
        double x = 0.0;
        if (fused) x = tc->gmode == 1 ? 0.3 + 0.5 * rng_normal(&rg) : tc->gmode == 2 ? -10.0 + 0.5 * rng_normal(&rg) : rng_normal(&rg);
        else if (has_g) x = tc->gmode == 1 && rng_uniform(&rg) < 0.5 ? -20.0 * rng_uniform(&rg)
                          : tc->gmode == 2 ? -0.002 * rng_uniform(&rg) : logsig(rng_normal(&rg));
        g.d[i] = t_store(gdt, g.p, i, (float)x);
        /* weak mode: small beta too, so the delta rule's removal leaves P large as well */
        const double b = (f & GDN_BETA_SIGMOID) ? (tc->gmode == 2 ? -4.5 + 0.3 * rng_normal(&rg) : rng_normal(&rg))
                                                : (tc->gmode == 2 ? 0.02 * rng_uniform(&rg) : rng_uniform(&rg));
        beta.d[i] = t_store(gdt, beta.p, i, (float)b);
    }
    float A_log[64], dt_bias[64];
    double A_logd[64], dt_biasd[64];
    for (int j = 0; j < HV; j++) {
        A_log[j] = (float)log(1.0 + 15.0 * rng_uniform(&rg)); A_logd[j] = A_log[j];
        dt_bias[j] = (float)(0.5 * rng_normal(&rg)); dt_biasd[j] = dt_bias[j];
    }
    float *h0 = t_alloc(nst * 4), *dht = t_alloc(nst * 4);
    double *h0d = dalloc(nst), *dhtd = dalloc(nst);
    for (size_t i = 0; i < nst; i++) {
        h0[i] = (float)rng_normal(&rg); h0d[i] = h0[i];
        dht[i] = (float)rng_normal(&rg); dhtd[i] = dht[i];
    }

    /* the device copies for the CUDA twins */
    twin tw;
    memset(&tw, 0, sizeof tw);
#ifdef GDN_HAVE_CUDA
    tw.on = gdn_backend_available(GDN_BACKEND_CUDA);
    if (tw.on) {
        const gdn_exec exd = {GDN_BACKEND_CUDA, NULL, 0, tc->split};
        tw.ex = exd;
        tw.q = dput(q.p, nqk * dsz); tw.k = dput(k.p, nqk * dsz); tw.v = dput(v.p, nv * dsz); tw.dout = dput(dout.p, nv * dsz);
        tw.g = dput(g.p, ng * gsz); tw.beta = dput(beta.p, ng * gsz);
        tw.A_log = dput(A_log, sizeof A_log); tw.dt_bias = dput(dt_bias, sizeof dt_bias);
    }
#endif

    /* ---- the float64 reference ---- */
    gdn_ref_inputs in = {q.d, k.d, v.d, has_g ? g.d : NULL, beta.d, fused ? A_logd : NULL, fused ? dt_biasd : NULL,
                         tc->h0 ? h0d : NULL};
    double *o_ref = dalloc(nv), *o_t2 = dalloc(nv), *ht_ref = dalloc(nst);
    gdn_ref_fwd_terms(&c, &in, o_ref, ht_ref, o_t2);
    double *dq_ref = dalloc(nqk), *dk_ref = dalloc(nqk), *dv_ref = dalloc(nv), *dg_ref = dalloc(ng),
           *db_ref = dalloc(ng), dA_ref[64], ddt_ref[64], *dh0_ref = dalloc(nst), *dh0_t2 = dalloc(nst),
           *dg_t2 = dalloc(ng), *db_t2 = dalloc(ng);
    gdn_ref_bwd_terms(&c, &in, dout.d, tc->dht ? dhtd : NULL, dq_ref, dk_ref, dv_ref, dg_ref, db_ref, dA_ref, ddt_ref,
                      dh0_ref, dh0_t2, dg_t2, db_t2);
    double dA_t2[64] = {0}, ddt_t2[64] = {0};
    if (fused) gate_param_terms2(ng, HV, g.d, dt_biasd, dg_ref, dA_t2, ddt_t2);

    /* ---- the single call on the whole stream ---- */
    gdn_exec ex1 = {GDN_BACKEND_CPU, NULL, 2, tc->split};
    const size_t sv_all = gdn_chunk_saved_size(&c);
    void *o1 = t_alloc(nv * dsz), *saved1 = t_alloc(sv_all);
    float *ht1 = t_alloc(nst * 4);
    void *g1[5] = {t_alloc(nqk * dsz), t_alloc(nqk * dsz), t_alloc(nv * dsz), t_alloc(ng * gsz), t_alloc(ng * gsz)};
    float dA1[64], ddt1[64], *dh01 = t_alloc(nst * 4);
    {
        size_t wsb = gdn_chunk_fwd_workspace_size(&ex1, &c);
        void *ws = t_alloc(wsb);
        gdn_fwd_args a = {q.p, k.p, v.p, has_g ? g.p : NULL, beta.p, fused ? A_log : NULL, fused ? dt_bias : NULL,
                          tc->h0 ? h0 : NULL, o1, ht1, saved1, sv_all, ws, wsb};
        gdn_status st = gdn_chunk_fwd(&ex1, &c, &a);
        check(st == GDN_OK, ctx, "single-call gdn_chunk_fwd: %s (%s)", gdn_status_string(st), gdn_last_error());
        free(ws);
        wsb = gdn_chunk_bwd_workspace_size(&ex1, &c);
        ws = t_alloc(wsb);
        gdn_bwd_args b = {q.p, k.p, v.p, has_g ? g.p : NULL, beta.p, fused ? A_log : NULL, fused ? dt_bias : NULL,
                          tc->h0 ? h0 : NULL, saved1, sv_all, dout.p, tc->dht ? dht : NULL, g1[0], g1[1], g1[2],
                          has_g ? g1[3] : NULL, g1[4], fused ? dA1 : NULL, fused ? ddt1 : NULL, dh01, ws, wsb};
        st = gdn_chunk_bwd(&ex1, &c, &b);
        check(st == GDN_OK, ctx, "single-call gdn_chunk_bwd: %s (%s)", gdn_status_string(st), gdn_last_error());
        free(ws);
    }

    /* ---- context parallel over R simulated ranks, with 1 and 2 threads ---- */
    rankview rv[MAXR];
    for (int r = 0; r < R; r++) make_view(tc, gcu, Nglob, r, &rv[r]);
    const size_t mfl = gdn_cp_map_floats(&c);
    check(mfl == (size_t)HV * ((size_t)K * K + (size_t)K * V), ctx, "gdn_cp_map_floats: %zu", mfl);
    void *o_cp[2], *gr_cp[2][5];
    float *ht_cp[2], *dh0_cp[2], dA_cp[2][64], ddt_cp[2][64];
    /* the consistency checks: maps against the regular calls at each cut */
    float *dS_prev = t_alloc(R * sst * 4), *dh0_first = t_alloc(R * sst * 4), *ht_edge = t_alloc(R * sst * 4);
    int ok_all = 1;
    for (int run = 0; run < 2; run++) {
        gdn_exec ex = {GDN_BACKEND_CPU, NULL, run + 1, tc->split};
        o_cp[run] = t_alloc(nv * dsz); t_poison_nan(dt, o_cp[run], nv);
        ht_cp[run] = t_alloc(nst * 4); t_poison_nan(GDN_F32, ht_cp[run], nst);
        dh0_cp[run] = t_alloc(nst * 4); t_poison_nan(GDN_F32, dh0_cp[run], nst);
        const size_t gsizes[5] = {nqk, nqk, nv, ng, ng};
        const gdn_dtype gtypes[5] = {dt, dt, dt, gdt, gdt};
        for (int i = 0; i < 5; i++) {
            gr_cp[run][i] = t_alloc(gsizes[i] * t_dsize(gtypes[i]));
            t_poison_nan(gtypes[i], gr_cp[run][i], gsizes[i]);
        }
        for (int j = 0; j < HV; j++) { dA_cp[run][j] = 0.f; ddt_cp[run][j] = 0.f; }
        float *maps = t_alloc(R * mfl * 4), *bmaps = t_alloc(R * mfl * 4), *fmaps_keep = t_alloc(R * mfl * 4);
        t_poison_nan(GDN_F32, maps, R * mfl);
        t_poison_nan(GDN_F32, bmaps, R * mfl);
        gdn_config lc[MAXR];
        gdn_cp_config cp[MAXR];
        float *lh0[MAXR], *ldht[MAXR];
        void *lsaved[MAXR];
        gdn_status st;
        /* per rank: its local config, inputs at its offset */
#define OFF(ptr, rows, width, sz) ((ptr) ? (void *)((char *)(ptr) + (size_t)(rows) * (width) * (sz)) : NULL)
        for (int r = 0; r < R; r++) {
            memset(&lc[r], 0, sizeof lc[r]);
            lc[r] = c;
            lc[r].T = rv[r].e - rv[r].s;
            if (tc->nseq) { lc[r].cu_seqlens = rv[r].cu; lc[r].num_seqs = rv[r].N; }
            else { lc[r].cu_seqlens = NULL; lc[r].num_seqs = 0; }
            cp[r].rank = r; cp[r].world = R; cp[r].first_continues = rv[r].first; cp[r].last_continues = rv[r].last;
            /* h0 rows of sequences that start here; row 0 of a continuing one comes from the scan */
            lh0[r] = NULL;
            if (tc->h0 || rv[r].first) {
                lh0[r] = t_alloc(rv[r].N * sst * 4);
                for (int64_t i = 0; i < rv[r].N; i++) {
                    if (i == 0 && rv[r].first) t_poison_nan(GDN_F32, lh0[r], sst);
                    else if (tc->h0) memcpy(lh0[r] + i * sst, h0 + (rv[r].n0 + i) * sst, sst * 4);
                }
            }
            ldht[r] = NULL;
            if (tc->dht || rv[r].last) {
                ldht[r] = t_alloc(rv[r].N * sst * 4);
                for (int64_t i = 0; i < rv[r].N; i++)
                    if (tc->dht && !(i == rv[r].N - 1 && rv[r].last)) memcpy(ldht[r] + i * sst, dht + (rv[r].n0 + i) * sst, sst * 4);
            }
        }
#ifdef GDN_HAVE_CUDA
        gdn_config lcd[MAXR];   /* the CUDA twins' configs: cu_seqlens_dev */
        const int twin_on = tw.on && run == 0;
        for (int r = 0; r < R && twin_on; r++) {
            lcd[r] = lc[r];
            tw.cu[r] = tc->nseq ? dput(rv[r].cu, (size_t)(rv[r].N + 1) * sizeof(int64_t)) : NULL;
            lcd[r].cu_seqlens_dev = tw.cu[r];
        }
        void *wb_, *ob_;
#endif
        /* forward, step 1: every rank's map; every other run as gdn_cp_fwd_begin with all of the
         * forward's arguments, whose workspace step 4 (gdn_cp_fwd_finish) takes again */
        const int pair = (int)((idx + run) % 2);
        void *fws[MAXR] = {NULL};
        size_t fwsb[MAXR] = {0};
        float *lht_all[MAXR] = {NULL};
        for (int r = 0; r < R; r++) lsaved[r] = NULL;
        for (int r = 0; r < R && ok_all; r++) {
            const int64_t s = rv[r].s;
            const size_t wsb = pair ? gdn_cp_fwd_workspace_size(&ex, &lc[r], &cp[r]) : gdn_cp_fwd_map_workspace_size(&ex, &lc[r], &cp[r]);
            void *ws = t_alloc(wsb);
            t_poison_nan(GDN_F32, ws, wsb / 4);
            const size_t svb = gdn_chunk_saved_size(&lc[r]);
            if (pair) {
                lsaved[r] = t_alloc(svb);
                lht_all[r] = t_alloc(rv[r].N * sst * 4);
                t_poison_nan(GDN_F32, lht_all[r], rv[r].N * sst);
            }
            gdn_fwd_args a = {OFF(q.p, s, H * K, dsz), OFF(k.p, s, H * K, dsz), OFF(v.p, s, HV * V, dsz),
                              has_g ? OFF(g.p, s, HV, gsz) : NULL, OFF(beta.p, s, HV, gsz), fused ? A_log : NULL,
                              fused ? dt_bias : NULL, lh0[r], pair ? OFF(o_cp[run], s, HV * V, dsz) : NULL, lht_all[r],
                              lsaved[r], pair ? svb : 0, ws, wsb};
            st = pair ? gdn_cp_fwd_begin(&ex, &lc[r], &cp[r], &a, maps + r * mfl) : gdn_cp_fwd_map(&ex, &lc[r], &cp[r], &a, maps + r * mfl);
            ok_all &= check(st == GDN_OK, ctx, "rank %d %s: %s (%s)", r, pair ? "gdn_cp_fwd_begin" : "gdn_cp_fwd_map",
                            gdn_status_string(st), gdn_last_error());
            if (pair) { fws[r] = ws; fwsb[r] = wsb; }
            else free(ws);
#ifdef GDN_HAVE_CUDA
            if (twin_on && st == GDN_OK) {
                const size_t wsd = gdn_cp_fwd_map_workspace_size(&tw.ex, &lcd[r], &cp[r]);
                void *wsp = dnan_at(GDN_F32, wsd / 4 + 1, 0, &wb_);
                float *md = dnan_at(GDN_F32, mfl, 0, &ob_), *h0d = lh0[r] ? dput(lh0[r], rv[r].N * sst * 4) : NULL;
                gdn_fwd_args ad = {OFF(tw.q, s, H * K, dsz), OFF(tw.k, s, H * K, dsz), OFF(tw.v, s, HV * V, dsz),
                                   has_g ? OFF(tw.g, s, HV, gsz) : NULL, OFF(tw.beta, s, HV, gsz), fused ? tw.A_log : NULL,
                                   fused ? tw.dt_bias : NULL, h0d, NULL, NULL, NULL, 0, wsp, wsd};
                if (ran(ctx, gdn_cp_fwd_map(&tw.ex, &lcd[r], &cp[r], &ad, md)))
                    twin_close(ctx, "forward map", r, md, maps + r * mfl, HV, (size_t)K * K, (size_t)K * V,
                               map_bound(2 * bound_fwd(dt), rv[r].e - s));
                cudaFree(wb_);
                /* the same map as the first part of the local forward (its outputs in device scratch) */
                void *od_, *sd_, *wb2_;
                const size_t wsd2 = gdn_cp_fwd_workspace_size(&tw.ex, &lcd[r], &cp[r]), svd = gdn_chunk_saved_size(&lc[r]);
                ad.o = dnan_at(dt, (size_t)(rv[r].e - s) * HV * V, 0, &od_);
                ad.saved = svd ? dnan_at(GDN_F32, svd / 4, 0, &sd_) : NULL;
                if (!svd) sd_ = NULL;
                ad.saved_bytes = svd;
                ad.workspace = dnan_at(GDN_F32, wsd2 / 4 + 1, 0, &wb2_); ad.workspace_bytes = wsd2;
                cudaMemset(md, 0xff, mfl * 4);
                if (ran(ctx, gdn_cp_fwd_begin(&tw.ex, &lcd[r], &cp[r], &ad, md)))
                    twin_close(ctx, "gdn_cp_fwd_begin's map", r, md, maps + r * mfl, HV, (size_t)K * K, (size_t)K * V,
                               map_bound(2 * bound_fwd(dt), rv[r].e - s));
                cudaFree(wb2_); cudaFree(od_); cudaFree(sd_); cudaFree(ob_); cudaFree(h0d);
            }
#endif
        }
        memcpy(fmaps_keep, maps, R * mfl * 4);
        /* steps 2-4: (the gather is the maps array) scan, finish */
        for (int r = 0; r < R && ok_all; r++) {
            const int64_t s = rv[r].s;
            float *Sin = t_alloc(sst * 4);
            t_poison_nan(GDN_F32, Sin, sst);
            /* the scan into a buffer, or straight into h0 row 0 */
            float *dst = rv[r].first && (idx + r) % 2 ? lh0[r] : Sin;
            st = gdn_cp_fwd_scan(&ex, &lc[r], &cp[r], maps, dst);
            ok_all &= check(st == GDN_OK, ctx, "rank %d gdn_cp_fwd_scan: %s (%s)", r, gdn_status_string(st), gdn_last_error());
#ifdef GDN_HAVE_CUDA
            if (twin_on && st == GDN_OK) {
                float *mapsd = dput(maps, R * mfl * 4), *od = dnan_at(GDN_F32, sst, 0, &ob_);
                if (ran(ctx, gdn_cp_fwd_scan(&tw.ex, &lcd[r], &cp[r], mapsd, od)))
                    twin_close(ctx, "forward scan (S_in)", r, od, dst, HV, 0, (size_t)K * V, 1e-5);
                cudaFree(mapsd); cudaFree(ob_);
            }
#endif
            if (rv[r].first && dst == Sin) memcpy(lh0[r], Sin, sst * 4);
            if (r == 0) {
                int zero = 1;
                for (size_t x = 0; x < sst; x++) zero &= Sin[x] == 0.f;
                check(zero, ctx, "rank 0: S_in is not zero");
            }
            free(Sin);
            const size_t svb = gdn_chunk_saved_size(&lc[r]), wsb = pair ? fwsb[r] : gdn_chunk_fwd_workspace_size(&ex, &lc[r]);
            if (!pair) lsaved[r] = t_alloc(svb);
            void *ws = pair ? fws[r] : t_alloc(wsb);
            if (!pair) t_poison_nan(GDN_F32, ws, wsb / 4);
            float *lht = pair ? lht_all[r] : t_alloc(rv[r].N * sst * 4);
            if (!pair) t_poison_nan(GDN_F32, lht, rv[r].N * sst);
            gdn_fwd_args a = {OFF(q.p, s, H * K, dsz), OFF(k.p, s, H * K, dsz), OFF(v.p, s, HV * V, dsz),
                              has_g ? OFF(g.p, s, HV, gsz) : NULL, OFF(beta.p, s, HV, gsz), fused ? A_log : NULL,
                              fused ? dt_bias : NULL, lh0[r], OFF(o_cp[run], s, HV * V, dsz), lht, lsaved[r], svb,
                              ws, wsb};
            st = pair ? gdn_cp_fwd_finish(&ex, &lc[r], &cp[r], &a) : gdn_chunk_fwd(&ex, &lc[r], &a);
            ok_all &= check(st == GDN_OK, ctx, "rank %d %s: %s (%s)", r, pair ? "gdn_cp_fwd_finish" : "gdn_chunk_fwd",
                            gdn_status_string(st), gdn_last_error());
            /* final states of the sequences that end here */
            for (int64_t i = 0; i < rv[r].N; i++)
                if (!(i == rv[r].N - 1 && rv[r].last)) memcpy(ht_cp[run] + (rv[r].n0 + i) * sst, lht + i * sst, sst * 4);
            if (rv[r].last) memcpy(ht_edge + r * sst, lht + (rv[r].N - 1) * sst, sst * 4);
            free(ws); free(lht);
        }
        /* the state rank r+1 got from the scan must be rank r's ht row N-1 (its regular forward) */
        for (int r = 0; r + 1 < R && ok_all; r++) {
            if (!rv[r].last) continue;
            const float *nxt = lh0[r + 1], *mine = ht_edge + r * sst;
            double num = 0, den = 0;
            for (size_t x = 0; x < sst; x++) { num += (nxt[x] - mine[x]) * (double)(nxt[x] - mine[x]); den += (double)mine[x] * mine[x]; }
            const double e = den > 0 ? sqrt(num / den) : sqrt(num);
            check(e <= bound_fwd(dt), ctx, "S_in of rank %d (the maps) vs ht row N-1 of rank %d (its gdn_chunk_fwd): "
                  "rel error %.3e (bound %.0e)", r + 1, r, e, bound_fwd(dt));
        }
        /* backward, step 5: every rank's map (half the cases reuse the forward map's P); every other
         * run as gdn_cp_bwd_begin, whose workspace step 8 (gdn_cp_bwd_finish) takes again */
        void *pws[MAXR] = {NULL};
        size_t pwsb[MAXR] = {0};
        for (int r = 0; r < R && ok_all; r++) {
            const int64_t s = rv[r].s;
            const size_t wsb = pair ? gdn_cp_bwd_workspace_size(&ex, &lc[r], &cp[r]) : gdn_cp_bwd_map_workspace_size(&ex, &lc[r], &cp[r]);
            void *ws = t_alloc(wsb);
            t_poison_nan(GDN_F32, ws, wsb / 4);
            const size_t svb = gdn_chunk_saved_size(&lc[r]);
            gdn_bwd_args b;
            memset(&b, 0, sizeof b);
            b.q = OFF(q.p, s, H * K, dsz); b.k = OFF(k.p, s, H * K, dsz); b.v = OFF(v.p, s, HV * V, dsz);
            b.g = has_g ? OFF(g.p, s, HV, gsz) : NULL; b.beta = OFF(beta.p, s, HV, gsz);
            b.A_log = fused ? A_log : NULL; b.dt_bias = fused ? dt_bias : NULL;
            b.saved = (idx + r) % 3 == 2 && !pair ? NULL : lsaved[r]; b.saved_bytes = svb;
            b.dout = OFF(dout.p, s, HV * V, dsz); b.dht = ldht[r];
            b.workspace = ws; b.workspace_bytes = wsb;
            const float *fm = (idx + r) % 2 ? fmaps_keep + r * mfl : NULL;
            st = pair ? gdn_cp_bwd_begin(&ex, &lc[r], &cp[r], &b, fm, bmaps + r * mfl)
                      : gdn_cp_bwd_map(&ex, &lc[r], &cp[r], &b, fm, bmaps + r * mfl);
            ok_all &= check(st == GDN_OK, ctx, "rank %d %s: %s (%s)", r, pair ? "gdn_cp_bwd_begin" : "gdn_cp_bwd_map",
                            gdn_status_string(st), gdn_last_error());
            if (pair) { pws[r] = ws; pwsb[r] = wsb; }
            else free(ws);
#ifdef GDN_HAVE_CUDA
            if (twin_on && st == GDN_OK) {
                const size_t wsd = gdn_cp_bwd_map_workspace_size(&tw.ex, &lcd[r], &cp[r]);
                void *wsp = dnan_at(GDN_F32, wsd / 4 + 1, 0, &wb_);
                float *bmd = dnan_at(GDN_F32, mfl, 0, &ob_);
                void *svd = b.saved ? dput(b.saved, svb) : NULL;
                float *dhtd = ldht[r] ? dput(ldht[r], rv[r].N * sst * 4) : NULL;
                float *fmd = (idx + r) % 2 ? dput(fmaps_keep + r * mfl, mfl * 4) : NULL;
                gdn_bwd_args bd = b;
                bd.q = OFF(tw.q, s, H * K, dsz); bd.k = OFF(tw.k, s, H * K, dsz); bd.v = OFF(tw.v, s, HV * V, dsz);
                bd.g = has_g ? OFF(tw.g, s, HV, gsz) : NULL; bd.beta = OFF(tw.beta, s, HV, gsz);
                bd.A_log = fused ? tw.A_log : NULL; bd.dt_bias = fused ? tw.dt_bias : NULL;
                bd.saved = svd; bd.dout = OFF(tw.dout, s, HV * V, dsz); bd.dht = dhtd;
                bd.workspace = wsp; bd.workspace_bytes = wsd;
                if (ran(ctx, gdn_cp_bwd_map(&tw.ex, &lcd[r], &cp[r], &bd, fmd, bmd)))
                    twin_close(ctx, fmd ? "backward map (P given)" : "backward map", r, bmd, bmaps + r * mfl, HV, (size_t)K * K,
                               (size_t)K * V, map_bound(2 * bound_grad(dt), rv[r].e - s));
                cudaFree(wb_);
                /* the same map as the first part of the local backward (saved required there) */
                void *svd2 = dput(lsaved[r], svb), *wb2_;
                const size_t wsd2 = gdn_cp_bwd_workspace_size(&tw.ex, &lcd[r], &cp[r]);
                bd.saved = svd2; bd.workspace = dnan_at(GDN_F32, wsd2 / 4 + 1, 0, &wb2_); bd.workspace_bytes = wsd2;
                cudaMemset(bmd, 0xff, mfl * 4);
                if (ran(ctx, gdn_cp_bwd_begin(&tw.ex, &lcd[r], &cp[r], &bd, fmd, bmd)))
                    twin_close(ctx, fmd ? "gdn_cp_bwd_begin's map (P given)" : "gdn_cp_bwd_begin's map", r, bmd, bmaps + r * mfl,
                               HV, (size_t)K * K, (size_t)K * V, map_bound(2 * bound_grad(dt), rv[r].e - s));
                cudaFree(wb2_); cudaFree(svd2); cudaFree(ob_); cudaFree(svd); cudaFree(dhtd); cudaFree(fmd);
            }
#endif
        }
        /* steps 6-8 */
        for (int r = 0; r < R && ok_all; r++) {
            const int64_t s = rv[r].s;
            float *dSo = dS_prev + r * sst;
            t_poison_nan(GDN_F32, dSo, sst);
            st = gdn_cp_bwd_scan(&ex, &lc[r], &cp[r], bmaps, dSo);
            ok_all &= check(st == GDN_OK, ctx, "rank %d gdn_cp_bwd_scan: %s (%s)", r, gdn_status_string(st), gdn_last_error());
#ifdef GDN_HAVE_CUDA
            if (twin_on && st == GDN_OK) {
                float *mapsd = dput(bmaps, R * mfl * 4), *od = dnan_at(GDN_F32, sst, 0, &ob_);
                if (ran(ctx, gdn_cp_bwd_scan(&tw.ex, &lcd[r], &cp[r], mapsd, od)))
                    twin_close(ctx, "backward scan (dS_out)", r, od, dSo, HV, 0, (size_t)K * V, 1e-5);
                cudaFree(mapsd); cudaFree(ob_);
            }
#endif
            if (rv[r].last && !pair)
                for (size_t x = 0; x < sst; x++) ldht[r][(rv[r].N - 1) * sst + x] += dSo[x];
            const size_t svb = gdn_chunk_saved_size(&lc[r]), wsb = pair ? pwsb[r] : gdn_chunk_bwd_workspace_size(&ex, &lc[r]);
            void *ws = pair ? pws[r] : t_alloc(wsb);
            if (!pair) t_poison_nan(GDN_F32, ws, wsb / 4);
            float *ldh0 = t_alloc(rv[r].N * sst * 4), lA[64], lddt[64];
            t_poison_nan(GDN_F32, ldh0, rv[r].N * sst);
            gdn_bwd_args b;
            memset(&b, 0, sizeof b);
            b.q = OFF(q.p, s, H * K, dsz); b.k = OFF(k.p, s, H * K, dsz); b.v = OFF(v.p, s, HV * V, dsz);
            b.g = has_g ? OFF(g.p, s, HV, gsz) : NULL; b.beta = OFF(beta.p, s, HV, gsz);
            b.A_log = fused ? A_log : NULL; b.dt_bias = fused ? dt_bias : NULL; b.h0 = lh0[r];
            b.saved = lsaved[r]; b.saved_bytes = svb; b.dout = OFF(dout.p, s, HV * V, dsz); b.dht = ldht[r];
            b.dq = OFF(gr_cp[run][0], s, H * K, dsz); b.dk = OFF(gr_cp[run][1], s, H * K, dsz);
            b.dv = OFF(gr_cp[run][2], s, HV * V, dsz); b.dg = has_g ? OFF(gr_cp[run][3], s, HV, gsz) : NULL;
            b.dbeta = OFF(gr_cp[run][4], s, HV, gsz); b.dA_log = fused ? lA : NULL; b.ddt_bias = fused ? lddt : NULL;
            b.dh0 = ldh0; b.workspace = ws; b.workspace_bytes = wsb;
            st = pair ? gdn_cp_bwd_finish(&ex, &lc[r], &cp[r], &b, rv[r].last ? dSo : NULL) : gdn_chunk_bwd(&ex, &lc[r], &b);
            ok_all &= check(st == GDN_OK, ctx, "rank %d %s: %s (%s)", r, pair ? "gdn_cp_bwd_finish" : "gdn_chunk_bwd",
                            gdn_status_string(st), gdn_last_error());
            if (fused)
                for (int j = 0; j < HV; j++) { dA_cp[run][j] += lA[j]; ddt_cp[run][j] += lddt[j]; }
            for (int64_t i = 0; i < rv[r].N; i++)
                if (!(i == 0 && rv[r].first)) memcpy(dh0_cp[run] + (rv[r].n0 + i) * sst, ldh0 + i * sst, sst * 4);
            if (rv[r].first) memcpy(dh0_first + r * sst, ldh0, sst * 4);
            free(ws); free(ldh0);
        }
#undef OFF
        /* dh0 row 0 of a continuing rank (the regular backward) = dS_out of the rank before (the maps) */
        for (int r = 1; r < R && ok_all && run == 0; r++) {
            if (!rv[r].first) continue;
            double num = 0, den = 0;
            const float *a = dh0_first + r * sst, *b = dS_prev + (r - 1) * sst;
            for (size_t x = 0; x < sst; x++) { num += (a[x] - b[x]) * (double)(a[x] - b[x]); den += (double)b[x] * b[x]; }
            const double e = den > 0 ? sqrt(num / den) : sqrt(num);
            check(e <= bound_grad(dt), ctx, "rank %d: dh0 row 0 vs dS_out of rank %d (the bwd maps): rel error %.3e (bound %.0e)",
                  r, r - 1, e, bound_grad(dt));
        }
        for (int r = 0; r < R; r++) { free(lh0[r]); free(ldht[r]); free(lsaved[r]); }
#ifdef GDN_HAVE_CUDA
        for (int r = 0; r < R && twin_on; r++) cudaFree(tw.cu[r]);
#endif
        free(maps); free(bmaps); free(fmaps_keep);
    }

    if (ok_all) {
        const double bf = bound_fwd(dt), bg = bound_grad(dt);
        double *as_d = dalloc(nv > nqk ? (nv > nst ? nv : nst) : (nqk > nst ? nqk : nst));
        /* against the reference (the contract), then against the single call */
        check_close_terms(ctx, "o (cp vs ref)", dt, o_cp[0], o_ref, o_t2, nv, bf);
        for (size_t i = 0; i < nv; i++) as_d[i] = t_get(dt, o1, i);
        check_close_terms(ctx, "o (cp vs single call)", dt, o_cp[0], as_d, o_t2, nv, bf);
        if (tc->ht) {
            check_close(ctx, "ht (cp vs ref)", GDN_F32, ht_cp[0], ht_ref, nst, bf);
            for (size_t i = 0; i < nst; i++) as_d[i] = ht1[i];
            check_close(ctx, "ht (cp vs single call)", GDN_F32, ht_cp[0], as_d, nst, bf);
        }
        const char *names[5] = {"dq", "dk", "dv", fused ? "da" : "dg", (f & GDN_BETA_SIGMOID) ? "db" : "dbeta"};
        const double *refs[5] = {dq_ref, dk_ref, dv_ref, dg_ref, db_ref};
        const size_t sizes[5] = {nqk, nqk, nv, ng, ng};
        const gdn_dtype types[5] = {dt, dt, dt, gdt, gdt};
        const double *t2s[5] = {NULL, NULL, NULL, dg_t2, db_t2};   /* dg, dbeta: each token's terms (gdn_ref_bwd_terms) */
        for (int i = 0; i < 5; i++) {
            if (i == 3 && !has_g) continue;
            char what[64];
            snprintf(what, sizeof what, "%s (cp vs ref)", names[i]);
            check_close_terms(ctx, what, types[i], gr_cp[0][i], refs[i], t2s[i], sizes[i], bg);
            for (size_t x = 0; x < sizes[i]; x++) as_d[x] = t_get(types[i], g1[i], x);
            snprintf(what, sizeof what, "%s (cp vs single call)", names[i]);
            check_close_terms(ctx, what, types[i], gr_cp[0][i], as_d, t2s[i], sizes[i], bg);
        }
        if (fused) {
            check_gate_sums(ctx, ng, HV, g.d, dt_biasd, gdt, gr_cp[0][3], dA_cp[0], ddt_cp[0]);
            check_close_terms(ctx, "dA_log (cp, summed over ranks, vs ref)", GDN_F32, dA_cp[0], dA_ref, dA_t2, HV, bg);
            check_close_terms(ctx, "ddt_bias (cp, summed over ranks, vs ref)", GDN_F32, ddt_cp[0], ddt_ref, ddt_t2, HV, bg);
            for (int j = 0; j < HV; j++) as_d[j] = dA1[j];
            check_close_terms(ctx, "dA_log (cp vs single call)", GDN_F32, dA_cp[0], as_d, dA_t2, HV, bg);
        }
        for (int64_t n = 0; n < Nglob; n++) {
            char what[64];
            snprintf(what, sizeof what, "dh0 (sequence %lld, cp vs ref)", (long long)n);
            check_close_terms(ctx, what, GDN_F32, dh0_cp[0] + n * sst, dh0_ref + n * sst, dh0_t2 + n * sst, sst, bg);
            for (size_t x = 0; x < sst; x++) as_d[x] = dh01[n * sst + x];
            snprintf(what, sizeof what, "dh0 (sequence %lld, cp vs single call)", (long long)n);
            check_close_terms(ctx, what, GDN_F32, dh0_cp[0] + n * sst, as_d, dh0_t2 + n * sst, sst, bg);
        }
        /* the bits do not depend on the thread count */
        int same = memcmp(o_cp[0], o_cp[1], nv * dsz) == 0 && memcmp(dh0_cp[0], dh0_cp[1], nst * 4) == 0;
        for (int i = 0; i < 5; i++)
            if (i != 3 || has_g) same &= memcmp(gr_cp[0][i], gr_cp[1][i], sizes[i] * t_dsize(types[i])) == 0;
        if (fused) same &= memcmp(dA_cp[0], dA_cp[1], HV * 4) == 0;
        if (tc->ht) same &= memcmp(ht_cp[0], ht_cp[1], nst * 4) == 0;
        check(same, ctx, "[determinism] o, ht and the gradients differ between threads=1 and threads=2");
        free(as_d);
    }

    for (int run = 0; run < 2; run++) {
        free(o_cp[run]); free(ht_cp[run]); free(dh0_cp[run]);
        for (int i = 0; i < 5; i++) free(gr_cp[run][i]);
    }
    free(dS_prev); free(dh0_first); free(ht_edge);
    free(o1); free(saved1); free(ht1); free(dh01);
    for (int i = 0; i < 5; i++) free(g1[i]);
    tens_free(&q); tens_free(&k); tens_free(&v); tens_free(&dout); tens_free(&g); tens_free(&beta);
#ifdef GDN_HAVE_CUDA
    if (tw.on) {
        cudaFree(tw.q); cudaFree(tw.k); cudaFree(tw.v); cudaFree(tw.dout); cudaFree(tw.g); cudaFree(tw.beta);
        cudaFree(tw.A_log); cudaFree(tw.dt_bias);
    }
#endif
    free(h0); free(dht); free(h0d); free(dhtd);
    free(o_ref); free(o_t2); free(ht_ref);
    free(dq_ref); free(dk_ref); free(dv_ref); free(dg_ref); free(db_ref); free(dh0_ref); free(dh0_t2); free(dg_t2); free(db_t2);
}

/* ---- bad input: status, message, nothing written ---- */

static void bad_input(void) {
    enum { T = 6, H = 2, HV = 4, K = 8, V = 8 };
    const size_t big = 1u << 16;
    float *in = t_alloc(big * 4), *map = t_alloc(big * 4), *maps = t_alloc(big * 4), *ws = t_alloc(big * 4);
    for (size_t i = 0; i < big; i++) in[i] = 0.1f;
    int64_t cu[3] = {0, 2, 6};
    gdn_config c0 = {1, T, H, HV, K, V, cu, NULL, 2, GDN_F32, GDN_F32, 0.f,
                     GDN_QK_L2NORM | GDN_GATE_FUSED | GDN_BETA_SIGMOID};
    gdn_cp_config cp0 = {1, 3, 1, 1};
    gdn_exec ex0 = {GDN_BACKEND_CPU, NULL, 1, 0};
    gdn_fwd_args fa0 = {in, in, in, in, in, in, in, in, NULL, NULL, NULL, 0, ws, big * 4};
    gdn_bwd_args ba0;
    memset(&ba0, 0, sizeof ba0);
    ba0.q = in; ba0.k = in; ba0.v = in; ba0.g = in; ba0.beta = in; ba0.A_log = in; ba0.dt_bias = in;
    ba0.dout = in; ba0.dht = in; ba0.workspace = ws; ba0.workspace_bytes = big * 4;
    const size_t mfl = gdn_cp_map_floats(&c0);
    char ctx[256];
    for (int op = 0; op < 8; op++) {
        static const char *opn[8] = {"cp_fwd_map", "cp_bwd_map", "cp_fwd_scan", "cp_bwd_scan", "cp_bwd_begin", "cp_bwd_finish",
                                     "cp_fwd_begin", "cp_fwd_finish"};
        const int fwd = op == 0 || op >= 6;   /* the calls that take gdn_fwd_args */
        for (int m = 0; m < 17; m++) {
            gdn_config c = c0;
            gdn_cp_config cp = cp0;
            gdn_exec ex = ex0;
            gdn_fwd_args fa = fa0;
            gdn_bwd_args ba = ba0;
            if (op == 5) {   /* gdn_chunk_bwd's arguments: the outputs in the watched buffer */
                ba.dq = ba.dk = ba.dv = ba.dg = ba.dbeta = map;
                ba.dA_log = ba.ddt_bias = ba.dh0 = map;
            }
            if (op == 4 || op == 5) { ba.saved = in; ba.saved_bytes = gdn_chunk_saved_size(&c0); }
            if (op == 7) fa.o = fa.ht = map;   /* gdn_chunk_fwd's outputs in the watched buffer */
            const gdn_config *cfgp = &c;
            const gdn_cp_config *cpp = &cp;
            float *out = map;
            const float *mp = maps;
            unsigned expect;
            const char *what, *must;
            switch (m) {
            case 0: cpp = NULL; expect = 1u << GDN_ERR_NULL; what = "cp NULL"; must = "gdn_cp_config"; break;
            case 1: cp.world = 0; cp.rank = 0; cp.first_continues = cp.last_continues = 0;
                    expect = 1u << GDN_ERR_OPTION; what = "world 0"; must = "world (0)"; break;
            case 2: cp.rank = 3; expect = 1u << GDN_ERR_OPTION; what = "rank 3 of 3"; must = "rank (3)"; break;
            case 3: cp.rank = 0; expect = 1u << GDN_ERR_OPTION; what = "first_continues on rank 0"; must = "first_continues"; break;
            case 4: cp.rank = 2; expect = 1u << GDN_ERR_OPTION; what = "last_continues on the last rank"; must = "last_continues"; break;
            case 5: cp.first_continues = 2; expect = 1u << GDN_ERR_OPTION; what = "first_continues 2"; must = "first_continues (2)"; break;
            case 6: cp.last_continues = -1; expect = 1u << GDN_ERR_OPTION; what = "last_continues -1"; must = "last_continues (-1)"; break;
            case 7: c.cu_seqlens = NULL; c.num_seqs = 0; c.B = 2; c.T = 3;
                    expect = 1u << GDN_ERR_SHAPE; what = "B 2"; must = "B (2)"; break;
            case 8: c.H = 4; c.HV = 6; expect = 1u << GDN_ERR_SHAPE; what = "HV 6, H 4 (a bad gdn_config)"; must = "HV (6)"; break;
            case 9: cfgp = NULL; expect = 1u << GDN_ERR_NULL; what = "cfg NULL"; must = NULL; break;
            case 10: ex.backend = GDN_BACKEND_CUDA;
                     expect = (1u << GDN_ERR_UNSUPPORTED) | (1u << GDN_ERR_BACKEND); what = "CUDA backend"; must = NULL; break;
            case 11: if (op == 7) continue;
                     if (op == 2 || op == 3) { mp = NULL; must = "maps"; }
                     else if (op == 5) { mp = NULL; must = "dS_out"; }
                     else { out = NULL; must = fwd ? "map" : "bmap"; }
                     expect = 1u << GDN_ERR_NULL; what = "maps / map / dS_out NULL"; break;
            case 12: if (op == 2 || op == 3) { out = NULL; must = op == 2 ? "S_in" : "dS_out"; }
                     else if (fwd) { fa.q = NULL; must = "q"; } else { ba.dout = NULL; must = "dout"; }
                     expect = 1u << GDN_ERR_NULL; what = "S_in / dS_out / q / dout NULL"; break;
            case 13: if (op == 0) fa.workspace_bytes = gdn_cp_fwd_map_workspace_size(&ex, &c, &cp) - 1;
                     else if (op == 1) ba.workspace_bytes = gdn_cp_bwd_map_workspace_size(&ex, &c, &cp) - 1;
                     else if (op == 4 || op == 5) ba.workspace_bytes = gdn_cp_bwd_workspace_size(&ex, &c, &cp) - 1;
                     else if (op >= 6) fa.workspace_bytes = gdn_cp_fwd_workspace_size(&ex, &c, &cp) - 1;
                     else continue;
                     expect = 1u << GDN_ERR_WORKSPACE; what = "workspace one byte too small"; must = "workspace_bytes"; break;
            case 14: if (fwd) fa.A_log = NULL; else if (op == 1 || op >= 4) ba.A_log = NULL; else continue;
                     expect = 1u << GDN_ERR_NULL; what = "A_log NULL with GATE_FUSED"; must = "A_log"; break;
            case 15: if (fwd) fa.workspace = NULL; else if (op == 1 || op >= 4) ba.workspace = NULL; else continue;
                     expect = (1u << GDN_ERR_NULL) | (1u << GDN_ERR_WORKSPACE); what = "workspace NULL"; must = "workspace"; break;
            case 16: if (op != 1 && op < 4) continue;
                     if (fwd) { fa.saved = map; fa.saved_bytes = 4; }
                     else { ba.saved = ws; ba.saved_bytes = 4; }
                     expect = 1u << GDN_ERR_WORKSPACE; what = "saved_bytes too small"; must = "saved_bytes"; break;
            default: continue;
            }
            /* with a device: the host cu_seqlens alone (the CUDA calls want cu_seqlens_dev) */
            if (m == 10 && gdn_backend_available(GDN_BACKEND_CUDA)) { expect = 1u << GDN_ERR_NULL; must = "cu_seqlens_dev"; }
            for (size_t i = 0; i < big; i++) ((uint32_t *)map)[i] = 0xA5A5A5A5u;
            gdn_status st;
            switch (op) {
            case 0: st = gdn_cp_fwd_map(&ex, cfgp, cpp, &fa, out); break;
            case 1: st = gdn_cp_bwd_map(&ex, cfgp, cpp, &ba, NULL, out); break;
            case 2: st = gdn_cp_fwd_scan(&ex, cfgp, cpp, mp, out); break;
            case 3: st = gdn_cp_bwd_scan(&ex, cfgp, cpp, mp, out); break;
            case 4: st = gdn_cp_bwd_begin(&ex, cfgp, cpp, &ba, NULL, out); break;
            case 5: st = gdn_cp_bwd_finish(&ex, cfgp, cpp, &ba, mp); break;
            case 6: st = gdn_cp_fwd_begin(&ex, cfgp, cpp, &fa, out); break;
            default: st = gdn_cp_fwd_finish(&ex, cfgp, cpp, &fa); break;
            }
            snprintf(ctx, sizeof ctx, "op=%s backend=cpu bad input: %s", opn[op], what);
            const char *msg = gdn_last_error();
            check(st != GDN_OK && ((expect >> st) & 1u), ctx, "status %s (message \"%s\")", gdn_status_string(st), msg);
            check(msg[0] != 0, ctx, "gdn_last_error() must be non-empty after an error");
            if (must) check(strstr(msg, must) != NULL, ctx, "message \"%s\" must contain \"%s\"", msg, must);
            int untouched = 1;
            for (size_t i = 0; i < big; i++) untouched &= ((uint32_t *)map)[i] == 0xA5A5A5A5u;
            check(untouched, ctx, "no output byte may change");
        }
    }
    /* the size queries answer 0 with a message on a bad cp; a valid call after clears it */
    gdn_cp_config bad = cp0;
    bad.rank = 7;
    check(gdn_cp_fwd_map_workspace_size(&ex0, &c0, &bad) == 0 && gdn_last_error()[0], "op=cp_fwd_map_workspace_size bad input: rank 7",
          "expected 0 and a message, got \"%s\"", gdn_last_error());
    const gdn_status st = gdn_cp_fwd_scan(&ex0, &c0, &cp0, maps, map);
    check(st == GDN_OK && gdn_last_error()[0] == 0, "op=cp_fwd_scan valid call after an error", "status %s, message \"%s\"",
          gdn_status_string(st), gdn_last_error());
    check(mfl == (size_t)HV * (K * K + K * V), "op=cp_map_floats", "%zu", mfl);
    free(in); free(map); free(maps); free(ws);
}

void test_cp(void) {
    const gdn_dtype F = GDN_F32, BF = GDN_BF16, HF = GDN_F16;
    const unsigned ALL = GDN_QK_L2NORM | GDN_GATE_FUSED | GDN_BETA_SIGMOID;
    const unsigned ALL2 = GDN_QK_L2NORM | GDN_BETA_SIGMOID | GDN_BETA_NEGATIVE | GDN_STATE_V_FIRST;
    rng r;
    rng_seed(&r, mix_seed(g_base_seed, 4242));
    const int64_t c1 = rng_int(&r, 60, 200);               /* an uneven cut, random per seed */
    cpcase cs[] = {
        /* one sequence, no cu_seqlens, 2 ranks, uneven */
        {"one-seq-2", 2, 4, 24, 16, 0, {0}, 300, 2, {0, c1, 300}, F, F, ALL, 1, 0, 1, 1, 1, 0},
        /* 3 ranks: the middle one holds the middle of the sequence only, the first one 1 token */
        {"one-seq-3", 1, 2, 16, 24, 0, {0}, 333, 3, {0, 1, 170, 333}, F, F, ALL2, 1, 0, 1, 1, 1, 0},
        /* varlen, a sequence over one cut (with an empty sequence and a 1-token one), bf16 */
        {"varlen-2", 2, 4, 16, 16, 5, {50, 200, 0, 90, 1}, 0, 2, {0, 120, 341}, BF, F, ALL, 1, 0, 1, 1, 1, 0},
        /* varlen, a sequence over two cuts: rank 1 holds its middle only; GVA G = 4 */
        {"varlen-3-middle", 1, 4, 16, 16, 3, {30, 400, 20}, 0, 3, {0, 100, 300, 450}, F, F, ALL, 1, 0, 1, 1, 1, 0},
        /* the same in bf16, v-first, beta 2*sigmoid, gate as g */
        {"varlen-3-bf16", 2, 4, 24, 16, 4, {70, 300, 5, 60}, 0, 3, {0, 150, 260, 435}, BF, BF, ALL2, 1, 0, 0, 1, 1, 0},
        /* cuts on sequence edges (and an empty sequence on one), nothing continues */
        {"edges", 2, 2, 16, 16, 4, {64, 0, 100, 36}, 0, 3, {0, 64, 164, 200}, F, F, ALL, 1, 0, 1, 1, 1, 0},
        /* a rank with no token inside a sequence */
        {"empty-rank", 1, 2, 8, 8, 0, {0}, 200, 3, {0, 90, 90, 200}, F, F, GDN_GATE_FUSED, 1, 0, 1, 1, 1, 0},
        /* long spans cut into segments (seq_split), hard decay, no h0 */
        {"segments", 1, 2, 16, 16, 2, {900, 500}, 0, 2, {0, 1100, 1400}, F, F, ALL, 1, 1, 0, 1, 1, 3},
        {"segments-3", 2, 2, 16, 24, 0, {0}, 1500, 3, {0, 300, 1200, 1500}, F, F, ALL2, 1, 2, 1, 1, 0, 4},
        /* weak decay: the incoming state reaches through whole ranks (P far from 0) */
        {"weak-3", 2, 4, 16, 16, 0, {0}, 400, 3, {0, 150, 280, 400}, F, F, ALL, 1, 2, 1, 1, 1, 0},
        {"weak-varlen-bf16", 1, 2, 24, 16, 3, {20, 500, 60}, 0, 3, {0, 77, 333, 580}, BF, F, ALL2, 1, 2, 1, 1, 1, 0},
        {"weak-segments", 1, 1, 16, 16, 0, {0}, 2100, 3, {0, 500, 1700, 2100}, F, F, ALL, 1, 2, 1, 1, 1, 0},
        /* f16, no decay (g NULL), plain beta, no h0 and no dht */
        {"f16-no-gate", 2, 4, 16, 16, 3, {40, 150, 77}, 0, 3, {0, 70, 201, 267}, HF, F, 0, 0, 0, 0, 1, 0, 0},
        /* f16 with the gate and beta in f16, GVA G = 2, v-first */
        {"f16-gva", 2, 4, 24, 24, 2, {130, 170}, 0, 2, {0, 77, 300}, HF, HF, ALL | GDN_STATE_V_FIRST, 1, 0, 1, 1, 1, 0},
        /* 4 ranks over one sequence with K != V, odd sizes */
        {"four-ranks", 1, 1, 5, 7, 0, {0}, 259, 4, {0, 65, 66, 200, 259}, F, F, GDN_BETA_SIGMOID, 1, 2, 1, 1, 1, 0},
        /* K = 256 in bf16 cut into segments: every fold over K x K maps (src/cuda/fold.cuh) in its two rounds of
         * 128 rows, P and P^T, weak decay so P carries across the segments */
        {"k256-segments", 1, 1, 256, 32, 0, {0}, 700, 2, {0, 330, 700}, BF, F, ALL, 1, 2, 1, 1, 1, 3},
    };
    const int ncase = (int)(sizeof cs / sizeof cs[0]);
    for (int i = 0; i < ncase; i++) {
        if (g_quick && (i == 8 || i == 13)) continue;
        run_case(&cs[i]);
    }
    bad_input();
    printf("  cp: %ld cases\n", n_cases);
}
