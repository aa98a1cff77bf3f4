// Decode matmul: fused dequantize x vector for every weight type. Each warp owns two weight
// rows; lanes walk the rows' items (32-element blocks / sub-blocks, or 8 floats) so a warp
// reads contiguous memory, each weight byte is read once for up to kMaxRows activation rows,
// each activation value serves both rows, and partial dots are combined with shuffles.
//
// Activations of items of 4+ elements are staged per block in shared memory, chunk by chunk,
// with 16 bytes of padding after each item. Read straight from global memory, lane i's
// 16-byte loads of x[it * kItem ..] sit kItem floats apart: for kItem = 32 all 32 lanes hit
// the same 4 of L1's 32 banks, 32 wavefronts per load where 4 suffice, which (per 2 rows of
// Q4_0 weights: 8 such loads against 1152 weight bytes) costs more L1 cycles than DRAM needs
// to deliver the weights. With a stride of kItem + 4 floats the 8 lanes of each quarter-warp
// land on distinct banks; the block also loads x once instead of once per warp. Each lane
// still sums its items in the same order, so the results are the same bits as before.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/dequant.cuh"
#include "cuda/ops.h"

namespace kvrun {
namespace {

// Block shape and the item loop's unroll depth. The macros let scripts/gemv-variants.sh build
// variants for scripts/gpu-session.sh gemv to time against each other; none changes a lane's
// order of summation, so every variant gives the same bits. On an H100 (2026-11-27,
// docs/performance.md) 8 warps with 4 items in flight per lane beat the first shape (4 warps,
// no unroll) by 5% at one row (7B Q4_0 tg128) and took a third off a 9-row verification
// pass, where a block's x staging is shared by twice the rows. The unroll applies to the 16-row
// instance only (kUnrollFrom): at one row it was worth 2% (241 -> 245 t/s) and unrolling
// every instance took gemv.cu's compile from ~50 s to ~150 s for sm_80 + sm_90 (CI builds both).
#ifndef KVRUN_GEMV_WARPS
#define KVRUN_GEMV_WARPS 8
#endif
#ifndef KVRUN_GEMV_UNROLL
#define KVRUN_GEMV_UNROLL 4
#endif
constexpr int kWarpsPerBlock = KVRUN_GEMV_WARPS;
#ifndef KVRUN_GEMV_UNROLL_FROM
#define KVRUN_GEMV_UNROLL_FROM 16  // the instance that 9 to 16 rows (verification passes) take
#endif
constexpr int kUnrollFrom = KVRUN_GEMV_UNROLL_FROM;
template <int R>
constexpr int kItemUnroll = R >= kUnrollFrom ? KVRUN_GEMV_UNROLL : 1;
constexpr int kRowsPerWarp = 2;
constexpr int kRowsPerBlock = kWarpsPerBlock * kRowsPerWarp;
constexpr int kMaxRows = 16;  // activation rows per pass (template R is 1, 2, 4, 8 or 16)

// Float weights whose rows allow 16-byte loads (8 elements per item).
bool gemv_vec(const WeightView& w) {
    return w.row_bytes % 16 == 0 && w.n_in % 8 == 0;
}

// Staging geometry for loader L and R activation rows: items per chunk (a multiple of 32,
// so every lane keeps its item order; ~18 KiB for kItem = 32 up to R = 4) and the padded
// item stride in floats.
template <class L, int R>
struct XStage {
    static constexpr bool kOn = L::kItem % 4 == 0;
    static constexpr int kStride = L::kItem + 4;
    static constexpr int kChunk = R == 1 ? 128 : R == 2 ? 64 : 32;
    static constexpr size_t kBytes = kOn ? size_t(R) * kChunk * kStride * sizeof(float) : 0;
};

// acc[k][r] += dot(v_k, x row r) for the item's kItem elements; x rows lie x_stride floats
// apart, 16-byte aligned when kItem % 4 == 0.
template <int kItem, int R>
__device__ __forceinline__ void gemv_item(float (&acc)[kRowsPerWarp][R], const float* v0,
                                          const float* v1, const float* xi, int64_t x_stride,
                                          int n_rows) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
        if (r >= n_rows) break;
        const float* xr = xi + r * x_stride;
        if constexpr (kItem % 4 == 0) {
#pragma unroll
            for (int i = 0; i < kItem / 4; ++i) {
                const float4 xv = reinterpret_cast<const float4*>(xr)[i];
                acc[0][r] = fmaf(v0[4 * i], xv.x, acc[0][r]);
                acc[1][r] = fmaf(v1[4 * i], xv.x, acc[1][r]);
                acc[0][r] = fmaf(v0[4 * i + 1], xv.y, acc[0][r]);
                acc[1][r] = fmaf(v1[4 * i + 1], xv.y, acc[1][r]);
                acc[0][r] = fmaf(v0[4 * i + 2], xv.z, acc[0][r]);
                acc[1][r] = fmaf(v1[4 * i + 2], xv.z, acc[1][r]);
                acc[0][r] = fmaf(v0[4 * i + 3], xv.w, acc[0][r]);
                acc[1][r] = fmaf(v1[4 * i + 3], xv.w, acc[1][r]);
            }
        } else {
#pragma unroll
            for (int i = 0; i < kItem; ++i) {
                const float xv = xr[i];
                acc[0][r] = fmaf(v0[i], xv, acc[0][r]);
                acc[1][r] = fmaf(v1[i], xv, acc[1][r]);
            }
        }
    }
}

// One matrix of a launch: n_out rows of row_bytes at w; its blocks are those below
// blocks_end (and at or above the previous matrix's blocks_end).
struct GemvMatrix {
    const uint8_t* w;
    float* out;  // [n_rows][n_out]
    int64_t n_out;
    size_t row_bytes;
    unsigned blocks_end;
    // The sums' factor (WeightView::scale), or for expert launches with expert_scale (device,
    // [n_expert]) the job's expert's.
    float scale = 1.0f;
    const float* expert_scale = nullptr;
};

// Up to kMaxMatrices matrices of one weight type and n_in applied to the same x in one launch
// (q, k and v of a layer). With `swiglu`, m[0] is the gate and m[1] the up projection of the
// same shape, and each warp computes gate row o and up row o and writes silu(gate) * up to
// m[0].out: the feed-forward's first half in one launch, without the two intermediate rows.
// Either way each output is the same bits as a launch of its matrix alone.
constexpr int kMaxMatrices = 3;
struct GemvJob {
    const float* x;  // [n_rows][n_in]
    int64_t n_in;
    int n_rows;
    bool swiglu;
    bool gelu;  // with swiglu: gelu(gate) * up instead (GeGLU)
    int n_matrices;
    GemvMatrix m[kMaxMatrices];
    // Mixture of experts (null: a plain launch): grid row y is a job of one activation row,
    // x row y / x_div, times the expert_ids[y]-th of the experts stacked expert_bytes apart
    // at each matrix's w, into out row y.
    const int32_t* expert_ids;
    size_t expert_bytes;
    int x_div;
    // 8- or 16-bit activations (gemv_q8_kernel): x quantized per 32-element block,
    // [n_rows][n_in] signed bytes (or int16s, at twice the byte offsets) and
    // [n_rows][n_in / 32] scales.
    const int8_t* xq;
    const float* xd;
    // Each warp asks L2 for its whole weight rows before it waits for the previous kernel
    // (cu::launch_pdl) and walks them (KVRUN_GEMV_PREFETCH=on; plain launches only).
    bool prefetch;
    // Split-K (gemv_split): `split` consecutive warps of a block (1, 2, 4 or 8) share each
    // row pair, warp part k taking the 32-item groups g with g % split == k; their sums
    // are added in part order at the end. A function of the launch's shape only, so a row's
    // bits do not depend on the pass's row count.
    int split;
};

// What a warp of a GEMV launch works on: its two weight rows (o0 and o0 + 1 of its block's
// matrix, or with swiglu row o0 of the gate and of the up projection), x and out shifted to
// its grid row's job for expert launches.
struct WarpRows {
    GemvMatrix mat;
    int64_t o0;
    bool active;      // o0 is a row of the matrix (a warp past the end only helps stage x)
    bool has_second;  // o0 + 1 too (or swiglu)
    const uint8_t* row0;
    const uint8_t* row1;
    const float* x;
    int64_t x_row;  // x's row (from job.x) for expert launches, else 0 (the 8-bit x's too)
    float* out;
    int part;  // which of the job.split warps of the row pair this one is
    float scale0, scale1;  // the factors of the two sums (swiglu: the gate's, the up's)
};

__device__ __forceinline__ WarpRows warp_rows(const GemvJob& job, int warp) {
    WarpRows w;
    // This block's matrix (constant indices: a computed index into the parameter struct
    // would copy it to local memory).
    const int mi = blockIdx.x < job.m[0].blocks_end                          ? 0
                   : job.n_matrices > 2 && blockIdx.x >= job.m[1].blocks_end ? 2
                                                                             : 1;
    w.mat = mi == 0 ? job.m[0] : mi == 1 ? job.m[1] : job.m[2];
    const unsigned block = blockIdx.x - (mi == 0   ? 0u
                                         : mi == 1 ? job.m[0].blocks_end
                                                   : job.m[1].blocks_end);
    const int groups = kWarpsPerBlock / job.split;  // row pairs (swiglu: rows) per block
    const int64_t group = int64_t(block) * groups + warp / job.split;
    w.part = warp % job.split;
    w.o0 = job.swiglu ? group : group * kRowsPerWarp;
    w.active = w.o0 < w.mat.n_out;
    w.has_second = job.swiglu || w.o0 + 1 < w.mat.n_out;
    const uint8_t* w_base = w.mat.w;
    const uint8_t* up_base = job.m[1].w;
    w.x = job.x;
    w.x_row = 0;
    w.out = w.mat.out;
    w.scale0 = w.mat.scale;
    w.scale1 = job.swiglu ? job.m[1].scale : w.mat.scale;
    if (job.expert_ids) {  // this grid row's job: its expert, activation row and output row
        const int32_t e = job.expert_ids[blockIdx.y];
        if (w.mat.expert_scale) w.scale0 = w.mat.expert_scale[e];
        if (!job.swiglu)
            w.scale1 = w.scale0;
        else if (job.m[1].expert_scale)
            w.scale1 = job.m[1].expert_scale[e];
        const size_t e_off = size_t(e) * job.expert_bytes;
        w_base += e_off;
        up_base += e_off;
        w.x_row = int64_t(blockIdx.y / unsigned(job.x_div));
        if (w.x) w.x += w.x_row * job.n_in;
        w.out += int64_t(blockIdx.y) * w.mat.n_out;
    }
    w.row0 = w_base + (w.active ? w.o0 : 0) * w.mat.row_bytes;
    w.row1 = job.swiglu     ? up_base + (w.active ? w.o0 : 0) * w.mat.row_bytes
             : w.has_second ? w.row0 + w.mat.row_bytes
                            : w.row0;  // duplicate, result unused
    return w;
}

// A GEMV kernel's start: the prefetch of the warp's rows (GemvJob::prefetch; not for expert
// launches, whose rows depend on the router's output), then cu::pdl_begin(). Returns the
// warp's rows (an expert launch's only after the wait: they read the router's output).
__device__ __forceinline__ WarpRows gemv_begin(const GemvJob& job, int warp, int lane) {
    if (job.prefetch && !job.expert_ids) {
        const WarpRows w = warp_rows(job, warp);
        if (w.active) {
            for (size_t off = size_t(lane) * 128; off < w.mat.row_bytes; off += 32 * 128) {
                cu::prefetch_l2(w.row0 + off);
                if (w.has_second) cu::prefetch_l2(w.row1 + off);
            }
        }
        cu::pdl_begin();
        return w;
    }
    cu::pdl_begin();
    return warp_rows(job, warp);
}

// Sums the lanes' partial dots and writes the warp's outputs (lane 0): rows o0 and o0 + 1,
// or with swiglu act(gate) * up into row o0. With job.split > 1 the warps of a row pair
// first leave their sums in shared memory and part 0 adds them in part order; every warp of
// the block calls it then (a barrier), active or not.
template <int R>
__device__ __forceinline__ void write_rows(const GemvJob& job, const WarpRows& w,
                                           float (&acc)[kRowsPerWarp][R], int lane) {
    __shared__ float parts[kWarpsPerBlock][kRowsPerWarp][R];
    const int warp = threadIdx.x / 32;
    if (job.split > 1) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float s0 = cu::warp_sum(acc[0][r]);
            const float s1 = cu::warp_sum(acc[1][r]);
            if (lane == 0) {
                parts[warp][0][r] = s0;
                parts[warp][1][r] = s1;
            }
        }
        __syncthreads();
        if (!w.active || w.part != 0) return;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            acc[0][r] = parts[warp][0][r];
            acc[1][r] = parts[warp][1][r];
            for (int k = 1; k < job.split; ++k) {
                acc[0][r] += parts[warp + k][0][r];
                acc[1][r] += parts[warp + k][1][r];
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const float s0 = (job.split > 1 ? acc[0][r] : cu::warp_sum(acc[0][r])) * w.scale0;
        const float s1 = (job.split > 1 ? acc[1][r] : cu::warp_sum(acc[1][r])) * w.scale1;
        if (lane == 0 && r < job.n_rows) {
            float* o = w.out + r * w.mat.n_out + w.o0;
            if (job.swiglu) {
                o[0] = job.gelu ? cu::gelu_mul(s0, s1) : cu::silu_mul(s0, s1);
            } else {
                o[0] = s0;
                if (w.has_second) o[1] = s1;
            }
        }
    }
}

// x: 16-byte aligned rows when kItem % 4 == 0; n_rows <= R. Dynamic shared memory:
// XStage<L, R>::kBytes.
template <class L, int R>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) gemv_kernel(const GemvJob job) {
    constexpr int kItem = L::kItem;
    using Stage = XStage<L, R>;
    extern __shared__ __align__(16) unsigned char gemv_smem[];
    float* xs = reinterpret_cast<float*>(gemv_smem);  // [R][kChunk][kStride]
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const WarpRows wr = gemv_begin(job, warp, lane);
    const bool active = wr.active;
    const uint8_t* row0 = wr.row0;
    const uint8_t* row1 = wr.row1;
    const float* x = wr.x;
    const int64_t n_in = job.n_in, n_items = n_in / kItem;
    const int n_rows = job.n_rows;
    float acc[kRowsPerWarp][R] = {};
    if constexpr (Stage::kOn) {
        constexpr int kQuads = kItem / 4;
        for (int64_t c0 = 0; c0 < n_items; c0 += Stage::kChunk) {
            const int n_c = int(min(int64_t(Stage::kChunk), n_items - c0));
            __syncthreads();  // the previous chunk is fully consumed
            for (int r = 0; r < n_rows; ++r) {
                const float4* src = reinterpret_cast<const float4*>(x + r * n_in + c0 * kItem);
                float* dst = xs + r * Stage::kChunk * Stage::kStride;
                for (int e = threadIdx.x; e < n_c * kQuads; e += blockDim.x)
                    reinterpret_cast<float4*>(dst + (e / kQuads) * Stage::kStride)[e % kQuads] =
                        src[e];
            }
            __syncthreads();
            if (!active) continue;
            // This part's first 32-item group of the chunk (c0 is a multiple of 32).
            const int g0 = int((wr.part - (c0 >> 5) % job.split + job.split) % job.split);
#pragma unroll kItemUnroll < R>
            for (int it = lane + 32 * g0; it < n_c; it += 32 * job.split) {
                float v0[kItem], v1[kItem];
                L::load(row0, c0 + it, v0);
                L::load(row1, c0 + it, v1);
                gemv_item<kItem, R>(acc, v0, v1, xs + it * Stage::kStride,
                                    Stage::kChunk * Stage::kStride, n_rows);
            }
        }
    } else if (active) {
#pragma unroll kItemUnroll < R>
        for (int64_t it = lane + 32 * wr.part; it < n_items; it += 32 * job.split) {
            float v0[kItem], v1[kItem];
            L::load(row0, it, v0);
            L::load(row1, it, v1);
            gemv_item<kItem, R>(acc, v0, v1, x + it * kItem, n_in, n_rows);
        }
    }
    if (!active && job.split == 1) return;
    write_rows<R>(job, wr, acc, lane);
}

template <class L, int R>
void launch_gemv_rows(const GemvJob& job, cudaStream_t s, unsigned n_jobs = 1) {
    constexpr size_t smem = XStage<L, R>::kBytes;
    if constexpr (smem > 48 * 1024) cu::allow_dynamic_smem(gemv_kernel<L, R>, smem, s);
    const dim3 grid(job.m[job.n_matrices - 1].blocks_end, n_jobs);
    cu::launch_pdl(gemv_kernel<L, R>, grid, kWarpsPerBlock * 32, smem, s, job);
}

// Runs `job` over n_rows activation rows in passes of up to kMaxRows: at_row(job, r0) points
// the pass's x at row r0, then launch(job, rows) with rows an integral_constant of the kernel's
// R (1, 2, 4, 8 or 16) and job.n_rows and the outputs set for the pass.
template <class AtRow, class Launch>
void gemv_passes(GemvJob job, int64_t n_rows, AtRow&& at_row, Launch&& launch) {
    float* outs[kMaxMatrices];
    for (int i = 0; i < job.n_matrices; ++i) outs[i] = job.m[i].out;
    for (int64_t r0 = 0; r0 < n_rows; r0 += kMaxRows) {
        const int nr = int(n_rows - r0 < kMaxRows ? n_rows - r0 : kMaxRows);
        at_row(job, r0);
        job.n_rows = nr;
        for (int i = 0; i < job.n_matrices; ++i) job.m[i].out = outs[i] + r0 * job.m[i].n_out;
        if (nr == 1)
            launch(job, std::integral_constant<int, 1>{});
        else if (nr == 2)
            launch(job, std::integral_constant<int, 2>{});
        else if (nr <= 4)
            launch(job, std::integral_constant<int, 4>{});
        else if (nr <= 8)
            launch(job, std::integral_constant<int, 8>{});
        else
            launch(job, std::integral_constant<int, 16>{});
    }
}

// The f32 kernel over `job` (its x the first row's) in passes.
template <class L>
void launch_gemv(const GemvJob& job, int64_t n_rows, cudaStream_t s) {
    const float* x = job.x;
    gemv_passes(
        job, n_rows, [&](GemvJob& j, int64_t r0) { j.x = x + r0 * j.n_in; },
        [&](const GemvJob& j, auto rows) { launch_gemv_rows<L, decltype(rows)::value>(j, s); });
}

// ---- 8-bit activations (KVRUN_GEMV=q8, opt-in) ----------------------------------------------
//
// The f32 kernel above spends ~6 instructions per weight (unpack, convert, scale, FMA), as
// many issue cycles as the H100's memory needs to deliver the weights (docs/performance.md).
// Here x is quantized once per pass to signed bytes with one f32 scale per 32 elements
// (d = max|x| / 127, q = round-to-nearest-even(x / d)) and each 32-element item is a sum of
// 8 `dp4a` products of packed bytes: ~1 instruction per 4 weights. The result differs from
// the f32 path by x's rounding (relative ~1e-3 per product, like llama.cpp's CUDA MMVQ); each
// lane still sums its items in order, so rows stay independent of the pass's row count
// (verification passes give decode steps' bits).

// Integer decoders: load(row, it, q, a, b) sets q[8] to the item's 32 weights as packed
// signed bytes (word k = elements 4k..4k+3) so that the item's dot with x's block is
// dx * (a[0] * sum(q * xq over words 0-3) + a[1] * (over words 4-7) + b * sum(xq)); kMin says
// whether b is used, kHalves whether a[1] differs from a[0] (Q6_K's 16-element scales).
struct IntQ8_0 {
    static constexpr bool kMin = false, kHalves = false;
    __device__ static void load(const uint8_t* row, int64_t it, int (&q)[8], float (&a)[2],
                                float& b) {
        const uint8_t* p = row + it * 34;
        a[0] = a[1] = cu::ld_f16(p);
        b = 0.0f;
        cu::load_words<2, 32>(p + 2, reinterpret_cast<uint32_t*>(q));
    }
};

// Bits 0-3 of b as bit 4 of bytes 0-3 (Q5_0 / Q5_1's fifth bits of four elements).
__device__ __forceinline__ uint32_t fifth_bits(uint32_t b) {
    return ((b & 1u) << 4) | ((b & 2u) << 11) | ((b & 4u) << 18) | ((b & 8u) << 25);
}

// Four codes (bytes 0..15) of an IQ4 item as their codebook bytes.
__device__ __forceinline__ uint32_t iq4_word(uint32_t codes) {
    uint32_t r = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) r |= cu::iq4_byte((codes >> (8 * j)) & 0xfu) << (8 * j);
    return r;
}

// Legacy 32-element blocks (layouts at their f32 loaders in dequant.cuh): Q4_0 (d * (q - 8)),
// Q4_1 (d * q + m), Q5_0 (d * (q - 16), a fifth bit from qh), Q5_1 (d * q + m, fifth bit),
// IQ4_NL (d * code).
template <GgmlType T>
struct IntLegacy {
    static constexpr bool kMin = T == GgmlType::Q4_1 || T == GgmlType::Q5_1, kHalves = false;
    __device__ static void load(const uint8_t* row, int64_t it, int (&q)[8], float (&a)[2],
                                float& b) {
        constexpr int kBytes = T == GgmlType::Q4_1   ? 20
                               : T == GgmlType::Q5_0 ? 22
                               : T == GgmlType::Q5_1 ? 24
                                                     : 18;
        const uint8_t* p = row + it * kBytes;
        a[0] = a[1] = cu::ld_f16(p);
        b = kMin ? cu::ld_f16(p + 2) : 0.0f;
        uint32_t w[4], qh = 0;
        if constexpr (T == GgmlType::Q4_1) {
            cu::load_words<4, 16>(p + 4, w);
        } else if constexpr (T == GgmlType::Q5_0) {
            qh = cu::ld_u32_a2(p + 2);
            cu::load_words<2, 16>(p + 6, w);
        } else if constexpr (T == GgmlType::Q5_1) {
            qh = *reinterpret_cast<const uint32_t*>(p + 4);
            cu::load_words<8, 16>(p + 8, w);
        } else {
            cu::load_words<2, 16>(p + 2, w);
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) {  // low nibbles: elements 0-15, high: 16-31
            uint32_t lo = w[k] & 0x0f0f0f0fu, hi = (w[k] >> 4) & 0x0f0f0f0fu;
            if constexpr (T == GgmlType::Q4_0) {
                lo = __vsub4(lo, 0x08080808u);
                hi = __vsub4(hi, 0x08080808u);
            } else if constexpr (T == GgmlType::IQ4_NL) {
                lo = iq4_word(lo);
                hi = iq4_word(hi);
            } else if constexpr (T != GgmlType::Q4_1) {
                lo |= fifth_bits((qh >> (4 * k)) & 0xfu);
                hi |= fifth_bits((qh >> (16 + 4 * k)) & 0xfu);
                if constexpr (T == GgmlType::Q5_0) {
                    lo = __vsub4(lo, 0x10101010u);
                    hi = __vsub4(hi, 0x10101010u);
                }
            }
            q[k] = int(lo);
            q[k + 4] = int(hi);
        }
    }
};

// IQ4_XS sub-block s of super-block it / 8 (layout at LoadIQ4_XS): (d * (ls - 32)) * code.
struct IntIQ4_XS {
    static constexpr bool kMin = false, kHalves = false;
    __device__ static void load(const uint8_t* row, int64_t it, int (&q)[8], float (&a)[2],
                                float& b) {
        const uint8_t* p = row + (it >> 3) * 136;
        const int s = int(it & 7);
        a[0] = a[1] = cu::iq4xs_scale(p, s);
        b = 0.0f;
        uint32_t w[4];
        cu::load_words<8, 16>(p + 8 + 16 * s, w);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            q[k] = int(iq4_word(w[k] & 0x0f0f0f0fu));
            q[k + 4] = int(iq4_word((w[k] >> 4) & 0x0f0f0f0fu));
        }
    }
};

// Q4_K / Q5_K sub-block s of super-block it / 8: x = d * sc_s * q - dmin * m_s, q in 0..15
// (0..31 with Q5_K's fifth bit, bit s of qh[l]).
template <bool kQ5>
struct IntQ45_K {
    static constexpr bool kMin = true, kHalves = false;
    __device__ static void load(const uint8_t* row, int64_t it, int (&q)[8], float (&a)[2],
                                float& b) {
        const uint8_t* p = row + (it >> 3) * (kQ5 ? 176 : 144);
        const int s = int(it & 7);
        uint32_t sw[3];
        cu::load_words<4, 12>(p + 4, sw);
        float sc, mn;
        cu::k4_scale_min(sw, s, &sc, &mn);
        a[0] = a[1] = cu::ld_f16(p) * sc;
        b = -(cu::ld_f16(p + 2) * mn);
        uint32_t w[8];
        cu::load_words<16, 32>(p + (kQ5 ? 48 : 16) + 32 * (s >> 1), w);
        const int shift = 4 * (s & 1);
#pragma unroll
        for (int k = 0; k < 8; ++k) q[k] = int((w[k] >> shift) & 0x0f0f0f0fu);
        if constexpr (kQ5) {
            uint32_t hw[8];
            cu::load_words<16, 32>(p + 16, hw);
#pragma unroll
            for (int k = 0; k < 8; ++k) q[k] |= int(((hw[k] >> s) & 0x01010101u) << 4);
        }
    }
};

// Q6_K sub-block s = 4h + k (layout at LoadQ6_K): q - 32 in -32..31, one scale per 16 elements.
struct IntQ6_K {
    static constexpr bool kMin = false, kHalves = true;
    __device__ static void load(const uint8_t* row, int64_t it, int (&q)[8], float (&a)[2],
                                float& b) {
        const uint8_t* p = row + (it >> 3) * 210;
        const int s = int(it & 7), h = s >> 2, k = s & 3;
        const float d = cu::ld_f16(p + 208);
        uint32_t lw[8], hw[8];
        cu::load_words<2, 32>(p + 64 * h + 32 * (k & 1), lw);
        cu::load_words<2, 32>(p + 128 + 32 * h, hw);
        const uint32_t sc_w = cu::ld_u16(p + 192 + 8 * h + 2 * k);
        a[0] = d * float(int8_t(sc_w & 0xff));
        a[1] = d * float(int8_t((sc_w >> 8) & 0xff));
        b = 0.0f;
        const int lshift = 4 * (k >> 1);
#pragma unroll
        for (int j = 0; j < 8; ++j)
            q[j] = int(__vsub4(
                ((lw[j] >> lshift) & 0x0f0f0f0fu) | (((hw[j] >> (2 * k)) & 0x03030303u) << 4),
                0x20202020u));
    }
};

// Calls f(LoaderTag<IntT>) for the types with an integer decoder; false for the others.
template <class F>
bool with_int_loader(GgmlType t, F&& f) {
    switch (t) {
        case GgmlType::Q4_0:
            f(cu::LoaderTag<IntLegacy<GgmlType::Q4_0>>{});
            return true;
        case GgmlType::Q8_0:
            f(cu::LoaderTag<IntQ8_0>{});
            return true;
        case GgmlType::Q4_1:
            f(cu::LoaderTag<IntLegacy<GgmlType::Q4_1>>{});
            return true;
        case GgmlType::Q5_0:
            f(cu::LoaderTag<IntLegacy<GgmlType::Q5_0>>{});
            return true;
        case GgmlType::Q5_1:
            f(cu::LoaderTag<IntLegacy<GgmlType::Q5_1>>{});
            return true;
        case GgmlType::IQ4_NL:
            f(cu::LoaderTag<IntLegacy<GgmlType::IQ4_NL>>{});
            return true;
        case GgmlType::IQ4_XS:
            f(cu::LoaderTag<IntIQ4_XS>{});
            return true;
        case GgmlType::Q4_K:
            f(cu::LoaderTag<IntQ45_K<false>>{});
            return true;
        case GgmlType::Q5_K:
            f(cu::LoaderTag<IntQ45_K<true>>{});
            return true;
        case GgmlType::Q6_K:
            f(cu::LoaderTag<IntQ6_K>{});
            return true;
        default:
            return false;
    }
}

// The split switch (cuda_set_gemv_split): -1 until first asked, then from KVRUN_GEMV_SPLIT
// (here, as its check needs kWarpsPerBlock; the other switches: gemv_switches.cu).
std::atomic<int> g_gemv_split{-1};

// One warp per 32-element block of x ([n_rows][n_in], n_in % 32 == 0): signed bytes
// (XT = int8_t) or int16s (cu::quantize_x_store).
template <class XT>
__global__ void quantize_x_kernel(const float* __restrict__ x, XT* __restrict__ xq,
                                  float* __restrict__ xd, int64_t n_blocks) {
    cu::pdl_begin();
    const int64_t blk = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    if (blk >= n_blocks) return;  // whole warps
    const int64_t e = blk * 32 + threadIdx.x % 32;
    cu::quantize_x_store(x[e], e, reinterpret_cast<int8_t*>(xq), xd, int(sizeof(XT)));
}

// kX16: x as int16s, each word of 4 weight bytes against two words of x (dp2a lo and hi
// halves): twice the dot instructions of dp4a, x rounded ~256x finer.
template <class IL, int R, bool kX16>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) gemv_q8_kernel(const GemvJob job) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const WarpRows wr = gemv_begin(job, warp, lane);
    if (!wr.active && job.split == 1) return;  // the only barrier: write_rows' with split
    const int64_t n_in = job.n_in, n_items = n_in / 32;
    const int n_rows = job.n_rows;
    float acc[kRowsPerWarp][R] = {};
#pragma unroll kItemUnroll < R>
    for (int64_t it = lane + 32 * wr.part; wr.active && it < n_items; it += 32 * job.split) {
        int q0[8], q1[8];
        float a0[2], a1[2], b0, b1;
        IL::load(wr.row0, it, q0, a0, b0);
        IL::load(wr.row1, it, q1, a1, b1);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            if (r >= n_rows) break;
            const int64_t xr = wr.x_row + r;
            constexpr int kWords = kX16 ? 16 : 8;  // x's words per item
            const int4* xp =
                reinterpret_cast<const int4*>(job.xq + (xr * n_in + it * 32) * (kX16 ? 2 : 1));
            int xv[kWords];
#pragma unroll
            for (int k = 0; k < kWords / 4; ++k) {
                const int4 v = xp[k];
                xv[4 * k] = v.x;
                xv[4 * k + 1] = v.y;
                xv[4 * k + 2] = v.z;
                xv[4 * k + 3] = v.w;
            }
            // Word sums of each row, the halves apart when their scales differ.
            int s0[2] = {0, 0}, s1[2] = {0, 0};
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                const int h = IL::kHalves ? k / 4 : 0;
                if constexpr (kX16) {
                    s0[h] = __dp2a_hi(xv[2 * k + 1], q0[k], __dp2a_lo(xv[2 * k], q0[k], s0[h]));
                    s1[h] = __dp2a_hi(xv[2 * k + 1], q1[k], __dp2a_lo(xv[2 * k], q1[k], s1[h]));
                } else {
                    s0[h] = __dp4a(q0[k], xv[k], s0[h]);
                    s1[h] = __dp4a(q1[k], xv[k], s1[h]);
                }
            }
            const float dx = job.xd[xr * n_items + it];
            float d0 = a0[0] * float(s0[0]), d1 = a1[0] * float(s1[0]);
            if constexpr (IL::kHalves) {
                d0 += a0[1] * float(s0[1]);
                d1 += a1[1] * float(s1[1]);
            }
            if constexpr (IL::kMin) {
                int sx = 0;
#pragma unroll
                for (int k = 0; k < kWords; ++k)
                    sx = kX16 ? __dp2a_lo(xv[k], 0x01010101, sx) : __dp4a(0x01010101, xv[k], sx);
                d0 += b0 * float(sx);
                d1 += b1 * float(sx);
            }
            acc[0][r] += dx * d0;
            acc[1][r] += dx * d1;
        }
    }
    write_rows<R>(job, wr, acc, lane);
}

template <class IL, int R>
void launch_gemv_q8_rows(const GemvJob& job, cudaStream_t s, unsigned n_jobs = 1) {
    const dim3 grid(job.m[job.n_matrices - 1].blocks_end, n_jobs);
    if (cuda_gemv_q16())
        cu::launch_pdl(gemv_q8_kernel<IL, R, true>, grid, kWarpsPerBlock * 32, 0, s, job);
    else
        cu::launch_pdl(gemv_q8_kernel<IL, R, false>, grid, kWarpsPerBlock * 32, 0, s, job);
}

// x ([n_rows][n_in]) quantized into scratch for the integer kernel: its bytes (int16s with
// cuda_gemv_q16) and scales.
CudaXq quantize_x_q8(const float* x, int64_t n_rows, int64_t n_in, CudaScratch& scratch,
                     cudaStream_t s) {
    const int64_t n_blocks = n_rows * (n_in / 32);
    const int elt = cuda_gemv_q16() ? 2 : 1;
    const size_t q_bytes = (size_t(n_rows * n_in * elt) + 255) / 256 * 256;
    auto* base = static_cast<uint8_t*>(scratch.get(q_bytes + size_t(n_blocks) * sizeof(float), s));
    const CudaXq xq{x, reinterpret_cast<int8_t*>(base), reinterpret_cast<float*>(base + q_bytes),
                    elt};
    cuda_quantize_x(x, n_rows, n_in, xq, s);
    return xq;
}

// Quantizes x ([n_rows][n_in]) into scratch, unless `pre` holds it already, and runs `job` in
// passes of up to kMaxRows rows.
template <class IL>
void launch_gemv_q8(const GemvJob& job, const float* x, int64_t n_rows, CudaScratch& scratch,
                    cudaStream_t s, const CudaXq* pre) {
    const int64_t n_in = job.n_in;
    const CudaXq xq = pre && pre->x == x && pre->elt_bytes == (cuda_gemv_q16() ? 2 : 1)
                          ? *pre
                          : quantize_x_q8(x, n_rows, n_in, scratch, s);
    gemv_passes(
        job, n_rows,
        [&](GemvJob& j, int64_t r0) {
            j.xq = xq.q + r0 * n_in * xq.elt_bytes;
            j.xd = xq.d + r0 * (n_in / 32);
        },
        [&](const GemvJob& j, auto rows) { launch_gemv_q8_rows<IL, decltype(rows)::value>(j, s); });
}

// The split-K factor (GemvJob::split) of a launch of n_out output rows in all (the gate's
// alone with swiglu), from cuda_gemv_split(): 0 (auto) splits launches that would have fewer
// than kSplitBlocks blocks into the fewest parts that reach it (llama2-7b: the output
// projection's and the down projection's 256 blocks run as 1024), N > 1 splits those into N.
constexpr int64_t kSplitBlocks = 1024;
int gemv_split(int64_t n_out, bool swiglu) {
    const int want = cuda_gemv_split();
    const int64_t blocks = cu::ceil_div(n_out, swiglu ? kWarpsPerBlock : kRowsPerBlock);
    if (want == 1 || blocks >= kSplitBlocks) return 1;
    if (want > 1) return want;
    int split = 1;
    while (split < kWarpsPerBlock && blocks * split < kSplitBlocks) split *= 2;
    return split;
}

// Checks w against cuda_gemv's preconditions for input x.
void check_gemv(const WeightView& w, const float* x, int64_t n_rows) {
    CUDA_REQUIRE(cuda_supports_weight_type(w.type), "cuda_gemv: unsupported weight type");
    const int64_t be = cu::weight_block_elems(w.type);
    CUDA_REQUIRE(w.n_in > 0 && w.n_out > 0 && n_rows >= 0, "cuda_gemv: bad shape");
    CUDA_REQUIRE(w.n_in % be == 0, "cuda_gemv: n_in is not a whole number of blocks");
    CUDA_REQUIRE(w.row_bytes == size_t(w.n_in / be) * cu::weight_block_bytes(w.type),
                 "cuda_gemv: row_bytes does not match the type and n_in");
    CUDA_REQUIRE(reinterpret_cast<uintptr_t>(w.data) % 16 == 0,
                 "cuda_gemv: weight data must be 16-byte aligned");
    // Items of >= 4 elements read x with 16-byte loads.
    CUDA_REQUIRE(((be == 1 && !gemv_vec(w)) || (reinterpret_cast<uintptr_t>(x) % 16 == 0)),
                 "cuda_gemv: x must be 16-byte aligned");
}

// Runs the matrices ws[0..n) (same type and n_in, checked) on x in one launch per pass.
// With `q8` (a scratch buffer) and a type with an integer decoder, the 8-bit activation path.
void gemv_many(float* const* outs, const WeightView* const* ws, int n, const float* x,
               int64_t n_rows, bool swiglu, cudaStream_t s, bool gelu = false,
               CudaScratch* q8 = nullptr, const CudaXq* pre = nullptr) {
    GemvJob job{};
    job.x = x;
    job.n_in = ws[0]->n_in;
    job.swiglu = swiglu;
    job.gelu = gelu;
    job.n_matrices = swiglu ? 1 : n;
    job.prefetch = cuda_gemv_prefetch();
    int64_t n_out = 0;  // the launch's rows (with swiglu, the gate's)
    for (int i = 0; i < job.n_matrices; ++i) n_out += ws[i]->n_out;
    job.split = gemv_split(n_out, swiglu);
    const int64_t rows_per_block = (swiglu ? kWarpsPerBlock : kRowsPerBlock) / job.split;
    unsigned blocks = 0;
    for (int i = 0; i < n; ++i) {
        check_gemv(*ws[i], x, n_rows);
        blocks += unsigned(cu::ceil_div(ws[i]->n_out, rows_per_block));
        job.m[i] = {static_cast<const uint8_t*>(ws[i]->data),
                    outs[i],
                    ws[i]->n_out,
                    ws[i]->row_bytes,
                    blocks,
                    ws[i]->scale};
    }
    if (n_rows == 0) return;
    if (q8 && with_int_loader(ws[0]->type, [&](auto tag) {
            launch_gemv_q8<typename decltype(tag)::type>(job, x, n_rows, *q8, s, pre);
        }))
        return;
    cu::with_loader(ws[0]->type, gemv_vec(*ws[0]),
                    [&](auto tag) { launch_gemv<typename decltype(tag)::type>(job, n_rows, s); });
}

// The scratch for gemv_many's 8-bit path when it is on, else null.
CudaScratch* q8_scratch(CudaScratch& scratch) {
    return cuda_gemv_q8() ? &scratch : nullptr;
}

bool same_layout(const WeightView& a, const WeightView& b) {
    return a.type == b.type && a.n_in == b.n_in && gemv_vec(a) == gemv_vec(b);
}

// The expert-indexed launch (GemvJob::expert_ids) of one matrix, or of a gate/up pair with
// swiglu, in grid chunks of at most 65535 jobs (whole x_div groups).
void gemv_experts(float* out, const float* x, const WeightView& w0, const WeightView* up0,
                  size_t expert_bytes, const int32_t* ids, int64_t n_jobs, int x_div,
                  cudaStream_t s, CudaScratch* q8, const float* scales, const float* up_scales) {
    CUDA_REQUIRE(x_div >= 1 && n_jobs >= 0, "cuda_gemv_experts: bad job count");
    CUDA_REQUIRE(expert_bytes % 16 == 0, "cuda_gemv_experts: experts must lie 16 bytes apart");
    check_gemv(w0, x, 1);
    if (up0) {
        check_gemv(*up0, x, 1);
        CUDA_REQUIRE(same_layout(w0, *up0) && w0.n_out == up0->n_out,
                     "cuda_gemv_experts: gate and up differ in layout");
    }
    if (n_jobs == 0) return;
    GemvJob job{};
    job.n_in = w0.n_in;
    job.n_rows = 1;
    job.swiglu = up0 != nullptr;
    job.n_matrices = 1;
    job.split = gemv_split(w0.n_out, job.swiglu);
    const int64_t rows_per_block = (job.swiglu ? kWarpsPerBlock : kRowsPerBlock) / job.split;
    const unsigned blocks = unsigned(cu::ceil_div(w0.n_out, rows_per_block));
    job.m[0] = {static_cast<const uint8_t*>(w0.data),
                out,
                w0.n_out,
                w0.row_bytes,
                blocks,
                w0.scale,
                scales};
    if (up0)
        job.m[1] = {static_cast<const uint8_t*>(up0->data),
                    nullptr,
                    up0->n_out,
                    up0->row_bytes,
                    blocks,
                    up0->scale,
                    up_scales};
    job.expert_bytes = expert_bytes;
    job.x_div = x_div;
    const int64_t chunk = 65535 / x_div * x_div;
    // The 8-bit path: x's rows (one per x_div jobs) quantized once for every chunk.
    const bool int8 = q8 && with_int_loader(w0.type, [](auto) {});
    const CudaXq xq =
        int8 ? quantize_x_q8(x, cu::ceil_div(n_jobs, int64_t(x_div)), w0.n_in, *q8, s) : CudaXq{};
    for (int64_t j0 = 0; j0 < n_jobs; j0 += chunk) {
        const int64_t n = std::min(chunk, n_jobs - j0);
        job.x = x + (j0 / x_div) * w0.n_in;
        job.expert_ids = ids + j0;
        job.m[0].out = out + j0 * w0.n_out;
        if (int8) {
            job.x = nullptr;  // (the kernel reads xq / xd)
            job.xq = xq.q + (j0 / x_div) * w0.n_in * xq.elt_bytes;
            job.xd = xq.d + (j0 / x_div) * (w0.n_in / 32);
            with_int_loader(w0.type, [&](auto tag) {
                launch_gemv_q8_rows<typename decltype(tag)::type, 1>(job, s, unsigned(n));
            });
            continue;
        }
        cu::with_loader(w0.type, gemv_vec(w0), [&](auto tag) {
            launch_gemv_rows<typename decltype(tag)::type, 1>(job, s, unsigned(n));
        });
    }
}

// gate(x) * up(x) through SiLU (SwiGLU) or, with gelu, GELU (GeGLU): one GEMV launch for up
// to kCudaGemvMaxRows rows of one layout, else two cuda_matmul and the elementwise op.
void matmul_gated(float* out, float* up_buf, const float* x, const WeightView& gate,
                  const WeightView& up, int64_t n_rows, CudaScratch& scratch, cudaStream_t s,
                  bool gelu, const CudaXq* xq) {
    if (n_rows > kCudaGemvMaxRows || !same_layout(gate, up) || gate.n_out != up.n_out) {
        cuda_matmul(out, x, gate, n_rows, scratch, s);
        cuda_matmul(up_buf, x, up, n_rows, scratch, s);
        if (gelu)
            cuda_geglu(out, out, up_buf, n_rows * gate.n_out, s);
        else
            cuda_swiglu(out, out, up_buf, n_rows * gate.n_out, s);
        return;
    }
    float* outs[] = {out, up_buf};
    const WeightView* ws[] = {&gate, &up};
    gemv_many(outs, ws, 2, x, n_rows, true, s, gelu, q8_scratch(scratch), xq);
}

}  // namespace

bool cuda_supports_weight_type(GgmlType t) {
    return cu::weight_block_elems(t) != 0;
}

void cuda_gemv_experts(float* out, const float* x, const WeightView& expert0, size_t expert_bytes,
                       const int32_t* ids, int64_t n_jobs, int x_div, cudaStream_t s,
                       CudaScratch* scratch, const float* scales) {
    gemv_experts(out, x, expert0, nullptr, expert_bytes, ids, n_jobs, x_div, s,
                 scratch ? q8_scratch(*scratch) : nullptr, scales, nullptr);
}

void cuda_gemv_experts_swiglu(float* out, const float* x, const WeightView& gate0,
                              const WeightView& up0, size_t expert_bytes, const int32_t* ids,
                              int64_t n_jobs, int x_div, cudaStream_t s, CudaScratch* scratch,
                              const float* gate_scales, const float* up_scales) {
    gemv_experts(out, x, gate0, &up0, expert_bytes, ids, n_jobs, x_div, s,
                 scratch ? q8_scratch(*scratch) : nullptr, gate_scales, up_scales);
}

void cuda_gemv(float* out, const float* x, const WeightView& w, int64_t n_rows, cudaStream_t s) {
    const WeightView* ws[] = {&w};
    gemv_many(&out, ws, 1, x, n_rows, false, s);
}

void cuda_gemv(float* out, const float* x, const WeightView& w, int64_t n_rows,
               CudaScratch& scratch, cudaStream_t s, const CudaXq* xq) {
    const WeightView* ws[] = {&w};
    gemv_many(&out, ws, 1, x, n_rows, false, s, false, q8_scratch(scratch), xq);
}

void cuda_set_gemv_split(int split) {
    CUDA_REQUIRE(split == 0 || split == 1 || split == 2 || split == 4 || split == 8,
                 "cuda_set_gemv_split: 0 (auto), 1, 2, 4 or 8");
    CUDA_REQUIRE(split <= kWarpsPerBlock, "cuda_set_gemv_split: more parts than warps");
    g_gemv_split = split;
}

int cuda_gemv_split() {
    int v = g_gemv_split.load();
    if (v < 0) {
        const std::string e = cuda_env_choice("KVRUN_GEMV_SPLIT", {"1", "2", "4", "8", "auto"});
        v = e.empty() ? 1 : e == "auto" ? 0 : std::stoi(e);
        g_gemv_split = v;
    }
    return v;
}

void cuda_matmul_qkv(float* q, float* k, float* v, const float* x, const WeightView& wq,
                     const WeightView& wk, const WeightView& wv, int64_t n_rows,
                     CudaScratch& scratch, cudaStream_t s, const CudaXq* xq) {
    if (n_rows > kCudaGemvMaxRows) {
        cuda_matmul(q, x, wq, n_rows, scratch, s);
        cuda_matmul(k, x, wk, n_rows, scratch, s);
        cuda_matmul(v, x, wv, n_rows, scratch, s);
        return;
    }
    // Consecutive matrices of one layout share a launch (Q4_K_M files store some attn_v
    // tensors as Q6_K: then q and k go together and v alone).
    float* outs[] = {q, k, v};
    const WeightView* ws[] = {&wq, &wk, &wv};
    for (int i = 0; i < 3;) {
        int n = 1;
        while (i + n < 3 && same_layout(*ws[i], *ws[i + n])) ++n;
        gemv_many(outs + i, ws + i, n, x, n_rows, false, s, false, q8_scratch(scratch), xq);
        i += n;
    }
}

void cuda_matmul_swiglu(float* out, float* up_buf, const float* x, const WeightView& gate,
                        const WeightView& up, int64_t n_rows, CudaScratch& scratch, cudaStream_t s,
                        const CudaXq* xq) {
    matmul_gated(out, up_buf, x, gate, up, n_rows, scratch, s, false, xq);
}

void cuda_matmul_geglu(float* out, float* up_buf, const float* x, const WeightView& gate,
                       const WeightView& up, int64_t n_rows, CudaScratch& scratch, cudaStream_t s,
                       const CudaXq* xq) {
    matmul_gated(out, up_buf, x, gate, up, n_rows, scratch, s, true, xq);
}

bool cuda_gemv_int_type(GgmlType t) {
    return with_int_loader(t, [](auto) {});
}

void cuda_quantize_x(const float* x, int64_t n_rows, int64_t n_in, const CudaXq& xq,
                     cudaStream_t s) {
    CUDA_REQUIRE(n_in % 32 == 0 && n_rows >= 0, "cuda_quantize_x: bad shape");
    CUDA_REQUIRE(xq.elt_bytes == 1 || xq.elt_bytes == 2, "cuda_quantize_x: bad element size");
    const int64_t n_blocks = n_rows * (n_in / 32);
    if (n_blocks == 0) return;
    const unsigned blocks = unsigned(cu::ceil_div(n_blocks * 32, 256));
    if (xq.elt_bytes == 2)
        cu::launch_pdl(quantize_x_kernel<int16_t>, blocks, 256, 0, s, x,
                       reinterpret_cast<int16_t*>(xq.q), xq.d, n_blocks);
    else
        cu::launch_pdl(quantize_x_kernel<int8_t>, blocks, 256, 0, s, x, xq.q, xq.d, n_blocks);
}

}  // namespace kvrun
