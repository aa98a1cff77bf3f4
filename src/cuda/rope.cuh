// RoPE's per-pair math (cpu::rope's contract), shared by rope_kernel (norm_rope_act.cu) and
// the fused RoPE + KV write (kv_write.cu) so that both give the same bits: the angle in
// double (exact enough for long positions), the rotation with its roundings spelled out
// (__fmul_rn is never contracted), so no FMA contraction choice of the compiler can make
// the two kernels differ.
#pragma once

#include <vector_functions.h>

#include <cstdint>

#include "rope.h"

namespace kvrun::cu {

// cos and sin (x, y) of pair i's angle (rope_angle), times p.mscale, as cpu::rope.
__device__ __forceinline__ float2 rope_cos_sin(const RopeParams& p, int32_t pos, int64_t i) {
    const double theta = rope_angle(p, pos, i);
    double sd, cd;
    sincos(theta, &sd, &cd);
    return make_float2(float(cd * double(p.mscale)), float(sd * double(p.mscale)));
}

// (x0, x1) rotated by the angle whose cos and sin are cs: (x0 c - x1 s, x0 s + x1 c), each
// as one FMA over the other product rounded to float.
__device__ __forceinline__ float2 rope_rotate(float x0, float x1, float2 cs) {
    return make_float2(fmaf(x0, cs.x, -__fmul_rn(x1, cs.y)), fmaf(x0, cs.y, __fmul_rn(x1, cs.x)));
}

// Element indices (a, b) of rotated pair i of a head: (i, i + n_rot / 2) with neox pairs,
// else (2i, 2i + 1).
__device__ __forceinline__ int2 rope_pair(int i, int n_rot, bool neox) {
    return neox ? make_int2(i, i + n_rot / 2) : make_int2(2 * i, 2 * i + 1);
}

}  // namespace kvrun::cu
