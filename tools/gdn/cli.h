/* The gdn command's private header: the op list, the options, where the
 * tensors live (backend), the problem's tensors (inputs, outputs, one call),
 * the references and results, and the functions the files of tools/gdn/ share.
 */
#ifndef GDN_TOOLS_CLI_H
#define GDN_TOOLS_CLI_H

#include <stddef.h>
#include <stdint.h>
#include "gdn.h"
#include "flops.h"

#define SLICE_T 256            /* tokens of the checked slice (per sequence)       */

/* the GDN layer pieces */
#define DECODE_B 32            /* default rows of the decode step                  */
#define DECODE_CHECK_ROWS 8    /* rows of the decode step checked on the slice     */
#define CONV_W 4               /* conv1d width, here and in decode_step+conv       */
#define NORM_EPS 1e-6f         /* gated RMSNorm eps                                */

/* ---- the ops (names in ops.c) ------------------------------------------------ */

enum { OP_CHUNK_FWD, OP_CHUNK_FWDBWD, OP_RECURRENT_FWD, OP_GATE_FWD, OP_L2NORM_FWD,
       OP_DECODE, OP_DECODE_CONV, OP_CONV_FWD, OP_CONV_BWD, OP_NORM_FWD, OP_NORM_BWD, N_OPS };
extern const char *op_name[N_OPS];
static inline int op_is_layer(int op) { return op >= OP_DECODE; }
static inline int op_has_grads(int op) { return op == OP_CHUNK_FWDBWD || op == OP_CONV_BWD || op == OP_NORM_BWD; }
/* conv1d and the norm have no FLOP model: GB/s only */
static inline int op_has_flops(int op) { return !(op >= OP_CONV_FWD && op <= OP_NORM_BWD); }
/* the streaming ops, whose rate on the CPU stands beside a copy's (%copy) */
static inline int op_vs_copy(int op) { return op == OP_GATE_FWD || op == OP_L2NORM_FWD || (op >= OP_CONV_FWD && op <= OP_NORM_BWD); }

/* ---- options (args.c) -------------------------------------------------------- */

typedef struct opts {
    int64_t B, T;
    int H, HV, K, V;
    gdn_dtype dtype, gate_dtype;
    int gate_dtype_set;
    int threads, seq_split;
    unsigned flags;
    int varlen;                 /* number of ragged sequences, 0 = none */
    int reps, warmup;
    int reps_set, T_set, B_set;
    gdn_backend backend;
    int backend_set;
    int json, quick;
    int hash;                   /* print a hash of each full output of the chunk ops */
    int no_check;               /* no float64 reference, no run on the slice: timings (and --hash) alone */
    uint64_t seed;
    int decode_B;               /* rows of the decode step */
    unsigned ops;               /* bit op: run op */
} opts;

/* returns 0, 2 (bad flags) or -1 (--help printed) */
int parse_args(int argc, char **argv, opts *o);

/* ---- backends: where the tensors live (ops.c) -------------------------------- */

typedef struct backend {
    const char *name;
    gdn_backend id;
    void *(*alloc)(size_t);
    void (*release)(void *);
    void (*upload)(void *dev, const void *host, size_t n);
    void (*download)(void *host, const void *dev, size_t n);
    void (*sync)(void);
} backend;

extern const backend cpu_backend;
#ifdef GDN_CLI_CUDA
extern const backend cuda_backend;
#endif
extern const backend *be;   /* the one the run uses (main sets it) */

/* a device copy of n bytes of host memory (NULL for NULL) */
void *dev_copy(const void *host, size_t n);
/* a device buffer of n elements of dtype t filled with NaN (unwritten output fails) */
void *dev_nan(gdn_dtype t, size_t n);

/* ---- the problem ------------------------------------------------------------ */

typedef struct sizes { int64_t rows; size_t nqk, nv, ng, nst; } sizes;


/* the inputs (device or host pointers, one set for the full call; the slice
 * reads a prefix of each) */
typedef struct inputs {
    void *q, *k, *v, *g, *beta, *dout;
    float *A_log, *dt_bias, *h0, *dht;
} inputs;

/* the outputs of one call, all ops */
typedef struct outputs {
    void *o, *saved, *ws_fwd, *ws_bwd;
    float *ht;
    size_t saved_bytes, ws_fwd_bytes, ws_bwd_bytes;
    void *dq, *dk, *dv, *dg, *dbeta;
    float *dA_log, *ddt_bias, *dh0;
    float *gate_g;
    void *l2_y;
    float *l2_rstd;
    /* the GDN layer pieces */
    void *dec_o, *dec2_o;                      /* [dB,HV,V] decode_step, decode_step+conv */
    void *cv_y, *cv_dx;                        /* [B,T,D] */
    float *cv_ht, *cv_dw, *cv_db, *cv_dh0;     /* [N,D,W], [D,W], [D], [N,D,W] */
    void *nm_y, *nm_dx, *nm_dz;                /* [rows,V] */
    float *nm_rstd, *nm_dw;                    /* [rows], [V] */
} outputs;

/* the inputs of the GDN layer pieces (device or host pointers, one set for
 * the full call; the slice reads a prefix of each) */
typedef struct layer_in {
    void *mqkv, *da, *db;        /* [dB,D] mixed_qkv (the proj of decode_step+conv), [dB,HV] raw a, b */
    float *A_log, *dt_bias;      /* [HV] */
    float *pool, *cpool;         /* [slots,HV,K,V] state pool, [slots,D,W] conv state pool (in place) */
    int32_t *slots;              /* [dB] */
    void *x, *dy;                /* [B,T,D] conv1d input and output gradient */
    float *cw, *cb, *h0, *dht;   /* [D,W], [D], [N,D,W], [N,D,W] (cw, cb also for decode_step+conv) */
    void *nx, *nz, *ndy;         /* [rows,V] norm input, gate, output gradient */
    float *nw;                   /* [V] */
} layer_in;

typedef struct call {
    gdn_exec ex;
    gdn_config cfg;
    sizes sz;
    const inputs *in;
    outputs out;
    /* the GDN layer pieces */
    gdn_decode_config dec;       /* conv_W 0; decode_step+conv sets it */
    gdn_conv1d_config conv;
    gdn_rmsnorm_config norm;
    const layer_in *lin;
} call;

extern const layer_in *lay_host;   /* host copy: the initial state pools (main sets it) */

/* ---- dtypes, random numbers, host memory, the tensors (inputs.c) -------------- */

/* store f rounded to dtype t as element i of p; returns the stored value */
double elem_store(gdn_dtype t, void *p, size_t i, float f);
/* element i of p, of dtype t, as a double */
double elem_get(gdn_dtype t, const void *p, size_t i);
/* start the random generator from --seed */
void rng_seed(uint64_t seed);
void *xmalloc(size_t n);       /* malloc or exit(1) */
double *dalloc(size_t n);      /* n doubles */

sizes sizes_of(const gdn_config *c);
void outputs_alloc(call *c);
void layer_outputs_alloc(call *c);
void outputs_free(outputs *o);
void inputs_random(const gdn_config *c, int bwd, inputs *h);
void inputs_upload(const gdn_config *c, const inputs *h, inputs *d);
void inputs_free(inputs *x, void (*release)(void *));
void layer_inputs_random(const call *c, unsigned ops, layer_in *h);
void layer_inputs_upload(const call *c, const layer_in *h, layer_in *d);
void layer_inputs_free(layer_in *x, void (*release)(void *));
/* N ragged lengths summing to T (cu_seqlens cu[0..n]) */
void ragged_seqlens(int64_t T, int n, int64_t *cu);

/* ---- running and timing the ops (ops.c) ----------------------------------------- */

/* one run of an op, finished (synchronised) when it returns */
gdn_status run_op(int op, call *c);
/* before the checked run and before the timed runs */
gdn_status prepare_op(int op, call *c);
/* median of reps timed runs after warmup runs */
gdn_status time_op(int op, call *c, int warmup, int reps, double *ms);
/* the op's rate as a fraction of a plain copy's on the same threads: pairs
 * (the op, copy_gbps's copy) run in alternation, the median of the pairs'
 * ratios (CPU; after time_op) */
gdn_status time_op_vs_copy(int op, call *c, int pairs, int threads, double *frac);
double now_ms(void);
double op_flops(int op, const call *c);
double op_bytes(int op, const call *c);

/* ---- the float64 references on the slice (check.c, lref.c) --------------------- */

/* the gated delta rule ops (check.c) */
typedef struct refs {
    double *o, *ht, *dq, *dk, *dv, *dg, *db, *dA, *ddt, *dh0, *gate_g, *l2_y;
    double *dA_terms2, *ddt_terms2;   /* squared norms of the per-token terms of dA_log, ddt_bias */
} refs;

/* the GDN layer pieces (lref.c): the decode step on its first rows, conv1d and
 * the norm on the slice's tokens */
typedef struct lrefs {
    double *dec_o[2], *dec_st[2];   /* [0] decode_step, [1] decode_step+conv: o [Bs,HV,V], new state rows [Bs,HV*K*V] */
    double *dec_cst;                /* decode_step+conv: new conv state rows [Bs,D*W] */
    double *cv_y, *cv_ht, *cv_dx, *cv_dw, *cv_db, *cv_dh0;
    double *nm_y, *nm_rstd, *nm_dx, *nm_dz, *nm_dw;
} lrefs;

void refs_compute(const gdn_config *c, int bwd, const inputs *host, refs *r);
void refs_free(refs *r);
void lrefs_compute(const call *cs, const layer_in *h, unsigned ops, lrefs *r);
void lrefs_free(lrefs *r);
/* run op once on the slice and return its error against the reference
 * (-1 when the call failed; status in *st) */
double check_op(int op, call *c, const refs *r, const lrefs *lr, gdn_status *st, const char **what);

/* ---- output (report.c) ---------------------------------------------------------- */

typedef struct result {
    int op;
    char shape[96];
    double ms, gflops, gbps, err, bound;
    double of_copy;             /* the rate against a copy's, measured in alternation (NAN: not measured) */
    const char *worst;          /* which output the error is of */
    gdn_status status;
    char message[512];
    int ok;
} result;

/* GB/s of a plain memcpy on the threads: the ceiling beside the memory-bound ops */
double copy_gbps(int threads);
/* a plain memcpy split evenly over the threads */
void copy_on_threads(char *dst, const char *src, size_t n, int threads);
void print_json(const opts *o, const gdn_config *full, const gdn_config *slice, const call *lf,
                const call *ls, int threads, double copy, const result *res, int nres, int all_ok);
void print_table(const opts *o, const gdn_config *full, const gdn_config *slice, const call *lf,
                 const call *ls, int threads, double copy, const result *res, int nres, int all_ok);

#endif
