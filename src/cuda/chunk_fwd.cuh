/* What the CUDA chunk forward's files share (the overview is in chunk_fwd.cu):
 * the kernel arguments, the tensor-core, cp.async and TMA primitives, the
 * record the prep kernel leaves for the state kernels, where a walk's state
 * comes from and goes to, the transposed walks' chunk step, and the
 * launchers each pass file defines. */
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>
#ifdef GDN_CHUNK_PROFILE
#include <cstdio>
#endif
#include "cuda/common.cuh"
#include "cuda/cuda_backend.h"

/* Only inline functions, templates, types and constants here (one definition
 * in every file that includes it). The kernels stay local to their files (an
 * unnamed namespace in each) and are launched through the launchers at the
 * end, defined and instantiated next to them. */
namespace gdn {
namespace cfwd {

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
    int lpt;   /* the transposed walk's sequences longest first: their count, or 0 (common.cuh longest_first) */
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
    /* the backward's states mode (smode; whole sequences or a window): no o,
     * each chunk's entering state into states ([slot][HV][K][V] fp32 k-first)
     * where that is not NULL, ht where that is not */
    int smode;
    float *states;
    /* brec (the states mode, bf16, K = 128; else NULL): the prep writes the
     * backward's records too, at rec_slot's place (chunk_fwd_prep.cu); Tm and
     * P as the fused pass's bf16 tiles where brec16, else in fp32 */
    float *brec;
    int brec16;
    /* st16 (the transposed kernel, V = 128): each state rounded to bf16 in the
     * backward's fused-pass tile layout (s0_at), 32 KB apart, instead; 2 on
     * the way in: required (launch refuses a shape that cannot) */
    int st16;
    /* a window of chunks (wn > 0; pass 0): chunks [w0, w0 + wn) of each
     * sequence, from h0 (the state entering chunk w0, h0's layout) to ht (the
     * state after the window's last chunk); the records and states at
     * n * wn + i - w0 instead of the slot (rec_slot) */
    int w0, wn;
    /* the checkpoints for the backward's windows (gdn_saved_ckpts): the
     * forward's walk (pass 0) stores the state entering chunks ckpt_wn,
     * 2 ckpt_wn, .. (nck at most) into ckpt ([c][N][HV][K][V] in h0's layout,
     * c = i / ckpt_wn - 1, ckpt_stride floats apart; NULL: none), and block 0
     * of its last pass puts tag_val in tag[0] and mtag_val in tag[1] (the
     * saved maps' tag: seg_p, seg_s in saved; NULL: no tags). The backward's
     * checkpoint walk (the states mode) and its segment maps (the prep and
     * pass 1): nothing at all where *skip == skip_val, the forward's
     * checkpoints or maps being there (skip NULL: it walks) */
    float *ckpt;
    int ckpt_wn, nck;
    int64_t ckpt_stride;
    int *tag;
    int tag_val, mtag_val;
    const int *skip;
    int skip_val;
    /* the backward's last windows' states kept (the transposed kernel's
     * forward walk with ckpt, V = 128; NULL: none): the state entering each
     * chunk i of windows keep_kw.. (of ckpt_wn chunks) as the fused pass's
     * bf16 tile (st16's) into keep at ((i / ckpt_wn - keep_kw) keep_stride +
     * n ckpt_wn + i % ckpt_wn) HV + j tiles (keep_stride = N ckpt_wn: each
     * window as the backward's window_at lays it out), and ktag_val into
     * tag[2] (0: none kept). The backward's states mode: its walk alone (not
     * the prep: the records are still wanted) does nothing where *wskip ==
     * wskip_val, those tiles being there */
    float *keep;
    int keep_kw, ktag_val;
    int64_t keep_stride;
    const int *wskip;
    int wskip_val;
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
/* f16 as the backward's wgmma kernels take it: q, k, v, dO exact in their own
 * type, the computed operands as hi + lo halves as with bf16 */
struct f16_hilo : mma_traits<__half> {
    static constexpr bool split = true;
};

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

/* descriptors: K-major in the 128-byte swizzle (8-row groups 1024 B apart;
 * lbo: MN-major, the distance of 64-column blocks), and K-major blocked
 * without swizzle (core matrices along k 128 B apart, along n 1024 B) */
__device__ __forceinline__ uint64_t desc_sw128(const void *p, int lbo) {
    return (uint64_t)((saddr(p) & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ uint64_t desc_blk(const void *p) {
    return (uint64_t)((saddr(p) & 0x3FFFF) >> 4) | ((uint64_t)(128 >> 4) << 16) | ((uint64_t)(1024 >> 4) << 32);
}
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

/* byte offset of element e of row r in a 64-element-wide block of 128-byte
 * bf16 / f16 rows in the 128-byte swizzle (1024-byte aligned); its descriptor */
__device__ __forceinline__ int swz(int r, int e) { return r * 128 + ((((e >> 3) ^ r) & 7) << 4) + (e & 7) * 2; }
/* the backward's bf16 states (ChunkArgs::st16): the byte offset of element
 * (k, v) of a 128 x 128 state in the fused pass's tile [v / 64][k / 64]
 * (64 x 64, swz) */
__device__ __forceinline__ int s0_at(int k, int v) { return (v >> 6) * 16384 + (k >> 6) * 8192 + swz(k & 63, v & 63); }
__device__ __forceinline__ uint64_t vdesc(const char *p) { return desc_sw128(p, 16); }
/* the descriptor of an operand off bytes (a multiple of 16) past the one d
 * describes: the address field is (address & 0x3FFFF) >> 4 and a block's
 * shared memory ends below 2^18, so off / 16 added never carries out of it.
 * One 64-bit add instead of the descriptor formed again (~5 uniform
 * instructions: bench/NOTES.md v5.60) */
__device__ __forceinline__ uint64_t desc_off(uint64_t d, int off) { return d + (uint64_t)(off >> 4); }
/* a warpgroup's m64n64 fp32 accumulator (32 values a thread; tx the thread's
 * index in the block), times row scales f0 (the thread's rows 16 w + g) and
 * f1 (16 w + g + 8), to a 64-column block of 128-byte rows in the 128-byte
 * swizzle (1024-byte aligned) as hi bf16 halves, and the rounding residuals
 * at lo (~16 bits of the value kept: the hi + lo operands of the wgmma
 * kernels); four 8 x 8 matrices a stmatrix */
template <typename M>
__device__ __forceinline__ void acc_swz_hilo(const float *x, char *hi, char *lo, int tx, float f0 = 1.f, float f1 = 1.f) {
    const int lane = tx & 31, wl = (tx >> 5) & 3, m = lane >> 3;
    const int row = 16 * wl + 8 * (m & 1) + (lane & 7);
#pragma unroll
    for (int a = 0; a < 8; a += 2) {
        const int at = swz(row, 8 * (a + (m >> 1)));
        uint32_t h[4], l[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int b = 4 * (a + (q >> 1)) + 2 * (q & 1);
            const float f = (q & 1) ? f1 : f0, v0 = x[b] * f, v1 = x[b + 1] * f;
            h[q] = M::pack(v0, v1);
            l[q] = M::pack(v0 - M::lo(h[q]), v1 - M::hi(h[q]));
        }
        stsm4(hi + at, h[0], h[1], h[2], h[3]);
        stsm4(lo + at, l[0], l[1], l[2], l[3]);
    }
}
/* wgmma with A and B from shared memory; TA, TB: operand MN-major (transposed); BF: bf16, else f16 */
template <int TA, int TB, bool BF = true> __device__ __forceinline__ void wss64(float *d, uint64_t da, uint64_t db, int acc) {
    if constexpr (BF) asm volatile(WGX_OP(64, "bf16", WG_R32, "%32, %33", "%34", "%35, %36") : WG_D32 : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
    else asm volatile(WGX_OP(64, "f16", WG_R32, "%32, %33", "%34", "%35, %36") : WG_D32 : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
}
template <int TA, int TB> __device__ __forceinline__ void wss128(float *d, uint64_t da, uint64_t db, int acc) {
    asm volatile(WGX_OP(128, "bf16", WG_R64, "%64, %65", "%66", "%67, %68") : WG_D64 : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
}
template <int TA, int TB, bool BF = true> __device__ __forceinline__ void wss32(float *d, uint64_t da, uint64_t db, int acc) {
    if constexpr (BF) asm volatile(WGX_OP(32, "bf16", WG_R16, "%16, %17", "%18", "%19, %20") : WG_D16 : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
    else asm volatile(WGX_OP(32, "f16", WG_R16, "%16, %17", "%18", "%19, %20") : WG_D16 : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
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

/* rows [row, row + box) of a [rows][256 bytes] view of a buffer (byte_rows),
 * copied as they lie: the same bytes as a bulk copy of box * 256 bytes, but
 * from the TMA's tensor path, whose writes the sanitizer's racecheck does
 * not attribute to the issuing thread (it does those of cp.async.bulk, and
 * cannot order them by the mbarrier) */
__device__ __forceinline__ void tma_byte_rows(void *dst, const CUtensorMap *map, int row, void *mb) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                 ::"r"(saddr(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(0), "r"(row), "r"(saddr(mb))
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
/* where chunk i of sequence n's record (and state) is: its slot, or its place in the window */
__device__ __forceinline__ int64_t rec_slot(const ChunkArgs &p, int64_t bos, int n, int i) {
    return p.wn ? (int64_t)n * p.wn + (i - p.w0) : slot_of(bos, n, i);
}
/* the backward's checkpoint walk with the forward's checkpoints there: nothing to do */
__device__ __forceinline__ bool walk_skipped(const ChunkArgs &p) { return p.skip && *p.skip == p.skip_val; }
/* the backward's states walk of a window whose tiles the forward kept (the prep still runs) */
__device__ __forceinline__ bool states_kept(const ChunkArgs &p) { return p.wskip && *p.wskip == p.wskip_val; }
/* where the forward keeps the state entering chunk i as a tile (NULL: not kept) */
__device__ __forceinline__ char *keep_of(const ChunkArgs &p, int n, int i, int j) {
    if (!p.keep || i < p.keep_kw * p.ckpt_wn) return nullptr;
    const int64_t t = (int64_t)(i / p.ckpt_wn - p.keep_kw) * p.keep_stride + (int64_t)n * p.ckpt_wn + i % p.ckpt_wn;
    return reinterpret_cast<char *>(p.keep) + (t * p.HV + j) * ((int64_t)p.K * p.V * 2);   /* bf16 tiles */
}
/* where the state entering chunk i goes as a checkpoint (NULL: not one); sbase: (n, j)'s offset in h0 */
__device__ __forceinline__ float *ckpt_of(const ChunkArgs &p, int i, int64_t sbase) {
    if (!p.ckpt || i <= 0 || i % p.ckpt_wn || i / p.ckpt_wn > p.nck) return nullptr;
    return p.ckpt + (int64_t)(i / p.ckpt_wn - 1) * p.ckpt_stride + sbase;
}
/* the end of the run of chunks from ib: the next checkpoint's chunk, or nch (p.ckpt set) */
__device__ __forceinline__ int ckpt_end(const ChunkArgs &p, int ib, int nch) {
    const int e = (ib / p.ckpt_wn + 1) * p.ckpt_wn;
    return e < nch ? e : nch;
}
/* a state walk's chunks [*i0, *nch) of a sequence of nch_all chunks, segment sg (the split), or the
 * window; false: none to walk and nothing to write (a later segment, or a window past the end) */
__device__ __forceinline__ bool walk_range(const ChunkArgs &p, int sg, int nch_all, int *i0, int *nch) {
    *i0 = p.sc ? sg * p.sc : p.w0;
    *nch = p.sc ? min(nch_all, *i0 + p.sc) : p.wn ? min(nch_all, p.w0 + p.wn) : nch_all;
    return !((sg > 0 || p.wn) && *i0 >= *nch);
}

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

/* ---- the transposed walks' chunk step (kernels 2t, chunk_fwd_state_t.cu at
 * K = 128, and 2tk, chunk_fwd_state_tk.cu at K = 256): a warpgroup holds 64
 * rows of S^T, this thread's rows 16 wl + g and + 8 of them (wl: the warp in
 * the warpgroup), and the chunk's record F (fp32 rows C apart) ---- */
__device__ __forceinline__ void stsm4t(void *p, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};" ::"r"(saddr(p)), "r"(r0), "r"(r1), "r"(r2),
                 "r"(r3) : "memory");
}
/* V^T in the accumulator layout: 8 x 8 matrices (tokens 8 i.., columns of
 * this warp's rows) by ldmatrix.trans from the warpgroup's 64 columns of v
 * (Vb: 128-byte rows in the 128-byte swizzle); zero: none loaded (v = 0) */
__device__ __forceinline__ void vt_frags(uint32_t vt[8][2], const char *Vb, int wl, int lane, bool zero = false) {
    const int lm = lane >> 3, lr = lane & 7;
#pragma unroll
    for (int ip = 0; ip < 8; ip += 2) {
        const int tok = 8 * (ip + (lm >> 1)) + lr, ch = 2 * wl + (lm & 1);
        uint32_t r[4] = {0u, 0u, 0u, 0u};
        if (!zero) ldsm4t(r, Vb + tok * 128 + ((ch ^ lr) << 4));
        vt[ip][0] = r[0]; vt[ip][1] = r[1]; vt[ip + 1][0] = r[2]; vt[ip + 1][1] = r[3];
    }
}
/* R^T = beta V^T - b X^T and U^T = R^T T^T's products issued (committed,
 * not waited for) into u; x: X^T (32 values a thread), Ts: T blocked */
template <typename M, typename E>
__device__ __forceinline__ void u_issue(float u[32], const float *x, const uint32_t vt[8][2], const float *F, const E *Ts, int tq) {
    float r[32];
#pragma unroll
    for (int a = 0; a < 8; a++) {
        const float2 bt = *reinterpret_cast<const float2 *>(F + F_BT * CC + 8 * a + 2 * tq);
        const float2 bb = *reinterpret_cast<const float2 *>(F + F_B * CC + 8 * a + 2 * tq);
        r[4 * a] = bt.x * M::lo(vt[a][0]) - bb.x * x[4 * a];
        r[4 * a + 1] = bt.y * M::hi(vt[a][0]) - bb.y * x[4 * a + 1];
        r[4 * a + 2] = bt.x * M::lo(vt[a][1]) - bb.x * x[4 * a + 2];
        r[4 * a + 3] = bt.y * M::hi(vt[a][1]) - bb.y * x[4 * a + 3];
    }
    uint32_t ra[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; kk++) afrag<M>(ra[kk], r, kk);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wgt_rs<64, M::bf, 0>(u, ra[kk], desc_blk(Ts + kk * 128), kk);
    wg_commit();
}
/* O^T = co (Q S)^T per token: qs, this thread's 32 values of (Q S)^T */
__device__ __forceinline__ void o_scaled(float o[32], const float *qs, const float *F, int tq) {
#pragma unroll
    for (int a = 0; a < 8; a++) {
        const float2 co = *reinterpret_cast<const float2 *>(F + F_CO * CC + 8 * a + 2 * tq);
        o[4 * a] = co.x * qs[4 * a]; o[4 * a + 1] = co.y * qs[4 * a + 1];
        o[4 * a + 2] = co.x * qs[4 * a + 2]; o[4 * a + 3] = co.y * qs[4 * a + 3];
    }
}
/* P = Q K^T masked (s <= t) and scaled (scale rq_t rk_s exp(g_t - g_s)):
 * pa, the thread's accumulators of rows t0 = 16 wl + g and t0 + 8 and NA
 * n8 tiles of columns from s_first */
template <int NA>
__device__ __forceinline__ void p_masked(float pv[NA][4], const float *pa, const float *F, float scale, int t0, int s_first, int tq) {
    const int t1 = t0 + 8;
    const float pq0 = scale * F[F_RQ * CC + t0], pq1 = scale * F[F_RQ * CC + t1];
    const float gl0 = F[F_GL * CC + t0], gl1 = F[F_GL * CC + t1];
#pragma unroll
    for (int a = 0; a < NA; a++) {
        const int s0 = s_first + a * 8 + 2 * tq;
        const float2 rk = *reinterpret_cast<const float2 *>(F + F_RK * CC + s0);
        const float2 gs = *reinterpret_cast<const float2 *>(F + F_GL * CC + s0);
        pv[a][0] = s0 <= t0 ? pq0 * rk.x * ex2(gl0 - gs.x) * pa[4 * a] : 0.f;
        pv[a][1] = s0 + 1 <= t0 ? pq0 * rk.y * ex2(gl0 - gs.y) * pa[4 * a + 1] : 0.f;
        pv[a][2] = s0 <= t1 ? pq1 * rk.x * ex2(gl1 - gs.x) * pa[4 * a + 2] : 0.f;
        pv[a][3] = s0 + 1 <= t1 ? pq1 * rk.y * ex2(gl1 - gs.y) * pa[4 * a + 3] : 0.f;
    }
}
/* the state update's operands: u scaled by cu per token and split into the
 * A fragments ud (hi + lo where the type splits), the state decayed by
 * exp(gL) (st: 64 values a thread) */
template <typename M, int NS>
__device__ __forceinline__ void state_step_operands(uint32_t ud[4][NS][4], float u[32], float st[64], const float *F, int tq) {
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
}

/* the tensor maps of q, k, v for the TMA (valid where ChunkArgs::tma is set) */
struct TmaMaps { CUtensorMap q, k, v; };
/* a tensor map for boxes of 64 rows x box columns of one head of a
 * token-major [rows][heads][cols] 16-bit tensor (tma_rows; chunk_fwd.cu);
 * false where the TMA cannot take it */
__attribute__((visibility("hidden"))) bool tile_map(CUtensorMap *m, const void *base, bool bf, int64_t rows, int heads, int cols, int box,
                                                    bool sw128 = false);
/* a tensor map of a buffer as rows of 256 bytes (rows of them, from base,
 * 256-byte aligned), boxes of box rows (tma_byte_rows); false where the TMA
 * cannot take it */
__attribute__((visibility("hidden"))) bool byte_rows_map(CUtensorMap *m, const void *base, int64_t rows, int box);

/* ---- the passes' host launchers. Each pass file defines its own and
 * instantiates them for the tiles launch_k (chunk_fwd.cu) dispatches to:
 * KT = 64 and 128 with BV = 128, KT = 256 with BV = 64; E = bf16, f16. attr()
 * raises the kernel's dynamic shared memory limit (once); launch() queues it. ---- */

template <typename Kern>
cudaError_t smem_attr(Kern k, int bytes, bool *done) {   /* host-side only: capture-safe */
    if (*done) return cudaSuccess;
    const cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e == cudaSuccess) *done = true;
    return e;
}

/* hidden: the launchers link the files of one library and are no part of its
 * exported symbols (file-local before the split) */
#define GDN_CFWD_HIDDEN __attribute__((visibility("hidden")))
/* chunk_fwd_prep.cu */
template <int KT, typename E> struct GDN_CFWD_HIDDEN PrepPass {
    static cudaError_t attr();
    static void launch(const ChunkArgs &p, int64_t N, int maxch, char *ws, cudaStream_t st);
};
/* chunk_fwd_state.cu; launch returns cudaGetLastError() */
template <int KT, int BV, typename E> struct GDN_CFWD_HIDDEN StatePass {
    static cudaError_t attr();
    static cudaError_t launch(const ChunkArgs &p, unsigned blocks, const char *ws, const TmaMaps &tm, cudaStream_t st);
};
/* chunk_fwd_state_t.cu; launch makes pass 0 a programmatic dependent of the prep */
template <typename E> struct GDN_CFWD_HIDDEN StateTPass {
    static cudaError_t attr();
    static cudaError_t launch(const ChunkArgs &p, unsigned blocks, const char *ws, const TmaMaps &tm, cudaStream_t st);
};
/* chunk_fwd_state_tk.cu (K = 256, pass 0: the forward, its checkpoints, the backward's states walk); as StateTPass */
template <typename E> struct GDN_CFWD_HIDDEN StateTKPass {
    static cudaError_t attr();
    static cudaError_t launch(const ChunkArgs &p, unsigned blocks, const char *ws, const TmaMaps &tm, cudaStream_t st);
};
/* chunk_fwd_split.cu: chunks per segment (0 = no split; _kept: for a forward
 * that keeps its maps in saved), and the scan between passes 1 and 3 */
GDN_CFWD_HIDDEN int seg_chunks(const gdn_plan *pl);
GDN_CFWD_HIDDEN int seg_chunks_kept(const gdn_plan *pl);
GDN_CFWD_HIDDEN void seg_scan_launch(const ChunkArgs &p, int64_t N, cudaStream_t st);

}  // namespace cfwd
}  // namespace gdn
