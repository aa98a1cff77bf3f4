// The ternary, binary and NVFP4 block types against their layouts, worked out by hand from
// the formats' definitions (quant_ternary.cpp, quant_iq.cpp): hand-built blocks decode to the
// values the layout gives, and values a model trained to the type holds (ternary or sign
// weights times a scale, FP4 values times a power of two) quantize back to themselves, with or
// without an importance matrix.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gguf.h"
#include "quant.h"

using namespace kvrun;

namespace {

void put_f16(uint8_t* p, float v) {
    const uint16_t h = fp32_to_fp16(v);
    std::memcpy(p, &h, 2);
}

std::vector<float> decode(GgmlType t, const std::vector<uint8_t>& bytes, int64_t n) {
    std::vector<float> y(size_t(n), 123.0f);
    dequantize_row(t, bytes.data(), y.data(), n);
    return y;
}

// Quantizing x (with importance weights w, or none) gives x back exactly.
void check_round_trip(GgmlType t, const std::vector<float>& x, const float* w) {
    const int64_t n = int64_t(x.size());
    std::vector<uint8_t> q(ggml_row_bytes(t, n));
    if (w) {
        std::vector<float> weights(w, w + n);
        quantize_row_weighted(t, x.data(), weights.data(), q.data(), n);
    } else {
        quantize_row(t, x.data(), q.data(), n);
    }
    const std::vector<float> y = decode(t, q, n);
    int wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += y[size_t(i)] != x[size_t(i)];
    CHECK(wrong == 0);
}

std::vector<float> random_weights(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(0.01f, 4.0f);
    std::vector<float> w(n);
    for (float& v : w) v = u(rng);
    return w;
}

}  // namespace

TEST_CASE("TQ2_0: element 128h + 32l + m is bits 2l of byte 32h + m, code - 1 times d") {
    std::vector<uint8_t> block(66, 0);
    auto code = [](int e) { return (e * 7 + e / 5) % 3; };
    for (int e = 0; e < 256; ++e) {
        const int h = e / 128, l = (e % 128) / 32, m = e % 32;
        block[size_t(32 * h + m)] |= uint8_t(code(e) << (2 * l));
    }
    put_f16(&block[64], 0.75f);
    const std::vector<float> y = decode(GgmlType::TQ2_0, block, 256);
    for (int e = 0; e < 256; ++e) {
        CAPTURE(e);
        CHECK(y[size_t(e)] == 0.75f * float(code(e) - 1));
    }
    block[0] = 3;  // the code the quantizer never writes decodes as +2 (ggml's (q - 1) * d)
    CHECK(decode(GgmlType::TQ2_0, block, 256)[0] == 1.5f);
}

TEST_CASE("TQ1_0: five trits per byte as a base-3 fraction, in ggml's element order") {
    // Trits (2, 0, 1, 2, 1) are 2*81 + 9 + 2*3 + 1 = 178, stored as ceil(178 * 256 / 243) =
    // 188; qh's four trits (1, 2, 0, 1) are (27 + 2*9 + 1) * 3 = 138 -> ceil(138 * 256 / 243)
    // = 146. Every other byte is 0: five trits of 0, the value -d.
    std::vector<uint8_t> block(54, 0);
    block[0] = 188;   // elements 0, 32, 64, 96, 128
    block[32] = 188;  // elements 160, 176, 192, 208, 224
    block[49] = 146;  // qh[1]: elements 241, 245, 249, 253
    put_f16(&block[52], 0.5f);
    std::vector<float> want(256, -0.5f);
    const float five[5] = {0.5f, -0.5f, 0.0f, 0.5f, 0.0f}, four[4] = {0.0f, 0.5f, -0.5f, 0.0f};
    for (int n = 0; n < 5; ++n) want[size_t(32 * n)] = want[size_t(160 + 16 * n)] = five[n];
    for (int n = 0; n < 4; ++n) want[size_t(241 + 4 * n)] = four[n];
    const std::vector<float> y = decode(GgmlType::TQ1_0, block, 256);
    for (int e = 0; e < 256; ++e) {
        CAPTURE(e);
        CHECK(y[size_t(e)] == want[size_t(e)]);
    }
    // The quantizer writes those bytes for those values.
    std::vector<uint8_t> q(54);
    quantize_row(GgmlType::TQ1_0, want.data(), q.data(), 256);
    CHECK(q == block);
}

TEST_CASE("TQ1_0 / TQ2_0: ternary weights times a scale round-trip exactly") {
    const int64_t n = 256 * 6;
    std::mt19937 rng(5);
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
        const float scale = i < 256 ? 0.375f : i < 512 ? 1.0f / 64 : 3.0f;  // exact in f16
        x[size_t(i)] = scale * float(int(rng() % 3) - 1);
    }
    for (int64_t i = 768; i < 1024; ++i) x[size_t(i)] = 0.0f;  // an all-zero block
    const std::vector<float> w = random_weights(size_t(n), 9);
    for (GgmlType t : {GgmlType::TQ1_0, GgmlType::TQ2_0}) {
        CAPTURE(std::string(ggml_type_name(t)));
        check_round_trip(t, x, nullptr);
        check_round_trip(t, x, w.data());
    }
}

TEST_CASE("Q1_0: bit j of the 128-element block is the sign of element j, d its magnitude") {
    std::vector<uint8_t> block(18);
    put_f16(block.data(), 0.25f);
    for (int j = 0; j < 16; ++j) block[size_t(2 + j)] = uint8_t(j * 37 + 11);
    const std::vector<float> y = decode(GgmlType::Q1_0, block, 128);
    for (int e = 0; e < 128; ++e) {
        CAPTURE(e);
        CHECK(y[size_t(e)] == ((block[size_t(2 + e / 8)] >> (e % 8)) & 1 ? 0.25f : -0.25f));
    }
    // Sign weights round-trip; d is the mean magnitude (the least-squares scale), weighted by
    // the importance when there is one.
    std::mt19937 rng(3);
    std::vector<float> x(128 * 4);
    for (size_t i = 0; i < x.size(); ++i)
        x[i] = (rng() & 1 ? 1.0f : -1.0f) * (i < 256 ? 0.5f : 2.0f);
    check_round_trip(GgmlType::Q1_0, x, nullptr);
    const std::vector<float> w = random_weights(x.size(), 4);
    check_round_trip(GgmlType::Q1_0, x, w.data());
    std::vector<float> mixed(128, 1.0f), iw(128, 1.0f);
    mixed[0] = -3.0f;  // |x| mean (127 + 3) / 128; with weight 0 on element 0, exactly 1
    iw[0] = 0.0f;
    std::vector<uint8_t> q(18);
    quantize_row(GgmlType::Q1_0, mixed.data(), q.data(), 128);
    CHECK(decode(GgmlType::Q1_0, q, 128)[1] == fp16_to_fp32(fp32_to_fp16(130.0f / 128)));
    quantize_row_weighted(GgmlType::Q1_0, mixed.data(), iw.data(), q.data(), 128);
    CHECK(decode(GgmlType::Q1_0, q, 128)[1] == 1.0f);
    CHECK(decode(GgmlType::Q1_0, q, 128)[0] == -1.0f);
}

TEST_CASE("NVFP4: four UE4M3-scaled sub-blocks of 16 E2M1 codes") {
    // Scale bytes: 0x38 is (1 + 0/8) 2^(7-7) = 1, 0x41 is (1 + 1/8) 2^1 = 2.25, 0x01 the
    // subnormal 2^-9; 0xb8 is 0x38 with bit 7 set (ignored). E2M1 codes 0..7 are 0, 0.5, 1,
    // 1.5, 2, 3, 4, 6, bit 3 the sign; element j < 8 of a sub-block is byte j's low nibble.
    std::vector<uint8_t> block(36);
    const uint8_t scales[4] = {0x38, 0x41, 0x01, 0xb8};
    const float scale_value[4] = {1.0f, 2.25f, 0x1p-9f, 1.0f};
    std::memcpy(block.data(), scales, 4);
    for (int s = 0; s < 4; ++s)
        for (int j = 0; j < 8; ++j) block[size_t(4 + 8 * s + j)] = uint8_t(j | (15 - j) << 4);
    const float e2m1[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    auto value = [&](int code) { return (code & 8 ? -1.0f : 1.0f) * e2m1[code & 7]; };
    std::vector<float> y = decode(GgmlType::NVFP4, block, 64);
    for (int s = 0; s < 4; ++s)
        for (int j = 0; j < 8; ++j) {
            CAPTURE(s);
            CAPTURE(j);
            CHECK(y[size_t(16 * s + j)] == scale_value[s] * value(j));
            CHECK(y[size_t(16 * s + j + 8)] == scale_value[s] * value(15 - j));
        }
    // 0x7f (E4M3's nan) scales to 0, as in ggml; 0x7e is the largest scale, 448.
    block[0] = 0x7f;
    block[1] = 0x7e;
    y = decode(GgmlType::NVFP4, block, 64);
    CHECK(y[7] == 0.0f);
    CHECK(y[16 + 7] == 448.0f * 6.0f);

    // FP4 values at a power-of-two scale per sub-block round-trip, with or without weights.
    std::mt19937 rng(8);
    std::vector<float> x(64 * 8);
    for (size_t i = 0; i < x.size(); ++i) {
        const float scale = std::ldexp(1.0f, int(i / 16 % 7) - 4);
        x[i] = scale * value(int(rng() % 16));
    }
    for (size_t i = 0; i < x.size(); i += 16) x[i + 3] = std::ldexp(6.0f, int(i / 16 % 7) - 4);
    check_round_trip(GgmlType::NVFP4, x, nullptr);
    const std::vector<float> w = random_weights(x.size(), 2);
    check_round_trip(GgmlType::NVFP4, x, w.data());
}

TEST_CASE("the new types' weighted fits lower the weighted error") {
    std::mt19937 rng(17);
    std::normal_distribution<float> g;
    const int64_t n = 256 * 32;
    std::vector<float> x(static_cast<size_t>(n)), w = random_weights(size_t(n), 21);
    for (float& v : x) v = g(rng);
    for (GgmlType t : {GgmlType::TQ1_0, GgmlType::TQ2_0, GgmlType::Q1_0, GgmlType::NVFP4}) {
        CAPTURE(std::string(ggml_type_name(t)));
        std::vector<uint8_t> q(ggml_row_bytes(t, n));
        double err[2];
        for (int weighted = 0; weighted < 2; ++weighted) {
            if (weighted)
                quantize_row_weighted(t, x.data(), w.data(), q.data(), n);
            else
                quantize_row(t, x.data(), q.data(), n);
            const std::vector<float> y = decode(t, q, n);
            err[weighted] = 0;
            for (int64_t i = 0; i < n; ++i) {
                const double e = double(y[size_t(i)]) - x[size_t(i)];
                err[weighted] += w[size_t(i)] * e * e;
            }
        }
        MESSAGE(fmt::format("{}: weighted error {:.1f} unweighted fit, {:.1f} weighted fit",
                            ggml_type_name(t), err[0], err[1]));
        CHECK(err[1] < err[0]);
    }
}
