/* Causal depthwise conv1d on the CPU (DESIGN.md §4 item 4). For sequence n
 * (rows bos..bos+L-1 of x [B*T, D]) and channel d, with the extended input
 *     xx[s] = x[bos+s, d] (0 <= s < L),   h0[n, d, W+s] (-W <= s < 0; 0 without h0)
 * forward:
 *     z[t] = bias[d] + sum_{w<W} weight[d,w] xx[t-W+1+w],   y[t] = act(z[t])
 *     ht[n, d, j] = xx[L-W+j]                         (last W inputs, newest last)
 * backward, dz[t] = dy[t] act'(z[t]) (z recomputed):
 *     dweight[d,w] = sum_t dz[t] xx[t-W+1+w],   dbias[d] = sum_t dz[t]
 *     dxx[s] = sum_w dz[s+W-1-w] weight[d,w]  (0 <= s+W-1-w < L)  + dht[n,d,s-L+W] (s >= L-W)
 *     dx[bos+s] = dxx[s] (s >= 0),   dh0[n,d,W+s] = dxx[s] (s < 0)
 *
 * Channels never mix, so all work is split into channel blocks of CB
 * contiguous channels (vectorised over the block) and walked token by token
 * through a small row buffer that carries the last W-1 inputs. The forward
 * threads over chunks of the flattened tokens (TC rows or fewer; no
 * reductions, so the chunking changes no bit). bf16 rows with D a whole
 * number of vectors, past a sequence's first W - 1 tokens, go row by row
 * over all channels, four at a time, every tap read from x (conv_direct_bf16: no row
 * buffer); bf16 outputs take the SiLU without a division, within their
 * rounding (gdn_silu_bf16_v); the rest walks a chunk SB tokens at a time across all channel
 * blocks, i.e. memory row by row, prefetching each block's x rows PFS
 * sub-blocks ahead (where x comes from memory rather than L3, its rows
 * 4 KiB apart otherwise wait on it); a bf16 row of a full channel block goes
 * in one pass (convert, convolve into an fp32 row, then SiLU and rounding on
 * cpu/act.h's vectors, store: conv_rows_bf16; outputs of GDN_STREAM_BYTES or
 * more by streaming stores, cpu/stream.h), other rows through f32 row
 * buffers. The backward of bf16 with D a whole number of vectors walks
 * tokens down each vector of channels with its state in registers
 * (bwd_direct: each input row read once and prefetched a walk ahead, dz
 * and the sums never leave the registers, dx stored as it comes, or for a
 * large dx into staging rows streamed out whole); every other backward
 * deals whole channel blocks to threads, each walking its blocks SBB tokens
 * at a time across them (rows again; twice the forward's SB, which halves
 * the sub-blocks' fixed cost), so every block's dweight / dbias is
 * summed in token order (fp32 over SBB tokens, then fp64) and has the same
 * bits whatever the thread count; bf16 full blocks take their first pass
 * (dz, the sums) and their dx rows in one pass each (bwd_rows_bf16,
 * dx_rows_bf16, dx rounded on the vectors and streaming as y does). Both
 * run with FTZ / DAZ (common/common.h). W is a compile-time constant inside
 * the kernels (one instance per W = 1..8). */
#include <stdlib.h>
#include <string.h>
#include "cpu/conv1d.h"
#include "cpu/act.h"
#include "cpu/stream.h"
#ifdef _OPENMP
#include <omp.h>
#endif

enum { CB = 64, SB = 16, SBB = 32, TC = 256, WMAX = 8, PFS = 2 };

#define INLINE static inline __attribute__((always_inline))


/* ---- rows of one channel block, converted to / from f32 (common/convert.c) ---- */

/* bf16 rows inline (the common case; a call per 64-channel row costs as much as its work) */
static inline void load_row(gdn_dtype t, const void *src, int64_t off, float *dst, int n) {
    if (t == GDN_BF16) gdn_bf16_row_load((const uint16_t *)src + off, dst, n);
    else gdn_load(t, src, off, dst, n);
}
static inline void store_row(gdn_dtype t, void *dst, int64_t off, const float *src, int n) {
    if (t == GDN_BF16) gdn_bf16_row_store(src, (uint16_t *)dst + off, n);
    else gdn_store(t, dst, off, src, n);
}

/* prefetch the CB channels at element off of a dtype-t tensor */
static inline void prefetch_row(gdn_dtype t, const void *p, int64_t off) {
    const size_t es = t == GDN_F32 ? 4 : 2;
    const char *b = (const char *)p + (size_t)off * es;
    for (size_t k = 0; k < CB * es; k += 64) __builtin_prefetch(b + k);
}

/* wt[w][c] = weight[d0+c, w], bv[c] = bias[d0+c]; zeros past nc */
static void block_weights(const float *weight, const float *bias, int W, int d0, int nc, float wt[WMAX][CB],
                          float bv[CB]) {
    memset(wt, 0, sizeof(float) * WMAX * CB);
    for (int c = 0; c < CB; c++) bv[c] = (bias && c < nc) ? bias[d0 + c] : 0.f;
    for (int c = 0; c < nc; c++)
        for (int w = 0; w < W; w++) wt[w][c] = weight[(int64_t)(d0 + c) * W + w];
}

/* xx[s] (s < 0) of channels d0.. of sequence n, from h0 [N,D,W] or zeros */
static void state_row(const float *h0, int64_t n, int D, int W, int d0, int nc, int64_t s, float *r) {
    if (!h0) { memset(r, 0, sizeof(float) * (size_t)nc); return; }
    const float *h = h0 + ((int64_t)n * D + d0) * W + W + s;
    for (int c = 0; c < nc; c++) r[c] = h[(int64_t)c * W];
}

/* ---- the kernels, W fixed ---- */

/* z rows i < nb: z[i] = bv + sum_w wt[w] * xb[i+w]; xb rows are CB apart */
INLINE void conv_z(const int W, int nb, const float *xb, const float wt[WMAX][CB], const float *bv, float *z) {
    for (int i = 0; i < nb; i++) {
        const float *r = xb + i * CB;
        float *o = z + i * CB;
        for (int c = 0; c < CB; c++) {
            float acc = bv[c];
            for (int w = 0; w < W; w++) acc += wt[w][c] * r[w * CB + c];
            o[c] = acc;
        }
    }
}

/* dz = dy * act'(z), act'(z) = s (1 + z (1 - s)) for SiLU, s = sigmoid(z) */
static void silu_grad_rows(const float *z, const float *dy, float *dz, int n) {
    for (int i = 0; i < n; i++) {
        const float s = gdn_sigmoidf(z[i]);
        dz[i] = dy[i] * s * (1.f + z[i] * (1.f - s));
    }
}

/* dwf[w] += sum_i dz[i] * xb[i+w], dbf += sum_i dz[i]  (fp32, token order) */
INLINE void conv_dw(const int W, int nb, const float *xb, const float *dz, float dwf[WMAX][CB], float *dbf) {
    for (int i = 0; i < nb; i++) {
        const float *r = xb + i * CB, *g = dz + i * CB;
        for (int c = 0; c < CB; c++) {
            dbf[c] += g[c];
            for (int w = 0; w < W; w++) dwf[w][c] += g[c] * r[w * CB + c];
        }
    }
}

/* dxx row i = sum_w dzb[W-1+i-w] * wt[w] */
INLINE void conv_dx(const int W, int nb, const float *dzb, const float wt[WMAX][CB], float *dxr) {
    for (int i = 0; i < nb; i++) {
        float *o = dxr + i * CB;
        for (int c = 0; c < CB; c++) {
            float acc = 0.f;
            for (int w = 0; w < W; w++) acc += dzb[(W - 1 + i - w) * CB + c] * wt[w][c];
            o[c] = acc;
        }
    }
}

/* bf16 rows i < nb of a full channel block in one pass each: x row i
 * (x + i*D) converted into xb row W-1+i, z = bv + sum_w wt[w] xb[i+w] (the
 * order of conv_z), SiLU where asked, y row i stored in bf16; no z buffer */
INLINE void conv_rows_bf16(const int W, int nb, const uint16_t *restrict x, uint16_t *restrict y, int64_t D, float *restrict xb,
                           const float wt[WMAX][CB], const float *restrict bv, const int silu, int stream) {
    for (int i = 0; i < nb; i++) {
        const uint16_t *xr = x + (int64_t)i * D;
        uint16_t *yr = y + (int64_t)i * D;
        const float *r = xb + i * CB;
        float *xn = xb + (W - 1 + i) * CB;
        float zr[CB] __attribute__((aligned(64)));
        uint16_t out[CB] __attribute__((aligned(64)));
        for (int c = 0; c < CB; c++) {
            const float v = gdn_bf16_f32(xr[c]);
            xn[c] = v;
            float acc = bv[c];
            for (int w = 0; w < W - 1; w++) acc += wt[w][c] * r[w * CB + c];
            zr[c] = acc + wt[W - 1][c] * v;
        }
        for (int c = 0; c < CB; c += GDN_AVL) {
            gdn_av zv;
            memcpy(&zv, zr + c, sizeof zv);
            gdn_bf16_store_v(out + c, silu ? gdn_silu_bf16_v(zv) : zv);
        }
        gdn_store16_row(yr, out, CB, stream);
    }
}

/* bf16 rows r < nr whose W taps are all inputs (x row r - W + 1 .. r, every
 * channel, D a whole number of vectors), walked four rows at a time over
 * all D channels (their W + 3 input vectors converted once, not 4 W: -20 %,
 * bench/NOTES.md CPU v22), the rest row by row:
 * z = bias + sum_w wT[w] x[r - W + 1 + w] in conv_rows_bf16's order
 * (so the same bits), SiLU where asked, y stored (streaming where asked and y
 * is 32-byte aligned). No row buffer: the taps' rows are the last W - 1 rows
 * read (L1 / L2), and the walk is the memory's order (conv_rows_bf16's
 * pieces of 16 tokens x 64 channels spent ~1/3 of the pass reloading their
 * history rows, bench/NOTES.md CPU v18) */
INLINE void conv_direct_bf16(const int W, int64_t nr, const uint16_t *restrict x, uint16_t *restrict y, int64_t D,
                             const float *restrict wT, const float *restrict bias, const int silu, int stream) {
    const int st = stream && ((uintptr_t)y & 31) == 0;
    int64_t r = 0;
    for (; r + 3 < nr; r += 4) {   /* four rows a pass: their W + 3 input rows loaded once */
        const uint16_t *xr = x + r * D;
        uint16_t *yr = y + r * D;
        for (int64_t c = 0; c < D; c += GDN_AVL) {
            gdn_av acc[4], wv, xv[WMAX + 3];
            memcpy(&acc[0], bias + c, sizeof acc[0]);
            for (int k = 1; k < 4; k++) acc[k] = acc[0];
            for (int w = 0; w < W + 3; w++) xv[w] = gdn_bf16_load_v(xr + (int64_t)(w - (W - 1)) * D + c);
            for (int w = 0; w < W; w++) {
                memcpy(&wv, wT + w * D + c, sizeof wv);
                for (int k = 0; k < 4; k++) acc[k] += wv * xv[w + k];
            }
            for (int k = 0; k < 4; k++) gdn_bf16_store_stream_v(yr + k * D + c, silu ? gdn_silu_bf16_v(acc[k]) : acc[k], st);
        }
    }
    for (; r < nr; r++) {
        const uint16_t *xr = x + r * D;
        uint16_t *yr = y + r * D;
        for (int64_t c = 0; c < D; c += GDN_AVL) {
            gdn_av acc, wv;
            memcpy(&acc, bias + c, sizeof acc);
            for (int w = 0; w < W; w++) {
                memcpy(&wv, wT + w * D + c, sizeof wv);
                acc += wv * gdn_bf16_load_v(xr + (int64_t)(w - (W - 1)) * D + c);
            }
            gdn_bf16_store_stream_v(yr + c, silu ? gdn_silu_bf16_v(acc) : acc, st);
        }
    }
}
static void conv_direct_bf16_any(int W, int64_t nr, const uint16_t *x, uint16_t *y, int64_t D, const float *wT, const float *bias,
                                 int silu, int stream);

/* the backward's first pass for bf16 rows i < nr of a full channel block:
 * x row i (x + i*D) into xb row W-1+i, z = bv + sum_w wt[w] xb[i+w] (conv_z's
 * order), dz = dy act'(z) (silu_grad_rows' form) into dzb row W-1+i, and dz
 * added to dbf, dz xb[i+w] to dwf[w] (conv_dw's order); no z, dy buffers */
INLINE void bwd_rows_bf16(const int W, int nr, const uint16_t *restrict x, const uint16_t *restrict dy, int64_t D, float *restrict xb,
                          float *restrict dzb, const float wt[WMAX][CB], const float *restrict bv, int silu, float dwf[WMAX][CB],
                          float *restrict dbf) {
    for (int i = 0; i < nr; i++) {
        const uint16_t *xr = x + (int64_t)i * D, *gr = dy + (int64_t)i * D;
        const float *r = xb + i * CB;
        float *xn = xb + (W - 1 + i) * CB, *dz = dzb + (W - 1 + i) * CB;
        for (int c = 0; c < CB; c++) {
            const float v = gdn_bf16_f32(xr[c]);
            float g = gdn_bf16_f32(gr[c]);
            xn[c] = v;
            if (silu) {
                float z = bv[c];
                for (int w = 0; w < W - 1; w++) z += wt[w][c] * r[w * CB + c];
                z += wt[W - 1][c] * v;
                const float sg = gdn_sigmoidf(z);
                g = g * sg * (1.f + z * (1.f - sg));
            }
            dz[c] = g;
            dbf[c] += g;
            for (int w = 0; w < W - 1; w++) dwf[w][c] += g * r[w * CB + c];
            dwf[W - 1][c] += g * v;
        }
    }
}

/* dx rows i < nb (bf16, full channel block) straight from the taps: dxx row
 * i = sum_w dzb[W-1+i-w] wt[w] (conv_dx's order), rounded and stored at y + i*D */
INLINE void dx_rows_bf16(const int W, int nb, const float *restrict dzb, const float wt[WMAX][CB], uint16_t *restrict y, int64_t D,
                         int stream) {
    for (int i = 0; i < nb; i++) {
        float dr[CB] __attribute__((aligned(64)));
        uint16_t out[CB] __attribute__((aligned(64)));
        for (int c = 0; c < CB; c++) {
            float acc = 0.f;
            for (int w = 0; w < W; w++) acc += dzb[(W - 1 + i - w) * CB + c] * wt[w][c];
            dr[c] = acc;
        }
        for (int c = 0; c < CB; c += GDN_AVL) {
            gdn_av v;
            memcpy(&v, dr + c, sizeof v);
            gdn_bf16_store_v(out + c, v);
        }
        gdn_store16_row(y + (int64_t)i * D, out, CB, stream);
    }
}

#define W_SWITCH(W, call) do { switch (W) { \
    case 1: call(1); break; case 2: call(2); break; case 3: call(3); break; case 4: call(4); break; \
    case 5: call(5); break; case 6: call(6); break; case 7: call(7); break; default: call(8); break; } } while (0)

static void conv_z_any(int W, int nb, const float *xb, const float wt[WMAX][CB], const float *bv, float *z) {
#define CALL(w) conv_z(w, nb, xb, wt, bv, z)
    W_SWITCH(W, CALL);
#undef CALL
}
static void conv_rows_bf16_any(int W, int nb, const uint16_t *x, uint16_t *y, int64_t D, float *xb, const float wt[WMAX][CB],
                               const float *bv, int silu, int stream) {
#define CALL(w) (silu ? conv_rows_bf16(w, nb, x, y, D, xb, wt, bv, 1, stream) : conv_rows_bf16(w, nb, x, y, D, xb, wt, bv, 0, stream))
    W_SWITCH(W, CALL);
#undef CALL
}
static void conv_direct_bf16_any(int W, int64_t nr, const uint16_t *x, uint16_t *y, int64_t D, const float *wT, const float *bias,
                                 int silu, int stream) {
#define CALL(w) (silu ? conv_direct_bf16(w, nr, x, y, D, wT, bias, 1, stream) : conv_direct_bf16(w, nr, x, y, D, wT, bias, 0, stream))
    W_SWITCH(W, CALL);
#undef CALL
}
static void bwd_rows_bf16_any(int W, int nr, const uint16_t *x, const uint16_t *dy, int64_t D, float *xb, float *dzb,
                              const float wt[WMAX][CB], const float *bv, int silu, float dwf[WMAX][CB], float *dbf) {
#define CALL(w) (silu ? bwd_rows_bf16(w, nr, x, dy, D, xb, dzb, wt, bv, 1, dwf, dbf) : bwd_rows_bf16(w, nr, x, dy, D, xb, dzb, wt, bv, 0, dwf, dbf))
    W_SWITCH(W, CALL);
#undef CALL
}
static void dx_rows_bf16_any(int W, int nb, const float *dzb, const float wt[WMAX][CB], uint16_t *y, int64_t D, int stream) {
#define CALL(w) dx_rows_bf16(w, nb, dzb, wt, y, D, stream)
    W_SWITCH(W, CALL);
#undef CALL
}
static void conv_dw_any(int W, int nb, const float *xb, const float *dz, float dwf[WMAX][CB], float *dbf) {
#define CALL(w) conv_dw(w, nb, xb, dz, dwf, dbf)
    W_SWITCH(W, CALL);
#undef CALL
}
static void conv_dx_any(int W, int nb, const float *dzb, const float wt[WMAX][CB], float *dxr) {
#define CALL(w) conv_dx(w, nb, dzb, wt, dxr)
    W_SWITCH(W, CALL);
#undef CALL
}

/* threads worth starting for `items` work items of `elems` elements in all */
static int pick_threads(int threads, int64_t items, int64_t elems) {
    if (elems < (1 << 15)) return 1;
    return items < threads ? (int)(items < 1 ? 1 : items) : threads;
}

/* the weights by tap over all D channels, then the bias (zeros without
 * one): [W + 1][D], for the direct walks; NULL when out of memory */
static float *weights_by_tap(const float *weight, const float *bias, int W, int D) {
    float *wT = malloc(sizeof(float) * (size_t)(W + 1) * D);
    if (!wT) return NULL;
    for (int w = 0; w < W; w++)
        for (int d = 0; d < D; d++) wT[(int64_t)w * D + d] = weight[(int64_t)d * W + w];
    for (int d = 0; d < D; d++) wT[(int64_t)W * D + d] = bias ? bias[d] : 0.f;
    return wT;
}

/* this thread's share [*lo, *hi) of n items, inside a parallel region */
static void thread_share(int n, int *lo, int *hi) {
    int tid = 0, m = 1;
#ifdef _OPENMP
    tid = omp_get_thread_num();
    m = omp_get_num_threads();
#endif
    *lo = (int)((int64_t)n * tid / m);
    *hi = (int)((int64_t)n * (tid + 1) / m);
}

/* ---- forward ---- */

/* the sequence holding flattened row g (B*T > 0): largest n with cu[n] <= g */
static void find_seq(const gdn_conv1d_config *c, int64_t N, int64_t g, int64_t *n, int64_t *bos, int64_t *L) {
    if (!c->cu_seqlens) { *n = g / c->T; *bos = *n * c->T; *L = c->T; return; }
    const int64_t *cu = c->cu_seqlens;
    int64_t lo = 0, hi = N - 1;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo + 1) / 2;
        if (cu[mid] <= g) lo = mid; else hi = mid - 1;
    }
    *n = lo; *bos = cu[lo]; *L = cu[lo + 1] - cu[lo];
}

/* y of tokens t0..t1-1 of sequence n, channels d0..d0+nc-1. xb has
 * (SB + W - 1) rows: rows 0..W-2 carry xx[tb-W+1..tb-1], rows W-1.. the
 * inputs of the current sub-block; channels past nc stay 0. */
static void fwd_piece(const gdn_conv1d_config *c, const gdn_conv1d_args *a, int64_t n, int64_t bos, int64_t L,
                      int64_t t0, int64_t t1, int d0, int nc, const float wt[WMAX][CB], const float *bv, float *xb,
                      float *z) {
    const int W = c->W, D = c->D;
    const gdn_dtype dt = c->dtype;
    for (int j = 0; j < W - 1; j++) {
        const int64_t s = t0 - (W - 1) + j;
        if (s >= 0) load_row(dt, a->x, (bos + s) * D + d0, xb + j * CB, nc);
        else state_row(a->h0, n, D, W, d0, nc, s, xb + j * CB);
    }
    for (int64_t tb = t0; tb < t1; tb += SB) {
        const int nb = (int)(t1 - tb < SB ? t1 - tb : SB);
        if (dt == GDN_BF16 && nc == CB) {   /* one pass a row */
            const int64_t at = (bos + tb) * D + d0;
            conv_rows_bf16_any(W, nb, (const uint16_t *)a->x + at, (uint16_t *)a->y + at, D, xb, wt, bv, c->silu,
                               c->B * c->T * D * 2 >= GDN_STREAM_BYTES);
            memmove(xb, xb + nb * CB, sizeof(float) * (size_t)(W - 1) * CB);
            continue;
        }
        for (int i = 0; i < nb; i++) load_row(dt, a->x, (bos + tb + i) * D + d0, xb + (W - 1 + i) * CB, nc);
        conv_z_any(W, nb, xb, wt, bv, z);
        if (c->silu) gdn_silu_rows(z, nb * CB);
        for (int i = 0; i < nb; i++) store_row(dt, a->y, (bos + tb + i) * D + d0, z + i * CB, nc);
        memmove(xb, xb + nb * CB, sizeof(float) * (size_t)(W - 1) * CB);
    }
}

int gdn_cpu_conv1d_fwd(int threads, const gdn_conv1d_config *c, int64_t N, const gdn_conv1d_args *a) {
    const int D = c->D, W = c->W, ncb = (D + CB - 1) / CB;
    const int64_t R = c->B * c->T;
    /* the weights of every channel block, transposed once: [ncb][WMAX + 1][CB] (bias last) */
    float *wall = malloc(sizeof(float) * (size_t)ncb * (WMAX + 1) * CB);
    if (!wall) return 1;
    for (int cb = 0; cb < ncb; cb++) {
        float *wb = wall + (size_t)cb * (WMAX + 1) * CB;
        block_weights(a->weight, a->bias, W, cb * CB, D - cb * CB < CB ? D - cb * CB : CB, (float(*)[CB])wb,
                      wb + WMAX * CB);
    }
    /* bf16 rows of whole vectors: the weights by tap over all channels, then the bias
     * (conv_direct_bf16, for every token past a sequence's first W - 1) */
    const int direct = c->dtype == GDN_BF16 && D % GDN_AVL == 0;
    float *wT = direct ? weights_by_tap(a->weight, a->bias, W, D) : NULL;
    if (direct && !wT) { free(wall); return 1; }
    const int stream = c->B * c->T * D * 2 >= GDN_STREAM_BYTES;
    /* chunks of tc rows (results do not depend on tc: no reductions); within
     * a chunk, SB tokens at a time across all channel blocks, so memory is
     * walked row by row */
    int64_t tc = TC;
    while (tc > SB && R / tc < 4 * (int64_t)threads) tc /= 2;
    const int64_t nch = (R + tc - 1) / tc;
    const int nt = pick_threads(threads, nch, R * D * W);
    #pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t ch = 0; ch < nch; ch++) {
        float xb[(SB + WMAX - 1) * CB], z[SB * CB];
        memset(xb, 0, sizeof xb);
        const unsigned m = gdn_ftz_begin();
        const int64_t g1 = (ch + 1) * tc < R ? (ch + 1) * tc : R;
        for (int64_t g = ch * tc; g < g1;) {   /* the chunk's rows, sequence by sequence */
            int64_t n, bos, L;
            find_seq(c, N, g, &n, &bos, &L);
            const int64_t e = bos + L < g1 ? bos + L : g1;
            /* the sequence's tokens from td on by conv_direct_bf16 (their taps all inputs), the first W - 1 here */
            const int64_t td = !direct ? e - bos : (g - bos > W - 1 ? g - bos : (W - 1 < e - bos ? W - 1 : e - bos));
            for (int64_t tb = g - bos; tb < td; tb += SB) {
                const int64_t te = tb + SB < td ? tb + SB : td;
                /* the block's x rows PFS sub-blocks ahead (flattened rows, any sequence) */
                const int64_t p0 = bos + te + (PFS - 1) * SB, p1 = p0 + SB < R ? p0 + SB : R;
                for (int cb = 0; cb < ncb; cb++) {
                    const float *wb = wall + (size_t)cb * (WMAX + 1) * CB;
                    for (int64_t i = p0; i < p1; i++) prefetch_row(c->dtype, a->x, i * D + cb * CB);
                    fwd_piece(c, a, n, bos, L, tb, te, cb * CB, D - cb * CB < CB ? D - cb * CB : CB,
                              (const float(*)[CB])wb, wb + WMAX * CB, xb, z);
                }
            }
            if (td < e - bos)
                conv_direct_bf16_any(W, e - bos - td, (const uint16_t *)a->x + (bos + td) * D, (uint16_t *)a->y + (bos + td) * D, D, wT,
                                     wT + (int64_t)W * D, c->silu, stream);
            g = e;
        }
        gdn_stream_fence();   /* this thread's streaming stores ordered before the loop ends */
        gdn_ftz_end(m);
    }
    free(wall);
    free(wT);
    if (!a->ht) return 0;
    /* after the convolution, and ascending in j: ht may be h0 itself (an
     * in-place state update): ht[j] reads h0[L+j], never an entry already written */
    const int nt2 = pick_threads(threads, N * D, N * D * W);
    #pragma omp parallel for num_threads(nt2) schedule(static)
    for (int64_t i = 0; i < N * D; i++) {
        const int64_t n = i / D;
        const int64_t bos = c->cu_seqlens ? c->cu_seqlens[n] : n * c->T;
        const int64_t L = c->cu_seqlens ? c->cu_seqlens[n + 1] - bos : c->T;
        for (int j = 0; j < W; j++) {
            const int64_t s = L - W + j;
            float v = 0.f;
            if (s >= 0) load_row(c->dtype, a->x, (bos + s) * D + i % D, &v, 1);
            else if (a->h0) v = a->h0[i * W + W + s];
            a->ht[i * W + j] = v;
        }
    }
    return 0;
}

/* ---- backward ---- */

/* A channel block's state between its sub-blocks: its weights, the last W-1
 * rows of xx and dz, and its dweight / dbias sums. */
typedef struct {
    float wt[WMAX][CB], bv[CB];
    float xw[(WMAX - 1) * CB], dzw[(WMAX - 1) * CB];
    double dw[WMAX][CB], db[CB];
} bwd_state;

/* dx / dh0 rows of steps [i0, i1) of a sub-block through the dxx rows
 * (zb), dht added where it reaches */
static void bwd_sub_rest(const gdn_conv1d_config *c, const gdn_conv1d_bwd_args *a, int64_t n, int64_t bos, int64_t L, int64_t tb, int d0,
                         int nc, const float (*wt)[CB], const float *dzb, float *zb, int i0, int i1) {
    const int W = c->W, D = c->D;
    if (i1 <= i0) return;
    float *dh0 = a->dh0 ? a->dh0 + ((int64_t)n * D + d0) * W : NULL;
    const float *dht = a->dht ? a->dht + ((int64_t)n * D + d0) * W : NULL;
    conv_dx_any(W, i1 - i0, dzb + i0 * CB, wt, zb);   /* zb row i - i0 holds dxx of step i */
    for (int i = i0; i < i1; i++) {
        const int64_t s = tb + i - (W - 1);
        float *r = zb + (i - i0) * CB;
        if (dht && s >= L - W)
            for (int c2 = 0; c2 < nc; c2++) r[c2] += dht[(int64_t)c2 * W + (s - L + W)];
        if (s >= 0) store_row(c->dtype, a->dx, (bos + s) * D + d0, r, nc);
        else if (dh0)
            for (int c2 = 0; c2 < nc; c2++) dh0[(int64_t)c2 * W + W + s] = r[c2];
    }
}

/* Sub-block tb of sequence n for channels d0..d0+nc-1: positions tb..tb+nb-1
 * of the L + W - 1 steps (tokens past L have dz = 0); step t computes dz[t]
 * and emits dxx[t-W+1], whose taps dz[t-W+1..t] are then known. xb / dzb
 * (scratch) rows 0..W-2 take xx / dz of the W-1 steps before tb from the
 * block's state, and give the last W-1 back. */
static void bwd_sub(const gdn_conv1d_config *c, const gdn_conv1d_bwd_args *a, int64_t n, int64_t bos, int64_t L, int64_t tb, int d0,
                    int nc, bwd_state *st, float *xb, float *dzb, float *dyb, float *zb) {
    const int W = c->W, D = c->D;
    const gdn_dtype dt = c->dtype;
    const float(*wt)[CB] = (const float(*)[CB])st->wt;
    float dwf[WMAX][CB], dbf[CB];
    const int nb = (int)(L + W - 1 - tb < SBB ? L + W - 1 - tb : SBB);
    const int nr = (int)(L - tb < 0 ? 0 : (L - tb < nb ? L - tb : nb));   /* real tokens */
    if (nc < CB) {   /* the scratch's channels past nc stay zero */
        memset(xb, 0, sizeof(float) * (SBB + WMAX - 1) * CB);
        memset(dyb, 0, sizeof(float) * SBB * CB);
    }
    memcpy(xb, st->xw, sizeof(float) * (size_t)(W - 1) * CB);
    memcpy(dzb, st->dzw, sizeof(float) * (size_t)(W - 1) * CB);
    float *dz = dzb + (W - 1) * CB;
    if (nr > 0) {
        memset(dwf, 0, sizeof dwf); memset(dbf, 0, sizeof dbf);
        if (dt == GDN_BF16 && nc == CB) {   /* the first pass in one */
            const int64_t at = (bos + tb) * D + d0;
            bwd_rows_bf16_any(W, nr, (const uint16_t *)a->x + at, (const uint16_t *)a->dy + at, D, xb, dzb, wt, st->bv, c->silu, dwf,
                              dbf);
        } else {
            for (int i = 0; i < nr; i++) {
                load_row(dt, a->x, (bos + tb + i) * D + d0, xb + (W - 1 + i) * CB, nc);
                load_row(dt, a->dy, (bos + tb + i) * D + d0, dyb + i * CB, nc);
            }
            if (c->silu) {
                conv_z_any(W, nr, xb, wt, st->bv, zb);
                silu_grad_rows(zb, dyb, dz, nr * CB);
            } else {
                memcpy(dz, dyb, sizeof(float) * (size_t)nr * CB);
            }
            conv_dw_any(W, nr, xb, dz, dwf, dbf);
        }
        for (int c2 = 0; c2 < CB; c2++) {
            st->db[c2] += dbf[c2];
            for (int w = 0; w < W; w++) st->dw[w][c2] += dwf[w][c2];
        }
    }
    memset(dz + nr * CB, 0, sizeof(float) * (size_t)(nb - nr) * CB);
    /* steps i in [lo, hi): dx rows s = tb + i - (W-1) in [0, s1), which take
     * no dh0 and no dht: bf16 full blocks store them from the taps; the rest
     * (and every step otherwise) through bwd_sub_rest */
    int lo = 0, hi = 0;
    if (dt == GDN_BF16 && nc == CB) {
        const int64_t s1 = a->dht ? L - W : L;
        int64_t a0 = (W - 1) - tb, e0 = s1 + (W - 1) - tb;
        if (a0 < 0) a0 = 0;
        if (e0 > nb) e0 = nb;
        if (e0 > a0) {
            lo = (int)a0; hi = (int)e0;
            dx_rows_bf16_any(W, hi - lo, dzb + lo * CB, wt, (uint16_t *)a->dx + (bos + tb + lo - (W - 1)) * D + d0, D,
                             c->B * c->T * D * 2 >= GDN_STREAM_BYTES);
        }
    }
    if (hi > lo) {
        bwd_sub_rest(c, a, n, bos, L, tb, d0, nc, wt, dzb, zb, 0, lo);
        bwd_sub_rest(c, a, n, bos, L, tb, d0, nc, wt, dzb, zb, hi, nb);
    } else {
        bwd_sub_rest(c, a, n, bos, L, tb, d0, nc, wt, dzb, zb, 0, nb);
    }
    memcpy(st->xw, xb + nb * CB, sizeof(float) * (size_t)(W - 1) * CB);
    memcpy(st->dzw, dzb + nb * CB, sizeof(float) * (size_t)(W - 1) * CB);
}

/* Channel blocks cb0..cb1-1 (one thread), every sequence: SBB tokens at a time
 * across the blocks, so memory is walked by rows (a block walked alone down
 * every token touches a new 4 KiB page a row). Each block's sums still run
 * in token order (fp32 over a sub-block, then fp64), so the bits do not
 * depend on how the blocks are dealt to threads. */
static void bwd_blocks(const gdn_conv1d_config *c, int64_t N, const gdn_conv1d_bwd_args *a, int cb0, int cb1, bwd_state *st) {
    const int W = c->W, D = c->D;
    float xb[(SBB + WMAX - 1) * CB], dzb[(SBB + WMAX - 1) * CB], dyb[SBB * CB], zb[SBB * CB];
    memset(xb, 0, sizeof xb); memset(dzb, 0, sizeof dzb); memset(dyb, 0, sizeof dyb);
    for (int cb = cb0; cb < cb1; cb++) {
        bwd_state *b = st + (cb - cb0);
        const int d0 = cb * CB, nc = D - d0 < CB ? D - d0 : CB;
        block_weights(a->weight, a->bias, W, d0, nc, b->wt, b->bv);
        memset(b->dw, 0, sizeof b->dw); memset(b->db, 0, sizeof b->db);
    }
    for (int64_t n = 0; n < N; n++) {
        const int64_t bos = c->cu_seqlens ? c->cu_seqlens[n] : n * c->T;
        const int64_t L = c->cu_seqlens ? c->cu_seqlens[n + 1] - bos : c->T;
        for (int cb = cb0; cb < cb1; cb++) {
            bwd_state *b = st + (cb - cb0);
            const int d0 = cb * CB, nc = D - d0 < CB ? D - d0 : CB;
            memset(b->xw, 0, sizeof b->xw); memset(b->dzw, 0, sizeof b->dzw);
            for (int j = 0; j < W - 1; j++) state_row(a->h0, n, D, W, d0, nc, j - (W - 1), b->xw + j * CB);
        }
        for (int64_t tb = 0; tb < L + W - 1; tb += SBB) {
            for (int64_t i = tb + SBB; i < tb + 2 * SBB && i < L; i++)   /* the next sub-block's rows of these blocks */
                for (int cb = cb0; cb < cb1; cb++) {
                    prefetch_row(c->dtype, a->x, (bos + i) * D + cb * CB);
                    prefetch_row(c->dtype, a->dy, (bos + i) * D + cb * CB);
                }
            for (int cb = cb0; cb < cb1; cb++) {
                const int d0 = cb * CB, nc = D - d0 < CB ? D - d0 : CB;
                bwd_sub(c, a, n, bos, L, tb, d0, nc, st + (cb - cb0), xb, dzb, dyb, zb);
            }
        }
        if (a->dh0)   /* h0[., 0] is read only by ht of an empty sequence (ht = h0) */
            for (int cb = cb0; cb < cb1; cb++) {
                const int d0 = cb * CB, nc = D - d0 < CB ? D - d0 : CB;
                float *dh0 = a->dh0 + ((int64_t)n * D + d0) * W;
                const float *dht = a->dht ? a->dht + ((int64_t)n * D + d0) * W : NULL;
                for (int c2 = 0; c2 < nc; c2++) dh0[(int64_t)c2 * W] = (L == 0 && dht) ? dht[(int64_t)c2 * W] : 0.f;
            }
    }
    for (int cb = cb0; cb < cb1; cb++) {
        const bwd_state *b = st + (cb - cb0);
        const int d0 = cb * CB, nc = D - d0 < CB ? D - d0 : CB;
        for (int c2 = 0; c2 < nc; c2++) {
            for (int w = 0; w < W; w++) a->dweight[(int64_t)(d0 + c2) * W + w] = (float)b->dw[w][c2];
            if (a->dbias) a->dbias[d0 + c2] = (float)b->db[c2];
        }
    }
}

/* ---- the backward's direct walk (bf16, D a whole number of vectors) ----
 * Each thread owns a range of channel vectors (GDN_AVL channels) and walks
 * every sequence's L + W - 1 steps SBW at a time across its vectors (memory
 * row by row), one vector's SBW steps in registers: the last W - 1 inputs and
 * dz as vectors, dz = dy act'(z) (z recomputed in conv_z's order), the fp32
 * sums of dweight / dbias (conv_dw's order) added into fp64 after each SBB
 * tokens counted from the sequence's start and after its last token (as
 * bwd_sub does: the same bits), and dx of step t - W + 1 from the last W dz
 * (conv_dx's order), dht added and stored, or kept in dh0 before the start.
 * The sigmoid's exp is gdn_exp_silu_neg_fast_v (cpu/act.h; relative error
 * 2.7e-6) and SiLU's derivative dy sg (1 + z (1 - sg)) is taken as u + u v,
 * u = dy sg, v = z - z sg (three operations where the plain form has four),
 * so dz's bits are not bwd_sub's; the walk's order of sums is. Past a
 * sequence's first steps the walk runs one token ahead: token t + 1's
 * inputs, z and sigmoid (the long chain: loads, the conv, exp, division)
 * come before step t's dz, sums and dx in the program, so the core's
 * scheduler holds fewer operations that wait (the step is bound by that
 * window with its FP operations, bench/NOTES.md CPU v29; -3 to -5 %).
 * SBW steps at a time, each step prefetching the rows of x and dy SBW steps
 * ahead into L2 and dx's for writing: a thread's rows are 4 KiB apart (one
 * page each), more pages in flight than the hardware's prefetch follows, so
 * without it the walk waited on memory (4.4 -> 2.7 ms at the main job's
 * shape, two threads; bench/NOTES.md CPU v25). 32 steps: fewer visits of a
 * vector (its state in and out, ~110 cycles; SBW 4, 8, 16 took 5.4, 4.2,
 * 3.9 ms before the prefetch, CPU v21). */
enum { SBW = 32 };
_Static_assert(SBB % SBW == 0, "a walk of SBW steps closes at most one SBB of sums, at its end");
/* dx of at least this many bytes: the walk writes its dx rows into SBW
 * staging rows, copied out whole by streaming stores after each block of
 * steps (no line of dx read first or written in part; the 32-byte pieces 4
 * KiB apart had made the walk wait on DRAM: B1 T8192 D2048 9.3 -> 6.6 ms,
 * bench/NOTES.md CPU v26). Smaller, dx is stored in place (prefetched for
 * writing): there a repeated call finds part of it in the L3, which
 * streaming would bypass (T4096: 2.7 in place, 3.1 staged). */
#define BWD_STAGE_BYTES ((int64_t)32 << 20)

/* the address of row t of a walk's array (D channels a row) for a prefetch:
 * formed as an integer, as it may lie past either end (a prefetch never faults) */
static inline const void *row_ahead(const uint16_t *p, int64_t t, int64_t D) {
    return (const void *)((uintptr_t)p + (uintptr_t)(t * D * 2));
}

/* a vector's state between its steps: 3 W - 1 vectors (the inputs and dz of
 * the last W - 1 steps, the fp32 sums of dweight and of dbias), and W + 1
 * rows of GDN_AVL doubles apart (the fp64 sums, touched once in SBB tokens) */
static int bwd_vec_len(int W) { return 3 * W - 1; }

/* acc[l] += v[l] in fp64 */
static inline void add_f64(double *restrict acc, gdn_av v) {
#if defined(__AVX512F__) && GDN_AVL == 16
    const __m512d p = _mm512_castps_pd((__m512)v);
    const __m512d lo = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_castpd512_pd256(p)));
    const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(p, 1)));
    _mm512_storeu_pd(acc, _mm512_add_pd(_mm512_loadu_pd(acc), lo));
    _mm512_storeu_pd(acc + 8, _mm512_add_pd(_mm512_loadu_pd(acc + 8), hi));
#else
    for (int l = 0; l < GDN_AVL; l++) acc[l] += v[l];
#endif
}

/* dx of step s (before the sequence: dh0) for the GDN_AVL channels at d,
 * dht added where it reaches; stored at row `row` from dx (the walk's base:
 * a staging row or dx's own) */
static void bwd_direct_edge(const gdn_conv1d_config *c, const gdn_conv1d_bwd_args *a, int64_t n, int64_t L, int64_t s, int d, gdn_av r,
                            uint16_t *dx, int64_t row) {
    const int64_t D = c->D;
    const int W = c->W;
    float f[GDN_AVL];
    memcpy(f, &r, sizeof f);
    if (a->dht && s >= L - W) {
        const float *h = a->dht + (n * D + d) * W + (s - L + W);
        for (int l = 0; l < GDN_AVL; l++) f[l] += h[(int64_t)l * W];
    }
    if (s >= 0) {
        memcpy(&r, f, sizeof r);
        gdn_bf16_store_v(dx + row * D, r);   /* formed only here: dx may be NULL where no row is stored */
    } else if (a->dh0) {
        float *h = a->dh0 + (n * D + d) * W + W + s;
        for (int l = 0; l < GDN_AVL; l++) h[(int64_t)l * W] = f[l];
    }
}

/* steps t0..t1-1 of sequence (bos, L) for the GDN_AVL channels at d (t0 a
 * multiple of SBW, so at most the last real token closes a sum's SBB) */
INLINE void bwd_direct_steps(const int W, const int silu, const gdn_conv1d_config *c, const gdn_conv1d_bwd_args *a, int64_t n,
                             int64_t bos, int64_t L, int64_t t0, int64_t t1, int d, gdn_av *restrict q, double *restrict qd, const float *wT,
                             const float *bias, uint16_t *stg) {
    const int64_t D = c->D;
    /* x, dy and dx are NULL where the call has no tokens (then no row is read or stored) */
    const int64_t o = bos * D + d;
    const uint16_t *restrict x = a->x ? (const uint16_t *)a->x + o : NULL, *restrict dy = a->dy ? (const uint16_t *)a->dy + o : NULL;
    /* step t's dx row: staging row t - t0 (stg), or dx's row t - (W - 1) */
    uint16_t *restrict dx = stg ? stg + d : a->dx ? (uint16_t *)a->dx + o : NULL;
    const int64_t r0 = stg ? t0 : W - 1;
    const int64_t s1 = a->dht ? L - W : L;   /* dx rows below s1 take no dht */
    /* xw: the last W inputs (xw[0] unused until a token's input shifts in) */
    gdn_av wv[WMAX], bv, xw[WMAX], dzh[WMAX - 1], aw[WMAX], ab = q[3 * W - 2];
    for (int w = 0; w < W; w++) { memcpy(&wv[w], wT + w * D + d, sizeof(gdn_av)); aw[w] = q[2 * W - 2 + w]; }
    for (int w = 0; w < W - 1; w++) { xw[w + 1] = q[w]; dzh[w] = q[W - 1 + w]; }
    memcpy(&bv, bias + d, sizeof bv);
    /* token tt's input xn and dy gn, with SiLU its z (zn, conv_z's order from
     * the W - 1 inputs before it, xw[1..]) and sigmoid sn */
#define STEP_A(tt, xn, gn, zn, sn)                                                                        \
    xn = gdn_bf16_load_v(x + (tt) * D);                                                                   \
    __builtin_prefetch(row_ahead(x, (tt) + SBW, D), 0, 2);                                                \
    __builtin_prefetch(row_ahead(dy, (tt) + SBW, D), 0, 2);                                               \
    if (!stg) __builtin_prefetch(row_ahead(dx, (tt) + SBW - (W - 1), D), 1, 2);                           \
    gn = gdn_bf16_load_v(dy + (tt) * D);                                                                  \
    if (silu) {                                                                                           \
        zn = bv;                                                                                          \
        for (int w = 0; w < W - 1; w++) zn += wv[w] * xw[w + 1];                                          \
        zn += wv[W - 1] * xn;                                                                             \
        sn = 1.f / (1.f + gdn_exp_silu_neg_fast_v(zn));                                                   \
    }
    /* the inputs' history takes xn */
#define SHIFT_X(xn)                                                                                       \
    for (int w = 0; w + 1 < W; w++) xw[w] = xw[w + 1];                                                    \
    xw[W - 1] = xn;
    /* the step: dz of its token (zero past L; g, z, sg from STEP_A, its W
     * inputs in xw), the sums, dz's history, r = dxx of step t - (W - 1) */
#define STEP_B(real, g, z, sg)                                                                            \
    gdn_av dz = {0};                                                                                      \
    if (real) {                                                                                           \
        if (silu) {                                                                                       \
            const gdn_av u = g * sg, v = z - z * sg;                                                      \
            dz = gdn_fma_v(u, v, u);                                                                      \
        } else {                                                                                          \
            dz = g;                                                                                       \
        }                                                                                                 \
        ab += dz;                                                                                         \
        for (int w = 0; w < W; w++) aw[w] += dz * xw[w];                                                  \
    }                                                                                                     \
    gdn_av r = W > 1 ? dzh[0] * wv[W - 1] : dz * wv[0];   /* the earlier steps' terms first, dz's last */      \
    for (int w = W - 2; w >= 1; w--) r = gdn_fma_v(dzh[W - 1 - w], wv[w], r);                            \
    if (W > 1) r = gdn_fma_v(dz, wv[0], r);                                                               \
    for (int w = 0; w + 1 < W - 1; w++) dzh[w] = dzh[w + 1];                                              \
    if (W > 1) dzh[W - 2] = dz;
    const int64_t te = t1 < L ? t1 : L;                       /* real tokens below te */
    const int64_t ta = t0 > W - 1 ? t0 : W - 1;               /* steps [ta, tz): real, dx row in [0, s1) */
    const int64_t tz = te < s1 + W - 1 ? te : s1 + W - 1;
    gdn_av xc = {0}, gc = {0}, zc = {0}, sc = {0};   /* STEP_A's values of the step's token (zc, sc: SiLU only) */
    int64_t t = t0;
    for (; t < t1 && (t < ta || t >= tz); t++) {   /* the first W - 1 steps of a sequence */
        if (t < L) { STEP_A(t, xc, gc, zc, sc) SHIFT_X(xc) }
        STEP_B(t < L, gc, zc, sc)
        bwd_direct_edge(c, a, n, L, t - (W - 1), d, r, dx, t - r0);
    }
    if (t < tz) {   /* token t + 1's STEP_A before step t's sums and dx: its chain (z, exp, division) overlaps theirs */
        STEP_A(t, xc, gc, zc, sc)
        SHIFT_X(xc)
        for (; t + 1 < tz; t++) {
            gdn_av xn, gn, zn = {0}, sn = {0};   /* zn, sn: SiLU only */
            STEP_A(t + 1, xn, gn, zn, sn)
            STEP_B(1, gc, zc, sc)
            gdn_bf16_store_v(dx + (t - r0) * D, r);
            SHIFT_X(xn)
            gc = gn; zc = zn; sc = sn;
        }
        STEP_B(1, gc, zc, sc)
        gdn_bf16_store_v(dx + (t - r0) * D, r);
        t++;
    }
    for (; t < t1; t++) {   /* the last steps: dht, or none past L */
        if (t < L) { STEP_A(t, xc, gc, zc, sc) SHIFT_X(xc) }
        STEP_B(t < L, gc, zc, sc)
        bwd_direct_edge(c, a, n, L, t - (W - 1), d, r, dx, t - r0);
    }
#undef STEP_A
#undef SHIFT_X
#undef STEP_B
    if (te > t0 && (te % SBB == 0 || te == L)) {   /* bwd_sub's sums: fp32 over its sub-block's tokens, then fp64 */
        add_f64(qd + W * GDN_AVL, ab);
        ab = (gdn_av){0};
        for (int w = 0; w < W; w++) {
            add_f64(qd + w * GDN_AVL, aw[w]);
            aw[w] = (gdn_av){0};
        }
    }
    q[3 * W - 2] = ab;
    for (int w = 0; w < W; w++) q[2 * W - 2 + w] = aw[w];
    for (int w = 0; w < W - 1; w++) { q[w] = xw[w + 1]; q[W - 1 + w] = dzh[w]; }
}

/* bwd_direct_steps for vectors v0..v1-1, one after another (sv, sd their states) */
INLINE void bwd_direct_row(const int W, const int silu, const gdn_conv1d_config *c, const gdn_conv1d_bwd_args *a, int64_t n, int64_t bos,
                           int64_t L, int64_t t0, int64_t t1, int v0, int v1, gdn_av *sv, double *sd, const float *wT, const float *bias,
                           uint16_t *stg) {
    for (int v = v0; v < v1; v++)
        bwd_direct_steps(W, silu, c, a, n, bos, L, t0, t1, v * GDN_AVL, sv + (size_t)(v - v0) * bwd_vec_len(W),
                         sd + (size_t)(v - v0) * (W + 1) * GDN_AVL, wT, bias, stg);
}

static void bwd_direct_row_any(int W, const gdn_conv1d_config *c, const gdn_conv1d_bwd_args *a, int64_t n, int64_t bos, int64_t L,
                               int64_t t0, int64_t t1, int v0, int v1, gdn_av *sv, double *sd, const float *wT, const float *bias,
                               uint16_t *stg) {
#define CALL(w) (c->silu ? bwd_direct_row(w, 1, c, a, n, bos, L, t0, t1, v0, v1, sv, sd, wT, bias, stg) \
                         : bwd_direct_row(w, 0, c, a, n, bos, L, t0, t1, v0, v1, sv, sd, wT, bias, stg))
    W_SWITCH(W, CALL);
#undef CALL
}

/* vectors v0..v1-1 (one thread) of every sequence; wT the weights by tap,
 * then the bias; stg NULL (dx stored in place) or SBW staging rows of D
 * channels (the thread's columns its own), each block's dx rows streamed out
 * whole after its walk (no line of dx read first, none written in part) */
static void bwd_direct(const gdn_conv1d_config *c, int64_t N, const gdn_conv1d_bwd_args *a, int v0, int v1, gdn_av *sv, double *sd,
                       const float *wT, uint16_t *stg) {
    const int W = c->W, D = c->D, nq = bwd_vec_len(W), nd = (W + 1) * GDN_AVL;
    const float *bias = wT + (int64_t)W * D;
    const int64_t c0 = (int64_t)v0 * GDN_AVL, nc = (int64_t)(v1 - v0) * GDN_AVL;
    memset(sd, 0, sizeof(double) * (size_t)nd * (size_t)(v1 - v0));
    for (int64_t n = 0; n < N; n++) {
        const int64_t bos = c->cu_seqlens ? c->cu_seqlens[n] : n * c->T;
        const int64_t L = c->cu_seqlens ? c->cu_seqlens[n + 1] - bos : c->T;
        for (int v = v0; v < v1; v++) {   /* xx before the start from h0 (or zeros); no dz, no sums yet */
            gdn_av *q = sv + (size_t)(v - v0) * nq;
            const int d = v * GDN_AVL;
            for (int k = 0; k < nq; k++) q[k] = (gdn_av){0};
            for (int w = 0; w < W - 1; w++) {
                float f[GDN_AVL];
                for (int l = 0; l < GDN_AVL; l++) f[l] = a->h0 ? a->h0[(n * D + d + l) * W + 1 + w] : 0.f;
                memcpy(&q[w], f, sizeof f);
            }
        }
        for (int64_t tb = 0; tb < L + W - 1; tb += SBW) {
            const int64_t te = tb + SBW < L + W - 1 ? tb + SBW : L + W - 1;
            bwd_direct_row_any(W, c, a, n, bos, L, tb, te, v0, v1, sv, sd, wT, bias, stg);
            if (stg)
                for (int64_t t = tb; t < te; t++) {   /* step t's dx row, s = t - (W - 1), where 0 <= s < L */
                    const int64_t s = t - (W - 1);
                    if (s >= 0 && s < L)
                        gdn_store16_row((uint16_t *)a->dx + (bos + s) * D + c0, stg + (t - tb) * D + c0, (int)nc, 1);
                }
        }
        if (a->dh0)   /* h0[., 0] is read only by ht of an empty sequence (ht = h0) */
            for (int64_t d = (int64_t)v0 * GDN_AVL; d < (int64_t)v1 * GDN_AVL; d++)
                a->dh0[(n * D + d) * W] = (L == 0 && a->dht) ? a->dht[(n * D + d) * W] : 0.f;
    }
    for (int v = v0; v < v1; v++)
        for (int l = 0; l < GDN_AVL; l++) {
            const double *qd = sd + (size_t)(v - v0) * nd;
            const int64_t d = (int64_t)v * GDN_AVL + l;
            for (int w = 0; w < W; w++) a->dweight[d * W + w] = (float)qd[w * GDN_AVL + l];
            if (a->dbias) a->dbias[d] = (float)qd[W * GDN_AVL + l];
        }
}

int gdn_cpu_conv1d_bwd(int threads, const gdn_conv1d_config *c, int64_t N, const gdn_conv1d_bwd_args *a) {
    const int D = c->D, ncb = (D + CB - 1) / CB;
    if (c->dtype == GDN_BF16 && D % GDN_AVL == 0) {   /* the direct walk */
        const int W = c->W, nv = D / GDN_AVL;
        const int nt = pick_threads(threads, nv, (c->B * c->T + N) * D * W);
        float *wT = weights_by_tap(a->weight, a->bias, W, D);
        gdn_av *sv = aligned_alloc(64, sizeof(gdn_av) * (size_t)bwd_vec_len(W) * (size_t)nv);
        double *sd = malloc(sizeof(double) * (size_t)(W + 1) * GDN_AVL * (size_t)nv);
        const int stage = (c->B * c->T) * (int64_t)D * 2 >= BWD_STAGE_BYTES;
        uint16_t *stg = stage ? aligned_alloc(64, sizeof(uint16_t) * SBW * (size_t)D) : NULL;   /* SBW * D * 2: a multiple of 64 */
        if (!wT || !sv || !sd || (stage && !stg)) { free(wT); free(sv); free(sd); free(stg); return 1; }
        #pragma omp parallel num_threads(nt)
        {
            int v0, v1;
            thread_share(nv, &v0, &v1);
            const unsigned fm = gdn_ftz_begin();
            if (v1 > v0)
                bwd_direct(c, N, a, v0, v1, sv + (size_t)v0 * bwd_vec_len(W), sd + (size_t)v0 * (W + 1) * GDN_AVL, wT, stg);
            gdn_stream_fence();
            gdn_ftz_end(fm);
        }
        free(wT);
        free(sv);
        free(sd);
        free(stg);
        return 0;
    }
    const int nt = pick_threads(threads, ncb, (c->B * c->T + N) * D * c->W);
    bwd_state *st = malloc(sizeof(bwd_state) * (size_t)ncb);
    if (!st) return 1;
    #pragma omp parallel num_threads(nt)
    {
        int cb0, cb1;
        thread_share(ncb, &cb0, &cb1);
        const unsigned fm = gdn_ftz_begin();
        if (cb1 > cb0) bwd_blocks(c, N, a, cb0, cb1, st + cb0);
        gdn_stream_fence();   /* this thread's streaming stores (dx rows) ordered before the region ends */
        gdn_ftz_end(fm);
    }
    free(st);
    return 0;
}

/* ---- single-token update ---- */

/* state rows st [nc][W] shift left, x enters newest, z = bias + sum_w wt * st */
INLINE void update_rows(const int W, int nc, float *st, const float *wd, const float *bd, const float *xr,
                        float *z) {
    for (int c = 0; c < nc; c++) {
        float *s = st + c * W;
        const float *wc = wd + c * W;
        for (int w = 0; w + 1 < W; w++) s[w] = s[w + 1];
        s[W - 1] = xr[c];
        float acc = bd ? bd[c] : 0.f;
        for (int w = 0; w < W; w++) acc += wc[w] * s[w];
        z[c] = acc;
    }
}

static void update_rows_any(int W, int nc, float *st, const float *wd, const float *bd, const float *xr, float *z) {
#define CALL(w) update_rows(w, nc, st, wd, bd, xr, z)
    W_SWITCH(W, CALL);
#undef CALL
}

/* Threads own channel blocks and walk the rows in order, so rows that share a
 * slot are applied one after the other, as token after token. */
void gdn_cpu_conv1d_update(int threads, const gdn_conv1d_config *c, const void *x, const float *weight,
                           const float *bias, float *state, const int32_t *slots, void *y) {
    const int64_t B = c->B;
    const int D = c->D, W = c->W, ncb = (D + CB - 1) / CB;
    const int nt = pick_threads(threads, ncb, B * D * W);
    #pragma omp parallel for num_threads(nt) schedule(static)
    for (int cb = 0; cb < ncb; cb++) {
        const int d0 = cb * CB, nc = D - d0 < CB ? D - d0 : CB;
        float xr[CB], z[CB];
        for (int64_t b = 0; b < B; b++) {
            const int64_t s = slots ? slots[b] : b;
            if (s < 0) {
                memset(z, 0, sizeof z);
            } else {
                load_row(c->dtype, x, b * D + d0, xr, nc);
                update_rows_any(W, nc, state + (s * D + d0) * W, weight + (int64_t)d0 * W, bias ? bias + d0 : NULL,
                                xr, z);
                if (c->silu) gdn_silu_rows(z, nc);
            }
            store_row(c->dtype, y, b * D + d0, z, nc);
        }
    }
}
