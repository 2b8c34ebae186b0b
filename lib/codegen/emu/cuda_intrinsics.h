// cuda_intrinsics.h: the rest of the device API that Gate 2a lets a kernel call
// (lib/security/scan/rules.py) and that kernels commonly do call, for the
// emulated host build (included by cuda_emu.h, after its primitives): vector
// types, rounding-mode arithmetic and conversions, reinterpretations, integer
// and bit intrinsics, the math functions C++ lacks, block-wide votes, warp
// reductions, and cache-hinted loads and stores (atomics: cuda_emu.h, cuda_half.h).
// Rounding modes other than to-nearest are set with fesetround around the
// operation, on operands the compiler cannot fold (the build passes
// -frounding-math, so nothing is moved across the mode switch).

#ifndef GH_CUDA_INTRINSICS_H
#define GH_CUDA_INTRINSICS_H

#include <cfenv>

// ---- vector types with the device's alignment, and their make_ functions ------

#define GH_VEC1(T, N, A) struct alignas(A) N##1 { T x; };                          \
    inline N##1 make_##N##1(T x) { return N##1{x}; }
#define GH_VEC2(T, N, A) struct alignas(A) N##2 { T x, y; };                       \
    inline N##2 make_##N##2(T x, T y) { return N##2{x, y}; }
#define GH_VEC3(T, N) struct N##3 { T x, y, z; };                                  \
    inline N##3 make_##N##3(T x, T y, T z) { return N##3{x, y, z}; }
#define GH_VEC4(T, N, A) struct alignas(A) N##4 { T x, y, z, w; };                 \
    inline N##4 make_##N##4(T x, T y, T z, T w) { return N##4{x, y, z, w}; }
#define GH_VECS(T, N, A1, A2, A4)                                                  \
    GH_VEC1(T, N, A1) GH_VEC2(T, N, A2) GH_VEC3(T, N) GH_VEC4(T, N, A4)
GH_VECS(signed char, char, 1, 2, 4)
GH_VECS(unsigned char, uchar, 1, 2, 4)
GH_VECS(short, short, 2, 4, 8)
GH_VECS(unsigned short, ushort, 2, 4, 8)
GH_VECS(int, int, 4, 8, 16)
// uint3 is cuda_emu.h's (threadIdx and blockIdx are uint3)
GH_VEC1(unsigned int, uint, 4) GH_VEC2(unsigned int, uint, 8) GH_VEC4(unsigned int, uint, 16)
inline uint3 make_uint3(unsigned int x, unsigned int y, unsigned int z) {
    return uint3{x, y, z};
}
GH_VECS(long, long, 8, 16, 16)
GH_VECS(unsigned long, ulong, 8, 16, 16)
GH_VECS(long long, longlong, 8, 16, 16)
GH_VECS(unsigned long long, ulonglong, 8, 16, 16)
GH_VECS(float, float, 4, 8, 16)
GH_VECS(double, double, 8, 16, 16)
#undef GH_VECS
#undef GH_VEC4
#undef GH_VEC3
#undef GH_VEC2
#undef GH_VEC1

// ---- rounding modes --------------------------------------------------------------

namespace gh_emu {
// `op()` evaluated with the FPU rounding towards `mode` ('n', 'z', 'd', 'u').
template <typename Op>
auto rounded(char mode, Op op) -> decltype(op()) {
    const int wanted = mode == 'z' ? FE_TOWARDZERO : mode == 'd' ? FE_DOWNWARD
                     : mode == 'u' ? FE_UPWARD : FE_TONEAREST;
    const int saved = std::fegetround();
    std::fesetround(wanted);
    const auto result = op();
    std::fesetround(saved);
    return result;
}
template <typename T>
T opaque(T v) {  // a value the compiler cannot fold under another rounding mode
    volatile T held = v;
    return held;
}
}  // namespace gh_emu

// __fadd_rn ... __dsqrt_ru, __fmaf_rz, __fma_rd, __frcp_ru, __frsqrt_rn
#define GH_ROUND_OPS(M)                                                            \
    inline float __fadd_r##M(float a, float b) {                                   \
        return gh_emu::rounded(#M[0], [&] { return gh_emu::opaque(a) + gh_emu::opaque(b); }); \
    }                                                                              \
    inline float __fsub_r##M(float a, float b) {                                   \
        return gh_emu::rounded(#M[0], [&] { return gh_emu::opaque(a) - gh_emu::opaque(b); }); \
    }                                                                              \
    inline float __fmul_r##M(float a, float b) {                                   \
        return gh_emu::rounded(#M[0], [&] { return gh_emu::opaque(a) * gh_emu::opaque(b); }); \
    }                                                                              \
    inline float __fdiv_r##M(float a, float b) {                                   \
        return gh_emu::rounded(#M[0], [&] { return gh_emu::opaque(a) / gh_emu::opaque(b); }); \
    }                                                                              \
    inline float __frcp_r##M(float a) {                                            \
        return gh_emu::rounded(#M[0], [&] { return 1.0f / gh_emu::opaque(a); });   \
    }                                                                              \
    inline float __fsqrt_r##M(float a) {                                           \
        return gh_emu::rounded(#M[0], [&] { return std::sqrt(gh_emu::opaque(a)); }); \
    }                                                                              \
    inline float __fmaf_r##M(float a, float b, float c) {                          \
        return gh_emu::rounded(#M[0], [&] {                                        \
            return std::fma(gh_emu::opaque(a), b, c); });                          \
    }                                                                              \
    inline double __dadd_r##M(double a, double b) {                                \
        return gh_emu::rounded(#M[0], [&] { return gh_emu::opaque(a) + gh_emu::opaque(b); }); \
    }                                                                              \
    inline double __dsub_r##M(double a, double b) {                                \
        return gh_emu::rounded(#M[0], [&] { return gh_emu::opaque(a) - gh_emu::opaque(b); }); \
    }                                                                              \
    inline double __dmul_r##M(double a, double b) {                                \
        return gh_emu::rounded(#M[0], [&] { return gh_emu::opaque(a) * gh_emu::opaque(b); }); \
    }                                                                              \
    inline double __ddiv_r##M(double a, double b) {                                \
        return gh_emu::rounded(#M[0], [&] { return gh_emu::opaque(a) / gh_emu::opaque(b); }); \
    }                                                                              \
    inline double __drcp_r##M(double a) {                                          \
        return gh_emu::rounded(#M[0], [&] { return 1.0 / gh_emu::opaque(a); });    \
    }                                                                              \
    inline double __dsqrt_r##M(double a) {                                         \
        return gh_emu::rounded(#M[0], [&] { return std::sqrt(gh_emu::opaque(a)); }); \
    }                                                                              \
    inline double __fma_r##M(double a, double b, double c) {                       \
        return gh_emu::rounded(#M[0], [&] {                                        \
            return std::fma(gh_emu::opaque(a), b, c); });                          \
    }
GH_ROUND_OPS(n)
GH_ROUND_OPS(z)
GH_ROUND_OPS(d)
GH_ROUND_OPS(u)
#undef GH_ROUND_OPS
inline float __frsqrt_rn(float a) { return 1.0f / std::sqrt(a); }

// ---- conversions and reinterpretations -------------------------------------------

namespace gh_emu {
// float or double to an integer type as the device's cvt does: NaN to 0, out
// of range saturated, rounded as `mode` says.
template <typename I, typename F>
I to_int(F f, char mode) {
    if (std::isnan(f)) return 0;
    const F r = mode == 'z' ? std::trunc(f) : mode == 'd' ? std::floor(f)
              : mode == 'u' ? std::ceil(f) : std::nearbyint(f);
    if (r <= static_cast<F>(std::numeric_limits<I>::min()))
        return std::numeric_limits<I>::min();
    if (r >= static_cast<F>(std::numeric_limits<I>::max()))
        return std::numeric_limits<I>::max();
    return static_cast<I>(r);
}
template <typename To, typename From>
To bit_cast(From v) {
    static_assert(sizeof(To) == sizeof(From), "same size");
    To out;
    std::memcpy(&out, &v, sizeof(To));
    return out;
}
}  // namespace gh_emu

#define GH_TO_INT(NAME, I, M)                                                      \
    inline I __float2##NAME##_r##M(float f) { return gh_emu::to_int<I>(f, #M[0]); } \
    inline I __double2##NAME##_r##M(double f) { return gh_emu::to_int<I>(f, #M[0]); }
#define GH_FROM_INT(NAME, I, M)                                                    \
    inline float __##NAME##2float_r##M(I v) {                                       \
        return gh_emu::rounded(#M[0], [&] {                                        \
            return static_cast<float>(gh_emu::opaque(v)); });                      \
    }                                                                              \
    inline double __##NAME##2double_r##M(I v) {                                     \
        return gh_emu::rounded(#M[0], [&] {                                        \
            return static_cast<double>(gh_emu::opaque(v)); });                     \
    }
#define GH_INTS(NAME, I)                                                           \
    GH_TO_INT(NAME, I, n) GH_TO_INT(NAME, I, z) GH_TO_INT(NAME, I, d)              \
    GH_TO_INT(NAME, I, u) GH_FROM_INT(NAME, I, n) GH_FROM_INT(NAME, I, z)          \
    GH_FROM_INT(NAME, I, d) GH_FROM_INT(NAME, I, u)
GH_INTS(int, int)
GH_INTS(uint, unsigned int)
GH_INTS(ll, long long)
GH_INTS(ull, unsigned long long)
#undef GH_INTS
#undef GH_FROM_INT
#undef GH_TO_INT
#define GH_D2F(M)                                                                  \
    inline float __double2float_r##M(double d) {                                   \
        return gh_emu::rounded(#M[0], [&] {                                        \
            return static_cast<float>(gh_emu::opaque(d)); });                      \
    }
GH_D2F(n)
GH_D2F(z)
GH_D2F(d)
GH_D2F(u)
#undef GH_D2F

inline int __float_as_int(float f) { return gh_emu::bit_cast<int>(f); }
inline unsigned int __float_as_uint(float f) { return gh_emu::bit_cast<unsigned int>(f); }
inline float __int_as_float(int i) { return gh_emu::bit_cast<float>(i); }
inline float __uint_as_float(unsigned int u) { return gh_emu::bit_cast<float>(u); }
inline long long __double_as_longlong(double d) { return gh_emu::bit_cast<long long>(d); }
inline double __longlong_as_double(long long v) { return gh_emu::bit_cast<double>(v); }
inline int __double2hiint(double d) {
    return static_cast<int>(gh_emu::bit_cast<unsigned long long>(d) >> 32);
}
inline int __double2loint(double d) {
    return static_cast<int>(gh_emu::bit_cast<unsigned long long>(d) & 0xffffffffu);
}
inline double __hiloint2double(int hi, int lo) {
    return gh_emu::bit_cast<double>(
        (static_cast<unsigned long long>(static_cast<unsigned int>(hi)) << 32)
        | static_cast<unsigned int>(lo));
}

// ---- integer and bit intrinsics -------------------------------------------------------

inline int __clzll(long long x) {
    return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x));
}
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned int __brev(unsigned int x) {
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
    x = ((x >> 8) & 0x00ff00ffu) | ((x & 0x00ff00ffu) << 8);
    return (x >> 16) | (x << 16);
}
inline unsigned long long __brevll(unsigned long long x) {
    return (static_cast<unsigned long long>(__brev(static_cast<unsigned int>(x))) << 32)
           | __brev(static_cast<unsigned int>(x >> 32));
}
inline unsigned int __byte_perm(unsigned int x, unsigned int y, unsigned int s) {
    const unsigned long long bytes = (static_cast<unsigned long long>(y) << 32) | x;
    unsigned int out = 0;
    for (int k = 0; k < 4; ++k) {
        const unsigned int pick = (s >> (4 * k)) & 7u;
        out |= static_cast<unsigned int>((bytes >> (8 * pick)) & 0xffu) << (8 * k);
    }
    return out;
}
inline unsigned int __funnelshift_l(unsigned int lo, unsigned int hi, unsigned int s) {
    const unsigned long long v = (static_cast<unsigned long long>(hi) << 32) | lo;
    return static_cast<unsigned int>((v << (s & 31u)) >> 32);
}
inline unsigned int __funnelshift_lc(unsigned int lo, unsigned int hi, unsigned int s) {
    const unsigned long long v = (static_cast<unsigned long long>(hi) << 32) | lo;
    return static_cast<unsigned int>((v << (s < 32u ? s : 32u)) >> 32);
}
inline unsigned int __funnelshift_r(unsigned int lo, unsigned int hi, unsigned int s) {
    const unsigned long long v = (static_cast<unsigned long long>(hi) << 32) | lo;
    return static_cast<unsigned int>(v >> (s & 31u));
}
inline unsigned int __funnelshift_rc(unsigned int lo, unsigned int hi, unsigned int s) {
    const unsigned long long v = (static_cast<unsigned long long>(hi) << 32) | lo;
    return static_cast<unsigned int>(v >> (s < 32u ? s : 32u));
}
inline int __mul24(int a, int b) {  // the low 24 bits of each, signed
    const auto low24 = [](int v) {
        return static_cast<int>(static_cast<unsigned int>(v) << 8) >> 8;
    };
    return static_cast<int>(static_cast<long long>(low24(a)) * low24(b));
}
inline unsigned int __umul24(unsigned int a, unsigned int b) {
    return (a & 0xffffffu) * (b & 0xffffffu);
}
inline int __mulhi(int a, int b) {
    return static_cast<int>((static_cast<long long>(a) * b) >> 32);
}
inline unsigned int __umulhi(unsigned int a, unsigned int b) {
    return static_cast<unsigned int>((static_cast<unsigned long long>(a) * b) >> 32);
}
inline long long __mul64hi(long long a, long long b) {
    return static_cast<long long>((static_cast<__int128>(a) * b) >> 64);
}
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return static_cast<unsigned long long>(
        (static_cast<unsigned __int128>(a) * b) >> 64);
}
inline unsigned int __sad(int x, int y, unsigned int z) {
    return (x > y ? static_cast<unsigned int>(x) - static_cast<unsigned int>(y)
                  : static_cast<unsigned int>(y) - static_cast<unsigned int>(x)) + z;
}
inline unsigned int __usad(unsigned int x, unsigned int y, unsigned int z) {
    return (x > y ? x - y : y - x) + z;
}
inline int __hadd(int a, int b) {
    return static_cast<int>((static_cast<long long>(a) + b) >> 1);
}
inline int __rhadd(int a, int b) {
    return static_cast<int>((static_cast<long long>(a) + b + 1) >> 1);
}
inline unsigned int __uhadd(unsigned int a, unsigned int b) {
    return static_cast<unsigned int>((static_cast<unsigned long long>(a) + b) >> 1);
}
inline unsigned int __urhadd(unsigned int a, unsigned int b) {
    return static_cast<unsigned int>((static_cast<unsigned long long>(a) + b + 1) >> 1);
}

// CUDA's min and max for unsigned, mixed-sign and mixed-precision arguments
// (the named ones are cuda_emu.h's overloads under CUDA's names).
inline unsigned int umin(unsigned int a, unsigned int b) { return min(a, b); }
inline unsigned int umax(unsigned int a, unsigned int b) { return max(a, b); }
inline long long llmin(long long a, long long b) { return min(a, b); }
inline long long llmax(long long a, long long b) { return max(a, b); }
inline unsigned long long ullmin(unsigned long long a, unsigned long long b) {
    return min(a, b);
}
inline unsigned long long ullmax(unsigned long long a, unsigned long long b) {
    return max(a, b);
}
inline unsigned int min(int a, unsigned int b) { return umin(static_cast<unsigned>(a), b); }
inline unsigned int min(unsigned int a, int b) { return umin(a, static_cast<unsigned>(b)); }
inline unsigned int max(int a, unsigned int b) { return umax(static_cast<unsigned>(a), b); }
inline unsigned int max(unsigned int a, int b) { return umax(a, static_cast<unsigned>(b)); }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }
inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
inline unsigned long max(unsigned long a, unsigned long b) { return a > b ? a : b; }
inline unsigned long long min(long long a, unsigned long long b) {
    return ullmin(static_cast<unsigned long long>(a), b);
}
inline unsigned long long min(unsigned long long a, long long b) {
    return ullmin(a, static_cast<unsigned long long>(b));
}
inline unsigned long long max(long long a, unsigned long long b) {
    return ullmax(static_cast<unsigned long long>(a), b);
}
inline unsigned long long max(unsigned long long a, long long b) {
    return ullmax(a, static_cast<unsigned long long>(b));
}
inline double min(float a, double b) { return std::fmin(a, b); }
inline double min(double a, float b) { return std::fmin(a, b); }
inline double max(float a, double b) { return std::fmax(a, b); }
inline double max(double a, float b) { return std::fmax(a, b); }

// ---- math the C++ library lacks ---------------------------------------------------------

inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float rcbrtf(float x) { return 1.0f / std::cbrt(x); }
inline double rcbrt(double x) { return 1.0 / std::cbrt(x); }
inline float sinpif(float x) { return static_cast<float>(std::sin(M_PI * x)); }
inline double sinpi(double x) { return std::sin(M_PI * x); }
inline float cospif(float x) { return static_cast<float>(std::cos(M_PI * x)); }
inline double cospi(double x) { return std::cos(M_PI * x); }
inline void sincospif(float x, float* s, float* c) { *s = sinpif(x); *c = cospif(x); }
inline void sincospi(double x, double* s, double* c) { *s = sinpi(x); *c = cospi(x); }
inline float normcdff(float x) { return 0.5f * std::erfc(-x * static_cast<float>(M_SQRT1_2)); }
inline double normcdf(double x) { return 0.5 * std::erfc(-x * M_SQRT1_2); }
inline double erfinv(double y) {
    // Newton on erf(x) = y from a rational start (Giles' single-precision
    // approximation); a few steps reach double precision.
    if (y <= -1.0) return y == -1.0 ? -INFINITY : NAN;
    if (y >= 1.0) return y == 1.0 ? INFINITY : NAN;
    const double w = -std::log((1.0 - y) * (1.0 + y));
    double x;
    if (w < 5.0) {
        const double t = w - 2.5;
        double p = 2.81022636e-08;
        for (double c : {3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                         -0.00125372503, -0.00417768164, 0.246640727, 1.50140941})
            p = c + p * t;
        x = p * y;
    } else {
        const double t = std::sqrt(w) - 3.0;
        double p = -0.000200214257;
        for (double c : {0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
                         -0.0076224613, 0.00943887047, 1.00167406, 2.83297682})
            p = c + p * t;
        x = p * y;
    }
    for (int k = 0; k < 3; ++k)
        x -= (std::erf(x) - y) / (2.0 / std::sqrt(M_PI) * std::exp(-x * x));
    return x;
}
inline float erfinvf(float y) { return static_cast<float>(erfinv(y)); }
inline double erfcinv(double y) { return erfinv(1.0 - y); }
inline float erfcinvf(float y) { return static_cast<float>(erfcinv(y)); }
inline double normcdfinv(double p) { return -M_SQRT2 * erfcinv(2.0 * p); }
inline float normcdfinvf(float p) { return static_cast<float>(normcdfinv(p)); }
inline double erfcx(double x) { return std::exp(x * x) * std::erfc(x); }
inline float erfcxf(float x) { return static_cast<float>(erfcx(x)); }
inline float norm3df(float a, float b, float c) {
    return static_cast<float>(std::sqrt(double(a) * a + double(b) * b + double(c) * c));
}
inline double norm3d(double a, double b, double c) { return std::sqrt(a * a + b * b + c * c); }
inline float norm4df(float a, float b, float c, float d) {
    return static_cast<float>(
        std::sqrt(double(a) * a + double(b) * b + double(c) * c + double(d) * d));
}
inline double norm4d(double a, double b, double c, double d) {
    return std::sqrt(a * a + b * b + c * c + d * d);
}
inline float rnorm3df(float a, float b, float c) { return 1.0f / norm3df(a, b, c); }
inline double rnorm3d(double a, double b, double c) { return 1.0 / norm3d(a, b, c); }
inline float rnorm4df(float a, float b, float c, float d) {
    return 1.0f / norm4df(a, b, c, d);
}
inline double rnorm4d(double a, double b, double c, double d) {
    return 1.0 / norm4d(a, b, c, d);
}
inline float rhypotf(float a, float b) { return 1.0f / std::hypot(a, b); }
inline double rhypot(double a, double b) { return 1.0 / std::hypot(a, b); }
inline float fdividef(float a, float b) { return a / b; }
inline float __exp10f(float x) { return std::pow(10.0f, x); }
inline float __log2f(float x) { return std::log2(x); }
inline float __log10f(float x) { return std::log10(x); }
inline float __tanf(float x) { return std::tan(x); }
inline float __tanhf(float x) { return std::tanh(x); }
inline void __sincosf(float x, float* s, float* c) { *s = std::sin(x); *c = std::cos(x); }
inline void sincosf(float x, float* s, float* c) { *s = std::sin(x); *c = std::cos(x); }
inline void sincos(double x, double* s, double* c) { *s = std::sin(x); *c = std::cos(x); }
// The classification functions under their device names (C++ has them in std).
using std::isfinite;
using std::isinf;
using std::isnan;
using std::signbit;

// ---- block votes, warp reductions, the active mask ---------------------------------------

namespace gh_emu {
// Every thread's `value` combined over the block by `op`, at a barrier (a
// __syncthreads as well, as the device's are).
template <typename Op>
int block_vote(int value, Op op, const char* name, int line) {
    Block& block = *current_block;
    const unsigned int tid = linear_thread();
    block.exchange[tid] = static_cast<std::uint64_t>(value != 0);
    block.barrier.wait(name, line);
    int acc = static_cast<int>(block.exchange[0]);
    for (std::size_t k = 1; k < block.exchange.size(); ++k)
        acc = op(acc, static_cast<int>(block.exchange[k]));
    block.barrier.wait(name, line);
    return acc;
}
template <typename T, typename Op>
T warp_reduce(unsigned int mask, T value, Op op, const char* name, int line) {
    T acc = shuffle(mask, value, 0, name, line);
    for (int k = 1; k < warpSize; ++k) acc = op(acc, shuffle(mask, value, k, name, line));
    return acc;
}
}  // namespace gh_emu

inline int __syncthreads_count(int p, int line = __builtin_LINE()) {
    return gh_emu::block_vote(p, [](int a, int b) { return a + b; },
                              "__syncthreads_count", line);
}
inline int __syncthreads_and(int p, int line = __builtin_LINE()) {
    return gh_emu::block_vote(p, [](int a, int b) { return a & b; },
                              "__syncthreads_and", line);
}
inline int __syncthreads_or(int p, int line = __builtin_LINE()) {
    return gh_emu::block_vote(p, [](int a, int b) { return a | b; },
                              "__syncthreads_or", line);
}
inline unsigned int __activemask() { return 0xffffffffu; }  // full warps only
#define GH_WARP_REDUCE(NAME, T, EXPR)                                              \
    inline T __reduce_##NAME##_sync(unsigned int mask, T v, int line = __builtin_LINE()) { \
        return gh_emu::warp_reduce(mask, v, [](T a, T b) { return EXPR; },         \
                                   "__reduce_" #NAME "_sync", line);               \
    }
GH_WARP_REDUCE(add, unsigned int, a + b)
GH_WARP_REDUCE(add, int, a + b)
GH_WARP_REDUCE(min, unsigned int, a < b ? a : b)
GH_WARP_REDUCE(min, int, a < b ? a : b)
GH_WARP_REDUCE(max, unsigned int, a > b ? a : b)
GH_WARP_REDUCE(max, int, a > b ? a : b)
GH_WARP_REDUCE(and, unsigned int, a & b)
GH_WARP_REDUCE(or, unsigned int, a | b)
GH_WARP_REDUCE(xor, unsigned int, a ^ b)
#undef GH_WARP_REDUCE

inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// Cache-hinted loads and stores: plain ones on the host.
template <typename T> T __ldcg(const T* p) { return *p; }
template <typename T> T __ldca(const T* p) { return *p; }
template <typename T> T __ldcs(const T* p) { return *p; }
template <typename T> T __ldlu(const T* p) { return *p; }
template <typename T> T __ldcv(const T* p) { return *p; }
template <typename T> void __stwb(T* p, T v) { *p = v; }
template <typename T> void __stcg(T* p, T v) { *p = v; }
template <typename T> void __stcs(T* p, T v) { *p = v; }
template <typename T> void __stwt(T* p, T v) { *p = v; }

#endif  // GH_CUDA_INTRINSICS_H
