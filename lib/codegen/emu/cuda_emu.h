// cuda_emu.h: just enough of CUDA for the kernels in kernels/ to build and run
// as host C++17 (g++ or clang++), so their answers can be checked without a GPU.
//
// Model of execution:
//   * a launch runs the blocks of the grid one after another;
//   * a block's threads are real std::threads (created once per launch and
//     reused for every block), meeting at a barrier in __syncthreads();
//   * __shared__ expands to `static`: one copy per kernel instantiation, shared
//     by the threads of the block that is running, which is correct because
//     only one block runs at a time (a block-end barrier separates blocks);
//     a block starts with what the previous one left there, where the device
//     holds garbage, so a read-before-write of shared memory goes unseen;
//   * warp shuffles go through a per-block exchange buffer between two
//     barriers of the 32 threads of the warp; every lane of the warp must take
//     part (mask 0xffffffff), as the kernels here do;
//   * atomics are the compiler's __atomic builtins.
// Threads of a block meeting at different __syncthreads (or one leaving the
// kernel while others wait at one) abort the run with a message naming the
// lines, as does a barrier that waits longer than GH_EMU_BARRIER_TIMEOUT_S
// seconds (default 60) because some thread never arrives.
//
// Not emulated: dynamic (extern) shared memory, cooperative groups, streams,
// and any thread count that is not a multiple of 32.

#ifndef GH_CUDA_EMU_H
#define GH_CUDA_EMU_H

#include <chrono>
#include <condition_variable>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __shared__ static
// Constant memory: one copy, zero unless initialised; NVRTC has already
// refused a kernel that writes it.
#define __constant__ static
#define __managed__
#define __grid_constant__
#define __align__(n) alignas(n)
#define __launch_bounds__(...)
#define __maxnreg__(...)

struct uint3 {
    unsigned int x, y, z;
};

struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1)
        : x(x_), y(y_), z(z_) {}
};

// Per-thread coordinates are thread_local; the launch shape is the same for
// every thread of a launch and is written before the threads start.
inline thread_local uint3 threadIdx{0, 0, 0};
inline thread_local uint3 blockIdx{0, 0, 0};
inline dim3 blockDim;
inline dim3 gridDim;
constexpr int warpSize = 32;

namespace gh_emu {

[[noreturn]] inline void fail(const char* what) {
    std::fprintf(stderr, "cuda_emu: %s\n", what);
    std::fflush(stderr);
    std::abort();
}

inline double barrier_timeout_s() {
    const char* s = std::getenv("GH_EMU_BARRIER_TIMEOUT_S");
    return s ? std::atof(s) : 60.0;
}

// A reusable barrier for a fixed number of threads (C++17 has no std::barrier).
// Each wait names its site (the source line of a __syncthreads, or 0 for the
// launcher's end-of-block barrier); threads of one round meeting at different
// sites mean divergent control flow, which is reported rather than emulated.
class Barrier {
  public:
    explicit Barrier(unsigned int count) : count_(count) {}

    void wait(const char* name, int site) {
        std::unique_lock<std::mutex> lock(mutex_);
        const unsigned long long generation = generation_;
        if (arrived_ == 0) {
            site_ = site;
            site_name_ = name;
        } else if (site != site_) {
            std::fprintf(stderr,
                         "cuda_emu: divergent barriers in block (%u,%u,%u): %s at "
                         "line %d while others wait at %s at line %d\n",
                         blockIdx.x, blockIdx.y, blockIdx.z, name, site, site_name_,
                         site_);
            std::fflush(stderr);
            std::abort();
        }
        if (++arrived_ == count_) {
            arrived_ = 0;
            ++generation_;
            cv_.notify_all();
            return;
        }
        const auto timeout = std::chrono::duration<double>(barrier_timeout_s());
        if (!cv_.wait_for(lock, timeout, [&] { return generation_ != generation; })) {
            std::fprintf(stderr,
                         "cuda_emu: divergent barriers in block (%u,%u,%u): %s at "
                         "line %d timed out with %u of %u threads arrived\n",
                         blockIdx.x, blockIdx.y, blockIdx.z, name, site, arrived_,
                         count_);
            std::fflush(stderr);
            std::abort();
        }
    }

  private:
    std::mutex mutex_;
    std::condition_variable cv_;
    const unsigned int count_;
    unsigned int arrived_ = 0;
    unsigned long long generation_ = 0;
    int site_ = 0;
    const char* site_name_ = "";
};

// What the threads of the running block share besides __shared__ variables.
struct Block {
    explicit Block(unsigned int threads) : barrier(threads), exchange(threads) {
        for (unsigned int w = 0; w < threads / warpSize; ++w)
            warps.emplace_back(std::make_unique<Barrier>(warpSize));
    }
    Barrier barrier;
    std::vector<std::unique_ptr<Barrier>> warps;
    std::vector<std::uint64_t> exchange;  // one shuffle slot per thread
};

inline thread_local Block* current_block = nullptr;

inline unsigned int linear_thread() {
    return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

template <typename T>
T shuffle(unsigned int mask, T value, int source_lane, const char* name, int line) {
    static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8,
                  "shuffled values must be trivially copyable, at most 8 bytes");
    if (mask != 0xffffffffu)
        fail("only full-warp shuffles (mask 0xffffffff) are emulated");
    Block& block = *current_block;
    const unsigned int tid = linear_thread();
    const unsigned int warp = tid / warpSize;
    std::uint64_t bits = 0;
    std::memcpy(&bits, &value, sizeof(T));
    block.exchange[tid] = bits;
    block.warps[warp]->wait(name, line);  // every lane has published
    T result = value;
    if (source_lane >= 0) {
        const unsigned int lane0 = warp * warpSize;
        bits = block.exchange[lane0 + static_cast<unsigned int>(source_lane)];
        std::memcpy(&result, &bits, sizeof(T));
    }
    block.warps[warp]->wait(name, line);  // every lane has read its slot
    return result;
}

// Runs kernel(args...) over grid x block; returns when every block is done.
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, Args... args) {
    const unsigned long long threads =
        static_cast<unsigned long long>(block.x) * block.y * block.z;
    if (threads == 0 || threads > 1024 || threads % warpSize != 0)
        fail("block size must be a multiple of 32 in [32, 1024]");
    if (grid.x == 0 || grid.y == 0 || grid.z == 0) fail("grid has a zero dimension");
    gridDim = grid;
    blockDim = block;
    Block shared_state(static_cast<unsigned int>(threads));
    auto body = [&](unsigned int tid) {
        current_block = &shared_state;
        threadIdx = uint3{tid % block.x, (tid / block.x) % block.y,
                          tid / (block.x * block.y)};
        for (unsigned int bz = 0; bz < grid.z; ++bz)
            for (unsigned int by = 0; by < grid.y; ++by)
                for (unsigned int bx = 0; bx < grid.x; ++bx) {
                    blockIdx = uint3{bx, by, bz};
                    kernel(args...);
                    // The next block reuses the __shared__ statics.
                    shared_state.barrier.wait("end of block", 0);
                }
        current_block = nullptr;
    };
    std::vector<std::thread> pool;
    pool.reserve(threads);
    for (unsigned int t = 0; t < threads; ++t) pool.emplace_back(body, t);
    for (std::thread& t : pool) t.join();
}

// IEEE binary16 from float, round to nearest even (as __float2half).
inline std::uint16_t float_to_half_bits(float f) {
    std::uint32_t x;
    std::memcpy(&x, &f, 4);
    const std::uint32_t sign = (x >> 16) & 0x8000u;
    const std::uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) {  // inf stays inf; NaN stays a (quiet) NaN
        const std::uint32_t quiet = ax > 0x7f800000u ? 0x200u : 0u;
        return static_cast<std::uint16_t>(sign | 0x7c00u | quiet);
    }
    if (ax >= 0x477ff000u)  // rounds to at least 65520: overflows to inf
        return static_cast<std::uint16_t>(sign | 0x7c00u);
    if (ax < 0x38800000u) {  // below 2^-14: a subnormal half (or zero)
        float a;
        std::memcpy(&a, &ax, 4);
        // Units of 2^-24; the scaling is exact and nearbyint rounds to even.
        const auto units = static_cast<std::uint32_t>(std::nearbyint(a * 16777216.0f));
        return static_cast<std::uint16_t>(sign | units);
    }
    const std::uint32_t rounded = ax + 0xfffu + ((ax >> 13) & 1u) - 0x38000000u;
    return static_cast<std::uint16_t>(sign | (rounded >> 13));
}

inline float half_bits_to_float(std::uint16_t h) {
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    const std::uint32_t exponent = (h >> 10) & 0x1fu;
    const std::uint32_t mantissa = h & 0x3ffu;
    std::uint32_t bits;
    if (exponent == 0x1fu) {
        bits = sign | 0x7f800000u | (mantissa << 13);
    } else if (exponent != 0) {
        bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
    } else {  // zero or subnormal: mantissa * 2^-24, exact in float
        const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
        std::memcpy(&bits, &magnitude, 4);
        bits |= sign;
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// bfloat16 (the top half of a float) from float, round to nearest even.
inline std::uint16_t float_to_bf16_bits(float f) {
    std::uint32_t x;
    std::memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return static_cast<std::uint16_t>((x >> 16) | 0x40u);  // quiet NaN
    return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

inline float bf16_bits_to_float(std::uint16_t b) {
    const std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

}  // namespace gh_emu

// __builtin_LINE() as a default argument is the caller's line (GCC, Clang).
inline void __syncthreads(int line = __builtin_LINE()) {
    gh_emu::current_block->barrier.wait("__syncthreads", line);
}

template <typename T>
T __shfl_down_sync(unsigned int mask, T value, unsigned int delta,
                   int width = warpSize, int line = __builtin_LINE()) {
    const int lane = static_cast<int>(gh_emu::linear_thread() % warpSize);
    const int in_segment = lane % width + static_cast<int>(delta);
    const int source = in_segment < width ? lane + static_cast<int>(delta) : -1;
    return gh_emu::shuffle(mask, value, source, "__shfl_down_sync", line);
}

template <typename T>
T __shfl_xor_sync(unsigned int mask, T value, int lane_mask, int width = warpSize,
                  int line = __builtin_LINE()) {
    const int lane = static_cast<int>(gh_emu::linear_thread() % warpSize);
    const int target = lane ^ lane_mask;
    // As on the device: a source outside the caller's width-wide segment
    // leaves the caller's own value.
    const int source = (target / width == lane / width) ? target : -1;
    return gh_emu::shuffle(mask, value, source, "__shfl_xor_sync", line);
}

template <typename T>
T __shfl_sync(unsigned int mask, T value, int src_lane, int width = warpSize,
              int line = __builtin_LINE()) {
    const int lane = static_cast<int>(gh_emu::linear_thread() % warpSize);
    const int source = lane / width * width + ((src_lane % width) + width) % width;
    return gh_emu::shuffle(mask, value, source, "__shfl_sync", line);
}

template <typename T>
T __shfl_up_sync(unsigned int mask, T value, unsigned int delta,
                 int width = warpSize, int line = __builtin_LINE()) {
    const int lane = static_cast<int>(gh_emu::linear_thread() % warpSize);
    const int in_segment = lane % width - static_cast<int>(delta);
    const int source = in_segment >= 0 ? lane - static_cast<int>(delta) : -1;
    return gh_emu::shuffle(mask, value, source, "__shfl_up_sync", line);
}

namespace gh_emu {
// Every lane's predicate as a warp's bit mask (full warps only, as shuffles).
inline unsigned int ballot(unsigned int mask, int predicate, const char* name,
                           int line) {
    unsigned int bits = 0;
    for (int k = 0; k < static_cast<int>(warpSize); ++k)
        bits |= (shuffle(mask, predicate != 0 ? 1u : 0u, k, name, line) & 1u) << k;
    return bits;
}
}  // namespace gh_emu

inline unsigned int __ballot_sync(unsigned int mask, int predicate,
                                  int line = __builtin_LINE()) {
    return gh_emu::ballot(mask, predicate, "__ballot_sync", line);
}
inline int __any_sync(unsigned int mask, int predicate, int line = __builtin_LINE()) {
    return gh_emu::ballot(mask, predicate, "__any_sync", line) != 0;
}
inline int __all_sync(unsigned int mask, int predicate, int line = __builtin_LINE()) {
    return gh_emu::ballot(mask, predicate, "__all_sync", line) == 0xffffffffu;
}
inline void __syncwarp(unsigned int mask = 0xffffffffu, int line = __builtin_LINE()) {
    (void)gh_emu::shuffle(mask, 0u, -1, "__syncwarp", line);
}

inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// Read-only loads through the texture path: plain loads on the host.
template <typename T>
T __ldg(const T* p) { return *p; }

// CUDA's min and max overloads, the fast-math intrinsics and bit counts.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned int min(unsigned int a, unsigned int b) { return a < b ? a : b; }
inline unsigned int max(unsigned int a, unsigned int b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) {
    return a < b ? a : b;
}
inline unsigned long long max(unsigned long long a, unsigned long long b) {
    return a > b ? a : b;
}
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline int __popc(unsigned int x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }

template <typename T>
T atomicCAS(T* address, T compare, T value) {
    static_assert(std::is_integral<T>::value, "atomicCAS on integers");
    __atomic_compare_exchange(address, &compare, &value, false, __ATOMIC_RELAXED,
                              __ATOMIC_RELAXED);
    return compare;
}
template <typename T>
T atomicExch(T* address, T value) {
    return __atomic_exchange_n(address, value, __ATOMIC_RELAXED);
}
template <typename T>
T atomicSub(T* address, T value) {
    return __atomic_fetch_sub(address, value, __ATOMIC_RELAXED);
}
template <typename T>
T atomicMax(T* address, T value) {
    T old = __atomic_load_n(address, __ATOMIC_RELAXED);
    while (old < value && !__atomic_compare_exchange_n(address, &old, value, true,
                                                       __ATOMIC_RELAXED,
                                                       __ATOMIC_RELAXED)) {
    }
    return old;
}
template <typename T>
T atomicMin(T* address, T value) {
    T old = __atomic_load_n(address, __ATOMIC_RELAXED);
    while (old > value && !__atomic_compare_exchange_n(address, &old, value, true,
                                                       __ATOMIC_RELAXED,
                                                       __ATOMIC_RELAXED)) {
    }
    return old;
}

inline unsigned long long atomicAdd(unsigned long long* address,
                                    unsigned long long value) {
    return __atomic_fetch_add(address, value, __ATOMIC_RELAXED);
}

inline unsigned int atomicAdd(unsigned int* address, unsigned int value) {
    return __atomic_fetch_add(address, value, __ATOMIC_RELAXED);
}

inline int atomicAdd(int* address, int value) {
    return __atomic_fetch_add(address, value, __ATOMIC_RELAXED);
}

namespace gh_emu {
// An atomic add for a type the hardware has no fetch-add of (float, double,
// half, pairs): a compare-and-swap loop on its bytes.
template <typename T>
T cas_add(T* address, T value) {
    T old;
    __atomic_load(address, &old, __ATOMIC_RELAXED);
    T desired = old + value;
    // On failure `old` is reloaded with the current value; retry from there.
    while (!__atomic_compare_exchange(address, &old, &desired, true, __ATOMIC_RELAXED,
                                      __ATOMIC_RELAXED))
        desired = old + value;
    return old;
}
}  // namespace gh_emu

inline float atomicAdd(float* address, float value) {
    return gh_emu::cas_add(address, value);
}

inline double atomicAdd(double* address, double value) {
    return gh_emu::cas_add(address, value);
}
template <typename T>
T atomicAnd(T* address, T value) {
    return __atomic_fetch_and(address, value, __ATOMIC_RELAXED);
}
template <typename T>
T atomicOr(T* address, T value) {
    return __atomic_fetch_or(address, value, __ATOMIC_RELAXED);
}
template <typename T>
T atomicXor(T* address, T value) {
    return __atomic_fetch_xor(address, value, __ATOMIC_RELAXED);
}
inline unsigned int atomicInc(unsigned int* address, unsigned int limit) {
    unsigned int old = __atomic_load_n(address, __ATOMIC_RELAXED);
    unsigned int next;
    do {
        next = old >= limit ? 0u : old + 1u;
    } while (!__atomic_compare_exchange_n(address, &old, next, true, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    return old;
}
inline unsigned int atomicDec(unsigned int* address, unsigned int limit) {
    unsigned int old = __atomic_load_n(address, __ATOMIC_RELAXED);
    unsigned int next;
    do {
        next = (old == 0u || old > limit) ? limit : old - 1u;
    } while (!__atomic_compare_exchange_n(address, &old, next, true, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    return old;
}
// The scoped forms: one block runs at a time here, so every scope is the same.
#define GH_SCOPED(OP)                                                              \
    template <typename P, typename... A>                                           \
    auto OP##_block(P* p, A... a) -> decltype(OP(p, a...)) { return OP(p, a...); } \
    template <typename P, typename... A>                                           \
    auto OP##_system(P* p, A... a) -> decltype(OP(p, a...)) { return OP(p, a...); }
GH_SCOPED(atomicAdd)
GH_SCOPED(atomicSub)
GH_SCOPED(atomicExch)
GH_SCOPED(atomicMin)
GH_SCOPED(atomicMax)
GH_SCOPED(atomicInc)
GH_SCOPED(atomicDec)
GH_SCOPED(atomicCAS)
GH_SCOPED(atomicAnd)
GH_SCOPED(atomicOr)
GH_SCOPED(atomicXor)
#undef GH_SCOPED

// The rest of the device API (vector types, intrinsics, math, votes), then
// the half and bfloat16 types and their API (<cuda_fp16.h>, <cuda_bf16.h>).
#include "cuda_intrinsics.h"
#include "cuda_half.h"

#endif  // GH_CUDA_EMU_H
