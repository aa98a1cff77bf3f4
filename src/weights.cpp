// Finds and checks the weight tensors of the llama-family architectures of a GGUF file (see
// weights.h).
#include "weights.h"

#include <cmath>

#include "common.h"
#include "quant.h"

namespace kvrun {
namespace {

std::string shape_str(const std::vector<int64_t>& dims) {
    std::string s = "[";
    for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
    return s + "]";
}

// The tensor's dims with trailing 1s dropped (a [n, 1] tensor is 1-D).
std::vector<int64_t> squeezed_dims(const GgufTensorInfo& t) {
    std::vector<int64_t> d = t.dims;
    while (d.size() > 1 && d.back() == 1) d.pop_back();
    return d;
}

// Throws unless kvrun computes with t's type and rows of n_in elements are whole blocks.
void check_computable(const GgufFile& f, const GgufTensorInfo& t, int64_t n_in) {
    if (!ggml_type_known(static_cast<uint32_t>(t.type)) || !ggml_type_traits(t.type).can_dequantize)
        fail("{}: tensor '{}' has type {}, which kvrun cannot compute with yet", f.path(), t.name,
             ggml_type_known(static_cast<uint32_t>(t.type)) ? ggml_type_name(t.type) : "unknown");
    const int64_t block = ggml_type_traits(t.type).block_elems;
    if (block <= 0 || n_in % block != 0)
        fail("{}: tensor '{}' rows of {} elements are not a whole number of {} blocks ({})",
             f.path(), t.name, n_in, ggml_type_name(t.type), block);
}

// The tensor `name`, checked to exist with shape `expected` (its type: check_computable).
const GgufTensorInfo& find_checked(const GgufFile& f, const std::string& name,
                                   const std::vector<int64_t>& expected) {
    const GgufTensorInfo* t = f.find_tensor(name);
    if (!t)
        fail("{}: missing tensor '{}' (expected shape {})", f.path(), name, shape_str(expected));
    if (squeezed_dims(*t) != expected)
        fail("{}: tensor '{}' has shape {}, expected {} (ggml order: row length first)", f.path(),
             name, shape_str(t->dims), shape_str(expected));
    return *t;
}

}  // namespace

WeightView matrix_view(const GgufFile& f, const GgufTensorInfo& t, int64_t n_in, int64_t n_out) {
    check_computable(f, t, n_in);
    WeightView w;
    w.type = t.type;
    w.n_in = n_in;
    w.n_out = n_out;
    w.row_bytes = ggml_row_bytes(t.type, n_in);
    w.data = t.data;
    if (w.row_bytes * uint64_t(n_out) > t.n_bytes)
        fail("{}: tensor '{}' holds {} bytes, fewer than {} rows of {} bytes", f.path(), t.name,
             t.n_bytes, n_out, w.row_bytes);
    return w;
}

WeightView row_slice(const WeightView& w, int64_t r0, int64_t n) {
    WeightView s = w;
    s.n_out = n;
    s.data = static_cast<const uint8_t*>(w.data) + size_t(r0) * w.row_bytes;
    return s;
}

namespace {

// The factors in BASE.scale beside the matrix BASE.weight (`name`): one, or one per matrix
// of a stack of n_stack; empty without the tensor. (llama.cpp's per-tensor scales: a
// converted NVFP4 checkpoint's second-level scale, BitNet's weight scales.)
std::vector<float> load_scales(const GgufFile& f, const std::string& name, int64_t n_stack) {
    const std::string scale_name = name.substr(0, name.rfind(".weight")) + ".scale";
    const GgufTensorInfo* t = f.find_tensor(scale_name);
    if (!t) return {};
    if (t->n_elements != 1 && t->n_elements != n_stack)
        fail("{}: tensor '{}' has {} values; the scale of '{}' has 1{}", f.path(), scale_name,
             t->n_elements, name, n_stack > 1 ? fmt::format(" or {}", n_stack) : std::string());
    check_computable(f, *t, t->n_elements);
    std::vector<float> v(size_t(t->n_elements));
    dequantize_row(t->type, t->data, v.data(), t->n_elements);
    for (float x : v)
        if (!std::isfinite(x)) fail("{}: tensor '{}' holds {}", f.path(), scale_name, x);
    return v;
}

// A 2-D weight: GGUF dims {n_in, n_out}; with n_stack > 1, n_stack such matrices stacked in
// one 3-D tensor {n_in, n_out, n_stack} (experts), viewed as n_out * n_stack rows. Its
// BASE.scale, when there is one, is the view's scale; a stack's per-matrix scales go to
// *stack_scales (which a stack with such scales needs).
WeightView load_matrix(const GgufFile& f, const std::string& name, int64_t n_in, int64_t n_out,
                       uint64_t& total_bytes, int64_t n_stack = 1,
                       std::vector<float>* stack_scales = nullptr) {
    // (One row, [n_in, 1], is 1-D once squeezed.)
    const std::vector<int64_t> dims = n_stack > 1  ? std::vector<int64_t>{n_in, n_out, n_stack}
                                      : n_out == 1 ? std::vector<int64_t>{n_in}
                                                   : std::vector<int64_t>{n_in, n_out};
    const GgufTensorInfo& t = find_checked(f, name, dims);
    WeightView w = matrix_view(f, t, n_in, n_out * n_stack);
    total_bytes += w.row_bytes * uint64_t(w.n_out);
    const std::vector<float> scales = load_scales(f, name, n_stack);
    if (scales.size() == 1) {
        w.scale = scales[0];
    } else if (!scales.empty()) {
        if (!stack_scales) fail("{}: per-matrix scales of '{}' are not supported", f.path(), name);
        *stack_scales = scales;
    }
    return w;
}

// A 1-D norm weight or bias of n elements (or, n_stack > 1, n_stack of them in a 2-D tensor:
// the experts' biases), converted to float32.
std::vector<float> load_vector(const GgufFile& f, const std::string& name, int64_t n,
                               int64_t n_stack = 1) {
    const GgufTensorInfo& t =
        find_checked(f, name, n_stack > 1 ? std::vector<int64_t>{n, n_stack} : std::vector{n});
    check_computable(f, t, n);
    std::vector<float> out(size_t(n * n_stack));
    const size_t row = ggml_row_bytes(t.type, n);
    for (int64_t i = 0; i < n_stack; ++i)
        dequantize_row(t.type, static_cast<const uint8_t*>(t.data) + size_t(i) * row,
                       out.data() + i * n, n);
    return out;
}

// DeepSeek's latent attention tensors (see LayerWeights::wk_b). The per-head wk_b / wv_b come
// from attn_k_b ({mla_nope, mla_rank, n_head}) and attn_v_b ({mla_rank, mla_v, n_head}), or,
// in files converted before those existed, from attn_kv_b ({mla_rank, n_head * (mla_nope +
// mla_v)}: each head's K rows, then its V rows): its V rows are viewed in place, its K rows
// transposed into F32 copies that `w` owns.
void load_mla(const GgufFile& f, const ModelConfig& c, int64_t i, ModelWeights& w,
              LayerWeights& l) {
    auto name = [i](const char* what) { return fmt::format("blk.{}.{}", i, what); };
    uint64_t& bytes = w.matrix_bytes;
    const int64_t H = c.n_head, R = c.mla_rank, N = c.mla_nope, V = c.mla_v;
    const int64_t q_width = H * (N + c.n_rot);
    if (c.mla_q_rank > 0) {
        l.wq_a = load_matrix(f, name("attn_q_a.weight"), c.n_embd, c.mla_q_rank, bytes);
        l.q_a_norm = load_vector(f, name("attn_q_a_norm.weight"), c.mla_q_rank);
        l.wq_b = load_matrix(f, name("attn_q_b.weight"), c.mla_q_rank, q_width, bytes);
    } else {
        l.wq = load_matrix(f, name("attn_q.weight"), c.n_embd, q_width, bytes);
    }
    l.wkv_a = load_matrix(f, name("attn_kv_a_mqa.weight"), c.n_embd, R + c.n_rot, bytes);
    l.kv_a_norm = load_vector(f, name("attn_kv_a_norm.weight"), R);
    if (!f.find_tensor(name("attn_k_b.weight")) && f.find_tensor(name("attn_kv_b.weight"))) {
        const WeightView kv = load_matrix(f, name("attn_kv_b.weight"), R, H * (N + V), bytes);
        auto t = std::make_shared<std::vector<float>>(size_t(H * R * N));
        std::vector<float> row(static_cast<size_t>(R));
        for (int64_t h = 0; h < H; ++h) {
            for (int64_t n = 0; n < N; ++n) {  // K row n of head h -> column n of its wk_b
                dequantize_row(
                    kv.type,
                    static_cast<const uint8_t*>(kv.data) + size_t(h * (N + V) + n) * kv.row_bytes,
                    row.data(), R);
                for (int64_t r = 0; r < R; ++r) (*t)[size_t((h * R + r) * N + n)] = row[size_t(r)];
            }
            l.wv_b.push_back(row_slice(kv, h * (N + V) + N, V));
        }
        for (int64_t h = 0; h < H; ++h) {
            WeightView k;
            k.type = GgmlType::F32;
            k.n_in = N;
            k.n_out = R;
            k.row_bytes = size_t(N) * sizeof(float);
            k.data = t->data() + h * R * N;
            l.wk_b.push_back(k);
        }
        w.owned.push_back(std::move(t));
        l.kv_b_fused = true;
        return;
    }
    const WeightView kb = load_matrix(f, name("attn_k_b.weight"), N, R, bytes, H);
    const WeightView vb = load_matrix(f, name("attn_v_b.weight"), R, V, bytes, H);
    for (int64_t h = 0; h < H; ++h) {
        l.wk_b.push_back(row_slice(kb, h * R, R));
        l.wv_b.push_back(row_slice(vb, h * V, V));
    }
}

}  // namespace

ModelWeights weights_load(const GgufFile& f, const ModelConfig& c) {
    ModelWeights w;
    // BitNet's output is always the embedding's, as in llama.cpp. llama.cpp scales neither the
    // embedding lookup nor a tied output.
    const bool tied = !f.find_tensor("output.weight") || c.sub_norms;
    if (f.find_tensor("token_embd.scale"))
        fail("{}: tensor 'token_embd.scale' is not supported (a scaled token embedding)",
             f.path());
    if (tied && f.find_tensor("output.scale"))
        fail("{}: tensor 'output.scale' is not supported (a scaled output tied to the embedding)",
             f.path());
    w.token_embd = load_matrix(f, "token_embd.weight", c.n_embd, c.n_vocab, w.matrix_bytes);
    w.output_norm = load_vector(f, "output_norm.weight", c.n_embd);
    // A LayerNorm's bias beside its weight, when the file has one (Phi-2 and StarCoder2 have).
    auto norm_bias = [&](const std::string& weight_name) {
        const std::string b = weight_name.substr(0, weight_name.rfind(".weight")) + ".bias";
        return c.layer_norm && f.find_tensor(b) ? load_vector(f, b, c.n_embd)
                                                : std::vector<float>();
    };
    w.output_norm_b = norm_bias("output_norm.weight");
    if (!tied) {
        w.output = load_matrix(f, "output.weight", c.n_embd, c.n_vocab, w.matrix_bytes);
    } else {
        w.output = w.token_embd;
        w.output_tied = true;
    }
    if (f.find_tensor("output.bias")) w.output_b = load_vector(f, "output.bias", c.n_vocab);
    w.layers.resize(c.n_layer);
    for (int64_t i = 0; i < c.n_layer; ++i) {
        LayerWeights& l = w.layers[i];
        auto name = [i](const char* what) { return fmt::format("blk.{}.{}", i, what); };
        uint64_t& bytes = w.matrix_bytes;
        if (c.pre_norms) l.attn_norm = load_vector(f, name("attn_norm.weight"), c.n_embd);
        l.attn_norm_b = norm_bias(name("attn_norm.weight"));
        if (c.layer_norm && f.find_tensor(name("attn_q_norm.weight")))
            fail("{}: tensor '{}' (Command R+'s per-head LayerNorms of Q and K) is not supported",
                 f.path(), name("attn_q_norm.weight"));
        if (c.mla()) {
            load_mla(f, c, i, w, l);
        } else if (f.find_tensor(
                       name("attn_qkv.weight"))) {  // Q, K and V rows in one tensor (phi3)
            const WeightView qkv = load_matrix(f, name("attn_qkv.weight"), c.n_embd,
                                               c.q_dim() + 2 * c.kv_dim(), bytes);
            l.wq = row_slice(qkv, 0, c.q_dim());
            l.wk = row_slice(qkv, c.q_dim(), c.kv_dim());
            l.wv = row_slice(qkv, c.q_dim() + c.kv_dim(), c.kv_dim());
            if (f.find_tensor(name("attn_qkv.bias"))) {  // (GLM-4 conversions that fuse them)
                const std::vector<float> b =
                    load_vector(f, name("attn_qkv.bias"), c.q_dim() + 2 * c.kv_dim());
                const auto q_end = b.begin() + c.q_dim(), k_end = q_end + c.kv_dim();
                l.bq.assign(b.begin(), q_end);
                l.bk.assign(q_end, k_end);
                l.bv.assign(k_end, b.end());
            }
        } else {
            l.wq = load_matrix(f, name("attn_q.weight"), c.n_embd, c.q_dim(), bytes);
            l.wk = load_matrix(f, name("attn_k.weight"), c.n_embd, c.kv_dim(), bytes);
            l.wv = load_matrix(f, name("attn_v.weight"), c.n_embd, c.kv_dim(), bytes);
        }
        l.wo = load_matrix(f, name("attn_output.weight"), c.mla() ? c.n_head * c.mla_v : c.q_dim(),
                           c.n_embd, bytes);
        // Biases: required by qwen2, optional for llama (a few llama conversions have them).
        const bool has_bias = f.find_tensor(name("attn_q.bias")) != nullptr;
        if ((c.qkv_bias || has_bias) && l.bq.empty()) {
            l.bq = load_vector(f, name("attn_q.bias"), c.q_dim());
            l.bk = load_vector(f, name("attn_k.bias"), c.kv_dim());
            l.bv = load_vector(f, name("attn_v.bias"), c.kv_dim());
        }
        // Per-head Q/K norms: required by qwen3; any other architecture that has them gets them
        // applied rather than silently ignored.
        if (c.qk_norm_full) {  // olmo2, olmoe: over all heads at once
            l.q_norm = load_vector(f, name("attn_q_norm.weight"), c.q_dim());
            l.k_norm = load_vector(f, name("attn_k_norm.weight"), c.kv_dim());
        } else if (c.qk_norm || f.find_tensor(name("attn_q_norm.weight"))) {
            l.q_norm = load_vector(f, name("attn_q_norm.weight"), c.head_dim);
            l.k_norm = load_vector(f, name("attn_k_norm.weight"), c.head_dim);
        }
        if (c.qk_l2_norm && c.uses_rope(i))  // Llama 4: weightless, on the rotating layers
            l.q_norm = l.k_norm = std::vector<float>(static_cast<size_t>(c.head_dim), 1.0f);
        if (c.attn_sinks || f.find_tensor(name("attn_output.bias")))
            l.bo = load_vector(f, name("attn_output.bias"), c.n_embd);
        if (c.attn_sinks) l.sinks = load_vector(f, name("attn_sinks.weight"), c.n_head);
        // gpt-oss and GLM 4.5 name the FFN's input norm post_attention_norm (Gemma's is
        // another norm).
        if (c.pre_norms && !c.parallel_blocks)  // (parallel blocks: the attention's norm)
            l.ffn_norm = load_vector(
                f,
                name(c.ffn_norm_post_attention ? "post_attention_norm.weight" : "ffn_norm.weight"),
                c.n_embd);
        if (!c.parallel_blocks) l.ffn_norm_b = norm_bias(name("ffn_norm.weight"));
        if (c.post_norms) {
            l.attn_post_norm = load_vector(f, name("post_attention_norm.weight"), c.n_embd);
            l.ffn_post_norm = load_vector(f, name("post_ffw_norm.weight"), c.n_embd);
        }
        if (c.sub_norms) {
            l.attn_sub_norm = load_vector(f, name("attn_sub_norm.weight"), c.q_dim());
            l.ffn_sub_norm = load_vector(f, name("ffn_sub_norm.weight"), c.n_ff);
        }
        if (c.moe_layer(i)) {  // experts stacked in 3-D tensors: expert e is a contiguous slice
            l.router = load_matrix(f, name("ffn_gate_inp.weight"), c.n_embd, c.n_expert, bytes);
            auto experts = [&](const char* what, int64_t n_in, int64_t n_out) {
                std::vector<float> scales;
                const WeightView all =
                    load_matrix(f, name(what), n_in, n_out, bytes, c.n_expert, &scales);
                std::vector<WeightView> v;
                for (int64_t e = 0; e < c.n_expert; ++e) {
                    v.push_back(row_slice(all, e * n_out, n_out));
                    if (!scales.empty()) v.back().scale = scales[size_t(e)];
                }
                return v;
            };
            l.gate_exps = experts("ffn_gate_exps.weight", c.n_embd, c.n_ff_exp);
            l.up_exps = experts("ffn_up_exps.weight", c.n_embd, c.n_ff_exp);
            l.down_exps = experts("ffn_down_exps.weight", c.n_ff_exp, c.n_embd);
            if (c.swiglu_oai || f.find_tensor(name("ffn_gate_inp.bias"))) {  // gpt-oss
                l.router_b = load_vector(f, name("ffn_gate_inp.bias"), c.n_expert);
                l.gate_exps_b = load_vector(f, name("ffn_gate_exps.bias"), c.n_ff_exp, c.n_expert);
                l.up_exps_b = load_vector(f, name("ffn_up_exps.bias"), c.n_ff_exp, c.n_expert);
                l.down_exps_b = load_vector(f, name("ffn_down_exps.bias"), c.n_embd, c.n_expert);
            }
            // (GLM's selection bias is required, as in llama.cpp; ERNIE's is there when it is.)
            if (c.moe_select_bias || f.find_tensor(name("exp_probs_b.bias")))
                l.exp_probs_b = load_vector(f, name("exp_probs_b.bias"), c.n_expert);
            if (c.n_ff_shexp > 0) {
                const int64_t fs = c.n_ff_shexp;
                l.gate_shexp = load_matrix(f, name("ffn_gate_shexp.weight"), c.n_embd, fs, bytes);
                l.up_shexp = load_matrix(f, name("ffn_up_shexp.weight"), c.n_embd, fs, bytes);
                l.down_shexp = load_matrix(f, name("ffn_down_shexp.weight"), fs, c.n_embd, bytes);
                if (c.shexp_gate)
                    l.gate_inp_shexp =
                        load_matrix(f, name("ffn_gate_inp_shexp.weight"), c.n_embd, 1, bytes);
            }
            continue;
        }
        if (c.fused_gate_up) {  // phi3: ffn_up holds the gate's rows, then up's
            const WeightView both =
                load_matrix(f, name("ffn_up.weight"), c.n_embd, 2 * c.n_ff, bytes);
            l.w_gate = row_slice(both, 0, c.n_ff);
            l.w_up = row_slice(both, c.n_ff, c.n_ff);
        } else {
            if (!c.ffn_plain)
                l.w_gate = load_matrix(f, name("ffn_gate.weight"), c.n_embd, c.n_ff, bytes);
            l.w_up = load_matrix(f, name("ffn_up.weight"), c.n_embd, c.n_ff, bytes);
        }
        l.w_down = load_matrix(f, name("ffn_down.weight"), c.n_ff, c.n_embd, bytes);
        if (c.ffn_plain && f.find_tensor(name("ffn_up.bias")))
            l.b_up = load_vector(f, name("ffn_up.bias"), c.n_ff);
        if (c.ffn_plain && f.find_tensor(name("ffn_down.bias")))
            l.b_down = load_vector(f, name("ffn_down.bias"), c.n_embd);
    }
    return w;
}

}  // namespace kvrun
