// KV cache storage format names and their per-element cost.
#include "kv_format.h"

#include "common.h"

namespace kvrun {

const char* kv_type_name(KvType t) {
    switch (t) {
        case KvType::F32: return "f32";
        case KvType::F16: return "f16";
        case KvType::Q8: return "q8";
        case KvType::Q4: return "q4";
    }
    return "?";
}

KvType kv_type_parse(std::string_view s) {
    if (s == "f32") return KvType::F32;
    if (s == "f16") return KvType::F16;
    if (s == "q8" || s == "q8_0" || s == "int8") return KvType::Q8;
    if (s == "q4" || s == "q4_0" || s == "int4") return KvType::Q4;
    fail("unknown KV cache type '{}' (expected f32, f16, q8 or q4)", s);
}

double kv_bytes_per_element(KvType t, int64_t head_dim, int64_t block_size) {
    // Quantized formats: 8 or 4 bits per element plus one f16 scale per group of 32
    // (placeholder until the quantized layouts land; see docs/kv-cache.md).
    switch (t) {
        case KvType::F32: return 4.0;
        case KvType::F16: return 2.0;
        case KvType::Q8: return 1.0 + 2.0 / 32.0;
        case KvType::Q4: return 0.5 + 2.0 / 32.0;
    }
    return 0;
}

}  // namespace kvrun
