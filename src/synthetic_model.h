// Synthetic llama-family models (llama, qwen2, qwen3, qwen3moe, qwen2moe, phi3, gemma 1-3,
// granite, smollm3, gpt-oss, glm4moe, ernie4_5, ernie4_5-moe, olmo2, olmoe, exaone4, deepseek2,
// bitnet, glm4, seed_oss, llama4, dots1, exaone, phi2, starcoder2, command-r, cohere2):
// GGUF
// files with real shapes (presets such as llama2-7b, llama3-8b) and random weights, generated
// quickly and deterministically from a seed, for benchmarks and tests. Also cuts a model down to
// its first L layers (a draft model for speculative decoding).
//
// Weights are N(0, weight_std^2)-like (see synthetic_fill.h for how quantized blocks are made);
// norm weights are F32 near 1. The tokenizer is a synthetic SPM vocabulary (synthetic_vocab.h)
// or the tokenizer.* metadata copied from another GGUF. Every tensor row is seeded from
// (seed, tensor name, row), so two models with the same seed share identical tensors wherever
// names and shapes agree (e.g. a 4-layer model equals the first 4 layers of a 32-layer one).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gguf.h"

namespace kvrun {

struct SyntheticModelConfig {
    std::string name = "custom";  // preset name (goes into general.name)
    // general.architecture: llama; qwen2 (adds Q/K/V biases); qwen3 (adds per-head Q/K norms);
    // phi3 (Q/K/V fused in attn_qkv, gate and up fused in ffn_up); gemma, gemma2 (post norms,
    // soft caps, sliding window), gemma3 (post norms, Q/K norms, sliding window): always a
    // tied output; granite, granitemoe (llama / Mixtral-style experts with Granite's four
    // multipliers below); smollm3 (no RoPE on layers 3, 7, 11, ...); gpt-oss (experts with
    // biases, Q/K/V/output biases, attention sinks, a sliding window on even layers); glm4moe
    // (below); olmo2 (post norms only, Q/K norms over all heads; with sliding_window > 0, OLMo
    // 3's window on three layers of four); olmoe (OLMo's Q/K norms, experts weighted by their
    // softmax probabilities unnormalized); exaone4 (post norms only, per-head Q/K norms; at 64
    // layers a window on three layers of four, the others without RoPE); qwen2moe (Qwen2's
    // biases, experts weighted by their softmax probabilities unnormalized, one shared expert
    // of width n_ff_shexp (0: n_ff) scaled by a sigmoid gate, ffn_gate_inp_shexp); glm4
    // (GLM-4-0414: Q/K/V biases, Gemma 2's post norms, gate and up fused in ffn_up; with
    // fused_qkv, Q/K/V and their biases in attn_qkv; n_nextn more layers at the end);
    // seed_oss (Seed-OSS: Q/K/V biases, the FFN's norm named post_attention_norm); llama4
    // (Llama 4: experts on every moe_step-th layer, the others dense, one shared expert of the
    // experts' width; sliding_window > 0: the attention chunk, else the default 8192); dots1
    // (dots.llm1: glm4moe's router, dense lead and shared experts, with per-head Q/K norms and
    // no biases); exaone (EXAONE 3.x: llama with NeoX pairs); phi2 (Phi-2: LayerNorms with
    // biases, parallel blocks, a plain GELU FFN with biases, Q/K/V and output biases, an output
    // bias; with fused_qkv, Q/K/V and their biases in attn_qkv); starcoder2 (StarCoder2:
    // LayerNorms with biases, sequential blocks, phi2's FFN and biases); command-r (Command-R:
    // LayerNorms without biases, parallel blocks with a SwiGLU FFN, logit_scale 0.0625, a tied
    // output); cohere2 (Command R7B / A: command-r with sliding_window (0: 4096) on three layers
    // of four, the others without RoPE).
    std::string arch = "llama";
    bool fused_qkv = false;
    // gemma2 / gemma3 / gpt-oss: attention.sliding_window (0: 4096 / 1024 / 128); olmo2: the
    // window when > 0 (0: none); exaone4: the window of a 64-layer model (0: 4096)
    int64_t sliding_window = 0;
    double attn_softcap = 50.0, final_softcap = 30.0;  // gemma2's soft caps
    // Mixture of experts (qwen3moe, or llama = Mixtral): n_expert SwiGLU experts of width
    // n_ff_exp (0: n_ff) in ffn_*_exps tensors, an F32 router, n_expert_used per token.
    int64_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0;
    // The experts' type (ffn_*_exps) when it differs from `type` (gpt-oss's GGUFs: MXFP4);
    // F32 means `type`.
    GgmlType expert_type = GgmlType::F32;
    // glm4moe (GLM 4.5): Q/K/V biases; the first n_layer_dense layers dense (n_ff), the others
    // experts with a sigmoid router and its selection bias (exp_probs_b), n_expert_shared shared
    // experts (ffn_*_shexp), expert_weights_scale and expert_weights_norm; n_nextn more layers
    // at the end (multi-token prediction: in the file, not run); glm_qk_norm: per-head Q/K
    // norms (GLM 4.5 355B has them, Air not).
    int64_t n_layer_dense = 1, n_expert_shared = 1, n_nextn = 0;
    // ernie4_5-moe (ERNIE 4.5): the same dense layers first, then experts on every moe_step-th
    // layer, a softmax router with a selection bias, shared experts of width n_ff_shexp (0:
    // n_ff_exp * n_expert_shared; qwen2moe: its shared expert's width, 0: n_ff). ernie4_5: a dense
    // ERNIE 4.5 (llama's shape).
    int64_t moe_step = 1, n_ff_shexp = 0;
    double expert_weights_scale = 1.0;
    bool expert_weights_norm = true, glm_qk_norm = false;
    // deepseek2 (DeepSeek V2 / V3): latent attention of rank mla_rank (attn_kv_a_mqa [n_embd,
    // mla_rank + rope_dims], attn_kv_a_norm; attn_k_b [mla_nope, mla_rank, n_head] and attn_v_b
    // [mla_rank, mla_v, n_head], or with mla_legacy one attn_kv_b [mla_rank, n_head * (mla_nope
    // + mla_v)] and the older key_length / value_length keys); Q from attn_q or, with
    // mla_q_rank > 0, attn_q_a, attn_q_a_norm and attn_q_b; rope_dims (required) rotated dims
    // per head; glm4moe's dense layers, shared experts (of the experts' width) and weights;
    // expert_gating 1 (softmax) or 2 (sigmoid, with exp_probs_b); yarn_log_mul: the
    // mscale_all_dim written times 0.1 as rope.scaling.yarn_log_multiplier, as llama.cpp's
    // converter does (0: none). Tensors whose rows are not whole blocks of `type` are Q8_0 (or
    // F16).
    int64_t mla_rank = 0, mla_q_rank = 0, mla_nope = 0, mla_v = 0;
    bool mla_legacy = false;
    int expert_gating = 1;
    double yarn_log_mul = 0;
    // expert_group_count / expert_group_used_count when n_group > 0 (DeepSeek V3: 8 / 4).
    int64_t n_group = 0, n_group_used = 0;
    // granite / granitemoe keys: embedding_scale, attention.scale, residual_scale, logit_scale
    // (Granite 3.x 8B's values; attention.scale 0: 1 / head_dim).
    double granite_embedding_scale = 12.0, granite_attention_scale = 0.0;
    double granite_residual_scale = 0.22, granite_logit_scale = 16.0;
    int64_t n_layer = 2;
    int64_t n_embd = 256;
    int64_t n_head = 4;
    int64_t n_head_kv = 2;
    int64_t head_dim = 0;      // 0: n_embd / n_head; otherwise written as attention.key_length
    int64_t rope_dims = 0;     // rope.dimension_count (partial rotary, Phi-4-mini); 0: head_dim
    bool tied_output = false;  // no output.weight: the logits reuse token_embd
    int64_t n_ff = 512;
    int64_t n_vocab = 512;  // ignored with vocab_from (taken from that file)
    int64_t n_ctx = 2048;
    double rope_base = 10000.0;
    double norm_eps = 1e-5;
    // RoPE scaling written into the model: none; linear or yarn (rope.scaling.type, .factor
    // = rope_factor and, for yarn, .original_context_length = rope_orig_ctx); or llama3: a
    // rope_freqs.weight tensor by Llama 3.1's rule (llama3_rope_factors) from rope_factor and
    // rope_orig_ctx; or longrope: Phi-3's rope_factors_long / rope_factors_short tensors (long
    // rising to rope_factor), original context rope_orig_ctx, and the converter's attention
    // factor for n_ctx. rope_freqs, when not empty, is written as rope_freqs.weight instead.
    std::string rope_scaling = "none";
    double rope_factor = 8.0;
    int64_t rope_orig_ctx = 8192;
    std::vector<float> rope_freqs;

    GgmlType type = GgmlType::F32;         // 2-D weights (attention, FFN) and token_embd
    GgmlType output_type = GgmlType::F32;  // output.weight
    // Q4_K_M / Q5_K_M-style mix: attn_v and ffn_down of some layers (llama.cpp's "use more
    // bits" rule: the first and last eighth, and every third layer between) in Q6_K.
    bool k_mix = false;

    uint64_t seed = 1;
    float weight_std = 0.02f;
    bool exact = false;  // quantize float data with quantize_row instead of random blocks

    // Agreement dial: attn_output and ffn_down of layers >= scaled_from get std * residual_scale.
    float residual_scale = 1.0f;
    int64_t scaled_from = 0;

    std::string vocab_from;  // copy tokenizer.* metadata from this GGUF when not empty
    int n_threads = 0;       // 0: all hardware threads
};

struct SyntheticModelStats {
    int64_t n_params = 0;  // elements in all tensors
    uint64_t n_bytes = 0;  // file size
    int64_t n_tensors = 0;
    double seconds = 0;  // wall time (generation + writing)
};

// Llama 3.1's per-pair frequency divisors (what llama.cpp's converter stores as
// rope_freqs.weight): pairs whose wavelength 2 pi / base^(-2i/n_rot) is below
// orig_ctx / high_freq_factor keep their frequency, those above orig_ctx / low_freq_factor
// are divided by `factor`, and the band between is blended smoothly. [n_rot / 2] values.
std::vector<float> llama3_rope_factors(int64_t n_rot, double base, double factor,
                                       double low_freq_factor, double high_freq_factor,
                                       int64_t orig_ctx);

// The head size of `cfg`: head_dim, or n_embd / n_head when it is 0.
int64_t synthetic_head_dim(const SyntheticModelConfig& cfg);

// Names accepted by synthetic_preset: llama2-7b, llama3-8b, llama3.1-8b, llama-1b, qwen2.5-7b,
// qwen3-0.6b, qwen3-8b, qwen3-30b-a3b, mixtral-8x7b, phi3-mini, phi3-mini-128k, phi4,
// gemma2-2b, gemma3-1b, gemma3-4b, granite3-8b, granite3-3b-a800m, smollm3-3b, phi4-mini,
// gpt-oss-20b, gpt-oss-120b, glm4.5-air, ernie4.5-0.3b, ernie4.5-21b-a3b, olmo2-7b, olmo3-7b,
// olmoe-1b-7b, exaone4-32b, qwen1.5-moe-a2.7b, qwen2-57b-a14b, deepseek-v2-lite, deepseek-v3,
// bitnet-b1.58-large, bitnet-b1.58-3b, glm4-9b, glm4-32b, seed-oss-36b, llama4-scout,
// llama4-maverick, dots1, exaone3.5-7.8b, phi2, starcoder2-3b, starcoder2-7b, command-r-35b,
// command-r7b, tiny.
std::vector<std::string> synthetic_preset_names();
// The hyperparameters of a preset (type F32, other fields default). Throws Error for an
// unknown name, listing the known ones.
SyntheticModelConfig synthetic_preset(std::string_view name);

// Sets cfg.type, cfg.output_type and cfg.k_mix from a type name: a GGUF type (F32, F16, BF16,
// Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4, NVFP4,
// TQ1_0, TQ2_0, Q1_0; output in the same type, except Q6_K for K-quants and the ternary and
// binary types) or a mix (Q4_K_M, Q5_K_M). Case-insensitive.
void synthetic_set_type(SyntheticModelConfig& cfg, std::string_view type_name);

// Checks shapes and types (head_dim, GQA ratio, block-size divisibility, ...); throws Error.
void synthetic_validate(const SyntheticModelConfig& cfg);

// Generates the model and writes it to `path`. Throws Error on bad config or I/O failure.
SyntheticModelStats synthetic_model_write(const SyntheticModelConfig& cfg, const std::string& path);

// Writes a copy of the llama GGUF at `src_path` keeping only its first n_layer layers
// (tensors copied byte for byte, llama.block_count set to n_layer, other metadata kept).
SyntheticModelStats synthetic_draft_write(const std::string& src_path, int64_t n_layer,
                                          const std::string& path);

}  // namespace kvrun
