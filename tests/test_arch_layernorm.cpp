// The LayerNorm architectures: Phi-2 (phi2), StarCoder2 (starcoder2), Command-R (command-r) and
// Command R7B / A (cohere2), checked against an independent forward pass written here from the
// models' definitions (plain float loops, one sequence, no cache, nothing shared with the
// backends): LayerNorms (with biases for Phi-2 and StarCoder2), parallel attention and FFN
// (Phi-2, Cohere), a plain GELU FFN with biases (Phi-2, StarCoder2), an output bias (Phi-2),
// Cohere's logit scale, and Command R7B's window on three layers of four with no RoPE on the
// others. Each part is shown to matter. Also: config and load errors, presets and `kvrun info`.
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
    bool layer_norm = true;     // false: RMSNorms with the same weights
    bool norm_bias = true;      // false: the LayerNorms' biases left out
    bool flip_blocks = false;   // true: parallel blocks sequential and the reverse
    bool ffn_bias = true;       // false: the FFN's up bias left out
    bool out_bias = true;       // false: the output's bias left out
    bool flip_pairs = false;    // true: NeoX pairs for consecutive ones and the reverse
    bool logit_scale = true;    // false: Cohere's logits unscaled
    bool window = true;         // false: cohere2's windowed layers attend to everything
    bool rope_swa_only = true;  // false: cohere2's global layers rotate too
};

bool has(const GgufFile& f, const std::string& name) {
    return f.find_tensor(name) != nullptr;
}

// x normed in place: LayerNorm (mean and variance over the row) or RMSNorm, times w, plus b.
void normalize(std::vector<float>& x, const float* w, const float* b, double eps, bool layer) {
    const double n = double(x.size());
    double mean = 0;
    if (layer)
        for (float v : x) mean += v / n;
    double var = 0;
    for (float v : x) var += (v - mean) * (v - mean) / n;
    const double inv = 1.0 / std::sqrt(var + eps);
    for (size_t i = 0; i < x.size(); ++i)
        x[i] = float((x[i] - mean) * inv * w[i] + (b ? b[i] : 0.0));
}

void add_vec(std::vector<float>& y, const float* b) {
    for (size_t i = 0; i < y.size(); ++i) y[i] += b[i];
}

std::vector<std::vector<float>> reference_logits(const GgufFile& f, const ModelConfig& c,
                                                 const Parts& parts,
                                                 const std::vector<int32_t>& tokens) {
    const int64_t T = int64_t(tokens.size()), hd = c.head_dim;
    const bool parallel = c.parallel_blocks != parts.flip_blocks;
    const bool neox = c.rope_neox != parts.flip_pairs;
    const Mat embd = tensor(f, "token_embd.weight");
    const Mat out = has(f, "output.weight") ? tensor(f, "output.weight") : embd;
    auto norm = [&](std::vector<float> h, const std::string& base) {
        const bool bias = parts.norm_bias && has(f, base + ".bias");
        normalize(h, tensor(f, base + ".weight").data,
                  bias ? tensor(f, base + ".bias").data : nullptr, c.norm_eps, parts.layer_norm);
        return h;
    };
    std::vector<std::vector<float>> x(tokens.size()), keys(tokens.size()), values(tokens.size());
    for (int64_t t = 0; t < T; ++t)
        x[size_t(t)].assign(embd.row(tokens[size_t(t)]), embd.row(tokens[size_t(t)]) + c.n_embd);
    for (int64_t l = 0; l < c.n_layer; ++l) {
        const std::string p = fmt::format("blk.{}.", l);
        auto t_ = [&](const char* what) { return tensor(f, p + what); };
        const bool swa = c.n_swa > 0 && l % 4 < 3;  // (cohere2)
        const bool rotates = swa || !parts.rope_swa_only || c.n_swa == 0;
        std::vector<std::vector<float>> h(tokens.size()), q(tokens.size());
        for (int64_t t = 0; t < T; ++t) {
            h[size_t(t)] = norm(x[size_t(t)], p + "attn_norm");
            std::vector<float>& qt = q[size_t(t)];
            if (has(f, p + "attn_qkv.weight")) {  // Q, K and V rows in one tensor, its bias too
                std::vector<float> all = matvec(t_("attn_qkv.weight"), h[size_t(t)]);
                if (has(f, p + "attn_qkv.bias")) add_vec(all, t_("attn_qkv.bias").data);
                qt.assign(all.begin(), all.begin() + c.q_dim());
                keys[size_t(t)].assign(all.begin() + c.q_dim(),
                                       all.begin() + c.q_dim() + c.kv_dim());
                values[size_t(t)].assign(all.begin() + c.q_dim() + c.kv_dim(), all.end());
            } else {
                qt = matvec(t_("attn_q.weight"), h[size_t(t)]);
                keys[size_t(t)] = matvec(t_("attn_k.weight"), h[size_t(t)]);
                values[size_t(t)] = matvec(t_("attn_v.weight"), h[size_t(t)]);
                if (has(f, p + "attn_q.bias")) {
                    add_vec(qt, t_("attn_q.bias").data);
                    add_vec(keys[size_t(t)], t_("attn_k.bias").data);
                    add_vec(values[size_t(t)], t_("attn_v.bias").data);
                }
            }
            if (rotates) {
                rotate(qt, c.n_head, hd, c.n_rot, t, c.rope_freq_base, neox, {}, 1.0);
                rotate(keys[size_t(t)], c.n_kv_head, hd, c.n_rot, t, c.rope_freq_base, neox, {},
                       1.0);
            }
        }
        auto ffn = [&](const std::vector<float>& in) {
            if (!c.ffn_plain)
                return swiglu_ffn(t_("ffn_gate.weight"), t_("ffn_up.weight"), t_("ffn_down.weight"),
                                  in);
            std::vector<float> u = matvec(t_("ffn_up.weight"), in);
            if (parts.ffn_bias) add_vec(u, t_("ffn_up.bias").data);
            for (float& v : u)
                v = float(0.5 * v *
                          (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))));
            std::vector<float> d = matvec(t_("ffn_down.weight"), u);
            add_vec(d, t_("ffn_down.bias").data);
            return d;
        };
        for (int64_t t = 0; t < T; ++t) {
            const int64_t u0 = swa && parts.window ? std::max<int64_t>(0, t - c.n_swa + 1) : 0;
            std::vector<float> o =
                matvec(t_("attn_output.weight"),
                       attend(q[size_t(t)], keys, values, t, u0, c.n_head, c.n_kv_head, hd));
            if (has(f, p + "attn_output.bias")) add_vec(o, t_("attn_output.bias").data);
            std::vector<float>& xt = x[size_t(t)];
            const std::vector<float> y = parallel ? ffn(h[size_t(t)]) : std::vector<float>();
            add_vec(xt, o.data());
            if (parallel) {
                add_vec(xt, y.data());
            } else {  // StarCoder2's own ffn_norm (a parallel model's test reuses attn_norm's)
                const std::string n = has(f, p + "ffn_norm.weight") ? "ffn_norm" : "attn_norm";
                add_vec(xt, ffn(norm(xt, p + n)).data());
            }
        }
    }
    std::vector<std::vector<float>> logits;
    for (const std::vector<float>& xt : x) {
        std::vector<float> y = matvec(out, norm(xt, "output_norm"));
        if (parts.out_bias && has(f, "output.bias")) add_vec(y, tensor(f, "output.bias").data);
        if (parts.logit_scale)
            for (float& v : y) v *= c.logit_scale;
        logits.push_back(y);
    }
    return logits;
}

// The small test model of `arch` (cohere2: 4 layers, a window of 5 tokens).
SyntheticModelConfig small(const std::string& arch, uint64_t seed) {
    SyntheticModelConfig c = small_model(arch, seed);
    if (arch == "cohere2") c.n_layer = 4, c.sliding_window = 5;
    if (arch == "phi2") c.rope_dims = 8;  // partial rotary, as the real one (32 of 80)
    return c;
}

// The backend's logits for a model against the reference: close to it, and far from the
// reference without each of `parts`.
void check_against_reference(const SyntheticModelConfig& cfg, const std::vector<Parts>& parts) {
    TempDir dir;
    const std::string path = dir.file("m.gguf");
    synthetic_model_write(cfg, path);
    GgufFile f = GgufFile::open(path);
    const ModelConfig c = model_config_from_gguf(f);
    const auto got = backend_logits(f, kTokens, 9);
    CHECK(rel_diff(got, reference_logits(f, c, Parts{}, kTokens)) < 5e-5);
    for (size_t i = 0; i < parts.size(); ++i) {
        CAPTURE(i);
        CHECK(rel_diff(got, reference_logits(f, c, parts[i], kTokens)) > 1e-3);
    }
}

}  // namespace

TEST_CASE("Phi-2 matches the independent reference forward") {
    for (bool fused : {false, true}) {
        CAPTURE(fused);
        SyntheticModelConfig cfg = small("phi2", 41);
        cfg.fused_qkv = fused;
        check_against_reference(
            cfg, {Parts{.layer_norm = false}, Parts{.norm_bias = false}, Parts{.flip_blocks = true},
                  Parts{.ffn_bias = false}, Parts{.out_bias = false}, Parts{.flip_pairs = true}});
    }
}

TEST_CASE("StarCoder2 matches the independent reference forward") {
    check_against_reference(
        small("starcoder2", 42),
        {Parts{.layer_norm = false}, Parts{.norm_bias = false}, Parts{.flip_blocks = true},
         Parts{.ffn_bias = false}, Parts{.flip_pairs = true}});
}

TEST_CASE("Command-R and Command R7B match the independent reference forward") {
    check_against_reference(small("command-r", 43),
                            {Parts{.layer_norm = false}, Parts{.flip_blocks = true},
                             Parts{.flip_pairs = true}, Parts{.logit_scale = false}});
    check_against_reference(small("cohere2", 44),
                            {Parts{.layer_norm = false}, Parts{.flip_blocks = true},
                             Parts{.window = false}, Parts{.rope_swa_only = false}});
}

TEST_CASE("the LayerNorm architectures' configs, errors, presets and info") {
    TempDir dir;
    for (const char* arch : {"phi2", "starcoder2", "command-r", "cohere2"}) {
        CAPTURE(arch);
        const std::string path = dir.file(std::string(arch) + ".gguf");
        synthetic_model_write(small(arch, 7), path);
        GgufFile f = GgufFile::open(path);
        const ModelConfig c = model_config_from_gguf(f);
        const bool cohere = c.arch == "command-r" || c.arch == "cohere2";
        CHECK(c.layer_norm);
        CHECK(c.parallel_blocks == (c.arch != "starcoder2"));
        CHECK(c.ffn_plain == !cohere);
        CHECK(c.rope_neox == !cohere);
        CHECK(c.logit_scale == (cohere ? 0.0625f : 1.0f));
        CHECK(c.n_swa == (c.arch == "cohere2" ? 5 : 0));
        if (c.arch == "cohere2") {
            CHECK(c.uses_rope(0));
            CHECK_FALSE(c.uses_rope(3));
        }
        const auto info =
            kvrun::test::run_command(kvrun::test::kvrun_binary() + " info -m " + path);
        CHECK(info.exit_code == 0);
        CHECK(contains(info.out, "LayerNorms"));
        CHECK(contains(info.out, "norm_eps"));
        if (c.arch == "cohere2")
            CHECK(contains(info.out, "sliding window 5 tokens on 3 of 4 layers"));
        // A greedy completion past the window.
        const auto run = kvrun::test::run_command(kvrun::test::kvrun_binary() + " run -m " + path +
                                                  " -p 'a b c d e f g' -n 8 --temp 0 --device cpu");
        CHECK(run.exit_code == 0);
        if (cohere) {
            // Cohere's logit scale is required, as in llama.cpp.
            std::vector<uint8_t> bytes = gguf_rewritten(f, c.arch + ".logit_scale", nullptr, "");
            CHECK(contains(load_error(bytes, true),
                           "missing required key '" + c.arch + ".logit_scale'"));
            // Command R+'s per-head LayerNorms of Q and K are refused by name.
            GgufWriter w(uint32_t(f.alignment()));
            for (const auto& [k, v] : f.metadata()) w.set_value(k, v);
            for (const GgufTensorInfo& t : f.tensors())
                w.add_tensor(t.name, t.type, t.dims, t.data, t.n_bytes);
            const std::vector<float> ones(size_t(c.q_dim()), 1.0f);
            w.add_tensor("blk.0.attn_q_norm.weight", GgmlType::F32, {c.head_dim, c.n_head},
                         ones.data(), ones.size() * sizeof(float));
            CHECK(contains(load_error(w.to_bytes()),
                           "'blk.0.attn_q_norm.weight' (Command R+'s per-head LayerNorms of Q and "
                           "K) is not supported"));
        }
    }
    for (const char* name :
         {"phi2", "starcoder2-3b", "starcoder2-7b", "command-r-35b", "command-r7b"})
        CHECK_NOTHROW(synthetic_validate(synthetic_preset(name)));
    CHECK(synthetic_preset("phi2").rope_dims == 32);
    CHECK(synthetic_preset("command-r7b").arch == "cohere2");
}
