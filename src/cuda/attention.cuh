// The paged attention kernel of the prefill launcher (and of the decode launcher where
// head_dim % 8 != 0 or KVRUN_DECODE_ATTN=tiled, see attention_decode.cu): flash-attention
// style over 32-slot key tiles gathered from the paged pools, online softmax, causal mask.
//
// One thread block (4 warps) serves one KV head for a tile of `tokens_per_cta` consecutive
// batch tokens x `heads_per_cta` query heads of that KV head's GQA group (rows = token x
// head, up to 4 * RPW), and one range of context slots (grid z: split-K over the context).
// Each K/V tile is loaded once into shared memory (as f32) for all rows, K and V together
// (one memory round trip per tile). A warp owns RPW rows; in the score step lane j handles key j of
// the tile, in the P.V step lane j handles dims j, j + 32, ... Batch tokens of different sequences
// inside one tile are processed segment by segment (a run of tokens of the same sequence shares the
// key walk). Pools hold head blocks in any KV format (kv_format.h); with staging (quantized
// caches) a token reads its own block from its f16 stage and earlier blocks from the pool, so a
// segment also ends where the tokens' own block changes.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "attn_window.h"
#include "cpu_ops.h"
#include "cuda/common.cuh"
#include "cuda/kv_format.cuh"
#include "kv_format.h"

namespace kvrun::cu {

constexpr int kAttnWarps = 4;
constexpr int kAttnTile = 32;     // keys per tile (= warp size)
constexpr int kAttnMaxDim = 256;  // head_dim limit of the decode and flash kernels
// The tiled kernel's limit (18 dims per lane): DeepSeek's latent rows (64 RoPE'd dims + a
// rank-512 latent). Heads wider than kAttnMaxDim take an instantiation of their own, so the
// narrow heads keep their registers.
constexpr int kAttnMaxDimWide = 576;

struct AttnParams {
    float* out;      // [n_tokens][n_head][head_dim] (when part_o is null)
    const float* q;  // [n_tokens][n_head][head_dim]
    const void* k;   // pools [n_blocks][n_kv_head] head blocks (kv_format.h)
    const void* v;
    KvType k_type, v_type;
    KvHeadLayout k_layout, v_layout;
    const __half* k_stage;  // [n_stages][n_kv_head][block_size][head_dim], or null
    const __half* v_stage;
    const int32_t* token_stage;  // [n_tokens] stage of each token's own block, or null
    int64_t n_stages;
    const int32_t* token_seq;    // [n_tokens]
    const int32_t* token_slot;   // [n_tokens]
    const int32_t* block_table;  // [n_seqs][max_blocks_per_seq]
    int64_t max_blocks_per_seq, n_tokens, n_blocks;
    int n_head, n_kv_head, group, heads_per_cta, n_head_sub, tokens_per_cta, head_dim;
    int block_size;
    // V reads K's rows (KvLayerView::v_is_k: DeepSeek's latent rows): v, v_type, v_layout and
    // v_stage are K's, and the tiled kernel uses its K tile as the V tile.
    bool v_is_k;
    float scale;
    float softcap;       // > 0: scores become softcap * tanh(score / softcap)
    int64_t window;      // > 0: a token at slot s sees slots s - window + 1 .. s only; < 0:
                         // its chunk of -window slots (attn_first_slot)
    const float* sinks;  // [n_head] attention sink logits (gpt-oss), or null
    int64_t split_len;   // context slots per grid-z split
    float* part_o;       // split-K partials [n_splits][n_tokens][n_head][head_dim], or null
    float* part_ml;      // [n_splits][n_tokens][n_head][2]: running max, running sum
    // When set (decode kernel, head_dim % 32 == 0): out is also quantized here for the
    // integer GEMV (cu::quantize_x_store; elements of xq_bytes).
    int8_t* xq;
    float* xd;
    int xq_bytes;
};

// Dynamic shared memory of the kernel for `rows` query rows (one key tile when V is K's).
inline size_t attn_smem_bytes(int rows, int head_dim, bool v_is_k = false) {
    const size_t tiles = v_is_k ? 1 : 2;
    return sizeof(int32_t) * 3 * kAttnTile +
           sizeof(float) * (size_t(rows) * head_dim + tiles * kAttnTile * (head_dim + 1)) +
           sizeof(int32_t) * 2 * rows;
}

// The factor that turns a finished row's sum of exp(score - m) * v into its output, given the
// row's largest score m and its sum l of exp(score - m): 1 / l, or 0 when the row saw no key.
// With attention sinks (gpt-oss), head h's sink logit joins the softmax's denominator (its
// share of the mass goes to no value): exp(m - M) / (l exp(m - M) + exp(sink - M)), M the
// larger of m and the sink.
__device__ __forceinline__ float attn_out_scale(float m, float l, const float* sinks, int64_t h) {
    if (!sinks) return l > 0.0f ? 1.0f / l : 0.0f;
    const float sink = sinks[h], mx = fmaxf(m, sink);
    const float a = m == -INFINITY ? 0.0f : expf(m - mx);
    return a / (l * a + expf(sink - mx));
}

// Where the 32 rows of a key tile come from: row j is row r[j] of physical block pb[j]
// (-1: a zero row), read from stage st[j] instead when that is >= 0.
struct AttnTileRows {
    int32_t* pb;
    int32_t* r;
    int32_t* st;
};

// A run of a query tile's tokens that walks the keys together: local tokens [begin, end)
// of one sequence (and, with staging, of one own block), keys [key_begin, key_end).
struct AttnSegment {
    int end;
    int32_t seq;
    int32_t own_stage;  // stage of the tokens' own block (staging), else -1
    int64_t own;        // the tokens' own block (logical index)
    int64_t key_begin, key_end;
};

// The segment that starts at local token sb of the tile's tokens (tok_seq / tok_slot, in
// shared memory; batch token t0 + i is local token i): it takes the following tokens of the
// same sequence (and own block), and its keys run up to its largest slot, clipped to the
// split. With a window the tiles (of `tile` keys) before its first visible key are skipped.
__device__ __forceinline__ AttnSegment attn_segment(const AttnParams& p, const int32_t* tok_seq,
                                                    const int32_t* tok_slot, int sb, int n_tok,
                                                    int64_t t0, int64_t split_begin,
                                                    int64_t split_end, int tile) {
    const bool staged = p.token_stage != nullptr;
    AttnSegment sg;
    sg.seq = tok_seq[sb];
    sg.own = int64_t(tok_slot[sb]) / p.block_size;
    int se = sb + 1;
    int64_t key_end = int64_t(tok_slot[sb]) + 1, lo = int64_t(tok_slot[sb]);
    while (se < n_tok && tok_seq[se] == sg.seq &&
           (!staged || int64_t(tok_slot[se]) / p.block_size == sg.own)) {
        lo = min(lo, int64_t(tok_slot[se]));
        key_end = max(key_end, int64_t(tok_slot[se++]) + 1);
    }
    sg.end = se;
    sg.key_end = min(key_end, split_end);
    sg.key_begin = split_begin;
    // (The earliest slot's first visible key is the segment's: windows and chunks move
    // forward with the slot.)
    if (const int64_t first = attn_first_slot(lo, p.window); first > sg.key_begin)
        sg.key_begin = first / tile * tile;
    sg.own_stage = staged ? p.token_stage[t0 + sb] : -1;
    return sg;
}

// Fills row j of the key tile that starts at slot k0 of segment sg: the key's physical
// block (-1 past the segment's keys or outside the table: a zero row), its row in the block,
// and the stage to read it from (its own block under staging) or -1.
__device__ __forceinline__ void attn_tile_row(const AttnParams& p, const AttnTileRows& tile,
                                              const AttnSegment& sg, int64_t k0, int j) {
    const int64_t slot = k0 + j;
    int32_t pb = -1;
    if (slot < sg.key_end && sg.seq >= 0 && slot >= 0 &&
        slot / p.block_size < p.max_blocks_per_seq) {
        pb = p.block_table[sg.seq * p.max_blocks_per_seq + slot / p.block_size];
        if (pb >= p.n_blocks) pb = -1;
    }
    const bool from_stage = pb >= 0 && p.token_stage != nullptr && slot / p.block_size == sg.own &&
                            sg.own_stage >= 0 && sg.own_stage < p.n_stages;
    tile.pb[j] = pb;
    tile.r[j] = int32_t(slot % p.block_size);
    tile.st[j] = from_stage ? sg.own_stage : -1;
}

// 8 f16 values at src (16-byte aligned) -> d[0..7] as f32.
__device__ __forceinline__ void attn_load8_f16(float* d, const __half* src) {
    const uint4 u = *reinterpret_cast<const uint4*>(src);
    const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const float2 f = __half22float2(h[e]);
        d[2 * e] = f.x, d[2 * e + 1] = f.y;
    }
}

// Where tile row j of KV head kvh lies: its f16 row in the stage pool (rows.st[j] >= 0), or
// its head block in the pool (rows.pb[j] >= 0; the row is rows.r[j] within it). Every tile
// loader (this file's and the flash kernel's) finds rows through these two.
__device__ __forceinline__ const __half* attn_stage_row(const AttnParams& p, const __half* stage,
                                                        const AttnTileRows& rows, int kvh, int j) {
    return stage + ((int64_t(rows.st[j]) * p.n_kv_head + kvh) * p.block_size + rows.r[j]) *
                       int64_t(p.head_dim);
}
__device__ __forceinline__ const uint8_t* attn_head_block(const AttnParams& p, const void* pool,
                                                          const KvHeadLayout& L,
                                                          const AttnTileRows& rows, int kvh,
                                                          int j) {
    return static_cast<const uint8_t*>(pool) + (int64_t(rows.pb[j]) * p.n_kv_head + kvh) * L.bytes;
}

// Gathers the 32 rows of KV head kvh described by `rows` into dst[32][D + 1] as f32, from
// `pool` (head blocks of `type`, layout L) or `stage` (f16 rows). This is the one place that
// knows the storage formats.
__device__ __forceinline__ void attn_load_tile(float* __restrict__ dst, const AttnParams& p,
                                               const void* pool, const __half* stage, KvType type,
                                               KvRole role, const KvHeadLayout& L,
                                               const AttnTileRows& rows, int kvh) {
    const int D = p.head_dim, Dp = D + 1;
    auto stage_row = [&](int j) { return attn_stage_row(p, stage, rows, kvh, j); };
    auto head_block = [&](int j) { return attn_head_block(p, pool, L, rows, kvh, j); };
    if (type == KvType::F32 && D % 4 == 0 && p.n_stages == 0) {
        const int chunks = D / 4;
        for (int c = threadIdx.x; c < kAttnTile * chunks; c += blockDim.x) {
            const int j = c / chunks, ch = c % chunks;
            float* d = dst + j * Dp + ch * 4;
            const float4 f = rows.pb[j] < 0 ? make_float4(0.f, 0.f, 0.f, 0.f)
                                            : *reinterpret_cast<const float4*>(
                                                  reinterpret_cast<const float*>(head_block(j)) +
                                                  int64_t(rows.r[j]) * D + ch * 4);
            d[0] = f.x, d[1] = f.y, d[2] = f.z, d[3] = f.w;
        }
        return;
    }
    if (D % 8 == 0) {
        // 8 consecutive values of a row per thread and step: stage rows (f16) with one 16-byte
        // load, pool rows of any format with kv_decode8's vector loads (one scale lookup).
        const int chunks = D / 8;
        for (int c = threadIdx.x; c < kAttnTile * chunks; c += blockDim.x) {
            const int j = c / chunks, ch = c % chunks;
            float* d = dst + j * Dp + ch * 8;
            if (rows.st[j] >= 0) {
                attn_load8_f16(d, stage_row(j) + ch * 8);
            } else if (rows.pb[j] < 0) {
#pragma unroll
                for (int e = 0; e < 8; ++e) d[e] = 0.0f;
            } else {
                kv_decode8(d, head_block(j), type, role, L, D, rows.r[j], ch * 8);
            }
        }
        return;
    }
    // Any format, any head_dim: one element per thread and step.
    for (int e = threadIdx.x; e < kAttnTile * D; e += blockDim.x) {
        const int j = e / D, dd = e % D;
        float val = 0.0f;
        if (rows.st[j] >= 0)
            val = __half2float(stage_row(j)[dd]);
        else if (rows.pb[j] >= 0)
            val = kv_decode(head_block(j), type, role, L, D, rows.r[j], dd);
        dst[j * Dp + dd] = val;
    }
}

// MAXD: the widest head_dim the instantiation takes (kAttnMaxDim or kAttnMaxDimWide).
template <int RPW, int MAXD>
__global__ void __launch_bounds__(kAttnWarps * 32) paged_attention_kernel(AttnParams p) {
    pdl_begin();
    constexpr int R = kAttnWarps * RPW;
    constexpr int DPL = MAXD / 32;  // dims per lane in the P.V step
    constexpr unsigned kFull = 0xffffffffu;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int D = p.head_dim, Dp = D + 1;
    int32_t* tile_meta = reinterpret_cast<int32_t*>(smem_raw);  // [3][32]
    const AttnTileRows tile{tile_meta, tile_meta + kAttnTile, tile_meta + 2 * kAttnTile};
    float* q_s = reinterpret_cast<float*>(tile_meta + 3 * kAttnTile);     // [R][D], scaled
    float* k_s = q_s + R * D;                                             // [32][D + 1]
    float* v_s = p.v_is_k ? k_s : k_s + kAttnTile * Dp;                   // [32][D + 1]
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
    int64_t row_lo[RPW];   // first visible key (attn_first_slot: window or chunk), else 0
#pragma unroll
    for (int i = 0; i < RPW; ++i) {
        const int r = warp * RPW + i, tl = r / Gs, hg = hsub * Gs + r % Gs;
        const bool valid = tl < n_tok && hg < p.group;
        row_tok[i] = valid ? tl : -1;
        row_end[i] = valid ? min(int64_t(tok_slot[tl]) + 1, split_end) : 0;
        row_lo[i] = valid ? attn_first_slot(tok_slot[tl], p.window) : 0;
    }
    float m[RPW], l[RPW], acc[RPW][DPL];
#pragma unroll
    for (int i = 0; i < RPW; ++i) {
        m[i] = -INFINITY, l[i] = 0.0f;
#pragma unroll
        for (int k = 0; k < DPL; ++k) acc[i][k] = 0.0f;
    }
    const int dpl = (D + 31) / 32;

    for (int sb = 0; sb < n_tok;) {
        const AttnSegment sg =
            attn_segment(p, tok_seq, tok_slot, sb, n_tok, t0, split_begin, split_end, kAttnTile);
        const int se = sg.end;
        for (int64_t k0 = sg.key_begin; k0 < sg.key_end; k0 += kAttnTile) {
            __syncthreads();  // the previous tile is fully consumed
            if (tid < kAttnTile) attn_tile_row(p, tile, sg, k0, tid);
            __syncthreads();
            attn_load_tile(k_s, p, p.k, p.k_stage, p.k_type, KvRole::K, p.k_layout, tile, kvh);
            if (!p.v_is_k)
                attn_load_tile(v_s, p, p.v, p.v_stage, p.v_type, KvRole::V, p.v_layout, tile, kvh);
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
            if (p.softcap > 0.0f)
#pragma unroll
                for (int i = 0; i < RPW; ++i) s[i] = p.softcap * tanhf(s[i] / p.softcap);
            const int64_t key = k0 + lane;
            float pr[RPW];
#pragma unroll
            for (int i = 0; i < RPW; ++i) {
                const bool ok =
                    row_tok[i] >= sb && row_tok[i] < se && key < row_end[i] && key >= row_lo[i];
                const float sv = ok ? s[i] : -INFINITY;
                const float m_new = fmaxf(m[i], cu::warp_max(sv));
                pr[i] = 0.0f;
                if (m_new == -INFINITY) continue;  // warp-uniform: nothing visible yet
                const float corr = expf(m[i] - m_new);
                pr[i] = ok ? expf(sv - m_new) : 0.0f;
                l[i] = l[i] * corr + cu::warp_sum(pr[i]);
#pragma unroll
                for (int k = 0; k < DPL; ++k) acc[i][k] *= corr;
                m[i] = m_new;
            }
            for (int j = 0; j < kAttnTile; ++j) {
                float pj[RPW];
#pragma unroll
                for (int i = 0; i < RPW; ++i) pj[i] = __shfl_sync(kFull, pr[i], j);
                const float* vrow = v_s + j * Dp;
#pragma unroll
                for (int k = 0; k < DPL; ++k) {
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
            for (int k = 0; k < DPL; ++k) {
                const int d = lane + 32 * k;
                if (k < dpl && d < D) p.part_o[prow * D + d] = acc[i][k];
            }
            if (lane == 0) {
                p.part_ml[prow * 2] = m[i];
                p.part_ml[prow * 2 + 1] = l[i];
            }
        } else {
            const float inv = attn_out_scale(m[i], l[i], p.sinks, h);
#pragma unroll
            for (int k = 0; k < DPL; ++k) {
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
                              bool one_token_per_cta, float softcap, int64_t window,
                              const float* sinks) {
    CUDA_REQUIRE(softcap >= 0.0f, "paged attention: the soft cap must be >= 0");
    CUDA_REQUIRE(kv.n_kv_head > 0 && n_head > 0 && n_head % kv.n_kv_head == 0,
                 "paged attention: n_head must be a positive multiple of n_kv_head");
    CUDA_REQUIRE(kv.head_dim > 0 && kv.head_dim <= kAttnMaxDimWide,
                 "paged attention: head_dim must be in 1..576");
    CUDA_REQUIRE(!kv.v_is_k || (kv.v == kv.k && kv.v_type == kv.k_type && kv.v_stage == kv.k_stage),
                 "paged attention: a V that reads K's rows needs K's pool, type and stage");
    CUDA_REQUIRE(kv.block_size > 0 && kv.block_size <= INT32_MAX && kv.n_blocks > 0,
                 "paged attention: bad block_size / n_blocks");
    CUDA_REQUIRE(b.n_tokens >= 0 && b.max_blocks_per_seq > 0, "paged attention: bad batch");
    const bool quantized = kv_type_quantized(kv.k_type) || kv_type_quantized(kv.v_type);
    CUDA_REQUIRE(!quantized || (kv.n_stages > 0 && kv.k_stage && kv.v_stage),
                 "paged attention: a quantized cache needs stage pools");
    CUDA_REQUIRE(kv.n_stages <= 0 || b.token_stage,
                 "paged attention: a staged cache needs token stage slots");
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
    p.k_layout = kv_head_layout(kv.k_type, KvRole::K, kv.block_size, kv.head_dim);
    p.v_is_k = kv.v_is_k;
    p.v_layout =
        kv.v_is_k ? p.k_layout : kv_head_layout(kv.v_type, KvRole::V, kv.block_size, kv.head_dim);
    const bool staged_view = kv.n_stages > 0;
    p.k_stage = staged_view ? static_cast<const __half*>(kv.k_stage) : nullptr;
    p.v_stage = staged_view ? static_cast<const __half*>(kv.v_stage) : nullptr;
    p.token_stage = staged_view ? b.token_stage : nullptr;
    p.n_stages = staged_view ? kv.n_stages : 0;
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
    p.softcap = softcap;
    p.window = window;
    p.sinks = sinks;
    p.split_len = b.max_blocks_per_seq * kv.block_size;  // whole context: no split
    p.part_o = nullptr;
    p.part_ml = nullptr;
    CUDA_REQUIRE(int64_t(p.n_kv_head) * p.n_head_sub <= 65535,
                 "paged attention: too many KV heads for the grid");
    return p;
}

// Launches paged_attention_kernel<RPW, MAXD> over grid (token tiles, kv heads x head
// subgroups, n_splits), opting into more than 48 KiB of shared memory when head_dim needs it.
template <int RPW, int MAXD>
void attn_launch_dim(const AttnParams& p, int n_splits, cudaStream_t s) {
    const int rows = kAttnWarps * RPW;
    const size_t smem = attn_smem_bytes(rows, p.head_dim, p.v_is_k);
    if (smem > 48 * 1024) {
        // Set outside graph capture only (an eager run of the same shape always comes first).
        cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
        CUDA_CHECK(cudaStreamIsCapturing(s, &status));
        if (status == cudaStreamCaptureStatusNone)
            CUDA_CHECK(cudaFuncSetAttribute(paged_attention_kernel<RPW, MAXD>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            int(smem)));
    }
    const dim3 grid(unsigned(ceil_div(p.n_tokens, p.tokens_per_cta)),
                    unsigned(p.n_kv_head * p.n_head_sub), unsigned(n_splits));
    launch_pdl(paged_attention_kernel<RPW, MAXD>, grid, kAttnWarps * 32, smem, s, p);
}

// The instantiation for p.head_dim: up to kAttnMaxDim, or up to kAttnMaxDimWide with at most
// 2 rows per warp (more would not fit an A100's shared memory, nor its registers).
template <int RPW>
void attn_launch(const AttnParams& p, int n_splits, cudaStream_t s) {
    if (p.head_dim <= kAttnMaxDim) {
        attn_launch_dim<RPW, kAttnMaxDim>(p, n_splits, s);
    } else if constexpr (RPW <= 2) {
        attn_launch_dim<RPW, kAttnMaxDimWide>(p, n_splits, s);
    } else {
        CUDA_REQUIRE(false, "paged attention: heads wider than 256 need 2 rows per warp");
    }
}

}  // namespace kvrun::cu
