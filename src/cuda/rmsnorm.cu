/* CUDA gated RMSNorm forward (the math of src/cpu/rmsnorm.c), per row of V:
 *   r = 1/sqrt(sum x^2 / V + eps),  y_i = x_i r w_i gate(z_i),
 *   gate(z) = z sigmoid(z) (SiLU) or sigmoid(z)
 * A row lives on a group of G lanes of one warp (G = the row's 16-byte
 * vectors rounded up to a power of two, at most 32), x and z in registers
 * between the sum and the scaling, so each byte moves once and the sum is a
 * few shuffles; V = 128 in bf16 is 16 lanes, two rows per warp. Rows longer
 * than 4 vectors per lane take one block each and read x twice (the second
 * time from cache). fp32 math; the sum's order is fixed, so bits repeat. */
#include <cuda_runtime.h>
#include "cuda/common.cuh"
#include "cuda/vec.cuh"
#include "cuda/cuda_layer.h"

namespace {

enum { THREADS = 256 };

struct NormArgs {
    const void *x, *z;
    const float *w;
    void *y;
    float *rstd;
    int64_t rows;
    int V, sigm, G;
    float eps;
};

__device__ __forceinline__ float gate(float z, int sigm) {
    const float s = gdn::sigmoid(z);
    return sigm ? s : z * s;
}

template <int DT, int VEC, int NV>
__global__ void __launch_bounds__(THREADS) rmsnorm_rows_kernel(NormArgs p) {
    const int G = p.G, lane = threadIdx.x & (G - 1), nvec = p.V / VEC;
    const int64_t row = ((int64_t)blockIdx.x * THREADS + threadIdx.x) / G;
    const bool live = row < p.rows;
    const int64_t base = row * p.V;
    float xv[NV][VEC], zv[NV][VEC];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int i = lane + k * G;
        if (live && i < nvec) {
            gdn::ldv<DT, VEC>(p.x, base + (int64_t)i * VEC, xv[k]);
            gdn::ldv<DT, VEC>(p.z, base + (int64_t)i * VEC, zv[k]);
#pragma unroll
            for (int c = 0; c < VEC; c++) ss += xv[k][c] * xv[k][c];
        }
    }
    ss = gdn::group_sum(ss, G);   /* every lane takes part: no return before */
    if (!live) return;
    const float r = 1.0f / sqrtf(ss / (float)p.V + p.eps);
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int i = lane + k * G;
        if (i < nvec) {
            float wv[VEC], o[VEC];
            gdn::ldf<VEC>(p.w, (int64_t)i * VEC, wv);
#pragma unroll
            for (int c = 0; c < VEC; c++) o[c] = xv[k][c] * r * wv[c] * gate(zv[k][c], p.sigm);
            gdn::stv<DT, VEC>(p.y, base + (int64_t)i * VEC, o);
        }
    }
    if (p.rstd && lane == 0) p.rstd[row] = r;
}

/* long rows: a block per row, x read twice */
template <int DT, int VEC>
__global__ void __launch_bounds__(THREADS) rmsnorm_block_kernel(NormArgs p) {
    __shared__ float red[32];
    const int nvec = p.V / VEC;
    const int64_t base = (int64_t)blockIdx.x * p.V;
    float ss = 0.f;
    for (int i = threadIdx.x; i < nvec; i += THREADS) {
        float xv[VEC];
        gdn::ldv<DT, VEC>(p.x, base + (int64_t)i * VEC, xv);
#pragma unroll
        for (int c = 0; c < VEC; c++) ss += xv[c] * xv[c];
    }
    ss = gdn::block_sum(ss, red);
    const float r = 1.0f / sqrtf(ss / (float)p.V + p.eps);
    for (int i = threadIdx.x; i < nvec; i += THREADS) {
        float xv[VEC], zv[VEC], wv[VEC], o[VEC];
        gdn::ldv<DT, VEC>(p.x, base + (int64_t)i * VEC, xv);
        gdn::ldv<DT, VEC>(p.z, base + (int64_t)i * VEC, zv);
        gdn::ldf<VEC>(p.w, (int64_t)i * VEC, wv);
#pragma unroll
        for (int c = 0; c < VEC; c++) o[c] = xv[c] * r * wv[c] * gate(zv[c], p.sigm);
        gdn::stv<DT, VEC>(p.y, base + (int64_t)i * VEC, o);
    }
    if (p.rstd && threadIdx.x == 0) p.rstd[blockIdx.x] = r;
}

template <int DT, int VEC>
void launch_vec(NormArgs p, cudaStream_t st) {
    int NV;
    gdn::row_plan(p.V / VEC, &p.G, &NV);
    const unsigned blocks = (unsigned)((p.rows * p.G + THREADS - 1) / THREADS);
    if (NV == 1) rmsnorm_rows_kernel<DT, VEC, 1><<<blocks, THREADS, 0, st>>>(p);
    else if (NV == 2) rmsnorm_rows_kernel<DT, VEC, 2><<<blocks, THREADS, 0, st>>>(p);
    else if (NV == 4) rmsnorm_rows_kernel<DT, VEC, 4><<<blocks, THREADS, 0, st>>>(p);
    else rmsnorm_block_kernel<DT, VEC><<<(unsigned)p.rows, THREADS, 0, st>>>(p);
}

template <int DT>
void launch(const NormArgs &p, bool vec, cudaStream_t st) {
    if (vec) launch_vec<DT, 16 / gdn::esize<DT>()>(p, st);
    else launch_vec<DT, 1>(p, st);
}

}  // namespace

extern "C" gdn_status gdn_cuda_rmsnorm_fwd(const gdn_rmsnorm_config *c, const void *x, const void *z, const float *w,
                                           void *y, float *rstd, void *stream) {
    if (c->rows == 0) return GDN_OK;
    NormArgs p;
    p.x = x; p.z = z; p.w = w; p.y = y; p.rstd = rstd;
    p.rows = c->rows; p.V = c->V; p.sigm = c->gate == GDN_NORM_GATE_SIGMOID; p.eps = c->eps; p.G = 1;
    const int vec = c->dtype == GDN_F32 ? 4 : 8;
    const bool v16 = c->V % vec == 0 && gdn::aligned16(x) && gdn::aligned16(z) && gdn::aligned16(w) && gdn::aligned16(y);
    cudaStream_t st = (cudaStream_t)stream;
    if (c->dtype == GDN_F32) launch<0>(p, v16, st);
    else if (c->dtype == GDN_BF16) launch<1>(p, v16, st);
    else launch<2>(p, v16, st);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return gdn_fail(GDN_ERR_BACKEND, "gated RMSNorm kernel launch: %s", cudaGetErrorString(e));
    return GDN_OK;
}
