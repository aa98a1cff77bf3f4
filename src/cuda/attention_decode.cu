// Paged attention for few tokens (decode steps): one thread block per (token, KV head,
// context split), serving all query heads of the GQA group from one load of each KV tile.
// Long contexts are split across blocks (split-K) so the GPU stays busy even for one
// sequence; a second kernel merges the partial results with log-sum-exp weights.
//
// The splits start at fixed slots (multiples of a length that depends only on the pool), not
// at a fraction of the batch's longest context: a token's partial sums, their merge and so
// its output are then the same bit for bit whatever else is in the batch. A speculative
// verification pass over K + 1 tokens thus reproduces K + 1 single-token decode steps.
#include <cuda_runtime_api.h>

#include <algorithm>

#include "cuda/attention.cuh"
#include "cuda/ops.h"

namespace kvrun {
namespace {

constexpr int kDecodeRowsPerWarp = 2;     // 8 query heads per block
constexpr int64_t kSplitSlots = 128;      // context slots per split (pools up to 128 Ki slots)
constexpr int64_t kMaxSplits = 1024;      // larger pools get proportionally longer splits
constexpr int64_t kMaxDecodeTokens = 16;  // cuda_paged_attention: decode kernel up to here

// Context slots per split: a function of the pool alone (see the top of the file). 128 slots
// give a 4096-token context 32 splits per KV head: several waves of blocks on an H100 even
// for one sequence of an 8-KV-head model.
int64_t split_len_for(const KvLayerView& kv) {
    const int64_t pool_slots = kv.n_blocks * kv.block_size;
    const int64_t len = std::max(kSplitSlots, cu::ceil_div(pool_slots, kMaxSplits));
    return cu::ceil_div(len, cu::kAttnTile) * cu::kAttnTile;
}

// part_o: [n_splits][n_tokens][n_head][D], part_ml: [n_splits][n_tokens][n_head][2];
// out: [n_tokens][n_head][D]. Token t uses splits 0 .. slot / split_len (the others are
// empty for it). One thread per output element.
__global__ void merge_splits_kernel(float* __restrict__ out, const float* __restrict__ part_o,
                                    const float* __restrict__ part_ml,
                                    const int32_t* __restrict__ token_slot, int64_t n_tokens,
                                    int n_head, int D, int n_splits, int64_t split_len) {
    const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= n_tokens * n_head * D) return;
    const int64_t row = idx / D, t = row / n_head;
    const int64_t slot = token_slot[t];
    const int nz = int(min(int64_t(n_splits), max(int64_t(0), slot) / split_len + 1));
    const int64_t stride = n_tokens * n_head;
    float mx = -INFINITY;
    for (int z = 0; z < nz; ++z) mx = fmaxf(mx, part_ml[(z * stride + row) * 2]);
    float num = 0.0f, den = 0.0f;
    if (mx != -INFINITY) {
        for (int z = 0; z < nz; ++z) {
            const float w = expf(part_ml[(z * stride + row) * 2] - mx);
            den += w * part_ml[(z * stride + row) * 2 + 1];
            num += w * part_o[z * stride * D + idx];
        }
    }
    // num * (1 / den), as the unsplit kernel scales its sum: a token whose context lies in
    // one split (w = 1) then gets the same bits from either path.
    out[idx] = den > 0.0f ? num * (1.0f / den) : 0.0f;
}

}  // namespace

void cuda_paged_attention_decode(float* out, const float* q, const KvLayerView& kv,
                                 const KvBatchView& batch, int64_t n_head, float scale,
                                 CudaScratch& scratch, cudaStream_t s) {
    cu::AttnParams p = cu::attn_params(out, q, kv, batch, n_head, scale,
                                       cu::kAttnWarps * kDecodeRowsPerWarp, true);
    if (p.n_tokens == 0) return;
    const int64_t ctx = batch.max_blocks_per_seq * kv.block_size;
    const int64_t split_len = split_len_for(kv);
    const int64_t n_splits = cu::ceil_div(ctx, split_len);
    if (n_splits <= 1) {  // every token lies in the first split: one pass, no merge
        cu::attn_launch<kDecodeRowsPerWarp>(p, 1, s);
        return;
    }
    p.split_len = split_len;
    const size_t rows = size_t(n_splits) * size_t(p.n_tokens) * size_t(p.n_head);
    const size_t o_bytes = (rows * p.head_dim * sizeof(float) + 255) / 256 * 256;
    auto* base = static_cast<uint8_t*>(scratch.get(o_bytes + rows * 2 * sizeof(float), s));
    p.part_o = reinterpret_cast<float*>(base);
    p.part_ml = reinterpret_cast<float*>(base + o_bytes);
    cu::attn_launch<kDecodeRowsPerWarp>(p, int(n_splits), s);
    const int64_t n_out = p.n_tokens * p.n_head * p.head_dim;
    merge_splits_kernel<<<unsigned(cu::ceil_div(n_out, 256)), 256, 0, s>>>(
        out, p.part_o, p.part_ml, batch.token_slot, p.n_tokens, p.n_head, p.head_dim, int(n_splits),
        p.split_len);
    CUDA_CHECK_LAUNCH();
}

void cuda_paged_attention(float* out, const float* q, const KvLayerView& kv,
                          const KvBatchView& batch, int64_t n_head, float scale,
                          CudaScratch& scratch, cudaStream_t s) {
    if (batch.n_tokens <= kMaxDecodeTokens)
        cuda_paged_attention_decode(out, q, kv, batch, n_head, scale, scratch, s);
    else
        cuda_paged_attention_prefill(out, q, kv, batch, n_head, scale, s);
}

}  // namespace kvrun
