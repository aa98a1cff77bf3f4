// Prefill matmul: activations -> f16, weights dequantized tile by tile to f16, cuBLAS GEMM on
// tensor cores with f32 accumulation (F32 weights: plain f32 SGEMM); and cuda_matmul, which
// picks the fused GEMV for a few rows and this path for many.
#include <cublas_v2.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/cublas_lib.h"
#include "cuda/dequant.cuh"
#include "cuda/ops.h"

namespace kvrun {
namespace {

// Bytes of dequantized weight rows per GEMM tile (bounds the scratch for huge matrices
// such as the output projection).
constexpr size_t kWeightTileBytes = size_t(32) << 20;

// out[i] = half(x[i]), n elements.
__global__ void f32_to_f16_kernel(__half* __restrict__ out, const float* __restrict__ x,
                                  int64_t n) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2half_rn(x[i]);
}

size_t align_up(size_t v, size_t a) {
    return (v + a - 1) / a * a;
}

}  // namespace

void cuda_gemm(float* out, const float* x, const WeightView& w, int64_t n_rows,
               CudaScratch& scratch, cudaStream_t s) {
    CUDA_REQUIRE(cuda_supports_weight_type(w.type), "cuda_gemm: unsupported weight type");
    CUDA_REQUIRE(w.n_in > 0 && w.n_out > 0 && n_rows >= 0, "cuda_gemm: bad shape");
    CUDA_REQUIRE(w.n_in <= INT32_MAX && w.n_out <= INT32_MAX && n_rows <= INT32_MAX,
                 "cuda_gemm: dimension too large for cuBLAS");
    if (n_rows == 0) return;
    auto handle = static_cast<cublasHandle_t>(scratch.cublas(s));
    const CublasLib& blas = cublas_lib();
    const float alpha = w.scale, beta = 0.0f;  // (the matrix's factor, WeightView::scale)
    const int m_in = int(w.n_in), m_out = int(w.n_out), m_rows = int(n_rows);
    if (w.type == GgmlType::F32) {
        CUDA_REQUIRE(w.row_bytes == size_t(w.n_in) * 4, "cuda_gemm: F32 rows must be dense");
        // Column-major view: C[n_out x n_rows] = W^T[n_out x n_in] * X[n_in x n_rows].
        CUBLAS_CHECK(blas.sgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, m_out, m_rows, m_in, &alpha,
                                static_cast<const float*>(w.data), m_in, x, m_in, &beta, out,
                                m_out));
        return;
    }
    // Scratch: x as f16 [n_rows][n_in], then one weight tile [tile_rows][n_in] of f16.
    const size_t x_bytes = align_up(size_t(n_rows) * size_t(w.n_in) * 2, 256);
    int64_t tile_rows = int64_t(kWeightTileBytes / (size_t(w.n_in) * 2));
    tile_rows = std::max<int64_t>(64, tile_rows / 64 * 64);
    tile_rows = std::min(tile_rows, w.n_out);
    const size_t tile_bytes = size_t(tile_rows) * size_t(w.n_in) * 2;
    auto* base = static_cast<uint8_t*>(scratch.get(x_bytes + tile_bytes, s));
    auto* x16 = reinterpret_cast<__half*>(base);
    auto* w16 = reinterpret_cast<__half*>(base + x_bytes);

    const int64_t n_x = n_rows * w.n_in;
    f32_to_f16_kernel<<<unsigned(cu::ceil_div(n_x, 256)), 256, 0, s>>>(x16, x, n_x);
    CUDA_CHECK_LAUNCH();
    for (int64_t o0 = 0; o0 < w.n_out; o0 += tile_rows) {
        const int64_t rows = std::min(tile_rows, w.n_out - o0);
        cuda_dequantize_f16(reinterpret_cast<uint16_t*>(w16), w, o0, rows, s);
        // C[rows x n_rows] (column-major, ldc n_out) = W16^T * X16, f32 accumulate.
        CUBLAS_CHECK(blas.gemm_ex(handle, CUBLAS_OP_T, CUBLAS_OP_N, int(rows), m_rows, m_in, &alpha,
                                  w16, CUDA_R_16F, m_in, x16, CUDA_R_16F, m_in, &beta, out + o0,
                                  CUDA_R_32F, m_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
}

void cuda_matmul(float* out, const float* x, const WeightView& w, int64_t n_rows,
                 CudaScratch& scratch, cudaStream_t s, const CudaXq* xq) {
    if (n_rows <= kCudaGemvMaxRows)
        cuda_gemv(out, x, w, n_rows, scratch, s, xq);
    else
        cuda_gemm(out, x, w, n_rows, scratch, s);
}

}  // namespace kvrun
