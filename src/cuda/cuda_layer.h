/* The GDN layer ops on the CUDA backend (cuda/conv1d.cu, rmsnorm.cu, gate.cu,
 * l2norm.cu), forward and backward, as the API layer sees them: C entry
 * points, device pointers, the caller's stream, inputs already validated.
 * Nothing is allocated and the host never waits. Each returns GDN_OK or
 * GDN_ERR_BACKEND (launch failure, message set). The backwards' sums over
 * rows (dweight, dbias, dw, dA_log, ddt_bias) are deterministic without
 * atomics or workspace: the blocks of a thread-block cluster add their
 * partials in a fixed order (cuda/cluster_sum.cuh). */
#ifndef GDN_CUDA_LAYER_H
#define GDN_CUDA_LAYER_H
#include "common/common.h"
#ifdef __cplusplus
extern "C" {
#endif

/* Causal conv1d forward; N sequences; cu_dev: cu_seqlens in device memory
 * (read only when c->cu_seqlens is set). ht is written after y by a second
 * kernel, so ht may be h0 (in place). */
gdn_status gdn_cuda_conv1d_fwd(const gdn_conv1d_config *c, int64_t N, const int64_t *cu_dev,
                               const gdn_conv1d_args *a, void *stream);
/* Causal conv1d backward: dx, dweight (always written, zeros without
 * tokens), dbias and dh0 (each may be NULL); dh0 by a second kernel. */
gdn_status gdn_cuda_conv1d_bwd(const gdn_conv1d_config *c, int64_t N, const int64_t *cu_dev,
                               const gdn_conv1d_bwd_args *a, void *stream);
/* Single-token update of c->B rows. slots (device, may be NULL): a slot
 * outside -1..num_slots-1 is padding (y row 0, no state access). Rows that
 * share a slot apply in row order unless slots_unique (the caller promises
 * distinct slots: no scan). y may be NULL (state only). */
gdn_status gdn_cuda_conv1d_update(const gdn_conv1d_config *c, const void *x, const float *weight,
                                  const float *bias, float *state, int64_t num_slots, const int32_t *slots,
                                  int slots_unique, void *y, void *stream);
/* Gated RMSNorm forward; rstd may be NULL. */
gdn_status gdn_cuda_rmsnorm_fwd(const gdn_rmsnorm_config *c, const void *x, const void *z, const float *w,
                                void *y, float *rstd, void *stream);
/* Gated RMSNorm backward: dx, dz, dw (always written); rstd NULL = recomputed. */
gdn_status gdn_cuda_rmsnorm_bwd(const gdn_rmsnorm_config *c, const void *x, const void *z, const float *w,
                                const float *rstd, const void *dy, void *dx, void *dz, float *dw, void *stream);
/* g = -exp(A_log[j]) * softplus(a + dt_bias[j]) over a [rows, HV]; dt_bias may be NULL. */
gdn_status gdn_cuda_gate_fwd(int64_t rows, int HV, gdn_dtype t, const void *a, const float *A_log,
                             const float *dt_bias, float *g, void *stream);
/* da, dA_log (always written) and ddt_bias (may be NULL) from dg. */
gdn_status gdn_cuda_gate_bwd(int64_t rows, int HV, gdn_dtype t, const void *a, const float *A_log,
                             const float *dt_bias, const float *dg, void *da, float *dA_log, float *ddt_bias,
                             void *stream);
/* y = x * rsqrt(sum x^2 + 1e-6) per row; rstd may be NULL. */
gdn_status gdn_cuda_l2norm_fwd(int64_t rows, int dim, gdn_dtype t, const void *x, void *y, float *rstd,
                               void *stream);
/* dx = rstd (dy - y (y . dy)), y = x rstd, per row. */
gdn_status gdn_cuda_l2norm_bwd(int64_t rows, int dim, gdn_dtype t, const void *x, const float *rstd,
                               const void *dy, void *dx, void *stream);

#ifdef __cplusplus
}
#endif
#endif
