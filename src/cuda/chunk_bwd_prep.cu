/* CUDA chunk backward, the prep pass: slot_info (each slot's first row and
 * length) and prep (per (slot, value head) the gate cumsum, beta, g, Tm and P
 * into the record the later passes read); their launchers. */
#include <type_traits>
#include "cuda/chunk_bwd.cuh"
#include "cuda/chunk_fwd.cuh"

namespace gdn {
namespace cbwd {
namespace {
using M16 = cfwd::mma_traits<__nv_bfloat16>;   /* the fused pass's bf16 pairs (rec16) */

/* ---- slot_info: per slot its first row and length (0 = no chunk) ---- */
__global__ void __launch_bounds__(NT) slot_info_kernel(BwdArgs p) {
    const int64_t s = (int64_t)blockIdx.x * NT + threadIdx.x;
    if (s >= p.nslots) return;
    int c = 0;
    int64_t row0 = 0;
    if (p.N > 0) {
        int64_t lo = 0, hi = p.N - 1;   /* the last n with slot_base(n) <= s (strictly increasing in n) */
        while (lo < hi) {
            const int64_t mid = (lo + hi + 1) / 2;
            if (slot_base(p, mid) <= s) lo = mid; else hi = mid - 1;
        }
        int64_t bos, len;
        seq_range(p, lo, &bos, &len);
        const int64_t i = s - slot_base(p, lo);
        if (i * CC < len) {
            row0 = bos + i * CC;
            c = len - i * CC < CC ? (int)(len - i * CC) : CC;
        }
    }
    p.slot_row0[s] = row0;
    p.slot_c[s] = c;
}

/* ---- prep: one block per (slot, j). Mirrors gdn_chunk_prepare (chunk_fwd.c):
 * gate and beta as cpu/load.c, gc in double, A_ts = beta_t E_ts KK_ts,
 * Tm by forward substitution, P_ts = (scale q_t.k_s) E_ts. q and k come in
 * raw, their rstd scale the products' rows and columns: with bf16 / f16
 * inputs (EX) both operands are exact in tf32, so KK^T and QK^T are one
 * product each, exact to fp32 accumulation; f32 inputs take 3xTF32. WG
 * (bf16, K = 128, 16-byte rows): q and k stay bf16 (the 128-byte swizzle,
 * by cp.async) and the two products are one wgmma batch of each warpgroup,
 * exact to fp32 accumulation as well ---- */
/* shared memory before As, in floats: q, k rows in fp32 (Qs, Ks); with WG
 * q, k as bf16 at a 1024-byte aligned kq, and As, Ts over them once the
 * products have read them (then gcd .. rk and the levels' sums M after:
 * ~39 KB, four blocks an SM by the registers, not three by the shared memory) */
__host__ __device__ constexpr int prep_qk_floats(bool wg, int lk) { return wg ? (1024 + 2 * CC * RS * 4) / 4 : 2 * CC * lk; }
/* H (bf16 or f16; float: not this path), for 128 < K <= 256 with 16-byte
 * rows: q and k stay 16-bit (rows of LH = 256 + 8 elements, conflict-free
 * for ldmatrix; zeros past K add nothing to the products) and the two
 * products are mma.sync m16n8k16 on them, exact to fp32 accumulation as
 * the tf32 products of their fp32 copies were, in half
 * the shared memory: two blocks an SM where the fp32 rows (~164 KB at K =
 * 256) left one. The lower 16 x 16 blocks only (10 of each product, 20 over
 * the 8 warps); P's upper blocks are stored as zeros */
__host__ __device__ constexpr int k16(int K) { return (K + 15) & ~15; }
constexpr int LH = 256 + 8;
__host__ __device__ constexpr int prep_qk_floats_h() { return CC * LH; }   /* both arrays, 2 bytes an element */
template <bool SPLIT, bool EX, bool WG, typename H = float>
__global__ void __launch_bounds__(NT) prep_kernel(BwdArgs p) {
    constexpr bool H16 = !std::is_same<H, float>::value;
    extern __shared__ __align__(16) float sm[];
    int64_t slot = blockIdx.x, n = 0, ci = 0;
    if (p.rw && !window_item(p, blockIdx.x, &n, &ci, &slot)) return;   /* a window's records */
    const int j = blockIdx.y, h = j / p.G, K = p.K, tid = threadIdx.x, lk = ld4(k8(K));
    const int c = p.slot_c[slot];
    if (c == 0) return;
    const int64_t row0 = p.slot_row0[slot];
    /* WG: k, q rows raw at kq (k: [cols 0-63][cols 64-127] of 64 rows, then q), in Qs and Ks's place */
    char *kq = reinterpret_cast<char *>(sm) + ((1024 - (saddr(sm) & 1023)) & 1023);
    H *Kh = reinterpret_cast<H *>(sm), *Qh = Kh + CC * LH;   /* H16: k at sm, q after it */
    float *Qs = sm, *Ks = Qs + CC * lk, *Ts;
    float *As = WG ? reinterpret_cast<float *>(kq) : sm + (H16 ? prep_qk_floats_h() : prep_qk_floats(false, lk));
    Ts = As + CC * RS;
    double *gcd = reinterpret_cast<double *>(WG ? sm + prep_qk_floats(true, lk) : Ts + CC * RS);
    float *gs = reinterpret_cast<float *>(gcd + CC), *bs = gs + CC, *rq = bs + CC, *rk = rq + CC;
    float *rec = rec_at(p, n, slot, ci, j);
    BP_DECL;
    /* the per-token loads issued first (they gate the first barrier), then the
     * q, k rows; the gate and beta formed after: cpu/load.c gdn_cpu_load_gate,
     * gdn_cpu_load_beta, zero past c; the rows' rstd (1 without the L2 norm) */
    const bool on = tid < c, l2 = (p.flags & GDN_QK_L2NORM) && on;
    const int64_t at = (row0 + tid) * p.HV + j;
    const float graw = on && p.g ? gdn::ld(p.g, at, p.gdt) : 0.f, braw = on ? gdn::ld(p.beta, at, p.gdt) : 0.f;
    const float rqv = l2 ? p.rstd_q[(row0 + tid) * p.H + h] : 1.f, rkv = l2 ? p.rstd_k[(row0 + tid) * p.H + h] : 1.f;
    if (WG) {
        for (int e = tid; e < 2 * CC * 16; e += NT) {
            const int m = e >> 10, r = (e >> 4) & 63, c16 = e & 15;
            const bool in = r < c;
            const __nv_bfloat16 *src = static_cast<const __nv_bfloat16 *>(m ? p.q : p.k) + ((row0 + (in ? r : 0)) * p.H + h) * (int64_t)128 + c16 * 8;
            gdn::cp16(kq + m * 16384 + (c16 >> 3) * 8192 + cfwd::swz(r, (c16 & 7) * 8), src, in);
        }
        gdn::cp_commit();
    } else if constexpr (H16) {   /* 16-byte pieces, zero past c and past K (K % 8 == 0) */
        const int64_t ld = (int64_t)p.H * K;
        cfwd::load_rows<256, LH>(Kh, static_cast<const H *>(p.k) + row0 * ld + (int64_t)h * K, ld, c, K, 0, tid, NT);
        cfwd::load_rows<256, LH>(Qh, static_cast<const H *>(p.q) + row0 * ld + (int64_t)h * K, ld, c, K, 0, tid, NT);
        gdn::cp_commit();
    } else {
        load_qk(p, p.q, nullptr, row0, c, h, Qs, lk);
        load_qk(p, p.k, nullptr, row0, c, h, Ks, lk);
    }
    if (tid < CC) {
        float g = graw, b = braw;
        if (on && p.g && (p.flags & GDN_GATE_FUSED)) g = -expf(p.A_log[j]) * gdn::softplus(g + (p.dt_bias ? p.dt_bias[j] : 0.f));
        if (on && (p.flags & GDN_BETA_SIGMOID)) b = ((p.flags & GDN_BETA_NEGATIVE) ? 2.f : 1.f) * gdn::sigmoid(b);
        gs[tid] = g;
        bs[tid] = b;
        rq[tid] = rqv;
        rk[tid] = rkv;
    }
    __syncthreads();
    if (tid < 32) {   /* the chunk cumsum in double (as the CPU's precision): a scan over warp 0, two tokens a lane */
        const double a0 = gs[2 * tid], a1 = gs[2 * tid + 1], ex = warp_pair_scan(a0, a1);
        gcd[2 * tid] = ex + a0;
        gcd[2 * tid + 1] = ex + a0 + a1;
    }
    __syncthreads();
    if (tid < CC) {
        reinterpret_cast<double *>(rec + R_GCD)[tid] = gcd[tid];
        rec[R_GAM + tid] = expf((float)gcd[tid]);
        rec[R_BETA + tid] = bs[tid];
        rec[R_G + tid] = gs[tid];
    }
    BP(0);
    /* A (strictly lower) into As, P into the record */
    if (WG) {   /* warpgroup 0: K K^T, warpgroup 1: Q K^T */
        gdn::cp_wait_all();
        cfwd::fence_async_smem();
        __syncthreads();
        const int lane = tid & 31, cg = tid >> 7, wl = (tid >> 5) & 3, g = lane >> 2, tq = lane & 3;
        float x[32];
        cfwd::wg_fence();
#pragma unroll
        for (int kk = 0; kk < 8; kk++) {
            const int off = (kk >> 2) * 8192 + (kk & 3) * 32;
            cfwd::wss64<0, 0>(x, cfwd::vdesc(kq + cg * 16384 + off), cfwd::vdesc(kq + off), kk);
        }
        cfwd::wg_commit();
        cfwd::wg_wait<0>();
        __syncthreads();   /* both products have read kq: As goes over it */
#pragma unroll
        for (int a = 0; a < 8; a++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int t = 16 * wl + g + 8 * (e >> 1), s = 8 * a + 2 * tq + (e & 1);
                if (cg == 0) As[t * RS + s] = s < t && t < c ? bs[t] * Ef(gcd, t, s) * ((rk[t] * rk[s]) * x[4 * a + e]) : 0.f;
                else x[4 * a + e] = s <= t && t < c ? (p.scale * ((rq[t] * rk[s]) * x[4 * a + e])) * Ef(gcd, t, s) : 0.f;
            }
        if (cg == 1)   /* P: fp32, or the bf16 tile (p.rec16) */
#pragma unroll
            for (int a = 0; a < 8; a++)
#pragma unroll
                for (int hr = 0; hr < 2; hr++) {
                    const int t = 16 * wl + g + 8 * hr, s = 8 * a + 2 * tq;
                    if (p.rec16) *reinterpret_cast<uint32_t *>(reinterpret_cast<char *>(rec + R_TM) + 8192 + cfwd::swz(t, s)) = M16::pack(x[4 * a + 2 * hr], x[4 * a + 2 * hr + 1]);
                    else *reinterpret_cast<float2 *>(rec + R_P + t * CC + s) = make_float2(x[4 * a + 2 * hr], x[4 * a + 2 * hr + 1]);
                }
    } else if constexpr (H16) {
        gdn::cp_wait_all();
        __syncthreads();
        const int lane = tid & 31, w = tid >> 5, g = lane >> 2, tq = lane & 3;
        const auto put_p = [&](int t, int s, float v) {
            if (p.rec16) *reinterpret_cast<__nv_bfloat16 *>(reinterpret_cast<char *>(rec + R_TM) + 8192 + cfwd::swz(t, s)) = __float2bfloat16_rn(v);
            else rec[R_P + t * CC + s] = v;
        };
        for (int b = w; b < 20; b += NT / 32) {   /* b < 10: K K^T's block l, else Q K^T's; block l = (I, J), J <= I */
            const bool qk = b >= 10;
            const int l = qk ? b - 10 : b, I = l < 1 ? 0 : l < 3 ? 1 : l < 6 ? 2 : 3, J = l - I * (I + 1) / 2;
            float acc[2][4] = {};
            const H *X = qk ? Qh : Kh;
            for (int kk = 0; kk < k16(K); kk += 16) {
                uint32_t af[4], bf[4];
                gdn::ldsm4(af, cfwd::frag_a(X, LH, 16 * I, kk, lane));
                gdn::ldsm4(bf, cfwd::frag_bn(Kh, LH, 16 * J, kk, lane));
                cfwd::mma_traits<H>::mma(acc[0], af, bf[0], bf[1]);
                cfwd::mma_traits<H>::mma(acc[1], af, bf[2], bf[3]);
            }
#pragma unroll
            for (int hn = 0; hn < 2; hn++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int t = 16 * I + g + 8 * (e >> 1), s = 16 * J + 8 * hn + 2 * tq + (e & 1);
                    const float x = acc[hn][e];
                    if (!qk) As[t * RS + s] = s < t && t < c ? bs[t] * Ef(gcd, t, s) * ((rk[t] * rk[s]) * x) : 0.f;
                    else put_p(t, s, s <= t && t < c ? (p.scale * ((rq[t] * rk[s]) * x)) * Ef(gcd, t, s) : 0.f);
                }
        }
        for (int e = tid; e < CC * CC; e += NT)   /* P's upper blocks (A's are never read) */
            if (((e & 63) >> 4) > (e >> 10)) put_p(e >> 6, e & 63, 0.f);
    } else {
        gdn::block_mm_s<SPLIT, false, false, EX, EX>(
            CC, CC, K, Ks, lk, Ks, lk,
            [&](int t, int s, float kk) { As[t * RS + s] = s < t && t < c ? bs[t] * Ef(gcd, t, s) * ((rk[t] * rk[s]) * kk) : 0.f; },
            gdn::full_k{});
        gdn::block_mm_s<SPLIT, false, false, EX, EX>(
            CC, CC, K, Qs, lk, Ks, lk,
            [&](int t, int s, float qk) {
                const float v = s <= t && t < c ? (p.scale * ((rq[t] * rk[s]) * qk)) * Ef(gcd, t, s) : 0.f;
                if (p.rec16) *reinterpret_cast<__nv_bfloat16 *>(reinterpret_cast<char *>(rec + R_TM) + 8192 + cfwd::swz(t, s)) = __float2bfloat16_rn(v);
                else rec[R_P + t * CC + s] = v;
            },
            gdn::full_k{});
    }
    __syncthreads();
    BP(1);
    /* Tm = (I + A)^-1 by 16 x 16 blocks: the diagonal blocks T_bb by
     * substitution in registers, a half-warp per block and a lane per column
     * (no barrier per row); then T_ab = -T_aa sum_{b<=e<a} A_ae T_eb for
     * a - b = 1, 2, 3 (each level needs only lower ones), the sums M through
     * Qs (free once P is stored; with WG past rk); the blocks above the diagonal 0 */
    {
        for (int e = tid; e < CC * CC; e += NT) Ts[(e >> 6) * RS + (e & 63)] = 0.f;
        const int o = 16 * (tid >> 4), col = tid & 15;
        float x[16];
        if (tid < 64) {   /* T_bb row r = e_r - sum_{s<r} A_bb[r][s] T_bb[s], s in order */
#pragma unroll
            for (int r = 0; r < 16; r++) x[r] = r == col ? 1.f : 0.f;
#pragma unroll
            for (int r = 1; r < 16; r++)
#pragma unroll
                for (int s2 = 0; s2 < r; s2++) x[r] -= As[(o + r) * RS + o + s2] * x[s2];
        }
        __syncthreads();   /* the zero fill done */
        if (tid < 64)
#pragma unroll
            for (int r = 0; r < 16; r++) Ts[(o + r) * RS + o + col] = x[r];
        __syncthreads();
        BP(2);
        float *M = WG ? rk + CC : Qs;   /* [3][16][16] */
        /* each thread a 2 x 2 tile of a block (rows i0, i0 + 1, columns j0,
         * j0 + 1): half the shared-memory loads of a lane an element (the
         * kernel is bound by them: ncu, L1 75 %); each element's sum in
         * the order of the loop over ee, then q, as one lane an element */
        const int bt = tid >> 6, i0 = 2 * ((tid >> 3) & 7), j0 = 2 * (tid & 7);
        for (int d = 1; d < 4; d++) {
            const int nb = 4 - d, a = bt + d;   /* blocks (a, b) = (b + d, b), b < nb */
            if (bt < nb) {
                float m00 = 0.f, m01 = 0.f, m10 = 0.f, m11 = 0.f;
                for (int ee = bt; ee < a; ee++)
#pragma unroll
                    for (int q = 0; q < 16; q++) {
                        const float a0 = As[(16 * a + i0) * RS + 16 * ee + q], a1 = As[(16 * a + i0 + 1) * RS + 16 * ee + q];
                        const float t0 = Ts[(16 * ee + q) * RS + 16 * bt + j0], t1 = Ts[(16 * ee + q) * RS + 16 * bt + j0 + 1];
                        m00 = fmaf(a0, t0, m00); m01 = fmaf(a0, t1, m01); m10 = fmaf(a1, t0, m10); m11 = fmaf(a1, t1, m11);
                    }
                M[(bt << 8) + i0 * 16 + j0] = m00; M[(bt << 8) + i0 * 16 + j0 + 1] = m01;
                M[(bt << 8) + (i0 + 1) * 16 + j0] = m10; M[(bt << 8) + (i0 + 1) * 16 + j0 + 1] = m11;
            }
            __syncthreads();
            if (bt < nb) {
                float m00 = 0.f, m01 = 0.f, m10 = 0.f, m11 = 0.f;
#pragma unroll
                for (int q = 0; q < 16; q++) {
                    const float a0 = Ts[(16 * a + i0) * RS + 16 * a + q], a1 = Ts[(16 * a + i0 + 1) * RS + 16 * a + q];
                    const float t0 = M[(bt << 8) + q * 16 + j0], t1 = M[(bt << 8) + q * 16 + j0 + 1];
                    m00 = fmaf(a0, t0, m00); m01 = fmaf(a0, t1, m01); m10 = fmaf(a1, t0, m10); m11 = fmaf(a1, t1, m11);
                }
                Ts[(16 * a + i0) * RS + 16 * bt + j0] = -m00; Ts[(16 * a + i0) * RS + 16 * bt + j0 + 1] = -m01;
                Ts[(16 * a + i0 + 1) * RS + 16 * bt + j0] = -m10; Ts[(16 * a + i0 + 1) * RS + 16 * bt + j0 + 1] = -m11;
            }
            __syncthreads();
        }
    }
    BP(3);
    if (p.rec16)   /* Tm as the bf16 tile */
        for (int e = tid; e < CC * CC / 2; e += NT) {
            const int r = e >> 5, s = 2 * (e & 31);
            *reinterpret_cast<uint32_t *>(reinterpret_cast<char *>(rec + R_TM) + cfwd::swz(r, s)) = M16::pack(Ts[r * RS + s], Ts[r * RS + s + 1]);
        }
    else
        for (int e = tid; e < CC * CC; e += NT) rec[R_TM + e] = Ts[(e / CC) * RS + e % CC];
    BP(4);
    BP_PRINT(slot == 0 && j == 0, "prep item: loads, gate | A, P | diagonal blocks | levels | Tm store", 5, 1);
}

int prep_smem(int K, bool wg, bool h16 = false) {
    return (wg    ? prep_qk_floats(true, 0) + 2 * CC + 4 * CC + 3 * 256
            : h16 ? prep_qk_floats_h() + 2 * CC * RS + 2 * CC + 4 * CC
                  : prep_qk_floats(false, ld4(k8(K))) + 2 * CC * RS + 2 * CC + 4 * CC) *
           (int)sizeof(float);
}
/* the 16-bit rows' instance takes the call (H16 above) */
bool prep_h16(const BwdArgs &p) { return p.dt != 0 && k8(p.K) > 128 && p.K % 8 == 0 && al16(p.q) && al16(p.k); }

}  // namespace

void slot_info_launch(const BwdArgs &p, cudaStream_t st) {
    slot_info_kernel<<<(unsigned)((p.nslots + NT - 1) / NT), NT, 0, st>>>(p);
}
template <bool SPLIT> cudaError_t PrepPass<SPLIT>::attr(int K) {
    cudaError_t e = smem_attr(prep_kernel<SPLIT, false, false>, prep_smem(K, false));
    if (e == cudaSuccess) e = smem_attr(prep_kernel<SPLIT, true, false>, prep_smem(K, false));
    if (e == cudaSuccess && k8(K) > 128) e = smem_attr(prep_kernel<SPLIT, true, false, __nv_bfloat16>, prep_smem(K, false, true));
    if (e == cudaSuccess && k8(K) > 128) e = smem_attr(prep_kernel<SPLIT, true, false, __half>, prep_smem(K, false, true));
    return e != cudaSuccess || K != 128 ? e : smem_attr(prep_kernel<SPLIT, true, true>, prep_smem(K, true));
}
template <bool SPLIT> void PrepPass<SPLIT>::launch(const BwdArgs &p, cudaStream_t st) {
    const dim3 grid((unsigned)(p.rw ? p.N * p.wn : p.nslots), (unsigned)p.HV);
    if (p.dt == 1 && p.K == 128 && al16(p.q) && al16(p.k)) prep_kernel<SPLIT, true, true><<<grid, NT, prep_smem(p.K, true), st>>>(p);
    else if (prep_h16(p) && p.dt == 1) prep_kernel<SPLIT, true, false, __nv_bfloat16><<<grid, NT, prep_smem(p.K, false, true), st>>>(p);
    else if (prep_h16(p)) prep_kernel<SPLIT, true, false, __half><<<grid, NT, prep_smem(p.K, false, true), st>>>(p);
    else if (p.dt != 0) prep_kernel<SPLIT, true, false><<<grid, NT, prep_smem(p.K, false), st>>>(p);   /* bf16 / f16: q, k exact in tf32 */
    else prep_kernel<SPLIT, false, false><<<grid, NT, prep_smem(p.K, false), st>>>(p);
}
template struct PrepPass<true>;

}  // namespace cbwd
}  // namespace gdn
