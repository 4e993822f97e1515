/* Context parallel on the CPU backend (include/gdn.h, DESIGN.md §8): one
 * rank's forward and backward maps and the scans over the gathered maps.
 * The plan and arguments are validated by the API layer (src/api/cp.c). */
#ifndef GDN_CPU_CP_H
#define GDN_CPU_CP_H
#include "cpu/chunk.h"

size_t gdn_cpu_cp_fwd_map_ws(const gdn_plan *p, const gdn_cp_config *cp);
size_t gdn_cpu_cp_bwd_map_ws(const gdn_plan *p, const gdn_cp_config *cp);
void gdn_cpu_cp_fwd_map(const gdn_plan *p, const gdn_cp_config *cp, const gdn_fwd_args *a, float *map);
void gdn_cpu_cp_bwd_map(const gdn_plan *p, const gdn_cp_config *cp, const gdn_bwd_args *a, const float *fwd_map,
                        float *bmap);
void gdn_cpu_cp_fwd_scan(const gdn_plan *p, const gdn_cp_config *cp, const float *maps, float *S_in);
void gdn_cpu_cp_bwd_scan(const gdn_plan *p, const gdn_cp_config *cp, const float *maps, float *dS_out);

#endif
