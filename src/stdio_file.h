// C stdio files owned by a unique_ptr, and the write that throws on a short count: shared by
// the files that write binary formats (perplexity's KLD base, the prompt cache, quantize).
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "common.h"

namespace kvrun {

struct FileCloser {
    void operator()(FILE* f) const {
        if (f) std::fclose(f);
    }
};
using FilePtr = std::unique_ptr<FILE, FileCloser>;

// Writes the n bytes at p to f, or throws "PATH: write failed: REASON" (a full disk, say).
inline void write_all(FILE* f, const void* p, size_t n, const std::string& path) {
    if (n && std::fwrite(p, 1, n, f) != n) fail("{}: write failed: {}", path, std::strerror(errno));
}

}  // namespace kvrun
