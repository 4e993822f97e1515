/* CUDA chunk forward, kernel 1 (the prep): per (sequence, chunk, q/k head)
 * the gates, the q and k rstd and T = (I + A)^-1 for each value head, left in
 * the workspace as the records the state kernels read (chunk_fwd.cuh); for
 * the backward's forward states (ChunkArgs::brec) also the backward's records
 * of its fused pass (chunk_bwd.cuh: the gates, Tm and P as bf16 tiles), so the
 * backward needs no prep of its own there; its launcher. */
#include "cuda/chunk_fwd.cuh"
#include "cuda/chunk_bwd.cuh"

namespace gdn {
namespace cfwd {
namespace {

/* gate, its cumsum inside the chunk and beta for value head j, rows past c
 * zero (so gc stays flat there); one warp, two tokens per lane. gd (or NULL):
 * the cumsum in double as the backward's prep forms it, gg the gate itself */
__device__ __forceinline__ void chunk_gate(const ChunkArgs &p, int64_t row0, int c, int j, float *gc, float *bt, double *gd = nullptr,
                                           float *gg = nullptr) {
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
    if (gd) {
        const double a0 = g2[0], a1 = g2[1], ex = cbwd::warp_pair_scan(a0, a1);
        gd[2 * lane] = ex + a0; gd[2 * lane + 1] = ex + a0 + a1;
        gg[2 * lane] = g2[0]; gg[2 * lane + 1] = g2[1];
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

template <int KT, bool BR = false> struct PrepSmem {
    static constexpr int LK = KT + 8, KB = CC * LK * 2, AB = CC * AF * 4;
    /* YS: the inverse's 16 x 8 products pass through shared memory (a
     * 128-float slice a warp at y), not shuffles: in the instances of four
     * blocks an SM, which registers bound, not shared memory (shuffles cost
     * them spills); the others fit six blocks an SM without it */
    static constexpr bool YS = KT > 128 || BR;
    static constexpr int k = 0, at0 = 0, at1 = KB > AB ? KB : AB, y = at1 + AB;   /* head 0's array over K */
    static constexpr int f = y + (YS ? 4 * 128 * 4 : 0), gd = f + 6 * CC * 4;   /* gc[2], bt[2], rk, rq; then BR's gcd[2], g[2] */
    static constexpr int bytes = gd + (BR ? 2 * CC * 12 : 0);
};

static_assert(6 * (PrepSmem<128>::bytes + 1024) <= 228 * 1024, "six prep blocks an SM at K = 128 (the launch bound)");

/* a 16 x 8 product Y of mma m16n8k8 (lane (g, tq) holds Y[g][2 tq + e] in
 * y[e], Y[g + 8][2 tq + e] in y[2 + e]) as the B operand of the next
 * m16n8k8 products over its 16 rows: yb[h][0] = Y[8 h + tq][g], yb[h][1] =
 * Y[8 h + tq + 4][g]. By shuffles: the lane holding Y[r][c] is 4 (r % 8) + c / 2 */
__device__ __forceinline__ void acc_as_b(const float (&y)[4], float (&yb)[2][2], int lane) {
    const int g = lane >> 2, tq = lane & 3, s0 = tq * 4 + (g >> 1), s1 = s0 + 16;
    const bool odd = (g & 1) != 0;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const float a0 = __shfl_sync(0xffffffffu, y[2 * h], s0), a1 = __shfl_sync(0xffffffffu, y[2 * h + 1], s0);
        const float b0 = __shfl_sync(0xffffffffu, y[2 * h], s1), b1 = __shfl_sync(0xffffffffu, y[2 * h + 1], s1);
        yb[h][0] = odd ? a1 : a0;
        yb[h][1] = odd ? b1 : b0;
    }
}

/* the lower 16 x 16 blocks (I, J) of K K^T dealt to the four warps: 3, 3, 2, 2 */
__device__ __forceinline__ int kkt_n(int w) { return w < 2 ? 3 : 2; }
__device__ __forceinline__ int kkt_i(int w, int b) { return w == 0 ? (b > 0) : w == 1 ? 2 : 3; }
__device__ __forceinline__ int kkt_j(int w, int b) { return w == 0 ? (b > 0 ? b - 1 : 0) : w == 3 ? 2 + b : b; }

/* X K^T on warp w's lower blocks (kkt_n, kkt_i, kkt_j) into acc, X's and K's
 * rows in shared memory ld elements apart (K K^T, and Q K^T for brec) */
template <int KT, int LD, typename M, typename E>
__device__ __forceinline__ void warp_xkt(float (&acc)[3][2][4], const E *X, const E *Ks, int w, int lane) {
    const int nb = kkt_n(w);
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
                ldsm4(af, frag_a(X, LD, kkt_i(w, b) * 16, kk * 16, lane));
                ldsm4(bf, frag_bn(Ks, LD, kkt_j(w, b) * 16, kk * 16, lane));
                M::mma(acc[b][0], af, bf[0], bf[1]);
                M::mma(acc[b][1], af, bf[2], bf[3]);
            }
}

/* warp_xkt's blocks scaled: acc_ts = (rr_t rc_s) acc_ts (row and column scales in shared memory) */
__device__ __forceinline__ void warp_scale(float (&acc)[3][2][4], const float *rr, const float *rc, int w, int lane) {
    const int g = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int b = 0; b < 3; b++) {
        const float r0 = rr[kkt_i(w, b) * 16 + g], r1 = rr[kkt_i(w, b) * 16 + g + 8];
#pragma unroll
        for (int hn = 0; hn < 2; hn++) {
            const float2 rs = *reinterpret_cast<const float2 *>(rc + kkt_j(w, b) * 16 + hn * 8 + 2 * tq);
            acc[b][hn][0] *= r0 * rs.x; acc[b][hn][1] *= r0 * rs.y; acc[b][hn][2] *= r1 * rs.x; acc[b][hn][3] *= r1 * rs.y;
        }
    }
}

template <int KT, typename E, bool BR>
__global__ void __launch_bounds__(PT, KT > 128 || BR ? 4 : 6) chunk_prep_kernel(ChunkArgs p, char *ws, int maxch) {
    using S = PrepSmem<KT, BR>;
    using M = mma_traits<E>;
    extern __shared__ __align__(16) char sm[];
    E *Ks = reinterpret_cast<E *>(sm + S::k);
    float *AT[2] = {reinterpret_cast<float *>(sm + S::at0), reinterpret_cast<float *>(sm + S::at1)};
    float *gcs = reinterpret_cast<float *>(sm + S::f), *bts = gcs + 2 * CC, *rk = bts + 2 * CC, *rq = rk + CC;
    double *gds = BR ? reinterpret_cast<double *>(sm + S::gd) : nullptr;   /* BR: the heads' gcd, then their g */
    float *ggs = BR ? reinterpret_cast<float *>(sm + S::gd + 2 * CC * 8) : nullptr;
    const int tid = threadIdx.x, lane = tid & 31, w = __shfl_sync(0xffffffffu, tid >> 5, 0), g = lane >> 2, tq = lane & 3;
    const int i = blockIdx.x % maxch + p.w0, h = (blockIdx.x / maxch) % p.H, n = blockIdx.x / (maxch * p.H);
    if (walk_skipped(p)) return;   /* the backward's checkpoint walk, the forward's checkpoints there */
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
    /* q as well where its rows fit head 1's array (free until the A fill):
     * for its rstd (the L2 norm) and BR's Q K^T, else not read */
    constexpr bool QS = CC * S::LK * 2 <= CC * AF * 4;
    E *Qs = reinterpret_cast<E *>(sm + S::at1);
    if (QS && (l2 || BR))
        load_rows<KT, S::LK>(Qs, static_cast<const E *>(p.q) + (row0 * p.H + h) * p.K, (int64_t)p.H * p.K, c, p.K, 0, tid, PT);
    cp_commit();
    /* while they land: the first two heads' gates (warps 2, 3) */
    if (w >= 2 && w - 2 < p.G)
        chunk_gate(p, row0, c, h * p.G + w - 2, gcs + (w - 2) * CC, bts + (w - 2) * CC, BR ? gds + (w - 2) * CC : nullptr,
                   BR ? ggs + (w - 2) * CC : nullptr);
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
    warp_xkt<KT, S::LK, M>(acc, Ks, Ks, w, lane);
    /* BR: raw Q K^T on the same blocks (P of the backward's records), while q is in head 1's array */
    float qk[BR ? 3 : 1][2][4];
    if constexpr (BR) warp_xkt<KT, S::LK, M>(qk, Qs, Ks, w, lane);
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
    warp_scale(acc, rk, rk, w, lane);
    if constexpr (BR) warp_scale(qk, rq, rk, w, lane);   /* (rq_t rk_s) (q_t . k_s), as the backward's prep groups it */
    float *Yw = reinterpret_cast<float *>(sm + S::y) + w * 128;   /* YS */
    for (int jb = 0; jb < p.G; jb += 2) {
        const int nh = p.G - jb < 2 ? p.G - jb : 2;
        if (jb > 0) {
            if (w < nh)
                chunk_gate(p, row0, c, h * p.G + jb + w, gcs + w * CC, bts + w * CC, BR ? gds + w * CC : nullptr,
                           BR ? ggs + w * CC : nullptr);
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
                float yb[2][2];
                if constexpr (S::YS) {
                    __syncwarp();
                    Yw[g * 8 + 2 * tq] = y[0]; Yw[g * 8 + 2 * tq + 1] = y[1];
                    Yw[(g + 8) * 8 + 2 * tq] = y[2]; Yw[(g + 8) * 8 + 2 * tq + 1] = y[3];
                    __syncwarp();
                } else {
                    acc_as_b(y, yb, lane);
                }
                float z[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                for (int kk = 0; kk < 16; kk += 8) {
                    const float *tp = A + (bi * 16 + kk + tq) * AF + bi * 16 + g;   /* T_ii[g (+8)][kk + tq (+4)] */
                    const uint32_t af[4] = {__float_as_uint(tp[0]), __float_as_uint(tp[8]), __float_as_uint(tp[4 * AF]),
                                            __float_as_uint(tp[4 * AF + 8])};
                    if constexpr (S::YS) mma_tf32(z, af, tf32(Yw[(kk + tq) * 8 + g]), tf32(Yw[(kk + tq + 4) * 8 + g]));
                    else mma_tf32(z, af, tf32(yb[kk / 8][0]), tf32(yb[kk / 8][1]));
                }
                const int r0 = bi * 16 + g, c0 = n0 + 2 * tq;
                A[c0 * AF + r0] = tf32f(-z[0]); A[(c0 + 1) * AF + r0] = tf32f(-z[1]);
                A[c0 * AF + r0 + 8] = tf32f(-z[2]); A[(c0 + 1) * AF + r0 + 8] = tf32f(-z[3]);
            }
            __syncthreads();
        }
        /* the records: T blocked (zero above the diagonal), then the per-token rows (not where the
         * states walk that reads them does nothing: brec's window whose states the forward kept) */
        const bool walked = !(BR && states_kept(p));
        for (int hh = 0; hh < (walked ? nh : 0); hh++) {
            const float *A = AT[hh];
            char *rec = ws + (rec_slot(p, bos, n, i) * p.HV + h * p.G + jb + hh) * (int64_t)REC;
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
        for (int x = tid; x < (walked ? nh * CC : 0); x += PT) {
            const int hh = x / CC, t = x % CC;
            const float *gc = gcs + hh * CC;
            float *recf = reinterpret_cast<float *>(ws + (rec_slot(p, bos, n, i) * p.HV + h * p.G + jb + hh) * (int64_t)REC + REC_T);
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
        if constexpr (BR)   /* the backward's records of the pair (cbwd::prep_kernel's; Tm and P as tiles or fp32) */
            for (int hh = 0; hh < nh; hh++) {
                const float *A = AT[hh];
                const double *gd = gds + hh * CC;
                float *br = p.brec + (rec_slot(p, bos, n, i) * p.HV + h * p.G + jb + hh) * (int64_t)cbwd::REC;
                char *tile = reinterpret_cast<char *>(br + cbwd::R_TM);   /* brec16: Tm, then P 8 KB after it: bf16, swz */
                if (tid < CC) {
                    reinterpret_cast<double *>(br + cbwd::R_GCD)[tid] = gd[tid];
                    br[cbwd::R_GAM + tid] = expf((float)gd[tid]);
                    br[cbwd::R_BETA + tid] = bts[hh * CC + tid];
                    br[cbwd::R_G + tid] = ggs[hh * CC + tid];
                }
                for (int e = tid; e < CC * CC / 2; e += PT) {   /* Tm = T (T[r][s] at A[s][r]); P's upper blocks zero */
                    const int r = e >> 5, s = 2 * (e & 31);
                    const float t0 = s <= r ? A[s * AF + r] : 0.f, t1 = s + 1 <= r ? A[(s + 1) * AF + r] : 0.f;
                    const bool up = (s >> 4) > (r >> 4);
                    if (p.brec16) {
                        *reinterpret_cast<uint32_t *>(tile + swz(r, s)) = M::pack(t0, t1);
                        if (up) *reinterpret_cast<uint32_t *>(tile + 8192 + swz(r, s)) = 0u;
                    } else {
                        *reinterpret_cast<float2 *>(br + cbwd::R_TM + r * CC + s) = make_float2(t0, t1);
                        if (up) *reinterpret_cast<float2 *>(br + cbwd::R_P + r * CC + s) = make_float2(0.f, 0.f);
                    }
                }
#pragma unroll
                for (int b = 0; b < 3; b++)   /* P_ts = (scale (rq_t rk_s) q_t . k_s) exp(gcd_t - gcd_s), s <= t < c */
                    if (b < nb)
#pragma unroll
                        for (int hn = 0; hn < 2; hn++)
#pragma unroll
                            for (int hr = 0; hr < 2; hr++) {
                                const int t = kkt_i(w, b) * 16 + g + 8 * hr, s = kkt_j(w, b) * 16 + hn * 8 + 2 * tq;
                                const float v0 = s <= t && t < c ? (p.scale * qk[b][hn][2 * hr]) * cbwd::Ef(gd, t, s) : 0.f;
                                const float v1 = s + 1 <= t && t < c ? (p.scale * qk[b][hn][2 * hr + 1]) * cbwd::Ef(gd, t, s + 1) : 0.f;
                                if (p.brec16) *reinterpret_cast<uint32_t *>(tile + 8192 + swz(t, s)) = M::pack(v0, v1);
                                else *reinterpret_cast<float2 *>(br + cbwd::R_P + t * CC + s) = make_float2(v0, v1);
                            }
            }
        __syncthreads();
    }
}

}  // namespace

template <int KT, typename E> cudaError_t PrepPass<KT, E>::attr() {
    static bool done = false;
    const cudaError_t e = smem_attr(chunk_prep_kernel<KT, E, false>, PrepSmem<KT>::bytes, &done);
    if constexpr (KT == 128 && mma_traits<E>::bf) {   /* the instance that writes brec */
        static bool done_br = false;
        if (e == cudaSuccess) return smem_attr(chunk_prep_kernel<KT, E, true>, PrepSmem<KT, true>::bytes, &done_br);
    }
    return e;
}
template <int KT, typename E>
void PrepPass<KT, E>::launch(const ChunkArgs &p, int64_t N, int maxch, char *ws, cudaStream_t st) {
    const unsigned blocks = (unsigned)(N * p.H * maxch);
    if constexpr (KT == 128 && mma_traits<E>::bf)
        if (p.brec) {   /* launch_k's caller asks for brec only with bf16, K = 128 */
            chunk_prep_kernel<KT, E, true><<<blocks, PT, PrepSmem<KT, true>::bytes, st>>>(p, ws, maxch);
            return;
        }
    chunk_prep_kernel<KT, E, false><<<blocks, PT, PrepSmem<KT>::bytes, st>>>(p, ws, maxch);
}
template struct PrepPass<64, __nv_bfloat16>;
template struct PrepPass<128, __nv_bfloat16>;
template struct PrepPass<256, __nv_bfloat16>;
template struct PrepPass<64, __half>;
template struct PrepPass<128, __half>;
template struct PrepPass<256, __half>;

}  // namespace cfwd
}  // namespace gdn
