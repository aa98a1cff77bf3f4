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
#include <cstdint>

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
// pass, where a block's x staging is shared by twice the rows.
#ifndef KVRUN_GEMV_WARPS
#define KVRUN_GEMV_WARPS 8
#endif
#ifndef KVRUN_GEMV_UNROLL
#define KVRUN_GEMV_UNROLL 4
#endif
constexpr int kWarpsPerBlock = KVRUN_GEMV_WARPS;
constexpr int kItemUnroll = KVRUN_GEMV_UNROLL;
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
};

// x: 16-byte aligned rows when kItem % 4 == 0; n_rows <= R. Dynamic shared memory:
// XStage<L, R>::kBytes.
template <class L, int R>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) gemv_kernel(const GemvJob job) {
    constexpr int kItem = L::kItem;
    using Stage = XStage<L, R>;
    extern __shared__ __align__(16) unsigned char gemv_smem[];
    float* xs = reinterpret_cast<float*>(gemv_smem);  // [R][kChunk][kStride]
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    // This block's matrix (constant indices: a computed index into the parameter struct
    // would copy it to local memory).
    const int mi = blockIdx.x < job.m[0].blocks_end                          ? 0
                   : job.n_matrices > 2 && blockIdx.x >= job.m[1].blocks_end ? 2
                                                                             : 1;
    const GemvMatrix mat = mi == 0 ? job.m[0] : mi == 1 ? job.m[1] : job.m[2];
    const unsigned block = blockIdx.x - (mi == 0   ? 0u
                                         : mi == 1 ? job.m[0].blocks_end
                                                   : job.m[1].blocks_end);
    // The warp's two weight rows: o0 and o0 + 1 of the matrix, or (swiglu) row o0 of the
    // gate and of the up projection.
    const int64_t o0 = job.swiglu ? int64_t(block) * kWarpsPerBlock + warp
                                  : (int64_t(block) * kWarpsPerBlock + warp) * kRowsPerWarp;
    // A warp past the last row still helps stage x (the barriers need every thread).
    const bool active = o0 < mat.n_out;
    const bool has_second = job.swiglu || o0 + 1 < mat.n_out;
    const uint8_t* w_base = mat.w;
    const uint8_t* up_base = job.m[1].w;
    const float* x = job.x;
    float* out = mat.out;
    if (job.expert_ids) {  // this grid row's job: its expert, activation row and output row
        const size_t e_off = size_t(job.expert_ids[blockIdx.y]) * job.expert_bytes;
        w_base += e_off;
        up_base += e_off;
        x += int64_t(blockIdx.y / unsigned(job.x_div)) * job.n_in;
        out += int64_t(blockIdx.y) * mat.n_out;
    }
    const uint8_t* row0 = w_base + (active ? o0 : 0) * mat.row_bytes;
    const uint8_t* row1 = job.swiglu   ? up_base + (active ? o0 : 0) * mat.row_bytes
                          : has_second ? row0 + mat.row_bytes
                                       : row0;  // duplicate, result unused
    const int64_t n_in = job.n_in, n_items = n_in / kItem;
    const int n_rows = job.n_rows;
    float acc[kRowsPerWarp][R];
#pragma unroll
    for (int k = 0; k < kRowsPerWarp; ++k)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[k][r] = 0.0f;
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
#pragma unroll kItemUnroll
            for (int it = lane; it < n_c; it += 32) {
                float v0[kItem], v1[kItem];
                L::load(row0, c0 + it, v0);
                L::load(row1, c0 + it, v1);
                gemv_item<kItem, R>(acc, v0, v1, xs + it * Stage::kStride,
                                    Stage::kChunk * Stage::kStride, n_rows);
            }
        }
    } else if (active) {
#pragma unroll kItemUnroll
        for (int64_t it = lane; it < n_items; it += 32) {
            float v0[kItem], v1[kItem];
            L::load(row0, it, v0);
            L::load(row1, it, v1);
            gemv_item<kItem, R>(acc, v0, v1, x + it * kItem, n_in, n_rows);
        }
    }
    if (!active) return;
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const float s0 = cu::warp_sum(acc[0][r]);
        const float s1 = cu::warp_sum(acc[1][r]);
        if (lane == 0 && r < n_rows) {
            if (job.swiglu) {
                out[r * mat.n_out + o0] = job.gelu ? cu::gelu_mul(s0, s1) : cu::silu_mul(s0, s1);
            } else {
                out[r * mat.n_out + o0] = s0;
                if (has_second) out[r * mat.n_out + o0 + 1] = s1;
            }
        }
    }
}

template <class L, int R>
void launch_gemv_rows(const GemvJob& job, cudaStream_t s, unsigned n_jobs = 1) {
    constexpr size_t smem = XStage<L, R>::kBytes;
    if constexpr (smem > 48 * 1024) cu::allow_dynamic_smem(gemv_kernel<L, R>, smem, s);
    const dim3 grid(job.m[job.n_matrices - 1].blocks_end, n_jobs);
    gemv_kernel<L, R><<<grid, kWarpsPerBlock * 32, smem, s>>>(job);
    CUDA_CHECK_LAUNCH();
}

// Runs `job` (x and n_rows of its first pass set by the caller) in passes of up to kMaxRows
// activation rows.
template <class L>
void launch_gemv(GemvJob job, int64_t n_rows, cudaStream_t s) {
    const float* x = job.x;
    float* outs[kMaxMatrices];
    for (int i = 0; i < job.n_matrices; ++i) outs[i] = job.m[i].out;
    for (int64_t r0 = 0; r0 < n_rows; r0 += kMaxRows) {
        const int nr = int(n_rows - r0 < kMaxRows ? n_rows - r0 : kMaxRows);
        job.x = x + r0 * job.n_in;
        job.n_rows = nr;
        for (int i = 0; i < job.n_matrices; ++i) job.m[i].out = outs[i] + r0 * job.m[i].n_out;
        if (nr == 1)
            launch_gemv_rows<L, 1>(job, s);
        else if (nr == 2)
            launch_gemv_rows<L, 2>(job, s);
        else if (nr <= 4)
            launch_gemv_rows<L, 4>(job, s);
        else if (nr <= 8)
            launch_gemv_rows<L, 8>(job, s);
        else
            launch_gemv_rows<L, 16>(job, s);
    }
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
void gemv_many(float* const* outs, const WeightView* const* ws, int n, const float* x,
               int64_t n_rows, bool swiglu, cudaStream_t s, bool gelu = false) {
    GemvJob job{};
    job.x = x;
    job.n_in = ws[0]->n_in;
    job.swiglu = swiglu;
    job.gelu = gelu;
    job.n_matrices = swiglu ? 1 : n;
    const int64_t rows_per_block = swiglu ? kWarpsPerBlock : kRowsPerBlock;
    unsigned blocks = 0;
    for (int i = 0; i < n; ++i) {
        check_gemv(*ws[i], x, n_rows);
        blocks += unsigned(cu::ceil_div(ws[i]->n_out, rows_per_block));
        job.m[i] = {static_cast<const uint8_t*>(ws[i]->data), outs[i], ws[i]->n_out,
                    ws[i]->row_bytes, blocks};
    }
    if (n_rows == 0) return;
    cu::with_loader(ws[0]->type, gemv_vec(*ws[0]),
                    [&](auto tag) { launch_gemv<typename decltype(tag)::type>(job, n_rows, s); });
}

bool same_layout(const WeightView& a, const WeightView& b) {
    return a.type == b.type && a.n_in == b.n_in && gemv_vec(a) == gemv_vec(b);
}

// The expert-indexed launch (GemvJob::expert_ids) of one matrix, or of a gate/up pair with
// swiglu, in grid chunks of at most 65535 jobs (whole x_div groups).
void gemv_experts(float* out, const float* x, const WeightView& w0, const WeightView* up0,
                  size_t expert_bytes, const int32_t* ids, int64_t n_jobs, int x_div,
                  cudaStream_t s) {
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
    const int64_t rows_per_block = job.swiglu ? kWarpsPerBlock : kRowsPerBlock;
    const unsigned blocks = unsigned(cu::ceil_div(w0.n_out, rows_per_block));
    job.m[0] = {static_cast<const uint8_t*>(w0.data), out, w0.n_out, w0.row_bytes, blocks};
    if (up0)
        job.m[1] = {static_cast<const uint8_t*>(up0->data), nullptr, up0->n_out, up0->row_bytes,
                    blocks};
    job.expert_bytes = expert_bytes;
    job.x_div = x_div;
    const int64_t chunk = 65535 / x_div * x_div;
    for (int64_t j0 = 0; j0 < n_jobs; j0 += chunk) {
        const int64_t n = std::min(chunk, n_jobs - j0);
        job.x = x + (j0 / x_div) * w0.n_in;
        job.expert_ids = ids + j0;
        job.m[0].out = out + j0 * w0.n_out;
        cu::with_loader(w0.type, gemv_vec(w0), [&](auto tag) {
            launch_gemv_rows<typename decltype(tag)::type, 1>(job, s, unsigned(n));
        });
    }
}

// gate(x) * up(x) through SiLU (SwiGLU) or, with gelu, GELU (GeGLU): one GEMV launch for up
// to kCudaGemvMaxRows rows of one layout, else two cuda_matmul and the elementwise op.
void matmul_gated(float* out, float* up_buf, const float* x, const WeightView& gate,
                  const WeightView& up, int64_t n_rows, CudaScratch& scratch, cudaStream_t s,
                  bool gelu) {
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
    gemv_many(outs, ws, 2, x, n_rows, true, s, gelu);
}

}  // namespace

bool cuda_supports_weight_type(GgmlType t) {
    return cu::weight_block_elems(t) != 0;
}

void cuda_gemv_experts(float* out, const float* x, const WeightView& expert0, size_t expert_bytes,
                       const int32_t* ids, int64_t n_jobs, int x_div, cudaStream_t s) {
    gemv_experts(out, x, expert0, nullptr, expert_bytes, ids, n_jobs, x_div, s);
}

void cuda_gemv_experts_swiglu(float* out, const float* x, const WeightView& gate0,
                              const WeightView& up0, size_t expert_bytes, const int32_t* ids,
                              int64_t n_jobs, int x_div, cudaStream_t s) {
    gemv_experts(out, x, gate0, &up0, expert_bytes, ids, n_jobs, x_div, s);
}

void cuda_gemv(float* out, const float* x, const WeightView& w, int64_t n_rows, cudaStream_t s) {
    const WeightView* ws[] = {&w};
    gemv_many(&out, ws, 1, x, n_rows, false, s);
}

void cuda_matmul_qkv(float* q, float* k, float* v, const float* x, const WeightView& wq,
                     const WeightView& wk, const WeightView& wv, int64_t n_rows,
                     CudaScratch& scratch, cudaStream_t s) {
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
        gemv_many(outs + i, ws + i, n, x, n_rows, false, s);
        i += n;
    }
}

void cuda_matmul_swiglu(float* out, float* up_buf, const float* x, const WeightView& gate,
                        const WeightView& up, int64_t n_rows, CudaScratch& scratch,
                        cudaStream_t s) {
    matmul_gated(out, up_buf, x, gate, up, n_rows, scratch, s, false);
}

void cuda_matmul_geglu(float* out, float* up_buf, const float* x, const WeightView& gate,
                       const WeightView& up, int64_t n_rows, CudaScratch& scratch, cudaStream_t s) {
    matmul_gated(out, up_buf, x, gate, up, n_rows, scratch, s, true);
}

}  // namespace kvrun
