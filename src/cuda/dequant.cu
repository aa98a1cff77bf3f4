// Row dequantization kernels: embedding lookup (gather rows -> f32) and weight tiles -> f16
// for the tensor-core GEMM. One thread decodes one item (32 or 8 elements, or 1 for
// unaligned float rows) and stores it with vector stores where the layout allows.
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/dequant.cuh"
#include "cuda/ops.h"

namespace kvrun {
namespace {

__device__ __forceinline__ void store_vals(float* dst, const float* v, int n) {
    for (int i = 0; i < n; ++i) dst[i] = v[i];
}

template <int kN>
__device__ __forceinline__ void store_item(float* dst, const float* v) {
    if constexpr (kN % 4 == 0) {
#pragma unroll
        for (int i = 0; i < kN / 4; ++i)
            reinterpret_cast<float4*>(dst)[i] =
                make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
    } else {
        store_vals(dst, v, kN);
    }
}

template <int kN>
__device__ __forceinline__ void store_item(__half* dst, const float* v) {
    if constexpr (kN % 8 == 0) {
#pragma unroll
        for (int i = 0; i < kN / 8; ++i) {
            uint4 q;
            uint32_t* w = reinterpret_cast<uint32_t*>(&q);
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const __half2 h = __floats2half2_rn(v[8 * i + 2 * k], v[8 * i + 2 * k + 1]);
                w[k] = *reinterpret_cast<const uint32_t*>(&h);
            }
            reinterpret_cast<uint4*>(dst)[i] = q;
        }
    } else {
#pragma unroll
        for (int i = 0; i < kN; ++i) dst[i] = __float2half_rn(v[i]);
    }
}

// out: [n_rows][n_in] of OutT. Output row r is weight row rows[r] (rows == nullptr: row0 + r);
// an id outside [0, n_src_rows) gives a zero row.
template <class L, class OutT>
__global__ void dequant_rows_kernel(OutT* __restrict__ out, const uint8_t* __restrict__ w,
                                    size_t row_bytes, int64_t n_in, int64_t n_rows,
                                    const int32_t* __restrict__ rows, int64_t row0,
                                    int64_t n_src_rows) {
    const int64_t items_per_row = n_in / L::kItem;
    const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= n_rows * items_per_row) return;
    const int64_t r = idx / items_per_row, it = idx % items_per_row;
    const int64_t src = rows ? int64_t(rows[r]) : row0 + r;
    float v[L::kItem];
    if (src >= 0 && src < n_src_rows) {
        L::load(w + src * row_bytes, it, v);
    } else {
#pragma unroll
        for (int i = 0; i < L::kItem; ++i) v[i] = 0.0f;
    }
    store_item<L::kItem>(out + r * n_in + it * L::kItem, v);
}

template <class OutT>
void dequant_rows(OutT* out, const WeightView& w, const int32_t* rows, int64_t row0, int64_t n_rows,
                  cudaStream_t s, const char* who) {
    CUDA_REQUIRE(cuda_supports_weight_type(w.type), who);
    const int64_t be = cu::weight_block_elems(w.type);
    CUDA_REQUIRE(w.n_in > 0 && w.n_in % be == 0 && n_rows >= 0, who);
    CUDA_REQUIRE(w.row_bytes == size_t(w.n_in / be) * cu::weight_block_bytes(w.type), who);
    CUDA_REQUIRE(reinterpret_cast<uintptr_t>(w.data) % 16 == 0, who);
    if (n_rows == 0) return;
    // Vector loads need aligned rows; vector stores need aligned output rows.
    const bool vec =
        w.row_bytes % 16 == 0 && w.n_in % 8 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
    CUDA_REQUIRE(be == 1 || reinterpret_cast<uintptr_t>(out) % 16 == 0, who);
    const auto* data = static_cast<const uint8_t*>(w.data);
    cu::with_loader(w.type, vec, [&](auto tag) {
        using L = typename decltype(tag)::type;
        const int64_t n_items = n_rows * (w.n_in / L::kItem);
        const int threads = 256;
        dequant_rows_kernel<L, OutT><<<unsigned(cu::ceil_div(n_items, threads)), threads, 0, s>>>(
            out, data, w.row_bytes, w.n_in, n_rows, rows, row0, w.n_out);
        CUDA_CHECK_LAUNCH();
    });
}

}  // namespace

void cuda_embed(float* out, const WeightView& table, const int32_t* tokens, int64_t n_tokens,
                cudaStream_t s) {
    dequant_rows<float>(out, table, tokens, 0, n_tokens, s,
                        "cuda_embed: unsupported or misaligned embedding table");
}

void cuda_dequantize_f16(uint16_t* out, const WeightView& w, int64_t row0, int64_t n_rows,
                         cudaStream_t s) {
    CUDA_REQUIRE(row0 >= 0 && row0 + n_rows <= w.n_out, "cuda_dequantize_f16: rows out of range");
    dequant_rows<__half>(reinterpret_cast<__half*>(out), w, nullptr, row0, n_rows, s,
                         "cuda_dequantize_f16: unsupported or misaligned weight");
}

}  // namespace kvrun
