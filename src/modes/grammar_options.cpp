// --grammar / --grammar-file and the JSON "grammar" field (see grammar_options.h).
#include "modes/grammar_options.h"

#include <CLI/CLI.hpp>
#include <regex>

#include "common.h"
#include "json_schema.h"
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

std::shared_ptr<const Grammar> compile_schema(const nlohmann::ordered_json& schema,
                                              const std::string& where) {
    std::string gbnf;
    try {
        gbnf = json_schema_to_grammar(schema);
    } catch (const Error& e) {
        fail("{}: {}", where, e.what());
    }
    return compile(gbnf, where);
}

// A schema given as JSON text (flag, file or a string field), parsed keeping member order.
std::shared_ptr<const Grammar> compile_schema_text(const std::string& text,
                                                   const std::string& where) {
    nlohmann::ordered_json schema;
    try {
        schema = nlohmann::ordered_json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        fail("{}: the JSON schema is not valid JSON: {}", where, e.what());
    }
    return compile_schema(schema, where);
}

}  // namespace

void add_grammar_options(CLI::App* cmd, GrammarOptions& o) {
    auto* g = cmd->add_option("--grammar", o.grammar,
                              "Constrain the output to this GBNF grammar (llama.cpp's format; "
                              "the `root` rule starts it)");
    auto* gf =
        cmd->add_option("--grammar-file", o.grammar_file, "Read the GBNF grammar from this file")
            ->check(CLI::ExistingFile)
            ->excludes(g);
    auto* j = cmd->add_option("-j,--json-schema", o.json_schema,
                              "Constrain the output to JSON valid for this JSON Schema (text)")
                  ->excludes(g)
                  ->excludes(gf);
    cmd->add_option("--json-schema-file", o.json_schema_file, "Read the JSON Schema from this file")
        ->check(CLI::ExistingFile)
        ->excludes(g)
        ->excludes(gf)
        ->excludes(j);
}

std::shared_ptr<const Grammar> grammar_from_options(const GrammarOptions& o) {
    if (!o.grammar_file.empty()) return compile(read_file_text(o.grammar_file), o.grammar_file);
    if (!o.grammar.empty()) return compile(o.grammar, "--grammar");
    if (!o.json_schema_file.empty())
        return compile_schema_text(read_file_text(o.json_schema_file), o.json_schema_file);
    if (!o.json_schema.empty()) return compile_schema_text(o.json_schema, "--json-schema");
    return nullptr;
}

std::shared_ptr<const Grammar> grammar_from_request(const nlohmann::json& j,
                                                    const std::string& line,
                                                    std::shared_ptr<const Grammar> fallback) {
    const bool has_schema = j.contains("json_schema") && !j["json_schema"].is_null();
    const bool has_grammar = j.contains("grammar") && !j["grammar"].is_null();
    if (has_schema && has_grammar) fail("give 'grammar' or 'json_schema', not both");
    if (has_schema) {
        const auto& s = j["json_schema"];
        if (s.is_string()) return compile_schema_text(s.get<std::string>(), "'json_schema'");
        if (!s.is_object() && !s.is_boolean())
            fail("'json_schema' must be a JSON Schema object (or its text)");
        // Read the line again keeping member order (a plain json sorted the properties).
        return compile_schema(nlohmann::ordered_json::parse(line)["json_schema"], "'json_schema'");
    }
    if (!has_grammar) return fallback;
    if (!j["grammar"].is_string()) fail("'grammar' must be a string of GBNF rules");
    const std::string text = j["grammar"].get<std::string>();
    if (text.empty()) return nullptr;  // "": this request is unconstrained
    return compile(text, "'grammar'");
}

GrammarTriggers grammar_triggers_from_request(const nlohmann::json& j, bool has_grammar,
                                              const Tokenizer& tok) {
    GrammarTriggers out;
    const bool lazy = j.contains("grammar_lazy") && j["grammar_lazy"].is_boolean() &&
                      j["grammar_lazy"].get<bool>();
    if (j.contains("grammar_lazy") && !j["grammar_lazy"].is_null() &&
        !j["grammar_lazy"].is_boolean())
        fail("'grammar_lazy' must be true or false");
    const bool has_triggers = j.contains("grammar_triggers") && !j["grammar_triggers"].is_null() &&
                              !j["grammar_triggers"].empty();
    if (!lazy) {
        if (has_triggers) fail("'grammar_triggers' need \"grammar_lazy\": true");
        return out;
    }
    if (!has_grammar) fail("'grammar_lazy' needs a 'grammar' or 'json_schema'");
    if (!has_triggers || !j["grammar_triggers"].is_array())
        fail("'grammar_lazy' needs 'grammar_triggers': a list of {{\"type\", \"value\"}}");
    auto bad = [](size_t i) {
        fail(
            "'grammar_triggers'[{}] must be {{\"type\": \"word\", \"pattern\", "
            "\"pattern_full\" or \"token\", \"value\": TEXT}} (a token may give \"token\": ID)",
            i);
    };
    size_t i = 0;
    for (const auto& t : j["grammar_triggers"]) {
        if (!t.is_object()) bad(i);
        std::string type;
        if (t.contains("word") && t["word"].is_string() && !t.contains("type")) {
            type = "word";  // llama.cpp's older form
        } else if (t.contains("type") && t["type"].is_string()) {
            type = t["type"].get<std::string>();
        } else if (t.contains("type") && t["type"].is_number_integer()) {
            const int64_t n = t["type"].get<int64_t>();
            type = n == 0   ? "token"
                   : n == 1 ? "word"
                   : n == 2 ? "pattern"
                   : n == 3 ? "pattern_full"
                            : "?";
        }
        const std::string value =
            t.contains("value") && t["value"].is_string() ? t["value"].get<std::string>()
            : t.contains("word") && t["word"].is_string() ? t["word"].get<std::string>()
                                                          : std::string();
        if (type == "token") {
            TokenId id = -1;
            if (t.contains("token") && t["token"].is_number_integer()) {
                const int64_t n = t["token"].get<int64_t>();
                if (n < 0 || n >= tok.n_vocab())
                    fail("'grammar_triggers'[{}]: token {} is outside the vocabulary (0..{})", i, n,
                         tok.n_vocab() - 1);
                id = TokenId(n);
            } else {
                const std::vector<TokenId> ids = tok.encode(value, false, true);
                if (ids.size() != 1)
                    fail("'grammar_triggers'[{}]: '{}' is not one token of the vocabulary", i,
                         value);
                id = ids[0];
            }
            out.tokens.push_back(id);
        } else if (type == "word" || type == "pattern" || type == "pattern_full") {
            if (value.empty()) fail("'grammar_triggers'[{}] needs a non-empty \"value\"", i);
            if (type == "word") {
                out.words.push_back(value);
            } else {
                try {
                    std::regex check(value, std::regex::ECMAScript);
                } catch (const std::regex_error& e) {
                    fail("'grammar_triggers'[{}]: '{}' is not a valid regex: {}", i, value,
                         e.what());
                }
                (type == "pattern" ? out.patterns : out.patterns_full).push_back(value);
            }
        } else {
            bad(i);
        }
        ++i;
    }
    return out;
}

}  // namespace kvrun
