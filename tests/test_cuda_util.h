/* Private to the CUDA layer-op device tests (test_cuda_layer.c, test_cuda_conv1d.c,
 * test_cuda_norm.c): device buffers, checks on device tensors, the rerun check
 * (obuf), the dtypes swept, and the case groups test_cuda_layer() calls. */
#ifndef GDN_TEST_CUDA_UTIL_H
#define GDN_TEST_CUDA_UTIL_H
#ifdef GDN_HAVE_CUDA
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include "test_util.h"

/* ---- device buffers ---- */

static inline void *dalloc_dev(size_t n) {
    void *d = NULL;
    if (cudaMalloc(&d, n ? n : 4) != cudaSuccess) { fprintf(stderr, "cudaMalloc failed\n"); exit(1); }
    return d;
}
static inline void *dput(const void *h, size_t n) {
    void *d = dalloc_dev(n);
    if (n) cudaMemcpy(d, h, n, cudaMemcpyHostToDevice);
    return d;
}
static inline void dget(void *h, const void *d, size_t n) { if (n) cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost); }
/* 1 when the n device bytes at d equal the host bytes at h */
static inline int dsame(const void *d, const void *h, size_t n) {
    if (!n) return 1;
    void *t = t_alloc(n);
    dget(t, d, n);
    const int same = !memcmp(t, h, n);
    free(t);
    return same;
}
/* a device copy of h (n elements of t) placed `off` elements into a fresh buffer: off = 1 misaligns it */
static inline void *dput_at(const void *h, size_t n, gdn_dtype t, int off, void **base) {
    const size_t es = t_dsize(t);
    *base = dalloc_dev((n + 1) * es);
    char *p = (char *)*base + (size_t)off * es;
    if (n) cudaMemcpy(p, h, n * es, cudaMemcpyHostToDevice);
    return p;
}
/* n NaNs of dtype t on the device (at offset off, as dput_at) */
static inline void *dnan_at(gdn_dtype t, size_t n, int off, void **base) {
    void *h = t_alloc(n * t_dsize(t) + 1);
    t_poison_nan(t, h, n);
    void *p = dput_at(h, n, t, off, base);
    free(h);
    return p;
}
static inline double *dvec(size_t n) { return t_alloc(n * sizeof(double)); }

/* n random values N(0, s^2) rounded to t: host buffer and the doubles */
static inline void *rnd(rng *r, gdn_dtype t, size_t n, double s, double *d) {
    void *p = t_alloc(n * t_dsize(t) + 1);
    for (size_t i = 0; i < n; i++) d[i] = t_store(t, p, i, (float)(s * rng_normal(r)));
    return p;
}

/* status OK and the stream's work done without a CUDA error; counts one check */
static inline int ran(const char *ctx, gdn_status s) {
    const cudaError_t e = cudaDeviceSynchronize();
    return check(s == GDN_OK && e == cudaSuccess, ctx, "status %s (%s), cuda %s", gdn_status_string(s), gdn_last_error(),
                 cudaGetErrorString(e));
}

/* check_close on a device tensor */
static inline void dclose(const char *ctx, const char *what, gdn_dtype t, const void *d, const double *ref, size_t n,
                   double bound) {
    void *h = t_alloc(n * t_dsize(t));
    dget(h, d, n * t_dsize(t));
    check_close(ctx, what, t, h, ref, n, bound);
    free(h);
}

/* check_close_terms on a device tensor (docs/DESIGN.md §5: sums that cancel) */
static inline void dclose_terms(const char *ctx, const char *what, gdn_dtype t, const void *d, const double *ref,
                         const double *terms2, size_t n, double bound) {
    void *h = t_alloc(n * t_dsize(t));
    dget(h, d, n * t_dsize(t));
    check_close_terms(ctx, what, t, h, ref, terms2, n, bound);
    free(h);
}

/* the n elements of host tensor h (dtype t) as doubles: another backend's output as a reference */
static inline double *as_d(gdn_dtype t, const void *h, size_t n) {
    double *d = dvec(n);
    for (size_t i = 0; i < n; i++) d[i] = t_get(t, h, i);
    return d;
}

/* A call's device outputs (d NULL: not wanted), for the rerun check: keep()
 * saves their bytes and poisons them with NaN, same() then says whether a
 * second run wrote the very same bits, and frees what keep() saved. */
typedef struct obuf { void *d; gdn_dtype t; size_t n; } obuf;

static inline void obuf_keep(const obuf *o, int no, void **keep) {
    for (int i = 0; i < no; i++) {
        keep[i] = NULL;
        if (!o[i].d) continue;
        const size_t bytes = o[i].n * t_dsize(o[i].t);
        keep[i] = t_alloc(bytes);
        dget(keep[i], o[i].d, bytes);
        void *nan = t_alloc(bytes + 1);
        t_poison_nan(o[i].t, nan, o[i].n);
        if (bytes) cudaMemcpy(o[i].d, nan, bytes, cudaMemcpyHostToDevice);
        free(nan);
    }
}

static inline int obuf_same(const obuf *o, int no, void **keep) {
    int same = 1;
    for (int i = 0; i < no; i++) {
        if (!o[i].d) continue;
        same &= dsame(o[i].d, keep[i], o[i].n * t_dsize(o[i].t));
        free(keep[i]);
    }
    return same;
}

static const gdn_dtype dts[3] = {GDN_F32, GDN_BF16, GDN_F16};

/* the case groups, in the order test_cuda_layer() runs them */
void test_conv_fwd(rng *r);      /* test_cuda_conv1d.c */
void test_conv_update(rng *r);
void test_conv_bwd(rng *r);
void test_norms(rng *r);         /* test_cuda_norm.c */
void test_norms_bwd(rng *r);
void test_cuda_bad_input(rng *r);   /* test_cuda_bad_input.c */
#endif /* GDN_HAVE_CUDA */
#endif
