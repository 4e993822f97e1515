/* The API layer's shared checks: the exec (backend, threads, seq_split), head
 * shapes, and a gated-delta-rule config resolved into a plan. Every entry point
 * validates all of its input before any backend runs and before any output is
 * written (docs/DESIGN.md §6); backends then assume valid input. */
#include <math.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "api/api.h"
#ifdef GDN_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

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
    if (b == GDN_BACKEND_CUDA) {   /* the stream must belong to the current device, where the kernels run */
        const gdn_status ss = gdn_cuda_check_stream(ex->stream);
        if (ss) return ss;
    }
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

gdn_status gdn_check_align(const void *ptr, size_t bytes, const char *name, const char *why) {
    if (!ptr || bytes <= 1 || (uintptr_t)ptr % bytes == 0) return GDN_OK;
    const char *arrow = strrchr(name, '>');   /* "a->q" -> "q" */
    return gdn_fail(GDN_ERR_OPTION, "%s (%p) must be %zu-byte aligned on the CUDA backend (%s)", arrow ? arrow + 1 : name,
                    ptr, bytes, why);
}

/* Validate a gated-delta-rule config and resolve it into a plan. */
gdn_status gdn_make_plan(const gdn_exec *ex, const gdn_config *cfg, gdn_plan *p) {
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
