// Rotary position embedding: the parameters of one model's RoPE and the angle of one rotated
// pair, shared by the CPU op (cpu::rope), the CUDA kernels (cuda/rope.cuh) and the model
// config that fills the parameters in (model_config.cpp), so every backend rotates by the
// same angles.
//
// Pair i (0 <= i < n_rot / 2) of a token at position pos turns by
//   theta_extrap = pos * freq_base^(-2i / n_rot) / freq_factor[i]
//   theta_interp = freq_scale * theta_extrap
//   theta        = theta_interp                                  (YaRN off: ext_factor 0)
//                = theta_interp * (1 - mix) + theta_extrap * mix (YaRN: mix = ramp(i) * ext_factor)
// and both rotated elements are multiplied by mscale (cos and sin scaled). The factors are
// Llama 3.1's per-pair frequency divisors (the rope_freqs.weight tensor); linear scaling is
// freq_scale = 1 / factor; YaRN (Peng et al., 2023) keeps the fast pairs (i below corr_low)
// unscaled, interpolates the slow ones (i above corr_high) and ramps linearly between.
#pragma once

#include <math.h>

#include <cstdint>

#if defined(__CUDACC__)
#define KVRUN_HOST_DEVICE __host__ __device__
#else
#define KVRUN_HOST_DEVICE
#endif

namespace kvrun {

struct RopeParams {
    int32_t n_rot = 0;                    // rotated dims per head (even)
    bool neox = false;                    // pairs (i, i + n_rot/2) instead of (2i, 2i+1)
    float freq_base = 10000.0f;           // base of the per-pair frequencies
    float freq_scale = 1.0f;              // 1 / scaling factor (linear, YaRN)
    const float* freq_factors = nullptr;  // [n_rot / 2] divisors or null (device memory on CUDA)
    float ext_factor = 0.0f;              // YaRN extrapolation mix; 0: YaRN off
    float corr_low = 0.0f, corr_high = 0.0f;  // YaRN ramp: pairs <= low extrapolate, >= high
                                              // interpolate
    float mscale = 1.0f;                      // cos and sin multiplier (YaRN attention factor)

    // Plain RoPE (no factors, no YaRN): what older call sites and tests pass.
    static RopeParams plain(int64_t n_rot, float freq_base, float freq_scale, bool neox) {
        RopeParams p;
        p.n_rot = int32_t(n_rot);
        p.freq_base = freq_base;
        p.freq_scale = freq_scale;
        p.neox = neox;
        return p;
    }
};

// YaRN's ramp for pair i: 1 at or below corr_low (extrapolate), 0 at or above corr_high.
KVRUN_HOST_DEVICE inline float rope_yarn_ramp(float low, float high, int64_t i) {
    const float y = (float(i) - low) / fmaxf(0.001f, high - low);
    return 1.0f - fminf(1.0f, fmaxf(0.0f, y));
}

// The angle of pair i at position pos, in double (exact enough for long positions).
KVRUN_HOST_DEVICE inline double rope_angle(const RopeParams& p, int32_t pos, int64_t i) {
    const double inv_freq = pow(double(p.freq_base), -2.0 * double(i) / double(p.n_rot));
    double scale = p.freq_scale;  // theta = pos * scale * inv_freq
    if (p.ext_factor != 0.0f) {
        const double mix = double(rope_yarn_ramp(p.corr_low, p.corr_high, i)) * p.ext_factor;
        scale = double(p.freq_scale) * (1.0 - mix) + mix;
    }
    if (p.freq_factors) scale /= double(p.freq_factors[i]);
    return double(pos) * scale * inv_freq;
}

// The pair index YaRN's correction range starts or ends at: where a pair completes
// n_turns turns over the original context (rotations per pair fall with i).
inline double rope_yarn_corr_dim(int64_t n_rot, int64_t n_ctx_orig, double n_turns, double base) {
    return double(n_rot) * log(double(n_ctx_orig) / (n_turns * 2.0 * M_PI)) / (2.0 * log(base));
}

}  // namespace kvrun
