// cublas_lib(): see cublas_lib.h.
#include "cuda/cublas_lib.h"

#include <atomic>
#include <string>

#include "common.h"

#ifndef KVRUN_CUBLAS_LINKED
#include <dlfcn.h>
#endif

namespace kvrun {

namespace {

std::atomic<bool> g_loaded{false};

#ifdef KVRUN_CUBLAS_LINKED

CublasLib load() {
    CublasLib lib{};
    lib.create = &cublasCreate_v2;
    lib.destroy = &cublasDestroy_v2;
    lib.set_stream = &cublasSetStream_v2;
    lib.set_workspace = &cublasSetWorkspace_v2;
    lib.status_string = &cublasGetStatusString;
    lib.sgemm = &cublasSgemm_v2;
    lib.gemm_ex = static_cast<decltype(lib.gemm_ex)>(&cublasGemmEx);
    return lib;
}

#else

template <typename Fn>
void resolve(void* handle, const std::string& path, const char* name, Fn& fn) {
    void* sym = dlsym(handle, name);
    if (!sym)
        throw Error(fmt::format("cuBLAS library {} has no {} (a different cuBLAS major "
                                "version than kvrun was built with?)",
                                path, name),
                    "install the cuBLAS of the CUDA toolkit kvrun was built with, or use "
                    "--device cpu");
    fn = reinterpret_cast<Fn>(sym);
}

CublasLib load() {
    const std::string soname = fmt::format("libcublas.so.{}", CUBLAS_VER_MAJOR);
    // RTLD_LOCAL: cuBLAS's symbols serve only this handle; nothing else links against them.
    void* handle = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
    std::string path = soname;
    std::string why = handle ? "" : std::string(dlerror());
#ifdef KVRUN_CUDA_LIBRARY_DIR
    if (!handle) {
        path = std::string(KVRUN_CUDA_LIBRARY_DIR) + "/" + soname;
        handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!handle) why += fmt::format("; {}", dlerror());
    }
#endif
    if (!handle)
        throw Error(fmt::format("cannot load cuBLAS ({}): {}", soname, why),
                    "install the CUDA toolkit's cuBLAS (or add its directory to "
                    "LD_LIBRARY_PATH), or use --device cpu");
    CublasLib lib{};
    resolve(handle, path, "cublasCreate_v2", lib.create);
    resolve(handle, path, "cublasDestroy_v2", lib.destroy);
    resolve(handle, path, "cublasSetStream_v2", lib.set_stream);
    resolve(handle, path, "cublasSetWorkspace_v2", lib.set_workspace);
    resolve(handle, path, "cublasGetStatusString", lib.status_string);
    resolve(handle, path, "cublasSgemm_v2", lib.sgemm);
    resolve(handle, path, "cublasGemmEx", lib.gemm_ex);
    return lib;  // the library stays open for the life of the process
}

#endif

}  // namespace

const CublasLib& cublas_lib() {
    static const CublasLib lib = [] {
        CublasLib l = load();
        g_loaded = true;
        return l;
    }();
    return lib;
}

bool cublas_lib_loaded() {
    return g_loaded;
}

}  // namespace kvrun
