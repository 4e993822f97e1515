/* CUDA chunk backward, the chunk-local stage for K <= 128 (local_kernel): one
 * block per (slot, value head) runs chunk_backward of chunk_bwd.c with every
 * tile in shared memory and every sum over V in registers; its launcher.
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
 * Only dQc and dKc leave the block (the scratch, for the sum over the G value
 * heads in grp_qk_kernel); dv, dg, dbeta and the dA_log / ddt_bias partials
 * are stored here. Products are 3xTF32 where SPLIT (mma_tf32.cuh). Warp w
 * owns rows 16 (w % 4) and half w / 4 of the columns of every c x K and c x c
 * sum; the panel's c x VP products are dealt one 16 x 16 tile per warp. */
#include "cuda/chunk_bwd.cuh"

namespace gdn {
namespace cbwd {
namespace {

constexpr int VP = 32, LP = VP + 4;   /* panel columns; row stride of the panel arrays (4 mod 32) */

/* shared memory, in floats: Kc, Tm, P for the whole block; the panel arrays
 * of the V walk and the K side's arrays share the space after them */
template <int KH> struct Lay {
    static constexpr int LK = KH + 4;   /* row stride of the c x K arrays (4 mod 32) */
    static constexpr int Kc = 0, Tm = Kc + CC * LK, P = Tm + CC * R4, A = P + CC * R4;
    /* the V walk */
    static constexpr int S0p = A, dSp = S0p + KH * LP, Vp = dSp + KH * LP, dOp = Vp + CC * LP, Xp = dOp + CC * LP,
                         Up = Xp + CC * LP, dUp = Up + CC * LP, end1 = dUp + CC * LP;
    /* the K side (Q and dWk also hold gate_store's prefix sums at the end) */
    static constexpr int Q = A, dWk = Q + CC * LK, dP = dWk + CC * LK, dTm = dP + CC * R4, tmp = dTm + CC * R4,
                         Rg = tmp + CC * R4, end2 = Rg + CC * R4;
    static constexpr int end = end1 > end2 ? end1 : end2;
    /* then: gcd (CC doubles), gam, bet, ek, dgc, dbt, row, rpa[2][CC], rpb[2][CC], red[32] */
    static constexpr int floats = end + 2 * CC + 6 * CC + 4 * CC + 32;
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

/* acc[r] += A B over k in [k0, k1) for the warp's c x K tiles */
template <bool SPLIT, int NR, typename FA, typename FB>
__device__ __forceinline__ void acc_ck(Acc<NR> &acc, int wr, int kc0, int k0, int k1, const FA &a, const FB &b) {
#pragma unroll
    for (int r = 0; r < NR; r++) gdn::warp_mma<SPLIT>(acc[r], a, b, wr, kc0 + 32 * r, 4, k0, k1);
}
template <int NR, typename FE>
__device__ __forceinline__ void store_ck(const Acc<NR> &acc, int wr, int kc0, int K, const FE &epi) {
#pragma unroll
    for (int r = 0; r < NR; r++) gdn::warp_store(acc[r], wr, kc0 + 32 * r, 4, CC, K, epi);
}

constexpr int FROM_ROW = -1;   /* panel_mm's k0: from the tile's first row (upper operand); k1: to its last (lower) */
/* one 16 x 16 tile of a c x VP panel product per warp: epi(t, v, A B) */
template <bool SPLIT, typename FA, typename FB, typename FE>
__device__ __forceinline__ void panel_mm(int k0, int k1, const FA &a, const FB &b, const FE &epi) {
    const int warp = threadIdx.x >> 5, i0 = (warp >> 1) * 16, n0 = (warp & 1) * 16;
    float acc[4][4] = {};
    gdn::warp_mma<SPLIT>(acc, a, b, i0, n0, 2, k0 < 0 ? i0 : k0, k1 < 0 ? i0 + 16 : k1);
    gdn::warp_store(acc, i0, n0, 2, CC, VP, epi);
}

/* rows [0, KH) x columns [v0, v0 + VP) of a K x V fp32 state into dst
 * (stride LP), zero past K and V: 16-byte loads where V % 4 == 0, all of a
 * thread's in flight at once */
template <int KH>
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
            *reinterpret_cast<float4 *>(dst + i * LP + 4 * q) = r[u];
        }
    } else {
        batched<8>(KH * VP, [&](int e) { const int i = e / VP, v = v0 + e % VP; return i < K && v < V ? S[(int64_t)i * V + v] : 0.f; },
                   [&](int e, float x) { dst[(e / VP) * LP + e % VP] = x; });
    }
}

template <bool SPLIT, int KH>
__global__ void __launch_bounds__(NT, 1) local_kernel(BwdArgs p, Grp G) {
    using L = Lay<KH>;
    constexpr int LK = L::LK, NR = KH / 64;
    extern __shared__ __align__(16) float sm[];
    const int64_t slot = G.s0 + blockIdx.x / p.HV;
    const int j = blockIdx.x % p.HV, h = j / p.G, c = p.slot_c[slot];
    if (c == 0) return;
    const int64_t row0 = p.slot_row0[slot];
    const float *rec = p.rec + (slot * p.HV + j) * (int64_t)REC;
    const int K = p.K, V = p.V, Kp = k8(K), tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wr = (warp & 3) * 16, wc = warp >> 2, kc0 = wc * (KH / 2), cc0 = wc * 32;
    float *Kc = sm + L::Kc, *Tm = sm + L::Tm, *P = sm + L::P;
    float *S0p = sm + L::S0p, *dSp = sm + L::dSp, *Vp = sm + L::Vp, *dOp = sm + L::dOp, *Xp = sm + L::Xp, *Up = sm + L::Up,
          *dUp = sm + L::dUp;
    float *Qs = sm + L::Q, *dWk = sm + L::dWk, *dP = sm + L::dP, *dTm = sm + L::dTm, *tmp = sm + L::tmp, *Rg = sm + L::Rg;
    double *gcd = reinterpret_cast<double *>(sm + L::end);
    float *gam = reinterpret_cast<float *>(gcd + CC), *bet = gam + CC, *ek = bet + CC, *dgc = ek + CC, *dbt = dgc + CC,
          *row = dbt + CC, *rpa = row + CC, *rpb = rpa + 2 * CC, *red = rpb + 2 * CC;
    const int64_t so = (slot * p.HV + j) * (int64_t)K * V;
    const float *S0 = p.states + so, *dS = p.dstates + so;

    /* the chunk's k rows, Tm, P, the per-token scalars */
    load_qk(p, p.k, p.rstd_k, row0, c, h, Kc, LK);
    load_64x64(Tm, R4, rec + R_TM);
    load_64x64(P, R4, rec + R_P);
    {
        RecTok r;
        r.issue(rec);
        r.commit(gcd, gam, bet);
    }
    if (tid < CC) { dgc[tid] = 0.f; dbt[tid] = 0.f; }
    __syncthreads();
    if (tid < CC) ek[tid] = tid < c ? Ef(gcd, c - 1, tid) : 0.f;   /* exp(gc_last - gc_t) */

    Acc<NR> aKd = {}, aXq = {}, aWk = {};
    float aP[4][4] = {}, aTm[4][4] = {};
    const bool cc_live = cc0 <= wr + 15;   /* the warp's c x c tile reaches the lower triangle */
    float tot = 0.f;                       /* sum of S0 * dS */

    /* ---- the V walk ---- */
    for (int v0 = 0; v0 < V; v0 += VP) {
        __syncthreads();   /* the previous panel's arrays are no longer read (and ek is set) */
        load_panel<KH>(S0p, S0, K, V, v0);
        load_panel<KH>(dSp, dS, K, V, v0);
        load_rows_v(p, p.v, row0, c, j, v0, VP, Vp, LP);
        load_rows_v(p, p.dout, row0, c, j, v0, VP, dOp, LP);
        __syncthreads();
        for (int e = tid; e < K * VP; e += NT) tot = fmaf(S0p[(e / VP) * LP + e % VP], dSp[(e / VP) * LP + e % VP], tot);
        /* X = Bv - Bk S0 = beta v - beta exp(gc) K S0 */
        panel_mm<SPLIT>(0, Kp, [&](int t, int i) { return Kc[t * LK + i]; }, [&](int i, int v) { return S0p[i * LP + v]; },
                        [&](int t, int v, float acc) {
                            Xp[t * LP + v] = t < c ? bet[t] * Vp[t * LP + v] - (bet[t] * gam[t]) * acc : 0.f;
                        });
        /* dU = P^T dO + Kd dS, k over (s, then i) */
        panel_mm<SPLIT>(
            FROM_ROW, CC + Kp, [&](int t, int k) { return k < CC ? P[k * R4 + t] : ek[t] * Kc[t * LK + k - CC]; },
            [&](int k, int v) { return k < CC ? dOp[k * LP + v] : dSp[(k - CC) * LP + v]; },
            [&](int t, int v, float acc) { dUp[t * LP + v] = acc; });
        __syncthreads();
        /* U = Tm X */
        panel_mm<SPLIT>(0, FROM_ROW, [&](int t, int s) { return Tm[t * R4 + s]; }, [&](int s, int v) { return Xp[s * LP + v]; },
                        [&](int t, int v, float acc) { Up[t * LP + v] = acc; });
        __syncthreads();
        /* the sums over V; dBv = Tm^T dU into Xp */
        acc_ck<SPLIT, NR>(aKd, wr, kc0, 0, VP, [&](int t, int v) { return Up[t * LP + v]; }, [&](int v, int i) { return dSp[i * LP + v]; });
        acc_ck<SPLIT, NR>(aXq, wr, kc0, 0, VP, [&](int t, int v) { return dOp[t * LP + v]; }, [&](int v, int i) { return S0p[i * LP + v]; });
        acc_ck<SPLIT, NR>(aWk, wr, kc0, 0, VP, [&](int t, int v) { return dUp[t * LP + v]; }, [&](int v, int i) { return S0p[i * LP + v]; });
        if (cc_live) {
            gdn::warp_mma<SPLIT>(aP, [&](int t, int v) { return dOp[t * LP + v]; }, [&](int v, int u) { return Up[u * LP + v]; }, wr, cc0, 4, 0, VP);
            gdn::warp_mma<SPLIT>(aTm, [&](int t, int v) { return dUp[t * LP + v]; }, [&](int v, int u) { return bet[u] * Vp[u * LP + v]; }, wr,
                                 cc0, 4, 0, VP);
        }
        panel_mm<SPLIT>(FROM_ROW, CC, [&](int t, int s) { return Tm[s * R4 + t]; }, [&](int s, int v) { return dUp[s * LP + v]; },
                        [&](int t, int v, float acc) { Xp[t * LP + v] = acc; });
        __syncthreads();
        /* dv = beta dBv; dbeta gets dBv . v */
        for (int e = tid; e < c * VP; e += NT) {
            const int t = e / VP, v = e % VP;
            if (v0 + v < V) gdn::st(p.dv, ((row0 + t) * p.HV + j) * (int64_t)V + v0 + v, bet[t] * Xp[t * LP + v], p.dt);
        }
        if (tid < c) {
            float d = 0.f;
            for (int v = 0; v < VP; v++) d = fmaf(Xp[tid * LP + v], Vp[tid * LP + v], d);
            dbt[tid] += d;
        }
    }
    tot = gdn::block_sum(tot, red);
    __syncthreads();   /* the panel arrays are free: the K side's arrays take their place */

    /* ---- the K side ---- */
    load_qk(p, p.q, p.rstd_q, row0, c, h, Qs, LK);
    store_ck<NR>(aWk, wr, kc0, KH, [&](int t, int i, float x) { dWk[t * LK + i] = -x; });
    gdn::warp_store(aTm, wr, cc0, 4, CC, CC, [&](int t, int u, float x) { dTm[t * R4 + u] = x; });
    /* dP -> the pair terms Rg = dP * P and dP~ = scale E dP (lower), scale dP (diagonal) */
    gdn::warp_store(aP, wr, cc0, 4, CC, CC, [&](int t, int u, float x) {
        Rg[t * R4 + u] = u < t && t < c ? x * P[t * R4 + u] : 0.f;
        dP[t * R4 + u] = u < t ? x * p.scale * Ef(gcd, t, u) : u == t ? x * p.scale : 0.f;
    });
    __syncthreads();
    /* dgc_t += scale exp(gc_t) (q_t . Xq_t); the pairs (last, t) of S1's gate: Rg += E (k_t . dKd_t) */
    row_dots<NR>(aXq, Qs, LK, wr, kc0, rpb + wc * CC);
    row_dots<NR>(aKd, Kc, LK, wr, kc0, rpa + wc * CC);
    row_scale<NR>(aXq, wr, [&](int t) { return t < c ? p.scale * gam[t] : 0.f; });   /* dQc = scale exp(gc) Xq */
    row_scale<NR>(aKd, wr, [&](int t) { return ek[t]; });                               /* dKc = exp(gc_last - gc) dKd */
    __syncthreads();
    if (tid < c) {
        dgc[tid] += p.scale * gam[tid] * (rpb[tid] + rpb[CC + tid]);
        if (tid < c - 1) Rg[(c - 1) * R4 + tid] += ek[tid] * (rpa[tid] + rpa[CC + tid]);
        else dgc[tid] += gam[tid] * tot;
    }
    /* dQc += dP~ K; dKc += dP~^T Q; dTm += dWk Bk^T, strictly lower */
    acc_ck<SPLIT, NR>(aXq, wr, kc0, 0, wr + 16, [&](int t, int s) { return dP[t * R4 + s]; }, [&](int s, int i) { return Kc[s * LK + i]; });
    acc_ck<SPLIT, NR>(aKd, wr, kc0, wr, CC, [&](int t, int s) { return dP[s * R4 + t]; }, [&](int s, int i) { return Qs[s * LK + i]; });
    {
        float a[4][4] = {};
        if (cc_live)
            gdn::warp_mma<SPLIT>(a, [&](int t, int i) { return dWk[t * LK + i]; }, [&](int i, int u) { return (bet[u] * gam[u]) * Kc[u * LK + i]; },
                                 wr, cc0, 4, 0, Kp);
        gdn::warp_store(a, wr, cc0, 4, CC, CC, [&](int t, int u, float x) { dTm[t * R4 + u] = u < t ? dTm[t * R4 + u] + x : 0.f; });
    }
    __syncthreads();
    /* dBk = Tm^T dWk (in aWk); tmp = dTm Tm^T */
    {
        Acc<NR> &dBk = aWk;
#pragma unroll
        for (int r = 0; r < NR; r++)
#pragma unroll
            for (int q = 0; q < 4; q++) dBk[r][q][0] = dBk[r][q][1] = dBk[r][q][2] = dBk[r][q][3] = 0.f;
        acc_ck<SPLIT, NR>(dBk, wr, kc0, wr, CC, [&](int t, int s) { return Tm[s * R4 + t]; }, [&](int s, int i) { return dWk[s * LK + i]; });
        float a[4][4] = {};
        gdn::warp_mma<SPLIT>(a, [&](int t, int s) { return dTm[t * R4 + s]; }, [&](int s, int u) { return Tm[u * R4 + s]; }, wr, cc0, 4, 0, wr + 16);
        gdn::warp_store(a, wr, cc0, 4, CC, CC, [&](int t, int u, float x) { tmp[t * R4 + u] = x; });
        /* Bk = diag(beta exp(gc)) K: dKc += beta exp(gc) dBk; (dBk . k) to dbeta and dgc */
        row_dots<NR>(dBk, Kc, LK, wr, kc0, rpa + wc * CC);
        row_axpy<NR>(aKd, dBk, wr, [&](int t) { return t < c ? bet[t] * gam[t] : 0.f; });
    }
    __syncthreads();
    if (tid < c) {
        const float kd = rpa[tid] + rpa[CC + tid];
        dbt[tid] += gam[tid] * kd;
        dgc[tid] += (bet[tid] * gam[tid]) * kd;
    }
    /* dA = -Tm^T tmp (strictly lower, rows < c) into dTm's place; KK = K K^T into dWk's */
    {
        float a[4][4] = {};
        gdn::warp_mma<SPLIT>(a, [&](int t, int s) { return Tm[s * R4 + t]; }, [&](int s, int u) { return tmp[s * R4 + u]; }, wr, cc0, 4, wr, CC);
        gdn::warp_store(a, wr, cc0, 4, CC, CC, [&](int t, int u, float x) { dTm[t * R4 + u] = u < t && t < c ? -x : 0.f; });
        float b[4][4] = {};
        if (cc_live)
            gdn::warp_mma<SPLIT>(b, [&](int t, int i) { return Kc[t * LK + i]; }, [&](int i, int u) { return Kc[u * LK + i]; }, wr, cc0, 4, 0, Kp);
        gdn::warp_store(b, wr, cc0, 4, CC, CC, [&](int t, int u, float x) { dWk[t * R4 + u] = x; });
    }
    __syncthreads();
    /* A_tu = beta_t E_tu KK_tu: dbeta, the pair terms, and dA becomes dKK */
    {
        float *dA = dTm, *KK = dWk;
        for (int t = warp; t < c; t += NT / 32) {
            float db = 0.f;
            for (int u = lane; u < t; u += 32) {
                const float E = dA[t * R4 + u] * Ef(gcd, t, u), kk = KK[t * R4 + u];
                db = fmaf(E, kk, db);
                Rg[t * R4 + u] += E * bet[t] * kk;
                dA[t * R4 + u] = bet[t] * E;
            }
            db = gdn::warp_sum(db);
            if (lane == 0) dbt[t] += db;
        }
        __syncthreads();
        /* dKc += dKK K + dKK^T K */
        acc_ck<SPLIT, NR>(aKd, wr, kc0, 0, wr + 16, [&](int t, int s) { return dA[t * R4 + s]; }, [&](int s, int i) { return Kc[s * LK + i]; });
        acc_ck<SPLIT, NR>(aKd, wr, kc0, wr, CC, [&](int t, int s) { return dA[s * R4 + t]; }, [&](int s, int i) { return Kc[s * LK + i]; });
    }
    /* dQc, dKc to the scratch for the sum over the value heads */
    float *w = G.scr + (int64_t)blockIdx.x * G.o.F;
    store_ck<NR>(aXq, wr, kc0, K, [&](int t, int i, float x) { w[G.o.dQc + t * K + i] = x; });
    store_ck<NR>(aKd, wr, kc0, K, [&](int t, int i, float x) { w[G.o.dKc + t * K + i] = x; });
    __syncthreads();   /* Q and dWk's space free for the prefix sums */
    gate_store(p, slot, j, row0, c, rec, Rg, R4, dgc, dbt, row, reinterpret_cast<double(*)[CC + 1]>(sm + L::Q));
}

template <int KH> constexpr int local_smem() { return Lay<KH>::floats * (int)sizeof(float); }

}  // namespace

/* the items' dQc, dKc in the scratch */
Scr local_scr(int K) {
    Scr s = {};
    s.dQc = 0;
    s.dKc = (int64_t)CC * K;
    s.F = 2 * (int64_t)CC * K;
    return s;
}

template <bool SPLIT> cudaError_t LocalPass<SPLIT>::attr(int K) {
    if (k8(K) <= 64) return smem_attr(local_kernel<SPLIT, 64>, local_smem<64>());
    return smem_attr(local_kernel<SPLIT, 128>, local_smem<128>());
}
template <bool SPLIT> void LocalPass<SPLIT>::launch(const BwdArgs &p, const Grp &G, int64_t nsl, cudaStream_t st) {
    const unsigned items = (unsigned)(nsl * p.HV);
    if (k8(p.K) <= 64) local_kernel<SPLIT, 64><<<items, NT, local_smem<64>(), st>>>(p, G);
    else local_kernel<SPLIT, 128><<<items, NT, local_smem<128>(), st>>>(p, G);
}
template struct LocalPass<true>;
template struct LocalPass<false>;

}  // namespace cbwd
}  // namespace gdn
