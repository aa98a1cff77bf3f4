// IQ4_NL / IQ4_XS codecs: 4-bit indices into a fixed non-linear 16-entry codebook.
//   IQ4_NL [f16 d][16 B nibbles]: 32 elements, x = d * kIq4Codebook[nibble]; element j < 16
//          is the low nibble of byte j, element j + 16 its high nibble (as Q4_0).
//   IQ4_XS [f16 d][u16 scales_h][4 B scales_l][128 B nibbles]: 256 elements in 8
//          sub-blocks of 32 laid out like IQ4_NL; sub-block j has a 6-bit scale whose low
//          nibble is nibble j%2 of scales_l[j/2] and whose top 2 bits are bits 2j of
//          scales_h; x = d * (scale - 32) * kIq4Codebook[nibble].
//   MXFP4  [u8 e][16 B nibbles]: 32 elements (OCP microscaling FP4, gpt-oss's experts),
//          x = mxfp4_scale(e) * kMxfp4Values[nibble], nibbles laid out like IQ4_NL.
//   NVFP4  [4 B UE4M3 scales][32 B nibbles]: 64 elements (NVIDIA's FP4, ModelOpt checkpoints)
//          in four sub-blocks of 16; sub-block s is bytes 4 + 8s .. + 7, element j < 8 the
//          low nibble of byte j, j + 8 its high nibble; x = nvfp4_scale(d[s]) * kMxfp4Values.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "quant.h"
#include "quant_impl.h"

namespace kvrun::quant_detail {

namespace {

// 16 nibbles-bytes for 32 elements -> y[32] = scale * codebook value.
inline void decode_iq4_32(const uint8_t* qs, float scale, float* y) {
    for (int j = 0; j < 16; ++j) {
        y[j] = scale * float(kIq4Codebook[qs[j] & 0xf]);
        y[j + 16] = scale * float(kIq4Codebook[qs[j] >> 4]);
    }
}

// Index of the codebook entry nearest to v: the number of midpoints between neighbouring
// entries that lie below v (branch-free).
inline int nearest_code(float v) {
    int idx = 0;
    for (int i = 0; i < 15; ++i) idx += v > 0.5f * float(kIq4Codebook[i] + kIq4Codebook[i + 1]);
    return idx;
}

// Squared error of x[32] coded with scale d; writes the codes to idx.
float code_block(const float* x, float d, uint8_t* idx) {
    const float id = d != 0 ? 1.0f / d : 0.0f;
    float err = 0;
    for (int i = 0; i < 32; ++i) {
        idx[i] = uint8_t(nearest_code(x[i] * id));
        const float e = d * float(kIq4Codebook[idx[i]]) - x[i];
        err += e * e;
    }
    return err;
}

// Best scale for x[32]: candidates around +-amax/127, each refit by least squares for
// its codes (weighted by w[32], or equally); the one with the least squared error wins.
float fit_iq4_scale(const float* x, const float* w) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    if (amax == 0) return 0;
    float best = amax / 127.0f, best_err = INFINITY;
    uint8_t idx[32];
    for (float sign : {1.0f, -1.0f}) {
        for (int step = -4; step <= 4; ++step) {
            const float d0 = sign * amax / 127.0f * (1.0f + 0.04f * float(step));
            code_block(x, d0, idx);
            float skx = 0, skk = 0, sxx = 0;
            for (int i = 0; i < 32; ++i) {
                const float k = kIq4Codebook[idx[i]], wi = w ? w[i] : 1.0f;
                skx += wi * (k * x[i]), skk += wi * (k * k), sxx += wi * (x[i] * x[i]);
            }
            if (skk <= 0) continue;
            const float d1 = skx / skk;
            const float err = sxx - d1 * skx;  // residual of the least-squares fit
            if (err < best_err) best_err = err, best = d1;
        }
    }
    return best;
}

void pack_nibbles_32(const uint8_t* idx, uint8_t* qs) {
    for (int j = 0; j < 16; ++j) qs[j] = uint8_t(idx[j] | idx[j + 16] << 4);
}

}  // namespace

KVRUN_SIMD_CLONES
void dequant_iq4_nl(const uint8_t* src, float* dst, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b, src += 18, dst += kQ32)
        decode_iq4_32(src + 2, load_f16(src), dst);
}

KVRUN_SIMD_CLONES
void dequant_iq4_xs(const uint8_t* src, float* dst, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b, src += 136, dst += kQK) {
        const float d = load_f16(src);
        const uint16_t scales_h = load_u16(src + 2);
        const uint8_t* scales_l = src + 4;
        for (int j = 0; j < 8; ++j) {
            const int ls =
                ((scales_l[j / 2] >> (4 * (j % 2))) & 0xf) | (((scales_h >> (2 * j)) & 3) << 4);
            decode_iq4_32(src + 8 + 16 * j, d * float(ls - 32), dst + 32 * j);
        }
    }
}

void quant_iq4_nl(const float* src, uint8_t* dst, int64_t nb, const float* w) {
    uint8_t idx[32];
    for (int64_t b = 0; b < nb; ++b, src += kQ32, dst += 18, w = w ? w + kQ32 : w) {
        const uint16_t dh = fp32_to_fp16(fit_iq4_scale(src, w));
        store_u16(dst, dh);
        code_block(src, half_to_float(dh), idx);
        pack_nibbles_32(idx, dst + 2);
    }
}

void quant_iq4_xs(const float* src, uint8_t* dst, int64_t nb, const float* w) {
    uint8_t idx[32];
    for (int64_t b = 0; b < nb; ++b, src += kQK, dst += 136, w = w ? w + kQK : w) {
        float scales[8], amax = 0;
        for (int j = 0; j < 8; ++j) {
            scales[j] = fit_iq4_scale(src + 32 * j, w ? w + 32 * j : nullptr);
            amax = std::max(amax, std::fabs(scales[j]));
        }
        const uint16_t dh = fp32_to_fp16(amax / 31.0f);
        const float d = half_to_float(dh);
        store_u16(dst, dh);
        uint16_t scales_h = 0;
        std::fill(dst + 4, dst + 8, 0);
        for (int j = 0; j < 8; ++j) {
            const int ls = d > 0 ? std::clamp(nearest_int(scales[j] / d), -32, 31) : 0;
            const int v = ls + 32;
            dst[4 + j / 2] |= uint8_t((v & 0xf) << (4 * (j % 2)));
            scales_h |= uint16_t((v >> 4) << (2 * j));
            code_block(src + 32 * j, d * float(ls), idx);
            pack_nibbles_32(idx, dst + 8 + 16 * j);
        }
        store_u16(dst + 2, scales_h);
    }
}

}  // namespace kvrun::quant_detail

namespace kvrun::quant_detail {

KVRUN_SIMD_CLONES
void dequant_mxfp4(const uint8_t* src, float* dst, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b, src += 17, dst += kQ32) {
        const float d = mxfp4_scale(src[0]);
        for (int j = 0; j < 16; ++j) {
            dst[j] = d * float(kMxfp4Values[src[1 + j] & 0xf]);
            dst[j + 16] = d * float(kMxfp4Values[src[1 + j] >> 4]);
        }
    }
}

namespace {

// The MXFP4 code nearest to v (in kMxfp4Values' units): the value's magnitude among
// 0 1 2 3 4 6 8 12, then the sign bit (codes 8..15 are the negatives of 0..7).
uint8_t mxfp4_code(float v) {
    static constexpr float kMid[7] = {0.5f, 1.5f, 2.5f, 3.5f, 5.0f, 7.0f, 10.0f};
    const float a = std::fabs(v);
    uint8_t q = 0;
    for (float m : kMid) q += a > m;
    return uint8_t(q | (v < 0 && q != 0 ? 8 : 0));
}

// Weighted squared error of x[n] coded as FP4 values at scale d (MXFP4's or NVFP4's, in
// kMxfp4Values' units; 0 codes everything 0); writes the codes to idx.
float fp4_error(const float* x, const float* w, int n, float d, uint8_t* idx) {
    const float id = d != 0 ? 1.0f / d : 0.0f;
    float err = 0;
    for (int i = 0; i < n; ++i) {
        idx[i] = mxfp4_code(x[i] * id);
        const float diff = d * float(kMxfp4Values[idx[i]]) - x[i];
        err += (w ? w[i] : 1.0f) * diff * diff;
    }
    return err;
}

}  // namespace

// The smallest power of two at which the block's largest magnitude fits the largest code, or
// the one below it (which clips that element but codes the rest finer) when its weighted
// squared error is smaller.
void quant_mxfp4(const float* src, uint8_t* dst, int64_t nb, const float* w) {
    uint8_t idx[32], best_idx[32];
    for (int64_t b = 0; b < nb; ++b, src += kQ32, dst += 17, w = w ? w + kQ32 : w) {
        float amax = 0;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(src[i]));
        int best_e = 0;
        std::fill(best_idx, best_idx + 32, uint8_t(0));
        if (amax > 0 && std::isfinite(amax)) {
            // 2^(e - 128) * 12 >= amax  <=>  e >= 128 + log2(amax / 12)
            const int e0 = std::clamp(128 + int(std::ceil(std::log2(amax / 12.0f))), 1, 254);
            float best_err = INFINITY;
            for (int e : {e0, e0 - 1}) {
                const float err = fp4_error(src, w, 32, mxfp4_scale(uint8_t(e)), idx);
                if (err < best_err) best_err = err, best_e = e, std::copy(idx, idx + 32, best_idx);
            }
        }
        dst[0] = uint8_t(best_e);
        for (int j = 0; j < 16; ++j) dst[1 + j] = uint8_t(best_idx[j] | best_idx[j + 16] << 4);
    }
}

void dequant_nvfp4(const uint8_t* src, float* dst, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b, src += 36)
        for (int s = 0; s < 4; ++s, dst += 16) {
            const float d = nvfp4_scale(src[s]);
            for (int j = 0; j < 8; ++j) {
                const uint8_t q = src[4 + 8 * s + j];
                dst[j] = d * float(kMxfp4Values[q & 0xf]);
                dst[j + 8] = d * float(kMxfp4Values[q >> 4]);
            }
        }
}

namespace {

// The UE4M3 byte of scale v (the E2M1 unit; nvfp4_scale decodes it halved), as ggml's
// encoder rounds it: the fourth mantissa bit rounds half up, subnormals by v * 2^9 + 0.5;
// 0 for v <= 0 or nan, 0x7e (the largest finite code) from 2^8 up.
uint8_t ue4m3_byte(float v) {
    if (!(v > 0.0f)) return 0;
    v = std::min(v, 448.0f);
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    int e = int((bits >> 23) & 0xff) - 127 + 7;
    if (e <= 0) return uint8_t(std::clamp(int(v * 512.0f + 0.5f), 0, 7));
    int m = int((bits >> 20) & 7) + int((bits >> 19) & 1);
    if (m > 7) m = 0, ++e;
    return e >= 15 ? uint8_t(0x7e) : uint8_t(e << 3 | m);
}

}  // namespace

// Each sub-block's scale byte: ggml's (amax / 6, the largest E2M1 value, rounded), or the
// neighbouring byte (two below, one above) whose codes leave the least weighted squared
// error; ggml's wins ties.
void quant_nvfp4(const float* src, uint8_t* dst, int64_t nb, const float* w) {
    uint8_t idx[16], best_idx[16];
    for (int64_t b = 0; b < nb; ++b, dst += 36)
        for (int s = 0; s < 4; ++s, src += 16, w = w ? w + 16 : w) {
            float amax = 0;
            for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(src[i]));
            const uint8_t b0 = std::isfinite(amax) ? ue4m3_byte(amax / 6.0f) : uint8_t(0x7e);
            uint8_t best = b0;
            float best_err = fp4_error(src, w, 16, nvfp4_scale(b0), best_idx);
            for (int delta : {-2, -1, 1}) {
                const int c = int(b0) + delta;
                if (b0 == 0 || c < 1 || c > 0x7e) continue;
                const float err = fp4_error(src, w, 16, nvfp4_scale(uint8_t(c)), idx);
                if (err < best_err)
                    best_err = err, best = uint8_t(c), std::copy(idx, idx + 16, best_idx);
            }
            dst[s] = best;
            for (int j = 0; j < 8; ++j)
                dst[4 + 8 * s + j] = uint8_t(best_idx[j] | best_idx[j + 8] << 4);
        }
}

}  // namespace kvrun::quant_detail
