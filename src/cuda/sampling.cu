// Token sampling on the GPU (no logits copy per token): argmax, and temperature / top-k /
// top-p / min-p sampling from a given uniform number. One block per row. Top-k and top-p
// thresholds are found by radix selection over order-preserving logit keys (4 passes of 8
// bits, counting resp. summing probabilities per digit), so nothing is sorted.
#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/ops.h"

namespace kvrun {
namespace {

constexpr int kSampleThreads = 1024;

// Order-preserving map float -> uint32 (larger float, larger key).
__device__ __forceinline__ uint32_t float_key(float f) {
    const uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// A logit as the samplers see it: NaN counts as -inf, +inf as the largest float.
__device__ __forceinline__ float clean_logit(float l) {
    return l != l ? -INFINITY : fminf(l, 3.402823466e38f);
}

// Block-wide (value, index) argmax: larger value wins, lower index on ties.
__device__ void block_argmax(float& v, int64_t& idx, float* sv, int64_t* si) {
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int64_t oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (ov > v || (ov == v && oi < idx)) v = ov, idx = oi;
    }
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    __syncthreads();
    if (lane == 0) sv[warp] = v, si[warp] = idx;
    __syncthreads();
    if (warp == 0) {
        const int n_warps = blockDim.x / 32;
        v = lane < n_warps ? sv[lane] : -INFINITY;
        idx = lane < n_warps ? si[lane] : INT64_MAX;
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, v, o);
            const int64_t oi = __shfl_xor_sync(0xffffffffu, idx, o);
            if (ov > v || (ov == v && oi < idx)) v = ov, idx = oi;
        }
        if (lane == 0) sv[0] = v, si[0] = idx;
    }
    __syncthreads();
    v = sv[0], idx = si[0];
}

// Argmax of logits[n] (NaN never wins); returns the index, the max via *max_out.
__device__ int64_t row_argmax(const float* __restrict__ logits, int64_t n, float* max_out) {
    __shared__ float sv[32];
    __shared__ int64_t si[32];
    float v = -INFINITY;
    int64_t idx = INT64_MAX;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float x = clean_logit(logits[i]);
        if (x > v || (x == v && i < idx)) v = x, idx = i;
    }
    block_argmax(v, idx, sv, si);
    if (idx == INT64_MAX) idx = 0;  // all NaN / -inf
    *max_out = v;
    return idx;
}

// Radix selection: the largest key K with W(K) >= target, where W(K) sums weight(i) over
// elements with key_i >= K and key_i >= floor_key. kCount: weight 1; else weight
// exp(logit - mx). Returns floor_key when the target is never reached.
template <bool kCount>
__device__ uint32_t radix_select(const float* __restrict__ logits, int64_t n, float mx,
                                 uint32_t floor_key, float target) {
    __shared__ float hist[256];
    __shared__ uint32_t sh_prefix;
    __shared__ float sh_above;
    uint32_t prefix = 0, mask = 0;
    float above = 0.0f;
    for (int pass = 0; pass < 4; ++pass) {
        const int shift = 24 - 8 * pass;
        for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0.0f;
        __syncthreads();
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            const float l = clean_logit(logits[i]);
            const uint32_t key = float_key(l);
            if (key >= floor_key && (key & mask) == prefix)
                atomicAdd(&hist[(key >> shift) & 0xff], kCount ? 1.0f : expf(l - mx));
        }
        __syncthreads();
        if (threadIdx.x < 32) {
            // Lane owns digits [8 * lane, 8 * lane + 8); suffix sums from digit 255 down.
            const int lane = threadIdx.x;
            float own = 0.0f;
            for (int b = 0; b < 8; ++b) own += hist[8 * lane + b];
            float suffix = own;  // sum of digits >= 8 * lane
            for (int o = 1; o < 32; o <<= 1) {
                const float t = __shfl_down_sync(0xffffffffu, suffix, o);
                if (lane + o < 32) suffix += t;
            }
            const float above_lane = suffix - own;  // digits >= 8 * (lane + 1)
            const bool hit = above + suffix >= target && above + above_lane < target;
            const unsigned hits = __ballot_sync(0xffffffffu, hit);
            int digit = -1;
            float new_above = above;
            if (hit) {
                float cum = above + above_lane;
                for (int b = 8 * lane + 7; b >= 8 * lane; --b) {
                    if (cum + hist[b] >= target || b == 8 * lane) {
                        digit = b;
                        break;
                    }
                    cum += hist[b];
                }
                new_above = cum;
            }
            if (hits == 0 && lane == 0) {
                digit = 0;  // target unreachable: keep everything above floor
                new_above = above;
                for (int b = 255; b > 0; --b) new_above += hist[b];
            }
            const int src = hits ? __ffs(hits) - 1 : 0;
            digit = __shfl_sync(0xffffffffu, digit, src);
            new_above = __shfl_sync(0xffffffffu, new_above, src);
            if (lane == 0) {
                sh_prefix = prefix | (uint32_t(digit) << shift);
                sh_above = new_above;
            }
        }
        __syncthreads();
        prefix = sh_prefix;
        above = sh_above;
        mask |= 0xffu << shift;
        __syncthreads();
    }
    return prefix > floor_key ? prefix : floor_key;
}

__global__ void argmax_kernel(int32_t* __restrict__ out, const float* __restrict__ logits,
                              int64_t n_vocab) {
    float mx;
    const int64_t idx = row_argmax(logits + int64_t(blockIdx.x) * n_vocab, n_vocab, &mx);
    if (threadIdx.x == 0) out[blockIdx.x] = int32_t(idx);
}

__global__ void __launch_bounds__(kSampleThreads)
    sample_kernel(int32_t* __restrict__ out, const float* __restrict__ logits_all, int64_t n_vocab,
                  CudaSamplerConfig cfg, const float* __restrict__ u_all) {
    __shared__ float scratch[32];
    __shared__ float thread_sum[kSampleThreads];
    __shared__ unsigned long long pick, last_any;
    const float* logits = logits_all + int64_t(blockIdx.x) * n_vocab;
    float mx;
    const int64_t best = row_argmax(logits, n_vocab, &mx);
    if (cfg.temperature <= 0.0f || mx == -INFINITY || mx != mx) {
        if (threadIdx.x == 0) out[blockIdx.x] = int32_t(best);
        return;
    }
    // Thresholds in key space: keep token i iff float_key(logit_i) >= thr.
    uint32_t thr = 0;
    if (cfg.top_k > 0 && cfg.top_k < n_vocab)
        thr = radix_select<true>(logits, n_vocab, mx, 0, float(cfg.top_k));
    if (cfg.top_p < 1.0f) {
        float z = 0.0f;
        for (int64_t i = threadIdx.x; i < n_vocab; i += blockDim.x)
            if (const float l = clean_logit(logits[i]); float_key(l) >= thr) z += expf(l - mx);
        z = cu::block_sum(z, scratch);
        const float target = fmaxf(cfg.top_p, 0.0f) * z;
        thr = radix_select<false>(logits, n_vocab, mx, thr, target);
    }
    if (cfg.min_p > 0.0f) {
        // Keep logit >= mx + log(min_p), evaluated in double like the CPU sampler: the
        // smallest float not below the double threshold.
        const double tl = double(mx) + log(double(cfg.min_p));
        float tf = float(tl);
        if (double(tf) < tl) tf = nextafterf(tf, INFINITY);
        const uint32_t t = float_key(tf);
        thr = t > thr ? t : thr;
    }
    // Inverse CDF in vocabulary order: each thread owns a contiguous range.
    const float inv_temp = 1.0f / cfg.temperature;
    const int64_t per = cu::ceil_div(n_vocab, blockDim.x);
    const int64_t lo = min(n_vocab, int64_t(threadIdx.x) * per), hi = min(n_vocab, lo + per);
    float own = 0.0f;
    int64_t last_kept = -1;
    for (int64_t i = lo; i < hi; ++i) {
        const float l = clean_logit(logits[i]);
        if (float_key(l) >= thr) own += expf((l - mx) * inv_temp), last_kept = i;
    }
    thread_sum[threadIdx.x] = own;
    if (threadIdx.x == 0) pick = ~0ull, last_any = 0;
    __syncthreads();
    if (last_kept >= 0) atomicMax(&last_any, (unsigned long long)(last_kept + 1));
    // Inclusive prefix over threads (Hillis-Steele in shared memory; 10 steps).
    float incl = own;
    for (int o = 1; o < int(blockDim.x); o <<= 1) {
        const float add = int(threadIdx.x) >= o ? thread_sum[threadIdx.x - o] : 0.0f;
        __syncthreads();
        incl += add;
        thread_sum[threadIdx.x] = incl;
        __syncthreads();
    }
    const float total = thread_sum[blockDim.x - 1];
    const float excl = incl - own;
    const float target = u_all[blockIdx.x] * total;
    if (own > 0.0f && excl <= target && target < incl) {
        float run = excl;
        int64_t found = last_kept;  // rounding fallback: the range's last kept token
        for (int64_t i = lo; i < hi; ++i) {
            const float l = clean_logit(logits[i]);
            if (float_key(l) < thr) continue;
            run += expf((l - mx) * inv_temp);
            if (run > target) {
                found = i;
                break;
            }
        }
        atomicMin(&pick, (unsigned long long)found);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        // No range matched only when rounding put the target at the very end.
        const int64_t tok = pick != ~0ull ? int64_t(pick) : last_any ? int64_t(last_any) - 1 : best;
        out[blockIdx.x] = int32_t(tok);
    }
}

// One thread per history entry; the first occurrence of each id applies the penalty.
__global__ void repeat_penalty_kernel(float* __restrict__ logits, int64_t n_vocab,
                                      const int32_t* __restrict__ tokens, int64_t n_tokens,
                                      float penalty) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_tokens) return;
    const int32_t tok = tokens[i];
    if (tok < 0 || tok >= n_vocab) return;
    for (int64_t j = 0; j < i; ++j)
        if (tokens[j] == tok) return;
    const float l = logits[tok];
    logits[tok] = l > 0.0f ? l / penalty : l * penalty;
}

}  // namespace

void cuda_argmax(int32_t* out, const float* logits, int64_t n_rows, int64_t n_vocab,
                 cudaStream_t s) {
    CUDA_REQUIRE(n_vocab > 0 && n_vocab <= INT32_MAX && n_rows >= 0, "cuda_argmax: bad shape");
    if (n_rows == 0) return;
    argmax_kernel<<<unsigned(n_rows), 256, 0, s>>>(out, logits, n_vocab);
    CUDA_CHECK_LAUNCH();
}

void cuda_sample(int32_t* out, const float* logits, int64_t n_rows, int64_t n_vocab,
                 const CudaSamplerConfig& cfg, const float* u, cudaStream_t s) {
    CUDA_REQUIRE(n_vocab > 0 && n_vocab <= INT32_MAX && n_rows >= 0, "cuda_sample: bad shape");
    CUDA_REQUIRE(cfg.min_p <= 1.0f, "cuda_sample: min_p must be at most 1");
    if (n_rows == 0) return;
    sample_kernel<<<unsigned(n_rows), kSampleThreads, 0, s>>>(out, logits, n_vocab, cfg, u);
    CUDA_CHECK_LAUNCH();
}

void cuda_repeat_penalty(float* logits, int64_t n_vocab, const int32_t* tokens, int64_t n_tokens,
                         float penalty, cudaStream_t s) {
    CUDA_REQUIRE(penalty > 0.0f, "cuda_repeat_penalty: penalty must be positive");
    if (n_tokens <= 0 || penalty == 1.0f) return;
    repeat_penalty_kernel<<<unsigned(cu::ceil_div(n_tokens, 256)), 256, 0, s>>>(
        logits, n_vocab, tokens, n_tokens, penalty);
    CUDA_CHECK_LAUNCH();
}

}  // namespace kvrun
