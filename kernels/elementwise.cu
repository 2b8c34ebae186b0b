// elementwise: out[i] = a * x[i] + y[i] for i in [0, n) (saxpy-like).
//
// Launch (see kernels/README.md):
//   block = (threads, 1, 1), threads any multiple of 32 in [32, 1024];
//   grid  = (G, 1, 1), any G >= 1 (a grid-stride loop covers all of x);
//   no shared memory.
// `a` is a float for every type; fp16 and bf16 values are widened to float,
// combined in float and rounded once to the output type.

#include <cuda_fp16.h>
#include <cuda_bf16.h>

__device__ __forceinline__ float elementwise_load(float v) { return v; }
__device__ __forceinline__ float elementwise_load(__half v) {
    return __half2float(v);
}
__device__ __forceinline__ float elementwise_load(__nv_bfloat16 v) {
    return __bfloat162float(v);
}

__device__ __forceinline__ void elementwise_store(float* p, float v) { *p = v; }
__device__ __forceinline__ void elementwise_store(__half* p, float v) {
    *p = __float2half(v);
}
__device__ __forceinline__ void elementwise_store(__nv_bfloat16* p, float v) {
    *p = __float2bfloat16(v);
}

template <typename T>
__device__ __forceinline__ void elementwise_axpy(float a, const T* __restrict__ x,
                                                 const T* __restrict__ y,
                                                 T* __restrict__ out, long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride)
        elementwise_store(&out[i],
                          a * elementwise_load(x[i]) + elementwise_load(y[i]));
}

extern "C" __global__ void elementwise_fp32(float a, const float* x, const float* y,
                                            float* out, long long n) {
    elementwise_axpy<float>(a, x, y, out, n);
}

extern "C" __global__ void elementwise_fp16(float a, const __half* x,
                                            const __half* y, __half* out,
                                            long long n) {
    elementwise_axpy<__half>(a, x, y, out, n);
}

extern "C" __global__ void elementwise_bf16(float a, const __nv_bfloat16* x,
                                            const __nv_bfloat16* y,
                                            __nv_bfloat16* out, long long n) {
    elementwise_axpy<__nv_bfloat16>(a, x, y, out, n);
}
