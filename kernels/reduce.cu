// reduce: partial sums of x[0..n); block b writes its partial to out[b].
//
// Launch (see kernels/README.md):
//   block = (threads, 1, 1), threads any multiple of 32 in
//           [32, REDUCE_MAX_THREADS];
//   grid  = (G, 1, 1), any G >= 1 (a grid-stride loop covers all of x);
//   no dynamic shared memory (REDUCE_MAX_THREADS floats, static).
// The sum is finished by a second launch, reduce_fp32(out, total, G) with one
// block, which leaves the sum in total[0]; the host may instead add the G
// partials itself. Sums are float for every input type, and out is float.
// Each thread first adds its grid-stride share in a register, the block folds
// those in shared memory down to one warp, and the warp ends with shuffles.

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#ifndef REDUCE_MAX_THREADS
#define REDUCE_MAX_THREADS 1024
#endif

#define REDUCE_WARP 32

__device__ __forceinline__ float reduce_load(float v) { return v; }
__device__ __forceinline__ float reduce_load(__half v) { return __half2float(v); }
__device__ __forceinline__ float reduce_load(__nv_bfloat16 v) {
    return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ void reduce_block_sum(const T* __restrict__ x,
                                                 float* __restrict__ out,
                                                 long long n) {
    __shared__ float partial[REDUCE_MAX_THREADS];

    const unsigned int tid = threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    float sum = 0.0f;
    for (long long i = (long long)blockIdx.x * blockDim.x + tid; i < n; i += stride)
        sum += reduce_load(x[i]);
    partial[tid] = sum;
    __syncthreads();

    // Fold the upper part onto the lower part until one warp's worth is left.
    // `active` depends only on blockDim, so every thread meets every barrier.
    unsigned int active = blockDim.x;
    while (active > REDUCE_WARP) {
        const unsigned int half = (active + 1) / 2;
        if (tid + half < active) partial[tid] += partial[tid + half];
        __syncthreads();
        active = half;
    }

    if (tid < REDUCE_WARP) {
        float v = tid < active ? partial[tid] : 0.0f;
#pragma unroll
        for (int offset = REDUCE_WARP / 2; offset > 0; offset /= 2)
            v += __shfl_down_sync(0xffffffffu, v, offset);
        if (tid == 0) out[blockIdx.x] = v;
    }
}

extern "C" __global__ void reduce_fp32(const float* x, float* out, long long n) {
    reduce_block_sum<float>(x, out, n);
}

extern "C" __global__ void reduce_fp16(const __half* x, float* out, long long n) {
    reduce_block_sum<__half>(x, out, n);
}

extern "C" __global__ void reduce_bf16(const __nv_bfloat16* x, float* out,
                                       long long n) {
    reduce_block_sum<__nv_bfloat16>(x, out, n);
}
