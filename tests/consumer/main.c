/* A program outside the project built against an installed gdn (find_package or
 * pkg-config): one small chunked forward on the CPU, checked to succeed and to give
 * finite outputs. Prints one line; exits 0 on success, 1 otherwise. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "gdn.h"

int main(void) {
    enum { B = 1, T = 8, H = 1, HV = 1, K = 4, V = 4 };
    float q[B * T * H * K], k[B * T * H * K], v[B * T * HV * V], g[B * T * HV], beta[B * T * HV];
    float o[B * T * HV * V], ht[B * HV * K * V];
    for (int i = 0; i < B * T * H * K; i++) {
        q[i] = 0.1f * (float)(i % 5);
        k[i] = 0.2f - 0.05f * (float)(i % 7);
    }
    for (int i = 0; i < B * T * HV * V; i++) v[i] = 0.01f * (float)i;
    for (int i = 0; i < B * T * HV; i++) {
        g[i] = -0.1f;     /* log decay */
        beta[i] = 0.5f;
    }
    gdn_config cfg = {.B = B, .T = T, .H = H, .HV = HV, .K = K, .V = V, .dtype = GDN_F32, .gate_dtype = GDN_F32};
    gdn_exec ex = {.backend = GDN_BACKEND_CPU};
    size_t ws_bytes = gdn_chunk_fwd_workspace_size(&ex, &cfg);
    void *ws = malloc(ws_bytes ? ws_bytes : 1);
    gdn_fwd_args a = {.q = q, .k = k, .v = v, .g = g, .beta = beta, .o = o, .ht = ht,
                      .workspace = ws, .workspace_bytes = ws_bytes};
    gdn_status s = gdn_chunk_fwd(&ex, &cfg, &a);
    free(ws);
    if (s != GDN_OK) {
        fprintf(stderr, "gdn_chunk_fwd: %s: %s\n", gdn_status_string(s), gdn_last_error());
        return 1;
    }
    for (int i = 0; i < B * T * HV * V; i++)
        if (!isfinite(o[i])) { fprintf(stderr, "o[%d] is not finite\n", i); return 1; }
    for (int i = 0; i < B * HV * K * V; i++)
        if (!isfinite(ht[i])) { fprintf(stderr, "ht[%d] is not finite\n", i); return 1; }
    printf("gdn %d.%d consumer: gdn_chunk_fwd OK, o[last] = %.6f, ht[0] = %.6f\n",
           GDN_VERSION_MAJOR, GDN_VERSION_MINOR, o[B * T * HV * V - 1], ht[0]);
    return 0;
}
