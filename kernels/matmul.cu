// matmul: C[M x N] = A[M x K] . B[K x N], all row-major and contiguous.
//
// Launch (see kernels/README.md):
//   block = (threads, 1, 1), threads any multiple of 32 in [32, 1024];
//   grid  = (ceil(N / MATMUL_TILE), ceil(M / MATMUL_TILE), 1);
//   no dynamic shared memory (the tiles are static: 2 * TILE * TILE floats,
//   2 KiB at the default TILE of 16).
// Each block computes one TILE x TILE tile of C. Its threads walk the TILE * TILE
// outputs with stride blockDim.x, so one thread owns TILE * TILE / blockDim.x of
// them (rounded up) and keeps their sums in registers across the K loop.
// fp16 and bf16 inputs are widened to float when a tile is loaded; every sum is
// a float, rounded once to the output type at the end.

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#ifndef MATMUL_TILE
#define MATMUL_TILE 16
#endif

// The most threads a block may have. It is passed to __launch_bounds__ so the
// compiler keeps to registers that let a block of that size launch (64 per
// thread at 1024); with MATMUL_TILE 32 that cap makes the kernel spill.
#ifndef MATMUL_MAX_THREADS
#define MATMUL_MAX_THREADS 1024
#endif

// The fewest threads a block may have: one warp. It bounds how many outputs
// one thread owns, hence the size of its register array.
#define MATMUL_MIN_THREADS 32
#define MATMUL_TILE_ELEMS (MATMUL_TILE * MATMUL_TILE)
#define MATMUL_PER_THREAD \
    ((MATMUL_TILE_ELEMS + MATMUL_MIN_THREADS - 1) / MATMUL_MIN_THREADS)

static_assert(MATMUL_TILE >= 1 && MATMUL_TILE_ELEMS <= 4096,
              "MATMUL_TILE must be in [1, 64]");

__device__ __forceinline__ float matmul_load(float v) { return v; }
__device__ __forceinline__ float matmul_load(__half v) { return __half2float(v); }
__device__ __forceinline__ float matmul_load(__nv_bfloat16 v) {
    return __bfloat162float(v);
}

__device__ __forceinline__ void matmul_store(float* p, float v) { *p = v; }
__device__ __forceinline__ void matmul_store(__half* p, float v) {
    *p = __float2half(v);
}
__device__ __forceinline__ void matmul_store(__nv_bfloat16* p, float v) {
    *p = __float2bfloat16(v);
}

template <typename T>
__device__ __forceinline__ void matmul_tiled(const T* __restrict__ A,
                                             const T* __restrict__ B,
                                             T* __restrict__ C, int M, int N,
                                             int K) {
    __shared__ float As[MATMUL_TILE][MATMUL_TILE];
    __shared__ float Bs[MATMUL_TILE][MATMUL_TILE];

    const int tid = (int)threadIdx.x;
    const int nthreads = (int)blockDim.x;
    const int row0 = (int)blockIdx.y * MATMUL_TILE;
    const int col0 = (int)blockIdx.x * MATMUL_TILE;

    float acc[MATMUL_PER_THREAD];
#pragma unroll
    for (int r = 0; r < MATMUL_PER_THREAD; ++r) acc[r] = 0.0f;

    for (int k0 = 0; k0 < K; k0 += MATMUL_TILE) {
        // Stage the A and B tiles; cells outside the matrices read as zero so
        // the inner product below needs no bounds checks.
        for (int e = tid; e < MATMUL_TILE_ELEMS; e += nthreads) {
            const int r = e / MATMUL_TILE;
            const int c = e % MATMUL_TILE;
            const int ar = row0 + r;
            const int ac = k0 + c;
            As[r][c] = (ar < M && ac < K)
                           ? matmul_load(A[(long long)ar * K + ac])
                           : 0.0f;
            const int br = k0 + r;
            const int bc = col0 + c;
            Bs[r][c] = (br < K && bc < N)
                           ? matmul_load(B[(long long)br * N + bc])
                           : 0.0f;
        }
        __syncthreads();

#pragma unroll
        for (int r = 0; r < MATMUL_PER_THREAD; ++r) {
            const int e = tid + r * nthreads;
            if (e < MATMUL_TILE_ELEMS) {
                const int tr = e / MATMUL_TILE;
                const int tc = e % MATMUL_TILE;
                float s = acc[r];
#pragma unroll 8
                for (int k = 0; k < MATMUL_TILE; ++k) s += As[tr][k] * Bs[k][tc];
                acc[r] = s;
            }
        }
        // The next iteration overwrites the tiles other threads may still read.
        __syncthreads();
    }

#pragma unroll
    for (int r = 0; r < MATMUL_PER_THREAD; ++r) {
        const int e = tid + r * nthreads;
        if (e < MATMUL_TILE_ELEMS) {
            const int cr = row0 + e / MATMUL_TILE;
            const int cc = col0 + e % MATMUL_TILE;
            if (cr < M && cc < N) matmul_store(&C[(long long)cr * N + cc], acc[r]);
        }
    }
}

extern "C" __global__ void __launch_bounds__(MATMUL_MAX_THREADS)
    matmul_fp32(const float* A, const float* B, float* C, int M, int N, int K) {
    matmul_tiled<float>(A, B, C, M, N, K);
}

extern "C" __global__ void __launch_bounds__(MATMUL_MAX_THREADS)
    matmul_fp16(const __half* A, const __half* B, __half* C, int M, int N, int K) {
    matmul_tiled<__half>(A, B, C, M, N, K);
}

extern "C" __global__ void __launch_bounds__(MATMUL_MAX_THREADS)
    matmul_bf16(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C,
                int M, int N, int K) {
    matmul_tiled<__nv_bfloat16>(A, B, C, M, N, K);
}
