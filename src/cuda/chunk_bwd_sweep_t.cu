/* CUDA chunk backward, the reverse sweep transposed (bf16 / f16, K = 128, V in
 * 128-column blocks): dS^T in the registers of two warpgroups as the A
 * operand of every product, the mirror of the forward's transposed state
 * walk (chunk_fwd_state_t.cu); its launcher. K = 256 (KS): two blocks a
 * (sequence, value head, column block) in a cluster, block r holding rows
 * [128 r, 128 r + 128) of dS, its columns of k and q; Z^T = dS^T K^T is
 * their partials summed (own + partner's, the same bits in both) through
 * distributed shared memory, the rest as at K = 128 on the block's half.
 *
 * Per chunk, in reverse (bwd_sweep of chunk_bwd_sweep.cu, transposed; the
 * rows of dS^T are this warpgroup's 64 columns of V):
 *   dstates[slot] = dS
 *   Z^T  = dS^T K^T                         (dS rounded to bf16)
 *   dU^T = Z^T diag(ek rk) + dO^T P         (P rounded to bf16; dO exact)
 *   Y^T  = dU^T Tm                          (dU as hi + lo, Tm rounded: two products)
 *   dS^T = exp(gL) dS^T - (Y^T diag(beta exp(gc) rk)) K + (dO^T diag(scale exp(gc) rq)) Q
 * q and k stay raw (bf16 is exact there) with their rstd as the scales
 * above; the operands of the state update (Y, the scaled dO) are split into
 * bf16 hi + lo halves, so the carried gradient keeps ~16 bits of them; dS,
 * Tm and P as bf16 (the gradients' measured margins: bench/NOTES.md v4.7).
 * A chunk's k, q, dO rows (128-byte swizzle) and its record's Tm, P and
 * gate rows come by cp.async a chunk ahead into the other of two stages;
 * Tm and P are rounded into their blocked bf16 operands once a chunk by the
 * whole block (or read from the fused pass's bf16 tiles: BwdArgs::rec16).
 * f16 inputs take the same steps in f16 (their rows exact, the computed
 * operands as f16 hi + lo: cfwd::f16_hilo, each in a per-warp power-of-two
 * scale: warp_pow2); the rows are addressed as 16-bit elements of either
 * type. */
#include "cuda/chunk_bwd.cuh"
#include "cuda/chunk_fwd.cuh"

namespace gdn {
namespace cbwd {
namespace {

using cfwd::afrag;
using cfwd::afrag_hilo;
using cfwd::blk64;
using cfwd::desc_blk;
using cfwd::desc_off;
using cfwd::desc_sw128;
using cfwd::wgt_rs;

constexpr int TT = 256;   /* threads: two warpgroups */
static_assert(TT == NT, "the K split's exchange arrays are laid out by NT threads (ks_put)");
struct RStage {           /* one chunk's inputs, in bytes; 1024-byte aligned pieces for the swizzle */
    static constexpr int k = 0;           /* [k cols 0-63][k cols 64-127], 64 rows x 128 B each, swizzled */
    static constexpr int q = 16384;       /* the same for q */
    static constexpr int o = 32768;       /* dO: [the block's cols 0-63][cols 64-127] */
    static constexpr int rec = 49152;     /* the record's Tm, P (fp32 64 x 64 each) */
    static constexpr int tok = 81920;     /* the record's gcd (64 doubles), gam, beta */
    static constexpr int bytes = 82944;
};
static_assert(RStage::bytes % 1024 == 0 && RStage::tok + 1024 == RStage::bytes, "stages keep the swizzle's alignment");
struct RSmem {
    static constexpr int ph = 2 * RStage::bytes;   /* P as B (k = s, n = t), blocked bf16 */
    static constexpr int th = ph + 8192;           /* Tm as B (k = u, n = t) */
    static constexpr int sc = th + 8192;           /* per token: eks, ys, qs (fp32) */
    static constexpr int zx = sc + 1024;           /* KS: the block's Z^T partial (32 floats a thread) */
    static constexpr int bytes = sc + 3 * CC * 4 + 1024;   /* + the base's alignment */
    static constexpr int bytes_ks = zx + 32 * 256 * 4 + 1024;
};
static_assert(RSmem::bytes_ks <= 227 * 1024, "the K split's sweep fits an SM");

/* the state gradient (n, j) of dht / dh0 at (k row i, column v) */
__device__ __forceinline__ int64_t st_at(const BwdArgs &p, int64_t n, int j, int i, int v) {
    const int64_t base = (n * p.HV + j) * (int64_t)p.K * p.V;
    return base + ((p.flags & GDN_STATE_V_FIRST) ? (int64_t)v * p.K + i : (int64_t)i * p.V + v);
}

/* f16: the power of two (pow2_for) for the warp's N values, the rows of an A
 * operand from registers (the warp's own: so also the rows of the product it
 * holds); 1 for bf16 (fp32's range) */
template <typename M, int N> __device__ __forceinline__ float warp_pow2(const float *v) {
    if constexpr (M::bf) return 1.f;
    else {
        float m = 0.f;
#pragma unroll
        for (int i = 0; i < N; i++) m = fmaxf(m, fabsf(v[i]));
        return pow2_for(warp_max(m));
    }
}

/* M: the 16-bit type's routines (cfwd::mma_traits<__nv_bfloat16>, cfwd::f16_hilo) */
template <bool KS, typename M>
__global__ void __launch_bounds__(TT, 1) bwd_sweep_t_kernel(BwdArgs p) {
    extern __shared__ __align__(1024) char smr_raw[];
    char *sm = smr_raw + ((1024 - (saddr(smr_raw) & 1023)) & 1023);
    const int tid = threadIdx.x, lane = tid & 31, w = __shfl_sync(0xffffffffu, tid >> 5, 0), g = lane >> 2, tq = lane & 3;
    const int cg = w >> 2, wl = w & 3;   /* warpgroup (64 columns of V), warp in it (16 of them) */
    const int kh = KS ? (int)(blockIdx.x & 1) : 0, bx = KS ? (int)(blockIdx.x >> 1) : (int)blockIdx.x;   /* KS: the block's half of K */
    const int nvb = p.V / 128, vb = bx % nvb, j = (bx / nvb) % p.HV, h = j / p.G;
    const int64_t n = bx / (nvb * p.HV);
    const int K = KS ? 256 : 128, ko = 128 * kh, V = p.V, vcol0 = vb * 128, d0 = vcol0 + cg * 64 + wl * 16 + g;   /* this thread's rows of dS^T: d0, d0 + 8 */
    float *zx = reinterpret_cast<float *>(sm + RSmem::zx);
    int64_t bos, len;
    seq_range(p, n, &bos, &len);
    const int64_t sb = bos / CC + n;
    int64_t cb, nch;   /* chunks [cb, nch), walked from nch - 1 */
    sweep_range(p, (len + CC - 1) / CC, &cb, &nch);
    const bool l2 = (p.flags & GDN_QK_L2NORM) != 0;
    const bool r16 = M::bf && p.rec16;   /* the records' Tm, P as bf16 tiles (bf16 only) */
    __nv_bfloat16 *Ph = reinterpret_cast<__nv_bfloat16 *>(sm + RSmem::ph), *Th = reinterpret_cast<__nv_bfloat16 *>(sm + RSmem::th);
    float *eks = reinterpret_cast<float *>(sm + RSmem::sc), *ys = eks + CC, *qs = ys + CC;

    /* chunk ci into stage sl (every thread its pieces; one commit group), and
     * the thread's token's rstd (threads < CC) into rk, rq */
    float frk = 0.f, frq = 0.f;
    const auto fetch = [&](int64_t ci, int sl) {
        char *stg = sm + sl * RStage::bytes;
        const int64_t row0 = bos + ci * CC;
        const int c = len - ci * CC < CC ? (int)(len - ci * CC) : CC;
        /* piece e = tid + u TT is matrix u / 4 (k, q, dO), row 16 (u % 4) + tid / 16, 16 bytes c16 = tid % 16
         * (the matrices and rows compile-time apart: no pointer table, little to keep across chunks) */
        static_assert(CC * 16 == 4 * TT, "four of a thread's pieces a matrix");
        const int c16 = tid & 15, rt = tid >> 4;
        const __nv_bfloat16 *src3[3] = {static_cast<const __nv_bfloat16 *>(p.k) + (row0 * p.H + h) * (int64_t)K + ko + c16 * 8,
                                        static_cast<const __nv_bfloat16 *>(p.q) + (row0 * p.H + h) * (int64_t)K + ko + c16 * 8,
                                        static_cast<const __nv_bfloat16 *>(p.dout) + (row0 * p.HV + j) * (int64_t)V + vcol0 + c16 * 8};
        const int64_t rs3[3] = {(int64_t)p.H * K, (int64_t)p.H * K, (int64_t)p.HV * V};
#pragma unroll
        for (int u = 0; u < 3 * CC * 16 / TT; u++) {
            const int m = u >> 2, r = TT / 16 * (u & 3) + rt;
            char *dst = stg + m * 16384 + (c16 >> 3) * 8192 + r * 128 + (((c16 & 7) ^ (r & 7)) << 4);
            const bool in = r < c;
            const __nv_bfloat16 *src = src3[m] + (in ? r : 0) * rs3[m];
            gdn::cp16(dst, src, in);
        }
        const float *rec = rec_at(p, n, sb + ci, ci, j);
        if (r16)   /* Tm, P as the fused pass's bf16 tiles: 16 KB */
#pragma unroll
            for (int u = 0; u < 2 * CC * CC / 8 / TT; u++) {
                const int e = tid + u * TT;
                gdn::cp16(stg + RStage::rec + 16 * e, reinterpret_cast<const char *>(rec + R_TM) + 16 * e, true);
            }
        else
#pragma unroll
            for (int u = 0; u < 2 * CC * CC / 4 / TT; u++) {
                const int e = tid + u * TT;
                gdn::cp16(stg + RStage::rec + 16 * e, rec + R_TM + 4 * e, true);
            }
        if (tid < 64) gdn::cp16(stg + RStage::tok + 16 * tid, rec + R_GCD + 4 * tid, true);   /* gcd, gam, beta */
        gdn::cp_commit();
        if (tid < CC) {
            frk = tid < c ? (l2 ? p.rstd_k[(row0 + tid) * p.H + h] : 1.f) : 0.f;
            frq = tid < c ? (l2 ? p.rstd_q[(row0 + tid) * p.H + h] : 1.f) : 0.f;
        }
    };

    /* dS^T: st[4 i + e] = dS[k = 8 i + 2 tq + (e & 1)][d0 + 8 (e >> 1)] */
    float st[64];
#pragma unroll
    for (int i = 0; i < 16; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int kr = ko + 8 * i + 2 * tq + (e & 1), vc = d0 + 8 * (e >> 1);
            st[4 * i + e] = p.dht ? p.dht[st_at(p, n, j, kr, vc)] : 0.f;
        }
    if (nch > cb) fetch(nch - 1, 0);
    const int lm = lane >> 3, lr = lane & 7;
    BP_DECL;
    for (int64_t ci = nch - 1; ci >= cb; ci--) {
        const int sl = (int)((nch - 1 - ci) & 1);
        char *stg = sm + sl * RStage::bytes;
        const int c = len - ci * CC < CC ? (int)(len - ci * CC) : CC;
        const float rk = frk, rq = frq;
        gdn::cp_wait_all();
        cfwd::fence_async_smem();
        __syncthreads();   /* stage sl is in; the other stage and the operands of the last chunk are free */
        if (ci > cb) fetch(ci - 1, sl ^ 1);
        if (p.dstates) {   /* dS leaving chunk ci, this thread's part */
            float *sd = dstate_at(p, n, sb + ci, ci, j);
#pragma unroll
            for (int i = 0; i < 16; i++)
#pragma unroll
                for (int e = 0; e < 4; e++) sd[(int64_t)(ko + 8 * i + 2 * tq + (e & 1)) * V + d0 + 8 * (e >> 1)] = st[4 * i + e];
        }
        BP(0);
        /* Tm and P into their blocked bf16 operands (from the fp32 rows, or the
         * bf16 tiles' rows: the same roundings); the per-token scales */
        {
            const float *Tf = reinterpret_cast<const float *>(stg + RStage::rec), *Pf = Tf + CC * CC;
            const char *Tt = stg + RStage::rec;   /* r16: Tm's tile, P's 8 KB after it (swz) */
#pragma unroll 4
            for (int e = tid; e < 2 * CC * CC / 2; e += TT) {
                const int mat = e >> 11, x = e & 2047;   /* 2048 pairs a matrix: (s, s + 1) of column t */
                const int t = (x & 7) + 8 * ((x >> 5) & 7), sp = ((x >> 3) & 3) + 4 * (x >> 8), s = 2 * sp;
                uint32_t v;
                if (r16) {
                    const char *B = Tt + mat * 8192;
                    v = (uint32_t)*reinterpret_cast<const unsigned short *>(B + cfwd::swz(s, t)) |
                        (uint32_t)*reinterpret_cast<const unsigned short *>(B + cfwd::swz(s + 1, t)) << 16;
                } else {
                    const float *F = mat ? Pf : Tf;
                    v = M::pack(F[s * CC + t], F[(s + 1) * CC + t]);
                }
                *reinterpret_cast<uint32_t *>((mat ? Ph : Th) + blk64(t, s)) = v;
            }
            if (tid < CC) {
                const double *gcd = reinterpret_cast<const double *>(stg + RStage::tok);
                const float *gam = reinterpret_cast<const float *>(stg + RStage::tok + 512), *bet = gam + CC;
                const float ek = tid < c ? expf((float)(gcd[c - 1] - gcd[tid])) : 0.f;
                eks[tid] = ek * rk;
                ys[tid] = -(bet[tid] * gam[tid] * rk);   /* negated: dS^T -= ... as an accumulation */
                qs[tid] = p.scale * gam[tid] * rq;
            }
            cfwd::fence_async_smem();
            __syncthreads();
        }
        BP(1);
        const __nv_bfloat16 *Ks = reinterpret_cast<const __nv_bfloat16 *>(stg + RStage::k);
        const __nv_bfloat16 *Qs = reinterpret_cast<const __nv_bfloat16 *>(stg + RStage::q);
        const char *Ob = stg + RStage::o + cg * 8192;
        /* ---- Z^T = dS^T K^T ---- */
        float z[32], u[32];
        {
            uint32_t sa[8][4];
            const float s1 = warp_pow2<M, 64>(st);   /* f16: dS^T's rows scaled, Z^T's unscaled */
            if constexpr (!M::bf) mul_all<64>(st, s1);
#pragma unroll
            for (int kk = 0; kk < 8; kk++) afrag<M>(sa[kk], st, kk);
            if constexpr (!M::bf) mul_all<64>(st, 1.f / s1);
            cfwd::wg_fence();
#pragma unroll
            for (int kk = 0; kk < 8; kk++) wgt_rs<64, M::bf, 0>(z, sa[kk], desc_off(desc_sw128(Ks, 16), (int)sizeof(*Ks) * ((kk >> 2) * 4096 + (kk & 3) * 16)), kk);
            cfwd::wg_commit();
            cfwd::wg_wait<0>();
            if constexpr (!M::bf) mul_all<32>(z, 1.f / s1);
        }
        if constexpr (KS) {   /* Z^T over both halves of K */
            if (ci < nch - 1) ks_wait();   /* the partner has read the last chunk's */
            ks_put<32>(zx, z);
            ks_sync();
            ks_add<32>(ks_peer(zx), z);
            ks_arrive();
        }
        /* dO^T in the accumulator layout (tokens 8 a.., this warp's rows), which is also its A fragments */
        uint32_t vt[8][2];
#pragma unroll
        for (int ip = 0; ip < 8; ip += 2) {
            const int tok = 8 * (ip + (lm >> 1)) + lr, ch = 2 * wl + (lm & 1);
            uint32_t r[4];
            gdn::ldsm4t(r, Ob + tok * 128 + ((ch ^ lr) << 4));
            vt[ip][0] = r[0]; vt[ip][1] = r[1]; vt[ip + 1][0] = r[2]; vt[ip + 1][1] = r[3];
        }
        /* ---- dO^T P ---- */
        cfwd::wg_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            const uint32_t a[4] = {vt[2 * kk][0], vt[2 * kk][1], vt[2 * kk + 1][0], vt[2 * kk + 1][1]};
            wgt_rs<64, M::bf, 0>(u, a, desc_off(desc_blk(Ph), (int)sizeof(*Ph) * (kk * 128)), kk);
        }
        cfwd::wg_commit();
        cfwd::wg_wait<0>();
        BP(2);
        /* ---- dU^T = Z^T diag(ek rk) + dO^T P; Y^T = dU^T Tm ---- */
        float y[32];
        {
#pragma unroll
            for (int a = 0; a < 8; a++) {
                const float2 s = *reinterpret_cast<const float2 *>(eks + 8 * a + 2 * tq);
                u[4 * a] = fmaf(s.x, z[4 * a], u[4 * a]); u[4 * a + 1] = fmaf(s.y, z[4 * a + 1], u[4 * a + 1]);
                u[4 * a + 2] = fmaf(s.x, z[4 * a + 2], u[4 * a + 2]); u[4 * a + 3] = fmaf(s.y, z[4 * a + 3], u[4 * a + 3]);
            }
            uint32_t ua[4][2][4];
            const float s2 = warp_pow2<M, 32>(u);   /* f16: dU^T's rows scaled, Y^T's unscaled */
            if constexpr (!M::bf) mul_all<32>(u, s2);
#pragma unroll
            for (int kk = 0; kk < 4; kk++) afrag_hilo<M>(ua[kk][0], ua[kk][1], u, kk);
            cfwd::wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                wgt_rs<64, M::bf, 0>(y, ua[kk][0], desc_off(desc_blk(Th), (int)sizeof(*Th) * (kk * 128)), kk);
                wgt_rs<64, M::bf, 0>(y, ua[kk][1], desc_off(desc_blk(Th), (int)sizeof(*Th) * (kk * 128)), 1);
            }
            cfwd::wg_commit();
            cfwd::wg_wait<0>();
            if constexpr (!M::bf) mul_all<32>(y, 1.f / s2);
        }
        BP(3);
        /* ---- dS^T = exp(gL) dS^T + (Y^T diag(ys)) K + (dO^T diag(qs)) Q ---- */
        {
            float x[32];
#pragma unroll
            for (int a = 0; a < 8; a++) {
                const float2 s = *reinterpret_cast<const float2 *>(ys + 8 * a + 2 * tq);
                const float2 r = *reinterpret_cast<const float2 *>(qs + 8 * a + 2 * tq);
                y[4 * a] *= s.x; y[4 * a + 1] *= s.y; y[4 * a + 2] *= s.x; y[4 * a + 3] *= s.y;
                x[4 * a] = r.x * M::lo(vt[a][0]); x[4 * a + 1] = r.y * M::hi(vt[a][0]);
                x[4 * a + 2] = r.x * M::lo(vt[a][1]); x[4 * a + 3] = r.y * M::hi(vt[a][1]);
            }
            uint32_t ya[4][2][4], xa[4][2][4];
            /* f16: Y^T's and the scaled dO^T's rows in one scale, dS^T's with them (the
             * products accumulate onto it), unscaled after */
            const float s3 = M::bf ? 1.f : fminf(warp_pow2<M, 32>(y), warp_pow2<M, 32>(x));
            if constexpr (!M::bf) { mul_all<32>(y, s3); mul_all<32>(x, s3); }
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                afrag_hilo<M>(ya[kk][0], ya[kk][1], y, kk);
                afrag_hilo<M>(xa[kk][0], xa[kk][1], x, kk);
            }
            const float gl = reinterpret_cast<const float *>(stg + RStage::tok + 512)[c - 1] * s3;
#pragma unroll
            for (int i = 0; i < 64; i++) st[i] *= gl;
            cfwd::wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                const uint64_t dk = desc_off(desc_sw128(Ks, 8192), (int)sizeof(*Ks) * (kk * 16 * 64)), dq = desc_off(desc_sw128(Qs, 8192), (int)sizeof(*Qs) * (kk * 16 * 64));
                wgt_rs<128, M::bf, 1>(st, ya[kk][0], dk, 1);
                wgt_rs<128, M::bf, 1>(st, ya[kk][1], dk, 1);
                wgt_rs<128, M::bf, 1>(st, xa[kk][0], dq, 1);
                wgt_rs<128, M::bf, 1>(st, xa[kk][1], dq, 1);
            }
            cfwd::wg_commit();
            cfwd::wg_wait<0>();
            if constexpr (!M::bf) mul_all<64>(st, 1.f / s3);
        }
        BP(4);
    }
    if (KS && nch > cb) ks_wait();   /* the last exchange read: the partner's shared memory may go */
    BP_PRINT(blockIdx.x == 0 && nch > cb, "bwd_sweep_t per chunk: wait, fetch, store dS | Tm P split | Z dOP | Y | dS", 5, nch - cb);
    if (p.dh0) {
#pragma unroll
        for (int i = 0; i < 16; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) p.dh0[st_at(p, n, j, ko + 8 * i + 2 * tq + (e & 1), d0 + 8 * (e >> 1))] = st[4 * i + e];
    }
}

}  // namespace

/* bf16 or f16, K = 128 or 256 (KS), V in 128-column blocks, q / k / dO rows 16-byte aligned */
bool SweepT::takes(const BwdArgs &p) {
    return (p.dt == 1 || p.dt == 2) && (p.K == 128 || p.K == 256) && p.V % 128 == 0 && al16(p.q) && al16(p.k) && al16(p.dout);
}
using BF = cfwd::mma_traits<__nv_bfloat16>;
using HF = cfwd::f16_hilo;
cudaError_t SweepT::attr() {
    static bool done = false;
    if (done) return cudaSuccess;
    cudaError_t e = smem_attr(bwd_sweep_t_kernel<false, BF>, RSmem::bytes);
    if (e == cudaSuccess) e = smem_attr(bwd_sweep_t_kernel<true, BF>, RSmem::bytes_ks);
    if (e == cudaSuccess) e = smem_attr(bwd_sweep_t_kernel<false, HF>, RSmem::bytes);
    if (e == cudaSuccess) e = smem_attr(bwd_sweep_t_kernel<true, HF>, RSmem::bytes_ks);
    if (e == cudaSuccess) done = true;
    return e;
}
void SweepT::launch(const BwdArgs &p, cudaStream_t st) {
    const unsigned blocks = (unsigned)(p.N * p.HV * (p.V / 128));
    if (blocks == 0) return;
    if (p.K == 128) {
        if (p.dt == 1) bwd_sweep_t_kernel<false, BF><<<blocks, TT, RSmem::bytes, st>>>(p);
        else bwd_sweep_t_kernel<false, HF><<<blocks, TT, RSmem::bytes, st>>>(p);
        return;
    }
    cudaLaunchConfig_t cfg = {};   /* K = 256: two blocks a column block, one cluster */
    cudaLaunchAttribute at[1];
    cfg.gridDim = dim3(2 * blocks);
    cfg.blockDim = dim3(TT);
    cfg.dynamicSmemBytes = (size_t)RSmem::bytes_ks;
    cfg.stream = st;
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = 2;
    at[0].val.clusterDim.y = at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    if (p.dt == 1) cudaLaunchKernelEx(&cfg, bwd_sweep_t_kernel<true, BF>, p);
    else cudaLaunchKernelEx(&cfg, bwd_sweep_t_kernel<true, HF>, p);
}

}  // namespace cbwd
}  // namespace gdn
