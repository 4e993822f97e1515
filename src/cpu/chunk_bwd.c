/* CPU chunked backward, exact: reverse mode through the chunk step of chunk.h.
 *
 * One task per (sequence n, q/k head h). For each value head j of the group:
 * a forward sweep recomputes the state entering every chunk, then a reverse
 * sweep carries dS (the gradient w.r.t. the state leaving the chunk) back:
 *   dU   = P^T dO + Kd dS                        Kd_s = exp(gc_last - gc_s) k_s
 *   dP   = dO U^T  (s <= t)                       -> dQ += dP~ K, dK += dP~^T Q
 *   dQ  += scale diag(exp(gc)) dO S0^T
 *   dK  += diag(exp(gc_last - gc)) U dS^T
 *   dS0  = scale (diag(exp(gc)) Q)^T dO + exp(gc_last) dS - Wk^T dU
 *   dWk  = -dU S0^T,  dWv = dU
 *   dTm  = dWk Bk^T + dWv Bv^T,  dBk = Tm^T dWk,  dBv = Tm^T dWv
 *   dA   = -Tm^T dTm Tm^T  (s < t)
 * then beta, gc (and so g by a reverse cumsum) and k collect their terms
 * from Bk, Bv, A, P, Kd and the decays. dq, dk are summed over the group's
 * value heads in fp32 in a fixed order, then chained through the l2norm
 * with the saved rstd. dA_log and ddt_bias are reduced per (n, j) in double
 * and then over n in order: the bits never depend on the thread count. */
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "cpu/chunk.h"
#include "cpu/cpu_backend.h"
#include "cpu/gemm.h"
#include "cpu/load.h"

typedef struct bwd_ws {
    float *S, *dS, *states, *dQacc, *dKacc;
    float *dO, *dU, *dBv;                       /* [CS,V] */
    float *X, *dQc, *dKc, *dKd, *dWk, *dBk;     /* [CS,K] */
    float *dP, *dTm, *tmp, *dA, *Rg;            /* [CS,CS] */
    float *dgc, *dbeta, *row;                   /* [CS]   */
    chunk_ws w;
} bwd_ws;

/* chunks per segment and the longest span one task covers */
static int64_t seg_chunks(const gdn_plan *p) { return gdn_segment_chunks(p, p->N * p->c.H); }
static int64_t span_max(const gdn_plan *p) {
    const int64_t s = seg_chunks(p) * CS;
    return s < p->max_len ? s : p->max_len;
}

static size_t per_thread_floats(const gdn_plan *p) {
    const size_t K = p->c.K, V = p->c.V, L = (size_t)span_max(p);
    return 2 * K * V + (size_t)gdn_chunks_of(span_max(p)) * K * V + 2 * L * K
         + 3 * CS * V + 6 * CS * K + 5 * CS * CS + 3 * CS + (K > V ? K : V)
         + gdn_chunk_ws_floats(p->c.K, p->c.V);
}

/* [seg0: N+1 int64][partial dA_log, ddt_bias: 2 x nseg*HV double]
 * [split only: per (segment, j) P (K,K), S_in (K,V), dS_out (K,V)][per thread] */
static int64_t nsegs(const gdn_plan *p) {
    const int64_t sc = seg_chunks(p);
    return gdn_is_split(p, sc) ? gdn_total_segments(p, sc) : p->N;
}
static size_t map_floats(const gdn_plan *p) {
    return (size_t)p->c.K * p->c.K + 2 * (size_t)p->c.K * p->c.V;
}
static size_t head_bytes(const gdn_plan *p) {
    size_t b = sizeof(int64_t) * (size_t)(p->N + 1) + sizeof(double) * 2 * (size_t)(nsegs(p) * p->c.HV);
    if (gdn_is_split(p, seg_chunks(p))) b += sizeof(float) * map_floats(p) * (size_t)(nsegs(p) * p->c.HV);
    return (b + 63) / 64 * 64;
}

size_t gdn_cpu_chunk_bwd_ws(const gdn_plan *p) {
    return head_bytes(p) + per_thread_floats(p) * sizeof(float) * (size_t)p->threads;
}

static bwd_ws bwd_ws_at(const gdn_plan *p, float *b) {
    const int K = p->c.K, V = p->c.V;
    bwd_ws s;
    s.S = b; b += K * V;  s.dS = b; b += K * V;
    s.states = b; b += gdn_chunks_of(span_max(p)) * K * V;
    s.dQacc = b; b += span_max(p) * K;  s.dKacc = b; b += span_max(p) * K;
    s.dO = b; b += CS * V;  s.dU = b; b += CS * V;  s.dBv = b; b += CS * V;
    s.X = b; b += CS * K;  s.dQc = b; b += CS * K;  s.dKc = b; b += CS * K;
    s.dKd = b; b += CS * K;  s.dWk = b; b += CS * K;  s.dBk = b; b += CS * K;
    s.dP = b; b += CS * CS;  s.dTm = b; b += CS * CS;  s.tmp = b; b += CS * CS;  s.dA = b; b += CS * CS;  s.Rg = b; b += CS * CS;
    s.dgc = b; b += CS;  s.dbeta = b; b += CS;  s.row = b; b += (K > V ? K : V);
    s.w = gdn_chunk_ws_at(b, K, V);
    return s;
}

/* Reverse step through one chunk. On entry s->dS is dL/dS1, on exit dL/dS0. */
static void chunk_backward(const gdn_plan *p, const gdn_bwd_args *a, int64_t r0, int c, int j,
                           const float *S0, bwd_ws *s, double *dA_log_acc, double *ddt_acc) {
    const int K = p->c.K, V = p->c.V, HV = p->c.HV;
    const float scale = p->c.scale;
    chunk_ws *w = &s->w;
    const float dlast = w->gam[c - 1];
    for (int t = 0; t < c; t++) gdn_load(p->c.dtype, a->dout, ((r0 + t) * HV + j) * V, s->dO + t * V, V);
    /* Gate gradient terms come in two kinds: dgc_t += x_t from exp(gc_t)
     * factors, and pair terms R_ts (s < t) from exp(gc_t - gc_s), which add
     * R to dgc_t and subtract it from dgc_s. Pairs are kept apart in Rg and
     * summed straight into dg_t = sum_{t' >= t, s < t} R_t's, so an O(1)
     * pair never cancels against itself and buries the tiny dg of a hard
     * decay in rounding. */
    memset(s->dgc, 0, sizeof(float) * CS);
    for (int t = 0; t < c; t++) memset(s->Rg + t * CS, 0, sizeof(float) * c);
    memset(s->dbeta, 0, sizeof(float) * CS);

    /* dKd = U dS^T, and Kd into dWk as scratch: dU = P^T dO + Kd dS */
    gdn_gemm(c, K, V, 1.f, w->U, V, 0, s->dS, V, 1, 0, s->dKd, K);
    for (int t = 0; t < c; t++) {
        const float e = w->E[(c - 1) * CS + t];
        for (int i = 0; i < K; i++) s->dWk[t * K + i] = e * w->Kc[t * K + i];
    }
    gdn_gemm_tri(GDN_TRI_UPPER_A, c, V, c, 1.f, w->P, CS, 1, s->dO, V, 0, 0, s->dU, V);
    gdn_gemm(c, V, K, 1.f, s->dWk, K, 0, s->dS, V, 0, 1, s->dU, V);
    /* S1 = exp(gc_last) S0 + Kd^T U: the gate terms and dK from Kd */
    s->dgc[c - 1] += dlast * gdn_dot(S0, s->dS, K * V);
    for (int t = 0; t < c - 1; t++) {   /* pair (last, t); t = last is no pair */
        const float e = w->E[(c - 1) * CS + t];
        s->Rg[(c - 1) * CS + t] += e * gdn_dot(w->Kc + t * K, s->dKd + t * K, K);
    }

    /* dP = dO U^T on s <= t; P_ts = scale q.k exp(gc_t - gc_s) so the gc terms
     * are dP*P and the q/k terms use dP~ = dP scale exp(gc_t - gc_s) */
    gdn_gemm_tri(GDN_TRI_LOWER_C, c, c, V, 1.f, s->dO, V, 0, w->U, V, 1, 0, s->dP, CS);
    for (int t = 0; t < c; t++) {
        float *dPt = s->dP + t * CS;
        const float *Pt = w->P + t * CS;
        for (int u = 0; u < t; u++) {   /* pairs (t, u); the diagonal is none */
            s->Rg[t * CS + u] += dPt[u] * Pt[u];
            dPt[u] *= scale * w->E[t * CS + u];
        }
        dPt[t] *= scale;
        for (int u = t + 1; u < c; u++) dPt[u] = 0.f;
    }
    /* O's first term scale exp(gc_t) S0^T q_t: X = dO S0^T */
    gdn_gemm(c, K, V, 1.f, s->dO, V, 0, S0, V, 1, 0, s->X, K);
    for (int t = 0; t < c; t++) {
        const float f = scale * w->gam[t];
        s->dgc[t] += f * gdn_dot(w->Q + t * K, s->X + t * K, K);
        for (int i = 0; i < K; i++) s->dQc[t * K + i] = f * s->X[t * K + i];
    }
    gdn_gemm_tri(GDN_TRI_LOWER_A, c, K, c, 1.f, s->dP, CS, 0, w->Kc, K, 0, 1, s->dQc, K);
    gdn_gemm_tri(GDN_TRI_UPPER_A, c, K, c, 1.f, s->dP, CS, 1, w->Q, K, 0, 0, s->dKc, K);
    for (int t = 0; t < c; t++) {
        const float e = w->E[(c - 1) * CS + t];
        for (int i = 0; i < K; i++) s->dKc[t * K + i] += e * s->dKd[t * K + i];
    }

    /* dS0 = exp(gc_last) dS + (diag(scale exp(gc)) Q)^T dO - Wk^T dU  (Q is scaled in place) */
    for (int64_t x = 0; x < (int64_t)K * V; x++) s->dS[x] *= dlast;
    for (int t = 0; t < c; t++) {
        const float f = scale * w->gam[t];
        for (int i = 0; i < K; i++) w->Q[t * K + i] *= f;
    }
    gdn_gemm(K, V, c, 1.f, w->Q, K, 1, s->dO, V, 0, 1, s->dS, V);
    gdn_gemm(K, V, c, -1.f, w->Wk, K, 1, s->dU, V, 0, 1, s->dS, V);

    /* through Wk = Tm Bk, Wv = Tm Bv and Tm = (I + A)^-1 */
    gdn_gemm(c, K, V, -1.f, s->dU, V, 0, S0, V, 1, 0, s->dWk, K);
    /* Tm is unit lower triangular whatever A is, so only the strictly lower
     * part of dTm reaches dA (the rest is zeroed, not left as garbage) */
    gdn_gemm_tri(GDN_TRI_LOWER_C, c, c, K, 1.f, s->dWk, K, 0, w->Bk, K, 1, 0, s->dTm, CS);
    gdn_gemm_tri(GDN_TRI_LOWER_C, c, c, V, 1.f, s->dU, V, 0, w->Bv, V, 1, 1, s->dTm, CS);
    for (int t = 0; t < c; t++) memset(s->dTm + t * CS + t, 0, sizeof(float) * (c - t));
    gdn_gemm_tri(GDN_TRI_UPPER_A, c, K, c, 1.f, w->Tm, CS, 1, s->dWk, K, 0, 0, s->dBk, K);
    gdn_gemm_tri(GDN_TRI_UPPER_A, c, V, c, 1.f, w->Tm, CS, 1, s->dU, V, 0, 0, s->dBv, V);
    gdn_gemm_tri(GDN_TRI_LOWER_A, c, c, c, 1.f, s->dTm, CS, 0, w->Tm, CS, 1, 0, s->tmp, CS);
    gdn_gemm_tri(GDN_TRI_UPPER_A | GDN_TRI_LOWER_C, c, c, c, -1.f, w->Tm, CS, 1, s->tmp, CS, 0, 0, s->dA, CS);

    /* Bk = diag(beta exp(gc)) K, Bv = diag(beta) V */
    for (int t = 0; t < c; t++) {
        const float bk = w->beta[t] * w->gam[t];
        const float kd = gdn_dot(s->dBk + t * K, w->Kc + t * K, K);
        s->dbeta[t] += gdn_dot(s->dBv + t * V, w->Vv + t * V, V) + w->gam[t] * kd;
        s->dgc[t] += bk * kd;
        for (int i = 0; i < K; i++) s->dKc[t * K + i] += bk * s->dBk[t * K + i];
        for (int i = 0; i < V; i++) s->row[i] = w->beta[t] * s->dBv[t * V + i];
        gdn_store(p->c.dtype, a->dv, ((r0 + t) * HV + j) * V, s->row, V);
    }
    /* A_ts = beta_t exp(gc_t - gc_s) KK_ts on s < t; dA becomes dKK in place */
    for (int t = 0; t < c; t++) {
        float *dAt = s->dA + t * CS;
        for (int u = 0; u < t; u++) {
            const float e = w->E[t * CS + u];
            const float E = dAt[u] * e;
            s->dbeta[t] += E * w->KK[t * CS + u];
            s->Rg[t * CS + u] += E * w->beta[t] * w->KK[t * CS + u];   /* dA_ts * A_ts */
            dAt[u] = w->beta[t] * E;
        }
        for (int u = t; u < c; u++) dAt[u] = 0.f;
    }
    gdn_gemm_tri(GDN_TRI_LOWER_A, c, K, c, 1.f, s->dA, CS, 0, w->Kc, K, 0, 1, s->dKc, K);
    gdn_gemm_tri(GDN_TRI_UPPER_A, c, K, c, 1.f, s->dA, CS, 1, w->Kc, K, 0, 1, s->dKc, K);

    /* dg = reverse cumsum of dgc; then through the fused gate */
    if (a->g) {
        const unsigned f = p->c.flags;
        /* dg_t = sum_{t'>=t} x_t' + sum_{t'>=t} sum_{s<t} R_t's, in double */
        double colsum[CS] = {0}, acc = 0;
        for (int t = c - 1; t >= 0; t--) {
            double pre = 0;                  /* row t: prefix sums over s into colsum */
            const float *Rt = s->Rg + t * CS;
            for (int u = 0; u <= t; u++) { colsum[u] += pre; pre += Rt[u]; }
            acc += s->dgc[t];
            s->row[t] = (float)(acc + colsum[t]);
        }
        if (f & GDN_GATE_FUSED) {
            const float A = -expf(a->A_log[j]), bias = a->dt_bias ? a->dt_bias[j] : 0.f;
            for (int t = 0; t < c; t++) {
                float x;
                gdn_load(p->c.gate_dtype, a->g, (r0 + t) * HV + j, &x, 1);
                x += bias;
                const float dg = s->row[t];
                *dA_log_acc += (double)dg * (double)w->g[t];
                s->row[t] = dg * A * (x > 20.f ? 1.f : gdn_sigmoid(x));
                *ddt_acc += s->row[t];
            }
        }
        gdn_store_strided(p->c.gate_dtype, a->dg, r0 * HV + j, HV, s->row, c);
    }
    if (p->c.flags & GDN_BETA_SIGMOID) {
        const float m = (p->c.flags & GDN_BETA_NEGATIVE) ? 2.f : 1.f;
        for (int t = 0; t < c; t++) {
            float b;
            gdn_load(p->c.gate_dtype, a->beta, (r0 + t) * HV + j, &b, 1);
            const float sg = gdn_sigmoid(b);
            s->dbeta[t] *= m * sg * (1.f - sg);
        }
    }
    gdn_store_strided(p->c.gate_dtype, a->dbeta, r0 * HV + j, HV, s->dbeta, c);
}

/* dx = r (dx^ - x^ (x^ . dx^)) with x^ = x r, then store */
static void store_qk_grad(const gdn_plan *p, const void *x, const float *rstd, int64_t r, int h,
                          float *g, float *tmp, void *dst) {
    const int K = p->c.K;
    const int64_t off = (r * p->c.H + h) * K;
    if (p->c.flags & GDN_QK_L2NORM) {
        const float rs = rstd[r * p->c.H + h];
        gdn_load(p->c.dtype, x, off, tmp, K);
        for (int i = 0; i < K; i++) tmp[i] *= rs;
        const float d = gdn_dot(tmp, g, K);
        for (int i = 0; i < K; i++) g[i] = rs * (g[i] - tmp[i] * d);
    }
    gdn_store(p->c.dtype, dst, off, g, K);
}

/* dS_in of tokens [t_from, t_to) from dS_out (in dS on entry): the span's own
 * outputs' part of the state gradient plus dS_out carried back. Per chunk, reversed:
 *   dS0 = exp(gc_last) dS1 + scale (diag(exp(gc)) Q)^T dO - Wk^T (P^T dO + Kd dS1)
 * needs no state: o is linear in S0 with coefficients of the chunk alone.
 * dO, dU: [CS,V]; Kd: [CS,K] scratch. */
static void dstate_core(const gdn_plan *p, const void *dout, const chunk_in *in, int64_t bos,
                        int64_t t_from, int64_t t_to, int j, float *dS, float *dO, float *dU, float *Kd,
                        chunk_ws *w) {
    const int K = p->c.K, V = p->c.V, HV = p->c.HV;
    const int64_t nch = gdn_chunks_of(t_to - t_from);
    for (int64_t ci = nch - 1; ci >= 0; ci--) {
        const int64_t t0 = t_from + ci * CS;
        const int c = t_to - t0 < CS ? (int)(t_to - t0) : CS;
        gdn_chunk_prepare(p, in, bos + t0, c, j, w);
        for (int t = 0; t < c; t++) gdn_load(p->c.dtype, dout, ((bos + t0 + t) * HV + j) * V, dO + t * V, V);
        for (int t = 0; t < c; t++) {          /* Kd, then dU */
            const float e = w->E[(c - 1) * CS + t];
            for (int i = 0; i < K; i++) Kd[t * K + i] = e * w->Kc[t * K + i];
        }
        gdn_gemm_tri(GDN_TRI_UPPER_A, c, V, c, 1.f, w->P, CS, 1, dO, V, 0, 0, dU, V);
        gdn_gemm(c, V, K, 1.f, Kd, K, 0, dS, V, 0, 1, dU, V);
        const float dlast = w->gam[c - 1];
        for (int64_t x = 0; x < (int64_t)K * V; x++) dS[x] *= dlast;
        for (int t = 0; t < c; t++) {
            const float f = p->c.scale * w->gam[t];
            for (int i = 0; i < K; i++) w->Q[t * K + i] *= f;
        }
        gdn_gemm(K, V, c, 1.f, w->Q, K, 1, dO, V, 0, 1, dS, V);
        gdn_gemm(K, V, c, -1.f, w->Wk, K, 1, dU, V, 0, 1, dS, V);
    }
}

/* from dS_out = 0, into s->dS */
static void dstate_span(const gdn_plan *p, const gdn_bwd_args *a, const chunk_in *in, int64_t bos,
                        int64_t t_from, int64_t t_to, int j, bwd_ws *s) {
    memset(s->dS, 0, sizeof(float) * p->c.K * p->c.V);
    dstate_core(p, a->dout, in, bos, t_from, t_to, j, s->dS, s->dO, s->dU, s->dWk, &s->w);
}

size_t gdn_dstate_scratch_floats(int K, int V) {
    return (size_t)2 * CS * V + (size_t)CS * K + gdn_chunk_ws_floats(K, V);
}

void gdn_dstate_span(const gdn_plan *p, const void *dout, const chunk_in *in, int64_t bos, int64_t t_from,
                     int64_t t_to, int j, float *dS, float *scratch) {
    const int K = p->c.K, V = p->c.V;
    chunk_ws w = gdn_chunk_ws_at(scratch + (size_t)2 * CS * V + (size_t)CS * K, K, V);
    dstate_core(p, dout, in, bos, t_from, t_to, j, dS, scratch, scratch + (size_t)CS * V,
                scratch + (size_t)2 * CS * V, &w);
}

/* The reverse sweep of value head j over tokens [t_from, t_to) of a sequence:
 * states entering each chunk from s->S, then dS carried back from s->dS
 * (on exit dL/dS at t_from). dq, dk add into s->dQacc / dKacc (span rows). */
static void backward_span(const gdn_plan *p, const gdn_bwd_args *a, const chunk_in *in, int64_t bos,
                          int64_t t_from, int64_t t_to, int h, int j, bwd_ws *s,
                          double *dA_log_acc, double *ddt_acc) {
    const int K = p->c.K, V = p->c.V;
    const int64_t nch = gdn_chunks_of(t_to - t_from);
    for (int64_t ci = 0; ci < nch; ci++) {      /* states entering each chunk */
        const int64_t t0 = t_from + ci * CS;
        const int c = t_to - t0 < CS ? (int)(t_to - t0) : CS;
        memcpy(s->states + ci * K * V, s->S, sizeof(float) * K * V);
        gdn_chunk_prepare(p, in, bos + t0, c, j, &s->w);
        if (ci + 1 < nch)
            gdn_cpu_prefetch_chunk(p, a->q, a->k, a->v, NULL, bos + t0 + CS,
                                   t_to - t0 - CS < CS ? (int)(t_to - t0 - CS) : CS, h, j);
        gdn_chunk_u(p, c, s->S, &s->w);
        gdn_chunk_state_step(p, c, s->S, &s->w);
    }
    for (int64_t ci = nch - 1; ci >= 0; ci--) {
        const int64_t t0 = t_from + ci * CS;
        const int c = t_to - t0 < CS ? (int)(t_to - t0) : CS;
        const float *S0 = s->states + ci * K * V;
        gdn_chunk_prepare(p, in, bos + t0, c, j, &s->w);
        if (ci > 0) {   /* the reverse sweep walks backwards: fetch the chunk before */
            gdn_cpu_prefetch_chunk(p, a->q, a->k, a->v, NULL, bos + t0 - CS, CS, h, j);
            gdn_cpu_prefetch_chunk(p, NULL, NULL, a->dout, NULL, bos + t0 - CS, CS, h, j);
        }
        gdn_chunk_u(p, c, S0, &s->w);
        chunk_backward(p, a, bos + t0, c, j, S0, s, dA_log_acc, ddt_acc);
        float *dq = s->dQacc + ci * CS * K, *dk = s->dKacc + ci * CS * K;
        for (int64_t x = 0; x < (int64_t)c * K; x++) { dq[x] += s->dQc[x]; dk[x] += s->dKc[x]; }
    }
}

/* Work items are (sequence n, q/k head h, segment): a segment's value heads
 * run in one item so dq, dk sum over the group in a fixed order. With long
 * sequences and few items, sequences are cut (DESIGN.md §8): pass A gives each
 * (segment, j) its forward map (P, S_loc), a scan gives each its S_in; pass B
 * gives each its own dS_in from zero, a reverse scan with P^T gives each its
 * dS_out; then every segment runs its reverse sweep in parallel. */
void gdn_cpu_chunk_bwd(const gdn_plan *p, const gdn_bwd_args *a) {
    const int K = p->c.K, V = p->c.V, HV = p->c.HV, H = p->c.H, G = p->G;
    const int64_t sc = seg_chunks(p);
    const int split = gdn_is_split(p, sc);
    const int64_t nseg = nsegs(p);
    int64_t *seg0 = (int64_t *)a->workspace;
    double *part = (double *)(seg0 + p->N + 1);     /* [nseg*HV] dA_log, then [nseg*HV] ddt_bias */
    float *maps = (float *)(part + 2 * nseg * HV);  /* split: [nseg*HV] of P, S_in, dS_out */
    float *thread_base = (float *)((char *)a->workspace + head_bytes(p));
    const size_t mf = map_floats(p);
    gdn_saved_layout sv = gdn_saved_at(&p->c, (void *)a->saved);
    const chunk_in in = { a->q, a->k, a->v, a->g, a->beta, a->A_log, a->dt_bias, sv.rstd_q, sv.rstd_k, NULL, NULL };
    if (split) gdn_segment_index(p, sc, seg0);
    else for (int64_t n = 0; n <= p->N; n++) seg0[n] = n;
    #pragma omp parallel num_threads(p->threads)
    {
#ifdef _OPENMP
        const int tid = omp_get_thread_num();
#else
        const int tid = 0;
#endif
        bwd_ws s = bwd_ws_at(p, thread_base + per_thread_floats(p) * tid);
        const unsigned fpmode = gdn_ftz_begin();
        if (split) {
            /* pass A: forward maps (P into slot P, S_loc into slot S_in); pass B: local dS_in */
            #pragma omp for schedule(dynamic, 1)
            for (int64_t item = 0; item < nseg * HV; item++) {
                const int64_t sg = item / HV;
                const int j = (int)(item % HV);
                const int64_t n = gdn_segment_seq(p, seg0, sg);
                if (seg0[n + 1] - seg0[n] == 1) continue;
                int64_t bos, len;
                gdn_seq(p, n, &bos, &len);
                const int64_t t_from = (sg - seg0[n]) * sc * CS;
                const int64_t t_to = t_from + sc * CS < len ? t_from + sc * CS : len;
                float *m = maps + (size_t)(sg * HV + j) * mf;
                gdn_transition_span(p, &in, bos, t_from, t_to, j, m, m + (size_t)K * K, &s.w);
                dstate_span(p, a, &in, bos, t_from, t_to, j, &s);
                memcpy(m + (size_t)K * K + (size_t)K * V, s.dS, sizeof(float) * K * V);
            }
            /* the scans, per (n, j): S_in forward, dS_out backward */
            #pragma omp for schedule(dynamic, 1)
            for (int64_t pair = 0; pair < p->N * HV; pair++) {
                const int64_t n = pair / HV;
                const int j = (int)(pair % HV);
                gdn_cpu_load_state(p, a->h0, n, j, s.S);
                gdn_segment_scan(p, seg0, maps, mf, n, j, s.S, s.dS);
                gdn_cpu_load_state(p, a->dht, n, j, s.S);                           /* dS_out of the last */
                for (int64_t sg = seg0[n + 1] - 1; sg >= seg0[n]; sg--) {
                    float *m = maps + (size_t)(sg * HV + j) * mf, *dSo = m + (size_t)K * K + (size_t)K * V;
                    memcpy(s.dS, dSo, sizeof(float) * K * V);                       /* local dS_in */
                    memcpy(dSo, s.S, sizeof(float) * K * V);
                    if (sg > seg0[n]) {                                             /* dS_in = P^T dS_out + local */
                        gdn_gemm(K, V, K, 1.f, m, K, 1, s.S, V, 0, 1, s.dS, V);
                        memcpy(s.S, s.dS, sizeof(float) * K * V);
                    }
                }
            }
        }
        #pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < nseg * H; item++) {
            const int64_t sg = item / H;
            const int h = (int)(item % H);
            const int64_t n = gdn_segment_seq(p, seg0, sg);
            int64_t bos, len;
            gdn_seq(p, n, &bos, &len);
            int64_t t_from = 0, t_to = len;
            if (split) {
                t_from = (sg - seg0[n]) * sc * CS;
                if (t_from + sc * CS < len) t_to = t_from + sc * CS;
            }
            memset(s.dQacc, 0, sizeof(float) * (t_to - t_from) * K);
            memset(s.dKacc, 0, sizeof(float) * (t_to - t_from) * K);
            for (int j = h * G; j < (h + 1) * G; j++) {
                const float *m = maps + (size_t)(sg * HV + j) * mf;
                if (split && seg0[n + 1] - seg0[n] > 1) {
                    memcpy(s.S, m + (size_t)K * K, sizeof(float) * K * V);
                    memcpy(s.dS, m + (size_t)K * K + (size_t)K * V, sizeof(float) * K * V);
                } else {
                    gdn_cpu_load_state(p, a->h0, n, j, s.S);
                    gdn_cpu_load_state(p, a->dht, n, j, s.dS);
                }
                double dA_log_acc = 0, ddt_acc = 0;
                backward_span(p, a, &in, bos, t_from, t_to, h, j, &s, &dA_log_acc, &ddt_acc);
                if (a->dh0 && t_from == 0) gdn_cpu_store_state(p, a->dh0, n, j, s.dS);
                part[sg * HV + j] = dA_log_acc;
                part[nseg * HV + sg * HV + j] = ddt_acc;
            }
            for (int64_t t = t_from; t < t_to; t++) {
                store_qk_grad(p, a->q, sv.rstd_q, bos + t, h, s.dQacc + (t - t_from) * K, s.row, a->dq);
                store_qk_grad(p, a->k, sv.rstd_k, bos + t, h, s.dKacc + (t - t_from) * K, s.row, a->dk);
            }
        }
        gdn_ftz_end(fpmode);
    }
    if (p->c.flags & GDN_GATE_FUSED) {      /* over segments in order: fixed bits */
        for (int j = 0; j < HV; j++) {
            double sa = 0, sb = 0;
            for (int64_t sg = 0; sg < nseg; sg++) { sa += part[sg * HV + j]; sb += part[nseg * HV + sg * HV + j]; }
            a->dA_log[j] = (float)sa;
            if (a->ddt_bias) a->ddt_bias[j] = (float)sb;
        }
    }
}
