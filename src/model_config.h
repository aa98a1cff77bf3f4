// Typed model hyperparameters read from GGUF metadata (`<arch>.*` keys) for the supported
// architectures (llama, qwen2), validated so the forward pass can trust them.
#pragma once

#include <cstdint>
#include <string>

#include "gguf.h"

namespace kvrun {

struct ModelConfig {
    std::string arch;                 // general.architecture: "llama" or "qwen2"
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
    float rope_freq_scale = 1.0f;     // 1 / rope.scaling.factor for linear scaling
    bool rope_neox = false;           // rotate pairs (i, i + n_rot/2) instead of (2i, 2i+1)
    bool qkv_bias = false;            // the architecture requires Q/K/V biases (qwen2)

    int64_t q_dim() const { return n_head * head_dim; }      // width of Q / attention out
    int64_t kv_dim() const { return n_kv_head * head_dim; }  // width of K and V
};

// Reads and validates the hyperparameters. Throws Error naming the key for a missing or
// invalid value, and "unsupported architecture 'x' (supported: llama, qwen2)".
ModelConfig model_config_from_gguf(const GgufFile& file);

}  // namespace kvrun
