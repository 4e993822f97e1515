/* The chunk step shared by the CPU chunked forward and backward.
 *
 * For one chunk of c <= 64 tokens of sequence n, value head j, with state S0
 * entering the chunk (k-first, K x V) and gc_t = sum_{s<=t} g_s inside the chunk:
 *   A_ts = beta_t exp(gc_t - gc_s) k_t.k_s   (s < t)       Tm = (I + A)^-1
 *   Wk   = Tm diag(beta exp(gc)) K            Wv = Tm diag(beta) V
 *   U    = Wv - Wk S0                         (the u_t of the recurrence)
 *   P_ts = scale q_t.k_s exp(gc_t - gc_s)     (s <= t)
 *   O    = scale diag(exp(gc)) Q S0 + P U
 *   S1   = exp(gc_last) S0 + sum_s exp(gc_last - gc_s) k_s u_s^T
 */
#ifndef GDN_CPU_CHUNK_H
#define GDN_CPU_CHUNK_H
#include "internal.h"

#define CS GDN_CHUNK

typedef struct chunk_ws {
    float *Q, *Kc, *Vv;              /* [CS,K] [CS,K] [CS,V] q^, k^, v rows            */
    float *g, *gc, *gam, *beta;      /* [CS] log decay, its cumsum, exp(gc), beta     */
    float *KK, *P, *Tm, *E;          /* [CS,CS] k.k, masked scaled q.k decay, (I+A)^-1,
                                        exp(gc_t - gc_s) for s <= t */
    float *Bk, *Wk, *Bv, *Wv, *U;    /* [CS,K] [CS,K] [CS,V] [CS,V]; U is Wv's buffer  */
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

/* Load the chunk rows r0..r0+c-1 and build gc, gam, KK, P, Tm, Wk, Wv. */
void gdn_chunk_prepare(const gdn_plan *p, const chunk_in *in, int64_t r0, int c, int j, chunk_ws *w);

/* U = Wv - Wk S0, in place of Wv */
void gdn_chunk_u(const gdn_plan *p, int c, const float *S0, chunk_ws *w);

/* S <- exp(gc_last) S + (exp(gc_last - gc) K)^T U ; clobbers w->Kc */
void gdn_chunk_state_step(const gdn_plan *p, int c, float *S, chunk_ws *w);

#endif
