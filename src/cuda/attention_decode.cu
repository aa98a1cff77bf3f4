// Paged attention for few tokens (decode steps): one thread block per (token, KV head and
// head subgroup, context split), serving up to 8 query heads of the GQA group from one read
// of each K/V row. Long contexts are split across blocks (split-K) so the GPU stays busy even
// for one sequence; a second kernel merges the partial results with log-sum-exp weights.
//
// The splits start at fixed slots (multiples of a length that depends only on the pool), not
// at a fraction of the batch's longest context: a token's partial sums, their merge and so
// its output are then the same bit for bit whatever else is in the batch. A speculative
// verification pass over K + 1 tokens thus reproduces K + 1 single-token decode steps.
//
// Why not the tiled kernel of attention.cuh (prefill's): it converts every 32-key tile to f32
// in shared memory (4-way bank conflicts on the stores) and every warp re-reads the whole
// tile: about 3000 shared-memory wavefronts per tile against about 1100 cycles of an H100
// SM's share of DRAM bandwidth for the tile's bytes (an estimate, not a measurement), so with
// one token per block shared memory, not DRAM, bounds decode; and for MHA models 7 of its 8
// query rows are empty. decode_attention_kernel reads K and V from global memory straight into
// registers:
//  - a key group of L lanes (L = 4, 8, 16, 32: the power of two >= head_dim / 8) holds one key
//    row, 8 channels per lane; a warp reads 32 / L consecutive rows per step, so its loads are
//    coalesced. A lane issues a step's loads (kv_fetch8: kv_decode8's vector loads, any pool
//    format; one 16-byte load from the f16 stage) two steps before it converts and uses the
//    values (kv_unpack8), the V loads of a tile's first steps with its first K loads: the
//    format branches keep the compiler from hoisting loads across steps by itself;
//  - the block's keys are walked in 32-key tiles, tile i by warp i % 4. Per tile a warp first
//    computes the 32 scores (each group's dot products reduced over its L lanes with xor
//    shuffles; the lane whose index in the group is j keeps the score of the group's j-th
//    key), then updates its online softmax once (one max and one rescale per tile and row,
//    not per key as separate per-group states would need), then accumulates p * V with each
//    p shuffled from the lane that holds it;
//  - q (scaled) and the accumulators stay in registers, 8 values per lane and row; rows = 1,
//    2, 4, 8 (the smallest power of two >= the block's query heads), so an MHA model's
//    block computes one row, not eight;
//  - at the end the groups of a warp are summed (they share the warp's running max) and the 4
//    warps merged through shared memory with log-sum-exp weights, in a fixed order. The
//    unsplit output is num * (1 / den), as merge_splits_kernel scales its sum, so a context
//    inside one split gives the same bits through either path. Nothing reads another token.
// head_dim % 8 != 0 (no 8-channel chunks), heads wider than 256 and a V that reads K's rows
// (DeepSeek's latent cache) take the tiled kernel. The environment variable
// KVRUN_DECODE_ATTN=tiled (read once per process) makes every decode batch take the tiled
// kernel, to A/B the two on a GPU: `KVRUN_DECODE_ATTN=tiled kvrun bench ...`; unset or
// "auto" is the default choice, other values are an error.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "cuda/attention.cuh"
#include "cuda/ops.h"

namespace kvrun {
namespace {

constexpr int kDecodeRowsPerWarp = 2;  // tiled kernel: 8 query heads per block
constexpr int kDecodeMaxRows = cu::kAttnWarps * kDecodeRowsPerWarp;  // both kernels
constexpr int kDecodeThreads = cu::kAttnWarps * cu::kWarp;
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
// empty for it). One thread per output element. With xq (D % 32 == 0), out is also quantized
// for the integer GEMV.
__global__ void merge_splits_kernel(float* __restrict__ out, const float* __restrict__ part_o,
                                    const float* __restrict__ part_ml,
                                    const int32_t* __restrict__ token_slot, int64_t n_tokens,
                                    int n_head, int D, int n_splits, int64_t split_len,
                                    const float* __restrict__ sinks, int8_t* __restrict__ xq,
                                    float* __restrict__ xd, int xq_bytes) {
    cu::pdl_begin();
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
    const float o = num * cu::attn_out_scale(mx, den, sinks, row % n_head);
    out[idx] = o;
    if (xq) cu::quantize_x_store(o, idx, xq, xd, xq_bytes);  // whole warps: n_out % 32 == 0
}

// Where a tile's key is read from (computed by lane j for key j of the tile, shuffled to the
// lanes that read it): a pool block id (>= 0), kMasked (not visible: past the token or the
// split, or an invalid block id), or the token's stage s as -2 - s (its own block, staged).
constexpr int kMasked = -1;

// One step's share of a lane: the raw bytes of 8 channels of a K or V row and their source.
struct DecodeChunk {
    cu::KvRaw8 raw;  // zeros for a masked key or a lane past head_dim
    int src;
};

// Issues the loads of step j (key grp + G * j of the tile; lane k holds src / row of key k)
// for channels c0 .. c0 + 7 (`on` false: past head_dim) of KV head kvh, K or V.
template <int G>
__device__ __forceinline__ DecodeChunk decode_fetch(const cu::AttnParams& p, KvRole role, int src,
                                                    int row, int j, int grp, int kvh, int c0,
                                                    bool on) {
    const int k = grp + G * j;
    DecodeChunk ch{{}, __shfl_sync(0xffffffffu, src, k)};
    const int r = __shfl_sync(0xffffffffu, row, k);
    if (!on || ch.src == kMasked) return ch;
    const bool is_k = role == KvRole::K;
    if (ch.src < kMasked) {  // f16 stage row
        const __half* stage = is_k ? p.k_stage : p.v_stage;
        const int64_t st = -2 - ch.src;
        ch.raw.a = *reinterpret_cast<const uint4*>(
            stage + ((st * p.n_kv_head + kvh) * p.block_size + r) * p.head_dim + c0);
    } else {
        const KvHeadLayout& layout = is_k ? p.k_layout : p.v_layout;
        const uint8_t* blk = static_cast<const uint8_t*>(is_k ? p.k : p.v) +
                             (int64_t(ch.src) * p.n_kv_head + kvh) * layout.bytes;
        ch.raw = cu::kv_fetch8(blk, is_k ? p.k_type : p.v_type, role, layout, p.head_dim, r, c0);
    }
    return ch;
}

// The f32 values of a fetched chunk.
__device__ __forceinline__ void decode_unpack(float* __restrict__ out, const DecodeChunk& ch,
                                              KvType pool_type, KvRole role) {
    cu::kv_unpack8(out, ch.raw, ch.src < kMasked ? KvType::F16 : pool_type, role);
}

// One block: token blockIdx.x, KV head and head subgroup blockIdx.y, context split
// blockIdx.z; R query rows (heads), key groups of L lanes (see the top of the file).
// Writes out (unsplit) or the split's partials in merge_splits_kernel's format.
template <int R, int L>
__global__ void __launch_bounds__(kDecodeThreads) decode_attention_kernel(cu::AttnParams p) {
    cu::pdl_begin();
    constexpr int W = cu::kAttnWarps;
    constexpr int G = cu::kWarp / L;  // key groups per warp = keys per step
    // Steps in flight: a step's K (V) loads are issued P steps before its values are needed,
    // so a tile starts with P K and P V chunks in flight per lane. At sm_90, P = 2 costs 96
    // registers for one row (5 blocks per SM); P = 3 costs 116, P = 4 spills.
    constexpr int P = 2;
    constexpr unsigned kFull = 0xffffffffu;
    __shared__ __align__(16) float red_acc[W][R][L * 8];  // each warp's accumulators
    __shared__ float red_w[W][R], red_l[W][R];  // its running max, then its merge weight; sum
    __shared__ float red_max[R], red_den[R];    // the block's max and sum per row

    const int tid = threadIdx.x, lane = tid % cu::kWarp, warp = tid / cu::kWarp;
    const int grp = lane / L, gl = lane % L, c0 = gl * 8;  // key group, lane in it, channels
    const int D = p.head_dim;
    const bool lane_on = c0 < D;
    const int kvh = blockIdx.y / p.n_head_sub, hsub = blockIdx.y % p.n_head_sub;
    const int n_rows = min(p.heads_per_cta, p.group - hsub * p.heads_per_cta);  // <= R
    const int64_t t = blockIdx.x, head0 = int64_t(kvh) * p.group + hsub * p.heads_per_cta;
    const int seq = p.token_seq[t], slot = p.token_slot[t], bs = p.block_size;
    const int64_t begin = int64_t(blockIdx.z) * p.split_len;
    const int64_t end = min(int64_t(slot) + 1, begin + p.split_len);  // keys [begin, end)
    // With a window (or chunk), keys before lo are not visible, and the tiles before lo's are
    // skipped.
    const int64_t lo = attn_first_slot(slot, p.window);
    const int64_t first = max(begin, lo > 0 ? lo / cu::kAttnTile * cu::kAttnTile : int64_t(0));
    // Staged caches: the token's own block comes from its stage (when the stage id is valid).
    int own_block = -1, own_stage = 0;
    if (p.token_stage != nullptr && slot >= 0) {
        const int st = p.token_stage[t];
        if (st >= 0 && st < p.n_stages) own_block = slot / bs, own_stage = st;
    }

    float q[R][8];  // channels c0 .. c0 + 7 of each row, times scale (zeros: no such row)
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int e = 0; e < 8; ++e) q[r][e] = 0.0f;
        if (lane_on && r < n_rows) {
            const float* qr = p.q + (t * p.n_head + head0 + r) * D + c0;
#pragma unroll
            for (int e = 0; e < 8; ++e) q[r][e] = qr[e] * p.scale;
        }
    }
    // The warp's online softmax: running max m (the same in every lane), this lane's share of
    // the sum (its own keys' p), and the sums of p * V of the lane's group and channels.
    float m[R], l[R], acc[R][8];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        m[r] = -INFINITY, l[r] = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[r][e] = 0.0f;
    }

    for (int64_t k0 = first + int64_t(warp) * cu::kAttnTile; k0 < end; k0 += W * cu::kAttnTile) {
        // Lane j: the source of key k0 + j (end <= slot + 1, so a visible key fits an int).
        int src = kMasked, row = 0;
        if (k0 + lane < end && k0 + lane >= lo && seq >= 0) {
            const int key = int(k0 + lane), blk = key / bs;
            row = key - blk * bs;
            if (blk < p.max_blocks_per_seq) {
                const int32_t pb = p.block_table[int64_t(seq) * p.max_blocks_per_seq + blk];
                if (pb >= 0 && pb < p.n_blocks) src = blk == own_block ? -2 - own_stage : pb;
            }
        }
        // Step j: group grp reads key grp + G * j of the tile; steps past the range are skipped.
        const int n_steps = int(min(int64_t(L), (end - k0 + G - 1) / G));
        DecodeChunk kc[P], vc[P];  // steps j0 + u, u < P, in flight
#pragma unroll
        for (int u = 0; u < P; ++u) {
            if (u >= n_steps) break;
            kc[u] = decode_fetch<G>(p, KvRole::K, src, row, u, grp, kvh, c0, lane_on);
            vc[u] = decode_fetch<G>(p, KvRole::V, src, row, u, grp, kvh, c0, lane_on);
        }

        // Scores: the lane at index j of its group keeps the score of the group's j-th key.
        float s_own[R];
#pragma unroll
        for (int r = 0; r < R; ++r) s_own[r] = -INFINITY;
        for (int j0 = 0; j0 < n_steps; j0 += P) {
#pragma unroll
            for (int u = 0; u < P; ++u) {
                const int j = j0 + u;
                if (j >= n_steps) break;
                float kf[8];
                decode_unpack(kf, kc[u], p.k_type, KvRole::K);
                const bool visible = kc[u].src != kMasked;
                if (j + P < n_steps)
                    kc[u] = decode_fetch<G>(p, KvRole::K, src, row, j + P, grp, kvh, c0, lane_on);
                float s[R];
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    s[r] = 0.0f;
#pragma unroll
                    for (int e = 0; e < 8; ++e) s[r] = fmaf(q[r][e], kf[e], s[r]);
                }
                // A butterfly: every lane of the group ends with the same bits (a + b == b + a).
#pragma unroll
                for (int o = 1; o < L; o <<= 1)
#pragma unroll
                    for (int r = 0; r < R; ++r) s[r] += __shfl_xor_sync(kFull, s[r], o);
                if (gl == j && visible)
#pragma unroll
                    for (int r = 0; r < R; ++r)
                        s_own[r] = p.softcap > 0.0f ? p.softcap * tanhf(s[r] / p.softcap) : s[r];
            }
        }

        // Softmax update, once per tile: m is warp-uniform, so are the branches.
        float pr[R];  // p of this lane's key
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float m_new = fmaxf(m[r], cu::warp_max(s_own[r]));
            pr[r] = 0.0f;
            if (m_new == -INFINITY) continue;  // nothing visible yet
            const float corr = expf(m[r] - m_new);
            pr[r] = expf(s_own[r] - m_new);
            l[r] = l[r] * corr + pr[r];
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[r][e] *= corr;
            m[r] = m_new;
        }

        // p * V: the p of the group's j-th key is held by the lane at index j of the group.
        for (int j0 = 0; j0 < n_steps; j0 += P) {
#pragma unroll
            for (int u = 0; u < P; ++u) {
                const int j = j0 + u;
                if (j >= n_steps) break;
                float vf[8];
                decode_unpack(vf, vc[u], p.v_type, KvRole::V);
                if (j + P < n_steps)
                    vc[u] = decode_fetch<G>(p, KvRole::V, src, row, j + P, grp, kvh, c0, lane_on);
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    const float pj = __shfl_sync(kFull, pr[r], grp * L + j);
#pragma unroll
                    for (int e = 0; e < 8; ++e) acc[r][e] = fmaf(pj, vf[e], acc[r][e]);
                }
            }
        }
    }

    // The groups of a warp share its running max: their sums simply add up.
#pragma unroll
    for (int r = 0; r < R; ++r) l[r] = cu::warp_sum(l[r]);
#pragma unroll
    for (int o = L; o < cu::kWarp; o <<= 1)
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[r][e] += __shfl_xor_sync(kFull, acc[r][e], o);
    if (lane < L) {
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int e = 0; e < 8; ++e) red_acc[warp][r][c0 + e] = acc[r][e];
    }
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r) red_w[warp][r] = m[r], red_l[warp][r] = l[r];
    }
    __syncthreads();
    if (tid < R) {  // row tid: the block's max, each warp's weight exp(m_w - max), the sum
        const int r = tid;
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < W; ++w) mx = fmaxf(mx, red_w[w][r]);
        float den = 0.0f;
#pragma unroll
        for (int w = 0; w < W; ++w) {
            const float wt = mx == -INFINITY ? 0.0f : expf(red_w[w][r] - mx);
            den += wt * red_l[w][r];
            red_w[w][r] = wt;
        }
        red_max[r] = mx, red_den[r] = den;
    }
    __syncthreads();
    for (int i = tid; i < n_rows * D; i += kDecodeThreads) {
        const int r = i / D, d = i - r * D;
        float num = 0.0f;
#pragma unroll
        for (int w = 0; w < W; ++w) num += red_w[w][r] * red_acc[w][r][d];
        const int64_t orow = t * p.n_head + head0 + r;
        if (p.part_o) {
            const int64_t prow = int64_t(blockIdx.z) * p.n_tokens * p.n_head + orow;
            p.part_o[prow * D + d] = num;
            if (d == 0) p.part_ml[prow * 2] = red_max[r], p.part_ml[prow * 2 + 1] = red_den[r];
        } else {
            // num * (1 / den), as merge_splits_kernel scales its sum.
            const float o = num * cu::attn_out_scale(red_max[r], red_den[r], p.sinks, head0 + r);
            p.out[orow * D + d] = o;
            // Whole warps (n_rows * D % 32 == 0), e % 32 == lane (D % 32 == 0).
            if (p.xq) cu::quantize_x_store(o, orow * D + d, p.xq, p.xd, p.xq_bytes);
        }
    }
}

template <int R, int L>
void decode_launch(const cu::AttnParams& p, int n_splits, cudaStream_t s) {
    const dim3 grid(unsigned(p.n_tokens), unsigned(p.n_kv_head * p.n_head_sub), unsigned(n_splits));
    cu::launch_pdl(decode_attention_kernel<R, L>, grid, kDecodeThreads, 0, s, p);
}

// L: the power of two >= head_dim / 8 (head_dim % 8 == 0, <= 256).
template <int R>
void decode_launch_rows(const cu::AttnParams& p, int n_splits, cudaStream_t s) {
    const int chunks = p.head_dim / 8;
    if (chunks <= 4)
        decode_launch<R, 4>(p, n_splits, s);
    else if (chunks <= 8)
        decode_launch<R, 8>(p, n_splits, s);
    else if (chunks <= 16)
        decode_launch<R, 16>(p, n_splits, s);
    else
        decode_launch<R, 32>(p, n_splits, s);
}

// The decode kernel over grid (tokens, KV heads x head subgroups, n_splits): R is the power
// of two >= heads_per_cta (<= kDecodeMaxRows).
void decode_attention_launch(const cu::AttnParams& p, int n_splits, cudaStream_t s) {
    if (p.heads_per_cta <= 1)
        decode_launch_rows<1>(p, n_splits, s);
    else if (p.heads_per_cta <= 2)
        decode_launch_rows<2>(p, n_splits, s);
    else if (p.heads_per_cta <= 4)
        decode_launch_rows<4>(p, n_splits, s);
    else
        decode_launch_rows<8>(p, n_splits, s);
}

// KVRUN_DECODE_ATTN, read once: true when it asks for the tiled kernel.
bool decode_forced_tiled() {
    static const bool tiled = cuda_env_switch("KVRUN_DECODE_ATTN", "tiled");
    return tiled;
}

// Whether a decode batch takes the tiled kernel: head_dim % 8 != 0, heads wider than
// kAttnMaxDim, V reading K's rows (DeepSeek's latent rows, 576 wide) or
// KVRUN_DECODE_ATTN=tiled; else decode_attention_kernel.
bool decode_tiled(const cu::AttnParams& p) {
    return p.head_dim % 8 != 0 || p.head_dim > cu::kAttnMaxDim || p.v_is_k || decode_forced_tiled();
}

void decode_dispatch(const cu::AttnParams& p, int n_splits, cudaStream_t s) {
    if (decode_tiled(p))
        cu::attn_launch<kDecodeRowsPerWarp>(p, n_splits, s);
    else
        decode_attention_launch(p, n_splits, s);
}

}  // namespace

void cuda_paged_attention_decode(float* out, const float* q, const KvLayerView& kv,
                                 const KvBatchView& batch, int64_t n_head, float scale,
                                 CudaScratch& scratch, cudaStream_t s, float softcap,
                                 int64_t window, const float* sinks, const CudaXq* xq) {
    cu::AttnParams p = cu::attn_params(out, q, kv, batch, n_head, scale, kDecodeMaxRows, true,
                                       softcap, window, sinks);
    if (p.n_tokens == 0) return;
    // The quantization for the output projection's integer GEMV: in the decode kernel (or its
    // merge) where a warp writes whole 32-element blocks, else one launch after.
    bool quantize_after = false;
    if (xq) {
        CUDA_REQUIRE(xq->x == out && (xq->elt_bytes == 1 || xq->elt_bytes == 2),
                     "cuda_paged_attention: xq must be made from out");
        if (p.head_dim % 32 == 0 && !decode_tiled(p)) {
            p.xq = xq->q;
            p.xd = xq->d;
            p.xq_bytes = xq->elt_bytes;
        } else {
            quantize_after = true;
        }
    }
    const auto finish = [&] {
        if (quantize_after)
            cuda_quantize_x(out, p.n_tokens, int64_t(p.n_head) * p.head_dim, *xq, s);
    };
    const int64_t ctx = batch.max_blocks_per_seq * kv.block_size;
    const int64_t split_len = split_len_for(kv);
    const int64_t n_splits = cu::ceil_div(ctx, split_len);
    if (n_splits <= 1) {  // every token lies in the first split: one pass, no merge
        decode_dispatch(p, 1, s);
        finish();
        return;
    }
    p.split_len = split_len;
    const size_t rows = size_t(n_splits) * size_t(p.n_tokens) * size_t(p.n_head);
    const size_t o_bytes = (rows * p.head_dim * sizeof(float) + 255) / 256 * 256;
    auto* base = static_cast<uint8_t*>(scratch.get(o_bytes + rows * 2 * sizeof(float), s));
    p.part_o = reinterpret_cast<float*>(base);
    p.part_ml = reinterpret_cast<float*>(base + o_bytes);
    decode_dispatch(p, int(n_splits), s);
    const int64_t n_out = p.n_tokens * p.n_head * p.head_dim;
    cu::launch_pdl(merge_splits_kernel, unsigned(cu::ceil_div(n_out, 256)), 256, 0, s, out,
                   p.part_o, p.part_ml, batch.token_slot, p.n_tokens, p.n_head, p.head_dim,
                   int(n_splits), p.split_len, sinks, p.xq, p.xd, p.xq_bytes);
    finish();
}

void cuda_paged_attention(float* out, const float* q, const KvLayerView& kv,
                          const KvBatchView& batch, int64_t n_head, float scale,
                          CudaScratch& scratch, cudaStream_t s, float softcap, int64_t window,
                          const float* sinks, const CudaXq* xq) {
    if (batch.n_tokens <= kMaxDecodeTokens) {
        cuda_paged_attention_decode(out, q, kv, batch, n_head, scale, scratch, s, softcap, window,
                                    sinks, xq);
        return;
    }
    cuda_paged_attention_prefill(out, q, kv, batch, n_head, scale, s, softcap, window, sinks);
    if (xq) cuda_quantize_x(out, batch.n_tokens, n_head * kv.head_dim, *xq, s);
}

}  // namespace kvrun
