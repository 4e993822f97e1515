/* float64 reference: the recurrence of DESIGN.md §2, literally, token by token,
 * forward and reverse mode. Same shapes, layouts and flags as the public API
 * (gdn_config), every tensor in double. Used by the tests and the CLI. */
#ifndef GDN_REF_H
#define GDN_REF_H

#include "gdn.h"

typedef struct gdn_ref_inputs {
    const double *q, *k, *v;   /* raw (before in-kernel l2norm)                 */
    const double *g;           /* g, or raw a with GDN_GATE_FUSED; NULL = 0      */
    const double *beta;        /* beta, or raw b with GDN_BETA_SIGMOID           */
    const double *A_log, *dt_bias; /* [HV]; dt_bias NULL = 0                     */
    const double *h0;          /* NULL = zeros; layout per GDN_STATE_V_FIRST     */
} gdn_ref_inputs;

/* o [B,T,HV,V]; ht may be NULL. */
void gdn_ref_fwd(const gdn_config *cfg, const gdn_ref_inputs *in, double *o, double *ht);
/* The same, and o_terms2 [B,T,HV,V]: the squared L2 norm of the terms of the
 * last sum of each o element, scale^2 sum_i (S_ie q_i)^2, against which a
 * result that cancelled is measured (docs/DESIGN.md §5). */
void gdn_ref_fwd_terms(const gdn_config *cfg, const gdn_ref_inputs *in, double *o, double *ht, double *o_terms2);

/* Gradients of L = <dout, o> + <dht, ht> (dht NULL = 0) w.r.t. every input.
 * dg is dL/dg, or dL/da with GDN_GATE_FUSED; dbeta likewise dL/db with
 * GDN_BETA_SIGMOID. dA_log, ddt_bias only with GDN_GATE_FUSED. Any output
 * pointer may be NULL. */
void gdn_ref_bwd(const gdn_config *cfg, const gdn_ref_inputs *in,
                 const double *dout, const double *dht,
                 double *dq, double *dk, double *dv, double *dg, double *dbeta,
                 double *dA_log, double *ddt_bias, double *dh0);
/* The same, and the size of the terms that cancel, measured as
 * docs/DESIGN.md §5 says (each may be NULL):
 * dh0_terms2 (state shape): the delta rule's removal, dS - beta k (k^T dS),
 * cancels where beta |k|^2 is near 1, and a chunked backward carries that
 * cancellation through a whole chunk; so every element of a (sequence, head)
 * state gets max_t reach_t^2 ||dS_t||^2 / (K V), dS_t the gradient at token t
 * before its removal, reach_t the product of the decays from the start
 * through t (a transition's norm is at most its decay).
 * dg_terms2, dbeta_terms2 ([rows, HV], as dg and dbeta: chained through the
 * fused gate and the sigmoid): each token's dg = <dS, exp(g) S_prev> over the
 * K V elements of the state and dbeta = du . (v - w) over V, the squared norm
 * of those products. */
void gdn_ref_bwd_terms(const gdn_config *cfg, const gdn_ref_inputs *in,
                       const double *dout, const double *dht,
                       double *dq, double *dk, double *dv, double *dg, double *dbeta,
                       double *dA_log, double *ddt_bias, double *dh0, double *dh0_terms2,
                       double *dg_terms2, double *dbeta_terms2);

/* Standalone pieces, same math as the fused ones. */
double gdn_ref_softplus(double x);
void gdn_ref_gate_fwd(int64_t rows, int HV, const double *a, const double *A_log,
                      const double *dt_bias, double *g);
void gdn_ref_gate_bwd(int64_t rows, int HV, const double *a, const double *A_log,
                      const double *dt_bias, const double *dg,
                      double *da, double *dA_log, double *ddt_bias);
void gdn_ref_l2norm_fwd(int64_t rows, int dim, const double *x, double *y, double *rstd);
void gdn_ref_l2norm_bwd(int64_t rows, int dim, const double *x, const double *dy, double *dx);

#endif
