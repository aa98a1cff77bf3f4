// Llama 4 (llama4), checked against an independent forward pass written here from the model's
// definition (plain float loops, one sequence, no cache, nothing shared with the backends):
// three layers of four rotate (consecutive pairs, Llama 3's frequency factors), attend within
// chunks of the sliding_window length and, on Scout, RMS-normalize each head's rotated Q and K
// without weights; the fourth attends globally without RoPE, its queries scaled by the
// attention temperature; experts on every interleave_moe_layer_step-th layer (the others
// dense), chosen by the largest router logits and weighted by their sigmoids, the weight
// scaling each expert's input, plus one shared expert. Also: the config llama.cpp reads (the
// default chunk, a zero sliding_window, Maverick known by its 128 experts), the presets, and
// `kvrun run`.
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
    int64_t chunk = 0;          // the rotating layers' chunk (0: the whole context)
    int64_t nope_step = 4;      // layers l with (l + 1) % nope_step == 0 skip RoPE (0: none)
    bool l2_norm = true;        // the rotating layers' weightless per-head Q/K norm
    double temp_scale = 0.1;    // the NoPE layers' attention temperature (0: none)
    int64_t temp_floor = 8192;  // its floor length
    bool weight_before = true;  // false: the router weights scale the experts' outputs
    bool shared = true;         // false: no shared expert
    int64_t moe_step = 1;       // experts on layers l with (l + 1) % moe_step == 0
    int64_t n_used = 1;         // experts per token
    int32_t pos0 = 0;           // position of the first token (slots start at 0)
};

std::vector<std::vector<float>> reference_logits(const GgufFile& f, const ModelConfig& c,
                                                 const Parts& parts,
                                                 const std::vector<int32_t>& tokens) {
    const int64_t T = int64_t(tokens.size()), hd = c.head_dim;
    const Mat embd = tensor(f, "token_embd.weight");
    const Mat out = f.find_tensor("output.weight") ? tensor(f, "output.weight") : embd;
    std::vector<float> factors;  // Llama 3's rope_freqs, when the file has them
    if (f.find_tensor("rope_freqs.weight")) {
        const Mat r = tensor(f, "rope_freqs.weight");
        factors.assign(r.data, r.data + r.n_in);
    }
    const std::vector<float> ones(size_t(hd), 1.0f);
    std::vector<std::vector<float>> x(tokens.size()), keys(tokens.size()), values(tokens.size());
    for (int64_t t = 0; t < T; ++t)
        x[size_t(t)].assign(embd.row(tokens[size_t(t)]), embd.row(tokens[size_t(t)]) + c.n_embd);
    for (int64_t l = 0; l < c.n_layer; ++l) {
        auto w = [&](const char* what) { return tensor(f, fmt::format("blk.{}.{}", l, what)); };
        const bool rope = parts.nope_step == 0 || (l + 1) % parts.nope_step != 0;
        std::vector<std::vector<float>> q(tokens.size());
        for (int64_t t = 0; t < T; ++t) {
            std::vector<float> h = x[size_t(t)];
            rms_normalize(h, 0, c.n_embd, w("attn_norm.weight").data, c.norm_eps);
            q[size_t(t)] = matvec(w("attn_q.weight"), h);
            keys[size_t(t)] = matvec(w("attn_k.weight"), h);
            values[size_t(t)] = matvec(w("attn_v.weight"), h);
            const int64_t pos = parts.pos0 + t;
            if (rope) {
                rotate(q[size_t(t)], c.n_head, hd, hd, pos, c.rope_freq_base, false, factors, 1.0);
                rotate(keys[size_t(t)], c.n_kv_head, hd, hd, pos, c.rope_freq_base, false, factors,
                       1.0);
                if (parts.l2_norm) {  // after RoPE, as llama.cpp's graph has it
                    for (int64_t h2 = 0; h2 < c.n_head; ++h2)
                        rms_normalize(q[size_t(t)], h2 * hd, hd, ones.data(), c.norm_eps);
                    for (int64_t h2 = 0; h2 < c.n_kv_head; ++h2)
                        rms_normalize(keys[size_t(t)], h2 * hd, hd, ones.data(), c.norm_eps);
                }
            } else if (parts.temp_scale > 0) {
                const double s =
                    1 + parts.temp_scale *
                            std::log(std::floor(double(pos + 1) / double(parts.temp_floor)) + 1);
                for (float& v : q[size_t(t)]) v = float(v * s);
            }
        }
        for (int64_t t = 0; t < T; ++t) {
            // The rotating layers see their chunk's slots only (the slot is t here).
            const int64_t u0 = rope && parts.chunk > 0 ? t / parts.chunk * parts.chunk : 0;
            const std::vector<float> att =
                attend(q[size_t(t)], keys, values, t, u0, c.n_head, c.n_kv_head, hd);
            const std::vector<float> o = matvec(w("attn_output.weight"), att);
            for (int64_t i = 0; i < c.n_embd; ++i) x[size_t(t)][size_t(i)] += o[size_t(i)];
            std::vector<float> h = x[size_t(t)];
            rms_normalize(h, 0, c.n_embd, w("ffn_norm.weight").data, c.norm_eps);
            std::vector<float> sum(size_t(c.n_embd), 0.0f);
            if ((l + 1) % parts.moe_step != 0) {
                sum = swiglu_ffn(w("ffn_gate.weight"), w("ffn_up.weight"), w("ffn_down.weight"), h);
            } else {
                const std::vector<float> logit = matvec(w("ffn_gate_inp.weight"), h);
                const int64_t E = int64_t(logit.size());
                std::vector<int64_t> ids(static_cast<size_t>(E));
                for (int64_t e = 0; e < E; ++e) ids[size_t(e)] = e;
                std::stable_sort(ids.begin(), ids.end(), [&](int64_t a, int64_t b) {
                    return logit[size_t(a)] > logit[size_t(b)];
                });
                const Mat ge = w("ffn_gate_exps.weight"), ue = w("ffn_up_exps.weight"),
                          de = w("ffn_down_exps.weight");
                const int64_t fe = ge.n_out / E;
                auto expert = [](const Mat& m, int64_t e, int64_t rows) {
                    return Mat{m.data + e * rows * m.n_in, m.n_in, rows};
                };
                for (int64_t k = 0; k < parts.n_used; ++k) {
                    const int64_t e = ids[size_t(k)];
                    const double wt = 1 / (1 + std::exp(-double(logit[size_t(e)])));
                    std::vector<float> in = h;
                    if (parts.weight_before)
                        for (float& v : in) v = float(v * wt);
                    const std::vector<float> d = swiglu_ffn(expert(ge, e, fe), expert(ue, e, fe),
                                                            expert(de, e, c.n_embd), in);
                    const double scale = parts.weight_before ? 1.0 : wt;
                    for (size_t i = 0; i < sum.size(); ++i) sum[i] += float(scale * d[i]);
                }
                if (parts.shared) {
                    const std::vector<float> d =
                        swiglu_ffn(w("ffn_gate_shexp.weight"), w("ffn_up_shexp.weight"),
                                   w("ffn_down_shexp.weight"), h);
                    for (size_t i = 0; i < sum.size(); ++i) sum[i] += d[i];
                }
            }
            for (int64_t i = 0; i < c.n_embd; ++i) x[size_t(t)][size_t(i)] += sum[size_t(i)];
        }
    }
    return output_logits(x, tensor(f, "output_norm.weight").data, out, c.norm_eps);
}

SyntheticModelConfig small_llama4() {
    SyntheticModelConfig c = small_model("llama4", 21);
    c.n_layer = 4;  // layers 0-2 rotate in chunks, layer 3 global without RoPE
    c.n_expert = 4, c.n_expert_used = 1, c.n_ff_exp = 48;
    c.sliding_window = 5;  // chunks of 5 tokens: the 14 test tokens span three
    c.rope_scaling = "llama3", c.rope_factor = 8, c.rope_orig_ctx = 64;
    return c;
}

}  // namespace

TEST_CASE("llama4 matches the independent reference, and each of its parts matters") {
    TempDir dir;
    struct Case {
        std::string what;
        SyntheticModelConfig cfg;
        Parts parts;
    };
    std::vector<Case> cases;
    {
        Case s{"scout-like", small_llama4(), {}};
        s.parts.chunk = 5;
        cases.push_back(s);
    }
    {  // two experts per token (the released models use one)
        Case s{"two experts", small_llama4(), {}};
        s.cfg.n_expert_used = 2, s.parts.n_used = 2, s.parts.chunk = 5;
        cases.push_back(s);
    }
    {  // Maverick's shape: 128 experts (so no Q/K norm), experts on every other layer
        Case m{"maverick-like", small_llama4(), {}};
        m.cfg.n_expert = 128, m.cfg.n_ff_exp = 8, m.cfg.moe_step = 2;
        m.parts.chunk = 5, m.parts.l2_norm = false, m.parts.moe_step = 2;
        cases.push_back(m);
    }
    for (const Case& k : cases) {
        CAPTURE(k.what);
        const std::string path = dir.file(k.what + ".gguf");
        synthetic_model_write(k.cfg, path);
        GgufFile f = GgufFile::open(path);
        const ModelConfig c = model_config_from_gguf(f);
        CHECK(c.arch == "llama4");
        CHECK(c.qk_l2_norm == k.parts.l2_norm);
        CHECK(c.swa_chunked);
        CHECK(c.n_swa == 5);
        CHECK(c.attn_window(0) == -5);
        CHECK(c.attn_window(3) == 0);
        CHECK(!c.uses_rope(3));
        const auto want = reference_logits(f, c, k.parts, kTokens);
        const auto got = backend_logits(f, kTokens, 9);
        CHECK(rel_diff(got, want) < 2e-5);
        // Not vacuous: each part, changed, moves the reference well beyond that.
        std::vector<Parts> variants;
        Parts v = k.parts;
        v.chunk = 0;
        variants.push_back(v);
        v = k.parts, v.nope_step = 0;
        variants.push_back(v);
        v = k.parts, v.weight_before = false;
        variants.push_back(v);
        v = k.parts, v.shared = false;
        variants.push_back(v);
        if (k.parts.l2_norm) {
            v = k.parts, v.l2_norm = false;
            variants.push_back(v);
        }
        for (size_t i = 0; i < variants.size(); ++i) {
            CAPTURE(i);
            CHECK(rel_diff(reference_logits(f, c, variants[i], kTokens), want) > 1e-3);
        }
    }
}

TEST_CASE("llama4's attention temperature past 8191 tokens, and the unchunked variant") {
    TempDir dir;
    const std::string path = dir.file("l4.gguf");
    synthetic_model_write(small_llama4(), path);
    GgufFile f = GgufFile::open(path);
    const ModelConfig c = model_config_from_gguf(f);
    CHECK(c.attn_temp_scale == doctest::Approx(0.1));
    CHECK(c.attn_temp_floor == 8192);
    // Positions 8185.. cross 8191, where the global layer's queries start to scale up.
    Parts p;
    p.chunk = 5, p.pos0 = 8185;
    const auto want = reference_logits(f, c, p, kTokens);
    CHECK(rel_diff(backend_logits(f, kTokens, 9, p.pos0, 16384), want) < 2e-5);
    Parts cold = p;
    cold.temp_scale = 0;
    CHECK(rel_diff(reference_logits(f, c, cold, kTokens), want) > 1e-4);
    // attention.sliding_window 0: no chunks, no temperature, and (llama.cpp's reading) only the
    // last layer without RoPE.
    const GgufValue zero = gguf_make_uint(GgufValueType::UINT32, 0);
    const std::vector<uint8_t> bytes =
        gguf_rewritten(f, "llama4.attention.sliding_window", &zero, "");
    GgufFile g = GgufFile::from_memory(bytes.data(), bytes.size(), "l4-nochunk.gguf");
    const ModelConfig cg = model_config_from_gguf(g);
    CHECK(!cg.swa_chunked);
    CHECK(cg.attn_window(0) == 0);
    CHECK(cg.attn_temp_scale == 0);
    CHECK(cg.uses_rope(2));
    CHECK(!cg.uses_rope(3));
    Parts plain;
    plain.temp_scale = 0;
    CHECK(rel_diff(backend_logits(g, kTokens, 9), reference_logits(g, cg, plain, kTokens)) < 2e-5);
    // Without the key: chunks of 8192 on three layers of four.
    const std::vector<uint8_t> none =
        gguf_rewritten(f, "llama4.attention.sliding_window", nullptr, "");
    GgufFile d = GgufFile::from_memory(none.data(), none.size(), "l4-default.gguf");
    const ModelConfig cd = model_config_from_gguf(d);
    CHECK(cd.n_swa == 8192);
    CHECK(cd.swa_pattern == 4);
    CHECK(cd.attn_window(1) == -8192);
    // interleave_moe_layer_step is required, as in llama.cpp.
    CHECK(load_error(gguf_rewritten(f, "llama4.interleave_moe_layer_step", nullptr, ""), true)
              .find("missing required key 'llama4.interleave_moe_layer_step'") !=
          std::string::npos);
}

TEST_CASE("llama4 presets have the published shapes, and kvrun runs one") {
    for (const char* name : {"llama4-scout", "llama4-maverick"}) {
        CAPTURE(name);
        const SyntheticModelConfig p = synthetic_preset(name);
        CHECK(p.arch == "llama4");
        CHECK(p.n_layer == 48);
        CHECK(p.n_embd == 5120);
        CHECK(p.n_expert_used == 1);
        CHECK(p.n_vocab == 202048);
        CHECK_NOTHROW(synthetic_validate(p));
    }
    CHECK(synthetic_preset("llama4-scout").n_expert == 16);
    CHECK(synthetic_preset("llama4-maverick").moe_step == 2);
    TempDir dir;
    synthetic_model_write(small_llama4(), dir.file("l4.gguf"));
    const auto r =
        kvrun::test::run_command(kvrun::test::kvrun_binary() + " run -m " + dir.file("l4.gguf") +
                                 " -p 'Once upon' -n 6 --temp 0 -c 256 --device cpu");
    CHECK(r.exit_code == 0);
    CHECK(r.err.find("error") == std::string::npos);
}
