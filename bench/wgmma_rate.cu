/* What one wgmma costs the walks: cycles of an SM per m64nNk16 bf16
 * product with A from registers (the state walk's form, wgt_rs of
 * src/cuda/chunk_fwd.cuh) and, for n32, with A from shared memory (P's
 * form, wgt_ss32), issued in batches of B products and waited for as the
 * walk's chain does (commit, then wait for all), by one warpgroup alone or
 * by two at once (the walk's two warpgroups). The chunk forward's state walk
 * measured ~40 % of the dense rate on its products (bench/NOTES.md, stop
 * 53); this says how much of that the products' shapes set: at full rate an
 * SM makes 4096 bf16 FLOP a cycle (m64n128k16: 64 cycles, m64n32k16: 16).
 *
 * The operands are zeros in shared memory (the rate does not depend on the
 * values); one block an SM, every SM; block 0's first thread of each
 * warpgroup prints its cycles per batch.
 *
 * Build and run on a GPU machine (sm_90a):
 *   nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude -o /tmp/wgr bench/wgmma_rate.cu
 *   /tmp/wgr
 * Columns: form, N, warpgroups, products a batch, cycles a batch (median
 * over the batches of warpgroup 0), FLOP a cycle of the SM (both
 * warpgroups' products), that as a fraction of 4096. */
#include <cstdio>
#include <cuda_runtime.h>
#include "cuda/chunk_fwd.cuh"

using namespace gdn::cfwd;
using gdn::saddr;

constexpr int REPS = 64;   /* batches timed */

template <int N, bool SS, int B>
__global__ void __launch_bounds__(256, 1) rate_kernel(int wgs, long long *out) {
    extern __shared__ __align__(1024) char sm_raw[];
    char *sm = sm_raw + ((1024 - (saddr(sm_raw) & 1023)) & 1023);
    const int tid = threadIdx.x, cg = tid >> 7;
    for (int e = tid; e < 32768 / 16; e += blockDim.x) reinterpret_cast<uint4 *>(sm)[e] = make_uint4(0, 0, 0, 0);
    fence_async_smem();
    __syncthreads();
    if (cg >= wgs) return;
    float d[N / 2];
#pragma unroll
    for (int q = 0; q < N / 2; q++) d[q] = 0.f;
    const uint32_t a[4] = {0u, 0u, 0u, 0u};
    long long t[REPS];
    for (int r = 0; r < REPS; r++) {
        const long long t0 = clock64();
        wg_fence();
#pragma unroll
        for (int k = 0; k < B; k++) {
            const uint64_t db = desc_sw128(sm + (k & 3) * 32, 16);
            if constexpr (SS) wgt_ss32<true>(d, desc_sw128(sm + 16384 + (k & 3) * 32, 16), db, 1);
            else wgt_rs<N, true, 0>(d, a, db, 1);
        }
        wg_commit();
        wg_wait<0>();
        t[r] = clock64() - t0;
    }
    float s = 0.f;   /* the accumulators used, so the products are kept */
#pragma unroll
    for (int q = 0; q < N / 2; q++) s += d[q];
    if (blockIdx.x == 0 && (tid & 127) == 0) {
        for (int i = 1; i < REPS; i++)   /* insertion sort: the median */
            for (int j = i; j > 0 && t[j] < t[j - 1]; j--) { const long long x = t[j]; t[j] = t[j - 1]; t[j - 1] = x; }
        out[cg] = t[REPS / 2] + (s != 0.f);
    }
}

template <int N, bool SS, int B> void run(int sms) {
    long long *out, h[2] = {0, 0};
    cudaMalloc(&out, sizeof h);
    const int smem = 32768 + 1024;
    cudaFuncSetAttribute(rate_kernel<N, SS, B>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    for (int wgs = 1; wgs <= 2; wgs++) {
        cudaMemset(out, 0, sizeof h);
        rate_kernel<N, SS, B><<<sms, 256, smem>>>(wgs, out);
        if (cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost) != cudaSuccess) { printf("launch failed\n"); return; }
        const double cyc = (double)(wgs == 2 && h[1] > h[0] ? h[1] : h[0]);
        const double flop = (double)wgs * B * 64.0 * N * 16 * 2;
        printf("%s n%-3d wg %d batch %2d  %7.0f cycles  %6.0f FLOP/cycle  %5.1f %%\n", SS ? "ss" : "rs", N, wgs, B, cyc, flop / cyc,
               100.0 * flop / cyc / 4096.0);
    }
    cudaFree(out);
}

int main() {
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
        printf("no CUDA device\n");
        return 0;
    }
    run<32, false, 4>(sms); run<32, false, 8>(sms); run<32, false, 16>(sms); run<32, true, 8>(sms);
    run<64, false, 4>(sms); run<64, false, 8>(sms); run<64, false, 16>(sms);
    run<128, false, 4>(sms); run<128, false, 8>(sms); run<128, false, 16>(sms);
    return 0;
}
