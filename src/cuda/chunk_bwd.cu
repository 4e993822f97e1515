/* CUDA chunked backward (gdn_chunk_bwd), version 2: the math and the
 * arithmetic choices of the CPU backward (src/cpu/chunk_bwd.c,
 * src/cpu/chunk.h), every product on the tensor cores as 3xTF32 (fp32
 * accuracy; src/cuda/mma_tf32.cuh), the rest fp32 / double as the CPU. *
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
 *               one group): one block per (slot, j) runs chunk_backward of
 *               chunk_bwd.c step by step over a per-item scratch in global
 *               memory (grp_kernel); then dq, dk summed over the G value
 *               heads in order, the l2norm chain, stored (grp_qk_kernel)
 *   dparam      dA_log, ddt_bias: per (slot, j) partials in double, summed
 *               over slots in order per j
 *
 * No atomics anywhere: every result has a fixed summation order, so repeated
 * runs give the same bits. All scratch is the caller's workspace; nothing is
 * allocated and nothing waits for the host. -DGDN_BWD_PROFILE prints the
 * phases' times (events) and the cycles of each step (block 0). */
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

/* tri flags of mm (as GDN_TRI_* of cpu/gemm.h) */
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
#ifdef GDN_BWD_PROFILE   /* cycles per step, thread 0 */
#define BP_DECL long long bp_[24] = {0}, bt_ = clock64()
#define BP(k) do { if (threadIdx.x == 0) { const long long t1_ = clock64(); bp_[k] += t1_ - bt_; bt_ = t1_; } } while (0)
#define BP_PRINT(cond, name, n, div)                                              \
    do {                                                                          \
        if (threadIdx.x == 0 && (cond)) {                                         \
            printf("%s cycles:", name);                                           \
            for (int i_ = 0; i_ < (n); i_++) printf(" %lld", bp_[i_] / (div));    \
            printf("\n");                                                         \
        }                                                                         \
    } while (0)
#else
#define BP_DECL do { } while (0)
#define BP(k) do { } while (0)
#define BP_PRINT(cond, name, n, div) do { } while (0)
#endif

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

/* for (e = threadIdx.x; e < n; e += NT) put(e, get(e)), UNR values loaded
 * before any is stored: a plain loop whose store may alias the next load
 * waits out the memory latency once per element */
template <int UNR = 8, typename FG, typename FP>
__device__ __forceinline__ void batched(int n, const FG &get, const FP &put) {
    for (int e0 = threadIdx.x; e0 < n; e0 += UNR * NT) {
        float v[UNR];
#pragma unroll
        for (int u = 0; u < UNR; u++) v[u] = e0 + u * NT < n ? get(e0 + u * NT) : 0.f;
#pragma unroll
        for (int u = 0; u < UNR; u++)
            if (e0 + u * NT < n) put(e0 + u * NT, v[u]);
    }
}

/* rows row0..row0+c-1 of q or k (head h), normalized by the saved rstd
 * (GDN_QK_L2NORM), into dst [64][ld]; rows >= c and columns >= K are zero.
 * A warp per row, two rows at a time, the lanes along the row: the index
 * arithmetic and the rstd once per row, 2 x 9 loads in flight per lane (an
 * element-wise loop with an index division per element measured 55k cycles
 * per chunk in the forward sweep, nine tenths of it instructions and stalls) */
__device__ void load_qk(const BwdArgs &p, const void *x, const float *rstd, int64_t row0, int c, int h, float *dst, int ld) {
    constexpr int PER = (256 + 4 + 31) / 32;   /* ld <= 260 */
    const bool l2 = (p.flags & GDN_QK_L2NORM) != 0;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, K = p.K;
    for (int t0 = warp; t0 < CC; t0 += 2 * (NT / 32)) {
        float v[2][PER], rs[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int t = t0 + r * (NT / 32);
            const int64_t at = (row0 + t) * p.H + h;
            rs[r] = t < c && l2 ? rstd[at] : 1.f;
#pragma unroll
            for (int u = 0; u < PER; u++) {
                const int i = lane + 32 * u;
                v[r][u] = t < c && i < K ? gdn::ld(x, at * K + i, p.dt) : 0.f;
            }
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int t = t0 + r * (NT / 32);
#pragma unroll
            for (int u = 0; u < PER; u++) {
                const int i = lane + 32 * u;
                if (i < ld) dst[t * ld + i] = v[r][u] * rs[r];
            }
        }
    }
}

/* rows row0..row0+c-1 of a [rows][HV][V] tensor (value head j), columns
 * v0..v0+n-1, into dst [64][ld]; rows >= c and columns past V are zero.
 * Laid out as load_qk; n <= 256 */
__device__ void load_rows_v(const BwdArgs &p, const void *x, int64_t row0, int c, int j, int v0, int n, float *dst, int ld) {
    constexpr int PER = 256 / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, V = p.V;
    for (int t0 = warp; t0 < CC; t0 += 2 * (NT / 32)) {
        float v[2][PER];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int t = t0 + r * (NT / 32);
            const int64_t at = ((row0 + t) * p.HV + j) * (int64_t)V + v0;
#pragma unroll
            for (int u = 0; u < PER; u++) {
                const int i = lane + 32 * u;
                v[r][u] = t < c && i < n && v0 + i < V ? gdn::ld(x, at + i, p.dt) : 0.f;
            }
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int t = t0 + r * (NT / 32);
#pragma unroll
            for (int u = 0; u < PER; u++) {
                const int i = lane + 32 * u;
                if (i < n) dst[t * ld + i] = v[r][u];
            }
        }
    }
}

/* the 64 x 64 matrix at src (row stride 64) into dst with row stride ld */
__device__ __forceinline__ void load_64x64(float *dst, int ld, const float *src) {
    batched<16>(CC * CC, [&](int e) { return src[e]; }, [&](int e, float v) { dst[(e >> 6) * ld + (e & 63)] = v; });
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
    BP_DECL;
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
        BP(0);
        load_qk(p, p.k, p.rstd_k, row0, c, h, Ks, lk);
        load_rows_v(p, p.v, row0, c, j, v0, VT, X, R8);
        load_64x64(Tm, R4, rec + R_TM);
        if (tid < CC) {
            gcd[tid] = reinterpret_cast<const double *>(rec + R_GCD)[tid];
            gam[tid] = rec[R_GAM + tid];
            bet[tid] = rec[R_BETA + tid];
        }
        __syncthreads();
        if (tid < CC) ek[tid] = tid < c ? Ef(gcd, c - 1, tid) : 0.f;   /* exp(gc_last - gc_s) */
        BP(1);
        /* X = Bv - Bk S, Bv = beta v, Bk = beta exp(gc) k */
        gdn::block_mm<SPLIT>(CC, VT, K, [&](int t, int i) { return Ks[t * lk + i]; }, [&](int i, int v) { return S[i * R8 + v]; },
                             [&](int t, int v, float acc) {   /* X holds v (zero past c and V) */
                                 X[t * R8 + v] = t < c ? bet[t] * X[t * R8 + v] - (bet[t] * gam[t]) * acc : 0.f;
                             });
        __syncthreads();
        BP(2);
        /* U = Tm X (Tm lower triangular) */
        gdn::block_mm<SPLIT>(
            CC, VT, CC, [&](int t, int s) { return Tm[t * R4 + s]; }, [&](int s, int v) { return X[s * R8 + v]; },
            [&](int t, int v, float acc) { U[t * R8 + v] = acc; }, [](int i0, int *, int *k1) { *k1 = i0 + 16; });
        __syncthreads();
        BP(3);
        /* S = exp(gc_last) S + Kd^T U */
        const float gl = gam[c - 1];
        gdn::block_mm<SPLIT>(Kp, VT, CC, [&](int i, int s) { return ek[s] * Ks[s * lk + i]; },
                             [&](int s, int v) { return U[s * R8 + v]; },
                             [&](int i, int v, float acc) { S[i * R8 + v] = gl * S[i * R8 + v] + acc; });
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
        load_64x64(P, R8, rec + R_P);
        load_64x64(Tm, R8, rec + R_TM);
        load_rows_v(p, p.dout, row0, c, j, v0, VT, dO, R8);
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
__device__ void grp_load(const BwdArgs &p, const Grp &G, const Item &it) {
    const int K = p.K, V = p.V, c = it.c;
    float *w = it.w;
    const float *gam = it.rec + R_GAM, *bet = it.rec + R_BETA;
    load_qk(p, p.q, p.rstd_q, it.row0, c, it.h, w + G.o.Q, K);
    load_qk(p, p.k, p.rstd_k, it.row0, c, it.h, w + G.o.Kc, K);
    __syncthreads();
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

/* chunk_backward: "dg = reverse cumsum of dgc; then through the fused gate",
 * the beta sigmoid chain, stores of dg and dbeta; dA_log, ddt_bias partials */
__device__ void grp_gate(const BwdArgs &p, const Grp &G, const Item &it, float *row, double (*pre)[CC + 1]) {
    const int64_t gi = it.slot * p.HV + it.j;
    const int c = it.c, t = threadIdx.x, HV = p.HV;
    const float *w = it.w;
    if (p.g) {
        /* dg_t = sum_{t'>=t} dgc_t' + sum_{t'>=t} sum_{s<t} Rg_t's, in double:
         * pre[t'][t] = sum_{s<t} Rg_t's by rows, then the sums over t' by columns */
        if (t < c) {
            double a = 0;
            for (int u = 0; u < c; u++) {
                pre[t][u] = a;
                a += w[G.o.Rg + t * CC + u];
            }
        }
        __syncthreads();
        if (t < c) {
            double acc = 0, colsum = 0;
            for (int tp = c - 1; tp >= t; tp--) {
                colsum += pre[tp][t];
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

/* one product of the item: C[M,N] = alpha op(A) op(B) + (acc ? C : 0) on
 * the tensor cores, M <= 64, N <= 256; op(X)[i][q] = X.t ? X[q*ld + i] :
 * X[i*ld + q]; masked elements (LOWER_A: q > i, UPPER_A: q < i) are never
 * read; LOWER_C writes 0 above the diagonal. The operands (global memory:
 * scratch, record, states) come through shared memory `sm` (mm_smem floats)
 * 64 columns of k at a time, each element read from global memory once
 * (fragment reads straight from global memory measured the same: the
 * group stage is bound by its scratch traffic, bench/NOTES.md).
 * Starts and ends with a barrier. */
struct Mat { const float *p; int ld, t; };
constexpr int MK = 64, MA = MK + 4;   /* k per stage; As [64][MA] is read along k */
__host__ __device__ __forceinline__ int mm_lb(int N) { const int n = (N + 31) & ~31; return n + 8; }   /* Bs [MK][lb], read across k */
__host__ __device__ __forceinline__ int mm_smem(int Nmax) { return 64 * MA + MK * mm_lb(Nmax); }

template <bool SPLIT>
__device__ void mm(int M, int N, int Kd, float alpha, Mat A, Mat B, float *C, int ldc, int acc, int tri, float *sm) {
    const int warp = threadIdx.x >> 5, ntl = (N + 31) >> 5, tasks = ((M + 15) >> 4) * ntl, n8 = (N + 7) >> 3;
    const int lb = mm_lb(N), nw = (N + 31) & ~31;
    float *As = sm, *Bs = sm + 64 * MA;
    float accr[4][4][4] = {};
    for (int kc = 0; kc < Kd; kc += MK) {
        __syncthreads();   /* the previous stage's tiles (or the caller's writes) are done */
        batched(
            64 * MK,
            [&](int e) {
                const int i = A.t ? e % 64 : e / MK, q = A.t ? e / 64 : e % MK, gq = kc + q;
                if (i >= M || gq >= Kd || ((tri & LOWER_A) && gq > i) || ((tri & UPPER_A) && gq < i)) return 0.f;
                return A.t ? A.p[(int64_t)gq * A.ld + i] : A.p[(int64_t)i * A.ld + gq];
            },
            [&](int e, float v) {
                const int i = A.t ? e % 64 : e / MK, q = A.t ? e / 64 : e % MK;
                As[i * MA + q] = v;
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
                Bs[q * lb + n] = v;
            });
        __syncthreads();
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const int task = warp + 8 * r;
            if (task >= tasks) break;
            const int i0 = (task / ntl) * 16, n0 = (task % ntl) * 32, nt = n8 - n0 / 8 < 4 ? n8 - n0 / 8 : 4;
            int k0 = 0, k1 = MK;
            if (tri & LOWER_A) k1 = i0 + 16 - kc < k1 ? i0 + 16 - kc : k1;
            if (tri & UPPER_A) k0 = i0 - kc > 0 ? i0 - kc : 0;
            if (k0 < k1)
                gdn::warp_mma<SPLIT>(accr[r], [&](int i, int q) { return As[i * MA + q]; },
                                     [&](int q, int n) { return Bs[q * lb + n]; }, i0, n0, nt, k0, k1);
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
__global__ void __launch_bounds__(NT) grp_kernel(BwdArgs p, Grp G) {
    extern __shared__ __align__(16) float sm[];   /* mm's tiles; then grp_gate's prefix sums */
    __shared__ float red[32], row[CC];
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
    grp_gate(p, G, it, row, pre);
    BP(24);
    BP_PRINT(G.s0 == 0 && blockIdx.x == 0, "group item: load | U: Xr, U | dKd, dU, dU | last | dP, Xq | dp | dQc, dKc, dWk, dTm, dTm | mid | dBk, dBv, tmp, dA, KK | beta | dKc, dKc | gate", 25, 1);
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

/* slots per group: about 512 items (a few blocks per SM), whole slots */
int64_t group_slots(const gdn_plan *pl) {
    int64_t g = 512 / pl->c.HV;
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
    /* every product as 3xTF32 (fp32 accuracy). One tf32 product is not enough
     * even for bf16 inputs: dk through the L2 norm at K = 1 cancels the tf32
     * rounding of dKc up to 1.5e-2 of the result (bound 1e-2) */
    constexpr bool SPLIT = true;
    const auto prep = prep_kernel<SPLIT>;
    const auto fsweep = fwd_sweep_kernel<SPLIT>;
    const auto bsweep = bwd_sweep_kernel<SPLIT>;
    if ((e = smem_attr(prep, smp)) != cudaSuccess) return e;
    if ((e = smem_attr(fsweep, smf)) != cudaSuccess) return e;
    if ((e = smem_attr(bsweep, smb)) != cudaSuccess) return e;
    int nmax = K > V ? K : V;
    if (nmax < CC) nmax = CC;
    const int smg = mm_smem(nmax) * (int)sizeof(float) > CC * (CC + 1) * (int)sizeof(double)
                        ? mm_smem(nmax) * (int)sizeof(float) : CC * (CC + 1) * (int)sizeof(double);
    if ((e = smem_attr(grp_kernel<SPLIT>, smg)) != cudaSuccess) return e;
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
        grp_kernel<SPLIT><<<items, NT, smg, st>>>(p, G);
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
