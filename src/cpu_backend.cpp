// The CPU reference forward pass (see cpu_backend.h):
// embed -> per layer [rmsnorm, Q/K/V (+bias), RoPE, KV write, paged attention, output
// projection, residual, rmsnorm, SwiGLU FFN, residual] -> final rmsnorm -> logits for the
// requested rows only; with the architectures' variations (LayerNorms, parallel blocks, plain
// GELU FFNs, experts, latent attention ...) switched by ModelConfig.
#include "cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "attn_window.h"
#include "common.h"
#include "kv_format.h"
#include "thread_pool.h"

namespace kvrun {

CpuBackend::CpuBackend(const GgufFile& file, const BackendOptions& options)
    : config_(backend_model_config(file, options)),
      weights_(weights_load(file, config_)),
      options_(options) {
    lora_files_ = lora_attach(weights_, config_, file, options_.lora);
    cvec_ = control_vector_load(options_.control_vectors, config_);
    rope_ = config_.rope(config_.rope_freq_factors.data());
    rope_swa_ = config_.rope_swa(config_.rope_freq_factors.data());
    const KvLayout layout = kv_layout_for(config_, options_);
    n_blocks_ = layout.n_blocks;
    window_ = layout.window;
    n_stages_ = kv_stages_for(options_);
    rotate_ = kv_rotation_enabled(config_, options_);
    k_block_bytes_ = kv_layer_block_bytes(options_.kv_type_k, KvRole::K, config_.n_kv_head,
                                          options_.kv_block_size, config_.head_dim);
    v_block_bytes_ = kv_layer_block_bytes(options_.kv_type_v, KvRole::V, config_.n_kv_head,
                                          options_.kv_block_size, config_.head_dim);
    // (DeepSeek: V reads K's latent rows; kv_write stores K alone.)
    v_shares_k_ = kv_v_shares_k(config_, options_.kv_type_k, options_.kv_type_v);
    if (v_shares_k_) v_block_bytes_ = 0;
    const size_t stage_bytes =
        size_t(n_stages_ * config_.n_kv_head * options_.kv_block_size * config_.head_dim * 2);
    try {
        for (int64_t l = 0; l < config_.n_layer; ++l) {
            // Uninitialized: a slot is always written before attention reads it.
            const int64_t n = pool_blocks(l);
            k_pool_.emplace_back(new uint8_t[size_t(n * k_block_bytes_)]);
            v_pool_.emplace_back(v_shares_k_ ? nullptr : new uint8_t[size_t(n * v_block_bytes_)]);
            if (n_stages_ > 0) {
                k_stage_.emplace_back(new uint8_t[stage_bytes]);
                v_stage_.emplace_back(v_shares_k_ ? nullptr : new uint8_t[stage_bytes]);
            }
        }
    } catch (const std::bad_alloc&) {
        throw Error(fmt::format("cannot allocate the KV cache: {} blocks x {} layers", n_blocks_,
                                config_.n_layer),
                    "lower --kv-memory");
    }
    if (options_.n_threads > 0 || options_.n_threads_batch > 0)
        cpu_set_num_threads(std::max(cpu_resolve_threads(options_.n_threads),
                                     cpu_resolve_threads(options_.n_threads_batch)));
}

int64_t CpuBackend::kv_block_io_bytes(KvPool pool) const {
    return kv_pool_block_bytes(config_, options_, window_, pool);
}

int64_t CpuBackend::pool_blocks(int64_t layer) const {
    return in_window_pool(layer) ? window_.n_blocks : n_blocks_;
}

bool CpuBackend::in_window_pool(int64_t layer) const {
    return kv_layer_in_window_pool(config_, window_, layer);
}

void CpuBackend::read_kv_block(KvPool pool, int64_t block, uint8_t* dst) {
    kv_block_io_check("read_kv_block", pool, block, n_blocks_, window_);
    for (int64_t l = 0; l < config_.n_layer; ++l) {
        if (!kv_layer_in_pool(config_, window_, l, pool)) continue;
        std::memcpy(dst, k_pool_[l].get() + block * k_block_bytes_, size_t(k_block_bytes_));
        dst += k_block_bytes_;
        if (v_shares_k_) continue;
        std::memcpy(dst, v_pool_[l].get() + block * v_block_bytes_, size_t(v_block_bytes_));
        dst += v_block_bytes_;
    }
}

void CpuBackend::write_kv_block(KvPool pool, int64_t block, const uint8_t* src) {
    kv_block_io_check("write_kv_block", pool, block, n_blocks_, window_);
    for (int64_t l = 0; l < config_.n_layer; ++l) {
        if (!kv_layer_in_pool(config_, window_, l, pool)) continue;
        std::memcpy(k_pool_[l].get() + block * k_block_bytes_, src, size_t(k_block_bytes_));
        src += k_block_bytes_;
        if (v_shares_k_) continue;
        std::memcpy(v_pool_[l].get() + block * v_block_bytes_, src, size_t(v_block_bytes_));
        src += v_block_bytes_;
    }
}

KvLayerView CpuBackend::kv_layer(int64_t layer) const {
    KvLayerView kv;
    kv.k_type = options_.kv_type_k;
    kv.v_type = options_.kv_type_v;
    kv.k = k_pool_.at(layer).get();
    kv.v = v_shares_k_ ? kv.k : v_pool_.at(layer).get();
    kv.v_is_k = v_shares_k_;
    kv.n_blocks = pool_blocks(layer);
    kv.n_kv_head = config_.n_kv_head;
    kv.block_size = options_.kv_block_size;
    kv.head_dim = config_.head_dim;
    if (n_stages_ > 0) {
        kv.k_stage = k_stage_.at(layer).get();
        kv.v_stage = v_shares_k_ ? kv.k_stage : v_stage_.at(layer).get();
        kv.n_stages = n_stages_;
    }
    return kv;
}

void CpuBackend::validate(const ForwardBatch& b) const {
    b.validate(config_.n_vocab, n_blocks_, options_.kv_block_size, n_stages_, window_);
}

void CpuBackend::forward(const ForwardBatch& b, float* logits) {
    run(b, logits, nullptr);
}

void CpuBackend::forward_embeddings(const ForwardBatch& b, float* out) {
    run(b, nullptr, out);
}

void CpuBackend::run(const ForwardBatch& b, float* logits, float* hidden) {
    validate(b);
    if (options_.n_threads_batch > 0)  // -tb for prefill passes, -t for decode steps
        cpu_thread_pool().set_active(cpu_resolve_threads(
            b.tokens.size() > 1 ? options_.n_threads_batch : options_.n_threads));
    struct RoundingScope {  // the ops read the flag on this thread
        bool saved = cpu::llamacpp_rounding();
        explicit RoundingScope(bool on) { cpu::set_llamacpp_rounding(on); }
        ~RoundingScope() { cpu::set_llamacpp_rounding(saved); }
    } rounding(options_.llamacpp_rounding);
    const ModelConfig& c = config_;
    const int64_t T = int64_t(b.tokens.size());
    if (T == 0) return;
    if (!options_.lora.empty()) {  // each token's and each logit row's adapter scales
        lora_user_ = b.token_lora_scales(lora_scales());
        lora_user_rows_.assign(lora_user_.size(), std::vector<float>(b.logit_rows.size()));
        for (size_t i = 0; i < lora_user_.size(); ++i)
            for (size_t r = 0; r < b.logit_rows.size(); ++r)
                lora_user_rows_[i][r] = lora_user_[i][size_t(b.logit_rows[r])];
    }

    // Block tables flattened to [n_seqs][max_blocks], padded with -1 (never read: slots
    // were checked against each table's length); the window pool's the same way.
    int64_t max_blocks = 1;
    for (const auto& table : b.block_tables)
        max_blocks = std::max<int64_t>(max_blocks, table.size());
    auto flatten = [&](const std::vector<std::vector<int32_t>>& tables, std::vector<int32_t>& out) {
        out.assign(tables.size() * max_blocks, -1);
        for (size_t s = 0; s < tables.size(); ++s)
            std::copy(tables[s].begin(), tables[s].end(), out.begin() + s * max_blocks);
    };
    flatten(b.block_tables, flat_tables_);
    KvBatchView kb;
    kb.token_seq = b.seq_index.data();
    kb.token_slot = b.slots.data();
    kb.block_table = flat_tables_.data();
    kb.max_blocks_per_seq = max_blocks;
    kb.n_tokens = T;
    kb.token_stage = n_stages_ > 0 ? b.stages.data() : nullptr;
    KvBatchView kb_window = kb;  // the sliding-window layers' view of the window pool
    if (window_.n_blocks > 0) {
        flatten(b.window_tables, flat_window_tables_);
        kb_window.block_table = flat_window_tables_.data();
    }

    x_.resize(T * c.n_embd);
    xb_.resize(T * c.n_embd);
    q_.resize(T * c.q_dim());
    k_.resize(T * c.kv_dim());
    v_.resize(T * c.kv_dim());
    att_.resize(T * c.q_dim());
    gate_.resize(T * c.n_ff);
    up_.resize(T * c.n_ff);
    cpu::embed(x_.data(), weights_.token_embd, b.tokens.data(), T);
    if (c.embd_scale != 1.0f) cpu::scale(x_.data(), T * c.n_embd, c.embd_scale);
    for (int64_t l = 0; l < c.n_layer; ++l) {
        const LayerWeights& w = weights_.layers[l];
        // Attention block.
        pre_norm(w.attn_norm, w.attn_norm_b, T);
        if (c.parallel_blocks)  // phi2, Cohere: the FFN reads the attention's input too
            xn_.assign(xb_.begin(), xb_.begin() + T * c.n_embd);
        if (c.mla()) {
            mla_attention(w, l, T, b.positions.data(), kv_layer(l), kb);
        } else {
            matmul(q_.data(), xb_.data(), w.wq, T);
            matmul(k_.data(), xb_.data(), w.wk, T);
            matmul(v_.data(), xb_.data(), w.wv, T);
            add_lora(q_.data(), xb_.data(), w.lora_q, T, lora_user_);
            add_lora(k_.data(), xb_.data(), w.lora_k, T, lora_user_);
            add_lora(v_.data(), xb_.data(), w.lora_v, T, lora_user_);
            if (!w.bq.empty()) {
                cpu::add_bias(q_.data(), w.bq.data(), T, c.q_dim());
                cpu::add_bias(k_.data(), w.bk.data(), T, c.kv_dim());
                cpu::add_bias(v_.data(), w.bv.data(), T, c.kv_dim());
            }
            if (!w.q_norm.empty()) {  // qwen3: each head's Q and K RMS-normalized before RoPE
                // (olmo2, olmoe: each token's whole Q and K)
                const int64_t qw = c.qk_norm_full ? c.q_dim() : c.head_dim;
                const int64_t kw = c.qk_norm_full ? c.kv_dim() : c.head_dim;
                cpu::rmsnorm(q_.data(), q_.data(), w.q_norm.data(), T * c.q_dim() / qw, qw,
                             c.norm_eps);
                cpu::rmsnorm(k_.data(), k_.data(), w.k_norm.data(), T * c.kv_dim() / kw, kw,
                             c.norm_eps);
            }
            const RopeParams& rope = c.is_swa(l) ? rope_swa_ : rope_;
            if (c.uses_rope(l)) {  // SmolLM3's NoPE layers skip it
                cpu::rope(q_.data(), b.positions.data(), T, c.n_head, c.head_dim, rope);
                cpu::rope(k_.data(), b.positions.data(), T, c.n_kv_head, c.head_dim, rope);
            } else if (c.attn_temp_scale > 0) {  // Llama 4's: the attention temperature
                for (int64_t t = 0; t < T; ++t)
                    cpu::scale(q_.data() + t * c.q_dim(), c.q_dim(),
                               attn_temperature(b.positions[size_t(t)], c.attn_temp_scale,
                                                c.attn_temp_floor));
            }
            if (rotate_) {  // q.k is unchanged; K's outlier channels spread over all channels
                hadamard_rows(q_.data(), T * c.n_head, c.head_dim);
                hadamard_rows(k_.data(), T * c.n_kv_head, c.head_dim);
            }
            KvLayerView kv = kv_layer(l);
            const KvBatchView& kbl = in_window_pool(l) ? kb_window : kb;
            cpu::kv_write(kv, kbl, k_.data(), v_.data());
            cpu::paged_attention(att_.data(), q_.data(), kv, kbl, c.n_head, c.attn_scale,
                                 c.attn_softcap, c.attn_window(l),
                                 w.sinks.empty() ? nullptr : w.sinks.data());
            if (!w.attn_sub_norm.empty())  // BitNet: the attention's output normed
                cpu::rmsnorm(att_.data(), att_.data(), w.attn_sub_norm.data(), T, c.q_dim(),
                             c.norm_eps);
            matmul(xb_.data(), att_.data(), w.wo, T);
            add_lora(xb_.data(), att_.data(), w.lora_o, T, lora_user_);
            if (!w.bo.empty()) cpu::add_bias(xb_.data(), w.bo.data(), T, c.n_embd);
        }
        add_block_output(w.attn_post_norm, T);
        // Feed-forward block.
        if (c.parallel_blocks)
            std::copy(xn_.begin(), xn_.end(), xb_.begin());
        else
            pre_norm(w.ffn_norm, w.ffn_norm_b, T);
        if (c.moe_layer(l)) {
            moe_ffn(w, T);
        } else if (c.ffn_plain) {  // phi2, starcoder2: down(gelu(up x + b)) + b, no gate
            matmul(up_.data(), xb_.data(), w.w_up, T);
            add_lora(up_.data(), xb_.data(), w.lora_up, T, lora_user_);
            if (!w.b_up.empty()) cpu::add_bias(up_.data(), w.b_up.data(), T, c.n_ff);
            cpu::gelu(gate_.data(), up_.data(), T * c.n_ff);
            matmul(xb_.data(), gate_.data(), w.w_down, T);
            add_lora(xb_.data(), gate_.data(), w.lora_down, T, lora_user_);
            if (!w.b_down.empty()) cpu::add_bias(xb_.data(), w.b_down.data(), T, c.n_embd);
        } else {
            matmul(gate_.data(), xb_.data(), w.w_gate, T);
            matmul(up_.data(), xb_.data(), w.w_up, T);
            add_lora(gate_.data(), xb_.data(), w.lora_gate, T, lora_user_);
            add_lora(up_.data(), xb_.data(), w.lora_up, T, lora_user_);
            if (c.ffn_gelu)
                cpu::geglu(gate_.data(), gate_.data(), up_.data(), T * c.n_ff);
            else if (options_.llamacpp_rounding)  // emulated SiLU works on rows, like ggml's
                for (int64_t t = 0; t < T; ++t)
                    cpu::swiglu(gate_.data() + t * c.n_ff, gate_.data() + t * c.n_ff,
                                up_.data() + t * c.n_ff, c.n_ff);
            else
                cpu::swiglu(gate_.data(), gate_.data(), up_.data(), T * c.n_ff);
            if (!w.ffn_sub_norm.empty())  // BitNet: the gated product normed
                cpu::rmsnorm(gate_.data(), gate_.data(), w.ffn_sub_norm.data(), T, c.n_ff,
                             c.norm_eps);
            matmul(xb_.data(), gate_.data(), w.w_down, T);
            add_lora(xb_.data(), gate_.data(), w.lora_down, T, lora_user_);
        }
        add_block_output(w.ffn_post_norm, T,
                         !cvec_.empty() && cvec_.steered[size_t(l)]
                             ? cvec_.values.data() + l * c.n_embd
                             : nullptr);
        if (layer_observer_) layer_observer_(static_cast<int32_t>(l), x_.data(), T);
    }

    // Final norm and output projection only for the rows that need logits.
    const int64_t R = int64_t(b.logit_rows.size());
    if (R == 0) return;
    xb_.resize(std::max(xb_.size(), size_t(R * c.n_embd)));
    for (int64_t r = 0; r < R; ++r)
        std::memcpy(xb_.data() + r * c.n_embd, x_.data() + int64_t(b.logit_rows[r]) * c.n_embd,
                    c.n_embd * sizeof(float));
    norm_rows(xb_.data(), xb_.data(), weights_.output_norm, weights_.output_norm_b, R);
    if (hidden) {
        std::memcpy(hidden, xb_.data(), size_t(R * c.n_embd) * sizeof(float));
        return;
    }
    matmul(logits, xb_.data(), weights_.output, R);
    add_lora(logits, xb_.data(), weights_.lora_output, R, lora_user_rows_);
    if (!weights_.output_b.empty()) cpu::add_bias(logits, weights_.output_b.data(), R, c.n_vocab);
    if (c.logit_scale != 1.0f) cpu::scale(logits, R * c.n_vocab, c.logit_scale);
    if (c.final_softcap > 0) cpu::softcap(logits, R * c.n_vocab, c.final_softcap);
}

void CpuBackend::mla_attention(const LayerWeights& w, int64_t l, int64_t T, const int32_t* pos,
                               const KvLayerView& kv, const KvBatchView& kb) {
    const ModelConfig& c = config_;
    const int64_t H = c.n_head, R = c.mla_rank, N = c.mla_nope, P = c.n_rot, V = c.mla_v;
    const int64_t D = c.head_dim;  // P + R: the latent row every head attends over
    const int64_t QW = N + P;      // one head's query before absorption
    mla_q_.resize(size_t(T * H * QW));
    if (w.wq_a.data) {  // Q through its low rank and an RMSNorm
        mla_qa_.resize(size_t(T * c.mla_q_rank));
        matmul(mla_qa_.data(), xb_.data(), w.wq_a, T);
        cpu::rmsnorm(mla_qa_.data(), mla_qa_.data(), w.q_a_norm.data(), T, c.mla_q_rank,
                     c.norm_eps);
        matmul(mla_q_.data(), mla_qa_.data(), w.wq_b, T);
    } else {
        matmul(mla_q_.data(), xb_.data(), w.wq, T);
        add_lora(mla_q_.data(), xb_.data(), w.lora_q, T, lora_user_);
    }
    // K = V = [k_pe | RMSNorm(compressed KV)] per token.
    mla_kv_.resize(size_t(T * (R + P)));
    matmul(mla_kv_.data(), xb_.data(), w.wkv_a, T);
    for (int64_t t = 0; t < T; ++t) {
        const float* src = mla_kv_.data() + t * (R + P);
        float* k = k_.data() + t * D;
        std::copy(src + R, src + R + P, k);
        cpu::rmsnorm(k + P, src, w.kv_a_norm.data(), 1, R, c.norm_eps);
    }
    // Each head's query: [q_pe | wk_b q_nope], so q.k = q_pe.k_pe + q_nope.(W_UK c).
    mla_in_.resize(size_t(T * N));
    mla_res_.resize(size_t(T * std::max(R, V)));
    for (int64_t h = 0; h < H; ++h) {
        for (int64_t t = 0; t < T; ++t) {
            const float* qh = mla_q_.data() + (t * H + h) * QW;
            std::copy(qh, qh + N, mla_in_.data() + t * N);
            std::copy(qh + N, qh + QW, q_.data() + (t * H + h) * D);
        }
        mla_head_matmul(w, w.wk_b[size_t(h)], T);
        for (int64_t t = 0; t < T; ++t)
            std::copy(mla_res_.data() + t * R, mla_res_.data() + (t + 1) * R,
                      q_.data() + (t * H + h) * D + P);
    }
    if (c.uses_rope(l)) {
        cpu::rope(q_.data(), pos, T, H, D, rope_);
        cpu::rope(k_.data(), pos, T, 1, D, rope_);
    }
    // V is the same row (its latent part is what the heads read): K's rows serve as V's too.
    cpu::kv_write(kv, kb, k_.data(), k_.data());
    cpu::paged_attention(att_.data(), q_.data(), kv, kb, H, c.attn_scale, 0.0f, 0, nullptr);
    // Each head's latent output decompressed by its wv_b, then the output projection.
    mla_out_.resize(size_t(T * H * V));
    mla_in_.resize(size_t(T * R));
    for (int64_t h = 0; h < H; ++h) {
        for (int64_t t = 0; t < T; ++t) {
            const float* a = att_.data() + (t * H + h) * D + P;
            std::copy(a, a + R, mla_in_.data() + t * R);
        }
        mla_head_matmul(w, w.wv_b[size_t(h)], T);
        for (int64_t t = 0; t < T; ++t)
            std::copy(mla_res_.data() + t * V, mla_res_.data() + (t + 1) * V,
                      mla_out_.data() + (t * H + h) * V);
    }
    matmul(xb_.data(), mla_out_.data(), w.wo, T);
    add_lora(xb_.data(), mla_out_.data(), w.lora_o, T, lora_user_);
}

void CpuBackend::moe_ffn(const LayerWeights& w, int64_t T) {
    const ModelConfig& c = config_;
    const int64_t E = c.n_expert, K = c.n_expert_used, F = c.n_ff_exp, D = c.n_embd;
    router_.resize(size_t(T * E));
    matmul(router_.data(), xb_.data(), w.router, T);
    if (!w.router_b.empty()) cpu::add_bias(router_.data(), w.router_b.data(), T, E);
    // Each token's experts: the K largest softmax probabilities (ties: the lower id), weighted
    // by those probabilities over their sum (the same weights as gpt-oss's softmax over the
    // chosen logits); or (GLM 4.5) the K largest sigmoid(logit) + exp_probs_b, weighted by
    // their sigmoids, over their sum when moe_norm; times moe_scale. routed[e] lists (token,
    // weight).
    std::vector<std::vector<std::pair<int64_t, float>>> routed(static_cast<size_t>(E));
    std::vector<int64_t> order(static_cast<size_t>(E));
    std::vector<float> select(static_cast<size_t>(E));
    for (int64_t t = 0; t < T; ++t) {
        float* p = router_.data() + t * E;
        if (c.moe_sigmoid)
            for (int64_t e = 0; e < E; ++e) p[e] = 1.0f / (1.0f + std::exp(-p[e]));
        else
            cpu::softmax(p, E);
        for (int64_t e = 0; e < E; ++e)
            select[size_t(e)] = w.exp_probs_b.empty() ? p[e] : p[e] + w.exp_probs_b[size_t(e)];
        cpu::limit_expert_groups(select.data(), E, c.n_group, c.n_group_used);
        for (int64_t e = 0; e < E; ++e) order[size_t(e)] = e;
        std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int64_t a, int64_t b) {
            return select[size_t(a)] > select[size_t(b)] ||
                   (select[size_t(a)] == select[size_t(b)] && a < b);
        });
        double sum = 0;
        for (int64_t k = 0; k < K; ++k) sum += p[order[size_t(k)]];
        const double div = c.moe_norm && sum > 0 ? sum : 1.0;
        for (int64_t k = 0; k < K; ++k)
            routed[size_t(order[size_t(k)])].push_back(
                {t, float(p[order[size_t(k)]] / div * c.moe_scale)});
    }
    moe_out_.assign(size_t(T * D), 0.0f);
    for (int64_t e = 0; e < E; ++e) {
        const auto& rows = routed[size_t(e)];
        if (rows.empty()) continue;
        const int64_t n = int64_t(rows.size());
        moe_in_.resize(size_t(n * D));
        moe_gate_.resize(size_t(n * F));
        moe_up_.resize(size_t(n * F));
        moe_down_.resize(size_t(n * D));
        for (int64_t i = 0; i < n; ++i) {
            std::memcpy(moe_in_.data() + i * D, xb_.data() + rows[size_t(i)].first * D,
                        size_t(D) * sizeof(float));
            if (c.moe_weight_before)  // Llama 4: the weight scales the expert's input
                cpu::scale(moe_in_.data() + i * D, D, rows[size_t(i)].second);
        }
        matmul(moe_gate_.data(), moe_in_.data(), w.gate_exps[size_t(e)], n);
        matmul(moe_up_.data(), moe_in_.data(), w.up_exps[size_t(e)], n);
        const bool biased = !w.gate_exps_b.empty();
        if (biased) {
            cpu::add_bias(moe_gate_.data(), w.gate_exps_b.data() + e * F, n, F);
            cpu::add_bias(moe_up_.data(), w.up_exps_b.data() + e * F, n, F);
        }
        if (c.swiglu_oai)
            cpu::swiglu_oai(moe_gate_.data(), moe_gate_.data(), moe_up_.data(), n * F,
                            c.swiglu_alpha, c.swiglu_limit);
        else
            cpu::swiglu(moe_gate_.data(), moe_gate_.data(), moe_up_.data(), n * F);
        matmul(moe_down_.data(), moe_gate_.data(), w.down_exps[size_t(e)], n);
        if (biased) cpu::add_bias(moe_down_.data(), w.down_exps_b.data() + e * D, n, D);
        for (int64_t i = 0; i < n; ++i) {
            float* o = moe_out_.data() + rows[size_t(i)].first * D;
            const float* d = moe_down_.data() + i * D;
            const float wt = c.moe_weight_before ? 1.0f : rows[size_t(i)].second;
            for (int64_t j = 0; j < D; ++j) o[j] += wt * d[j];
        }
    }
    if (c.n_ff_shexp > 0) {  // the shared experts: every token, weight 1 (or Qwen2-MoE's gate)
        const int64_t Fs = c.n_ff_shexp;
        moe_gate_.resize(size_t(T * Fs));
        moe_up_.resize(size_t(T * Fs));
        moe_down_.resize(size_t(T * D));
        matmul(moe_gate_.data(), xb_.data(), w.gate_shexp, T);
        matmul(moe_up_.data(), xb_.data(), w.up_shexp, T);
        cpu::swiglu(moe_gate_.data(), moe_gate_.data(), moe_up_.data(), T * Fs);
        matmul(moe_down_.data(), moe_gate_.data(), w.down_shexp, T);
        if (w.gate_inp_shexp.data) {  // Qwen2-MoE: scaled by the shared expert's own gate
            moe_gate_.resize(size_t(T));
            matmul(moe_gate_.data(), xb_.data(), w.gate_inp_shexp, T);
            cpu::add_sigmoid_gated(moe_out_.data(), moe_down_.data(), moe_gate_.data(), T, D);
        } else {
            cpu::add(moe_out_.data(), moe_down_.data(), T * D);
        }
    }
    std::copy(moe_out_.begin(), moe_out_.end(), xb_.begin());
}

void CpuBackend::pre_norm(const std::vector<float>& norm, const std::vector<float>& bias,
                          int64_t T) {
    const ModelConfig& c = config_;
    if (norm.empty())  // olmo2: the block reads the residual stream as it is
        std::copy(x_.begin(), x_.begin() + T * c.n_embd, xb_.begin());
    else
        norm_rows(xb_.data(), x_.data(), norm, bias, T);
}

void CpuBackend::norm_rows(float* out, const float* x, const std::vector<float>& norm,
                           const std::vector<float>& bias, int64_t n_rows) {
    const ModelConfig& c = config_;
    if (c.layer_norm)
        cpu::layernorm(out, x, norm.data(), bias.empty() ? nullptr : bias.data(), n_rows, c.n_embd,
                       c.norm_eps);
    else
        cpu::rmsnorm(out, x, norm.data(), n_rows, c.n_embd, c.norm_eps);
}

void CpuBackend::add_block_output(const std::vector<float>& post_norm, int64_t T,
                                  const float* steer) {
    const ModelConfig& c = config_;
    if (!post_norm.empty())  // gemma2/3: the block's output normed before the residual add
        cpu::rmsnorm(xb_.data(), xb_.data(), post_norm.data(), T, c.n_embd, c.norm_eps);
    if (c.residual_scale != 1.0f) cpu::scale(xb_.data(), T * c.n_embd, c.residual_scale);
    // A control vector joins the block's output (the CUDA backend's order: its residual add
    // is fused with the next norm).
    if (steer) cpu::add_bias(xb_.data(), steer, T, c.n_embd);
    cpu::add(x_.data(), xb_.data(), T * c.n_embd);
}

void CpuBackend::add_lora(float* out, const float* x, const std::vector<LoraDelta>& deltas,
                          int64_t T, const std::vector<std::vector<float>>& user) {
    for (const LoraDelta& d : deltas) {
        const int64_t n = d.b.n_out;
        lora_tmp_.resize(size_t(T * d.a.n_out));
        lora_out_.resize(size_t(T * n));
        cpu::matmul(lora_tmp_.data(), x, d.a, T);
        cpu::matmul(lora_out_.data(), lora_tmp_.data(), d.b, T);
        cpu::add_scaled_rows(out, lora_out_.data(), user[size_t(d.adapter)].data(), T, n,
                             d.per_unit);
    }
}

void CpuBackend::copy_blocks(const std::vector<BlockCopy>& copies) {
    kv_copies_validate(copies, n_blocks_, n_stages_, window_.n_blocks);
    for (const BlockCopy& c : copies)
        for (int64_t l = 0; l < config_.n_layer; ++l) {
            const bool w = in_window_pool(l);
            cpu::kv_copy(kv_layer(l), w ? c.wsrc : c.src, w ? c.wdst : c.dst, c.src_stage,
                         c.dst_stage, c.n_rows);
        }
}

std::unique_ptr<Backend> make_cpu_backend(const GgufFile& file, const BackendOptions& options) {
    return std::make_unique<CpuBackend>(file, options);
}

}  // namespace kvrun
