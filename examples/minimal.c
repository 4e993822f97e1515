/* Chunked forward of one small Gated DeltaNet layer on the CPU. */
#include <stdio.h>
#include <stdlib.h>
#include "gdn.h"

static float *filled(size_t n) {   /* uniform in [-1, 1) */
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = 2.0f * rand() / ((float)RAND_MAX + 1) - 1.0f;
    return x;
}

int main(void) {
    enum { B = 2, T = 100, H = 2, HV = 4, K = 64, V = 64 };
    gdn_config cfg = {.B = B, .T = T, .H = H, .HV = HV, .K = K, .V = V, .dtype = GDN_F32,
                      .gate_dtype = GDN_F32, .flags = GDN_QK_L2NORM | GDN_GATE_FUSED | GDN_BETA_SIGMOID};
    const size_t saved_bytes = gdn_chunk_saved_size(&cfg);   /* kept for gdn_chunk_bwd */
    const size_t ws_bytes = gdn_chunk_fwd_workspace_size(NULL, &cfg);
    gdn_fwd_args a = {.q = filled(B * T * H * K), .k = filled(B * T * H * K), .v = filled(B * T * HV * V),
                      .g = filled(B * T * HV), .beta = filled(B * T * HV), .A_log = filled(HV),
                      .o = filled(B * T * HV * V), .ht = filled(B * HV * K * V),
                      .saved = malloc(saved_bytes), .saved_bytes = saved_bytes,
                      .workspace = malloc(ws_bytes), .workspace_bytes = ws_bytes};
    gdn_status s = gdn_chunk_fwd(NULL, &cfg, &a);   /* NULL exec: CPU, all threads */
    if (s != GDN_OK) {
        fprintf(stderr, "gdn_chunk_fwd: %s: %s\n", gdn_status_string(s), gdn_last_error());
        return 1;
    }
    printf("o[0] = %.6f  ht[0] = %.6f  saved %zu bytes, workspace %zu bytes\n",
           ((float *)a.o)[0], a.ht[0], saved_bytes, ws_bytes);
    void *bufs[] = {(void *)a.q, (void *)a.k, (void *)a.v, (void *)a.g, (void *)a.beta, (void *)a.A_log,
                    a.o, a.ht, a.saved, a.workspace};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
    return 0;
}
