/* Vector loads and stores for the layer ops: VEC consecutive elements of a
 * dtype-DT tensor moved as one access (16 bytes where the caller's shape and
 * alignment allow), converted to / from fp32 in registers. DT is the
 * gdn_dtype value (0 f32, 1 bf16, 2 f16), a compile-time constant here. */
#pragma once
#include <stdint.h>
#include "cuda/common.cuh"

namespace gdn {

/* an aligned chunk of BYTES bytes */
template <int BYTES> struct raw;
template <> struct raw<32> { struct alignas(16) T { uint4 a, b; }; };
template <> struct raw<16> { typedef uint4 T; };
template <> struct raw<8> { typedef uint2 T; };
template <> struct raw<4> { typedef unsigned T; };
template <> struct raw<2> { typedef unsigned short T; };

template <int DT> __host__ __device__ constexpr int esize() { return DT == 0 ? 4 : 2; }

/* v[k] = p[i + k], k < VEC; p + i aligned to VEC elements */
template <int DT, int VEC>
__device__ __forceinline__ void ldv(const void *p, int64_t i, float (&v)[VEC]) {
    typedef typename raw<esize<DT>() * VEC>::T R;
    if constexpr (DT == 0) {
        union { R r; float f[VEC]; } u;
        u.r = *reinterpret_cast<const R *>(static_cast<const float *>(p) + i);
#pragma unroll
        for (int k = 0; k < VEC; k++) v[k] = u.f[k];
    } else {
        union { R r; unsigned short h[VEC]; } u;
        u.r = *reinterpret_cast<const R *>(static_cast<const unsigned short *>(p) + i);
#pragma unroll
        for (int k = 0; k < VEC; k++)
            v[k] = DT == 1 ? __uint_as_float(static_cast<unsigned>(u.h[k]) << 16) : __half2float(__ushort_as_half(u.h[k]));
    }
}

/* p[i + k] = v[k] rounded to DT (nearest even), k < VEC */
template <int DT, int VEC>
__device__ __forceinline__ void stv(void *p, int64_t i, const float (&v)[VEC]) {
    typedef typename raw<esize<DT>() * VEC>::T R;
    if constexpr (DT == 0) {
        union { R r; float f[VEC]; } u;
#pragma unroll
        for (int k = 0; k < VEC; k++) u.f[k] = v[k];
        *reinterpret_cast<R *>(static_cast<float *>(p) + i) = u.r;
    } else {
        union { R r; unsigned short h[VEC]; } u;
#pragma unroll
        for (int k = 0; k < VEC; k++)
            u.h[k] = DT == 1 ? __bfloat16_as_ushort(__float2bfloat16_rn(v[k])) : __half_as_ushort(__float2half_rn(v[k]));
        *reinterpret_cast<R *>(static_cast<unsigned short *>(p) + i) = u.r;
    }
}

/* f32 rows (weights, states): v[k] = p[i + k] */
template <int VEC>
__device__ __forceinline__ void ldf(const float *p, int64_t i, float (&v)[VEC]) { ldv<0, VEC>(p, i, v); }

/* sum over the G lanes of an aligned lane group (G a power of two <= 32);
 * every lane of the warp must call it */
__device__ __forceinline__ float group_sum(float v, int G) {
    for (int o = G >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* SiLU; __fdividef (2 ulp) rather than '/', whose IEEE slow path is a called
 * subroutine that makes the caller save registers (spills). For x < -87 it
 * gives -0 or 0 where x e^x is below 1e-36. */
__device__ __forceinline__ float silu(float x) { return __fdividef(x, 1.f + expf(-x)); }

/* A row of nvec vectors on a group of G lanes (G a power of two <= 32), NV
 * vectors per lane in registers: NV in 1, 2, 4, or 0 when the row is longer
 * than 128 vectors (a block per row instead). */
inline void row_plan(int64_t nvec, int *G, int *NV) {
    int g = 1;
    while (g < 32 && g < nvec) g *= 2;
    const int64_t per = (nvec + g - 1) / g;
    *G = g;
    *NV = per <= 1 ? 1 : per <= 2 ? 2 : per <= 4 ? 4 : 0;
}

__host__ __device__ __forceinline__ bool aligned16(const void *p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace gdn
