/* CUDA chunk forward, the sequence split (DESIGN §8) for long sequences with
 * few heads: how many chunks a segment takes, and the fp32 scan over the
 * segments' maps from pass 1 that gives pass 3 each segment's incoming state;
 * its launcher. */
#include "cuda/chunk_fwd.cuh"
#include "cuda/fold.cuh"

namespace gdn {
namespace cfwd {
namespace {

/* ---- the scan over segments: S_in(s + 1) = P_s S_in(s) + S_loc_s, fp32,
 * block per (sequence, value head, SCW columns of V; fold.cuh's plan) ---- */
template <int SCW> __global__ void __launch_bounds__(gdn::FOLD_NT, gdn::FOLD_PER_SM) seg_scan_kernel(ChunkArgs p) {
    extern __shared__ __align__(16) float smf[];   /* fold_step's copies of P; the S_in slice [K][SCW], then the next one */
    gdn::FoldPipe fp = gdn::make_fold_pipe<SCW>(smf, p.K);
    float *sv = gdn::fold_x<SCW>(smf, p.K), *sn = sv + p.K * SCW;
    const int nsl = (p.V + SCW - 1) / SCW, cs = blockIdx.x % nsl, j = (blockIdx.x / nsl) % p.HV, n = blockIdx.x / (nsl * p.HV);
    int64_t bos, len;
    seq_range(p, n, &bos, &len);
    const int nseg = (int)(((len + CC - 1) / CC + p.sc - 1) / p.sc);
    if (nseg <= 1) return;
    const bool vfirst = (p.flags & GDN_STATE_V_FIRST) != 0;
    const int c = threadIdx.x % SCW, vc = cs * SCW + c;
    for (int i = threadIdx.x / SCW; i < p.K; i += blockDim.x / SCW)
        sv[i * SCW + c] = (p.h0 && vc < p.V)
                              ? p.h0[((int64_t)n * p.HV + j) * p.K * p.V + (vfirst ? (int64_t)vc * p.K + i : (int64_t)i * p.V + vc)] : 0.f;
    __syncthreads();
    for (int s = 0; s + 1 < nseg; s++) {
        const int64_t slot = bos / ((int64_t)CC * p.sc) + n + s;
        const float *P = p.seg_p + (slot * p.HV + j) * p.K * p.K, *L = p.seg_s + (slot * p.HV + j) * p.K * p.V;
        float *out = p.seg_in + ((slot + 1) * p.HV + j) * p.K * p.V;
        gdn::fold_step<SCW, false>(
            fp, P, s + 2 < nseg ? P + (int64_t)p.HV * p.K * p.K : nullptr, p.K, sv,
            [&](int i, int cc) { return cs * SCW + cc < p.V ? L[(int64_t)i * p.V + cs * SCW + cc] : 0.f; },
            [&](int i, int cc, float acc) {
                sn[i * SCW + cc] = acc;
                if (cs * SCW + cc < p.V) out[(int64_t)i * p.V + cs * SCW + cc] = acc;
            });
        for (int i = threadIdx.x / SCW; i < p.K; i += blockDim.x / SCW) sv[i * SCW + c] = sn[i * SCW + c];
        __syncthreads();
    }
}

/* the V columns of a state block, as launch_k (chunk_fwd.cu) picks them */
int bv_of(int K) { return K <= 128 ? 128 : 64; }

}  // namespace

/* chunks per segment, 0 = no split: only when the (sequence, head, column
 * block) blocks would leave most SMs idle, or when asked (exec.seq_split) */
int seg_chunks(const gdn_plan *pl) {
    const gdn_config *c = &pl->c;
    return gdn::split_chunks(pl, pl->N * c->HV * ((c->V + bv_of(c->K) - 1) / bv_of(c->K)), sm_count());
}

/* the same for a forward that keeps its pass-1 maps for the backward
 * (gdn_saved_maps): where the backward splits too, into at most as many
 * segments and no more than ~1/9 fewer, the backward's segments, so that it
 * takes these maps instead of a pass 1 of its own (long1 on an H100: 15
 * segments of 69 chunks against 16 of 64; the forward ~+4 %, the backward
 * -0.5 ms). o then differs from the forward without saved in its last bits. */
int seg_chunks_kept(const gdn_plan *pl) {
    const int f = seg_chunks(pl);
    if (!f) return 0;
    const int b = gdn_cuda_chunk_bwd_split(pl);
    return b >= f && 8 * (int64_t)b <= 9 * (int64_t)f ? b : f;
}

void seg_scan_launch(const ChunkArgs &p, int64_t N, cudaStream_t st) {
    const auto blocks = [&](int w) { return N * p.HV * ((p.V + w - 1) / w); };
    if (gdn::fold_width(blocks) == 8) gdn::fold_launch<8>(seg_scan_kernel<8>, blocks(8), p.K, st, p);
    else gdn::fold_launch<16>(seg_scan_kernel<16>, blocks(16), p.K, st, p);
}

}  // namespace cfwd
}  // namespace gdn
