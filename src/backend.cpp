// Backend interface plumbing and KV pool sizing shared by the CPU and CUDA backends.
#include "backend.h"

#include "common.h"
#include "kv_format.h"

namespace kvrun {

Backend::~Backend() = default;

int64_t kv_layer_block_bytes(KvType t, int64_t n_kv_head, int64_t block_size, int64_t head_dim) {
    const int64_t elems = n_kv_head * block_size * head_dim;
    switch (t) {
        case KvType::F32:
            return elems * 4;
        case KvType::F16:
            return elems * 2;
        case KvType::Q8:
        case KvType::Q4:
            // Hook: quantized KV blocks (values + per-channel / per-token scales) go here.
            break;
    }
    throw Error(fmt::format("KV cache type {} is not implemented yet", kv_type_name(t)),
                "use --kv-type f16 (the default) or f32");
}

int64_t kv_block_bytes(const ModelConfig& c, const BackendOptions& o) {
    if (o.kv_block_size <= 0 || o.kv_block_size > 4096)
        fail("KV block size {} is out of range (1..4096)", o.kv_block_size);
    int64_t k = kv_layer_block_bytes(o.kv_type_k, c.n_kv_head, o.kv_block_size, c.head_dim);
    int64_t v = kv_layer_block_bytes(o.kv_type_v, c.n_kv_head, o.kv_block_size, c.head_dim);
    return c.n_layer * (k + v);
}

double kv_bytes_per_token(const ModelConfig& c, KvType k, KvType v) {
    return double(c.n_layer) * double(c.n_kv_head) * double(c.head_dim) *
           (kv_bytes_per_element(k, c.head_dim) + kv_bytes_per_element(v, c.head_dim));
}

int64_t kv_blocks_for(const ModelConfig& c, const BackendOptions& o) {
    int64_t per_block = kv_block_bytes(c, o);
    int64_t n = o.n_kv_blocks;
    if (n <= 0) {
        if (o.kv_memory_mib <= 0)
            fail("KV memory budget must be positive (got {} MiB)", o.kv_memory_mib);
        n = (o.kv_memory_mib << 20) / per_block;
        if (n < 1)
            throw Error(fmt::format("a KV budget of {} MiB holds no block of {} tokens ({} bytes "
                                    "per block)",
                                    o.kv_memory_mib, o.kv_block_size, per_block),
                        "raise --kv-memory or lower --kv-block-size");
    }
    if (n > (int64_t(1) << 31) - 1) fail("KV pool of {} blocks is too large", n);
    return n;
}

}  // namespace kvrun
