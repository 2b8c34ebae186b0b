// Command-line launcher for one kernel source built on the host with cuda_emu.h.
//
// Built by lib/codegen/emulate.py as
//   g++ -std=c++17 -pthread -Ilib/codegen/emu/include
//       -DGH_KERNEL_SOURCE='"/abs/kernels/matmul.cu"'
//       '-DGH_ENTRIES=GH_ENTRY(matmul_fp32) GH_ENTRY(matmul_fp16) ...'
//       lib/codegen/emu/driver.cpp
// and run as
//   driver ENTRY GX,GY,GZ BX,BY,BZ ARG...
// with one ARG per kernel parameter, in order:
//   f:<float>   a float (hex-float text keeps it exact)   d:<double>
//   i:<int>     an int                                    l:<long long>
//   in:<path>   a const T* buffer read from a raw file
//   io:<path>   a T* buffer read from a raw file and written back after the run
// Buffers are allocated at exactly the file's size, so a sanitizer sees any
// access past either end. Under AddressSanitizer each buffer also lies in its
// own mapping between two inaccessible guards of GH_GUARD_BYTES (32 GiB: the
// reach of a 32-bit index into 8-byte elements), 256-byte aligned as cudaMalloc
// aligns, its end within 256 bytes of the upper guard and the slack on either
// side poisoned: an access far past either end, which
// a sanitizer's redzones do not reach and which would otherwise land in another
// live allocation unseen, faults. Exit status 0 on success, 2 on a usage
// error, 3 when the kernel changed a read-only input.

#include "../cuda_emu.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <tuple>
#include <utility>

#ifndef GH_KERNEL_SOURCE
#error "define GH_KERNEL_SOURCE as the quoted path of the .cu file to include"
#endif
#include GH_KERNEL_SOURCE

#if defined(__SANITIZE_ADDRESS__)
#define GH_GUARDED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GH_GUARDED 1
#endif
#endif
#ifdef GH_GUARDED
#include <sanitizer/asan_interface.h>
#endif

#ifndef GH_GUARD_BYTES
#define GH_GUARD_BYTES (std::size_t{1} << 35)
#endif

namespace {

[[noreturn]] void usage(const std::string& message) {
    std::fprintf(stderr, "driver: %s\n", message.c_str());
    std::exit(2);
}

// A buffer's storage: new[] in a plain build; under AddressSanitizer its own
// mapping, [guard | slack | bytes | slack | guard], the bytes aligned to
// 256 and ending less than 256 bytes from the upper guard (the file header
// says why).
class Storage {
  public:
    // Alignment of a buffer's first byte: cudaMalloc's, 256 bytes (a kernel
    // may load float4 or wider from it).
    static constexpr std::size_t kAlign = 256;

    explicit Storage(std::size_t bytes) : bytes_(bytes) {
#ifdef GH_GUARDED
        const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
        const std::size_t held = (bytes + kAlign - 1) / kAlign * kAlign;
        const std::size_t body = (held + kAlign + page - 1) / page * page;
        span_ = 2 * GH_GUARD_BYTES + body;
        void* base = mmap(nullptr, span_, PROT_NONE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (base == MAP_FAILED) usage("cannot reserve a guarded buffer");
        base_ = static_cast<unsigned char*>(base);
        unsigned char* first = base_ + GH_GUARD_BYTES;
        if (mprotect(first, body, PROT_READ | PROT_WRITE) != 0)
            usage("cannot map a guarded buffer");
        // aligned as cudaMalloc aligns, as close to the upper guard as that
        // allows; the slack on either side is readable memory: poison it
        data_ = first + body - held;
        ASAN_POISON_MEMORY_REGION(first, data_ - first);
        if (held > bytes) ASAN_POISON_MEMORY_REGION(data_ + bytes, held - bytes);
#else
        owned_.reset(new unsigned char[bytes]);
        data_ = owned_.get();
#endif
    }
    Storage(const Storage&) = delete;
    Storage& operator=(const Storage&) = delete;
    ~Storage() {
#ifdef GH_GUARDED
        if (base_) munmap(base_, span_);
#endif
    }
    unsigned char* get() const { return data_; }
    std::size_t size() const { return bytes_; }

  private:
    std::size_t bytes_ = 0;
    unsigned char* data_ = nullptr;
#ifdef GH_GUARDED
    unsigned char* base_ = nullptr;
    std::size_t span_ = 0;
#else
    std::unique_ptr<unsigned char[]> owned_;
#endif
};

struct Buffer {
    std::string path;
    std::unique_ptr<Storage> data;
    std::size_t bytes = 0;
    bool write_back = false;
    std::vector<char> original;  // an input's bytes as loaded, to check after
};

class Buffers {
  public:
    template <typename T>
    T* load(const std::string& path, bool write_back) {
        std::ifstream in(path, std::ios::binary);
        if (!in) usage("cannot read " + path);
        const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                      std::istreambuf_iterator<char>());
        if (bytes.size() % sizeof(T) != 0)
            usage(path + ": size is not a multiple of the element size");
        Buffer b;
        b.path = path;
        b.bytes = bytes.size();
        b.data.reset(new Storage(b.bytes));
        if (b.bytes) std::memcpy(b.data->get(), bytes.data(), b.bytes);
        b.write_back = write_back;
        if (!write_back) b.original = bytes;
        T* p = reinterpret_cast<T*>(b.data->get());
        buffers_.push_back(std::move(b));
        return p;
    }

    // Writes every T* buffer back to its file; exit status 3 if the kernel
    // wrote to a const T* one (through a cast: the spot check compares only
    // the outputs, and on a device inputs are shared by every chunk).
    void write_back() const {
        for (const Buffer& b : buffers_) {
            if (!b.write_back) {
                if (b.bytes && std::memcmp(b.original.data(), b.data->get(), b.bytes)) {
                    std::fprintf(stderr, "driver: the kernel wrote to its read-only "
                                         "input %s\n", b.path.c_str());
                    std::exit(3);
                }
                continue;
            }
            std::ofstream out(b.path, std::ios::binary | std::ios::trunc);
            out.write(reinterpret_cast<const char*>(b.data->get()),
                      static_cast<std::streamsize>(b.bytes));
            if (!out) usage("cannot write " + b.path);
        }
    }

  private:
    std::vector<Buffer> buffers_;
};

std::string after_prefix(const char* arg, const std::string& prefix) {
    const std::string s(arg);
    if (s.compare(0, prefix.size(), prefix) != 0)
        usage("argument '" + s + "' should start with '" + prefix + "'");
    return s.substr(prefix.size());
}

template <typename T>
T parse_number(const char* arg, const std::string& prefix) {
    const std::string text = after_prefix(arg, prefix);
    const char* begin = text.c_str();
    char* end = nullptr;
    errno = 0;
    T value;
    if constexpr (std::is_same_v<T, float>) {
        value = std::strtof(begin, &end);
    } else if constexpr (std::is_same_v<T, double>) {
        value = std::strtod(begin, &end);
    } else {
        const long long v = std::strtoll(begin, &end, 10);
        if (v < static_cast<long long>(std::numeric_limits<T>::min()) ||
            v > static_cast<long long>(std::numeric_limits<T>::max()))
            errno = ERANGE;
        value = static_cast<T>(v);
    }
    if (text.empty() || *end != '\0' || errno == ERANGE)
        usage("bad number '" + text + "'");
    return value;
}

// One parser per kernel parameter type.
template <typename T>
struct Arg;

template <>
struct Arg<float> {
    static float parse(const char* a, Buffers&) { return parse_number<float>(a, "f:"); }
};

template <>
struct Arg<double> {
    static double parse(const char* a, Buffers&) {
        return parse_number<double>(a, "d:");
    }
};

template <>
struct Arg<int> {
    static int parse(const char* a, Buffers&) { return parse_number<int>(a, "i:"); }
};

template <>
struct Arg<long long> {
    static long long parse(const char* a, Buffers&) {
        return parse_number<long long>(a, "l:");
    }
};

template <typename T>
struct Arg<const T*> {
    static const T* parse(const char* a, Buffers& b) {
        return b.load<T>(after_prefix(a, "in:"), false);
    }
};

template <typename T>
struct Arg<T*> {
    static T* parse(const char* a, Buffers& b) {
        return b.load<T>(after_prefix(a, "io:"), true);
    }
};

dim3 parse_dim3(const char* text) {
    unsigned int v[3] = {1, 1, 1};
    std::string s(text);
    for (int k = 0; k < 3 && !s.empty(); ++k) {
        const std::size_t comma = s.find(',');
        v[k] = static_cast<unsigned int>(
            parse_number<int>(("i:" + s.substr(0, comma)).c_str(), "i:"));
        s = comma == std::string::npos ? "" : s.substr(comma + 1);
    }
    return dim3(v[0], v[1], v[2]);
}

template <typename... P, std::size_t... I>
void launch_with(void (*kernel)(P...), dim3 grid, dim3 block, char** argv,
                 Buffers& buffers, std::index_sequence<I...>) {
    // Braced initialisation parses the arguments left to right.
    std::tuple<P...> args{Arg<P>::parse(argv[I], buffers)...};
    std::apply([&](P... p) { gh_emu::launch(kernel, grid, block, p...); }, args);
}

struct Entry {
    const char* name;
    int (*run)(dim3, dim3, int, char**);
};

template <typename... P>
int run_kernel(void (*kernel)(P...), dim3 grid, dim3 block, int argc, char** argv) {
    if (argc != static_cast<int>(sizeof...(P)))
        usage("kernel takes " + std::to_string(sizeof...(P)) + " arguments, got " +
              std::to_string(argc));
    Buffers buffers;
    launch_with(kernel, grid, block, argv, buffers, std::index_sequence_for<P...>{});
    buffers.write_back();
    return 0;
}

#define GH_ENTRY(fn)                                               \
    {#fn, [](dim3 g, dim3 b, int argc, char** argv) {              \
         return run_kernel(fn, g, b, argc, argv);                  \
     }},

const Entry kEntries[] = {GH_ENTRIES};

}  // namespace

int main(int argc, char** argv) {
    if (argc < 4) usage("usage: driver ENTRY GX,GY,GZ BX,BY,BZ ARG...");
    const std::string name(argv[1]);
    for (const Entry& e : kEntries)
        if (name == e.name)
            return e.run(parse_dim3(argv[2]), parse_dim3(argv[3]), argc - 4, argv + 4);
    usage("no entry point named " + name);
}
