// libFuzzer target for the GGUF reader: parses arbitrary bytes with GgufFile::from_memory and
// touches every metadata value and every tensor byte so ASan sees any bad pointer. It also
// traps when an accepted file has overlapping tensor data or a rejection lacks the file, the
// key/tensor/section or the byte offset. Run with KVRUN_FUZZ_WRITE_SEEDS=<dir> to write a
// small seed corpus (made with GgufWriter) and exit. Accepted files also go through
// model_config_from_gguf (hyperparameters, RoPE scaling keys, rope_freqs.weight), which may
// only refuse them with an Error.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "fuzz_seeds.h"
#include "gguf.h"
#include "gguf_writer.h"
#include "model_config.h"
#include "quant.h"

namespace {

using kvrun::GgmlType;
using kvrun::GgufValue;
using kvrun::GgufValueType;
using kvrun::GgufWriter;

volatile uint64_t g_sink = 0;  // keeps the reads below from being optimized away

void touch_value(const GgufValue& v) {
    switch (v.type) {
        case GgufValueType::STRING:
            g_sink = g_sink + v.as_string().size();
            break;
        case GgufValueType::ARRAY:
            for (const GgufValue& item : v.as_array()) touch_value(item);
            break;
        case GgufValueType::BOOL:
            g_sink = g_sink + v.as_bool();
            break;
        default: {
            double d = v.as_float();  // any number converts; add its bits, not its value
            uint64_t bits;
            std::memcpy(&bits, &d, sizeof bits);
            g_sink = g_sink + bits;
            break;
        }
    }
}

void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
    FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) {
        std::perror(path.c_str());
        std::exit(1);
    }
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
}

std::vector<uint8_t> zeros(size_t n) {
    return std::vector<uint8_t>(n, 0);
}

// Writes a handful of small valid files covering every value type and several tensor types.
void write_seeds(const std::string& dir) {
    GgufWriter empty;
    write_file(dir + "/seed_empty.gguf", empty.to_bytes());

    GgufWriter meta;
    meta.set_string("general.architecture", "llama");
    meta.set_u8("u8", 200);
    meta.set_i8("i8", -5);
    meta.set_u16("u16", 60000);
    meta.set_i16("i16", -300);
    meta.set_u32("llama.block_count", 2);
    meta.set_i32("i32", -70000);
    meta.set_u64("u64", 1ull << 40);
    meta.set_i64("i64", -(1ll << 40));
    meta.set_f32("f32", 1.5f);
    meta.set_f64("f64", -2.25);
    meta.set_bool("bool", true);
    meta.set_array_str("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a", "b"});
    meta.set_array_f32("tokenizer.ggml.scores", {0.f, -1.f, -2.f, -3.f, -4.f});
    meta.set_array_i32("tokenizer.ggml.token_type", {2, 3, 3, 1, 1});
    std::vector<GgufValue> inner = {
        kvrun::gguf_make_array(GgufValueType::UINT16,
                               {kvrun::gguf_make_uint(GgufValueType::UINT16, 7)}),
        kvrun::gguf_make_array(GgufValueType::STRING, {kvrun::gguf_make_string("x")})};
    meta.set_value("nested", kvrun::gguf_make_array(GgufValueType::ARRAY, inner));
    write_file(dir + "/seed_meta.gguf", meta.to_bytes());

    GgufWriter tensors;
    tensors.set_string("general.architecture", "llama");
    std::vector<float> f32(16, 0.5f);
    tensors.add_tensor("a.f32", GgmlType::F32, {8, 2}, f32.data(), f32.size() * 4);
    auto f16 = zeros(8);
    tensors.add_tensor("b.f16", GgmlType::F16, {4}, f16.data(), f16.size());
    auto q40 = zeros(2 * 18);
    tensors.add_tensor("c.q4_0", GgmlType::Q4_0, {32, 2}, q40.data(), q40.size());
    auto q80 = zeros(2 * 34);
    tensors.add_tensor("d.q8_0", GgmlType::Q8_0, {64}, q80.data(), q80.size());
    auto q4k = zeros(144);
    tensors.add_tensor("e.q4_k", GgmlType::Q4_K, {256, 1, 1, 1}, q4k.data(), q4k.size());
    auto bytes = tensors.to_bytes();
    write_file(dir + "/seed_tensors_v3.gguf", bytes);
    bytes[4] = 2;  // same layout, version 2
    write_file(dir + "/seed_tensors_v2.gguf", bytes);

    GgufWriter aligned(64);
    aligned.set_u32("n", 1);
    aligned.add_tensor("x", GgmlType::F32, {3}, f32.data(), 12);
    aligned.add_tensor("y", GgmlType::F32, {5}, f32.data(), 20);
    write_file(dir + "/seed_align64.gguf", aligned.to_bytes());

    // A llama header with YaRN keys and Llama 3.1-style frequency factors (no weights: the
    // config reader needs only the embedding table's shape).
    GgufWriter rope;
    rope.set_string("general.architecture", "llama");
    rope.set_u32("llama.block_count", 1);
    rope.set_u32("llama.embedding_length", 16);
    rope.set_u32("llama.feed_forward_length", 32);
    rope.set_u32("llama.attention.head_count", 2);
    rope.set_u32("llama.context_length", 4096);
    rope.set_string("llama.rope.scaling.type", "yarn");
    rope.set_f32("llama.rope.scaling.factor", 4.0f);
    rope.set_u32("llama.rope.scaling.original_context_length", 1024);
    rope.set_f32("llama.rope.scaling.attn_factor", 1.0f);
    std::vector<float> factors = {1.0f, 2.0f, 4.0f, 8.0f};
    rope.add_tensor("rope_freqs.weight", GgmlType::F32, {4}, factors.data(), 16);
    std::vector<float> embd(16 * 4, 0.1f);
    rope.add_tensor("token_embd.weight", GgmlType::F32, {16, 4}, embd.data(), embd.size() * 4);
    write_file(dir + "/seed_rope.gguf", rope.to_bytes());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    return fuzz_write_seeds_if_asked(write_seeds);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        kvrun::GgufFile f = kvrun::GgufFile::from_memory(data, size, "fuzz");
        for (const auto& [key, value] : f.metadata()) {
            g_sink = g_sink + key.size();
            touch_value(value);
            g_sink = g_sink + value.to_display().size();
            if (f.find(key) != &value) __builtin_trap();  // index must agree with the list
        }
        g_sink = g_sink + static_cast<uint64_t>(f.get_int_or("general.alignment", 0));
        for (const kvrun::GgufTensorInfo& t : f.tensors()) {
            if (f.find_tensor(t.name) != &t) __builtin_trap();
            if (t.n_bytes != kvrun::ggml_row_bytes(t.type, t.dims[0]) *
                                 static_cast<uint64_t>(t.n_elements / t.dims[0]))
                __builtin_trap();
            uint64_t sum = 0;
            for (uint64_t i = 0; i < t.n_bytes; ++i) sum += t.data[i];
            g_sink = g_sink + sum;
        }
        std::vector<std::pair<uint64_t, uint64_t>> ranges;  // [n_tensors] (offset, n_bytes)
        for (const kvrun::GgufTensorInfo& t : f.tensors()) ranges.emplace_back(t.offset, t.n_bytes);
        std::sort(ranges.begin(), ranges.end());
        for (size_t k = 1; k < ranges.size(); ++k)
            if (ranges[k].first - ranges[k - 1].first < ranges[k - 1].second) __builtin_trap();
        try {
            const kvrun::ModelConfig c = kvrun::model_config_from_gguf(f);
            const kvrun::RopeParams p = c.rope(c.rope_freq_factors.data());
            g_sink = g_sink + uint64_t(p.n_rot) + uint64_t(c.rope_freq_factors.size());
        } catch (const kvrun::Error&) {
        }
    } catch (const kvrun::GgufError& e) {
        // Rejected input: the expected outcome for most mutations. It must say where.
        if (e.file() != "fuzz" || e.where().empty() || !e.offset()) __builtin_trap();
    } catch (const kvrun::Error&) {
    }
    return 0;
}
