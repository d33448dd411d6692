// Block-wide sum for blocks of up to 1024 threads.
#pragma once

__device__ __forceinline__ float block_sum(float v)
{
    __shared__ float warp_sums[32];
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0)
        warp_sums[warp] = v;
    __syncthreads();
    const int warps = (blockDim.x + 31) >> 5;
    v = threadIdx.x < warps ? warp_sums[threadIdx.x] : 0.0f;
    if (warp == 0)
        for (int o = 16; o > 0; o >>= 1)
            v += __shfl_xor_sync(0xffffffffu, v, o);
    __shared__ float total;
    if (threadIdx.x == 0)
        total = v;
    __syncthreads();
    return total;
}
