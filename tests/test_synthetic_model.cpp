// Tests of the synthetic-model generator: the GGUF it writes has exactly the keys, tensor names,
// shapes and types the llama loader expects, values of the intended magnitude in every type,
// a loadable tokenizer, byte-identical output for a seed, exact draft cuts, and a working
// agreement dial (residual scale 0 makes the extra layers a no-op in the forward pass).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "backend.h"
#include "common.h"
#include "gguf.h"
#include "model_config.h"
#include "quant.h"
#include "synthetic_fill.h"
#include "synthetic_model.h"
#include "synthetic_vocab.h"
#include "test_util.h"
#include "tokenizer.h"
#include "weights.h"

using namespace kvrun;
namespace fs = std::filesystem;

namespace {

using kvrun::test::TempDir;

std::string read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

SyntheticModelConfig tiny(const char* type, uint64_t seed = 7) {
    SyntheticModelConfig c = synthetic_preset("tiny");
    synthetic_set_type(c, type);
    c.seed = seed;
    c.n_threads = 2;
    return c;
}

struct Moments {
    double mean = 0, std = 0;
    bool finite = true;
};

Moments moments(const std::vector<float>& v) {
    Moments m;
    double s = 0, s2 = 0;
    for (float x : v) {
        if (!std::isfinite(x)) m.finite = false;
        s += x;
        s2 += double(x) * x;
    }
    m.mean = s / double(v.size());
    m.std = std::sqrt(std::max(0.0, s2 / double(v.size()) - m.mean * m.mean));
    return m;
}

std::vector<float> dequantize_tensor(const GgufTensorInfo& t) {
    std::vector<float> out(static_cast<size_t>(t.n_elements));
    const int64_t n_rows = t.n_elements / t.dims[0];
    const size_t row_bytes = ggml_row_bytes(t.type, t.dims[0]);
    for (int64_t r = 0; r < n_rows; ++r)
        dequantize_row(t.type, t.data + size_t(r) * row_bytes, out.data() + r * t.dims[0],
                       t.dims[0]);
    return out;
}

std::vector<float> row_values(GgmlType t, int64_t n, float sigma, uint64_t seed, bool exact) {
    std::vector<uint8_t> buf(ggml_row_bytes(t, n));
    synthetic_fill_row(t, buf.data(), n, sigma, 0.0f, seed, exact);
    std::vector<float> out(static_cast<size_t>(n));
    dequantize_row(t, buf.data(), out.data(), n);
    return out;
}

// Logits of `tokens` (one sequence, from position 0) with the CPU backend: [n][n_vocab].
std::vector<float> forward_logits(const std::string& path, const std::vector<int32_t>& tokens) {
    GgufFile f = GgufFile::open(path);
    BackendOptions o;
    o.n_kv_blocks = 4;
    o.n_threads = 2;
    auto be = make_cpu_backend(f, o);
    ForwardBatch b;
    for (size_t i = 0; i < tokens.size(); ++i) {
        b.tokens.push_back(tokens[i]);
        b.positions.push_back(int32_t(i));
        b.seq_index.push_back(0);
        b.slots.push_back(int32_t(i));
        b.logit_rows.push_back(int32_t(i));
    }
    b.block_tables = {{0, 1, 2, 3}};
    std::vector<float> logits(tokens.size() * size_t(be->config().n_vocab));
    be->forward(b, logits.data());
    return logits;
}

}  // namespace

TEST_CASE("tiny synthetic models have the llama layout the loader expects") {
    TempDir dir;
    for (const char* type : {"F32", "Q8_0", "Q4_0", "Q4_K"}) {
        CAPTURE(type);
        SyntheticModelConfig c = tiny(type);
        const std::string path = dir.file(std::string("tiny-") + type + ".gguf");
        SyntheticModelStats st = synthetic_model_write(c, path);
        CHECK(st.n_tensors == 3 + 9 * c.n_layer);
        CHECK(st.n_bytes == fs::file_size(path));

        GgufFile f = GgufFile::open(path);
        CHECK(f.get_string("general.architecture") == "llama");
        CHECK(f.get_int("llama.block_count") == 2);
        CHECK(f.get_int("llama.embedding_length") == 256);
        CHECK(f.get_int("llama.feed_forward_length") == 512);
        CHECK(f.get_int("llama.attention.head_count") == 4);
        CHECK(f.get_int("llama.attention.head_count_kv") == 2);
        CHECK(f.get_int("llama.context_length") == 2048);
        CHECK(f.get_int("llama.rope.dimension_count") == 64);
        CHECK(f.get_float("llama.rope.freq_base") == doctest::Approx(10000.0));
        CHECK(f.get_float("llama.attention.layer_norm_rms_epsilon") == doctest::Approx(1e-5));

        const GgmlType wt = c.type;
        const GgmlType out_t = std::string(type) == "Q4_K" ? GgmlType::Q6_K : wt;
        auto expect = [&](const std::string& name, GgmlType t, std::vector<int64_t> dims) {
            CAPTURE(name);
            const GgufTensorInfo* ti = f.find_tensor(name);
            REQUIRE(ti != nullptr);
            CHECK(ti->type == t);
            CHECK(ti->dims == dims);
        };
        expect("token_embd.weight", wt, {256, 512});
        expect("output_norm.weight", GgmlType::F32, {256});
        expect("output.weight", out_t, {256, 512});
        for (int i = 0; i < 2; ++i) {
            const std::string p = "blk." + std::to_string(i) + ".";
            expect(p + "attn_norm.weight", GgmlType::F32, {256});
            expect(p + "attn_q.weight", wt, {256, 256});
            expect(p + "attn_k.weight", wt, {256, 128});
            expect(p + "attn_v.weight", wt, {256, 128});
            expect(p + "attn_output.weight", wt, {256, 256});
            expect(p + "ffn_norm.weight", GgmlType::F32, {256});
            expect(p + "ffn_gate.weight", wt, {256, 512});
            expect(p + "ffn_up.weight", wt, {256, 512});
            expect(p + "ffn_down.weight", wt, {512, 256});
        }
        CHECK(f.tensors().size() == 21);

        // Every tensor dequantizes to finite values of the intended magnitude.
        for (const GgufTensorInfo& t : f.tensors()) {
            CAPTURE(t.name);
            Moments m = moments(dequantize_tensor(t));
            CHECK(m.finite);
            if (t.dims.size() == 1) {
                CHECK(m.mean == doctest::Approx(1.0).epsilon(0.02));
                CHECK(m.std == doctest::Approx(0.05).epsilon(0.2));
            } else {
                CHECK(std::fabs(m.mean) < 0.002);
                CHECK(m.std == doctest::Approx(0.02).epsilon(0.1));
            }
        }

        // The real loader accepts it.
        ModelConfig mc = model_config_from_gguf(f);
        CHECK(mc.n_vocab == 512);
        CHECK(mc.head_dim == 64);
        CHECK(mc.kv_dim() == 128);
        ModelWeights w = weights_load(f, mc);
        CHECK(w.layers.size() == 2);

        // The synthetic tokenizer loads and round-trips text.
        auto tok = Tokenizer::from_gguf(f);
        CHECK(tok->n_vocab() == 512);
        CHECK(tok->bos() == 1);
        CHECK(tok->eos() == 2);
        std::vector<TokenId> ids = tok->encode("hello world", true);
        REQUIRE(ids.size() >= 2);
        CHECK(ids[0] == 1);
        for (TokenId id : ids) CHECK((id >= 0 && id < 512));
        CHECK(tok->decode(std::vector<TokenId>(ids.begin() + 1, ids.end())) == "hello world");
    }
}

TEST_CASE("the same seed gives the same bytes, on any thread count") {
    TempDir dir;
    SyntheticModelConfig c = tiny("Q4_K", 11);
    synthetic_model_write(c, dir.file("a.gguf"));
    c.n_threads = 1;
    synthetic_model_write(c, dir.file("b.gguf"));
    c.seed = 12;
    synthetic_model_write(c, dir.file("c.gguf"));
    const std::string a = read_bytes(dir.file("a.gguf"));
    CHECK(a.size() > 100000);
    CHECK(a == read_bytes(dir.file("b.gguf")));
    CHECK(a != read_bytes(dir.file("c.gguf")));
}

TEST_CASE("random blocks of every type have zero mean and the requested RMS") {
    const GgmlType types[] = {GgmlType::F32,  GgmlType::F16,    GgmlType::BF16,  GgmlType::Q8_0,
                              GgmlType::Q4_0, GgmlType::Q4_1,   GgmlType::Q5_0,  GgmlType::Q5_1,
                              GgmlType::Q2_K, GgmlType::Q3_K,   GgmlType::Q4_K,  GgmlType::Q5_K,
                              GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS};
    const int64_t n = 256 * 64;
    for (GgmlType t : types) {
        CAPTURE(ggml_type_name(t));
        REQUIRE(synthetic_type_supported(t));
        if (!ggml_type_traits(t).can_dequantize) continue;  // codec not in kvrun yet
        for (bool exact : {false, true}) {
            if (exact && !ggml_type_traits(t).can_quantize) continue;
            CAPTURE(exact);
            std::vector<float> v = row_values(t, n, 0.02f, 99, exact);
            Moments m = moments(v);
            CHECK(m.finite);
            CHECK(std::fabs(m.mean) < 0.001);
            CHECK(m.std == doctest::Approx(0.02).epsilon(0.08));
            // Bell-shaped, not uniform: about 68% within one sigma (2/3-bit grids are coarse).
            if (t != GgmlType::Q2_K && t != GgmlType::Q3_K) {
                int64_t inside = 0;
                for (float x : v) inside += std::fabs(x - m.mean) < m.std;
                const double frac = double(inside) / double(n);  // uniform: 0.58
                CHECK(frac > 0.62);
                CHECK(frac < 0.80);
            }
            // Blocks have different scales (catches a kernel that reads the wrong block's).
            const int64_t be = ggml_type_traits(t).block_elems;
            if (be > 1) {
                double amax0 = 0, amax1 = 0;
                for (int64_t i = 0; i < be; ++i) {
                    amax0 = std::max(amax0, double(std::fabs(v[size_t(i)])));
                    amax1 = std::max(amax1, double(std::fabs(v[size_t(be + i)])));
                }
                CHECK(amax0 != amax1);
            }
        }
    }
    // Scaling sigma scales the values and keeps the codes (the agreement dial relies on it).
    std::vector<uint8_t> a(ggml_row_bytes(GgmlType::Q8_0, 256)), b(a.size());
    synthetic_fill_row(GgmlType::Q8_0, a.data(), 256, 0.02f, 0.0f, 5);
    synthetic_fill_row(GgmlType::Q8_0, b.data(), 256, 0.002f, 0.0f, 5);
    for (size_t blk = 0; blk < 8; ++blk)
        CHECK(std::memcmp(&a[34 * blk + 2], &b[34 * blk + 2], 32) == 0);
    CHECK_THROWS_AS(synthetic_fill_row(GgmlType::Q4_0, a.data(), 33, 0.02f, 0.0f, 5), Error);
    CHECK_THROWS_AS(synthetic_fill_row(GgmlType::Q4_0, a.data(), 32, 0.02f, 1.0f, 5), Error);
}

TEST_CASE("draft-of keeps the first L layers byte for byte") {
    TempDir dir;
    SyntheticModelConfig c = tiny("Q4_0", 3);
    c.n_layer = 4;
    synthetic_model_write(c, dir.file("target.gguf"));
    SyntheticModelStats st = synthetic_draft_write(dir.file("target.gguf"), 2, dir.file("d.gguf"));
    CHECK(st.n_tensors == 3 + 9 * 2);
    // Seeding by tensor name: a 2-layer model with the same seed is the same draft.
    c.n_layer = 2;
    synthetic_model_write(c, dir.file("two.gguf"));

    GgufFile target = GgufFile::open(dir.file("target.gguf"));
    GgufFile draft = GgufFile::open(dir.file("d.gguf"));
    GgufFile two = GgufFile::open(dir.file("two.gguf"));
    CHECK(draft.get_int("llama.block_count") == 2);
    CHECK(draft.get_int("llama.embedding_length") == 256);
    CHECK(draft.get_array("tokenizer.ggml.tokens").size() == 512);
    REQUIRE(draft.tensors().size() == 21);
    for (const GgufTensorInfo& t : draft.tensors()) {
        CAPTURE(t.name);
        CHECK(t.name.rfind("blk.2.", 0) != 0);
        CHECK(t.name.rfind("blk.3.", 0) != 0);
        for (const GgufFile* other : {&target, &two}) {
            const GgufTensorInfo* o = other->find_tensor(t.name);
            REQUIRE(o != nullptr);
            CHECK(o->type == t.type);
            CHECK(o->dims == t.dims);
            REQUIRE(o->n_bytes == t.n_bytes);
            CHECK(std::memcmp(o->data, t.data, t.n_bytes) == 0);
        }
    }
    ModelConfig mc = model_config_from_gguf(draft);
    CHECK(mc.n_layer == 2);
    CHECK_THROWS_AS(synthetic_draft_write(dir.file("target.gguf"), 5, dir.file("x.gguf")), Error);
    CHECK_THROWS_AS(synthetic_draft_write(dir.file("target.gguf"), 0, dir.file("x.gguf")), Error);
}

TEST_CASE("residual scale 0 makes the later layers a no-op: the draft's logits are exact") {
    TempDir dir;
    SyntheticModelConfig c = tiny("Q8_0", 5);
    c.n_layer = 4;
    c.residual_scale = 0.0f;
    c.scaled_from = 2;
    synthetic_model_write(c, dir.file("target.gguf"));
    synthetic_draft_write(dir.file("target.gguf"), 2, dir.file("draft.gguf"));
    c.residual_scale = 0.5f;
    synthetic_model_write(c, dir.file("half.gguf"));
    {
        GgufFile f = GgufFile::open(dir.file("half.gguf"));
        Moments m0 = moments(dequantize_tensor(*f.find_tensor("blk.1.ffn_down.weight")));
        Moments m3 = moments(dequantize_tensor(*f.find_tensor("blk.3.ffn_down.weight")));
        CHECK(m3.std == doctest::Approx(0.5 * m0.std).epsilon(0.1));
    }
    const std::vector<int32_t> tokens = {1, 300, 301, 302, 400, 450};
    std::vector<float> target = forward_logits(dir.file("target.gguf"), tokens);
    std::vector<float> draft = forward_logits(dir.file("draft.gguf"), tokens);
    std::vector<float> half = forward_logits(dir.file("half.gguf"), tokens);
    Moments m = moments(target);
    CHECK(m.finite);
    CHECK(m.std > 0.1);  // real logits, not all equal
    CHECK(m.std < 100);
    CHECK(target == draft);
    CHECK(half != draft);
}

TEST_CASE("presets, types and bad configurations") {
    SyntheticModelConfig c = synthetic_preset("llama3-8b");
    CHECK(c.n_layer == 32);
    CHECK(c.n_head_kv == 8);
    CHECK(c.n_ff == 14336);
    CHECK(c.n_vocab == 128256);
    synthetic_set_type(c, "q4_k_m");
    CHECK(c.type == GgmlType::Q4_K);
    CHECK(c.output_type == GgmlType::Q6_K);
    CHECK(c.k_mix);
    CHECK_NOTHROW(synthetic_validate(c));
    c = synthetic_preset("llama2-7b");
    CHECK(c.n_head_kv == 32);
    CHECK(c.n_ff == 11008);
    synthetic_set_type(c, "Q4_0");
    CHECK(c.output_type == GgmlType::Q4_0);
    CHECK_NOTHROW(synthetic_validate(c));
    CHECK_THROWS_AS(synthetic_preset("llama-70b"), Error);
    CHECK_THROWS_AS(synthetic_set_type(c, "Q7_0"), Error);

    c = tiny("Q4_K");
    c.n_embd = 320;  // not a multiple of 256
    c.n_head = 5;
    CHECK_THROWS_AS(synthetic_validate(c), Error);
    c = tiny("F32");
    c.n_head_kv = 3;
    CHECK_THROWS_AS(synthetic_validate(c), Error);
    c = tiny("F32");
    c.n_vocab = 100;
    TempDir dir;
    CHECK_THROWS_AS(synthetic_model_write(c, dir.file("x.gguf")), Error);
    CHECK_THROWS_AS(synthetic_spm_vocab(259), Error);
}

TEST_CASE("a K-quant mix and a big synthetic vocabulary") {
    TempDir dir;
    SyntheticModelConfig c = tiny("Q4_K_M");
    c.n_layer = 8;
    c.n_vocab = 40000;  // reaches the generated 4-letter pieces
    synthetic_model_write(c, dir.file("mix.gguf"));
    GgufFile f = GgufFile::open(dir.file("mix.gguf"));
    // use_more_bits: layers 0 (first eighth), 7 (last eighth), 3 and 6 ((i - 1) % 3 == 2).
    for (int i = 0; i < 8; ++i) {
        CAPTURE(i);
        const bool more = i == 0 || i == 3 || i == 6 || i == 7;
        const GgmlType t = more ? GgmlType::Q6_K : GgmlType::Q4_K;
        CHECK(f.find_tensor("blk." + std::to_string(i) + ".attn_v.weight")->type == t);
        CHECK(f.find_tensor("blk." + std::to_string(i) + ".ffn_down.weight")->type == t);
        CHECK(f.find_tensor("blk." + std::to_string(i) + ".attn_q.weight")->type == GgmlType::Q4_K);
    }
    CHECK(f.find_tensor("output.weight")->type == GgmlType::Q6_K);
    CHECK(f.get_int("general.file_type") == 15);
    auto tok = Tokenizer::from_gguf(f);
    CHECK(tok->n_vocab() == 40000);
    std::vector<TokenId> ids = tok->encode("Once upon a time, the quick brown fox", false);
    CHECK(tok->decode(ids) == "Once upon a time, the quick brown fox");
    CHECK(ids.size() < 20);  // merges happen: far fewer tokens than bytes
    SpmVocab v = synthetic_spm_vocab(40000);
    CHECK(v.tokens[3] == "<0x00>");
    CHECK(v.token_types[258] == 6);
    CHECK(v.tokens.back().size() >= 4);
}

TEST_CASE("--vocab-from copies a real tokenizer") {
    fs::path src = test::shared_path("models/stories260K.gguf");
    if (src.empty() || !fs::exists(src)) return;
    TempDir dir;
    SyntheticModelConfig c = tiny("Q8_0");
    c.vocab_from = src.string();
    c.n_vocab = 1;  // ignored
    synthetic_model_write(c, dir.file("v.gguf"));
    GgufFile f = GgufFile::open(dir.file("v.gguf"));
    GgufFile s = GgufFile::open(src.string());
    CHECK(f.find_tensor("token_embd.weight")->dims == std::vector<int64_t>{256, 512});
    auto a = Tokenizer::from_gguf(f);
    auto b = Tokenizer::from_gguf(s);
    CHECK(a->encode("Once upon a time", true) == b->encode("Once upon a time", true));
}
