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

static int64_t chunks_of(int64_t len) { return (len + CS - 1) / CS; }

static size_t per_thread_floats(const gdn_plan *p) {
    const size_t K = p->c.K, V = p->c.V, L = (size_t)p->max_len;
    return 2 * K * V + (size_t)chunks_of(p->max_len) * K * V + 2 * L * K
         + 3 * CS * V + 6 * CS * K + 5 * CS * CS + 3 * CS + (K > V ? K : V)
         + gdn_chunk_ws_floats(p->c.K, p->c.V);
}

static size_t partials_bytes(const gdn_plan *p) { return sizeof(double) * 2 * (size_t)(p->N * p->c.HV); }

size_t gdn_cpu_chunk_bwd_ws(const gdn_plan *p) {
    return partials_bytes(p) + per_thread_floats(p) * sizeof(float) * (size_t)p->threads;
}

static bwd_ws bwd_ws_at(const gdn_plan *p, float *b) {
    const int K = p->c.K, V = p->c.V;
    bwd_ws s;
    s.S = b; b += K * V;  s.dS = b; b += K * V;
    s.states = b; b += chunks_of(p->max_len) * K * V;
    s.dQacc = b; b += p->max_len * K;  s.dKacc = b; b += p->max_len * K;
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

void gdn_cpu_chunk_bwd(const gdn_plan *p, const gdn_bwd_args *a) {
    const int K = p->c.K, V = p->c.V, HV = p->c.HV, H = p->c.H, G = p->G;
    const int64_t tasks = p->N * H;
    double *part = (double *)a->workspace;     /* [N*HV] dA_log, then [N*HV] ddt_bias */
    float *thread_base = (float *)((char *)a->workspace + partials_bytes(p));
    gdn_saved_layout sv = gdn_saved_at(&p->c, (void *)a->saved);
    #pragma omp parallel num_threads(p->threads)
    {
#ifdef _OPENMP
        const int tid = omp_get_thread_num();
#else
        const int tid = 0;
#endif
        bwd_ws s = bwd_ws_at(p, thread_base + per_thread_floats(p) * tid);
        const unsigned fpmode = gdn_ftz_begin();
        #pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; task++) {
            const int64_t n = task / H;
            const int h = (int)(task % H);
            int64_t bos, len;
            gdn_seq(p, n, &bos, &len);
            memset(s.dQacc, 0, sizeof(float) * len * K);
            memset(s.dKacc, 0, sizeof(float) * len * K);
            chunk_in in = { a->q, a->k, a->v, a->g, a->beta, a->A_log, a->dt_bias, sv.rstd_q, sv.rstd_k, NULL, NULL };
            for (int j = h * G; j < (h + 1) * G; j++) {
                const int64_t nch = chunks_of(len);
                gdn_cpu_load_state(p, a->h0, n, j, s.S);
                for (int64_t ci = 0; ci < nch; ci++) {      /* states entering each chunk */
                    const int c = len - ci * CS < CS ? (int)(len - ci * CS) : CS;
                    memcpy(s.states + ci * K * V, s.S, sizeof(float) * K * V);
                    gdn_chunk_prepare(p, &in, bos + ci * CS, c, j, &s.w);
                    if (ci + 1 < nch)
                        gdn_cpu_prefetch_chunk(p, a->q, a->k, a->v, NULL, bos + (ci + 1) * CS,
                                               len - (ci + 1) * CS < CS ? (int)(len - (ci + 1) * CS) : CS, h, j);
                    gdn_chunk_u(p, c, s.S, &s.w);
                    gdn_chunk_state_step(p, c, s.S, &s.w);
                }
                gdn_cpu_load_state(p, a->dht, n, j, s.dS);
                double dA_log_acc = 0, ddt_acc = 0;
                for (int64_t ci = nch - 1; ci >= 0; ci--) {
                    const int c = len - ci * CS < CS ? (int)(len - ci * CS) : CS;
                    const float *S0 = s.states + ci * K * V;
                    gdn_chunk_prepare(p, &in, bos + ci * CS, c, j, &s.w);
                    if (ci > 0) {   /* the reverse sweep walks backwards: fetch the chunk before */
                        gdn_cpu_prefetch_chunk(p, a->q, a->k, a->v, NULL, bos + (ci - 1) * CS, CS, h, j);
                        gdn_cpu_prefetch_chunk(p, NULL, NULL, a->dout, NULL, bos + (ci - 1) * CS, CS, h, j);
                    }
                    gdn_chunk_u(p, c, S0, &s.w);
                    chunk_backward(p, a, bos + ci * CS, c, j, S0, &s, &dA_log_acc, &ddt_acc);
                    float *dq = s.dQacc + ci * CS * K, *dk = s.dKacc + ci * CS * K;
                    for (int64_t x = 0; x < (int64_t)c * K; x++) { dq[x] += s.dQc[x]; dk[x] += s.dKc[x]; }
                }
                if (a->dh0) gdn_cpu_store_state(p, a->dh0, n, j, s.dS);
                part[n * HV + j] = dA_log_acc;
                part[p->N * HV + n * HV + j] = ddt_acc;
            }
            for (int64_t t = 0; t < len; t++) {
                store_qk_grad(p, a->q, sv.rstd_q, bos + t, h, s.dQacc + t * K, s.row, a->dq);
                store_qk_grad(p, a->k, sv.rstd_k, bos + t, h, s.dKacc + t * K, s.row, a->dk);
            }
        }
        gdn_ftz_end(fpmode);
    }
    if (p->c.flags & GDN_GATE_FUSED) {
        for (int j = 0; j < HV; j++) {
            double sa = 0, sb = 0;
            for (int64_t n = 0; n < p->N; n++) { sa += part[n * HV + j]; sb += part[p->N * HV + n * HV + j]; }
            a->dA_log[j] = (float)sa;
            if (a->ddt_bias) a->ddt_bias[j] = (float)sb;
        }
    }
}
