// Mixture of experts: the router's top-k choice per token and the weighted sum of the chosen
// experts' outputs. Decode-sized batches multiply by expert-indexed GEMVs (gemv.cu), so the
// expert ids never leave the device and a decode step stays one CUDA graph; prefill groups
// the tokens by expert on the host (cuda_moe_ffn_grouped) so each expert's weights are read
// once per pass and large groups run on tensor cores.
#include <cstdint>
#include <vector>

#include "cuda/common.cuh"
#include "cuda/ops.h"

namespace kvrun {
namespace {

constexpr int kTopkThreads = 32;  // one warp per token

// One warp per token: k rounds of a warp-wide argmax over the experts not yet taken (ties:
// the lower id), then the weights. Softmax: exp(l - l_max) over their sum (the softmax
// denominator cancels in the renormalization); with a selection bias, or without the
// renormalization (OLMoE), the weight is the probability itself (the choice by the probability
// + bias), so the denominator is summed first. Sigmoid: the choice by sigmoid(l) + bias, the
// weight sigmoid(l). Over their sum when norm, then times scale. taken: [n_expert] flags in
// dynamic shared memory.
__global__ void moe_topk_kernel(const float* __restrict__ logits, int n_expert, int k,
                                int32_t* __restrict__ ids, float* __restrict__ weights,
                                MoeRouting r) {
    cu::pdl_begin();
    extern __shared__ unsigned char taken[];
    const int lane = threadIdx.x;
    const int64_t t = blockIdx.x;
    const float* l = logits + t * n_expert;
    for (int e = lane; e < n_expert; e += kTopkThreads) taken[e] = 0;
    __syncwarp();
    // The gate of expert e: its sigmoid, or (softmax with a selection bias, unnormalized, or
    // with expert groups, which sum probabilities) its probability.
    const bool grouped = r.n_group > 1 && r.n_group_used < r.n_group;
    const bool gated = r.sigmoid || r.select_bias || !r.norm || grouped;
    float mx = -INFINITY, z = 0.0f;
    if (!r.sigmoid && gated) {
        for (int e = lane; e < n_expert; e += kTopkThreads) mx = fmaxf(mx, l[e]);
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        for (int e = lane; e < n_expert; e += kTopkThreads) z += expf(l[e] - mx);
        for (int o = 16; o > 0; o >>= 1) z += __shfl_xor_sync(0xffffffffu, z, o);
    }
    auto gate = [&](int e) {
        return r.sigmoid ? 1.0f / (1.0f + expf(-l[e])) : expf(l[e] - mx) / z;
    };
    auto choice = [&](int e) {
        return gated ? gate(e) + (r.select_bias ? r.select_bias[e] : 0.0f) : l[e];
    };
    if (grouped) {
        // Lane g scores group g by its two best choice values; the n_group_used best groups
        // (ties: the lower group) stay, the experts of the others are taken out.
        const int per = n_expert / r.n_group;
        float score = -INFINITY;
        if (lane < r.n_group) {
            float best = -INFINITY, second = -INFINITY;
            for (int e = lane * per; e < (lane + 1) * per; ++e) {
                const float v = choice(e);
                if (v > best)
                    second = best, best = v;
                else if (v > second)
                    second = v;
            }
            score = per > 1 ? best + second : best;
        }
        unsigned keep = 0;
        for (int i = 0; i < r.n_group_used; ++i) {
            const bool out = ((keep >> lane) & 1u) != 0 || lane >= r.n_group;
            float bv = out ? -INFINITY : score;
            int bg = out ? kTopkThreads : lane;
            for (int o = 16; o > 0; o >>= 1) {
                const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
                const int og = __shfl_xor_sync(0xffffffffu, bg, o);
                if (ov > bv || (ov == bv && og < bg)) bv = ov, bg = og;
            }
            if (bg == kTopkThreads)  // every score left is NaN: the lowest group not kept
                bg = __ffs(~keep) - 1;
            keep |= 1u << bg;
        }
        for (int e = lane; e < n_expert; e += kTopkThreads)
            if (!((keep >> (e / per)) & 1u)) taken[e] = 1;
        __syncwarp();
    }
    float best_first = 0.0f, sum = 0.0f;
    for (int j = 0; j < k; ++j) {
        float bv = -INFINITY;
        int bi = n_expert;
        for (int e = lane; e < n_expert; e += kTopkThreads) {
            const float v = choice(e);
            if (!taken[e] && (v > bv || (v == bv && e < bi))) bv = v, bi = e;
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
        }
        const bool found = bi < n_expert;  // false only when every value left is NaN
        if (j == 0) best_first = bv;
        const float p = !found ? 0.0f : gated ? gate(bi) : expf(bv - best_first);
        sum += p;
        if (lane == 0) {
            if (found) taken[bi] = 1;
            ids[t * k + j] = found ? bi : 0;
            weights[t * k + j] = p;
        }
        __syncwarp();
    }
    const float div = r.norm && sum > 0.0f ? sum : 1.0f;
    for (int j = lane; j < k; j += kTopkThreads)
        weights[t * k + j] = weights[t * k + j] / div * r.scale;
}

__global__ void moe_combine_kernel(float* __restrict__ out, const float* __restrict__ rows,
                                   const float* __restrict__ weights,
                                   const int32_t* __restrict__ row_of, int64_t n, int k,
                                   int64_t dim) {
    cu::pdl_begin();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int64_t t = i / dim, d = i % dim;
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) {
        const int64_t r = row_of ? int64_t(row_of[t * k + j]) : t * k + j;
        acc = fmaf(weights ? weights[t * k + j] : 1.0f, rows[r * dim + d], acc);
    }
    out[i] = acc;
}

// Llama 4's weighted expert inputs, one thread per element. Decode: out[j] = weights[j] *
// x[j / k] (pos null); grouped: row pos[j] of out scaled by weights[j] in place.
__global__ void moe_weight_rows_kernel(float* __restrict__ out, const float* __restrict__ x,
                                       const float* __restrict__ weights,
                                       const int32_t* __restrict__ pos, int64_t n, int k,
                                       int64_t dim) {
    cu::pdl_begin();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int64_t j = i / dim, d = i % dim;
    if (pos)
        out[int64_t(pos[j]) * dim + d] *= weights[j];
    else
        out[i] = weights[j] * x[(j / k) * dim + d];
}

}  // namespace

void cuda_moe_weight_rows(float* out, const float* x, const float* weights, int64_t n_jobs,
                          int64_t k, int64_t dim, cudaStream_t s, const int32_t* pos) {
    const int64_t n = n_jobs * dim;
    if (n <= 0) return;
    CUDA_REQUIRE(pos || (x && out != x), "cuda_moe_weight_rows: out must not alias x");
    cu::launch_pdl(moe_weight_rows_kernel, unsigned(cu::ceil_div(n, 256)), 256, 0, s, out, x,
                   weights, pos, n, int(k), dim);
}

void cuda_moe_topk(const float* logits, int64_t n_tokens, int64_t n_expert, int64_t k, int32_t* ids,
                   float* weights, cudaStream_t s, const MoeRouting& r) {
    CUDA_REQUIRE(n_expert >= 1 && n_expert <= 4096 && k >= 1 && k <= n_expert,
                 "cuda_moe_topk: need 1 <= k <= n_expert <= 4096");
    if (r.n_group > 1 && r.n_group_used < r.n_group)
        CUDA_REQUIRE(r.n_group <= kCudaMoeMaxGroups && r.n_group_used >= 1 &&
                         n_expert % r.n_group == 0 && k <= r.n_group_used * (n_expert / r.n_group),
                     "cuda_moe_topk: expert groups need n_group <= 32 dividing n_expert and k "
                     "experts in the groups used");
    if (n_tokens <= 0) return;
    cu::launch_pdl(moe_topk_kernel, unsigned(n_tokens), kTopkThreads, size_t(n_expert), s, logits,
                   int(n_expert), int(k), ids, weights, r);
}

void cuda_moe_combine(float* out, const float* rows, const float* weights, int64_t n_tokens,
                      int64_t k, int64_t dim, cudaStream_t s, const int32_t* row_of) {
    const int64_t n = n_tokens * dim;
    if (n <= 0) return;
    cu::launch_pdl(moe_combine_kernel, unsigned(cu::ceil_div(n, 256)), 256, 0, s, out, rows,
                   weights, row_of, n, int(k), dim);
}

void cuda_moe_experts_biased(float* out, float* h, float* up, const float* x, const int32_t* ids,
                             int64_t n_jobs, int x_div, const MoeExperts& ex, cudaStream_t s) {
    CUDA_REQUIRE(ex.gate_b && ex.up_b && ex.down_b, "cuda_moe_experts_biased: missing biases");
    const int64_t D = ex.gate0.n_in, F = ex.gate0.n_out;
    cuda_gemv_experts(h, x, ex.gate0, ex.expert_bytes, ids, n_jobs, x_div, s, nullptr, ex.gate_s);
    cuda_gemv_experts(up, x, ex.up0, ex.expert_bytes, ids, n_jobs, x_div, s, nullptr, ex.up_s);
    cuda_add_bias_rows(h, ex.gate_b, ids, n_jobs, F, s);
    cuda_add_bias_rows(up, ex.up_b, ids, n_jobs, F, s);
    if (ex.swiglu_oai)
        cuda_swiglu_oai(h, h, up, n_jobs * F, ex.alpha, ex.limit, s);
    else
        cuda_swiglu(h, h, up, n_jobs * F, s);
    cuda_gemv_experts(out, h, ex.down0, ex.down_bytes, ids, n_jobs, 1, s, nullptr, ex.down_s);
    cuda_add_bias_rows(out, ex.down_b, ids, n_jobs, D, s);
}

void cuda_moe_ffn_grouped(float* out, const float* x, const int32_t* ids, const float* weights,
                          int64_t n_tokens, int64_t k, int64_t n_expert, const MoeExperts& ex,
                          const MoeGroupedBuffers& buf, CudaScratch& scratch, cudaStream_t s,
                          bool weight_inputs) {
    CUDA_REQUIRE(n_expert >= 1 && k >= 1 && k <= n_expert, "cuda_moe_ffn_grouped: bad k");
    CUDA_REQUIRE(ex.down0.n_in == ex.gate0.n_out && ex.up0.n_out == ex.gate0.n_out &&
                     ex.up0.n_in == ex.gate0.n_in && ex.down0.n_out == ex.gate0.n_in,
                 "cuda_moe_ffn_grouped: expert shapes do not chain");
    const int64_t n_jobs = n_tokens * k, D = ex.gate0.n_in, F = ex.gate0.n_out;
    if (n_jobs <= 0) return;
    CUDA_REQUIRE(n_jobs <= INT32_MAX, "cuda_moe_ffn_grouped: too many tokens");
    // The router's choice on the host (the one synchronization of the pass).
    std::vector<int32_t> job_expert(static_cast<size_t>(n_jobs));
    CUDA_CHECK(cudaMemcpyAsync(job_expert.data(), ids, size_t(n_jobs) * sizeof(int32_t),
                               cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    // Counting sort of the jobs (token t's j-th expert is job t * k + j) by expert, stable:
    // map[i] = the token of the i-th job in expert order, map[n_jobs + job] = its position.
    std::vector<int64_t> first(static_cast<size_t>(n_expert) + 1, 0);
    for (int32_t e : job_expert) {
        CUDA_REQUIRE(e >= 0 && e < n_expert, "cuda_moe_ffn_grouped: expert id out of range");
        ++first[size_t(e) + 1];
    }
    for (int64_t e = 0; e < n_expert; ++e) first[size_t(e + 1)] += first[size_t(e)];
    std::vector<int32_t> map(static_cast<size_t>(2 * n_jobs));
    std::vector<int64_t> next(first.begin(), first.end() - 1);
    for (int64_t job = 0; job < n_jobs; ++job) {
        const int64_t i = next[size_t(job_expert[size_t(job)])]++;
        map[size_t(i)] = int32_t(job / k);
        map[size_t(n_jobs + job)] = int32_t(i);
    }
    // Pageable source: the call returns once the bytes are staged, so map may go out of scope.
    CUDA_CHECK(cudaMemcpyAsync(buf.map, map.data(), map.size() * sizeof(int32_t),
                               cudaMemcpyHostToDevice, s));
    cuda_gather_rows(buf.xs, x, buf.map, n_jobs, D, s);
    if (weight_inputs)
        cuda_moe_weight_rows(buf.xs, nullptr, weights, n_jobs, k, D, s, buf.map + n_jobs);
    for (int64_t e = 0; e < n_expert; ++e) {
        const int64_t i0 = first[size_t(e)], n = first[size_t(e + 1)] - i0;
        if (n == 0) continue;
        auto expert = [e](WeightView w, size_t bytes, const std::vector<float>& scales) {
            w.data = static_cast<const uint8_t*>(w.data) + size_t(e) * bytes;
            if (!scales.empty()) w.scale = scales[size_t(e)];
            return w;
        };
        float* xs = buf.xs + i0 * D;
        float* h = buf.h + i0 * F;
        float* up = buf.up + i0 * F;
        if (ex.gate_b) {  // gpt-oss: biases between the products and the clamped activation
            cuda_matmul(h, xs, expert(ex.gate0, ex.expert_bytes, ex.gate_s_host), n, scratch, s);
            cuda_matmul(up, xs, expert(ex.up0, ex.expert_bytes, ex.up_s_host), n, scratch, s);
            cuda_add_bias(h, ex.gate_b + e * F, n, F, s);
            cuda_add_bias(up, ex.up_b + e * F, n, F, s);
            if (ex.swiglu_oai)
                cuda_swiglu_oai(h, h, up, n * F, ex.alpha, ex.limit, s);
            else
                cuda_swiglu(h, h, up, n * F, s);
        } else {
            cuda_matmul_swiglu(h, up, xs, expert(ex.gate0, ex.expert_bytes, ex.gate_s_host),
                               expert(ex.up0, ex.expert_bytes, ex.up_s_host), n, scratch, s);
        }
        // The expert's outputs replace its inputs (their last reader, the lines above, run
        // first on the stream).
        cuda_matmul(xs, h, expert(ex.down0, ex.down_bytes, ex.down_s_host), n, scratch, s);
        if (ex.down_b) cuda_add_bias(xs, ex.down_b + e * D, n, D, s);
    }
    cuda_moe_combine(out, buf.xs, weight_inputs ? nullptr : weights, n_tokens, k, D, s,
                     buf.map + n_jobs);
}

}  // namespace kvrun
