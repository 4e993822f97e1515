/* A model of a hand-off between two warpgroups of one block through shared
 * memory, small enough to read racecheck's report line by line: does
 * racecheck take a named barrier that one warpgroup arrives at (bar.arrive)
 * and another waits at (bar.sync), or a CTA mbarrier, as the synchronisation
 * that orders the producer's stores before the consumer's loads? (bench/NOTES.md,
 * stop 59: the fused pass's K K^T handed from S to V, wip/kk-s, reported
 * as 7 pairs of S's stores and V's loads.)
 *
 * One block of three warpgroups (384 threads, as the fused pass). Each step:
 * the producer warpgroup P writes its tile (8 float4 a thread, the fused
 * pass's pattern), hands it to the consumer C, which reads and checks it;
 * then the block's barrier (bar.sync 0, 384) before the next step's writes.
 *   mode 0: P = 0, C = 1: bar.arrive 8, 256 / bar.sync 8, 256
 *   mode 1: P = 0, C = 1: both bar.sync 8, 256
 *   mode 2: P = 0, C = 1: a CTA mbarrier, 128 arrivals (release), C's
 *           try_wait.parity (acquire)
 *   mode 3: P = 2, C = 1: bar.arrive 7, 256 / bar.sync 7, 256 (the pass's
 *           BAR_Q roles)
 *   mode 4: P = 0, C = 1: no hand-off at all (a real race: racecheck must
 *           report it, or the model cannot tell anything)
 *   mode 5: as mode 2 with an arrival a warp (__syncwarp, then the first
 *           lane's release; the mbarrier counts 4)
 * Prints the number of wrong values read (0 unless mode 4 races).
 *
 * Build and run on a GPU machine (sm_90a):
 *   nvcc -O2 -gencode=arch=compute_90a,code=sm_90a -o /tmp/rch bench/racecheck_handoff_model.cu
 *   for m in 0 1 2 3 4 5; do compute-sanitizer --tool racecheck --racecheck-report hazard /tmp/rch $m | tail -2; done
 * Reading (H200, stop 59): every mode but 4 reads 0 wrong values; racecheck
 * reports modes 0 and 3 (WAR), 4 (WAR) and 5 (RAW), and passes 1 and 2. So
 * a named barrier that the producer arrives at, and an arrival a warp, are
 * reported as hazards though correct; both warpgroups at bar.sync, or an
 * mbarrier that every producer thread arrives at, are not. The fused pass
 * hands S's K K^T to V by the latter (src/cuda/chunk_bwd_fused.cu). */
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

constexpr int NT = 384, STEPS = 4;

__device__ __forceinline__ uint32_t saddr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__global__ void model(int mode, unsigned *wrong) {
    __shared__ float4 D[8 * 128];
    __shared__ __align__(8) uint64_t mb;
    const int wg = threadIdx.x / 128, t = threadIdx.x & 127;
    const int prod = mode == 3 ? 2 : 0;
    if (threadIdx.x == 0) asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(saddr(&mb)), "r"(mode == 5 ? 4 : 128) : "memory");
    asm volatile("bar.sync 0, 384;" ::: "memory");
    unsigned bad = 0;
    for (int s = 0; s < STEPS; s++) {
        if (wg == prod) {
#pragma unroll
            for (int q = 0; q < 8; q++) D[q * 128 + t] = make_float4(s, q, t, s + q + t);
            if (mode == 0) asm volatile("bar.arrive 8, 256;" ::: "memory");
            else if (mode == 1) asm volatile("bar.sync 8, 256;" ::: "memory");
            else if (mode == 2) asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(saddr(&mb)) : "memory");
            else if (mode == 3) asm volatile("bar.arrive 7, 256;" ::: "memory");
            else if (mode == 5) {
                __syncwarp();
                if ((t & 31) == 0) asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(saddr(&mb)) : "memory");
            }
        } else if (wg == 1) {
            if (mode == 0 || mode == 1) asm volatile("bar.sync 8, 256;" ::: "memory");
            else if (mode == 3) asm volatile("bar.sync 7, 256;" ::: "memory");
            else if (mode == 2 || mode == 5) {
                uint32_t done = 0;
                while (!done)
                    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
                                 : "=r"(done) : "r"(saddr(&mb)), "r"((uint32_t)(s & 1)) : "memory");
            }
#pragma unroll
            for (int q = 0; q < 8; q++) {
                const float4 v = D[q * 128 + t];
                if (v.x != s || v.y != q || v.z != t || v.w != s + q + t) bad++;
            }
        }
        asm volatile("bar.sync 0, 384;" ::: "memory");
    }
    if (bad) atomicAdd(wrong, bad);
}

int main(int argc, char **argv) {
    const int mode = argc > 1 ? atoi(argv[1]) : 0;
    unsigned *wrong, h = 0;
    cudaMalloc(&wrong, sizeof(unsigned));
    cudaMemset(wrong, 0, sizeof(unsigned));
    model<<<4, NT>>>(mode, wrong);
    const cudaError_t e = cudaDeviceSynchronize();
    cudaMemcpy(&h, wrong, sizeof h, cudaMemcpyDeviceToHost);
    printf("mode %d: %s, wrong values read %u\n", mode, cudaGetErrorString(e), h);
    return e != cudaSuccess;
}
