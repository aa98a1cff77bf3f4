// DeepSeek V2 / V3 (deepseek2), checked against an independent forward pass written here from
// the model's definition (Hugging Face's DeepseekV2Attention): plain float loops, one
// sequence, no cache, no paging, and the latent attention *decompressed* — every head's keys
// [W_UK c, k_pe] and values W_UV c are materialized and attended as ordinary multi-head
// attention — while the backend computes it absorbed over one cached latent row per token.
// Agreement therefore checks the absorption too. Also: Q through its low rank, the softmax
// (V2) and sigmoid-with-bias (V3) routers, expert groups, shared experts, dense leading layers,
// the older attn_kv_b files, the YaRN q.k scale, config and load errors, the presets' shapes.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "arch_test_util.h"
#include "backend.h"
#include "common.h"
#include "cpu_ops.h"
#include "gguf.h"
#include "imatrix.h"
#include "model_config.h"
#include "synthetic_model.h"
#include "test_util.h"

using namespace kvrun;
using namespace kvrun::arch_test;
using kvrun::test::TempDir;

namespace {

// The parts of the definition, each of which a test may drop to show that it matters.
struct Parts {
    bool kv_norm = true;      // RMSNorm of the compressed KV (attn_kv_a_norm)
    bool q_norm = true;       // RMSNorm of Q's low rank (attn_q_a_norm), when there is one
    bool rope = true;         // k_pe and q_pe rotated
    bool groups = true;       // experts chosen within the best expert groups
    bool shared = true;       // the shared experts
    bool select_bias = true;  // exp_probs_b joins the choice (sigmoid router)
    bool norm = true;         // the chosen weights over their sum, as the config says
    bool scale = true;        // times expert_weights_scale
};

// A head's K rows of W_UK ([nope][rank]) and V rows of W_UV ([v][rank]), from attn_k_b /
// attn_v_b ({nope, rank, n_head}, {rank, v, n_head}) or the older attn_kv_b.
struct Decompress {
    std::vector<std::vector<float>> uk, uv;  // [n_head][nope * rank], [n_head][v * rank]
};
Decompress decompression(const GgufFile& f, int64_t l, const ModelConfig& c) {
    const int64_t H = c.n_head, R = c.mla_rank, N = c.mla_nope, V = c.mla_v;
    Decompress d;
    d.uk.assign(size_t(H), std::vector<float>(size_t(N * R)));
    d.uv.assign(size_t(H), std::vector<float>(size_t(V * R)));
    const std::string kv_b = fmt::format("blk.{}.attn_kv_b.weight", l);
    for (int64_t h = 0; h < H; ++h) {
        if (f.find_tensor(kv_b)) {
            const Mat kv = tensor(f, kv_b);  // rows: head h's N K rows, then its V rows
            for (int64_t n = 0; n < N; ++n)
                std::copy(kv.row(h * (N + V) + n), kv.row(h * (N + V) + n) + R,
                          d.uk[size_t(h)].begin() + n * R);
            for (int64_t j = 0; j < V; ++j)
                std::copy(kv.row(h * (N + V) + N + j), kv.row(h * (N + V) + N + j) + R,
                          d.uv[size_t(h)].begin() + j * R);
        } else {
            const Mat kb = tensor(f, fmt::format("blk.{}.attn_k_b.weight", l));  // [h][r][n]
            const Mat vb = tensor(f, fmt::format("blk.{}.attn_v_b.weight", l));  // [h][j][r]
            for (int64_t r = 0; r < R; ++r)
                for (int64_t n = 0; n < N; ++n)
                    d.uk[size_t(h)][size_t(n * R + r)] = kb.row(h * R + r)[n];
            for (int64_t j = 0; j < V; ++j)
                std::copy(vb.row(h * V + j), vb.row(h * V + j) + R,
                          d.uv[size_t(h)].begin() + j * R);
        }
    }
    return d;
}

// The experts token h goes to: (id, weight) pairs.
std::vector<std::pair<int64_t, double>> route(const ModelConfig& c, const Parts& parts,
                                              const std::vector<float>& logit, const Mat* bias) {
    const size_t E = logit.size();
    std::vector<double> gate(E), choose(E);
    const double mx = *std::max_element(logit.begin(), logit.end());
    double z = 0;
    for (float v : logit) z += std::exp(double(v) - mx);
    for (size_t e = 0; e < E; ++e) {
        gate[e] = c.moe_sigmoid ? 1 / (1 + std::exp(-double(logit[e])))
                                : std::exp(double(logit[e]) - mx) / z;
        choose[e] = gate[e] + (bias && parts.select_bias ? bias->data[e] : 0.0);
    }
    if (parts.groups && c.n_group > 1) {  // keep the n_group_used groups with the best top-2 sums
        const size_t per = E / size_t(c.n_group);
        std::vector<std::pair<double, size_t>> score;
        for (size_t g = 0; g < size_t(c.n_group); ++g) {
            std::vector<double> v(choose.begin() + long(g * per),
                                  choose.begin() + long((g + 1) * per));
            std::sort(v.rbegin(), v.rend());
            score.push_back({v[0] + (per > 1 ? v[1] : 0.0), g});
        }
        std::stable_sort(score.begin(), score.end(),
                         [](const auto& a, const auto& b) { return a.first > b.first; });
        for (size_t i = size_t(c.n_group_used); i < score.size(); ++i)
            for (size_t e = score[i].second * per; e < (score[i].second + 1) * per; ++e)
                choose[e] = -INFINITY;
    }
    std::vector<int64_t> ids(E);
    std::iota(ids.begin(), ids.end(), 0);
    std::stable_sort(ids.begin(), ids.end(),
                     [&](int64_t a, int64_t b) { return choose[size_t(a)] > choose[size_t(b)]; });
    ids.resize(size_t(c.n_expert_used));
    double sum = 0;
    for (int64_t e : ids) sum += gate[size_t(e)];
    std::vector<std::pair<int64_t, double>> out;
    for (int64_t e : ids)
        out.push_back({e, gate[size_t(e)] / (parts.norm && c.moe_norm ? sum : 1.0) *
                              (parts.scale ? c.moe_scale : 1.0)});
    return out;
}

std::vector<std::vector<float>> reference_logits(const GgufFile& f, const ModelConfig& c,
                                                 const Parts& parts,
                                                 const std::vector<int32_t>& tokens) {
    const int64_t T = int64_t(tokens.size()), H = c.n_head, R = c.mla_rank, N = c.mla_nope,
                  P = c.n_rot, V = c.mla_v, QW = N + P;
    const Mat embd = tensor(f, "token_embd.weight");
    const Mat out = tensor(f, "output.weight");
    std::vector<std::vector<float>> x(tokens.size());
    for (int64_t t = 0; t < T; ++t)
        x[size_t(t)].assign(embd.row(tokens[size_t(t)]), embd.row(tokens[size_t(t)]) + c.n_embd);
    for (int64_t l = 0; l < c.n_layer; ++l) {
        auto t_ = [&](const char* what) { return tensor(f, fmt::format("blk.{}.{}", l, what)); };
        auto has = [&](const char* what) {
            return f.find_tensor(fmt::format("blk.{}.{}", l, what)) != nullptr;
        };
        const Decompress d = decompression(f, l, c);
        // Per token: each head's query [q_nope, q_pe] and key [k_nope, k_pe], and its value.
        std::vector<std::vector<float>> q(tokens.size()), k(tokens.size()), v(tokens.size());
        for (int64_t t = 0; t < T; ++t) {
            std::vector<float> h = x[size_t(t)];
            rms_normalize(h, 0, c.n_embd, t_("attn_norm.weight").data, c.norm_eps);
            std::vector<float> qt;
            if (has("attn_q_a.weight")) {
                std::vector<float> a = matvec(t_("attn_q_a.weight"), h);
                if (parts.q_norm)
                    rms_normalize(a, 0, int64_t(a.size()), t_("attn_q_a_norm.weight").data,
                                  c.norm_eps);
                qt = matvec(t_("attn_q_b.weight"), a);
            } else {
                qt = matvec(t_("attn_q.weight"), h);
            }
            std::vector<float> kva = matvec(t_("attn_kv_a_mqa.weight"), h);
            std::vector<float> ckv(kva.begin(), kva.begin() + R), kpe(kva.begin() + R, kva.end());
            if (parts.kv_norm)
                rms_normalize(ckv, 0, R, t_("attn_kv_a_norm.weight").data, c.norm_eps);
            if (parts.rope) rotate(kpe, 1, P, P, t, c.rope_freq_base, false, {}, 1.0);
            q[size_t(t)].resize(size_t(H * QW));
            k[size_t(t)].resize(size_t(H * QW));
            v[size_t(t)].resize(size_t(H * V));
            for (int64_t hh = 0; hh < H; ++hh) {
                std::vector<float> qpe(qt.begin() + hh * QW + N, qt.begin() + (hh + 1) * QW);
                if (parts.rope) rotate(qpe, 1, P, P, t, c.rope_freq_base, false, {}, 1.0);
                std::copy(qt.begin() + hh * QW, qt.begin() + hh * QW + N,
                          q[size_t(t)].begin() + hh * QW);
                std::copy(qpe.begin(), qpe.end(), q[size_t(t)].begin() + hh * QW + N);
                for (int64_t n = 0; n < N; ++n) {
                    double s = 0;
                    for (int64_t r = 0; r < R; ++r)
                        s += double(d.uk[size_t(hh)][size_t(n * R + r)]) * ckv[size_t(r)];
                    k[size_t(t)][size_t(hh * QW + n)] = float(s);
                }
                std::copy(kpe.begin(), kpe.end(), k[size_t(t)].begin() + hh * QW + N);
                for (int64_t j = 0; j < V; ++j) {
                    double s = 0;
                    for (int64_t r = 0; r < R; ++r)
                        s += double(d.uv[size_t(hh)][size_t(j * R + r)]) * ckv[size_t(r)];
                    v[size_t(t)][size_t(hh * V + j)] = float(s);
                }
            }
        }
        const Mat wo = t_("attn_output.weight");
        for (int64_t t = 0; t < T; ++t) {  // causal multi-head attention over full-size heads
            std::vector<float> att(size_t(H * V), 0.0f);
            for (int64_t hh = 0; hh < H; ++hh) {
                std::vector<double> p(size_t(t + 1));
                double mx = -INFINITY;
                for (int64_t u = 0; u <= t; ++u) {
                    double s = 0;
                    for (int64_t i = 0; i < QW; ++i)
                        s += double(q[size_t(t)][size_t(hh * QW + i)]) *
                             k[size_t(u)][size_t(hh * QW + i)];
                    p[size_t(u)] = s * double(c.attn_scale);
                    mx = std::max(mx, p[size_t(u)]);
                }
                double z = 0;
                for (double& e : p) z += (e = std::exp(e - mx));
                for (int64_t u = 0; u <= t; ++u)
                    for (int64_t j = 0; j < V; ++j)
                        att[size_t(hh * V + j)] +=
                            float(p[size_t(u)] / z * v[size_t(u)][size_t(hh * V + j)]);
            }
            const std::vector<float> o = matvec(wo, att);
            for (int64_t i = 0; i < c.n_embd; ++i) x[size_t(t)][size_t(i)] += o[size_t(i)];
        }
        for (int64_t t = 0; t < T; ++t) {
            std::vector<float> h = x[size_t(t)];
            rms_normalize(h, 0, c.n_embd, t_("ffn_norm.weight").data, c.norm_eps);
            std::vector<float> y(size_t(c.n_embd), 0.0f);
            if (!has("ffn_gate_inp.weight")) {  // a dense leading layer
                y = swiglu_ffn(t_("ffn_gate.weight"), t_("ffn_up.weight"), t_("ffn_down.weight"),
                               h);
            } else {
                const Mat bias = has("exp_probs_b.bias") ? t_("exp_probs_b.bias") : Mat{};
                const Mat ge = t_("ffn_gate_exps.weight"), ue = t_("ffn_up_exps.weight"),
                          de = t_("ffn_down_exps.weight");
                const int64_t fe = c.n_ff_exp;
                for (auto [e, wt] : route(c, parts, matvec(t_("ffn_gate_inp.weight"), h),
                                          bias.data ? &bias : nullptr)) {
                    const std::vector<float> o = swiglu_ffn(
                        Mat{ge.row(e * fe), ge.n_in, fe}, Mat{ue.row(e * fe), ue.n_in, fe},
                        Mat{de.row(e * c.n_embd), de.n_in, c.n_embd}, h);
                    for (int64_t i = 0; i < c.n_embd; ++i) y[size_t(i)] += float(wt * o[size_t(i)]);
                }
                if (parts.shared) {
                    const std::vector<float> o =
                        swiglu_ffn(t_("ffn_gate_shexp.weight"), t_("ffn_up_shexp.weight"),
                                   t_("ffn_down_shexp.weight"), h);
                    for (int64_t i = 0; i < c.n_embd; ++i) y[size_t(i)] += o[size_t(i)];
                }
            }
            for (int64_t i = 0; i < c.n_embd; ++i) x[size_t(t)][size_t(i)] += y[size_t(i)];
        }
    }
    return output_logits(x, tensor(f, "output_norm.weight").data, out, c.norm_eps);
}

// A small DeepSeek V2-Lite: Q from one matrix, a softmax router whose weights are not
// normalized, two shared experts, one dense layer first.
SyntheticModelConfig small_v2() {
    SyntheticModelConfig c = synthetic_preset("tiny");
    c.arch = "deepseek2";
    c.n_layer = 3, c.n_layer_dense = 1;
    c.n_embd = 64, c.n_head = 4, c.n_head_kv = 4, c.n_ff = 96;
    c.mla_rank = 32, c.mla_nope = 16, c.rope_dims = 8, c.mla_v = 12;
    c.n_expert = 8, c.n_expert_used = 2, c.n_ff_exp = 32, c.n_expert_shared = 2;
    c.expert_weights_norm = false, c.expert_weights_scale = 1.0, c.expert_gating = 1;
    c.n_vocab = 300;
    c.weight_std = 0.3f;
    c.seed = 21;
    return c;
}

// A small DeepSeek V3: Q through a rank-24 bottleneck, a sigmoid router with a selection bias,
// weights normalized and scaled by 2.5, experts from the best 2 of 4 groups.
SyntheticModelConfig small_v3() {
    SyntheticModelConfig c = small_v2();
    c.mla_q_rank = 24;
    c.n_expert_shared = 1;
    c.expert_weights_norm = true, c.expert_weights_scale = 2.5, c.expert_gating = 2;
    c.n_group = 4, c.n_group_used = 2;
    c.seed = 22;
    return c;
}

}  // namespace

TEST_CASE("DeepSeek V2 and V3 match the decompressed reference forward") {
    TempDir dir;
    struct Case {
        const char* name;
        SyntheticModelConfig cfg;
    };
    std::vector<Case> cases = {{"v2", small_v2()}, {"v3", small_v3()}};
    SyntheticModelConfig legacy = small_v2();  // attn_kv_b, the older keys
    legacy.mla_legacy = true;
    cases.push_back({"v2 legacy", legacy});
    SyntheticModelConfig legacy3 = small_v3();
    legacy3.mla_legacy = true;
    cases.push_back({"v3 legacy", legacy3});
    for (const Case& k : cases) {
        CAPTURE(k.name);
        const std::string path = dir.file(fmt::format("{}.gguf", k.name));
        synthetic_model_write(k.cfg, path);
        GgufFile f = GgufFile::open(path);
        const ModelConfig c = model_config_from_gguf(f);
        CHECK(c.mla_rank == 32);
        CHECK(c.mla_nope == 16);
        CHECK(c.mla_v == 12);
        CHECK(c.n_rot == 8);
        CHECK(c.head_dim == 40);  // the cached row: 8 RoPE'd dims, then the rank-32 latent
        CHECK(c.n_kv_head == 1);
        CHECK(c.attn_scale == doctest::Approx(1 / std::sqrt(24.0)));  // per head 16 + 8 dims
        CHECK(c.n_layer_dense == 1);
        CHECK(c.n_ff_shexp == 32 * k.cfg.n_expert_shared);
        CHECK(c.mla_q_rank == k.cfg.mla_q_rank);
        CHECK(c.moe_sigmoid == (k.cfg.expert_gating == 2));
        CHECK(c.moe_norm == k.cfg.expert_weights_norm);
        CHECK(c.n_group == k.cfg.n_group);
        const std::vector<std::vector<float>> ref = reference_logits(f, c, Parts{}, kTokens);
        const std::vector<std::vector<float>> got = backend_logits(f, kTokens, 5);
        CHECK(rel_diff(got, ref) < 2e-5);
        const std::vector<std::vector<float>> all_at_once =
            backend_logits(f, kTokens, kTokens.size());
        CHECK(rel_diff(all_at_once, ref) < 2e-5);
    }
}

TEST_CASE("each part of DeepSeek's definition moves the reference") {
    TempDir dir;
    const std::string path = dir.file("v3.gguf");
    synthetic_model_write(small_v3(), path);
    GgufFile f = GgufFile::open(path);
    const ModelConfig c = model_config_from_gguf(f);
    const std::vector<std::vector<float>> full = reference_logits(f, c, Parts{}, kTokens);
    const std::vector<std::vector<float>> got = backend_logits(f, kTokens, 3);
    REQUIRE(rel_diff(got, full) < 2e-5);
    for (const char* part :
         {"kv_norm", "q_norm", "rope", "groups", "shared", "select_bias", "norm", "scale"}) {
        CAPTURE(part);
        Parts p;
        const std::string s = part;
        if (s == "kv_norm") p.kv_norm = false;
        if (s == "q_norm") p.q_norm = false;
        if (s == "rope") p.rope = false;
        if (s == "groups") p.groups = false;
        if (s == "shared") p.shared = false;
        if (s == "select_bias") p.select_bias = false;
        if (s == "norm") p.norm = false;
        if (s == "scale") p.scale = false;
        CHECK(rel_diff(reference_logits(f, c, p, kTokens), full) > 1e-3);
    }
}

TEST_CASE("expert groups keep the experts of the best groups by their two best scores") {
    // 8 experts in 4 groups of 2; scores picked so that the best single expert (7: 0.9) sits
    // in a group whose pair sum (0.9 + -1) loses to groups 0 (0.5 + 0.4) and 2 (0.45 + 0.44).
    std::vector<float> s = {0.5f, 0.4f, 0.1f, 0.0f, 0.45f, 0.44f, 0.9f, -1.0f};
    cpu::limit_expert_groups(s.data(), 8, 4, 2);
    CHECK(s[0] == 0.5f);
    CHECK(s[1] == 0.4f);
    CHECK(s[4] == 0.45f);
    CHECK(s[5] == 0.44f);
    for (int e : {2, 3, 6, 7}) CHECK(std::isinf(s[size_t(e)]));
    std::vector<float> same = {0.5f, 0.4f, 0.1f, 0.0f};
    cpu::limit_expert_groups(same.data(), 4, 1, 1);  // one group: no limit
    CHECK(same == std::vector<float>{0.5f, 0.4f, 0.1f, 0.0f});
    cpu::limit_expert_groups(same.data(), 4, 2, 2);  // every group used: no limit
    CHECK(same == std::vector<float>{0.5f, 0.4f, 0.1f, 0.0f});
}

TEST_CASE("DeepSeek's YaRN scale goes into q.k, and RoPE keeps its magnitudes") {
    TempDir dir;
    SyntheticModelConfig cfg = small_v2();
    cfg.rope_scaling = "yarn", cfg.rope_factor = 40, cfg.rope_orig_ctx = 4096;
    cfg.yarn_log_mul = 0.707;  // V2-Lite's mscale_all_dim (written as 0.0707)
    const std::string path = dir.file("yarn.gguf");
    synthetic_model_write(cfg, path);
    GgufFile f = GgufFile::open(path);
    ModelConfig c = model_config_from_gguf(f);
    CHECK(c.mla_log_mul == doctest::Approx(0.707).epsilon(1e-5));
    const double m = 1 + 0.1 * 0.707 * std::log(40.0);
    CHECK(c.attn_scale == doctest::Approx(m * m / std::sqrt(24.0)).epsilon(1e-5));
    const RopeParams p = c.rope(nullptr);
    CHECK(p.ext_factor == 1.0f);
    CHECK(p.mscale == 1.0f);
    // --rope-scale 10 (an override) changes the q.k scale with it.
    RopeOverrides o;
    o.freq_scale = 0.1f;
    apply_rope_overrides(c, o);
    const double m10 = 1 + 0.1 * 0.707 * std::log(10.0);
    CHECK(c.attn_scale == doctest::Approx(m10 * m10 / std::sqrt(24.0)).epsilon(1e-5));
    // The backend runs it (no reference for YaRN's ramp here: finite logits).
    const std::vector<std::vector<float>> got = backend_logits(f, kTokens, 4);
    for (const auto& row : got)
        for (float v : row) REQUIRE(std::isfinite(v));
}

TEST_CASE("DeepSeek presets have the published shapes and a small latent cache") {
    const SyntheticModelConfig lite = synthetic_preset("deepseek-v2-lite");
    CHECK(lite.arch == "deepseek2");
    CHECK(lite.n_layer == 27);
    CHECK(lite.n_embd == 2048);
    CHECK(lite.n_head == 16);
    CHECK(lite.mla_rank == 512);
    CHECK(lite.mla_q_rank == 0);
    CHECK(lite.n_expert == 64);
    CHECK(lite.n_expert_used == 6);
    CHECK(lite.n_expert_shared == 2);
    CHECK(lite.n_vocab == 102400);
    const SyntheticModelConfig v3 = synthetic_preset("deepseek-v3");
    CHECK(v3.n_layer == 61);
    CHECK(v3.n_head == 128);
    CHECK(v3.mla_q_rank == 1536);
    CHECK(v3.n_expert == 256);
    CHECK(v3.n_group == 8);
    CHECK(v3.n_group_used == 4);
    CHECK(v3.expert_gating == 2);
    CHECK(v3.expert_weights_scale == 2.5);
    // A cut-down V2-Lite (2 layers, 4 experts, narrow) loads, and its KV cache costs one latent
    // row of 64 + 512 per token and layer for K and one for V, whatever the head count.
    SyntheticModelConfig small = lite;
    small.n_layer = 2, small.n_embd = 256, small.n_ff = 256, small.n_expert = 4,
    small.n_expert_used = 2, small.n_ff_exp = 64, small.n_vocab = 300;
    TempDir dir;
    const std::string path = dir.file("lite.gguf");
    synthetic_model_write(small, path);
    GgufFile f = GgufFile::open(path);
    const ModelConfig c = model_config_from_gguf(f);
    CHECK(c.head_dim == 576);
    CHECK(c.n_kv_head == 1);
    BackendOptions o;
    o.kv_block_size = 16;
    o.kv_type_k = o.kv_type_v = KvType::F16;
    // f16: V reads K's rows, so a block holds layers x tokens x dims x 2 bytes.
    CHECK(kv_v_shares_k(c, KvType::F16, KvType::F16));
    CHECK(kv_block_bytes(c, o) == 2 * 16 * 576 * 2);
    CHECK(kv_bytes_per_token(c, KvType::F16, KvType::F16, 16) == 2 * 576 * 2);
    // q8: V reads K's rows in K's layout too; different K and V types keep two pools.
    o.kv_type_k = o.kv_type_v = KvType::Q8;
    CHECK(kv_v_shares_k(c, KvType::Q8, KvType::Q8));
    CHECK(kv_block_bytes(c, o) == 2 * kv_layer_block_bytes(KvType::Q8, KvRole::K, 1, 16, 576));
    CHECK_FALSE(kv_v_shares_k(c, KvType::F16, KvType::F32));
    o.kv_type_v = KvType::F16;
    CHECK(kv_block_bytes(c, o) == 2 * (kv_layer_block_bytes(KvType::Q8, KvRole::K, 1, 16, 576) +
                                       kv_layer_block_bytes(KvType::F16, KvRole::V, 1, 16, 576)));
    const std::vector<std::vector<float>> got = backend_logits(f, {1, 2, 3, 4, 5}, 3);
    CHECK(got.size() == 5);
}

TEST_CASE("DeepSeek's shared K/V rows survive f16, q8 and a block copied through read/write") {
    TempDir dir;
    const std::string path = dir.file("v2.gguf");
    synthetic_model_write(small_v2(), path);
    GgufFile f = GgufFile::open(path);
    const ModelConfig c = model_config_from_gguf(f);
    const std::vector<std::vector<float>> ref = reference_logits(f, c, Parts{}, kTokens);
    // The prompt's first 8 tokens fill blocks 0 and 1 (4 tokens each); the other 6 run as a
    // second pass. Between the two, block 0 is written out and read into block 9, which the
    // second pass's table uses instead: its logits must not change.
    auto run = [&](KvType t, bool move_block, KvType tv = KvType::F32) {
        BackendOptions o;
        o.kv_block_size = 4;
        o.n_kv_blocks = 16;
        o.n_threads = 2;
        o.kv_type_k = t;
        o.kv_type_v = tv == KvType::F32 ? t : tv;
        auto be = make_cpu_backend(f, o);
        const size_t V = size_t(c.n_vocab);
        std::vector<int32_t> table = {0, 1, 2, 3};
        std::vector<std::vector<float>> out;
        for (size_t start : {size_t(0), size_t(8)}) {
            const size_t end = start == 0 ? 8 : kTokens.size();
            if (start == 8 && move_block) {
                std::vector<uint8_t> bytes(size_t(be->kv_block_io_bytes(KvPool::Main)));
                be->read_kv_block(KvPool::Main, 0, bytes.data());
                be->write_kv_block(KvPool::Main, 9, bytes.data());
                table[0] = 9;
            }
            ForwardBatch b;
            for (size_t i = start; i < end; ++i) {
                b.tokens.push_back(kTokens[i]);
                b.positions.push_back(int32_t(i));
                b.seq_index.push_back(0);
                b.slots.push_back(int32_t(i));
                b.logit_rows.push_back(int32_t(i - start));
                if (be->n_kv_stages() > 0)
                    b.stages.push_back(int32_t(i / 4));  // (q8: one per block)
            }
            b.block_tables = {table};
            std::vector<float> logits((end - start) * V);
            be->forward(b, logits.data());
            for (size_t r = 0; r < end - start; ++r)
                out.emplace_back(logits.begin() + long(r * V), logits.begin() + long((r + 1) * V));
        }
        return out;
    };
    CHECK(rel_diff(run(KvType::F32, false), ref) < 2e-5);
    CHECK(rel_diff(run(KvType::F32, true), ref) < 2e-5);
    CHECK(rel_diff(run(KvType::F16, true), ref) < 5e-3);
    CHECK(rel_diff(run(KvType::Q8, false), ref) < 3e-2);
    CHECK(rel_diff(run(KvType::Q8, true), ref) < 3e-2);
    // q4 (this model's weights are large, so q4 is rough): sharing costs no more than
    // quantizing K and V apart, each alone.
    const double shared_q4 = rel_diff(run(KvType::Q4, true), ref);
    CHECK(shared_q4 < rel_diff(run(KvType::Q4, true, KvType::F16), ref) +
                          rel_diff(run(KvType::F16, true, KvType::Q4), ref));
}

TEST_CASE("an imatrix of DeepSeek sees attn_k_b and attn_v_b head by head") {
    // The absorbed attention multiplies each head's q_nope by its attn_k_b and its latent
    // output by its attn_v_b: the imatrix holds one matrix per head for each (as for experts),
    // attn_k_b's fed layer 0's q_nope of that head. A file with the older attn_kv_b shows
    // neither (attn_kv_b's own input, the latent c, is not what the absorbed heads multiply).
    TempDir dir;
    for (bool legacy : {false, true}) {
        CAPTURE(legacy);
        SyntheticModelConfig cfg = small_v2();
        cfg.mla_legacy = legacy;
        const std::string path = dir.file(legacy ? "legacy.gguf" : "v2.gguf");
        synthetic_model_write(cfg, path);
        GgufFile f = GgufFile::open(path);
        const ModelConfig c = model_config_from_gguf(f);
        BackendOptions o;
        o.kv_block_size = 16;
        o.n_kv_blocks = 2;
        auto be = make_cpu_backend(f, o);
        ImatrixCollector collector(f, false);
        REQUIRE(be->set_matmul_observer([&](const void* w, int64_t n, const float* x,
                                            int64_t rows) { collector.observe(w, n, x, rows); }));
        ForwardBatch b;
        for (size_t i = 0; i < kTokens.size(); ++i) {
            b.tokens.push_back(kTokens[i]);
            b.positions.push_back(int32_t(i));
            b.seq_index.push_back(0);
            b.slots.push_back(int32_t(i));
        }
        b.logit_rows = {int32_t(kTokens.size()) - 1};
        b.block_tables = {{0}};
        std::vector<float> logits(size_t(c.n_vocab));
        be->forward(b, logits.data());
        const Imatrix& im = collector.result();
        CHECK(im.entries.count("blk.0.attn_q.weight") == 1);
        CHECK(im.entries.count("blk.0.attn_kv_a_mqa.weight") == 1);
        if (legacy) {
            for (const auto& [name, e] : im.entries) {
                CAPTURE(name);
                CHECK(name.find("attn_kv_b") == std::string::npos);
                CHECK(name.find("attn_k_b") == std::string::npos);
            }
            continue;
        }
        const double T = double(kTokens.size());
        for (const char* t : {"attn_k_b", "attn_v_b"})
            for (int64_t l = 0; l < c.n_layer; ++l) {
                const std::string name = fmt::format("blk.{}.{}.weight", l, t);
                CAPTURE(name);
                REQUIRE(im.entries.count(name) == 1);
                const Imatrix::Entry& e = im.entries.at(name);
                CHECK(e.n_in == (std::string(t) == "attn_k_b" ? c.mla_nope : c.mla_rank));
                CHECK(e.counts == std::vector<double>(size_t(c.n_head), T));
            }
        // Layer 0's q_nope by hand: the normed embeddings through attn_q.
        const Mat emb = tensor(f, "token_embd.weight"), wq = tensor(f, "blk.0.attn_q.weight");
        const Mat norm = tensor(f, "blk.0.attn_norm.weight");
        const int64_t H = c.n_head, N = c.mla_nope, QW = c.mla_nope + c.n_rot;
        std::vector<double> want(size_t(H * N), 0.0);
        for (int32_t tok : kTokens) {
            std::vector<float> x(emb.row(tok), emb.row(tok) + c.n_embd);
            rms_normalize(x, 0, c.n_embd, norm.data, c.norm_eps);
            const std::vector<float> q = matvec(wq, x);
            for (int64_t h = 0; h < H; ++h)
                for (int64_t n = 0; n < N; ++n)
                    want[size_t(h * N + n)] +=
                        double(q[size_t(h * QW + n)]) * q[size_t(h * QW + n)] / T;
        }
        const std::vector<float> got = im.mean_squares("blk.0.attn_k_b.weight");
        REQUIRE(got.size() == want.size());
        for (size_t i = 0; i < got.size(); ++i)
            CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-4));
    }
}

TEST_CASE("DeepSeek's router without expert_gating_func: softmax, but sigmoid for GLM 4.7 Flash") {
    TempDir dir;
    const std::string path = dir.file("v2.gguf");
    synthetic_model_write(small_v2(), path);
    GgufFile f = GgufFile::open(path);
    const std::vector<uint8_t> no_key =
        gguf_rewritten(f, "deepseek2.expert_gating_func", nullptr, "");
    const GgufFile g = GgufFile::from_memory(no_key.data(), no_key.size(), "v2.gguf");
    CHECK_FALSE(model_config_from_gguf(g).moe_sigmoid);
    // llama.cpp's rule: 47 or 48 layers and a vocabulary of 154880 (config only: the layers'
    // tensors are not read).
    const std::vector<uint8_t> wide = gguf_rewritten(g, "", nullptr, "output.weight", {64, 154880});
    const GgufFile h = GgufFile::from_memory(wide.data(), wide.size(), "wide.gguf");
    const GgufValue layers = gguf_make_uint(GgufValueType::UINT32, 47);
    const std::vector<uint8_t> flash = gguf_rewritten(h, "deepseek2.block_count", &layers, "");
    const ModelConfig c =
        model_config_from_gguf(GgufFile::from_memory(flash.data(), flash.size(), "flash.gguf"));
    CHECK(c.n_layer == 47);
    CHECK(c.n_vocab == 154880);
    CHECK(c.moe_sigmoid);
}

TEST_CASE("DeepSeek files with inconsistent keys or missing tensors are refused by name") {
    TempDir dir;
    const std::string path = dir.file("v3.gguf");
    synthetic_model_write(small_v3(), path);
    GgufFile f = GgufFile::open(path);
    const GgufValue bad_len = gguf_make_uint(GgufValueType::UINT32, 41);
    CHECK(contains(
        load_error(gguf_rewritten(f, "deepseek2.attention.key_length", &bad_len, ""), true),
        "must be kv_lora_rank + rope.dimension_count (40)"));
    CHECK(contains(
        load_error(gguf_rewritten(f, "deepseek2.attention.kv_lora_rank", nullptr, ""), true),
        "missing required key 'deepseek2.attention.kv_lora_rank'"));
    const GgufValue groups = gguf_make_uint(GgufValueType::UINT32, 3);
    CHECK(contains(load_error(gguf_rewritten(f, "deepseek2.expert_group_count", &groups, ""), true),
                   "expert_group_count 3"));
    CHECK(contains(load_error(gguf_rewritten(f, "", nullptr, "blk.1.attn_kv_a_norm.weight")),
                   "missing tensor 'blk.1.attn_kv_a_norm.weight' (expected shape [32])"));
    CHECK(contains(load_error(gguf_rewritten(f, "", nullptr, "blk.2.attn_k_b.weight")),
                   "missing tensor 'blk.2.attn_k_b.weight' (expected shape [16, 32, 4])"));
    CHECK(contains(load_error(gguf_rewritten(f, "", nullptr, "blk.0.attn_q_b.weight", {24, 95})),
                   "blk.0.attn_q_b.weight' has shape [24, 95], expected [24, 96]"));
}
