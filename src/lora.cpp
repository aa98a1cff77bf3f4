// LoRA adapters: reading llama.cpp's adapter GGUF files and attaching their updates to the
// base model's matrices (see lora.h).
#include "lora.h"

#include <fmt/ranges.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <tuple>

#include "common.h"
#include "quant.h"

namespace kvrun {
namespace {

constexpr std::string_view kA = ".lora_a", kB = ".lora_b";

bool ends_with(std::string_view s, std::string_view tail) {
    return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

// Rows [r0, r0 + n) of B: the update of that slice of a fused matrix.
LoraDelta rows_of(const LoraDelta& d, int64_t r0, int64_t n) {
    LoraDelta s = d;
    s.b = row_slice(d.b, r0, n);
    return s;
}

// Attaches the update `d` of base matrix `name` ("blk.3.attn_q.weight", "output.weight").
void attach(ModelWeights& w, const ModelConfig& c, const std::string& path, const std::string& name,
            const LoraDelta& d) {
    if (name == "output.weight") {
        w.lora_output.push_back(d);
        return;
    }
    auto unsupported = [&] {
        fail(
            "{}: LoRA tensor for '{}': kvrun adapts the attention, dense FFN and output "
            "matrices only",
            path, name);
    };
    int layer = -1, end = 0;
    if (std::sscanf(name.c_str(), "blk.%d.%n", &layer, &end) != 1 || end == 0 || layer < 0 ||
        layer >= c.n_layer)
        unsupported();
    LayerWeights& l = w.layers[size_t(layer)];
    const std::string what = name.substr(size_t(end));
    // (DeepSeek: of its attention matrices, only attn_q, when Q is one matrix, and attn_output)
    if (c.mla() && !(what == "attn_q.weight" && c.mla_q_rank == 0) &&
        what != "attn_output.weight" && what.rfind("ffn_", 0) != 0)
        unsupported();
    if (what == "attn_q.weight") {
        l.lora_q.push_back(d);
    } else if (what == "attn_k.weight") {
        l.lora_k.push_back(d);
    } else if (what == "attn_v.weight") {
        l.lora_v.push_back(d);
    } else if (what == "attn_qkv.weight") {  // phi3: B's rows are Q's, K's, then V's
        l.lora_q.push_back(rows_of(d, 0, c.q_dim()));
        l.lora_k.push_back(rows_of(d, c.q_dim(), c.kv_dim()));
        l.lora_v.push_back(rows_of(d, c.q_dim() + c.kv_dim(), c.kv_dim()));
    } else if (what == "attn_output.weight") {
        l.lora_o.push_back(d);
    } else if (what == "ffn_gate.weight" && !c.moe_layer(layer)) {
        l.lora_gate.push_back(d);
    } else if (what == "ffn_up.weight" && !c.moe_layer(layer)) {
        if (c.fused_gate_up) {  // phi3: the gate's rows, then up's
            l.lora_gate.push_back(rows_of(d, 0, c.n_ff));
            l.lora_up.push_back(rows_of(d, c.n_ff, c.n_ff));
        } else {
            l.lora_up.push_back(d);
        }
    } else if (what == "ffn_down.weight" && !c.moe_layer(layer)) {
        l.lora_down.push_back(d);
    } else {
        unsupported();
    }
}

}  // namespace

std::unique_ptr<GgufFile> lora_open(const LoraSpec& spec, const GgufFile& base,
                                    const std::string& arch, std::vector<LoraPair>& out) {
    if (!std::isfinite(spec.scale))
        fail("LoRA scale {} for {} is not finite", spec.scale, spec.path);
    auto f = std::make_unique<GgufFile>(GgufFile::open(spec.path));
    const std::string type = f->get_string_or("general.type", "");
    if (type != "adapter" || f->get_string_or("adapter.type", "") != "lora")
        throw Error(fmt::format("{} is not a LoRA adapter (general.type '{}', adapter.type "
                                "'{}')",
                                spec.path, type, f->get_string_or("adapter.type", "")),
                    "--lora takes an adapter GGUF (llama.cpp's convert_lora_to_gguf.py)");
    const std::string adapter_arch = f->get_string_or("general.architecture", "");
    if (adapter_arch != arch)
        fail("{}: LoRA adapter for architecture '{}', but the model is '{}'", spec.path,
             adapter_arch, arch);
    const double alpha = f->get_float_or("adapter.lora.alpha", 0.0);
    if (!std::isfinite(alpha) || alpha < 0)
        fail("{}: adapter.lora.alpha = {} must be >= 0", spec.path, alpha);
    // Pair up the tensors: base name -> (A, B).
    std::map<std::string, std::pair<const GgufTensorInfo*, const GgufTensorInfo*>> pairs;
    for (const GgufTensorInfo& t : f->tensors()) {
        if (ends_with(t.name, kA))
            pairs[t.name.substr(0, t.name.size() - kA.size())].first = &t;
        else if (ends_with(t.name, kB))
            pairs[t.name.substr(0, t.name.size() - kB.size())].second = &t;
        else
            fail("{}: tensor '{}' is not a LoRA tensor (.lora_a / .lora_b)", spec.path, t.name);
    }
    if (pairs.empty()) fail("{}: the LoRA adapter has no tensors", spec.path);
    out.clear();
    for (const auto& [name, ab] : pairs) {
        if (!ab.first || !ab.second)
            fail("{}: '{}' has {} but no {}", spec.path, name, ab.first ? kA : kB,
                 ab.first ? kB : kA);
        const GgufTensorInfo* w = base.find_tensor(name);
        if (!w || w->dims.size() != 2)
            fail("{}: LoRA tensors for '{}', which the model has no matrix of", spec.path, name);
        LoraPair p;
        p.name = name;
        p.a = ab.first;
        p.b = ab.second;
        p.n_in = w->dims[0];
        p.n_out = w->dims[1];
        if (ab.first->dims.size() != 2)
            fail("{}: LoRA tensor '{}{}' is not 2-D", spec.path, name, kA);
        p.rank = ab.first->dims[1];
        if (p.rank < 1) fail("{}: LoRA tensor '{}{}' has rank 0", spec.path, name, kA);
        for (const auto& [t, n_in, n_out] :
             {std::tuple{p.a, p.n_in, p.rank}, std::tuple{p.b, p.rank, p.n_out}})
            if (t->dims.size() != 2 || t->dims[0] != n_in || t->dims[1] != n_out)
                fail("{}: LoRA tensor '{}' has shape [{}], expected [{}, {}]", f->path(), t->name,
                     fmt::join(t->dims, ", "), n_in, n_out);
        p.per_unit = alpha > 0 ? alpha / double(p.rank) : 1.0;
        out.push_back(std::move(p));
    }
    return f;
}

std::vector<std::unique_ptr<GgufFile>> lora_attach(ModelWeights& weights, const ModelConfig& c,
                                                   const GgufFile& base,
                                                   const std::vector<LoraSpec>& specs) {
    std::vector<std::unique_ptr<GgufFile>> files;
    for (const LoraSpec& spec : specs) {
        std::vector<LoraPair> pairs;
        auto f = lora_open(spec, base, c.arch, pairs);
        for (const LoraPair& p : pairs) {
            LoraDelta d;
            d.a = matrix_view(*f, *p.a, p.n_in, p.rank);
            d.b = matrix_view(*f, *p.b, p.rank, p.n_out);
            d.per_unit = p.per_unit;
            d.scale = lora_row_scale(spec.scale, d.per_unit);
            d.adapter = static_cast<int32_t>(files.size());
            attach(weights, c, spec.path, p.name, d);
        }
        files.push_back(std::move(f));
    }
    return files;
}

}  // namespace kvrun
