// Writes a batch's new K and V rows into the paged cache ([n_blocks][n_kv_head] head blocks
// per layer): one thread per element, the physical block looked up in the sequence's block
// table. Unstaged (f32/f16 pools): straight into the pool. Staged (quantized pools): into
// the token's f16 stage, then a second kernel seals every block whose last row was written
// (K: one scale per channel over the block, V: one per row and group; kv_format.h). The
// decode path's variant fuses RoPE on q and k with the write (one thread per rotated pair)
// and seals K and V in one launch. Also the block copies the block table queues
// (copy-on-write, stage restores).
#include <cuda_fp16.h>

#include <cstdint>
#include <tuple>
#include <utility>

#include "cuda/common.cuh"
#include "cuda/kv_format.cuh"
#include "cuda/ops.h"
#include "cuda/rope.cuh"

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
    cu::pdl_begin();
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
            cu::launch_pdl(kv_write_kernel<float>, blocks, 256, 0, s, static_cast<float*>(pool),
                           src, b.token_seq, b.token_slot, b.block_table, b.max_blocks_per_seq,
                           b.n_tokens, kv.n_blocks, kv.n_kv_head, kv.block_size, kv.head_dim);
            break;
        case KvType::F16:
            cu::launch_pdl(kv_write_kernel<__half>, blocks, 256, 0, s, static_cast<__half*>(pool),
                           src, b.token_seq, b.token_slot, b.block_table, b.max_blocks_per_seq,
                           b.n_tokens, kv.n_blocks, kv.n_kv_head, kv.block_size, kv.head_dim);
            break;
        default:
            CUDA_REQUIRE(false, "cuda_kv_write: quantized KV pools are written through stages");
    }
    CUDA_CHECK_LAUNCH();
}

// src: [n_tokens][n_kv_head][head_dim] -> the token's stage row (f16); one thread per element.
__global__ void stage_write_kernel(__half* __restrict__ stage, const float* __restrict__ src,
                                   const int32_t* __restrict__ token_slot,
                                   const int32_t* __restrict__ token_stage, int64_t n_tokens,
                                   int64_t n_stages, int64_t n_kv_head, int64_t block_size,
                                   int64_t head_dim) {
    cu::pdl_begin();
    const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= n_tokens * n_kv_head * head_dim) return;
    const int64_t d = idx % head_dim, th = idx / head_dim;
    const int64_t h = th % n_kv_head, t = th / n_kv_head;
    const int64_t st = token_stage[t], slot = token_slot[t];
    if (st < 0 || st >= n_stages || slot < 0) return;
    stage[((st * n_kv_head + h) * block_size + slot % block_size) * head_dim + d] =
        __float2half_rn(src[idx]);
}

struct SealParams {
    uint8_t* pool;        // [n_blocks][n_kv_head] head blocks of `type`
    const __half* stage;  // [n_stages][n_kv_head][block_size][head_dim]
    KvType type;
    KvRole role;
    KvHeadLayout layout;
    const int32_t* token_seq;
    const int32_t* token_slot;
    const int32_t* token_stage;
    const int32_t* block_table;
    int64_t max_blocks_per_seq, n_blocks, n_stages;
    int n_kv_head, block_size, head_dim;
};

// Run by one thread block per (token t, KV head h): when the token wrote the last row of its
// block, encodes the block's stage rows into the pool (kv_encode_head_block's rules).
__device__ __forceinline__ void seal_head_block(const SealParams& p, int64_t t, int h) {
    const int64_t slot = p.token_slot[t], seq = p.token_seq[t], st = p.token_stage[t];
    const int bs = p.block_size, D = p.head_dim;
    if (slot < 0 || slot % bs != bs - 1 || st < 0 || st >= p.n_stages || seq < 0) return;
    if (slot / bs >= p.max_blocks_per_seq) return;
    const int64_t pb = p.block_table[seq * p.max_blocks_per_seq + slot / bs];
    if (pb < 0 || pb >= p.n_blocks) return;
    const __half* rows = p.stage + (st * p.n_kv_head + h) * int64_t(bs) * D;  // [bs][D]
    uint8_t* blk = p.pool + (pb * p.n_kv_head + h) * p.layout.bytes;
    if (p.type == KvType::F32 || p.type == KvType::F16) {
        for (int e = threadIdx.x; e < bs * D; e += blockDim.x) {
            const float x = __half2float(rows[e]);
            if (p.type == KvType::F32)
                reinterpret_cast<float*>(blk)[e] = x;
            else
                reinterpret_cast<__half*>(blk)[e] = __float2half_rn(x);
        }
        return;
    }
    __half* scales = reinterpret_cast<__half*>(blk);
    uint8_t* vals = blk + p.layout.scale_bytes;
    const bool q4 = p.type == KvType::Q4;
    // Q4 packs channel pairs into bytes: a thread owns a pair so whole bytes are written.
    const int width = q4 ? 2 : 1;
    if (p.role == KvRole::K) {
        // A thread owns a channel (q8) or a channel pair (q4): the scale of each of its
        // channels over the block's rows, then the codes row by row, whole bytes at a time.
        for (int c0 = threadIdx.x * width; c0 < D; c0 += blockDim.x * width) {
            float inv[2] = {0.0f, 0.0f};
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                if (i >= width) break;
                const int c = c0 + i;
                float amax = 0.0f, mx = 0.0f;
                for (int r = 0; r < bs; ++r) {
                    const float x = __half2float(rows[r * D + c]);
                    if (fabsf(x) > amax) amax = fabsf(x), mx = x;
                }
                const float d = cu::kv_group_scale(p.type, amax, mx);
                scales[c] = __float2half_rn(d);
                inv[i] = d != 0.0f ? 1.0f / d : 0.0f;
            }
            for (int r = 0; r < bs; ++r) {
                uint8_t* out = vals + int64_t(r) * p.layout.row_bytes;
                const int q0 = cu::kv_quantize(p.type, __half2float(rows[r * D + c0]), inv[0]);
                if (!q4) {
                    out[c0] = uint8_t(int8_t(q0));
                } else {
                    const int q1 =
                        cu::kv_quantize(p.type, __half2float(rows[r * D + c0 + 1]), inv[1]);
                    out[c0 / 2] = uint8_t((q0 + 8) | ((q1 + 8) << 4));
                }
            }
        }
    } else {
        const int g = int(p.layout.group), n_groups = D / g;
        for (int item = threadIdx.x; item < bs * n_groups; item += blockDim.x) {
            const int r = item / n_groups, j = item % n_groups;
            const __half* x = rows + r * D + j * g;
            float amax = 0.0f, mx = 0.0f;
            for (int c = 0; c < g; ++c) {
                const float v = __half2float(x[c]);
                if (fabsf(v) > amax) amax = fabsf(v), mx = v;
            }
            const float d = cu::kv_group_scale(p.type, amax, mx);
            scales[r * n_groups + j] = __float2half_rn(d);
            const float inv = d != 0.0f ? 1.0f / d : 0.0f;
            uint8_t* out = vals + int64_t(r) * p.layout.row_bytes;
            for (int c = 0; c < g; c += width) {
                const int q0 = cu::kv_quantize(p.type, __half2float(x[c]), inv);
                if (!q4) {
                    out[j * g + c] = uint8_t(int8_t(q0));
                } else {
                    const int q1 = cu::kv_quantize(p.type, __half2float(x[c + 1]), inv);
                    out[(j * g + c) / 2] = uint8_t((q0 + 8) | ((q1 + 8) << 4));
                }
            }
        }
    }
}

// Grid (n_tokens, n_kv_head): one pool.
__global__ void seal_kernel(SealParams p) {
    cu::pdl_begin();
    seal_head_block(p, blockIdx.x, int(blockIdx.y));
}

// Grid (n_tokens, n_kv_head, 2): K (z = 0) and V (z = 1) in one launch.
__global__ void seal_kv_kernel(SealParams k, SealParams v) {
    cu::pdl_begin();
    if (blockIdx.z == 0)
        seal_head_block(k, blockIdx.x, int(blockIdx.y));
    else
        seal_head_block(v, blockIdx.x, int(blockIdx.y));
}

SealParams seal_params(KvType type, KvRole role, void* pool, const void* stage,
                       const KvLayerView& kv, const KvBatchView& b) {
    SealParams p{};
    p.pool = static_cast<uint8_t*>(pool);
    p.stage = static_cast<const __half*>(stage);
    p.type = type;
    p.role = role;
    p.layout = kv_head_layout(type, role, kv.block_size, kv.head_dim);
    p.token_seq = b.token_seq;
    p.token_slot = b.token_slot;
    p.token_stage = b.token_stage;
    p.block_table = b.block_table;
    p.max_blocks_per_seq = b.max_blocks_per_seq;
    p.n_blocks = kv.n_blocks;
    p.n_stages = kv.n_stages;
    p.n_kv_head = int(kv.n_kv_head);
    p.block_size = int(kv.block_size);
    p.head_dim = int(kv.head_dim);
    return p;
}

void seal_pool(KvType type, KvRole role, void* pool, const void* stage, const KvLayerView& kv,
               const KvBatchView& b, cudaStream_t s) {
    const SealParams p = seal_params(type, role, pool, stage, kv, b);
    cu::launch_pdl(seal_kernel, dim3(unsigned(b.n_tokens), unsigned(kv.n_kv_head)), 128, 0, s, p);
}

// Seals the K and V blocks the batch's tokens completed, in one launch.
void seal_pools(const KvLayerView& kv, const KvBatchView& b, cudaStream_t s) {
    const SealParams k = seal_params(kv.k_type, KvRole::K, kv.k, kv.k_stage, kv, b);
    const SealParams v = seal_params(kv.v_type, KvRole::V, kv.v, kv.v_stage, kv, b);
    cu::launch_pdl(seal_kv_kernel, dim3(unsigned(b.n_tokens), unsigned(kv.n_kv_head), 2), 128, 0, s,
                   k, v);
}

// RoPE fused with the KV write (cuda_rope on q and k, then cuda_kv_write's stores). One
// thread per (token t, KV head h, pair slot j), j < ceil(head_dim / 2). For j < n_rot / 2
// the thread computes rotated pair j's angle once (rope.cuh, as rope_kernel) and rotates
// that pair of k's head h and of the `group` query heads h * group .. h * group + group - 1
// in place; for larger j its K elements are the unrotated tail 2j, 2j + 1. Every thread then
// stores its two K elements and V elements 2j, 2j + 1 (those < head_dim) in the token's row:
// the pool (f32 / f16, unstaged, as kv_write_kernel) or the f16 stage (as
// stage_write_kernel). Neighbouring threads store neighbouring pairs, so a warp's stores
// cover contiguous bytes.
constexpr int kRopeKvThreads = 128;
constexpr int kQChunk = 8;  // query heads whose pairs a thread loads before rotating them

struct RopeKvParams {
    float* q;            // [n_tokens][n_kv_head * group][head_dim]
    float* k;            // [n_tokens][n_kv_head][head_dim]
    const float* v;      // [n_tokens][n_kv_head][head_dim]
    const int32_t* pos;  // [n_tokens]
    void* k_dst;         // unstaged: pools [n_blocks][n_kv_head][block_size][head_dim] of
    void* v_dst;         //   f32 / f16; staged: f16 stages [n_stages][n_kv_head][bs][head_dim]
    bool k_f32, v_f32;   // element types of k_dst / v_dst (else f16)
    bool write_v;        // false: V reads K's rows (KvLayerView::v_is_k)
    bool staged;
    const int32_t* token_seq;
    const int32_t* token_slot;
    const int32_t* token_stage;  // staged only
    const int32_t* block_table;
    int64_t max_blocks_per_seq, n_tokens, n_blocks, n_stages;
    int n_kv_head, group, block_size, head_dim;
    RopeParams rope;  // freq_factors in device memory
};

// Element offset of token t's row of KV head h in k_dst / v_dst, or -1 when it has none
// (stage_write_kernel's and kv_offset's rules).
__device__ __forceinline__ int64_t rope_kv_row(const RopeKvParams& p, int64_t t, int h) {
    if (!p.staged)
        return kv_offset(p.token_seq, p.token_slot, p.block_table, p.max_blocks_per_seq, p.n_blocks,
                         p.n_kv_head, p.block_size, p.head_dim, t, h);
    const int64_t st = p.token_stage[t], slot = p.token_slot[t];
    if (st < 0 || st >= p.n_stages || slot < 0) return -1;
    return ((st * p.n_kv_head + h) * p.block_size + slot % p.block_size) * p.head_dim;
}

__device__ __forceinline__ void store_f32_or_f16(void* base, bool f32, int64_t e, float x) {
    if (f32)
        static_cast<float*>(base)[e] = x;
    else
        static_cast<__half*>(base)[e] = __float2half_rn(x);
}

// Pair ab of query heads g0 .. g0 + kQChunk - 1 (those < group) of qh: [group][head_dim].
__device__ __forceinline__ void load_q_pairs(const float* qh, int g0, int group, int head_dim,
                                             int2 ab, float* qa, float* qb) {
#pragma unroll
    for (int u = 0; u < kQChunk; ++u) {
        if (g0 + u >= group) break;
        qa[u] = qh[int64_t(g0 + u) * head_dim + ab.x];
        qb[u] = qh[int64_t(g0 + u) * head_dim + ab.y];
    }
}

__global__ void rope_kv_write_kernel(RopeKvParams p) {
    cu::pdl_begin();
    const int D = p.head_dim, pairs = (D + 1) / 2, half = p.rope.n_rot / 2;
    const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= p.n_tokens * p.n_kv_head * pairs) return;
    const int j = int(idx % pairs);
    const int64_t th = idx / pairs;  // t * n_kv_head + h
    const int h = int(th % p.n_kv_head);
    const int64_t t = th / p.n_kv_head;
    const bool rotated = j < half, second = 2 * j + 1 < D;  // second: the pair's 2nd exists
    const int2 ab =
        rotated ? cu::rope_pair(j, p.rope.n_rot, p.rope.neox) : make_int2(2 * j, 2 * j + 1);
    // The loads before any store (which could alias them as far as the compiler knows).
    float* kh = p.k + th * D;
    const float* vh = p.write_v ? p.v + th * D : nullptr;
    float k0 = kh[ab.x], k1 = second ? kh[ab.y] : 0.0f;
    const float v0 = vh ? vh[2 * j] : 0.0f, v1 = vh && second ? vh[2 * j + 1] : 0.0f;
    float* qh = p.q + th * int64_t(p.group) * D;  // query heads h * group ..
    float qa[kQChunk] = {}, qb[kQChunk] = {};
    if (rotated) load_q_pairs(qh, 0, p.group, D, ab, qa, qb);
    const int64_t row = rope_kv_row(p, t, h);
    if (rotated) {
        const float2 cs = cu::rope_cos_sin(p.rope, p.pos[t], j);
        const float2 kr = cu::rope_rotate(k0, k1, cs);
        k0 = kr.x;
        k1 = kr.y;
        kh[ab.x] = k0;
        kh[ab.y] = k1;
        for (int g0 = 0;; g0 += kQChunk) {
#pragma unroll
            for (int u = 0; u < kQChunk; ++u) {
                if (g0 + u >= p.group) break;
                const float2 qr = cu::rope_rotate(qa[u], qb[u], cs);
                qh[int64_t(g0 + u) * D + ab.x] = qr.x;
                qh[int64_t(g0 + u) * D + ab.y] = qr.y;
            }
            if (g0 + kQChunk >= p.group) break;
            load_q_pairs(qh, g0 + kQChunk, p.group, D, ab, qa, qb);
        }
    }
    if (row < 0) return;
    store_f32_or_f16(p.k_dst, p.k_f32, row + ab.x, k0);
    if (second) store_f32_or_f16(p.k_dst, p.k_f32, row + ab.y, k1);
    if (!p.write_v) return;
    store_f32_or_f16(p.v_dst, p.v_f32, row + 2 * j, v0);
    if (second) store_f32_or_f16(p.v_dst, p.v_f32, row + 2 * j + 1, v1);
}

// Copy of rows [0, n_rows) into stage dst_stage, from stage src_stage or decoded from pool
// block src; grid (n_kv_head, 2 = K and V), one thread per element.
struct CopyParams {
    const uint8_t* pool[2];
    __half* stage[2];
    KvType type[2];
    KvHeadLayout layout[2];
    int64_t src, src_stage, dst_stage;
    int n_kv_head, block_size, head_dim, n_rows;
};

__global__ void stage_copy_kernel(CopyParams p) {
    cu::pdl_begin();
    const int h = blockIdx.x, which = blockIdx.y;
    const KvRole role = which == 0 ? KvRole::K : KvRole::V;
    const int D = p.head_dim;
    __half* dst = p.stage[which] + (p.dst_stage * p.n_kv_head + h) * int64_t(p.block_size) * D;
    const __half* src_stage =
        p.stage[which] + (p.src_stage * p.n_kv_head + h) * int64_t(p.block_size) * D;
    const uint8_t* blk = p.pool[which] + (p.src * p.n_kv_head + h) * p.layout[which].bytes;
    for (int e = threadIdx.x; e < p.n_rows * D; e += blockDim.x) {
        const float x = p.src_stage >= 0 ? __half2float(src_stage[e])
                                         : cu::kv_decode(blk, p.type[which], role, p.layout[which],
                                                         D, e / D, e % D);
        dst[e] = __float2half_rn(x);
    }
}

}  // namespace

void cuda_kv_copy(const KvLayerView& kv, int64_t src, int64_t dst, int64_t src_stage,
                  int64_t dst_stage, int64_t n_rows, cudaStream_t s) {
    CUDA_REQUIRE(src >= 0 && src < kv.n_blocks && dst >= 0 && dst < kv.n_blocks,
                 "cuda_kv_copy: block id outside the pool");
    if (dst_stage < 0) {
        CUDA_REQUIRE(src_stage < 0, "cuda_kv_copy: a stage source needs a stage destination");
        if (src == dst) return;
        const std::tuple<void*, KvType, KvRole> pools[] = {{kv.k, kv.k_type, KvRole::K},
                                                           {kv.v, kv.v_type, KvRole::V}};
        for (int i = 0; i < (kv.v_is_k ? 1 : 2); ++i) {
            const auto [pool, type, role] = pools[i];
            const int64_t bytes =
                kv.n_kv_head * kv_head_block_bytes(type, role, kv.block_size, kv.head_dim);
            auto* base = static_cast<uint8_t*>(pool);
            CUDA_CHECK(cudaMemcpyAsync(base + dst * bytes, base + src * bytes, size_t(bytes),
                                       cudaMemcpyDeviceToDevice, s));
        }
        return;
    }
    CUDA_REQUIRE(kv.n_stages > 0 && dst_stage < kv.n_stages && src_stage < kv.n_stages &&
                     n_rows >= 0 && n_rows <= kv.block_size,
                 "cuda_kv_copy: stage slot or row count out of range");
    if (n_rows == 0) return;
    CopyParams p{};
    p.pool[0] = static_cast<const uint8_t*>(kv.k);
    p.pool[1] = static_cast<const uint8_t*>(kv.v);
    p.stage[0] = static_cast<__half*>(kv.k_stage);
    p.stage[1] = static_cast<__half*>(kv.v_stage);
    p.type[0] = kv.k_type;
    p.type[1] = kv.v_type;
    p.layout[0] = kv_head_layout(kv.k_type, KvRole::K, kv.block_size, kv.head_dim);
    p.layout[1] = kv_head_layout(kv.v_type, KvRole::V, kv.block_size, kv.head_dim);
    p.src = src;
    p.src_stage = src_stage;
    p.dst_stage = dst_stage;
    p.n_kv_head = int(kv.n_kv_head);
    p.block_size = int(kv.block_size);
    p.head_dim = int(kv.head_dim);
    p.n_rows = int(n_rows);
    cu::launch_pdl(stage_copy_kernel, dim3(unsigned(kv.n_kv_head), kv.v_is_k ? 1 : 2), 256, 0, s,
                   p);
}

void cuda_kv_write(const KvLayerView& kv, const KvBatchView& batch, const float* k, const float* v,
                   cudaStream_t s, bool seal) {
    CUDA_REQUIRE(kv.n_blocks > 0 && kv.n_kv_head > 0 && kv.block_size > 0 && kv.head_dim > 0,
                 "cuda_kv_write: bad KV layer shape");
    CUDA_REQUIRE(batch.n_tokens >= 0 && batch.max_blocks_per_seq > 0,
                 "cuda_kv_write: bad batch shape");
    CUDA_REQUIRE(kv.block_size <= 256, "cuda_kv_write: block_size must be at most 256");
    kv_check_format(kv.k_type, kv.head_dim);
    kv_check_format(kv.v_type, kv.head_dim);
    if (batch.n_tokens == 0) return;
    if (kv.n_stages <= 0) {
        CUDA_REQUIRE(!kv_type_quantized(kv.k_type) && !kv_type_quantized(kv.v_type),
                     "cuda_kv_write: a quantized cache needs stage slots");
        write_pool(kv.k_type, kv.k, k, kv, batch, s);
        if (!kv.v_is_k) write_pool(kv.v_type, kv.v, v, kv, batch, s);
        return;
    }
    CUDA_REQUIRE(kv.k_stage && kv.v_stage && batch.token_stage,
                 "cuda_kv_write: staged cache without stage pools or token stages");
    const int64_t n = batch.n_tokens * kv.n_kv_head * kv.head_dim;
    const unsigned blocks = unsigned(cu::ceil_div(n, 256));
    const std::pair<void*, const float*> rows[] = {{kv.k_stage, k}, {kv.v_stage, v}};
    for (int i = 0; i < (kv.v_is_k ? 1 : 2); ++i) {  // (V reading K's rows: K alone)
        const auto [stage, src] = rows[i];
        cu::launch_pdl(stage_write_kernel, blocks, 256, 0, s, static_cast<__half*>(stage), src,
                       batch.token_slot, batch.token_stage, batch.n_tokens, kv.n_stages,
                       kv.n_kv_head, kv.block_size, kv.head_dim);
    }
    if (!seal) return;
    seal_pool(kv.k_type, KvRole::K, kv.k, kv.k_stage, kv, batch, s);
    if (!kv.v_is_k) seal_pool(kv.v_type, KvRole::V, kv.v, kv.v_stage, kv, batch, s);
}

void cuda_rope_kv_write(float* q, float* k, const float* v, const int32_t* pos,
                        const KvLayerView& kv, const KvBatchView& batch, int64_t n_head,
                        const RopeParams& rope, cudaStream_t s, bool seal) {
    CUDA_REQUIRE(kv.n_blocks > 0 && kv.n_kv_head > 0 && kv.block_size > 0 && kv.head_dim > 0,
                 "cuda_rope_kv_write: bad KV layer shape");
    CUDA_REQUIRE(batch.n_tokens >= 0 && batch.max_blocks_per_seq > 0,
                 "cuda_rope_kv_write: bad batch shape");
    CUDA_REQUIRE(kv.block_size <= 256, "cuda_rope_kv_write: block_size must be at most 256");
    CUDA_REQUIRE(kv.head_dim <= INT32_MAX / 2 && kv.n_kv_head <= INT32_MAX,
                 "cuda_rope_kv_write: bad KV layer shape");
    CUDA_REQUIRE(n_head > 0 && n_head % kv.n_kv_head == 0 && n_head / kv.n_kv_head <= INT32_MAX,
                 "cuda_rope_kv_write: n_head must be a multiple of n_kv_head");
    CUDA_REQUIRE(rope.n_rot > 0 && rope.n_rot % 2 == 0 && rope.n_rot <= kv.head_dim,
                 "cuda_rope_kv_write: n_rot must be even and at most head_dim");
    kv_check_format(kv.k_type, kv.head_dim);
    kv_check_format(kv.v_type, kv.head_dim);
    if (batch.n_tokens == 0) return;
    const bool staged = kv.n_stages > 0;
    if (!staged)
        CUDA_REQUIRE(!kv_type_quantized(kv.k_type) && !kv_type_quantized(kv.v_type),
                     "cuda_rope_kv_write: a quantized cache needs stage slots");
    else
        CUDA_REQUIRE(kv.k_stage && kv.v_stage && batch.token_stage,
                     "cuda_rope_kv_write: staged cache without stage pools or token stages");
    RopeKvParams p{};
    p.q = q;
    p.k = k;
    p.v = v;
    p.pos = pos;
    p.k_dst = staged ? kv.k_stage : kv.k;
    p.v_dst = staged ? kv.v_stage : kv.v;
    p.k_f32 = !staged && kv.k_type == KvType::F32;
    p.v_f32 = !staged && kv.v_type == KvType::F32;
    p.write_v = !kv.v_is_k;
    p.staged = staged;
    p.token_seq = batch.token_seq;
    p.token_slot = batch.token_slot;
    p.token_stage = batch.token_stage;
    p.block_table = batch.block_table;
    p.max_blocks_per_seq = batch.max_blocks_per_seq;
    p.n_tokens = batch.n_tokens;
    p.n_blocks = kv.n_blocks;
    p.n_stages = kv.n_stages;
    p.n_kv_head = int(kv.n_kv_head);
    p.group = int(n_head / kv.n_kv_head);
    p.block_size = int(kv.block_size);
    p.head_dim = int(kv.head_dim);
    p.rope = rope;
    const int64_t n = batch.n_tokens * kv.n_kv_head * ((kv.head_dim + 1) / 2);
    CUDA_REQUIRE(cu::ceil_div(n, kRopeKvThreads) <= INT32_MAX,
                 "cuda_rope_kv_write: too many tokens");
    cu::launch_pdl(rope_kv_write_kernel, unsigned(cu::ceil_div(n, kRopeKvThreads)), kRopeKvThreads,
                   0, s, p);
    if (staged && seal) {
        if (kv.v_is_k)
            seal_pool(kv.k_type, KvRole::K, kv.k, kv.k_stage, kv, batch, s);
        else
            seal_pools(kv, batch, s);
    }
}

}  // namespace kvrun
