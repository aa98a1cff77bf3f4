// llama-quantize's file types and mix rules, and the streaming conversion of a GGUF file.
#include "quantize_model.h"

#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <regex>

#include "common.h"
#include "gguf_writer.h"
#include "quant.h"
#include "stdio_file.h"
#include "thread_pool.h"

namespace kvrun {
namespace {

constexpr std::string_view kNoCodec = "kvrun has no quantizer for its tensor type";

// general.file_type numbers (llama.cpp's llama_ftype).
enum FileTypeId : uint32_t {
    kF32 = 0,
    kF16 = 1,
    kQ4_0 = 2,
    kQ4_1 = 3,
    kQ8_0 = 7,
    kQ5_0 = 8,
    kQ5_1 = 9,
    kQ2_K = 10,
    kQ3_K_S = 11,
    kQ3_K_M = 12,
    kQ3_K_L = 13,
    kQ4_K_S = 14,
    kQ4_K_M = 15,
    kQ5_K_S = 16,
    kQ5_K_M = 17,
    kQ6_K = 18,
    kIQ2_XXS = 19,
    kIQ2_XS = 20,
    kQ2_K_S = 21,
    kIQ3_XS = 22,
    kIQ3_XXS = 23,
    kIQ1_S = 24,
    kIQ4_NL = 25,
    kIQ3_S = 26,
    kIQ3_M = 27,
    kIQ2_S = 28,
    kIQ2_M = 29,
    kIQ4_XS = 30,
    kIQ1_M = 31,
    kBF16 = 32,
    kTQ1_0 = 36,
    kTQ2_0 = 37,
    kMXFP4_MOE = 38,
    kNVFP4 = 39,
    kQ1_0 = 40,
};

using T = GgmlType;
constexpr QuantFileType kFileTypes[] = {
    {"Q4_0", kQ4_0, T::Q4_0, "4.5 bits per weight, one scale per 32 weights", ""},
    {"Q4_1", kQ4_1, T::Q4_1, "5.0 bpw, scale and minimum per 32 weights", ""},
    {"Q5_0", kQ5_0, T::Q5_0, "5.5 bpw, one scale per 32 weights", ""},
    {"Q5_1", kQ5_1, T::Q5_1, "6.0 bpw, scale and minimum per 32 weights", ""},
    {"Q8_0", kQ8_0, T::Q8_0, "8.5 bpw, nearly lossless", ""},
    {"Q2_K", kQ2_K, T::Q2_K, "2-bit K-quant mix (Q3_K attn_v/attn_output/ffn_down)", ""},
    {"Q2_K_S", kQ2_K_S, T::Q2_K, "2-bit K-quant, smaller mix (needs --imatrix)", "", true},
    {"Q3_K_S", kQ3_K_S, T::Q3_K, "3-bit K-quant", ""},
    {"Q3_K_M", kQ3_K_M, T::Q3_K, "3-bit K-quant mix (Q4_K/Q5_K attn_v, attn_output, ffn_down)", ""},
    {"Q3_K_L", kQ3_K_L, T::Q3_K, "3-bit K-quant mix (Q5_K attn_v, attn_output, ffn_down)", ""},
    {"Q4_K_S", kQ4_K_S, T::Q4_K, "4-bit K-quant (Q5_K in the first attn_v/ffn_down)", ""},
    {"Q4_K_M", kQ4_K_M, T::Q4_K, "4-bit K-quant mix (Q6_K attn_v/ffn_down in some layers)", ""},
    {"Q5_K_S", kQ5_K_S, T::Q5_K, "5-bit K-quant", ""},
    {"Q5_K_M", kQ5_K_M, T::Q5_K, "5-bit K-quant mix (Q6_K attn_v/ffn_down in some layers)", ""},
    {"Q6_K", kQ6_K, T::Q6_K, "6.6 bpw K-quant", ""},
    {"IQ4_NL", kIQ4_NL, T::IQ4_NL, "4.5 bpw, non-linear levels per 32 weights", ""},
    {"IQ4_XS", kIQ4_XS, T::IQ4_XS, "4.25 bpw, non-linear levels per 256 weights", ""},
    {"MXFP4_MOE", kMXFP4_MOE, T::MXFP4,
     "experts MXFP4 (4.25 bpw FP4), other matrices Q8_0 (gpt-oss)", ""},
    {"F16", kF16, T::F16, "16-bit float", ""},
    {"BF16", kBF16, T::BF16, "bfloat16", ""},
    {"F32", kF32, T::F32, "32-bit float", ""},
    {"IQ2_XXS", kIQ2_XXS, T::IQ2_XXS, "2.06 bpw", kNoCodec, true},
    {"IQ2_XS", kIQ2_XS, T::IQ2_XS, "2.31 bpw", kNoCodec, true},
    {"IQ2_S", kIQ2_S, T::IQ2_XS, "2.5 bpw", kNoCodec, true},
    {"IQ2_M", kIQ2_M, T::IQ2_S, "2.7 bpw", kNoCodec, true},
    {"IQ1_S", kIQ1_S, T::IQ1_S, "1.56 bpw", kNoCodec, true},
    {"IQ1_M", kIQ1_M, T::IQ1_M, "1.75 bpw", kNoCodec, true},
    {"IQ3_XXS", kIQ3_XXS, T::IQ3_XXS, "3.06 bpw", kNoCodec},
    {"IQ3_XS", kIQ3_XS, T::IQ3_S, "3.3 bpw", kNoCodec},
    {"IQ3_S", kIQ3_S, T::IQ3_S, "3.44 bpw", kNoCodec},
    {"IQ3_M", kIQ3_M, T::IQ3_S, "3.66 bpw", kNoCodec},
    {"TQ1_0", kTQ1_0, T::TQ1_0, "1.69 bpw ternary (models trained ternary: BitNet b1.58, TriLM)",
     ""},
    {"TQ2_0", kTQ2_0, T::TQ2_0, "2.06 bpw ternary, the faster layout of TQ1_0's values", ""},
    {"Q1_0", kQ1_0, T::Q1_0, "1.125 bpw, a sign per weight and a scale per 128 (binary models)",
     ""},
    {"NVFP4", kNVFP4, T::NVFP4, "4.5 bpw FP4 (NVIDIA ModelOpt checkpoints, converted)",
     "llama.cpp writes NVFP4 only when converting a ModelOpt checkpoint, never by quantizing"},
};

std::string upper(std::string_view s) {
    std::string u(s);
    for (char& c : u) c = char(std::toupper(static_cast<unsigned char>(c)));
    return u;
}

bool is_quantized(GgmlType t) {
    return t != T::F32 && t != T::F16 && t != T::BF16;
}

// The block index in "blk.N.…" (-1 for tensors outside the blocks).
int64_t layer_of(const std::string& name) {
    if (name.rfind("blk.", 0) != 0) return -1;
    int64_t layer = -1;
    auto [p, ec] = std::from_chars(name.data() + 4, name.data() + name.size(), layer);
    return ec == std::errc() && p < name.data() + name.size() && *p == '.' ? layer : -1;
}

// Tensors llama-quantize leaves in their type: 1-D tensors, norms, routers and the small
// special matrices of some architectures.
bool quantizable(const GgufTensorInfo& t, const QuantizeOptions& o) {
    const std::string& n = t.name;
    if (n.size() < 6 || n.compare(n.size() - 6, 6, "weight") != 0) return false;
    if (t.dims.size() < 2 || contains(n, "_norm.weight")) return false;
    if (o.leave_output && n == "output.weight") return false;
    for (std::string_view keep : {"ffn_gate_inp.weight", "altup", "laurel", "per_layer_model_proj",
                                  "ssm_conv1d.weight", "attn_rel_b.weight", "time_mix_"})
        if (contains(n, keep)) return false;
    return n != "position_embd.weight" && n != "token_types.weight";
}

// What the mix rules need to know about the model.
struct MixContext {
    uint32_t ftype = 0;
    bool has_imatrix = false;
    std::string arch;
    int64_t n_layer = 0, n_gqa = 1, n_expert = 0, n_attention_wv = 0;
    bool has_output = false, is_70b = false;
};

MixContext mix_context(const GgufFile& in, uint32_t ftype) {
    MixContext m;
    m.ftype = ftype;
    m.arch = in.get_string_or("general.architecture", "llama");
    auto first_int = [&](const std::string& key, int64_t def) {
        const GgufValue* v = in.find(key);
        if (!v) return def;
        if (v->type == GgufValueType::ARRAY)
            return v->as_array().empty() ? def : v->as_array().front().as_int();
        return v->as_int();
    };
    m.n_layer = first_int(m.arch + ".block_count", 0);
    const int64_t n_head = first_int(m.arch + ".attention.head_count", 1);
    const int64_t n_head_kv = first_int(m.arch + ".attention.head_count_kv", n_head);
    m.n_gqa = n_head_kv > 0 ? n_head / n_head_kv : 1;
    m.n_expert = first_int(m.arch + ".expert_count", 0);
    for (const GgufTensorInfo& t : in.tensors()) {
        if (contains(t.name, "attn_v.weight") || contains(t.name, "attn_qkv.weight") ||
            contains(t.name, "attn_kv_b.weight"))
            ++m.n_attention_wv;
        if (t.name == "output.weight") m.has_output = true;
        if (m.n_layer == 0) m.n_layer = std::max(m.n_layer, layer_of(t.name) + 1);
    }
    m.is_70b = m.arch == "llama" && m.n_layer == 80 && n_head != n_head_kv;
    return m;
}

// llama.cpp's mix rules: the type a tensor gets under file type m.ftype before the width
// check. i_wv counts the attn_v tensors seen before this one.
GgmlType mix_type(const MixContext& m, const GgufTensorInfo& t, GgmlType type, int64_t i_wv) {
    const std::string& n = t.name;
    const uint32_t f = m.ftype;
    const bool falcon = m.arch == "falcon";
    // MXFP4_MOE (llama.cpp's): the experts' stacked tensors in MXFP4, every
    // other matrix Q8_0.
    if (f == kMXFP4_MOE) return t.dims.size() >= 3 && t.dims[2] > 1 ? T::MXFP4 : T::Q8_0;
    if (n == "output.weight" || (!m.has_output && n == "token_embd.weight")) {
        if (falcon || t.dims[0] % ggml_type_traits(type).block_elems != 0) return T::Q8_0;
        return type == T::Q8_0 ? type : T::Q6_K;
    }
    // The ternary files keep a 4-bit embedding (llama.cpp's rule; Q1_0 follows it here).
    if (n == "token_embd.weight") return f == kTQ1_0 || f == kTQ2_0 || f == kQ1_0 ? T::Q4_K : type;
    if (contains(n, "attn_v.weight")) {
        if (f == kQ2_K)
            type = m.n_gqa >= 4 ? T::Q4_K : T::Q3_K;
        else if (f == kQ3_K_M)
            type = i_wv < 2 ? T::Q5_K : T::Q4_K;
        else if (f == kQ3_K_L)
            type = T::Q5_K;
        else if ((f == kIQ4_NL || f == kIQ4_XS) && m.n_gqa >= 4)
            type = T::Q5_K;
        else if ((f == kQ4_K_M || f == kQ5_K_M) && quant_use_more_bits(i_wv, m.n_attention_wv))
            type = T::Q6_K;
        else if (f == kQ4_K_S && i_wv < 4)
            type = T::Q5_K;
        if (m.is_70b && (type == T::Q3_K || type == T::Q4_K)) type = T::Q5_K;
        return m.n_expert == 8 ? T::Q8_0 : type;
    }
    if (contains(n, "attn_k.weight")) return m.n_expert == 8 ? T::Q8_0 : type;
    if (contains(n, "ffn_down")) {
        const int64_t i = std::max<int64_t>(0, layer_of(n)), nl = std::max<int64_t>(1, m.n_layer);
        if (f == kQ2_K) return T::Q3_K;
        if (f == kQ2_K_S) return i < nl / 8 ? T::Q4_K : type;
        if (f == kQ3_K_M)
            return i < nl / 16                             ? T::Q5_K
                   : !falcon || quant_use_more_bits(i, nl) ? T::Q4_K
                                                           : T::Q3_K;
        if (f == kQ3_K_L) return falcon ? T::Q4_K : T::Q5_K;
        if (f == kQ4_K_M) {
            if (falcon)
                return i < nl / 16 ? T::Q6_K : quant_use_more_bits(i, nl) ? T::Q5_K : T::Q4_K;
            return quant_use_more_bits(i, nl) ? T::Q6_K : type;
        }
        if (i < nl / 8 && (f == kIQ4_NL || f == kIQ4_XS) && !m.has_imatrix) return T::Q5_K;
        if (f == kQ5_K_M && quant_use_more_bits(i, nl)) return T::Q6_K;
        if (f == kQ4_K_S && !falcon && i < nl / 8) return T::Q5_K;
        // With an imatrix, the first ffn_down layers of Q4_0 / Q5_0 get a minimum too.
        if ((f == kQ4_0 || f == kQ5_0) && m.has_imatrix && i < nl / 8)
            return f == kQ4_0 ? T::Q4_1 : T::Q5_1;
        return type;
    }
    if (contains(n, "attn_output.weight")) {
        if (falcon) return f == kQ3_K_L ? T::Q4_K : type;
        if (m.n_expert == 8) {
            for (uint32_t bump : {kQ2_K, kQ3_K_S, kQ3_K_M, kIQ4_NL, kQ4_K_S, kQ4_K_M, kIQ4_XS})
                if (f == bump) return T::Q5_K;
            return type;
        }
        if (f == kQ2_K) return T::Q3_K;
        if (f == kQ3_K_M) return T::Q4_K;
        if (f == kQ3_K_L) return T::Q5_K;
        return type;
    }
    if (contains(n, "attn_qkv.weight")) {
        if (f == kQ3_K_M || f == kQ3_K_L) return T::Q4_K;
        if (f == kQ4_K_M) return T::Q5_K;
        if (f == kQ5_K_M) return T::Q6_K;
    }
    return type;
}

// llama.cpp's replacement for a type whose block does not divide the row width.
GgmlType fallback_type(GgmlType t, int64_t width) {
    GgmlType f;
    switch (t) {
        case T::Q2_K:
        case T::Q3_K:
        case T::IQ4_XS:
            f = T::IQ4_NL;
            break;
        case T::Q4_K:
            f = T::Q5_0;
            break;
        case T::Q5_K:
            f = T::Q5_1;
            break;
        case T::Q6_K:
            f = T::Q8_0;
            break;
        case T::TQ1_0:
        case T::TQ2_0:
        case T::Q1_0:
            f = T::Q4_0;
            break;
        default:
            f = T::F16;  // the 32-element types
    }
    return width % ggml_type_traits(f).block_elems == 0 ? f : T::F16;
}

bool fits(GgmlType t, int64_t width) {
    return width % ggml_type_traits(t).block_elems == 0;
}

// llama-quantize's tensor order: outside the blocks by name, then the blocks by layer.
std::vector<const GgufTensorInfo*> write_order(const GgufFile& in) {
    std::vector<const GgufTensorInfo*> order;
    for (const GgufTensorInfo& t : in.tensors()) order.push_back(&t);
    std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
        const int64_t la = layer_of(a->name), lb = layer_of(b->name);
        return la != lb ? la < lb : a->name < b->name;
    });
    return order;
}

// Tensor c converted to c.to in `out` (rows fitted with the imatrix entry when c.weighted).
void convert_tensor(const TensorQuantChoice& c, const QuantizeOptions& o, ThreadPool& pool,
                    std::vector<float>& f32, std::vector<uint8_t>& out) {
    const GgufTensorInfo& t = *c.tensor;
    const float* x = tensor_as_f32(t, f32, pool);
    if (c.edited) {
        if (x != f32.data()) f32.assign(x, x + t.n_elements);  // x was the mapped file
        o.edits.at(t.name).apply(f32.data(), pool);
        x = f32.data();
    }
    const int64_t width = t.dims[0], rows = t.n_elements / width;
    const int64_t rows_per_mat = t.dims.size() > 1 ? t.dims[1] : 1;
    const size_t row_out = ggml_row_bytes(c.to, width);
    // Importance per matrix (expert); an all-zero one (an expert the calibration never
    // routed to) is quantized unweighted.
    const std::vector<float> ms =
        c.weighted ? o.imatrix->mean_squares(t.name) : std::vector<float>{};
    std::vector<const float*> importance;
    for (size_t m = 0; m * size_t(width) < ms.size(); ++m) {
        const float* p = ms.data() + m * size_t(width);
        importance.push_back(std::any_of(p, p + width, [](float v) { return v > 0; }) ? p
                                                                                      : nullptr);
    }
    out.resize(row_out * size_t(rows));
    pool.parallel_for(rows, parallel_grain(width * 8), [&](int64_t r0, int64_t r1) {
        for (int64_t row = r0; row < r1; ++row) {
            const size_t m = size_t(row / rows_per_mat);
            quantize_row_weighted(c.to, x + row * width,
                                  m < importance.size() ? importance[m] : nullptr,
                                  out.data() + size_t(row) * row_out, width);
        }
    });
}

}  // namespace

const float* tensor_as_f32(const GgufTensorInfo& t, std::vector<float>& buf, ThreadPool& pool) {
    if (t.type == T::F32 && reinterpret_cast<uintptr_t>(t.data) % alignof(float) == 0)
        return reinterpret_cast<const float*>(t.data);
    const int64_t width = t.dims[0], rows = t.n_elements / width;
    const size_t row_bytes = ggml_row_bytes(t.type, width);
    buf.resize(size_t(t.n_elements));
    pool.parallel_for(rows, parallel_grain(width * 4), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r)
            dequantize_row(t.type, t.data + size_t(r) * row_bytes, buf.data() + r * width, width);
    });
    return buf.data();
}

std::span<const QuantFileType> quant_file_types() {
    return kFileTypes;
}

const QuantFileType* quant_file_type_by_id(uint32_t id) {
    for (const QuantFileType& t : kFileTypes)
        if (t.id == id) return &t;
    return nullptr;
}

const QuantFileType* find_quant_file_type(std::string_view name_or_id) {
    std::string u = upper(name_or_id);
    if (u == "Q3_K" || u == "Q4_K" || u == "Q5_K") u += "_M";
    uint32_t id = 0;
    auto [p, ec] = std::from_chars(u.data(), u.data() + u.size(), id);
    if (!u.empty() && ec == std::errc() && p == u.data() + u.size())
        return quant_file_type_by_id(id);
    for (const QuantFileType& t : kFileTypes)
        if (t.name == u) return &t;
    return nullptr;
}

bool quant_use_more_bits(int64_t layer, int64_t n_layer) {
    return layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
}

std::vector<TensorQuantChoice> plan_quantization(const GgufFile& in, const QuantizeOptions& o) {
    if (o.type && !o.type->unsupported.empty())
        fail("cannot quantize to {}: {}", o.type->name, o.type->unsupported);
    if (o.type && o.type->needs_imatrix && !o.imatrix)
        throw Error(fmt::format("{} needs an importance matrix", o.type->name),
                    "make one with `kvrun imatrix -m MODEL -f TEXT`, then pass --imatrix FILE");
    MixContext mix = mix_context(in, o.type ? o.type->id : 0);
    mix.has_imatrix = o.imatrix != nullptr;
    std::vector<std::pair<std::regex, GgmlType>> patterns;
    for (const auto& [re, type] : o.tensor_types) {
        try {
            patterns.emplace_back(std::regex(re), type);
        } catch (const std::regex_error& e) {
            fail("--tensor-type: bad regular expression '{}': {}", re, e.what());
        }
    }
    std::vector<TensorQuantChoice> plan;
    int64_t i_wv = 0;
    for (const GgufTensorInfo* t : write_order(in)) {
        TensorQuantChoice c{t, t->type, false};
        if (o.type && quantizable(*t, o)) {
            const int64_t width = t->dims[0];
            GgmlType to = o.type->base;
            if (!o.pure && is_quantized(to)) to = mix_type(mix, *t, to, i_wv);
            if (contains(t->name, "attn_v.weight")) ++i_wv;
            if (!fits(to, width)) {
                to = fallback_type(to, width);
                c.fallback = true;
            }
            if (!c.fallback)
                for (const auto& [re, type] : patterns)
                    if (std::regex_search(t->name, re)) to = type;
            if (o.token_embd_type && t->name == "token_embd.weight") to = *o.token_embd_type;
            if (o.output_type && t->name == "output.weight") to = *o.output_type;
            if (!fits(to, width))
                fail("tensor '{}': its rows of {} do not split into {} blocks of {}", t->name,
                     width, ggml_type_name(to), ggml_type_traits(to).block_elems);
            c.to = to;
        }
        if (auto e = o.edits.find(t->name); e != o.edits.end()) {
            c.to = e->second.to;
            c.edited = true;
            if (!fits(c.to, t->dims[0]))
                fail("tensor '{}': its rows of {} do not split into {} blocks of {}", t->name,
                     t->dims[0], ggml_type_name(c.to), ggml_type_traits(c.to).block_elems);
        }
        if (c.convert()) {
            if (!ggml_type_traits(c.to).can_quantize)
                fail("tensor '{}': kvrun cannot write {} tensors", t->name, ggml_type_name(c.to));
            if (!ggml_type_traits(t->type).can_dequantize)
                fail("tensor '{}': kvrun cannot read {} tensors", t->name, ggml_type_name(t->type));
            if (is_quantized(t->type) && !o.allow_requantize && !c.edited)
                fail(
                    "tensor '{}' is already {}: requantizing loses quality twice; pass "
                    "--allow-requantize to do it anyway",
                    t->name, ggml_type_name(t->type));
            if (o.imatrix) {
                auto it = o.imatrix->entries.find(t->name);
                const size_t n_mat = t->dims.size() > 2 ? size_t(t->dims[2]) : 1;
                if (it != o.imatrix->entries.end()) {
                    if (it->second.sum2.size() != size_t(t->dims[0]) * n_mat)
                        fail(
                            "tensor '{}': the importance matrix holds {} values for it, the "
                            "tensor has {} columns{}",
                            t->name, it->second.sum2.size(), t->dims[0],
                            n_mat > 1 ? fmt::format(" x {} experts", n_mat) : "");
                    c.weighted = true;
                } else if (o.type->needs_imatrix && c.to == o.type->base &&
                           t->name != "token_embd.weight") {
                    fail("tensor '{}' has no importance matrix entry, which {} needs", t->name,
                         o.type->name);
                }
            }
        }
        plan.push_back(c);
    }
    return plan;
}

std::vector<std::string> split_paths(const std::string& out_path, int n_files) {
    if (n_files == 1) return {out_path};
    std::string prefix = out_path;
    if (prefix.size() > 5 && prefix.compare(prefix.size() - 5, 5, ".gguf") == 0)
        prefix.resize(prefix.size() - 5);
    std::vector<std::string> paths;
    for (int i = 0; i < n_files; ++i)
        paths.push_back(prefix + fmt::format("-{:05d}-of-{:05d}.gguf", i + 1, n_files));
    return paths;
}

std::vector<int> plan_split(const GgufFile& in, const std::vector<TensorQuantChoice>& plan,
                            const QuantizeOptions& o, int& n_files) {
    std::vector<int> file_of(plan.size(), 0);
    n_files = 1;
    if (o.keep_split) {
        n_files = in.n_splits();
        for (size_t i = 0; i < plan.size(); ++i) file_of[i] = plan[i].tensor->split;
        return file_of;
    }
    if (o.split_max_tensors <= 0 && o.split_max_bytes == 0) return file_of;
    int file = o.split_no_tensor_first ? 1 : 0;
    int64_t n_in_file = 0;
    uint64_t bytes_in_file = 0;
    for (size_t i = 0; i < plan.size(); ++i) {
        const TensorQuantChoice& c = plan[i];
        const uint64_t bytes = ggml_row_bytes(c.to, c.tensor->dims[0]) *
                               uint64_t(c.tensor->n_elements / c.tensor->dims[0]);
        const bool full = (o.split_max_tensors > 0 && n_in_file >= o.split_max_tensors) ||
                          (o.split_max_bytes > 0 && bytes_in_file + bytes > o.split_max_bytes);
        if (n_in_file > 0 && full) {
            ++file;
            n_in_file = 0;
            bytes_in_file = 0;
        }
        file_of[i] = file;
        ++n_in_file;
        bytes_in_file += bytes;
    }
    n_files = plan.empty() ? 1 : file + 1;
    if (n_files > 99999) fail("the split limits give {} files, more than 99999", n_files);
    return file_of;
}

QuantizeResult quantize_model(
    const GgufFile& in, const std::string& out_path, const QuantizeOptions& o,
    const std::function<void(size_t, const TensorQuantChoice&)>& on_tensor,
    const std::atomic<bool>* cancel) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const std::vector<TensorQuantChoice> plan = plan_quantization(in, o);

    // The output files: one, or one per file of a split input (--keep-split), or as the split
    // limits say.
    int n_files = 1;
    const std::vector<int> file_of = plan_split(in, plan, o, n_files);
    const std::vector<std::string> paths = split_paths(out_path, n_files);
    for (const std::string& p : paths)
        for (int k = 0; k < in.n_splits(); ++k)
            if (fs::exists(p) && fs::equivalent(p, in.split_path(k), ec))
                fail("{}: the output would overwrite the input model", p);

    std::vector<GgufWriter> writers;
    std::vector<std::vector<size_t>> members(static_cast<size_t>(n_files));  // per file
    for (size_t i = 0; i < plan.size(); ++i) members[size_t(file_of[i])].push_back(i);
    for (int k = 0; k < n_files; ++k) {
        GgufWriter& w = writers.emplace_back(uint32_t(in.alignment()));
        if (k == 0) {
            for (const auto& [key, value] : in.metadata())
                if (key != "general.alignment" && key.rfind("split.", 0) != 0)
                    w.set_value(key, value);
            if (o.type) {
                w.set_u32("general.quantization_version", 2);
                w.set_u32("general.file_type", o.type->id);
            }
            if (o.imatrix) {
                w.set_string("quantize.imatrix.file", o.imatrix_file);
                if (!o.imatrix->datasets.empty())
                    w.set_string("quantize.imatrix.dataset", o.imatrix->datasets.front());
                w.set_i32("quantize.imatrix.entries_count", int32_t(o.imatrix->entries.size()));
                w.set_i32("quantize.imatrix.chunks_count", int32_t(o.imatrix->chunks));
            }
            for (const auto& [key, value] : o.metadata) w.set_value(key, value);
        }
        if (n_files > 1) {
            w.set_u16("split.no", uint16_t(k));
            w.set_u16("split.count", uint16_t(n_files));
            w.set_i32("split.tensors.count", int32_t(plan.size()));
        }
        for (size_t i : members[size_t(k)])
            w.add_tensor_layout(plan[i].tensor->name, plan[i].to, plan[i].tensor->dims);
    }

    std::vector<std::string> parts;
    for (const std::string& p : paths) parts.push_back(p + ".part");
    FILE* f = nullptr;
    QuantizeResult r;
    try {
        ThreadPool pool(o.threads);
        std::vector<float> f32;
        std::vector<uint8_t> out;
        const std::vector<uint8_t> zeros(size_t(in.alignment()), 0);
        size_t done = 0;  // tensors reported so far, over all files
        for (int k = 0; k < n_files; ++k) {
            const std::string& part = parts[size_t(k)];
            f = std::fopen(part.c_str(), "wb");
            if (!f) fail("{}: cannot create: {}", part, std::strerror(errno));
            const std::vector<uint8_t> header = writers[size_t(k)].header_bytes();
            write_all(f, header.data(), header.size(), part);
            for (size_t i : members[size_t(k)]) {
                if (cancel && *cancel) fail("interrupted");
                const TensorQuantChoice& c = plan[i];
                const GgufTensorInfo& t = *c.tensor;
                if (on_tensor) on_tensor(done++, c);
                const uint8_t* bytes = t.data;
                size_t n_bytes = t.n_bytes;
                if (c.convert()) {
                    convert_tensor(c, o, pool, f32, out);
                    bytes = out.data();
                    n_bytes = out.size();
                    ++r.n_converted;
                    r.n_fallback += c.fallback;
                    r.n_weighted += c.weighted;
                }
                write_all(f, bytes, n_bytes, part);
                write_all(f, zeros.data(), writers[size_t(k)].padding_after(n_bytes), part);
                r.bytes_in += t.n_bytes;
                r.bytes_out += n_bytes;
            }
            const int closed = std::fclose(f);
            f = nullptr;
            if (closed != 0) fail("{}: write failed: {}", part, std::strerror(errno));
        }
        for (size_t k = 0; k < paths.size(); ++k)
            if (std::rename(parts[k].c_str(), paths[k].c_str()) != 0)
                fail("{}: cannot rename to {}: {}", parts[k], paths[k], std::strerror(errno));
    } catch (...) {
        if (f) std::fclose(f);
        for (const std::string& p : parts) fs::remove(p, ec);
        throw;
    }
    return r;
}

}  // namespace kvrun
