/* Standalone L2 norm per row:  y = x * r,  r = rsqrt(sum x^2 + 1e-6)
 * backward:  dx = r * (dy - y (y . dy)) */
#include <stdlib.h>
#include "cpu/cpu_backend.h"

void gdn_cpu_l2norm_fwd(int threads, int64_t rows, int dim, gdn_dtype t, const void *x,
                        void *y, float *rstd) {
    #pragma omp parallel num_threads(threads)
    {
        float *row = malloc((size_t)dim * sizeof(float));
        #pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            gdn_load(t, x, r * dim, row, dim);
            float ss = 0.f;
            for (int i = 0; i < dim; i++) ss += row[i] * row[i];
            const float rs = 1.0f / sqrtf(ss + GDN_L2_EPS);
            for (int i = 0; i < dim; i++) row[i] *= rs;
            gdn_store(t, y, r * dim, row, dim);
            if (rstd) rstd[r] = rs;
        }
        free(row);
    }
}

void gdn_cpu_l2norm_bwd(int threads, int64_t rows, int dim, gdn_dtype t, const void *x,
                        const float *rstd, const void *dy, void *dx) {
    #pragma omp parallel num_threads(threads)
    {
        float *row = malloc((size_t)2 * dim * sizeof(float)), *drow = row + dim;
        #pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            gdn_load(t, x, r * dim, row, dim);
            gdn_load(t, dy, r * dim, drow, dim);
            const float rs = rstd[r];
            float dot = 0.f;
            for (int i = 0; i < dim; i++) { row[i] *= rs; dot += row[i] * drow[i]; }
            for (int i = 0; i < dim; i++) drow[i] = rs * (drow[i] - row[i] * dot);
            gdn_store(t, dx, r * dim, drow, dim);
        }
        free(row);
    }
}
