/* Column sums over many rows for the layer backwards (conv1d dweight/dbias,
 * RMSNorm dw, gate dA_log/ddt_bias), deterministic, with no atomics and no
 * global scratch (their calls take no workspace): the rows are cut among the
 * CL blocks of one thread-block cluster, and the blocks' partials meet in
 * distributed shared memory. The order of every addition is fixed by the
 * shape alone, so the bits repeat from run to run. */
#pragma once
#include <cooperative_groups.h>

namespace gdn {

/* blocks of a cluster (portable size: no attribute call at launch). The
 * kernels put the cluster along gridDim.y, so rank = blockIdx.y. */
enum { CLUSTER = 8 };

/* A block's threads hold K partial sums each for column c = threadIdx.x %
 * ncol (row lane threadIdx.x / ncol; blockDim.x a multiple of ncol). They are
 * added in double: over the block's row lanes in lane order, then over the
 * cluster's blocks in rank order, and out(c, k, sum) is called once for every
 * column c < ncol and k < K, by the rank-0 block. Every thread of every block
 * of the cluster must call it (it holds two cluster barriers). red: shared,
 * blockDim.x * K of T; tot: shared, ncol * K doubles, not aliasing red. */
template <int K, typename T, typename Out>
__device__ __forceinline__ void cluster_col_sums(const T (&acc)[K], int ncol, T *red, double *tot, Out out) {
    namespace cg = cooperative_groups;
    const int tid = threadIdx.x, nt = blockDim.x, lanes = nt / ncol;
#pragma unroll
    for (int k = 0; k < K; k++) red[k * nt + tid] = acc[k];
    __syncthreads();
    for (int v = tid; v < ncol * K; v += nt) {   /* v = k * ncol + c */
        const int k = v / ncol, c = v % ncol;
        double s = 0.0;
        for (int l = 0; l < lanes; l++) s += (double)red[k * nt + l * ncol + c];
        tot[v] = s;
    }
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();   /* every block's tot written, and visible to the cluster (release / acquire) */
    if (cluster.block_rank() == 0) {
        const int nb = (int)cluster.num_blocks();
        for (int v = tid; v < ncol * K; v += nt) {
            double s = 0.0;
            for (int r = 0; r < nb; r++) s += cluster.map_shared_rank(tot, r)[v];
            out(v % ncol, v / ncol, s);
        }
    }
    cluster.sync();   /* no block leaves (its shared memory) while rank 0 still reads it */
}

}  // namespace gdn
