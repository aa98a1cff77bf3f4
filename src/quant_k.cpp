// K-quant codecs (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K): 256-element super-blocks made of
// 16- or 32-element sub-blocks, each with its own small integer scale (and min), scaled in
// turn by one or two f16 super-block factors.
//
// Layouts (bytes, in order):
//   Q2_K [16 scales: low nibble scale, high nibble min][64 qs][f16 d][f16 dmin]
//   Q3_K [32 hmask][64 qs][12 packed 6-bit scales][f16 d]
//   Q4_K [f16 d][f16 dmin][12 packed 6-bit scales+mins][128 qs]
//   Q5_K [f16 d][f16 dmin][12 packed 6-bit scales+mins][32 qh][128 qs]
//   Q6_K [128 ql][64 qh][16 int8 scales][f16 d]
//   Q8_K [f32 d][256 int8 qs][16 int16 sums of 16 qs]
// The bit positions of element e are described next to each codec.
#include <algorithm>
#include <cmath>

#include "quant.h"
#include "quant_impl.h"

namespace kvrun::quant_detail {

namespace {

// ---- scale packing -----------------------------------------------------------------

void pack_scale_min(const int* sc, const int* m, uint8_t* s) {
    std::fill(s, s + 12, 0);
    for (int j = 0; j < 8; ++j) {
        if (j < 4) {
            s[j] |= uint8_t(sc[j]);
            s[j + 4] |= uint8_t(m[j]);
        } else {
            s[j + 4] = uint8_t((sc[j] & 0xf) | (m[j] & 0xf) << 4);
            s[j - 4] |= uint8_t((sc[j] >> 4) << 6);
            s[j] |= uint8_t((m[j] >> 4) << 6);
        }
    }
}

void pack_q3_scales(const int* sc, uint8_t* s) {  // sc[16] in [-32, 31]
    std::fill(s, s + 12, 0);
    for (int j = 0; j < 16; ++j) {
        const int v = sc[j] + 32;
        s[j < 8 ? j : j - 8] |= uint8_t((v & 0xf) << (j < 8 ? 0 : 4));
        s[8 + (j & 3)] |= uint8_t((v >> 4) << (2 * (j >> 2)));
    }
}

// ---- sub-block fitting (quantizers) ------------------------------------------------

}  // namespace

// Fits x[n] ~ scale * q - min with q in [0, nmax], scale >= 0, min >= 0 (the offset is
// never positive, as in the format). Tries a few ranges and keeps the least-squares best,
// weighted by w[n] (importance; nullptr: equal weights, the same arithmetic bit for bit).
void fit_scale_min(const float* x, int n, int nmax, float& scale, float& min, const float* w) {
    float lo = 0, hi = x[0];
    for (int i = 0; i < n; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
    scale = 0;
    min = -lo;
    if (hi <= lo) return;
    float best_err = INFINITY;
    for (int step = -4; step <= 6; ++step) {
        const float s = (hi - lo) / (float(nmax) + 0.25f * float(step));
        if (s <= 0) continue;
        // Quantize with this range, then refit (a, b) of x ~ a*q + b by least squares.
        double sw = 0, sq = 0, sqq = 0, sx = 0, sqx = 0;
        int qs[32];
        for (int i = 0; i < n; ++i) {
            const double wi = w ? double(w[i]) : 1.0;
            qs[i] = std::clamp(nearest_int((x[i] - lo) / s), 0, nmax);
            sw += wi, sq += wi * qs[i], sqq += wi * (double(qs[i]) * qs[i]), sx += wi * x[i],
                sqx += wi * (double(qs[i]) * x[i]);
        }
        const double det = sw * sqq - sq * sq;
        double a = s, b = lo;
        if (det > 0) {
            a = (sw * sqx - sq * sx) / det;
            b = (sx - a * sq) / sw;
        }
        if (b > 0) b = 0, a = sqq > 0 ? sqx / sqq : 0;
        if (a < 0) continue;
        float err = 0;
        for (int i = 0; i < n; ++i) {
            const float e = float(a) * float(qs[i]) + float(b) - x[i];
            err += (w ? w[i] : 1.0f) * (e * e);
        }
        if (err < best_err) best_err = err, scale = float(a), min = float(-b);
    }
}

// Fits x[n] ~ scale * q with q in [-nneg, nneg - 1]: the largest-magnitude element maps
// near -nneg (sign carried by the scale); a few candidates, least-squares refit each,
// weighted by w[n] (nullptr: equal weights).
float fit_scale_sym(const float* x, int n, int nneg, const float* w) {
    float amax = 0, vmax = 0;
    for (int i = 0; i < n; ++i)
        if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), vmax = x[i];
    if (amax == 0) return 0;
    float best = vmax / -float(nneg), best_err = INFINITY;
    for (int step = -3; step <= 3; ++step) {
        const float s = vmax / -(float(nneg) + 0.25f * float(step));
        double sqx = 0, sqq = 0;
        for (int i = 0; i < n; ++i) {
            const double wi = w ? double(w[i]) : 1.0;
            const int q = std::clamp(nearest_int(x[i] / s), -nneg, nneg - 1);
            sqx += wi * (double(q) * x[i]), sqq += wi * (double(q) * q);
        }
        if (sqq <= 0) continue;
        const float a = float(sqx / sqq);
        float err = 0;
        for (int i = 0; i < n; ++i) {
            const int q = std::clamp(nearest_int(x[i] / a), -nneg, nneg - 1);
            const float e = a * float(q) - x[i];
            err += (w ? w[i] : 1.0f) * (e * e);
        }
        if (err < best_err) best_err = err, best = a;
    }
    return best;
}

namespace {

// Asymmetric super-block: fits every sub-block, quantizes scales and mins to `sbits`
// bits against f16 super factors, and returns per-element codes L[256] in [0, nmax]
// computed with the final (rounded) scales.
struct AsymBlock {
    uint16_t d = 0, dmin = 0;
    int sc[16] = {}, m[16] = {};
    uint8_t L[kQK] = {};
};

void quantize_asym(const float* x, int sub, int nmax, int smax, AsymBlock& out,
                   const float* w = nullptr) {
    const int nsub = kQK / sub;
    float scales[16], mins[16], max_scale = 0, max_min = 0;
    for (int j = 0; j < nsub; ++j) {
        fit_scale_min(x + j * sub, sub, nmax, scales[j], mins[j], w ? w + j * sub : nullptr);
        max_scale = std::max(max_scale, scales[j]);
        max_min = std::max(max_min, mins[j]);
    }
    out.d = fp32_to_fp16(max_scale / float(smax));
    out.dmin = fp32_to_fp16(max_min / float(smax));
    const float d = half_to_float(out.d), dmin = half_to_float(out.dmin);
    for (int j = 0; j < nsub; ++j) {
        out.sc[j] = d > 0 ? std::clamp(nearest_int(scales[j] / d), 0, smax) : 0;
        out.m[j] = dmin > 0 ? std::clamp(nearest_int(mins[j] / dmin), 0, smax) : 0;
        const float ds = d * float(out.sc[j]), dm = dmin * float(out.m[j]);
        for (int i = 0; i < sub; ++i) {
            const int q = ds > 0 ? nearest_int((x[j * sub + i] + dm) / ds) : 0;
            out.L[j * sub + i] = uint8_t(std::clamp(q, 0, nmax));
        }
    }
}

// Symmetric super-block with signed integer scales in [-smax, smax] against one f16
// factor; codes L[256] are signed in [-nneg, nneg - 1].
struct SymBlock {
    uint16_t d = 0;
    int sc[16] = {};
    int L[kQK] = {};
};

void quantize_sym(const float* x, int sub, int nneg, int smax, SymBlock& out,
                  const float* w = nullptr) {
    const int nsub = kQK / sub;
    float scales[16], amax = 0;
    for (int j = 0; j < nsub; ++j) {
        scales[j] = fit_scale_sym(x + j * sub, sub, nneg, w ? w + j * sub : nullptr);
        amax = std::max(amax, std::fabs(scales[j]));
    }
    out.d = fp32_to_fp16(amax / float(smax));
    const float d = half_to_float(out.d);
    for (int j = 0; j < nsub; ++j) {
        out.sc[j] = d > 0 ? std::clamp(nearest_int(scales[j] / d), -smax, smax) : 0;
        const float ds = d * float(out.sc[j]);
        for (int i = 0; i < sub; ++i) {
            const int q = ds != 0 ? nearest_int(x[j * sub + i] / ds) : 0;
            out.L[j * sub + i] = std::clamp(q, -nneg, nneg - 1);
        }
    }
}

}  // namespace

// ---- Q2_K: element e = 128n + 32s + l uses bits 2s..2s+1 of qs[32n + l]; scale e/16 ----

KVRUN_SIMD_CLONES
void dequant_q2_k(const uint8_t* src, float* dst, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b, src += 84, dst += kQK) {
        const uint8_t* scales = src;
        const uint8_t* qs = src + 16;
        const float d = load_f16(src + 80), dmin = load_f16(src + 82);
        for (int e = 0; e < kQK; e += 16) {
            const int sc = scales[e / 16];
            const float dl = d * float(sc & 0xf), ml = dmin * float(sc >> 4);
            const uint8_t* q = qs + 32 * (e / 128) + (e % 32);
            const int shift = 2 * ((e % 128) / 32);
            for (int l = 0; l < 16; ++l) dst[e + l] = dl * float((q[l] >> shift) & 3) - ml;
        }
    }
}

void quant_q2_k(const float* src, uint8_t* dst, int64_t nb, const float* w) {
    AsymBlock blk;
    for (int64_t b = 0; b < nb; ++b, src += kQK, dst += 84, w = w ? w + kQK : w) {
        quantize_asym(src, 16, 3, 15, blk, w);
        for (int j = 0; j < 16; ++j) dst[j] = uint8_t(blk.sc[j] | blk.m[j] << 4);
        uint8_t* qs = dst + 16;
        std::fill(qs, qs + 64, 0);
        for (int e = 0; e < kQK; ++e)
            qs[32 * (e / 128) + e % 32] |= uint8_t(blk.L[e] << (2 * ((e % 128) / 32)));
        store_u16(dst + 80, blk.d);
        store_u16(dst + 82, blk.dmin);
    }
}

// ---- Q3_K: low 2 bits as Q2_K; the 3rd bit of element e is bit e/32 of hmask[e%32], and
// a clear bit subtracts 4 (codes -4..3); signed 6-bit scale e/16 ------------------------

KVRUN_SIMD_CLONES
void dequant_q3_k(const uint8_t* src, float* dst, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b, src += 110, dst += kQK) {
        const uint8_t* hmask = src;
        const uint8_t* qs = src + 32;
        const uint8_t* scales = src + 96;
        const float d = load_f16(src + 108);
        for (int e = 0; e < kQK; e += 16) {
            const float dl = d * float(unpack_q3_scale(scales, e / 16));
            const uint8_t* q = qs + 32 * (e / 128) + (e % 32);
            const uint8_t* hm = hmask + (e % 32);
            const int shift = 2 * ((e % 128) / 32), hbit = e / 32;
            for (int l = 0; l < 16; ++l) {
                const int v = ((q[l] >> shift) & 3) - (((hm[l] >> hbit) & 1) ? 0 : 4);
                dst[e + l] = dl * float(v);
            }
        }
    }
}

void quant_q3_k(const float* src, uint8_t* dst, int64_t nb, const float* w) {
    SymBlock blk;
    for (int64_t b = 0; b < nb; ++b, src += kQK, dst += 110, w = w ? w + kQK : w) {
        quantize_sym(src, 16, 4, 31, blk, w);
        uint8_t* hmask = dst;
        uint8_t* qs = dst + 32;
        std::fill(dst, dst + 96, 0);
        for (int e = 0; e < kQK; ++e) {
            const int v = blk.L[e] + 4;  // 0..7
            qs[32 * (e / 128) + e % 32] |= uint8_t((v & 3) << (2 * ((e % 128) / 32)));
            hmask[e % 32] |= uint8_t((v >> 2) << (e / 32));
        }
        pack_q3_scales(blk.sc, dst + 96);
        store_u16(dst + 108, blk.d);
    }
}

// ---- Q4_K / Q5_K: sub-block j (32 elements) reads the low (j even) or high (j odd)
// nibbles of qs[32*(j/2) .. +32]; Q5_K's 5th bit of element 32j + l is bit j of qh[l] ---

template <bool kHigh>
KVRUN_SIMD_CLONES void dequant_q45_k(const uint8_t* src, float* dst, int64_t nb) {
    constexpr size_t kBytes = kHigh ? 176 : 144;
    for (int64_t b = 0; b < nb; ++b, src += kBytes, dst += kQK) {
        const float d = load_f16(src), dmin = load_f16(src + 2);
        const uint8_t* scales = src + 4;
        const uint8_t* qh = src + 16;
        const uint8_t* qs = src + (kHigh ? 48 : 16);
        for (int j = 0; j < 8; ++j) {
            int sc, m;
            unpack_scale_min(scales, j, sc, m);
            const float dl = d * float(sc), ml = dmin * float(m);
            const uint8_t* q = qs + 32 * (j / 2);
            const int shift = 4 * (j & 1);
            float* y = dst + 32 * j;
            for (int l = 0; l < 32; ++l) {
                int v = (q[l] >> shift) & 0xf;
                if (kHigh) v |= ((qh[l] >> j) & 1) << 4;
                y[l] = dl * float(v) - ml;
            }
        }
    }
}

template <bool kHigh>
void quant_q45_k(const float* src, uint8_t* dst, int64_t nb, const float* w) {
    constexpr size_t kBytes = kHigh ? 176 : 144;
    AsymBlock blk;
    for (int64_t b = 0; b < nb; ++b, src += kQK, dst += kBytes, w = w ? w + kQK : w) {
        quantize_asym(src, 32, kHigh ? 31 : 15, 63, blk, w);
        store_u16(dst, blk.d);
        store_u16(dst + 2, blk.dmin);
        pack_scale_min(blk.sc, blk.m, dst + 4);
        uint8_t* qh = dst + 16;
        uint8_t* qs = dst + (kHigh ? 48 : 16);
        std::fill(dst + 16, dst + kBytes, 0);
        for (int e = 0; e < kQK; ++e) {
            const int j = e / 32, l = e % 32;
            qs[32 * (j / 2) + l] |= uint8_t((blk.L[e] & 0xf) << (4 * (j & 1)));
            if (kHigh) qh[l] |= uint8_t((blk.L[e] >> 4) << j);
        }
    }
}

void dequant_q4_k(const uint8_t* src, float* dst, int64_t nb) {
    dequant_q45_k<false>(src, dst, nb);
}
void dequant_q5_k(const uint8_t* src, float* dst, int64_t nb) {
    dequant_q45_k<true>(src, dst, nb);
}
void quant_q4_k(const float* src, uint8_t* dst, int64_t nb, const float* w) {
    quant_q45_k<false>(src, dst, nb, w);
}
void quant_q5_k(const float* src, uint8_t* dst, int64_t nb, const float* w) {
    quant_q45_k<true>(src, dst, nb, w);
}

// ---- Q6_K: element e = 128n + 32s + l: low nibble of ql[64n + l + 32*(s&1)] (s < 2) or
// its high nibble (s >= 2), top 2 bits at bits 2s of qh[32n + l]; code - 32; scale e/16 --

KVRUN_SIMD_CLONES
void dequant_q6_k(const uint8_t* src, float* dst, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b, src += 210, dst += kQK) {
        const uint8_t* ql = src;
        const uint8_t* qh = src + 128;
        const int8_t* scales = reinterpret_cast<const int8_t*>(src + 192);
        const float d = load_f16(src + 208);
        for (int e = 0; e < kQK; e += 16) {
            const int n = e / 128, s = (e % 128) / 32, l0 = e % 32;
            const float dl = d * float(scales[e / 16]);
            const uint8_t* lo = ql + 64 * n + 32 * (s & 1) + l0;
            const uint8_t* hi = qh + 32 * n + l0;
            const int lshift = 4 * (s >> 1), hshift = 2 * s;
            for (int l = 0; l < 16; ++l) {
                const int v = (((lo[l] >> lshift) & 0xf) | ((hi[l] >> hshift) & 3) << 4) - 32;
                dst[e + l] = dl * float(v);
            }
        }
    }
}

void quant_q6_k(const float* src, uint8_t* dst, int64_t nb, const float* w) {
    SymBlock blk;
    for (int64_t b = 0; b < nb; ++b, src += kQK, dst += 210, w = w ? w + kQK : w) {
        quantize_sym(src, 16, 32, 127, blk, w);
        uint8_t* ql = dst;
        uint8_t* qh = dst + 128;
        std::fill(dst, dst + 192, 0);
        for (int e = 0; e < kQK; ++e) {
            const int n = e / 128, s = (e % 128) / 32, l = e % 32;
            const int v = blk.L[e] + 32;  // 0..63
            ql[64 * n + 32 * (s & 1) + l] |= uint8_t((v & 0xf) << (4 * (s >> 1)));
            qh[32 * n + l] |= uint8_t((v >> 4) << (2 * s));
        }
        for (int j = 0; j < 16; ++j) dst[192 + j] = uint8_t(int8_t(blk.sc[j]));
        store_u16(dst + 208, blk.d);
    }
}

// ---- Q8_K: x = d * q with an f32 d ---------------------------------------------------

KVRUN_SIMD_CLONES
void dequant_q8_k(const uint8_t* src, float* dst, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b, src += 292, dst += kQK) {
        const float d = load_f32(src);
        const int8_t* qs = reinterpret_cast<const int8_t*>(src + 4);
        for (int e = 0; e < kQK; ++e) dst[e] = d * float(qs[e]);
    }
}

void quant_q8_k(const float* src, uint8_t* dst, int64_t nb, const float* /*w*/) {
    for (int64_t b = 0; b < nb; ++b, src += kQK, dst += 292) {
        float amax = 0;
        for (int e = 0; e < kQK; ++e) amax = std::max(amax, std::fabs(src[e]));
        const float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
        store_f32(dst, d);
        for (int j = 0; j < 16; ++j) {
            int sum = 0;
            for (int i = 0; i < 16; ++i) {
                const int q = std::clamp(nearest_int(src[16 * j + i] * id), -127, 127);
                dst[4 + 16 * j + i] = uint8_t(int8_t(q));
                sum += q;
            }
            store_u16(dst + 260 + 2 * j, uint16_t(int16_t(sum)));
        }
    }
}

}  // namespace kvrun::quant_detail
