// Paged attention for many tokens (prompt prefill, chunked prefill): two kernels.
//
// The flash kernel (f16/q8/q4 caches, head_dim 64, 96 or 128): tensor cores. A thread block
// of 4 warps serves 64 query rows (token x head of one KV head's group, as in
// attention.cuh) and walks the keys in tiles of 64, gathered from the paged pools into
// shared memory as f16 (K row-major, V transposed). Each warp owns 16 rows: S = Q K^T with
// mma.m16n8k16 (Q scaled and rounded to f16 once, f32 accumulators), the online softmax on
// the accumulator fragments (the quad of lanes that holds a row reduces its max and sum),
// then P (rounded to f16) times V into f32 output fragments. This is what flash-attention 2
// does; the rounding of q and P to f16 puts it about 1e-7 (NMSE) from the f32 reference
// where the f32 kernel is at 1e-12.
//
// The f32 kernel (attention.cuh: 32 query rows per block, FMA in f32) takes f32 caches,
// other head sizes, and everything when KVRUN_PREFILL_ATTN=f32.
#include <cstdlib>
#include <string>
#include <string_view>

#include "cuda/attention.cuh"
#include "cuda/mma.cuh"
#include "cuda/ops.h"

namespace kvrun {

namespace {

constexpr int kPrefillRowsPerWarp = 8;  // f32 kernel: 32 query rows per block
// Heads wider than 256 (DeepSeek's 576): 8 rows per block, so that q and the K and V tiles
// (166 KB; 95 KB when V reads K's rows) fit an A100's 163 KiB of shared memory, and the
// accumulators (18 per lane and row) stay in registers.
constexpr int kPrefillWideRowsPerWarp = 2;

constexpr int kFlashWarps = 4;
constexpr int kFlashRows = 16 * kFlashWarps;  // query rows per block
constexpr int kFlashKeys = 64;                // keys per tile

// Shared memory of the flash kernel for head size D: K [64][D + 8] and V^T [D][64 + 8] in
// f16 (the padding puts the 8 rows a fragment load touches in different banks), the tile's
// row table [3][64] and the block's tokens [2][64].
constexpr size_t flash_smem_bytes(int D) {
    return sizeof(__half) * (size_t(kFlashKeys) * (D + 8) + size_t(D) * (kFlashKeys + 8)) +
           sizeof(int32_t) * (3 * kFlashKeys + 2 * kFlashRows);
}

// Bytes 0, 1 (lo) and 2, 3 (hi) of w as half2s of (byte - bias), with no conversion
// instruction: byte u under the exponent bits 0x64 is the f16 1024 + u, and 1024 + bias is
// subtracted exactly.
__device__ __forceinline__ void flash_bytes_to_half2(uint32_t w, float bias, __half2& lo,
                                                     __half2& hi) {
    const uint32_t l = __byte_perm(w, 0x64646464u, 0x4140u);  // [b0, 0x64, b1, 0x64]
    const uint32_t h = __byte_perm(w, 0x64646464u, 0x4342u);  // [b2, 0x64, b3, 0x64]
    const __half2 off = __float2half2_rn(1024.0f + bias);
    lo = __hsub2(*reinterpret_cast<const __half2*>(&l), off);
    hi = __hsub2(*reinterpret_cast<const __half2*>(&h), off);
}

// 8 values of a q8 / q4 row as f16 in 4 registers (channel pairs, low half first), from
// kv_fetch8's bytes. Codes are scaled in f16 arithmetic: the code and the f16 scale are exact
// in f16, so __hmul2 rounds their exact product once, to the f16 that kv_decode8's f32 value
// rounds to (the same bits, fewer instructions).
__device__ __forceinline__ uint4 flash_codes8(const cu::KvRaw8& raw, KvType type, KvRole role) {
    __half2 d[4];
    if (role == KvRole::K) {  // per-channel scales c0 .. c0 + 7
        const __half2* h = reinterpret_cast<const __half2*>(&raw.a);
#pragma unroll
        for (int k = 0; k < 4; ++k) d[k] = h[k];
    } else {  // one scale for the row's 8 channels
        const __half2 dv = __half2half2(__ushort_as_half(static_cast<unsigned short>(raw.b.z)));
#pragma unroll
        for (int k = 0; k < 4; ++k) d[k] = dv;
    }
    __half2 q[4];
    if (type == KvType::Q8) {  // signed bytes: flipping the sign bit adds 128
        flash_bytes_to_half2(raw.b.x ^ 0x80808080u, 128.0f, q[0], q[1]);
        flash_bytes_to_half2(raw.b.y ^ 0x80808080u, 128.0f, q[2], q[3]);
    } else {  // nibble e of the word is channel e; code = nibble - 8
        const uint32_t lo = raw.b.x & 0x0f0f0f0fu, hi = (raw.b.x >> 4) & 0x0f0f0f0fu;
        flash_bytes_to_half2(__byte_perm(lo, hi, 0x5140u), 8.0f, q[0], q[1]);  // channels 0-3
        flash_bytes_to_half2(__byte_perm(lo, hi, 0x7362u), 8.0f, q[2], q[3]);  // channels 4-7
    }
    uint4 out;
    uint32_t* o = reinterpret_cast<uint32_t*>(&out);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const __half2 v = __hmul2(q[k], d[k]);
        o[k] = *reinterpret_cast<const uint32_t*>(&v);
    }
    return out;
}

// 8 values of tile row j (channels c0 .. c0 + 7) as f16 in 4 registers: copied from an f16
// stage or pool row, decoded from a q8 / q4 one, zeros for a missing row.
__device__ __forceinline__ uint4 flash_fetch8(const cu::AttnParams& p, const void* pool,
                                              const __half* stage, KvType type, KvRole role,
                                              const KvHeadLayout& L, const cu::AttnTileRows& rows,
                                              int kvh, int j, int c0) {
    if (rows.st[j] >= 0)
        return *reinterpret_cast<const uint4*>(cu::attn_stage_row(p, stage, rows, kvh, j) + c0);
    if (rows.pb[j] < 0) return make_uint4(0u, 0u, 0u, 0u);
    const uint8_t* blk = cu::attn_head_block(p, pool, L, rows, kvh, j);
    if (type == KvType::F16)
        return *reinterpret_cast<const uint4*>(blk + 2 * (int64_t(rows.r[j]) * p.head_dim + c0));
    return flash_codes8(cu::kv_fetch8(blk, type, role, L, p.head_dim, rows.r[j], c0), type, role);
}

// Gathers the 64 key rows described by `rows` of KV head kvh: K into k_s[64][D + 8]
// (consecutive threads take consecutive 16-byte pieces of a row) and V transposed into
// v_t[D][64 + 8] (consecutive threads take consecutive keys, so a warp's stores of one
// channel fill consecutive halves).
template <int D>
__device__ __forceinline__ void flash_load_tile(__half* __restrict__ k_s, __half* __restrict__ v_t,
                                                const cu::AttnParams& p,
                                                const cu::AttnTileRows& rows, int kvh) {
    constexpr int kChunks = D / 8, KS = D + 8, VS = kFlashKeys + 8;
    for (int c = threadIdx.x; c < kFlashKeys * kChunks; c += blockDim.x) {
        const int j = c / kChunks, ch = c % kChunks;
        *reinterpret_cast<uint4*>(k_s + j * KS + ch * 8) =
            flash_fetch8(p, p.k, p.k_stage, p.k_type, KvRole::K, p.k_layout, rows, kvh, j, ch * 8);
    }
    for (int c = threadIdx.x; c < kFlashKeys * kChunks; c += blockDim.x) {
        const int j = c % kFlashKeys, ch = c / kFlashKeys;
        const uint4 u =
            flash_fetch8(p, p.v, p.v_stage, p.v_type, KvRole::V, p.v_layout, rows, kvh, j, ch * 8);
        const __half* h = reinterpret_cast<const __half*>(&u);
#pragma unroll
        for (int e = 0; e < 8; ++e) v_t[(ch * 8 + e) * VS + j] = h[e];
    }
}

__device__ __forceinline__ uint32_t lds32(const __half* p) {
    return *reinterpret_cast<const uint32_t*>(p);
}

template <int D>
__global__ void __launch_bounds__(kFlashWarps * 32) flash_prefill_kernel(cu::AttnParams p) {
    static_assert(D % 16 == 0 && D <= 128, "flash kernel: head_dim a multiple of 16, <= 128");
    constexpr int KS = D + 8, VS = kFlashKeys + 8;
    constexpr int NT = kFlashKeys / 8;  // 8-key column tiles of S
    constexpr int KD = D / 16;          // 16-channel steps of Q K^T
    constexpr int ND = D / 8;           // 8-channel column tiles of O
    constexpr unsigned kFull = 0xffffffffu;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __half* k_s = reinterpret_cast<__half*>(smem_raw);         // [64][KS]
    __half* v_t = k_s + kFlashKeys * KS;                       // [D][VS]
    int32_t* meta = reinterpret_cast<int32_t*>(v_t + D * VS);  // [3][64]
    const cu::AttnTileRows tile{meta, meta + kFlashKeys, meta + 2 * kFlashKeys};
    int32_t* tok_seq = meta + 3 * kFlashKeys;  // [64]
    int32_t* tok_slot = tok_seq + kFlashRows;  // [64]

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, t4 = lane % 4;
    const int kvh = blockIdx.y / p.n_head_sub, hsub = blockIdx.y % p.n_head_sub;
    const int Gs = p.heads_per_cta;
    const int64_t t0 = int64_t(blockIdx.x) * p.tokens_per_cta;
    const int n_tok = int(min(int64_t(p.tokens_per_cta), p.n_tokens - t0));
    for (int i = tid; i < n_tok; i += blockDim.x) {
        tok_seq[i] = p.token_seq[t0 + i];
        tok_slot[i] = p.token_slot[t0 + i];
    }
    __syncthreads();

    // The lane's two rows: warp * 16 + g and that + 8 (fragment rows g and g + 8).
    int row_tok[2];      // local token, -1 when the row is unused
    int64_t row_end[2];  // exclusive key limit (slot + 1)
    int64_t row_lo[2];   // first visible key (window or chunk), else 0
    int64_t row_out[2];  // row index into q / out: token * n_head + head
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = warp * 16 + g + 8 * i, tl = r / Gs, hg = hsub * Gs + r % Gs;
        const bool valid = tl < n_tok && hg < p.group;
        row_tok[i] = valid ? tl : -1;
        row_end[i] = valid ? int64_t(tok_slot[tl]) + 1 : 0;
        row_lo[i] = valid ? attn_first_slot(tok_slot[tl], p.window) : 0;
        row_out[i] = valid ? (t0 + tl) * p.n_head + int64_t(kvh) * p.group + hg : 0;
    }
    // Q fragments, scaled and rounded once: register e of step ks holds row (e & 1) and
    // channels ks * 16 + 2 t4 (+ 8 for e >= 2).
    uint32_t qa[KD][4];
#pragma unroll
    for (int ks = 0; ks < KD; ++ks)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = e & 1, c = ks * 16 + 2 * t4 + (e >= 2 ? 8 : 0);
            float2 f = make_float2(0.0f, 0.0f);
            if (row_tok[i] >= 0) f = *reinterpret_cast<const float2*>(p.q + row_out[i] * D + c);
            qa[ks][e] = cu::pack_half2(f.x * p.scale, f.y * p.scale);
        }
    float o[ND][4];
#pragma unroll
    for (int nd = 0; nd < ND; ++nd) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // l: this lane's columns only

    for (int sb = 0; sb < n_tok;) {
        const cu::AttnSegment sg =
            cu::attn_segment(p, tok_seq, tok_slot, sb, n_tok, t0, 0, INT64_MAX, kFlashKeys);
        bool in_seg[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) in_seg[i] = row_tok[i] >= sb && row_tok[i] < sg.end;
        for (int64_t k0 = sg.key_begin; k0 < sg.key_end; k0 += kFlashKeys) {
            __syncthreads();  // the previous tile is fully consumed
            if (tid < kFlashKeys) cu::attn_tile_row(p, tile, sg, k0, tid);
            __syncthreads();
            flash_load_tile<D>(k_s, v_t, p, tile, kvh);
            __syncthreads();

            // S = Q K^T: s[nt][e] is row (e >= 2), key k0 + nt * 8 + 2 t4 + (e & 1).
            float s[NT][4];
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
                const __half* krow = k_s + (nt * 8 + g) * KS + 2 * t4;
#pragma unroll
                for (int ks = 0; ks < KD; ++ks) {
                    const uint32_t b[2] = {lds32(krow + ks * 16), lds32(krow + ks * 16 + 8)};
                    cu::mma_16816(s[nt], qa[ks], b);
                }
            }
            // Online softmax per row: the 4 lanes of a quad hold a row's 64 scores.
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                float mx = -INFINITY;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        float& sv = s[nt][2 * i + e];
                        if (p.softcap > 0.0f) sv = p.softcap * tanhf(sv / p.softcap);
                        const int64_t key = k0 + nt * 8 + 2 * t4 + e;
                        const bool ok = in_seg[i] && key < row_end[i] && key >= row_lo[i];
                        sv = ok ? sv : -INFINITY;
                        mx = fmaxf(mx, sv);
                    }
                mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 2));
                const float m_new = fmaxf(m[i], mx);
                // Nothing visible yet: p = 0 (and the row's output is still all zeros).
                const float corr = m_new == -INFINITY ? 1.0f : expf(m[i] - m_new);
                float sum = 0.0f;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        float& sv = s[nt][2 * i + e];
                        sv = sv == -INFINITY ? 0.0f : expf(sv - m_new);
                        sum += sv;
                    }
                l[i] = l[i] * corr + sum;
                m[i] = m_new;
#pragma unroll
                for (int nd = 0; nd < ND; ++nd) o[nd][2 * i] *= corr, o[nd][2 * i + 1] *= corr;
            }
            // O += P V: the S fragments of keys 16 kk .. 16 kk + 15 are P's A fragment.
#pragma unroll
            for (int kk = 0; kk < kFlashKeys / 16; ++kk) {
                const uint32_t a[4] = {cu::pack_half2(s[2 * kk][0], s[2 * kk][1]),
                                       cu::pack_half2(s[2 * kk][2], s[2 * kk][3]),
                                       cu::pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                       cu::pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
                for (int nd = 0; nd < ND; ++nd) {
                    const __half* vcol = v_t + (nd * 8 + g) * VS + kk * 16 + 2 * t4;
                    const uint32_t b[2] = {lds32(vcol), lds32(vcol + 8)};
                    cu::mma_16816(o[nd], a, b);
                }
            }
        }
        sb = sg.end;
    }

#pragma unroll
    for (int i = 0; i < 2; ++i) {
        l[i] += __shfl_xor_sync(kFull, l[i], 1);
        l[i] += __shfl_xor_sync(kFull, l[i], 2);
        if (row_tok[i] < 0) continue;
        const float inv = cu::attn_out_scale(m[i], l[i], p.sinks, row_out[i] % p.n_head);
        float* dst = p.out + row_out[i] * D + 2 * t4;
#pragma unroll
        for (int nd = 0; nd < ND; ++nd)
            *reinterpret_cast<float2*>(dst + nd * 8) =
                make_float2(o[nd][2 * i] * inv, o[nd][2 * i + 1] * inv);
    }
}

template <int D>
void flash_launch(const cu::AttnParams& p, cudaStream_t s) {
    const dim3 grid(unsigned(cu::ceil_div(p.n_tokens, p.tokens_per_cta)),
                    unsigned(p.n_kv_head * p.n_head_sub));
    flash_prefill_kernel<D><<<grid, kFlashWarps * 32, flash_smem_bytes(D), s>>>(p);
    CUDA_CHECK_LAUNCH();
}

// KVRUN_PREFILL_ATTN, read once: true when it asks for the f32 kernel.
bool prefill_forced_f32() {
    static const bool f32 = cuda_env_switch("KVRUN_PREFILL_ATTN", "f32");
    return f32;
}

}  // namespace

bool cuda_flash_attention_supports(const KvLayerView& kv) {
    const bool dim = kv.head_dim == 64 || kv.head_dim == 96 || kv.head_dim == 128;
    return dim && !kv.v_is_k && kv.k_type != KvType::F32 && kv.v_type != KvType::F32;
}

void cuda_paged_attention_flash(float* out, const float* q, const KvLayerView& kv,
                                const KvBatchView& batch, int64_t n_head, float scale,
                                cudaStream_t s, float softcap, int64_t window, const float* sinks) {
    CUDA_REQUIRE(cuda_flash_attention_supports(kv),
                 "flash attention: needs head_dim 64, 96 or 128 and no f32 pool");
    const cu::AttnParams p = cu::attn_params(out, q, kv, batch, n_head, scale, kFlashRows, false,
                                             softcap, window, sinks);
    if (p.n_tokens == 0) return;
    switch (p.head_dim) {
        case 64:
            flash_launch<64>(p, s);
            break;
        case 96:
            flash_launch<96>(p, s);
            break;
        default:
            flash_launch<128>(p, s);
            break;
    }
}

void cuda_paged_attention_tiled(float* out, const float* q, const KvLayerView& kv,
                                const KvBatchView& batch, int64_t n_head, float scale,
                                cudaStream_t s, float softcap, int64_t window, const float* sinks) {
    const bool wide = kv.head_dim > cu::kAttnMaxDim;
    const int rpw = wide ? kPrefillWideRowsPerWarp : kPrefillRowsPerWarp;
    const cu::AttnParams p = cu::attn_params(out, q, kv, batch, n_head, scale,
                                             cu::kAttnWarps * rpw, false, softcap, window, sinks);
    if (p.n_tokens == 0) return;
    if (wide)
        cu::attn_launch<kPrefillWideRowsPerWarp>(p, 1, s);
    else
        cu::attn_launch<kPrefillRowsPerWarp>(p, 1, s);
}

void cuda_paged_attention_prefill(float* out, const float* q, const KvLayerView& kv,
                                  const KvBatchView& batch, int64_t n_head, float scale,
                                  cudaStream_t s, float softcap, int64_t window,
                                  const float* sinks) {
    if (cuda_flash_attention_supports(kv) && !prefill_forced_f32())
        cuda_paged_attention_flash(out, q, kv, batch, n_head, scale, s, softcap, window, sinks);
    else
        cuda_paged_attention_tiled(out, q, kv, batch, n_head, scale, s, softcap, window, sinks);
}

}  // namespace kvrun

namespace kvrun {

namespace {

// One warp: d = a b through cu::mma_16816 (fragments built as the flash kernel builds them).
__global__ void mma_tile_kernel(float* __restrict__ d, const __half* __restrict__ a,
                                const __half* __restrict__ b) {
    const int lane = int(threadIdx.x), g = lane / 4, t = lane % 4;
    auto a2 = [&](int r, int c) { return lds32(a + r * 16 + c); };  // A[r][c, c + 1]
    auto b2 = [&](int k, int n) {  // B[k, k + 1][n] (two rows of row-major b)
        return cu::pack_half2(__half2float(b[k * 8 + n]), __half2float(b[(k + 1) * 8 + n]));
    };
    const uint32_t af[4] = {a2(g, 2 * t), a2(g + 8, 2 * t), a2(g, 2 * t + 8), a2(g + 8, 2 * t + 8)};
    const uint32_t bf[2] = {b2(2 * t, g), b2(2 * t + 8, g)};
    float df[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    cu::mma_16816(df, af, bf);
    d[g * 8 + 2 * t] = df[0];
    d[g * 8 + 2 * t + 1] = df[1];
    d[(g + 8) * 8 + 2 * t] = df[2];
    d[(g + 8) * 8 + 2 * t + 1] = df[3];
}

}  // namespace

void cuda_mma_16816_tile(float* d, const uint16_t* a, const uint16_t* b, cudaStream_t s) {
    mma_tile_kernel<<<1, 32, 0, s>>>(d, reinterpret_cast<const __half*>(a),
                                     reinterpret_cast<const __half*>(b));
    CUDA_CHECK_LAUNCH();
}

}  // namespace kvrun
