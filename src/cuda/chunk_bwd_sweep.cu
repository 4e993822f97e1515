/* CUDA chunk backward, the two sweeps over each sequence's chunks, one block
 * per (sequence, value head, 64 columns of V): fwd_sweep, the state entering
 * each chunk into `states`; bwd_sweep in reverse, dS leaving each chunk into
 * `dstates` (none for context parallel's map: dh0 only), then dh0; their
 * launchers. */
#include "cuda/chunk_bwd.cuh"

namespace gdn {
namespace cbwd {
namespace {

/* the block's columns v0..v0+VT-1 of S (stride R8) into the K x V state st:
 * 16-byte stores where V % 4 == 0 */
__device__ __forceinline__ void store_state(float *st, const float *S, int K, int V, int v0) {
    if ((V & 3) == 0) {
        for (int e = threadIdx.x; e < K * (VT / 4); e += NT) {
            const int i = e / (VT / 4), q = e % (VT / 4), v = v0 + 4 * q;
            if (v < V) *reinterpret_cast<float4 *>(st + (int64_t)i * V + v) = *reinterpret_cast<const float4 *>(S + i * R8 + 4 * q);
        }
    } else {
        for (int e = threadIdx.x; e < K * VT; e += NT) {
            const int i = e / VT, v = v0 + e % VT;
            if (v < V) st[(int64_t)i * V + v] = S[i * R8 + e % VT];
        }
    }
}

/* state (n, j) of h0 / dht / dh0, element (i, v) of the k-first view */
__device__ __forceinline__ int64_t state_at(const BwdArgs &p, int64_t n, int j, int i, int v) {
    const int64_t base = (n * p.HV + j) * (int64_t)p.K * p.V;
    return base + ((p.flags & GDN_STATE_V_FIRST) ? (int64_t)v * p.K + i : (int64_t)i * p.V + v);
}

/* ---- fwd_sweep: one block per (n, j, VT columns). Per chunk (chunk_fwd.c
 * gdn_chunk_u, gdn_chunk_state_step):
 *   states[slot] = S;  X = Bv - Bk S;  U = Tm X;  S = exp(gc_last) S + Kd^T U ---- */
template <bool SPLIT, bool EX>
__global__ void __launch_bounds__(NT, 1) fwd_sweep_kernel(BwdArgs p) {
    extern __shared__ __align__(16) float sm[];
    const int K = p.K, V = p.V, tid = threadIdx.x, Kp = k8(K), lk = ld4(Kp);
    const int vb = blockIdx.x % p.nvt, j = (blockIdx.x / p.nvt) % p.HV, h = j / p.G;
    const int64_t n = blockIdx.x / (p.nvt * p.HV);
    const int v0 = vb * VT;
    float *S = sm, *Ks = S + Kp * R8, *Tm = Ks + CC * lk, *X = Tm + CC * R4, *U = X + CC * R8;
    double *gcd = reinterpret_cast<double *>(U + CC * R8);
    float *gam = reinterpret_cast<float *>(gcd + CC), *bet = gam + CC, *ek = bet + CC, *rsk = ek + CC;
    for (int e = tid; e < Kp * R8; e += NT) {
        const int i = e / R8, v = v0 + e % R8;
        S[e] = (p.h0 && i < K && e % R8 < VT && v < V) ? p.h0[state_at(p, n, j, i, v)] : 0.f;
    }
    int64_t bos, len;
    seq_range(p, n, &bos, &len);
    const int64_t nch = (len + CC - 1) / CC, sb = bos / CC + n;
    /* the next chunk's k, v rows, Tm and scalars in registers while this one
     * computes (bf16 / f16, K <= 128, aligned, whole column blocks) */
    /* EX: the k rows raw (exact in tf32: bf16 / f16), their rstd a row scale rsk */
    const float *rk = (p.flags & GDN_QK_L2NORM) ? p.rstd_k : nullptr;
    const bool pf = p.dt != 0 && K <= 128 && v0 + VT <= V && rows16_ok(p.k, p.dt, K, 0, K) && rows16_ok(p.v, p.dt, V, v0, VT);
    Rows16<4> fk;
    Rows16<2> fv;
    Mat64 ft;
    RecTok fs;
    float frs = 1.f;
    const auto fetch = [&](int64_t ci) {
        const int64_t slot = sb + ci, row0 = bos + ci * CC;
        const int c = len - ci * CC < CC ? (int)(len - ci * CC) : CC;
        const float *rec = p.rec + (slot * p.HV + j) * (int64_t)REC;
        fk.issue(p.k, p.dt, row0, c, p.H, h, K, 0, K, EX ? nullptr : rk, 0);
        fv.issue(p.v, p.dt, row0, c, p.HV, j, V, v0, VT, nullptr, 0);
        ft.issue(rec + R_TM);
        fs.issue(rec);
        if (EX) frs = rk && tid < c ? rk[(row0 + tid) * p.H + h] : 1.f;
    };
    if (pf) {
        for (int e = tid; e < CC * lk; e += NT) Ks[e] = 0.f;   /* columns past K stay zero */
        if (nch > 0) fetch(0);
    }
    BP_DECL;
    for (int64_t ci = 0; ci < nch; ci++) {
        const int64_t slot = sb + ci, row0 = bos + ci * CC;
        const int c = len - ci * CC < CC ? (int)(len - ci * CC) : CC;
        const float *rec = p.rec + (slot * p.HV + j) * (int64_t)REC;
        __syncthreads();   /* S complete; the previous chunk's Ks, Tm, X, U no longer read */
        float *st = p.states + (slot * p.HV + j) * (int64_t)K * V;
        store_state(st, S, K, V, v0);
        BP(0);
        if (pf) {
            fk.commit(Ks, lk, p.dt, c, K, 0);
            fv.commit(X, R8, p.dt, c, VT, 0);
            ft.commit(Tm, R4);
            fs.commit(gcd, gam, bet);
            if (EX && tid < CC) rsk[tid] = frs;
            for (int e = tid; e < (CC - c) * lk; e += NT) Ks[c * lk + e] = 0.f;
            if (ci + 1 < nch) fetch(ci + 1);
        } else {
            load_qk(p, p.k, EX ? nullptr : p.rstd_k, row0, c, h, Ks, lk);
            if (EX && tid < CC) rsk[tid] = rk && tid < c ? rk[(row0 + tid) * p.H + h] : 1.f;
            load_rows_v(p, p.v, row0, c, j, v0, VT, X, R8);
            load_64x64(Tm, R4, rec + R_TM);
            RecTok r;
            r.issue(rec);
            r.commit(gcd, gam, bet);
        }
        __syncthreads();
        if (tid < CC) ek[tid] = tid < c ? Ef(gcd, c - 1, tid) : 0.f;   /* exp(gc_last - gc_s) */
        BP(1);
        /* X = Bv - Bk S, Bv = beta v, Bk = beta exp(gc) k */
        gdn::block_mm_s<SPLIT, false, true, EX>(
            CC, VT, K, Ks, lk, S, R8,
            [&](int t, int v, float acc) {   /* X holds v (zero past c and V) */
                X[t * R8 + v] = t < c ? bet[t] * X[t * R8 + v] - (bet[t] * gam[t] * (EX ? rsk[t] : 1.f)) * acc : 0.f;
            },
            gdn::full_k{});
        __syncthreads();
        BP(2);
        /* U = diag(ek) Tm X (Tm lower triangular; the decays of Kd = diag(ek) K taken here) */
        gdn::block_mm_s<SPLIT, false, true>(
            CC, VT, CC, Tm, R4, X, R8, [&](int t, int v, float acc) { U[t * R8 + v] = (ek[t] * (EX ? rsk[t] : 1.f)) * acc; },
            [](int i0, int *, int *k1) { *k1 = i0 + 16; });
        __syncthreads();
        BP(3);
        /* S = exp(gc_last) S + Kd^T U */
        const float gl = gam[c - 1];
        gdn::block_mm_s<SPLIT, true, true, EX>(
            Kp, VT, CC, Ks, lk, U, R8, [&](int i, int v, float acc) { S[i * R8 + v] = gl * S[i * R8 + v] + acc; }, gdn::full_k{});
        BP(4);
    }
    BP_PRINT(blockIdx.x == 0 && nch > 0, "fwd_sweep per chunk: store S | loads | X | U | S update", 5, nch);
}

/* ---- bwd_sweep: one block per (n, j, VT columns), chunks in reverse
 * (chunk_bwd.c dstate_span). dS is dL/dS leaving the chunk:
 *   dstates[slot] = dS
 *   dU = P^T dO + Kd dS;  Y = Tm^T dU (= dBv)
 *   dS = exp(gc_last) dS - Bk^T Y + (scale diag(exp gc) Q)^T dO
 * (Bk^T Y = Wk^T dU, Wk = Tm Bk). dh0 = dS after the first chunk. ---- */
template <bool SPLIT, bool EX>
__global__ void __launch_bounds__(NT, 1) bwd_sweep_kernel(BwdArgs p) {
    extern __shared__ __align__(16) float sm[];
    const int K = p.K, V = p.V, tid = threadIdx.x, Kp = k8(K), lk = ld4(Kp);
    const int vb = blockIdx.x % p.nvt, j = (blockIdx.x / p.nvt) % p.HV, h = j / p.G;
    const int64_t n = blockIdx.x / (p.nvt * p.HV);
    const int v0 = vb * VT;
    /* P and Tm in two buffers each (a chunk's by the parity of its place in
     * the walk), the next chunk's coming by cp.async while this one computes */
    const int nb = K <= 128 ? 2 : 1;   /* one buffer each where no chunk is fetched ahead (K > 128) */
    float *dS = sm, *Ks = dS + Kp * R8, *Pb = Ks + CC * lk, *Tb = Pb + nb * CC * R8, *dO = Tb + nb * CC * R8, *dU = dO + CC * R8;
    double *gcd = reinterpret_cast<double *>(dU + CC * R8);
    float *gam = reinterpret_cast<float *>(gcd + CC), *bet = gam + CC, *ek = bet + CC, *rsk = ek + CC, *rsq = rsk + CC;
    for (int e = tid; e < Kp * R8; e += NT) {
        const int i = e / R8, v = v0 + e % R8;
        dS[e] = (p.dht && i < K && e % R8 < VT && v < V) ? p.dht[state_at(p, n, j, i, v)] : 0.f;
    }
    int64_t bos, len;
    seq_range(p, n, &bos, &len);
    const int64_t sb = bos / CC + n;
    int64_t cb, nch;   /* chunks [cb, nch), walked from nch - 1 */
    sweep_range(p, (len + CC - 1) / CC, &cb, &nch);
    /* the next chunk's k, dO rows and scalars in registers, its P and Tm by
     * cp.async into their other buffers, while this one computes, and this
     * chunk's q rows from its start (bf16 / f16, K <= 128, aligned, whole
     * column blocks) */
    const bool l2 = (p.flags & GDN_QK_L2NORM) != 0;
    const bool pf = p.dt != 0 && K <= 128 && v0 + VT <= V && rows16_ok(p.k, p.dt, K, 0, K) && rows16_ok(p.q, p.dt, K, 0, K) &&
                    rows16_ok(p.dout, p.dt, V, v0, VT);
    /* EX: q and k rows raw (exact in tf32: bf16 / f16), their rstd row scales rsq, rsk */
    const float *rq = l2 ? p.rstd_q : nullptr, *rk = l2 ? p.rstd_k : nullptr;
    Rows16<4> fk, fq;
    Rows16<2> fo;
    RecTok fs;
    float frk = 1.f, frq = 1.f;
    const auto fetch = [&](int64_t ci) {
        const int pb = (int)((nch - 1 - ci) & (nb - 1));
        const int64_t slot = sb + ci, row0 = bos + ci * CC;
        const int c = len - ci * CC < CC ? (int)(len - ci * CC) : CC;
        const float *rec = rec_at(p, n, slot, ci, j);
        fk.issue(p.k, p.dt, row0, c, p.H, h, K, 0, K, EX ? nullptr : rk, 0);
        if (EX && tid < c) {
            frk = rk ? rk[(row0 + tid) * p.H + h] : 1.f;
            frq = rq ? rq[(row0 + tid) * p.H + h] : 1.f;
        }
        fo.issue(p.dout, p.dt, row0, c, p.HV, j, V, v0, VT, nullptr, 0);
#pragma unroll
        for (int u = 0; u < CC * CC / 4 / NT; u++) {
            const int e = threadIdx.x + u * NT, r = e >> 4, q = (e & 15) * 4;
            gdn::cp16(Pb + pb * CC * R8 + r * R8 + q, rec + R_P + r * CC + q, true);
            gdn::cp16(Tb + pb * CC * R8 + r * R8 + q, rec + R_TM + r * CC + q, true);
        }
        gdn::cp_commit();
        fs.issue(rec);
    };
    if (pf) {
        for (int e = tid; e < CC * lk; e += NT) Ks[e] = 0.f;   /* columns past K stay zero */
        if (nch > cb) fetch(nch - 1);
    }
    BP_DECL;
    for (int64_t ci = nch - 1; ci >= cb; ci--) {
        const int64_t slot = sb + ci, row0 = bos + ci * CC;
        const int c = len - ci * CC < CC ? (int)(len - ci * CC) : CC;
        const float *rec = rec_at(p, n, slot, ci, j);
        const int pb = (int)((nch - 1 - ci) & (nb - 1));
        float *P = Pb + pb * CC * R8, *Tm = Tb + pb * CC * R8, *Y = P;   /* P is read only before Y is written */
        __syncthreads();   /* dS complete; the previous chunk's arrays no longer read */
        if (p.dstates) store_state(dstate_at(p, n, slot, ci, j), dS, K, V, v0);   /* none: dh0 only */
        BP(0);
        if (pf) {
            fk.commit(Ks, lk, p.dt, c, K, 0);
            fo.commit(dO, R8, p.dt, c, VT, 0);
            gdn::cp_wait_all();   /* this chunk's P and Tm (the thread's own pieces; the barrier below publishes them) */
            fs.commit(gcd, gam, bet);
            if (EX && tid < CC) { rsk[tid] = tid < c ? frk : 0.f; rsq[tid] = tid < c ? frq : 0.f; }
            for (int e = tid; e < (CC - c) * lk; e += NT) Ks[c * lk + e] = 0.f;
            for (int e = tid; e < (CC - c) * R8; e += NT) dO[c * R8 + e] = 0.f;
            fq.issue(p.q, p.dt, row0, c, p.H, h, K, 0, K, EX ? nullptr : rq, 0);
            if (ci > cb) fetch(ci - 1);
        } else {
            load_qk(p, p.k, EX ? nullptr : p.rstd_k, row0, c, h, Ks, lk);
            if (EX && tid < CC) {
                rsk[tid] = tid < c ? (rk ? rk[(row0 + tid) * p.H + h] : 1.f) : 0.f;
                rsq[tid] = tid < c ? (rq ? rq[(row0 + tid) * p.H + h] : 1.f) : 0.f;
            }
            load_64x64(P, R8, rec + R_P);
            load_64x64(Tm, R8, rec + R_TM);
            load_rows_v(p, p.dout, row0, c, j, v0, VT, dO, R8);
            RecTok r;
            r.issue(rec);
            r.commit(gcd, gam, bet);
        }
        __syncthreads();
        if (tid < CC) ek[tid] = tid < c ? Ef(gcd, c - 1, tid) : 0.f;
        __syncthreads();
        BP(1);
        /* dU = diag(ek) (K dS) + P^T dO: the first product, its rows scaled, then the second on top */
        for (int task = tid >> 5; task < (CC / 16) * (VT / 32); task += NT / 32) {
            const int i0 = (task / (VT / 32)) * 16, n0 = (task % (VT / 32)) * 32, g = (tid & 31) >> 2;
            float a[4][4] = {};
            gdn::warp_mma_s<SPLIT, false, true, 4, EX>(a, Ks, lk, dS, R8, i0, n0, 0, Kp);
            const float e0 = ek[i0 + g] * (EX ? rsk[i0 + g] : 1.f), e1 = ek[i0 + g + 8] * (EX ? rsk[i0 + g + 8] : 1.f);
#pragma unroll
            for (int q = 0; q < 4; q++) { a[q][0] *= e0; a[q][1] *= e0; a[q][2] *= e1; a[q][3] *= e1; }
            gdn::warp_mma_s<SPLIT, true, true, 4, false, EX>(a, P, R8, dO, R8, i0, n0, i0, CC);   /* dO raw: exact with EX */
            gdn::warp_store(a, i0, n0, 4, CC, VT, [&](int t, int v, float x) { dU[t * R8 + v] = x; });
        }
        __syncthreads();
        BP(2);
        /* Y = diag(beta exp(gc)) Tm^T dU (the row scales of Bk = diag(beta exp(gc)) K taken here) */
        gdn::block_mm_s<SPLIT, true, true>(
            CC, VT, CC, Tm, R8, dU, R8, [&](int t, int v, float acc) { Y[t * R8 + v] = (bet[t] * gam[t] * (EX ? rsk[t] : 1.f)) * acc; },
            [](int i0, int *k0, int *) { *k0 = i0; });
        /* dO's rows times scale exp(gc_t) for the q term below (dU's product no longer reads dO) */
        for (int e = tid; e < CC * VT; e += NT) {
            const int t = e / VT, v = e % VT;
            dO[t * R8 + v] *= p.scale * gam[t] * (EX ? rsq[t] : 1.f);
        }
        __syncthreads();
        BP(3);
        /* dS = exp(gc_last) dS - Bk^T Y */
        const float gl = gam[c - 1];
        gdn::block_mm_s<SPLIT, true, true, EX>(
            Kp, VT, CC, Ks, lk, Y, R8, [&](int i, int v, float acc) { dS[i * R8 + v] = gl * dS[i * R8 + v] - acc; }, gdn::full_k{});
        __syncthreads();   /* Ks free: q rows in its place (rows past c stay zero) */
        BP(4);
        if (pf) fq.commit(Ks, lk, p.dt, c, K, 0);
        else load_qk(p, p.q, EX ? nullptr : p.rstd_q, row0, c, h, Ks, lk);
        __syncthreads();
        BP(5);
        /* dS += (scale exp(gc_t) q_t)^T dO, the scales in dO's rows */
        gdn::block_mm_s<SPLIT, true, true, EX>(
            Kp, VT, CC, Ks, lk, dO, R8, [&](int i, int v, float acc) { dS[i * R8 + v] += acc; }, gdn::full_k{});
        BP(6);
    }
    BP_PRINT(blockIdx.x == 0 && nch > cb, "bwd_sweep per chunk: store dS | loads | dU | Y, dO scale | dS -= | q rows | dS +=", 7, nch - cb);
    if (p.dh0) {
        __syncthreads();
        for (int e = tid; e < K * VT; e += NT) {
            const int i = e / VT, v = v0 + e % VT;
            if (v < V) p.dh0[state_at(p, n, j, i, v)] = dS[i * R8 + e % VT];
        }
    }
}

int sweep_smem(int K, bool bwd) {
    const int Kp = k8(K), floats = Kp * R8 + CC * ld4(Kp) + (bwd ? (K <= 128 ? 6 : 4) * CC * R8 : CC * R4 + 2 * CC * R8);
    return (floats + 2 * CC /* gcd */ + 5 * CC) * (int)sizeof(float);
}

}  // namespace

/* EX (raw q, k rows, two products where one operand is exact) for bf16 / f16 inputs */
template <bool SPLIT> cudaError_t SweepPass<SPLIT>::attr(int K) {
    cudaError_t e;
    if ((e = smem_attr(fwd_sweep_kernel<SPLIT, false>, sweep_smem(K, false))) != cudaSuccess) return e;
    if ((e = smem_attr(fwd_sweep_kernel<SPLIT, true>, sweep_smem(K, false))) != cudaSuccess) return e;
    if ((e = smem_attr(bwd_sweep_kernel<SPLIT, false>, sweep_smem(K, true))) != cudaSuccess) return e;
    if ((e = smem_attr(bwd_sweep_kernel<SPLIT, true>, sweep_smem(K, true))) != cudaSuccess) return e;
    return K == 128 || K == 256 ? SweepT::attr() : cudaSuccess;
}
template <bool SPLIT> void SweepPass<SPLIT>::launch_fwd(const BwdArgs &p, unsigned blocks, cudaStream_t st) {
    if (p.dt != 0) fwd_sweep_kernel<SPLIT, true><<<blocks, NT, sweep_smem(p.K, false), st>>>(p);
    else fwd_sweep_kernel<SPLIT, false><<<blocks, NT, sweep_smem(p.K, false), st>>>(p);
}
template <bool SPLIT> void SweepPass<SPLIT>::launch_bwd(const BwdArgs &p, unsigned blocks, cudaStream_t st) {
    if (SweepT::takes(p)) return SweepT::launch(p, st);
    if (p.dt != 0) bwd_sweep_kernel<SPLIT, true><<<blocks, NT, sweep_smem(p.K, true), st>>>(p);
    else bwd_sweep_kernel<SPLIT, false><<<blocks, NT, sweep_smem(p.K, true), st>>>(p);
}
template struct SweepPass<true>;

}  // namespace cbwd
}  // namespace gdn
