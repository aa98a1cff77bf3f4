// GGUF v2/v3 reader: mmaps a file (or wraps a byte buffer) and exposes its metadata and
// tensor table. The file is treated as hostile: every read is bounds-checked and every
// failure throws GgufError naming the file, what was wrong and where (key/tensor, offset).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common.h"

namespace kvrun {

// A GGUF file's first four bytes, "GGUF", read as a little-endian u32.
inline constexpr uint32_t kGgufMagic = 0x46554747;

// Tensor element types as numbered in the GGUF/ggml format.
enum class GgmlType : uint32_t {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    IQ2_XXS = 16,
    IQ2_XS = 17,
    IQ3_XXS = 18,
    IQ1_S = 19,
    IQ4_NL = 20,
    IQ3_S = 21,
    IQ2_S = 22,
    IQ4_XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1_M = 29,
    BF16 = 30,
    TQ1_0 = 34,
    TQ2_0 = 35,
    MXFP4 = 39,
    NVFP4 = 40,
    Q1_0 = 41,
};

enum class GgufValueType : uint32_t {
    UINT8 = 0,
    INT8 = 1,
    UINT16 = 2,
    INT16 = 3,
    UINT32 = 4,
    INT32 = 5,
    FLOAT32 = 6,
    BOOL = 7,
    STRING = 8,
    ARRAY = 9,
    UINT64 = 10,
    INT64 = 11,
    FLOAT64 = 12,
};

const char* gguf_value_type_name(GgufValueType t);

// Thrown for every malformed-file condition (a kvrun::Error, so main prints it in one line).
// what() reads "<file>: <problem> (<where>, at byte offset <N>)", leaving out the parts that
// are unknown; `where` names the key, tensor or section ("key 'x'", "tensor 'y'", "header")
// and the offset is where the offending field starts in the file.
class GgufError : public Error {
  public:
    GgufError(std::string file, std::string problem, std::string where = {},
              std::optional<uint64_t> offset = std::nullopt);
    const std::string& file() const { return file_; }  // empty for a lone GgufValue
    const std::string& problem() const { return problem_; }
    const std::string& where() const { return where_; }  // empty when not applicable
    std::optional<uint64_t> offset() const { return offset_; }

  private:
    std::string file_, problem_, where_;
    std::optional<uint64_t> offset_;
};

// One metadata value. Arrays hold their elements (possibly nested arrays) as GgufValues.
struct GgufValue {
    GgufValueType type = GgufValueType::UINT8;
    std::variant<uint64_t, int64_t, double, bool, std::string, std::vector<GgufValue>> data;
    GgufValueType array_type = GgufValueType::UINT8;  // element type when type == ARRAY

    bool is_int() const;      // any integer type
    bool is_float() const;    // FLOAT32 / FLOAT64
    int64_t as_int() const;   // integer (or bool) value; throws if not integral
    double as_float() const;  // float or integer value
    bool as_bool() const;
    const std::string& as_string() const;
    const std::vector<GgufValue>& as_array() const;
    std::string to_display(size_t max_items = 8) const;  // short human-readable rendering
};

struct GgufTensorInfo {
    std::string name;
    std::vector<int64_t> dims;  // ggml order: dims[0] is the contiguous (row) length
    GgmlType type = GgmlType::F32;
    uint64_t offset = 0;  // relative to the data section
    int64_t n_elements = 0;
    uint64_t n_bytes = 0;
    const uint8_t* data = nullptr;  // points into the mapping (valid while GgufFile lives)
    int32_t split = 0;              // which file of a split model holds it (0: the first)
};

// How GgufFile::open holds the file's bytes (llama.cpp's --no-mmap and --mlock).
struct GgufOpenOptions {
    bool mmap = true;    // map the file; false: read it into memory (page-aligned)
    bool mlock = false;  // lock the bytes in RAM (GgufFile::lock_error() says if that failed)
};

class GgufFile {
  public:
    // Map (or read) and parse `path`. Throws GgufError (or Error for a missing/unreadable
    // file). A failed mlock is not an error: lock_error() then says why.
    // A split model (llama.cpp's gguf-split: split.count > 1) is opened by its first file,
    // PREFIX-00001-of-0000N.gguf: the other N - 1 files are mapped too and their tensors
    // join this one's (the metadata is the first file's).
    static GgufFile open(const std::string& path, GgufOpenOptions options = {});
    // Parse an in-memory buffer (tests, fuzzing). The bytes are copied and owned.
    static GgufFile from_memory(const void* bytes, size_t size, std::string name = "<memory>");

    GgufFile(GgufFile&&) noexcept;
    GgufFile& operator=(GgufFile&&) noexcept;
    ~GgufFile();

    const std::string& path() const { return path_; }
    uint32_t version() const { return version_; }
    uint64_t alignment() const { return alignment_; }
    uint64_t data_offset() const { return data_offset_; }
    uint64_t file_size() const { return size_; }  // the first file's, for a split model
    int n_splits() const { return 1 + static_cast<int>(shards_.size()); }
    // File k of a split model (0: path()).
    const std::string& split_path(int k) const {
        return k == 0 ? path_ : shards_.at(size_t(k - 1))->path();
    }
    bool mapped() const { return map_ != nullptr; }
    bool locked() const { return locked_; }
    // Why GgufOpenOptions::mlock failed ("" when it was not asked for or succeeded).
    const std::string& lock_error() const { return lock_error_; }

    // Metadata in file order.
    const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
    const GgufValue* find(std::string_view key) const;  // nullptr when absent
    bool has(std::string_view key) const { return find(key) != nullptr; }
    // Typed getters: throw GgufError naming the key when absent or of the wrong type.
    int64_t get_int(std::string_view key) const;
    double get_float(std::string_view key) const;
    bool get_bool(std::string_view key) const;
    const std::string& get_string(std::string_view key) const;
    const std::vector<GgufValue>& get_array(std::string_view key) const;
    // Defaulting getters (still throw on a present key of the wrong type).
    int64_t get_int_or(std::string_view key, int64_t def) const;
    double get_float_or(std::string_view key, double def) const;
    bool get_bool_or(std::string_view key, bool def) const;
    std::string get_string_or(std::string_view key, std::string def) const;

    const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
    const GgufTensorInfo* find_tensor(std::string_view name) const;  // nullptr when absent

    // Replaces a metadata value, or adds the key (llama.cpp's --override-kv): every later
    // read sees the new value. The file on disk is not touched.
    void override_value(const std::string& key, GgufValue value);

    // Throw GgufError about a key / tensor of this file: names the file, the key or tensor
    // and (when present in the file) the byte offset of its entry. For callers that find a
    // value unusable (e.g. a token array of the wrong length).
    [[noreturn]] void fail_key(std::string_view key, std::string problem) const;
    [[noreturn]] void fail_tensor(std::string_view name, std::string problem) const;

  private:
    GgufFile() = default;
    void parse();
    static GgufFile open_one(const std::string& path, GgufOpenOptions options);
    // Opens the other files of a split model and takes their tensors.
    void open_shards(GgufOpenOptions options);

    std::string path_;
    uint32_t version_ = 0;
    uint64_t alignment_ = 32;
    uint64_t data_offset_ = 0;
    const uint8_t* base_ = nullptr;
    uint64_t size_ = 0;
    void* map_ = nullptr;         // mmap base when mapped
    std::vector<uint8_t> owned_;  // buffer when from_memory
    void* read_ = nullptr;        // page-aligned buffer when read (--no-mmap)
    bool locked_ = false;         // mlock'ed (base_, size_)
    std::string lock_error_;
    std::vector<std::pair<std::string, GgufValue>> kv_;
    std::vector<uint64_t> kv_offsets_;  // [kv_.size()] where each entry starts (for errors)
    std::map<std::string, size_t, std::less<>> kv_index_;
    std::vector<GgufTensorInfo> tensors_;
    std::vector<uint64_t> tensor_info_offsets_;  // [tensors_.size()] where each info starts
    std::map<std::string, size_t, std::less<>> tensor_index_;
    std::vector<std::unique_ptr<GgufFile>> shards_;  // a split model's other files
};

}  // namespace kvrun
