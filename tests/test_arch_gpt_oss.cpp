// OpenAI's gpt-oss, checked against an independent forward pass written here from the model's
// definition (plain float loops, one sequence, no cache, nothing shared with the backends):
// Q/K/V and attention-output biases, each head's learned attention sink in the softmax, a
// sliding window on the even layers, NeoX RoPE, the FFN's input norm named
// post_attention_norm, a router with a bias whose top-k logits are softmaxed, experts with
// biases and OpenAI's clamped SwiGLU, and MXFP4 experts. Also: the config and load errors.
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
#include "gguf_writer.h"
#include "model_config.h"
#include "quant.h"
#include "quantize_model.h"
#include "synthetic_model.h"
#include "test_util.h"

using namespace kvrun;
using namespace kvrun::arch_test;
using kvrun::test::TempDir;

namespace {

// Any tensor's values as float32 (the experts may be MXFP4), rows of dims[0].
struct FloatTensor {
    std::vector<float> v;
    int64_t n_in = 0;
    Mat rows(int64_t first, int64_t n) const { return Mat{v.data() + first * n_in, n_in, n}; }
};

FloatTensor floats(const GgufFile& f, const std::string& name) {
    const GgufTensorInfo* t = f.find_tensor(name);
    REQUIRE_MESSAGE(t, "missing " << name);
    FloatTensor out;
    out.n_in = t->dims[0];
    out.v.resize(size_t(t->n_elements));
    dequantize_row(t->type, t->data, out.v.data(), t->n_elements);
    return out;
}

struct Parts {
    int64_t window = 0;  // even layers see their last `window` tokens
    int64_t n_used = 0;  // experts per token
    bool sinks = true;   // attention sinks in the softmax
    bool clamp = true;   // the SwiGLU's clamp at +-7 (false: plain x * sigmoid(1.702 x))
    bool biases = true;  // every bias tensor
};

std::vector<std::vector<float>> reference_logits(const GgufFile& f, const ModelConfig& c,
                                                 const Parts& parts,
                                                 const std::vector<int32_t>& tokens) {
    const int64_t T = int64_t(tokens.size()), hd = c.head_dim;
    const FloatTensor embd = floats(f, "token_embd.weight"), out = floats(f, "output.weight");
    std::vector<std::vector<float>> x(tokens.size()), keys(tokens.size()), values(tokens.size());
    for (int64_t t = 0; t < T; ++t) {
        const float* row = embd.v.data() + tokens[size_t(t)] * c.n_embd;
        x[size_t(t)].assign(row, row + c.n_embd);
    }
    auto add = [&](std::vector<float>& v, const float* b) {
        if (parts.biases)
            for (size_t i = 0; i < v.size(); ++i) v[i] += b[i];
    };
    for (int64_t l = 0; l < c.n_layer; ++l) {
        auto t_ = [&](const char* what) { return floats(f, fmt::format("blk.{}.{}", l, what)); };
        auto mat = [](const FloatTensor& m) {
            return Mat{m.v.data(), m.n_in, int64_t(m.v.size()) / m.n_in};
        };
        const FloatTensor wq = t_("attn_q.weight"), wk = t_("attn_k.weight"),
                          wv = t_("attn_v.weight"), wo = t_("attn_output.weight");
        const FloatTensor bq = t_("attn_q.bias"), bk = t_("attn_k.bias"), bv = t_("attn_v.bias"),
                          bo = t_("attn_output.bias"), sinks = t_("attn_sinks.weight");
        const FloatTensor norm1 = t_("attn_norm.weight"), norm2 = t_("post_attention_norm.weight");
        const bool swa = l % 2 == 0;
        std::vector<std::vector<float>> q(tokens.size());
        for (int64_t t = 0; t < T; ++t) {
            std::vector<float> h = x[size_t(t)];
            rms_normalize(h, 0, c.n_embd, norm1.v.data(), c.norm_eps);
            q[size_t(t)] = matvec(mat(wq), h), keys[size_t(t)] = matvec(mat(wk), h);
            values[size_t(t)] = matvec(mat(wv), h);
            add(q[size_t(t)], bq.v.data()), add(keys[size_t(t)], bk.v.data());
            add(values[size_t(t)], bv.v.data());
            rotate(q[size_t(t)], c.n_head, hd, hd, t, c.rope_freq_base, true, {}, 1.0);
            rotate(keys[size_t(t)], c.n_kv_head, hd, hd, t, c.rope_freq_base, true, {}, 1.0);
        }
        for (int64_t t = 0; t < T; ++t) {
            const int64_t u0 = swa ? std::max<int64_t>(0, t - parts.window + 1) : 0;
            const std::vector<float> att =
                attend(q[size_t(t)], keys, values, t, u0, c.n_head, c.n_kv_head, hd,
                       parts.sinks ? sinks.v.data() : nullptr);
            std::vector<float> o = matvec(mat(wo), att);
            add(o, bo.v.data());
            for (int64_t i = 0; i < c.n_embd; ++i) x[size_t(t)][size_t(i)] += o[size_t(i)];
        }
        const FloatTensor router = t_("ffn_gate_inp.weight"), router_b = t_("ffn_gate_inp.bias");
        const FloatTensor ge = t_("ffn_gate_exps.weight"), ue = t_("ffn_up_exps.weight"),
                          de = t_("ffn_down_exps.weight");
        const FloatTensor gb = t_("ffn_gate_exps.bias"), ub = t_("ffn_up_exps.bias"),
                          db = t_("ffn_down_exps.bias");
        const int64_t fe = c.n_ff_exp;
        for (int64_t t = 0; t < T; ++t) {
            std::vector<float> h = x[size_t(t)];
            rms_normalize(h, 0, c.n_embd, norm2.v.data(), c.norm_eps);
            std::vector<float> logit = matvec(mat(router), h);
            add(logit, router_b.v.data());
            // The top n_used logits (lower id on ties), then a softmax over just those.
            std::vector<int64_t> ids(logit.size());
            std::iota(ids.begin(), ids.end(), 0);
            std::stable_sort(ids.begin(), ids.end(),
                             [&](int64_t a, int64_t b) { return logit[a] > logit[b]; });
            ids.resize(size_t(parts.n_used));
            double z = 0;
            for (int64_t e : ids) z += std::exp(double(logit[size_t(e)] - logit[size_t(ids[0])]));
            for (int64_t e : ids) {
                const double wt = std::exp(double(logit[size_t(e)] - logit[size_t(ids[0])])) / z;
                std::vector<float> g = matvec(ge.rows(e * fe, fe), h);
                std::vector<float> u = matvec(ue.rows(e * fe, fe), h);
                add(g, gb.v.data() + e * fe), add(u, ub.v.data() + e * fe);
                for (int64_t i = 0; i < fe; ++i) {
                    double gi = g[size_t(i)], ui = u[size_t(i)];
                    if (parts.clamp) gi = std::min(gi, 7.0), ui = std::clamp(ui, -7.0, 7.0);
                    g[size_t(i)] = float(gi / (1 + std::exp(-1.702 * gi)) * (ui + 1));
                }
                std::vector<float> d = matvec(de.rows(e * c.n_embd, c.n_embd), g);
                add(d, db.v.data() + e * c.n_embd);
                for (int64_t i = 0; i < c.n_embd; ++i)
                    x[size_t(t)][size_t(i)] += float(wt * d[size_t(i)]);
            }
        }
    }
    return output_logits(x, floats(f, "output_norm.weight").v.data(),
                         Mat{out.v.data(), out.n_in, c.n_vocab}, c.norm_eps);
}

// A small gpt-oss: 4 layers (two with a 4-token window), 6 experts of which 2 run, weights
// large enough that the clamp and the sinks bite.
SyntheticModelConfig small_gpt_oss() {
    SyntheticModelConfig c = synthetic_preset("tiny");
    c.arch = "gpt-oss";
    c.n_layer = 4, c.n_embd = 64, c.n_head = 4, c.n_head_kv = 2, c.n_ff = 96;
    c.n_expert = 6, c.n_expert_used = 2, c.n_ff_exp = 96;
    c.sliding_window = 4;
    c.n_vocab = 300;
    c.weight_std = 0.4f;
    c.seed = 5;
    return c;
}

}  // namespace

TEST_CASE("gpt-oss matches the independent reference forward, F32 and MXFP4 experts") {
    TempDir dir;
    for (GgmlType experts : {GgmlType::F32, GgmlType::MXFP4}) {
        CAPTURE(ggml_type_name(experts));
        SyntheticModelConfig cfg = small_gpt_oss();
        cfg.expert_type = experts;
        const std::string path = dir.file(fmt::format("oss-{}.gguf", ggml_type_name(experts)));
        synthetic_model_write(cfg, path);
        GgufFile f = GgufFile::open(path);
        const ModelConfig c = model_config_from_gguf(f);
        CHECK(c.attn_sinks);
        CHECK(c.swiglu_oai);
        CHECK(c.rope_neox);
        CHECK(c.is_swa(0));
        CHECK_FALSE(c.is_swa(1));
        CHECK(c.window(2) == 4);
        Parts parts;
        parts.window = 4, parts.n_used = 2;
        const auto want = reference_logits(f, c, parts, kTokens);
        const auto got = backend_logits(f, kTokens, 9);
        CHECK(rel_diff(got, want) < 2e-5);
        // Each part is visible to this check: without it the reference moves well past the
        // bound.
        for (int part = 0; part < 4; ++part) {
            CAPTURE(part);
            Parts p = parts;
            if (part == 0) p.sinks = false;
            if (part == 1) p.clamp = false;
            if (part == 2) p.biases = false;
            if (part == 3) p.window = 100;
            CHECK(rel_diff(got, reference_logits(f, c, p, kTokens)) > 1e-3);
        }
    }
}

TEST_CASE("gpt-oss config and load errors name what is wrong") {
    TempDir dir;
    SyntheticModelConfig cfg = small_gpt_oss();
    const std::string path = dir.file("oss.gguf");
    synthetic_model_write(cfg, path);
    GgufFile f = GgufFile::open(path);
    // The model rewritten without one metadata key or one tensor.
    auto error_without = [&](const std::string& key, const std::string& tensor) {
        return load_error(gguf_rewritten(f, key, nullptr, tensor));
    };
    CHECK(error_without("gpt-oss.attention.sliding_window", "").find("sliding_window") !=
          std::string::npos);
    CHECK(error_without("", "blk.1.attn_sinks.weight").find("blk.1.attn_sinks.weight") !=
          std::string::npos);
    CHECK(error_without("", "blk.0.ffn_down_exps.bias").find("blk.0.ffn_down_exps.bias") !=
          std::string::npos);
    CHECK(error_without("", "blk.2.post_attention_norm.weight")
              .find("blk.2.post_attention_norm.weight") != std::string::npos);
    // The experts' width stands in for a missing feed_forward_length.
    const std::vector<uint8_t> bytes = gguf_rewritten(f, "gpt-oss.feed_forward_length", nullptr, "");
    const GgufFile g = GgufFile::from_memory(bytes.data(), bytes.size(), "no-ff.gguf");
    CHECK(model_config_from_gguf(g).n_ff == 96);
    CHECK(model_config_from_gguf(g).n_ff_exp == 96);
}

TEST_CASE("gpt-oss: quantize MXFP4_MOE puts the experts in MXFP4, other matrices in Q8_0") {
    TempDir dir;
    SyntheticModelConfig cfg = small_gpt_oss();
    cfg.weight_std = 0.1f;
    const std::string f32 = dir.file("oss-f32.gguf"), q = dir.file("oss-mxfp4.gguf");
    synthetic_model_write(cfg, f32);
    GgufFile src = GgufFile::open(f32);
    QuantizeOptions o;
    o.type = find_quant_file_type("MXFP4_MOE");
    REQUIRE(o.type != nullptr);
    CHECK(o.type->id == 38);  // llama.cpp's general.file_type
    quantize_model(src, q, o);
    GgufFile out = GgufFile::open(q);
    for (const GgufTensorInfo& t : out.tensors()) {
        CAPTURE(t.name);
        const bool expert = t.name.find("_exps.weight") != std::string::npos;
        const bool matrix = t.dims.size() >= 2 && t.name.ends_with(".weight") &&
                            t.name.find("ffn_gate_inp") == std::string::npos;
        CHECK(t.type == (expert ? GgmlType::MXFP4 : matrix ? GgmlType::Q8_0 : GgmlType::F32));
    }
    // It runs, and is about as close to the float model as Q4_0 throughout (this small random
    // model magnifies any 4-bit error: Q8_0 throughout gives 0.017 here).
    QuantizeOptions q4 = o;
    q4.type = find_quant_file_type("Q4_0"), q4.pure = true;
    quantize_model(src, dir.file("oss-q4.gguf"), q4);
    const auto want = backend_logits(src, kTokens, 9);
    const double mxfp4 = rel_diff(backend_logits(out, kTokens, 9), want);
    const double q4_0 =
        rel_diff(backend_logits(GgufFile::open(dir.file("oss-q4.gguf")), kTokens, 9), want);
    MESSAGE("MXFP4_MOE " << mxfp4 << ", Q4_0 " << q4_0);
    CHECK(mxfp4 < 1.25 * q4_0);
}

TEST_CASE("gpt-oss presets have the published shapes") {
    const SyntheticModelConfig c = synthetic_preset("gpt-oss-20b");
    CHECK(c.arch == "gpt-oss");
    CHECK(c.n_layer == 24);
    CHECK(c.n_embd == 2880);
    CHECK(c.n_head == 64);
    CHECK(c.n_head_kv == 8);
    CHECK(c.head_dim == 64);
    CHECK(c.n_expert == 32);
    CHECK(c.n_expert_used == 4);
    CHECK(c.expert_type == GgmlType::MXFP4);
    CHECK(synthetic_preset("gpt-oss-120b").n_layer == 36);
    CHECK(synthetic_preset("gpt-oss-120b").n_expert == 128);
    CHECK_NOTHROW(synthetic_validate(c));
}
