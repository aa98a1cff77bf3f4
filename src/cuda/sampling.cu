// Token sampling on the GPU (only token ids leave the device): argmax, and Sampler's chain
// (repetition, frequency and presence penalties, top-k, top-p, min-p, temperature,
// inverse-CDF draw from a given uniform number) with one thread block per row and one
// launch for all rows. Top-k and top-p thresholds are found by radix selection over
// order-preserving logit keys (4 passes of 8 bits, counting resp. summing weights per digit,
// warp-aggregated), ties at a threshold are cut by token id the way Sampler's sort orders
// them, and weights and probabilities are computed in double as Sampler computes them, so
// the device picks Sampler::sample_with's token (up to the order of double additions).
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/ops.h"

namespace kvrun {
namespace {

constexpr int kSampleThreads = 1024;
constexpr int kSampleWarps = kSampleThreads / 32;
constexpr unsigned kFull = 0xffffffffu;

// Order-preserving map float -> uint32 (larger float, larger key) and back.
__device__ __forceinline__ uint32_t float_key(float f) {
    const uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_float(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
// float_key(-FLT_MAX): every finite logit has a key >= this, -inf one below.
constexpr uint32_t kMinFiniteKey = 0x00800000u;

// A logit as Sampler sees it: NaN counts as -inf, +inf as the largest float; -0 as +0 (they
// compare equal on the host, so they must tie here too).
__device__ __forceinline__ float clean_logit(float l) {
    if (l != l) return -INFINITY;
    if (l == 0.0f) return 0.0f;
    return fminf(l, FLT_MAX);
}

__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
    return v;
}

// Sum over the block in a fixed order (deterministic); every thread gets it. sh: 32 doubles.
__device__ double block_sum_d(double v, double* sh) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = warp_sum_d(v);
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = lane < int(blockDim.x / 32) ? sh[lane] : 0.0;
    return warp_sum_d(v);
}

// Exclusive prefix sum of v over the threads; *total gets the sum. sh: 33 entries.
__device__ long long block_excl_scan(long long v, long long* sh, long long* total) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int n_warps = int(blockDim.x / 32);
    long long incl = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const long long t = __shfl_up_sync(kFull, incl, o);
        if (lane >= o) incl += t;
    }
    __syncthreads();
    if (lane == 31) sh[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        const long long w = lane < n_warps ? sh[lane] : 0;
        long long wi = w;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const long long t = __shfl_up_sync(kFull, wi, o);
            if (lane >= o) wi += t;
        }
        if (lane < n_warps) sh[lane] = wi - w;
        if (lane == 31) sh[32] = wi;
    }
    __syncthreads();
    *total = sh[32];
    return sh[warp] + incl - v;
}

// Block-wide (value, index) argmax: larger value wins, lower index on ties.
__device__ void block_argmax(float& v, int64_t& idx, float* sv, int64_t* si) {
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(kFull, v, o);
        const int64_t oi = __shfl_xor_sync(kFull, idx, o);
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
            const float ov = __shfl_xor_sync(kFull, v, o);
            const int64_t oi = __shfl_xor_sync(kFull, idx, o);
            if (ov > v || (ov == v && oi < idx)) v = ov, idx = oi;
        }
        if (lane == 0) sv[0] = v, si[0] = idx;
    }
    __syncthreads();
    v = sv[0], idx = si[0];
    __syncthreads();  // sv / si may be reused right away
}

// Argmax of the cleaned logits[n]; returns the index (0 when no logit is finite), the max
// (-inf then) via *max_out.
__device__ int64_t row_argmax(const float* logits, int64_t n, float* max_out) {
    __shared__ float sv[32];
    __shared__ int64_t si[32];
    float v = -INFINITY;
    int64_t idx = INT64_MAX;
    // Loads of 8 iterations in flight (the logits sit in L2): ~125 dependent L2 round trips
    // per thread for a 128k vocabulary otherwise. Ties keep the lowest id whatever the order.
#pragma unroll 8
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float x = clean_logit(logits[i]);
        if (x > v || (x == v && i < idx)) v = x, idx = i;
    }
    block_argmax(v, idx, sv, si);
    if (idx == INT64_MAX || v == -INFINITY) idx = 0;
    *max_out = v;
    return idx;
}

// Shared memory of one radix selection.
struct RadixShared {
    unsigned count[256];
    double weight[256];
    double stage[kSampleWarps][32];  // warp aggregation of weights
    uint32_t prefix;
    double above;
    unsigned n_at;
    int found;
};

struct Selected {
    bool found = false;  // false: the eligible elements do not reach the target
    uint32_t key = 0;    // the threshold key
    double above = 0;    // summed weight of the eligible elements with a larger key
    unsigned n_at = 0;   // eligible elements with exactly this key
};

// Radix selection over the finite logits of the row for which elig(i, key) holds: the
// largest key K with W(key >= K) >= target, W summing weight 1 (kWeighted false) or
// exp(logit - mx) (kWeighted true) over eligible elements. target > 0.
template <bool kWeighted, class Elig>
__device__ Selected radix_select(const float* row, int64_t n, float mx, double target, Elig elig,
                                 RadixShared& sh) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    uint32_t prefix = 0, mask = 0;
    double above = 0.0;
    Selected sel;
    for (int pass = 0; pass < 4; ++pass) {
        const int shift = 24 - 8 * pass;
        for (int b = threadIdx.x; b < 256; b += blockDim.x) sh.count[b] = 0, sh.weight[b] = 0.0;
        __syncthreads();
        for (int64_t base = 0; base < n; base += blockDim.x) {  // the same trip count per warp
            const int64_t i = base + threadIdx.x;
            int digit = -1;
            double w = 0.0;
            if (i < n) {
                const float l = clean_logit(row[i]);
                const uint32_t key = float_key(l);
                if (l != -INFINITY && (key & mask) == prefix && elig(i, key)) {
                    digit = int((key >> shift) & 0xffu);
                    if (kWeighted) w = exp(double(l) - double(mx));
                }
            }
            if (!__any_sync(kFull, digit >= 0)) continue;
            // One atomic per distinct digit of the warp (logits crowd into few digits).
            const unsigned peers = __match_any_sync(kFull, digit);
            const bool leader = digit >= 0 && lane == __ffs(peers) - 1;
            if (kWeighted) {
                if (peers == kFull) {
                    w = warp_sum_d(w);
                } else {
                    sh.stage[warp][lane] = w;
                    __syncwarp();
                    if (leader) {
                        w = 0.0;
                        for (unsigned m = peers; m; m &= m - 1) w += sh.stage[warp][__ffs(m) - 1];
                    }
                    __syncwarp();
                }
            }
            if (leader) {
                atomicAdd(&sh.count[digit], unsigned(__popc(peers)));
                if (kWeighted) atomicAdd(&sh.weight[digit], w);
            }
        }
        __syncthreads();
        if (warp == 0) {
            auto weight_of = [&](int b) { return kWeighted ? sh.weight[b] : double(sh.count[b]); };
            // Lane owns digits [8 * lane, 8 * lane + 8); suffix: digits >= 8 * lane.
            double own = 0.0;
            for (int b = 8 * lane + 7; b >= 8 * lane; --b) own += weight_of(b);
            double suffix = own;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const double t = __shfl_down_sync(kFull, suffix, o);
                if (lane + o < 32) suffix += t;
            }
            const double next = __shfl_down_sync(kFull, suffix, 1);
            const double above_lane = lane < 31 ? next : 0.0;  // digits >= 8 * (lane + 1)
            const bool reach = above + suffix >= target;
            const bool reach_next = above + above_lane >= target;
            const unsigned hits = __ballot_sync(kFull, reach && !reach_next);
            if (hits != 0 && lane == 31 - __clz(hits)) {
                double cum = above + above_lane;  // < target
                int digit = -1;
                for (int b = 8 * lane + 7; b >= 8 * lane; --b) {
                    const double c = cum + weight_of(b);
                    if (c >= target && sh.count[b] > 0) {
                        digit = b;
                        break;
                    }
                    cum = c;
                }
                if (digit < 0) {  // rounding: take the lane's lowest non-empty digit
                    cum = above + above_lane;
                    for (int b = 8 * lane + 7; b >= 8 * lane; --b) {
                        if (sh.count[b] == 0) continue;
                        if (digit >= 0) cum += weight_of(digit);
                        digit = b;
                    }
                }
                sh.found = digit >= 0;
                sh.prefix = prefix | (uint32_t(digit < 0 ? 0 : digit) << shift);
                sh.above = cum;
                sh.n_at = digit < 0 ? 0u : sh.count[digit];
            } else if (hits == 0 && lane == 0) {
                // Pass 0: the target is out of reach (keep everything). Later passes only
                // get here through rounding: take the lowest non-empty digit.
                int digit = -1;
                double cum = above;
                if (pass > 0)
                    for (int b = 255; b >= 0; --b) {
                        if (sh.count[b] == 0) continue;
                        if (digit >= 0) cum += weight_of(digit);
                        digit = b;
                    }
                sh.found = digit >= 0;
                sh.prefix = prefix | (uint32_t(digit < 0 ? 0 : digit) << shift);
                sh.above = cum;
                sh.n_at = digit < 0 ? 0u : sh.count[digit];
            }
        }
        __syncthreads();
        const bool found = sh.found;
        prefix = sh.prefix;
        above = sh.above;
        sel.n_at = sh.n_at;
        mask |= 0xffu << shift;
        __syncthreads();
        if (!found) return Selected{};
    }
    sel.found = true;
    sel.key = prefix;
    sel.above = above;
    return sel;
}

// The id of the m-th (1-based) finite element in id order for which pred(i, key) holds;
// n when there are fewer. Each thread counts a contiguous range, then one thread walks.
template <class Pred>
__device__ int64_t find_cut(const float* row, int64_t n, int64_t m, Pred pred) {
    __shared__ long long scan[33];
    __shared__ long long result;
    const int64_t per = cu::ceil_div(n, int64_t(blockDim.x));
    const int64_t lo = min(n, int64_t(threadIdx.x) * per), hi = min(n, lo + per);
    long long c = 0;
    for (int64_t i = lo; i < hi; ++i) {
        const float l = clean_logit(row[i]);
        if (l != -INFINITY && pred(i, float_key(l))) ++c;
    }
    if (threadIdx.x == 0) result = n;
    long long total;
    const long long excl = block_excl_scan(c, scan, &total);  // (synchronizes)
    if (excl < m && m <= excl + c) {
        long long k = excl;
        for (int64_t i = lo; i < hi; ++i) {
            const float l = clean_logit(row[i]);
            if (l != -INFINITY && pred(i, float_key(l)) && ++k == m) {
                result = i;
                break;
            }
        }
    }
    __syncthreads();
    const int64_t r = result;
    __syncthreads();
    return r;
}

// Tokens that survive top-k and top-p: key above the threshold, or at it with id <= cut.
struct Cut {
    uint32_t key = kMinFiniteKey;
    int64_t last_id = INT64_MAX;
    __device__ bool keeps(int64_t i, uint32_t k) const {
        return k > key || (k == key && i <= last_id);
    }
};

struct SampleArgs {
    int32_t* out;
    float* logits;  // [n_rows][n_vocab]; the penalty is applied in place
    int64_t n_vocab;
    const CudaSampleRow* rows;  // [n_rows], or null: `shared` for every row
    CudaSampleRow shared;
    const float* u_f32;  // when set: row r's uniform number is u_f32[r] (cuda_sample)
    const int32_t* penalty_ids;
};

// One block per row; see cuda_sample_rows.
__global__ void __launch_bounds__(kSampleThreads) sample_rows_kernel(SampleArgs a) {
    cu::pdl_begin();
    __shared__ RadixShared radix;
    __shared__ double red[32];
    __shared__ double bound[kSampleThreads];  // inclusive prefix of the threads' masses
    __shared__ unsigned long long pick, last_any;
    const int64_t n = a.n_vocab;
    CudaSampleRow cfg = a.rows ? a.rows[blockIdx.x] : a.shared;
    if (a.u_f32) cfg.u = double(a.u_f32[blockIdx.x]);
    float* row = a.logits + int64_t(blockIdx.x) * n;

    // Logit biases first (distinct ids; Sampler's rule: -inf stays, the sum stays finite).
    if (cfg.bias_count > 0) {
        for (int j = threadIdx.x; j < cfg.bias_count; j += blockDim.x) {
            const int64_t id = a.penalty_ids[cfg.bias_begin + j];
            if (id < 0 || id >= n) continue;
            const float l = clean_logit(row[id]);
            if (l == -INFINITY) continue;
            const float b = __int_as_float(a.penalty_ids[cfg.bias_begin + cfg.bias_count + j]);
            row[id] = fminf(l + b, FLT_MAX);  // a lone add: nothing to contract
        }
        __syncthreads();  // makes the block's global writes visible to the whole block
    }
    // Repetition, then frequency/presence penalties on the distinct ids (each thread its own
    // ids; Sampler's rule and rounding: the count's product is never contracted into an FMA).
    const bool counted = cfg.frequency_penalty != 0.0f || cfg.presence_penalty != 0.0f;
    if (cfg.penalty_count > 0 && (cfg.repeat_penalty != 1.0f || counted)) {
        for (int j = threadIdx.x; j < cfg.penalty_count; j += blockDim.x) {
            const int64_t id = a.penalty_ids[cfg.penalty_begin + j];
            if (id < 0 || id >= n) continue;
            float l = clean_logit(row[id]);
            if (l == -INFINITY) continue;
            l = l > 0.0f ? l / cfg.repeat_penalty : l * cfg.repeat_penalty;
            if (counted) {
                const float c = float(a.penalty_ids[cfg.penalty_begin + cfg.penalty_count + j]);
                const float sub = __fmul_rn(c, cfg.frequency_penalty) + cfg.presence_penalty;
                l = fminf(fmaxf(l - sub, -FLT_MAX), FLT_MAX);
            }
            row[id] = l;
        }
        __syncthreads();  // makes the block's global writes visible to the whole block
    }

    float mx;
    const int64_t best = row_argmax(row, n, &mx);
    if (mx == -INFINITY) {  // nothing finite: Sampler throws, the host reports it
        if (threadIdx.x == 0) a.out[blockIdx.x] = -1;
        return;
    }
    // Greedy, and filters that leave only the argmax (top-k 1, top-p 0).
    if (cfg.temperature <= 0.0f || cfg.top_k == 1 || cfg.top_p <= 0.0f) {
        if (threadIdx.x == 0) a.out[blockIdx.x] = int32_t(best);
        return;
    }

    // top-k: the k best by (logit, then lower id).
    Cut top_k;
    if (cfg.top_k > 0 && cfg.top_k < n) {
        const Selected s = radix_select<false>(
            row, n, mx, double(cfg.top_k), [](int64_t, uint32_t) { return true; }, radix);
        if (s.found) {
            top_k.key = s.key;
            const int64_t m = int64_t(cfg.top_k) - int64_t(s.above);  // ties to keep, >= 1
            if (m < int64_t(s.n_at))
                top_k.last_id =
                    find_cut(row, n, m, [&](int64_t, uint32_t k) { return k == s.key; });
        }
    }
    // top-p over the top-k survivors in the same order, weights exp(logit - max).
    Cut top_p;
    if (cfg.top_p < 1.0f) {
        double z = 0.0;
#pragma unroll 8  // loads in flight; the sum keeps its order
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            const float l = clean_logit(row[i]);
            if (l != -INFINITY && top_k.keeps(i, float_key(l))) z += exp(double(l) - double(mx));
        }
        z = block_sum_d(z, red);
        const double target = double(cfg.top_p) * z;
        const Selected s = radix_select<true>(
            row, n, mx, target, [&](int64_t i, uint32_t k) { return top_k.keeps(i, k); }, radix);
        if (s.found) {
            top_p.key = s.key;
            // Elements at the threshold all weigh w: keep the fewest that reach the target.
            const double w = exp(double(key_float(s.key)) - double(mx));
            const double need = w > 0.0 ? (target - s.above) / w : double(s.n_at);
            int64_t m = int64_t(s.n_at);
            if (need < double(s.n_at)) m = need <= 1.0 ? 1 : int64_t(ceil(need));
            if (m < int64_t(s.n_at))
                top_p.last_id = find_cut(row, n, m, [&](int64_t i, uint32_t k) {
                    return k == s.key && top_k.keeps(i, k);
                });
        }
    }
    // min-p: logit >= max + log(min_p), in double like Sampler (the max always passes).
    const bool use_min_p = cfg.min_p > 0.0f;
    const double min_logit = double(mx) + double(cfg.log_min_p);
    auto kept = [&](int64_t i, float l) {
        if (l == -INFINITY) return false;
        const uint32_t k = float_key(l);
        return top_k.keeps(i, k) && top_p.keeps(i, k) && (!use_min_p || double(l) >= min_logit);
    };

    // Temperature: Sampler's float probabilities float(float(e) / z), e = exp((l - max) / t).
    const double inv_t = 1.0 / double(cfg.temperature);
    double z = 0.0;
#pragma unroll 8  // loads in flight; the sum keeps its order
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float l = clean_logit(row[i]);
        if (kept(i, l)) z += exp((double(l) - double(mx)) * inv_t);
    }
    z = block_sum_d(z, red);
    auto prob = [&](float l) {
        return float(double(float(exp((double(l) - double(mx)) * inv_t))) / z);
    };
    // Inverse CDF in vocabulary order: each thread owns a contiguous range.
    const int64_t per = cu::ceil_div(n, int64_t(blockDim.x));
    const int64_t lo = min(n, int64_t(threadIdx.x) * per), hi = min(n, lo + per);
    double own = 0.0;
    int64_t last_pos = -1;
#pragma unroll 8
    for (int64_t i = lo; i < hi; ++i) {
        const float l = clean_logit(row[i]);
        if (!kept(i, l)) continue;
        const float p = prob(l);
        if (p > 0.0f) own += double(p), last_pos = i;
    }
    if (threadIdx.x == 0) pick = ~0ull, last_any = 0;
    // Inclusive prefix over the threads: warp scans, then the warp totals.
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    double incl = own;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const double t = __shfl_up_sync(kFull, incl, o);
        if (lane >= o) incl += t;
    }
    __syncthreads();  // red was last read by block_sum_d
    if (lane == 31) red[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        const double w = lane < int(blockDim.x / 32) ? red[lane] : 0.0;
        double wi = w;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const double t = __shfl_up_sync(kFull, wi, o);
            if (lane >= o) wi += t;
        }
        const double prev = __shfl_up_sync(kFull, wi, 1);
        red[lane] = lane > 0 ? prev : 0.0;  // exclusive warp offsets
    }
    __syncthreads();
    bound[threadIdx.x] = warp > 0 ? red[warp] + incl : incl;
    __syncthreads();
    if (last_pos >= 0) atomicMax(&last_any, (unsigned long long)(last_pos + 1));
    const double total = bound[blockDim.x - 1];
    const double target = cfg.u * total;
    const double excl = threadIdx.x > 0 ? bound[threadIdx.x - 1] : 0.0;
    // The thread whose mass interval [excl, bound) holds the target walks its range.
    if (own > 0.0 && excl <= target && target < bound[threadIdx.x]) {
        double part = 0.0;
        int64_t found = last_pos;  // rounding fallback: the range's last candidate
        for (int64_t i = lo; i < hi; ++i) {
            const float l = clean_logit(row[i]);
            if (!kept(i, l)) continue;
            const float p = prob(l);
            if (!(p > 0.0f)) continue;
            part += double(p);
            if (target < excl + part) {
                found = i;
                break;
            }
        }
        atomicMin(&pick, (unsigned long long)found);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        // No interval holds the target only when rounding put it at the very end.
        const int64_t tok = pick != ~0ull ? int64_t(pick) : last_any ? int64_t(last_any) - 1 : best;
        a.out[blockIdx.x] = int32_t(tok);
    }
}

__global__ void argmax_kernel(int32_t* __restrict__ out, const float* __restrict__ logits,
                              int64_t n_vocab) {
    cu::pdl_begin();
    float mx;
    const int64_t idx = row_argmax(logits + int64_t(blockIdx.x) * n_vocab, n_vocab, &mx);
    if (threadIdx.x == 0) out[blockIdx.x] = int32_t(idx);
}

// One thread per history entry; the first occurrence of each id applies the penalty.
__global__ void repeat_penalty_kernel(float* __restrict__ logits, int64_t n_vocab,
                                      const int32_t* __restrict__ tokens, int64_t n_tokens,
                                      float penalty) {
    cu::pdl_begin();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_tokens) return;
    const int32_t tok = tokens[i];
    if (tok < 0 || tok >= n_vocab) return;
    for (int64_t j = 0; j < i; ++j)
        if (tokens[j] == tok) return;
    const float l = logits[tok];
    logits[tok] = l > 0.0f ? l / penalty : l * penalty;
}

void launch_sample_rows(const SampleArgs& a, int64_t n_rows, cudaStream_t s) {
    CUDA_REQUIRE(a.n_vocab > 0 && a.n_vocab <= INT32_MAX && n_rows >= 0 && n_rows <= INT32_MAX,
                 "cuda_sample: bad shape");
    if (n_rows == 0) return;
    cu::launch_pdl(sample_rows_kernel, unsigned(n_rows), kSampleThreads, 0, s, a);
}

}  // namespace

void cuda_argmax(int32_t* out, const float* logits, int64_t n_rows, int64_t n_vocab,
                 cudaStream_t s) {
    CUDA_REQUIRE(n_vocab > 0 && n_vocab <= INT32_MAX && n_rows >= 0 && n_rows <= INT32_MAX,
                 "cuda_argmax: bad shape");
    if (n_rows == 0) return;
    cu::launch_pdl(argmax_kernel, unsigned(n_rows), 256, 0, s, out, logits, n_vocab);
}

void cuda_sample(int32_t* out, const float* logits, int64_t n_rows, int64_t n_vocab,
                 const CudaSamplerConfig& cfg, const float* u, cudaStream_t s) {
    CUDA_REQUIRE(cfg.min_p <= 1.0f && cfg.top_p >= 0.0f, "cuda_sample: bad filter parameters");
    SampleArgs a{};
    a.out = out;
    a.logits = const_cast<float*>(logits);  // written only by the penalty, which is off here
    a.n_vocab = n_vocab;
    a.rows = nullptr;
    a.shared.temperature = cfg.temperature;
    a.shared.top_k = cfg.top_k;
    a.shared.top_p = cfg.top_p;
    a.shared.min_p = cfg.min_p;
    a.shared.log_min_p = cfg.min_p > 0.0f ? std::log(cfg.min_p) : 0.0f;
    a.u_f32 = u;
    launch_sample_rows(a, n_rows, s);
}

void cuda_sample_rows(int32_t* out, float* logits, int64_t n_rows, int64_t n_vocab,
                      const CudaSampleRow* rows, const int32_t* penalty_ids, cudaStream_t s) {
    CUDA_REQUIRE(rows != nullptr, "cuda_sample_rows: no row parameters");
    SampleArgs a{};
    a.out = out;
    a.logits = logits;
    a.n_vocab = n_vocab;
    a.rows = rows;
    a.penalty_ids = penalty_ids;
    launch_sample_rows(a, n_rows, s);
}

void cuda_repeat_penalty(float* logits, int64_t n_vocab, const int32_t* tokens, int64_t n_tokens,
                         float penalty, cudaStream_t s) {
    CUDA_REQUIRE(penalty > 0.0f, "cuda_repeat_penalty: penalty must be positive");
    if (n_tokens <= 0 || penalty == 1.0f) return;
    cu::launch_pdl(repeat_penalty_kernel, unsigned(cu::ceil_div(n_tokens, 256)), 256, 0, s, logits,
                   n_vocab, tokens, n_tokens, penalty);
}

}  // namespace kvrun
