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
#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/dequant.cuh"
#include "cuda/ops.h"

namespace kvrun {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kRowsPerWarp = 2;
constexpr int kRowsPerBlock = kWarpsPerBlock * kRowsPerWarp;
constexpr int kMaxRows = 16;  // activation rows per pass (template R is 1, 2, 4, 8 or 16)

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

// out: [n_rows][n_out], x: [n_rows][n_in] (16-byte aligned rows when kItem % 4 == 0),
// w: n_out rows of row_bytes. n_rows <= R. Dynamic shared memory: XStage<L, R>::kBytes.
template <class L, int R>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    gemv_kernel(float* __restrict__ out, const float* __restrict__ x, const uint8_t* __restrict__ w,
                size_t row_bytes, int64_t n_in, int64_t n_out, int n_rows) {
    constexpr int kItem = L::kItem;
    using Stage = XStage<L, R>;
    extern __shared__ __align__(16) unsigned char gemv_smem[];
    float* xs = reinterpret_cast<float*>(gemv_smem);  // [R][kChunk][kStride]
    const int lane = threadIdx.x % 32;
    const int64_t o0 = (int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32) * kRowsPerWarp;
    // A warp past the last row still helps stage x (the barriers need every thread).
    const bool active = o0 < n_out;
    const bool has_second = o0 + 1 < n_out;
    const uint8_t* row0 = w + (active ? o0 : 0) * row_bytes;
    const uint8_t* row1 = has_second ? row0 + row_bytes : row0;  // duplicate, result unused
    const int64_t n_items = n_in / kItem;
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
            for (int it = lane; it < n_c; it += 32) {
                float v0[kItem], v1[kItem];
                L::load(row0, c0 + it, v0);
                L::load(row1, c0 + it, v1);
                gemv_item<kItem, R>(acc, v0, v1, xs + it * Stage::kStride,
                                    Stage::kChunk * Stage::kStride, n_rows);
            }
        }
    } else if (active) {
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
            out[r * n_out + o0] = s0;
            if (has_second) out[r * n_out + o0 + 1] = s1;
        }
    }
}

template <class L, int R>
void launch_gemv_rows(float* out, const float* x, const WeightView& w, int n_rows,
                      cudaStream_t s) {
    constexpr size_t smem = XStage<L, R>::kBytes;
    if constexpr (smem > 48 * 1024) cu::allow_dynamic_smem(gemv_kernel<L, R>, smem, s);
    const dim3 grid(unsigned(cu::ceil_div(w.n_out, kRowsPerBlock)));
    gemv_kernel<L, R><<<grid, kWarpsPerBlock * 32, smem, s>>>(
        out, x, static_cast<const uint8_t*>(w.data), w.row_bytes, w.n_in, w.n_out, n_rows);
    CUDA_CHECK_LAUNCH();
}

template <class L>
void launch_gemv(float* out, const float* x, const WeightView& w, int64_t n_rows, cudaStream_t s) {
    for (int64_t r0 = 0; r0 < n_rows; r0 += kMaxRows) {
        const int nr = int(n_rows - r0 < kMaxRows ? n_rows - r0 : kMaxRows);
        float* o = out + r0 * w.n_out;
        const float* xr = x + r0 * w.n_in;
        if (nr == 1)
            launch_gemv_rows<L, 1>(o, xr, w, nr, s);
        else if (nr == 2)
            launch_gemv_rows<L, 2>(o, xr, w, nr, s);
        else if (nr <= 4)
            launch_gemv_rows<L, 4>(o, xr, w, nr, s);
        else if (nr <= 8)
            launch_gemv_rows<L, 8>(o, xr, w, nr, s);
        else
            launch_gemv_rows<L, 16>(o, xr, w, nr, s);
    }
}

}  // namespace

bool cuda_supports_weight_type(GgmlType t) {
    return cu::weight_block_elems(t) != 0;
}

void cuda_gemv(float* out, const float* x, const WeightView& w, int64_t n_rows, cudaStream_t s) {
    CUDA_REQUIRE(cuda_supports_weight_type(w.type), "cuda_gemv: unsupported weight type");
    const int64_t be = cu::weight_block_elems(w.type);
    CUDA_REQUIRE(w.n_in > 0 && w.n_out > 0 && n_rows >= 0, "cuda_gemv: bad shape");
    CUDA_REQUIRE(w.n_in % be == 0, "cuda_gemv: n_in is not a whole number of blocks");
    CUDA_REQUIRE(w.row_bytes == size_t(w.n_in / be) * cu::weight_block_bytes(w.type),
                 "cuda_gemv: row_bytes does not match the type and n_in");
    CUDA_REQUIRE(reinterpret_cast<uintptr_t>(w.data) % 16 == 0,
                 "cuda_gemv: weight data must be 16-byte aligned");
    if (n_rows == 0) return;
    const bool vec = w.row_bytes % 16 == 0 && w.n_in % 8 == 0;
    // Items of >= 4 elements read x with 16-byte loads.
    CUDA_REQUIRE(((be == 1 && !vec) || (reinterpret_cast<uintptr_t>(x) % 16 == 0)),
                 "cuda_gemv: x must be 16-byte aligned");
    cu::with_loader(w.type, vec, [&](auto tag) {
        launch_gemv<typename decltype(tag)::type>(out, x, w, n_rows, s);
    });
}

}  // namespace kvrun
