// `kvrun gguf-split` (llama-gguf-split): splits a model into shards of at most N tensors or
// N bytes of tensor data, PREFIX-00001-of-0000N.gguf ... (the first file holds the metadata,
// each file split.no / split.count / split.tensors.count), or merges a split model back into
// one file. Tensors are copied byte for byte (quantize_model with COPY), in llama.cpp's
// write order, through .part files, so a failure or Ctrl-C leaves nothing behind. kvrun
// itself opens a split model by its first file.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <charconv>
#include <chrono>

#include "common.h"
#include "gguf.h"
#include "modes/model_options.h"
#include "modes/modes.h"
#include "quant.h"
#include "quantize_model.h"

namespace kvrun {
namespace {

struct SplitOptions {
    std::string input, output, max_size;
    bool merge = false, split = false, no_tensor_first = false, dry_run = false;
    int64_t max_tensors = 0;
};

// "500M", "2G", "1500000K", "123456" (bytes): decimal units, as llama-gguf-split.
uint64_t parse_size(const std::string& text) {
    uint64_t n = 0;
    const char* end = text.data() + text.size();
    auto [p, ec] = std::from_chars(text.data(), end, n);
    const std::string unit(p, end);
    uint64_t mul = 0;
    if (unit.empty()) mul = 1;
    if (unit == "K" || unit == "k") mul = 1000;
    if (unit == "M" || unit == "m") mul = 1000 * 1000;
    if (unit == "G" || unit == "g") mul = 1000 * 1000 * 1000;
    if (ec != std::errc() || p == text.data() || mul == 0 || n == 0 || n > UINT64_MAX / mul)
        fail("--split-max-size '{}': expected a size like 500M or 2G", text);
    return n * mul;
}

int run_split(const SplitOptions& c) {
    if (c.merge && (c.max_tensors > 0 || !c.max_size.empty() || c.no_tensor_first))
        fail(
            "--merge takes no split limits (--split-max-tensors, --split-max-size, "
            "--no-tensor-first-split)");
    if (!c.max_size.empty() && c.max_tensors > 0)
        fail("give --split-max-tensors or --split-max-size, not both");
    GgufFile in = GgufFile::open(c.input);
    QuantizeOptions o;  // COPY
    if (!c.merge) {
        o.split_max_bytes = c.max_size.empty() ? 0 : parse_size(c.max_size);
        o.split_max_tensors = c.max_size.empty() ? (c.max_tensors > 0 ? c.max_tensors : 128) : 0;
        o.split_no_tensor_first = c.no_tensor_first;
    } else if (in.n_splits() == 1) {
        fmt::print(stderr, "gguf-split: note: {} is not split; writing a copy\n", c.input);
    }
    const std::vector<TensorQuantChoice> plan = plan_quantization(in, o);
    int n_files = 1;
    const std::vector<int> file_of = plan_split(in, plan, o, n_files);
    const std::vector<std::string> paths = split_paths(c.output, n_files);
    std::vector<int64_t> tensors(size_t(n_files), 0);
    std::vector<uint64_t> bytes(size_t(n_files), 0);
    for (size_t i = 0; i < plan.size(); ++i) {
        ++tensors[size_t(file_of[i])];
        bytes[size_t(file_of[i])] += plan[i].tensor->n_bytes;
    }
    for (int k = 0; k < n_files; ++k)
        fmt::print(stderr, "gguf-split: {} {}: {} tensors, {:.2f} MiB of tensor data\n",
                   c.dry_run ? "would write" : "writing", paths[size_t(k)], tensors[size_t(k)],
                   bytes[size_t(k)] / 1048576.0);
    if (c.dry_run) return 0;
    install_interrupt_handler();
    const auto start = std::chrono::steady_clock::now();
    const QuantizeResult r = quantize_model(in, c.output, o, {}, &interrupt_flag());
    fmt::print(stderr,
               "gguf-split: {} ({} file{}) -> {} file{}, {} tensors, {:.2f} MiB, {:.1f} s\n",
               c.input, in.n_splits(), in.n_splits() > 1 ? "s" : "", n_files,
               n_files > 1 ? "s" : "", plan.size(), r.bytes_out / 1048576.0, seconds_since(start));
    return 0;
}

}  // namespace

void add_gguf_split_command(CLI::App& root, int& exit_code) {
    auto o = std::make_shared<SplitOptions>();
    CLI::App* cmd = root.add_subcommand(
        "gguf-split",
        "Split a GGUF model into shards, or merge a split model into one file (llama-gguf-split)");
    cmd->add_option("input", o->input, "The model (for --merge: its first file, ...-00001-of-...)")
        ->required()
        ->check(CLI::ExistingFile);
    cmd->add_option("output", o->output,
                    "Split: the prefix of the shards (PREFIX-00001-of-0000N.gguf); merge: the file")
        ->required();
    auto* split = cmd->add_flag("--split", o->split, "Split the model (the default)");
    auto* merge = cmd->add_flag("--merge", o->merge, "Merge a split model into one file");
    split->excludes(merge);
    cmd->add_option("--split-max-tensors", o->max_tensors, "Tensors per shard (default 128)")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--split-max-size", o->max_size,
                    "Tensor data per shard: N with K, M or G (decimal: 2G = 2e9 bytes); a tensor "
                    "larger than that gets a shard of its own");
    cmd->add_flag("--no-tensor-first-split", o->no_tensor_first,
                  "The first shard holds only the metadata");
    cmd->add_flag("--dry-run", o->dry_run, "Print the shards it would write, write nothing");
    cmd->callback([o, &exit_code] { exit_code = run_split(*o); });
}

}  // namespace kvrun
