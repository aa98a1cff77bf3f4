// make-synthetic-model: writes a GGUF of any architecture kvrun runs, with real shapes and random
// weights (presets such as llama2-7b / llama3-8b, any hyperparameter overridable) for
// benchmarks, or cuts an existing model to its first L layers (--draft-of) for speculative
// decoding.
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <optional>
#include <thread>

#include "common.h"
#include "quant.h"
#include "synthetic_model.h"

namespace {

int run(int argc, char** argv) {
    CLI::App app{
        "make-synthetic-model: write a GGUF of any architecture kvrun runs with real\n"
        "shapes and random weights.\n"
        "Quantized tensors are random-but-valid blocks (codes from a discretized gaussian,\n"
        "per-block scales varying 0.5-1.5x, RMS = --weight-std), written directly without a\n"
        "quantizer; --exact quantizes float data with kvrun's quantizers instead (slower)."};
    std::string preset = "tiny", type = "F32", output, vocab_from, draft_of, output_type,
                expert_type;
    kvrun::SyntheticModelConfig o;  // holds the override values
    std::optional<int64_t> n_layer, n_embd, n_head, n_head_kv, n_ff, n_vocab, n_ctx, head_dim;
    std::optional<std::string> arch;
    std::optional<int64_t> sliding_window, n_expert, n_expert_used, n_ff_exp;
    bool tied_output = false;
    std::optional<double> rope_base, norm_eps, rope_factor;
    std::optional<std::string> rope_scaling;
    std::optional<int64_t> rope_orig_ctx;
    app.add_option("-o,--output", output, "output GGUF path")->required();
    std::string preset_help;
    for (const std::string& name : kvrun::synthetic_preset_names())
        preset_help += (preset_help.empty() ? "" : ", ") + name;
    app.add_option("--preset", preset, preset_help)->capture_default_str();
    app.add_option(
        "--arch", arch,
        "llama, qwen2 (Q/K/V biases), qwen3 (per-head Q/K norms), qwen3moe, qwen2moe "
        "(Qwen2's biases, unnormalized softmax expert weights, a sigmoid-gated shared "
        "expert), phi3 "
        "(fused QKV and gate/up), gemma, gemma2, gemma3, granite or granitemoe "
        "(Granite's multipliers), smollm3 (NoPE every 4th layer), gpt-oss (biases, "
        "attention sinks, clamped SwiGLU experts), glm4moe (GLM 4.5: a dense first layer, "
        "sigmoid-routed and shared experts), ernie4_5, ernie4_5-moe (ERNIE 4.5: softmax "
        "router with a selection bias, shared experts), olmo2 (OLMo 2 / 3: post "
        "norms only, Q/K norms over all heads), olmoe (OLMo's Q/K norms, unnormalized "
        "softmax expert weights), exaone4 (EXAONE 4.0: post norms, per-"
        "head Q/K norms, at 64 layers windows and global layers without RoPE), deepseek2 "
        "(latent attention, shared experts), bitnet (BitNet b1.58: norms inside the blocks, "
        "tied output), glm4 (GLM-4-0414: Q/K/V biases, post norms, fused gate/up), seed_oss "
        "(Seed-OSS: Q/K/V biases), llama4 (Llama 4: top-1 sigmoid experts with a shared one, "
        "chunked attention, no RoPE on every 4th layer), dots1 (glm4moe's experts with per-head "
        "Q/K norms), exaone (EXAONE 3.x), phi2 (Phi-2: LayerNorms, parallel blocks, a plain "
        "GELU FFN, biases), starcoder2 (StarCoder2: the same, sequential), command-r, cohere2 "
        "(Cohere: LayerNorms, parallel SwiGLU blocks, a logit scale; cohere2: windows); "
        "default: the preset's");
    app.add_option("--n-expert", n_expert,
                   "experts per layer (qwen3moe, qwen2moe, granitemoe, gpt-oss, glm4moe, "
                   "ernie4_5-moe, olmoe, llama = Mixtral)");
    app.add_option("--n-expert-used", n_expert_used, "experts per token");
    app.add_option("--n-ff-exp", n_ff_exp, "expert feed-forward width (default --n-ff)");
    app.add_option("--sliding-window", sliding_window,
                   "gemma2/gemma3/gpt-oss: attention.sliding_window (default 4096 / 1024 / "
                   "128); olmo2: a window on three layers of four (OLMo 3; default none); "
                   "exaone4: a 64-layer model's window (default 4096); llama4: the attention "
                   "chunk (default 8192); cohere2: the window (default 4096)");
    app.add_option("-t,--type", type,
                   "F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL "
                   "IQ4_XS MXFP4 NVFP4 TQ1_0 TQ2_0 Q1_0 Q4_K_M Q5_K_M")
        ->capture_default_str();
    app.add_option("--expert-type", expert_type,
                   "type of the experts' tensors (default: the preset's, else --type; "
                   "gpt-oss presets: MXFP4)");
    app.add_option("--output-type", output_type,
                   "type of output.weight (default: the --type, "
                   "Q6_K for K-quants)");
    app.add_option("--n-layer", n_layer, "number of layers (with --draft-of: layers to keep)");
    app.add_option("--n-embd", n_embd, "embedding width");
    app.add_option("--n-head", n_head, "attention heads");
    app.add_option("--n-head-kv", n_head_kv, "KV heads (GQA)");
    app.add_option("--n-ff", n_ff, "feed-forward width");
    app.add_option("--head-dim", head_dim,
                   "head size when it is not n_embd / n_head (attention.key_length)");
    app.add_flag("--tied-output", tied_output, "no output.weight: logits reuse token_embd");
    app.add_option("--n-vocab", n_vocab, "vocabulary size (synthetic SPM vocabulary)");
    app.add_option("--rope-base", rope_base, "RoPE theta");
    app.add_option("--ctx", n_ctx, "context length (llama.context_length)");
    app.add_option("--rope-scaling", rope_scaling,
                   "none, linear, yarn (rope.scaling.* metadata), llama3 (a rope_freqs.weight "
                   "tensor by Llama 3.1's rule) or longrope (Phi-3's long/short factor "
                   "tensors); default: the preset's");
    app.add_option("--rope-factor", rope_factor, "RoPE scaling factor (linear, yarn, llama3)");
    app.add_option("--rope-orig-ctx", rope_orig_ctx, "context before scaling (yarn, llama3)");
    app.add_option("--norm-eps", norm_eps, "RMSNorm epsilon");
    app.add_option("--seed", o.seed, "random seed (same seed, same bytes)")->capture_default_str();
    app.add_option("--weight-std", o.weight_std, "RMS of the weights")->capture_default_str();
    app.add_flag("--exact", o.exact, "quantize float data with quantize_row (slower)");
    app.add_option("--residual-scale", o.residual_scale,
                   "scale attn_output and ffn_down of layers >= --scaled-from")
        ->capture_default_str();
    app.add_option("--scaled-from", o.scaled_from, "first layer --residual-scale applies to")
        ->capture_default_str();
    app.add_option("--vocab-from", vocab_from, "copy tokenizer.* metadata from this GGUF");
    app.add_option("--draft-of", draft_of,
                   "instead of generating: copy the first --n-layer layers of this GGUF");
    app.add_option("--threads", o.n_threads, "worker threads (0: all cores)")
        ->capture_default_str();
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }

    if (!draft_of.empty()) {
        if (!n_layer) throw kvrun::Error("--draft-of needs --n-layer (the layers to keep)");
        auto st = kvrun::synthetic_draft_write(draft_of, *n_layer, output);
        fmt::print("{}: first {} layers of {}: {} tensors, {:.3f} G params, {:.1f} MiB, {:.2f} s\n",
                   output, *n_layer, draft_of, st.n_tensors, st.n_params / 1e9,
                   st.n_bytes / 1048576.0, st.seconds);
        return 0;
    }
    kvrun::SyntheticModelConfig c = kvrun::synthetic_preset(preset);
    kvrun::synthetic_set_type(c, type);
    if (!output_type.empty()) {
        kvrun::SyntheticModelConfig tmp;
        kvrun::synthetic_set_type(tmp, output_type);
        if (tmp.k_mix) throw kvrun::Error("--output-type must be a single tensor type");
        c.output_type = tmp.type;
    }
    if (!expert_type.empty()) {
        kvrun::SyntheticModelConfig tmp;
        kvrun::synthetic_set_type(tmp, expert_type);
        if (tmp.k_mix) throw kvrun::Error("--expert-type must be a single tensor type");
        c.expert_type = tmp.type;
    }
    if (n_layer) c.n_layer = *n_layer;
    if (n_embd) c.n_embd = *n_embd;
    if (n_head) c.n_head = *n_head;
    if (n_head_kv) c.n_head_kv = *n_head_kv;
    if (n_ff) c.n_ff = *n_ff;
    if (head_dim) c.head_dim = *head_dim;
    if (arch) c.arch = *arch;
    if (sliding_window) c.sliding_window = *sliding_window;
    if (n_expert) c.n_expert = *n_expert;
    if (n_expert_used) c.n_expert_used = *n_expert_used;
    if (n_ff_exp) c.n_ff_exp = *n_ff_exp;
    if (tied_output) c.tied_output = true;
    if (n_vocab) c.n_vocab = *n_vocab;
    if (n_ctx) c.n_ctx = *n_ctx;
    if (rope_base) c.rope_base = *rope_base;
    if (norm_eps) c.norm_eps = *norm_eps;
    if (rope_scaling) c.rope_scaling = *rope_scaling;
    if (rope_factor) c.rope_factor = *rope_factor;
    if (rope_orig_ctx) c.rope_orig_ctx = *rope_orig_ctx;
    c.seed = o.seed, c.weight_std = o.weight_std, c.exact = o.exact;
    c.residual_scale = o.residual_scale, c.scaled_from = o.scaled_from;
    c.vocab_from = vocab_from, c.n_threads = o.n_threads;
    auto st = kvrun::synthetic_model_write(c, output);
    const unsigned threads =
        c.n_threads > 0 ? unsigned(c.n_threads) : std::max(1u, std::thread::hardware_concurrency());
    fmt::print(
        "{}: {} {} {}{} | {} layers, n_embd {}, heads {}/{} x {}, n_ff {}, seed {} | {} "
        "tensors, {:.3f} G params, {:.1f} MiB | {:.2f} s on {} threads ({:.2f} GB/s)\n",
        output, c.name, c.arch, kvrun::ggml_type_name(c.type), c.k_mix ? "_M" : "", c.n_layer,
        c.n_embd, c.n_head, c.n_head_kv, kvrun::synthetic_head_dim(c), c.n_ff, c.seed, st.n_tensors,
        st.n_params / 1e9, st.n_bytes / 1048576.0, st.seconds, threads,
        st.seconds > 0 ? st.n_bytes / st.seconds / 1e9 : 0.0);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const kvrun::Error& e) {
        fmt::print(stderr, "make-synthetic-model: error: {}\n", e.what());
        if (!e.hint().empty()) fmt::print(stderr, "hint: {}\n", e.hint());
        return 1;
    } catch (const std::bad_alloc&) {
        fmt::print(stderr, "make-synthetic-model: error: out of memory\n");
        return 1;
    } catch (const std::exception& e) {
        fmt::print(stderr, "make-synthetic-model: internal error: {}\n", e.what());
        return 2;
    }
}
