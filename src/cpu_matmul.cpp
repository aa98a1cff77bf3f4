// cpu::matmul, the weight x activation product of the CPU backend: out[t][o] = W[o] . x[t].
//
// The reference arithmetic is dot_f32's: the weight row dequantized exactly to float, each
// product w[i] * x[i] rounded to float and added into lane i % 8 of eight float
// accumulators, in increasing i, the lanes combined as ((0+4)+(1+5))+((2+6)+(3+7)). This
// file computes exactly those bits (test_cpu_ops compares them with dequantize_row + dot),
// in the order a cache and a vector unit like:
//
// - four weight rows at a time, dequantized one span (kSpan elements) at a time into a
//   buffer that stays in L1, instead of a whole row into a buffer the size of L2;
// - those rows dotted with a tile of kTokenTile tokens while the span is hot, so prefill
//   reads each weight once per tile instead of reading all activations once per row;
// - the eight lanes of one dot are one 8-float vector (GCC/Clang vector extensions, plain
//   SSE on the portable build, AVX2 in the x86-64-v3 clone of KVRUN_SIMD_CLONES), and the
//   four rows' vectors are independent chains that keep the adders busy;
// - F16, Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, Q2_K..Q6_K, IQ4_NL/IQ4_XS, MXFP4/NVFP4, TQ1_0/TQ2_0 and
//   Q1_0 decode eight elements per vector operation; BF16 (whose generic decoder vectorizes
//   as well) and F16 rows whose width is not a multiple of 8 go through dequantize_row.
//
// The build disables FP contraction, so every clone rounds alike.
#include <algorithm>
#include <cstring>

#include "common.h"
#include "cpu_llamacpp.h"
#include "cpu_ops.h"
#include "quant.h"
#include "quant_impl.h"
#include "simd.h"
#include "thread_pool.h"

namespace kvrun::cpu {
namespace {

using i32x8 = int32_t __attribute__((vector_size(32)));
using u32x8 = uint32_t __attribute__((vector_size(32)));
using u16x8 = uint16_t __attribute__((vector_size(16)));
using u8x16 = uint8_t __attribute__((vector_size(16)));
using i8x16 = int8_t __attribute__((vector_size(16)));

constexpr int kLanes = 8;           // accumulators per dot (dot_f32's)
constexpr int kGroup = 4;           // weight rows decoded and dotted together
constexpr int64_t kSpan = 256;      // elements of a row dequantized at once (multiple of 8)
constexpr int64_t kTokenTile = 16;  // tokens dotted with a span while it sits in L1

// Eight bytes widened to 32-bit lanes (a loop the vectorizer turns into one vpmovzxbd /
// vpmovsxbd; __builtin_convertvector of an 8-byte vector is extracted lane by lane).
template <class Byte>
[[gnu::always_inline]] inline i32x8 widen8(const Byte* p) {
    int32_t v[8];
    for (int j = 0; j < 8; ++j) v[j] = p[j];
    i32x8 out;
    std::memcpy(&out, v, sizeof out);
    return out;
}

// Eight f16 values to float, exactly (quant_detail::half_to_float on eight lanes):
// exponent and mantissa moved into float position and rebiased by a multiply by 2^112
// (which also scales subnormals exactly); inf/nan get an all-ones exponent.
[[gnu::always_inline]] inline f32x8 halves8(u16x8 h) {
    const u32x8 bits = __builtin_convertvector(h, u32x8);
    const u32x8 rest = bits & 0x7fffu;
    const u32x8 moved = rest << 13;
    f32x8 f;
    std::memcpy(&f, &moved, sizeof f);
    f *= 0x1p112f;
    u32x8 out;
    std::memcpy(&out, &f, sizeof out);
    out |= ((u32x8)(rest >= 0x7c00u) & 0x7f800000u) | (bits & 0x8000u) << 16;
    std::memcpy(&f, &out, sizeof f);
    return f;
}

// The f16 scales d of the span's nb <= 8 blocks (at the start of each stride-byte block).
[[gnu::always_inline]] inline f32x8 block_scales(const uint8_t* src, int64_t nb, size_t stride) {
    u16x8 h = {};
    for (int64_t b = 0; b < nb; ++b) h[b] = quant_detail::load_u16(src + b * stride);
    return halves8(h);
}

// ---- span decoders: len elements (whole blocks, at most kSpan) of a row -> w[len] -----

// Legacy 4/5-bit blocks, 32 elements: Q4_0 [f16 d][16 B], Q4_1 [f16 d][f16 m][16 B],
// Q5_0 [f16 d][u32 qh][16 B], Q5_1 [f16 d][f16 m][u32 qh][16 B]. Element j < 16 is byte
// j's low nibble, j + 16 its high nibble, bit j of qh the fifth bit; d * q + m with a min,
// else d * (q - 8) resp. d * (q - 16).
template <bool kHasMin, bool kHasHigh>
[[gnu::always_inline]] inline void decode_q4q5(const uint8_t* src, float* w, int64_t len) {
    constexpr size_t kBytes = 2 + (kHasMin ? 2 : 0) + (kHasHigh ? 4 : 0) + 16;
    constexpr int kOffset = kHasMin ? 0 : (kHasHigh ? 16 : 8);
    const f32x8 d = block_scales(src, len / 32, kBytes);
    const f32x8 m = kHasMin ? block_scales(src + 2, len / 32, kBytes) : f32x8{};
    const u32x8 lane = {0, 1, 2, 3, 4, 5, 6, 7};
    for (int64_t b = 0; b < len / 32; ++b, src += kBytes, w += 32) {
        const uint32_t qh = kHasHigh ? quant_detail::load_u32(src + (kHasMin ? 4 : 2)) : 0;
        for (int half = 0; half < 2; ++half) {
            const i32x8 q32 = widen8(src + kBytes - 16 + 8 * half);  // two nibbles per lane
            i32x8 lo = q32 & 15, hi = q32 >> 4;
            if (kHasHigh) {  // element j's fifth bit is bit j of qh, j + 16's bit j + 16
                const u32x8 qhv = u32x8{} + qh, bit = (u32x8{} + (1u << (8 * half))) << lane;
                lo |= (i32x8)((qhv & bit) != 0) & 16;
                hi |= (i32x8)((qhv & (bit << 16)) != 0) & 16;
            }
            if (kHasMin) {
                store8(w + 8 * half, d[b] * __builtin_convertvector(lo, f32x8) + m[b]);
                store8(w + 16 + 8 * half, d[b] * __builtin_convertvector(hi, f32x8) + m[b]);
            } else {
                store8(w + 8 * half, d[b] * __builtin_convertvector(lo - kOffset, f32x8));
                store8(w + 16 + 8 * half, d[b] * __builtin_convertvector(hi - kOffset, f32x8));
            }
        }
    }
}

// IQ4 / MXFP4: 16 bytes of nibbles -> the 32 elements scale * book[nibble] (low nibbles
// first; book is kIq4Codebook or kMxfp4Values).
// The lookup is one byte shuffle per 16 codes on GCC (pshufb in the AVX2 clone).
[[gnu::always_inline]] inline void decode_iq4_32(const uint8_t* qs, float scale, float* w,
                                                 const int8_t* book = quant_detail::kIq4Codebook) {
    int8_t v[32];  // codebook values, element order
#if defined(__GNUC__) && !defined(__clang__)
    i8x16 lut;
    std::memcpy(&lut, book, 16);
    u8x16 q;
    std::memcpy(&q, qs, 16);
    const i8x16 lo = __builtin_shuffle(lut, q & 15), hi = __builtin_shuffle(lut, q >> 4);
    std::memcpy(v, &lo, 16);
    std::memcpy(v + 16, &hi, 16);
#else
    for (int j = 0; j < 16; ++j) {
        v[j] = book[qs[j] & 15];
        v[j + 16] = book[qs[j] >> 4];
    }
#endif
    for (int c = 0; c < 4; ++c)
        store8(w + 8 * c, scale * __builtin_convertvector(widen8(v + 8 * c), f32x8));
}

// IQ4_NL [f16 d][16 B], 32 elements.
[[gnu::always_inline]] inline void decode_iq4_nl(const uint8_t* src, float* w, int64_t len) {
    const f32x8 d = block_scales(src, len / 32, 18);
    for (int64_t b = 0; b < len / 32; ++b) decode_iq4_32(src + 18 * b + 2, d[b], w + 32 * b);
}

// MXFP4 [u8 e][16 B], 32 elements: 2^(e - 128) * kMxfp4Values[nibble].
[[gnu::always_inline]] inline void decode_mxfp4(const uint8_t* src, float* w, int64_t len) {
    for (int64_t b = 0; b < len / 32; ++b, src += 17, w += 32)
        decode_iq4_32(src + 1, quant_detail::mxfp4_scale(src[0]), w, quant_detail::kMxfp4Values);
}

// IQ4_XS [f16 d][u16 scales_h][4 B scales_l][128 B], 256 elements: sub-block j's 6-bit
// scale is nibble j of scales_l with bits 2j..2j+1 of scales_h on top, minus 32.
[[gnu::always_inline]] inline void decode_iq4_xs(const uint8_t* src, float* w) {
    const float d = quant_detail::load_f16(src);
    const uint16_t scales_h = quant_detail::load_u16(src + 2);
    for (int j = 0; j < 8; ++j) {
        const int ls =
            ((src[4 + j / 2] >> (4 * (j % 2))) & 0xf) | (((scales_h >> (2 * j)) & 3) << 4);
        decode_iq4_32(src + 8 + 16 * j, d * float(ls - 32), w + 32 * j);
    }
}

// NVFP4 [4 B UE4M3 scales][32 B], 64 elements: sub-block s of 16 is bytes 4 + 8s .. + 7
// (low nibbles first), nvfp4_scale(byte s) * kMxfp4Values[nibble].
// Two sub-blocks' 16 bytes at a time: their low nibbles' values (lo) and high nibbles' (hi)
// by one byte shuffle each on GCC, as decode_iq4_32 does.
[[gnu::always_inline]] inline void decode_nvfp4(const uint8_t* src, float* w, int64_t len) {
    for (int64_t b = 0; b < len / 64; ++b, src += 36, w += 64)
        for (int pair = 0; pair < 2; ++pair) {
            const uint8_t* qs = src + 4 + 16 * pair;
            int8_t lo[16], hi[16];
#if defined(__GNUC__) && !defined(__clang__)
            i8x16 lut;
            std::memcpy(&lut, quant_detail::kMxfp4Values, 16);
            u8x16 q;
            std::memcpy(&q, qs, 16);
            const i8x16 l = __builtin_shuffle(lut, q & 15), h = __builtin_shuffle(lut, q >> 4);
            std::memcpy(lo, &l, 16);
            std::memcpy(hi, &h, 16);
#else
            for (int j = 0; j < 16; ++j) {
                lo[j] = quant_detail::kMxfp4Values[qs[j] & 15];
                hi[j] = quant_detail::kMxfp4Values[qs[j] >> 4];
            }
#endif
            for (int k = 0; k < 2; ++k) {  // sub-block 2 * pair + k: bytes 8k .. 8k + 7
                const float d = quant_detail::nvfp4_scale(src[2 * pair + k]);
                float* y = w + 32 * pair + 16 * k;
                store8(y, d * __builtin_convertvector(widen8(lo + 8 * k), f32x8));
                store8(y + 8, d * __builtin_convertvector(widen8(hi + 8 * k), f32x8));
            }
        }
}

// TQ2_0 [64 B codes][f16 d], 256 elements: element 128h + 32l + m is bits 2l..2l+1 of byte
// 32h + m; d * (code - 1).
[[gnu::always_inline]] inline void decode_tq2_0(const uint8_t* src, float* w) {
    const float d = quant_detail::load_f16(src + 64);
    for (int h = 0; h < 2; ++h)
        for (int c = 0; c < 4; ++c) {  // bytes 32h + 8c .. + 7
            const i32x8 q = widen8(src + 32 * h + 8 * c);
            for (int l = 0; l < 4; ++l)
                store8(w + 128 * h + 32 * l + 8 * c,
                       d * __builtin_convertvector(((q >> (2 * l)) & 3) - 1, f32x8));
        }
}

// TQ1_0 [48 B qs][4 B qh][f16 d], 256 elements (layout: quant_ternary.cpp): trit n of byte b
// is ((b * 3^n mod 256) * 3) >> 8; d * (trit - 1).
[[gnu::always_inline]] inline void decode_tq1_0(const uint8_t* src, float* w) {
    const float d = quant_detail::load_f16(src + 52);
    constexpr int kPow3[5] = {1, 3, 9, 27, 81};
    for (int c = 0; c < 6; ++c) {  // qs[8c .. 8c + 7]: elements 32n + 8c .. (c < 4), else
                                   // 160 + 16n + 8(c - 4) ..
        const i32x8 b = widen8(src + 8 * c);
        for (int n = 0; n < 5; ++n) {
            const i32x8 trit = ((((b * kPow3[n]) & 255) * 3) >> 8) - 1;
            store8(w + (c < 4 ? 32 * n + 8 * c : 160 + 16 * n + 8 * (c - 4)),
                   d * __builtin_convertvector(trit, f32x8));
        }
    }
    for (int n = 0; n < 4; ++n)  // qh[m]: elements 240 + 4n + m
        for (int m = 0; m < 4; ++m)
            w[240 + 4 * n + m] = d * float(((int(uint8_t(src[48 + m] * kPow3[n])) * 3) >> 8) - 1);
}

// Q1_0 [f16 d][16 B bits], 128 elements: bit j % 8 of byte j / 8 set is +d, clear -d.
[[gnu::always_inline]] inline void decode_q1_0(const uint8_t* src, float* w, int64_t len) {
    const i32x8 bit = {1, 2, 4, 8, 16, 32, 64, 128};
    for (int64_t b = 0; b < len / 128; ++b, src += 18, w += 128) {
        const float d = quant_detail::load_f16(src);
        const f32x8 pos = f32x8{} + d, neg = f32x8{} - d;
        for (int j = 0; j < 16; ++j) {
            const i32x8 set = ((i32x8{} + src[2 + j]) & bit) != 0;  // all ones where set
            store8(w + 8 * j, (f32x8)(((i32x8)pos & set) | ((i32x8)neg & ~set)));
        }
    }
}

// Q8_0 [f16 d][32 x int8]: d * q.
[[gnu::always_inline]] inline void decode_q8_0(const uint8_t* src, float* w, int64_t len) {
    const f32x8 d = block_scales(src, len / 32, 34);
    for (int64_t b = 0; b < len / 32; ++b, src += 34, w += 32)
        for (int c = 0; c < 4; ++c) {
            const i32x8 q32 = widen8(reinterpret_cast<const int8_t*>(src + 2 + 8 * c));
            store8(w + 8 * c, d[b] * __builtin_convertvector(q32, f32x8));
        }
}

// Q2_K [16 B scale/min nibbles][64 B codes][f16 d][f16 dmin] and Q3_K [32 B hmask][64 B
// codes][12 B 6-bit scales][f16 d], 256 elements: element 128n + 32s + l has bits 2s..2s+1
// of qs[32n + l]; Q3_K's third bit is bit 4n + s of hmask[l], a clear bit subtracting 4.
// Scale e / 16: Q2_K d * sc - dmin * m, Q3_K d * (signed 6-bit scale).
template <bool kQ3>
[[gnu::always_inline]] inline void decode_q23_k(const uint8_t* src, float* w) {
    const uint8_t* qs = src + (kQ3 ? 32 : 16);
    const float d = quant_detail::load_f16(src + (kQ3 ? 108 : 80));
    const float dmin = kQ3 ? 0.0f : quant_detail::load_f16(src + 82);
    for (int n = 0; n < 2; ++n)
        for (int c = 0; c < 4; ++c) {  // elements 8c..8c+7 of each of the four 32-runs s
            const i32x8 q = widen8(qs + 32 * n + 8 * c);
            const i32x8 hm = kQ3 ? widen8(src + 8 * c) : i32x8{};
            for (int s = 0; s < 4; ++s) {
                const int j = 8 * n + 2 * s + c / 2;  // scale index e / 16
                const i32x8 low = (q >> (2 * s)) & 3;
                float* y = w + 128 * n + 32 * s + 8 * c;
                if (kQ3) {
                    const float dl = d * float(quant_detail::unpack_q3_scale(src + 96, j));
                    const i32x8 v = low - 4 + (((hm >> (4 * n + s)) & 1) << 2);
                    store8(y, dl * __builtin_convertvector(v, f32x8));
                } else {
                    const float dl = d * float(src[j] & 0xf), ml = dmin * float(src[j] >> 4);
                    store8(y, dl * __builtin_convertvector(low, f32x8) - ml);
                }
            }
        }
}

// Q4_K [f16 d][f16 dmin][12 B scales/mins][128 B nibbles] and Q5_K (+ [32 B high bits]
// before the nibbles), 256 elements: sub-block j of 32 is the low (j even) or high nibble
// of bytes 32 * (j / 2) .. + 31, bit j of qh[l] its fifth bit; d * sc * q - dmin * m.
template <bool kHigh>
[[gnu::always_inline]] inline void decode_q45_k(const uint8_t* src, float* w) {
    const float d = quant_detail::load_f16(src), dmin = quant_detail::load_f16(src + 2);
    const uint8_t* qh = src + 16;
    const uint8_t* qs = src + (kHigh ? 48 : 16);
    for (int j = 0; j < 8; ++j) {
        int sc, m;
        quant_detail::unpack_scale_min(src + 4, j, sc, m);
        const float dl = d * float(sc), ml = dmin * float(m);
        const int shift = 4 * (j & 1);
        for (int c = 0; c < 4; ++c) {
            i32x8 v = (widen8(qs + 32 * (j / 2) + 8 * c) >> shift) & 15;
            if (kHigh) v |= ((widen8(qh + 8 * c) >> j) & 1) << 4;
            store8(w + 32 * j + 8 * c, dl * __builtin_convertvector(v, f32x8) - ml);
        }
    }
}

// Q6_K [128 B low nibbles][64 B high 2 bits][16 x int8 scales][f16 d], 256 elements:
// element 128n + 32s + l is the low (s < 2) or high nibble of ql[64n + 32(s & 1) + l] with
// bits 2s..2s+1 of qh[32n + l] on top, minus 32, times d * scales[e / 16].
[[gnu::always_inline]] inline void decode_q6_k(const uint8_t* src, float* w) {
    const uint8_t* ql = src;
    const uint8_t* qh = src + 128;
    const auto* scales = reinterpret_cast<const int8_t*>(src + 192);
    const float d = quant_detail::load_f16(src + 208);
    for (int n = 0; n < 2; ++n)
        for (int c = 0; c < 4; ++c) {  // elements 8c..8c+7 of each of the four 32-runs s
            const i32x8 low[2] = {widen8(ql + 64 * n + 8 * c), widen8(ql + 64 * n + 32 + 8 * c)};
            const i32x8 high = widen8(qh + 32 * n + 8 * c);
            for (int s = 0; s < 4; ++s) {
                const float dl = d * float(scales[8 * n + 2 * s + c / 2]);
                const i32x8 lo = (low[s & 1] >> (4 * (s >> 1))) & 15;
                const i32x8 hi = (high >> (2 * s)) & 3;
                store8(w + 128 * n + 32 * s + 8 * c,
                       dl * __builtin_convertvector((lo | hi << 4) - 32, f32x8));
            }
        }
}

// F16 rows (len a multiple of 8).
[[gnu::always_inline]] inline void decode_f16(const uint8_t* src, float* w, int64_t len) {
    for (int64_t i = 0; i < len; i += 8) {
        u16x8 h;
        std::memcpy(&h, src + 2 * i, 16);
        store8(w + i, halves8(h));
    }
}

// The span's floats: the row itself for F32, else decoded into w.
[[gnu::always_inline]] inline const float* decode_span(GgmlType type, const uint8_t* src, float* w,
                                                       int64_t len) {
    switch (type) {
        case GgmlType::F32:
            return reinterpret_cast<const float*>(src);
        case GgmlType::Q4_0:
            decode_q4q5<false, false>(src, w, len);
            break;
        case GgmlType::Q4_1:
            decode_q4q5<true, false>(src, w, len);
            break;
        case GgmlType::Q5_0:
            decode_q4q5<false, true>(src, w, len);
            break;
        case GgmlType::Q5_1:
            decode_q4q5<true, true>(src, w, len);
            break;
        case GgmlType::Q8_0:
            decode_q8_0(src, w, len);
            break;
        case GgmlType::IQ4_NL:
            decode_iq4_nl(src, w, len);
            break;
        case GgmlType::MXFP4:
            decode_mxfp4(src, w, len);
            break;
        case GgmlType::NVFP4:
            decode_nvfp4(src, w, len);
            break;
        case GgmlType::Q1_0:
            decode_q1_0(src, w, len);
            break;
        // The 256-element types: a span is one block.
        case GgmlType::IQ4_XS:
            decode_iq4_xs(src, w);
            break;
        case GgmlType::Q2_K:
            decode_q23_k<false>(src, w);
            break;
        case GgmlType::Q3_K:
            decode_q23_k<true>(src, w);
            break;
        case GgmlType::Q4_K:
            decode_q45_k<false>(src, w);
            break;
        case GgmlType::Q5_K:
            decode_q45_k<true>(src, w);
            break;
        case GgmlType::Q6_K:
            decode_q6_k(src, w);
            break;
        case GgmlType::TQ1_0:
            decode_tq1_0(src, w);
            break;
        case GgmlType::TQ2_0:
            decode_tq2_0(src, w);
            break;
        case GgmlType::F16:
            if (len % 8 == 0) {
                decode_f16(src, w, len);
                break;
            }
            [[fallthrough]];
        default:
            dequantize_row(type, src, w, len);
    }
    return w;
}

// ---- the tile kernel ---------------------------------------------------------------------

// out[t0 + t][o0 + r] for t < n_tok, r < R. x: [n_rows][n_in]; out: [n_rows][n_out].
template <int R>
KVRUN_SIMD_CLONES void rows_times_tile(const WeightView& w, const float* x, int64_t t0,
                                       int64_t n_tok, int64_t o0, float* out) {
    const int64_t n_in = w.n_in, block = ggml_type_traits(w.type).block_elems;
    const int64_t span = kSpan - kSpan % block;  // whole blocks (a K-quant's 256)
    const size_t span_bytes = ggml_row_bytes(w.type, span);
    alignas(32) float wspan[R][kSpan];
    f32x8 acc[kTokenTile][R];  // [n_tok][R], only the tile's tokens zeroed
    for (int64_t t = 0; t < n_tok; ++t)
        for (int r = 0; r < R; ++r) acc[t][r] = f32x8{};
    const auto* row0 = static_cast<const uint8_t*>(w.data) + o0 * w.row_bytes;
    for (int64_t i0 = 0, s = 0; i0 < n_in; i0 += span, ++s) {
        const int64_t len = std::min(span, n_in - i0), full = len - len % kLanes;
        const float* wr[R];  // [R][len]
        for (int r = 0; r < R; ++r)
            wr[r] = decode_span(w.type, row0 + r * w.row_bytes + s * span_bytes, wspan[r], len);
        for (int64_t t = 0; t < n_tok; ++t) {
            const float* xt = x + (t0 + t) * n_in + i0;  // [len]
            f32x8 a[R];
            for (int r = 0; r < R; ++r) a[r] = acc[t][r];
            for (int64_t i = 0; i < full; i += kLanes) {
                const f32x8 xv = load8(xt + i);
                for (int r = 0; r < R; ++r) a[r] += load8(wr[r] + i) * xv;
            }
            for (int64_t i = full; i < len; ++i)  // a tail shorter than 8 (F32/F16 rows only)
                for (int r = 0; r < R; ++r) a[r][i % kLanes] += wr[r][i] * xt[i];
            for (int r = 0; r < R; ++r) acc[t][r] = a[r];
        }
    }
    for (int64_t t = 0; t < n_tok; ++t)
        for (int r = 0; r < R; ++r) {
            out[(t0 + t) * w.n_out + o0 + r] = sum_lanes(acc[t][r]);
        }
}

}  // namespace

void matmul(float* out, const float* x, const WeightView& w, int64_t n_rows) {
    if (!w.data || w.n_in <= 0 || w.n_out <= 0)
        fail("matmul: empty weight view ({} x {})", w.n_out, w.n_in);
    if (w.scale != 1.0f) {  // the rows' product, then the tensor's factor
        WeightView rows = w;
        rows.scale = 1.0f;
        matmul(out, x, rows, n_rows);
        for (int64_t i = 0; i < n_rows * w.n_out; ++i) out[i] *= w.scale;
        return;
    }
    if (llamacpp_rounding()) return llamacpp::matmul(out, x, w, n_rows);
    const int64_t n_groups = (w.n_out + kGroup - 1) / kGroup;
    cpu_thread_pool().parallel_for(n_groups, parallel_grain(kGroup * w.n_in * n_rows),
                                   [&](int64_t g0, int64_t g1) {
                                       const int64_t o_end = std::min(g1 * kGroup, w.n_out);
                                       for (int64_t t0 = 0; t0 < n_rows; t0 += kTokenTile) {
                                           const int64_t n_tok = std::min(kTokenTile, n_rows - t0);
                                           int64_t o = g0 * kGroup;
                                           for (; o + kGroup <= o_end; o += kGroup)
                                               rows_times_tile<kGroup>(w, x, t0, n_tok, o, out);
                                           for (; o < o_end; ++o)
                                               rows_times_tile<1>(w, x, t0, n_tok, o, out);
                                       }
                                   });
}

}  // namespace kvrun::cpu
