// Internal to the CUDA backend (cuda_backend.cpp: the forward pass, graphs and sampling;
// cuda_backend_store.cpp: where the weights and the KV cache live): the device memory
// helpers, the per-layer device views and the CudaBackend class.
#pragma once

#include <cuda_runtime_api.h>

#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend.h"
#include "common.h"
#include "cuda/common.cuh"
#include "cuda/cuda_backend.h"
#include "cuda/ops.h"
#include "kv_format.h"
#include "model_config.h"
#include "weights.h"

namespace kvrun::cuda_detail {

constexpr int64_t kGraphMaxTokens = 16;    // batches up to this size replay CUDA graphs
constexpr int64_t kMinTokenCapacity = 64;  // activation buffers hold at least this many
constexpr size_t kAlign = 256;

inline size_t align_up(size_t v) {
    return (v + kAlign - 1) / kAlign * kAlign;
}

// One device allocation that frees itself.
class DeviceMem {
  public:
    DeviceMem() = default;
    DeviceMem(size_t bytes, const char* what) : p_(cuda_alloc(bytes, what)), bytes_(bytes) {}
    DeviceMem(DeviceMem&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(o.bytes_) {}
    DeviceMem& operator=(DeviceMem&& o) noexcept {
        std::swap(p_, o.p_);
        std::swap(bytes_, o.bytes_);
        return *this;
    }
    ~DeviceMem() { cuda_free(p_); }
    uint8_t* get() const { return static_cast<uint8_t*>(p_); }
    size_t size() const { return bytes_; }

  private:
    void* p_ = nullptr;
    size_t bytes_ = 0;
};

// Pinned host memory (fast, truly asynchronous uploads).
class PinnedMem {
  public:
    PinnedMem() = default;
    explicit PinnedMem(size_t bytes) : bytes_(bytes) {
        CUDA_CHECK(cudaHostAlloc(&p_, bytes, cudaHostAllocDefault));
    }
    PinnedMem(PinnedMem&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(o.bytes_) {}
    PinnedMem& operator=(PinnedMem&& o) noexcept {
        std::swap(p_, o.p_);
        std::swap(bytes_, o.bytes_);
        return *this;
    }
    ~PinnedMem() {
        if (p_) (void)cudaFreeHost(p_);
    }
    uint8_t* get() const { return static_cast<uint8_t*>(p_); }

  private:
    void* p_ = nullptr;
    size_t bytes_ = 0;
};

// The backend's stream; declared before the members that use it so it is destroyed last.
class Stream {
  public:
    Stream() { CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
    ~Stream() {
        if (s_) {
            (void)cudaStreamSynchronize(s_);
            (void)cudaStreamDestroy(s_);
        }
    }
    Stream(const Stream&) = delete;
    Stream& operator=(const Stream&) = delete;
    cudaStream_t get() const { return s_; }

  private:
    cudaStream_t s_ = nullptr;
};

struct DeviceLayer {
    const float* attn_norm = nullptr;                         // [n_embd]; null: none (olmo2)
    const float* ffn_norm = nullptr;                          // [n_embd]; null: none (olmo2)
    // [n_embd] each: the LayerNorms' biases (phi2, starcoder2), or null.
    const float *attn_norm_b = nullptr, *ffn_norm_b = nullptr;
    // A plain FFN's biases (phi2, starcoder2): [n_ff], [n_embd], or null. (Its w_gate has null
    // data.)
    const float *b_up = nullptr, *b_down = nullptr;
    const float *bq = nullptr, *bk = nullptr, *bv = nullptr;  // [q_dim], [kv_dim] x2 or null
    // [head_dim] each (qwen3), [q_dim] and [kv_dim] (olmo2: all heads at once), or null
    const float *q_norm = nullptr, *k_norm = nullptr;
    const float *attn_post_norm = nullptr, *ffn_post_norm = nullptr;  // [n_embd] (gemma2/3)
    const float *attn_sub_norm = nullptr, *ffn_sub_norm = nullptr;    // [q_dim], [n_ff] (BitNet)
    const float* bo = nullptr;        // [n_embd] attention output bias (gpt-oss) or null
    const float* sinks = nullptr;     // [n_head] attention sinks (gpt-oss) or null
    const float* router_b = nullptr;  // [n_expert] router bias (gpt-oss) or null
    WeightView wq, wk, wv, wo, w_gate, w_up, w_down;  // data in device memory
    // Mixture of experts: the router and the stacked experts; GLM 4.5's selection bias
    // ([n_expert] or null) and shared experts (one SwiGLU FFN; null data without), and
    // Qwen2-MoE's gate of the shared expert (one row; null data without).
    WeightView router;
    MoeExperts experts;
    const float* exp_probs_b = nullptr;
    WeightView gate_shexp, up_shexp, down_shexp, gate_inp_shexp;
    // DeepSeek's latent attention (LayerWeights::wq_a ...; null data without): the low-rank Q
    // (wq_a, its norm, wq_b; or wq), the compressed KV and k_pe (wkv_a, its norm), and each
    // head's wk_b / wv_b, head h's matrix wk_b_bytes / wv_b_bytes after head 0's.
    WeightView wq_a, wq_b, wkv_a, wk_b0, wv_b0;
    const float *q_a_norm = nullptr, *kv_a_norm = nullptr;
    size_t wk_b_bytes = 0, wv_b_bytes = 0;
    // LoRA updates (device views) of wq, wk, wv, wo, w_gate, w_up, w_down (kLoraLists order).
    std::vector<LoraDelta> lora[7];
};

// LayerWeights' LoRA lists, in DeviceLayer::lora's order.
constexpr std::vector<LoraDelta> LayerWeights::*kLoraLists[7] = {
    &LayerWeights::lora_q,   &LayerWeights::lora_k,    &LayerWeights::lora_v,
    &LayerWeights::lora_o,   &LayerWeights::lora_gate, &LayerWeights::lora_up,
    &LayerWeights::lora_down};
enum LoraSlot { kLoraQ, kLoraK, kLoraV, kLoraO, kLoraGate, kLoraUp, kLoraDown };

class CudaBackend final : public Backend {
  public:
    CudaBackend(const GgufFile& file, const BackendOptions& options, int device);
    ~CudaBackend() override {
        (void)cudaSetDevice(device_);  // the members free memory of this device
        clear_graphs();
    }

    const ModelConfig& config() const override { return config_; }
    void forward(const ForwardBatch& batch, float* logits) override;
    void forward_embeddings(const ForwardBatch& batch, float* out) override;
    bool set_matmul_observer(MatmulObserver observer) override;
    bool set_layer_observer(LayerObserver observer) override {
        layer_observer_ = std::move(observer);
        return true;
    }
    bool samples_on_device() const override { return true; }
    void forward_sample(const ForwardBatch& batch, const std::vector<RowSampling>& rows,
                        int32_t* tokens) override;
    void copy_blocks(const std::vector<BlockCopy>& copies) override;
    int64_t n_kv_blocks() const override { return n_blocks_; }
    int32_t kv_block_size() const override { return options_.kv_block_size; }
    int32_t n_kv_stages() const override { return static_cast<int32_t>(n_stages_); }
    KvWindowPool kv_window_pool() const override { return window_; }
    std::vector<float> lora_scales() const override { return lora_user_scales(options_.lora); }
    std::string name() const override { return "cuda"; }
    int64_t kv_block_io_bytes(KvPool pool) const override {
        return kv_pool_block_bytes(config_, options_, window_, pool);
    }
    void read_kv_block(KvPool pool, int64_t block, uint8_t* dst) override;
    void write_kv_block(KvPool pool, int64_t block, const uint8_t* src) override;

  private:
    void upload_weights(const GgufFile& file);
    // The adapters' A and B matrices (lora_attach on hw) into lora_mem_, and the device
    // views into layers_[l].lora and lora_output_.
    void upload_lora(const ModelWeights& hw);
    // out[T][n_out] += each LoRA update of x[T][n_in], on the stream.
    // out[T][n_out] += each LoRA update of x, row t scaled for its user scale (lora_user_:
    // the batch's tokens, or with logit_rows its logit rows).
    void add_lora(float* out, const float* x, const std::vector<LoraDelta>& deltas, int64_t T,
                  bool logit_rows = false);
    void allocate_kv();
    void validate(const ForwardBatch& b) const;
    void ensure_capacity(int64_t n_tokens, int64_t n_rows, int64_t table_entries);
    // Shows the input rows x (device, [T][n_in]) of weights ws, which share that input, to
    // the observer: one synchronous copy to the host (observed passes run eagerly).
    void observe(std::initializer_list<const WeightView*> ws, const float* x, int64_t T);
    void enqueue_forward(int64_t n_tokens, int64_t n_rows, int64_t max_blocks);
    void enqueue_moe_ffn(const DeviceLayer& w, int64_t T);
    void enqueue_dense_ffn(const DeviceLayer& w, int64_t T, const CudaXq* xq);
    // Layer l's attention on xb_'s T normed rows (xq: quantized by the norm, or null), result
    // in xb_; kb: the batch's view of the layer's pool (main or window).
    void enqueue_attention(const DeviceLayer& w, int64_t l, int64_t T, const CudaXq* xq,
                           const KvBatchView& kb);
    // DeepSeek's latent attention of layer l on xb_'s T normed rows, result (after attn_output)
    // in xb_: CpuBackend::mla_attention's steps, each head's absorption GEMVs as expert-indexed
    // GEMVs over (token, head) jobs.
    void enqueue_mla_attention(const DeviceLayer& w, int64_t l, int64_t T, const KvBatchView& kb);
    void run_step(int64_t n_tokens, int64_t n_rows, int64_t max_blocks);
    int64_t launch(const ForwardBatch& b);  // validates, uploads and enqueues; returns rows
    KvLayerView kv_layer(int64_t l) const;
    // Whether layer l's K/V lives in the window pool; that pool's or the main pool's blocks.
    bool in_window_pool(int64_t layer) const;
    int64_t pool_blocks(int64_t layer) const;
    void clear_graphs();
    void drop_graphs_if_scratch_moved();

    int device_;
    ModelConfig config_;
    BackendOptions options_;
    Stream stream_;
    CudaScratch scratch_;

    DeviceMem weight_mem_;  // every matrix and vector, 256-byte aligned
    WeightView token_embd_, output_;
    const float* output_norm_ = nullptr;
    const float* output_norm_b_ = nullptr;  // [n_embd] its LayerNorm's bias, or null
    const float* output_b_ = nullptr;       // [n_vocab] the output's bias (phi2), or null
    std::vector<DeviceLayer> layers_;
    // LoRA adapters: the files (lora_attach), their matrices on the device, the output's
    // updates, and the widest rank and update (layers; the output's are n_vocab wide).
    std::vector<std::unique_ptr<GgufFile>> lora_files_;
    DeviceMem lora_mem_;
    std::vector<LoraDelta> lora_output_;
    int64_t lora_rank_ = 0, lora_width_ = 0;
    // Control vectors: [n_layer][n_embd] on the device, and each layer's row (null: none).
    DeviceMem cvec_mem_;
    std::vector<const float*> cvec_layer_;
    RopeParams rope_;      // the model's RoPE, its frequency factors (if any) in weight_mem_
    RopeParams rope_swa_;  // the sliding-window layers' RoPE (ModelConfig::rope_swa)

    int64_t n_blocks_ = 0, k_block_bytes_ = 0, v_block_bytes_ = 0;
    KvWindowPool window_;                    // the sliding-window layers' pool (kv_layout_for)
    DeviceMem kv_mem_;                       // per layer: K pool, V pool, K stage, V stage
    std::vector<uint8_t*> k_pool_, v_pool_;  // [n_layer] of [n_blocks][n_kv_head] head blocks
    // Staging (quantized caches): [n_layer] of f16 [n_stages][n_kv_head][bs][hd]
    int64_t n_stages_ = 0;
    std::vector<uint8_t*> k_stage_, v_stage_;
    bool rotate_ = false;      // Hadamard rotation of Q and K (kv_rotation_enabled)
    bool v_shares_k_ = false;  // kv_v_shares_k: V reads K's pool (no V pool or stage)

    // Activations for up to token_cap_ tokens.
    int64_t token_cap_ = 0, row_cap_ = 0, table_cap_ = 0;
    DeviceMem act_mem_, logits_mem_, meta_mem_;
    PinnedMem meta_host_;
    float *x_ = nullptr, *xb_ = nullptr;     // [T][n_embd] residual / normed or projected
    float *q_ = nullptr, *att_ = nullptr;    // [T][q_dim]
    float *k_ = nullptr, *v_ = nullptr;      // [T][kv_dim]
    float *gate_ = nullptr, *up_ = nullptr;  // [T][n_ff]
    float* xn_ = nullptr;                    // [T][n_embd]: parallel blocks' FFN input (else null)
    // Mixture of experts (see ensure_capacity).
    float *moe_logits_ = nullptr, *moe_w_ = nullptr, *moe_h_ = nullptr, *moe_out_ = nullptr,
          *moe_up_ = nullptr;
    float* shexp_ = nullptr;       // [T][n_embd]: the shared experts' output (GLM 4.5)
    float* shexp_gate_ = nullptr;  // [T]: their gate logits (Qwen2-MoE), else null
    int32_t *moe_ids_ = nullptr, *moe_map_ = nullptr;
    // DeepSeek's latent attention: Q before absorption [T][n_head][mla_nope + n_rot], Q's low
    // rank [T][mla_q_rank], the compressed KV and k_pe [T][mla_rank + n_rot], the per-head GEMVs'
    // inputs [T * n_head][max(mla_nope, mla_rank)] and outputs [T * n_head][max(mla_rank,
    // mla_v)], and their head ids (job j: head j % n_head) [T * n_head].
    float *mla_q_ = nullptr, *mla_qa_ = nullptr, *mla_kv_ = nullptr, *mla_in_ = nullptr,
          *mla_res_ = nullptr;
    int32_t* mla_ids_ = nullptr;
    // xb_'s rows quantized by the norm before the q/k/v and gate/up matmuls, and att_'s by the
    // attention before the output projection, when the integer GEMV is on (decode-size steps;
    // widths % 32 == 0): [kCudaGemvMaxRows][max(n_embd, q_dim)] int16s, then the scales; one
    // buffer, each use read by the matmul right after it.
    DeviceMem xq_mem_;
    // The norm before layer l's q/k/v (attn) or gate/up (ffn) GEMV: cuda_rmsnorm(_xq) /
    // cuda_add_rmsnorm(_xq) of xb_; returns the quantized rows for the matmul, or null. A null
    // w (olmo2) adds and copies x_ into xb_ unnormed. With ModelConfig::layer_norm,
    // cuda_(add_)layernorm with the bias b (or null), and null (the GEMV quantizes itself).
    const CudaXq* norm_xb(const float* w, const float* b, bool add, bool fuse, int64_t T);
    static CudaXq* xq_for(CudaXq& xq, const float* x, bool fuse, int64_t T);
    CudaXq xq_{}, xq_att_{};
    DeviceMem lora_buf_;  // LoRA: A x [T][lora_rank_], B (A x) [max(T, R)][lora_width_]
    size_t lora_buf_bytes_ = 0;
    float *lora_ax_ = nullptr, *lora_bax_ = nullptr;
    // The batch's LoRA user scales: [n_adapters][token_cap_] per token, then
    // [n_adapters][row_cap_] per logit row (ForwardBatch::token_lora_scales), and their upload.
    float* lora_user_ = nullptr;
    std::vector<float> lora_user_host_;
    float* xr_ = nullptr;       // [R][n_embd] rows that need logits
    bool hidden_only_ = false;  // forward_embeddings: skip the output projection
    // set_matmul_observer: the observer, each device weight's bytes in the model file, and
    // the host copy of the observed activations.
    MatmulObserver observer_;
    std::unordered_map<const void*, const void*> host_of_;
    std::vector<float> observed_;
    // set_layer_observer: shown each layer's output (copied to observed_; runs are eager).
    LayerObserver layer_observer_;
    float* logits_ = nullptr;  // [R][n_vocab]
    // Batch metadata on the device (int32): tokens, positions, seq, slot, stage [token_cap_]
    // each, logit rows [row_cap_], block tables [table_cap_].
    int32_t *d_tokens_ = nullptr, *d_pos_ = nullptr, *d_seq_ = nullptr, *d_slot_ = nullptr;
    int32_t *d_stage_ = nullptr, *d_rows_ = nullptr, *d_table_ = nullptr;
    int32_t* d_wtable_ = nullptr;  // window pool tables [table_cap_] after d_table_

    // forward_sample: [R] token ids, [R] CudaSampleRow, penalty ids (device and pinned host
    // mirror, same layout).
    DeviceMem sample_mem_;
    PinnedMem sample_host_;
    size_t sample_cap_ = 0;

    bool use_graphs_ = true;
    size_t scratch_seen_ = 0;  // scratch size the captured graphs were recorded with
    const void* scratch_ptr_seen_ = nullptr;
    // Whether a token of the step being enqueued completes a block of a staged (quantized)
    // cache: without one, the step leaves out the seal launches (cuda_rope_kv_write's seal).
    bool seals_ = true;
    struct GraphEntry {
        cudaGraphExec_t exec = nullptr;
        int eager_runs = 0;
    };
    // Captured steps by (tokens, logit rows, block-table width, seals_).
    std::map<std::tuple<int64_t, int64_t, int64_t, bool>, GraphEntry> graphs_;
};

}  // namespace kvrun::cuda_detail
