/* CUDA causal depthwise conv1d (the math of src/cpu/conv1d.c). For sequence
 * n (rows bos..eos-1 of x [B*T, D]) and channel d, with the extended input
 *     xx[s] = x[bos+s, d] (s >= 0),   h0[n, d, W+s] (-W <= s < 0; 0 without h0)
 *     y[t] = act(bias[d] + sum_{w<W} weight[d,w] xx[t-W+1+w])   (fp32, w ascending)
 *     ht[n, d, j] = xx[L-W+j]                                  (last W inputs, newest last)
 * Forward: a thread owns VEC adjacent channels (16 bytes of x where D and the
 * pointers allow, 8 past W = 4, else 1 channel) and a run of tt consecutive
 * token rows, keeping the weights and the last W-1 inputs in registers; a
 * warp covers 32 adjacent channel vectors of one row, so a row access is one
 * coalesced 512-byte piece, and every input is read once (plus W-1 rows per
 * run, from cache). Loads run U rows ahead of the math. With cu_seqlens a run
 * may cross sequence borders: there the window restarts from the next
 * sequence's h0. ht comes from a second, small kernel after the convolution,
 * so ht may be h0 itself (an in-place state update): no read of h0 can
 * follow a write.
 * Update: one block per (row, 256 channels), a thread per channel with its
 * state row in registers (16-byte accesses for W = 4, 8); rows that share a
 * slot are applied in row order by the block of the slot's first row, so
 * nothing races and no atomics are needed.
 * Launch bounds name 1 block per SM explicitly: ptxas's own occupancy target
 * spills a few registers in some instances; with this, none spills. */
#include <cuda_runtime.h>
#include "cuda/common.cuh"
#include "cuda/vec.cuh"
#include "cuda/cuda_layer.h"

namespace {

enum { FWD_THREADS = 128, UPD_THREADS = 256, U = 4 };

struct FwdArgs {
    const void *x;
    const float *w, *bias, *h0;
    void *y;
    float *ht;
    const int64_t *cu;   /* device cu_seqlens, or NULL: sequence n is rows n*T.. */
    int64_t T, R, N;     /* tokens per row (no cu), rows B*T, sequences */
    unsigned ncv;        /* channel vectors per row: D / VEC */
    unsigned tiles, tpr; /* runs of tt rows: in all; per batch row (no cu) */
    int D, silu, tt;     /* tt: token rows per thread */
};

/* the sequence holding row t: largest n with cu[n] <= t (R > 0) */
__device__ __forceinline__ void seq_of(const FwdArgs &p, int64_t t, int64_t *n, int64_t *bos, int64_t *eos) {
    int64_t lo = 0, hi = p.N - 1;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo + 1) / 2;
        if (p.cu[mid] <= t) lo = mid; else hi = mid - 1;
    }
    *n = lo; *bos = p.cu[lo]; *eos = p.cu[lo + 1];
}

/* xx[s] of channels d0.. of sequence n for s < 0, from h0 (strided by W) */
template <int W, int VEC>
__device__ __forceinline__ void state_in(const FwdArgs &p, int64_t n, int d0, int64_t s, float (&v)[VEC]) {
#pragma unroll
    for (int c = 0; c < VEC; c++) v[c] = p.h0 ? p.h0[((n * p.D) + d0 + c) * W + W + s] : 0.f;
}

/* Run `tile` of tt rows (32-bit indices: the host keeps threads < 2^32).
 * Without cu_seqlens a run never crosses a batch row (tpr runs per row); with
 * them, runs cut the flattened rows and may cross sequence borders. */
template <int DT, int W, int VEC>
__global__ void __launch_bounds__(FWD_THREADS, 1) conv_fwd_kernel(FwdArgs p) {
    constexpr int WM = W > 1 ? W - 1 : 1;
    const unsigned gid = blockIdx.x * FWD_THREADS + threadIdx.x, tile = gid / p.ncv;
    if (tile >= p.tiles) return;
    const int d0 = (int)(gid % p.ncv) * VEC;
    int64_t n, bos, eos, t0, t1;
    if (p.cu) {
        t0 = (int64_t)tile * p.tt;
        t1 = min(t0 + (int64_t)p.tt, p.R);
        seq_of(p, t0, &n, &bos, &eos);
    } else {
        n = tile / p.tpr;
        bos = n * p.T;
        eos = bos + p.T;
        t0 = bos + (int64_t)(tile % p.tpr) * p.tt;
        t1 = min(t0 + (int64_t)p.tt, eos);
    }
    float wt[W][VEC], bv[VEC];
    if constexpr (VEC % 4 == 0) {   /* the VEC*W weights are contiguous and 16-byte aligned (weight is): 16-byte loads */
        float wr[VEC * W];
#pragma unroll
        for (int k = 0; k < VEC * W; k += 4) {
            float v4[4];
            gdn::ldf<4>(p.w, (int64_t)d0 * W + k, v4);
#pragma unroll
            for (int e = 0; e < 4; e++) wr[k + e] = v4[e];
        }
#pragma unroll
        for (int c = 0; c < VEC; c++)
#pragma unroll
            for (int w = 0; w < W; w++) wt[w][c] = wr[c * W + w];
    } else {
#pragma unroll
        for (int c = 0; c < VEC; c++)
#pragma unroll
            for (int w = 0; w < W; w++) wt[w][c] = p.w[(int64_t)(d0 + c) * W + w];
    }
#pragma unroll
    for (int c = 0; c < VEC; c++) bv[c] = p.bias ? p.bias[d0 + c] : 0.f;
    float win[WM][VEC];   /* xx[t-W+1 .. t-1], oldest first */
#pragma unroll
    for (int j = 0; j < W - 1; j++) {
        const int64_t s = t0 - (W - 1) + j;
        if (s >= bos) gdn::ldv<DT, VEC>(p.x, s * p.D + d0, win[j]);
        else state_in<W, VEC>(p, n, d0, s - bos, win[j]);
    }
    for (int64_t tb = t0; tb < t1; tb += U) {
        float xv[U][VEC];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (tb + u < t1) gdn::ldv<DT, VEC>(p.x, (tb + u) * p.D + d0, xv[u]);
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t t = tb + u;
            if (t >= t1) break;
            if (t == eos) {   /* varlen: a new sequence (skipping empty ones), the window from its h0 */
                do { n++; bos = eos; eos = p.cu[n + 1]; } while (eos == bos);
#pragma unroll
                for (int j = 0; j < W - 1; j++) state_in<W, VEC>(p, n, d0, j - (W - 1), win[j]);
            }
            float z[VEC];
#pragma unroll
            for (int c = 0; c < VEC; c++) {
                float acc = bv[c];
#pragma unroll
                for (int w = 0; w < W - 1; w++) acc += wt[w][c] * win[w][c];
                acc += wt[W - 1][c] * xv[u][c];
                z[c] = p.silu ? gdn::silu(acc) : acc;
            }
            gdn::stv<DT, VEC>(p.y, t * p.D + d0, z);
#pragma unroll
            for (int j = 0; j + 1 < W - 1; j++)
#pragma unroll
                for (int c = 0; c < VEC; c++) win[j][c] = win[j + 1][c];
            if (W > 1)
#pragma unroll
                for (int c = 0; c < VEC; c++) win[WM - 1][c] = xv[u][c];
        }
    }
}

/* ht[n, d, j] = xx[L-W+j]: all W values read before any is written (ht may be h0) */
template <int DT>
__global__ void __launch_bounds__(FWD_THREADS) conv_ht_kernel(FwdArgs p, int W) {
    const int64_t i = (int64_t)blockIdx.x * FWD_THREADS + threadIdx.x;
    if (i >= p.N * p.D) return;
    const int64_t n = i / p.D;
    const int d = (int)(i % p.D);
    const int64_t bos = p.cu ? p.cu[n] : n * p.T, L = (p.cu ? p.cu[n + 1] : bos + p.T) - bos;
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        if (j >= W) break;
        const int64_t s = L - W + j;
        v[j] = s >= 0 ? gdn::ld(p.x, (bos + s) * p.D + d, DT) : p.h0 ? p.h0[i * W + W + s] : 0.f;
    }
#pragma unroll
    for (int j = 0; j < 8; j++) if (j < W) p.ht[i * W + j] = v[j];
}

template <int DT, int W>
cudaError_t launch_fwd_w(const FwdArgs &p, int vec, cudaStream_t st) {
    const unsigned blocks = (unsigned)(((int64_t)p.ncv * p.tiles + FWD_THREADS - 1) / FWD_THREADS);
    /* 16 bytes per access; past W = 4, 8 bytes (the weights and window stay in registers) */
    constexpr int V16 = 16 / gdn::esize<DT>(), VW = W <= 4 ? V16 : V16 / 2;
    if (vec == VW) conv_fwd_kernel<DT, W, VW><<<blocks, FWD_THREADS, 0, st>>>(p);
    else conv_fwd_kernel<DT, W, 1><<<blocks, FWD_THREADS, 0, st>>>(p);
    return cudaGetLastError();
}

template <int DT>
cudaError_t launch_fwd(const FwdArgs &p, int W, int vec, cudaStream_t st) {
    switch (W) {
    case 1: return launch_fwd_w<DT, 1>(p, vec, st);
    case 2: return launch_fwd_w<DT, 2>(p, vec, st);
    case 3: return launch_fwd_w<DT, 3>(p, vec, st);
    case 4: return launch_fwd_w<DT, 4>(p, vec, st);
    case 5: return launch_fwd_w<DT, 5>(p, vec, st);
    case 6: return launch_fwd_w<DT, 6>(p, vec, st);
    case 7: return launch_fwd_w<DT, 7>(p, vec, st);
    default: return launch_fwd_w<DT, 8>(p, vec, st);
    }
}

/* ---- single-token update ---- */

struct UpdArgs {
    const void *x;
    const float *w, *bias;
    float *state;
    const int32_t *slots;
    void *y;             /* NULL: state only (the decode step's conv pass) */
    int64_t B, num_slots;
    int D, silu, unique, nchunk;
    bool vr;             /* state and weight 16-byte aligned: rows in vector accesses */
};

/* the W floats of a state or weight row: with vr (16-byte aligned pools),
 * W % 4 == 0 in 16-byte accesses and W % 2 == 0 in 8-byte ones */
template <int W>
__device__ __forceinline__ void ld_row(const float *p, float (&s)[W], bool vr) {
    if (!vr) {
#pragma unroll
        for (int k = 0; k < W; k++) s[k] = p[k];
    } else if constexpr (W % 4 == 0) {
#pragma unroll
        for (int k = 0; k < W; k += 4) {
            const float4 v = *reinterpret_cast<const float4 *>(p + k);
            s[k] = v.x; s[k + 1] = v.y; s[k + 2] = v.z; s[k + 3] = v.w;
        }
    } else if constexpr (W % 2 == 0) {
#pragma unroll
        for (int k = 0; k < W; k += 2) {
            const float2 v = *reinterpret_cast<const float2 *>(p + k);
            s[k] = v.x; s[k + 1] = v.y;
        }
    } else {
#pragma unroll
        for (int k = 0; k < W; k++) s[k] = p[k];
    }
}

template <int W>
__device__ __forceinline__ void st_row(float *p, const float (&s)[W], bool vr) {
    if (!vr) {
#pragma unroll
        for (int k = 0; k < W; k++) p[k] = s[k];
    } else if constexpr (W % 4 == 0) {
#pragma unroll
        for (int k = 0; k < W; k += 4) *reinterpret_cast<float4 *>(p + k) = make_float4(s[k], s[k + 1], s[k + 2], s[k + 3]);
    } else if constexpr (W % 2 == 0) {
#pragma unroll
        for (int k = 0; k < W; k += 2) *reinterpret_cast<float2 *>(p + k) = make_float2(s[k], s[k + 1]);
    } else {
#pragma unroll
        for (int k = 0; k < W; k++) p[k] = s[k];
    }
}

/* state row shifts left, x enters newest; returns act(bias + sum_w wt[w] s[w]) */
template <int W>
__device__ __forceinline__ float update_one(float (&s)[W], const float (&wt)[W], float bias, float x, int silu) {
    float acc = bias;
#pragma unroll
    for (int w = 0; w + 1 < W; w++) { s[w] = s[w + 1]; acc += wt[w] * s[w]; }
    s[W - 1] = x;
    acc += wt[W - 1] * x;
    return silu ? gdn::silu(acc) : acc;
}

template <int DT, int W>
__global__ void __launch_bounds__(UPD_THREADS, 1) conv_update_kernel(UpdArgs p) {
    __shared__ unsigned mask[UPD_THREADS / 32];
    const int64_t b = blockIdx.x / p.nchunk;
    const int d = (int)(blockIdx.x % p.nchunk) * UPD_THREADS + threadIdx.x;
    const bool active = d < p.D;
    const int64_t slot = p.slots ? p.slots[b] : b;
    if (slot < 0 || slot >= p.num_slots) {   /* padding (or a slot out of range): y row 0, no state access */
        if (active && p.y) gdn::st(p.y, b * p.D + d, 0.f, DT);
        return;
    }
    const bool scan = p.slots && !p.unique;
    if (scan) {   /* an earlier row has this slot: that row's block applies this one */
        int dup = 0;
        for (int64_t r = threadIdx.x; r < b; r += UPD_THREADS) dup |= p.slots[r] == slot;
        if (__syncthreads_or(dup)) return;
    }
    float wt[W], s[W];
    float *row = p.state + (slot * p.D + d) * W;
    float bias = 0.f;
    if (active) {
        ld_row<W>(p.w + (int64_t)d * W, wt, p.vr);
        ld_row<W>(row, s, p.vr);
        bias = p.bias ? p.bias[d] : 0.f;
        const float yv = update_one<W>(s, wt, bias, gdn::ld(p.x, b * p.D + d, DT), p.silu);
        if (p.y) gdn::st(p.y, b * p.D + d, yv, DT);
    }
    if (scan) {   /* the later rows of this slot, in row order, 256 candidates at a time */
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        for (int64_t r0 = b + 1; r0 < p.B; r0 += UPD_THREADS) {
            const int64_t r = r0 + threadIdx.x;
            const bool m = r < p.B && p.slots[r] == slot;
            const unsigned bal = __ballot_sync(0xffffffffu, m);
            if (lane == 0) mask[warp] = bal;
            if (!__syncthreads_or(m)) continue;
            for (int wv = 0; wv < UPD_THREADS / 32; wv++)
                for (unsigned bits = mask[wv]; bits; bits &= bits - 1) {
                    const int64_t rr = r0 + wv * 32 + __ffs(bits) - 1;
                    if (active) {
                        const float yv = update_one<W>(s, wt, bias, gdn::ld(p.x, rr * p.D + d, DT), p.silu);
                        if (p.y) gdn::st(p.y, rr * p.D + d, yv, DT);
                    }
                }
            __syncthreads();   /* mask is read before the next round writes it */
        }
    }
    if (active) st_row<W>(row, s, p.vr);
}

template <int DT>
cudaError_t launch_update(const UpdArgs &p, int W, cudaStream_t st) {
    const unsigned blocks = (unsigned)(p.B * p.nchunk);
    switch (W) {
    case 1: conv_update_kernel<DT, 1><<<blocks, UPD_THREADS, 0, st>>>(p); break;
    case 2: conv_update_kernel<DT, 2><<<blocks, UPD_THREADS, 0, st>>>(p); break;
    case 3: conv_update_kernel<DT, 3><<<blocks, UPD_THREADS, 0, st>>>(p); break;
    case 4: conv_update_kernel<DT, 4><<<blocks, UPD_THREADS, 0, st>>>(p); break;
    case 5: conv_update_kernel<DT, 5><<<blocks, UPD_THREADS, 0, st>>>(p); break;
    case 6: conv_update_kernel<DT, 6><<<blocks, UPD_THREADS, 0, st>>>(p); break;
    case 7: conv_update_kernel<DT, 7><<<blocks, UPD_THREADS, 0, st>>>(p); break;
    default: conv_update_kernel<DT, 8><<<blocks, UPD_THREADS, 0, st>>>(p); break;
    }
    return cudaGetLastError();
}

}  // namespace

extern "C" gdn_status gdn_cuda_conv1d_fwd(const gdn_conv1d_config *c, int64_t N, const int64_t *cu_dev,
                                          const gdn_conv1d_args *a, void *stream) {
    FwdArgs p;
    p.x = a->x; p.w = a->weight; p.bias = a->bias; p.h0 = a->h0; p.y = a->y; p.ht = a->ht;
    p.cu = c->cu_seqlens ? cu_dev : nullptr;
    p.T = c->T; p.R = c->B * c->T; p.N = N; p.D = c->D; p.silu = c->silu;
    cudaStream_t st = (cudaStream_t)stream;
    const int dt = (int)c->dtype, es = dt == GDN_F32 ? 4 : 2;
    cudaError_t e = cudaSuccess;
    if (p.R > 0) {
        /* the vector width: 16 bytes (8 past W = 4) when D and the pointers allow */
        int vec = (c->W <= 4 ? 16 : 8) / es;
        if (c->D % vec || !gdn::aligned16(a->x) || !gdn::aligned16(a->y) || !gdn::aligned16(a->weight)) vec = 1;
        /* rows per thread: 32, fewer while that leaves too few threads to fill
         * the card, more if the threads would not fit 32-bit indices */
        p.ncv = (unsigned)(c->D / vec);
        const auto tiles = [&](int tt) { return p.cu ? (p.R + tt - 1) / tt : c->B * ((c->T + tt - 1) / tt); };
        p.tt = 32;
        while (p.tt > U && (int64_t)p.ncv * tiles(p.tt) < 132 * 1024) p.tt /= 2;
        while ((int64_t)p.ncv * tiles(p.tt) + FWD_THREADS >= (1LL << 32)) p.tt *= 2;
        p.tiles = (unsigned)tiles(p.tt);
        p.tpr = p.cu ? 1u : (unsigned)((c->T + p.tt - 1) / p.tt);
        e = dt == GDN_F32 ? launch_fwd<0>(p, c->W, vec, st) : dt == GDN_BF16 ? launch_fwd<1>(p, c->W, vec, st)
                                                            : launch_fwd<2>(p, c->W, vec, st);
        if (e != cudaSuccess) return gdn_fail(GDN_ERR_BACKEND, "conv1d forward kernel launch: %s", cudaGetErrorString(e));
    }
    if (a->ht && N > 0) {
        const unsigned blocks = (unsigned)((N * c->D + FWD_THREADS - 1) / FWD_THREADS);
        if (dt == GDN_F32) conv_ht_kernel<0><<<blocks, FWD_THREADS, 0, st>>>(p, c->W);
        else if (dt == GDN_BF16) conv_ht_kernel<1><<<blocks, FWD_THREADS, 0, st>>>(p, c->W);
        else conv_ht_kernel<2><<<blocks, FWD_THREADS, 0, st>>>(p, c->W);
        e = cudaGetLastError();
        if (e != cudaSuccess) return gdn_fail(GDN_ERR_BACKEND, "conv1d final-state kernel launch: %s", cudaGetErrorString(e));
    }
    return GDN_OK;
}

extern "C" gdn_status gdn_cuda_conv1d_update(const gdn_conv1d_config *c, const void *x, const float *weight,
                                             const float *bias, float *state, int64_t num_slots, const int32_t *slots,
                                             int slots_unique, void *y, void *stream) {
    if (c->B == 0) return GDN_OK;
    UpdArgs p;
    p.x = x; p.w = weight; p.bias = bias; p.state = state; p.slots = slots; p.y = y;
    p.B = c->B; p.num_slots = num_slots; p.D = c->D; p.silu = c->silu; p.unique = slots_unique;
    p.nchunk = (c->D + UPD_THREADS - 1) / UPD_THREADS;
    cudaStream_t st = (cudaStream_t)stream;
    p.vr = gdn::aligned16(state) && gdn::aligned16(weight);
    const int W = c->W;
    const cudaError_t e = c->dtype == GDN_F32 ? launch_update<0>(p, W, st)
                        : c->dtype == GDN_BF16 ? launch_update<1>(p, W, st) : launch_update<2>(p, W, st);
    if (e != cudaSuccess) return gdn_fail(GDN_ERR_BACKEND, "conv1d update kernel launch: %s", cudaGetErrorString(e));
    return GDN_OK;
}
