/* float64 reference of the causal depthwise conv1d (DESIGN.md §4 item 4),
 * literally, channel by channel and token by token. Same shapes and layouts as
 * the public API (gdn_conv1d_config), every tensor in double:
 *   x, y, dy, dx [B,T,D]; weight, dweight [D,W]; bias, dbias [D];
 *   h0, ht, dht, dh0 [N,D,W] (N = num_seqs with cu_seqlens, else B). */
#ifndef GDN_REF_CONV1D_H
#define GDN_REF_CONV1D_H

#include <stdint.h>
#include "gdn.h"

/* y = act(bias + sum_w weight[:,w] * x[t-W+1+w]); bias, h0 may be NULL (zeros);
 * ht may be NULL. */
void gdn_ref_conv1d_fwd(const gdn_conv1d_config *c, const double *x, const double *weight,
                        const double *bias, const double *h0, double *y, double *ht);

/* Gradients of L = <dy, y> + <dht, ht> (dht NULL = 0) w.r.t. x, weight, bias
 * and h0 (taken at h0 = 0 when h0 is NULL). Any output pointer may be NULL. */
void gdn_ref_conv1d_bwd(const gdn_conv1d_config *c, const double *x, const double *weight,
                        const double *bias, const double *h0, const double *dy, const double *dht,
                        double *dx, double *dweight, double *dbias, double *dh0);

/* One token per row b of x [B,D]: state [num_slots,D,W] of row b (slots[b],
 * or b when slots is NULL; -1 = padding: untouched, y row 0) shifts left by
 * one, x enters newest, y [B,D] = act(bias + sum_w weight[:,w] * state[:,w]).
 * Rows are applied in order b = 0..B-1. */
void gdn_ref_conv1d_update(int64_t B, int D, int W, int silu, const double *x, const double *weight,
                           const double *bias, double *state, const int32_t *slots, double *y);

#endif
