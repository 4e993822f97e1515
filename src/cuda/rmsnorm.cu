/* CUDA gated RMSNorm, forward and backward (the math of src/cpu/rmsnorm.c),
 * per row of V:
 *   r = 1/sqrt(sum x^2 / V + eps),  y_i = x_i r w_i gate(z_i),
 *   gate(z) = z sigmoid(z) (SiLU) or sigmoid(z)
 * A row lives on a group of G lanes of one warp (G = the row's 16-byte
 * vectors rounded up to a power of two, at most 32), x and z in registers
 * between the sum and the scaling, so each byte moves once and the sum is a
 * few shuffles; V = 128 in bf16 is 16 lanes, two rows per warp. Rows longer
 * than 4 vectors per lane take one block each and read x twice (the second
 * time from cache). fp32 math; the sum's order is fixed, so bits repeat.
 * Backward, a_i = dy_i w_i gate(z_i), c = r^2 (a . x) / V:
 *   dx_i = r (a_i - x_i c),  dz_i = dy_i x_i r w_i gate'(z_i),
 *   dw_i = sum over rows of dy_i x_i r gate(z_i)
 * dx and dz in the forward's layout (r from rstd, or recomputed by the
 * forward's own sum: its bits where both take the same vector width); dw by a
 * second kernel: columns in groups of 8 (32 without rstd, whose blocks read
 * whole rows of x for their own r), the rows
 * cut among the 8 blocks of a thread-block cluster and summed in a fixed
 * order (cuda/cluster_sum.cuh): no atomics, no workspace. */
#include <cuda_runtime.h>
#include "cuda/common.cuh"
#include "cuda/vec.cuh"
#include "cuda/cluster_sum.cuh"
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


/* ---- backward ---- */

enum { DW_THREADS = 512, DW_U = 8 };   /* dw kernel: threads, rows a thread loads at once */

struct NormBwdArgs {
    const void *x, *z, *dy;
    const float *w, *rstd;   /* rstd NULL: recomputed */
    void *dx, *dz;
    float *dw;
    int64_t rows, rows_per_rank;
    int V, sigm, G, cw;      /* G: lanes per row (dx, dz); cw: columns per dw block */
    float eps;
};

/* gate(z) and its derivative: SiLU z s and s (1 + z (1 - s)), sigmoid s and s
 * (1 - s), with 1 - s taken as sigmoid(-z) (formed as 1 - s it keeps only
 * eps / (1 - s) of its digits where the gate saturates). s = 1 / (1 + e^-z) as gdn::sigmoid, its reciprocal by __frcp_rn
 * (the same correctly rounded value) rather than '/', whose called slow path
 * spills in the dw kernel. */
__device__ __forceinline__ void gate_and_grad(float z, int sigm, float *g, float *dg) {
    const float s = __frcp_rn(1.f + expf(-z)), sn = __frcp_rn(1.f + expf(z));
    *g = sigm ? s : z * s;
    *dg = sigm ? s * sn : s * (1.f + z * sn);
}

/* dx of one element from a = dy w gate(z), x, r and cc = r^2 (a . x) / V.
 * V == 1: a - x cc = a (1 - x^2 r^2) = a eps r^2 exactly, where the general
 * form would cancel all of its ~eps-sized digits (as the CPU) */
__device__ __forceinline__ float norm_dx(float a, float x, float r, float cc, int V, float eps) {
    return V == 1 ? r * a * (eps * r * r) : r * (a - x * cc);
}

/* dx and dz, laid out as the forward: a row on G lanes, x, z and dy (then a)
 * in registers; r from rstd, or recomputed exactly as the forward does (the
 * same sum in the same order: the bits of the forward's rstd when the
 * forward took the same vector width). */
template <int DT, int VEC, int NV>
__global__ void __launch_bounds__(THREADS) rmsnorm_bwd_rows_kernel(NormBwdArgs p) {
    const int G = p.G, lane = threadIdx.x & (G - 1), nvec = p.V / VEC;
    const int64_t row = ((int64_t)blockIdx.x * THREADS + threadIdx.x) / G;
    const bool live = row < p.rows;
    const int64_t base = row * p.V;
    float xv[NV][VEC], zv[NV][VEC], av[NV][VEC];   /* av: dy, then a = dy w gate(z) */
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int i = lane + k * G;
        if (live && i < nvec) {
            gdn::ldv<DT, VEC>(p.x, base + (int64_t)i * VEC, xv[k]);
            gdn::ldv<DT, VEC>(p.z, base + (int64_t)i * VEC, zv[k]);
            gdn::ldv<DT, VEC>(p.dy, base + (int64_t)i * VEC, av[k]);
#pragma unroll
            for (int c = 0; c < VEC; c++) ss += xv[k][c] * xv[k][c];
        }
    }
    ss = gdn::group_sum(ss, G);   /* every lane takes part in both sums: no return before the second */
    const float r = !live ? 0.f : p.rstd ? p.rstd[row] : 1.0f / sqrtf(ss / (float)p.V + p.eps);
    float dot = 0.f;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int i = lane + k * G;
        if (live && i < nvec) {
            float wv[VEC], o[VEC];
            gdn::ldf<VEC>(p.w, (int64_t)i * VEC, wv);
#pragma unroll
            for (int c = 0; c < VEC; c++) {
                float g, dg;
                gate_and_grad(zv[k][c], p.sigm, &g, &dg);
                o[c] = av[k][c] * (xv[k][c] * r) * wv[c] * dg;   /* dz */
                av[k][c] = av[k][c] * wv[c] * g;
                dot += av[k][c] * xv[k][c];
            }
            gdn::stv<DT, VEC>(p.dz, base + (int64_t)i * VEC, o);
        }
    }
    dot = gdn::group_sum(dot, G);
    if (!live) return;
    const float cc = dot / (float)p.V * r * r;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int i = lane + k * G;
        if (i < nvec) {
            float o[VEC];
#pragma unroll
            for (int c = 0; c < VEC; c++) o[c] = norm_dx(av[k][c], xv[k][c], r, cc, p.V, p.eps);
            gdn::stv<DT, VEC>(p.dx, base + (int64_t)i * VEC, o);
        }
    }
}

/* long rows: a block per row, the row read again for each pass (from cache) */
template <int DT, int VEC>
__global__ void __launch_bounds__(THREADS) rmsnorm_bwd_block_kernel(NormBwdArgs p) {
    __shared__ float red[32];
    const int nvec = p.V / VEC;
    const int64_t base = (int64_t)blockIdx.x * p.V;
    float r;
    if (p.rstd) {
        r = p.rstd[blockIdx.x];
    } else {   /* the forward's sum, in its order */
        float ss = 0.f;
        for (int i = threadIdx.x; i < nvec; i += THREADS) {
            float xv[VEC];
            gdn::ldv<DT, VEC>(p.x, base + (int64_t)i * VEC, xv);
#pragma unroll
            for (int c = 0; c < VEC; c++) ss += xv[c] * xv[c];
        }
        ss = gdn::block_sum(ss, red);
        r = 1.0f / sqrtf(ss / (float)p.V + p.eps);
    }
    float dot = 0.f;
    for (int i = threadIdx.x; i < nvec; i += THREADS) {
        float xv[VEC], zv[VEC], gv[VEC], wv[VEC], o[VEC];
        gdn::ldv<DT, VEC>(p.x, base + (int64_t)i * VEC, xv);
        gdn::ldv<DT, VEC>(p.z, base + (int64_t)i * VEC, zv);
        gdn::ldv<DT, VEC>(p.dy, base + (int64_t)i * VEC, gv);
        gdn::ldf<VEC>(p.w, (int64_t)i * VEC, wv);
#pragma unroll
        for (int c = 0; c < VEC; c++) {
            float g, dg;
            gate_and_grad(zv[c], p.sigm, &g, &dg);
            o[c] = gv[c] * (xv[c] * r) * wv[c] * dg;
            dot += gv[c] * wv[c] * g * xv[c];
        }
        gdn::stv<DT, VEC>(p.dz, base + (int64_t)i * VEC, o);
    }
    dot = gdn::block_sum(dot, red);
    const float cc = dot / (float)p.V * r * r;
    for (int i = threadIdx.x; i < nvec; i += THREADS) {
        float xv[VEC], zv[VEC], gv[VEC], wv[VEC], o[VEC];
        gdn::ldv<DT, VEC>(p.x, base + (int64_t)i * VEC, xv);
        gdn::ldv<DT, VEC>(p.z, base + (int64_t)i * VEC, zv);
        gdn::ldv<DT, VEC>(p.dy, base + (int64_t)i * VEC, gv);
        gdn::ldf<VEC>(p.w, (int64_t)i * VEC, wv);
#pragma unroll
        for (int c = 0; c < VEC; c++) {
            float g, dg;
            gate_and_grad(zv[c], p.sigm, &g, &dg);
            o[c] = norm_dx(gv[c] * wv[c] * g, xv[c], r, cc, p.V, p.eps);
        }
        gdn::stv<DT, VEC>(p.dx, base + (int64_t)i * VEC, o);
    }
}

/* dw[i] = sum over rows of dy_i x_i r gate(z_i). Block (group, rank) of a
 * cluster of gdn::CLUSTER along gridDim.y: columns group*cw .. +cw-1 (cw a
 * power of two <= 32), rows rank*rows_per_rank .. +rows_per_rank-1, a thread
 * per (row lane, column), DW_U rows loaded at once. Without rstd, r is first
 * recomputed for those rows, a warp per row (full rows: the column blocks
 * read x again). The partials meet in fixed order (cluster_col_sums), so dw
 * repeats bit for bit. */
template <int DT>
__global__ void __cluster_dims__(1, gdn::CLUSTER, 1) __launch_bounds__(DW_THREADS, 1) rmsnorm_dw_kernel(NormBwdArgs p) {
    __shared__ float red[DW_THREADS];
    __shared__ double tot[32];
    __shared__ float rs[DW_THREADS * DW_U];   /* r of the batch's rows when rstd is NULL (cw >= 1) */
    const int cw = p.cw, c = (int)threadIdx.x % cw, rl = (int)threadIdx.x / cw, lanes = DW_THREADS / cw;
    const int col = (int)blockIdx.x * cw + c;
    const bool live = col < p.V;
    const int64_t r0 = (int64_t)cooperative_groups::this_cluster().block_rank() * p.rows_per_rank;
    const int64_t r1 = min(r0 + p.rows_per_rank, p.rows);
    const int64_t batch = (int64_t)lanes * DW_U;   /* rows b0 + rl + k * lanes, k < DW_U */
    float acc[1] = {0.f};
    for (int64_t b0 = r0; b0 < r1; b0 += batch) {
        if (!p.rstd) {
            const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
            __syncthreads();   /* the previous batch's r are read */
            for (int64_t i = warp; i < batch && b0 + i < r1; i += DW_THREADS / 32) {
                const int64_t base = (b0 + i) * p.V;
                float ss = 0.f;
                for (int v = lane; v < p.V; v += 32) {
                    const float xv = gdn::ld(p.x, base + v, DT);
                    ss += xv * xv;
                }
                ss = gdn::warp_sum(ss);
                if (lane == 0) rs[i] = 1.0f / sqrtf(ss / (float)p.V + p.eps);
            }
            __syncthreads();
        }
        float xv[DW_U], zv[DW_U], gv[DW_U], rv[DW_U];
#pragma unroll
        for (int k = 0; k < DW_U; k++) {
            const int i = rl + k * lanes;
            const int64_t row = b0 + i;
            const bool ok = live && row < r1;
            xv[k] = ok ? gdn::ld(p.x, row * p.V + col, DT) : 0.f;
            zv[k] = ok ? gdn::ld(p.z, row * p.V + col, DT) : 0.f;
            gv[k] = ok ? gdn::ld(p.dy, row * p.V + col, DT) : 0.f;
            rv[k] = !ok ? 0.f : p.rstd ? p.rstd[row] : rs[i];
        }
#pragma unroll
        for (int k = 0; k < DW_U; k++) {
            if (!live || b0 + rl + k * lanes >= r1) continue;
            float g, dg;
            gate_and_grad(zv[k], p.sigm, &g, &dg);
            acc[0] += gv[k] * (xv[k] * rv[k]) * g;
        }
    }
    gdn::cluster_col_sums<1>(acc, cw, red, tot, [&](int cc, int, double sum) {
        const int cl = (int)blockIdx.x * cw + cc;
        if (cl < p.V) p.dw[cl] = (float)sum;
    });
}

template <int DT, int VEC>
void launch_bwd_vec(NormBwdArgs p, cudaStream_t st) {
    int NV;
    gdn::row_plan(p.V / VEC, &p.G, &NV);
    const unsigned blocks = (unsigned)((p.rows * p.G + THREADS - 1) / THREADS);
    if (NV == 1) rmsnorm_bwd_rows_kernel<DT, VEC, 1><<<blocks, THREADS, 0, st>>>(p);
    else if (NV == 2) rmsnorm_bwd_rows_kernel<DT, VEC, 2><<<blocks, THREADS, 0, st>>>(p);
    else if (NV == 4) rmsnorm_bwd_rows_kernel<DT, VEC, 4><<<blocks, THREADS, 0, st>>>(p);
    else rmsnorm_bwd_block_kernel<DT, VEC><<<(unsigned)p.rows, THREADS, 0, st>>>(p);
}

/* dx, dz (rows > 0), then dw (always: zeros without rows) */
template <int DT>
cudaError_t launch_bwd(const NormBwdArgs &p, bool vec, cudaStream_t st) {
    if (p.rows > 0) {
        if (vec) launch_bwd_vec<DT, 16 / gdn::esize<DT>()>(p, st);
        else launch_bwd_vec<DT, 1>(p, st);
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    const unsigned groups = (unsigned)((p.V + p.cw - 1) / p.cw);
    rmsnorm_dw_kernel<DT><<<dim3(groups, gdn::CLUSTER), DW_THREADS, 0, st>>>(p);
    return cudaGetLastError();
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

extern "C" gdn_status gdn_cuda_rmsnorm_bwd(const gdn_rmsnorm_config *c, const void *x, const void *z, const float *w,
                                           const float *rstd, const void *dy, void *dx, void *dz, float *dw,
                                           void *stream) {
    NormBwdArgs p;
    p.x = x; p.z = z; p.dy = dy; p.w = w; p.rstd = rstd; p.dx = dx; p.dz = dz; p.dw = dw;
    p.rows = c->rows; p.V = c->V; p.sigm = c->gate == GDN_NORM_GATE_SIGMOID; p.eps = c->eps; p.G = 1;
    p.rows_per_rank = (c->rows + gdn::CLUSTER - 1) / gdn::CLUSTER;
    /* dw blocks: 8 columns (32 bytes of f32, a sector), 32 without rstd (fewer
     * blocks that each read whole rows of x for r); fewer for a short V */
    const int cmax = rstd ? 8 : 32;
    p.cw = 1;
    while (p.cw < cmax && p.cw < c->V) p.cw *= 2;
    const int vec = c->dtype == GDN_F32 ? 4 : 8;
    const bool v16 = c->V % vec == 0 && gdn::aligned16(x) && gdn::aligned16(z) && gdn::aligned16(w) &&
                     gdn::aligned16(dy) && gdn::aligned16(dx) && gdn::aligned16(dz);
    cudaStream_t st = (cudaStream_t)stream;
    const cudaError_t e = c->dtype == GDN_F32 ? launch_bwd<0>(p, v16, st)
                        : c->dtype == GDN_BF16 ? launch_bwd<1>(p, v16, st) : launch_bwd<2>(p, v16, st);
    if (e != cudaSuccess) return gdn_fail(GDN_ERR_BACKEND, "gated RMSNorm backward kernel launch: %s", cudaGetErrorString(e));
    return GDN_OK;
}
