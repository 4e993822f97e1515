/* Helpers shared by the CUDA kernels: the SM count, the sequence split's
 * rule and a programmatic dependent launch (host), dtype loads and stores, the gate, block reductions, the
 * shared-memory primitives (ldmatrix, cp.async). */
#pragma once
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <utility>
#include "common/common.h"

namespace gdn {

/* the card's SM count, asked once (host) */
inline int sm_count() {
    static int n = 0;
    if (!n) {
        int d = 0;
        if (cudaGetDevice(&d) != cudaSuccess || cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, d) != cudaSuccess || n <= 0)
            n = 132;
    }
    return n;
}

/* kernel k on stream st as a programmatic dependent of the stream's kernel
 * before it: its launch and prologue overlap that kernel's tail (k waits for
 * it with griddepcontrol.wait before reading what it wrote) */
template <typename... P, typename... A>
cudaError_t launch_dependent(void (*k)(P...), unsigned blocks, int threads, size_t smem, cudaStream_t st, A &&...args) {
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t lc = {};
    lc.gridDim = dim3(blocks);
    lc.blockDim = dim3(threads);
    lc.dynamicSmemBytes = smem;
    lc.stream = st;
    lc.attrs = at;
    lc.numAttrs = 1;
    return cudaLaunchKernelEx(&lc, k, std::forward<A>(args)...);
}

/* chunks per segment of the sequence split (DESIGN §8) of a walk of `blocks`
 * blocks (sequence x value head x column block) over chunks of 64 tokens;
 * 0 = no split: only where the blocks would leave most SMs idle (2 x blocks
 * <= SMs, 16 or more chunks) or when asked (exec.seq_split > 1; 1 = never).
 * The chunk forward and backward each pass their own block count, and the
 * blocks that run at once (the SMs, or fewer where the walk's blocks come in
 * clusters: whole clusters must fit a GPC). */
inline int split_chunks(const gdn_plan *pl, int64_t blocks, int64_t at_once) {
    const int64_t maxch = (pl->max_len + 63) / 64;
    int64_t want;
    if (pl->seq_split == 1 || maxch < 2) return 0;
    if (pl->seq_split > 1) want = pl->seq_split;
    else {
        if (2 * blocks > at_once || maxch < 16) return 0;
        want = at_once / blocks;
    }
    int64_t sc = (maxch + want - 1) / want;
    if (pl->seq_split == 0 && sc < 8) sc = 8;
    return sc >= maxch ? 0 : (int)sc;
}

/* Longest first: where a walk's blocks (a sequence's value heads and column
 * blocks, each walking all of its chunks) run in more than one wave and the
 * sequences differ in length, taking them longest first fills the waves
 * better (the greedy list schedule's makespan with the longest jobs first):
 * varlen's 8 sequences of 31-89 chunks, 256 blocks on 132 SMs, 151 chunk
 * steps in the caller's order, 140 longest first, 125 the mean. The number
 * of sequences to rank (2 to 64: each block ranks them itself, longest_at),
 * or 0 (the caller's order): with cu_seqlens only, and where the walk's
 * blocks (blocks_per_seq a sequence) exceed what runs at once. Which SM runs
 * which sequence changes no bit. */
inline int longest_first(const gdn_plan *pl, int64_t blocks_per_seq, int64_t at_once) {
    if (!pl->c.cu_seqlens || pl->N < 2 || pl->N > 64 || pl->N * blocks_per_seq <= at_once) return 0;
    for (int64_t n = 1; n < pl->N; n++)
        if (pl->c.cu_seqlens[n + 1] - pl->c.cu_seqlens[n] != pl->c.cu_seqlens[1] - pl->c.cu_seqlens[0]) return (int)pl->N;
    return 0;
}
/* the sequence of rank r (0: the longest; ties by index) among the first n
 * of cu (device cu_seqlens), by one warp: every lane of it calls this with
 * the same r, and each lane ranks sequences lane and lane + 32 against all n */
__device__ __forceinline__ int longest_at(const int64_t *cu, int n, int r) {
    const int lane = threadIdx.x & 31;
    int found = 0;
    for (int b = 0; b < n; b += 32) {
        const int s = b + lane;
        int rank = -1;
        if (s < n) {
            const int64_t ls = cu[s + 1] - cu[s];
            rank = 0;
            for (int m = 0; m < n; m++) {
                const int64_t lm = cu[m + 1] - cu[m];
                rank += lm > ls || (lm == ls && m < s);
            }
        }
        const unsigned hit = __ballot_sync(0xffffffffu, rank == r);
        if (hit) found = b + __ffs(hit) - 1;
    }
    return found;
}

__device__ __forceinline__ float ld(const void *p, int64_t i, int dt) {
    if (dt == 0) return static_cast<const float *>(p)[i];
    const unsigned short h = static_cast<const unsigned short *>(p)[i];
    if (dt == 1) return __uint_as_float(static_cast<unsigned>(h) << 16);
    return __half2float(__ushort_as_half(h));
}

__device__ __forceinline__ void st(void *p, int64_t i, float v, int dt) {
    if (dt == 0) static_cast<float *>(p)[i] = v;
    else if (dt == 1) static_cast<unsigned short *>(p)[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
    else static_cast<unsigned short *>(p)[i] = __half_as_ushort(__float2half_rn(v));
}

__device__ __forceinline__ float softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }
__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* sum over the block; red holds >= 32 floats; every thread gets the total */
__device__ __forceinline__ float block_sum(float v, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.f;
    return warp_sum(v);
}

/* x[0..n) *= rsqrt(sum x^2 + 1e-6), x in shared memory; returns the rstd */
__device__ __forceinline__ float l2norm_shared(float *x, int n, float *red) {
    float ss = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += x[i] * x[i];
    const float r = rsqrtf(block_sum(ss, red) + 1e-6f);
    for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] *= r;
    __syncthreads();
    return r;
}

/* ---- shared memory: its addresses, ldmatrix (8 x 8 b16 matrices: lane l
 * gives the address of row l % 8 of matrix l / 8 and gets row l / 4, 32-bit
 * word l % 4 of each), cp.async ---- */
__device__ __forceinline__ uint32_t saddr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void ldsm4(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(saddr(p)));
}
__device__ __forceinline__ void ldsm2(uint32_t r[2], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(saddr(p)));
}
__device__ __forceinline__ void ldsm4t(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(saddr(p)));
}

__device__ __forceinline__ void cp16(void *dst, const void *src, bool full) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(saddr(dst)), "l"(src), "r"(full ? 16 : 0));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
/* a named barrier of n threads (a multiple of 32): warp-specialized kernels' handoffs */
__device__ __forceinline__ void bar_named(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
/* a producer's arrival at named barrier id (its prior shared-memory writes then seen by the threads its bar_named releases) */
__device__ __forceinline__ void bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void cp_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

}  // namespace gdn
