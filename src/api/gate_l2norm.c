/* The API layer of the standalone gate and L2 norm (CPU and CUDA). On CUDA
 * every pointer must be aligned to its elements; the kernels pick their
 * vector widths from the count and the alignment themselves. */
#include "api/api.h"
#include "cpu/cpu_backend.h"
#ifdef GDN_HAVE_CUDA
#include "cuda/cuda_layer.h"
#endif

#define CHECK GDN_CHECK
#define NEED GDN_NEED
#define valid_dtype gdn_valid_dtype

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
        GDN_ALIGNED(a, gdn_dtype_size(a_dtype), GDN_ELEM);
        GDN_ALIGNED(A_log, 4, GDN_ELEM);
        GDN_ALIGNED(dt_bias, 4, GDN_ELEM);
        GDN_ALIGNED(g, 4, GDN_ELEM);
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
        GDN_ALIGNED(a, gdn_dtype_size(a_dtype), GDN_ELEM);
        GDN_ALIGNED(da, gdn_dtype_size(a_dtype), GDN_ELEM);
        GDN_ALIGNED(A_log, 4, GDN_ELEM);
        GDN_ALIGNED(dt_bias, 4, GDN_ELEM);
        GDN_ALIGNED(dg, 4, GDN_ELEM);
        GDN_ALIGNED(dA_log, 4, GDN_ELEM);
        GDN_ALIGNED(ddt_bias, 4, GDN_ELEM);
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
        GDN_ALIGNED(x, gdn_dtype_size(dtype), GDN_ELEM);
        GDN_ALIGNED(y, gdn_dtype_size(dtype), GDN_ELEM);
        GDN_ALIGNED(rstd, 4, GDN_ELEM);
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
        GDN_ALIGNED(x, gdn_dtype_size(dtype), GDN_ELEM);
        GDN_ALIGNED(dy, gdn_dtype_size(dtype), GDN_ELEM);
        GDN_ALIGNED(dx, gdn_dtype_size(dtype), GDN_ELEM);
        GDN_ALIGNED(rstd, 4, GDN_ELEM);
#ifdef GDN_HAVE_CUDA
        if ((s = gdn_cuda_l2norm_bwd(rows, dim, dtype, x, rstd, dy, dx, ex->stream))) return s;
        return gdn_ok();
#endif
    }
    gdn_cpu_l2norm_bwd(th, rows, dim, dtype, x, rstd, dy, dx);
    return gdn_ok();
}
