/* CUDA chunk backward v5, the fused pass (bf16, K = V = 128): one block per
 * (sequence, value head) walks its chunks in reverse with the state
 * gradient dS in registers and forms every chunk-local gradient on the way,
 * so the reverse sweep and the local stage are one kernel and no chunk's dS
 * leaves the SM; its launcher.
 *
 * Three warpgroups, each with its own loop over the chunks, meeting at
 * barriers (named, per phase):
 *   S (warpgroup 0) holds dS (128 x 128 fp32, 128 registers a thread):
 *     stores dS as a bf16 operand beside the state S0 entering the chunk
 *     (bf16 as the forward's state kernel stored it, BwdArgs::st16, copied
 *     with the rows; else fp32, staged and rounded here), S0 . dS (fp32
 *     sums of the bf16 S0) for the gate, then the update
 *       dS <- exp(gL) dS + q^T (diag(qs) dO) - k^T (diag(xs) dBv)
 *     with q, k raw and the scaled dO, dBv as hi + lo (all from shared
 *     memory: A operands from registers cost the 128 a wgmma pipeline),
 *     and in P4, where it idles, KK = K K^T into D for V (an mbarrier).
 *   V (warpgroup 1): dU = diag(ek rk) K dS + P^T dO, dTm = dU X^T,
 *     dBv = Tm^T dU (dv, dbeta's dBv . v), dP = dO U^T (the pair terms,
 *     dP~), dQc += dP~ K (onto T's part), then tmp = dTm Tm^T,
 *     dA = -Tm^T tmp and, with S's KK, the gate's pairs and dbeta's
 *     terms, and dKK + dKK^T for the T side.
 *   T (warpgroup 2): X = beta v - xs K S0, U = Tm X, dKd = U dS^T (dKc =
 *     ek dKd, the gate's last-row pairs k . dKd), Xq = dO S0^T (dQc's
 *     first part, the gate's q . Xq; before dBk, since V waits for it),
 *     dBk = -dBv S0^T (dKc, the gate's and dbeta's k . dBk), dKc +=
 *     dP~^T Q + (dKK + dKK^T) K.
 * (dTm = dU X^T is dWk Bk^T + dU Bv^T of chunk_bwd.c, X being Bv - Bk S0;
 * dBk = Tm^T dWk is -dBv S0^T: neither needs dWk.) Then dQc, dKc meet the
 * other value heads' in the cluster (G blocks), dq and dk leave through
 * the L2 norm chain (summed by S), and chunk_gate forms dg, dbeta and the
 * gate's partials (by V and T meanwhile), as the local stage does.
 *
 * Operands: q, k, v, dO raw (exact in bf16; rstd as row scales); Tm, P, S0,
 * dS, X and U rounded to bf16; dU, dBv and every K-side operand formed
 * here as hi + lo halves (the measured margins: bench/NOTES.md v4.7, v5 and
 * v5.49).
 * Shared memory (bytes from a 1024-aligned base): the chunk's rows
 * [KR | QR | VR | OR] (64 x 128 bf16, two 64-column blocks each, 128-byte
 * swizzle), TH and PH (Tm, P as bf16), and four 32 KB regions A-D whose
 * contents change over the chunk (phases F, S, P1-P4, end):
 *   A: S0 (bf16, k rows) | tmp (hi + lo), then (dKK + dKK^T) rk
 *      (hi + lo, A + 16 KB) | dKc (fp32) for the cluster's sums
 *      (and dht / dh0 on their way in and out, around the chunks)
 *   B: dS (bf16) | dQc (fp32) for the cluster's sums
 *   C: S0 fp32 staging (with D; without st16) | X, then U (bf16, C's first
 *      16 KB) | Rg (fp32), dP~ rq (hi + lo, C + 16 KB)
 *   D: S0 staging | dU, then dBv (hi + lo) | K K^T (fp32, S's, for V's
 *      P4 pairs) | the gate's column sums
 *   VR after P2: the S update's B operands, 16 tokens at a time; with OR,
 *      from P3 to the chunk's end, dS's second half (parked by S)
 *   ET (10 KB): exp(g_t - g_u) of V's P3 and P4 pair loops, formed by S in P2
 *   TH + PH after V's last product with Tm (P4): dKK (fp32), V's own, so
 *      that T's dKc stores into A follow no generic read of V's in P4
 * The chunk's inputs come by the TMA where it takes them (fetch: V's first
 * thread issues the rows' and records' copies on one mbarrier; S's first
 * thread S0's tile on another as it starts the chunk: S starts on it). With
 * the bf16 state tiles (st16) the gate's gradients of a chunk (V and T) run
 * at the next chunk's start, while its inputs land. */
#include <cooperative_groups.h>
#include "cuda/chunk_bwd.cuh"
#include "cuda/chunk_fwd.cuh"
#ifdef GDN_FUSED_WAR_MBARRIER
#include "cuda/cluster_mbarrier.cuh"
#endif

namespace gdn {
namespace cbwd {
namespace {

using M = cfwd::mma_traits<__nv_bfloat16>;
using cfwd::afrag_hilo;
using cfwd::desc_off;
using cfwd::desc_sw128;
using cfwd::stsm4;
using cfwd::swz;
using cfwd::vdesc;
using cfwd::wgt_rs;
using cfwd::wss128;
using cfwd::wss64;

constexpr int FT = 384;   /* threads: three warpgroups */
struct FS {               /* byte offsets */
    static constexpr int KR = 0, QR = 16384, VR = 32768, OR = 49152, TH = 65536, PH = 73728;
    static constexpr int A = 81920, B = 114688, C = 147456, D = 180224, SC = 212992;
    /* the fetch's two mbarriers, S0's tile and the rest: in the scalars' spare array */
    static constexpr int MB = SC + 512 + 16 * 256, MB_R = MB + 8;
    static constexpr int MB_K = MB + 24;   /* S's K K^T in D for V's P4 (128 arrivals) */
#ifdef GDN_FUSED_WAR_MBARRIER
    static constexpr int MB_W = MB + 16;   /* the bench variant's WAR mbarrier (war_bar) */
#endif
    /* the block's Walk (read where used: held in registers across the chunk
     * loop it was spilled, and each chunk's first reloads went to the L2
     * behind the card's fetch burst once the cluster barrier had invalidated
     * the L1; bench/NOTES.md v5.39) */
    static constexpr int WK = MB + 64;
    /* at SC: gcd (64 doubles), then 64-float arrays (NF of them), GateTok's inputs, a reduction row */
    static constexpr int NF = 17;
    /* ET: exp(g_t - g_u) of the pair loops in V's accumulator order (S forms it in P2) */
    static constexpr int ET = SC + 512 + NF * 256 + GT_FLOATS * 4 + 32 * 4;
    static constexpr int bytes = ET + 10240 + 1024;   /* + the base's alignment */
};
static_assert(FS::bytes <= 227 * 1024, "the fused pass's shared memory fits an SM");
static_assert(FS::PH == FS::TH + 8192, "Tm and P adjacent: one copy of the record's tiles (rec16)");
static_assert(FS::PH + 8192 - FS::TH >= CC * CC * (int)sizeof(float), "dKK (fp32) fits TH + PH");

/* barriers: 0 the block, 1-3 one warpgroup, 4 X free (V and T), 5 dKK + dKK^T
 * stored (V and T), 6 the gate (V and T), 7 T's part of dQc in B (V waits);
 * S's K K^T in D for V: the mbarrier FS::MB_K (128 arrivals a chunk) */
/* the block's barrier, one copy a role (the role in the text: the roles' code
 * is never merged, so the registers one role keeps live are not the others') */
template <int ROLE> __device__ __forceinline__ void block_bar() {
    if constexpr (ROLE == 0) asm volatile("bar.sync 0, 384; // S" ::: "memory");
    else if constexpr (ROLE == 1) asm volatile("bar.sync 0, 384; // V" ::: "memory");
    else asm volatile("bar.sync 0, 384; // T" ::: "memory");
}
/* the cluster barrier that publishes the blocks' dQc, dKc (A, B):
 * GDN_CLUSTER_PUBLISH (chunk_bwd.cuh), then a wait that acquires (CCTL.IVALL) */
template <int ROLE> __device__ __forceinline__ void cluster_bar() {
    if constexpr (ROLE == 0) asm volatile(GDN_CLUSTER_PUBLISH " // S\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
    else if constexpr (ROLE == 1) asm volatile(GDN_CLUSTER_PUBLISH " // V\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
    else asm volatile(GDN_CLUSTER_PUBLISH " // T\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
/* the last barrier of a chunk only orders reads before the next chunk's
 * writes (the values read were used before the arrive): no release, so no
 * wait for the chunk's global stores */
template <int ROLE> __device__ __forceinline__ void cluster_bar_war() {
    if constexpr (ROLE == 0) asm volatile("barrier.cluster.arrive.relaxed.aligned; // S\nbarrier.cluster.wait.aligned;" ::: "memory");
    else if constexpr (ROLE == 1) asm volatile("barrier.cluster.arrive.relaxed.aligned; // V\nbarrier.cluster.wait.aligned;" ::: "memory");
    else asm volatile("barrier.cluster.arrive.relaxed.aligned; // T\nbarrier.cluster.wait.aligned;" ::: "memory");
}
/* A bench variant (-DGDN_FUSED_WAR_MBARRIER, bench/gpu_variants.sh): the
 * chunk's last cluster barrier as an mbarrier in each block (FS::MB_W,
 * cuda/cluster_mbarrier.cuh), 12 G arrivals a phase. The own block's arrival
 * releases at CTA scope (its reads of A, B and VR before the next chunk's
 * writes); the remote ones are relaxed (each value read is used before the
 * arrive); no CCTL.IVALL at the wait, so spilled lines stay in the L1. The
 * init is published by the kernel's first publishing barrier, before any
 * remote arrival; no block exits while another can still arrive on it (each
 * waits for all 12 G arrivals of the last chunk's phase). par: the chunk's
 * phase. Measured -0.8 to -1.2 % and the same bits, but not the default:
 * racecheck does not see remote mbarrier arrivals (bench/racecheck_war_model.cu
 * reports correct code like a race), so on this build it could not vouch for
 * the pass (bench/NOTES.md, stop 50). */
template <int ROLE> __device__ __forceinline__ void war_bar(char *sm, uint32_t par) {
#ifdef GDN_FUSED_WAR_MBARRIER
    mbar_cluster_arrive(saddr(sm + FS::MB_W));
    mbar_cluster_wait(saddr(sm + FS::MB_W), par);
#else
    (void)sm; (void)par;
    cluster_bar_war<ROLE>();
#endif
}
/* the cluster barrier in two halves (V and T: the gate between) */
template <int ROLE> __device__ __forceinline__ void cluster_arrive() {
    if constexpr (ROLE == 1) asm volatile(GDN_CLUSTER_PUBLISH " // V" ::: "memory");
    else asm volatile(GDN_CLUSTER_PUBLISH " // T" ::: "memory");
}
template <int ROLE> __device__ __forceinline__ void cluster_wait() {
    if constexpr (ROLE == 1) asm volatile("barrier.cluster.wait.acquire.aligned; // V" ::: "memory");
    else asm volatile("barrier.cluster.wait.acquire.aligned; // T" ::: "memory");
}
enum { BAR_X = 4, BAR_S = 5, BAR_G = 6, BAR_Q = 7 };
/* the base pointer, opaque to the compiler: addresses and descriptors are
 * formed again after each barrier, not hoisted out of the chunk loop and
 * kept in registers across it */
/* the thread's index read anew at each use (volatile): the shared-memory
 * offsets formed from it are formed where they are used, not hoisted out of
 * the chunk loop and kept in registers across it (spilled, they went to L2:
 * the shared memory leaves the L1 ~30 KB; bench/NOTES.md v5) */
__device__ __forceinline__ int tidx() {
    int t;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
    return t;
}

#ifdef GDN_BWD_PROFILE   /* cycles per step of each role's first thread, block 0, per chunk; and one chunk's times from the kernel's start */
#ifndef GDN_BWD_PROFILE_MASK   /* 127: each role's first thread; 31 (-DGDN_BWD_PROFILE_MASK=31): every warp's first lane */
#define GDN_BWD_PROFILE_MASK 127
#endif
/* one set of lines a launch, its chunks' count first (the gdn command's
 * first launch is its 256-token slice's: a few chunks, which carry the
 * kernel's prologue; bench/NOTES.md stop 51). The sums in global memory by
 * fire-and-forget atomics (block 0's warps):
 * kept in the thread's own arrays they were local memory, which the
 * cluster barriers' L1 invalidation sent to the L2 and back at every probe
 * after one (bench/NOTES.md v5.35), timing the probes themselves */
__device__ unsigned long long g_fp[FT / 32][2][17];
/* each phase's own work: the cycles from the last probe to the phase's barrier (PHASE_BAR) */
__device__ unsigned long long g_fpw[FT / 32][6];
#define FPW(k) do { if ((threadIdx.x & GDN_BWD_PROFILE_MASK) == 0 && blockIdx.x == 0) atomicAdd(&g_fpw[threadIdx.x >> 5][k], (unsigned long long)(clock64() - ft_)); } while (0)
/* the cluster's rows item by item (each warp's first lane, block 0): items, then cycles to the
 * loads' sums, to the L2 norm chain's end, to the store issued */
__device__ unsigned long long g_fr[FT / 32][4];
#define FR_DECL long long fr_ = clock64()
#define FR(k) do { if ((threadIdx.x & 31) == 0 && blockIdx.x == 0) { const long long t1_ = clock64(); atomicAdd(&g_fr[threadIdx.x >> 5][k], k ? (unsigned long long)(t1_ - fr_) : 1ull); fr_ = clock64(); } } while (0)
#define FP_DECL long long ft_ = clock64(); const long long f0_ = ft_
#define FP(k) do { if ((threadIdx.x & GDN_BWD_PROFILE_MASK) == 0 && blockIdx.x == 0) { const long long t1_ = clock64(); atomicAdd(&g_fp[threadIdx.x >> 5][0][k], (unsigned long long)(t1_ - ft_)); if (ci == w.top - 3) g_fp[threadIdx.x >> 5][1][k] = (unsigned long long)(t1_ - f0_); ft_ = clock64(); } } while (0)
#define FP_PRINT(name, nch)                                                                                   \
    do {                                                                                                      \
        if ((threadIdx.x & GDN_BWD_PROFILE_MASK) == 0 && blockIdx.x == 0 && (nch) > 0) {                       \
            long long fp_[17], fa_[17];                                                                       \
            for (int k_ = 0; k_ < 17; k_++) {                                                                 \
                fp_[k_] = (long long)atomicExch(&g_fp[threadIdx.x >> 5][0][k_], 0ull);                        \
                fa_[k_] = (long long)atomicExch(&g_fp[threadIdx.x >> 5][1][k_], 0ull);                        \
            }                                                                                                 \
            printf("fused %s w%d (%lld chunks) cycles/chunk: start: fetch %lld gate %lld loads %lld wait %lld F %lld | S %lld (S: step %lld) | P1 %lld | P2 %lld | P3 %lld | P4 %lld | end: cl1 %lld rows %lld gate %lld cl2 %lld\n", name, (int)(threadIdx.x >> 5), (long long)(nch), \
                   fp_[12] / (nch), fp_[13] / (nch), fp_[10] / (nch), fp_[11] / (nch), fp_[0] / (nch), fp_[1] / (nch), fp_[12] / (nch), fp_[2] / (nch), fp_[3] / (nch), fp_[4] / (nch), fp_[5] / (nch), fp_[7] / (nch), fp_[8] / (nch), fp_[9] / (nch), fp_[6] / (nch)); \
            printf("fused %s w%d at: F %lld S %lld P1 %lld P2 %lld P3 %lld P4 %lld cl1 %lld rows %lld gate %lld cl2 %lld\n", name, (int)(threadIdx.x >> 5), \
                   fa_[0], fa_[1], fa_[2], fa_[3], fa_[4], fa_[5], fa_[7], fa_[8], fa_[9], fa_[6]); \
            printf("fused %s w%d own work before each phase's barrier, cycles/chunk: S %lld P1 %lld P2 %lld P3 %lld P4 %lld\n", name, (int)(threadIdx.x >> 5), \
                   (long long)atomicExch(&g_fpw[threadIdx.x >> 5][1], 0ull) / (nch), (long long)atomicExch(&g_fpw[threadIdx.x >> 5][2], 0ull) / (nch), \
                   (long long)atomicExch(&g_fpw[threadIdx.x >> 5][3], 0ull) / (nch), (long long)atomicExch(&g_fpw[threadIdx.x >> 5][4], 0ull) / (nch), \
                   (long long)atomicExch(&g_fpw[threadIdx.x >> 5][5], 0ull) / (nch)); \
            printf("fused %s w%d start's gate cycles/chunk: sums %lld barrier %lld scan+partials %lld to BAR_G %lld\n", name, (int)(threadIdx.x >> 5), \
                   fp_[14] / (nch), fp_[15] / (nch), fp_[16] / (nch), fp_[13] / (nch)); \
            for (int w_ = threadIdx.x >> 5; w_ < (threadIdx.x >> 5) + 4; w_++) {                              \
                const long long n_ = (long long)atomicExch(&g_fr[w_][0], 0ull);                               \
                if (n_) printf("fused %s w%d rows: %lld items a chunk; cycles an item: loads %lld, sums %lld, store %lld\n", name, w_, n_ / (nch), \
                               (long long)atomicExch(&g_fr[w_][1], 0ull) / n_, (long long)atomicExch(&g_fr[w_][2], 0ull) / n_, \
                               (long long)atomicExch(&g_fr[w_][3], 0ull) / n_);                               \
            }                                                                                                 \
        }                                                                                                     \
    } while (0)
#else
#define FP_DECL do { } while (0)
#define FP(k) do { } while (0)
#define FR_DECL do { } while (0)
#define FR(k) do { } while (0)
#define FP_PRINT(name, nch) do { } while (0)
#define FPW(k) do { } while (0)
#endif


/* a warpgroup's m64 accumulator block (32 values: 64 rows, 64 columns) to a
 * 64-column block of 128-byte swizzled rows as bf16 hi + lo */
__device__ __forceinline__ void st_blk(const float *x, char *hi, char *lo) { cfwd::acc_swz_hilo<M>(x, hi, lo, tidx()); }
/* an m64n128 accumulator (64 values) to a 64-row tile [cols 0-63 | 64-127] as hi + lo */
__device__ __forceinline__ void st_tile(const float *x, char *hi, char *lo) {
    st_blk(x, hi, lo);
    st_blk(x + 32, hi + 8192, lo + 8192);
}

/* an m64n128 accumulator (64 values) to a 64-row tile [cols 0-63 | 64-127]
 * as bf16 (X and U: one copy, bench/NOTES.md v5.49) */
__device__ __forceinline__ void st_tile_hi(const float *x, char *t) {
    const int tx = tidx(), lane = tx & 31, wl = (tx >> 5) & 3, m = lane >> 3;
    const int row = 16 * wl + 8 * (m & 1) + (lane & 7);
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int a = 0; a < 8; a += 2) {
            uint32_t v[4];
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int b = 32 * h + 4 * (a + (q >> 1)) + 2 * (q & 1);
                v[q] = M::pack(x[b], x[b + 1]);
            }
            stsm4(t + 8192 * h + swz(row, 8 * (a + (m >> 1))), v[0], v[1], v[2], v[3]);
        }
}

/* the thread's rows of an accumulator: r0 = 16 wl + g and r0 + 8; column 8 a + 2 tq (+1) */
struct Frag {
    int r0, tq;
    __device__ __forceinline__ Frag() {
        const int tx = tidx(), lane = tx & 31;
        r0 = 16 * ((tx >> 5) & 3) + (lane >> 2);
        tq = lane & 3;
    }
};
/* per row, the dot of an m64n128 accumulator with a bf16 tile (raw rows,
 * [cols 0-63 | 64-127]), summed over the quad: every lane gets its rows' */
__device__ __forceinline__ float2 rowdot(const float *x, const char *T, const Frag &f) {
    float d0 = 0.f, d1 = 0.f;
#pragma unroll
    for (int a = 0; a < 16; a++) {
        const int col = 8 * (a & 7) + 2 * f.tq;
        const char *b = T + (a >> 3) * 8192;
        const uint32_t w0 = *reinterpret_cast<const uint32_t *>(b + swz(f.r0, col));
        const uint32_t w1 = *reinterpret_cast<const uint32_t *>(b + swz(f.r0 + 8, col));
        d0 = fmaf(x[4 * a], M::lo(w0), fmaf(x[4 * a + 1], M::hi(w0), d0));
        d1 = fmaf(x[4 * a + 2], M::lo(w1), fmaf(x[4 * a + 3], M::hi(w1), d1));
    }
    d0 += __shfl_xor_sync(0xffffffffu, d0, 1);
    d0 += __shfl_xor_sync(0xffffffffu, d0, 2);
    d1 += __shfl_xor_sync(0xffffffffu, d1, 1);
    d1 += __shfl_xor_sync(0xffffffffu, d1, 2);
    return make_float2(d0, d1);
}
template <int NV> __device__ __forceinline__ void row_mul(float *x, float s0, float s1) {
#pragma unroll
    for (int a = 0; a < NV / 4; a++) { x[4 * a] *= s0; x[4 * a + 1] *= s0; x[4 * a + 2] *= s1; x[4 * a + 3] *= s1; }
}
/* byte offset of (row, col) in an fp32 array of 128 columns (512-byte rows,
 * 16-byte pieces swizzled by the row: conflict-free for a quad's float2 and
 * a warp's float4 along a row); st_f32 stores an m64n128 accumulator there */
__device__ __forceinline__ int f32_at(int row, int col) { return row * 512 + ((((col >> 2) ^ row) & 7) | ((col >> 2) & ~7)) * 16 + (col & 3) * 4; }
__device__ __forceinline__ void st_f32(const float *x, char *dst, const Frag &f) {
#pragma unroll
    for (int a = 0; a < 16; a++) {
        const int col = 8 * a + 2 * f.tq;
        *reinterpret_cast<float2 *>(dst + f32_at(f.r0, col)) = make_float2(x[4 * a], x[4 * a + 1]);
        *reinterpret_cast<float2 *>(dst + f32_at(f.r0 + 8, col)) = make_float2(x[4 * a + 2], x[4 * a + 3]);
    }
}

/* x (an m64n128 accumulator) added to the fp32 rows at dst (st_f32's layout) */
__device__ __forceinline__ void add_f32(const float *x, char *dst, const Frag &f) {
#pragma unroll
    for (int a = 0; a < 16; a++) {
        const int col = 8 * a + 2 * f.tq;
        float2 *u = reinterpret_cast<float2 *>(dst + f32_at(f.r0, col)), *v = reinterpret_cast<float2 *>(dst + f32_at(f.r0 + 8, col));
        const float2 a0 = *u, a1 = *v;
        *u = make_float2(a0.x + x[4 * a], a0.y + x[4 * a + 1]);
        *v = make_float2(a1.x + x[4 * a + 2], a1.y + x[4 * a + 3]);
    }
}

/* the thread's float4s of the exp table: warp wl's rows need its 2 wl + 2 column blocks
 * a (u < t), 512 bytes each; a block a past them reads the next warp's (masked) */
__device__ __forceinline__ int et_at() { const int tx = tidx(), wl = (tx >> 5) & 3; return FS::ET + 512 * wl * (wl + 1) + (tx & 31) * 16; }
/* the per-chunk scalars (threads t < CC of the T warpgroup write them) */
struct Sc {
    double *gcd;
    float *gam, *bet, *rk, *rq, *ek, *xs, *us, *qs, *dgq, *dgk, *dbv, *dbk, *dba, *rl, *row, *tot, *gt, *red;
    __device__ __forceinline__ explicit Sc(char *sm) {
        gcd = reinterpret_cast<double *>(sm + FS::SC);
        float *f = reinterpret_cast<float *>(gcd + CC);
        gam = f; bet = f + CC; rk = f + 2 * CC; rq = f + 3 * CC; ek = f + 4 * CC; xs = f + 5 * CC; us = f + 6 * CC; qs = f + 7 * CC;
        dgq = f + 8 * CC; dgk = f + 9 * CC; dbv = f + 10 * CC; dbk = f + 11 * CC; dba = f + 12 * CC; rl = f + 13 * CC;
        row = f + 14 * CC; tot = f + 15 * CC; /* [16 * CC, 17 * CC): the fetch's mbarriers (FS::MB) */
        gt = f + FS::NF * CC; red = gt + GT_FLOATS;
    }
};

/* the tensor maps of k, q (heads H) and v, dO (heads HV): 64-row boxes of
 * 64 columns in the 128-byte swizzle, the tiles' layout (on: all four made) */
struct FusedMaps {
    CUtensorMap k, q, v, o;
    CUtensorMap s0, tr;   /* states and records as 256-byte rows: S0's bf16 tile (128 rows), Tm and P's (64) */
    CUtensorMap s0k;      /* the kept states' (BwdArgs::kst) */
    int on, bt;           /* bt: s0, tr (and s0k where kst) valid (the tile mode's instance takes its tiles by them) */
};
/* the chunk's inputs through the TMA where it takes them (V's first thread
 * issues the copies, completing on FS::MB_R; S0's bf16 tile into A (st16)
 * is S's, on FS::MB: s0_copy in chunk_start): the rows of k, q (head h), v,
 * dO (value head j) as two 64-column boxes each (fm.on) and Tm, P as the
 * record's bf16 tiles (rec16), in the tile mode's instance (TL) as rows of
 * 256 bytes by the tensor path, else by bulk copies;
 * the rest by cp.async, one commit group (rows past c zero): the rows (not
 * fm.on), S0 in fp32 (k-first) into C and D (f32_at: 128 rows of 512
 * bytes, 16-byte pieces swizzled by the row), Tm and P from the record's
 * fp32, rounded to bf16 by the V and T warpgroups */
/* the bytes a chunk of the two mbarriers: S0's tile on FS::MB (S starts on
 * it while the rest lands), the rows and Tm, P on FS::MB_R */
template <bool TL> __device__ __forceinline__ uint32_t fetch_tx0(const BwdArgs &p) { return (TL || p.st16) ? 32768 : 0; }
template <bool TL> __device__ __forceinline__ uint32_t fetch_tx1(const BwdArgs &p, const FusedMaps &fm) { return (fm.on ? 4 * 16384 : 0) + ((TL || p.rec16) ? 16384 : 0); }
static_assert(REC % 64 == 0 && R_TM % 64 == 0, "records and their tiles on 256-byte rows");
/* Tm and P's bf16 tiles of the record into TH, PH (rec16) */
template <bool TL> __device__ __forceinline__ void tiles_copy(const BwdArgs &p, const FusedMaps &fm, char *sm, const float *rec, void *mb) {
    if constexpr (TL) cfwd::tma_byte_rows(sm + FS::TH, &fm.tr, (int)((rec + R_TM - p.rec) / 64), mb);
    else cfwd::bulk_copy(sm + FS::TH, rec + R_TM, 16384, mb);
}
/* S0's bf16 tile into A on the fetch's first mbarrier (FS::MB), its bytes
 * expected there: from the states, or where kept from the forward's (kst) */
template <bool TL>
__device__ __forceinline__ void s0_copy(const BwdArgs &p, const FusedMaps &fm, char *sm, const float *S0, bool kept) {
    void *mb0 = sm + FS::MB;
    cfwd::mb_expect(mb0, fetch_tx0<TL>(p));
    if constexpr (TL) cfwd::tma_byte_rows(sm + FS::A, kept ? &fm.s0k : &fm.s0, (int)((S0 - (kept ? p.kst : p.states)) / 64), mb0);
    else cfwd::bulk_copy(sm + FS::A, S0, 32768, mb0);
}
template <int ROLE, bool TL>
__device__ __forceinline__ void fetch(const BwdArgs &p, const FusedMaps &fm, char *sm, int64_t row0, int c, int h, int j, const float *S0,
                                      const float *rec) {
    const int t2 = tidx() - 128;   /* the V and T warpgroups: 256 threads */
    void *mb = sm + FS::MB_R;
    if (ROLE == 1 && t2 == 0 && fetch_tx1<TL>(p, fm)) {   /* V's first thread (ROLE known at compile time: no copy of this in T) */
        cfwd::fence_async_smem();   /* the buffers' generic reads and writes before the copies' writes */
        cfwd::mb_expect(mb, fetch_tx1<TL>(p, fm));
        if (fm.on) {   /* in the order P1 reads them: k, Tm and P, v, dO; q last */
            const int r = (int)row0;
#pragma unroll
            for (int hb = 0; hb < 2; hb++) cfwd::tma_rows(sm + FS::KR + hb * 8192, &fm.k, 64 * hb, h, r, mb);
            if (TL || p.rec16) tiles_copy<TL>(p, fm, sm, rec, mb);
#pragma unroll
            for (int hb = 0; hb < 2; hb++) cfwd::tma_rows(sm + FS::VR + hb * 8192, &fm.v, 64 * hb, j, r, mb);
#pragma unroll
            for (int hb = 0; hb < 2; hb++) cfwd::tma_rows(sm + FS::OR + hb * 8192, &fm.o, 64 * hb, j, r, mb);
#pragma unroll
            for (int hb = 0; hb < 2; hb++) cfwd::tma_rows(sm + FS::QR + hb * 8192, &fm.q, 64 * hb, h, r, mb);
        } else if (TL || p.rec16) tiles_copy<TL>(p, fm, sm, rec, mb);
    }
#pragma unroll 1
    for (int e = fm.on ? 4 * CC * 16 : t2; e < 4 * CC * 16; e += 256) {
        const int m = e >> 10, r = (e >> 4) & 63, c16 = e & 15;
        const bool in = r < c;
        const int64_t row = row0 + (in ? r : 0);
        const void *x = m == 0 ? p.k : m == 1 ? p.q : m == 2 ? p.v : p.dout;
        const int64_t at = (m < 2 ? row * p.H + h : row * p.HV + j) * (int64_t)128 + c16 * 8;
        gdn::cp16(sm + m * 16384 + (c16 >> 3) * 8192 + swz(r, (c16 & 7) * 8), static_cast<const __nv_bfloat16 *>(x) + at, in);
    }
    if (!(TL || p.st16))
#pragma unroll 4
        for (int e = t2; e < 128 * 32; e += 256) {   /* S0: 128 rows of 32 pieces */
            const int k = e >> 5, q = e & 31;
            gdn::cp16(sm + FS::C + f32_at(k, 4 * q), S0 + (int64_t)k * 128 + 4 * q, true);
        }
    if (TL || p.rec16) {
        gdn::cp_commit();
        return;
    }
    gdn::cp_commit();
    {   /* Tm, P from fp32: 2048 float4, 8 a thread */
        float4 r[8];
        const float4 *T4 = reinterpret_cast<const float4 *>(rec + R_TM), *P4 = reinterpret_cast<const float4 *>(rec + R_P);
#pragma unroll
        for (int u = 0; u < 4; u++) { r[u] = T4[t2 + 256 * u]; r[4 + u] = P4[t2 + 256 * u]; }
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int e = 4 * (t2 + 256 * (u & 3)), rr = e >> 6, c0 = e & 63;
            *reinterpret_cast<uint2 *>(sm + (u < 4 ? FS::TH : FS::PH) + swz(rr, c0)) =
                make_uint2(M::pack(r[u].x, r[u].y), M::pack(r[u].z, r[u].w));
        }
    }
}

struct Walk {
    int64_t n, bos, len, sb, cb, top;
    int j, h;
    int kept;   /* S0 from the forward's kept tiles (kst; S's first thread reads it) */
    __device__ __forceinline__ int64_t row0(int64_t ci) const { return bos + ci * CC; }
    __device__ __forceinline__ int cnt(int64_t ci) const { return len - ci * CC < CC ? (int)(len - ci * CC) : CC; }
};
static_assert(FS::WK % 8 == 0 && FS::WK + (int)sizeof(Walk) <= FS::SC + 512 + (FS::NF - 1) * 256 + 256, "the Walk in the mbarriers' array");

/* dq, dk of the cluster's chunk (rows t < c) from the G blocks' dQc (B) and
 * dKc (A) in fp32: this block's rows [r per, (r + 1) per), summed in rank
 * order, through the L2 norm chain (the raw rows from QR, KR, rstd from the
 * scalars); a warp a row at a time, four columns a lane (two rows at a
 * time spilled dS: slower, bench/NOTES.md v5.1) */
constexpr int MAXG = 4;   /* the cluster's blocks read (Fused::takes G <= 4) */
/* a float4 of block b's shared memory at this block's shared address a */
__device__ __forceinline__ float4 ld_rank(uint32_t a, int b) {
    uint32_t r;
    float4 v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(r) : "memory");
    return v;
}
template <bool S_SIDE, bool TL>
__device__ __forceinline__ void cluster_rows(const BwdArgs &p, char *sm, int64_t row0, int c, int h) {
    namespace cg = cooperative_groups;
    const cg::cluster_group cl = cg::this_cluster();
    const Sc s(sm);
    const int nb = (int)cl.num_blocks(), per = (c + nb - 1) / nb, t0 = (int)cl.block_rank() * per;
    const int t1 = t0 + per < c ? t0 + per : c, lane = tidx() & 31, col = 4 * lane;
    const bool l2 = (p.flags & GDN_QK_L2NORM) != 0;
    const uint32_t sa = saddr(sm);
    /* the rows' q / k items: S's four warps the first third, V and T's eight
     * the rest; without st16 S's the first three quarters, V and T's the rest
     * after the gate (the two sides then end together) */
    const int n = 2 * (t1 - t0), ns = (TL || p.st16) ? n / 3 : (3 * n) / 4;
    const int e0 = S_SIDE ? (tidx() >> 5) & 3 : ns + (tidx() >> 5) - 4, e1 = S_SIDE ? ns : n, es = S_SIDE ? 4 : 8;
#pragma unroll 1
    for (int e = e0; e < e1; e += es) {
        FR_DECL;
        FR(0);
        const int qk = e & 1, t = t0 + (e >> 1);
        const uint2 xr = *reinterpret_cast<const uint2 *>(sm + (qk ? FS::KR : FS::QR) + (col >> 6) * 8192 + swz(t, col & 63));
        const uint32_t off = sa + (qk ? FS::A : FS::B) + f32_at(t, col);
        float4 y = ld_rank(off, 0);
#pragma unroll
        for (int b = 1; b < MAXG; b++)
            if (b < nb) {
                const float4 z = ld_rank(off, b);
                y.x += z.x; y.y += z.y; y.z += z.z; y.w += z.w;
            }
        FR(1);
        const float rs = qk ? s.rk[t] : s.rq[t];   /* rstd with the L2 norm, else 1 (t < c) */
        const float x0 = M::lo(xr.x) * rs, x1 = M::hi(xr.x) * rs, x2 = M::lo(xr.y) * rs, x3 = M::hi(xr.y) * rs;
        if (l2) {
            const float d = gdn::warp_sum(x0 * y.x + x1 * y.y + x2 * y.z + x3 * y.w);
            y.x = rs * (y.x - x0 * d); y.y = rs * (y.y - x1 * d); y.z = rs * (y.z - x2 * d); y.w = rs * (y.w - x3 * d);
        }
        FR(2);
        const int64_t at = ((row0 + t) * p.H + h) * 128 + col;
        *reinterpret_cast<uint2 *>(static_cast<__nv_bfloat16 *>(qk ? p.dk : p.dq) + at) = make_uint2(M::pack(y.x, y.y), M::pack(y.z, y.w));
        FR(3);
    }
}

/* ---- the three roles. Each walks chunks [cb, top) from the last; the
 * block barriers a chunk, in order: F (inputs in), S (S0, dS stored),
 * P1, P2, P3, P4; then the cluster's two (dQc, dKc published: the three
 * sum the rows, V and T after the gate's gradients where they are in the
 * end; every read done). ---- */

/* the gate of chunk ci by V and T (256 threads): dg, dbeta and the gate's
 * partials from Rg (C), the scalars dgq, dbv and GateTok's gt. gate_store's
 * quadrant sums F(t) = sum_{t' >= t} sum_{s < t} Rg[t'][s] taken by their
 * differences F(t) - F(t + 1) = sum_{s < t} Rg[t][s] - sum_{t' > t} Rg[t'][t]:
 * a row and a column sum a token, with no scan between them, then one scan:
 *   dg_t = sum_{u >= t} d_u,  d_u = dgc_u + sum_{s < u} Rg[u][s] - sum_{t' > u} Rg[t'][u].
 * Rows by four threads a token (16 terms each, the walk's start turned by the
 * token so a warp's loads meet no bank twice), columns by 64 threads a
 * quarter of the rows (column by lane), both summed in a fixed order; the
 * column quarters (D) and the row sums (row) meet in warp 0, which scans
 * the 64 terms (two a lane) and forms the fused gate's partials (double, a
 * fixed tree) and the stores of dg. dbeta by threads t < c meanwhile.
 * probe(k) marks the profile build's steps: 14 the sums, 15 the barrier,
 * 16 warp 0's scan and partials. */
struct NoProbe {
    __device__ __forceinline__ void operator()(int) const {}
};
template <typename Probe = NoProbe>
__device__ __forceinline__ void chunk_gate(const BwdArgs &p, char *sm, const Walk &w, int64_t ci, const Probe &probe = Probe()) {
    const Sc s(sm);
    const float *Rg = reinterpret_cast<const float *>(sm + FS::C);
    float *cq = reinterpret_cast<float *>(sm + FS::D);   /* [4][CC]: the column sums' quarters */
    const int t = tidx() - 128, c = w.cnt(ci);
    const int64_t row0 = w.row0(ci), gi = (w.sb + ci) * p.HV + w.j;
    if (p.g) {
        {
            const int u = t >> 2, q = t & 3;
            float a[16];
#pragma unroll
            for (int i = 0; i < 16; i++) {
                const int x = q + 4 * ((i + u) & 15);
                a[i] = x < u ? Rg[u * CC + x] : 0.f;
            }
            float r = 0.f;
#pragma unroll
            for (int i = 0; i < 16; i++) r += a[i];
            r += __shfl_xor_sync(0xffffffffu, r, 1);
            r += __shfl_xor_sync(0xffffffffu, r, 2);
            if (q == 0) s.row[u] = r;
        }
        {
            const int u = t & (CC - 1), x0 = 16 * (t >> 6);
            float b[16];
#pragma unroll
            for (int i = 0; i < 16; i++) {
                const int x = x0 + i;
                b[i] = x > u && x < c ? Rg[x * CC + u] : 0.f;
            }
            float cs = 0.f;
#pragma unroll
            for (int i = 0; i < 16; i++) cs += b[i];
            cq[(t >> 6) * CC + u] = cs;
        }
    }
    if (t < c) {
        float db = s.dbv[t];
        if (p.flags & GDN_BETA_SIGMOID) {
            const float m = (p.flags & GDN_BETA_NEGATIVE) ? 2.f : 1.f;
            const float sg = gdn::sigmoid(s.gt[2 * CC + t]);
            db *= m * sg * (1.f - sg);
        }
        gdn::st(p.dbeta, (row0 + t) * p.HV + w.j, db, p.gdt);
    }
    probe(14);
    if (!p.g) return;
    gdn::bar_named(BAR_G, 256);
    probe(15);
    if (t < 32) {
        const int e0 = 2 * t, e1 = e0 + 1;
        const float d0 = e0 < c ? s.dgq[e0] + (s.row[e0] - (((cq[e0] + cq[CC + e0]) + cq[2 * CC + e0]) + cq[3 * CC + e0])) : 0.f;
        const float d1 = e1 < c ? s.dgq[e1] + (s.row[e1] - (((cq[e1] + cq[CC + e1]) + cq[2 * CC + e1]) + cq[3 * CC + e1])) : 0.f;
        float in = d0 + d1;   /* the lanes' pairs summed from the last: lane t holds the pairs of lanes >= t */
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const float y = __shfl_down_sync(0xffffffffu, in, o);
            if (t + o < 32) in += y;
        }
        const float nx = __shfl_down_sync(0xffffffffu, in, 1);
        float g1 = d1 + (t < 31 ? nx : 0.f), g0 = d0 + g1;
        if (p.flags & GDN_GATE_FUSED) {
            const float A = s.gt[3 * CC];
            double sa = 0., sb = 0.;
            if (e0 < c) {
                sa = (double)g0 * (double)s.gt[CC + e0];
                const float x = s.gt[e0];
                g0 = g0 * A * (x > 20.f ? 1.f : gdn::sigmoid(x));
                sb = g0;
            }
            if (e1 < c) {
                sa += (double)g1 * (double)s.gt[CC + e1];
                const float x = s.gt[e1];
                g1 = g1 * A * (x > 20.f ? 1.f : gdn::sigmoid(x));
                sb += g1;
            }
#pragma unroll
            for (int o = 16; o; o >>= 1) {
                sa += __shfl_xor_sync(0xffffffffu, sa, o);
                sb += __shfl_xor_sync(0xffffffffu, sb, o);
            }
            if (t == 0) {
                p.part[gi] = sa;
                p.part[p.nslots * p.HV + gi] = sb;
            }
        }
        if (e0 < c) gdn::st(p.dg, (row0 + e0) * p.HV + w.j, g0, p.gdt);
        if (e1 < c) gdn::st(p.dg, (row0 + e1) * p.HV + w.j, g1, p.gdt);
    }
    probe(16);
}

/* the chunk's common start (every role): fetch, the scalars (T's threads
 * < CC), GateTok's inputs (V's threads < CC), the fetch's mbarriers (rows
 * past c to zero where the TMA brought them), barrier F; probes (the
 * profile build) 12 after the fetch's issue, 14-16 in the last chunk's
 * gate (chunk_gate), 13 after it, 10 after the scalars, 11 after the
 * mbarriers. With S0
 * as the bf16 tile (st16) there is no barrier F: S waits for S0's
 * mbarrier alone and forms S0 . dS and dS's tile while the rest lands, and
 * the barrier after that step (S) is the chunk's first */
template <int ROLE, bool TL, typename Probe>
__device__ __forceinline__ void chunk_start(const BwdArgs &p, const FusedMaps &fm, char *sm, const Walk &w, int64_t ci, const Probe &probe) {
    const Sc s(sm);
    const int tid = tidx(), c = w.cnt(ci);
    const int64_t row0 = w.row0(ci), slot = w.sb + ci;
    /* S0's bf16 tile: issued by S's first thread as soon as it passes the chunk's last barrier (S waits on it first; by V's among
     * the fetch's copies it landed later: bench/NOTES.md v5.41) */
    if constexpr (ROLE == 0)
        if ((TL || p.st16) && tid == 0) {
            const bool kept = w.kept != 0;
            const float *S0 = kept ? kept_at(p, w.n, ci, w.j) : state_at(p, w.n, slot, ci, w.j);
            cfwd::fence_async_smem();
            s0_copy<TL>(p, fm, sm, S0, kept);
        }
    if constexpr (ROLE > 0) {   /* V, T: the inputs; V's first CC threads the gate's inputs, T's the scalars */
        const float *rec = rec_at(p, w.n, slot, ci, w.j);
        fetch<ROLE, TL>(p, fm, sm, row0, c, w.h, w.j, state_at(p, w.n, slot, ci, w.j), rec);
        probe(12);
        /* the loads issued before the gate, stored after it: their latency under the gate */
        GateTok gk;
        double gt_ = 0., gl = 0.;
        float gm = 0.f, bt = 0.f, rk = 0.f, rq = 0.f;
        const int t = tid - 256;
        if (ROLE == 1 && tid < 128 + CC) gk.issue_t(p, rec, row0, c, w.j, tid - 128);
        else if (ROLE == 2 && tid < 256 + CC) {
            const double *gd = reinterpret_cast<const double *>(rec + R_GCD);
            const bool on = t < c, l2 = (p.flags & GDN_QK_L2NORM) != 0;
            gt_ = gd[t]; gl = gd[c - 1];
            gm = rec[R_GAM + t]; bt = rec[R_BETA + t];
            rk = on ? (l2 ? p.rstd_k[(row0 + t) * p.H + w.h] : 1.f) : 0.f;
            rq = on ? (l2 ? p.rstd_q[(row0 + t) * p.H + w.h] : 1.f) : 0.f;
        }
        if ((TL || p.st16) && ci + 1 < w.top) {   /* the last chunk's gate while this one's inputs land (C, D, the scalars free till P1) */
            chunk_gate(p, sm, w, ci + 1, probe);
            gdn::bar_named(BAR_G, 256);   /* gt, dgq, dbv read before they are written again */
        }
        probe(13);
        if (ROLE == 1 && tid < 128 + CC) gk.commit(s.gt);
        else if (ROLE == 2 && tid < 256 + CC) {
            const float ek = t < c ? expf((float)(gl - gt_)) : 0.f;
            s.gcd[t] = gt_; s.gam[t] = gm; s.bet[t] = bt; s.rk[t] = rk; s.rq[t] = rq; s.ek[t] = ek;
            s.xs[t] = bt * gm * rk; s.us[t] = ek * rk; s.qs[t] = p.scale * gm * rq;
        }
        gdn::cp_wait_all();
    }
    probe(10);
    const uint32_t par = (uint32_t)((w.top - 1 - ci) & 1);
    if (fetch_tx0<TL>(p)) cfwd::mb_wait(sm + FS::MB, par);
    if ((ROLE > 0 || !(TL || p.st16)) && fetch_tx1<TL>(p, fm)) cfwd::mb_wait(sm + FS::MB_R, par);   /* S with st16: after its step */
    probe(11);
    if constexpr (ROLE > 0) {
        if (fm.on && c < CC)   /* a sequence's last chunk: the rows past it (another sequence's, or the TMA's zeros) to zero */
            for (int x = tid - 128; x < (CC - c) * 64; x += 256) {
                const int b = x / ((CC - c) * 8), y = x % ((CC - c) * 8);   /* b: the 64-column block of KR .. OR */
                *reinterpret_cast<uint4 *>(sm + FS::KR + b * 8192 + (c + y / 8) * 128 + (y % 8) * 16) = make_uint4(0, 0, 0, 0);
            }
        cfwd::fence_async_smem();
    }
    if (!(TL || p.st16)) block_bar<ROLE>();   /* F: S0 staged by V and T's cp.async */
}

/* The clusters' chunks out of step. Every block does the same work a chunk,
 * so all would fetch their chunk's ~112 KB at once: a card-wide burst that
 * every role waits on (bench/NOTES.md v5.5). Before its second chunk's fetch
 * V waits (r mod STAGGER) / STAGGER of the first chunk's time, r the
 * block's cluster, so STAGGER groups of clusters fetch in turn: once a
 * walk, at most (STAGGER - 1) / STAGGER of a chunk, measured on the block's
 * own chunk (bench/NOTES.md v5.15). V's fetch leads: S and T wait for its
 * bytes. */
constexpr int STAGGER = 6;
__device__ __forceinline__ void stagger(const BwdArgs &p, const Walk &w, int64_t ci, long long &t1) {
    if (ci == w.top - 1) t1 = clock64();
    else if (ci == w.top - 2) {
        const long long now = clock64(), until = now + (now - t1) * (long long)((blockIdx.x / p.G) % STAGGER) / STAGGER;
        while (clock64() < until) { }
    }
}

/* the chunk's end for V and T: their dQc, dKc published (arrive), the
 * gate's inputs completed (this block's own), the gate's gradients while S
 * sums the cluster's rows (without st16; with it the gate runs at the next
 * chunk's start under the fetch, and V and T take two thirds of the rows),
 * then the cluster barrier that frees A and B (S's end is in role_s) */
template <int ROLE, bool TL, typename Probe>
__device__ __forceinline__ void chunk_end(const BwdArgs &p, char *sm, const Walk &w, int64_t ci, const Probe &probe) {
    const Sc s(sm);
    const int tid = tidx(), c = w.cnt(ci);
    const int64_t row0 = w.row0(ci);
    {
        cluster_arrive<ROLE>();
        probe(7);
        const int t = tid - 128;   /* 256 threads: V and T */
        float *Rg = reinterpret_cast<float *>(sm + FS::C);
        if (t < CC) {
            const float gl = s.gam[c - 1];
            s.dgq[t] = t < c ? s.dgq[t] + s.dgk[t] + (t == c - 1 ? gl * s.tot[0] : 0.f) : 0.f;
            s.dbv[t] = t < c ? s.dbv[t] + s.dbk[t] + s.dba[t] : 0.f;
            if (t < c - 1) Rg[(c - 1) * CC + t] += s.ek[t] * s.rl[t];
        }
        if (!(TL || p.st16)) {
            gdn::bar_named(BAR_G, 256);
            chunk_gate(p, sm, w, ci);
        }
        probe(9);
        cluster_wait<ROLE>();
        cluster_rows<false, TL>(p, sm, row0, c, w.h);
        probe(8);
    }
    war_bar<ROLE>(sm, (uint32_t)((w.top - 1 - ci) & 1));   /* no block reads another's A, B any more */
}

/* the state gradient (n, j) between dht / dh0 (either layout) and a staging
 * area in A and B (f32_at; free before the first chunk's S step and after the
 * last chunk), by the S warpgroup: in (dht, zero without it) or out (dh0) */
__device__ __forceinline__ void stage_dstate(const BwdArgs &p, char *sm, const Walk &w, bool in) {
    const int t = tidx();   /* < 128 */
    const bool vf = (p.flags & GDN_STATE_V_FIRST) != 0;
    const int64_t base = (w.n * p.HV + w.j) * (int64_t)128 * 128;
#pragma unroll 4
    for (int e = t; e < 128 * 32; e += 128) {
        const int k = e >> 5, q = e & 31;
        float4 *sp = reinterpret_cast<float4 *>(sm + FS::A + f32_at(k, 4 * q));
        if (in) {
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (p.dht && !vf) v = *reinterpret_cast<const float4 *>(p.dht + base + (int64_t)k * 128 + 4 * q);
            else if (p.dht) {
                const float *x = p.dht + base + (int64_t)(4 * q) * 128 + k;
                v = make_float4(x[0], x[128], x[256], x[384]);
            }
            *sp = v;
        } else {
            const float4 v = *sp;
            if (!vf) *reinterpret_cast<float4 *>(p.dh0 + base + (int64_t)k * 128 + 4 * q) = v;
            else {
                float *x = p.dh0 + base + (int64_t)(4 * q) * 128 + k;
                x[0] = v.x; x[128] = v.y; x[256] = v.z; x[384] = v.w;
            }
        }
    }
}

/* a role's block barrier (its own work before it timed by FPW), then its rows formed again (tidx) and the profile probe k */
#define PHASE_BAR(R, k) \
    do {                \
        FPW(k);         \
        block_bar<R>(); \
        rows();         \
        FP(k);          \
    } while (0)

/* descriptors of a 64-row tile: A / B K-major at k step kk (16 columns);
 * B MN-major (rows along k, 128 columns) */
__device__ __forceinline__ uint64_t dk64(const char *t, int kk) { return desc_off(vdesc(t), (kk >> 2) * 8192 + (kk & 3) * 32); }
__device__ __forceinline__ uint64_t dk128(const char *t, int kk) { return desc_off(vdesc(t), (kk >> 2) * 16384 + (kk & 3) * 32); }   /* 128-row (S) tiles */
__device__ __forceinline__ uint64_t dmn(const char *t, int kk) { return desc_off(desc_sw128(t, 8192), kk * 2048); }
__device__ __forceinline__ uint64_t dmn_s(const char *t, int kk) { return desc_off(desc_sw128(t, 16384), kk * 2048); }   /* S tiles, k rows */

/* S: the state gradient */
template <bool TL> __device__ __forceinline__ void role_s(const BwdArgs &p, const FusedMaps &fm, char *sm, const Walk &w) {
    Frag f;
    int lane = tidx() & 31, wl = (tidx() >> 5) & 3, tq = f.tq;
    const auto rows = [&] { f = Frag(); tq = f.tq; lane = tidx() & 31; wl = (tidx() >> 5) & 3; };   /* after each barrier (tidx) */
    /* dS[mt][4 a + 2 hr + e] = dS[k = 64 mt + r0 + 8 hr][v = 8 a + 2 tq + e], from
     * dht through A and B */
    float d[2][64];
    stage_dstate(p, sm, w, true);
    gdn::bar_named(3, 128);
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int a = 0; a < 16; a++)
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const float2 v = *reinterpret_cast<const float2 *>(sm + FS::A + f32_at(64 * mt + f.r0 + 8 * hr, 8 * a + 2 * tq));
                d[mt][4 * a + 2 * hr] = v.x;
                d[mt][4 * a + 2 * hr + 1] = v.y;
            }
    block_bar<0>();   /* every role's: A, B read (the first chunk's fetch may write A) */
    FP_DECL;
    for (int64_t ci = w.top - 1; ci >= w.cb; ci--) {
        chunk_start<0, TL>(p, fm, sm, w, ci, [&](int k) { FP(k); });
        rows();
        FP(0);
        const int c = w.cnt(ci);
        /* S0 (bf16) into A, dS (bf16) into B; S0 . dS: four 8 x 8 matrices a store
         * (st_blk's order), their S0 values read from the staging area just before */
        float tot = 0.f;
        if (TL || p.st16) {   /* S0 in A already (bf16): read back in st_blk's order for S0 . dS */
            const int m = lane >> 3, row = 16 * wl + 8 * (m & 1) + (lane & 7);
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int hb = 0; hb < 2; hb++)
#pragma unroll
                    for (int a = 0; a < 8; a += 2) {
                        const float *x = &d[mt][32 * hb];
                        uint32_t hs[4], hd[4];
                        const int at = hb * 16384 + mt * 8192 + swz(row, 8 * (a + (m >> 1)));
                        gdn::ldsm4(hs, sm + FS::A + at);
#pragma unroll
                        for (int q = 0; q < 4; q++) {
                            const int aa = a + (q >> 1), hr = q & 1, b = 4 * aa + 2 * hr;
                            tot = fmaf(M::lo(hs[q]), x[b], fmaf(M::hi(hs[q]), x[b + 1], tot));
                            hd[q] = M::pack(x[b], x[b + 1]);
                        }
                        stsm4(sm + FS::B + at, hd[0], hd[1], hd[2], hd[3]);
                    }
        } else {
            const int m = lane >> 3, row = 16 * wl + 8 * (m & 1) + (lane & 7);
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int hb = 0; hb < 2; hb++)
#pragma unroll
                    for (int a = 0; a < 8; a += 2) {
                        const float *x = &d[mt][32 * hb];
                        uint32_t hs[4], hd[4];
#pragma unroll
                        for (int q = 0; q < 4; q++) {
                            const int aa = a + (q >> 1), hr = q & 1, b = 4 * aa + 2 * hr;
                            const float2 s0 = *reinterpret_cast<const float2 *>(
                                sm + FS::C + f32_at(64 * mt + f.r0 + 8 * hr, 64 * hb + 8 * aa + 2 * tq));
                            tot = fmaf(s0.x, x[b], fmaf(s0.y, x[b + 1], tot));
                            hs[q] = M::pack(s0.x, s0.y);
                            hd[q] = M::pack(x[b], x[b + 1]);
                        }
                        const int at = hb * 16384 + mt * 8192 + swz(row, 8 * (a + (m >> 1)));
                        stsm4(sm + FS::A + at, hs[0], hs[1], hs[2], hs[3]);
                        stsm4(sm + FS::B + at, hd[0], hd[1], hd[2], hd[3]);
                        asm volatile("" ::: "memory");   /* the next loads not hoisted above: registers */
                    }
        }
        tot = gdn::warp_sum(tot);
        FP(12);   /* S's step */
        if (lane == 0) Sc(sm).red[wl] = tot;
        cfwd::fence_async_smem();
        gdn::bar_named(3, 128);
        if (threadIdx.x == 0) Sc(sm).tot[0] = (Sc(sm).red[0] + Sc(sm).red[1]) + (Sc(sm).red[2] + Sc(sm).red[3]);
        PHASE_BAR(0, 1);   /* S */
        if ((TL || p.st16) && fetch_tx1<TL>(p, fm)) cfwd::mb_wait(sm + FS::MB_R, (uint32_t)((w.top - 1 - ci) & 1));   /* done: V, T waited */
        PHASE_BAR(0, 2);   /* P1 */
        {   /* the exp table for V's P3 and P4 pairs: (wl, a) blocks dealt to S's warps */
            const int ln = tidx() & 31, sw = (tidx() >> 5) & 3;
            const double *g = Sc(sm).gcd;
#pragma unroll 1
            for (int pr = sw; pr < 20; pr += 4) {
                const int wl = pr < 2 ? 0 : pr < 6 ? 1 : pr < 12 ? 2 : 3, a = pr - wl * (wl + 1);
                const int t0 = 16 * wl + (ln >> 2), u0 = 8 * a + 2 * (ln & 3);
                const double g0 = g[t0], g1 = g[t0 + 8], h0 = g[u0], h1 = g[u0 + 1];
                *reinterpret_cast<float4 *>(sm + FS::ET + 512 * wl * (wl + 1) + (a * 32 + ln) * 16) =
                    make_float4(__expf((float)(g0 - h0)), __expf((float)(g0 - h1)), __expf((float)(g1 - h0)), __expf((float)(g1 - h1)));
            }
        }
        PHASE_BAR(0, 3);   /* P2 */
        /* dS <- exp(gL) dS + q^T (diag(qs) dO) - k^T (diag(xs) dBv): q, k raw (exact) as
         * the A operands, the scaled dO and dBv (D) as hi + lo B operands built
         * 16 tokens at a time in VR (free since P2) */
        {
            const float gl = Sc(sm).gam[c - 1];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int x = 0; x < 64; x++) d[mt][x] *= gl;
            char *slab = sm + FS::VR;   /* [Bq hi | Bq lo | By hi | By lo], 16 rows x 128 columns each (4 KB) */
#pragma unroll 1
            for (int kk = 0; kk < 4; kk++) {
#pragma unroll
                for (int u = 0; u < 2; u++) {   /* 256 pieces of 8 columns a tensor, two a thread */
                    const int e = (tidx() & 127) + 128 * u, r = e >> 4, ch = e & 15, t = 16 * kk + r;
                    const int src = (ch >> 3) * 8192 + swz(t, (ch & 7) * 8), dst = (ch >> 3) * 2048 + swz(r, (ch & 7) * 8);
                    const float qs = Sc(sm).qs[t], ys = -Sc(sm).xs[t];
                    const uint4 o = *reinterpret_cast<const uint4 *>(sm + FS::OR + src);
                    const uint4 yh = *reinterpret_cast<const uint4 *>(sm + FS::D + src), yl = *reinterpret_cast<const uint4 *>(sm + FS::D + 16384 + src);
                    const uint32_t ow[4] = {o.x, o.y, o.z, o.w}, hw[4] = {yh.x, yh.y, yh.z, yh.w}, lw[4] = {yl.x, yl.y, yl.z, yl.w};
                    uint32_t qh[4], ql[4], bh[4], bl[4];
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const float x0 = qs * M::lo(ow[i]), x1 = qs * M::hi(ow[i]);
                        const float y0 = ys * (M::lo(hw[i]) + M::lo(lw[i])), y1 = ys * (M::hi(hw[i]) + M::hi(lw[i]));
                        qh[i] = M::pack(x0, x1);
                        ql[i] = M::pack(x0 - M::lo(qh[i]), x1 - M::hi(qh[i]));
                        bh[i] = M::pack(y0, y1);
                        bl[i] = M::pack(y0 - M::lo(bh[i]), y1 - M::hi(bh[i]));
                    }
                    *reinterpret_cast<uint4 *>(slab + dst) = make_uint4(qh[0], qh[1], qh[2], qh[3]);
                    *reinterpret_cast<uint4 *>(slab + 4096 + dst) = make_uint4(ql[0], ql[1], ql[2], ql[3]);
                    *reinterpret_cast<uint4 *>(slab + 8192 + dst) = make_uint4(bh[0], bh[1], bh[2], bh[3]);
                    *reinterpret_cast<uint4 *>(slab + 12288 + dst) = make_uint4(bl[0], bl[1], bl[2], bl[3]);
                }
                cfwd::fence_async_smem();
                gdn::bar_named(3, 128);
                cfwd::wg_fence();
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    const uint64_t aq = desc_off(vdesc(sm + FS::QR), mt * 8192 + kk * 2048), ak = desc_off(vdesc(sm + FS::KR), mt * 8192 + kk * 2048);
                    wss128<1, 1>(d[mt], aq, desc_sw128(slab, 2048), 1);
                    wss128<1, 1>(d[mt], aq, desc_off(desc_sw128(slab, 2048), 4096), 1);
                    wss128<1, 1>(d[mt], ak, desc_off(desc_sw128(slab, 2048), 8192), 1);
                    wss128<1, 1>(d[mt], ak, desc_off(desc_sw128(slab, 2048), 12288), 1);
                }
                cfwd::wg_commit();
                cfwd::wg_wait<0>();
                gdn::bar_named(3, 128);   /* the slab read before the next is built */
            }
        }
        PHASE_BAR(0, 4);   /* P3 */
        /* dS's second half parked in VR and OR (free from P3 to the next chunk's
         * fetch) while the cluster's rows need the registers */
#pragma unroll
        for (int i = 0; i < 16; i++)
            *reinterpret_cast<float4 *>(sm + FS::VR + (i * 128 + (tidx() & 127)) * 16) =
                make_float4(d[1][4 * i], d[1][4 * i + 1], d[1][4 * i + 2], d[1][4 * i + 3]);
        {   /* KK = K K^T for V's pairs in P4 (S idles there), into D (free from P3's
             * end to the next gate) in V's accumulator order, a float4 per thread per row
             * of 128 (no bank met twice) */
            float kk_[32];
            cfwd::wg_fence();
#pragma unroll
            for (int kk = 0; kk < 8; kk++) wss64<0, 0>(kk_, dk64((sm + FS::KR), kk), dk64((sm + FS::KR), kk), kk);
            cfwd::wg_commit();
            cfwd::wg_wait<0>();
#pragma unroll
            for (int q = 0; q < 8; q++)
                *reinterpret_cast<float4 *>(sm + FS::D + (q * 128 + (tidx() & 127)) * 16) = make_float4(kk_[4 * q], kk_[4 * q + 1], kk_[4 * q + 2], kk_[4 * q + 3]);
            /* each thread's stores released to V. An mbarrier, not a named barrier
             * that S arrives at: compute-sanitizer's racecheck reports such a
             * hand-off as a hazard even where it is correct, and would no longer
             * vouch for the pass (bench/racecheck_handoff_model.cu) */
            cfwd::mb_arrive(sm + FS::MB_K);
        }
        PHASE_BAR(0, 5);   /* P4 */
        cluster_bar<0>();   /* every block's dQc, dKc in its A, B */
        FP(7);
        cluster_rows<true, TL>(p, sm, w.row0(ci), c, w.h);
        FP(8);
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const float4 v = *reinterpret_cast<const float4 *>(sm + FS::VR + (i * 128 + (tidx() & 127)) * 16);
            d[1][4 * i] = v.x; d[1][4 * i + 1] = v.y; d[1][4 * i + 2] = v.z; d[1][4 * i + 3] = v.w;
        }
        war_bar<0>(sm, (uint32_t)((w.top - 1 - ci) & 1));   /* no block reads another's A, B any more */
        rows();
        FP(6);
    }
    FP_PRINT("S", w.top - w.cb);
    if (p.dh0) {   /* dh0 through A and B */
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int a = 0; a < 16; a++)
#pragma unroll
                for (int hr = 0; hr < 2; hr++)
                    *reinterpret_cast<float2 *>(sm + FS::A + f32_at(64 * mt + f.r0 + 8 * hr, 8 * a + 2 * tq)) =
                        make_float2(d[mt][4 * a + 2 * hr], d[mt][4 * a + 2 * hr + 1]);
        gdn::bar_named(3, 128);
        stage_dstate(p, sm, w, false);
    }
}

/* a 4-byte global store under a predicate (a branchless STG whose offset the address takes as an immediate) */
__device__ __forceinline__ void st_if(void *at, uint32_t v, bool on) {
    asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %2, 0;\n\t@q st.global.b32 [%0], %1;\n\t}" ::"l"(at), "r"(v), "r"((int)on));
}

/* V: dU, dTm, dBv, Xq, dP, dQc; tmp, dA, the pairs (with S's KK) */
template <bool TL> __device__ __forceinline__ void role_v(const BwdArgs &p, const FusedMaps &fm, char *sm, const Walk &w) {
    Frag f;
    int tq = f.tq, r0 = f.r0, r1 = r0 + 8;
    const auto rows = [&] { f = Frag(); tq = f.tq; r0 = f.r0; r1 = r0 + 8; };   /* after each barrier (tidx) */
    block_bar<1>();   /* S has read dht from A, B */
    FP_DECL;
    long long t1 = 0;   /* the first chunk's start (stagger) */
    for (int64_t ci = w.top - 1; ci >= w.cb; ci--) {
        stagger(p, w, ci, t1);
        chunk_start<1, TL>(p, fm, sm, w, ci, [&](int k) { FP(k); });
        rows();
        FP(0);
        const int c = w.cnt(ci);
        const int64_t row0 = w.row0(ci);
        PHASE_BAR(1, 1);   /* S */
        /* P1: dU = diag(us) K dS + P^T dO -> D (hi + lo) */
        {
            float z[64];
            cfwd::wg_fence();
#pragma unroll
            for (int kk = 0; kk < 8; kk++) wss128<0, 1>(z, dk64((sm + FS::KR), kk), dmn_s((sm + FS::B), kk), kk);
            cfwd::wg_commit();
            cfwd::wg_wait<0>();
            row_mul<64>(z, Sc(sm).us[r0], Sc(sm).us[r1]);
            cfwd::wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) wss128<1, 1>(z, desc_off(vdesc(sm + FS::PH), kk * 2048), dmn((sm + FS::OR), kk), 1);
            cfwd::wg_commit();
            cfwd::wg_wait<0>();
            st_tile(z, (sm + FS::D), (sm + FS::D) + 16384);
            cfwd::fence_async_smem();
        }
        PHASE_BAR(1, 2);   /* P1 */
        /* P2: dTm = dU X^T (strictly lower); X is free after it. dBv = Tm^T dU:
         * dv, dBv . v, dBv into D (hi + lo) */
        float dtm[32];
        {
            cfwd::wg_fence();
#pragma unroll
            for (int kk = 0; kk < 8; kk++) {
                wss64<0, 0>(dtm, dk64((sm + FS::D), kk), dk64((sm + FS::C), kk), kk);
                wss64<0, 0>(dtm, dk64((sm + FS::D) + 16384, kk), dk64((sm + FS::C), kk), 1);
            }
            cfwd::wg_commit();
            cfwd::wg_wait<0>();
            gdn::bar_named(BAR_X, 256);
#pragma unroll
            for (int a = 0; a < 8; a++)
#pragma unroll
                for (int x = 0; x < 4; x++) {
                    const int t = x < 2 ? r0 : r1, u = 8 * a + 2 * tq + (x & 1);
                    if (!(u < t && t < c)) dtm[4 * a + x] = 0.f;
                }
            float y[64];
            cfwd::wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                wss128<1, 1>(y, desc_off(vdesc(sm + FS::TH), kk * 2048), dmn((sm + FS::D), kk), kk);
                wss128<1, 1>(y, desc_off(vdesc(sm + FS::TH), kk * 2048), dmn((sm + FS::D) + 16384, kk), 1);
            }
            cfwd::wg_commit();
            cfwd::wg_wait<0>();
            const float b0 = Sc(sm).bet[r0], b1 = Sc(sm).bet[r1];
            {   /* dv: each row's address once, the stores predicated (no branch, no address formed again a store) */
                __nv_bfloat16 *d0 = static_cast<__nv_bfloat16 *>(p.dv) + ((row0 + r0) * p.HV + w.j) * (int64_t)128 + 2 * tq;
                __nv_bfloat16 *d1 = d0 + (int64_t)8 * p.HV * 128;
                const bool on0 = r0 < c, on1 = r1 < c;
#pragma unroll
                for (int a = 0; a < 16; a++) {
                    st_if(d0 + 8 * a, M::pack(b0 * y[4 * a], b0 * y[4 * a + 1]), on0);
                    st_if(d1 + 8 * a, M::pack(b1 * y[4 * a + 2], b1 * y[4 * a + 3]), on1);
                }
            }
            const float2 dd = rowdot(y, (sm + FS::VR), f);
            if (tq == 0) { Sc(sm).dbv[r0] = dd.x; Sc(sm).dbv[r1] = dd.y; }
            gdn::bar_named(1, 128);   /* every warp's reads of dU done */
            st_tile(y, (sm + FS::D), (sm + FS::D) + 16384);
            cfwd::fence_async_smem();
        }
        PHASE_BAR(1, 3);   /* P2 */
        /* P3: dP = dO U^T: Rg (into C), dP~; dP~ rq (rows, hi + lo) into C + 16 KB;
         * dP~ rk (columns) kept as hi + lo A fragments for dQc */
        uint32_t ph[4][4], pl[4][4];
        {
            float dp[32];
            cfwd::wg_fence();
#pragma unroll
            for (int kk = 0; kk < 8; kk++) {
                wss64<0, 0>(dp, dk64((sm + FS::OR), kk), dk64((sm + FS::C), kk), kk);
            }
            cfwd::wg_commit();
            cfwd::wg_wait<0>();
            gdn::bar_named(1, 128);   /* every warp's reads of U done: C is written over */
            /* branch free; exp(g_t - g_u) from S's table (FS::ET) */
            float *Rg = reinterpret_cast<float *>((sm + FS::C));
            const char *et = sm + et_at();
#pragma unroll
            for (int a = 0; a < 8; a++) {
                const float4 E4 = *reinterpret_cast<const float4 *>(et + 512 * a);
                const float Ea[4] = {E4.x, E4.y, E4.z, E4.w};
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int u = 8 * a + 2 * tq + e;
#pragma unroll
                    for (int hr = 0; hr < 2; hr++) {
                        const int t = hr ? r1 : r0, x = 4 * a + 2 * hr + e;
                        const float v = dp[x];
                        const uint32_t pw = *reinterpret_cast<const uint32_t *>((sm + FS::PH) + swz(t, u & ~1));
                        const float P = e ? M::hi(pw) : M::lo(pw);
                        Rg[t * CC + u] = u < t && t < c ? v * P : 0.f;
                        const float E = Ea[2 * hr + e];
                        dp[x] = u < t ? v * p.scale * E : u == t ? v * p.scale : 0.f;
                    }
                }
            }
            cfwd::acc_swz_hilo<M>(dp, (sm + FS::C) + 16384, (sm + FS::C) + 24576, tidx(), Sc(sm).rq[r0], Sc(sm).rq[r1]);   /* dP~ rq (rows) for T */
            cfwd::fence_async_smem();
#pragma unroll
            for (int a = 0; a < 8; a++) {
                const float k0 = Sc(sm).rk[8 * a + 2 * tq], k1 = Sc(sm).rk[8 * a + 2 * tq + 1];
                dp[4 * a] *= k0; dp[4 * a + 1] *= k1; dp[4 * a + 2] *= k0; dp[4 * a + 3] *= k1;
            }
#pragma unroll
            for (int kk = 0; kk < 4; kk++) afrag_hilo<M>(ph[kk], pl[kk], dp, kk);
        }
        /* dQc = (dP~ rk) K + scale gam Xq (T's, in B), into B (fp32) */
        {
            float dqc[64];
            cfwd::wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                wgt_rs<128, true, 1>(dqc, ph[kk], dmn((sm + FS::KR), kk), kk);
                wgt_rs<128, true, 1>(dqc, pl[kk], dmn((sm + FS::KR), kk), 1);
            }
            cfwd::wg_commit();
            cfwd::wg_wait<0>();
            gdn::bar_named(BAR_Q, 256);   /* T's part stored */
            add_f32(dqc, (sm + FS::B), f);
        }
        PHASE_BAR(1, 4);   /* P3 */
        /* P4: tmp = dTm Tm^T into A (hi + lo); dA = -Tm^T tmp; S's KK = K K^T; the
         * pairs; dKK + dKK^T (times rk) into A + 16 KB */
        {
            float tm[32];
            uint32_t ah[4][4], al[4][4];
#pragma unroll
            for (int kk = 0; kk < 4; kk++) afrag_hilo<M>(ah[kk], al[kk], dtm, kk);
            cfwd::wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                wgt_rs<64, true, 0>(tm, ah[kk], desc_off(vdesc(sm + FS::TH), kk * 32), kk);
                wgt_rs<64, true, 0>(tm, al[kk], desc_off(vdesc(sm + FS::TH), kk * 32), 1);
            }
            cfwd::wg_commit();
            cfwd::wg_wait<0>();
            st_blk(tm, (sm + FS::A), (sm + FS::A) + 8192);
            cfwd::fence_async_smem();
            gdn::bar_named(1, 128);
            float da[32], kk_[32];
            cfwd::wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                wss64<1, 1>(da, desc_off(vdesc(sm + FS::TH), kk * 2048), desc_off(vdesc(sm + FS::A), kk * 2048), kk);
                wss64<1, 1>(da, desc_off(vdesc(sm + FS::TH), kk * 2048), desc_off(vdesc(sm + FS::A), 8192 + kk * 2048), 1);
            }
            cfwd::wg_commit();
            cfwd::wg_wait<0>();
            cfwd::mb_wait(sm + FS::MB_K, (uint32_t)((w.top - 1 - ci) & 1));   /* S's KK = K K^T in D */
#pragma unroll
            for (int q = 0; q < 8; q++) {
                const float4 v = *reinterpret_cast<const float4 *>(sm + FS::D + (q * 128 + (tidx() & 127)) * 16);
                kk_[4 * q] = v.x; kk_[4 * q + 1] = v.y; kk_[4 * q + 2] = v.z; kk_[4 * q + 3] = v.w;
            }
            /* the pairs, branch free: dbeta's sums, Rg, and dKK (lower) into TH + PH
             * (Tm's and P's place) as fp32; then S = (dKK + dKK^T) diag(rk) as hi + lo
             * from it into A + 16 KB */
            gdn::bar_named(1, 128);   /* every warp's products with Tm done: TH is written over */
            float *Rg = reinterpret_cast<float *>((sm + FS::C)), *L = reinterpret_cast<float *>((sm + FS::TH));
            {
                const float b0 = Sc(sm).bet[r0], b1 = Sc(sm).bet[r1], k0 = Sc(sm).rk[r0], k1 = Sc(sm).rk[r1];
                const char *et = sm + et_at();
                float db0 = 0.f, db1 = 0.f;
#pragma unroll
                for (int a = 0; a < 8; a++) {
                    const float4 E4 = *reinterpret_cast<const float4 *>(et + 512 * a);
                    const float Ea[4] = {E4.x, E4.y, E4.z, E4.w};
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int u = 8 * a + 2 * tq + e;
                        const float ru = Sc(sm).rk[u];
#pragma unroll
                        for (int hr = 0; hr < 2; hr++) {
                            const int t = hr ? r1 : r0, x = 4 * a + 2 * hr + e;
                            const float E = u < t && t < c ? -da[x] * Ea[2 * hr + e] : 0.f;
                            const float kk = kk_[x] * ((hr ? k1 : k0) * ru);
                            if (hr) db1 = fmaf(E, kk, db1); else db0 = fmaf(E, kk, db0);
                            Rg[t * CC + u] += E * (hr ? b1 : b0) * kk;
                            L[t * CC + u] = (hr ? b1 : b0) * E;
                        }
                    }
                }
                db0 += __shfl_xor_sync(0xffffffffu, db0, 1);
                db0 += __shfl_xor_sync(0xffffffffu, db0, 2);
                db1 += __shfl_xor_sync(0xffffffffu, db1, 1);
                db1 += __shfl_xor_sync(0xffffffffu, db1, 2);
                if (tq == 0) { Sc(sm).dba[r0] = db0; Sc(sm).dba[r1] = db1; }
            }
            gdn::bar_named(1, 128);   /* dKK whole */
            {
                float x[32];   /* (dKK + dKK^T)_tu rk_u: dKc_t += sum_u x_tu k_u (raw) */
#pragma unroll
                for (int a = 0; a < 8; a++)
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        const int t = q < 2 ? r0 : r1, u = 8 * a + 2 * tq + (q & 1);
                        x[4 * a + q] = (L[t * CC + u] + L[u * CC + t]) * Sc(sm).rk[u];
                    }
                st_blk(x, (sm + FS::A) + 16384, (sm + FS::A) + 24576);
            }
            cfwd::fence_async_smem();
            gdn::bar_named(BAR_S, 256);
        }
        PHASE_BAR(1, 5);   /* P4 */
        chunk_end<1, TL>(p, sm, w, ci, [&](int k) { FP(k); });
        rows();
        FP(6);
    }
    if ((TL || p.st16) && w.top > w.cb) chunk_gate(p, sm, w, w.cb);   /* the last chunk's */
    FP_PRINT("V", w.top - w.cb);
}

/* T: X, U, dKd, dBk, dKc */
template <bool TL> __device__ __forceinline__ void role_t(const BwdArgs &p, const FusedMaps &fm, char *sm, const Walk &w) {
    Frag f;
    int tq = f.tq, r0 = f.r0, r1 = r0 + 8;
    const auto rows = [&] { f = Frag(); tq = f.tq; r0 = f.r0; r1 = r0 + 8; };   /* after each barrier (tidx) */
    block_bar<2>();   /* S has read dht from A, B */
    FP_DECL;
    for (int64_t ci = w.top - 1; ci >= w.cb; ci--) {
        chunk_start<2, TL>(p, fm, sm, w, ci, [&](int k) { FP(k); });
        rows();
        FP(0);
        const int c = w.cnt(ci);
        PHASE_BAR(2, 1);   /* S */
        /* P1: X = beta v - xs K S0 -> C (bf16) */
        float x[64];
        {
            cfwd::wg_fence();
#pragma unroll
            for (int kk = 0; kk < 8; kk++) wss128<0, 1>(x, dk64((sm + FS::KR), kk), dmn_s((sm + FS::A), kk), kk);
            cfwd::wg_commit();
            cfwd::wg_wait<0>();
            const float b0 = Sc(sm).bet[r0], b1 = Sc(sm).bet[r1], x0 = Sc(sm).xs[r0], x1 = Sc(sm).xs[r1];
#pragma unroll
            for (int a = 0; a < 16; a++) {
                const int col = 8 * (a & 7) + 2 * tq;
                const char *vb = (sm + FS::VR) + (a >> 3) * 8192;
                const uint32_t v0 = *reinterpret_cast<const uint32_t *>(vb + swz(r0, col)), v1 = *reinterpret_cast<const uint32_t *>(vb + swz(r1, col));
                x[4 * a] = b0 * M::lo(v0) - x0 * x[4 * a];
                x[4 * a + 1] = b0 * M::hi(v0) - x0 * x[4 * a + 1];
                x[4 * a + 2] = b1 * M::lo(v1) - x1 * x[4 * a + 2];
                x[4 * a + 3] = b1 * M::hi(v1) - x1 * x[4 * a + 3];
            }
            st_tile_hi(x, (sm + FS::C));
            cfwd::fence_async_smem();
        }
        PHASE_BAR(2, 2);   /* P1 */
        /* P2: U = Tm X -> C once V has read X; dKd = U dS^T: dKc = ek dKd, the
         * gate's last-row pairs rk (k . dKd) */
        float dkc[64];
        {
            cfwd::wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                wss128<0, 1>(x, desc_off(vdesc(sm + FS::TH), kk * 32), dmn((sm + FS::C), kk), kk);
            }
            cfwd::wg_commit();
            cfwd::wg_wait<0>();
            gdn::bar_named(BAR_X, 256);
            st_tile_hi(x, (sm + FS::C));
            cfwd::fence_async_smem();
            gdn::bar_named(2, 128);   /* U stored by the whole warpgroup */
            cfwd::wg_fence();
#pragma unroll
            for (int kk = 0; kk < 8; kk++) {
                wss128<0, 0>(dkc, dk64((sm + FS::C), kk), dk128((sm + FS::B), kk), kk);
            }
            cfwd::wg_commit();
            cfwd::wg_wait<0>();
            const float2 kd = rowdot(dkc, (sm + FS::KR), f);
            if (tq == 0) { Sc(sm).rl[r0] = Sc(sm).rk[r0] * kd.x; Sc(sm).rl[r1] = Sc(sm).rk[r1] * kd.y; }
            row_mul<64>(dkc, Sc(sm).ek[r0], Sc(sm).ek[r1]);
        }
        PHASE_BAR(2, 3);   /* P2 */
        /* P3: Xq first (V waits for it at BAR_Q), then dBk = -dBv S0^T: dKc +=
         * beta gam dBk; k . dBk to dbeta and the gate */
        {
            float y[64];
            /* Xq = dO S0^T: dQc's first part, scale gam Xq, into B for V (fp32; dS's
             * last reader was this warpgroup's dKd in P2), and the gate's q . Xq
             * (before dBk, which nothing waits for until P4) */
            cfwd::wg_fence();
#pragma unroll
            for (int kk = 0; kk < 8; kk++) wss128<0, 0>(y, dk64((sm + FS::OR), kk), dk128((sm + FS::A), kk), kk);
            cfwd::wg_commit();
            cfwd::wg_wait<0>();
            const float2 qd = rowdot(y, (sm + FS::QR), f);
            const float f0 = p.scale * Sc(sm).gam[r0], f1 = p.scale * Sc(sm).gam[r1];
            if (tq == 0) {
                Sc(sm).dgq[r0] = r0 < c ? f0 * Sc(sm).rq[r0] * qd.x : 0.f;
                Sc(sm).dgq[r1] = r1 < c ? f1 * Sc(sm).rq[r1] * qd.y : 0.f;
            }
            row_mul<64>(y, r0 < c ? f0 : 0.f, r1 < c ? f1 : 0.f);
            st_f32(y, (sm + FS::B), f);
            gdn::bar_arrive(BAR_Q, 256);
            cfwd::wg_fence();
#pragma unroll
            for (int kk = 0; kk < 8; kk++) {
                wss128<0, 0>(y, dk64((sm + FS::D), kk), dk128((sm + FS::A), kk), kk);
                wss128<0, 0>(y, dk64((sm + FS::D) + 16384, kk), dk128((sm + FS::A), kk), 1);
            }
            cfwd::wg_commit();
            cfwd::wg_wait<0>();
            const float2 kd = rowdot(y, (sm + FS::KR), f);   /* -(k . dBk) */
            const float k0 = -Sc(sm).rk[r0] * kd.x, k1 = -Sc(sm).rk[r1] * kd.y;
            if (tq == 0) {
                Sc(sm).dbk[r0] = r0 < c ? Sc(sm).gam[r0] * k0 : 0.f;
                Sc(sm).dbk[r1] = r1 < c ? Sc(sm).gam[r1] * k1 : 0.f;
                Sc(sm).dgk[r0] = r0 < c ? Sc(sm).bet[r0] * Sc(sm).gam[r0] * k0 : 0.f;
                Sc(sm).dgk[r1] = r1 < c ? Sc(sm).bet[r1] * Sc(sm).gam[r1] * k1 : 0.f;
            }
            const float e0 = -(Sc(sm).bet[r0] * Sc(sm).gam[r0]), e1 = -(Sc(sm).bet[r1] * Sc(sm).gam[r1]);
#pragma unroll
            for (int a = 0; a < 16; a++) {
                dkc[4 * a] = fmaf(e0, y[4 * a], dkc[4 * a]);
                dkc[4 * a + 1] = fmaf(e0, y[4 * a + 1], dkc[4 * a + 1]);
                dkc[4 * a + 2] = fmaf(e1, y[4 * a + 2], dkc[4 * a + 2]);
                dkc[4 * a + 3] = fmaf(e1, y[4 * a + 3], dkc[4 * a + 3]);
            }
        }
        PHASE_BAR(2, 4);   /* P3 */
        /* P4: dKc += (dP~ rq)^T Q, then (dKK + dKK^T) K; into B (fp32) */
        {
            cfwd::wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                wss128<1, 1>(dkc, desc_off(vdesc(sm + FS::C), 16384 + kk * 2048), dmn((sm + FS::QR), kk), 1);
                wss128<1, 1>(dkc, desc_off(vdesc(sm + FS::C), 24576 + kk * 2048), dmn((sm + FS::QR), kk), 1);
            }
            cfwd::wg_commit();
            cfwd::wg_wait<0>();
            gdn::bar_named(BAR_S, 256);
            cfwd::wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                wss128<0, 1>(dkc, desc_off(vdesc(sm + FS::A), 16384 + kk * 32), dmn((sm + FS::KR), kk), 1);
                wss128<0, 1>(dkc, desc_off(vdesc(sm + FS::A), 24576 + kk * 32), dmn((sm + FS::KR), kk), 1);
            }
            cfwd::wg_commit();
            cfwd::wg_wait<0>();
            gdn::bar_named(2, 128);   /* every warp's reads of dKK + dKK^T done */
            st_f32(dkc, (sm + FS::A), f);
        }
        PHASE_BAR(2, 5);   /* P4 */
        chunk_end<2, TL>(p, sm, w, ci, [&](int k) { FP(k); });
        rows();
        FP(6);
    }
    if ((TL || p.st16) && w.top > w.cb) chunk_gate(p, sm, w, w.cb);   /* the last chunk's */
    FP_PRINT("T", w.top - w.cb);
}
#undef PHASE_BAR

/* TL: the instance for the bf16 state and record tiles (st16 and rec16, the
 * whole-call shapes; every "TL || p.st16" above is that mode known when
 * compiled), whose chunk loops carry none of the other modes' code: 17.6k ->
 * 15.1k instructions and 60 / 312 -> 20 / 72 bytes of spills (the pass waits
 * for its instructions: bench/NOTES.md v5.18, v5.19) */
template <bool TL> __global__ void __launch_bounds__(FT, 1) fused_kernel(BwdArgs p, const __grid_constant__ FusedMaps fm) {
    extern __shared__ __align__(1024) char fsm_raw[];
    char *sm = fsm_raw + ((1024 - (saddr(fsm_raw) & 1023)) & 1023);
    Walk w;
    w.j = (int)(blockIdx.x % p.HV);
    w.h = w.j / p.G;
    w.n = p.lpt ? longest_at(p.cu, p.lpt, (int)(blockIdx.x / p.HV)) : blockIdx.x / p.HV;
    seq_range(p, w.n, &w.bos, &w.len);
    w.sb = w.bos / CC + w.n;
    sweep_range(p, (w.len + CC - 1) / CC, &w.cb, &w.top);
    w.kept = 0;
    if (threadIdx.x == 0) {
        if (p.kst) w.kept = *p.ktag == p.ktag_val;   /* the tag the forward left in saved (kernels before this one) */
        *reinterpret_cast<Walk *>(sm + FS::WK) = w;
    }
    if (threadIdx.x == 128) {   /* before the roles' first block barrier */
        cfwd::mb_init(sm + FS::MB);
        cfwd::mb_init(sm + FS::MB_R);
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 128;" ::"r"(saddr(sm + FS::MB_K)) : "memory");
    }
#ifdef GDN_FUSED_WAR_MBARRIER
    if (threadIdx.x == 128)   /* published by the first publishing barrier, before any remote arrival */
        asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\nfence.mbarrier_init.release.cluster;" ::"r"(saddr(sm + FS::MB_W)), "r"(12 * p.G) : "memory");
#endif
    __syncthreads();   /* the shared Walk written */
    const Walk &ws = *reinterpret_cast<const Walk *>(sm + FS::WK);
    const int wg = __shfl_sync(0xffffffffu, (int)threadIdx.x >> 7, 0);
    /* 168 registers a thread in every role (dS alone is 128 of S's) */
    if (wg == 0) {
        role_s<TL>(p, fm, sm, ws);
    } else if (wg == 1) {
        role_v<TL>(p, fm, sm, ws);
    } else {
        role_t<TL>(p, fm, sm, ws);
    }
}

}  // namespace

/* G <= 4: measured faster than the two passes at G = 2 (qwen3next, varlen,
 * tp8_4k) and at G = 4 where the split's clusters run in one wave (long1:
 * -24 %; bench/NOTES.md v5.7) */
bool Fused::takes(const BwdArgs &p) {
    return p.dt == 1 && p.K == 128 && p.V == 128 && p.G <= 4 && al16(p.q) && al16(p.k) && al16(p.v) && al16(p.dout) && al16(p.dq) &&
           al16(p.dk) && al16(p.dv);
}
cudaError_t Fused::attr() {
    static bool done = false;
    if (done) return cudaSuccess;
    cudaError_t e = cudaFuncSetAttribute(fused_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, FS::bytes);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(fused_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, FS::bytes);
    if (e == cudaSuccess) done = true;
    return e;
}
int Fused::max_clusters(int g) {
    static int known[9] = {0};
    if (g < 1 || g > 8) return 0;
    if (!known[g]) {
        int n = 0;
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute at[1];
        cfg.gridDim = dim3((unsigned)g);
        cfg.blockDim = dim3(FT);
        cfg.dynamicSmemBytes = (size_t)FS::bytes;
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = (unsigned)g;
        at[0].val.clusterDim.y = at[0].val.clusterDim.z = 1;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        if (attr() != cudaSuccess || cudaOccupancyMaxActiveClusters(&n, fused_kernel<false>, &cfg) != cudaSuccess || n <= 0) {
            (void)cudaGetLastError();
            n = sm_count() / g;
        }
        known[g] = n;
    }
    return known[g];
}
void Fused::launch(const BwdArgs &p, cudaStream_t st) {
    const unsigned blocks = (unsigned)(p.N * p.HV);
    if (blocks == 0) return;
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(FT);
    cfg.dynamicSmemBytes = (size_t)FS::bytes;
    cfg.stream = st;
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = (unsigned)p.G;
    at[0].val.clusterDim.y = at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    FusedMaps fm{};   /* host only, no stream work: capture-safe */
    fm.on = cfwd::tile_map(&fm.k, p.k, true, p.ntok, p.H, 128, 64, true) && cfwd::tile_map(&fm.q, p.q, true, p.ntok, p.H, 128, 64, true) &&
            cfwd::tile_map(&fm.v, p.v, true, p.ntok, p.HV, 128, 64, true) && cfwd::tile_map(&fm.o, p.dout, true, p.ntok, p.HV, 128, 64, true);
    /* S0's and the records' tiles by the TMA's tensor path too (the same bytes as a bulk copy) */
    fm.bt = p.states && p.rec && cfwd::byte_rows_map(&fm.s0, p.states, p.st_rows, 128) &&
            cfwd::byte_rows_map(&fm.tr, p.rec, p.rec_rows, 64) && (!p.kst || cfwd::byte_rows_map(&fm.s0k, p.kst, p.kst_rows, 128));
    if (p.st16 && p.rec16 && fm.bt) cudaLaunchKernelEx(&cfg, fused_kernel<true>, p, fm);
    else cudaLaunchKernelEx(&cfg, fused_kernel<false>, p, fm);
}

}  // namespace cbwd
}  // namespace gdn
