/* FLOP and byte model of the gdn ops, shared by the CLI and the benchmarks.
 *
 * These are models, not counts of what a given kernel executes: they say how
 * much useful arithmetic an op does, so that rates from different kernels and
 * machines compare. A multiply-add counts as 2 FLOPs. Everything is per token
 * and per value head (HV) and summed over all B*T tokens; the padding of the
 * last chunk of a sequence is not counted.
 *
 * Chunk forward (WY / UT transform, chunk C = 64), per chunk of C tokens of
 * one value head, with q, k [C,K], v [C,V], state S [K,V]:
 *
 *   intra-chunk, triangular (causal) products, half of a full C x C product:
 *     A   = tril(beta K K^T)           C*C*K/2 multiply-adds
 *     Qk  = tril(Q K^T)                C*C*K/2
 *     Wk  = T (beta K)                 C*C*K/2      T = (I + A)^-1, lower triangular
 *     Wv  = T (beta V)                 C*C*V/2
 *     O  += Qk U                       C*C*V/2
 *     T   = (I + A)^-1                 C^3/3 FLOPs  (triangular inverse)
 *   state products, full:
 *     U   = Wv - Wk S                  C*K*V multiply-adds
 *     O   = Q S                        C*K*V
 *     S   = S + K^T U                  C*K*V
 *
 *   Per token: 3*K*V + 1.5*C*K + C*V multiply-adds plus C^2/3 FLOPs, i.e.
 *     flops/token/head = 2*(3*K*V) + 2*(1.5*C*K) + 2*(C*V) + C*C/3
 *                      = 6*K*V + 3*C*K + 2*C*V + C*C/3
 *   (K = V = 128: 140,629 FLOPs, 86 % of it in the state products.)
 *   The decays, gates, norms and beta scalings are O(K + V) per token and are
 *   left out.
 *
 * Chunk backward: modelled as 2.5 x the forward. The exact backward
 * recomputes the chunk states (the forward's state products again), then
 * forms dU, dS (backwards over chunks), dQ, dK, dWk / dWv and the gradient
 * through the triangular inverse; roughly 2.5 times the forward's products.
 * It is a model: the ratio of a real kernel depends on what it keeps.
 *
 * Recurrent forward, per token per value head:
 *     S = exp(g) S                     K*V multiplies         K*V FLOPs
 *     S^T k, S += k u^T, S^T q         3 * K*V multiply-adds  6*K*V FLOPs
 *   flops/token/head = 7*K*V.
 *
 * Standalone pieces (memory bound; their FLOPs are only for completeness):
 *   gate:   g = -exp(A_log) * softplus(a + dt_bias): 4 FLOPs per element
 *           (add, softplus as 1, multiply, negate; exp(A_log) is per head).
 *   l2norm: sum of squares (2 per element) and the scaling (1): 3 per element.
 *
 * GDN layer pieces:
 *   decode step, per row per value head: the recurrent forward's 7*K*V
 *           (the L2 norms, gate and beta are O(K + V) and left out); with the
 *           fused conv update, 2*W multiply-add FLOPs per channel of the
 *           row's D = 2*H*K + HV*V (SiLU left out). Memory bound at small B:
 *           the state row is read and written once.
 *   conv1d, gated RMSNorm: pure memory traffic, a few FLOPs per element;
 *           they have a byte model only (the CLI reports them in GB/s).
 *
 * Bytes: every input read once and every output written once, at their
 * dtypes (the minimum traffic; for the GPU's bandwidth fraction). A state
 * updated in place (decode) is read once and written once.
 */
#ifndef GDN_TOOLS_FLOPS_H
#define GDN_TOOLS_FLOPS_H

#include <stdint.h>
#include "gdn.h"

#define GDN_FLOPS_CHUNK 64

/* tokens over all rows (with cu_seqlens B is 1 and T holds every sequence) */
static inline double gdn_model_tokens(const gdn_config *c) { return (double)c->B * (double)c->T; }

/* number of sequences, i.e. of states in h0 / ht */
static inline double gdn_model_seqs(const gdn_config *c) {
    return c->cu_seqlens ? (double)c->num_seqs : (double)c->B;
}

static inline double gdn_flops_chunk_fwd(const gdn_config *c) {
    const double K = c->K, V = c->V, C = GDN_FLOPS_CHUNK;
    const double per = 2.0 * (3.0 * K * V) + 2.0 * (1.5 * C * K) + 2.0 * (C * V) + C * C / 3.0;
    return per * gdn_model_tokens(c) * c->HV;
}

/* backward alone (without the forward that precedes it) */
static inline double gdn_flops_chunk_bwd(const gdn_config *c) { return 2.5 * gdn_flops_chunk_fwd(c); }

static inline double gdn_flops_recurrent_fwd(const gdn_config *c) {
    return 7.0 * (double)c->K * (double)c->V * gdn_model_tokens(c) * c->HV;
}

static inline double gdn_flops_gate_fwd(int64_t rows, int HV) { return 4.0 * (double)rows * HV; }
static inline double gdn_flops_l2norm_fwd(int64_t rows, int dim) { return 3.0 * (double)rows * dim; }

/* ---- bytes ---- */

/* q, k, v, g (or a), beta (or b), A_log, dt_bias, h0 in; o, ht, saved out */
static inline double gdn_bytes_chunk_fwd(const gdn_config *c, int has_h0, int has_ht) {
    const double tok = gdn_model_tokens(c), ds = (double)gdn_dtype_size(c->dtype),
                 gs = (double)gdn_dtype_size(c->gate_dtype);
    const double st = gdn_model_seqs(c) * c->HV * c->K * c->V * 4.0;
    double b = tok * (2.0 * c->H * c->K + c->HV * c->V) * ds   /* q, k, v */
             + tok * 2.0 * c->HV * gs                           /* g, beta */
             + tok * c->HV * c->V * ds;                         /* o */
    if (c->flags & GDN_GATE_FUSED) b += 2.0 * c->HV * 4.0;      /* A_log, dt_bias */
    if (c->flags & GDN_QK_L2NORM) b += tok * 2.0 * c->H * 4.0;  /* saved rstd */
    if (has_h0) b += st;
    if (has_ht) b += st;
    return b;
}

/* backward alone: the forward's inputs, saved, dout, dht in; every gradient out */
static inline double gdn_bytes_chunk_bwd(const gdn_config *c, int has_h0, int has_dht, int has_dh0) {
    const double tok = gdn_model_tokens(c), ds = (double)gdn_dtype_size(c->dtype),
                 gs = (double)gdn_dtype_size(c->gate_dtype);
    const double st = gdn_model_seqs(c) * c->HV * c->K * c->V * 4.0;
    const double qkv = tok * (2.0 * c->H * c->K + c->HV * c->V) * ds, gb = tok * 2.0 * c->HV * gs;
    double b = 2.0 * qkv + 2.0 * gb                  /* q, k, v, g, beta in; their gradients out */
             + tok * c->HV * c->V * ds;              /* dout */
    if (c->flags & GDN_GATE_FUSED) b += 4.0 * c->HV * 4.0;      /* A_log, dt_bias, dA_log, ddt_bias */
    if (c->flags & GDN_QK_L2NORM) b += tok * 2.0 * c->H * 4.0;  /* saved rstd */
    if (has_h0) b += st;
    if (has_dht) b += st;
    if (has_dh0) b += st;
    return b;
}

static inline double gdn_bytes_recurrent_fwd(const gdn_config *c, int has_h0, int has_ht) {
    double b = gdn_bytes_chunk_fwd(c, has_h0, has_ht);
    if (c->flags & GDN_QK_L2NORM) b -= gdn_model_tokens(c) * 2.0 * c->H * 4.0;  /* nothing saved */
    return b;
}

/* a [rows, HV] in, A_log and dt_bias in, g [rows, HV] f32 out */
static inline double gdn_bytes_gate_fwd(int64_t rows, int HV, gdn_dtype a_dtype) {
    return (double)rows * HV * ((double)gdn_dtype_size(a_dtype) + 4.0) + 2.0 * HV * 4.0;
}

/* x in, y out [rows, dim], rstd [rows] f32 out (when wanted) */
static inline double gdn_bytes_l2norm_fwd(int64_t rows, int dim, gdn_dtype t, int has_rstd) {
    return (double)rows * dim * 2.0 * (double)gdn_dtype_size(t) + (has_rstd ? (double)rows * 4.0 : 0.0);
}

/* ---- the GDN layer pieces ---- */

/* channels of mixed_qkv / proj: q, k, v concatenated */
static inline int gdn_decode_dim(const gdn_decode_config *c) { return 2 * c->H * c->K + c->HV * c->V; }

static inline double gdn_flops_decode_step(const gdn_decode_config *c) {
    double f = 7.0 * (double)c->K * (double)c->V * (double)c->B * c->HV;
    if (c->conv_W > 0) f += 2.0 * c->conv_W * (double)gdn_decode_dim(c) * c->B;
    return f;
}

/* mixed_qkv (or proj) [B,D], a, b [B,HV] in; o [B,HV,V] out; A_log, dt_bias [HV] in;
 * each row's state [HV,K,V] f32 read and written; slots [B] int32 in; with the
 * conv update each row's conv state [D,W] f32 read and written, weight [D,W]
 * and bias [D] in. Padding rows (slot -1) are counted as full rows. */
static inline double gdn_bytes_decode_step(const gdn_decode_config *c, int has_dt_bias, int has_slots,
                                           int has_conv_bias) {
    const double rows = c->B, ds = (double)gdn_dtype_size(c->dtype), D = gdn_decode_dim(c);
    double b = rows * D * ds + 2.0 * rows * c->HV * ds + rows * c->HV * c->V * ds
             + 2.0 * rows * c->HV * (double)c->K * c->V * 4.0
             + (1.0 + (has_dt_bias ? 1.0 : 0.0)) * c->HV * 4.0;
    if (has_slots) b += rows * 4.0;
    if (c->conv_W > 0) {
        b += 2.0 * rows * D * c->conv_W * 4.0 + D * c->conv_W * 4.0;
        if (has_conv_bias) b += D * 4.0;
    }
    return b;
}

/* number of sequences, i.e. of conv states in h0 / ht */
static inline double gdn_conv1d_seqs(const gdn_conv1d_config *c) {
    return c->cu_seqlens ? (double)c->num_seqs : (double)c->B;
}

/* x in, y out [B,T,D]; weight [D,W], bias [D] in; h0 in, ht out [N,D,W] f32 */
static inline double gdn_bytes_conv1d_fwd(const gdn_conv1d_config *c, int has_bias, int has_h0, int has_ht) {
    const double el = (double)c->B * (double)c->T * c->D, ds = (double)gdn_dtype_size(c->dtype);
    const double st = gdn_conv1d_seqs(c) * c->D * c->W * 4.0;
    double b = 2.0 * el * ds + (double)c->D * c->W * 4.0;
    if (has_bias) b += c->D * 4.0;
    if (has_h0) b += st;
    if (has_ht) b += st;
    return b;
}

/* x, dy in, dx out [B,T,D]; weight in, dweight out [D,W]; bias in, dbias out [D];
 * h0, dht in, dh0 out [N,D,W] f32 */
static inline double gdn_bytes_conv1d_bwd(const gdn_conv1d_config *c, int has_bias, int has_h0, int has_dht,
                                          int has_dbias, int has_dh0) {
    const double el = (double)c->B * (double)c->T * c->D, ds = (double)gdn_dtype_size(c->dtype);
    const double st = gdn_conv1d_seqs(c) * c->D * c->W * 4.0;
    double b = 3.0 * el * ds + 2.0 * (double)c->D * c->W * 4.0;
    if (has_bias) b += c->D * 4.0;
    if (has_dbias) b += c->D * 4.0;
    if (has_h0) b += st;
    if (has_dht) b += st;
    if (has_dh0) b += st;
    return b;
}

/* x, z in, y out [rows,V]; w [V] f32 in; rstd [rows] f32 out (when wanted) */
static inline double gdn_bytes_rmsnorm_gated_fwd(const gdn_rmsnorm_config *c, int has_rstd) {
    const double el = (double)c->rows * c->V;
    return 3.0 * el * (double)gdn_dtype_size(c->dtype) + c->V * 4.0 + (has_rstd ? (double)c->rows * 4.0 : 0.0);
}

/* x, z, dy in, dx, dz out [rows,V]; w in, dw out [V] f32; rstd [rows] in (when given) */
static inline double gdn_bytes_rmsnorm_gated_bwd(const gdn_rmsnorm_config *c, int has_rstd) {
    const double el = (double)c->rows * c->V;
    return 5.0 * el * (double)gdn_dtype_size(c->dtype) + 2.0 * c->V * 4.0
         + (has_rstd ? (double)c->rows * 4.0 : 0.0);
}

#endif /* GDN_TOOLS_FLOPS_H */
