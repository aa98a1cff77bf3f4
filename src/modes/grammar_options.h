// Constrained generation from the command line and JSON requests: --grammar (GBNF text),
// --grammar-file, and the JSON request field "grammar", compiled once into a Grammar that
// every sequence of the request follows.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "grammar.h"

namespace kvrun {

struct GrammarOptions {
    std::string grammar, grammar_file;
};

void add_grammar_options(CLI::App* cmd, GrammarOptions& o);

// The grammar the flags give (null when none). Throws Error for an unreadable file or a bad
// grammar, saying which flag it came from.
std::shared_ptr<const Grammar> grammar_from_options(const GrammarOptions& o);

// A JSON request's grammar: its "grammar" field (GBNF text) when present, else `fallback`
// (the command line's). Throws Error for a field of the wrong type or a bad grammar.
std::shared_ptr<const Grammar> grammar_from_request(const nlohmann::json& request,
                                                    std::shared_ptr<const Grammar> fallback);

}  // namespace kvrun
