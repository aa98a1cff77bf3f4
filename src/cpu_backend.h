// The CPU reference backend: the llama-family forward pass over a paged KV cache held in
// host memory, built from the ops in cpu_ops.h.
#pragma once

#include <memory>

#include "backend.h"
#include "weights.h"

namespace kvrun {

class CpuBackend final : public Backend {
  public:
    // `file` must outlive the backend (weights are read from its mapping).
    CpuBackend(const GgufFile& file, const BackendOptions& options);

    const ModelConfig& config() const override { return config_; }
    void forward(const ForwardBatch& batch, float* logits) override;
    void forward_embeddings(const ForwardBatch& batch, float* out) override;
    bool set_layer_observer(LayerObserver observer) override {
        layer_observer_ = std::move(observer);
        return true;
    }
    bool set_matmul_observer(MatmulObserver observer) override {
        observer_ = std::move(observer);
        return true;
    }
    void copy_blocks(const std::vector<BlockCopy>& copies) override;
    int64_t n_kv_blocks() const override { return n_blocks_; }
    int32_t kv_block_size() const override { return options_.kv_block_size; }
    int32_t n_kv_stages() const override { return static_cast<int32_t>(n_stages_); }
    KvWindowPool kv_window_pool() const override { return window_; }
    std::vector<float> lora_scales() const override { return lora_user_scales(options_.lora); }
    std::string name() const override { return "cpu"; }
    int64_t kv_block_io_bytes(KvPool pool) const override;
    void read_kv_block(KvPool pool, int64_t block, uint8_t* dst) override;
    void write_kv_block(KvPool pool, int64_t block, const uint8_t* src) override;

    const ModelWeights& weights() const { return weights_; }
    // One layer's K/V pools, for tests that inspect the cache.
    KvLayerView kv_layer(int64_t layer) const;

  private:
    void validate(const ForwardBatch& batch) const;
    // The pass: logits for the logit rows, or (hidden != nullptr) their normed final states.
    void run(const ForwardBatch& batch, float* logits, float* hidden);
    // Whether layer l's K/V lives in the window pool; that pool's or the main pool's blocks.
    bool in_window_pool(int64_t layer) const;
    int64_t pool_blocks(int64_t layer) const;
    // cpu::matmul, shown to the observer first.
    void matmul(float* out, const float* x, const WeightView& w, int64_t T) {
        if (observer_) observer_(w.data, w.n_in, x, T);
        cpu::matmul(out, x, w, T);
    }
    // The mixture-of-experts FFN of layer w on xb_'s T normed rows, result in xb_.
    void moe_ffn(const LayerWeights& w, int64_t T);
    // mla_res_ = one head's wk_b / wv_b times mla_in_'s T rows, shown to the observer (imatrix:
    // attn_k_b / attn_v_b, one matrix per head) unless they come from a fused attn_kv_b.
    void mla_head_matmul(const LayerWeights& w, const WeightView& head, int64_t T) {
        if (w.kv_b_fused)
            cpu::matmul(mla_res_.data(), mla_in_.data(), head, T);
        else
            matmul(mla_res_.data(), mla_in_.data(), head, T);
    }
    // DeepSeek's latent attention, absorbed (ModelConfig::mla_rank): Q, the latent K/V rows
    // (written to the cache), attention over them and the per-head decompression into xb_.
    void mla_attention(const LayerWeights& w, int64_t l, int64_t T, const int32_t* pos,
                       const KvLayerView& kv, const KvBatchView& kb);
    // xb_ = the block's input: RMSNorm(x_) with `norm` (a LayerNorm with the bias `bias` when
    // ModelConfig::layer_norm), or x_ itself when `norm` is empty (olmo2).
    void pre_norm(const std::vector<float>& norm, const std::vector<float>& bias, int64_t T);
    // out = the model's norm of rows x[n_rows][n_embd] (RMSNorm, or a LayerNorm with
    // ModelConfig::layer_norm).
    void norm_rows(float* out, const float* x, const std::vector<float>& norm,
                   const std::vector<float>& bias, int64_t n_rows);
    // x_ += a block's output xb_[T][n_embd], after its post norm (when not empty) and
    // Granite's residual scale (plus steer[n_embd], a control vector, when not null).
    void add_block_output(const std::vector<float>& post_norm, int64_t T,
                          const float* steer = nullptr);
    // out[T][n_out] += each LoRA update of x[T][n_in] (LoraDelta), row t scaled for the user
    // scale user[adapter][t].
    void add_lora(float* out, const float* x, const std::vector<LoraDelta>& deltas, int64_t T,
                  const std::vector<std::vector<float>>& user);

    ModelConfig config_;
    RopeParams rope_;      // the model's RoPE (factors in config_.rope_freq_factors)
    RopeParams rope_swa_;  // sliding-window layers' RoPE (config_.rope_swa)
    ModelWeights weights_;
    std::vector<std::unique_ptr<GgufFile>> lora_files_;  // the adapters weights_ points into
    ControlVector cvec_;                                 // --control-vector (empty: none)
    BackendOptions options_;
    MatmulObserver observer_;
    LayerObserver layer_observer_;
    int64_t n_blocks_ = 0;
    KvWindowPool window_;  // the sliding-window layers' pool (kv_layout_for)
    int64_t k_block_bytes_ = 0, v_block_bytes_ = 0;  // one layer, one block
    // [n_layer] of [pool_blocks(l)][n_kv_head] head blocks (kv_format.h)
    std::vector<std::unique_ptr<uint8_t[]>> k_pool_, v_pool_;
    // Staging (quantized caches): [n_layer] of f16 [n_stages][n_kv_head][block_size][head_dim]
    int64_t n_stages_ = 0;
    std::vector<std::unique_ptr<uint8_t[]>> k_stage_, v_stage_;
    bool rotate_ = false;  // Hadamard rotation of Q and K (kv_rotation_enabled)

    // Scratch activations, grown to the largest batch seen.
    bool v_shares_k_ = false;       // kv_v_shares_k: V reads K's pool (no V pool)
    std::vector<float> x_;          // [n_tokens][n_embd] residual stream
    std::vector<float> xb_;         // [n_tokens][n_embd] normed input / projection output
    std::vector<float> xn_;         // [n_tokens][n_embd] parallel blocks: the FFN's input
    std::vector<float> q_;          // [n_tokens][n_head][head_dim]
    std::vector<float> k_, v_;      // [n_tokens][n_kv_head][head_dim]
    std::vector<float> att_;        // [n_tokens][n_head][head_dim]
    std::vector<float> gate_, up_;  // [n_tokens][n_ff]
    // Mixture of experts: router logits [n_tokens][n_expert]; an expert's rows gathered
    // [n][n_embd], their gate/up [n][n_ff_exp] and down output [n][n_embd]; the sum.
    std::vector<float> router_, moe_in_, moe_gate_, moe_up_, moe_down_, moe_out_;
    // MLA: Q before absorption [T][n_head][mla_nope + n_rot], the Q low-rank [T][mla_q_rank],
    // wkv_a's output [T][mla_rank + n_rot], the decompressed heads [T][n_head][mla_v], one head's
    // gathered input and output.
    std::vector<float> mla_q_, mla_qa_, mla_kv_, mla_out_, mla_in_, mla_res_;
    std::vector<float> lora_tmp_, lora_out_;  // LoRA: A x [T][rank], B (A x) [T][n_out]
    // LoRA user scales [n_adapters][n_tokens] and [n_adapters][n_logit_rows] of the batch.
    std::vector<std::vector<float>> lora_user_, lora_user_rows_;
    std::vector<int32_t> flat_tables_;         // [n_seqs][max_blocks_per_seq], -1 padded
    std::vector<int32_t> flat_window_tables_;  // the same for the window pool
};

}  // namespace kvrun
