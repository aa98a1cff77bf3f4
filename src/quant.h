// Block layouts of every GGUF tensor type, CPU dequantization to float32 (the reference
// for every GPU kernel) and quantization for the types kvrun writes itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "gguf.h"

namespace kvrun {

struct GgmlTypeTraits {
    const char* name = "?";
    int64_t block_elems = 0;  // elements per block (1 for F32/F16/BF16)
    size_t block_bytes = 0;   // bytes per block
    bool can_dequantize = false;
    bool can_quantize = false;
};

// True when `id` is a type id kvrun knows the layout of (even if it can't compute with it).
bool ggml_type_known(uint32_t id);
// Traits of a known type; throws Error for an unknown id.
const GgmlTypeTraits& ggml_type_traits(GgmlType t);
// Name of a type ("Q4_K"); "unknown" for an unknown id (never throws).
const char* ggml_type_name(GgmlType t);
// The type of a name ("q4_k", "Q4_K"; case-insensitive); nullopt when no type has it.
std::optional<GgmlType> ggml_type_from_name(std::string_view name);
// Bytes for `n` elements (n must be a multiple of block_elems; throws otherwise).
size_t ggml_row_bytes(GgmlType t, int64_t n);

// All functions below are thread-safe and allocation-free; they throw Error for an unknown
// type, a type without the needed codec, or n not a multiple of the block size.
// src: n elements of type t (n a multiple of the block size) -> dst[n] float32.
void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n);
// src[n] float32 -> dst (ggml_row_bytes(t, n) bytes). Throws for types without a quantizer.
void quantize_row(GgmlType t, const float* src, void* dst, int64_t n);
// The same, fitting each block to minimize the error weighted by importance[n] (an
// importance matrix's entries for the row's columns: mean squared activations); nullptr is
// quantize_row. Q4_0..Q5_1, the K-quants, IQ4, MXFP4, NVFP4, TQ1_0, TQ2_0 and Q1_0 use the
// weights; the other types ignore them.
void quantize_row_weighted(GgmlType t, const float* src, const float* importance, void* dst,
                           int64_t n);
// dot(row of type t with n elements, x[n]) in float32 accumulation; equal (to float
// rounding) to dequantize_row followed by a dot product, without the temporary row.
float vec_dot_row(GgmlType t, const void* row, const float* x, int64_t n);

// Half/bfloat16 scalar conversions (round-to-nearest-even).
uint16_t fp32_to_fp16(float f);
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_bf16(float f);
float bf16_to_fp32(uint16_t h);

}  // namespace kvrun
