// Writes a batch's new K and V rows into the paged cache pools ([n_blocks][n_kv_head]
// [block_size][head_dim] per layer): one thread per element, the physical block looked up
// in the sequence's block table. F32 and F16 pools; quantized pools get their own store.
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/ops.h"

namespace kvrun {
namespace {

// Element offset of (slot, kv head h, dim d) of token t's sequence, or -1 when the block
// table entry is invalid (the host validates tables; the kernel just refuses to scribble).
__device__ __forceinline__ int64_t kv_offset(const int32_t* __restrict__ token_seq,
                                             const int32_t* __restrict__ token_slot,
                                             const int32_t* __restrict__ block_table,
                                             int64_t max_blocks_per_seq, int64_t n_blocks,
                                             int64_t n_kv_head, int64_t block_size,
                                             int64_t head_dim, int64_t t, int64_t h) {
    const int64_t seq = token_seq[t], slot = token_slot[t];
    if (seq < 0 || slot < 0 || slot / block_size >= max_blocks_per_seq) return -1;
    const int64_t pb = block_table[seq * max_blocks_per_seq + slot / block_size];
    if (pb < 0 || pb >= n_blocks) return -1;
    return ((pb * n_kv_head + h) * block_size + slot % block_size) * head_dim;
}

template <class T>
__device__ __forceinline__ void store(T* p, float v);
template <>
__device__ __forceinline__ void store<float>(float* p, float v) {
    *p = v;
}
template <>
__device__ __forceinline__ void store<__half>(__half* p, float v) {
    *p = __float2half_rn(v);
}

// src: [n_tokens][n_kv_head][head_dim] -> pool of T; one thread per element.
template <class T>
__global__ void kv_write_kernel(T* __restrict__ pool, const float* __restrict__ src,
                                const int32_t* __restrict__ token_seq,
                                const int32_t* __restrict__ token_slot,
                                const int32_t* __restrict__ block_table, int64_t max_blocks_per_seq,
                                int64_t n_tokens, int64_t n_blocks, int64_t n_kv_head,
                                int64_t block_size, int64_t head_dim) {
    const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= n_tokens * n_kv_head * head_dim) return;
    const int64_t d = idx % head_dim, th = idx / head_dim;
    const int64_t h = th % n_kv_head, t = th / n_kv_head;
    const int64_t off = kv_offset(token_seq, token_slot, block_table, max_blocks_per_seq, n_blocks,
                                  n_kv_head, block_size, head_dim, t, h);
    if (off >= 0) store<T>(pool + off + d, src[idx]);
}

void write_pool(KvType type, void* pool, const float* src, const KvLayerView& kv,
                const KvBatchView& b, cudaStream_t s) {
    const int64_t n = b.n_tokens * kv.n_kv_head * kv.head_dim;
    const unsigned blocks = unsigned(cu::ceil_div(n, 256));
    switch (type) {
        case KvType::F32:
            kv_write_kernel<float>
                <<<blocks, 256, 0, s>>>(static_cast<float*>(pool), src, b.token_seq, b.token_slot,
                                        b.block_table, b.max_blocks_per_seq, b.n_tokens,
                                        kv.n_blocks, kv.n_kv_head, kv.block_size, kv.head_dim);
            break;
        case KvType::F16:
            kv_write_kernel<__half>
                <<<blocks, 256, 0, s>>>(static_cast<__half*>(pool), src, b.token_seq, b.token_slot,
                                        b.block_table, b.max_blocks_per_seq, b.n_tokens,
                                        kv.n_blocks, kv.n_kv_head, kv.block_size, kv.head_dim);
            break;
        default:
            CUDA_REQUIRE(false, "cuda_kv_write: quantized KV pools are not supported yet");
    }
    CUDA_CHECK_LAUNCH();
}

}  // namespace

void cuda_kv_write(const KvLayerView& kv, const KvBatchView& batch, const float* k, const float* v,
                   cudaStream_t s) {
    CUDA_REQUIRE(kv.n_blocks > 0 && kv.n_kv_head > 0 && kv.block_size > 0 && kv.head_dim > 0,
                 "cuda_kv_write: bad KV layer shape");
    CUDA_REQUIRE(batch.n_tokens >= 0 && batch.max_blocks_per_seq > 0,
                 "cuda_kv_write: bad batch shape");
    if (batch.n_tokens == 0) return;
    write_pool(kv.k_type, kv.k, k, kv, batch, s);
    write_pool(kv.v_type, kv.v, v, kv, batch, s);
}

}  // namespace kvrun
