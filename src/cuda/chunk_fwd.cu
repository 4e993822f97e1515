/* CUDA chunk forward: the host side (the workspace, the tensor maps, the
 * passes' launch sequence) and the C entry points of cuda_backend.h. The
 * kernels are in chunk_fwd_prep.cu, chunk_fwd_state.cu, chunk_fwd_state_t.cu,
 * chunk_fwd_state_tk.cu and chunk_fwd_split.cu; what they share in
 * chunk_fwd.cuh.
 *
 * The chunk forward on tensor cores (bf16 / f16 inputs; f32 inputs take the
 * exact recurrent kernel, since bf16 products cannot meet the f32 bound).
 * Per chunk of C = 64 tokens, with gc the gate's cumsum inside the chunk and
 * q, k raw (their rstd scale rows and columns of the products):
 *
 *   A  = strict_tril(diag(beta) K K^T * exp(gc_t - gc_s))   fp32
 *   T  = (I + A)^-1      16x16 diagonal blocks by substitution, the rest by
 *                        three levels of tf32 block products
 *   P  = tril(Q K^T * exp(gc_t - gc_s)) * scale
 *   R  = diag(beta) (V - diag(exp gc) K S)                  (the residual first,
 *   U  = T R                                                 as on the CPU)
 *   O  = diag(scale exp gc) Q S + P U
 *   S  = exp(gL) S + K^T diag(exp(gL - gc)) U
 *
 * Two kernels. The prep kernel, one block per (sequence, chunk, q/k head),
 * forms A and T, which do not depend on the state: the whole grid runs at once
 * and its latency-bound inverse hides behind other blocks. It leaves T, gc,
 * beta, the q and k rstd and their products in a workspace record per (chunk,
 * value head). The state kernel, one block per (sequence, value head, 128
 * columns of V), walks the chunks with its state slice in fp32 registers,
 * fetching chunks ahead by the TMA while it computes. It comes in three forms:
 *
 * - transposed (K = 128, whole 128-column blocks of V, TMA-able tensors): S^T
 *   in the registers of two warpgroups is the A operand of every state
 *   product, straight from registers; q, k, T and P are the B operands in
 *   shared memory (chunk_state_t_kernel);
 * - transposed at K = 256 (64-column blocks of V; the forward's walk over
 *   whole sequences without checkpoints): the same with S^T split over K
 *   between the two warpgroups, their sums over K met in shared memory
 *   (chunk_state_tk_kernel);
 * - general (any K, V, alignment): the state's copy and Ud go through shared
 *   memory as wgmma B operands, the chunk-local products are mma.sync from
 *   ldmatrix fragments (chunk_state_kernel).
 *
 * Products accumulate in fp32 on the tensor cores. With bf16 inputs the state
 * and the update's U enter as hi + lo halves; a single bf16 rounding is too
 * coarse for the bound. Long sequences with few heads are split into segments
 * (DESIGN §8): pass 1 gives each segment's map (P, S_loc; P's columns in
 * extra blocks that start from I with v = 0), a fp32 scan the incoming states,
 * pass 3 the outputs. bench/NOTES.md has the versions and numbers. */
#include <cstring>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include "cuda/chunk_fwd.cuh"

namespace gdn {
namespace cfwd {
/* A tensor map for boxes of 64 rows x box columns of one head of a
 * token-major [rows][heads][cols] tensor of 16-bit elements (tma_rows); false
 * where the TMA cannot take it (unaligned base or row, no driver entry
 * point): cp.async then. Host only, no stream work: capture-safe. */
static PFN_cuTensorMapEncodeTiled_v12000 encoder() {
    static PFN_cuTensorMapEncodeTiled_v12000 enc = nullptr;
    static bool tried = false;
    if (!tried) {
        cudaDriverEntryPointQueryResult q;
        void *fn = nullptr;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            enc = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
        tried = true;
    }
    return enc;
}

bool tile_map(CUtensorMap *m, const void *base, bool bf, int64_t rows, int heads, int cols, int box, bool sw128) {
    const PFN_cuTensorMapEncodeTiled_v12000 enc = encoder();
    /* rows < 2^31: tma_rows takes the row coordinate as a signed 32-bit int */
    if (!enc || rows <= 0 || rows > INT32_MAX || (reinterpret_cast<uintptr_t>(base) & 15) || (cols & 7)) return false;
    const cuuint64_t dim[3] = {(cuuint64_t)cols, (cuuint64_t)heads, (cuuint64_t)rows};
    const cuuint64_t stride[2] = {(cuuint64_t)cols * 2, (cuuint64_t)heads * cols * 2};
    const cuuint32_t bx[3] = {(cuuint32_t)box, 1, CC}, es[3] = {1, 1, 1};
    return enc(m, bf ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3, const_cast<void *>(base), dim,
               stride, bx, es, CU_TENSOR_MAP_INTERLEAVE_NONE, sw128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

bool byte_rows_map(CUtensorMap *m, const void *base, int64_t rows, int box) {
    const PFN_cuTensorMapEncodeTiled_v12000 enc = encoder();
    if (!enc || rows < box || rows > INT32_MAX || box < 1 || box > 256 || (reinterpret_cast<uintptr_t>(base) & 255)) return false;
    const cuuint64_t dim[2] = {128, (cuuint64_t)rows}, stride[1] = {256};
    const cuuint32_t bx[2] = {128, (cuuint32_t)box}, es[2] = {1, 1};
    return enc(m, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, const_cast<void *>(base), dim, stride, bx, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

namespace {

struct WsLayout { size_t recs, seg, total; };
WsLayout ws_layout(const gdn_plan *pl, int sc) {
    const gdn_config *c = &pl->c;
    WsLayout l;
    l.recs = (size_t)(c->B * c->T / CC + pl->N + 1) * c->HV * REC;
    const size_t nseg = (size_t)gdn_cuda_chunk_seg_slots(pl, sc);
    l.seg = nseg * c->HV * (size_t)c->K * c->V * 4;   /* each of seg_s, seg_in; seg_p is K x K */
    l.total = l.recs + 2 * l.seg + nseg * c->HV * (size_t)c->K * c->K * 4;
    return l;
}

/* part (context parallel, cp.cu): WHOLE; FRONT, the prep and pass 1 (the
 * segments' maps: a map's work); BACK, the scan and pass 3 after a FRONT
 * over the same workspace (without segments: the walk alone, after a PREP);
 * PREP, the prep alone (gdn_cuda_chunk_states' stage 1) */
enum Part { WHOLE, FRONT, BACK, PREP };
template <int KT, int BV, typename E>
cudaError_t launch(ChunkArgs p, int64_t rows, int64_t N, int maxch, char *ws, cudaStream_t st, Part part, int *st16) {
    cudaError_t e = PrepPass<KT, E>::attr();
    if (e == cudaSuccess) e = StatePass<KT, BV, E>::attr();
    if (e != cudaSuccess) return e;
    p.nvb_v = (p.V + BV - 1) / BV;
    /* q, k and v by the TMA where the padded rows fit a box (256 columns) */
    TmaMaps tm{};
    const bool bf = mma_traits<E>::bf;
    p.tma = KT + 8 <= 256 && (reinterpret_cast<uintptr_t>(ws) & 15) == 0 && tile_map(&tm.q, p.q, bf, rows, p.H, p.K, KT + 8) &&
            tile_map(&tm.k, p.k, bf, rows, p.H, p.K, KT + 8) && tile_map(&tm.v, p.v, bf, rows, p.HV, p.V, BV + 8);
    /* the transposed kernels' q, k, v by the TMA in the 128-byte swizzle (64-column boxes) */
    TmaMaps tmt{};
    auto maps_t = [&] {
        return (reinterpret_cast<uintptr_t>(ws) & 15) == 0 && tile_map(&tmt.q, p.q, bf, rows, p.H, p.K, 64, true) &&
               tile_map(&tmt.k, p.k, bf, rows, p.H, p.K, 64, true) && tile_map(&tmt.v, p.v, bf, rows, p.HV, p.V, 64, true);
    };
    /* the transposed kernel where K = 128 and V is whole 128-column blocks */
    bool tr = false;
    if constexpr (KT == 128) tr = p.K == 128 && p.V % 128 == 0 && maps_t();
    /* at K = 256 the transposed kernel split over K (whole 64-column blocks of
     * V), for every walk but the split's */
    bool tk = false;
    if constexpr (KT == 256) tk = p.K == 256 && p.V % 64 == 0 && !p.sc && maps_t();
    if (p.smode && p.sc) return cudaErrorNotSupported;   /* the states mode: whole sequences or a window */
    const bool need16 = p.st16 == 2;   /* required: the caller's states area has room for tiles only */
    p.st16 = p.st16 && tr && p.V == 128;   /* the bf16 tiles from the transposed kernel only */
    if (need16 && !p.st16) return cudaErrorNotSupported;   /* before any launch */
    if (!(tr && p.V == 128)) { p.keep = nullptr; p.ktag_val = 0; }   /* the tiles from the transposed kernel only */
    if (st16) *st16 = p.st16;
    if (tr || tk) {
        e = tr ? StateTPass<E>::attr() : StateTKPass<E>::attr();
        if (e != cudaSuccess) return e;
    }
    auto walk = [&](const ChunkArgs &pa, unsigned blocks) {   /* the state pass, in its form */
        return tr ? StateTPass<E>::launch(pa, blocks, ws, tmt, st)
               : tk ? StateTKPass<E>::launch(pa, blocks, ws, tmt, st) : StatePass<KT, BV, E>::launch(pa, blocks, ws, tm, st);
    };
    /* the grids are 1-D: more than 2^31 - 1 blocks is no launch, and the
     * (unsigned) casts below would silently cut 2^32 or more (the prep's grid
     * is dense in maxch: N * H * maxch for varlen with many sequences and one
     * long one); refuse those before anything is queued */
    const int64_t walk_blocks =
        N * p.HV * (p.sc ? (int64_t)((maxch + p.sc - 1) / p.sc) * (p.nvb_v + (p.K + BV - 1) / BV) : p.nvb_v);
    if (N * p.H * maxch > INT32_MAX || walk_blocks > INT32_MAX) return cudaErrorInvalidConfiguration;
    if (maxch > 0 && part != BACK) PrepPass<KT, E>::launch(p, N, maxch, ws, st);
    if (part == PREP) return cudaGetLastError();
    if (!p.sc) {
        p.pass = 0; p.maxseg = 1; p.nvb = p.nvb_v;
        e = walk(p, (unsigned)(N * p.HV * p.nvb));
        return e != cudaSuccess ? e : cudaGetLastError();
    }
    p.maxseg = (maxch + p.sc - 1) / p.sc;
    p.pass = 1; p.nvb = p.nvb_v + (p.K + BV - 1) / BV;
    if (part != BACK) e = walk(p, (unsigned)(N * p.maxseg * p.HV * p.nvb));
    if (e != cudaSuccess || part == FRONT) return e;
    seg_scan_launch(p, N, st);
    p.pass = 3; p.nvb = p.nvb_v;
    walk(p, (unsigned)(N * p.maxseg * p.HV * p.nvb));
    return cudaGetLastError();
}

template <typename E>
cudaError_t launch_k(const ChunkArgs &p, int64_t rows, int64_t N, int maxch, char *ws, cudaStream_t st, Part part, int *st16) {
    if (st16) *st16 = 0;
    if (p.K <= 64) return launch<64, 128, E>(p, rows, N, maxch, ws, st, part, st16);
    if (p.K <= 128) return launch<128, 128, E>(p, rows, N, maxch, ws, st, part, st16);
    return launch<256, 64, E>(p, rows, N, maxch, ws, st, part, st16);
}

/* the kernel arguments of a call; sc chunks per segment (0 = whole sequences) */
ChunkArgs args_of(const gdn_plan *pl, const gdn_fwd_args *a, int sc, void *ws) {
    const gdn_config *c = &pl->c;
    ChunkArgs p;
    p.q = a->q; p.k = a->k; p.v = a->v; p.g = a->g; p.beta = a->beta;
    p.A_log = a->A_log; p.dt_bias = a->dt_bias; p.h0 = a->h0; p.o = a->o; p.ht = a->ht;
    const gdn_saved_layout sl = gdn_saved_at(c, a->saved);
    p.rstd_q = sl.rstd_q; p.rstd_k = sl.rstd_k;
    p.cu = c->cu_seqlens_dev; p.T = c->T;
    p.H = c->H; p.HV = c->HV; p.K = c->K; p.V = c->V; p.G = pl->G; p.gdt = (int)c->gate_dtype;
    p.scale = c->scale; p.flags = c->flags;
    p.st16 = 0;
    p.sc = sc;
    p.lpt = sc ? 0 : longest_first(pl, (int64_t)c->HV * ((c->V + 127) / 128), sm_count());   /* the transposed walk's blocks */
    p.smode = 0;
    p.states = nullptr;
    p.brec = nullptr;
    p.brec16 = 0;
    p.w0 = p.wn = 0;
    p.ckpt = nullptr;   /* gdn_cuda_chunk_fwd sets them where the backward's windows will read them */
    p.ckpt_wn = p.nck = 0;
    p.ckpt_stride = 0;
    p.tag = sl.ckpt_tag;   /* 0 unless the checkpoints or the maps are stored */
    p.tag_val = p.mtag_val = 0;
    p.skip = nullptr;
    p.skip_val = 0;
    p.keep = nullptr;   /* gdn_cuda_chunk_fwd sets them where saved has room for the tiles */
    p.keep_kw = p.ktag_val = 0;
    p.keep_stride = 0;
    p.wskip = nullptr;
    p.wskip_val = 0;
    const WsLayout wl = ws_layout(pl, sc);
    p.seg_s = reinterpret_cast<float *>(static_cast<char *>(ws) + wl.recs);
    p.seg_in = reinterpret_cast<float *>(static_cast<char *>(ws) + wl.recs + wl.seg);
    p.seg_p = reinterpret_cast<float *>(static_cast<char *>(ws) + wl.recs + 2 * wl.seg);
    return p;
}

cudaError_t run(const gdn_plan *pl, const ChunkArgs &p, void *ws, cudaStream_t st, Part part, int *st16 = nullptr) {
    const gdn_config *c = &pl->c;
    const int maxch = p.wn ? p.wn : (int)((pl->max_len + CC - 1) / CC);   /* the prep's chunks a sequence */
    const int64_t rows = c->B * c->T;
    return c->dtype == GDN_BF16 ? launch_k<__nv_bfloat16>(p, rows, pl->N, maxch, (char *)ws, st, part, st16)
                                : launch_k<__half>(p, rows, pl->N, maxch, (char *)ws, st, part, st16);
}

}  // namespace
}  // namespace cfwd
}  // namespace gdn

using namespace gdn::cfwd;

extern "C" size_t gdn_cuda_chunk_fwd_ws(const gdn_plan *pl) {
    return pl->c.dtype == GDN_F32 ? 0 : ws_layout(pl, seg_chunks(pl)).total;
}

extern "C" gdn_status gdn_cuda_chunk_fwd(const gdn_plan *pl, const gdn_fwd_args *a, void *ws, void *stream) {
    const gdn_config *c = &pl->c;
    if (c->dtype == GDN_F32) return gdn_cuda_recurrent_fwd(pl, a, stream);
    if (pl->N * c->HV == 0) return GDN_OK;
    /* the checkpoints of the backward's windows where saved has room for them and the walk is whole */
    const gdn_saved_layout sl = gdn_saved_at(c, a->saved);
    const int sc = sl.maps ? seg_chunks_kept(pl) : seg_chunks(pl);   /* its workspace: seg_chunks' at most */
    ChunkArgs p = args_of(pl, a, sc, ws);
    int64_t wn = 0;
    int tag = 0;
    const int nw = sl.ckpt && !sc ? gdn_cuda_chunk_bwd_windows(pl, &wn, &tag) : 0;
    if (nw >= 2 && nw - 1 <= sl.nck) {
        p.ckpt = sl.ckpt; p.ckpt_wn = (int)wn; p.nck = nw - 1;
        p.ckpt_stride = pl->N * c->HV * (int64_t)c->K * c->V;
        p.tag_val = tag;
        /* and the last windows' states as the fused pass's tiles where saved has room (the walk
         * stores them as it passes: the backward walks only the windows before them again) */
        int ktag = 0;
        const int kw = gdn_cuda_chunk_bwd_kept(pl, &sl, &ktag);
        if (kw < nw) {
            p.keep = reinterpret_cast<float *>(sl.keep);
            p.keep_kw = kw; p.ktag_val = ktag;
            p.keep_stride = pl->N * wn;
        }
    }
    /* the segments' maps of pass 1 into saved where it has room for them: the backward's split
     * takes them where its segments are these (seg_chunks_kept) instead of a pass 1 of its own */
    const int64_t slots = sc ? gdn_cuda_chunk_seg_slots(pl, sc) : 0;
    if (sc && sl.maps && slots <= sl.nmaps) {
        p.seg_p = sl.maps;
        p.seg_s = sl.maps + slots * c->HV * (int64_t)c->K * c->K;
        p.mtag_val = gdn_cuda_maps_tag(sc);
    }
    const cudaError_t e = run(pl, p, ws, (cudaStream_t)stream, WHOLE);
    if (e != cudaSuccess) return gdn_fail(GDN_ERR_BACKEND, "chunk forward kernel launch: %s", cudaGetErrorString(e));
    return GDN_OK;
}

extern "C" size_t gdn_cuda_chunk_states_ws(const gdn_plan *pl, int64_t wn) {
    return wn ? (size_t)pl->N * wn * pl->c.HV * REC : ws_layout(pl, 0).total;
}

extern "C" int gdn_cuda_chunk_states(const gdn_plan *pl, const gdn_fwd_args *a, int64_t w0, int64_t wn, void *ws, float *states,
                                     const int *skip, int skip_val, const int *wskip, int wskip_val, int st16, float *brec, int brec16,
                                     int stage, void *stream) {
    const gdn_config *c = &pl->c;
    if (c->dtype == GDN_F32) return 0;
    if (pl->N * c->HV == 0) return 1;
    gdn_fwd_args b = *a;
    b.o = nullptr; b.saved = nullptr;   /* the rstd recomputed; of the caller's arrays only states and ht written */
    ChunkArgs p = args_of(pl, &b, 0, ws);
    p.smode = 1;
    p.states = states;
    p.w0 = (int)w0; p.wn = (int)wn;
    p.skip = skip; p.skip_val = skip_val;
    p.wskip = wskip; p.wskip_val = wskip_val;
    p.st16 = st16;
    p.brec = c->dtype == GDN_BF16 && c->K == 128 ? brec : nullptr;
    p.brec16 = brec16;
    if (brec && !p.brec) return 0;   /* the backward's records from this prep: bf16, K = 128 only */
    int tiles = 0;
    const cudaError_t e = run(pl, p, ws, (cudaStream_t)stream, stage == 1 ? PREP : stage == 2 ? BACK : WHOLE, &tiles);
    if (e == cudaErrorNotSupported) return 0;
    if (e != cudaSuccess) return gdn_fail(GDN_ERR_BACKEND, "chunk states launch: %s", cudaGetErrorString(e)), -1;
    return tiles ? 2 : 1;
}

extern "C" size_t gdn_cuda_chunk_seg_maps_ws(const gdn_plan *pl, int sc) { return ws_layout(pl, sc).total; }

extern "C" void gdn_cuda_chunk_seg_maps_at(const gdn_plan *pl, int sc, void *ws, float **seg_p, float **seg_s) {
    gdn_fwd_args b;
    memset(&b, 0, sizeof b);
    const ChunkArgs p = args_of(pl, &b, sc, ws);
    *seg_p = p.seg_p;
    *seg_s = p.seg_s;
}

extern "C" int64_t gdn_cuda_chunk_seg_slots(const gdn_plan *pl, int sc) {
    return sc ? pl->c.B * pl->c.T / ((int64_t)CC * sc) + pl->N + 1 : 0;   /* as ws_layout counts them */
}

extern "C" int gdn_cuda_maps_tag(int sc) { return 0x47530000 | (sc & 0xffff); }

extern "C" gdn_status gdn_cuda_chunk_seg_maps(const gdn_plan *pl, const gdn_fwd_args *a, int sc, void *ws, float **seg_p,
                                              float **seg_s, const int *skip, int skip_val, void *stream) {
    gdn_fwd_args b = *a;
    b.o = nullptr; b.ht = nullptr; b.saved = nullptr; b.h0 = nullptr;   /* pass 1 writes none of them */
    ChunkArgs p = args_of(pl, &b, sc, ws);
    p.skip = skip; p.skip_val = skip_val;
    *seg_p = p.seg_p;
    *seg_s = p.seg_s;
    if (pl->max_len == 0) return GDN_OK;
    const cudaError_t e = run(pl, p, ws, (cudaStream_t)stream, FRONT);
    if (e != cudaSuccess) return gdn_fail(GDN_ERR_BACKEND, "context-parallel segment maps launch: %s", cudaGetErrorString(e));
    return GDN_OK;
}

extern "C" int gdn_cuda_chunk_fwd_split(const gdn_plan *pl) { return pl->c.dtype == GDN_F32 ? 0 : seg_chunks(pl); }

extern "C" gdn_status gdn_cuda_chunk_fwd_part(const gdn_plan *pl, const gdn_fwd_args *a, void *ws, int back, float **seg_p,
                                              float **seg_s, void *stream) {
    const ChunkArgs p = args_of(pl, a, seg_chunks(pl), ws);
    if (seg_p) { *seg_p = p.seg_p; *seg_s = p.seg_s; }
    if (pl->N * pl->c.HV == 0) return GDN_OK;
    const cudaError_t e = run(pl, p, ws, (cudaStream_t)stream, back ? BACK : FRONT);
    if (e != cudaSuccess) return gdn_fail(GDN_ERR_BACKEND, "chunk forward kernel launch: %s", cudaGetErrorString(e));
    return GDN_OK;
}
