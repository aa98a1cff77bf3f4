// The CUDA backend (cuda_backend.h; the class in cuda_backend_impl.h, its weights and KV
// pools in cuda_backend_store.cpp): weights uploaded once into one device arena, per-layer
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
#include <cstring>
#include <string>
#include <vector>

#include "cuda/cuda_backend_impl.h"
#include "quant.h"
#include "sampler.h"

namespace kvrun {
namespace cuda_detail {

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
        // The gate and up rows serve the dense layers and the shared experts (GLM 4.5), whose
        // output has a buffer of its own, as have their gate logits (Qwen2-MoE, [T]).
        const size_t TK = T * size_t(c.n_expert_used);
        const size_t ff = size_t(std::max(c.n_ff, c.n_ff_shexp));
        // DeepSeek's latent attention (see mla_q_; empty otherwise).
        const bool mla = c.mla();
        const size_t TH = mla ? T * size_t(c.n_head) : 0;
        const size_t sizes[] = {T * size_t(c.n_embd),
                                T * size_t(c.n_embd),
                                T * size_t(c.q_dim()),
                                T * size_t(c.q_dim()),
                                T * size_t(c.kv_dim()),
                                T * size_t(c.kv_dim()),
                                T * ff,
                                T * ff,
                                T * size_t(c.n_embd),
                                T * size_t(c.n_expert),
                                TK,
                                TK,
                                TK * size_t(c.n_ff_exp),
                                TK * size_t(c.n_embd),
                                TK * size_t(c.n_ff_exp),
                                2 * TK,
                                c.n_ff_shexp > 0 ? T * size_t(c.n_embd) : 0,
                                c.shexp_gate ? T : 0,
                                TH * size_t(c.mla_nope + c.n_rot),
                                mla ? T * size_t(c.mla_q_rank) : 0,
                                mla ? T * size_t(c.mla_rank + c.n_rot) : 0,
                                TH * size_t(std::max(c.mla_nope, c.mla_rank)),
                                TH * size_t(std::max(c.mla_rank, c.mla_v)),
                                TH,
                                c.parallel_blocks ? T * size_t(c.n_embd) : 0};
        float *moe_ids = nullptr, *moe_map = nullptr, *mla_ids = nullptr;
        float** ptrs[] = {&x_,      &xb_,     &q_,          &att_,     &k_,
                          &v_,      &gate_,   &up_,         &xr_,      &moe_logits_,
                          &moe_ids, &moe_w_,  &moe_h_,      &moe_out_, &moe_up_,
                          &moe_map, &shexp_,  &shexp_gate_, &mla_q_,   &mla_qa_,
                          &mla_kv_, &mla_in_, &mla_res_,    &mla_ids,  &xn_};
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
        mla_ids_ = reinterpret_cast<int32_t*>(mla_ids);
        if (mla) {  // job j of the per-head GEMVs multiplies by head j % n_head's matrix
            std::vector<int32_t> heads(TH);
            for (size_t j = 0; j < TH; ++j) heads[j] = int32_t(j % size_t(c.n_head));
            CUDA_CHECK(
                cudaMemcpy(mla_ids_, heads.data(), TH * sizeof(int32_t), cudaMemcpyHostToDevice));
        }
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
    if (!xq_mem_.get() && c.n_embd % 32 == 0 && cuda_gemv_q8()) {  // only the integer GEMV's
        const size_t n = size_t(kCudaGemvMaxRows * std::max(c.n_embd, c.q_dim()));
        xq_mem_ = DeviceMem(align_up(2 * n) + n / 32 * sizeof(float), "quantized activations");
        xq_.q = xq_att_.q = reinterpret_cast<int8_t*>(xq_mem_.get());
        xq_.d = xq_att_.d = reinterpret_cast<float*>(xq_mem_.get() + align_up(2 * n));
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
// top-k, the chosen experts, weighted sum; plus the shared experts (GLM 4.5; Qwen2-MoE's
// gated by a sigmoid), computed first from the same rows.
void CudaBackend::enqueue_moe_ffn(const DeviceLayer& w, int64_t T) {
    const ModelConfig& c = config_;
    const cudaStream_t s = stream_.get();
    const int64_t K = c.n_expert_used;
    const MoeExperts& ex = w.experts;
    const bool shared = w.gate_shexp.data != nullptr;
    if (shared) {
        cuda_matmul_swiglu(gate_, up_, xb_, w.gate_shexp, w.up_shexp, T, scratch_, s);
        cuda_matmul(shexp_, gate_, w.down_shexp, T, scratch_, s);
        if (w.gate_inp_shexp.data)  // (Qwen2-MoE; xb_ is overwritten by the experts' sum)
            cuda_matmul(shexp_gate_, xb_, w.gate_inp_shexp, T, scratch_, s);
    }
    cuda_matmul(moe_logits_, xb_, w.router, T, scratch_, s);
    if (w.router_b) cuda_add_bias(moe_logits_, w.router_b, T, c.n_expert, s);
    MoeRouting routing{c.moe_sigmoid, w.exp_probs_b, c.moe_norm, c.moe_scale};
    routing.n_group = int(c.n_group), routing.n_group_used = int(c.n_group_used);
    cuda_moe_topk(moe_logits_, T, c.n_expert, K, moe_ids_, moe_w_, s, routing);
    if (T > kGraphMaxTokens) {  // prefill: tokens grouped by expert (syncs the stream)
        cuda_moe_ffn_grouped(xb_, xb_, moe_ids_, moe_w_, T, K, c.n_expert, ex,
                             {moe_out_, moe_h_, moe_up_, moe_map_}, scratch_, s,
                             c.moe_weight_before);
    } else if (ex.gate_b) {  // decode, biased experts (gpt-oss)
        cuda_moe_experts_biased(moe_out_, moe_h_, moe_up_, xb_, moe_ids_, T * K, int(K), ex, s);
        cuda_moe_combine(xb_, moe_out_, moe_w_, T, K, c.n_embd, s);
    } else if (c.moe_weight_before) {  // decode, Llama 4: each job's input row weighted
        cuda_moe_weight_rows(moe_out_, xb_, moe_w_, T * K, K, c.n_embd, s);
        cuda_gemv_experts_swiglu(moe_h_, moe_out_, ex.gate0, ex.up0, ex.expert_bytes, moe_ids_,
                                 T * K, 1, s, &scratch_, ex.gate_s, ex.up_s);
        cuda_gemv_experts(moe_out_, moe_h_, ex.down0, ex.down_bytes, moe_ids_, T * K, 1, s,
                          &scratch_, ex.down_s);
        cuda_moe_combine(xb_, moe_out_, nullptr, T, K, c.n_embd, s);
    } else {  // decode: expert GEMVs by device-side ids (capturable)
        cuda_gemv_experts_swiglu(moe_h_, xb_, ex.gate0, ex.up0, ex.expert_bytes, moe_ids_, T * K,
                                 int(K), s, &scratch_, ex.gate_s, ex.up_s);
        cuda_gemv_experts(moe_out_, moe_h_, ex.down0, ex.down_bytes, moe_ids_, T * K, 1, s,
                          &scratch_, ex.down_s);
        cuda_moe_combine(xb_, moe_out_, moe_w_, T, K, c.n_embd, s);
    }
    if (shared && w.gate_inp_shexp.data)
        cuda_add_sigmoid_gated(xb_, shexp_, shexp_gate_, T, c.n_embd, s);
    else if (shared)
        cuda_add(xb_, shexp_, T * c.n_embd, s);
}

// The dense gated FFN of layer w on xb_'s T normed rows (SwiGLU, or Gemma's GeGLU), result in
// xb_. Gate and up share one GEMV launch unless a LoRA adapts one of them. xq: xb_ quantized
// by the norm (CudaBackend::norm_xb), or null.
void CudaBackend::enqueue_dense_ffn(const DeviceLayer& w, int64_t T, const CudaXq* xq) {
    const ModelConfig& c = config_;
    const cudaStream_t s = stream_.get();
    if (c.ffn_plain) {  // phi2, starcoder2: gelu(up x + b), no gate
        observe({&w.w_up}, xb_, T);
        cuda_matmul(up_, xb_, w.w_up, T, scratch_, s, xq);
        add_lora(up_, xb_, w.lora[kLoraUp], T);
        if (w.b_up) cuda_add_bias(up_, w.b_up, T, c.n_ff, s);
        cuda_gelu(gate_, up_, T * c.n_ff, s);
    } else if (!w.lora[kLoraGate].empty() || !w.lora[kLoraUp].empty()) {
        observe({&w.w_gate, &w.w_up}, xb_, T);
        cuda_matmul(gate_, xb_, w.w_gate, T, scratch_, s);
        cuda_matmul(up_, xb_, w.w_up, T, scratch_, s);
        add_lora(gate_, xb_, w.lora[kLoraGate], T);
        add_lora(up_, xb_, w.lora[kLoraUp], T);
        if (c.ffn_gelu)
            cuda_geglu(gate_, gate_, up_, T * c.n_ff, s);
        else
            cuda_swiglu(gate_, gate_, up_, T * c.n_ff, s);
    } else if (c.ffn_gelu) {
        observe({&w.w_gate, &w.w_up}, xb_, T);
        cuda_matmul_geglu(gate_, up_, xb_, w.w_gate, w.w_up, T, scratch_, s, xq);
    } else {
        observe({&w.w_gate, &w.w_up}, xb_, T);
        cuda_matmul_swiglu(gate_, up_, xb_, w.w_gate, w.w_up, T, scratch_, s, xq);
    }
    if (w.ffn_sub_norm)  // BitNet: the gated product normed
        cuda_rmsnorm(gate_, gate_, w.ffn_sub_norm, T, c.n_ff, c.norm_eps, s);
    observe({&w.w_down}, gate_, T);
    cuda_matmul(xb_, gate_, w.w_down, T, scratch_, s);
    add_lora(xb_, gate_, w.lora[kLoraDown], T);
    if (w.b_down) cuda_add_bias(xb_, w.b_down, T, c.n_embd, s);
}

// Layer l's attention on xb_'s T normed rows (xq: their quantized copy, or null), result
// (after attn_output and its bias) in xb_; kb: the batch's view of the layer's pool.
void CudaBackend::enqueue_attention(const DeviceLayer& w, int64_t l, int64_t T, const CudaXq* xq,
                                    const KvBatchView& kb) {
    const ModelConfig& c = config_;
    const cudaStream_t s = stream_.get();
    observe({&w.wq, &w.wk, &w.wv}, xb_, T);
    cuda_matmul_qkv(q_, k_, v_, xb_, w.wq, w.wk, w.wv, T, scratch_, s, xq);
    add_lora(q_, xb_, w.lora[kLoraQ], T);
    add_lora(k_, xb_, w.lora[kLoraK], T);
    add_lora(v_, xb_, w.lora[kLoraV], T);
    if (w.bq) {
        cuda_add_bias(q_, w.bq, T, c.q_dim(), s);
        cuda_add_bias(k_, w.bk, T, c.kv_dim(), s);
        cuda_add_bias(v_, w.bv, T, c.kv_dim(), s);
    }
    if (w.q_norm && c.qk_norm_full) {  // olmo2, olmoe: each token's whole Q and K
        cuda_rmsnorm(q_, q_, w.q_norm, T, c.q_dim(), c.norm_eps, s);
        cuda_rmsnorm(k_, k_, w.k_norm, T, c.kv_dim(), c.norm_eps, s);
    } else if (w.q_norm) {  // qwen3: per-head RMSNorm of Q and K before RoPE (in place)
        cuda_rmsnorm(q_, q_, w.q_norm, T * c.n_head, c.head_dim, c.norm_eps, s);
        cuda_rmsnorm(k_, k_, w.k_norm, T * c.n_kv_head, c.head_dim, c.norm_eps, s);
    }
    const KvLayerView kv = kv_layer(l);
    const RopeParams& rope = c.is_swa(l) ? rope_swa_ : rope_;
    if (rotate_ || !c.uses_rope(l)) {  // unfused: a Hadamard rotation, or a NoPE layer
        if (c.uses_rope(l)) {
            cuda_rope(q_, d_pos_, T, c.n_head, c.head_dim, rope, s);
            cuda_rope(k_, d_pos_, T, c.n_kv_head, c.head_dim, rope, s);
        } else if (c.attn_temp_scale > 0) {  // Llama 4's: the attention temperature
            cuda_attn_temperature(q_, d_pos_, T, c.q_dim(), c.attn_temp_scale, c.attn_temp_floor,
                                  s);
        }
        if (rotate_) {  // q.k unchanged; K's outlier channels spread (kv_rotation_enabled)
            cuda_hadamard(q_, T * c.n_head, c.head_dim, s);
            cuda_hadamard(k_, T * c.n_kv_head, c.head_dim, s);
        }
        cuda_kv_write(kv, kb, k_, v_, s, seals_);
    } else {
        cuda_rope_kv_write(q_, k_, v_, d_pos_, kv, kb, c.n_head, rope, s, seals_);
    }
    // The attention quantizes its output for the output projection's integer GEMV.
    // (Not of an output that BitNet's norm changes first.)
    const CudaXq* att_xq = xq_for(
        xq_att_, att_, c.q_dim() % 32 == 0 && cuda_gemv_int_type(w.wo.type) && !w.attn_sub_norm, T);
    cuda_paged_attention(att_, q_, kv, kb, c.n_head, c.attn_scale, scratch_, s, c.attn_softcap,
                         c.attn_window(l), w.sinks, att_xq);
    if (w.attn_sub_norm) cuda_rmsnorm(att_, att_, w.attn_sub_norm, T, c.q_dim(), c.norm_eps, s);
    observe({&w.wo}, att_, T);
    cuda_matmul(xb_, att_, w.wo, T, scratch_, s, att_xq);
    add_lora(xb_, att_, w.lora[kLoraO], T);
    if (w.bo) cuda_add_bias(xb_, w.bo, T, c.n_embd, s);
}

void CudaBackend::enqueue_mla_attention(const DeviceLayer& w, int64_t l, int64_t T,
                                        const KvBatchView& kb) {
    const ModelConfig& c = config_;
    const cudaStream_t s = stream_.get();
    const KvLayerView kv = kv_layer(l);
    const int64_t H = c.n_head, R = c.mla_rank, N = c.mla_nope, P = c.n_rot;
    const int64_t D = c.head_dim;  // P + R: the latent row every head attends over
    const int64_t QW = N + P;      // one head's query before absorption
    if (w.wq_a.data) {             // Q through its low rank and an RMSNorm
        observe({&w.wq_a, &w.wkv_a}, xb_, T);
        cuda_matmul(mla_qa_, xb_, w.wq_a, T, scratch_, s);
        cuda_rmsnorm(mla_qa_, mla_qa_, w.q_a_norm, T, c.mla_q_rank, c.norm_eps, s);
        observe({&w.wq_b}, mla_qa_, T);
        cuda_matmul(mla_q_, mla_qa_, w.wq_b, T, scratch_, s);
    } else {
        observe({&w.wq, &w.wkv_a}, xb_, T);
        cuda_matmul(mla_q_, xb_, w.wq, T, scratch_, s);
        add_lora(mla_q_, xb_, w.lora[kLoraQ], T);
    }
    // K = V = [k_pe | RMSNorm(compressed KV)] per token.
    cuda_matmul(mla_kv_, xb_, w.wkv_a, T, scratch_, s);
    cuda_mla_kv_rows(k_, mla_kv_, w.kv_a_norm, T, R, P, c.norm_eps, s);
    // Each head's query: [q_pe | wk_b q_nope], so q.k = q_pe.k_pe + q_nope.(W_UK c). Job j of the
    // GEMVs is (token j / H, head j % H).
    cuda_copy_rows(q_, D, mla_q_ + N, QW, T * H, P, s);
    cuda_copy_rows(mla_in_, N, mla_q_, QW, T * H, N, s);
    cuda_gemv_experts(mla_res_, mla_in_, w.wk_b0, w.wk_b_bytes, mla_ids_, T * H, 1, s, &scratch_);
    cuda_copy_rows(q_ + P, D, mla_res_, R, T * H, R, s);
    if (!c.uses_rope(l)) {
        cuda_kv_write(kv, kb, k_, k_, s, seals_);
    } else if (kv.v_is_k) {  // K alone is stored: RoPE fused with its write
        cuda_rope_kv_write(q_, k_, nullptr, d_pos_, kv, kb, H, rope_, s, seals_);
    } else {  // V (a pool of its own) gets the rotated row too
        cuda_rope(q_, d_pos_, T, H, D, rope_, s);
        cuda_rope(k_, d_pos_, T, 1, D, rope_, s);
        cuda_kv_write(kv, kb, k_, k_, s, seals_);
    }
    cuda_paged_attention(att_, q_, kv, kb, H, c.attn_scale, scratch_, s);
    // Each head's latent output decompressed by its wv_b, then the output projection.
    cuda_copy_rows(mla_in_, R, att_ + P, D, T * H, R, s);
    cuda_gemv_experts(mla_res_, mla_in_, w.wv_b0, w.wv_b_bytes, mla_ids_, T * H, 1, s, &scratch_);
    observe({&w.wo}, mla_res_, T);
    cuda_matmul(xb_, mla_res_, w.wo, T, scratch_, s);
    add_lora(xb_, mla_res_, w.lora[kLoraO], T);
}

// xq pointed at x's rows for the integer GEMV when it takes this step (T decode-size rows,
// `fuse`: the consuming matmul's type and width allow it), else null.
CudaXq* CudaBackend::xq_for(CudaXq& xq, const float* x, bool fuse, int64_t T) {
    if (!fuse || !xq.q || T > kCudaGemvMaxRows || !cuda_gemv_q8()) return nullptr;
    xq.x = x;
    xq.elt_bytes = cuda_gemv_q16() ? 2 : 1;
    return &xq;
}

const CudaXq* CudaBackend::norm_xb(const float* w, const float* b, bool add, bool fuse, int64_t T) {
    const ModelConfig& c = config_;
    const cudaStream_t s = stream_.get();
    if (w && c.layer_norm) {  // (no fused quantization: the GEMV quantizes x itself)
        if (add)
            cuda_add_layernorm(x_, xb_, xb_, w, b, T, c.n_embd, c.norm_eps, s);
        else
            cuda_layernorm(xb_, x_, w, b, T, c.n_embd, c.norm_eps, s);
        return nullptr;
    }
    if (!w) {  // olmo2, exaone4: no norm; the block reads the residual stream as it is
        if (add) cuda_add(x_, xb_, T * c.n_embd, s);
        CUDA_CHECK(cudaMemcpyAsync(xb_, x_, size_t(T * c.n_embd) * sizeof(float),
                                   cudaMemcpyDeviceToDevice, s));
        return nullptr;  // (an integer GEMV quantizes x itself)
    }
    const CudaXq* xq = xq_for(xq_, xb_, fuse, T);
    if (!xq) {
        if (add)
            cuda_add_rmsnorm(x_, xb_, xb_, w, T, c.n_embd, c.norm_eps, s);
        else
            cuda_rmsnorm(xb_, x_, w, T, c.n_embd, c.norm_eps, s);
    } else if (add) {
        cuda_add_rmsnorm_xq(x_, xb_, xb_, w, T, c.n_embd, c.norm_eps, *xq, s);
    } else {
        cuda_rmsnorm_xq(xb_, x_, w, T, c.n_embd, c.norm_eps, *xq, s);
    }
    return xq;
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
    // Each residual add is fused with the RMSNorm that follows it (the first layer's attention
    // norm has no add before it), and each norm before a matmul that takes the integer GEMV
    // quantizes its rows for it (norm_xb).
    // (DeepSeek's latent attention quantizes its inputs in its matmuls.)
    const auto int_qkv = [&](int64_t l) {
        return !c.mla() && cuda_gemv_int_type(layers_[size_t(l)].wq.type);
    };
    const CudaXq* xq = norm_xb(layers_[0].attn_norm, layers_[0].attn_norm_b, false, int_qkv(0), T);
    for (int64_t l = 0; l < c.n_layer; ++l) {
        const DeviceLayer& w = layers_[size_t(l)];
        const size_t row_bytes = size_t(T * c.n_embd) * sizeof(float);
        if (c.parallel_blocks)  // phi2, Cohere: the FFN reads the attention's input too
            CUDA_CHECK(cudaMemcpyAsync(xn_, xb_, row_bytes, cudaMemcpyDeviceToDevice, s));
        // Attention block (xb_ holds the normed input).
        if (c.mla())
            enqueue_mla_attention(w, l, T, kb_main);
        else
            enqueue_attention(w, l, T, xq, in_window_pool(l) ? kb_window : kb_main);
        if (w.attn_post_norm)  // gemma2/3: the block's output normed before the residual add
            cuda_rmsnorm(xb_, xb_, w.attn_post_norm, T, c.n_embd, c.norm_eps, s);
        if (c.residual_scale != 1.0f) cuda_scale(xb_, T * c.n_embd, c.residual_scale, s);
        const bool moe = c.moe_layer(l);
        if (c.parallel_blocks) {  // the attention's output joins x_; the FFN reads xn_
            cuda_add(x_, xb_, T * c.n_embd, s);
            CUDA_CHECK(cudaMemcpyAsync(xb_, xn_, row_bytes, cudaMemcpyDeviceToDevice, s));
            xq = nullptr;
        } else {
            xq = norm_xb(w.ffn_norm, w.ffn_norm_b, true, !moe && cuda_gemv_int_type(w.w_gate.type),
                         T);
        }
        // Feed-forward block.
        if (moe)
            enqueue_moe_ffn(w, T);
        else
            enqueue_dense_ffn(w, T, xq);
        if (w.ffn_post_norm) cuda_rmsnorm(xb_, xb_, w.ffn_post_norm, T, c.n_embd, c.norm_eps, s);
        if (c.residual_scale != 1.0f) cuda_scale(xb_, T * c.n_embd, c.residual_scale, s);
        if (!cvec_layer_.empty() && cvec_layer_[size_t(l)])  // a control vector joins the output
            cuda_add_bias(xb_, cvec_layer_[size_t(l)], T, c.n_embd, s);
        if (l + 1 < c.n_layer)
            xq = norm_xb(layers_[size_t(l + 1)].attn_norm, layers_[size_t(l + 1)].attn_norm_b, true,
                         int_qkv(l + 1), T);
        else
            cuda_add(x_, xb_, T * c.n_embd, s);
        if (layer_observer_) {  // x_ now holds the layer's output
            observed_.resize(size_t(T * c.n_embd));
            CUDA_CHECK(cudaMemcpyAsync(observed_.data(), x_, observed_.size() * sizeof(float),
                                       cudaMemcpyDeviceToHost, s));
            CUDA_CHECK(cudaStreamSynchronize(s));
            layer_observer_(static_cast<int32_t>(l), observed_.data(), T);
        }
    }
    if (R == 0) return;
    // Final norm and output projection only for the rows that need logits.
    cuda_gather_rows(xr_, x_, d_rows_, R, c.n_embd, s);
    if (c.layer_norm)
        cuda_layernorm(xr_, xr_, output_norm_, output_norm_b_, R, c.n_embd, c.norm_eps, s);
    else
        cuda_rmsnorm(xr_, xr_, output_norm_, R, c.n_embd, c.norm_eps, s);
    if (hidden_only_) return;  // forward_embeddings: the normed rows are the result
    observe({&output_}, xr_, R);
    cuda_matmul(logits_, xr_, output_, R, scratch_, s);
    add_lora(logits_, xr_, lora_output_, R, /*logit_rows=*/true);
    if (output_b_) cuda_add_bias(logits_, output_b_, R, c.n_vocab, s);
    if (c.logit_scale != 1.0f) cuda_scale(logits_, R * c.n_vocab, c.logit_scale, s);
    if (c.final_softcap > 0) cuda_softcap(logits_, R * c.n_vocab, c.final_softcap, s);
}

// Runs the step: eagerly, or from a CUDA graph for decode-sized batches (captured on the
// second eager-free occurrence of a shape, so the first run sizes the scratch buffers).
void CudaBackend::run_step(int64_t T, int64_t R, int64_t max_blocks) {
    if (!use_graphs_ || T > kGraphMaxTokens || hidden_only_ || observer_ ||
        layer_observer_) {  // eager
        enqueue_forward(T, R, max_blocks);
        return;
    }
    GraphEntry& g = graphs_[{T, R, max_blocks, seals_}];
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
    // A staged token seals its block when it writes the block's last row (seal_head_block).
    const int64_t bs = options_.kv_block_size;
    seals_ = n_stages_ > 0 && std::any_of(b.slots.begin(), b.slots.end(), [&](int32_t slot) {
                 return slot >= 0 && slot % bs == bs - 1;
             });
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

void CudaBackend::observe(std::initializer_list<const WeightView*> ws, const float* x, int64_t T) {
    if (!observer_ || T == 0) return;
    bool copied = false;  // the weights share the input: one copy serves them all
    for (const WeightView* w : ws) {
        auto it = host_of_.find(w->data);
        if (it == host_of_.end()) continue;
        if (!copied) {
            observed_.resize(size_t(T * w->n_in));
            CUDA_CHECK(cudaMemcpyAsync(observed_.data(), x, observed_.size() * sizeof(float),
                                       cudaMemcpyDeviceToHost, stream_.get()));
            CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
            copied = true;
        }
        observer_(it->second, w->n_in, observed_.data(), T);
    }
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

}  // namespace cuda_detail

std::unique_ptr<Backend> make_cuda_backend(const GgufFile& file, const BackendOptions& options,
                                           int device) {
    return std::make_unique<cuda_detail::CudaBackend>(file, options, device);
}

}  // namespace kvrun
