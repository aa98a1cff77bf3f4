// The decode GEMV's run-time switches (cuda_set_gemv_q8 / _q16 and _prefetch; ops.h): -1
// until first asked, then from KVRUN_GEMV (auto, q8, q16) and KVRUN_GEMV_PREFETCH (on).
// The split switch stays in gemv.cu, whose compile-time block shape bounds it.
#include <atomic>
#include <string>

#include "cuda/common.cuh"
#include "cuda/ops.h"

namespace kvrun {
namespace {

std::atomic<int> g_gemv_q8{-1};  // the activation path: 0 f32, 1 8-bit, 2 16-bit
std::atomic<int> g_gemv_prefetch{-1};

int gemv_x_mode() {
    int v = g_gemv_q8.load();
    if (v < 0) {
        const std::string e = cuda_env_choice("KVRUN_GEMV", {"auto", "q8", "q16"});
        v = e == "q8" ? 1 : e == "q16" ? 2 : 0;
        g_gemv_q8 = v;
    }
    return v;
}

}  // namespace

void cuda_set_gemv_q8(bool on) {
    g_gemv_q8 = on ? 1 : 0;
}

void cuda_set_gemv_q16(bool on) {
    g_gemv_q8 = on ? 2 : 0;
}

bool cuda_gemv_q8() {
    return gemv_x_mode() != 0;  // the integer kernel, with 8- or 16-bit x
}

bool cuda_gemv_q16() {
    return gemv_x_mode() == 2;
}

void cuda_set_gemv_prefetch(bool on) {
    g_gemv_prefetch = on ? 1 : 0;
}

bool cuda_gemv_prefetch() {
    int v = g_gemv_prefetch.load();
    if (v < 0) {
        v = cuda_env_switch("KVRUN_GEMV_PREFETCH", "on") ? 1 : 0;
        g_gemv_prefetch = v;
    }
    return v == 1;
}

}  // namespace kvrun
