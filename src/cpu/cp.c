/* Context parallel on the CPU backend (include/gdn.h has the contract,
 * DESIGN.md §8 the math). A rank's maps are the segment maps of the chunk
 * path (chunk.h) over the one local sequence that crosses its edge:
 *   forward:  the last local sequence's span, gdn_transition_span (P, S_loc),
 *             or, where the chain restarts, a state-only run from its h0;
 *   backward: local sequence 0's span, gdn_dstate_span (dS_in from dS_out,
 *             no state needed) and its P when it also crosses the far edge.
 * A long span is cut into segments as gdn_chunk_fwd cuts a sequence
 * (gdn_segment_chunks: shape and seq_split only, never the thread count);
 * the segments run in parallel and are then composed per value head in a
 * fixed order. The scans fold the gathered maps in place in the output,
 * a block of columns at a time, in fp32. */
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "cpu/cp.h"
#include "cpu/gemm.h"
#include "cpu/load.h"

static size_t map_floats(const gdn_plan *p) { return (size_t)p->c.K * p->c.K + (size_t)p->c.K * p->c.V; }
static int kv_max(const gdn_plan *p) { return p->c.K > p->c.V ? p->c.K : p->c.V; }

/* The local sequence whose span makes the map: the last one forward, the first backward. */
static int64_t edge_seq(const gdn_plan *p, int backward) { return backward ? 0 : p->N - 1; }

/* chunks per segment of a span of len tokens, with the HV value heads as the
 * parallel items without a cut (as gdn_chunk_fwd decides for a sequence) */
static int64_t span_seg_chunks(const gdn_plan *p, int64_t len) {
    gdn_plan q = *p;
    q.N = 1;
    q.max_len = len;
    return gdn_segment_chunks(&q, p->c.HV);
}

/* segments of the edge span, 0 when the map is zero (nothing to compute) */
static int64_t edge_segments(const gdn_plan *p, const gdn_cp_config *cp, int backward, int64_t *sc) {
    if (backward ? !cp->first_continues : !cp->last_continues) return 0;
    int64_t bos, len;
    gdn_seq(p, edge_seq(p, backward), &bos, &len);
    *sc = span_seg_chunks(p, len);
    return gdn_segments_of(len, *sc);
}

static size_t fwd_thread_floats(const gdn_plan *p) {
    return gdn_chunk_ws_floats(p->c.K, p->c.V) + (size_t)p->c.K * kv_max(p);
}
static size_t bwd_thread_floats(const gdn_plan *p) {
    return gdn_dstate_scratch_floats(p->c.K, p->c.V) + gdn_chunk_ws_floats(p->c.K, p->c.V)
         + (size_t)p->c.K * p->c.V + (size_t)p->c.K * kv_max(p);
}

size_t gdn_cpu_cp_fwd_map_ws(const gdn_plan *p, const gdn_cp_config *cp) {
    int64_t sc = 0;
    const int64_t nseg = edge_segments(p, cp, 0, &sc);
    if (nseg == 0) return 0;
    const size_t seg = nseg > 1 ? (size_t)nseg * p->c.HV * map_floats(p) : 0;
    return (seg + fwd_thread_floats(p) * (size_t)p->threads) * sizeof(float);
}

size_t gdn_cpu_cp_bwd_map_ws(const gdn_plan *p, const gdn_cp_config *cp) {
    int64_t sc = 0;
    const int64_t nseg = edge_segments(p, cp, 1, &sc);
    if (nseg == 0) return 0;
    const size_t seg = nseg > 1 ? (size_t)nseg * p->c.HV * map_floats(p) : 0;
    return (seg + bwd_thread_floats(p) * (size_t)p->threads) * sizeof(float);
}

static int thread_id(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* The state through tokens [t_from, t_to) of a sequence, in place (the chunk
 * step of the forward without its output rows). */
static void state_span(const gdn_plan *p, const chunk_in *in, int64_t bos, int64_t t_from, int64_t t_to, int j,
                       float *S, chunk_ws *w) {
    for (int64_t t0 = t_from; t0 < t_to; t0 += CS) {
        const int c = t_to - t0 < CS ? (int)(t_to - t0) : CS;
        gdn_chunk_prepare(p, in, bos + t0, c, j, w);
        gdn_chunk_u(p, c, S, w);
        gdn_chunk_state_step(p, c, S, w);
    }
}

/* X <- A X (ta = 0) or A^T X (ta = 1), X [K, n] row-major, through tmp [K, n] */
static void left_mul(const gdn_plan *p, const float *A, int ta, float *X, int n, float *tmp) {
    const int K = p->c.K;
    gdn_gemm(K, n, K, 1.f, A, K, ta, X, n, 0, 0, tmp, n);
    memcpy(X, tmp, sizeof(float) * (size_t)K * n);
}

void gdn_cpu_cp_fwd_map(const gdn_plan *p, const gdn_cp_config *cp, const gdn_fwd_args *a, float *map) {
    const int K = p->c.K, V = p->c.V, HV = p->c.HV;
    const size_t mf = map_floats(p);
    int64_t sc = 1;
    const int64_t nseg = edge_segments(p, cp, 0, &sc);
    if (nseg == 0) {                        /* nothing goes on to the next rank */
        memset(map, 0, sizeof(float) * mf * HV);
        return;
    }
    const int64_t n = edge_seq(p, 0);
    int64_t bos, len;
    gdn_seq(p, n, &bos, &len);
    /* P is wanted only when the sequence also came from the previous rank;
     * else the chain restarts here, from the sequence's own h0 */
    const int need_P = p->N == 1 && cp->first_continues;
    float *segmaps = (float *)a->workspace;
    float *scratch = segmaps + (nseg > 1 ? (size_t)nseg * HV * mf : 0);
    const chunk_in in = { a->q, a->k, a->v, a->g, a->beta, a->A_log, a->dt_bias, NULL, NULL, NULL, NULL };
    #pragma omp parallel num_threads(p->threads)
    {
        float *mine = scratch + fwd_thread_floats(p) * (size_t)thread_id();
        chunk_ws w = gdn_chunk_ws_at(mine, K, V);
        float *tmp = mine + gdn_chunk_ws_floats(K, V);
        const unsigned fpmode = gdn_ftz_begin();
        #pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < nseg * HV; item++) {
            const int64_t sg = item / HV;
            const int j = (int)(item % HV);
            const int64_t t_from = sg * sc * CS, t_to = t_from + sc * CS < len ? t_from + sc * CS : len;
            float *P = nseg > 1 ? segmaps + (size_t)(sg * HV + j) * mf : map + (size_t)j * mf;
            float *S = P + (size_t)K * K;
            if (sg == 0 && !need_P) {
                memset(P, 0, sizeof(float) * K * K);
                gdn_cpu_load_state(p, a->h0, n, j, S);
                state_span(p, &in, bos, t_from, t_to, j, S, &w);
            } else {
                gdn_transition_span(p, &in, bos, t_from, t_to, j, P, S, &w);
            }
        }
        if (nseg > 1) {
            /* per head, in segment order: S <- P_s S + S_s, P <- P_s P */
            #pragma omp for schedule(dynamic, 1)
            for (int j = 0; j < HV; j++) {
                float *P = map + (size_t)j * mf, *S = P + (size_t)K * K;
                memcpy(P, segmaps + (size_t)j * mf, sizeof(float) * mf);
                for (int64_t sg = 1; sg < nseg; sg++) {
                    const float *Ps = segmaps + (size_t)(sg * HV + j) * mf, *Ss = Ps + (size_t)K * K;
                    memcpy(tmp, Ss, sizeof(float) * K * V);
                    gdn_gemm(K, V, K, 1.f, Ps, K, 0, S, V, 0, 1, tmp, V);
                    memcpy(S, tmp, sizeof(float) * K * V);
                    if (need_P) left_mul(p, Ps, 0, P, K, tmp);
                }
            }
        }
        gdn_ftz_end(fpmode);
    }
}

void gdn_cpu_cp_bwd_map(const gdn_plan *p, const gdn_cp_config *cp, const gdn_bwd_args *a, const float *fwd_map,
                        float *bmap) {
    const int K = p->c.K, V = p->c.V, HV = p->c.HV;
    const size_t mf = map_floats(p);
    int64_t sc = 1;
    const int64_t nseg = edge_segments(p, cp, 1, &sc);
    if (nseg == 0) {                        /* nothing goes back to the previous rank */
        memset(bmap, 0, sizeof(float) * mf * HV);
        return;
    }
    int64_t bos, len;
    gdn_seq(p, 0, &bos, &len);
    /* P^T carries dS_end back only when sequence 0 also goes on to the next rank */
    const int through = p->N == 1 && cp->last_continues;
    const int want_P = through && !fwd_map;
    float *segmaps = (float *)a->workspace;
    float *scratch = segmaps + (nseg > 1 ? (size_t)nseg * HV * mf : 0);
    gdn_saved_layout sv = gdn_saved_at(&p->c, (void *)a->saved);
    const chunk_in in = { a->q, a->k, a->v, a->g, a->beta, a->A_log, a->dt_bias, sv.rstd_q, sv.rstd_k, NULL, NULL };
    #pragma omp parallel num_threads(p->threads)
    {
        float *mine = scratch + bwd_thread_floats(p) * (size_t)thread_id();
        float *dscratch = mine;
        chunk_ws w = gdn_chunk_ws_at(dscratch + gdn_dstate_scratch_floats(K, V), K, V);
        float *Sjunk = dscratch + gdn_dstate_scratch_floats(K, V) + gdn_chunk_ws_floats(K, V);
        float *tmp = Sjunk + (size_t)K * V;
        const unsigned fpmode = gdn_ftz_begin();
        #pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < nseg * HV; item++) {
            const int64_t sg = item / HV;
            const int j = (int)(item % HV);
            const int last = sg == nseg - 1;
            const int64_t t_from = sg * sc * CS, t_to = t_from + sc * CS < len ? t_from + sc * CS : len;
            float *P = nseg > 1 ? segmaps + (size_t)(sg * HV + j) * mf : bmap + (size_t)j * mf;
            float *dS = P + (size_t)K * K;
            /* the last segment starts from dht row 0 (the gradient of ht row 0: the
             * final state, or the state at this rank's end), the others from zero */
            if (last) gdn_cpu_load_state(p, a->dht, 0, j, dS);
            else memset(dS, 0, sizeof(float) * K * V);
            gdn_dstate_span(p, a->dout, &in, bos, t_from, t_to, j, dS, dscratch);
            if (!last || want_P) gdn_transition_span(p, &in, bos, t_from, t_to, j, P, Sjunk, &w);
            else memset(P, 0, sizeof(float) * K * K);
        }
        #pragma omp for schedule(dynamic, 1)
        for (int j = 0; j < HV; j++) {
            float *P = bmap + (size_t)j * mf, *dS = P + (size_t)K * K;
            if (nseg > 1) {
                /* dS_in of segment s = P_s^T dS_in(s+1) + its own, from the last back */
                memcpy(dS, segmaps + (size_t)((nseg - 1) * HV + j) * mf + (size_t)K * K, sizeof(float) * K * V);
                for (int64_t sg = nseg - 2; sg >= 0; sg--) {
                    const float *Ps = segmaps + (size_t)(sg * HV + j) * mf, *Ss = Ps + (size_t)K * K;
                    memcpy(tmp, Ss, sizeof(float) * K * V);
                    gdn_gemm(K, V, K, 1.f, Ps, K, 1, dS, V, 0, 1, tmp, V);
                    memcpy(dS, tmp, sizeof(float) * K * V);
                }
                if (want_P) {   /* P = P_last ... P_0 */
                    memcpy(P, segmaps + (size_t)j * mf, sizeof(float) * K * K);
                    for (int64_t sg = 1; sg < nseg; sg++) left_mul(p, segmaps + (size_t)(sg * HV + j) * mf, 0, P, K, tmp);
                }
            }
            if (!through) memset(P, 0, sizeof(float) * K * K);
            else if (fwd_map) memcpy(P, fwd_map + (size_t)j * mf, sizeof(float) * K * K);
        }
        gdn_ftz_end(fpmode);
    }
}

/* ---- the scans ---- */

enum { NB = 16 };   /* columns (state layout k-first) or rows (v-first) per block */

static int map_P_zero(const float *P, size_t n) {
    for (size_t x = 0; x < n; x++)
        if (P[x] != 0.f) return 0;
    return 1;
}

/* out (state layout of p) <- S (k-first [K,V]) */
static void set_state(const gdn_plan *p, float *out, const float *S) {
    const int K = p->c.K, V = p->c.V;
    if (!(p->c.flags & GDN_STATE_V_FIRST)) { memcpy(out, S, sizeof(float) * K * V); return; }
    for (int e = 0; e < V; e++)
        for (int i = 0; i < K; i++) out[(size_t)e * K + i] = S[(size_t)i * V + e];
}

/* out <- op(P) out + S in place, op(P) = P or P^T (tr); out in the state
 * layout, S k-first. Each block of value columns depends on that block only. */
static void fold(const gdn_plan *p, float *out, const float *P, int tr, const float *S) {
    const int K = p->c.K, V = p->c.V;
    float tmp[256 * NB];
    if (!(p->c.flags & GDN_STATE_V_FIRST)) {             /* out [K,V] */
        for (int b = 0; b < V; b += NB) {
            const int nb = V - b < NB ? V - b : NB;
            gdn_gemm(K, nb, K, 1.f, P, K, tr, out + b, V, 0, 0, tmp, NB);
            for (int i = 0; i < K; i++)
                for (int e = 0; e < nb; e++) out[(size_t)i * V + b + e] = tmp[i * NB + e] + S[(size_t)i * V + b + e];
        }
    } else {                                              /* out [V,K] = state^T */
        for (int b = 0; b < V; b += NB) {
            const int nb = V - b < NB ? V - b : NB;
            /* (op(P) X)^T = X^T op(P)^T: with tr, P; without, P^T */
            gdn_gemm(nb, K, K, 1.f, out + (size_t)b * K, K, 0, P, K, !tr, 0, tmp, K);
            for (int e = 0; e < nb; e++)
                for (int i = 0; i < K; i++) out[(size_t)(b + e) * K + i] = tmp[e * K + i] + S[(size_t)i * V + b + e];
        }
    }
}

static void scan(const gdn_plan *p, const gdn_cp_config *cp, const float *maps, float *out, int backward) {
    const int K = p->c.K, V = p->c.V, HV = p->c.HV;
    const size_t mf = map_floats(p);
    const int r = cp->rank, R = cp->world;
    #pragma omp parallel for num_threads(p->threads) schedule(dynamic, 1)
    for (int j = 0; j < HV; j++) {
        const unsigned fpmode = gdn_ftz_begin();
        float *o = out + (size_t)j * K * V;
        if (backward ? r == R - 1 : r == 0) {
            memset(o, 0, sizeof(float) * K * V);
        } else {
            /* start where the chain last restarted (a zero P: nothing before it
             * reaches this rank), else at the far end, whose map acts on zero */
            int start = backward ? R - 1 : 0;
            if (!backward) {
                for (int i = r - 1; i > 0; i--)
                    if (map_P_zero(maps + ((size_t)i * HV + j) * mf, (size_t)K * K)) { start = i; break; }
            } else {
                for (int i = r + 1; i < R - 1; i++)
                    if (map_P_zero(maps + ((size_t)i * HV + j) * mf, (size_t)K * K)) { start = i; break; }
            }
            set_state(p, o, maps + ((size_t)start * HV + j) * mf + (size_t)K * K);
            if (!backward)
                for (int i = start + 1; i < r; i++) {
                    const float *P = maps + ((size_t)i * HV + j) * mf;
                    fold(p, o, P, 0, P + (size_t)K * K);
                }
            else
                for (int i = start - 1; i > r; i--) {
                    const float *P = maps + ((size_t)i * HV + j) * mf;
                    fold(p, o, P, 1, P + (size_t)K * K);
                }
        }
        gdn_ftz_end(fpmode);
    }
}

void gdn_cpu_cp_fwd_scan(const gdn_plan *p, const gdn_cp_config *cp, const float *maps, float *S_in) {
    scan(p, cp, maps, S_in, 0);
}

void gdn_cpu_cp_bwd_scan(const gdn_plan *p, const gdn_cp_config *cp, const float *maps, float *dS_out) {
    scan(p, cp, maps, dS_out, 1);
}
