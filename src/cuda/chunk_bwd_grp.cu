/* CUDA chunk backward, the group stage: per (slot, value head) chunk_backward
 * of chunk_bwd.c step by step over a per-item scratch in global memory
 * (grp_kernel and its tensor-core product mm), dq and dk summed over the value
 * heads (grp_qk_kernel), the dA_log, ddt_bias sums (dparam_kernel); launchers. */
#include "cuda/chunk_bwd.cuh"

namespace gdn {
namespace cbwd {
namespace {

/* tri flags of mm (as GDN_TRI_* of cpu/gemm.h) */
constexpr int LOWER_A = 1, UPPER_A = 2, LOWER_C = 4;

/* the item's slot, value head, chunk length, first row, scratch and record */
struct Item {
    int64_t slot, row0;
    int j, h, c;
    float *w;
    const float *rec;
    const double *gcd;
};
__device__ __forceinline__ Item item_of(const BwdArgs &p, const Grp &G) {
    Item it;
    it.slot = G.s0 + blockIdx.x / p.HV;
    it.j = blockIdx.x % p.HV;
    it.h = it.j / p.G;
    it.c = p.slot_c[it.slot];
    it.row0 = p.slot_row0[it.slot];
    it.w = G.scr + (int64_t)blockIdx.x * G.o.F;
    it.rec = p.rec + (it.slot * p.HV + it.j) * (int64_t)REC;
    it.gcd = reinterpret_cast<const double *>(it.rec + R_GCD);
    return it;
}

/* for (f = threadIdx.x; f < n4; f += NT) put(f, get(f)) over float4 pieces,
 * U loaded before any is stored */
template <int U, typename FG, typename FP>
__device__ __forceinline__ void batched4(int n4, const FG &get, const FP &put) {
    for (int f0 = threadIdx.x; f0 < n4; f0 += U * NT) {
        float4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int f = f0 + u * NT;
            v[u] = f < n4 ? get(f) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int u = 0; u < U; u++)
            if (f0 + u * NT < n4) put(f0 + u * NT, v[u]);
    }
}
/* step 1: the chunk's rows and their scaled forms (zero past c); Rg, dgc, dbeta zeroed */
__device__ void grp_load(const BwdArgs &p, const Grp &G, const Item &it) {
    const int K = p.K, V = p.V, c = it.c;
    float *w = it.w;
    const float *gam = it.rec + R_GAM, *bet = it.rec + R_BETA;
    load_qk(p, p.q, p.rstd_q, it.row0, c, it.h, w + G.o.Q, K);
    load_qk(p, p.k, p.rstd_k, it.row0, c, it.h, w + G.o.Kc, K);
    __syncthreads();
    if ((K & 3) == 0)   /* float4 pieces (the scratch's arrays start on 128 bytes) */
        batched4<4>(
            CC * K / 4, [&](int f) { return reinterpret_cast<const float4 *>(w + G.o.Kc)[f]; },
            [&](int f, float4 kc) {
                const int t = 4 * f / K;
                const float b = bet[t] * gam[t], d = t < c ? Ef(it.gcd, c - 1, t) : 0.f;
                reinterpret_cast<float4 *>(w + G.o.Bk)[f] = make_float4(b * kc.x, b * kc.y, b * kc.z, b * kc.w);
                reinterpret_cast<float4 *>(w + G.o.Kd)[f] = make_float4(d * kc.x, d * kc.y, d * kc.z, d * kc.w);
            });
    else
        batched(
            CC * K, [&](int e) { return w[G.o.Kc + e]; },
            [&](int e, float kc) {
                const int t = e / K;
                w[G.o.Bk + e] = (bet[t] * gam[t]) * kc;
                w[G.o.Kd + e] = (t < c ? Ef(it.gcd, c - 1, t) : 0.f) * kc;
            });
    load_rows_v(p, p.v, it.row0, c, it.j, 0, V, w + G.o.Vv, V);
    load_rows_v(p, p.dout, it.row0, c, it.j, 0, V, w + G.o.dO, V);
    __syncthreads();
    if ((V & 3) == 0)
        batched4<4>(
            CC * V / 4, [&](int f) { return reinterpret_cast<const float4 *>(w + G.o.Vv)[f]; },
            [&](int f, float4 vv) {
                const float b = bet[4 * f / V];
                const float4 x = make_float4(b * vv.x, b * vv.y, b * vv.z, b * vv.w);
                reinterpret_cast<float4 *>(w + G.o.Bv)[f] = x;
                reinterpret_cast<float4 *>(w + G.o.Xr)[f] = x;
            });
    else
        batched(
            CC * V, [&](int e) { return w[G.o.Vv + e]; },
            [&](int e, float vv) {
                const float b = bet[e / V];
                w[G.o.Bv + e] = b * vv;
                w[G.o.Xr + e] = b * vv;
            });
    for (int e = threadIdx.x; e < CC * CC; e += NT) w[G.o.Rg + e] = 0.f;
    if (threadIdx.x < CC) { w[G.o.dgc + threadIdx.x] = 0.f; w[G.o.dbeta + threadIdx.x] = 0.f; }
}

/* chunk_backward: "S1 = exp(gc_last) S0 + Kd^T U: the gate terms and dK from Kd" */
__device__ void grp_last(const BwdArgs &p, const Grp &G, const Item &it, float *red) {
    const int K = p.K, c = it.c, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float *w = it.w;
    const int64_t so = (it.slot * p.HV + it.j) * (int64_t)K * p.V;
    const float *S0 = p.states + so, *dS = p.dstates + so;
    const int64_t n = (int64_t)K * p.V;
    float part = 0.f;
    if ((n & 3) == 0) {   /* float4 pieces, eight of each array in flight a thread (states rows start on 16 bytes) */
        const float4 *a = reinterpret_cast<const float4 *>(S0), *b = reinterpret_cast<const float4 *>(dS);
        for (int64_t f0 = threadIdx.x; f0 < n / 4; f0 += 8 * NT) {
            float4 x[8], y[8];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int64_t f = f0 + u * NT;
                x[u] = f < n / 4 ? a[f] : make_float4(0.f, 0.f, 0.f, 0.f);
                y[u] = f < n / 4 ? b[f] : make_float4(0.f, 0.f, 0.f, 0.f);
            }
#pragma unroll
            for (int u = 0; u < 8; u++) part = fmaf(x[u].x, y[u].x, fmaf(x[u].y, y[u].y, fmaf(x[u].z, y[u].z, fmaf(x[u].w, y[u].w, part))));
        }
    } else {
        for (int64_t e = threadIdx.x; e < n; e += NT) part = fmaf(S0[e], dS[e], part);
    }
    const float tot = gdn::block_sum(part, red);
    if (threadIdx.x == 0) w[G.o.dgc + c - 1] += it.rec[R_GAM + c - 1] * tot;
    for (int t = warp; t < c - 1; t += NT / 32) {   /* pair (last, t) */
        float d = 0.f;
        for (int i = lane; i < K; i += 32) d = fmaf(w[G.o.Kc + t * K + i], w[G.o.dKd + t * K + i], d);
        d = gdn::warp_sum(d);
        if (lane == 0) w[G.o.Rg + (c - 1) * CC + t] += Ef(it.gcd, c - 1, t) * d;
    }
}

/* chunk_backward: dP -> Rg pairs and dP~; O's first term: dgc, dQc = scale exp(gc) X */
__device__ void grp_dp(const BwdArgs &p, const Grp &G, const Item &it) {
    const int K = p.K, c = it.c, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float *w = it.w;
    const float *P = it.rec + R_P, *gam = it.rec + R_GAM;
    for (int e = threadIdx.x; e < CC * CC; e += NT) {
        const int t = e / CC, u = e % CC;
        float d = w[G.o.dP + e];
        if (u < t) {
            if (t < c) w[G.o.Rg + e] += d * P[e];
            d *= p.scale * Ef(it.gcd, t, u);
        } else if (u == t) d *= p.scale;
        else d = 0.f;
        w[G.o.dP + e] = d;
    }
    for (int t = warp; t < CC; t += NT / 32) {
        const float f = p.scale * gam[t];
        float d = 0.f;
        for (int i = lane; i < K; i += 32) d = fmaf(w[G.o.Q + t * K + i], w[G.o.Xq + t * K + i], d);
        d = gdn::warp_sum(d);
        if (lane == 0 && t < c) w[G.o.dgc + t] += f * d;
        for (int i = lane; i < K; i += 32) w[G.o.dQc + t * K + i] = f * w[G.o.Xq + t * K + i];
    }
}

/* chunk_backward: dKc += exp(gc_last - gc) dKd; only the strictly lower part of dTm */
__device__ void grp_mid(const BwdArgs &p, const Grp &G, const Item &it) {
    const int K = p.K, c = it.c;
    float *w = it.w;
    for (int e = threadIdx.x; e < CC * K; e += NT) {
        const int t = e / K;
        if (t < c) w[G.o.dKc + e] += Ef(it.gcd, c - 1, t) * w[G.o.dKd + e];
    }
    for (int e = threadIdx.x; e < CC * CC; e += NT)
        if (e % CC >= e / CC) w[G.o.dTm + e] = 0.f;
}

/* chunk_backward: "Bk = diag(beta exp(gc)) K, Bv = diag(beta) V" (dv stored)
 * and "A_ts = beta_t exp(gc_t - gc_s) KK_ts": dA becomes dKK in place. KK is in tmp. */
__device__ void grp_beta(const BwdArgs &p, const Grp &G, const Item &it) {
    const int K = p.K, V = p.V, c = it.c, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float *w = it.w;
    const float *gam = it.rec + R_GAM, *bet = it.rec + R_BETA;
    for (int t = warp; t < c; t += NT / 32) {
        const float bk = bet[t] * gam[t];
        float kd = 0.f, vd = 0.f;
        for (int i = lane; i < K; i += 32) kd = fmaf(w[G.o.dBk + t * K + i], w[G.o.Kc + t * K + i], kd);
        for (int i = lane; i < V; i += 32) vd = fmaf(w[G.o.dBv + t * V + i], w[G.o.Vv + t * V + i], vd);
        kd = gdn::warp_sum(kd);
        vd = gdn::warp_sum(vd);
        for (int i = lane; i < K; i += 32) w[G.o.dKc + t * K + i] += bk * w[G.o.dBk + t * K + i];
        for (int i = lane; i < V; i += 32)
            gdn::st(p.dv, ((it.row0 + t) * p.HV + it.j) * (int64_t)V + i, bet[t] * w[G.o.dBv + t * V + i], p.dt);
        /* row t of dA: pairs (t, u), u < t */
        float db = 0.f;
        for (int u = lane; u < CC; u += 32) {
            float d = 0.f;
            if (u < t) {
                const float E = w[G.o.dA + t * CC + u] * Ef(it.gcd, t, u), kk = w[G.o.tmp + t * CC + u];
                db = fmaf(E, kk, db);
                w[G.o.Rg + t * CC + u] += E * bet[t] * kk;
                d = bet[t] * E;
            }
            w[G.o.dA + t * CC + u] = d;
        }
        db = gdn::warp_sum(db);
        if (lane == 0) {
            w[G.o.dbeta + t] += vd + gam[t] * kd;
            w[G.o.dbeta + t] += db;
            w[G.o.dgc + t] += bk * kd;
        }
    }
    for (int t = c + warp; t < CC; t += NT / 32)   /* rows past c: no dKK */
        for (int u = lane; u < CC; u += 32) w[G.o.dA + t * CC + u] = 0.f;
}

/* one product of the item: C[M,N] = alpha op(A) op(B) + (acc ? C : 0) on
 * the tensor cores, M <= 64, N <= 256; op(X)[i][q] = X.t ? X[q*ld + i] :
 * X[i*ld + q]; masked elements (LOWER_A: q > i, UPPER_A: q < i) are never
 * read; LOWER_C writes 0 above the diagonal. The operands (global memory:
 * scratch, record, states) come through shared memory `sm` (mm_smem floats)
 * 64 columns of k at a time, each element read from global memory once,
 * four at a time where the rows allow (v4: 13% off d256's backward), and
 * rounded to tf32 there without SPLIT (each element once, not at each use);
 * the products by warp_mma_s (A fragments by ldmatrix, B by scalar loads
 * across k). Starts and ends with a barrier. */
struct Mat { const float *p; int ld, t; };
constexpr int MK = 64, MA = MK + 4;   /* k per stage; As [64][MA] is read along k */
__host__ __device__ __forceinline__ int mm_lb(int N) { const int n = (N + 31) & ~31; return n + 8; }   /* Bs [MK][lb], read across k */
__host__ __device__ __forceinline__ int mm_smem(int Nmax) { return 64 * MA + MK * mm_lb(Nmax); }

/* four values of X from x (16-byte aligned), value c kept where bit c of
 * `in` is set and 0 elsewhere, the others never read */
__device__ __forceinline__ float4 ld4_masked(const float *x, int in) {
    if (in == 15) return *reinterpret_cast<const float4 *>(x);
    return make_float4(in & 1 ? x[0] : 0.f, in & 2 ? x[1] : 0.f, in & 4 ? x[2] : 0.f, in & 8 ? x[3] : 0.f);
}
/* op(A)'s (i, gq) is inside the product (i < M, gq < Kd) and not masked by tri */
__device__ __forceinline__ bool mm_in(int i, int gq, int M, int Kd, int tri) {
    return i < M && gq < Kd && !((tri & LOWER_A) && gq > i) && !((tri & UPPER_A) && gq < i);
}

template <bool SPLIT>
__device__ void mm(int M, int N, int Kd, float alpha, Mat A, Mat B, float *C, int ldc, int acc, int tri, float *sm) {
    const int warp = threadIdx.x >> 5, ntl = (N + 31) >> 5, tasks = ((M + 15) >> 4) * ntl, n8 = (N + 7) >> 3;
    const int lb = mm_lb(N), nw = (N + 31) & ~31;
    float *As = sm, *Bs = sm + 64 * MA;
    float accr[4][4][4] = {};
    const auto r4 = [](float4 v) {
        return make_float4(gdn::tf32r_if<SPLIT>(v.x), gdn::tf32r_if<SPLIT>(v.y), gdn::tf32r_if<SPLIT>(v.z), gdn::tf32r_if<SPLIT>(v.w));
    };
    /* the tiles by float4 along each operand's rows where every row starts on 16 bytes and M, N, Kd are
     * whole fours (then a float4 is wholly in or out of the product, masks aside) */
    const bool v4 = ((A.ld | B.ld | Kd | M | N) & 3) == 0 && !((reinterpret_cast<uintptr_t>(A.p) | reinterpret_cast<uintptr_t>(B.p)) & 15);
    for (int kc = 0; kc < Kd; kc += MK) {
        __syncthreads();   /* the previous stage's tiles (or the caller's writes) are done */
        if (v4) {
            if (!A.t)   /* rows i, along q */
                batched4<4>(
                    64 * MK / 4,
                    [&](int f) {
                        const int i = f / (MK / 4), q = 4 * (f % (MK / 4)), gq = kc + q;
                        int in = 0;
#pragma unroll
                        for (int c = 0; c < 4; c++) in |= mm_in(i, gq + c, M, Kd, tri) << c;
                        return in ? ld4_masked(A.p + (int64_t)i * A.ld + gq, in) : make_float4(0.f, 0.f, 0.f, 0.f);
                    },
                    [&](int f, float4 v) { *reinterpret_cast<float4 *>(As + (f / (MK / 4)) * MA + 4 * (f % (MK / 4))) = r4(v); });
            else   /* rows gq, along i */
                batched4<4>(
                    64 * MK / 4,
                    [&](int f) {
                        const int q = f / 16, i = 4 * (f % 16), gq = kc + q;
                        int in = 0;
#pragma unroll
                        for (int c = 0; c < 4; c++) in |= mm_in(i + c, gq, M, Kd, tri) << c;
                        return in ? ld4_masked(A.p + (int64_t)gq * A.ld + i, in) : make_float4(0.f, 0.f, 0.f, 0.f);
                    },
                    [&](int f, float4 v) {
                        const int q = f / 16, i = 4 * (f % 16);
                        v = r4(v);
                        As[i * MA + q] = v.x; As[(i + 1) * MA + q] = v.y; As[(i + 2) * MA + q] = v.z; As[(i + 3) * MA + q] = v.w;
                    });
            if (!B.t)   /* rows gq, along n */
                batched4<4>(
                    MK * nw / 4,
                    [&](int f) {
                        const int q = f / (nw / 4), n = 4 * (f % (nw / 4)), gq = kc + q;
                        return gq < Kd && n < N ? *reinterpret_cast<const float4 *>(B.p + (int64_t)gq * B.ld + n) : make_float4(0.f, 0.f, 0.f, 0.f);
                    },
                    [&](int f, float4 v) { *reinterpret_cast<float4 *>(Bs + (f / (nw / 4)) * lb + 4 * (f % (nw / 4))) = r4(v); });
            else   /* rows n, along q */
                batched4<4>(
                    MK * nw / 4,
                    [&](int f) {
                        const int n = f / (MK / 4), q = 4 * (f % (MK / 4)), gq = kc + q;
                        return gq < Kd && n < N ? *reinterpret_cast<const float4 *>(B.p + (int64_t)n * B.ld + gq) : make_float4(0.f, 0.f, 0.f, 0.f);
                    },
                    [&](int f, float4 v) {
                        const int n = f / (MK / 4), q = 4 * (f % (MK / 4));
                        v = r4(v);
                        Bs[q * lb + n] = v.x; Bs[(q + 1) * lb + n] = v.y; Bs[(q + 2) * lb + n] = v.z; Bs[(q + 3) * lb + n] = v.w;
                    });
        } else {
            batched(
                64 * MK,
                [&](int e) {
                    const int i = A.t ? e % 64 : e / MK, q = A.t ? e / 64 : e % MK, gq = kc + q;
                    if (!mm_in(i, gq, M, Kd, tri)) return 0.f;
                    return A.t ? A.p[(int64_t)gq * A.ld + i] : A.p[(int64_t)i * A.ld + gq];
                },
                [&](int e, float v) {
                    const int i = A.t ? e % 64 : e / MK, q = A.t ? e / 64 : e % MK;
                    As[i * MA + q] = gdn::tf32r_if<SPLIT>(v);
                });
            batched(
                MK * nw,
                [&](int e) {
                    const int q = B.t ? e % MK : e / nw, n = B.t ? e / MK : e % nw, gq = kc + q;
                    if (gq >= Kd || n >= N) return 0.f;
                    return B.t ? B.p[(int64_t)n * B.ld + gq] : B.p[(int64_t)gq * B.ld + n];
                },
                [&](int e, float v) {
                    const int q = B.t ? e % MK : e / nw, n = B.t ? e / MK : e % nw;
                    Bs[q * lb + n] = gdn::tf32r_if<SPLIT>(v);
                });
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const int task = warp + 8 * r;
            if (task >= tasks) break;
            const int i0 = (task / ntl) * 16, n0 = (task % ntl) * 32;   /* all four n tiles: Bs holds zeros past N */
            int k0 = 0, k1 = MK;
            if (tri & LOWER_A) k1 = i0 + 16 - kc < k1 ? i0 + 16 - kc : k1;
            if (tri & UPPER_A) k0 = i0 - kc > 0 ? i0 - kc : 0;
            if (k0 < k1) gdn::warp_mma_s<SPLIT, false, true, 4>(accr[r], As, MA, Bs, lb, i0, n0, k0, k1);
        }
    }
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const int task = warp + 8 * r;
        if (task >= tasks) break;
        const int i0 = (task / ntl) * 16, n0 = (task % ntl) * 32, nt = n8 - n0 / 8 < 4 ? n8 - n0 / 8 : 4;
        gdn::warp_store(accr[r], i0, n0, nt, M, N, [&](int i, int n, float v) {
            float *cp = C + (int64_t)i * ldc + n;
            if ((tri & LOWER_C) && n > i) *cp = 0.f;
            else *cp = alpha * v + (acc ? *cp : 0.f);
        });
    }
    __syncthreads();
}

/* the group stage, one block per (slot, value head): chunk_backward of
 * chunk_bwd.c step by step, every product on the tensor cores, the
 * per-item scratch in global memory (the steps' operands are too many for
 * shared memory) */
template <bool SPLIT>
__global__ void __launch_bounds__(NT, 2) grp_kernel(BwdArgs p, Grp G) {   /* two blocks an SM (mm_smem) */
    extern __shared__ __align__(16) float sm[];   /* mm's tiles; then gate_store's prefix sums */
    __shared__ float red[32], row[CC];
    float *gt = sm + 2 * CC * (CC + 1);   /* gate_store's inputs past its prefix sums (grp_smem) */
    double(*pre)[CC + 1] = reinterpret_cast<double(*)[CC + 1]>(sm);
    const Item it = item_of(p, G);
    if (it.c == 0) return;
    const int K = p.K, V = p.V;
    const Scr &o = G.o;
    float *w = it.w;
    const float *rec = it.rec;
    const int64_t so = (it.slot * p.HV + it.j) * (int64_t)K * V;
    const Mat S0{p.states + so, V, 0}, S0t{p.states + so, V, 1}, dS{p.dstates + so, V, 0}, dSt{p.dstates + so, V, 1};
    const auto W = [&](int64_t off, int ld, int t) { return Mat{w + off, ld, t}; };
    const auto R = [&](int off, int t) { return Mat{rec + off, CC, t}; };
    BP_DECL;
    GateTok gk;   /* gate_store's inputs, held in registers through the item */
    gk.issue(p, rec, it.row0, it.c, it.j);
    grp_load(p, G, it);
    __syncthreads();
    BP(0);
    /* U = Tm (Bv - Bk S0) (gdn_chunk_u) */
    mm<SPLIT>(CC, V, K, -1.f, W(o.Bk, K, 0), S0, w + o.Xr, V, 1, 0, sm);
    BP(1);
    mm<SPLIT>(CC, V, CC, 1.f, R(R_TM, 0), W(o.Xr, V, 0), w + o.U, V, 0, LOWER_A, sm);
    BP(2);
    /* dKd = U dS^T; dU = P^T dO + Kd dS */
    mm<SPLIT>(CC, K, V, 1.f, W(o.U, V, 0), dSt, w + o.dKd, K, 0, 0, sm);
    BP(3);
    mm<SPLIT>(CC, V, CC, 1.f, R(R_P, 1), W(o.dO, V, 0), w + o.dU, V, 0, UPPER_A, sm);
    BP(4);
    mm<SPLIT>(CC, V, K, 1.f, W(o.Kd, K, 0), dS, w + o.dU, V, 1, 0, sm);
    BP(5);
    grp_last(p, G, it, red);
    __syncthreads();
    BP(6);
    /* dP = dO U^T (s <= t); X = dO S0^T */
    mm<SPLIT>(CC, CC, V, 1.f, W(o.dO, V, 0), W(o.U, V, 1), w + o.dP, CC, 0, LOWER_C, sm);
    BP(7);
    mm<SPLIT>(CC, K, V, 1.f, W(o.dO, V, 0), S0t, w + o.Xq, K, 0, 0, sm);
    BP(8);
    grp_dp(p, G, it);
    __syncthreads();
    BP(9);
    /* dQc += dP~ K; dKc = dP~^T Q; dWk = -dU S0^T */
    mm<SPLIT>(CC, K, CC, 1.f, W(o.dP, CC, 0), W(o.Kc, K, 0), w + o.dQc, K, 1, LOWER_A, sm);
    BP(10);
    mm<SPLIT>(CC, K, CC, 1.f, W(o.dP, CC, 1), W(o.Q, K, 0), w + o.dKc, K, 0, UPPER_A, sm);
    BP(11);
    mm<SPLIT>(CC, K, V, -1.f, W(o.dU, V, 0), S0t, w + o.dWk, K, 0, 0, sm);
    BP(12);
    /* dTm = dWk Bk^T + dU Bv^T (lower) */
    mm<SPLIT>(CC, CC, K, 1.f, W(o.dWk, K, 0), W(o.Bk, K, 1), w + o.dTm, CC, 0, LOWER_C, sm);
    BP(13);
    mm<SPLIT>(CC, CC, V, 1.f, W(o.dU, V, 0), W(o.Bv, V, 1), w + o.dTm, CC, 1, LOWER_C, sm);
    BP(14);
    grp_mid(p, G, it);
    __syncthreads();
    BP(15);
    /* dBk = Tm^T dWk; dBv = Tm^T dU; dA = -Tm^T (dTm Tm^T) (s < t); KK into tmp */
    mm<SPLIT>(CC, K, CC, 1.f, R(R_TM, 1), W(o.dWk, K, 0), w + o.dBk, K, 0, UPPER_A, sm);
    BP(16);
    mm<SPLIT>(CC, V, CC, 1.f, R(R_TM, 1), W(o.dU, V, 0), w + o.dBv, V, 0, UPPER_A, sm);
    BP(17);
    mm<SPLIT>(CC, CC, CC, 1.f, W(o.dTm, CC, 0), R(R_TM, 1), w + o.tmp, CC, 0, LOWER_A, sm);
    BP(18);
    mm<SPLIT>(CC, CC, CC, -1.f, R(R_TM, 1), W(o.tmp, CC, 0), w + o.dA, CC, 0, UPPER_A | LOWER_C, sm);
    BP(19);
    mm<SPLIT>(CC, CC, K, 1.f, W(o.Kc, K, 0), W(o.Kc, K, 1), w + o.tmp, CC, 0, LOWER_C, sm);
    BP(20);
    grp_beta(p, G, it);
    __syncthreads();
    BP(21);
    /* dKc += dKK K + dKK^T K */
    mm<SPLIT>(CC, K, CC, 1.f, W(o.dA, CC, 0), W(o.Kc, K, 0), w + o.dKc, K, 1, LOWER_A, sm);
    BP(22);
    mm<SPLIT>(CC, K, CC, 1.f, W(o.dA, CC, 1), W(o.Kc, K, 0), w + o.dKc, K, 1, UPPER_A, sm);
    BP(23);
    __syncthreads();   /* mm's tiles no longer read */
    gk.commit(gt);
    gate_store(p, it.slot, it.j, it.row0, it.c, gt, w + o.Rg, CC, w + o.dgc, w + o.dbeta, row, pre);
    BP(24);
    BP_PRINT(G.s0 == 0 && blockIdx.x == 0, "group item: load | U: Xr, U | dKd, dU, dU | last | dP, Xq | dp | dQc, dKc, dWk, dTm, dTm | mid | dBk, dBv, tmp, dA, KK | beta | dKc, dKc | gate", 25, 1);
}

/* dq, dk of the group's (slot, q/k head h): the G value heads' dQc, dKc summed
 * in order from 0 (fp32, as dQacc), then store_qk_grad: dx = r (dx^ - x^ (x^.dx^)).
 * A warp takes two rows at a time, the lanes along them (PER columns a lane:
 * K <= 32 PER), all of a round's loads issued before any is used */
template <int PER>
__global__ void __launch_bounds__(NT) grp_qk_kernel(BwdArgs p, Grp G) {
    constexpr int RB = 2;
    const int64_t slot = G.s0 + blockIdx.x / p.H;
    const int h = blockIdx.x % p.H, K = p.K, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int c = p.slot_c[slot];
    if (c == 0) return;
    const int64_t row0 = p.slot_row0[slot];
    const bool l2 = (p.flags & GDN_QK_L2NORM) != 0;
    const float *base = G.scr + (slot - G.s0) * p.HV * G.o.F;
    for (int qk = 0; qk < 2; qk++) {
        const int64_t off = qk ? G.o.dKc : G.o.dQc;
        const void *x = qk ? p.k : p.q;
        const float *rstd = qk ? p.rstd_k : p.rstd_q;
        void *dst = qk ? p.dk : p.dq;
        for (int t0 = warp * RB; t0 < c; t0 += (NT / 32) * RB) {
            float a[RB][PER], xh[RB][PER], rs[RB];
#pragma unroll
            for (int r = 0; r < RB; r++) {
                const int64_t row = row0 + t0 + r;
                const bool on = t0 + r < c;
                rs[r] = l2 && on ? rstd[row * p.H + h] : 1.f;
#pragma unroll
                for (int u = 0; u < PER; u++) {
                    const int i = lane + 32 * u;
                    a[r][u] = 0.f;
                    xh[r][u] = l2 && on && i < K ? gdn::ld(x, (row * p.H + h) * K + i, p.dt) : 0.f;
                }
            }
            for (int jj = h * p.G; jj < (h + 1) * p.G; jj++) {
                const float *src = base + jj * G.o.F + off + (int64_t)t0 * K;
#pragma unroll
                for (int r = 0; r < RB; r++)
#pragma unroll
                    for (int u = 0; u < PER; u++) {
                        const int i = lane + 32 * u;
                        if (t0 + r < c && i < K) a[r][u] += src[r * K + i];
                    }
            }
#pragma unroll
            for (int r = 0; r < RB; r++) {
                if (t0 + r >= c) break;
                const int64_t row = row0 + t0 + r;
                float d = 0.f;
#pragma unroll
                for (int u = 0; u < PER; u++) {
                    xh[r][u] *= rs[r];
                    d = fmaf(xh[r][u], a[r][u], d);
                }
                if (l2) d = gdn::warp_sum(d);
#pragma unroll
                for (int u = 0; u < PER; u++) {
                    const int i = lane + 32 * u;
                    if (i >= K) continue;
                    const float val = l2 ? rs[r] * (a[r][u] - xh[r][u] * d) : a[r][u];
                    gdn::st(dst, (row * p.H + h) * K + i, val, p.dt);
                }
            }
        }
    }
}

/* dA_log, ddt_bias: per j (a block), the partials summed over slots in
 * double, in an order fixed by the launch alone (each thread a stride of
 * slots, then a tree over the threads): the same bits every run. One thread
 * a head walking every slot was a chain of dependent loads (long1: 1040
 * slots, ~0.6 ms). */
constexpr int DP_NT = 256;
__global__ void __launch_bounds__(DP_NT) dparam_kernel(BwdArgs p) {
    __shared__ double ra[DP_NT], rb[DP_NT];
    const int j = blockIdx.x, t = threadIdx.x;
    double sa = 0, sb = 0;
    for (int64_t s = t; s < p.nslots; s += DP_NT) {
        if (p.slot_c[s] == 0) continue;
        sa += p.part[s * p.HV + j];
        sb += p.part[p.nslots * p.HV + s * p.HV + j];
    }
    ra[t] = sa;
    rb[t] = sb;
    __syncthreads();
    for (int w = DP_NT / 2; w > 0; w >>= 1) {
        if (t < w) {
            ra[t] += ra[t + w];
            rb[t] += rb[t + w];
        }
        __syncthreads();
    }
    if (t == 0) {
        p.dA_log[j] = (float)ra[0];
        if (p.ddt_bias) p.ddt_bias[j] = (float)rb[0];
    }
}

/* grp_kernel's dynamic shared memory: mm's tiles, or gate_store's prefix sums and inputs */
int grp_smem(int K, int V) {
    int nmax = K > V ? K : V;
    if (nmax < CC) nmax = CC;
    const int mm = mm_smem(nmax) * (int)sizeof(float), gs = CC * (CC + 1) * (int)sizeof(double) + GT_FLOATS * (int)sizeof(float);
    return mm > gs ? mm : gs;
}

}  // namespace

template <bool SPLIT> cudaError_t GrpPass<SPLIT>::attr(int K, int V) { return smem_attr(grp_kernel<SPLIT>, grp_smem(K, V)); }
template <bool SPLIT> void GrpPass<SPLIT>::launch(const BwdArgs &p, const Grp &G, int64_t nsl, cudaStream_t st) {
    const int items = (int)(nsl * p.HV);
    grp_kernel<SPLIT><<<items, NT, grp_smem(p.K, p.V), st>>>(p, G);
    if (p.K <= 128) grp_qk_kernel<4><<<(unsigned)(nsl * p.H), NT, 0, st>>>(p, G);
    else grp_qk_kernel<8><<<(unsigned)(nsl * p.H), NT, 0, st>>>(p, G);
}
template struct GrpPass<true>;
template struct GrpPass<false>;

void grp_qk_launch(const BwdArgs &p, const Grp &G, int64_t nsl, cudaStream_t st) {
    if (p.K <= 128) grp_qk_kernel<4><<<(unsigned)(nsl * p.H), NT, 0, st>>>(p, G);
    else grp_qk_kernel<8><<<(unsigned)(nsl * p.H), NT, 0, st>>>(p, G);
}

void dparam_launch(const BwdArgs &p, cudaStream_t st) { dparam_kernel<<<p.HV, DP_NT, 0, st>>>(p); }

}  // namespace cbwd
}  // namespace gdn
