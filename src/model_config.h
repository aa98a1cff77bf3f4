// Typed model hyperparameters read from GGUF metadata (`<arch>.*` keys) for the supported
// architectures (llama, qwen2, qwen3, qwen3moe, qwen2moe, phi3, gemma, gemma2, gemma3,
// granite, granitemoe, smollm3, gpt-oss, glm4moe, ernie4_5, ernie4_5-moe, olmo2, olmoe,
// exaone4, deepseek2, bitnet, glm4, seed_oss, llama4, dots1, exaone, phi2, starcoder2, command-r,
// cohere2), validated so the forward pass can trust them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gguf.h"
#include "rope.h"

namespace kvrun {

struct ModelConfig {
    std::string arch;                 // general.architecture (llama, qwen*, phi3, gemma*, granite*)
    int64_t n_layer = 0;              // block_count
    int64_t n_embd = 0;               // embedding_length
    int64_t n_ff = 0;                 // feed_forward_length
    int64_t n_head = 0;               // attention.head_count
    int64_t n_kv_head = 0;            // attention.head_count_kv (default n_head)
    int64_t head_dim = 0;             // attention.key_length (default n_embd / n_head)
    int64_t n_rot = 0;                // rope.dimension_count (default head_dim)
    int64_t n_vocab = 0;              // rows of the output (or embedding) tensor
    int64_t n_ctx_train = 0;          // context_length (0 when absent)
    float norm_eps = 1e-5f;           // attention.layer_norm_rms_epsilon
    float rope_freq_base = 10000.0f;  // rope.freq_base
    float rope_freq_scale = 1.0f;     // 1 / rope.scaling.factor (linear and YaRN scaling)
    bool rope_neox = false;           // rotate pairs (i, i + n_rot/2) instead of (2i, 2i+1)
    // rope_freqs.weight (Llama 3.1 and later): [n_rot / 2] divisors of the pair frequencies;
    // empty when the model has none.
    std::vector<float> rope_freq_factors;
    // Phi-3's LongRoPE (rope_factors_long.weight / rope_factors_short.weight, [n_rot / 2]
    // each, or empty): select_rope_factors puts one of them into rope_freq_factors.
    std::vector<float> rope_factors_long, rope_factors_short;
    std::string rope_scaling = "none";  // rope.scaling.type: none, linear or yarn
    // YaRN (rope_scaling "yarn"): the context the model was trained for before scaling
    // (rope.scaling.original_context_length, default context_length), the extrapolation mix
    // (1), the attention factor (rope.scaling.attn_factor, 1) and the correction range's
    // turn counts beta_fast 32 and beta_slow 1 (llama.cpp's defaults).
    int64_t yarn_n_ctx_orig = 0;
    float yarn_ext_factor = 1.0f, yarn_attn_factor = 1.0f;
    float yarn_beta_fast = 32.0f, yarn_beta_slow = 1.0f;
    bool qkv_bias = false;  // the architecture requires Q/K/V biases (qwen2)
    bool qk_norm = false;   // per-head RMSNorm of Q and K before RoPE (qwen3)
    // OLMo 2 and 3 (olmo2), OLMoE: Q and K are RMS-normalized over their whole width (all
    // heads at once: attn_q_norm [q_dim], attn_k_norm [kv_dim]) before RoPE. olmo2 and exaone4:
    // no norm comes before the attention or the FFN (pre_norms false): each block reads the
    // residual stream as it is, and only its output is normed (post_norms) before the residual
    // add.
    bool qk_norm_full = false;
    bool pre_norms = true;
    // ffn_up holds the gate's rows then the up projection's, [2 n_ff][n_embd], and there is
    // no ffn_gate (phi3).
    bool fused_gate_up = false;
    // The Gemma family: token embeddings times embd_scale (sqrt(n_embd); 1 otherwise); a
    // GELU (tanh approximation) gate instead of SiLU; RMSNorms on each block's output before
    // its residual add (attn_post_norm, ffn_post_norm: gemma2, gemma3); soft caps
    // cap * tanh(x / cap) on the attention scores and on the logits (0: none; gemma2).
    float embd_scale = 1.0f;
    bool ffn_gelu = false;
    bool post_norms = false;
    // BitNet: RMSNorms inside the blocks, of the attention's output ([q_dim]) before
    // attn_output and of the gated FFN product ([n_ff]) before ffn_down (attn_sub_norm,
    // ffn_sub_norm); the output is always the embedding's transpose, as in llama.cpp.
    bool sub_norms = false;
    // LayerNorm instead of RMSNorm for the norms of the residual stream (attn_norm, ffn_norm,
    // output_norm): x minus its mean, over its standard deviation, times the weight, plus the
    // NAME.bias beside it when there is one (phi2, starcoder2, command-r, cohere2; norm_eps from
    // attention.layer_norm_epsilon).
    bool layer_norm = false;
    // Parallel blocks (phi2, command-r, cohere2): the attention and the FFN both read the
    // attention norm's output, and both outputs join the residual stream (there is no ffn_norm).
    bool parallel_blocks = false;
    // A plain FFN (phi2, starcoder2): down(gelu(up x + up_b)) + down_b, with no gate (GELU's tanh
    // approximation; the biases when the file has them).
    bool ffn_plain = false;
    float attn_softcap = 0.0f, final_softcap = 0.0f;
    // Scale of q.k (1 / sqrt(head_dim), or what the architecture prescribes).
    float attn_scale = 0.0f;
    // Granite's multipliers (1 elsewhere): each block's output (attention, FFN) is scaled by
    // residual_scale before its residual add, and the logits by logit_scale (1 / the GGUF's
    // logit_scale, which divides); granite's embedding_scale is embd_scale and its
    // attention.scale attn_scale.
    float residual_scale = 1.0f, logit_scale = 1.0f;
    // SmolLM3's NoPE layers: layer l applies no RoPE to Q and K when nope_step > 0 and
    // (l + 1) % nope_step == 0 (0: every layer rotates).
    int64_t nope_step = 0;
    // EXAONE 4.0 32B: with a sliding window, only the windowed layers rotate.
    bool rope_swa_only = false;
    bool uses_rope(int64_t l) const {
        if (rope_swa_only && n_swa > 0 && !is_swa(l)) return false;
        return nope_step <= 0 || (l + 1) % nope_step != 0;
    }
    // Sliding-window attention: layer l attends to its last n_swa tokens (itself included)
    // when swa_pattern > 0 and l % swa_pattern < swa_pattern - 1 (gemma2: every other layer,
    // gemma3: five of six). Such layers rotate with rope_swa().
    int64_t n_swa = 0;
    int64_t swa_pattern = 0;
    float rope_freq_base_swa = 0.0f;
    // Mixture of experts (qwen3moe; llama with expert_count: Mixtral): each FFN is n_expert
    // SwiGLU experts of width n_ff_exp (expert_feed_forward_length, else feed_forward_length);
    // a token goes to the n_expert_used with the largest softmax router probabilities,
    // weighted by those probabilities renormalized to sum 1. 0: a dense FFN.
    int64_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0;
    bool moe() const { return n_expert > 0; }
    // GLM 4.5 (glm4moe) and ERNIE 4.5 (ernie4_5-moe): the first n_layer_dense layers have a
    // dense FFN of width n_ff (leading_dense_block_count), and after them every moe_step-th
    // (interleave_moe_layer_step: layers l with (l + 1) % moe_step == 0) has experts. GLM's
    // router gates each expert with a sigmoid instead of the softmax (moe_sigmoid). A
    // per-expert selection bias (exp_probs_b, when the layer has one) joins the gates to choose
    // the top experts but not to weight them; the weights are the gates, over their sum when
    // moe_norm, times moe_scale (expert_weights_scale). Shared experts (n_expert_shared of
    // them), one SwiGLU FFN of width n_ff_shexp (0: none), add to every token's output. The
    // softmax router always renormalizes (moe_norm true).
    int64_t n_layer_dense = 0, moe_step = 1, n_expert_shared = 0, n_ff_shexp = 0;
    bool moe_sigmoid = false, moe_norm = true;
    // The selection bias is required (GLM 4.5, dots1, DeepSeek V3's sigmoid router, as in
    // llama.cpp); elsewhere it is applied when a layer has one (ERNIE 4.5).
    bool moe_select_bias = false;
    // Qwen2-MoE: the shared expert's output is scaled, token by token, by
    // sigmoid(ffn_gate_inp_shexp · x) (x: the FFN's normed input) before it joins the experts'.
    bool shexp_gate = false;
    float moe_scale = 1.0f;
    bool moe_layer(int64_t l) const {
        return moe() && l >= n_layer_dense && (l + 1) % moe_step == 0;
    }
    // Trailing layers for multi-token prediction (nextn_predict_layers, GLM 4.5) are in the
    // file but not run: block_count minus n_nextn is n_layer.
    int64_t n_nextn = 0;
    // The FFN's input norm is the tensor llama.cpp names post_attention_norm (gpt-oss, GLM 4.5,
    // Seed-OSS: Hugging Face's post_attention_layernorm), not ffn_norm.
    bool ffn_norm_post_attention = false;
    // gpt-oss: each head's softmax has a learned sink logit (attn_sinks.weight; the mass it
    // takes goes to no token), and the experts use OpenAI's clamped SwiGLU
    // (cpu::swiglu_oai with swiglu_alpha, swiglu_limit). Its biases (attention output, router,
    // experts) are tensors the weights carry, not flags.
    bool attn_sinks = false;
    bool swiglu_oai = false;
    float swiglu_alpha = 1.702f, swiglu_limit = 7.0f;
    // Expert groups (expert_group_count, expert_group_used_count; DeepSeek V3): a token's
    // experts come from its n_group_used best groups of n_expert / n_group, a group scored by
    // the sum of its two best selection scores (0 or 1 group: no limit).
    int64_t n_group = 0, n_group_used = 0;
    // DeepSeek V2 / V3 (deepseek2): multi-head latent attention, computed absorbed (as llama.cpp
    // and vLLM do). A token's K and V are one latent row of head_dim = n_rot + mla_rank values,
    // shared by every head (n_kv_head 1): its RoPE'd n_rot dims (k_pe) first, then the
    // RMS-normed compressed KV (mla_rank, attention.kv_lora_rank); the heads' values are that
    // latent part. Each head's query is [q_pe (rotated), wk_b · q_nope] (q_nope: mla_nope dims,
    // wk_b: [mla_rank][mla_nope]); its attention output's latent part is decompressed by
    // wv_b ([mla_v][mla_rank]) before attn_output ([n_embd][n_head * mla_v]). Q comes from one
    // matrix (attn_q) or, with mla_q_rank > 0 (attention.q_lora_rank), from attn_q_a, an RMSNorm
    // and attn_q_b. q.k is scaled by mscale^2 / sqrt(mla_nope + n_rot) with YaRN's
    // mscale = 1 + 0.1 mla_log_mul ln(1 / rope_freq_scale) (mla_log_mul:
    // rope.scaling.yarn_log_multiplier / 0.1, as llama.cpp reads it), and RoPE then leaves the
    // magnitudes alone.
    int64_t mla_rank = 0, mla_q_rank = 0, mla_nope = 0, mla_v = 0;
    float mla_log_mul = 0.0f;
    bool mla() const { return mla_rank > 0; }

    // The context RoPE scaling was trained from: rope.scaling.original_context_length, else
    // context_length (0 when neither is known).
    int64_t rope_orig_ctx() const;

    // Whether layer l uses the sliding window, and the window (0: the whole context).
    bool is_swa(int64_t l) const {
        return n_swa > 0 && swa_pattern > 0 && l % swa_pattern < swa_pattern - 1;
    }
    int64_t window(int64_t l) const { return is_swa(l) ? n_swa : 0; }
    // Llama 4's chunked attention (swa_chunked): a windowed layer's token at slot s sees the
    // slots of its own n_swa-aligned chunk, floor(s / n_swa) * n_swa .. s, a subset of the last
    // n_swa that the window pool keeps. attn_window(l) is what the attention ops take: the
    // window, or -n_swa for a chunk (0: the whole context).
    bool swa_chunked = false;
    int64_t attn_window(int64_t l) const { return is_swa(l) && swa_chunked ? -n_swa : window(l); }
    // Llama 4's attention temperature on its layers without RoPE: the queries of the token at
    // position p are scaled by 1 + attn_temp_scale * ln(1 + floor((p + 1) / attn_temp_floor))
    // (attn_temp_scale 0: none).
    float attn_temp_scale = 0.0f;
    int64_t attn_temp_floor = 8192;
    // Llama 4 (not Maverick): Q and K of each head of the rotating layers are RMS-normalized
    // without weights (llama.cpp's Llama4TextL2Norm after RoPE; the same before it, since
    // RoPE keeps a head's norm). Loaded as unit q_norm / k_norm weights on those layers.
    bool qk_l2_norm = false;
    // Llama 4: each chosen expert's input is scaled by its router weight, and its output joins
    // the sum unweighted (SwiGLU makes that differ from weighting the output).
    bool moe_weight_before = false;
    // The RoPE of the sliding-window layers: rope(factors), or with rope_freq_base_swa > 0
    // that base, unscaled (gemma3).
    RopeParams rope_swa(const float* factors) const;

    int64_t q_dim() const { return n_head * head_dim; }      // width of Q / attention out
    int64_t kv_dim() const { return n_kv_head * head_dim; }  // width of K and V

    // The RoPE parameters for the forward pass (YaRN's ramp and attention factor worked out);
    // `factors` is where rope_freq_factors live for the caller (host or device memory), null
    // when there are none.
    RopeParams rope(const float* factors) const;
};

// llama.cpp's --rope-* and --yarn-* overrides of the model's RoPE; unset fields keep the
// model's values.
struct RopeOverrides {
    std::string scaling;          // "" (model's), none, linear or yarn
    float freq_base = 0;          // > 0: replaces rope.freq_base
    float freq_scale = 0;         // > 0: replaces the scale (--rope-scale N is 1 / N)
    int64_t yarn_orig_ctx = 0;    // > 0: YaRN's original context
    float yarn_ext_factor = -1;   // >= 0: YaRN's extrapolation mix
    float yarn_attn_factor = -1;  // > 0: YaRN's attention factor
    float yarn_beta_fast = -1;    // > 0
    float yarn_beta_slow = -1;    // > 0
};

// LongRoPE (Phi-3 128K): the long factors when the run's context per sequence `n_ctx` (0:
// the training context) exceeds rope_orig_ctx(), else the short ones, as llama.cpp does.
// Nothing for other models.
void select_rope_factors(ModelConfig& c, int64_t n_ctx);

// Applies the overrides (validated: Error naming the flag for a bad value).
void apply_rope_overrides(ModelConfig& c, const RopeOverrides& o);

// Reads and validates the hyperparameters. Throws Error naming the key for a missing or
// invalid value, and "unsupported architecture 'x' (supported: llama, qwen2, ...)" listing
// them all.
ModelConfig model_config_from_gguf(const GgufFile& file);

}  // namespace kvrun
