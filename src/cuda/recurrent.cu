/* CUDA recurrent forward (the math of src/cpu/recurrent.c), one block per
 * (sequence n, value head j), thread c owning state column S[:, c] in
 * registers for the whole sequence (KT >= K, a compile-time bound so the
 * column stays in registers). Per token: q, k to shared memory (L2 norm by a
 * block reduction), then each thread decays its column, forms its u_c and
 * o_c. The state touches device memory only at h0 and ht.
 *
 * Map mode (context parallel's forward map, f32: gdn_cuda_recurrent_map):
 * one sequence, K + V columns: K columns of the transition P (from I, v = 0;
 * zero unless P is wanted) then the V columns of the state, into the map
 * [HV][K*K + K*V] (k-first); no output rows. */
#include <cuda_runtime.h>
#include "cuda/common.cuh"
#include "cuda/cuda_backend.h"

namespace {

struct RecArgs {
    const void *q, *k, *v, *g, *beta;
    const float *A_log, *dt_bias, *h0;
    void *o;
    float *ht, *rstd_q, *rstd_k;   /* rstd kept for backward (chunk forward on f32), or NULL */
    float *map;                     /* map mode: the map, else NULL */
    int need_P;                     /* map mode: P's columns start from I (else P is written zero) */
    const int64_t *cu;
    int64_t T;
    int H, HV, K, V, dt, gdt;
    float scale;
    unsigned flags;
};

template <int KT>
__global__ void recurrent_kernel(RecArgs p) {
    extern __shared__ float sm[];
    float *q = sm, *k = sm + p.K, *red = sm + 2 * p.K;
    /* map mode: one sequence, blocks of columns (K + V may pass one block's registers) */
    const int n = p.map ? 0 : blockIdx.x / p.HV, j = blockIdx.x % p.HV, h = j / (p.HV / p.H);
    const int c = threadIdx.x + (p.map ? (blockIdx.x / p.HV) * blockDim.x : 0);
    const int64_t bos = p.cu ? p.cu[n] : (int64_t)n * p.T, len = p.cu ? p.cu[n + 1] - bos : p.T;
    const bool mapm = p.map != nullptr, pcol = mapm && c < p.K;   /* map mode: thread c < K carries P's column c */
    const int vc = mapm ? c - p.K : c;
    const int vfirst = (p.flags & GDN_STATE_V_FIRST) != 0, active = c < (mapm ? p.K + p.V : p.V);
    const int64_t sbase = ((int64_t)n * p.HV + j) * p.K * p.V;
    float s[KT];
#pragma unroll
    for (int i = 0; i < KT; i++)
        s[i] = pcol ? (p.need_P && i == c ? 1.f : 0.f)
             : (active && i < p.K && p.h0) ? p.h0[sbase + (vfirst ? (int64_t)vc * p.K + i : (int64_t)i * p.V + vc)] : 0.f;
    const float A = (p.flags & GDN_GATE_FUSED) ? -expf(p.A_log[j]) : 0.f;
    const float bias = ((p.flags & GDN_GATE_FUSED) && p.dt_bias) ? p.dt_bias[j] : 0.f;
    for (int64_t t = 0; t < len; t++) {
        const int64_t r = bos + t;
        __syncthreads();   /* the previous token's q, k are no longer read */
        for (int i = threadIdx.x; i < p.K; i += blockDim.x) {
            q[i] = gdn::ld(p.q, (r * p.H + h) * p.K + i, p.dt);
            k[i] = gdn::ld(p.k, (r * p.H + h) * p.K + i, p.dt);
        }
        __syncthreads();
        if (p.flags & GDN_QK_L2NORM) {
            const float rq = gdn::l2norm_shared(q, p.K, red), rk = gdn::l2norm_shared(k, p.K, red);
            if (p.rstd_q && j % (p.HV / p.H) == 0 && threadIdx.x == 0) { p.rstd_q[r * p.H + h] = rq; p.rstd_k[r * p.H + h] = rk; }
        }
        float g = p.g ? gdn::ld(p.g, r * p.HV + j, p.gdt) : 0.f;
        if (p.flags & GDN_GATE_FUSED) g = A * gdn::softplus(g + bias);
        float beta = gdn::ld(p.beta, r * p.HV + j, p.gdt);
        if (p.flags & GDN_BETA_SIGMOID) beta = ((p.flags & GDN_BETA_NEGATIVE) ? 2.f : 1.f) * gdn::sigmoid(beta);
        const float decay = expf(g);
        if (active) {
            float pred = 0.f;
#pragma unroll
            for (int i = 0; i < KT; i++) if (i < p.K) { s[i] *= decay; pred += s[i] * k[i]; }
            const float u = beta * ((pcol ? 0.f : gdn::ld(p.v, (r * p.HV + j) * p.V + vc, p.dt)) - pred);
            float o = 0.f;
#pragma unroll
            for (int i = 0; i < KT; i++) if (i < p.K) { s[i] += k[i] * u; o += q[i] * s[i]; }
            if (!mapm) gdn::st(p.o, (r * p.HV + j) * p.V + c, p.scale * o, p.dt);
        }
    }
    if (active && mapm) {
        float *m = p.map + (int64_t)j * ((int64_t)p.K * p.K + (int64_t)p.K * p.V);
#pragma unroll
        for (int i = 0; i < KT; i++)
            if (i < p.K) {
                if (pcol) m[(int64_t)i * p.K + c] = p.need_P ? s[i] : 0.f;
                else m[(int64_t)p.K * p.K + (int64_t)i * p.V + vc] = s[i];
            }
    } else if (active && p.ht) {
#pragma unroll
        for (int i = 0; i < KT; i++)
            if (i < p.K) p.ht[sbase + (vfirst ? (int64_t)c * p.K + i : (int64_t)i * p.V + c)] = s[i];
    }
}

template <int KT>
cudaError_t launch(const RecArgs &p, int64_t blocks, int threads, size_t smem, cudaStream_t st) {
    recurrent_kernel<KT><<<(unsigned)blocks, threads, smem, st>>>(p);
    return cudaGetLastError();
}

}  // namespace

namespace {
RecArgs args_of(const gdn_plan *pl, const gdn_fwd_args *a) {
    const gdn_config *c = &pl->c;
    RecArgs p;
    p.q = a->q; p.k = a->k; p.v = a->v; p.g = a->g; p.beta = a->beta;
    p.A_log = a->A_log; p.dt_bias = a->dt_bias; p.h0 = a->h0; p.o = a->o; p.ht = a->ht;
    const gdn_saved_layout sl = gdn_saved_at(c, a->saved);   /* NULL for the recurrent call */
    p.rstd_q = sl.rstd_q; p.rstd_k = sl.rstd_k;
    p.map = nullptr; p.need_P = 0;
    p.cu = c->cu_seqlens_dev; p.T = c->T;
    p.H = c->H; p.HV = c->HV; p.K = c->K; p.V = c->V; p.dt = (int)c->dtype; p.gdt = (int)c->gate_dtype;
    p.scale = c->scale; p.flags = c->flags;
    return p;
}

gdn_status run(const RecArgs &p, int64_t N, int cols, cudaStream_t st) {
    const int threads = cols <= 32 ? 32 : cols <= 64 ? 64 : cols <= 128 ? 128 : 256;
    const int64_t blocks = N * p.HV * ((cols + threads - 1) / threads);
    const size_t smem = sizeof(float) * (2 * (size_t)p.K + 32);
    const cudaError_t e = p.K <= 32 ? launch<32>(p, blocks, threads, smem, st)
                        : p.K <= 64 ? launch<64>(p, blocks, threads, smem, st)
                        : p.K <= 128 ? launch<128>(p, blocks, threads, smem, st)
                                     : launch<256>(p, blocks, threads, smem, st);
    if (e != cudaSuccess) return gdn_fail(GDN_ERR_BACKEND, "recurrent kernel launch: %s", cudaGetErrorString(e));
    return GDN_OK;
}
}  // namespace

extern "C" gdn_status gdn_cuda_recurrent_fwd(const gdn_plan *pl, const gdn_fwd_args *a, void *stream) {
    if (pl->N * pl->c.HV == 0) return GDN_OK;
    return run(args_of(pl, a), pl->N, pl->c.V, (cudaStream_t)stream);
}

extern "C" gdn_status gdn_cuda_recurrent_map(const gdn_plan *pl, const gdn_fwd_args *a, int need_P, float *map, void *stream) {
    if (pl->c.HV == 0) return GDN_OK;
    gdn_fwd_args b = *a;
    b.o = nullptr; b.ht = nullptr; b.saved = nullptr;
    RecArgs p = args_of(pl, &b);
    p.map = map;
    p.need_P = need_P;
    p.cu = nullptr;
    return run(p, 1, pl->c.K + pl->c.V, (cudaStream_t)stream);
}
