// Quantized KV cache (q8/q4): codec error bounds per format, Hadamard rotation, memory
// accounting, attention over a staged quantized cache vs float attention on random data, and
// on a real model: batch invariance, rollback exactness, block-size effect and perplexity.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend.h"
#include "cpu_ops.h"
#include "kv_block_table.h"
#include "kv_format.h"
#include "perplexity.h"
#include "quant.h"
#include "test_util.h"

using namespace kvrun;

namespace {

// Normalized mean squared error of b against a.
double nmse(const std::vector<float>& a, const std::vector<float>& b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        num += double(a[i] - b[i]) * double(a[i] - b[i]);
        den += double(a[i]) * double(a[i]);
    }
    return den > 0 ? num / den : num;
}

// [rows][dim] Gaussian values; channel `outlier` (if >= 0) scaled by 20 and shifted by 5,
// like the outlier channels of real keys.
std::vector<float> random_rows(int64_t rows, int64_t dim, uint32_t seed, int64_t outlier = -1) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(size_t(rows * dim));
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < dim; ++c) {
            float v = nd(rng);
            if (c == outlier) v = 20.0f * v + 5.0f;
            x[size_t(r * dim + c)] = v;
        }
    return x;
}

std::vector<float> decode_block(KvType t, KvRole role, const std::vector<uint8_t>& blk, int64_t bs,
                                int64_t hd) {
    std::vector<float> out(size_t(bs * hd));
    for (int64_t r = 0; r < bs; ++r)
        kv_decode_head_row(t, role, blk.data(), bs, hd, r, out.data() + r * hd);
    return out;
}

std::vector<float> round_trip(KvType t, KvRole role, const std::vector<float>& x, int64_t bs,
                              int64_t hd) {
    std::vector<uint8_t> blk(size_t(kv_head_block_bytes(t, role, bs, hd)), 0xAB);
    kv_encode_head_block(t, role, x.data(), bs, hd, blk.data());
    return decode_block(t, role, blk, bs, hd);
}

}  // namespace

TEST_CASE("kv codec: f32 is exact, f16 rounds each value") {
    const int64_t bs = 7, hd = 8;
    auto x = random_rows(bs, hd, 1);
    CHECK(round_trip(KvType::F32, KvRole::K, x, bs, hd) == x);
    auto h = round_trip(KvType::F16, KvRole::V, x, bs, hd);
    for (size_t i = 0; i < x.size(); ++i) CHECK(h[i] == fp16_to_fp32(fp32_to_fp16(x[i])));
}

TEST_CASE("kv codec: q8/q4 error bounds, K per channel, V per token and group") {
    for (KvType t : {KvType::Q8, KvType::Q4})
        for (KvRole role : {KvRole::K, KvRole::V})
            for (int64_t bs : {1, 7, 16, 64})
                for (int64_t hd : {8, 64, 128}) {
                    CAPTURE(kv_type_name(t));
                    CAPTURE(int(role));
                    CAPTURE(bs);
                    CAPTURE(hd);
                    const int64_t bytes = kv_head_block_bytes(t, role, bs, hd);
                    CHECK(bytes % 16 == 0);
                    // Keys get an outlier channel; values have none (KIVI's observation).
                    auto x = random_rows(bs, hd, uint32_t(bs * 1000 + hd),
                                         role == KvRole::K ? hd / 2 : -1);
                    auto y = round_trip(t, role, x, bs, hd);
                    // Every value is within one step (q8: half a step) of its group's scale,
                    // where the step is the group's largest magnitude / 127 (q8) or / 8 (q4),
                    // plus the f16 rounding of the scale.
                    const int64_t g = kv_v_group(hd);
                    for (int64_t r = 0; r < bs; ++r)
                        for (int64_t c = 0; c < hd; ++c) {
                            float amax = 0;
                            if (role == KvRole::K)
                                for (int64_t i = 0; i < bs; ++i)
                                    amax = std::max(amax, std::fabs(x[size_t(i * hd + c)]));
                            else
                                for (int64_t i = c / g * g; i < c / g * g + g; ++i)
                                    amax = std::max(amax, std::fabs(x[size_t(r * hd + i)]));
                            const float step = t == KvType::Q8 ? amax / 127.0f : amax / 8.0f;
                            const float bound =
                                (t == KvType::Q8 ? 0.5f : 1.0f) * step * 1.01f + 1e-6f;
                            const float err =
                                std::fabs(x[size_t(r * hd + c)] - y[size_t(r * hd + c)]);
                            if (err > bound) CHECK(err <= bound);
                        }
                    // Relative error over the whole block (per-channel K keeps the normal
                    // channels accurate next to the outlier channel).
                    const double e = nmse(x, y);
                    if (bs > 1 || role == KvRole::V) CHECK(e < (t == KvType::Q8 ? 1e-4 : 2e-2));
                }
}

TEST_CASE("kv codec: decoding rows gives scale * code of the documented layout, bit for bit") {
    // The layout of kv_format.h, read byte by byte: K scales per channel in front, V scales
    // per row and group in front; q8 codes int8, q4 codes nibbles stored q + 8.
    for (KvType t : {KvType::Q8, KvType::Q4})
        for (KvRole role : {KvRole::K, KvRole::V})
            for (int64_t hd : {8, 64, 96, 128})
                for (int64_t bs : {1, 5, 16}) {
                    CAPTURE(std::string(kv_type_name(t)));
                    CAPTURE(int(role));
                    CAPTURE(hd);
                    CAPTURE(bs);
                    const KvHeadLayout l = kv_head_layout(t, role, bs, hd);
                    std::vector<uint8_t> blk(size_t(l.bytes));
                    const std::vector<float> x = random_rows(bs, hd, uint32_t(hd + bs), 3);
                    kv_encode_head_block(t, role, x.data(), bs, hd, blk.data());
                    const int64_t g = role == KvRole::K ? 1 : l.group, n_scales = hd / g;
                    auto half_at = [&](int64_t i) {
                        uint16_t h;
                        std::memcpy(&h, blk.data() + 2 * i, 2);
                        return fp16_to_fp32(h);
                    };
                    std::vector<float> want(size_t(bs * hd));
                    for (int64_t r = 0; r < bs; ++r)
                        for (int64_t c = 0; c < hd; ++c) {
                            const uint8_t* v = blk.data() + l.scale_bytes + r * l.row_bytes;
                            const int code = t == KvType::Q8
                                                 ? int(static_cast<int8_t>(v[c]))
                                                 : int(c % 2 ? v[c / 2] >> 4 : v[c / 2] & 15) - 8;
                            const float scale =
                                role == KvRole::K ? half_at(c) : half_at(r * n_scales + c / g);
                            want[r * hd + c] = scale * float(code);
                        }
                    // All rows at once, a middle run, and row by row.
                    std::vector<float> got(size_t(bs * hd));
                    kv_decode_head_rows(t, role, blk.data(), bs, hd, 0, bs, got.data());
                    CHECK(got == want);
                    if (bs > 2) {
                        std::vector<float> mid(size_t((bs - 2) * hd));
                        kv_decode_head_rows(t, role, blk.data(), bs, hd, 1, bs - 2, mid.data());
                        CHECK(std::equal(mid.begin(), mid.end(), want.begin() + hd));
                    }
                    for (int64_t r = 0; r < bs; ++r) {
                        std::vector<float> one(static_cast<size_t>(hd));
                        kv_decode_head_row(t, role, blk.data(), bs, hd, r, one.data());
                        CHECK(std::equal(one.begin(), one.end(), want.begin() + r * hd));
                    }
                }
}

TEST_CASE("kv codec: per-channel K isolates an outlier channel that per-token scaling smears") {
    // The same block quantized as K (per channel) and as V (per token, one group = the head):
    // the outlier channel ruins the per-token scale of every row, not the per-channel ones.
    const int64_t bs = 16, hd = 8;
    auto x = random_rows(bs, hd, 7, 3);
    auto as_k = round_trip(KvType::Q4, KvRole::K, x, bs, hd);
    auto as_v = round_trip(KvType::Q4, KvRole::V, x, bs, hd);
    std::vector<float> xn, kn, vn;  // the normal channels only
    for (int64_t r = 0; r < bs; ++r)
        for (int64_t c = 0; c < hd; ++c)
            if (c != 3) {
                xn.push_back(x[size_t(r * hd + c)]);
                kn.push_back(as_k[size_t(r * hd + c)]);
                vn.push_back(as_v[size_t(r * hd + c)]);
            }
    CHECK(nmse(xn, kn) < 0.02);
    CHECK(nmse(xn, vn) > 5 * nmse(xn, kn));
}

TEST_CASE("kv codec: zeros stay zeros; a constant block on the code grid is exact") {
    for (KvType t : {KvType::Q8, KvType::Q4})
        for (KvRole role : {KvRole::K, KvRole::V}) {
            std::vector<float> z(16 * 32, 0.0f);
            CHECK(round_trip(t, role, z, 16, 32) == z);
            // q8: -127/1024 = -127 x 2^-10; q4: -0.75 = -8 x 3/32 (scales exact in f16).
            std::vector<float> c(16 * 32, t == KvType::Q8 ? -127.0f / 1024 : -0.75f);
            CHECK(round_trip(t, role, c, 16, 32) == c);
        }
    CHECK_THROWS_AS(kv_head_block_bytes(KvType::Q4, KvRole::K, 16, 7), Error);
}

TEST_CASE("hadamard rotation is orthogonal, its own inverse, and keeps q.k") {
    for (int64_t n : {1, 8, 64, 128}) {
        auto x = random_rows(3, n, uint32_t(n));
        auto y = x;
        hadamard_rows(y.data(), 3, n);
        double dot_x = 0, dot_y = 0, norm_x = 0, norm_y = 0;
        for (int64_t i = 0; i < n; ++i) {
            dot_x += double(x[size_t(i)]) * x[size_t(n + i)];
            dot_y += double(y[size_t(i)]) * y[size_t(n + i)];
            norm_x += double(x[size_t(i)]) * x[size_t(i)];
            norm_y += double(y[size_t(i)]) * y[size_t(i)];
        }
        CHECK(dot_y == doctest::Approx(dot_x).epsilon(1e-5));
        CHECK(norm_y == doctest::Approx(norm_x).epsilon(1e-5));
        hadamard_rows(y.data(), 3, n);
        for (size_t i = 0; i < x.size(); ++i) CHECK(y[i] == doctest::Approx(x[i]).epsilon(1e-5));
    }
    std::vector<float> v(12);
    CHECK_THROWS_AS(hadamard_rows(v.data(), 1, 12), Error);
}

TEST_CASE("kv memory: tokens that fit scale with the type (q8 ~2x, q4 ~3.5x of f16)") {
    // A Llama-2-7B-shaped cache: 32 layers, 32 KV heads of 128 dims.
    ModelConfig c;
    c.n_layer = 32;
    c.n_kv_head = 32;
    c.n_head = 32;
    c.head_dim = 128;
    c.n_embd = 4096;
    auto tokens_in = [&](KvType k, KvType v, int32_t bs) {
        BackendOptions o;
        o.kv_block_size = bs;
        o.kv_type_k = k;
        o.kv_type_v = v;
        o.kv_memory_mib = 16 * 1024;
        return double(kv_blocks_for(c, o)) * bs;
    };
    const double f16 = tokens_in(KvType::F16, KvType::F16, 16);
    CHECK(f16 == doctest::Approx(16.0 * 1024 * 1024 * 1024 / (512 * 1024)).epsilon(0.001));
    auto ratio = [&](KvType t, int32_t bs) {
        return tokens_in(t, t, bs) / tokens_in(KvType::F16, KvType::F16, bs);
    };
    const double q8 = ratio(KvType::Q8, 16), q4 = ratio(KvType::Q4, 16);
    const double q8_64 = ratio(KvType::Q8, 64), q4_64 = ratio(KvType::Q4, 64);
    MESSAGE("tokens vs f16 at 16 GiB (f16 stage slots included), blocks of 16: q8 "
            << q8 << "x, q4 " << q4 << "x; blocks of 32: q4 " << ratio(KvType::Q4, 32)
            << "x; blocks of 64: q8 " << q8_64 << "x, q4 " << q4_64 << "x");
    // The price of per-channel K: one f16 scale per channel and block (1 bit per value for
    // q4 in blocks of 16), and ~2% of the budget for the stage slots (docs/kv-cache.md).
    CHECK(q8 > 1.75);
    CHECK(q8 < 2.0);
    CHECK(q4 > 3.25);
    CHECK(q8_64 > 1.85);
    CHECK(q4_64 > 3.5);
    // Bytes per token reported for the formats (K scale per channel and block of 16 tokens:
    // 2 bytes / 16 rows; V scale per 32 values: 2 bytes / 32).
    CHECK(kv_bytes_per_token(c, KvType::Q8, KvType::Q8, 16) ==
          doctest::Approx(32.0 * 32 * 128 * ((1 + 2.0 / 16) + (1 + 2.0 / 32))));
    CHECK(kv_bytes_per_token(c, KvType::Q4, KvType::Q4, 16) ==
          doctest::Approx(32.0 * 32 * 128 * ((0.5 + 2.0 / 16) + (0.5 + 2.0 / 32))));
}

namespace {

// One layer's cache on the CPU, driven through a KvBlockTable like a backend does.
struct LayerCache {
    KvLayerView kv;
    std::vector<uint8_t> k, v, ks, vs;
    KvBlockTable table;
    LayerCache(KvType kt, KvType vt, int64_t n_blocks, int64_t n_kv_head, int64_t bs, int64_t hd,
               int32_t n_stages)
        : table(int32_t(n_blocks), int32_t(bs),
                kv_type_quantized(kt) || kv_type_quantized(vt) ? n_stages : 0) {
        k.resize(size_t(n_blocks * n_kv_head * kv_head_block_bytes(kt, KvRole::K, bs, hd)));
        v.resize(size_t(n_blocks * n_kv_head * kv_head_block_bytes(vt, KvRole::V, bs, hd)));
        kv = {kt, vt, k.data(), v.data(), n_blocks, n_kv_head, bs, hd};
        if (table.staging()) {
            ks.resize(size_t(n_stages * n_kv_head * bs * hd * 2));
            vs.resize(ks.size());
            kv.k_stage = ks.data();
            kv.v_stage = vs.data();
            kv.n_stages = n_stages;
        }
    }

    // Appends n rows (k, v: [n][n_kv_head][hd]) to each of `seqs` in one pass and returns the
    // attention output of q: [n_seqs * n][n_head][hd] for the new tokens.
    std::vector<float> pass(const std::vector<SeqId>& seqs, int32_t n,
                            const std::vector<float>& k_rows, const std::vector<float>& v_rows,
                            const std::vector<float>& q, int64_t n_head) {
        std::vector<int32_t> tok_seq, tok_slot, tok_stage, flat;
        int64_t max_blocks = 1;
        for (SeqId s : seqs) {
            std::vector<TokenId> ids(size_t(n), 7);
            REQUIRE(table.append(s, ids));
            max_blocks = std::max<int64_t>(max_blocks, table.block_ids(s).size());
        }
        for (const BlockCopy& c : table.take_pending_copies())
            cpu::kv_copy(kv, c.src, c.dst, c.src_stage, c.dst_stage, c.n_rows);
        flat.assign(seqs.size() * size_t(max_blocks), -1);
        for (size_t i = 0; i < seqs.size(); ++i) {
            const auto& ids = table.block_ids(seqs[i]);
            std::copy(ids.begin(), ids.end(), flat.begin() + int64_t(i) * max_blocks);
            const int32_t len = table.n_tokens(seqs[i]);
            for (int32_t j = len - n; j < len; ++j) {
                tok_seq.push_back(int32_t(i));
                tok_slot.push_back(j);
                tok_stage.push_back(table.staging() ? table.stage_of_slot(seqs[i], j) : -1);
            }
        }
        KvBatchView b{
            tok_seq.data(), tok_slot.data(),         flat.data(),
            max_blocks,     int64_t(tok_seq.size()), table.staging() ? tok_stage.data() : nullptr};
        cpu::kv_write(kv, b, k_rows.data(), v_rows.data());
        std::vector<float> out(q.size());
        cpu::paged_attention(out.data(), q.data(), kv, b, n_head,
                             1.0f / std::sqrt(float(kv.head_dim)));
        return out;
    }
};

}  // namespace

TEST_CASE("paged attention over a staged q8/q4 cache stays close to float attention") {
    const int64_t n_kv_head = 2, n_head = 8, hd = 64;
    for (int64_t bs : {16, 7}) {
        CAPTURE(bs);
        LayerCache ref(KvType::F32, KvType::F32, 64, n_kv_head, bs, hd, 0);
        LayerCache q8(KvType::Q8, KvType::Q8, 64, n_kv_head, bs, hd, 16);
        LayerCache q4(KvType::Q4, KvType::Q4, 64, n_kv_head, bs, hd, 16);
        LayerCache mixed(KvType::Q8, KvType::F16, 64, n_kv_head, bs, hd, 16);
        std::vector<SeqId> seqs;
        for (LayerCache* c : {&ref, &q8, &q4, &mixed}) {
            seqs = {c->table.create_sequence(), c->table.create_sequence()};
        }
        // A 40-token prefill for both sequences, then 30 decode steps: every pass compares
        // the new tokens' attention outputs.
        double worst[3] = {0, 0, 0};
        uint32_t seed = 1;
        for (int step = 0; step < 31; ++step) {
            const int32_t n = step == 0 ? 40 : 1;
            const int64_t rows = int64_t(seqs.size()) * n;
            auto k = random_rows(rows * n_kv_head, hd, seed++, 5);
            auto v = random_rows(rows * n_kv_head, hd, seed++);
            auto q = random_rows(rows * n_head, hd, seed++);
            auto r = ref.pass(seqs, n, k, v, q, n_head);
            auto a = q8.pass(seqs, n, k, v, q, n_head);
            auto b = q4.pass(seqs, n, k, v, q, n_head);
            auto m = mixed.pass(seqs, n, k, v, q, n_head);
            worst[0] = std::max(worst[0], nmse(r, a));
            worst[1] = std::max(worst[1], nmse(r, b));
            worst[2] = std::max(worst[2], nmse(r, m));
        }
        MESSAGE("block " << bs << ": attention NMSE vs f32: q8 " << worst[0] << ", q4 " << worst[1]
                         << ", q8 K + f16 V " << worst[2]);
        // Random keys with an outlier channel, 4 bits: a few % of the output's energy.
        CHECK(worst[0] < 3e-4);
        CHECK(worst[1] < 6e-2);
        CHECK(worst[2] < 3e-4);
    }
}

TEST_CASE("a staged cache reads a token's own block exactly: a lone token equals f16") {
    // With fewer tokens than a block nothing is quantized yet: q4 attention equals f16
    // attention bit for bit (both read f16 rows).
    const int64_t n_kv_head = 1, n_head = 2, hd = 32, bs = 16;
    LayerCache f16(KvType::F16, KvType::F16, 8, n_kv_head, bs, hd, 0);
    LayerCache q4(KvType::Q4, KvType::Q4, 8, n_kv_head, bs, hd, 4);
    std::vector<SeqId> a{f16.table.create_sequence()}, b{q4.table.create_sequence()};
    auto k = random_rows(15 * n_kv_head, hd, 3), v = random_rows(15 * n_kv_head, hd, 4);
    auto q = random_rows(15 * n_head, hd, 5);
    CHECK(f16.pass(a, 15, k, v, q, n_head) == q4.pass(b, 15, k, v, q, n_head));
    // The 16th token fills the block: it still reads its own block (the stage) in f16.
    auto k1 = random_rows(n_kv_head, hd, 6), v1 = random_rows(n_kv_head, hd, 7);
    auto q1 = random_rows(n_head, hd, 8);
    CHECK(f16.pass(a, 1, k1, v1, q1, n_head) == q4.pass(b, 1, k1, v1, q1, n_head));
    // The 17th token reads block 0 quantized: now the outputs differ.
    auto k2 = random_rows(n_kv_head, hd, 9), v2 = random_rows(n_kv_head, hd, 10);
    auto q2 = random_rows(n_head, hd, 11);
    CHECK(f16.pass(a, 1, k2, v2, q2, n_head) != q4.pass(b, 1, k2, v2, q2, n_head));
}

namespace {

// A model on the CPU backend plus a block table, fed pass by pass.
struct ModelRun {
    GgufFile file;
    std::unique_ptr<Backend> backend;
    KvBlockTable table;
    ModelRun(const std::filesystem::path& path, KvType kv, int32_t bs, int32_t n_blocks,
             int64_t n_stages = 0)
        : file(GgufFile::open(path.string())),
          backend(make_cpu_backend(file, options(kv, bs, n_blocks, n_stages))),
          table(n_blocks, bs, backend->n_kv_stages()) {}

    static BackendOptions options(KvType kv, int32_t bs, int32_t n_blocks, int64_t n_stages) {
        BackendOptions o;
        o.kv_type_k = o.kv_type_v = kv;
        o.kv_block_size = bs;
        o.n_kv_blocks = n_blocks;
        o.kv_stages = n_stages;
        return o;
    }

    // Appends `toks` to seq in one pass; returns the logits of every new token.
    std::vector<float> feed(SeqId seq, const std::vector<TokenId>& toks) {
        const int32_t start = table.n_tokens(seq);
        REQUIRE(table.append(seq, toks));
        kv_apply_pending(table, *backend);
        ForwardBatch fb;
        fb.add_sequence(table, seq, start, int32_t(toks.size()));
        for (int32_t i = 0; i < int32_t(toks.size()); ++i) fb.logit_rows.push_back(i);
        std::vector<float> logits(toks.size() * size_t(backend->config().n_vocab));
        backend->forward(fb, logits.data());
        return logits;
    }
    int32_t argmax_last(const std::vector<float>& logits) const {
        const int64_t V = backend->config().n_vocab;
        auto last = logits.end() - V;
        return int32_t(std::max_element(last, logits.end()) - last);
    }
    std::vector<TokenId> greedy(SeqId seq, std::vector<TokenId> prompt, int n) {
        std::vector<TokenId> out;
        auto logits = feed(seq, prompt);
        for (int i = 0; i < n; ++i) {
            out.push_back(argmax_last(logits));
            logits = feed(seq, {out.back()});
        }
        return out;
    }
};

std::vector<TokenId> test_prompt(int n) {
    std::vector<TokenId> p{1};
    for (int i = 1; i < n; ++i) p.push_back(TokenId((i * 37 + 11) % 500 + 3));
    return p;
}

}  // namespace

TEST_CASE("quantized cache on a real model: one prefill pass equals token-by-token decode") {
    auto model = test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    const auto prompt = test_prompt(45);
    for (KvType kv : {KvType::Q8, KvType::Q4})
        for (int32_t bs : {16, 7, 1}) {
            CAPTURE(kv_type_name(kv));
            CAPTURE(bs);
            ModelRun a(model, kv, bs, 64), b(model, kv, bs, 64);
            auto all = a.feed(a.table.create_sequence(), prompt);
            SeqId sb = b.table.create_sequence();
            std::vector<float> steps;
            for (TokenId t : prompt) {
                auto l = b.feed(sb, {t});
                steps.insert(steps.end(), l.begin(), l.end());
            }
            CHECK(all == steps);  // bit for bit: prefill and decode see the same cache
            // Staging holds only the blocks being written: a finished pass leaves one stage
            // in use per sequence at most, unless sealed blocks keep theirs (free to reclaim).
            CHECK(a.table.stats().stages_in_use >= 1);
        }
}

TEST_CASE("quantized cache: rollback across a sealed block is exact; batching is invisible") {
    auto model = test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    const auto prompt = test_prompt(30);
    const std::vector<TokenId> detour{5, 6, 7, 8, 9, 10, 11, 12}, cont{40, 41, 42, 43, 44};
    for (KvType kv : {KvType::Q8, KvType::Q4}) {
        CAPTURE(kv_type_name(kv));
        // Reference: prompt + cont.
        ModelRun ref(model, kv, 16, 32);
        SeqId r = ref.table.create_sequence();
        ref.feed(r, prompt);
        auto want = ref.feed(r, cont);
        // Speculation-like detour: 8 tokens fill block 1 (sealing it), then roll back to 30.
        ModelRun run(model, kv, 16, 32);
        SeqId s = run.table.create_sequence();
        run.feed(s, prompt);
        run.feed(s, detour);
        run.table.truncate(s, 30);
        CHECK(run.feed(s, cont) == want);
        CHECK(run.table.n_used_blocks() == 3);
        // Three sequences in one batch give what each gives alone.
        ModelRun batch(model, kv, 16, 32);
        std::vector<SeqId> ids;
        ForwardBatch fb;
        std::vector<std::vector<TokenId>> prompts{test_prompt(20), test_prompt(33), {1, 50, 60}};
        for (auto& p : prompts) {
            ids.push_back(batch.table.create_sequence());
            REQUIRE(batch.table.append(ids.back(), p));
        }
        kv_apply_pending(batch.table, *batch.backend);
        for (size_t i = 0; i < ids.size(); ++i) {
            fb.add_sequence(batch.table, ids[i], 0, int32_t(prompts[i].size()));
            fb.logit_rows.push_back(int32_t(fb.tokens.size()) - 1);
        }
        const int64_t V = batch.backend->config().n_vocab;
        std::vector<float> together(3 * size_t(V));
        batch.backend->forward(fb, together.data());
        for (size_t i = 0; i < prompts.size(); ++i) {
            ModelRun alone(model, kv, 16, 32);
            auto l = alone.feed(alone.table.create_sequence(), prompts[i]);
            CHECK(std::equal(l.end() - V, l.end(), together.begin() + int64_t(i) * V));
        }
    }
}

TEST_CASE("quantized cache: block sizes 16 and 64 differ only by the K scale group") {
    auto model = test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    const std::vector<TokenId> once{1, 403, 407, 261, 378};  // "Once upon a time"
    // q8: the group effect is far below the model's decisions: same greedy text.
    ModelRun a(model, KvType::Q8, 16, 16), b(model, KvType::Q8, 64, 4);
    auto ga = a.greedy(a.table.create_sequence(), once, 48);
    auto gb = b.greedy(b.table.create_sequence(), once, 48);
    CHECK(ga == gb);
    // q4: logits over a 128-token prompt stay within the q4 error of each block size vs f16.
    const auto prompt = test_prompt(128);
    ModelRun f(model, KvType::F16, 16, 16), q16(model, KvType::Q4, 16, 16),
        q64(model, KvType::Q4, 64, 4);
    auto lf = f.feed(f.table.create_sequence(), prompt);
    auto l16 = q16.feed(q16.table.create_sequence(), prompt);
    auto l64 = q64.feed(q64.table.create_sequence(), prompt);
    const double e16 = nmse(lf, l16), e64 = nmse(lf, l64), d = nmse(l16, l64);
    MESSAGE("q4 logits NMSE vs f16: blocks of 16 " << e16 << ", of 64 " << e64 << "; between them "
                                                   << d);
    CHECK(e16 < 2e-3);
    CHECK(e64 < 4e-3);
    CHECK(d < e16 + e64);
}

TEST_CASE("quantized cache: perplexity and KL divergence vs f16 on stories260K") {
    auto model = test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    auto text_path = test::shared_path("text/wiki.test.raw");
    std::ifstream in(text_path);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    const auto dir = std::filesystem::temp_directory_path();
    const std::string base = (dir / "kvrun_test_kv_quant_f16.kld").string();
    auto eval = [&](KvType kv, const std::string& save, const std::string& kld) {
        GgufFile f = GgufFile::open(model.string());
        auto tok = Tokenizer::from_gguf(f);
        BackendOptions bo;
        bo.kv_type_k = bo.kv_type_v = kv;
        bo.n_kv_blocks = 256 / bo.kv_block_size;
        bo.n_batch = 256;
        auto backend = make_cpu_backend(f, bo);
        PerplexityOptions po;
        po.n_ctx = 256;
        po.n_batch = 256;
        po.n_chunks = 20;
        po.kld_save = save;
        po.kld_base = kld;
        return perplexity_run(*backend, *tok, text, po);
    };
    const PerplexityResult f16 = eval(KvType::F16, base, {});
    const PerplexityResult q8 = eval(KvType::Q8, {}, base);
    const PerplexityResult q4 = eval(KvType::Q4, {}, base);
    std::filesystem::remove(base);
    MESSAGE("PPL f16 " << f16.ppl << ", q8 " << q8.ppl << " (KLD " << q8.kld_mean << "), q4 "
                       << q4.ppl << " (KLD " << q4.kld_mean << ")");
    CHECK(q8.kld_mean <= 0.001);
    CHECK(std::fabs(q8.ppl / f16.ppl - 1) < 0.001);
    CHECK(q8.top1_agreement > 0.98);
    CHECK(std::fabs(q4.ppl / f16.ppl - 1) < 0.02);
    CHECK(q4.kld_mean < 0.05);
}
