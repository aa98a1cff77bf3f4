// `kvrun quantize`: convert a GGUF model's weights to another type, as llama-quantize does.
// A file type (Q4_K_M, Q8_0, ...) names a default tensor type plus llama.cpp's mix rules:
// which tensors get more bits (output, attn_v, ffn_down of some layers), and which fall back
// to another type when their rows are not a whole number of the type's blocks. The same
// rules give the same tensor types as llama-quantize; the legacy types (Q4_0 ... Q8_0) and
// F16/BF16 give the same bytes, the K-quants and IQ4 kvrun's own (equal or lower error).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gguf.h"
#include "imatrix.h"
#include "thread_pool.h"

namespace kvrun {

// One of llama.cpp's model file types (llama_ftype; general.file_type in the GGUF).
struct QuantFileType {
    std::string_view name;          // "Q4_K_M"
    uint32_t id = 0;                // general.file_type
    GgmlType base = GgmlType::F32;  // the tensors' default type
    std::string_view description;   // one line for the help text
    std::string_view unsupported;   // why kvrun cannot write it ("" when it can)
    bool needs_imatrix = false;     // llama.cpp refuses it without an importance matrix
};

// Every file type llama-quantize names, the ones kvrun cannot write included (with why).
std::span<const QuantFileType> quant_file_types();
// By name (case-insensitive; Q3_K, Q4_K and Q5_K mean their _M mixes, as in llama-quantize)
// or by general.file_type number; nullptr when unknown.
const QuantFileType* find_quant_file_type(std::string_view name_or_id);
// By general.file_type number; nullptr when unknown.
const QuantFileType* quant_file_type_by_id(uint32_t id);

// llama.cpp's "use more bits" layers of the _M mixes: the first and last eighth of the
// layers and every third one between.
bool quant_use_more_bits(int64_t layer, int64_t n_layer);

struct QuantizeOptions {
    const QuantFileType* type = nullptr;  // nullptr: COPY (every tensor keeps its type)
    bool pure = false;                    // every quantized tensor gets the base type
    bool allow_requantize = false;        // quantized inputs may be converted (lossy twice)
    bool leave_output = false;            // output.weight keeps its type
    // A split input is written as as many files, each with the same tensors as the input's
    // (llama-quantize's --keep-split); otherwise one file.
    bool keep_split = false;
    // Otherwise llama-gguf-split's --split: a new output file when the current one holds
    // split_max_tensors tensors, or when the next tensor would take its tensor data past
    // split_max_bytes (0: no such limit); split_no_tensor_first leaves the first file only
    // the metadata. One resulting file is written as a plain, unsplit model.
    int64_t split_max_tensors = 0;
    uint64_t split_max_bytes = 0;
    bool split_no_tensor_first = false;
    std::optional<GgmlType> output_type;  // output.weight's type
    std::optional<GgmlType> token_embd_type;
    // --tensor-type REGEX=TYPE: a tensor whose name the regex finds gets TYPE (the last
    // match wins; not for tensors whose width needs a fallback type).
    std::vector<std::pair<std::string, GgmlType>> tensor_types;
    std::vector<std::pair<std::string, GgufValue>> metadata;  // --override-kv values
    int threads = 0;                                          // 0: all cores
    // --imatrix: each tensor's rows are fitted to minimize the error weighted by its
    // columns' mean squared activations; the mixes take llama.cpp's imatrix variants.
    const Imatrix* imatrix = nullptr;
    std::string imatrix_file;  // recorded in the output's quantize.imatrix.* metadata
    // Changes to the weights themselves (export-lora merges adapters into them): by tensor
    // name, `apply` edits the tensor's float32 values [rows][width] in place, and the tensor
    // is written as `to` (a quantized input is then converted without --allow-requantize).
    struct TensorEdit {
        GgmlType to = GgmlType::F16;
        std::function<void(float* values, ThreadPool& pool)> apply;
    };
    std::map<std::string, TensorEdit> edits;
};

// What happens to one tensor.
struct TensorQuantChoice {
    const GgufTensorInfo* tensor = nullptr;
    GgmlType to = GgmlType::F32;
    bool fallback = false;  // the mix's type does not fit the row width: llama.cpp's fallback
    bool weighted = false;  // converted with the importance matrix's entry
    bool edited = false;    // QuantizeOptions::edits changes its values
    bool convert() const { return edited || tensor->type != to; }
};

// Each tensor's target type, in the order llama-quantize writes them (the tensors outside
// the blocks by name, then the blocks in layer order, each by name). Throws Error for an
// unsupported type, a row width no type fits, or a quantized input without
// allow_requantize.
std::vector<TensorQuantChoice> plan_quantization(const GgufFile& in, const QuantizeOptions& o);

struct QuantizeResult {
    uint64_t bytes_in = 0, bytes_out = 0;  // tensor data
    int n_converted = 0, n_fallback = 0, n_weighted = 0;
};

// Writes the quantized model to `out_path` (through `out_path`.part, renamed when complete;
// removed on any failure); with keep_split and a split input, to PREFIX-0000i-of-0000N.gguf
// (PREFIX: out_path less .gguf). on_tensor(i, choice) runs before tensor i is converted; `cancel`
// (Ctrl-C) stops it with Error("interrupted").
// The float32 values of a tensor: the tensor's own bytes when it is aligned F32, else its
// rows dequantized in parallel into `buf`.
const float* tensor_as_f32(const GgufTensorInfo& t, std::vector<float>& buf, ThreadPool& pool);

// Which output file each entry of `plan` goes to (see QuantizeOptions' split fields), and how
// many files there are.
std::vector<int> plan_split(const GgufFile& in, const std::vector<TensorQuantChoice>& plan,
                            const QuantizeOptions& o, int& n_files);

// The output files' paths: out_path itself for one file, else PREFIX-0000i-of-0000N.gguf
// with out_path less .gguf as PREFIX.
std::vector<std::string> split_paths(const std::string& out_path, int n_files);

QuantizeResult quantize_model(
    const GgufFile& in, const std::string& out_path, const QuantizeOptions& o,
    const std::function<void(size_t, const TensorQuantChoice&)>& on_tensor = {},
    const std::atomic<bool>* cancel = nullptr);

}  // namespace kvrun
