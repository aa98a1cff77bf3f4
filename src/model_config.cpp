// Reads the typed hyperparameters of a llama-family GGUF model and validates them.
#include "model_config.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "common.h"
#include "quant.h"

namespace kvrun {
namespace {

// Per-architecture facts that are not in the metadata (unnamed fields: false / 0).
struct ArchTraits {
    const char* name;
    bool rope_neox = false;      // NeoX RoPE pairs (i, i + n_rot/2)
    bool qkv_bias = false;       // Q/K/V biases required
    bool qk_norm = false;        // per-head Q/K norms required
    bool fused_gate_up = false;  // ffn_up holds the gate's rows, then up's
    int gemma = 0;               // 0: not Gemma; 1, 2, 3: Gemma generation
    bool granite = false;        // Granite's four multipliers
    bool experts = false;        // a mixture of experts (expert_count required)
    // Every nope_step-th layer skips RoPE (0: none; SmolLM3: layers 3, 7, 11, ...; llama.cpp
    // fixes the step at 4, there is no GGUF key).
    int nope_step = 0;
    bool gpt_oss = false;    // OpenAI's gpt-oss (read_gpt_oss)
    bool glm4moe = false;    // GLM 4.5 (read_shared_moe)
    bool ernie_moe = false;  // ERNIE 4.5 MoE (read_ernie_moe)
    bool olmo2 = false;      // OLMo 2 / OLMo 3 (read_olmo2)
    bool olmoe = false;      // OLMoE (read_olmoe)
    bool exaone4 = false;    // EXAONE 4.0 (read_exaone4)
    bool qwen2moe = false;   // Qwen1.5-MoE / Qwen2-MoE (read_qwen2moe)
    bool deepseek2 = false;  // DeepSeek V2 / V3: latent attention (read_mla, read_deepseek2)
    bool sub_norms = false;  // BitNet's norms inside the blocks (ModelConfig::sub_norms)
    bool glm4 = false;       // GLM-4-0414 (read_glm4)
    bool llama4 = false;     // Llama 4 (read_llama4)
    bool dots1 = false;      // rednote's dots.llm1 (read_shared_moe)
    // The FFN's input norm is named post_attention_norm (ModelConfig::ffn_norm_post_attention).
    bool ffn_norm_post_attention = false;
    bool layer_norm = false;       // LayerNorms (ModelConfig::layer_norm)
    bool parallel_blocks = false;  // attention and FFN side by side (ModelConfig)
    bool ffn_plain = false;        // a plain GELU FFN (ModelConfig::ffn_plain)
    bool cohere = false;           // Cohere's Command-R and Command R7B / A (read_cohere)
};

constexpr ArchTraits kArchs[] = {
    {.name = "llama"},
    {.name = "qwen2", .rope_neox = true, .qkv_bias = true},
    {.name = "qwen3", .rope_neox = true, .qk_norm = true},
    {.name = "qwen3moe", .rope_neox = true, .qk_norm = true, .experts = true},
    {.name = "qwen2moe", .rope_neox = true, .qkv_bias = true, .experts = true, .qwen2moe = true},
    {.name = "phi3", .rope_neox = true, .fused_gate_up = true},
    {.name = "gemma", .rope_neox = true, .gemma = 1},
    {.name = "gemma2", .rope_neox = true, .gemma = 2},
    {.name = "gemma3", .rope_neox = true, .qk_norm = true, .gemma = 3},
    {.name = "granite", .granite = true},
    {.name = "granitemoe", .granite = true, .experts = true},
    {.name = "smollm3", .nope_step = 4},
    {.name = "gpt-oss", .rope_neox = true, .qkv_bias = true, .experts = true, .gpt_oss = true},
    {.name = "glm4moe", .rope_neox = true, .qkv_bias = true, .experts = true, .glm4moe = true},
    {.name = "ernie4_5"},
    {.name = "ernie4_5-moe", .experts = true, .ernie_moe = true},
    {.name = "olmo2", .rope_neox = true, .olmo2 = true},
    {.name = "olmoe", .rope_neox = true, .experts = true, .olmoe = true},
    {.name = "exaone4", .rope_neox = true, .qk_norm = true, .exaone4 = true},
    {.name = "deepseek2", .experts = true, .deepseek2 = true},
    {.name = "bitnet", .rope_neox = true, .sub_norms = true},
    {.name = "glm4", .fused_gate_up = true, .glm4 = true},
    // Seed-OSS: llama with NeoX pairs, optional Q/K/V (and output) biases.
    {.name = "seed_oss", .rope_neox = true, .ffn_norm_post_attention = true},
    // EXAONE 3.0 / 3.5: llama with NeoX pairs and optional biases.
    {.name = "exaone", .rope_neox = true},
    {.name = "llama4", .experts = true, .llama4 = true},
    {.name = "dots1", .rope_neox = true, .qk_norm = true, .experts = true, .dots1 = true},
    // The LayerNorm architectures: Phi-2 (partial NeoX RoPE, biases everywhere); StarCoder2
    // (sequential blocks); Command-R and Command R7B / A (no biases, SwiGLU, consecutive pairs).
    {.name = "phi2",
     .rope_neox = true,
     .layer_norm = true,
     .parallel_blocks = true,
     .ffn_plain = true},
    {.name = "starcoder2", .rope_neox = true, .layer_norm = true, .ffn_plain = true},
    {.name = "command-r", .layer_norm = true, .parallel_blocks = true, .cohere = true},
    {.name = "cohere2", .layer_norm = true, .parallel_blocks = true, .cohere = true},
};

// A positive integer key, either a scalar or an array whose elements are all equal
// (some converters write per-layer arrays); throws naming the key otherwise.
int64_t read_count(const GgufFile& f, const std::string& key, int64_t def, bool required) {
    const GgufValue* v = f.find(key);
    if (!v) {
        if (required) fail("{}: missing required key '{}'", f.path(), key);
        return def;
    }
    int64_t value = 0;
    if (v->type == GgufValueType::ARRAY) {
        const auto& items = v->as_array();
        if (items.empty() || !items[0].is_int())
            fail("{}: key '{}' must be an integer or a non-empty integer array", f.path(), key);
        value = items[0].as_int();
        for (const auto& item : items)
            if (!item.is_int() || item.as_int() != value)
                fail("{}: key '{}' varies per layer, which kvrun does not support", f.path(), key);
    } else if (v->is_int()) {
        value = v->as_int();
    } else {
        fail("{}: key '{}' must be an integer, found {}", f.path(), key,
             gguf_value_type_name(v->type));
    }
    if (value <= 0 || value > (int64_t(1) << 31))
        fail("{}: key '{}' = {} is out of range (expected a positive count)", f.path(), key, value);
    return value;
}

int64_t vocab_size(const GgufFile& f) {
    for (const char* name : {"output.weight", "token_embd.weight"})
        if (const GgufTensorInfo* t = f.find_tensor(name); t && t->dims.size() >= 2)
            return t->dims[1];
    if (const GgufValue* toks = f.find("tokenizer.ggml.tokens");
        toks && toks->type == GgufValueType::ARRAY)
        return static_cast<int64_t>(toks->as_array().size());
    fail("{}: cannot determine the vocabulary size (no token_embd.weight tensor)", f.path());
}

// Per-pair RoPE frequency divisors from tensor `name` ([half] F32/F16/BF16, all positive);
// empty when the model has no such tensor.
std::vector<float> read_rope_factors(const GgufFile& f, const char* name, int64_t half) {
    const GgufTensorInfo* t = f.find_tensor(name);
    if (!t) return {};
    if (t->dims.size() != 1 || t->dims[0] != half)
        fail("{}: {} has shape [{}], expected [{}] (rope.dimension_count / 2)", f.path(), name,
             fmt::join(t->dims, ", "), half);
    if (t->type != GgmlType::F32 && t->type != GgmlType::F16 && t->type != GgmlType::BF16)
        fail("{}: {} is {}, expected F32, F16 or BF16", f.path(), name, ggml_type_name(t->type));
    std::vector<float> v(static_cast<size_t>(half));
    dequantize_row(t->type, t->data, v.data(), half);
    for (int64_t i = 0; i < half; ++i)
        if (!(v[size_t(i)] > 0) || !std::isfinite(v[size_t(i)]))
            fail("{}: {}[{}] = {} must be positive", f.path(), name, i, v[size_t(i)]);
    return v;
}

// rope.scaling.* keys (none, linear, yarn; the old rope.scale_linear) and the rope_freqs.weight
// tensor of Llama 3.1-style models. n_rot and n_ctx_train are read and valid.
void read_rope_scaling(const GgufFile& f, const std::string& a, ModelConfig& c) {
    auto positive = [&](const std::string& key, double def) {
        const double v = f.get_float_or(key, def);
        if (!(v > 0) || !std::isfinite(v)) fail("{}: {} = {} must be positive", f.path(), key, v);
        return v;
    };
    c.rope_scaling = f.get_string_or(a + "rope.scaling.type", "none");
    // The factor (or the older rope.scale_linear); 0 means unset, as in llama.cpp.
    const std::string factor_key =
        f.has(a + "rope.scaling.factor") ? a + "rope.scaling.factor" : a + "rope.scale_linear";
    double factor = f.get_float_or(factor_key, 1.0);
    if (factor == 0.0) factor = 1.0;
    if (!(factor > 0) || !std::isfinite(factor))
        fail("{}: {} = {} must be positive", f.path(), factor_key, factor);
    if (c.rope_scaling == "none" && factor != 1.0 && !f.has(a + "rope.scaling.type"))
        c.rope_scaling = "linear";
    if (c.rope_scaling == "linear" || c.rope_scaling == "yarn") {
        c.rope_freq_scale = float(1.0 / factor);
    } else if (c.rope_scaling != "none") {
        fail("{}: rope scaling type '{}' is not supported (supported: none, linear, yarn)",
             f.path(), c.rope_scaling);
    }
    if (f.has(a + "rope.scaling.original_context_length"))
        c.yarn_n_ctx_orig = read_count(f, a + "rope.scaling.original_context_length", 0, false);
    c.yarn_attn_factor = float(positive(a + "rope.scaling.attn_factor", 1.0));

    c.rope_freq_factors = read_rope_factors(f, "rope_freqs.weight", c.n_rot / 2);
    // Phi-3's LongRoPE: two factor sets, the long one for contexts past the original.
    c.rope_factors_long = read_rope_factors(f, "rope_factors_long.weight", c.n_rot / 2);
    c.rope_factors_short = read_rope_factors(f, "rope_factors_short.weight", c.n_rot / 2);
    if (c.rope_factors_long.empty() != c.rope_factors_short.empty())
        fail("{}: rope_factors_long.weight and rope_factors_short.weight come as a pair", f.path());
    if (!c.rope_factors_long.empty() && !c.rope_freq_factors.empty())
        fail("{}: both rope_freqs.weight and LongRoPE factors; expected one", f.path());
}

// The Gemma family's settings (llama.cpp's reading of the GGUF keys and model sizes).
void read_gemma(const GgufFile& f, const std::string& a, int gen, ModelConfig& c) {
    c.embd_scale = std::sqrt(float(c.n_embd));
    c.ffn_gelu = true;
    if (gen == 1) return;
    c.post_norms = true;
    // The 27B models scale queries by n_embd / n_head rather than the head size (Gemma's
    // query_pre_attn_scalar); llama.cpp recognizes them by their layer count.
    if ((gen == 2 && c.n_layer == 46) || (gen == 3 && c.n_layer == 62))
        c.attn_scale = 1.0f / std::sqrt(float(c.n_embd / c.n_head));
    auto cap = [&](const char* key, double def) {
        const double v = f.get_float_or(a + key, def);
        if (!(v >= 0) || !std::isfinite(v)) fail("{}: {}{} = {} must be >= 0", f.path(), a, key, v);
        return float(v);
    };
    if (gen == 2) {
        c.swa_pattern = 2;
        c.n_swa = read_count(f, a + "attention.sliding_window", 4096, false);
        c.attn_softcap = cap("attn_logit_softcapping", 50.0);
        c.final_softcap = cap("final_logit_softcapping", 30.0);
    } else {
        c.swa_pattern = 6;
        c.n_swa = read_count(f, a + "attention.sliding_window", 0, true);
        c.rope_freq_base_swa = 10000.0f;
    }
}

// IBM Granite's multipliers (llama.cpp requires all four keys): embeddings times
// embedding_scale, q.k times attention.scale, each block's output times residual_scale before
// its residual add, logits divided by logit_scale.
void read_granite(const GgufFile& f, const std::string& a, ModelConfig& c) {
    auto positive = [&](const std::string& key) {
        if (!f.has(a + key)) fail("{}: missing required key '{}{}'", f.path(), a, key);
        const double v = f.get_float_or(a + key, 0.0);
        if (!(v > 0) || !std::isfinite(v))
            fail("{}: {}{} = {} must be positive", f.path(), a, key, v);
        return float(v);
    };
    c.embd_scale = positive("embedding_scale");
    c.attn_scale = positive("attention.scale");
    c.residual_scale = positive("residual_scale");
    c.logit_scale = 1.0f / positive("logit_scale");
}

// A count that may be 0 (absent: 0).
int64_t read_count0(const GgufFile& f, const std::string& key, bool required) {
    const GgufValue* v = f.find(key);
    if (!v) {
        if (required) fail("{}: missing required key '{}'", f.path(), key);
        return 0;
    }
    if (!v->is_int() || v->as_int() < 0 || v->as_int() > (int64_t(1) << 20))
        fail("{}: key '{}' must be a count (an integer from 0)", f.path(), key);
    return v->as_int();
}

// OpenAI's gpt-oss: every other layer (the even ones) attends to a sliding window; each head
// has a learned attention sink; the experts use the clamped SwiGLU (llama.cpp's constants).
void read_gpt_oss(const GgufFile& f, const std::string& a, ModelConfig& c) {
    c.ffn_norm_post_attention = true;
    c.swa_pattern = 2;
    c.n_swa = read_count(f, a + "attention.sliding_window", 0, true);
    c.attn_sinks = true;
    c.swiglu_oai = true;
}

// The router's weighting (GLM 4.5, DeepSeek V2 / V3): expert_weights_norm (absent: false),
// expert_weights_scale (absent or 0: 1, as in llama.cpp), expert_gating_func 1 (softmax) or 2
// (sigmoid; absent: `gating`).
void read_routing(const GgufFile& f, const std::string& a, int64_t gating, ModelConfig& c) {
    c.moe_norm = f.get_bool_or(a + "expert_weights_norm", false);
    const double scale = f.get_float_or(a + "expert_weights_scale", 1.0);
    if (!(scale >= 0) || !std::isfinite(scale))
        fail("{}: {}expert_weights_scale {} must be a finite number >= 0", f.path(), a, scale);
    c.moe_scale = scale == 0 ? 1.0f : float(scale);  // (0: unscaled, as in llama.cpp)
    if (f.has(a + "expert_gating_func")) gating = read_count(f, a + "expert_gating_func", 0, false);
    if (gating != 1 && gating != 2)
        fail("{}: {}expert_gating_func {} is not 1 (softmax) or 2 (sigmoid)", f.path(), a, gating);
    c.moe_sigmoid = gating == 2;
    c.moe_select_bias = c.moe_sigmoid;  // (a sigmoid router here has its selection bias)
}

// The trailing multi-token-prediction layers (nextn_predict_layers: in the file, not run) and
// the leading dense layers' count (read before) checked against what is left.
void read_dense_lead(const GgufFile& f, const std::string& a, ModelConfig& c) {
    c.n_nextn = read_count0(f, a + "nextn_predict_layers", false);
    if (c.n_nextn >= c.n_layer)
        fail("{}: {}nextn_predict_layers {} leaves no layer of block_count {}", f.path(), a,
             c.n_nextn, c.n_layer);
    c.n_layer -= c.n_nextn;
    if (c.n_layer_dense > c.n_layer)
        fail("{}: {}leading_dense_block_count {} exceeds the {} layers", f.path(), a,
             c.n_layer_dense, c.n_layer);
    if (c.n_layer_dense > 0 && c.n_ff == c.n_ff_exp && !f.has(a + "feed_forward_length"))
        fail("{}: missing required key '{}feed_forward_length' (the dense layers' width)",
             f.path(), a);
}

// GLM 4.5 (glm4moe) and dots.llm1 (dots1): leading dense layers, a sigmoid router with a
// selection bias, shared experts of the experts' width, multi-token-prediction layers at the
// end that are not run (GLM). Read after the experts.
void read_shared_moe(const GgufFile& f, const std::string& a, ModelConfig& c) {
    // (llama.cpp's defaults: no dense layer, weights unscaled and not normalized.)
    c.n_layer_dense = read_count0(f, a + "leading_dense_block_count", false);
    c.n_expert_shared = read_count0(f, a + "expert_shared_count", true);
    c.n_ff_shexp = c.n_ff_exp * c.n_expert_shared;
    read_routing(f, a, 2, c);               // (llama.cpp's default for this architecture: sigmoid)
    if (!c.moe_sigmoid) c.moe_norm = true;  // (the softmax router always renormalizes here)
    read_dense_lead(f, a, c);
}

// ERNIE 4.5 MoE (ernie4_5-moe): leading dense layers, then experts on every
// interleave_moe_layer_step-th layer; a softmax router whose selection bias (exp_probs_b, when
// there) picks the experts; shared experts of width expert_shared_feed_forward_length (absent:
// none, as in llama.cpp). Read after the experts.
void read_ernie_moe(const GgufFile& f, const std::string& a, ModelConfig& c) {
    c.n_layer_dense = read_count0(f, a + "leading_dense_block_count", true);
    c.moe_step = read_count(f, a + "interleave_moe_layer_step", 1, true);
    c.n_ff_shexp = read_count0(f, a + "expert_shared_feed_forward_length", false);
    c.n_expert_shared = read_count0(f, a + "expert_shared_count", false);
    if (c.n_layer_dense > c.n_layer)
        fail("{}: {}leading_dense_block_count {} exceeds the {} layers", f.path(), a,
             c.n_layer_dense, c.n_layer);
}

// OLMo 2 and OLMo 3 (olmo2): post norms only, Q/K norms over the whole width. OLMo 3 has a
// sliding window (attention.sliding_window) on three layers of four
// (attention.sliding_window_pattern, 4 when absent, as in llama.cpp), which rotate with base
// rope.freq_base_swa (the model's base when absent) and no RoPE scaling.
void read_olmo2(const GgufFile& f, const std::string& a, ModelConfig& c) {
    c.pre_norms = false;
    c.post_norms = true;
    c.qk_norm_full = true;
    if (!f.has(a + "attention.sliding_window")) return;
    c.n_swa = read_count(f, a + "attention.sliding_window", 0, true);
    c.swa_pattern = read_count(f, a + "attention.sliding_window_pattern", 4, false);
    const double base = f.get_float_or(a + "rope.freq_base_swa", c.rope_freq_base);
    if (!(base > 0) || !std::isfinite(base))
        fail("{}: {}rope.freq_base_swa = {} must be positive", f.path(), a, base);
    c.rope_freq_base_swa = float(base);
}

// OLMoE (olmoe): llama's pre norms with OLMo's Q/K norms over the whole width, and a softmax
// router whose chosen probabilities weight the experts as they are (not renormalized), as in
// llama.cpp.
void read_olmoe(ModelConfig& c) {
    c.qk_norm_full = true;
    c.moe_norm = false;
}

// EXAONE 4.0 (exaone4): post norms only, per-head Q/K norms. As in llama.cpp, the 64-layer
// model (32B) has a sliding window (attention.sliding_window, 4096 when absent) on three layers
// of four, and then only those layers rotate: the global ones use no RoPE. Other sizes (1.2B)
// attend globally with RoPE on every layer.
void read_exaone4(const GgufFile& f, const std::string& a, ModelConfig& c) {
    c.pre_norms = false;
    c.post_norms = true;
    if (c.n_layer != 64) return;
    c.n_swa = read_count(f, a + "attention.sliding_window", 4096, false);
    c.swa_pattern = 4;
    c.rope_swa_only = true;
}

// GLM-4-0414 and GLM-Z1 (glm4, dense): Gemma 2's post norms of each block's output before its
// residual add, the gate's and up's rows in one ffn_up, RoPE on consecutive pairs of the first
// rope.dimension_count dims of each head (half of them in the released models). A file with
// M-RoPE sections (rope.dimension_sections: GLM-4.1V's language model) rotates NeoX pairs, as
// llama.cpp's multi-section RoPE does; for text every section sees the same position, which
// makes it plain NeoX RoPE. Trailing multi-token-prediction layers (nextn_predict_layers) are
// not run, as in llama.cpp.
void read_glm4(const GgufFile& f, const std::string& a, ModelConfig& c) {
    c.post_norms = true;
    if (const GgufValue* v = f.find(a + "rope.dimension_sections")) {
        if (v->type != GgufValueType::ARRAY)
            fail("{}: key '{}rope.dimension_sections' must be an integer array", f.path(), a);
        for (const auto& item : v->as_array())
            if (item.is_int() && item.as_int() > 0) c.rope_neox = true;
    }
    read_dense_lead(f, a, c);
}

// Llama 4 Scout / Maverick (llama4), as llama.cpp reads it: experts on every
// interleave_moe_layer_step-th layer (Maverick: every other, the others dense), one chosen per
// token by the largest router logit and weighted by its sigmoid, unnormalized, the weight
// scaling the expert's input; one shared expert of the experts' width on every token. Three
// layers of four rotate (with Llama 3's rope_freqs) and attend within 8192-token chunks
// (attention.sliding_window, when given: the chunk; 0: no chunks, and then only the last
// layer skips RoPE, as in llama.cpp); the fourth attends globally, without RoPE, with the
// attention temperature. Scout's rotating layers RMS-normalize each head's Q and K (not
// Maverick's, known by its 128 experts, as llama.cpp does). Read after the experts.
void read_llama4(const GgufFile& f, const std::string& a, ModelConfig& c) {
    c.moe_step = read_count(f, a + "interleave_moe_layer_step", 1, true);
    c.moe_sigmoid = true, c.moe_norm = false, c.moe_weight_before = true;
    c.n_expert_shared = 1, c.n_ff_shexp = c.n_ff_exp;
    const GgufValue* v = f.find(a + "attention.sliding_window");
    if (v && v->is_int() && v->as_int() == 0) {
        c.nope_step = c.n_layer;
    } else {
        c.n_swa = v ? read_count(f, a + "attention.sliding_window", 0, true) : 8192;
        c.swa_pattern = read_count(f, a + "attention.sliding_window_pattern", 4, false);
        c.swa_chunked = true;
        c.nope_step = 4;
        c.attn_temp_scale = 0.1f, c.attn_temp_floor = 8192;
    }
    c.qk_l2_norm = c.n_expert != 128;
}

// Cohere's Command-R (command-r) and Command R7B / Command A (cohere2): the logits times
// logit_scale (required, as in llama.cpp). cohere2 attends within attention.sliding_window
// (required) on three layers of four, and only those rotate: the global layers use no RoPE.
void read_cohere(const GgufFile& f, const std::string& a, ModelConfig& c) {
    if (!f.has(a + "logit_scale")) fail("{}: missing required key '{}logit_scale'", f.path(), a);
    const double scale = f.get_float_or(a + "logit_scale", 0.0);
    if (!(scale > 0) || !std::isfinite(scale))
        fail("{}: {}logit_scale = {} must be positive", f.path(), a, scale);
    c.logit_scale = float(scale);
    if (c.arch != "cohere2") return;
    c.n_swa = read_count(f, a + "attention.sliding_window", 0, true);
    c.swa_pattern = 4;
    c.rope_swa_only = true;
}

// Qwen1.5-MoE and Qwen2-MoE (qwen2moe): Qwen2's attention (Q/K/V biases, NeoX RoPE); every
// layer has a softmax router whose chosen probabilities weight the experts as they are (not
// renormalized), and one shared expert of width expert_shared_feed_forward_length (absent:
// feed_forward_length, as in llama.cpp) whose output is scaled by a sigmoid gate of its own.
// Read after the experts.
void read_qwen2moe(const GgufFile& f, const std::string& a, ModelConfig& c) {
    c.moe_norm = false;
    c.n_expert_shared = 1;
    c.n_ff_shexp = read_count0(f, a + "expert_shared_feed_forward_length", false);
    if (c.n_ff_shexp == 0) c.n_ff_shexp = c.n_ff;
    c.shexp_gate = true;
}

// DeepSeek V2 / V3's latent attention (deepseek2): `k_len` and `v_len` are the file's
// attention.key_length / value_length. Files converted for absorbed MLA (llama.cpp since April
// 2025: attn_k_b / attn_v_b) say key_length = kv_lora_rank + rope dims, value_length =
// kv_lora_rank, and give the per-head sizes as key_length_mla / value_length_mla; older ones
// (attn_kv_b) give the per-head sizes as key_length / value_length. The cache row is
// n_rot + kv_lora_rank wide and shared by all heads.
void read_mla(const GgufFile& f, const std::string& a, int64_t k_len, int64_t v_len,
              ModelConfig& c) {
    c.mla_rank = read_count(f, a + "attention.kv_lora_rank", 0, true);
    c.mla_q_rank = read_count0(f, a + "attention.q_lora_rank", false);
    const int64_t n_rot = read_count(f, a + "rope.dimension_count", 0, true);
    int64_t k_mla = k_len, v_mla = v_len;
    if (f.has(a + "attention.key_length_mla") || f.has(a + "attention.value_length_mla")) {
        k_mla = read_count(f, a + "attention.key_length_mla", 0, true);
        v_mla = read_count(f, a + "attention.value_length_mla", 0, true);
        if (k_len != c.mla_rank + n_rot || v_len != c.mla_rank)
            fail(
                "{}: {}attention.key_length {} / value_length {} must be kv_lora_rank + "
                "rope.dimension_count ({}) / kv_lora_rank ({}) in a file with key_length_mla",
                f.path(), a, k_len, v_len, c.mla_rank + n_rot, c.mla_rank);
    }
    if (k_mla <= n_rot || n_rot % 2 != 0)
        fail("{}: {}rope.dimension_count {} must be even and below the key length {}", f.path(), a,
             n_rot, k_mla);
    c.mla_nope = k_mla - n_rot;
    c.mla_v = v_mla;
    c.head_dim = c.mla_rank + n_rot;
    c.n_kv_head = 1;
    // (llama.cpp divides the converter's 0.1 back out.)
    c.mla_log_mul = float(f.get_float_or(a + "rope.scaling.yarn_log_multiplier", 0.0) / 0.1);
    if (!std::isfinite(c.mla_log_mul))
        fail("{}: {}rope.scaling.yarn_log_multiplier must be finite", f.path(), a);
}

// DeepSeek V2 / V3 (deepseek2) experts, read after them: leading dense layers
// (leading_dense_block_count), expert_shared_count shared experts of the experts' width, a
// softmax (V2) or sigmoid (V3, with the selection bias exp_probs_b) router whose weights are
// normalized only when expert_weights_norm says so.
void read_deepseek2(const GgufFile& f, const std::string& a, ModelConfig& c) {
    c.n_layer_dense = read_count0(f, a + "leading_dense_block_count", false);
    c.n_expert_shared = read_count0(f, a + "expert_shared_count", true);
    c.n_ff_shexp = c.n_ff_exp * c.n_expert_shared;
    // (Without expert_gating_func: softmax, as DeepSeek V2 / V2.5 files; llama.cpp takes GLM
    // 4.7 Flash, 47 or 48 layers and a vocabulary of 154880, for sigmoid.)
    const bool glm47_flash = (c.n_layer == 47 || c.n_layer == 48) && c.n_vocab == 154880;
    read_routing(f, a, glm47_flash ? 2 : 1, c);
    read_dense_lead(f, a, c);
}

// Expert groups (any architecture with experts, as in llama.cpp).
void read_expert_groups(const GgufFile& f, const std::string& a, ModelConfig& c) {
    c.n_group = read_count0(f, a + "expert_group_count", false);
    c.n_group_used = read_count0(f, a + "expert_group_used_count", false);
    if (c.n_group <= 1) return;
    const int64_t per = c.n_expert / c.n_group;
    if (c.n_expert % c.n_group != 0 || c.n_group_used < 1 || c.n_group_used > c.n_group ||
        c.n_expert_used > c.n_group_used * per)
        fail(
            "{}: {}expert_group_count {} / expert_group_used_count {} do not fit {} experts, "
            "{} per token",
            f.path(), a, c.n_group, c.n_group_used, c.n_expert, c.n_expert_used);
}

// DeepSeek's q.k scale (see ModelConfig::mla_rank), with the RoPE as it stands.
void set_mla_attn_scale(ModelConfig& c) {
    const double m = double(c.rope(nullptr).mscale) *
                     (1.0 + 0.1 * double(c.mla_log_mul) * std::log(1.0 / c.rope_freq_scale));
    c.attn_scale = float(m * m / std::sqrt(double(c.mla_nope + c.n_rot)));
}

}  // namespace

ModelConfig model_config_from_gguf(const GgufFile& f) {
    ModelConfig c;
    c.arch = f.get_string_or("general.architecture", "");
    const ArchTraits* traits = nullptr;
    for (const auto& a : kArchs)
        if (c.arch == a.name) traits = &a;
    if (!traits) {
        throw Error(
            fmt::format("{}: unsupported architecture '{}' (supported: llama, qwen2, qwen3, "
                        "qwen3moe, qwen2moe, phi3, gemma, gemma2, gemma3, granite, granitemoe, "
                        "smollm3, gpt-oss, glm4moe, ernie4_5, ernie4_5-moe, olmo2, olmoe, "
                        "exaone4, deepseek2, bitnet, glm4, seed_oss, llama4, dots1, "
                        "exaone, phi2, starcoder2, command-r, cohere2)",
                        f.path(), c.arch),
            "kvrun runs llama-family models (Llama, Mistral, TinyLlama, SmolLM, Qwen2, Qwen3, "
            "Qwen3 MoE, Qwen2 MoE, Mixtral, Phi-3, Phi-4, Gemma 1-3, Granite 3, SmolLM3, "
            "gpt-oss, GLM-4-0414, GLM 4.5, ERNIE 4.5, OLMo 2, OLMo 3, OLMoE, EXAONE 4.0, "
            "DeepSeek V2 / V3, BitNet b1.58, Seed-OSS, Llama 4, dots.llm1, EXAONE 3.x, Phi-2, "
            "StarCoder2, Command-R, Command R7B, Command A)");
    }
    c.rope_neox = traits->rope_neox;
    c.qkv_bias = traits->qkv_bias;
    c.qk_norm = traits->qk_norm;
    c.fused_gate_up = traits->fused_gate_up;
    c.nope_step = traits->nope_step;
    c.sub_norms = traits->sub_norms;
    c.ffn_norm_post_attention = traits->ffn_norm_post_attention;
    c.layer_norm = traits->layer_norm;
    c.parallel_blocks = traits->parallel_blocks;
    c.ffn_plain = traits->ffn_plain;

    const std::string a = c.arch + ".";
    c.n_layer = read_count(f, a + "block_count", 0, true);
    c.n_embd = read_count(f, a + "embedding_length", 0, true);
    // A mixture of experts may give only the experts' width (gpt-oss).
    c.n_ff = read_count(f, a + "feed_forward_length", 0, !traits->experts);
    c.n_head = read_count(f, a + "attention.head_count", 0, true);
    c.n_kv_head = read_count(f, a + "attention.head_count_kv", c.n_head, false);
    if (c.n_embd % c.n_head != 0 && !f.has(a + "attention.key_length"))
        fail("{}: embedding_length {} is not a multiple of attention.head_count {}", f.path(),
             c.n_embd, c.n_head);
    c.head_dim = read_count(f, a + "attention.key_length", c.n_embd / c.n_head, false);
    int64_t v_dim = read_count(f, a + "attention.value_length", c.head_dim, false);
    if (traits->deepseek2)
        read_mla(f, a, c.head_dim, v_dim, c);
    else if (v_dim != c.head_dim)
        fail("{}: attention.value_length {} differs from key_length {} (not supported)", f.path(),
             v_dim, c.head_dim);
    c.n_rot = read_count(f, a + "rope.dimension_count", c.head_dim, false);
    c.n_ctx_train = f.has(a + "context_length") ? read_count(f, a + "context_length", 0, false) : 0;
    const std::string eps_key =
        c.layer_norm ? "attention.layer_norm_epsilon" : "attention.layer_norm_rms_epsilon";
    c.norm_eps = float(f.get_float_or(a + eps_key, 1e-5));
    c.rope_freq_base = float(f.get_float_or(a + "rope.freq_base", 10000.0));

    c.n_vocab = vocab_size(f);

    if (c.n_head % c.n_kv_head != 0)
        fail("{}: attention.head_count {} is not a multiple of head_count_kv {}", f.path(),
             c.n_head, c.n_kv_head);
    if (c.n_rot > c.head_dim || c.n_rot % 2 != 0)
        fail("{}: rope.dimension_count {} must be even and at most the head size {}", f.path(),
             c.n_rot, c.head_dim);
    if (c.n_vocab <= 0) fail("{}: empty vocabulary", f.path());
    if (!(c.norm_eps > 0) || !std::isfinite(c.norm_eps))
        fail("{}: {} = {} must be positive", f.path(), eps_key, c.norm_eps);
    if (!(c.rope_freq_base > 0) || !std::isfinite(c.rope_freq_base))
        fail("{}: rope.freq_base = {} must be positive", f.path(), c.rope_freq_base);
    read_rope_scaling(f, a, c);
    c.attn_scale = 1.0f / std::sqrt(float(c.head_dim));
    if (traits->gemma) read_gemma(f, a, traits->gemma, c);
    if (traits->granite) read_granite(f, a, c);
    if (traits->gpt_oss) read_gpt_oss(f, a, c);
    if (traits->olmo2) read_olmo2(f, a, c);
    if (traits->exaone4) read_exaone4(f, a, c);
    if (traits->olmoe) read_olmoe(c);
    if (traits->glm4) read_glm4(f, a, c);
    if (traits->cohere) read_cohere(f, a, c);
    // Mixture of experts (some dense models say expert_count 0).
    const GgufValue* experts = f.find(a + "expert_count");
    if (experts && !(experts->is_int() && experts->as_int() == 0)) {
        c.n_expert = read_count(f, a + "expert_count", 0, true);
        c.n_expert_used = read_count(f, a + "expert_used_count", 0, true);
        c.n_ff_exp = read_count(f, a + "expert_feed_forward_length", c.n_ff, c.n_ff == 0);
        if (c.n_ff == 0) c.n_ff = c.n_ff_exp;
        if (c.n_expert_used > c.n_expert || c.n_expert > 4096)
            fail("{}: {}expert_used_count {} must be at most expert_count {} (<= 4096)", f.path(),
                 a, c.n_expert_used, c.n_expert);
    } else if (traits->experts) {
        fail("{}: missing required key '{}expert_count'", f.path(), a);
    }
    if (traits->glm4moe) c.ffn_norm_post_attention = true;
    if (traits->glm4moe || traits->dots1) read_shared_moe(f, a, c);
    if (traits->ernie_moe) read_ernie_moe(f, a, c);
    if (traits->qwen2moe) read_qwen2moe(f, a, c);
    if (traits->deepseek2) read_deepseek2(f, a, c);
    if (traits->llama4) read_llama4(f, a, c);
    if (c.moe()) read_expert_groups(f, a, c);
    if (c.mla()) set_mla_attn_scale(c);
    return c;
}

RopeParams ModelConfig::rope_swa(const float* factors) const {
    if (rope_freq_base_swa > 0)
        return RopeParams::plain(n_rot, rope_freq_base_swa, 1.0f, rope_neox);
    return rope(factors);
}

RopeParams ModelConfig::rope(const float* factors) const {
    RopeParams p = RopeParams::plain(n_rot, rope_freq_base, rope_freq_scale, rope_neox);
    if (!rope_freq_factors.empty()) p.freq_factors = factors;
    if (rope_scaling == "yarn" && yarn_ext_factor != 0.0f) {
        // llama.cpp's corr dims: the pairs that turn more than beta_fast times over the
        // original context extrapolate, those turning fewer than beta_slow times interpolate.
        const int64_t orig =
            yarn_n_ctx_orig > 0 ? yarn_n_ctx_orig : (n_ctx_train > 0 ? n_ctx_train : 4096);
        p.ext_factor = yarn_ext_factor;
        p.corr_low = float(std::max(
            0.0, std::floor(rope_yarn_corr_dim(n_rot, orig, yarn_beta_fast, rope_freq_base))));
        p.corr_high = float(
            std::min(double(n_rot - 1),
                     std::ceil(rope_yarn_corr_dim(n_rot, orig, yarn_beta_slow, rope_freq_base))));
        // (DeepSeek with its log multiplier: YaRN's magnitude goes into the q.k scale instead.)
        p.mscale = mla() && mla_log_mul != 0.0f
                       ? yarn_attn_factor
                       : yarn_attn_factor * (1.0f + 0.1f * std::log(1.0f / rope_freq_scale));
    } else {
        p.mscale = yarn_attn_factor;  // as llama.cpp: the attention factor applies to any RoPE
    }
    return p;
}

int64_t ModelConfig::rope_orig_ctx() const {
    return yarn_n_ctx_orig > 0 ? yarn_n_ctx_orig : n_ctx_train;
}

void select_rope_factors(ModelConfig& c, int64_t n_ctx) {
    if (c.rope_factors_long.empty()) return;
    const int64_t ctx = n_ctx > 0 ? n_ctx : c.n_ctx_train;
    c.rope_freq_factors = ctx > c.rope_orig_ctx() ? c.rope_factors_long : c.rope_factors_short;
}

void apply_rope_overrides(ModelConfig& c, const RopeOverrides& o) {
    if (!o.scaling.empty()) {
        if (o.scaling != "none" && o.scaling != "linear" && o.scaling != "yarn")
            fail("--rope-scaling '{}': expected none, linear or yarn", o.scaling);
        c.rope_scaling = o.scaling;
        if (o.scaling == "none") c.rope_freq_scale = 1.0f;
    }
    auto positive = [](const char* flag, double v) {
        if (!(v > 0) || !std::isfinite(v)) fail("{} = {} must be positive", flag, v);
    };
    if (o.freq_base > 0) {
        positive("--rope-freq-base", o.freq_base);
        c.rope_freq_base = o.freq_base;
    }
    if (o.freq_scale > 0) {
        positive("--rope-freq-scale", o.freq_scale);
        c.rope_freq_scale = o.freq_scale;
        if (c.rope_scaling == "none") c.rope_scaling = "linear";  // llama.cpp: a scale is linear
    }
    if (o.yarn_orig_ctx > 0) c.yarn_n_ctx_orig = o.yarn_orig_ctx;
    if (o.yarn_ext_factor >= 0) c.yarn_ext_factor = o.yarn_ext_factor;
    if (o.yarn_attn_factor > 0) c.yarn_attn_factor = o.yarn_attn_factor;
    if (o.yarn_beta_fast > 0) c.yarn_beta_fast = o.yarn_beta_fast;
    if (o.yarn_beta_slow > 0) c.yarn_beta_slow = o.yarn_beta_slow;
    if (c.mla()) set_mla_attn_scale(c);
}

}  // namespace kvrun
