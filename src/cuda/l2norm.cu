/* CUDA standalone L2 norm, forward and backward (the math of
 * src/cpu/l2norm.c), per row:
 *   r = 1/sqrt(sum x^2 + 1e-6),  y = x r;  backward dx = r (dy - y (y . dy))
 * Laid out as the gated RMSNorm (cuda/rmsnorm.cu): a row on a group of G
 * lanes with x (and dy) in registers (16-byte accesses where dim and the
 * pointers allow), a block per row past 4 vectors per lane. */
#include <cuda_runtime.h>
#include "cuda/common.cuh"
#include "cuda/vec.cuh"
#include "cuda/cuda_layer.h"

namespace {

enum { THREADS = 256 };

struct L2Args {
    const void *x;
    void *y;
    float *rstd;
    int64_t rows;
    int dim, G;
};

template <int DT, int VEC, int NV>
__global__ void __launch_bounds__(THREADS) l2norm_rows_kernel(L2Args p) {
    const int G = p.G, lane = threadIdx.x & (G - 1), nvec = p.dim / VEC;
    const int64_t row = ((int64_t)blockIdx.x * THREADS + threadIdx.x) / G;
    const bool live = row < p.rows;
    const int64_t base = row * p.dim;
    float xv[NV][VEC];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int i = lane + k * G;
        if (live && i < nvec) {
            gdn::ldv<DT, VEC>(p.x, base + (int64_t)i * VEC, xv[k]);
#pragma unroll
            for (int c = 0; c < VEC; c++) ss += xv[k][c] * xv[k][c];
        }
    }
    ss = gdn::group_sum(ss, G);   /* every lane takes part: no return before */
    if (!live) return;
    const float r = 1.0f / sqrtf(ss + GDN_L2_EPS);
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int i = lane + k * G;
        if (i < nvec) {
            float o[VEC];
#pragma unroll
            for (int c = 0; c < VEC; c++) o[c] = xv[k][c] * r;
            gdn::stv<DT, VEC>(p.y, base + (int64_t)i * VEC, o);
        }
    }
    if (p.rstd && lane == 0) p.rstd[row] = r;
}

template <int DT, int VEC>
__global__ void __launch_bounds__(THREADS) l2norm_block_kernel(L2Args p) {
    __shared__ float red[32];
    const int nvec = p.dim / VEC;
    const int64_t base = (int64_t)blockIdx.x * p.dim;
    float ss = 0.f;
    for (int i = threadIdx.x; i < nvec; i += THREADS) {
        float xv[VEC];
        gdn::ldv<DT, VEC>(p.x, base + (int64_t)i * VEC, xv);
#pragma unroll
        for (int c = 0; c < VEC; c++) ss += xv[c] * xv[c];
    }
    const float r = 1.0f / sqrtf(gdn::block_sum(ss, red) + GDN_L2_EPS);
    for (int i = threadIdx.x; i < nvec; i += THREADS) {
        float xv[VEC], o[VEC];
        gdn::ldv<DT, VEC>(p.x, base + (int64_t)i * VEC, xv);
#pragma unroll
        for (int c = 0; c < VEC; c++) o[c] = xv[c] * r;
        gdn::stv<DT, VEC>(p.y, base + (int64_t)i * VEC, o);
    }
    if (p.rstd && threadIdx.x == 0) p.rstd[blockIdx.x] = r;
}

template <int DT, int VEC>
void launch_vec(L2Args p, cudaStream_t st) {
    int NV;
    gdn::row_plan(p.dim / VEC, &p.G, &NV);
    const unsigned blocks = (unsigned)((p.rows * p.G + THREADS - 1) / THREADS);
    if (NV == 1) l2norm_rows_kernel<DT, VEC, 1><<<blocks, THREADS, 0, st>>>(p);
    else if (NV == 2) l2norm_rows_kernel<DT, VEC, 2><<<blocks, THREADS, 0, st>>>(p);
    else if (NV == 4) l2norm_rows_kernel<DT, VEC, 4><<<blocks, THREADS, 0, st>>>(p);
    else l2norm_block_kernel<DT, VEC><<<(unsigned)p.rows, THREADS, 0, st>>>(p);
}

template <int DT>
void launch(const L2Args &p, bool vec, cudaStream_t st) {
    if (vec) launch_vec<DT, 16 / gdn::esize<DT>()>(p, st);
    else launch_vec<DT, 1>(p, st);
}


/* ---- backward: dx = r (dy - y (y . dy)), y = x r, r the forward's rstd ---- */

struct L2BwdArgs {
    const void *x, *dy;
    const float *rstd;
    void *dx;
    int64_t rows;
    int dim, G;
};

template <int DT, int VEC, int NV>
__global__ void __launch_bounds__(THREADS) l2norm_bwd_rows_kernel(L2BwdArgs p) {
    const int G = p.G, lane = threadIdx.x & (G - 1), nvec = p.dim / VEC;
    const int64_t row = ((int64_t)blockIdx.x * THREADS + threadIdx.x) / G;
    const bool live = row < p.rows;
    const int64_t base = row * p.dim;
    const float r = live ? p.rstd[row] : 0.f;
    float yv[NV][VEC], gv[NV][VEC];   /* y = x r, dy */
    float dot = 0.f;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int i = lane + k * G;
        if (live && i < nvec) {
            gdn::ldv<DT, VEC>(p.x, base + (int64_t)i * VEC, yv[k]);
            gdn::ldv<DT, VEC>(p.dy, base + (int64_t)i * VEC, gv[k]);
#pragma unroll
            for (int c = 0; c < VEC; c++) {
                yv[k][c] *= r;
                dot += yv[k][c] * gv[k][c];
            }
        }
    }
    dot = gdn::group_sum(dot, G);   /* every lane takes part: no return before */
    if (!live) return;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int i = lane + k * G;
        if (i < nvec) {
            float o[VEC];
#pragma unroll
            for (int c = 0; c < VEC; c++) o[c] = r * (gv[k][c] - yv[k][c] * dot);
            gdn::stv<DT, VEC>(p.dx, base + (int64_t)i * VEC, o);
        }
    }
}

template <int DT, int VEC>
__global__ void __launch_bounds__(THREADS) l2norm_bwd_block_kernel(L2BwdArgs p) {
    __shared__ float red[32];
    const int nvec = p.dim / VEC;
    const int64_t base = (int64_t)blockIdx.x * p.dim;
    const float r = p.rstd[blockIdx.x];
    float dot = 0.f;
    for (int i = threadIdx.x; i < nvec; i += THREADS) {
        float xv[VEC], gv[VEC];
        gdn::ldv<DT, VEC>(p.x, base + (int64_t)i * VEC, xv);
        gdn::ldv<DT, VEC>(p.dy, base + (int64_t)i * VEC, gv);
#pragma unroll
        for (int c = 0; c < VEC; c++) dot += (xv[c] * r) * gv[c];
    }
    dot = gdn::block_sum(dot, red);
    for (int i = threadIdx.x; i < nvec; i += THREADS) {
        float xv[VEC], gv[VEC], o[VEC];
        gdn::ldv<DT, VEC>(p.x, base + (int64_t)i * VEC, xv);
        gdn::ldv<DT, VEC>(p.dy, base + (int64_t)i * VEC, gv);
#pragma unroll
        for (int c = 0; c < VEC; c++) o[c] = r * (gv[c] - (xv[c] * r) * dot);
        gdn::stv<DT, VEC>(p.dx, base + (int64_t)i * VEC, o);
    }
}

template <int DT, int VEC>
void launch_bwd_vec(L2BwdArgs p, cudaStream_t st) {
    int NV;
    gdn::row_plan(p.dim / VEC, &p.G, &NV);
    const unsigned blocks = (unsigned)((p.rows * p.G + THREADS - 1) / THREADS);
    if (NV == 1) l2norm_bwd_rows_kernel<DT, VEC, 1><<<blocks, THREADS, 0, st>>>(p);
    else if (NV == 2) l2norm_bwd_rows_kernel<DT, VEC, 2><<<blocks, THREADS, 0, st>>>(p);
    else if (NV == 4) l2norm_bwd_rows_kernel<DT, VEC, 4><<<blocks, THREADS, 0, st>>>(p);
    else l2norm_bwd_block_kernel<DT, VEC><<<(unsigned)p.rows, THREADS, 0, st>>>(p);
}

template <int DT>
void launch_bwd(const L2BwdArgs &p, bool vec, cudaStream_t st) {
    if (vec) launch_bwd_vec<DT, 16 / gdn::esize<DT>()>(p, st);
    else launch_bwd_vec<DT, 1>(p, st);
}

}  // namespace

extern "C" gdn_status gdn_cuda_l2norm_fwd(int64_t rows, int dim, gdn_dtype t, const void *x, void *y, float *rstd,
                                          void *stream) {
    if (rows == 0) return GDN_OK;
    L2Args p;
    p.x = x; p.y = y; p.rstd = rstd; p.rows = rows; p.dim = dim; p.G = 1;
    const int vec = t == GDN_F32 ? 4 : 8;
    const bool v16 = dim % vec == 0 && gdn::aligned16(x) && gdn::aligned16(y);
    cudaStream_t st = (cudaStream_t)stream;
    if (t == GDN_F32) launch<0>(p, v16, st);
    else if (t == GDN_BF16) launch<1>(p, v16, st);
    else launch<2>(p, v16, st);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return gdn_fail(GDN_ERR_BACKEND, "L2 norm kernel launch: %s", cudaGetErrorString(e));
    return GDN_OK;
}

extern "C" gdn_status gdn_cuda_l2norm_bwd(int64_t rows, int dim, gdn_dtype t, const void *x, const float *rstd,
                                          const void *dy, void *dx, void *stream) {
    if (rows == 0) return GDN_OK;
    L2BwdArgs p;
    p.x = x; p.dy = dy; p.rstd = rstd; p.dx = dx; p.rows = rows; p.dim = dim; p.G = 1;
    const int vec = t == GDN_F32 ? 4 : 8;
    const bool v16 = dim % vec == 0 && gdn::aligned16(x) && gdn::aligned16(dy) && gdn::aligned16(dx);
    cudaStream_t st = (cudaStream_t)stream;
    if (t == GDN_F32) launch_bwd<0>(p, v16, st);
    else if (t == GDN_BF16) launch_bwd<1>(p, v16, st);
    else launch_bwd<2>(p, v16, st);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return gdn_fail(GDN_ERR_BACKEND, "L2 norm backward kernel launch: %s", cudaGetErrorString(e));
    return GDN_OK;
}
