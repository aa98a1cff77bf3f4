// Synthetic llama-family models: the tensor plan (names, shapes, types, magnitudes),
// parallel deterministic generation into a GgufWriter, and cutting a model to its first L layers.
#include "synthetic_model.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>

#include "gguf_writer.h"
#include "quant.h"
#include "quantize_model.h"
#include "synthetic_fill.h"
#include "synthetic_vocab.h"

namespace kvrun {
namespace {

// One tensor to generate: n_rows = product of dims[1..] rows of dims[0] elements.
struct TensorPlan {
    std::string name;
    GgmlType type = GgmlType::F32;
    std::vector<int64_t> dims;  // ggml order: {n_in, n_out}
    float sigma = 0;
    float mean = 0;
};

int64_t n_rows_of(const std::vector<int64_t>& dims) {
    int64_t r = 1;
    for (size_t i = 1; i < dims.size(); ++i) r *= dims[i];
    return r;
}

bool is_k_quant(GgmlType t) {
    return t == GgmlType::Q2_K || t == GgmlType::Q3_K || t == GgmlType::Q4_K ||
           t == GgmlType::Q5_K || t == GgmlType::Q6_K;
}

bool is_gemma(const SyntheticModelConfig& c) {
    return c.arch == "gemma" || c.arch == "gemma2" || c.arch == "gemma3";
}

// Norm weights: F32, 1 + 0.05 * gaussian. Biases (qwen2): F32, 0.5 * gaussian.
constexpr float kNormStd = 0.05f;
constexpr float kBiasStd = 0.5f;

std::vector<TensorPlan> make_plan(const SyntheticModelConfig& c, int64_t n_vocab) {
    const int64_t head_dim = synthetic_head_dim(c), n_embd_kv = head_dim * c.n_head_kv;
    const int64_t n_embd_q = head_dim * c.n_head;
    const float s = c.weight_std;
    std::vector<TensorPlan> p;
    p.push_back({"token_embd.weight", c.type, {c.n_embd, n_vocab}, s, 0});
    const bool glm = c.arch == "glm4moe", ernie = c.arch == "ernie4_5-moe";
    const bool glm4 = c.arch == "glm4";  // (dense: post norms, fused ffn_up)
    const bool llama4 = c.arch == "llama4";  // (experts every moe_step-th layer, a shared one)
    const bool ds2 = c.arch == "deepseek2";
    const bool dots = c.arch == "dots1";  // (GLM 4.5's router and shared experts, no biases)
    // LayerNorms: with biases (phi2, starcoder2) or without (command-r, cohere2); parallel
    // blocks (no ffn_norm); a plain FFN with biases (phi2, starcoder2).
    const bool phi2 = c.arch == "phi2", sc2 = c.arch == "starcoder2";
    const bool cohere = c.arch == "command-r" || c.arch == "cohere2";
    const bool norm_bias = phi2 || sc2, parallel = phi2 || cohere, plain_ffn = phi2 || sc2;
    // A type whose blocks fit rows of n elements: `type`, else Q8_0, else F16.
    auto fit = [](GgmlType t, int64_t n) {
        for (GgmlType u : {t, GgmlType::Q8_0, GgmlType::F16})
            if (n % ggml_type_traits(u).block_elems == 0) return u;
        return GgmlType::F32;
    };
    // Whether layer i has experts (the others a dense FFN).
    auto experts_at = [&](int64_t i) {
        if (c.n_expert == 0) return false;
        if (llama4) return (i + 1) % c.moe_step == 0;
        if (!glm && !ernie && !ds2 && !dots) return true;
        return i >= c.n_layer_dense && (!ernie || (i + 1) % c.moe_step == 0);
    };
    for (int64_t i = 0; i < c.n_layer + (glm || glm4 ? c.n_nextn : 0); ++i) {
        auto nm = [&](const char* what) { return fmt::format("blk.{}.{}.weight", i, what); };
        auto bias = [&](const char* what) { return fmt::format("blk.{}.{}.bias", i, what); };
        const GgmlType more =
            c.k_mix && quant_use_more_bits(i, c.n_layer) ? GgmlType::Q6_K : c.type;
        const float s_out = i >= c.scaled_from ? s * c.residual_scale : s;
        const bool olmo2 = c.arch == "olmo2";  // post norms only, Q/K norms over all heads
        const bool post_only = olmo2 || c.arch == "exaone4";  // (EXAONE's Q/K norms per head)
        if (!post_only) p.push_back({nm("attn_norm"), GgmlType::F32, {c.n_embd}, kNormStd, 1});
        if (norm_bias) p.push_back({bias("attn_norm"), GgmlType::F32, {c.n_embd}, kNormStd, 0});
        const int64_t H = c.n_head, R = c.mla_rank, N = c.mla_nope, P = c.rope_dims;
        if (ds2) {  // latent attention
            const int64_t qw = H * (N + P);
            if (c.mla_q_rank > 0) {
                p.push_back({nm("attn_q_a"), c.type, {c.n_embd, c.mla_q_rank}, s, 0});
                p.push_back({nm("attn_q_a_norm"), GgmlType::F32, {c.mla_q_rank}, kNormStd, 1});
                p.push_back({nm("attn_q_b"), fit(c.type, c.mla_q_rank), {c.mla_q_rank, qw}, s, 0});
            } else {
                p.push_back({nm("attn_q"), c.type, {c.n_embd, qw}, s, 0});
            }
            p.push_back({nm("attn_kv_a_mqa"), c.type, {c.n_embd, R + P}, s, 0});
            p.push_back({nm("attn_kv_a_norm"), GgmlType::F32, {R}, kNormStd, 1});
            if (c.mla_legacy) {
                p.push_back({nm("attn_kv_b"), fit(c.type, R), {R, H * (N + c.mla_v)}, s, 0});
            } else {
                p.push_back({nm("attn_k_b"), fit(c.type, N), {N, R, H}, s, 0});
                p.push_back({nm("attn_v_b"), fit(c.type, R), {R, c.mla_v, H}, s, 0});
            }
        } else if (c.arch == "phi3" || ((glm4 || phi2) && c.fused_qkv)) {  // Q, K, V in one
            p.push_back({nm("attn_qkv"), c.type, {c.n_embd, n_embd_q + 2 * n_embd_kv}, s, 0});
            if (glm4 || phi2)
                p.push_back(
                    {bias("attn_qkv"), GgmlType::F32, {n_embd_q + 2 * n_embd_kv}, kBiasStd, 0});
        } else {
            p.push_back({nm("attn_q"), c.type, {c.n_embd, n_embd_q}, s, 0});
            p.push_back({nm("attn_k"), c.type, {c.n_embd, n_embd_kv}, s, 0});
            p.push_back({nm("attn_v"), more, {c.n_embd, n_embd_kv}, s, 0});
        }
        const bool oai = c.arch == "gpt-oss";
        const bool qwen2moe = c.arch == "qwen2moe";
        // Biases of a few times the projections' output.
        const bool seed = c.arch == "seed_oss";  // (Q/K/V biases; the FFN's norm renamed)
        if (c.arch == "qwen2" || qwen2moe || oai || glm || seed || sc2 ||
            ((glm4 || phi2) && !c.fused_qkv)) {
            p.push_back({bias("attn_q"), GgmlType::F32, {n_embd_q}, kBiasStd, 0});
            p.push_back({bias("attn_k"), GgmlType::F32, {n_embd_kv}, kBiasStd, 0});
            p.push_back({bias("attn_v"), GgmlType::F32, {n_embd_kv}, kBiasStd, 0});
        }
        if (c.arch == "qwen3" || c.arch == "qwen3moe" || c.arch == "gemma3" ||
            c.arch == "exaone4" || dots || (glm && c.glm_qk_norm)) {
            p.push_back({nm("attn_q_norm"), GgmlType::F32, {head_dim}, kNormStd, 1});
            p.push_back({nm("attn_k_norm"), GgmlType::F32, {head_dim}, kNormStd, 1});
        }
        if (olmo2 || c.arch == "olmoe") {
            p.push_back({nm("attn_q_norm"), GgmlType::F32, {n_embd_q}, kNormStd, 1});
            p.push_back({nm("attn_k_norm"), GgmlType::F32, {n_embd_kv}, kNormStd, 1});
        }
        const int64_t n_attn_out = ds2 ? H * c.mla_v : n_embd_q;
        p.push_back({nm("attn_output"), fit(c.type, n_attn_out), {n_attn_out, c.n_embd}, s_out, 0});
        if (oai || plain_ffn)  // output bias
            p.push_back({bias("attn_output"), GgmlType::F32, {c.n_embd}, s_out, 0});
        if (oai)  // sink logits about as large as the scores
            p.push_back({nm("attn_sinks"), GgmlType::F32, {c.n_head}, 1.0f, 0});
        if (c.arch == "gemma2" || c.arch == "gemma3" || post_only || glm4)
            p.push_back({nm("post_attention_norm"), GgmlType::F32, {c.n_embd}, kNormStd, 1});
        if (c.arch == "bitnet") {  // the norms inside the blocks
            p.push_back({nm("attn_sub_norm"), GgmlType::F32, {n_embd_q}, kNormStd, 1});
            p.push_back({nm("ffn_sub_norm"), GgmlType::F32, {c.n_ff}, kNormStd, 1});
        }
        // gpt-oss, GLM 4.5 and Seed-OSS call the FFN's input norm post_attention_norm.
        if (!post_only && !parallel)
            p.push_back({nm(oai || glm || seed ? "post_attention_norm" : "ffn_norm"),
                         GgmlType::F32,
                         {c.n_embd},
                         kNormStd,
                         1});
        if (sc2) p.push_back({bias("ffn_norm"), GgmlType::F32, {c.n_embd}, kNormStd, 0});
        if (experts_at(i)) {  // router and stacked experts
            const int64_t fe = c.n_ff_exp > 0 ? c.n_ff_exp : c.n_ff;
            const GgmlType te = c.expert_type != GgmlType::F32 ? c.expert_type : c.type;
            const GgmlType te_more = c.expert_type != GgmlType::F32 ? c.expert_type : more;
            p.push_back({nm("ffn_gate_inp"), GgmlType::F32, {c.n_embd, c.n_expert}, s, 0});
            p.push_back({nm("ffn_gate_exps"), te, {c.n_embd, fe, c.n_expert}, s, 0});
            p.push_back({nm("ffn_up_exps"), te, {c.n_embd, fe, c.n_expert}, s, 0});
            p.push_back({nm("ffn_down_exps"),
                         ds2 ? fit(te_more, fe) : te_more,
                         {fe, c.n_embd, c.n_expert},
                         s_out,
                         0});
            if (oai) {  // the router's and every expert's biases
                p.push_back({bias("ffn_gate_inp"), GgmlType::F32, {c.n_expert}, s, 0});
                p.push_back({bias("ffn_gate_exps"), GgmlType::F32, {fe, c.n_expert}, s, 0});
                p.push_back({bias("ffn_up_exps"), GgmlType::F32, {fe, c.n_expert}, s, 0});
                p.push_back(
                    {bias("ffn_down_exps"), GgmlType::F32, {c.n_embd, c.n_expert}, s_out, 0});
            }
            if (llama4) {  // one shared expert of the experts' width
                p.push_back({nm("ffn_gate_shexp"), c.type, {c.n_embd, fe}, s, 0});
                p.push_back({nm("ffn_up_shexp"), c.type, {c.n_embd, fe}, s, 0});
                p.push_back({nm("ffn_down_shexp"), more, {fe, c.n_embd}, s_out, 0});
            }
            if (glm || ernie || ds2 || dots) {  // the router's selection bias; the shared experts
                // (around the gates' own size: ERNIE's are probabilities, about 1 / n_expert)
                if (!ds2 || c.expert_gating == 2)
                    p.push_back({bias("exp_probs_b"),
                                 GgmlType::F32,
                                 {c.n_expert},
                                 ernie ? 2.0f / float(c.n_expert) : kBiasStd,
                                 0});
                const int64_t fs = c.n_ff_shexp > 0 ? c.n_ff_shexp : fe * c.n_expert_shared;
                if (fs > 0) {
                    p.push_back({nm("ffn_gate_shexp"), c.type, {c.n_embd, fs}, s, 0});
                    p.push_back({nm("ffn_up_shexp"), c.type, {c.n_embd, fs}, s, 0});
                    p.push_back({nm("ffn_down_shexp"),
                                 ds2 ? fit(more, fs) : more,
                                 {fs, c.n_embd},
                                 s_out,
                                 0});
                }
            }
            if (qwen2moe) {  // one shared expert, scaled by a sigmoid gate of its own
                const int64_t fs = c.n_ff_shexp > 0 ? c.n_ff_shexp : c.n_ff;
                p.push_back({nm("ffn_gate_inp_shexp"), GgmlType::F32, {c.n_embd}, s, 0});
                p.push_back({nm("ffn_gate_shexp"), c.type, {c.n_embd, fs}, s, 0});
                p.push_back({nm("ffn_up_shexp"), c.type, {c.n_embd, fs}, s, 0});
                p.push_back({nm("ffn_down_shexp"), more, {fs, c.n_embd}, s_out, 0});
            }
        } else {
            if (c.arch == "phi3" || glm4) {  // the gate's rows, then up's, in ffn_up
                p.push_back({nm("ffn_up"), c.type, {c.n_embd, 2 * c.n_ff}, s, 0});
            } else if (plain_ffn) {  // no gate; biases
                p.push_back({nm("ffn_up"), c.type, {c.n_embd, c.n_ff}, s, 0});
                p.push_back({bias("ffn_up"), GgmlType::F32, {c.n_ff}, kBiasStd, 0});
                p.push_back({bias("ffn_down"), GgmlType::F32, {c.n_embd}, s_out, 0});
            } else {
                p.push_back({nm("ffn_gate"), c.type, {c.n_embd, c.n_ff}, s, 0});
                p.push_back({nm("ffn_up"), c.type, {c.n_embd, c.n_ff}, s, 0});
            }
            // (DeepSeek V2-Lite's dense width, 10944, is no whole number of K-quant blocks.)
            p.push_back(
                {nm("ffn_down"), ds2 ? fit(more, c.n_ff) : more, {c.n_ff, c.n_embd}, s_out, 0});
        }
        if (c.arch == "gemma2" || c.arch == "gemma3" || post_only || glm4)
            p.push_back({nm("post_ffw_norm"), GgmlType::F32, {c.n_embd}, kNormStd, 1});
    }
    p.push_back({"output_norm.weight", GgmlType::F32, {c.n_embd}, kNormStd, 1});
    if (norm_bias) p.push_back({"output_norm.bias", GgmlType::F32, {c.n_embd}, kNormStd, 0});
    // (BitNet's and Cohere's are always tied)
    if (!c.tied_output && !is_gemma(c) && c.arch != "bitnet" && !cohere)
        p.push_back({"output.weight", c.output_type, {c.n_embd, n_vocab}, s, 0});
    if (phi2) p.push_back({"output.bias", GgmlType::F32, {n_vocab}, kBiasStd, 0});
    return p;
}

// llama.cpp's general.file_type for the weight type (or mix).
uint32_t file_type_of(const SyntheticModelConfig& c) {
    switch (c.type) {
        case GgmlType::F32:
            return 0;
        case GgmlType::F16:
            return 1;
        case GgmlType::Q4_0:
            return 2;
        case GgmlType::Q4_1:
            return 3;
        case GgmlType::Q8_0:
            return 7;
        case GgmlType::Q5_0:
            return 8;
        case GgmlType::Q5_1:
            return 9;
        case GgmlType::Q2_K:
            return 10;
        case GgmlType::Q3_K:
            return 11;
        case GgmlType::Q4_K:
            return c.k_mix ? 15 : 14;
        case GgmlType::Q5_K:
            return c.k_mix ? 17 : 16;
        case GgmlType::Q6_K:
            return 18;
        case GgmlType::IQ4_NL:
            return 25;
        case GgmlType::IQ4_XS:
            return 30;
        case GgmlType::BF16:
            return 32;
        case GgmlType::MXFP4:
            return 38;  // llama.cpp's MXFP4_MOE
        case GgmlType::TQ1_0:
            return 36;
        case GgmlType::TQ2_0:
            return 37;
        case GgmlType::NVFP4:
            return 39;
        case GgmlType::Q1_0:
            return 40;
        default:
            return 0;
    }
}

// Runs fn(begin, end) over [0, n) in chunks of `chunk` on n_threads threads; rethrows the
// first exception.
template <typename Fn>
void parallel_for(int64_t n, int64_t chunk, int n_threads, Fn fn) {
    std::atomic<int64_t> next{0};
    std::exception_ptr error;
    std::mutex error_mutex;
    auto worker = [&] {
        try {
            for (int64_t b; (b = next.fetch_add(chunk)) < n;) fn(b, std::min(n, b + chunk));
        } catch (...) {
            std::lock_guard<std::mutex> lock(error_mutex);
            if (!error) error = std::current_exception();
            next = n;
        }
    };
    const int t = int(std::clamp<int64_t>((n + chunk - 1) / chunk, 1, n_threads));
    std::vector<std::thread> threads;
    for (int i = 1; i < t; ++i) threads.emplace_back(worker);
    worker();
    for (auto& th : threads) th.join();
    if (error) std::rethrow_exception(error);
}

void set_tokenizer(GgufWriter& w, const SyntheticModelConfig& c, int64_t& n_vocab) {
    if (!c.vocab_from.empty()) {
        GgufFile src = GgufFile::open(c.vocab_from);
        const GgufValue* tokens = src.find("tokenizer.ggml.tokens");
        if (!tokens || tokens->type != GgufValueType::ARRAY)
            fail("{}: no tokenizer.ggml.tokens array to copy (--vocab-from)", c.vocab_from);
        n_vocab = int64_t(tokens->as_array().size());
        for (const auto& [key, value] : src.metadata())
            if (key.rfind("tokenizer.", 0) == 0) w.set_value(key, value);
        return;
    }
    SpmVocab v = synthetic_spm_vocab(c.n_vocab);
    n_vocab = c.n_vocab;
    w.set_string("tokenizer.ggml.model", "llama");
    w.set_array_str("tokenizer.ggml.tokens", v.tokens);
    w.set_array_f32("tokenizer.ggml.scores", v.scores);
    w.set_array_i32("tokenizer.ggml.token_type", v.token_types);
    w.set_u32("tokenizer.ggml.bos_token_id", uint32_t(v.bos_id));
    w.set_u32("tokenizer.ggml.eos_token_id", uint32_t(v.eos_id));
    w.set_u32("tokenizer.ggml.unknown_token_id", uint32_t(v.unk_id));
    w.set_bool("tokenizer.ggml.add_bos_token", true);
    w.set_bool("tokenizer.ggml.add_eos_token", false);
}

void set_hparams(GgufWriter& w, const SyntheticModelConfig& c, int64_t n_vocab) {
    const bool quantized =
        !(c.type == GgmlType::F32 || c.type == GgmlType::F16 || c.type == GgmlType::BF16);
    const std::string a = c.arch + ".";
    const int64_t head_dim = synthetic_head_dim(c);
    w.set_string("general.architecture", c.arch);
    w.set_string("general.name", fmt::format("synthetic {} {}{}", c.name, ggml_type_name(c.type),
                                             c.k_mix ? "_M" : ""));
    w.set_u32("general.file_type", file_type_of(c));
    if (quantized) w.set_u32("general.quantization_version", 2);
    w.set_u32(a + "context_length", uint32_t(c.n_ctx));
    w.set_u32(a + "embedding_length", uint32_t(c.n_embd));
    const bool nextn = c.arch == "glm4moe" || c.arch == "glm4";
    w.set_u32(a + "block_count", uint32_t(c.n_layer + (nextn ? c.n_nextn : 0)));
    w.set_u32(a + "feed_forward_length", uint32_t(c.n_ff));
    w.set_u32(a + "rope.dimension_count", uint32_t(c.rope_dims > 0 ? c.rope_dims : head_dim));
    w.set_u32(a + "attention.head_count", uint32_t(c.n_head));
    const bool ds2 = c.arch == "deepseek2";
    w.set_u32(a + "attention.head_count_kv",
              uint32_t(ds2 ? (c.mla_legacy ? c.n_head : 1) : c.n_head_kv));
    if (ds2) {
        const int64_t k_mla = c.mla_nope + c.rope_dims;
        w.set_u32(a + "attention.kv_lora_rank", uint32_t(c.mla_rank));
        if (c.mla_q_rank > 0) w.set_u32(a + "attention.q_lora_rank", uint32_t(c.mla_q_rank));
        w.set_u32(a + "attention.key_length",
                  uint32_t(c.mla_legacy ? k_mla : c.mla_rank + c.rope_dims));
        w.set_u32(a + "attention.value_length", uint32_t(c.mla_legacy ? c.mla_v : c.mla_rank));
        if (!c.mla_legacy) {
            w.set_u32(a + "attention.key_length_mla", uint32_t(k_mla));
            w.set_u32(a + "attention.value_length_mla", uint32_t(c.mla_v));
        }
        w.set_u32(a + "leading_dense_block_count", uint32_t(c.n_layer_dense));
        w.set_u32(a + "expert_shared_count", uint32_t(c.n_expert_shared));
        w.set_f32(a + "expert_weights_scale", float(c.expert_weights_scale));
        w.set_bool(a + "expert_weights_norm", c.expert_weights_norm);
        w.set_u32(a + "expert_gating_func", uint32_t(c.expert_gating));
        if (c.yarn_log_mul != 0)
            w.set_f32(a + "rope.scaling.yarn_log_multiplier", float(0.1 * c.yarn_log_mul));
    } else if (c.head_dim > 0) {
        w.set_u32(a + "attention.key_length", uint32_t(head_dim));
        w.set_u32(a + "attention.value_length", uint32_t(head_dim));
    }
    w.set_f32(a + "rope.freq_base", float(c.rope_base));
    const bool layer_norm =
        c.arch == "phi2" || c.arch == "starcoder2" || c.arch == "command-r" || c.arch == "cohere2";
    w.set_f32(
        a + (layer_norm ? "attention.layer_norm_epsilon" : "attention.layer_norm_rms_epsilon"),
        float(c.norm_eps));
    w.set_u32(a + "vocab_size", uint32_t(n_vocab));
    if (c.rope_scaling == "linear" || c.rope_scaling == "yarn") {
        w.set_string(a + "rope.scaling.type", c.rope_scaling);
        w.set_f32(a + "rope.scaling.factor", float(c.rope_factor));
        if (c.rope_scaling == "yarn")
            w.set_u32(a + "rope.scaling.original_context_length", uint32_t(c.rope_orig_ctx));
    } else if (c.rope_scaling == "longrope") {  // Phi-3 128K: the converter's attention factor
        w.set_u32(a + "rope.scaling.original_context_length", uint32_t(c.rope_orig_ctx));
        const double scale = double(c.n_ctx) / double(c.rope_orig_ctx);
        if (scale > 1)
            w.set_f32(a + "rope.scaling.attn_factor",
                      float(std::sqrt(1 + std::log(scale) / std::log(double(c.rope_orig_ctx)))));
    }
    if (c.n_expert > 0) {
        w.set_u32(a + "expert_count", uint32_t(c.n_expert));
        w.set_u32(a + "expert_used_count", uint32_t(c.n_expert_used));
        if (c.n_ff_exp > 0) w.set_u32(a + "expert_feed_forward_length", uint32_t(c.n_ff_exp));
    }
    if (c.arch == "granite" || c.arch == "granitemoe") {
        w.set_f32(a + "embedding_scale", float(c.granite_embedding_scale));
        w.set_f32(a + "attention.scale",
                  float(c.granite_attention_scale > 0 ? c.granite_attention_scale
                                                      : 1.0 / double(head_dim)));
        w.set_f32(a + "residual_scale", float(c.granite_residual_scale));
        w.set_f32(a + "logit_scale", float(c.granite_logit_scale));
    }
    if (c.arch == "gemma2") {
        w.set_u32(a + "attention.sliding_window",
                  uint32_t(c.sliding_window > 0 ? c.sliding_window : 4096));
        w.set_f32(a + "attn_logit_softcapping", float(c.attn_softcap));
        w.set_f32(a + "final_logit_softcapping", float(c.final_softcap));
    } else if (c.arch == "gemma3") {
        w.set_u32(a + "attention.sliding_window",
                  uint32_t(c.sliding_window > 0 ? c.sliding_window : 1024));
    } else if (c.arch == "gpt-oss") {
        w.set_u32(a + "attention.sliding_window",
                  uint32_t(c.sliding_window > 0 ? c.sliding_window : 128));
    } else if ((c.arch == "olmo2" || c.arch == "exaone4") && c.sliding_window > 0) {
        // OLMo 3 (3 layers of 4); EXAONE 4.0 (read at 64 layers only)
        w.set_u32(a + "attention.sliding_window", uint32_t(c.sliding_window));
    }
    if (c.arch == "glm4moe" || c.arch == "dots1") {
        w.set_u32(a + "leading_dense_block_count", uint32_t(c.n_layer_dense));
        w.set_u32(a + "expert_shared_count", uint32_t(c.n_expert_shared));
        w.set_f32(a + "expert_weights_scale", float(c.expert_weights_scale));
        w.set_bool(a + "expert_weights_norm", c.expert_weights_norm);
        w.set_u32(a + "expert_gating_func", 2);  // sigmoid
        w.set_u32(a + "nextn_predict_layers", uint32_t(c.n_nextn));
    }
    if (c.arch == "llama4") {  // (sliding_window 0: the default chunk, 8192)
        w.set_u32(a + "interleave_moe_layer_step", uint32_t(c.moe_step));
        if (c.sliding_window > 0)
            w.set_u32(a + "attention.sliding_window", uint32_t(c.sliding_window));
    }
    if (c.arch == "command-r" || c.arch == "cohere2")
        w.set_f32(a + "logit_scale", 0.0625f);  // (Command-R's; it multiplies the logits)
    if (c.arch == "cohere2")                    // on three layers of four
        w.set_u32(a + "attention.sliding_window",
                  uint32_t(c.sliding_window > 0 ? c.sliding_window : 4096));
    if (c.arch == "glm4" && c.n_nextn > 0)
        w.set_u32(a + "nextn_predict_layers", uint32_t(c.n_nextn));
    if (c.arch == "ernie4_5-moe") {
        w.set_u32(a + "leading_dense_block_count", uint32_t(c.n_layer_dense));
        w.set_u32(a + "interleave_moe_layer_step", uint32_t(c.moe_step));
        w.set_u32(a + "expert_shared_count", uint32_t(c.n_expert_shared));
        const int64_t fs =
            c.n_ff_shexp > 0 ? c.n_ff_shexp : (c.n_ff_exp > 0 ? c.n_ff_exp : c.n_ff) * c.n_expert_shared;
        if (fs > 0) w.set_u32(a + "expert_shared_feed_forward_length", uint32_t(fs));
    }
    if (c.n_group > 0) {
        w.set_u32(a + "expert_group_count", uint32_t(c.n_group));
        w.set_u32(a + "expert_group_used_count", uint32_t(c.n_group_used));
    }
    if (c.arch == "qwen2moe")
        w.set_u32(a + "expert_shared_feed_forward_length",
                  uint32_t(c.n_ff_shexp > 0 ? c.n_ff_shexp : c.n_ff));
    // Provenance, so a benchmark report can say what it ran on.
    w.set_u64("kvrun.synthetic.seed", c.seed);
    w.set_f32("kvrun.synthetic.weight_std", c.weight_std);
    w.set_bool("kvrun.synthetic.exact", c.exact);
    w.set_f32("kvrun.synthetic.residual_scale", c.residual_scale);
    w.set_u32("kvrun.synthetic.scaled_from", uint32_t(c.scaled_from));
}

uint64_t file_size_of(const std::string& path) {
    std::error_code ec;
    auto n = std::filesystem::file_size(path, ec);
    return ec ? 0 : uint64_t(n);
}

}  // namespace

std::vector<float> llama3_rope_factors(int64_t n_rot, double base, double factor,
                                       double low_freq_factor, double high_freq_factor,
                                       int64_t orig_ctx) {
    const double low_wavelen = double(orig_ctx) / low_freq_factor;
    const double high_wavelen = double(orig_ctx) / high_freq_factor;
    std::vector<float> out(size_t(n_rot / 2));
    for (int64_t i = 0; i < n_rot / 2; ++i) {
        const double freq = std::pow(base, -2.0 * double(i) / double(n_rot));
        const double wavelen = 2.0 * M_PI / freq;
        double divisor = 1.0;
        if (wavelen > low_wavelen) {
            divisor = factor;
        } else if (wavelen >= high_wavelen) {
            const double smooth = (double(orig_ctx) / wavelen - low_freq_factor) /
                                  (high_freq_factor - low_freq_factor);
            divisor = 1.0 / ((1.0 - smooth) / factor + smooth);
        }
        out[size_t(i)] = float(divisor);
    }
    return out;
}

int64_t synthetic_head_dim(const SyntheticModelConfig& cfg) {
    return cfg.head_dim > 0 ? cfg.head_dim : cfg.n_embd / std::max<int64_t>(1, cfg.n_head);
}

void synthetic_set_type(SyntheticModelConfig& cfg, std::string_view type_name) {
    std::string up(type_name);
    for (char& ch : up) ch = char(std::toupper(uint8_t(ch)));
    cfg.k_mix = false;
    if (up == "Q4_K_M" || up == "Q5_K_M") {
        cfg.k_mix = true;
        up = up.substr(0, 4);
    }
    static const GgmlType kTypes[] = {
        GgmlType::F32,   GgmlType::F16,   GgmlType::BF16,  GgmlType::Q8_0,   GgmlType::Q4_0,
        GgmlType::Q4_1,  GgmlType::Q5_0,  GgmlType::Q5_1,  GgmlType::Q2_K,   GgmlType::Q3_K,
        GgmlType::Q4_K,  GgmlType::Q5_K,  GgmlType::Q6_K,  GgmlType::IQ4_NL, GgmlType::IQ4_XS,
        GgmlType::MXFP4, GgmlType::NVFP4, GgmlType::TQ1_0, GgmlType::TQ2_0,  GgmlType::Q1_0};
    for (GgmlType t : kTypes) {
        if (up == ggml_type_name(t)) {
            cfg.type = t;
            // The K-quant, ternary and binary files keep a Q6_K output (llama-quantize's rule).
            const bool lowbit = t == GgmlType::TQ1_0 || t == GgmlType::TQ2_0 || t == GgmlType::Q1_0;
            cfg.output_type = is_k_quant(t) || lowbit ? GgmlType::Q6_K : t;
            return;
        }
    }
    throw Error(fmt::format("unknown synthetic model type '{}'", type_name),
                "use F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, "
                "Q6_K, IQ4_NL, IQ4_XS, MXFP4, NVFP4, TQ1_0, TQ2_0, Q1_0, Q4_K_M or Q5_K_M");
}

void synthetic_validate(const SyntheticModelConfig& c) {
    auto positive = [](const char* what, int64_t v, int64_t max) {
        if (v < 1 || v > max)
            fail("synthetic model: {} = {} is out of range [1, {}]", what, v, max);
    };
    positive("n_layer", c.n_layer, 1024);
    positive("n_embd", c.n_embd, 1 << 20);
    positive("n_head", c.n_head, 1 << 16);
    positive("n_head_kv", c.n_head_kv, 1 << 16);
    positive("n_ff", c.n_ff, 1 << 22);
    positive("n_ctx", c.n_ctx, int64_t(1) << 31);
    if (c.vocab_from.empty()) positive("n_vocab", c.n_vocab, int64_t(1) << 24);
    static const std::vector<std::string> kArchNames = {
        "llama",   "qwen2",     "qwen3",    "qwen3moe",     "qwen2moe",   "phi3",
        "gemma",   "gemma2",    "gemma3",   "granite",      "granitemoe", "smollm3",
        "gpt-oss", "glm4moe",   "ernie4_5", "ernie4_5-moe", "olmo2",      "olmoe",
        "exaone4", "deepseek2", "bitnet",   "glm4",         "seed_oss",   "llama4",
        "dots1",   "exaone",    "phi2",     "starcoder2",   "command-r",  "cohere2"};
    if (std::find(kArchNames.begin(), kArchNames.end(), c.arch) == kArchNames.end())
        fail("synthetic model: architecture '{}' is not one of {}", c.arch,
             fmt::join(kArchNames, ", "));
    const bool moe_arch = c.arch == "qwen3moe" || c.arch == "qwen2moe" || c.arch == "granitemoe" ||
                          c.arch == "gpt-oss" || c.arch == "glm4moe" || c.arch == "ernie4_5-moe" ||
                          c.arch == "olmoe" || c.arch == "deepseek2" || c.arch == "llama4" ||
                          c.arch == "dots1";
    if (moe_arch != (c.n_expert > 0) && c.arch != "llama")
        fail(
            "synthetic model: experts need arch qwen3moe, qwen2moe, granitemoe, gpt-oss, glm4moe, "
            "ernie4_5-moe, olmoe, deepseek2, llama4, dots1 or llama (Mixtral), and those but llama "
            "need "
            "experts");
    if (c.arch == "deepseek2" &&
        (c.mla_rank < 1 || c.mla_nope < 1 || c.mla_v < 1 || c.mla_q_rank < 0 || c.rope_dims < 2 ||
         c.rope_dims % 2 != 0 || c.n_layer_dense < 0 || c.n_layer_dense > c.n_layer ||
         c.n_expert_shared < 0 || (c.expert_gating != 1 && c.expert_gating != 2) ||
         !(c.expert_weights_scale > 0)))
        fail(
            "synthetic model: deepseek2 needs a latent rank, nope, value and (even) rope dims, "
            "0 <= dense layers <= n_layer, shared experts >= 0, expert gating 1 or 2 and a "
            "positive expert weights scale");
    if (c.n_group > 0 &&
        (c.n_expert % c.n_group != 0 || c.n_group_used < 1 || c.n_group_used > c.n_group ||
         c.n_expert_used > c.n_group_used * (c.n_expert / c.n_group)))
        fail("synthetic model: {} expert groups ({} used) do not fit {} experts, {} per token",
             c.n_group, c.n_group_used, c.n_expert, c.n_expert_used);
    if (c.arch == "ernie4_5-moe" && (c.n_layer_dense < 0 || c.n_layer_dense > c.n_layer ||
                                     c.moe_step < 1 || c.n_expert_shared < 0 || c.n_ff_shexp < 0))
        fail(
            "synthetic model: ernie4_5-moe needs 0 <= dense layers <= n_layer, a MoE layer step "
            ">= 1 and shared experts >= 0");
    if (c.arch == "glm4moe" &&
        (c.n_layer_dense < 0 || c.n_layer_dense > c.n_layer || c.n_expert_shared < 0 ||
         c.n_nextn < 0 || c.n_nextn > 8 || !(c.expert_weights_scale > 0)))
        fail(
            "synthetic model: glm4moe needs 0 <= dense layers <= n_layer, shared experts >= 0, "
            "0 <= nextn layers <= 8 and a positive expert weights scale");
    if (c.arch == "llama4" && c.moe_step < 1)
        fail("synthetic model: llama4 needs a MoE layer step >= 1");
    if (c.arch == "glm4" && (c.n_nextn < 0 || c.n_nextn > 8))
        fail("synthetic model: glm4 needs 0 <= nextn layers <= 8");
    if (c.fused_qkv && c.arch != "glm4" && c.arch != "phi2")
        fail(
            "synthetic model: fused Q/K/V biases are written for glm4 and phi2 only (phi3 always "
            "fuses)");
    if (!(c.granite_embedding_scale > 0) || !(c.granite_residual_scale > 0) ||
        !(c.granite_logit_scale > 0) || !(c.granite_attention_scale >= 0))
        fail("synthetic model: Granite's multipliers must be positive");
    if (c.n_expert > 0 && (c.n_expert_used < 1 || c.n_expert_used > c.n_expert ||
                           c.n_expert > 4096 || c.n_ff_exp < 0))
        fail(
            "synthetic model: {} experts with {} used per token (need 1 <= used <= experts <= "
            "4096)",
            c.n_expert, c.n_expert_used);
    if (c.sliding_window < 0 || !(c.attn_softcap >= 0) || !(c.final_softcap >= 0))
        fail("synthetic model: sliding window and soft caps must be >= 0");
    if (c.head_dim < 0 || c.head_dim > 4096)
        fail("synthetic model: head_dim = {} is out of range [0, 4096]", c.head_dim);
    if (c.head_dim == 0 && c.n_embd % c.n_head != 0)
        fail("synthetic model: n_embd {} is not a multiple of n_head {} (or give --head-dim)",
             c.n_embd, c.n_head);
    const int64_t head_dim = synthetic_head_dim(c);
    if (head_dim % 2 != 0) fail("synthetic model: head_dim {} must be even for RoPE", head_dim);
    if (c.n_head % c.n_head_kv != 0)
        fail("synthetic model: n_head {} is not a multiple of n_head_kv {}", c.n_head, c.n_head_kv);
    if (!(c.rope_base > 0) || !(c.norm_eps > 0) || !(c.weight_std >= 0) || !(c.residual_scale >= 0))
        fail(
            "synthetic model: rope base, norm eps, weight std and residual scale must be "
            "positive (got {}, {}, {}, {})",
            c.rope_base, c.norm_eps, c.weight_std, c.residual_scale);
    if (c.scaled_from < 0) fail("synthetic model: --scaled-from must be >= 0");
    if (c.rope_scaling != "none" && c.rope_scaling != "linear" && c.rope_scaling != "yarn" &&
        c.rope_scaling != "llama3" && c.rope_scaling != "longrope")
        fail(
            "synthetic model: rope scaling '{}' is not one of none, linear, yarn, llama3, "
            "longrope",
            c.rope_scaling);
    if (!(c.rope_factor > 0) || c.rope_orig_ctx < 1)
        fail("synthetic model: rope factor {} and original context {} must be positive",
             c.rope_factor, c.rope_orig_ctx);
    const int64_t n_rot = c.rope_dims > 0 ? c.rope_dims : head_dim;
    if (c.rope_dims < 0 || (c.rope_dims > head_dim && c.arch != "deepseek2") || n_rot % 2 != 0)
        fail("synthetic model: rope_dims {} must be even and at most head_dim {}", c.rope_dims,
             head_dim);
    if (!c.rope_freqs.empty() && int64_t(c.rope_freqs.size()) != n_rot / 2)
        fail("synthetic model: {} rope frequency factors for {} rotated dims (expected {})",
             c.rope_freqs.size(), n_rot, n_rot / 2);
    if (c.k_mix && !is_k_quant(c.type)) fail("synthetic model: K-quant mix needs a K-quant type");
    std::vector<GgmlType> types = {c.type, c.output_type};
    if (c.k_mix) types.push_back(GgmlType::Q6_K);
    if (c.expert_type != GgmlType::F32) {
        if (c.n_expert == 0) fail("synthetic model: an expert type needs experts");
        types.push_back(c.expert_type);
    }
    for (GgmlType t : types) {
        if (!synthetic_type_supported(t))
            fail("synthetic model: cannot generate tensors of type {}", ggml_type_name(t));
        const GgmlTypeTraits& tr = ggml_type_traits(t);
        const bool ds2 = c.arch == "deepseek2";  // (its ffn_down falls back, as in llama.cpp)
        for (auto [what, n] :
             {std::pair{"n_embd", c.n_embd}, std::pair{"n_ff", ds2 ? int64_t(0) : c.n_ff},
              std::pair{"n_head * head_dim", c.n_head * head_dim},
              std::pair{"n_ff_exp", ds2              ? int64_t(0)
                                    : c.n_ff_exp > 0 ? c.n_ff_exp
                                                     : c.n_ff}})
            if (n % tr.block_elems != 0)
                throw Error(fmt::format("synthetic model: {} = {} is not a multiple of the {} "
                                        "block size {}",
                                        what, n, tr.name, tr.block_elems),
                            "pick another --type or a width that is a multiple of it");
        if (c.exact && !tr.can_quantize && t != GgmlType::F32 && t != GgmlType::F16 &&
            t != GgmlType::BF16)
            fail("synthetic model: --exact needs a quantizer for {}, which kvrun lacks", tr.name);
    }
}

SyntheticModelStats synthetic_model_write(const SyntheticModelConfig& cfg,
                                          const std::string& path) {
    const auto t0 = std::chrono::steady_clock::now();
    synthetic_validate(cfg);
    const int n_threads =
        cfg.n_threads > 0 ? cfg.n_threads : int(std::max(1u, std::thread::hardware_concurrency()));
    GgufWriter w;
    int64_t n_vocab = 0;
    set_tokenizer(w, cfg, n_vocab);
    set_hparams(w, cfg, n_vocab);

    SyntheticModelStats st;
    for (const TensorPlan& t : make_plan(cfg, n_vocab)) {
        const int64_t n_rows = n_rows_of(t.dims);
        const size_t row_bytes = ggml_row_bytes(t.type, t.dims[0]);
        const size_t bytes = row_bytes * size_t(n_rows);
        std::unique_ptr<uint8_t[]> data(new uint8_t[bytes]);  // [n_rows][row_bytes]
        const uint64_t name_seed = synthetic_seed(cfg.seed, t.name);
        const int64_t chunk = std::max<int64_t>(1, int64_t((size_t(1) << 18) / row_bytes));
        parallel_for(n_rows, chunk, n_threads, [&](int64_t r0, int64_t r1) {
            for (int64_t r = r0; r < r1; ++r)
                synthetic_fill_row(t.type, data.get() + size_t(r) * row_bytes, t.dims[0], t.sigma,
                                   t.mean, synthetic_seed(name_seed, {}, uint64_t(r)), cfg.exact);
        });
        w.add_tensor(t.name, t.type, t.dims, data.get(), bytes);
        st.n_params += t.dims[0] * n_rows;
        ++st.n_tensors;
    }
    const int64_t n_rot = cfg.rope_dims > 0 ? cfg.rope_dims : synthetic_head_dim(cfg);
    std::vector<float> freqs = cfg.rope_freqs;
    if (freqs.empty() && cfg.rope_scaling == "llama3")
        freqs =
            llama3_rope_factors(n_rot, cfg.rope_base, cfg.rope_factor, 1.0, 4.0, cfg.rope_orig_ctx);
    if (cfg.rope_scaling == "longrope") {  // long: 1 up to the factor; short: near 1
        const int64_t half = n_rot / 2;
        std::vector<float> lf(static_cast<size_t>(half)), sf(static_cast<size_t>(half));
        for (int64_t i = 0; i < half; ++i) {
            const double r = half > 1 ? double(i) / double(half - 1) : 0.0;
            lf[size_t(i)] = float(1.0 + (cfg.rope_factor - 1.0) * r * r);
            sf[size_t(i)] = float(1.0 + 0.05 * r);
        }
        for (auto [name, v] : {std::pair{"rope_factors_long.weight", &lf},
                               std::pair{"rope_factors_short.weight", &sf}}) {
            w.add_tensor(name, GgmlType::F32, {half}, v->data(), v->size() * sizeof(float));
            st.n_params += half;
            ++st.n_tensors;
        }
    }
    if (!freqs.empty()) {
        w.add_tensor("rope_freqs.weight", GgmlType::F32, {int64_t(freqs.size())}, freqs.data(),
                     freqs.size() * sizeof(float));
        st.n_params += int64_t(freqs.size());
        ++st.n_tensors;
    }
    w.write_file(path);
    st.n_bytes = file_size_of(path);
    st.seconds = seconds_since(t0);
    return st;
}

SyntheticModelStats synthetic_draft_write(const std::string& src_path, int64_t n_layer,
                                          const std::string& path) {
    const auto t0 = std::chrono::steady_clock::now();
    GgufFile src = GgufFile::open(src_path);
    const std::string arch = src.get_string("general.architecture");
    const std::string count_key = arch + ".block_count";
    const int64_t n_src = src.get_int(count_key);
    if (n_layer < 1 || n_layer > n_src)
        fail("{}: cannot keep {} layers of a {}-layer model", src_path, n_layer, n_src);
    GgufWriter w(uint32_t(src.alignment()));
    for (const auto& [key, value] : src.metadata()) w.set_value(key, value);
    w.set_value(count_key, gguf_make_uint(GgufValueType::UINT32, uint64_t(n_layer)));
    // GLM 4.5: the kept layers are all run (no multi-token-prediction layer at the end), and
    // at most all of them are dense.
    if (src.has(arch + ".nextn_predict_layers"))
        w.set_value(arch + ".nextn_predict_layers", gguf_make_uint(GgufValueType::UINT32, 0));
    if (src.has(arch + ".leading_dense_block_count"))
        w.set_value(arch + ".leading_dense_block_count",
                    gguf_make_uint(GgufValueType::UINT32,
                                   uint64_t(std::min<int64_t>(
                                       n_layer, src.get_int(arch + ".leading_dense_block_count")))));
    w.set_string("general.name",
                 fmt::format("{} (first {} of {} layers)",
                             src.get_string_or("general.name", "model"), n_layer, n_src));
    SyntheticModelStats st;
    for (const GgufTensorInfo& t : src.tensors()) {
        if (t.name.rfind("blk.", 0) == 0) {
            int64_t layer = 0;
            size_t i = 4;
            while (i < t.name.size() && std::isdigit(uint8_t(t.name[i])) && layer <= n_src)
                layer = layer * 10 + (t.name[i++] - '0');
            if (layer >= n_layer) continue;
        }
        w.add_tensor(t.name, t.type, t.dims, t.data, t.n_bytes);
        st.n_params += t.n_elements;
        ++st.n_tensors;
    }
    w.write_file(path);
    st.n_bytes = file_size_of(path);
    st.seconds = seconds_since(t0);
    return st;
}

}  // namespace kvrun
