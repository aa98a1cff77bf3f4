// CPU reference implementations of the ops declared in cpu_ops.h (matmul lives in
// cpu_matmul.cpp): float32 activations, K/V stored as f32, f16, or quantized (q8/q4,
// kv_format.h) with f16 stage slots for the blocks being filled. Attention decodes each
// K/V block once for all the query heads that read it (GQA).
//
// Every op computes each output row from its own inputs only, in a fixed order, so results
// are bit-identical whatever the batch composition and thread count (a sequence decoded
// alone or batched with others gives the same logits; speculative verification of K tokens
// matches K single steps exactly), and for f16/f32 caches whatever the KV block size.
//
// The llama.cpp emulation (set_llamacpp_rounding, the `llamacpp` section below) is the
// exception: it reproduces llama.cpp's arithmetic, which depends on the batch size as
// llama.cpp's does (a batch of >= 2 tokens takes other kernels than a single token).
#include "cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "attn_window.h"
#include "common.h"
#include "cpu_llamacpp.h"
#include "kv_format.h"
#include "quant.h"
#include "simd.h"
#include "thread_pool.h"
#include "weights.h"

namespace kvrun::cpu {
namespace {

// dot(a[n], b[n]) with eight independent float accumulators (vectorizable without
// -ffast-math), combined in a fixed order.
KVRUN_SIMD_CLONES float dot_f32(const float* a, const float* b, int64_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
    for (; i < n; ++i) acc[i & 7] += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// y[n] += p * x[n]
KVRUN_SIMD_CLONES void axpy_f32(float* y, float p, const float* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] += p * x[i];
}

// out[r] = dot_f32(q, rows[r]) * scale for n rows [n][hd]: the same bits, four rows at a
// time so the four accumulator chains overlap and q is loaded once for them.
KVRUN_SIMD_CLONES void dot_rows(float* out, const float* q, const float* rows, int64_t n,
                                int64_t hd, float scale) {
    int64_t r = 0;
    if (hd % 8 == 0)
        for (; r + 4 <= n; r += 4) {
            const float* k = rows + r * hd;
            f32x8 acc[4] = {};
            for (int64_t i = 0; i < hd; i += 8) {
                const f32x8 qv = load8(q + i);
                for (int j = 0; j < 4; ++j) acc[j] += qv * load8(k + j * hd + i);
            }
            for (int j = 0; j < 4; ++j) out[r + j] = sum_lanes(acc[j]) * scale;
        }
    for (; r < n; ++r) out[r] = dot_f32(q, rows + r * hd, hd) * scale;
}

// y[hd] += p[r] * rows[r] for r = 0..n-1 in turn: axpy_f32's bits, with a 32-float slice
// of y held in registers across the rows instead of loaded and stored once per row.
KVRUN_SIMD_CLONES void axpy_rows(float* y, const float* p, const float* rows, int64_t n,
                                 int64_t hd) {
    int64_t i = 0;
    for (; i + 32 <= hd; i += 32) {
        f32x8 acc[4];
        for (int j = 0; j < 4; ++j) acc[j] = load8(y + i + 8 * j);
        for (int64_t r = 0; r < n; ++r) {
            for (int j = 0; j < 4; ++j) acc[j] += p[r] * load8(rows + r * hd + i + 8 * j);
        }
        for (int j = 0; j < 4; ++j) store8(y + i + 8 * j, acc[j]);
    }
    if (i < hd)
        for (int64_t r = 0; r < n; ++r) axpy_f32(y + i, p[r], rows + r * hd + i, hd - i);
}

thread_local bool t_llamacpp_rounding = false;

float round_to_f16(float x) {
    return fp16_to_fp32(fp32_to_fp16(x));
}

// One layer's K or V pool: [n_blocks][n_kv_head] head blocks of `type` (kv_format.h), the
// head block size computed once per op rather than per row.
struct KvPool {
    uint8_t* base;
    KvType type;
    KvRole role;
    int64_t head_block_bytes, n_kv_head;
    uint8_t* at(int64_t block, int64_t head) const {
        return base + (block * n_kv_head + head) * head_block_bytes;
    }
};

KvPool kv_pool(const KvLayerView& kv, KvRole role) {
    if (kv.v_is_k) role = KvRole::K;
    const KvType t = role == KvRole::K ? kv.k_type : kv.v_type;
    return {static_cast<uint8_t*>(role == KvRole::K ? kv.k : kv.v), t, role,
            kv_head_block_bytes(t, role, kv.block_size, kv.head_dim), kv.n_kv_head};
}

// Row (stage, head, row) of a stage pool: f16 [n_stages][n_kv_head][block_size][head_dim].
uint8_t* kv_stage_row(void* stage, const KvLayerView& kv, int64_t slot, int64_t head, int64_t row) {
    const int64_t index = ((slot * kv.n_kv_head + head) * kv.block_size + row) * kv.head_dim;
    return static_cast<uint8_t*>(stage) + index * 2;
}

// Physical block holding `slot` of token t's sequence; throws for an out-of-range id.
int64_t kv_block_of(const KvLayerView& kv, const KvBatchView& batch, int64_t t, int64_t slot) {
    int64_t seq = batch.token_seq[t];
    int64_t j = slot / kv.block_size;
    if (seq < 0 || j >= batch.max_blocks_per_seq)
        fail("KV batch: token {} (sequence {}, slot {}) lies outside its block table", t, seq,
             slot);
    int64_t block = batch.block_table[seq * batch.max_blocks_per_seq + j];
    if (block < 0 || block >= kv.n_blocks)
        fail("KV batch: token {} uses block id {}, outside the pool of {} blocks", t, block,
             kv.n_blocks);
    return block;
}

// Stage slot of token t's block (staging views only); throws when missing or out of range.
int64_t kv_stage_of(const KvLayerView& kv, const KvBatchView& batch, int64_t t) {
    if (!batch.token_stage) fail("KV batch: a staged (quantized) cache needs token stage slots");
    const int64_t st = batch.token_stage[t];
    if (st < 0 || st >= kv.n_stages)
        fail("KV batch: token {} uses stage slot {}, outside the {} stage slots", t, st,
             kv.n_stages);
    return st;
}

void check_kv_view(const KvLayerView& kv) {
    if (kv.n_blocks <= 0 || kv.n_kv_head <= 0 || kv.block_size <= 0 || kv.head_dim <= 0 || !kv.k ||
        !kv.v)
        fail("KV layer view is empty or has non-positive dimensions");
    kv_check_format(kv.k_type, kv.head_dim);
    kv_check_format(kv.v_type, kv.head_dim);
    const bool quantized = kv_type_quantized(kv.k_type) || kv_type_quantized(kv.v_type);
    if (quantized && (kv.n_stages <= 0 || !kv.k_stage || !kv.v_stage))
        fail("KV layer view: a quantized cache needs f16 stage slots");
}

}  // namespace

void rmsnorm(float* out, const float* x, const float* w, int64_t n_rows, int64_t dim, float eps) {
    if (t_llamacpp_rounding) {  // ggml_compute_forward_rms_norm_f32, then ggml_mul by w
        for (int64_t r = 0; r < n_rows; ++r) {
            const float* xr = x + r * dim;
            double sum = 0;
            for (int64_t i = 0; i < dim; ++i) sum += double(xr[i] * xr[i]);
            const float mean = float(sum / double(dim));
            const float scale = 1.0f / std::sqrt(mean + eps);
            float* o = out + r * dim;
            for (int64_t i = 0; i < dim; ++i) o[i] = xr[i] * scale * w[i];
        }
        return;
    }
    for (int64_t r = 0; r < n_rows; ++r) {
        const float* xr = x + r * dim;
        double sum = 0;
        for (int64_t i = 0; i < dim; ++i) sum += double(xr[i]) * xr[i];
        float scale = float(1.0 / std::sqrt(sum / double(dim) + double(eps)));
        float* o = out + r * dim;
        for (int64_t i = 0; i < dim; ++i) o[i] = xr[i] * scale * w[i];
    }
}

void layernorm(float* out, const float* x, const float* w, const float* b, int64_t n_rows,
               int64_t dim, float eps) {
    // (ggml_norm's order: the mean and the centred sum of squares in double, the scale in
    // float; then ggml_mul by w and ggml_add of b.)
    for (int64_t r = 0; r < n_rows; ++r) {
        const float* xr = x + r * dim;
        double sum = 0;
        for (int64_t i = 0; i < dim; ++i) sum += double(xr[i]);
        const float mean = float(sum / double(dim));
        double sq = 0;
        for (int64_t i = 0; i < dim; ++i) {
            const float v = xr[i] - mean;
            sq += double(v * v);
        }
        const float scale = 1.0f / std::sqrt(float(sq / double(dim)) + eps);
        float* o = out + r * dim;
        for (int64_t i = 0; i < dim; ++i) {
            const float v = (xr[i] - mean) * scale * w[i];
            o[i] = b ? v + b[i] : v;
        }
    }
}

void add_bias(float* x, const float* bias, int64_t n_rows, int64_t n) {
    for (int64_t r = 0; r < n_rows; ++r)
        for (int64_t i = 0; i < n; ++i) x[r * n + i] += bias[i];
}

void rope(float* x, const int32_t* pos, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
          const RopeParams& p) {
    const int64_t n_rot = p.n_rot;
    if (n_rot <= 0 || n_rot > head_dim || n_rot % 2 != 0)
        fail("rope: rotated dims {} must be even and within head_dim {}", n_rot, head_dim);
    const int64_t half = n_rot / 2;
    const bool neox = p.neox;
    std::vector<float> cos_t(half), sin_t(half);  // [n_rot / 2] for one position
    for (int64_t t = 0; t < n_tokens; ++t) {
        if (t_llamacpp_rounding) {  // ggml_compute_forward_rope_f32: float angles, theta *= scale
            const float theta_scale = std::pow(p.freq_base, -2.0f / float(n_rot));
            float theta = float(pos[t]);
            for (int64_t i = 0; i < half; ++i) {
                const float extrap = p.freq_factors ? theta / p.freq_factors[i] : theta;
                float angle = p.freq_scale * extrap, mscale = p.mscale;
                if (p.ext_factor != 0.0f) {
                    const float mix = rope_yarn_ramp(p.corr_low, p.corr_high, i) * p.ext_factor;
                    angle = angle * (1 - mix) + extrap * mix;
                }
                cos_t[i] = std::cos(angle) * mscale;
                sin_t[i] = std::sin(angle) * mscale;
                theta *= theta_scale;
            }
        } else {
            for (int64_t i = 0; i < half; ++i) {
                const double theta = rope_angle(p, pos[t], i);
                cos_t[i] = float(std::cos(theta) * double(p.mscale));
                sin_t[i] = float(std::sin(theta) * double(p.mscale));
            }
        }
        for (int64_t h = 0; h < n_heads; ++h) {
            float* v = x + (t * n_heads + h) * head_dim;
            for (int64_t i = 0; i < half; ++i) {
                const int64_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
                const float x0 = v[a], x1 = v[b];
                if (t_llamacpp_rounding) {
                    v[a] = llamacpp::fmaf_(x0, cos_t[i], -(x1 * sin_t[i]));
                    v[b] = llamacpp::fmaf_(x0, sin_t[i], x1 * cos_t[i]);
                } else {
                    v[a] = x0 * cos_t[i] - x1 * sin_t[i];
                    v[b] = x0 * sin_t[i] + x1 * cos_t[i];
                }
            }
        }
    }
}

void swiglu(float* out, const float* gate, const float* up, int64_t n) {
    if (t_llamacpp_rounding) {  // ggml_silu on the row (the caller passes one row), ggml_mul
        llamacpp::silu_row(out, gate, n);
        for (int64_t i = 0; i < n; ++i) out[i] *= up[i];
        return;
    }
    for (int64_t i = 0; i < n; ++i) {
        float g = gate[i];
        out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
}

void swiglu_oai(float* out, const float* gate, const float* up, int64_t n, float alpha,
                float limit) {
    for (int64_t i = 0; i < n; ++i) {
        const float x = std::min(gate[i], limit), y = std::clamp(up[i], -limit, limit);
        out[i] = x / (1.0f + std::exp(-alpha * x)) * (y + 1.0f);
    }
}

namespace {
// GELU's tanh approximation 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))).
float gelu_tanh(float g) {
    constexpr float kSqrt2OverPi = 0.7978845608028654f;
    return 0.5f * g * (1.0f + std::tanh(kSqrt2OverPi * (g + 0.044715f * g * g * g)));
}
}  // namespace

void geglu(float* out, const float* gate, const float* up, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = gelu_tanh(gate[i]) * up[i];
}

void gelu(float* out, const float* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = gelu_tanh(x[i]);
}

void softcap(float* x, int64_t n, float cap) {
    for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

void scale(float* x, int64_t n, float s) {
    for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void add_scaled_rows(float* out, const float* y, const float* user, int64_t n_rows, int64_t n,
                     double per_unit) {
    for (int64_t t = 0; t < n_rows; ++t) {
        const float s = lora_row_scale(user[t], per_unit);
        for (int64_t j = 0; j < n; ++j) out[t * n + j] += s * y[t * n + j];
    }
}

void add(float* x, const float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void add_sigmoid_gated(float* x, const float* y, const float* g, int64_t n_rows, int64_t n) {
    for (int64_t t = 0; t < n_rows; ++t) {
        const float s = 1.0f / (1.0f + std::exp(-g[t]));
        for (int64_t j = 0; j < n; ++j) x[t * n + j] += s * y[t * n + j];
    }
}

void limit_expert_groups(float* select, int64_t n_expert, int64_t n_group, int64_t n_used) {
    if (n_group <= 1 || n_used >= n_group) return;
    const int64_t per = n_expert / n_group;
    thread_local std::vector<std::pair<float, int64_t>> score;  // (once per token and layer)
    score.resize(static_cast<size_t>(n_group));
    for (int64_t g = 0; g < n_group; ++g) {
        float best = -std::numeric_limits<float>::infinity(), second = best;
        for (int64_t e = g * per; e < (g + 1) * per; ++e) {
            if (select[e] > best) {
                second = best;
                best = select[e];
            } else if (select[e] > second) {
                second = select[e];
            }
        }
        score[size_t(g)] = {per > 1 ? best + second : best, g};
    }
    std::stable_sort(score.begin(), score.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    for (int64_t i = n_used; i < n_group; ++i) {
        const int64_t g = score[size_t(i)].second;
        std::fill(select + g * per, select + (g + 1) * per,
                  -std::numeric_limits<float>::infinity());
    }
}

void embed(float* out, const WeightView& table, const int32_t* tokens, int64_t n_tokens) {
    const auto* base = static_cast<const uint8_t*>(table.data);
    for (int64_t t = 0; t < n_tokens; ++t) {
        if (tokens[t] < 0 || tokens[t] >= table.n_out)
            fail("token id {} is out of range (vocabulary of {})", tokens[t], table.n_out);
        const uint8_t* row = base + tokens[t] * table.row_bytes;
        if (t_llamacpp_rounding)
            llamacpp::get_row(table.type, row, out + t * table.n_in, table.n_in);
        else
            dequantize_row(table.type, row, out + t * table.n_in, table.n_in);
    }
}

void softmax(float* x, int64_t n) {
    if (n <= 0) return;
    float mx = *std::max_element(x, x + n);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
        x[i] = std::exp(x[i] - mx);
        sum += x[i];
    }
    float inv = float(1.0 / sum);
    for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void softmax_with_sink(float* x, int64_t n, float sink) {
    float mx = sink;
    for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
    double sum = std::exp(double(sink - mx));
    for (int64_t i = 0; i < n; ++i) {
        x[i] = std::exp(x[i] - mx);
        sum += x[i];
    }
    const float inv = float(1.0 / sum);
    for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void kv_write(const KvLayerView& kv, const KvBatchView& batch, const float* k, const float* v) {
    check_kv_view(kv);
    const int64_t hd = kv.head_dim, bs = kv.block_size, row = kv.n_kv_head * hd;
    const bool staged = kv.n_stages > 0;
    const KvPool kp = kv_pool(kv, KvRole::K), vp = kv_pool(kv, KvRole::V);
    for (int64_t t = 0; t < batch.n_tokens; ++t) {
        int64_t slot = batch.token_slot[t];
        if (slot < 0) fail("KV batch: token {} has negative slot {}", t, slot);
        const int64_t block = kv_block_of(kv, batch, t, slot), r = slot % bs;
        for (int64_t h = 0; h < kv.n_kv_head; ++h) {
            const float* kr = k + t * row + h * hd;
            const float* vr = v + t * row + h * hd;
            if (staged) {
                const int64_t st = kv_stage_of(kv, batch, t);
                quantize_row(GgmlType::F16, kr, kv_stage_row(kv.k_stage, kv, st, h, r), hd);
                if (!kv.v_is_k)
                    quantize_row(GgmlType::F16, vr, kv_stage_row(kv.v_stage, kv, st, h, r), hd);
                continue;
            }
            // f32 / f16 pools: row r of a head block is stored like a one-row head block.
            kv_encode_head_block(kp.type, KvRole::K, kr, 1, hd,
                                 kp.at(block, h) + r * (kp.head_block_bytes / bs));
            if (!kv.v_is_k)
                kv_encode_head_block(vp.type, KvRole::V, vr, 1, hd,
                                     vp.at(block, h) + r * (vp.head_block_bytes / bs));
        }
    }
    if (!staged) return;
    // Seal the blocks this batch completed: encode their stage rows into the pool.
    std::vector<float> rows(size_t(bs * hd));  // [block_size][head_dim]
    for (int64_t t = 0; t < batch.n_tokens; ++t) {
        const int64_t slot = batch.token_slot[t];
        if (slot % bs != bs - 1) continue;
        const int64_t block = kv_block_of(kv, batch, t, slot), st = kv_stage_of(kv, batch, t);
        for (int64_t h = 0; h < kv.n_kv_head; ++h) {
            dequantize_row(GgmlType::F16, kv_stage_row(kv.k_stage, kv, st, h, 0), rows.data(),
                           bs * hd);
            kv_encode_head_block(kp.type, KvRole::K, rows.data(), bs, hd, kp.at(block, h));
            if (kv.v_is_k) continue;
            dequantize_row(GgmlType::F16, kv_stage_row(kv.v_stage, kv, st, h, 0), rows.data(),
                           bs * hd);
            kv_encode_head_block(vp.type, KvRole::V, rows.data(), bs, hd, vp.at(block, h));
        }
    }
}

namespace {

// paged_attention under set_llamacpp_rounding with unstaged f16 pools: llama.cpp's
// arithmetic (cpu_llamacpp.h), one (token, query head) at a time. work: multiply-adds.
void attention_llamacpp(float* out, const float* q, const KvLayerView& kv, const KvBatchView& batch,
                        const KvPool& kp, const KvPool& vp, int64_t n_head, float scale,
                        int64_t work) {
    const int64_t hd = kv.head_dim, bs = kv.block_size, group = n_head / kv.n_kv_head;
    const bool batched = batch.n_tokens >= 2;
    const int64_t n_items = batch.n_tokens * n_head;
    const int64_t grain = parallel_grain(work / std::max<int64_t>(1, n_items));
    cpu_thread_pool().parallel_for(n_items, grain, [&](int64_t i0, int64_t i1) {
        std::vector<float> k_row(hd), v_row(hd);  // [head_dim] each
        llamacpp::AttentionScratch scratch;
        for (int64_t item = i0; item < i1; ++item) {
            const int64_t t = item / n_head, kvh = item % n_head / group;
            // Row s of token t's sequence for this KV head, decoded into buf.
            auto row = [&](const KvPool& p, std::vector<float>& buf, int64_t s) -> const float* {
                kv_decode_head_row(p.type, p.role, p.at(kv_block_of(kv, batch, t, s), kvh), bs, hd,
                                   s % bs, buf.data());
                return buf.data();
            };
            llamacpp::attention(
                out + item * hd, q + item * hd, hd, batch.token_slot[t] + 1, scale, batched,
                [&](int64_t s) { return row(kp, k_row, s); },
                [&](int64_t s) { return row(vp, v_row, s); }, scratch);
        }
    });
}

}  // namespace

void paged_attention(float* out, const float* q, const KvLayerView& kv, const KvBatchView& batch,
                     int64_t n_head, float scale) {
    paged_attention(out, q, kv, batch, n_head, scale, 0.0f, 0);
}

void paged_attention(float* out, const float* q, const KvLayerView& kv, const KvBatchView& batch,
                     int64_t n_head, float scale, float softcap, int64_t window,
                     const float* sinks) {
    check_kv_view(kv);
    if (!(softcap >= 0)) fail("paged_attention: soft cap {} must be >= 0", softcap);
    if (n_head <= 0 || n_head % kv.n_kv_head != 0)
        fail("paged_attention: {} query heads do not divide into {} KV heads", n_head,
             kv.n_kv_head);
    const int64_t hd = kv.head_dim, bs = kv.block_size, group = n_head / kv.n_kv_head;
    const bool staged = kv.n_stages > 0;
    int64_t max_slot = -1, work = 0;
    for (int64_t t = 0; t < batch.n_tokens; ++t) {
        if (batch.token_slot[t] < 0)
            fail("KV batch: token {} has negative slot {}", t, batch.token_slot[t]);
        max_slot = std::max<int64_t>(max_slot, batch.token_slot[t]);
        work += (batch.token_slot[t] + 1) * n_head * hd * 2;
    }
    // First slot token t sees (its window or chunk, attn_window.h): the blocks before its block
    // are never read (a paged cache may drop them).
    auto first_visible = [&](int64_t t) { return attn_first_slot(batch.token_slot[t], window); };
    // Validate every block id it reads (and stage) up front, so worker threads never meet bad
    // input.
    for (int64_t t = 0; t < batch.n_tokens; ++t) {
        for (int64_t s = first_visible(t) / bs * bs; s <= batch.token_slot[t]; s += bs)
            kv_block_of(kv, batch, t, s);
        if (staged) kv_stage_of(kv, batch, t);
    }

    const bool emulate = t_llamacpp_rounding && kv.k_type == KvType::F16 &&
                         kv.v_type == KvType::F16 && !staged && softcap == 0 && window == 0 &&
                         !sinks;
    const bool round_q = t_llamacpp_rounding && kv.k_type == KvType::F16;
    const bool round_p = t_llamacpp_rounding && kv.v_type == KvType::F16;
    const KvPool kp = kv_pool(kv, KvRole::K), vp = kv_pool(kv, KvRole::V);
    if (emulate) return attention_llamacpp(out, q, kv, batch, kp, vp, n_head, scale, work);

    // Runs of consecutive tokens that read the same blocks from the same place: one
    // sequence and, when staged, one own block and stage slot (a block sealed by this batch
    // is read from its stage by the tokens inside it, from the pool by later ones). Each
    // K/V block is decoded once per run, not once per token; the run is capped so its
    // scores stay about 1 MiB.
    constexpr int64_t kMaxRun = 16;
    const int64_t run_cap = std::clamp<int64_t>(
        (int64_t(1) << 18) / std::max<int64_t>(1, group * (max_slot + 1)), 1, kMaxRun);
    std::vector<std::pair<int64_t, int64_t>> runs;  // [t0, t1)
    for (int64_t t = 0; t < batch.n_tokens; ++t) {
        if (!runs.empty()) {
            const int64_t t0 = runs.back().first;
            const bool same = t - t0 < run_cap && batch.token_seq[t] == batch.token_seq[t0] &&
                              (!staged || (batch.token_slot[t] / bs == batch.token_slot[t0] / bs &&
                                           batch.token_stage[t] == batch.token_stage[t0]));
            if (same) {
                runs.back().second = t + 1;
                continue;
            }
        }
        runs.emplace_back(t, t + 1);
    }
    int64_t longest_run = 0;
    for (const auto& [t0, t1] : runs) longest_run = std::max(longest_run, t1 - t0);

    // One item: one run and a share of one KV head's query heads, so each K/V row is
    // decoded once for the heads and tokens that read it. Heads are split further only when
    // runs x KV heads alone would leave threads idle (decode of an MQA model); neither the
    // runs nor the split change any (token, head)'s arithmetic.
    const int64_t pairs = int64_t(runs.size()) * kv.n_kv_head;
    const int64_t shares =
        std::clamp<int64_t>((2 * cpu_thread_pool().n_threads() + pairs - 1) / pairs, 1, group);
    const int64_t heads_per_share = (group + shares - 1) / shares;
    const int64_t n_items = pairs * shares;
    const int64_t grain = parallel_grain(work / std::max<int64_t>(1, n_items));
    cpu_thread_pool().parallel_for(n_items, grain, [&](int64_t i0, int64_t i1) {
        // [run token][head][slot]
        std::vector<float> scores(size_t(longest_run * heads_per_share * (max_slot + 1)));
        std::vector<float> rows(size_t(bs * hd));  // [block_size][head_dim] decoded K or V
        std::vector<float> q_rounded(
            size_t(longest_run * heads_per_share * hd));  // [token][head][hd]
        for (int64_t item = i0; item < i1; ++item) {
            const auto& run = runs[size_t(item / (kv.n_kv_head * shares))];
            const int64_t t0 = run.first, t1 = run.second;
            const int64_t kvh = item / shares % kv.n_kv_head, share = item % shares;
            const int64_t h0 = kvh * group + share * heads_per_share;
            const int64_t nh = std::min(heads_per_share, (kvh + 1) * group - h0);
            if (nh <= 0) continue;
            int64_t n_max = 0;     // slots the run's longest token reads
            int64_t j_first = -1;  // first block any token of the run sees
            for (int64_t t = t0; t < t1; ++t) {
                n_max = std::max<int64_t>(n_max, batch.token_slot[t] + 1);
                const int64_t j = first_visible(t) / bs;
                j_first = j_first < 0 ? j : std::min(j_first, j);
            }
            const int64_t own_block = int64_t(batch.token_slot[t0]) / bs;
            // Rows [0, n) of K or V block j of the run's sequence, decoded into `rows`: the
            // run's own block from its stage when staged, else from the pool.
            auto load_block = [&](KvRole role, int64_t j, int64_t n) {
                if (staged && j == own_block) {
                    void* stage = role == KvRole::K ? kv.k_stage : kv.v_stage;
                    dequantize_row(GgmlType::F16,
                                   kv_stage_row(stage, kv, batch.token_stage[t0], kvh, 0),
                                   rows.data(), n * hd);
                    return;
                }
                const KvPool& p = role == KvRole::K ? kp : vp;
                const uint8_t* blk = p.at(kv_block_of(kv, batch, t0, j * bs), kvh);
                kv_decode_head_rows(p.type, p.role, blk, bs, hd, 0, n, rows.data());
            };
            // Token t's query heads [nh][head_dim], and its scores [nh][n_max].
            auto q_of = [&](int64_t t) {
                const float* qv = q + (t * n_head + h0) * hd;
                if (!round_q) return qv;
                float* qr = q_rounded.data() + (t - t0) * nh * hd;
                for (int64_t i = 0; i < nh * hd; ++i) qr[i] = round_to_f16(qv[i]);
                return static_cast<const float*>(qr);
            };
            auto scores_of = [&](int64_t t) { return scores.data() + (t - t0) * nh * n_max; };
            const float* qs[kMaxRun];
            for (int64_t t = t0; t < t1; ++t) qs[t - t0] = q_of(t);
            // Blocks before j_first only hold slots outside every window: skipped (their
            // scores are set to -inf below, their p * V terms would be zero).
            for (int64_t j = j_first, s0 = j_first * bs; s0 < n_max; ++j, s0 += bs) {
                load_block(KvRole::K, j, std::min(bs, n_max - s0));
                for (int64_t t = t0; t < t1; ++t) {
                    const int64_t n = std::min<int64_t>(bs, batch.token_slot[t] + 1 - s0);
                    for (int64_t h = 0; h < nh; ++h)
                        dot_rows(scores_of(t) + h * n_max + s0, qs[t - t0] + h * hd, rows.data(), n,
                                 hd, scale);
                }
            }
            for (int64_t t = t0; t < t1; ++t) {
                const int64_t n_slots = batch.token_slot[t] + 1;
                float* o = out + (t * n_head + h0) * hd;  // [nh][head_dim]
                std::fill(o, o + nh * hd, 0.0f);
                // Gemma: soft cap, then the slots before the window (or chunk) drop out
                // (exp(-inf) = 0).
                const int64_t lo = first_visible(t);
                for (int64_t h = 0; h < nh; ++h) {
                    float* p = scores_of(t) + h * n_max;
                    if (softcap > 0)
                        for (int64_t s = lo; s < n_slots; ++s)
                            p[s] = softcap * std::tanh(p[s] / softcap);
                    std::fill(p, p + lo, -std::numeric_limits<float>::infinity());
                    if (sinks)
                        softmax_with_sink(p, n_slots, sinks[h0 + h]);
                    else
                        softmax(p, n_slots);
                    if (round_p)
                        for (int64_t s = 0; s < n_slots; ++s) p[s] = round_to_f16(p[s]);
                }
            }
            for (int64_t j = j_first, s0 = j_first * bs; s0 < n_max; ++j, s0 += bs) {
                load_block(KvRole::V, j, std::min(bs, n_max - s0));
                for (int64_t t = t0; t < t1; ++t) {
                    const int64_t n = std::min<int64_t>(bs, batch.token_slot[t] + 1 - s0);
                    const float* sc = scores_of(t);
                    float* o = out + (t * n_head + h0) * hd;
                    for (int64_t h = 0; h < nh; ++h)
                        axpy_rows(o + h * hd, sc + h * n_max + s0, rows.data(), n, hd);
                }
            }
        }
    });
}

void kv_copy(const KvLayerView& kv, int64_t src, int64_t dst, int64_t src_stage, int64_t dst_stage,
             int64_t n_rows) {
    check_kv_view(kv);
    const int64_t hd = kv.head_dim, bs = kv.block_size;
    if (src < 0 || src >= kv.n_blocks || dst < 0 || dst >= kv.n_blocks)
        fail("KV copy: block pair ({}, {}) outside the pool of {} blocks", src, dst, kv.n_blocks);
    if (dst_stage < 0) {
        if (src_stage >= 0) fail("KV copy: a stage source needs a stage destination");
        if (src == dst) return;
        for (const KvPool& p : {kv_pool(kv, KvRole::K), kv_pool(kv, KvRole::V)})
            std::memcpy(p.at(dst, 0), p.at(src, 0), size_t(p.n_kv_head * p.head_block_bytes));
        return;
    }
    if (dst_stage >= kv.n_stages || src_stage >= kv.n_stages || n_rows < 0 || n_rows > bs)
        fail("KV copy: stage {} -> {} of {} rows outside {} stage slots of {} rows", src_stage,
             dst_stage, n_rows, kv.n_stages, bs);
    std::vector<float> row(static_cast<size_t>(hd));  // [head_dim]
    for (auto [p, stage] : {std::pair{kv_pool(kv, KvRole::K), kv.k_stage},
                            std::pair{kv_pool(kv, KvRole::V), kv.v_stage}}) {
        for (int64_t h = 0; h < kv.n_kv_head; ++h)
            for (int64_t r = 0; r < n_rows; ++r) {
                uint8_t* d = kv_stage_row(stage, kv, dst_stage, h, r);
                if (src_stage >= 0) {
                    std::memmove(d, kv_stage_row(stage, kv, src_stage, h, r), size_t(hd) * 2);
                } else {
                    kv_decode_head_row(p.type, p.role, p.at(src, h), bs, hd, r, row.data());
                    quantize_row(GgmlType::F16, row.data(), d, hd);
                }
            }
    }
}

void set_llamacpp_rounding(bool on) {
    t_llamacpp_rounding = on;
}
bool llamacpp_rounding() {
    return t_llamacpp_rounding;
}

}  // namespace kvrun::cpu
