// launch_example.cu -- run a GPUHive elementwise decision on its devices.
//
//   nvcc -std=c++17 -O2 -o launch_example kernels/gpuhive/launch_example.cu
//   gpuhive explain --json --kind elementwise --dim N=100000000 --dtype fp16
//       --machine nvml --policy proportional-peak > plan.json   (one line)
//   ./launch_example plan.json                  # task and decision in one file
//   ./launch_example decision.json task.json    # a bare decision and its task
//   ./launch_example plan.json --ordinal 2=0    # profile device 2 runs on CUDA 0
//
// It reads the decision, verifies its config_hash against the task, makes the
// checks Gate 1 makes without a machine (gpuhive::check_contract), cuts the
// rows with gpuhive::shards (exactly as Python's split_rows) and, for each
// non-empty shard, on the shard's device (cudaSetDevice) and its own
// non-blocking stream: copies its slices of x and y in (cudaMemcpyAsync from
// pinned memory), launches the elementwise kernel of kernels/elementwise.cu
// with the decision's block size, and copies its slice of out back. Every
// shard is queued before any is waited for, so the devices run at once. Then
// out = 2.5 x + y is checked on the host.
//
// Profile device g runs on CUDA ordinal g unless --ordinal g=o says otherwise
// (CUDA numbers devices its own way; lib/execution/cuda.py maps by PCI bus id).
// Exit status: 0 verified, 1 a CUDA error or a wrong result, 2 bad input.

#include "decision.hpp"

#include "../elementwise.cu"

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

#define CUDA_CHECK(call)                                                               \
    do {                                                                               \
        cudaError_t err_ = (call);                                                     \
        if (err_ != cudaSuccess)                                                       \
            throw std::runtime_error(std::string(#call) + ": " + cudaGetErrorString(err_)); \
    } while (0)

/// The multiplier the Python reference uses (lib/platform/workloads.py).
constexpr float kA = 2.5f;

template <typename T>
using ElementwiseKernel = void (*)(float, const T*, const T*, T*, long long);

inline float host_float(float v) { return v; }
inline float host_float(__half v) { return __half2float(v); }
inline float host_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> T host_value(float v);
template <> float host_value<float>(float v) { return v; }
template <> __half host_value<__half>(float v) { return __float2half(v); }
template <> __nv_bfloat16 host_value<__nv_bfloat16>(float v) { return __float2bfloat16(v); }

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw gpuhive::ContractError(path, "cannot open");
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
}

/// One shard in flight: where it runs and what it holds there.
template <typename T>
struct Flight {
    gpuhive::Shard shard;
    int ordinal = 0;
    cudaStream_t stream = nullptr;
    cudaEvent_t start = nullptr, stop = nullptr;
    T *x = nullptr, *y = nullptr, *out = nullptr;
};

/// Waits for and frees every flight (also when a later shard failed to queue).
template <typename T>
void land(std::vector<Flight<T>>& flights) {
    for (auto& f : flights) {
        cudaSetDevice(f.ordinal);
        if (f.stream) cudaStreamSynchronize(f.stream);
        cudaFree(f.x);
        cudaFree(f.y);
        cudaFree(f.out);
        if (f.start) cudaEventDestroy(f.start);
        if (f.stop) cudaEventDestroy(f.stop);
        if (f.stream) cudaStreamDestroy(f.stream);
    }
    flights.clear();
}

template <typename T>
int run(const gpuhive::Task& task, const gpuhive::Decision& decision,
        const std::map<int, int>& ordinals, ElementwiseKernel<T> kernel, double rtol) {
    const long long n = task.split_size();
    int count = 0;
    CUDA_CHECK(cudaGetDeviceCount(&count));

    T *x = nullptr, *y = nullptr, *out = nullptr;  // pinned: the copies are async
    CUDA_CHECK(cudaMallocHost(&x, n * sizeof(T)));
    CUDA_CHECK(cudaMallocHost(&y, n * sizeof(T)));
    CUDA_CHECK(cudaMallocHost(&out, n * sizeof(T)));
    unsigned long long state = 12345;
    auto uniform = [&state] {  // in [-1, 1)
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        return static_cast<float>((state >> 40) * 0x1.0p-24) * 2.0f - 1.0f;
    };
    for (long long i = 0; i < n; ++i) {
        x[i] = host_value<T>(uniform());
        y[i] = host_value<T>(uniform());
    }

    std::vector<Flight<T>> flights;
    try {
        for (const gpuhive::Shard& s : gpuhive::shards(task, decision)) {
            if (s.rows() <= 0) continue;
            auto mapped = ordinals.find(s.device);
            int ordinal = mapped != ordinals.end() ? mapped->second : s.device;
            if (ordinal < 0 || ordinal >= count)
                throw std::runtime_error("device " + std::to_string(s.device) +
                                         " has no CUDA ordinal (CUDA sees " +
                                         std::to_string(count) + "; map it with --ordinal)");
            flights.push_back(Flight<T>{s, ordinal});
            Flight<T>& f = flights.back();
            const std::size_t bytes = static_cast<std::size_t>(s.rows()) * sizeof(T);
            CUDA_CHECK(cudaSetDevice(ordinal));
            CUDA_CHECK(cudaStreamCreateWithFlags(&f.stream, cudaStreamNonBlocking));
            CUDA_CHECK(cudaEventCreate(&f.start));
            CUDA_CHECK(cudaEventCreate(&f.stop));
            CUDA_CHECK(cudaMalloc(&f.x, bytes));
            CUDA_CHECK(cudaMalloc(&f.y, bytes));
            CUDA_CHECK(cudaMalloc(&f.out, bytes));
            int sms = 1;
            CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ordinal));
            const long long block = decision.block;
            const long long grid = std::min((s.rows() + block - 1) / block, 32LL * sms);
            CUDA_CHECK(cudaEventRecord(f.start, f.stream));
            CUDA_CHECK(cudaMemcpyAsync(f.x, x + s.begin, bytes, cudaMemcpyHostToDevice, f.stream));
            CUDA_CHECK(cudaMemcpyAsync(f.y, y + s.begin, bytes, cudaMemcpyHostToDevice, f.stream));
            kernel<<<static_cast<unsigned>(grid), static_cast<unsigned>(block), 0, f.stream>>>(
                kA, f.x, f.y, f.out, s.rows());
            CUDA_CHECK(cudaGetLastError());
            CUDA_CHECK(cudaMemcpyAsync(out + s.begin, f.out, bytes, cudaMemcpyDeviceToHost,
                                       f.stream));
            CUDA_CHECK(cudaEventRecord(f.stop, f.stream));
        }
        std::printf("%-8s %-8s %12s %12s %10s\n", "device", "ordinal", "begin", "end", "ms");
        for (auto& f : flights) {
            CUDA_CHECK(cudaSetDevice(f.ordinal));
            CUDA_CHECK(cudaStreamSynchronize(f.stream));
            float ms = 0;
            CUDA_CHECK(cudaEventElapsedTime(&ms, f.start, f.stop));
            std::printf("%-8d %-8d %12lld %12lld %10.3f\n", f.shard.device, f.ordinal,
                        f.shard.begin, f.shard.end, ms);
        }
    } catch (...) {
        land(flights);
        cudaFreeHost(x);
        cudaFreeHost(y);
        cudaFreeHost(out);
        throw;
    }
    land(flights);

    // |out - ref| <= rtol * max|ref|, as lib.platform.workloads.verify checks.
    double err = 0, scale = 0;
    for (long long i = 0; i < n; ++i) {
        double ref = static_cast<double>(kA * host_float(x[i]) + host_float(y[i]));
        err = std::max(err, std::fabs(static_cast<double>(host_float(out[i])) - ref));
        scale = std::max(scale, std::fabs(ref));
    }
    cudaFreeHost(x);
    cudaFreeHost(y);
    cudaFreeHost(out);
    bool ok = err <= rtol * scale;
    std::printf("%s: %lld elements, max abs error %.3g (allowed %.3g), config_hash %s\n",
                ok ? "verified" : "WRONG", n, err, rtol * scale, decision.config_hash.c_str());
    return ok ? 0 : 1;
}

int usage() {
    std::fprintf(stderr,
                 "usage: launch_example PLAN.json | DECISION.json TASK.json "
                 "[--ordinal DEVICE=ORDINAL ...]\n");
    return 2;
}

}  // namespace

int main(int argc, char** argv) {
    std::vector<std::string> files;
    std::map<int, int> ordinals;
    for (int i = 1; i < argc; ++i) {
        std::string arg = argv[i];
        if (arg == "--ordinal" && i + 1 < argc) {
            std::string map = argv[++i];
            std::size_t eq = map.find('=');
            if (eq == std::string::npos) return usage();
            ordinals[std::atoi(map.substr(0, eq).c_str())] = std::atoi(map.c_str() + eq + 1);
        } else if (!arg.empty() && arg[0] == '-') {
            return usage();
        } else {
            files.push_back(arg);
        }
    }
    if (files.empty() || files.size() > 2) return usage();
    try {
        gpuhive::Task task;
        gpuhive::Decision decision;
        if (files.size() == 1) {
            gpuhive::Plan plan = gpuhive::parse_plan(read_file(files[0]));
            task = plan.task;
            decision = plan.decision;
        } else {
            decision = gpuhive::parse_decision(read_file(files[0]));
            task = gpuhive::parse_task(read_file(files[1]));
        }
        gpuhive::verify(task, decision);
        gpuhive::check_contract(decision);
        if (task.kind != "elementwise")
            throw gpuhive::ContractError("kind", "this example runs elementwise tasks, not " +
                                                     task.kind);
        if (decision.block % 32 != 0 || decision.block < 32 || decision.block > 1024)
            throw gpuhive::ContractError("block", "must be a multiple of 32 in [32, 1024], got " +
                                                      std::to_string(decision.block));
        if (task.dtype == "fp32") return run<float>(task, decision, ordinals, elementwise_fp32, 1e-4);
        if (task.dtype == "fp16") return run<__half>(task, decision, ordinals, elementwise_fp16, 1e-2);
        if (task.dtype == "bf16")
            return run<__nv_bfloat16>(task, decision, ordinals, elementwise_bf16, 2e-2);
        throw gpuhive::ContractError("dtype", "kernels/elementwise.cu has no " + task.dtype +
                                                  " entry point (fp32, fp16, bf16)");
    } catch (const gpuhive::ContractError& e) {
        std::fprintf(stderr, "launch_example: %s\n", e.what());
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "launch_example: %s\n", e.what());
        return 1;
    }
}
