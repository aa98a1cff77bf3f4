// Loading llama / qwen2 models (model_config, weights, the CPU backend's batch validation)
// from tiny GGUF files built in memory: hyperparameters, KV sizing, tied output, and the
// error messages for unsupported architectures, missing tensors, wrong shapes or types, and
// inconsistent forward batches.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "arch_test_util.h"
#include "backend.h"
#include "common.h"
#include "cpu_backend.h"
#include "gguf.h"
#include "gguf_writer.h"
#include "model_config.h"
#include "quant.h"

using namespace kvrun;
using kvrun::arch_test::load_error;

namespace {

// A tiny llama-like GGUF: 1 layer, n_embd 8, 2 heads / 1 KV head, n_ff 16, vocab 10, F32.
// `skip` names a tensor to leave out; `bad_shape` names a tensor to give a wrong second
// dimension; `biases` adds Q/K/V biases; `q_type` is attn_q's type (non-F32 data stays zero).
std::vector<uint8_t> tiny_model(const std::string& arch, const std::string& skip = "",
                                const std::string& bad_shape = "", bool biases = false,
                                GgmlType q_type = GgmlType::F32) {
    GgufWriter w;
    w.set_string("general.architecture", arch);
    const std::string a = arch + ".";
    w.set_u32(a + "block_count", 1);
    w.set_u32(a + "embedding_length", 8);
    w.set_u32(a + "feed_forward_length", 16);
    w.set_u32(a + "attention.head_count", 2);
    w.set_u32(a + "attention.head_count_kv", 1);
    w.set_f32(a + "attention.layer_norm_rms_epsilon", 1e-5f);
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.0f, 0.3f);
    auto add = [&](const std::string& name, std::vector<int64_t> dims,
                   GgmlType type = GgmlType::F32) {
        if (name == skip) return;
        if (name == bad_shape) dims.back() += 1;
        int64_t n = 1;
        for (auto d : dims) n *= d;
        std::vector<float> v(n);
        for (auto& x : v) x = name.find("norm") != std::string::npos ? 1.0f : nd(rng);
        std::vector<uint8_t> bytes(ggml_row_bytes(type, dims[0]) * (n / dims[0]));
        if (type == GgmlType::F32)  // other types only test loading: their bytes stay zero
            std::memcpy(bytes.data(), v.data(), bytes.size());
        w.add_tensor(name, type, dims, bytes.data(), bytes.size());
    };
    add("token_embd.weight", {8, 10});
    add("output_norm.weight", {8});
    add("output.weight", {8, 10});
    add("blk.0.attn_norm.weight", {8});
    add("blk.0.attn_q.weight", {8, 8}, q_type);
    add("blk.0.attn_k.weight", {8, 4});
    add("blk.0.attn_v.weight", {8, 4});
    if (biases) {
        add("blk.0.attn_q.bias", {8});
        add("blk.0.attn_k.bias", {4});
        add("blk.0.attn_v.bias", {4});
    }
    add("blk.0.attn_output.weight", {8, 8});
    add("blk.0.ffn_norm.weight", {8});
    add("blk.0.ffn_gate.weight", {8, 16});
    add("blk.0.ffn_up.weight", {8, 16});
    add("blk.0.ffn_down.weight", {16, 8});
    return w.to_bytes();
}

}  // namespace

TEST_CASE("model config reads hyperparameters and defaults") {
    auto bytes = tiny_model("qwen2", "", "", true);
    GgufFile f = GgufFile::from_memory(bytes.data(), bytes.size(), "tiny.gguf");
    ModelConfig c = model_config_from_gguf(f);
    CHECK(c.arch == "qwen2");
    CHECK(c.n_layer == 1);
    CHECK(c.n_embd == 8);
    CHECK(c.head_dim == 4);
    CHECK(c.n_kv_head == 1);
    CHECK(c.n_rot == 4);
    CHECK(c.n_vocab == 10);
    CHECK(c.rope_freq_base == 10000.0f);
    CHECK(c.rope_neox);
    CHECK(c.qkv_bias);
    CHECK(load_error(bytes).empty());

    auto llama = tiny_model("llama");
    GgufFile fl = GgufFile::from_memory(llama.data(), llama.size(), "tiny.gguf");
    CHECK_FALSE(model_config_from_gguf(fl).rope_neox);
    // KV sizing: 1 layer x 1 KV head x 4 dims x (2 + 2) bytes = 16 bytes per token in f16.
    ModelConfig cl = model_config_from_gguf(fl);
    CHECK(kv_bytes_per_token(cl, KvType::F16, KvType::F16) == 16.0);
    BackendOptions o;
    o.kv_memory_mib = 1;
    CHECK(kv_block_bytes(cl, o) == 16 * 16);
    CHECK(kv_blocks_for(cl, o) == (1 << 20) / 256);
    // Quantized K (head_dim 4): 4 f16 channel scales + 16 rows x 4 int8 = 72, padded to 80
    // bytes per head block; V stays f16 (128). Stage slots (f16, K and V) come off the budget.
    o.kv_type_k = KvType::Q8;
    CHECK(kv_block_bytes(cl, o) == 80 + 128);
    const int64_t stages = kv_stages_for(o);
    CHECK(stages == 512 / 16 + 2 + 4);
    CHECK(kv_stage_bytes(cl, o, stages) == stages * 16 * 4 * 2 * 2);
    CHECK(kv_blocks_for(cl, o) == ((1 << 20) - kv_stage_bytes(cl, o, stages)) / 208);
    // V q4 with head_dim 4: one f16 scale per row + 2 bytes of nibbles = 64, padded: 64.
    o.kv_type_v = KvType::Q4;
    CHECK(kv_block_bytes(cl, o) == 80 + 64);
}

TEST_CASE("load errors name the problem") {
    CHECK(contains(
        load_error(tiny_model("gpt2")),
        "unsupported architecture 'gpt2' (supported: llama, qwen2, qwen3, qwen3moe, "
        "qwen2moe, phi3, gemma, gemma2, gemma3, granite, granitemoe, smollm3, gpt-oss, glm4moe, "
        "ernie4_5, ernie4_5-moe, olmo2, olmoe, exaone4, deepseek2, bitnet, glm4, seed_oss, "
        "llama4, dots1, exaone, phi2, starcoder2, command-r, cohere2)"));
    std::string e = load_error(tiny_model("llama", "blk.0.ffn_up.weight"));
    CHECK(contains(e, "missing tensor 'blk.0.ffn_up.weight'"));
    e = load_error(tiny_model("llama", "", "blk.0.attn_k.weight"));
    CHECK(contains(e, "'blk.0.attn_k.weight' has shape [8, 5], expected [8, 4]"));
    e = load_error(tiny_model("qwen2"));  // qwen2 needs Q/K/V biases
    CHECK(contains(e, "missing tensor 'blk.0.attn_q.bias'"));
    e = load_error(tiny_model("llama", "", "", false, GgmlType::I32));
    CHECK(contains(e, "'blk.0.attn_q.weight' has type"));
    // Tied output: no output.weight means the embedding table is reused.
    auto tied = tiny_model("llama", "output.weight");
    GgufFile f = GgufFile::from_memory(tied.data(), tied.size(), "tiny.gguf");
    BackendOptions opt;
    opt.n_kv_blocks = 4;
    CpuBackend backend(f, opt);
    CHECK(backend.weights().output_tied);
    CHECK(backend.weights().output.data == backend.weights().token_embd.data);
}

TEST_CASE("inconsistent forward batches are rejected before touching the cache") {
    auto bytes = tiny_model("llama");
    GgufFile f = GgufFile::from_memory(bytes.data(), bytes.size(), "tiny.gguf");
    BackendOptions opt;
    opt.kv_block_size = 2;
    opt.n_kv_blocks = 4;
    CpuBackend backend(f, opt);
    ForwardBatch good;
    good.tokens = {1, 2, 3};
    good.positions = {0, 1, 2};
    good.seq_index = {0, 0, 0};
    good.slots = {0, 1, 2};
    good.block_tables = {{3, 1}};
    good.logit_rows = {2};
    std::vector<float> logits(10);
    backend.forward(good, logits.data());
    CHECK(std::all_of(logits.begin(), logits.end(), [](float x) { return std::isfinite(x); }));

    auto bad = [&](auto edit) {
        ForwardBatch b = good;
        edit(b);
        CHECK_THROWS_AS(backend.forward(b, logits.data()), Error);
    };
    bad([](ForwardBatch& b) { b.tokens[1] = 10; });          // token outside the vocabulary
    bad([](ForwardBatch& b) { b.positions.pop_back(); });    // size mismatch
    bad([](ForwardBatch& b) { b.seq_index[0] = 1; });        // no such block table
    bad([](ForwardBatch& b) { b.slots[2] = 4; });            // past the sequence's blocks
    bad([](ForwardBatch& b) { b.block_tables[0][1] = 4; });  // block id outside the pool
    bad([](ForwardBatch& b) { b.logit_rows = {3}; });        // no such row
    bad([](ForwardBatch& b) { b.positions[0] = -1; });
}
