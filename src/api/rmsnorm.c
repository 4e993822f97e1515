/* Gated RMSNorm (DESIGN.md §4 item 5): validation and dispatch. Every check
 * runs before any output is written; the backend then assumes valid input.
 *
 * Pointers: with rows > 0 forward needs x, z, w, y (rstd optional); backward
 * needs x, z, w, dy, dx, dz (rstd optional: NULL = recomputed). Backward
 * always needs dw, which it writes (zeros when rows == 0).
 *
 * CUDA: forward and backward (device pointers, gdn_exec.stream), every
 * pointer aligned to its elements (the kernels pick their vector widths from
 * V and the alignment themselves). */
#include <math.h>
#include "api/api.h"
#include "cpu/rmsnorm.h"
#ifdef GDN_HAVE_CUDA
#include "cuda/cuda_layer.h"
#endif

#define CHECK GDN_CHECK
#define NEED GDN_NEED

static gdn_status check_config(const gdn_exec *ex, const gdn_rmsnorm_config *c, int *threads) {
    NEED(c, " (the gdn_rmsnorm_config)");
    gdn_status s = gdn_check_exec(ex, threads, NULL);
    if (s) return s;
    CHECK(c->rows >= 0, GDN_ERR_SHAPE, "rows (%lld) must be >= 0", (long long)c->rows);
    CHECK(c->V >= 1, GDN_ERR_SHAPE, "V (%d) must be >= 1", c->V);
    CHECK((double)c->rows * (double)c->V < 4.0e18, GDN_ERR_SHAPE, "rows * V (%lld * %d) is too large",
          (long long)c->rows, c->V);
    CHECK(c->dtype == GDN_F32 || c->dtype == GDN_BF16 || c->dtype == GDN_F16, GDN_ERR_DTYPE,
          "dtype (%d) is not GDN_F32, GDN_BF16 or GDN_F16", (int)c->dtype);
    CHECK(isfinite(c->eps) && c->eps > 0.f, GDN_ERR_OPTION, "eps (%g) must be finite and > 0", (double)c->eps);
    CHECK(c->gate == GDN_NORM_GATE_SILU || c->gate == GDN_NORM_GATE_SIGMOID, GDN_ERR_OPTION,
          "gate (%d) is not GDN_NORM_GATE_SILU (0) or GDN_NORM_GATE_SIGMOID (1)", (int)c->gate);
    return GDN_OK;
}

gdn_status gdn_rmsnorm_gated_fwd(const gdn_exec *ex, const gdn_rmsnorm_config *cfg, const void *x,
                                 const void *z, const float *w, void *y, float *rstd) {
    int th = 1;
    gdn_status s = check_config(ex, cfg, &th);
    if (s) return s;
    if (cfg->rows > 0) { NEED(x, ""); NEED(z, ""); NEED(w, ""); NEED(y, ""); }
    if (gdn_exec_backend(ex) == GDN_BACKEND_CUDA) {
        const size_t es = gdn_dtype_size(cfg->dtype);
        GDN_ALIGNED(x, es, GDN_ELEM);
        GDN_ALIGNED(z, es, GDN_ELEM);
        GDN_ALIGNED(y, es, GDN_ELEM);
        GDN_ALIGNED(w, 4, GDN_ELEM);
        GDN_ALIGNED(rstd, 4, GDN_ELEM);
#ifdef GDN_HAVE_CUDA
        if ((s = gdn_cuda_rmsnorm_fwd(cfg, x, z, w, y, rstd, ex->stream))) return s;
        return gdn_ok();
#endif
    }
    if (gdn_cpu_rmsnorm_fwd(th, cfg, x, z, w, y, rstd))
        return gdn_fail(GDN_ERR_BACKEND, "out of memory for %d thread(s) x 2 rows of V (%d) floats", th, cfg->V);
    return gdn_ok();
}

gdn_status gdn_rmsnorm_gated_bwd(const gdn_exec *ex, const gdn_rmsnorm_config *cfg, const void *x,
                                 const void *z, const float *w, const float *rstd, const void *dy,
                                 void *dx, void *dz, float *dw) {
    int th = 1;
    gdn_status s = check_config(ex, cfg, &th);
    if (s) return s;
    if (cfg->rows > 0) {
        NEED(x, ""); NEED(z, ""); NEED(w, ""); NEED(dy, ""); NEED(dx, ""); NEED(dz, "");
    }
    NEED(dw, " (dw [V] is always written)");
    if (gdn_exec_backend(ex) == GDN_BACKEND_CUDA) {
        const size_t es = gdn_dtype_size(cfg->dtype);
        GDN_ALIGNED(x, es, GDN_ELEM);
        GDN_ALIGNED(z, es, GDN_ELEM);
        GDN_ALIGNED(dy, es, GDN_ELEM);
        GDN_ALIGNED(dx, es, GDN_ELEM);
        GDN_ALIGNED(dz, es, GDN_ELEM);
        GDN_ALIGNED(w, 4, GDN_ELEM);
        GDN_ALIGNED(rstd, 4, GDN_ELEM);
        GDN_ALIGNED(dw, 4, GDN_ELEM);
#ifdef GDN_HAVE_CUDA
        if ((s = gdn_cuda_rmsnorm_bwd(cfg, x, z, w, rstd, dy, dx, dz, dw, ex->stream))) return s;
        return gdn_ok();
#endif
    }
    if (gdn_cpu_rmsnorm_bwd(th, cfg, x, z, w, rstd, dy, dx, dz, dw))
        return gdn_fail(GDN_ERR_BACKEND, "out of memory for the dw partials (rows %lld, V %d)",
                        (long long)cfg->rows, cfg->V);
    return gdn_ok();
}
