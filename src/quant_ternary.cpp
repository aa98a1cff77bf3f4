// The ternary and binary types, for models trained with weights in {-1, 0, +1} or {-1, +1}
// times a scale (BitNet b1.58, TriLM; Bonsai's 1-bit models):
//   TQ2_0 [64 B codes][f16 d], 256 elements: element 128h + 32l + m is bits 2l..2l+1 of
//         byte 32h + m, x = d * (code - 1): codes 0, 1, 2 are -1, 0, +1 (3, which the
//         quantizer never writes, decodes as +2, as in ggml).
//   TQ1_0 [48 B qs][4 B qh][f16 d], 256 elements, trits (code 0, 1, 2 -> -1, 0, +1) packed
//         five to a byte as a base-3 fraction of 256: trits t0..t4 give the byte
//         ceil((81 t0 + 27 t1 + 9 t2 + 3 t3 + t4) * 256 / 243), and trit n of byte b is
//         (((b * 3^n) mod 256) * 3) >> 8. Elements 0..159 are trit n of qs[m] at 32n + m
//         (m < 32), 160..239 trit n of qs[32 + m] at 160 + 16n + m (m < 16), 240..255 trit
//         n of qh[m] at 240 + 4n + m (n < 4; a qh byte holds four trits, shifted up one).
//   Q1_0  [f16 d][16 B bits], 128 elements: bit j % 8 of byte j / 8 set is +d, clear -d.
// Without an importance matrix the quantizers are ggml's (TQ: d = max |x|, codes rounded
// half away from zero; Q1_0: d = mean |x|, the sign's bit), so a ternary-trained model
// round-trips exactly. With one, the TQ scale is searched and refit by weighted least
// squares, and Q1_0's d is the weighted mean of |x| (the weighted least-squares optimum).
#include <algorithm>
#include <cmath>

#include "quant.h"
#include "quant_impl.h"

namespace kvrun::quant_detail {

namespace {

constexpr int kTq1Bytes = 54, kTq2Bytes = 66, kQ1Bytes = 18, kQ1Elems = 128;
constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};

// Trit n (0, 1 or 2) of a TQ1_0 byte.
inline int trit(uint8_t b, int n) {
    return (int(uint8_t(b * kPow3[n])) * 3) >> 8;
}

// The byte of trits t[0..count) (count 5, or 4 for qh, which are shifted up one trit).
inline uint8_t pack_trits(const int* t, int count) {
    int q = 0;
    for (int n = 0; n < count; ++n) q = 3 * q + t[n];
    if (count == 4) q *= 3;
    return uint8_t((q * 256 + 242) / 243);
}

// Ternary codes (0, 1, 2) of x[256] at scale d, rounded half away from zero and clamped.
void ternary_codes(const float* x, float d, int* code) {
    const float id = d != 0 ? 1.0f / d : 0.0f;
    for (int i = 0; i < kQK; ++i) code[i] = std::clamp(int(std::lround(x[i] * id)), -1, 1) + 1;
}

// The block's scale and codes. Unweighted: ggml's max |x|. Weighted: candidates from
// max |x| down to half of it, each refit by weighted least squares for its codes, the least
// weighted squared error (with the f16-rounded scale) winning.
float fit_ternary(const float* x, const float* w, int* code) {
    float amax = 0;
    for (int i = 0; i < kQK; ++i) amax = std::max(amax, std::fabs(x[i]));
    ternary_codes(x, amax, code);
    if (!w || amax == 0 || !std::isfinite(amax)) return amax;
    auto error = [&](float d, const int* c) {
        const float dh = fp16_to_fp32(fp32_to_fp16(d));
        double err = 0;
        for (int i = 0; i < kQK; ++i) {
            const double e = double(dh) * (c[i] - 1) - x[i];
            err += double(w[i]) * e * e;
        }
        return err;
    };
    float best = amax;
    double best_err = error(amax, code);
    int c[kQK];
    for (int step = 0; step <= 10; ++step) {
        ternary_codes(x, amax * (1.0f - 0.05f * float(step)), c);
        double sxc = 0, scc = 0;
        for (int i = 0; i < kQK; ++i) {
            sxc += double(w[i]) * x[i] * (c[i] - 1);
            scc += double(w[i]) * (c[i] - 1) * (c[i] - 1);
        }
        if (scc <= 0) continue;
        const float d = float(sxc / scc);
        int refit[kQK];
        ternary_codes(x, d, refit);
        const double err = error(d, refit);
        if (err < best_err) {
            best_err = err;
            best = d;
            std::copy(refit, refit + kQK, code);
        }
    }
    return best;
}

}  // namespace

void dequant_tq2_0(const uint8_t* src, float* dst, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b, src += kTq2Bytes, dst += kQK) {
        const float d = load_f16(src + 64);
        for (int h = 0; h < 2; ++h)
            for (int l = 0; l < 4; ++l)
                for (int m = 0; m < 32; ++m)
                    dst[128 * h + 32 * l + m] = d * float(((src[32 * h + m] >> (2 * l)) & 3) - 1);
    }
}

void quant_tq2_0(const float* src, uint8_t* dst, int64_t nb, const float* w) {
    int code[kQK];
    for (int64_t b = 0; b < nb; ++b, src += kQK, dst += kTq2Bytes, w = w ? w + kQK : w) {
        const float d = fit_ternary(src, w, code);
        for (int h = 0; h < 2; ++h)
            for (int m = 0; m < 32; ++m) {
                int q = 0;
                for (int l = 0; l < 4; ++l) q |= code[128 * h + 32 * l + m] << (2 * l);
                dst[32 * h + m] = uint8_t(q);
            }
        store_u16(dst + 64, fp32_to_fp16(d));
    }
}

void dequant_tq1_0(const uint8_t* src, float* dst, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b, src += kTq1Bytes, dst += kQK) {
        const float d = load_f16(src + 52);
        for (int n = 0; n < 5; ++n) {
            for (int m = 0; m < 32; ++m) dst[32 * n + m] = d * float(trit(src[m], n) - 1);
            for (int m = 0; m < 16; ++m)
                dst[160 + 16 * n + m] = d * float(trit(src[32 + m], n) - 1);
        }
        for (int n = 0; n < 4; ++n)
            for (int m = 0; m < 4; ++m) dst[240 + 4 * n + m] = d * float(trit(src[48 + m], n) - 1);
    }
}

void quant_tq1_0(const float* src, uint8_t* dst, int64_t nb, const float* w) {
    int code[kQK];
    for (int64_t b = 0; b < nb; ++b, src += kQK, dst += kTq1Bytes, w = w ? w + kQK : w) {
        const float d = fit_ternary(src, w, code);
        int t[5];
        for (int m = 0; m < 32; ++m) {
            for (int n = 0; n < 5; ++n) t[n] = code[32 * n + m];
            dst[m] = pack_trits(t, 5);
        }
        for (int m = 0; m < 16; ++m) {
            for (int n = 0; n < 5; ++n) t[n] = code[160 + 16 * n + m];
            dst[32 + m] = pack_trits(t, 5);
        }
        for (int m = 0; m < 4; ++m) {
            for (int n = 0; n < 4; ++n) t[n] = code[240 + 4 * n + m];
            dst[48 + m] = pack_trits(t, 4);
        }
        store_u16(dst + 52, fp32_to_fp16(d));
    }
}

void dequant_q1_0(const uint8_t* src, float* dst, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b, src += kQ1Bytes, dst += kQ1Elems) {
        const float d = load_f16(src);
        for (int j = 0; j < kQ1Elems; ++j) dst[j] = (src[2 + j / 8] >> (j % 8)) & 1 ? d : -d;
    }
}

void quant_q1_0(const float* src, uint8_t* dst, int64_t nb, const float* w) {
    for (int64_t b = 0; b < nb; ++b, src += kQ1Elems, dst += kQ1Bytes, w = w ? w + kQ1Elems : w) {
        float sum = 0, wsum = 0, wabs = 0;
        for (int j = 0; j < kQ1Elems; ++j) {
            sum += std::fabs(src[j]);
            if (w) wsum += w[j], wabs += w[j] * std::fabs(src[j]);
        }
        const float d = w && wsum > 0 ? wabs / wsum : sum / float(kQ1Elems);
        store_u16(dst, fp32_to_fp16(d));
        std::fill(dst + 2, dst + kQ1Bytes, uint8_t(0));
        for (int j = 0; j < kQ1Elems; ++j)
            if (src[j] >= 0.0f) dst[2 + j / 8] |= uint8_t(1u << (j % 8));
    }
}

}  // namespace kvrun::quant_detail
