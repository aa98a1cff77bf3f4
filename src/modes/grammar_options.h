// Constrained generation from the command line and JSON requests: --grammar (GBNF text),
// --grammar-file, --json-schema / --json-schema-file (converted to GBNF), and the JSON request
// fields "grammar" and "json_schema", compiled once into a Grammar that every sequence of the
// request follows.
#pragma once

#include "modes/cli_fwd.h"
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "grammar.h"

namespace kvrun {

struct GrammarOptions {
    std::string grammar, grammar_file, json_schema, json_schema_file;
};

void add_grammar_options(CLI::App* cmd, GrammarOptions& o);

// The grammar the flags give (null when none). Throws Error for an unreadable file or a bad
// grammar, saying which flag it came from.
std::shared_ptr<const Grammar> grammar_from_options(const GrammarOptions& o);

// A JSON request's grammar: its "grammar" field (GBNF text, "" for none) or its "json_schema"
// field (a schema object, or its JSON text) when present, else `fallback` (the command
// line's). `line` is the request's text, read again in order so that a schema's properties
// keep the order they were written in. Throws Error for a field of the wrong type, both
// fields at once, or a bad grammar or schema.
std::shared_ptr<const Grammar> grammar_from_request(const nlohmann::json& request,
                                                    const std::string& line,
                                                    std::shared_ptr<const Grammar> fallback);

// A JSON request's lazy grammar (llama.cpp server's fields): "grammar_lazy": true with
// "grammar_triggers": [{"type": "word" | "pattern" | "pattern_full" | "token", "value": TEXT,
// "token": ID}, ...] (type also as llama.cpp's numbers 1, 2, 3, 0; a token by its id or its
// one-token text; the older {"word": TEXT} too). pattern_full must match all the text so
// far. Empty when not lazy. Throws Error for triggers without grammar_lazy or a grammar, an
// unknown type, a token text that is not one token, an id outside the vocabulary, or a bad
// regex.
GrammarTriggers grammar_triggers_from_request(const nlohmann::json& request, bool has_grammar,
                                              const Tokenizer& tok);

}  // namespace kvrun
