// Tests of the CPU reference ops (cpu_ops.h) against naive implementations and hand-computed
// values, and of the thread pool they run on.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common.h"
#include "cpu_ops.h"
#include "quant.h"
#include "thread_pool.h"

using namespace kvrun;

namespace {

std::vector<float> random_vec(size_t n, uint32_t seed, float scale = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}

float round_f16(float x) {
    return fp16_to_fp32(fp32_to_fp16(x));
}

// Weight matrix [n_out][n_in] stored as `type`, plus its dequantized float copy.
struct TestMatrix {
    std::vector<uint8_t> bytes;
    std::vector<float> dequant;  // [n_out][n_in]
    WeightView view;
};

TestMatrix make_matrix(GgmlType type, int64_t n_out, int64_t n_in, uint32_t seed) {
    TestMatrix m;
    std::vector<float> src = random_vec(n_out * n_in, seed);
    size_t row_bytes = ggml_row_bytes(type, n_in);
    m.bytes.resize(row_bytes * n_out);
    m.dequant.resize(n_out * n_in);
    for (int64_t o = 0; o < n_out; ++o) {
        quantize_row(type, src.data() + o * n_in, m.bytes.data() + o * row_bytes, n_in);
        dequantize_row(type, m.bytes.data() + o * row_bytes, m.dequant.data() + o * n_in, n_in);
    }
    m.view = WeightView{type, n_in, n_out, row_bytes, m.bytes.data()};
    return m;
}

}  // namespace

TEST_CASE("rmsnorm matches hand-computed values") {
    std::vector<float> x = {1, 2, 3, 4, -2, 0, 0, 0}, w = {1, 1, 2, 0.5f}, out(8);
    cpu::rmsnorm(out.data(), x.data(), w.data(), 2, 4, 1e-5f);
    float s0 = 1.0f / std::sqrt(7.5f + 1e-5f), s1 = 1.0f / std::sqrt(1.0f + 1e-5f);
    CHECK(out[0] == doctest::Approx(1 * s0).epsilon(1e-6));
    CHECK(out[2] == doctest::Approx(6 * s0).epsilon(1e-6));
    CHECK(out[3] == doctest::Approx(2 * s0).epsilon(1e-6));
    CHECK(out[4] == doctest::Approx(-2 * s1).epsilon(1e-6));
    CHECK(out[5] == 0.0f);
    // In place works too.
    cpu::rmsnorm(x.data(), x.data(), w.data(), 2, 4, 1e-5f);
    CHECK(x == out);
}

TEST_CASE("matmul equals a naive product for float and quantized weights") {
    for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_K}) {
        CAPTURE(ggml_type_name(type));
        const int64_t n_out = 300, n_in = 256, n_rows = 5;  // big enough to use the threads
        TestMatrix m = make_matrix(type, n_out, n_in, 7);
        std::vector<float> x = random_vec(n_rows * n_in, 8), out(n_rows * n_out);
        cpu::matmul(out.data(), x.data(), m.view, n_rows);
        double max_err = 0;
        for (int64_t r = 0; r < n_rows; ++r)
            for (int64_t o = 0; o < n_out; ++o) {
                double ref = 0;
                for (int64_t i = 0; i < n_in; ++i)
                    ref += double(m.dequant[o * n_in + i]) * x[r * n_in + i];
                max_err = std::max(max_err, std::abs(ref - out[r * n_out + o]));
            }
        CHECK(max_err < 1e-4);
        // Batch invariance: each row alone gives bit-identical results.
        std::vector<float> one(n_out);
        cpu::matmul(one.data(), x.data() + 3 * n_in, m.view, 1);
        CHECK(std::equal(one.begin(), one.end(), out.begin() + 3 * n_out));
    }
}

// The reference order of matmul: the row dequantized, each product rounded to float and
// added into lane i % 8, the lanes combined ((0+4)+(1+5))+((2+6)+(3+7)).
float reference_dot(const float* w, const float* x, int64_t n) {
    float acc[8] = {};
    for (int64_t i = 0; i < n; ++i) acc[i % 8] += w[i] * x[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

TEST_CASE("matmul gives the reference order's bits for every type, shape and batch") {
    // Row counts around the 4-row groups, token counts around the 16-token tiles, rows of
    // one span, of several spans with a short last one, and (float types) not a multiple
    // of 8. The decoders written for some types must equal dequantize_row exactly.
    const GgmlType types[] = {GgmlType::F32,   GgmlType::F16,    GgmlType::BF16,   GgmlType::Q4_0,
                              GgmlType::Q4_1,  GgmlType::Q5_0,   GgmlType::Q5_1,   GgmlType::Q8_0,
                              GgmlType::Q2_K,  GgmlType::Q3_K,   GgmlType::Q4_K,   GgmlType::Q5_K,
                              GgmlType::Q6_K,  GgmlType::IQ4_NL, GgmlType::IQ4_XS, GgmlType::MXFP4,
                              GgmlType::NVFP4, GgmlType::TQ1_0,  GgmlType::TQ2_0,  GgmlType::Q1_0};
    for (GgmlType type : types) {
        const int64_t block = ggml_type_traits(type).block_elems;
        std::vector<int64_t> widths = {256, 2304};
        if (block == 32) widths.push_back(544);
        if (block == 64 || block == 128) widths.push_back(block * (512 / block + 1));
        if (block == 1) widths.insert(widths.end(), {70, 13});
        for (int64_t n_in : widths)
            for (int64_t n_out : {1, 7, 13})
                for (int64_t n_rows : {1, 3, 17, 33}) {
                    const std::string type_name = ggml_type_name(type);
                    CAPTURE(type_name);
                    CAPTURE(n_in);
                    CAPTURE(n_out);
                    CAPTURE(n_rows);
                    TestMatrix m = make_matrix(type, n_out, n_in, uint32_t(n_in + n_out));
                    std::vector<float> x = random_vec(n_rows * n_in, 11), out(n_rows * n_out);
                    cpu::matmul(out.data(), x.data(), m.view, n_rows);
                    int64_t mismatches = 0;
                    for (int64_t r = 0; r < n_rows; ++r)
                        for (int64_t o = 0; o < n_out; ++o) {
                            const float ref = reference_dot(m.dequant.data() + o * n_in,
                                                            x.data() + r * n_in, n_in);
                            mismatches += std::memcmp(&ref, &out[r * n_out + o], 4) != 0;
                        }
                    CHECK(mismatches == 0);
                }
    }
}

TEST_CASE("matmul decodes every finite f16 weight exactly") {
    // 7936 rows of 8 halves cover the 63488 finite f16 values (subnormals included); x is
    // the identity, so out[t][o] is weight (o, t) times 1 plus zeros.
    const int64_t n_in = 8, n_out = 63488 / 8;
    std::vector<uint16_t> halves;
    for (uint32_t h = 0; h < 0x10000; ++h)
        if ((h & 0x7c00) != 0x7c00) halves.push_back(uint16_t(h));
    REQUIRE(int64_t(halves.size()) == n_in * n_out);
    WeightView w{GgmlType::F16, n_in, n_out, 2 * n_in, halves.data()};
    std::vector<float> eye(n_in * n_in, 0.0f), out(n_in * n_out);
    for (int64_t i = 0; i < n_in; ++i) eye[i * n_in + i] = 1.0f;
    cpu::matmul(out.data(), eye.data(), w, n_in);
    int64_t wrong = 0;
    for (int64_t o = 0; o < n_out; ++o)
        for (int64_t t = 0; t < n_in; ++t)
            wrong += out[t * n_out + o] != fp16_to_fp32(halves[o * n_in + t]);
    CHECK(wrong == 0);
}

TEST_CASE("add_bias, add, swiglu and softmax") {
    std::vector<float> x = {1, 2, 3, 4, 5, 6}, b = {10, 20, 30};
    cpu::add_bias(x.data(), b.data(), 2, 3);
    CHECK(x == std::vector<float>{11, 22, 33, 14, 25, 36});
    std::vector<float> y = {1, 1, 1, 1, 1, 1};
    cpu::add(x.data(), y.data(), 6);
    CHECK(x[5] == 37);

    std::vector<float> g = {0, 1, -2}, u = {5, 2, 3}, out(3);
    cpu::swiglu(out.data(), g.data(), u.data(), 3);
    CHECK(out[0] == 0.0f);
    CHECK(out[1] == doctest::Approx(2.0 / (1 + std::exp(-1.0))).epsilon(1e-6));
    CHECK(out[2] == doctest::Approx(-2.0 / (1 + std::exp(2.0)) * 3).epsilon(1e-6));

    std::vector<float> s = {1000, 1000 + std::log(3.0f), -1e30f};
    cpu::softmax(s.data(), 3);
    CHECK(s[0] == doctest::Approx(0.25).epsilon(1e-5));
    CHECK(s[1] == doctest::Approx(0.75).epsilon(1e-5));
    CHECK(s[2] == 0.0f);
}

TEST_CASE("gpt-oss's clamped SwiGLU and the softmax with a sink") {
    // x = min(gate, 7), y = clamp(up, -7, 7), out = x * sigmoid(1.702 x) * (y + 1).
    const std::vector<float> g = {0.5f, 9.0f, -3.0f, 2.0f}, u = {1.0f, -20.0f, 8.0f, -1.0f};
    std::vector<float> out(4);
    cpu::swiglu_oai(out.data(), g.data(), u.data(), 4, 1.702f, 7.0f);
    auto want = [](double x, double y) { return x / (1 + std::exp(-1.702 * x)) * (y + 1); };
    CHECK(out[0] == doctest::Approx(want(0.5, 1.0)).epsilon(1e-6));
    CHECK(out[1] == doctest::Approx(want(7.0, -7.0)).epsilon(1e-6));  // both clamped
    CHECK(out[2] == doctest::Approx(want(-3.0, 7.0)).epsilon(1e-6));  // gate not clamped below
    CHECK(out[3] == 0.0f);                                            // up = -1 zeroes it
    // The sink takes its share and is dropped: logits ln 1, ln 2 and a sink of ln 5.
    std::vector<float> s = {0.0f, std::log(2.0f)};
    cpu::softmax_with_sink(s.data(), 2, std::log(5.0f));
    CHECK(s[0] == doctest::Approx(0.125).epsilon(1e-6));
    CHECK(s[1] == doctest::Approx(0.25).epsilon(1e-6));
    // A sink far below the scores changes nothing; far above, it takes nearly everything.
    std::vector<float> a = {1.0f, 2.0f}, b = a;
    cpu::softmax_with_sink(a.data(), 2, -1e30f);
    cpu::softmax(b.data(), 2);
    CHECK(a == b);
    std::vector<float> c = {1.0f, 2.0f};
    cpu::softmax_with_sink(c.data(), 2, 100.0f);
    CHECK(c[1] < 1e-40);
}

TEST_CASE("rope rotates the right pairs by the right angles") {
    // One head of 6 dims, 4 rotated; base 100 -> frequencies 1 and 1/10.
    const int32_t pos[2] = {0, 3};
    std::vector<float> base = {1, 2, 3, 4, 5, 6};
    for (bool neox : {false, true}) {
        CAPTURE(neox);
        std::vector<float> x = base;
        x.insert(x.end(), base.begin(), base.end());
        cpu::rope(x.data(), pos, 2, 1, 6, RopeParams::plain(4, 100.0f, 0.5f, neox));
        // Position 0: unchanged.
        for (int i = 0; i < 6; ++i) CHECK(x[i] == base[i]);
        // Position 3 with freq_scale 0.5: angles 1.5 (pair 0) and 0.15 (pair 1).
        const float* v = x.data() + 6;
        int a0 = 0, b0 = neox ? 2 : 1, a1 = neox ? 1 : 2, b1 = 3;
        auto rot = [&](int a, int b, double th) {
            CHECK(v[a] ==
                  doctest::Approx(base[a] * std::cos(th) - base[b] * std::sin(th)).epsilon(1e-5));
            CHECK(v[b] ==
                  doctest::Approx(base[a] * std::sin(th) + base[b] * std::cos(th)).epsilon(1e-5));
        };
        rot(a0, b0, 1.5);
        rot(a1, b1, 0.15);
        CHECK(v[4] == 5);  // dims past n_rot untouched
        CHECK(v[5] == 6);
    }
    std::vector<float> x(8);
    CHECK_THROWS_AS(cpu::rope(x.data(), pos, 1, 1, 8, RopeParams::plain(3, 1e4f, 1, false)), Error);
}

TEST_CASE("embed dequantizes rows and rejects bad token ids") {
    TestMatrix m = make_matrix(GgmlType::Q8_0, 10, 64, 3);
    const int32_t toks[2] = {7, 2};
    std::vector<float> out(128);
    cpu::embed(out.data(), m.view, toks, 2);
    CHECK(std::equal(out.begin(), out.begin() + 64, m.dequant.begin() + 7 * 64));
    CHECK(std::equal(out.begin() + 64, out.end(), m.dequant.begin() + 2 * 64));
    const int32_t bad[1] = {10};
    CHECK_THROWS_AS(cpu::embed(out.data(), m.view, bad, 1), Error);
}

namespace {

// A paged cache for the attention tests: [n_blocks][n_kv_head][block_size][head_dim].
struct TestCache {
    std::vector<uint8_t> k, v;
    KvLayerView view;
    TestCache(KvType type, int64_t n_blocks, int64_t n_kv_head, int64_t block_size,
              int64_t head_dim) {
        size_t bytes =
            size_t(n_blocks * n_kv_head * block_size * head_dim) * (type == KvType::F32 ? 4 : 2);
        k.assign(bytes, 0xff);  // garbage (NaN for f16 / f32) where nothing was written
        v.assign(bytes, 0xff);
        view =
            KvLayerView{type, type, k.data(), v.data(), n_blocks, n_kv_head, block_size, head_dim};
    }
};

}  // namespace

TEST_CASE("kv_write stores rows at the slot's block and row, f32 exactly, f16 rounded") {
    const int64_t n_kv = 2, hd = 8, bs = 4;
    for (KvType type : {KvType::F32, KvType::F16}) {
        TestCache cache(type, 6, n_kv, bs, hd);
        // One sequence over blocks {4, 1, 3}; tokens at slots 0, 5, 11.
        const int32_t table[3] = {4, 1, 3}, seq[3] = {0, 0, 0}, slot[3] = {0, 5, 11};
        KvBatchView b{seq, slot, table, 3, 3};
        std::vector<float> k = random_vec(3 * n_kv * hd, 1), v = random_vec(3 * n_kv * hd, 2);
        cpu::kv_write(cache.view, b, k.data(), v.data());
        const int64_t block_of[3] = {4, 1, 3}, row_of[3] = {0, 1, 3};
        for (int t = 0; t < 3; ++t)
            for (int h = 0; h < n_kv; ++h)
                for (int i = 0; i < hd; ++i) {
                    int64_t idx = ((block_of[t] * n_kv + h) * bs + row_of[t]) * hd + i;
                    float want_k = k[(t * n_kv + h) * hd + i], want_v = v[(t * n_kv + h) * hd + i];
                    float got_k, got_v;
                    if (type == KvType::F32) {
                        got_k = reinterpret_cast<const float*>(cache.k.data())[idx];
                        got_v = reinterpret_cast<const float*>(cache.v.data())[idx];
                    } else {
                        got_k =
                            fp16_to_fp32(reinterpret_cast<const uint16_t*>(cache.k.data())[idx]);
                        got_v =
                            fp16_to_fp32(reinterpret_cast<const uint16_t*>(cache.v.data())[idx]);
                        want_k = round_f16(want_k);
                        want_v = round_f16(want_v);
                    }
                    CHECK(got_k == want_k);
                    CHECK(got_v == want_v);
                }
        // A slot past the table or a block id outside the pool is an error, not a crash.
        const int32_t far[1] = {12}, zero[1] = {0};
        CHECK_THROWS_AS(
            cpu::kv_write(cache.view, KvBatchView{zero, far, table, 3, 1}, k.data(), v.data()),
            Error);
        const int32_t bad_table[3] = {4, 9, 3}, s5[1] = {5};
        CHECK_THROWS_AS(
            cpu::kv_write(cache.view, KvBatchView{zero, s5, bad_table, 3, 1}, k.data(), v.data()),
            Error);
    }
}

// head_dim 16 and 40 take the vector kernels (40: with a tail of 8), 20 the scalar ones.
TEST_CASE("paged attention equals contiguous causal attention (GQA, any block size)") {
    for (const int64_t hd : {16, 40, 20}) {
        CAPTURE(hd);
        const int64_t n_head = 8, n_kv = 2, group = n_head / n_kv;
        const int64_t lens[2] = {37, 12};  // two sequences
        const int64_t n_tok = lens[0] + lens[1];
        // Tokens of both sequences interleaved, each at slot = its index within its sequence.
        std::vector<int32_t> seq, slot;
        for (int64_t i = 0; i < std::max(lens[0], lens[1]); ++i)
            for (int s = 0; s < 2; ++s)
                if (i < lens[s]) {
                    seq.push_back(s);
                    slot.push_back(int32_t(i));
                }
        std::vector<float> q = random_vec(n_tok * n_head * hd, 11, 0.5f);
        std::vector<float> k = random_vec(n_tok * n_kv * hd, 12, 0.5f);
        std::vector<float> v = random_vec(n_tok * n_kv * hd, 13);
        const float scale = 1.0f / 4.0f;

        for (KvType type : {KvType::F32, KvType::F16}) {
            // Contiguous reference (double) on the values the cache can hold.
            auto stored = [&](float x) { return type == KvType::F16 ? round_f16(x) : x; };
            std::vector<double> ref(n_tok * n_head * hd, 0.0);
            for (int64_t t = 0; t < n_tok; ++t)
                for (int64_t h = 0; h < n_head; ++h) {
                    std::vector<int64_t> keys;  // batch indices of the same sequence, slot <= own
                    for (int64_t u = 0; u < n_tok; ++u)
                        if (seq[u] == seq[t] && slot[u] <= slot[t]) keys.push_back(u);
                    std::vector<double> p(keys.size());
                    double mx = -1e300, sum = 0;
                    for (size_t j = 0; j < keys.size(); ++j) {
                        double d = 0;
                        for (int64_t i = 0; i < hd; ++i)
                            d += double(q[(t * n_head + h) * hd + i]) *
                                 stored(k[(keys[j] * n_kv + h / group) * hd + i]);
                        p[j] = d * scale;
                        mx = std::max(mx, p[j]);
                    }
                    for (auto& x : p) sum += (x = std::exp(x - mx));
                    for (size_t j = 0; j < keys.size(); ++j)
                        for (int64_t i = 0; i < hd; ++i)
                            ref[(t * n_head + h) * hd + i] +=
                                p[j] / sum * stored(v[(keys[j] * n_kv + h / group) * hd + i]);
                }

            // The reference order in float: each score a dot in 8 lanes (reference_dot) times
            // scale, cpu::softmax, then p * V added row by row in slot order. The cache's
            // layout and the heads sharing a KV row must not change a bit of it.
            std::vector<float> ref_bits(n_tok * n_head * hd, 0.0f);
            for (int64_t t = 0; t < n_tok; ++t)
                for (int64_t h = 0; h < n_head; ++h) {
                    std::vector<int64_t> keys(slot[t] + 1);  // batch index of each slot
                    for (int64_t u = 0; u < n_tok; ++u)
                        if (seq[u] == seq[t] && slot[u] <= slot[t]) keys[slot[u]] = u;
                    std::vector<float> p(keys.size()), row(hd);
                    const float* qv = &q[(t * n_head + h) * hd];
                    for (size_t j = 0; j < keys.size(); ++j) {
                        for (int64_t i = 0; i < hd; ++i)
                            row[i] = stored(k[(keys[j] * n_kv + h / group) * hd + i]);
                        p[j] = reference_dot(qv, row.data(), hd) * scale;
                    }
                    cpu::softmax(p.data(), int64_t(p.size()));
                    float* o = &ref_bits[(t * n_head + h) * hd];
                    for (size_t j = 0; j < keys.size(); ++j)
                        for (int64_t i = 0; i < hd; ++i)
                            o[i] += p[j] * stored(v[(keys[j] * n_kv + h / group) * hd + i]);
                }

            std::vector<float> first;
            for (int64_t bs : {1, 3, 16, 64}) {
                CAPTURE(bs);
                CAPTURE(int(type));
                const int64_t max_blocks = (lens[0] + bs - 1) / bs;
                const int64_t n_blocks = 2 * max_blocks + 3;
                // Shuffled physical block ids, disjoint between the sequences.
                std::vector<int32_t> ids(n_blocks);
                std::iota(ids.begin(), ids.end(), 0);
                std::shuffle(ids.begin(), ids.end(), std::mt19937(uint32_t(bs)));
                std::vector<int32_t> table(2 * max_blocks);
                std::copy(ids.begin(), ids.begin() + table.size(), table.begin());
                TestCache cache(type, n_blocks, n_kv, bs, hd);
                KvBatchView b{seq.data(), slot.data(), table.data(), max_blocks, n_tok};
                cpu::kv_write(cache.view, b, k.data(), v.data());
                std::vector<float> out(n_tok * n_head * hd);
                cpu::paged_attention(out.data(), q.data(), cache.view, b, n_head, scale);
                double max_err = 0;
                for (size_t i = 0; i < out.size(); ++i)
                    max_err = std::max(max_err, std::abs(out[i] - ref[i]));
                CHECK(max_err < 1e-5);
                CHECK(out == ref_bits);
                // One token alone (decode: its query heads split across threads) gives its bits.
                const int64_t last = n_tok - 1;  // sequence 0's slot 36
                std::vector<float> one(n_head * hd);
                KvBatchView b1{&seq[last], &slot[last], table.data(), max_blocks, 1};
                cpu::paged_attention(one.data(), &q[last * n_head * hd], cache.view, b1, n_head,
                                     scale);
                CHECK(std::equal(one.begin(), one.end(), out.begin() + last * n_head * hd));
                // The block size changes nothing, not even rounding.
                if (first.empty()) first = out;
                CHECK(out == first);
            }
        }
    }
}

TEST_CASE("windowed paged attention never reads the blocks before the window (or chunk)") {
    // Gemma's sliding window: the blocks wholly before every token's window are skipped, not
    // just masked, so a paged cache may drop them. Pointing them at a NaN block, or at no
    // block (-1), changes no bit; without the window -1 is refused.
    const int64_t n_head = 4, n_kv = 2, hd = 16, bs = 4, window = 5, n = 20;
    TestCache cache(KvType::F16, 8, n_kv, bs, hd);  // block 7 is never written: NaN
    const std::vector<int32_t> table = {2, 0, 5, 1, 6};
    std::vector<int32_t> seq(n, 0), slot(n);
    std::iota(slot.begin(), slot.end(), 0);
    const std::vector<float> k = random_vec(n * n_kv * hd, 31), v = random_vec(n * n_kv * hd, 32);
    const std::vector<float> q = random_vec(n * n_head * hd, 33);
    KvBatchView all{seq.data(), slot.data(), table.data(), 5, n};
    cpu::kv_write(cache.view, all, k.data(), v.data());
    for (float softcap : {0.0f, 2.0f}) {
        CAPTURE(softcap);
        // The last three tokens (a verification batch) see slots 13 .. 19: blocks 3 and 4.
        auto attend = [&](const std::vector<int32_t>& tab, int64_t win) {
            std::vector<float> out(3 * n_head * hd);
            KvBatchView b{&seq[17], &slot[17], tab.data(), 5, 3};
            cpu::paged_attention(out.data(), &q[17 * n_head * hd], cache.view, b, n_head, 0.25f,
                                 softcap, win);
            return out;
        };
        const std::vector<float> want = attend(table, window);
        CHECK(std::all_of(want.begin(), want.end(), [](float x) { return std::isfinite(x); }));
        CHECK(want != attend(table, 0));  // the window matters here
        for (int32_t gone : {7, -1}) {
            CAPTURE(gone);
            std::vector<int32_t> dropped = table;
            dropped[0] = dropped[1] = dropped[2] = gone;
            CHECK(attend(dropped, window) == want);
            if (gone < 0) CHECK_THROWS_AS(attend(dropped, 0), Error);
        }
        // Llama 4's chunks (window -8): slots 17 .. 19 see their chunk's, 16 .. 19, in block 4
        // alone, so the four blocks before it may go; a chunk is not a window of its length.
        const std::vector<float> chunk = attend(table, -8);
        CHECK(chunk != attend(table, 8));
        std::vector<int32_t> dropped = table;
        dropped[0] = dropped[1] = dropped[2] = dropped[3] = -1;
        CHECK(attend(dropped, -8) == chunk);
    }
}

TEST_CASE("paged attention rejects inconsistent shapes and block ids") {
    TestCache cache(KvType::F16, 2, 2, 4, 8);
    const int32_t seq[1] = {0}, slot[1] = {5}, table[2] = {0, 7};
    std::vector<float> q(3 * 8), out(3 * 8);
    KvBatchView b{seq, slot, table, 2, 1};
    CHECK_THROWS_AS(cpu::paged_attention(out.data(), q.data(), cache.view, b, 3, 1.0f), Error);
    CHECK_THROWS_AS(cpu::paged_attention(out.data(), q.data(), cache.view, b, 2, 1.0f), Error);
}

TEST_CASE("thread pool covers every index once, nests inline and rethrows") {
    ThreadPool pool(4);
    std::vector<std::atomic<int>> hits(10007);
    pool.parallel_for(10007, 10, [&](int64_t a, int64_t b) {
        for (int64_t i = a; i < b; ++i) hits[i]++;
        pool.parallel_for(5, 1, [](int64_t, int64_t) {});  // nested call runs inline
    });
    CHECK(std::all_of(hits.begin(), hits.end(), [](auto& h) { return h.load() == 1; }));
    CHECK_THROWS_AS(pool.parallel_for(1000, 1,
                                      [](int64_t a, int64_t) {
                                          if (a == 0) fail("boom");
                                      }),
                    Error);
    // Still usable afterwards.
    std::atomic<int64_t> sum{0};
    pool.parallel_for(100, 1, [&](int64_t a, int64_t b) {
        for (int64_t i = a; i < b; ++i) sum += i;
    });
    CHECK(sum == 4950);
    // set_active limits the threads a job uses (-t for decode, -tb for prefill).
    auto threads_used = [&] {
        std::mutex mu;
        std::set<std::thread::id> ids;
        std::vector<std::atomic<int>> seen(4000);
        pool.parallel_for(4000, 1, [&](int64_t a, int64_t b) {
            for (int64_t i = a; i < b; ++i) seen[size_t(i)]++;
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
            std::lock_guard<std::mutex> lock(mu);
            ids.insert(std::this_thread::get_id());
        });
        CHECK(std::all_of(seen.begin(), seen.end(), [](auto& h) { return h.load() == 1; }));
        return ids.size();
    };
    pool.set_active(1);
    CHECK(pool.n_active() == 1);
    CHECK(threads_used() == 1);
    pool.set_active(2);
    CHECK(threads_used() <= 2);
    pool.set_active(99);  // clamped
    CHECK(pool.n_active() == 4);
    CHECK(threads_used() >= 2);
}
