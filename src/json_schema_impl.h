// Internal pieces of the JSON Schema -> GBNF converter (json_schema.cpp): GBNF text helpers
// (json_schema_gbnf.cpp) and the schema-level steps, checks, $ref resolution and allOf
// merging (json_schema_check.cpp). Not for use outside json_schema*.cpp.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace kvrun {

using SchemaJson = nlohmann::ordered_json;

constexpr uint64_t kGbnfUnbounded = std::numeric_limits<uint64_t>::max();

// ---- GBNF text (json_schema_gbnf.cpp) ----

// A fixed rule: its body and the fixed rules it uses (space-separated).
struct GbnfPrimitive {
    std::string_view name, body, uses;
};
// The fixed rule `name` (ws, value, object, array, string, char, escape, number, integer,
// boolean, null, date, time, date-time, uuid), or nullptr.
const GbnfPrimitive* gbnf_primitive(std::string_view name);
bool gbnf_is_primitive(std::string_view name);

// A literal matching exactly `bytes`.
std::string gbnf_literal(std::string_view bytes);
// `atom` repeated a..b times (b may be kGbnfUnbounded); "" when b == 0.
std::string gbnf_repeat(const std::string& atom, uint64_t a, uint64_t b);
// The non-empty parts joined by spaces.
std::string gbnf_seq(std::initializer_list<std::string> parts);
// "( a | b | ... )", or the one alternative alone.
std::string gbnf_alternatives(const std::vector<std::string>& alts);
// A rule name or a single literal: usable in a sequence without a group.
bool gbnf_is_atom(std::string_view expr);
// Integers (as JSON writes them) in [lo, hi]; a side without its has_ flag is open (up to 16
// digits, like the fixed integer rule). Magnitudes must stay within 1e18.
std::string gbnf_integer_range(bool has_lo, int64_t lo, bool has_hi, int64_t hi);
// A JSON string (quotes included) other than each of `names` as JSON text spells it; uses the
// fixed rules char and escape. A name that needs escapes is not excluded (nor is an escaped
// spelling of a plain name).
std::string gbnf_key_excluding(const std::vector<std::string>& names);

// ---- Schemas (json_schema_check.cpp) ----

// The JSON pointer of `token` (or an array index) under `ptr`, RFC 6901 escaped.
std::string schema_child(const std::string& ptr, std::string_view token);
std::string schema_child(const std::string& ptr, size_t index);
// Throws Error "json schema #<ptr>: <what>".
[[noreturn]] void schema_fail(const std::string& ptr, const std::string& what);
// Compact JSON text (invalid UTF-8 replaced).
std::string schema_dump(const SchemaJson& v);
// Does `keyword` change what the converter generates (others only annotate)?
bool schema_is_constraint(std::string_view keyword);

// Checks every subschema of the document (used or not): keyword types, unsupported keywords,
// unresolvable $refs. After it, the converter may trust the shapes of keywords.
void schema_check(const SchemaJson& root);
// The schema a local $ref ("#", "#/$defs/X", any JSON pointer) names; ptr is where the $ref is.
const SchemaJson& schema_resolve(const SchemaJson& root, const std::string& ref,
                                 const std::string& ptr);
// `s` with its $ref (when it has sibling keywords) and allOf parts merged into one schema:
// properties and required united, type intersected, minima/maxima tightened, other
// keywords must agree. Annotations are dropped.
SchemaJson schema_flatten(const SchemaJson& root, const SchemaJson& s, const std::string& ptr);
// The type names `s` allows: its `type`, else those whose keywords it uses (empty: any
// value). "integer" is dropped when "number" is there.
std::vector<std::string> schema_types(const SchemaJson& s);
// A non-negative integer keyword (minItems, ...), or `absent`.
uint64_t schema_count(const SchemaJson& s, const char* key, uint64_t absent);

}  // namespace kvrun
