// gpuhive/decision.hpp -- a GPUHive decision read from C++ and CUDA host code.
//
// Header-only, C++17, no dependency beyond the standard library (and popen for
// gpuhive::decide). It mirrors lib/contract.py and split_rows in
// lib/platform/workloads.py:
//
//   * a strict JSON reader (RFC 8259 as Python's json reads it: NaN, Infinity
//     and duplicate keys refused, integers and floats kept apart);
//   * gpuhive::Task and gpuhive::Decision, checked field by field in the order
//     TaskSpec.from_json and Decision.from_json check them, so an error names
//     the same field ("dims.M", "shares[1]", "decision.gpus") with the same
//     one-line message where the value's Python repr allows;
//   * canonical_json / config_hash: byte for byte the text Python hashes
//     (sorted keys, no spaces, shares as Python's float repr), and SHA-256;
//   * verify(): the decision's config_hash against the recomputed one;
//   * shards(): each device's rows [begin, end), exactly as split_rows cuts
//     them (math.fsum, the same double operations, largest remainders).
//
// Numbers: a share is read as the nearest double (std::from_chars) and written
// as the shortest text that reads back to it (std::to_chars), laid out the
// way Python's float repr lays it out. Do not compile with -ffast-math (the
// header refuses to): the row split depends on IEEE double arithmetic.
//
// Errors throw gpuhive::ContractError: what() is "field: problem", one line.
//
// See kernels/gpuhive/README.md for how to ask gpuhive for a decision.

#ifndef GPUHIVE_DECISION_HPP
#define GPUHIVE_DECISION_HPP

#if defined(__FAST_MATH__)
#error "gpuhive/decision.hpp needs IEEE double arithmetic; compile without -ffast-math"
#endif

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#if !defined(_WIN32)
#include <sys/wait.h>
#endif

namespace gpuhive {

// ---------------------------------------------------------------- vocabulary

inline constexpr int kMaxDevices = 64;                 // MAX_DEVICES
inline constexpr long long kMaxChunk = 1LL << 40;      // MAX_CHUNK
inline constexpr long long kMaxBlock = 1LL << 16;      // MAX_BLOCK
inline constexpr long long kMaxDim = 2147483647LL;     // MAX_DIM
inline constexpr double kShareSumTol = 1e-9;           // Gate 1's SHARE_SUM_TOL
inline constexpr std::size_t kHashHexLen = 64;         // HASH_HEX_LEN
inline constexpr int kMaxDepth = 1000;                 // JSON nesting (Python's recursion limit)

/// One workload kind: its dimensions in order and the merge of its split.
struct KindInfo {
    const char* kind;
    std::array<const char*, 3> dims;
    int ndims;
    const char* merge;  // the one (divisible_dim 0, merge) pair each kind supports
};

inline constexpr std::array<KindInfo, 5> kKinds{{
    {"matmul", {"M", "N", "K"}, 3, "concat"},
    {"reduce", {"N", nullptr, nullptr}, 1, "sum"},
    {"elementwise", {"N", nullptr, nullptr}, 1, "concat"},
    {"stencil", {"H", "W", "T"}, 3, "concat"},
    {"histogram", {"N", "B", nullptr}, 2, "sum"},
}};
inline constexpr std::array<const char*, 5> kKindNames{
    "matmul", "reduce", "elementwise", "stencil", "histogram"};
inline constexpr std::array<const char*, 4> kDtypes{"fp16", "bf16", "fp32", "fp64"};
inline constexpr std::array<const char*, 2> kMerges{"concat", "sum"};
inline constexpr std::array<const char*, 3> kModes{"single", "split", "pipelined"};
inline constexpr std::array<const char*, 3> kCommPaths{"host", "p2p", "nccl"};
inline constexpr std::array<const char*, 5> kTaskFields{
    "kind", "dims", "dtype", "divisible_dim", "merge"};
inline constexpr std::array<const char*, 7> kDecisionFields{
    "gpus", "shares", "chunk", "block", "mode", "comm_path", "config_hash"};

// -------------------------------------------------------------------- errors

/// A task or decision that breaks the contract, or a hash that does not match.
/// what() is "field: problem" (ContractError in lib/contract.py).
class ContractError : public std::runtime_error {
public:
    ContractError(std::string field, std::string problem)
        : std::runtime_error(field + ": " + problem),
          field_(std::move(field)), problem_(std::move(problem)) {}
    /// Dotted path of the offending field ("dims.M", "shares[1]", "json").
    const std::string& field() const noexcept { return field_; }
    const std::string& problem() const noexcept { return problem_; }

private:
    std::string field_, problem_;
};

// ------------------------------------------------------------------- objects

/// What to compute (TaskSpec).
struct Task {
    std::string kind;
    /// Name -> size, in the kind's order (matmul: M, N, K).
    std::vector<std::pair<std::string, long long>> dims;
    std::string dtype = "fp32";
    int divisible_dim = 0;
    std::string merge;

    /// Name of the divisible dimension ("M" for matmul).
    const std::string& split_name() const { return dims.at(divisible_dim).first; }
    /// Size of the divisible dimension: what shares are shares of.
    long long split_size() const { return dims.at(divisible_dim).second; }
    /// The size of dimension ``name``.
    long long dim(std::string_view name) const {
        for (const auto& d : dims)
            if (d.first == name) return d.second;
        throw ContractError("dims." + std::string(name), "no such dimension");
    }
    /// Bytes per element of dtype.
    int itemsize() const {
        return dtype == "fp64" ? 8 : dtype == "fp32" ? 4 : 2;
    }
};

/// How a task is spread over devices (Decision).
struct Decision {
    std::vector<int> gpus;
    std::vector<double> shares;
    long long chunk = 0;
    int block = 256;
    std::string mode = "split";
    std::string comm_path = "host";
    std::string config_hash;  ///< empty when the JSON had none
};

/// One device's contiguous rows of the divisible dimension, [begin, end).
struct Shard {
    int device;
    long long begin, end;
    long long rows() const { return end - begin; }
};

/// What `gpuhive explain --json` prints, the parts a launcher needs.
struct Plan {
    Task task;
    Decision decision;
    std::string machine;  ///< empty when the document had none
    std::string policy;   ///< empty when the document had none
};

namespace detail {

// ------------------------------------------------------------------- SHA-256

class Sha256 {
public:
    Sha256() = default;
    void update(const unsigned char* p, std::size_t n) {
        total_ += n;
        while (n > 0) {
            std::size_t take = std::min<std::size_t>(64 - used_, n);
            std::memcpy(buf_ + used_, p, take);
            used_ += take; p += take; n -= take;
            if (used_ == 64) { block(buf_); used_ = 0; }
        }
    }
    void update(std::string_view s) {
        update(reinterpret_cast<const unsigned char*>(s.data()), s.size());
    }
    std::string hex() {
        std::uint64_t bits = total_ * 8;
        unsigned char pad = 0x80;
        update(&pad, 1);
        unsigned char zero = 0;
        while (used_ != 56) update(&zero, 1);
        unsigned char len[8];
        for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(bits >> (56 - 8 * i));
        update(len, 8);
        static const char* digits = "0123456789abcdef";
        std::string out;
        for (std::uint32_t w : h_)
            for (int s = 28; s >= 0; s -= 4) out += digits[(w >> s) & 0xF];
        return out;
    }

private:
    static std::uint32_t rotr(std::uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }
    void block(const unsigned char* p) {
        static constexpr std::uint32_t k[64] = {
            0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1,
            0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3,
            0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
            0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
            0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147,
            0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
            0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
            0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
            0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
            0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
            0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
        std::uint32_t w[64];
        for (int i = 0; i < 16; ++i)
            w[i] = std::uint32_t(p[4 * i]) << 24 | std::uint32_t(p[4 * i + 1]) << 16 |
                   std::uint32_t(p[4 * i + 2]) << 8 | std::uint32_t(p[4 * i + 3]);
        for (int i = 16; i < 64; ++i) {
            std::uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
            std::uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16] + s0 + w[i - 7] + s1;
        }
        std::uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5],
                      g = h_[6], h = h_[7];
        for (int i = 0; i < 64; ++i) {
            std::uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) +
                               ((e & f) ^ (~e & g)) + k[i] + w[i];
            std::uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) +
                               ((a & b) ^ (a & c) ^ (b & c));
            h = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
        }
        h_[0] += a; h_[1] += b; h_[2] += c; h_[3] += d;
        h_[4] += e; h_[5] += f; h_[6] += g; h_[7] += h;
    }
    std::uint32_t h_[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                           0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    unsigned char buf_[64] = {};
    std::size_t used_ = 0;
    std::uint64_t total_ = 0;
};

// ------------------------------------------------------ Python float repr

/// Python's repr of a double: the shortest digits that read back to it, in
/// fixed notation when the decimal exponent is in [-4, 16), else "de[+-]XX".
inline std::string py_float_repr(double x) {
    if (std::isnan(x)) return "nan";
    if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
    if (x == 0) return std::signbit(x) ? "-0.0" : "0.0";
    char buf[64];
    auto res = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
    std::string_view sci(buf, static_cast<std::size_t>(res.ptr - buf));  // -d.ddde-XX
    std::string out = sci[0] == '-' ? "-" : "";
    if (sci[0] == '-') sci.remove_prefix(1);
    std::size_t epos = sci.find('e');
    std::string digits;
    for (char c : sci.substr(0, epos))
        if (c != '.') digits += c;
    int exp10 = std::atoi(std::string(sci.substr(epos + 1)).c_str());
    int decpt = exp10 + 1;  // value = 0.DIGITS x 10^decpt
    int n = static_cast<int>(digits.size());
    if (decpt <= -4 || decpt > 16) {
        out += digits[0];
        if (n > 1) out += "." + digits.substr(1);
        return out + std::string(sci.substr(epos));  // "e-05", "e+16": sign, 2+ digits
    }
    if (decpt <= 0) return out + "0." + std::string(-decpt, '0') + digits;
    if (decpt >= n) return out + digits + std::string(decpt - n, '0') + ".0";
    return out + digits.substr(0, decpt) + "." + digits.substr(decpt);
}

/// A double as json.dumps writes it (NaN and the infinities spelled its way).
inline std::string json_float(double x) {
    if (std::isnan(x)) return "NaN";
    if (std::isinf(x)) return x < 0 ? "-Infinity" : "Infinity";
    return py_float_repr(x);
}

/// A string as json.dumps writes it (ensure_ascii): printable ASCII as is,
/// everything else escaped (\uXXXX, UTF-16 pairs above the BMP).
inline std::string json_string(std::string_view s) {
    std::string out = "\"";
    char tmp[16];
    for (std::size_t i = 0; i < s.size();) {
        unsigned char c = static_cast<unsigned char>(s[i]);
        std::uint32_t cp = c;
        std::size_t len = 1;
        if (c >= 0x80) {  // decode UTF-8 (WTF-8 surrogates included)
            len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
            cp = c & (len == 4 ? 0x07 : len == 3 ? 0x0F : 0x1F);
            for (std::size_t k = 1; k < len && i + k < s.size(); ++k)
                cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
        }
        i += len;
        switch (cp) {
            case '"': out += "\\\""; continue;
            case '\\': out += "\\\\"; continue;
            case '\n': out += "\\n"; continue;
            case '\r': out += "\\r"; continue;
            case '\t': out += "\\t"; continue;
            case '\b': out += "\\b"; continue;
            case '\f': out += "\\f"; continue;
            default: break;
        }
        if (cp >= 0x20 && cp < 0x7F) {
            out += static_cast<char>(cp);
        } else if (cp < 0x10000) {
            std::snprintf(tmp, sizeof tmp, "\\u%04x", static_cast<unsigned>(cp));
            out += tmp;
        } else {
            std::uint32_t v = cp - 0x10000;
            std::snprintf(tmp, sizeof tmp, "\\u%04x\\u%04x",
                          static_cast<unsigned>(0xD800 + (v >> 10)),
                          static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
            out += tmp;
        }
    }
    return out + "\"";
}

// ---------------------------------------------------------------------- JSON

/// One JSON value. Integers keep their text (Python's are unbounded).
struct Json {
    enum Type { Null, Bool, Int, Float, String, Array, Object };
    Type type = Null;
    bool boolean = false;
    double number = 0;              ///< Float: the nearest double
    std::string text;               ///< Int: the literal; String: UTF-8
    std::vector<Json> items;        ///< Array items; Object values
    std::vector<std::string> keys;  ///< Object keys, in document order

    const Json* get(std::string_view key) const {
        for (std::size_t i = 0; i < keys.size(); ++i)
            if (keys[i] == key) return &items[i];
        return nullptr;
    }
    bool has(std::string_view key) const { return get(key) != nullptr; }
    /// Python's truth value of the decoded object.
    bool truthy() const {
        switch (type) {
            case Null: return false;
            case Bool: return boolean;
            case Int: return text != "0" && text != "-0";
            case Float: return number != 0;
            case String: return !text.empty();
            default: return !items.empty();
        }
    }
};

/// Python's type name of the decoded value (for messages).
inline const char* type_name(const Json& v) {
    static const char* names[] = {"NoneType", "bool", "int", "float", "str", "list", "dict"};
    return names[v.type];
}

/// Digits of an integer literal, without its sign.
inline std::string_view int_digits(const Json& v) {
    std::string_view t = v.text;
    if (!t.empty() && t[0] == '-') t.remove_prefix(1);
    return t;
}

/// Python's repr of a str: quotes as Python picks them, backslash escapes for
/// what it does not print (controls, C1, NBSP, soft hyphen, line and paragraph
/// separators, lone surrogates).
inline std::string py_str_repr(std::string_view s) {
    bool dq = s.find('\'') != std::string_view::npos && s.find('"') == std::string_view::npos;
    char q = dq ? '"' : '\'';
    std::string out(1, q);
    char tmp[16];
    for (std::size_t i = 0; i < s.size();) {
        unsigned char c = static_cast<unsigned char>(s[i]);
        std::size_t len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
        std::uint32_t cp = len == 1 ? c : c & (len == 4 ? 0x07 : len == 3 ? 0x0F : 0x1F);
        for (std::size_t k = 1; k < len && i + k < s.size(); ++k)
            cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
        std::string_view raw = s.substr(i, len);
        i += len;
        if (cp == static_cast<unsigned char>(q) || cp == '\\') { out += '\\'; out += raw; }
        else if (cp == '\n') out += "\\n";
        else if (cp == '\r') out += "\\r";
        else if (cp == '\t') out += "\\t";
        else if (cp < 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD) {
            std::snprintf(tmp, sizeof tmp, "\\x%02x", static_cast<unsigned>(cp));
            out += tmp;
        } else if ((cp >= 0xD800 && cp <= 0xDFFF) || cp == 0x2028 || cp == 0x2029) {
            std::snprintf(tmp, sizeof tmp, "\\u%04x", static_cast<unsigned>(cp));
            out += tmp;
        } else out += raw;
    }
    return out + q;
}

/// Python's repr of the decoded value (lists and dicts written as Python does).
inline std::string py_repr(const Json& v) {
    switch (v.type) {
        case Json::Null: return "None";
        case Json::Bool: return v.boolean ? "True" : "False";
        case Json::Int: return v.text == "-0" ? "0" : v.text;
        case Json::Float: return py_float_repr(v.number);
        case Json::String: return py_str_repr(v.text);
        case Json::Array: {
            std::string out = "[";
            for (std::size_t i = 0; i < v.items.size() && out.size() < 80; ++i)
                out += (i ? ", " : "") + py_repr(v.items[i]);
            return out + "]";
        }
        default: {
            std::string out = "{";
            for (std::size_t i = 0; i < v.items.size() && out.size() < 80; ++i)
                out += (i ? ", " : "") + py_str_repr(v.keys[i]) + ": " + py_repr(v.items[i]);
            return out + "}";
        }
    }
}

/// ``s`` cut to ``n`` characters (code points), as Python's ``{x!r:.60}``.
inline std::string cut(const std::string& s, std::size_t n) {
    std::size_t count = 0;
    for (std::size_t i = 0; i < s.size(); ++i) {
        if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80 && count++ == n)
            return s.substr(0, i);
    }
    return s;
}

/// Bits of the integer whose decimal digits are ``d`` (int.bit_length).
inline long long bit_length(std::string_view d) {
    std::vector<std::uint32_t> limbs;  // little-endian base 2^32
    for (char c : d) {
        std::uint64_t carry = static_cast<std::uint64_t>(c - '0');
        for (auto& limb : limbs) {
            std::uint64_t x = static_cast<std::uint64_t>(limb) * 10 + carry;
            limb = static_cast<std::uint32_t>(x);
            carry = x >> 32;
        }
        if (carry) limbs.push_back(static_cast<std::uint32_t>(carry));
    }
    if (limbs.empty()) return 0;
    long long bits = 32LL * static_cast<long long>(limbs.size() - 1);
    for (std::uint32_t top = limbs.back(); top; top >>= 1) ++bits;
    return bits;
}

/// ``shown`` in lib/contract.py: an integer of 31 or more digits by its size.
inline std::string shown(const Json& v) {
    if (v.type == Json::Int && int_digits(v).size() > 30) {
        std::string_view d = int_digits(v);
        long long bits = bit_length(d);
        if (bits < 14000) return "an integer of " + std::to_string(d.size()) + " digits";
        long long about = static_cast<long long>(static_cast<double>(bits) * std::log10(2.0)) + 1;
        return "an integer of about " + std::to_string(about) + " digits";
    }
    return cut(py_repr(v), 60);
}

/// The strict reader: Python's json.loads with NaN, Infinity and duplicate
/// keys refused (lib.contract.loads_strict). Input must be UTF-8.
class Reader {
public:
    explicit Reader(std::string_view s) : s_(s) {}

    Json document() {
        check_utf8();
        if (s_.size() >= 3 && s_.substr(0, 3) == "\xEF\xBB\xBF")
            fail("Unexpected UTF-8 BOM (decode using utf-8-sig)", 0);
        skip_ws();
        Json v = value(0);
        skip_ws();
        if (pos_ != s_.size()) fail("Extra data", pos_);
        return v;
    }

private:
    [[noreturn]] void fail(const std::string& msg, std::size_t at) const {
        std::size_t line = 1, col = 1;
        for (std::size_t i = 0; i < at && i < s_.size(); ++i) {
            if (s_[i] == '\n') { ++line; col = 1; }
            else if ((static_cast<unsigned char>(s_[i]) & 0xC0) != 0x80) ++col;
        }
        throw ContractError("json", "not valid JSON: " + msg + " at line " +
                                        std::to_string(line) + " column " + std::to_string(col));
    }

    void check_utf8() const {
        const auto* p = reinterpret_cast<const unsigned char*>(s_.data());
        std::size_t n = s_.size();
        for (std::size_t i = 0; i < n;) {
            unsigned c = p[i];
            std::size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3
                                             : (c >> 3) == 30 ? 4 : 0;
            bool ok = len != 0 && i + len <= n;
            std::uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
            for (std::size_t k = 1; ok && k < len; ++k) {
                ok = (p[i + k] & 0xC0) == 0x80;
                cp = (cp << 6) | (p[i + k] & 0x3F);
            }
            static constexpr std::uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
            ok = ok && cp >= least[len] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
            if (!ok)
                throw ContractError("json", "not valid UTF-8 at byte " + std::to_string(i));
            i += len;
        }
    }

    void skip_ws() {
        while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' ||
                                    s_[pos_] == '\n' || s_[pos_] == '\r'))
            ++pos_;
    }
    bool starts(std::string_view w) const { return s_.substr(pos_, w.size()) == w; }
    static bool digit(char c) { return c >= '0' && c <= '9'; }

    Json value(int depth) {
        if (depth > kMaxDepth) throw ContractError("json", "nested too deeply");
        if (pos_ >= s_.size()) fail("Expecting value", pos_);
        char c = s_[pos_];
        Json v;
        if (c == '{') return object(depth);
        if (c == '[') return array(depth);
        if (c == '"') { v.type = Json::String; v.text = string(); return v; }
        if (starts("null")) { pos_ += 4; return v; }
        if (starts("true")) { pos_ += 4; v.type = Json::Bool; v.boolean = true; return v; }
        if (starts("false")) { pos_ += 5; v.type = Json::Bool; return v; }
        if (starts("NaN")) throw ContractError("json", "NaN is not allowed (numbers must be finite)");
        if (starts("Infinity"))
            throw ContractError("json", "Infinity is not allowed (numbers must be finite)");
        if (starts("-Infinity"))
            throw ContractError("json", "-Infinity is not allowed (numbers must be finite)");
        if (c == '-' || digit(c)) return number();
        fail("Expecting value", pos_);
    }

    // -?(0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?  -- Python's NUMBER_RE, greedy parts
    Json number() {
        std::size_t start = pos_, p = pos_;
        if (s_[p] == '-') ++p;
        if (p >= s_.size() || !digit(s_[p])) fail("Expecting value", start);
        if (s_[p] == '0') ++p;
        else while (p < s_.size() && digit(s_[p])) ++p;
        std::size_t int_end = p;
        bool is_float = false;
        if (p + 1 < s_.size() && s_[p] == '.' && digit(s_[p + 1])) {
            p += 2;
            while (p < s_.size() && digit(s_[p])) ++p;
            is_float = true;
        }
        if (p < s_.size() && (s_[p] == 'e' || s_[p] == 'E')) {
            std::size_t q = p + 1;
            if (q < s_.size() && (s_[q] == '+' || s_[q] == '-')) ++q;
            if (q < s_.size() && digit(s_[q])) {
                while (q < s_.size() && digit(s_[q])) ++q;
                p = q;
                is_float = true;
            }
        }
        pos_ = p;
        Json v;
        v.text = std::string(s_.substr(start, p - start));
        if (!is_float) {
            v.type = Json::Int;
            std::size_t ndigits = int_end - start - (s_[start] == '-');
            if (ndigits > 4300)
                throw ContractError("json", "not valid JSON: Exceeds the limit (4300 digits) "
                                            "for integer string conversion");
            return v;
        }
        v.type = Json::Float;
        v.number = to_double(v.text);
        return v;
    }

public:
    /// The nearest double to a JSON number literal (+-inf past the range, as
    /// Python's float() gives; +-0 or a subnormal below it).
    static double to_double(const std::string& t) {
        double d = 0;
        auto res = std::from_chars(t.data(), t.data() + t.size(), d);
        if (res.ec == std::errc()) return d;
        // Out of range: overflow or underflow? The decimal exponent says.
        bool neg = t[0] == '-';
        std::size_t i = neg, e = t.find_first_of("eE");
        std::string_view mant(t.data() + i, (e == std::string::npos ? t.size() : e) - i);
        long long exp10 = 0;
        if (e != std::string::npos) {
            std::size_t k = e + 1;
            bool eneg = t[k] == '-';
            if (t[k] == '+' || t[k] == '-') ++k;
            for (; k < t.size(); ++k) exp10 = std::min(exp10 * 10 + (t[k] - '0'), 100000000LL);
            if (eneg) exp10 = -exp10;
        }
        std::size_t dot = mant.find('.');
        std::string_view ip = mant.substr(0, dot);
        long long lead;  // power of ten of the first nonzero digit, before exp10
        if (ip.find_first_not_of('0') != std::string_view::npos) {
            lead = static_cast<long long>(ip.size() - ip.find_first_not_of('0')) - 1;
        } else {
            std::string_view fp = mant.substr(dot + 1);
            lead = -static_cast<long long>(fp.find_first_not_of('0')) - 1;
        }
        double mag = exp10 + lead >= 0 ? HUGE_VAL : 0.0;
        return neg ? -mag : mag;
    }

private:
    static void put_utf8(std::string& out, std::uint32_t cp) {
        if (cp < 0x80) {
            out += static_cast<char>(cp);
        } else if (cp < 0x800) {
            out += static_cast<char>(0xC0 | (cp >> 6));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            out += static_cast<char>(0xE0 | (cp >> 12));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        } else {
            out += static_cast<char>(0xF0 | (cp >> 18));
            out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        }
    }

    int hex4(std::size_t at) const {
        if (at + 4 > s_.size()) return -1;
        int v = 0;
        for (std::size_t k = at; k < at + 4; ++k) {
            char c = s_[k];
            int d = digit(c) ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                  : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
            if (d < 0) return -1;
            v = v * 16 + d;
        }
        return v;
    }

    std::string string() {
        std::size_t start = pos_++;
        std::string out;
        for (;;) {
            if (pos_ >= s_.size()) fail("Unterminated string starting at", start);
            char c = s_[pos_];
            if (c == '"') { ++pos_; return out; }
            if (static_cast<unsigned char>(c) < 0x20) fail("Invalid control character at", pos_);
            if (c != '\\') { out += c; ++pos_; continue; }
            if (pos_ + 1 >= s_.size()) fail("Unterminated string starting at", start);
            char e = s_[pos_ + 1];
            const char* simple = std::strchr("\"\\/bfnrt", e);
            if (e != 'u') {
                if (e == '\0' || simple == nullptr) fail("Invalid \\escape", pos_);
                out += "\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"];
                pos_ += 2;
                continue;
            }
            int cp = hex4(pos_ + 2);
            if (cp < 0) fail("Invalid \\uXXXX escape", pos_ + 1);
            pos_ += 6;
            if (cp >= 0xD800 && cp <= 0xDBFF && starts("\\u")) {
                int lo = hex4(pos_ + 2);
                if (lo < 0) fail("Invalid \\uXXXX escape", pos_ + 1);
                if (lo >= 0xDC00 && lo <= 0xDFFF) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    pos_ += 6;
                }
            }
            put_utf8(out, static_cast<std::uint32_t>(cp));
        }
    }

    Json array(int depth) {
        Json v;
        v.type = Json::Array;
        ++pos_;
        skip_ws();
        if (pos_ < s_.size() && s_[pos_] == ']') { ++pos_; return v; }
        for (;;) {
            skip_ws();
            v.items.push_back(value(depth + 1));
            skip_ws();
            if (pos_ < s_.size() && s_[pos_] == ']') { ++pos_; return v; }
            if (pos_ >= s_.size() || s_[pos_] != ',') fail("Expecting ',' delimiter", pos_);
            trailing_comma(']', "Illegal trailing comma before end of array");
        }
    }

    // After a ',' (pos_ on it): a closing bracket next is Python 3.13's
    // "Illegal trailing comma" at the comma (older Pythons say "Expecting
    // value" or "Expecting property name ..." after it).
    void trailing_comma(char close, const char* message) {
        std::size_t comma = pos_++;
        std::size_t p = pos_;
        while (p < s_.size() && (s_[p] == ' ' || s_[p] == '\t' || s_[p] == '\n' ||
                                 s_[p] == '\r'))
            ++p;
        if (p < s_.size() && s_[p] == close) fail(message, comma);
    }

    Json object(int depth) {
        Json v;
        v.type = Json::Object;
        ++pos_;
        skip_ws();
        if (pos_ < s_.size() && s_[pos_] == '}') { ++pos_; return v; }
        for (;;) {
            skip_ws();
            if (pos_ >= s_.size() || s_[pos_] != '"')
                fail("Expecting property name enclosed in double quotes", pos_);
            std::string key = string();
            skip_ws();
            if (pos_ >= s_.size() || s_[pos_] != ':') fail("Expecting ':' delimiter", pos_);
            ++pos_;
            skip_ws();
            v.keys.push_back(std::move(key));
            v.items.push_back(value(depth + 1));
            skip_ws();
            if (pos_ < s_.size() && s_[pos_] == '}') { ++pos_; break; }
            if (pos_ >= s_.size() || s_[pos_] != ',') fail("Expecting ',' delimiter", pos_);
            trailing_comma('}', "Illegal trailing comma before end of object");
        }
        // Like object_pairs_hook: duplicates are found once the object is read.
        for (std::size_t i = 0; i < v.keys.size(); ++i)
            for (std::size_t j = 0; j < i; ++j)
                if (v.keys[i] == v.keys[j]) throw ContractError(v.keys[i], "duplicate field");
        return v;
    }

    std::string_view s_;
    std::size_t pos_ = 0;
};

inline Json parse_json(std::string_view text) { return Reader(text).document(); }

// ------------------------------------------------------- strict value checks

template <std::size_t N>
inline std::string joined(const std::array<const char*, N>& words) {
    std::string out;
    for (const char* w : words) out += (out.empty() ? "" : ", ") + std::string(w);
    return out;
}

/// expect_int: an integer (not a bool, not a float) in [low, high].
inline long long expect_int(const Json& v, const std::string& field, long long low,
                            long long high) {
    if (v.type != Json::Int)
        throw ContractError(field, std::string("expected an integer, got ") + type_name(v) +
                                       " " + shown(v));
    long long value = 0;
    auto res = std::from_chars(v.text.data(), v.text.data() + v.text.size(), value);
    if (res.ec != std::errc() || value < low || value > high)
        throw ContractError(field, "must be in [" + std::to_string(low) + ", " +
                                       std::to_string(high) + "], got " + shown(v));
    return value;
}

/// expect_number: a finite int or float (not a bool), as a double.
inline double expect_number(const Json& v, const std::string& field) {
    if (v.type != Json::Int && v.type != Json::Float)
        throw ContractError(field, std::string("expected a number, got ") + type_name(v) +
                                       " " + shown(v));
    if (v.type == Json::Int) {
        // float(int): the nearest double; the integer zero is +0.0 even as "-0".
        double d = Reader::to_double(v.text);
        if (std::isinf(d))
            throw ContractError(field, "must be finite, got " + shown(v) +
                                           " (beyond the range of a double)");
        return d == 0 ? 0.0 : d;
    }
    if (!std::isfinite(v.number))
        throw ContractError(field, "must be finite, got " + py_float_repr(v.number));
    return v.number;
}

template <std::size_t N>
inline std::string expect_choice(const Json& v, const std::string& field,
                                 const std::array<const char*, N>& choices) {
    if (v.type != Json::String)
        throw ContractError(field, std::string("expected a string, got ") + type_name(v) +
                                       " " + shown(v));
    for (const char* c : choices)
        if (v.text == c) return v.text;
    throw ContractError(field, "unknown value " + cut(py_repr(v), 60) +
                                   "; expected one of " + joined(choices));
}

template <std::size_t N>
inline const Json& expect_fields(const Json& obj, const std::string& what,
                                 const std::array<const char*, N>& allowed,
                                 const char* optional = nullptr) {
    if (obj.type != Json::Object)
        throw ContractError(what, std::string("expected a JSON object, got ") + type_name(obj));
    for (const auto& k : obj.keys)
        if (std::find_if(allowed.begin(), allowed.end(),
                         [&](const char* a) { return k == a; }) == allowed.end())
            throw ContractError(what + "." + k, "unknown field");
    std::string required;  // named in the message, as Python's reader does
    for (const char* a : allowed)
        if (!(optional && std::strcmp(a, optional) == 0))
            required += (required.empty() ? "" : ", ") + std::string(a);
    for (const char* a : allowed)
        if (!obj.has(a) && !(optional && std::strcmp(a, optional) == 0))
            throw ContractError(what + "." + a, "missing field (a " + what + " has " +
                                                    required + ")");
    return obj;
}

inline const std::vector<Json>& expect_list(const Json& v, const std::string& field) {
    if (v.type != Json::Array)
        throw ContractError(field, std::string("expected a list, got ") + type_name(v));
    if (v.items.empty() || v.items.size() > static_cast<std::size_t>(kMaxDevices))
        throw ContractError(field, "must hold 1 to " + std::to_string(kMaxDevices) +
                                       " entries, got " + std::to_string(v.items.size()));
    return v.items;
}

inline const KindInfo& kind_info(const std::string& kind) {
    for (const auto& k : kKinds)
        if (kind == k.kind) return k;
    throw ContractError("kind", "unknown value " + py_str_repr(kind));
}

/// TaskSpec.__post_init__ over decoded values, in its order.
inline Task task_from_values(const Json& kind_v, const Json& dims_v, const Json& dtype_v,
                             const Json& dim_v, const Json& merge_v) {
    Task t;
    t.kind = expect_choice(kind_v, "kind", kKindNames);
    if (dims_v.type != Json::Object)
        throw ContractError("dims", std::string("expected an object of sizes, got ") +
                                        type_name(dims_v));
    const KindInfo& info = kind_info(t.kind);
    auto names = [&] {
        std::string out;
        for (int i = 0; i < info.ndims; ++i) out += (i ? ", " : "") + std::string(info.dims[i]);
        return out;
    };
    for (const auto& k : dims_v.keys) {
        bool known = false;
        for (int i = 0; i < info.ndims; ++i) known = known || k == info.dims[i];
        if (!known)
            throw ContractError("dims." + k, "unknown dimension for " + t.kind + "; " + t.kind +
                                                 " takes " + names());
    }
    for (int i = 0; i < info.ndims; ++i)
        if (!dims_v.has(info.dims[i]))
            throw ContractError(std::string("dims.") + info.dims[i],
                                "missing; " + t.kind + " needs " + names());
    for (int i = 0; i < info.ndims; ++i) {
        std::string name = info.dims[i];
        long long low = 1, high = kMaxDim;
        if (t.kind == "stencil" && name == "T") high = 1024;
        if (t.kind == "histogram" && name == "B") high = 4096;
        if (t.kind == "stencil" && (name == "H" || name == "W")) low = 3;
        t.dims.emplace_back(name, expect_int(*dims_v.get(name), "dims." + name, low, high));
    }
    t.dtype = expect_choice(dtype_v, "dtype", kDtypes);
    Json merge = merge_v;
    if (!merge.truthy()) {  // `self.merge or default`: any falsy value
        merge = Json();
        merge.type = Json::String;
        merge.text = info.merge;
    }
    t.merge = expect_choice(merge, "merge", kMerges);
    t.divisible_dim = static_cast<int>(expect_int(dim_v, "divisible_dim", 0, info.ndims - 1));
    if (t.divisible_dim != 0 || t.merge != info.merge)
        throw ContractError("divisible_dim",
                            t.kind + " cannot split " + t.dims[t.divisible_dim].first +
                                " with merge '" + t.merge + "'; it supports " + info.dims[0] +
                                " with " + info.merge);
    return t;
}

inline Task task_from_json(const Json& doc) {
    const Json& obj = expect_fields(doc, "task", kTaskFields);
    const Json& dims = *obj.get("dims");
    if (dims.type != Json::Object)
        throw ContractError("dims", std::string("expected an object of sizes, got ") +
                                        type_name(dims));
    return task_from_values(*obj.get("kind"), dims, *obj.get("dtype"),
                            *obj.get("divisible_dim"), *obj.get("merge"));
}

inline Decision decision_from_json(const Json& doc) {
    const Json& obj = expect_fields(doc, "decision", kDecisionFields, "config_hash");
    const auto& gpus = expect_list(*obj.get("gpus"), "gpus");
    const auto& shares = expect_list(*obj.get("shares"), "shares");
    Decision d;
    if (const Json* h = obj.get("config_hash")) {
        if (h->type != Json::String)
            throw ContractError("config_hash",
                                std::string("expected a string, got ") + type_name(*h));
        d.config_hash = h->text;
    }
    if (!d.config_hash.empty() &&
        (d.config_hash.size() != kHashHexLen ||
         d.config_hash.find_first_not_of("0123456789abcdef") != std::string::npos))
        throw ContractError("config_hash", "expected 64 lowercase hex digits");
    for (std::size_t i = 0; i < gpus.size(); ++i)
        d.gpus.push_back(static_cast<int>(
            expect_int(gpus[i], "gpus[" + std::to_string(i) + "]", 0, kMaxDevices - 1)));
    for (std::size_t i = 0; i < shares.size(); ++i)
        d.shares.push_back(expect_number(shares[i], "shares[" + std::to_string(i) + "]"));
    d.chunk = expect_int(*obj.get("chunk"), "chunk", 1, kMaxChunk);
    d.block = static_cast<int>(expect_int(*obj.get("block"), "block", 1, kMaxBlock));
    d.mode = expect_choice(*obj.get("mode"), "mode", kModes);
    d.comm_path = expect_choice(*obj.get("comm_path"), "comm_path", kCommPaths);
    return d;
}

/// The object ``key`` of an explain document, or the document itself when
/// it is the bare object (it has ``bare_key``, or no ``key``).
inline const Json& member_or_self(const Json& doc, const char* key, const char* bare_key) {
    if (doc.type == Json::Object && doc.has(key) && !doc.has(bare_key)) return *doc.get(key);
    return doc;
}

// ------------------------------------------------------------- math.fsum

/// CPython's math.fsum: the correctly rounded sum (Shewchuk's partials).
inline double fsum(const std::vector<double>& xs) {
    std::vector<double> p;
    for (double x : xs) {
        double xsave = x;
        std::size_t i = 0;
        for (double y : p) {
            if (std::fabs(x) < std::fabs(y)) std::swap(x, y);
            double hi = x + y;
            double lo = y - (hi - x);
            if (lo != 0.0) p[i++] = lo;
            x = hi;
        }
        p.resize(i);
        if (x != 0.0) {
            if (!std::isfinite(x)) {
                if (std::isfinite(xsave))
                    throw ContractError("shares", "intermediate overflow in fsum");
                throw ContractError("shares", "must be finite");
            }
            p.push_back(x);
        }
    }
    double hi = 0.0;
    std::size_t n = p.size();
    if (n > 0) {
        double lo = 0.0;
        hi = p[--n];
        while (n > 0) {
            double x = hi, y = p[--n];
            hi = x + y;
            double yr = hi - x;
            lo = y - yr;
            if (lo != 0.0) break;
        }
        if (n > 0 && ((lo < 0.0 && p[n - 1] < 0.0) || (lo > 0.0 && p[n - 1] > 0.0))) {
            double y = lo * 2.0;
            double x = hi + y;
            double yr = x - hi;
            if (y == yr) hi = x;
        }
    }
    return hi;
}

inline std::string shell_quote(std::string_view s) {
    if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                          "0123456789_-.,:=/+@%") == std::string_view::npos)
        return std::string(s);
    std::string out = "'";
    for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
}

}  // namespace detail

// ------------------------------------------------------------------- parsing

/// A task, validated as TaskSpec validates it (merge defaults to the kind's).
inline Task make_task(std::string kind, std::vector<std::pair<std::string, long long>> dims,
                      std::string dtype = "fp32", int divisible_dim = 0,
                      std::string merge = "") {
    using detail::Json;
    auto str = [](std::string s) { Json v; v.type = Json::String; v.text = std::move(s); return v; };
    auto num = [](long long x) { Json v; v.type = Json::Int; v.text = std::to_string(x); return v; };
    Json d;
    d.type = Json::Object;
    for (auto& [name, size] : dims) {
        for (const auto& k : d.keys)
            if (k == name) throw ContractError(name, "duplicate field");
        d.keys.push_back(name);
        d.items.push_back(num(size));
    }
    return detail::task_from_values(str(std::move(kind)), d, str(std::move(dtype)),
                                    num(divisible_dim), str(std::move(merge)));
}

/// The task in ``json``: a task object, or any object holding one as "task"
/// (what `gpuhive explain --json` prints).
inline Task parse_task(std::string_view json) {
    detail::Json doc = detail::parse_json(json);
    return detail::task_from_json(detail::member_or_self(doc, "task", "kind"));
}

/// The decision in ``json``: a decision object, or any object holding one as
/// "decision" (what `gpuhive explain --json` prints). Form only: call verify().
inline Decision parse_decision(std::string_view json) {
    detail::Json doc = detail::parse_json(json);
    return detail::decision_from_json(detail::member_or_self(doc, "decision", "gpus"));
}

/// Task, decision, machine and policy of a `gpuhive explain --json` document.
inline Plan parse_plan(std::string_view json) {
    detail::Json doc = detail::parse_json(json);
    if (doc.type != detail::Json::Object)
        throw ContractError("plan", std::string("expected a JSON object, got ") +
                                        detail::type_name(doc));
    for (const char* key : {"task", "decision"})
        if (!doc.has(key)) throw ContractError(key, "missing from the plan");
    Plan plan;
    plan.task = detail::task_from_json(*doc.get("task"));
    plan.decision = detail::decision_from_json(*doc.get("decision"));
    for (auto [key, out] : {std::pair{"machine", &plan.machine}, std::pair{"policy", &plan.policy}})
        if (const detail::Json* v = doc.get(key)) {
            if (v->type != detail::Json::String)
                throw ContractError(key, std::string("expected a string, got ") +
                                             detail::type_name(*v));
            *out = v->text;
        }
    return plan;
}

// ------------------------------------------------------------ canonical form

/// The task's JSON object (TaskSpec.to_json), compact, keys in contract order.
inline std::string task_json(const Task& t) {
    std::string dims;
    for (const auto& [name, size] : t.dims)
        dims += (dims.empty() ? "" : ",") + detail::json_string(name) + ":" + std::to_string(size);
    return "{\"kind\":" + detail::json_string(t.kind) + ",\"dims\":{" + dims +
           "},\"dtype\":" + detail::json_string(t.dtype) +
           ",\"divisible_dim\":" + std::to_string(t.divisible_dim) +
           ",\"merge\":" + detail::json_string(t.merge) + "}";
}

/// The decision's JSON object (Decision.to_json), compact.
inline std::string decision_json(const Decision& d, bool include_hash = true) {
    std::string gpus, shares;
    for (int g : d.gpus) gpus += (gpus.empty() ? "" : ",") + std::to_string(g);
    for (double s : d.shares) shares += (shares.empty() ? "" : ",") + detail::json_float(s);
    std::string out = "{\"gpus\":[" + gpus + "],\"shares\":[" + shares +
                      "],\"chunk\":" + std::to_string(d.chunk) +
                      ",\"block\":" + std::to_string(d.block) +
                      ",\"mode\":" + detail::json_string(d.mode) +
                      ",\"comm_path\":" + detail::json_string(d.comm_path);
    if (include_hash) out += ",\"config_hash\":" + detail::json_string(d.config_hash);
    return out + "}";
}

/// The exact text whose SHA-256 is the config hash (canonical_json):
/// json.dumps({"task": ..., "decision": ... without config_hash},
///            sort_keys=True, separators=(",", ":")).
inline std::string canonical_json(const Task& t, const Decision& d) {
    using detail::json_string;
    std::vector<std::pair<std::string, long long>> dims = t.dims;
    std::sort(dims.begin(), dims.end());  // sort_keys: code point order = byte order
    std::string named, gpus, shares;
    for (const auto& [name, size] : dims)
        named += (named.empty() ? "" : ",") + json_string(name) + ":" + std::to_string(size);
    for (int g : d.gpus) gpus += (gpus.empty() ? "" : ",") + std::to_string(g);
    for (double s : d.shares) shares += (shares.empty() ? "" : ",") + detail::json_float(s);
    return "{\"decision\":{\"block\":" + std::to_string(d.block) +
           ",\"chunk\":" + std::to_string(d.chunk) + ",\"comm_path\":" + json_string(d.comm_path) +
           ",\"gpus\":[" + gpus + "],\"mode\":" + json_string(d.mode) + ",\"shares\":[" + shares +
           "]},\"task\":{\"dims\":{" + named + "},\"divisible_dim\":" +
           std::to_string(t.divisible_dim) + ",\"dtype\":" + json_string(t.dtype) +
           ",\"kind\":" + json_string(t.kind) + ",\"merge\":" + json_string(t.merge) + "}}";
}

/// SHA-256 hex digest of canonical_json (config_hash in lib/contract.py).
inline std::string config_hash(const Task& t, const Decision& d) {
    detail::Sha256 h;
    h.update(canonical_json(t, d));
    return h.hex();
}

/// The decision's config_hash against the one recomputed for ``t``; throws a
/// ContractError naming both when they differ (or when there is none).
inline void verify(const Task& t, const Decision& d) {
    if (d.config_hash.empty())
        throw ContractError("config_hash", "missing; the decision carries no hash to verify");
    std::string expected = config_hash(t, d);
    if (expected != d.config_hash)
        throw ContractError("config_hash", "mismatch: the decision says " + d.config_hash +
                                               " but the task and decision hash to " + expected);
}

/// The checks Gate 1 makes that need no machine (contract.*): as many shares
/// as gpus, no share negative (nor -0.0), shares summing to 1 within 1e-9, no
/// device twice, single mode on one device. Throws on the first that fails.
inline void check_contract(const Decision& d) {
    if (d.gpus.size() != d.shares.size())
        throw ContractError("shares", std::to_string(d.gpus.size()) + " gpus but " +
                                          std::to_string(d.shares.size()) + " shares");
    for (std::size_t i = 0; i < d.shares.size(); ++i)
        if (d.shares[i] < 0 || std::signbit(d.shares[i]))
            throw ContractError("shares[" + std::to_string(i) + "]",
                                "must be >= 0, got " + detail::py_float_repr(d.shares[i]) +
                                    (d.shares[i] < 0 ? ""
                                                     : " (negative zero hashes apart from 0 "
                                                       "and 0.0)"));
    double total = detail::fsum(d.shares);
    if (!(std::fabs(total - 1.0) <= kShareSumTol))
        throw ContractError("shares", "sum to " + detail::py_float_repr(total) +
                                          ", not 1 (tolerance 1e-09)");
    for (std::size_t i = 0; i < d.gpus.size(); ++i)
        for (std::size_t j = 0; j < i; ++j)
            if (d.gpus[i] == d.gpus[j])
                throw ContractError("gpus", "device " + std::to_string(d.gpus[i]) +
                                                " is listed twice");
    if (d.mode == "single" && d.gpus.size() != 1)
        throw ContractError("mode", "single mode needs exactly one device, got " +
                                        std::to_string(d.gpus.size()));
}

// ------------------------------------------------------------------- shards

/// split_rows(n, shares): [lo, hi) per share, largest-remainder rounding.
/// Each piece gets floor(n * s / fsum(shares)) rows; the rows left over go one
/// each to the largest fractional remainders, ties to the lower index.
inline std::vector<std::pair<long long, long long>> split_rows(long long n,
                                                               const std::vector<double>& shares) {
    for (std::size_t i = 0; i < shares.size(); ++i)
        if (!std::isfinite(shares[i]))
            throw ContractError("shares[" + std::to_string(i) + "]", "must be finite");
    double total = detail::fsum(shares);
    bool negative = std::any_of(shares.begin(), shares.end(), [](double s) { return s < 0; });
    if (total <= 0 || negative)
        throw ContractError("shares", "shares must be non-negative with a positive sum");
    const std::size_t k = shares.size();
    std::vector<double> exact(k), frac(k);
    std::vector<long long> rows(k);
    long long assigned = 0;
    const double nd = static_cast<double>(n);  // Python's int * float: float(n) * s
    for (std::size_t i = 0; i < k; ++i) {
        exact[i] = nd * shares[i] / total;
        rows[i] = static_cast<long long>(std::floor(exact[i]));
        frac[i] = exact[i] - static_cast<double>(rows[i]);
        assigned += rows[i];
    }
    long long left = n - assigned;
    std::vector<std::size_t> order(k);
    for (std::size_t i = 0; i < k; ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
        return frac[a] > frac[b] || (frac[a] == frac[b] && a < b);
    });
    // order[:left] -- a negative ``left`` slices from the end, as Python does.
    long long kk = static_cast<long long>(k);
    long long take = left >= 0 ? std::min(left, kk) : std::max(kk + left, 0LL);
    for (long long i = 0; i < take; ++i) rows[order[static_cast<std::size_t>(i)]] += 1;
    std::vector<std::pair<long long, long long>> bounds;
    long long lo = 0;
    for (long long r : rows) {
        bounds.emplace_back(lo, lo + r);
        lo += r;
    }
    return bounds;
}

/// Each device's rows of the divisible dimension, in decision order (one per
/// entry of gpus, empty shards included): split_rows(split_size, shares).
inline std::vector<Shard> shards(const Task& t, const Decision& d) {
    if (d.gpus.size() != d.shares.size())
        throw ContractError("shares", std::to_string(d.gpus.size()) + " gpus but " +
                                          std::to_string(d.shares.size()) + " shares");
    auto bounds = split_rows(t.split_size(), d.shares);
    std::vector<Shard> out;
    for (std::size_t i = 0; i < bounds.size(); ++i)
        out.push_back(Shard{d.gpus[i], bounds[i].first, bounds[i].second});
    return out;
}

// ------------------------------------------------------------ asking gpuhive

/// The command line that asks gpuhive for a decision:
/// `gpuhive explain --json --kind K --dim N=... --dtype D --machine M [--policy P]`.
inline std::string explain_command(const Task& t, std::string_view machine,
                                   std::string_view policy = "",
                                   std::string_view program = "gpuhive") {
    std::string cmd = std::string(program) + " explain --json --kind " + detail::shell_quote(t.kind);
    for (const auto& [name, size] : t.dims)
        cmd += " --dim " + detail::shell_quote(name + "=" + std::to_string(size));
    cmd += " --dtype " + detail::shell_quote(t.dtype);
    cmd += " --machine " + detail::shell_quote(machine);
    if (!policy.empty()) cmd += " --policy " + detail::shell_quote(policy);
    return cmd;
}

/// Run ``cmdline`` (a shell command that prints `gpuhive explain --json`
/// output, e.g. explain_command(...)), read its output, parse and verify it.
/// Its stderr passes through. Throws ContractError("decide", ...) when the
/// command cannot start or exits non-zero, and the parsing errors otherwise.
inline Plan decide(const std::string& cmdline) {
#if defined(_WIN32)
    FILE* pipe = _popen(cmdline.c_str(), "r");
#else
    FILE* pipe = popen(cmdline.c_str(), "r");
#endif
    if (!pipe) throw ContractError("decide", "cannot run `" + cmdline + "`");
    std::string out;
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
#if defined(_WIN32)
    int status = _pclose(pipe);
#else
    int raw = pclose(pipe);
    int status = raw == -1 ? -1 : WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
#endif
    if (status != 0)
        throw ContractError("decide", "`" + cmdline + "` exited with status " +
                                          std::to_string(status));
    Plan plan = parse_plan(out);
    verify(plan.task, plan.decision);
    return plan;
}

/// decide(explain_command(t, machine, policy)).
inline Plan decide(const Task& t, std::string_view machine, std::string_view policy = "",
                   std::string_view program = "gpuhive") {
    return decide(explain_command(t, machine, policy, program));
}

}  // namespace gpuhive

#endif  // GPUHIVE_DECISION_HPP
