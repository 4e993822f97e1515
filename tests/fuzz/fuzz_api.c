/* Fuzz target over the public C API on the CPU backend.
 *
 * One input (a few dozen bytes) picks an op (the chunk forward and backward
 * also their context-parallel calls, gdn_cp_*, and the begin / finish pairs
 * over one workspace), its shape (including zeros,
 * negatives, head dims past 256, HV not a multiple of H), dtypes (including
 * values outside the enum), flags (including unknown bits), which pointers
 * are NULL, cu_seqlens contents, decode / conv slots, and how many workspace
 * and saved bytes are claimed. Every buffer is allocated at the size the
 * shape implies (a small one where a dimension is not positive), inputs hold
 * small values, outputs a poison pattern. Then the call, and the promises of
 * gdn.h are checked:
 *   - no const input changes;
 *   - a refused call writes no output byte and leaves a message;
 *   - anything past a buffer is for AddressSanitizer / UBSan to report.
 * A broken promise aborts with the op and the status.
 *
 * Two drivers: built with clang -fsanitize=fuzzer, libFuzzer calls
 * LLVMFuzzerTestOneInput; otherwise main() (tests/fuzz/README.md):
 *     gdn_fuzz [-t SECONDS] [-s SEED] [-n RUNS] [-w DIR] [FILE|DIR ...]
 * replays each corpus file, then runs random inputs (and mutations of the
 * corpus) for SECONDS, and prints the executions and how many calls were
 * accepted. -w DIR writes each input whose call was accepted with a new
 * (op, status) pair there, to grow a corpus. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include "gdn.h"

/* ---- reading the input ---- */

typedef struct { const uint8_t *p; size_t n, at; } rd;
static unsigned byte(rd *r) { return r->at < r->n ? r->p[r->at++] : 0; }
#define PICK(r, arr) ((arr)[byte(r) % (sizeof(arr) / sizeof((arr)[0]))])

static int verbose;   /* GDN_FUZZ_VERBOSE set: each call's shape and buffers on stderr */

/* ---- buffers: allocated, filled, snapshot, checked ---- */

enum { MAXBUF = 32 };
typedef struct {
    void *p[MAXBUF], *copy[MAXBUF];
    size_t bytes[MAXBUF];
    int out[MAXBUF];   /* 1: written by the call (outputs, in/out); 2: scratch, never compared */
    const char *name[MAXBUF];
    int n;
} bufs;

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) { fprintf(stderr, "gdn_fuzz: out of memory\n"); abort(); }
    return p;
}

/* elements of a tensor from its dims; 0 if a dim is not positive (then a small buffer) */
static size_t elems(int64_t a, int64_t b, int64_t c, int64_t d) {
    if (a <= 0 || b <= 0 || c <= 0 || d <= 0) return 0;
    return (size_t)(a * b * c * d);
}
/* a size query's answer, 0 if implausible (the shape is refused anyway) */
static size_t cap(size_t n) { return n > ((size_t)1 << 28) ? 0 : n; }
static size_t esize(int dt) { return dt == GDN_BF16 || dt == GDN_F16 ? 2 : 4; }

/* a buffer of n elements of es bytes, or NULL when the input says so */
static void *buf(bufs *B, rd *r, const char *name, size_t n, size_t es, int out, int may_null) {
    if (may_null && byte(r) % 4 == 0) return NULL;
    if (B->n == MAXBUF) abort();
    const int i = B->n++;
    const size_t bytes = n ? n * es : 16;
    uint8_t *p = xmalloc(bytes);
    if (out == 2) { /* scratch (workspace): left uninitialised, for valgrind to see reads before writes */ }
    else if (out) memset(p, 0xA5, bytes);
    else if (es == 2) for (size_t k = 0; k + 1 < bytes; k += 2) { p[k] = (uint8_t)(k * 7); p[k + 1] = 0x3C; }   /* ~1.x in f16, bf16 */
    else for (size_t k = 0; k + 3 < bytes; k += 4) { const float f = 0.25f * (float)((k / 4) % 7) - 0.5f; memcpy(p + k, &f, 4); }
    B->p[i] = p; B->bytes[i] = bytes; B->out[i] = out; B->name[i] = name;
    if (verbose) fprintf(stderr, "  %s %zu bytes at %p\n", name, bytes, (void *)p);
    B->copy[i] = xmalloc(bytes);
    if (out != 2) memcpy(B->copy[i], p, bytes);
    return p;
}
static void *slots_buf(bufs *B, rd *r, int64_t rows, int64_t num_slots) {
    if (rows <= 0 || byte(r) % 3 == 0) return NULL;
    int32_t *s = buf(B, r, "slots", (size_t)rows, 4, 0, 0);
    for (int64_t b = 0; b < rows; b++) s[b] = (int32_t)((int)(byte(r) % (unsigned)(num_slots + 4)) - 2);
    memcpy(B->copy[B->n - 1], s, (size_t)rows * 4);
    return s;
}

static const char *op_names[] = {"chunk_fwd", "recurrent_fwd", "chunk_bwd", "gate_fwd", "gate_bwd", "l2norm_fwd",
                                 "l2norm_bwd", "conv1d_fwd", "conv1d_bwd", "conv1d_update", "decode_step",
                                 "rmsnorm_gated_fwd", "rmsnorm_gated_bwd"};
enum { N_OPS = sizeof op_names / sizeof *op_names };

static void check(const bufs *B, int op, gdn_status st) {
    for (int i = 0; i < B->n; i++) {
        if ((B->out[i] && st == GDN_OK) || B->out[i] == 2) continue;
        if (memcmp(B->p[i], B->copy[i], B->bytes[i]) != 0) {
            fprintf(stderr, "gdn_fuzz: %s returned %s and changed %s (%s)\n", op_names[op], gdn_status_string(st),
                    B->name[i], B->out[i] ? "an output of a refused call" : "a const input");
            abort();
        }
    }
    if (st != GDN_OK && gdn_last_error()[0] == '\0') {
        fprintf(stderr, "gdn_fuzz: %s returned %s with no message\n", op_names[op], gdn_status_string(st));
        abort();
    }
}

static void free_bufs(bufs *B) {
    for (int i = 0; i < B->n; i++) { free(B->p[i]); free(B->copy[i]); }
    B->n = 0;
}

/* ---- one input ---- */

static const int64_t Bs[] = {1, 1, 2, 3, 0, -1};
static const int64_t Ts[] = {1, 5, 64, 65, 130, 0, 2, -3};
static const int Hs[] = {1, 2, 1, 3, 0, -1};
static const int Gs[] = {1, 2, 1, 3};
static const int Ds[] = {8, 16, 5, 1, 33, 64, 0, 257, -4};
static const int dts[] = {GDN_F32, GDN_BF16, GDN_F16, GDN_F32, 3, -1};
static const int Ws[] = {4, 2, 1, 8, 0, 9};

static long cp_calls, cp_accepted;   /* context-parallel calls made, and accepted */

/* a context-parallel rank (gdn_cp_*): mostly a valid one, now and then not
 * (world -1..3, rank -1..world, continue flags that the rank cannot have, 2) */
static gdn_cp_config cp_config(rd *r) {
    gdn_cp_config cp;
    const int junk = byte(r) % 6 == 0;
    cp.world = junk && byte(r) % 2 ? (int)(byte(r) % 5) - 1 : 1 + (int)(byte(r) % 3);
    cp.rank = junk && byte(r) % 2 ? (int)(byte(r) % (unsigned)(cp.world > 0 ? cp.world + 2 : 2)) - 1
                                  : (int)(byte(r) % (unsigned)(cp.world > 0 ? cp.world : 1));
    cp.first_continues = junk ? (int)(byte(r) % 3) : cp.rank > 0 && byte(r) % 2;
    cp.last_continues = junk ? (int)(byte(r) % 3) : cp.rank < cp.world - 1 && byte(r) % 2;
    return cp;
}

static int run_one(const uint8_t *data, size_t size, int *accepted_op, gdn_status *status) {
    rd r = {data, size, 0};
    bufs B = {0};
    const int op = (int)(byte(&r) % N_OPS);
    gdn_exec ex = {GDN_BACKEND_CPU, NULL, (int)(byte(&r) % 3), (int)(byte(&r) % 5) - 1};
    const unsigned eb = byte(&r) % 16;
    if (eb == 0) ex.backend = GDN_BACKEND_CUDA;   /* refused where no device is seen */
    else if (eb == 1) ex.backend = (gdn_backend)5;
    const gdn_exec *exp = byte(&r) % 5 == 0 ? NULL : &ex;
    gdn_status st = GDN_OK;

    if (op <= 2) {   /* the gated delta rule */
        gdn_config c = {0};
        c.B = PICK(&r, Bs); c.T = PICK(&r, Ts); c.H = PICK(&r, Hs);
        c.HV = byte(&r) % 6 == 0 ? (int)(byte(&r) % 7) - 1 : c.H * PICK(&r, Gs);
        c.K = PICK(&r, Ds); c.V = PICK(&r, Ds);
        c.dtype = (gdn_dtype)PICK(&r, dts);
        c.gate_dtype = byte(&r) % 3 == 0 ? c.dtype : (byte(&r) % 5 == 0 ? (gdn_dtype)PICK(&r, dts) : GDN_F32);
        c.flags = byte(&r) & 31;
        if (byte(&r) % 8 == 0) c.flags |= 1u << (5 + byte(&r) % 8);
        c.scale = byte(&r) % 4 == 0 ? -1.f : 0.f;
        int64_t cu[6];
        int64_t N = c.B;
        if (byte(&r) % 3 == 0) {   /* varlen */
            c.num_seqs = (int64_t)(byte(&r) % 5) - 1;
            const int64_t n1 = c.num_seqs >= 0 && c.num_seqs < 5 ? c.num_seqs + 1 : 1;
            for (int64_t i = 0; i < n1; i++) {
                const unsigned m = byte(&r) % 8;
                cu[i] = i == 0 ? (m == 0 ? 1 : 0) : (i == n1 - 1 ? (m == 0 ? c.T - 1 : c.T) : (int64_t)(byte(&r) % (unsigned)(c.T > 0 ? c.T + 2 : 2)) - 1);
            }
            if (byte(&r) % 2) for (int64_t i = 1; i + 1 < n1; i++) if (cu[i] < cu[i - 1]) cu[i] = cu[i - 1];
            c.cu_seqlens = byte(&r) % 8 == 0 ? NULL : cu;
            if (c.cu_seqlens) N = c.num_seqs;   /* without cu_seqlens num_seqs is not read */
        }
        const int64_t rows = c.B * c.T;
        const size_t nqk = elems(c.B, c.T, c.H, c.K), nv = elems(c.B, c.T, c.HV, c.V), ng = elems(c.B, c.T, c.HV, 1),
                     nst = elems(N, c.HV, c.K, c.V);
        const size_t ds = esize(c.dtype), gs = esize(c.gate_dtype);
        (void)rows;
        const void *q = buf(&B, &r, "q", nqk, ds, 0, 1), *k = buf(&B, &r, "k", nqk, ds, 0, 1),
                   *v = buf(&B, &r, "v", nv, ds, 0, 1), *g = buf(&B, &r, "g", ng, gs, 0, 1),
                   *beta = buf(&B, &r, "beta", ng, gs, 0, 1);
        const float *A_log = buf(&B, &r, "A_log", c.HV > 0 ? (size_t)c.HV : 0, 4, 0, 1),
                    *dt_bias = buf(&B, &r, "dt_bias", c.HV > 0 ? (size_t)c.HV : 0, 4, 0, 1),
                    *h0 = buf(&B, &r, "h0", nst, 4, 0, 1);
        const size_t saved_need = cap(gdn_chunk_saved_size(&c));
        if (op == 0 || op == 1) {
            gdn_fwd_args a = {0};
            a.q = q; a.k = k; a.v = v; a.g = g; a.beta = beta; a.A_log = A_log; a.dt_bias = dt_bias; a.h0 = h0;
            a.o = buf(&B, &r, "o", nv, ds, 1, 1);
            a.ht = buf(&B, &r, "ht", nst, 4, 1, 1);
            if (op == 0) {
                const size_t wneed = cap(gdn_chunk_fwd_workspace_size(exp, &c));
                a.saved = buf(&B, &r, "saved", saved_need, 1, 1, 1);
                a.saved_bytes = a.saved ? (saved_need && byte(&r) % 6 == 0 ? saved_need - 1 : saved_need) : 0;
                a.workspace = buf(&B, &r, "workspace", wneed, 1, 2, 1);
                a.workspace_bytes = a.workspace ? (wneed && byte(&r) % 6 == 0 ? wneed / 2 : wneed) : 0;
                /* the last byte of the case picks a context-parallel call on the same tensors
                 * (past the end of an input it reads 0: the plain call, as before) */
                const unsigned cpb = byte(&r) % 8;
                if (cpb == 1 || cpb == 2) {
                    const gdn_cp_config cp = cp_config(&r);
                    const size_t mf = cap(gdn_cp_map_floats(&c)), cw = cap(gdn_cp_fwd_map_workspace_size(exp, &c, &cp));
                    if (cpb == 1) {
                        a.workspace = buf(&B, &r, "cp workspace", cw, 1, 2, 1);
                        a.workspace_bytes = a.workspace ? (cw && byte(&r) % 6 == 0 ? cw - 1 : cw) : 0;
                        st = gdn_cp_fwd_map(exp, &c, &cp, &a, buf(&B, &r, "map", mf, 4, 1, 1));
                    } else {
                        const size_t world = cp.world > 0 ? (size_t)cp.world : 0;
                        const float *maps = buf(&B, &r, "maps", mf * world, 4, 0, 1);
                        st = gdn_cp_fwd_scan(exp, &c, &cp, maps, buf(&B, &r, "S_in", elems(c.HV, c.K, c.V, 1), 4, 1, 1));
                    }
                    cp_calls++;
                    cp_accepted += st == GDN_OK;
                } else if (cpb == 3) {   /* the pair: begin, then finish over the same workspace */
                    const gdn_cp_config cp = cp_config(&r);
                    const size_t mf = cap(gdn_cp_map_floats(&c)), cw = cap(gdn_cp_fwd_workspace_size(exp, &c, &cp));
                    a.workspace = buf(&B, &r, "cp workspace", cw, 1, 2, 1);
                    a.workspace_bytes = a.workspace ? (cw && byte(&r) % 6 == 0 ? cw - 1 : cw) : 0;
                    /* the map is the first call's output, unwatched: the second's may fail after it */
                    st = gdn_cp_fwd_begin(exp, &c, &cp, &a, buf(&B, &r, "map", mf, 4, 2, 1));
                    if (st == GDN_OK) st = gdn_cp_fwd_finish(exp, &c, &cp, &a);
                    cp_calls++;
                    cp_accepted += st == GDN_OK;
                } else {
                    st = gdn_chunk_fwd(exp, &c, &a);
                }
            } else {
                st = gdn_recurrent_fwd(exp, &c, &a);
            }
        } else {
            gdn_bwd_args a = {0};
            a.q = q; a.k = k; a.v = v; a.g = g; a.beta = beta; a.A_log = A_log; a.dt_bias = dt_bias; a.h0 = h0;
            a.saved = buf(&B, &r, "saved", saved_need, 1, 0, 1);
            a.saved_bytes = a.saved ? saved_need : 0;
            a.dout = buf(&B, &r, "dout", nv, ds, 0, 1);
            a.dht = buf(&B, &r, "dht", nst, 4, 0, 1);
            a.dq = buf(&B, &r, "dq", nqk, ds, 1, 1); a.dk = buf(&B, &r, "dk", nqk, ds, 1, 1);
            a.dv = buf(&B, &r, "dv", nv, ds, 1, 1);
            a.dg = buf(&B, &r, "dg", ng, gs, 1, 1); a.dbeta = buf(&B, &r, "dbeta", ng, gs, 1, 1);
            a.dA_log = buf(&B, &r, "dA_log", c.HV > 0 ? (size_t)c.HV : 0, 4, 1, 1);
            a.ddt_bias = buf(&B, &r, "ddt_bias", c.HV > 0 ? (size_t)c.HV : 0, 4, 1, 1);
            a.dh0 = buf(&B, &r, "dh0", nst, 4, 1, 1);
            const size_t wneed = cap(gdn_chunk_bwd_workspace_size(exp, &c));
            a.workspace = buf(&B, &r, "workspace", wneed, 1, 2, 1);
            a.workspace_bytes = a.workspace ? (wneed && byte(&r) % 6 == 0 ? wneed - 1 : wneed) : 0;
            const unsigned cpb = byte(&r) % 8;   /* as in the forward: a context-parallel call */
            if (cpb == 1 || cpb == 2) {
                const gdn_cp_config cp = cp_config(&r);
                const size_t mf = cap(gdn_cp_map_floats(&c)), cw = cap(gdn_cp_bwd_map_workspace_size(exp, &c, &cp));
                if (cpb == 1) {
                    a.workspace = buf(&B, &r, "cp workspace", cw, 1, 2, 1);
                    a.workspace_bytes = a.workspace ? (cw && byte(&r) % 6 == 0 ? cw - 1 : cw) : 0;
                    const float *fmap = buf(&B, &r, "fwd_map", mf, 4, 0, 1);
                    st = gdn_cp_bwd_map(exp, &c, &cp, &a, fmap, buf(&B, &r, "bmap", mf, 4, 1, 1));
                } else {
                    const size_t world = cp.world > 0 ? (size_t)cp.world : 0;
                    const float *maps = buf(&B, &r, "maps", mf * world, 4, 0, 1);
                    st = gdn_cp_bwd_scan(exp, &c, &cp, maps, buf(&B, &r, "dS_out", elems(c.HV, c.K, c.V, 1), 4, 1, 1));
                }
                cp_calls++;
                cp_accepted += st == GDN_OK;
            } else if (cpb == 3) {   /* the pair: begin, then finish over the same workspace */
                const gdn_cp_config cp = cp_config(&r);
                const size_t mf = cap(gdn_cp_map_floats(&c)), cw = cap(gdn_cp_bwd_workspace_size(exp, &c, &cp));
                a.workspace = buf(&B, &r, "cp workspace", cw, 1, 2, 1);
                a.workspace_bytes = a.workspace ? (cw && byte(&r) % 6 == 0 ? cw - 1 : cw) : 0;
                const float *fmap = buf(&B, &r, "fwd_map", mf, 4, 0, 1);
                st = gdn_cp_bwd_begin(exp, &c, &cp, &a, fmap, buf(&B, &r, "bmap", mf, 4, 2, 1));
                if (st == GDN_OK)
                    st = gdn_cp_bwd_finish(exp, &c, &cp, &a, buf(&B, &r, "dS_out", elems(c.HV, c.K, c.V, 1), 4, 0, 1));
                cp_calls++;
                cp_accepted += st == GDN_OK;
            } else {
                st = gdn_chunk_bwd(exp, &c, &a);
            }
        }
    } else if (op <= 6) {   /* gate, l2norm */
        const int64_t rows = (int64_t)PICK(&r, Ts) * PICK(&r, Bs);
        const int dim = op <= 4 ? PICK(&r, Hs) * PICK(&r, Gs) : PICK(&r, Ds);
        const int dt = PICK(&r, dts);
        const size_t n = elems(rows, dim, 1, 1), nd = dim > 0 ? (size_t)dim : 0, nr = rows > 0 ? (size_t)rows : 0;
        if (op == 3 || op == 4) {
            const void *a = buf(&B, &r, "a", n, esize(dt), 0, 1);
            const float *A_log = buf(&B, &r, "A_log", nd, 4, 0, 1), *dt_bias = buf(&B, &r, "dt_bias", nd, 4, 0, 1);
            if (op == 3) {
                st = gdn_gate_fwd(exp, rows, dim, (gdn_dtype)dt, a, A_log, dt_bias, buf(&B, &r, "g", n, 4, 1, 1));
            } else {
                const float *dg = buf(&B, &r, "dg", n, 4, 0, 1);
                void *da = buf(&B, &r, "da", n, esize(dt), 1, 1);
                float *dA = buf(&B, &r, "dA_log", nd, 4, 1, 1), *ddt = buf(&B, &r, "ddt_bias", nd, 4, 1, 1);
                st = gdn_gate_bwd(exp, rows, dim, (gdn_dtype)dt, a, A_log, dt_bias, dg, da, dA, ddt);
            }
        } else {
            const void *x = buf(&B, &r, "x", n, esize(dt), 0, 1);
            if (op == 5) {
                void *y = buf(&B, &r, "y", n, esize(dt), 1, 1);
                st = gdn_l2norm_fwd(exp, rows, dim, (gdn_dtype)dt, x, y, buf(&B, &r, "rstd", nr, 4, 1, 1));
            } else {
                const float *rstd = buf(&B, &r, "rstd", nr, 4, 0, 1);
                const void *dy = buf(&B, &r, "dy", n, esize(dt), 0, 1);
                st = gdn_l2norm_bwd(exp, rows, dim, (gdn_dtype)dt, x, rstd, dy, buf(&B, &r, "dx", n, esize(dt), 1, 1));
            }
        }
    } else if (op <= 9) {   /* conv1d */
        gdn_conv1d_config c = {0};
        c.B = PICK(&r, Bs); c.T = PICK(&r, Ts); c.D = PICK(&r, Ds); c.W = PICK(&r, Ws);
        c.dtype = (gdn_dtype)PICK(&r, dts);
        c.silu = (int)(byte(&r) % 3) - (byte(&r) % 9 == 0);
        int64_t cu[6], N = c.B;
        if (op != 9 && byte(&r) % 3 == 0) {
            c.num_seqs = (int64_t)(byte(&r) % 5) - 1;
            const int64_t n1 = c.num_seqs >= 0 && c.num_seqs < 5 ? c.num_seqs + 1 : 1;
            for (int64_t i = 0; i < n1; i++)
                cu[i] = i == 0 ? 0 : (i == n1 - 1 ? c.T : (int64_t)(byte(&r) % (unsigned)(c.T > 0 ? c.T + 2 : 2)) - 1);
            c.cu_seqlens = byte(&r) % 8 == 0 ? NULL : cu;
            if (c.cu_seqlens) N = c.num_seqs;
        }
        const size_t ds = esize(c.dtype), nx = elems(c.B, c.T, c.D, 1), nw = elems(c.D, c.W, 1, 1),
                     nb = c.D > 0 ? (size_t)c.D : 0, nst = elems(N, c.D, c.W, 1);
        const float *weight = buf(&B, &r, "weight", nw, 4, 0, 1), *bias = buf(&B, &r, "bias", nb, 4, 0, 1);
        if (verbose)
            fprintf(stderr, "%s B%lld T%lld D%d W%d dtype %d silu %d varlen %d N%lld cu", op_names[op], (long long)c.B,
                    (long long)c.T, c.D, c.W, (int)c.dtype, c.silu, c.cu_seqlens != NULL, (long long)c.num_seqs);
        if (verbose && c.cu_seqlens)
            for (int64_t q = 0; q <= c.num_seqs && q < 5; q++) fprintf(stderr, " %lld", (long long)cu[q]);
        if (verbose) fprintf(stderr, "\n");
        if (op == 7) {
            gdn_conv1d_args a = {0};
            a.x = buf(&B, &r, "x", nx, ds, 0, 1); a.weight = weight; a.bias = bias;
            a.h0 = buf(&B, &r, "h0", nst, 4, 0, 1);
            a.y = buf(&B, &r, "y", nx, ds, 1, 1); a.ht = buf(&B, &r, "ht", nst, 4, 1, 1);
            st = gdn_conv1d_fwd(exp, &c, &a);
        } else if (op == 8) {
            gdn_conv1d_bwd_args a = {0};
            a.x = buf(&B, &r, "x", nx, ds, 0, 1); a.weight = weight; a.bias = bias;
            a.h0 = buf(&B, &r, "h0", nst, 4, 0, 1);
            a.dy = buf(&B, &r, "dy", nx, ds, 0, 1); a.dht = buf(&B, &r, "dht", nst, 4, 0, 1);
            a.dx = buf(&B, &r, "dx", nx, ds, 1, 1); a.dweight = buf(&B, &r, "dweight", nw, 4, 1, 1);
            a.dbias = buf(&B, &r, "dbias", nb, 4, 1, 1); a.dh0 = buf(&B, &r, "dh0", nst, 4, 1, 1);
            st = gdn_conv1d_bwd(exp, &c, &a);
        } else {
            const int64_t num_slots = (int64_t)(byte(&r) % 6) - 1;
            const size_t nrow = elems(c.B, c.D, 1, 1);
            const void *x = buf(&B, &r, "x", nrow, ds, 0, 1);
            float *state = buf(&B, &r, "state", elems(num_slots, c.D, c.W, 1), 4, 1, 1);
            const int32_t *slots = slots_buf(&B, &r, c.B, num_slots);
            void *y = buf(&B, &r, "y", nrow, ds, 1, 1);
            st = gdn_conv1d_update(exp, &c, x, weight, bias, state, num_slots, slots, y);
        }
    } else if (op == 10) {   /* decode step */
        gdn_decode_config c = {0};
        c.B = (int)PICK(&r, Bs); c.H = PICK(&r, Hs);
        c.HV = byte(&r) % 6 == 0 ? (int)(byte(&r) % 7) - 1 : c.H * PICK(&r, Gs);
        c.K = PICK(&r, Ds); c.V = PICK(&r, Ds);
        c.dtype = (gdn_dtype)PICK(&r, dts);
        c.flags = byte(&r) & 31;
        c.num_slots = (int64_t)(byte(&r) % 6) - 1;
        c.conv_W = byte(&r) % 2 ? 0 : PICK(&r, Ws);
        const int64_t D = c.H > 0 && c.K > 0 && c.HV > 0 && c.V > 0 ? 2 * (int64_t)c.H * c.K + (int64_t)c.HV * c.V : 0;
        const size_t ds = esize(c.dtype), nrow = elems(c.B, D, 1, 1), nhv = elems(c.B, c.HV, 1, 1),
                     nh = c.HV > 0 ? (size_t)c.HV : 0;
        gdn_decode_args a = {0};
        a.mixed_qkv = buf(&B, &r, "mixed_qkv", nrow, ds, 0, 1);
        a.proj = buf(&B, &r, "proj", nrow, ds, 0, 1);
        a.conv_state = buf(&B, &r, "conv_state", elems(c.num_slots, D, c.conv_W, 1), 4, 1, 1);
        a.conv_weight = buf(&B, &r, "conv_weight", elems(D, c.conv_W, 1, 1), 4, 0, 1);
        a.conv_bias = buf(&B, &r, "conv_bias", D > 0 ? (size_t)D : 0, 4, 0, 1);
        a.a = buf(&B, &r, "a", nhv, ds, 0, 1); a.b = buf(&B, &r, "b", nhv, ds, 0, 1);
        a.A_log = buf(&B, &r, "A_log", nh, 4, 0, 1); a.dt_bias = buf(&B, &r, "dt_bias", nh, 4, 0, 1);
        a.state = buf(&B, &r, "state", elems(c.num_slots, c.HV, c.K, c.V), 4, 1, 1);
        a.slots = slots_buf(&B, &r, c.B, c.num_slots);
        a.o = buf(&B, &r, "o", elems(c.B, c.HV, c.V, 1), ds, 1, 1);
        st = gdn_decode_step(exp, &c, &a);
    } else {   /* gated RMSNorm */
        gdn_rmsnorm_config c = {0};
        c.rows = (int64_t)PICK(&r, Ts) * PICK(&r, Bs);
        c.V = PICK(&r, Ds);
        c.dtype = (gdn_dtype)PICK(&r, dts);
        c.eps = byte(&r) % 5 == 0 ? -1.f : 1e-6f;
        c.gate = (gdn_norm_gate)(byte(&r) % 3);
        const size_t ds = esize(c.dtype), n = elems(c.rows, c.V, 1, 1), nv = c.V > 0 ? (size_t)c.V : 0,
                     nr = c.rows > 0 ? (size_t)c.rows : 0;
        const void *x = buf(&B, &r, "x", n, ds, 0, 1), *z = buf(&B, &r, "z", n, ds, 0, 1);
        const float *w = buf(&B, &r, "w", nv, 4, 0, 1);
        if (op == 11) {
            void *y = buf(&B, &r, "y", n, ds, 1, 1);
            st = gdn_rmsnorm_gated_fwd(exp, &c, x, z, w, y, buf(&B, &r, "rstd", nr, 4, 1, 1));
        } else {
            const float *rstd = buf(&B, &r, "rstd", nr, 4, 0, 1);
            const void *dy = buf(&B, &r, "dy", n, ds, 0, 1);
            void *dx = buf(&B, &r, "dx", n, ds, 1, 1), *dz = buf(&B, &r, "dz", n, ds, 1, 1);
            st = gdn_rmsnorm_gated_bwd(exp, &c, x, z, w, rstd, dy, dx, dz, buf(&B, &r, "dw", nv, 4, 1, 1));
        }
    }
    check(&B, op, st);
    free_bufs(&B);
    *accepted_op = op;
    *status = st;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int op;
    gdn_status st;
    return run_one(data, size, &op, &st);
}

#ifndef GDN_LIBFUZZER

/* ---- the standalone driver ---- */

static uint64_t rng = 1;
static uint64_t next(void) {   /* splitmix64 */
    uint64_t z = (rng += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

enum { MAXIN = 256, MAXCORPUS = 4096 };
static uint8_t *corpus[MAXCORPUS];
static size_t corpus_n[MAXCORPUS];
static int ncorpus;
static long runs, accepted;
static int seen[N_OPS][16];
static const char *write_dir;

static void one(const uint8_t *d, size_t n) {
    int op;
    gdn_status st;
    run_one(d, n, &op, &st);
    runs++;
    if (st == GDN_OK) accepted++;
    if (!seen[op][st & 15]) {
        seen[op][st & 15] = 1;
        if (write_dir) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s-%s", write_dir, op_names[op], gdn_status_string(st));
            FILE *f = fopen(path, "wb");
            if (f) { fwrite(d, 1, n, f); fclose(f); }
        }
    }
}

static void load_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f || ncorpus == MAXCORPUS) { if (f) fclose(f); return; }
    uint8_t *b = xmalloc(MAXIN);
    const size_t n = fread(b, 1, MAXIN, f);
    fclose(f);
    corpus[ncorpus] = b;
    corpus_n[ncorpus++] = n;
}

static void load(const char *path) {
    struct stat s;
    if (stat(path, &s) != 0) { fprintf(stderr, "gdn_fuzz: no such file or directory: %s\n", path); exit(2); }
    if (!S_ISDIR(s.st_mode)) { load_file(path); return; }
    DIR *d = opendir(path);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        load_file(p);
    }
    if (d) closedir(d);
}

int main(int argc, char **argv) {
    double secs = 10;
    long max_runs = -1;
    uint64_t seed = 0;
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc) secs = atof(argv[++i]);
        else if (!strcmp(argv[i], "-s") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "-n") && i + 1 < argc) max_runs = atol(argv[++i]);
        else if (!strcmp(argv[i], "-w") && i + 1 < argc) write_dir = argv[++i];
        else {
            fprintf(stderr, "usage: gdn_fuzz [-t SECONDS] [-s SEED] [-n RUNS] [-w DIR] [FILE|DIR ...]\n");
            return 2;
        }
    }
    verbose = getenv("GDN_FUZZ_VERBOSE") != NULL;
    if (!seed) seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);
    rng = seed;
    printf("gdn_fuzz: seed %llu (-s %llu repeats the random part)\n", (unsigned long long)seed, (unsigned long long)seed);
    fflush(stdout);
    for (; i < argc; i++) load(argv[i]);
    for (int c = 0; c < ncorpus; c++) one(corpus[c], corpus_n[c]);
    const long replayed = runs;
    const double t0 = now_s();
    uint8_t in[MAXIN];
    while ((max_runs < 0 || runs - replayed < max_runs) && now_s() - t0 < secs) {
        size_t n;
        if (ncorpus && next() % 2) {   /* a corpus input with a few bytes changed */
            const int c = (int)(next() % (uint64_t)ncorpus);
            n = corpus_n[c];
            memcpy(in, corpus[c], n);
            const int flips = 1 + (int)(next() % 4);
            for (int f = 0; f < flips && n; f++) in[next() % n] = (uint8_t)next();
            if (next() % 8 == 0 && n < MAXIN) in[n++] = (uint8_t)next();
        } else {
            n = 8 + (size_t)(next() % 120);
            for (size_t k = 0; k < n; k++) in[k] = (uint8_t)next();
        }
        one(in, n);
    }
    int pairs = 0;
    for (int o = 0; o < N_OPS; o++)
        for (int s = 0; s < 16; s++) pairs += seen[o][s];
    printf("gdn_fuzz: %ld executions (%ld corpus inputs replayed), %ld calls accepted, %d (op, status) pairs seen, "
           "%.1f s; no broken promise\n", runs, replayed, accepted, pairs, now_s() - t0);
    printf("gdn_fuzz: of them %ld context-parallel calls, %ld accepted\n", cp_calls, cp_accepted);
    for (int c = 0; c < ncorpus; c++) free(corpus[c]);
    return 0;
}
#endif
