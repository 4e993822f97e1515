/* Reading one (sequence, head) slice of the token-major inputs into fp32
 * working rows, with the in-kernel transforms (l2norm, gate, beta) applied.
 * Shared by the chunked, recurrent and backward CPU paths so that all of them
 * see bit-identical inputs. */
#ifndef GDN_CPU_LOAD_H
#define GDN_CPU_LOAD_H
#include "common/common.h"

/* Rows r0..r0+c-1 of q or k, head h, into dst [c, K]. With GDN_QK_L2NORM:
 * if rstd_in is given, multiply by it (backward), else compute the rstd,
 * write it to rstd_out when that is non-NULL, and normalize. */
void gdn_cpu_load_qk(const gdn_plan *p, const void *x, int64_t r0, int c, int h, float *dst,
                     const float *rstd_in, float *rstd_out);
/* v rows, value head j, into dst [c, V]. */
void gdn_cpu_load_v(const gdn_plan *p, const void *v, int64_t r0, int c, int j, float *dst);
/* Log decay g per token for value head j (0 when g is NULL); with
 * GDN_GATE_FUSED from raw a. */
void gdn_cpu_load_gate(const gdn_plan *p, const void *g, const float *A_log, const float *dt_bias,
                       int64_t r0, int c, int j, float *dst);
/* beta per token for value head j (sigmoid / 2*sigmoid applied per flags). */
void gdn_cpu_load_beta(const gdn_plan *p, const void *b, int64_t r0, int c, int j, float *dst);
/* Prefetch rows r0..r0+c-1 of q, k (head h) and v (value head j) into the
 * cache while the current chunk computes: rows are one head apart, a page
 * or more, which the hardware prefetchers do not follow. Any pointer may be
 * NULL; v-shaped rows of v are read, of o written. */
void gdn_cpu_prefetch_chunk(const gdn_plan *p, const void *q, const void *k, const void *v,
                            const void *o, int64_t r0, int c, int h, int j);
/* State of (n, j) into a k-first [K, V] fp32 matrix (zeros if src is NULL). */
void gdn_cpu_load_state(const gdn_plan *p, const float *src, int64_t n, int j, float *S);
void gdn_cpu_store_state(const gdn_plan *p, float *dst, int64_t n, int j, const float *S);

#endif
