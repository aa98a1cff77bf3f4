// `kvrun cvector-generator`: llama-cvector-generator. Reads pairs of prompts (line i of the
// positive file with line i of the negative file), takes the difference of their last tokens'
// layer outputs (CPU or CUDA backend), and writes the per-layer directions as a control vector for
// --control-vector / --control-vector-scaled (cvector_generator.h).
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <sstream>

#include "cvector_generator.h"
#include "model_config.h"
#include "modes/model_options.h"
#include "modes/modes.h"
#include "text_input.h"

namespace kvrun {
namespace {

struct CvectorOptions {
    ModelOptions model;
    std::string positive_file, negative_file, output = "control_vector.gguf", method = "pca";
    int32_t pca_iterations = 1000;
};

// One prompt per non-empty line; "\n" and the other typed escapes become the characters.
std::vector<std::string> read_prompts(const std::string& path) {
    const std::string text = read_file_text(path);
    utf8_require_valid(text, path);
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (!line.empty()) out.push_back(unescape_text(line));
    }
    if (out.empty()) throw Error(fmt::format("{}: no prompts (one per line)", path));
    return out;
}

int run_cvector(CvectorOptions o) {
    const std::vector<std::string> pos = read_prompts(o.positive_file);
    const std::vector<std::string> neg = read_prompts(o.negative_file);
    if (pos.size() != neg.size())
        throw Error(
            fmt::format("{} has {} prompts but {} has {}: line i of one pairs with line "
                        "i of the other",
                        o.positive_file, pos.size(), o.negative_file, neg.size()));
    LoadedModel m = load_model(o.model, 1);
    const Tokenizer& tok = *m.tokenizer;
    auto encode = [&](const std::vector<std::string>& texts) {
        std::vector<std::vector<TokenId>> ids;
        for (const std::string& t : texts) ids.push_back(tok.encode(t, tok.add_bos(), true));
        return ids;
    };
    int32_t max_tokens = o.model.n_ctx;
    if (max_tokens <= 0) max_tokens = static_cast<int32_t>(m.backend->config().n_ctx_train);
    if (max_tokens <= 0) max_tokens = 4096;
    fmt::print(stderr, "cvector-generator: {} on {}: {} prompt pairs, method {}\n", o.model.model,
               m.device, pos.size(), o.method);
    const auto diffs =
        cvector_differences(*m.backend, encode(pos), encode(neg), o.model.n_batch, max_tokens);
    const auto dirs = cvector_directions(
        diffs, o.method == "mean" ? CvectorMethod::Mean : CvectorMethod::Pca, o.pca_iterations);
    cvector_write(o.output, dirs, m.file->get_string_or("general.architecture", ""));
    fmt::print(stderr, "cvector-generator: {} layer directions -> {}\n", dirs.size() - 1, o.output);
    return 0;
}

}  // namespace

void add_cvector_command(CLI::App& root, int& exit_code) {
    auto o = std::make_shared<CvectorOptions>();
    CLI::App* cmd =
        root.add_subcommand("cvector-generator",
                            "Make a control vector from pairs of positive and negative prompts "
                            "(llama-cvector-generator)");
    cmd->alias("cvector");
    add_model_options(cmd, o->model);
    cmd->add_option("--positive-file", o->positive_file,
                    "Positive prompts, one per line (\\n for a newline)")
        ->required()
        ->check(CLI::ExistingFile);
    cmd->add_option("--negative-file", o->negative_file,
                    "Negative prompts, line i pairing with line i of --positive-file")
        ->required()
        ->check(CLI::ExistingFile);
    cmd->add_option("-o,--output", o->output, "The control vector GGUF")->capture_default_str();
    cmd->add_option("--method", o->method,
                    "pca: each layer's first principal direction of the differences (unit "
                    "length); mean: their mean")
        ->check(CLI::IsMember({"pca", "mean"}))
        ->capture_default_str();
    cmd->add_option("--pca-iter", o->pca_iterations, "Power iterations of pca at most")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    cmd->callback([o, &exit_code] { exit_code = run_cvector(*o); });
}

}  // namespace kvrun
