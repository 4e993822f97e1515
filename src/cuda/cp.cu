/* Context parallel on the CUDA backend (include/gdn.h has the contract,
 * DESIGN.md §8 the math, src/cpu/cp.c the same steps on the CPU). A rank's
 * maps come from the kernels of the regular calls run on the one local
 * sequence that crosses its edge, as a span of its own (N = 1, no
 * cu_seqlens, pointers at its first row):
 *   forward:  bf16 / f16: the chunk forward's pass 1 (chunk_fwd.cu) cuts the
 *             span into segments and gives each one's map (P, S_loc) from
 *             a zero state; compose_kernel folds them in order per value
 *             head, from the span's h0 row (the chain restarts) or from I
 *             (P wanted). f32: the recurrent kernel in map mode (K + V
 *             columns, token by token, fp32 as its forward).
 *   backward: sequence 0's span cut into the same segments (bf16 / f16;
 *             one segment for f32), all of them through the chunk
 *             backward's prep and reverse sweep at once (chunk_bwd.cu: the
 *             segments as sequences, dht row 0 entering the last one, no
 *             dstates kept): each segment's dS_loc; rcompose_kernel carries
 *             them back through the segments' P^T (pass 1 of the forward)
 *             to the span's start: the map's S. P, where it passes through,
 *             is the forward map's or the segments' composed.
 * The scans fold the gathered maps per (value head, 16 columns) in fp32.
 * Nothing is allocated, nothing waits for the host: capture-safe. */
#include <cstring>
#include <cuda_runtime.h>
#include "cuda/common.cuh"
#include "cuda/fold.cuh"
#include "cuda/cuda_backend.h"

namespace {

constexpr int CW = 16;             /* state columns per block in the folds */
constexpr int NTH = gdn::FOLD_NT;  /* threads of the fold blocks */
constexpr int CCH = 64;   /* chunk length of the chunk kernels */

size_t map_floats(const gdn_plan *p) { return (size_t)p->c.K * p->c.K + (size_t)p->c.K * p->c.V; }
size_t al(size_t x) { return (x + 255) / 256 * 256; }

/* element (i, v) of a k-first view of a [K, V] state in the plan's layout */
__device__ __forceinline__ int64_t at_state(bool vfirst, int K, int V, int i, int v) {
    return vfirst ? (int64_t)v * K + i : (int64_t)i * V + v;
}

/* ---- forward map: the segments' maps folded in order. Block per (value
 * head, 16 of the K + V columns of [P | S]); column c < K is P's (from e_c,
 * no additive term), the rest S's (from the h0 row, or 0 where P is wanted). */
__global__ void __launch_bounds__(NTH) compose_kernel(const float *seg_p, const float *seg_s, int nseg, int HV, int K, int V,
                                                      const float *h0row, unsigned flags, int need_P, float *map) {
    extern __shared__ __align__(16) float smf[];   /* fold_step's copies of P; x [K][CW], then the next one */
    gdn::FoldPipe fp = gdn::make_fold_pipe<CW>(smf, K);
    float *sx = gdn::fold_x<CW>(smf, K), *xn = sx + K * CW;
    const int nsl = (K + V + CW - 1) / CW, cs = blockIdx.x % nsl, j = blockIdx.x / nsl;
    const int c = threadIdx.x % CW, col = cs * CW + c, vc = col - K;
    const bool pc = col < K, valid = col < K + V, vfirst = (flags & GDN_STATE_V_FIRST) != 0;
    for (int i = threadIdx.x / CW; i < K; i += NTH / CW)
        sx[i * CW + c] = pc ? (need_P && i == col ? 1.f : 0.f)
                       : (valid && !need_P && h0row) ? h0row[(int64_t)j * K * V + at_state(vfirst, K, V, i, vc)] : 0.f;
    __syncthreads();
    for (int s = 0; s < nseg; s++) {
        const float *P = seg_p + ((int64_t)s * HV + j) * K * K, *S = seg_s + ((int64_t)s * HV + j) * K * V;
        const float *Pn = s + 1 < nseg ? P + (int64_t)HV * K * K : nullptr;
        gdn::fold_step<CW, false>(
            fp, P, Pn, K, sx,
            [&](int i, int cc) {
                const int cl = cs * CW + cc;   /* column cc's: P's below K, S's from K */
                return cl >= K && cl < K + V ? S[(int64_t)i * V + cl - K] : 0.f;
            },
            [&](int i, int cc, float acc) { xn[i * CW + cc] = acc; });
        for (int i = threadIdx.x / CW; i < K; i += NTH / CW) sx[i * CW + c] = xn[i * CW + c];
        __syncthreads();
    }
    float *m = map + (int64_t)j * ((int64_t)K * K + (int64_t)K * V);
    for (int i = threadIdx.x / CW; i < K && valid; i += NTH / CW) {
        if (pc) m[(int64_t)i * K + col] = need_P ? sx[i * CW + c] : 0.f;
        else m[(int64_t)K * K + (int64_t)i * V + vc] = sx[i * CW + c];
    }
}

/* ---- the scans: block per (value head, 16 columns of V), from zero:
 *   forward   x <- P_i x + S_i    for ranks i = 0 .. rank-1
 *   backward  x <- P_i^T x + S_i  for ranks i = world-1 .. rank+1
 * written in the state layout. */
__global__ void __launch_bounds__(NTH) scan_kernel(const float *maps, int rank, int world, int backward, int HV, int K, int V,
                                                   unsigned flags, float *out) {
    extern __shared__ __align__(16) float smf[];   /* fold_step's copies of P; x, then its next value */
    gdn::FoldPipe fp = gdn::make_fold_pipe<CW>(smf, K);
    float *sx = gdn::fold_x<CW>(smf, K), *xn = sx + K * CW;
    const int nsl = (V + CW - 1) / CW, cs = blockIdx.x % nsl, j = blockIdx.x / nsl;
    const int c = threadIdx.x % CW, vc = cs * CW + c;
    const bool valid = vc < V;
    const int64_t mf = (int64_t)K * K + (int64_t)K * V;
    for (int i = threadIdx.x / CW; i < K; i += NTH / CW) sx[i * CW + c] = 0.f;
    __syncthreads();
    const int first = backward ? world - 1 : 0, last = backward ? rank + 1 : rank - 1, step = backward ? -1 : 1;
    for (int r = first; backward ? r >= last : r <= last; r += step) {
        const float *P = maps + ((int64_t)r * HV + j) * mf, *S = P + (int64_t)K * K;
        const auto add = [&](int i, int cc) { return cs * CW + cc < V ? S[(int64_t)i * V + cs * CW + cc] : 0.f; };
        const auto put = [&](int i, int cc, float acc) { xn[i * CW + cc] = acc; };
        const float *Pn = r != last ? P + (int64_t)step * HV * mf : nullptr;
        if (backward) gdn::fold_step<CW, true>(fp, P, Pn, K, sx, add, put);
        else gdn::fold_step<CW, false>(fp, P, Pn, K, sx, add, put);
        for (int i = threadIdx.x / CW; i < K; i += NTH / CW) sx[i * CW + c] = xn[i * CW + c];
        __syncthreads();
    }
    const bool vfirst = (flags & GDN_STATE_V_FIRST) != 0;
    for (int i = threadIdx.x / CW; i < K && valid; i += NTH / CW)
        out[(int64_t)j * K * V + at_state(vfirst, K, V, i, vc)] = sx[i * CW + c];
}

/* ---- backward map: [P | dS] per value head from dS (state layout) and P
 * (a forward map's, or none: zero) ---- */
__global__ void bmap_pack_kernel(const float *dS, const float *fmap, int HV, int K, int V, unsigned flags, float *bmap) {
    const int64_t mf = (int64_t)K * K + (int64_t)K * V, n = mf * HV;
    const bool vfirst = (flags & GDN_STATE_V_FIRST) != 0;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int j = (int)(e / mf);
        const int64_t r = e % mf;
        if (r < (int64_t)K * K) {
            bmap[e] = fmap ? fmap[e] : 0.f;
        } else {
            const int i = (int)((r - (int64_t)K * K) / V), v = (int)((r - (int64_t)K * K) % V);
            bmap[e] = dS[(int64_t)j * K * V + at_state(vfirst, K, V, i, v)];
        }
    }
}

/* ---- the q / k rstd of rows [0, rows), 1/sqrt(|x|^2 + 1e-6) as the
 * forward: a warp per (row, head) ---- */
__global__ void rstd_kernel(const void *q, const void *k, int64_t rows, int H, int K, int dt, float *rq, float *rk) {
    const int lane = threadIdx.x & 31;
    const int64_t w = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
    if (w >= rows * H) return;
    float sq = 0.f, sk = 0.f;
    for (int i = lane; i < K; i += 32) {
        const float a = gdn::ld(q, w * K + i, dt), b = gdn::ld(k, w * K + i, dt);
        sq += a * a;
        sk += b * b;
    }
    sq = gdn::warp_sum(sq);
    sk = gdn::warp_sum(sk);
    if (lane == 0) { rq[w] = rsqrtf(sq + 1e-6f); rk[w] = rsqrtf(sk + 1e-6f); }
}

/* the plan of one local sequence as a call of its own */
gdn_plan span_plan(const gdn_plan *p, int64_t len) {
    gdn_plan s = *p;
    s.c.B = 1; s.c.T = len; s.c.cu_seqlens = nullptr; s.c.cu_seqlens_dev = nullptr; s.c.num_seqs = 0;
    s.N = 1; s.max_len = len;
    return s;
}

/* chunks per segment of the forward map's span: about two waves of the
 * pass-1 blocks over the card (as many segments as fill it twice) */
int span_sc(const gdn_plan *s) {
    const int K = s->c.K, V = s->c.V, bv = K <= 128 ? 128 : 64;
    const int64_t maxch = (s->max_len + CCH - 1) / CCH, blocks = (int64_t)s->c.HV * ((V + bv - 1) / bv + (K + bv - 1) / bv);
    int64_t want = 2 * gdn::sm_count() / (blocks > 0 ? blocks : 1);
    if (want < 1) want = 1;
    int64_t sc = (maxch + want - 1) / want;
    return sc < 1 ? 1 : (int)sc;
}

/* the forward map's work: 0 = nothing (a zero map), else the last local sequence */
bool fwd_edge(const gdn_plan *p, const gdn_cp_config *cp, int64_t *bos, int64_t *len) {
    if (!cp->last_continues) return false;
    gdn_seq(p, p->N - 1, bos, len);
    return true;
}

size_t fwd_ws(const gdn_plan *p, const gdn_cp_config *cp) {
    int64_t bos, len;
    if (!fwd_edge(p, cp, &bos, &len) || p->c.dtype == GDN_F32) return 0;
    const gdn_plan s = span_plan(p, len);
    return gdn_cuda_chunk_seg_maps_ws(&s, span_sc(&s));
}

gdn_status fwd_map(const gdn_plan *p, const gdn_cp_config *cp, const gdn_fwd_args *a, float *map, void *stream) {
    const gdn_config *c = &p->c;
    const int K = c->K, V = c->V, HV = c->HV;
    cudaStream_t st = (cudaStream_t)stream;
    int64_t bos, len;
    if (!fwd_edge(p, cp, &bos, &len)) {   /* nothing goes on to the next rank */
        const cudaError_t e = cudaMemsetAsync(map, 0, map_floats(p) * HV * sizeof(float), st);
        return e == cudaSuccess ? GDN_OK : gdn_fail(GDN_ERR_BACKEND, "gdn_cp_fwd_map: %s", cudaGetErrorString(e));
    }
    /* P only where the sequence also came from the previous rank; else the
     * chain restarts here, from the sequence's own h0 row */
    const int need_P = p->N == 1 && cp->first_continues;
    const size_t es = gdn_dtype_size(c->dtype), gs = gdn_dtype_size(c->gate_dtype);
    gdn_fwd_args b = *a;
    b.q = a->q ? (const char *)a->q + bos * c->H * K * es : nullptr;
    b.k = a->k ? (const char *)a->k + bos * c->H * K * es : nullptr;
    b.v = a->v ? (const char *)a->v + bos * HV * V * es : nullptr;
    b.g = a->g ? (const char *)a->g + bos * HV * gs : nullptr;
    b.beta = a->beta ? (const char *)a->beta + bos * HV * gs : nullptr;
    b.h0 = (!need_P && a->h0) ? a->h0 + (size_t)(p->N - 1) * HV * K * V : nullptr;
    const gdn_plan s = span_plan(p, len);
    if (c->dtype == GDN_F32) return gdn_cuda_recurrent_map(&s, &b, need_P, map, stream);
    const int sc = span_sc(&s);
    float *seg_p, *seg_s;
    gdn_status r = gdn_cuda_chunk_seg_maps(&s, &b, sc, a->workspace, &seg_p, &seg_s, nullptr, 0, stream);
    if (r) return r;
    const int nseg = len > 0 ? (int)(((len + CCH - 1) / CCH + sc - 1) / sc) : 0;
    const int nsl = (K + V + CW - 1) / CW;
    gdn::fold_launch<CW>(compose_kernel, HV * nsl, K, st, seg_p, seg_s, nseg, HV, K, V, b.h0, c->flags, need_P, map);
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? GDN_OK : gdn_fail(GDN_ERR_BACKEND, "gdn_cp_fwd_map: %s", cudaGetErrorString(e));
}

/* ---- backward map, bf16 / f16: sequence 0's span cut into the forward
 * map's segments, each segment's dS_loc (its reverse sweep from zero, the
 * last one's from dht row 0) at once; then per (value head, 16 columns) from
 * the last segment back, x <- P_s^T x + dS_loc_s ---- */
__global__ void __launch_bounds__(NTH) rcompose_kernel(const float *seg_p, const float *dsl, int nseg, int HV, int K, int V,
                                                       unsigned flags, float *dS) {
    extern __shared__ __align__(16) float smf[];   /* fold_step's copies of P; x, then its next value */
    gdn::FoldPipe fp = gdn::make_fold_pipe<CW>(smf, K);
    float *sx = gdn::fold_x<CW>(smf, K), *xn = sx + K * CW;
    const int nsl = (V + CW - 1) / CW, cs = blockIdx.x % nsl, j = blockIdx.x / nsl;
    const int c = threadIdx.x % CW, vc = cs * CW + c;
    const bool valid = vc < V, vfirst = (flags & GDN_STATE_V_FIRST) != 0;
    const int64_t st = (int64_t)HV * K * V;   /* one segment's [HV] states */
    for (int i = threadIdx.x / CW; i < K; i += NTH / CW)
        sx[i * CW + c] = valid ? dsl[(nseg - 1) * st + (int64_t)j * K * V + at_state(vfirst, K, V, i, vc)] : 0.f;
    __syncthreads();
    for (int s = nseg - 2; s >= 0; s--) {
        const float *P = seg_p + ((int64_t)s * HV + j) * K * K;
        gdn::fold_step<CW, true>(
            fp, P, s > 0 ? P - (int64_t)HV * K * K : nullptr, K, sx,
            [&](int i, int cc) {
                const int vcc = cs * CW + cc;
                return vcc < V ? dsl[s * st + (int64_t)j * K * V + at_state(vfirst, K, V, i, vcc)] : 0.f;
            },
            [&](int i, int cc, float acc) { xn[i * CW + cc] = acc; });
        for (int i = threadIdx.x / CW; i < K; i += NTH / CW) sx[i * CW + c] = xn[i * CW + c];
        __syncthreads();
    }
    for (int i = threadIdx.x / CW; i < K && valid; i += NTH / CW)
        dS[(int64_t)j * K * V + at_state(vfirst, K, V, i, vc)] = sx[i * CW + c];
}

/* the segments' cu_seqlens: segment i is tokens [i L, min((i + 1) L, len)) */
__global__ void seg_cu_kernel(int64_t *cu, int nseg, int64_t L, int64_t len) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= nseg) cu[i] = (int64_t)i * L < len ? (int64_t)i * L : len;
}

/* the backward map's plan: nseg segments of sc chunks (1 segment: f32, or a
 * short span) and the workspace, in order: [the sweep's slot table and
 * records][segment cu_seqlens][dht per segment][dS_loc per segment][dS]
 * [the segments' forward maps (pass 1)][rstd q, k where saved is absent]
 * [P's forward map where it passes through] */
struct BwdWs { int sc, nseg, segmaps; size_t cu, dht, dsl, ds, seg, rstd, fmap, total; };
BwdWs bwd_ws_layout(const gdn_plan *p, const gdn_cp_config *cp) {
    BwdWs l;
    memset(&l, 0, sizeof l);
    if (!cp->first_continues) return l;
    int64_t bos, len;
    gdn_seq(p, 0, &bos, &len);
    const gdn_plan s = span_plan(p, len);
    const int through = p->N == 1 && cp->last_continues;
    const int64_t maxch = (len + CCH - 1) / CCH;
    l.sc = p->c.dtype == GDN_F32 || maxch == 0 ? 0 : span_sc(&s);
    l.nseg = l.sc ? (int)((maxch + l.sc - 1) / l.sc) : 1;
    l.segmaps = l.sc && (l.nseg > 1 || through);   /* the forward's pass 1 over the segments */
    gdn_plan sub = s;
    sub.N = l.nseg;
    const size_t st = (size_t)p->c.HV * p->c.K * p->c.V * sizeof(float);
    size_t o = al(gdn_cuda_chunk_dstate_ws(&sub));
    l.cu = o; o += al((size_t)(l.nseg + 1) * sizeof(int64_t));
    l.dht = o; o += al(l.nseg * st);
    l.dsl = o; o += al(l.nseg * st);
    l.ds = o; o += al(st);
    l.seg = o; o += al(l.segmaps ? gdn_cuda_chunk_seg_maps_ws(&s, l.sc) : 0);
    l.rstd = o; o += al(2 * (size_t)len * p->c.H * sizeof(float));
    l.fmap = o; o += al(through ? map_floats(p) * p->c.HV * sizeof(float) : 0);
    l.total = o;
    return l;
}

gdn_status bwd_map(const gdn_plan *p, const gdn_cp_config *cp, const gdn_bwd_args *a, const float *fmap, float *bmap,
                   void *stream) {
    const gdn_config *c = &p->c;
    const int K = c->K, V = c->V, HV = c->HV;
    cudaStream_t st = (cudaStream_t)stream;
    cudaError_t e = cudaSuccess;
    if (!cp->first_continues) {   /* nothing goes back to the previous rank */
        e = cudaMemsetAsync(bmap, 0, map_floats(p) * HV * sizeof(float), st);
        return e == cudaSuccess ? GDN_OK : gdn_fail(GDN_ERR_BACKEND, "gdn_cp_bwd_map: %s", cudaGetErrorString(e));
    }
    int64_t bos, len;
    gdn_seq(p, 0, &bos, &len);   /* bos = 0 */
    const BwdWs l = bwd_ws_layout(p, cp);
    char *w = static_cast<char *>(a->workspace);
    const gdn_plan s = span_plan(p, len);
    const int through = p->N == 1 && cp->last_continues;
    const size_t sst = (size_t)HV * K * V;
    float *dht = reinterpret_cast<float *>(w + l.dht), *dsl = reinterpret_cast<float *>(w + l.dsl);
    float *dS = reinterpret_cast<float *>(w + l.ds), *pmap = reinterpret_cast<float *>(w + l.fmap);
    int64_t *cu = reinterpret_cast<int64_t *>(w + l.cu);
    gdn_status r;
    /* the segments' forward maps: their P carry dS back, and compose to the span's P */
    float *seg_p = nullptr, *seg_s = nullptr;
    if (l.segmaps) {
        gdn_fwd_args f;
        memset(&f, 0, sizeof f);
        f.q = a->q; f.k = a->k; f.v = a->v; f.g = a->g; f.beta = a->beta; f.A_log = a->A_log; f.dt_bias = a->dt_bias;
        if ((r = gdn_cuda_chunk_seg_maps(&s, &f, l.sc, w + l.seg, &seg_p, &seg_s, nullptr, 0, stream))) return r;
    }
    /* P of the span where it passes through: the forward map's, else composed (f32: the recurrent map) */
    const float *P = through ? fmap : nullptr;
    if (through && !fmap) {
        if (l.segmaps) {
            gdn::fold_launch<CW>(compose_kernel, HV * ((K + V + CW - 1) / CW), K, st, seg_p, seg_s, l.nseg, HV, K, V, nullptr,
                                 c->flags, 1, pmap);
        } else {
            gdn_fwd_args f;
            memset(&f, 0, sizeof f);
            f.q = a->q; f.k = a->k; f.v = a->v; f.g = a->g; f.beta = a->beta; f.A_log = a->A_log; f.dt_bias = a->dt_bias;
            if (c->dtype == GDN_F32) {
                if ((r = gdn_cuda_recurrent_map(&s, &f, 1, pmap, stream))) return r;
            } else {   /* an empty span: P = I */
                gdn::fold_launch<CW>(compose_kernel, HV * ((K + V + CW - 1) / CW), K, st, nullptr, nullptr, 0, HV, K, V, nullptr,
                                     c->flags, 1, pmap);
            }
        }
        P = pmap;
    }
    /* the rstd where saved is absent */
    const gdn_saved_layout sv = gdn_saved_at(c, const_cast<void *>(a->saved));
    float *rq = sv.rstd_q, *rk = sv.rstd_k;
    if ((c->flags & GDN_QK_L2NORM) && !a->saved && len > 0) {
        rq = reinterpret_cast<float *>(w + l.rstd);
        rk = rq + len * c->H;
        const int64_t warps = len * c->H;
        rstd_kernel<<<(unsigned)((warps * 32 + 255) / 256), 256, 0, st>>>(a->q, a->k, len, c->H, K, (int)c->dtype, rq, rk);
    }
    /* the reverse sweep over the segments at once: dht of the last one is the caller's row 0, the others' zero */
    const int nseg = l.nseg;
    const int64_t L = l.sc ? (int64_t)l.sc * CCH : len;   /* one segment: the span */
    seg_cu_kernel<<<(unsigned)((nseg + 256) / 256), 256, 0, st>>>(cu, nseg, L > 0 ? L : 1, len);
    if (nseg > 1) e = cudaMemsetAsync(dht, 0, (size_t)(nseg - 1) * sst * sizeof(float), st);
    if (e == cudaSuccess)
        e = a->dht ? cudaMemcpyAsync(dht + (size_t)(nseg - 1) * sst, a->dht, sst * sizeof(float), cudaMemcpyDeviceToDevice, st)
                   : cudaMemsetAsync(dht + (size_t)(nseg - 1) * sst, 0, sst * sizeof(float), st);
    if (e != cudaSuccess) return gdn_fail(GDN_ERR_BACKEND, "gdn_cp_bwd_map: %s", cudaGetErrorString(e));
    gdn_plan sub = s;
    sub.N = nseg;
    gdn_bwd_args b = *a;
    b.saved = nullptr;
    b.dht = dht;
    b.dh0 = nseg > 1 ? dsl : dS;
    b.dq = b.dk = b.dv = b.dg = b.dbeta = nullptr;
    b.dA_log = b.ddt_bias = nullptr;
    b.h0 = nullptr;
    if ((r = gdn_cuda_chunk_dstate(&sub, &b, cu, rq, rk, w, stream))) return r;
    if (nseg > 1) {
        gdn::fold_launch<CW>(rcompose_kernel, HV * ((V + CW - 1) / CW), K, st, seg_p, dsl, nseg, HV, K, V, c->flags, dS);
    }
    const int64_t n = (int64_t)map_floats(p) * HV;
    bmap_pack_kernel<<<(unsigned)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096), 256, 0, st>>>(dS, P, HV, K, V, c->flags, bmap);
    e = cudaGetLastError();
    return e == cudaSuccess ? GDN_OK : gdn_fail(GDN_ERR_BACKEND, "gdn_cp_bwd_map: %s", cudaGetErrorString(e));
}

/* dht + E on the last sequence's row, into out ([N][HV][K][V]; dht NULL = zeros) */
__global__ void dht_plus_kernel(const float *dht, const float *E, int64_t N, int64_t per, float *out) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < N * per; e += (int64_t)gridDim.x * blockDim.x)
        out[e] = (dht ? dht[e] : 0.f) + (E && e / per == N - 1 ? E[e % per] : 0.f);
}

unsigned grid_of(int64_t n) { return (unsigned)((n + 255) / 256 < 8192 ? (n + 255) / 256 : 8192); }

/* steps 5 and 8 with their work shared: where the local backward splits its
 * sequences (chunk_bwd.cu), its first part (prep, pass-1 maps, the first
 * reverse sweep) is the backward map's work too; else the two are the map
 * and the whole backward. Workspace: [the backward's][d0 / dht + dS_out] */
struct PairWs { int sc; size_t bwd, extra, total; };
PairWs pair_ws(const gdn_plan *p, const gdn_cp_config *cp) {
    PairWs l;
    l.sc = gdn_cuda_chunk_bwd_split(p);
    l.bwd = al(gdn_cuda_chunk_bwd_ws(p));
    const size_t st = (size_t)p->c.HV * p->c.K * p->c.V * sizeof(float);
    l.extra = al(l.sc ? st : st * (size_t)p->N);
    l.total = l.bwd + l.extra;
    if (!l.sc) {
        const size_t m = bwd_ws_layout(p, cp).total;
        if (m > l.total) l.total = m;
    }
    return l;
}

}  // namespace

/* steps 1 and 4 with their work shared: where the local forward splits its
 * sequences (chunk_fwd.cu), its prep and pass 1 give every segment's map,
 * the last sequence's composed is the forward map, and step 4 is the scan
 * and pass 3 only; else the map and the whole forward */
extern "C" size_t gdn_cuda_cp_fwd_ws(const gdn_plan *p, const gdn_cp_config *cp) {
    const size_t f = gdn_cuda_chunk_fwd_ws(p);
    if (gdn_cuda_chunk_fwd_split(p)) return f;
    const size_t m = fwd_ws(p, cp);
    return m > f ? m : f;
}

extern "C" gdn_status gdn_cuda_cp_fwd_begin(const gdn_plan *p, const gdn_cp_config *cp, const gdn_fwd_args *a, float *map,
                                            void *stream) {
    const int sc = gdn_cuda_chunk_fwd_split(p);
    if (!sc) return fwd_map(p, cp, a, map, stream);
    const gdn_config *c = &p->c;
    const int K = c->K, V = c->V, HV = c->HV;
    cudaStream_t st = (cudaStream_t)stream;
    float *seg_p, *seg_s;
    gdn_status r = gdn_cuda_chunk_fwd_part(p, a, a->workspace, 0, &seg_p, &seg_s, stream);
    if (r) return r;
    cudaError_t e;
    int64_t bos, len;
    if (!fwd_edge(p, cp, &bos, &len)) {   /* the work is for step 4; nothing goes on */
        e = cudaMemsetAsync(map, 0, map_floats(p) * HV * sizeof(float), st);
        return e == cudaSuccess ? GDN_OK : gdn_fail(GDN_ERR_BACKEND, "gdn_cp_fwd_begin: %s", cudaGetErrorString(e));
    }
    const int need_P = p->N == 1 && cp->first_continues;
    const float *h0row = (!need_P && a->h0) ? a->h0 + (size_t)(p->N - 1) * HV * K * V : nullptr;
    const int64_t L = (int64_t)sc * CCH, nseg = len > 0 ? (len + L - 1) / L : 0, slot0 = bos / L + (p->N - 1);
    gdn::fold_launch<CW>(compose_kernel, HV * ((K + V + CW - 1) / CW), K, st, seg_p + slot0 * HV * (int64_t)K * K,
                         seg_s + slot0 * HV * (int64_t)K * V, (int)nseg, HV, K, V, h0row, c->flags, need_P, map);
    e = cudaGetLastError();
    return e == cudaSuccess ? GDN_OK : gdn_fail(GDN_ERR_BACKEND, "gdn_cp_fwd_begin: %s", cudaGetErrorString(e));
}

extern "C" gdn_status gdn_cuda_cp_fwd_finish(const gdn_plan *p, const gdn_cp_config *cp, const gdn_fwd_args *a, void *stream) {
    (void)cp;
    if (!gdn_cuda_chunk_fwd_split(p)) return gdn_cuda_chunk_fwd(p, a, a->workspace, stream);
    return gdn_cuda_chunk_fwd_part(p, a, a->workspace, 1, nullptr, nullptr, stream);
}

extern "C" size_t gdn_cuda_cp_bwd_ws(const gdn_plan *p, const gdn_cp_config *cp) { return pair_ws(p, cp).total; }

extern "C" gdn_status gdn_cuda_cp_bwd_begin(const gdn_plan *p, const gdn_cp_config *cp, const gdn_bwd_args *a,
                                            const float *fmap, float *bmap, void *stream) {
    const PairWs l = pair_ws(p, cp);
    if (!l.sc) return bwd_map(p, cp, a, fmap, bmap, stream);
    const gdn_config *c = &p->c;
    const int K = c->K, V = c->V, HV = c->HV;
    cudaStream_t st = (cudaStream_t)stream;
    char *w = static_cast<char *>(a->workspace);
    float *d0 = reinterpret_cast<float *>(w + l.bwd), *seg_p, *seg_s;
    gdn_status r = gdn_cuda_chunk_bwd_part(p, a, w, 0, nullptr, d0, &seg_p, &seg_s, stream);
    if (r) return r;
    cudaError_t e;
    const int64_t n = (int64_t)map_floats(p) * HV;
    if (!cp->first_continues) {   /* the work is for step 8; nothing goes back */
        e = cudaMemsetAsync(bmap, 0, n * sizeof(float), st);
        return e == cudaSuccess ? GDN_OK : gdn_fail(GDN_ERR_BACKEND, "gdn_cp_bwd_begin: %s", cudaGetErrorString(e));
    }
    const int through = p->N == 1 && cp->last_continues;
    const float *P = through ? fmap : nullptr;
    if (through && !fmap) {   /* P: sequence 0's segments composed (its pass-1 slots are 0 ..) */
        int64_t bos, len;
        gdn_seq(p, 0, &bos, &len);
        const int64_t L = (int64_t)l.sc * CCH, nseg0 = len > 0 ? (len + L - 1) / L : 0;
        gdn::fold_launch<CW>(compose_kernel, HV * ((K + V + CW - 1) / CW), K, st, seg_p, seg_s, (int)nseg0, HV, K, V, nullptr,
                             c->flags, 1, bmap);
        P = bmap;   /* read in place by the pack below (P's part only) */
    }
    bmap_pack_kernel<<<grid_of(n), 256, 0, st>>>(d0, P, HV, K, V, c->flags, bmap);
    e = cudaGetLastError();
    return e == cudaSuccess ? GDN_OK : gdn_fail(GDN_ERR_BACKEND, "gdn_cp_bwd_begin: %s", cudaGetErrorString(e));
}

extern "C" gdn_status gdn_cuda_cp_bwd_finish(const gdn_plan *p, const gdn_cp_config *cp, const gdn_bwd_args *a,
                                             const float *dS_out, void *stream) {
    const PairWs l = pair_ws(p, cp);
    const float *E = cp->last_continues ? dS_out : nullptr;
    char *w = static_cast<char *>(a->workspace);
    if (l.sc) return gdn_cuda_chunk_bwd_part(p, a, w, 1, E, nullptr, nullptr, nullptr, stream);
    /* no split: the whole backward with dht + dS_out */
    gdn_bwd_args b = *a;
    if (E) {
        float *dht = reinterpret_cast<float *>(w + l.bwd);
        const int64_t per = (int64_t)p->c.HV * p->c.K * p->c.V;
        dht_plus_kernel<<<grid_of(p->N * per), 256, 0, (cudaStream_t)stream>>>(a->dht, E, p->N, per, dht);
        b.dht = dht;
    }
    return gdn_cuda_chunk_bwd(p, &b, w, stream);
}

extern "C" size_t gdn_cuda_cp_fwd_map_ws(const gdn_plan *p, const gdn_cp_config *cp) { return fwd_ws(p, cp); }

extern "C" size_t gdn_cuda_cp_bwd_map_ws(const gdn_plan *p, const gdn_cp_config *cp) { return bwd_ws_layout(p, cp).total; }

extern "C" gdn_status gdn_cuda_cp_fwd_map(const gdn_plan *p, const gdn_cp_config *cp, const gdn_fwd_args *a, float *map,
                                          void *stream) {
    return fwd_map(p, cp, a, map, stream);
}

extern "C" gdn_status gdn_cuda_cp_bwd_map(const gdn_plan *p, const gdn_cp_config *cp, const gdn_bwd_args *a,
                                          const float *fwd_map, float *bmap, void *stream) {
    return bwd_map(p, cp, a, fwd_map, bmap, stream);
}

extern "C" gdn_status gdn_cuda_cp_scan(const gdn_plan *p, const gdn_cp_config *cp, const float *maps, float *out,
                                       int backward, void *stream) {
    const int K = p->c.K, V = p->c.V, HV = p->c.HV;
    if (HV == 0) return GDN_OK;
    const int nsl = (V + CW - 1) / CW;
    gdn::fold_launch<CW>(scan_kernel, HV * nsl, K, (cudaStream_t)stream, maps, cp->rank, cp->world, backward, HV, K, V,
                         p->c.flags, out);
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? GDN_OK
                            : gdn_fail(GDN_ERR_BACKEND, "%s: %s", backward ? "gdn_cp_bwd_scan" : "gdn_cp_fwd_scan",
                                       cudaGetErrorString(e));
}
