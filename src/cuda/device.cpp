// CUDA device queries, checked allocation with a helpful out-of-memory message, the error
// helpers behind CUDA_CHECK / CUBLAS_CHECK (common.cuh), and the host side of
// cuda_sample_rows (cuda_sample_row: header-only dependencies, so every CUDA test links).
#include "cuda/device.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "common.h"
#include "cuda/common.cuh"
#include "cuda/cublas_lib.h"
#include "cuda/ops.h"
#include "sampler.h"

namespace kvrun {

void cuda_throw(const char* file, int line, const char* what) {
    throw Error(fmt::format("{} (at {}:{})", what, file, line));
}

void cuda_throw_call(const char* file, int line, const char* call, cudaError_t err) {
    throw Error(fmt::format("CUDA error at {}:{}: {} failed: {} ({})", file, line, call,
                            cudaGetErrorString(err), cudaGetErrorName(err)));
}

void cuda_throw_cublas(const char* file, int line, const char* call, int status) {
    throw Error(fmt::format("cuBLAS error at {}:{}: {} failed: {} ({})", file, line, call,
                            cublas_lib().status_string(cublasStatus_t(status)), status));
}

bool cuda_env_switch(const char* name, const char* on) {
    const char* env = std::getenv(name);
    const std::string_view v = env ? env : "";
    if (v.empty() || v == "auto") return false;
    if (v == on) return true;
    throw Error(fmt::format("{}={} is not a choice: '{}' or 'auto'", name, v, on));
}

namespace {
// cuda_pdl_enabled's answer: -1 until first asked.
std::atomic<int> g_pdl{-1};
}  // namespace

bool cuda_pdl_enabled() {
    int v = g_pdl.load();
    if (v < 0) {
        v = 0;
        if (cuda_env_switch("KVRUN_PDL", "on")) {
            int dev = 0, major = 0;
            if (cudaGetDevice(&dev) == cudaSuccess &&
                cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) ==
                    cudaSuccess)
                v = major >= 9 ? 1 : 0;
            (void)cudaGetLastError();
        }
        g_pdl = v;
    }
    return v == 1;
}

void cuda_set_pdl(bool on) {
    g_pdl = on ? 1 : 0;
}

std::string cuda_env_choice(const char* name, std::initializer_list<const char*> choices) {
    const char* env = std::getenv(name);
    const std::string v = env ? env : "";
    if (v.empty()) return v;
    std::string list;
    for (const char* c : choices) {
        if (v == c) return v;
        list += (list.empty() ? "" : ", ") + std::string(c);
    }
    throw Error(fmt::format("{}={} is not a choice: {}", name, v, list));
}

int cuda_device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();  // clear the sticky "no driver" error
        return 0;
    }
    return n;
}

CudaDeviceInfo cuda_device_info(int device) {
    const int n = cuda_device_count();
    if (device < 0 || device >= n)
        throw Error(fmt::format("CUDA device {} does not exist ({} device{} found)", device, n,
                                n == 1 ? "" : "s"),
                    n ? fmt::format("use --device cuda:0 .. cuda:{}", n - 1) : "use --device cpu");
    cudaDeviceProp p{};
    CUDA_CHECK(cudaGetDeviceProperties(&p, device));
    CudaDeviceInfo info;
    info.id = device;
    info.name = p.name;
    info.cc_major = p.major;
    info.cc_minor = p.minor;
    info.sm_count = p.multiProcessorCount;
    info.total_bytes = p.totalGlobalMem;
    info.smem_per_block_optin = p.sharedMemPerBlockOptin;
    int clock_khz = 0, bus_bits = 0;
    if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device) == cudaSuccess &&
        cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) == cudaSuccess)
        info.peak_bandwidth_gbs = 2.0 * clock_khz * 1e3 * (bus_bits / 8.0) / 1e9;  // DDR
    (void)cudaGetLastError();
    int current = 0;
    CUDA_CHECK(cudaGetDevice(&current));
    if (current == device) {
        size_t free_b = 0, total_b = 0;
        if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) info.free_bytes = free_b;
    }
    return info;
}

std::string cuda_device_summary(const CudaDeviceInfo& i) {
    return fmt::format("{} (sm_{}{}, {} SMs, {:.1f} GiB, {:.0f} GB/s)", i.name, i.cc_major,
                       i.cc_minor, i.sm_count, double(i.total_bytes) / (1 << 30),
                       i.peak_bandwidth_gbs);
}

void cuda_set_device(int device) {
    (void)cuda_device_info(device);  // validates the id with a clear message
    CUDA_CHECK(cudaSetDevice(device));
}

void cuda_mem_info(size_t* free_bytes, size_t* total_bytes) {
    CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
}

std::string cuda_oom_message(const char* what, size_t requested, size_t free_bytes,
                             size_t total_bytes) {
    const double mib = 1024.0 * 1024.0;
    return fmt::format(
        "out of GPU memory allocating {}: requested {:.1f} MiB, {:.1f} MiB free of {:.1f} MiB",
        what, requested / mib, free_bytes / mib, total_bytes / mib);
}

void* cuda_alloc(size_t bytes, const char* what) {
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, bytes);
    if (err == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        (void)cudaMemGetInfo(&free_b, &total_b);
        throw Error(cuda_oom_message(what, bytes, free_b, total_b),
                    "use a smaller --kv-memory or --ctx, a smaller model, or --device cpu");
    }
    if (err != cudaSuccess) cuda_throw_call(__FILE__, __LINE__, "cudaMalloc", err);
    return p;
}

void cuda_free(void* p) noexcept {
    if (p) (void)cudaFree(p);
}

CudaSampleRow cuda_sample_row(const SamplingParams& p, double u, const int32_t* recent,
                              size_t n_recent, int64_t n_vocab, std::vector<int32_t>& penalty_ids) {
    if (sampling_needs_host(p))
        fail(
            "cuda sampler: DRY, top-n-sigma, typical, XTC and dynamic temperature are sampled "
            "on the host");
    CudaSampleRow r;
    r.u = u;
    r.temperature = p.temperature;
    r.top_k = p.top_k;
    r.top_p = p.top_p;
    r.min_p = p.min_p;
    // The float log, exactly as Sampler's min-p threshold takes it.
    r.log_min_p = p.min_p > 0.0f ? std::log(p.min_p) : 0.0f;
    r.repeat_penalty = p.repeat_penalty;
    r.frequency_penalty = p.frequency_penalty;
    r.presence_penalty = p.presence_penalty;
    // Logit biases: the ids, then each bias's float bits (merged as Sampler merges them).
    const auto bias = merged_logit_bias(p, n_vocab);
    if (!bias.empty()) {
        r.bias_begin = static_cast<int32_t>(penalty_ids.size());
        r.bias_count = static_cast<int32_t>(bias.size());
        for (const auto& [id, b] : bias) penalty_ids.push_back(id);
        for (const auto& [id, b] : bias) {
            int32_t bits;
            std::memcpy(&bits, &b, sizeof bits);
            penalty_ids.push_back(bits);
        }
    }
    const auto counts = penalized_token_counts(p, {recent, n_recent}, n_vocab);
    if (counts.empty()) return r;
    r.penalty_begin = static_cast<int32_t>(penalty_ids.size());
    r.penalty_count = static_cast<int32_t>(counts.size());
    for (const auto& [id, c] : counts) penalty_ids.push_back(id);
    if (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f)
        for (const auto& [id, c] : counts) penalty_ids.push_back(c);
    return r;
}

}  // namespace kvrun
