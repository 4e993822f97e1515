/* CUDA chunk forward on tensor cores (bf16 / f16 inputs; f32 inputs take the
 * exact recurrent kernel, since bf16 products cannot meet the f32 bound).
 * Per chunk of C = 64 tokens, with gc the gate's cumsum inside the chunk and
 * q, k raw (their rstd scale rows and columns of the products):
 *
 *   A  = strict_tril(diag(beta) K K^T * exp(gc_t - gc_s))   fp32
 *   T  = (I + A)^-1      16x16 diagonal blocks by substitution, the rest by
 *                        three levels of tf32 block products
 *   P  = tril(Q K^T * exp(gc_t - gc_s)) * scale
 *   R  = diag(beta) (V - diag(exp gc) K S)                  (the residual first,
 *   U  = T R                                                 as on the CPU)
 *   O  = diag(scale exp gc) Q S + P U
 *   S  = exp(gL) S + K^T diag(exp(gL - gc)) U
 *
 * Two kernels. The prep kernel, one block per (sequence, chunk, q/k head),
 * forms A and T, which do not depend on the state: the whole grid runs at once
 * and its latency-bound inverse hides behind other blocks. It leaves T, gc,
 * beta, the q and k rstd and their products in a workspace record per (chunk,
 * value head). The state kernel, one block per (sequence, value head, 128
 * columns of V), walks the chunks with its state slice in fp32 registers,
 * fetching chunks ahead by the TMA while it computes. It comes in two forms:
 *
 * - transposed (K = 128, whole 128-column blocks of V, TMA-able tensors): S^T
 *   in the registers of two warpgroups is the A operand of every state
 *   product, straight from registers; q, k, T and P are the B operands in
 *   shared memory (chunk_state_t_kernel);
 * - general (any K, V, alignment): the state's copy and Ud go through shared
 *   memory as wgmma B operands, the chunk-local products are mma.sync from
 *   ldmatrix fragments (chunk_state_kernel).
 *
 * Products accumulate in fp32 on the tensor cores. With bf16 inputs the state
 * and the update's U enter as hi + lo halves; a single bf16 rounding is too
 * coarse for the bound. Long sequences with few heads are split into segments
 * (DESIGN §8): pass 1 gives each segment's map (P, S_loc; P's columns in
 * extra blocks that start from I with v = 0), a fp32 scan the incoming states,
 * pass 3 the outputs. bench/NOTES.md has the versions and numbers. */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#ifdef GDN_CHUNK_PROFILE
#include <cstdio>
#endif
#include "cuda/common.cuh"
#include "cuda/cuda_backend.h"

namespace {

constexpr int CC = 64;       /* chunk length            */
constexpr int AF = CC + 4;   /* fp32 row stride of A and T: conflict-free tf32 fragment reads */

struct ChunkArgs {
    const void *q, *k, *v, *g, *beta;
    const float *A_log, *dt_bias, *h0;
    void *o;
    float *ht, *rstd_q, *rstd_k;
    const int64_t *cu;
    int64_t T;
    int H, HV, K, V, G, gdt, nvb;
    float scale;
    unsigned flags;
    /* sequence split (DESIGN §8): sc chunks per segment (0 = whole
     * sequences), maxseg segments at most per sequence; pass 0 = whole,
     * 1 = each segment's map from a zero state (P and S_loc), 3 = each
     * segment from its true incoming state; nvb_v column blocks of V (pass 1
     * adds blocks for the columns of P) */
    int sc, maxseg, nvb_v, pass;
    int tma;   /* the tensor maps of q, k, v are valid (else every chunk comes by cp.async) */
    float *seg_s, *seg_p, *seg_in;   /* [segment slot][HV] x (K x V, K x K, K x V), k-first */
};

/* ---- tensor-core primitives ---- */

template <typename E> struct mma_traits;
template <> struct mma_traits<__nv_bfloat16> {
    static constexpr bool bf = true;
    static constexpr bool split = true;   /* state and Ud as hi + lo: one bf16 rounding (2^-9) is too coarse */
    static __device__ __forceinline__ __nv_bfloat16 cvt(float x) { return __float2bfloat16_rn(x); }
    static __device__ __forceinline__ uint32_t pack(float a, float b) {
        __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    static __device__ __forceinline__ float lo(uint32_t x) { return __uint_as_float(x << 16); }
    static __device__ __forceinline__ float hi(uint32_t x) { return __uint_as_float(x & 0xffff0000u); }
};
template <> struct mma_traits<__half> {
    static constexpr bool bf = false;
    static constexpr bool split = false;   /* one f16 rounding (2^-12) is enough; hi + lo would not add range */
    static __device__ __forceinline__ __half cvt(float x) { return __float2half_rn(x); }
    static __device__ __forceinline__ uint32_t pack(float a, float b) {
        __half2 h = __floats2half2_rn(a, b);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    static __device__ __forceinline__ float lo(uint32_t x) { return __half2float(__ushort_as_half((unsigned short)(x & 0xffffu))); }
    static __device__ __forceinline__ float hi(uint32_t x) { return __half2float(__ushort_as_half((unsigned short)(x >> 16))); }
};

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

/* four 8x8 b16 matrices from the accumulator layout (r[m]: row lane / 4,
 * columns 2 (lane % 4) + {0, 1} of matrix m); lane l gives the address of row
 * l % 8 of matrix l / 8. A core matrix of the blocked wgmma layout is such a
 * matrix with 16-byte rows, so one instruction stores four of them. */
__device__ __forceinline__ void stsm4(void *p, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};" ::"r"(saddr(p)), "r"(r0), "r"(r1), "r"(r2),
                 "r"(r3) : "memory");
}

/* pairs (v[m][0], v[m][1]) of four such matrices as hi + lo halves: hi at
 * dst, lo (the rounding residual; only where the type splits) lo_off
 * elements on */
template <typename M, typename E>
__device__ __forceinline__ void stsm4_hilo(E *dst, int lo_off, const float (&v)[4][2]) {
    uint32_t hi[4], lo[4];
#pragma unroll
    for (int m = 0; m < 4; m++) {
        hi[m] = M::pack(v[m][0], v[m][1]);
        lo[m] = M::pack(v[m][0] - M::lo(hi[m]), v[m][1] - M::hi(hi[m]));
    }
    stsm4(dst, hi[0], hi[1], hi[2], hi[3]);
    if (M::split) stsm4(dst + lo_off, lo[0], lo[1], lo[2], lo[3]);
}

/* wgmma (sm_90a), A from registers (the mma.sync A fragment of the warp's 16
 * rows), B from shared memory in the blocked no-swizzle layout: 8x8 core
 * matrices of 128 contiguous bytes, [k % 8][n % 8] inside, core (kc, nc) at
 * (kc * NC + nc) * 128 bytes for NC = n / 8 cores per row of cores. B is
 * stored n-contiguous (MN-major, the transpose bit set): the leading byte
 * offset steps along k (NC * 128), the stride offset along n (128). */
__device__ __forceinline__ uint64_t wg_desc(const void *p, int nc) {
    return (uint64_t)((saddr(p) & 0x3FFFF) >> 4) | ((uint64_t)((nc * 128) >> 4) << 16) | ((uint64_t)(128 >> 4) << 32);
}
/* element offset of (k, n) in that layout */
__device__ __forceinline__ int blk(int k, int n, int nc) { return ((k >> 3) * nc + (n >> 3)) * 64 + (k & 7) * 8 + (n & 7); }
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }
/* generic-proxy stores to shared memory made visible to the tensor cores' reads */
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

#define WG_D8 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define WG_D16 WG_D8, "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define WG_D32 WG_D16, "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
               "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define WG_R8 "{%0,%1,%2,%3,%4,%5,%6,%7}"
#define WG_R16 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}"
#define WG_R32 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}"

/* wgmma, d[N / 2] (+)= A (64 x 16) B (16 x N): the accumulators start from
 * zero where acc = 0 (no clearing), B is MN-major where tb = 1. RS: A from
 * this warp's fragment registers (its 16 rows); SS: A and B by descriptors,
 * both K-major. */
#define WG_D64 WG_D32, \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define WG_R64 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"
#define WG_A() "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc)
#define WGX_OP(N, T, R, AB, ACC, TB) "{\n.reg .pred p;\nsetp.ne.b32 p, " ACC ", 0;\n" \
    "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." T "." T " " R ", " AB ", p, 1, 1, " TB ";\n}\n"
template <int N, bool BF, int TB>
__device__ __forceinline__ void wgt_rs(float *d, const uint32_t a[4], uint64_t desc, int acc) {
    if constexpr (N == 16) {
        if constexpr (BF) asm volatile(WGX_OP(16, "bf16", WG_R8, "{%8,%9,%10,%11}, %12", "%13", "%14") : WG_D8 : WG_A(), "r"(acc), "n"(TB));
        else asm volatile(WGX_OP(16, "f16", WG_R8, "{%8,%9,%10,%11}, %12", "%13", "%14") : WG_D8 : WG_A(), "r"(acc), "n"(TB));
    } else if constexpr (N == 32) {
        if constexpr (BF) asm volatile(WGX_OP(32, "bf16", WG_R16, "{%16,%17,%18,%19}, %20", "%21", "%22") : WG_D16 : WG_A(), "r"(acc), "n"(TB));
        else asm volatile(WGX_OP(32, "f16", WG_R16, "{%16,%17,%18,%19}, %20", "%21", "%22") : WG_D16 : WG_A(), "r"(acc), "n"(TB));
    } else if constexpr (N == 64) {
        if constexpr (BF) asm volatile(WGX_OP(64, "bf16", WG_R32, "{%32,%33,%34,%35}, %36", "%37", "%38") : WG_D32 : WG_A(), "r"(acc), "n"(TB));
        else asm volatile(WGX_OP(64, "f16", WG_R32, "{%32,%33,%34,%35}, %36", "%37", "%38") : WG_D32 : WG_A(), "r"(acc), "n"(TB));
    } else {
        static_assert(N == 128, "wgt_rs: N is 16, 32, 64 or 128");
        if constexpr (BF) asm volatile(WGX_OP(128, "bf16", WG_R64, "{%64,%65,%66,%67}, %68", "%69", "%70") : WG_D64 : WG_A(), "r"(acc), "n"(TB));
        else asm volatile(WGX_OP(128, "f16", WG_R64, "{%64,%65,%66,%67}, %68", "%69", "%70") : WG_D64 : WG_A(), "r"(acc), "n"(TB));
    }
}
template <bool BF> __device__ __forceinline__ void wgt_ss32(float *d, uint64_t da, uint64_t db, int acc) {
    if constexpr (BF) asm volatile(WGX_OP(32, "bf16", WG_R16, "%16, %17", "%18", "0, 0") : WG_D16 : "l"(da), "l"(db), "r"(acc));
    else asm volatile(WGX_OP(32, "f16", WG_R16, "%16, %17", "%18", "0, 0") : WG_D16 : "l"(da), "l"(db), "r"(acc));
}

__device__ __forceinline__ float ex2(float x) { float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
__device__ __forceinline__ uint32_t tf32(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}
__device__ __forceinline__ float tf32f(float x) { return __uint_as_float(tf32(x)); }
__device__ __forceinline__ void mma_tf32(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Fragment addresses (lane l) for a 16x16 tile at (r0, c0) of a row-major bf16
 * matrix with row stride ld:
 *   A operand, rows = M:                      a_row(l) = r0 + l%16, col c0 + (l/16)*8   (ldsm4)
 *   A operand stored transposed ([k][m]):     row k0 + l%8 + (l/16)*8, col m0 + ((l/8)&1)*8 (ldsm4t)
 *   B operand stored [n][k] (two n8 tiles):   row n0 + l%8 + (l/16)*8, col k0 + ((l/8)&1)*8 (ldsm4)
 *   B operand stored [k][n] (two n8 tiles):   row k0 + l%8 + ((l/8)&1)*8, col n0 + (l/16)*8 (ldsm4t)
 * In both B cases r[0], r[1] feed n-tile n0 and r[2], r[3] n-tile n0 + 8. */
template <typename E> __device__ __forceinline__ const E *frag_a(const E *m, int ld, int r0, int c0, int l) {
    return m + (r0 + (l & 15)) * ld + c0 + (l >> 4) * 8;
}
template <typename E> __device__ __forceinline__ const E *frag_at(const E *m, int ld, int k0, int m0, int l) {
    return m + (k0 + (l & 7) + (l >> 4) * 8) * ld + m0 + ((l >> 3) & 1) * 8;
}
template <typename E> __device__ __forceinline__ const E *frag_bn(const E *m, int ld, int n0, int k0, int l) {
    return m + (n0 + (l & 7) + (l >> 4) * 8) * ld + k0 + ((l >> 3) & 1) * 8;
}
template <typename E> __device__ __forceinline__ const E *frag_bk(const E *m, int ld, int k0, int n0, int l) {
    return m + (k0 + (l & 7) + ((l >> 3) & 1) * 8) * ld + n0 + (l >> 4) * 8;
}

/* ---- cp.async ---- */

__device__ __forceinline__ void cp16(void *dst, const void *src, bool full) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(saddr(dst)), "l"(src), "r"(full ? 16 : 0));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
__device__ __forceinline__ void cp_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

/* ---- the TMA engine: copies completing on an mbarrier. One instruction of
 * one thread moves a chunk's rows of q, k or v (a tensor map) or the whole
 * record, so the state kernel's fetch costs a few instructions of one warp
 * instead of address arithmetic and cp.async in every thread. (Row by row
 * bulk copies were tried: ~50 cycles per 256-byte request, slower than
 * cp.async.) ---- */
__device__ __forceinline__ void mb_init(void *mb) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\nfence.mbarrier_init.release.cluster;" ::"r"(saddr(mb)) : "memory");
}
__device__ __forceinline__ void mb_init2(void *mb) {   /* two arrivals: one per warpgroup */
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 2;" ::"r"(saddr(mb)) : "memory");
}
__device__ __forceinline__ void mb_arrive(void *mb) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(saddr(mb)) : "memory");
}
__device__ __forceinline__ void mb_expect(void *mb, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(saddr(mb)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mb_wait(void *mb, uint32_t parity) {
    uint32_t done = 0;
    while (!done)
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done) : "r"(saddr(mb)), "r"(parity) : "memory");
}
__device__ __forceinline__ void bulk_copy(void *dst, const void *src, uint32_t bytes, void *mb) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(saddr(dst)), "l"(src), "r"(bytes), "r"(saddr(mb)) : "memory");
}
/* the box (padded row, 1 head, 64 rows) at (col, head, row) of a [rows][heads][cols]
 * tensor: the box is 8 columns wider than the tile and they lie past the
 * tensor's row (zeros) or in the next tile (never read), so the rows land
 * padded as cp.async would leave them, conflict-free for ldmatrix */
__device__ __forceinline__ void tma_rows(void *dst, const CUtensorMap *map, int col, int head, int row, void *mb) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];"
                 ::"r"(saddr(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(head), "r"(row), "r"(saddr(mb))
                 : "memory");
}


/* The per-(chunk slot, value head) record the prep kernel leaves for the
 * state kernels: T (bf16 / f16) blocked as the tensor cores read it (8 x 8
 * core matrices of 128 contiguous bytes, core (t / 8, s / 8) at
 * (t / 8) * 8 + s / 8), then per-token fp32 rows [C] (F_*): the gate cumsum,
 * beta, the k and q rstd, and the products of them the state kernels scale
 * by. Chunk i of sequence n is slot bos/C + n + i: slots of consecutive
 * sequences never overlap, and there are at most B*T/C + N + 1. */
enum { F_GC, F_BT, F_RK, F_RQ, F_B /* beta exp(gc) rk */, F_CO /* scale rq exp(gc) */, F_CU /* rk exp(gL - gc) */,
       F_GL /* gc log2(e) */, F_N };
constexpr int LT = CC + 8, REC_T = CC * CC * 2, REC_F = F_N * CC * 4, REC = REC_T + REC_F;
/* element offset of (t, s) in a blocked C x C matrix (T, P) */
__device__ __forceinline__ int blk64(int t, int s) { return ((t >> 3) * 8 + (s >> 3)) * 64 + (t & 7) * 8 + (s & 7); }
__device__ __forceinline__ int64_t slot_of(int64_t bos, int n, int i) { return bos / CC + n + i; }

__device__ __forceinline__ void seq_range(const ChunkArgs &p, int n, int64_t *bos, int64_t *len) {
    *bos = p.cu ? p.cu[n] : (int64_t)n * p.T;
    *len = p.cu ? p.cu[n + 1] - *bos : p.T;
}

/* A walk's starting state at (k row kr, column vc): pass 1 from 0 (P's
 * columns from I), a later segment of pass 3 from its incoming state, else h0 */
__device__ __forceinline__ float state_in(const ChunkArgs &p, bool pmode, int sg, int64_t segslot, int j, int64_t sbase, int kr,
                                          int vc) {
    if (p.pass == 1) return pmode && kr == vc ? 1.f : 0.f;
    if (p.pass == 3 && sg > 0) return p.seg_in[(segslot * p.HV + j) * p.K * p.V + (int64_t)kr * p.V + vc];
    if (!p.h0) return 0.f;
    return p.h0[sbase + ((p.flags & GDN_STATE_V_FIRST) ? (int64_t)vc * p.K + kr : (int64_t)kr * p.V + vc)];
}
/* where a walk's final state goes: ht (the last segment; null if not asked
 * for or not the last), or in pass 1 the segment's P / S_loc (k-first,
 * ncols wide); state_at is (kr, vc)'s offset there */
__device__ __forceinline__ float *state_dst(const ChunkArgs &p, bool pmode, int64_t segslot, int j, bool last) {
    if (p.pass == 1) return pmode ? p.seg_p + (segslot * p.HV + j) * p.K * p.K : p.seg_s + (segslot * p.HV + j) * p.K * p.V;
    return last ? p.ht : nullptr;
}
__device__ __forceinline__ int64_t state_at(const ChunkArgs &p, int64_t sbase, int ncols, int kr, int vc) {
    if (p.pass == 1) return (int64_t)kr * ncols + vc;
    return sbase + ((p.flags & GDN_STATE_V_FIRST) ? (int64_t)vc * p.K + kr : (int64_t)kr * p.V + vc);
}

/* gate, its cumsum inside the chunk and beta for value head j, rows past c
 * zero (so gc stays flat there); one warp, two tokens per lane */
__device__ __forceinline__ void chunk_gate(const ChunkArgs &p, int64_t row0, int c, int j, float *gc, float *bt) {
    const int lane = threadIdx.x & 31;
    const bool fused = (p.flags & GDN_GATE_FUSED) != 0;
    const float A = fused ? -expf(p.A_log[j]) : 0.f, bias = (fused && p.dt_bias) ? p.dt_bias[j] : 0.f;
    float g2[2], b2[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int t = 2 * lane + i;
        float g = 0.f, b = 0.f;
        if (t < c) {
            const int64_t at = (row0 + t) * p.HV + j;
            g = p.g ? gdn::ld(p.g, at, p.gdt) : 0.f;
            if (fused) g = A * gdn::softplus(g + bias);
            b = gdn::ld(p.beta, at, p.gdt);
            if (p.flags & GDN_BETA_SIGMOID) b = ((p.flags & GDN_BETA_NEGATIVE) ? 2.f : 1.f) * gdn::sigmoid(b);
        }
        g2[i] = g; b2[i] = b;
    }
    float incl = g2[0] + g2[1];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const float y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
    }
    gc[2 * lane] = incl - g2[1]; gc[2 * lane + 1] = incl;
    bt[2 * lane] = b2[0]; bt[2 * lane + 1] = b2[1];
}

/* Load rows [0, CC) x columns [0, KT) of a token-major tensor (row stride
 * ld elements, ncols valid columns) into shared rows of stride LS: 16-byte
 * cp.async where the rows allow it, plain loads otherwise; zeros outside. */
template <int KT, int LS, typename E>
__device__ __forceinline__ void load_rows(E *dst, const E *src, int64_t ld, int c, int ncols, int col0, int tid, int nt) {
    constexpr int G8 = KT / 8;
    if ((ld & 7) == 0 && (col0 & 7) == 0 && (ncols & 7) == 0) {
        for (int x = tid; x < CC * G8; x += nt) {
            const int r = x / G8, c8 = (x % G8) * 8;
            const bool ok = r < c && c8 < ncols;
            cp16(dst + r * LS + c8, ok ? (const void *)(src + r * ld + col0 + c8) : (const void *)src, ok);
        }
    } else {
        for (int x = tid; x < CC * KT; x += nt) {
            const int r = x / KT, cc = x % KT;
            dst[r * LS + cc] = (r < c && cc < ncols) ? src[r * ld + col0 + cc] : mma_traits<E>::cvt(0.f);
        }
    }
}

/* ---- kernel 1: per (sequence, chunk, q/k head), T = (I + A)^-1 for each
 * of the G value heads, two at a time; independent of the state, so the whole
 * grid runs at once and the latency-bound inverse hides behind other blocks.
 * A (strictly lower) and T (transposed, upper with the diagonal) share one
 * array per head, so two heads fit the shared memory of one. Both are kept
 * rounded to tf32, so the tf32 products take their fragments by ldmatrix
 * (an 8 x 4 fp32 block is an 8 x 8 b16 matrix) with no conversions. ---- */
constexpr int PT = 128;   /* prep threads */
constexpr float LOG2E = 1.4426950408889634f;

template <int KT> struct PrepSmem {
    static constexpr int LK = KT + 8, KB = CC * LK * 2, AB = CC * AF * 4;
    static constexpr int k = 0, at0 = 0, at1 = KB > AB ? KB : AB, y = at1 + AB;   /* head 0's array over K */
    static constexpr int f = y + 4 * 128 * 4, bytes = f + 6 * CC * 4;   /* gc[2], bt[2], rk, rq */
};

/* the lower 16 x 16 blocks (I, J) of K K^T dealt to the four warps: 3, 3, 2, 2 */
__device__ __forceinline__ int kkt_n(int w) { return w < 2 ? 3 : 2; }
__device__ __forceinline__ int kkt_i(int w, int b) { return w == 0 ? (b > 0) : w == 1 ? 2 : 3; }
__device__ __forceinline__ int kkt_j(int w, int b) { return w == 0 ? (b > 0 ? b - 1 : 0) : w == 3 ? 2 + b : b; }

template <int KT, typename E>
__global__ void __launch_bounds__(PT, KT > 128 ? 4 : 5) chunk_prep_kernel(ChunkArgs p, char *ws, int maxch) {
    using S = PrepSmem<KT>;
    using M = mma_traits<E>;
    extern __shared__ __align__(16) char sm[];
    E *Ks = reinterpret_cast<E *>(sm + S::k);
    float *AT[2] = {reinterpret_cast<float *>(sm + S::at0), reinterpret_cast<float *>(sm + S::at1)};
    float *gcs = reinterpret_cast<float *>(sm + S::f), *bts = gcs + 2 * CC, *rk = bts + 2 * CC, *rq = rk + CC;
    const int tid = threadIdx.x, lane = tid & 31, w = __shfl_sync(0xffffffffu, tid >> 5, 0), g = lane >> 2, tq = lane & 3;
    const int i = blockIdx.x % maxch, h = (blockIdx.x / maxch) % p.H, n = blockIdx.x / (maxch * p.H);
    /* the state kernel may start launching (it waits for this grid before reading the records) */
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    int64_t bos, len;
    seq_range(p, n, &bos, &len);
    if ((int64_t)i * CC >= len) return;
    const int c = len - (int64_t)i * CC < CC ? (int)(len - (int64_t)i * CC) : CC;
    const int64_t row0 = bos + (int64_t)i * CC;
    const bool l2 = (p.flags & GDN_QK_L2NORM) != 0;
    load_rows<KT, S::LK>(Ks, static_cast<const E *>(p.k) + (row0 * p.H + h) * p.K, (int64_t)p.H * p.K, c, p.K, 0, tid, PT);
    cp_commit();
    /* q as well where its rows fit head 1's array (free until the A fill) */
    constexpr bool QS = CC * S::LK * 2 <= CC * AF * 4;
    E *Qs = reinterpret_cast<E *>(sm + S::at1);
    if constexpr (QS)
        load_rows<KT, S::LK>(Qs, static_cast<const E *>(p.q) + (row0 * p.H + h) * p.K, (int64_t)p.H * p.K, c, p.K, 0, tid, PT);
    cp_commit();
    /* while they land: the first two heads' gates (warps 2, 3) */
    if (w >= 2 && w - 2 < p.G) chunk_gate(p, row0, c, h * p.G + w - 2, gcs + (w - 2) * CC, bts + (w - 2) * CC);
    /* the q rstd, 8 lanes a row, warp w rows 16 w..: from shared memory, or (K = 256) global */
#pragma unroll
    for (int r4 = 0; r4 < 4; r4++) {
        const int r = w * 16 + r4 * 4 + (lane >> 3);
        float ss = 0.f;
        if constexpr (QS) {
            if (r4 == 0) { cp_wait_all(); __syncthreads(); }
            if (l2)
#pragma unroll
                for (int x = (lane & 7) * 8; x < KT; x += 64) {   /* rows are zero past K and c */
                    const uint4 v = *reinterpret_cast<const uint4 *>(Qs + r * S::LK + x);
                    const uint32_t vv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                    for (int e = 0; e < 4; e++) { const float a = M::lo(vv[e]), b = M::hi(vv[e]); ss += a * a + b * b; }
                }
        } else if (l2 && r < c) {
            const E *row = static_cast<const E *>(p.q) + ((row0 + r) * p.H + h) * p.K;
            if ((p.K & 7) == 0 && (reinterpret_cast<uintptr_t>(p.q) & 15) == 0)
                for (int x = (lane & 7) * 8; x < p.K; x += 64) {
                    const uint4 v = *reinterpret_cast<const uint4 *>(row + x);
                    const uint32_t vv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                    for (int e = 0; e < 4; e++) { const float a = M::lo(vv[e]), b = M::hi(vv[e]); ss += a * a + b * b; }
                }
            else
                for (int x = lane & 7; x < p.K; x += 8) { const float a = static_cast<float>(row[x]); ss += a * a; }
        }
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if ((lane & 7) == 0) {
            const float rs = l2 ? rsqrtf(ss + 1e-6f) : 1.f;
            rq[r] = rs;
            if (p.rstd_q && r < c) p.rstd_q[(row0 + r) * p.H + h] = rs;
        }
    }
    if constexpr (!QS) {
        cp_wait_all();
        __syncthreads();
    }
    /* raw K K^T on this warp's blocks, kept in registers across the heads */
    const int nb = kkt_n(w);
    float acc[3][2][4];
#pragma unroll
    for (int b = 0; b < 3; b++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[b][0][e] = acc[b][1][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KT / 16; kk++)
#pragma unroll
        for (int b = 0; b < 3; b++)
            if (b < nb) {
                uint32_t af[4], bf[4];
                ldsm4(af, frag_a(Ks, S::LK, kkt_i(w, b) * 16, kk * 16, lane));
                ldsm4(bf, frag_bn(Ks, S::LK, kkt_j(w, b) * 16, kk * 16, lane));
                M::mma(acc[b][0], af, bf[0], bf[1]);
                M::mma(acc[b][1], af, bf[2], bf[3]);
            }
    /* the k rstd from the diagonal blocks' diagonal: |k_t|^2 */
#pragma unroll
    for (int b = 0; b < 3; b++)
        if (b < nb && kkt_i(w, b) == kkt_j(w, b))
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (g == 2 * tq + (e & 1)) {
                    const int hn = e >> 1, t = kkt_i(w, b) * 16 + g + 8 * hn;
                    const float rs = l2 ? rsqrtf(acc[b][hn][e] + 1e-6f) : 1.f;
                    rk[t] = rs;
                    if (p.rstd_k && t < c) p.rstd_k[(row0 + t) * p.H + h] = rs;
                }
    __syncthreads();   /* rk in; K dead (head 0's array lies over it) */
#pragma unroll
    for (int b = 0; b < 3; b++) {
        const float r0 = rk[kkt_i(w, b) * 16 + g], r1 = rk[kkt_i(w, b) * 16 + g + 8];
#pragma unroll
        for (int hn = 0; hn < 2; hn++) {
            const float2 rs = *reinterpret_cast<const float2 *>(rk + kkt_j(w, b) * 16 + hn * 8 + 2 * tq);
            acc[b][hn][0] *= r0 * rs.x; acc[b][hn][1] *= r0 * rs.y; acc[b][hn][2] *= r1 * rs.x; acc[b][hn][3] *= r1 * rs.y;
        }
    }
    float *Yw = reinterpret_cast<float *>(sm + S::y) + w * 128;
    for (int jb = 0; jb < p.G; jb += 2) {
        const int nh = p.G - jb < 2 ? p.G - jb : 2;
        if (jb > 0) {
            if (w < nh) chunk_gate(p, row0, c, h * p.G + jb + w, gcs + w * CC, bts + w * CC);
            __syncthreads();
        }
        /* A = strict_tril(beta_t exp(gc_t - gc_s) (rk k)_t . (rk k)_s), zeros on and above the diagonal */
        for (int hh = 0; hh < nh; hh++) {
            const float *gc = gcs + hh * CC, *bt = bts + hh * CC;
#pragma unroll
            for (int b = 0; b < 3; b++)
                if (b < nb) {
                    const int t0 = kkt_i(w, b) * 16 + g, t1 = t0 + 8;
                    const float g0 = gc[t0], g1 = gc[t1], b0 = bt[t0], b1 = bt[t1];
#pragma unroll
                    for (int hn = 0; hn < 2; hn++) {
                        const int s0 = kkt_j(w, b) * 16 + hn * 8 + 2 * tq;
                        const float2 gs = *reinterpret_cast<const float2 *>(gc + s0);
                        float2 r0, r1;
                        r0.x = s0 < t0 ? tf32f(b0 * ex2((g0 - gs.x) * LOG2E) * acc[b][hn][0]) : 0.f;
                        r0.y = s0 + 1 < t0 ? tf32f(b0 * ex2((g0 - gs.y) * LOG2E) * acc[b][hn][1]) : 0.f;
                        r1.x = s0 < t1 ? tf32f(b1 * ex2((g1 - gs.x) * LOG2E) * acc[b][hn][2]) : 0.f;
                        r1.y = s0 + 1 < t1 ? tf32f(b1 * ex2((g1 - gs.y) * LOG2E) * acc[b][hn][3]) : 0.f;
                        *reinterpret_cast<float2 *>(AT[hh] + t0 * AF + s0) = r0;
                        *reinterpret_cast<float2 *>(AT[hh] + t1 * AF + s0) = r1;
                    }
                }
        }
        __syncthreads();
        /* diagonal 16x16 blocks by substitution: a half-warp per (head, block), lane = column;
         * T_bb^T goes to the upper triangle (with the diagonal) of the block and
         * A_bb, used by nothing else, to zeros, so T reads need no mask */
        {
            const int item = w * 2 + (lane >> 4), hh = item >> 2, b0 = (item & 3) * 16, col = lane & 15;
            if (hh < nh) {
                float *A = AT[hh];
                float x[16];
#pragma unroll
                for (int r = 0; r < 16; r++) x[r] = r == col ? 1.f : 0.f;
#pragma unroll
                for (int s2 = 0; s2 < 16; s2++)
#pragma unroll
                    for (int r = s2 + 1; r < 16; r++) x[r] -= A[(b0 + r) * AF + b0 + s2] * x[s2];
                __syncwarp();
#pragma unroll
                for (int r = 0; r < 16; r++) {
                    if (r >= col) A[(b0 + col) * AF + b0 + r] = tf32f(x[r]);
                    else A[(b0 + col) * AF + b0 + r] = 0.f;   /* A_bb[col][r], r < col */
                }
            }
        }
        __syncthreads();
        /* off-diagonal blocks by distance d = bi - bj: T_ij = -T_ii sum_{m=j}^{i-1} A_im T_mj (tf32);
         * T[r][s] is read at AT[s][r] */
#pragma unroll
        for (int d = 1; d < 4; d++) {
            const int per = 2 * (4 - d);
            for (int it = w; it < nh * per; it += 4) {
                float *A = AT[it / per];
                const int pr = it % per, bi = d + (pr >> 1), bj = bi - d, n0 = bj * 16 + (pr & 1) * 8;
                float y[4] = {0.f, 0.f, 0.f, 0.f};
                for (int kk = bj * 16; kk < bi * 16; kk += 8) {
                    uint32_t af[4], bf[2];
                    ldsm4(af, A + (bi * 16 + (lane & 15)) * AF + kk + (lane >> 4) * 4);
                    ldsm2(bf, A + (n0 + (lane & 7)) * AF + kk + ((lane >> 3) & 1) * 4);
                    mma_tf32(y, af, bf[0], bf[1]);
                }
                __syncwarp();
                Yw[g * 8 + 2 * tq] = y[0]; Yw[g * 8 + 2 * tq + 1] = y[1];
                Yw[(g + 8) * 8 + 2 * tq] = y[2]; Yw[(g + 8) * 8 + 2 * tq + 1] = y[3];
                __syncwarp();
                float z[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                for (int kk = 0; kk < 16; kk += 8) {
                    const float *tp = A + (bi * 16 + kk + tq) * AF + bi * 16 + g;   /* T_ii[g (+8)][kk + tq (+4)] */
                    const uint32_t af[4] = {__float_as_uint(tp[0]), __float_as_uint(tp[8]), __float_as_uint(tp[4 * AF]),
                                            __float_as_uint(tp[4 * AF + 8])};
                    mma_tf32(z, af, tf32(Yw[(kk + tq) * 8 + g]), tf32(Yw[(kk + tq + 4) * 8 + g]));
                }
                const int r0 = bi * 16 + g, c0 = n0 + 2 * tq;
                A[c0 * AF + r0] = tf32f(-z[0]); A[(c0 + 1) * AF + r0] = tf32f(-z[1]);
                A[c0 * AF + r0 + 8] = tf32f(-z[2]); A[(c0 + 1) * AF + r0 + 8] = tf32f(-z[3]);
            }
            __syncthreads();
        }
        /* the records: T blocked (zero above the diagonal), then the per-token rows */
        for (int hh = 0; hh < nh; hh++) {
            const float *A = AT[hh];
            char *rec = ws + (slot_of(bos, n, i) * p.HV + h * p.G + jb + hh) * (int64_t)REC;
            for (int x = tid; x < CC * CC / 8; x += PT) {
                const int r = x % CC, c8 = (x / CC) * 8;   /* a warp: 32 rows, one column group: conflict-free column reads */
                uint4 v;
                uint32_t *vv = reinterpret_cast<uint32_t *>(&v);
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int s0 = c8 + 2 * e;
                    vv[e] = M::pack(s0 <= r ? A[s0 * AF + r] : 0.f, s0 + 1 <= r ? A[(s0 + 1) * AF + r] : 0.f);
                }
                *reinterpret_cast<uint4 *>(rec + blk64(r, c8) * 2) = v;
            }
        }
        for (int x = tid; x < nh * CC; x += PT) {
            const int hh = x / CC, t = x % CC;
            const float *gc = gcs + hh * CC;
            float *recf = reinterpret_cast<float *>(ws + (slot_of(bos, n, i) * p.HV + h * p.G + jb + hh) * (int64_t)REC + REC_T);
            const float gt = gc[t], bt = bts[hh * CC + t], eg = __expf(gt), rkt = rk[t], rqt = rq[t];
            recf[F_GC * CC + t] = gt;
            recf[F_BT * CC + t] = bt;
            recf[F_RK * CC + t] = rkt;
            recf[F_RQ * CC + t] = rqt;
            recf[F_B * CC + t] = bt * eg * rkt;
            recf[F_CO * CC + t] = p.scale * rqt * eg;
            recf[F_CU * CC + t] = rkt * __expf(gc[CC - 1] - gt);
            recf[F_GL * CC + t] = gt * LOG2E;
        }
        __syncthreads();
    }
}

/* ---- kernel 2: per (sequence, value head, BV columns of V) the state walk.
 * 16 warps, four warpgroups; warp w owns rows 16*(w&3) of the chunk and the
 * column group w>>2 (its warpgroup) for O, R and U; each warpgroup holds a
 * 64-row tile of the state (srow, sn0 below), one wgmma per k step. The next
 * chunk's q, v, k (double-buffered) and record are fetched by the TMA (or cp.async)
 * while this one computes. q and k stay raw: their rstd scale rows and
 * columns of the products instead. ---- */
constexpr int SW = 16, ST = 32 * SW;   /* state kernel warps, threads: 4 row blocks x NCG column groups */
constexpr int NCG = SW / 4;

struct TmaMaps { CUtensorMap q, k, v; };

template <int KT, int BV> struct StateSmem {
    static constexpr int LK = KT + 8, LV = BV + 8, LC = LT;
    static constexpr bool K2 = KT <= 128;   /* K double-buffered (prefetched); at K = 256 there is no room */
    static constexpr int q = 0, k0 = q + CC * LK * 2, k1 = K2 ? k0 + CC * LK * 2 : k0, v = k1 + CC * LK * 2;
    /* s: the state's bf16 / f16 copy, hi then lo, blocked for wgmma (KT x BV each);
     * ud: Ud likewise (CC x BV each) */
    static constexpr int s = v + CC * LV * 2, p = s + 2 * KT * BV * 2, t = p + CC * LC * 2;
    static constexpr int r = t + CC * LC * 2, u = r + CC * LV * 2, ud = u + CC * LV * 2;
    static constexpr int f = ud + 2 * CC * BV * 2;   /* f: 2 x the record's per-token rows */
    static constexpr int mb = f + 2 * REC_F;         /* the fetch's mbarrier */
    static constexpr int bytes = mb + 16 + 128;   /* + the base's alignment for the TMA */
    /* what one chunk's TMA fetch moves: q, k, v as padded rows, the record's T and f */
    static constexpr uint32_t fetch_bytes = CC * (2 * LK + LV) * 2 + REC_T + REC_F;
};

template <int KT, int BV, typename E>
__global__ void __launch_bounds__(ST, 1) chunk_state_kernel(ChunkArgs p, const char *ws, const __grid_constant__ TmaMaps tm) {
    using S = StateSmem<KT, BV>;
    using M = mma_traits<E>;
    constexpr int CW = BV / NCG, NTW = CW / 8;   /* columns and n8 tiles per warp for O, R, U */
    constexpr int NCB = BV / 8;                  /* core matrices per row of cores in the blocked copies */
    extern __shared__ __align__(128) char sm_raw[];
    char *sm = sm_raw + ((128 - (saddr(sm_raw) & 127)) & 127);
    E *Qs = reinterpret_cast<E *>(sm + S::q), *Vs = reinterpret_cast<E *>(sm + S::v), *Ss = reinterpret_cast<E *>(sm + S::s);
    E *Ps = reinterpret_cast<E *>(sm + S::p), *Ts = reinterpret_cast<E *>(sm + S::t), *Rs = reinterpret_cast<E *>(sm + S::r);
    E *Us = reinterpret_cast<E *>(sm + S::u), *Ud = reinterpret_cast<E *>(sm + S::ud);
    /* w by a shuffle: the compiler then knows it is warp-uniform and keeps the
     * wgmma descriptors built from it in uniform registers */
    const int tid = threadIdx.x, lane = tid & 31, w = __shfl_sync(0xffffffffu, tid >> 5, 0), g = lane >> 2, tq = lane & 3;
    const int rb = w & 3, cg = w >> 2;
    const int vb = blockIdx.x % p.nvb, j = (blockIdx.x / p.nvb) % p.HV, sg = (blockIdx.x / (p.nvb * p.HV)) % p.maxseg;
    const int n = blockIdx.x / (p.nvb * p.HV * p.maxseg), h = j / p.G;
    int64_t bos, len;
    seq_range(p, n, &bos, &len);
    const int nch_all = (int)((len + CC - 1) / CC);
    const int i0 = p.sc ? sg * p.sc : 0, nch = p.sc ? min(nch_all, i0 + p.sc) : nch_all;   /* chunks [i0, nch) */
    if (sg > 0 && i0 >= nch) return;
    const bool pmode = p.pass == 1 && vb >= p.nvb_v;   /* this block carries columns of P */
    const bool want_o = p.pass != 1;                    /* pass 1 needs the final state only */
    const int64_t segslot = p.sc ? bos / ((int64_t)CC * p.sc) + n + sg : 0;
    const int64_t sbase = ((int64_t)n * p.HV + j) * p.K * p.V;
    const int vcol0 = (pmode ? vb - p.nvb_v : vb) * BV, ncols = pmode ? p.K : p.V;
    void *mb = sm + S::mb;
    /* whole chunks come by the TMA where the host made tensor maps (the
     * tiles past K or V fill with zeros); the rest (a sequence's last chunk,
     * unaligned tensors, P's columns) by cp.async */
    const bool bulk_ok = p.tma && !pmode;
    auto bulk = [&](int i) { return bulk_ok && len - (int64_t)i * CC >= CC; };

    /* Each fetch moves part of chunk i: by bulk copies of warp 0 onto the
     * mbarrier (armed for all of the chunk's bytes by the first part), or by
     * cp.async of every thread. */
    auto fetch_k = [&](int i) {   /* k -> K buffer i&1 */
        const int64_t row0 = bos + (int64_t)i * CC;
        const int c = len - (int64_t)i * CC < CC ? (int)(len - (int64_t)i * CC) : CC;
        E *Kb = reinterpret_cast<E *>(sm + ((i & 1) ? S::k1 : S::k0));
        const E *src = static_cast<const E *>(p.k) + (row0 * p.H + h) * p.K;
        if (!bulk(i)) load_rows<KT, S::LK>(Kb, src, (int64_t)p.H * p.K, c, p.K, 0, tid, ST);
        else if (tid == 32) tma_rows(Kb, &tm.k, 0, h, (int)row0, mb);
    };
    auto fetch_qkv = [&](int i) {   /* q, v -> Qs, Vs; k (when double-buffered); gc, bt, rk -> f buffer i&1 */
        const int64_t row0 = bos + (int64_t)i * CC;
        const int c = len - (int64_t)i * CC < CC ? (int)(len - (int64_t)i * CC) : CC;
        const E *qs = static_cast<const E *>(p.q) + (row0 * p.H + h) * p.K;
        const E *vs = static_cast<const E *>(p.v) + (row0 * p.HV + j) * p.V;
        const char *rec = ws + (slot_of(bos, n, i) * p.HV + j) * (int64_t)REC + REC_T;
        char *f = sm + S::f + (i & 1) * REC_F;
        if (bulk(i)) {
            if (w == 0) {
                if (lane == 0) { mb_expect(mb, S::fetch_bytes); bulk_copy(f, rec, REC_F, mb); }
                __syncwarp();
                if (lane == 1) tma_rows(Qs, &tm.q, 0, h, (int)row0, mb);
                if (lane == 2) tma_rows(Vs, &tm.v, vcol0, j, (int)row0, mb);
            }
        } else {
            load_rows<KT, S::LK>(Qs, qs, (int64_t)p.H * p.K, c, p.K, 0, tid, ST);
            load_rows<BV, S::LV>(Vs, vs, (int64_t)p.HV * p.V, c, pmode ? 0 : p.V - vcol0 < BV ? p.V - vcol0 : BV, vcol0, tid,
                                 ST);   /* P: v = 0 */
            for (int x = tid; x < REC_F / 16; x += ST) cp16(f + 16 * x, rec + 16 * x, true);
        }
        if (S::K2) fetch_k(i);
    };
    auto fetch_t = [&](int i) {
        const char *rec = ws + (slot_of(bos, n, i) * p.HV + j) * (int64_t)REC;
        if (!bulk(i))
            for (int x = tid; x < REC_T / 16; x += ST) cp16(reinterpret_cast<char *>(Ts) + 16 * x, rec + 16 * x, true);
        else if (tid == 0) bulk_copy(Ts, rec, REC_T, mb);
    };

    /* the state: this warp's tiles of the K x BV slice, fp32: m16 tile w % MT,
     * n8 tiles [sn0, sn0 + SNT) */
    constexpr int MT = KT / 16, SNT = (BV / 8) * MT / SW;
    const int sn0 = (w / MT) * SNT, srow = (w % MT) * 16;
    float st[SNT][4];
#pragma unroll
    for (int nt = 0; nt < SNT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int kr = srow + g + (e >> 1) * 8, vc = vcol0 + (sn0 + nt) * 8 + 2 * tq + (e & 1);
            st[nt][e] = kr < p.K && vc < ncols ? state_in(p, pmode, sg, segslot, j, sbase, kr, vc) : 0.f;
        }
    /* matrix m of a stmatrix.x4 over n8 tiles (nt, nt + 1): tile nt + m / 2, rows + 8 (m % 2) */
    const int sm_row = 8 * ((lane >> 3) & 1) + (lane & 7), sm_tile = lane >> 4;
    /* the state enters products as hi + lo halves (S ~ hi + lo to ~16 bits):
     * a single bf16 copy costs ~2^-9 relative per chunk, more than the bound allows */
    auto store_state_copy = [&]() {
#pragma unroll
        for (int nt = 0; nt < SNT; nt += 2) {
            float v[4][2];
#pragma unroll
            for (int m = 0; m < 4; m++) {
                v[m][0] = st[nt + (m >> 1)][2 * (m & 1)];
                v[m][1] = st[nt + (m >> 1)][2 * (m & 1) + 1];
            }
            stsm4_hilo<M>(Ss + blk(srow + sm_row, (sn0 + nt + sm_tile) * 8, NCB), KT * BV, v);
        }
        fence_async_smem();
    };

    if (tid == 0) mb_init(mb);
    __syncthreads();
    if (i0 < nch) { fetch_qkv(i0); if (!S::K2) fetch_k(i0); fetch_t(i0); cp_commit(); }
    store_state_copy();
    uint32_t phase = 0;   /* of the mbarrier: flips with each bulk-fetched chunk */
#ifdef GDN_CHUNK_PROFILE   /* cycles per phase, block 0, thread 0 */
    long long prof[12] = {0}, t0_ = clock64();
#define PROF(k) do { if (tid == 0) { const long long t1_ = clock64(); prof[k] += t1_ - t0_; t0_ = t1_; } } while (0)
#else
#define PROF(k) do { } while (0)
#endif
    for (int i = i0; i < nch; i++) {
        const int64_t row0 = bos + (int64_t)i * CC;
        const int c = len - (int64_t)i * CC < CC ? (int)(len - (int64_t)i * CC) : CC;
        const E *Ks = reinterpret_cast<const E *>(sm + ((i & 1) ? S::k1 : S::k0));
        const float *gc = reinterpret_cast<const float *>(sm + S::f + (i & 1) * REC_F), *bt = gc + F_BT * CC,
                    *rk = gc + F_RK * CC, *rq = gc + F_RQ * CC;
        if (bulk(i)) { mb_wait(mb, phase); phase ^= 1; }
        cp_wait_all();
        __syncthreads();
        PROF(0);
        const float gL = gc[CC - 1];
        const int t0 = rb * 16 + g, t1 = t0 + 8;   /* this thread's two rows */

        /* ---- A: O = Q S, X = K S; P, R ---- */
        PROF(1);
        float o[NTW][4], x[NTW][4], pa[4 / NCG][2][4];
#pragma unroll
        for (int a = 0; a < NTW; a++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[a][e] = x[a][e] = 0.f;
#pragma unroll
        for (int pb = 0; pb < 4 / NCG; pb++)
#pragma unroll
            for (int e = 0; e < 4; e++) pa[pb][0][e] = pa[pb][1][e] = 0.f;
        /* O and X on the tensor cores asynchronously (warpgroup cg: columns
         * cg * CW, its warps the row blocks), P by mma.sync meanwhile */
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < KT / 16; kk++) {
            uint32_t aq[4], ak[4];
            ldsm4(aq, frag_a(Qs, S::LK, rb * 16, kk * 16, lane));
            ldsm4(ak, frag_a(Ks, S::LK, rb * 16, kk * 16, lane));
            const uint64_t dh = wg_desc(Ss + blk(kk * 16, cg * CW, NCB), NCB), dl = dh + ((KT * BV * 2) >> 4);
            /* no branches between the wgmma: a divergent path serialises them
             * (so pass 1 forms O and P too, and tiles right of the diagonal) */
            wgt_rs<CW, M::bf, 1>(&o[0][0], aq, dh, 1);
            if (M::split) wgt_rs<CW, M::bf, 1>(&o[0][0], aq, dl, 1);
            wgt_rs<CW, M::bf, 1>(&x[0][0], ak, dh, 1);
            if (M::split) wgt_rs<CW, M::bf, 1>(&x[0][0], ak, dl, 1);
            wg_commit();
#pragma unroll
            for (int pb = 0; pb < 4 / NCG; pb++) {   /* P column blocks cg + NCG pb */
                uint32_t bf[4];
                ldsm4(bf, frag_bn(Ks, S::LK, (cg + NCG * pb) * 16, kk * 16, lane));
                M::mma(pa[pb][0], aq, bf[0], bf[1]);
                M::mma(pa[pb][1], aq, bf[2], bf[3]);
            }
            wg_wait<1>();   /* at most one k step in flight: its A fragments stay in registers until read */
        }
        wg_wait<0>();
        PROF(2);
        const float rq0 = rq[t0], rq1 = rq[t1];
        {
            const float fo0 = p.scale * rq0 * __expf(gc[t0]), fo1 = p.scale * rq1 * __expf(gc[t1]);
            const float e0 = __expf(gc[t0]) * rk[t0], e1 = __expf(gc[t1]) * rk[t1], b0 = bt[t0], b1 = bt[t1];
#pragma unroll
            for (int a = 0; a < NTW; a++) {
                o[a][0] *= fo0; o[a][1] *= fo0; o[a][2] *= fo1; o[a][3] *= fo1;
                const int col = cg * CW + a * 8 + 2 * tq;
                const uint32_t v0 = *reinterpret_cast<const uint32_t *>(Vs + t0 * S::LV + col);
                const uint32_t v1 = *reinterpret_cast<const uint32_t *>(Vs + t1 * S::LV + col);
                *reinterpret_cast<uint32_t *>(Rs + t0 * S::LV + col) =
                    M::pack(b0 * (M::lo(v0) - e0 * x[a][0]), b0 * (M::hi(v0) - e0 * x[a][1]));
                *reinterpret_cast<uint32_t *>(Rs + t1 * S::LV + col) =
                    M::pack(b1 * (M::lo(v1) - e1 * x[a][2]), b1 * (M::hi(v1) - e1 * x[a][3]));
            }
#pragma unroll
            for (int pb = 0; pb < 4 / NCG; pb++) {
                const int np = cg + NCG * pb;
                if (np <= rb)
#pragma unroll
                    for (int hn = 0; hn < 2; hn++) {
                        const int s0 = np * 16 + hn * 8 + 2 * tq;
                        float v[4];
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int t = e < 2 ? t0 : t1, s = s0 + (e & 1);
                            const float rq = e < 2 ? rq0 : rq1;
                            v[e] = s <= t ? p.scale * rq * rk[s] * __expf(gc[t] - gc[s]) * pa[pb][hn][e] : 0.f;
                        }
                        *reinterpret_cast<uint32_t *>(Ps + t0 * S::LC + s0) = M::pack(v[0], v[1]);
                        *reinterpret_cast<uint32_t *>(Ps + t1 * S::LC + s0) = M::pack(v[2], v[3]);
                    }
            }
        }
        __syncthreads();
        PROF(3);
        if (i + 1 < nch) { fetch_qkv(i + 1); cp_commit(); }   /* Q, V are free; K goes to the other buffer */
        PROF(4);

        /* ---- D: U = T R; Ud = rk exp(gL - gc) U ---- */
        {
            float u[NTW][4];
#pragma unroll
            for (int a = 0; a < NTW; a++) u[a][0] = u[a][1] = u[a][2] = u[a][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < 4; kk++)
                if (kk <= rb) {
                    uint32_t af[4];
                    ldsm4(af, Ts + blk64(rb * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8));
#pragma unroll
                    for (int np = 0; np < NTW / 2; np++) {
                        uint32_t bf[4];
                        ldsm4t(bf, frag_bk(Rs, S::LV, kk * 16, cg * CW + np * 16, lane));
                        M::mma(u[2 * np], af, bf[0], bf[1]);
                        M::mma(u[2 * np + 1], af, bf[2], bf[3]);
                    }
                }
            const float d0 = rk[t0] * __expf(gL - gc[t0]), d1 = rk[t1] * __expf(gL - gc[t1]);
#pragma unroll
            for (int a = 0; a < NTW; a++) {
                const int col = cg * CW + a * 8 + 2 * tq;
                *reinterpret_cast<uint32_t *>(Us + t0 * S::LV + col) = M::pack(u[a][0], u[a][1]);
                *reinterpret_cast<uint32_t *>(Us + t1 * S::LV + col) = M::pack(u[a][2], u[a][3]);
            }
#pragma unroll
            for (int a = 0; a < NTW; a += 2) {   /* Ud as hi + lo, as the state */
                float v[4][2];
#pragma unroll
                for (int m = 0; m < 4; m++) {
                    const float dd = (m & 1) ? d1 : d0;
                    v[m][0] = dd * u[a + (m >> 1)][2 * (m & 1)];
                    v[m][1] = dd * u[a + (m >> 1)][2 * (m & 1) + 1];
                }
                stsm4_hilo<M>(Ud + blk(rb * 16 + sm_row, cg * CW + (a + sm_tile) * 8, NCB), CC * BV, v);
            }
            fence_async_smem();
        }
        PROF(5);
        __syncthreads();
        PROF(6);
        if (i + 1 < nch) { fetch_t(i + 1); cp_commit(); }

        /* ---- E: O += P U (staged in Rs); S = exp(gL) S + K^T Ud ---- */
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
            if (want_o && kk <= rb) {
                uint32_t af[4];
                ldsm4(af, frag_a(Ps, S::LC, rb * 16, kk * 16, lane));
#pragma unroll
                for (int np = 0; np < NTW / 2; np++) {
                    uint32_t bf[4];
                    ldsm4t(bf, frag_bk(Us, S::LV, kk * 16, cg * CW + np * 16, lane));
                    M::mma(o[2 * np], af, bf[0], bf[1]);
                    M::mma(o[2 * np + 1], af, bf[2], bf[3]);
                }
            }
#pragma unroll
        for (int a = 0; a < NTW; a++) {
            const int col = cg * CW + a * 8 + 2 * tq;
            *reinterpret_cast<uint32_t *>(Rs + t0 * S::LV + col) = M::pack(o[a][0], o[a][1]);
            *reinterpret_cast<uint32_t *>(Rs + t1 * S::LV + col) = M::pack(o[a][2], o[a][3]);
        }
        {
            const float dl = __expf(gL);
#pragma unroll
            for (int nt = 0; nt < SNT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) st[nt][e] *= dl;
            /* the warpgroup's state tile is 64 rows x SNT n8 tiles: one wgmma per k16 (and half) */
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                uint32_t af[4];
                ldsm4t(af, frag_at(Ks, S::LK, kk * 16, srow, lane));
                const uint64_t dh = wg_desc(Ud + blk(kk * 16, sn0 * 8, NCB), NCB);
                wgt_rs<SNT * 8, M::bf, 1>(&st[0][0], af, dh, 1);
                if (M::split) wgt_rs<SNT * 8, M::bf, 1>(&st[0][0], af, dh + ((CC * BV * 2) >> 4), 1);
                wg_commit();
                wg_wait<1>();
            }
            PROF(7);
            wg_wait<0>();
            PROF(8);
            store_state_copy();
            PROF(9);
        }
        __syncthreads();
        PROF(10);
        if (!S::K2 && i + 1 < nch) { fetch_k(i + 1); cp_commit(); }   /* K was in use until now */
        /* O rows of this chunk, 16 bytes per thread */
        for (int x = tid; x < (p.pass == 1 ? 0 : c) * (BV / 8); x += ST) {
            const int r = x / (BV / 8), c8 = (x % (BV / 8)) * 8, col = vcol0 + c8;
            if (col >= p.V) continue;
            E *dst = static_cast<E *>(p.o) + ((row0 + r) * p.HV + j) * p.V + col;
            const uint4 wv = *reinterpret_cast<const uint4 *>(Rs + r * S::LV + c8);
            if ((p.V & 7) == 0) *reinterpret_cast<uint4 *>(dst) = wv;
            else {
                const E *xe = reinterpret_cast<const E *>(&wv);
                for (int e = 0; e < 8 && col + e < p.V; e++) dst[e] = xe[e];
            }
        }
        PROF(11);
    }
#ifdef GDN_CHUNK_PROFILE
    if (tid == 0 && blockIdx.x == 0 && nch > i0)
        printf("chunk_state KT=%d: cycles per chunk: wait %lld | A: setup %lld products %lld epilogue %lld | D: fetch %lld U %lld "
               "sync %lld | E: PU + state issue %lld state wait %lld copy %lld sync %lld | store %lld\n", KT,
               prof[0] / (nch - i0), prof[1] / (nch - i0), prof[2] / (nch - i0), prof[3] / (nch - i0), prof[4] / (nch - i0),
               prof[5] / (nch - i0), prof[6] / (nch - i0), prof[7] / (nch - i0), prof[8] / (nch - i0), prof[9] / (nch - i0),
               prof[10] / (nch - i0), prof[11] / (nch - i0));
#endif
#undef PROF
    /* the final state: ht (the last segment), or the segment's P / S_loc */
    if (float *dst = state_dst(p, pmode, segslot, j, nch == nch_all)) {
#pragma unroll
        for (int nt = 0; nt < SNT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int kr = srow + g + (e >> 1) * 8, vc = vcol0 + (sn0 + nt) * 8 + 2 * tq + (e & 1);
                if (kr < p.K && vc < ncols) dst[state_at(p, sbase, ncols, kr, vc)] = st[nt][e];
            }
    }
}

/* ---- kernel 2t: the state walk transposed, for K = 128 and whole 128-column
 * blocks of V. Two warpgroups hold S^T (their 64 columns of V x K) in fp32
 * registers, so the state, R and U are the A operands of the wgmma straight
 * from registers, and q, k, T and P are the B operands in shared memory:
 *   [X | O]^T = S^T [K; Q]^T               (S as hi + lo for bf16)
 *   P   = Q K^T, masked and scaled         (each warpgroup 32 of its columns)
 *   R^T = beta V^T - b X^T,   U^T = R^T T^T,   O^T = co O^T + U^T P^T
 *   S^T = exp(gL) S^T + (cu U)^T K        (U as hi + lo for bf16)
 * No state copy goes through shared memory, and the only block barriers are
 * P's exchange and the stage's release. q, k and v come by the TMA in the
 * 128-byte swizzle and the record by one bulk copy, two chunks ahead. ---- */
constexpr int TT = 256;   /* threads: two warpgroups */
struct TStage {           /* one chunk's inputs; 1024-byte aligned pieces for the swizzle */
    static constexpr int kq = 0;          /* [k cols 0-63][q cols 0-63][k cols 64-127][q cols 64-127], 64 rows x 128 B each */
    static constexpr int v = 32768;       /* [v cols 0-63][v cols 64-127] */
    static constexpr int rec = 49152;     /* T blocked, then the per-token rows */
    static constexpr int bytes = rec + REC;
};
struct TSmem {
    static constexpr int LO = 128 + 8;                    /* O staging row stride (elements) */
    /* two stages at 0 and TStage::bytes */
    static constexpr int p = 2 * TStage::bytes;           /* P blocked, C x C, one per stage */
    static constexpr int o = p + 2 * CC * CC * 2;         /* O rows, C x LO */
    static constexpr int mb = o + CC * LO * 2;            /* mbarriers: full[2], pfull[2]; then cnt[2] */
    static constexpr int bytes = mb + 4 * 8 + 2 * 4 + 1024;   /* + the base's alignment */
};
static_assert(TStage::bytes % 1024 == 0, "stages keep the swizzle's alignment");

/* descriptors: K-major in the 128-byte swizzle (8-row groups 1024 B apart;
 * lbo: MN-major, the distance of 64-column blocks), and K-major blocked
 * without swizzle (core matrices along k 128 B apart, along n 1024 B) */
__device__ __forceinline__ uint64_t desc_sw128(const void *p, int lbo) {
    return (uint64_t)((saddr(p) & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ uint64_t desc_blk(const void *p) {
    return (uint64_t)((saddr(p) & 0x3FFFF) >> 4) | ((uint64_t)(128 >> 4) << 16) | ((uint64_t)(1024 >> 4) << 32);
}
__device__ __forceinline__ void stsm4t(void *p, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};" ::"r"(saddr(p)), "r"(r0), "r"(r1), "r"(r2),
                 "r"(r3) : "memory");
}
__device__ __forceinline__ void bar_named(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
/* The two warpgroups take turns at the tensor cores: each issues a batch of
 * products only after the other has issued its previous one (named barriers 5
 * and 6), so one's epilogue runs while the other's products do. */
__device__ __forceinline__ void wg_turn(int cg) { asm volatile("bar.sync %0, 256;" ::"r"(5 + cg) : "memory"); }
__device__ __forceinline__ void wg_pass(int cg) { asm volatile("bar.arrive %0, 256;" ::"r"(6 - cg) : "memory"); }

/* fp32 accumulator pairs (m64 layout: v[2i], v[2i+1] at row g, v[2i+2], v[2i+3]
 * at row g + 8 of n8 tile i) as the A fragment of k step kk */
template <typename M> __device__ __forceinline__ void afrag(uint32_t a[4], const float *v, int kk) {
    a[0] = M::pack(v[8 * kk], v[8 * kk + 1]);
    a[1] = M::pack(v[8 * kk + 2], v[8 * kk + 3]);
    a[2] = M::pack(v[8 * kk + 4], v[8 * kk + 5]);
    a[3] = M::pack(v[8 * kk + 6], v[8 * kk + 7]);
}
/* the same as hi + lo halves (lo only where the type splits) */
template <typename M> __device__ __forceinline__ void afrag_hilo(uint32_t hi[4], uint32_t lo[4], const float *v, int kk) {
    afrag<M>(hi, v, kk);
    if (M::split)
#pragma unroll
        for (int e = 0; e < 4; e++)
            lo[e] = M::pack(v[8 * kk + 2 * e] - M::lo(hi[e]), v[8 * kk + 2 * e + 1] - M::hi(hi[e]));
}

template <typename E>
__global__ void __launch_bounds__(TT, 1) chunk_state_t_kernel(ChunkArgs p, const char *ws, const __grid_constant__ TmaMaps tm) {
    using M = mma_traits<E>;
    constexpr int NS = M::split ? 2 : 1;
    extern __shared__ __align__(1024) char smt_raw[];
    char *sm = smt_raw + ((1024 - (saddr(smt_raw) & 1023)) & 1023);
    E *Os = reinterpret_cast<E *>(sm + TSmem::o);
    /* full[s]: stage s has landed; pfull[s]: both halves of its P are in; cnt[s]:
     * the warpgroups done with it (the second one refills it) */
    uint64_t *full = reinterpret_cast<uint64_t *>(sm + TSmem::mb), *pfull = full + 2;
    int *cnt = reinterpret_cast<int *>(sm + TSmem::mb + 32);
    const int tid = threadIdx.x, lane = tid & 31, w = __shfl_sync(0xffffffffu, tid >> 5, 0), g = lane >> 2, tq = lane & 3;
    const int cg = w >> 2, wl = w & 3;   /* warpgroup (64 columns of V), warp in it (16 of them) */
    const int vb = blockIdx.x % p.nvb, j = (blockIdx.x / p.nvb) % p.HV, sg = (blockIdx.x / (p.nvb * p.HV)) % p.maxseg;
    const int n = blockIdx.x / (p.nvb * p.HV * p.maxseg), h = j / p.G;
    int64_t bos, len;
    seq_range(p, n, &bos, &len);
    const int nch_all = (int)((len + CC - 1) / CC);
    const int i0 = p.sc ? sg * p.sc : 0, nch = p.sc ? min(nch_all, i0 + p.sc) : nch_all;
    if (sg > 0 && i0 >= nch) return;
    const int64_t segslot = p.sc ? bos / ((int64_t)CC * p.sc) + n + sg : 0;
    /* pass 1 (a segment's map from a zero state): blocks past V's carry the columns
     * of P (K x K, from I, with v = 0) */
    const bool pmode = p.pass == 1 && vb >= p.nvb_v;
    const int ncols = pmode ? p.K : p.V;
    const int vcol0 = (pmode ? vb - p.nvb_v : vb) * 128, d0 = vcol0 + cg * 64 + wl * 16 + g;   /* this thread's rows of S^T: d0, d0 + 8 */
    const int64_t sbase = ((int64_t)n * p.HV + j) * p.K * p.V;

    auto fetch = [&](int i) {   /* chunk i into stage (i - i0) & 1, by thread 0 */
        char *stg = sm + ((i - i0) & 1) * TStage::bytes;
        uint64_t *mb = full + ((i - i0) & 1);
        const int row0 = (int)(bos + (int64_t)i * CC);
        mb_expect(mb, TStage::bytes - (pmode ? 16384 : 0));
        tma_rows(stg + TStage::kq, &tm.k, 0, h, row0, mb);
        tma_rows(stg + TStage::kq + 8192, &tm.q, 0, h, row0, mb);
        tma_rows(stg + TStage::kq + 16384, &tm.k, 64, h, row0, mb);
        tma_rows(stg + TStage::kq + 24576, &tm.q, 64, h, row0, mb);
        if (!pmode) {
            tma_rows(stg + TStage::v, &tm.v, vcol0, j, row0, mb);
            tma_rows(stg + TStage::v + 8192, &tm.v, vcol0 + 64, j, row0, mb);
        }
        bulk_copy(stg + TStage::rec, ws + (slot_of(bos, n, i) * p.HV + j) * (int64_t)REC, REC, mb);
    };

    /* S^T: st[4 i + e] = S[k = 8 i + 2 tq + (e & 1)][d0 + 8 (e >> 1)] */
    float st[64];
#pragma unroll
    for (int i = 0; i < 16; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int kr = 8 * i + 2 * tq + (e & 1), vc = d0 + 8 * (e >> 1);
            st[4 * i + e] = vc < ncols ? state_in(p, pmode, sg, segslot, j, sbase, kr, vc) : 0.f;
        }
    if (tid == 0) {
        mb_init(full); mb_init(full + 1); mb_init2(pfull); mb_init2(pfull + 1);
        cnt[0] = cnt[1] = 0;
    }
    __syncthreads();
    /* a programmatic launch (pass 0) comes here while the prep kernel runs: its records from now on */
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (tid == 0) {
        if (i0 < nch) fetch(i0);
        if (i0 + 1 < nch) fetch(i0 + 1);
    }
    /* the V^T fragment rows: this lane's token in its 8 x 8 matrix and 16-byte column (swizzled per row) */
    const int lm = lane >> 3, lr = lane & 7;

    if (cg == 1) wg_pass(1);   /* warpgroup 0 goes first */
#ifdef GDN_CHUNK_PROFILE   /* cycles per phase, block 0, the first thread of each warpgroup */
    long long prof[10] = {0}, t0_ = clock64();
#define TPROF(k) do { if ((tid & 127) == 0) { const long long t1_ = clock64(); prof[k] += t1_ - t0_; t0_ = t1_; } } while (0)
#else
#define TPROF(k) do { } while (0)
#endif
    for (int i = i0; i < nch; i++) {
        const int sl = (i - i0) & 1;
        const uint32_t par = ((i - i0) >> 1) & 1;
        E *Ps = reinterpret_cast<E *>(sm + TSmem::p) + sl * CC * CC;
        char *stg = sm + sl * TStage::bytes;
        const E *KQ = reinterpret_cast<const E *>(stg + TStage::kq);
        const char *Vb = stg + TStage::v + cg * 8192;
        const E *Ts = reinterpret_cast<const E *>(stg + TStage::rec);
        const float *F = reinterpret_cast<const float *>(stg + TStage::rec + REC_T);
        const int64_t row0 = bos + (int64_t)i * CC;
        const int c = len - (int64_t)i * CC < CC ? (int)(len - (int64_t)i * CC) : CC;
        mb_wait(full + sl, par);
        TPROF(0);
        if (c < CC) {   /* a sequence's last chunk: rows past it are another sequence's; k and v rows to zero
                         * (both warpgroups meet here, once a sequence) */
            for (int x = tid; x < (CC - c) * 8 * 4; x += TT) {
                const int part = x / ((CC - c) * 8), y = x % ((CC - c) * 8);
                char *base = part < 2 ? stg + TStage::kq + part * 16384 : stg + TStage::v + (part - 2) * 8192;
                *reinterpret_cast<uint4 *>(base + (c + y / 8) * 128 + (y % 8) * 16) = make_uint4(0, 0, 0, 0);
            }
            fence_async_smem();
            bar_named(1, TT);
        }

        /* ---- [X | O]^T = S^T [K; Q]^T and this warpgroup's 32 columns of P = Q K^T ---- */
        float xo[64], pa[16];
        {
            uint32_t sa[8][NS][4];
#pragma unroll
            for (int kk = 0; kk < 8; kk++) afrag_hilo<M>(sa[kk][0], sa[kk][NS - 1], st, kk);
            wg_fence();
            wg_turn(cg);
#pragma unroll
            for (int kk = 0; kk < 8; kk++) {
                const uint64_t db = desc_sw128(KQ + (kk >> 2) * 8192 + (kk & 3) * 16, 16);
                wgt_rs<128, M::bf, 0>(xo, sa[kk][0], db, kk);
                if (M::split) wgt_rs<128, M::bf, 0>(xo, sa[kk][1], db, 1);
            }
#pragma unroll
            for (int kk = 0; kk < 8; kk++)
                wgt_ss32<M::bf>(pa, desc_sw128(KQ + 4096 + (kk >> 2) * 8192 + (kk & 3) * 16, 16),
                                desc_sw128(KQ + cg * 2048 + (kk >> 2) * 8192 + (kk & 3) * 16, 16), kk);
            wg_commit();
            wg_pass(cg);
            wg_wait<0>();
            TPROF(1);
        }
        /* V^T in the accumulator layout: 8 x 8 matrices (tokens 8 i.., columns of this warp's rows) by ldmatrix.trans */
        uint32_t vt[8][2];
#pragma unroll
        for (int ip = 0; ip < 8; ip += 2) {
            const int tok = 8 * (ip + (lm >> 1)) + lr, ch = 2 * wl + (lm & 1);
            uint32_t r[4] = {0u, 0u, 0u, 0u};   /* P's columns: v = 0 */
            if (!pmode) ldsm4t(r, Vb + tok * 128 + ((ch ^ lr) << 4));
            vt[ip][0] = r[0]; vt[ip][1] = r[1]; vt[ip + 1][0] = r[2]; vt[ip + 1][1] = r[3];
        }
        /* P (rows t of this warp, columns s of this warpgroup): masked, scaled, to shared memory */
        {
            const int t0 = wl * 16 + g, t1 = t0 + 8;
            const float pq0 = p.scale * F[F_RQ * CC + t0], pq1 = p.scale * F[F_RQ * CC + t1];
            const float gl0 = F[F_GL * CC + t0], gl1 = F[F_GL * CC + t1];
            float pv[4][4];
#pragma unroll
            for (int a = 0; a < 4; a++) {
                const int s0 = cg * 32 + a * 8 + 2 * tq;
                const float2 rk = *reinterpret_cast<const float2 *>(F + F_RK * CC + s0);
                const float2 gs = *reinterpret_cast<const float2 *>(F + F_GL * CC + s0);
                pv[a][0] = s0 <= t0 ? pq0 * rk.x * ex2(gl0 - gs.x) * pa[4 * a] : 0.f;
                pv[a][1] = s0 + 1 <= t0 ? pq0 * rk.y * ex2(gl0 - gs.y) * pa[4 * a + 1] : 0.f;
                pv[a][2] = s0 <= t1 ? pq1 * rk.x * ex2(gl1 - gs.x) * pa[4 * a + 2] : 0.f;
                pv[a][3] = s0 + 1 <= t1 ? pq1 * rk.y * ex2(gl1 - gs.y) * pa[4 * a + 3] : 0.f;
            }
#pragma unroll
            for (int a = 0; a < 4; a += 2)
                stsm4(Ps + blk64(wl * 16 + 8 * (lm & 1) + lr, cg * 32 + 8 * (a + (lm >> 1))), M::pack(pv[a][0], pv[a][1]),
                      M::pack(pv[a][2], pv[a][3]), M::pack(pv[a + 1][0], pv[a + 1][1]), M::pack(pv[a + 1][2], pv[a + 1][3]));
            fence_async_smem();
            bar_named(2 + cg, 128);
            if ((tid & 127) == 0) mb_arrive(pfull + sl);
            TPROF(2);
        }
        /* ---- R^T = beta V^T - b X^T; U^T = R^T T^T ---- */
        float u[32];
        {
            float r[32];
#pragma unroll
            for (int a = 0; a < 8; a++) {
                const float2 bt = *reinterpret_cast<const float2 *>(F + F_BT * CC + 8 * a + 2 * tq);
                const float2 bb = *reinterpret_cast<const float2 *>(F + F_B * CC + 8 * a + 2 * tq);
                r[4 * a] = bt.x * M::lo(vt[a][0]) - bb.x * xo[4 * a];
                r[4 * a + 1] = bt.y * M::hi(vt[a][0]) - bb.y * xo[4 * a + 1];
                r[4 * a + 2] = bt.x * M::lo(vt[a][1]) - bb.x * xo[4 * a + 2];
                r[4 * a + 3] = bt.y * M::hi(vt[a][1]) - bb.y * xo[4 * a + 3];
            }
            uint32_t ra[4][4];
#pragma unroll
            for (int kk = 0; kk < 4; kk++) afrag<M>(ra[kk], r, kk);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) wgt_rs<64, M::bf, 0>(u, ra[kk], desc_blk(Ts + kk * 128), kk);
            wg_commit();
        }
        TPROF(3);
        /* O^T = co Q S (per token), while U runs */
        float o[32];
#pragma unroll
        for (int a = 0; a < 8; a++) {
            const float2 co = *reinterpret_cast<const float2 *>(F + F_CO * CC + 8 * a + 2 * tq);
            o[4 * a] = co.x * xo[32 + 4 * a]; o[4 * a + 1] = co.y * xo[33 + 4 * a];
            o[4 * a + 2] = co.x * xo[34 + 4 * a]; o[4 * a + 3] = co.y * xo[35 + 4 * a];
        }
        mb_wait(pfull + sl, par);   /* both warpgroups' halves of P are in */
        TPROF(4);
        wg_wait<0>();
        TPROF(5);
        /* ---- O^T += U^T P^T; S^T = exp(gL) S^T + (cu U)^T K ---- */
        {
            uint32_t ua[4][4], ud[4][NS][4];
#pragma unroll
            for (int kk = 0; kk < 4; kk++) afrag<M>(ua[kk], u, kk);
#pragma unroll
            for (int a = 0; a < 8; a++) {
                const float2 cu = *reinterpret_cast<const float2 *>(F + F_CU * CC + 8 * a + 2 * tq);
                u[4 * a] *= cu.x; u[4 * a + 1] *= cu.y; u[4 * a + 2] *= cu.x; u[4 * a + 3] *= cu.y;
            }
#pragma unroll
            for (int kk = 0; kk < 4; kk++) afrag_hilo<M>(ud[kk][0], ud[kk][NS - 1], u, kk);
            const float dl = __expf(F[F_GC * CC + CC - 1]);
#pragma unroll
            for (int x = 0; x < 64; x++) st[x] *= dl;
            wg_fence();
            wg_turn(cg);
#pragma unroll
            for (int kk = 0; kk < 4; kk++) wgt_rs<64, M::bf, 0>(o, ua[kk], desc_blk(Ps + kk * 128), 1);
            wg_commit();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                const uint64_t db = desc_sw128(KQ + kk * 16 * 64, 16384);
                wgt_rs<128, M::bf, 1>(st, ud[kk][0], db, 1);
                if (M::split) wgt_rs<128, M::bf, 1>(st, ud[kk][1], db, 1);
            }
            wg_commit();
            wg_pass(cg);
            wg_wait<1>();
            TPROF(6);
        }
        /* O rows of this chunk: transposed into shared memory, then 16 bytes a thread */
#pragma unroll
        for (int a = 0; a < 8; a += 2)
            stsm4t(Os + (8 * (a + (lm >> 1)) + lr) * TSmem::LO + cg * 64 + wl * 16 + 8 * (lm & 1), M::pack(o[4 * a], o[4 * a + 1]),
                   M::pack(o[4 * a + 2], o[4 * a + 3]), M::pack(o[4 * a + 4], o[4 * a + 5]), M::pack(o[4 * a + 6], o[4 * a + 7]));
        bar_named(2 + cg, 128);
        TPROF(7);
        for (int x = tid & 127; x < (p.pass == 1 ? 0 : c) * 8; x += 128) {   /* pass 1 needs the final state only */
            const int r = x >> 3, c8 = (x & 7) * 8;
            *reinterpret_cast<uint4 *>(static_cast<E *>(p.o) + ((row0 + r) * p.HV + j) * p.V + vcol0 + cg * 64 + c8) =
                *reinterpret_cast<const uint4 *>(Os + r * TSmem::LO + cg * 64 + c8);
        }
        wg_wait<0>();
        TPROF(8);
        bar_named(2 + cg, 128);   /* this warpgroup is done with the stage, its P and its O rows */
        if ((tid & 127) == 0 && (atomicAdd(cnt + sl, 1) & 1) && i + 2 < nch) fetch(i + 2);   /* the second one refills */
        TPROF(9);
    }
    if (cg == 0) wg_turn(0);   /* the last pass of warpgroup 1 */
#ifdef GDN_CHUNK_PROFILE
    if ((tid & 127) == 0 && blockIdx.x == 0 && nch > i0) {
        const long long m = nch - i0;
        printf("chunk_state_t wg%d: cycles per chunk: wait %lld | XO+P %lld | P out %lld | R, U issue %lld | P wait %lld | "
               "U wait %lld | Ud, S, UP %lld | O staged %lld | O out, S wait %lld | release %lld\n", cg, prof[0] / m, prof[1] / m,
               prof[2] / m, prof[3] / m, prof[4] / m, prof[5] / m, prof[6] / m, prof[7] / m, prof[8] / m, prof[9] / m);
    }
#endif
#undef TPROF
    /* the final state: ht (the last segment), or the segment's P / S_loc */
    if (float *dst = state_dst(p, pmode, segslot, j, nch == nch_all)) {
#pragma unroll
        for (int i = 0; i < 16; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int kr = 8 * i + 2 * tq + (e & 1), vc = d0 + 8 * (e >> 1);
                if (vc < ncols) dst[state_at(p, sbase, ncols, kr, vc)] = st[4 * i + e];
            }
    }
}

/* ---- the scan over segments: S_in(s + 1) = P_s S_in(s) + S_loc_s, fp32,
 * block per (sequence, value head, 16 columns of V) ---- */
constexpr int SCW = 16;

__global__ void __launch_bounds__(256) seg_scan_kernel(ChunkArgs p) {
    extern __shared__ float sv[];   /* S_in slice [K][SCW], then the next one */
    float *sn = sv + p.K * SCW;
    const int nsl = (p.V + SCW - 1) / SCW, cs = blockIdx.x % nsl, j = (blockIdx.x / nsl) % p.HV, n = blockIdx.x / (nsl * p.HV);
    int64_t bos, len;
    seq_range(p, n, &bos, &len);
    const int nseg = (int)(((len + CC - 1) / CC + p.sc - 1) / p.sc);
    if (nseg <= 1) return;
    const bool vfirst = (p.flags & GDN_STATE_V_FIRST) != 0;
    const int c = threadIdx.x % SCW, vc = cs * SCW + c;
    for (int i = threadIdx.x / SCW; i < p.K; i += blockDim.x / SCW)
        sv[i * SCW + c] = (p.h0 && vc < p.V)
                              ? p.h0[((int64_t)n * p.HV + j) * p.K * p.V + (vfirst ? (int64_t)vc * p.K + i : (int64_t)i * p.V + vc)] : 0.f;
    __syncthreads();
    for (int s = 0; s + 1 < nseg; s++) {
        const int64_t slot = bos / ((int64_t)CC * p.sc) + n + s;
        const float *P = p.seg_p + (slot * p.HV + j) * p.K * p.K, *L = p.seg_s + (slot * p.HV + j) * p.K * p.V;
        float *out = p.seg_in + ((slot + 1) * p.HV + j) * p.K * p.V;
        for (int i = threadIdx.x / SCW; i < p.K; i += blockDim.x / SCW) {
            float acc = vc < p.V ? L[(int64_t)i * p.V + vc] : 0.f;
            const float *Pi = P + (int64_t)i * p.K;
#pragma unroll 8
            for (int k = 0; k < p.K; k++) acc += Pi[k] * sv[k * SCW + c];
            sn[i * SCW + c] = acc;
            if (vc < p.V) out[(int64_t)i * p.V + vc] = acc;
        }
        __syncthreads();
        for (int i = threadIdx.x / SCW; i < p.K; i += blockDim.x / SCW) sv[i * SCW + c] = sn[i * SCW + c];
        __syncthreads();
    }
}

/* ---- host side ---- */

int bv_of(int K) { return K <= 128 ? 128 : 64; }

/* chunks per segment, 0 = no split: only when the (sequence, head, column
 * block) blocks would leave most SMs idle, or when asked (exec.seq_split) */
int seg_chunks(const gdn_plan *pl) {
    const gdn_config *c = &pl->c;
    const int64_t maxch = (pl->max_len + CC - 1) / CC, blocks = pl->N * c->HV * ((c->V + bv_of(c->K) - 1) / bv_of(c->K));
    int64_t want;
    if (pl->seq_split == 1 || maxch < 2) return 0;
    if (pl->seq_split > 1) want = pl->seq_split;
    else {
        if (2 * blocks > gdn::sm_count() || maxch < 16) return 0;
        want = gdn::sm_count() / blocks;
    }
    int64_t sc = (maxch + want - 1) / want;
    if (pl->seq_split == 0 && sc < 8) sc = 8;
    return sc >= maxch ? 0 : (int)sc;
}

struct WsLayout { size_t recs, seg, total; };
WsLayout ws_layout(const gdn_plan *pl, int sc) {
    const gdn_config *c = &pl->c;
    WsLayout l;
    l.recs = (size_t)(c->B * c->T / CC + pl->N + 1) * c->HV * REC;
    const size_t nseg = sc ? (size_t)(c->B * c->T / ((int64_t)CC * sc) + pl->N + 1) : 0;
    l.seg = nseg * c->HV * (size_t)c->K * c->V * 4;   /* each of seg_s, seg_in; seg_p is K x K */
    l.total = l.recs + 2 * l.seg + nseg * c->HV * (size_t)c->K * c->K * 4;
    return l;
}

template <typename Kern>
cudaError_t smem_attr(Kern k, int bytes, bool *done) {   /* host-side only: capture-safe */
    if (*done) return cudaSuccess;
    const cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e == cudaSuccess) *done = true;
    return e;
}

/* A tensor map for boxes of 64 rows x box columns of one head of a
 * token-major [rows][heads][cols] tensor of 16-bit elements (tma_rows); false
 * where the TMA cannot take it (unaligned base or row, no driver entry
 * point): cp.async then. Host only, no stream work: capture-safe. */
bool tile_map(CUtensorMap *m, const void *base, bool bf, int64_t rows, int heads, int cols, int box, bool sw128 = false) {
    static PFN_cuTensorMapEncodeTiled_v12000 enc = nullptr;
    static bool tried = false;
    if (!tried) {
        cudaDriverEntryPointQueryResult q;
        void *fn = nullptr;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            enc = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
        tried = true;
    }
    if (!enc || rows <= 0 || (reinterpret_cast<uintptr_t>(base) & 15) || (cols & 7)) return false;
    const cuuint64_t dim[3] = {(cuuint64_t)cols, (cuuint64_t)heads, (cuuint64_t)rows};
    const cuuint64_t stride[2] = {(cuuint64_t)cols * 2, (cuuint64_t)heads * cols * 2};
    const cuuint32_t bx[3] = {(cuuint32_t)box, 1, CC}, es[3] = {1, 1, 1};
    return enc(m, bf ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3, const_cast<void *>(base), dim,
               stride, bx, es, CU_TENSOR_MAP_INTERLEAVE_NONE, sw128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <int KT, int BV, typename E>
cudaError_t launch(ChunkArgs p, int64_t rows, int64_t N, int maxch, char *ws, cudaStream_t st) {
    static bool a1 = false, a2 = false;
    cudaError_t e = smem_attr(chunk_prep_kernel<KT, E>, PrepSmem<KT>::bytes, &a1);
    if (e == cudaSuccess) e = smem_attr(chunk_state_kernel<KT, BV, E>, StateSmem<KT, BV>::bytes, &a2);
    if (e != cudaSuccess) return e;
    const int smem = StateSmem<KT, BV>::bytes;
    p.nvb_v = (p.V + BV - 1) / BV;
    /* q, k and v by the TMA where the padded rows fit a box (256 columns) */
    TmaMaps tm{};
    const bool bf = mma_traits<E>::bf;
    p.tma = KT + 8 <= 256 && (reinterpret_cast<uintptr_t>(ws) & 15) == 0 && tile_map(&tm.q, p.q, bf, rows, p.H, p.K, KT + 8) &&
            tile_map(&tm.k, p.k, bf, rows, p.H, p.K, KT + 8) && tile_map(&tm.v, p.v, bf, rows, p.HV, p.V, BV + 8);
    /* the transposed kernel where K = 128, V is whole 128-column blocks and
     * the TMA takes q, k, v in the 128-byte swizzle (64-column boxes) */
    TmaMaps tmt{};
    bool tr = false;
    if constexpr (KT == 128)
        tr = p.K == 128 && p.V % 128 == 0 && (reinterpret_cast<uintptr_t>(ws) & 15) == 0 &&
             tile_map(&tmt.q, p.q, bf, rows, p.H, p.K, 64, true) && tile_map(&tmt.k, p.k, bf, rows, p.H, p.K, 64, true) &&
             tile_map(&tmt.v, p.v, bf, rows, p.HV, p.V, 64, true);
    if (tr) {
        static bool a3 = false;
        e = smem_attr(chunk_state_t_kernel<E>, TSmem::bytes, &a3);
        if (e != cudaSuccess) return e;
    }
    auto walk = [&](const ChunkArgs &pa, unsigned blocks) {
        if (tr && pa.pass == 0) {   /* a programmatic dependent of the prep kernel: its launch and prologue overlap the prep's tail */
            cudaLaunchAttribute at[1];
            at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            at[0].val.programmaticStreamSerializationAllowed = 1;
            cudaLaunchConfig_t lc = {};
            lc.gridDim = dim3(blocks); lc.blockDim = dim3(TT); lc.dynamicSmemBytes = TSmem::bytes; lc.stream = st;
            lc.attrs = at; lc.numAttrs = 1;
            return cudaLaunchKernelEx(&lc, chunk_state_t_kernel<E>, pa, ws, tmt);
        }
        if (tr) chunk_state_t_kernel<E><<<blocks, TT, TSmem::bytes, st>>>(pa, ws, tmt);   /* passes 1 and 3 */
        else chunk_state_kernel<KT, BV, E><<<blocks, ST, smem, st>>>(pa, ws, tm);
        return cudaGetLastError();
    };
    if (maxch > 0) chunk_prep_kernel<KT, E><<<(unsigned)(N * p.H * maxch), PT, PrepSmem<KT>::bytes, st>>>(p, ws, maxch);
    if (!p.sc) {
        p.pass = 0; p.maxseg = 1; p.nvb = p.nvb_v;
        e = walk(p, (unsigned)(N * p.HV * p.nvb));
        return e != cudaSuccess ? e : cudaGetLastError();
    }
    p.maxseg = (maxch + p.sc - 1) / p.sc;
    p.pass = 1; p.nvb = p.nvb_v + (p.K + BV - 1) / BV;
    e = walk(p, (unsigned)(N * p.maxseg * p.HV * p.nvb));
    if (e != cudaSuccess) return e;
    seg_scan_kernel<<<(unsigned)(N * p.HV * ((p.V + SCW - 1) / SCW)), 256, 2 * p.K * SCW * sizeof(float), st>>>(p);
    p.pass = 3; p.nvb = p.nvb_v;
    walk(p, (unsigned)(N * p.maxseg * p.HV * p.nvb));
    return cudaGetLastError();
}

template <typename E>
cudaError_t launch_k(const ChunkArgs &p, int64_t rows, int64_t N, int maxch, char *ws, cudaStream_t st) {
    if (p.K <= 64) return launch<64, 128, E>(p, rows, N, maxch, ws, st);
    if (p.K <= 128) return launch<128, 128, E>(p, rows, N, maxch, ws, st);
    return launch<256, 64, E>(p, rows, N, maxch, ws, st);
}


}  // namespace

extern "C" size_t gdn_cuda_chunk_fwd_ws(const gdn_plan *pl) {
    return pl->c.dtype == GDN_F32 ? 0 : ws_layout(pl, seg_chunks(pl)).total;
}

extern "C" gdn_status gdn_cuda_chunk_fwd(const gdn_plan *pl, const gdn_fwd_args *a, void *ws, void *stream) {
    const gdn_config *c = &pl->c;
    if (c->dtype == GDN_F32) return gdn_cuda_recurrent_fwd(pl, a, stream);
    if (pl->N * c->HV == 0) return GDN_OK;
    ChunkArgs p;
    p.q = a->q; p.k = a->k; p.v = a->v; p.g = a->g; p.beta = a->beta;
    p.A_log = a->A_log; p.dt_bias = a->dt_bias; p.h0 = a->h0; p.o = a->o; p.ht = a->ht;
    const gdn_saved_layout sl = gdn_saved_at(c, a->saved);
    p.rstd_q = sl.rstd_q; p.rstd_k = sl.rstd_k;
    p.cu = c->cu_seqlens_dev; p.T = c->T;
    p.H = c->H; p.HV = c->HV; p.K = c->K; p.V = c->V; p.G = pl->G; p.gdt = (int)c->gate_dtype;
    p.scale = c->scale; p.flags = c->flags;
    const int maxch = (int)((pl->max_len + CC - 1) / CC);
    p.sc = seg_chunks(pl);
    const WsLayout wl = ws_layout(pl, p.sc);
    p.seg_s = reinterpret_cast<float *>(static_cast<char *>(ws) + wl.recs);
    p.seg_in = reinterpret_cast<float *>(static_cast<char *>(ws) + wl.recs + wl.seg);
    p.seg_p = reinterpret_cast<float *>(static_cast<char *>(ws) + wl.recs + 2 * wl.seg);
    cudaStream_t st = (cudaStream_t)stream;
    const int64_t rows = c->B * c->T;
    const cudaError_t e = c->dtype == GDN_BF16 ? launch_k<__nv_bfloat16>(p, rows, pl->N, maxch, (char *)ws, st)
                                               : launch_k<__half>(p, rows, pl->N, maxch, (char *)ws, st);
    if (e != cudaSuccess) return gdn_fail(GDN_ERR_BACKEND, "chunk forward kernel launch: %s", cudaGetErrorString(e));
    return GDN_OK;
}
