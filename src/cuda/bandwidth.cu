// Measures the current device's copy bandwidth with a large device-to-device cudaMemcpy.
#include <cuda_runtime.h>

#include "cuda/bandwidth.h"
#include "cuda/common.cuh"

namespace kvrun {

double cuda_copy_bandwidth() {
    const size_t n = size_t(1) << 30;  // 1 GiB each way
    void *a = nullptr, *b = nullptr;
    if (cudaMalloc(&a, n) != cudaSuccess || cudaMalloc(&b, n) != cudaSuccess) {
        cudaFree(a);
        cudaGetLastError();
        return 0;
    }
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    CUDA_CHECK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));  // warm-up
    float best_ms = 1e30f;
    for (int i = 0; i < 5; ++i) {
        CUDA_CHECK(cudaEventRecord(e0));
        CUDA_CHECK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
        CUDA_CHECK(cudaEventRecord(e1));
        CUDA_CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        best_ms = ms < best_ms ? ms : best_ms;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    return 2.0 * double(n) / (best_ms / 1000.0);
}

}  // namespace kvrun
