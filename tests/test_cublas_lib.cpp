// cuBLAS is opened on first use, not linked (src/cuda/cublas_lib.h): a CUDA build's process
// does not map libcublas until the backend asks for it, and then finds every entry point.
// Needs no GPU (opening the library and reading a status string touch no device), so it runs
// in CI's CUDA build; a CPU-only build has nothing to check.
#include <doctest/doctest.h>

#include <fstream>
#include <string>

#ifdef KVRUN_HAS_CUDA
#include "cuda/cublas_lib.h"
#endif

namespace {

// Whether a shared object whose path contains `name` is mapped into this process.
bool mapped(const std::string& name) {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line))
        if (line.find(name) != std::string::npos) return true;
    return false;
}

}  // namespace

#ifdef KVRUN_HAS_CUDA

TEST_CASE("cuBLAS is opened on first use, with every entry point the backend calls") {
    // Nothing before this case uses the CUDA backend, so nothing has opened cuBLAS yet.
    REQUIRE_FALSE(kvrun::cublas_lib_loaded());
    CHECK_FALSE(mapped("libcublas"));

    const kvrun::CublasLib& lib = kvrun::cublas_lib();
    CHECK(kvrun::cublas_lib_loaded());
    CHECK(mapped("libcublas.so"));
    CHECK(mapped("libcublasLt.so"));  // cuBLAS's own dependency comes with it
    CHECK(bool(lib.create));
    CHECK(bool(lib.destroy));
    CHECK(bool(lib.set_stream));
    CHECK(bool(lib.set_workspace));
    CHECK(bool(lib.sgemm));
    CHECK(bool(lib.gemm_ex));
    REQUIRE(bool(lib.status_string));
    // The library answers: two statuses, two non-empty texts ("success", "the library was
    // not initialized" in cuBLAS 13).
    const std::string ok = lib.status_string(CUBLAS_STATUS_SUCCESS);
    const std::string uninit = lib.status_string(CUBLAS_STATUS_NOT_INITIALIZED);
    CHECK_FALSE(ok.empty());
    CHECK_FALSE(uninit.empty());
    CHECK(ok != uninit);
    // Opened once: a second call returns the same table.
    CHECK(&kvrun::cublas_lib() == &lib);
}

#else

TEST_CASE("CPU-only build: no cuBLAS to open") { CHECK_FALSE(mapped("libcublas")); }

#endif
