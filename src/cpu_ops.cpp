// CPU reference implementations of the ops declared in cpu_ops.h: float32 activations,
// weights dequantized row by row from their GGUF types, K/V stored as f32, f16, or
// quantized (q8/q4, kv_format.h) with f16 stage slots for the blocks being filled.
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
#include <utility>
#include <vector>

#include "common.h"
#include "cpu_llamacpp.h"
#include "kv_format.h"
#include "quant.h"
#include "thread_pool.h"

namespace kvrun::cpu {
namespace {

// Work (multiply-adds) below which an op runs on the calling thread: a thread wake-up
// costs a few microseconds, about as much as 30k multiply-adds.
constexpr int64_t kMinParallelWork = 32 * 1024;

// dot(a[n], b[n]) with eight independent float accumulators (vectorizable without
// -ffast-math), combined in a fixed order.
float dot_f32(const float* a, const float* b, int64_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
    for (; i < n; ++i) acc[i & 7] += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// y[n] += p * x[n]
void axpy_f32(float* y, float p, const float* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] += p * x[i];
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

void matmul(float* out, const float* x, const WeightView& w, int64_t n_rows) {
    if (!w.data || w.n_in <= 0 || w.n_out <= 0)
        fail("matmul: empty weight view ({} x {})", w.n_out, w.n_in);
    const int64_t n_in = w.n_in, n_out = w.n_out;
    const auto* base = static_cast<const uint8_t*>(w.data);
    if (t_llamacpp_rounding) return llamacpp::matmul(out, x, w, n_rows);
    // Output rows per chunk: enough multiply-adds to be worth a thread hand-off.
    int64_t work_per_row = std::max<int64_t>(1, n_in * n_rows);
    int64_t grain = std::max<int64_t>(1, kMinParallelWork / work_per_row);
    cpu_thread_pool().parallel_for(n_out, grain, [&](int64_t o0, int64_t o1) {
        // Each weight row is dequantized once and dotted with every token's activations.
        std::vector<float> row(w.type == GgmlType::F32 ? 0 : n_in);  // [n_in]
        for (int64_t o = o0; o < o1; ++o) {
            const uint8_t* src = base + o * w.row_bytes;
            const float* wr;
            if (w.type == GgmlType::F32) {
                wr = reinterpret_cast<const float*>(src);
            } else {
                dequantize_row(w.type, src, row.data(), n_in);
                wr = row.data();
            }
            for (int64_t r = 0; r < n_rows; ++r)
                out[r * n_out + o] = dot_f32(wr, x + r * n_in, n_in);
        }
    });
}

void add_bias(float* x, const float* bias, int64_t n_rows, int64_t n) {
    for (int64_t r = 0; r < n_rows; ++r)
        for (int64_t i = 0; i < n; ++i) x[r * n + i] += bias[i];
}

void rope(float* x, const int32_t* pos, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
          int64_t n_rot, float freq_base, float freq_scale, bool neox) {
    if (n_rot <= 0 || n_rot > head_dim || n_rot % 2 != 0)
        fail("rope: rotated dims {} must be even and within head_dim {}", n_rot, head_dim);
    const int64_t half = n_rot / 2;
    std::vector<float> cos_t(half), sin_t(half);  // [n_rot / 2] for one position
    if (t_llamacpp_rounding) {  // ggml_compute_forward_rope_f32 (no YaRN, mscale 1)
        const float theta_scale = std::pow(freq_base, -2.0f / float(n_rot));
        for (int64_t t = 0; t < n_tokens; ++t) {
            float theta = float(pos[t]);
            for (int64_t i = 0; i < half; ++i) {
                cos_t[i] = std::cos(freq_scale * theta);
                sin_t[i] = std::sin(freq_scale * theta);
                theta *= theta_scale;
            }
            for (int64_t h = 0; h < n_heads; ++h) {
                float* v = x + (t * n_heads + h) * head_dim;
                for (int64_t i = 0; i < half; ++i) {
                    const int64_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
                    const float x0 = v[a], x1 = v[b];
                    v[a] = llamacpp::fmaf_(x0, cos_t[i], -(x1 * sin_t[i]));
                    v[b] = llamacpp::fmaf_(x0, sin_t[i], x1 * cos_t[i]);
                }
            }
        }
        return;
    }
    for (int64_t t = 0; t < n_tokens; ++t) {
        for (int64_t i = 0; i < half; ++i) {
            double inv_freq = std::pow(double(freq_base), -2.0 * double(i) / double(n_rot));
            double theta = double(pos[t]) * double(freq_scale) * inv_freq;
            cos_t[i] = float(std::cos(theta));
            sin_t[i] = float(std::sin(theta));
        }
        for (int64_t h = 0; h < n_heads; ++h) {
            float* v = x + (t * n_heads + h) * head_dim;
            for (int64_t i = 0; i < half; ++i) {
                int64_t a = neox ? i : 2 * i;
                int64_t b = neox ? i + half : 2 * i + 1;
                float x0 = v[a], x1 = v[b];
                v[a] = x0 * cos_t[i] - x1 * sin_t[i];
                v[b] = x0 * sin_t[i] + x1 * cos_t[i];
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

void add(float* x, const float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] += y[i];
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
                quantize_row(GgmlType::F16, vr, kv_stage_row(kv.v_stage, kv, st, h, r), hd);
                continue;
            }
            // f32 / f16 pools: row r of a head block is stored like a one-row head block.
            kv_encode_head_block(kp.type, KvRole::K, kr, 1, hd,
                                 kp.at(block, h) + r * (kp.head_block_bytes / bs));
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
            dequantize_row(GgmlType::F16, kv_stage_row(kv.v_stage, kv, st, h, 0), rows.data(),
                           bs * hd);
            kv_encode_head_block(vp.type, KvRole::V, rows.data(), bs, hd, vp.at(block, h));
        }
    }
}

void paged_attention(float* out, const float* q, const KvLayerView& kv, const KvBatchView& batch,
                     int64_t n_head, float scale) {
    check_kv_view(kv);
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
    // Validate every block id (and stage) up front, so worker threads never meet bad input.
    for (int64_t t = 0; t < batch.n_tokens; ++t) {
        for (int64_t s = 0; s <= batch.token_slot[t]; s += bs) kv_block_of(kv, batch, t, s);
        if (staged) kv_stage_of(kv, batch, t);
    }

    const bool emulate =
        t_llamacpp_rounding && kv.k_type == KvType::F16 && kv.v_type == KvType::F16 && !staged;
    const bool batched = batch.n_tokens >= 2;
    const bool round_q = t_llamacpp_rounding && kv.k_type == KvType::F16;
    const bool round_p = t_llamacpp_rounding && kv.v_type == KvType::F16;
    const KvPool kp = kv_pool(kv, KvRole::K), vp = kv_pool(kv, KvRole::V);
    const int64_t n_items = batch.n_tokens * n_head;  // one (token, head) pair each
    int64_t per_item = std::max<int64_t>(1, work / std::max<int64_t>(1, n_items));
    int64_t grain = std::max<int64_t>(1, kMinParallelWork / per_item);
    cpu_thread_pool().parallel_for(n_items, grain, [&](int64_t i0, int64_t i1) {
        std::vector<float> scores(max_slot + 1);  // [n_slots] of the current token
        std::vector<float> tmp(hd);               // [head_dim] one decoded K or V row
        std::vector<float> q_rounded(hd);         // [head_dim]
        // Decodes K (or V) row s of token t's sequence for KV head kvh into tmp: from the
        // stage for the token's own block when staged, else from the pool block.
        auto load_row = [&](KvRole role, int64_t t, int64_t kvh, int64_t s) -> const float* {
            const int64_t slot = batch.token_slot[t];
            if (staged && s / bs == slot / bs) {
                void* stage = role == KvRole::K ? kv.k_stage : kv.v_stage;
                dequantize_row(GgmlType::F16,
                               kv_stage_row(stage, kv, batch.token_stage[t], kvh, s % bs),
                               tmp.data(), hd);
            } else {
                const KvPool& p = role == KvRole::K ? kp : vp;
                kv_decode_head_row(p.type, role, p.at(kv_block_of(kv, batch, t, s), kvh), bs, hd,
                                   s % bs, tmp.data());
            }
            return tmp.data();
        };
        llamacpp::AttentionScratch emu;
        for (int64_t item = i0; item < i1; ++item) {
            const int64_t t = item / n_head, h = item % n_head, kvh = h / group;
            const int64_t n_slots = batch.token_slot[t] + 1;
            const float* qv = q + item * hd;
            if (emulate) {
                llamacpp::attention(
                    out + item * hd, qv, hd, n_slots, scale, batched,
                    [&](int64_t s) { return load_row(KvRole::K, t, kvh, s); },
                    [&](int64_t s) { return load_row(KvRole::V, t, kvh, s); }, emu);
                continue;
            }
            if (round_q) {
                for (int64_t i = 0; i < hd; ++i) q_rounded[i] = round_to_f16(qv[i]);
                qv = q_rounded.data();
            }
            for (int64_t s = 0; s < n_slots; ++s)
                scores[s] = dot_f32(qv, load_row(KvRole::K, t, kvh, s), hd) * scale;
            softmax(scores.data(), n_slots);
            float* o = out + item * hd;
            std::fill(o, o + hd, 0.0f);
            for (int64_t s = 0; s < n_slots; ++s)
                axpy_f32(o, round_p ? round_to_f16(scores[s]) : scores[s],
                         load_row(KvRole::V, t, kvh, s), hd);
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
