// The paged attention kernel shared by the decode and prefill launchers: flash-attention
// style over 32-slot key tiles gathered from the paged pools, online softmax, causal mask.
//
// One thread block (4 warps) serves one KV head for a tile of `tokens_per_cta` consecutive
// batch tokens x `heads_per_cta` query heads of that KV head's GQA group (rows = token x
// head, up to 4 * RPW), and one range of context slots (grid z: split-K over the context).
// Each K/V tile is loaded once into shared memory (as f32) for all rows, K and V together
// (one memory round trip per tile). A warp owns RPW rows; in the score step lane j handles key j of
// the tile, in the P.V step lane j handles dims j, j + 32, ... Batch tokens of different sequences
// inside one tile are processed segment by segment (a run of tokens of the same sequence shares the
// key walk).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "cpu_ops.h"
#include "cuda/common.cuh"

namespace kvrun::cu {

constexpr int kAttnWarps = 4;
constexpr int kAttnTile = 32;     // keys per tile (= warp size)
constexpr int kAttnMaxDim = 256;  // head_dim limit (8 dims per lane)

struct AttnParams {
    float* out;      // [n_tokens][n_head][head_dim] (when part_o is null)
    const float* q;  // [n_tokens][n_head][head_dim]
    const void* k;   // pools [n_blocks][n_kv_head][block_size][head_dim]
    const void* v;
    KvType k_type, v_type;
    const int32_t* token_seq;    // [n_tokens]
    const int32_t* token_slot;   // [n_tokens]
    const int32_t* block_table;  // [n_seqs][max_blocks_per_seq]
    int64_t max_blocks_per_seq, n_tokens, n_blocks;
    int n_head, n_kv_head, group, heads_per_cta, n_head_sub, tokens_per_cta, head_dim;
    int block_size;
    float scale;
    int64_t split_len;  // context slots per grid-z split
    float* part_o;      // split-K partials [n_splits][n_tokens][n_head][head_dim], or null
    float* part_ml;     // [n_splits][n_tokens][n_head][2]: running max, running sum
};

// Dynamic shared memory of the kernel for `rows` query rows.
inline size_t attn_smem_bytes(int rows, int head_dim) {
    return sizeof(int64_t) * kAttnTile +
           sizeof(float) * (size_t(rows) * head_dim + 2 * size_t(kAttnTile) * (head_dim + 1)) +
           sizeof(int32_t) * 2 * rows;
}

// Element offset of (slot, kv head) in the pools, or -1 when outside the table / pool.
__device__ __forceinline__ int64_t attn_row_offset(const AttnParams& p, int64_t seq, int64_t slot,
                                                   int kvh) {
    if (seq < 0 || slot < 0) return -1;
    const int64_t blk = slot / p.block_size;
    if (blk >= p.max_blocks_per_seq) return -1;
    const int64_t pb = p.block_table[seq * p.max_blocks_per_seq + blk];
    if (pb < 0 || pb >= p.n_blocks) return -1;
    return ((pb * p.n_kv_head + kvh) * p.block_size + slot % p.block_size) * int64_t(p.head_dim);
}

// Gathers 32 pool rows (row_off[j] element offsets, -1 = zero row) into dst[32][D + 1] as
// f32. This is the one place that knows the pool storage types (add Q8/Q4 here).
__device__ __forceinline__ void attn_load_tile(float* __restrict__ dst, const void* pool,
                                               KvType type, const int64_t* row_off, int D) {
    const int Dp = D + 1;
    if (type == KvType::F16 && D % 8 == 0) {
        const int chunks = D / 8;
        const __half* src = static_cast<const __half*>(pool);
        for (int c = threadIdx.x; c < kAttnTile * chunks; c += blockDim.x) {
            const int j = c / chunks, ch = c % chunks;
            const int64_t off = row_off[j];
            float* d = dst + j * Dp + ch * 8;
            if (off < 0) {
#pragma unroll
                for (int e = 0; e < 8; ++e) d[e] = 0.0f;
                continue;
            }
            const uint4 u = *reinterpret_cast<const uint4*>(src + off + ch * 8);
            const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float2 f = __half22float2(h[e]);
                d[2 * e] = f.x, d[2 * e + 1] = f.y;
            }
        }
    } else if (type == KvType::F32 && D % 4 == 0) {
        const int chunks = D / 4;
        const float* src = static_cast<const float*>(pool);
        for (int c = threadIdx.x; c < kAttnTile * chunks; c += blockDim.x) {
            const int j = c / chunks, ch = c % chunks;
            const int64_t off = row_off[j];
            float* d = dst + j * Dp + ch * 4;
            const float4 f = off < 0 ? make_float4(0.f, 0.f, 0.f, 0.f)
                                     : *reinterpret_cast<const float4*>(src + off + ch * 4);
            d[0] = f.x, d[1] = f.y, d[2] = f.z, d[3] = f.w;
        }
    } else {
        for (int e = threadIdx.x; e < kAttnTile * D; e += blockDim.x) {
            const int j = e / D, dd = e % D;
            const int64_t off = row_off[j];
            float val = 0.0f;
            if (off >= 0)
                val = type == KvType::F16 ? __half2float(static_cast<const __half*>(pool)[off + dd])
                                          : static_cast<const float*>(pool)[off + dd];
            dst[j * Dp + dd] = val;
        }
    }
}

template <int RPW>
__global__ void __launch_bounds__(kAttnWarps * 32) paged_attention_kernel(AttnParams p) {
    constexpr int R = kAttnWarps * RPW;
    constexpr unsigned kFull = 0xffffffffu;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int D = p.head_dim, Dp = D + 1;
    int64_t* row_off = reinterpret_cast<int64_t*>(smem_raw);              // [32]
    float* q_s = reinterpret_cast<float*>(row_off + kAttnTile);           // [R][D], scaled
    float* k_s = q_s + R * D;                                             // [32][D + 1]
    float* v_s = k_s + kAttnTile * Dp;                                    // [32][D + 1]
    int32_t* tok_seq = reinterpret_cast<int32_t*>(v_s + kAttnTile * Dp);  // [R]
    int32_t* tok_slot = tok_seq + R;                                      // [R]

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int kvh = blockIdx.y / p.n_head_sub, hsub = blockIdx.y % p.n_head_sub;
    const int Gs = p.heads_per_cta;
    const int64_t t0 = int64_t(blockIdx.x) * p.tokens_per_cta;
    const int n_tok = int(min(int64_t(p.tokens_per_cta), p.n_tokens - t0));
    const int64_t split_begin = int64_t(blockIdx.z) * p.split_len;
    const int64_t split_end = split_begin + p.split_len;

    for (int i = tid; i < n_tok; i += blockDim.x) {
        tok_seq[i] = p.token_seq[t0 + i];
        tok_slot[i] = p.token_slot[t0 + i];
    }
    // Row r = (local token r / Gs, head hsub * Gs + r % Gs of the group).
    for (int e = tid; e < R * D; e += blockDim.x) {
        const int r = e / D, d = e % D, tl = r / Gs, hg = hsub * Gs + r % Gs;
        const bool valid = tl < n_tok && hg < p.group;
        q_s[e] = valid ? p.q[((t0 + tl) * p.n_head + kvh * p.group + hg) * D + d] * p.scale : 0.0f;
    }
    __syncthreads();

    int row_tok[RPW];      // local token of each owned row, -1 when the row is unused
    int64_t row_end[RPW];  // exclusive key limit: min(slot + 1, split_end)
#pragma unroll
    for (int i = 0; i < RPW; ++i) {
        const int r = warp * RPW + i, tl = r / Gs, hg = hsub * Gs + r % Gs;
        const bool valid = tl < n_tok && hg < p.group;
        row_tok[i] = valid ? tl : -1;
        row_end[i] = valid ? min(int64_t(tok_slot[tl]) + 1, split_end) : 0;
    }
    float m[RPW], l[RPW], acc[RPW][kAttnMaxDim / 32];
#pragma unroll
    for (int i = 0; i < RPW; ++i) {
        m[i] = -INFINITY, l[i] = 0.0f;
#pragma unroll
        for (int k = 0; k < kAttnMaxDim / 32; ++k) acc[i][k] = 0.0f;
    }
    const int dpl = (D + 31) / 32;

    for (int sb = 0; sb < n_tok;) {
        // Segment [sb, se): consecutive tokens of one sequence; keys up to its largest slot.
        const int seq = tok_seq[sb];
        int se = sb + 1;
        int64_t seg_end = int64_t(tok_slot[sb]) + 1;
        while (se < n_tok && tok_seq[se] == seq)
            seg_end = max(seg_end, int64_t(tok_slot[se++]) + 1);
        seg_end = min(seg_end, split_end);
        for (int64_t k0 = split_begin; k0 < seg_end; k0 += kAttnTile) {
            __syncthreads();  // the previous tile is fully consumed
            if (tid < kAttnTile)
                row_off[tid] = k0 + tid < seg_end ? attn_row_offset(p, seq, k0 + tid, kvh) : -1;
            __syncthreads();
            attn_load_tile(k_s, p.k, p.k_type, row_off, D);
            attn_load_tile(v_s, p.v, p.v_type, row_off, D);
            __syncthreads();

            float s[RPW];
#pragma unroll
            for (int i = 0; i < RPW; ++i) s[i] = 0.0f;
            const float* krow = k_s + lane * Dp;
            const float* qw = q_s + warp * RPW * D;
#pragma unroll 4
            for (int d = 0; d < D; ++d) {
                const float kd = krow[d];
#pragma unroll
                for (int i = 0; i < RPW; ++i) s[i] = fmaf(qw[i * D + d], kd, s[i]);
            }
            const int64_t key = k0 + lane;
            float pr[RPW];
#pragma unroll
            for (int i = 0; i < RPW; ++i) {
                const bool ok = row_tok[i] >= sb && row_tok[i] < se && key < row_end[i];
                const float sv = ok ? s[i] : -INFINITY;
                const float m_new = fmaxf(m[i], cu::warp_max(sv));
                pr[i] = 0.0f;
                if (m_new == -INFINITY) continue;  // warp-uniform: nothing visible yet
                const float corr = expf(m[i] - m_new);
                pr[i] = ok ? expf(sv - m_new) : 0.0f;
                l[i] = l[i] * corr + cu::warp_sum(pr[i]);
#pragma unroll
                for (int k = 0; k < kAttnMaxDim / 32; ++k) acc[i][k] *= corr;
                m[i] = m_new;
            }
            for (int j = 0; j < kAttnTile; ++j) {
                float pj[RPW];
#pragma unroll
                for (int i = 0; i < RPW; ++i) pj[i] = __shfl_sync(kFull, pr[i], j);
                const float* vrow = v_s + j * Dp;
#pragma unroll
                for (int k = 0; k < kAttnMaxDim / 32; ++k) {
                    if (k >= dpl) break;
                    const int d = lane + 32 * k;
                    const float vd = d < D ? vrow[d] : 0.0f;
#pragma unroll
                    for (int i = 0; i < RPW; ++i) acc[i][k] = fmaf(pj[i], vd, acc[i][k]);
                }
            }
        }
        sb = se;
    }

#pragma unroll
    for (int i = 0; i < RPW; ++i) {
        if (row_tok[i] < 0) continue;
        const int r = warp * RPW + i;
        const int64_t t = t0 + row_tok[i];
        const int64_t h = int64_t(kvh) * p.group + hsub * Gs + r % Gs;
        const int64_t row = t * p.n_head + h;
        if (p.part_o) {
            const int64_t prow = int64_t(blockIdx.z) * p.n_tokens * p.n_head + row;
#pragma unroll
            for (int k = 0; k < kAttnMaxDim / 32; ++k) {
                const int d = lane + 32 * k;
                if (k < dpl && d < D) p.part_o[prow * D + d] = acc[i][k];
            }
            if (lane == 0) {
                p.part_ml[prow * 2] = m[i];
                p.part_ml[prow * 2 + 1] = l[i];
            }
        } else {
            const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
#pragma unroll
            for (int k = 0; k < kAttnMaxDim / 32; ++k) {
                const int d = lane + 32 * k;
                if (k < dpl && d < D) p.out[row * D + d] = acc[i][k] * inv;
            }
        }
    }
}

}  // namespace kvrun::cu

namespace kvrun::cu {

// Checks the views and fills the parameters common to both launchers (rows per CTA:
// `rows`; tokens_per_cta: 1 for decode, else as many tokens as the rows hold).
inline AttnParams attn_params(float* out, const float* q, const KvLayerView& kv,
                              const KvBatchView& b, int64_t n_head, float scale, int rows,
                              bool one_token_per_cta) {
    CUDA_REQUIRE(kv.n_kv_head > 0 && n_head > 0 && n_head % kv.n_kv_head == 0,
                 "paged attention: n_head must be a positive multiple of n_kv_head");
    CUDA_REQUIRE(kv.head_dim > 0 && kv.head_dim <= kAttnMaxDim,
                 "paged attention: head_dim must be in 1..256");
    CUDA_REQUIRE(kv.block_size > 0 && kv.block_size <= INT32_MAX && kv.n_blocks > 0,
                 "paged attention: bad block_size / n_blocks");
    CUDA_REQUIRE(b.n_tokens >= 0 && b.max_blocks_per_seq > 0, "paged attention: bad batch");
    CUDA_REQUIRE((kv.k_type == KvType::F16 || kv.k_type == KvType::F32) &&
                     (kv.v_type == KvType::F16 || kv.v_type == KvType::F32),
                 "paged attention: quantized KV pools are not supported by the CUDA kernels yet");
    CUDA_REQUIRE(
        reinterpret_cast<uintptr_t>(kv.k) % 16 == 0 && reinterpret_cast<uintptr_t>(kv.v) % 16 == 0,
        "paged attention: KV pools must be 16-byte aligned");
    AttnParams p{};
    p.out = out;
    p.q = q;
    p.k = kv.k;
    p.v = kv.v;
    p.k_type = kv.k_type;
    p.v_type = kv.v_type;
    p.token_seq = b.token_seq;
    p.token_slot = b.token_slot;
    p.block_table = b.block_table;
    p.max_blocks_per_seq = b.max_blocks_per_seq;
    p.n_tokens = b.n_tokens;
    p.n_blocks = kv.n_blocks;
    p.n_head = int(n_head);
    p.n_kv_head = int(kv.n_kv_head);
    p.group = int(n_head / kv.n_kv_head);
    p.heads_per_cta = p.group < rows ? p.group : rows;
    p.n_head_sub = int(ceil_div(p.group, p.heads_per_cta));
    p.tokens_per_cta = one_token_per_cta ? 1 : rows / p.heads_per_cta;
    p.head_dim = int(kv.head_dim);
    p.block_size = int(kv.block_size);
    p.scale = scale;
    p.split_len = b.max_blocks_per_seq * kv.block_size;  // whole context: no split
    p.part_o = nullptr;
    p.part_ml = nullptr;
    CUDA_REQUIRE(int64_t(p.n_kv_head) * p.n_head_sub <= 65535,
                 "paged attention: too many KV heads for the grid");
    return p;
}

// Launches paged_attention_kernel<RPW> over grid (token tiles, kv heads x head subgroups,
// n_splits), opting into more than 48 KiB of shared memory when head_dim needs it.
template <int RPW>
void attn_launch(const AttnParams& p, int n_splits, cudaStream_t s) {
    const int rows = kAttnWarps * RPW;
    const size_t smem = attn_smem_bytes(rows, p.head_dim);
    if (smem > 48 * 1024) {
        // Set outside graph capture only (an eager run of the same shape always comes first).
        cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
        CUDA_CHECK(cudaStreamIsCapturing(s, &status));
        if (status == cudaStreamCaptureStatusNone)
            CUDA_CHECK(cudaFuncSetAttribute(paged_attention_kernel<RPW>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            int(smem)));
    }
    const dim3 grid(unsigned(ceil_div(p.n_tokens, p.tokens_per_cta)),
                    unsigned(p.n_kv_head * p.n_head_sub), unsigned(n_splits));
    paged_attention_kernel<RPW><<<grid, kAttnWarps * 32, smem, s>>>(p);
    CUDA_CHECK_LAUNCH();
}

}  // namespace kvrun::cu
