// llama.cpp arithmetic emulation for the CPU ops (cpu::set_llamacpp_rounding, a validation
// aid): reproduces the reference llama.cpp build's float arithmetic bit for bit, so logits can
// be compared with its references at strict thresholds. Why each piece exists:
// docs/llamacpp-fidelity.md. Used by cpu_ops.cpp only.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "cpu_ops.h"

namespace kvrun::cpu::llamacpp {

// fma with a single rounding (the reference's contracted a * b + c).
inline float fmaf_(float a, float b, float c) {
    return std::fma(a, b, c);
}

// out[r][o] = W[o] . x[r] as ggml_compute_forward_mul_mat computes it for w's type.
void matmul(float* out, const float* x, const WeightView& w, int64_t n_rows);
// One row of a weight table as ggml_get_rows dequantizes it: y[n].
void get_row(GgmlType t, const uint8_t* src, float* y, int64_t n);
// ggml_vec_silu_f32 over one row: y[n] = silu(x[n]).
void silu_row(float* y, const float* x, int64_t n);

// Scratch of attention() for one worker thread.
struct AttentionScratch {
    std::vector<float> q, scores, lanes;
};
// The K or V row of cell s as floats.
using RowFn = std::function<const float*(int64_t)>;
// One (token, head) of attention without flash attention over an f16 K/V cache:
// out[hd] from q[hd] and cells 0..n_slots-1; batched: the batch has >= 2 tokens.
void attention(float* out, const float* q, int64_t hd, int64_t n_slots, float scale, bool batched,
               const RowFn& k_row, const RowFn& v_row, AttentionScratch& x);

}  // namespace kvrun::cpu::llamacpp
