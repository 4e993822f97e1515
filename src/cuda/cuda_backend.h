/* The CUDA backend as the API layer sees it: C entry points, device
 * pointers, the caller's stream; inputs already validated. */
#ifndef GDN_CUDA_BACKEND_H
#define GDN_CUDA_BACKEND_H
#include "common/common.h"
#ifdef __cplusplus
extern "C" {
#endif
int gdn_cuda_device_count(void);
/* GDN_ERR_BACKEND (message set) when the runtime says stream (a
 * cudaStream_t; NULL = the default stream) belongs to a device other than
 * the current one, where the kernels would run; GDN_OK otherwise, also where
 * the runtime cannot tell (no cudaStreamGetDevice before CUDA 12.8, or the
 * query fails: the launch then reports), and not for a stream under capture
 * (the query would end the capture). Host only, no sync: capture-safe. */
gdn_status gdn_cuda_check_stream(void *stream);
/* returns GDN_OK or GDN_ERR_BACKEND (launch failure, message set) */
gdn_status gdn_cuda_decode_step(const gdn_decode_config *cfg, const gdn_decode_args *a, void *stream);
gdn_status gdn_cuda_recurrent_fwd(const gdn_plan *p, const gdn_fwd_args *a, void *stream);
/* chunk forward; ws: gdn_cuda_chunk_fwd_ws(p) bytes of device memory */
size_t gdn_cuda_chunk_fwd_ws(const gdn_plan *p);
gdn_status gdn_cuda_chunk_fwd(const gdn_plan *p, const gdn_fwd_args *a, void *ws, void *stream);
/* chunk backward; ws: gdn_cuda_chunk_bwd_ws(p) bytes of device memory */
size_t gdn_cuda_chunk_bwd_ws(const gdn_plan *p);
gdn_status gdn_cuda_chunk_bwd(const gdn_plan *p, const gdn_bwd_args *a, void *ws, void *stream);
/* context parallel (cp.cu; gdn.h has the contract): the maps of a rank and
 * the scans over the gathered maps; the ws sizes in bytes of device memory */
size_t gdn_cuda_cp_fwd_map_ws(const gdn_plan *p, const gdn_cp_config *cp);
size_t gdn_cuda_cp_bwd_map_ws(const gdn_plan *p, const gdn_cp_config *cp);
gdn_status gdn_cuda_cp_fwd_map(const gdn_plan *p, const gdn_cp_config *cp, const gdn_fwd_args *a, float *map, void *stream);
gdn_status gdn_cuda_cp_bwd_map(const gdn_plan *p, const gdn_cp_config *cp, const gdn_bwd_args *a, const float *fwd_map,
                               float *bmap, void *stream);
gdn_status gdn_cuda_cp_scan(const gdn_plan *p, const gdn_cp_config *cp, const float *maps, float *out, int backward,
                            void *stream);
/* steps 1 and 4, 5 and 8 sharing their work (gdn_cp_fwd_begin / _finish, gdn_cp_bwd_begin / _finish) */
size_t gdn_cuda_cp_fwd_ws(const gdn_plan *p, const gdn_cp_config *cp);
gdn_status gdn_cuda_cp_fwd_begin(const gdn_plan *p, const gdn_cp_config *cp, const gdn_fwd_args *a, float *map, void *stream);
gdn_status gdn_cuda_cp_fwd_finish(const gdn_plan *p, const gdn_cp_config *cp, const gdn_fwd_args *a, void *stream);
size_t gdn_cuda_cp_bwd_ws(const gdn_plan *p, const gdn_cp_config *cp);
gdn_status gdn_cuda_cp_bwd_begin(const gdn_plan *p, const gdn_cp_config *cp, const gdn_bwd_args *a, const float *fwd_map,
                                 float *bmap, void *stream);
gdn_status gdn_cuda_cp_bwd_finish(const gdn_plan *p, const gdn_cp_config *cp, const gdn_bwd_args *a, const float *dS_out,
                                  void *stream);
/* the pieces cp.cu runs on one sequence (a plan with N = 1, no cu_seqlens):
 * the chunk forward's pass 1 with sc chunks per segment (each segment's map
 * from a zero state, P and S_loc, at *seg_p, *seg_s in ws: [segment][HV]
 * x K*K and K*V, k-first); the recurrent kernel in map mode (f32); the
 * chunk backward's prep and reverse sweep (dh0 only, rstd given where
 * GDN_QK_L2NORM; cu_dev, or NULL: the plan's sequences) */
size_t gdn_cuda_chunk_seg_maps_ws(const gdn_plan *p, int sc);
gdn_status gdn_cuda_chunk_seg_maps(const gdn_plan *p, const gdn_fwd_args *a, int sc, void *ws, float **seg_p, float **seg_s,
                                   const int *skip, int skip_val, void *stream);
/* the segment slots of a split of sc chunks a segment (the maps' count in
 * seg_p, seg_s), and the tag the forward's maps of that split carry in
 * saved (gdn_saved_at: tag[1]; seg_p at maps, seg_s after slots x HV x K x K);
 * skip and skip_val above: the backward's run skipped where they are there */
int64_t gdn_cuda_chunk_seg_slots(const gdn_plan *p, int sc);
int gdn_cuda_maps_tag(int sc);
/* the split chunk forward (0: no split) in two parts over its workspace
 * (gdn_cuda_chunk_fwd_ws): back = 0, the prep and pass 1 (every segment's
 * map at *seg_p, *seg_s when not NULL, the chunk forward's segment slots);
 * back = 1, the scan from h0 and pass 3 (o, ht) */
int gdn_cuda_chunk_fwd_split(const gdn_plan *p);
gdn_status gdn_cuda_chunk_fwd_part(const gdn_plan *p, const gdn_fwd_args *a, void *ws, int back, float **seg_p, float **seg_s,
                                   void *stream);
/* the chunk backward's states from the chunk forward's state kernels (bf16 /
 * f16; the transposed form where K = 128, V is whole 128-column blocks and
 * the TMA takes the tensors, else the general one): the state entering each
 * chunk into states (when not NULL; [slot][HV][K][V] fp32 k-first, slot =
 * bos / 64 + n + i) and the final state into a->ht (when not NULL), no o,
 * over a workspace of gdn_cuda_chunk_states_ws(p, wn) bytes. wn = 0: whole
 * sequences of the plan from a->h0; else a window: chunks [w0, w0 + wn) of
 * each sequence from a->h0 (the states entering chunk w0, in h0's layout),
 * states at [n * wn + i - w0][HV][K][V], ht the states after the window
 * (written only where the window holds a chunk). skip (or NULL): where
 * *skip == skip_val nothing is walked (the forward's checkpoints are there);
 * wskip (or NULL): where *wskip == wskip_val the prep runs and the walk does
 * nothing (the forward kept the window's tiles in saved: gdn_cuda_chunk_bwd_kept).
 * st16: the states as bf16 tiles, 32 KB apart, where the transposed kernel
 * takes V = 128 (the fused backward pass's layout: chunk_fwd.cuh
 * ChunkArgs::st16); 2: only so (else 0, nothing queued). brec (or
 * NULL; bf16, K = 128): the prep writes the backward's records there too
 * (chunk_bwd.cuh's; Tm and P as the fused pass's bf16 tiles where brec16,
 * else fp32), at the states' places. stage 0: the prep and the walk; 1: the
 * prep alone; 2: the walk alone, after a stage 1 over the same ws. 2:
 * queued, the states as bf16; 1: queued; 0: not this shape (nothing queued);
 * -1: a launch failed */
size_t gdn_cuda_chunk_states_ws(const gdn_plan *p, int64_t wn);
int gdn_cuda_chunk_states(const gdn_plan *p, const gdn_fwd_args *a, int64_t w0, int64_t wn, void *ws, float *states,
                          const int *skip, int skip_val, const int *wskip, int wskip_val, int st16, float *brec, int brec16, int stage,
                          void *stream);
/* the chunk backward's windows whose forward states start from checkpoints
 * (chunk_bwd.cu window_chunks): their count (0: none), *wn chunks each, and
 * the tag the forward's checkpoints of them carry in saved (gdn_saved_at) */
int gdn_cuda_chunk_bwd_windows(const gdn_plan *p, int64_t *wn, int *tag);
/* the first of those windows whose forward states the forward keeps in saved
 * as the fused pass's bf16 tiles (sl->keep: gdn_saved_keep's nkeep chunks a
 * sequence and value head): the last windows that fit there, and the tag
 * they carry (saved's tag[2]); the window count (none kept) where none fit,
 * sl->keep is not 256-byte aligned or the fused pass does not run */
int gdn_cuda_chunk_bwd_kept(const gdn_plan *p, const gdn_saved_layout *sl, int *ktag);
/* where gdn_cuda_chunk_seg_maps leaves them in ws (nothing queued) */
void gdn_cuda_chunk_seg_maps_at(const gdn_plan *p, int sc, void *ws, float **seg_p, float **seg_s);
gdn_status gdn_cuda_recurrent_map(const gdn_plan *p, const gdn_fwd_args *a, int need_P, float *map, void *stream);
/* the split chunk backward (0: no split) in two parts over its workspace
 * (gdn_cuda_chunk_bwd_ws): back = 0, up to the first reverse sweep, with
 * sequence 0's dS at its start into d0 ([HV,K,V] in the state layout) and
 * the pass-1 maps' places into *seg_p, *seg_s (when not NULL); back = 1,
 * the rest, E ([HV,K,V] or NULL) added after the last sequence's end */
int gdn_cuda_chunk_bwd_split(const gdn_plan *p);
gdn_status gdn_cuda_chunk_bwd_part(const gdn_plan *p, const gdn_bwd_args *a, void *ws, int back, const float *E, float *d0,
                                   float **seg_p, float **seg_s, void *stream);
size_t gdn_cuda_chunk_dstate_ws(const gdn_plan *p);
gdn_status gdn_cuda_chunk_dstate(const gdn_plan *p, const gdn_bwd_args *a, const int64_t *cu_dev, const float *rstd_q,
                                 const float *rstd_k, void *ws, void *stream);
#ifdef __cplusplus
}
#endif
#endif
