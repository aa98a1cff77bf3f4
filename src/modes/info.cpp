// `kvrun info`: what a GGUF file holds — architecture, hyperparameters, vocabulary,
// tensor types, weight bytes and the KV cache cost per token — as a table or JSON.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <map>
#include <nlohmann/json.hpp>

#include "chat_template.h"
#include "gguf.h"
#include "imatrix.h"
#include "kv_format.h"
#include "modes/modes.h"
#include "modes/server_tools.h"
#include "quant.h"
#include "quantize_model.h"
#include "reasoning.h"

namespace kvrun {
namespace {

struct InfoOptions {
    std::string model;
    bool json = false;
    bool tensors = false;
    bool metadata = false;
    int32_t kv_block_size = 16;
};

struct Hyper {
    std::string arch;
    int64_t n_layer = 0, n_embd = 0, n_ff = 0, n_head = 0, n_head_kv = 0, n_ctx_train = 0;
    int64_t head_dim = 0, n_rot = 0, n_vocab = 0;
    double rope_base = 10000, norm_eps = 0;
    std::string rope_scaling;  // e.g. "none", "linear x4", "yarn x4 from 8192", "+ rope_freqs"
    std::string attention;     // sliding window, soft caps (Gemma), sinks (gpt-oss), or empty
    int64_t n_swa = 0, n_swa_layers = 0;  // the window and how many layers use it
    std::string multipliers;              // Granite's scales, or empty
    std::string blocks;                   // LayerNorm architectures' block shape, or empty
    bool layer_norm = false;              // norm_eps is a LayerNorm's (layer_norm_epsilon)
    std::string experts;                  // mixture of experts, or empty
};

// How many of n_layer layers a windowed pattern of p covers (l % p < p - 1, ModelConfig::is_swa).
int64_t pattern_layers(int64_t n_layer, int64_t p) {
    int64_t n = 0;
    for (int64_t l = 0; l < n_layer; ++l) n += p > 0 && l % p < p - 1;
    return n;
}

Hyper read_hyper(const GgufFile& f) {
    Hyper h;
    h.arch = f.get_string_or("general.architecture", "");
    const std::string a = h.arch + ".";
    h.n_layer = f.get_int_or(a + "block_count", 0);
    h.n_embd = f.get_int_or(a + "embedding_length", 0);
    h.n_ff = f.get_int_or(a + "feed_forward_length", 0);
    h.n_head = f.get_int_or(a + "attention.head_count", 0);
    h.n_head_kv = f.get_int_or(a + "attention.head_count_kv", h.n_head);
    h.n_ctx_train = f.get_int_or(a + "context_length", 0);
    h.head_dim = h.n_head > 0 ? h.n_embd / h.n_head : 0;
    h.head_dim = f.get_int_or(a + "attention.key_length", h.head_dim);
    h.n_rot = f.get_int_or(a + "rope.dimension_count", h.head_dim);
    h.rope_base = f.get_float_or(a + "rope.freq_base", 10000.0);
    h.norm_eps = f.get_float_or(a + "attention.layer_norm_rms_epsilon", 0.0);
    if (!f.has(a + "attention.layer_norm_rms_epsilon") &&
        f.has(a + "attention.layer_norm_epsilon")) {
        h.norm_eps = f.get_float_or(a + "attention.layer_norm_epsilon", 0.0);
        h.layer_norm = true;
    }
    const double factor =
        f.get_float_or(a + "rope.scaling.factor", f.get_float_or(a + "rope.scale_linear", 0.0));
    h.rope_scaling =
        f.get_string_or(a + "rope.scaling.type", factor > 0 && factor != 1 ? "linear" : "none");
    if (h.rope_scaling != "none")
        h.rope_scaling += fmt::format(" x{:g}", factor > 0 ? factor : 1.0);
    if (h.rope_scaling.rfind("yarn", 0) == 0 && f.has(a + "rope.scaling.original_context_length"))
        h.rope_scaling +=
            fmt::format(" from {}", f.get_int_or(a + "rope.scaling.original_context_length", 0));
    if (const GgufTensorInfo* t = f.find_tensor("rope_freqs.weight"))
        h.rope_scaling += fmt::format(" + rope_freqs ({} pair factors)", t->n_elements);
    if (const GgufTensorInfo* t = f.find_tensor("rope_factors_long.weight"))
        h.rope_scaling = fmt::format(
            "longrope ({} pair factors: long past {} tokens of context, short within)",
            t->n_elements, f.get_int_or(a + "rope.scaling.original_context_length", h.n_ctx_train));
    if (const int64_t experts = f.get_int_or(a + "expert_count", 0); experts > 0)
        h.experts = fmt::format("{} per layer, {} per token, width {}", experts,
                                f.get_int_or(a + "expert_used_count", 0),
                                f.get_int_or(a + "expert_feed_forward_length", h.n_ff));
    if (h.arch == "deepseek2") {  // latent attention: one cached row per token for all heads
        const int64_t rank = f.get_int_or(a + "attention.kv_lora_rank", 0);
        const bool split = f.has(a + "attention.key_length_mla");
        const int64_t k = split ? f.get_int_or(a + "attention.key_length_mla", 0) : h.head_dim;
        const int64_t v = split ? f.get_int_or(a + "attention.value_length_mla", 0)
                                : f.get_int_or(a + "attention.value_length", h.head_dim);
        h.attention = fmt::format(
            "latent (MLA) of rank {}, absorbed: per head {} key dims ({} with RoPE), {} value "
            "dims; Q {}; {} cached per token and layer, shared by all heads",
            rank, k, h.n_rot, v,
            f.has(a + "attention.q_lora_rank")
                ? fmt::format("through rank {}", f.get_int_or(a + "attention.q_lora_rank", 0))
                : std::string("one matrix"),
            rank + h.n_rot);
        h.n_head_kv = 1;
        h.head_dim = rank + h.n_rot;
        if (f.get_int_or(a + "expert_count", 0) > 0)
            h.experts += fmt::format(
                ", {} shared; {} router{}, weights{} x{:g}; first {} layer(s) dense",
                f.get_int_or(a + "expert_shared_count", 0),
                f.get_int_or(a + "expert_gating_func", 1) == 2 ? "sigmoid" : "softmax",
                f.find_tensor("blk." + std::to_string(h.n_layer - 1) + ".exp_probs_b.bias")
                    ? " with a selection bias"
                    : "",
                f.get_bool_or(a + "expert_weights_norm", false) ? " normalized" : "",
                f.get_float_or(a + "expert_weights_scale", 1.0),
                f.get_int_or(a + "leading_dense_block_count", 0));
    }
    if (const int64_t g = f.get_int_or(a + "expert_group_count", 0); g > 1)
        h.experts += fmt::format("; from the best {} of {} expert groups",
                                 f.get_int_or(a + "expert_group_used_count", 0), g);
    if (h.arch == "gemma2" || h.arch == "gemma3") {
        const int64_t window =
            f.get_int_or(a + "attention.sliding_window", h.arch == "gemma2" ? 4096 : 0);
        h.attention = fmt::format("sliding window {} tokens on {}", window,
                                  h.arch == "gemma2" ? "every other layer" : "5 of 6 layers");
        h.n_swa = window;
        h.n_swa_layers = h.arch == "gemma2" ? (h.n_layer + 1) / 2 : h.n_layer - h.n_layer / 6;
        if (h.arch == "gemma2")
            h.attention += fmt::format(", soft caps {:g} (scores) {:g} (logits)",
                                       f.get_float_or(a + "attn_logit_softcapping", 50.0),
                                       f.get_float_or(a + "final_logit_softcapping", 30.0));
    }
    if (h.arch == "olmo2" && f.get_int_or(a + "attention.sliding_window", 0) > 0) {  // OLMo 3
        const int64_t p = f.get_int_or(a + "attention.sliding_window_pattern", 4);
        h.n_swa = f.get_int_or(a + "attention.sliding_window", 0);
        h.n_swa_layers = pattern_layers(h.n_layer, p);
        h.attention = fmt::format("sliding window {} tokens on {} of {} layers (RoPE unscaled)",
                                  h.n_swa, p - 1, p);
    }
    if (h.arch == "exaone4" && h.n_layer == 64) {  // EXAONE 4.0 32B (llama.cpp's rule)
        h.n_swa = f.get_int_or(a + "attention.sliding_window", 4096);
        h.n_swa_layers = 48;
        h.attention = fmt::format(
            "sliding window {} tokens on 3 of 4 layers (the others without RoPE)", h.n_swa);
    }
    if (h.arch == "phi2" || h.arch == "starcoder2" || h.arch == "command-r" ||
        h.arch == "cohere2") {
        const bool parallel = h.arch != "starcoder2",
                   plain = h.arch == "phi2" || h.arch == "starcoder2";
        h.blocks = fmt::format("LayerNorms{}, {}, {} FFN", plain ? " with biases" : "",
                               parallel ? "attention and FFN in parallel" : "sequential",
                               plain ? "GELU" : "SwiGLU");
        if (f.find_tensor("output.bias")) h.blocks += ", an output bias";
        if (h.arch == "command-r" || h.arch == "cohere2")
            h.multipliers = fmt::format("logits x{:g}", f.get_float_or(a + "logit_scale", 0.0));
    }
    if (h.arch == "cohere2") {  // Command R7B / A (llama.cpp's rule: 3 of 4 layers)
        h.n_swa = f.get_int_or(a + "attention.sliding_window", 0);
        h.n_swa_layers = pattern_layers(h.n_layer, 4);
        h.attention = fmt::format(
            "sliding window {} tokens on 3 of 4 layers (the others without RoPE)", h.n_swa);
    }
    if (h.arch == "llama4") {  // (llama.cpp's reading: the chunk 8192 unless the key says 0)
        const int64_t step = f.get_int_or(a + "interleave_moe_layer_step", 1);
        h.experts += ", 1 shared; sigmoid weights on the inputs";
        if (step > 1) h.experts += fmt::format("; on one layer in {}, the others dense", step);
        if (const int64_t chunk = f.get_int_or(a + "attention.sliding_window", 8192); chunk > 0) {
            const int64_t p = f.get_int_or(a + "attention.sliding_window_pattern", 4);
            h.n_swa = chunk;
            h.n_swa_layers = pattern_layers(h.n_layer, p);
            h.attention = fmt::format(
                "chunks of {} tokens on {} of {} layers (the others global, without RoPE, with "
                "the attention temperature)",
                chunk, p - 1, p);
        }
    }
    if (h.arch == "gpt-oss") {
        h.n_swa = f.get_int_or(a + "attention.sliding_window", 0);
        h.n_swa_layers = (h.n_layer + 1) / 2;
        h.attention = fmt::format(
            "sliding window {} tokens on every other layer, a learned sink per head", h.n_swa);
        h.experts += ", biases, clamped SwiGLU";
    }
    if (h.arch == "glm4moe" || h.arch == "dots1") {  // (the same router and shared experts)
        h.experts += fmt::format(
            ", {} shared; sigmoid router with a selection bias, weights{} x{:g}; first {} "
            "layer(s) dense",
            f.get_int_or(a + "expert_shared_count", 0),
            f.get_bool_or(a + "expert_weights_norm", false) ? " normalized" : "",
            f.get_float_or(a + "expert_weights_scale", 1.0),
            f.get_int_or(a + "leading_dense_block_count", 0));
        if (const int64_t nextn = f.get_int_or(a + "nextn_predict_layers", 0);
            nextn > 0 && nextn < h.n_layer) {  // (in the file, not run: no KV cache either)
            h.n_layer -= nextn;
            h.experts += fmt::format("; {} multi-token-prediction layer(s) not run", nextn);
        }
    }
    if (h.arch == "ernie4_5-moe")
        h.experts += fmt::format(
            ", {} shared of width {}; softmax router with a selection bias; experts on every "
            "{} layer(s) after the first {} dense",
            f.get_int_or(a + "expert_shared_count", 0),
            f.get_int_or(a + "expert_shared_feed_forward_length", 0),
            f.get_int_or(a + "interleave_moe_layer_step", 1),
            f.get_int_or(a + "leading_dense_block_count", 0));
    if (h.arch == "qwen2moe")
        h.experts += fmt::format(
            ", 1 shared of width {} gated by a sigmoid; softmax weights not renormalized",
            f.get_int_or(a + "expert_shared_feed_forward_length", h.n_ff));
    if (h.arch == "granite" || h.arch == "granitemoe")
        h.multipliers = fmt::format(
            "embeddings x{:g}, q.k x{:g}, block outputs x{:g}, logits / {:g}",
            f.get_float_or(a + "embedding_scale", 0.0), f.get_float_or(a + "attention.scale", 0.0),
            f.get_float_or(a + "residual_scale", 0.0), f.get_float_or(a + "logit_scale", 0.0));
    if (const GgufValue* toks = f.find("tokenizer.ggml.tokens");
        toks && toks->type == GgufValueType::ARRAY)
        h.n_vocab = static_cast<int64_t>(toks->as_array().size());
    return h;
}

std::string human_bytes(double b) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4) b /= 1024, ++u;
    return u == 0 ? fmt::format("{:.0f} {}", b, units[u]) : fmt::format("{:.2f} {}", b, units[u]);
}

// kvrun info on a LoRA adapter file (lora.h): its base architecture, alpha and matrices.
int run_info_adapter(const InfoOptions& o, const GgufFile& f) {
    std::map<std::string, int64_t> rank;  // adapted matrix -> rank
    constexpr std::string_view kA = ".lora_a";
    for (const GgufTensorInfo& t : f.tensors())
        if (t.name.ends_with(kA) && t.dims.size() == 2)
            rank[t.name.substr(0, t.name.size() - kA.size())] = t.dims[1];
    const std::string arch = f.get_string_or("general.architecture", "");
    const double alpha = f.get_float_or("adapter.lora.alpha", 0.0);
    if (o.json) {
        nlohmann::json j;
        j["file"] = o.model;
        j["type"] = "adapter";
        j["adapter"] = {{"type", f.get_string_or("adapter.type", "")},
                        {"architecture", arch},
                        {"alpha", alpha},
                        {"matrices", rank}};
        fmt::print("{}\n", j.dump(2));
        return 0;
    }
    fmt::print("file            {}{}\n", o.model,
               f.n_splits() > 1 ? fmt::format("  (the first of {} files)", f.n_splits()) : "");
    fmt::print(
        "adapter         {} for architecture {} (use it with --lora next to its base "
        "model)\n",
        f.get_string_or("adapter.type", "?"), arch);
    fmt::print("alpha           {:g}\n", alpha);
    fmt::print("matrices        {}\n", rank.size());
    for (const auto& [name, r] : rank) fmt::print("  {:<40} rank {}\n", name, r);
    return 0;
}

// kvrun info on an importance matrix (imatrix.h): chunks, datasets and its matrices.
int run_info_imatrix(const InfoOptions& o) {
    const Imatrix im = load_imatrix(o.model);
    if (o.json) {
        nlohmann::json j;
        j["file"] = o.model;
        j["type"] = "imatrix";
        j["chunks"] = im.chunks;
        j["chunk_size"] = im.chunk_size;
        j["datasets"] = im.datasets;
        nlohmann::json m;
        for (const auto& [name, e] : im.entries)
            m[name] = {{"columns", e.n_in}, {"matrices", e.counts.size()}, {"counts", e.counts}};
        j["entries"] = m;
        fmt::print("{}\n", j.dump(2));
        return 0;
    }
    fmt::print("file            {}\n", o.model);
    fmt::print(
        "imatrix         {} matrices, {} chunks of {} tokens (use it with quantize --imatrix)\n",
        im.entries.size(), im.chunks, im.chunk_size);
    for (const std::string& d : im.datasets) fmt::print("dataset         {}\n", d);
    if (o.tensors)
        for (const auto& [name, e] : im.entries)
            fmt::print("  {:<40} {} columns x {} matrices, {:g} rows\n", name, e.n_in,
                       e.counts.size(), e.counts.empty() ? 0.0 : e.counts.front());
    return 0;
}

// The file type llama.cpp's general.file_type names ("Q4_K_M"), "" when absent or unknown.
std::string file_type_name(const GgufFile& f) {
    const GgufValue* v = f.find("general.file_type");
    const QuantFileType* t = v && v->is_int() && v->as_int() >= 0
                                 ? quant_file_type_by_id(uint32_t(v->as_int()))
                                 : nullptr;
    return t ? std::string(t->name) : "";
}

int run_info(const InfoOptions& o) {
    GgufFile f = GgufFile::open(o.model);
    if (f.get_string_or("general.type", "") == "adapter") return run_info_adapter(o, f);
    if (f.get_string_or("general.type", "") == "imatrix") return run_info_imatrix(o);
    Hyper h = read_hyper(f);

    std::map<std::string, std::pair<int64_t, uint64_t>> histogram;  // type -> (count, bytes)
    uint64_t weight_bytes = 0;
    int64_t n_params = 0;
    int64_t n_scaled = 0;  // matrices with a NAME.scale factor (WeightView::scale)
    for (const auto& t : f.tensors()) {
        if (t.name.ends_with(".scale") &&
            f.find_tensor(t.name.substr(0, t.name.size() - 6) + ".weight"))
            ++n_scaled;
        auto& e = histogram[ggml_type_name(t.type)];
        e.first += 1;
        e.second += t.n_bytes;
        weight_bytes += t.n_bytes;
        n_params += t.n_elements;
    }
    struct KvRow {
        const char* name;
        double bytes;
    };
    std::vector<KvRow> kv_rows;
    const bool has_attn = h.n_layer > 0 && h.n_head_kv > 0 && h.head_dim > 0;
    const bool q4_ok = h.head_dim % 2 == 0;
    for (KvType t : {KvType::F32, KvType::F16, KvType::Q8, KvType::Q4}) {
        if (!has_attn || (t == KvType::Q4 && !q4_ok)) {
            kv_rows.push_back({kv_type_name(t), 0});
            continue;
        }
        // K and V: quantized K pays one scale per channel and block, V one per 32 values.
        // (DeepSeek's V reads K's latent rows: kv_v_shares_k.)
        const bool v_shared = h.arch == "deepseek2";
        const double per_elem =
            kv_bytes_per_element(t, KvRole::K, h.head_dim, o.kv_block_size) +
            (v_shared ? 0.0 : kv_bytes_per_element(t, KvRole::V, h.head_dim, o.kv_block_size));
        kv_rows.push_back(
            {kv_type_name(t), double(h.n_layer * h.n_head_kv * h.head_dim) * per_elem});
    }

    if (o.json) {
        nlohmann::json j;
        j["file"] = o.model;
        j["files"] = f.n_splits();
        j["gguf_version"] = f.version();
        j["architecture"] = h.arch;
        j["file_type"] = file_type_name(f);
        if (f.has("quantize.imatrix.file"))
            j["imatrix"] = f.get_string_or("quantize.imatrix.file", "");
        j["name"] = f.get_string_or("general.name", "");
        j["hyperparameters"] = {{"n_layer", h.n_layer},
                                {"n_embd", h.n_embd},
                                {"n_ff", h.n_ff},
                                {"n_head", h.n_head},
                                {"n_head_kv", h.n_head_kv},
                                {"head_dim", h.head_dim},
                                {"n_rot", h.n_rot},
                                {"rope_freq_base", h.rope_base},
                                {"rope_scaling", h.rope_scaling},
                                {"attention", h.attention},
                                {"multipliers", h.multipliers},
                                {"blocks", h.blocks},
                                {"experts", h.experts},
                                {"rms_norm_eps", h.norm_eps},
                                {"n_ctx_train", h.n_ctx_train}};
        const ChatTemplateChoice chat = chat_template_choose(f, "", "", false);
        j["vocab"] = {{"model", f.get_string_or("tokenizer.ggml.model", "")},
                      {"pre", f.get_string_or("tokenizer.ggml.pre", "")},
                      {"n_vocab", h.n_vocab},
                      {"bos", f.get_int_or("tokenizer.ggml.bos_token_id", -1)},
                      {"eos", f.get_int_or("tokenizer.ggml.eos_token_id", -1)},
                      {"chat_template", chat.name()},
                      {"tool_calls", tool_format_name(tool_format_detect(chat_template_source(f)))},
                      {"thinking", chat.thinks}};
        nlohmann::json types = nlohmann::json::object();
        for (auto& [name, e] : histogram) types[name] = {{"tensors", e.first}, {"bytes", e.second}};
        j["tensor_types"] = types;
        j["scaled_matrices"] = n_scaled;
        j["n_tensors"] = f.tensors().size();
        j["n_params"] = n_params;
        j["weight_bytes"] = weight_bytes;
        nlohmann::json kv = nlohmann::json::object();
        for (auto& r : kv_rows) kv[r.name] = r.bytes;
        j["kv_bytes_per_token"] = kv;
        j["kv_block_size"] = o.kv_block_size;
        if (o.tensors) {
            nlohmann::json ts = nlohmann::json::array();
            for (const auto& t : f.tensors())
                ts.push_back({{"name", t.name},
                              {"type", ggml_type_name(t.type)},
                              {"dims", t.dims},
                              {"bytes", t.n_bytes}});
            j["tensors"] = ts;
        }
        fmt::print("{}\n", j.dump(2));
        return 0;
    }

    fmt::print("file            {}{}\n", o.model,
               f.n_splits() > 1 ? fmt::format("  (the first of {} files)", f.n_splits()) : "");
    fmt::print("gguf version    {}  ({} tensors, {} metadata keys, {})\n", f.version(),
               f.tensors().size(), f.metadata().size(), human_bytes(double(f.file_size())));
    fmt::print("name            {}\n", f.get_string_or("general.name", "-"));
    fmt::print("architecture    {}\n", h.arch.empty() ? "-" : h.arch);
    if (const std::string ft = file_type_name(f); !ft.empty())
        fmt::print("file type       {}{}\n", ft,
                   f.has("quantize.imatrix.file")
                       ? fmt::format("  (quantized with the importance matrix {})",
                                     f.get_string_or("quantize.imatrix.file", ""))
                       : "");
    fmt::print("\n");
    fmt::print("hyperparameters\n");
    fmt::print("  n_layer       {:>10}    n_ctx_train   {:>10}\n", h.n_layer, h.n_ctx_train);
    fmt::print("  n_embd        {:>10}    n_ff          {:>10}\n", h.n_embd, h.n_ff);
    fmt::print("  n_head        {:>10}    n_head_kv     {:>10}\n", h.n_head, h.n_head_kv);
    fmt::print("  head_dim      {:>10}    n_rot         {:>10}\n", h.head_dim, h.n_rot);
    fmt::print("  rope_base     {:>10g}    {}  {:>10g}\n", h.rope_base,
               h.layer_norm ? "norm_eps    " : "rms_norm_eps", h.norm_eps);
    fmt::print("  rope_scaling  {}\n", h.rope_scaling);
    if (!h.attention.empty()) fmt::print("  attention     {}\n", h.attention);
    if (!h.multipliers.empty()) fmt::print("  multipliers   {}\n", h.multipliers);
    if (!h.blocks.empty()) fmt::print("  blocks        {}\n", h.blocks);
    if (!h.experts.empty()) fmt::print("  experts       {}\n", h.experts);
    fmt::print("\n");
    const std::string pre = f.get_string_or("tokenizer.ggml.pre", "");
    fmt::print("vocabulary      {}{}, {} tokens, bos {}, eos {}\n",
               f.get_string_or("tokenizer.ggml.model", "-"),
               pre.empty() ? "" : " (pre-tokenizer " + pre + ")", h.n_vocab,
               f.get_int_or("tokenizer.ggml.bos_token_id", -1),
               f.get_int_or("tokenizer.ggml.eos_token_id", -1));
    const ChatTemplateChoice chat = chat_template_choose(f, "", "", false);
    fmt::print("chat template   {}\n",
               !f.has("tokenizer.chat_template")
                   ? std::string("none in the file (chat uses plain; --chat-template picks one)")
               : chat.jinja ? std::string("not a built-in format: chat and server render the "
                                          "model's template with the Jinja interpreter")
               : chat.kind == ChatTemplateKind::Plain
                   ? "does not parse (" + chat.note + ")"
                   : chat_template_name(chat.kind) + " (detected from tokenizer.chat_template)");
    if (f.has("tokenizer.chat_template")) {
        // The server's tool calls use the template's own syntax where it renders one (with
        // or without --jinja); replies of thinking models come with their reasoning apart.
        const std::string src = chat_template_source(f);
        const ToolFormat tools = tool_format_detect(src);
        fmt::print(
            "chat features   tool calls {}{}; {}\n", tool_format_name(tools),
            tools == ToolFormat::Generic || native_tools_template(src)
                ? ""
                : " (not rendered here: the generic JSON format instead)",
            chat.thinks ? "thinks (<think> reasoning returned apart)" : "no reasoning blocks");
    }
    fmt::print("\n");
    fmt::print("tensor types    {:<8} {:>8} {:>14}\n", "type", "tensors", "bytes");
    for (auto& [name, e] : histogram)
        fmt::print("                {:<8} {:>8} {:>14}\n", name, e.first,
                   human_bytes(double(e.second)));
    fmt::print("weights         {} parameters, {}\n", n_params, human_bytes(double(weight_bytes)));
    if (n_scaled > 0)
        fmt::print(
            "                {} matrices carry a NAME.scale factor (applied to their "
            "products)\n",
            n_scaled);
    fmt::print("\n");
    fmt::print("KV cache        {:<8} {:>14} {:>16} {:>12}   (blocks of {} tokens)\n", "type",
               "bytes/token", "per 4096 tokens", "tokens/f16", o.kv_block_size);
    const double f16_bytes = kv_rows[1].bytes;
    for (auto& r : kv_rows)
        fmt::print("                {:<8} {:>14.1f} {:>16} {:>11.2f}x\n", r.name, r.bytes,
                   human_bytes(r.bytes * 4096), r.bytes > 0 ? f16_bytes / r.bytes : 0.0);
    if (h.n_swa > 0 && h.n_swa_layers > 0 && h.n_layer > 0)
        fmt::print(
            "                (per token of the {} global layers: {:.1f} bytes in f16; the {} "
            "sliding-window layers keep each sequence's last {} + 64 + --batch-size tokens, "
            "unless --swa-full)\n",
            h.n_layer - h.n_swa_layers,
            f16_bytes * double(h.n_layer - h.n_swa_layers) / double(h.n_layer), h.n_swa_layers,
            h.n_swa);
    if (o.metadata) {
        fmt::print("\nmetadata\n");
        for (const auto& [key, v] : f.metadata()) fmt::print("  {:<40} {}\n", key, v.to_display());
    }
    if (o.tensors) {
        fmt::print("\ntensors\n");
        for (const auto& t : f.tensors()) {
            std::string dims;
            for (size_t i = 0; i < t.dims.size(); ++i)
                dims += (i ? " x " : "") + std::to_string(t.dims[i]);
            fmt::print("  {:<32} {:<8} {:<20} {:>12}\n", t.name, ggml_type_name(t.type), dims,
                       human_bytes(double(t.n_bytes)));
        }
    }
    return 0;
}

}  // namespace

void add_info_command(CLI::App& root, int& exit_code) {
    auto o = std::make_shared<InfoOptions>();
    CLI::App* cmd = root.add_subcommand(
        "info",
        "Show a model's architecture, hyperparameters, vocabulary, tensor types, "
        "weight size and KV cache bytes per token");
    cmd->add_option("-m,--model", o->model, "GGUF model file")
        ->required()
        ->check(CLI::ExistingFile);
    cmd->add_flag("--json", o->json, "Print machine-readable JSON instead of a table");
    cmd->add_flag("--tensors", o->tensors, "Also list every tensor (name, type, dims, bytes)");
    cmd->add_flag("--metadata", o->metadata, "Also list every metadata key and value");
    cmd->add_option("--kv-block-size", o->kv_block_size,
                    "KV block size the KV cache costs are computed for (1-256)")
        ->check(CLI::Range(1, 256))
        ->capture_default_str();
    cmd->callback([o, &exit_code] { exit_code = run_info(*o); });
}

}  // namespace kvrun
