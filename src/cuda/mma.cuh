// Warp-level tensor-core multiply-accumulate (mma.sync m16n8k16, f16 inputs, f32
// accumulators) for hand-written kernels, with a portable twin built from shuffles where the
// instruction does not exist (the CUDA emulator, devices before sm_80). The twin follows the
// PTX fragment layout element for element, so a kernel that is right on the emulator is
// right on the GPU; test_cuda_ops checks the instruction against a plain product on a GPU.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace kvrun::cu {

// lo and hi rounded to f16 and packed into one register (lo in the low half), the order in
// which mma fragments hold two consecutive elements.
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ float2 unpack_half2(uint32_t u) {
    return __half22float2(*reinterpret_cast<const __half2*>(&u));
}

// d += A * B with A a 16x16 f16 tile, B a 16x8 f16 tile and d the 16x8 f32 tile, held by
// the 32 lanes of a warp (all of them must call it together). With g = lane / 4 and
// t = lane % 4, and two consecutive elements per register (the lower index in the low half):
//   a[0] = A[g][2t, 2t+1]      a[1] = A[g+8][2t, 2t+1]
//   a[2] = A[g][2t+8, 2t+9]    a[3] = A[g+8][2t+8, 2t+9]
//   b[0] = B[2t, 2t+1][g]      b[1] = B[2t+8, 2t+9][g]
//   d[0], d[1] = D[g][2t, 2t+1]     d[2], d[3] = D[g+8][2t, 2t+1]
__device__ __forceinline__ void mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    // Each lane fetches the A rows and B columns it needs from the lanes holding them:
    // k pair kp (k = 2kp, 2kp + 1) of row r lives in lane (r % 8) * 4 + kp % 4, register
    // (r >= 8) + 2 (kp >= 4); of column c in lane c * 4 + kp % 4, register kp >= 4.
    constexpr unsigned kFull = 0xffffffffu;
    const int lane = int(threadIdx.x % 32), g = lane / 4, t = lane % 4;
#pragma unroll
    for (int kp = 0; kp < 8; ++kp) {
        const int src = kp % 4, hi = kp / 4;
        const float2 a0 = unpack_half2(__shfl_sync(kFull, a[2 * hi], g * 4 + src));
        const float2 a1 = unpack_half2(__shfl_sync(kFull, a[2 * hi + 1], g * 4 + src));
        const float2 b0 = unpack_half2(__shfl_sync(kFull, b[hi], (2 * t) * 4 + src));
        const float2 b1 = unpack_half2(__shfl_sync(kFull, b[hi], (2 * t + 1) * 4 + src));
        d[0] += a0.x * b0.x + a0.y * b0.y;
        d[1] += a0.x * b1.x + a0.y * b1.y;
        d[2] += a1.x * b0.x + a1.y * b0.y;
        d[3] += a1.x * b1.x + a1.y * b1.y;
    }
#endif
}

}  // namespace kvrun::cu
