// Device twins of the KV head-block codec in src/kv_format.cpp: the same layouts
// (KvHeadLayout, computed on the host) and the same rounding (f16 scales rounded to
// nearest even, codes rounded half to even), so a block sealed on the GPU holds the bytes
// the CPU would write.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "cpu_ops.h"
#include "cuda/common.cuh"
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

// The bytes behind channels c0 .. c0 + 7 of one row as loaded by kv_fetch8, before
// kv_unpack8 turns them into f32. Loading and converting apart lets a kernel keep several
// rows' loads in flight before it needs the first one's values.
struct KvRaw8 {
    uint4 a;  // f32: channels c0 .. c0 + 3; f16: the 8 values; K q8 / q4: the 8 f16 scales
    uint4 b;  // f32: channels c0 + 4 .. c0 + 7; q8: the codes in x, y; q4: in x; V q8 / q4:
              // the f16 scale in the low half of z
};

// The loads of kv_decode8 (same requirements), none of the conversion.
__device__ __forceinline__ KvRaw8 kv_fetch8(const uint8_t* __restrict__ blk, KvType t, KvRole role,
                                            const KvHeadLayout& L, int head_dim, int r, int c0) {
    KvRaw8 raw{};
    const int64_t e0 = int64_t(r) * head_dim + c0;  // element index of f32 / f16 rows
    if (t == KvType::F32) {
        const uint4* src = reinterpret_cast<const uint4*>(blk) + e0 / 4;
        raw.a = src[0], raw.b = src[1];
        return raw;
    }
    if (t == KvType::F16) {
        raw.a = *reinterpret_cast<const uint4*>(blk + 2 * e0);
        return raw;
    }
    if (role == KvRole::K) {
        raw.a = *reinterpret_cast<const uint4*>(blk + 2 * c0);  // scales c0 .. c0 + 7
    } else {
        const int g = int(L.group);
        raw.b.z = reinterpret_cast<const uint16_t*>(blk)[r * (head_dim / g) + c0 / g];
    }
    const uint8_t* vals = blk + L.scale_bytes + int64_t(r) * L.row_bytes;
    if (t == KvType::Q8) {
        raw.b.x = kv_load_u32(vals + c0), raw.b.y = kv_load_u32(vals + c0 + 4);
    } else {
        raw.b.x = kv_load_u32(vals + c0 / 2);
    }
    return raw;
}

// out[e] = the f32 value of channel c0 + e of the row kv_fetch8 loaded into raw.
__device__ __forceinline__ void kv_unpack8(float* __restrict__ out, const KvRaw8& raw, KvType t,
                                           KvRole role) {
    if (t == KvType::F32) {
        out[0] = __uint_as_float(raw.a.x), out[1] = __uint_as_float(raw.a.y);
        out[2] = __uint_as_float(raw.a.z), out[3] = __uint_as_float(raw.a.w);
        out[4] = __uint_as_float(raw.b.x), out[5] = __uint_as_float(raw.b.y);
        out[6] = __uint_as_float(raw.b.z), out[7] = __uint_as_float(raw.b.w);
        return;
    }
    if (t == KvType::F16) {
        const __half2* h = reinterpret_cast<const __half2*>(&raw.a);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float2 f = __half22float2(h[e]);
            out[2 * e] = f.x, out[2 * e + 1] = f.y;
        }
        return;
    }
    float d[8];
    if (role == KvRole::K) {
        const __half* h = reinterpret_cast<const __half*>(&raw.a);
#pragma unroll
        for (int e = 0; e < 8; ++e) d[e] = __half2float(h[e]);
    } else {
        const float dv = __half2float(__ushort_as_half(static_cast<unsigned short>(raw.b.z)));
#pragma unroll
        for (int e = 0; e < 8; ++e) d[e] = dv;
    }
    if (t == KvType::Q8) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            out[e] = d[e] * sbyte_float((raw.b.x >> (8 * e)) & 0xffu);
            out[e + 4] = d[e + 4] * sbyte_float((raw.b.y >> (8 * e)) & 0xffu);
        }
    } else {
        // Nibble e of the little-endian word is channel c0 + e (byte e / 2, low nibble first).
#pragma unroll
        for (int e = 0; e < 8; ++e) out[e] = d[e] * code_float<8>((raw.b.x >> (4 * e)) & 0xFu);
    }
}

// out[e] = kv_decode(blk, t, role, L, head_dim, r, c0 + e) for e < 8, with vector loads:
// the 8 codes of a q8 row (4 bytes of nibbles for q4) in one or two 32-bit words, K's 8
// per-channel scales in one 16-byte load, V's one scale (a group of 32 channels, or the
// whole head, always holds the 8) once. Requires head_dim % 8 == 0, c0 % 8 == 0 and `blk`
// 16-byte aligned (every head block is). The values are bit-identical to kv_decode's.
__device__ __forceinline__ void kv_decode8(float* __restrict__ out, const uint8_t* __restrict__ blk,
                                           KvType t, KvRole role, const KvHeadLayout& L,
                                           int head_dim, int r, int c0) {
    kv_unpack8(out, kv_fetch8(blk, t, role, L, head_dim, r, c0), t, role);
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
