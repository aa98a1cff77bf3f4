// The CUDA backend factory (plain C++ header, usable when KVRUN_HAS_CUDA is defined): the
// llama / qwen2 forward pass on one GPU with weights uploaded once, paged KV pools in device
// memory and decode steps replayed as CUDA graphs. Also brings in the device queries.
#pragma once

#include <memory>

#include "backend.h"
#include "cuda/device.h"
#include "gguf.h"

namespace kvrun {

// Builds the backend on CUDA device `device`. The weights are copied to the GPU, so `file`
// need not outlive the backend. Throws Error for a missing device, a weight type or shape
// the kernels cannot handle (naming the tensor), or too little GPU memory (requested vs
// free bytes). Set KVRUN_CUDA_GRAPHS=0 in the environment to run decode steps eagerly.
std::unique_ptr<Backend> make_cuda_backend(const GgufFile& file, const BackendOptions& options,
                                           int device);

}  // namespace kvrun
