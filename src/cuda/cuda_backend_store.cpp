// The CUDA backend's storage (cuda_backend_impl.h): construction, the weights and LoRA
// adapters uploaded into device arenas, the paged K/V pools, block copies and block I/O.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cuda/cuda_backend_impl.h"
#include "quant.h"

namespace kvrun::cuda_detail {

CudaBackend::CudaBackend(const GgufFile& file, const BackendOptions& options, int device)
    : device_((cuda_set_device(device), device)),
      config_(backend_model_config(file, options)),
      options_(options) {
    if (const std::string what = cuda_unsupported(config_); !what.empty())
        throw Error(fmt::format("{}: the CUDA backend does not run {} yet", file.path(), what),
                    "use --device cpu");
    v_shares_k_ = kv_v_shares_k(config_, options_.kv_type_k, options_.kv_type_v);
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
    const size_t i_out_norm_b = hw.output_norm_b.empty() ? SIZE_MAX : add_vector(hw.output_norm_b);
    const size_t i_out_b = hw.output_b.empty() ? SIZE_MAX : add_vector(hw.output_b);
    const size_t i_rope =
        config_.rope_freq_factors.empty() ? SIZE_MAX : add_vector(config_.rope_freq_factors);
    struct LayerItems {
        size_t attn_norm, ffn_norm, bq, bk, bv, q_norm, k_norm, attn_post, ffn_post, router, gate_e,
            up_e, down_e, wq, wk, wv, wo, gate, up, down, bo, sinks, router_b, gate_b, up_b, down_b,
            exp_probs_b, gate_sh, up_sh, down_sh, gate_inp_sh;
        // DeepSeek: SIZE_MAX without; wk_b / wv_b: head 0's item (the others follow it).
        size_t wq_a = SIZE_MAX, wq_b = SIZE_MAX, wkv_a = SIZE_MAX, q_a_norm = SIZE_MAX,
               kv_a_norm = SIZE_MAX, wk_b = SIZE_MAX, wv_b = SIZE_MAX;
        // The experts' own scales (MoeExperts::gate_s ...): SIZE_MAX when they are all one.
        size_t gate_s = SIZE_MAX, up_s = SIZE_MAX, down_s = SIZE_MAX;
        size_t attn_sub = SIZE_MAX, ffn_sub = SIZE_MAX;  // BitNet's norms
        // LayerNorm biases and a plain FFN's (no gate: gate stays SIZE_MAX).
        size_t attn_norm_b = SIZE_MAX, ffn_norm_b = SIZE_MAX, b_up = SIZE_MAX, b_down = SIZE_MAX;
    };
    // Per layer, the gate, up and down experts' scales when they differ (else empty); the
    // upload reads them from here.
    std::vector<std::array<std::vector<float>, 3>> expert_scales(hw.layers.size());
    auto scales_of = [&](const std::vector<WeightView>& experts, std::vector<float>& keep) {
        keep.clear();
        for (const WeightView& e : experts) keep.push_back(e.scale);
        if (std::all_of(keep.begin(), keep.end(), [&](float v) { return v == keep[0]; })) {
            keep.clear();
            return SIZE_MAX;
        }
        return add_vector(keep);
    };
    // One item per head, each aligned: head h lies align_up(bytes of one) after head 0.
    auto per_head = [&](const std::vector<WeightView>& heads, const std::string& what) {
        const size_t first = add_matrix(heads[0], what);
        for (size_t h = 1; h < heads.size(); ++h) add_matrix(heads[h], what);
        return first;
    };
    std::vector<LayerItems> li(hw.layers.size());
    for (size_t l = 0; l < hw.layers.size(); ++l) {
        const LayerWeights& w = hw.layers[l];
        const std::string p = fmt::format("blk.{}.", l);
        LayerItems& it = li[l];
        // Vectors that only some architectures have: SIZE_MAX (a null device pointer) when absent.
        auto optional = [&](const std::vector<float>& v) {
            return v.empty() ? SIZE_MAX : add_vector(v);
        };
        it.attn_norm = optional(w.attn_norm), it.ffn_norm = optional(w.ffn_norm);  // (olmo2: none)
        it.attn_norm_b = optional(w.attn_norm_b), it.ffn_norm_b = optional(w.ffn_norm_b);
        it.b_up = optional(w.b_up), it.b_down = optional(w.b_down);
        it.bq = optional(w.bq), it.bk = optional(w.bk), it.bv = optional(w.bv);
        it.q_norm = optional(w.q_norm), it.k_norm = optional(w.k_norm);
        it.attn_post = optional(w.attn_post_norm), it.ffn_post = optional(w.ffn_post_norm);
        it.attn_sub = optional(w.attn_sub_norm), it.ffn_sub = optional(w.ffn_sub_norm);
        it.bo = optional(w.bo), it.sinks = optional(w.sinks), it.router_b = optional(w.router_b);
        it.gate_b = optional(w.gate_exps_b), it.up_b = optional(w.up_exps_b);
        it.down_b = optional(w.down_exps_b), it.exp_probs_b = optional(w.exp_probs_b);
        it.wq = add_matrix(w.wq, p + "attn_q.weight");
        it.wk = add_matrix(w.wk, p + "attn_k.weight");
        it.wv = add_matrix(w.wv, p + "attn_v.weight");
        it.wo = add_matrix(w.wo, p + "attn_output.weight");
        if (config_.mla()) {
            if (w.wq_a.data) {
                it.wq_a = add_matrix(w.wq_a, p + "attn_q_a.weight");
                it.wq_b = add_matrix(w.wq_b, p + "attn_q_b.weight");
                it.q_a_norm = add_vector(w.q_a_norm);
            }
            it.wkv_a = add_matrix(w.wkv_a, p + "attn_kv_a_mqa.weight");
            it.kv_a_norm = add_vector(w.kv_a_norm);
            it.wk_b = per_head(w.wk_b, p + "attn_k_b.weight");
            it.wv_b = per_head(w.wv_b, p + "attn_v_b.weight");
        }
        if (config_.moe_layer(int64_t(l))) {  // each stacked expert tensor as one item: experts
                                              // stay evenly spaced
            auto stacked = [&](const std::vector<WeightView>& e, const std::string& what) {
                WeightView all = e[0];
                all.n_out *= int64_t(e.size());
                return add_matrix(all, what);
            };
            it.router = add_matrix(w.router, p + "ffn_gate_inp.weight");
            it.gate_e = stacked(w.gate_exps, p + "ffn_gate_exps.weight");
            it.up_e = stacked(w.up_exps, p + "ffn_up_exps.weight");
            it.down_e = stacked(w.down_exps, p + "ffn_down_exps.weight");
            it.gate_s = scales_of(w.gate_exps, expert_scales[l][0]);
            it.up_s = scales_of(w.up_exps, expert_scales[l][1]);
            it.down_s = scales_of(w.down_exps, expert_scales[l][2]);
            if (config_.n_ff_shexp > 0) {
                it.gate_sh = add_matrix(w.gate_shexp, p + "ffn_gate_shexp.weight");
                it.up_sh = add_matrix(w.up_shexp, p + "ffn_up_shexp.weight");
                it.down_sh = add_matrix(w.down_shexp, p + "ffn_down_shexp.weight");
                if (w.gate_inp_shexp.data)  // Qwen2-MoE
                    it.gate_inp_sh = add_matrix(w.gate_inp_shexp, p + "ffn_gate_inp_shexp.weight");
            }
            continue;
        }
        it.gate = w.w_gate.data ? add_matrix(w.w_gate, p + "ffn_gate.weight") : SIZE_MAX;
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
    output_norm_b_ = vec(i_out_norm_b);
    output_b_ = vec(i_out_b);
    rope_ = config_.rope(vec(i_rope));
    rope_swa_ = config_.rope_swa(vec(i_rope));
    layers_.resize(hw.layers.size());
    for (size_t l = 0; l < hw.layers.size(); ++l) {
        const LayerWeights& w = hw.layers[l];
        const LayerItems& it = li[l];
        DeviceLayer& d = layers_[l];
        d.attn_norm = vec(it.attn_norm);
        d.ffn_norm = vec(it.ffn_norm);
        d.attn_norm_b = vec(it.attn_norm_b), d.ffn_norm_b = vec(it.ffn_norm_b);
        d.b_up = vec(it.b_up), d.b_down = vec(it.b_down);
        d.bq = vec(it.bq);
        d.bk = vec(it.bk);
        d.bv = vec(it.bv);
        d.q_norm = vec(it.q_norm);
        d.k_norm = vec(it.k_norm);
        d.attn_post_norm = vec(it.attn_post);
        d.attn_sub_norm = vec(it.attn_sub), d.ffn_sub_norm = vec(it.ffn_sub);
        d.ffn_post_norm = vec(it.ffn_post);
        d.bo = vec(it.bo);
        d.sinks = vec(it.sinks);
        d.wq = on_device(w.wq, it.wq);
        d.wk = on_device(w.wk, it.wk);
        d.wv = on_device(w.wv, it.wv);
        d.wo = on_device(w.wo, it.wo);
        if (config_.mla()) {
            if (w.wq_a.data) {
                d.wq_a = on_device(w.wq_a, it.wq_a);
                d.wq_b = on_device(w.wq_b, it.wq_b);
                d.q_a_norm = vec(it.q_a_norm);
            }
            d.wkv_a = on_device(w.wkv_a, it.wkv_a);
            d.kv_a_norm = vec(it.kv_a_norm);
            d.wk_b0 = on_device(w.wk_b[0], it.wk_b);
            d.wv_b0 = on_device(w.wv_b[0], it.wv_b);
            d.wk_b_bytes = align_up(w.wk_b[0].row_bytes * size_t(w.wk_b[0].n_out));
            d.wv_b_bytes = align_up(w.wv_b[0].row_bytes * size_t(w.wv_b[0].n_out));
        }
        if (config_.moe_layer(int64_t(l))) {
            d.router = on_device(w.router, it.router);
            d.experts.gate0 = on_device(w.gate_exps[0], it.gate_e);
            d.experts.up0 = on_device(w.up_exps[0], it.up_e);
            d.experts.down0 = on_device(w.down_exps[0], it.down_e);
            d.experts.expert_bytes = w.gate_exps[0].row_bytes * size_t(w.gate_exps[0].n_out);
            d.experts.down_bytes = w.down_exps[0].row_bytes * size_t(w.down_exps[0].n_out);
            d.router_b = vec(it.router_b);
            d.experts.gate_b = vec(it.gate_b);
            d.experts.up_b = vec(it.up_b);
            d.experts.down_b = vec(it.down_b);
            d.experts.gate_s = vec(it.gate_s);
            d.experts.up_s = vec(it.up_s);
            d.experts.down_s = vec(it.down_s);
            d.experts.gate_s_host = expert_scales[l][0];
            d.experts.up_s_host = expert_scales[l][1];
            d.experts.down_s_host = expert_scales[l][2];
            d.experts.swiglu_oai = config_.swiglu_oai;
            d.experts.alpha = config_.swiglu_alpha, d.experts.limit = config_.swiglu_limit;
            d.exp_probs_b = vec(it.exp_probs_b);
            if (config_.n_ff_shexp > 0) {
                d.gate_shexp = on_device(w.gate_shexp, it.gate_sh);
                d.up_shexp = on_device(w.up_shexp, it.up_sh);
                d.down_shexp = on_device(w.down_shexp, it.down_sh);
                if (w.gate_inp_shexp.data)
                    d.gate_inp_shexp = on_device(w.gate_inp_shexp, it.gate_inp_sh);
            }
            continue;
        }
        if (w.w_gate.data) d.w_gate = on_device(w.w_gate, it.gate);
        d.w_up = on_device(w.w_up, it.up);
        d.w_down = on_device(w.w_down, it.down);
    }
    upload_lora(hw);
    // Control vectors: every layer's direction (zeros where none), one upload.
    const ControlVector cv = control_vector_load(options_.control_vectors, config_);
    if (!cv.empty()) {
        const size_t bytes = cv.values.size() * sizeof(float);
        cvec_mem_ = DeviceMem(bytes, "the control vectors");
        CUDA_CHECK(cudaMemcpy(cvec_mem_.get(), cv.values.data(), bytes, cudaMemcpyHostToDevice));
        cvec_layer_.assign(size_t(config_.n_layer), nullptr);
        for (int64_t l = 0; l < config_.n_layer; ++l)
            if (cv.steered[size_t(l)])
                cvec_layer_[size_t(l)] =
                    reinterpret_cast<const float*>(cvec_mem_.get()) + l * config_.n_embd;
    }
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

void CudaBackend::allocate_kv() {
    const KvLayout layout = kv_layout_for(config_, options_);
    n_blocks_ = layout.n_blocks;
    window_ = layout.window;
    n_stages_ = kv_stages_for(options_);
    k_block_bytes_ = kv_layer_block_bytes(options_.kv_type_k, KvRole::K, config_.n_kv_head,
                                          options_.kv_block_size, config_.head_dim);
    // (V reading K's rows: no V pool or stage.)
    v_block_bytes_ = v_shares_k_
                         ? 0
                         : kv_layer_block_bytes(options_.kv_type_v, KvRole::V, config_.n_kv_head,
                                                options_.kv_block_size, config_.head_dim);
    const size_t s_bytes = align_up(
        size_t(n_stages_ * config_.n_kv_head * options_.kv_block_size * config_.head_dim * 2));
    const size_t v_s_bytes = v_shares_k_ ? 0 : s_bytes;
    // Per layer: K pool, V pool (of the main or the window pool's blocks), K and V stages.
    auto layer_bytes = [&](int64_t l) {
        const size_t n = size_t(pool_blocks(l));
        return align_up(n * size_t(k_block_bytes_)) + align_up(n * size_t(v_block_bytes_)) +
               s_bytes + v_s_bytes;
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
        v_pool_.push_back(v_shares_k_ ? base : base + k_bytes);
        if (n_stages_ > 0) {
            k_stage_.push_back(base + k_bytes + v_bytes);
            v_stage_.push_back(v_shares_k_ ? k_stage_.back() : base + k_bytes + v_bytes + s_bytes);
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
        if (v_shares_k_) continue;
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
        if (v_shares_k_) continue;
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
    kv.v_is_k = v_shares_k_;  // (then v_pool_ and v_stage_ hold K's)
    if (n_stages_ > 0) {
        kv.k_stage = k_stage_[size_t(l)];
        kv.v_stage = v_stage_[size_t(l)];
        kv.n_stages = n_stages_;
    }
    return kv;
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

}  // namespace kvrun::cuda_detail
