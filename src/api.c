/* The API layer: every entry point validates all of its input here, before any
 * backend runs and before any output is written, then dispatches. Backends can
 * therefore assume valid shapes, pointers and buffer sizes. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "internal.h"
#ifdef GDN_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

/* ---- errors ---- */

static _Thread_local char last_error[512];

gdn_status gdn_fail(gdn_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return s;
}

gdn_status gdn_ok(void) { last_error[0] = 0; return GDN_OK; }

const char *gdn_last_error(void) { return last_error; }

const char *gdn_status_string(gdn_status s) {
    switch (s) {
    case GDN_OK: return "GDN_OK";
    case GDN_ERR_NULL: return "GDN_ERR_NULL";
    case GDN_ERR_SHAPE: return "GDN_ERR_SHAPE";
    case GDN_ERR_DTYPE: return "GDN_ERR_DTYPE";
    case GDN_ERR_SEQLENS: return "GDN_ERR_SEQLENS";
    case GDN_ERR_OPTION: return "GDN_ERR_OPTION";
    case GDN_ERR_WORKSPACE: return "GDN_ERR_WORKSPACE";
    case GDN_ERR_BACKEND: return "GDN_ERR_BACKEND";
    case GDN_ERR_UNSUPPORTED: return "GDN_ERR_UNSUPPORTED";
    }
    return "GDN_ERR_UNKNOWN";
}

size_t gdn_dtype_size(gdn_dtype t) { return t == GDN_F32 ? 4 : (t == GDN_BF16 || t == GDN_F16) ? 2 : 0; }

const char *gdn_dtype_name(gdn_dtype t) {
    switch (t) { case GDN_F32: return "f32"; case GDN_BF16: return "bf16"; case GDN_F16: return "f16"; }
    return "?";
}

int gdn_backend_available(gdn_backend b) {
    if (b == GDN_BACKEND_CPU) return 1;
#ifdef GDN_HAVE_CUDA
    if (b == GDN_BACKEND_CUDA) return gdn_cuda_device_count() > 0;
#endif
    return 0;
}

/* ---- shared checks ---- */

#define CHECK GDN_CHECK
#define NEED GDN_NEED
#define valid_dtype gdn_valid_dtype

gdn_status gdn_check_heads(int H, int HV, int K, int V) {
    CHECK(H >= 1, GDN_ERR_SHAPE, "H (%d) must be >= 1", H);
    CHECK(HV >= 1, GDN_ERR_SHAPE, "HV (%d) must be >= 1", HV);
    CHECK(HV % H == 0, GDN_ERR_SHAPE, "HV (%d) is not a multiple of H (%d)", HV, H);
    CHECK(K >= 1 && K <= 256, GDN_ERR_SHAPE, "K (%d) must be in 1..256", K);
    CHECK(V >= 1 && V <= 256, GDN_ERR_SHAPE, "V (%d) must be in 1..256", V);
    return GDN_OK;
}

gdn_status gdn_check_exec(const gdn_exec *ex, int *threads, int *seq_split) {
    gdn_backend b = ex ? ex->backend : GDN_BACKEND_CPU;
    CHECK(b == GDN_BACKEND_CPU || b == GDN_BACKEND_CUDA, GDN_ERR_BACKEND, "unknown backend (%d)", (int)b);
#ifdef GDN_HAVE_CUDA
    CHECK(gdn_backend_available(b), GDN_ERR_BACKEND, "backend %s: no device is visible", b == GDN_BACKEND_CUDA ? "CUDA" : "CPU");
#else
    CHECK(gdn_backend_available(b), GDN_ERR_BACKEND, "backend %s is not built into this library",
          b == GDN_BACKEND_CUDA ? "CUDA" : "CPU");
#endif
    int t = ex ? ex->threads : 0;
    CHECK(t >= 0, GDN_ERR_OPTION, "threads (%d) must be >= 0", t);
#ifdef _OPENMP
    if (t == 0) t = omp_get_max_threads();
#else
    t = 1;
#endif
    *threads = t < 1 ? 1 : t;
    const int sp = ex ? ex->seq_split : 0;
    CHECK(sp >= 0, GDN_ERR_OPTION, "seq_split (%d) must be >= 0", sp);
    if (seq_split) *seq_split = sp;
    return GDN_OK;
}

/* Validate a gated-delta-rule config and resolve it into a plan. */
static gdn_status make_plan(const gdn_exec *ex, const gdn_config *cfg, gdn_plan *p) {
    NEED(cfg, "");
    gdn_status s = gdn_check_exec(ex, &p->threads, &p->seq_split);
    if (s) return s;
    const gdn_config *c = cfg;
    CHECK(c->B >= 0, GDN_ERR_SHAPE, "B (%lld) must be >= 0", (long long)c->B);
    CHECK(c->T >= 0, GDN_ERR_SHAPE, "T (%lld) must be >= 0", (long long)c->T);
    if ((s = gdn_check_heads(c->H, c->HV, c->K, c->V))) return s;
    CHECK(valid_dtype(c->dtype), GDN_ERR_DTYPE, "dtype (%d) is not GDN_F32, GDN_BF16 or GDN_F16", (int)c->dtype);
    CHECK(valid_dtype(c->gate_dtype) && (c->gate_dtype == GDN_F32 || c->gate_dtype == c->dtype), GDN_ERR_DTYPE,
          "gate_dtype (%d) must be GDN_F32 or the input dtype (%s)", (int)c->gate_dtype, gdn_dtype_name(c->dtype));
    const unsigned known = GDN_QK_L2NORM | GDN_GATE_FUSED | GDN_BETA_SIGMOID | GDN_BETA_NEGATIVE | GDN_STATE_V_FIRST;
    CHECK((c->flags & ~known) == 0, GDN_ERR_OPTION, "unknown flag bits 0x%x", c->flags & ~known);
    CHECK(!(c->flags & GDN_BETA_NEGATIVE) || (c->flags & GDN_BETA_SIGMOID), GDN_ERR_OPTION,
          "GDN_BETA_NEGATIVE needs GDN_BETA_SIGMOID (beta = 2*sigmoid(b))");
    CHECK(isfinite(c->scale), GDN_ERR_OPTION, "scale (%g) is not finite", (double)c->scale);
    CHECK((double)c->B * (double)c->T * (double)(c->HV > c->H ? c->HV : c->H) * 256.0 < 9.0e18,
          GDN_ERR_SHAPE, "B*T (%lld tokens) is too large", (long long)(c->B * c->T));
    p->c = *c;
    if (p->c.scale == 0.f) p->c.scale = 1.0f / sqrtf((float)c->K);
    p->G = c->HV / c->H;
    if (c->cu_seqlens) {
        const int64_t *cu = c->cu_seqlens;
        CHECK(c->B == 1, GDN_ERR_SEQLENS, "cu_seqlens needs B == 1 (B is %lld)", (long long)c->B);
        CHECK(c->num_seqs >= 1, GDN_ERR_SEQLENS, "num_seqs (%lld) must be >= 1 with cu_seqlens", (long long)c->num_seqs);
        CHECK(cu[0] == 0, GDN_ERR_SEQLENS, "cu_seqlens[0] (%lld) must be 0", (long long)cu[0]);
        p->max_len = 0;
        for (int64_t n = 0; n < c->num_seqs; n++) {
            CHECK(cu[n + 1] >= cu[n], GDN_ERR_SEQLENS, "cu_seqlens is not sorted: cu_seqlens[%lld] = %lld > cu_seqlens[%lld] = %lld",
                  (long long)n, (long long)cu[n], (long long)(n + 1), (long long)cu[n + 1]);
            CHECK(cu[n + 1] <= c->T, GDN_ERR_SEQLENS, "cu_seqlens[%lld] (%lld) is past T (%lld)",
                  (long long)(n + 1), (long long)cu[n + 1], (long long)c->T);
            if (cu[n + 1] - cu[n] > p->max_len) p->max_len = cu[n + 1] - cu[n];
        }
        CHECK(cu[c->num_seqs] == c->T, GDN_ERR_SEQLENS, "cu_seqlens[num_seqs] (%lld) must equal T (%lld)",
              (long long)cu[c->num_seqs], (long long)c->T);
        p->N = c->num_seqs;
    } else {
        p->N = c->B;
        p->max_len = c->T;
    }
    return GDN_OK;
}

/* ---- saved-for-backward ---- */

size_t gdn_saved_bytes(const gdn_config *c) {
    if (!(c->flags & GDN_QK_L2NORM)) return 0;
    return (size_t)(2 * c->B * c->T * c->H) * sizeof(float);
}

gdn_saved_layout gdn_saved_at(const gdn_config *c, void *saved) {
    gdn_saved_layout l = {0};
    if (!saved || !(c->flags & GDN_QK_L2NORM)) return l;
    l.rstd_q = (float *)saved;
    l.rstd_k = l.rstd_q + c->B * c->T * c->H;
    return l;
}

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
    return GDN_OK;
}

gdn_status gdn_chunk_fwd(const gdn_exec *ex, const gdn_config *cfg, const gdn_fwd_args *a) {
    gdn_plan p;
    gdn_status s = make_plan(ex, cfg, &p);
    if (!s) s = check_fwd_args(ex, &p, a, 1);
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

gdn_status gdn_chunk_bwd(const gdn_exec *ex, const gdn_config *cfg, const gdn_bwd_args *a) {
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
    size_t need = chunk_bwd_ws(ex, &p);
    CHECK(need == 0 || a->workspace, GDN_ERR_NULL, "workspace is NULL but %zu bytes are needed", need);
    CHECK(a->workspace_bytes >= need, GDN_ERR_WORKSPACE, "workspace_bytes (%zu) is less than the %zu bytes needed",
          a->workspace_bytes, need);
    CHECK(gdn_exec_backend(ex) != GDN_BACKEND_CUDA || !p.c.cu_seqlens || p.c.cu_seqlens_dev, GDN_ERR_NULL,
          "cu_seqlens_dev is NULL but required (CUDA backend with cu_seqlens)");
    if (gdn_exec_backend(ex) == GDN_BACKEND_CUDA) {
#ifdef GDN_HAVE_CUDA
        if ((s = gdn_cuda_chunk_bwd(&p, a, a->workspace, ex->stream))) return s;
        return gdn_ok();
#endif
    }
    gdn_cpu_chunk_bwd(&p, a);
    return gdn_ok();
}

/* ---- standalone gate and l2norm (CPU and CUDA) ---- */

#ifdef GDN_HAVE_CUDA
#include "cuda/cuda_layer.h"
#endif

static gdn_status check_rows(const gdn_exec *ex, int64_t rows, int dim, const char *dim_name, gdn_dtype t,
                             int *threads) {
    gdn_status s = gdn_check_exec(ex, threads, NULL);
    if (s) return s;
    CHECK(rows >= 0, GDN_ERR_SHAPE, "rows (%lld) must be >= 0", (long long)rows);
    CHECK(dim >= 1, GDN_ERR_SHAPE, "%s (%d) must be >= 1", dim_name, dim);
    CHECK(valid_dtype(t), GDN_ERR_DTYPE, "dtype (%d) is not GDN_F32, GDN_BF16 or GDN_F16", (int)t);
    return GDN_OK;
}

gdn_status gdn_gate_fwd(const gdn_exec *ex, int64_t rows, int HV, gdn_dtype a_dtype, const void *a,
                        const float *A_log, const float *dt_bias, float *g) {
    int th = 1;
    gdn_status s = check_rows(ex, rows, HV, "HV", a_dtype, &th);
    if (s) return s;
    NEED(A_log, "");
    if (rows > 0) { NEED(a, ""); NEED(g, ""); }
    if (gdn_exec_backend(ex) == GDN_BACKEND_CUDA) {
#ifdef GDN_HAVE_CUDA
        if ((s = gdn_cuda_gate_fwd(rows, HV, a_dtype, a, A_log, dt_bias, g, ex->stream))) return s;
        return gdn_ok();
#endif
    }
    gdn_cpu_gate_fwd(th, rows, HV, a_dtype, a, A_log, dt_bias, g);
    return gdn_ok();
}

gdn_status gdn_gate_bwd(const gdn_exec *ex, int64_t rows, int HV, gdn_dtype a_dtype, const void *a,
                        const float *A_log, const float *dt_bias, const float *dg, void *da,
                        float *dA_log, float *ddt_bias) {
    int th = 1;
    gdn_status s = check_rows(ex, rows, HV, "HV", a_dtype, &th);
    if (s) return s;
    NEED(A_log, ""); NEED(dA_log, "");
    if (rows > 0) { NEED(a, ""); NEED(dg, ""); NEED(da, ""); }
    if (gdn_exec_backend(ex) == GDN_BACKEND_CUDA) {
#ifdef GDN_HAVE_CUDA
        if ((s = gdn_cuda_gate_bwd(rows, HV, a_dtype, a, A_log, dt_bias, dg, da, dA_log, ddt_bias, ex->stream)))
            return s;
        return gdn_ok();
#endif
    }
    gdn_cpu_gate_bwd(th, rows, HV, a_dtype, a, A_log, dt_bias, dg, da, dA_log, ddt_bias);
    return gdn_ok();
}

gdn_status gdn_l2norm_fwd(const gdn_exec *ex, int64_t rows, int dim, gdn_dtype dtype, const void *x,
                          void *y, float *rstd) {
    int th = 1;
    gdn_status s = check_rows(ex, rows, dim, "dim", dtype, &th);
    if (s) return s;
    if (rows > 0) { NEED(x, ""); NEED(y, ""); }
    if (gdn_exec_backend(ex) == GDN_BACKEND_CUDA) {
#ifdef GDN_HAVE_CUDA
        if ((s = gdn_cuda_l2norm_fwd(rows, dim, dtype, x, y, rstd, ex->stream))) return s;
        return gdn_ok();
#endif
    }
    gdn_cpu_l2norm_fwd(th, rows, dim, dtype, x, y, rstd);
    return gdn_ok();
}

gdn_status gdn_l2norm_bwd(const gdn_exec *ex, int64_t rows, int dim, gdn_dtype dtype, const void *x,
                          const float *rstd, const void *dy, void *dx) {
    int th = 1;
    gdn_status s = check_rows(ex, rows, dim, "dim", dtype, &th);
    if (s) return s;
    if (rows > 0) { NEED(x, ""); NEED(rstd, ""); NEED(dy, ""); NEED(dx, ""); }
    if (gdn_exec_backend(ex) == GDN_BACKEND_CUDA) {
#ifdef GDN_HAVE_CUDA
        if ((s = gdn_cuda_l2norm_bwd(rows, dim, dtype, x, rstd, dy, dx, ex->stream))) return s;
        return gdn_ok();
#endif
    }
    gdn_cpu_l2norm_bwd(th, rows, dim, dtype, x, rstd, dy, dx);
    return gdn_ok();
}
