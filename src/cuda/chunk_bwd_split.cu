/* CUDA chunk backward, the sequence split (DESIGN §8) for long sequences with
 * few heads: each sequence is cut into segments of sc chunks that the
 * backward then treats as sequences of their own (a segmented view: its own
 * cu_seqlens, slots, h0 and dht rows), so both sweeps walk the segments at
 * once. What a segment needs from the others:
 *   h0 row   the state entering it: the forward's pass 1 gives each
 *            segment's map (P, S_loc; chunk_fwd.cu: the forward's own from
 *            saved where their tag says they are these segments', else a
 *            pass 1 here), folded in order from the sequence's h0
 *            (seg_h0_block);
 *   dht row  the state gradient leaving it: a first reverse sweep over the
 *            segments (each from zero, the last from the sequence's dht)
 *            gives each one's dS at its start, carried back through the
 *            segments' P^T (seg_dht_block); the two folds run in one
 *            launch (seg_fold_kernel).
 * This file: the view's tables, those folds, and dh0 back to the sequences;
 * the host side is in chunk_bwd.cu. */
#include "cuda/chunk_bwd.cuh"
#include "cuda/fold.cuh"

namespace gdn {
namespace cbwd {
namespace {

/* sequence n of the caller's view */
__device__ __forceinline__ void orig_range(const SegView &v, int64_t n, int64_t *bos, int64_t *len) {
    *bos = v.cu ? v.cu[n] : n * v.T;
    *len = v.cu ? v.cu[n + 1] - *bos : v.T;
}

/* the tables, by one thread (sequences in order; a few thousand steps) */
__global__ void seg_table_kernel(SegView v) {
    int64_t at = 0;
    for (int64_t n = 0; n < v.N; n++) {
        int64_t bos, len;
        orig_range(v, n, &bos, &len);
        const int64_t L = (int64_t)v.sc * CC, m = len > 0 ? (len + L - 1) / L : 1;
        v.first[n] = at;
        for (int64_t s = 0; s < m; s++, at++) {
            v.scu[at] = bos + s * L;
            v.sseq[at] = n;
        }
    }
    v.first[v.N] = at;
    int64_t end = 0, bos, len;
    if (v.N > 0) { orig_range(v, v.N - 1, &bos, &len); end = bos + len; }
    v.scu[at] = end;
}

/* element (i, c) of state row r ([rows][HV][K][V] in the layout of flags) */
__device__ __forceinline__ int64_t st_at(const SegView &v, int64_t r, int j, int i, int c) {
    return ((r * v.HV + j) * v.K) * (int64_t)v.V + ((v.flags & GDN_STATE_V_FIRST) ? (int64_t)c * v.K + i : (int64_t)i * v.V + c);
}

/* the forward's segment slot of segment s of sequence n (chunk_fwd.cuh state_in) */
__device__ __forceinline__ int64_t fwd_slot(const SegView &v, int64_t n, int64_t s) {
    int64_t bos, len;
    orig_range(v, n, &bos, &len);
    return bos / ((int64_t)CC * v.sc) + n + s;
}

/* the segments' maps P, S_loc: the forward's in saved where their tag says they are these, else seg_p, seg_s */
__device__ __forceinline__ const float *maps_p(const SegView &v) { return v.mtag && *v.mtag == v.mtag_val ? v.saved_p : v.seg_p; }
__device__ __forceinline__ const float *maps_s(const SegView &v) { return v.mtag && *v.mtag == v.mtag_val ? v.saved_s : v.seg_s; }

/* h0 rows of the view: block per (sequence, value head, SW columns), the
 * segments in order: x <- P x + S_loc from the sequence's h0 (or zero) */
template <int SW> __device__ __forceinline__ void seg_h0_block(const SegView &v, const float *h0, float *h0s, int64_t b) {
    extern __shared__ __align__(16) float smf[];   /* fold_step's copies of P; x, then its next value */
    gdn::FoldPipe fp = gdn::make_fold_pipe<SW>(smf, v.K);
    float *sx = gdn::fold_x<SW>(smf, v.K), *xn = sx + v.K * SW;
    const int nsl = (v.V + SW - 1) / SW, cs = (int)(b % nsl), j = (int)((b / nsl) % v.HV);
    const int64_t n = b / (nsl * v.HV);
    const int c = threadIdx.x % SW, vc = cs * SW + c, K = v.K, V = v.V;
    const bool ok = vc < V;
    const int64_t f = v.first[n], m = v.first[n + 1] - f;
    for (int i = threadIdx.x / SW; i < K; i += blockDim.x / SW) sx[i * SW + c] = ok && h0 ? h0[st_at(v, n, j, i, vc)] : 0.f;
    __syncthreads();
    for (int64_t s = 0; s < m; s++) {
        for (int i = threadIdx.x / SW; i < K && ok; i += blockDim.x / SW) h0s[st_at(v, f + s, j, i, vc)] = sx[i * SW + c];
        if (s + 1 == m) break;
        const int64_t slot = fwd_slot(v, n, s);
        const float *P = maps_p(v) + (slot * v.HV + j) * (int64_t)K * K, *S = maps_s(v) + (slot * v.HV + j) * (int64_t)K * V;
        const float *Pn = s + 2 < m ? maps_p(v) + (fwd_slot(v, n, s + 1) * v.HV + j) * (int64_t)K * K : nullptr;
        gdn::fold_step<SW, false>(
            fp, P, Pn, K, sx, [&](int i, int cc) { return cs * SW + cc < V ? S[(int64_t)i * V + cs * SW + cc] : 0.f; },
            [&](int i, int cc, float acc) { xn[i * SW + cc] = acc; });
        for (int i = threadIdx.x / SW; i < K; i += blockDim.x / SW) sx[i * SW + c] = xn[i * SW + c];
        __syncthreads();
    }
}

/* dht rows of the view before the first reverse sweep: the sequence's dht
 * for its last segment, zero for the others */
__global__ void seg_dht_init_kernel(SegView v, const float *dht, float *dhts) {
    const int64_t per = (int64_t)v.HV * v.K * v.V, n_all = v.first[v.N] * per;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n_all; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = e / per, n = v.sseq[r];
        dhts[e] = (dht && r + 1 == v.first[n + 1]) ? dht[n * per + e % per] : 0.f;
    }
}

/* dht rows after it: block per (sequence, value head, SW columns), from the
 * last segment back: D(last) = dht (kept), D(s) = dS at the start of
 * segment s + 1 = P_{s+1}^T D(s+1) + dS_loc(s+1), where dS_loc is the first
 * sweep's (from zero, the last segment's from dht: D(last-1) = dS_loc(last)).
 * E (context parallel's dS_out, or NULL): a gradient after the end of the
 * last sequence beyond its dht, added to D(last) and carried back with it.
 * d0 (or NULL): sequence 0's dS at its start, P_0^T D(0) + dS_loc(0). */
template <int SW> __device__ __forceinline__ void seg_dht_block(const SegView &v, const float *dsl, float *dhts, const float *E, float *d0, int64_t b) {
    extern __shared__ __align__(16) float smf[];   /* fold_step's copies of P; x, then its next value */
    gdn::FoldPipe fp = gdn::make_fold_pipe<SW>(smf, v.K);
    float *sx = gdn::fold_x<SW>(smf, v.K), *xn = sx + v.K * SW;
    const int nsl = (v.V + SW - 1) / SW, cs = (int)(b % nsl), j = (int)((b / nsl) % v.HV);
    const int64_t n = b / (nsl * v.HV);
    const int c = threadIdx.x % SW, vc = cs * SW + c, K = v.K, V = v.V;
    const bool ok = vc < V, e_on = E && n == v.N - 1, d_on = d0 && n == 0;
    const int64_t f = v.first[n], m = v.first[n + 1] - f;
    if (m < 2 && !e_on && !d_on) return;
    /* x <- P_s^T x + add (add: dS_loc of segment s, or nothing) */
    auto back = [&](int64_t s, bool add) {
        const float *P = maps_p(v) + (fwd_slot(v, n, s) * v.HV + j) * (int64_t)K * K,
                    *Pn = s > 0 ? maps_p(v) + (fwd_slot(v, n, s - 1) * v.HV + j) * (int64_t)K * K : nullptr;
        gdn::fold_step<SW, true>(
            fp, P, Pn, K, sx, [&](int i, int cc) { return cs * SW + cc < V && add ? dsl[st_at(v, f + s, j, i, cs * SW + cc)] : 0.f; },
            [&](int i, int cc, float acc) { xn[i * SW + cc] = acc; });
        for (int i = threadIdx.x / SW; i < K; i += blockDim.x / SW) sx[i * SW + c] = xn[i * SW + c];
        __syncthreads();
    };
    /* x = D(last) beyond dht: E, or zero */
    for (int i = threadIdx.x / SW; i < K; i += blockDim.x / SW) {
        const float e = e_on && ok ? E[st_at(v, 0, j, i, vc)] : 0.f;
        sx[i * SW + c] = e;
        if (e_on && ok) dhts[st_at(v, f + m - 1, j, i, vc)] += e;
    }
    __syncthreads();
    /* x = P^T (extra) + dS_loc from the last segment back: D(s) for s = m-2 .. 0, then sequence 0's start */
    for (int64_t s = m - 1; s >= 0; s--) {
        if (e_on) back(s, true);
        else {   /* no extra gradient: x is just dS_loc(s) carried (P^T x is zero at the last one) */
            if (s == m - 1) {
                for (int i = threadIdx.x / SW; i < K; i += blockDim.x / SW) sx[i * SW + c] = ok ? dsl[st_at(v, f + s, j, i, vc)] : 0.f;
                __syncthreads();
            } else {
                back(s, true);
            }
        }
        if (s > 0) {
            for (int i = threadIdx.x / SW; i < K && ok; i += blockDim.x / SW) dhts[st_at(v, f + s - 1, j, i, vc)] = sx[i * SW + c];
        } else if (d_on) {
            for (int i = threadIdx.x / SW; i < K && ok; i += blockDim.x / SW) d0[st_at(v, 0, j, i, vc)] = sx[i * SW + c];
        }
    }
}

/* both folds in one launch (they are independent): blocks [0, nh0) fold
 * the h0 rows, the rest the dht rows (nh0 = 0: the dht rows alone) */
template <int SW>
__global__ void __launch_bounds__(gdn::FOLD_NT, gdn::FOLD_PER_SM)
    seg_fold_kernel(SegView v, const float *h0, float *h0s, int64_t nh0, const float *dsl, float *dhts, const float *E, float *d0) {
    if (blockIdx.x < nh0) seg_h0_block<SW>(v, h0, h0s, blockIdx.x);
    else seg_dht_block<SW>(v, dsl, dhts, E, d0, blockIdx.x - nh0);
}

/* dh0 of sequence n: the view's dh0 row of its first segment */
__global__ void seg_dh0_kernel(SegView v, const float *dh0s, float *dh0) {
    const int64_t per = (int64_t)v.HV * v.K * v.V, n_all = v.N * per;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n_all; e += (int64_t)gridDim.x * blockDim.x)
        dh0[e] = dh0s[v.first[e / per] * per + e % per];
}

unsigned grid_of(int64_t n) { return (unsigned)((n + 255) / 256 < 8192 ? (n + 255) / 256 : 8192); }

}  // namespace

void seg_table_launch(const SegView &v, cudaStream_t st) { seg_table_kernel<<<1, 1, 0, st>>>(v); }

void seg_dht_init_launch(const SegView &v, const float *dht, float *dhts, cudaStream_t st) {
    seg_dht_init_kernel<<<grid_of(v.Ns * v.HV * (int64_t)v.K * v.V), 256, 0, st>>>(v, dht, dhts);
}

void seg_fold_launch(const SegView &v, bool with_h0, const float *h0, float *h0s, const float *dsl, float *dhts, const float *E,
                     float *d0, cudaStream_t st) {
    /* blocks: the h0 fold's (or none), then the dht fold's */
    const auto nb = [&](int w) { return v.N * v.HV * ((v.V + w - 1) / w); };
    const auto all = [&](int w) { return (with_h0 ? 2 : 1) * nb(w); };
    if (gdn::fold_width(all) == 8)
        gdn::fold_launch<8>(seg_fold_kernel<8>, all(8), v.K, st, v, h0, h0s, with_h0 ? nb(8) : (int64_t)0, dsl, dhts, E, d0);
    else gdn::fold_launch<16>(seg_fold_kernel<16>, all(16), v.K, st, v, h0, h0s, with_h0 ? nb(16) : (int64_t)0, dsl, dhts, E, d0);
}

void seg_dh0_launch(const SegView &v, const float *dh0s, float *dh0, cudaStream_t st) {
    seg_dh0_kernel<<<grid_of(v.N * v.HV * (int64_t)v.K * v.V), 256, 0, st>>>(v, dh0s, dh0);
}

}  // namespace cbwd
}  // namespace gdn
