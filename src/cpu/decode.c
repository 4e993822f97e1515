/* CPU fused decode step: one token per row, one pass over each state.
 *
 * Per row b (pool row s = slots[b]) and value head j (q/k head h = j/G):
 *     [q, k, v] = split(mixed_qkv[b])       or  split(silu(conv_update(proj[b])))
 *     q, k      = l2norm(q), l2norm(k)                    (GDN_QK_L2NORM)
 *     g         = -exp(A_log[j]) * softplus(a[b,j] + dt_bias[j]),  beta = sigmoid(b[b,j])
 *     S         = exp(g) S;  u = beta (v - S^T k);  S += k u^T;  o = scale S^T q
 * The state is the memory traffic: v-first rows (one per value element) take
 * the decay, the dot with k, the update and the dot with q in one sweep;
 * k-first reads S once for S^T k and once more (from cache) to update. */
#include <stdlib.h>
#include <string.h>
#include "cpu/decode.h"
#include "cpu/gemm.h"

static inline float silu(float x) { return x / (1.f + expf(-x)); }

/* conv update of row b's D channels into x (f32); state row st [D, W] */
static void conv_row(const gdn_decode_config *c, const gdn_decode_args *a, int b, int64_t st, float *x) {
    const int W = c->conv_W, D = 2 * c->H * c->K + c->HV * c->V;
    float *S = a->conv_state + st * (int64_t)D * W;
    gdn_load(c->dtype, a->proj, (int64_t)b * D, x, D);
    for (int d = 0; d < D; d++) {
        float *sd = S + (int64_t)d * W;
        const float *wd = a->conv_weight + (int64_t)d * W;
        float acc = a->conv_bias ? a->conv_bias[d] : 0.f;
        for (int w = 0; w + 1 < W; w++) { sd[w] = sd[w + 1]; acc += wd[w] * sd[w]; }
        sd[W - 1] = x[d];
        acc += wd[W - 1] * x[d];
        x[d] = silu(acc);
    }
}

static void l2norm(float *x, int n) {
    const float r = 1.0f / sqrtf(gdn_dot(x, x, n) + GDN_L2_EPS);
    for (int i = 0; i < n; i++) x[i] *= r;
}

void gdn_cpu_decode_step(int threads, const gdn_decode_config *c, const gdn_decode_args *a) {
    const int B = c->B, H = c->H, HV = c->HV, K = c->K, V = c->V, G = HV / H;
    const int D = 2 * H * K + HV * V;
    const float scale = c->scale;
    const int vfirst = (c->flags & GDN_STATE_V_FIRST) != 0;
    /* the conv output of every row, f32 (the conv state of each row is updated once) */
    float *X = NULL;
    if (c->conv_W > 0) {
        X = malloc(sizeof(float) * (size_t)B * D);
        #pragma omp parallel for num_threads(threads) schedule(static)
        for (int b = 0; b < B; b++) {
            const int64_t st = a->slots ? a->slots[b] : b;
            if (st >= 0) conv_row(c, a, b, st, X + (size_t)b * D);
        }
    }
    #pragma omp parallel num_threads(threads)
    {
        const unsigned fpmode = gdn_ftz_begin();
        float *buf = malloc(sizeof(float) * (2 * (size_t)K + 3 * (size_t)V));
        float *q = buf, *k = q + K, *v = k + K, *u = v + V, *o = u + V;
        #pragma omp for schedule(static)
        for (int64_t task = 0; task < (int64_t)B * HV; task++) {
            const int b = (int)(task / HV), j = (int)(task % HV), h = j / G;
            const int64_t st = a->slots ? a->slots[b] : b;
            if (st < 0) {                                   /* padding: o row 0, nothing read */
                memset(o, 0, sizeof(float) * V);
                gdn_store(c->dtype, a->o, task * V, o, V);
                continue;
            }
            if (X) {
                const float *x = X + (size_t)b * D;
                memcpy(q, x + h * K, sizeof(float) * K);
                memcpy(k, x + H * K + h * K, sizeof(float) * K);
                memcpy(v, x + 2 * H * K + j * V, sizeof(float) * V);
            } else {
                gdn_load(c->dtype, a->mixed_qkv, (int64_t)b * D + h * K, q, K);
                gdn_load(c->dtype, a->mixed_qkv, (int64_t)b * D + H * K + h * K, k, K);
                gdn_load(c->dtype, a->mixed_qkv, (int64_t)b * D + 2 * H * K + j * V, v, V);
            }
            if (c->flags & GDN_QK_L2NORM) { l2norm(q, K); l2norm(k, K); }
            float ga, gb;
            gdn_load(c->dtype, a->a, task, &ga, 1);
            gdn_load(c->dtype, a->b, task, &gb, 1);
            const float g = -expf(a->A_log[j]) * gdn_softplus(ga + (a->dt_bias ? a->dt_bias[j] : 0.f));
            const float decay = expf(g);
            const float beta = ((c->flags & GDN_BETA_NEGATIVE) ? 2.f : 1.f) * gdn_sigmoid(gb);
            float *S = a->state + (st * HV + j) * (int64_t)K * V;
            if (vfirst) {          /* S^T stored: row e holds S[:, e] */
                for (int e = 0; e < V; e++) o[e] = scale * gdn_delta_row(S + (int64_t)e * K, k, q, K, decay, beta, v[e]);
            } else {
                memset(u, 0, sizeof(float) * V);
                for (int i = 0; i < K; i++) {               /* S *= decay; u = S^T k */
                    float *Si = S + (int64_t)i * V;
                    const float ki = k[i];
                    for (int e = 0; e < V; e++) { Si[e] *= decay; u[e] += ki * Si[e]; }
                }
                for (int e = 0; e < V; e++) { u[e] = beta * (v[e] - u[e]); o[e] = 0.f; }
                for (int i = 0; i < K; i++) {               /* S += k u^T; o = S^T q */
                    float *Si = S + (int64_t)i * V;
                    const float ki = k[i], qi = q[i];
                    for (int e = 0; e < V; e++) { Si[e] += ki * u[e]; o[e] += qi * Si[e]; }
                }
                for (int e = 0; e < V; e++) o[e] *= scale;
            }
            gdn_store(c->dtype, a->o, task * V, o, V);
        }
        free(buf);
        gdn_ftz_end(fpmode);
    }
    free(X);
}
