// Mixture of experts: the router's top-k choice per token and the weighted sum of the chosen
// experts' outputs. The experts' products themselves are expert-indexed GEMVs (gemv.cu), so
// the expert ids never leave the device and a decode step stays one CUDA graph.
#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/ops.h"

namespace kvrun {
namespace {

constexpr int kTopkThreads = 32;  // one warp per token

// One warp per token: k rounds of a warp-wide argmax over the logits not yet taken (ties:
// the lower id), then the weights exp(l - l_max) over their sum (the softmax denominator
// cancels in the renormalization). taken: [n_expert] flags in dynamic shared memory.
__global__ void moe_topk_kernel(const float* __restrict__ logits, int n_expert, int k,
                                int32_t* __restrict__ ids, float* __restrict__ weights) {
    extern __shared__ unsigned char taken[];
    const int lane = threadIdx.x;
    const int64_t t = blockIdx.x;
    const float* l = logits + t * n_expert;
    for (int e = lane; e < n_expert; e += kTopkThreads) taken[e] = 0;
    __syncwarp();
    float best_first = 0.0f, sum = 0.0f;
    for (int j = 0; j < k; ++j) {
        float bv = -INFINITY;
        int bi = n_expert;
        for (int e = lane; e < n_expert; e += kTopkThreads) {
            const float v = l[e];
            if (!taken[e] && (v > bv || (v == bv && e < bi))) bv = v, bi = e;
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
        }
        const bool found = bi < n_expert;  // false only when every logit left is NaN
        if (j == 0) best_first = bv;
        const float p = found ? expf(bv - best_first) : 0.0f;
        sum += p;
        if (lane == 0) {
            if (found) taken[bi] = 1;
            ids[t * k + j] = found ? bi : 0;
            weights[t * k + j] = p;
        }
        __syncwarp();
    }
    for (int j = lane; j < k; j += kTopkThreads) weights[t * k + j] /= sum > 0.0f ? sum : 1.0f;
}

__global__ void moe_combine_kernel(float* __restrict__ out, const float* __restrict__ rows,
                                   const float* __restrict__ weights, int64_t n, int k,
                                   int64_t dim) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int64_t t = i / dim, d = i % dim;
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) acc = fmaf(weights[t * k + j], rows[(t * k + j) * dim + d], acc);
    out[i] = acc;
}

}  // namespace

void cuda_moe_topk(const float* logits, int64_t n_tokens, int64_t n_expert, int64_t k, int32_t* ids,
                   float* weights, cudaStream_t s) {
    CUDA_REQUIRE(n_expert >= 1 && n_expert <= 4096 && k >= 1 && k <= n_expert,
                 "cuda_moe_topk: need 1 <= k <= n_expert <= 4096");
    if (n_tokens <= 0) return;
    moe_topk_kernel<<<unsigned(n_tokens), kTopkThreads, size_t(n_expert), s>>>(
        logits, int(n_expert), int(k), ids, weights);
    CUDA_CHECK_LAUNCH();
}

void cuda_moe_combine(float* out, const float* rows, const float* weights, int64_t n_tokens,
                      int64_t k, int64_t dim, cudaStream_t s) {
    const int64_t n = n_tokens * dim;
    if (n <= 0) return;
    moe_combine_kernel<<<unsigned(cu::ceil_div(n, 256)), 256, 0, s>>>(out, rows, weights, n, int(k),
                                                                      dim);
    CUDA_CHECK_LAUNCH();
}

}  // namespace kvrun
