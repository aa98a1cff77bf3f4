// cuBLAS, opened on first use instead of linked into the executable. Loading libcublasLt
// runs about 0.4 s of start-up work in every process that links it, so a linked cuBLAS made
// every `kvrun` start (tokenize, info, a CPU run, each of the tests' hundreds of runs) pay
// for a library only prefill GEMMs on a GPU use. The backend calls cuBLAS only through
// cublas_lib(); the host emulator (tools/cuda-emu) defines KVRUN_CUBLAS_LINKED and supplies
// the same functions directly.
#pragma once

#include <cublas_v2.h>

#include <cstddef>

namespace kvrun {

// The cuBLAS entry points the backend uses (the `_v2` names behind cublas_v2.h's macros).
struct CublasLib {
    cublasStatus_t (*create)(cublasHandle_t*);
    cublasStatus_t (*destroy)(cublasHandle_t);
    cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
    cublasStatus_t (*set_workspace)(cublasHandle_t, void*, size_t);
    const char* (*status_string)(cublasStatus_t);
    cublasStatus_t (*sgemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const float*, const float*, int, const float*, int, const float*,
                            float*, int);
    cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                              const void*, const void*, cudaDataType, int, const void*,
                              cudaDataType, int, const void*, void*, cudaDataType, int,
                              cublasComputeType_t, cublasGemmAlgo_t);
};

// Opens libcublas.so.<major of the headers built against> once (thread-safe) and resolves
// the entry points; throws Error saying which library and why when it cannot. Searched by
// the dynamic loader's rules, then in the CUDA toolkit's library directory of the build.
const CublasLib& cublas_lib();

// Whether cublas_lib() has opened the library in this process (for tests).
bool cublas_lib_loaded();

}  // namespace kvrun
