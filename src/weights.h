// The tensor-name table of llama-family GGUF models: finds every weight, checks its shape
// and type, and exposes 2-D matrices as WeightViews into the file's mapping (no copies) and
// 1-D norm / bias vectors as float32.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "cpu_ops.h"
#include "gguf.h"
#include "model_config.h"

namespace kvrun {

// One LoRA adapter's update of a matrix W: W x becomes W x + scale * B (A x), with
// A: [rank][n_in] and B: [n_out][rank] (views into the adapter file; see lora.h).
// The scale of a LoRA update for a user scale (a request's or --lora-scaled's) and the
// update's alpha / rank: both backends compute it this way, per row.
inline float lora_row_scale(float user, double per_unit) {
    return static_cast<float>(double(user) * per_unit);
}

struct LoraDelta {
    WeightView a, b;
    float scale = 1.0f;     // user scale x per_unit (the adapter's loaded scale)
    double per_unit = 1.0;  // alpha / rank (1 without alpha): scale = float(user * per_unit)
    int32_t adapter = 0;    // which adapter (index into BackendOptions::lora)
};

struct LayerWeights {
    std::vector<float> attn_norm;   // [n_embd]; empty without pre norms (olmo2)
    // [n_embd] each: the LayerNorms' biases (ModelConfig::layer_norm; phi2, starcoder2), or empty.
    std::vector<float> attn_norm_b, ffn_norm_b;
    WeightView wq, wk, wv, wo;      // [q_dim][n_embd], [kv_dim][n_embd] x2,
                                    // [n_embd][q_dim]
    std::vector<float> bq, bk, bv;  // [q_dim], [kv_dim], [kv_dim]; empty if none
    std::vector<float> bo;          // [n_embd] attention output bias (gpt-oss), or empty
    std::vector<float> sinks;       // [n_head] attention sink logits (gpt-oss), or empty
    // [head_dim] each (qwen3's per-head RMSNorm), [q_dim] and [kv_dim] (olmo2's over all
    // heads), or empty.
    std::vector<float> q_norm, k_norm;
    std::vector<float> ffn_norm;  // [n_embd]; empty without pre norms (olmo2)
    // [n_embd] each: RMSNorm weights of the attention and FFN outputs (gemma2/3), or empty.
    std::vector<float> attn_post_norm, ffn_post_norm;
    // BitNet's norms inside the blocks (ModelConfig::sub_norms): [q_dim] and [n_ff], or empty.
    std::vector<float> attn_sub_norm, ffn_sub_norm;
    WeightView w_gate, w_up, w_down;  // [n_ff][n_embd] x2, [n_embd][n_ff] (dense FFN layers)
    // A plain FFN (ModelConfig::ffn_plain) has no w_gate (null data); its biases b_up [n_ff] and
    // b_down [n_embd], or empty.
    std::vector<float> b_up, b_down;
    // Mixture of experts: the router [n_expert][n_embd] and each expert's views into the
    // stacked ffn_*_exps tensors ([n_ff_exp][n_embd] x2, [n_embd][n_ff_exp]).
    WeightView router;
    std::vector<WeightView> gate_exps, up_exps, down_exps;
    // Their biases (gpt-oss), or empty: router_b [n_expert]; gate_exps_b, up_exps_b
    // [n_expert][n_ff_exp]; down_exps_b [n_expert][n_embd].
    std::vector<float> router_b, gate_exps_b, up_exps_b, down_exps_b;
    // GLM 4.5: the router's per-expert selection bias [n_expert] (exp_probs_b; it picks the
    // experts, not their weights), and the shared experts as one SwiGLU FFN ([n_ff_shexp][n_embd]
    // x2, [n_embd][n_ff_shexp]); empty without.
    std::vector<float> exp_probs_b;
    WeightView gate_shexp, up_shexp, down_shexp;
    // Qwen2-MoE: the shared expert's gate, one row [1][n_embd] (ffn_gate_inp_shexp); empty
    // without.
    WeightView gate_inp_shexp;
    // DeepSeek's latent attention (ModelConfig::mla_rank): wq ([n_head * (mla_nope + n_rot)]
    // [n_embd]) or wq_a ([mla_q_rank][n_embd]), q_a_norm ([mla_q_rank]) and wq_b
    // ([n_head * (mla_nope + n_rot)][mla_q_rank]); wkv_a ([mla_rank + n_rot][n_embd]: the
    // compressed KV, then k_pe) and kv_a_norm ([mla_rank]); per head wk_b [mla_rank][mla_nope]
    // and wv_b [mla_v][mla_rank]; wo is [n_embd][n_head * mla_v]. Empty otherwise.
    WeightView wq_a, wq_b, wkv_a;
    std::vector<float> q_a_norm, kv_a_norm;
    std::vector<WeightView> wk_b, wv_b;
    // wk_b / wv_b come from an older file's attn_kv_b (wk_b transposed into F32): a matmul
    // observer (imatrix) is not shown them, as attn_kv_b's input is the latent c, not theirs.
    bool kv_b_fused = false;
    // LoRA adapters' updates of wq .. w_down (lora.h), in adapter order; empty without.
    std::vector<LoraDelta> lora_q, lora_k, lora_v, lora_o, lora_gate, lora_up, lora_down;
};

struct ModelWeights {
    WeightView token_embd;           // [n_vocab][n_embd]
    std::vector<float> output_norm;  // [n_embd]
    std::vector<float> output_norm_b;  // [n_embd] (a LayerNorm's bias: phi2, starcoder2) or empty
    std::vector<float> output_b;       // [n_vocab] the output's bias (phi2) or empty
    WeightView output;               // [n_vocab][n_embd] (token_embd when tied)
    bool output_tied = false;
    std::vector<LayerWeights> layers;    // [n_layer]
    uint64_t matrix_bytes = 0;           // bytes of all 2-D weights (tied counted once)
    std::vector<LoraDelta> lora_output;  // LoRA updates of output (lora.h)
    // Weights made at load time rather than viewed in the file (the F32 wk_b that an older
    // DeepSeek file's attn_kv_b holds transposed); views above point into them.
    std::vector<std::shared_ptr<const std::vector<float>>> owned;
};

// A view of tensor t as n_out rows of n_in elements, checked: a type kvrun computes with, rows
// of whole blocks, enough bytes (the caller checks the shape). Throws Error naming the tensor.
WeightView matrix_view(const GgufFile& f, const GgufTensorInfo& t, int64_t n_in, int64_t n_out);
// Rows [r0, r0 + n) of a matrix: a view into the same bytes (each GGUF row is a whole number
// of blocks, so a fused tensor splits into its parts without copying).
WeightView row_slice(const WeightView& w, int64_t r0, int64_t n);

// Looks up and checks every tensor. Throws Error naming the tensor for a missing tensor, a
// wrong shape (expected vs actual) or a type kvrun cannot dequantize. The views point
// into `file`, which must outlive the returned weights.
ModelWeights weights_load(const GgufFile& file, const ModelConfig& config);

}  // namespace kvrun
