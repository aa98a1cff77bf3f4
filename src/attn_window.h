// Which earlier slots a token's attention sees, and Llama 4's position-dependent query scale:
// shared by the CPU ops (cpu::paged_attention, cpu::attn_temperature) and the CUDA kernels
// (cuda/attention*.cu, cuda/norm_rope_act.cu), so every backend masks and scales alike.
#pragma once

#include <math.h>

#include <cstdint>

#include "rope.h"  // KVRUN_HOST_DEVICE

namespace kvrun {

// The first slot a token at `slot` attends to (the last one is `slot` itself): window > 0, a
// sliding window of that many slots (Gemma 2/3, gpt-oss); window < 0, the token's own chunk of
// -window slots, floor(slot / -window) * -window (Llama 4); 0, the whole context.
KVRUN_HOST_DEVICE inline int64_t attn_first_slot(int64_t slot, int64_t window) {
    if (window > 0) return slot - window + 1 > 0 ? slot - window + 1 : 0;
    if (window < 0) return slot / -window * -window;
    return 0;
}

// Llama 4's attention temperature for the queries of the token at `pos` (its layers without
// RoPE): 1 + scale * ln(1 + floor((pos + 1) / floor_len)); 1 when scale is 0.
KVRUN_HOST_DEVICE inline float attn_temperature(int64_t pos, float scale, int64_t floor_len) {
    return 1.0f + scale * logf(1.0f + floorf(float(pos + 1) / float(floor_len)));
}

}  // namespace kvrun
