// histogram: counts[b] += #{i in [0, n) : bin(x[i]) == b} for B bins over [0, 1).
//
//   bin(x) = min(max((int)(x * B), 0), B - 1)
//
// computed so that it is defined for every float: x * B below 0 or NaN goes to
// bin 0, and x * B at or above B (inf included) to bin B - 1. The kernel adds
// to counts, so the host zeroes counts[0..B) before the first launch.
//
// Launch (see kernels/README.md):
//   block = (threads, 1, 1), threads any multiple of 32 in [32, 1024];
//   grid  = (G, 1, 1), any G >= 1 (a grid-stride loop covers all of x);
//   no dynamic shared memory (HISTOGRAM_MAX_BINS counters, static: 16 KiB).
// With B <= HISTOGRAM_MAX_BINS each block counts into its own copy of the bins
// in shared memory and adds the non-zero ones to counts at the end; with more
// bins it falls back to atomics on counts directly (correct, slower).

#ifndef HISTOGRAM_MAX_BINS
#define HISTOGRAM_MAX_BINS 4096
#endif

__device__ __forceinline__ int histogram_bin(float x, int B) {
    const float scaled = x * (float)B;
    // `!(scaled >= 0)` also catches NaN, for which (int) would be undefined.
    if (!(scaled >= 0.0f)) return 0;
    if (scaled >= (float)B) return B - 1;
    return (int)scaled;
}

template <typename T>
__device__ __forceinline__ void histogram_count(const T* __restrict__ x,
                                                unsigned int* __restrict__ counts,
                                                long long n, int B) {
    __shared__ unsigned int bins[HISTOGRAM_MAX_BINS];

    if (B <= 0) return;  // Uniform across the block: no barrier is skipped alone.
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;

    if (B > HISTOGRAM_MAX_BINS) {
        for (long long i = first; i < n; i += stride)
            atomicAdd(&counts[histogram_bin((float)x[i], B)], 1u);
        return;
    }

    for (int b = (int)threadIdx.x; b < B; b += (int)blockDim.x) bins[b] = 0u;
    __syncthreads();
    for (long long i = first; i < n; i += stride)
        atomicAdd(&bins[histogram_bin((float)x[i], B)], 1u);
    __syncthreads();
    for (int b = (int)threadIdx.x; b < B; b += (int)blockDim.x) {
        const unsigned int c = bins[b];
        if (c != 0u) atomicAdd(&counts[b], c);
    }
}

extern "C" __global__ void histogram_fp32(const float* x, unsigned int* counts,
                                          long long n, int B) {
    histogram_count<float>(x, counts, n, B);
}
