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

// A sample of the intrinsics and math kernels call, one value per slot for
// thread 0 of block 0 (the block votes and warp reductions count every
// thread): u[k] integers, f[k] floating point; tests/test_kernels_emulated.py
// says what each slot holds.
extern "C" __global__ void canary_intrinsics(const float* x, long long* u, double* f,
                                             unsigned int* counters, double* dsum) {
    const unsigned int t = threadIdx.x;
    const int votes = __syncthreads_count(t % 3 == 0);
    const int all = __syncthreads_and(t < 1024), any = __syncthreads_or(t == 5);
    const unsigned int lanes = __reduce_add_sync(0xffffffffu, t);
    const unsigned int most = __reduce_max_sync(0xffffffffu, t);
    atomicInc(&counters[0], 5u);
    atomicDec(&counters[1], 7u);
    atomicOr(&counters[2], 1u << (t % 32));
    atomicAnd(&counters[3], ~(1u << (t % 32)));
    atomicXor(&counters[4], 1u);
    atomicAdd_block(&counters[5], 2u);
    atomicAdd(dsum, 0.5);
    if (t != 0 || blockIdx.x != 0) return;
    u[0] = votes; u[1] = all; u[2] = any; u[3] = lanes; u[4] = most;
    u[5] = __float_as_int(x[0]); u[6] = __float_as_uint(__int_as_float(0x3f800000));
    u[7] = __brev(1u); u[8] = __byte_perm(0x33221100u, 0x77665544u, 0x5140u);
    u[9] = __funnelshift_l(0x80000000u, 0x1u, 4u); u[10] = __funnelshift_r(0x10u, 0x1u, 4u);
    u[11] = __umulhi(0xffffffffu, 0xffffffffu); u[12] = __mulhi(-2, 0x40000000);
    u[13] = __sad(3, 10, 1u); u[14] = __clzll(1ll); u[15] = __ffsll(0x100ll);
    u[16] = __float2int_rn(2.5f); u[17] = __float2int_rz(-2.7f);
    u[18] = __float2int_rd(-2.2f); u[19] = __float2int_ru(2.2f);
    u[20] = __float2uint_rn(-3.0f); u[21] = __mul24(-3, 5); u[22] = __umul24(0x1000001u, 3u);
    u[23] = __double_as_longlong(1.0); u[24] = min(-1, 2u); u[25] = umax(3u, 9u);
    u[26] = umin(3u, 9u); u[27] = llmin(-4ll, 2ll);
    u[28] = (long long)ullmax(1ull << 40, 5ull) + (long long)ullmin(1ull << 40, 5ull);
    f[0] = __fadd_rd(1.0f, x[1]); f[1] = __fadd_ru(1.0f, x[1]); f[2] = __fadd_rn(1.0f, x[1]);
    f[3] = __fmul_rz(x[2], x[2]); f[4] = __fdiv_ru(1.0f, 3.0f); f[5] = __fdiv_rd(1.0f, 3.0f);
    f[6] = rsqrtf(4.0f); f[7] = sinpif(0.5f); f[8] = cospif(1.0f); f[9] = normcdff(0.0f);
    f[10] = erfinvf(0.5f); f[11] = rcbrtf(8.0f); f[12] = norm3df(2.0f, 3.0f, 6.0f);
    f[13] = __double2float_rz(0.1); f[14] = __int2float_rz(16777217);
    f[15] = __fmaf_rn(x[2], x[2], -1.0f); f[16] = fdividef(1.0f, 4.0f);
    f[17] = isnan(x[3]) ? 1.0 : 0.0; f[18] = make_float3(1.0f, 2.0f, 3.0f).z;
    f[19] = __longlong_as_double(0x4000000000000000ll);
}

// Every thread adds one to a half, a bfloat16 and a __half2 pair (atomicAdd).
extern "C" __global__ void canary_half_atomics(__half* h, __nv_bfloat16* b,
                                               __half2* pair) {
    atomicAdd(h, __half(1.0f));
    atomicAdd(b, __nv_bfloat16(1.0f));
    atomicAdd(pair, __halves2half2(__half(1.0f), __half(2.0f)));
}
