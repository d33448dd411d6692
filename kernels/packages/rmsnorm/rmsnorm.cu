// One block per row of `cols` (even) elements: y = x * rsqrt(mean(x^2) + eps) * w.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "rmsnorm_common.cuh"

#ifdef RMSNORM_BF16
typedef __nv_bfloat16 T;
__device__ __forceinline__ float to_float(T v) { return __bfloat162float(v); }
// Two floats to a bfloat16 pair with the Ampere conversion instruction.
__device__ __forceinline__ unsigned int pack2(float lo, float hi)
{
    unsigned int r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
#else
typedef __half T;
__device__ __forceinline__ float to_float(T v) { return __half2float(v); }
__device__ __forceinline__ unsigned int pack2(float lo, float hi)
{
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<unsigned int *>(&h);
}
#endif

extern "C" __global__ void RMSNORM_KERNEL(const T *x, const T *w, T *y, int cols, float eps)
{
    const T *row = x + (size_t)blockIdx.x * cols;
    unsigned int *out = reinterpret_cast<unsigned int *>(y + (size_t)blockIdx.x * cols);
    float ss = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = to_float(row[c]);
        ss += v * v;
    }
    const float scale = rsqrtf(block_sum(ss) / cols + eps);
    for (int c = 2 * threadIdx.x; c + 1 < cols; c += 2 * blockDim.x)
        out[c / 2] = pack2(to_float(row[c]) * scale * to_float(w[c]),
                           to_float(row[c + 1]) * scale * to_float(w[c + 1]));
}
