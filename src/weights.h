// The tensor-name table of llama-family GGUF models: finds every weight, checks its shape
// and type, and exposes 2-D matrices as WeightViews into the file's mapping (no copies) and
// 1-D norm / bias vectors as float32.
#pragma once

#include <cstdint>
#include <vector>

#include "cpu_ops.h"
#include "gguf.h"
#include "model_config.h"

namespace kvrun {

struct LayerWeights {
    std::vector<float> attn_norm;     // [n_embd]
    WeightView wq, wk, wv, wo;        // [q_dim][n_embd], [kv_dim][n_embd] x2,
                                      // [n_embd][q_dim]
    std::vector<float> bq, bk, bv;    // [q_dim], [kv_dim], [kv_dim]; empty if none
    std::vector<float> q_norm, k_norm;  // [head_dim] each (qwen3's per-head RMSNorm); or empty
    std::vector<float> ffn_norm;      // [n_embd]
    // [n_embd] each: RMSNorm weights of the attention and FFN outputs (gemma2/3), or empty.
    std::vector<float> attn_post_norm, ffn_post_norm;
    WeightView w_gate, w_up, w_down;  // [n_ff][n_embd] x2, [n_embd][n_ff] (dense FFN)
    // Mixture of experts: the router [n_expert][n_embd] and each expert's views into the
    // stacked ffn_*_exps tensors ([n_ff_exp][n_embd] x2, [n_embd][n_ff_exp]).
    WeightView router;
    std::vector<WeightView> gate_exps, up_exps, down_exps;
};

struct ModelWeights {
    WeightView token_embd;           // [n_vocab][n_embd]
    std::vector<float> output_norm;  // [n_embd]
    WeightView output;               // [n_vocab][n_embd] (token_embd when tied)
    bool output_tied = false;
    std::vector<LayerWeights> layers;  // [n_layer]
    uint64_t matrix_bytes = 0;         // bytes of all 2-D weights (tied counted once)
};

// Looks up and checks every tensor. Throws Error naming the tensor for a missing tensor, a
// wrong shape (expected vs actual) or a type kvrun cannot dequantize. The views point
// into `file`, which must outlive the returned weights.
ModelWeights weights_load(const GgufFile& file, const ModelConfig& config);

}  // namespace kvrun
