/* One step of a fold over segment (or rank) maps, for a block of 256
 * threads that owns 16 columns of a K x V state: the chunk forward's scan
 * over its segments, the backward split's h0 and dht folds, context
 * parallel's composes and scans all walk their maps with it:
 *
 *     put(i, add(i) + sum_k A[i][k] x[k][c])   for every row i < K,
 *
 * A = M (TRANS false) or M^T (TRANS true), M a K x K fp32 matrix in global
 * memory (row-major), x [K][16] in shared memory, c = threadIdx.x % 16 the
 * thread's column. M first comes into shared memory (Ms, fold_ld(K) floats
 * a row; 128 rows at a time), by 16-byte cp.async where it is aligned: one
 * memory round trip a step instead of one per handful of the K^2 / 16
 * scalar loads each thread made from global memory. A thread then makes four rows of its
 * column (again every 64 rows): with M^T four consecutive rows at one k
 * are one 16-byte read of Ms; with M each row is read 4 k at a time.
 * Barriers: after each round's staging, before the next round's, and one
 * at the end (x may then be overwritten); every thread of the block calls
 * it. */
#pragma once
#include "cuda/common.cuh"

namespace gdn {

constexpr int FOLD_W = 16;    /* state columns per block */
constexpr int FOLD_NT = 256;  /* threads per block */
constexpr int FOLD_RB = 128;  /* rows of M in shared memory at a time (K = 256 takes two rounds) */

__host__ __device__ __forceinline__ int fold_ld(int K) { return (K + 3) / 4 * 4 + 4; }
/* shared memory of a fold kernel: Ms, then x and its next value ([K][16] each) */
__host__ __forceinline__ size_t fold_smem(int K) {
    return ((size_t)(K < FOLD_RB ? K : FOLD_RB) * fold_ld(K) + 2 * (size_t)K * FOLD_W) * sizeof(float);
}
/* where x starts in a fold kernel's shared memory (Ms first) */
__device__ __forceinline__ float *fold_x(float *sm, int K) { return sm + (K < FOLD_RB ? K : FOLD_RB) * fold_ld(K); }
/* the kernel's dynamic shared memory limit raised where it needs more than 48 KiB (host, capture-safe) */
template <typename Kern> cudaError_t fold_attr(Kern k, int K) {
    return fold_smem(K) > 48 * 1024 ? cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fold_smem(K))
                                    : cudaSuccess;
}

template <bool TRANS, typename FA, typename FP>
__device__ __forceinline__ void fold_step(const float *M, int K, const float *x, float *Ms, const FA &add, const FP &put) {
    const int tid = threadIdx.x, ld = fold_ld(K), K4 = (K + 3) / 4 * 4, c = tid % FOLD_W, rg = tid / FOLD_W;
    constexpr int NG = 256 / 64;   /* the thread's groups of four rows, K <= 256 */
    float a[NG][4] = {};
    const bool v16 = (K & 3) == 0 && (reinterpret_cast<uintptr_t>(M) & 15) == 0;
    for (int rb = 0; rb < K; rb += FOLD_RB) {
        const int nr = K - rb < FOLD_RB ? K - rb : FOLD_RB;
        if (rb) __syncthreads();   /* the previous round's Ms no longer read */
        if (v16) {
            for (int e = tid; e < nr * K / 4; e += FOLD_NT) {
                const int r = (4 * e) / K, q = (4 * e) % K;
                cp16(Ms + r * ld + q, M + (int64_t)rb * K + 4 * (int64_t)e, true);
            }
            cp_commit();
            cp_wait_all();
        } else {
            for (int e = tid; e < nr * K; e += FOLD_NT) Ms[(e / K) * ld + e % K] = M[(int64_t)rb * K + e];
        }
        for (int e = tid; e < nr * (K4 - K); e += FOLD_NT) Ms[(e / (K4 - K)) * ld + K + e % (K4 - K)] = 0.f;   /* columns to K4 */
        __syncthreads();
        if (TRANS) {   /* A[i][k] = M[k][i]: this round's k, every row i */
#pragma unroll
            for (int g = 0; g < NG; g++) {
                const int i0 = 4 * rg + 64 * g;
                if (i0 >= K) break;
#pragma unroll 4
                for (int k = 0; k < nr; k++) {
                    const float4 m = *reinterpret_cast<const float4 *>(Ms + k * ld + i0);
                    const float xk = x[(rb + k) * FOLD_W + c];
                    a[g][0] = fmaf(m.x, xk, a[g][0]); a[g][1] = fmaf(m.y, xk, a[g][1]);
                    a[g][2] = fmaf(m.z, xk, a[g][2]); a[g][3] = fmaf(m.w, xk, a[g][3]);
                }
            }
        } else {       /* this round's rows i, every k */
#pragma unroll
            for (int g = 0; g < NG; g++) {
                const int i0 = rb + 4 * rg + 64 * g;
                if (i0 >= rb + nr) break;
                float b[4] = {0.f, 0.f, 0.f, 0.f};
                for (int k = 0; k < K4; k += 4) {
                    const float x0 = x[k * FOLD_W + c], x1 = k + 1 < K ? x[(k + 1) * FOLD_W + c] : 0.f,
                                x2 = k + 2 < K ? x[(k + 2) * FOLD_W + c] : 0.f, x3 = k + 3 < K ? x[(k + 3) * FOLD_W + c] : 0.f;
#pragma unroll
                    for (int r = 0; r < 4; r++) {
                        const int ri = i0 + r < rb + nr ? i0 + r - rb : 0;
                        const float4 m = *reinterpret_cast<const float4 *>(Ms + ri * ld + k);
                        b[r] = fmaf(m.x, x0, fmaf(m.y, x1, fmaf(m.z, x2, fmaf(m.w, x3, b[r]))));
                    }
                }
#pragma unroll
                for (int r = 0; r < 4; r++)
                    if (i0 + r < rb + nr) put(i0 + r, add(i0 + r) + b[r]);
            }
        }
    }
    if (TRANS) {
#pragma unroll
        for (int g = 0; g < NG; g++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const int i = 4 * rg + 64 * g + r;
                if (i < K) put(i, add(i) + a[g][r]);
            }
    }
    __syncthreads();
}

}  // namespace gdn
