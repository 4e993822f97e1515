/* Block products of fp32 operands on the tensor cores (mma.sync m16n8k8 tf32),
 * for kernels whose tiles sit in shared memory in fp32: the chunk backward.
 *
 * warp_mma_s and block_mm_s take their operands as arrays, by ldmatrix where
 * they can; the result goes to an epilogue epi(i, n, value) (warp_store).
 * SPLIT runs each product as three tf32 products (3xTF32: hi*hi + hi*lo +
 * lo*hi, x = hi + lo with both halves tf32), which keeps fp32 accuracy (about
 * 2^-22 relative per product) for f32 inputs; without it one tf32 rounding
 * (2^-11) per operand, enough for bf16 / f16 inputs.
 *
 * Scalar fragment reads: for no bank conflicts an array read along k in
 * consecutive addresses (X[i*ld + k]) wants ld = 4 mod 32; one read across
 * k (X[k*ld + i]) wants ld = 8 mod 32. */
#pragma once
#include <stdint.h>
#include "cuda/common.cuh"

namespace gdn {

__device__ __forceinline__ uint32_t to_tf32(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

/* not volatile: a pure function of its operands (the accumulator's in/out
 * constraints carry the order of one tile's products), so the compiler may
 * interleave the independent products of several tiles and k steps instead
 * of waiting out each one's latency in program order */
__device__ __forceinline__ void mma_tf32(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* the epilogue of one warp tile: epi(i, n, v) for i < M, n < N */
template <typename FE>
__device__ __forceinline__ void warp_store(const float (&acc)[4][4], int i0, int n0, int nt, int M, int N, const FE &epi) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        if (j >= nt) break;
        const int n = n0 + 8 * j + 2 * t;
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const int i = i0 + g + (r >> 1) * 8, nn = n + (r & 1);
            if (i < M && nn < N) epi(i, nn, acc[j][r]);
        }
    }
}

/* krange of block_mm_s that keeps the whole k range */
struct full_k {
    __device__ __forceinline__ void operator()(int, int *, int *) const {}
};

/* ---- products fed from shared fp32 arrays by pointer ----
 *
 * warp_mma_s: one warp, acc[j] += A[i0:i0+16, k0:k1] B[k0:k1, n0+8j :
 * n0+8j+8] (acc[j][0..3] holds (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)
 * of the 16 x 8 tile j, g = lane / 4, t = lane % 4), A(i, k) =
 * A[i*lda + k] (AT false: "row", fragments by one ldmatrix.x4 per k step) or
 * A[k*lda + i] (AT true: four scalar loads); B(k, n) = B[n*ldb + k] (BK
 * false: "NK", one ldmatrix.x4 per two n tiles) or B[k*ldb + n] (BK true:
 * two scalar loads per n tile). ldmatrix moves 8 rows of 16 bytes per
 * matrix, which for fp32 data are the 8 x 4 blocks a tf32 fragment is made
 * of (lane l gets row l / 4, word l % 4): ld % 4 == 0 and the arrays 16-byte
 * aligned; ld = 4 mod 32 reads them without bank conflicts.
 *
 * Without SPLIT the operands go to the tensor cores as they are: the unit
 * reads the top 19 bits of each word, so arrays meant for it should hold
 * values already rounded to tf32 (tf32r; otherwise they are truncated).
 * With SPLIT every fragment is cut into hi + lo (3xTF32), each tile's lo
 * products before its hi * hi, but an operand marked exact (AX, BX: its values are tf32 already, as bf16
 * and f16 inputs are) has no lo part, and its lo product is skipped (two
 * products instead of three). NT n tiles of 8 (2 or 4); k0, k1 multiples
 * of 8. */
__device__ __forceinline__ float tf32r(float x) { return __uint_as_float(to_tf32(x)); }
template <bool SPLIT> __device__ __forceinline__ float tf32r_if(float x) { return SPLIT ? x : tf32r(x); }

template <bool SPLIT, bool AT, bool BK, int NT, bool AX = false, bool BX = false>
__device__ __forceinline__ void warp_mma_s(float (&acc)[4][4], const float *A, int lda, const float *B, int ldb, int i0, int n0, int k0,
                                           int k1) {
    static_assert(NT == 2 || NT == 4, "two or four n tiles");
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const float *pa = AT ? A + t * lda + i0 + g : A + (i0 + (lane & 7) + ((lane >> 3) & 1) * 8) * lda + (lane >> 4) * 4;
    const float *pb = BK ? B + t * ldb + n0 + g : B + (n0 + (lane & 7) + ((lane >> 4) & 1) * 8) * ldb + ((lane >> 3) & 1) * 4;
#pragma unroll 2
    for (int k = k0; k < k1; k += 8) {
        uint32_t a[4], b[NT][2];
        if (AT) {
            const float *q = pa + k * lda;
            a[0] = __float_as_uint(q[0]); a[1] = __float_as_uint(q[8]);
            a[2] = __float_as_uint(q[4 * lda]); a[3] = __float_as_uint(q[4 * lda + 8]);
        } else {
            ldsm4(a, pa + k);
        }
        if (BK) {
            const float *q = pb + k * ldb;
#pragma unroll
            for (int j = 0; j < NT; j++) { b[j][0] = __float_as_uint(q[8 * j]); b[j][1] = __float_as_uint(q[4 * ldb + 8 * j]); }
        } else {
#pragma unroll
            for (int j = 0; j < NT; j += 2) {
                uint32_t r[4];
                ldsm4(r, pb + 8 * j * ldb + k);
                b[j][0] = r[0]; b[j][1] = r[1]; b[j + 1][0] = r[2]; b[j + 1][1] = r[3];
            }
        }
        if (SPLIT) {
            uint32_t ah[4], al[4];
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const float x = __uint_as_float(a[r]);
                ah[r] = AX ? a[r] : to_tf32(x);
                if (!AX) al[r] = to_tf32(x - __uint_as_float(ah[r]));
            }
            /* each tile's products in the order lo terms, then hi * hi, the tiles in turn at each */
            uint32_t bh[NT][2], bl[NT][2];
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float x = __uint_as_float(b[j][e]);
                    bh[j][e] = BX ? b[j][e] : to_tf32(x);
                    if (!BX) bl[j][e] = to_tf32(x - __uint_as_float(bh[j][e]));
                }
            if (!AX)
#pragma unroll
                for (int j = 0; j < NT; j++) mma_tf32(acc[j], al, bh[j][0], bh[j][1]);
            if (!BX)
#pragma unroll
                for (int j = 0; j < NT; j++) mma_tf32(acc[j], ah, bl[j][0], bl[j][1]);
#pragma unroll
            for (int j = 0; j < NT; j++) mma_tf32(acc[j], ah, bh[j][0], bh[j][1]);
        } else {
#pragma unroll
            for (int j = 0; j < NT; j++) mma_tf32(acc[j], a, b[j][0], b[j][1]);
        }
    }
}

/* C[M, N] = A[M, Kd] B[Kd, N] with its operands as arrays (warp_mma_s)
 * over the block's warps in 16 x 32 tiles dealt round robin, N a multiple
 * of 32, epi(i, n, C_in) for every i < M, n < N. krange(i0, &k0, &k1)
 * narrows the k range of the 16 rows from i0 (triangular operands; full_k
 * keeps it); k0, k1 multiples of 8, the arrays zero outside what they hold
 * up to M rounded up to 16 and Kd rounded up to 8. Every warp of the block
 * calls it; no barrier inside. */
template <bool SPLIT, bool AT, bool BK, bool AX = false, bool BX = false, typename FE, typename FK>
__device__ __forceinline__ void block_mm_s(int M, int N, int Kd, const float *A, int lda, const float *B, int ldb, const FE &epi,
                                           const FK &krange) {
    const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int mt = (M + 15) >> 4, ntile = N >> 5, kd8 = (Kd + 7) & ~7;
    for (int task = warp; task < mt * ntile; task += nw) {
        const int i0 = (task / ntile) * 16, n0 = (task % ntile) * 32;
        float acc[4][4] = {};
        int k0 = 0, k1 = kd8;
        krange(i0, &k0, &k1);
        if (k1 > kd8) k1 = kd8;
        warp_mma_s<SPLIT, AT, BK, 4, AX, BX>(acc, A, lda, B, ldb, i0, n0, k0, k1);
        warp_store(acc, i0, n0, 4, M, N, epi);
    }
}

}  // namespace gdn
