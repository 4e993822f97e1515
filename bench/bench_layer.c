/* Bench of the GDN layer pieces on the CPU: the fused decode step, the causal
 * conv1d and the gated RMSNorm, as GB/s against this machine's copy
 * bandwidth measured in the same run (a large memcpy; read + write bytes).
 * These ops are memory-bound: the decode step moves the state (read and
 * written once per step), the others their tensors once. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "gdn.h"

void bench_conv1d(int threads, int reps);
void bench_rmsnorm(int threads, int reps);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *t, int n) { qsort(t, n, sizeof *t, cmp_d); return t[n / 2]; }

/* copy bandwidth: memcpy of 512 MiB, bytes read + written, best of 5 */
static double copy_gbs(int threads) {
    const size_t n = (size_t)512 << 20;
    char *a = malloc(n), *b = malloc(n);
    memset(a, 1, n);
    memset(b, 2, n);
    double best = 0;
    for (int r = 0; r < 5; r++) {
        const double t0 = now();
        #pragma omp parallel for num_threads(threads) schedule(static)
        for (int c = 0; c < 64; c++) memcpy(b + (size_t)c * (n / 64), a + (size_t)c * (n / 64), n / 64);
        const double gbs = 2.0 * n / (now() - t0) * 1e-9;
        if (gbs > best) best = gbs;
    }
    free(a);
    free(b);
    return best;
}

int main(int argc, char **argv) {
    int threads = 2, reps = 20;
    for (int i = 1; i < argc; i++) {
        if (!strncmp(argv[i], "--threads=", 10)) threads = atoi(argv[i] + 10);
        else if (!strncmp(argv[i], "--reps=", 7)) reps = atoi(argv[i] + 7);
        else { fprintf(stderr, "usage: %s [--threads=N] [--reps=N]\n", argv[0]); return 2; }
    }
    const double copy = copy_gbs(threads);
    printf("gdn layer bench, %d threads, median of %d\n", threads, reps);
    printf("copy bandwidth (memcpy 512 MiB, read+write)     %7.1f GB/s\n\n", copy);
    printf("%-44s %10s %9s %8s\n", "op", "time us", "GB/s", "% copy");

    /* decode step: H=16, HV=32, K=V=128, bf16 inputs, fp32 state, l2norm */
    const int H = 16, HV = 32, K = 128, V = 128, D = 2 * H * K + HV * V;
    const int Bs[3] = {1, 32, 256};
    for (int bi = 0; bi < 3; bi++) {
        const int B = Bs[bi];
        /* rotate over several pools so the state is not served from cache */
        const int npool = B * (size_t)HV * K * V * 4 < (64u << 20) ? 8 : 2;
        const size_t st_n = (size_t)B * HV * K * V;
        float *state = malloc(sizeof(float) * st_n * npool);
        for (size_t i = 0; i < st_n * npool; i++) state[i] = 1e-3f * (float)(i % 97);
        uint16_t *x = malloc(2 * (size_t)B * D), *ga = malloc(2 * (size_t)B * HV), *gb = malloc(2 * (size_t)B * HV),
                 *o = malloc(2 * (size_t)B * HV * V);
        for (size_t i = 0; i < (size_t)B * D; i++) x[i] = 0x3c00 + (uint16_t)(i % 64);
        for (size_t i = 0; i < (size_t)B * HV; i++) { ga[i] = 0x3f00; gb[i] = 0x3f00; }
        float A_log[32], dt_bias[32];
        for (int j = 0; j < HV; j++) { A_log[j] = 0.5f; dt_bias[j] = 0.1f; }
        gdn_decode_config c = {.B = B, .H = H, .HV = HV, .K = K, .V = V, .dtype = GDN_BF16, .flags = GDN_QK_L2NORM,
                               .num_slots = B};
        gdn_decode_args a = {.mixed_qkv = x, .a = ga, .b = gb, .A_log = A_log, .dt_bias = dt_bias, .o = o};
        gdn_exec ex = {GDN_BACKEND_CPU, NULL, threads, 0};
        double *t = malloc(sizeof(double) * reps);
        for (int r = -1; r < reps; r++) {
            a.state = state + st_n * (size_t)((r + npool) % npool);
            const double t0 = now();
            if (gdn_decode_step(&ex, &c, &a) != GDN_OK) { fprintf(stderr, "%s\n", gdn_last_error()); return 1; }
            if (r >= 0) t[r] = now() - t0;
        }
        const double sec = median(t, reps), bytes = 2.0 * st_n * 4;   /* state read + written */
        char name[64];
        snprintf(name, sizeof name, "decode_step B%d H%d HV%d K%d V%d", B, H, HV, K, V);
        printf("%-44s %10.1f %9.1f %7.1f%%\n", name, sec * 1e6, bytes / sec * 1e-9, 100.0 * bytes / sec * 1e-9 / copy);
        free(t); free(state); free(x); free(ga); free(gb); free(o);
    }
    printf("\n");
    bench_conv1d(threads, reps);
    printf("\n");
    bench_rmsnorm(threads, reps);
    return 0;
}
