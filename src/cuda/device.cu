#include <cuda_runtime.h>
#include "cuda/cuda_backend.h"

extern "C" int gdn_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) { cudaGetLastError(); return 0; }
    return n;
}

extern "C" gdn_status gdn_cuda_check_stream(void *stream) {
#if CUDART_VERSION >= 12080
    int cur = 0, dev = 0;
    /* a stream under capture is not asked: the query ends the capture
     * (seen on CUDA 13 with the driver 580); its launches still fail on a
     * wrong device when the graph is instantiated or launched */
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing((cudaStream_t)stream, &cs) != cudaSuccess) {
        cudaGetLastError();
        return GDN_OK;
    }
    if (cs != cudaStreamCaptureStatusNone) return GDN_OK;
    if (cudaGetDevice(&cur) != cudaSuccess || cudaStreamGetDevice((cudaStream_t)stream, &dev) != cudaSuccess) {
        cudaGetLastError();   /* cannot tell: the launch reports its own error */
        return GDN_OK;
    }
    if (dev != cur)
        return gdn_fail(GDN_ERR_BACKEND, "gdn_exec.stream (%p) belongs to device %d, but the current device is %d, where "
                        "the CUDA backend runs: call cudaSetDevice(%d) first", stream, dev, cur, dev);
#else
    (void)stream;
#endif
    return GDN_OK;
}
