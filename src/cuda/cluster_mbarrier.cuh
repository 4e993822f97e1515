/* A barrier of a thread-block cluster as an mbarrier in each block, for
 * code that waits only for the other blocks' reads (write-after-read): each
 * warp's first lane, after __syncwarp, arrives on every block's barrier (the
 * own one with release at CTA scope, the remote ones relaxed through mapa);
 * the wait is a relaxed try_wait on the own barrier, then a restricted
 * acquire fence, so no CCTL.IVALL (barrier.cluster.wait always acquires and
 * invalidates the L1). The barrier's count is 32-thread warps x blocks a
 * phase; its init must be published to the cluster before any remote
 * arrival. Used by the fused backward's -DGDN_FUSED_WAR_MBARRIER
 * (chunk_bwd_fused.cu) and by bench/racecheck_war_model.cu, which checks
 * racecheck against these exact functions. Clusters of at most 4 blocks. */
#pragma once
#include <cstdint>

namespace gdn {

__device__ __forceinline__ void mbar_cluster_arrive(uint32_t a) {
    uint32_t lane;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
    __syncwarp();
    if (lane == 0) {
        uint32_t nb, me;
        asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(nb));
        asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(me));
#pragma unroll
        for (uint32_t b = 0; b < 4; b++)
            if (b < nb) {
                if (b == me) {
                    asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(a) : "memory");
                } else {
                    uint32_t r;
                    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
                    asm volatile("mbarrier.arrive.relaxed.cluster.shared::cluster.b64 _, [%0];" ::"r"(r) : "memory");
                }
            }
    }
}
__device__ __forceinline__ void mbar_cluster_wait(uint32_t a, uint32_t par) {
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.relaxed.cluster.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done)
                     : "r"(a), "r"(par)
                     : "memory");
    } while (!done);
    asm volatile("fence.acquire.sync_restrict::shared::cluster.cluster;" ::: "memory");
}

}  // namespace gdn
