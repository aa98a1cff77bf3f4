// Helpers for the CUDA op tests (tests/test_cuda_*.cpp): skip the whole executable with exit
// code 77 (ctest: skipped) when there is no GPU or no CUDA build, device buffers, random
// inputs and the normalized mean squared error used to compare a CUDA op with its CPU twin.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#ifdef KVRUN_HAS_CUDA
#include <cuda_runtime_api.h>

#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/ops.h"
#endif

namespace kvrun::test {

// Runs during static initialization, before doctest's main: no GPU -> exit 77 (skipped).
// (Include this header from exactly one file per test executable.)
[[maybe_unused]] static const bool cuda_present = []() -> bool {
#ifdef KVRUN_HAS_CUDA
    if (cuda_device_count() > 0) return true;
    std::printf("SKIP: no CUDA device\n");
#else
    std::printf("SKIP: kvrun was built without CUDA\n");
#endif
    std::fflush(stdout);
    std::_Exit(77);
}();

// sum((a - b)^2) / sum(b^2), b being the reference; 0 when both are all zeros.
inline double nmse(const std::vector<float>& a, const std::vector<float>& b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
        const double d = double(a[i]) - double(b[i]);
        num += d * d;
        den += double(b[i]) * double(b[i]);
    }
    if (a.size() != b.size()) return 1e30;
    return den > 0 ? num / den : num;
}

// a and b hold the same bytes (so +0 / -0 and NaN payloads count, unlike ==).
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() &&
           (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(rng);
    return v;
}

#ifdef KVRUN_HAS_CUDA
// A device array of T that frees itself.
template <class T>
class DevBuf {
  public:
    DevBuf() = default;
    explicit DevBuf(size_t n) : n_(n) {
        if (n) CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)));
    }
    explicit DevBuf(const std::vector<T>& host) : DevBuf(host.size()) { upload(host); }
    DevBuf(const DevBuf&) = delete;
    DevBuf& operator=(const DevBuf&) = delete;
    DevBuf(DevBuf&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
    DevBuf& operator=(DevBuf&& o) noexcept {
        std::swap(p_, o.p_);
        std::swap(n_, o.n_);
        return *this;
    }
    ~DevBuf() {
        if (p_) cudaFree(p_);
    }
    T* get() const { return p_; }
    size_t size() const { return n_; }
    // (Empty buffers are null: no copy or memset is issued for them.)
    void upload(const std::vector<T>& host) {
        const size_t n = std::min(n_, host.size());
        if (n) CUDA_CHECK(cudaMemcpy(p_, host.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    }
    void zero() {
        if (n_) CUDA_CHECK(cudaMemset(p_, 0, n_ * sizeof(T)));
    }
    std::vector<T> download() const {
        std::vector<T> host(n_);
        CUDA_CHECK(cudaDeviceSynchronize());
        if (n_) CUDA_CHECK(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
        return host;
    }

  private:
    T* p_ = nullptr;
    size_t n_ = 0;
};
#endif

}  // namespace kvrun::test
