// Decode matmul: fused dequantize x vector for every weight type. Each warp owns two weight
// rows; lanes walk the rows' items (32-element blocks / sub-blocks, or 8 floats) so a warp
// reads contiguous memory, each weight byte is read once for up to kMaxRows activation rows,
// each activation value loaded from L1 serves both rows, and partial dots are combined with
// shuffles.
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

// out: [n_rows][n_out], x: [n_rows][n_in] (16-byte aligned rows when kItem % 4 == 0),
// w: n_out rows of row_bytes. n_rows <= R.
template <class L, int R>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    gemv_kernel(float* __restrict__ out, const float* __restrict__ x, const uint8_t* __restrict__ w,
                size_t row_bytes, int64_t n_in, int64_t n_out, int n_rows) {
    constexpr int kItem = L::kItem;
    const int lane = threadIdx.x % 32;
    const int64_t o0 = (int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32) * kRowsPerWarp;
    if (o0 >= n_out) return;
    const bool has_second = o0 + 1 < n_out;
    const uint8_t* row0 = w + o0 * row_bytes;
    const uint8_t* row1 = has_second ? row0 + row_bytes : row0;  // duplicate, result unused
    const int64_t n_items = n_in / kItem;
    float acc[kRowsPerWarp][R];
#pragma unroll
    for (int k = 0; k < kRowsPerWarp; ++k)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[k][r] = 0.0f;
    for (int64_t it = lane; it < n_items; it += 32) {
        float v0[kItem], v1[kItem];
        L::load(row0, it, v0);
        L::load(row1, it, v1);
        const float* xi = x + it * kItem;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            if (r >= n_rows) break;
            const float* xr = xi + r * n_in;
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

template <class L>
void launch_gemv(float* out, const float* x, const WeightView& w, int64_t n_rows, cudaStream_t s) {
    const dim3 grid(unsigned(cu::ceil_div(w.n_out, kRowsPerBlock)));
    const dim3 block(kWarpsPerBlock * 32);
    const auto* data = static_cast<const uint8_t*>(w.data);
    for (int64_t r0 = 0; r0 < n_rows; r0 += kMaxRows) {
        const int nr = int(n_rows - r0 < kMaxRows ? n_rows - r0 : kMaxRows);
        float* o = out + r0 * w.n_out;
        const float* xr = x + r0 * w.n_in;
        if (nr == 1)
            gemv_kernel<L, 1><<<grid, block, 0, s>>>(o, xr, data, w.row_bytes, w.n_in, w.n_out, nr);
        else if (nr == 2)
            gemv_kernel<L, 2><<<grid, block, 0, s>>>(o, xr, data, w.row_bytes, w.n_in, w.n_out, nr);
        else if (nr <= 4)
            gemv_kernel<L, 4><<<grid, block, 0, s>>>(o, xr, data, w.row_bytes, w.n_in, w.n_out, nr);
        else if (nr <= 8)
            gemv_kernel<L, 8><<<grid, block, 0, s>>>(o, xr, data, w.row_bytes, w.n_in, w.n_out, nr);
        else
            gemv_kernel<L, 16><<<grid, block, 0, s>>>(o, xr, data, w.row_bytes, w.n_in, w.n_out, nr);
        CUDA_CHECK_LAUNCH();
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
