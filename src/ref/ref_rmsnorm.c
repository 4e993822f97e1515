/* float64 reference of the gated RMSNorm, written out literally.
 *
 * Forward, one row:  ms = sum_i x_i^2 / V,  r = (ms + eps)^(-1/2),
 *                    y_i = x_i r w_i gate(z_i).
 * Backward (reverse mode of the above), with a_i = dy_i w_i gate(z_i) the
 * gradient w.r.t. xhat_i = x_i r, and dr/dx_j = -r^3 x_j / V:
 *   dx_j = r a_j - (r^3 x_j / V) sum_i a_i x_i
 *   dz_i = dy_i x_i r w_i gate'(z_i)
 *   dw_i = sum over rows of dy_i x_i r gate(z_i)
 * gate'(z) = s (1 + z (1 - s)) for SiLU, s (1 - s) for sigmoid, s = sigmoid(z). */
#include <math.h>
#include <stdlib.h>
#include "ref/ref_rmsnorm.h"

static double sig(double z) { return 1.0 / (1.0 + exp(-z)); }

static double gate_of(gdn_norm_gate g, double z) { return g == GDN_NORM_GATE_SILU ? z * sig(z) : sig(z); }

static double gate_grad(gdn_norm_gate g, double z) {
    const double s = sig(z);
    return g == GDN_NORM_GATE_SILU ? s * (1.0 + z * (1.0 - s)) : s * (1.0 - s);
}

static double row_rstd(int V, double eps, const double *x) {
    double ss = 0;
    for (int i = 0; i < V; i++) ss += x[i] * x[i];
    return 1.0 / sqrt(ss / V + eps);
}

void gdn_ref_rmsnorm_fwd(int64_t rows, int V, double eps, gdn_norm_gate gate, const double *x,
                         const double *z, const double *w, double *y, double *rstd) {
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * V, *zr = z + r * V;
        const double rs = row_rstd(V, eps, xr);
        for (int i = 0; i < V; i++) y[r * V + i] = xr[i] * rs * w[i] * gate_of(gate, zr[i]);
        if (rstd) rstd[r] = rs;
    }
}

void gdn_ref_rmsnorm_bwd(int64_t rows, int V, double eps, gdn_norm_gate gate, const double *x,
                         const double *z, const double *w, const double *dy, double *dx,
                         double *dz, double *dw) {
    double *a = malloc((size_t)V * sizeof(double));
    if (dw) for (int i = 0; i < V; i++) dw[i] = 0;
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * V, *zr = z + r * V, *dyr = dy + r * V;
        const double rs = row_rstd(V, eps, xr);
        double sxa = 0;
        for (int i = 0; i < V; i++) {
            const double g = gate_of(gate, zr[i]);
            a[i] = dyr[i] * w[i] * g;
            sxa += a[i] * xr[i];
            if (dz) dz[r * V + i] = dyr[i] * xr[i] * rs * w[i] * gate_grad(gate, zr[i]);
            if (dw) dw[i] += dyr[i] * xr[i] * rs * g;
        }
        if (dx)
            for (int j = 0; j < V; j++) dx[r * V + j] = rs * a[j] - rs * rs * rs * xr[j] * sxa / V;
    }
    free(a);
}

void gdn_ref_rmsnorm_bwd_terms(int64_t rows, int V, double eps, gdn_norm_gate gate, const double *x,
                               const double *z, const double *w, const double *dy, double *dx_terms2,
                               double *dw_terms2) {
    for (int i = 0; i < V; i++) dw_terms2[i] = 0;
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * V, *zr = z + r * V, *dyr = dy + r * V;
        const double rs = row_rstd(V, eps, xr);
        double ax2 = 0;
        for (int i = 0; i < V; i++) {
            const double g = gate_of(gate, zr[i]), a = dyr[i] * w[i] * g, dwt = dyr[i] * xr[i] * rs * g;
            dw_terms2[i] += dwt * dwt;
            ax2 += (a * xr[i]) * (a * xr[i]);
        }
        for (int j = 0; j < V; j++) {
            const double a = dyr[j] * w[j] * gate_of(gate, zr[j]);
            dx_terms2[r * V + j] = rs * rs * (a * a + xr[j] * xr[j] * rs * rs * rs * rs * ax2 / ((double)V * V));
        }
    }
}
