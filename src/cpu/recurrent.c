/* Recurrent forward, token by token, per (sequence n, value head j):
 *     S = exp(g_t) S;  u = beta_t (v_t - S^T k_t);  S += k_t u^T;  o_t = scale S^T q_t
 * S is fp32 in the caller's layout: k-first [K, V], each token two passes
 * over S vectorised over V; v-first [V, K], each token two passes over each
 * row (gdn_delta_rows4, four rows at a time) vectorised over K. No
 * transpose either way. */
#include <stdlib.h>
#include <string.h>
#include "cpu/cpu_backend.h"
#include "cpu/gemm.h"
#include "cpu/load.h"

void gdn_cpu_recurrent_fwd(const gdn_plan *p, const gdn_fwd_args *a) {
    const int K = p->c.K, V = p->c.V, HV = p->c.HV, G = p->G;
    const int vfirst = (p->c.flags & GDN_STATE_V_FIRST) != 0;
    const int64_t tasks = p->N * HV;
    #pragma omp parallel num_threads(p->threads)
    {
        float *S = malloc(sizeof(float) * ((size_t)K * V + 2 * K + 3 * V));
        float *q = S + (size_t)K * V, *k = q + K, *v = k + K, *u = v + V, *o = u + V;
        const unsigned fpmode = gdn_ftz_begin();
        #pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; task++) {
            const int64_t n = task / HV;
            const int j = (int)(task % HV), h = j / G;
            int64_t bos, len;
            gdn_seq(p, n, &bos, &len);
            const size_t kv = (size_t)K * V;
            if (!vfirst) gdn_cpu_load_state(p, a->h0, n, j, S);
            else if (a->h0) memcpy(S, a->h0 + (n * HV + j) * kv, kv * sizeof(float));
            else memset(S, 0, kv * sizeof(float));
            for (int64_t t = 0; t < len; t++) {
                const int64_t r = bos + t;
                float g, beta;
                gdn_cpu_load_qk(p, a->q, r, 1, h, q, NULL, NULL);
                gdn_cpu_load_qk(p, a->k, r, 1, h, k, NULL, NULL);
                gdn_cpu_load_v(p, a->v, r, 1, j, v);
                gdn_cpu_load_gate(p, a->g, a->A_log, a->dt_bias, r, 1, j, &g);
                gdn_cpu_load_beta(p, a->beta, r, 1, j, &beta);
                const float decay = expf(g);
                if (vfirst) {
                    int c = 0;
                    for (; c + 4 <= V; c += 4) {   /* four rows at a time: their lane sums interleave */
                        gdn_delta_rows4(S + (size_t)c * K, K, k, q, K, decay, beta, v + c, o + c);
                        for (int r = 0; r < 4; r++) o[c + r] *= p->c.scale;
                    }
                    for (; c < V; c++) o[c] = p->c.scale * gdn_delta_row(S + (size_t)c * K, k, q, K, decay, beta, v[c]);
                    gdn_store(p->c.dtype, a->o, (r * HV + j) * V, o, V);
                    continue;
                }
                memset(u, 0, sizeof(float) * V);
                for (int i = 0; i < K; i++) {          /* S *= decay; u = S^T k */
                    float *Si = S + (size_t)i * V;
                    const float ki = k[i];
                    for (int c = 0; c < V; c++) { Si[c] *= decay; u[c] += ki * Si[c]; }
                }
                for (int c = 0; c < V; c++) { u[c] = beta * (v[c] - u[c]); o[c] = 0.f; }
                for (int i = 0; i < K; i++) {          /* S += k u^T; o = S^T q */
                    float *Si = S + (size_t)i * V;
                    const float ki = k[i], qi = q[i];
                    for (int c = 0; c < V; c++) { Si[c] += ki * u[c]; o[c] += qi * Si[c]; }
                }
                for (int c = 0; c < V; c++) o[c] *= p->c.scale;
                gdn_store(p->c.dtype, a->o, (r * HV + j) * V, o, V);
            }
            if (a->ht && !vfirst) gdn_cpu_store_state(p, a->ht, n, j, S);
            else if (a->ht) memcpy(a->ht + (n * HV + j) * kv, S, kv * sizeof(float));
        }
        free(S);
        gdn_ftz_end(fpmode);
    }
}
