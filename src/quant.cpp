// Type table of every ggml tensor type, half/bfloat16 conversion, the row-level
// dequantize / quantize / dot dispatch, and the codecs of the float types and the legacy
// 32-element blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1).
#include "quant.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstring>

#include "quant_impl.h"

namespace kvrun {

using namespace quant_detail;

// ---- half / bfloat16 ---------------------------------------------------------------

float fp16_to_fp32(uint16_t h) {
    return half_to_float(h);
}

// Branch-free (so conversion loops vectorize): all three candidate results are computed
// and the right one selected.
uint16_t fp32_to_fp16(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u;
    x &= 0x7fffffffu;
    // Normal range: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits
    // to nearest even; a carry correctly moves into the exponent (up to inf).
    const uint32_t normal = (x - (112u << 23) + 0xfffu + ((x >> 13) & 1)) >> 13;
    // Below 2^-14: adding 0.5 (whose ulp is 2^-24, the half subnormal step) makes the FPU
    // round |f| to a whole number of half subnormal steps, ties to even.
    float a;
    std::memcpy(&a, &x, 4);
    a += 0.5f;
    uint32_t ab;
    std::memcpy(&ab, &a, 4);
    const uint32_t subnormal = ab - 0x3f000000u;
    uint32_t h = x < 0x38800000u ? subnormal : normal;
    h = x >= 0x477ff000u ? 0x7c00u : h;                        // >= 65520 rounds to inf
    h = x > 0x7f800000u ? 0x7e00u | ((x >> 13) & 0x3ffu) : h;  // nan stays a quiet nan
    return uint16_t(h | sign);
}

float bf16_to_fp32(uint16_t h) {
    uint32_t bits = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

uint16_t fp32_to_bf16(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40);  // quiet nan
    return uint16_t((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

namespace {

// ---- float types -------------------------------------------------------------------

void dequant_f32(const uint8_t* src, float* dst, int64_t nb) {
    std::memcpy(dst, src, size_t(nb) * 4);
}
void quant_f32(const float* src, uint8_t* dst, int64_t nb, const float* /*w*/) {
    std::memcpy(dst, src, size_t(nb) * 4);
}
KVRUN_SIMD_CLONES
void dequant_f16(const uint8_t* src, float* dst, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) dst[i] = load_f16(src + 2 * i);
}
void quant_f16(const float* src, uint8_t* dst, int64_t nb, const float* /*w*/) {
    for (int64_t i = 0; i < nb; ++i) store_u16(dst + 2 * i, fp32_to_fp16(src[i]));
}
KVRUN_SIMD_CLONES
void dequant_bf16(const uint8_t* src, float* dst, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) dst[i] = bf16_to_fp32(load_u16(src + 2 * i));
}
void quant_bf16(const float* src, uint8_t* dst, int64_t nb, const float* /*w*/) {
    for (int64_t i = 0; i < nb; ++i) store_u16(dst + 2 * i, fp32_to_bf16(src[i]));
}

// ---- legacy 32-element blocks --------------------------------------------------------
// Q4_0 [f16 d][16 B nibbles]: element j<16 is the low nibble of byte j, element j+16 the
// high nibble; x = d * (q - 8). Q4_1 adds [f16 m] after d: x = d * q + m. Q5_0/Q5_1 add a
// 32-bit word qh before the nibbles whose bit j is the 5th bit of element j; x = d * (q -
// 16) resp. d * q + m. Q8_0 [f16 d][32 x int8]; Q8_1 [f16 d][f16 d*sum(q)][32 x int8].

template <bool kHasMin, bool kHasHigh>
KVRUN_SIMD_CLONES void dequant_q4q5(const uint8_t* src, float* dst, int64_t nb) {
    constexpr size_t kBytes = 2 + (kHasMin ? 2 : 0) + (kHasHigh ? 4 : 0) + 16;
    constexpr int kOffset = kHasMin ? 0 : (kHasHigh ? 16 : 8);
    for (int64_t b = 0; b < nb; ++b, src += kBytes, dst += kQ32) {
        const float d = load_f16(src);
        const float m = kHasMin ? load_f16(src + 2) : 0.0f;
        const uint32_t qh = kHasHigh ? load_u32(src + (kHasMin ? 4 : 2)) : 0;
        const uint8_t* qs = src + kBytes - 16;
        for (int j = 0; j < 16; ++j) {
            int lo = qs[j] & 0xf, hi = qs[j] >> 4;
            if (kHasHigh) {
                lo |= int((qh >> j) & 1) << 4;
                hi |= int((qh >> (j + 16)) & 1) << 4;
            }
            dst[j] = kHasMin ? d * float(lo) + m : d * float(lo - kOffset);
            dst[j + 16] = kHasMin ? d * float(hi) + m : d * float(hi - kOffset);
        }
    }
}

// The legacy quantizers follow llama.cpp's reference recipes step for step (scale from the
// unrounded block statistics, round-half-up codes), so `kvrun quantize` writes the same bytes
// as llama-quantize for these types.

// Symmetric Q4_0 / Q5_0: the element of largest magnitude maps to the most negative code.
// With importance weights, the scale is a weighted least-squares fit instead (the codes
// then round to nearest with the stored scale).
template <bool kHasHigh>
void quant_q4q5_sym(const float* src, uint8_t* dst, int64_t nb, const float* w) {
    constexpr size_t kBytes = 2 + (kHasHigh ? 4 : 0) + 16;
    constexpr int kHalf = kHasHigh ? 16 : 8, kMax = 2 * kHalf - 1;
    for (int64_t b = 0; b < nb; ++b, src += kQ32, dst += kBytes, w = w ? w + kQ32 : w) {
        float amax = 0, vmax = 0;
        for (int j = 0; j < kQ32; ++j)
            if (std::fabs(src[j]) > amax) amax = std::fabs(src[j]), vmax = src[j];
        const float d = w ? half_to_float(fp32_to_fp16(fit_scale_sym(src, kQ32, kHalf, w)))
                          : vmax / -float(kHalf);
        const float id = d != 0 ? 1.0f / d : 0.0f;
        store_u16(dst, fp32_to_fp16(d));
        auto code = [&](float x) {
            if (w) return std::clamp(nearest_int(x * id) + kHalf, 0, kMax);
            return std::min(kMax, int(x * id + (float(kHalf) + 0.5f)));
        };
        uint32_t qh = 0;
        uint8_t* qs = dst + kBytes - 16;
        for (int j = 0; j < 16; ++j) {
            const int lo = code(src[j]), hi = code(src[j + 16]);
            qs[j] = uint8_t((lo & 0xf) | (hi & 0xf) << 4);
            qh |= uint32_t(lo >> 4) << j | uint32_t(hi >> 4) << (j + 16);
        }
        if (kHasHigh) std::memcpy(dst + 2, &qh, 4);
    }
}

// Asymmetric Q4_1 / Q5_1: [min, max] spread over all codes.
template <bool kHasHigh>
void quant_q4q5_min(const float* src, uint8_t* dst, int64_t nb, const float* w) {
    constexpr size_t kBytes = 4 + (kHasHigh ? 4 : 0) + 16;
    constexpr int kMax = kHasHigh ? 31 : 15;
    for (int64_t b = 0; b < nb; ++b, src += kQ32, dst += kBytes, w = w ? w + kQ32 : w) {
        float lo = src[0], hi = src[0];
        for (int j = 1; j < kQ32; ++j) lo = std::min(lo, src[j]), hi = std::max(hi, src[j]);
        float d = (hi - lo) / float(kMax);
        if (w && lo < 0) {  // the weighted fit keeps an offset <= 0 (x ~ d q - min)
            float scale = 0, min = 0;
            fit_scale_min(src, kQ32, kMax, scale, min, w);
            d = half_to_float(fp32_to_fp16(scale)), lo = half_to_float(fp32_to_fp16(-min));
        }
        const float id = d != 0 ? 1.0f / d : 0.0f;
        store_u16(dst, fp32_to_fp16(d));
        store_u16(dst + 2, fp32_to_fp16(lo));
        auto code = [&](float x) {
            if (w) return std::clamp(nearest_int((x - lo) * id), 0, kMax);
            return std::clamp(int((x - lo) * id + 0.5f), 0, kMax);
        };
        uint32_t qh = 0;
        uint8_t* qs = dst + kBytes - 16;
        for (int j = 0; j < 16; ++j) {
            const int a = code(src[j]), c = code(src[j + 16]);
            qs[j] = uint8_t((a & 0xf) | (c & 0xf) << 4);
            qh |= uint32_t(a >> 4) << j | uint32_t(c >> 4) << (j + 16);
        }
        if (kHasHigh) std::memcpy(dst + 4, &qh, 4);
    }
}

template <bool kHasSum>
KVRUN_SIMD_CLONES void dequant_q8(const uint8_t* src, float* dst, int64_t nb) {
    constexpr size_t kHeader = kHasSum ? 4 : 2;
    for (int64_t b = 0; b < nb; ++b, src += kHeader + kQ32, dst += kQ32) {
        const float d = load_f16(src);
        const int8_t* qs = reinterpret_cast<const int8_t*>(src + kHeader);
        for (int j = 0; j < kQ32; ++j) dst[j] = d * float(qs[j]);
    }
}

template <bool kHasSum>
void quant_q8(const float* src, uint8_t* dst, int64_t nb, const float* /*w*/) {
    constexpr size_t kHeader = kHasSum ? 4 : 2;
    for (int64_t b = 0; b < nb; ++b, src += kQ32, dst += kHeader + kQ32) {
        float amax = 0;
        for (int j = 0; j < kQ32; ++j) amax = std::max(amax, std::fabs(src[j]));
        const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        store_u16(dst, fp32_to_fp16(d));
        int sum = 0;
        for (int j = 0; j < kQ32; ++j) {
            const int q = std::clamp(int(std::round(src[j] * id)), -127, 127);
            dst[kHeader + j] = uint8_t(int8_t(q));
            sum += q;
        }
        if (kHasSum) store_u16(dst + 2, fp32_to_fp16(d * float(sum)));
    }
}

// ---- the type table ------------------------------------------------------------------

struct TypeEntry {
    GgmlTypeTraits traits;
    DequantFn dequant = nullptr;
    QuantFn quant = nullptr;
};

constexpr uint32_t kMaxTypeId = 42;

TypeEntry make(const char* name, int64_t elems, size_t bytes, DequantFn dq = nullptr,
               QuantFn q = nullptr) {
    TypeEntry e;
    e.traits = {name, elems, bytes, dq != nullptr, q != nullptr};
    e.dequant = dq;
    e.quant = q;
    return e;
}

// Indexed by type id; entries with block_elems == 0 are unknown ids (retired or unused).
const std::array<TypeEntry, kMaxTypeId>& type_table() {
    static const std::array<TypeEntry, kMaxTypeId> table = [] {
        std::array<TypeEntry, kMaxTypeId> t{};
        auto set = [&](GgmlType id, TypeEntry e) { t[uint32_t(id)] = e; };
        set(GgmlType::F32, make("F32", 1, 4, dequant_f32, quant_f32));
        set(GgmlType::F16, make("F16", 1, 2, dequant_f16, quant_f16));
        set(GgmlType::BF16, make("BF16", 1, 2, dequant_bf16, quant_bf16));
        set(GgmlType::Q4_0,
            make("Q4_0", 32, 18, dequant_q4q5<false, false>, quant_q4q5_sym<false>));
        set(GgmlType::Q4_1, make("Q4_1", 32, 20, dequant_q4q5<true, false>, quant_q4q5_min<false>));
        set(GgmlType::Q5_0, make("Q5_0", 32, 22, dequant_q4q5<false, true>, quant_q4q5_sym<true>));
        set(GgmlType::Q5_1, make("Q5_1", 32, 24, dequant_q4q5<true, true>, quant_q4q5_min<true>));
        set(GgmlType::Q8_0, make("Q8_0", 32, 34, dequant_q8<false>, quant_q8<false>));
        set(GgmlType::Q8_1, make("Q8_1", 32, 36, dequant_q8<true>, quant_q8<true>));
        set(GgmlType::Q2_K, make("Q2_K", 256, 84, dequant_q2_k, quant_q2_k));
        set(GgmlType::Q3_K, make("Q3_K", 256, 110, dequant_q3_k, quant_q3_k));
        set(GgmlType::Q4_K, make("Q4_K", 256, 144, dequant_q4_k, quant_q4_k));
        set(GgmlType::Q5_K, make("Q5_K", 256, 176, dequant_q5_k, quant_q5_k));
        set(GgmlType::Q6_K, make("Q6_K", 256, 210, dequant_q6_k, quant_q6_k));
        set(GgmlType::Q8_K, make("Q8_K", 256, 292, dequant_q8_k, quant_q8_k));
        set(GgmlType::IQ4_NL, make("IQ4_NL", 32, 18, dequant_iq4_nl, quant_iq4_nl));
        set(GgmlType::IQ4_XS, make("IQ4_XS", 256, 136, dequant_iq4_xs, quant_iq4_xs));
        // Known layouts kvrun cannot compute with (codebook/grid types, integers, F64).
        set(GgmlType::IQ2_XXS, make("IQ2_XXS", 256, 66));
        set(GgmlType::IQ2_XS, make("IQ2_XS", 256, 74));
        set(GgmlType::IQ3_XXS, make("IQ3_XXS", 256, 98));
        set(GgmlType::IQ1_S, make("IQ1_S", 256, 50));
        set(GgmlType::IQ3_S, make("IQ3_S", 256, 110));
        set(GgmlType::IQ2_S, make("IQ2_S", 256, 82));
        set(GgmlType::IQ1_M, make("IQ1_M", 256, 56));
        set(GgmlType::I8, make("I8", 1, 1));
        set(GgmlType::I16, make("I16", 1, 2));
        set(GgmlType::I32, make("I32", 1, 4));
        set(GgmlType::I64, make("I64", 1, 8));
        set(GgmlType::F64, make("F64", 1, 8));
        set(GgmlType::MXFP4, make("MXFP4", 32, 17, dequant_mxfp4, quant_mxfp4));
        set(GgmlType::NVFP4, make("NVFP4", 64, 36, dequant_nvfp4, quant_nvfp4));
        set(GgmlType::TQ1_0, make("TQ1_0", 256, 54, dequant_tq1_0, quant_tq1_0));
        set(GgmlType::TQ2_0, make("TQ2_0", 256, 66, dequant_tq2_0, quant_tq2_0));
        set(GgmlType::Q1_0, make("Q1_0", 128, 18, dequant_q1_0, quant_q1_0));
        return t;
    }();
    return table;
}

const TypeEntry& entry(GgmlType t) {
    const uint32_t id = uint32_t(t);
    if (id >= kMaxTypeId || type_table()[id].traits.block_elems == 0)
        fail("unknown ggml tensor type id {}", id);
    return type_table()[id];
}

// Number of blocks in a row of n elements; throws when n is not a whole number of blocks.
int64_t row_blocks(const TypeEntry& e, int64_t n) {
    const int64_t be = e.traits.block_elems;
    if (n < 0 || n % be != 0)
        fail("row of {} elements is not a multiple of the {} block size {}", n, e.traits.name, be);
    return n / be;
}

// Dot product with 8 independent accumulators (vectorizes without -ffast-math).
KVRUN_SIMD_CLONES
float dot_f32(const float* a, const float* b, int64_t n) {
    float acc[8] = {};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
    for (; i < n; ++i) acc[0] += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

}  // namespace

// ---- public API ----------------------------------------------------------------------

bool ggml_type_known(uint32_t id) {
    return id < kMaxTypeId && type_table()[id].traits.block_elems != 0;
}

const GgmlTypeTraits& ggml_type_traits(GgmlType t) {
    return entry(t).traits;
}

const char* ggml_type_name(GgmlType t) {
    return ggml_type_known(uint32_t(t)) ? type_table()[uint32_t(t)].traits.name : "unknown";
}

std::optional<GgmlType> ggml_type_from_name(std::string_view name) {
    for (uint32_t id = 0; id < kMaxTypeId; ++id) {
        if (!ggml_type_known(id)) continue;
        const char* known = type_table()[id].traits.name;
        if (name.size() == std::strlen(known) &&
            std::equal(name.begin(), name.end(), known, [](char a, char b) {
                return std::toupper(static_cast<unsigned char>(a)) == b;
            }))
            return GgmlType(id);
    }
    return std::nullopt;
}

size_t ggml_row_bytes(GgmlType t, int64_t n) {
    const TypeEntry& e = entry(t);
    return size_t(row_blocks(e, n)) * e.traits.block_bytes;
}

void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n) {
    const TypeEntry& e = entry(t);
    if (!e.dequant) fail("tensor type {} cannot be dequantized by kvrun", e.traits.name);
    e.dequant(static_cast<const uint8_t*>(src), dst, row_blocks(e, n));
}

void quantize_row(GgmlType t, const float* src, void* dst, int64_t n) {
    const TypeEntry& e = entry(t);
    if (!e.quant) fail("kvrun cannot quantize to tensor type {}", e.traits.name);
    e.quant(src, static_cast<uint8_t*>(dst), row_blocks(e, n), nullptr);
}

void quantize_row_weighted(GgmlType t, const float* src, const float* importance, void* dst,
                           int64_t n) {
    const TypeEntry& e = entry(t);
    if (!e.quant) fail("kvrun cannot quantize to tensor type {}", e.traits.name);
    e.quant(src, static_cast<uint8_t*>(dst), row_blocks(e, n), importance);
}

float vec_dot_row(GgmlType t, const void* row, const float* x, int64_t n) {
    const TypeEntry& e = entry(t);
    if (!e.dequant) fail("tensor type {} cannot be dequantized by kvrun", e.traits.name);
    const int64_t nb = row_blocks(e, n);
    if (t == GgmlType::F32) return dot_f32(static_cast<const float*>(row), x, n);
    // Dequantize a chunk of blocks (kChunk elements) onto the stack, dot, repeat.
    constexpr int64_t kChunk = 512;
    const int64_t chunk_blocks = kChunk / e.traits.block_elems;
    const uint8_t* src = static_cast<const uint8_t*>(row);
    float buf[kChunk];  // [chunk elements]
    float sum = 0;
    for (int64_t b = 0; b < nb; b += chunk_blocks) {
        const int64_t cb = std::min(chunk_blocks, nb - b);
        e.dequant(src + size_t(b) * e.traits.block_bytes, buf, cb);
        sum += dot_f32(buf, x + b * e.traits.block_elems, cb * e.traits.block_elems);
    }
    return sum;
}

}  // namespace kvrun
