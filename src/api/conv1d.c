/* Causal depthwise conv1d (DESIGN.md §4 item 4): validation and dispatch, with
 * the conventions of core.c: every check runs before any output is written,
 * each failure names the values; the backend then assumes valid input.
 *
 * Pointers: weight is always required (forward, backward, update). With
 * tokens (B*T > 0) forward needs x and y, backward x, dy and dx; backward
 * always needs dweight, which it writes (zeros without tokens). bias, h0, ht,
 * dht, dbias, dh0 are optional. The update needs state always, x and y when
 * B > 0.
 *
 * CUDA (all three calls): device pointers, work enqueued on gdn_exec.stream;
 * with cu_seqlens, forward and backward also need cu_seqlens_dev. The
 * update's slots are then device memory,
 * which the host cannot read without a sync: they are not checked here, and
 * the kernel treats a slot outside -1..num_slots-1 as padding. Every CUDA
 * pointer must be aligned to its elements (the kernels pick their vector
 * widths from the shape and the alignment themselves). */
#include "api/api.h"
#include "cpu/conv1d.h"
#ifdef GDN_HAVE_CUDA
#include "cuda/cuda_layer.h"
#endif

#define CHECK GDN_CHECK
#define NEED GDN_NEED

/* The shape, dtype and option checks shared by the three calls. */
static gdn_status check_common(const gdn_exec *ex, const gdn_conv1d_config *cfg, int *threads) {
    NEED(cfg, " (the gdn_conv1d_config)");
    const gdn_conv1d_config *c = cfg;
    gdn_status s = gdn_check_exec(ex, threads, NULL);
    if (s) return s;
    CHECK(c->B >= 0, GDN_ERR_SHAPE, "B (%lld) must be >= 0", (long long)c->B);
    CHECK(c->D >= 1, GDN_ERR_SHAPE, "D (%d) must be >= 1", c->D);
    CHECK(c->W >= 1 && c->W <= 8, GDN_ERR_SHAPE, "W (%d) must be in 1..8", c->W);
    CHECK(c->dtype == GDN_F32 || c->dtype == GDN_BF16 || c->dtype == GDN_F16, GDN_ERR_DTYPE,
          "dtype (%d) is not GDN_F32, GDN_BF16 or GDN_F16", (int)c->dtype);
    CHECK(c->silu == 0 || c->silu == 1, GDN_ERR_OPTION, "silu (%d) must be 0 or 1", c->silu);
    return GDN_OK;
}

/* Forward / backward config: T, cu_seqlens (as gdn_make_plan in core.c); N out. */
static gdn_status check_seq(const gdn_exec *ex, const gdn_conv1d_config *c, int *threads, int64_t *N) {
    gdn_status s = check_common(ex, c, threads);
    if (s) return s;
    CHECK(c->T >= 0, GDN_ERR_SHAPE, "T (%lld) must be >= 0", (long long)c->T);
    CHECK((double)c->B * (double)c->T * (double)c->D * 8.0 < 9.0e18, GDN_ERR_SHAPE,
          "B*T*D (%lld*%lld*%d) is too large", (long long)c->B, (long long)c->T, c->D);
    if (c->cu_seqlens) {
        const int64_t *cu = c->cu_seqlens;
        CHECK(c->B == 1, GDN_ERR_SEQLENS, "cu_seqlens needs B == 1 (B is %lld)", (long long)c->B);
        CHECK(c->num_seqs >= 1, GDN_ERR_SEQLENS, "num_seqs (%lld) must be >= 1 with cu_seqlens", (long long)c->num_seqs);
        CHECK((double)c->num_seqs * (double)c->D * 8.0 < 9.0e18, GDN_ERR_SEQLENS,
              "num_seqs*D*W (%lld*%d*%d) is too large", (long long)c->num_seqs, c->D, c->W);
        CHECK(cu[0] == 0, GDN_ERR_SEQLENS, "cu_seqlens[0] (%lld) must be 0", (long long)cu[0]);
        for (int64_t n = 0; n < c->num_seqs; n++) {
            CHECK(cu[n + 1] >= cu[n], GDN_ERR_SEQLENS,
                  "cu_seqlens is not sorted: cu_seqlens[%lld] = %lld > cu_seqlens[%lld] = %lld",
                  (long long)n, (long long)cu[n], (long long)(n + 1), (long long)cu[n + 1]);
            CHECK(cu[n + 1] <= c->T, GDN_ERR_SEQLENS, "cu_seqlens[%lld] (%lld) is past T (%lld)",
                  (long long)(n + 1), (long long)cu[n + 1], (long long)c->T);
        }
        CHECK(cu[c->num_seqs] == c->T, GDN_ERR_SEQLENS, "cu_seqlens[num_seqs] (%lld) must equal T (%lld)",
              (long long)cu[c->num_seqs], (long long)c->T);
        *N = c->num_seqs;
    } else {
        *N = c->B;
    }
    return GDN_OK;
}

/* CUDA: the device cu_seqlens are int64 elements (gdn.h, "The CUDA backend") */
static inline gdn_status cuda_align_seq(const gdn_conv1d_config *c) {
    if (c->cu_seqlens) GDN_ALIGNED(c->cu_seqlens_dev, 8, GDN_ELEM);
    return GDN_OK;
}

gdn_status gdn_conv1d_fwd(const gdn_exec *ex, const gdn_conv1d_config *cfg, const gdn_conv1d_args *a) {
    int th = 1;
    int64_t N = 0;
    gdn_status s = check_seq(ex, cfg, &th, &N);
    if (s) return s;
    NEED(a, " (the gdn_conv1d_args)");
    NEED(a->weight, " (weight [D,W])");
    if (cfg->B * cfg->T > 0) { NEED(a->x, ""); NEED(a->y, ""); }
    if (gdn_exec_backend(ex) == GDN_BACKEND_CUDA) {
#ifdef GDN_HAVE_CUDA
        CHECK(!cfg->cu_seqlens || cfg->cu_seqlens_dev, GDN_ERR_NULL,
              "cu_seqlens_dev is NULL but required (CUDA backend with cu_seqlens)");
        if ((s = cuda_align_seq(cfg))) return s;
        const size_t es = gdn_dtype_size(cfg->dtype);
        GDN_ALIGNED(a->x, es, GDN_ELEM);
        GDN_ALIGNED(a->y, es, GDN_ELEM);
        GDN_ALIGNED(a->weight, 4, GDN_ELEM);
        GDN_ALIGNED(a->bias, 4, GDN_ELEM);
        GDN_ALIGNED(a->h0, 4, GDN_ELEM);
        GDN_ALIGNED(a->ht, 4, GDN_ELEM);
        if ((s = gdn_cuda_conv1d_fwd(cfg, N, cfg->cu_seqlens_dev, a, ex->stream))) return s;
        return gdn_ok();
#endif
    }
    if (gdn_cpu_conv1d_fwd(th, cfg, N, a))
        return gdn_fail(GDN_ERR_BACKEND, "out of memory for the transposed weights (D %d, W %d)", cfg->D, cfg->W);
    return gdn_ok();
}

gdn_status gdn_conv1d_bwd(const gdn_exec *ex, const gdn_conv1d_config *cfg, const gdn_conv1d_bwd_args *a) {
    int th = 1;
    int64_t N = 0;
    gdn_status s = check_seq(ex, cfg, &th, &N);
    if (s) return s;
    NEED(a, " (the gdn_conv1d_bwd_args)");
    NEED(a->weight, " (weight [D,W])");
    NEED(a->dweight, " (dweight [D,W] is always written)");
    if (cfg->B * cfg->T > 0) { NEED(a->x, ""); NEED(a->dy, ""); NEED(a->dx, ""); }
    if (gdn_exec_backend(ex) == GDN_BACKEND_CUDA) {
#ifdef GDN_HAVE_CUDA
        CHECK(!cfg->cu_seqlens || cfg->cu_seqlens_dev, GDN_ERR_NULL,
              "cu_seqlens_dev is NULL but required (CUDA backend with cu_seqlens)");
        if ((s = cuda_align_seq(cfg))) return s;
        const size_t es = gdn_dtype_size(cfg->dtype);
        GDN_ALIGNED(a->x, es, GDN_ELEM);
        GDN_ALIGNED(a->dy, es, GDN_ELEM);
        GDN_ALIGNED(a->dx, es, GDN_ELEM);
        GDN_ALIGNED(a->weight, 4, GDN_ELEM);
        GDN_ALIGNED(a->bias, 4, GDN_ELEM);
        GDN_ALIGNED(a->h0, 4, GDN_ELEM);
        GDN_ALIGNED(a->dht, 4, GDN_ELEM);
        GDN_ALIGNED(a->dweight, 4, GDN_ELEM);
        GDN_ALIGNED(a->dbias, 4, GDN_ELEM);
        GDN_ALIGNED(a->dh0, 4, GDN_ELEM);
        if ((s = gdn_cuda_conv1d_bwd(cfg, N, cfg->cu_seqlens_dev, a, ex->stream))) return s;
        return gdn_ok();
#endif
    }
    if (gdn_cpu_conv1d_bwd(th, cfg, N, a))
        return gdn_fail(GDN_ERR_BACKEND, "out of memory for the channel blocks' state (D %d)", cfg->D);
    return gdn_ok();
}

gdn_status gdn_conv1d_update(const gdn_exec *ex, const gdn_conv1d_config *cfg, const void *x,
                             const float *weight, const float *bias, float *state,
                             int64_t num_slots, const int32_t *slots, void *y) {
    int th = 1;
    gdn_status s = check_common(ex, cfg, &th);
    if (s) return s;
    const int64_t B = cfg->B;
    CHECK((double)B * (double)cfg->D * 8.0 < 9.0e18, GDN_ERR_SHAPE, "B*D (%lld*%d) is too large",
          (long long)B, cfg->D);
    CHECK(num_slots >= 1, GDN_ERR_SHAPE, "num_slots (%lld) must be >= 1", (long long)num_slots);
    CHECK((double)num_slots * (double)cfg->D * 8.0 < 9.0e18, GDN_ERR_SHAPE,
          "num_slots*D*W (%lld*%d*%d) is too large", (long long)num_slots, cfg->D, cfg->W);
    CHECK(slots || num_slots >= B, GDN_ERR_SHAPE, "num_slots (%lld) is less than B (%lld) and no slots are given",
          (long long)num_slots, (long long)B);
    NEED(weight, " (weight [D,W])");
    NEED(state, " (state [num_slots,D,W])");
    if (B > 0) { NEED(x, ""); NEED(y, ""); }
    if (gdn_exec_backend(ex) == GDN_BACKEND_CUDA) {
        const size_t es = gdn_dtype_size(cfg->dtype);
        GDN_ALIGNED(x, es, GDN_ELEM);
        GDN_ALIGNED(y, es, GDN_ELEM);
        GDN_ALIGNED(weight, 4, GDN_ELEM);
        GDN_ALIGNED(bias, 4, GDN_ELEM);
        GDN_ALIGNED(state, 4, GDN_ELEM);
        GDN_ALIGNED(slots, 4, GDN_ELEM);
#ifdef GDN_HAVE_CUDA
        if ((s = gdn_cuda_conv1d_update(cfg, x, weight, bias, state, num_slots, slots, 0, y, ex->stream))) return s;
        return gdn_ok();
#endif
    }
    if (slots)   /* every slot in range before anything is touched */
        for (int64_t b = 0; b < B; b++)
            CHECK(slots[b] >= -1 && slots[b] < num_slots, GDN_ERR_SHAPE, "slots[%lld] (%d) is out of range -1..%lld",
                  (long long)b, (int)slots[b], (long long)num_slots - 1);
    gdn_cpu_conv1d_update(th, cfg, x, weight, bias, state, slots, y);
    return gdn_ok();
}
