// CudaScratch: the growable per-stream device work buffer of the CUDA ops and the cuBLAS
// handle (with its own workspace, so cuBLAS calls can be captured into CUDA graphs).
#include <cuda_runtime_api.h>

#include <algorithm>

#include "common.h"
#include "cuda/common.cuh"
#include "cuda/cublas_lib.h"
#include "cuda/device.h"
#include "cuda/ops.h"

namespace kvrun {

namespace {
constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;
}

CudaScratch::~CudaScratch() {
    if (cublas_) (void)cublas_lib().destroy(static_cast<cublasHandle_t>(cublas_));
    cuda_free(cublas_ws_);
    cuda_free(buf_);
}

void CudaScratch::reserve(size_t bytes) {
    if (bytes <= size_) return;
    const size_t grown = std::max(bytes, size_ + size_ / 2);
    const size_t rounded = (grown + (size_t(1) << 20) - 1) >> 20 << 20;  // whole MiB
    cuda_free(buf_);  // cudaFree waits for kernels still using the old buffer
    buf_ = nullptr;
    size_ = 0;
    buf_ = cuda_alloc(rounded, "CUDA scratch buffer");
    size_ = rounded;
}

void* CudaScratch::get(size_t bytes, cudaStream_t s) {
    if (bytes > size_) {
        cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
        CUDA_CHECK(cudaStreamIsCapturing(s, &status));
        if (status != cudaStreamCaptureStatusNone)
            throw Error(
                fmt::format("CUDA scratch buffer too small during graph capture: need {} "
                            "bytes, have {} (reserve before capturing)",
                            bytes, size_));
        reserve(bytes);
    }
    return buf_;
}

void* CudaScratch::cublas(cudaStream_t s) {
    if (!cublas_) {
        const CublasLib& blas = cublas_lib();
        cublasHandle_t h = nullptr;
        const cublasStatus_t st = blas.create(&h);
        if (st == CUBLAS_STATUS_ALLOC_FAILED || st == CUBLAS_STATUS_NOT_INITIALIZED) {
            // Usually out of device memory: say so with the free / total numbers.
            size_t free_b = 0, total_b = 0;
            (void)cudaMemGetInfo(&free_b, &total_b);
            (void)cudaGetLastError();
            throw Error(fmt::format("cuBLAS could not initialize ({}): {:.1f} MiB of GPU memory "
                                    "free of {:.1f} MiB",
                                    blas.status_string(st), double(free_b) / (1 << 20),
                                    double(total_b) / (1 << 20)),
                        "use a smaller --kv-memory or --ctx, a smaller model, or --device cpu");
        }
        CUBLAS_CHECK(st);
        cublas_ = h;
        cublas_ws_ = cuda_alloc(kCublasWorkspaceBytes, "cuBLAS workspace");
    }
    auto h = static_cast<cublasHandle_t>(cublas_);
    const CublasLib& blas = cublas_lib();
    // cublasSetStream resets the workspace to cuBLAS's own pool, so set ours after it.
    CUBLAS_CHECK(blas.set_stream(h, s));
    CUBLAS_CHECK(blas.set_workspace(h, cublas_ws_, kCublasWorkspaceBytes));
    return h;
}

}  // namespace kvrun
