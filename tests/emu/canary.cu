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

// The rounding modes of float -> half and bf16: out[4 * i + m] for m = rn, rz,
// rd, ru (half bits in h, bf16 bits in b).
extern "C" __global__ void canary_round_modes(const float* x, unsigned short* h,
                                              unsigned short* b, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    h[4 * i + 0] = __half_as_ushort(__float2half_rn(x[i]));
    h[4 * i + 1] = __half_as_ushort(__float2half_rz(x[i]));
    h[4 * i + 2] = __half_as_ushort(__float2half_rd(x[i]));
    h[4 * i + 3] = __half_as_ushort(__float2half_ru(x[i]));
    b[4 * i + 0] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i]));
    b[4 * i + 1] = __bfloat16_as_ushort(__float2bfloat16_rz(x[i]));
    b[4 * i + 2] = __bfloat16_as_ushort(__float2bfloat16_rd(x[i]));
    b[4 * i + 3] = __bfloat16_as_ushort(__float2bfloat16_ru(x[i]));
}

// Half arithmetic as kernels write it: operators, __h* functions, pairs,
// implicit conversions and integer conversions. out[8 * i + k], k = a + b,
// a - b, a * b, __hfma(a, b, a), a pair's lanes (a + b, a * b) summed in
// float, -a, the larger of a and b, and __half2int_rz(a) as a float.
extern "C" __global__ void canary_half_math(const __half* a, const __half* b,
                                            float* out, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const __half x = a[i], y = b[i];
    __half s = x;
    s += y;
    out[8 * i + 0] = s;
    out[8 * i + 1] = __half2float(x - y);
    out[8 * i + 2] = __hmul(x, y);
    out[8 * i + 3] = __hfma(x, y, x);
    const __half2 p = __halves2half2(x, y), q = __hadd2(p, __lowhigh2highlow(p));
    const __half2 r = __hmul2(p, __lowhigh2highlow(p));
    out[8 * i + 4] = __low2float(q) + __high2float(r);
    out[8 * i + 5] = -x;
    out[8 * i + 6] = (x > y) ? float(x) : float(__hmax(x, y));
    out[8 * i + 7] = static_cast<float>(__half2int_rz(x));
}
