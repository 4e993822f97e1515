/* Validation of the fused decode step (see core.c for the conventions). */
#include <math.h>
#include <stdlib.h>
#include "api/api.h"
#include "cpu/decode.h"
#ifdef GDN_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

#define CHECK GDN_CHECK
#define NEED GDN_NEED
#define valid_dtype gdn_valid_dtype

gdn_status gdn_decode_step(const gdn_exec *ex, const gdn_decode_config *cfg, const gdn_decode_args *a) {
    int threads;
    NEED(cfg, "");
    NEED(a, "");
    gdn_status s = gdn_check_exec(ex, &threads, NULL);
    if (s) return s;
    const gdn_decode_config *c = cfg;
    CHECK(c->B >= 0, GDN_ERR_SHAPE, "B (%d) must be >= 0", c->B);
    if ((s = gdn_check_heads(c->H, c->HV, c->K, c->V))) return s;
    CHECK(valid_dtype(c->dtype), GDN_ERR_DTYPE, "dtype (%d) is not GDN_F32, GDN_BF16 or GDN_F16", (int)c->dtype);
    CHECK(isfinite(c->scale), GDN_ERR_OPTION, "scale (%g) is not finite", (double)c->scale);
    const unsigned known = GDN_QK_L2NORM | GDN_BETA_NEGATIVE | GDN_STATE_V_FIRST;
    CHECK((c->flags & ~known) == 0, GDN_ERR_OPTION,
          "flags 0x%x not for the decode step (it takes GDN_QK_L2NORM, GDN_BETA_NEGATIVE, GDN_STATE_V_FIRST; "
          "gate and beta sigmoid are always fused)", c->flags & ~known);
    CHECK(c->conv_W >= 0 && c->conv_W <= 8, GDN_ERR_SHAPE, "conv_W (%d) must be in 0..8", c->conv_W);
    CHECK(c->num_slots >= 0, GDN_ERR_SHAPE, "num_slots (%lld) must be >= 0", (long long)c->num_slots);
    CHECK(a->slots || c->num_slots >= c->B, GDN_ERR_SHAPE,
          "num_slots (%lld) is less than B (%d) and no slots are given", (long long)c->num_slots, c->B);
    if (c->B == 0) return gdn_ok();
    NEED(a->a, ""); NEED(a->b, ""); NEED(a->A_log, ""); NEED(a->state, ""); NEED(a->o, "");
    if (c->conv_W > 0) {
        NEED(a->proj, " (conv_W > 0)"); NEED(a->conv_state, " (conv_W > 0)"); NEED(a->conv_weight, " (conv_W > 0)");
    } else {
        NEED(a->mixed_qkv, " (conv_W is 0)");
    }
    const int on_cuda = gdn_exec_backend(ex) == GDN_BACKEND_CUDA;
    /* CPU: every slot in range and used once, before anything is touched. CUDA:
     * slots are device memory, read only by the kernel (no host sync), which
     * treats a slot outside -1..num_slots-1 as padding; a slot used twice is
     * the caller's error there, unchecked (the rows race on its pool row). */
    if (a->slots && !on_cuda) {
        unsigned char *seen = calloc((size_t)c->num_slots + 1, 1);
        CHECK(seen != NULL, GDN_ERR_BACKEND, "out of memory checking %lld slots", (long long)c->num_slots);
        for (int b = 0; b < c->B; b++) {
            const int32_t sl = a->slots[b];
            if (sl < -1 || sl >= c->num_slots) {
                free(seen);
                return gdn_fail(GDN_ERR_SHAPE, "slots[%d] (%d) is out of range -1..%lld", b, (int)sl,
                                (long long)c->num_slots - 1);
            }
            if (sl >= 0 && seen[sl]++) {
                free(seen);
                return gdn_fail(GDN_ERR_SHAPE, "slots[%d] (%d) is used by an earlier row too", b, (int)sl);
            }
        }
        free(seen);
    }
    if (on_cuda) {   /* every pointer aligned to its elements (gdn.h, "The CUDA backend") */
        const size_t es = gdn_dtype_size(c->dtype);
        if (c->conv_W > 0) {
            GDN_ALIGNED(a->proj, es, GDN_ELEM);
            GDN_ALIGNED(a->conv_state, 4, GDN_ELEM);
            GDN_ALIGNED(a->conv_weight, 4, GDN_ELEM);
            GDN_ALIGNED(a->conv_bias, 4, GDN_ELEM);
        } else {
            GDN_ALIGNED(a->mixed_qkv, es, GDN_ELEM);
        }
        GDN_ALIGNED(a->a, es, GDN_ELEM);
        GDN_ALIGNED(a->b, es, GDN_ELEM);
        GDN_ALIGNED(a->o, es, GDN_ELEM);
        GDN_ALIGNED(a->A_log, 4, GDN_ELEM);
        GDN_ALIGNED(a->dt_bias, 4, GDN_ELEM);
        GDN_ALIGNED(a->state, 4, GDN_ELEM);
        GDN_ALIGNED(a->slots, 4, GDN_ELEM);
    }
    gdn_decode_config r = *c;
    if (r.scale == 0.f) r.scale = 1.0f / sqrtf((float)c->K);
#ifdef GDN_HAVE_CUDA
    if (on_cuda) {
        if ((s = gdn_cuda_decode_step(&r, a, ex->stream))) return s;
        return gdn_ok();
    }
#endif
    gdn_cpu_decode_step(threads, &r, a);
    return gdn_ok();
}
