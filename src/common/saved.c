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

/* bytes of the rstd rows, and where the checkpoints' tag starts after them */
static size_t rstd_bytes(const gdn_config *c) { return (size_t)(2 * c->B * c->T * c->H) * sizeof(float); }
static size_t tag_at(const gdn_config *c) { return (rstd_bytes(c) + 255) / 256 * 256; }

size_t gdn_saved_bytes(const gdn_config *c) {
    if (!(c->flags & GDN_QK_L2NORM)) return 0;
    const int nck = gdn_saved_ckpts(c);
    if (!nck) return rstd_bytes(c);
    const int64_t N = c->cu_seqlens ? c->num_seqs : c->B;
    return tag_at(c) + 256 + (size_t)nck * N * c->HV * c->K * c->V * sizeof(float);
}

gdn_saved_layout gdn_saved_at(const gdn_config *c, void *saved) {
    gdn_saved_layout l = {0};
    if (!saved || !(c->flags & GDN_QK_L2NORM)) return l;
    l.rstd_q = (float *)saved;
    l.rstd_k = l.rstd_q + c->B * c->T * c->H;
    if ((l.nck = gdn_saved_ckpts(c))) {
        l.ckpt_tag = (int *)((char *)saved + tag_at(c));
        l.ckpt = (float *)((char *)saved + tag_at(c) + 256);
    }
    return l;
}
