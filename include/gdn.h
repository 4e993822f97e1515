/* gdn — Gated DeltaNet kernels. The whole public C API.
 *
 * Math (one sequence, one value head j; see DESIGN.md):
 *     S   = exp(g_t) * S
 *     u_t = beta_t * (v_t - S^T k_t)
 *     S   = S + k_t u_t^T
 *     o_t = scale * S^T q_t
 *
 * Conventions
 *   - Every call returns a gdn_status; gdn_last_error() says what was wrong.
 *   - Every call validates all of its input before it writes anything: on error
 *     no output byte changes. (On CUDA what only the device holds, the values
 *     of cu_seqlens_dev and of slots, is the caller's promise instead: see
 *     "The CUDA backend" below gdn_exec.)
 *   - The caller owns all memory. Sizes of workspaces and of the state kept
 *     between forward and backward come from the *_size() queries.
 *   - Tensors are token-major and contiguous, like flash-linear-attention:
 *       q, k [B,T,H,K]   v, o [B,T,HV,V]   g/a, beta/b [B,T,HV]
 *       A_log, dt_bias [HV] (f32)   h0, ht [N,HV,K,V] (f32; [N,HV,V,K] v-first)
 *   - With cu_seqlens (B must be 1) the T tokens hold N sequences, sequence n is
 *     tokens cu_seqlens[n] .. cu_seqlens[n+1]-1. Without, N = B.
 *   - The CPU backend takes host pointers; the CUDA backend device pointers,
 *     enqueued on gdn_exec.stream with no allocation and no host sync.
 */
#ifndef GDN_H
#define GDN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GDN_VERSION_MAJOR 0
#define GDN_VERSION_MINOR 1

/* ---- status and errors ------------------------------------------------ */

typedef enum gdn_status {
    GDN_OK = 0,
    GDN_ERR_NULL = 1,        /* a required pointer is NULL                   */
    GDN_ERR_SHAPE = 2,       /* a size is out of range or inconsistent       */
    GDN_ERR_DTYPE = 3,       /* dtype not supported for this tensor          */
    GDN_ERR_SEQLENS = 4,     /* cu_seqlens unsorted, out of range, or B != 1 */
    GDN_ERR_OPTION = 5,      /* flags or options that do not go together, or
                                a pointer misaligned for the CUDA kernels     */
    GDN_ERR_WORKSPACE = 6,   /* workspace or saved buffer too small          */
    GDN_ERR_BACKEND = 7,     /* backend not built in, or a backend failure,
                                or a stream of another device (CUDA)         */
    GDN_ERR_UNSUPPORTED = 8  /* valid request this backend does not do       */
} gdn_status;

/* Name of a status, e.g. "GDN_ERR_SHAPE". */
const char *gdn_status_string(gdn_status s);
/* Message of the last failed call on this thread, e.g.
 * "HV (6) is not a multiple of H (4)"; "" after a successful call. */
const char *gdn_last_error(void);

/* ---- types -------------------------------------------------------------- */

typedef enum gdn_dtype { GDN_F32 = 0, GDN_BF16 = 1, GDN_F16 = 2 } gdn_dtype;
size_t gdn_dtype_size(gdn_dtype t);
const char *gdn_dtype_name(gdn_dtype t);

typedef enum gdn_backend { GDN_BACKEND_CPU = 0, GDN_BACKEND_CUDA = 1 } gdn_backend;
/* 1 if the backend was built into this library (and, for CUDA, a device is seen). */
int gdn_backend_available(gdn_backend b);

/* Where and how a call runs. NULL means: CPU, all threads. */
typedef struct gdn_exec {
    gdn_backend backend;
    void *stream;   /* cudaStream_t for CUDA (NULL = default stream); unused on CPU */
    int threads;    /* CPU worker threads; 0 = OpenMP's default                    */
    int seq_split;  /* chunk path: cut each sequence into at most this many segments
                       that run in parallel (DESIGN.md §8). 0 = automatic, from the
                       shape alone (few sequences x heads, long sequences; on CUDA
                       also the card's SM count); 1 = never. The CUDA forward and
                       backward split bf16 / f16 calls (f32 walks whole sequences).
                       Results are deterministic for a given shape and seq_split,
                       whatever the thread count (on CUDA: and SM count).             */
} gdn_exec;

/* The CUDA backend (DESIGN.md §6).
 *
 * Device. The kernels run on the current device (cudaGetDevice), and every
 * pointer and gdn_exec.stream must belong to it. A stream of another device
 * is refused (GDN_ERR_BACKEND) where the runtime can tell without a sync
 * (cudaStreamGetDevice: a library built with CUDA 12.8 or later), but not
 * for a stream under graph capture (the query would end the capture): a
 * captured launch on a wrong device fails when the graph is launched.
 *
 * Alignment. Every pointer must be aligned to its elements: 4 bytes for f32
 * tensors and int32 slots, 2 for bf16 / f16 tensors, 8 for cu_seqlens_dev.
 * gdn_chunk_fwd with bf16 / f16 (the tensor-core kernels) also needs
 *     q, k       16-byte aligned when K % 8 == 0 (rows by cp.async / the TMA)
 *     v          16-byte aligned when V % 8 == 0 (the same)
 *     o          16-byte aligned when V % 8 == 0 (rows stored 16 bytes at a time)
 *     workspace  16-byte aligned
 * and gdn_chunk_bwd (bf16 / f16) the same of q, k, v and of
 *     dq, dk     16-byte aligned when K % 8 == 0
 *     dout, dv   16-byte aligned when V % 8 == 0
 *     workspace  16-byte aligned (f32 too)
 * (its workspace is sized for kernels that take 16-byte rows). Every other vector access
 * (the layer ops, the decode step's state, the TMA) is chosen at dispatch
 * from the shape and the alignment, with a narrower path for the rest.
 * cudaMalloc gives 256 bytes; a view at an element offset may break a rule.
 * A call that breaks one fails with GDN_ERR_OPTION and a message naming the
 * pointer, e.g. "q (0x7f3a00000002) must be 16-byte aligned on the CUDA
 * backend (K is a multiple of 8: ...)"; nothing is written.
 *
 * Device memory the host cannot read without a sync (calls never sync, so
 * they stay capturable in a CUDA graph) is not checked:
 *   - cu_seqlens_dev must hold exactly the values of cu_seqlens (which the
 *     API checks). The kernels index the tensors and the workspace by the
 *     device values unchecked: values that differ are undefined behaviour,
 *     from wrong rows to reads and writes outside the tensors and the
 *     workspace (a memory fault then ends the CUDA context).
 *   - slots (gdn_conv1d_update, gdn_decode_step): a slot outside
 *     [0, num_slots), -1 or any other, is padding (no state access, output
 *     row 0), where the CPU backend refuses a slot out of -1..num_slots-1
 *     (GDN_ERR_SHAPE). A repeated slot: gdn_conv1d_update applies its rows
 *     in row order (as on the CPU); in gdn_decode_step it breaks the
 *     contract (the CPU refuses it), and on CUDA the rows race on that pool
 *     row: its states (recurrent and conv) and the rows' o are undefined; no
 *     other memory is touched. */

/* ---- the gated delta rule: chunked and recurrent ------------------------ */

enum gdn_flags {
    GDN_QK_L2NORM     = 1u << 0, /* q,k -> q*rsqrt(sum q^2 + 1e-6) in kernel; fwd keeps fp32 rstd  */
    GDN_GATE_FUSED    = 1u << 1, /* gate input is raw a: g = -exp(A_log)*softplus(a + dt_bias)     */
    GDN_BETA_SIGMOID  = 1u << 2, /* beta input is raw b: beta = sigmoid(b)                         */
    GDN_BETA_NEGATIVE = 1u << 3, /* with GDN_BETA_SIGMOID: beta = 2*sigmoid(b) (negative eigenvalues) */
    GDN_STATE_V_FIRST = 1u << 4  /* h0, ht, dht, dh0 are [N,HV,V,K] instead of [N,HV,K,V]          */
};

/* Shape and options of one call. Head dims K, V in 1..256. */
typedef struct gdn_config {
    int64_t B, T;       /* batch rows, tokens per row (T >= 0)                         */
    int H, HV;          /* q/k heads and value heads; HV = G*H                         */
    int K, V;           /* q/k head dim, value head dim                                */
    const int64_t *cu_seqlens;      /* NULL, or host array [num_seqs+1] (B must be 1)   */
    const int64_t *cu_seqlens_dev;  /* CUDA only: the same values in device memory
                                       (not checked: see "The CUDA backend")          */
    int64_t num_seqs;   /* N when cu_seqlens is given                                  */
    gdn_dtype dtype;      /* q, k, v, o and dq, dk, dv                                 */
    gdn_dtype gate_dtype; /* g (or a), beta (or b) and their gradients: F32 or dtype   */
    float scale;        /* 0 = 1/sqrt(K)                                               */
    unsigned flags;     /* gdn_flags                                                   */
} gdn_config;

/* Forward inputs and outputs (chunk and recurrent). */
typedef struct gdn_fwd_args {
    const void *q, *k, *v;   /* required                                               */
    const void *g;           /* log decay g, or raw a with GDN_GATE_FUSED (then required); NULL = no decay */
    const void *beta;        /* beta, or raw b with GDN_BETA_SIGMOID; required          */
    const float *A_log;      /* [HV], required with GDN_GATE_FUSED                      */
    const float *dt_bias;    /* [HV], with GDN_GATE_FUSED; NULL = zeros                 */
    const float *h0;         /* initial state; NULL = zeros                             */
    void *o;                 /* output, required                                        */
    float *ht;               /* final state; NULL = not wanted                          */
    void *saved;             /* gdn_chunk_saved_size() bytes kept for backward; NULL = no backward */
    size_t saved_bytes;
    void *workspace;         /* gdn_chunk_fwd_workspace_size() bytes                    */
    size_t workspace_bytes;
} gdn_fwd_args;

/* Backward: the forward's inputs again, what forward saved, and the output grads. */
typedef struct gdn_bwd_args {
    const void *q, *k, *v, *g, *beta;
    const float *A_log, *dt_bias, *h0;
    const void *saved;       /* as written by gdn_chunk_fwd with the same config         */
    size_t saved_bytes;
    const void *dout;        /* dL/do [B,T,HV,V] dtype, required                         */
    const float *dht;        /* dL/dht; NULL = zeros                                     */
    void *dq, *dk, *dv;      /* dtype, required                                          */
    void *dg;                /* gate_dtype: dg, or da with GDN_GATE_FUSED; required if g  */
    void *dbeta;             /* gate_dtype: dbeta, or db with GDN_BETA_SIGMOID; required  */
    float *dA_log;           /* [HV] f32, required with GDN_GATE_FUSED                   */
    float *ddt_bias;         /* [HV] f32, with GDN_GATE_FUSED; NULL = not wanted          */
    float *dh0;              /* NULL = not wanted                                        */
    void *workspace;         /* gdn_chunk_bwd_workspace_size() bytes                     */
    size_t workspace_bytes;
} gdn_bwd_args;

/* Bytes forward must keep for backward: with GDN_QK_L2NORM the fp32 rstd of q
 * and of k per token and q/k head (2*B*T*H floats; never the normalized q, k),
 * else 0. Everything else backward recomputes from its inputs. */
size_t gdn_chunk_saved_size(const gdn_config *cfg);
size_t gdn_chunk_fwd_workspace_size(const gdn_exec *ex, const gdn_config *cfg);
size_t gdn_chunk_bwd_workspace_size(const gdn_exec *ex, const gdn_config *cfg);

/* Chunked forward (chunk 64, WY/UT transform) and its exact backward. */
gdn_status gdn_chunk_fwd(const gdn_exec *ex, const gdn_config *cfg, const gdn_fwd_args *a);
gdn_status gdn_chunk_bwd(const gdn_exec *ex, const gdn_config *cfg, const gdn_bwd_args *a);

/* Token-by-token forward (decode and short T). Needs no workspace; a->saved is ignored. */
gdn_status gdn_recurrent_fwd(const gdn_exec *ex, const gdn_config *cfg, const gdn_fwd_args *a);

/* ---- context parallel: one token stream over several ranks (DESIGN.md §8) --
 *
 * `world` ranks (GPUs, processes) hold one token stream (B = 1, with or
 * without cu_seqlens) cut into contiguous slices, in rank order. Rank r holds
 * its slice as an ordinary local call: cfg->B = 1, cfg->T its tokens, cfg->cu_seqlens the
 * local sequences, i.e. the pieces of the global sequences that meet the
 * slice, rebased to 0 (as in FLA's context-parallel API). A sequence that
 * crosses a cut is the last local sequence of the rank before it
 * (last_continues = 1) and local sequence 0 of the rank after it
 * (first_continues = 1); a sequence over several ranks is the only local
 * sequence of the ranks in between (both set; their T may be 0).
 *
 * Local tensors keep their gdn_chunk_fwd/bwd meaning. h0 row n is the initial
 * state of local sequence n; with first_continues, row 0 is the incoming
 * state S_in from the earlier ranks (step 3 below). ht row N-1 of a sequence
 * that continues into the next rank is its state after this rank's last
 * token, the state the next rank receives: a sequence's final state is the
 * ht row of the rank where it ends, and its dh0 comes from the rank where it
 * starts.
 *
 * What moves between ranks: one map per rank in each direction,
 *     map = [HV][K*K + K*V] f32 (gdn_cp_map_floats floats): for value head j
 *     P (K x K, row-major) then S (K x V, row-major, k-first whatever
 *     GDN_STATE_V_FIRST says),
 * all-gathered over the group in rank order into maps [world][HV][K*K + K*V]
 * (world * HV * (K*K + K*V) * 4 bytes on every rank); nothing else moves.
 *   forward map:  S_end   = P S_start + S     (the state after this rank's
 *                 last token from the state before its first one)
 *   backward map: dS_start = P^T dS_end + S   (the same for the gradients)
 * A map with nothing to pass on (last_continues = 0 forward, first_continues
 * = 0 backward) is zero; P is non-zero only on a rank whose one sequence
 * comes from the previous rank and goes on to the next (P = the transition of
 * its tokens). Elsewhere the chain restarts: forward S is then the last
 * sequence's state at this rank's end from its own h0 row.
 *
 * Forward, on every rank, in this order:
 *   1. gdn_cp_fwd_map(ex, cfg, cp, &fa, map)        this rank's forward map
 *   2. all-gather map -> maps                        (the caller: NCCL, MPI, gloo)
 *   3. gdn_cp_fwd_scan(ex, cfg, cp, maps, S_in)      S_in [HV,K,V] ([HV,V,K] v-first):
 *                                                    the incoming state; it may be
 *                                                    written straight into h0 row 0
 *   4. with first_continues, h0 row 0 = S_in (an h0 of zeros elsewhere when the
 *      call had none); gdn_chunk_fwd(ex, cfg, &fa): o, ht, saved as usual.
 * Backward:
 *   5. gdn_cp_bwd_map(ex, cfg, cp, &ba, map, bmap)   this rank's backward map (map:
 *                                                    its own forward map of step 1,
 *                                                    or NULL to recompute P); needs
 *                                                    no state, only q, k, v, g, beta,
 *                                                    dout and dht row 0 (the caller's
 *                                                    dht: before step 8 adds to it)
 *   6. all-gather bmap -> bmaps
 *   7. gdn_cp_bwd_scan(ex, cfg, cp, bmaps, dS_out)   dS_out [HV,K,V] ([HV,V,K]): the
 *                                                    gradient w.r.t. the state after
 *                                                    this rank's last token from the
 *                                                    later ranks
 *   8. with last_continues, dht row N-1 += dS_out (dht = zeros + dS_out when the
 *      call had none); gdn_chunk_bwd(ex, cfg, &ba) with the h0 of step 4: dq, dk,
 *      dv, dg / da, dbeta / db as usual; dA_log and ddt_bias are this rank's part
 *      of the sum (add them over the group); with first_continues, dh0 row 0 is
 *      the gradient w.r.t. S_in, which the earlier ranks already got through
 *      step 6: it is no input's gradient (drop it).
 *
 * Every option of gdn_chunk_fwd/bwd works (dtypes, GVA, gate and beta flags,
 * in-kernel L2 norm, both state layouts). Both backends run these calls. On
 * the CPU, results do not depend on the thread count (for a given
 * gdn_exec.seq_split, which cuts a long local span as gdn_chunk_fwd does).
 * On CUDA every pointer (the map, the gathered maps, S_in, dS_out, the
 * workspace: 16-byte aligned) is device memory, the config carries
 * cu_seqlens_dev beside cu_seqlens as for the chunk calls, and the calls
 * queue on the exec's stream with no allocation and no host sync (capture-
 * safe); the map calls cost about the state pass of the edge sequence's
 * tokens, cut into segments that run at once. */
typedef struct gdn_cp_config {
    int rank;             /* this rank's place in the token order, 0..world-1            */
    int world;            /* ranks in the group, >= 1                                    */
    int first_continues;  /* 1: local sequence 0 began on an earlier rank (rank > 0)     */
    int last_continues;   /* 1: the last local sequence goes on to the next rank
                             (rank < world-1)                                            */
} gdn_cp_config;

/* Floats of one rank's map: HV * (K*K + K*V) (0 and the last error set on a bad cfg). */
size_t gdn_cp_map_floats(const gdn_config *cfg);
size_t gdn_cp_fwd_map_workspace_size(const gdn_exec *ex, const gdn_config *cfg, const gdn_cp_config *cp);
size_t gdn_cp_bwd_map_workspace_size(const gdn_exec *ex, const gdn_config *cfg, const gdn_cp_config *cp);

/* Step 1. Reads q, k, v, g, beta, A_log, dt_bias, h0 (row N-1 only, and not
 * when that row is the incoming state), workspace; not o, ht, saved. map:
 * gdn_cp_map_floats() floats, written whole. Costs about a forward of the last
 * local sequence's tokens (no output rows): nothing when last_continues = 0. */
gdn_status gdn_cp_fwd_map(const gdn_exec *ex, const gdn_config *cfg, const gdn_cp_config *cp,
                          const gdn_fwd_args *a, float *map);
/* Step 5. Reads q, k, v, g, beta, A_log, dt_bias, saved (what gdn_chunk_fwd
 * saved, or NULL: the rstd is recomputed), dout, dht (row 0 only; NULL =
 * zeros), workspace; not h0 nor the gradient outputs. fwd_map: this rank's own
 * map of step 1 (its P is reused), or NULL. bmap: gdn_cp_map_floats() floats,
 * written whole. Costs about the state part of a backward of local sequence
 * 0's tokens (plus a forward of them when P is recomputed): nothing when
 * first_continues = 0. */
gdn_status gdn_cp_bwd_map(const gdn_exec *ex, const gdn_config *cfg, const gdn_cp_config *cp,
                          const gdn_bwd_args *a, const float *fwd_map, float *bmap);
/* Steps 3 and 7: the scans over the gathered maps [world][HV][K*K + K*V] (in
 * rank order; not read when world is 1), in fp32, with no workspace.
 *   S_in   = fold over ranks i = 0 .. rank-1 of S <- P_i S + S_i, from S = 0
 *   dS_out = fold over ranks i = world-1 .. rank+1 of D <- P_i^T D + S_i, from D = 0
 * written as [HV,K,V] ([HV,V,K] with GDN_STATE_V_FIRST), HV*K*V floats. */
gdn_status gdn_cp_fwd_scan(const gdn_exec *ex, const gdn_config *cfg, const gdn_cp_config *cp,
                           const float *maps, float *S_in);
gdn_status gdn_cp_bwd_scan(const gdn_exec *ex, const gdn_config *cfg, const gdn_cp_config *cp,
                           const float *maps, float *dS_out);

/* Steps 1 and 4 with the work they share done once (the same results as
 * gdn_cp_fwd_map, then gdn_chunk_fwd):
 *   1'. gdn_cp_fwd_begin(ex, cfg, cp, &fa, map)   as gdn_cp_fwd_map, with every
 *       argument of gdn_chunk_fwd but h0 row 0 where first_continues (not read
 *       yet), and a workspace of gdn_cp_fwd_workspace_size() bytes that keeps
 *       what step 4' reuses (saved, where given, is written here)
 *   2, 3 as above (S_in into h0 row 0)
 *   4'. gdn_cp_fwd_finish(ex, cfg, cp, &fa)       the forward of step 4, same
 *       arguments and workspace, untouched since 1'.
 * On CUDA, where the local forward cuts its sequences into segments (bf16 /
 * f16, long sequences with few heads), its prep and the segments' maps are
 * the forward map's work, so 1' + 4' cost about the forward alone. */
size_t gdn_cp_fwd_workspace_size(const gdn_exec *ex, const gdn_config *cfg, const gdn_cp_config *cp);
gdn_status gdn_cp_fwd_begin(const gdn_exec *ex, const gdn_config *cfg, const gdn_cp_config *cp,
                            const gdn_fwd_args *a, float *map);
gdn_status gdn_cp_fwd_finish(const gdn_exec *ex, const gdn_config *cfg, const gdn_cp_config *cp,
                             const gdn_fwd_args *a);

/* Steps 5 and 8 with the work they share done once (the same results as
 * gdn_cp_bwd_map, then gdn_chunk_bwd with dS_out added to dht row N-1):
 *   5'. gdn_cp_bwd_begin(ex, cfg, cp, &ba, map, bmap)   as gdn_cp_bwd_map, but
 *       saved is required where GDN_QK_L2NORM is set, and the workspace
 *       (gdn_cp_bwd_workspace_size() bytes) keeps what step 8' reuses
 *   6, 7 as above
 *   8'. gdn_cp_bwd_finish(ex, cfg, cp, &ba, dS_out)      the backward of step 8
 *       with every argument of gdn_chunk_bwd (h0 as in step 4, dht as in step
 *       5' before any change, the outputs) and the same workspace, untouched
 *       since 5'; dS_out: step 7's result (read where last_continues = 1).
 * On CUDA, where the local backward cuts its sequences into segments (long
 * sequences with few heads, bf16 / f16), its first reverse pass is the
 * backward map's work, so 5' + 8' cost about the backward alone; elsewhere
 * (and on the CPU) they are the map and the backward. */
size_t gdn_cp_bwd_workspace_size(const gdn_exec *ex, const gdn_config *cfg, const gdn_cp_config *cp);
gdn_status gdn_cp_bwd_begin(const gdn_exec *ex, const gdn_config *cfg, const gdn_cp_config *cp,
                            const gdn_bwd_args *a, const float *fwd_map, float *bmap);
gdn_status gdn_cp_bwd_finish(const gdn_exec *ex, const gdn_config *cfg, const gdn_cp_config *cp,
                             const gdn_bwd_args *a, const float *dS_out);

/* ---- standalone pieces (for the recurrent path) ------------------------- */

/* g = -exp(A_log[j]) * softplus(a + dt_bias[j]) over a [rows, HV]; g is f32.
 * dt_bias may be NULL (zeros). */
gdn_status gdn_gate_fwd(const gdn_exec *ex, int64_t rows, int HV, gdn_dtype a_dtype,
                        const void *a, const float *A_log, const float *dt_bias, float *g);
/* da (a_dtype), dA_log and ddt_bias (f32 [HV], summed over rows in a fixed order).
 * ddt_bias may be NULL. */
gdn_status gdn_gate_bwd(const gdn_exec *ex, int64_t rows, int HV, gdn_dtype a_dtype,
                        const void *a, const float *A_log, const float *dt_bias,
                        const float *dg, void *da, float *dA_log, float *ddt_bias);

/* y = x * rsqrt(sum(x^2) + 1e-6) per row of x [rows, dim]; rstd [rows] f32 (may be NULL). */
gdn_status gdn_l2norm_fwd(const gdn_exec *ex, int64_t rows, int dim, gdn_dtype dtype,
                          const void *x, void *y, float *rstd);
/* dx from x, the forward's rstd and dy. */
gdn_status gdn_l2norm_bwd(const gdn_exec *ex, int64_t rows, int dim, gdn_dtype dtype,
                          const void *x, const float *rstd, const void *dy, void *dx);

/* ---- the GDN layer pieces ---------------------------------------------- */

/* Causal depthwise conv1d over x [B,T,D] (token-major, no transpose):
 *   y[t,d] = act(bias[d] + sum_{w<W} weight[d,w] * x[t-W+1+w, d])
 * where x before a sequence's first token comes from its initial state.
 * States are [N,D,W] f32 holding the last W raw inputs, newest last (the
 * oldest is not read by the convolution; it keeps the layout of the
 * single-token update). W in 1..8 (1..4 fast). */
typedef struct gdn_conv1d_config {
    int64_t B, T;
    int D, W;
    const int64_t *cu_seqlens;  /* NULL, or host [num_seqs+1] (B must be 1)   */
    const int64_t *cu_seqlens_dev; /* CUDA only: the same values in device memory
                                      (not checked: see "The CUDA backend")       */
    int64_t num_seqs;
    gdn_dtype dtype;            /* x, y, dx, dy                                */
    int silu;                   /* 1: act = SiLU; 0: none                       */
} gdn_conv1d_config;

typedef struct gdn_conv1d_args {
    const void *x;              /* [B,T,D], required                           */
    const float *weight;        /* [D,W], required                              */
    const float *bias;          /* [D] or NULL                                  */
    const float *h0;            /* [N,D,W] initial state or NULL (zeros)        */
    void *y;                    /* [B,T,D], required                            */
    float *ht;                  /* [N,D,W] final state or NULL                  */
} gdn_conv1d_args;

typedef struct gdn_conv1d_bwd_args {
    const void *x;
    const float *weight, *bias, *h0;   /* as in forward                        */
    const void *dy;             /* [B,T,D], required                           */
    const float *dht;           /* [N,D,W] or NULL                              */
    void *dx;                   /* [B,T,D], required                            */
    float *dweight;             /* [D,W] f32, required                          */
    float *dbias;               /* [D] f32, or NULL                             */
    float *dh0;                 /* [N,D,W] f32, or NULL                         */
} gdn_conv1d_bwd_args;

gdn_status gdn_conv1d_fwd(const gdn_exec *ex, const gdn_conv1d_config *cfg, const gdn_conv1d_args *a);
gdn_status gdn_conv1d_bwd(const gdn_exec *ex, const gdn_conv1d_config *cfg, const gdn_conv1d_bwd_args *a);
/* One new token per row b of x [B,D]: state[slot] shifts left by one in place,
 * x enters as newest, y [B,D] = act(bias + sum_w weight[:,w] * state[:,w]).
 * state is [num_slots,D,W]; slots [B] (int32) picks row b's state, -1 = padding
 * (no read, no write, y row = 0); slots NULL means state row b. A slot may
 * repeat: its rows apply in row order, like successive tokens. T and
 * cu_seqlens of cfg are ignored; cfg->B is the number of rows. On CUDA the
 * slots are device memory and are not checked: a slot outside
 * [0, num_slots) is treated as padding. */
gdn_status gdn_conv1d_update(const gdn_exec *ex, const gdn_conv1d_config *cfg, const void *x,
                             const float *weight, const float *bias, float *state,
                             int64_t num_slots, const int32_t *slots, void *y);

/* Fused decode step: one new token for each of B rows, in one pass over the
 * state: split the conv output mixed_qkv [B, 2*H*K + HV*V] into q, k, v;
 * q/k L2 norm (GDN_QK_L2NORM); value head j reads q/k head j/G;
 * g = -exp(A_log)*softplus(a + dt_bias), beta = sigmoid(b) (2*sigmoid with
 * GDN_BETA_NEGATIVE); the recurrence on the state in place; o [B,HV,V].
 * With conv_W > 0 the call starts from the raw projection proj [B, D]
 * instead (D = 2*H*K + HV*V): conv1d update of conv_state + SiLU first, so
 * one call goes from projections to o. */
typedef struct gdn_decode_config {
    int B;                  /* rows, one token each                              */
    int H, HV, K, V;
    gdn_dtype dtype;        /* mixed_qkv or proj, a, b, o                         */
    float scale;            /* 0 = 1/sqrt(K)                                      */
    unsigned flags;         /* GDN_QK_L2NORM, GDN_BETA_NEGATIVE, GDN_STATE_V_FIRST */
    int64_t num_slots;      /* rows of the state pools (>= B when slots is NULL)  */
    int conv_W;             /* 0: mixed_qkv given; 1..8: conv update from proj   */
} gdn_decode_config;

typedef struct gdn_decode_args {
    const void *mixed_qkv;     /* [B, D] q, k, v concatenated (conv_W == 0)       */
    const void *proj;          /* [B, D] raw projection (conv_W > 0)              */
    float *conv_state;         /* [num_slots, D, conv_W] in place (conv_W > 0)    */
    const float *conv_weight;  /* [D, conv_W] (conv_W > 0)                        */
    const float *conv_bias;    /* [D] or NULL                                     */
    const void *a, *b;         /* [B, HV] raw gate and beta inputs                */
    const float *A_log;        /* [HV]                                            */
    const float *dt_bias;      /* [HV] or NULL                                    */
    float *state;              /* [num_slots, HV, K, V] ([.., V, K] v-first) in place */
    const int32_t *slots;      /* [B] pool row of each row, each at most once; -1 =
                                  padding (no read, no write, o row 0); NULL = row b
                                  uses pool row b. CPU: a slot out of -1..num_slots-1
                                  or repeated is refused (GDN_ERR_SHAPE). CUDA (device
                                  memory, unchecked): out of range = padding, a repeat
                                  races (see "The CUDA backend") */
    void *o;                   /* [B, HV, V]                                      */
} gdn_decode_args;

gdn_status gdn_decode_step(const gdn_exec *ex, const gdn_decode_config *cfg, const gdn_decode_args *a);

/* Gated RMSNorm, per row of V (rows = B*T*HV for the GDN output):
 *   y = x * rsqrt(mean(x^2) + eps) * w * gate(z),  gate(z) = z*sigmoid(z)
 *   (GDN_NORM_GATE_SILU) or sigmoid(z) (GDN_NORM_GATE_SIGMOID). */
typedef enum gdn_norm_gate { GDN_NORM_GATE_SILU = 0, GDN_NORM_GATE_SIGMOID = 1 } gdn_norm_gate;
typedef struct gdn_rmsnorm_config {
    int64_t rows;
    int V;
    gdn_dtype dtype;            /* x, z, y, dx, dz, dy                          */
    float eps;                  /* e.g. 1e-6                                    */
    gdn_norm_gate gate;
} gdn_rmsnorm_config;
/* rstd [rows] f32 may be NULL; backward recomputes it when given NULL. */
gdn_status gdn_rmsnorm_gated_fwd(const gdn_exec *ex, const gdn_rmsnorm_config *cfg, const void *x,
                                 const void *z, const float *w, void *y, float *rstd);
/* dx, dz (dtype) and dw [V] f32, reduced over rows in a fixed order. */
gdn_status gdn_rmsnorm_gated_bwd(const gdn_exec *ex, const gdn_rmsnorm_config *cfg, const void *x,
                                 const void *z, const float *w, const float *rstd, const void *dy,
                                 void *dx, void *dz, float *dw);

#ifdef __cplusplus
}
#endif
#endif /* GDN_H */
