/* Where the forward keeps what the backward reads (the "saved" buffer). */
#include "common/common.h"

/* ---- saved-for-backward ---- */

/* Checkpoints for the CUDA backward's windows of chunks (src/cuda/chunk_bwd.cu
 * window_chunks: at most four windows, so the states entering the last three),
 * kept where a window can apply whatever the card: 16-bit inputs, K <= 128 with
 * HV <= 8 H or K <= 256 with HV <= 4 H (the chunk-local stage's clusters),
 * sequences of near one length (4 N maxch <= 5 chunks) and half the chunks at
 * least 4096 (sequence, chunk, value head) items. 0 elsewhere. */
int gdn_saved_ckpts(const gdn_config *c) {
    if (!(c->flags & GDN_QK_L2NORM) || c->dtype == GDN_F32 || c->K > 256 || c->H <= 0 || c->HV > (c->K > 128 ? 4 : 8) * c->H)
        return 0;
    const int64_t N = c->cu_seqlens ? c->num_seqs : c->B;
    int64_t maxch = 0, total = 0;
    for (int64_t n = 0; n < N; n++) {
        const int64_t len = c->cu_seqlens ? c->cu_seqlens[n + 1] - c->cu_seqlens[n] : c->T, ch = (len + 63) / 64;
        total += ch;
        if (ch > maxch) maxch = ch;
    }
    if (maxch < 2 || 4 * N * maxch > 5 * total || N * c->HV * (maxch / 2) < 4096) return 0;
    return 3;
}

/* Segment slots of the forward's pass-1 maps kept for the CUDA backward's
 * sequence split (src/cuda/chunk_bwd.cu split_sc: recomputing them is ~1/8 of
 * long1's backward), where that split can happen on a card of up to MAP_SMS
 * SMs: bf16 / f16 with the L2 norm, at most MAP_SMS / 2 (sequence, value head)
 * blocks, sequences of 16 chunks or more. The count bounds the slots of any
 * split the backward picks itself there (at least maxch N HV / MAP_SMS chunks
 * a segment, 8 at least: B T / (64 sc) + N + 1 slots, as the CUDA forward
 * counts them); a split forced by exec.seq_split into more slots recomputes
 * its maps. 0 elsewhere. */
#define MAP_SMS 160
int64_t gdn_saved_maps(const gdn_config *c) {
    if (!(c->flags & GDN_QK_L2NORM) || c->dtype == GDN_F32 || c->H <= 0) return 0;
    const int64_t N = c->cu_seqlens ? c->num_seqs : c->B;
    int64_t maxch = 0;
    for (int64_t n = 0; n < N; n++) {
        const int64_t len = c->cu_seqlens ? c->cu_seqlens[n + 1] - c->cu_seqlens[n] : c->T, ch = (len + 63) / 64;
        if (ch > maxch) maxch = ch;
    }
    if (maxch < 16 || 2 * N * c->HV > MAP_SMS) return 0;
    int64_t sc = (maxch * N * c->HV + MAP_SMS - 1) / MAP_SMS;
    if (sc < 8) sc = 8;
    if (sc >= maxch) return 0;
    return c->B * c->T / (64 * sc) + N + 1;
}

/* Chunks a (sequence, value head) of the CUDA forward's state tiles kept for
 * the backward's last windows (src/cuda/chunk_bwd.cu kept_windows: the
 * fused pass reads them there instead of walking those windows' states
 * again), where the checkpoints are kept and the fused pass runs: bf16,
 * K = V = 128, HV <= 4 H. Room for half the chunks and 8 more (the windows
 * are a quarter or a half of the chunks, up to 7 chunks longer); 0
 * elsewhere. Each tile is the state entering a chunk as bf16 (32 KB). */
int64_t gdn_saved_keep(const gdn_config *c) {
    if (!gdn_saved_ckpts(c) || c->dtype != GDN_BF16 || c->K != 128 || c->V != 128 || c->HV > 4 * c->H) return 0;
    const int64_t N = c->cu_seqlens ? c->num_seqs : c->B;
    int64_t maxch = 0;
    for (int64_t n = 0; n < N; n++) {
        const int64_t len = c->cu_seqlens ? c->cu_seqlens[n + 1] - c->cu_seqlens[n] : c->T, ch = (len + 63) / 64;
        if (ch > maxch) maxch = ch;
    }
    return (maxch + 1) / 2 + 8;
}
#define KEEP_TILE 32768

/* bytes of the rstd rows, and where the tag block starts after them */
static size_t rstd_bytes(const gdn_config *c) { return (size_t)(2 * c->B * c->T * c->H) * sizeof(float); }
static size_t tag_at(const gdn_config *c) { return (rstd_bytes(c) + 255) / 256 * 256; }
static size_t ckpt_bytes(const gdn_config *c, int nck) {
    const int64_t N = c->cu_seqlens ? c->num_seqs : c->B;
    return (size_t)nck * N * c->HV * c->K * c->V * sizeof(float);
}

/* the end of the maps' room, and where the kept tiles start: the next 256 bytes (the TMA's rows) */
static size_t maps_end(const gdn_config *c, int nck, int64_t nmaps) {
    return tag_at(c) + 256 + ckpt_bytes(c, nck) + (size_t)nmaps * c->HV * ((size_t)c->K * c->K + (size_t)c->K * c->V) * sizeof(float);
}
static size_t keep_at(const gdn_config *c, int nck, int64_t nmaps) { return (maps_end(c, nck, nmaps) + 255) / 256 * 256; }

size_t gdn_saved_bytes(const gdn_config *c) {
    if (!(c->flags & GDN_QK_L2NORM)) return 0;
    const int nck = gdn_saved_ckpts(c);
    const int64_t nmaps = gdn_saved_maps(c);
    if (!nck && !nmaps) return rstd_bytes(c);
    const int64_t nkeep = gdn_saved_keep(c), N = c->cu_seqlens ? c->num_seqs : c->B;
    return nkeep ? keep_at(c, nck, nmaps) + (size_t)nkeep * N * c->HV * KEEP_TILE : maps_end(c, nck, nmaps);
}

gdn_saved_layout gdn_saved_at(const gdn_config *c, void *saved) {
    gdn_saved_layout l = {0};
    if (!saved || !(c->flags & GDN_QK_L2NORM)) return l;
    l.rstd_q = (float *)saved;
    l.rstd_k = l.rstd_q + c->B * c->T * c->H;
    l.nck = gdn_saved_ckpts(c);
    l.nmaps = gdn_saved_maps(c);
    if (l.nck || l.nmaps) {
        l.ckpt_tag = (int *)((char *)saved + tag_at(c));
        if (l.nck) l.ckpt = (float *)((char *)saved + tag_at(c) + 256);
        if (l.nmaps) l.maps = (float *)((char *)saved + tag_at(c) + 256 + ckpt_bytes(c, l.nck));
        l.nkeep = gdn_saved_keep(c);
        if (l.nkeep) l.keep = (char *)saved + keep_at(c, l.nck, l.nmaps);
    }
    return l;
}
