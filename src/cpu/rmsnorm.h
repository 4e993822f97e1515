/* Gated RMSNorm on the CPU (called by api/rmsnorm.c on validated input). */
#ifndef GDN_CPU_RMSNORM_H
#define GDN_CPU_RMSNORM_H
#include "common/common.h"

/* Rows per block of the dw reduction: fixed, never derived from the thread
 * count, so dw has the same bits for every thread count. */
#define GDN_RMSNORM_ROW_BLOCK 64

/* y = x * rstd * w * gate(z) per row; rstd [rows] may be NULL.
 * Returns 0, or -1 when its scratch could not be allocated (nothing written). */
int gdn_cpu_rmsnorm_fwd(int threads, const gdn_rmsnorm_config *c, const void *x, const void *z,
                        const float *w, void *y, float *rstd);
/* dx, dz, dw; rstd NULL = recomputed. Returns 0, or -1 when its scratch could
 * not be allocated (nothing written). */
int gdn_cpu_rmsnorm_bwd(int threads, const gdn_rmsnorm_config *c, const void *x, const void *z,
                        const float *w, const float *rstd, const void *dy, void *dx, void *dz,
                        float *dw);

#endif
