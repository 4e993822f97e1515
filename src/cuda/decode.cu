/* CUDA fused decode step (the math of src/cpu/decode.c). The state is the
 * traffic: k-first, see decode_kfirst_kernel; v-first, one block per (row,
 * head), a warp owns row c (contiguous in K) and reduces across its lanes. q, k live in shared memory. No host sync; a slot
 * outside -1..num_slots-1 reads and writes nothing (as padding: slots live
 * on the device, where the host cannot check them without a sync).
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

/* k-first, many rows: bandwidth. 8 warps cover 128 columns (4 adjacent
 * columns per lane, 16-byte loads and stores), warp w holding rows
 * [w*R, w*R+R) of them (R = KT/8), so the state moves in wide, coalesced
 * accesses with R*4 values per thread in registers. Needs V % 4 == 0. */
template <int R, bool CONV>
__global__ void __launch_bounds__(256, (!CONV && R == 8) ? 3 : 1) decode_wide_kernel(DecodeArgs p, ConvIn cv) {
    extern __shared__ float sm[];
    float4 *part = reinterpret_cast<float4 *>(sm);   /* [8][32], first: 16-byte aligned whatever K */
    float *q = sm + 4 * 256, *k = q + p.K, *vs = k + p.K;   /* vs: CONV, [128] */
    const int b = blockIdx.x / p.HV, j = blockIdx.x % p.HV, h = j / (p.HV / p.H);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int c = blockIdx.y * 128 + lane * 4, i0 = w * R;
    const int V = p.V, K = p.K;
    const int64_t D = 2LL * p.H * K + (int64_t)p.HV * V;
    const int64_t slot = p.slots ? p.slots[b] : b;
    const int64_t orow = ((int64_t)b * p.HV + j) * V;
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
        if (w == 0)
            for (int e = 0; e < 4; e++) if (c + e < V) gdn::st(p.o, orow + c + e, 0.f, p.dt);
        return;
    }
    float rq, rk;
    if constexpr (CONV) {
        conv_qkv(p, cv, slot, h, j, blockIdx.y * 128, 128, q, k, vs);
        warp_qk_scales(p, q, k, &rq, &rk);
    } else {
        warp_qk_rows(p, b, h, D, i0, R, q, k, &rq, &rk);
    }
    const float ga = gdn::ld(p.a, (int64_t)b * p.HV + j, p.dt), gb = gdn::ld(p.b, (int64_t)b * p.HV + j, p.dt);
    const float g = -expf(p.A_log[j]) * gdn::softplus(ga + (p.dt_bias ? p.dt_bias[j] : 0.f));
    const float decay = expf(g), beta = p.beta_mul * gdn::sigmoid(gb);
    float4 pr = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int r = 0; r < R; r++)
        if (i0 + r < K) {
            const float kk = k[i0 + r] * rk;
            pr.x += s[r].x * kk; pr.y += s[r].y * kk; pr.z += s[r].z * kk; pr.w += s[r].w * kk;
        }
    part[w * 32 + lane] = pr;
    __syncthreads();
    float4 P = part[lane];
#pragma unroll
    for (int ww = 1; ww < 8; ww++) {
        const float4 t = part[ww * 32 + lane];
        P.x += t.x; P.y += t.y; P.z += t.z; P.w += t.w;
    }
    const int64_t vb = b * D + 2LL * p.H * K + (int64_t)j * V + c;
    float4 u;   /* v: CONV from shared memory, else from mixed_qkv */
    u.x = beta * ((CONV ? vs[lane * 4 + 0] : c + 0 < V ? gdn::ld(p.qkv, vb + 0, p.dt) : 0.f) - decay * P.x);
    u.y = beta * ((CONV ? vs[lane * 4 + 1] : c + 1 < V ? gdn::ld(p.qkv, vb + 1, p.dt) : 0.f) - decay * P.y);
    u.z = beta * ((CONV ? vs[lane * 4 + 2] : c + 2 < V ? gdn::ld(p.qkv, vb + 2, p.dt) : 0.f) - decay * P.z);
    u.w = beta * ((CONV ? vs[lane * 4 + 3] : c + 3 < V ? gdn::ld(p.qkv, vb + 3, p.dt) : 0.f) - decay * P.w);
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
    float *sp = mine ? S + (int64_t)i0 * V : nullptr;
#pragma unroll
    for (int r = 0; r < R; r++) {
        if (i0 + r < K) {
            const float kk = k[i0 + r] * rk, qq = q[i0 + r] * rq;
            float4 x;
            x.x = decay * s[r].x + kk * u.x; x.y = decay * s[r].y + kk * u.y;
            x.z = decay * s[r].z + kk * u.z; x.w = decay * s[r].w + kk * u.w;
            if (mine) *reinterpret_cast<float4 *>(sp) = x;
            o.x += qq * x.x; o.y += qq * x.y; o.z += qq * x.z; o.w += qq * x.w;
        }
        sp += V;
    }
    __syncthreads();   /* every warp has read part[] */
    part[w * 32 + lane] = o;
    __syncthreads();
    if (w == 0) {
        float4 O = part[lane];
#pragma unroll
        for (int ww = 1; ww < 8; ww++) {
            const float4 t = part[ww * 32 + lane];
            O.x += t.x; O.y += t.y; O.z += t.z; O.w += t.w;
        }
        const float ov[4] = {O.x, O.y, O.z, O.w};
        for (int e = 0; e < 4; e++) if (c + e < V) gdn::st(p.o, orow + c + e, p.scale * ov[e], p.dt);
    }
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

template <bool CONV>
cudaError_t launch(const DecodeArgs &p, const ConvIn &cv, const gdn_decode_config *c, cudaStream_t st) {
    const size_t vsm = CONV ? (p.vfirst ? (size_t)c->V : 0) : 0;   /* v columns in shared memory (CONV) */
    if (p.vfirst) {
        decode_kernel<CONV><<<c->B * c->HV, 256, sizeof(float) * (2 * (size_t)c->K + 32 + vsm), st>>>(p, cv);
    } else {
        const size_t smem = sizeof(float) * (2 * (size_t)c->K + 32 + 128 + (CONV ? 32 : 0));
        const dim3 grid((unsigned)(c->B * c->HV), (unsigned)((c->V + 31) / 32));
        const dim3 wide((unsigned)(c->B * c->HV), (unsigned)((c->V + 127) / 128));
        const size_t wsmem = sizeof(float) * (4 * 256 + 2 * (size_t)c->K + (CONV ? 128 : 0));
        /* many rows and V % 4 == 0: the 16-byte kernel (enough blocks to fill the card a few times) */
        if (c->V % 4 == 0 && (int64_t)wide.x * wide.y >= 2048 && c->K <= 256) {
            if (c->K <= 64) decode_wide_kernel<8, CONV><<<wide, 256, wsmem, st>>>(p, cv);
            else if (c->K <= 128) decode_wide_kernel<16, CONV><<<wide, 256, wsmem, st>>>(p, cv);
            else decode_wide_kernel<32, CONV><<<wide, 256, wsmem, st>>>(p, cv);
        } else if (c->K <= 32) decode_kfirst_kernel<8, CONV><<<grid, 128, smem, st>>>(p, cv);
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
