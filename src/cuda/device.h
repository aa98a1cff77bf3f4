// CUDA device queries (count, properties, free memory) and checked device allocation whose
// out-of-memory error tells the user how much was requested and how much is free.
// Plain C++ header: usable from code built without nvcc (when KVRUN_HAS_CUDA is defined).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvrun {

struct CudaDeviceInfo {
    int id = 0;
    std::string name;
    int cc_major = 0, cc_minor = 0;  // compute capability
    int sm_count = 0;
    size_t total_bytes = 0;           // global memory
    size_t free_bytes = 0;            // free at the time of the query
    size_t smem_per_block_optin = 0;  // max dynamic shared memory per block (opt-in)
    double peak_bandwidth_gbs = 0;    // theoretical DRAM bandwidth (0 when unknown)
};

// Number of usable CUDA devices; 0 when there is no driver or no device (never throws).
int cuda_device_count();
// Properties of `device`; throws Error when it does not exist.
CudaDeviceInfo cuda_device_info(int device);
// One line for logs: "NVIDIA H100 (sm_90, 132 SMs, 79.1 GiB, 3352 GB/s)".
std::string cuda_device_summary(const CudaDeviceInfo& info);
// Makes `device` current for this thread; throws Error naming the valid range otherwise.
void cuda_set_device(int device);
// Free and total bytes of the current device.
void cuda_mem_info(size_t* free_bytes, size_t* total_bytes);

// cudaMalloc that throws Error on failure: "out of GPU memory allocating <what>:
// requested X MiB, Y MiB free of Z MiB" with a hint (smaller --kv-memory / --ctx / model).
void* cuda_alloc(size_t bytes, const char* what);
// cudaFree (null is fine); errors are ignored because this runs in destructors.
void cuda_free(void* p) noexcept;
// Programmatic dependent launch (cu::launch_pdl in common.cuh): on with KVRUN_PDL=on on a
// GPU of compute capability 9.0 or newer, read once like the other kernel switches. Opt-in
// until timed on a GPU. cuda_set_pdl sets it for this process (tests).
bool cuda_pdl_enabled();
void cuda_set_pdl(bool on);
// The message cuda_alloc throws, exposed for tests and for callers planning memory.
std::string cuda_oom_message(const char* what, size_t requested, size_t free_bytes,
                             size_t total_bytes);

}  // namespace kvrun
