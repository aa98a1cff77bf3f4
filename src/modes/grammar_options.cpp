// --grammar / --grammar-file and the JSON "grammar" field (see grammar_options.h).
#include "modes/grammar_options.h"

#include "common.h"
#include "text_input.h"

namespace kvrun {

namespace {

std::shared_ptr<const Grammar> compile(const std::string& text, const std::string& where) {
    try {
        return Grammar::parse(text);
    } catch (const Error& e) {
        throw Error(fmt::format("{}: {}", where, e.what()),
                    "the format is llama.cpp's GBNF: `root ::= ...` plus any rules it uses");
    }
}

}  // namespace

void add_grammar_options(CLI::App* cmd, GrammarOptions& o) {
    auto* g = cmd->add_option("--grammar", o.grammar,
                              "Constrain the output to this GBNF grammar (llama.cpp's format; "
                              "the `root` rule starts it)");
    cmd->add_option("--grammar-file", o.grammar_file, "Read the GBNF grammar from this file")
        ->check(CLI::ExistingFile)
        ->excludes(g);
}

std::shared_ptr<const Grammar> grammar_from_options(const GrammarOptions& o) {
    if (!o.grammar_file.empty()) return compile(read_file_text(o.grammar_file), o.grammar_file);
    if (!o.grammar.empty()) return compile(o.grammar, "--grammar");
    return nullptr;
}

std::shared_ptr<const Grammar> grammar_from_request(const nlohmann::json& j,
                                                    std::shared_ptr<const Grammar> fallback) {
    if (!j.contains("grammar") || j["grammar"].is_null()) return fallback;
    if (!j["grammar"].is_string()) fail("'grammar' must be a string of GBNF rules");
    const std::string text = j["grammar"].get<std::string>();
    if (text.empty()) return nullptr;  // "": this request is unconstrained
    return compile(text, "'grammar'");
}

}  // namespace kvrun
