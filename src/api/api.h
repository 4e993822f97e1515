/* The API layer's validation helpers (src/api/): every public entry point
 * checks all of its input with these before a backend runs or an output is
 * written, and fails with a message naming the argument (docs/DESIGN.md §6). */
#ifndef GDN_API_H
#define GDN_API_H
#include "common/common.h"
#ifdef __cplusplus
extern "C" {
#endif

/* Validation helpers of the API layer: fail with a message unless cond. */
#define GDN_CHECK(cond, status, ...) do { if (!(cond)) return gdn_fail(status, __VA_ARGS__); } while (0)
#define GDN_NEED(ptr, what) GDN_CHECK((ptr) != NULL, GDN_ERR_NULL, "%s is NULL but required%s", #ptr, what)
static inline int gdn_valid_dtype(gdn_dtype t) { return t == GDN_F32 || t == GDN_BF16 || t == GDN_F16; }
/* H, HV >= 1, HV a multiple of H, K and V in 1..256 */
gdn_status gdn_check_heads(int H, int HV, int K, int V);

/* Validate an exec (NULL = CPU, all threads) and resolve its thread count
 * (>= 1) and seq_split (may be NULL). Sets the error message on failure. */
gdn_status gdn_check_exec(const gdn_exec *ex, int *threads, int *seq_split);
static inline gdn_backend gdn_exec_backend(const gdn_exec *ex) { return ex ? ex->backend : GDN_BACKEND_CPU; }
#define GDN_CPU_ONLY(ex, what) GDN_CHECK(gdn_exec_backend(ex) == GDN_BACKEND_CPU, GDN_ERR_UNSUPPORTED, \
                                        "%s is not on the CUDA backend yet (CPU only)", what)

/* The CUDA backend's alignment rules (gdn.h, "The CUDA backend"; DESIGN.md
 * §6): GDN_ERR_OPTION unless ptr is a multiple of `bytes` (NULL passes), with
 * a message naming the pointer (its name after any "a->"), its address and
 * why, e.g. "q (0x7f..02) must be 16-byte aligned on the CUDA backend (...)".
 * GDN_ALIGNED returns from the caller on failure; GDN_ELEM is the reason of
 * the rule every pointer has: a misaligned access faults on the device and
 * ends the CUDA context. */
gdn_status gdn_check_align(const void *ptr, size_t bytes, const char *name, const char *why);
#define GDN_ALIGNED(ptr, bytes, why) do { \
        const gdn_status s_al_ = gdn_check_align((const void *)(ptr), (bytes), #ptr, (why)); \
        if (s_al_) return s_al_; \
    } while (0)
#define GDN_ELEM "the kernels access its elements whole"

/* Validate a gated-delta-rule config (and the exec) and resolve it into a plan. */
/* the CUDA kernels' pointer alignment (gdn.h, "The CUDA backend"): the
 * forward's (chunked: gdn_chunk_fwd, else gdn_recurrent_fwd) and the
 * backward's arguments; api/chunk.c, also for the context-parallel calls */
gdn_status gdn_cuda_align_fwd(const gdn_exec *ex, const gdn_plan *p, const gdn_fwd_args *a, int chunked);
gdn_status gdn_cuda_align_bwd(const gdn_exec *ex, const gdn_plan *p, const gdn_bwd_args *a);
/* every check of gdn_chunk_fwd (its workspace at least the chunk forward's);
 * fills the plan (api/chunk.c; api/cp.c's gdn_cp_fwd_finish runs the same) */
gdn_status gdn_chunk_fwd_check(const gdn_exec *ex, const gdn_config *cfg, const gdn_fwd_args *a, gdn_plan *p);
/* every check of gdn_chunk_bwd but the workspace's size; fills the plan
 * (api/chunk.c; api/cp.c's gdn_cp_bwd_finish runs the same) */
gdn_status gdn_chunk_bwd_check(const gdn_exec *ex, const gdn_config *cfg, const gdn_bwd_args *a, gdn_plan *p);
gdn_status gdn_make_plan(const gdn_exec *ex, const gdn_config *cfg, gdn_plan *p);

#ifdef __cplusplus
}
#endif
#endif
