/* The GDN layer ops on the CUDA backend (cuda/conv1d.cu, rmsnorm.cu, gate.cu,
 * l2norm.cu) as the API layer sees them: C entry points, device pointers,
 * the caller's stream, inputs already validated. Nothing is allocated and the
 * host never waits. Each returns GDN_OK or GDN_ERR_BACKEND (launch failure,
 * message set). */
#ifndef GDN_CUDA_LAYER_H
#define GDN_CUDA_LAYER_H
#include "internal.h"
#ifdef __cplusplus
extern "C" {
#endif

/* Causal conv1d forward; N sequences; cu_dev: cu_seqlens in device memory
 * (read only when c->cu_seqlens is set). ht is written after y by a second
 * kernel, so ht may be h0 (in place). */
gdn_status gdn_cuda_conv1d_fwd(const gdn_conv1d_config *c, int64_t N, const int64_t *cu_dev,
                               const gdn_conv1d_args *a, void *stream);
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
/* g = -exp(A_log[j]) * softplus(a + dt_bias[j]) over a [rows, HV]; dt_bias may be NULL. */
gdn_status gdn_cuda_gate_fwd(int64_t rows, int HV, gdn_dtype t, const void *a, const float *A_log,
                             const float *dt_bias, float *g, void *stream);
/* y = x * rsqrt(sum x^2 + 1e-6) per row; rstd may be NULL. */
gdn_status gdn_cuda_l2norm_fwd(int64_t rows, int dim, gdn_dtype t, const void *x, void *y, float *rstd,
                               void *stream);

#ifdef __cplusplus
}
#endif
#endif
