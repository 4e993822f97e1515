/* Bench of the gated RMSNorm (gdn_rmsnorm_gated_fwd / _bwd) at the GDN output
 * shape: rows = B*T*HV = 1*4096*8, V = 128, bf16, SiLU gate, eps 1e-6.
 * Memory-bound: GB/s counts each tensor read or written once,
 *   fwd: x, z read, y written (dtype) + rstd written (f32) + w read
 *   bwd: x, z, dy read, dx, dz written (dtype) + rstd, w read + dw written.
 * Prints one line per op in bench_layer.c's columns: time (us, median of reps
 * after one warm-up) and GB/s. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "gdn.h"

static double rms_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int rms_cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

void bench_rmsnorm(int threads, int reps) {
    const int64_t rows = (int64_t)1 * 4096 * 8;
    const int V = 128;
    const size_t n = (size_t)rows * V;
    if (reps < 1) reps = 1;
    uint16_t *x = malloc(2 * n), *z = malloc(2 * n), *y = malloc(2 * n), *dy = malloc(2 * n), *dx = malloc(2 * n),
             *dz = malloc(2 * n);
    float *w = malloc(sizeof(float) * V), *dw = malloc(sizeof(float) * V), *rstd = malloc(sizeof(float) * rows);
    double *t = malloc(sizeof(double) * reps);
    if (!x || !z || !y || !dy || !dx || !dz || !w || !dw || !rstd || !t) {
        fprintf(stderr, "bench_rmsnorm: out of memory\n");
        goto done;
    }
    /* bf16 bit patterns of values in about +-[0.5, 2] with both signs */
    for (size_t i = 0; i < n; i++) {
        x[i] = (uint16_t)(0x3f00 + (i * 7) % 128) | (uint16_t)((i % 3 == 0) << 15);
        z[i] = (uint16_t)(0x3f00 + (i * 13) % 128) | (uint16_t)((i % 5 == 0) << 15);
        dy[i] = (uint16_t)(0x3f00 + (i * 5) % 128) | (uint16_t)((i % 2) << 15);
    }
    for (int i = 0; i < V; i++) w[i] = 1.0f + 0.01f * (float)(i % 7);
    const gdn_rmsnorm_config c = {rows, V, GDN_BF16, 1e-6f, GDN_NORM_GATE_SILU};
    const gdn_exec ex = {GDN_BACKEND_CPU, NULL, threads, 0};
    const double el = 2.0 * (double)n;   /* bytes of one [rows, V] bf16 tensor */
    for (int op = 0; op < 2; op++) {
        for (int r = -1; r < reps; r++) {
            const double t0 = rms_now();
            const gdn_status s = op == 0 ? gdn_rmsnorm_gated_fwd(&ex, &c, x, z, w, y, rstd)
                                         : gdn_rmsnorm_gated_bwd(&ex, &c, x, z, w, rstd, dy, dx, dz, dw);
            if (s != GDN_OK) { fprintf(stderr, "bench_rmsnorm: %s\n", gdn_last_error()); goto done; }
            if (r >= 0) t[r] = rms_now() - t0;
        }
        qsort(t, (size_t)reps, sizeof *t, rms_cmp);
        const double sec = t[reps / 2];
        const double bytes = op == 0 ? 3 * el + 4.0 * rows + 4.0 * V : 5 * el + 4.0 * rows + 8.0 * V;
        char name[80];
        snprintf(name, sizeof name, "rmsnorm_gated_%s rows%lld V%d bf16 silu", op == 0 ? "fwd" : "bwd",
                 (long long)rows, V);
        printf("%-44s %10.1f %9.1f   (%.3f ms)\n", name, sec * 1e6, bytes / sec * 1e-9, sec * 1e3);
    }
done:
    free(x); free(z); free(y); free(dy); free(dx); free(dz); free(w); free(dw); free(rstd); free(t);
}
