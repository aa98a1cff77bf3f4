// KV cache storage formats: names, parsing and the bytes each format costs per element.
// (The quantized layouts themselves are described in docs/kv-cache.md.)
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "cpu_ops.h"

namespace kvrun {

const char* kv_type_name(KvType t);
// Parses "f32", "f16", "q8", "q4" (also "q8_0"/"q4_0" spellings); throws Error otherwise.
KvType kv_type_parse(std::string_view s);
// Average bytes per stored element of one K or V row of head_dim elements, scales included,
// for blocks of `block_size` tokens.
double kv_bytes_per_element(KvType t, int64_t head_dim, int64_t block_size = 16);

}  // namespace kvrun
