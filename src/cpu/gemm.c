/* Register-blocked SIMD matrix product for the chunk sizes gdn uses
 * (M, N, Kd <= 256). op(A) is packed into MR-row panels and op(B) into
 * NR-column panels so the micro-kernel streams both with unit stride and keeps
 * an MR x NR block of C in registers. Vector width follows the build target
 * (AVX-512: 16 floats, else 8) through GCC/Clang vector extensions, so the
 * same source compiles everywhere. */
#include <string.h>
#include "cpu/gemm.h"

#if defined(__AVX512F__)
#define VL 16
#else
#define VL 8
#endif
#define MR 8
#define NR (2 * VL)
#define KMAX 256

typedef float vf __attribute__((vector_size(VL * 4)));

static inline vf vload(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
static inline void vstore(float *p, vf v) { memcpy(p, &v, sizeof v); }

/* C block (mr x nr) = alpha * Ap Bp (+ C). Ap: Kd x MR, Bp: Kd x NR, both packed. */
static void micro(int Kd, const float *restrict Ap, const float *restrict Bp, float alpha,
                  int accumulate, float *C, int64_t ldc, int mr, int nr) {
    vf c0[MR], c1[MR];
    for (int i = 0; i < MR; i++) { c0[i] = (vf){0}; c1[i] = (vf){0}; }
    for (int p = 0; p < Kd; p++) {
        vf b0 = vload(Bp + (int64_t)p * NR), b1 = vload(Bp + (int64_t)p * NR + VL);
        const float *a = Ap + (int64_t)p * MR;
        for (int i = 0; i < MR; i++) {
            vf ai = (vf){0} + a[i];
            c0[i] += ai * b0;
            c1[i] += ai * b1;
        }
    }
    if (mr == MR && nr == NR) {
        for (int i = 0; i < MR; i++) {
            float *ci = C + i * ldc;
            vf r0 = c0[i] * alpha, r1 = c1[i] * alpha;
            if (accumulate) { r0 += vload(ci); r1 += vload(ci + VL); }
            vstore(ci, r0); vstore(ci + VL, r1);
        }
        return;
    }
    float tmp[NR];
    for (int i = 0; i < mr; i++) {
        vstore(tmp, c0[i] * alpha); vstore(tmp + VL, c1[i] * alpha);
        float *ci = C + i * ldc;
        if (accumulate) for (int j = 0; j < nr; j++) ci[j] += tmp[j];
        else for (int j = 0; j < nr; j++) ci[j] = tmp[j];
    }
}

static void gemm_block(int M, int N, int Kd, float alpha, const float *A, int64_t lda, int ta,
                       const float *B, int64_t ldb, int tb, int accumulate, float *C, int64_t ldc) {
    /* packed panels live on the stack: Kd <= KMAX rows each */
    float Ap[KMAX * MR] __attribute__((aligned(64)));
    float Bp[KMAX * NR] __attribute__((aligned(64)));
    for (int j0 = 0; j0 < N; j0 += NR) {
        int nr = N - j0 < NR ? N - j0 : NR;
        for (int p = 0; p < Kd; p++) {
            float *dst = Bp + (int64_t)p * NR;
            if (!tb) {
                const float *src = B + (int64_t)p * ldb + j0;
                for (int j = 0; j < nr; j++) dst[j] = src[j];
            } else {
                for (int j = 0; j < nr; j++) dst[j] = B[(int64_t)(j0 + j) * ldb + p];
            }
            for (int j = nr; j < NR; j++) dst[j] = 0.f;
        }
        for (int i0 = 0; i0 < M; i0 += MR) {
            int mr = M - i0 < MR ? M - i0 : MR;
            for (int p = 0; p < Kd; p++) {
                float *dst = Ap + (int64_t)p * MR;
                if (!ta) for (int i = 0; i < mr; i++) dst[i] = A[(int64_t)(i0 + i) * lda + p];
                else {
                    const float *src = A + (int64_t)p * lda + i0;
                    for (int i = 0; i < mr; i++) dst[i] = src[i];
                }
                for (int i = mr; i < MR; i++) dst[i] = 0.f;
            }
            micro(Kd, Ap, Bp, alpha, accumulate, C + (int64_t)i0 * ldc + j0, ldc, mr, nr);
        }
    }
}

void gdn_gemm(int M, int N, int Kd, float alpha, const float *A, int64_t lda, int ta,
              const float *B, int64_t ldb, int tb, int accumulate, float *C, int64_t ldc) {
    if (M <= 0 || N <= 0) return;
    if (Kd <= 0) {
        if (!accumulate) for (int i = 0; i < M; i++) memset(C + (int64_t)i * ldc, 0, (size_t)N * sizeof(float));
        return;
    }
    /* split the reduction so packed panels fit their buffers; the split is a
     * function of the shape only, so results do not depend on threads */
    for (int p0 = 0; p0 < Kd; p0 += KMAX) {
        int kd = Kd - p0 < KMAX ? Kd - p0 : KMAX;
        const float *Ak = ta ? A + (int64_t)p0 * lda : A + p0;
        const float *Bk = tb ? B + p0 : B + (int64_t)p0 * ldb;
        gemm_block(M, N, kd, alpha, Ak, lda, ta, Bk, ldb, tb, accumulate || p0 > 0, C, ldc);
    }
}
