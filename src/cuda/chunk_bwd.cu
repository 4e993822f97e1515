/* CUDA chunked backward: the host side (the workspace, the passes' launch
 * sequence, the -DGDN_BWD_PROFILE phase times) and the C entry points of
 * cuda_backend.h. The kernels are in chunk_bwd_prep.cu (slot_info, prep),
 * chunk_bwd_sweep.cu (fwd_sweep, bwd_sweep), chunk_bwd_local.cu (the
 * chunk-local stage), chunk_bwd_fused.cu (the two as one pass) and
 * chunk_bwd_grp.cu (the group stage, grp_qk, dparam); what they share in
 * chunk_bwd.cuh.
 *
 * The CUDA chunked backward (gdn_chunk_bwd), version 4: the math and the
 * arithmetic choices of the CPU backward (src/cpu/chunk_bwd.c,
 * src/cpu/chunk.h), every product on the tensor cores (src/cuda/mma_tf32.cuh)
 * as 3xTF32 (fp32 accuracy), except the chunk-local and group stages' for
 * bf16 / f16 inputs from K = 16, which take one tf32 product (their
 * gradients are stored in 16 bits), and bf16 with K = 128, whose reverse
 * sweep, local walk over V and prep products are bf16 wgmma with inexact
 * operands split into hi + lo halves (~16 bits kept; q, k, v, dO exact; the
 * sweep and the walk also for f16, in f16, and at K = 256 split over K),
 * but for Tm and P, and the state and state gradient where they are
 * multiplied by K (K S0, K dS), which are rounded to bf16 (the measured
 * margins: bench/NOTES.md v4.7); the rest fp32 / double as the CPU.
 * Chunks are addressed by a slot: chunk i of sequence n (bos, len) is slot
 * floor(bos / 64) + n + i, injective and < B*T/64 + N + 1 (the forward's
 * record count), so per-chunk arrays need no host-side index.
 *
 *   slot_info   per slot: first token row and length c (0 = no chunk)
 *   prep        per (slot, value head j): gate cumsum gc (double, as the
 *               CPU), exp(gc), beta, g, Tm = (I + A)^-1 by forward
 *               substitution and P into a record           (chunk_fwd.c prepare_head);
 *               on the whole call with bf16 and K = 128 the forward states'
 *               own prep writes them instead (one prep for both walks: its
 *               T, the gates, Q K^T once per q/k head; chunk_fwd_prep.cu
 *               brec): the fused pass's bf16 tiles (with the split by
 *               that prep alone before the split's first reverse sweep,
 *               the states' walk after the folds)
 *   fwd_sweep   per (n, j, 64 columns of V), chunks in order: the state
 *               entering each chunk into `states`           (chunk_bwd.c backward_span, first loop);
 *               for bf16 / f16 inputs the chunk forward's state kernels
 *               instead (fwd_states below), in windows (below) a window at
 *               a time from the state entering it (a checkpoint: kept by
 *               the forward in saved, else by a first walk that stores
 *               nothing else)
 *   bwd_sweep   per (n, j, 64 columns of V), chunks in reverse: dS leaving
 *               each chunk into `dstates`, dh0 at the end   (chunk_bwd.c dstate_span)
 *               Both sweeps fetch the next chunk into registers while the
 *               current one computes (bf16 / f16, K <= 128, aligned). For
 *               bf16 / f16 with K = 128 or 256 and V in 128-column blocks
 *               the reverse sweep is chunk_bwd_sweep_t.cu instead: dS^T in
 *               registers as the wgmma A operand, 16-bit operands (dU as
 *               hi + lo); at K = 256 two blocks a column block, one a half
 *               of K.
 *   local stage K <= 128 (and 128 < K <= 256 with G <= 4, local_ks: two
 *               blocks an item, each holding half of K, their sums over K
 *               exchanged in the cluster of the 2 G blocks): one block
 *               per (slot, j) runs chunk_backward of
 *               chunk_bwd.c with its tiles in shared memory and its sums
 *               over V in registers (chunk_bwd_local.cu; for bf16 / f16
 *               with K = 128 a block its walk over V on wgmma, vside_wg); dq, dk summed
 *               over the G value heads in order, the l2norm chain, stored:
 *               in a thread-block cluster of the G blocks of a (slot, q/k
 *               head) through distributed shared memory (G <= 8), else over
 *               a scratch of dQc, dKc per item (grp_qk_kernel). Slots in
 *               groups (all HV heads of a slot in one group); in clusters,
 *               windows of chunks the last first, each the reverse sweep
 *               over its chunks then its items, so only one window's dS is
 *               kept (window_chunks), and where the forward states come
 *               from the chunk forward's kernels only one window's states
 *               and records too.
 *   fused pass  bf16, K = V = 128, G <= 4 (chunk_bwd_fused.cu): the reverse
 *               sweep and the local stage as one kernel, one block per
 *               (sequence, value head) walking its chunks (a window's) in
 *               reverse with dS in registers, every chunk-local gradient
 *               formed on the way by three warpgroups; no dstates.
 *               Where it and the transposed sweep are their only readers,
 *               prep stores Tm and P, and where it is, the chunk forward's
 *               state kernel the states, as bf16 tiles in its shared-memory
 *               layout (BwdArgs::rec16, st16)
 *   group stage K > 128 with G > 4: the same per item step by step over a
 *               per-item scratch in global memory (chunk_bwd_grp.cu)
 *   dparam      dA_log, ddt_bias: per (slot, j) partials in double, summed
 *               over slots per j by a block in a fixed order
 *
 * Long sequences with few heads (bf16 / f16; split_sc below) are cut into
 * segments that the whole backward treats as sequences of their own, so
 * both sweeps walk them at once: their h0 rows from the forward's pass-1
 * maps, their dht rows from a first reverse sweep over all of them carried
 * back through the maps' P^T (chunk_bwd_split.cu).
 *
 * No atomics anywhere: every result has a fixed summation order, so repeated
 * runs give the same bits. All scratch is the caller's workspace; nothing is
 * allocated and nothing waits for the host. -DGDN_BWD_PROFILE prints the
 * phases' times (events) and the cycles of each step (block 0). */
#include <cstring>
#include <cuda_runtime.h>
#include "cuda/chunk_bwd.cuh"

namespace gdn {
namespace cbwd {
namespace {

/* the group stage's per-item scratch (Scr, chunk_bwd.cuh) */
Scr scr_layout(int K, int V) {
    Scr s;
    int64_t o = 0;
    auto take = [&](int64_t n) { const int64_t at = o; o += (n + 31) / 32 * 32; return at; };
    s.Q = take(CC * K); s.Kc = take(CC * K); s.Bk = take(CC * K); s.Kd = take(CC * K); s.dKd = take(CC * K);
    s.Xq = take(CC * K); s.dQc = take(CC * K); s.dKc = take(CC * K); s.dWk = take(CC * K); s.dBk = take(CC * K);
    s.Vv = take(CC * V); s.Bv = take(CC * V); s.Xr = take(CC * V); s.U = take(CC * V); s.dO = take(CC * V);
    s.dU = take(CC * V); s.dBv = take(CC * V);
    s.dP = take(CC * CC); s.dTm = take(CC * CC); s.tmp = take(CC * CC); s.dA = take(CC * CC); s.Rg = take(CC * CC);
    s.dgc = take(CC); s.dbeta = take(CC);
    s.F = o;
    return s;
}

int64_t nslots_of(const gdn_plan *pl) { return pl->c.B * pl->c.T / CC + pl->N + 1; }

/* slots per group: whole slots, about 512 items for the group stage (a few
 * blocks per SM), 2048 for the chunk-local stage (one block per SM, a small
 * scratch per item); all of them at once for the chunk-local stage in
 * clusters (no scratch: one launch, one partly filled last wave) */
int64_t group_slots(const gdn_plan *pl) {
    const int64_t ns = nslots_of(pl);
    if (use_local(pl->c.K, pl->G) && local_cluster(pl->c.K, pl->G) && ns * pl->c.HV * (local_ks(pl->c.K, pl->G) ? 2 : 1) <= INT32_MAX) return ns;
    int64_t g = (use_local(pl->c.K, pl->G) ? 2048 : 512) / pl->c.HV;
    if (g < 1) g = 1;
    return g < ns ? g : ns;
}

/* blocks of the chunk-local stage (or the fused pass) that run at once: one
 * block an SM, in clusters of G where the stage takes them, and whole
 * clusters fit only in a GPC's SMs (30 clusters of 4 on a 132-SM H100, not
 * 33: a grid of 32 runs in two waves) */
int64_t stage_at_once(const gdn_plan *pl) {
    if (local_ks(pl->c.K, pl->G)) return (int64_t)Fused::max_clusters(2 * pl->G) * 2 * pl->G;   /* two blocks an item */
    if (!use_local(pl->c.K, pl->G) || !local_cluster(pl->c.K, pl->G) || pl->G <= 1) return sm_count();
    return (int64_t)Fused::max_clusters(pl->G) * pl->G;
}

/* chunks per segment of the sequence split (chunk_bwd_split.cu), 0 = none:
 * bf16 / f16 (the segments' incoming states come from the forward's pass 1,
 * a tensor-core kernel), and only where the sweeps' blocks (sequence, value
 * head, column block) would leave most SMs idle, or when asked (seq_split).
 * The column block is the reverse sweep's: 128 where the shape takes the
 * transposed sweep (SweepT, whose pointer alignment the plan cannot see: a
 * misaligned call runs the 64-column sweep on twice the blocks), else VT */
int split_sc(const gdn_plan *pl) {
    const gdn_config *c = &pl->c;
    if (c->dtype == GDN_F32 || pl->N * c->HV == 0) return 0;
    const int vt = (c->dtype == GDN_BF16 || c->dtype == GDN_F16) && c->K == 128 && c->V % 128 == 0 ? 128 : VT;
    /* the segments' (sequence, value head) blocks as whole clusters of the
     * stage after the sweep, in one wave: 120 at G = 4 on a 132-SM H100 */
    return gdn::split_chunks(pl, pl->N * c->HV * ((c->V + vt - 1) / vt), stage_at_once(pl));
}

/* segments of the split's view: every sequence cut into pieces of sc chunks (an empty one is one segment) */
int64_t seg_total(const gdn_plan *pl, int sc) {
    int64_t t = 0;
    for (int64_t n = 0; n < pl->N; n++) {
        int64_t bos, len;
        gdn_seq(pl, n, &bos, &len);
        t += len > 0 ? (len + (int64_t)sc * CC - 1) / ((int64_t)sc * CC) : 1;
    }
    return t;
}

/* chunks per window of the state gradients, 0 = none (every chunk's dS kept
 * at once). The chunk-local stage in clusters walks the chunks in windows,
 * the last first: the reverse sweep over a window's chunks (from the state
 * gradient the later window left, dht for the last), then the local stage's
 * items of that window, so dstates holds one window, a quarter or half of
 * the chunks, and, where prep can run a window at a time just before them,
 * the records and the forward states too, each window's from the state
 * entering it (a checkpoint: the forward's from saved where it kept them,
 * else a first walk over the windows without stores; -1.9 GB at qwen3next,
 * +2-4% of the backward there, bench/NOTES.md v4.6). Where each
 * window is still ~31 waves of items on the card (4096), and the sequences
 * are near one length (their windows' empty items at most a quarter of the
 * full ones: varlen batches of uneven lengths keep every chunk's dS). The
 * window a few chunks longer where that fills the waves better (the fewest
 * waves of clusters, one block an SM, over all windows): windows change no
 * bit, so their size may follow the card's SM count. */
int64_t window_chunks(const gdn_plan *pl, int sc, int64_t Ns) {
    const gdn_config *c = &pl->c;
    if (!use_local(c->K, pl->G) || !local_cluster(c->K, pl->G) || Ns <= 0) return 0;
    int64_t total = 0;
    for (int64_t n = 0; n < pl->N; n++) {
        int64_t bos, len;
        gdn_seq(pl, n, &bos, &len);
        total += (len + CC - 1) / CC;
    }
    const int64_t maxch = sc ? sc : (pl->max_len + CC - 1) / CC;
    if (4 * Ns * maxch > 5 * total) return 0;
    for (int nw = 4; nw >= 2; nw /= 2) {
        const int64_t w1 = (maxch + nw - 1) / nw;
        if (w1 >= maxch || Ns * w1 * c->HV < 4096) continue;
        const int cs = local_ks(c->K, pl->G) ? 2 * pl->G : pl->G;   /* blocks a cluster (the K split: two an item) */
        const int64_t per = Ns * c->HV / pl->G, wave = stage_at_once(pl) / cs;   /* clusters a chunk index, a wave */
        int64_t best = w1, best_waves = INT64_MAX;
        for (int64_t wn = w1; wn < w1 + 8 && wn < maxch; wn++) {
            int64_t waves = 0;
            for (int64_t i0 = 0; i0 < maxch; i0 += wn) {
                const int64_t len = maxch - i0 < wn ? maxch - i0 : wn;
                waves += (per * len + wave - 1) / wave;
            }
            if (waves < best_waves) { best = wn; best_waves = waves; }
        }
        return best;
    }
    return 0;
}

/* the fused pass runs (run's `fused`): its shape, from the plan alone; its
 * pointers' 16-byte rows are the API's rule for bf16 (gdn_cuda_align_bwd),
 * so the workspace keeps no state gradients for it */
bool fused_plan(const gdn_plan *pl) {
    const gdn_config *c = &pl->c;
    return c->dtype == GDN_BF16 && c->K == 128 && c->V == 128 && pl->G <= 4 && use_local(c->K, pl->G) &&
           local_cluster(c->K, pl->G);
}

/* the workspace: the slot table, records, states, dstates (one window's, or
 * every chunk's; where the fused pass runs, which keeps none, only the
 * forward states' records that wait there), the windows' carried state
 * gradient, partials and the local stage's scratch of the (segmented) view;
 * with the split, its tables, the h0 / dht / dS rows of every segment and
 * the forward's pass-1 maps */
struct WsLayout {
    size_t info_c, rec, states, dstates, dstates_bytes, carry, ckpt, part, scr, scu, sseq, first, h0s, dhts, dsl, fws, total;
    int sc, rw;   /* rw: the records and forward states windowed with the state gradients */
    int64_t Ns, wn, nw;   /* chunks a window, windows */
};
size_t al(size_t x) { return (x + 255) / 256 * 256; }
WsLayout ws_layout(const gdn_plan *pl_in, bool allow_split = true) {
    WsLayout l;
    l.sc = allow_split ? split_sc(pl_in) : 0;
    l.Ns = l.sc ? seg_total(pl_in, l.sc) : pl_in->N;
    l.wn = allow_split ? window_chunks(pl_in, l.sc, l.Ns) : 0;
    const int64_t maxch = l.sc ? l.sc : (pl_in->max_len + CC - 1) / CC;
    l.nw = l.wn ? (maxch + l.wn - 1) / l.wn : 0;
    gdn_plan view = *pl_in;
    view.N = l.Ns;
    const gdn_plan *pl = &view;
    const gdn_config *c = &pl->c;
    const size_t ns = (size_t)nslots_of(pl), items = ns * c->HV, kv = (size_t)c->K * c->V;
    const size_t witems = (size_t)l.Ns * l.wn * c->HV;   /* a window's */
    const bool fused = fused_plan(pl_in);
    l.dstates_bytes = fused ? 0 : (l.wn ? witems : items) * kv * sizeof(float);   /* one window, or all */
    l.rw = 0;
    if (l.wn || fused) {   /* the forward states' records go there first (fwd_states): room for them, as without windows */
        gdn_plan fv = view;
        if (l.sc && fv.max_len > (int64_t)l.sc * CC) fv.max_len = (int64_t)l.sc * CC;
        size_t fr = gdn_cuda_chunk_states_ws(&fv, 0);
        const bool fs = c->dtype != GDN_F32 && (fused || fr <= items * kv * sizeof(float));   /* fwd_states takes the shape */
        /* the records and the forward states a window at a time too, where nothing reads them
         * before the windows: the forward states from the chunk forward's kernels (fwd_sweep reads
         * records), no split (its dS sweep and context parallel's parts read every record first).
         * The states of a window then start from its checkpoint (fwd_states, ckpt_at) */
        l.rw = l.wn && fs && !l.sc;
        if (l.rw) fr = gdn_cuda_chunk_states_ws(&fv, l.wn);
        if (fs && fr > l.dstates_bytes) l.dstates_bytes = fr;
    }
    size_t o = al(ns * sizeof(int64_t));
    l.info_c = o; o += al(ns * sizeof(int));
    l.rec = o; o += al((l.rw ? witems : items) * REC * sizeof(float));
    l.states = o; o += al((l.rw ? witems : items) * kv * (fused ? 2 : sizeof(float)));   /* fused: bf16 tiles (st16) */
    l.dstates = o; o += al(l.dstates_bytes);
    l.carry = o; o += l.wn ? al((size_t)l.Ns * c->HV * kv * sizeof(float)) : 0;
    l.ckpt = o; o += l.rw ? al((size_t)(l.nw - 1) * l.Ns * c->HV * kv * sizeof(float)) : 0;   /* windows 1.. */
    l.part = o; o += al(2 * items * sizeof(double));
    const int64_t F = use_local(c->K, pl->G) ? (local_cluster(c->K, pl->G) ? 0 : local_scr(c->K).F) : scr_layout(c->K, c->V).F;
    l.scr = o; o += al((size_t)group_slots(pl) * c->HV * F * sizeof(float));
    l.scu = l.sseq = l.first = l.h0s = l.dhts = l.dsl = l.fws = o;
    if (l.sc) {
        const size_t rows = (size_t)l.Ns * c->HV * kv * sizeof(float);
        l.scu = o; o += al((size_t)(l.Ns + 1) * sizeof(int64_t));
        l.sseq = o; o += al((size_t)l.Ns * sizeof(int64_t));
        l.first = o; o += al((size_t)(pl_in->N + 1) * sizeof(int64_t));
        l.h0s = o; o += al(rows);
        l.dhts = o; o += al(rows);
        l.dsl = o; o += al(rows);
        l.fws = o; o += al(gdn_cuda_chunk_seg_maps_ws(pl_in, l.sc));
    }
    l.total = o;
    return l;
}

/* p: the arguments of the view (the caller's sequences, or their segments:
 * p.cu, p.N, p.nslots of the split's view, whose h0 / dht rows run() forms).
 * Context parallel (gdn_cp_bwd_begin / _finish, cp.cu) runs the split's
 * backward in two parts over one workspace: FRONT up to the first reverse
 * sweep's dS of every segment, and sequence 0's dS at its start into d0
 * (the backward map's S); BACK the rest, with E (or NULL) added to the state
 * gradient after the last sequence's end (dS_out from the later ranks). */
enum Part { WHOLE, FRONT, BACK };

/* the states entering each chunk of the view from the chunk forward's state
 * kernels where they take the shape (gdn_cuda_chunk_states: bf16 / f16; the
 * transposed kernel for K = 128 and V in 128-column blocks, the general one
 * otherwise), their records in the dstates area (written only later, by the
 * reverse sweep) where they fit: every chunk's into p.states (w < 0), or,
 * where the states are windowed (wl.rw), window w's from its checkpoint
 * (ckpt_at; h0 for the first) into `states` at the window's places (or
 * nowhere: NULL) and the state after it into `ht` (or NULL); st16: as the
 * fused pass's bf16 tiles where the kernel can (2: only so, else nothing
 * queued and 0: the fused pass's states area has room for tiles alone); brec (or NULL): the records
 * from the forward's prep too (p.rec; bf16, K = 128: prep's work), stage as
 * gdn_cuda_chunk_states' (1: that prep alone, 2: the walk after it). 2:
 * queued as tiles; 1: queued; 0: nothing queued, fwd_sweep's job; -1: a
 * launch failed */
float *ckpt_at(const WsLayout &wl, char *ws, int64_t w, int HV, size_t kv) {
    return reinterpret_cast<float *>(ws + wl.ckpt) + (size_t)(w - 1) * wl.Ns * HV * kv;
}
int fwd_states(const gdn_plan *pl, const gdn_bwd_args *a, const BwdArgs &p, const WsLayout &wl, char *ws, cudaStream_t st,
               int64_t w = -1, float *states = nullptr, float *ht = nullptr, const int *skip = nullptr, int skip_val = 0, int st16 = 0,
               float *brec = nullptr, int stage = 0, const int *wskip = nullptr, int wskip_val = 0) {
    gdn_plan fv = *pl;
    fv.N = p.N;
    fv.c.cu_seqlens_dev = p.cu;
    if (wl.sc) fv.c.cu_seqlens = nullptr;   /* the host's lengths are the sequences', not the segments' */
    if (wl.sc && fv.max_len > (int64_t)wl.sc * CC) fv.max_len = (int64_t)wl.sc * CC;
    const int64_t wn = w < 0 ? 0 : wl.wn;
    if (gdn_cuda_chunk_states_ws(&fv, wn) > wl.dstates_bytes) return 0;
    gdn_fwd_args f;
    memset(&f, 0, sizeof f);
    f.q = a->q; f.k = a->k; f.v = a->v; f.g = a->g; f.beta = a->beta; f.A_log = a->A_log; f.dt_bias = a->dt_bias; f.h0 = p.h0;
    if (w > 0) f.h0 = ckpt_at(wl, ws, w, p.HV, (size_t)p.K * p.V);
    f.ht = ht;
    return gdn_cuda_chunk_states(&fv, &f, w < 0 ? 0 : w * wn, wn, ws + wl.dstates, w < 0 ? p.states : states, skip, skip_val, wskip,
                                 wskip_val, st16, brec, p.rec16, stage, st);
}

/* the tag of the forward's checkpoints of windows of wn chunks in saved */
int ckpt_tag(int64_t wn) { return 0x47440000 | (int)(wn & 0xffff); }

/* the first of the windows whose forward states the forward keeps as tiles
 * in saved (sl.keep, room for sl.nkeep chunks a sequence and value head,
 * 256-byte aligned for the TMA's rows): the last half of them, or fewer
 * where they do not fit; wl.nw where none (no room, no windows, the fused
 * pass not run) and *ktag their tag (saved's tag[2]). Those windows'
 * states are then not walked again (at qwen3next on an H200 the backward
 * -0.12 ms a window, the forward's stores +0.05: bench/NOTES.md v5.42) */
int64_t kept_windows(const gdn_plan *pl, const WsLayout &wl, const gdn_saved_layout &sl, int *ktag) {
    *ktag = 0;
    if (!sl.keep || (reinterpret_cast<uintptr_t>(sl.keep) & 255) || !wl.rw || wl.sc || !fused_plan(pl)) return wl.nw;
    int64_t kw = wl.nw - wl.nw / 2;
    while (kw < wl.nw && (wl.nw - kw) * wl.wn > sl.nkeep) kw++;
    if (kw < wl.nw) *ktag = ckpt_tag(wl.wn) ^ (int)(kw << 20);
    return kw;
}

/* the forward's checkpoints (saved) into the workspace's, where their tag says they are those of these windows */
__global__ void ckpt_copy_kernel(const int *tag, int want, const float *src, float *dst, int64_t n) {
    if (*tag != want) return;   /* saved is 4-byte aligned: one float a load */
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) dst[e] = src[e];
}

cudaError_t run(const gdn_plan *pl, const gdn_bwd_args *a, BwdArgs p, const WsLayout &wl, char *ws, cudaStream_t st,
                Part part = WHOLE, const float *E = nullptr, float *d0 = nullptr) {
    const int K = p.K, V = p.V, HV = p.HV;
    cudaError_t e;
    const int64_t ns = p.nslots;
    gdn_plan view = *pl;
    view.N = wl.Ns;
    SegView sv;
    if (wl.sc) {
        sv.cu = pl->c.cu_seqlens ? pl->c.cu_seqlens_dev : nullptr;
        sv.T = pl->c.T; sv.N = pl->N; sv.Ns = wl.Ns; sv.sc = wl.sc; sv.HV = HV; sv.K = K; sv.V = V; sv.flags = p.flags;
        sv.scu = reinterpret_cast<int64_t *>(ws + wl.scu);
        sv.sseq = reinterpret_cast<int64_t *>(ws + wl.sseq);
        sv.first = reinterpret_cast<int64_t *>(ws + wl.first);
        sv.seg_p = sv.seg_s = sv.saved_p = sv.saved_s = nullptr;
        sv.mtag = nullptr;
        sv.mtag_val = 0;
        if (part != BACK) seg_table_launch(sv, st);
    }
#ifdef GDN_BWD_PROFILE   /* milliseconds per phase (events; not capture-safe) */
    cudaEvent_t ev[5], eq[2], es[4];
    float qk_ms = 0.f, win_ms[4] = {0.f, 0.f, 0.f, 0.f};   /* the windows' forward states, prep, reverse sweep, local stage */
    for (int i = 0; i < 5; i++) cudaEventCreate(&ev[i]);
    for (int i = 0; i < 4; i++) cudaEventCreate(&es[i]);
#define SPHASE(i) cudaEventRecord(es[i], st)
    for (int i = 0; i < 2; i++) cudaEventCreate(&eq[i]);
    cudaEventRecord(ev[0], st);
#define PHASE(i) cudaEventRecord(ev[i], st)
    /* the windows' steps: an event each, the time since the one before added to win_ms[k] at
     * the end (k < 0: a start); no synchronization in between */
    cudaEvent_t wev[64];
    int wk[64], nwev = 0;
    auto lap = [&](int k) {
        if (nwev == 64) return;
        cudaEventCreate(&wev[nwev]);
        cudaEventRecord(wev[nwev], st);
        wk[nwev++] = k;
    };
#define WLAP(k) lap(k)
#else
#define WLAP(k) do { } while (0)
#define PHASE(i) do { } while (0)
#define SPHASE(i) do { } while (0)
#endif
    if (part != BACK) slot_info_launch(p, st);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    /* every product as 3xTF32 (fp32 accuracy), but the chunk-local (or
     * group) stage's for bf16 / f16 from K = 16. One tf32 product is not
     * enough at tiny K: dk through the L2 norm at K = 1 cancels the tf32
     * rounding of dKc up to 1.5e-2 of the result (bound 1e-2) */
    constexpr bool SPLIT = true;
    /* the chunk-local and group stages with one tf32 product for bf16 / f16 inputs from K = 16 */
    const bool one = p.dt != 0 && K >= 16;
    if ((e = PrepPass<SPLIT>::attr(K)) != cudaSuccess) return e;
    if ((e = SweepPass<SPLIT>::attr(K)) != cudaSuccess) return e;
    const bool local = use_local(K, p.G);
    if ((e = local ? (one ? LocalPass<false>::attr(K, p.G) : LocalPass<SPLIT>::attr(K, p.G))
                   : (one ? GrpPass<false>::attr(K, V) : GrpPass<SPLIT>::attr(K, V))) != cudaSuccess)
        return e;
    /* the reverse sweep and the local stage as one pass (chunk_bwd_fused.cu) */
    const bool fused = fused_plan(pl);   /* the workspace's layout assumes it */
    if (fused && !Fused::takes(p)) return cudaErrorMisalignedAddress;   /* past gdn_cuda_align_bwd's rule: cannot happen */
    if (fused && (e = Fused::attr()) != cudaSuccess) return e;
    /* the records' Tm and P as the fused pass's bf16 tiles where this call
     * writes them and only the fused pass and the transposed sweep read them
     * (the split's first reverse sweep: SweepT takes every shape Fused does;
     * context parallel's BACK reads FRONT's unless windowed); the forward
     * states as its bf16 tiles wherever it runs (fwd_states' st16: every call
     * writes its own states, and nothing else reads them then) */
    p.rec16 = fused && (part == WHOLE || (!wl.sc && wl.rw));
    /* the records from the forward states' prep (one prep for both walks: its
     * T and gates, and Q K^T; chunk_fwd_prep.cu) on the whole call, bf16 with
     * K = 128: as the fused pass's bf16 tiles, or with the split, where the
     * first reverse sweep reads them before the states' walk, in fp32 by that
     * prep alone here (stage 1; the walk after the split's folds, stage 2) */
    float *brec = (p.rec16 || wl.sc) && part == WHOLE && p.dt == 1 && K == 128 ? p.rec : nullptr;
    int fstage = 0;
    if (brec && wl.sc) {
        const int f1 = p.N > 0 ? fwd_states(pl, a, p, wl, ws, st, -1, nullptr, nullptr, nullptr, 0, 0, brec, 1) : 0;
        if (f1 < 0) return cudaErrorLaunchFailure;
        if (f1 == 0) brec = nullptr;   /* not taken there: prep below */
        else fstage = 2;
    }
    if (part != BACK && !wl.rw && !brec) PrepPass<SPLIT>::launch(p, st);   /* else a window at a time, or by fwd_states */
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    if (wl.sc) {   /* the segments' h0 and dht rows (chunk_bwd_split.cu) */
        SPHASE(0);
        gdn_fwd_args f;
        memset(&f, 0, sizeof f);
        f.q = a->q; f.k = a->k; f.v = a->v; f.g = a->g; f.beta = a->beta; f.A_log = a->A_log; f.dt_bias = a->dt_bias;
        float *seg_p, *seg_s;
        /* the forward's maps where saved has them for these segments (gdn_saved_maps: the pass
         * below skipped on the device, the folds reading saved's), else a pass 1 of its own */
        const gdn_saved_layout sl = gdn_saved_at(&pl->c, const_cast<void *>(a->saved));
        const int64_t slots = gdn_cuda_chunk_seg_slots(pl, wl.sc);
        const bool fmaps = part == WHOLE && sl.maps && slots <= sl.nmaps;
        const int mtag = gdn_cuda_maps_tag(wl.sc);
        if (part == BACK) gdn_cuda_chunk_seg_maps_at(pl, wl.sc, ws + wl.fws, &seg_p, &seg_s);   /* FRONT's */
        else if (gdn_cuda_chunk_seg_maps(pl, &f, wl.sc, ws + wl.fws, &seg_p, &seg_s, fmaps ? sl.ckpt_tag + 1 : nullptr, mtag, st) != GDN_OK)
            return cudaErrorLaunchFailure;
        sv.seg_p = seg_p; sv.seg_s = seg_s;
        sv.mtag = fmaps ? sl.ckpt_tag + 1 : nullptr;
        sv.mtag_val = mtag;
        sv.saved_p = fmaps ? sl.maps : nullptr;
        sv.saved_s = fmaps ? sl.maps + slots * HV * (int64_t)K * K : nullptr;
        SPHASE(1);
        float *h0s = reinterpret_cast<float *>(ws + wl.h0s), *dhts = reinterpret_cast<float *>(ws + wl.dhts),
              *dsl = reinterpret_cast<float *>(ws + wl.dsl);
        if (part != BACK) {
            seg_dht_init_launch(sv, a->dht, dhts, st);
            BwdArgs q = p;   /* each segment's dS at its start, from zero (the last from dht); nothing kept */
            q.dht = dhts; q.dh0 = dsl; q.dstates = nullptr;
            SweepPass<SPLIT>::launch_bwd(q, (unsigned)(p.N * HV * p.nvt), st);
        }
        SPHASE(2);
        if (part == FRONT) {
            seg_fold_launch(sv, false, nullptr, nullptr, dsl, dhts, nullptr, d0, st);
            return cudaGetLastError();
        }
        seg_fold_launch(sv, true, a->h0, h0s, dsl, dhts, E, nullptr, st);
        p.h0 = h0s; p.dht = dhts; p.dh0 = a->dh0 ? dsl : nullptr;   /* dsl is free again: the view's dh0 rows */
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
        SPHASE(3);
    }
    PHASE(1);
    const unsigned blocks = (unsigned)(p.N * HV * p.nvt);
    if (p.N > 0 && wl.rw) {
        /* the checkpoints: the forward's from saved where its tag says they are these windows'
         * (ckpt_copy_kernel), else a walk over every window but the last, no states stored */
        const gdn_saved_layout sl = gdn_saved_at(&pl->c, const_cast<void *>(a->saved));
        const bool fck = sl.ckpt && wl.nw - 1 <= sl.nck;
        const size_t kv = (size_t)K * V;
        if (fck) {
            const int64_t n = (int64_t)((wl.nw - 1) * p.N * HV * kv);
            ckpt_copy_kernel<<<(unsigned)(n / 2048 + 1 < 2048 ? n / 2048 + 1 : 2048), 256, 0, st>>>(sl.ckpt_tag, ckpt_tag(wl.wn), sl.ckpt,
                                                                                                  ckpt_at(wl, ws, 1, HV, kv), n);
        }
        for (int64_t w = 0; w + 1 < wl.nw; w++)
            if (fwd_states(pl, a, p, wl, ws, st, w, nullptr, ckpt_at(wl, ws, w + 1, HV, kv), fck ? sl.ckpt_tag : nullptr,
                           ckpt_tag(wl.wn)) != 1)
                return cudaErrorLaunchFailure;   /* ws_layout saw fwd_states take the shape: a launch failed */
        PHASE(2);
    } else if (p.N > 0) {
        const int fs = fwd_states(pl, a, p, wl, ws, st, -1, nullptr, nullptr, nullptr, 0, fused ? 2 : 0, brec, fstage);
        if (fs < 0 || (fused && fs != 2)) return cudaErrorLaunchFailure;   /* fused: the states area holds tiles only */
        if (fs == 0 && brec) PrepPass<SPLIT>::launch(p, st);   /* not taken there: the records here */
        p.st16 = fs == 2;
        if (fs == 0) SweepPass<SPLIT>::launch_fwd(p, blocks, st);
        PHASE(2);
        if (!wl.wn && fused) Fused::launch(p, st);
        else if (!wl.wn) SweepPass<SPLIT>::launch_bwd(p, blocks, st);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
    }
    PHASE(3);
    const Scr o = local ? local_scr(K) : scr_layout(K, V);
    if (wl.wn) {   /* the windows, the last first (window_chunks); their state gradient carried in `carry` */
        float *carry = reinterpret_cast<float *>(ws + wl.carry);
        /* the last windows' forward states where the forward kept them (kept_windows): their walk
         * does nothing and the fused pass reads the tiles there, where saved's tag says so */
        const gdn_saved_layout ks = gdn_saved_at(&pl->c, const_cast<void *>(a->saved));
        int ktag = 0;
        const int64_t kw = kept_windows(pl, wl, ks, &ktag);
        Grp G;
        G.s0 = 0; G.scr = nullptr; G.o = o; G.cl = true;
        for (int64_t w = wl.nw - 1; w >= 0; w--) {
            BwdArgs q = p;
            q.w0 = w * wl.wn; q.wn = wl.wn;
            q.dht = w == wl.nw - 1 ? p.dht : carry;   /* each block reads its part, then writes it over (in place) */
            q.dh0 = w == 0 ? p.dh0 : carry;
            q.rw = wl.rw;
            WLAP(-1);
            if (w >= kw) {
                const int64_t tiles = p.N * wl.wn * HV, tb = (int64_t)K * V * 2;   /* a window's tiles, a tile's bytes */
                q.kst = reinterpret_cast<const float *>(ks.keep + (w - kw) * tiles * tb);
                q.kst_rows = tiles * tb / 256;
                q.ktag = ks.ckpt_tag + 2;
                q.ktag_val = ktag;
            }
            if (wl.rw) {   /* the window's forward states from its checkpoint, then its records (or with them: brec) */
                const int fs = fwd_states(pl, a, p, wl, ws, st, w, p.states, nullptr, nullptr, 0, fused ? 2 : 0, brec, 0, q.ktag,
                                          q.ktag_val);
                if (fs < 1 || (fused && fs != 2)) return cudaErrorLaunchFailure;
                q.st16 = fs == 2;
                WLAP(0);
                if (!brec) PrepPass<SPLIT>::launch(q, st);
            }
            WLAP(1);
            if (fused) {
                WLAP(2);
                Fused::launch(q, st);
            } else {
                SweepPass<SPLIT>::launch_bwd(q, blocks, st);
                WLAP(2);
                if (one) LocalPass<false>::launch(q, G, p.N * wl.wn, st);
                else LocalPass<SPLIT>::launch(q, G, p.N * wl.wn, st);
            }
            WLAP(3);
            if ((e = cudaGetLastError()) != cudaSuccess) return e;
        }
    }
    const int64_t gs = wl.wn ? ns : group_slots(&view);
    for (int64_t s0 = wl.wn || fused ? ns : 0; s0 < ns; s0 += gs) {
        const int64_t s1 = s0 + gs < ns ? s0 + gs : ns;
        Grp G;
        G.s0 = s0; G.scr = reinterpret_cast<float *>(ws + wl.scr); G.o = o; G.cl = local && local_cluster(K, p.G);
        if (local) {
            if (one) LocalPass<false>::launch(p, G, s1 - s0, st);
            else LocalPass<SPLIT>::launch(p, G, s1 - s0, st);
#ifdef GDN_BWD_PROFILE
            cudaEventRecord(eq[0], st);
#endif
            if (!G.cl) grp_qk_launch(p, G, s1 - s0, st);
#ifdef GDN_BWD_PROFILE
            cudaEventRecord(eq[1], st);
            cudaEventSynchronize(eq[1]);
            float qms;
            cudaEventElapsedTime(&qms, eq[0], eq[1]);
            qk_ms += qms;
#endif
        } else {
            if (one) GrpPass<false>::launch(p, G, s1 - s0, st);
            else GrpPass<SPLIT>::launch(p, G, s1 - s0, st);
        }
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
    }
    if (p.flags & GDN_GATE_FUSED) {
        dparam_launch(p, st);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
    }
    if (wl.sc && a->dh0) {
        seg_dh0_launch(sv, p.dh0, a->dh0, st);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
    }
#ifdef GDN_BWD_PROFILE
    PHASE(4);
    cudaEventSynchronize(ev[4]);
    float ms[4];
    for (int i = 0; i < 4; i++) cudaEventElapsedTime(&ms[i], ev[i], ev[i + 1]);
    printf("chunk_bwd phases ms: prep %.3f | fwd sweep %.3f | bwd sweep %.3f | group stage %.3f (dq, dk sums %.3f)\n", ms[0], ms[1],
           ms[2], ms[3], qk_ms);
    for (int i = 0; i < nwev; i++) {
        float t;
        if (i > 0 && wk[i] >= 0 && cudaEventElapsedTime(&t, wev[i - 1], wev[i]) == cudaSuccess) win_ms[wk[i]] += t;
    }
    for (int i = 0; i < nwev; i++) cudaEventDestroy(wev[i]);
    if (wl.wn)
        printf("chunk_bwd windows ms (in the group stage): forward states %.3f | prep %.3f | reverse sweep %.3f | local %.3f (%lld windows of %lld chunks)\n",
               win_ms[0], win_ms[1], win_ms[2], win_ms[3], (long long)wl.nw, (long long)wl.wn);
    if (wl.sc) {
        float sm_[3];
        for (int i = 0; i < 3; i++) cudaEventElapsedTime(&sm_[i], es[i], es[i + 1]);
        float pm;
        cudaEventElapsedTime(&pm, ev[0], es[0]);
        printf("chunk_bwd split ms: prep pass %.3f | segment maps %.3f | segments' dS sweep %.3f | folds %.3f (sc %d, %lld segments)\n", pm,
               sm_[0], sm_[1], sm_[2], wl.sc, (long long)wl.Ns);
    }
    for (int i = 0; i < 5; i++) cudaEventDestroy(ev[i]);
    for (int i = 0; i < 4; i++) cudaEventDestroy(es[i]);
    for (int i = 0; i < 2; i++) cudaEventDestroy(eq[i]);
#endif
#undef PHASE
#undef SPHASE
#undef WLAP
    return cudaSuccess;
}

}  // namespace
}  // namespace cbwd
}  // namespace gdn

using namespace gdn::cbwd;

extern "C" size_t gdn_cuda_chunk_bwd_ws(const gdn_plan *pl) { return ws_layout(pl).total; }

extern "C" int gdn_cuda_chunk_bwd_kept(const gdn_plan *pl, const gdn_saved_layout *sl, int *ktag) {
    return (int)kept_windows(pl, ws_layout(pl), *sl, ktag);
}

extern "C" int gdn_cuda_chunk_bwd_windows(const gdn_plan *pl, int64_t *wn, int *tag) {
    const WsLayout wl = ws_layout(pl);
    *wn = wl.rw ? wl.wn : 0;
    *tag = wl.rw ? ckpt_tag(wl.wn) : 0;
    return wl.rw ? (int)wl.nw : 0;
}

namespace {
BwdArgs args_of(const gdn_plan *pl, const gdn_bwd_args *a) {
    const gdn_config *c = &pl->c;
    BwdArgs p;
    p.q = a->q; p.k = a->k; p.v = a->v; p.g = a->g; p.beta = a->beta; p.dout = a->dout;
    p.A_log = a->A_log; p.dt_bias = a->dt_bias; p.h0 = a->h0; p.dht = a->dht;
    const gdn_saved_layout sl = gdn_saved_at(c, const_cast<void *>(a->saved));
    p.rstd_q = sl.rstd_q; p.rstd_k = sl.rstd_k;
    p.dq = a->dq; p.dk = a->dk; p.dv = a->dv; p.dg = a->dg; p.dbeta = a->dbeta;
    p.dA_log = a->dA_log; p.ddt_bias = a->ddt_bias; p.dh0 = a->dh0;
    p.cu = c->cu_seqlens ? c->cu_seqlens_dev : nullptr;
    p.T = c->T; p.N = pl->N; p.nslots = nslots_of(pl); p.ntok = c->B * c->T;
    p.H = c->H; p.HV = c->HV; p.K = c->K; p.V = c->V; p.G = pl->G; p.dt = (int)c->dtype; p.gdt = (int)c->gate_dtype;
    p.nvt = (c->V + VT - 1) / VT;
    p.scale = c->scale; p.flags = c->flags;
    p.rec16 = p.st16 = 0;
    p.lpt = 0;
    return p;
}

/* the arguments over workspace w of layout wl: the split's view (its
 * segments as the sequences) where there is one, and the scratch arrays */
BwdArgs bound_args(const gdn_plan *pl, const gdn_bwd_args *a, const WsLayout &wl, char *w) {
    BwdArgs p = args_of(pl, a);
    if (wl.sc) {
        gdn_plan view = *pl;
        view.N = wl.Ns;
        p.cu = reinterpret_cast<const int64_t *>(w + wl.scu);
        p.N = wl.Ns;
        p.nslots = nslots_of(&view);
    }
    p.lpt = wl.sc ? 0 : gdn::longest_first(pl, p.HV, stage_at_once(pl));   /* the fused pass's blocks */
    p.slot_row0 = reinterpret_cast<int64_t *>(w);
    p.slot_c = reinterpret_cast<int *>(w + wl.info_c);
    p.rec = reinterpret_cast<float *>(w + wl.rec);
    p.states = reinterpret_cast<float *>(w + wl.states);
    p.dstates = reinterpret_cast<float *>(w + wl.dstates);
    p.rec_rows = (int64_t)((wl.states - wl.rec) / 256);
    p.st_rows = (int64_t)((wl.dstates - wl.states) / 256);
    p.part = reinterpret_cast<double *>(w + wl.part);
    p.w0 = p.wn = 0;   /* run() sets the windows */
    p.rw = 0;
    p.kst = nullptr;   /* and the kept states */
    p.ktag = nullptr;
    p.ktag_val = 0;
    p.kst_rows = 0;
    return p;
}
}  // namespace

extern "C" gdn_status gdn_cuda_chunk_bwd(const gdn_plan *pl, const gdn_bwd_args *a, void *ws, void *stream) {
    const WsLayout wl = ws_layout(pl);
    char *w = static_cast<char *>(ws);
    const cudaError_t e = run(pl, a, bound_args(pl, a, wl, w), wl, w, (cudaStream_t)stream);
    if (e != cudaSuccess) return gdn_fail(GDN_ERR_BACKEND, "chunk backward kernel launch: %s", cudaGetErrorString(e));
    return GDN_OK;
}

/* context parallel (cp.cu): the split backward in two parts over one
 * workspace (run's FRONT and BACK); 0 chunks per segment = no split (the
 * parts are then the backward map and the whole backward) */
extern "C" int gdn_cuda_chunk_bwd_split(const gdn_plan *pl) { return split_sc(pl); }

extern "C" gdn_status gdn_cuda_chunk_bwd_part(const gdn_plan *pl, const gdn_bwd_args *a, void *ws, int back, const float *E,
                                              float *d0, float **seg_p, float **seg_s, void *stream) {
    const WsLayout wl = ws_layout(pl);   /* split: the caller (cp.cu) asked gdn_cuda_chunk_bwd_split */
    char *w = static_cast<char *>(ws);
    if (seg_p) gdn_cuda_chunk_seg_maps_at(pl, wl.sc, w + wl.fws, seg_p, seg_s);
    const cudaError_t e = run(pl, a, bound_args(pl, a, wl, w), wl, w, (cudaStream_t)stream, back ? BACK : FRONT, E, d0);
    if (e != cudaSuccess) return gdn_fail(GDN_ERR_BACKEND, "chunk backward kernel launch: %s", cudaGetErrorString(e));
    return GDN_OK;
}

/* context parallel (cp.cu): the slot table, the records and the reverse
 * sweep only, no dstates kept: dh0 from dht through the sequences (those of
 * the plan, or of cu_dev: the plan's N sequences on the device) */
extern "C" size_t gdn_cuda_chunk_dstate_ws(const gdn_plan *pl) {
    const WsLayout wl = ws_layout(pl, false);
    return wl.states;   /* the slot table and the records come first */
}

extern "C" gdn_status gdn_cuda_chunk_dstate(const gdn_plan *pl, const gdn_bwd_args *a, const int64_t *cu_dev,
                                            const float *rstd_q, const float *rstd_k, void *ws, void *stream) {
    const WsLayout wl = ws_layout(pl, false);
    BwdArgs p = bound_args(pl, a, wl, static_cast<char *>(ws));
    if (cu_dev) p.cu = cu_dev;
    p.rstd_q = rstd_q;
    p.rstd_k = rstd_k;
    p.states = p.dstates = nullptr;   /* the slot table and the records only */
    p.part = nullptr;
    cudaStream_t st = (cudaStream_t)stream;
    cudaError_t e = PrepPass<true>::attr(p.K);
    if (e == cudaSuccess) e = SweepPass<true>::attr(p.K);
    if (e == cudaSuccess) {
        slot_info_launch(p, st);
        PrepPass<true>::launch(p, st);
        if (p.N > 0) SweepPass<true>::launch_bwd(p, (unsigned)(p.N * p.HV * p.nvt), st);
        e = cudaGetLastError();
    }
    if (e != cudaSuccess) return gdn_fail(GDN_ERR_BACKEND, "context-parallel backward map launch: %s", cudaGetErrorString(e));
    return GDN_OK;
}
