/* A model of the fused backward's per-chunk cluster synchronisation, small
 * enough to read racecheck's report line by line: does racecheck take a
 * remote mbarrier arrival (another block's barrier, reached through mapa) as
 * the synchronisation that orders a read of distributed shared memory before
 * the owner's next write? (bench/NOTES.md, stop 49: the WAR barrier as an
 * mbarrier, -DGDN_FUSED_WAR_MBARRIER, made racecheck report ~100x the
 * hazards of the cluster-barrier build.)
 *
 * Clusters of G blocks, 256 threads. Each step: every block writes its own A
 * (a value of the step), the publishing cluster barrier (restricted release
 * arrive, acquire wait: the fused pass's GDN_CLUSTER_PUBLISH), every thread
 * reads the other ranks' A and checks the value, then the WAR barrier that
 * lets the owners write again:
 *   mode 0: barrier.cluster arrive.relaxed + wait (the library's default)
 *   mode 1: an mbarrier in each block, 8 G arrivals a phase, by the
 *           functions -DGDN_FUSED_WAR_MBARRIER uses
 *           (src/cuda/cluster_mbarrier.cuh)
 *   mode 2: mode 1 without the barrier's wait (a real race: racecheck must
 *           report it, or the model cannot tell anything)
 * Prints the number of wrong values read (0 unless mode 2 races).
 *
 * Build and run on a GPU machine (sm_90a):
 *   nvcc -O2 -gencode=arch=compute_90a,code=sm_90a -Isrc -o /tmp/rcm bench/racecheck_war_model.cu
 *   for m in 0 1 2; do compute-sanitizer --tool racecheck --racecheck-report hazard /tmp/rcm $m | tail -2; done
 * Reading: mode 0 and 1 clean, mode 2 reported: racecheck models the
 * mbarrier, and the fused pass's flood is a real question. Mode 1 reported
 * like mode 2: the tool does not see remote arrivals, and the flood says
 * nothing about the kernel. */
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include "cuda/cluster_mbarrier.cuh"   /* the option's own arrive and wait */

constexpr int NT = 256, N = 2048, STEPS = 16;

__device__ __forceinline__ uint32_t saddr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void publish_bar() {
    asm volatile("fence.release.sync_restrict::shared::cta.cluster;\nbarrier.cluster.arrive.relaxed.aligned;\n"
                 "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

__global__ void __cluster_dims__(2, 1, 1) model(int mode, unsigned *wrong) {
    __shared__ float A[N];
    __shared__ __align__(8) uint64_t mb;
    uint32_t nb, me;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(nb));
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(me));
    if (threadIdx.x == 0)
        asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\nfence.mbarrier_init.release.cluster;" ::"r"(saddr(&mb)), "r"((NT / 32) * nb) : "memory");
    unsigned bad = 0;
    for (int s = 0; s < STEPS; s++) {
        for (int i = threadIdx.x; i < N; i += NT) A[i] = (float)(s * 4 + me + i);
        publish_bar();   /* also publishes the mbarrier's init before any remote arrival */
        float acc = 0.f;
        for (uint32_t b = 0; b < nb; b++) {
            if (b == me) continue;
            uint32_t r;
            asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(saddr(A)), "r"(b));
            for (int i = threadIdx.x; i < N; i += NT) {
                float v;
                asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(r + 4u * i) : "memory");
                if (v != (float)(s * 4 + b + i)) bad++;
                acc += v;
            }
        }
        if (acc == -1.f) bad += 1000;   /* keeps the reads */
        if (mode == 0) {
            asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;" ::: "memory");
        } else {
            gdn::mbar_cluster_arrive(saddr(&mb));
            if (mode == 1) gdn::mbar_cluster_wait(saddr(&mb), (uint32_t)(s & 1));
        }
    }
    /* no block exits while another may still read its A or arrive on its barrier */
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;" ::: "memory");
    if (bad) atomicAdd(wrong, bad);
}

int main(int argc, char **argv) {
    const int mode = argc > 1 ? atoi(argv[1]) : 1;
    unsigned *wrong, h = 0;
    cudaMalloc(&wrong, sizeof(unsigned));
    cudaMemset(wrong, 0, sizeof(unsigned));
    model<<<4, NT>>>(mode, wrong);
    const cudaError_t e = cudaDeviceSynchronize();
    cudaMemcpy(&h, wrong, sizeof h, cudaMemcpyDeviceToHost);
    printf("mode %d: %s, wrong values read %u\n", mode, cudaGetErrorString(e), h);
    return e != cudaSuccess;
}
