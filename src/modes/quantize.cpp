// `kvrun quantize`: llama-quantize's command line over quantize_model.
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <cctype>
#include <chrono>
#include <filesystem>

#include "common.h"
#include "gguf.h"
#include "modes/model_options.h"
#include "modes/modes.h"
#include "quant.h"
#include "quantize_model.h"

namespace kvrun {
namespace {

struct QuantizeCliOptions {
    std::vector<std::string> positional;  // INPUT [OUTPUT] TYPE [NTHREADS]
    std::string output_type, token_embd_type, imatrix;
    std::vector<std::string> tensor_types, kv_overrides, include_weights, exclude_weights;
    bool pure = false, allow_requantize = false, leave_output = false, quiet = false;
    bool keep_split = false;
    int threads = 0;
};

GgmlType tensor_type_arg(const std::string& flag, const std::string& name) {
    auto t = ggml_type_from_name(name);
    if (!t) fail("{}: unknown tensor type '{}' (e.g. Q8_0, Q6_K, F16)", flag, name);
    return *t;
}

bool is_count(const std::string& s) {
    return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

std::string type_list() {
    std::string out;
    for (const QuantFileType& t : quant_file_types())
        if (t.unsupported.empty())
            out += fmt::format("  {:<7} {:>2}  {}\n", t.name, t.id, t.description);
    return out;
}

bool is_copy(const std::string& s) {
    return s.size() == 4 && std::toupper(s[0]) == 'C' && std::toupper(s[1]) == 'O' &&
           std::toupper(s[2]) == 'P' && std::toupper(s[3]) == 'Y';
}

bool is_type(const std::string& s) {
    return is_copy(s) || find_quant_file_type(s);
}

const QuantFileType* file_type_arg(const std::string& s) {
    if (is_copy(s)) return nullptr;
    const QuantFileType* t = find_quant_file_type(s);
    if (!t)
        throw Error(
            fmt::format("unknown quantization type '{}'", s),
            "the types are:\n" + type_list() + "  COPY        copy the tensors as they are");
    return t;
}

int run_quantize(const QuantizeCliOptions& c) {
    // INPUT [OUTPUT] TYPE [NTHREADS], as llama-quantize reads them.
    std::vector<std::string> a = c.positional;
    int threads = c.threads;
    if (a.size() >= 3 && is_count(a.back()) && is_type(a[a.size() - 2])) {
        threads = std::stoi(a.back());
        a.pop_back();
    }
    if (a.size() < 2 || a.size() > 3)
        fail("expected INPUT [OUTPUT] TYPE [NTHREADS], got {} arguments", c.positional.size());
    const std::string input = a[0];
    const QuantFileType* type = file_type_arg(a.back());
    std::string output = a.size() == 3 ? a[1] : "";
    if (output.empty()) {  // llama-quantize's default: beside the input
        const std::string name = type ? std::string(type->name) : "COPY";
        output = (std::filesystem::path(input).parent_path() / ("ggml-model-" + name + ".gguf"))
                     .string();
    }

    QuantizeOptions o;
    o.type = type;
    o.pure = c.pure;
    o.allow_requantize = c.allow_requantize;
    o.leave_output = c.leave_output;
    o.keep_split = c.keep_split;
    o.threads = threads;
    if (!c.output_type.empty())
        o.output_type = tensor_type_arg("--output-tensor-type", c.output_type);
    if (!c.token_embd_type.empty())
        o.token_embd_type = tensor_type_arg("--token-embedding-type", c.token_embd_type);
    for (const std::string& tt : c.tensor_types) {
        const size_t eq = tt.rfind('=');
        if (eq == std::string::npos || eq == 0)
            fail("--tensor-type '{}': expected REGEX=TYPE (e.g. attn_v=Q8_0)", tt);
        o.tensor_types.emplace_back(tt.substr(0, eq),
                                    tensor_type_arg("--tensor-type", tt.substr(eq + 1)));
    }
    for (const std::string& kv : c.kv_overrides) o.metadata.push_back(parse_kv_override(kv));
    Imatrix imatrix;
    if (!c.imatrix.empty()) {
        imatrix = load_imatrix(c.imatrix);
        // llama-quantize's --include-weights / --exclude-weights: entries by name part.
        auto named = [](const std::string& name, const std::vector<std::string>& parts) {
            for (const std::string& p : parts)
                if (name.find(p) != std::string::npos) return true;
            return false;
        };
        for (auto it = imatrix.entries.begin(); it != imatrix.entries.end();) {
            const bool keep = (c.include_weights.empty() || named(it->first, c.include_weights)) &&
                              !named(it->first, c.exclude_weights);
            it = keep ? std::next(it) : imatrix.entries.erase(it);
        }
        o.imatrix = &imatrix;
        o.imatrix_file = c.imatrix;
    }

    GgufFile in = GgufFile::open(input);
    install_interrupt_handler();
    const auto start = std::chrono::steady_clock::now();
    const size_t n = in.tensors().size();
    auto progress = [&](size_t i, const TensorQuantChoice& ch) {
        if (c.quiet) return;
        const GgufTensorInfo& t = *ch.tensor;
        std::string dims;
        for (int64_t d : t.dims) dims += (dims.empty() ? "" : " x ") + std::to_string(d);
        std::string what = ch.convert() ? fmt::format("{:>6} -> {:<6}", ggml_type_name(t.type),
                                                      ggml_type_name(ch.to))
                                        : fmt::format("{:>6}    kept  ", ggml_type_name(t.type));
        if (ch.weighted) what += "  (imatrix)";
        if (ch.fallback)
            what += fmt::format("  (rows of {} do not fit the mix's type: fallback)", t.dims[0]);
        fmt::print(stderr, "[{:>4}/{}] {:<32} [{}] {}\n", i + 1, n, t.name, dims, what);
    };
    const QuantizeResult r = quantize_model(in, output, o, progress, &interrupt_flag());
    if (o.imatrix)
        fmt::print(stderr, "quantize: importance matrix {} ({} entries, {} chunks)\n", c.imatrix,
                   imatrix.entries.size(), imatrix.chunks);
    const double secs = seconds_since(start);
    int64_t params = 0;
    for (const GgufTensorInfo& t : in.tensors()) params += t.n_elements;
    fmt::print(stderr,
               "quantize: {} -> {} ({})\n  tensors: {} converted{}, {} kept{}\n"
               "  size: {:.2f} MiB -> {:.2f} MiB ({:.2f} bits per weight), {:.1f} s\n",
               input, output, type ? type->name : "COPY", r.n_converted,
               o.imatrix ? fmt::format(" ({} with the importance matrix)", r.n_weighted) : "",
               n - r.n_converted,
               r.n_fallback ? fmt::format(", {} with a fallback type", r.n_fallback) : "",
               r.bytes_in / 1048576.0, r.bytes_out / 1048576.0,
               params ? 8.0 * double(r.bytes_out) / double(params) : 0.0, secs);
    return 0;
}

}  // namespace

void add_quantize_command(CLI::App& root, int& exit_code) {
    auto o = std::make_shared<QuantizeCliOptions>();
    CLI::App* cmd = root.add_subcommand(
        "quantize",
        "Convert a GGUF model's weights to a quantized type (llama-quantize's types and mixes)");
    cmd->add_option("args", o->positional, "INPUT [OUTPUT] TYPE [NTHREADS]")
        ->required()
        ->expected(2, 4);
    cmd->add_flag("--allow-requantize", o->allow_requantize,
                  "Convert tensors that are already quantized (quality suffers twice)");
    cmd->add_flag("--leave-output-tensor", o->leave_output,
                  "Keep output.weight in its type (bigger file, a little better quality)");
    cmd->add_flag("--keep-split", o->keep_split,
                  "A split input gives as many output files, OUTPUT less .gguf then "
                  "-0000i-of-0000N.gguf, each with its input file's tensors");
    cmd->add_flag("--pure", o->pure,
                  "No mix: every quantized tensor gets TYPE's base type (fallbacks still apply "
                  "where rows do not split into its blocks)");
    cmd->add_option("--output-tensor-type", o->output_type, "Type of output.weight (e.g. Q8_0)");
    cmd->add_option("--token-embedding-type", o->token_embd_type,
                    "Type of token_embd.weight (e.g. Q8_0)");
    cmd->add_option("--tensor-type", o->tensor_types,
                    "REGEX=TYPE: tensors whose name matches get TYPE (repeatable; the last match "
                    "wins; e.g. attn_v=Q8_0)")
        ->allow_extra_args(false);  // one value per flag: the positionals follow
    cmd->add_option("--override-kv", o->kv_overrides,
                    "Set a metadata value in the output: KEY=TYPE:VALUE, TYPE int, float, bool "
                    "or str (repeatable)")
        ->allow_extra_args(false);
    cmd->add_option("--imatrix", o->imatrix,
                    "Importance matrix (kvrun imatrix, or llama-imatrix's .gguf / .dat): rows are "
                    "fitted to the error weighted by their columns' activations")
        ->check(CLI::ExistingFile);
    auto* inc = cmd->add_option("--include-weights", o->include_weights,
                                "Use the imatrix only for tensors whose name contains this "
                                "(repeatable)")
                    ->allow_extra_args(false);
    auto* exc = cmd->add_option("--exclude-weights", o->exclude_weights,
                                "Do not use the imatrix for tensors whose name contains this "
                                "(repeatable)")
                    ->allow_extra_args(false);
    inc->excludes(exc);
    cmd->add_option("-t,--threads", o->threads, "Threads (0: all cores; or NTHREADS)")
        ->check(CLI::NonNegativeNumber);
    cmd->add_flag("-q,--quiet", o->quiet, "Print only the summary, not a line per tensor");
    cmd->footer(
        "TYPE is one of:\n" + type_list() +
        "  COPY        copy the tensors as they are (metadata overrides only)\n"
        "Q3_K, Q4_K and Q5_K mean their _M mixes; a number names a type by its "
        "general.file_type. Without OUTPUT the file is ggml-model-TYPE.gguf beside "
        "INPUT. The legacy types, F16 and BF16 give llama-quantize's bytes; the "
        "K-quants and IQ4 kvrun's own fits (KL divergence to the unquantized model within 1% "
        "of llama-quantize's, or lower).");
    cmd->callback([o, &exit_code] { exit_code = run_quantize(*o); });
}

}  // namespace kvrun
