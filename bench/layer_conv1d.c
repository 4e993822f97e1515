/* Bench of the causal depthwise conv1d (gdn_conv1d_fwd / _bwd / _update) at
 * the GDN layer's shape: D = 2*H*K + HV*V with H=4, HV=8, K=V=128 (D=2048),
 * W=4, bf16, SiLU, bias, h0/ht (dht/dh0/dbias in backward).
 * Memory-bound: GB/s counts each tensor read or written once,
 *   fwd:    x read, y written (bf16) + weight, bias, h0 read + ht written (f32)
 *   bwd:    x, dy read, dx written (bf16) + weight, bias, h0, dht read +
 *           dweight, dbias, dh0 written (f32)
 *   update: x read, y written (bf16) + the state read and written (f32) +
 *           weight, bias read; B = 256 rows, one slot each.
 * Prints one line per op in bench_layer.c's columns: time (us, median of reps
 * after one warm-up), GB/s, and ms. */
#define _POSIX_C_SOURCE 199309L   /* clock_gettime under -std=c11 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "gdn.h"

static double conv_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int conv_cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

void bench_conv1d(int threads, int reps) {
    const int H = 4, HV = 8, K = 128, V = 128, D = 2 * H * K + HV * V, W = 4;
    const int64_t B = 1, T = 4096, BU = 256;
    const size_t n = (size_t)(B * T) * D, nst = (size_t)B * D * W, nu = (size_t)BU * D;
    if (reps < 1) reps = 1;
    uint16_t *x = malloc(2 * n), *y = malloc(2 * n), *dy = malloc(2 * n), *dx = malloc(2 * n);
    uint16_t *xu = malloc(2 * nu), *yu = malloc(2 * nu);
    float *w = malloc(sizeof(float) * D * W), *bias = malloc(sizeof(float) * D), *dw = malloc(sizeof(float) * D * W),
          *db = malloc(sizeof(float) * D), *h0 = malloc(sizeof(float) * nst), *ht = malloc(sizeof(float) * nst),
          *dht = malloc(sizeof(float) * nst), *dh0 = malloc(sizeof(float) * nst),
          *pool = malloc(sizeof(float) * nu * W);
    double *t = malloc(sizeof(double) * reps);
    if (!x || !y || !dy || !dx || !xu || !yu || !w || !bias || !dw || !db || !h0 || !ht || !dht || !dh0 || !pool || !t) {
        fprintf(stderr, "bench_conv1d: out of memory\n");
        goto done;
    }
    /* bf16 bit patterns of values in about +-[0.5, 2] with both signs */
    for (size_t i = 0; i < n; i++) {
        x[i] = (uint16_t)(0x3f00 + (i * 7) % 128) | (uint16_t)((i % 3 == 0) << 15);
        dy[i] = (uint16_t)(0x3f00 + (i * 5) % 128) | (uint16_t)((i % 2) << 15);
    }
    for (size_t i = 0; i < nu; i++) xu[i] = (uint16_t)(0x3f00 + (i * 11) % 128) | (uint16_t)((i % 5 == 0) << 15);
    for (int i = 0; i < D * W; i++) w[i] = 0.25f - 0.01f * (float)(i % 9);
    for (int i = 0; i < D; i++) bias[i] = 0.01f * (float)(i % 5);
    for (size_t i = 0; i < nst; i++) { h0[i] = 0.1f * (float)(i % 7); dht[i] = 0.05f * (float)(i % 3); }
    for (size_t i = 0; i < nu * W; i++) pool[i] = 0.1f * (float)(i % 11);

    gdn_conv1d_config c = {0};
    c.B = B; c.T = T; c.D = D; c.W = W; c.dtype = GDN_BF16; c.silu = 1;
    gdn_conv1d_config cu = c;
    cu.B = BU; cu.T = 1;
    const gdn_exec ex = {GDN_BACKEND_CPU, NULL, threads, 0};
    const gdn_conv1d_args fa = {x, w, bias, h0, y, ht};
    const gdn_conv1d_bwd_args ba = {x, w, bias, h0, dy, dht, dx, dw, db, dh0};
    const double el = 2.0 * (double)n, st = 4.0 * (double)nst, par = 4.0 * D * (W + 1);
    for (int op = 0; op < 3; op++) {
        for (int r = -1; r < reps; r++) {
            const double t0 = conv_now();
            const gdn_status s = op == 0 ? gdn_conv1d_fwd(&ex, &c, &fa)
                               : op == 1 ? gdn_conv1d_bwd(&ex, &c, &ba)
                                         : gdn_conv1d_update(&ex, &cu, xu, w, bias, pool, BU, NULL, yu);
            if (s != GDN_OK) { fprintf(stderr, "bench_conv1d: %s\n", gdn_last_error()); goto done; }
            if (r >= 0) t[r] = conv_now() - t0;
        }
        qsort(t, (size_t)reps, sizeof *t, conv_cmp);
        const double sec = t[reps / 2];
        const double bytes = op == 0 ? 2 * el + par + 2 * st
                           : op == 1 ? 3 * el + 2 * par + 4 * st
                                     : 2 * 2.0 * nu + 2 * 4.0 * nu * W + par;
        char name[80];
        if (op < 2)
            snprintf(name, sizeof name, "conv1d_%s B%lld T%lld D%d W%d bf16 silu", op == 0 ? "fwd" : "bwd",
                     (long long)B, (long long)T, D, W);
        else
            snprintf(name, sizeof name, "conv1d_update B%lld D%d W%d bf16 silu", (long long)BU, D, W);
        printf("%-44s %10.1f %9.1f   (%.3f ms)\n", name, sec * 1e6, bytes / sec * 1e-9, sec * 1e3);
    }
done:
    free(x); free(y); free(dy); free(dx); free(xu); free(yu); free(w); free(bias); free(dw); free(db);
    free(h0); free(ht); free(dht); free(dh0); free(pool); free(t);
}
