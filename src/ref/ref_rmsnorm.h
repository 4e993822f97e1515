/* float64 reference of the gated RMSNorm (DESIGN.md §4 item 5), per row of V:
 *   r = 1/sqrt(mean(x^2) + eps),  y = x * r * w * gate(z),
 *   gate(z) = z*sigmoid(z) (GDN_NORM_GATE_SILU) or sigmoid(z) (GDN_NORM_GATE_SIGMOID).
 * Every tensor in double, x, z, y, dy, dx, dz [rows, V], w, dw [V]. */
#ifndef GDN_REF_RMSNORM_H
#define GDN_REF_RMSNORM_H

#include <stdint.h>
#include "gdn.h"

/* y [rows, V]; rstd [rows] may be NULL. */
void gdn_ref_rmsnorm_fwd(int64_t rows, int V, double eps, gdn_norm_gate gate, const double *x,
                         const double *z, const double *w, double *y, double *rstd);
/* Gradients of L = <dy, y>: dx, dz [rows, V], dw [V] (summed over rows).
 * Any output pointer may be NULL. */
void gdn_ref_rmsnorm_bwd(int64_t rows, int V, double eps, gdn_norm_gate gate, const double *x,
                         const double *z, const double *w, const double *dy, double *dx,
                         double *dz, double *dw);
/* The squared L2 norms of the terms of the backward's sums that can cancel
 * (DESIGN.md §5), for bounds relative to them: dw_terms2 [V], the terms
 * dy_i x_i r gate(z_i) over rows; dx_terms2 [rows, V], dx_j's two terms
 * r a_j and the r^3 x_j / V share of sum_i a_i x_i (a_i = dy_i w_i gate(z_i)),
 * each of those summands counted. */
void gdn_ref_rmsnorm_bwd_terms(int64_t rows, int V, double eps, gdn_norm_gate gate, const double *x,
                               const double *z, const double *w, const double *dy, double *dx_terms2,
                               double *dw_terms2);

#endif
