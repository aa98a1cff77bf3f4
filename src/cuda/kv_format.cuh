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
