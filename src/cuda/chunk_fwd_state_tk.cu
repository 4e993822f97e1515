/* CUDA chunk forward, kernel 2tk (the state walk transposed at K = 256: whole
 * 64-column blocks of V, q, k and v by the TMA; the forward's walk, with or
 * without the backward's checkpoints, and the backward's states walk, over
 * whole sequences or a window; not the split): S^T split over K between two
 * warpgroups, their sums over K met in shared memory; its launcher. */
#include "cuda/chunk_fwd.cuh"

namespace gdn {
namespace cfwd {
namespace {

/* ---- kernel 2tk: per (sequence, value head, 64 columns of V) the state walk
 * of kernel 2t (chunk_fwd_state_t.cu) at K = 256. One warpgroup cannot hold a
 * 64 x 256 S^T beside its products' fragments (128 registers of state alone),
 * so warpgroup cg holds S^T's K columns [128 cg, 128 cg + 128) and forms its
 * part of the sums over K:
 *   [X | O]^T_cg = S^T_cg [K; Q]_cg^T      (S as hi + lo for bf16; the lo
 *                                           half from shared memory, below)
 * The two parts meet in shared memory (fp32, in the accumulator's order: a
 * float4 a thread a row of 128, no bank met twice), X^T = X0 + X1 in both
 * (the same bits: one addition of the same two values), O^T's in warpgroup 0.
 * For bf16 the lo half of S^T is the A operand from shared memory (stored by
 * stmatrix into the warpgroup's part before the part is), so only the hi
 * fragments live in registers: with both there ptxas serialized every wgmma.
 * Then both form R^T = beta V^T - b X^T and U^T = R^T T^T (the same values in
 * both) and update their own columns, S^T_cg = exp(gL) S^T_cg + (cu U)^T K_cg
 * (U as hi + lo for bf16). Warpgroup 1 forms P = Q K^T (masked, scaled)
 * beside its U and hands it to warpgroup 0 on an mbarrier before it issues
 * its state products: P's 32 accumulators are dead by then, which keeps
 * ptxas from serializing the f16 kernel's wgmma (bench/NOTES.md v5.53). One
 * P buffer: P is written after the meeting, which warpgroup 0 reaches only
 * when done with the last chunk's P. Warpgroup 0 forms O^T = co O^T + U^T
 * P^T, staged through the chunk's first q block (its last reader, warpgroup
 * 1's P, is done before the mbarrier warpgroup 0 waits on) and stored. The
 * parts meet on CTA mbarriers: each warpgroup's threads arrive when its part
 * is stored (stored[cg]) and when they have read the other's (read[cg ^ 1]),
 * and a warpgroup writes its part again only after the other has read it
 * (racecheck reported warpgroup 0's stores against warpgroup 1's loads
 * across __syncthreads and named barriers; it takes an mbarrier that every
 * writer arrives at: bench/NOTES.md v5.55). q, k and v come by the TMA
 * in the 128-byte swizzle and the record by one bulk copy, two chunks
 * ahead. ---- */
constexpr int TK = 256;   /* threads: two warpgroups */
struct KStage {           /* one chunk's inputs; 1024-byte aligned pieces for the swizzle */
    static constexpr int kq = 0;          /* [k cols 64 b .. + 63][q cols 64 b .. + 63] for b = 0..3, 64 rows x 128 B each */
    static constexpr int v = 65536;       /* the block's 64 columns of v */
    static constexpr int rec = 73728;     /* T blocked, then the per-token rows */
    static constexpr int bytes = rec + REC;
};
struct KSmem {
    static constexpr int p = 2 * KStage::bytes;       /* P blocked, C x C (warpgroup 1 forms it, warpgroup 0 reads it) */
    static constexpr int x0 = p + CC * CC * 2;        /* the parts: X^T of warpgroup 0, of warpgroup 1, O^T of warpgroup 1 (x0, x1: before that, bf16's lo tiles) */
    static constexpr int x1 = x0 + 16384, o1 = x1 + 16384;
    static constexpr int mb = o1 + 16384;             /* mbarriers full[2], pready, stored[2], read[2]; then cnt[2] */
    static constexpr int bytes = mb + 7 * 8 + 2 * 4 + 1024;   /* + the base's alignment */
};
static_assert(KSmem::bytes <= 227 * 1024, "the K = 256 transposed state kernel's shared memory fits an SM");
static_assert(KStage::bytes % 1024 == 0, "stages keep the swizzle's alignment");

/* a warpgroup's 32 fp32 values a thread to / from a 16 KB part (row q of 128 float4) */
__device__ __forceinline__ void part_put(char *at, const float *x, int t) {
#pragma unroll
    for (int q = 0; q < 8; q++)
        *reinterpret_cast<float4 *>(at + (q * 128 + t) * 16) = make_float4(x[4 * q], x[4 * q + 1], x[4 * q + 2], x[4 * q + 3]);
}
__device__ __forceinline__ void part_add(const char *at, float *x, int t) {
#pragma unroll
    for (int q = 0; q < 8; q++) {
        const float4 v = *reinterpret_cast<const float4 *>(at + (q * 128 + t) * 16);
        x[4 * q] += v.x; x[4 * q + 1] += v.y; x[4 * q + 2] += v.z; x[4 * q + 3] += v.w;
    }
}

/* ST: the backward's states mode (p.smode, whole sequences or a window):
 * each chunk's entering state stored where p.states is not NULL; no q, P or
 * o (X^T = S^T K^T alone, so warpgroup 1 stores no O part). CK: the forward
 * storing the backward's checkpoints (p.ckpt). Separate instances, so the
 * forward's code is untouched */
template <typename E, bool ST, bool CK>
__global__ void __launch_bounds__(TK, 1) chunk_state_tk_kernel(ChunkArgs p, const char *ws, const __grid_constant__ TmaMaps tm) {
    using M = mma_traits<E>;
    constexpr int NS = M::split ? 2 : 1;
    constexpr bool LO = M::split && !ST;   /* bf16's lo half of S^T in the warpgroup's part before the part (X and O's products) */
    extern __shared__ __align__(1024) char smk_raw[];
    char *sm = smk_raw + ((1024 - (saddr(smk_raw) & 1023)) & 1023);
    uint64_t *full = reinterpret_cast<uint64_t *>(sm + KSmem::mb);
    uint64_t *pready = full + 2;   /* P stored (128 arrivals a chunk, warpgroup 1's threads) */
    uint64_t *stored = full + 3;   /* [c]: warpgroup c's part stored (128 arrivals a chunk, its threads) */
    uint64_t *read = full + 5;     /* [c]: warpgroup c's part read by the other (128 arrivals a chunk) */
    int *cnt = reinterpret_cast<int *>(sm + KSmem::mb + 56);
    E *Ps = reinterpret_cast<E *>(sm + KSmem::p);
    const int tid = threadIdx.x, lane = tid & 31, w = __shfl_sync(0xffffffffu, tid >> 5, 0), g = lane >> 2, tq = lane & 3;
    const int cg = w >> 2, wl = w & 3, t7 = tid & 127;   /* warpgroup (K half), warp in it (16 rows of S^T) */
    const int vb = blockIdx.x % p.nvb, j = (blockIdx.x / p.nvb) % p.HV, n = blockIdx.x / (p.nvb * p.HV), h = j / p.G;
    int64_t bos, len;
    seq_range(p, n, &bos, &len);
    const int nch_all = (int)((len + CC - 1) / CC);
    int i0, nch;   /* chunks [i0, nch): the sequence, or the backward's window */
    if (!ST && p.tag && blockIdx.x == 0 && tid == 0) {   /* before any return: every forward sets the tags */
        p.tag[0] = p.tag_val; p.tag[1] = p.mtag_val; p.tag[2] = p.ktag_val;
    }
    if constexpr (ST) {
        if (!walk_range(p, 0, nch_all, &i0, &nch) || walk_skipped(p) || states_kept(p)) return;
    } else {
        i0 = 0; nch = nch_all;   /* the forward: whole sequences */
    }
    const int vcol0 = vb * 64, d0 = vcol0 + wl * 16 + g, k0 = cg * 128;   /* this thread's rows of S^T: d0, d0 + 8 */
    const int64_t sbase = ((int64_t)n * p.HV + j) * p.K * p.V;

    auto fetch = [&](int i) {   /* chunk i into stage (i - i0) & 1, by thread 0 */
        char *stg = sm + ((i - i0) & 1) * KStage::bytes;
        uint64_t *mb = full + ((i - i0) & 1);
        const int row0 = (int)(bos + (int64_t)i * CC);
        mb_expect(mb, KStage::bytes - (ST ? 4 * 8192 : 0));   /* ST: no q */
#pragma unroll
        for (int b = 0; b < 4; b++) {
            tma_rows(stg + KStage::kq + b * 16384, &tm.k, 64 * b, h, row0, mb);
            if (!ST) tma_rows(stg + KStage::kq + b * 16384 + 8192, &tm.q, 64 * b, h, row0, mb);
        }
        tma_rows(stg + KStage::v, &tm.v, vcol0, j, row0, mb);
        bulk_copy(stg + KStage::rec, ws + (rec_slot(p, bos, n, i) * p.HV + j) * (int64_t)REC, REC, mb);
    };

    /* the backward's states mode starts from a state the kernel before it may have written
     * (a checkpoint, or the split's h0 rows from its folds): that kernel first */
    if (ST) asm volatile("griddepcontrol.wait;" ::: "memory");
    /* S^T: st[4 i + e] = S[k = k0 + 8 i + 2 tq + (e & 1)][d0 + 8 (e >> 1)] (from h0 or 0: not the prep's) */
    float st[64];
#pragma unroll
    for (int i = 0; i < 16; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) st[4 * i + e] = state_in(p, false, 0, 0, j, sbase, k0 + 8 * i + 2 * tq + (e & 1), d0 + 8 * (e >> 1));
    if (tid == 0) {
        mb_init(full); mb_init(full + 1);
#pragma unroll
        for (int b = 0; b < 5; b++) asm volatile("mbarrier.init.shared::cta.b64 [%0], 128;" ::"r"(saddr(pready + b)) : "memory");
        cnt[0] = cnt[1] = 0;
    }
    __syncthreads();
    /* a programmatic launch comes here while the prep runs: its records from now on */
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (tid == 0) {
        if (i0 < nch) fetch(i0);
        if (i0 + 1 < nch) fetch(i0 + 1);
    }
    const int lm = lane >> 3, lr = lane & 7;   /* this lane's 8 x 8 matrix and row in it: P's and O's stmatrix addresses */
    /* the chunks in runs between the backward's checkpoints (CK; else one run), each
     * checkpoint stored before its run, out of the chunk loop's code */
    for (int ib = i0; ib < nch;) {
        const int ie = CK ? ckpt_end(p, ib, nch) : nch;
        if (CK)
            if (float *ck = ckpt_of(p, ib, sbase)) {   /* a checkpoint for the backward's windows (h0's layout) */
#pragma unroll
                for (int q = 0; q < 16; q++)
#pragma unroll
                    for (int e = 0; e < 4; e++) ck[state_at(p, 0, p.V, k0 + 8 * q + 2 * tq + (e & 1), d0 + 8 * (e >> 1))] = st[4 * q + e];
            }
        for (int i = ib; i < ie; i++) {
            const int sl = (i - i0) & 1;
            const uint32_t par = ((i - i0) >> 1) & 1;
            char *stg = sm + sl * KStage::bytes;
            const E *KQ = reinterpret_cast<const E *>(stg + KStage::kq);
            const char *Vb = stg + KStage::v;
            const E *Ts = reinterpret_cast<const E *>(stg + KStage::rec);
            const float *F = reinterpret_cast<const float *>(stg + KStage::rec + REC_T);
            const int64_t row0 = bos + (int64_t)i * CC;
            const int c = len - (int64_t)i * CC < CC ? (int)(len - (int64_t)i * CC) : CC;
            if (ST && p.states) {   /* the state entering chunk i, this thread's part */
                float *sd = p.states + (rec_slot(p, bos, n, i) * p.HV + j) * (int64_t)p.K * p.V;
#pragma unroll
                for (int q = 0; q < 16; q++)
#pragma unroll
                    for (int e = 0; e < 4; e++) sd[(int64_t)(k0 + 8 * q + 2 * tq + (e & 1)) * p.V + d0 + 8 * (e >> 1)] = st[4 * q + e];
            }
            mb_wait(full + sl, par);
            if (c < CC) {   /* a sequence's last chunk: k and v rows past it to zero (another sequence's) */
                for (int x = tid; x < (CC - c) * 8 * 5; x += TK) {
                    const int part = x / ((CC - c) * 8), y = x % ((CC - c) * 8);
                    char *base = part < 4 ? stg + KStage::kq + part * 16384 : stg + KStage::v;
                    *reinterpret_cast<uint4 *>(base + (c + y / 8) * 128 + (y % 8) * 16) = make_uint4(0, 0, 0, 0);
                }
                fence_async_smem();
                gdn::bar_named(1, TK);
            }

            /* ---- this warpgroup's part of [X | O]^T = S^T [K; Q]^T (ST: X^T = S^T K^T, the first 64 columns of the same B tile) ---- */
            float xo[ST ? 32 : 64];
            {
                if constexpr (LO) {
                    static_assert(M::bf, "wss128 is the bf16 form");
                    /* bf16: S^T's lo half as the A operand from shared memory (the warpgroup's part's
                     * 16 KB, free until the part is stored: K-major, two 64-column blocks in the
                     * 128-byte swizzle), so only the hi fragments live in registers */
                    char *slo = sm + (cg ? KSmem::x1 : KSmem::x0);
                    uint32_t sa[8][4];
                    if (i > i0) mb_wait(read + cg, (uint32_t)((i - i0 - 1) & 1));   /* the part read in the chunk before */
#pragma unroll
                    for (int kk = 0; kk < 8; kk++) {
                        uint32_t lo[4];
                        afrag_hilo<M>(sa[kk], lo, st, kk);
                        stsm4(slo + (kk >> 2) * 8192 + swz(wl * 16 + 8 * (lm & 1) + lr, (16 * kk + 8 * (lm >> 1)) & 63), lo[0], lo[1], lo[2], lo[3]);
                    }
                    fence_async_smem();
                    gdn::bar_named(4 + cg, 128);   /* the warpgroup's lo half stored */
                    wg_fence();
#pragma unroll
                    for (int kk = 0; kk < 8; kk++) {
                        const int kg = cg * 8 + kk;
                        const uint64_t db = desc_off(desc_sw128(KQ, 16), (int)sizeof(*KQ) * ((kg >> 2) * 8192 + (kg & 3) * 16));
                        wgt_rs<128, M::bf, 0>(xo, sa[kk], db, kk);
                        wss128<0, 0>(xo, desc_off(desc_sw128(slo, 16), (int)sizeof(E) * ((kk >> 2) * 4096 + (kk & 3) * 16)), db, 1);
                    }
                    wg_commit();
                    wg_wait<0>();
                    gdn::bar_named(4 + cg, 128);   /* every warp's products done reading the lo tile before part_put (each warp writes all rows) */
                } else {
                    uint32_t sa[8][NS][4];
#pragma unroll
                    for (int kk = 0; kk < 8; kk++) afrag_hilo<M>(sa[kk][0], sa[kk][NS - 1], st, kk);
                    wg_fence();
#pragma unroll
                    for (int kk = 0; kk < 8; kk++) {
                        const int kg = cg * 8 + kk;
                        const uint64_t db = desc_off(desc_sw128(KQ, 16), (int)sizeof(*KQ) * ((kg >> 2) * 8192 + (kg & 3) * 16));
                        wgt_rs<ST ? 64 : 128, M::bf, 0>(xo, sa[kk][0], db, kk);
                        if (M::split) wgt_rs<ST ? 64 : 128, M::bf, 0>(xo, sa[kk][1], db, 1);
                    }
                    wg_commit();
                    wg_wait<0>();
                }
            }
            /* ---- the parts meet: X^T whole in both, O^T's in warpgroup 0 ---- */
            if (!LO && i > i0) mb_wait(read + cg, (uint32_t)((i - i0 - 1) & 1));   /* the part read in the chunk before */
            if (cg == 0) {
                part_put(sm + KSmem::x0, xo, t7);
            } else {
                part_put(sm + KSmem::x1, xo, t7);
                if constexpr (!ST) part_put(sm + KSmem::o1, xo + 32, t7);
            }
            mb_arrive(stored + cg);
            mb_wait(stored + (cg ^ 1), (uint32_t)((i - i0) & 1));
            if (cg == 0) {
                part_add(sm + KSmem::x1, xo, t7);
                if constexpr (!ST) part_add(sm + KSmem::o1, xo + 32, t7);
            } else {
                part_add(sm + KSmem::x0, xo, t7);
            }
            mb_arrive(read + (cg ^ 1));
            uint32_t vt[8][2];
            vt_frags(vt, Vb, wl, lane);
            /* ---- R^T = beta V^T - b X^T; U^T = R^T T^T ---- */
            float u[32];
            u_issue<M>(u, xo, vt, F, Ts, tq);
            /* warpgroup 1: P = Q K^T behind U (its operands in shared memory); warpgroup 0: O^T = co Q S (per token) */
            float o[32], pa[32];
            if constexpr (ST) wg_wait<0>();
            else if (cg == 1) {
#pragma unroll
                for (int kg = 0; kg < 16; kg++)
                    wss64<0, 0, M::bf>(pa, desc_off(desc_sw128(KQ, 16), (int)sizeof(*KQ) * (4096 + (kg >> 2) * 8192 + (kg & 3) * 16)),
                                       desc_off(desc_sw128(KQ, 16), (int)sizeof(*KQ) * ((kg >> 2) * 8192 + (kg & 3) * 16)), kg);
                wg_commit();
                wg_wait<0>();   /* U and P done */
                /* P (rows t of this warp, all 64 columns s): masked, scaled, to shared memory */
                float pv[8][4];
                p_masked<8>(pv, pa, F, p.scale, wl * 16 + g, 0, tq);
#pragma unroll
                for (int a = 0; a < 8; a += 2)
                    stsm4(Ps + blk64(wl * 16 + 8 * (lm & 1) + lr, 8 * (a + (lm >> 1))), M::pack(pv[a][0], pv[a][1]), M::pack(pv[a][2], pv[a][3]),
                          M::pack(pv[a + 1][0], pv[a + 1][1]), M::pack(pv[a + 1][2], pv[a + 1][3]));
                fence_async_smem();   /* for warpgroup 0's products */
                mb_arrive(pready);    /* each thread's stores released (an mbarrier: racecheck sees it, bench/racecheck_handoff_model.cu) */
            } else {
                o_scaled(o, xo + 32, F, tq);
                wg_wait<0>();
            }
            /* ---- O^T += U^T P^T (warpgroup 0); S^T_cg = exp(gL) S^T_cg + (cu U)^T K_cg ---- */
            {
                uint32_t ua[4][4], ud[4][NS][4];
                if (!ST && cg == 0)
#pragma unroll
                    for (int kk = 0; kk < 4; kk++) afrag<M>(ua[kk], u, kk);
                state_step_operands<M, NS>(ud, u, st, F, tq);
                wg_fence();
#pragma unroll
                for (int kk = 0; kk < 4; kk++) {
                    const uint64_t db = desc_off(desc_sw128(KQ, 16384), (int)sizeof(*KQ) * (cg * 16384 + kk * 16 * 64));
                    wgt_rs<128, M::bf, 1>(st, ud[kk][0], db, 1);
                    if (M::split) wgt_rs<128, M::bf, 1>(st, ud[kk][1], db, 1);
                }
                wg_commit();
                if (!ST && cg != 1) {   /* warpgroup 0 */
                    mb_wait(pready, (uint32_t)((i - i0) & 1));   /* P of this chunk stored */
                    wg_fence();
#pragma unroll
                    for (int kk = 0; kk < 4; kk++) wgt_rs<64, M::bf, 0>(o, ua[kk], desc_off(desc_blk(Ps), (int)sizeof(*Ps) * (kk * 128)), 1);
                    wg_commit();
                    wg_wait<0>();
                }
            }
            /* O rows of this chunk (warpgroup 0): transposed into the chunk's first q block (128-byte rows
             * in the 128-byte swizzle; free: warpgroup 1's P, its last reader, completed before P's
             * mbarrier), then 16 bytes a thread */
            if (!ST && cg == 0) {
                char *Os = stg + KStage::kq + 8192;
#pragma unroll
                for (int a = 0; a < 8; a += 2) {
                    const int tok = 8 * (a + (lm >> 1)) + lr;
                    stsm4t(Os + tok * 128 + (((2 * wl + (lm & 1)) ^ lr) << 4), M::pack(o[4 * a], o[4 * a + 1]), M::pack(o[4 * a + 2], o[4 * a + 3]),
                           M::pack(o[4 * a + 4], o[4 * a + 5]), M::pack(o[4 * a + 6], o[4 * a + 7]));
                }
                fence_async_smem();   /* the staging's generic writes before the TMA refills the stage (here: not behind O's global stores) */
                gdn::bar_named(2, 128);
                for (int x = t7; x < c * 8; x += 128) {
                    const int r = x >> 3, c8 = (x & 7) * 8;
                    *reinterpret_cast<uint4 *>(static_cast<E *>(p.o) + ((row0 + r) * p.HV + j) * p.V + vcol0 + c8) =
                        *reinterpret_cast<const uint4 *>(Os + r * 128 + (((x & 7) ^ (r & 7)) << 4));
                }
            }
            wg_wait<0>();
            gdn::bar_named(2 + cg, 128);   /* this warpgroup is done with the stage (and its O rows) */
            if (t7 == 0 && (atomicAdd(cnt + sl, 1) & 1) && i + 2 < nch) fetch(i + 2);   /* the second one refills */
        }
        ib = ie;
    }
    /* the final state: ht (the sequence's last chunk walked, or the backward's window) */
    if (float *dst = ST ? state_dst(p, false, 0, j, nch == nch_all || p.wn) : p.ht) {
#pragma unroll
        for (int i = 0; i < 16; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) dst[state_at(p, sbase, p.V, k0 + 8 * i + 2 * tq + (e & 1), d0 + 8 * (e >> 1))] = st[4 * i + e];
    }
}

}  // namespace

template <typename E> cudaError_t StateTKPass<E>::attr() {
    static bool done = false, done_st = false, done_ck = false;
    cudaError_t e = smem_attr(chunk_state_tk_kernel<E, false, false>, KSmem::bytes, &done);
    if (e == cudaSuccess) e = smem_attr(chunk_state_tk_kernel<E, true, false>, KSmem::bytes, &done_st);
    return e != cudaSuccess ? e : smem_attr(chunk_state_tk_kernel<E, false, true>, KSmem::bytes, &done_ck);
}
template <typename E>
cudaError_t StateTKPass<E>::launch(const ChunkArgs &p, unsigned blocks, const char *ws, const TmaMaps &tm, cudaStream_t st) {
    /* a programmatic dependent of the prep */
    auto *k = p.smode ? chunk_state_tk_kernel<E, true, false> : p.ckpt ? chunk_state_tk_kernel<E, false, true> : chunk_state_tk_kernel<E, false, false>;
    return launch_dependent(k, blocks, TK, KSmem::bytes, st, p, ws, tm);
}
template struct StateTKPass<__nv_bfloat16>;
template struct StateTKPass<__half>;

}  // namespace cfwd
}  // namespace gdn
