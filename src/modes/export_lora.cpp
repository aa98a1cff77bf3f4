// `kvrun export-lora` (llama-export-lora): merges LoRA adapters into a base model's weights
// and writes the merged model, which then runs without --lora (and can be quantized). Each
// adapted matrix becomes W + sum over adapters of scale x B A (scale = the user's scale x
// alpha / rank, as at run time); the other tensors and the metadata are copied unchanged.
// A merged matrix keeps its type when it is F32, F16 or BF16 and is written as F16 when it
// was quantized (requantizing would round it twice; `kvrun quantize` can do that next), so
// the output's default name is llama.cpp's ggml-lora-merged-f16.gguf. Written through
// OUTPUT.part (quantize_model), so a failure or Ctrl-C leaves no half file.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <chrono>

#include "common.h"
#include "gguf.h"
#include "lora.h"
#include "modes/model_options.h"
#include "modes/modes.h"
#include "quant.h"
#include "quantize_model.h"

namespace kvrun {
namespace {

struct ExportLoraOptions {
    std::string model, output = "ggml-lora-merged-f16.gguf";
    std::vector<std::string> lora, lora_scaled;
    int threads = 0;
    bool quiet = false;
};

// One adapter's update of one matrix.
struct Delta {
    const GgufTensorInfo* a = nullptr;  // [rank][n_in]
    const GgufTensorInfo* b = nullptr;  // [n_out][rank]
    int64_t rank = 0;
    float scale = 0;
};

// W [n_out][n_in] += scale x B A for each delta.
void merge(float* w, int64_t n_in, int64_t n_out, const std::vector<Delta>& deltas,
           ThreadPool& pool) {
    for (const Delta& d : deltas) {
        std::vector<float> a_buf, b_buf;
        const float* a = tensor_as_f32(*d.a, a_buf, pool);
        const float* b = tensor_as_f32(*d.b, b_buf, pool);
        pool.parallel_for(n_out, 1, [&](int64_t o0, int64_t o1) {
            for (int64_t o = o0; o < o1; ++o) {
                float* row = w + o * n_in;
                for (int64_t k = 0; k < d.rank; ++k) {
                    const float s = d.scale * b[size_t(o * d.rank + k)];
                    const float* ak = a + k * n_in;
                    for (int64_t i = 0; i < n_in; ++i) row[i] += s * ak[i];
                }
            }
        });
    }
}

int run_export_lora(const ExportLoraOptions& c) {
    ModelOptions mo;
    mo.lora = c.lora;
    mo.lora_scaled = c.lora_scaled;
    const std::vector<LoraSpec> specs = lora_specs(mo);
    if (specs.empty())
        throw Error("no adapter to merge", "give --lora FILE or --lora-scaled FILE SCALE");
    GgufFile base = GgufFile::open(c.model);
    if (base.get_string_or("general.type", "model") == "adapter")
        fail("{} is a LoRA adapter, not a base model (-m takes the model)", c.model);
    const std::string arch = base.get_string_or("general.architecture", "");
    std::vector<std::unique_ptr<GgufFile>> adapters;
    std::map<std::string, std::vector<Delta>> deltas;  // base matrix -> its updates
    for (const LoraSpec& spec : specs) {
        std::vector<LoraPair> pairs;
        adapters.push_back(lora_open(spec, base, arch, pairs));
        for (const LoraPair& p : pairs) {
            for (const GgufTensorInfo* t : {p.a, p.b})
                if (!ggml_type_traits(t->type).can_dequantize)
                    fail("{}: tensor '{}' is {}, which kvrun cannot read", spec.path, t->name,
                         ggml_type_name(t->type));
            deltas[p.name].push_back({p.a, p.b, p.rank, lora_row_scale(spec.scale, p.per_unit)});
        }
    }
    QuantizeOptions o;  // COPY: everything not merged keeps its type
    o.threads = c.threads;
    for (const auto& [name, ds] : deltas) {
        const GgufTensorInfo& w = *base.find_tensor(name);
        QuantizeOptions::TensorEdit e;
        e.to = (w.type == GgmlType::F32 || w.type == GgmlType::BF16) ? w.type : GgmlType::F16;
        const int64_t n_in = w.dims[0], n_out = w.dims[1];
        e.apply = [n_in, n_out, &ds](float* values, ThreadPool& pool) {
            merge(values, n_in, n_out, ds, pool);
        };
        o.edits.emplace(name, std::move(e));
    }

    install_interrupt_handler();
    const auto start = std::chrono::steady_clock::now();
    const size_t n = base.tensors().size();
    auto progress = [&](size_t i, const TensorQuantChoice& ch) {
        if (c.quiet || !ch.edited) return;
        fmt::print(stderr, "[{:>4}/{}] {:<32} {} + {} adapter{} -> {}\n", i + 1, n, ch.tensor->name,
                   ggml_type_name(ch.tensor->type), deltas[ch.tensor->name].size(),
                   deltas[ch.tensor->name].size() > 1 ? "s" : "", ggml_type_name(ch.to));
    };
    const QuantizeResult r = quantize_model(base, c.output, o, progress, &interrupt_flag());
    const double secs = seconds_since(start);
    fmt::print(stderr,
               "export-lora: {} + {} adapter{} -> {}: {} matrices merged, {} tensors copied, "
               "{:.2f} MiB, {:.1f} s\n",
               c.model, specs.size(), specs.size() > 1 ? "s" : "", c.output, r.n_converted,
               n - size_t(r.n_converted), r.bytes_out / 1048576.0, secs);
    return 0;
}

}  // namespace

void add_export_lora_command(CLI::App& root, int& exit_code) {
    auto o = std::make_shared<ExportLoraOptions>();
    CLI::App* cmd =
        root.add_subcommand("export-lora",
                            "Merge LoRA adapters into a model's weights and write the merged model "
                            "(llama-export-lora)");
    cmd->add_option("-m,--model", o->model, "The base model (GGUF)")
        ->required()
        ->check(CLI::ExistingFile);
    cmd->add_option("--lora", o->lora, "A LoRA adapter GGUF to merge at scale 1 (repeatable)")
        ->check(CLI::ExistingFile)
        ->allow_extra_args(false);
    cmd->add_option("--lora-scaled", o->lora_scaled,
                    "FILE SCALE: an adapter merged at that scale (repeatable)")
        ->expected(2)
        ->allow_extra_args(false);
    cmd->add_option("-o,--output", o->output, "The merged model")->capture_default_str();
    cmd->add_option("-t,--threads", o->threads, "Threads (0: all cores)")
        ->check(CLI::NonNegativeNumber);
    cmd->add_flag("-q,--quiet", o->quiet, "Print only the summary");
    cmd->callback([o, &exit_code] { exit_code = run_export_lora(*o); });
}

}  // namespace kvrun
