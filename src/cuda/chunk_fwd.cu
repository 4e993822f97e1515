/* CUDA chunk forward (placeholder while the tensor-core kernel lands). */
#include <cuda_runtime.h>
#include "cuda/cuda_backend.h"

extern "C" gdn_status gdn_cuda_chunk_fwd(const gdn_plan *pl, const gdn_fwd_args *a, void *ws, void *stream) {
    (void)pl; (void)a; (void)ws; (void)stream;
    return gdn_fail(GDN_ERR_UNSUPPORTED, "gdn_chunk_fwd: not yet on CUDA");
}
extern "C" size_t gdn_cuda_chunk_fwd_ws(const gdn_plan *pl) { (void)pl; return 0; }
