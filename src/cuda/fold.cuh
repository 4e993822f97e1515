/* One step of a fold over segment (or rank) maps, for a block of 256
 * threads that owns W (8 or 16) columns of a K x V state: the chunk
 * forward's scan over its segments, the backward split's h0 and dht folds,
 * context parallel's composes and scans all walk their maps with it:
 *
 *     put(i, c, add(i, c) + sum_k A[i][k] x[k][c])   for every row i < K, column c < W,
 *
 * A = M (TRANS false) or M^T (TRANS true), M a K x K fp32 matrix in global
 * memory (row-major), x [K][W] in shared memory (16-byte aligned). M comes
 * into shared memory first (fold_ld(K) floats a row; 128 rows at a time),
 * by 16-byte cp.async where it is aligned. Where K <= 128 and the launch
 * gave room for two copies, the step is given the next step's M and copies
 * it into the other while it computes (FoldPipe): a step then waits for no
 * memory but its add terms, which each thread loads before its products
 * (at W = 8). The caller's Mnext must be the M of its next fold_step call
 * (or NULL): the next step uses the copy as it is. Which thread makes which
 * (i, c) is fold_step's (below); add and put are called by that thread.
 * Barriers: after each round's staging, before the next round's, and one
 * at the end (x may then be overwritten); every thread of the block calls
 * it. */
#pragma once
#include "cuda/common.cuh"

namespace gdn {

constexpr int FOLD_NT = 256;  /* threads per block */
constexpr int FOLD_RB = 128;  /* rows of M in shared memory at a time (K = 256 takes two rounds) */

__host__ __device__ __forceinline__ int fold_ld(int K) { return (K + 3) / 4 * 4 + 4; }
/* floats of one copy of M in shared memory */
__host__ __device__ __forceinline__ int fold_ms(int K) { return (K < FOLD_RB ? K : FOLD_RB) * fold_ld(K); }
/* shared memory of a fold kernel of W columns a block: M's copies (two
 * where pipe and K <= FOLD_RB: the next step's copied during this one),
 * then x and its next value ([K][W] each) */
__host__ __device__ __forceinline__ int fold_nbuf(int K, bool pipe) { return pipe && K <= FOLD_RB ? 2 : 1; }
template <int W> __host__ __device__ __forceinline__ int fold_floats(int K, bool pipe) {
    return fold_nbuf(K, pipe) * fold_ms(K) + 2 * K * W;
}
/* A fold launch's columns a block, W = 8 or 16: 8 where the grid at 8
 * leaves SMs idle at 16, i.e. where it is one wave of two blocks an SM (the
 * fold kernels' launch bound; their registers allow no more) */
constexpr int FOLD_PER_SM = 2;
template <typename FB> __host__ int fold_width(const FB &blocks_of_w) {
    return blocks_of_w(8) <= FOLD_PER_SM * (int64_t)sm_count() ? 8 : 16;
}
template <int W> __host__ __forceinline__ size_t fold_smem(int K, bool pipe) { return (size_t)fold_floats<W>(K, pipe) * sizeof(float); }
__device__ __forceinline__ unsigned dyn_smem_bytes() {
    unsigned r;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(r));
    return r;
}
/* whether this launch has M's second copy (read from its shared memory size) */
template <int W> __device__ __forceinline__ bool fold_piped(int K) {
    return K <= FOLD_RB && dyn_smem_bytes() >= (unsigned)(fold_floats<W>(K, true) * sizeof(float));
}
/* where x starts in a fold kernel's shared memory (M's copies first) */
template <int W> __device__ __forceinline__ float *fold_x(float *sm, int K) { return sm + (fold_piped<W>(K) ? 2 : 1) * fold_ms(K); }
/* kern (a fold kernel of W columns a block) on blocks blocks of FOLD_NT
 * threads, with room for M's second copy where the blocks are at most one
 * an SM (the copy takes a block's room), its dynamic shared memory limit
 * raised first where it needs more than 48 KiB (host, capture-safe) */
template <int W, typename Kern, typename... A> __host__ void fold_launch(Kern kern, int64_t blocks, int K, cudaStream_t st, A... args) {
    const bool pipe = blocks <= sm_count();
    const size_t smem = fold_smem<W>(K, pipe);
    if (smem > 48 * 1024) cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    kern<<<(unsigned)blocks, FOLD_NT, smem, st>>>(args...);
}

/* M's copies in shared memory across a walk's steps: which one holds the
 * current step's M, and whether it is there already (copied during the
 * step before) */
struct FoldPipe {
    float *ms0, *ms1;   /* ms1: NULL where the launch has one copy */
    bool cur, staged;   /* cur: ms1 holds this step's M */
    __device__ FoldPipe(float *sm, float *second) : ms0(sm), ms1(second), cur(false), staged(false) {}
    __device__ float *now() const { return cur ? ms1 : ms0; }
    __device__ float *next() const { return cur ? ms0 : ms1; }
};
template <int W> __device__ __forceinline__ FoldPipe make_fold_pipe(float *sm, int K) {
    return FoldPipe(sm, fold_piped<W>(K) ? sm + fold_ms(K) : nullptr);
}

namespace fold_detail {
__device__ __forceinline__ bool aligned16(const float *M, int K) { return (K & 3) == 0 && (reinterpret_cast<uintptr_t>(M) & 15) == 0; }
/* rows [rb, rb + nr) of M into Ms; columns K .. K4 zero; by cp.async (one group, not waited for) where v16 */
__device__ __forceinline__ void stage(const float *M, int K, int rb, int nr, float *Ms, bool v16) {
    const int tid = threadIdx.x, ld = fold_ld(K), K4 = (K + 3) / 4 * 4;
    if (v16) {
        for (int e = tid; e < nr * K / 4; e += FOLD_NT) {
            const int r = (4 * e) / K, q = (4 * e) % K;
            cp16(Ms + r * ld + q, M + (int64_t)rb * K + 4 * (int64_t)e, true);
        }
        cp_commit();
    } else {
        for (int e = tid; e < nr * K; e += FOLD_NT) Ms[(e / K) * ld + e % K] = M[(int64_t)rb * K + e];
    }
    for (int e = tid; e < nr * (K4 - K); e += FOLD_NT) Ms[(e / (K4 - K)) * ld + K + e % (K4 - K)] = 0.f;   /* columns to K4 */
}
}  // namespace fold_detail

/* M's rows [rb, rb + nr) in shared memory for this round (the copy made
 * during the step before, or staged now), then the next step's M into the
 * other buffer where the launch has it (read last by the step before, which
 * ended at a barrier) */
__device__ __forceinline__ float *fold_round(FoldPipe &fp, const float *M, const float *Mnext, int K, int rb, int nr, bool v16) {
    float *Ms = fp.now();
    if (fp.staged) {
        cp_wait_all();
    } else {
        if (rb) __syncthreads();   /* the previous round's Ms no longer read */
        fold_detail::stage(M, K, rb, nr, Ms, v16);
        if (v16) cp_wait_all();
    }
    __syncthreads();
    fp.staged = false;
    if (Mnext && fp.ms1 && fold_detail::aligned16(Mnext, K)) {
        fold_detail::stage(Mnext, K, 0, K, fp.next(), true);
        fp.staged = true;
    }
    return Ms;
}

/* Mnext: the next step's M (or NULL), copied into the other buffer during
 * this step where K <= FOLD_RB and it is aligned. add(i, c) and put(i, c,
 * value) take row i and column c < W; each (i, c) is one thread's, once.
 * M^T (TRANS): a thread makes four rows of column tid % W (again every
 * 4 * 256 / W rows), four consecutive rows at one k being one 16-byte read
 * of Ms. M: a thread makes one row (tid / 2, again every 128 rows) and W / 2
 * columns (tid % 2 picks the half), each element of M read from shared
 * memory twice a block (where four rows a column had read it W times). Every
 * sum runs over k in the same order either way: k in fours, each four as
 * fma(m0, x0, fma(m1, x1, fma(m2, x2, fma(m3, x3, acc)))). */
template <int W, bool TRANS, typename FA, typename FP>
__device__ __forceinline__ void fold_step(FoldPipe &fp, const float *M, const float *Mnext, int K, const float *x, const FA &add,
                                          const FP &put) {
    const int tid = threadIdx.x, ld = fold_ld(K), K4 = (K + 3) / 4 * 4;
    const bool v16 = fold_detail::aligned16(M, K);
    if constexpr (TRANS) {
        constexpr int RS = 4 * FOLD_NT / W;   /* rows the block's threads make in one sweep (four each) */
        constexpr int NG = 256 / RS;          /* the thread's groups of four rows, K <= 256 */
        static_assert(FOLD_RB % RS == 0, "a round is whole sweeps");
        const int c = tid % W, rg = tid / W;
        /* the add terms first where a thread has few rows (W = 8): their loads
         * in flight under the products; at W = 16 their 16 registers would spill */
        constexpr bool EARLY = NG <= 2;
        float a[NG][4] = {}, ad[NG][4] = {};
#pragma unroll
        for (int g = 0; g < NG; g++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const int i = 4 * rg + RS * g + r;
                if (EARLY && i < K) ad[g][r] = add(i, c);
            }
        for (int rb = 0; rb < K; rb += FOLD_RB) {   /* A[i][k] = M[k][i]: this round's k, every row i */
            const int nr = K - rb < FOLD_RB ? K - rb : FOLD_RB;
            const float *Ms = fold_round(fp, M, Mnext, K, rb, nr, v16);
#pragma unroll
            for (int g = 0; g < NG; g++) {
                const int i0 = 4 * rg + RS * g;
                if (i0 >= K) break;
#pragma unroll 4
                for (int k = 0; k < nr; k++) {
                    const float4 m = *reinterpret_cast<const float4 *>(Ms + k * ld + i0);
                    const float xk = x[(rb + k) * W + c];
                    a[g][0] = fmaf(m.x, xk, a[g][0]); a[g][1] = fmaf(m.y, xk, a[g][1]);
                    a[g][2] = fmaf(m.z, xk, a[g][2]); a[g][3] = fmaf(m.w, xk, a[g][3]);
                }
            }
        }
#pragma unroll
        for (int g = 0; g < NG; g++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const int i = 4 * rg + RS * g + r;
                if (i < K) put(i, c, (EARLY ? ad[g][r] : add(i, c)) + a[g][r]);
            }
    } else {
        constexpr int CH = W / 2;                 /* the thread's columns */
        constexpr int NG = 256 / (FOLD_NT / 2);   /* its rows, K <= 256: one a round */
        static_assert(FOLD_RB == FOLD_NT / 2, "a round is one sweep of rows");
        const int c0 = (tid & 1) * CH, r = tid >> 1;
        constexpr bool EARLY = NG * CH <= 8;
        float ad[NG][CH] = {};
#pragma unroll
        for (int g = 0; g < NG; g++)
#pragma unroll
            for (int q = 0; q < CH; q++) {
                const int i = r + FOLD_RB * g;
                if (EARLY && i < K) ad[g][q] = add(i, c0 + q);
            }
        float a[NG][CH] = {};
#pragma unroll
        for (int g = 0; g < NG; g++) {   /* round g: the thread's row in it, every k */
            const int rb = FOLD_RB * g;
            if (rb >= K) break;
            const int nr = K - rb < FOLD_RB ? K - rb : FOLD_RB;
            const float *Ms = fold_round(fp, M, Mnext, K, rb, nr, v16);
            if (r < nr) {
                float b[CH];
#pragma unroll
                for (int q = 0; q < CH; q++) b[q] = 0.f;
#pragma unroll 2
                for (int k = 0; k < K4; k += 4) {
                    const float4 m = *reinterpret_cast<const float4 *>(Ms + r * ld + k);
                    float xv[4][CH];
#pragma unroll
                    for (int e = 0; e < 4; e++)
#pragma unroll
                        for (int q = 0; q < CH; q += 4) {
                            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
                            if (k + e < K) v = *reinterpret_cast<const float4 *>(x + (k + e) * W + c0 + q);
                            xv[e][q] = v.x; xv[e][q + 1] = v.y; xv[e][q + 2] = v.z; xv[e][q + 3] = v.w;
                        }
#pragma unroll
                    for (int q = 0; q < CH; q++) b[q] = fmaf(m.x, xv[0][q], fmaf(m.y, xv[1][q], fmaf(m.z, xv[2][q], fmaf(m.w, xv[3][q], b[q]))));
                }
#pragma unroll
                for (int q = 0; q < CH; q++) a[g][q] = b[q];
            }
        }
#pragma unroll
        for (int g = 0; g < NG; g++)
#pragma unroll
            for (int q = 0; q < CH; q++) {
                const int i = r + FOLD_RB * g;
                if (i < K) put(i, c0 + q, (EARLY ? ad[g][q] : add(i, c0 + q)) + a[g][q]);
            }
    }
    if (fp.staged) fp.cur = !fp.cur;
    __syncthreads();
}

}  // namespace gdn
