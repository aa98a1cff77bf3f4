// Decode matmul: fused dequantize x vector for every weight type. One warp per weight row;
// lanes walk the row's items (32-element blocks / sub-blocks, or 8 floats) so a warp reads
// contiguous memory, each weight byte is read once for up to kMaxRows activation rows, and
// the partial dots are combined with shuffles.
#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/dequant.cuh"
#include "cuda/ops.h"

namespace kvrun {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kMaxRows = 8;  // activation rows per pass (template R is 1, 2, 4 or 8)

// dot of v[0..n) with x[0..n); x 16-byte aligned when n % 4 == 0.
template <int kN>
__device__ __forceinline__ float dot_item(const float* v, const float* __restrict__ x) {
    float s = 0.0f;
    if constexpr (kN % 4 == 0) {
#pragma unroll
        for (int i = 0; i < kN / 4; ++i) {
            const float4 xv = reinterpret_cast<const float4*>(x)[i];
            s = fmaf(v[4 * i], xv.x, s);
            s = fmaf(v[4 * i + 1], xv.y, s);
            s = fmaf(v[4 * i + 2], xv.z, s);
            s = fmaf(v[4 * i + 3], xv.w, s);
        }
    } else {
#pragma unroll
        for (int i = 0; i < kN; ++i) s = fmaf(v[i], x[i], s);
    }
    return s;
}

// out: [n_rows][n_out], x: [n_rows][n_in], w: n_out rows of row_bytes. n_rows <= R.
template <class L, int R>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    gemv_kernel(float* __restrict__ out, const float* __restrict__ x, const uint8_t* __restrict__ w,
                size_t row_bytes, int64_t n_in, int64_t n_out, int n_rows) {
    const int lane = threadIdx.x % 32;
    const int64_t o = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
    if (o >= n_out) return;
    const uint8_t* row = w + o * row_bytes;
    const int64_t n_items = n_in / L::kItem;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
#pragma unroll 2
    for (int64_t it = lane; it < n_items; it += 32) {
        float v[L::kItem];
        L::load(row, it, v);
        const float* xi = x + it * L::kItem;
#pragma unroll
        for (int r = 0; r < R; ++r)
            if (r < n_rows) acc[r] += dot_item<L::kItem>(v, xi + r * n_in);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const float s = cu::warp_sum(acc[r]);
        if (lane == 0 && r < n_rows) out[r * n_out + o] = s;
    }
}

template <class L>
void launch_gemv(float* out, const float* x, const WeightView& w, int64_t n_rows, cudaStream_t s) {
    const dim3 grid(unsigned(cu::ceil_div(w.n_out, kWarpsPerBlock)));
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
        else
            gemv_kernel<L, 8><<<grid, block, 0, s>>>(o, xr, data, w.row_bytes, w.n_in, w.n_out, nr);
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
