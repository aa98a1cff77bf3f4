// KV cache storage formats: names, sizes, and the CPU reference encoder/decoder of head
// blocks (see kv_format.h and docs/kv-cache.md). The CUDA kernels in src/cuda/kv_write.cu
// and src/cuda/attention.cuh implement the same layouts and rounding.
#include "kv_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common.h"
#include "quant.h"

namespace kvrun {
namespace {

constexpr int64_t kHeadBlockAlign = 16;

int64_t pad16(int64_t n) {
    return (n + kHeadBlockAlign - 1) / kHeadBlockAlign * kHeadBlockAlign;
}

// Bytes of the scales in front of a quantized head block.
int64_t scale_bytes(KvRole role, int64_t block_size, int64_t head_dim) {
    return role == KvRole::K ? 2 * head_dim : 2 * block_size * (head_dim / kv_v_group(head_dim));
}

// Bytes of one row's quantized values.
int64_t row_bytes(KvType t, int64_t head_dim) {
    return t == KvType::Q8 ? head_dim : head_dim / 2;
}

float load_f16(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return fp16_to_fp32(h);
}

void store_f16(uint8_t* p, float v) {
    const uint16_t h = fp32_to_fp16(v);
    std::memcpy(p, &h, 2);
}

// The scale of a group of values x[i * stride], i < n, and its stored (f16-rounded) value:
// q8: largest magnitude / 127, symmetric codes -127..127;
// q4: signed value of largest magnitude / -8, codes -8..7 (that value maps to -8 exactly).
float group_scale(KvType t, const float* x, int64_t n, int64_t stride) {
    float amax = 0, max = 0;
    for (int64_t i = 0; i < n; ++i) {
        const float v = x[i * stride];
        if (std::fabs(v) > amax) {
            amax = std::fabs(v);
            max = v;
        }
    }
    const float d = t == KvType::Q8 ? amax / 127.0f : max / -8.0f;
    return fp16_to_fp32(fp32_to_fp16(d));
}

int quantize_value(KvType t, float x, float inv_d) {
    const long q = std::lrintf(x * inv_d);
    return t == KvType::Q8 ? int(std::clamp(q, -127L, 127L)) : int(std::clamp(q, -8L, 7L));
}

// Stores code q of channel c into a row of quantized values.
void put_code(KvType t, uint8_t* row, int64_t c, int q) {
    if (t == KvType::Q8) {
        row[c] = static_cast<uint8_t>(static_cast<int8_t>(q));
    } else {
        const uint8_t nib = static_cast<uint8_t>(q + 8);
        row[c / 2] = c % 2 == 0 ? static_cast<uint8_t>((row[c / 2] & 0xF0) | nib)
                                : static_cast<uint8_t>((row[c / 2] & 0x0F) | (nib << 4));
    }
}

}  // namespace

const char* kv_type_name(KvType t) {
    switch (t) {
        case KvType::F32:
            return "f32";
        case KvType::F16:
            return "f16";
        case KvType::Q8:
            return "q8";
        case KvType::Q4:
            return "q4";
    }
    return "?";
}

KvType kv_type_parse(std::string_view s) {
    if (s == "f32") return KvType::F32;
    if (s == "f16") return KvType::F16;
    if (s == "q8" || s == "q8_0" || s == "int8") return KvType::Q8;
    if (s == "q4" || s == "q4_0" || s == "int4") return KvType::Q4;
    fail("unknown KV cache type '{}' (expected f32, f16, q8 or q4)", s);
}

int64_t kv_v_group(int64_t head_dim) {
    return head_dim % 32 == 0 ? 32 : head_dim;
}

void kv_check_format(KvType t, int64_t head_dim) {
    if (head_dim <= 0) fail("KV cache: head_dim {} must be positive", head_dim);
    if (t == KvType::Q4 && head_dim % 2 != 0)
        fail("KV cache type q4 needs an even head_dim (the model has {})", head_dim);
}

int64_t kv_head_block_bytes(KvType t, KvRole role, int64_t block_size, int64_t head_dim) {
    switch (t) {
        case KvType::F32:
            return block_size * head_dim * 4;
        case KvType::F16:
            return block_size * head_dim * 2;
        case KvType::Q8:
        case KvType::Q4:
            kv_check_format(t, head_dim);
            return pad16(scale_bytes(role, block_size, head_dim) +
                         block_size * row_bytes(t, head_dim));
    }
    fail("unknown KV cache type {}", int(t));
}

KvHeadLayout kv_head_layout(KvType t, KvRole role, int64_t block_size, int64_t head_dim) {
    KvHeadLayout l;
    l.bytes = kv_head_block_bytes(t, role, block_size, head_dim);
    if (kv_type_quantized(t)) {
        l.scale_bytes = scale_bytes(role, block_size, head_dim);
        l.row_bytes = row_bytes(t, head_dim);
        l.group = role == KvRole::K ? block_size : kv_v_group(head_dim);
    } else {
        l.row_bytes = head_dim * (t == KvType::F32 ? 4 : 2);
    }
    return l;
}

double kv_bytes_per_element(KvType t, KvRole role, int64_t head_dim, int64_t block_size) {
    return double(kv_head_block_bytes(t, role, block_size, head_dim)) /
           double(block_size * head_dim);
}

void kv_encode_head_block(KvType t, KvRole role, const float* src, int64_t block_size,
                          int64_t head_dim, uint8_t* dst) {
    const int64_t bs = block_size, hd = head_dim;
    if (t == KvType::F32) {
        std::memcpy(dst, src, size_t(bs * hd) * 4);
        return;
    }
    if (t == KvType::F16) {
        quantize_row(GgmlType::F16, src, dst, bs * hd);
        return;
    }
    const int64_t n_bytes = kv_head_block_bytes(t, role, bs, hd);
    std::memset(dst, 0, size_t(n_bytes));
    uint8_t* values = dst + scale_bytes(role, bs, hd);
    const int64_t rb = row_bytes(t, hd);
    if (role == KvRole::K) {
        // One scale per channel over the block's rows.
        for (int64_t c = 0; c < hd; ++c) {
            const float d = group_scale(t, src + c, bs, hd);
            store_f16(dst + 2 * c, d);
            const float inv = d != 0.0f ? 1.0f / d : 0.0f;
            for (int64_t r = 0; r < bs; ++r)
                put_code(t, values + r * rb, c, quantize_value(t, src[r * hd + c], inv));
        }
    } else {
        // One scale per row and group of channels.
        const int64_t g = kv_v_group(hd), n_groups = hd / g;
        for (int64_t r = 0; r < bs; ++r)
            for (int64_t j = 0; j < n_groups; ++j) {
                const float* x = src + r * hd + j * g;
                const float d = group_scale(t, x, g, 1);
                store_f16(dst + 2 * (r * n_groups + j), d);
                const float inv = d != 0.0f ? 1.0f / d : 0.0f;
                for (int64_t c = 0; c < g; ++c)
                    put_code(t, values + r * rb, j * g + c, quantize_value(t, x[c], inv));
            }
    }
}

namespace {

// out[c] = scale[c] * code c of a quantized row, c < n (K: a scale per channel).
[[gnu::always_inline]] inline void codes_times_scales(KvType t, const uint8_t* values,
                                                      const float* scale, int64_t n, float* out) {
    if (t == KvType::Q8) {
        for (int64_t c = 0; c < n; ++c) out[c] = scale[c] * float(static_cast<int8_t>(values[c]));
        return;
    }
    for (int64_t i = 0; i < n / 2; ++i) {
        out[2 * i] = scale[2 * i] * float(int(values[i] & 0x0F) - 8);
        out[2 * i + 1] = scale[2 * i + 1] * float(int(values[i] >> 4) - 8);
    }
}

// out[c] = s * code c of a quantized row, c in [c0, c0 + n) (V: one scale per group; c0 and
// n even for q4).
[[gnu::always_inline]] inline void codes_times_scale(KvType t, const uint8_t* values, float s,
                                                     int64_t c0, int64_t n, float* out) {
    if (t == KvType::Q8) {
        for (int64_t c = c0; c < c0 + n; ++c) out[c] = s * float(static_cast<int8_t>(values[c]));
        return;
    }
    for (int64_t i = c0 / 2; i < (c0 + n) / 2; ++i) {
        out[2 * i] = s * float(int(values[i] & 0x0F) - 8);
        out[2 * i + 1] = s * float(int(values[i] >> 4) - 8);
    }
}

}  // namespace

KVRUN_SIMD_CLONES void kv_decode_head_rows(KvType t, KvRole role, const uint8_t* blk,
                                           int64_t block_size, int64_t head_dim, int64_t row0,
                                           int64_t n_rows, float* out) {
    const int64_t bs = block_size, hd = head_dim;
    if (t == KvType::F32) {
        std::memcpy(out, blk + row0 * hd * 4, size_t(n_rows * hd) * 4);
        return;
    }
    if (t == KvType::F16) {
        dequantize_row(GgmlType::F16, blk + 2 * row0 * hd, out, n_rows * hd);
        return;
    }
    // Each value is scale * code. K: one scale per channel for the whole block, decoded once;
    // V: one scale per row and group of g channels.
    const int64_t g = kv_v_group(hd), n_groups = hd / g, rb = row_bytes(t, hd);
    const uint8_t* values = blk + scale_bytes(role, bs, hd) + row0 * rb;
    if (role == KvRole::K) {
        float stack[256];
        std::vector<float> heap(hd > 256 ? size_t(hd) : 0);
        float* scale = hd > 256 ? heap.data() : stack;  // [hd]
        dequantize_row(GgmlType::F16, blk, scale, hd);
        for (int64_t r = 0; r < n_rows; ++r, values += rb, out += hd)
            codes_times_scales(t, values, scale, hd, out);
        return;
    }
    for (int64_t r = row0; r < row0 + n_rows; ++r, values += rb, out += hd)
        for (int64_t j = 0; j < n_groups; ++j)
            codes_times_scale(t, values, load_f16(blk + 2 * (r * n_groups + j)), j * g, g, out);
}

void kv_decode_head_row(KvType t, KvRole role, const uint8_t* blk, int64_t block_size,
                        int64_t head_dim, int64_t row, float* out) {
    kv_decode_head_rows(t, role, blk, block_size, head_dim, row, 1, out);
}

void hadamard_rows(float* x, int64_t n_rows, int64_t n) {
    if (!is_power_of_two(n)) fail("Hadamard rotation needs a power-of-two size (got {})", n);
    const float norm = 1.0f / std::sqrt(float(n));
    for (int64_t r = 0; r < n_rows; ++r) {
        float* v = x + r * n;
        for (int64_t h = 1; h < n; h *= 2)
            for (int64_t i = 0; i < n; i += 2 * h)
                for (int64_t j = i; j < i + h; ++j) {
                    const float a = v[j], b = v[j + h];
                    v[j] = a + b;
                    v[j + h] = a - b;
                }
        for (int64_t i = 0; i < n; ++i) v[i] *= norm;
    }
}

}  // namespace kvrun
