// Device-side block decoders for every weight type the CUDA kernels compute with, and the
// dispatcher that maps a GgmlType to its decoder. Layouts follow src/quant.cpp (the ggml
// formats) bit for bit.
//
// A decoder ("loader") splits a row into items of kItem consecutive elements and decodes one
// item into registers: load(row, item, v) writes v[0..kItem) = elements
// [item * kItem, (item + 1) * kItem) of the row. Legacy 32-element types: one item = one
// block. K-quants / IQ4_XS: one item = one 32-element sub-block of a 256-element super-block.
// Float types: 8 elements per 16-byte load, or 1 (scalar) when rows are not 16-byte aligned.
// Each loader uses the widest loads its block alignment allows (row starts are assumed
// 16-byte aligned, which the launchers check).
#pragma once

#include "cuda/common.cuh"
#include "gguf.h"

namespace kvrun::cu {

// Loads kBytes (multiple of 4) from p, known to be kAlign-byte aligned, as 32-bit words.
template <int kAlign, int kBytes>
__device__ __forceinline__ void load_words(const uint8_t* p, uint32_t* w) {
    static_assert(kBytes % 4 == 0, "whole words only");
    if constexpr (kAlign >= 16 && kBytes % 16 == 0) {
#pragma unroll
        for (int i = 0; i < kBytes / 16; ++i) {
            const uint4 q = reinterpret_cast<const uint4*>(p)[i];
            w[4 * i] = q.x, w[4 * i + 1] = q.y, w[4 * i + 2] = q.z, w[4 * i + 3] = q.w;
        }
    } else if constexpr (kAlign >= 8 && kBytes % 8 == 0) {
#pragma unroll
        for (int i = 0; i < kBytes / 8; ++i) {
            const uint2 q = reinterpret_cast<const uint2*>(p)[i];
            w[2 * i] = q.x, w[2 * i + 1] = q.y;
        }
    } else if constexpr (kAlign >= 4) {
#pragma unroll
        for (int i = 0; i < kBytes / 4; ++i) w[i] = reinterpret_cast<const uint32_t*>(p)[i];
    } else {
        // 2-byte aligned: the aligned words around p shifted into place, one 32-bit load per
        // word instead of two 16-bit ones. When p is not 4-byte aligned the last 2 bytes come
        // from a 16-bit load (the aligned word holding them would reach 2 bytes past the data).
        constexpr int n = kBytes / 4;
        const uintptr_t addr = reinterpret_cast<uintptr_t>(p);
        const uint32_t* a = reinterpret_cast<const uint32_t*>(addr & ~uintptr_t(3));
        const unsigned shift = unsigned(addr & 2u) * 8u;  // 0 or 16
        uint32_t lo = a[0];
#pragma unroll
        for (int i = 0; i < n; ++i) {
            const uint32_t hi = i + 1 < n ? a[i + 1] : (shift ? ld_u16(p + kBytes - 2) : 0u);
            w[i] = __funnelshift_r(lo, hi, shift);
            lo = hi;
        }
    }
}

// Byte l of a little-endian word array.
__device__ __forceinline__ uint32_t byte_at(const uint32_t* w, int l) {
    return (w[l >> 2] >> (8 * (l & 3))) & 0xffu;
}

// IQ4 non-linear codebook: value of 4-bit code q, via byte selection from packed constants
// (no table memory, so divergent codes cost nothing extra).
// The code's value as a signed byte (in the low byte).
__device__ __forceinline__ uint32_t iq4_byte(uint32_t q) {
    // codes 0..15 -> -127 -104 -83 -65 -49 -35 -22 -10 1 13 25 38 53 69 89 113 (int8 bytes)
    constexpr uint32_t k0 = 0xbfad9881u, k1 = 0xf6eaddcfu, k2 = 0x26190d01u, k3 = 0x71594535u;
    return (q < 8 ? __byte_perm(k0, k1, q) : __byte_perm(k2, k3, q - 8)) & 0xffu;
}
__device__ __forceinline__ float iq4_value(uint32_t q) {
    return sbyte_float(iq4_byte(q));
}

// MXFP4's doubled E2M1 value of code q (quant_detail::kMxfp4Values), by byte selection like
// iq4_value: 0 1 2 3 4 6 8 12 0 -1 -2 -3 -4 -6 -8 -12.
__device__ __forceinline__ float mxfp4_value(uint32_t q) {
    constexpr uint32_t k0 = 0x03020100u, k1 = 0x0c080604u, k2 = 0xfdfeff00u, k3 = 0xf4f8fafcu;
    const uint32_t b = q < 8 ? __byte_perm(k0, k1, q) : __byte_perm(k2, k3, q - 8);
    return sbyte_float(b & 0xffu);
}

// ---- float types ---------------------------------------------------------------------------

struct LoadF32x8 {
    static constexpr int kItem = 8;
    __device__ static void load(const uint8_t* row, int64_t it, float* v) {
        const float4* p = reinterpret_cast<const float4*>(row) + 2 * it;
        const float4 a = p[0], b = p[1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z,
        v[7] = b.w;
    }
};
struct LoadF32x1 {
    static constexpr int kItem = 1;
    __device__ static void load(const uint8_t* row, int64_t it, float* v) {
        v[0] = reinterpret_cast<const float*>(row)[it];
    }
};
struct LoadF16x8 {
    static constexpr int kItem = 8;
    __device__ static void load(const uint8_t* row, int64_t it, float* v) {
        const uint4 q = reinterpret_cast<const uint4*>(row)[it];
        const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
            v[2 * i] = f.x, v[2 * i + 1] = f.y;
        }
    }
};
struct LoadF16x1 {
    static constexpr int kItem = 1;
    __device__ static void load(const uint8_t* row, int64_t it, float* v) {
        v[0] = __half2float(reinterpret_cast<const __half*>(row)[it]);
    }
};
struct LoadBF16x8 {
    static constexpr int kItem = 8;
    __device__ static void load(const uint8_t* row, int64_t it, float* v) {
        const uint4 q = reinterpret_cast<const uint4*>(row)[it];
        const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            v[2 * i] = __uint_as_float(w[i] << 16);
            v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
    }
};
struct LoadBF16x1 {
    static constexpr int kItem = 1;
    __device__ static void load(const uint8_t* row, int64_t it, float* v) {
        v[0] = bf16_bits_to_float(reinterpret_cast<const uint16_t*>(row)[it]);
    }
};

// ---- legacy 32-element blocks ----------------------------------------------------------------

// Q4_0 [f16 d][16 B nibbles], 18 B: x = d * (q - 8); element j < 16 low nibble of byte j.
// IQ4_NL has the same layout with x = d * codebook[q].
template <bool kCodebook>
struct LoadQ4_0 {
    static constexpr int kItem = 32;
    __device__ static void load(const uint8_t* row, int64_t it, float* v) {
        const uint8_t* b = row + it * 18;
        const float d = ld_f16(b);
        uint32_t w[4];
        load_words<2, 16>(b + 2, w);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const uint32_t q = byte_at(w, j);
            if constexpr (kCodebook) {
                v[j] = d * iq4_value(q & 0xf);
                v[j + 16] = d * iq4_value(q >> 4);
            } else {
                v[j] = d * code_float<8>(q & 0xf);
                v[j + 16] = d * code_float<8>(q >> 4);
            }
        }
    }
};

// Q4_1 [f16 d][f16 m][16 B nibbles], 20 B: x = d * q + m.
struct LoadQ4_1 {
    static constexpr int kItem = 32;
    __device__ static void load(const uint8_t* row, int64_t it, float* v) {
        const uint8_t* b = row + it * 20;
        const float d = ld_f16(b), m = ld_f16(b + 2);
        uint32_t w[4];
        load_words<4, 16>(b + 4, w);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const uint32_t q = byte_at(w, j);
            v[j] = d * code_float(q & 0xf) + m;
            v[j + 16] = d * code_float(q >> 4) + m;
        }
    }
};

// Q5_0 [f16 d][u32 qh][16 B nibbles], 22 B: bit j of qh is bit 4 of element j; x = d*(q-16).
struct LoadQ5_0 {
    static constexpr int kItem = 32;
    __device__ static void load(const uint8_t* row, int64_t it, float* v) {
        const uint8_t* b = row + it * 22;
        const float d = ld_f16(b);
        const uint32_t qh = ld_u32_a2(b + 2);
        uint32_t w[4];
        load_words<2, 16>(b + 6, w);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const uint32_t q = byte_at(w, j);
            const uint32_t lo = (q & 0xf) | (((qh >> j) & 1) << 4);
            const uint32_t hi = (q >> 4) | (((qh >> (j + 16)) & 1) << 4);
            v[j] = d * code_float<16>(lo);
            v[j + 16] = d * code_float<16>(hi);
        }
    }
};

// Q5_1 [f16 d][f16 m][u32 qh][16 B nibbles], 24 B: x = d * q + m.
struct LoadQ5_1 {
    static constexpr int kItem = 32;
    __device__ static void load(const uint8_t* row, int64_t it, float* v) {
        const uint8_t* b = row + it * 24;
        const float d = ld_f16(b), m = ld_f16(b + 2);
        const uint32_t qh = *reinterpret_cast<const uint32_t*>(b + 4);
        uint32_t w[4];
        load_words<8, 16>(b + 8, w);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const uint32_t q = byte_at(w, j);
            const uint32_t lo = (q & 0xf) | (((qh >> j) & 1) << 4);
            const uint32_t hi = (q >> 4) | (((qh >> (j + 16)) & 1) << 4);
            v[j] = d * code_float(lo) + m;
            v[j + 16] = d * code_float(hi) + m;
        }
    }
};

// Q8_0 [f16 d][32 x int8], 34 B: x = d * q.
struct LoadQ8_0 {
    static constexpr int kItem = 32;
    __device__ static void load(const uint8_t* row, int64_t it, float* v) {
        const uint8_t* b = row + it * 34;
        const float d = ld_f16(b);
        uint32_t w[8];
        load_words<2, 32>(b + 2, w);
#pragma unroll
        for (int j = 0; j < 32; ++j) v[j] = d * sbyte_float(byte_at(w, j));
    }
};

// ---- K-quants and IQ4_XS (256-element super-blocks, item = 32-element sub-block s) ------------

// 6-bit scale and min of sub-block s from the 12 packed bytes of Q4_K / Q5_K.
__device__ __forceinline__ void k4_scale_min(const uint32_t* sw, int s, float* sc, float* mn) {
    if (s < 4) {
        *sc = float(byte_at(sw, s) & 63);
        *mn = float(byte_at(sw, s + 4) & 63);
    } else {
        *sc = float((byte_at(sw, s + 4) & 0xf) | ((byte_at(sw, s - 4) >> 6) << 4));
        *mn = float((byte_at(sw, s + 4) >> 4) | ((byte_at(sw, s) >> 6) << 4));
    }
}

// Q2_K [16 B scales (lo 4 bits scale, hi 4 bits min)][64 B qs][f16 d][f16 dmin], 84 B.
// Sub-block s = 4h + j: 2-bit codes (qs[32h + l] >> 2j) & 3, scale byte 2s + l/16;
// x = d * (sc & 15) * q - dmin * (sc >> 4).
struct LoadQ2_K {
    static constexpr int kItem = 32;
    __device__ static void load(const uint8_t* row, int64_t it, float* v) {
        const uint8_t* b = row + (it >> 3) * 84;
        const int s = int(it & 7), h = s >> 2, j = s & 3;
        const float d = ld_f16(b + 80), dmin = ld_f16(b + 82);
        const uint32_t sc_w = ld_u16(b + 2 * s);  // scale bytes 2s, 2s + 1
        uint32_t w[8];
        load_words<4, 32>(b + 16 + 32 * h, w);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const uint32_t sc = (sc_w >> (8 * half)) & 0xff;
            const float dl = d * float(sc & 0xf), ml = dmin * float(sc >> 4);
#pragma unroll
            for (int l = 0; l < 16; ++l) {
                const uint32_t q = (byte_at(w, 16 * half + l) >> (2 * j)) & 3;
                v[16 * half + l] = dl * code_float(q) - ml;
            }
        }
    }
};

// Q3_K [32 B hmask][64 B qs][12 B packed 6-bit scales][f16 d], 110 B.
// Sub-block s = 4h + j: low bits (qs[32h + l] >> 2j) & 3, minus 4 unless bit s of hmask[l]
// is set; scale k = 2s + l/16 (6-bit, stored biased by 32): x = d * (scale - 32) * q.
struct LoadQ3_K {
    static constexpr int kItem = 32;
    __device__ static int scale(const uint8_t* sc, int k) {
        const int lo = k < 8 ? (sc[k] & 0xf) : (sc[k - 8] >> 4);
        const int hi = (sc[8 + (k & 3)] >> (2 * (k >> 2))) & 3;
        return (lo | (hi << 4)) - 32;
    }
    __device__ static void load(const uint8_t* row, int64_t it, float* v) {
        const uint8_t* b = row + (it >> 3) * 110;
        const int s = int(it & 7), h = s >> 2, j = s & 3;
        const float d = ld_f16(b + 108);
        uint32_t qw[8], hw[8];
        load_words<2, 32>(b + 32 + 32 * h, qw);
        load_words<2, 32>(b, hw);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const float dl = d * float(scale(b + 96, 2 * s + half));
#pragma unroll
            for (int l = 0; l < 16; ++l) {
                const int idx = 16 * half + l;
                // q = low bits - 4 unless the high bit is set: (low + 4 * bit) - 4.
                const uint32_t u =
                    ((byte_at(qw, idx) >> (2 * j)) & 3) | (((byte_at(hw, idx) >> s) & 1) << 2);
                v[idx] = dl * code_float<4>(u);
            }
        }
    }
};

// Q4_K [f16 d][f16 dmin][12 B scales/mins][128 B qs], 144 B. Sub-block s: nibbles of
// qs[32 * (s/2) + l], low for even s, high for odd; x = d * sc_s * q - dmin * m_s.
struct LoadQ4_K {
    static constexpr int kItem = 32;
    __device__ static void load(const uint8_t* row, int64_t it, float* v) {
        const uint8_t* b = row + (it >> 3) * 144;
        const int s = int(it & 7);
        uint32_t sw[3];
        load_words<4, 12>(b + 4, sw);
        float sc, mn;
        k4_scale_min(sw, s, &sc, &mn);
        const float d = ld_f16(b) * sc, m = ld_f16(b + 2) * mn;
        uint32_t w[8];
        load_words<16, 32>(b + 16 + 32 * (s >> 1), w);
        const int shift = 4 * (s & 1);
#pragma unroll
        for (int l = 0; l < 32; ++l) v[l] = d * code_float((byte_at(w, l) >> shift) & 0xf) - m;
    }
};

// Q5_K [f16 d][f16 dmin][12 B scales/mins][32 B qh][128 B qs], 176 B. Like Q4_K plus a 5th
// bit: bit s of qh[l]; x = d * sc_s * q - dmin * m_s.
struct LoadQ5_K {
    static constexpr int kItem = 32;
    __device__ static void load(const uint8_t* row, int64_t it, float* v) {
        const uint8_t* b = row + (it >> 3) * 176;
        const int s = int(it & 7);
        uint32_t sw[3];
        load_words<4, 12>(b + 4, sw);
        float sc, mn;
        k4_scale_min(sw, s, &sc, &mn);
        const float d = ld_f16(b) * sc, m = ld_f16(b + 2) * mn;
        uint32_t w[8], hw[8];
        load_words<16, 32>(b + 48 + 32 * (s >> 1), w);
        load_words<16, 32>(b + 16, hw);
        const int shift = 4 * (s & 1);
#pragma unroll
        for (int l = 0; l < 32; ++l) {
            const uint32_t q =
                ((byte_at(w, l) >> shift) & 0xf) | (((byte_at(hw, l) >> s) & 1) << 4);
            v[l] = d * code_float(q) - m;
        }
    }
};

// Q6_K [128 B ql][64 B qh][16 x int8 scales][f16 d], 210 B. Sub-block s = 4h + k: low 4 bits
// from ql[64h + 32(k&1) + l] (high nibble when k >= 2), high 2 bits (qh[32h + l] >> 2k) & 3;
// x = d * scale[8h + 2k + l/16] * (q - 32).
struct LoadQ6_K {
    static constexpr int kItem = 32;
    __device__ static void load(const uint8_t* row, int64_t it, float* v) {
        const uint8_t* b = row + (it >> 3) * 210;
        const int s = int(it & 7), h = s >> 2, k = s & 3;
        const float d = ld_f16(b + 208);
        uint32_t lw[8], hw[8];
        load_words<2, 32>(b + 64 * h + 32 * (k & 1), lw);
        load_words<2, 32>(b + 128 + 32 * h, hw);
        const uint32_t sc_w = ld_u16(b + 192 + 8 * h + 2 * k);
        const int lshift = 4 * (k >> 1);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const float dl = d * float(int8_t((sc_w >> (8 * half)) & 0xff));
#pragma unroll
            for (int l = 0; l < 16; ++l) {
                const int idx = 16 * half + l;
                const uint32_t q = ((byte_at(lw, idx) >> lshift) & 0xf) |
                                   (((byte_at(hw, idx) >> (2 * k)) & 3) << 4);
                v[idx] = dl * code_float<32>(q);
            }
        }
    }
};

// IQ4_XS [f16 d][u16 scales_h][4 B scales_l][128 B qs], 136 B. Sub-block s: 6-bit scale
// ls = (scales_l[s/2] >> 4(s&1)) & 15 | ((scales_h >> 2s) & 3) << 4; codes from qs[16s + j]
// (low nibble element j, high nibble j + 16); x = d * (ls - 32) * codebook[q].
// d * (ls - 32) of sub-block s of the IQ4_XS super-block at b (shared with gemv.cu's
// integer decoder).
__device__ __forceinline__ float iq4xs_scale(const uint8_t* b, int s) {
    const uint32_t head = *reinterpret_cast<const uint32_t*>(b);  // d, scales_h
    const uint32_t sl = *reinterpret_cast<const uint32_t*>(b + 4);
    const float d = __half2float(__ushort_as_half(uint16_t(head & 0xffff)));
    const int ls =
        int(((sl >> (8 * (s >> 1) + 4 * (s & 1))) & 0xf) | (((head >> (16 + 2 * s)) & 3) << 4));
    return d * float(ls - 32);
}

struct LoadIQ4_XS {
    static constexpr int kItem = 32;
    __device__ static void load(const uint8_t* row, int64_t it, float* v) {
        const uint8_t* b = row + (it >> 3) * 136;
        const int s = int(it & 7);
        const float dl = iq4xs_scale(b, s);
        uint32_t w[4];
        load_words<8, 16>(b + 8 + 16 * s, w);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const uint32_t q = byte_at(w, j);
            v[j] = dl * iq4_value(q & 0xf);
            v[j + 16] = dl * iq4_value(q >> 4);
        }
    }
};

using LoadIQ4_NL = LoadQ4_0<true>;

// MXFP4 [u8 e][16 B nibbles], 17 B (byte aligned): x = 2^(e - 128) * mxfp4_value(q), nibbles
// laid out like Q4_0.
struct LoadMXFP4 {
    static constexpr int kItem = 32;
    __device__ static void load(const uint8_t* row, int64_t it, float* v) {
        const uint8_t* b = row + it * 17;
        const uint32_t e = b[0];
        const float d = __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const uint32_t q = b[1 + j];
            v[j] = d * mxfp4_value(q & 0xf);
            v[j + 16] = d * mxfp4_value(q >> 4);
        }
    }
};

// NVFP4 [4 B UE4M3 scales][32 B nibbles], 36 B: sub-block k of 16 has scale
// nvfp4_scale(d[k]) (quant_detail::nvfp4_scale: halved, bit 7 ignored, 0x7f is 0) and bytes
// 4 + 8k .. + 7 (element j < 8 low nibble of byte j, j + 8 its high nibble). An item is two
// sub-blocks.
__device__ __forceinline__ float nvfp4_scale(uint32_t b) {
    const uint32_t e = (b >> 3) & 15, m = b & 7;
    if ((b & 0x7f) == 0x7f) return 0.0f;
    return e == 0 ? float(m) * 0x1p-10f : __uint_as_float((e + 119) << 23 | m << 20);
}

struct LoadNVFP4 {
    static constexpr int kItem = 32;
    __device__ static void load(const uint8_t* row, int64_t it, float* v) {
        const uint8_t* b = row + (it >> 1) * 36;
        const int half = int(it & 1);
        const uint32_t scales = *reinterpret_cast<const uint32_t*>(b);
        uint32_t w[4];
        load_words<4, 16>(b + 4 + 16 * half, w);
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const float d = nvfp4_scale((scales >> (16 * half + 8 * k)) & 0xffu);
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const uint32_t q = byte_at(w, 8 * k + j);
                v[16 * k + j] = d * mxfp4_value(q & 0xf);
                v[16 * k + j + 8] = d * mxfp4_value(q >> 4);
            }
        }
    }
};

// ---- ternary and binary types (quant_ternary.cpp has the layouts) ---------------------------

// TQ2_0 [64 B codes][f16 d], 66 B: sub-block s = 4h + l is bits 2l..2l+1 of bytes 32h ..
// 32h + 31; x = d * (code - 1).
struct LoadTQ2_0 {
    static constexpr int kItem = 32;
    __device__ static void load(const uint8_t* row, int64_t it, float* v) {
        const uint8_t* b = row + (it >> 3) * 66;
        const int s = int(it & 7), h = s >> 2, l = s & 3;
        const float d = ld_f16(b + 64);
        uint32_t w[8];
        load_words<2, 32>(b + 32 * h, w);
#pragma unroll
        for (int m = 0; m < 32; ++m) v[m] = d * code_float<1>((byte_at(w, m) >> (2 * l)) & 3);
    }
};

// Trit n of a TQ1_0 byte: ((b * 3^n) mod 256 * 3) >> 8.
__device__ __forceinline__ uint32_t tq1_trit(uint32_t b, uint32_t pow3) {
    return (((b * pow3) & 0xffu) * 3u) >> 8;
}

// TQ1_0 [48 B qs][4 B qh][f16 d], 54 B: sub-blocks 0..4 are trit s of qs[0..31]; 5 and 6
// trits 0,1 and 2,3 of qs[32..47] (16 elements each); 7 trit 4 of qs[32..47], then trit n of
// qh[m] at 16 + 4n + m. x = d * (trit - 1).
struct LoadTQ1_0 {
    static constexpr int kItem = 32;
    __device__ static void load(const uint8_t* row, int64_t it, float* v) {
        const uint8_t* b = row + (it >> 3) * 54;
        const int s = int(it & 7);
        const float d = ld_f16(b + 52);
        if (s < 5) {
            const uint32_t p = s == 0 ? 1u : s == 1 ? 3u : s == 2 ? 9u : s == 3 ? 27u : 81u;
            uint32_t w[8];
            load_words<2, 32>(b, w);
#pragma unroll
            for (int m = 0; m < 32; ++m) v[m] = d * code_float<1>(tq1_trit(byte_at(w, m), p));
            return;
        }
        uint32_t w[4];
        load_words<2, 16>(b + 32, w);
        const uint32_t p0 = s == 5 ? 1u : s == 6 ? 9u : 81u, p1 = s == 5 ? 3u : 27u;
#pragma unroll
        for (int m = 0; m < 16; ++m) v[m] = d * code_float<1>(tq1_trit(byte_at(w, m), p0));
        if (s < 7) {
#pragma unroll
            for (int m = 0; m < 16; ++m) v[16 + m] = d * code_float<1>(tq1_trit(byte_at(w, m), p1));
            return;
        }
        const uint32_t qh = ld_u32_a2(b + 48);
#pragma unroll
        for (int n = 0, p = 1; n < 4; ++n, p *= 3)
#pragma unroll
            for (int m = 0; m < 4; ++m)
                v[16 + 4 * n + m] = d * code_float<1>(tq1_trit((qh >> (8 * m)) & 0xffu, p));
    }
};

// Q1_0 [f16 d][16 B bits], 18 B: sub-block s is bits 32s .. 32s + 31; a set bit is +d.
struct LoadQ1_0 {
    static constexpr int kItem = 32;
    __device__ static void load(const uint8_t* row, int64_t it, float* v) {
        const uint8_t* b = row + (it >> 2) * 18;
        const float d = ld_f16(b);
        const uint32_t bits = ld_u32_a2(b + 2 + 4 * (it & 3));
#pragma unroll
        for (int j = 0; j < 32; ++j) v[j] = (bits >> j) & 1 ? d : -d;
    }
};

template <class L>
struct LoaderTag {
    using type = L;
};

// Calls f(LoaderTag<L>{}) with the decoder of type t; `vec` selects the 16-byte loaders of
// the float types (rows 16-byte aligned and n_in % 8 == 0). Returns false for a type the
// kernels do not handle.
template <class F>
bool with_loader(GgmlType t, bool vec, F&& f) {
    switch (t) {
        case GgmlType::F32:
            vec ? f(LoaderTag<LoadF32x8>{}) : f(LoaderTag<LoadF32x1>{});
            return true;
        case GgmlType::F16:
            vec ? f(LoaderTag<LoadF16x8>{}) : f(LoaderTag<LoadF16x1>{});
            return true;
        case GgmlType::BF16:
            vec ? f(LoaderTag<LoadBF16x8>{}) : f(LoaderTag<LoadBF16x1>{});
            return true;
        case GgmlType::Q4_0:
            f(LoaderTag<LoadQ4_0<false>>{});
            return true;
        case GgmlType::Q4_1:
            f(LoaderTag<LoadQ4_1>{});
            return true;
        case GgmlType::Q5_0:
            f(LoaderTag<LoadQ5_0>{});
            return true;
        case GgmlType::Q5_1:
            f(LoaderTag<LoadQ5_1>{});
            return true;
        case GgmlType::Q8_0:
            f(LoaderTag<LoadQ8_0>{});
            return true;
        case GgmlType::Q2_K:
            f(LoaderTag<LoadQ2_K>{});
            return true;
        case GgmlType::Q3_K:
            f(LoaderTag<LoadQ3_K>{});
            return true;
        case GgmlType::Q4_K:
            f(LoaderTag<LoadQ4_K>{});
            return true;
        case GgmlType::Q5_K:
            f(LoaderTag<LoadQ5_K>{});
            return true;
        case GgmlType::Q6_K:
            f(LoaderTag<LoadQ6_K>{});
            return true;
        case GgmlType::IQ4_NL:
            f(LoaderTag<LoadIQ4_NL>{});
            return true;
        case GgmlType::IQ4_XS:
            f(LoaderTag<LoadIQ4_XS>{});
            return true;
        case GgmlType::MXFP4:
            f(LoaderTag<LoadMXFP4>{});
            return true;
        case GgmlType::NVFP4:
            f(LoaderTag<LoadNVFP4>{});
            return true;
        case GgmlType::TQ1_0:
            f(LoaderTag<LoadTQ1_0>{});
            return true;
        case GgmlType::TQ2_0:
            f(LoaderTag<LoadTQ2_0>{});
            return true;
        case GgmlType::Q1_0:
            f(LoaderTag<LoadQ1_0>{});
            return true;
        default:
            return false;
    }
}

// Elements per block of a supported type (1 for float types); 0 when unsupported.
inline int64_t weight_block_elems(GgmlType t) {
    switch (t) {
        case GgmlType::F32:
        case GgmlType::F16:
        case GgmlType::BF16:
            return 1;
        case GgmlType::Q4_0:
        case GgmlType::Q4_1:
        case GgmlType::Q5_0:
        case GgmlType::Q5_1:
        case GgmlType::Q8_0:
        case GgmlType::IQ4_NL:
        case GgmlType::MXFP4:
            return 32;
        case GgmlType::NVFP4:
            return 64;
        case GgmlType::Q1_0:
            return 128;
        case GgmlType::Q2_K:
        case GgmlType::Q3_K:
        case GgmlType::Q4_K:
        case GgmlType::Q5_K:
        case GgmlType::Q6_K:
        case GgmlType::IQ4_XS:
        case GgmlType::TQ1_0:
        case GgmlType::TQ2_0:
            return 256;
        default:
            return 0;
    }
}

// Bytes per block of a supported type (element size for float types); 0 when unsupported.
inline size_t weight_block_bytes(GgmlType t) {
    switch (t) {
        case GgmlType::F32:
            return 4;
        case GgmlType::F16:
        case GgmlType::BF16:
            return 2;
        case GgmlType::Q4_0:
            return 18;
        case GgmlType::Q4_1:
            return 20;
        case GgmlType::Q5_0:
            return 22;
        case GgmlType::Q5_1:
            return 24;
        case GgmlType::Q8_0:
            return 34;
        case GgmlType::IQ4_NL:
            return 18;
        case GgmlType::MXFP4:
            return 17;
        case GgmlType::NVFP4:
            return 36;
        case GgmlType::TQ1_0:
            return 54;
        case GgmlType::TQ2_0:
            return 66;
        case GgmlType::Q1_0:
            return 18;
        case GgmlType::Q2_K:
            return 84;
        case GgmlType::Q3_K:
            return 110;
        case GgmlType::Q4_K:
            return 144;
        case GgmlType::Q5_K:
            return 176;
        case GgmlType::Q6_K:
            return 210;
        case GgmlType::IQ4_XS:
            return 136;
        default:
            return 0;
    }
}

}  // namespace kvrun::cu
