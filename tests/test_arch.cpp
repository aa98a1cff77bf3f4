// The architectures kvrun runs (llama, qwen2, qwen3, phi3, gemma 1-3), each checked against an
// independent forward pass written here from the models' definitions: plain float loops over the
// GGUF's F32 tensors, one sequence, full causal attention with no cache. It shares nothing with the
// backends (no cpu_ops, no paging), so agreement means the backend's layer wiring is right:
// Q/K/V biases (qwen2), per-head Q/K RMSNorm before RoPE (qwen3), NeoX vs interleaved RoPE
// pairs, a head size other than n_embd / n_head (Qwen3, Mistral Nemo), fused Q/K/V and
// gate/up tensors (phi3) and Phi-3's LongRoPE, Gemma's embedding scale, GELU, post norms,
// soft caps, sliding-window layers and per-layer RoPE (gemma, gemma2, gemma3), Granite's
// multipliers (granite, granitemoe), SmolLM3's layers without RoPE, GLM-4's post norms with
// fused gate/up and partial RoPE on consecutive pairs (glm4), Seed-OSS's renamed FFN norm,
// GQA, tied output.
// The CPU backend runs the prompt in pieces across KV blocks of 4 tokens, so prefill, decode
// and the paged cache are all on the path. Also: qwen3 load errors, and the synthetic presets.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <random>
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
using kvrun::test::TempDir;
using namespace kvrun::arch_test;

namespace {

// The float values of a 1-D F32 tensor, or empty when absent.
std::vector<float> vector_or_empty(const GgufFile& f, const char* name) {
    const GgufTensorInfo* t = f.find_tensor(name);
    if (!t) return {};
    REQUIRE(t->type == GgmlType::F32);
    const auto* p = reinterpret_cast<const float*>(t->data);
    return std::vector<float>(p, p + t->n_elements);
}

// The reference forward: logits [n_tokens][n_vocab] for `tokens` at positions 0.., with the
// architecture's parts switched by the flags (so a test can also show each part matters).
struct RefParts {
    bool biases = false, qk_norm = false, neox = false;
    bool fused = false;               // Q/K/V (and their biases) in attn_qkv (phi3)
    bool fused_up = false;            // gate then up in ffn_up (phi3, glm4)
    bool post_norms = false;          // each block's output normed before its add (glm4)
    bool ffn_norm_renamed = false;    // the FFN's input norm is post_attention_norm (seed_oss)
    std::vector<float> rope_factors;  // per-pair divisors (LongRoPE), empty: none
    double rope_mscale = 1.0;         // rope.scaling.attn_factor
    int32_t pos0 = 0;                 // position of the first token
    // Gemma (generation 1-3, 0: not Gemma): embeddings times sqrt(n_embd), GELU gate; from 2
    // on post norms and sliding-window layers (gemma2: even layers, gemma3: five of six) of
    // `window` tokens; gemma2's soft caps; gemma3's window layers rotate with base 10000,
    // unscaled, the others with the model's base times rope_scale.
    int gemma = 0;
    int64_t window = 0;
    double attn_softcap = 0, final_softcap = 0;
    double rope_scale = 1.0;
    // Mixture of experts: the top n_used of n_expert softmax router probabilities, renormalized.
    int64_t n_expert = 0, n_used = 0;
    // Granite: embeddings times embd_scale (0: Gemma's rule or 1), q.k times attn_scale (0:
    // 1 / sqrt(head_dim)), block outputs times residual_scale, logits times logit_scale.
    double embd_scale = 0, attn_scale = 0, residual_scale = 1, logit_scale = 1;
    // SmolLM3: layers l with (l + 1) % nope_step == 0 apply no RoPE (0: all rotate).
    int64_t nope_step = 0;
    int64_t n_rot = 0;  // dims of each head that rotate (Phi-4-mini: 3/4); 0: all
    // Control vectors: steer[l] (n_embd values, or empty) joins layer l's output.
    std::vector<std::vector<float>> steer;
    // BitNet: RMSNorms of the attention's output before attn_output (attn_sub_norm) and of
    // the gated product before ffn_down (ffn_sub_norm); the output is the embedding's.
    bool sub_norms = false;
};

RefParts parts_of(bool biases, bool qk_norm, bool neox, bool fused = false) {
    RefParts p;
    p.biases = biases, p.qk_norm = qk_norm, p.neox = neox, p.fused = p.fused_up = fused;
    return p;
}

std::vector<std::vector<float>> reference_logits(const GgufFile& f, const ModelConfig& c,
                                                 const RefParts& parts,
                                                 const std::vector<int32_t>& tokens) {
    const int64_t T = int64_t(tokens.size()), hd = c.head_dim, group = c.n_head / c.n_kv_head;
    const Mat embd = tensor(f, "token_embd.weight");
    const Mat out =
        f.find_tensor("output.weight") && !parts.sub_norms ? tensor(f, "output.weight") : embd;
    const size_t nt = tokens.size();
    std::vector<std::vector<float>> x(nt), keys(nt), values(nt);
    for (int64_t t = 0; t < T; ++t) {
        x[size_t(t)].assign(embd.row(tokens[size_t(t)]), embd.row(tokens[size_t(t)]) + c.n_embd);
        if (parts.gemma)
            for (float& e : x[size_t(t)]) e = float(e * std::sqrt(double(c.n_embd)));
        if (parts.embd_scale > 0)
            for (float& e : x[size_t(t)]) e = float(e * parts.embd_scale);
    }
    // Adds a block's output to the residual stream (times Granite's residual_scale).
    auto add_residual = [&](std::vector<float>& x_t, const std::vector<float>& o) {
        for (int64_t i = 0; i < c.n_embd; ++i)
            x_t[size_t(i)] = float(x_t[size_t(i)] + parts.residual_scale * o[size_t(i)]);
    };
    const double kq_scale = parts.attn_scale > 0 ? parts.attn_scale : 1 / std::sqrt(double(hd));
    // Applies the RMSNorm weights `name` of layer l to all of v.
    auto post_norm = [&](std::vector<float>& v, int64_t l, const char* name) {
        rms_normalize(v, 0, int64_t(v.size()), tensor(f, fmt::format("blk.{}.{}", l, name)).data,
                      c.norm_eps);
    };
    for (int64_t l = 0; l < c.n_layer; ++l) {
        const bool swa = parts.window > 0 &&
                         ((parts.gemma == 2 && l % 2 == 0) || (parts.gemma == 3 && l % 6 < 5));
        const bool local_rope = swa && parts.gemma == 3;
        const double base = local_rope ? 10000.0 : c.rope_freq_base;
        const double freq_scale = local_rope ? 1.0 : parts.rope_scale;
        auto w = [&](const char* what) { return tensor(f, fmt::format("blk.{}.{}", l, what)); };
        auto add_bias = [&](std::vector<float>& v, const char* what) {
            if (!parts.biases) return;
            const Mat b = w(what);
            for (size_t i = 0; i < v.size(); ++i) v[i] += b.data[i];
        };
        std::vector<std::vector<float>> q(nt);
        for (int64_t t = 0; t < T; ++t) {
            std::vector<float> h = x[size_t(t)];
            rms_normalize(h, 0, c.n_embd, w("attn_norm.weight").data, c.norm_eps);
            if (parts.fused) {  // one product, then cut into Q | K | V
                std::vector<float> all = matvec(w("attn_qkv.weight"), h);
                add_bias(all, "attn_qkv.bias");
                const auto q_end = all.begin() + long(c.q_dim());
                const auto k_end = q_end + long(c.kv_dim());
                q[size_t(t)].assign(all.begin(), q_end);
                keys[size_t(t)].assign(q_end, k_end);
                values[size_t(t)].assign(k_end, all.end());
            } else {
                q[size_t(t)] = matvec(w("attn_q.weight"), h);
                keys[size_t(t)] = matvec(w("attn_k.weight"), h);
                values[size_t(t)] = matvec(w("attn_v.weight"), h);
                add_bias(q[size_t(t)], "attn_q.bias");
                add_bias(keys[size_t(t)], "attn_k.bias");
                add_bias(values[size_t(t)], "attn_v.bias");
            }
            if (parts.qk_norm) {
                for (int64_t hh = 0; hh < c.n_head; ++hh)
                    rms_normalize(q[size_t(t)], hh * hd, hd, w("attn_q_norm.weight").data,
                                  c.norm_eps);
                for (int64_t hh = 0; hh < c.n_kv_head; ++hh)
                    rms_normalize(keys[size_t(t)], hh * hd, hd, w("attn_k_norm.weight").data,
                                  c.norm_eps);
            }
            const int64_t pos = parts.pos0 + t;
            if (parts.nope_step > 0 && (l + 1) % parts.nope_step == 0) continue;  // NoPE layer
            const int64_t n_rot = parts.n_rot > 0 ? parts.n_rot : hd;
            rotate(q[size_t(t)], c.n_head, hd, n_rot, pos, base, parts.neox, parts.rope_factors,
                   parts.rope_mscale, freq_scale);
            rotate(keys[size_t(t)], c.n_kv_head, hd, n_rot, pos, base, parts.neox,
                   parts.rope_factors, parts.rope_mscale, freq_scale);
        }
        for (int64_t t = 0; t < T; ++t) {
            std::vector<float> att(size_t(c.n_head * hd), 0.0f);
            for (int64_t hh = 0; hh < c.n_head; ++hh) {
                const int64_t kvh = hh / group;
                // Keys u0 .. t: all, or the last `window` in a sliding-window layer.
                const int64_t u0 = swa ? std::max<int64_t>(0, t - parts.window + 1) : 0;
                std::vector<double> score(size_t(t + 1), 0.0);
                double mx = -1e300;
                for (int64_t u = u0; u <= t; ++u) {
                    double s = 0;
                    for (int64_t i = 0; i < hd; ++i)
                        s += double(q[size_t(t)][size_t(hh * hd + i)]) *
                             keys[size_t(u)][size_t(kvh * hd + i)];
                    s *= kq_scale;
                    if (parts.attn_softcap > 0)
                        s = parts.attn_softcap * std::tanh(s / parts.attn_softcap);
                    score[size_t(u)] = s;
                    mx = std::max(mx, s);
                }
                double z = 0;
                for (int64_t u = u0; u <= t; ++u)
                    z += (score[size_t(u)] = std::exp(score[size_t(u)] - mx));
                for (int64_t u = u0; u <= t; ++u)
                    for (int64_t i = 0; i < hd; ++i)
                        att[size_t(hh * hd + i)] +=
                            float(score[size_t(u)] / z * values[size_t(u)][size_t(kvh * hd + i)]);
            }
            if (parts.sub_norms)
                rms_normalize(att, 0, int64_t(att.size()), w("attn_sub_norm.weight").data,
                              c.norm_eps);
            std::vector<float> o = matvec(w("attn_output.weight"), att);
            const bool post_norms = parts.gemma >= 2 || parts.post_norms;
            if (post_norms) post_norm(o, l, "post_attention_norm.weight");
            add_residual(x[size_t(t)], o);
            std::vector<float> h = x[size_t(t)];
            rms_normalize(
                h, 0, c.n_embd,
                w(parts.ffn_norm_renamed ? "post_attention_norm.weight" : "ffn_norm.weight").data,
                c.norm_eps);
            if (parts.n_expert > 0) {
                const Mat router = w("ffn_gate_inp.weight");
                std::vector<float> logit = matvec(router, h);
                double mx = *std::max_element(logit.begin(), logit.end()), z = 0;
                std::vector<double> prob(logit.size());
                for (size_t e = 0; e < prob.size(); ++e) z += (prob[e] = std::exp(logit[e] - mx));
                for (double& pe : prob) pe /= z;
                std::vector<int64_t> ids(prob.size());
                for (size_t e = 0; e < ids.size(); ++e) ids[e] = int64_t(e);
                std::stable_sort(ids.begin(), ids.end(),
                                 [&](int64_t a, int64_t b) { return prob[a] > prob[b]; });
                double picked = 0;
                for (int64_t k = 0; k < parts.n_used; ++k) picked += prob[size_t(ids[size_t(k)])];
                const Mat ge = w("ffn_gate_exps.weight"), ue = w("ffn_up_exps.weight"),
                          de = w("ffn_down_exps.weight");
                const int64_t fe = ge.n_out / parts.n_expert;
                auto expert = [&](const Mat& m, int64_t e, int64_t rows) {
                    return Mat{m.data + e * rows * m.n_in, m.n_in, rows};
                };
                std::vector<float> sum(size_t(c.n_embd), 0.0f);
                for (int64_t k = 0; k < parts.n_used; ++k) {
                    const int64_t e = ids[size_t(k)];
                    std::vector<float> g = matvec(expert(ge, e, fe), h);
                    const std::vector<float> u = matvec(expert(ue, e, fe), h);
                    for (size_t i = 0; i < g.size(); ++i)
                        g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
                    const std::vector<float> d = matvec(expert(de, e, c.n_embd), g);
                    const double wt = prob[size_t(e)] / picked;
                    for (size_t i = 0; i < sum.size(); ++i) sum[i] += float(wt * d[i]);
                }
                add_residual(x[size_t(t)], sum);
                continue;
            }
            std::vector<float> g, up;
            if (parts.fused_up) {
                const std::vector<float> both = matvec(w("ffn_up.weight"), h);
                g.assign(both.begin(), both.begin() + long(c.n_ff));
                up.assign(both.begin() + long(c.n_ff), both.end());
            } else {
                g = matvec(w("ffn_gate.weight"), h);
                up = matvec(w("ffn_up.weight"), h);
            }
            for (size_t i = 0; i < g.size(); ++i) {
                const double v = g[i];
                const double act =
                    parts.gemma
                        ? 0.5 * v *
                              (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)))
                        : v / (1 + std::exp(-v));
                g[i] = float(act * up[i]);
            }
            if (parts.sub_norms)
                rms_normalize(g, 0, int64_t(g.size()), w("ffn_sub_norm.weight").data, c.norm_eps);
            std::vector<float> d = matvec(w("ffn_down.weight"), g);
            if (post_norms) post_norm(d, l, "post_ffw_norm.weight");
            add_residual(x[size_t(t)], d);
        }
        if (size_t(l) < parts.steer.size() && !parts.steer[size_t(l)].empty())
            for (int64_t t = 0; t < T; ++t)
                for (int64_t i = 0; i < c.n_embd; ++i)
                    x[size_t(t)][size_t(i)] += parts.steer[size_t(l)][size_t(i)];
    }
    std::vector<std::vector<float>> logits =
        output_logits(x, tensor(f, "output_norm.weight").data, out, c.norm_eps);
    for (int64_t t = 0; t < T; ++t) {
        for (float& v : logits[size_t(t)]) v = float(v * parts.logit_scale);
        if (parts.final_softcap > 0)
            for (float& v : logits[size_t(t)])
                v = float(parts.final_softcap * std::tanh(v / parts.final_softcap));
    }
    return logits;
}

SyntheticModelConfig small(const std::string& arch) { return small_model(arch, 11); }

std::vector<uint8_t> read_file_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("each architecture matches the independent reference forward") {
    TempDir dir;
    struct Case {
        std::string what;
        SyntheticModelConfig cfg;
        RefParts parts;
    };
    std::vector<Case> cases;
    cases.push_back({"llama", small("llama"), parts_of(false, false, false)});
    cases.push_back({"qwen2", small("qwen2"), parts_of(true, false, true)});
    cases.push_back({"qwen3", small("qwen3"), parts_of(false, true, true)});
    {  // Qwen3's shape: head_dim 24 x 4 heads = 96 != n_embd 64, GQA 4:1, tied output
        Case q{"qwen3 head_dim 24, tied", small("qwen3"), parts_of(false, true, true)};
        q.cfg.head_dim = 24, q.cfg.n_head_kv = 1, q.cfg.tied_output = true;
        cases.push_back(q);
    }
    {  // Mistral Nemo's shape: a llama whose heads are narrower than n_embd / n_head
        Case m{"llama head_dim 8", small("llama"), parts_of(false, false, false)};
        m.cfg.head_dim = 8;
        cases.push_back(m);
    }
    {  // Phi-3 / Phi-4: fused attn_qkv and ffn_up (gate rows first), GQA
        cases.push_back({"phi3", small("phi3"), parts_of(false, false, true, true)});
    }
    {  // Qwen3 MoE: 6 experts of width 40, 2 per token, Q/K norms
        Case m{"qwen3moe", small("qwen3"), parts_of(false, true, true)};
        m.cfg.arch = "qwen3moe", m.cfg.n_expert = 6, m.cfg.n_expert_used = 2;
        m.cfg.n_ff_exp = 40;
        m.parts.n_expert = 6, m.parts.n_used = 2;
        cases.push_back(m);
    }
    {  // Mixtral: a llama with 4 experts of the FFN's width, 2 per token
        Case m{"mixtral", small("llama"), parts_of(false, false, false)};
        m.cfg.n_expert = 4, m.cfg.n_expert_used = 2;
        m.parts.n_expert = 4, m.parts.n_used = 2;
        cases.push_back(m);
    }
    {  // Gemma: embedding scale, GELU, 256-wide... here 24-wide heads, tied output
        Case g{"gemma", small("gemma"), parts_of(false, false, true)};
        g.cfg.head_dim = 24;
        g.parts.gemma = 1;
        cases.push_back(g);
    }
    {  // Gemma 2: post norms, soft caps small enough to bite, a 4-token window on layer 0
        Case g{"gemma2", small("gemma2"), parts_of(false, false, true)};
        g.cfg.sliding_window = 4, g.cfg.attn_softcap = 3, g.cfg.final_softcap = 2;
        g.parts.gemma = 2, g.parts.window = 4, g.parts.attn_softcap = 3, g.parts.final_softcap = 2;
        cases.push_back(g);
    }
    {  // Gemma 3: Q/K norms, a 5-token window on layers 0-4 (base 10000), layer 5 global with
       // base 1e6 and linear RoPE scaling x8
        Case g{"gemma3", small("gemma3"), parts_of(false, true, true)};
        g.cfg.n_layer = 6, g.cfg.sliding_window = 5, g.cfg.rope_base = 1e6;
        g.cfg.rope_scaling = "linear", g.cfg.rope_factor = 8;
        g.parts.gemma = 3, g.parts.window = 5, g.parts.rope_scale = 1.0 / 8;
        cases.push_back(g);
    }
    // Granite 3: llama with its four multipliers (here: embeddings x3, q.k x0.1 instead of
    // 1/4, block outputs x0.5, logits / 4); granitemoe: the same on Mixtral-style experts.
    for (const char* arch : {"granite", "granitemoe"}) {
        Case g{arch, small(arch), parts_of(false, false, false)};
        g.cfg.granite_embedding_scale = 3, g.cfg.granite_attention_scale = 0.1;
        g.cfg.granite_residual_scale = 0.5, g.cfg.granite_logit_scale = 4;
        g.cfg.tied_output = true;
        g.parts.embd_scale = 3, g.parts.attn_scale = 0.1, g.parts.residual_scale = 0.5;
        g.parts.logit_scale = 0.25;
        if (std::string(arch) == "granitemoe") {
            g.cfg.n_expert = 4, g.cfg.n_expert_used = 2, g.cfg.n_ff_exp = 48;
            g.parts.n_expert = 4, g.parts.n_used = 2;
        }
        cases.push_back(g);
    }
    {  // SmolLM3: layer 3 of 4 has no RoPE, tied output
        Case m{"smollm3", small("smollm3"), parts_of(false, false, false)};
        m.cfg.n_layer = 4, m.cfg.tied_output = true;
        m.parts.nope_step = 4;
        cases.push_back(m);
    }
    {  // BitNet b1.58: NeoX RoPE, norms inside both blocks, the embedding as the output
        Case b{"bitnet", small("bitnet"), parts_of(false, false, true)};
        b.parts.sub_norms = true;
        cases.push_back(b);
    }
    // GLM-4-0414: Q/K/V biases, post norms, fused gate/up, RoPE on the first 8 of 16 dims in
    // consecutive pairs, a multi-token-prediction layer in the file that is not run; also with
    // Q/K/V and their biases fused in attn_qkv.
    for (const bool fused_qkv : {false, true}) {
        Case g{fused_qkv ? "glm4 fused qkv" : "glm4", small("glm4"), parts_of(true, false, false)};
        g.cfg.rope_dims = 8, g.cfg.n_nextn = 1, g.cfg.fused_qkv = fused_qkv;
        g.parts.fused = fused_qkv, g.parts.fused_up = g.parts.post_norms = true;
        g.parts.n_rot = 8;
        cases.push_back(g);
    }
    // EXAONE 3.x: llama with NeoX pairs.
    cases.push_back({"exaone", small("exaone"), parts_of(false, false, true)});
    {  // Seed-OSS: Q/K/V biases, NeoX pairs, the FFN's norm named post_attention_norm
        Case m{"seed_oss", small("seed_oss"), parts_of(true, false, true)};
        m.parts.ffn_norm_renamed = true;
        cases.push_back(m);
    }
    for (const Case& k : cases) {
        CAPTURE(k.what);
        const std::string path = dir.file(k.what + ".gguf");
        synthetic_model_write(k.cfg, path);
        GgufFile f = GgufFile::open(path);
        const ModelConfig c = model_config_from_gguf(f);
        CHECK(c.arch == k.cfg.arch);
        CHECK(c.head_dim == synthetic_head_dim(k.cfg));
        CHECK(c.qk_norm == k.parts.qk_norm);
        CHECK(c.rope_neox == k.parts.neox);
        const auto want = reference_logits(f, c, k.parts, kTokens);
        const auto got = backend_logits(f, kTokens, 9);
        CHECK(rel_diff(got, want) < 2e-5);
        // Not vacuous: dropping the architecture's own part moves the logits far beyond that.
        if (k.parts.biases || k.parts.qk_norm || k.parts.neox) {  // (phi3: NeoX matters)
            RefParts plain;
            plain.neox = !k.parts.neox;
            plain.fused = k.parts.fused, plain.fused_up = k.parts.fused_up;
            plain.post_norms = k.parts.post_norms, plain.n_rot = k.parts.n_rot;
            plain.ffn_norm_renamed = k.parts.ffn_norm_renamed;
            plain.n_expert = k.parts.n_expert, plain.n_used = k.parts.n_used;
            CHECK(rel_diff(reference_logits(f, c, plain, kTokens), want) > 1e-2);
        }
        if (k.parts.qk_norm) {
            RefParts no_norm = k.parts;
            no_norm.qk_norm = false;
            CHECK(rel_diff(reference_logits(f, c, no_norm, kTokens), want) > 1e-2);
        }
        if (k.parts.n_expert > 0) {  // routing matters: one expert, or all of them, differ
            RefParts v = k.parts;
            v.n_used = 1;
            CHECK(rel_diff(reference_logits(f, c, v, kTokens), want) > 1e-3);
            v.n_used = k.parts.n_expert;
            CHECK(rel_diff(reference_logits(f, c, v, kTokens), want) > 1e-3);
        }
        if (k.parts.sub_norms) {  // BitNet's inner norms move the logits
            RefParts v = k.parts;
            v.sub_norms = false;
            CHECK(rel_diff(reference_logits(f, c, v, kTokens), want) > 1e-3);
        }
        if (k.parts.post_norms) {  // GLM-4's post norms and partial RoPE move the logits
            RefParts v = k.parts;
            v.post_norms = false;
            CHECK(rel_diff(reference_logits(f, c, v, kTokens), want) > 1e-3);
            v = k.parts, v.n_rot = 0;
            CHECK(rel_diff(reference_logits(f, c, v, kTokens), want) > 1e-3);
        }
        if (k.parts.nope_step > 0) {  // rotating the NoPE layer too moves the logits
            RefParts v = k.parts;
            v.nope_step = 0;
            CHECK(rel_diff(reference_logits(f, c, v, kTokens), want) > 1e-3);
        }
        if (k.parts.embd_scale > 0) {  // each Granite multiplier moves the logits
            for (double RefParts::*field : {&RefParts::embd_scale, &RefParts::attn_scale,
                                            &RefParts::residual_scale, &RefParts::logit_scale}) {
                RefParts v = k.parts;
                v.*field = field == &RefParts::attn_scale || field == &RefParts::embd_scale ? 0 : 1;
                CHECK(rel_diff(reference_logits(f, c, v, kTokens), want) > 1e-3);
            }
        }
        if (k.parts.gemma) {  // each Gemma part moves the logits
            std::vector<RefParts> variants;
            RefParts v = k.parts;
            v.gemma = 0;  // no embedding scale, SiLU, no post norms, no window
            variants.push_back(v);
            if (k.parts.window > 0) {
                v = k.parts, v.window = 0;
                variants.push_back(v);
            }
            if (k.parts.attn_softcap > 0) {
                v = k.parts, v.attn_softcap = 0;
                variants.push_back(v);
                v = k.parts, v.final_softcap = 0;
                variants.push_back(v);
            }
            if (k.parts.rope_scale != 1.0) {
                v = k.parts, v.rope_scale = 1.0;
                variants.push_back(v);
            }
            for (size_t i = 0; i < variants.size(); ++i) {
                CAPTURE(i);
                CHECK(rel_diff(reference_logits(f, c, variants[i], kTokens), want) > 1e-3);
            }
        }
    }
}

TEST_CASE("phi3 LongRoPE: the long factors past the original context, the short ones within") {
    // Phi-3's shape (every head dim rotates), and Phi-4-mini's: 12 of the 16 rotate (3/4, as
    // its 96 of 128), the factors cover those, tied output.
    for (int64_t rope_dims : {int64_t(0), int64_t(12)}) {
        CAPTURE(rope_dims);
        TempDir dir;
        SyntheticModelConfig cfg = small("phi3");
        cfg.rope_scaling = "longrope", cfg.rope_factor = 16, cfg.rope_orig_ctx = 512;
        cfg.n_ctx = 8192;
        cfg.rope_dims = rope_dims, cfg.tied_output = rope_dims > 0;
        const std::string path = dir.file("phi3-128k.gguf");
        synthetic_model_write(cfg, path);
        GgufFile f = GgufFile::open(path);
        const ModelConfig c = model_config_from_gguf(f);
        REQUIRE(c.rope_factors_long.size() == (rope_dims > 0 ? 6u : 8u));
        CHECK(c.rope_orig_ctx() == 512);
        const double attn_factor = std::sqrt(1 + std::log(16.0) / std::log(512.0));
        CHECK(c.yarn_attn_factor == doctest::Approx(attn_factor).epsilon(1e-6));
        RefParts parts;
        parts.neox = parts.fused = parts.fused_up = true;
        parts.rope_mscale = attn_factor;
        parts.pos0 = 3000;
        parts.n_rot = rope_dims;
        for (int64_t n_ctx : {int64_t(0), int64_t(4096), int64_t(512), int64_t(300)}) {
            CAPTURE(n_ctx);
            const bool long_ctx = (n_ctx == 0 ? 8192 : n_ctx) > 512;
            parts.rope_factors = vector_or_empty(
                f, long_ctx ? "rope_factors_long.weight" : "rope_factors_short.weight");
            const auto want = reference_logits(f, c, parts, kTokens);
            CHECK(rel_diff(backend_logits(f, kTokens, 9, parts.pos0, n_ctx), want) < 2e-5);
            // The other factor set, or no attention factor, is far off: the test sees both.
            RefParts other = parts;
            other.rope_factors = vector_or_empty(
                f, long_ctx ? "rope_factors_short.weight" : "rope_factors_long.weight");
            CHECK(rel_diff(reference_logits(f, c, other, kTokens), want) > 1e-2);
            RefParts unscaled = parts;
            unscaled.rope_mscale = 1.0;
            CHECK(rel_diff(reference_logits(f, c, unscaled, kTokens), want) > 1e-2);
            if (rope_dims > 0) {  // rotating fewer dims is far off too
                RefParts fewer = parts;
                fewer.n_rot = 8;
                CHECK(rel_diff(reference_logits(f, c, fewer, kTokens), want) > 1e-2);
            }
        }
    }
}

TEST_CASE("mixture of experts: a batch of two sequences gives each one's logits alone") {
    // Routing groups the batch's tokens by expert; each token's result must not depend on
    // which other tokens share its experts.
    TempDir dir;
    SyntheticModelConfig cfg = small("qwen3moe");
    cfg.n_expert = 8, cfg.n_expert_used = 3, cfg.n_ff_exp = 32;
    synthetic_model_write(cfg, dir.file("moe.gguf"));
    GgufFile f = GgufFile::open(dir.file("moe.gguf"));
    const std::vector<int32_t> a = {1, 5, 9, 200, 31, 77, 8}, b = {1, 250, 4, 4, 12};
    const auto alone_a = backend_logits(f, a, a.size());
    const auto alone_b = backend_logits(f, b, b.size());
    BackendOptions o;
    o.kv_block_size = 4;
    o.n_kv_blocks = 16;
    o.kv_type_k = o.kv_type_v = KvType::F32;
    auto be = make_cpu_backend(f, o);
    ForwardBatch fb;
    for (int seq = 0; seq < 2; ++seq) {
        const auto& toks = seq == 0 ? a : b;
        for (size_t i = 0; i < toks.size(); ++i) {
            fb.tokens.push_back(toks[i]);
            fb.positions.push_back(int32_t(i));
            fb.seq_index.push_back(seq);
            fb.slots.push_back(int32_t(i));
            fb.logit_rows.push_back(int32_t(fb.tokens.size()) - 1);
        }
    }
    fb.block_tables = {{15, 14}, {3, 2}};
    const size_t V = size_t(be->config().n_vocab);
    std::vector<float> both(fb.logit_rows.size() * V);
    be->forward(fb, both.data());
    // backend_logits ran each alone through the same kind of backend and tables of 4-token
    // blocks; rows must agree (to float summation order inside the shared matmuls).
    double d = 0;
    for (size_t r = 0; r < fb.logit_rows.size(); ++r) {
        const auto& want = r < a.size() ? alone_a[r] : alone_b[r - a.size()];
        for (size_t i = 0; i < V; ++i)
            d = std::max(d, double(std::fabs(both[r * V + i] - want[i])));
    }
    CHECK(d < 1e-4);
}

TEST_CASE("qwen3's per-head norms make Q and K scale-free, head by head") {
    // Scaling one head's rows of attn_q (and one KV head's rows of attn_k) changes nothing
    // after a per-head RMSNorm (up to eps), where a llama would change.
    TempDir dir;
    for (const std::string arch : {"qwen3", "llama"}) {
        CAPTURE(arch);
        const std::string path = dir.file(arch + ".gguf");
        SyntheticModelConfig cfg = small(arch);
        cfg.norm_eps = 1e-10;  // so "up to eps" is below float rounding
        synthetic_model_write(cfg, path);
        std::vector<uint8_t> bytes = read_file_bytes(path);
        GgufFile orig = GgufFile::from_memory(bytes.data(), bytes.size(), "orig.gguf");
        const auto before = backend_logits(orig, kTokens, 14);
        const GgufTensorInfo* q = orig.find_tensor("blk.0.attn_q.weight");
        const GgufTensorInfo* k = orig.find_tensor("blk.1.attn_k.weight");
        const int64_t hd = 64 / 4, n_in = 64;
        std::vector<uint8_t> scaled = bytes;
        auto scale_rows = [&](const GgufTensorInfo* t, int64_t r0, float s) {
            const size_t off = size_t(orig.data_offset() + t->offset);
            auto* p = reinterpret_cast<float*>(scaled.data() + off) + r0 * n_in;
            for (int64_t i = 0; i < hd * n_in; ++i) p[i] *= s;
        };
        scale_rows(q, 2 * hd, 7.0f);  // query head 2 of layer 0
        scale_rows(k, 1 * hd, 0.2f);  // KV head 1 of layer 1
        GgufFile f = GgufFile::from_memory(scaled.data(), scaled.size(), "scaled.gguf");
        const double d = rel_diff(backend_logits(f, kTokens, 14), before);
        if (arch == "qwen3")
            CHECK(d < 1e-5);
        else
            CHECK(d > 1e-2);
    }
}

TEST_CASE("qwen3 load errors name the missing or misshapen norm") {
    TempDir dir;
    const std::string path = dir.file("q3.gguf");
    synthetic_model_write(small("qwen3"), path);
    GgufFile good = GgufFile::open(path);
    // The model rewritten with one norm tensor dropped (dims empty) or reshaped.
    auto error_with = [&](const std::string& name, std::vector<int64_t> dims) {
        return load_error(gguf_rewritten(good, "", nullptr, name, dims));
    };
    CHECK(error_with("blk.1.attn_k_norm.weight", {})
              .find("missing tensor 'blk.1.attn_k_norm.weight'") != std::string::npos);
    CHECK(error_with("blk.0.attn_q_norm.weight", {8})
              .find("'blk.0.attn_q_norm.weight' has shape [8], expected [16]") !=
          std::string::npos);
}

TEST_CASE("kvrun info and run on qwen3, phi3 LongRoPE, gemma3 and qwen3moe models") {
    TempDir dir;
    SyntheticModelConfig q3 = small("qwen3");
    q3.head_dim = 24;
    SyntheticModelConfig phi = small("phi3");
    phi.rope_scaling = "longrope", phi.rope_factor = 16, phi.rope_orig_ctx = 512;
    phi.n_ctx = 8192;
    synthetic_model_write(q3, dir.file("q3.gguf"));
    synthetic_model_write(phi, dir.file("phi.gguf"));
    const std::string bin = kvrun::test::kvrun_binary();
    auto r = kvrun::test::run_command(bin + " info -m " + dir.file("q3.gguf"));
    CHECK(r.exit_code == 0);
    CHECK(r.out.find("qwen3") != std::string::npos);
    CHECK(r.out.find("head_dim              24") != std::string::npos);
    r = kvrun::test::run_command(bin + " info -m " + dir.file("phi.gguf"));
    CHECK(r.exit_code == 0);
    CHECK(r.out.find("longrope (8 pair factors: long past 512 tokens") != std::string::npos);
    SyntheticModelConfig g3 = small("gemma3");
    g3.sliding_window = 8;
    synthetic_model_write(g3, dir.file("g3.gguf"));
    r = kvrun::test::run_command(bin + " info -m " + dir.file("g3.gguf"));
    CHECK(r.out.find("sliding window 8 tokens on 5 of 6 layers") != std::string::npos);
    SyntheticModelConfig moe = small("qwen3moe");
    moe.n_expert = 8, moe.n_expert_used = 2, moe.n_ff_exp = 32;
    synthetic_model_write(moe, dir.file("moe.gguf"));
    r = kvrun::test::run_command(bin + " info -m " + dir.file("moe.gguf"));
    CHECK(r.out.find("experts       8 per layer, 2 per token, width 32") != std::string::npos);
    synthetic_model_write(small("granite"), dir.file("granite.gguf"));
    r = kvrun::test::run_command(bin + " info -m " + dir.file("granite.gguf"));
    CHECK(r.out.find("multipliers   embeddings x12, q.k x0.0625, block outputs x0.22, logits / "
                     "16") != std::string::npos);
    for (const char* m : {"q3.gguf", "phi.gguf", "g3.gguf", "moe.gguf", "granite.gguf"}) {
        CAPTURE(m);
        r = kvrun::test::run_command(bin + " run -m " + dir.file(m) +
                                     " -p 'Once upon' -n 6 --temp 0 -c 256 --device cpu");
        CHECK(r.exit_code == 0);
        CHECK(r.err.find("error") == std::string::npos);
    }
}

TEST_CASE("config errors: gemma3 without its window, a negative soft cap, bad expert counts") {
    TempDir dir;
    synthetic_model_write(small("gemma3"), dir.file("g3.gguf"));
    synthetic_model_write(small("gemma2"), dir.file("g2.gguf"));
    // Rewrites `src` with metadata key `key` dropped (value null) or replaced.
    auto config_error = [&](const std::string& src, const std::string& key,
                            const GgufValue* value) {
        return load_error(gguf_rewritten(GgufFile::open(src), key, value, ""), true);
    };
    CHECK(config_error(dir.file("g3.gguf"), "gemma3.attention.sliding_window", nullptr)
              .find("missing required key 'gemma3.attention.sliding_window'") != std::string::npos);
    // A dense model that says expert_count 0 stays dense; qwen3moe without experts is refused.
    synthetic_model_write(small("llama"), dir.file("dense.gguf"));
    GgufValue zero;
    zero.type = GgufValueType::UINT32;
    zero.data = uint64_t(0);
    CHECK(config_error(dir.file("dense.gguf"), "llama.expert_count", &zero).empty());
    SyntheticModelConfig moe = small("qwen3moe");
    moe.n_expert = 4, moe.n_expert_used = 2;
    synthetic_model_write(moe, dir.file("moe.gguf"));
    CHECK(config_error(dir.file("moe.gguf"), "qwen3moe.expert_count", nullptr)
              .find("missing required key 'qwen3moe.expert_count'") != std::string::npos);
    GgufValue too_many;
    too_many.type = GgufValueType::UINT32;
    too_many.data = uint64_t(9);
    CHECK(config_error(dir.file("moe.gguf"), "qwen3moe.expert_used_count", &too_many)
              .find("expert_used_count 9 must be at most expert_count 4") != std::string::npos);
    GgufValue negative;
    negative.type = GgufValueType::FLOAT32;
    negative.data = -1.0;
    CHECK(config_error(dir.file("g2.gguf"), "gemma2.attn_logit_softcapping", &negative)
              .find("gemma2.attn_logit_softcapping = -1 must be >= 0") != std::string::npos);
    // Granite's four multipliers are required and positive (llama.cpp requires them too).
    synthetic_model_write(small("granite"), dir.file("granite.gguf"));
    CHECK(config_error(dir.file("granite.gguf"), "granite.logit_scale", nullptr)
              .find("missing required key 'granite.logit_scale'") != std::string::npos);
    CHECK(config_error(dir.file("granite.gguf"), "granite.residual_scale", &negative)
              .find("granite.residual_scale = -1 must be positive") != std::string::npos);
}

TEST_CASE("synthetic presets for qwen2.5, qwen3, phi and gemma have the published shapes") {
    const SyntheticModelConfig q06 = synthetic_preset("qwen3-0.6b");
    CHECK(q06.arch == "qwen3");
    CHECK(synthetic_head_dim(q06) == 128);
    CHECK(q06.n_head * synthetic_head_dim(q06) == 2048);  // wider than n_embd 1024
    CHECK(q06.tied_output);
    CHECK_NOTHROW(synthetic_validate(q06));
    const SyntheticModelConfig q8 = synthetic_preset("qwen3-8b");
    CHECK(q8.n_layer == 36);
    CHECK(synthetic_head_dim(q8) == 128);
    const SyntheticModelConfig q25 = synthetic_preset("qwen2.5-7b");
    CHECK(q25.arch == "qwen2");
    CHECK(synthetic_head_dim(q25) == 128);
    CHECK(q25.n_head / q25.n_head_kv == 7);
    for (const char* name : {"phi3-mini", "phi3-mini-128k", "phi4"}) {
        CAPTURE(name);
        const SyntheticModelConfig p = synthetic_preset(name);
        CHECK(p.arch == "phi3");
        CHECK_NOTHROW(synthetic_validate(p));
    }
    CHECK(synthetic_preset("phi3-mini-128k").rope_scaling == "longrope");
    CHECK(synthetic_preset("phi4").n_head_kv == 10);
    {  // Gemma 2 27B's query scale (n_embd / n_head), recognized by its 46 layers; Gemma 3
       // needs its window
        TempDir dir;
        SyntheticModelConfig g = small("gemma2");
        g.n_layer = 46, g.head_dim = 24;
        synthetic_model_write(g, dir.file("g27.gguf"));
        const ModelConfig c = model_config_from_gguf(GgufFile::open(dir.file("g27.gguf")));
        CHECK(c.attn_scale == doctest::Approx(1.0 / std::sqrt(16.0)));
        CHECK(c.is_swa(0));
        CHECK_FALSE(c.is_swa(1));
        CHECK(c.attn_softcap == 50.0f);
        g.n_layer = 42;  // 9B: the head size
        synthetic_model_write(g, dir.file("g9.gguf"));
        CHECK(model_config_from_gguf(GgufFile::open(dir.file("g9.gguf"))).attn_scale ==
              doctest::Approx(1.0 / std::sqrt(24.0)));
    }
    for (const char* name : {"gemma2-2b", "gemma3-1b", "gemma3-4b"}) {
        CAPTURE(name);
        const SyntheticModelConfig g = synthetic_preset(name);
        CHECK(synthetic_head_dim(g) == 256);
        CHECK_NOTHROW(synthetic_validate(g));
    }
    CHECK(synthetic_preset("gemma3-1b").sliding_window == 512);
    for (const char* name : {"granite3-8b", "granite3-3b-a800m"}) {
        CAPTURE(name);
        const SyntheticModelConfig g = synthetic_preset(name);
        CHECK(g.arch.rfind("granite", 0) == 0);
        CHECK(g.tied_output);
        CHECK_NOTHROW(synthetic_validate(g));
    }
    CHECK(synthetic_preset("granite3-3b-a800m").n_expert == 40);
    CHECK_NOTHROW(synthetic_validate(synthetic_preset("smollm3-3b")));
    CHECK(synthetic_preset("phi4-mini").rope_dims == 96);
    CHECK_NOTHROW(synthetic_validate(synthetic_preset("phi4-mini")));
    {  // SmolLM3 rotates every layer but the fourth ones
        TempDir dir;
        synthetic_model_write(small("smollm3"), dir.file("s3.gguf"));
        const ModelConfig c = model_config_from_gguf(GgufFile::open(dir.file("s3.gguf")));
        CHECK(c.uses_rope(0));
        CHECK(c.uses_rope(2));
        CHECK_FALSE(c.uses_rope(3));
        CHECK_FALSE(c.uses_rope(7));
        CHECK(c.uses_rope(8));
    }
    SyntheticModelConfig bad = small("mamba");
    CHECK_THROWS_WITH_AS(synthetic_validate(bad),
                         doctest::Contains("architecture 'mamba' is not one of"), Error);
    bad = small("qwen3");
    bad.head_dim = 7;
    CHECK_THROWS_WITH_AS(synthetic_validate(bad), doctest::Contains("must be even"), Error);
}

TEST_CASE("control vectors join each steered layer's output, as the reference does") {
    TempDir dir;
    SyntheticModelConfig cfg = small("llama");
    cfg.n_layer = 4;
    const std::string path = dir.file("cv-llama.gguf");
    synthetic_model_write(cfg, path);
    const GgufFile f = GgufFile::open(path);
    const ModelConfig c = model_config_from_gguf(f);
    // Two files: layers 1 and 3, and layer 3 again (they add up, times their scales).
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.0f, 0.5f);
    auto direction = [&] {
        std::vector<float> v(size_t(c.n_embd));
        for (float& x : v) x = nd(rng);
        return v;
    };
    const std::vector<float> d1 = direction(), d3 = direction(), e3 = direction();
    auto write_cv = [&](const std::string& name,
                        const std::vector<std::pair<int, std::vector<float>>>& dirs) {
        GgufWriter w;
        w.set_string("general.architecture", "controlvector");
        w.set_string("controlvector.model_hint", "llama");
        w.set_i32("controlvector.layer_count", int32_t(dirs.size()));
        for (const auto& [layer, v] : dirs)
            w.add_tensor(fmt::format("direction.{}", layer), GgmlType::F32, {int64_t(v.size())},
                         v.data(), v.size() * sizeof(float));
        w.write_file(dir.file(name));
        return dir.file(name);
    };
    const std::string a = write_cv("a.gguf", {{1, d1}, {3, d3}}), b = write_cv("b.gguf", {{3, e3}});
    ControlVectorOptions o;
    o.specs = {{a, 1.0f}, {b, -0.5f}};
    RefParts parts = parts_of(false, false, false);
    parts.steer.assign(4, {});
    parts.steer[1] = d1;
    parts.steer[3] = d3;
    for (size_t i = 0; i < e3.size(); ++i) parts.steer[3][i] += -0.5f * e3[i];
    const auto got = backend_logits(f, kTokens, 5, 0, 0, o);
    CHECK(rel_diff(got, reference_logits(f, c, parts, kTokens)) < 1e-4);
    const auto plain = backend_logits(f, kTokens, 5);
    CHECK(rel_diff(got, plain) > 1e-2);  // it does steer
    // Scale 0 is the model itself, bit for bit; a layer range keeps only those layers.
    CHECK(backend_logits(f, kTokens, 5, 0, 0, ControlVectorOptions{{{a, 0.0f}}}) == plain);
    ControlVectorOptions ranged = o;
    ranged.layer_start = 2, ranged.layer_end = 3;
    parts.steer[1].clear();
    CHECK(rel_diff(backend_logits(f, kTokens, 5, 0, 0, ranged),
                   reference_logits(f, c, parts, kTokens)) < 1e-4);
    // Bad files and ranges: one clear error each.
    auto error_of = [&](const ControlVectorOptions& bad) {
        try {
            control_vector_load(bad, c);
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    CHECK(error_of({{{path, 1.0f}}}).find("is not a control vector") != std::string::npos);
    CHECK(error_of({{{write_cv("l0.gguf", {{0, d1}}), 1.0f}}}).find("steers layer 0") !=
          std::string::npos);
    CHECK(error_of({{{write_cv("l9.gguf", {{9, d1}}), 1.0f}}}).find("steers layer 9") !=
          std::string::npos);
    const std::vector<float> short_v(8, 1.0f);
    CHECK(error_of({{{write_cv("short.gguf", {{1, short_v}}), 1.0f}}}).find("must be 64") !=
          std::string::npos);
    ControlVectorOptions bad_range = o;
    bad_range.layer_start = 3, bad_range.layer_end = 1;
    CHECK(error_of(bad_range).find("--control-vector-layer-range 3 1") != std::string::npos);
    // The CLI: run with a control vector differs from run without, and the same flags twice
    // give the same text.
    const std::string bin = kvrun::test::kvrun_binary();
    const std::string args = " -m " + path + " -p 'hello' -n 12 --temp 0 --no-bos --device cpu";
    auto r0 = kvrun::test::run_command(bin + " run" + args);
    auto r1 =
        kvrun::test::run_command(bin + " run" + args + " --control-vector-scaled " + a + " 4");
    REQUIRE_MESSAGE(r1.exit_code == 0, r1.err);
    CHECK(r1.out != r0.out);
    auto bad = kvrun::test::run_command(bin + " run" + args + " --control-vector " + path);
    CHECK(bad.exit_code == 1);
    CHECK(bad.err.find("is not a control vector") != std::string::npos);
}

TEST_CASE(
    "glm4: config, M-RoPE sections as NeoX pairs, fused bias shape; glm4 and seed_oss presets") {
    TempDir dir;
    SyntheticModelConfig cfg = small("glm4");
    cfg.rope_dims = 8, cfg.n_nextn = 1;
    const std::string path = dir.file("glm4.gguf");
    synthetic_model_write(cfg, path);
    GgufFile f = GgufFile::open(path);
    const ModelConfig c = model_config_from_gguf(f);
    CHECK(c.n_layer == 2);  // (block_count 3: the multi-token-prediction layer is not run)
    CHECK(c.n_nextn == 1);
    CHECK(c.post_norms);
    CHECK(c.fused_gate_up);
    CHECK(!c.rope_neox);
    CHECK(c.n_rot == 8);
    // GLM-4.1V's language model carries M-RoPE sections; for text all sections see the same
    // position, which is NeoX RoPE (as llama.cpp's multi-section RoPE rotates).
    std::vector<GgufValue> sections;
    for (int64_t v : {2, 1, 1, 0}) sections.push_back(gguf_make_int(GgufValueType::INT32, v));
    const GgufValue arr = gguf_make_array(GgufValueType::INT32, sections);
    const std::vector<uint8_t> bytes = gguf_rewritten(f, "glm4.rope.dimension_sections", &arr, "");
    GgufFile m = GgufFile::from_memory(bytes.data(), bytes.size(), "glm4-mrope.gguf");
    const ModelConfig cm = model_config_from_gguf(m);
    CHECK(cm.rope_neox);
    RefParts parts = parts_of(true, false, true);
    parts.fused_up = parts.post_norms = true, parts.n_rot = 8;
    const auto want = reference_logits(m, cm, parts, kTokens);
    CHECK(rel_diff(backend_logits(m, kTokens, 9), want) < 2e-5);
    parts.neox = false;
    CHECK(rel_diff(reference_logits(m, cm, parts, kTokens), want) > 1e-2);
    const GgufValue bad = gguf_make_int(GgufValueType::INT32, 4);
    CHECK(load_error(gguf_rewritten(f, "glm4.rope.dimension_sections", &bad, ""), true)
              .find("rope.dimension_sections' must be an integer array") != std::string::npos);
    // A fused Q/K/V bias of the wrong length is refused, naming it.
    cfg.fused_qkv = true;
    synthetic_model_write(cfg, dir.file("fused.gguf"));
    GgufFile fused = GgufFile::open(dir.file("fused.gguf"));
    CHECK(load_error(gguf_rewritten(fused, "", nullptr, "blk.0.attn_qkv.bias", {16}))
              .find("'blk.0.attn_qkv.bias' has shape [16], expected [128]") != std::string::npos);
    // The presets: GLM-4-9B-0414 and GLM-4-32B-0414's published shapes.
    for (const char* name : {"glm4-9b", "glm4-32b"}) {
        CAPTURE(name);
        const SyntheticModelConfig p = synthetic_preset(name);
        CHECK(p.arch == "glm4");
        CHECK(p.n_head_kv == 2);
        CHECK(p.head_dim == 128);
        CHECK(p.rope_dims == 64);
        CHECK(p.n_vocab == 151552);
        CHECK_NOTHROW(synthetic_validate(p));
    }
    CHECK(synthetic_preset("glm4-32b").n_layer == 61);
    CHECK(synthetic_preset("glm4-9b").n_ff == 13696);
    CHECK_NOTHROW(synthetic_validate(synthetic_preset("exaone3.5-7.8b")));
    const SyntheticModelConfig seed = synthetic_preset("seed-oss-36b");
    CHECK(seed.arch == "seed_oss");
    CHECK(seed.n_head * seed.head_dim == 2 * seed.n_embd);
    CHECK_NOTHROW(synthetic_validate(seed));
}
