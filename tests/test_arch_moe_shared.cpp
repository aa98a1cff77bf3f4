// The mixtures of experts with shared experts, GLM 4.5 (glm4moe), dots.llm1 (dots1), ERNIE 4.5
// (ernie4_5, ernie4_5-moe) and Qwen2-MoE (qwen2moe), checked against an independent
// forward pass written here from the models' definitions (plain float loops, one sequence, no
// cache, nothing shared with the backends). GLM: Q/K/V biases, optional per-head Q/K norms,
// NeoX RoPE on part of each head, the FFN's input norm named post_attention_norm, a dense
// first layer, then experts chosen by sigmoid(logit) + a selection bias but weighted by the
// sigmoid alone (normalized, scaled), and a shared expert for every token; a
// multi-token-prediction layer at the end of the file that does not run. ERNIE: consecutive-
// pair RoPE, experts on every other layer after the dense ones, a softmax router with a
// selection bias, shared experts. Qwen2-MoE: Qwen2's biases, a softmax router whose
// probabilities weight the experts unnormalized, one shared expert scaled by
// sigmoid(ffn_gate_inp_shexp · x). Also: config and load errors, the presets' shapes, a cut
// draft.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "arch_test_util.h"
#include "backend.h"
#include "common.h"
#include "gguf.h"
#include "model_config.h"
#include "synthetic_model.h"
#include "test_util.h"

using namespace kvrun;
using namespace kvrun::arch_test;
using kvrun::test::TempDir;

namespace {

// The model's parts, as its config says (for_config), each of which a test may change.
struct Parts {
    bool select_bias = true;   // exp_probs_b joins the choice of experts
    bool sigmoid = true;       // false: a softmax router instead
    bool norm = true;          // the chosen weights over their sum
    double scale = 1;          // expert_weights_scale
    bool shared = true;        // the shared expert
    bool shexp_gate = true;    // its sigmoid gate, when the layer has one (Qwen2-MoE)
    bool partial_rope = true;  // false: every dim of each head rotates
    bool neox = true;          // pairs (j, j + n_rot/2); false: (2j, 2j+1)
};
Parts for_config(const ModelConfig& c) {
    Parts p;
    p.sigmoid = c.moe_sigmoid, p.norm = c.moe_norm, p.scale = c.moe_scale, p.neox = c.rope_neox;
    return p;
}

std::vector<std::vector<float>> reference_logits(const GgufFile& f, const ModelConfig& c,
                                                 const Parts& parts,
                                                 const std::vector<int32_t>& tokens) {
    const int64_t T = int64_t(tokens.size()), hd = c.head_dim;
    const int64_t n_rot = parts.partial_rope ? c.n_rot : hd;
    const Mat embd = tensor(f, "token_embd.weight");
    const Mat out = f.find_tensor("output.weight") ? tensor(f, "output.weight") : embd;  // (tied)
    std::vector<std::vector<float>> x(tokens.size()), keys(tokens.size()), values(tokens.size());
    for (int64_t t = 0; t < T; ++t)
        x[size_t(t)].assign(embd.row(tokens[size_t(t)]), embd.row(tokens[size_t(t)]) + c.n_embd);
    auto add = [](std::vector<float>& v, const float* b) {
        for (size_t i = 0; i < v.size(); ++i) v[i] += b[i];
    };
    for (int64_t l = 0; l < c.n_layer; ++l) {
        auto t_ = [&](const char* what) { return tensor(f, fmt::format("blk.{}.{}", l, what)); };
        const Mat wq = t_("attn_q.weight"), wk = t_("attn_k.weight"), wv = t_("attn_v.weight"),
                  wo = t_("attn_output.weight");
        const bool biased = f.find_tensor(fmt::format("blk.{}.attn_q.bias", l));
        const Mat norm1 = t_("attn_norm.weight"),
                  norm2 = t_(c.ffn_norm_post_attention ? "post_attention_norm.weight"
                                                       : "ffn_norm.weight");
        const bool qk_norm = f.find_tensor(fmt::format("blk.{}.attn_q_norm.weight", l));
        std::vector<std::vector<float>> q(tokens.size());
        for (int64_t t = 0; t < T; ++t) {
            std::vector<float> h = x[size_t(t)];
            rms_normalize(h, 0, c.n_embd, norm1.data, c.norm_eps);
            q[size_t(t)] = matvec(wq, h), keys[size_t(t)] = matvec(wk, h);
            values[size_t(t)] = matvec(wv, h);
            if (biased) {
                add(q[size_t(t)], t_("attn_q.bias").data),
                    add(keys[size_t(t)], t_("attn_k.bias").data);
                add(values[size_t(t)], t_("attn_v.bias").data);
            }
            if (qk_norm) {
                const Mat qn = t_("attn_q_norm.weight"), kn = t_("attn_k_norm.weight");
                for (int64_t hh = 0; hh < c.n_head; ++hh)
                    rms_normalize(q[size_t(t)], hh * hd, hd, qn.data, c.norm_eps);
                for (int64_t hh = 0; hh < c.n_kv_head; ++hh)
                    rms_normalize(keys[size_t(t)], hh * hd, hd, kn.data, c.norm_eps);
            }
            rotate(q[size_t(t)], c.n_head, hd, n_rot, t, c.rope_freq_base, parts.neox, {}, 1.0);
            rotate(keys[size_t(t)], c.n_kv_head, hd, n_rot, t, c.rope_freq_base, parts.neox, {},
                   1.0);
        }
        for (int64_t t = 0; t < T; ++t) {
            const std::vector<float> att =
                attend(q[size_t(t)], keys, values, t, 0, c.n_head, c.n_kv_head, hd);
            const std::vector<float> o = matvec(wo, att);
            for (int64_t i = 0; i < c.n_embd; ++i) x[size_t(t)][size_t(i)] += o[size_t(i)];
        }
        for (int64_t t = 0; t < T; ++t) {
            std::vector<float> h = x[size_t(t)];
            rms_normalize(h, 0, c.n_embd, norm2.data, c.norm_eps);
            std::vector<float> y(size_t(c.n_embd), 0.0f);
            if (!f.find_tensor(fmt::format("blk.{}.ffn_gate_inp.weight", l))) {  // a dense FFN
                y = swiglu_ffn(t_("ffn_gate.weight"), t_("ffn_up.weight"), t_("ffn_down.weight"),
                               h);
            } else {
                const Mat router = t_("ffn_gate_inp.weight");
                const bool has_bias = f.find_tensor(fmt::format("blk.{}.exp_probs_b.bias", l));
                const Mat bias = has_bias ? t_("exp_probs_b.bias") : Mat{};
                const Mat ge = t_("ffn_gate_exps.weight"), ue = t_("ffn_up_exps.weight"),
                          de = t_("ffn_down_exps.weight");
                const std::vector<float> logit = matvec(router, h);
                std::vector<double> gate(logit.size()), choose(logit.size());
                const double mx = *std::max_element(logit.begin(), logit.end());
                double z = 0;
                for (float v : logit) z += std::exp(double(v) - mx);
                for (size_t e = 0; e < logit.size(); ++e) {
                    gate[e] = parts.sigmoid ? 1 / (1 + std::exp(-double(logit[e])))
                                            : std::exp(double(logit[e]) - mx) / z;
                    choose[e] = gate[e] + (parts.select_bias && has_bias ? bias.data[e] : 0.0);
                }
                std::vector<int64_t> ids(logit.size());
                std::iota(ids.begin(), ids.end(), 0);
                std::stable_sort(ids.begin(), ids.end(),
                                 [&](int64_t a, int64_t b) { return choose[a] > choose[b]; });
                ids.resize(size_t(c.n_expert_used));
                double sum = 0;
                for (int64_t e : ids) sum += gate[size_t(e)];
                const int64_t fe = c.n_ff_exp;
                for (int64_t e : ids) {
                    const double wt = gate[size_t(e)] / (parts.norm ? sum : 1.0) * parts.scale;
                    const std::vector<float> d = swiglu_ffn(
                        Mat{ge.row(e * fe), ge.n_in, fe}, Mat{ue.row(e * fe), ue.n_in, fe},
                        Mat{de.row(e * c.n_embd), de.n_in, c.n_embd}, h);
                    for (int64_t i = 0; i < c.n_embd; ++i) y[size_t(i)] += float(wt * d[size_t(i)]);
                }
                if (parts.shared && f.find_tensor(fmt::format("blk.{}.ffn_up_shexp.weight", l))) {
                    const std::vector<float> d =
                        swiglu_ffn(t_("ffn_gate_shexp.weight"), t_("ffn_up_shexp.weight"),
                                   t_("ffn_down_shexp.weight"), h);
                    double gate = 1;
                    if (parts.shexp_gate &&
                        f.find_tensor(fmt::format("blk.{}.ffn_gate_inp_shexp.weight", l))) {
                        const Mat g = t_("ffn_gate_inp_shexp.weight");
                        double dot = 0;
                        for (int64_t i = 0; i < c.n_embd; ++i)
                            dot += double(g.data[i]) * h[size_t(i)];
                        gate = 1 / (1 + std::exp(-dot));
                    }
                    for (int64_t i = 0; i < c.n_embd; ++i)
                        y[size_t(i)] += float(gate * d[size_t(i)]);
                }
            }
            for (int64_t i = 0; i < c.n_embd; ++i) x[size_t(t)][size_t(i)] += y[size_t(i)];
        }
    }
    return output_logits(x, tensor(f, "output_norm.weight").data, out, c.norm_eps);
}

// A small GLM 4.5: 3 layers run (the first dense) and one more for multi-token prediction, 6
// experts of which 2 run plus a shared one, a quarter of each head rotating.
SyntheticModelConfig small_glm() {
    SyntheticModelConfig c = synthetic_preset("tiny");
    c.arch = "glm4moe";
    c.n_layer = 3, c.n_nextn = 1, c.n_layer_dense = 1;
    c.n_embd = 64, c.n_head = 4, c.n_head_kv = 2, c.head_dim = 32, c.rope_dims = 8, c.n_ff = 96;
    c.n_expert = 6, c.n_expert_used = 2, c.n_ff_exp = 32, c.n_expert_shared = 1;
    c.expert_weights_scale = 2.5, c.expert_weights_norm = true;
    c.n_vocab = 300;
    c.weight_std = 0.3f;
    c.seed = 11;
    return c;
}

}  // namespace

TEST_CASE("GLM 4.5 matches the independent reference forward, with and without Q/K norms") {
    TempDir dir;
    for (bool qk_norm : {false, true}) {
        CAPTURE(qk_norm);
        SyntheticModelConfig cfg = small_glm();
        cfg.glm_qk_norm = qk_norm;
        const std::string path = dir.file(fmt::format("glm-{}.gguf", int(qk_norm)));
        synthetic_model_write(cfg, path);
        GgufFile f = GgufFile::open(path);
        const ModelConfig c = model_config_from_gguf(f);
        CHECK(c.n_layer == 3);  // block_count 4, one multi-token-prediction layer
        CHECK(c.n_nextn == 1);
        CHECK(c.n_layer_dense == 1);
        CHECK_FALSE(c.moe_layer(0));
        CHECK(c.moe_layer(1));
        CHECK(c.moe_sigmoid);
        CHECK(c.moe_norm);
        CHECK(c.moe_scale == 2.5f);
        CHECK(c.n_ff_shexp == 32);
        CHECK(c.n_rot == 8);
        CHECK(c.rope_neox);
        CHECK(c.ffn_norm_post_attention);
        const auto want = reference_logits(f, c, for_config(c), kTokens);
        const auto got = backend_logits(f, kTokens, 9);
        CHECK(rel_diff(got, want) < 2e-5);
        // Each part is visible to this check: without it the reference moves well past the
        // bound.
        for (int part = 0; part < 6; ++part) {
            CAPTURE(part);
            Parts p = for_config(c);
            if (part == 0) p.select_bias = false;
            if (part == 1) p.sigmoid = false;
            if (part == 2) p.norm = false;
            if (part == 3) p.scale = 1.0;  // (the model's is 2.5)
            if (part == 4) p.shared = false;
            if (part == 5) p.partial_rope = false;
            CHECK(rel_diff(got, reference_logits(f, c, p, kTokens)) > 1e-3);
        }
    }
}

TEST_CASE("dots.llm1 matches the independent reference forward") {
    // GLM 4.5's router, dense first layer and shared experts (two here), with per-head Q/K norms,
    // no biases, the FFN's norm named ffn_norm, RoPE on every dim.
    TempDir dir;
    SyntheticModelConfig cfg = small_glm();
    cfg.arch = "dots1", cfg.n_nextn = 0, cfg.rope_dims = 0, cfg.n_expert_shared = 2;
    const std::string path = dir.file("dots1.gguf");
    synthetic_model_write(cfg, path);
    GgufFile f = GgufFile::open(path);
    const ModelConfig c = model_config_from_gguf(f);
    CHECK(c.n_layer == 3);
    CHECK(c.qk_norm);
    CHECK(!c.qkv_bias);
    CHECK(!c.ffn_norm_post_attention);
    CHECK(c.moe_sigmoid);
    CHECK(c.n_ff_shexp == 64);
    CHECK(c.n_rot == c.head_dim);
    const auto want = reference_logits(f, c, for_config(c), kTokens);
    const auto got = backend_logits(f, kTokens, 9);
    CHECK(rel_diff(got, want) < 2e-5);
    for (int part = 0; part < 4; ++part) {
        CAPTURE(part);
        Parts p = for_config(c);
        if (part == 0) p.select_bias = false;
        if (part == 1) p.sigmoid = false;
        if (part == 2) p.scale = 1.0;  // (the model's is 2.5)
        if (part == 3) p.shared = false;
        CHECK(rel_diff(got, reference_logits(f, c, p, kTokens)) > 1e-3);
    }
    const SyntheticModelConfig preset = synthetic_preset("dots1");
    CHECK(preset.n_expert == 128);
    CHECK(preset.n_expert_used == 6);
    CHECK(preset.n_expert_shared == 2);
    CHECK_NOTHROW(synthetic_validate(preset));
}

TEST_CASE("GLM 4.5: unnormalized weights, and a draft cut from the model") {
    TempDir dir;
    SyntheticModelConfig cfg = small_glm();
    cfg.expert_weights_norm = false, cfg.expert_weights_scale = 1.0;
    const std::string path = dir.file("glm.gguf");
    synthetic_model_write(cfg, path);
    GgufFile f = GgufFile::open(path);
    const ModelConfig c = model_config_from_gguf(f);
    CHECK_FALSE(c.moe_norm);
    const Parts p = for_config(c);
    CHECK(p.scale == 1.0);
    CHECK(rel_diff(backend_logits(f, kTokens, 5), reference_logits(f, c, p, kTokens)) < 2e-5);
    // A two-layer draft runs both layers it keeps (none is for multi-token prediction).
    synthetic_draft_write(path, 2, dir.file("draft.gguf"));
    GgufFile d = GgufFile::open(dir.file("draft.gguf"));
    const ModelConfig dc = model_config_from_gguf(d);
    CHECK(dc.n_layer == 2);
    CHECK(dc.n_nextn == 0);
    CHECK(rel_diff(backend_logits(d, kTokens, 5), reference_logits(d, dc, p, kTokens)) < 2e-5);
}

TEST_CASE("GLM 4.5 config and load errors name what is wrong") {
    TempDir dir;
    const std::string path = dir.file("glm.gguf");
    synthetic_model_write(small_glm(), path);
    GgufFile f = GgufFile::open(path);
    auto error_without = [&](const std::string& key, const std::string& tensor) {
        return load_error(gguf_rewritten(f, key, nullptr, tensor));
    };
    CHECK(error_without("glm4moe.expert_shared_count", "").find("glm4moe.expert_shared_count") !=
          std::string::npos);
    // As in llama.cpp, no dense layer by default (then layer 0's router is missing) and weights
    // unscaled.
    CHECK(
        error_without("glm4moe.leading_dense_block_count", "").find("blk.0.ffn_gate_inp.weight") !=
        std::string::npos);
    const std::vector<uint8_t> unscaled =
        gguf_rewritten(f, "glm4moe.expert_weights_scale", nullptr, "");
    CHECK(model_config_from_gguf(
              GgufFile::from_memory(unscaled.data(), unscaled.size(), "unscaled.gguf"))
              .moe_scale == 1.0f);
    for (const char* tensor :
         {"blk.1.exp_probs_b.bias", "blk.2.ffn_up_shexp.weight", "blk.0.ffn_gate.weight",
          "blk.1.post_attention_norm.weight", "blk.2.attn_v.bias"}) {
        CAPTURE(tensor);
        CHECK(error_without("", tensor).find(tensor) != std::string::npos);
    }
    // The multi-token-prediction layer's tensors are not needed.
    CHECK(error_without("", "blk.3.ffn_gate_exps.weight").empty());
    GgufValue v;
    v.type = GgufValueType::UINT32;
    v.data = uint64_t(3);  // gating function 3: neither softmax nor sigmoid
    CHECK(load_error(gguf_rewritten(f, "glm4moe.expert_gating_func", &v, ""), true)
              .find("expert_gating_func 3") != std::string::npos);
    v.data = uint64_t(4);  // every layer for multi-token prediction
    CHECK(load_error(gguf_rewritten(f, "glm4moe.nextn_predict_layers", &v, ""), true)
              .find("nextn_predict_layers 4") != std::string::npos);
    v.data = uint64_t(5);
    CHECK(load_error(gguf_rewritten(f, "glm4moe.leading_dense_block_count", &v, ""), true)
              .find("leading_dense_block_count 5") != std::string::npos);
}

TEST_CASE("the glm4.5-air preset has the published shapes") {
    const SyntheticModelConfig c = synthetic_preset("glm4.5-air");
    CHECK(c.arch == "glm4moe");
    CHECK(c.n_layer == 46);
    CHECK(c.n_nextn == 1);
    CHECK(c.n_layer_dense == 1);
    CHECK(c.n_embd == 4096);
    CHECK(c.n_head == 96);
    CHECK(c.n_head_kv == 8);
    CHECK(c.head_dim == 128);
    CHECK(c.rope_dims == 64);
    CHECK(c.n_expert == 128);
    CHECK(c.n_expert_used == 8);
    CHECK(c.n_ff_exp == 1408);
    CHECK(c.n_expert_shared == 1);
    CHECK_NOTHROW(synthetic_validate(c));
}

namespace {

// A small ERNIE 4.5 MoE: 4 layers, the first dense, then experts on layers 1 and 3 (every
// other layer) with 2 shared experts of width 48, and dense FFNs between.
SyntheticModelConfig small_ernie() {
    SyntheticModelConfig c = synthetic_preset("tiny");
    c.arch = "ernie4_5-moe";
    c.n_layer = 4, c.n_layer_dense = 1, c.moe_step = 2;
    c.n_embd = 64, c.n_head = 4, c.n_head_kv = 2, c.n_ff = 96;
    c.n_expert = 6, c.n_expert_used = 2, c.n_ff_exp = 32, c.n_expert_shared = 2, c.n_ff_shexp = 48;
    c.n_vocab = 300;
    c.weight_std = 0.3f;
    c.seed = 13;
    return c;
}

}  // namespace

TEST_CASE("ERNIE 4.5 MoE and dense match the independent reference forward") {
    TempDir dir;
    const std::string path = dir.file("ernie-moe.gguf");
    synthetic_model_write(small_ernie(), path);
    GgufFile f = GgufFile::open(path);
    const ModelConfig c = model_config_from_gguf(f);
    CHECK_FALSE(c.rope_neox);
    CHECK_FALSE(c.moe_sigmoid);
    CHECK_FALSE(c.ffn_norm_post_attention);
    CHECK(c.moe_norm);
    CHECK(c.n_ff_shexp == 48);
    CHECK(c.n_expert_shared == 2);
    for (int64_t l : {0, 2}) CHECK_FALSE(c.moe_layer(l));
    for (int64_t l : {1, 3}) CHECK(c.moe_layer(l));
    const auto got = backend_logits(f, kTokens, 9);
    CHECK(rel_diff(got, reference_logits(f, c, for_config(c), kTokens)) < 2e-5);
    for (int part = 0; part < 5; ++part) {
        CAPTURE(part);
        Parts p = for_config(c);
        if (part == 0) p.select_bias = false;
        if (part == 1) p.sigmoid = true;
        if (part == 2) p.norm = false;
        if (part == 3) p.shared = false;
        if (part == 4) p.neox = true;
        CHECK(rel_diff(got, reference_logits(f, c, p, kTokens)) > 1e-3);
    }
    // Without expert_shared_feed_forward_length there are no shared experts (as in llama.cpp).
    const std::vector<uint8_t> bytes =
        gguf_rewritten(f, "ernie4_5-moe.expert_shared_feed_forward_length", nullptr, "");
    CHECK(model_config_from_gguf(GgufFile::from_memory(bytes.data(), bytes.size(), "n.gguf"))
              .n_ff_shexp == 0);
    CHECK(load_error(gguf_rewritten(f, "ernie4_5-moe.interleave_moe_layer_step", nullptr, ""), true)
              .find("interleave_moe_layer_step") != std::string::npos);

    // The dense ERNIE 4.5 is llama's shape with consecutive-pair RoPE and a tied output.
    SyntheticModelConfig dense = synthetic_preset("tiny");
    dense.arch = "ernie4_5", dense.tied_output = true;
    dense.n_embd = 64, dense.n_head = 4, dense.n_head_kv = 2, dense.n_ff = 96, dense.n_vocab = 300;
    dense.weight_std = 0.3f;
    synthetic_model_write(dense, dir.file("ernie.gguf"));
    GgufFile g = GgufFile::open(dir.file("ernie.gguf"));
    const ModelConfig dc = model_config_from_gguf(g);
    CHECK_FALSE(dc.moe());
    const auto dgot = backend_logits(g, kTokens, 9);
    Parts p = for_config(dc);
    CHECK(rel_diff(dgot, reference_logits(g, dc, p, kTokens)) < 2e-5);
    p.neox = true;
    CHECK(rel_diff(dgot, reference_logits(g, dc, p, kTokens)) > 1e-3);
}

TEST_CASE("the ERNIE 4.5 presets have the published shapes") {
    const SyntheticModelConfig moe = synthetic_preset("ernie4.5-21b-a3b");
    CHECK(moe.arch == "ernie4_5-moe");
    CHECK(moe.n_layer == 28);
    CHECK(moe.n_embd == 2560);
    CHECK(moe.n_head == 20);
    CHECK(moe.n_head_kv == 4);
    CHECK(moe.n_expert == 64);
    CHECK(moe.n_expert_used == 6);
    CHECK(moe.n_ff_exp == 1536);
    CHECK(moe.n_expert_shared == 2);
    CHECK_NOTHROW(synthetic_validate(moe));
    const SyntheticModelConfig dense = synthetic_preset("ernie4.5-0.3b");
    CHECK(dense.arch == "ernie4_5");
    CHECK(dense.n_layer == 18);
    CHECK(dense.n_embd == 1024);
    CHECK_NOTHROW(synthetic_validate(dense));
}

namespace {

// A small Qwen2-MoE: 3 layers, GQA 2:1, 6 experts of which 2 run, a shared expert of its own
// width.
SyntheticModelConfig small_qwen2moe() {
    SyntheticModelConfig c = synthetic_preset("tiny");
    c.arch = "qwen2moe";
    c.n_layer = 3, c.n_embd = 64, c.n_head = 4, c.n_head_kv = 2, c.n_ff = 96;
    c.n_expert = 6, c.n_expert_used = 2, c.n_ff_exp = 32, c.n_ff_shexp = 40;
    c.n_vocab = 300;
    c.weight_std = 0.3f;
    c.seed = 23;
    return c;
}

}  // namespace

TEST_CASE("Qwen2-MoE matches the independent reference forward") {
    TempDir dir;
    const std::string path = dir.file("qwen2moe.gguf");
    synthetic_model_write(small_qwen2moe(), path);
    GgufFile f = GgufFile::open(path);
    const ModelConfig c = model_config_from_gguf(f);
    CHECK(c.rope_neox);
    CHECK(c.qkv_bias);
    CHECK_FALSE(c.qk_norm);
    for (int64_t l : {0, 1, 2}) CHECK(c.moe_layer(l));
    CHECK_FALSE(c.moe_sigmoid);
    CHECK_FALSE(c.moe_norm);  // (llama.cpp: the chosen probabilities as they are)
    CHECK(c.shexp_gate);
    CHECK(c.n_ff_shexp == 40);
    CHECK(c.n_ff_exp == 32);
    const auto got = backend_logits(f, kTokens, 9);
    CHECK(rel_diff(got, reference_logits(f, c, for_config(c), kTokens)) < 2e-5);
    // Each part is visible to this check: without it the reference moves well past the bound.
    for (int part = 0; part < 4; ++part) {
        CAPTURE(part);
        Parts p = for_config(c);
        if (part == 0) p.shexp_gate = false;  // the shared expert added as it is
        if (part == 1) p.shared = false;
        if (part == 2) p.norm = true;
        if (part == 3) p.neox = false;
        CHECK(rel_diff(got, reference_logits(f, c, p, kTokens)) > 1e-3);
    }
    // A two-layer draft cut from it runs as the first two layers of the same definition.
    synthetic_draft_write(path, 2, dir.file("draft.gguf"));
    GgufFile d = GgufFile::open(dir.file("draft.gguf"));
    const ModelConfig dc = model_config_from_gguf(d);
    CHECK(dc.n_layer == 2);
    CHECK(rel_diff(backend_logits(d, kTokens, 5),
                   reference_logits(d, dc, for_config(dc), kTokens)) < 2e-5);
}

TEST_CASE("Qwen2-MoE's shared expert: its width, its gate's shape, load errors") {
    TempDir dir;
    const std::string path = dir.file("qwen2moe.gguf");
    synthetic_model_write(small_qwen2moe(), path);
    GgufFile f = GgufFile::open(path);
    // The gate as converters may write it, one row [64, 1], is the same vector.
    CHECK(load_error(gguf_rewritten(f, "", nullptr, "blk.0.ffn_gate_inp_shexp.weight", {64, 1}))
              .empty());
    const std::string wrong =
        load_error(gguf_rewritten(f, "", nullptr, "blk.1.ffn_gate_inp_shexp.weight", {32}));
    CHECK(wrong.find("blk.1.ffn_gate_inp_shexp.weight") != std::string::npos);
    CHECK(wrong.find("expected [64]") != std::string::npos);
    for (const char* tensor : {"blk.2.ffn_gate_inp_shexp.weight", "blk.0.ffn_up_shexp.weight",
                               "blk.1.attn_k.bias", "blk.2.ffn_gate_inp.weight"}) {
        CAPTURE(tensor);
        CHECK(load_error(gguf_rewritten(f, "", nullptr, tensor)).find(tensor) != std::string::npos);
    }
    // Without expert_shared_feed_forward_length the shared expert is feed_forward_length wide,
    // as in llama.cpp: here that does not match the tensors, and the error says so.
    const std::vector<uint8_t> bytes =
        gguf_rewritten(f, "qwen2moe.expert_shared_feed_forward_length", nullptr, "");
    CHECK(model_config_from_gguf(GgufFile::from_memory(bytes.data(), bytes.size(), "n.gguf"))
              .n_ff_shexp == 96);
    const std::string e = load_error(bytes);
    CHECK(e.find("ffn_gate_shexp.weight") != std::string::npos);
    CHECK(e.find("expected [64, 96]") != std::string::npos);
}

TEST_CASE("the Qwen2-MoE presets have the published shapes") {
    const SyntheticModelConfig a = synthetic_preset("qwen1.5-moe-a2.7b");
    CHECK(a.arch == "qwen2moe");
    CHECK(a.n_layer == 24);
    CHECK(a.n_embd == 2048);
    CHECK(a.n_head == 16);
    CHECK(a.n_head_kv == 16);
    CHECK(a.n_expert == 60);
    CHECK(a.n_expert_used == 4);
    CHECK(a.n_ff_exp == 1408);
    CHECK(a.n_ff_shexp == 5632);
    CHECK_NOTHROW(synthetic_validate(a));
    const SyntheticModelConfig b = synthetic_preset("qwen2-57b-a14b");
    CHECK(b.arch == "qwen2moe");
    CHECK(b.n_layer == 28);
    CHECK(b.n_embd == 3584);
    CHECK(b.n_head_kv == 4);
    CHECK(b.n_expert == 64);
    CHECK(b.n_expert_used == 8);
    CHECK(b.n_ff_exp == 2560);
    CHECK(b.n_ff_shexp == 20480);
    CHECK_NOTHROW(synthetic_validate(b));
}

TEST_CASE("kvrun info and run on a Qwen2-MoE model") {
    TempDir dir;
    const std::string path = dir.file("qwen2moe.gguf");
    synthetic_model_write(small_qwen2moe(), path);
    const std::string bin = kvrun::test::kvrun_binary();
    auto r = kvrun::test::run_command(bin + " info -m " + path);
    CHECK(r.exit_code == 0);
    CHECK(r.out.find("qwen2moe") != std::string::npos);
    CHECK(r.out.find("6 per layer, 2 per token, width 32, 1 shared of width 40 gated by a "
                     "sigmoid; softmax weights not renormalized") != std::string::npos);
    r = kvrun::test::run_command(bin + " run -m " + path +
                                 " -p 'a b c d e f g' -n 12 --temp 0 --device cpu");
    CHECK(r.exit_code == 0);
    CHECK_FALSE(r.out.empty());
}
