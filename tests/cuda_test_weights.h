// Random weight matrices of every GGUF type the CUDA kernels handle, for the CUDA op tests:
// float types from random values, block types from random bytes with sane f16 scales (so
// every code pattern occurs; MXFP4 / NVFP4: scale bytes near 2^0), uploaded to the device next to
// the host copy.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "cpu_ops.h"
#include "cuda_test_util.h"
#include "quant.h"

namespace kvrun::test {

// NMSE bounds of the CUDA op tests against their CPU twins.
constexpr double kExact = 1e-10;   // same math in f32 (different order / FMA at most)
constexpr double kGemv = 1e-9;     // f32 dot products of up to 4096 terms
constexpr double kGemmF16 = 1e-5;  // activations and weights rounded to f16

inline const std::vector<GgmlType>& cuda_weight_types() {
    static const std::vector<GgmlType> types = {
        GgmlType::F32,   GgmlType::F16,   GgmlType::BF16,  GgmlType::Q4_0,   GgmlType::Q4_1,
        GgmlType::Q5_0,  GgmlType::Q5_1,  GgmlType::Q8_0,  GgmlType::Q2_K,   GgmlType::Q3_K,
        GgmlType::Q4_K,  GgmlType::Q5_K,  GgmlType::Q6_K,  GgmlType::IQ4_NL, GgmlType::IQ4_XS,
        GgmlType::MXFP4, GgmlType::NVFP4, GgmlType::TQ1_0, GgmlType::TQ2_0,  GgmlType::Q1_0};
    return types;
}

// Byte offsets of the f16 scale fields inside one block of t.
inline std::vector<int> scale_offsets(GgmlType t) {
    switch (t) {
        case GgmlType::Q4_1:
        case GgmlType::Q5_1:
        case GgmlType::Q4_K:
        case GgmlType::Q5_K:
            return {0, 2};
        case GgmlType::Q2_K:
            return {80, 82};
        case GgmlType::Q3_K:
            return {108};
        case GgmlType::Q6_K:
            return {208};
        case GgmlType::TQ1_0:
            return {52};
        case GgmlType::TQ2_0:
            return {64};
        default:
            return {0};
    }
}

#ifdef KVRUN_HAS_CUDA
struct TestWeights {
    std::vector<uint8_t> bytes;  // [n_out][row_bytes]
    DevBuf<uint8_t> dev;
    WeightView host;    // data: bytes
    WeightView device;  // data: dev
};

inline TestWeights make_weights(GgmlType t, int64_t n_out, int64_t n_in, uint32_t seed) {
    TestWeights w;
    const size_t row_bytes = ggml_row_bytes(t, n_in);
    w.bytes.resize(row_bytes * size_t(n_out));
    const auto& tr = ggml_type_traits(t);
    std::mt19937 rng(seed);
    if (tr.block_elems == 1) {
        const std::vector<float> v = random_floats(size_t(n_out * n_in), seed, 0.5f);
        for (int64_t o = 0; o < n_out; ++o)
            quantize_row(t, v.data() + o * n_in, w.bytes.data() + o * row_bytes, n_in);
    } else {
        std::uniform_int_distribution<int> byte(0, 255);
        for (auto& b : w.bytes) b = uint8_t(byte(rng));
        std::uniform_real_distribution<float> mag(0.002f, 0.05f);
        std::uniform_int_distribution<int> sign(0, 1);
        const std::vector<int> offs = scale_offsets(t);
        std::uniform_int_distribution<int> exponent(118, 129);  // MXFP4's E8M0 byte: 2^-10..2^1
        for (size_t b = 0; b < w.bytes.size() && t == GgmlType::MXFP4; b += tr.block_bytes)
            w.bytes[b] = uint8_t(exponent(rng));
        std::uniform_int_distribution<int> ue4m3(0x10, 0x3f);  // NVFP4's scales: 2^-7..2^-1
        for (size_t b = 0; b < w.bytes.size() && t == GgmlType::NVFP4; b += tr.block_bytes)
            for (size_t k = 0; k < 4; ++k) w.bytes[b + k] = uint8_t(ue4m3(rng));
        const bool f16_scales = t != GgmlType::MXFP4 && t != GgmlType::NVFP4;
        for (size_t b = 0; b < w.bytes.size() && f16_scales; b += tr.block_bytes)
            for (size_t k = 0; k < offs.size(); ++k) {
                // The first field is the scale (either sign for symmetric types); a second one
                // is a min (Q4_1, Q5_1) or a positive min scale (K-quants).
                float v = mag(rng);
                if (k == 0 && sign(rng)) v = -v;
                const uint16_t h = fp32_to_fp16(v);
                std::memcpy(&w.bytes[b + size_t(offs[k])], &h, 2);
            }
    }
    w.dev = DevBuf<uint8_t>(w.bytes);
    w.host = WeightView{t, n_in, n_out, row_bytes, w.bytes.data()};
    w.device = w.host;
    w.device.data = w.dev.get();
    return w;
}
#endif

}  // namespace kvrun::test
