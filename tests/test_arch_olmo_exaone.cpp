// OLMo 2 and OLMo 3 (olmo2) and EXAONE 4.0 (exaone4), checked against an independent forward
// pass written here from the models' definitions (plain float loops, one sequence, no cache,
// nothing shared with the backends): no norm before the attention or the FFN, an RMSNorm of
// each block's output before its residual add, NeoX RoPE. OLMo: Q and K RMS-normalized over
// their whole width (all heads at once); OLMo 3's sliding window on three layers of four,
// which rotate with their own base and no RoPE scaling. EXAONE: per-head Q/K norms; at 64
// layers a window on three layers of four, and no RoPE on the others. Also: config and load
// errors, the presets' shapes, a cut draft, `kvrun info` and `run`.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "arch_test_util.h"
#include "backend.h"
#include "common.h"
#include "gguf.h"
#include "gguf_writer.h"
#include "model_config.h"
#include "synthetic_model.h"
#include "test_util.h"

using namespace kvrun;
using namespace kvrun::arch_test;
using kvrun::test::TempDir;

namespace {

// The model's parts, each of which a test may change to show that the backend depends on it.
struct Parts {
    bool qk_norm = true;         // false: no Q/K norm at all
    bool post_norms = true;      // false: the blocks' outputs join the residual unnormed
    bool no_pre_norms = true;    // false: a unit-weight RMSNorm before each block, as llama's
    bool neox = true;            // false: pairs (2j, 2j+1)
    bool window = true;          // false: every layer attends to the whole context
    bool swa_rope_plain = true;  // false: the windowed layers rotate like the global ones
    bool rope_swa_only = true;   // false: EXAONE's global layers rotate too
    bool per_head = true;        // false: EXAONE's Q/K norms over all heads at once
    bool renorm = false;         // true: OLMoE's expert weights over their sum
};

// EXAONE 4.0 with a window: layer l is global and therefore not rotated.
bool swa_nope(const ModelConfig& c, int64_t l) {
    return c.arch == "exaone4" && c.n_swa > 0 && l % c.swa_pattern == c.swa_pattern - 1;
}

std::vector<std::vector<float>> reference_logits(const GgufFile& f, const ModelConfig& c,
                                                 const Parts& parts,
                                                 const std::vector<int32_t>& tokens) {
    const int64_t T = int64_t(tokens.size()), hd = c.head_dim;
    const Mat embd = tensor(f, "token_embd.weight");
    const Mat out = tensor(f, "output.weight");
    std::vector<std::vector<float>> x(tokens.size()), keys(tokens.size()), values(tokens.size());
    for (int64_t t = 0; t < T; ++t)
        x[size_t(t)].assign(embd.row(tokens[size_t(t)]), embd.row(tokens[size_t(t)]) + c.n_embd);
    const std::vector<float> ones(size_t(c.n_embd), 1.0f);
    for (int64_t l = 0; l < c.n_layer; ++l) {
        auto t_ = [&](const char* what) { return tensor(f, fmt::format("blk.{}.{}", l, what)); };
        // A block's input: OLMoE's pre norm, or (OLMo 2, EXAONE) the residual stream itself.
        auto block_input = [&](const std::vector<float>& xt, const char* norm) {
            std::vector<float> h = xt;
            if (c.pre_norms)
                rms_normalize(h, 0, c.n_embd, t_(norm).data, c.norm_eps);
            else if (!parts.no_pre_norms)
                rms_normalize(h, 0, c.n_embd, ones.data(), c.norm_eps);
            return h;
        };
        auto add_output = [&](std::vector<float>& xt, std::vector<float> o, const char* norm) {
            if (c.post_norms && parts.post_norms)
                rms_normalize(o, 0, c.n_embd, t_(norm).data, c.norm_eps);
            for (int64_t i = 0; i < c.n_embd; ++i) xt[size_t(i)] += o[size_t(i)];
        };
        const Mat wq = t_("attn_q.weight"), wk = t_("attn_k.weight"), wv = t_("attn_v.weight"),
                  wo = t_("attn_output.weight"), qn = t_("attn_q_norm.weight"),
                  kn = t_("attn_k_norm.weight");
        // OLMo 3: layer l is windowed when l % pattern < pattern - 1.
        const bool swa = c.n_swa > 0 && l % c.swa_pattern < c.swa_pattern - 1;
        const bool plain = swa && parts.swa_rope_plain && c.rope_freq_base_swa > 0;
        const bool rotates = !(swa_nope(c, l) && parts.rope_swa_only);
        const double base = plain ? c.rope_freq_base_swa : c.rope_freq_base;
        const double freq_scale = plain ? 1.0 : c.rope_freq_scale;
        std::vector<std::vector<float>> q(tokens.size());
        for (int64_t t = 0; t < T; ++t) {
            const std::vector<float> h = block_input(x[size_t(t)], "attn_norm.weight");
            q[size_t(t)] = matvec(wq, h), keys[size_t(t)] = matvec(wk, h);
            values[size_t(t)] = matvec(wv, h);
            if (parts.qk_norm && c.qk_norm_full) {
                rms_normalize(q[size_t(t)], 0, c.q_dim(), qn.data, c.norm_eps);
                rms_normalize(keys[size_t(t)], 0, c.kv_dim(), kn.data, c.norm_eps);
            } else if (parts.qk_norm && !parts.per_head) {  // (EXAONE's weights, tiled)
                std::vector<float> wq_all, wk_all;
                for (int64_t h = 0; h < c.n_head; ++h)
                    wq_all.insert(wq_all.end(), qn.data, qn.data + hd);
                for (int64_t h = 0; h < c.n_kv_head; ++h)
                    wk_all.insert(wk_all.end(), kn.data, kn.data + hd);
                rms_normalize(q[size_t(t)], 0, c.q_dim(), wq_all.data(), c.norm_eps);
                rms_normalize(keys[size_t(t)], 0, c.kv_dim(), wk_all.data(), c.norm_eps);
            } else if (parts.qk_norm) {
                for (int64_t h = 0; h < c.n_head; ++h)
                    rms_normalize(q[size_t(t)], h * hd, hd, qn.data, c.norm_eps);
                for (int64_t h = 0; h < c.n_kv_head; ++h)
                    rms_normalize(keys[size_t(t)], h * hd, hd, kn.data, c.norm_eps);
            }
            if (rotates) {
                rotate(q[size_t(t)], c.n_head, hd, c.n_rot, t, base, parts.neox, {}, 1.0,
                       freq_scale);
                rotate(keys[size_t(t)], c.n_kv_head, hd, c.n_rot, t, base, parts.neox, {}, 1.0,
                       freq_scale);
            }
        }
        for (int64_t t = 0; t < T; ++t) {
            const int64_t u0 = swa && parts.window ? std::max<int64_t>(0, t - c.n_swa + 1) : 0;
            const std::vector<float> att =
                attend(q[size_t(t)], keys, values, t, u0, c.n_head, c.n_kv_head, hd);
            add_output(x[size_t(t)], matvec(wo, att), "post_attention_norm.weight");
        }
        for (int64_t t = 0; t < T; ++t) {
            const std::vector<float> h = block_input(x[size_t(t)], "ffn_norm.weight");
            if (!c.moe()) {
                add_output(x[size_t(t)],
                           swiglu_ffn(t_("ffn_gate.weight"), t_("ffn_up.weight"),
                                      t_("ffn_down.weight"), h),
                           "post_ffw_norm.weight");
                continue;
            }
            // OLMoE: the experts with the k largest softmax probabilities (ties: the lower
            // id), each weighted by its probability.
            const std::vector<float> logit = matvec(t_("ffn_gate_inp.weight"), h);
            const double mx = *std::max_element(logit.begin(), logit.end());
            std::vector<double> p(logit.size());
            double z = 0;
            for (size_t e = 0; e < p.size(); ++e) z += (p[e] = std::exp(double(logit[e]) - mx));
            std::vector<int64_t> ids(p.size());
            for (size_t e = 0; e < ids.size(); ++e) ids[e] = int64_t(e);
            std::stable_sort(ids.begin(), ids.end(), [&](int64_t a, int64_t b) {
                return p[size_t(a)] > p[size_t(b)];
            });
            ids.resize(size_t(c.n_expert_used));
            double sum = 0;
            for (int64_t e : ids) sum += p[size_t(e)] / z;
            const Mat ge = t_("ffn_gate_exps.weight"), ue = t_("ffn_up_exps.weight"),
                      de = t_("ffn_down_exps.weight");
            const int64_t fe = c.n_ff_exp;
            std::vector<float> y(size_t(c.n_embd), 0.0f);
            for (int64_t e : ids) {
                const double wt = p[size_t(e)] / z / (parts.renorm ? sum : 1.0);
                const std::vector<float> d =
                    swiglu_ffn(Mat{ge.row(e * fe), ge.n_in, fe}, Mat{ue.row(e * fe), ue.n_in, fe},
                               Mat{de.row(e * c.n_embd), de.n_in, c.n_embd}, h);
                for (int64_t i = 0; i < c.n_embd; ++i) y[size_t(i)] += float(wt * d[size_t(i)]);
            }
            add_output(x[size_t(t)], y, "");
        }
    }
    return output_logits(x, tensor(f, "output_norm.weight").data, out, c.norm_eps);
}

// A small OLMo 2: 3 layers, GQA 2:1 (the released models are MHA; the norm widths differ
// here), weights large enough that the post norms and the Q/K norms matter.
SyntheticModelConfig small_olmo() {
    SyntheticModelConfig c = synthetic_preset("tiny");
    c.arch = "olmo2";
    c.n_layer = 3, c.n_embd = 64, c.n_head = 4, c.n_head_kv = 2, c.n_ff = 96;
    c.n_vocab = 300;
    c.weight_std = 0.3f;
    c.seed = 17;
    return c;
}

}  // namespace

TEST_CASE("OLMo 2 matches the independent reference forward") {
    TempDir dir;
    const std::string path = dir.file("olmo2.gguf");
    synthetic_model_write(small_olmo(), path);
    GgufFile f = GgufFile::open(path);
    const ModelConfig c = model_config_from_gguf(f);
    CHECK(c.rope_neox);
    CHECK(c.qk_norm_full);
    CHECK_FALSE(c.qk_norm);
    CHECK_FALSE(c.pre_norms);
    CHECK(c.post_norms);
    CHECK(c.n_swa == 0);
    const auto got = backend_logits(f, kTokens, 9);
    CHECK(rel_diff(got, reference_logits(f, c, Parts{}, kTokens)) < 2e-5);
    // Each part is visible to this check: without it the reference moves well past the bound.
    for (int part = 0; part < 4; ++part) {
        CAPTURE(part);
        Parts p;
        if (part == 0) p.qk_norm = false;
        if (part == 1) p.post_norms = false;
        if (part == 2) p.no_pre_norms = false;
        if (part == 3) p.neox = false;
        CHECK(rel_diff(got, reference_logits(f, c, p, kTokens)) > 1e-3);
    }
    // A two-layer draft cut from it runs as the first two layers of the same definition.
    synthetic_draft_write(path, 2, dir.file("draft.gguf"));
    GgufFile d = GgufFile::open(dir.file("draft.gguf"));
    const ModelConfig dc = model_config_from_gguf(d);
    CHECK(dc.n_layer == 2);
    CHECK(rel_diff(backend_logits(d, kTokens, 5), reference_logits(d, dc, Parts{}, kTokens)) <
          2e-5);
}

TEST_CASE("OLMo 3: a window on three layers of four, rotating with their own base, unscaled") {
    TempDir dir;
    SyntheticModelConfig cfg = small_olmo();
    cfg.n_layer = 4, cfg.sliding_window = 5;
    cfg.rope_scaling = "linear", cfg.rope_factor = 4;  // the global layer's scaling
    const std::string path = dir.file("olmo3.gguf");
    synthetic_model_write(cfg, path);
    GgufFile f = GgufFile::open(path);
    const ModelConfig c = model_config_from_gguf(f);
    CHECK(c.n_swa == 5);
    CHECK(c.swa_pattern == 4);  // llama.cpp's default for OLMo 3
    for (int64_t l : {0, 1, 2}) CHECK(c.is_swa(l));
    CHECK_FALSE(c.is_swa(3));
    CHECK(c.rope_freq_base_swa == c.rope_freq_base);  // without rope.freq_base_swa
    const auto got = backend_logits(f, kTokens, 9);
    CHECK(rel_diff(got, reference_logits(f, c, Parts{}, kTokens)) < 2e-5);
    for (int part = 0; part < 2; ++part) {
        CAPTURE(part);
        Parts p;
        if (part == 0) p.window = false;
        if (part == 1) p.swa_rope_plain = false;
        CHECK(rel_diff(got, reference_logits(f, c, p, kTokens)) > 1e-3);
    }

    // The pattern and the windowed layers' base come from their keys when present.
    const GgufValue pattern = gguf_make_uint(GgufValueType::UINT32, 2),
                    base = gguf_make_float(GgufValueType::FLOAT32, 2500.0);
    const std::vector<uint8_t> step1 =
        gguf_rewritten(f, "olmo2.attention.sliding_window_pattern", &pattern, "");
    const GgufFile f1 = GgufFile::from_memory(step1.data(), step1.size(), "p.gguf");
    const std::vector<uint8_t> step2 = gguf_rewritten(f1, "olmo2.rope.freq_base_swa", &base, "");
    const GgufFile f2 = GgufFile::from_memory(step2.data(), step2.size(), "pb.gguf");
    const ModelConfig c2 = model_config_from_gguf(f2);
    CHECK(c2.swa_pattern == 2);
    CHECK(c2.rope_freq_base_swa == 2500.0f);
    for (int64_t l : {0, 2}) CHECK(c2.is_swa(l));
    for (int64_t l : {1, 3}) CHECK_FALSE(c2.is_swa(l));
    const auto got2 = backend_logits(f2, kTokens, 9);
    CHECK(rel_diff(got2, reference_logits(f2, c2, Parts{}, kTokens)) < 2e-5);
    CHECK(rel_diff(got2, got) > 1e-3);
}

TEST_CASE("OLMo 2 load errors name what is wrong") {
    TempDir dir;
    const std::string path = dir.file("olmo2.gguf");
    synthetic_model_write(small_olmo(), path);
    GgufFile f = GgufFile::open(path);
    for (const char* tensor : {"blk.1.attn_q_norm.weight", "blk.2.attn_k_norm.weight",
                               "blk.0.post_attention_norm.weight", "blk.1.post_ffw_norm.weight"}) {
        CAPTURE(tensor);
        CHECK(load_error(gguf_rewritten(f, "", nullptr, tensor)).find(tensor) != std::string::npos);
    }
    // A per-head Q norm (Qwen3's shape) is not OLMo's: the error says the shape expected.
    const std::string e =
        load_error(gguf_rewritten(f, "", nullptr, "blk.0.attn_q_norm.weight", {16}));
    CHECK(e.find("blk.0.attn_q_norm.weight") != std::string::npos);
    CHECK(e.find("expected [64]") != std::string::npos);
    const GgufValue zero = gguf_make_uint(GgufValueType::UINT32, 0);
    CHECK(load_error(gguf_rewritten(f, "olmo2.attention.sliding_window", &zero, ""), true)
              .find("olmo2.attention.sliding_window") != std::string::npos);
}

TEST_CASE("the OLMo presets have the published shapes") {
    for (const char* name : {"olmo2-7b", "olmo3-7b"}) {
        CAPTURE(name);
        const SyntheticModelConfig c = synthetic_preset(name);
        CHECK(c.arch == "olmo2");
        CHECK(c.n_layer == 32);
        CHECK(c.n_embd == 4096);
        CHECK(c.n_head == 32);
        CHECK(c.n_head_kv == 32);
        CHECK(c.n_ff == 11008);
        CHECK(c.rope_base == 500000);
        CHECK(c.sliding_window == (std::string(name) == "olmo3-7b" ? 4096 : 0));
        CHECK_NOTHROW(synthetic_validate(c));
    }
}

TEST_CASE("kvrun info and run on an OLMo 3 model") {
    TempDir dir;
    SyntheticModelConfig cfg = small_olmo();
    cfg.n_layer = 4, cfg.sliding_window = 5;
    const std::string path = dir.file("olmo3.gguf");
    synthetic_model_write(cfg, path);
    const std::string bin = kvrun::test::kvrun_binary();
    auto r = kvrun::test::run_command(bin + " info -m " + path);
    CHECK(r.exit_code == 0);
    CHECK(r.out.find("olmo2") != std::string::npos);
    CHECK(r.out.find("sliding window 5 tokens on 3 of 4 layers (RoPE unscaled)") !=
          std::string::npos);
    // A greedy completion past the window (the logits themselves: the cases above).
    r = kvrun::test::run_command(bin + " run -m " + path +
                                 " -p 'a b c d e f g' -n 12 --temp 0 --device cpu");
    CHECK(r.exit_code == 0);
    CHECK_FALSE(r.out.empty());
}

namespace {

// A small EXAONE 4.0 of 64 layers (the count at which llama.cpp, and kvrun, apply its window).
SyntheticModelConfig small_exaone(int64_t n_layer) {
    SyntheticModelConfig c = synthetic_preset("tiny");
    c.arch = "exaone4";
    c.n_layer = n_layer, c.n_embd = 32, c.n_head = 2, c.n_head_kv = 1, c.n_ff = 48;
    c.sliding_window = 5;
    c.n_vocab = 300;
    c.weight_std = 0.3f;
    c.seed = 19;
    return c;
}

}  // namespace

TEST_CASE("EXAONE 4.0 matches the independent reference forward, windowed and not") {
    TempDir dir;
    const std::string path = dir.file("exaone4.gguf");
    synthetic_model_write(small_exaone(64), path);
    GgufFile f = GgufFile::open(path);
    const ModelConfig c = model_config_from_gguf(f);
    CHECK(c.rope_neox);
    CHECK(c.qk_norm);
    CHECK_FALSE(c.qk_norm_full);
    CHECK_FALSE(c.pre_norms);
    CHECK(c.post_norms);
    CHECK(c.n_swa == 5);
    CHECK(c.swa_pattern == 4);
    CHECK(c.rope_freq_base_swa == 0.0f);  // the windowed layers rotate as the model says
    for (int64_t l : {0, 1, 2, 60}) CHECK(c.uses_rope(l));
    for (int64_t l : {3, 7, 63}) CHECK_FALSE(c.uses_rope(l));
    const auto got = backend_logits(f, kTokens, 9);
    CHECK(rel_diff(got, reference_logits(f, c, Parts{}, kTokens)) < 2e-5);
    for (int part = 0; part < 5; ++part) {
        CAPTURE(part);
        Parts p;
        if (part == 0) p.window = false;
        if (part == 1) p.rope_swa_only = false;
        if (part == 2) p.per_head = false;
        if (part == 3) p.post_norms = false;
        if (part == 4) p.no_pre_norms = false;
        // (64 layers without the post norms overflow: a NaN is no match either)
        CHECK_FALSE(rel_diff(got, reference_logits(f, c, p, kTokens)) <= 1e-3);
    }

    // Other sizes (the 1.2B has 30 layers) attend globally with RoPE everywhere, as in
    // llama.cpp, even with a window in the file.
    const std::string path30 = dir.file("exaone4-30.gguf");
    synthetic_model_write(small_exaone(30), path30);
    GgufFile g = GgufFile::open(path30);
    const ModelConfig c30 = model_config_from_gguf(g);
    CHECK(c30.n_swa == 0);
    for (int64_t l : {0, 3, 29}) CHECK(c30.uses_rope(l));
    CHECK(rel_diff(backend_logits(g, kTokens, 9), reference_logits(g, c30, Parts{}, kTokens)) <
          2e-5);

    // A per-head norm is [head_dim]: a wider one (OLMo's, over all heads) is refused by name and
    // shape.
    const std::string e =
        load_error(gguf_rewritten(g, "", nullptr, "blk.4.attn_q_norm.weight", {32}));
    CHECK(e.find("blk.4.attn_q_norm.weight") != std::string::npos);
    CHECK(e.find("expected [16]") != std::string::npos);
    const std::string bin = kvrun::test::kvrun_binary();
    auto r = kvrun::test::run_command(bin + " info -m " + path);
    CHECK(r.exit_code == 0);
    CHECK(r.out.find("sliding window 5 tokens on 3 of 4 layers (the others without RoPE)") !=
          std::string::npos);
}

TEST_CASE("the EXAONE 4.0 32B preset has the published shape") {
    const SyntheticModelConfig c = synthetic_preset("exaone4-32b");
    CHECK(c.arch == "exaone4");
    CHECK(c.n_layer == 64);
    CHECK(c.n_embd == 5120);
    CHECK(c.n_head == 40);
    CHECK(c.n_head_kv == 8);
    CHECK(c.head_dim == 128);
    CHECK(c.sliding_window == 4096);
    CHECK_NOTHROW(synthetic_validate(c));
}

TEST_CASE("OLMoE matches the independent reference forward") {
    TempDir dir;
    SyntheticModelConfig cfg = small_olmo();
    cfg.arch = "olmoe";
    cfg.n_expert = 6, cfg.n_expert_used = 2, cfg.n_ff_exp = 32;
    const std::string path = dir.file("olmoe.gguf");
    synthetic_model_write(cfg, path);
    GgufFile f = GgufFile::open(path);
    const ModelConfig c = model_config_from_gguf(f);
    CHECK(c.rope_neox);
    CHECK(c.qk_norm_full);
    CHECK(c.pre_norms);
    CHECK_FALSE(c.post_norms);
    CHECK(c.moe_layer(0));
    CHECK_FALSE(c.moe_sigmoid);
    CHECK_FALSE(c.moe_norm);
    const auto got = backend_logits(f, kTokens, 9);
    CHECK(rel_diff(got, reference_logits(f, c, Parts{}, kTokens)) < 2e-5);
    for (int part = 0; part < 3; ++part) {
        CAPTURE(part);
        Parts p;
        if (part == 0) p.qk_norm = false;
        if (part == 1) p.renorm = true;
        if (part == 2) p.neox = false;
        CHECK(rel_diff(got, reference_logits(f, c, p, kTokens)) > 1e-3);
    }
    CHECK(load_error(gguf_rewritten(f, "", nullptr, "blk.1.attn_k_norm.weight"))
              .find("blk.1.attn_k_norm.weight") != std::string::npos);
    const SyntheticModelConfig preset = synthetic_preset("olmoe-1b-7b");
    CHECK(preset.arch == "olmoe");
    CHECK(preset.n_expert == 64);
    CHECK(preset.n_expert_used == 8);
    CHECK_NOTHROW(synthetic_validate(preset));
}
