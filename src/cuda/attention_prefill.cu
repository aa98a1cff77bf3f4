// Paged attention for many tokens (prompt prefill, chunked prefill, speculative
// verification): flash-style query tiles of up to 32 (token, head) rows per thread block,
// so each K/V tile gathered from the paged pools serves every query of the tile.
#include "cuda/attention.cuh"
#include "cuda/ops.h"

namespace kvrun {

namespace {
constexpr int kPrefillRowsPerWarp = 8;  // 32 query rows per block
}

void cuda_paged_attention_prefill(float* out, const float* q, const KvLayerView& kv,
                                  const KvBatchView& batch, int64_t n_head, float scale,
                                  cudaStream_t s, float softcap, int64_t window,
                                  const float* sinks) {
    const cu::AttnParams p =
        cu::attn_params(out, q, kv, batch, n_head, scale, cu::kAttnWarps * kPrefillRowsPerWarp,
                        false, softcap, window, sinks);
    if (p.n_tokens == 0) return;
    cu::attn_launch<kPrefillRowsPerWarp>(p, 1, s);
}

}  // namespace kvrun
