/* The CPU backend's entry points, as the API layer calls them: the plan and
 * arguments are validated (src/api/); these only compute. */
#ifndef GDN_CPU_BACKEND_H
#define GDN_CPU_BACKEND_H
#include "common/common.h"

size_t gdn_cpu_chunk_fwd_ws(const gdn_plan *p);
size_t gdn_cpu_chunk_bwd_ws(const gdn_plan *p);
void gdn_cpu_chunk_fwd(const gdn_plan *p, const gdn_fwd_args *a);
void gdn_cpu_chunk_bwd(const gdn_plan *p, const gdn_bwd_args *a);
void gdn_cpu_recurrent_fwd(const gdn_plan *p, const gdn_fwd_args *a);
void gdn_cpu_gate_fwd(int threads, int64_t rows, int HV, gdn_dtype t, const void *a,
                      const float *A_log, const float *dt_bias, float *g);
void gdn_cpu_gate_bwd(int threads, int64_t rows, int HV, gdn_dtype t, const void *a,
                      const float *A_log, const float *dt_bias, const float *dg,
                      void *da, float *dA_log, float *ddt_bias);
void gdn_cpu_l2norm_fwd(int threads, int64_t rows, int dim, gdn_dtype t, const void *x,
                        void *y, float *rstd);
void gdn_cpu_l2norm_bwd(int threads, int64_t rows, int dim, gdn_dtype t, const void *x,
                        const float *rstd, const void *dy, void *dx);

#endif
