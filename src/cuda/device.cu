#include <cuda_runtime.h>
#include "cuda/cuda_backend.h"

extern "C" int gdn_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) { cudaGetLastError(); return 0; }
    return n;
}
