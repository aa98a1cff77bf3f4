// The CUDA backend (cuda_backend.h): weights uploaded once into one device arena, per-layer
// paged K/V pools in device memory, and the same forward pass as the CPU backend built from
// the ops in ops.h on one stream. Decode-sized batches (<= kGraphMaxTokens tokens) are
// captured into a CUDA graph per shape (tokens, logit rows, block-table width) on their
// second occurrence and replayed afterwards; batch contents travel in device buffers with
// fixed addresses, so one graph serves every step of the same shape. Graphs hold raw device
// pointers (activations, logits, batch metadata, scratch), so every reallocation of those
// drops them. forward_sample samples all logit rows in one launch after the step (outside
// the graph) and copies back only the token ids.
#include "cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common.h"
#include "cuda/common.cuh"
#include "cuda/ops.h"
#include "kv_format.h"
#include "model_config.h"
#include "quant.h"
#include "sampler.h"
#include "weights.h"

namespace kvrun {
namespace {

constexpr int64_t kGraphMaxTokens = 16;    // batches up to this size replay CUDA graphs
constexpr int64_t kMinTokenCapacity = 64;  // activation buffers hold at least this many
constexpr size_t kAlign = 256;

size_t align_up(size_t v) {
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
    const float* attn_norm = nullptr;                         // [n_embd]
    const float* ffn_norm = nullptr;                          // [n_embd]
    const float *bq = nullptr, *bk = nullptr, *bv = nullptr;  // [q_dim], [kv_dim] x2 or null
    const float *q_norm = nullptr, *k_norm = nullptr;         // [head_dim] each (qwen3) or null
    const float *attn_post_norm = nullptr, *ffn_post_norm = nullptr;  // [n_embd] (gemma2/3)
    WeightView wq, wk, wv, wo, w_gate, w_up, w_down;                  // data in device memory
    // Mixture of experts: the router and the stacked experts.
    WeightView router;
    MoeExperts experts;
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
    // Shows weight w's input rows x (device, [T][w.n_in]) to the observer: a synchronous
    // copy to the host (observed passes run eagerly, without graphs).
    void observe(const WeightView& w, const float* x, int64_t T);
    void enqueue_forward(int64_t n_tokens, int64_t n_rows, int64_t max_blocks);
    void enqueue_moe_ffn(const DeviceLayer& w, int64_t T);
    void enqueue_dense_ffn(const DeviceLayer& w, int64_t T);
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
    std::vector<DeviceLayer> layers_;
    // LoRA adapters: the files (lora_attach), their matrices on the device, the output's
    // updates, and the widest rank and update (layers; the output's are n_vocab wide).
    std::vector<std::unique_ptr<GgufFile>> lora_files_;
    DeviceMem lora_mem_;
    std::vector<LoraDelta> lora_output_;
    int64_t lora_rank_ = 0, lora_width_ = 0;
    RopeParams rope_;      // the model's RoPE, its frequency factors (if any) in weight_mem_
    RopeParams rope_swa_;  // the sliding-window layers' RoPE (ModelConfig::rope_swa)

    int64_t n_blocks_ = 0, k_block_bytes_ = 0, v_block_bytes_ = 0;
    KvWindowPool window_;                    // the sliding-window layers' pool (kv_layout_for)
    DeviceMem kv_mem_;                       // per layer: K pool, V pool, K stage, V stage
    std::vector<uint8_t*> k_pool_, v_pool_;  // [n_layer] of [n_blocks][n_kv_head] head blocks
    // Staging (quantized caches): [n_layer] of f16 [n_stages][n_kv_head][bs][hd]
    int64_t n_stages_ = 0;
    std::vector<uint8_t*> k_stage_, v_stage_;
    bool rotate_ = false;  // Hadamard rotation of Q and K (kv_rotation_enabled)

    // Activations for up to token_cap_ tokens.
    int64_t token_cap_ = 0, row_cap_ = 0, table_cap_ = 0;
    DeviceMem act_mem_, logits_mem_, meta_mem_;
    PinnedMem meta_host_;
    float *x_ = nullptr, *xb_ = nullptr;     // [T][n_embd] residual / normed or projected
    float *q_ = nullptr, *att_ = nullptr;    // [T][q_dim]
    float *k_ = nullptr, *v_ = nullptr;      // [T][kv_dim]
    float *gate_ = nullptr, *up_ = nullptr;  // [T][n_ff]
    // Mixture of experts (see ensure_capacity).
    float *moe_logits_ = nullptr, *moe_w_ = nullptr, *moe_h_ = nullptr, *moe_out_ = nullptr,
          *moe_up_ = nullptr;
    int32_t *moe_ids_ = nullptr, *moe_map_ = nullptr;
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
    struct GraphEntry {
        cudaGraphExec_t exec = nullptr;
        int eager_runs = 0;
    };
    std::map<std::tuple<int64_t, int64_t, int64_t>, GraphEntry> graphs_;
};

CudaBackend::CudaBackend(const GgufFile& file, const BackendOptions& options, int device)
    : device_((cuda_set_device(device), device)),
      config_(backend_model_config(file, options)),
      options_(options) {
    if (config_.head_dim > 256)
        throw Error(fmt::format("{}: head_dim {} is larger than the CUDA attention kernels "
                                "support (256)",
                                file.path(), config_.head_dim),
                    "use --device cpu");
    if (options_.kv_block_size > 256)
        throw Error(fmt::format("--kv-block-size {} is larger than the CUDA kernels support (256)",
                                options_.kv_block_size));
    rotate_ = kv_rotation_enabled(config_, options_);
    if (const char* env = std::getenv("KVRUN_CUDA_GRAPHS"); env && std::string(env) == "0")
        use_graphs_ = false;
    upload_weights(file);
    allocate_kv();
    ensure_capacity(kMinTokenCapacity, 1, 1024);
    // The uploads (cudaMemcpy from pageable memory may return before its DMA ends) ran on
    // the legacy stream, which does not order with our non-blocking stream: finish them.
    CUDA_CHECK(cudaDeviceSynchronize());
}

void CudaBackend::upload_weights(const GgufFile& file) {
    ModelWeights hw = weights_load(file, config_);
    lora_files_ = lora_attach(hw, config_, file, options_.lora);
    // Plan the arena: every matrix and vector at a 256-byte aligned offset.
    struct Item {
        const void* src;
        size_t bytes;
        size_t offset;
    };
    std::vector<Item> items;
    size_t total = 0;
    auto add = [&](const void* src, size_t bytes) {
        items.push_back({src, bytes, total});
        total += align_up(bytes);
        return items.size() - 1;
    };
    auto add_matrix = [&](const WeightView& w, const std::string& what) {
        if (!cuda_supports_weight_type(w.type))
            throw Error(fmt::format("{}: {} has type {}, which the CUDA kernels do not support",
                                    file.path(), what, ggml_type_name(w.type)),
                        "use --device cpu");
        return add(w.data, w.row_bytes * size_t(w.n_out));
    };
    auto add_vector = [&](const std::vector<float>& v) {
        return add(v.data(), v.size() * sizeof(float));
    };
    const size_t i_embd = add_matrix(hw.token_embd, "token_embd.weight");
    const size_t i_out = hw.output_tied ? i_embd : add_matrix(hw.output, "output.weight");
    const size_t i_out_norm = add_vector(hw.output_norm);
    const size_t i_rope =
        config_.rope_freq_factors.empty() ? SIZE_MAX : add_vector(config_.rope_freq_factors);
    struct LayerItems {
        size_t attn_norm, ffn_norm, bq, bk, bv, q_norm, k_norm, attn_post, ffn_post, router, gate_e,
            up_e, down_e, wq, wk, wv, wo, gate, up, down;
    };
    std::vector<LayerItems> li(hw.layers.size());
    for (size_t l = 0; l < hw.layers.size(); ++l) {
        const LayerWeights& w = hw.layers[l];
        const std::string p = fmt::format("blk.{}.", l);
        LayerItems& it = li[l];
        it.attn_norm = add_vector(w.attn_norm);
        it.ffn_norm = add_vector(w.ffn_norm);
        it.bq = w.bq.empty() ? SIZE_MAX : add_vector(w.bq);
        it.bk = w.bk.empty() ? SIZE_MAX : add_vector(w.bk);
        it.bv = w.bv.empty() ? SIZE_MAX : add_vector(w.bv);
        it.q_norm = w.q_norm.empty() ? SIZE_MAX : add_vector(w.q_norm);
        it.k_norm = w.k_norm.empty() ? SIZE_MAX : add_vector(w.k_norm);
        it.attn_post = w.attn_post_norm.empty() ? SIZE_MAX : add_vector(w.attn_post_norm);
        it.ffn_post = w.ffn_post_norm.empty() ? SIZE_MAX : add_vector(w.ffn_post_norm);
        it.wq = add_matrix(w.wq, p + "attn_q.weight");
        it.wk = add_matrix(w.wk, p + "attn_k.weight");
        it.wv = add_matrix(w.wv, p + "attn_v.weight");
        it.wo = add_matrix(w.wo, p + "attn_output.weight");
        if (config_.moe()) {  // each stacked expert tensor as one item: experts stay evenly spaced
            auto stacked = [&](const std::vector<WeightView>& e, const std::string& what) {
                WeightView all = e[0];
                all.n_out *= int64_t(e.size());
                return add_matrix(all, what);
            };
            it.router = add_matrix(w.router, p + "ffn_gate_inp.weight");
            it.gate_e = stacked(w.gate_exps, p + "ffn_gate_exps.weight");
            it.up_e = stacked(w.up_exps, p + "ffn_up_exps.weight");
            it.down_e = stacked(w.down_exps, p + "ffn_down_exps.weight");
            continue;
        }
        it.gate = add_matrix(w.w_gate, p + "ffn_gate.weight");
        it.up = add_matrix(w.w_up, p + "ffn_up.weight");
        it.down = add_matrix(w.w_down, p + "ffn_down.weight");
    }
    weight_mem_ = DeviceMem(total, "the model weights");
    for (const Item& it : items)
        CUDA_CHECK(
            cudaMemcpy(weight_mem_.get() + it.offset, it.src, it.bytes, cudaMemcpyHostToDevice));

    uint8_t* base = weight_mem_.get();
    auto on_device = [&](const WeightView& w, size_t i) {
        WeightView d = w;
        d.data = base + items[i].offset;
        host_of_[d.data] = w.data;  // the model file's bytes, for a matmul observer
        return d;
    };
    auto vec = [&](size_t i) -> const float* {
        return i == SIZE_MAX ? nullptr : reinterpret_cast<const float*>(base + items[i].offset);
    };
    token_embd_ = on_device(hw.token_embd, i_embd);
    output_ = on_device(hw.output, i_out);
    output_norm_ = vec(i_out_norm);
    rope_ = config_.rope(vec(i_rope));
    rope_swa_ = config_.rope_swa(vec(i_rope));
    layers_.resize(hw.layers.size());
    for (size_t l = 0; l < hw.layers.size(); ++l) {
        const LayerWeights& w = hw.layers[l];
        const LayerItems& it = li[l];
        DeviceLayer& d = layers_[l];
        d.attn_norm = vec(it.attn_norm);
        d.ffn_norm = vec(it.ffn_norm);
        d.bq = vec(it.bq);
        d.bk = vec(it.bk);
        d.bv = vec(it.bv);
        d.q_norm = vec(it.q_norm);
        d.k_norm = vec(it.k_norm);
        d.attn_post_norm = vec(it.attn_post);
        d.ffn_post_norm = vec(it.ffn_post);
        d.wq = on_device(w.wq, it.wq);
        d.wk = on_device(w.wk, it.wk);
        d.wv = on_device(w.wv, it.wv);
        d.wo = on_device(w.wo, it.wo);
        if (config_.moe()) {
            d.router = on_device(w.router, it.router);
            d.experts.gate0 = on_device(w.gate_exps[0], it.gate_e);
            d.experts.up0 = on_device(w.up_exps[0], it.up_e);
            d.experts.down0 = on_device(w.down_exps[0], it.down_e);
            d.experts.expert_bytes = w.gate_exps[0].row_bytes * size_t(w.gate_exps[0].n_out);
            d.experts.down_bytes = w.down_exps[0].row_bytes * size_t(w.down_exps[0].n_out);
            continue;
        }
        d.w_gate = on_device(w.w_gate, it.gate);
        d.w_up = on_device(w.w_up, it.up);
        d.w_down = on_device(w.w_down, it.down);
    }
    upload_lora(hw);
}

void CudaBackend::upload_lora(const ModelWeights& hw) {
    size_t total = 0;  // bytes of every A and B, each 256-byte aligned
    auto plan = [&](const std::vector<LoraDelta>& v, bool output) {
        for (const LoraDelta& d : v) {
            for (const WeightView* w : {&d.a, &d.b}) {
                if (!cuda_supports_weight_type(w->type))
                    throw Error(fmt::format("a LoRA adapter has {} weights, which the CUDA kernels "
                                            "do not support",
                                            ggml_type_name(w->type)),
                                "use --device cpu");
                total += align_up(w->row_bytes * size_t(w->n_out));
            }
            lora_rank_ = std::max(lora_rank_, d.a.n_out);
            lora_width_ = std::max(lora_width_, output ? config_.n_vocab : d.b.n_out);
        }
    };
    for (const LayerWeights& w : hw.layers)
        for (auto list : kLoraLists) plan(w.*list, false);
    plan(hw.lora_output, true);
    if (total == 0) return;
    lora_mem_ = DeviceMem(total, "the LoRA adapters");
    size_t off = 0;
    auto next = [&](const WeightView& w) {  // copies w to the next slot, returns its device view
        const size_t bytes = w.row_bytes * size_t(w.n_out);
        CUDA_CHECK(cudaMemcpy(lora_mem_.get() + off, w.data, bytes, cudaMemcpyHostToDevice));
        WeightView d = w;
        d.data = lora_mem_.get() + off;
        off += align_up(bytes);
        return d;
    };
    auto on_device = [&](const std::vector<LoraDelta>& v) {
        std::vector<LoraDelta> out;
        for (const LoraDelta& d : v) {
            LoraDelta dd = d;
            dd.a = next(d.a);
            dd.b = next(d.b);
            out.push_back(dd);
        }
        return out;
    };
    for (size_t l = 0; l < hw.layers.size(); ++l)
        for (size_t k = 0; k < std::size(kLoraLists); ++k)
            layers_[l].lora[k] = on_device(hw.layers[l].*kLoraLists[k]);
    lora_output_ = on_device(hw.lora_output);
}

void CudaBackend::add_lora(float* out, const float* x, const std::vector<LoraDelta>& deltas,
                           int64_t T, bool logit_rows) {
    const cudaStream_t s = stream_.get();
    // The batch's user scales: per token, or per logit row after them.
    const int64_t n_ad = int64_t(options_.lora.size());
    const float* user = logit_rows ? lora_user_ + n_ad * token_cap_ : lora_user_;
    const int64_t stride = logit_rows ? row_cap_ : token_cap_;
    for (const LoraDelta& d : deltas) {
        cuda_matmul(lora_ax_, x, d.a, T, scratch_, s);
        cuda_matmul(lora_bax_, lora_ax_, d.b, T, scratch_, s);
        cuda_add_scaled_rows(out, lora_bax_, user + d.adapter * stride, T, d.b.n_out, d.per_unit,
                             s);
    }
}

void CudaBackend::allocate_kv() {
    const KvLayout layout = kv_layout_for(config_, options_);
    n_blocks_ = layout.n_blocks;
    window_ = layout.window;
    n_stages_ = kv_stages_for(options_);
    k_block_bytes_ = kv_layer_block_bytes(options_.kv_type_k, KvRole::K, config_.n_kv_head,
                                          options_.kv_block_size, config_.head_dim);
    v_block_bytes_ = kv_layer_block_bytes(options_.kv_type_v, KvRole::V, config_.n_kv_head,
                                          options_.kv_block_size, config_.head_dim);
    const size_t s_bytes = align_up(
        size_t(n_stages_ * config_.n_kv_head * options_.kv_block_size * config_.head_dim * 2));
    // Per layer: K pool, V pool (of the main or the window pool's blocks), K and V stages.
    auto layer_bytes = [&](int64_t l) {
        const size_t n = size_t(pool_blocks(l));
        return align_up(n * size_t(k_block_bytes_)) + align_up(n * size_t(v_block_bytes_)) +
               2 * s_bytes;
    };
    size_t total = 0;
    for (int64_t l = 0; l < config_.n_layer; ++l) total += layer_bytes(l);
    const std::string what = fmt::format(
        "the KV cache ({} blocks of {} tokens{}{} x {} layers)", n_blocks_, options_.kv_block_size,
        window_.n_blocks > 0 ? fmt::format(", {} for the sliding-window layers", window_.n_blocks)
                             : "",
        n_stages_ > 0 ? fmt::format(" + {} f16 stage blocks", n_stages_) : "", config_.n_layer);
    kv_mem_ = DeviceMem(total, what.c_str());
    // Zeroed so that no stale NaN can ever meet a zero attention weight.
    CUDA_CHECK(cudaMemsetAsync(kv_mem_.get(), 0, kv_mem_.size(), stream_.get()));
    CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
    uint8_t* base = kv_mem_.get();
    for (int64_t l = 0; l < config_.n_layer; ++l) {
        const size_t n = size_t(pool_blocks(l));
        const size_t k_bytes = align_up(n * size_t(k_block_bytes_));
        const size_t v_bytes = align_up(n * size_t(v_block_bytes_));
        k_pool_.push_back(base);
        v_pool_.push_back(base + k_bytes);
        if (n_stages_ > 0) {
            k_stage_.push_back(base + k_bytes + v_bytes);
            v_stage_.push_back(base + k_bytes + v_bytes + s_bytes);
        }
        base += layer_bytes(l);
    }
}

bool CudaBackend::in_window_pool(int64_t layer) const {
    return kv_layer_in_window_pool(config_, window_, layer);
}

int64_t CudaBackend::pool_blocks(int64_t layer) const {
    return in_window_pool(layer) ? window_.n_blocks : n_blocks_;
}

void CudaBackend::read_kv_block(KvPool pool, int64_t block, uint8_t* dst) {
    kv_block_io_check("read_kv_block", pool, block, n_blocks_, window_);
    for (int64_t l = 0; l < config_.n_layer; ++l) {
        if (!kv_layer_in_pool(config_, window_, l, pool)) continue;
        CUDA_CHECK(cudaMemcpyAsync(dst, k_pool_[size_t(l)] + block * k_block_bytes_,
                                   size_t(k_block_bytes_), cudaMemcpyDeviceToHost, stream_.get()));
        dst += k_block_bytes_;
        CUDA_CHECK(cudaMemcpyAsync(dst, v_pool_[size_t(l)] + block * v_block_bytes_,
                                   size_t(v_block_bytes_), cudaMemcpyDeviceToHost, stream_.get()));
        dst += v_block_bytes_;
    }
    CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
}

void CudaBackend::write_kv_block(KvPool pool, int64_t block, const uint8_t* src) {
    kv_block_io_check("write_kv_block", pool, block, n_blocks_, window_);
    for (int64_t l = 0; l < config_.n_layer; ++l) {
        if (!kv_layer_in_pool(config_, window_, l, pool)) continue;
        CUDA_CHECK(cudaMemcpyAsync(k_pool_[size_t(l)] + block * k_block_bytes_, src,
                                   size_t(k_block_bytes_), cudaMemcpyHostToDevice, stream_.get()));
        src += k_block_bytes_;
        CUDA_CHECK(cudaMemcpyAsync(v_pool_[size_t(l)] + block * v_block_bytes_, src,
                                   size_t(v_block_bytes_), cudaMemcpyHostToDevice, stream_.get()));
        src += v_block_bytes_;
    }
    // Pageable source memory: the copy must finish before the caller reuses it.
    CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
}

KvLayerView CudaBackend::kv_layer(int64_t l) const {
    KvLayerView kv;
    kv.k_type = options_.kv_type_k;
    kv.v_type = options_.kv_type_v;
    kv.k = k_pool_[size_t(l)];
    kv.v = v_pool_[size_t(l)];
    kv.n_blocks = pool_blocks(l);
    kv.n_kv_head = config_.n_kv_head;
    kv.block_size = options_.kv_block_size;
    kv.head_dim = config_.head_dim;
    if (n_stages_ > 0) {
        kv.k_stage = k_stage_[size_t(l)];
        kv.v_stage = v_stage_[size_t(l)];
        kv.n_stages = n_stages_;
    }
    return kv;
}

void CudaBackend::clear_graphs() {
    for (auto& [key, g] : graphs_)
        if (g.exec) (void)cudaGraphExecDestroy(g.exec);
    graphs_.clear();
}

// An eager run that grew the scratch freed the buffer the captured graphs point at: drop
// them before anything can replay one (the growth happens only in eager runs, so no graph
// launch of this step is in flight).
void CudaBackend::drop_graphs_if_scratch_moved() {
    const void* p = scratch_.get(0, stream_.get());  // (never grows for 0 bytes)
    if (scratch_.size() != scratch_seen_ || p != scratch_ptr_seen_) {
        clear_graphs();
        scratch_seen_ = scratch_.size();
        scratch_ptr_seen_ = p;
    }
}

void CudaBackend::ensure_capacity(int64_t n_tokens, int64_t n_rows, int64_t table_entries) {
    const ModelConfig& c = config_;
    bool grown = false;
    if (n_tokens > token_cap_) {
        token_cap_ = std::max({n_tokens, 2 * token_cap_, kMinTokenCapacity});
        const size_t T = size_t(token_cap_);
        // Mixture of experts: router logits [T][n_expert], ids and weights [T][k], the
        // experts' hidden rows [T * k][n_ff_exp] and outputs [T * k][n_embd], and for grouped
        // prefill the up rows [T * k][n_ff_exp] and the job map [2 * T * k] (else empty).
        const size_t TK = T * size_t(c.n_expert_used);
        const size_t sizes[] = {T * size_t(c.n_embd),
                                T * size_t(c.n_embd),
                                T * size_t(c.q_dim()),
                                T * size_t(c.q_dim()),
                                T * size_t(c.kv_dim()),
                                T * size_t(c.kv_dim()),
                                T * size_t(c.n_ff),
                                T * size_t(c.n_ff),
                                T * size_t(c.n_embd),
                                T * size_t(c.n_expert),
                                TK,
                                TK,
                                TK * size_t(c.n_ff_exp),
                                TK * size_t(c.n_embd),
                                TK * size_t(c.n_ff_exp),
                                2 * TK};
        float *moe_ids = nullptr, *moe_map = nullptr;
        float** ptrs[] = {&x_,     &xb_,      &q_,      &att_,        &k_,      &v_,
                          &gate_,  &up_,      &xr_,     &moe_logits_, &moe_ids, &moe_w_,
                          &moe_h_, &moe_out_, &moe_up_, &moe_map};
        size_t total = 0;
        for (size_t s : sizes) total += align_up(s * sizeof(float));
        act_mem_ = DeviceMem();  // free first: the old buffers are no longer needed
        act_mem_ = DeviceMem(total, "activation buffers");
        size_t off = 0;
        for (size_t i = 0; i < std::size(sizes); ++i) {
            *ptrs[i] = reinterpret_cast<float*>(act_mem_.get() + off);
            off += align_up(sizes[i] * sizeof(float));
        }
        moe_ids_ = reinterpret_cast<int32_t*>(moe_ids);  // int32s in float-sized slots
        moe_map_ = reinterpret_cast<int32_t*>(moe_map);
        grown = true;
    }
    if (n_rows > row_cap_) {
        row_cap_ = std::max({n_rows, 2 * row_cap_, int64_t(8)});
        logits_mem_ = DeviceMem();
        logits_mem_ =
            DeviceMem(size_t(row_cap_) * size_t(c.n_vocab) * sizeof(float), "the logits buffer");
        logits_ = reinterpret_cast<float*>(logits_mem_.get());
        grown = true;
    }
    if (grown || table_entries > table_cap_) {
        table_cap_ = std::max({table_entries, 2 * table_cap_, int64_t(1024)});
        // Two tables of table_cap_ entries: the main pool's and the window pool's.
        const size_t n = size_t(5 * token_cap_ + row_cap_ + 2 * table_cap_);
        meta_mem_ = DeviceMem();
        meta_mem_ = DeviceMem(n * sizeof(int32_t), "batch metadata");
        meta_host_ = PinnedMem(n * sizeof(int32_t));
        auto* m = reinterpret_cast<int32_t*>(meta_mem_.get());
        d_tokens_ = m;
        d_pos_ = m + token_cap_;
        d_seq_ = m + 2 * token_cap_;
        d_slot_ = m + 3 * token_cap_;
        d_stage_ = m + 4 * token_cap_;
        d_rows_ = m + 5 * token_cap_;
        d_table_ = d_rows_ + row_cap_;
        d_wtable_ = d_table_ + table_cap_;
        grown = true;
    }
    if (lora_rank_ > 0) {
        const size_t ax = align_up(size_t(token_cap_ * lora_rank_) * sizeof(float));
        const size_t bax =
            align_up(size_t(std::max(token_cap_, row_cap_) * lora_width_) * sizeof(float));
        const size_t user = options_.lora.size() * size_t(token_cap_ + row_cap_) * sizeof(float);
        if (ax + bax + user > lora_buf_bytes_) {
            lora_buf_ = DeviceMem();
            lora_buf_ = DeviceMem(ax + bax + user, "LoRA buffers");
            lora_buf_bytes_ = ax + bax + user;
            grown = true;
        }
        lora_ax_ = reinterpret_cast<float*>(lora_buf_.get());
        lora_bax_ = reinterpret_cast<float*>(lora_buf_.get() + ax);
        lora_user_ = reinterpret_cast<float*>(lora_buf_.get() + ax + bax);
    }
    if (grown) clear_graphs();  // captured graphs point at the old buffers
}

void CudaBackend::validate(const ForwardBatch& b) const {
    b.validate(config_.n_vocab, n_blocks_, options_.kv_block_size, n_stages_, window_);
}

// The mixture-of-experts FFN of layer w on xb_'s T normed rows, result in xb_: router,
// top-k, the chosen experts, weighted sum.
void CudaBackend::enqueue_moe_ffn(const DeviceLayer& w, int64_t T) {
    const ModelConfig& c = config_;
    const cudaStream_t s = stream_.get();
    const int64_t K = c.n_expert_used;
    const MoeExperts& ex = w.experts;
    cuda_matmul(moe_logits_, xb_, w.router, T, scratch_, s);
    cuda_moe_topk(moe_logits_, T, c.n_expert, K, moe_ids_, moe_w_, s);
    if (T > kGraphMaxTokens) {  // prefill: tokens grouped by expert (syncs the stream)
        cuda_moe_ffn_grouped(xb_, xb_, moe_ids_, moe_w_, T, K, c.n_expert, ex,
                             {moe_out_, moe_h_, moe_up_, moe_map_}, scratch_, s);
    } else {  // decode: expert GEMVs by device-side ids (capturable)
        cuda_gemv_experts_swiglu(moe_h_, xb_, ex.gate0, ex.up0, ex.expert_bytes, moe_ids_, T * K,
                                 int(K), s);
        cuda_gemv_experts(moe_out_, moe_h_, ex.down0, ex.down_bytes, moe_ids_, T * K, 1, s);
        cuda_moe_combine(xb_, moe_out_, moe_w_, T, K, c.n_embd, s);
    }
}

// The dense gated FFN of layer w on xb_'s T normed rows (SwiGLU, or Gemma's GeGLU), result in
// xb_. Gate and up share one GEMV launch unless a LoRA adapts one of them.
void CudaBackend::enqueue_dense_ffn(const DeviceLayer& w, int64_t T) {
    const ModelConfig& c = config_;
    const cudaStream_t s = stream_.get();
    observe(w.w_gate, xb_, T);
    observe(w.w_up, xb_, T);
    if (!w.lora[kLoraGate].empty() || !w.lora[kLoraUp].empty()) {
        cuda_matmul(gate_, xb_, w.w_gate, T, scratch_, s);
        cuda_matmul(up_, xb_, w.w_up, T, scratch_, s);
        add_lora(gate_, xb_, w.lora[kLoraGate], T);
        add_lora(up_, xb_, w.lora[kLoraUp], T);
        if (c.ffn_gelu)
            cuda_geglu(gate_, gate_, up_, T * c.n_ff, s);
        else
            cuda_swiglu(gate_, gate_, up_, T * c.n_ff, s);
    } else if (c.ffn_gelu) {
        cuda_matmul_geglu(gate_, up_, xb_, w.w_gate, w.w_up, T, scratch_, s);
    } else {
        cuda_matmul_swiglu(gate_, up_, xb_, w.w_gate, w.w_up, T, scratch_, s);
    }
    observe(w.w_down, gate_, T);
    cuda_matmul(xb_, gate_, w.w_down, T, scratch_, s);
    add_lora(xb_, gate_, w.lora[kLoraDown], T);
}

// Enqueues the whole forward pass on the stream: no host synchronization (capturable) up to
// kGraphMaxTokens tokens; larger batches of a mixture of experts sync once per layer.
void CudaBackend::enqueue_forward(int64_t T, int64_t R, int64_t max_blocks) {
    const ModelConfig& c = config_;
    const cudaStream_t s = stream_.get();
    const KvBatchView kb_main{d_seq_,     d_slot_, d_table_,
                              max_blocks, T,       n_stages_ > 0 ? d_stage_ : nullptr};
    KvBatchView kb_window = kb_main;  // the sliding-window layers' view of the window pool
    kb_window.block_table = d_wtable_;
    cuda_embed(x_, token_embd_, d_tokens_, T, s);
    if (c.embd_scale != 1.0f) cuda_scale(x_, T * c.n_embd, c.embd_scale, s);
    // Each residual add is fused with the RMSNorm that follows it; the first layer's
    // attention norm has no add before it.
    cuda_rmsnorm(xb_, x_, layers_[0].attn_norm, T, c.n_embd, c.norm_eps, s);
    for (int64_t l = 0; l < c.n_layer; ++l) {
        const DeviceLayer& w = layers_[size_t(l)];
        // Attention block (xb_ holds the normed input).
        for (const WeightView* m : {&w.wq, &w.wk, &w.wv}) observe(*m, xb_, T);
        cuda_matmul_qkv(q_, k_, v_, xb_, w.wq, w.wk, w.wv, T, scratch_, s);
        add_lora(q_, xb_, w.lora[kLoraQ], T);
        add_lora(k_, xb_, w.lora[kLoraK], T);
        add_lora(v_, xb_, w.lora[kLoraV], T);
        if (w.bq) {
            cuda_add_bias(q_, w.bq, T, c.q_dim(), s);
            cuda_add_bias(k_, w.bk, T, c.kv_dim(), s);
            cuda_add_bias(v_, w.bv, T, c.kv_dim(), s);
        }
        if (w.q_norm) {  // qwen3: per-head RMSNorm of Q and K before RoPE (in place)
            cuda_rmsnorm(q_, q_, w.q_norm, T * c.n_head, c.head_dim, c.norm_eps, s);
            cuda_rmsnorm(k_, k_, w.k_norm, T * c.n_kv_head, c.head_dim, c.norm_eps, s);
        }
        const KvLayerView kv = kv_layer(l);
        const KvBatchView& kb = in_window_pool(l) ? kb_window : kb_main;
        const RopeParams& rope = c.is_swa(l) ? rope_swa_ : rope_;
        if (rotate_ || !c.uses_rope(l)) {  // unfused: a Hadamard rotation, or a NoPE layer
            if (c.uses_rope(l)) {
                cuda_rope(q_, d_pos_, T, c.n_head, c.head_dim, rope, s);
                cuda_rope(k_, d_pos_, T, c.n_kv_head, c.head_dim, rope, s);
            }
            if (rotate_) {  // q.k unchanged; K's outlier channels spread (kv_rotation_enabled)
                cuda_hadamard(q_, T * c.n_head, c.head_dim, s);
                cuda_hadamard(k_, T * c.n_kv_head, c.head_dim, s);
            }
            cuda_kv_write(kv, kb, k_, v_, s);
        } else {
            cuda_rope_kv_write(q_, k_, v_, d_pos_, kv, kb, c.n_head, rope, s);
        }
        cuda_paged_attention(att_, q_, kv, kb, c.n_head, c.attn_scale, scratch_, s, c.attn_softcap,
                             c.window(l));
        observe(w.wo, att_, T);
        cuda_matmul(xb_, att_, w.wo, T, scratch_, s);
        add_lora(xb_, att_, w.lora[kLoraO], T);
        if (w.attn_post_norm)  // gemma2/3: the block's output normed before the residual add
            cuda_rmsnorm(xb_, xb_, w.attn_post_norm, T, c.n_embd, c.norm_eps, s);
        if (c.residual_scale != 1.0f) cuda_scale(xb_, T * c.n_embd, c.residual_scale, s);
        cuda_add_rmsnorm(x_, xb_, xb_, w.ffn_norm, T, c.n_embd, c.norm_eps, s);
        // Feed-forward block.
        if (c.moe())
            enqueue_moe_ffn(w, T);
        else
            enqueue_dense_ffn(w, T);
        if (w.ffn_post_norm) cuda_rmsnorm(xb_, xb_, w.ffn_post_norm, T, c.n_embd, c.norm_eps, s);
        if (c.residual_scale != 1.0f) cuda_scale(xb_, T * c.n_embd, c.residual_scale, s);
        if (l + 1 < c.n_layer)
            cuda_add_rmsnorm(x_, xb_, xb_, layers_[size_t(l + 1)].attn_norm, T, c.n_embd,
                             c.norm_eps, s);
        else
            cuda_add(x_, xb_, T * c.n_embd, s);
    }
    if (R == 0) return;
    // Final norm and output projection only for the rows that need logits.
    cuda_gather_rows(xr_, x_, d_rows_, R, c.n_embd, s);
    cuda_rmsnorm(xr_, xr_, output_norm_, R, c.n_embd, c.norm_eps, s);
    if (hidden_only_) return;  // forward_embeddings: the normed rows are the result
    observe(output_, xr_, R);
    cuda_matmul(logits_, xr_, output_, R, scratch_, s);
    add_lora(logits_, xr_, lora_output_, R, /*logit_rows=*/true);
    if (c.logit_scale != 1.0f) cuda_scale(logits_, R * c.n_vocab, c.logit_scale, s);
    if (c.final_softcap > 0) cuda_softcap(logits_, R * c.n_vocab, c.final_softcap, s);
}

// Runs the step: eagerly, or from a CUDA graph for decode-sized batches (captured on the
// second eager-free occurrence of a shape, so the first run sizes the scratch buffers).
void CudaBackend::run_step(int64_t T, int64_t R, int64_t max_blocks) {
    if (!use_graphs_ || T > kGraphMaxTokens || hidden_only_ || observer_) {  // eager
        enqueue_forward(T, R, max_blocks);
        return;
    }
    GraphEntry& g = graphs_[{T, R, max_blocks}];
    if (!g.exec && g.eager_runs == 0) {
        enqueue_forward(T, R, max_blocks);
        ++g.eager_runs;
        return;
    }
    if (!g.exec) {
        cudaGraph_t graph = nullptr;
        CUDA_CHECK(cudaStreamBeginCapture(stream_.get(), cudaStreamCaptureModeThreadLocal));
        try {
            enqueue_forward(T, R, max_blocks);
        } catch (...) {
            // Leave capture mode so the stream stays usable, then run without graphs.
            (void)cudaStreamEndCapture(stream_.get(), &graph);
            if (graph) (void)cudaGraphDestroy(graph);
            (void)cudaGetLastError();
            use_graphs_ = false;
            enqueue_forward(T, R, max_blocks);
            return;
        }
        CUDA_CHECK(cudaStreamEndCapture(stream_.get(), &graph));
        const cudaError_t err = cudaGraphInstantiate(&g.exec, graph, 0);
        (void)cudaGraphDestroy(graph);
        if (err != cudaSuccess) {  // nothing ran yet: fall back to eager execution for good
            (void)cudaGetLastError();
            g.exec = nullptr;
            use_graphs_ = false;
            enqueue_forward(T, R, max_blocks);
            return;
        }
    }
    CUDA_CHECK(cudaGraphLaunch(g.exec, stream_.get()));
}

int64_t CudaBackend::launch(const ForwardBatch& b) {
    validate(b);
    const int64_t T = int64_t(b.tokens.size());
    const int64_t R = int64_t(b.logit_rows.size());
    if (T == 0) return 0;
    CUDA_CHECK(cudaSetDevice(device_));
    // Block tables flattened to [n_seqs][max_blocks], -1 padded. The width is rounded up
    // to a power of two so growing sequences reuse the same captured graph for long.
    int64_t width = 1;
    for (const auto& table : b.block_tables) width = std::max<int64_t>(width, table.size());
    int64_t max_blocks = 8;
    while (max_blocks < width) max_blocks *= 2;
    const int64_t n_seqs = int64_t(b.block_tables.size());
    ensure_capacity(T, std::max<int64_t>(R, 1), n_seqs * max_blocks);

    auto* h = reinterpret_cast<int32_t*>(meta_host_.get());
    std::memcpy(h, b.tokens.data(), size_t(T) * 4);
    std::memcpy(h + token_cap_, b.positions.data(), size_t(T) * 4);
    std::memcpy(h + 2 * token_cap_, b.seq_index.data(), size_t(T) * 4);
    std::memcpy(h + 3 * token_cap_, b.slots.data(), size_t(T) * 4);
    if (n_stages_ > 0) std::memcpy(h + 4 * token_cap_, b.stages.data(), size_t(T) * 4);
    std::memcpy(h + 5 * token_cap_, b.logit_rows.data(), size_t(R) * 4);
    int32_t* ht = h + 5 * token_cap_ + row_cap_;
    std::fill(ht, ht + n_seqs * max_blocks, -1);
    for (int64_t sq = 0; sq < n_seqs; ++sq)
        std::copy(b.block_tables[size_t(sq)].begin(), b.block_tables[size_t(sq)].end(),
                  ht + sq * max_blocks);
    int64_t table_entries = n_seqs * max_blocks;
    if (window_.n_blocks > 0) {  // the window tables at d_wtable_ (the upload spans the gap)
        int32_t* hw = ht + table_cap_;
        std::fill(hw, hw + n_seqs * max_blocks, -1);
        for (int64_t sq = 0; sq < n_seqs; ++sq)
            std::copy(b.window_tables[size_t(sq)].begin(), b.window_tables[size_t(sq)].end(),
                      hw + sq * max_blocks);
        table_entries += table_cap_;
    }
    const size_t meta_bytes = size_t(5 * token_cap_ + row_cap_ + table_entries) * 4;
    CUDA_CHECK(
        cudaMemcpyAsync(meta_mem_.get(), h, meta_bytes, cudaMemcpyHostToDevice, stream_.get()));
    if (lora_rank_ > 0) {  // each token's and each logit row's adapter scales
        const auto user = b.token_lora_scales(lora_scales());
        const size_t n_ad = user.size();
        lora_user_host_.assign(n_ad * size_t(token_cap_ + row_cap_), 0.0f);
        for (size_t i = 0; i < n_ad; ++i) {
            std::copy(user[i].begin(), user[i].end(),
                      lora_user_host_.begin() + ptrdiff_t(i * size_t(token_cap_)));
            for (int64_t r = 0; r < R; ++r)
                lora_user_host_[n_ad * size_t(token_cap_) + i * size_t(row_cap_) + size_t(r)] =
                    user[i][size_t(b.logit_rows[size_t(r)])];
        }
        CUDA_CHECK(cudaMemcpyAsync(lora_user_, lora_user_host_.data(),
                                   lora_user_host_.size() * sizeof(float), cudaMemcpyHostToDevice,
                                   stream_.get()));
    }
    try {
        run_step(T, R, max_blocks);
    } catch (...) {
        (void)cudaStreamSynchronize(stream_.get());  // the upload still reads meta_host_
        drop_graphs_if_scratch_moved();
        throw;
    }
    drop_graphs_if_scratch_moved();
    return R;
}

void CudaBackend::forward(const ForwardBatch& b, float* logits) {
    const int64_t R = launch(b);
    if (b.tokens.empty()) return;
    if (R > 0)
        CUDA_CHECK(cudaMemcpyAsync(logits, logits_, size_t(R * config_.n_vocab) * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream_.get()));
    CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
}

bool CudaBackend::set_matmul_observer(MatmulObserver observer) {
    if (observer && config_.moe()) return false;  // experts run from routed ids on the GPU
    observer_ = std::move(observer);
    return true;
}

void CudaBackend::observe(const WeightView& w, const float* x, int64_t T) {
    if (!observer_ || T == 0) return;
    auto it = host_of_.find(w.data);
    if (it == host_of_.end()) return;
    observed_.resize(size_t(T * w.n_in));
    CUDA_CHECK(cudaMemcpyAsync(observed_.data(), x, observed_.size() * sizeof(float),
                               cudaMemcpyDeviceToHost, stream_.get()));
    CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
    observer_(it->second, w.n_in, observed_.data(), T);
}

// An eager pass that stops after the output norm (CUDA graphs are captured with the
// output projection, so they are not used here); the normed rows are in xr_.
void CudaBackend::forward_embeddings(const ForwardBatch& b, float* out) {
    struct HiddenOnly {
        bool& flag;
        explicit HiddenOnly(bool& f) : flag(f) { flag = true; }
        ~HiddenOnly() { flag = false; }
    } scope(hidden_only_);
    const int64_t R = launch(b);
    if (b.tokens.empty()) return;
    if (R > 0)
        CUDA_CHECK(cudaMemcpyAsync(out, xr_, size_t(R * config_.n_embd) * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream_.get()));
    CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
}

void CudaBackend::forward_sample(const ForwardBatch& b, const std::vector<RowSampling>& rows,
                                 int32_t* tokens) {
    if (rows.size() != b.logit_rows.size())
        fail("forward_sample: {} sampling rows for {} logit rows", rows.size(),
             b.logit_rows.size());
    const int64_t V = config_.n_vocab;
    // Row parameters first, so that bad ones throw before the cache is touched.
    std::vector<CudaSampleRow> cfg;
    cfg.reserve(rows.size());
    std::vector<int32_t> ids;  // every row's distinct penalized ids (and their counts)
    for (const RowSampling& r : rows) {
        sampling_validate(r.params);
        cfg.push_back(cuda_sample_row(r.params, r.u, r.recent.data(), r.recent.size(), V, ids));
    }
    const size_t n_rows = rows.size();
    const size_t out_bytes = align_up(n_rows * sizeof(int32_t));
    const size_t row_bytes = align_up(n_rows * sizeof(CudaSampleRow));
    const size_t need = out_bytes + row_bytes + ids.size() * sizeof(int32_t);
    if (need > sample_cap_) {  // (no step in flight here: the last call synchronized)
        CUDA_CHECK(cudaSetDevice(device_));
        const size_t cap = std::max(2 * need, size_t(4096));
        sample_mem_ = DeviceMem();
        sample_mem_ = DeviceMem(cap, "the sampling buffers");
        sample_host_ = PinnedMem(cap);
        sample_cap_ = cap;
    }

    const int64_t R = launch(b);
    if (b.tokens.empty()) return;
    const cudaStream_t s = stream_.get();
    if (R == 0) {  // a prefill chunk: still finish the step (the next one reuses meta_host_)
        CUDA_CHECK(cudaStreamSynchronize(s));
        return;
    }
    uint8_t* host = sample_host_.get();
    uint8_t* dev = sample_mem_.get();
    std::memcpy(host + out_bytes, cfg.data(), n_rows * sizeof(CudaSampleRow));
    if (!ids.empty())
        std::memcpy(host + out_bytes + row_bytes, ids.data(), ids.size() * sizeof(int32_t));
    CUDA_CHECK(cudaMemcpyAsync(dev + out_bytes, host + out_bytes, need - out_bytes,
                               cudaMemcpyHostToDevice, s));
    // One launch samples every row (a thread block per row) from the step's logits.
    cuda_sample_rows(reinterpret_cast<int32_t*>(dev), logits_, R, V,
                     reinterpret_cast<const CudaSampleRow*>(dev + out_bytes),
                     reinterpret_cast<const int32_t*>(dev + out_bytes + row_bytes), s);
    CUDA_CHECK(cudaMemcpyAsync(host, dev, size_t(R) * sizeof(int32_t), cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    std::memcpy(tokens, host, size_t(R) * sizeof(int32_t));
    for (int64_t r = 0; r < R; ++r)
        if (tokens[r] < 0 || tokens[r] >= V)
            fail("sampler: every logit is -inf or NaN; nothing can be sampled (logit row {})", r);
}

void CudaBackend::copy_blocks(const std::vector<BlockCopy>& copies) {
    kv_copies_validate(copies, n_blocks_, n_stages_, window_.n_blocks);
    CUDA_CHECK(cudaSetDevice(device_));
    for (const BlockCopy& c : copies)
        for (int64_t l = 0; l < config_.n_layer; ++l) {
            const bool w = in_window_pool(l);
            cuda_kv_copy(kv_layer(l), w ? c.wsrc : c.src, w ? c.wdst : c.dst, c.src_stage,
                         c.dst_stage, c.n_rows, stream_.get());
        }
    CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const GgufFile& file, const BackendOptions& options,
                                           int device) {
    return std::make_unique<CudaBackend>(file, options, device);
}

}  // namespace kvrun
