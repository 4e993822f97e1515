/* Small dense matrix products for the CPU chunk kernels (row-major fp32). */
#ifndef GDN_CPU_GEMM_H
#define GDN_CPU_GEMM_H
#include <stdint.h>

/* C[M,N] = alpha * op(A)[M,Kd] * op(B)[Kd,N] + (accumulate ? C : 0)
 * op(A)[i][p] = ta ? A[p*lda + i] : A[i*lda + p]; likewise op(B)[p][j] with tb.
 * Single-threaded; the callers parallelise over heads and sequences. */
void gdn_gemm(int M, int N, int Kd, float alpha,
              const float *A, int64_t lda, int ta,
              const float *B, int64_t ldb, int tb,
              int accumulate, float *C, int64_t ldc);

#endif
