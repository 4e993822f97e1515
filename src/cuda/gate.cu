/* CUDA standalone gate, forward and backward (the math of src/cpu/gate.c),
 * elementwise over a [rows, HV]:  g = -exp(A_log[j]) * softplus(a + dt_bias[j]),
 * j = the column. Forward: a thread takes 4 adjacent elements (one 16-byte
 * store of g, an 8- or 16-byte load of a) when the count and the pointers
 * allow, else 1. Backward: da elementwise, dA_log and ddt_bias summed over
 * the rows in double: columns in groups of up to 8, the rows cut among the 8
 * blocks of a thread-block cluster and summed in a fixed order
 * (cuda/cluster_sum.cuh): no atomics, no workspace. */
#include <cuda_runtime.h>
#include "cuda/common.cuh"
#include "cuda/vec.cuh"
#include "cuda/cluster_sum.cuh"
#include "cuda/cuda_layer.h"

namespace {

enum { THREADS = 256 };

struct GateArgs {
    const void *a;
    const float *A_log, *dt_bias;
    float *g;
    int64_t n;   /* rows * HV */
    int HV;
};

template <int DT, int VEC>
__global__ void __launch_bounds__(THREADS) gate_kernel(GateArgs p) {
    const int64_t i0 = ((int64_t)blockIdx.x * THREADS + threadIdx.x) * VEC;
    if (i0 >= p.n) return;
    float av[VEC], gv[VEC];
    gdn::ldv<DT, VEC>(p.a, i0, av);
    int j = (int)(i0 % p.HV);
#pragma unroll
    for (int c = 0; c < VEC; c++) {
        gv[c] = -expf(p.A_log[j]) * gdn::softplus(av[c] + (p.dt_bias ? p.dt_bias[j] : 0.f));
        if (++j == p.HV) j = 0;
    }
    gdn::stv<0, VEC>(p.g, i0, gv);
}

template <int DT>
void launch(const GateArgs &p, bool vec, cudaStream_t st) {
    const int v = vec ? 4 : 1;
    const unsigned blocks = (unsigned)((p.n / v + THREADS - 1) / THREADS);
    if (vec) gate_kernel<DT, 4><<<blocks, THREADS, 0, st>>>(p);
    else gate_kernel<DT, 1><<<blocks, THREADS, 0, st>>>(p);
}


/* ---- backward ---- */

enum { BWD_THREADS = 512, BWD_U = 4 };   /* threads, rows a thread loads at once */

struct GateBwdArgs {
    const void *a;
    const float *A_log, *dt_bias, *dg;
    void *da;
    float *dA_log, *ddt_bias;   /* ddt_bias may be NULL */
    int64_t rows, rows_per_rank;
    int HV, cw;                 /* cw: columns per block, a power of two <= 32 */
};

/* da = dg A softplus'(x), x = a + dt_bias[j], A = -exp(A_log[j]) (softplus' =
 * sigmoid, 1 past 20 where softplus(x) = x); dA_log[j] = sum dg A softplus(x)
 * and ddt_bias[j] = sum da over the rows. Block (group, rank) of a cluster of
 * gdn::CLUSTER along gridDim.y: columns group*cw .. +cw-1, rows
 * rank*rows_per_rank .. +rows_per_rank-1, a thread per (row lane, column),
 * sums in double; the partials meet in fixed order (cluster_col_sums), so
 * dA_log and ddt_bias repeat bit for bit. */
template <int DT>
__global__ void __cluster_dims__(1, gdn::CLUSTER, 1) __launch_bounds__(BWD_THREADS) gate_bwd_kernel(GateBwdArgs p) {
    __shared__ double red[BWD_THREADS * 2];
    __shared__ double tot[32 * 2];
    const int cw = p.cw, c = (int)threadIdx.x % cw, rl = (int)threadIdx.x / cw, lanes = BWD_THREADS / cw;
    const int j = (int)blockIdx.x * cw + c;
    const bool live = j < p.HV;
    const float A = live ? -expf(p.A_log[j]) : 0.f, bias = live && p.dt_bias ? p.dt_bias[j] : 0.f;
    const int64_t r0 = (int64_t)cooperative_groups::this_cluster().block_rank() * p.rows_per_rank;
    const int64_t r1 = min(r0 + p.rows_per_rank, p.rows);
    double acc[2] = {0.0, 0.0};   /* dA_log[j], ddt_bias[j] over this thread's rows, in order */
    if (live)
        for (int64_t b0 = r0 + rl; b0 < r1; b0 += (int64_t)lanes * BWD_U) {
            float av[BWD_U], gv[BWD_U];
#pragma unroll
            for (int k = 0; k < BWD_U; k++) {
                const int64_t row = b0 + (int64_t)k * lanes;
                av[k] = row < r1 ? gdn::ld(p.a, row * p.HV + j, DT) : 0.f;
                gv[k] = row < r1 ? p.dg[row * p.HV + j] : 0.f;
            }
#pragma unroll
            for (int k = 0; k < BWD_U; k++) {
                const int64_t row = b0 + (int64_t)k * lanes;
                if (row >= r1) continue;
                const float x = av[k] + bias, d = gv[k];
                const float dx = d * A * (x > 20.f ? 1.f : gdn::sigmoid(x));
                gdn::st(p.da, row * p.HV + j, dx, DT);
                acc[0] += (double)d * (double)(A * gdn::softplus(x));
                acc[1] += (double)dx;
            }
        }
    gdn::cluster_col_sums<2>(acc, cw, red, tot, [&](int cc, int k, double sum) {
        const int jj = (int)blockIdx.x * cw + cc;
        if (jj >= p.HV) return;
        if (k == 0) p.dA_log[jj] = (float)sum;
        else if (p.ddt_bias) p.ddt_bias[jj] = (float)sum;
    });
}

}  // namespace

extern "C" gdn_status gdn_cuda_gate_fwd(int64_t rows, int HV, gdn_dtype t, const void *a, const float *A_log,
                                        const float *dt_bias, float *g, void *stream) {
    GateArgs p;
    p.a = a; p.A_log = A_log; p.dt_bias = dt_bias; p.g = g; p.n = rows * HV; p.HV = HV;
    if (p.n == 0) return GDN_OK;
    const bool vec = p.n % 4 == 0 && gdn::aligned16(g) && (reinterpret_cast<uintptr_t>(a) & (t == GDN_F32 ? 15 : 7)) == 0;
    cudaStream_t st = (cudaStream_t)stream;
    if (t == GDN_F32) launch<0>(p, vec, st);
    else if (t == GDN_BF16) launch<1>(p, vec, st);
    else launch<2>(p, vec, st);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return gdn_fail(GDN_ERR_BACKEND, "gate kernel launch: %s", cudaGetErrorString(e));
    return GDN_OK;
}

extern "C" gdn_status gdn_cuda_gate_bwd(int64_t rows, int HV, gdn_dtype t, const void *a, const float *A_log,
                                        const float *dt_bias, const float *dg, void *da, float *dA_log,
                                        float *ddt_bias, void *stream) {
    GateBwdArgs p;
    p.a = a; p.A_log = A_log; p.dt_bias = dt_bias; p.dg = dg; p.da = da; p.dA_log = dA_log; p.ddt_bias = ddt_bias;
    p.rows = rows; p.HV = HV;
    p.rows_per_rank = (rows + gdn::CLUSTER - 1) / gdn::CLUSTER;
    /* 8 columns a block (32 bytes of dg), fewer for a narrow HV: then a
     * block's rows are one contiguous piece */
    p.cw = 1;
    while (p.cw < 8 && p.cw < HV) p.cw *= 2;
    const unsigned groups = (unsigned)((HV + p.cw - 1) / p.cw);
    cudaStream_t st = (cudaStream_t)stream;
    const dim3 grid(groups, gdn::CLUSTER);
    if (t == GDN_F32) gate_bwd_kernel<0><<<grid, BWD_THREADS, 0, st>>>(p);
    else if (t == GDN_BF16) gate_bwd_kernel<1><<<grid, BWD_THREADS, 0, st>>>(p);
    else gate_bwd_kernel<2><<<grid, BWD_THREADS, 0, st>>>(p);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return gdn_fail(GDN_ERR_BACKEND, "gate backward kernel launch: %s", cudaGetErrorString(e));
    return GDN_OK;
}
