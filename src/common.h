// Shared basics for every module: the one error type users see, and small helpers.
#pragma once

#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

// Hot CPU loops get an AVX2+FMA clone picked at load time on x86-64 (GCC ifunc), so the
// portable build still runs fast on modern CPUs. The build turns FP contraction off
// (CMakeLists.txt), so a clone rounds exactly like the portable code.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__)
#define KVRUN_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define KVRUN_SIMD_CLONES
#endif

namespace kvrun {

// The single error type thrown for bad input (files, flags, requests) and resource
// exhaustion. main() prints what() on one line and exits non-zero; `hint` (optional)
// tells the user how to fix it.
class Error : public std::runtime_error {
  public:
    explicit Error(const std::string& message, std::string hint = {})
        : std::runtime_error(message), hint_(std::move(hint)) {}
    const std::string& hint() const { return hint_; }

  private:
    std::string hint_;
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
    throw Error(fmt::format(f, std::forward<Args>(args)...));
}

// Whether `part` occurs in `s`.
inline bool contains(std::string_view s, std::string_view part) {
    return s.find(part) != std::string_view::npos;
}

// Seconds of the steady clock since t0.
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace kvrun
