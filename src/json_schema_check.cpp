// Schema-level steps of the JSON Schema converter (json_schema_impl.h): structural checks
// with JSON-pointer error messages, local $ref resolution, and merging allOf parts (and a
// $ref with sibling keywords) into one schema.
#include <algorithm>
#include <cmath>

#include "common.h"
#include "json_schema_impl.h"

namespace kvrun {

namespace {

// Keyword lists (space-separated). Unsupported: they change what a schema accepts and have
// no GBNF form here. Constraints: the keywords acted on; any other keyword only annotates (or
// is unknown, which JSON Schema says to ignore).
constexpr std::string_view kUnsupported =
    "patternProperties propertyNames minProperties maxProperties contains minContains "
    "maxContains not if then else dependentRequired dependentSchemas dependencies "
    "unevaluatedProperties unevaluatedItems multipleOf $dynamicRef $recursiveRef";
constexpr std::string_view kConstraints =
    "type enum const anyOf oneOf allOf $ref properties required additionalProperties items "
    "prefixItems additionalItems minItems maxItems minLength maxLength format pattern minimum "
    "maximum exclusiveMinimum exclusiveMaximum";
constexpr std::string_view kTypes = "null boolean object array number integer string";

// Is `word` one of the space-separated words of `list`?
bool has_word(std::string_view list, std::string_view word) {
    while (!list.empty()) {
        size_t end = std::min(list.find(' '), list.size());
        if (list.substr(0, end) == word) return true;
        list.remove_prefix(std::min(end + 1, list.size()));
    }
    return false;
}

// Non-negative integer keyword (minItems, maxLength, ...); 2.0 counts as 2.
bool is_count(const SchemaJson& v) {
    if (v.is_number_unsigned()) return true;
    if (v.is_number_integer()) return v.get<int64_t>() >= 0;
    if (v.is_number_float()) {
        double d = v.get<double>();
        return d >= 0 && d < 1e18 && d == std::floor(d);
    }
    return false;
}

SchemaJson intersect_types(const SchemaJson& a, const SchemaJson& b, const std::string& ptr) {
    auto list = [](const SchemaJson& t) {
        return t.is_string() ? std::vector<std::string>{t.get<std::string>()}
                             : t.get<std::vector<std::string>>();
    };
    std::vector<std::string> from_a = list(a), from_b = list(b), both;
    auto has = [](const std::vector<std::string>& l, const char* t) {
        return std::find(l.begin(), l.end(), t) != l.end();
    };
    for (const auto& t : from_a) {
        std::string keep =
            has(from_b, t.c_str()) ? t
            : (t == "integer" && has(from_b, "number")) || (t == "number" && has(from_b, "integer"))
                ? "integer"
                : "";
        if (!keep.empty() && !has(both, keep.c_str())) both.push_back(keep);
    }
    if (both.empty()) schema_fail(ptr, "allOf parts have no type in common");
    return both.size() == 1 ? SchemaJson(both[0]) : SchemaJson(both);
}

// Adds one allOf part's constraints to `out`.
void merge_into(SchemaJson& out, const SchemaJson& part, const std::string& ptr) {
    for (const auto& [k, v] : part.items()) {
        if (!schema_is_constraint(k)) continue;
        if (!out.contains(k)) {
            out[k] = v;
            continue;
        }
        SchemaJson& have = out[k];
        if (k == "type") {
            have = intersect_types(have, v, ptr);
        } else if (k == "properties") {
            for (const auto& [name, sub] : v.items()) {
                if (!have.contains(name)) {
                    have[name] = sub;
                } else if (have[name] != sub) {
                    have[name] = SchemaJson{{"allOf", SchemaJson::array({have[name], sub})}};
                }
            }
        } else if (k == "required") {
            for (const auto& name : v) {
                if (std::find(have.begin(), have.end(), name) == have.end()) {
                    have.push_back(name);
                }
            }
        } else if (k == "minItems" || k == "minLength" || k == "minimum") {
            if (v > have) have = v;
        } else if (k == "maxItems" || k == "maxLength" || k == "maximum") {
            if (v < have) have = v;
        } else if (have != v) {
            if (k == "anyOf" || k == "oneOf") {
                schema_fail(ptr, fmt::format("allOf with more than one \"{}\" part is too "
                                             "complex; write the combinations as one anyOf",
                                             k));
            }
            schema_fail(ptr, fmt::format("allOf parts give different \"{}\" values; merging "
                                         "them is not supported",
                                         k));
        }
    }
}

SchemaJson flatten(const SchemaJson& root, const SchemaJson& s, const std::string& ptr, int depth) {
    if (depth > 32) schema_fail(ptr, "$ref/allOf nested too deeply (a circular $ref?)");
    if (s.is_boolean()) {
        if (s.get<bool>()) return SchemaJson::object();
        schema_fail(ptr, "allOf contains the schema false, which accepts nothing");
    }
    if (!s.contains("$ref") && !s.contains("allOf")) return s;
    SchemaJson own = s;
    own.erase("$ref");
    own.erase("allOf");
    SchemaJson out = SchemaJson::object();
    merge_into(out, own, ptr);
    if (s.contains("$ref")) {
        std::string ref = s["$ref"].get<std::string>();
        merge_into(out, flatten(root, schema_resolve(root, ref, ptr), ref.substr(1), depth + 1),
                   ptr);
    }
    if (s.contains("allOf")) {
        const SchemaJson& parts = s["allOf"];
        for (size_t i = 0; i < parts.size(); ++i) {
            std::string at = schema_child(schema_child(ptr, "allOf"), i);
            merge_into(out, flatten(root, parts[i], at, depth + 1), at);
        }
    }
    return out;
}

// Structural checks of the whole document (every subschema, used or not), so errors
// name the real location of the problem.
void check(const SchemaJson& root, const SchemaJson& s, const std::string& ptr) {
    if (s.is_boolean()) return;
    if (!s.is_object()) {
        schema_fail(ptr,
                    fmt::format("a schema must be an object or a boolean, not {}", s.type_name()));
    }
    for (const auto& item : s.items()) {
        // Named copies, not a structured binding: the lambdas below capture them (clang 14
        // cannot capture a binding).
        const std::string& key = item.key();
        const SchemaJson& v = item.value();
        std::string at = schema_child(ptr, key);
        if (has_word(kUnsupported, key) || (key == "uniqueItems" && v == true)) {
            schema_fail(at, fmt::format("the \"{}\" keyword is not supported", key));
        }
        auto expect = [&](bool ok, const char* what) {
            if (!ok) schema_fail(at, fmt::format("\"{}\" must be {}", key, what));
        };
        auto check_each = [&](const char* what) {
            expect(v.is_array() && !v.empty(), what);
            for (size_t i = 0; i < v.size(); ++i) check(root, v[i], schema_child(at, i));
        };
        if (key == "type") {
            auto known = [](const SchemaJson& t) {
                return t.is_string() && has_word(kTypes, t.get<std::string>());
            };
            const char* what =
                "a type name (null, boolean, object, array, number, integer, "
                "string) or a non-empty array of them";
            expect(
                known(v) || (v.is_array() && !v.empty() && std::all_of(v.begin(), v.end(), known)),
                what);
        } else if (key == "enum") {
            expect(v.is_array() && !v.empty(), "a non-empty array");
        } else if (key == "anyOf" || key == "oneOf" || key == "allOf" || key == "prefixItems") {
            check_each("a non-empty array of schemas");
        } else if (key == "$ref") {
            expect(v.is_string(), "a string");
            schema_resolve(root, v.get<std::string>(), at);
        } else if (key == "properties" || key == "$defs" || key == "definitions") {
            expect(v.is_object(), "an object whose values are schemas");
            for (const auto& [name, sub] : v.items()) check(root, sub, schema_child(at, name));
        } else if (key == "required") {
            expect(v.is_array() && std::all_of(v.begin(), v.end(),
                                               [](const SchemaJson& r) { return r.is_string(); }),
                   "an array of property names");
        } else if (key == "additionalProperties" || key == "additionalItems") {
            check(root, v, at);
        } else if (key == "items") {
            if (v.is_array()) {
                check_each("a schema or a non-empty array of schemas");
            } else {
                check(root, v, at);
            }
        } else if (key == "minItems" || key == "maxItems" || key == "minLength" ||
                   key == "maxLength") {
            // The grammar writes these out as repetitions, which GBNF bounds at 10000.
            expect(is_count(v) && v.get<double>() <= 10000, "a non-negative integer up to 10000");
        } else if (key == "minimum" || key == "maximum") {
            expect(v.is_number(), "a number");
        } else if (key == "exclusiveMinimum" || key == "exclusiveMaximum") {
            expect(v.is_number() || v.is_boolean(), "a number");
        } else if (key == "format") {
            expect(v.is_string(), "a string");
        }
    }
}

}  // namespace

std::string schema_child(const std::string& ptr, std::string_view token) {
    std::string out = ptr + "/";
    for (char c : token) {
        if (c == '~') {
            out += "~0";
        } else if (c == '/') {
            out += "~1";
        } else {
            out += c;
        }
    }
    return out;
}
std::string schema_child(const std::string& ptr, size_t index) {
    return ptr + "/" + std::to_string(index);
}

[[noreturn]] void schema_fail(const std::string& ptr, const std::string& what) {
    fail("json schema #{}: {}", ptr, what);
}

std::string schema_dump(const SchemaJson& v) {
    return v.dump(-1, ' ', false, SchemaJson::error_handler_t::replace);
}

bool schema_is_constraint(std::string_view keyword) {
    return has_word(kConstraints, keyword);
}

std::vector<std::string> schema_types(const SchemaJson& s) {
    std::vector<std::string> types;
    if (s.contains("type")) {
        const SchemaJson& t = s["type"];
        if (t.is_string()) {
            types.push_back(t.get<std::string>());
        } else {
            for (const auto& name : t) types.push_back(name.get<std::string>());
        }
    } else {
        auto uses = [&](std::initializer_list<const char*> keys) {
            return std::any_of(keys.begin(), keys.end(),
                               [&](const char* k) { return s.contains(k); });
        };
        if (uses({"properties", "additionalProperties", "required"})) types.push_back("object");
        if (uses({"items", "prefixItems", "additionalItems", "minItems", "maxItems"})) {
            types.push_back("array");
        }
        if (uses({"minLength", "maxLength", "format", "pattern"})) types.push_back("string");
        if (uses({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) {
            types.push_back("number");
        }
    }
    std::vector<std::string> unique;
    for (const auto& t : types) {
        if (std::find(unique.begin(), unique.end(), t) == unique.end()) unique.push_back(t);
    }
    if (std::find(unique.begin(), unique.end(), "number") != unique.end()) {
        std::erase(unique, "integer");
    }
    return unique;
}

uint64_t schema_count(const SchemaJson& s, const char* key, uint64_t absent) {
    if (!s.contains(key)) return absent;
    const SchemaJson& v = s[key];
    return v.is_number_float() ? static_cast<uint64_t>(v.get<double>()) : v.get<uint64_t>();
}

const SchemaJson& schema_resolve(const SchemaJson& root, const std::string& ref,
                                 const std::string& ptr) {
    if (ref.empty() || ref[0] != '#') {
        schema_fail(ptr, fmt::format("$ref \"{}\": only local references (\"#/$defs/Name\") "
                                     "are supported",
                                     ref));
    }
    if (ref == "#") return root;
    if (ref[1] != '/') {
        schema_fail(ptr, fmt::format("$ref \"{}\": anchors are not supported; use a JSON "
                                     "pointer such as \"#/$defs/Name\"",
                                     ref));
    }
    try {
        SchemaJson::json_pointer pointer(ref.substr(1));
        if (root.contains(pointer)) return root.at(pointer);
    } catch (const nlohmann::json::exception&) {
    }
    schema_fail(ptr, fmt::format("$ref \"{}\" does not point into this schema", ref));
}

SchemaJson schema_flatten(const SchemaJson& root, const SchemaJson& s, const std::string& ptr) {
    return flatten(root, s, ptr, 0);
}

void schema_check(const SchemaJson& root) {
    check(root, root, "");
}

}  // namespace kvrun
