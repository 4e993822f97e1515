#ifndef GDN_CPU_DECODE_H
#define GDN_CPU_DECODE_H
#include "common/common.h"
/* cfg validated, scale resolved; slots validated (range, no duplicates) */
void gdn_cpu_decode_step(int threads, const gdn_decode_config *cfg, const gdn_decode_args *a);
#endif
