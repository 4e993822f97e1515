/* CUDA chunk backward, the chunk-local stage for K <= 128 (local_kernel): one
 * block per (slot, value head) runs chunk_backward of chunk_bwd.c with every
 * tile in shared memory and every sum over V in registers; for 128 < K <= 256
 * (G <= 4) two blocks an item, each holding half of K (KS below); its launcher.
 *
 * The group stage of chunk_bwd_grp.cu (any K) keeps an item's twenty tiles
 * in a per-item scratch in global memory and waits on it at every product.
 * Here V is walked in panels of VP columns: a panel's S0, dS, v, dO rows come
 * in once, the panel's U, dU are recomputed from them (U = Tm (Bv - Bk S0),
 * dU = P^T dO + Kd dS) and dv is stored, and the five products that sum over
 * V accumulate in each warp's registers:
 *
 *   dKd = U dS^T,  Xq = dO S0^T,  dWk = -dU S0^T   (c x K)
 *   dP  = dO U^T,  dTm = dU Bv^T                   (c x c)
 *
 * After the walk the K side runs on shared tiles (q, k rows, Tm, P, dP, dWk,
 * dTm) with dQc and dKc growing in registers: dQc from Xq, dKc from dKd, then
 * the products of dP~, dBk = Tm^T dWk, dA = -Tm^T dTm Tm^T and KK = K K^T.
 * dQc and dKc meet the other value heads' of the same q/k head in the
 * block's cluster (G blocks; cluster_qk_store sums them in rank order and
 * stores dq, dk through the L2 norm chain), or leave through the scratch for
 * grp_qk_kernel where G > 8; dv, dg, dbeta and the dA_log / ddt_bias
 * partials are stored here. Products are 3xTF32 where SPLIT, else one tf32 product on
 * operands rounded to tf32 as they are stored; every product is fed from
 * its arrays by pointer (warp_mma_s, mma_tf32.cuh), by ldmatrix where the
 * operand runs along k in memory, so P is kept transposed and X is stored
 * transposed for U = Tm X. Warp w
 * owns rows 16 (w % 4) and half w / 4 of the columns of every c x K and c x c
 * sum; the panel's c x VP products are dealt one 16 x 16 tile per warp. */
#include <cooperative_groups.h>
#include <type_traits>
#include "cuda/chunk_bwd.cuh"
#include "cuda/chunk_fwd.cuh"

namespace gdn {
namespace cbwd {
namespace {

constexpr int VP = 32, LP = VP + 4;   /* panel columns; row stride of the panel arrays (4 mod 32) */

/* shared memory, in floats: Kc, Tm, P for the whole block; the panel arrays
 * of the V walk and the K side's arrays share the space after them */
template <int KH> struct Lay {
    static constexpr int LK = KH + 4;   /* row stride of the c x K arrays (4 mod 32) */
    static constexpr int Kc = 0, Tm = Kc + CC * LK, P = Tm + CC * R4, A = P + CC * R4;
    /* the V walk (S0q, dSq: the second pair of PanelFetch's buffers) */
    static constexpr int S0p = A, dSp = S0p + KH * LP, Vp = dSp + KH * LP, dOp = Vp + CC * LP, Xp = dOp + CC * LP,
                         Up = Xp + CC * LP, dUp = Up + CC * LP, S0q = dUp + CC * LP, dSq = S0q + KH * LP, end1 = dSq + KH * LP;
    /* the K side (Q and dWk also hold gate_store's prefix sums at the end) */
    static constexpr int Q = A, dWk = Q + CC * LK, dP = dWk + CC * LK, dTm = dP + CC * R4, tmp = dTm + CC * R4,
                         Rg = tmp + CC * R4, end2 = Rg + CC * R4;
    /* q's raw rows (64 x KH 16-bit values) staged by cp.async during the V walk, past its arrays */
    static constexpr int Qstage = end1, end3 = Qstage + CC * KH / 2;
    static constexpr int end = end2 > end3 ? end2 : end3;
    /* then: gcd (CC doubles), gam, bet, ek, dgc, dbt, row, rpa[2][CC], rpb[2][CC], red[32], gt (GateTok's), ksv[4] (KS);
     * the f16 K split's instance has 16 KB more past them (vside_wg's fourth prefetch slot: local_smem_pf) */
    static constexpr int floats = end + 2 * CC + 6 * CC + 4 * CC + 32 + GT_FLOATS + 4;
    static_assert(CC * (CC + 1) * 2 <= 2 * CC * LK, "gate_store's prefix sums fit in Q and dWk");
};

/* warp w's tiles: rows wr = 16 (w % 4); c x K columns from kc0 = (w / 4) KH / 2
 * (NR tiles of 32), c x c columns from cc0 = 32 (w / 4) */
template <int NR> using Acc = float[NR][4][4];

/* per row of the warp's tiles, sum over its columns of acc * X (X in shared
 * memory, stride ld, zero past K), reduced over the quad; out[row] */
template <int NR>
__device__ __forceinline__ void row_dots(const Acc<NR> &acc, const float *X, int ld, int wr, int kc0, float *out) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    float d0 = 0.f, d1 = 0.f;
#pragma unroll
    for (int r = 0; r < NR; r++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int n = kc0 + 32 * r + 8 * j + 2 * t4;
            d0 = fmaf(acc[r][j][0], X[(wr + g) * ld + n], fmaf(acc[r][j][1], X[(wr + g) * ld + n + 1], d0));
            d1 = fmaf(acc[r][j][2], X[(wr + g + 8) * ld + n], fmaf(acc[r][j][3], X[(wr + g + 8) * ld + n + 1], d1));
        }
    d0 += __shfl_xor_sync(0xffffffffu, d0, 1);
    d0 += __shfl_xor_sync(0xffffffffu, d0, 2);
    d1 += __shfl_xor_sync(0xffffffffu, d1, 1);
    d1 += __shfl_xor_sync(0xffffffffu, d1, 2);
    if (t4 == 0) { out[wr + g] = d0; out[wr + g + 8] = d1; }
}

/* row-wise on the warp's tiles: row_scale dst = f(row) dst; row_axpy dst += f(row) src */
template <int NR, typename F>
__device__ __forceinline__ void row_scale(Acc<NR> &dst, int wr, const F &f) {
    const int g = (threadIdx.x & 31) >> 2;
    const float f0 = f(wr + g), f1 = f(wr + g + 8);
#pragma unroll
    for (int r = 0; r < NR; r++)
#pragma unroll
        for (int j = 0; j < 4; j++) { dst[r][j][0] *= f0; dst[r][j][1] *= f0; dst[r][j][2] *= f1; dst[r][j][3] *= f1; }
}
template <int NR, typename F>
__device__ __forceinline__ void row_axpy(Acc<NR> &dst, const Acc<NR> &src, int wr, const F &f) {
    const int g = (threadIdx.x & 31) >> 2;
    const float f0 = f(wr + g), f1 = f(wr + g + 8);
#pragma unroll
    for (int r = 0; r < NR; r++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            dst[r][j][0] = fmaf(f0, src[r][j][0], dst[r][j][0]); dst[r][j][1] = fmaf(f0, src[r][j][1], dst[r][j][1]);
            dst[r][j][2] = fmaf(f1, src[r][j][2], dst[r][j][2]); dst[r][j][3] = fmaf(f1, src[r][j][3], dst[r][j][3]);
        }
}

/* acc[r] += A B over k in [k0, k1) for the warp's c x K tiles (operands as
 * warp_mma_s takes them) */
template <bool SPLIT, bool AT, bool BK, int NR>
__device__ __forceinline__ void acc_ck(Acc<NR> &acc, int wr, int kc0, int k0, int k1, const float *A, int lda, const float *B, int ldb) {
#pragma unroll
    for (int r = 0; r < NR; r++) gdn::warp_mma_s<SPLIT, AT, BK, 4>(acc[r], A, lda, B, ldb, wr, kc0 + 32 * r, k0, k1);
}
template <int NR, typename FE>
__device__ __forceinline__ void store_ck(const Acc<NR> &acc, int wr, int kc0, int K, const FE &epi) {
#pragma unroll
    for (int r = 0; r < NR; r++) gdn::warp_store(acc[r], wr, kc0 + 32 * r, 4, CC, K, epi);
}

/* the warp's c x K tiles to rows of stride ld (even) at dst, two columns a
 * store, the columns below n1 (even) */
template <int NR> __device__ __forceinline__ void store_pairs(const Acc<NR> &acc, int wr, int kc0, float *dst, int ld, int n1) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int r = 0; r < NR; r++)
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int n = kc0 + 32 * r + 8 * q + 2 * t4;
            if (n < n1) {
                *reinterpret_cast<float2 *>(dst + (wr + g) * ld + n) = make_float2(acc[r][q][0], acc[r][q][1]);
                *reinterpret_cast<float2 *>(dst + (wr + g + 8) * ld + n) = make_float2(acc[r][q][2], acc[r][q][3]);
            }
        }
}

/* the warp's c x K tiles to rows of K floats at w (global memory), two
 * columns a store where K is even */
template <int NR> __device__ __forceinline__ void store_rows(const Acc<NR> &acc, int wr, int kc0, int K, float *w) {
    if (K & 1) store_ck<NR>(acc, wr, kc0, K, [&](int t, int i, float x) { w[t * K + i] = x; });
    else store_pairs<NR>(acc, wr, kc0, w, K, K);
}

/* the warp's 16 x 16 tile of a c x VP panel product: rows i0, columns n0 */
__device__ __forceinline__ int panel_i0() { return ((threadIdx.x >> 5) >> 1) * 16; }
__device__ __forceinline__ int panel_n0() { return ((threadIdx.x >> 5) & 1) * 16; }
template <bool SPLIT, bool AT, bool BK>
__device__ __forceinline__ void panel_acc(float (&acc)[4][4], int k0, int k1, const float *A, int lda, const float *B, int ldb) {
    gdn::warp_mma_s<SPLIT, AT, BK, 2>(acc, A, lda, B, ldb, panel_i0(), panel_n0(), k0, k1);
}
template <typename FE> __device__ __forceinline__ void panel_store(const float (&acc)[4][4], const FE &epi) {
    gdn::warp_store(acc, panel_i0(), panel_n0(), 2, CC, VP, epi);
}

/* rows [0, KH) x columns [v0, v0 + VP) of a K x V fp32 state into dst
 * (stride LP), zero past K and V, rounded to tf32 without SPLIT: 16-byte
 * loads where V % 4 == 0, all of a thread's in flight at once */
template <bool SPLIT, int KH>
__device__ __forceinline__ void load_panel(float *dst, const float *S, int K, int V, int v0) {
    constexpr int N4 = KH * VP / 4 / NT;   /* float4 per thread */
    if ((V & 3) == 0) {
        float4 r[N4];
#pragma unroll
        for (int u = 0; u < N4; u++) {
            const int e = threadIdx.x + u * NT, i = e / (VP / 4), q = e % (VP / 4);
            r[u] = i < K && v0 + 4 * q < V ? *reinterpret_cast<const float4 *>(S + (int64_t)i * V + v0 + 4 * q) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int u = 0; u < N4; u++) {
            const int e = threadIdx.x + u * NT, i = e / (VP / 4), q = e % (VP / 4);
            const float4 x = make_float4(gdn::tf32r_if<SPLIT>(r[u].x), gdn::tf32r_if<SPLIT>(r[u].y), gdn::tf32r_if<SPLIT>(r[u].z),
                                         gdn::tf32r_if<SPLIT>(r[u].w));
            *reinterpret_cast<float4 *>(dst + i * LP + 4 * q) = x;
        }
    } else {
        batched<8>(KH * VP, [&](int e) { const int i = e / VP, v = v0 + e % VP; return i < K && v < V ? S[(int64_t)i * V + v] : 0.f; },
                   [&](int e, float x) { dst[(e / VP) * LP + e % VP] = gdn::tf32r_if<SPLIT>(x); });
    }
}

/* one panel's S0, dS, v, dO rows, issued a panel ahead (bf16 / f16 inputs,
 * V % VP == 0, V % 4 == 0, v and dO in 16-byte rows): S0 and dS rows < K by
 * cp.async into the panel's pair of buffers (the walk alternates two pairs;
 * rows from K on are zeroed once), v and dO by 16-byte loads into registers
 * (one piece a thread), stored by commit (rows < c; rows past c are zeroed
 * once). commit waits for the copies and rounds the thread's own pieces to
 * tf32 (without SPLIT) before the barrier that publishes them. */
template <bool SPLIT, int KH> struct PanelFetch {
    static constexpr int N4 = KH * VP / 4 / NT;   /* 16-byte pieces per thread and state */
    Rows16<1> v, o;
    __device__ __forceinline__ void issue(const BwdArgs &p, int K, const float *S0, const float *dS, int64_t row0, int c, int j, int v0,
                                          float *s0b, float *dsb) {
        const int V = p.V;
#pragma unroll
        for (int u = 0; u < N4; u++) {
            const int e = threadIdx.x + u * NT, i = e / (VP / 4), q = e % (VP / 4);
            if (i < K) {
                const int64_t at = (int64_t)i * V + v0 + 4 * q;
                gdn::cp16(s0b + i * LP + 4 * q, S0 + at, true);
                gdn::cp16(dsb + i * LP + 4 * q, dS + at, true);
            }
        }
        gdn::cp_commit();
        v.issue(p.v, p.dt, row0, c, p.HV, j, V, v0, VP, nullptr, 0);
        o.issue(p.dout, p.dt, row0, c, p.HV, j, V, v0, VP, nullptr, 0);
    }
    /* returns the thread's part of the sum of S0 * dS over the panel */
    __device__ __forceinline__ float commit(const BwdArgs &p, int K, int c, float *s0b, float *dsb, float *Vp, float *dOp) const {
        gdn::cp_wait_all();
        float tot = 0.f;
#pragma unroll
        for (int u = 0; u < N4; u++) {
            const int e = threadIdx.x + u * NT, i = e / (VP / 4), q = e % (VP / 4);
            if (i < K) {
                float4 *x = reinterpret_cast<float4 *>(s0b + i * LP + 4 * q), *y = reinterpret_cast<float4 *>(dsb + i * LP + 4 * q);
                const float4 a = *x, b = *y;
                tot = fmaf(a.x, b.x, fmaf(a.y, b.y, fmaf(a.z, b.z, fmaf(a.w, b.w, tot))));
                if (!SPLIT) {
                    *x = make_float4(gdn::tf32r(a.x), gdn::tf32r(a.y), gdn::tf32r(a.z), gdn::tf32r(a.w));
                    *y = make_float4(gdn::tf32r(b.x), gdn::tf32r(b.y), gdn::tf32r(b.z), gdn::tf32r(b.w));
                }
            }
        }
        v.commit(Vp, LP, p.dt, c, VP, 0);   /* bf16 / f16 values are tf32 already */
        o.commit(dOp, LP, p.dt, c, VP, 0);
        return tot;
    }
};
__device__ __forceinline__ bool panel_fetch_ok(const BwdArgs &p) {
    return p.dt != 0 && p.V % VP == 0 && rows16_ok(p.v, p.dt, p.V, 0, VP) && rows16_ok(p.dout, p.dt, p.V, 0, VP);
}

/* a record's 64 x 64 matrix into shared memory (stride R4), transposed where
 * asked, rounded to tf32 without SPLIT */
template <bool SPLIT>
__device__ __forceinline__ void commit_mat(const Mat64 &m, float *dst, bool transpose) {
#pragma unroll
    for (int u = 0; u < CC * CC / 4 / NT; u++) {
        const int e = 4 * (threadIdx.x + u * NT), r = e >> 6, c0 = e & 63;
        const float x[4] = {m.r[u].x, m.r[u].y, m.r[u].z, m.r[u].w};
#pragma unroll
        for (int q = 0; q < 4; q++) dst[transpose ? (c0 + q) * R4 + r : r * R4 + c0 + q] = gdn::tf32r_if<SPLIT>(x[q]);
    }
}
/* a c x ld tile rounded to tf32 in place (without SPLIT) */
template <bool SPLIT> __device__ __forceinline__ void round_tile(float *X, int n) {
    if (!SPLIT)
        for (int e = threadIdx.x; e < n; e += NT) X[e] = gdn::tf32r(X[e]);
}

/* the chunk's q rows (the block's columns) raw into a staging area by
 * cp.async during the V walk (f16 with the K split: after it), 16-byte
 * pieces, rows past c zero-filled, then into Qs at the K side:
 * times the saved rstd, rounded to tf32 without SPLIT, zero past K. For
 * bf16 / f16 with 16-byte rows (q_stage_ok); else load_qk there. */
template <bool SPLIT, int KH> struct QFetch {
    static constexpr int PR = KH / 8, NP = CC * PR / NT;   /* pieces per row (at KH), per thread */
    float rs = 1.f;                                       /* thread t < CC: token t's rstd */
    /* columns [ko, ko + kb) of the rows (kb < 0: all of K) */
    __device__ __forceinline__ void issue(const BwdArgs &p, int64_t row0, int c, int h, uint16_t *stage, int ko = 0, int kb = -1) {
        const int pr = (kb < 0 ? p.K : kb) / 8;
#pragma unroll
        for (int u = 0; u < NP; u++) {
            const int e = threadIdx.x + u * NT, t = e / PR, q = e % PR;
            if (q < pr) {
                const bool in = t < c;
                const uint16_t *src = static_cast<const uint16_t *>(p.q) + ((row0 + (in ? t : 0)) * p.H + h) * (int64_t)p.K + ko + 8 * q;
                gdn::cp16(stage + t * KH + 8 * q, src, in);
            }
        }
        gdn::cp_commit();
        if ((p.flags & GDN_QK_L2NORM) && threadIdx.x < c) rs = p.rstd_q[(row0 + threadIdx.x) * p.H + h];
    }
    /* after cp_wait_all and a barrier; ends with a barrier */
    __device__ __forceinline__ void commit(const BwdArgs &p, const uint16_t *stage, float *Qs, int ld, float *rsq, int kb = -1) const {
        if (threadIdx.x < CC) rsq[threadIdx.x] = rs;
        __syncthreads();
        const int pr = (kb < 0 ? p.K : kb) / 8;
#pragma unroll
        for (int u = 0; u < NP; u++) {
            const int e = threadIdx.x + u * NT, t = e / PR, q = e % PR;
            float *d = Qs + t * ld + 8 * q;
            if (q < pr) {
                const uint4 w = *reinterpret_cast<const uint4 *>(stage + t * KH + 8 * q);
                const uint32_t x[4] = {w.x, w.y, w.z, w.w};
                const float r = rsq[t];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float a, b;
                    if (p.dt == 1) { a = __uint_as_float(x[i] << 16); b = __uint_as_float(x[i] & 0xffff0000u); }
                    else { a = __half2float(__ushort_as_half((unsigned short)(x[i] & 0xffffu))); b = __half2float(__ushort_as_half((unsigned short)(x[i] >> 16))); }
                    d[2 * i] = gdn::tf32r_if<SPLIT>(a * r);
                    d[2 * i + 1] = gdn::tf32r_if<SPLIT>(b * r);
                }
            } else {
#pragma unroll
                for (int i = 0; i < 8; i++) d[i] = 0.f;
            }
        }
        __syncthreads();
    }
};
__device__ __forceinline__ bool q_stage_ok(const BwdArgs &p) { return p.dt != 0 && (p.K & 7) == 0 && rows16_ok(p.q, p.dt, p.K, 0, p.K); }

/* ---- the V walk on wgmma (bf16 or f16, K = 128, V % 64 == 0; vside_wg) ----
 * The same sums as the walk of local_kernel, with the chunk's tiles as bf16
 * operands of wgmma from shared memory: k, v, dO raw (exact); X, U, dU as
 * hi + lo halves; S0 and dS as hi + lo in the sums over V, their hi halves
 * alone in X' and dU'; Tm and P rounded to bf16 (the gradients' error /
 * bound margins with and without each rounding: bench/NOTES.md v4.7). f16
 * inputs the same in f16 (cfwd::f16_hilo: the computed operands as f16
 * hi + lo too, in power-of-two scales: S0, dS the block's a panel, X (U)
 * and dU their warpgroup's; pow2_for), but S0 and dS one f16 operand in
 * the sums too (11 bits in the panel's scale; bf16's 8 bits alone doubled
 * the error at K = 256: bench/NOTES.md v5.56).
 * Each panel of 64 columns:
 *   X' = K S0 (warpgroup 0) and dU' = K dS (warpgroup 1) at once; then
 *   X = beta v - b X',  dU = (ek rk) dU' + P^T dO   (stored as hi + lo)
 *   U = Tm X (warpgroup 0; into X's place), dBv = Tm^T dU (warpgroup 1: dv, dbeta)
 *   dKd += U dS^T, Xq += dO S0^T, dWk += dU S0^T (c x K), dP += dO U^T, dTm += dU v^T (c x c)
 * Warpgroup w sums the columns local_kernel's warps 4w..4w+3 own (K
 * columns 64w.., c x c columns 32w..), so the accumulators land in the
 * registers of the K side as its mma.sync tiles would (the m64 wgmma
 * accumulator is the m16n8 tile layout, warp by warp). Every operand is a
 * 64-element-wide block of 128-byte rows in the 128-byte swizzle; the sums
 * over V read them K-major, the sums over K and c MN-major (transposed). */
using cfwd::desc_off;
using cfwd::stsm4;
using cfwd::swz;
using cfwd::vdesc;
using cfwd::wss32;
using cfwd::wss64;
constexpr int WVP = 64;   /* panel columns */
struct VS {               /* byte offsets from a 1024-byte aligned base */
    static constexpr int Kr = 0;                   /* k raw: [cols 0-63][cols 64-127], 64 rows each */
    static constexpr int Th = 16384;               /* Tm rows t (bf16) */
    static constexpr int Ph = 24576;               /* P rows s (query), as stored in the record (bf16) */
    static constexpr int S0h = 32768, S0l = 49152, dSh = 65536, dSl = 81920;   /* 128 rows (k) of the panel */
    static constexpr int Vr = 98304, Or = 106496;   /* v, dO raw: the panel's columns, rows t */
    static constexpr int Xh = 114688, Xl = 122880;  /* X, then U */
    static constexpr int dUh = 131072, dUl = 139264;
    static constexpr int sc = 147456;               /* xs = beta exp(gc) rk, us = ek rk, rk */
    static constexpr int red = sc + 3 * CC * 4;     /* f16: the warps' largest |S0|, |dS|, |X|, |dU| (8 each) */
    static constexpr int bytes = red + 32 * 4;
};
/* WM: the 16-bit type's routines (cfwd::mma_traits<__nv_bfloat16> or cfwd::f16_hilo) */
/* a warpgroup's 64 x 64 accumulator as hi + lo rows (t, 64 columns) at hi, lo */
template <typename WM> __device__ __forceinline__ void store_hilo(const float *x, char *hi, char *lo) {
    cfwd::acc_swz_hilo<WM>(x, hi, lo, (int)threadIdx.x);
}
/* x = K B for a panel B (128 rows of k, 64 columns) at bh (its bf16 hi
 * half; MN-major), K raw: eight k16 steps */
template <typename WM> __device__ __forceinline__ void k_times(float *x, const char *vb, int bh) {
    const uint64_t d = vdesc(vb);
    cfwd::wg_fence();
#pragma unroll
    for (int kk = 0; kk < 8; kk++)
        wss64<0, 1, WM::bf>(x, desc_off(d, VS::Kr + (kk >> 2) * 8192 + (kk & 3) * 32), desc_off(d, bh + kk * 2048), kk);
    cfwd::wg_commit();
    cfwd::wg_wait<0>();
}
/* x = Tm B (TT = 0) or Tm^T B (TT = 1) for a 64 x 64 block B at bh, bl (hi,
 * lo; MN-major: rows are k), Tm as bf16: two products over four k16 steps */
template <typename WM, int TT> __device__ __forceinline__ void tm_times(float *x, const char *vb, int bh, int bl) {
    constexpr int as = TT ? 2048 : 32;   /* Tm's k step: rows (transposed) or 32 bytes along its rows */
    const uint64_t d = vdesc(vb);
    cfwd::wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        const uint64_t th = desc_off(d, VS::Th + kk * as), b = desc_off(d, bh + kk * 2048);
        wss64<TT, 1, WM::bf>(x, th, b, kk);
        wss64<TT, 1, WM::bf>(x, th, desc_off(d, bl + kk * 2048), 1);
    }
    cfwd::wg_commit();
    cfwd::wg_wait<0>();
}
/* four fp32 values as hi, lo 16-bit halves (8 bytes each) */
template <typename WM> __device__ __forceinline__ void put_hilo4(char *hi, char *lo, float4 v) {
    const uint32_t h0 = WM::pack(v.x, v.y), h1 = WM::pack(v.z, v.w);
    *reinterpret_cast<uint2 *>(hi) = make_uint2(h0, h1);
    *reinterpret_cast<uint2 *>(lo) = make_uint2(WM::pack(v.x - WM::lo(h0), v.y - WM::hi(h0)), WM::pack(v.z - WM::lo(h1), v.w - WM::hi(h1)));
}
/* four fp32 values rounded to the 16-bit type (8 bytes) */
template <typename WM> __device__ __forceinline__ void put_bf4(char *hi, float4 v) {
    *reinterpret_cast<uint2 *>(hi) = make_uint2(WM::pack(v.x, v.y), WM::pack(v.z, v.w));
}

/* ---- the K split (KS): an item's two blocks (cluster ranks 2 g, 2 g + 1 for
 * the G value heads of a q/k head), block r holding
 * columns [128 r, 128 r + 128) of K (its rows of S0 and dS, its columns of
 * k, q and of every c x K sum); each sum over K (X' = K S0 and dU' = K dS
 * a panel, the row dots, dWk Bk^T, K K^T, S0 . dS) is the two blocks'
 * partials added as own + partner's, the same bits in both. The exchanges
 * are ordered by the cluster barrier (arrive publishing the shared memory,
 * wait with acquire; ks_* in chunk_bwd.cuh), each buffer written again only
 * after a barrier the partner reaches once it has read it. ---- */

/* the V walk of one item: the sums into aKd, aXq, aWk (c x K) and aP, aTm
 * (c x c), dv stored, dBv . v added to dbt, S0 . dS to tot. gam, bet, ek set
 * by this thread for its token (t < CC); vb: VS::bytes of shared memory,
 * 1024-byte aligned. Every thread calls it; it starts and ends without a
 * barrier (the caller's). KS (K = 256): the block's half kh of K (its k
 * columns, S0 and dS rows), X' and dU' summed with the partner's through kx
 * (32 KB), the panels' dv stored by the two blocks in turn; the caller waits
 * out the last exchange (ks_wait). */
template <typename WM, bool KS, typename AccT>
__device__ __forceinline__ void vside_wg(const BwdArgs &p, int64_t row0, int c, int j, int h, const float *rec, const float *S0g,
                                         const float *dSg, const float *gam, const float *bet, const float *ek, float *dbt, char *vb,
                                         AccT &aKd, AccT &aXq, AccT &aWk, float (&aP)[4][4], float (&aTm)[4][4], float &tot, int kh,
                                         float *kx, char *tail) {
    const int tid = threadIdx.x, lane = tid & 31, w = __shfl_sync(0xffffffffu, tid >> 5, 0), cg = w >> 2, wl = w & 3;
    const int g = lane >> 2, tq = lane & 3, V = p.V;
    float *xs = reinterpret_cast<float *>(vb + VS::sc), *us = xs + CC, *rks = us + CC, *red = reinterpret_cast<float *>(vb + VS::red);
    constexpr bool SC = !WM::bf;   /* f16: the computed operands in power-of-two scales (pow2_for) */
    /* PF (f16, K = 256): each panel's fp32 S0 and dS rows by cp.async one panel ahead, into four
     * 16 KB slots of 64 rows (S0l and dSl, which f16 leaves free; past the exchange's kx; the
     * tail past the block's arrays): each thread fetches the 16 bytes it reads later, so its
     * own wait_group orders them. Else the rows are loaded where used, on the chain */
    constexpr bool PF = SC && KS;
    char *const slot[4] = {vb + VS::S0l, vb + VS::dSl, reinterpret_cast<char *>(kx) + 32 * NT * 4, tail};
    auto prefetch = [&](int v0) {   /* panel v0's rows into the slots, as one group (empty past the last panel) */
        if (v0 < V)
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int e = tid + u * NT, i = e >> 4, q = e & 15, at = (e & 1023) * 16;
                gdn::cp16(slot[u >> 2] + at, S0g + (int64_t)i * V + v0 + 4 * q, true);
                gdn::cp16(slot[2 + (u >> 2)] + at, dSg + (int64_t)i * V + v0 + 4 * q, true);
            }
        gdn::cp_commit();
    };
    if constexpr (PF) prefetch(0);
    /* k rows raw by cp.async (rows past c zero), Tm and P as bf16, the row scales */
    for (int e = tid; e < CC * 16; e += NT) {
        const int r = e >> 4, c16 = e & 15;
        const bool in = r < c;
        const __nv_bfloat16 *src =
            static_cast<const __nv_bfloat16 *>(p.k) + ((row0 + (in ? r : 0)) * p.H + h) * (int64_t)p.K + 128 * kh + c16 * 8;
        gdn::cp16(vb + VS::Kr + (c16 >> 3) * 8192 + swz(r, (c16 & 7) * 8), src, in);
    }
    gdn::cp_commit();
    {
        Mat64 mt, mp;
        mt.issue(rec + R_TM);
        mp.issue(rec + R_P);
#pragma unroll
        for (int u = 0; u < CC * CC / 4 / NT; u++) {
            const int e = 4 * (tid + u * NT), r = e >> 6, c0 = e & 63;
            put_bf4<WM>(vb + VS::Th + swz(r, c0), mt.r[u]);
            put_bf4<WM>(vb + VS::Ph + swz(r, c0), mp.r[u]);
        }
    }
    if (tid < CC) {
        const float rk = tid < c ? ((p.flags & GDN_QK_L2NORM) ? p.rstd_k[(row0 + tid) * p.H + h] : 1.f) : 0.f;
        xs[tid] = bet[tid] * gam[tid] * rk;
        us[tid] = ek[tid] * rk;
        rks[tid] = rk;
    }
    float db0 = 0.f, db1 = 0.f;   /* warpgroup 1: dBv . v of rows 16 wl + g, + 8 */
    const int t0 = 16 * wl + g, t1 = t0 + 8;
    for (int v0 = 0; v0 < V; v0 += WVP) {
        __syncthreads();   /* the last panel's operands are no longer read */
        for (int e = tid; e < 2 * CC * 8; e += NT) {   /* v and dO rows, the panel's columns */
            const int m = e >> 9, r = (e >> 3) & 63, ch = e & 7;
            const bool in = r < c;
            const __nv_bfloat16 *src = static_cast<const __nv_bfloat16 *>(m ? p.dout : p.v) + ((row0 + (in ? r : 0)) * p.HV + j) * (int64_t)V +
                                       v0 + ch * 8;
            gdn::cp16(vb + (m ? VS::Or : VS::Vr) + swz(r, ch * 8), src, in);
        }
        gdn::cp_commit();
        float sS0 = 1.f, sdS = 1.f;   /* f16: the panel's S0 and dS scales (powers of two; bf16: 1) */
        {   /* S0 and dS rows of the panel as hi + lo (f16: hi); the sum of S0 dS */
            float4 a[8], b[8];
            if constexpr (PF) {
                asm volatile("cp.async.wait_group 1;" ::: "memory");   /* all but v and dO's: this panel's rows */
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const int at = ((tid + u * NT) & 1023) * 16;
                    a[u] = *reinterpret_cast<const float4 *>(slot[u >> 2] + at);
                    b[u] = *reinterpret_cast<const float4 *>(slot[2 + (u >> 2)] + at);
                }
                asm volatile("" ::: "memory");   /* the reads above before the copies below (cp16 has no memory clobber) */
                prefetch(v0 + WVP);   /* into the 16 bytes this thread has just read */
            } else
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const int e = tid + u * NT, i = e >> 4, q = e & 15;
                    a[u] = *reinterpret_cast<const float4 *>(S0g + (int64_t)i * V + v0 + 4 * q);
                    b[u] = *reinterpret_cast<const float4 *>(dSg + (int64_t)i * V + v0 + 4 * q);
                }
            if constexpr (SC) {   /* the block's largest |S0|, |dS| of the panel first */
                float ma = 0.f, mb = 0.f;
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    tot = fmaf(a[u].x, b[u].x, fmaf(a[u].y, b[u].y, fmaf(a[u].z, b[u].z, fmaf(a[u].w, b[u].w, tot))));
                    ma = fmaxf(ma, fmaxf(fmaxf(fabsf(a[u].x), fabsf(a[u].y)), fmaxf(fabsf(a[u].z), fabsf(a[u].w))));
                    mb = fmaxf(mb, fmaxf(fmaxf(fabsf(b[u].x), fabsf(b[u].y)), fmaxf(fabsf(b[u].z), fabsf(b[u].w))));
                }
                ma = warp_max(ma);
                mb = warp_max(mb);
                if (lane == 0) { red[w] = ma; red[8 + w] = mb; }
                __syncthreads();
                ma = mb = 0.f;
#pragma unroll
                for (int x = 0; x < 8; x++) { ma = fmaxf(ma, red[x]); mb = fmaxf(mb, red[8 + x]); }
                sS0 = pow2_for(ma);
                sdS = pow2_for(mb);
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const int e = tid + u * NT, i = e >> 4, q = e & 15, at = swz(i, 4 * q);
                    put_bf4<WM>(vb + VS::S0h + at, make_float4(a[u].x * sS0, a[u].y * sS0, a[u].z * sS0, a[u].w * sS0));
                    put_bf4<WM>(vb + VS::dSh + at, make_float4(b[u].x * sdS, b[u].y * sdS, b[u].z * sdS, b[u].w * sdS));
                }
            } else
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const int e = tid + u * NT, i = e >> 4, q = e & 15, at = swz(i, 4 * q);
                    tot = fmaf(a[u].x, b[u].x, fmaf(a[u].y, b[u].y, fmaf(a[u].z, b[u].z, fmaf(a[u].w, b[u].w, tot))));
                    put_hilo4<WM>(vb + VS::S0h + at, vb + VS::S0l + at, a[u]);
                    put_hilo4<WM>(vb + VS::dSh + at, vb + VS::dSl + at, b[u]);
                }
        }
        if constexpr (PF) asm volatile("cp.async.wait_group 1;" ::: "memory");   /* v and dO's (the next panel's rows in flight) */
        else gdn::cp_wait_all();
        cfwd::fence_async_smem();
        __syncthreads();
        float x[32];
        k_times<WM>(x, vb, cg == 0 ? VS::S0h : VS::dSh);   /* X' = K S0, dU' = K dS */
        if constexpr (SC) mul_all<32>(x, 1.f / (cg == 0 ? sS0 : sdS));
        if constexpr (KS) {   /* summed over both halves of K */
            if (v0 > 0) ks_wait();   /* the partner has read the last panel's */
            ks_put<32>(kx, x);
            ks_sync();
            ks_add<32>(ks_peer(kx), x);
            ks_arrive();
        }
        if (cg == 0) {   /* X = beta v - xs K S0 */
#pragma unroll
            for (int a = 0; a < 8; a++)
#pragma unroll
                for (int hr = 0; hr < 2; hr++) {
                    const int t = hr ? t1 : t0;
                    const uint32_t vv = *reinterpret_cast<const uint32_t *>(vb + VS::Vr + swz(t, 8 * a + 2 * tq));
                    x[4 * a + 2 * hr] = bet[t] * WM::lo(vv) - xs[t] * x[4 * a + 2 * hr];
                    x[4 * a + 2 * hr + 1] = bet[t] * WM::hi(vv) - xs[t] * x[4 * a + 2 * hr + 1];
                }
            if constexpr (!SC) store_hilo<WM>(x, vb + VS::Xh, vb + VS::Xl);
        } else {   /* dU = us K dS + P^T dO */
            const float s0 = us[t0], s1 = us[t1];
#pragma unroll
            for (int a = 0; a < 8; a++) { x[4 * a] *= s0; x[4 * a + 1] *= s0; x[4 * a + 2] *= s1; x[4 * a + 3] *= s1; }
            const uint64_t d = vdesc(vb);
            cfwd::wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                wss64<1, 1, WM::bf>(x, desc_off(d, VS::Ph + kk * 2048), desc_off(d, VS::Or + kk * 2048), 1);
            }
            cfwd::wg_commit();
            cfwd::wg_wait<0>();
            if constexpr (!SC) store_hilo<WM>(x, vb + VS::dUh, vb + VS::dUl);
        }
        float sX = 1.f, sdU = 1.f;   /* f16: X's (then U's) and dU's scales */
        if constexpr (SC) {   /* each warpgroup's largest |X|, |dU| */
            float m = 0.f;
#pragma unroll
            for (int i = 0; i < 32; i++) m = fmaxf(m, fabsf(x[i]));
            m = warp_max(m);
            if (lane == 0) red[16 + w] = m;
            __syncthreads();
            float mx = 0.f, mu = 0.f;
#pragma unroll
            for (int i = 0; i < 4; i++) { mx = fmaxf(mx, red[16 + i]); mu = fmaxf(mu, red[20 + i]); }
            sX = pow2_for(mx);
            sdU = pow2_for(mu);
            mul_all<32>(x, cg == 0 ? sX : sdU);
            store_hilo<WM>(x, vb + (cg == 0 ? VS::Xh : VS::dUh), vb + (cg == 0 ? VS::Xl : VS::dUl));
        }
        cfwd::fence_async_smem();
        __syncthreads();
        if (cg == 0) {   /* U = Tm X, into X's place (only this warpgroup reads X) */
            tm_times<WM, 0>(x, vb, VS::Xh, VS::Xl);
            store_hilo<WM>(x, vb + VS::Xh, vb + VS::Xl);
        } else {   /* dBv = Tm^T dU: dv = beta dBv; dbeta += dBv . v */
            tm_times<WM, 1>(x, vb, VS::dUh, VS::dUl);
            if constexpr (SC) mul_all<32>(x, 1.f / sdU);
#pragma unroll
            for (int a = 0; a < 8; a++)
#pragma unroll
                for (int hr = 0; hr < 2; hr++) {
                    const int t = hr ? t1 : t0, n = 8 * a + 2 * tq;
                    if (t < c) {
                        const float x0 = x[4 * a + 2 * hr], x1 = x[4 * a + 2 * hr + 1];
                        const int64_t at = ((row0 + t) * p.HV + j) * (int64_t)V + v0 + n;
                        if (!KS || ((v0 / WVP) & 1) == kh)
                            *reinterpret_cast<uint32_t *>(static_cast<__nv_bfloat16 *>(p.dv) + at) = WM::pack(bet[t] * x0, bet[t] * x1);
                        const uint32_t vv = *reinterpret_cast<const uint32_t *>(vb + VS::Vr + swz(t, n));
                        const float d = fmaf(x0, WM::lo(vv), x1 * WM::hi(vv));
                        if (hr) db1 += d; else db0 += d;
                    }
                }
        }
        cfwd::fence_async_smem();
        __syncthreads();
        /* the sums over the panel's columns (k = v); f16: the accumulators in the operands' scales meanwhile */
        if constexpr (SC) {
            mul_all<32>(&aKd[0][0][0], sX * sdS);
            mul_all<32>(&aXq[0][0][0], sS0);
            mul_all<32>(&aWk[0][0][0], sdU * sS0);
            mul_all<16>(&aP[0][0], sX);
            mul_all<16>(&aTm[0][0], sdU);
        }
        const uint64_t d = vdesc(vb);
        cfwd::wg_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            const uint64_t uh = desc_off(d, VS::Xh + kk * 32), ul = desc_off(d, VS::Xl + kk * 32);
            const uint64_t oh = desc_off(d, VS::Or + kk * 32);
            const uint64_t duh = desc_off(d, VS::dUh + kk * 32), dul = desc_off(d, VS::dUl + kk * 32);
            const uint64_t sh = desc_off(d, VS::S0h + cg * 8192 + kk * 32), sl = desc_off(d, VS::S0l + cg * 8192 + kk * 32);
            const uint64_t dh = desc_off(d, VS::dSh + cg * 8192 + kk * 32), dl = desc_off(d, VS::dSl + cg * 8192 + kk * 32);
            wss64<0, 0, WM::bf>(&aKd[0][0][0], uh, dh, 1);
            if constexpr (!SC) wss64<0, 0, WM::bf>(&aKd[0][0][0], uh, dl, 1);
            wss64<0, 0, WM::bf>(&aKd[0][0][0], ul, dh, 1);
            wss64<0, 0, WM::bf>(&aXq[0][0][0], oh, sh, 1);
            if constexpr (!SC) wss64<0, 0, WM::bf>(&aXq[0][0][0], oh, sl, 1);
            wss64<0, 0, WM::bf>(&aWk[0][0][0], duh, sh, 1);
            if constexpr (!SC) wss64<0, 0, WM::bf>(&aWk[0][0][0], duh, sl, 1);
            wss64<0, 0, WM::bf>(&aWk[0][0][0], dul, sh, 1);
            const uint64_t ush = desc_off(d, VS::Xh + cg * 4096 + kk * 32), usl = desc_off(d, VS::Xl + cg * 4096 + kk * 32);
            const uint64_t vr = desc_off(d, VS::Vr + cg * 4096 + kk * 32);
            wss32<0, 0, WM::bf>(&aP[0][0], oh, ush, 1);
            wss32<0, 0, WM::bf>(&aP[0][0], oh, usl, 1);
            wss32<0, 0, WM::bf>(&aTm[0][0], duh, vr, 1);
            wss32<0, 0, WM::bf>(&aTm[0][0], dul, vr, 1);
        }
        cfwd::wg_commit();
        cfwd::wg_wait<0>();
        if constexpr (SC) {
            mul_all<32>(&aKd[0][0][0], 1.f / (sX * sdS));
            mul_all<32>(&aXq[0][0][0], 1.f / sS0);
            mul_all<32>(&aWk[0][0][0], 1.f / (sdU * sS0));
            mul_all<16>(&aP[0][0], 1.f / sX);
            mul_all<16>(&aTm[0][0], 1.f / sdU);
        }
    }
    if (cg == 1) {   /* dbeta: the quad's columns, one writer per row */
        db0 += __shfl_xor_sync(0xffffffffu, db0, 1);
        db0 += __shfl_xor_sync(0xffffffffu, db0, 2);
        db1 += __shfl_xor_sync(0xffffffffu, db1, 1);
        db1 += __shfl_xor_sync(0xffffffffu, db1, 2);
        if (tq == 0) {
            if (t0 < c) dbt[t0] += db0;
            if (t1 < c) dbt[t1] += db1;
        }
    }
}

/* dq, dk of the cluster's (slot, q/k head h) with the G value heads' dQc, dKc
 * in their blocks' shared memory (at dQs, dKs of each, row stride ld): block
 * rank r takes rows [r per, (r + 1) per), sums the G blocks' rows in rank
 * order from 0 (fp32, as grp_qk_kernel) and stores dx = r (dx^ - x^ (x^.dx^))
 * (the L2 norm chain; dx^ without it). A warp takes RB rows at a time, PER
 * columns a lane, all of a round's loads issued before any is used: the
 * q, k rows load as raw words free of branches (B16: bf16 / f16, converted
 * by the dtype where used; else f32), one copy of the code for both 16-bit
 * types (the kernel's code is streamed from L2 once an item: its size is
 * time). Every block of the cluster calls it after a cluster barrier that
 * published the partials. */
template <bool B16> struct QKRow;
template <> struct QKRow<true> {
    using T = unsigned short;
    static __device__ __forceinline__ float f(T x, int dt) {
        return dt == 1 ? __uint_as_float((uint32_t)x << 16) : __half2float(__ushort_as_half(x));
    }
    static __device__ __forceinline__ T to(float v, int dt) {
        return dt == 1 ? __bfloat16_as_ushort(__float2bfloat16_rn(v)) : __half_as_ushort(__float2half_rn(v));
    }
};
template <> struct QKRow<false> {
    using T = float;
    static __device__ __forceinline__ float f(T x, int) { return x; }
    static __device__ __forceinline__ T to(float v, int) { return v; }
};
template <int KH, bool B16, bool KS = false>
__device__ __forceinline__ void cluster_qk_store(const BwdArgs &p, int64_t row0, int c, int h, const float *dQs, const float *dKs, int ld) {
    namespace cg = cooperative_groups;
    using R = QKRow<B16>;
    using T = typename R::T;
    /* KS: blocks 2 g and 2 g + 1 hold columns [0, KH) and [KH, 2 KH) of value head g's sums */
    constexpr int PER = (KS ? 2 * KH : KH) / 32, RB = KS ? 2 : 4;
    const cg::cluster_group cl = cg::this_cluster();
    const int nb = (int)cl.num_blocks(), per = (c + nb - 1) / nb, t0 = (int)cl.block_rank() * per;
    const int t1 = t0 + per < c ? t0 + per : c, K = p.K, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, i0 = lane * PER;
    const bool l2 = (p.flags & GDN_QK_L2NORM) != 0;
    for (int tb = t0 + warp * RB; tb < t1; tb += (NT / 32) * RB) {
        /* [0]: q, [1]: k; the rows kept raw until the sums are in, so their
         * loads stay in flight through the distributed reads */
        float a[2][RB][PER], rs[2][RB];
        T xr[2][RB][PER];
#pragma unroll
        for (int qk = 0; qk < 2; qk++)
#pragma unroll
            for (int r = 0; r < RB; r++) {
                const int64_t row = row0 + tb + r;
                const bool on = l2 && tb + r < t1;
                rs[qk][r] = on ? (qk ? p.rstd_k : p.rstd_q)[row * p.H + h] : 1.f;
                const T *x = static_cast<const T *>(qk ? p.k : p.q) + (row * p.H + h) * K + i0;
#pragma unroll
                for (int u = 0; u < PER; u++) xr[qk][r][u] = on && i0 + u < K ? x[u] : T(0);
#pragma unroll
                for (int u = 0; u < PER; u++) a[qk][r][u] = 0.f;
            }
        /* rows past t1 are read too (within the block's shared memory) and never used: all of a block's loads in flight at once */
        for (int b = 0; b < (KS ? nb / 2 : nb); b++) {
            float y[2][RB][PER];
#pragma unroll
            for (int qk = 0; qk < 2; qk++) {
                const float *src = cl.map_shared_rank(qk ? dKs : dQs, KS ? 2 * b + i0 / KH : b) + tb * ld + (KS ? i0 % KH : i0);
#pragma unroll
                for (int r = 0; r < RB; r++) {
                    if constexpr (PER == 8) {
                        const float4 v = *reinterpret_cast<const float4 *>(src + r * ld), w = *reinterpret_cast<const float4 *>(src + r * ld + 4);
                        y[qk][r][0] = v.x; y[qk][r][1] = v.y; y[qk][r][2] = v.z; y[qk][r][3] = v.w;
                        y[qk][r][4] = w.x; y[qk][r][5] = w.y; y[qk][r][6] = w.z; y[qk][r][7] = w.w;
                    } else if constexpr (PER == 4) {
                        const float4 v = *reinterpret_cast<const float4 *>(src + r * ld);
                        y[qk][r][0] = v.x; y[qk][r][1] = v.y; y[qk][r][2] = v.z; y[qk][r][3] = v.w;
                    } else {
                        const float2 v = *reinterpret_cast<const float2 *>(src + r * ld);
                        y[qk][r][0] = v.x; y[qk][r][1] = v.y;
                    }
                }
            }
#pragma unroll
            for (int qk = 0; qk < 2; qk++)
#pragma unroll
                for (int r = 0; r < RB; r++)
#pragma unroll
                    for (int u = 0; u < PER; u++) a[qk][r][u] += y[qk][r][u];
        }
        /* the chain's dots, then their warp sums side by side */
        float xh[2][RB][PER], d[2][RB];
#pragma unroll
        for (int qk = 0; qk < 2; qk++)
#pragma unroll
            for (int r = 0; r < RB; r++) {
                d[qk][r] = 0.f;
#pragma unroll
                for (int u = 0; u < PER; u++) {
                    xh[qk][r][u] = R::f(xr[qk][r][u], p.dt) * rs[qk][r];
                    d[qk][r] = fmaf(xh[qk][r][u], a[qk][r][u], d[qk][r]);
                }
            }
        if (l2)
#pragma unroll
            for (int o = 16; o; o >>= 1)
#pragma unroll
                for (int qk = 0; qk < 2; qk++)
#pragma unroll
                    for (int r = 0; r < RB; r++) d[qk][r] += __shfl_xor_sync(0xffffffffu, d[qk][r], o);
#pragma unroll
        for (int qk = 0; qk < 2; qk++)
#pragma unroll
            for (int r = 0; r < RB; r++) {
                if (tb + r >= t1) continue;
                const int64_t row = row0 + tb + r, at = (row * p.H + h) * K + i0;
                T *y = static_cast<T *>(qk ? p.dk : p.dq) + at;
#pragma unroll
                for (int u = 0; u < PER; u++)
                    if (i0 + u < K) y[u] = R::to(l2 ? rs[qk][r] * (a[qk][r][u] - xh[qk][r][u] * d[qk][r]) : a[qk][r][u], p.dt);
            }
    }
}

/* gate_store's sums: double with 3xTF32 products, float with single tf32 ones */
template <bool SPLIT> using GateSum = typename std::conditional<SPLIT, double, float>::type;

/* WG: the V walk on wgmma (vside_wg; wg_of) for bf16 (1) or f16 (2), the K side as without.
 * KS: the K split above (KH = 128, 128 < K <= 256, G <= 4) */
template <bool SPLIT, int KH, int WG, bool KS = false>
__global__ void __launch_bounds__(NT, 1) local_kernel(BwdArgs p, Grp G) {
    using WM = std::conditional_t<WG == 2, cfwd::f16_hilo, cfwd::mma_traits<__nv_bfloat16>>;   /* WG's 16-bit type */
    using L = Lay<KH>;
    constexpr int LK = L::LK, NR = KH / 64;
    static_assert(!KS || KH == 128, "the K split: halves of 128 columns");
    extern __shared__ __align__(16) float sm[];
    const int kh = KS ? (int)(blockIdx.x & 1) : 0;                   /* the block's half of K (its rank in the cluster mod 2) */
    const int64_t bx = KS ? blockIdx.x >> 1 : blockIdx.x;            /* the item */
    int64_t slot, n = 0, ci = 0;   /* (sequence, chunk) where the state gradients are windowed */
    if (p.wn) {                    /* the window's items */
        if (!window_item(p, bx / p.HV, &n, &ci, &slot)) return;   /* the whole cluster: its blocks share the item */
    } else {
        slot = G.s0 + bx / p.HV;
    }
    const int j = (int)(bx % p.HV), h = j / p.G, c = p.slot_c[slot];
    if (c == 0) return;
    const int64_t row0 = p.slot_row0[slot];
    const float *rec = rec_at(p, n, slot, ci, j);
    /* K: the block's columns of K (from ko) */
    const int ko = KH * kh, K = KS ? (p.K - ko < KH ? p.K - ko : KH) : p.K, V = p.V, Kp = k8(K), tid = threadIdx.x, warp = tid >> 5,
              lane = tid & 31;
    const int wr = (warp & 3) * 16, wc = warp >> 2, kc0 = wc * (KH / 2), cc0 = wc * 32, pi0 = panel_i0();
    float *Kc = sm + L::Kc, *Tm = sm + L::Tm, *PT = sm + L::P;
    /* the two pairs of S0, dS panel buffers: pair b at S0b(b), dSb(b) */
    auto S0b = [&](int b) { return sm + (b ? L::S0q : L::S0p); };
    auto dSb = [&](int b) { return sm + (b ? L::dSq : L::dSp); };
    float *Vp = sm + L::Vp, *dOp = sm + L::dOp, *Xp = sm + L::Xp, *Up = sm + L::Up,
          *dUp = sm + L::dUp;
    float *XT = Xp;   /* X^T [VP][R4] in Xp's place until dBv */
    float *Qs = sm + L::Q, *dWk = sm + L::dWk, *dP = sm + L::dP, *dTm = sm + L::dTm, *tmp = sm + L::tmp, *Rg = sm + L::Rg;
    double *gcd = reinterpret_cast<double *>(sm + L::end);
    float *gam = reinterpret_cast<float *>(gcd + CC), *bet = gam + CC, *ek = bet + CC, *dgc = ek + CC, *dbt = dgc + CC,
          *row = dbt + CC, *rpa = row + CC, *rpb = rpa + 2 * CC, *red = rpb + 2 * CC, *gt = red + 32;
    const float *S0 = state_at(p, n, slot, ci, j) + (int64_t)ko * V, *dS = dstate_at(p, n, slot, ci, j) + (int64_t)ko * V;
    float *ksv = gt + GT_FLOATS, *kx = sm + L::Qstage;   /* KS: S0 . dS; the non-wgmma walk's panel partials (q not staged there) */
    BP_DECL;

    /* the chunk's k rows, Tm, P^T, the per-token scalars (all in flight
     * together), and the first panel's rows */
    /* q staged: without the K split past the walk's arrays (Qstage); with it (the walk on wgmma) in the
     * 16 KB past vside_wg's exchange (f16: after the walk, whose third prefetch slot it is) */
    const bool fetch = !WG && panel_fetch_ok(p), qstage = (!KS || WG) && q_stage_ok(p);
    PanelFetch<SPLIT, KH> pf;
    QFetch<SPLIT, KH> qf;
    char *const vb0 = reinterpret_cast<char *>(sm) + ((1024 - (saddr(sm) & 1023)) & 1023);   /* vside_wg's base */
    uint16_t *stage = reinterpret_cast<uint16_t *>(KS ? vb0 + (VS::bytes + 1023) / 1024 * 1024 + 32 * NT * 4 : reinterpret_cast<char *>(sm + L::Qstage));
    GateTok gk;   /* gate_store's inputs, fetched with the record's */
    if (WG) {   /* the k rows, Tm and P come in vside_wg, and again for the K side after it */
        RecTok r;
        r.issue(rec);
        gk.issue(p, rec, row0, c, j);
        if (qstage && !(KS && WG == 2)) qf.issue(p, row0, c, h, stage, ko, K);   /* in flight through the whole V walk (f16 KS: after it) */
        r.commit(gcd, gam, bet);
        gk.commit(gt);
    } else {
        Mat64 mt, mp;
        RecTok r;
        mt.issue(rec + R_TM);
        mp.issue(rec + R_P);
        r.issue(rec);
        gk.issue(p, rec, row0, c, j);
        if (qstage) qf.issue(p, row0, c, h, stage);   /* in flight through the whole V walk */
        if (fetch) pf.issue(p, K, S0, dS, row0, c, j, 0, S0b(0), dSb(0));
        load_qk(p, p.k, p.rstd_k, row0, c, h, Kc, LK, ko, K);
        commit_mat<SPLIT>(mt, Tm, false);
        commit_mat<SPLIT>(mp, PT, true);
        r.commit(gcd, gam, bet);
        gk.commit(gt);
    }
    if (fetch) {   /* rows of v, dO past c and of S0, dS from K on stay zero through the walk */
        for (int e = tid; e < (CC - c) * LP; e += NT) { Vp[c * LP + e] = 0.f; dOp[c * LP + e] = 0.f; }
        for (int e = tid; e < (KH - K) * LP; e += NT)
            for (int b = 0; b < 2; b++) { S0b(b)[K * LP + e] = 0.f; dSb(b)[K * LP + e] = 0.f; }
    }
    if (tid < CC) { dgc[tid] = 0.f; dbt[tid] = 0.f; }
    __syncthreads();
    if (!WG) round_tile<SPLIT>(Kc, CC * LK);
    if (tid < CC) ek[tid] = tid < c ? Ef(gcd, c - 1, tid) : 0.f;   /* exp(gc_last - gc_t) */
    BP(0);

    Acc<NR> aKd = {}, aXq = {}, aWk = {};
    float aP[4][4] = {}, aTm[4][4] = {};
    const bool cc_live = cc0 <= wr + 15;   /* the warp's c x c tile reaches the lower triangle */
    float tot = 0.f;                       /* sum of S0 * dS */

    if constexpr (WG) {
        static_assert(KH == 128 && VS::bytes + 1024 <= L::Qstage * 4, "vside_wg's operands end before q's staging area");
        static_assert(!KS || VS::bytes + 2048 + 32 * NT * 4 <= L::end * 4, "the K split's exchange after vside_wg's operands");
        char *vb = vb0;
        static_assert((VS::bytes + 1023) / 1024 * 1024 + 1023 + 32 * NT * 4 + 16384 <= L::end * 4,
                      "vside_wg's third prefetch slot (past kx, vb up to 1023 bytes past sm) before the block's arrays");
        vside_wg<WM, KS>(p, row0, c, j, h, rec, S0, dS, gam, bet, ek, dbt, vb, aKd, aXq, aWk, aP, aTm, tot, kh,
                         reinterpret_cast<float *>(vb + (VS::bytes + 1023) / 1024 * 1024),   /* KS: the panels' partials */
                         reinterpret_cast<char *>(sm + L::floats));                          /* f16 KS: its fourth slot */
        if (KS && WG == 2 && qstage) qf.issue(p, row0, c, h, stage, ko, K);   /* f16 KS: q where its third prefetch slot was */
        BP(1);
        /* the K side's k rows (times rk), Tm and P^T in fp32 from the operands
         * still in shared memory (Tm and P as the walk's bf16), read whole
         * before any is written over */
        __syncthreads();
        const float *rks = reinterpret_cast<const float *>(vb + VS::sc) + 2 * CC;
        float tv[CC * CC / NT], pv[CC * CC / NT], kv[CC * 128 / NT];
#pragma unroll
        for (int u = 0; u < CC * CC / 4 / NT; u++) {
            const int e = 4 * (tid + u * NT), r = e >> 6, c0 = e & 63, at = cfwd::swz(r, c0);
            const uint2 th = *reinterpret_cast<const uint2 *>(vb + VS::Th + at), ph = *reinterpret_cast<const uint2 *>(vb + VS::Ph + at);
            tv[4 * u] = WM::lo(th.x); tv[4 * u + 1] = WM::hi(th.x); tv[4 * u + 2] = WM::lo(th.y); tv[4 * u + 3] = WM::hi(th.y);
            pv[4 * u] = WM::lo(ph.x); pv[4 * u + 1] = WM::hi(ph.x); pv[4 * u + 2] = WM::lo(ph.y); pv[4 * u + 3] = WM::hi(ph.y);
        }
#pragma unroll
        for (int u = 0; u < CC * 128 / 4 / NT; u++) {
            const int e = tid + u * NT, r = e >> 5, col = 4 * (e & 31);
            const uint2 k4 = *reinterpret_cast<const uint2 *>(vb + VS::Kr + (col >> 6) * 8192 + cfwd::swz(r, col & 63));
            const float rk = rks[r];
            kv[4 * u] = WM::lo(k4.x) * rk; kv[4 * u + 1] = WM::hi(k4.x) * rk;
            kv[4 * u + 2] = WM::lo(k4.y) * rk; kv[4 * u + 3] = WM::hi(k4.y) * rk;
        }
        __syncthreads();
#pragma unroll
        for (int u = 0; u < CC * CC / 4 / NT; u++) {
            const int e = 4 * (tid + u * NT), r = e >> 6, c0 = e & 63;
#pragma unroll
            for (int q = 0; q < 4; q++) {
                Tm[r * R4 + c0 + q] = gdn::tf32r_if<SPLIT>(tv[4 * u + q]);
                PT[(c0 + q) * R4 + r] = gdn::tf32r_if<SPLIT>(pv[4 * u + q]);
            }
        }
#pragma unroll
        for (int u = 0; u < CC * 128 / 4 / NT; u++) {
            const int e = tid + u * NT, r = e >> 5, col = 4 * (e & 31);
            *reinterpret_cast<float4 *>(Kc + r * LK + col) = make_float4(gdn::tf32r_if<SPLIT>(kv[4 * u]), gdn::tf32r_if<SPLIT>(kv[4 * u + 1]),
                                                                         gdn::tf32r_if<SPLIT>(kv[4 * u + 2]), gdn::tf32r_if<SPLIT>(kv[4 * u + 3]));
        }
    } else {
    /* ---- the V walk ---- */
    for (int v0 = 0, pn = 0; v0 < V; v0 += VP, pn ^= 1) {
        float *S0p = S0b(pn), *dSp = dSb(pn);
        __syncthreads();   /* the previous panel's arrays are no longer read (and ek, Kc are set) */
        if (fetch) {
            tot += pf.commit(p, K, c, S0p, dSp, Vp, dOp);
            if (v0 + VP < V) pf.issue(p, K, S0, dS, row0, c, j, v0 + VP, S0b(pn ^ 1), dSb(pn ^ 1));   /* the next panel's */
        } else {
            load_panel<SPLIT, KH>(S0p, S0, K, V, v0);
            load_panel<SPLIT, KH>(dSp, dS, K, V, v0);
            load_rows_v(p, p.v, row0, c, j, v0, VP, Vp, LP);
            load_rows_v(p, p.dout, row0, c, j, v0, VP, dOp, LP);
        }
        __syncthreads();
        BP(1);
        if (!fetch)
            for (int e = tid; e < K * VP; e += NT) tot = fmaf(S0p[(e / VP) * LP + e % VP], dSp[(e / VP) * LP + e % VP], tot);
        {
            /* X = Bv - Bk S0 = beta v - beta exp(gc) K S0, stored transposed */
            float a[4][4] = {}, b[4][4] = {}, d[4][4] = {};
            panel_acc<SPLIT, false, true>(a, 0, KH, Kc, LK, S0p, LP);
            panel_acc<SPLIT, false, true>(d, 0, KH, Kc, LK, dSp, LP);
            if constexpr (KS) {   /* X' and dU' summed over both halves of K */
                if (v0 > 0) ks_wait();   /* the partner has read the last panel's */
                ks_put<8>(kx, &a[0][0]);   /* the panel tile's two n8 tiles */
                ks_put<8>(kx + 8 * NT, &d[0][0]);
                ks_sync();
                const float *px = ks_peer(kx);
                ks_add<8>(px, &a[0][0]);
                ks_add<8>(px + 8 * NT, &d[0][0]);
                ks_arrive();
            }
            panel_store(a, [&](int t, int v, float acc) {
                XT[v * R4 + t] = gdn::tf32r_if<SPLIT>(t < c ? bet[t] * Vp[t * LP + v] - (bet[t] * gam[t]) * acc : 0.f);
            });
            /* dU = P^T dO + diag(ek) K dS */
            panel_acc<SPLIT, false, true>(b, pi0, CC, PT, R4, dOp, LP);
#pragma unroll
            for (int q = 0; q < 4; q++)
#pragma unroll
                for (int r = 0; r < 4; r++) b[q][r] = fmaf(ek[pi0 + (lane >> 2) + (r >> 1) * 8], d[q][r], b[q][r]);
            panel_store(b, [&](int t, int v, float acc) { dUp[t * LP + v] = gdn::tf32r_if<SPLIT>(acc); });
        }
        __syncthreads();
        BP(2);
        {
            /* U = Tm X */
            float a[4][4] = {};
            panel_acc<SPLIT, false, false>(a, 0, pi0 + 16, Tm, R4, XT, R4);
            panel_store(a, [&](int t, int v, float acc) { Up[t * LP + v] = gdn::tf32r_if<SPLIT>(acc); });
        }
        __syncthreads();
        BP(3);
        /* the sums over V; dBv = Tm^T dU into Xp */
        acc_ck<SPLIT, false, false, NR>(aKd, wr, kc0, 0, VP, Up, LP, dSp, LP);
        acc_ck<SPLIT, false, false, NR>(aXq, wr, kc0, 0, VP, dOp, LP, S0p, LP);
        acc_ck<SPLIT, false, false, NR>(aWk, wr, kc0, 0, VP, dUp, LP, S0p, LP);
        if (cc_live) {
            gdn::warp_mma_s<SPLIT, false, false, 4>(aP, dOp, LP, Up, LP, wr, cc0, 0, VP);
            gdn::warp_mma_s<SPLIT, false, false, 4>(aTm, dUp, LP, Vp, LP, wr, cc0, 0, VP);   /* times beta_u at the end */
        }
        {
            float a[4][4] = {};
            panel_acc<SPLIT, true, true>(a, pi0, CC, Tm, R4, dUp, LP);
            panel_store(a, [&](int t, int v, float acc) { Xp[t * LP + v] = acc; });
        }
        __syncthreads();
        BP(4);
        /* dv = beta dBv (KS: the two blocks' panels alternate); dbeta gets dBv . v */
        if (!KS || ((v0 / VP) & 1) == kh)
        for (int e = tid; e < c * VP; e += NT) {
            const int t = e / VP, v = e % VP;
            if (v0 + v < V) gdn::st(p.dv, ((row0 + t) * p.HV + j) * (int64_t)V + v0 + v, bet[t] * Xp[t * LP + v], p.dt);
        }
        if (tid < c) {
            float d = 0.f;
            for (int v = 0; v < VP; v++) d = fmaf(Xp[tid * LP + v], Vp[tid * LP + v], d);
            dbt[tid] += d;
        }
        BP(5);
    }
    }
    if (KS) ks_wait();   /* the last panel's partials read */
    tot = gdn::block_sum(tot, red);
    __syncthreads();   /* the panel arrays are free: the K side's arrays take their place */
    BP(6);

    /* ---- the K side ---- */
    if (qstage) {
        gdn::cp_wait_all();
        qf.commit(p, stage, Qs, LK, row, K);   /* row: free until gate_store */
    } else {
        load_qk(p, p.q, p.rstd_q, row0, c, h, Qs, LK, ko, K);
    }
    BP(14);
    store_ck<NR>(aWk, wr, kc0, KH, [&](int t, int i, float x) { dWk[t * LK + i] = gdn::tf32r_if<SPLIT>(-x); });
    BP(17);
    gdn::warp_store(aTm, wr, cc0, 4, CC, CC, [&](int t, int u, float x) { dTm[t * R4 + u] = x * bet[u]; });
    BP(18);
    /* dP -> the pair terms Rg = dP * P and dP~ = scale E dP (lower), scale dP (diagonal) */
    gdn::warp_store(aP, wr, cc0, 4, CC, CC, [&](int t, int u, float x) {
        Rg[t * R4 + u] = u < t && t < c ? x * PT[u * R4 + t] : 0.f;
        dP[t * R4 + u] = gdn::tf32r_if<SPLIT>(u < t ? x * p.scale * Ef(gcd, t, u) : u == t ? x * p.scale : 0.f);
    });
    __syncthreads();
    BP(15);
    if (!SPLIT && !qstage) {
        round_tile<SPLIT>(Qs, CC * LK);
        __syncthreads();
    }
    BP(16);
    /* dgc_t += scale exp(gc_t) (q_t . Xq_t); the pairs (last, t) of S1's gate: Rg += E (k_t . dKd_t) */
    row_dots<NR>(aXq, Qs, LK, wr, kc0, rpb + wc * CC);
    row_dots<NR>(aKd, Kc, LK, wr, kc0, rpa + wc * CC);
    row_scale<NR>(aXq, wr, [&](int t) { return t < c ? p.scale * gam[t] : 0.f; });   /* dQc = scale exp(gc) Xq */
    row_scale<NR>(aKd, wr, [&](int t) { return ek[t]; });                               /* dKc = exp(gc_last - gc) dKd */
    if (KS) {
        if (tid == 0) ksv[0] = tot;
        ks_sync();   /* the row dots and S0 . dS of both halves */
    } else {
        __syncthreads();
    }
    BP(7);
    if (tid < c) {
        float qx = rpb[tid] + rpb[CC + tid], kd = rpa[tid] + rpa[CC + tid], st = tot;
        if (KS) {
            const float *pb = ks_peer(rpb), *pa = ks_peer(rpa);
            qx += pb[tid] + pb[CC + tid];
            kd += pa[tid] + pa[CC + tid];
            st += *ks_peer(ksv);
        }
        dgc[tid] += p.scale * gam[tid] * qx;
        if (tid < c - 1) Rg[(c - 1) * R4 + tid] += ek[tid] * kd;
        else dgc[tid] += gam[tid] * st;
    }
    /* dQc += dP~ K; dKc += dP~^T Q; dTm += dWk Bk^T, strictly lower */
    acc_ck<SPLIT, false, true, NR>(aXq, wr, kc0, 0, wr + 16, dP, R4, Kc, LK);
    acc_ck<SPLIT, true, true, NR>(aKd, wr, kc0, wr, CC, dP, R4, Qs, LK);
    {
        float a[4][4] = {};
        if (cc_live) gdn::warp_mma_s<SPLIT, false, false, 4>(a, dWk, LK, Kc, LK, wr, cc0, 0, Kp);
        if constexpr (KS) {   /* summed over both halves, through tmp's place (free until tmp) */
            ks_put<16>(tmp, &a[0][0]);
            ks_sync();
            ks_add<16>(ks_peer(tmp), &a[0][0]);
        }
        gdn::warp_store(a, wr, cc0, 4, CC, CC, [&](int t, int u, float x) {
            dTm[t * R4 + u] = u < t ? gdn::tf32r_if<SPLIT>(dTm[t * R4 + u] + x * (bet[u] * gam[u])) : 0.f;
        });
    }
    if (KS) ks_sync();   /* and the partner has read tmp's place */
    else __syncthreads();
    BP(8);
    /* dBk = Tm^T dWk (in aWk); tmp = dTm Tm^T */
    {
        Acc<NR> &dBk = aWk;
#pragma unroll
        for (int r = 0; r < NR; r++)
#pragma unroll
            for (int q = 0; q < 4; q++) dBk[r][q][0] = dBk[r][q][1] = dBk[r][q][2] = dBk[r][q][3] = 0.f;
        acc_ck<SPLIT, true, true, NR>(dBk, wr, kc0, wr, CC, Tm, R4, dWk, LK);
        float a[4][4] = {};
        gdn::warp_mma_s<SPLIT, false, false, 4>(a, dTm, R4, Tm, R4, wr, cc0, 0, wr + 16);
        gdn::warp_store(a, wr, cc0, 4, CC, CC, [&](int t, int u, float x) { tmp[t * R4 + u] = gdn::tf32r_if<SPLIT>(x); });
        /* Bk = diag(beta exp(gc)) K: dKc += beta exp(gc) dBk; (dBk . k) to dbeta and dgc */
        row_dots<NR>(dBk, Kc, LK, wr, kc0, rpa + wc * CC);
        row_axpy<NR>(aKd, dBk, wr, [&](int t) { return t < c ? bet[t] * gam[t] : 0.f; });
    }
    if (KS) ks_sync();   /* the row dots of both halves */
    else __syncthreads();
    BP(9);
    if (tid < c) {
        float kd = rpa[tid] + rpa[CC + tid];
        if (KS) {
            const float *pa = ks_peer(rpa);
            kd += pa[tid] + pa[CC + tid];
        }
        dbt[tid] += gam[tid] * kd;
        dgc[tid] += (bet[tid] * gam[tid]) * kd;
    }
    /* dA = -Tm^T tmp (strictly lower, rows < c) into dTm's place; KK = K K^T into dWk's */
    {
        float a[4][4] = {};
        gdn::warp_mma_s<SPLIT, true, true, 4>(a, Tm, R4, tmp, R4, wr, cc0, wr, CC);
        gdn::warp_store(a, wr, cc0, 4, CC, CC, [&](int t, int u, float x) { dTm[t * R4 + u] = u < t && t < c ? -x : 0.f; });
        float b[4][4] = {};
        if (cc_live) gdn::warp_mma_s<SPLIT, false, false, 4>(b, Kc, LK, Kc, LK, wr, cc0, 0, Kp);
        gdn::warp_store(b, wr, cc0, 4, CC, CC, [&](int t, int u, float x) { dWk[t * R4 + u] = x; });
    }
    if (KS) ks_sync();   /* K K^T of both halves (read in place by the partner until the cluster barrier before dq, dk) */
    else __syncthreads();
    BP(10);
    /* A_tu = beta_t E_tu KK_tu: dbeta, the pair terms, and dA becomes dKK */
    {
        float *dA = dTm, *KK = dWk;
        const float *KKp = KS ? ks_peer(KK) : KK;
        for (int t = warp; t < c; t += NT / 32) {
            float db = 0.f;
            for (int u = lane; u < t; u += 32) {
                const float E = dA[t * R4 + u] * Ef(gcd, t, u), kk = KS ? KK[t * R4 + u] + KKp[t * R4 + u] : KK[t * R4 + u];
                db = fmaf(E, kk, db);
                Rg[t * R4 + u] += E * bet[t] * kk;
                dA[t * R4 + u] = gdn::tf32r_if<SPLIT>(bet[t] * E);
            }
            db = gdn::warp_sum(db);
            if (lane == 0) dbt[t] += db;
        }
        __syncthreads();
        BP(11);
        /* dKc += dKK K + dKK^T K */
        acc_ck<SPLIT, false, true, NR>(aKd, wr, kc0, 0, wr + 16, dA, R4, Kc, LK);
        acc_ck<SPLIT, true, true, NR>(aKd, wr, kc0, wr, CC, dA, R4, Kc, LK);
    }
    /* dQc, dKc summed over the value heads: in the cluster (into Kc, Tm and
     * P's place, apart from gate_store's arrays), or through the scratch */
    if (KS || G.cl) {
        static_assert(2 * CC * LK <= L::A, "dQc and dKc fit before the K side's arrays");
        float *dQs = sm, *dKs = sm + CC * LK;
        __syncthreads();   /* Kc, Tm, P no longer read */
        store_pairs<NR>(aXq, wr, kc0, dQs, LK, KH);   /* whole tiles (zeros past K included) */
        store_pairs<NR>(aKd, wr, kc0, dKs, LK, KH);
        BP(2);
        ks_sync();   /* every block's partials written and published (shared memory alone: no GPU-scope membar) */
        BP(3);
        if (SPLIT && p.dt == 0) cluster_qk_store<KH, false, KS>(p, row0, c, h, dQs, dKs, LK);   /* f32 inputs */
        else cluster_qk_store<KH, true, KS>(p, row0, c, h, dQs, dKs, LK);
        BP(4);
        if (kh == 0)   /* KS: both blocks hold the same gate sums */
            gate_store<GateSum<SPLIT>>(p, slot, j, row0, c, gt, Rg, R4, dgc, dbt, row, reinterpret_cast<double(*)[CC + 1]>(sm + L::Q));
        BP(13);
        /* no block leaves, or writes the next chunk's partials, while another
         * reads its partials: the reads were used before this point, so the
         * arrive releases nothing */
        asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;" ::: "memory");
        BP(5);
    } else {
        float *w = G.scr + (int64_t)blockIdx.x * G.o.F;
        store_rows<NR>(aXq, wr, kc0, K, w + G.o.dQc);
        store_rows<NR>(aKd, wr, kc0, K, w + G.o.dKc);
        __syncthreads();   /* Q and dWk's space free for the prefix sums */
        BP(12);
        gate_store<GateSum<SPLIT>>(p, slot, j, row0, c, gt, Rg, R4, dgc, dbt, row, reinterpret_cast<double(*)[CC + 1]>(sm + L::Q));
        BP(13);
    }
    BP_PRINT(G.s0 == 0 && blockIdx.x == 0,
             "local item: start | panels: loads, X dU, U, sums dBv, dv | K: head, dP, dBk tmp, dA KK, pairs, dKc store, gate | "
             "head: load Q, stores, round | stores: dWk, dTm (with WG, panels is the whole walk over V; in a cluster 2-5 are: "
             "partials stored, cluster barrier, dq dk, last barrier)", 19, 1);
}

template <int KH> constexpr int local_smem() { return Lay<KH>::floats * (int)sizeof(float); }
/* the f16 K split's: vside_wg's fourth prefetch slot past the arrays */
constexpr int local_smem_pf() { return local_smem<128>() + 16384; }
static_assert(local_smem_pf() <= 227 * 1024 && local_smem<128>() % 16 == 0, "the f16 K split's prefetch slot fits");

}  // namespace

/* the items' dQc, dKc in the scratch */
Scr local_scr(int K) {
    Scr s = {};
    s.dQc = 0;
    s.dKc = (int64_t)CC * K;
    s.F = 2 * (int64_t)CC * K;
    return s;
}

/* the wgmma walk's instance (WG: the 16-bit type, 1 bf16, 2 f16) where the
 * call takes it (16-bit inputs, K = 128 a block, V in panels of
 * 64, aligned rows), else 0 */
static int wg_of(const BwdArgs &p, bool split, int kb) {
    return !split && (p.dt == 1 || p.dt == 2) && p.K == kb && p.V % WVP == 0 && al16(p.k) && al16(p.v) && al16(p.dout) && al16(p.dv)
               ? p.dt : 0;
}
template <bool SPLIT> cudaError_t LocalPass<SPLIT>::attr(int K, int G) {
    const bool ks = local_ks(K, G);
    if (!ks && k8(K) <= 64) return smem_attr(local_kernel<SPLIT, 64, 0>, local_smem<64>());
    cudaError_t e = ks ? smem_attr(local_kernel<SPLIT, 128, 0, true>, local_smem<128>()) : smem_attr(local_kernel<SPLIT, 128, 0>, local_smem<128>());
    if constexpr (!SPLIT)
        for (int wg = 1; wg <= 2 && e == cudaSuccess; wg++) {
            if (ks) e = wg == 1 ? smem_attr(local_kernel<SPLIT, 128, 1, true>, local_smem<128>()) : smem_attr(local_kernel<SPLIT, 128, 2, true>, local_smem_pf());
            else e = smem_attr(wg == 1 ? local_kernel<SPLIT, 128, 1> : local_kernel<SPLIT, 128, 2>, local_smem<128>());
        }
    return e;
}
/* one block per item, in clusters of G blocks where G.cl; with the K split
 * (ks) two blocks an item, the cluster */
template <typename Kern>
void launch_items(Kern k, const BwdArgs &p, const Grp &G, unsigned items, int smem, cudaStream_t st, bool ks = false) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    cfg.gridDim = dim3(ks ? 2 * items : items);
    cfg.blockDim = dim3(NT);
    cfg.dynamicSmemBytes = (size_t)smem;
    cfg.stream = st;
    if (G.cl || ks) {
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = ks ? 2u * (unsigned)p.G : (unsigned)p.G;
        at[0].val.clusterDim.y = at[0].val.clusterDim.z = 1;
        cfg.attrs = at;
        cfg.numAttrs = 1;
    }
    cudaLaunchKernelEx(&cfg, k, p, G);
}
template <bool SPLIT> void LocalPass<SPLIT>::launch(const BwdArgs &p, const Grp &G, int64_t nsl, cudaStream_t st) {
    const unsigned items = (unsigned)(nsl * p.HV);
    const int sm = local_smem<128>();
    if (local_ks(p.K, p.G)) {   /* the V walk on wgmma where both halves are whole (K = 256) */
        const int wg = wg_of(p, SPLIT, 256);
        if constexpr (!SPLIT) {
            if (wg == 1) return launch_items(local_kernel<SPLIT, 128, 1, true>, p, G, items, sm, st, true);
            if (wg == 2) return launch_items(local_kernel<SPLIT, 128, 2, true>, p, G, items, local_smem_pf(), st, true);
        }
        launch_items(local_kernel<SPLIT, 128, 0, true>, p, G, items, sm, st, true);
    } else if (k8(p.K) <= 64) {
        launch_items(local_kernel<SPLIT, 64, 0>, p, G, items, local_smem<64>(), st);
    } else {
        const int wg = wg_of(p, SPLIT, 128);
        if constexpr (!SPLIT) {
            if (wg == 1) return launch_items(local_kernel<SPLIT, 128, 1>, p, G, items, sm, st);
            if (wg == 2) return launch_items(local_kernel<SPLIT, 128, 2>, p, G, items, sm, st);
        }
        launch_items(local_kernel<SPLIT, 128, 0>, p, G, items, sm, st);
    }
}
template struct LocalPass<true>;
template struct LocalPass<false>;

}  // namespace cbwd
}  // namespace gdn
