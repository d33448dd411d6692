// x: [tokens, heads, dim] (dim even), rotated in place by the token's angle
// table: cos_t/sin_t are [tokens, dim/2].
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#ifdef ROTARY_BF16
typedef __nv_bfloat162 T2;
__device__ __forceinline__ float2 load2(T2 v) { return __bfloat1622float2(v); }
__device__ __forceinline__ T2 store2(float a, float b) { return __floats2bfloat162_rn(a, b); }
#else
typedef __half2 T2;
__device__ __forceinline__ float2 load2(T2 v) { return __half22float2(v); }
__device__ __forceinline__ T2 store2(float a, float b) { return __floats2half2_rn(a, b); }
#endif

extern "C" __global__ void ROTARY_KERNEL(T2 *x, const float *cos_t, const float *sin_t,
                                         int tokens, int heads, int dim)
{
    const int half = dim / 2;
    const long total = (long)tokens * heads * half;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total;
         i += (long)gridDim.x * blockDim.x) {
        const int p = i % half;
        const long token = i / half / heads;
        const float c = cos_t[token * half + p], s = sin_t[token * half + p];
        const float2 v = load2(x[i]);
        x[i] = store2(v.x * c - v.y * s, v.x * s + v.y * c);
    }
}
