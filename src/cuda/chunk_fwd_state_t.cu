/* CUDA chunk forward, kernel 2t (the state walk transposed: K = 128, whole
 * 128-column blocks of V, q, k and v by the TMA): S^T in the registers of two
 * warpgroups as the A operand of every state product; its launcher, which
 * makes each pass a programmatic dependent of the kernel before it. */
#include "cuda/chunk_fwd.cuh"

namespace gdn {
namespace cfwd {
namespace {

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
    /* the instances that store tiles (ST, CK): the states' bf16 tiles on their way out
     * (put_tile), [2 stages][2 warpgroups] x 16 KB (the others keep the L1 that room leaves) */
    static constexpr int tl = (mb + 4 * 8 + 2 * 4 + 1023) / 1024 * 1024;
    static constexpr int bytes_tl = tl + 4 * 16384 + 1024;
};
static_assert(TSmem::bytes_tl <= 227 * 1024, "the transposed state kernel's shared memory fits an SM");
static_assert(TStage::bytes % 1024 == 0, "stages keep the swizzle's alignment");

/* The two warpgroups take turns at the tensor cores: each issues a batch of
 * products only after the other has issued its previous one (named barriers 5
 * and 6), so one's epilogue runs while the other's products do. */
__device__ __forceinline__ void wg_turn(int cg) { asm volatile("bar.sync %0, 256;" ::"r"(5 + cg) : "memory"); }
__device__ __forceinline__ void wg_pass(int cg) { asm volatile("bar.arrive %0, 256;" ::"r"(6 - cg) : "memory"); }

/* S^T's part of this thread (st) as the fused backward's bf16 tile (V = 128):
 * the warpgroup's 64 columns of V are the tile's 16 KB at cg * 16384 (s0_at),
 * staged in shared memory, then stored by the warpgroup's first thread as one
 * bulk copy to dst (asynchronous: the walk does not wait for its global
 * stores, which as the threads' own 4-byte stores cost ~1.1 us a chunk on the
 * chain; bench/NOTES.md v5.42). Two stages, by chunk (i & 1); a stage is
 * written again two chunks later, after the first thread has seen the copy
 * before it read (wait_group.read before the warpgroup's barrier: the copy
 * from the other stage, so both are free by then). The thread's pairs
 * (S^T rows v, columns k, k + 1) are 8 x 8 matrices of the accumulator
 * layout, stored transposed (tile rows k) by stmatrix.trans, four a call:
 * matrix m of call qq is k block 2 qq + m / 2, v rows 8 (m & 1) of the
 * warp's 16; lane l gives row l % 8 of matrix l / 8. dst 16-byte aligned. */
__device__ __forceinline__ void put_tile(char *sm, int i, char *dst, const float st[64], int cg, int tid) {
    char *sb = sm + TSmem::tl + ((i & 1) * 2 + cg) * 16384 - cg * 16384;   /* s0_at's offsets less the warpgroup's half */
    const int lane = tid & 31, m = lane >> 3, v0 = cg * 64 + ((tid >> 5) & 3) * 16 + 8 * (m & 1);
    auto pk = [](float a, float b) {
        __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
        return *reinterpret_cast<uint32_t *>(&h);
    };
#pragma unroll
    for (int qq = 0; qq < 8; qq++)
        stsm4t(sb + s0_at(8 * (2 * qq + (m >> 1)) + (lane & 7), v0), pk(st[8 * qq], st[8 * qq + 1]), pk(st[8 * qq + 2], st[8 * qq + 3]),
               pk(st[8 * qq + 4], st[8 * qq + 5]), pk(st[8 * qq + 6], st[8 * qq + 7]));
    fence_async_smem();   /* the stage's generic writes before the copy reads it */
    if ((tid & 127) == 0) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
    gdn::bar_named(8 + cg, 128);
    if ((tid & 127) == 0)
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], 16384;\ncp.async.bulk.commit_group;" ::"l"(dst + cg * 16384),
                     "r"(saddr(sb + cg * 16384)) : "memory");
}

/* ST: the backward's states mode (p.smode): each chunk's entering state
 * stored where p.states is not NULL; no q, P or o (X^T = S^T K^T alone);
 * also pass 1 of the split, which keeps only the segments' final states; CK:
 * the forward storing the backward's checkpoints (p.ckpt) and the tiles of
 * its last windows (p.keep). Separate instances, so the forward's code is
 * untouched */
template <typename E, bool ST, bool CK>
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
    const int nb = blockIdx.x / (p.nvb * p.HV * p.maxseg), n = p.lpt ? longest_at(p.cu, p.lpt, nb) : nb, h = j / p.G;
    int64_t bos, len;
    seq_range(p, n, &bos, &len);
    const int nch_all = (int)((len + CC - 1) / CC);
    int i0, nch;   /* chunks [i0, nch) */
    if (!ST && p.tag && blockIdx.x == 0 && tid == 0) {   /* before any return: every forward sets the tags */
        p.tag[0] = p.tag_val; p.tag[1] = p.mtag_val; p.tag[2] = p.ktag_val;
    }
    if (!walk_range(p, sg, nch_all, &i0, &nch) || (ST && walk_skipped(p)) || (ST && states_kept(p))) return;
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
        mb_expect(mb, TStage::bytes - (pmode ? 16384 : 0) - (ST ? 16384 : 0));   /* ST: no q */
        tma_rows(stg + TStage::kq, &tm.k, 0, h, row0, mb);
        if (!ST) tma_rows(stg + TStage::kq + 8192, &tm.q, 0, h, row0, mb);
        tma_rows(stg + TStage::kq + 16384, &tm.k, 64, h, row0, mb);
        if (!ST) tma_rows(stg + TStage::kq + 24576, &tm.q, 64, h, row0, mb);
        if (!pmode) {
            tma_rows(stg + TStage::v, &tm.v, vcol0, j, row0, mb);
            tma_rows(stg + TStage::v + 8192, &tm.v, vcol0 + 64, j, row0, mb);
        }
        bulk_copy(stg + TStage::rec, ws + (rec_slot(p, bos, n, i) * p.HV + j) * (int64_t)REC, REC, mb);
    };

    /* a programmatic launch whose starting state the kernel before it may have written (pass 3:
     * the scan's incoming states; the backward's states mode: a checkpoint, or the split's h0
     * rows from its folds) waits for that kernel first; the forward's passes 0 and 1 start from
     * the caller's h0 or from constants */
    if (p.pass == 3 || p.smode) asm volatile("griddepcontrol.wait;" ::: "memory");
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
    /* a programmatic launch comes here while the kernel before it runs: its results from now on */
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (tid == 0) {
        if (i0 < nch) fetch(i0);
        if (i0 + 1 < nch) fetch(i0 + 1);
    }
    /* this lane's 8 x 8 matrix (lm) and row in it (lr): P's and O's stmatrix addresses */
    const int lm = lane >> 3, lr = lane & 7;

    if (cg == 1) wg_pass(1);   /* warpgroup 0 goes first */
#ifdef GDN_CHUNK_PROFILE   /* cycles per phase, block 0, the first thread of each warpgroup */
    long long prof[10] = {0}, t0_ = clock64();
#define TPROF(k) do { if ((tid & 127) == 0) { const long long t1_ = clock64(); prof[k] += t1_ - t0_; t0_ = t1_; } } while (0)
#else
#define TPROF(k) do { } while (0)
#endif
    /* the chunks in runs between the backward's checkpoints (CK; else one run), each
     * checkpoint stored before its run, out of the chunk loop's code */
    for (int ib = i0; ib < nch;) {
        const int ie = CK ? ckpt_end(p, ib, nch) : nch;
        if (CK)
            if (float *ck = ckpt_of(p, ib, sbase)) {   /* a checkpoint for the backward's windows (h0's layout) */
#pragma unroll
                for (int q = 0; q < 16; q++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int kr = 8 * q + 2 * tq + (e & 1), vc = d0 + 8 * (e >> 1);
                        if (vc < ncols) ck[state_at(p, 0, ncols, kr, vc)] = st[4 * q + e];
                    }
            }
        for (int i = ib; i < ie; i++) {
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
            if (ST && p.states) {   /* the state entering chunk i, this thread's part, by 32-byte row pieces */
                float *sd = p.states + (rec_slot(p, bos, n, i) * p.HV + j) * ((int64_t)p.K * p.V / (p.st16 ? 2 : 1));   /* tiles: half */
                if (p.st16) put_tile(sm, i, reinterpret_cast<char *>(sd), st, cg, tid);
                else
#pragma unroll
                    for (int q = 0; q < 16; q++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int kr = 8 * q + 2 * tq + (e & 1), vc = d0 + 8 * (e >> 1);
                            if (vc < ncols) sd[(int64_t)kr * p.V + vc] = st[4 * q + e];
                        }
            }
            if (CK)
                if (char *kt = keep_of(p, n, i, j)) put_tile(sm, i, kt, st, cg, tid);   /* for the backward's last windows */
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
                gdn::bar_named(1, TT);
            }

            /* ---- [X | O]^T = S^T [K; Q]^T and this warpgroup's 32 columns of P = Q K^T
             * (ST: X^T = S^T K^T alone, the first 64 columns of the same B tile) ---- */
            float xo[ST ? 32 : 64], pa[16];
            {
                uint32_t sa[8][NS][4];
#pragma unroll
                for (int kk = 0; kk < 8; kk++) afrag_hilo<M>(sa[kk][0], sa[kk][NS - 1], st, kk);
                wg_fence();
                wg_turn(cg);
#pragma unroll
                for (int kk = 0; kk < 8; kk++) {
                    const uint64_t db = desc_off(desc_sw128(KQ, 16), (int)sizeof(*KQ) * ((kk >> 2) * 8192 + (kk & 3) * 16));
                    wgt_rs<ST ? 64 : 128, M::bf, 0>(xo, sa[kk][0], db, kk);
                    if (M::split) wgt_rs<ST ? 64 : 128, M::bf, 0>(xo, sa[kk][1], db, 1);
                }
                if constexpr (!ST)
#pragma unroll
                    for (int kk = 0; kk < 8; kk++)
                        wgt_ss32<M::bf>(pa, desc_off(desc_sw128(KQ, 16), (int)sizeof(*KQ) * (4096 + (kk >> 2) * 8192 + (kk & 3) * 16)),
                                        desc_off(desc_sw128(KQ, 16), (int)sizeof(*KQ) * (cg * 2048 + (kk >> 2) * 8192 + (kk & 3) * 16)), kk);
                wg_commit();
                wg_pass(cg);
                wg_wait<0>();
                TPROF(1);
            }
            uint32_t vt[8][2];
            vt_frags(vt, Vb, wl, lane, pmode);   /* P's columns: v = 0 */
            /* P (rows t of this warp, columns s of this warpgroup): masked, scaled, to shared memory */
            if constexpr (!ST) {
                float pv[4][4];
                p_masked<4>(pv, pa, F, p.scale, wl * 16 + g, cg * 32, tq);
#pragma unroll
                for (int a = 0; a < 4; a += 2)
                    stsm4(Ps + blk64(wl * 16 + 8 * (lm & 1) + lr, cg * 32 + 8 * (a + (lm >> 1))), M::pack(pv[a][0], pv[a][1]),
                          M::pack(pv[a][2], pv[a][3]), M::pack(pv[a + 1][0], pv[a + 1][1]), M::pack(pv[a + 1][2], pv[a + 1][3]));
                fence_async_smem();
                gdn::bar_named(2 + cg, 128);
                if ((tid & 127) == 0) mb_arrive(pfull + sl);
                TPROF(2);
            }
            /* ---- R^T = beta V^T - b X^T; U^T = R^T T^T ---- */
            float u[32];
            u_issue<M>(u, xo, vt, F, Ts, tq);
            TPROF(3);
            /* O^T = co Q S (per token), while U runs */
            float o[32];
            if constexpr (!ST) {
                o_scaled(o, xo + 32, F, tq);
                mb_wait(pfull + sl, par);   /* both warpgroups' halves of P are in */
            }
            TPROF(4);
            wg_wait<0>();
            TPROF(5);
            /* ---- O^T += U^T P^T; S^T = exp(gL) S^T + (cu U)^T K ---- */
            {
                uint32_t ua[4][4], ud[4][NS][4];
                if constexpr (!ST)
#pragma unroll
                    for (int kk = 0; kk < 4; kk++) afrag<M>(ua[kk], u, kk);
                state_step_operands<M, NS>(ud, u, st, F, tq);
                wg_fence();
                wg_turn(cg);
                if constexpr (!ST) {
#pragma unroll
                    for (int kk = 0; kk < 4; kk++) wgt_rs<64, M::bf, 0>(o, ua[kk], desc_off(desc_blk(Ps), (int)sizeof(*Ps) * (kk * 128)), 1);
                    wg_commit();
                }
#pragma unroll
                for (int kk = 0; kk < 4; kk++) {
                    const uint64_t db = desc_off(desc_sw128(KQ, 16384), (int)sizeof(*KQ) * (kk * 16 * 64));
                    wgt_rs<128, M::bf, 1>(st, ud[kk][0], db, 1);
                    if (M::split) wgt_rs<128, M::bf, 1>(st, ud[kk][1], db, 1);
                }
                wg_commit();
                wg_pass(cg);
                wg_wait<1>();
                TPROF(6);
            }
            /* O rows of this chunk: transposed into shared memory, then 16 bytes a thread */
            if constexpr (!ST) {
#pragma unroll
                for (int a = 0; a < 8; a += 2)
                    stsm4t(Os + (8 * (a + (lm >> 1)) + lr) * TSmem::LO + cg * 64 + wl * 16 + 8 * (lm & 1), M::pack(o[4 * a], o[4 * a + 1]),
                           M::pack(o[4 * a + 2], o[4 * a + 3]), M::pack(o[4 * a + 4], o[4 * a + 5]), M::pack(o[4 * a + 6], o[4 * a + 7]));
                gdn::bar_named(2 + cg, 128);
                TPROF(7);
                for (int x = tid & 127; x < c * 8; x += 128) {
                    const int r = x >> 3, c8 = (x & 7) * 8;
                    *reinterpret_cast<uint4 *>(static_cast<E *>(p.o) + ((row0 + r) * p.HV + j) * p.V + vcol0 + cg * 64 + c8) =
                        *reinterpret_cast<const uint4 *>(Os + r * TSmem::LO + cg * 64 + c8);
                }
            }
            wg_wait<0>();
            TPROF(8);
            gdn::bar_named(2 + cg, 128);   /* this warpgroup is done with the stage, its P and its O rows */
            if ((tid & 127) == 0 && (atomicAdd(cnt + sl, 1) & 1) && i + 2 < nch) fetch(i + 2);   /* the second one refills */
            TPROF(9);
        }
        ib = ie;
    }
    if (cg == 0) wg_turn(0);   /* the last pass of warpgroup 1 */
    if ((ST || CK) && (tid & 127) == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");   /* put_tile's copies done */
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
    if (float *dst = state_dst(p, pmode, segslot, j, nch == nch_all || p.wn)) {
#pragma unroll
        for (int i = 0; i < 16; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int kr = 8 * i + 2 * tq + (e & 1), vc = d0 + 8 * (e >> 1);
                if (vc < ncols) dst[state_at(p, sbase, ncols, kr, vc)] = st[4 * i + e];
            }
    }
}

}  // namespace

template <typename E> cudaError_t StateTPass<E>::attr() {
    static bool done = false, done_st = false;
    static bool done_ck = false;
    cudaError_t e = smem_attr(chunk_state_t_kernel<E, false, false>, TSmem::bytes, &done);
    if (e == cudaSuccess) e = smem_attr(chunk_state_t_kernel<E, false, true>, TSmem::bytes_tl, &done_ck);
    return e != cudaSuccess ? e : smem_attr(chunk_state_t_kernel<E, true, false>, TSmem::bytes_tl, &done_st);
}
template <typename E>
cudaError_t StateTPass<E>::launch(const ChunkArgs &p, unsigned blocks, const char *ws, const TmaMaps &tm, cudaStream_t st) {
    /* a programmatic dependent of the kernel before it (the prep for passes 0 and 1, the scan for
     * pass 3): its launch and prologue overlap that kernel's tail, and it waits for that kernel
     * before it reads what it wrote. Pass 1 (the segments' maps: final states only) by the
     * instance without q, P or O */
    auto *k = p.smode || p.pass == 1 ? chunk_state_t_kernel<E, true, false>
              : p.ckpt               ? chunk_state_t_kernel<E, false, true>
                                     : chunk_state_t_kernel<E, false, false>;
    return launch_dependent(k, blocks, TT, p.smode || p.ckpt || p.pass == 1 ? TSmem::bytes_tl : TSmem::bytes, st, p, ws, tm);
}
template struct StateTPass<__nv_bfloat16>;
template struct StateTPass<__half>;

}  // namespace cfwd
}  // namespace gdn
