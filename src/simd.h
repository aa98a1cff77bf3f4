// The 8-float vector the CPU kernels compute with (GCC/Clang vector extensions: plain SSE
// in the portable build, AVX2 in the x86-64-v3 clone of KVRUN_SIMD_CLONES), and the one
// order in which a dot product's eight lanes are combined, shared by every CPU dot
// (dot_f32 in cpu_ops.cpp spells the same order out in scalar code).
#pragma once

#include <cstring>

// The vectors never cross a non-inlined call, so the warning that their calling
// convention differs with and without AVX does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace kvrun::cpu {

using f32x8 = float __attribute__((vector_size(32)));

[[gnu::always_inline]] inline f32x8 load8(const float* p) {
    f32x8 v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
[[gnu::always_inline]] inline void store8(float* p, const f32x8& v) {
    std::memcpy(p, &v, sizeof v);
}
// The lanes of a dot's accumulator combined as ((0+4)+(1+5))+((2+6)+(3+7)).
[[gnu::always_inline]] inline float sum_lanes(const f32x8& a) {
    return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

}  // namespace kvrun::cpu
