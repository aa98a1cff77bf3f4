// Shared CUDA helpers: CUDA_CHECK / CUBLAS_CHECK (a failed call stops the program with
// file:line by throwing kvrun::Error), warp reductions and half/bfloat16 loads.
// The checking macros are plain C++ so host .cpp files of the CUDA backend can use them too.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "cuda/device.h"

namespace kvrun {

// Throws kvrun::Error("what (at file:line)"). Defined in device.cpp so CUDA
// translation units need not include fmt.
[[noreturn]] void cuda_throw(const char* file, int line, const char* what);
// Same for a failed CUDA runtime call: names the call and the CUDA error string.
[[noreturn]] void cuda_throw_call(const char* file, int line, const char* call, cudaError_t err);
// Same for a failed cuBLAS call (status is a cublasStatus_t).
[[noreturn]] void cuda_throw_cublas(const char* file, int line, const char* call, int status);

// A kernel choice from the environment: false when `name` is unset, empty or "auto", true
// when it is `on`; any other value throws Error naming the variable and both values.
// (Callers read it once.)
bool cuda_env_switch(const char* name, const char* on);
// The value of `name` when it is one of `choices`, "" when unset or empty; any other value
// throws Error naming the variable, its value and the choices.
std::string cuda_env_choice(const char* name, std::initializer_list<const char*> choices);

}  // namespace kvrun

#define CUDA_CHECK(call)                                                     \
    do {                                                                     \
        cudaError_t kvrun_err_ = (call);                                     \
        if (kvrun_err_ != cudaSuccess)                                       \
            ::kvrun::cuda_throw_call(__FILE__, __LINE__, #call, kvrun_err_); \
    } while (0)

#define CUBLAS_CHECK(call)                                                                    \
    do {                                                                                      \
        int kvrun_st_ = int(call);                                                            \
        if (kvrun_st_ != 0) ::kvrun::cuda_throw_cublas(__FILE__, __LINE__, #call, kvrun_st_); \
    } while (0)

// Checks the most recent kernel launch (bad configuration, missing image for this GPU).
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

// Precondition check in launchers: throws with file:line and the message when false.
#define CUDA_REQUIRE(cond, msg)                                    \
    do {                                                           \
        if (!(cond)) ::kvrun::cuda_throw(__FILE__, __LINE__, msg); \
    } while (0)

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace kvrun::cu {

constexpr int kWarp = 32;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024). Every thread gets
// the result. `scratch` holds 32 floats of shared memory; it may be reused after return.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    const int n_warps = blockDim.x / kWarp;
    v = warp_sum(v);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < n_warps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    const int n_warps = blockDim.x / kWarp;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < n_warps ? scratch[lane] : -INFINITY;
    return warp_max(v);
}

// SwiGLU's gate: silu(g) * u, the one formula of every kernel that applies it.
__device__ __forceinline__ float silu_mul(float g, float u) {
    return g / (1.0f + expf(-g)) * u;
}

// GeGLU's gate (Gemma): gelu(g) * u with GELU's tanh approximation, the one formula of every
// kernel that applies it.
__device__ __forceinline__ float gelu_mul(float g, float u) {
    return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * u;
}

// Lets `kernel` take `bytes` (over 48 KiB) of dynamic shared memory. Only outside a graph
// capture: every captured shape runs eagerly first (CudaBackend::run_step), which sets it.
template <class Kernel>
inline void allow_dynamic_smem(Kernel kernel, size_t bytes, cudaStream_t s) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(s, &status));
    if (status == cudaStreamCaptureStatusNone)
        CUDA_CHECK(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

// Programmatic dependent launch. A kernel started by launch_pdl may begin while the kernel
// before it in the stream is still running, so a short kernel's launch and drain, or a GEMV's
// first weight loads, overlap its predecessor. Its contract: every thread calls pdl_wait()
// before it touches memory that an earlier kernel writes or reads (activations, caches,
// outputs; constant weights may be read or prefetched before), and before any early return,
// so that the kernel ends only after its predecessor has (the next kernel's pdl_wait() then
// covers every kernel before). pdl_launch_dependents() lets the next kernel start; without
// it, that waits for this kernel's blocks to exit. Both are no-ops below sm_90, in a normal
// launch and in the emulator.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// The usual start of a launch_pdl kernel: wait for the predecessor, then let the successor's
// blocks be scheduled (they wait in turn).
__device__ __forceinline__ void pdl_begin() {
    pdl_wait();
    pdl_launch_dependents();
}
// Asks L2 to fetch the 128-byte line at p (a hint: no result, no fault on valid memory).
__device__ __forceinline__ void prefetch_l2(const void* p) {
#if defined(__CUDA_ARCH__)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
}

// kernel<<<grid, block, smem, s>>>(args), with programmatic stream serialization when
// cuda_pdl_enabled(): the kernel must keep pdl_wait()'s contract above.
template <class... P, class... A>
inline void launch_pdl(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                       A&&... args) {
#if defined(__NVCC__)
    if (cuda_pdl_enabled()) {
        cudaLaunchAttribute attr{};
        attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr.val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t cfg{};
        cfg.gridDim = grid;
        cfg.blockDim = block;
        cfg.dynamicSmemBytes = smem;
        cfg.stream = s;
        cfg.attrs = &attr;
        cfg.numAttrs = 1;
        CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<P>(args)...));
        return;
    }
#endif
    kernel<<<grid, block, smem, s>>>(static_cast<P>(args)...);
    CUDA_CHECK_LAUNCH();
}

// Element e of x ([rows][n], n % 32 == 0) quantized for the integer GEMV (gemv.cu): every
// lane of the calling warp holds one element of the same 32-element block, in lane order
// (e % 32 == lane). The block's scale d = max|x| / 127 (bytes, elt_bytes 1) or / 32767
// (int16s, 2) goes to xd[e / 32]; the element, round-to-nearest-even of x / d, to xq. The
// one definition of that arithmetic, so each producer writes the same bits.
__device__ __forceinline__ void quantize_x_store(float v, int64_t e, int8_t* __restrict__ xq,
                                                 float* __restrict__ xd, int elt_bytes) {
    const float amax = warp_max(fabsf(v));
    const float d = amax / (elt_bytes == 1 ? 127.0f : 32767.0f);
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    if (elt_bytes == 1)
        xq[e] = int8_t(__float2int_rn(v * id));
    else
        reinterpret_cast<int16_t*>(xq)[e] = int16_t(__float2int_rn(v * id));
    if (e % 32 == 0) xd[e / 32] = d;
}

// Byte-packed little-endian loads (GGUF blocks are not naturally aligned).
__device__ __forceinline__ uint32_t ld_u16(const uint8_t* p) {
    return *reinterpret_cast<const uint16_t*>(p);  // callers guarantee 2-byte alignment
}
__device__ __forceinline__ float ld_f16(const uint8_t* p) {
    return __half2float(*reinterpret_cast<const __half*>(p));
}
__device__ __forceinline__ float bf16_bits_to_float(uint32_t bits16) {
    return __uint_as_float(bits16 << 16);
}
// float(int(u) - kBias) for an integer code 0 <= u < 2^22 (0 <= kBias < 2^22) without a
// conversion instruction. The dequantizing loaders convert every weight, and I2F issues at 16
// results per clock per SM on sm_80 / sm_90 against 128 for FADD: at 4 bits per weight that
// pipe, not memory, would bound a GEMV. u in the mantissa of 2^23 is the float 2^23 + u, and
// subtracting 2^23 + kBias is exact, so the value, and every product with it, keeps its bits.
template <int kBias = 0>
__device__ __forceinline__ float code_float(uint32_t u) {
    return __uint_as_float(0x4B000000u | u) - float(0x800000 + kBias);
}
// float(int8_t(b)) for a byte 0 <= b < 256 (b ^ 0x80 is its signed value + 128).
__device__ __forceinline__ float sbyte_float(uint32_t b) {
    return code_float<128>(b ^ 0x80u);
}
// 32-bit word from a 2-byte aligned address.
__device__ __forceinline__ uint32_t ld_u32_a2(const uint8_t* p) {
    const uint16_t* q = reinterpret_cast<const uint16_t*>(p);
    return uint32_t(q[0]) | (uint32_t(q[1]) << 16);
}

__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

}  // namespace kvrun::cu
#endif  // __CUDACC__
