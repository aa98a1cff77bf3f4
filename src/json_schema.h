// JSON Schema -> GBNF: the grammar behind `--json-schema` (llama.cpp) and a server's
// `json_schema` field. The grammar's sentences are the JSON texts a schema accepts (within
// the supported subset, listed at the top of json_schema.cpp), so Grammar::parse of the
// result constrains generation to valid output.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kvrun {

// GBNF text (root rule "root") whose sentences are exactly the JSON texts valid for `schema`
// (within the supported subset), with bounded optional whitespace between tokens and none
// before or after the value. Throws Error naming the JSON pointer ("#/properties/x/pattern")
// of the first unsupported or invalid construct.
// Objects keep their members in the schema's `properties` order: pass an ordered_json (e.g.
// nlohmann::ordered_json::parse(text)) to keep the order the schema was written in; a plain
// nlohmann::json has already sorted the keys alphabetically.
std::string json_schema_to_grammar(const nlohmann::ordered_json& schema);
std::string json_schema_to_grammar(const nlohmann::json& schema);

// The same rules with the schema's own rule named `rule` (lower-case letters, digits and
// '-'; not "root" nor a fixed rule's name such as "ws" or "string") and no root rule: for a
// grammar that embeds such JSON in more text, its caller adding `root ::= ... rule ...` and
// its own rules named in `reserved`. Other rule names never collide with those.
std::string json_schema_to_grammar_rule(const nlohmann::ordered_json& schema,
                                        const std::string& rule,
                                        const std::vector<std::string>& reserved = {});

// Several such rules from one schema: rule `name` for the subschema each $ref ("#/$defs/x")
// points to, with the helper rules they share written once (refs between them allowed).
std::string json_schema_to_grammar_rules(
    const nlohmann::ordered_json& root,
    const std::vector<std::pair<std::string, std::string>>& rules,
    const std::vector<std::string>& reserved = {});

}  // namespace kvrun
