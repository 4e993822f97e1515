/* The API layer of the chunked and recurrent forward and the chunked
 * backward: sizes of the saved buffer and the workspaces, argument checks,
 * dispatch to the CPU or CUDA backend. */
#include <math.h>
#include <string.h>
#include "api/api.h"
#include "cpu/cpu_backend.h"
#ifdef GDN_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

#define CHECK GDN_CHECK
#define NEED GDN_NEED
#define valid_dtype gdn_valid_dtype
#define make_plan gdn_make_plan

size_t gdn_chunk_saved_size(const gdn_config *cfg) {
    gdn_plan p;
    if (make_plan(NULL, cfg, &p)) return 0;
    gdn_ok();
    return gdn_saved_bytes(cfg);
}

/* forward workspace of the backend that runs the call */
static size_t chunk_fwd_ws(const gdn_exec *ex, const gdn_plan *p) {
#ifdef GDN_HAVE_CUDA
    if (gdn_exec_backend(ex) == GDN_BACKEND_CUDA) return gdn_cuda_chunk_fwd_ws(p);
#endif
    return gdn_exec_backend(ex) == GDN_BACKEND_CPU ? gdn_cpu_chunk_fwd_ws(p) : 0;
}

size_t gdn_chunk_fwd_workspace_size(const gdn_exec *ex, const gdn_config *cfg) {
    gdn_plan p;
    if (make_plan(ex, cfg, &p)) return 0;
    gdn_ok();
    return chunk_fwd_ws(ex, &p);
}

/* backward workspace of the backend that runs the call */
static size_t chunk_bwd_ws(const gdn_exec *ex, const gdn_plan *p) {
#ifdef GDN_HAVE_CUDA
    if (gdn_exec_backend(ex) == GDN_BACKEND_CUDA) return gdn_cuda_chunk_bwd_ws(p);
#endif
    return gdn_exec_backend(ex) == GDN_BACKEND_CPU ? gdn_cpu_chunk_bwd_ws(p) : 0;
}

size_t gdn_chunk_bwd_workspace_size(const gdn_exec *ex, const gdn_config *cfg) {
    gdn_plan p;
    if (make_plan(ex, cfg, &p)) return 0;
    gdn_ok();
    return chunk_bwd_ws(ex, &p);
}

/* ---- the CUDA kernels' alignment (gdn.h, "The CUDA backend") ---- */

#define ROWS16_Q "K is a multiple of 8: the chunk kernels load its rows 16 bytes at a time (cp.async, the TMA)"
#define ROWS16_V "V is a multiple of 8: the chunk kernels load its rows 16 bytes at a time (cp.async, the TMA)"
#define ROWS16_O "V is a multiple of 8: the chunk kernels store its rows 16 bytes at a time"
#define ROWS16_DQK "K is a multiple of 8: the chunk kernels store its rows 16 bytes at a time"

/* the pointers of the forward (chunked: gdn_chunk_fwd, else gdn_recurrent_fwd) */
gdn_status gdn_cuda_align_fwd(const gdn_exec *ex, const gdn_plan *p, const gdn_fwd_args *a, int chunked) {
    const gdn_config *c = &p->c;
    const size_t es = gdn_dtype_size(c->dtype), gs = gdn_dtype_size(c->gate_dtype);
    /* bf16 / f16 chunk forward: the tensor-core kernels, rows in 16-byte pieces
     * where the row length allows (f32 takes the recurrent kernel: elements) */
    const int tc = chunked && c->dtype != GDN_F32, qk16 = tc && c->K % 8 == 0, v16 = tc && c->V % 8 == 0;
    GDN_ALIGNED(a->q, qk16 ? 16 : es, qk16 ? ROWS16_Q : GDN_ELEM);
    GDN_ALIGNED(a->k, qk16 ? 16 : es, qk16 ? ROWS16_Q : GDN_ELEM);
    GDN_ALIGNED(a->v, v16 ? 16 : es, v16 ? ROWS16_V : GDN_ELEM);
    GDN_ALIGNED(a->o, v16 ? 16 : es, v16 ? ROWS16_O : GDN_ELEM);
    GDN_ALIGNED(a->g, gs, GDN_ELEM);
    GDN_ALIGNED(a->beta, gs, GDN_ELEM);
    GDN_ALIGNED(a->A_log, 4, GDN_ELEM);
    GDN_ALIGNED(a->dt_bias, 4, GDN_ELEM);
    GDN_ALIGNED(a->h0, 4, GDN_ELEM);
    GDN_ALIGNED(a->ht, 4, GDN_ELEM);
    if (chunked) {
        if (gdn_saved_bytes(c)) GDN_ALIGNED(a->saved, 4, GDN_ELEM);
        if (chunk_fwd_ws(ex, p))
            GDN_ALIGNED(a->workspace, 16, "the chunk kernels move its records 16 bytes at a time (cp.async, bulk copies)");
    }
    if (c->cu_seqlens) GDN_ALIGNED(c->cu_seqlens_dev, 8, GDN_ELEM);
    return GDN_OK;
}

gdn_status gdn_cuda_align_bwd(const gdn_exec *ex, const gdn_plan *p, const gdn_bwd_args *a) {
    const gdn_config *c = &p->c;
    const size_t es = gdn_dtype_size(c->dtype), gs = gdn_dtype_size(c->gate_dtype);
    /* bf16 / f16: the forward's rule for q, k, v, and the same for the rows the
     * backward reads and writes beside them (its workspace is sized for the
     * kernels that take 16-byte rows: the fused pass keeps no state gradients) */
    const int tc = c->dtype != GDN_F32, qk16 = tc && c->K % 8 == 0, v16 = tc && c->V % 8 == 0;
    GDN_ALIGNED(a->q, qk16 ? 16 : es, qk16 ? ROWS16_Q : GDN_ELEM);
    GDN_ALIGNED(a->k, qk16 ? 16 : es, qk16 ? ROWS16_Q : GDN_ELEM);
    GDN_ALIGNED(a->v, v16 ? 16 : es, v16 ? ROWS16_V : GDN_ELEM);
    GDN_ALIGNED(a->dout, v16 ? 16 : es, v16 ? ROWS16_V : GDN_ELEM);
    GDN_ALIGNED(a->dq, qk16 ? 16 : es, qk16 ? ROWS16_DQK : GDN_ELEM);
    GDN_ALIGNED(a->dk, qk16 ? 16 : es, qk16 ? ROWS16_DQK : GDN_ELEM);
    GDN_ALIGNED(a->dv, v16 ? 16 : es, v16 ? ROWS16_O : GDN_ELEM);
    GDN_ALIGNED(a->g, gs, GDN_ELEM);
    GDN_ALIGNED(a->beta, gs, GDN_ELEM);
    GDN_ALIGNED(a->dg, gs, GDN_ELEM);
    GDN_ALIGNED(a->dbeta, gs, GDN_ELEM);
    GDN_ALIGNED(a->A_log, 4, GDN_ELEM);
    GDN_ALIGNED(a->dt_bias, 4, GDN_ELEM);
    GDN_ALIGNED(a->h0, 4, GDN_ELEM);
    GDN_ALIGNED(a->dht, 4, GDN_ELEM);
    GDN_ALIGNED(a->dA_log, 4, GDN_ELEM);
    GDN_ALIGNED(a->ddt_bias, 4, GDN_ELEM);
    GDN_ALIGNED(a->dh0, 4, GDN_ELEM);
    if (gdn_saved_bytes(c)) GDN_ALIGNED(a->saved, 4, GDN_ELEM);
    if (chunk_bwd_ws(ex, p))   /* 8 would do (int64 and double records); 16 as every CUDA workspace */
        GDN_ALIGNED(a->workspace, 16, "every CUDA workspace is; the backward keeps 8-byte int64 and double records in it");
    if (c->cu_seqlens) GDN_ALIGNED(c->cu_seqlens_dev, 8, GDN_ELEM);
    return GDN_OK;
}

/* ---- forward ---- */

static gdn_status check_fwd_args(const gdn_exec *ex, const gdn_plan *p, const gdn_fwd_args *a, int chunked) {
    NEED(a, "");
    const unsigned f = p->c.flags;
    if (p->c.B * p->c.T > 0) {   /* token tensors may be NULL when there are no tokens */
        NEED(a->q, ""); NEED(a->k, ""); NEED(a->v, ""); NEED(a->beta, ""); NEED(a->o, "");
        if (f & GDN_GATE_FUSED) NEED(a->g, " (raw gate a, GDN_GATE_FUSED is set)");
    }
    if (f & GDN_GATE_FUSED) NEED(a->A_log, " (GDN_GATE_FUSED is set)");
    if (chunked) {
        size_t need = chunk_fwd_ws(ex, p);
        CHECK(need == 0 || a->workspace, GDN_ERR_NULL, "workspace is NULL but %zu bytes are needed", need);
        CHECK(a->workspace_bytes >= need, GDN_ERR_WORKSPACE, "workspace_bytes (%zu) is less than the %zu bytes needed",
              a->workspace_bytes, need);
        size_t sv = gdn_saved_bytes(&p->c);
        CHECK(!a->saved || a->saved_bytes >= sv, GDN_ERR_WORKSPACE, "saved_bytes (%zu) is less than the %zu bytes needed",
              a->saved_bytes, sv);
    }
    CHECK(gdn_exec_backend(ex) != GDN_BACKEND_CUDA || !p->c.cu_seqlens || p->c.cu_seqlens_dev, GDN_ERR_NULL,
          "cu_seqlens_dev is NULL but required (CUDA backend with cu_seqlens)");
    if (gdn_exec_backend(ex) == GDN_BACKEND_CUDA) return gdn_cuda_align_fwd(ex, p, a, chunked);
    return GDN_OK;
}

gdn_status gdn_chunk_fwd_check(const gdn_exec *ex, const gdn_config *cfg, const gdn_fwd_args *a, gdn_plan *p) {
    gdn_status s = make_plan(ex, cfg, p);
    if (!s) s = check_fwd_args(ex, p, a, 1);
    return s;
}

gdn_status gdn_chunk_fwd(const gdn_exec *ex, const gdn_config *cfg, const gdn_fwd_args *a) {
    gdn_plan p;
    gdn_status s = gdn_chunk_fwd_check(ex, cfg, a, &p);
    if (s) return s;
    if (gdn_exec_backend(ex) == GDN_BACKEND_CUDA) {
#ifdef GDN_HAVE_CUDA
        if ((s = gdn_cuda_chunk_fwd(&p, a, a->workspace, ex->stream))) return s;
        return gdn_ok();
#endif
    }
    gdn_cpu_chunk_fwd(&p, a);
    return gdn_ok();
}

gdn_status gdn_recurrent_fwd(const gdn_exec *ex, const gdn_config *cfg, const gdn_fwd_args *a) {
    gdn_plan p;
    gdn_status s = make_plan(ex, cfg, &p);
    if (!s) s = check_fwd_args(ex, &p, a, 0);
    if (s) return s;
    if (gdn_exec_backend(ex) == GDN_BACKEND_CUDA) {
#ifdef GDN_HAVE_CUDA
        gdn_fwd_args ra = *a;
        ra.saved = NULL;   /* ignored by the recurrent call; the CUDA kernel would write rstd there */
        if ((s = gdn_cuda_recurrent_fwd(&p, &ra, ex->stream))) return s;
        return gdn_ok();
#endif
    }
    gdn_cpu_recurrent_fwd(&p, a);
    return gdn_ok();
}

/* ---- backward ---- */

gdn_status gdn_chunk_bwd_check(const gdn_exec *ex, const gdn_config *cfg, const gdn_bwd_args *a, gdn_plan *pp) {
    gdn_plan p;
    gdn_status s = make_plan(ex, cfg, &p);
    if (s) return s;
    NEED(a, "");
    const unsigned f = p.c.flags;
    if (p.c.B * p.c.T > 0) {
        NEED(a->q, ""); NEED(a->k, ""); NEED(a->v, ""); NEED(a->beta, ""); NEED(a->dout, "");
        NEED(a->dq, ""); NEED(a->dk, ""); NEED(a->dv, ""); NEED(a->dbeta, "");
        if (f & GDN_GATE_FUSED) NEED(a->g, " (raw gate a, GDN_GATE_FUSED is set)");
        if (a->g) NEED(a->dg, " (a gate input is given)");
    }
    if (f & GDN_GATE_FUSED) { NEED(a->A_log, " (GDN_GATE_FUSED is set)"); NEED(a->dA_log, " (GDN_GATE_FUSED is set)"); }
    size_t sv = gdn_saved_bytes(&p.c);
    if (sv && p.c.B * p.c.T > 0) {
        NEED(a->saved, " (GDN_QK_L2NORM is set: pass what gdn_chunk_fwd saved)");
        CHECK(a->saved_bytes >= sv, GDN_ERR_WORKSPACE, "saved_bytes (%zu) is less than the %zu bytes needed",
              a->saved_bytes, sv);
    }
    CHECK(gdn_exec_backend(ex) != GDN_BACKEND_CUDA || !p.c.cu_seqlens || p.c.cu_seqlens_dev, GDN_ERR_NULL,
          "cu_seqlens_dev is NULL but required (CUDA backend with cu_seqlens)");
    if (gdn_exec_backend(ex) == GDN_BACKEND_CUDA && (s = gdn_cuda_align_bwd(ex, &p, a))) return s;
    *pp = p;
    return GDN_OK;
}

gdn_status gdn_chunk_bwd(const gdn_exec *ex, const gdn_config *cfg, const gdn_bwd_args *a) {
    gdn_plan p;
    gdn_status s = gdn_chunk_bwd_check(ex, cfg, a, &p);
    if (s) return s;
    size_t need = chunk_bwd_ws(ex, &p);
    CHECK(need == 0 || a->workspace, GDN_ERR_NULL, "workspace is NULL but %zu bytes are needed", need);
    CHECK(a->workspace_bytes >= need, GDN_ERR_WORKSPACE, "workspace_bytes (%zu) is less than the %zu bytes needed",
          a->workspace_bytes, need);
    if (gdn_exec_backend(ex) == GDN_BACKEND_CUDA) {
#ifdef GDN_HAVE_CUDA
        if ((s = gdn_cuda_chunk_bwd(&p, a, a->workspace, ex->stream))) return s;
        return gdn_ok();
#endif
    }
    gdn_cpu_chunk_bwd(&p, a);
    return gdn_ok();
}
