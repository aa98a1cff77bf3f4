// Tests for src/quant*.cpp: type table, half/bfloat16 conversion, quantize/dequantize
// round trips, fused dot == dequantize + dot, and the decisive layout check: every tensor
// of the llama.cpp-quantized stories260K models dequantizes close to the F32 original.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gguf.h"
#include "quant.h"
#include "test_util.h"

using namespace kvrun;

namespace {

float bits_to_float(uint32_t b) {
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}
uint32_t float_to_bits(float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return b;
}

std::vector<float> gaussian(size_t n, uint32_t seed, float sigma = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, sigma);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(rng);
    return v;
}

// sqrt(sum (a-b)^2 / sum b^2): 0 is exact, ~1 means unrelated values.
double rel_rmse(const float* a, const float* b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
        num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        den += double(b[i]) * b[i];
    }
    return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

std::string error_of(auto&& fn) {
    try {
        fn();
    } catch (const Error& e) {
        return e.what();
    }
    return "<no error>";
}

}  // namespace

TEST_CASE("type table: block layouts of every ggml type") {
    struct Row {
        GgmlType t;
        int64_t elems;
        size_t bytes;
        bool deq;
    };
    const Row rows[] = {
        {GgmlType::F32, 1, 4, true},        {GgmlType::F16, 1, 2, true},
        {GgmlType::BF16, 1, 2, true},       {GgmlType::Q4_0, 32, 18, true},
        {GgmlType::Q4_1, 32, 20, true},     {GgmlType::Q5_0, 32, 22, true},
        {GgmlType::Q5_1, 32, 24, true},     {GgmlType::Q8_0, 32, 34, true},
        {GgmlType::Q8_1, 32, 36, true},     {GgmlType::Q2_K, 256, 84, true},
        {GgmlType::Q3_K, 256, 110, true},   {GgmlType::Q4_K, 256, 144, true},
        {GgmlType::Q5_K, 256, 176, true},   {GgmlType::Q6_K, 256, 210, true},
        {GgmlType::Q8_K, 256, 292, true},   {GgmlType::IQ4_NL, 32, 18, true},
        {GgmlType::IQ4_XS, 256, 136, true}, {GgmlType::IQ2_XXS, 256, 66, false},
        {GgmlType::IQ2_XS, 256, 74, false}, {GgmlType::IQ3_XXS, 256, 98, false},
        {GgmlType::IQ1_S, 256, 50, false},  {GgmlType::IQ3_S, 256, 110, false},
        {GgmlType::IQ2_S, 256, 82, false},  {GgmlType::IQ1_M, 256, 56, false},
        {GgmlType::TQ1_0, 256, 54, true},   {GgmlType::TQ2_0, 256, 66, true},
        {GgmlType::I8, 1, 1, false},        {GgmlType::I16, 1, 2, false},
        {GgmlType::I32, 1, 4, false},       {GgmlType::I64, 1, 8, false},
        {GgmlType::F64, 1, 8, false},       {GgmlType::MXFP4, 32, 17, true},
        {GgmlType::NVFP4, 64, 36, true},    {GgmlType::Q1_0, 128, 18, true},
    };
    for (const Row& r : rows) {
        CAPTURE(uint32_t(r.t));
        CHECK(ggml_type_known(uint32_t(r.t)));
        const GgmlTypeTraits& tr = ggml_type_traits(r.t);
        CHECK(tr.block_elems == r.elems);
        CHECK(tr.block_bytes == r.bytes);
        CHECK(tr.can_dequantize == r.deq);
        CHECK(ggml_row_bytes(r.t, r.elems * 3) == r.bytes * 3);
    }
    CHECK(std::string(ggml_type_name(GgmlType::Q4_K)) == "Q4_K");
    CHECK(std::string(ggml_type_name(GgmlType::IQ4_XS)) == "IQ4_XS");
    for (uint32_t id : {4u, 5u, 31u, 32u, 33u, 36u, 42u, 1000u, 0xffffffffu}) {
        CAPTURE(id);
        CHECK_FALSE(ggml_type_known(id));
        CHECK(error_of([&] { ggml_type_traits(GgmlType(id)); }).find(std::to_string(id)) !=
              std::string::npos);
    }
}

TEST_CASE("bad rows and unsupported types throw clear errors") {
    std::vector<uint8_t> bytes(1024);
    std::vector<float> f(256);
    CHECK(error_of([&] { ggml_row_bytes(GgmlType::Q4_K, 100); }).find("Q4_K") != std::string::npos);
    CHECK(error_of([&] { ggml_row_bytes(GgmlType::Q4_0, -32); }) != "<no error>");
    CHECK(error_of([&] { dequantize_row(GgmlType::Q8_0, bytes.data(), f.data(), 33); }) !=
          "<no error>");
    CHECK(error_of([&] {
              dequantize_row(GgmlType::IQ2_XXS, bytes.data(), f.data(), 256);
          }).find("IQ2_XXS") != std::string::npos);
    CHECK(error_of([&] {
              vec_dot_row(GgmlType::IQ3_S, bytes.data(), f.data(), 256);
          }).find("IQ3_S") != std::string::npos);
    CHECK(error_of([&] {
              quantize_row(GgmlType::IQ1_M, f.data(), bytes.data(), 256);
          }).find("IQ1_M") != std::string::npos);
    CHECK(error_of([&] { dequantize_row(GgmlType(77), bytes.data(), f.data(), 32); }).find("77") !=
          std::string::npos);
}

TEST_CASE("fp16: exact round trip of every half, and named edge cases") {
    for (uint32_t h = 0; h < 0x10000; ++h) {
        const float f = fp16_to_fp32(uint16_t(h));
        const bool is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
        if (is_nan) {
            REQUIRE(std::isnan(f));
            REQUIRE(std::isnan(fp16_to_fp32(fp32_to_fp16(f))));
        } else {
            REQUIRE(fp32_to_fp16(f) == h);
        }
    }
    CHECK(fp16_to_fp32(0x3c00) == 1.0f);
    CHECK(fp16_to_fp32(0xc000) == -2.0f);
    CHECK(fp16_to_fp32(0x7bff) == 65504.0f);
    CHECK(fp16_to_fp32(0x0001) == std::ldexp(1.0f, -24));  // smallest subnormal
    CHECK(fp16_to_fp32(0x0400) == std::ldexp(1.0f, -14));  // smallest normal
    CHECK(std::isinf(fp16_to_fp32(0x7c00)));
    CHECK(fp32_to_fp16(-0.0f) == 0x8000);
    CHECK(fp32_to_fp16(65519.0f) == 0x7bff);  // just below the rounding boundary
    CHECK(fp32_to_fp16(65520.0f) == 0x7c00);  // ties to even -> inf
    CHECK(fp32_to_fp16(1e10f) == 0x7c00);
    CHECK(fp32_to_fp16(-INFINITY) == 0xfc00);
    CHECK(std::isnan(fp16_to_fp32(fp32_to_fp16(NAN))));
    CHECK(fp32_to_fp16(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);      // tie -> even (down)
    CHECK(fp32_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);  // tie -> even (up)
    CHECK(fp32_to_fp16(std::ldexp(1.0f, -25)) == 0x0000);             // tie -> even zero
    CHECK(fp32_to_fp16(std::ldexp(1.5f, -25)) == 0x0001);
    CHECK(fp32_to_fp16(std::ldexp(3.0f, -25)) == 0x0002);  // 1.5 units: tie -> even 2
    CHECK(fp32_to_fp16(std::ldexp(1.0f, -30)) == 0x0000);
    CHECK(fp32_to_fp16(bits_to_float(1)) == 0x0000);          // f32 subnormal
    CHECK(fp32_to_fp16(std::ldexp(1023.5f, -24)) == 0x0400);  // rounds up into normals
}

TEST_CASE("fp16 / bf16: conversion of random floats is round-to-nearest") {
    std::mt19937 rng(7);
    for (int i = 0; i < 200000; ++i) {
        // Random magnitudes across the half range (and beyond), random sign.
        const float f = bits_to_float((rng() & 0x80000000u) | (0x30000000u + rng() % 0x18000000u));
        const uint16_t h = fp32_to_fp16(f);
        const float hf = fp16_to_fp32(h);
        if (std::isinf(hf)) {
            REQUIRE(std::fabs(f) >= 65520.0f);
            continue;
        }
        // No neighbour half is strictly closer; on a tie the chosen one is even.
        const float up = fp16_to_fp32(uint16_t(h + 1)), down = fp16_to_fp32(uint16_t(h - 1));
        const double err = std::fabs(double(hf) - f);
        if ((h & 0x7fff) != 0x7bff) REQUIRE(err <= std::fabs(double(up) - f));
        if ((h & 0x7fff) != 0) REQUIRE(err <= std::fabs(double(down) - f));
        if (err == std::fabs(double(up) - f) || err == std::fabs(double(down) - f))
            REQUIRE((h & 1) == 0);

        const uint16_t b = fp32_to_bf16(f);
        const uint32_t fb = float_to_bits(f);
        const uint32_t lo = fb & 0xffff;
        uint16_t expect = uint16_t(fb >> 16);
        if (lo > 0x8000 || (lo == 0x8000 && (expect & 1))) ++expect;
        REQUIRE(b == expect);
        REQUIRE(bf16_to_fp32(b) == bits_to_float(uint32_t(b) << 16));
    }
    CHECK(fp32_to_bf16(1.0f) == 0x3f80);
    CHECK(fp32_to_bf16(-INFINITY) == 0xff80);
    CHECK(std::isnan(bf16_to_fp32(fp32_to_bf16(NAN))));
    CHECK(std::isnan(bf16_to_fp32(fp32_to_bf16(bits_to_float(0x7f800001u)))));  // low payload
    CHECK(fp32_to_bf16(bits_to_float(0x3f808000u)) == 0x3f80);                  // tie -> even down
    CHECK(fp32_to_bf16(bits_to_float(0x3f818000u)) == 0x3f82);                  // tie -> even up
    CHECK(fp32_to_bf16(bits_to_float(0x7f7fffffu)) == 0x7f80);  // FLT_MAX rounds to inf
}

// Bounds on the relative RMSE of quantize -> dequantize on N(0,1) data. With blocks of
// 32 Gaussian values the largest |x| is ~2.1 sigma, so a uniform b-bit grid over the block
// has step ~4.2/(2^b - 1) sigma and RMSE step/sqrt(12): 8 bits ~0.005, 6 bits ~0.02,
// 5 bits ~0.04, 4 bits ~0.08, 3 bits ~0.17, 2 bits ~0.35 (K-quants' 16-element
// sub-blocks and scale search do a little better). The bounds add ~25% headroom.
TEST_CASE("quantize -> dequantize round trip error per type") {
    const struct {
        GgmlType t;
        double bound;
    } cases[] = {
        {GgmlType::F32, 0.0},
        {GgmlType::F16, 0.0005},
        {GgmlType::BF16, 0.004},
        {GgmlType::Q8_0, 0.008},
        {GgmlType::Q8_1, 0.008},
        {GgmlType::Q8_K, 0.008},
        {GgmlType::Q6_K, 0.025},
        {GgmlType::Q5_0, 0.05},
        {GgmlType::Q5_1, 0.05},
        {GgmlType::Q5_K, 0.045},
        {GgmlType::Q4_0, 0.10},
        {GgmlType::Q4_1, 0.10},
        {GgmlType::Q4_K, 0.09},
        {GgmlType::IQ4_NL, 0.10},
        {GgmlType::IQ4_XS, 0.10},
        {GgmlType::Q3_K, 0.20},
        {GgmlType::Q2_K, 0.40},
        {GgmlType::MXFP4, 0.13},
        {GgmlType::NVFP4, 0.11},
        // One or two bits cannot code a Gaussian well (sign codes leave sqrt(1 - 2/pi) =
        // 0.60); these types are for models trained to their values (test_quant_lowbit).
        {GgmlType::Q1_0, 0.62},
        {GgmlType::TQ2_0, 0.85},
        {GgmlType::TQ1_0, 0.85},
    };
    const int64_t n = 256 * 64;
    std::vector<float> x = gaussian(size_t(n), 42), y(static_cast<size_t>(n));
    // A few blocks at very different magnitudes, and an all-zero block.
    for (int i = 0; i < 256; ++i) x[size_t(i)] *= 1e-3f, x[size_t(256 + i)] *= 50.0f;
    for (int i = 512; i < 768; ++i) x[size_t(i)] = 0;
    std::string summary;
    for (const auto& c : cases) {
        CAPTURE(std::string(ggml_type_name(c.t)));
        REQUIRE(ggml_type_traits(c.t).can_quantize);
        std::vector<uint8_t> q(ggml_row_bytes(c.t, n));
        quantize_row(c.t, x.data(), q.data(), n);
        dequantize_row(c.t, q.data(), y.data(), n);
        // Measure on the N(0,1) part only (so the 50x block doesn't dominate).
        const double err = rel_rmse(y.data() + 768, x.data() + 768, size_t(n - 768));
        summary += fmt::format(" {}={:.4f}", ggml_type_name(c.t), err);
        CHECK(err <= c.bound);
        // NVFP4's smallest scale (2^-10, no per-tensor factor in the block) flushes the
        // 1e-3 block to zero; its checkpoints carry a tensor scale for that (.scale).
        if (c.t != GgmlType::NVFP4)
            CHECK(rel_rmse(y.data(), x.data(), 256) <= std::max(c.bound, 1e-9) * 1.5);
        CHECK(rel_rmse(y.data() + 256, x.data() + 256, 256) <= std::max(c.bound, 1e-9) * 1.5);
        for (int i = 512; i < 768; ++i) REQUIRE(y[size_t(i)] == 0.0f);
    }
    MESSAGE("round-trip rel rmse:" << summary);
}

TEST_CASE("MXFP4: OCP microscaling FP4 blocks decode as the format defines them") {
    // One block: E8M0 exponent byte 127 is a scale of 2^0; E2M1 codes 0..7 are 0, 0.5, 1,
    // 1.5, 2, 3, 4, 6 and bit 3 is the sign. Element j < 16 is byte j's low nibble.
    uint8_t block[17] = {127};
    for (int j = 0; j < 16; ++j) block[1 + j] = uint8_t(j | (15 - j) << 4);
    const float e2m1[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    float y[32];
    dequantize_row(GgmlType::MXFP4, block, y, 32);
    for (int j = 0; j < 16; ++j) {
        CAPTURE(j);
        const float lo = (j & 8 ? -1.0f : 1.0f) * e2m1[j & 7];
        const float hi = ((15 - j) & 8 ? -1.0f : 1.0f) * e2m1[(15 - j) & 7];
        CHECK(y[j] == lo);
        CHECK(y[j + 16] == hi);
    }
    // The exponent scales by exact powers of two, the smallest byte included (2^-127).
    block[0] = 130;
    dequantize_row(GgmlType::MXFP4, block, y, 32);
    CHECK(y[7] == 48.0f);
    CHECK(y[31] == -0.0f);
    block[0] = 0;
    dequantize_row(GgmlType::MXFP4, block, y, 32);
    CHECK(y[2] == std::ldexp(1.0f, -127));
    // Quantizing values on the grid gives them back exactly.
    std::vector<float> x(64);
    for (int i = 0; i < 64; ++i) x[size_t(i)] = (i % 3 ? 1.0f : -1.0f) * e2m1[i % 8] * 0.25f;
    std::vector<uint8_t> q(ggml_row_bytes(GgmlType::MXFP4, 64));
    quantize_row(GgmlType::MXFP4, x.data(), q.data(), 64);
    std::vector<float> back(64);
    dequantize_row(GgmlType::MXFP4, q.data(), back.data(), 64);
    for (int i = 0; i < 64; ++i) CHECK(back[size_t(i)] == x[size_t(i)]);
}

// Random, valid blocks: random bytes with every f16 scale field set to a sane value.
std::vector<uint8_t> random_blocks(GgmlType t, int64_t n, uint32_t seed) {
    const GgmlTypeTraits& tr = ggml_type_traits(t);
    std::vector<uint8_t> b(ggml_row_bytes(t, n));
    std::mt19937 rng(seed);
    for (auto& v : b) v = uint8_t(rng());
    std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
    auto put16 = [&](size_t off, uint16_t v) { std::memcpy(&b[off], &v, 2); };
    const std::map<GgmlType, std::vector<size_t>> f16_fields = {
        {GgmlType::Q4_0, {0}},      {GgmlType::Q4_1, {0, 2}}, {GgmlType::Q5_0, {0}},
        {GgmlType::Q5_1, {0, 2}},   {GgmlType::Q8_0, {0}},    {GgmlType::Q8_1, {0, 2}},
        {GgmlType::Q2_K, {80, 82}}, {GgmlType::Q3_K, {108}},  {GgmlType::Q4_K, {0, 2}},
        {GgmlType::Q5_K, {0, 2}},   {GgmlType::Q6_K, {208}},  {GgmlType::IQ4_NL, {0}},
        {GgmlType::IQ4_XS, {0}},    {GgmlType::TQ1_0, {52}},  {GgmlType::TQ2_0, {64}},
        {GgmlType::Q1_0, {0}},
    };
    const int64_t nb = n / tr.block_elems;
    if (t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16) {
        std::vector<float> x = gaussian(size_t(n), seed);
        quantize_row(t, x.data(), b.data(), n);
    } else if (t == GgmlType::MXFP4) {  // E8M0 exponent bytes near 2^0
        for (int64_t i = 0; i < nb; ++i) b[size_t(i) * tr.block_bytes] = uint8_t(118 + rng() % 12);
    } else if (t == GgmlType::NVFP4) {  // UE4M3 scale bytes from 2^-6 to 2^1
        for (int64_t i = 0; i < nb * 4; ++i)
            b[size_t(i / 4) * tr.block_bytes + size_t(i % 4)] = uint8_t(0x10 + rng() % 0x40);
    } else if (t == GgmlType::Q8_K) {
        for (int64_t i = 0; i < nb; ++i) {
            const float d = scale(rng);
            std::memcpy(&b[size_t(i) * tr.block_bytes], &d, 4);
        }
    } else {
        for (int64_t i = 0; i < nb; ++i)
            for (size_t off : f16_fields.at(t))
                put16(size_t(i) * tr.block_bytes + off, fp32_to_fp16(scale(rng)));
    }
    return b;
}

TEST_CASE("vec_dot_row equals dequantize_row + dot for every dequantizable type") {
    int checked = 0;
    for (uint32_t id = 0; id < 64; ++id) {
        if (!ggml_type_known(id) || !ggml_type_traits(GgmlType(id)).can_dequantize) continue;
        const GgmlType t = GgmlType(id);
        CAPTURE(std::string(ggml_type_name(t)));
        for (int64_t blocks256 : {1, 3, 17}) {
            const int64_t n = 256 * blocks256;
            std::vector<uint8_t> row = random_blocks(t, n, uint32_t(id * 100 + blocks256));
            std::vector<float> x = gaussian(size_t(n), 99), w(static_cast<size_t>(n));
            dequantize_row(t, row.data(), w.data(), n);
            double ref = 0, mag = 0;
            for (int64_t i = 0; i < n; ++i) {
                REQUIRE(std::isfinite(w[size_t(i)]));
                ref += double(w[size_t(i)]) * x[size_t(i)];
                mag += std::fabs(double(w[size_t(i)]) * x[size_t(i)]);
            }
            REQUIRE(mag > 0);
            const float got = vec_dot_row(t, row.data(), x.data(), n);
            CHECK(std::fabs(got - ref) <= 1e-5 * mag);
        }
        ++checked;
    }
    CHECK(checked == 22);
}

// The layout check: llama.cpp quantized these models from the same F32 weights, so each
// dequantized tensor must match the original up to quantization noise. A misread layout
// (wrong nibble order, scale packing, offsets) gives a relative error near 1 or more.
TEST_CASE("real models: every llama.cpp-quantized tensor dequantizes to its F32 original") {
    auto dir = test::shared_path("models");
    if (dir.empty()) return;
    // Bounds on relative RMSE vs F32: ~1.3-1.6x the worst error llama.cpp's own quantizer
    // leaves on these weights (measured: Q8_0 0.006, Q6_K 0.020, Q5_* 0.04-0.055, Q4_*
    // and IQ4 0.08-0.11, Q3_K 0.17, Q2_K 0.48); a misread layout scores ~1 or more.
    const std::map<GgmlType, double> bounds = {
        {GgmlType::F16, 0.001}, {GgmlType::BF16, 0.005},  {GgmlType::Q8_0, 0.01},
        {GgmlType::Q6_K, 0.03}, {GgmlType::Q5_0, 0.06},   {GgmlType::Q5_1, 0.06},
        {GgmlType::Q5_K, 0.06}, {GgmlType::Q4_0, 0.15},   {GgmlType::Q4_1, 0.15},
        {GgmlType::Q4_K, 0.12}, {GgmlType::IQ4_NL, 0.12}, {GgmlType::IQ4_XS, 0.12},
        {GgmlType::Q3_K, 0.25}, {GgmlType::Q2_K, 0.5},
    };
    std::map<GgmlType, double> worst;
    const GgufFile ref64 = GgufFile::open((dir / "stories260K.gguf").string());
    const GgufFile ref256 = GgufFile::open((dir / "stories260K-w256-F32.gguf").string());
    int files = 0;
    for (const auto& path : test::shared_models()) {
        const std::string name = path.filename().string();
        if (name.rfind("stories260K-", 0) != 0 || name.find("F32") != std::string::npos) continue;
        const GgufFile& ref = name.find("w256") != std::string::npos ? ref256 : ref64;
        const GgufFile model = GgufFile::open(path.string());
        ++files;
        for (const GgufTensorInfo& ti : model.tensors()) {
            if (ti.type == GgmlType::F32) continue;
            CAPTURE(name);
            CAPTURE(ti.name);
            const GgufTensorInfo* rt = ref.find_tensor(ti.name);
            REQUIRE(rt != nullptr);
            REQUIRE(rt->type == GgmlType::F32);
            REQUIRE(rt->dims == ti.dims);
            REQUIRE(bounds.count(ti.type));
            std::vector<float> got(size_t(ti.n_elements));
            const int64_t row = ti.dims[0], nrows = ti.n_elements / row;
            const size_t row_bytes = ggml_row_bytes(ti.type, row);
            REQUIRE(row_bytes * size_t(nrows) == ti.n_bytes);
            for (int64_t r = 0; r < nrows; ++r)
                dequantize_row(ti.type, ti.data + size_t(r) * row_bytes, got.data() + r * row, row);
            const double err = rel_rmse(got.data(), reinterpret_cast<const float*>(rt->data),
                                        size_t(ti.n_elements));
            CAPTURE(std::string(ggml_type_name(ti.type)));
            CHECK(err <= bounds.at(ti.type));
            worst[ti.type] = std::max(worst[ti.type], err);
        }
    }
    CHECK(files >= 30);
    std::string summary;
    for (const auto& [t, e] : worst) summary += fmt::format(" {}={:.4f}", ggml_type_name(t), e);
    MESSAGE("worst rel rmse per type:" << summary);
    // Every dequantizable weight type appears in the shared models except Q8_1/Q8_K.
    CHECK(worst.size() == bounds.size());
}

// Our quantizers against llama.cpp's on the same trained weights (pure-type models): the
// error of kvrun's quantization must not be much worse than llama.cpp's.
TEST_CASE("real models: kvrun quantizers are about as accurate as llama.cpp's") {
    auto dir = test::shared_path("models");
    if (dir.empty()) return;
    const GgufFile ref = GgufFile::open((dir / "stories260K-w256-F32.gguf").string());
    for (const char* type :
         {"Q2_K", "Q3_K_M", "Q4_0", "Q4_1", "Q4_K_M", "Q5_0", "Q5_1", "Q5_K_M"}) {
        const GgufFile model =
            GgufFile::open((dir / fmt::format("stories260K-w256-pure-{}.gguf", type)).string());
        double ours = 0, theirs = 0, den = 0;
        GgmlType seen = GgmlType::F32;
        for (const GgufTensorInfo& ti : model.tensors()) {
            if (ti.type == GgmlType::F32 || ti.type == GgmlType::F16) continue;
            seen = ti.type;
            const GgufTensorInfo* rt = ref.find_tensor(ti.name);
            REQUIRE(rt != nullptr);
            const size_t n = size_t(ti.n_elements);
            const float* x = reinterpret_cast<const float*>(rt->data);
            std::vector<float> a(n), b(n);
            std::vector<uint8_t> q(ggml_row_bytes(ti.type, int64_t(n)));
            dequantize_row(ti.type, ti.data, a.data(), int64_t(n));
            quantize_row(ti.type, x, q.data(), int64_t(n));
            dequantize_row(ti.type, q.data(), b.data(), int64_t(n));
            for (size_t i = 0; i < n; ++i) {
                theirs += (double(a[i]) - x[i]) * (double(a[i]) - x[i]);
                ours += (double(b[i]) - x[i]) * (double(b[i]) - x[i]);
                den += double(x[i]) * x[i];
            }
        }
        const double e_ours = std::sqrt(ours / den), e_theirs = std::sqrt(theirs / den);
        MESSAGE(fmt::format("{}: kvrun {:.4f}, llama.cpp {:.4f}", ggml_type_name(seen), e_ours,
                            e_theirs));
        CHECK(e_ours <= 1.3 * e_theirs);
    }
}
