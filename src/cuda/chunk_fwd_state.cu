/* CUDA chunk forward, kernel 2 (the state walk, general form: any K, V and
 * alignment): per (sequence or segment, value head, BV columns of V) the state
 * in fp32 registers across the chunks, the outputs O, and the final state (ht,
 * or in pass 1 the segment's map); or, for the backward (p.smode), each
 * chunk's entering state and no O; its launcher. */
#include "cuda/chunk_fwd.cuh"

namespace gdn {
namespace cfwd {
namespace {

/* ---- kernel 2: per (sequence, value head, BV columns of V) the state walk.
 * 16 warps, four warpgroups; warp w owns rows 16*(w&3) of the chunk and the
 * column group w>>2 (its warpgroup) for O, R and U; each warpgroup holds a
 * 64-row tile of the state (srow, sn0 below), one wgmma per k step. The next
 * chunk's q, v, k (double-buffered) and record are fetched by the TMA (or cp.async)
 * while this one computes. q and k stay raw: their rstd scale rows and
 * columns of the products instead. ---- */
constexpr int SW = 16, ST = 32 * SW;   /* state kernel warps, threads: 4 row blocks x NCG column groups */
constexpr int NCG = SW / 4;

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

/* STS: the backward's states mode (p.smode, whole sequences or a window,
 * pass 0): each chunk's entering state stored where p.states is not NULL, no
 * O; CK: the forward storing the backward's checkpoints (p.ckpt). Separate
 * instances, so the forward's code is untouched */
template <int KT, int BV, typename E, bool STS, bool CK>
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
    int i0, nch;   /* chunks [i0, nch) */
    if (!STS && p.tag && blockIdx.x == 0 && tid == 0 && p.pass != 1) {   /* before any return: every forward sets the tags */
        p.tag[0] = p.tag_val; p.tag[1] = p.mtag_val; p.tag[2] = p.ktag_val;
    }
    if (!walk_range(p, sg, nch_all, &i0, &nch) || ((STS || p.pass == 1) && walk_skipped(p))) return;
    const bool pmode = p.pass == 1 && vb >= p.nvb_v;   /* this block carries columns of P */
    const bool want_o = !STS && p.pass != 1;            /* pass 1 needs the final state only */
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
        const char *rec = ws + (rec_slot(p, bos, n, i) * p.HV + j) * (int64_t)REC + REC_T;
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
        const char *rec = ws + (rec_slot(p, bos, n, i) * p.HV + j) * (int64_t)REC;
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
    /* the chunks in runs between the backward's checkpoints (CK; else one run), each
     * checkpoint stored before its run, out of the chunk loop's code */
    for (int ib = i0; ib < nch;) {
        const int ie = CK ? ckpt_end(p, ib, nch) : nch;
        if (CK)
            if (float *ck = ckpt_of(p, ib, sbase)) {   /* a checkpoint for the backward's windows (h0's layout) */
#pragma unroll
                for (int nt = 0; nt < SNT; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int kr = srow + g + (e >> 1) * 8, vc = vcol0 + (sn0 + nt) * 8 + 2 * tq + (e & 1);
                        if (kr < p.K && vc < p.V) ck[state_at(p, 0, p.V, kr, vc)] = st[nt][e];
                    }
            }
        for (int i = ib; i < ie; i++) {
            const int64_t row0 = bos + (int64_t)i * CC;
            const int c = len - (int64_t)i * CC < CC ? (int)(len - (int64_t)i * CC) : CC;
            const E *Ks = reinterpret_cast<const E *>(sm + ((i & 1) ? S::k1 : S::k0));
            const float *gc = reinterpret_cast<const float *>(sm + S::f + (i & 1) * REC_F), *bt = gc + F_BT * CC,
                        *rk = gc + F_RK * CC, *rq = gc + F_RQ * CC;
            if (STS && p.states) {   /* the state entering chunk i, this thread's part, two columns a store where V is even */
                float *sd = p.states + (rec_slot(p, bos, n, i) * p.HV + j) * (int64_t)p.K * p.V;
#pragma unroll
                for (int nt = 0; nt < SNT; nt++)
#pragma unroll
                    for (int hr = 0; hr < 2; hr++) {
                        const int kr = srow + g + 8 * hr, vc = vcol0 + (sn0 + nt) * 8 + 2 * tq;
                        if (kr >= p.K || vc >= p.V) continue;
                        float *at = sd + (int64_t)kr * p.V + vc;
                        if ((p.V & 1) == 0) *reinterpret_cast<float2 *>(at) = make_float2(st[nt][2 * hr], st[nt][2 * hr + 1]);
                        else {
                            at[0] = st[nt][2 * hr];
                            if (vc + 1 < p.V) at[1] = st[nt][2 * hr + 1];
                        }
                    }
            }
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
            for (int x = tid; x < (want_o ? c : 0) * (BV / 8); x += ST) {
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
        ib = ie;
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
    if (float *dst = state_dst(p, pmode, segslot, j, nch == nch_all || p.wn)) {
#pragma unroll
        for (int nt = 0; nt < SNT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int kr = srow + g + (e >> 1) * 8, vc = vcol0 + (sn0 + nt) * 8 + 2 * tq + (e & 1);
                if (kr < p.K && vc < ncols) dst[state_at(p, sbase, ncols, kr, vc)] = st[nt][e];
            }
    }
}

}  // namespace

template <int KT, int BV, typename E> cudaError_t StatePass<KT, BV, E>::attr() {
    static bool done = false, done_st = false;
    static bool done_ck = false;
    cudaError_t e = smem_attr(chunk_state_kernel<KT, BV, E, false, false>, StateSmem<KT, BV>::bytes, &done);
    if (e == cudaSuccess) e = smem_attr(chunk_state_kernel<KT, BV, E, false, true>, StateSmem<KT, BV>::bytes, &done_ck);
    return e != cudaSuccess ? e : smem_attr(chunk_state_kernel<KT, BV, E, true, false>, StateSmem<KT, BV>::bytes, &done_st);
}
template <int KT, int BV, typename E>
cudaError_t StatePass<KT, BV, E>::launch(const ChunkArgs &p, unsigned blocks, const char *ws, const TmaMaps &tm,
                                         cudaStream_t st) {
    if (p.smode) chunk_state_kernel<KT, BV, E, true, false><<<blocks, ST, StateSmem<KT, BV>::bytes, st>>>(p, ws, tm);
    else if (p.ckpt) chunk_state_kernel<KT, BV, E, false, true><<<blocks, ST, StateSmem<KT, BV>::bytes, st>>>(p, ws, tm);
    else chunk_state_kernel<KT, BV, E, false, false><<<blocks, ST, StateSmem<KT, BV>::bytes, st>>>(p, ws, tm);
    return cudaGetLastError();
}
template struct StatePass<64, 128, __nv_bfloat16>;
template struct StatePass<128, 128, __nv_bfloat16>;
template struct StatePass<256, 64, __nv_bfloat16>;
template struct StatePass<64, 128, __half>;
template struct StatePass<128, 128, __half>;
template struct StatePass<256, 64, __half>;

}  // namespace cfwd
}  // namespace gdn
