// Random tensor data for synthetic models: fast, deterministic rows of any GGUF type whose
// block layout kvrun knows, with values of a chosen magnitude (roughly N(mean, sigma^2)).
//
// Two ways to make a quantized row:
//  - random blocks (default): quant codes are drawn directly from a discretized gaussian and
//    packed with per-block scales that vary in [0.5, 1.5]x (so a kernel that reads the wrong
//    block's scale is caught); no float data and no quantizer involved, about 1 ns/element.
//  - exact: float32 gaussian data quantized with quantize_row (types that have a quantizer).
// Both are a pure function of (type, n, sigma, mean, seed): the same seed gives the same bytes
// on any machine and thread count.
#pragma once

#include <cstdint>
#include <string_view>

#include "gguf.h"

namespace kvrun {

// splitmix64: a tiny, fast, statistically decent 64-bit generator (one per row).
class SplitMix64 {
  public:
    explicit SplitMix64(uint64_t seed) : state_(seed) {}
    uint64_t next() {
        uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }

  private:
    uint64_t state_;
};

// Mixes a string (tensor name) into a seed: FNV-1a followed by a splitmix64 step.
uint64_t synthetic_seed(uint64_t seed, std::string_view name, uint64_t index = 0);

// True when synthetic_fill_row can write `t` in random-block mode.
bool synthetic_type_supported(GgmlType t);

// dst: ggml_row_bytes(t, n) bytes <- n values of type t (n a multiple of the block size).
// Float types (F32/F16/BF16) get mean + sigma * gaussian; block types need mean == 0.
// exact: quantize float32 data with quantize_row instead of writing random blocks
// (throws Error for a type without a quantizer). Throws Error for an unsupported type.
void synthetic_fill_row(GgmlType t, void* dst, int64_t n, float sigma, float mean, uint64_t seed,
                        bool exact = false);

}  // namespace kvrun
