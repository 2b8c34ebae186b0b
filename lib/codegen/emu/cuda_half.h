// cuda_half.h: the half and bfloat16 API of <cuda_fp16.h> and <cuda_bf16.h>
// that kernels commonly use, for the emulated host build (included by
// cuda_emu.h; it needs gh_emu's conversions defined there).
//
// The types hold the device's bits, so arrays of them read and write the same
// bytes as numpy float16 (and as bfloat16 bits). As on the device they convert
// to and from float and the arithmetic types implicitly, and have the
// arithmetic and comparison operators and the __h* functions. Arithmetic is
// done in float and rounded once to the type, which is what the device does
// for + - * (a float holds the exact product of two halves and, barring a
// rare tie, rounds a sum as the device does); __hdiv, __hfma and the math
// functions may differ from the device in the last bit, within the spot
// check's tolerance. Rounding modes: _rn, _rz, _rd and _ru are exact.

#ifndef GH_CUDA_HALF_H
#define GH_CUDA_HALF_H

namespace gh_emu {

// One unit in the last place away from (+1) or towards (-1) zero, on the
// magnitude of the 16-bit pattern `h` (bit 15 the sign).
inline std::uint16_t step16(std::uint16_t h, int away) {
    const std::uint16_t sign = h & 0x8000u;
    const std::uint16_t mag = h & 0x7fffu;
    if (away < 0 && mag == 0) return h;
    return static_cast<std::uint16_t>(sign | (mag + away));
}

// `to` (round to nearest even) of `f`, then one step as the mode asks: 'n'
// nearest, 'z' towards zero, 'd' down, 'u' up. `back` converts bits to float.
template <typename To, typename Back>
std::uint16_t round16(float f, char mode, To to, Back back) {
    const std::uint16_t h = to(f);
    if (mode == 'n' || std::isnan(f)) return h;
    const float r = back(h);
    const bool negative = (h & 0x8000u) != 0;
    if (mode == 'z') return std::fabs(r) > std::fabs(f) ? step16(h, -1) : h;
    if (mode == 'd' && r > f) return step16(h, negative ? +1 : -1);
    if (mode == 'u' && r < f) return step16(h, negative ? -1 : +1);
    return h;
}

inline std::uint16_t half_bits(float f, char mode = 'n') {
    return round16(f, mode, float_to_half_bits, half_bits_to_float);
}
inline std::uint16_t bf16_bits(float f, char mode = 'n') {
    return round16(f, mode, float_to_bf16_bits, bf16_bits_to_float);
}

}  // namespace gh_emu

#define GH_HALF_TYPE(T, TO_BITS, TO_FLOAT)                                         \
    struct T {                                                                     \
        std::uint16_t bits;                                                        \
        T() = default;                                                             \
        template <typename A,                                                      \
                  typename std::enable_if<std::is_arithmetic<A>::value, int>::type = 0> \
        T(A v) : bits(TO_BITS(static_cast<float>(v))) {}                           \
        operator float() const { return TO_FLOAT(bits); }                          \
        static T from_bits(std::uint16_t b) {                                      \
            T t;                                                                   \
            t.bits = b;                                                            \
            return t;                                                              \
        }                                                                          \
        T& operator+=(T o) { return *this = T(float(*this) + float(o)); }         \
        T& operator-=(T o) { return *this = T(float(*this) - float(o)); }         \
        T& operator*=(T o) { return *this = T(float(*this) * float(o)); }         \
        T& operator/=(T o) { return *this = T(float(*this) / float(o)); }         \
    };                                                                             \
    inline T operator+(T a, T b) { return T(float(a) + float(b)); }               \
    inline T operator-(T a, T b) { return T(float(a) - float(b)); }               \
    inline T operator*(T a, T b) { return T(float(a) * float(b)); }               \
    inline T operator/(T a, T b) { return T(float(a) / float(b)); }               \
    inline T operator-(T a) { return T::from_bits(a.bits ^ 0x8000u); }            \
    inline T operator+(T a) { return a; }                                          \
    inline bool operator==(T a, T b) { return float(a) == float(b); }             \
    inline bool operator!=(T a, T b) { return float(a) != float(b); }             \
    inline bool operator<(T a, T b) { return float(a) < float(b); }               \
    inline bool operator>(T a, T b) { return float(a) > float(b); }               \
    inline bool operator<=(T a, T b) { return float(a) <= float(b); }             \
    inline bool operator>=(T a, T b) { return float(a) >= float(b); }

GH_HALF_TYPE(__half, gh_emu::half_bits, gh_emu::half_bits_to_float)
GH_HALF_TYPE(__nv_bfloat16, gh_emu::bf16_bits, gh_emu::bf16_bits_to_float)
#undef GH_HALF_TYPE

typedef __half half;
typedef __nv_bfloat16 nv_bfloat16;

struct alignas(4) __half2 {
    __half x, y;
};
struct alignas(4) __nv_bfloat162 {
    __nv_bfloat16 x, y;
};
typedef __half2 half2;
typedef __nv_bfloat162 nv_bfloat162;

static_assert(sizeof(__half) == 2 && sizeof(__nv_bfloat16) == 2 &&
                  sizeof(__half2) == 4 && sizeof(__nv_bfloat162) == 4,
              "half types must have the device's sizes");
static_assert(std::is_trivially_copyable<__half>::value &&
                  std::is_trivially_default_constructible<__half>::value,
              "half arrays are raw bytes");

// ---- conversions -------------------------------------------------------------

inline float __half2float(__half h) { return gh_emu::half_bits_to_float(h.bits); }
inline float __bfloat162float(__nv_bfloat16 b) {
    return gh_emu::bf16_bits_to_float(b.bits);
}
inline __half __float2half(float f) { return __half::from_bits(gh_emu::half_bits(f)); }
inline __nv_bfloat16 __float2bfloat16(float f) {
    return __nv_bfloat16::from_bits(gh_emu::bf16_bits(f));
}
inline __half __double2half(double d) { return __float2half(static_cast<float>(d)); }
inline __nv_bfloat16 __double2bfloat16(double d) {
    return __float2bfloat16(static_cast<float>(d));
}

#define GH_FROM_FLOAT(M)                                                           \
    inline __half __float2half_r##M(float f) {                                     \
        return __half::from_bits(gh_emu::half_bits(f, #M[0]));                     \
    }                                                                              \
    inline __nv_bfloat16 __float2bfloat16_r##M(float f) {                          \
        return __nv_bfloat16::from_bits(gh_emu::bf16_bits(f, #M[0]));              \
    }
GH_FROM_FLOAT(n)
GH_FROM_FLOAT(z)
GH_FROM_FLOAT(d)
GH_FROM_FLOAT(u)
#undef GH_FROM_FLOAT


// __int2half_rn, __half2int_rz, __ull2bfloat16_rd, ...: every integer type and
// rounding mode, both ways (integers to half go through float, exact to 2^24).
#define GH_INT_CONV(NAME, I, M)                                                    \
    inline __half __##NAME##2half_r##M(I v) {                                       \
        return __half::from_bits(gh_emu::half_bits(static_cast<float>(v), #M[0])); \
    }                                                                              \
    inline __nv_bfloat16 __##NAME##2bfloat16_r##M(I v) {                            \
        return __nv_bfloat16::from_bits(                                           \
            gh_emu::bf16_bits(static_cast<float>(v), #M[0]));                      \
    }                                                                              \
    inline I __half2##NAME##_r##M(__half h) {                                       \
        return gh_emu::to_int<I>(float(h), #M[0]);                             \
    }                                                                              \
    inline I __bfloat162##NAME##_r##M(__nv_bfloat16 h) {                            \
        return gh_emu::to_int<I>(float(h), #M[0]);                             \
    }
#define GH_INT_CONVS(NAME, I)                                                      \
    GH_INT_CONV(NAME, I, n) GH_INT_CONV(NAME, I, z) GH_INT_CONV(NAME, I, d)        \
    GH_INT_CONV(NAME, I, u)
GH_INT_CONVS(int, int)
GH_INT_CONVS(uint, unsigned int)
GH_INT_CONVS(short, short)
GH_INT_CONVS(ushort, unsigned short)
GH_INT_CONVS(ll, long long)
GH_INT_CONVS(ull, unsigned long long)
#undef GH_INT_CONVS
#undef GH_INT_CONV

inline unsigned short __half_as_ushort(__half h) { return h.bits; }
inline short __half_as_short(__half h) { return static_cast<short>(h.bits); }
inline __half __ushort_as_half(unsigned short b) { return __half::from_bits(b); }
inline __half __short_as_half(short b) {
    return __half::from_bits(static_cast<std::uint16_t>(b));
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.bits; }
inline short __bfloat16_as_short(__nv_bfloat16 h) { return static_cast<short>(h.bits); }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short b) {
    return __nv_bfloat16::from_bits(b);
}
inline __nv_bfloat16 __short_as_bfloat16(short b) {
    return __nv_bfloat16::from_bits(static_cast<std::uint16_t>(b));
}

// ---- scalar arithmetic, comparisons and math, for both types -------------------

#define GH_SCALAR_API(T)                                                           \
    inline T __hadd(T a, T b) { return a + b; }                                    \
    inline T __hsub(T a, T b) { return a - b; }                                    \
    inline T __hmul(T a, T b) { return a * b; }                                    \
    inline T __hdiv(T a, T b) { return a / b; }                                    \
    inline T __hfma(T a, T b, T c) { return T(std::fma(float(a), float(b), float(c))); } \
    inline T __hneg(T a) { return -a; }                                            \
    inline T __habs(T a) { return T::from_bits(a.bits & 0x7fffu); }                \
    inline T __hmax(T a, T b) { return T(std::fmax(float(a), float(b))); }        \
    inline T __hmin(T a, T b) { return T(std::fmin(float(a), float(b))); }        \
    inline bool __heq(T a, T b) { return a == b; }                                 \
    inline bool __hne(T a, T b) { return a != b; }                                 \
    inline bool __hlt(T a, T b) { return a < b; }                                  \
    inline bool __hle(T a, T b) { return a <= b; }                                 \
    inline bool __hgt(T a, T b) { return a > b; }                                  \
    inline bool __hge(T a, T b) { return a >= b; }                                 \
    inline bool __hisnan(T a) { return std::isnan(float(a)); }                     \
    inline int __hisinf(T a) {                                                     \
        const float f = float(a);                                                  \
        return std::isinf(f) ? (f > 0 ? 1 : -1) : 0;                               \
    }                                                                              \
    inline T hsqrt(T a) { return T(std::sqrt(float(a))); }                         \
    inline T hrsqrt(T a) { return T(1.0f / std::sqrt(float(a))); }                 \
    inline T hrcp(T a) { return T(1.0f / float(a)); }                              \
    inline T hexp(T a) { return T(std::exp(float(a))); }                           \
    inline T hexp2(T a) { return T(std::exp2(float(a))); }                         \
    inline T hexp10(T a) { return T(std::pow(10.0f, float(a))); }                  \
    inline T hlog(T a) { return T(std::log(float(a))); }                           \
    inline T hlog2(T a) { return T(std::log2(float(a))); }                         \
    inline T hlog10(T a) { return T(std::log10(float(a))); }                       \
    inline T hsin(T a) { return T(std::sin(float(a))); }                           \
    inline T hcos(T a) { return T(std::cos(float(a))); }                           \
    inline T htanh(T a) { return T(std::tanh(float(a))); }                         \
    inline T hceil(T a) { return T(std::ceil(float(a))); }                         \
    inline T hfloor(T a) { return T(std::floor(float(a))); }                       \
    inline T htrunc(T a) { return T(std::trunc(float(a))); }                       \
    inline T hrint(T a) { return T(std::nearbyint(float(a))); }
GH_SCALAR_API(__half)
GH_SCALAR_API(__nv_bfloat16)
#undef GH_SCALAR_API

// ---- pairs -------------------------------------------------------------------------

#define GH_PAIR_API(T, T2, F2T, PAIR, FLOATS2, FLOAT2, PAIR2FLOAT2, MAKE)         \
    inline T2 PAIR(T a, T b) { return T2{a, b}; }                                  \
    inline T2 MAKE(T a, T b) { return T2{a, b}; }                                  \
    inline T2 FLOATS2(float a, float b) { return T2{F2T(a), F2T(b)}; }             \
    inline T2 FLOAT2(float a) { return T2{F2T(a), F2T(a)}; }                       \
    inline float2 PAIR2FLOAT2(T2 h) { return float2{float(h.x), float(h.y)}; }    \
    inline float __low2float(T2 h) { return float(h.x); }                          \
    inline float __high2float(T2 h) { return float(h.y); }                         \
    inline T2 __lowhigh2highlow(T2 h) { return T2{h.y, h.x}; }                     \
    inline T2 __hadd2(T2 a, T2 b) { return T2{a.x + b.x, a.y + b.y}; }             \
    inline T2 __hsub2(T2 a, T2 b) { return T2{a.x - b.x, a.y - b.y}; }             \
    inline T2 __hmul2(T2 a, T2 b) { return T2{a.x * b.x, a.y * b.y}; }             \
    inline T2 __h2div(T2 a, T2 b) { return T2{a.x / b.x, a.y / b.y}; }             \
    inline T2 __hfma2(T2 a, T2 b, T2 c) {                                          \
        return T2{__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)};                   \
    }                                                                              \
    inline T2 __hneg2(T2 a) { return T2{-a.x, -a.y}; }                             \
    inline T2 __habs2(T2 a) { return T2{__habs(a.x), __habs(a.y)}; }               \
    inline T2 __hmax2(T2 a, T2 b) { return T2{__hmax(a.x, b.x), __hmax(a.y, b.y)}; } \
    inline T2 __hmin2(T2 a, T2 b) { return T2{__hmin(a.x, b.x), __hmin(a.y, b.y)}; } \
    inline T2 operator+(T2 a, T2 b) { return __hadd2(a, b); }                      \
    inline T2 operator-(T2 a, T2 b) { return __hsub2(a, b); }                      \
    inline T2 operator*(T2 a, T2 b) { return __hmul2(a, b); }                      \
    inline T2 operator/(T2 a, T2 b) { return __h2div(a, b); }                      \
    inline T2& operator+=(T2& a, T2 b) { return a = a + b; }                       \
    inline T2& operator-=(T2& a, T2 b) { return a = a - b; }                       \
    inline T2& operator*=(T2& a, T2 b) { return a = a * b; }

GH_PAIR_API(__half, __half2, __float2half, __halves2half2, __floats2half2_rn,
            __float2half2_rn, __half22float2, make_half2)
GH_PAIR_API(__nv_bfloat16, __nv_bfloat162, __float2bfloat16, __halves2bfloat162,
            __floats2bfloat162_rn, __float2bfloat162_rn, __bfloat1622float2,
            make_bfloat162)
#undef GH_PAIR_API

inline __half __low2half(__half2 h) { return h.x; }
inline __half __high2half(__half2 h) { return h.y; }
inline __half2 __half2half2(__half h) { return __half2{h, h}; }
inline __half2 __lows2half2(__half2 a, __half2 b) { return __half2{a.x, b.x}; }
inline __half2 __highs2half2(__half2 a, __half2 b) { return __half2{a.y, b.y}; }
inline __nv_bfloat16 __low2bfloat16(__nv_bfloat162 h) { return h.x; }
inline __nv_bfloat16 __high2bfloat16(__nv_bfloat162 h) { return h.y; }
inline __nv_bfloat162 __bfloat162bfloat162(__nv_bfloat16 h) {
    return __nv_bfloat162{h, h};
}
inline __nv_bfloat162 __lows2bfloat162(__nv_bfloat162 a, __nv_bfloat162 b) {
    return __nv_bfloat162{a.x, b.x};
}
inline __nv_bfloat162 __highs2bfloat162(__nv_bfloat162 a, __nv_bfloat162 b) {
    return __nv_bfloat162{a.y, b.y};
}

// ---- atomics -------------------------------------------------------------------------

inline __half atomicAdd(__half* address, __half value) {
    return gh_emu::cas_add(address, value);
}
inline __nv_bfloat16 atomicAdd(__nv_bfloat16* address, __nv_bfloat16 value) {
    return gh_emu::cas_add(address, value);
}
inline __half2 atomicAdd(__half2* address, __half2 value) {
    return gh_emu::cas_add(address, value);
}
inline __nv_bfloat162 atomicAdd(__nv_bfloat162* address, __nv_bfloat162 value) {
    return gh_emu::cas_add(address, value);
}

#endif  // GH_CUDA_HALF_H
