/* Standalone gate:  g = -exp(A_log[j]) * softplus(a + dt_bias[j])
 * backward:         da = dg * -exp(A_log[j]) * softplus'(a + dt_bias[j]),
 *                   dA_log[j] = sum dg*g,  ddt_bias[j] = sum da.
 * softplus'(x) = sigmoid(x), and 1 for x > 20 where softplus(x) = x. */
#include "cpu/cpu_backend.h"

void gdn_cpu_gate_fwd(int threads, int64_t rows, int HV, gdn_dtype t, const void *a,
                      const float *A_log, const float *dt_bias, float *g) {
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        for (int j = 0; j < HV; j++) {
            float x;
            gdn_load(t, a, r * HV + j, &x, 1);
            g[r * HV + j] = -expf(A_log[j]) * gdn_softplus(x + (dt_bias ? dt_bias[j] : 0.f));
        }
    }
}

/* dA_log and ddt_bias are sums over rows: each value head is reduced by one
 * thread in row order, so the bits do not depend on the thread count. */
void gdn_cpu_gate_bwd(int threads, int64_t rows, int HV, gdn_dtype t, const void *a,
                      const float *A_log, const float *dt_bias, const float *dg,
                      void *da, float *dA_log, float *ddt_bias) {
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int j = 0; j < HV; j++) {
        const float A = -expf(A_log[j]), bias = dt_bias ? dt_bias[j] : 0.f;
        double sA = 0, sb = 0;
        for (int64_t r = 0; r < rows; r++) {
            float x;
            gdn_load(t, a, r * HV + j, &x, 1);
            x += bias;
            const float d = dg[r * HV + j];
            const float dx = d * A * (x > 20.f ? 1.f : gdn_sigmoid(x));
            gdn_store(t, da, r * HV + j, &dx, 1);
            sA += (double)d * (double)(A * gdn_softplus(x));
            sb += dx;
        }
        dA_log[j] = (float)sA;
        if (ddt_bias) ddt_bias[j] = (float)sb;
    }
}
