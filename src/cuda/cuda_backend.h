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
#ifdef __cplusplus
}
#endif
#endif
