// The CPU backend's operations: plain, readable float32 reference implementations.
// Every CUDA op in src/cuda/ops.h has a twin here with the same shape contract, and a
// test (tests/test_cuda_*.cpp) compares the two on random inputs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gguf.h"
#include "rope.h"

namespace kvrun {

// A 2-D weight matrix as stored in GGUF: n_out rows of n_in elements of `type`,
// row r starting at data + r * row_bytes. (GGUF dims = {n_in, n_out}.) The matrix is
// `scale` times those rows: the per-tensor factor a converted NVFP4 checkpoint (and BitNet)
// keeps beside the weight as NAME.scale; 1 otherwise.
struct WeightView {
    GgmlType type = GgmlType::F32;
    int64_t n_in = 0;
    int64_t n_out = 0;
    size_t row_bytes = 0;
    const void* data = nullptr;
    float scale = 1.0f;
};

// Storage type of one KV pool (K and V may differ); formats in kv_format.h.
enum class KvType : uint8_t { F32, F16, Q8, Q4 };

// One layer's paged K and V pools, each shaped [n_blocks][n_kv_head] of head blocks
// (block_size rows of head_dim values in the pool's format, kv_format.h), so one head of
// one block is contiguous. Block tables map a sequence's slot j to physical block
// block_table[seq * max_blocks_per_seq + j / block_size], row j % block_size.
// Staging (n_stages > 0, for quantized pools): k_stage / v_stage hold f16 rows
// [n_stages][n_kv_head][block_size][head_dim] of the blocks being filled (kv_block_table.h).
struct KvLayerView {
    KvType k_type = KvType::F16;
    KvType v_type = KvType::F16;
    void* k = nullptr;
    void* v = nullptr;
    int64_t n_blocks = 0;
    int64_t n_kv_head = 0;
    int64_t block_size = 0;
    int64_t head_dim = 0;
    void* k_stage = nullptr;  // f16, or null without staging
    void* v_stage = nullptr;
    int64_t n_stages = 0;
    // V reads K's rows (kv_v_shares_k: DeepSeek's latent rows): v, v_type and v_stage are K's,
    // V is decoded in K's layout, and kv_write stores K alone.
    bool v_is_k = false;
};

// Which cache slots a batch of tokens touches: token t belongs to sequence token_seq[t]
// and lives at cache slot token_slot[t]; it attends to slots 0..token_slot[t] of its
// sequence (causal). block_table: [n_seqs][max_blocks_per_seq] physical block ids.
// token_stage (staging only): stage slot of the block holding token t's slot.
struct KvBatchView {
    const int32_t* token_seq = nullptr;    // [n_tokens]
    const int32_t* token_slot = nullptr;   // [n_tokens]
    const int32_t* block_table = nullptr;  // [n_seqs][max_blocks_per_seq]
    int64_t max_blocks_per_seq = 0;
    int64_t n_tokens = 0;
    const int32_t* token_stage = nullptr;  // [n_tokens], or null without staging
};

namespace cpu {

// out[r][i] = x[r][i] / sqrt(mean(x[r]^2) + eps) * w[i];  x,out: [n_rows][dim], w: [dim]
void rmsnorm(float* out, const float* x, const float* w, int64_t n_rows, int64_t dim, float eps);

// LayerNorm: out[r][i] = (x[r][i] - m) / sqrt(v + eps) * w[i] + b[i], m and v the mean and
// variance of row r (sums in double; b may be null: no bias); out may equal x.
void layernorm(float* out, const float* x, const float* w, const float* b, int64_t n_rows,
               int64_t dim, float eps);

// out[r][o] = sum_i x[r][i] * W[o][i];  x: [n_rows][n_in], out: [n_rows][n_out]
// (cpu_matmul.cpp). Each sum has one fixed float order (products added into lane i % 8 of
// eight accumulators, the lanes combined pairwise), whatever n_rows, threads or CPU; then
// times w.scale when it is not 1.
void matmul(float* out, const float* x, const WeightView& w, int64_t n_rows);

// Adds bias[n] to every row of x: [n_rows][n]
void add_bias(float* x, const float* bias, int64_t n_rows, int64_t n);

// Rotary embedding in place on x: [n_tokens][n_heads][head_dim], rotating the first p.n_rot
// dims of each head by rope_angle (rope.h: frequency factors, linear and YaRN scaling).
// neox=false: pairs (2i, 2i+1) (llama); neox=true: pairs (i, i + n_rot/2) (qwen2, neox).
void rope(float* x, const int32_t* pos, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
          const RopeParams& p);

// out[i] = silu(gate[i]) * up[i], n elements. (With llama.cpp emulation on, pass one row
// per call: ggml vectorizes SiLU per row.)
void swiglu(float* out, const float* gate, const float* up, int64_t n);

// OpenAI's clamped SwiGLU (gpt-oss's experts): x = min(gate, limit), y = clamp(up, -limit,
// limit), out = x * sigmoid(alpha * x) * (y + 1), n elements.
void swiglu_oai(float* out, const float* gate, const float* up, int64_t n, float alpha,
                float limit);

// out[i] = gelu(gate[i]) * up[i] with GELU's tanh approximation
// 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))), n elements (Gemma's FFN).
void geglu(float* out, const float* gate, const float* up, int64_t n);

// out[i] = gelu(x[i]), geglu's GELU (out may equal x; phi2's and StarCoder2's FFN).
void gelu(float* out, const float* x, int64_t n);

// x[i] = cap * tanh(x[i] / cap), n elements (Gemma 2's logit soft cap); cap > 0.
void softcap(float* x, int64_t n, float cap);

// x[i] *= s, n elements.
void scale(float* x, int64_t n, float s);
// out[t][j] += lora_row_scale(user[t], per_unit) * y[t][j] for [n_rows][n] (a LoRA update
// added with each row's own scale; the product is rounded before the sum).
void add_scaled_rows(float* out, const float* y, const float* user, int64_t n_rows, int64_t n,
                     double per_unit);

// x[i] += y[i], n elements.
void add(float* x, const float* y, int64_t n);

// x[t][j] += sigmoid(g[t]) * y[t][j] for [n_rows][n] (g: [n_rows] gate logits; Qwen2-MoE's
// gated shared expert). The gate is computed in float, then multiplied and added.
void add_sigmoid_gated(float* x, const float* y, const float* g, int64_t n_rows, int64_t n);

// Expert groups (DeepSeek V3's router): select[n_expert] holds one token's selection scores;
// the experts are n_group consecutive groups, each scored by the sum of its two best scores
// (its only one when a group has one expert), and all but the n_used best groups (ties: the
// lower group) get -infinity, so the top experts are chosen from those groups alone.
void limit_expert_groups(float* select, int64_t n_expert, int64_t n_group, int64_t n_used);

// out[t][:] = dequantized row tokens[t] of the embedding table; out: [n_tokens][n_embd]
void embed(float* out, const WeightView& table, const int32_t* tokens, int64_t n_tokens);

// Numerically stable softmax in place over x[n].
void softmax(float* x, int64_t n);
// The softmax of x[n] and one more logit `sink` that takes its share of the mass and is then
// dropped (gpt-oss's attention sinks): x[i] = exp(x[i]) / (sum exp(x) + exp(sink)).
void softmax_with_sink(float* x, int64_t n, float sink);

// Stores k, v: [n_tokens][n_kv_head][head_dim] at each token's slot. Without staging: into
// the pools (f32/f16). With staging: into the token's stage (f16); then every block whose
// last row a token wrote is sealed: its stage rows are encoded into the pool block
// (kv_encode_head_block: K per channel, V per token).
void kv_write(const KvLayerView& kv, const KvBatchView& batch, const float* k, const float* v);

// Paged causal attention. q: [n_tokens][n_head][head_dim] (RoPE applied),
// out: [n_tokens][n_head][head_dim]. Query head h reads KV head h / (n_head / n_kv_head).
// scores = q.k * scale, softmax over slots 0..token_slot[t], out = sum p * v. With staging,
// the token's own block is read from its stage (exact f16) and earlier blocks from the pool.
void paged_attention(float* out, const float* q, const KvLayerView& kv, const KvBatchView& batch,
                     int64_t n_head, float scale);
// The same with Gemma's options: scores soft-capped, cap * tanh(score / cap), when
// softcap > 0; a token at slot s sees slots s - window + 1 .. s only when window > 0 (its
// chunk, floor(s / -window) * -window .. s, when window < 0: attn_window.h); and
// gpt-oss's: with sinks ([n_head] logits, or null), head h's softmax is softmax_with_sink's
// with sinks[h].
void paged_attention(float* out, const float* q, const KvLayerView& kv, const KvBatchView& batch,
                     int64_t n_head, float scale, float softcap, int64_t window,
                     const float* sinks = nullptr);

// One queued block copy (kv_block_table.h BlockCopy) on one layer: src_stage and dst_stage
// both -1: pool block src -> pool block dst (whole block); dst_stage >= 0: rows
// [0, n_rows) into stage dst_stage, from stage src_stage, or decoded from pool block src
// when src_stage is -1.
void kv_copy(const KvLayerView& kv, int64_t src, int64_t dst, int64_t src_stage, int64_t dst_stage,
             int64_t n_rows);

// Validation aid (off by default; per calling thread): when on, the ops reproduce the float
// arithmetic of the reference llama.cpp build (x86-64 AVX2 + FMA; activation rounding per
// weight type, its integer block dot products and accumulation order, RMSNorm, RoPE, SiLU and
// f16-cache attention as ggml computes them; cpu_llamacpp.h), so logits equal the shared
// references bit for bit (docs/llamacpp-fidelity.md). Results then depend on the batch size,
// as llama.cpp's do.
void set_llamacpp_rounding(bool on);
bool llamacpp_rounding();

}  // namespace cpu
}  // namespace kvrun
