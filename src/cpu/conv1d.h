/* CPU causal depthwise conv1d (cpu/conv1d.c). Inputs are validated by
 * api/conv1d.c; N is the number of sequences (num_seqs with cu_seqlens,
 * else B). */
#ifndef GDN_CPU_CONV1D_H
#define GDN_CPU_CONV1D_H

#include "common/common.h"

/* returns nonzero when out of memory (before anything is written) */
int gdn_cpu_conv1d_fwd(int threads, const gdn_conv1d_config *c, int64_t N, const gdn_conv1d_args *a);
int gdn_cpu_conv1d_bwd(int threads, const gdn_conv1d_config *c, int64_t N, const gdn_conv1d_bwd_args *a);
/* cfg->B rows; slots already checked to lie in -1..num_slots-1 */
void gdn_cpu_conv1d_update(int threads, const gdn_conv1d_config *c, const void *x, const float *weight,
                           const float *bias, float *state, const int32_t *slots, void *y);

#endif
