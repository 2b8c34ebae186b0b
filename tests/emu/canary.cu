// Kernels that check the emulator itself, not the workload: each one is wrong
// in a known way, or exercises a primitive whose device result is documented.
// Used only by tests/test_kernels_emulated.py.

#include <cuda_fp16.h>
#include <cuda_bf16.h>

// Writes out[0..n], one element past the end: AddressSanitizer must stop it.
extern "C" __global__ void canary_write_past_end(float* out, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) out[i] = 1.0f;
}

// Thread 0 skips a barrier the others wait at: the emulator must abort.
extern "C" __global__ void canary_divergent_barrier(float* out) {
    if (threadIdx.x == 0) return;
    __syncthreads();
    out[threadIdx.x] = 1.0f;
}

// Each thread reads a neighbour's shared slot with no barrier between the
// write and the read: a data race ThreadSanitizer must report.
extern "C" __global__ void canary_missing_barrier(float* out) {
    __shared__ float slots[1024];
    const unsigned int t = threadIdx.x;
    slots[t] = (float)t;
    out[t] = slots[(t + 1) % blockDim.x];
}

// out[t] = lane that thread t read through each shuffle, for every thread t:
// [0, T) __shfl_xor_sync(lane ^ 5), [T, 2T) __shfl_down_sync(+3),
// [2T, 3T) __shfl_down_sync(+3, width 8), [3T, 4T) float sum over the warp by
// __shfl_xor_sync butterflies (every lane ends with the warp's total).
extern "C" __global__ void canary_shuffles(int* out) {
    const int T = (int)blockDim.x;
    const int t = (int)threadIdx.x;
    const int lane = t % 32;
    out[t] = __shfl_xor_sync(0xffffffffu, lane, 5);
    out[T + t] = __shfl_down_sync(0xffffffffu, lane, 3);
    out[2 * T + t] = __shfl_down_sync(0xffffffffu, lane, 3, 8);
    float v = (float)t;
    for (int mask = 16; mask > 0; mask /= 2) v += __shfl_xor_sync(0xffffffffu, v, mask);
    out[3 * T + t] = (int)v;
}

// The emulator's half and bfloat16 conversions, element by element.
extern "C" __global__ void canary_conversions(const float* x, __half* h,
                                              float* h_back, __nv_bfloat16* b,
                                              float* b_back, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    h[i] = __float2half(x[i]);
    h_back[i] = __half2float(h[i]);
    b[i] = __float2bfloat16(x[i]);
    b_back[i] = __bfloat162float(b[i]);
}

// Copies in to out, then writes one element `offset` elements from out[0]:
// a far out-of-bounds write when offset lies well outside [0, n), which a
// sanitizer's redzones do not reach (the driver's guards do).
extern "C" __global__ void canary_write_far(const float* in, float* out, long long n,
                                            long long offset) {
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (long long i = first; i < n; i += (long long)gridDim.x * blockDim.x)
        out[i] = in[i];
    if (first == 0) out[offset] = 1.0f;
}
