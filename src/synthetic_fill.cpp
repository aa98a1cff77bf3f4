// Random tensor rows for synthetic models: gaussian floats for F32/F16/BF16 and random-but-valid
// quantized blocks (codes from a discretized gaussian + varying scales) for the block types.
#include "synthetic_fill.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "quant.h"
#include "quant_impl.h"

namespace kvrun {
namespace {

// Standard normal quantile by bisection on erfc (only used to build 256-entry tables).
double normal_quantile(double p) {
    double lo = -10.0, hi = 10.0;
    for (int i = 0; i < 100; ++i) {
        double mid = 0.5 * (lo + hi);
        if (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p)
            lo = mid;
        else
            hi = mid;
    }
    return 0.5 * (lo + hi);
}

// A uniform random byte indexes `code`, giving gaussian-distributed quant codes.
// value(code) = unit[code] in units of the block scale; rms2 = E[unit^2] over the table.
struct CodeTable {
    uint8_t code[256];
    double rms2 = 0;
};

// Codes on a uniform grid: code = clamp(round(zero + z * half / k), lo, hi), unit = code - zero.
// k = how many standard deviations reach the end of the grid.
CodeTable make_grid_table(double zero, double half, int lo, int hi, double k) {
    CodeTable t;
    for (int i = 0; i < 256; ++i) {
        double z = normal_quantile((i + 0.5) / 256.0);
        long c = std::clamp<long>(std::lround(zero + z * half / k), lo, hi);
        t.code[i] = static_cast<uint8_t>(c);  // int8 codes keep their two's complement bits
        double u = double(c) - zero;
        t.rms2 += u * u / 256.0;
    }
    return t;
}

// Codes into a 16-value grid (IQ4's, whose largest magnitude is 127, or MXFP4's, 12): the
// index of the grid value nearest to z * top / k.
CodeTable make_book_table(const int8_t* book, double top, double k) {
    CodeTable t;
    for (int i = 0; i < 256; ++i) {
        double v = normal_quantile((i + 0.5) / 256.0) * top / k;
        int best = 0;
        for (int j = 1; j < 16; ++j)
            if (std::fabs(book[j] - v) < std::fabs(book[best] - v)) best = j;
        t.code[i] = static_cast<uint8_t>(best);
        t.rms2 += double(book[best]) * book[best] / 256.0;
    }
    return t;
}

// E[s^2] for s uniform on the integers [lo, hi].
double mean_square(int lo, int hi) {
    double s = 0;
    for (int v = lo; v <= hi; ++v) s += double(v) * v;
    return s / (hi - lo + 1);
}

// E[m^2] for the per-block multiplier m uniform on [0.5, 1.5).
constexpr double kBlockMul2 = 13.0 / 12.0;

// Random bits from one row's generator.
class Bits {
  public:
    explicit Bits(uint64_t seed) : rng_(seed) {}
    uint64_t u64() { return rng_.next(); }
    uint32_t u16() {
        if (n16_ == 0) {
            buf16_ = rng_.next();
            n16_ = 4;
        }
        --n16_;
        uint32_t r = buf16_ & 0xFFFF;
        buf16_ >>= 16;
        return r;
    }
    // Uniform integer in [lo, hi] (hi - lo < 2^16; bias negligible for small ranges).
    int uniform(int lo, int hi) { return lo + int(u16() % uint32_t(hi - lo + 1)); }
    // Per-block scale multiplier in [0.5, 1.5).
    float block_mul() { return 0.5f + float(u16()) * (1.0f / 65536.0f); }
    // codes[n] (n a multiple of 8) <- table lookups of random bytes.
    void codes(const CodeTable& t, uint8_t* out, int n) {
        for (int i = 0; i < n; i += 8) {
            uint64_t w = rng_.next();
            for (int k = 0; k < 8; ++k) out[i + k] = t.code[(w >> (8 * k)) & 0xFF];
        }
    }
    // Approximately standard normal: Irwin-Hall sum of four 16-bit uniforms, rescaled.
    float gauss() {
        uint64_t w = rng_.next();
        int32_t s = int32_t(w & 0xFFFF) + int32_t((w >> 16) & 0xFFFF) +
                    int32_t((w >> 32) & 0xFFFF) + int32_t(w >> 48);
        constexpr float kMean = 2.0f * 65535.0f;
        constexpr float kInvStd = 1.0f / 37837.2f;  // 1 / (65536 * sqrt(4 / 12))
        return (float(s) - kMean) * kInvStd;
    }

  private:
    SplitMix64 rng_;
    uint64_t buf16_ = 0;
    int n16_ = 0;
};

// fp32 -> fp16 with round-to-nearest-even, branch-free for normal half values (the common
// case; random rounding branches would make F16 rows 5x slower), else fp32_to_fp16.
inline uint16_t fast_fp16(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    if (a < 0x38800000u || a >= 0x477fe000u) return fp32_to_fp16(f);  // subnormal/overflow/nan
    return uint16_t(sign | ((a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u) >> 13));
}

void put_f16(uint8_t* p, float v) {
    uint16_t h = fp32_to_fp16(v);
    std::memcpy(p, &h, 2);
}

struct Tables {
    CodeTable q8 = make_grid_table(0.0, 127.0, -127, 127, 2.7);  // Q8_0 (int8 bits)
    CodeTable q4_sym = make_grid_table(8.0, 7.0, 0, 15, 2.7);    // Q4_0: unit = code - 8
    CodeTable q4_min = make_grid_table(7.5, 7.5, 0, 15, 2.7);    // Q4_1, Q4_K
    CodeTable q5_sym = make_grid_table(16.0, 15.0, 0, 31, 2.7);  // Q5_0
    CodeTable q5_min = make_grid_table(15.5, 15.5, 0, 31, 2.7);  // Q5_1, Q5_K
    CodeTable q6_sym = make_grid_table(32.0, 31.0, 0, 63, 2.7);  // Q6_K
    CodeTable q3_sym = make_grid_table(4.0, 3.0, 1, 7, 2.0);     // Q3_K: unit = code - 4
    CodeTable q2_min = make_grid_table(1.5, 1.5, 0, 3, 1.5);     // Q2_K
    CodeTable iq4 = make_book_table(quant_detail::kIq4Codebook, 127.0, 2.7);
    CodeTable mxfp4 = make_book_table(quant_detail::kMxfp4Values, 12.0, 2.7);
    CodeTable ternary = make_grid_table(1.0, 1.0, 0, 2, 1.4);  // TQ1_0, TQ2_0: unit = code - 1
};

const Tables& tables() {
    static const Tables t;
    return t;
}

// Each block writer: one block of `bits`-random codes at `dst`, values with RMS `sigma`.

// Q8_0: f16 d | int8 qs[32]; x = d * q.
void block_q8_0(uint8_t* dst, float sigma, Bits& b) {
    const CodeTable& t = tables().q8;
    put_f16(dst, sigma / std::sqrt(float(t.rms2 * kBlockMul2)) * b.block_mul());
    b.codes(t, dst + 2, 32);
}

// Q4_0 / IQ4_NL: f16 d | qs[16]; element j<16 in the low nibble of qs[j], j+16 in the high.
void block_4bit(uint8_t* dst, float sigma, Bits& b, const CodeTable& t) {
    uint8_t c[32];
    b.codes(t, c, 32);
    put_f16(dst, sigma / std::sqrt(float(t.rms2 * kBlockMul2)) * b.block_mul());
    for (int j = 0; j < 16; ++j) dst[2 + j] = uint8_t(c[j] | (c[j + 16] << 4));
}

void block_q4_0(uint8_t* dst, float sigma, Bits& b) {
    block_4bit(dst, sigma, b, tables().q4_sym);
}
void block_iq4_nl(uint8_t* dst, float sigma, Bits& b) {
    block_4bit(dst, sigma, b, tables().iq4);
}

// MXFP4: u8 e | qs[16]; x = 2^(e - 128) * value[q]: the power of two nearest the scale.
void block_mxfp4(uint8_t* dst, float sigma, Bits& b) {
    const CodeTable& t = tables().mxfp4;
    uint8_t c[32];
    b.codes(t, c, 32);
    const double d = sigma / std::sqrt(t.rms2 * kBlockMul2) * b.block_mul();
    dst[0] = uint8_t(std::clamp<long>(128 + std::lround(std::log2(std::max(d, 1e-30))), 1, 254));
    for (int j = 0; j < 16; ++j) dst[1 + j] = uint8_t(c[j] | (c[j + 16] << 4));
}

// NVFP4: 4 UE4M3 bytes | qs[32]; sub-block k of 16 has x = nvfp4_scale(d[k]) * value[q]: the
// byte whose scale is nearest below the wanted one (exponent from log2, then the mantissa).
void block_nvfp4(uint8_t* dst, float sigma, Bits& b) {
    const CodeTable& t = tables().mxfp4;
    for (int k = 0; k < 4; ++k) {
        uint8_t c[16];
        b.codes(t, c, 16);
        const double raw = 2.0 * sigma / std::sqrt(t.rms2 * kBlockMul2) * b.block_mul();
        const int e = std::clamp(int(std::floor(std::log2(std::max(raw, 1e-30)))) + 7, 1, 15);
        const int m = std::clamp(int((raw / std::ldexp(1.0, e - 7) - 1.0) * 8.0), 0, 7);
        dst[k] = uint8_t(std::min(e << 3 | m, 0x7e));
        for (int j = 0; j < 8; ++j) dst[4 + 8 * k + j] = uint8_t(c[j] | (c[j + 8] << 4));
    }
}

// TQ1_0 / TQ2_0 (ternary codes) and Q1_0 (signs) times an f16 block scale: values on the
// type's grid, written by its quantizer, which codes them exactly (its scale is their largest
// magnitude, or for Q1_0 their mean magnitude).
template <GgmlType kType>
void block_lowbit(uint8_t* dst, float sigma, Bits& b) {
    constexpr int n = kType == GgmlType::Q1_0 ? 128 : 256;
    float x[n];
    if constexpr (kType == GgmlType::Q1_0) {
        const float d =
            fp16_to_fp32(fp32_to_fp16(sigma * b.block_mul() / float(std::sqrt(kBlockMul2))));
        for (int i = 0; i < n; i += 64) {
            const uint64_t w = b.u64();
            for (int j = 0; j < 64; ++j) x[i + j] = (w >> j) & 1 ? d : -d;
        }
    } else {
        const CodeTable& t = tables().ternary;
        const float d = fp16_to_fp32(
            fp32_to_fp16(sigma / std::sqrt(float(t.rms2 * kBlockMul2)) * b.block_mul()));
        uint8_t c[n];
        b.codes(t, c, n);
        c[0] = 2;  // one nonzero code, so the quantizer's scale (the largest |x|) is d
        for (int i = 0; i < n; ++i) x[i] = d * float(int(c[i]) - 1);
    }
    quantize_row(kType, x, dst, n);
}

// Q4_1: f16 d | f16 m | qs[16]; x = d * q + m with m = -7.5 d (zero mean).
void block_q4_1(uint8_t* dst, float sigma, Bits& b) {
    const CodeTable& t = tables().q4_min;
    uint8_t c[32];
    b.codes(t, c, 32);
    float d = sigma / std::sqrt(float(t.rms2 * kBlockMul2)) * b.block_mul();
    put_f16(dst, d);
    put_f16(dst + 2, -7.5f * d);
    for (int j = 0; j < 16; ++j) dst[4 + j] = uint8_t(c[j] | (c[j + 16] << 4));
}

// The 5-bit nibble/high-bit split shared by Q5_0 and Q5_1: qh bit j = bit 4 of element j.
void pack_q5(uint8_t* qh, uint8_t* qs, const uint8_t* c) {
    uint32_t h = 0;
    for (int j = 0; j < 16; ++j) {
        qs[j] = uint8_t((c[j] & 15) | ((c[j + 16] & 15) << 4));
        h |= uint32_t(c[j] >> 4) << j;
        h |= uint32_t(c[j + 16] >> 4) << (j + 16);
    }
    for (int k = 0; k < 4; ++k) qh[k] = uint8_t(h >> (8 * k));
}

// Q5_0: f16 d | qh[4] | qs[16]; x = d * (q - 16).
void block_q5_0(uint8_t* dst, float sigma, Bits& b) {
    const CodeTable& t = tables().q5_sym;
    uint8_t c[32];
    b.codes(t, c, 32);
    put_f16(dst, sigma / std::sqrt(float(t.rms2 * kBlockMul2)) * b.block_mul());
    pack_q5(dst + 2, dst + 6, c);
}

// Q5_1: f16 d | f16 m | qh[4] | qs[16]; x = d * q + m with m = -15.5 d.
void block_q5_1(uint8_t* dst, float sigma, Bits& b) {
    const CodeTable& t = tables().q5_min;
    uint8_t c[32];
    b.codes(t, c, 32);
    float d = sigma / std::sqrt(float(t.rms2 * kBlockMul2)) * b.block_mul();
    put_f16(dst, d);
    put_f16(dst + 2, -15.5f * d);
    pack_q5(dst + 4, dst + 8, c);
}

// The 12-byte scale/min packing of Q4_K and Q5_K: eight 6-bit scales and eight 6-bit mins.
void pack_k4_scales(uint8_t* s, const uint8_t* sc, const uint8_t* m) {
    for (int j = 0; j < 4; ++j) {
        s[j] = uint8_t((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        s[j + 4] = uint8_t((m[j] & 63) | ((m[j + 4] >> 4) << 6));
        s[j + 8] = uint8_t((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
    }
}

// Sub-block scales of Q4_K/Q5_K: 6-bit values in [32, 63], min = scale so that
// x = d*sc*q - (zero*d)*sc = d*sc*(q - zero) has zero mean.
constexpr int kK4ScaleLo = 32, kK4ScaleHi = 63;

// Q4_K: f16 d | f16 dmin | scales[12] | qs[128]; 8 sub-blocks of 32. Within each 64-element
// chunk j, element l is the low nibble of qs[32j + l] and element 32 + l the high nibble.
void block_q4_k(uint8_t* dst, float sigma, Bits& b) {
    const CodeTable& t = tables().q4_min;
    static const float norm =
        1.0f / std::sqrt(float(t.rms2 * kBlockMul2 * mean_square(kK4ScaleLo, kK4ScaleHi)));
    uint8_t c[256], sc[8];
    b.codes(t, c, 256);
    for (auto& s : sc) s = uint8_t(b.uniform(kK4ScaleLo, kK4ScaleHi));
    float d = sigma * norm * b.block_mul();
    put_f16(dst, d);
    put_f16(dst + 2, 7.5f * d);
    pack_k4_scales(dst + 4, sc, sc);
    uint8_t* qs = dst + 16;
    for (int j = 0; j < 4; ++j)
        for (int l = 0; l < 32; ++l)
            qs[32 * j + l] = uint8_t(c[64 * j + l] | (c[64 * j + 32 + l] << 4));
}

// Q5_K: f16 d | f16 dmin | scales[12] | qh[32] | qs[128]; like Q4_K plus the 5th bit of
// element 64j + l in bit 2j of qh[l] and of element 64j + 32 + l in bit 2j+1.
void block_q5_k(uint8_t* dst, float sigma, Bits& b) {
    const CodeTable& t = tables().q5_min;
    static const float norm =
        1.0f / std::sqrt(float(t.rms2 * kBlockMul2 * mean_square(kK4ScaleLo, kK4ScaleHi)));
    uint8_t c[256], sc[8];
    b.codes(t, c, 256);
    for (auto& s : sc) s = uint8_t(b.uniform(kK4ScaleLo, kK4ScaleHi));
    float d = sigma * norm * b.block_mul();
    put_f16(dst, d);
    put_f16(dst + 2, 15.5f * d);
    pack_k4_scales(dst + 4, sc, sc);
    uint8_t* qh = dst + 16;
    uint8_t* qs = dst + 48;
    std::memset(qh, 0, 32);
    for (int j = 0; j < 4; ++j)
        for (int l = 0; l < 32; ++l) {
            uint8_t lo = c[64 * j + l], hi = c[64 * j + 32 + l];
            qs[32 * j + l] = uint8_t((lo & 15) | ((hi & 15) << 4));
            qh[l] |= uint8_t(((lo >> 4) << (2 * j)) | ((hi >> 4) << (2 * j + 1)));
        }
}

// Q6_K: ql[128] | qh[64] | int8 scales[16] | f16 d; x = d * sc[e/16] * (q - 32). In half h,
// elements 128h + l + 32k (k = 0..3): low 4 bits in ql[64h + l (+32 for k odd)] (low nibble
// for k < 2, high for k >= 2), top 2 bits in bits 2k of qh[32h + l].
void block_q6_k(uint8_t* dst, float sigma, Bits& b) {
    const CodeTable& t = tables().q6_sym;
    constexpr int kLo = 32, kHi = 127;
    static const float norm = 1.0f / std::sqrt(float(t.rms2 * kBlockMul2 * mean_square(kLo, kHi)));
    uint8_t c[256];
    b.codes(t, c, 256);
    uint8_t* ql = dst;
    uint8_t* qh = dst + 128;
    int8_t* sc = reinterpret_cast<int8_t*>(dst + 192);
    for (int i = 0; i < 16; ++i) sc[i] = int8_t(b.uniform(kLo, kHi));
    put_f16(dst + 208, sigma * norm * b.block_mul());
    for (int h = 0; h < 2; ++h)
        for (int l = 0; l < 32; ++l) {
            const uint8_t* e = c + 128 * h + l;
            uint8_t c1 = e[0], c2 = e[32], c3 = e[64], c4 = e[96];
            ql[64 * h + l] = uint8_t((c1 & 15) | ((c3 & 15) << 4));
            ql[64 * h + l + 32] = uint8_t((c2 & 15) | ((c4 & 15) << 4));
            qh[32 * h + l] =
                uint8_t((c1 >> 4) | ((c2 >> 4) << 2) | ((c3 >> 4) << 4) | ((c4 >> 4) << 6));
        }
}

// Q2_K: scales[16] | qs[64] | f16 d | f16 dmin; scales[i] = sc | m << 4 for the 16-element
// sub-block i. Element 128h + 32j + i (i < 32) sits in bits 2j of qs[32h + i].
void block_q2_k(uint8_t* dst, float sigma, Bits& b) {
    const CodeTable& t = tables().q2_min;
    constexpr int kLo = 8, kHi = 15;
    static const float norm = 1.0f / std::sqrt(float(t.rms2 * kBlockMul2 * mean_square(kLo, kHi)));
    uint8_t c[256];
    b.codes(t, c, 256);
    for (int i = 0; i < 16; ++i) {
        int s = b.uniform(kLo, kHi);
        dst[i] = uint8_t(s | (s << 4));  // min = scale, dmin = 1.5 d: zero mean
    }
    uint8_t* qs = dst + 16;
    std::memset(qs, 0, 64);
    for (int h = 0; h < 2; ++h)
        for (int j = 0; j < 4; ++j)
            for (int i = 0; i < 32; ++i)
                qs[32 * h + i] |= uint8_t(c[128 * h + 32 * j + i] << (2 * j));
    float d = sigma * norm * b.block_mul();
    put_f16(dst + 80, d);
    put_f16(dst + 82, 1.5f * d);
}

// Q3_K: hmask[32] | qs[64] | scales[12] | f16 d; x = d * (sc - 32) * (q - 4) with q 3 bits:
// element 128h + 32j + i has its low 2 bits in bits 2j of qs[32h + i] and its top bit in bit
// 4h + j of hmask[i]. Scale i (6 bits): low nibble in scales[i % 8] (high nibble when i >= 8),
// top 2 bits in bits 2 * (i / 4) of scales[8 + i % 4].
void block_q3_k(uint8_t* dst, float sigma, Bits& b) {
    const CodeTable& t = tables().q3_sym;
    constexpr int kLo = 8, kHi = 31;  // sc - 32
    static const float norm = 1.0f / std::sqrt(float(t.rms2 * kBlockMul2 * mean_square(kLo, kHi)));
    uint8_t c[256];
    b.codes(t, c, 256);
    uint8_t* hmask = dst;
    uint8_t* qs = dst + 32;
    uint8_t* scales = dst + 96;
    std::memset(dst, 0, 108);
    for (int h = 0; h < 2; ++h)
        for (int j = 0; j < 4; ++j)
            for (int i = 0; i < 32; ++i) {
                uint8_t q = c[128 * h + 32 * j + i];
                qs[32 * h + i] |= uint8_t((q & 3) << (2 * j));
                hmask[i] |= uint8_t((q >> 2) << (4 * h + j));
            }
    for (int i = 0; i < 16; ++i) {
        int s = b.uniform(kLo, kHi) + 32;
        scales[i % 8] |= uint8_t((s & 15) << (i >= 8 ? 4 : 0));
        scales[8 + i % 4] |= uint8_t((s >> 4) << (2 * (i / 4)));
    }
    put_f16(dst + 108, sigma * norm * b.block_mul());
}

// IQ4_XS: f16 d | u16 scales_h | scales_l[4] | qs[128]; sub-block ib of 32 has 6-bit scale
// ls (low nibble in scales_l[ib/2], top 2 bits in bits 2ib of scales_h), x = d*(ls-32)*grid.
void block_iq4_xs(uint8_t* dst, float sigma, Bits& b) {
    const CodeTable& t = tables().iq4;
    constexpr int kLo = 8, kHi = 31;  // ls - 32
    static const float norm = 1.0f / std::sqrt(float(t.rms2 * kBlockMul2 * mean_square(kLo, kHi)));
    uint8_t c[256];
    b.codes(t, c, 256);
    put_f16(dst, sigma * norm * b.block_mul());
    uint16_t sh = 0;
    uint8_t* sl = dst + 4;
    std::memset(sl, 0, 4);
    for (int ib = 0; ib < 8; ++ib) {
        int ls = b.uniform(kLo, kHi) + 32;
        sl[ib / 2] |= uint8_t((ls & 15) << (4 * (ib % 2)));
        sh |= uint16_t((ls >> 4) << (2 * ib));
        for (int j = 0; j < 16; ++j)
            dst[8 + 16 * ib + j] = uint8_t(c[32 * ib + j] | (c[32 * ib + j + 16] << 4));
    }
    std::memcpy(dst + 2, &sh, 2);
}

// The random-block writer of a block type (nullptr for float and unsupported types).
using BlockWriter = void (*)(uint8_t* dst, float sigma, Bits& b);
BlockWriter block_writer(GgmlType t) {
    switch (t) {
        case GgmlType::Q8_0:
            return block_q8_0;
        case GgmlType::Q4_0:
            return block_q4_0;
        case GgmlType::Q4_1:
            return block_q4_1;
        case GgmlType::Q5_0:
            return block_q5_0;
        case GgmlType::Q5_1:
            return block_q5_1;
        case GgmlType::Q2_K:
            return block_q2_k;
        case GgmlType::Q3_K:
            return block_q3_k;
        case GgmlType::Q4_K:
            return block_q4_k;
        case GgmlType::Q5_K:
            return block_q5_k;
        case GgmlType::Q6_K:
            return block_q6_k;
        case GgmlType::IQ4_NL:
            return block_iq4_nl;
        case GgmlType::IQ4_XS:
            return block_iq4_xs;
        case GgmlType::MXFP4:
            return block_mxfp4;
        case GgmlType::NVFP4:
            return block_nvfp4;
        case GgmlType::TQ1_0:
            return block_lowbit<GgmlType::TQ1_0>;
        case GgmlType::TQ2_0:
            return block_lowbit<GgmlType::TQ2_0>;
        case GgmlType::Q1_0:
            return block_lowbit<GgmlType::Q1_0>;
        default:
            return nullptr;
    }
}

void fill_float_row(GgmlType t, void* dst, int64_t n, float sigma, float mean, Bits& b) {
    if (t == GgmlType::F32) {
        float* out = static_cast<float*>(dst);
        for (int64_t i = 0; i < n; ++i) out[i] = mean + sigma * b.gauss();
    } else {
        uint16_t* out = static_cast<uint16_t*>(dst);
        bool half = t == GgmlType::F16;
        for (int64_t i = 0; i < n; ++i) {
            float v = mean + sigma * b.gauss();
            out[i] = half ? fast_fp16(v) : fp32_to_bf16(v);
        }
    }
}

}  // namespace

uint64_t synthetic_seed(uint64_t seed, std::string_view name, uint64_t index) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (char ch : name) h = (h ^ uint8_t(ch)) * 0x100000001b3ull;
    SplitMix64 mix(h ^ (seed * 0x9e3779b97f4a7c15ull) ^ (index * 0xd1b54a32d192ed03ull));
    return mix.next();
}

bool synthetic_type_supported(GgmlType t) {
    return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16 ||
           block_writer(t) != nullptr;
}

void synthetic_fill_row(GgmlType t, void* dst, int64_t n, float sigma, float mean, uint64_t seed,
                        bool exact) {
    if (!synthetic_type_supported(t))
        fail("synthetic models cannot hold tensors of type {}", ggml_type_name(t));
    const GgmlTypeTraits& tr = ggml_type_traits(t);
    if (n <= 0 || n % tr.block_elems != 0)
        fail("synthetic row of {} elements is not a multiple of the {} block size {}", n, tr.name,
             tr.block_elems);
    Bits b(seed);
    bool is_float = t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16;
    if (is_float) return fill_float_row(t, dst, n, sigma, mean, b);
    if (mean != 0.0f) fail("synthetic {} rows must have zero mean", tr.name);
    if (exact) {
        if (!tr.can_quantize) fail("--exact: kvrun has no quantizer for {}", tr.name);
        thread_local std::vector<float> row;  // [n] float32 source data
        row.resize(size_t(n));
        for (auto& v : row) v = sigma * b.gauss();
        quantize_row(t, row.data(), dst, n);
        return;
    }
    const BlockWriter write_block = block_writer(t);
    uint8_t* out = static_cast<uint8_t*>(dst);
    for (int64_t i = 0; i < n / tr.block_elems; ++i, out += tr.block_bytes)
        write_block(out, sigma, b);
}

}  // namespace kvrun
