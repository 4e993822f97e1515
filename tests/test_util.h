/* Shared helpers of the gdn test program: random numbers, dtype rounding,
 * poisoning, comparison against the float64 reference, pass/fail counting. */
#ifndef GDN_TEST_UTIL_H
#define GDN_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include "gdn.h"

/* ---- counters and reporting ---- */
extern long g_passed, g_failed;
extern int g_quick;     /* GDN_TEST_QUICK set: lighter sweep */
extern int g_verbose;   /* GDN_TEST_VERBOSE set: print every check */
extern uint64_t g_base_seed;

/* Count one check; on failure print "FAIL <ctx>: <msg>". Returns ok. */
int check(int ok, const char *ctx, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* ---- random numbers (splitmix64 seeded xoshiro256**) ---- */
typedef struct rng { uint64_t s[4]; } rng;
void rng_seed(rng *r, uint64_t seed);
uint64_t rng_u64(rng *r);
double rng_uniform(rng *r);               /* [0, 1) */
double rng_normal(rng *r);                /* N(0, 1) */
int64_t rng_int(rng *r, int64_t lo, int64_t hi);  /* [lo, hi] */
uint64_t mix_seed(uint64_t base, uint64_t salt);

/* ---- dtypes ---- */
uint16_t t_f32_to_bf16(float f);
float t_bf16_to_f32(uint16_t h);
uint16_t t_f32_to_f16(float f);
float t_f16_to_f32(uint16_t h);
size_t t_dsize(gdn_dtype t);
/* round f to dtype t, store element i of buffer p; returns the stored value */
double t_store(gdn_dtype t, void *p, size_t i, float f);
double t_get(gdn_dtype t, const void *p, size_t i);
void t_poison_nan(gdn_dtype t, void *p, size_t n);
void *t_alloc(size_t bytes);                        /* never NULL, even for 0 bytes */
const char *t_dtype_name(gdn_dtype t);
void flags_str(unsigned flags, char *buf, size_t n);

/* ---- comparison ----
 * rel = ||out - ref||_F / ||ref||_F (absolute error when ||ref|| < 1e-9, 1e-4 for f16);
 * fails on any non-finite element of out. Counts one check. */
int check_close(const char *ctx, const char *what, gdn_dtype t, const void *out,
                const double *ref, size_t n, double bound);
/* The same check for an output that is a sum whose terms can cancel
 * (docs/DESIGN.md §5): terms2[i] is the squared L2 norm of the terms summed
 * into ref[i], and the error is measured against the larger of the two,
 *   sqrt(sum_i (out_i - ref_i)^2) / sqrt(sum_i max(ref_i^2, terms2_i)).
 * For a sum of random-signed terms the two are alike, so the bound is as
 * tight as check_close's; it gives only where the sum cancelled by chance.
 * terms2 NULL: check_close. */
int check_close_terms(const char *ctx, const char *what, gdn_dtype t, const void *out,
                      const double *ref, const double *terms2, size_t n, double bound);
/* that error of a double array, without counting a check (INFINITY when any
 * element is not finite): used to show that a wrong result fails the bound */
double terms_err_d(const double *out, const double *ref, const double *terms2, size_t n);
/* same, for a double array (reference self-checks) */
double rel_err_d(const double *a, const double *ref, size_t n, int *nonfinite);
/* dA_log and ddt_bias are sums over the tokens of the fused gate (ng = rows
 * * HV, HV <= 64) of the backward's own da: dA_log_j = sum_t dg_t g_t with
 * dg_t = da_t / g'_t, ddt_bias_j = sum_t da_t. When the decays are ~1 those
 * terms cancel, and a chunked backward forms each dg_t from chunk-scale terms
 * that cancel further, so no per-token bound against the reference holds.
 * They are checked in two parts: (1) against the same sums of the backend's
 * da output (check_gate_sums: bound 8u of da's dtype, relative to the terms),
 * tight, and (2) against the reference, with the per-token terms plus what
 * da's own bound lets through (gate_param_terms2; a the raw gate input,
 * dt_bias or NULL, da the reference's dL/da). Together with da's check
 * against the reference they are complete. */
void gate_param_terms2(size_t ng, int HV, const double *a, const double *dt_bias, const double *da, double *dA_t2, double *ddt_t2);
/* the sums of (1) over the tokens whose row (i / HV) skip does not mark (skip NULL: all) */
void gate_param_sums(size_t ng, int HV, const double *a, const double *dt_bias, gdn_dtype gdt, const void *da,
                     const unsigned char *skip, double *dA, double *ddt, double *dA_t2, double *ddt_t2);
double bound_gate_sums(gdn_dtype gdt);
int check_gate_sums(const char *ctx, size_t ng, int HV, const double *a, const double *dt_bias, gdn_dtype gdt,
                    const void *da, const float *dA_log, const float *ddt_bias);

/* bounds of DESIGN.md §5 */
double bound_fwd(gdn_dtype t);
double bound_grad(gdn_dtype t);

/* ---- test groups ---- */
void test_ref_selfcheck(void);
void test_backend(void);
void test_standalone(void);
void test_errors(void);
void test_conv1d(void);
void test_rmsnorm(void);
void test_decode(void);
void test_cp(void);
void test_cuda(void);

#endif
