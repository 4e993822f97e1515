/* CUDA standalone gate forward (the math of src/cpu/gate.c), elementwise
 * over a [rows, HV]:  g = -exp(A_log[j]) * softplus(a + dt_bias[j]),  j = the
 * column. A thread takes 4 adjacent elements (one 16-byte store of g, an 8-
 * or 16-byte load of a) when the count and the pointers allow, else 1. */
#include <cuda_runtime.h>
#include "cuda/common.cuh"
#include "cuda/vec.cuh"
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
