/* CPU chunked forward (chunk.h has the math). One task per (sequence, q/k
 * head, segment) covering the head's G value heads, so q, k and their products
 * are formed once per chunk; the chunk work is matrix products (cpu/gemm.c);
 * the only sequential part is the state carried from chunk to chunk. */
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "cpu/chunk.h"
#include "cpu/cpu_backend.h"
#include "cpu/gemm.h"
#include "cpu/load.h"

size_t gdn_chunk_ws_floats(int K, int V) {
    return (size_t)4 * CS + 5 * CS * CS + (size_t)CS * (6 * K + 5 * V) + 64;
}

chunk_ws gdn_chunk_ws_at(float *b, int K, int V) {
    chunk_ws w;
    w.Q = b; b += CS * K;   w.Kc = b; b += CS * K;  w.Bk = b; b += CS * K;  w.Wk = b; b += CS * K;
    w.Qs = b; b += CS * K;  w.Kd = b; b += CS * K;  w.QK = b; b += CS * CS;
    w.Vv = b; b += CS * V;  w.Bv = b; b += CS * V;  w.U = b; b += CS * V;  w.X = b; b += CS * V;
    w.KK = b; b += CS * CS;  w.P = b; b += CS * CS;   w.Tm = b; b += CS * CS;  w.E = b; b += CS * CS;
    w.g = b; b += CS;  w.gc = b; b += CS;  w.gam = b; b += CS;  w.beta = b;
    return w;
}

void gdn_chunk_prepare_qk(const gdn_plan *p, const chunk_in *in, int64_t r0, int c, int h, chunk_ws *w) {
    const int K = p->c.K;
    gdn_cpu_load_qk(p, in->q, r0, c, h, w->Q, in->rstd_q, in->rstd_q_out);
    gdn_cpu_load_qk(p, in->k, r0, c, h, w->Kc, in->rstd_k, in->rstd_k_out);
    gdn_gemm_tri(GDN_TRI_LOWER_C, c, c, K, 1.f, w->Kc, K, 0, w->Kc, K, 1, 0, w->KK, CS);
    gdn_gemm_tri(GDN_TRI_LOWER_C, c, c, K, p->c.scale, w->Q, K, 0, w->Kc, K, 1, 0, w->QK, CS);
}

void gdn_chunk_prepare(const gdn_plan *p, const chunk_in *in, int64_t r0, int c, int j, chunk_ws *w) {
    gdn_chunk_prepare_qk(p, in, r0, c, j / p->G, w);
    gdn_chunk_prepare_head(p, in, r0, c, j, w);
}

void gdn_chunk_prepare_head(const gdn_plan *p, const chunk_in *in, int64_t r0, int c, int j, chunk_ws *w) {
    const int K = p->c.K, V = p->c.V;
    gdn_cpu_load_v(p, in->v, r0, c, j, w->Vv);
    gdn_cpu_load_gate(p, in->g, in->A_log, in->dt_bias, r0, c, j, w->g);
    gdn_cpu_load_beta(p, in->beta, r0, c, j, w->beta);
    /* the gate's chunk cumsum, in double: gc_t - gc_s is a difference of two sums that reach ~-1000
     * under hard decay, where fp32 would leave an absolute error of ~1e-4 in
     * the exponent, i.e. a relative one in every decay factor */
    double gcd[CS], accd = 0;
    for (int t = 0; t < c; t++) { accd += w->g[t]; gcd[t] = accd; w->gc[t] = (float)accd; }
    for (int t = 0; t < c; t++) {
        w->gam[t] = gdn_expf(w->gc[t]);
        float *Et = w->E + t * CS;   /* exp of a positive number is never formed */
        for (int s = 0; s <= t; s++) Et[s] = gdn_expf((float)(gcd[t] - gcd[s]));
    }

    /* P_ts = QK_ts exp(gc_t - gc_s) for s <= t; 0 above the diagonal */
    for (int t = 0; t < c; t++) {
        float *Pt = w->P + t * CS;
        const float *Et = w->E + t * CS, *QKt = w->QK + t * CS;
        for (int s = 0; s <= t; s++) Pt[s] = QKt[s] * Et[s];
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
}

void gdn_chunk_u(const gdn_plan *p, int c, const float *S0, chunk_ws *w) {
    const int K = p->c.K, V = p->c.V;
    /* the residual first, then Tm: U = Tm (Bv - Bk S0). Equal to Wv - Wk S0,
     * but the two large terms cancel before Tm rather than after, which
     * keeps fp32 errors relative to U instead of to Wv and Wk S0 */
    memcpy(w->X, w->Bv, sizeof(float) * c * V);
    gdn_gemm(c, V, K, -1.f, w->Bk, K, 0, S0, V, 0, 1, w->X, V);
    gdn_gemm_tri(GDN_TRI_LOWER_A, c, V, c, 1.f, w->Tm, CS, 0, w->X, V, 0, 0, w->U, V);
}

/* Kd_s = exp(gc_last - gc_s) k_s */
static void decayed_keys(int c, int K, chunk_ws *w) {
    for (int s = 0; s < c; s++) {
        const float e = w->E[(c - 1) * CS + s];
        for (int i = 0; i < K; i++) w->Kd[s * K + i] = e * w->Kc[s * K + i];
    }
}

void gdn_chunk_state_step(const gdn_plan *p, int c, float *S, chunk_ws *w) {
    const int K = p->c.K, V = p->c.V;
    const float dl = w->gam[c - 1];
    for (int64_t x = 0; x < (int64_t)K * V; x++) S[x] *= dl;
    decayed_keys(c, K, w);
    gdn_gemm(K, V, c, 1.f, w->Kd, K, 1, w->U, V, 0, 1, S, V);
}

/* The same step written v-first: S1^T = exp(gc_last) S0^T + U^T Kd, S0^T and
 * S1^T [V,K] (S0 = 0 where S0t is NULL). Each element is the k-first step's
 * sum of the same products in the same order: the same bits. */
static void state_step_vfirst(const gdn_plan *p, int c, const float *S0t, float *S1t, chunk_ws *w) {
    const int K = p->c.K, V = p->c.V;
    const float dl = w->gam[c - 1];
    if (S0t) for (int64_t x = 0; x < (int64_t)K * V; x++) S1t[x] = dl * S0t[x];
    else memset(S1t, 0, sizeof(float) * K * V);
    decayed_keys(c, K, w);
    gdn_gemm(V, K, c, 1.f, w->U, V, 1, w->Kd, K, 0, 1, S1t, K);
}

/* ---- the driver ----
 * Work items are (sequence n, q/k head h, segment). A segment is a run of
 * chunks; normally one per sequence. With few (sequence, head) pairs and long
 * sequences, sequences are cut into segments that run in parallel (DESIGN.md
 * §8): pass 1 gives each segment its map S_out = P S_in + S_loc from a zero
 * state, a scan over segments gives each its true S_in, pass 2 runs the
 * segments again from there and writes o. The cut depends on the shape only,
 * never on the thread count, so the bits do not either. */

#define SPLIT_MIN_ITEMS 2    /* auto: cut sequences only when one item would run alone */
#define SPLIT_MIN_CHUNKS 8   /* auto: but keep segments at least this many chunks long */

int64_t gdn_segment_chunks(const gdn_plan *p, int64_t items) {
    const int64_t nch = gdn_chunks_of(p->max_len), whole = nch > 0 ? nch : 1;
    int64_t want;                                   /* segments per (longest) sequence */
    if (p->seq_split == 1) return whole;
    if (p->seq_split > 1) want = p->seq_split;
    else {
        if (items >= SPLIT_MIN_ITEMS || nch < 2 * SPLIT_MIN_CHUNKS) return whole;
        want = (SPLIT_MIN_ITEMS + items - 1) / items;
    }
    const int64_t sc = (nch + want - 1) / want;
    if (p->seq_split == 0 && sc < SPLIT_MIN_CHUNKS) return SPLIT_MIN_CHUNKS;
    return sc < 1 ? 1 : sc;
}

int64_t gdn_total_segments(const gdn_plan *p, int64_t sc) {
    int64_t total = 0;
    for (int64_t n = 0; n < p->N; n++) {
        int64_t bos, len;
        gdn_seq(p, n, &bos, &len);
        total += gdn_segments_of(len, sc);
    }
    return total;
}

void gdn_segment_index(const gdn_plan *p, int64_t sc, int64_t *seg0) {
    seg0[0] = 0;
    for (int64_t n = 0; n < p->N; n++) {
        int64_t bos, len;
        gdn_seq(p, n, &bos, &len);
        seg0[n + 1] = seg0[n] + gdn_segments_of(len, sc);
    }
}

static size_t per_thread_floats(const gdn_plan *p) {
    return (size_t)(p->G + 1) * p->c.K * p->c.V + (size_t)CS * p->c.V + gdn_chunk_ws_floats(p->c.K, p->c.V);
}

/* split mode: per (segment, j) a K x K map P and a K x V state */
static size_t split_floats(const gdn_plan *p, int64_t sc) {
    if (!gdn_is_split(p, sc)) return 0;
    return (size_t)gdn_total_segments(p, sc) * p->c.HV * ((size_t)p->c.K * p->c.K + (size_t)p->c.K * p->c.V);
}

size_t gdn_cpu_chunk_fwd_ws(const gdn_plan *p) {
    const int64_t sc = gdn_segment_chunks(p, p->N * p->c.H);
    const size_t seg_index = split_floats(p, sc) ? sizeof(int64_t) * (size_t)(p->N + 1) : 0;
    return seg_index + (split_floats(p, sc) + per_thread_floats(p) * (size_t)p->threads) * sizeof(float);
}

/* n floats at x toward the cache, one 64-byte line per prefetch */
static void prefetch_floats(const float *x, size_t n) {
    for (size_t i = 0; i < n; i += 16) __builtin_prefetch(x + i, 0, 3);
}

/* Run tokens [t_from, t_to) of sequence n (rows from bos) for the G value
 * heads of q/k head h, from states S[G][K*V] (updated in place), writing o.
 * q, k rows and their products are loaded and formed once for the group.
 * A span of one chunk may instead read its G states v-first ([V,K],
 * consecutive) from h0t, each transposed into S just before its head runs
 * and fetched ahead (the first during the q/k products, the next during a
 * head: a transposed read waits on memory where a copy streams), and write
 * them to htt as S1^T from the update itself, with no transpose; NULL h0t:
 * S as the caller filled it, NULL htt: S updated in place. */
static void forward_span(const gdn_plan *p, const gdn_fwd_args *a, const chunk_in *in, int64_t bos,
                         int64_t t_from, int64_t t_to, int h, float *S, const float *h0t, float *htt,
                         float *O, chunk_ws *w) {
    const int K = p->c.K, V = p->c.V, HV = p->c.HV, G = p->G;
    const size_t KV = (size_t)K * V;
    for (int64_t t0 = t_from; t0 < t_to; t0 += CS) {
        const int c = t_to - t0 < CS ? (int)(t_to - t0) : CS;
        const int cn = t_to - t0 - CS < CS ? (int)(t_to - t0 - CS) : CS;
        if (h0t) prefetch_floats(h0t, KV);
        gdn_chunk_prepare_qk(p, in, bos + t0, c, h, w);
        if (cn > 0) gdn_cpu_prefetch_chunk(p, a->q, a->k, NULL, NULL, bos + t0 + CS, cn, h, 0);
        for (int j = h * G; j < (h + 1) * G; j++) {
            const size_t off = (j - h * G) * KV;
            float *Sj = S + off;
            if (h0t) {
                if (j + 1 < (h + 1) * G) prefetch_floats(h0t + off + KV, KV);
                gdn_transpose(h0t + off, K, V, K, Sj, V);
            }
            gdn_chunk_prepare_head(p, in, bos + t0, c, j, w);
            if (cn > 0) gdn_cpu_prefetch_chunk(p, NULL, NULL, a->v, a->o, bos + t0 + CS, cn, h, j);
            gdn_chunk_u(p, c, Sj, w);
            /* O = diag(scale exp(gc)) Q S0 + P U */
            for (int t = 0; t < c; t++) {
                const float f = p->c.scale * w->gam[t];
                for (int i = 0; i < K; i++) w->Qs[t * K + i] = f * w->Q[t * K + i];
            }
            gdn_gemm(c, V, K, 1.f, w->Qs, K, 0, Sj, V, 0, 0, O, V);
            gdn_gemm_tri(GDN_TRI_LOWER_A, c, V, c, 1.f, w->P, CS, 0, w->U, V, 0, 1, O, V);
            for (int t = 0; t < c; t++) gdn_store(p->c.dtype, a->o, ((bos + t0 + t) * HV + j) * V, O + t * V, V);
            if (htt) state_step_vfirst(p, c, h0t ? h0t + off : NULL, htt + off, w);
            else gdn_chunk_state_step(p, c, Sj, w);
        }
    }
}

void gdn_segment_scan(const gdn_plan *p, const int64_t *seg0, float *maps, size_t stride, int64_t n, int j,
                      float *S, float *tmp) {
    const int K = p->c.K, V = p->c.V, HV = p->c.HV;
    for (int64_t sg = seg0[n]; sg < seg0[n + 1]; sg++) {
        float *P = maps + (size_t)(sg * HV + j) * stride, *Sl = P + (size_t)K * K;
        const int last = sg + 1 == seg0[n + 1];
        if (!last) {                                   /* S_out = P S_in + S_loc */
            memcpy(tmp, Sl, sizeof(float) * K * V);
            gdn_gemm(K, V, K, 1.f, P, K, 0, S, V, 0, 1, tmp, V);
        }
        memcpy(Sl, S, sizeof(float) * K * V);
        if (!last) memcpy(S, tmp, sizeof(float) * K * V);
    }
}

/* Pass 1 of split mode: the segment's map from a zero state.
 * Per chunk S1 = (exp(gc_last) I - Kd^T Wk) S0 + Kd^T Wv, so
 *   P <- exp(gc_last) P - Kd^T (Wk P),   S_loc <- chunk step of S_loc. */
void gdn_transition_span(const gdn_plan *p, const chunk_in *in, int64_t bos, int64_t t_from,
                         int64_t t_to, int j, float *P, float *S, chunk_ws *w) {
    const int K = p->c.K, V = p->c.V;
    memset(S, 0, sizeof(float) * K * V);
    memset(P, 0, sizeof(float) * K * K);
    for (int i = 0; i < K; i++) P[i * K + i] = 1.f;
    for (int64_t t0 = t_from; t0 < t_to; t0 += CS) {
        const int c = t_to - t0 < CS ? (int)(t_to - t0) : CS;
        gdn_chunk_prepare(p, in, bos + t0, c, j, w);
        gdn_chunk_u(p, c, S, w);
        gdn_gemm(c, K, K, 1.f, w->Wk, K, 0, P, K, 0, 0, w->Bk, K);   /* Bk is free: Wk P */
        gdn_chunk_state_step(p, c, S, w);
        const float dl = w->gam[c - 1];
        for (int64_t x = 0; x < (int64_t)K * K; x++) P[x] *= dl;
        gdn_gemm(K, K, c, -1.f, w->Kd, K, 1, w->Bk, K, 0, 1, P, K);
    }
}

void gdn_cpu_chunk_fwd(const gdn_plan *p, const gdn_fwd_args *a) {
    const int K = p->c.K, V = p->c.V, HV = p->c.HV, H = p->c.H, G = p->G;
    const int64_t sc = gdn_segment_chunks(p, p->N * p->c.H);
    const int split = split_floats(p, sc) > 0;
    gdn_saved_layout sv = gdn_saved_at(&p->c, a->saved);
    if (sv.ckpt_tag) sv.ckpt_tag[0] = sv.ckpt_tag[1] = sv.ckpt_tag[2] = 0;   /* no CUDA checkpoints, maps or tiles in this saved */
    /* workspace: [segment index N+1] [P, S per (segment, j)] [per-thread scratch] */
    int64_t *seg0 = (int64_t *)a->workspace;
    float *maps = (float *)(split ? seg0 + p->N + 1 : seg0);
    float *scratch = maps + split_floats(p, sc);
    int64_t nseg = p->N;
    if (split) {
        gdn_segment_index(p, sc, seg0);
        nseg = seg0[p->N];
    }
    const size_t map_floats = (size_t)K * K + (size_t)K * V;
    #pragma omp parallel num_threads(p->threads)
    {
#ifdef _OPENMP
        const int tid = omp_get_thread_num();
#else
        const int tid = 0;
#endif
        float *S = scratch + per_thread_floats(p) * tid;          /* [G][K*V] */
        float *S2 = S + (size_t)G * K * V, *O = S2 + (size_t)K * V;
        chunk_ws w = gdn_chunk_ws_at(O + CS * V, K, V);
        const unsigned fpmode = gdn_ftz_begin();
        if (split) {
            /* pass 1: every segment but each sequence's last, from zero */
            #pragma omp for schedule(dynamic, 1)
            for (int64_t item = 0; item < nseg * HV; item++) {
                const int64_t sg = item / HV;
                const int j = (int)(item % HV);
                const int64_t n = gdn_segment_seq(p, seg0, sg);
                if (sg == seg0[n + 1] - 1) continue;
                int64_t bos, len;
                gdn_seq(p, n, &bos, &len);
                const int64_t t_from = (sg - seg0[n]) * sc * CS, t_to = t_from + sc * CS;
                chunk_in in = { a->q, a->k, a->v, a->g, a->beta, a->A_log, a->dt_bias, NULL, NULL, NULL, NULL };
                float *P = maps + (size_t)(sg * HV + j) * map_floats;
                gdn_transition_span(p, &in, bos, t_from, t_to, j, P, P + (size_t)K * K, &w);
            }
            /* the scan: slot S of each segment becomes its incoming state */
            #pragma omp for schedule(dynamic, 1)
            for (int64_t pair = 0; pair < p->N * HV; pair++) {
                const int64_t n = pair / HV;
                const int j = (int)(pair % HV);
                gdn_cpu_load_state(p, a->h0, n, j, S);
                gdn_segment_scan(p, seg0, maps, map_floats, n, j, S, S2);
            }
        }
        /* pass 2 (or the only pass): each segment from its incoming state, writing o */
        #pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < nseg * H; item++) {
            const int64_t sg = item / H;
            const int h = (int)(item % H);
            int64_t n = sg, t_from = 0, t_to;
            int64_t bos, len;
            if (split) n = gdn_segment_seq(p, seg0, sg);
            gdn_seq(p, n, &bos, &len);
            t_to = len;
            if (split) {
                t_from = (sg - seg0[n]) * sc * CS;
                if (t_from + sc * CS < len) t_to = t_from + sc * CS;
            }
            /* v-first states of a sequence of one chunk go to and from its loop directly */
            const int direct = (p->c.flags & GDN_STATE_V_FIRST) && !split && len > 0 && len <= CS;
            const size_t group = ((size_t)n * HV + (size_t)h * G) * K * V;
            const float *h0t = direct && a->h0 ? a->h0 + group : NULL;
            float *htt = direct && a->ht ? a->ht + group : NULL;
            for (int j = h * G; j < (h + 1) * G; j++) {
                float *Sj = S + (size_t)(j - h * G) * K * V;
                if (split) memcpy(Sj, maps + (size_t)(sg * HV + j) * map_floats + (size_t)K * K, sizeof(float) * K * V);
                else if (!h0t) gdn_cpu_load_state(p, a->h0, n, j, Sj);
            }
            chunk_in in = { a->q, a->k, a->v, a->g, a->beta, a->A_log, a->dt_bias, NULL, NULL, sv.rstd_q, sv.rstd_k };
            forward_span(p, a, &in, bos, t_from, t_to, h, S, h0t, htt, O, &w);
            if (a->ht && t_to == len && !direct)
                for (int j = h * G; j < (h + 1) * G; j++)
                    gdn_cpu_store_state(p, a->ht, n, j, S + (size_t)(j - h * G) * K * V);
        }
        gdn_ftz_end(fpmode);
    }
}
