/* CPU chunked forward (chunk.h has the math). One task per (sequence, value
 * head); the chunk work is matrix products (cpu/gemm.c); the only sequential
 * part is the state carried from chunk to chunk. */
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "cpu/chunk.h"
#include "cpu/gemm.h"
#include "cpu/load.h"

size_t gdn_chunk_ws_floats(int K, int V) {
    return (size_t)4 * CS + 4 * CS * CS + (size_t)CS * (4 * K + 4 * V) + 64;
}

chunk_ws gdn_chunk_ws_at(float *b, int K, int V) {
    chunk_ws w;
    w.Q = b; b += CS * K;   w.Kc = b; b += CS * K;  w.Bk = b; b += CS * K;  w.Wk = b; b += CS * K;
    w.Vv = b; b += CS * V;  w.Bv = b; b += CS * V;  w.Wv = b; b += CS * V;  w.U = w.Wv;   /* U overwrites Wv */
    w.KK = b; b += CS * CS;  w.P = b; b += CS * CS;   w.Tm = b; b += CS * CS;  w.E = b; b += CS * CS;
    w.g = b; b += CS;  w.gc = b; b += CS;  w.gam = b; b += CS;  w.beta = b;
    return w;
}

void gdn_chunk_prepare(const gdn_plan *p, const chunk_in *in, int64_t r0, int c, int j, chunk_ws *w) {
    const int K = p->c.K, V = p->c.V, h = j / p->G;
    const float scale = p->c.scale;
    gdn_cpu_load_qk(p, in->q, r0, c, h, w->Q, in->rstd_q, in->rstd_q_out);
    gdn_cpu_load_qk(p, in->k, r0, c, h, w->Kc, in->rstd_k, in->rstd_k_out);
    gdn_cpu_load_v(p, in->v, r0, c, j, w->Vv);
    gdn_cpu_load_gate(p, in->g, in->A_log, in->dt_bias, r0, c, j, w->g);
    gdn_cpu_load_beta(p, in->beta, r0, c, j, w->beta);
    /* the gate's chunk cumsum */
    float acc = 0.f;
    for (int t = 0; t < c; t++) { acc += w->g[t]; w->gc[t] = acc; }
    for (int t = 0; t < c; t++) {
        w->gam[t] = gdn_expf(w->gc[t]);
        float *Et = w->E + t * CS;   /* exp of a positive number is never formed */
        for (int s = 0; s <= t; s++) Et[s] = gdn_expf(w->gc[t] - w->gc[s]);
    }

    gdn_gemm_tri(GDN_TRI_LOWER_C, c, c, K, 1.f, w->Kc, K, 0, w->Kc, K, 1, 0, w->KK, CS);
    gdn_gemm_tri(GDN_TRI_LOWER_C, c, c, K, scale, w->Q, K, 0, w->Kc, K, 1, 0, w->P, CS);
    /* P_ts *= exp(gc_t - gc_s) for s <= t; 0 above the diagonal */
    for (int t = 0; t < c; t++) {
        float *Pt = w->P + t * CS;
        const float *Et = w->E + t * CS;
        for (int s = 0; s <= t; s++) Pt[s] *= Et[s];
        for (int s = t + 1; s < c; s++) Pt[s] = 0.f;
    }
    /* Tm = (I + A)^-1 by forward substitution: row t of (I + A) Tm = I gives
     * Tm_t = e_t - sum_{s<t} A_ts Tm_s. Rows are whole CS-float vectors held
     * in registers (Tm_s is zero right of column s, so no bounds are needed). */
    enum { NV = CS / GDN_VL };
    for (int t = 0; t < c; t++) {
        gdn_vf acc[NV];
        for (int v = 0; v < NV; v++) acc[v] = (gdn_vf){0};
        for (int s = 0; s < t; s++) {
            const float ats = w->beta[t] * w->E[t * CS + s] * w->KK[t * CS + s];
            const float *Ts = w->Tm + s * CS;
            for (int v = 0; v < NV; v++) {
                gdn_vf x;
                memcpy(&x, Ts + v * GDN_VL, sizeof x);
                acc[v] -= ats * x;
            }
        }
        float *Tt = w->Tm + t * CS;
        memcpy(Tt, acc, sizeof acc);
        Tt[t] = 1.f;
    }
    for (int t = 0; t < c; t++) {
        const float bk = w->beta[t] * w->gam[t], bv = w->beta[t];
        for (int i = 0; i < K; i++) w->Bk[t * K + i] = bk * w->Kc[t * K + i];
        for (int i = 0; i < V; i++) w->Bv[t * V + i] = bv * w->Vv[t * V + i];
    }
    gdn_gemm_tri(GDN_TRI_LOWER_A, c, K, c, 1.f, w->Tm, CS, 0, w->Bk, K, 0, 0, w->Wk, K);
    gdn_gemm_tri(GDN_TRI_LOWER_A, c, V, c, 1.f, w->Tm, CS, 0, w->Bv, V, 0, 0, w->Wv, V);
}

void gdn_chunk_u(const gdn_plan *p, int c, const float *S0, chunk_ws *w) {
    const int K = p->c.K, V = p->c.V;
    gdn_gemm(c, V, K, -1.f, w->Wk, K, 0, S0, V, 0, 1, w->U, V);   /* in place: U is Wv */
}

void gdn_chunk_state_step(const gdn_plan *p, int c, float *S, chunk_ws *w) {
    const int K = p->c.K, V = p->c.V;
    const float dl = w->gam[c - 1];
    for (int64_t x = 0; x < (int64_t)K * V; x++) S[x] *= dl;
    for (int s = 0; s < c; s++) {
        const float e = w->E[(c - 1) * CS + s];   /* exp(gc_last - gc_s) */
        for (int i = 0; i < K; i++) w->Kc[s * K + i] *= e;
    }
    gdn_gemm(K, V, c, 1.f, w->Kc, K, 1, w->U, V, 0, 1, S, V);
}

static size_t per_thread_floats(const gdn_plan *p) {
    return (size_t)p->c.K * p->c.V + (size_t)CS * p->c.V + gdn_chunk_ws_floats(p->c.K, p->c.V);
}

size_t gdn_cpu_chunk_fwd_ws(const gdn_plan *p) {
    return per_thread_floats(p) * sizeof(float) * (size_t)p->threads;
}

void gdn_cpu_chunk_fwd(const gdn_plan *p, const gdn_fwd_args *a) {
    const int K = p->c.K, V = p->c.V, HV = p->c.HV, G = p->G;
    const int64_t tasks = p->N * HV;
    gdn_saved_layout sv = gdn_saved_at(&p->c, a->saved);
    #pragma omp parallel num_threads(p->threads)
    {
#ifdef _OPENMP
        const int tid = omp_get_thread_num();
#else
        const int tid = 0;
#endif
        float *S = (float *)a->workspace + per_thread_floats(p) * tid;
        float *O = S + (size_t)K * V;
        chunk_ws w = gdn_chunk_ws_at(O + CS * V, K, V);
        const unsigned fpmode = gdn_ftz_begin();
        #pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; task++) {
            const int64_t n = task / HV;
            const int j = (int)(task % HV);
            const int first_of_group = j % G == 0;   /* one writer of the shared q/k rstd */
            chunk_in in = { a->q, a->k, a->v, a->g, a->beta, a->A_log, a->dt_bias, NULL, NULL,
                            first_of_group ? sv.rstd_q : NULL, first_of_group ? sv.rstd_k : NULL };
            int64_t bos, len;
            gdn_seq(p, n, &bos, &len);
            gdn_cpu_load_state(p, a->h0, n, j, S);
            for (int64_t t0 = 0; t0 < len; t0 += CS) {
                const int c = len - t0 < CS ? (int)(len - t0) : CS;
                gdn_chunk_prepare(p, &in, bos + t0, c, j, &w);
                if (t0 + CS < len) {
                    const int cn = len - t0 - CS < CS ? (int)(len - t0 - CS) : CS;
                    gdn_cpu_prefetch_chunk(p, a->q, a->k, a->v, a->o, bos + t0 + CS, cn, j / G, j);
                }
                gdn_chunk_u(p, c, S, &w);
                /* O = diag(scale exp(gc)) Q S0 + P U */
                for (int t = 0; t < c; t++) {
                    const float f = p->c.scale * w.gam[t];
                    for (int i = 0; i < K; i++) w.Q[t * K + i] *= f;
                }
                gdn_gemm(c, V, K, 1.f, w.Q, K, 0, S, V, 0, 0, O, V);
                gdn_gemm_tri(GDN_TRI_LOWER_A, c, V, c, 1.f, w.P, CS, 0, w.U, V, 0, 1, O, V);
                for (int t = 0; t < c; t++) gdn_store(p->c.dtype, a->o, ((bos + t0 + t) * HV + j) * V, O + t * V, V);
                gdn_chunk_state_step(p, c, S, &w);
            }
            if (a->ht) gdn_cpu_store_state(p, a->ht, n, j, S);
        }
        gdn_ftz_end(fpmode);
    }
}
