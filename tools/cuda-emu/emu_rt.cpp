// Runtime side of the host CUDA emulation (see README.md): the fiber scheduler behind
// emu::launch, block and warp rendezvous, shared-memory poisoning, CUDA runtime / cuBLAS
// shims (host memory, synchronous streams, graphs as recorded operation lists) and a host
// GEMM for the cuBLAS calls.
#include <cublas_v2.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "common.h"
#include "cuda/device.h"
#include "cuda/ops.h"
#include "emu.h"

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

namespace emu {
namespace {
// ---- fibers: a minimal x86-64 context switch (callee-saved registers + rsp) -------------
extern "C" void emu_switch(void** save_sp, void* new_sp);
asm(R"(
.text
.globl emu_switch
.type emu_switch,@function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size emu_switch, .-emu_switch
)");

#if defined(__SANITIZE_ADDRESS__)
extern "C" void __sanitizer_start_switch_fiber(void** fake_stack_save, const void* bottom,
                                               size_t size);
extern "C" void __sanitizer_finish_switch_fiber(void* fake_stack_save, const void** bottom_old,
                                                size_t* size_old);
extern "C" void __asan_unpoison_memory_region(void const volatile* addr, size_t size);
#endif

constexpr size_t kStack = 512 * 1024;
constexpr size_t kStaticSmemLimit = 48 * 1024;  // static __shared__ per block
constexpr size_t kSmemLimit = 227 * 1024;       // static + dynamic, sm_90 opt-in maximum
enum State { READY, WAIT_CTA, WAIT_WARP, DONE };
struct Fiber {
    void* sp = nullptr;
    char* stack = nullptr;
    State st = READY;
    unsigned tid = 0;
    long n_sync = 0, n_warp = 0;
};
struct Sched {
    std::vector<Fiber> f;
    void* main_sp = nullptr;
    const void* main_bottom = nullptr;
    size_t main_size = 0;
    int cur = -1;
    const std::function<void()>* body = nullptr;
    unsigned nt = 0, live = 0, wait_cta = 0;
    int reduce[2] = {0, 0};  // __syncthreads_* accumulators, by round parity
    std::vector<unsigned> warp_live, warp_wait;
    std::vector<uint64_t> wbuf[2];  // warp exchange slots, by round parity
    unsigned char* smem = nullptr;
    size_t dyn_smem = 0, static_smem = 0;
    std::vector<void*> shared_seen;  // __shared__ variables poisoned in this CTA
    std::string err;
};
Sched* g = nullptr;

void to_main() {
    Fiber& fb = g->f[g->cur];
#if defined(__SANITIZE_ADDRESS__)
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(fb.st == DONE ? nullptr : &fake, g->main_bottom, g->main_size);
    emu_switch(&fb.sp, g->main_sp);
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
    emu_switch(&fb.sp, g->main_sp);
#endif
}

extern "C" void emu_fiber_entry() {
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_finish_switch_fiber(nullptr, &g->main_bottom, &g->main_size);
#endif
    try {
        (*g->body)();
    } catch (const std::exception& e) {
        g->err = e.what();
    }
    Fiber& fb = g->f[g->cur];
    fb.st = DONE;
    --g->live;
    --g->warp_live[fb.tid / 32];
    if (g->wait_cta > 0) die("a thread exited while others wait in __syncthreads");
    if (g->warp_wait[fb.tid / 32] > 0) die("a lane exited while its warp waits in a warp op");
    to_main();
    std::abort();
}

void init_fiber(Fiber& fb) {
#if defined(__SANITIZE_ADDRESS__)
    __asan_unpoison_memory_region(fb.stack, kStack);
#endif
    auto* top = reinterpret_cast<uintptr_t*>((reinterpret_cast<uintptr_t>(fb.stack) + kStack) &
                                             ~uintptr_t(15));
    // After emu_switch pops 6 registers and returns into emu_fiber_entry, rsp must be
    // 8 mod 16 (as after a call).
    *--top = 0;  // fake return address of emu_fiber_entry (never used)
    *--top = reinterpret_cast<uintptr_t>(&emu_fiber_entry);
    for (int i = 0; i < 6; ++i) *--top = 0;
    fb.sp = top;
    fb.st = READY;
    fb.n_sync = fb.n_warp = 0;
}

void block_on(State s) {
    g->f[g->cur].st = s;
    to_main();
}

unsigned full_warp_mask(unsigned w) {
    const unsigned n = std::min(32u, g->nt - 32 * w);
    return n == 32 ? 0xffffffffu : (1u << n) - 1u;
}

// Dynamic shared memory opted into with cudaFuncSetAttribute, per kernel.
std::map<const void*, int>& smem_optin() {
    static std::map<const void*, int> m;
    return m;
}
}  // namespace

[[noreturn]] void die(const char* what) {
    std::fprintf(stderr, "EMU: %s (thread %u of CTA %u,%u,%u)\n", what, threadIdx.x, blockIdx.x,
                 blockIdx.y, blockIdx.z);
    std::abort();
}

unsigned char* dyn_smem() {
    return g->smem;
}

void shared_decl(void* p, size_t n) {
    if (!g) die("__shared__ variable outside a kernel");
    if (std::find(g->shared_seen.begin(), g->shared_seen.end(), p) != g->shared_seen.end()) return;
    g->shared_seen.push_back(p);
    std::memset(p, 0xFF, n);  // NaN floats / doubles, -1 integers
    g->static_smem += n;
    if (g->static_smem > kStaticSmemLimit) die("more than 48 KiB of static __shared__ memory");
    if (g->static_smem + g->dyn_smem > kSmemLimit) die("static + dynamic shared memory > 227 KiB");
}

void syncthreads() {
    Fiber& fb = g->f[g->cur];
    ++fb.n_sync;
    if (g->live != g->nt) die("__syncthreads after another thread exited");
    if (++g->wait_cta == g->live) {  // last to arrive: release everybody, continue
        // __syncthreads_* slot of the next round (= the previous round's, read by now).
        g->reduce[fb.n_sync & 1] = 0;
        for (Fiber& o : g->f)
            if (o.st == WAIT_CTA) o.st = READY;
        g->wait_cta = 0;
        return;
    }
    block_on(WAIT_CTA);
}

int syncthreads_reduce(int pred, int op) {
    // Round r accumulates into reduce[r & 1]; syncthreads' last arrival of round r clears
    // the other slot (round r - 1's, which every thread has read on resuming).
    const long round = g->f[g->cur].n_sync;
    int& acc = g->reduce[round & 1];
    if (op == 1)
        acc += pred == 0;  // count of false predicates
    else
        acc += pred != 0;
    syncthreads();
    const int v = g->reduce[round & 1];
    return op == 0 ? v : op == 1 ? v == 0 : v != 0;
}

const uint64_t* warp_exchange(uint64_t v, unsigned mask) {
    Fiber& fb = g->f[g->cur];
    const unsigned w = fb.tid / 32, lane = fb.tid % 32;
    const long round = fb.n_warp++;
    const unsigned full = full_warp_mask(w);
    if ((mask & full) != full) die("warp op with a partial mask (not emulated)");
    if (g->warp_live[w] != unsigned(__builtin_popcount(full)))
        die("warp op after a lane of the warp exited");
    uint64_t* b = g->wbuf[round & 1].data() + 32 * w;
    b[lane] = v;
    if (++g->warp_wait[w] == g->warp_live[w]) {
        for (unsigned l = 32 * w; l < std::min(g->nt, 32 * w + 32); ++l)
            if (g->f[l].st == WAIT_WARP) g->f[l].st = READY;
        g->warp_wait[w] = 0;
    } else {
        block_on(WAIT_WARP);
    }
    return b;
}

unsigned warp_lane_mask() {
    return full_warp_mask(g->f[g->cur].tid / 32);
}

long g_launches = 0;

namespace {
std::vector<std::function<void()>>* g_capture = nullptr;  // the graph being captured
bool g_capture_invalid = false;
}  // namespace
bool capturing() {
    return g_capture != nullptr;
}
void record(std::function<void()> op) {
    g_capture->push_back(std::move(op));
}

void run_grid(const void* kernel, const LaunchCfg& cfg, const std::function<void()>& body) {
    ++g_launches;
    if (g) throw std::runtime_error("emu: kernel launch from inside a kernel");
    const unsigned nt = cfg.block.x * cfg.block.y * cfg.block.z;
    if (cfg.block.y != 1 || cfg.block.z != 1 || nt == 0 || nt > 1024)
        throw std::runtime_error("emu: only 1-D blocks of 1..1024 threads");
    if (cfg.grid.y > 65535 || cfg.grid.z > 65535 || cfg.grid.x == 0 || cfg.grid.y == 0 ||
        cfg.grid.z == 0)
        throw std::runtime_error("emu: invalid grid dims " + std::to_string(cfg.grid.x) + "x" +
                                 std::to_string(cfg.grid.y) + "x" + std::to_string(cfg.grid.z));
    const auto opt = smem_optin().find(kernel);
    const size_t smem_max = opt != smem_optin().end() ? size_t(opt->second) : kStaticSmemLimit;
    if (cfg.smem > smem_max)
        throw std::runtime_error("emu: " + std::to_string(cfg.smem) +
                                 " bytes of dynamic shared memory without cudaFuncSetAttribute "
                                 "(cudaFuncAttributeMaxDynamicSharedMemorySize) for this kernel");
    static std::vector<char*> stacks;  // reused across launches
    while (stacks.size() < nt) stacks.push_back(new char[kStack]);
    Sched s;
    g = &s;
    s.body = &body;
    s.nt = nt;
    s.f.resize(nt);
    for (unsigned i = 0; i < nt; ++i) s.f[i].stack = stacks[i], s.f[i].tid = i;
    const unsigned nw = (nt + 31) / 32;
    s.warp_live.resize(nw);
    s.warp_wait.resize(nw);
    for (auto& b : s.wbuf) b.assign(32 * nw, 0);
    std::unique_ptr<unsigned char[]> smem(cfg.smem ? new unsigned char[cfg.smem] : nullptr);
    s.smem = smem.get();
    s.dyn_smem = cfg.smem;
    static const char* order_env = std::getenv("EMU_ORDER");  // fwd (default), rev, rand
    static const int order_mode = !order_env                         ? 0
                                  : std::string(order_env) == "rev"  ? 1
                                  : std::string(order_env) == "rand" ? 2
                                                                     : 0;
    static uint64_t rng = [] {
        const char* seed = std::getenv("EMU_SEED");
        return seed ? std::strtoull(seed, nullptr, 0) | 1 : 88172645463325252ull;
    }();
    std::vector<unsigned> order(nt);
    blockDim = cfg.block;
    gridDim = cfg.grid;
    const uint64_t n_ctas = uint64_t(cfg.grid.x) * cfg.grid.y * cfg.grid.z;
    for (uint64_t c = 0; c < n_ctas; ++c) {
        blockIdx = make_uint3(unsigned(c % cfg.grid.x), unsigned(c / cfg.grid.x % cfg.grid.y),
                              unsigned(c / cfg.grid.x / cfg.grid.y));
        if (s.smem) std::memset(s.smem, 0xFF, cfg.smem);  // NaN floats, -1 ints
        s.shared_seen.clear();
        s.static_smem = 0;
        for (Fiber& fb : s.f) init_fiber(fb);
        s.live = nt;
        s.wait_cta = 0;
        s.reduce[0] = s.reduce[1] = 0;
        for (unsigned w = 0; w < nw; ++w)
            s.warp_live[w] = std::min(32u, nt - 32 * w), s.warp_wait[w] = 0;
        for (unsigned i = 0; i < nt; ++i) order[i] = order_mode == 1 ? nt - 1 - i : i;
        while (s.live > 0) {
            if (order_mode == 2)
                for (unsigned i = nt - 1; i > 0; --i) {
                    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
                    std::swap(order[i], order[rng % (i + 1)]);
                }
            bool ran = false;
            for (unsigned i : order) {
                Fiber& fb = s.f[i];
                if (fb.st != READY) continue;
                ran = true;
                s.cur = int(i);
                threadIdx = make_uint3(fb.tid, 0, 0);
#if defined(__SANITIZE_ADDRESS__)
                void* fake = nullptr;
                __sanitizer_start_switch_fiber(&fake, fb.stack, kStack);
                emu_switch(&s.main_sp, fb.sp);
                __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
                emu_switch(&s.main_sp, fb.sp);
#endif
            }
            if (!ran && s.live > 0) {
                std::fprintf(stderr, "EMU: deadlock in CTA %u,%u,%u\n", blockIdx.x, blockIdx.y,
                             blockIdx.z);
                std::abort();
            }
        }
        for (unsigned i = 0; i < nt; ++i)
            if (s.f[i].n_sync != s.f[0].n_sync) {
                std::fprintf(stderr, "EMU: non-uniform __syncthreads count in CTA %u,%u,%u\n",
                             blockIdx.x, blockIdx.y, blockIdx.z);
                std::abort();
            }
        if (!s.err.empty()) {
            g = nullptr;
            throw std::runtime_error("emu: kernel threw: " + s.err);
        }
    }
    g = nullptr;
}
}  // namespace emu

// ---- CUDA runtime shims: device memory is host memory, everything is synchronous ----------
namespace {
cudaError_t g_last_error = cudaSuccess;
cudaError_t fail(cudaError_t e) {
    g_last_error = e;
    return e;
}
// Calls that CUDA refuses while a stream captures (cudaStreamCaptureModeThreadLocal /
// Global): they invalidate the capture.
bool unsafe_in_capture() {
    if (!emu::capturing()) return false;
    emu::g_capture_invalid = true;
    return true;
}
}  // namespace

extern "C" {
cudaError_t cudaMalloc(void** p, size_t n) {
    if (unsafe_in_capture()) return fail(cudaErrorStreamCaptureUnsupported);
    *p = std::malloc(n ? n : 1);
    return *p ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}
cudaError_t cudaFree(void* p) {
    if (unsafe_in_capture()) return fail(cudaErrorStreamCaptureUnsupported);
    std::free(p);
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind) {
    if (unsafe_in_capture()) return fail(cudaErrorStreamCaptureUnsupported);
    std::memmove(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind, cudaStream_t) {
    if (emu::capturing()) {
        emu::record([d, s, n] { std::memmove(d, s, n); });
        return cudaSuccess;
    }
    std::memmove(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaMemset(void* d, int v, size_t n) {
    if (unsafe_in_capture()) return fail(cudaErrorStreamCaptureUnsupported);
    std::memset(d, v, n);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* d, int v, size_t n, cudaStream_t) {
    if (emu::capturing()) {
        emu::record([d, v, n] { std::memset(d, v, n); });
        return cudaSuccess;
    }
    std::memset(d, v, n);
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
    if (unsafe_in_capture()) return fail(cudaErrorStreamCaptureUnsupported);
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {
    if (unsafe_in_capture()) return fail(cudaErrorStreamCaptureUnsupported);
    return cudaSuccess;
}
cudaError_t cudaGetLastError() {
    const cudaError_t e = g_last_error;
    g_last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError() {
    return g_last_error;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus* s) {
    *s = !emu::capturing()        ? cudaStreamCaptureStatusNone
         : emu::g_capture_invalid ? cudaStreamCaptureStatusInvalidated
                                  : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int* n) {
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
    *d = 0;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
    return d == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice);
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
    if (d != 0) return fail(cudaErrorInvalidDevice);
    *p = cudaDeviceProp{};
    std::snprintf(p->name, sizeof p->name, "kvrun host CUDA emulator");
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 132;
    p->totalGlobalMem = size_t(80) << 30;
    p->sharedMemPerBlockOptin = 227 * 1024;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int) {
    *v = a == cudaDevAttrMultiProcessorCount            ? 132
         : a == cudaDevAttrMaxSharedMemoryPerBlockOptin ? 227 * 1024
                                                        : 0;
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_b, size_t* total_b) {
    *free_b = size_t(64) << 30;
    *total_b = size_t(80) << 30;
    return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void* f, cudaFuncAttribute a, int v) {
    if (a == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (v < 0 || v > 227 * 1024) return fail(cudaErrorInvalidValue);
        emu::smem_optin()[f] = v;
    }
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) {
    *s = nullptr;
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
    *s = nullptr;
    return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** p, size_t n, unsigned) {
    *p = std::malloc(n ? n : 1);
    return *p ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}
cudaError_t cudaMallocHost(void** p, size_t n) {
    return cudaHostAlloc(p, n, 0);
}
cudaError_t cudaFreeHost(void* p) {
    std::free(p);
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t) {
    return cudaSuccess;
}
// CUDA graphs: capture records the stream's work (emu::record), a graph is the list of
// recorded operations, and instantiating copies it. One capture at a time.
}  // extern "C"
struct CUgraph_st {
    std::vector<std::function<void()>> ops;
};
struct CUgraphExec_st {
    std::vector<std::function<void()>> ops;
};
extern "C" {
cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) {
    if (emu::capturing()) return fail(cudaErrorIllegalState);
    emu::g_capture = new std::vector<std::function<void()>>;
    emu::g_capture_invalid = false;
    return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t* g) {
    *g = nullptr;
    if (!emu::capturing()) return fail(cudaErrorIllegalState);
    std::unique_ptr<std::vector<std::function<void()>>> ops(emu::g_capture);
    emu::g_capture = nullptr;
    if (emu::g_capture_invalid) return fail(cudaErrorStreamCaptureInvalidated);
    *g = new CUgraph_st{std::move(*ops)};
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* e, cudaGraph_t g, unsigned long long) {
    if (!g) return fail(cudaErrorInvalidValue);
    *e = new CUgraphExec_st{g->ops};
    return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t) {
    if (!e) return fail(cudaErrorInvalidValue);
    if (emu::capturing()) return fail(cudaErrorNotSupported);  // graph launch inside a capture
    for (const auto& op : e->ops) op();
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
    delete e;
    return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    delete g;
    return cudaSuccess;
}
const char* cudaGetErrorString(cudaError_t e) {
    return e == cudaErrorNotSupported ? "not supported by the host emulator" : "emulated error";
}
const char* cudaGetErrorName(cudaError_t) {
    return "cudaEmuError";
}

// ---- cuBLAS: a plain column-major GEMM on the host (f16 / f32 inputs converted to float,
// float accumulation in k order; not cuBLAS's rounding). The handle is a dummy. ------------
struct cublasContext {
    cudaStream_t stream = nullptr;
};
cublasStatus_t cublasCreate_v2(cublasHandle_t* h) {
    *h = new cublasContext;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t h, void*, size_t) {
    return h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}
const char* cublasGetStatusString(cublasStatus_t s) {
    return s == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS"
                                      : "cuBLAS error (host emulator: unsupported arguments)";
}
}  // extern "C"

namespace {
// C[m x n] = alpha * op(A)[m x k] * op(B)[k x n] + beta * C, column-major.
template <class LA, class LB>
cublasStatus_t host_gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                         float alpha, LA a, int lda, LB b, int ldb, float beta, float* c, int ldc) {
    const bool at = ta == CUBLAS_OP_T, bt = tb == CUBLAS_OP_T;
    if ((ta != CUBLAS_OP_N && !at) || (tb != CUBLAS_OP_N && !bt))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m < 0 || n < 0 || k < 0 || ldc < std::max(1, m) || lda < std::max(1, at ? k : m) ||
        ldb < std::max(1, bt ? n : k))
        return CUBLAS_STATUS_INVALID_VALUE;
    for (int j = 0; j < n; ++j)
        for (int i = 0; i < m; ++i) {
            float acc = 0.0f;
            for (int p = 0; p < k; ++p) {
                const float av = at ? a(p + size_t(i) * lda) : a(i + size_t(p) * lda);
                const float bv = bt ? b(j + size_t(p) * ldb) : b(p + size_t(j) * ldb);
                acc += av * bv;
            }
            float& out = c[i + size_t(j) * ldc];
            out = beta == 0.0f ? alpha * acc : alpha * acc + beta * out;  // beta 0: C unread
        }
    return CUBLAS_STATUS_SUCCESS;
}
auto loader(const void* p, cudaDataType t) {
    return [p, t](size_t i) -> float {
        return t == CUDA_R_16F ? __half2float(static_cast<const __half*>(p)[i])
                               : static_cast<const float*>(p)[i];
    };
}
// Runs the GEMM now, or records it (alpha / beta by value, as with CUBLAS_POINTER_MODE_HOST).
cublasStatus_t gemm_or_record(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                              float alpha, const void* a, cudaDataType at, int lda, const void* b,
                              cudaDataType bt, int ldb, float beta, float* c, int ldc) {
    auto run = [=] {
        return host_gemm(ta, tb, m, n, k, alpha, loader(a, at), lda, loader(b, bt), ldb, beta, c,
                         ldc);
    };
    if (!emu::capturing()) return run();
    emu::record([run] {
        if (run() != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("emu: replayed GEMM failed");
    });
    return CUBLAS_STATUS_SUCCESS;
}
}  // namespace

extern "C" {
cublasStatus_t cublasSgemm_v2(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                              int n, int k, const float* alpha, const float* a, int lda,
                              const float* b, int ldb, const float* beta, float* c, int ldc) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    return gemm_or_record(ta, tb, m, n, k, *alpha, a, CUDA_R_32F, lda, b, CUDA_R_32F, ldb, *beta, c,
                          ldc);
}
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void* alpha, const void* a, cudaDataType at,
                            int lda, const void* b, cudaDataType bt, int ldb, const void* beta,
                            void* c, cudaDataType ct, int ldc, cublasComputeType_t comp,
                            cublasGemmAlgo_t) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    // Only what kvrun uses: f16 or f32 inputs, f32 output, f32 compute (f32 alpha / beta).
    if ((at != CUDA_R_16F && at != CUDA_R_32F) || (bt != CUDA_R_16F && bt != CUDA_R_32F) ||
        ct != CUDA_R_32F || comp != CUBLAS_COMPUTE_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    return gemm_or_record(ta, tb, m, n, k, *static_cast<const float*>(alpha), a, at, lda, b, bt,
                          ldb, *static_cast<const float*>(beta), static_cast<float*>(c), ldc);
}
}
