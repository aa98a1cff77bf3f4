// Reads the typed hyperparameters of a llama / qwen2 GGUF model and validates them.
#include "model_config.h"

#include <cmath>

#include "common.h"

namespace kvrun {
namespace {

// Per-architecture facts that are not in the metadata.
struct ArchTraits {
    const char* name;
    bool rope_neox;
    bool qkv_bias;
};

constexpr ArchTraits kArchs[] = {
    {"llama", false, false},
    {"qwen2", true, true},
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

}  // namespace

ModelConfig model_config_from_gguf(const GgufFile& f) {
    ModelConfig c;
    c.arch = f.get_string_or("general.architecture", "");
    const ArchTraits* traits = nullptr;
    for (const auto& a : kArchs)
        if (c.arch == a.name) traits = &a;
    if (!traits) {
        throw Error(fmt::format("{}: unsupported architecture '{}' (supported: llama, qwen2)",
                                f.path(), c.arch),
                    "kvrun runs llama-family models (Llama, Mistral, TinyLlama, SmolLM, Qwen2)");
    }
    c.rope_neox = traits->rope_neox;
    c.qkv_bias = traits->qkv_bias;

    const std::string a = c.arch + ".";
    c.n_layer = read_count(f, a + "block_count", 0, true);
    c.n_embd = read_count(f, a + "embedding_length", 0, true);
    c.n_ff = read_count(f, a + "feed_forward_length", 0, true);
    c.n_head = read_count(f, a + "attention.head_count", 0, true);
    c.n_kv_head = read_count(f, a + "attention.head_count_kv", c.n_head, false);
    if (c.n_embd % c.n_head != 0 && !f.has(a + "attention.key_length"))
        fail("{}: embedding_length {} is not a multiple of attention.head_count {}", f.path(),
             c.n_embd, c.n_head);
    c.head_dim = read_count(f, a + "attention.key_length", c.n_embd / c.n_head, false);
    int64_t v_dim = read_count(f, a + "attention.value_length", c.head_dim, false);
    if (v_dim != c.head_dim)
        fail("{}: attention.value_length {} differs from key_length {} (not supported)", f.path(),
             v_dim, c.head_dim);
    c.n_rot = read_count(f, a + "rope.dimension_count", c.head_dim, false);
    c.n_ctx_train = f.has(a + "context_length") ? read_count(f, a + "context_length", 0, false) : 0;
    c.norm_eps = float(f.get_float_or(a + "attention.layer_norm_rms_epsilon", 1e-5));
    c.rope_freq_base = float(f.get_float_or(a + "rope.freq_base", 10000.0));

    std::string scaling = f.get_string_or(a + "rope.scaling.type", "none");
    if (scaling == "linear") {
        double factor = f.get_float_or(a + "rope.scaling.factor", 1.0);
        if (!(factor > 0) || !std::isfinite(factor))
            fail("{}: rope.scaling.factor = {} must be positive", f.path(), factor);
        c.rope_freq_scale = float(1.0 / factor);
    } else if (scaling != "none") {
        fail("{}: rope scaling type '{}' is not supported (supported: none, linear)", f.path(),
             scaling);
    }
    if (f.find_tensor("rope_freqs.weight"))
        fail(
            "{}: per-dimension RoPE frequency factors (rope_freqs.weight, Llama 3.1 style) "
            "are not supported yet",
            f.path());
    c.n_vocab = vocab_size(f);

    if (c.n_head % c.n_kv_head != 0)
        fail("{}: attention.head_count {} is not a multiple of head_count_kv {}", f.path(),
             c.n_head, c.n_kv_head);
    if (c.n_rot > c.head_dim || c.n_rot % 2 != 0)
        fail("{}: rope.dimension_count {} must be even and at most the head size {}", f.path(),
             c.n_rot, c.head_dim);
    if (c.n_vocab <= 0) fail("{}: empty vocabulary", f.path());
    if (!(c.norm_eps > 0) || !std::isfinite(c.norm_eps))
        fail("{}: attention.layer_norm_rms_epsilon = {} must be positive", f.path(), c.norm_eps);
    if (!(c.rope_freq_base > 0) || !std::isfinite(c.rope_freq_base))
        fail("{}: rope.freq_base = {} must be positive", f.path(), c.rope_freq_base);
    return c;
}

}  // namespace kvrun
