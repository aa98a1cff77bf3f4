// KV cache storage formats: names, byte sizes and the CPU reference codec of one KV head's
// rows of one block (a "head block", block_size rows of head_dim values). The layouts are
// described, with the reasons behind them, in docs/kv-cache.md:
//   f32 / f16: [block_size][head_dim] values.
//   K q8 / q4: per channel (KIVI): [head_dim] f16 scales over the block's rows, then
//              [block_size][head_dim] int8 (q8) or [block_size][head_dim / 2] packed nibbles
//              (q4, channel 2i in the low nibble, 2i + 1 in the high one, stored q + 8).
//   V q8 / q4: per token, groups of kv_v_group(head_dim) channels: [block_size][n_groups]
//              f16 scales, then the values as for K.
// Quantized head blocks are padded to 16 bytes so every head block starts 16-byte aligned.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "cpu_ops.h"

namespace kvrun {

enum class KvRole : uint8_t { K, V };

const char* kv_type_name(KvType t);
// Parses "f32", "f16", "q8", "q4" (also "q8_0"/"q4_0"/"int8"/"int4"); throws Error otherwise.
KvType kv_type_parse(std::string_view s);
inline bool kv_type_quantized(KvType t) {
    return t == KvType::Q8 || t == KvType::Q4;
}

// Channels that share one scale in a quantized V row: 32, or the whole head when head_dim is
// not a multiple of 32.
int64_t kv_v_group(int64_t head_dim);
// Throws Error when format t cannot store heads of head_dim (q4 needs an even head_dim).
void kv_check_format(KvType t, int64_t head_dim);
// Bytes of one head block (block_size rows of head_dim values) in format t for K or V.
int64_t kv_head_block_bytes(KvType t, KvRole role, int64_t block_size, int64_t head_dim);

// The numbers a kernel needs to address a head block (the CUDA twin uses these).
struct KvHeadLayout {
    int64_t bytes = 0;        // whole head block, padding included
    int64_t scale_bytes = 0;  // f16 scales in front of the values (quantized only)
    int64_t row_bytes = 0;    // one row's values
    int64_t group = 0;        // V: channels per scale (quantized only)
};
KvHeadLayout kv_head_layout(KvType t, KvRole role, int64_t block_size, int64_t head_dim);
// Average bytes per stored element of K or V, scales and padding included.
double kv_bytes_per_element(KvType t, KvRole role, int64_t head_dim, int64_t block_size);

// Encodes src: [block_size][head_dim] into one head block `dst` of format t. Quantized K uses
// one scale per channel over all block_size rows; quantized V one scale per row and group.
void kv_encode_head_block(KvType t, KvRole role, const float* src, int64_t block_size,
                          int64_t head_dim, uint8_t* dst);
// Decodes rows [row0, row0 + n_rows) of head block `blk` (format t) into
// out: [n_rows][head_dim] (each value scale * code, the scales decoded once per call).
void kv_decode_head_rows(KvType t, KvRole role, const uint8_t* blk, int64_t block_size,
                         int64_t head_dim, int64_t row0, int64_t n_rows, float* out);
// Decodes row `row` of head block `blk` (format t) into out: [head_dim].
void kv_decode_head_row(KvType t, KvRole role, const uint8_t* blk, int64_t block_size,
                        int64_t head_dim, int64_t row, float* out);

// In-place normalized fast Walsh-Hadamard transform of each row of x: [n_rows][n]; n must be
// a power of two. Orthogonal and its own inverse, so rotating both q and k keeps q.k.
void hadamard_rows(float* x, int64_t n_rows, int64_t n);
inline bool is_power_of_two(int64_t n) {
    return n > 0 && (n & (n - 1)) == 0;
}

}  // namespace kvrun
