/* CUDA fused decode step (the math of src/cpu/decode.c). The state is the
 * traffic: k-first, decode_tile_kernel for many rows (bandwidth) and
 * decode_warp_kernel for few (latency), both with 16-byte state accesses
 * (V % 4 == 0), decode_kfirst_kernel otherwise; v-first, one block per (row,
 * head), a warp owns row c (contiguous in K) and reduces across its lanes,
 * q, k in shared memory. No host sync; a slot outside -1..num_slots-1 reads
 * and writes nothing (as padding: slots live on the device, where the host
 * cannot check them without a sync).
 *
 * The tile and warp kernels are launched as programmatic dependents of the
 * previous kernel in the stream: their blocks become resident while it
 * finishes and wait for it (and its writes) before any access, so the
 * launch latency, a good part of a B = 1 step, hides under its tail.
 *
 * With conv_W > 0 (CONV): first the conv1d update of every row's conv state
 * (cuda/conv1d.cu, state only), then the same kernels with q, k, v formed
 * from the updated conv state, SiLU(bias + sum_w weight[d,w] state[d,w]),
 * by the whole block into shared memory. Two launches because a q/k channel
 * feeds G heads x V/32 blocks, and none of them could overwrite its conv
 * state in place while another still reads it; the conv state is small next
 * to the recurrent state, which still moves once. */
#include <cuda_runtime.h>
#include "cuda/common.cuh"
#include "cuda/vec.cuh"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_layer.h"

namespace {

struct DecodeArgs {
    const void *qkv, *a, *b;
    const float *A_log, *dt_bias;
    float *state;
    const int32_t *slots;
    void *o;
    int B, H, HV, K, V, dt;
    int64_t num_slots;
    float scale;
    int l2norm, vfirst;
    float beta_mul;
};

/* CONV: the conv state [num_slots, D, W] (already updated), weight [D, W],
 * bias [D] or NULL. A kernel parameter of its own: growing DecodeArgs moves
 * ptxas's register choice for the kernels without the conv (spills). */
struct ConvIn {
    const float *st, *w, *bias;
    int W;
};

/* CONV: the conv output of channel ch of pool row slot */
__device__ __forceinline__ float conv_out(const ConvIn &cv, int64_t slot, int64_t D, int64_t ch) {
    const float *s = cv.st + (slot * D + ch) * cv.W, *w = cv.w + ch * cv.W;
    float acc = cv.bias ? cv.bias[ch] : 0.f;
    for (int i = 0; i < cv.W; i++) acc += w[i] * s[i];
    return gdn::silu(acc);
}

/* CONV: raw q, k of head h and v columns [c0, c0+nc) of head j into shared
 * memory, by the whole block (ends with a barrier) */
__device__ __forceinline__ void conv_qkv(const DecodeArgs &p, const ConvIn &cv, int64_t slot, int h, int j, int c0,
                                         int nc, float *q, float *k, float *v) {
    const int K = p.K;
    const int64_t D = 2LL * p.H * K + (int64_t)p.HV * p.V;
    for (int i = threadIdx.x; i < 2 * K + nc; i += blockDim.x) {
        if (i < K) q[i] = conv_out(cv, slot, D, (int64_t)h * K + i);
        else if (i < 2 * K) k[i - K] = conv_out(cv, slot, D, (int64_t)p.H * K + (int64_t)h * K + i - K);
        else v[i - 2 * K] = c0 + i - 2 * K < p.V ? conv_out(cv, slot, D, 2LL * p.H * K + (int64_t)j * p.V + c0 + i - 2 * K) : 0.f;
    }
    __syncthreads();
}

/* L2-norm scales of q, k (all K in shared memory), per warp; 1 without GDN_QK_L2NORM */
__device__ __forceinline__ void warp_qk_scales(const DecodeArgs &p, const float *q, const float *k, float *rq, float *rk) {
    float sq = 0.f, sk = 0.f;
    for (int i = threadIdx.x & 31; i < p.K; i += 32) { sq += q[i] * q[i]; sk += k[i] * k[i]; }
    *rq = p.l2norm ? rsqrtf(gdn::warp_sum(sq) + 1e-6f) : 1.f;
    *rk = p.l2norm ? rsqrtf(gdn::warp_sum(sk) + 1e-6f) : 1.f;
}

/* q and k of row b, head h, per warp without block barriers: the warp reads
 * all of q and k (coalesced), keeps its own rows [i0, i0+R) raw in shared
 * memory and returns their L2-norm scales (1 without GDN_QK_L2NORM). */
__device__ __forceinline__ void warp_qk_rows(const DecodeArgs &p, int b, int h, int64_t D, int i0, int R,
                                             float *q, float *k, float *rq, float *rk) {
    const int lane = threadIdx.x & 31, K = p.K;
    float sq = 0.f, sk = 0.f;
    for (int i = lane; i < K; i += 32) {
        const float qi = gdn::ld(p.qkv, b * D + (int64_t)h * K + i, p.dt);
        const float ki = gdn::ld(p.qkv, b * D + (int64_t)p.H * K + (int64_t)h * K + i, p.dt);
        sq += qi * qi;
        sk += ki * ki;
        if (i >= i0 && i < i0 + R) { q[i] = qi; k[i] = ki; }
    }
    *rq = p.l2norm ? rsqrtf(gdn::warp_sum(sq) + 1e-6f) : 1.f;
    *rk = p.l2norm ? rsqrtf(gdn::warp_sum(sk) + 1e-6f) : 1.f;
    __syncwarp();
}

/* k-first: a block covers 32 columns of one (row, head) with 4 warps, warp
 * w holding rows [w*R, w*R+R) of each column in registers (R = KT/4), so
 * every state element is read from device memory once, 32 consecutive
 * columns per warp access (coalesced), and the loads are issued before the
 * q/k prologue so they overlap it. Partial dot products meet in shared
 * memory. grid.y splits V, so B = 1 still fills the card. */
/* Launch bounds with explicit blocks per SM: left to its own heuristic, ptxas
 * spills a few registers in some instances; these keep the occupancy of the
 * kernels before CONV (R = 32: 7 blocks) with no spill anywhere. */
template <int R, bool CONV>
__global__ void __launch_bounds__(128, (!CONV && R == 32) ? 7 : 1) decode_kfirst_kernel(DecodeArgs p, ConvIn cv) {
    extern __shared__ float sm[];
    float *q = sm, *k = sm + p.K, *part = sm + 2 * p.K + 32;   /* part: [4][32] */
    float *vs = part + 128;                                      /* CONV: [32] */
    const int b = blockIdx.x / p.HV, j = blockIdx.x % p.HV, h = j / (p.HV / p.H);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int c = blockIdx.y * 32 + lane, i0 = w * R;
    const int V = p.V, K = p.K;
    const int64_t D = 2LL * p.H * K + (int64_t)p.HV * V;
    const int64_t slot = p.slots ? p.slots[b] : b;
    const int64_t orow = ((int64_t)b * p.HV + j) * V;
    const bool live = slot >= 0 && slot < p.num_slots, mine = live && c < V;
    float *S = live ? p.state + (slot * p.HV + j) * (int64_t)K * V + c : nullptr;
    float s[R];
    const float *lp = mine ? S + (int64_t)i0 * V : nullptr;   /* stepped by V: one live address */
#pragma unroll
    for (int r = 0; r < R; r++) {
        s[r] = (mine && i0 + r < K) ? *lp : 0.f;
        lp += V;
    }
    if (!live) {
        if (w == 0 && c < V) gdn::st(p.o, orow + c, 0.f, p.dt);
        return;
    }
    /* the scalars and v_c now, so their latency hides under the state loads */
    const float ga = gdn::ld(p.a, (int64_t)b * p.HV + j, p.dt), gb = gdn::ld(p.b, (int64_t)b * p.HV + j, p.dt);
    const float Alog = p.A_log[j], dtb = p.dt_bias ? p.dt_bias[j] : 0.f;
    float vc, rq, rk;
    if constexpr (CONV) {
        conv_qkv(p, cv, slot, h, j, blockIdx.y * 32, 32, q, k, vs);
        vc = vs[lane];
        warp_qk_scales(p, q, k, &rq, &rk);
        __syncthreads();   /* every warp has read all of q, k before rows are scaled in place */
    } else {
        vc = c < V ? gdn::ld(p.qkv, b * D + 2LL * p.H * K + (int64_t)j * V + c, p.dt) : 0.f;
        warp_qk_rows(p, b, h, D, i0, R, q, k, &rq, &rk);
    }
    for (int i = i0 + lane; i < i0 + R && i < K; i += 32) { q[i] *= rq; k[i] *= rk; }
    __syncwarp();
    const float g = -expf(Alog) * gdn::softplus(ga + dtb);
    const float decay = expf(g), beta = p.beta_mul * gdn::sigmoid(gb);
    float pred = 0.f;
#pragma unroll
    for (int r = 0; r < R; r++) if (i0 + r < K) pred += s[r] * k[i0 + r];
    part[w * 32 + lane] = pred;
    __syncthreads();
    pred = part[lane] + part[32 + lane] + part[64 + lane] + part[96 + lane];
    const float u = beta * (vc - decay * pred);
    float o = 0.f;
    float *sp = mine ? S + (int64_t)i0 * V : nullptr;
#pragma unroll
    for (int r = 0; r < R; r++) {
        if (i0 + r < K) {
            const float x = decay * s[r] + k[i0 + r] * u;
            if (mine) *sp = x;
            o += q[i0 + r] * x;
        }
        sp += V;
    }
    __syncthreads();   /* every warp has read part[] */
    part[w * 32 + lane] = o;
    __syncthreads();
    if (w == 0 && c < V)
        gdn::st(p.o, orow + c, p.scale * (part[lane] + part[32 + lane] + part[64 + lane] + part[96 + lane]), p.dt);
}


/* Programmatic launch: wait for the previous kernel in the stream and its
 * writes (a no-op in a plain launch), then let the next one start launching;
 * nothing of this kernel touches memory before the wait. */
__device__ __forceinline__ void pdl_enter() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

/* a bf16 (dt 1) or f16 (dt 2) value from its bits */
__device__ __forceinline__ float half_bits(unsigned short h, int dt) {
    return dt == 1 ? __uint_as_float(static_cast<unsigned>(h) << 16) : __half2float(__ushort_as_half(h));
}

/* The small inputs of (row b, value head j) in one round trip: every load
 * issued before any is converted. q, k of head h at rows i0 + step*r (r <
 * N, 0 past K) and v at columns c..c+3 (0 past V) when QKV (CONV forms
 * them from the conv state instead); the raw gate inputs a, b always. */
template <int N, bool QKV>
__device__ __forceinline__ void ld_inputs(const DecodeArgs &p, int b, int h, int j, int i0, int step, int c,
                                          float (&q)[N], float (&k)[N], float (&v)[4], float *ga, float *gb) {
    const int K = p.K, V = p.V;
    const int64_t D = 2LL * p.H * K + (int64_t)p.HV * V;
    const int64_t qb = b * D + (int64_t)h * K, kb = qb + (int64_t)p.H * K;
    const int64_t vb = b * D + 2LL * p.H * K + (int64_t)j * V + c, gi = (int64_t)b * p.HV + j;
    if (p.dt == 0) {
        const float *x = static_cast<const float *>(p.qkv);
        if constexpr (QKV) {
#pragma unroll
            for (int r = 0; r < N; r++) {
                const int i = i0 + step * r;
                q[r] = i < K ? x[qb + i] : 0.f;
                k[r] = i < K ? x[kb + i] : 0.f;
            }
#pragma unroll
            for (int e = 0; e < 4; e++) v[e] = c + e < V ? x[vb + e] : 0.f;
        }
        *ga = static_cast<const float *>(p.a)[gi];
        *gb = static_cast<const float *>(p.b)[gi];
    } else {
        const unsigned short *x = static_cast<const unsigned short *>(p.qkv);
        unsigned short hq[N], hk[N], hv[4];
        if constexpr (QKV) {
#pragma unroll
            for (int r = 0; r < N; r++) {
                const int i = i0 + step * r;
                hq[r] = i < K ? x[qb + i] : 0;
                hk[r] = i < K ? x[kb + i] : 0;
            }
#pragma unroll
            for (int e = 0; e < 4; e++) hv[e] = c + e < V ? x[vb + e] : 0;
        }
        const unsigned short ha = static_cast<const unsigned short *>(p.a)[gi];
        const unsigned short hb = static_cast<const unsigned short *>(p.b)[gi];
        if constexpr (QKV) {
#pragma unroll
            for (int r = 0; r < N; r++) { q[r] = half_bits(hq[r], p.dt); k[r] = half_bits(hk[r], p.dt); }
#pragma unroll
            for (int e = 0; e < 4; e++) v[e] = half_bits(hv[e], p.dt);
        }
        *ga = half_bits(ha, p.dt);
        *gb = half_bits(hb, p.dt);
    }
}

enum { TILE_COLS = 64 };

/* Blocks per SM in the launch bounds: for the tile kernel as many as its
 * state registers allow (4*R values a thread, the CONV prologue costing
 * some); for the warp kernel explicit too (left to its own heuristic, ptxas
 * spills in the CONV instances). */
__host__ __device__ constexpr int tile_blocks(int R, bool conv) {
    return conv ? (R <= 8 ? 2 : 1) : (R <= 4 ? 4 : R <= 8 ? 3 : 2);
}
__host__ __device__ constexpr int warp_blocks(int R) { return R <= 8 ? 4 : 1; }

/* k-first, many rows: bandwidth. A block of 8 warps covers CB = 64 columns
 * of one (row, head) and all K rows: 16 lanes a row, 4 adjacent columns
 * each (16-byte accesses, whole 128-byte lines), and row group rg (0, 1) of
 * warp w holds rows [(2w + rg)*R, +R) (R*4 values in registers, R = KT/16).
 * 3 blocks per SM at K = 128 (80 registers), so the loads of one block
 * stream while another computes and stores (one block of 128 columns per
 * SM reached 80 % of copy, this 95 %). Sums over K: a shuffle within
 * the warp, then shared memory across the 8 warps (two barriers, a buffer
 * for each sum). Column blocks of a (row, head) are adjacent in the grid:
 * they run together on the same rows. The small inputs are issued first,
 * beside the slot load the state addresses wait for. */
template <int R, bool CONV>
__global__ void __launch_bounds__(256, tile_blocks(R, CONV)) decode_tile_kernel(DecodeArgs p, ConvIn cv, int ncb) {
    constexpr int CB = TILE_COLS, LR = CB / 4, GW = 32 / LR;   /* lanes a row, row groups a warp */
    extern __shared__ float sm[];
    float4 *pp = reinterpret_cast<float4 *>(sm), *po = pp + 8 * LR;   /* [8][LR] each: the two sums */
    float *q = sm + 64 * LR, *k = q + p.K, *vs = k + p.K;             /* vs: CONV, [CB] */
    pdl_enter();
    const int bj = blockIdx.x / ncb, c0 = (blockIdx.x % ncb) * CB;
    const int b = bj / p.HV, j = bj % p.HV, h = j / (p.HV / p.H);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, cl = lane % LR, rg = lane / LR;
    const int c = c0 + cl * 4, iw = w * GW * R, i0 = iw + rg * R;
    const int V = p.V, K = p.K;
    const int64_t slot = p.slots ? p.slots[b] : b;
    const int64_t orow = ((int64_t)b * p.HV + j) * V;
    float qn[R / 2], kn[R / 2], vc[4], ga, gb;   /* q, k at rows lane + 32 r; CONV: q, k, v later */
    ld_inputs<R / 2, !CONV>(p, b, h, j, lane, 32, c, qn, kn, vc, &ga, &gb);
    const float Alog = p.A_log[j], dtb = p.dt_bias ? p.dt_bias[j] : 0.f;
    const bool live = slot >= 0 && slot < p.num_slots, mine = live && c < V;
    float *S = live ? p.state + (slot * p.HV + j) * (int64_t)K * V + c : nullptr;
    float4 s[R];
    const float *lp = mine ? S + (int64_t)i0 * V : nullptr;
#pragma unroll
    for (int r = 0; r < R; r++) {
        s[r] = (mine && i0 + r < K) ? *reinterpret_cast<const float4 *>(lp) : make_float4(0.f, 0.f, 0.f, 0.f);
        lp += V;
    }
    if (!live) {
        if (w == 0 && rg == 0)
            for (int e = 0; e < 4; e++) if (c + e < V) gdn::st(p.o, orow + c + e, 0.f, p.dt);
        return;
    }
    float rq, rk;
    if constexpr (CONV) {
        conv_qkv(p, cv, slot, h, j, c0, CB, q, k, vs);
        for (int e = 0; e < 4; e++) vc[e] = vs[cl * 4 + e];
        warp_qk_scales(p, q, k, &rq, &rk);
    } else {
        /* the norms over all K by each warp, its own rows raw into shared memory */
        float sq = 0.f, sk = 0.f;
#pragma unroll
        for (int r = 0; r < R / 2; r++) {
            const int i = lane + 32 * r;
            sq += qn[r] * qn[r];
            sk += kn[r] * kn[r];
            if (i >= iw && i < iw + GW * R && i < K) { q[i] = qn[r]; k[i] = kn[r]; }
        }
        rq = p.l2norm ? rsqrtf(gdn::warp_sum(sq) + 1e-6f) : 1.f;
        rk = p.l2norm ? rsqrtf(gdn::warp_sum(sk) + 1e-6f) : 1.f;
        __syncwarp();
    }
    const float g = -expf(Alog) * gdn::softplus(ga + dtb);
    const float decay = expf(g), beta = p.beta_mul * gdn::sigmoid(gb);
    /* pred = S^T k^ over this thread's rows; k^ = rk * k, rk applied once to the sum */
    float4 pr = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int r = 0; r < R; r++)
        if (i0 + r < K) {
            const float kk = k[i0 + r];
            pr.x += s[r].x * kk; pr.y += s[r].y * kk; pr.z += s[r].z * kk; pr.w += s[r].w * kk;
        }
#pragma unroll
    for (int m = LR; m < 32; m <<= 1) {
        pr.x += __shfl_xor_sync(0xffffffffu, pr.x, m); pr.y += __shfl_xor_sync(0xffffffffu, pr.y, m);
        pr.z += __shfl_xor_sync(0xffffffffu, pr.z, m); pr.w += __shfl_xor_sync(0xffffffffu, pr.w, m);
    }
    if (rg == 0) pp[w * LR + cl] = pr;
    __syncthreads();
    float4 P = pp[cl];
#pragma unroll
    for (int ww = 1; ww < 8; ww++) {
        const float4 t = pp[ww * LR + cl];
        P.x += t.x; P.y += t.y; P.z += t.z; P.w += t.w;
    }
    /* ku = rk * u, u = beta * (v - decay * S^T k^): the rank-1 update is k (raw) x ku */
    float4 ku;
    ku.x = rk * beta * (vc[0] - decay * rk * P.x); ku.y = rk * beta * (vc[1] - decay * rk * P.y);
    ku.z = rk * beta * (vc[2] - decay * rk * P.z); ku.w = rk * beta * (vc[3] - decay * rk * P.w);
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
    float *sp = mine ? S + (int64_t)i0 * V : nullptr;
#pragma unroll
    for (int r = 0; r < R; r++) {
        if (i0 + r < K) {
            const float kk = k[i0 + r], qq = q[i0 + r];
            float4 x;
            x.x = decay * s[r].x + kk * ku.x; x.y = decay * s[r].y + kk * ku.y;
            x.z = decay * s[r].z + kk * ku.z; x.w = decay * s[r].w + kk * ku.w;
            if (mine) *reinterpret_cast<float4 *>(sp) = x;
            o.x += qq * x.x; o.y += qq * x.y; o.z += qq * x.z; o.w += qq * x.w;
        }
        sp += V;
    }
#pragma unroll
    for (int m = LR; m < 32; m <<= 1) {
        o.x += __shfl_xor_sync(0xffffffffu, o.x, m); o.y += __shfl_xor_sync(0xffffffffu, o.y, m);
        o.z += __shfl_xor_sync(0xffffffffu, o.z, m); o.w += __shfl_xor_sync(0xffffffffu, o.w, m);
    }
    if (rg == 0) po[w * LR + cl] = o;
    __syncthreads();
    if (w == 0 && rg == 0) {
        float4 O = po[cl];
#pragma unroll
        for (int ww = 1; ww < 8; ww++) {
            const float4 t = po[ww * LR + cl];
            O.x += t.x; O.y += t.y; O.z += t.z; O.w += t.w;
        }
        const float f = p.scale * rq, ov[4] = {O.x, O.y, O.z, O.w};
        for (int e = 0; e < 4; e++) if (c + e < V) gdn::st(p.o, orow + c + e, f * ov[e], p.dt);
    }
}

/* k-first, few rows: latency. A warp owns 8 columns of one (row, head) and
 * all K rows: lane 2*rl + cl holds rows rl + 16*r (r < R) of columns
 * c..c+3 (16-byte accesses), so both sums over K are shuffles across rl:
 * no shared memory and no barrier outside CONV. Its q and k rows go
 * straight from mixed_qkv into registers, issued beside the slot load so
 * that their latency hides under it and under the state loads. 4 warps (32
 * columns) a block, column blocks of a (row, head) adjacent in the grid. */
template <int R, bool CONV>
__global__ void __launch_bounds__(128, warp_blocks(R)) decode_warp_kernel(DecodeArgs p, ConvIn cv, int ncb) {
    extern __shared__ float sm[];
    float *qs = sm, *ks = sm + p.K, *vs = ks + p.K;   /* CONV: q, k [K], v [32] */
    pdl_enter();
    const int bj = blockIdx.x / ncb, c0 = (blockIdx.x % ncb) * 32;
    const int b = bj / p.HV, j = bj % p.HV, h = j / (p.HV / p.H);
    const int lane = threadIdx.x & 31, rl = lane >> 1;
    const int cw = (threadIdx.x >> 5) * 8 + (lane & 1) * 4, c = c0 + cw;
    const int V = p.V, K = p.K;
    const int64_t slot = p.slots ? p.slots[b] : b;
    const int64_t orow = ((int64_t)b * p.HV + j) * V;
    float qv[R], kv[R], vc[4], ga, gb;   /* CONV: q, k, v later, from the conv state */
    ld_inputs<R, !CONV>(p, b, h, j, rl, 16, c, qv, kv, vc, &ga, &gb);
    const float Alog = p.A_log[j], dtb = p.dt_bias ? p.dt_bias[j] : 0.f;
    const bool live = slot >= 0 && slot < p.num_slots, mine = live && c < V;
    float *S = live ? p.state + (slot * p.HV + j) * (int64_t)K * V + c : nullptr;
    float4 s[R];
    const float *lp = mine ? S + (int64_t)rl * V : nullptr;   /* stepped by 16 V: one live address */
#pragma unroll
    for (int r = 0; r < R; r++) {
        s[r] = (mine && rl + 16 * r < K) ? *reinterpret_cast<const float4 *>(lp) : make_float4(0.f, 0.f, 0.f, 0.f);
        lp += 16 * V;
    }
    if (!live) {
        if (rl < 4 && c + rl < V) gdn::st(p.o, orow + c + rl, 0.f, p.dt);
        return;
    }
    if constexpr (CONV) {
        conv_qkv(p, cv, slot, h, j, c0, 32, qs, ks, vs);
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int i = rl + 16 * r;
            qv[r] = i < K ? qs[i] : 0.f;
            kv[r] = i < K ? ks[i] : 0.f;
        }
        for (int e = 0; e < 4; e++) vc[e] = vs[cw + e];
    }
    /* rows past K hold zeros in s, qv, kv: no guard needed in the sums */
    float sq = 0.f, sk = 0.f;
#pragma unroll
    for (int r = 0; r < R; r++) { sq += qv[r] * qv[r]; sk += kv[r] * kv[r]; }
#pragma unroll
    for (int m = 2; m < 32; m <<= 1) {
        sq += __shfl_xor_sync(0xffffffffu, sq, m);
        sk += __shfl_xor_sync(0xffffffffu, sk, m);
    }
    const float rq = p.l2norm ? rsqrtf(sq + 1e-6f) : 1.f, rk = p.l2norm ? rsqrtf(sk + 1e-6f) : 1.f;
    const float g = -expf(Alog) * gdn::softplus(ga + dtb);
    const float decay = expf(g), beta = p.beta_mul * gdn::sigmoid(gb);
    /* two partial sums a column, so the dependent chain is half as long */
    float4 pa = make_float4(0.f, 0.f, 0.f, 0.f), pb = pa;
#pragma unroll
    for (int r = 0; r < R; r += 2) {
        pa.x += s[r].x * kv[r]; pa.y += s[r].y * kv[r]; pa.z += s[r].z * kv[r]; pa.w += s[r].w * kv[r];
        if (r + 1 < R) {
            pb.x += s[r + 1].x * kv[r + 1]; pb.y += s[r + 1].y * kv[r + 1];
            pb.z += s[r + 1].z * kv[r + 1]; pb.w += s[r + 1].w * kv[r + 1];
        }
    }
    float4 P = make_float4(pa.x + pb.x, pa.y + pb.y, pa.z + pb.z, pa.w + pb.w);
#pragma unroll
    for (int m = 2; m < 32; m <<= 1) {
        P.x += __shfl_xor_sync(0xffffffffu, P.x, m); P.y += __shfl_xor_sync(0xffffffffu, P.y, m);
        P.z += __shfl_xor_sync(0xffffffffu, P.z, m); P.w += __shfl_xor_sync(0xffffffffu, P.w, m);
    }
    /* ku = rk * u, u = beta * (v - decay * S^T k^): the rank-1 update is k (raw) x ku */
    float4 ku;
    ku.x = rk * beta * (vc[0] - decay * rk * P.x); ku.y = rk * beta * (vc[1] - decay * rk * P.y);
    ku.z = rk * beta * (vc[2] - decay * rk * P.z); ku.w = rk * beta * (vc[3] - decay * rk * P.w);
    float4 oa = make_float4(0.f, 0.f, 0.f, 0.f), ob = oa;
    float *sp = mine ? S + (int64_t)rl * V : nullptr;
#pragma unroll
    for (int r = 0; r < R; r++) {
        float4 x;
        x.x = decay * s[r].x + kv[r] * ku.x; x.y = decay * s[r].y + kv[r] * ku.y;
        x.z = decay * s[r].z + kv[r] * ku.z; x.w = decay * s[r].w + kv[r] * ku.w;
        if (mine && rl + 16 * r < K) *reinterpret_cast<float4 *>(sp) = x;
        float4 &oo = r & 1 ? ob : oa;
        oo.x += qv[r] * x.x; oo.y += qv[r] * x.y; oo.z += qv[r] * x.z; oo.w += qv[r] * x.w;
        sp += 16 * V;
    }
    float4 O = make_float4(oa.x + ob.x, oa.y + ob.y, oa.z + ob.z, oa.w + ob.w);
#pragma unroll
    for (int m = 2; m < 32; m <<= 1) {
        O.x += __shfl_xor_sync(0xffffffffu, O.x, m); O.y += __shfl_xor_sync(0xffffffffu, O.y, m);
        O.z += __shfl_xor_sync(0xffffffffu, O.z, m); O.w += __shfl_xor_sync(0xffffffffu, O.w, m);
    }
    /* every lane has the sums: lanes rl < 4 store column c + rl */
    const float ov = rl == 0 ? O.x : rl == 1 ? O.y : rl == 2 ? O.z : O.w;
    if (rl < 4 && c + rl < V) gdn::st(p.o, orow + c + rl, p.scale * rq * ov, p.dt);
}

template <bool CONV>
__global__ void decode_kernel(DecodeArgs p, ConvIn cv) {
    extern __shared__ float sm[];
    float *q = sm, *k = sm + p.K, *red = sm + 2 * p.K, *vs = red + 32;   /* vs: CONV, [V] */
    const int b = blockIdx.x / p.HV, j = blockIdx.x % p.HV, h = j / (p.HV / p.H);
    const int64_t D = 2LL * p.H * p.K + (int64_t)p.HV * p.V;
    const int64_t slot = p.slots ? p.slots[b] : b;
    const int64_t orow = ((int64_t)b * p.HV + j) * p.V;
    if (slot < 0 || slot >= p.num_slots) {
        for (int c = threadIdx.x; c < p.V; c += blockDim.x) gdn::st(p.o, orow + c, 0.f, p.dt);
        return;
    }
    if constexpr (CONV) {
        conv_qkv(p, cv, slot, h, j, 0, p.V, q, k, vs);
    } else {
        for (int i = threadIdx.x; i < p.K; i += blockDim.x) {
            q[i] = gdn::ld(p.qkv, b * D + (int64_t)h * p.K + i, p.dt);
            k[i] = gdn::ld(p.qkv, b * D + (int64_t)p.H * p.K + (int64_t)h * p.K + i, p.dt);
        }
        __syncthreads();
    }
    if (p.l2norm) { gdn::l2norm_shared(q, p.K, red); gdn::l2norm_shared(k, p.K, red); }
    const float ga = gdn::ld(p.a, (int64_t)b * p.HV + j, p.dt), gb = gdn::ld(p.b, (int64_t)b * p.HV + j, p.dt);
    const float g = -expf(p.A_log[j]) * gdn::softplus(ga + (p.dt_bias ? p.dt_bias[j] : 0.f));
    const float decay = expf(g), beta = p.beta_mul * gdn::sigmoid(gb);
    float *S = p.state + (slot * p.HV + j) * (int64_t)p.K * p.V;
    const int64_t vbase = b * D + 2LL * p.H * p.K + (int64_t)j * p.V;
    if (!p.vfirst) {
        for (int c = threadIdx.x; c < p.V; c += blockDim.x) {
            float pred = 0.f;
            for (int i = 0; i < p.K; i++) pred += S[(int64_t)i * p.V + c] * k[i];
            const float u = beta * ((CONV ? vs[c] : gdn::ld(p.qkv, vbase + c, p.dt)) - decay * pred);
            float o = 0.f;
            for (int i = 0; i < p.K; i++) {
                const float s = decay * S[(int64_t)i * p.V + c] + k[i] * u;
                S[(int64_t)i * p.V + c] = s;
                o += q[i] * s;
            }
            gdn::st(p.o, orow + c, p.scale * o, p.dt);
        }
    } else {
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
        for (int c = warp; c < p.V; c += nw) {
            float *Sc = S + (int64_t)c * p.K;
            float pred = 0.f;
            for (int i = lane; i < p.K; i += 32) pred += Sc[i] * k[i];
            pred = gdn::warp_sum(pred);
            const float u = beta * ((CONV ? vs[c] : gdn::ld(p.qkv, vbase + c, p.dt)) - decay * pred);
            float o = 0.f;
            for (int i = lane; i < p.K; i += 32) {
                const float s = decay * Sc[i] + k[i] * u;
                Sc[i] = s;
                o += q[i] * s;
            }
            o = gdn::warp_sum(o);
            if (lane == 0) gdn::st(p.o, orow + c, p.scale * o, p.dt);
        }
    }
}

/* k-first with V % 4 == 0 and a 16-byte aligned pool: tiles when there are
 * enough to fill the card a few times over (1536: 4 waves of 3 blocks per
 * SM), else warps of 8 columns */
template <bool CONV>
cudaError_t launch_vec(const DecodeArgs &p, const ConvIn &cv, const gdn_decode_config *c, cudaStream_t st) {
    const int64_t rows = (int64_t)c->B * c->HV;
    const int tcb = (c->V + TILE_COLS - 1) / TILE_COLS;
    if (rows * tcb >= 1536) {
        const size_t smem = sizeof(float) * (16 * TILE_COLS + 2 * (size_t)c->K + (CONV ? TILE_COLS : 0));
        void (*kern)(DecodeArgs, ConvIn, int) = c->K <= 64 ? decode_tile_kernel<4, CONV>
                                              : c->K <= 128 ? decode_tile_kernel<8, CONV>
                                              : decode_tile_kernel<16, CONV>;
        return gdn::launch_dependent(kern, (unsigned)(rows * tcb), 256, smem, st, p, cv, tcb);   /* a tile kernel */
    }
    const int wcb = (c->V + 31) / 32;
    const size_t smem = CONV ? sizeof(float) * (2 * (size_t)c->K + 32) : 0;
    void (*kern)(DecodeArgs, ConvIn, int) = c->K <= 32 ? decode_warp_kernel<2, CONV>
                                          : c->K <= 64 ? decode_warp_kernel<4, CONV>
                                          : c->K <= 128 ? decode_warp_kernel<8, CONV>
                                          : decode_warp_kernel<16, CONV>;
    return gdn::launch_dependent(kern, (unsigned)(rows * wcb), 128, smem, st, p, cv, wcb);   /* a warp kernel */
}

template <bool CONV>
cudaError_t launch(const DecodeArgs &p, const ConvIn &cv, const gdn_decode_config *c, cudaStream_t st) {
    const size_t vsm = CONV ? (p.vfirst ? (size_t)c->V : 0) : 0;   /* v columns in shared memory (CONV) */
    if (p.vfirst) {
        decode_kernel<CONV><<<c->B * c->HV, 256, sizeof(float) * (2 * (size_t)c->K + 32 + vsm), st>>>(p, cv);
    } else if (c->V % 4 == 0 && gdn::aligned16(p.state)) {
        return launch_vec<CONV>(p, cv, c, st);
    } else {
        const size_t smem = sizeof(float) * (2 * (size_t)c->K + 32 + 128 + (CONV ? 32 : 0));
        const dim3 grid((unsigned)(c->B * c->HV), (unsigned)((c->V + 31) / 32));
        if (c->K <= 32) decode_kfirst_kernel<8, CONV><<<grid, 128, smem, st>>>(p, cv);
        else if (c->K <= 64) decode_kfirst_kernel<16, CONV><<<grid, 128, smem, st>>>(p, cv);
        else if (c->K <= 128) decode_kfirst_kernel<32, CONV><<<grid, 128, smem, st>>>(p, cv);
        else decode_kfirst_kernel<64, CONV><<<grid, 128, smem, st>>>(p, cv);
    }
    return cudaGetLastError();
}

}  // namespace

extern "C" gdn_status gdn_cuda_decode_step(const gdn_decode_config *c, const gdn_decode_args *a, void *stream) {
    if (c->B == 0) return GDN_OK;
    DecodeArgs p;
    p.qkv = a->mixed_qkv; p.a = a->a; p.b = a->b; p.A_log = a->A_log; p.dt_bias = a->dt_bias;
    p.state = a->state; p.slots = a->slots; p.o = a->o;
    p.B = c->B; p.H = c->H; p.HV = c->HV; p.K = c->K; p.V = c->V; p.dt = (int)c->dtype;
    p.num_slots = c->num_slots; p.scale = c->scale;
    p.l2norm = (c->flags & GDN_QK_L2NORM) != 0;
    p.vfirst = (c->flags & GDN_STATE_V_FIRST) != 0;
    p.beta_mul = (c->flags & GDN_BETA_NEGATIVE) ? 2.f : 1.f;
    const ConvIn cv = {a->conv_state, a->conv_weight, a->conv_bias, c->conv_W};
    cudaStream_t st = (cudaStream_t)stream;
    if (c->conv_W > 0) {   /* the conv state of every row first (slots are distinct by contract: no scan) */
        gdn_conv1d_config cc = {0};
        cc.B = c->B; cc.D = 2 * c->H * c->K + c->HV * c->V; cc.W = c->conv_W; cc.dtype = c->dtype; cc.silu = 1;
        const gdn_status s = gdn_cuda_conv1d_update(&cc, a->proj, a->conv_weight, a->conv_bias, a->conv_state,
                                                    c->num_slots, a->slots, 1, NULL, stream);
        if (s) return s;
    }
    const cudaError_t e = c->conv_W > 0 ? launch<true>(p, cv, c, st) : launch<false>(p, cv, c, st);
    if (e != cudaSuccess) return gdn_fail(GDN_ERR_BACKEND, "decode kernel launch: %s", cudaGetErrorString(e));
    return GDN_OK;
}
