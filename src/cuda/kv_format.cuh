// Device twins of the KV head-block codec in src/kv_format.cpp: the same layouts
// (KvHeadLayout, computed on the host) and the same rounding (f16 scales rounded to
// nearest even, codes rounded half to even), so a block sealed on the GPU holds the bytes
// the CPU would write.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "cpu_ops.h"
#include "kv_format.h"

namespace kvrun::cu {

// Value of channel c of row r of head block `blk` in format t (role K: per-channel scales;
// role V: per-row scales of L.group channels).
__device__ __forceinline__ float kv_decode(const uint8_t* __restrict__ blk, KvType t, KvRole role,
                                           const KvHeadLayout& L, int head_dim, int r, int c) {
    if (t == KvType::F32) return reinterpret_cast<const float*>(blk)[r * head_dim + c];
    if (t == KvType::F16)
        return __half2float(reinterpret_cast<const __half*>(blk)[r * head_dim + c]);
    const __half* scales = reinterpret_cast<const __half*>(blk);
    const float d = __half2float(
        role == KvRole::K ? scales[c] : scales[r * (head_dim / int(L.group)) + c / int(L.group)]);
    const uint8_t* vals = blk + L.scale_bytes + int64_t(r) * L.row_bytes;
    int q;
    if (t == KvType::Q8) {
        q = int(static_cast<int8_t>(vals[c]));
    } else {
        const uint8_t b = vals[c >> 1];
        q = int((c & 1) ? (b >> 4) : (b & 0x0F)) - 8;
    }
    return d * float(q);
}

// 32-bit little-endian word at p, which is at least 2-byte aligned (V codes follow a scale
// area of 2 * block_size * n_groups bytes, so they may be only 2-byte aligned).
__device__ __forceinline__ uint32_t kv_load_u32(const uint8_t* p) {
    if ((reinterpret_cast<uintptr_t>(p) & 3) == 0) return *reinterpret_cast<const uint32_t*>(p);
    const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
    return uint32_t(h[0]) | (uint32_t(h[1]) << 16);
}

// out[e] = kv_decode(blk, t, role, L, head_dim, r, c0 + e) for e < 8, with vector loads:
// the 8 codes of a q8 row (4 bytes of nibbles for q4) in one or two 32-bit words, K's 8
// per-channel scales in one 16-byte load, V's one scale (a group of 32 channels, or the
// whole head, always holds the 8) once. Requires head_dim % 8 == 0, c0 % 8 == 0 and `blk`
// 16-byte aligned (every head block is). The values are bit-identical to kv_decode's.
__device__ __forceinline__ void kv_decode8(float* __restrict__ out, const uint8_t* __restrict__ blk,
                                           KvType t, KvRole role, const KvHeadLayout& L,
                                           int head_dim, int r, int c0) {
    const int64_t e0 = int64_t(r) * head_dim + c0;  // element index of f32 / f16 rows
    if (t == KvType::F32) {
        const float4* src = reinterpret_cast<const float4*>(blk) + e0 / 4;
        const float4 a = src[0], b = src[1];
        out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
        out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
        return;
    }
    if (t == KvType::F16) {
        const uint4 u = *reinterpret_cast<const uint4*>(blk + 2 * e0);
        const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float2 f = __half22float2(h[e]);
            out[2 * e] = f.x, out[2 * e + 1] = f.y;
        }
        return;
    }
    float d[8];
    if (role == KvRole::K) {
        const uint4 u = *reinterpret_cast<const uint4*>(blk + 2 * c0);  // scales c0 .. c0 + 7
        const __half* h = reinterpret_cast<const __half*>(&u);
#pragma unroll
        for (int e = 0; e < 8; ++e) d[e] = __half2float(h[e]);
    } else {
        const int g = int(L.group);
        const float dv =
            __half2float(reinterpret_cast<const __half*>(blk)[r * (head_dim / g) + c0 / g]);
#pragma unroll
        for (int e = 0; e < 8; ++e) d[e] = dv;
    }
    const uint8_t* vals = blk + L.scale_bytes + int64_t(r) * L.row_bytes;
    if (t == KvType::Q8) {
        const uint32_t w0 = kv_load_u32(vals + c0), w1 = kv_load_u32(vals + c0 + 4);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            out[e] = d[e] * float(int(int8_t(uint8_t(w0 >> (8 * e)))));
            out[e + 4] = d[e + 4] * float(int(int8_t(uint8_t(w1 >> (8 * e)))));
        }
    } else {
        // Nibble e of the little-endian word is channel c0 + e (byte e / 2, low nibble first).
        const uint32_t w = kv_load_u32(vals + c0 / 2);
#pragma unroll
        for (int e = 0; e < 8; ++e) out[e] = d[e] * float(int((w >> (4 * e)) & 0xFu) - 8);
    }
}

// The stored scale of a group whose largest magnitude is amax and whose signed value of
// largest magnitude is max (q8: amax / 127, q4: max / -8), rounded through f16.
__device__ __forceinline__ float kv_group_scale(KvType t, float amax, float max) {
    const float d = t == KvType::Q8 ? amax / 127.0f : max / -8.0f;
    return __half2float(__float2half_rn(d));
}

__device__ __forceinline__ int kv_quantize(KvType t, float x, float inv_d) {
    const int q = __float2int_rn(x * inv_d);
    return t == KvType::Q8 ? min(127, max(-127, q)) : min(7, max(-8, q));
}

}  // namespace kvrun::cu
