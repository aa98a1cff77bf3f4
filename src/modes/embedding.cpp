// `kvrun embedding`: llama-embedding's command line over compute_embeddings.
#include "embedding.h"

#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <map>
#include <nlohmann/json.hpp>

#include "common.h"
#include "modes/model_options.h"
#include "modes/modes.h"
#include "rerank.h"
#include "text_input.h"

namespace kvrun {
namespace {

struct EmbeddingOptions {
    ModelOptions model;
    std::string prompt, file, pooling, output_format, separator = "\n", rerank_template;
    int normalize = 2;
    bool no_bos = false, parse_special = false;
};

// The prompts: the text split at the separator, empty pieces dropped.
std::vector<std::string> split_prompts(const std::string& text, const std::string& sep) {
    std::vector<std::string> out;
    size_t at = 0;
    while (at <= text.size()) {
        size_t end = sep.empty() ? std::string::npos : text.find(sep, at);
        if (end == std::string::npos) end = text.size();
        std::string piece = text.substr(at, end - at);
        if (!piece.empty() && piece.back() == '\r' && sep == "\n") piece.pop_back();
        if (!piece.empty()) out.push_back(std::move(piece));
        at = end + std::max<size_t>(sep.size(), 1);
    }
    return out;
}

// llama-embedding's text form: each vector on a line (all values for one prompt, the first
// 16 for several; per-token vectors as their first and last three), then, for several
// prompts, the cosine similarity matrix.
void print_text(const std::vector<std::vector<float>>& v, const std::vector<std::string>& prompts,
                Pooling pooling, int normalize) {
    const char* fmt_value = normalize == 0 ? "{:6.0f} " : "{:9.6f} ";
    for (size_t j = 0; j < v.size(); ++j) {
        std::string line = fmt::format("embedding {}: ", j);
        const size_t n = v[j].size();
        if (pooling == Pooling::None && n > 6) {
            for (size_t i = 0; i < 3; ++i) line += fmt::format(fmt::runtime(fmt_value), v[j][i]);
            line += " ... ";
            for (size_t i = n - 3; i < n; ++i)
                line += fmt::format(fmt::runtime(fmt_value), v[j][i]);
        } else {
            const size_t shown = v.size() > 1 ? std::min<size_t>(16, n) : n;
            for (size_t i = 0; i < shown; ++i)
                line += fmt::format(fmt::runtime(fmt_value), v[j][i]);
        }
        fmt::print("{}\n", line);
    }
    if (pooling == Pooling::None || prompts.size() < 2) return;
    fmt::print("\ncosine similarity matrix:\n\n");
    std::string head;
    for (const std::string& p : prompts) head += fmt::format("{:>6.6} ", p);
    fmt::print("{}\n", head);
    for (size_t i = 0; i < v.size(); ++i) {
        std::string row;
        for (size_t j = 0; j < v.size(); ++j)
            row += fmt::format("{:6.2f} ", cosine_similarity(v[i], v[j]));
        fmt::print("{}{:.10}\n", row, prompts[i]);
    }
}

// JSON whose numbers are floats: values print with float precision (9 digits at most).
using FloatJson = nlohmann::basic_json<std::map, std::vector, std::string, bool, std::int64_t,
                                       std::uint64_t, float>;

void print_json(const std::vector<std::vector<float>>& v, const std::string& format) {
    if (format == "array") {
        fmt::print("{}\n", FloatJson(v).dump());
        return;
    }
    FloatJson data = FloatJson::array();
    for (size_t j = 0; j < v.size(); ++j)
        data.push_back({{"object", "embedding"}, {"index", j}, {"embedding", v[j]}});
    FloatJson out = {{"object", "list"}, {"data", std::move(data)}};
    if (format == "json+") {
        std::vector<std::vector<float>> sim(v.size(), std::vector<float>(v.size()));
        for (size_t i = 0; i < v.size(); ++i)
            for (size_t j = 0; j < v.size(); ++j) sim[i][j] = float(cosine_similarity(v[i], v[j]));
        out["cosineSimilarity"] = sim;
    }
    fmt::print("{}\n", out.dump());
}

// --pooling rank: each text is "QUERY<tab>DOCUMENT", scored by a generative judge
// (rerank.h); llama-embedding's "rerank score i: x" lines, or JSON.
int run_rerank(const EmbeddingOptions& o, const std::vector<std::string>& texts,
               const LoadedModel& m) {
    const RerankJudge judge =
        rerank_judge(*m.tokenizer, o.rerank_template.empty() ? kRerankTemplate : o.rerank_template);
    std::vector<std::vector<TokenId>> prompts;
    for (size_t i = 0; i < texts.size(); ++i) {
        const size_t tab = texts[i].find('\t');
        if (tab == std::string::npos)
            throw Error(fmt::format("text {} has no tab between its query and document", i + 1),
                        "--pooling rank reads one \"QUERY<tab>DOCUMENT\" per text");
        prompts.push_back(rerank_tokens(*m.tokenizer, judge, kRerankInstruction,
                                        texts[i].substr(0, tab), texts[i].substr(tab + 1)));
    }
    const auto start = std::chrono::steady_clock::now();
    KvBlockTable table = kv_table_for(*m.backend);
    const std::vector<double> scores = rerank_scores(*m.backend, table, judge, prompts,
                                                     o.model.n_batch, o.model.n_ctx, {"text", 1});
    fmt::print(stderr, "rerank: {} pair(s) on {} ({}), {:.2f} s\n", texts.size(), o.model.model,
               m.device, seconds_since(start));
    if (o.output_format.empty()) {
        for (size_t i = 0; i < scores.size(); ++i)
            fmt::print("rerank score {}: {:8.3f}\n", i, scores[i]);
    } else if (o.output_format == "array") {
        fmt::print("{}\n", nlohmann::json(scores).dump());
    } else {
        nlohmann::json data = nlohmann::json::array();
        for (size_t i = 0; i < scores.size(); ++i)
            data.push_back({{"object", "rerank"}, {"index", i}, {"relevance_score", scores[i]}});
        fmt::print("{}\n", nlohmann::json({{"object", "list"}, {"data", data}}).dump());
    }
    return 0;
}

int run_embedding(EmbeddingOptions o) {
    TextInput in;
    if (!o.prompt.empty()) in.prompt = o.prompt;
    in.file = o.file;
    const std::vector<std::string> texts =
        split_prompts(read_text_input(in), unescape_text(o.separator));
    if (texts.empty()) fail("no prompts to embed (the text is empty between separators)");
    const bool user_ctx = o.model.n_ctx > 0;
    if (!user_ctx) o.model.n_ctx = 4096;  // llama.cpp's default context
    LoadedModel m = load_model(o.model, 1);
    const ModelConfig& cfg = m.backend->config();
    const Pooling pooling =
        o.pooling.empty() ? model_pooling(*m.file) : *pooling_from_name(o.pooling);
    if (pooling == Pooling::Rank) return run_rerank(o, texts, m);
    int32_t max_tokens = o.model.n_ctx;
    if (!user_ctx && cfg.n_ctx_train > 0)
        max_tokens = std::min<int32_t>(max_tokens, cfg.n_ctx_train);
    std::vector<std::vector<TokenId>> prompts;
    for (const std::string& t : texts)
        prompts.push_back(
            m.tokenizer->encode(t, !o.no_bos && m.tokenizer->add_bos(), o.parse_special));
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::vector<float>> v =
        compute_embeddings(*m.backend, prompts, pooling, o.model.n_batch, max_tokens);
    size_t n_tokens = 0;
    for (const auto& p : prompts) n_tokens += p.size();
    fmt::print(stderr,
               "embedding: {} prompt(s), {} tokens on {} ({}), pooling {}, n_embd {}, {:.2f} s\n",
               texts.size(), n_tokens, o.model.model, m.device, pooling_name(pooling), cfg.n_embd,
               seconds_since(start));
    for (std::vector<float>& e : v) normalize_embedding(e, o.normalize);
    if (o.output_format.empty())
        print_text(v, texts, pooling, o.normalize);
    else
        print_json(v, o.output_format);
    return 0;
}

}  // namespace

void add_embedding_command(CLI::App& root, int& exit_code) {
    auto o = std::make_shared<EmbeddingOptions>();
    CLI::App* cmd = root.add_subcommand(
        "embedding",
        "Embed texts (llama-embedding): each prompt's pooled, normalized final hidden state, "
        "with cosine similarities");
    cmd->alias("embed");
    add_model_options(cmd, o->model);
    auto* p = cmd->add_option("-p,--prompt", o->prompt,
                              "Texts to embed, split at --embd-separator (default: one per line)");
    auto* f = cmd->add_option("-f,--file", o->file, "Read the texts from this file")
                  ->check(CLI::ExistingFile);
    p->excludes(f);
    cmd->add_option("--pooling", o->pooling,
                    "none (a vector per token), mean, cls (first token) or last; default: the "
                    "model's pooling_type, none when it has none (as llama.cpp); rank: each "
                    "text is QUERY<tab>DOCUMENT, scored by a yes/no judge such as "
                    "Qwen3-Reranker")
        ->check(CLI::IsMember({"none", "mean", "cls", "last", "rank"}));
    cmd->add_option("--embd-normalize", o->normalize,
                    "-1 none, 0 max-abs to int16 range, 1 taxicab, 2 euclidean, >2 p-norm")
        ->check(CLI::Range(-1, 1000))
        ->capture_default_str();
    cmd->add_option("--embd-output-format", o->output_format,
                    "array (a JSON array of vectors), json (OpenAI's list), json+ (json and the "
                    "cosine similarity matrix); default: text")
        ->check(CLI::IsMember({"", "array", "json", "json+"}));
    cmd->add_option("--embd-separator", o->separator,
                    "Separator of the texts (default: newline; \\n \\t escapes)");
    add_rerank_template_option(cmd, o->rerank_template, "--pooling rank");
    cmd->add_flag("--no-bos", o->no_bos, "Do not add the BOS token");
    cmd->add_flag("--parse-special", o->parse_special, "Recognize special token texts");
    cmd->footer(
        "Without -p or -f the texts come from standard input. An embedding is the model's "
        "final hidden state after its output norm, pooled over each text's tokens. "
        "Vectors go to stdout, the summary line to stderr.");
    cmd->callback([o, &exit_code] { exit_code = run_embedding(*o); });
}

}  // namespace kvrun
