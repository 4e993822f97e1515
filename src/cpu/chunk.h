/* The chunk step shared by the CPU chunked forward and backward.
 *
 * For one chunk of c <= 64 tokens of sequence n, value head j, with state S0
 * entering the chunk (k-first, K x V) and gc_t = sum_{s<=t} g_s inside the chunk:
 *   A_ts = beta_t exp(gc_t - gc_s) k_t.k_s   (s < t)       Tm = (I + A)^-1
 *   Wk   = Tm diag(beta exp(gc)) K            Wv = Tm diag(beta) V
 *   U    = Wv - Wk S0 = Tm (Bv - Bk S0)       (the u_t of the recurrence)
 *   P_ts = scale q_t.k_s exp(gc_t - gc_s)     (s <= t)
 *   O    = scale diag(exp(gc)) Q S0 + P U
 *   S1   = exp(gc_last) S0 + sum_s exp(gc_last - gc_s) k_s u_s^T
 */
#ifndef GDN_CPU_CHUNK_H
#define GDN_CPU_CHUNK_H
#include "common/common.h"

#define CS GDN_CHUNK

typedef struct chunk_ws {
    /* shared by the value heads of a q/k head */
    float *Q, *Kc, *QK;              /* [CS,K] [CS,K] q^, k^ rows; [CS,CS] scale q.k (s <= t) */
    /* per value head */
    float *Qs, *Kd;                  /* [CS,K] scale exp(gc_t) q_t, exp(gc_last - gc_s) k_s */
    float *Vv;                       /* [CS,V] v rows                                  */
    float *g, *gc, *gam, *beta;      /* [CS] log decay, its cumsum, exp(gc), beta     */
    float *KK, *P, *Tm, *E;          /* [CS,CS] k.k, masked scaled q.k decay, (I+A)^-1,
                                        exp(gc_t - gc_s) for s <= t */
    float *Bk, *Wk, *Bv, *U, *X;     /* [CS,K] [CS,K] [CS,V] [CS,V] [CS,V] X: Bv - Bk S0 */
} chunk_ws;

/* floats of one chunk_ws for head dims K, V */
size_t gdn_chunk_ws_floats(int K, int V);
chunk_ws gdn_chunk_ws_at(float *base, int K, int V);

typedef struct chunk_in {
    const void *q, *k, *v, *g, *beta;
    const float *A_log, *dt_bias;
    const float *rstd_q, *rstd_k;    /* backward: saved rstd; NULL in forward */
    float *rstd_q_out, *rstd_k_out;  /* forward: where to save rstd, or NULL  */
} chunk_in;

/* Load the chunk rows r0..r0+c-1 of q/k head h: Q, Kc, KK, QK. */
void gdn_chunk_prepare_qk(const gdn_plan *p, const chunk_in *in, int64_t r0, int c, int h, chunk_ws *w);
/* The value head j part (after prepare_qk of j's q/k head): gc, gam, E, P, Tm, Bk, Bv, Wk. */
void gdn_chunk_prepare_head(const gdn_plan *p, const chunk_in *in, int64_t r0, int c, int j, chunk_ws *w);
/* both */
void gdn_chunk_prepare(const gdn_plan *p, const chunk_in *in, int64_t r0, int c, int j, chunk_ws *w);

/* U = Tm (Bv - Bk S0), Bk = diag(beta exp(gc)) K, Bv = diag(beta) V */
void gdn_chunk_u(const gdn_plan *p, int c, const float *S0, chunk_ws *w);

/* S <- exp(gc_last) S + Kd^T U, Kd = exp(gc_last - gc) K (left in w->Kd) */
void gdn_chunk_state_step(const gdn_plan *p, int c, float *S, chunk_ws *w);

/* ---- segments (DESIGN.md §8) ----
 * A sequence is cut into segments of sc chunks that run in parallel; each
 * maps its incoming state as S_out = P S_in + S_loc. The cut depends on the
 * shape and gdn_exec.seq_split only, never on the thread count. */
static inline int64_t gdn_chunks_of(int64_t len) { return (len + CS - 1) / CS; }
/* chunks per segment, given how many parallel items there are without a cut;
 * >= the longest sequence's chunk count when nothing is cut */
int64_t gdn_segment_chunks(const gdn_plan *p, int64_t items);
static inline int gdn_is_split(const gdn_plan *p, int64_t sc) { return sc < gdn_chunks_of(p->max_len); }
static inline int64_t gdn_segments_of(int64_t len, int64_t sc) { return len > 0 ? (gdn_chunks_of(len) + sc - 1) / sc : 1; }
int64_t gdn_total_segments(const gdn_plan *p, int64_t sc);
/* seg0[n] = index of sequence n's first segment, n = 0..N */
void gdn_segment_index(const gdn_plan *p, int64_t sc, int64_t *seg0);
/* sequence of segment sg (seg0 from gdn_segment_index) */
static inline int64_t gdn_segment_seq(const gdn_plan *p, const int64_t *seg0, int64_t sg) {
    int64_t n = 0;
    while (seg0[n + 1] <= sg) n++;
    (void)p;
    return n;
}
/* The scan over sequence n's segments for value head j. Segment sg's map is
 * at maps + (sg*HV + j)*stride: P [K,K], then S [K,V] holding S_loc (read for
 * every segment but the last). On entry S0 is the sequence's h0; on exit each
 * slot S holds its segment's incoming state. tmp: K*V floats. */
void gdn_segment_scan(const gdn_plan *p, const int64_t *seg0, float *maps, size_t stride, int64_t n, int j,
                      float *S0, float *tmp);
/* The map of tokens [t_from, t_to) of sequence n (rows from bos), value head j:
 * P [K,K] and S_loc [K,V], the final state from a zero one. */
void gdn_transition_span(const gdn_plan *p, const chunk_in *in, int64_t bos, int64_t t_from,
                         int64_t t_to, int j, float *P, float *S, chunk_ws *w);
/* Its reverse (chunk_bwd.c): dS [K,V] holds on entry the gradient w.r.t. the
 * state after tokens [t_from, t_to), on exit w.r.t. the state before them,
 * with the span's own dout rows added (no state needed: o is linear in the
 * incoming state). scratch: gdn_dstate_scratch_floats(K, V) floats. */
size_t gdn_dstate_scratch_floats(int K, int V);
void gdn_dstate_span(const gdn_plan *p, const void *dout, const chunk_in *in, int64_t bos, int64_t t_from,
                     int64_t t_to, int j, float *dS, float *scratch);

#endif
