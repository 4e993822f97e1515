/* The gates of the CPU layer ops over rows of fp32: sigmoid, SiLU, and the
 * pair sigmoid(z), sigmoid(-z) from one exp. Plain loops over gdn_expf
 * (cpu/gemm.h) that the compiler vectorises (the library's C is built with
 * -fno-trapping-math for that). On the 2-core Zen 1 machine of bench/NOTES.md
 * v7 one SiLU costs ~1.4 ns per element and core whatever the form (a
 * reciprocal estimate + Newton step instead of the division was slower):
 * the gated layer ops are bound by it, not by memory. */
#ifndef GDN_CPU_ACT_H
#define GDN_CPU_ACT_H
#include "cpu/gemm.h"

static inline float gdn_sigmoidf(float z) { return 1.f / (1.f + gdn_expf(-z)); }

/* z[i] = silu(z[i]) */
static inline void gdn_silu_rows(float *restrict z, int64_t n) {
    for (int64_t i = 0; i < n; i++) z[i] = z[i] / (1.f + gdn_expf(-z[i]));
}


/* s[i] = sigmoid(z[i]) and sn[i] = sigmoid(-z[i]) = exp(-z) s, from one exp:
 * sn formed as 1 - s would keep only eps / (1 - s) of its digits where the
 * gate saturates (s (1 - s) at z = 8: 1e-4) */
static inline void gdn_sigmoid_pair_rows(const float *restrict z, float *restrict s, float *restrict sn, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float e = gdn_expf(-z[i]), r = 1.f / (1.f + e);
        s[i] = r;
        sn[i] = e * r;
    }
}

#endif
