// Internal to the quant module: the per-type block codecs that quant.cpp dispatches to,
// grouped by family (quant.cpp: float and legacy 32-blocks, quant_k.cpp: K-quants,
// quant_iq.cpp: IQ4 and FP4, quant_ternary.cpp: TQ1_0, TQ2_0, Q1_0). Every function handles
// `nb` whole blocks.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common.h"

namespace kvrun::quant_detail {

// Block sizes of the K-quant / IQ4_XS super-blocks and the legacy blocks.
constexpr int kQK = 256;
constexpr int kQ32 = 32;

// The IQ4 codebook (ggml's non-linear 4-bit levels), shared by IQ4_NL and IQ4_XS.
inline constexpr int8_t kIq4Codebook[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

// MXFP4's FP4 (E2M1) values doubled, so that they are integers: code q means
// kMxfp4Values[q] / 2 times the block's power of two (ggml's kvalues_mxfp4).
inline constexpr int8_t kMxfp4Values[16] = {0, 1,  2,  3,  4,  6,  8,  12,
                                            0, -1, -2, -3, -4, -6, -8, -12};

// MXFP4's E8M0 block scale halved (for kMxfp4Values' doubled values): 2^(e - 128), exact
// for every byte (the first two are float subnormals).
inline float mxfp4_scale(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : uint32_t(e - 1) << 23;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// NVFP4's UE4M3 sub-block scale halved (for kMxfp4Values' doubled values): bits 6..3 the
// exponent e (bias 7), bits 2..0 the mantissa m, so (1 + m/8) 2^(e-7) / 2, or m 2^-10 when
// e is 0. Bit 7 is ignored, as the sign of the E4M3 byte it came from; 0x7f (E4M3's nan)
// is 0, as in ggml.
inline float nvfp4_scale(uint8_t b) {
    const uint32_t e = (b >> 3) & 15, m = b & 7;
    if ((b & 0x7f) == 0x7f) return 0.0f;
    if (e == 0) return float(m) * 0x1p-10f;
    const uint32_t bits = (e + 119) << 23 | m << 20;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// Q4_K/Q5_K: 8 (scale, min) pairs of 6 bits in 12 bytes. Pairs 0-3 sit in the low 6 bits
// of bytes 0-3 (scale) and 4-7 (min); pairs 4-7 keep their low nibbles in bytes 8-11
// (scale low, min high) and their top 2 bits in the top bits of bytes 0-3 / 4-7.
inline void unpack_scale_min(const uint8_t* s, int j, int& sc, int& m) {
    if (j < 4) {
        sc = s[j] & 63;
        m = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
        m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// Q3_K: 16 scales of 6 bits in 12 bytes. Scale j keeps its low nibble in byte j (j < 8,
// low nibble) or byte j-8 (high nibble), and its top 2 bits in byte 8 + j%4 at bit 2*(j/4).
inline int unpack_q3_scale(const uint8_t* s, int j) {
    const int lo = j < 8 ? (s[j] & 0xf) : (s[j - 8] >> 4);
    const int hi = (s[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
    return (lo | hi << 4) - 32;
}

// src: nb blocks of the type -> dst[nb * block_elems]
using DequantFn = void (*)(const uint8_t* src, float* dst, int64_t nb);
// src[nb * block_elems] -> dst: nb blocks. w: nullptr, or the importance of each element
// (nb * block_elems; an importance matrix's row): the fits then minimize the weighted
// squared error. Types without weighted fits ignore it.
using QuantFn = void (*)(const float* src, uint8_t* dst, int64_t nb, const float* w);

// Least-squares fits of a sub-block (quant_k.cpp), weighted by w[n] or (nullptr) equally:
// x ~ scale * q - min, q in [0, nmax], scale, min >= 0;
void fit_scale_min(const float* x, int n, int nmax, float& scale, float& min, const float* w);
// x ~ scale * q, q in [-nneg, nneg - 1] (returns the scale; its sign maps the largest
// magnitude near -nneg).
float fit_scale_sym(const float* x, int n, int nneg, const float* w);

void dequant_q2_k(const uint8_t* src, float* dst, int64_t nb);
void dequant_q3_k(const uint8_t* src, float* dst, int64_t nb);
void dequant_q4_k(const uint8_t* src, float* dst, int64_t nb);
void dequant_q5_k(const uint8_t* src, float* dst, int64_t nb);
void dequant_q6_k(const uint8_t* src, float* dst, int64_t nb);
void dequant_q8_k(const uint8_t* src, float* dst, int64_t nb);
void quant_q2_k(const float* src, uint8_t* dst, int64_t nb, const float* w);
void quant_q3_k(const float* src, uint8_t* dst, int64_t nb, const float* w);
void quant_q4_k(const float* src, uint8_t* dst, int64_t nb, const float* w);
void quant_q5_k(const float* src, uint8_t* dst, int64_t nb, const float* w);
void quant_q6_k(const float* src, uint8_t* dst, int64_t nb, const float* w);
void quant_q8_k(const float* src, uint8_t* dst, int64_t nb, const float* w);

void dequant_iq4_nl(const uint8_t* src, float* dst, int64_t nb);
void dequant_iq4_xs(const uint8_t* src, float* dst, int64_t nb);
void quant_iq4_nl(const float* src, uint8_t* dst, int64_t nb, const float* w);
void quant_iq4_xs(const float* src, uint8_t* dst, int64_t nb, const float* w);
void dequant_mxfp4(const uint8_t* src, float* dst, int64_t nb);
void quant_mxfp4(const float* src, uint8_t* dst, int64_t nb, const float* w);
void dequant_nvfp4(const uint8_t* src, float* dst, int64_t nb);
void quant_nvfp4(const float* src, uint8_t* dst, int64_t nb, const float* w);

void dequant_tq1_0(const uint8_t* src, float* dst, int64_t nb);
void dequant_tq2_0(const uint8_t* src, float* dst, int64_t nb);
void dequant_q1_0(const uint8_t* src, float* dst, int64_t nb);
void quant_tq1_0(const float* src, uint8_t* dst, int64_t nb, const float* w);
void quant_tq2_0(const float* src, uint8_t* dst, int64_t nb, const float* w);
void quant_q1_0(const float* src, uint8_t* dst, int64_t nb, const float* w);

// Little-endian scalar loads/stores (blocks are byte-packed, so no aligned access).
inline float load_f16(const uint8_t* p);  // defined below via quant.h's converters
inline uint16_t load_u16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}
inline uint32_t load_u32(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}
inline void store_u16(uint8_t* p, uint16_t v) {
    std::memcpy(p, &v, 2);
}
inline float load_f32(const uint8_t* p) {
    float v;
    std::memcpy(&v, p, 4);
    return v;
}
inline void store_f32(uint8_t* p, float v) {
    std::memcpy(p, &v, 4);
}

// Fast half -> float (exact; handles subnormals, inf, nan), branch-free so loops vectorize.
inline float half_to_float(uint16_t h) {
    const uint32_t rest = h & 0x7fffu;
    uint32_t bits = rest << 13;  // exponent and mantissa moved to float position
    float f;
    std::memcpy(&f, &bits, 4);
    f *= 0x1p112f;  // rebias exponent 15 -> 127 (also scales subnormals exactly)
    std::memcpy(&bits, &f, 4);
    // inf/nan: the product is 2^16 * 1.m; force the exponent to all ones, keep m.
    bits |= (rest >= 0x7c00u ? 0x7f800000u : 0u) | uint32_t(h & 0x8000u) << 16;
    std::memcpy(&f, &bits, 4);
    return f;
}
inline float load_f16(const uint8_t* p) {
    return half_to_float(load_u16(p));
}

// Nearest integer (ties to even) without a libm call: adding 1.5 * 2^23 leaves the
// rounded integer in the low mantissa bits. Inputs are clamped to +-2^22 (callers clamp
// codes to far smaller ranges); nan gives an arbitrary value, never undefined behaviour.
inline int nearest_int(float v) {
    v = v > 4194303.0f ? 4194303.0f : (v < -4194303.0f ? -4194303.0f : v);
    const float f = v + 12582912.0f;
    int32_t i;
    std::memcpy(&i, &f, 4);
    return (i & 0x007fffff) - 0x00400000;
}

}  // namespace kvrun::quant_detail
