/* What the CUDA chunk backward's files share (the overview is in chunk_bwd.cu):
 * the kernel arguments, the constants and the per-(slot, value head) record,
 * the -DGDN_BWD_PROFILE cycle probes, the row loaders of every pass, the group
 * stage's scratch layout, and the launchers each pass file defines. */
#pragma once
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#ifdef GDN_BWD_PROFILE
#include <cstdio>
#endif
#include "cuda/common.cuh"
#include "cuda/cuda_backend.h"
#include "cuda/mma_tf32.cuh"

/* Only inline functions, templates, types, constants and macros here (one
 * definition in every file that includes it). The kernels stay local to their
 * files (an unnamed namespace in each) and are launched through the launchers
 * at the end, defined and instantiated next to them. */
namespace gdn {
namespace cbwd {

constexpr int CC = 64;    /* chunk length              */
constexpr int NT = 256;   /* threads of every kernel    */
constexpr int VT = 64;    /* columns of V per sweep block */
constexpr int RS = 65;    /* padded row stride of the substitution's 64 x 64 arrays */
constexpr int R4 = 68;    /* row strides of 64-column shared arrays read by the tensor cores: */
constexpr int R8 = 72;    /* along rows (4 mod 32), across rows (8 mod 32); mma_tf32.cuh */

/* K rounded up to 8 (the products' k step), and a row stride >= it that is 4 mod 32 */
__host__ __device__ __forceinline__ int k8(int K) { return (K + 7) & ~7; }
__host__ __device__ __forceinline__ int ld4(int n) { return n + (36 - n % 32) % 32; }

/* record per (slot, j), in floats: gcd (64 doubles), gam, beta, g, Tm, P */
constexpr int R_GCD = 0, R_GAM = 128, R_BETA = 192, R_G = 256, R_TM = 320, R_P = 320 + CC * CC, REC = 320 + 2 * CC * CC;

struct BwdArgs {
    const void *q, *k, *v, *g, *beta, *dout;
    const float *A_log, *dt_bias, *h0, *dht, *rstd_q, *rstd_k;
    void *dq, *dk, *dv, *dg, *dbeta;
    float *dA_log, *ddt_bias, *dh0;
    const int64_t *cu;
    int64_t T, N, nslots, ntok;   /* ntok: the token rows of q, k, v (B T) */
    int H, HV, K, V, G, dt, gdt, nvt;
    float scale;
    unsigned flags;
    /* workspace */
    int64_t *slot_row0;
    int *slot_c;
    float *rec, *states, *dstates;
    int64_t rec_rows, st_rows;   /* rec's and states' bytes / 256 (the fused pass's tensor maps of their tiles) */
    double *part;   /* [2][nslots*HV]: dA_log, ddt_bias partials */
    /* the window of the state gradients (run() in chunk_bwd.cu): wn = 0, every
     * chunk, dstates by slot; else chunks [w0, w0 + wn) of each sequence, the
     * reverse sweep from dht to dh0 over those only, dstates by (n, i - w0),
     * and the records and forward states too where rw (prep and the forward
     * states then run a window at a time) */
    int64_t w0, wn;
    int rw;
    /* rec16: the records' Tm and P as bf16 tiles (64 x 64, 128-byte swizzled
     * rows: the fused pass's shared-memory layout), Tm at R_TM, P 8 KB after
     * it, where the fused pass is their only reader (run() in chunk_bwd.cu) */
    int rec16;
    /* st16: the forward states as bf16 tiles, 32 KB apart (gdn_cuda_chunk_states' st16:
     * the fused pass's layout of S0 in shared memory) */
    int st16;
    /* the window's forward states as the forward kept them in saved (the
     * fused pass; NULL: none): tiles laid out as states' (window_at), kst_rows
     * rows of 256 bytes, read instead of states where *ktag == ktag_val */
    const float *kst;
    const int *ktag;
    int ktag_val;
    int64_t kst_rows;
    int lpt;   /* the fused pass's sequences longest first: their count, or 0 (common.cuh longest_first) */
};

/* chunk i of sequence n's state gradient in dstates, its record and its
 * forward state: by slot, or where windowed at their window's place (n, i - w0) */
__device__ __forceinline__ int64_t window_at(const BwdArgs &p, bool win, int64_t n, int64_t slot, int64_t i) {
    return win ? n * p.wn + (i - p.w0) : slot;
}
__device__ __forceinline__ float *dstate_at(const BwdArgs &p, int64_t n, int64_t slot, int64_t i, int j) {
    return p.dstates + (window_at(p, p.wn != 0, n, slot, i) * p.HV + j) * (int64_t)p.K * p.V;
}
__device__ __forceinline__ float *rec_at(const BwdArgs &p, int64_t n, int64_t slot, int64_t i, int j) {
    return p.rec + (window_at(p, p.rw != 0, n, slot, i) * p.HV + j) * (int64_t)REC;
}
/* the state entering chunk i: K V floats, or with st16 the bf16 tile (K V 16-bit values) */
__device__ __forceinline__ const float *state_at(const BwdArgs &p, int64_t n, int64_t slot, int64_t i, int j) {
    return p.states + (window_at(p, p.rw != 0, n, slot, i) * p.HV + j) * ((int64_t)p.K * p.V / (p.st16 ? 2 : 1));
}
/* the same state's tile where the forward kept it (kst) */
__device__ __forceinline__ const float *kept_at(const BwdArgs &p, int64_t n, int64_t i, int j) {
    return p.kst + (window_at(p, true, n, 0, i) * p.HV + j) * ((int64_t)p.K * p.V / 2);
}
__device__ __forceinline__ void seq_range(const BwdArgs &p, int64_t n, int64_t *bos, int64_t *len) {
    *bos = p.cu ? p.cu[n] : n * p.T;
    *len = p.cu ? p.cu[n + 1] - *bos : p.T;
}
__device__ __forceinline__ int64_t slot_base(const BwdArgs &p, int64_t n) {
    int64_t bos, len;
    seq_range(p, n, &bos, &len);
    return bos / CC + n;
}
/* item x of a window's launch (prep, the local stage): chunk w0 + x % wn of
 * sequence x / wn; false past the sequence's end (no chunk) */
__device__ __forceinline__ bool window_item(const BwdArgs &p, int64_t x, int64_t *n, int64_t *i, int64_t *slot) {
    *n = x / p.wn;
    *i = p.w0 + x % p.wn;
    int64_t bos, len;
    seq_range(p, *n, &bos, &len);
    *slot = bos / CC + *n + *i;
    return *i * CC < len;
}
/* a reverse sweep's chunks of sequence n (nch_all of them): [*cb, *top), the
 * whole sequence or its part in the window (empty: *top = *cb) */
__device__ __forceinline__ void sweep_range(const BwdArgs &p, int64_t nch_all, int64_t *cb, int64_t *top) {
    *cb = p.wn ? p.w0 : 0;
    const int64_t ce = p.wn && p.w0 + p.wn < nch_all ? p.w0 + p.wn : nch_all;
    *top = ce > *cb ? ce : *cb;
}

#ifdef GDN_BWD_PROFILE   /* cycles per step, thread 0 */
#define BP_DECL long long bp_[25] = {0}, bt_ = clock64()   /* BP(0..24) */
#define BP(k) do { if (threadIdx.x == 0) { const long long t1_ = clock64(); bp_[k] += t1_ - bt_; bt_ = t1_; } } while (0)
#define BP_PRINT(cond, name, n, div)                                              \
    do {                                                                          \
        if (threadIdx.x == 0 && (cond)) {                                         \
            printf("%s cycles:", name);                                           \
            for (int i_ = 0; i_ < (n); i_++) printf(" %lld", bp_[i_] / (div));    \
            printf("\n");                                                         \
        }                                                                         \
    } while (0)
#else
#define BP_DECL do { } while (0)
#define BP(k) do { } while (0)
#define BP_PRINT(cond, name, n, div) do { } while (0)
#endif

/* exp(gc_t - gc_s), the difference in double (chunk_fwd.c prepare_head) */
__device__ __forceinline__ float Ef(const double *gcd, int t, int s) { return expf((float)(gcd[t] - gcd[s])); }

/* for (e = threadIdx.x; e < n; e += NT) put(e, get(e)), UNR values loaded
 * before any is stored: a plain loop whose store may alias the next load
 * waits out the memory latency once per element */
template <int UNR = 8, typename FG, typename FP>
__device__ __forceinline__ void batched(int n, const FG &get, const FP &put) {
    for (int e0 = threadIdx.x; e0 < n; e0 += UNR * NT) {
        float v[UNR];
#pragma unroll
        for (int u = 0; u < UNR; u++) v[u] = e0 + u * NT < n ? get(e0 + u * NT) : 0.f;
#pragma unroll
        for (int u = 0; u < UNR; u++)
            if (e0 + u * NT < n) put(e0 + u * NT, v[u]);
    }
}

/* 16-byte pieces of rows row0..row0+c-1 of a [rows][heads][ncols] tensor x
 * (head hh, dtype dt), columns col0..col0+n-1, times rs[row * heads + hh]
 * where rs is given, to dst [row][ld] (columns [0, n) of rows < c), in two
 * steps: issue() loads a thread's U pieces from piece b0 on into registers,
 * commit() converts and stores them, so the loads of one step are in flight
 * together (a loop over rows waits out the latency once per row) and can be
 * issued a whole chunk ahead (the sweeps). rows16_ok says whether x, its row
 * stride and the columns are 16-byte aligned, as this needs. */
/* a 16-byte aligned pointer (the host-side choice of the wgmma kernels, whose rows come by cp.async) */
__host__ __device__ __forceinline__ bool al16(const void *x) { return (reinterpret_cast<uintptr_t>(x) & 15) == 0; }
__device__ __forceinline__ bool rows16_ok(const void *x, int dt, int64_t ncols, int col0, int n) {
    const int es = dt == 0 ? 4 : 2;
    return !((((int64_t)ncols * es) & 15) || ((col0 * es) & 15) || ((n * es) & 15) || (reinterpret_cast<uintptr_t>(x) & 15));
}
__device__ __forceinline__ int rows16_pieces(int dt, int c, int n) { return c * (n * (dt == 0 ? 4 : 2) / 16); }

template <int U> struct Rows16 {
    uint4 r[U];
    float f[U];
    __device__ __forceinline__ void issue(const void *x, int dt, int64_t row0, int c, int heads, int hh, int64_t ncols, int col0, int n,
                                          const float *rs, int b0) {
        const int es = dt == 0 ? 4 : 2, per = 16 / es, pr = n / per, np = c * pr;
        const char *xb = static_cast<const char *>(x);
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int e = b0 + threadIdx.x + u * NT;
            if (e < np) {
                const int t = e / pr, q = e - t * pr;
                const int64_t rowi = (row0 + t) * heads + hh;
                r[u] = *reinterpret_cast<const uint4 *>(xb + (rowi * ncols + col0 + q * per) * es);
                f[u] = rs ? rs[rowi] : 1.f;
            }
        }
    }
    __device__ __forceinline__ void commit(float *dst, int ld, int dt, int c, int n, int b0) const {
        const int per = dt == 0 ? 4 : 8, pr = n / per, np = c * pr;
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int e = b0 + threadIdx.x + u * NT;
            if (e >= np) continue;
            const int t = e / pr, q = e - t * pr;
            float *d = dst + (int64_t)t * ld + q * per;
            const uint32_t w[4] = {r[u].x, r[u].y, r[u].z, r[u].w};
            if (dt == 0) {
#pragma unroll
                for (int i = 0; i < 4; i++) d[i] = __uint_as_float(w[i]) * f[u];
            } else if (dt == 1) {
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    d[2 * i] = __uint_as_float(w[i] << 16) * f[u];
                    d[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u) * f[u];
                }
            } else {
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    d[2 * i] = __half2float(__ushort_as_half((unsigned short)(w[i] & 0xffffu))) * f[u];
                    d[2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(w[i] >> 16))) * f[u];
                }
            }
        }
    }
};

/* the whole of load_rows16's job in rounds of 8 pieces a thread; false (nothing
 * done) where not aligned */
__device__ inline bool load_rows16(float *dst, int ld, const void *x, int dt, int64_t row0, int c, int heads, int hh,
                                   int64_t ncols, int col0, int n, const float *rs) {
    if (!rows16_ok(x, dt, ncols, col0, n)) return false;
    const int np = rows16_pieces(dt, c, n);
    for (int b0 = 0; b0 < np; b0 += 8 * NT) {
        Rows16<8> R;
        R.issue(x, dt, row0, c, heads, hh, ncols, col0, n, rs, b0);
        R.commit(dst, ld, dt, c, n, b0);
    }
    return true;
}

/* rows row0..row0+c-1 of q or k (head h), normalized by the saved rstd
 * (GDN_QK_L2NORM; raw where rstd is NULL), into dst [64][ld]; rows >= c and
 * columns >= K are zero.
 * By 16-byte pieces where aligned (load_rows16); else a warp per row, two
 * rows at a time, the lanes along the row, 2 x 9 loads in flight per lane */
__device__ inline void load_qk(const BwdArgs &p, const void *x, const float *rstd, int64_t row0, int c, int h, float *dst, int ld,
                               int i0 = 0, int n = -1) {   /* columns [i0, i0 + n) of the rows (n < 0: all of K) */
    constexpr int PER = (256 + 4 + 31) / 32;   /* ld <= 260 */
    const bool l2 = (p.flags & GDN_QK_L2NORM) && rstd;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, K = n < 0 ? p.K : n;
    if (load_rows16(dst, ld, x, p.dt, row0, c, p.H, h, p.K, i0, K, l2 ? rstd : nullptr)) {
        for (int e = threadIdx.x; e < CC * ld; e += NT) {   /* the zeros: rows past c, columns past K */
            const int t = e / ld, i = e - t * ld;
            if (t >= c || i >= K) dst[e] = 0.f;
        }
        return;
    }
    for (int t0 = warp; t0 < CC; t0 += 2 * (NT / 32)) {
        float v[2][PER], rs[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int t = t0 + r * (NT / 32);
            const int64_t at = (row0 + t) * p.H + h;
            rs[r] = t < c && l2 ? rstd[at] : 1.f;
#pragma unroll
            for (int u = 0; u < PER; u++) {
                const int i = lane + 32 * u;
                v[r][u] = t < c && i < K ? gdn::ld(x, at * p.K + i0 + i, p.dt) : 0.f;
            }
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int t = t0 + r * (NT / 32);
#pragma unroll
            for (int u = 0; u < PER; u++) {
                const int i = lane + 32 * u;
                if (i < ld) dst[t * ld + i] = v[r][u] * rs[r];
            }
        }
    }
}

/* rows row0..row0+c-1 of a [rows][HV][V] tensor (value head j), columns
 * v0..v0+n-1, into dst [64][ld]; rows >= c and columns past V are zero.
 * By 16-byte pieces where aligned and inside V, else laid out as load_qk;
 * n <= 256 */
__device__ inline void load_rows_v(const BwdArgs &p, const void *x, int64_t row0, int c, int j, int v0, int n, float *dst, int ld) {
    constexpr int PER = 256 / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, V = p.V;
    if (v0 + n <= V && load_rows16(dst, ld, x, p.dt, row0, c, p.HV, j, V, v0, n, nullptr)) {
        for (int e = threadIdx.x; e < (CC - c) * n; e += NT) dst[(c + e / n) * ld + e % n] = 0.f;
        return;
    }
    for (int t0 = warp; t0 < CC; t0 += 2 * (NT / 32)) {
        float v[2][PER];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int t = t0 + r * (NT / 32);
            const int64_t at = ((row0 + t) * p.HV + j) * (int64_t)V + v0;
#pragma unroll
            for (int u = 0; u < PER; u++) {
                const int i = lane + 32 * u;
                v[r][u] = t < c && i < n && v0 + i < V ? gdn::ld(x, at + i, p.dt) : 0.f;
            }
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int t = t0 + r * (NT / 32);
#pragma unroll
            for (int u = 0; u < PER; u++) {
                const int i = lane + 32 * u;
                if (i < n) dst[t * ld + i] = v[r][u];
            }
        }
    }
}

/* a 64 x 64 fp32 matrix (16-byte aligned, row stride 64) through registers
 * to shared memory (row stride ld), 16-byte loads, all of a thread's in
 * flight at once; issue and commit apart, as Rows16 */
struct Mat64 {
    float4 r[CC * CC / 4 / NT];
    __device__ __forceinline__ void issue(const float *src) {
        const float4 *s4 = reinterpret_cast<const float4 *>(src);
#pragma unroll
        for (int u = 0; u < CC * CC / 4 / NT; u++) r[u] = s4[threadIdx.x + u * NT];
    }
    __device__ __forceinline__ void commit(float *dst, int ld) const {
#pragma unroll
        for (int u = 0; u < CC * CC / 4 / NT; u++) {
            const int e = 4 * (threadIdx.x + u * NT);
            float *d = dst + (e >> 6) * ld + (e & 63);
            d[0] = r[u].x; d[1] = r[u].y; d[2] = r[u].z; d[3] = r[u].w;
        }
    }
};
/* each token's gate cumsum (double), exp(gc) and beta from a record, thread
 * t < CC holding token t; issue and commit apart, as Rows16 */
struct RecTok {
    double gcd = 0;
    float gam = 0.f, bet = 0.f;
    __device__ __forceinline__ void issue(const float *rec) {
        if (threadIdx.x < CC) {
            gcd = reinterpret_cast<const double *>(rec + R_GCD)[threadIdx.x];
            gam = rec[R_GAM + threadIdx.x];
            bet = rec[R_BETA + threadIdx.x];
        }
    }
    __device__ __forceinline__ void commit(double *g, float *ga, float *b) const {
        if (threadIdx.x < CC) { g[threadIdx.x] = gcd; ga[threadIdx.x] = gam; b[threadIdx.x] = bet; }
    }
};

/* the sum of the pairs a0 + a1 of the lanes below this one (a warp's 64
 * values, two a lane, scanned in a fixed order: Hillis-Steele over the
 * pairs); every lane of the warp calls it */
template <typename S> __device__ __forceinline__ S warp_pair_scan(S a0, S a1) {
    const int lane = threadIdx.x & 31;
    S incl = a0 + a1;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const S y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
    }
    const S ex = __shfl_up_sync(0xffffffffu, incl, 1);
    return lane == 0 ? S(0) : ex;
}

/* gate_store's inputs per token, fetched with the record's (thread t < c
 * holding token t): the fused gate's argument x = a + dt_bias and the
 * record's g, beta's raw input for its sigmoid, and -exp(A_log); commit puts
 * them at gt[0..CC) (x), gt[CC..2CC) (g), gt[2CC..3CC) (beta), gt[3CC] (A) */
struct GateTok {
    float x = 0.f, gr = 0.f, b = 0.f, A = 0.f;
    int t = 0;   /* the token: threadIdx.x, or the caller's numbering (issue_t) */
    __device__ __forceinline__ void issue(const BwdArgs &p, const float *rec, int64_t row0, int c, int j) {
        issue_t(p, rec, row0, c, j, (int)threadIdx.x);
    }
    __device__ __forceinline__ void issue_t(const BwdArgs &p, const float *rec, int64_t row0, int c, int j, int tt) {
        t = tt;
        if (t < c && p.g && (p.flags & GDN_GATE_FUSED)) {
            x = gdn::ld(p.g, (row0 + t) * p.HV + j, p.gdt) + (p.dt_bias ? p.dt_bias[j] : 0.f);
            gr = rec[R_G + t];
            if (t == 0) A = p.A_log[j];
        }
        if (t < c && (p.flags & GDN_BETA_SIGMOID)) b = gdn::ld(p.beta, (row0 + t) * p.HV + j, p.gdt);
    }
    __device__ __forceinline__ void commit(float *gt) const {
        if (t < CC) { gt[t] = x; gt[CC + t] = gr; gt[2 * CC + t] = b; }
        if (t == 0) gt[3 * CC] = -expf(A);
    }
};
constexpr int GT_FLOATS = 3 * CC + 4;

__device__ __forceinline__ void load_64x64(float *dst, int ld, const float *src) {
    Mat64 m;
    m.issue(src);
    m.commit(dst, ld);
}

/* the end of chunk_backward (every stage): dg = reverse cumsum of dgc plus
 * the pair terms Rg (ldr its row stride), in S (double as the CPU; float
 * where the products feeding it are single tf32 ones, whose rounding is
 * thousands of times fp32's), then through the fused gate (dA_log, ddt_bias partials
 * into p.part, in double); the beta sigmoid chain; stores of dg and dbeta.
 * Every thread of the block calls it. row holds CC floats and pre
 * CC x (CC + 1) doubles of shared memory; gt the inputs GateTok fetched
 * (committed before the caller's last barrier). (The fused pass has its own,
 * chunk_gate of chunk_bwd_fused.cu: the same sums by their differences.) */
template <typename S = double>
__device__ inline void gate_store(const BwdArgs &p, int64_t slot, int j, int64_t row0, int c, const float *gt, const float *Rg,
                                  int ldr, const float *dgc, const float *dbeta, float *row, double (*pre_mem)[CC + 1]) {
    const int t = (int)threadIdx.x;
    const auto sync = [] { __syncthreads(); };
    const int64_t gi = slot * p.HV + j;
    const int HV = p.HV;
    double(*pre)[CC + 1] = pre_mem;
    S(*ps)[CC + 1] = reinterpret_cast<S(*)[CC + 1]>(pre_mem);
    if (p.g) {
        /* dg_t = sum_{t'>=t} dgc_t' + sum_{t'>=t} sum_{s<t} Rg_t's:
         * ps[t'][t] = sum_{s<t} Rg_t's by a scan along each row (a warp a
         * row, two columns a lane), then each column's sum over t' >= t by
         * four threads (every fourth t') and the quad; fixed orders */
        const int lane = t & 31;
        for (int tp = t >> 5; tp < c; tp += NT / 32) {
            const S a0 = 2 * lane < c ? (S)Rg[tp * ldr + 2 * lane] : S(0), a1 = 2 * lane + 1 < c ? (S)Rg[tp * ldr + 2 * lane + 1] : S(0);
            const S ex = warp_pair_scan(a0, a1);
            ps[tp][2 * lane] = ex;
            ps[tp][2 * lane + 1] = ex + a0;
        }
        sync();
        {
            const int col = t >> 2, q = t & 3;
            S acc = 0;
            if (col < c)
                for (int tp = col + q; tp < c; tp += 4) acc += (S)dgc[tp] + ps[tp][col];
            acc += __shfl_xor_sync(0xffffffffu, acc, 1);
            acc += __shfl_xor_sync(0xffffffffu, acc, 2);
            if (q == 0 && col < c) row[col] = (float)acc;
        }
        sync();
        if (p.flags & GDN_GATE_FUSED) {
            /* token t by thread t; the partials summed over the tokens by a
             * fixed tree (shuffles in each of the two warps, then warp 0 + warp 1) */
            double sa = 0, sb = 0;
            if (t < c) {
                const float A = gt[3 * CC], x = gt[t];
                const float dg = row[t];
                sa = (double)dg * (double)gt[CC + t];
                row[t] = dg * A * (x > 20.f ? 1.f : gdn::sigmoid(x));
                sb = row[t];
            }
            if (t < CC) {
#pragma unroll
                for (int o = 16; o; o >>= 1) {
                    sa += __shfl_xor_sync(0xffffffffu, sa, o);
                    sb += __shfl_xor_sync(0xffffffffu, sb, o);
                }
                if ((t & 31) == 0) { pre[0][t >> 5] = sa; pre[1][t >> 5] = sb; }
            }
            sync();
            if (t == 0) {
                p.part[gi] = pre[0][0] + pre[0][1];
                p.part[p.nslots * HV + gi] = pre[1][0] + pre[1][1];
            }
        }
        if (t < c) gdn::st(p.dg, (row0 + t) * HV + j, row[t], p.gdt);
    }
    if (t < c) {
        float db = dbeta[t];
        if (p.flags & GDN_BETA_SIGMOID) {
            const float m = (p.flags & GDN_BETA_NEGATIVE) ? 2.f : 1.f;
            const float sg = gdn::sigmoid(gt[2 * CC + t]);
            db *= m * sg * (1.f - sg);
        }
        gdn::st(p.dbeta, (row0 + t) * HV + j, db, p.gdt);
    }
}

/* ---- the group stage: per-item scratch (floats, offsets from the item's base) ---- */
struct Scr {
    int64_t F;   /* floats per item */
    int64_t Q, Kc, Bk, Kd, dKd, Xq, dQc, dKc, dWk, dBk;   /* [64][K] */
    int64_t Vv, Bv, Xr, U, dO, dU, dBv;                   /* [64][V] */
    int64_t dP, dTm, tmp, dA, Rg;                         /* [64][64] */
    int64_t dgc, dbeta;                                   /* [64]     */
};

struct Grp {
    int64_t s0;      /* first slot of the group */
    float *scr;      /* item 0's scratch */
    Scr o;
    bool cl;         /* the local stage in clusters of G blocks: dq, dk summed there, no scratch (local_cluster) */
};

/* the local stage for 128 < K <= 256, G <= 4: two blocks an item, block r
 * holding columns [128 r, 128 r + 128) of K and exchanging the partial sums
 * over K through distributed shared memory, the G value heads' 2 G blocks
 * one cluster (chunk_bwd_local.cu, KS) */
__host__ __device__ inline bool local_ks(int K, int G) { return k8(K) > 128 && k8(K) <= 256 && G <= 4; }
/* f16 operands in power-of-two scales (the transposed sweep, the chunk-local
 * walk): a power of two bringing m (the largest |value| of an operand) to
 * [2^14, 2^15), its exponent within +-40 (the accumulators it scales keep
 * fp32's range); 1 for 0, inf or nan. f16 keeps 11 bits only from 6.1e-5 to
 * 65504: a state or a state gradient far below that rounds to subnormals */
__device__ __forceinline__ float pow2_for(float m) {
    if (!(m > 0.f) || !(m < INFINITY)) return 1.f;
    int e = 14 - ilogbf(m);
    e = e < -40 ? -40 : e > 40 ? 40 : e;
    return ldexpf(1.f, e);
}
template <int N> __device__ __forceinline__ void mul_all(float *v, float s) {
#pragma unroll
    for (int i = 0; i < N; i++) v[i] *= s;
}
__device__ __forceinline__ float warp_max(float m) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    return m;
}

/* A cluster barrier's arrive that publishes this block's shared memory to
 * the others' shared::cluster reads, and nothing more: a release arrive is
 * MEMBAR.ALL.GPU in the SASS, a wait for every global store before it (which
 * no other block reads); the restricted fence is MEMBAR.ALL.CTA (bench/NOTES.md
 * v5.32). The wait that pairs with it acquires. */
#define GDN_CLUSTER_PUBLISH "fence.release.sync_restrict::shared::cta.cluster;\nbarrier.cluster.arrive.relaxed.aligned;"

/* The K split's exchange (the local stage and the transposed reverse sweep
 * at K = 256): the cluster barrier in halves (arrive publishing the shared
 * memory, wait with acquire), the partner block's copy of a shared array
 * (cluster ranks in pairs 2 g, 2 g + 1), and a thread's N values to / from
 * an array by thread (value i at i NT + thread: whole 128-byte lines a
 * warp). Partials are added as own + partner's, the same bits in both
 * blocks. */
__device__ __forceinline__ void ks_arrive() { asm volatile(GDN_CLUSTER_PUBLISH ::: "memory"); }
__device__ __forceinline__ void ks_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }
__device__ __forceinline__ void ks_sync() { ks_arrive(); ks_wait(); }
template <typename T> __device__ __forceinline__ T *ks_peer(T *x) {
    namespace cg = cooperative_groups;
    return cg::this_cluster().map_shared_rank(x, (int)cg::this_cluster().block_rank() ^ 1);
}
template <int N> __device__ __forceinline__ void ks_put(float *buf, const float *x) {
#pragma unroll
    for (int i = 0; i < N; i++) buf[i * NT + threadIdx.x] = x[i];
}
template <int N> __device__ __forceinline__ void ks_add(const float *peer, float *x) {
#pragma unroll
    for (int i = 0; i < N; i++) x[i] += peer[i * NT + threadIdx.x];
}
/* the chunk-local stage of chunk_bwd_local.cu (else the group stage of chunk_bwd_grp.cu) */
__host__ __device__ inline bool use_local(int K, int G) { return k8(K) <= 128 || local_ks(K, G); }
/* the local stage sums dQc, dKc over the G value heads in a thread-block
 * cluster of G blocks (portable sizes) instead of the scratch and grp_qk_kernel;
 * with the K split its two blocks are the cluster */
__host__ __device__ inline bool local_cluster(int K, int G) { return (k8(K) <= 128 && G <= 8) || local_ks(K, G); }

template <typename Kern>
cudaError_t smem_attr(Kern k, int bytes) {   /* host-side only: capture-safe */
    return bytes > 48 * 1024 ? cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) : cudaSuccess;
}

/* ---- the passes' host launchers, each defined next to its kernels and
 * instantiated for SPLIT = true (run, chunk_bwd.cu, makes the choice). attr()
 * raises a kernel's dynamic shared memory limit where it needs more than
 * 48 KiB; launch() queues the kernel(s) on st. ---- */

/* hidden: the launchers link the files of one library and are no part of its
 * exported symbols (file-local before the split) */
#define GDN_CBWD_HIDDEN __attribute__((visibility("hidden")))
/* chunk_bwd_prep.cu: slot_info over all slots; prep per (slot, value head) */
GDN_CBWD_HIDDEN void slot_info_launch(const BwdArgs &p, cudaStream_t st);
template <bool SPLIT> struct GDN_CBWD_HIDDEN PrepPass {
    static cudaError_t attr(int K);
    static void launch(const BwdArgs &p, cudaStream_t st);
};
/* chunk_bwd_sweep.cu: attr raises fwd_sweep's limit, then bwd_sweep's */
template <bool SPLIT> struct GDN_CBWD_HIDDEN SweepPass {
    static cudaError_t attr(int K);
    static void launch_fwd(const BwdArgs &p, unsigned blocks, cudaStream_t st);
    static void launch_bwd(const BwdArgs &p, unsigned blocks, cudaStream_t st);
};
/* chunk_bwd_sweep_t.cu: the reverse sweep transposed on wgmma, where it takes
 * the shape (bf16, K = 128, V in 128-column blocks); launch_bwd goes there */
struct GDN_CBWD_HIDDEN SweepT {
    static bool takes(const BwdArgs &p);
    static cudaError_t attr();
    static void launch(const BwdArgs &p, cudaStream_t st);
};
/* chunk_bwd_fused.cu: the reverse sweep and the chunk-local stage in one
 * pass, one block per (sequence, value head) in clusters of the G value heads
 * of a q/k head, where it takes the shape (bf16, K = V = 128, G <= 4,
 * 16-byte aligned rows); it reads the records and forward states as the local
 * stage does and keeps no state gradient but the carried one (dht -> dh0) */
struct GDN_CBWD_HIDDEN Fused {
    static bool takes(const BwdArgs &p);
    static cudaError_t attr();
    /* clusters of g blocks of one block an SM that run at once (asked once a g; host only) */
    static int max_clusters(int g);
    static void launch(const BwdArgs &p, cudaStream_t st);
};
/* chunk_bwd_grp.cu: one group of nsl slots (grp_kernel, then grp_qk_kernel);
 * dparam after the last group */
template <bool SPLIT> struct GDN_CBWD_HIDDEN GrpPass {
    static cudaError_t attr(int K, int V);
    static void launch(const BwdArgs &p, const Grp &G, int64_t nsl, cudaStream_t st);
};
/* chunk_bwd_grp.cu: dq, dk of a group from the items' dQc, dKc in the scratch
 * (G.o.dQc, G.o.dKc): the sum over the value heads and the L2 norm chain */
GDN_CBWD_HIDDEN void grp_qk_launch(const BwdArgs &p, const Grp &G, int64_t nsl, cudaStream_t st);
/* chunk_bwd_local.cu: the chunk-local stage (use_local), one group of nsl
 * slots; its items' dQc, dKc into the scratch (local_scr) where not in clusters */
GDN_CBWD_HIDDEN Scr local_scr(int K);
template <bool SPLIT> struct GDN_CBWD_HIDDEN LocalPass {
    static cudaError_t attr(int K, int G);
    static void launch(const BwdArgs &p, const Grp &G, int64_t nsl, cudaStream_t st);
};
GDN_CBWD_HIDDEN void dparam_launch(const BwdArgs &p, cudaStream_t st);
/* chunk_bwd_split.cu: the sequence split's segmented view (N sequences of
 * the caller cut into Ns segments of sc chunks) and its folds */
struct SegView {
    const int64_t *cu;            /* the caller's cu_seqlens_dev, or NULL: N sequences of T */
    int64_t T, N, Ns;
    int sc, HV, K, V;
    unsigned flags;
    int64_t *scu, *sseq, *first;  /* the view's cu_seqlens [Ns+1], sequence of each segment [Ns], first segment of each sequence [N+1] */
    const float *seg_p, *seg_s;   /* the forward's pass 1: each segment's map (chunk_fwd.cu slots) */
    /* or, where *mtag == mtag_val (mtag not NULL), the forward's own in saved (gdn_saved_maps): saved_p, saved_s */
    const int *mtag;
    int mtag_val;
    const float *saved_p, *saved_s;
};
GDN_CBWD_HIDDEN void seg_table_launch(const SegView &v, cudaStream_t st);
GDN_CBWD_HIDDEN void seg_dht_init_launch(const SegView &v, const float *dht, float *dhts, cudaStream_t st);
/* the h0 rows (with_h0) and the dht rows of the view, the two folds in one launch */
GDN_CBWD_HIDDEN void seg_fold_launch(const SegView &v, bool with_h0, const float *h0, float *h0s, const float *dsl, float *dhts,
                                     const float *E, float *d0, cudaStream_t st);
GDN_CBWD_HIDDEN void seg_dh0_launch(const SegView &v, const float *dh0s, float *dh0, cudaStream_t st);

}  // namespace cbwd
}  // namespace gdn
