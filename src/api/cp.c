/* The API layer of context parallel (include/gdn.h, DESIGN.md §8): the map
 * size, the workspace sizes, the checks of the gdn_cp_config and of each
 * call's arguments, then the CPU backend. Every check runs before anything
 * is written. On the CUDA backend every pointer is device memory (the maps
 * too) and the calls queue on the exec's stream. */
#include <string.h>
#include "api/api.h"
#include "cpu/cp.h"
#include "cpu/cpu_backend.h"
#ifdef GDN_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

#define CHECK GDN_CHECK
#define NEED GDN_NEED

/* the config, the exec and the cp description; fills the plan */
static gdn_status cp_plan(const gdn_exec *ex, const gdn_config *cfg, const gdn_cp_config *cp, gdn_plan *p) {
    gdn_status s = gdn_make_plan(ex, cfg, p);
    if (s) return s;
    NEED(cp, " (the gdn_cp_config)");
    CHECK(cfg->B == 1, GDN_ERR_SHAPE, "B (%lld) must be 1 under context parallel (one token stream per rank: "
          "pack the batch with cu_seqlens)", (long long)cfg->B);
    CHECK(cp->world >= 1, GDN_ERR_OPTION, "cp->world (%d) must be >= 1", cp->world);
    CHECK(cp->rank >= 0 && cp->rank < cp->world, GDN_ERR_OPTION, "cp->rank (%d) must be in 0..world-1 (world is %d)",
          cp->rank, cp->world);
    CHECK(cp->first_continues == 0 || cp->first_continues == 1, GDN_ERR_OPTION, "cp->first_continues (%d) must be 0 or 1",
          cp->first_continues);
    CHECK(cp->last_continues == 0 || cp->last_continues == 1, GDN_ERR_OPTION, "cp->last_continues (%d) must be 0 or 1",
          cp->last_continues);
    CHECK(!cp->first_continues || cp->rank > 0, GDN_ERR_OPTION,
          "cp->first_continues is 1 on rank 0 (no earlier rank to continue from)");
    CHECK(!cp->last_continues || cp->rank < cp->world - 1, GDN_ERR_OPTION,
          "cp->last_continues is 1 on the last rank (%d of world %d: no later rank to continue into)", cp->rank,
          cp->world);
    return GDN_OK;
}

static int on_cuda(const gdn_exec *ex) { return gdn_exec_backend(ex) == GDN_BACKEND_CUDA; }

/* the backend's workspace bytes (the plan and cp checked) */
static size_t backend_ws(const gdn_exec *ex, const gdn_plan *p, const gdn_cp_config *cp, int backward) {
#ifdef GDN_HAVE_CUDA
    if (on_cuda(ex)) return backward ? gdn_cuda_cp_bwd_map_ws(p, cp) : gdn_cuda_cp_fwd_map_ws(p, cp);
#else
    (void)ex;
#endif
    return backward ? gdn_cpu_cp_bwd_map_ws(p, cp) : gdn_cpu_cp_fwd_map_ws(p, cp);
}

/* CUDA: cu_seqlens_dev where there are cu_seqlens (the kernels read the span
 * from the host copy; the regular calls of the flow need the device one) and
 * the 16-byte workspace every CUDA kernel takes */
static gdn_status cuda_checks(const gdn_exec *ex, const gdn_plan *p, const void *ws) {
    if (!on_cuda(ex)) return GDN_OK;
    CHECK(!p->c.cu_seqlens || p->c.cu_seqlens_dev, GDN_ERR_NULL, "cu_seqlens_dev is NULL but required (CUDA backend with cu_seqlens)");
    if (ws) GDN_ALIGNED(ws, 16, "every CUDA workspace is");
    return GDN_OK;
}

static size_t map_floats(const gdn_plan *p) {
    return (size_t)p->c.HV * ((size_t)p->c.K * p->c.K + (size_t)p->c.K * p->c.V);
}

size_t gdn_cp_map_floats(const gdn_config *cfg) {
    gdn_plan p;
    if (gdn_make_plan(NULL, cfg, &p)) return 0;
    gdn_ok();
    return map_floats(&p);
}

static size_t ws_size(const gdn_exec *ex, const gdn_config *cfg, const gdn_cp_config *cp, int backward) {
    gdn_plan p;
    if (cp_plan(ex, cfg, cp, &p)) return 0;
    gdn_ok();
    return backend_ws(ex, &p, cp, backward);
}

size_t gdn_cp_fwd_map_workspace_size(const gdn_exec *ex, const gdn_config *cfg, const gdn_cp_config *cp) {
    return ws_size(ex, cfg, cp, 0);
}

size_t gdn_cp_bwd_map_workspace_size(const gdn_exec *ex, const gdn_config *cfg, const gdn_cp_config *cp) {
    return ws_size(ex, cfg, cp, 1);
}

static gdn_status check_ws(void *ws, size_t bytes, size_t need) {
    CHECK(need == 0 || ws, GDN_ERR_NULL, "workspace is NULL but %zu bytes are needed", need);
    CHECK(bytes >= need, GDN_ERR_WORKSPACE, "workspace_bytes (%zu) is less than the %zu bytes needed", bytes, need);
    return GDN_OK;
}

/* the inputs a forward map reads (gdn_cp_fwd_map, gdn_cp_fwd_begin) */
static gdn_status check_fwd_map_args(const gdn_plan *p, const gdn_fwd_args *a, const float *map) {
    NEED(a, "");
    NEED(map, " (gdn_cp_map_floats() floats)");
    const unsigned f = p->c.flags;
    if (p->c.T > 0) {
        NEED(a->q, ""); NEED(a->k, ""); NEED(a->v, ""); NEED(a->beta, "");
        if (f & GDN_GATE_FUSED) NEED(a->g, " (raw gate a, GDN_GATE_FUSED is set)");
    }
    if (f & GDN_GATE_FUSED) NEED(a->A_log, " (GDN_GATE_FUSED is set)");
    return GDN_OK;
}

/* the inputs a backward map reads (gdn_cp_bwd_map; gdn_cp_bwd_begin with
 * need_saved: saved as gdn_chunk_bwd wants it, not optional) */
static gdn_status check_bwd_map_args(const gdn_plan *p, const gdn_bwd_args *a, const float *fwd_map, const float *bmap,
                                     int need_saved) {
    NEED(a, "");
    NEED(bmap, " (gdn_cp_map_floats() floats)");
    const unsigned f = p->c.flags;
    if (p->c.T > 0) {
        NEED(a->q, ""); NEED(a->k, ""); NEED(a->v, ""); NEED(a->beta, ""); NEED(a->dout, "");
        if (f & GDN_GATE_FUSED) NEED(a->g, " (raw gate a, GDN_GATE_FUSED is set)");
    }
    if (f & GDN_GATE_FUSED) NEED(a->A_log, " (GDN_GATE_FUSED is set)");
    const size_t sv = gdn_saved_bytes(&p->c);
    if (need_saved && sv && p->c.T > 0) NEED(a->saved, " (GDN_QK_L2NORM is set: pass what gdn_chunk_fwd saved)");
    CHECK(!a->saved || !sv || a->saved_bytes >= sv, GDN_ERR_WORKSPACE,
          "saved_bytes (%zu) is less than the %zu bytes needed", a->saved_bytes, sv);
    CHECK(!fwd_map || fwd_map != bmap, GDN_ERR_OPTION, "fwd_map and bmap are the same buffer (bmap is written)");
    return GDN_OK;
}

gdn_status gdn_cp_fwd_map(const gdn_exec *ex, const gdn_config *cfg, const gdn_cp_config *cp,
                          const gdn_fwd_args *a, float *map) {
    gdn_plan p;
    gdn_status s = cp_plan(ex, cfg, cp, &p);
    if (s) return s;
    if ((s = check_fwd_map_args(&p, a, map))) return s;
    if ((s = cuda_checks(ex, &p, a->workspace))) return s;
    if ((s = check_ws(a->workspace, a->workspace_bytes, backend_ws(ex, &p, cp, 0)))) return s;
    if (on_cuda(ex) && (s = gdn_cuda_align_fwd(ex, &p, a, 1))) return s;
#ifdef GDN_HAVE_CUDA
    if (on_cuda(ex)) {
        if ((s = gdn_cuda_cp_fwd_map(&p, cp, a, map, ex->stream))) return s;
        return gdn_ok();
    }
#endif
    gdn_cpu_cp_fwd_map(&p, cp, a, map);
    return gdn_ok();
}

gdn_status gdn_cp_bwd_map(const gdn_exec *ex, const gdn_config *cfg, const gdn_cp_config *cp,
                          const gdn_bwd_args *a, const float *fwd_map, float *bmap) {
    gdn_plan p;
    gdn_status s = cp_plan(ex, cfg, cp, &p);
    if (s) return s;
    if ((s = check_bwd_map_args(&p, a, fwd_map, bmap, 0))) return s;
    if ((s = cuda_checks(ex, &p, a->workspace))) return s;
    if ((s = check_ws(a->workspace, a->workspace_bytes, backend_ws(ex, &p, cp, 1)))) return s;
    if (on_cuda(ex) && (s = gdn_cuda_align_bwd(ex, &p, a))) return s;
#ifdef GDN_HAVE_CUDA
    if (on_cuda(ex)) {
        if ((s = gdn_cuda_cp_bwd_map(&p, cp, a, fwd_map, bmap, ex->stream))) return s;
        return gdn_ok();
    }
#endif
    gdn_cpu_cp_bwd_map(&p, cp, a, fwd_map, bmap);
    return gdn_ok();
}

static gdn_status scan_call(const gdn_exec *ex, const gdn_config *cfg, const gdn_cp_config *cp, const float *maps,
                            float *out, int backward) {
    gdn_plan p;
    gdn_status s = cp_plan(ex, cfg, cp, &p);
    if (s) return s;
    if (cp->world > 1) NEED(maps, " (the maps of every rank, gathered in rank order)");
    if ((s = cuda_checks(ex, &p, NULL))) return s;
    CHECK(out != NULL, GDN_ERR_NULL, "%s is NULL but required (HV*K*V floats)", backward ? "dS_out" : "S_in");
#ifdef GDN_HAVE_CUDA
    if (on_cuda(ex)) {
        if ((s = gdn_cuda_cp_scan(&p, cp, maps, out, backward, ex->stream))) return s;
        return gdn_ok();
    }
#endif
    if (backward) gdn_cpu_cp_bwd_scan(&p, cp, maps, out);
    else gdn_cpu_cp_fwd_scan(&p, cp, maps, out);
    return gdn_ok();
}

gdn_status gdn_cp_fwd_scan(const gdn_exec *ex, const gdn_config *cfg, const gdn_cp_config *cp, const float *maps,
                           float *S_in) {
    return scan_call(ex, cfg, cp, maps, S_in, 0);
}

gdn_status gdn_cp_bwd_scan(const gdn_exec *ex, const gdn_config *cfg, const gdn_cp_config *cp, const float *maps,
                           float *dS_out) {
    return scan_call(ex, cfg, cp, maps, dS_out, 1);
}

/* ---- steps 5 and 8 with their work shared ---- */

/* CPU: the map's workspace, or [dht + dS_out: N*HV*K*V floats][the backward's] */
static size_t pair_cpu_ws(const gdn_plan *p, const gdn_cp_config *cp) {
    const size_t dht = ((size_t)p->N * p->c.HV * p->c.K * p->c.V * sizeof(float) + 255) / 256 * 256;
    const size_t m = gdn_cpu_cp_bwd_map_ws(p, cp), f = dht + gdn_cpu_chunk_bwd_ws(p);
    return m > f ? m : f;
}

static size_t pair_ws(const gdn_exec *ex, const gdn_plan *p, const gdn_cp_config *cp) {
#ifdef GDN_HAVE_CUDA
    if (on_cuda(ex)) return gdn_cuda_cp_bwd_ws(p, cp);
#else
    (void)ex;
#endif
    return pair_cpu_ws(p, cp);
}

size_t gdn_cp_bwd_workspace_size(const gdn_exec *ex, const gdn_config *cfg, const gdn_cp_config *cp) {
    gdn_plan p;
    if (cp_plan(ex, cfg, cp, &p)) return 0;
    gdn_ok();
    return pair_ws(ex, &p, cp);
}

gdn_status gdn_cp_bwd_begin(const gdn_exec *ex, const gdn_config *cfg, const gdn_cp_config *cp, const gdn_bwd_args *a,
                            const float *fwd_map, float *bmap) {
    gdn_plan p;
    gdn_status s = cp_plan(ex, cfg, cp, &p);
    if (s) return s;
    if ((s = check_bwd_map_args(&p, a, fwd_map, bmap, 1))) return s;   /* saved as gdn_cp_bwd_finish will want it */
    if ((s = cuda_checks(ex, &p, a->workspace))) return s;
    if ((s = check_ws(a->workspace, a->workspace_bytes, pair_ws(ex, &p, cp)))) return s;
    if (on_cuda(ex) && (s = gdn_cuda_align_bwd(ex, &p, a))) return s;
#ifdef GDN_HAVE_CUDA
    if (on_cuda(ex)) {
        if ((s = gdn_cuda_cp_bwd_begin(&p, cp, a, fwd_map, bmap, ex->stream))) return s;
        return gdn_ok();
    }
#endif
    gdn_cpu_cp_bwd_map(&p, cp, a, fwd_map, bmap);
    return gdn_ok();
}

gdn_status gdn_cp_bwd_finish(const gdn_exec *ex, const gdn_config *cfg, const gdn_cp_config *cp, const gdn_bwd_args *a,
                             const float *dS_out) {
    gdn_plan p;
    gdn_status s = cp_plan(ex, cfg, cp, &p);
    if (s) return s;
    if ((s = gdn_chunk_bwd_check(ex, cfg, a, &p))) return s;
    if (cp->last_continues) NEED(dS_out, " (cp->last_continues is 1: gdn_cp_bwd_scan's result)");
    if ((s = cuda_checks(ex, &p, a->workspace))) return s;
    if ((s = check_ws(a->workspace, a->workspace_bytes, pair_ws(ex, &p, cp)))) return s;
#ifdef GDN_HAVE_CUDA
    if (on_cuda(ex)) {
        if ((s = gdn_cuda_cp_bwd_finish(&p, cp, a, dS_out, ex->stream))) return s;
        return gdn_ok();
    }
#endif
    /* CPU: the whole backward with dS_out added to dht row N-1, in the workspace */
    const size_t per = (size_t)p.c.HV * p.c.K * p.c.V, dbytes = (p.N * per * sizeof(float) + 255) / 256 * 256;
    float *dht = (float *)a->workspace;
    gdn_bwd_args b = *a;
    if (cp->last_continues) {
        for (size_t x = 0; x < (size_t)p.N * per; x++) dht[x] = a->dht ? a->dht[x] : 0.f;
        for (size_t x = 0; x < per; x++) dht[(size_t)(p.N - 1) * per + x] += dS_out[x];
        b.dht = dht;
    }
    b.workspace = (char *)a->workspace + dbytes;
    b.workspace_bytes = a->workspace_bytes - dbytes;
    gdn_cpu_chunk_bwd(&p, &b);
    return gdn_ok();
}

/* ---- steps 1 and 4 with their work shared ---- */

static size_t fpair_ws(const gdn_exec *ex, const gdn_plan *p, const gdn_cp_config *cp) {
#ifdef GDN_HAVE_CUDA
    if (on_cuda(ex)) return gdn_cuda_cp_fwd_ws(p, cp);
#else
    (void)ex;
#endif
    const size_t m = gdn_cpu_cp_fwd_map_ws(p, cp), f = gdn_cpu_chunk_fwd_ws(p);
    return m > f ? m : f;
}

size_t gdn_cp_fwd_workspace_size(const gdn_exec *ex, const gdn_config *cfg, const gdn_cp_config *cp) {
    gdn_plan p;
    if (cp_plan(ex, cfg, cp, &p)) return 0;
    gdn_ok();
    return fpair_ws(ex, &p, cp);
}

gdn_status gdn_cp_fwd_begin(const gdn_exec *ex, const gdn_config *cfg, const gdn_cp_config *cp, const gdn_fwd_args *a,
                            float *map) {
    gdn_plan p;
    gdn_status s = cp_plan(ex, cfg, cp, &p);
    if (s) return s;
    if ((s = check_fwd_map_args(&p, a, map))) return s;
    const size_t sv = gdn_saved_bytes(&p.c);
    CHECK(!a->saved || a->saved_bytes >= sv, GDN_ERR_WORKSPACE, "saved_bytes (%zu) is less than the %zu bytes needed",
          a->saved_bytes, sv);
    if ((s = cuda_checks(ex, &p, a->workspace))) return s;
    if ((s = check_ws(a->workspace, a->workspace_bytes, fpair_ws(ex, &p, cp)))) return s;
    if (on_cuda(ex) && (s = gdn_cuda_align_fwd(ex, &p, a, 1))) return s;
#ifdef GDN_HAVE_CUDA
    if (on_cuda(ex)) {
        if ((s = gdn_cuda_cp_fwd_begin(&p, cp, a, map, ex->stream))) return s;
        return gdn_ok();
    }
#endif
    gdn_cpu_cp_fwd_map(&p, cp, a, map);
    return gdn_ok();
}

gdn_status gdn_cp_fwd_finish(const gdn_exec *ex, const gdn_config *cfg, const gdn_cp_config *cp, const gdn_fwd_args *a) {
    gdn_plan p;
    gdn_status s = cp_plan(ex, cfg, cp, &p);
    if (s) return s;
    if ((s = gdn_chunk_fwd_check(ex, cfg, a, &p))) return s;
    if ((s = cuda_checks(ex, &p, a->workspace))) return s;
    if ((s = check_ws(a->workspace, a->workspace_bytes, fpair_ws(ex, &p, cp)))) return s;
#ifdef GDN_HAVE_CUDA
    if (on_cuda(ex)) {
        if ((s = gdn_cuda_cp_fwd_finish(&p, cp, a, ex->stream))) return s;
        return gdn_ok();
    }
#endif
    gdn_cpu_chunk_fwd(&p, a);
    return gdn_ok();
}
