// GGUF v3 writer: collects metadata (every value type, nested arrays) and tensors, then
// serializes them into a byte vector or a file that GgufFile reads back. Used by tests,
// the fuzzer's seed corpus and the synthetic-model tool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gguf.h"

namespace kvrun {

// Value constructors (also handy for nested arrays passed to GgufWriter::set_value).
GgufValue gguf_make_uint(GgufValueType t, uint64_t v);  // t: UINT8/16/32/64
GgufValue gguf_make_int(GgufValueType t, int64_t v);    // t: INT8/16/32/64
GgufValue gguf_make_float(GgufValueType t, double v);   // t: FLOAT32/FLOAT64
GgufValue gguf_make_bool(bool v);
GgufValue gguf_make_string(std::string v);
// Every element must have type `elem_type` (for ARRAY elements: any element type).
GgufValue gguf_make_array(GgufValueType elem_type, std::vector<GgufValue> items);

class GgufWriter {
  public:
    // `alignment`: data section and tensor offsets alignment (a power of two); when not 32
    // it is also written as the `general.alignment` uint32 key.
    explicit GgufWriter(uint32_t alignment = 32);

    // Setting an existing key replaces its value and keeps its position.
    void set_value(std::string_view key, GgufValue v);  // validates type/variant agreement
    void set_u8(std::string_view key, uint8_t v);
    void set_i8(std::string_view key, int8_t v);
    void set_u16(std::string_view key, uint16_t v);
    void set_i16(std::string_view key, int16_t v);
    void set_u32(std::string_view key, uint32_t v);
    void set_i32(std::string_view key, int32_t v);
    void set_u64(std::string_view key, uint64_t v);
    void set_i64(std::string_view key, int64_t v);
    void set_f32(std::string_view key, float v);
    void set_f64(std::string_view key, double v);
    void set_bool(std::string_view key, bool v);
    void set_string(std::string_view key, std::string v);
    void set_array_str(std::string_view key, const std::vector<std::string>& v);
    void set_array_f32(std::string_view key, const std::vector<float>& v);
    void set_array_i32(std::string_view key, const std::vector<int32_t>& v);
    void set_array_u32(std::string_view key, const std::vector<uint32_t>& v);
    void set_array_i64(std::string_view key, const std::vector<int64_t>& v);
    void set_array_u8(std::string_view key, const std::vector<uint8_t>& v);
    void set_array_bool(std::string_view key, const std::vector<bool>& v);

    // dims in ggml order (dims[0] = row length), 1..4 of them, each >= 1. `data` holds
    // `bytes` bytes, which must equal the tensor's size for its type. Copied.
    void add_tensor(std::string_view name, GgmlType type, const std::vector<int64_t>& dims,
                    const void* data, size_t bytes);

    // Streaming a large file: declare each tensor's name, type and shape without its bytes
    // (returns the byte count it must have), write header_bytes(), then each tensor's bytes
    // followed by padding_after(bytes) zero bytes, in declaration order. to_bytes() and
    // write_file() refuse a writer holding such declarations.
    size_t add_tensor_layout(std::string_view name, GgmlType type,
                             const std::vector<int64_t>& dims);
    std::vector<uint8_t> header_bytes() const;  // everything before the first tensor's data
    size_t padding_after(size_t bytes) const;   // zeros that align the next tensor

    size_t n_tensors() const { return tensors_.size(); }
    size_t n_metadata() const { return kv_.size(); }

    std::vector<uint8_t> to_bytes() const;
    // Writes to_bytes() to `path` (throws Error on any I/O failure).
    void write_file(const std::string& path) const;

  private:
    struct Tensor {
        std::string name;
        GgmlType type;
        std::vector<int64_t> dims;
        size_t bytes = 0;
        std::vector<uint8_t> data;
        bool layout_only = false;  // add_tensor_layout: the caller streams the bytes
    };
    // Validates a tensor declaration; returns its size in bytes.
    size_t check_tensor(std::string_view name, GgmlType type,
                        const std::vector<int64_t>& dims) const;
    uint32_t alignment_;
    std::vector<std::pair<std::string, GgufValue>> kv_;
    std::vector<Tensor> tensors_;
};

}  // namespace kvrun
