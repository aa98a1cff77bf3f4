// llama.cpp arithmetic emulation for the CPU ops (cpu::set_llamacpp_rounding): the float
// arithmetic of the reference llama.cpp build, operation by operation (see cpu_llamacpp.h).
// With the flag on, the ops reproduce the float arithmetic of the reference llama.cpp build
// (ggml CPU backend, Feb 2025, x86-64 with AVX2 + FMA, compiled with FP contraction) operation
// by operation, so that our logits equal the reference's bit for bit. Nothing less works for
// strict comparisons: in these tiny models one 8-bit or f16 rounding that lands the other way
// (from a last-bit difference upstream) moves later logits by ~0.1 nats. What is emulated and
// why: docs/llamacpp-fidelity.md. In short:
//  - matrix products (ggml_compute_forward_mul_mat): activations rounded to the weight type's
//    vec_dot type (f16, bf16, Q8_0, Q8_1 with its f16 block sum s, Q8_K with 16-element sums),
//    exact integer block dot products, and the float accumulation of the AVX2 kernels: 8
//    lanes, lane l holding elements 4l..4l+3 of every 32, one FMA per block and lane, then
//    hsum_float_8; Q4_0 weights with a multiple of 8 rows are repacked (q4_0_8x8, one FMA per
//    whole block); float weights go through llamafile's tinyBLAS for batches of >= 2 rows
//    (lane i % 8, n_in % 8 == 0) and ggml_vec_dot_f32/f16/bf16 otherwise.
//  - RMSNorm (float squares summed in double, float 1/sqrtf), RoPE (theta *= theta_scale in
//    float, cosf/sinf, FMA rotation), SiLU (ggml_v_expf on chunks of 8 of each row, expf on the
//    rest), attention without flash attention (Q->f16, K.Q, scaled softmax with ggml_v_expf
//    over the KV row padded to 32 cells, softmax->f16, V^T.softmax).
#include "cpu_llamacpp.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common.h"
#include "quant.h"
#include "quant_impl.h"
#include "thread_pool.h"

namespace kvrun::cpu::llamacpp {
namespace {

float round_to_f16(float x) {
    return fp16_to_fp32(fp32_to_fp16(x));
}

}  // namespace

// Kernels that benefit from AVX2/FMA get a clone picked at load time (as in quant_impl.h).
// They hold no a*b+c the compiler could contract in a way the reference did not: every FMA
// is an explicit std::fma (exact by definition, whatever the clone), other products are exact.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__)
#define KVRUN_EMU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define KVRUN_EMU_CLONES
#endif

// ggml's hsum_float_8 and tinyBLAS's hsum(__m256): ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7)).
inline float hsum8(const float* v) {
    const float r0 = v[0] + v[4], r1 = v[1] + v[5], r2 = v[2] + v[6], r3 = v[3] + v[7];
    return (r0 + r2) + (r1 + r3);
}

// GGML_F32x8_REDUCE of four 8-lane accumulators a[4][8]: (a0+a2)+(a1+a3) lane-wise, then two
// _mm_hadd_ps: ((v0+v4)+(v1+v5)) + ((v2+v6)+(v3+v7)).
inline float reduce4x8(const float* a) {
    float v[8];
    for (int l = 0; l < 8; ++l) v[l] = (a[l] + a[16 + l]) + (a[8 + l] + a[24 + l]);
    const float r0 = v[0] + v[4], r1 = v[1] + v[5], r2 = v[2] + v[6], r3 = v[3] + v[7];
    return (r0 + r1) + (r2 + r3);
}

// ---- float dot products (x, y hold exactly the values the kernel multiplies) ----

// llamafile tinyBLAS (n % 8 == 0): lane i % 8 accumulates with FMA, then hsum8.
inline float dot_tinyblas(const float* x, const float* y, int64_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t i = 0; i < n; i += 8)
        for (int l = 0; l < 8; ++l) acc[l] = fmaf_(x[i + l], y[i + l], acc[l]);
    return hsum8(acc);
}

// The 4 x 8 FMA accumulators of ggml_vec_dot_f32 / f16 over x[0, np), np a multiple of 32.
inline void fma_4x8(const float* x, const float* y, int64_t np, float* acc) {
    for (int64_t i = 0; i < np; i += 32)
        for (int j = 0; j < 32; ++j) acc[j] = fmaf_(x[i + j], y[i + j], acc[j]);
}

// ggml_vec_dot_f32 (AVX2): 4 x 8 lanes over the first n & ~31, GGML_F32x8_REDUCE, then the rest
// added one product at a time in float (the reference does not contract this loop).
inline float dot_vec_f32(const float* x, const float* y, int64_t n) {
    float acc[32] = {};
    const int64_t np = n & ~int64_t(31);
    fma_4x8(x, y, np, acc);
    float sum = reduce4x8(acc);
    for (int64_t i = np; i < n; ++i) {
        volatile float p = x[i] * y[i];  // volatile: keep the compiler from contracting it
        sum += p;
    }
    return sum;
}

// ggml_vec_dot_f16 (AVX2 F16C): as dot_vec_f32, with the reduced sum and the rest (exact
// products of halves) summed in double.
inline float dot_vec_f16(const float* x, const float* y, int64_t n) {
    float acc[32] = {};
    const int64_t np = n & ~int64_t(31);
    fma_4x8(x, y, np, acc);
    double sum = np > 0 ? double(reduce4x8(acc)) : 0.0;
    for (int64_t i = np; i < n; ++i) sum += double(x[i] * y[i]);
    return float(sum);
}

// ggml_vec_dot_bf16 (AVX2): 4 x 8 lanes of exact bf16 products, (c0+c2)+(c1+c3), hsum8, the
// rest in double.
inline float dot_vec_bf16(const float* x, const float* y, int64_t n) {
    float acc[32] = {};
    const int64_t np = n & ~int64_t(31);
    fma_4x8(x, y, np, acc);  // the products are exact: FMA or not is the same
    float v[8];
    for (int l = 0; l < 8; ++l) v[l] = (acc[l] + acc[16 + l]) + (acc[8 + l] + acc[24 + l]);
    double sum = np > 0 ? double(hsum8(v)) : 0.0;
    for (int64_t i = np; i < n; ++i) sum += double(x[i] * y[i]);
    return float(sum);
}

// ---- quantized activations ----

// One activation row rounded to a quantized vec_dot type: codes q[n], per-block scales d as
// the kernel reads them, Q8_1's s = f16(d * sum q) per 32, Q8_K's sums of 16 codes.
struct QuantRow {
    std::vector<int8_t> q;
    std::vector<int8_t> qt;  // q in lane order (see lane_order)
    std::vector<float> d, s;
    std::vector<int32_t> bsums;
};

// Lane order: within every 32 elements, element 4l + t moves to 8t + l, so that the 8 SIMD lanes
// (lane l = elements 4l..4l+3) become 4 rows of 8 that vectorize without horizontal sums.
constexpr int lane_order(int e) {
    return (e & ~31) + 8 * (e & 3) + ((e & 31) >> 2);
}

// x[n] -> out[n] in lane order, n a multiple of 32.
template <typename T>
inline void to_lane_order(const T* x, int64_t n, T* out) {
    for (int64_t g = 0; g < n; g += 32)
        for (int t = 0; t < 4; ++t)
            for (int l = 0; l < 8; ++l) out[g + 8 * t + l] = x[g + 4 * l + t];
}

// quantize_row_q8_0 / q8_1 (AVX2): d = amax / 127 stored as f16, q = round-to-even(x * (127 /
// amax)); Q8_1 adds s = f16(d * sum q) with the unrounded d.
void quantize_q8_0_row(const float* x, int64_t n, bool with_sum, QuantRow& out) {
    out.q.resize(n);
    out.d.resize(n / 32);
    out.s.resize(with_sum ? n / 32 : 0);
    for (int64_t b = 0; b < n / 32; ++b) {
        const float* xb = x + 32 * b;
        float amax = 0;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
        const float d = amax / 127.0f;
        const float id = amax != 0 ? 127.0f / amax : 0.0f;
        out.d[b] = round_to_f16(d);
        int sum = 0;
        for (int j = 0; j < 32; ++j) {
            const int q = int(std::nearbyint(xb[j] * id));
            out.q[32 * b + j] = int8_t(q);
            sum += q;
        }
        if (with_sum) out.s[b] = round_to_f16(d * float(sum));
    }
}

// quantize_row_q8_K_ref: scale from the signed value of largest magnitude, d = 1 / iscale in
// f32, codes clamped to 127, sums of every 16 codes.
void quantize_q8_k_row(const float* x, int64_t n, QuantRow& out) {
    out.q.resize(n);
    out.d.resize(n / 256);
    out.bsums.resize(n / 16);
    for (int64_t b = 0; b < n / 256; ++b) {
        const float* xb = x + 256 * b;
        float amax = 0, max = 0;
        for (int j = 0; j < 256; ++j)
            if (std::fabs(xb[j]) > amax) {
                amax = std::fabs(xb[j]);
                max = xb[j];
            }
        int8_t* q = out.q.data() + 256 * b;
        if (amax == 0) {
            out.d[b] = 0;
            std::fill(q, q + 256, int8_t(0));
        } else {
            const float iscale = -127.0f / max;
            for (int j = 0; j < 256; ++j)
                q[j] = int8_t(std::min(127, int(std::nearbyint(iscale * xb[j]))));
            out.d[b] = 1.0f / iscale;
        }
        for (int j = 0; j < 16; ++j) {
            int s = 0;
            for (int i = 0; i < 16; ++i) s += q[16 * j + i];
            out.bsums[16 * b + j] = s;
        }
    }
}

// ---- quantized weights ----

constexpr int8_t kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                   1,    13,   25,  38,  53,  69,  89,  113};

inline float f16_at(const uint8_t* p) {
    static const std::vector<float> table = [] {  // all 65536 halves, exactly
        std::vector<float> t(65536);
        for (uint32_t h = 0; h < 65536; ++h) t[h] = fp16_to_fp32(uint16_t(h));
        return t;
    }();
    uint16_t h;
    std::memcpy(&h, p, 2);
    return table[h];
}

// One weight row decoded for the integer dot products: per element the code times its integer
// sub-block scale (1 for 32-element block types), in lane order (lane_order); per block (32) or
// super-block (256) the f16 factors d and m (Q4_1/Q5_1 min, K-quant dmin), and the K-quants'
// integer mins (16 per super-block for Q2_K, 8 for Q4_K/Q5_K).
struct DecodedRow {
    std::vector<int16_t> w;
    std::vector<float> d, m;
    std::vector<int16_t> mins;
};

[[gnu::always_inline]] inline void decode_row(GgmlType t, const uint8_t* src, int64_t n,
                                              DecodedRow& out) {
    out.w.resize(n);
    int16_t natural[256];
    const bool k_type = ggml_type_traits(t).block_elems == 256;
    const int64_t nb = n / (k_type ? 256 : 32);
    out.d.resize(nb);
    out.m.assign(nb, 0.0f);
    out.mins.assign(nb * 16, 0);
    for (int64_t b = 0; b < nb; ++b) {
        int16_t* c = natural;
        int16_t* mins = out.mins.data() + 16 * b;
        switch (t) {
            case GgmlType::Q8_0:
                out.d[b] = f16_at(src);
                for (int j = 0; j < 32; ++j) c[j] = int8_t(src[2 + j]);
                src += 34;
                break;
            case GgmlType::Q4_0:
            case GgmlType::IQ4_NL: {
                out.d[b] = f16_at(src);
                const bool iq = t == GgmlType::IQ4_NL;
                for (int j = 0; j < 16; ++j) {
                    const int lo = src[2 + j] & 15, hi = src[2 + j] >> 4;
                    c[j] = int16_t(iq ? kIq4Values[lo] : lo - 8);
                    c[j + 16] = int16_t(iq ? kIq4Values[hi] : hi - 8);
                }
                src += 18;
                break;
            }
            case GgmlType::Q4_1:
                out.d[b] = f16_at(src), out.m[b] = f16_at(src + 2);
                for (int j = 0; j < 16; ++j) c[j] = src[4 + j] & 15, c[j + 16] = src[4 + j] >> 4;
                src += 20;
                break;
            case GgmlType::Q5_0:
            case GgmlType::Q5_1: {
                const bool has_min = t == GgmlType::Q5_1;
                out.d[b] = f16_at(src);
                if (has_min) out.m[b] = f16_at(src + 2);
                uint32_t qh;
                std::memcpy(&qh, src + (has_min ? 4 : 2), 4);
                const uint8_t* qs = src + (has_min ? 8 : 6);
                const int off = has_min ? 0 : 16;
                for (int j = 0; j < 16; ++j) {
                    c[j] = int16_t(((qs[j] & 15) | int((qh >> j) & 1) << 4) - off);
                    c[j + 16] = int16_t(((qs[j] >> 4) | int((qh >> (j + 16)) & 1) << 4) - off);
                }
                src += has_min ? 24 : 22;
                break;
            }
            case GgmlType::Q2_K: {
                const uint8_t* qs = src + 16;
                out.d[b] = f16_at(src + 80), out.m[b] = f16_at(src + 82);
                for (int e = 0; e < 256; ++e)
                    c[e] = int16_t(((qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3) *
                                   (src[e / 16] & 0xf));
                for (int j = 0; j < 16; ++j) mins[j] = src[j] >> 4;
                src += 84;
                break;
            }
            case GgmlType::Q3_K: {
                const uint8_t* hm = src;
                const uint8_t* qs = src + 32;
                const uint8_t* sc = src + 96;
                out.d[b] = f16_at(src + 108);
                for (int e = 0; e < 256; ++e) {
                    const int low = (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
                    const int j = e / 16;
                    const int lo = j < 8 ? (sc[j] & 0xf) : (sc[j - 8] >> 4);
                    const int hi = (sc[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
                    c[e] = int16_t((low - (((hm[e % 32] >> (e / 32)) & 1) ? 0 : 4)) *
                                   ((lo | hi << 4) - 32));
                }
                src += 110;
                break;
            }
            case GgmlType::Q4_K:
            case GgmlType::Q5_K: {
                const bool high = t == GgmlType::Q5_K;
                out.d[b] = f16_at(src), out.m[b] = f16_at(src + 2);
                const uint8_t* qh = src + 16;
                const uint8_t* qs = src + (high ? 48 : 16);
                for (int j = 0; j < 8; ++j) {
                    int sc, m;
                    quant_detail::unpack_scale_min(src + 4, j, sc, m);
                    mins[j] = int16_t(m);
                    for (int l = 0; l < 32; ++l) {
                        int v = (qs[32 * (j / 2) + l] >> (4 * (j & 1))) & 0xf;
                        if (high) v |= ((qh[l] >> j) & 1) << 4;
                        c[32 * j + l] = int16_t(v * sc);
                    }
                }
                src += high ? 176 : 144;
                break;
            }
            case GgmlType::Q6_K: {
                const uint8_t* ql = src;
                const uint8_t* qh = src + 128;
                const int8_t* sc = reinterpret_cast<const int8_t*>(src + 192);
                out.d[b] = f16_at(src + 208);
                for (int e = 0; e < 256; ++e) {
                    const int nn = e / 128, s = (e % 128) / 32, l = e % 32;
                    const int lo = (ql[64 * nn + 32 * (s & 1) + l] >> (4 * (s >> 1))) & 0xf;
                    const int hi = (qh[32 * nn + l] >> (2 * s)) & 3;
                    c[e] = int16_t(((lo | hi << 4) - 32) * sc[e / 16]);
                }
                src += 210;
                break;
            }
            case GgmlType::IQ4_XS: {
                out.d[b] = f16_at(src);
                uint16_t sh;
                std::memcpy(&sh, src + 2, 2);
                const uint8_t* sl = src + 4;
                const uint8_t* qs = src + 8;
                for (int j = 0; j < 8; ++j) {
                    const int ls =
                        ((sl[j / 2] >> (4 * (j % 2))) & 0xf) | (((sh >> (2 * j)) & 3) << 4);
                    for (int l = 0; l < 16; ++l) {
                        c[32 * j + l] = int16_t(kIq4Values[qs[16 * j + l] & 15] * (ls - 32));
                        c[32 * j + l + 16] = int16_t(kIq4Values[qs[16 * j + l] >> 4] * (ls - 32));
                    }
                }
                src += 136;
                break;
            }
            default:
                fail("llama.cpp emulation: no integer dot product for weight type {}",
                     ggml_type_name(t));
        }
        const int64_t len = k_type ? 256 : 32;
        to_lane_order(natural, len, out.w.data() + b * len);
    }
}

// Integer lane sums: isum[g][l] = sum of w[e] * q[e] over e = 32g + 4l .. 32g + 4l + 3, for the
// n / 32 groups of 32 elements, from w and q in lane order (exact: |sum| < 2^24, as in the
// SIMD kernels).
inline void lane_sums(const int16_t* w, const int8_t* q, int64_t n, int32_t* isum) {
    for (int64_t g = 0; g < n / 32; ++g) {
        int32_t s[8] = {};
        for (int t = 0; t < 4; ++t)
            for (int l = 0; l < 8; ++l)
                s[l] += int32_t(w[32 * g + 8 * t + l]) * q[32 * g + 8 * t + l];
        for (int l = 0; l < 8; ++l) isum[8 * g + l] = s[l];
    }
}

// ggml_vec_dot_{q8_0,q4_0,q5_0,iq4_nl}_q8_0 and {q4_1,q5_1}_q8_1 (AVX2) of a decoded weight row
// and a quantized activation row; isum: scratch [n / 32][8].
//  - tinyblas: llamafile's kernel in a batch (one accumulator, also for IQ4_NL, whose vec_dot
//    alternates two and finishes an odd block in scalar code);
//  - repacked: Q4_0 in ggml's q4_0_8x8 layout, whose gemv/gemm adds one FMA per whole block.
[[gnu::always_inline]] inline float dot_block32(GgmlType t, const DecodedRow& w, const QuantRow& a,
                                                int64_t n, bool tinyblas, bool repacked,
                                                int32_t* isum) {
    const int64_t nb = n / 32;
    lane_sums(w.w.data(), a.qt.data(), n, isum);
    if (repacked) {
        float acc = 0;
        for (int64_t b = 0; b < nb; ++b) {
            const int32_t* s = isum + 8 * b;
            const int32_t total = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
            acc = fmaf_(float(total), w.d[b] * a.d[b], acc);
        }
        return acc;
    }
    const bool two_acc = t == GgmlType::IQ4_NL && !tinyblas;
    const int64_t n_vec = two_acc ? nb & ~int64_t(1) : nb;  // blocks in the SIMD loop
    float acc0[8] = {}, acc1[8] = {};
    const int64_t step = two_acc ? 2 : 1;
    for (int64_t b = 0; b < n_vec; b += step) {
        const float dd = w.d[b] * a.d[b];  // exact: a product of two halves
        for (int l = 0; l < 8; ++l) acc0[l] = fmaf_(dd, float(isum[8 * b + l]), acc0[l]);
        if (!two_acc) continue;
        const float dd1 = w.d[b + 1] * a.d[b + 1];
        for (int l = 0; l < 8; ++l) acc1[l] = fmaf_(dd1, float(isum[8 * b + 8 + l]), acc1[l]);
    }
    float summs = 0;
    if (!a.s.empty())
        for (int64_t b = 0; b < nb; ++b) summs += w.m[b] * a.s[b];  // exact products of halves
    if (two_acc)
        for (int l = 0; l < 8; ++l) acc0[l] += acc1[l];
    float sum = hsum8(acc0);
    if (n_vec < nb) {  // IQ4_NL's odd last block: sumf += d * (sumi1 + sumi2), contracted
        const int32_t* s = isum + 8 * n_vec;
        int32_t total = 0;
        for (int l = 0; l < 8; ++l) total += s[l];
        sum = fmaf_(w.d[n_vec] * a.d[n_vec], float(total), sum);
    }
    return sum + summs;
}

// ggml_vec_dot_{q2_K,q3_K,q4_K,q5_K,q6_K,iq4_xs}_q8_K (AVX2) of a decoded weight row and a Q8_K
// activation row: per super-block the 8 integer lane sums, one FMA per lane with d = d_act *
// d_weight; mins through the 16-element activation sums: Q2_K into the same lanes before the
// codes, Q4_K into 4 more lanes (added last), Q5_K into a scalar (contracted).
[[gnu::always_inline]] inline float dot_superblock(GgmlType t, const DecodedRow& w,
                                                   const QuantRow& a, int64_t n, int32_t* isum) {
    const int64_t nsb = n / 256;
    lane_sums(w.w.data(), a.qt.data(), n, isum);
    float acc[8] = {}, acc_m[4] = {}, summs = 0;
    for (int64_t i = 0; i < nsb; ++i) {
        const float yd = a.d[i];
        const int32_t* bs = a.bsums.data() + 16 * i;
        const int16_t* mins = w.mins.data() + 16 * i;
        if (t == GgmlType::Q2_K) {
            const float dmin = -yd * w.m[i];
            for (int k = 0; k < 8; ++k) {
                const int prod = mins[2 * k] * bs[2 * k] + mins[2 * k + 1] * bs[2 * k + 1];
                acc[k] = fmaf_(dmin, float(prod), acc[k]);
            }
        } else if (t == GgmlType::Q4_K || t == GgmlType::Q5_K) {
            const float dmin = -yd * w.m[i];
            int prod[4];
            for (int k = 0; k < 4; ++k)
                prod[k] = mins[2 * k] * (bs[4 * k] + bs[4 * k + 1]) +
                          mins[2 * k + 1] * (bs[4 * k + 2] + bs[4 * k + 3]);
            if (t == GgmlType::Q4_K)
                for (int k = 0; k < 4; ++k) acc_m[k] = fmaf_(dmin, float(prod[k]), acc_m[k]);
            else
                summs = fmaf_(dmin, float((prod[0] + prod[1]) + (prod[2] + prod[3])), summs);
        }
        const float d = yd * w.d[i];
        int32_t s[8] = {};
        for (int g = 0; g < 8; ++g)
            for (int l = 0; l < 8; ++l) s[l] += isum[64 * i + 8 * g + l];
        for (int l = 0; l < 8; ++l) acc[l] = fmaf_(d, float(s[l]), acc[l]);
    }
    float sum = hsum8(acc);
    if (t == GgmlType::Q4_K) sum += (acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]);
    if (t == GgmlType::Q5_K) sum += summs;
    return sum;
}

// The vec_dot type llama.cpp rounds the activations to for weights of type t.
enum class DotKind { F32, F16, BF16, Q8_0, Q8_1, Q8_K };

DotKind dot_kind(GgmlType t) {
    switch (t) {
        case GgmlType::F32:
            return DotKind::F32;
        case GgmlType::F16:
            return DotKind::F16;
        case GgmlType::BF16:
            return DotKind::BF16;
        case GgmlType::Q8_0:
        case GgmlType::Q4_0:
        case GgmlType::Q5_0:
        case GgmlType::IQ4_NL:
            return DotKind::Q8_0;
        case GgmlType::Q4_1:
        case GgmlType::Q5_1:
            return DotKind::Q8_1;
        case GgmlType::Q2_K:
        case GgmlType::Q3_K:
        case GgmlType::Q4_K:
        case GgmlType::Q5_K:
        case GgmlType::Q6_K:
        case GgmlType::IQ4_XS:
            return DotKind::Q8_K;
        default:
            fail("llama.cpp emulation: no vec_dot for weight type {}", ggml_type_name(t));
    }
}

// One matmul's inputs, shared by the worker threads.
struct MatmulJob {
    const WeightView& w;
    DotKind kind;
    int64_t n_rows;
    bool batched, tinyblas_float, repacked;
    float* out;
    const std::vector<float>& xf;     // float kinds: [n_rows][n_in] activations
    const std::vector<QuantRow>& xq;  // quantized kinds: [n_rows]
};

// Output columns [o0, o1) of a matmul: each weight row decoded once, dotted with every row.
KVRUN_EMU_CLONES void matmul_rows(const MatmulJob& job, int64_t o0, int64_t o1) {
    const WeightView& w = job.w;
    const int64_t n_in = w.n_in, n_out = w.n_out;
    const DotKind kind = job.kind;
    const bool is_float = kind == DotKind::F32 || kind == DotKind::F16 || kind == DotKind::BF16;
    std::vector<float> row(is_float && kind != DotKind::F32 ? n_in : 0);  // [n_in]
    std::vector<int32_t> isum(is_float ? 0 : n_in / 4);                   // lane sums
    DecodedRow dec;
    for (int64_t o = o0; o < o1; ++o) {
        const uint8_t* src = static_cast<const uint8_t*>(w.data) + o * w.row_bytes;
        const float* wr = reinterpret_cast<const float*>(src);
        if (is_float && kind != DotKind::F32) {
            dequantize_row(w.type, src, row.data(), n_in);  // exact
            wr = row.data();
        }
        if (!is_float) decode_row(w.type, src, n_in, dec);
        for (int64_t r = 0; r < job.n_rows; ++r) {
            const float* xr = is_float ? job.xf.data() + r * n_in : nullptr;
            float v;
            if (is_float && job.tinyblas_float)
                v = dot_tinyblas(wr, xr, n_in);
            else if (kind == DotKind::F32)
                v = dot_vec_f32(wr, xr, n_in);
            else if (kind == DotKind::F16)
                v = dot_vec_f16(wr, xr, n_in);
            else if (kind == DotKind::BF16)
                v = dot_vec_bf16(wr, xr, n_in);
            else if (kind == DotKind::Q8_K)
                v = dot_superblock(w.type, dec, job.xq[r], n_in, isum.data());
            else
                v = dot_block32(w.type, dec, job.xq[r], n_in, job.batched, job.repacked,
                                isum.data());
            job.out[r * n_out + o] = v;
        }
    }
}

// ggml_compute_forward_mul_mat for out = x . W^T, n_rows tokens (a batch of >= 2 rows is what
// selects llamafile's tinyBLAS in the reference, where it has a kernel for the type).
void matmul(float* out, const float* x, const WeightView& w, int64_t n_rows) {
    const int64_t n_in = w.n_in, n_out = w.n_out;
    const DotKind kind = dot_kind(w.type);
    const bool batched = n_rows >= 2;
    const bool is_float = kind == DotKind::F32 || kind == DotKind::F16 || kind == DotKind::BF16;
    const bool tinyblas_float = batched && n_in % 8 == 0;
    const bool repacked = w.type == GgmlType::Q4_0 && n_out % 8 == 0;
    // The activations as the kernel reads them.
    std::vector<float> xf;     // float kinds: [n_rows][n_in], rounded to f16 / bf16
    std::vector<QuantRow> xq;  // quantized kinds: one per row
    if (is_float) {
        xf.assign(x, x + n_rows * n_in);
        if (kind == DotKind::F16)
            for (float& v : xf) v = round_to_f16(v);
        if (kind == DotKind::BF16)
            for (float& v : xf) v = bf16_to_fp32(fp32_to_bf16(v));
    } else {
        xq.resize(n_rows);
        for (int64_t r = 0; r < n_rows; ++r) {
            if (kind == DotKind::Q8_K)
                quantize_q8_k_row(x + r * n_in, n_in, xq[r]);
            else
                quantize_q8_0_row(x + r * n_in, n_in, kind == DotKind::Q8_1, xq[r]);
            xq[r].qt.resize(n_in);
            to_lane_order(xq[r].q.data(), n_in, xq[r].qt.data());
        }
    }
    const MatmulJob job{w, kind, n_rows, batched, tinyblas_float, repacked, out, xf, xq};
    const int64_t grain = parallel_grain(n_in * n_rows);
    cpu_thread_pool().parallel_for(n_out, grain,
                                   [&](int64_t o0, int64_t o1) { matmul_rows(job, o0, o1); });
}

// ggml_get_rows: ggml's dequantize_row_<type>. The types with a min compute d * q + m or
// d * q - m, which the reference compiler contracts into one FMA (done explicitly here, so the
// result does not depend on the CPU this runs on); the others are plain products, as in
// dequantize_row.
void get_row(GgmlType t, const uint8_t* src, float* y, int64_t n) {
    if (t == GgmlType::Q4_1 || t == GgmlType::Q5_1) {  // y = x0 * d + m
        const bool five = t == GgmlType::Q5_1;
        for (int64_t b = 0; b < n / 32; ++b, src += five ? 24 : 20, y += 32) {
            const float d = f16_at(src), m = f16_at(src + 2);
            uint32_t qh = 0;
            if (five) std::memcpy(&qh, src + 4, 4);
            const uint8_t* qs = src + (five ? 8 : 4);
            for (int j = 0; j < 16; ++j) {
                const int lo = (qs[j] & 15) | int((qh >> j) & 1) << 4;
                const int hi = (qs[j] >> 4) | int((qh >> (j + 16)) & 1) << 4;
                y[j] = fmaf_(float(lo), d, m);
                y[j + 16] = fmaf_(float(hi), d, m);
            }
        }
    } else if (t == GgmlType::Q2_K) {  // y = dl * q - ml per 16 elements
        for (int64_t b = 0; b < n / 256; ++b, src += 84, y += 256) {
            const float d = f16_at(src + 80), dmin = f16_at(src + 82);
            for (int e = 0; e < 256; ++e) {
                const int sc = src[e / 16];
                const int q = (src[16 + 32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
                y[e] = fmaf_(d * float(sc & 0xf), float(q), -(dmin * float(sc >> 4)));
            }
        }
    } else if (t == GgmlType::Q4_K || t == GgmlType::Q5_K) {  // y = d1 * q - m1 per 32
        const bool five = t == GgmlType::Q5_K;
        for (int64_t b = 0; b < n / 256; ++b, src += five ? 176 : 144, y += 256) {
            const float d = f16_at(src), dmin = f16_at(src + 2);
            const uint8_t* qh = src + 16;
            const uint8_t* qs = src + (five ? 48 : 16);
            for (int j = 0; j < 8; ++j) {
                int sc, m;
                quant_detail::unpack_scale_min(src + 4, j, sc, m);
                const float d1 = d * float(sc), m1 = dmin * float(m);
                for (int l = 0; l < 32; ++l) {
                    int q = (qs[32 * (j / 2) + l] >> (4 * (j & 1))) & 0xf;
                    if (five) q |= ((qh[l] >> j) & 1) << 4;
                    y[32 * j + l] = fmaf_(d1, float(q), -m1);
                }
            }
        }
    } else {
        dequantize_row(t, src, y, n);
    }
}

// ggml_v_expf, one AVX2 lane: ggml's vectorized expf (~1.5 ulp), special cases included.
float v_expf(float x) {
    auto bits = [](float f) {
        uint32_t u;
        std::memcpy(&u, &f, 4);
        return u;
    };
    auto from_bits = [](uint32_t u) {
        float f;
        std::memcpy(&f, &u, 4);
        return f;
    };
    const float r = 0x1.8p23f;
    const float z = fmaf_(x, 0x1.715476p+0f, r);
    const float n = z - r;
    const float b = fmaf_(-n, 0x1.7f7d1cp-20f, fmaf_(-n, 0x1.62e4p-1f, x));
    const uint32_t e = bits(z) << 23;
    const float k = from_bits(e + bits(1.0f));
    const float u = b * b;
    const float j = fmaf_(fmaf_(fmaf_(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
                                fmaf_(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                          u, 0x1.ffffecp-1f * b);
    if (!(std::fabs(n) > 126.0f)) return fmaf_(j, k, k);
    const uint32_t g = n <= 0.0f ? 0x82000000u : 0u;
    const float s1 = from_bits(g + 0x7f000000u);
    const float s2 = from_bits(e - g);
    if (std::fabs(n) > 192.0f) return s1 * s1;
    return fmaf_(s2, j, s2) * s1;
}

// ggml_vec_silu_f32 on one row: ggml_v_silu (x / (1 + v_expf(0 - x))) on chunks of 8, then
// ggml_silu_f32 (x / (1 + expf(-x))) on the rest.
void silu_row(float* y, const float* x, int64_t n) {
    const int64_t nv = n & ~int64_t(7);
    for (int64_t i = 0; i < nv; ++i) y[i] = x[i] / (1.0f + v_expf(0.0f - x[i]));
    for (int64_t i = nv; i < n; ++i) y[i] = x[i] / (1.0f + std::exp(-x[i]));
}

// acc[32] (4 x 8 lanes) += p * v[32-slot lane] for every channel: acc[i * 32 + lane] =
// fma(v[i], p, acc[i * 32 + lane]), i < n.
KVRUN_EMU_CLONES void fma_channel_lane(float* acc, const float* v, float p, int64_t lane,
                                       int64_t n) {
    for (int64_t i = 0; i < n; ++i) acc[i * 32 + lane] = fmaf_(v[i], p, acc[i * 32 + lane]);
}

// One (token, head) of llama.cpp's attention without flash attention, for an f16 K/V cache:
// KQ = K x Q(->f16), softmax(KQ * scale) over the KV row padded to 32 cells (the masked cells
// add exact zeros), KQV = V^T x softmax(->f16). Each product runs on llamafile's tinyBLAS in a
// batch of >= 2 tokens (lane = cell % 8) when its length is a multiple of 8, else on
// ggml_vec_dot_f16 (lane = cell % 32). k_row(s) / v_row(s): the K / V row of cell s as floats.
void attention(float* out, const float* q, int64_t hd, int64_t n_slots, float scale, bool batched,
               const RowFn& k_row, const RowFn& v_row, AttentionScratch& x) {
    x.q.resize(hd);
    x.scores.resize(n_slots);
    for (int64_t i = 0; i < hd; ++i) x.q[i] = round_to_f16(q[i]);
    const bool kq_tinyblas = batched && hd % 8 == 0;
    for (int64_t s = 0; s < n_slots; ++s) {
        const float* k = k_row(s);
        const float kq =
            kq_tinyblas ? dot_tinyblas(x.q.data(), k, hd) : dot_vec_f16(x.q.data(), k, hd);
        x.scores[s] = kq * scale;
    }
    // ggml_vec_soft_max_f32: v_expf on chunks of 8, each chunk's hsum8 added to a double sum.
    const float mx = *std::max_element(x.scores.begin(), x.scores.end());
    const int64_t n_kv = (n_slots + 31) / 32 * 32;
    double sum = 0;
    for (int64_t c = 0; c < n_kv; c += 8) {
        float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int64_t s = c; s < std::min(c + 8, n_slots); ++s)
            v[s - c] = x.scores[s] = v_expf(x.scores[s] - mx);
        sum += double(hsum8(v));
    }
    const float inv = float(1.0 / sum);
    x.lanes.assign(hd * 32, 0.0f);  // [head_dim][4][8]
    for (int64_t s = 0; s < n_slots; ++s)
        fma_channel_lane(x.lanes.data(), v_row(s), round_to_f16(x.scores[s] * inv),
                         batched ? s % 8 : s % 32, hd);
    for (int64_t i = 0; i < hd; ++i) {
        const float* acc = x.lanes.data() + i * 32;
        out[i] = batched ? hsum8(acc) : reduce4x8(acc);
    }
}

}  // namespace kvrun::cpu::llamacpp
