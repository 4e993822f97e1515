/* CUDA chunked backward (gdn_chunk_bwd), version 1: correct and complete
 * first, fp32 FMA throughout (no tensor cores), the math and the arithmetic
 * choices of the CPU backward (src/cpu/chunk_bwd.c, src/cpu/chunk.h).
 *
 * Chunks are addressed by a slot: chunk i of sequence n (bos, len) is slot
 * floor(bos / 64) + n + i, injective and < B*T/64 + N + 1 (the forward's
 * record count), so per-chunk arrays need no host-side index.
 *
 *   slot_info   per slot: first token row and length c (0 = no chunk)
 *   prep        per (slot, value head j): gate cumsum gc (double, as the
 *               CPU), exp(gc), beta, g, Tm = (I + A)^-1 by forward
 *               substitution and P into a record           (chunk_fwd.c prepare_head)
 *   fwd_sweep   per (n, j, 64 columns of V), chunks in order: the state
 *               entering each chunk into `states`           (chunk_bwd.c backward_span, first loop)
 *   bwd_sweep   per (n, j, 64 columns of V), chunks in reverse: dS leaving
 *               each chunk into `dstates`, dh0 at the end   (chunk_bwd.c dstate_span)
 *   group stage chunks in groups of whole slots (all HV heads of a slot in
 *               one group): chunk_backward of chunk_bwd.c step by step,
 *               batched fp32 products (bgemm) and per-item elementwise
 *               kernels over a per-item scratch; then dq, dk summed over
 *               the G value heads in order, the l2norm chain, stored
 *   dparam      dA_log, ddt_bias: per (slot, j) partials in double, summed
 *               over slots in order per j
 *
 * No atomics anywhere: every result has a fixed summation order, so repeated
 * runs give the same bits. All scratch is the caller's workspace; nothing is
 * allocated and nothing waits for the host. */
#include <cuda_runtime.h>
#ifdef GDN_BWD_PROFILE
#include <cstdio>
#endif
#include "cuda/common.cuh"
#include "cuda/cuda_backend.h"
#include "cuda/mma_tf32.cuh"

namespace {

constexpr int CC = 64;    /* chunk length              */
constexpr int NT = 256;   /* threads of every kernel    */
constexpr int VT = 64;    /* columns of V per sweep block */
constexpr int RS = 65;    /* padded row stride of the substitution's 64 x 64 arrays */
constexpr int R4 = 68;    /* row strides of 64-column shared arrays read by the tensor cores: */
constexpr int R8 = 72;    /* along rows (4 mod 32), across rows (8 mod 32); mma_tf32.cuh */

/* K rounded up to 8 (the products' k step), and a row stride >= it that is 4 mod 32 */
__host__ __device__ __forceinline__ int k8(int K) { return (K + 7) & ~7; }
__host__ __device__ __forceinline__ int ld4(int n) { return n + (36 - n % 32) % 32; }

/* record per (slot, j), in floats: gcd (64 doubles), gam, beta, g, Tm, P */
constexpr int R_GCD = 0, R_GAM = 128, R_BETA = 192, R_G = 256, R_TM = 320, R_P = 320 + CC * CC, REC = 320 + 2 * CC * CC;

/* tri flags of bgemm (as GDN_TRI_* of cpu/gemm.h) */
constexpr int LOWER_A = 1, UPPER_A = 2, LOWER_C = 4;

struct BwdArgs {
    const void *q, *k, *v, *g, *beta, *dout;
    const float *A_log, *dt_bias, *h0, *dht, *rstd_q, *rstd_k;
    void *dq, *dk, *dv, *dg, *dbeta;
    float *dA_log, *ddt_bias, *dh0;
    const int64_t *cu;
    int64_t T, N, nslots;
    int H, HV, K, V, G, dt, gdt, nvt;
    float scale;
    unsigned flags;
    /* workspace */
    int64_t *slot_row0;
    int *slot_c;
    float *rec, *states, *dstates;
    double *part;   /* [2][nslots*HV]: dA_log, ddt_bias partials */
};

__device__ __forceinline__ void seq_range(const BwdArgs &p, int64_t n, int64_t *bos, int64_t *len) {
    *bos = p.cu ? p.cu[n] : n * p.T;
    *len = p.cu ? p.cu[n + 1] - *bos : p.T;
}
__device__ __forceinline__ int64_t slot_base(const BwdArgs &p, int64_t n) {
    int64_t bos, len;
    seq_range(p, n, &bos, &len);
    return bos / CC + n;
}
/* exp(gc_t - gc_s), the difference in double (chunk_fwd.c prepare_head) */
__device__ __forceinline__ float Ef(const double *gcd, int t, int s) { return expf((float)(gcd[t] - gcd[s])); }

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

/* rows row0..row0+c-1 of q or k (head h), normalized by the saved rstd
 * (GDN_QK_L2NORM), into dst [64][ld]; rows >= c and columns >= K are zero */
__device__ void load_qk(const BwdArgs &p, const void *x, const float *rstd, int64_t row0, int c, int h, float *dst, int ld) {
    const bool l2 = (p.flags & GDN_QK_L2NORM) != 0;
    for (int e = threadIdx.x; e < CC * ld; e += NT) {
        const int t = e / ld, i = e % ld;
        float val = 0.f;
        if (t < c && i < p.K) {
            const int64_t r = row0 + t;
            val = gdn::ld(x, (r * p.H + h) * p.K + i, p.dt);
            if (l2) val *= rstd[r * p.H + h];
        }
        dst[e] = val;
    }
}

/* ---- prep: one block per (slot, j). Mirrors gdn_chunk_prepare (chunk_fwd.c):
 * gate and beta as cpu/load.c, gc in double, A_ts = beta_t E_ts KK_ts,
 * Tm by forward substitution, P_ts = (scale q_t.k_s) E_ts ---- */
template <bool SPLIT>
__global__ void __launch_bounds__(NT) prep_kernel(BwdArgs p) {
    extern __shared__ __align__(16) float sm[];
    const int64_t slot = blockIdx.x;
    const int j = blockIdx.y, h = j / p.G, K = p.K, tid = threadIdx.x, lk = ld4(k8(K));
    const int c = p.slot_c[slot];
    if (c == 0) return;
    const int64_t row0 = p.slot_row0[slot];
    float *Qs = sm, *Ks = Qs + CC * lk, *As = Ks + CC * lk, *Ts = As + CC * RS;
    double *gcd = reinterpret_cast<double *>(Ts + CC * RS);
    float *gs = reinterpret_cast<float *>(gcd + CC), *bs = gs + CC;
    float *rec = p.rec + (slot * p.HV + j) * (int64_t)REC;
    load_qk(p, p.q, p.rstd_q, row0, c, h, Qs, lk);
    load_qk(p, p.k, p.rstd_k, row0, c, h, Ks, lk);
    if (tid < CC) {   /* cpu/load.c gdn_cpu_load_gate, gdn_cpu_load_beta; zero past c */
        float g = 0.f, b = 0.f;
        if (tid < c) {
            const int64_t at = (row0 + tid) * p.HV + j;
            if (p.g) {
                g = gdn::ld(p.g, at, p.gdt);
                if (p.flags & GDN_GATE_FUSED) {
                    const float A = -expf(p.A_log[j]), bias = p.dt_bias ? p.dt_bias[j] : 0.f;
                    g = A * gdn::softplus(g + bias);
                }
            }
            b = gdn::ld(p.beta, at, p.gdt);
            if (p.flags & GDN_BETA_SIGMOID) b = ((p.flags & GDN_BETA_NEGATIVE) ? 2.f : 1.f) * gdn::sigmoid(b);
        }
        gs[tid] = g;
        bs[tid] = b;
    }
    __syncthreads();
    if (tid == 0) {   /* the chunk cumsum in double, as the CPU */
        double acc = 0;
        for (int t = 0; t < CC; t++) { acc += gs[t]; gcd[t] = acc; }
    }
    __syncthreads();
    if (tid < CC) {
        reinterpret_cast<double *>(rec + R_GCD)[tid] = gcd[tid];
        rec[R_GAM + tid] = expf((float)gcd[tid]);
        rec[R_BETA + tid] = bs[tid];
        rec[R_G + tid] = gs[tid];
    }
    /* A (strictly lower) into As, P into the record */
    const auto kt = [&](int i, int s) { return Ks[s * lk + i]; };
    gdn::block_mm<SPLIT>(CC, CC, K, [&](int t, int i) { return Ks[t * lk + i]; }, kt, [&](int t, int s, float kk) {
        As[t * RS + s] = s < t && t < c ? bs[t] * Ef(gcd, t, s) * kk : 0.f;
    });
    gdn::block_mm<SPLIT>(CC, CC, K, [&](int t, int i) { return Qs[t * lk + i]; }, kt, [&](int t, int s, float qk) {
        rec[R_P + t * CC + s] = s <= t && t < c ? (p.scale * qk) * Ef(gcd, t, s) : 0.f;
    });
    __syncthreads();
    /* Tm_t = e_t - sum_{s<t} A_ts Tm_s, row by row; thread `col` owns column col */
    for (int t = 0; t < CC; t++) {
        if (tid < CC) {
            float acc = 0.f;
            for (int s = 0; s < t; s++) acc -= As[t * RS + s] * Ts[s * RS + tid];
            Ts[t * RS + tid] = tid == t ? 1.f : (tid > t ? 0.f : acc);
        }
        __syncthreads();
    }
    for (int e = tid; e < CC * CC; e += NT) rec[R_TM + e] = Ts[(e / CC) * RS + e % CC];
}

/* state (n, j) of h0 / dht / dh0, element (i, v) of the k-first view */
__device__ __forceinline__ int64_t state_at(const BwdArgs &p, int64_t n, int j, int i, int v) {
    const int64_t base = (n * p.HV + j) * (int64_t)p.K * p.V;
    return base + ((p.flags & GDN_STATE_V_FIRST) ? (int64_t)v * p.K + i : (int64_t)i * p.V + v);
}

/* ---- fwd_sweep: one block per (n, j, VT columns). Per chunk (chunk_fwd.c
 * gdn_chunk_u, gdn_chunk_state_step):
 *   states[slot] = S;  X = Bv - Bk S;  U = Tm X;  S = exp(gc_last) S + Kd^T U ---- */
template <bool SPLIT>
__global__ void __launch_bounds__(NT) fwd_sweep_kernel(BwdArgs p) {
    extern __shared__ __align__(16) float sm[];
    const int K = p.K, V = p.V, tid = threadIdx.x, Kp = k8(K), lk = ld4(Kp);
    const int vb = blockIdx.x % p.nvt, j = (blockIdx.x / p.nvt) % p.HV, h = j / p.G;
    const int64_t n = blockIdx.x / (p.nvt * p.HV);
    const int v0 = vb * VT;
    float *S = sm, *Ks = S + Kp * R8, *Tm = Ks + CC * lk, *X = Tm + CC * R4, *U = X + CC * R8;
    double *gcd = reinterpret_cast<double *>(U + CC * R8);
    float *gam = reinterpret_cast<float *>(gcd + CC), *bet = gam + CC, *ek = bet + CC;
    for (int e = tid; e < Kp * R8; e += NT) {
        const int i = e / R8, v = v0 + e % R8;
        S[e] = (p.h0 && i < K && e % R8 < VT && v < V) ? p.h0[state_at(p, n, j, i, v)] : 0.f;
    }
    int64_t bos, len;
    seq_range(p, n, &bos, &len);
    const int64_t nch = (len + CC - 1) / CC, sb = bos / CC + n;
    for (int64_t ci = 0; ci < nch; ci++) {
        const int64_t slot = sb + ci, row0 = bos + ci * CC;
        const int c = len - ci * CC < CC ? (int)(len - ci * CC) : CC;
        const float *rec = p.rec + (slot * p.HV + j) * (int64_t)REC;
        __syncthreads();   /* S complete; the previous chunk's Ks, Tm, X, U no longer read */
        float *st = p.states + (slot * p.HV + j) * (int64_t)K * V;
        for (int e = tid; e < K * VT; e += NT) {
            const int i = e / VT, v = v0 + e % VT;
            if (v < V) st[(int64_t)i * V + v] = S[i * R8 + e % VT];
        }
        load_qk(p, p.k, p.rstd_k, row0, c, h, Ks, lk);
        for (int e = tid; e < CC * CC; e += NT) Tm[(e / CC) * R4 + e % CC] = rec[R_TM + e];
        if (tid < CC) {
            gcd[tid] = reinterpret_cast<const double *>(rec + R_GCD)[tid];
            gam[tid] = rec[R_GAM + tid];
            bet[tid] = rec[R_BETA + tid];
        }
        __syncthreads();
        if (tid < CC) ek[tid] = tid < c ? Ef(gcd, c - 1, tid) : 0.f;   /* exp(gc_last - gc_s) */
        /* X = Bv - Bk S, Bv = beta v, Bk = beta exp(gc) k */
        gdn::block_mm<SPLIT>(CC, VT, K, [&](int t, int i) { return Ks[t * lk + i]; }, [&](int i, int v) { return S[i * R8 + v]; },
                             [&](int t, int v, float acc) {
                                 float x = 0.f;
                                 if (t < c && v0 + v < V)
                                     x = bet[t] * gdn::ld(p.v, ((row0 + t) * p.HV + j) * (int64_t)V + v0 + v, p.dt) -
                                         (bet[t] * gam[t]) * acc;
                                 X[t * R8 + v] = x;
                             });
        __syncthreads();
        /* U = Tm X (Tm lower triangular) */
        gdn::block_mm<SPLIT>(
            CC, VT, CC, [&](int t, int s) { return Tm[t * R4 + s]; }, [&](int s, int v) { return X[s * R8 + v]; },
            [&](int t, int v, float acc) { U[t * R8 + v] = acc; }, [](int i0, int *, int *k1) { *k1 = i0 + 16; });
        __syncthreads();
        /* S = exp(gc_last) S + Kd^T U */
        const float gl = gam[c - 1];
        gdn::block_mm<SPLIT>(Kp, VT, CC, [&](int i, int s) { return ek[s] * Ks[s * lk + i]; },
                             [&](int s, int v) { return U[s * R8 + v]; },
                             [&](int i, int v, float acc) { S[i * R8 + v] = gl * S[i * R8 + v] + acc; });
    }
}

/* ---- bwd_sweep: one block per (n, j, VT columns), chunks in reverse
 * (chunk_bwd.c dstate_span). dS is dL/dS leaving the chunk:
 *   dstates[slot] = dS
 *   dU = P^T dO + Kd dS;  Y = Tm^T dU (= dBv)
 *   dS = exp(gc_last) dS - Bk^T Y + (scale diag(exp gc) Q)^T dO
 * (Bk^T Y = Wk^T dU, Wk = Tm Bk). dh0 = dS after the first chunk. ---- */
template <bool SPLIT>
__global__ void __launch_bounds__(NT) bwd_sweep_kernel(BwdArgs p) {
    extern __shared__ __align__(16) float sm[];
    const int K = p.K, V = p.V, tid = threadIdx.x, Kp = k8(K), lk = ld4(Kp);
    const int vb = blockIdx.x % p.nvt, j = (blockIdx.x / p.nvt) % p.HV, h = j / p.G;
    const int64_t n = blockIdx.x / (p.nvt * p.HV);
    const int v0 = vb * VT;
    float *dS = sm, *Ks = dS + Kp * R8, *P = Ks + CC * lk, *Tm = P + CC * R8, *dO = Tm + CC * R8, *dU = dO + CC * R8,
          *Y = P;   /* P is read only before Y is written */
    double *gcd = reinterpret_cast<double *>(dU + CC * R8);
    float *gam = reinterpret_cast<float *>(gcd + CC), *bet = gam + CC, *ek = bet + CC;
    for (int e = tid; e < Kp * R8; e += NT) {
        const int i = e / R8, v = v0 + e % R8;
        dS[e] = (p.dht && i < K && e % R8 < VT && v < V) ? p.dht[state_at(p, n, j, i, v)] : 0.f;
    }
    int64_t bos, len;
    seq_range(p, n, &bos, &len);
    const int64_t nch = (len + CC - 1) / CC, sb = bos / CC + n;
    for (int64_t ci = nch - 1; ci >= 0; ci--) {
        const int64_t slot = sb + ci, row0 = bos + ci * CC;
        const int c = len - ci * CC < CC ? (int)(len - ci * CC) : CC;
        const float *rec = p.rec + (slot * p.HV + j) * (int64_t)REC;
        __syncthreads();   /* dS complete; the previous chunk's arrays no longer read */
        float *st = p.dstates + (slot * p.HV + j) * (int64_t)K * V;
        for (int e = tid; e < K * VT; e += NT) {
            const int i = e / VT, v = v0 + e % VT;
            if (v < V) st[(int64_t)i * V + v] = dS[i * R8 + e % VT];
        }
        load_qk(p, p.k, p.rstd_k, row0, c, h, Ks, lk);
        for (int e = tid; e < CC * CC; e += NT) {
            P[(e / CC) * R8 + e % CC] = rec[R_P + e];
            Tm[(e / CC) * R8 + e % CC] = rec[R_TM + e];
        }
        for (int e = tid; e < CC * VT; e += NT) {
            const int t = e / VT, v = v0 + e % VT;
            dO[t * R8 + e % VT] = (t < c && v < V) ? gdn::ld(p.dout, ((row0 + t) * p.HV + j) * (int64_t)V + v, p.dt) : 0.f;
        }
        if (tid < CC) {
            gcd[tid] = reinterpret_cast<const double *>(rec + R_GCD)[tid];
            gam[tid] = rec[R_GAM + tid];
            bet[tid] = rec[R_BETA + tid];
        }
        __syncthreads();
        if (tid < CC) ek[tid] = tid < c ? Ef(gcd, c - 1, tid) : 0.f;
        __syncthreads();
        /* dU = P^T dO + Kd dS, one product over k = (s, then i) */
        gdn::block_mm<SPLIT>(
            CC, VT, CC + Kp,
            [&](int t, int k) { return k < CC ? P[k * R8 + t] : ek[t] * Ks[t * lk + k - CC]; },
            [&](int k, int v) { return k < CC ? dO[k * R8 + v] : dS[(k - CC) * R8 + v]; },
            [&](int t, int v, float acc) { dU[t * R8 + v] = acc; }, [](int i0, int *k0, int *) { *k0 = i0; });
        __syncthreads();
        /* Y = Tm^T dU */
        gdn::block_mm<SPLIT>(
            CC, VT, CC, [&](int t, int s) { return Tm[s * R8 + t]; }, [&](int s, int v) { return dU[s * R8 + v]; },
            [&](int t, int v, float acc) { Y[t * R8 + v] = acc; }, [](int i0, int *k0, int *) { *k0 = i0; });
        __syncthreads();
        /* dS = exp(gc_last) dS - Bk^T Y */
        const float gl = gam[c - 1];
        gdn::block_mm<SPLIT>(Kp, VT, CC, [&](int i, int t) { return (bet[t] * gam[t]) * Ks[t * lk + i]; },
                             [&](int t, int v) { return Y[t * R8 + v]; },
                             [&](int i, int v, float acc) { dS[i * R8 + v] = gl * dS[i * R8 + v] - acc; });
        __syncthreads();   /* Ks free: q rows in its place */
        load_qk(p, p.q, p.rstd_q, row0, c, h, Ks, lk);
        __syncthreads();
        /* dS += (scale exp(gc_t) q_t)^T dO */
        gdn::block_mm<SPLIT>(Kp, VT, CC, [&](int i, int t) { return (p.scale * gam[t]) * Ks[t * lk + i]; },
                             [&](int t, int v) { return dO[t * R8 + v]; },
                             [&](int i, int v, float acc) { dS[i * R8 + v] += acc; });
    }
    if (p.dh0) {
        __syncthreads();
        for (int e = tid; e < K * VT; e += NT) {
            const int i = e / VT, v = v0 + e % VT;
            if (v < V) p.dh0[state_at(p, n, j, i, v)] = dS[i * R8 + e % VT];
        }
    }
}

/* ---- batched products over the items of a group (gdn_gemm / gdn_gemm_tri
 * of cpu/gemm.h on device memory): per item,
 *   C[M,N] = alpha op(A)[M,Kd] op(B)[Kd,N] + (acc ? C : 0)
 * op(X)[i][q] = X.t ? X[q*ld + i] : X[i*ld + q]. Masked elements (LOWER_A:
 * q > i, UPPER_A: q < i) are never read; LOWER_C writes 0 above the diagonal.
 * 64 x 64 output tiles, 4 x 4 per thread; items whose slot has no chunk are
 * skipped. ---- */
struct Mat { const float *p; int64_t bs; int ld, t; };
struct Gemm {
    int M, N, Kd, tri, acc;
    float alpha;
    Mat A, B;
    float *C;
    int64_t cbs;
    int ldc;
    const int *item_c;   /* c of the item's slot: item_c[item / hv] */
    int hv;
};

template <bool SPLIT>
__global__ void __launch_bounds__(NT) bgemm_kernel(Gemm g) {
    constexpr int BK = 32, LA = BK + 4, LB = 64 + 8;   /* As [64][LA] read along k, Bs [BK][LB] across */
    __shared__ float As[64 * LA], Bs[BK * LB];
    const int item = blockIdx.x;
    if (g.item_c[item / g.hv] == 0) return;
    const int tn = (g.N + 63) / 64, m0 = (blockIdx.y / tn) * 64, n0 = (blockIdx.y % tn) * 64;
    const float *A = g.A.p + item * g.A.bs, *B = g.B.p + item * g.B.bs;
    float *C = g.C + item * g.cbs;
    const int tid = threadIdx.x, warp = tid >> 5, wi = (warp >> 1) * 16, wn = (warp & 1) * 32;
    float acc[4][4] = {};
    const bool skip = (g.tri & LOWER_C) && n0 > m0 + 63;   /* all above the diagonal */
    for (int k0 = 0; k0 < g.Kd && !skip; k0 += BK) {
        __syncthreads();
        for (int e = tid; e < BK * 64; e += NT) {
            int i, q;
            if (g.A.t) { q = e / 64; i = e % 64; } else { i = e / BK; q = e % BK; }
            const int gi = m0 + i, gq = k0 + q;
            bool ok = gi < g.M && gq < g.Kd;
            if ((g.tri & LOWER_A) && gq > gi) ok = false;
            if ((g.tri & UPPER_A) && gq < gi) ok = false;
            As[i * LA + q] = ok ? (g.A.t ? A[(int64_t)gq * g.A.ld + gi] : A[(int64_t)gi * g.A.ld + gq]) : 0.f;
        }
        for (int e = tid; e < BK * 64; e += NT) {
            int jn, q;
            if (g.B.t) { jn = e / BK; q = e % BK; } else { q = e / 64; jn = e % 64; }
            const int gj = n0 + jn, gq = k0 + q;
            const bool ok = gj < g.N && gq < g.Kd;
            Bs[q * LB + jn] = ok ? (g.B.t ? B[(int64_t)gj * g.B.ld + gq] : B[(int64_t)gq * g.B.ld + gj]) : 0.f;
        }
        __syncthreads();
        gdn::warp_mma<SPLIT>(acc, [&](int i, int q) { return As[i * LA + q]; }, [&](int q, int n) { return Bs[q * LB + n]; },
                             wi, wn, 4, 0, BK);
    }
    gdn::warp_store(acc, m0 + wi, n0 + wn, 4, g.M, g.N, [&](int i, int jn, float v) {
        float *cp = C + (int64_t)i * g.ldc + jn;
        if ((g.tri & LOWER_C) && jn > i) *cp = 0.f;
        else *cp = g.alpha * v + (g.acc ? *cp : 0.f);
    });
}

/* ---- the group stage: per-item scratch (floats, offsets from the item's base) ---- */
struct Scr {
    int64_t F;   /* floats per item */
    int64_t Q, Kc, Bk, Kd, dKd, Xq, dQc, dKc, dWk, dBk;   /* [64][K] */
    int64_t Vv, Bv, Xr, U, dO, dU, dBv;                   /* [64][V] */
    int64_t dP, dTm, tmp, dA, Rg;                         /* [64][64] */
    int64_t dgc, dbeta;                                   /* [64]     */
};

Scr scr_layout(int K, int V) {
    Scr s;
    int64_t o = 0;
    auto take = [&](int64_t n) { const int64_t at = o; o += (n + 31) / 32 * 32; return at; };
    s.Q = take(CC * K); s.Kc = take(CC * K); s.Bk = take(CC * K); s.Kd = take(CC * K); s.dKd = take(CC * K);
    s.Xq = take(CC * K); s.dQc = take(CC * K); s.dKc = take(CC * K); s.dWk = take(CC * K); s.dBk = take(CC * K);
    s.Vv = take(CC * V); s.Bv = take(CC * V); s.Xr = take(CC * V); s.U = take(CC * V); s.dO = take(CC * V);
    s.dU = take(CC * V); s.dBv = take(CC * V);
    s.dP = take(CC * CC); s.dTm = take(CC * CC); s.tmp = take(CC * CC); s.dA = take(CC * CC); s.Rg = take(CC * CC);
    s.dgc = take(CC); s.dbeta = take(CC);
    s.F = o;
    return s;
}

struct Grp {
    int64_t s0;      /* first slot of the group */
    float *scr;      /* item 0's scratch */
    Scr o;
};

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

/* step 1: the chunk's rows and their scaled forms (zero past c); Rg, dgc, dbeta zeroed */
__global__ void __launch_bounds__(NT) grp_load_kernel(BwdArgs p, Grp G) {
    const Item it = item_of(p, G);
    if (it.c == 0) return;
    const int K = p.K, V = p.V, c = it.c;
    float *w = it.w;
    const float *gam = it.rec + R_GAM, *bet = it.rec + R_BETA;
    load_qk(p, p.q, p.rstd_q, it.row0, c, it.h, w + G.o.Q, K);
    load_qk(p, p.k, p.rstd_k, it.row0, c, it.h, w + G.o.Kc, K);
    __syncthreads();
    for (int e = threadIdx.x; e < CC * K; e += NT) {
        const int t = e / K;
        const float kc = w[G.o.Kc + e];
        w[G.o.Bk + e] = (bet[t] * gam[t]) * kc;
        w[G.o.Kd + e] = (t < c ? Ef(it.gcd, c - 1, t) : 0.f) * kc;
    }
    for (int e = threadIdx.x; e < CC * V; e += NT) {
        const int t = e / V, v = e % V;
        const int64_t at = ((it.row0 + t) * p.HV + it.j) * (int64_t)V + v;
        const float vv = t < c ? gdn::ld(p.v, at, p.dt) : 0.f;
        w[G.o.Vv + e] = vv;
        w[G.o.dO + e] = t < c ? gdn::ld(p.dout, at, p.dt) : 0.f;
        w[G.o.Bv + e] = bet[t] * vv;
        w[G.o.Xr + e] = bet[t] * vv;
    }
    for (int e = threadIdx.x; e < CC * CC; e += NT) w[G.o.Rg + e] = 0.f;
    if (threadIdx.x < CC) { w[G.o.dgc + threadIdx.x] = 0.f; w[G.o.dbeta + threadIdx.x] = 0.f; }
}

/* chunk_backward: "S1 = exp(gc_last) S0 + Kd^T U: the gate terms and dK from Kd" */
__global__ void __launch_bounds__(NT) grp_last_kernel(BwdArgs p, Grp G) {
    __shared__ float red[32];
    const Item it = item_of(p, G);
    if (it.c == 0) return;
    const int K = p.K, c = it.c, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float *w = it.w;
    const int64_t so = (it.slot * p.HV + it.j) * (int64_t)K * p.V;
    const float *S0 = p.states + so, *dS = p.dstates + so;
    float part = 0.f;
    for (int64_t e = threadIdx.x; e < (int64_t)K * p.V; e += NT) part = fmaf(S0[e], dS[e], part);
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
__global__ void __launch_bounds__(NT) grp_dp_kernel(BwdArgs p, Grp G) {
    const Item it = item_of(p, G);
    if (it.c == 0) return;
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
__global__ void __launch_bounds__(NT) grp_mid_kernel(BwdArgs p, Grp G) {
    const Item it = item_of(p, G);
    if (it.c == 0) return;
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
__global__ void __launch_bounds__(NT) grp_beta_kernel(BwdArgs p, Grp G) {
    const Item it = item_of(p, G);
    if (it.c == 0) return;
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

/* chunk_backward: "dg = reverse cumsum of dgc; then through the fused gate",
 * the beta sigmoid chain, stores of dg and dbeta; dA_log, ddt_bias partials */
__global__ void __launch_bounds__(NT) grp_gate_kernel(BwdArgs p, Grp G) {
    __shared__ float row[CC];
    const Item it = item_of(p, G);
    const int64_t gi = it.slot * p.HV + it.j;
    if (it.c == 0) return;
    const int c = it.c, t = threadIdx.x, HV = p.HV;
    const float *w = it.w;
    if (p.g) {
        if (t < c) {   /* dg_t = sum_{t'>=t} dgc_t' + sum_{t'>=t} sum_{s<t} Rg_t's, in double, CPU order */
            double acc = 0, colsum = 0;
            for (int tp = c - 1; tp >= t; tp--) {
                double pre = 0;
                for (int u = 0; u < t; u++) pre += w[G.o.Rg + tp * CC + u];
                colsum += pre;
                acc += w[G.o.dgc + tp];
            }
            row[t] = (float)(acc + colsum);
        }
        __syncthreads();
        if (t == 0) {
            if (p.flags & GDN_GATE_FUSED) {
                const float A = -expf(p.A_log[it.j]), bias = p.dt_bias ? p.dt_bias[it.j] : 0.f;
                double sa = 0, sb = 0;
                for (int u = 0; u < c; u++) {
                    const float x = gdn::ld(p.g, (it.row0 + u) * HV + it.j, p.gdt) + bias;
                    const float dg = row[u];
                    sa += (double)dg * (double)it.rec[R_G + u];
                    row[u] = dg * A * (x > 20.f ? 1.f : gdn::sigmoid(x));
                    sb += row[u];
                }
                p.part[gi] = sa;
                p.part[p.nslots * HV + gi] = sb;
            }
        }
        __syncthreads();
        if (t < c) gdn::st(p.dg, (it.row0 + t) * HV + it.j, row[t], p.gdt);
    }
    if (t < c) {
        float db = w[G.o.dbeta + t];
        if (p.flags & GDN_BETA_SIGMOID) {
            const float m = (p.flags & GDN_BETA_NEGATIVE) ? 2.f : 1.f;
            const float sg = gdn::sigmoid(gdn::ld(p.beta, (it.row0 + t) * HV + it.j, p.gdt));
            db *= m * sg * (1.f - sg);
        }
        gdn::st(p.dbeta, (it.row0 + t) * HV + it.j, db, p.gdt);
    }
}

/* dq, dk of the group's (slot, q/k head h): the G value heads' dQc, dKc summed
 * in order from 0 (fp32, as dQacc), then store_qk_grad: dx = r (dx^ - x^ (x^.dx^)) */
__global__ void __launch_bounds__(NT) grp_qk_kernel(BwdArgs p, Grp G) {
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
        for (int t = warp; t < c; t += NT / 32) {
            const int64_t r = row0 + t;
            constexpr int PER = 256 / 32;
            float gsum[PER], xh[PER];
            float d = 0.f;
            const float rs = l2 ? rstd[r * p.H + h] : 1.f;
#pragma unroll
            for (int u = 0; u < PER; u++) {
                const int i = lane + 32 * u;
                float a = 0.f;
                if (i < K)
                    for (int jj = h * p.G; jj < (h + 1) * p.G; jj++) a += base[jj * G.o.F + off + t * K + i];
                gsum[u] = a;
                xh[u] = (l2 && i < K) ? gdn::ld(x, (r * p.H + h) * K + i, p.dt) * rs : 0.f;
                d = fmaf(xh[u], a, d);
            }
            if (l2) d = gdn::warp_sum(d);
#pragma unroll
            for (int u = 0; u < PER; u++) {
                const int i = lane + 32 * u;
                if (i >= K) continue;
                const float val = l2 ? rs * (gsum[u] - xh[u] * d) : gsum[u];
                gdn::st(dst, (r * p.H + h) * K + i, val, p.dt);
            }
        }
    }
}

/* dA_log, ddt_bias: per j, the partials summed over slots in order (double) */
__global__ void dparam_kernel(BwdArgs p) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= p.HV) return;
    double sa = 0, sb = 0;
    for (int64_t s = 0; s < p.nslots; s++) {
        if (p.slot_c[s] == 0) continue;
        sa += p.part[s * p.HV + j];
        sb += p.part[p.nslots * p.HV + s * p.HV + j];
    }
    p.dA_log[j] = (float)sa;
    if (p.ddt_bias) p.ddt_bias[j] = (float)sb;
}

/* ---- host side ---- */

int64_t nslots_of(const gdn_plan *pl) { return pl->c.B * pl->c.T / CC + pl->N + 1; }

/* slots per group: about 256 items, whole slots */
int64_t group_slots(const gdn_plan *pl) {
    int64_t g = 256 / pl->c.HV;
    if (g < 1) g = 1;
    const int64_t ns = nslots_of(pl);
    return g < ns ? g : ns;
}

struct WsLayout { size_t info_c, rec, states, dstates, part, scr, total; };
size_t al(size_t x) { return (x + 255) / 256 * 256; }
WsLayout ws_layout(const gdn_plan *pl) {
    const gdn_config *c = &pl->c;
    const size_t ns = (size_t)nslots_of(pl), items = ns * c->HV, kv = (size_t)c->K * c->V;
    WsLayout l;
    size_t o = al(ns * sizeof(int64_t));
    l.info_c = o; o += al(ns * sizeof(int));
    l.rec = o; o += al(items * REC * sizeof(float));
    l.states = o; o += al(items * kv * sizeof(float));
    l.dstates = o; o += al(items * kv * sizeof(float));
    l.part = o; o += al(2 * items * sizeof(double));
    l.scr = o; o += al((size_t)group_slots(pl) * c->HV * scr_layout(c->K, c->V).F * sizeof(float));
    l.total = o;
    return l;
}

int sweep_smem(int K, bool bwd) {
    const int Kp = k8(K), floats = Kp * R8 + CC * ld4(Kp) + (bwd ? 4 * CC * R8 : CC * R4 + 2 * CC * R8);
    return (floats + 2 * CC /* gcd */ + 3 * CC) * (int)sizeof(float);
}
int prep_smem(int K) { return (2 * CC * ld4(k8(K)) + 2 * CC * RS + 2 * CC + 2 * CC) * (int)sizeof(float); }

struct Launcher {
    cudaStream_t st;
    const BwdArgs &p;
    const Grp &G;
    int items;
    bool split;
    cudaError_t err = cudaSuccess;
    /* one product over the group's items; operands in the scratch (ws offsets),
     * the record (rec) or the state arrays */
    void mm(int M, int N, int Kd, float alpha, Mat A, Mat B, int64_t c_off, int ldc, int acc, int tri) {
        if (err != cudaSuccess) return;
        Gemm g;
        g.M = M; g.N = N; g.Kd = Kd; g.tri = tri; g.acc = acc; g.alpha = alpha; g.A = A; g.B = B;
        g.C = G.scr + c_off; g.cbs = G.o.F; g.ldc = ldc; g.item_c = p.slot_c + G.s0; g.hv = p.HV;
        const dim3 grid((unsigned)items, (unsigned)(((M + 63) / 64) * ((N + 63) / 64)));
        if (split) bgemm_kernel<true><<<grid, NT, 0, st>>>(g);
        else bgemm_kernel<false><<<grid, NT, 0, st>>>(g);
        err = cudaGetLastError();
    }
    Mat scr(int64_t off, int ld, int t) const { return Mat{G.scr + off, G.o.F, ld, t}; }
    Mat rec(int off, int t) const { return Mat{p.rec + G.s0 * p.HV * (int64_t)REC + off, REC, CC, t}; }
    Mat state(const float *base, int t) const {
        return Mat{base + G.s0 * p.HV * (int64_t)p.K * p.V, (int64_t)p.K * p.V, p.V, t};
    }
};

template <typename Kern>
cudaError_t smem_attr(Kern k, int bytes) {   /* host-side only: capture-safe */
    return bytes > 48 * 1024 ? cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) : cudaSuccess;
}

cudaError_t run(const gdn_plan *pl, const BwdArgs &p, const WsLayout &wl, char *ws, cudaStream_t st) {
    const int K = p.K, V = p.V, HV = p.HV;
    cudaError_t e;
    const int64_t ns = p.nslots;
#ifdef GDN_BWD_PROFILE   /* milliseconds per phase (events; not capture-safe) */
    cudaEvent_t ev[5];
    for (int i = 0; i < 5; i++) cudaEventCreate(&ev[i]);
    cudaEventRecord(ev[0], st);
#define PHASE(i) cudaEventRecord(ev[i], st)
#else
#define PHASE(i) do { } while (0)
#endif
    slot_info_kernel<<<(unsigned)((ns + NT - 1) / NT), NT, 0, st>>>(p);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    const int smp = prep_smem(K), smf = sweep_smem(K, false), smb = sweep_smem(K, true);
    /* f32 inputs: every product as 3xTF32 (fp32 accuracy); bf16 / f16: one tf32 product */
    const bool split = p.dt == 0;
    const auto prep = split ? prep_kernel<true> : prep_kernel<false>;
    const auto fsweep = split ? fwd_sweep_kernel<true> : fwd_sweep_kernel<false>;
    const auto bsweep = split ? bwd_sweep_kernel<true> : bwd_sweep_kernel<false>;
    if ((e = smem_attr(prep, smp)) != cudaSuccess) return e;
    if ((e = smem_attr(fsweep, smf)) != cudaSuccess) return e;
    if ((e = smem_attr(bsweep, smb)) != cudaSuccess) return e;
    prep<<<dim3((unsigned)ns, (unsigned)HV), NT, smp, st>>>(p);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    PHASE(1);
    if (p.N > 0) {
        const unsigned blocks = (unsigned)(p.N * HV * p.nvt);
        fsweep<<<blocks, NT, smf, st>>>(p);
        PHASE(2);
        bsweep<<<blocks, NT, smb, st>>>(p);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
    }
    PHASE(3);
    const Scr o = scr_layout(K, V);
    const int64_t gs = group_slots(pl);
    for (int64_t s0 = 0; s0 < ns; s0 += gs) {
        const int64_t s1 = s0 + gs < ns ? s0 + gs : ns;
        Grp G;
        G.s0 = s0; G.scr = reinterpret_cast<float *>(ws + wl.scr); G.o = o;
        const int items = (int)((s1 - s0) * HV);
        Launcher L{st, p, G, items, split};
        const Mat S0 = L.state(p.states, 0), S0t = L.state(p.states, 1), dS = L.state(p.dstates, 0),
                  dSt = L.state(p.dstates, 1);
        grp_load_kernel<<<items, NT, 0, st>>>(p, G);
        /* U = Tm (Bv - Bk S0) (gdn_chunk_u) */
        L.mm(CC, V, K, -1.f, L.scr(o.Bk, K, 0), S0, o.Xr, V, 1, 0);
        L.mm(CC, V, CC, 1.f, L.rec(R_TM, 0), L.scr(o.Xr, V, 0), o.U, V, 0, LOWER_A);
        /* dKd = U dS^T; dU = P^T dO + Kd dS */
        L.mm(CC, K, V, 1.f, L.scr(o.U, V, 0), dSt, o.dKd, K, 0, 0);
        L.mm(CC, V, CC, 1.f, L.rec(R_P, 1), L.scr(o.dO, V, 0), o.dU, V, 0, UPPER_A);
        L.mm(CC, V, K, 1.f, L.scr(o.Kd, K, 0), dS, o.dU, V, 1, 0);
        if (L.err != cudaSuccess) return L.err;
        grp_last_kernel<<<items, NT, 0, st>>>(p, G);
        /* dP = dO U^T (s <= t); X = dO S0^T */
        L.mm(CC, CC, V, 1.f, L.scr(o.dO, V, 0), L.scr(o.U, V, 1), o.dP, CC, 0, LOWER_C);
        L.mm(CC, K, V, 1.f, L.scr(o.dO, V, 0), S0t, o.Xq, K, 0, 0);
        if (L.err != cudaSuccess) return L.err;
        grp_dp_kernel<<<items, NT, 0, st>>>(p, G);
        /* dQc += dP~ K; dKc = dP~^T Q; dWk = -dU S0^T */
        L.mm(CC, K, CC, 1.f, L.scr(o.dP, CC, 0), L.scr(o.Kc, K, 0), o.dQc, K, 1, LOWER_A);
        L.mm(CC, K, CC, 1.f, L.scr(o.dP, CC, 1), L.scr(o.Q, K, 0), o.dKc, K, 0, UPPER_A);
        L.mm(CC, K, V, -1.f, L.scr(o.dU, V, 0), S0t, o.dWk, K, 0, 0);
        /* dTm = dWk Bk^T + dU Bv^T (lower) */
        L.mm(CC, CC, K, 1.f, L.scr(o.dWk, K, 0), L.scr(o.Bk, K, 1), o.dTm, CC, 0, LOWER_C);
        L.mm(CC, CC, V, 1.f, L.scr(o.dU, V, 0), L.scr(o.Bv, V, 1), o.dTm, CC, 1, LOWER_C);
        if (L.err != cudaSuccess) return L.err;
        grp_mid_kernel<<<items, NT, 0, st>>>(p, G);
        /* dBk = Tm^T dWk; dBv = Tm^T dU; dA = -Tm^T (dTm Tm^T) (s < t); KK into tmp */
        L.mm(CC, K, CC, 1.f, L.rec(R_TM, 1), L.scr(o.dWk, K, 0), o.dBk, K, 0, UPPER_A);
        L.mm(CC, V, CC, 1.f, L.rec(R_TM, 1), L.scr(o.dU, V, 0), o.dBv, V, 0, UPPER_A);
        L.mm(CC, CC, CC, 1.f, L.scr(o.dTm, CC, 0), L.rec(R_TM, 1), o.tmp, CC, 0, LOWER_A);
        L.mm(CC, CC, CC, -1.f, L.rec(R_TM, 1), L.scr(o.tmp, CC, 0), o.dA, CC, 0, UPPER_A | LOWER_C);
        L.mm(CC, CC, K, 1.f, L.scr(o.Kc, K, 0), L.scr(o.Kc, K, 1), o.tmp, CC, 0, LOWER_C);
        if (L.err != cudaSuccess) return L.err;
        grp_beta_kernel<<<items, NT, 0, st>>>(p, G);
        /* dKc += dKK K + dKK^T K */
        L.mm(CC, K, CC, 1.f, L.scr(o.dA, CC, 0), L.scr(o.Kc, K, 0), o.dKc, K, 1, LOWER_A);
        L.mm(CC, K, CC, 1.f, L.scr(o.dA, CC, 1), L.scr(o.Kc, K, 0), o.dKc, K, 1, UPPER_A);
        if (L.err != cudaSuccess) return L.err;
        grp_gate_kernel<<<items, NT, 0, st>>>(p, G);
        grp_qk_kernel<<<(unsigned)((s1 - s0) * p.H), NT, 0, st>>>(p, G);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
    }
    if (p.flags & GDN_GATE_FUSED) {
        dparam_kernel<<<(HV + 127) / 128, 128, 0, st>>>(p);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
    }
#ifdef GDN_BWD_PROFILE
    PHASE(4);
    cudaEventSynchronize(ev[4]);
    float ms[4];
    for (int i = 0; i < 4; i++) cudaEventElapsedTime(&ms[i], ev[i], ev[i + 1]);
    printf("chunk_bwd phases ms: prep %.3f | fwd sweep %.3f | bwd sweep %.3f | group stage %.3f\n", ms[0], ms[1], ms[2], ms[3]);
    for (int i = 0; i < 5; i++) cudaEventDestroy(ev[i]);
#endif
#undef PHASE
    return cudaSuccess;
}

}  // namespace

extern "C" size_t gdn_cuda_chunk_bwd_ws(const gdn_plan *pl) { return ws_layout(pl).total; }

extern "C" gdn_status gdn_cuda_chunk_bwd(const gdn_plan *pl, const gdn_bwd_args *a, void *ws, void *stream) {
    const gdn_config *c = &pl->c;
    BwdArgs p;
    p.q = a->q; p.k = a->k; p.v = a->v; p.g = a->g; p.beta = a->beta; p.dout = a->dout;
    p.A_log = a->A_log; p.dt_bias = a->dt_bias; p.h0 = a->h0; p.dht = a->dht;
    const gdn_saved_layout sl = gdn_saved_at(c, const_cast<void *>(a->saved));
    p.rstd_q = sl.rstd_q; p.rstd_k = sl.rstd_k;
    p.dq = a->dq; p.dk = a->dk; p.dv = a->dv; p.dg = a->dg; p.dbeta = a->dbeta;
    p.dA_log = a->dA_log; p.ddt_bias = a->ddt_bias; p.dh0 = a->dh0;
    p.cu = c->cu_seqlens ? c->cu_seqlens_dev : nullptr;
    p.T = c->T; p.N = pl->N; p.nslots = nslots_of(pl);
    p.H = c->H; p.HV = c->HV; p.K = c->K; p.V = c->V; p.G = pl->G; p.dt = (int)c->dtype; p.gdt = (int)c->gate_dtype;
    p.nvt = (c->V + VT - 1) / VT;
    p.scale = c->scale; p.flags = c->flags;
    const WsLayout wl = ws_layout(pl);
    char *w = static_cast<char *>(ws);
    p.slot_row0 = reinterpret_cast<int64_t *>(w);
    p.slot_c = reinterpret_cast<int *>(w + wl.info_c);
    p.rec = reinterpret_cast<float *>(w + wl.rec);
    p.states = reinterpret_cast<float *>(w + wl.states);
    p.dstates = reinterpret_cast<float *>(w + wl.dstates);
    p.part = reinterpret_cast<double *>(w + wl.part);
    const cudaError_t e = run(pl, p, wl, w, (cudaStream_t)stream);
    if (e != cudaSuccess) return gdn_fail(GDN_ERR_BACKEND, "chunk backward kernel launch: %s", cudaGetErrorString(e));
    return GDN_OK;
}
