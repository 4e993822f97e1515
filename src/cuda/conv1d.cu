/* CUDA causal depthwise conv1d, forward, backward and single-token update
 * (the math of src/cpu/conv1d.c). For sequence
 * n (rows bos..eos-1 of x [B*T, D]) and channel d, with the extended input
 *     xx[s] = x[bos+s, d] (s >= 0),   h0[n, d, W+s] (-W <= s < 0; 0 without h0)
 *     y[t] = act(bias[d] + sum_{w<W} weight[d,w] xx[t-W+1+w])   (fp32, w ascending)
 *     ht[n, d, j] = xx[L-W+j]                                  (last W inputs, newest last)
 * Forward: a thread owns VEC adjacent channels (4; 2 past W = 4; 1 where D
 * or the x/y alignment do not allow) and a run of tt consecutive token rows
 * of the flattened [B*T] rows, keeping the weights and the last W-1 inputs in
 * registers; a warp covers 32 adjacent channel vectors of one row, so a row
 * access is one coalesced piece, and every input is read once (plus W-1 rows
 * per run). The op is a stream (W FMAs and a SiLU per element), so its speed
 * is the bytes in flight per SM: a ring of P raw rows (64 bytes per thread)
 * is refilled with row i+P as soon as row i leaves it, so loads stay in
 * flight through the math and the stores, and at most 80 registers let 6
 * blocks of 128 share an SM (48 KB of loads in flight per SM). Runs are
 * sized to about four waves of the card's resident threads: long enough that
 * the W-1 halo rows and the weight loads are a few percent, short enough that
 * the last wave is small. A run may cross a batch row or (cu_seqlens) a
 * sequence border: there the window restarts from the next sequence's h0.
 * ht comes from a second, small kernel after the convolution, so ht may be
 * h0 itself (an in-place state update): no read of h0 can follow a write.
 * Update: one block per (row, 256 channels), a thread per channel with its
 * state row in registers (16-byte accesses for W = 4, 8); rows that share a
 * slot are applied in row order by the block of the slot's first row, so
 * nothing races and no atomics are needed.
 * The update's launch bounds name 1 block per SM explicitly: ptxas's own
 * occupancy target spills a few registers in some instances; with this, none
 * spills.
 * Backward, dz[t] = dy[t] act'(z[t]) (z recomputed):
 *     dx[s] = sum_{k<W} dz[s+k] weight[W-1-k] over the taps inside s's own
 *             sequence, + dht[n, s-eos+W] for the last W tokens of a sequence
 *     dweight[d,w] = sum_t dz[t] xx[t-W+1+w],  dbias[d] = sum_t dz[t]
 *     dh0[n,d,W+s] = dxx[s] (s < 0), dh0[n,d,0] = dht[n,d,0] for an empty
 *                    sequence (else 0)
 * One kernel for dx, dweight and dbias: a block takes 32 channels (a warp is
 * one row of them, a coalesced piece) and walks tiles of 128 rows, staged in
 * shared memory as f32: x with W-1 halo rows on each side, dy (then dz in
 * place), and each row's sequence; the next tile's loads stay in flight in
 * registers while the current one is computed. The rows are cut among the 8
 * blocks of a thread-block cluster, and dweight / dbias are summed in an
 * order fixed by the shape (a thread over its rows, then the block's row
 * lanes, then the cluster's blocks through distributed shared memory:
 * cuda/cluster_sum.cuh): no atomics, no workspace (the call takes none), the
 * same bits every run. dh0 comes from a second, small kernel, a thread per
 * (n, d), that recomputes the first W-1 dz of its sequence. */
#include <cuda_runtime.h>
#include "cuda/common.cuh"
#include "cuda/vec.cuh"
#include "cuda/cluster_sum.cuh"
#include "cuda/cuda_layer.h"

namespace {

enum { FWD_THREADS = 128, FWD_MINB = 6, UPD_THREADS = 256 };   /* FWD_MINB: forward blocks per SM (<= 80 registers) */

struct FwdArgs {
    const void *x;
    const float *w, *bias, *h0;
    void *y;
    float *ht;
    const int64_t *cu;   /* device cu_seqlens, or NULL: sequence n is rows n*T.. */
    int64_t T, R, N;     /* tokens per row (no cu), rows B*T, sequences */
    unsigned ncv;        /* channel vectors per row: D / VEC */
    unsigned tiles;      /* runs of tt rows, in all */
    int D, silu, tt;     /* tt: token rows per thread */
};

/* the sequence holding row t: largest n with cu[n] <= t (R > 0); Args: FwdArgs or BwdArgs */
template <typename Args>
__device__ __forceinline__ void seq_of(const Args &p, int64_t t, int64_t *n, int64_t *bos, int64_t *eos) {
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

/* SiLU at stream speed: x / (1 + 2^(-x log2 e)) with the approximate exp2
 * and reciprocal (a few ulp, well inside the f32 bound): 5 instructions
 * where expf and a denormal-safe divide take 13, over a third of the
 * forward's issue. For x < -88 it gives -0. */
__device__ __forceinline__ float silu_fast(float x) {
    float e, r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(x * -1.44269504f));
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.f + e));
    return x * r;
}

/* rows a thread keeps in flight: 64 bytes of x, at most 8 rows */
__host__ __device__ constexpr int ring_rows(int vec, int es) { return 64 / (vec * es) < 8 ? 64 / (vec * es) : 8; }

/* VEC values of dtype DT as one register-held access R, to / from fp32 */
template <int DT, int VEC, typename R>
__device__ __forceinline__ void unpack(R r, float (&v)[VEC]) {
    if constexpr (DT == 0) {
        union { R r; float f[VEC]; } u;
        u.r = r;
#pragma unroll
        for (int k = 0; k < VEC; k++) v[k] = u.f[k];
    } else {
        union { R r; unsigned short h[VEC]; } u;
        u.r = r;
#pragma unroll
        for (int k = 0; k < VEC; k++)
            v[k] = DT == 1 ? __uint_as_float(static_cast<unsigned>(u.h[k]) << 16) : __half2float(__ushort_as_half(u.h[k]));
    }
}

template <int DT, int VEC, typename R>
__device__ __forceinline__ R pack(const float (&v)[VEC]) {
    if constexpr (DT == 0) {
        union { R r; float f[VEC]; } u;
#pragma unroll
        for (int k = 0; k < VEC; k++) u.f[k] = v[k];
        return u.r;
    } else {
        union { R r; unsigned short h[VEC]; } u;
#pragma unroll
        for (int k = 0; k < VEC; k++)
            u.h[k] = DT == 1 ? __bfloat16_as_ushort(__float2bfloat16_rn(v[k])) : __half_as_ushort(__float2half_rn(v[k]));
        return u.r;
    }
}

/* Run `tile`: rows t0..t0+len-1 of the flattened rows, channels d0..d0+VEC-1
 * (32-bit thread ids: the host keeps threads < 2^32). ring[u] holds row i+u
 * at the top of each group of P rows; row i's slot is refilled with row i+P
 * right after row i is read from it. */
template <int DT, int W, int VEC>
__global__ void __launch_bounds__(FWD_THREADS, FWD_MINB) conv_fwd_kernel(FwdArgs p) {
    constexpr int WM = W > 1 ? W - 1 : 1, P = ring_rows(VEC, gdn::esize<DT>());
    typedef typename gdn::raw<gdn::esize<DT>() * VEC>::T R;
    const unsigned gid = blockIdx.x * FWD_THREADS + threadIdx.x, tile = gid / p.ncv, cv = gid % p.ncv;
    if (tile >= p.tiles) return;
    const int d0 = (int)cv * VEC;
    const int64_t t0 = (int64_t)tile * p.tt, ld = p.ncv;   /* ld: the row stride in vectors */
    const int len = (int)min((int64_t)p.tt, p.R - t0);
    const R *xr = static_cast<const R *>(p.x) + t0 * ld + cv;
    R *yp = static_cast<R *>(p.y) + t0 * ld + cv;
    /* every load of the prologue is issued before any is used */
    R ring[P], halo[WM];
#pragma unroll
    for (int u = 0; u < P; u++)
        if (u < len) ring[u] = xr[u * ld];
    int64_t n, bos, eos;
    if (p.cu) seq_of(p, t0, &n, &bos, &eos);
    else { n = t0 / p.T; bos = n * p.T; eos = bos + p.T; }
#pragma unroll
    for (int j = 0; j < W - 1; j++)
        if (t0 - (W - 1) + j >= bos) halo[j] = xr[(j - (W - 1)) * ld];
    float wt[W][VEC], bv[VEC];
#pragma unroll
    for (int c = 0; c < VEC; c++) {
#pragma unroll
        for (int w = 0; w < W; w++) wt[w][c] = p.w[(int64_t)(d0 + c) * W + w];
        bv[c] = p.bias ? p.bias[d0 + c] : 0.f;
    }
    float win[WM][VEC];   /* xx[t-W+1 .. t-1], oldest first */
#pragma unroll
    for (int j = 0; j < W - 1; j++) {
        const int64_t s = t0 - (W - 1) + j;
        if (s >= bos) unpack<DT, VEC>(halo[j], win[j]);
        else state_in<W, VEC>(p, n, d0, s - bos, win[j]);
    }
    const R *xn = xr + P * ld;                    /* the next row to load */
    int nxt = (int)min(eos - t0, (int64_t)len);   /* the run's next sequence start (len: none) */
    /* row i of the run from its ring slot; border: row i may start a sequence */
    const auto row = [&](R &slot, int i, bool refill, bool border) {
        float xv[VEC], z[VEC];
        unpack<DT, VEC>(slot, xv);
        if (refill) slot = *xn;
        xn += ld;
        if (border && i == nxt) {   /* a new sequence (skipping empty ones), the window from its h0 */
            const int64_t s0 = eos;
            do { n++; eos = p.cu ? p.cu[n + 1] : (n + 1) * p.T; } while (eos == s0);
#pragma unroll
            for (int j = 0; j < W - 1; j++) state_in<W, VEC>(p, n, d0, j - (W - 1), win[j]);
            nxt = (int)min(eos - t0, (int64_t)len);
        }
#pragma unroll
        for (int c = 0; c < VEC; c++) {
            float acc = bv[c];
#pragma unroll
            for (int w = 0; w < W - 1; w++) acc += wt[w][c] * win[w][c];
            acc += wt[W - 1][c] * xv[c];
            z[c] = p.silu ? silu_fast(acc) : acc;
        }
        *yp = pack<DT, VEC, R>(z);
        yp += ld;
#pragma unroll
        for (int j = 0; j + 1 < W - 1; j++)
#pragma unroll
            for (int c = 0; c < VEC; c++) win[j][c] = win[j + 1][c];
        if (W > 1)
#pragma unroll
            for (int c = 0; c < VEC; c++) win[WM - 1][c] = xv[c];
    };
    /* groups of P rows; only a group that holds a sequence start, or the
     * run's last, partial group, takes the checked path */
    for (int i = 0; i < len; i += P) {
        if (i + P <= nxt) {
#pragma unroll
            for (int u = 0; u < P; u++) row(ring[u], i + u, i + u + P < len, false);
        } else {
#pragma unroll
            for (int u = 0; u < P; u++)
                if (i + u < len) row(ring[u], i + u, i + u + P < len, true);
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
    constexpr int VW = W <= 4 ? 4 : 2;   /* past W = 4, 2 channels: the weights and window stay in registers */
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


/* ---- backward ---- */

enum { BWD_THREADS = 256, BWD_CG = 32, BWD_RL = BWD_THREADS / BWD_CG, BWD_TT = 128, DH0_THREADS = 128 };

struct BwdArgs {
    const void *x, *dy;
    const float *w, *bias, *h0, *dht;
    void *dx;
    float *dw, *db, *dh0;  /* db, dh0 may be NULL */
    const int64_t *cu;     /* device cu_seqlens, or NULL: sequence n is rows n*T.. */
    int64_t T, R, N;       /* tokens per row (no cu), rows B*T, sequences */
    int64_t tiles_per_rank;   /* tiles of BWD_TT rows a cluster rank walks, in order */
    int D, silu;
};

/* d SiLU(z) / dz = s (1 + z (1 - s)), s = sigmoid(z), with the approximate
 * exp2 and reciprocal of silu_fast (a few ulp; 0 or 1 where s saturates) */
__device__ __forceinline__ float silu_grad_fast(float z) {
    float e, s;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(z * -1.44269504f));
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(s) : "f"(1.f + e));
    return s * (1.f + z * (1.f - s));
}

/* dx, dweight, dbias. Block (group, rank) of a cluster of gdn::CLUSTER along
 * gridDim.y: channels group*32 .. +31 (a warp is the 32 channels of one row,
 * each access one coalesced piece), tiles k0..k1-1 of 128 rows. Per tile, with
 * t0 its first row:
 *   xs  = x of rows t0-W+1 .. t0+TT+W-2 (0 outside 0..R-1), gs = dy of rows
 *   t0 .. t0+TT+W-2, and the sequence (n, bos, eos) of each of those rows;
 *   A: dz[u] = dy[u] act'(z[u]) for those rows u, each in its own sequence
 *      (window from h0 before bos), into gs in place; the tile's own rows
 *      u < t0+TT add dz xx into this thread's dweight, dbias partials;
 *   B: dx[s] = sum_{k<W, s+k<eos(s)} dz[s+k] weight[W-1-k] (+ dht[n, s-eos+W]
 *      for the last W rows of a sequence) for the tile's rows.
 * Thread (rl, c) = channel c, rows rl, rl+8, ...; the next tile's x and dy
 * are loaded into registers (raw) while the current one is computed. The
 * partials then meet in fixed order (cluster_col_sums): over row lanes, then
 * ranks. The tiles of a rank, the rows of a thread, the lanes and the ranks
 * depend on R alone, so dweight and dbias repeat bit for bit. */
template <int DT, int W>
__global__ void __cluster_dims__(1, gdn::CLUSTER, 1) __launch_bounds__(BWD_THREADS, 2) conv_bwd_kernel(BwdArgs p) {
    typedef typename gdn::raw<gdn::esize<DT>()>::T E;
    constexpr int XR = BWD_TT + 2 * (W - 1), ZR = BWD_TT + W - 1;   /* x rows, dz rows of a tile */
    constexpr int XK = (XR + BWD_RL - 1) / BWD_RL, ZK = (ZR + BWD_RL - 1) / BWD_RL, BK = BWD_TT / BWD_RL;
    static_assert(BWD_THREADS * (W + 1) <= XR * BWD_CG, "the partials reuse xs");
    static_assert(ZR <= BWD_THREADS, "a thread per row looks up the sequences");
    static_assert(BWD_TT % BWD_RL == 0, "every row lane has the same tile rows");
    __shared__ float xs[XR][BWD_CG];
    __shared__ float gs[ZR][BWD_CG];
    __shared__ int64_t sq_n[ZR], sq_bos[ZR], sq_eos[ZR];
    __shared__ double tot[BWD_CG * (W + 1)];
    const int c = (int)threadIdx.x % BWD_CG, rl = (int)threadIdx.x / BWD_CG;
    const int d = (int)blockIdx.x * BWD_CG + c;
    const bool live = d < p.D;
    const E *X = static_cast<const E *>(p.x), *DY = static_cast<const E *>(p.dy);
    float wt[W], bv = 0.f;
#pragma unroll
    for (int w = 0; w < W; w++) wt[w] = live ? p.w[(int64_t)d * W + w] : 0.f;
    if (live && p.bias) bv = p.bias[d];
    float acc[W + 1];   /* dweight[d, 0..W-1], dbias[d] over this thread's rows */
#pragma unroll
    for (int k = 0; k < W + 1; k++) acc[k] = 0.f;

    const int64_t ntiles = (p.R + BWD_TT - 1) / BWD_TT;
    const int64_t k0 = (int64_t)cooperative_groups::this_cluster().block_rank() * p.tiles_per_rank;
    const int64_t k1 = min(k0 + p.tiles_per_rank, ntiles);
    E xr[XK], yr[ZK];                      /* the next tile's x and dy, raw */
    int64_t qn = -1, qbos = 0, qeos = 0;   /* the sequence of the next tile's row threadIdx.x (< ZR) */
    const auto fetch = [&](int64_t t0) {
#pragma unroll
        for (int j = 0; j < XK; j++) {
            const int i = rl + j * BWD_RL;
            const int64_t row = t0 - (W - 1) + i;
            xr[j] = (i < XR && live && row >= 0 && row < p.R) ? X[row * p.D + d] : E(0);
        }
#pragma unroll
        for (int j = 0; j < ZK; j++) {
            const int i = rl + j * BWD_RL;
            const int64_t row = t0 + i;
            yr[j] = (i < ZR && live && row < p.R) ? DY[row * p.D + d] : E(0);
        }
        if (threadIdx.x < ZR) {
            const int64_t row = t0 + threadIdx.x;
            qn = -1;
            if (row < p.R) {
                if (p.cu) seq_of(p, row, &qn, &qbos, &qeos);
                else { qn = row / p.T; qbos = qn * p.T; qeos = qbos + p.T; }
            }
        }
    };
    if (k0 < k1) fetch(k0 * BWD_TT);
    for (int64_t k = k0; k < k1; k++) {
        const int64_t t0 = k * BWD_TT;
#pragma unroll
        for (int j = 0; j < XK; j++) {
            const int i = rl + j * BWD_RL;
            if (i < XR) { float v[1]; unpack<DT, 1, E>(xr[j], v); xs[i][c] = v[0]; }
        }
#pragma unroll
        for (int j = 0; j < ZK; j++) {
            const int i = rl + j * BWD_RL;
            if (i < ZR) { float v[1]; unpack<DT, 1, E>(yr[j], v); gs[i][c] = v[0]; }
        }
        if (threadIdx.x < ZR) { sq_n[threadIdx.x] = qn; sq_bos[threadIdx.x] = qbos; sq_eos[threadIdx.x] = qeos; }
        __syncthreads();
        if (k + 1 < k1) fetch(t0 + BWD_TT);   /* in flight through A and B */
        /* A: dz of rows t0 + i, i < ZR (0 past R-1); the tile's own rows into the partials */
#pragma unroll
        for (int j = 0; j < ZK; j++) {
            const int i = rl + j * BWD_RL;
            if (i >= ZR) continue;
            const int64_t u = t0 + i;
            float dz = 0.f;
            if (live && u < p.R) {
                const int64_t n = sq_n[i], bos = sq_bos[i];
                float xv[W];   /* xx[u-W+1 .. u] of u's sequence: xs row i + w, or h0 before bos */
#pragma unroll
                for (int w = 0; w < W; w++) {
                    const int64_t jr = u - (W - 1) + w;
                    xv[w] = jr >= bos ? xs[i + w][c] : p.h0 ? p.h0[(n * p.D + d) * W + W + (jr - bos)] : 0.f;
                }
                dz = gs[i][c];
                if (p.silu) {
                    float z = bv;
#pragma unroll
                    for (int w = 0; w < W; w++) z += wt[w] * xv[w];
                    dz *= silu_grad_fast(z);
                }
                if (i < BWD_TT) {
#pragma unroll
                    for (int w = 0; w < W; w++) acc[w] += dz * xv[w];
                    acc[W] += dz;
                }
            }
            gs[i][c] = dz;
        }
        __syncthreads();
        /* B: dx of the tile's rows, taps only inside the row's own sequence */
#pragma unroll
        for (int j = 0; j < BK; j++) {
            const int i = rl + j * BWD_RL;
            const int64_t s = t0 + i;
            if (!live || s >= p.R) continue;
            const int64_t eos = sq_eos[i];
            float v = 0.f;
#pragma unroll
            for (int q = 0; q < W; q++)
                if (s + q < eos) v += gs[i + q][c] * wt[W - 1 - q];
            if (p.dht && s >= eos - W) v += p.dht[(sq_n[i] * p.D + d) * W + (s - eos + W)];
            gdn::st(p.dx, s * p.D + d, v, DT);
        }
        __syncthreads();   /* xs, gs and the sequences are refilled next */
    }
    gdn::cluster_col_sums<W + 1>(acc, BWD_CG, &xs[0][0], tot, [&](int cc, int kk, double sum) {
        const int dd = (int)blockIdx.x * BWD_CG + cc;
        if (dd >= p.D) return;
        if (kk < W) p.dw[(int64_t)dd * W + kk] = (float)sum;
        else if (p.db) p.db[dd] = (float)sum;
    });
}

/* dh0[n, d, W+s] = dxx[s] for s = -(W-1) .. -1: the taps dz[0 .. W-2] of
 * sequence n (recomputed here from its first W-1 tokens and h0) and dht where
 * ht read h0 (a sequence shorter than W); dh0[n, d, 0] is read only by the ht
 * of an empty sequence (ht = h0): dht[n, d, 0] there, else 0. A thread per
 * (n, d). */
template <int DT, int W>
__global__ void __launch_bounds__(DH0_THREADS) conv_dh0_kernel(BwdArgs p) {
    const int64_t i = (int64_t)blockIdx.x * DH0_THREADS + threadIdx.x;
    if (i >= p.N * p.D) return;
    const int64_t n = i / p.D;
    const int d = (int)(i % p.D);
    const int64_t bos = p.cu ? p.cu[n] : n * p.T, L = (p.cu ? p.cu[n + 1] : bos + p.T) - bos;
    const float *dht = p.dht ? p.dht + i * W : nullptr;
    float *out = p.dh0 + i * W;
    if constexpr (W > 1) {
        float wt[W], dz[W - 1];
#pragma unroll
        for (int w = 0; w < W; w++) wt[w] = p.w[(int64_t)d * W + w];
        const float bv = p.bias ? p.bias[d] : 0.f;
#pragma unroll
        for (int t = 0; t < W - 1; t++) {   /* dz[t], 0 past the sequence */
            dz[t] = 0.f;
            if (t >= L) continue;
            dz[t] = gdn::ld(p.dy, (bos + t) * p.D + d, DT);
            if (p.silu) {
                float z = bv;
#pragma unroll
                for (int w = 0; w < W; w++) {
                    const int jr = t - (W - 1) + w;   /* xx[jr]: x from bos, h0 before */
                    z += wt[w] * (jr >= 0 ? gdn::ld(p.x, (bos + jr) * p.D + d, DT) : p.h0 ? p.h0[i * W + W + jr] : 0.f);
                }
                dz[t] *= silu_grad_fast(z);
            }
        }
#pragma unroll
        for (int j = 1; j < W; j++) {
            const int s = j - W;
            float v = 0.f;
#pragma unroll
            for (int q = 0; q < W; q++)   /* s + q <= W - 2: inside dz */
                if (s + q >= 0 && s + q < L) v += dz[s + q] * wt[W - 1 - q];
            if (dht && s >= L - W) v += dht[s - L + W];
            out[j] = v;
        }
    }
    out[0] = (L == 0 && dht) ? dht[0] : 0.f;
}

template <int DT, int W>
cudaError_t launch_bwd_w(const BwdArgs &p, cudaStream_t st) {
    const unsigned groups = (unsigned)((p.D + BWD_CG - 1) / BWD_CG);
    conv_bwd_kernel<DT, W><<<dim3(groups, gdn::CLUSTER), BWD_THREADS, 0, st>>>(p);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || !p.dh0 || p.N == 0) return e;
    const unsigned blocks = (unsigned)((p.N * p.D + DH0_THREADS - 1) / DH0_THREADS);
    conv_dh0_kernel<DT, W><<<blocks, DH0_THREADS, 0, st>>>(p);
    return cudaGetLastError();
}

template <int DT>
cudaError_t launch_bwd(const BwdArgs &p, int W, cudaStream_t st) {
    switch (W) {
    case 1: return launch_bwd_w<DT, 1>(p, st);
    case 2: return launch_bwd_w<DT, 2>(p, st);
    case 3: return launch_bwd_w<DT, 3>(p, st);
    case 4: return launch_bwd_w<DT, 4>(p, st);
    case 5: return launch_bwd_w<DT, 5>(p, st);
    case 6: return launch_bwd_w<DT, 6>(p, st);
    case 7: return launch_bwd_w<DT, 7>(p, st);
    default: return launch_bwd_w<DT, 8>(p, st);
    }
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
        /* the vector width: 4 channels (2 past W = 4) when D and the x, y alignment allow */
        int vec = c->W <= 4 ? 4 : 2;
        if (c->D % vec || ((uintptr_t)a->x | (uintptr_t)a->y) % (uintptr_t)(vec * es)) vec = 1;
        p.ncv = (unsigned)(c->D / vec);
        /* rows per run: about four waves of the threads the card holds, a
         * multiple of the ring; more if the threads would not fit 32-bit ids */
        const auto tiles = [&](int64_t tt) { return (p.R + tt - 1) / tt; };
        const int P = ring_rows(vec, es);
        const int64_t waves4 = 4LL * gdn::sm_count() * FWD_MINB * FWD_THREADS;
        int64_t tt = ((int64_t)p.ncv * p.R + waves4 - 1) / waves4;
        tt = (tt + P - 1) / P * P;
        while ((int64_t)p.ncv * tiles(tt) + FWD_THREADS >= (1LL << 32)) tt *= 2;
        p.tt = (int)(tt < p.R ? tt : p.R);
        p.tiles = (unsigned)tiles(p.tt);
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

extern "C" gdn_status gdn_cuda_conv1d_bwd(const gdn_conv1d_config *c, int64_t N, const int64_t *cu_dev,
                                          const gdn_conv1d_bwd_args *a, void *stream) {
    BwdArgs p;
    p.x = a->x; p.dy = a->dy; p.w = a->weight; p.bias = a->bias; p.h0 = a->h0; p.dht = a->dht;
    p.dx = a->dx; p.dw = a->dweight; p.db = a->dbias; p.dh0 = a->dh0;
    p.cu = c->cu_seqlens ? cu_dev : nullptr;
    p.T = c->T; p.R = c->B * c->T; p.N = N; p.D = c->D; p.silu = c->silu;
    const int64_t ntiles = (p.R + BWD_TT - 1) / BWD_TT;
    p.tiles_per_rank = (ntiles + gdn::CLUSTER - 1) / gdn::CLUSTER;
    cudaStream_t st = (cudaStream_t)stream;
    const cudaError_t e = c->dtype == GDN_F32 ? launch_bwd<0>(p, c->W, st)
                        : c->dtype == GDN_BF16 ? launch_bwd<1>(p, c->W, st) : launch_bwd<2>(p, c->W, st);
    if (e != cudaSuccess) return gdn_fail(GDN_ERR_BACKEND, "conv1d backward kernel launch: %s", cudaGetErrorString(e));
    return GDN_OK;
}
