// grammar-bench: the cost of grammar-constrained sampling's whole-vocabulary mask. Loads a
// vocabulary (any GGUF with tokenizer metadata), compiles a GBNF grammar (or a JSON Schema),
// then walks a text that the grammar accepts token by token, timing the allowed-token mask
// at every step: cold (a fresh constraint, no cached masks) and as generation sees it.
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

#include "common.h"
#include "gguf.h"
#include "grammar.h"
#include "json_schema.h"
#include "text_input.h"

using namespace kvrun;

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

int run(const std::string& vocab_path, const std::string& grammar_path, bool schema,
        const std::string& text) {
    GgufFile file = GgufFile::open(vocab_path);
    auto tok = Tokenizer::from_gguf(file);
    auto t0 = std::chrono::steady_clock::now();
    auto vocab = std::make_shared<GrammarVocab>(*tok);
    const double build_ms = ms_since(t0);
    std::string gbnf = read_file_text(grammar_path);
    if (schema) gbnf = json_schema_to_grammar(nlohmann::ordered_json::parse(gbnf));
    GrammarConstraint c(Grammar::parse(gbnf), vocab);
    const std::vector<TokenId> ids = tok->encode(text, false);
    std::vector<uint8_t> mask(static_cast<size_t>(tok->n_vocab()));
    // As generation sees it: one constraint along the text (accept() throws if it leaves).
    double warm = 0;
    int64_t allowed = 0;
    for (TokenId id : ids) {
        t0 = std::chrono::steady_clock::now();
        c.allowed_mask(mask);
        warm += ms_since(t0);
        for (uint8_t m : mask) allowed += m;
        c.accept(id);
    }
    // Cold: each step's mask from a fresh constraint (nothing cached), replayed to that point.
    double cold = 0, cold_max = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
        GrammarConstraint fresh(Grammar::parse(gbnf), vocab);
        for (size_t j = 0; j < i; ++j) fresh.accept(ids[j]);
        t0 = std::chrono::steady_clock::now();
        fresh.allowed_mask(mask);
        const double ms = ms_since(t0);
        cold += ms;
        cold_max = std::max(cold_max, ms);
    }
    const double n = static_cast<double>(std::max<size_t>(ids.size(), 1));
    fmt::print(
        "vocabulary {} tokens (trie built in {:.1f} ms), {} text tokens, {:.0f} allowed on "
        "average\n",
        tok->n_vocab(), build_ms, ids.size(), double(allowed) / n);
    fmt::print("mask per token: cold {:.2f} ms (max {:.2f}), with the state cache {:.2f} ms\n",
               cold / n, cold_max, warm / n);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"grammar-bench: time the grammar's allowed-token mask along a text"};
    std::string vocab, grammar, text;
    bool schema = false;
    app.add_option("-m,--model", vocab, "GGUF file with a vocabulary")->required();
    app.add_option("-g,--grammar", grammar, "GBNF file (or, with --schema, a JSON Schema file)")
        ->required();
    app.add_flag("--schema", schema, "The grammar file is a JSON Schema");
    app.add_option("-p,--text", text, "A text the grammar accepts")->required();
    CLI11_PARSE(app, argc, argv);
    try {
        return run(vocab, grammar, schema, text);
    } catch (const Error& e) {
        fmt::print(stderr, "grammar-bench: {}\n", e.what());
        return 1;
    }
}
