// Host emulation of the CUDA subset kvrun's kernels use (developer tool, see README.md).
// rewrite.py turns src/cuda/*.cu{,h} into host C++ that includes this header: kernel
// launches become emu::launch, __shared__ variables are poisoned (NaN / -1) at the start of
// every CTA, and each CUDA thread of a CTA runs as a fiber with real __syncthreads and warp
// (shuffle / vote / __syncwarp) rendezvous. One CTA runs at a time; within a CTA the fibers
// are scheduled forward, reversed or randomly between synchronization points (EMU_ORDER).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <vector_functions.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>

#undef __device__
#undef __global__
#undef __host__
#undef __shared__
#undef __forceinline__
#undef __launch_bounds__
#undef __align__
#define __device__
#define __global__
#define __host__
#define __shared__ static
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)

extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;

namespace emu {
void syncthreads();
// __syncthreads_count / _and / _or: op 0 count, 1 and, 2 or.
int syncthreads_reduce(int pred, int op);
// Warp rendezvous: deposits v, waits for every lane of the warp, returns the warp's 32 slots.
// Dies unless `mask` names every lane of the warp (partial-mask warp ops are not emulated).
const uint64_t* warp_exchange(uint64_t v, unsigned mask);
// Lanes of the calling thread's warp (the last warp of a block may be partial).
unsigned warp_lane_mask();
[[noreturn]] void die(const char* what);
unsigned char* dyn_smem();
// First thread of a CTA to reach a __shared__ declaration poisons it (0xFF bytes).
void shared_decl(void* p, size_t n);
struct LaunchCfg {
    dim3 grid, block;
    size_t smem = 0;
    template <class G, class B>
    LaunchCfg(G g, B b, size_t sm = 0, cudaStream_t = nullptr)
        : grid(to_dim(g)), block(to_dim(b)), smem(sm) {}
    template <class T>
    static dim3 to_dim(T v) {
        if constexpr (std::is_same_v<T, dim3>)
            return v;
        else
            return dim3(unsigned(v));
    }
};
void run_grid(const void* kernel, const LaunchCfg& cfg, const std::function<void()>& body);
// CUDA graph capture: while a stream captures, launches, async copies / memsets and GEMMs
// are recorded (with copies of their arguments) instead of run; a graph launch replays them.
bool capturing();
void record(std::function<void()> op);
template <class... P, class... A>
void launch(void (*k)(P...), LaunchCfg cfg, A&&... a) {
    std::tuple<std::decay_t<P>...> args(static_cast<std::decay_t<P>>(a)...);
    if (capturing()) {
        record([k, cfg, args] {
            run_grid(reinterpret_cast<const void*>(k), cfg, [&] { std::apply(k, args); });
        });
        return;
    }
    run_grid(reinterpret_cast<const void*>(k), cfg, [&] { std::apply(k, args); });
}
template <class T>
uint64_t to_bits(const T& v) {
    static_assert(sizeof(T) <= 8, "warp exchange of a value wider than 8 bytes");
    uint64_t u = 0;
    std::memcpy(&u, &v, sizeof(T));
    return u;
}
template <class T>
T from_bits(uint64_t u) {
    T v;
    std::memcpy(&v, &u, sizeof(T));
    return v;
}
inline unsigned lane() {
    return threadIdx.x % 32;
}
inline uint64_t read_lane(const uint64_t* b, unsigned src) {
    if (!(warp_lane_mask() >> src & 1u)) die("warp op reads a lane outside the block");
    return b[src];
}
}  // namespace emu

inline void __syncthreads() {
    emu::syncthreads();
}
inline int __syncthreads_count(int p) {
    return emu::syncthreads_reduce(p, 0);
}
inline int __syncthreads_and(int p) {
    return emu::syncthreads_reduce(p, 1);
}
inline int __syncthreads_or(int p) {
    return emu::syncthreads_reduce(p, 2);
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
    (void)emu::warp_exchange(0, mask);
}
inline void __threadfence() {}
inline void __threadfence_block() {}

template <class T>
inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    const uint64_t* b = emu::warp_exchange(emu::to_bits(v), mask);
    const unsigned l = emu::lane(), w = unsigned(width);
    return emu::from_bits<T>(emu::read_lane(b, (l & ~(w - 1)) | (unsigned(src) & (w - 1))));
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int m, int width = 32) {
    const uint64_t* b = emu::warp_exchange(emu::to_bits(v), mask);
    const unsigned l = emu::lane(), w = unsigned(width), src = l ^ unsigned(m);
    if ((src & ~(w - 1)) != (l & ~(w - 1))) return v;  // outside the lane's segment: own value
    return emu::from_bits<T>(emu::read_lane(b, src));
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) {
    const uint64_t* b = emu::warp_exchange(emu::to_bits(v), mask);
    const unsigned l = emu::lane(), w = unsigned(width);
    if ((l & (w - 1)) < d) return v;
    return emu::from_bits<T>(emu::read_lane(b, l - d));
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) {
    const uint64_t* b = emu::warp_exchange(emu::to_bits(v), mask);
    const unsigned l = emu::lane(), w = unsigned(width);
    if ((l & (w - 1)) + d >= w) return v;
    return emu::from_bits<T>(emu::read_lane(b, l + d));
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
    const uint64_t* b = emu::warp_exchange(pred != 0, mask);
    const unsigned live = emu::warp_lane_mask();
    unsigned r = 0;
    for (unsigned l = 0; l < 32; ++l)
        if ((live >> l & 1u) && b[l]) r |= 1u << l;
    return r & mask;
}
inline int __any_sync(unsigned mask, int pred) {
    return __ballot_sync(mask, pred) != 0;
}
inline int __all_sync(unsigned mask, int pred) {
    return __ballot_sync(mask, pred) == (mask & emu::warp_lane_mask());
}
template <class T>
inline unsigned __match_any_sync(unsigned mask, T v) {
    const uint64_t* b = emu::warp_exchange(emu::to_bits(v), mask);
    const unsigned live = emu::warp_lane_mask() & mask;
    const uint64_t me = emu::to_bits(v);
    unsigned r = 0;
    for (unsigned l = 0; l < 32; ++l)
        if ((live >> l & 1u) && b[l] == me) r |= 1u << l;
    return r;
}
inline unsigned __activemask() {
    return emu::warp_lane_mask();
}

// Atomics: fibers switch only inside synchronization calls, so plain read-modify-write is
// atomic here (one CTA at a time also makes global atomics exact).
template <class T, class U>
inline T atomicAdd(T* p, U v) {
    const T old = *p;
    *p = T(old + T(v));
    return old;
}
template <class T, class U>
inline T atomicSub(T* p, U v) {
    const T old = *p;
    *p = T(old - T(v));
    return old;
}
template <class T, class U>
inline T atomicMax(T* p, U v) {
    const T old = *p;
    if (old < T(v)) *p = T(v);
    return old;
}
template <class T, class U>
inline T atomicMin(T* p, U v) {
    const T old = *p;
    if (T(v) < old) *p = T(v);
    return old;
}
template <class T, class U>
inline T atomicExch(T* p, U v) {
    const T old = *p;
    *p = T(v);
    return old;
}
template <class T, class U>
inline T atomicCAS(T* p, U cmp, U v) {
    const T old = *p;
    if (old == T(cmp)) *p = T(v);
    return old;
}
template <class T, class U>
inline T atomicOr(T* p, U v) {
    const T old = *p;
    *p = T(old | T(v));
    return old;
}
template <class T, class U>
inline T atomicAnd(T* p, U v) {
    const T old = *p;
    *p = T(old & T(v));
    return old;
}

inline int __popc(unsigned x) {
    return __builtin_popcount(x);
}
inline int __popcll(unsigned long long x) {
    return __builtin_popcountll(x);
}
inline int __clz(unsigned x) {
    return x ? __builtin_clz(x) : 32;
}
inline int __clzll(unsigned long long x) {
    return x ? __builtin_clzll(x) : 64;
}
inline int __ffs(unsigned x) {
    return __builtin_ffs(int(x));
}
inline int __ffsll(unsigned long long x) {
    return __builtin_ffsll((long long)x);
}
inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; ++i) r |= (x >> i & 1u) << (31 - i);
    return r;
}
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const uint64_t in = uint64_t(y) << 32 | x;
    unsigned r = 0;
    for (int n = 0; n < 4; ++n) r |= unsigned(in >> (8 * ((s >> (4 * n)) & 7u)) & 0xffu) << (8 * n);
    return r;
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift) {
    return unsigned(((uint64_t(hi) << 32) | lo) >> (shift & 31u));
}
// Four signed byte products added to c (the GPU's dp4a); byte-wise a - b mod 256.
inline int __dp4a(int a, int b, int c) {
    for (int k = 0; k < 4; ++k) c += int(int8_t(uint32_t(a) >> (8 * k))) * int(int8_t(uint32_t(b) >> (8 * k)));
    return c;
}
// Two signed 16-bit halves of a times signed bytes 0-1 (lo) or 2-3 (hi) of b, added to c.
inline int __dp2a_lo(int a, int b, int c) {
    for (int k = 0; k < 2; ++k) c += int(int16_t(uint32_t(a) >> (16 * k))) * int(int8_t(uint32_t(b) >> (8 * k)));
    return c;
}
inline int __dp2a_hi(int a, int b, int c) {
    for (int k = 0; k < 2; ++k) c += int(int16_t(uint32_t(a) >> (16 * k))) * int(int8_t(uint32_t(b) >> (8 * (k + 2))));
    return c;
}
inline unsigned __vsub4(unsigned a, unsigned b) {
    unsigned r = 0;
    for (int k = 0; k < 4; ++k) r |= ((((a >> (8 * k)) & 0xffu) - ((b >> (8 * k)) & 0xffu)) & 0xffu) << (8 * k);
    return r;
}
inline int __float2int_rn(float x) {
    if (std::isnan(x)) return 0;
    if (x >= 2147483647.0f) return 2147483647;
    if (x <= -2147483648.0f) return int(-2147483647 - 1);
    return int(std::nearbyint(x));
}
template <class A, class B>
inline std::common_type_t<A, B> min(A a, B b) {
    using C = std::common_type_t<A, B>;
    return C(a) < C(b) ? C(a) : C(b);
}
template <class A, class B>
inline std::common_type_t<A, B> max(A a, B b) {
    using C = std::common_type_t<A, B>;
    return C(a) < C(b) ? C(b) : C(a);
}
#include <math.h>
inline float __uint_as_float(uint32_t u) {
    return emu::from_bits<float>(u);
}
inline uint32_t __float_as_uint(float f) {
    return uint32_t(emu::to_bits(f));
}
inline float __int_as_float(int u) {
    return emu::from_bits<float>(uint32_t(u));
}
inline int __float_as_int(float f) {
    return int(uint32_t(emu::to_bits(f)));
}
// Device intrinsics with their own rounding on the GPU: here the exact host functions.
inline float rsqrtf(float x) {
    return 1.0f / std::sqrt(x);
}
inline float __expf(float x) {
    return std::exp(x);
}
inline float __logf(float x) {
    return std::log(x);
}
inline float __fdividef(float a, float b) {
    return a / b;
}
inline float __fmul_rn(float a, float b) {  // (GPU: a product never contracted into an FMA)
    return a * b;
}
template <class T>
inline T __ldg(const T* p) {
    return *p;
}
template <class... P>
inline cudaError_t cudaFuncSetAttribute(void (*f)(P...), cudaFuncAttribute a, int v) {
    return cudaFuncSetAttribute(reinterpret_cast<const void*>(f), a, v);
}
