// JSON Schema -> GBNF conversion (see json_schema.h): walks the schema and writes one rule
// per $ref target, per property/item schema that needs one, plus the fixed rules it uses.
//
// Supported
//   true / {}: any JSON value. type: a name or an array of names. const, enum: each value
//   as the exact text of its compact dump. anyOf / oneOf: alternatives (keywords beside
//   them apply to each). allOf, and $ref with sibling keywords: merged into one schema
//   (json_schema_check.cpp). $ref: "#", "#/$defs/X", "#/definitions/X" or any JSON pointer
//   into the document; recursive references work (one rule per target).
//   Objects: properties in the order given, required ones mandatory, optional ones may be
//   left out; additionalProperties as llama.cpp does it: with `properties` and no
//   additionalProperties no other member is allowed, with neither any member is; extra
//   members come after the declared ones and never reuse a declared name.
//   Arrays: items, prefixItems (draft-7: items as an array, additionalItems), minItems,
//   maxItems. Strings: minLength, maxLength; format date, time, date-time, uuid (RFC 3339
//   and RFC 4122 shapes; other formats annotate only); pattern, a regular expression found
//   anywhere in the string unless anchored with ^ / $ (literals, ., classes with ranges and
//   negation, \d \w \s and their negations, groups, (?:...), |, * + ? {n} {n,} {n,m}; the
//   characters it allows are matched as JSON writes them: a quote as \", a tab as \t). Integers:
//   minimum, maximum and the exclusive forms (bounds up to 1e18 in magnitude), as digit patterns.
// Stricter than JSON Schema
//   No whitespace before or after the value; between tokens, none, one space, or a newline
//   and up to 20 spaces/tabs. Numbers: up to 16 integer digits (unless a bound needs more),
//   16 fraction digits, 3 exponent digits. A schema without `type` accepts only the types
//   whose keywords it uses (as llama.cpp). const/enum values have one spelling.
// Looser than JSON Schema
//   number ignores minimum/maximum; oneOf does not check "exactly one"; an extra member may
//   use an escaped spelling of a declared name; \u escapes are not checked for surrogates.
// Refused with an Error naming the JSON pointer
//   patterns with backreferences, lookarounds, \b or non-ASCII classes, and a pattern with
//   minLength/maxLength or a format; patternProperties, propertyNames, min/maxProperties,
//   uniqueItems: true,
//   contains, not, if/then/else, dependent*, unevaluated*, multipleOf; remote and anchor
//   $refs; allOf parts that disagree; malformed keywords. Unknown keywords are ignored.
#include "json_schema.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common.h"
#include "json_schema_impl.h"

namespace kvrun {

namespace {

uint64_t minus(uint64_t b, uint64_t x) {
    return b == kGbnfUnbounded ? b : b - std::min(b, x);
}

// Converts one schema document. Rules are named after properties and definitions; fixed
// rules (json_schema_gbnf.cpp) are added when first used.
class Converter {
  public:
    // top: the name of the schema's own rule ("root", or another when the caller embeds it).
    Converter(const SchemaJson& root, const std::string& top,
              const std::vector<std::string>& reserved = {})
        : root_(root) {
        taken_.insert("root");
        taken_.insert(top);
        taken_.insert(reserved.begin(), reserved.end());
        ref_rules_["#"] = top;
    }

    std::string run() {
        schema_check(root_);
        rules_.push_back({ref_rules_["#"], ""});
        rules_[0].second = visit(root_, "", "");
        return text();
    }

    // Rule `name` for each (name, $ref into the root) in `named` (json_schema_to_grammar_rules).
    std::string run(const std::vector<std::pair<std::string, std::string>>& named) {
        schema_check(root_);
        ref_rules_.erase("#");  // (no rule holds the root itself)
        for (const auto& [name, ref] : named) {
            if (ref_rules_.count(ref)) fail("json_schema_to_grammar_rules: '{}' twice", ref);
            taken_.insert(name);
            ref_rules_[ref] = name;
        }
        for (const auto& [name, ref] : named) {
            const size_t slot = rules_.size();
            rules_.push_back({name, ""});
            rules_[slot].second = visit(schema_resolve(root_, ref, ""), ref.substr(1), name);
        }
        return text();
    }

  private:
    std::string text() const {
        std::string out;
        for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
        return out;
    }

    // The rule for a $ref target (created on first use, before its body, so recursive
    // references find it).
    std::string ref_rule(const std::string& ref, const std::string& ptr) {
        if (auto it = ref_rules_.find(ref); it != ref_rules_.end()) return it->second;
        const SchemaJson& target = schema_resolve(root_, ref, ptr);
        std::string last = ref.substr(ref.rfind('/') + 1);
        std::string name = unique_name(last);
        ref_rules_[ref] = name;
        size_t slot = rules_.size();
        rules_.push_back({name, ""});
        std::string body = visit(target, ref.substr(1), name);
        rules_[slot].second = body;
        return name;
    }

    std::string unique_name(const std::string& hint) {
        std::string base;
        for (char c : hint) {
            bool ok = std::isalnum(static_cast<unsigned char>(c));
            if (ok || (!base.empty() && base.back() != '-')) base += ok ? c : '-';
        }
        while (!base.empty() && base.back() == '-') base.pop_back();
        if (base.empty()) base = "r";
        std::string name = base;
        for (int n = 1; taken_.count(name) || gbnf_is_primitive(name); ++n) {
            name = base + "-" + std::to_string(n);
        }
        taken_.insert(name);
        return name;
    }

    std::string add_rule(const std::string& hint, const std::string& body) {
        std::string name = unique_name(hint);
        rules_.push_back({name, body});
        return name;
    }

    // `expr` as something usable in a sequence: itself when it is a rule name or a literal,
    // else a new rule.
    std::string rule_for(const std::string& expr, const std::string& hint) {
        if (gbnf_is_atom(expr)) return expr;
        return add_rule(hint, expr);
    }

    // Emits a fixed rule (and those it uses) once; returns its name.
    std::string primitive(std::string_view name) {
        if (primitives_.insert(std::string(name)).second) {
            const GbnfPrimitive* p = gbnf_primitive(name);
            rules_.push_back({std::string(name), std::string(p->body)});
            std::string_view uses = p->uses;
            while (!uses.empty()) {
                size_t end = std::min(uses.find(' '), uses.size());
                primitive(uses.substr(0, end));
                uses.remove_prefix(std::min(end + 1, uses.size()));
            }
        }
        return std::string(name);
    }

    static std::string join_hint(const std::string& hint, const std::string& part) {
        return hint.empty() ? part : hint + "-" + part;
    }

    // A GBNF expression for the values `s` accepts (a rule name, literal, group or sequence).
    std::string visit(const SchemaJson& s, const std::string& ptr, const std::string& hint) {
        if (s.is_boolean()) {
            if (s.get<bool>()) return primitive("value");
            schema_fail(ptr, "the schema false accepts no value here");
        }
        if (s.contains("$ref")) {
            bool alone = std::none_of(s.items().begin(), s.items().end(), [](const auto& kv) {
                return kv.key() != "$ref" && schema_is_constraint(kv.key());
            });
            if (alone) return ref_rule(s["$ref"].get<std::string>(), schema_child(ptr, "$ref"));
            return visit(schema_flatten(root_, s, ptr), ptr, hint);
        }
        if (s.contains("allOf")) return visit(schema_flatten(root_, s, ptr), ptr, hint);
        for (const char* key : {"anyOf", "oneOf"}) {
            if (s.contains(key)) return visit_alternatives(s, key, ptr, hint);
        }
        if (s.contains("const")) return gbnf_literal(schema_dump(s["const"]));
        if (s.contains("enum")) {
            std::vector<std::string> alts;
            for (const auto& v : s["enum"]) {
                std::string lit = gbnf_literal(schema_dump(v));
                if (std::find(alts.begin(), alts.end(), lit) == alts.end()) alts.push_back(lit);
            }
            return gbnf_alternatives(alts);
        }
        std::vector<std::string> types = schema_types(s);
        if (types.empty()) return primitive("value");
        std::vector<std::string> alts;
        for (const auto& type : types) {
            std::string expr =
                visit_typed(s, type, ptr, types.size() == 1 ? hint : join_hint(hint, type));
            alts.push_back(types.size() == 1 ? expr : rule_for(expr, join_hint(hint, type)));
        }
        return gbnf_alternatives(alts);
    }

    // anyOf / oneOf: each alternative, merged with the keywords beside it.
    std::string visit_alternatives(const SchemaJson& s, const char* key, const std::string& ptr,
                                   const std::string& hint) {
        SchemaJson siblings = SchemaJson::object();
        for (const auto& [k, v] : s.items()) {
            if (k != key && schema_is_constraint(k)) siblings[k] = v;
        }
        std::string at = schema_child(ptr, key);
        std::vector<std::string> alts;
        const SchemaJson& list = s[key];
        for (size_t i = 0; i < list.size(); ++i) {
            const SchemaJson& alt = list[i];
            if (alt == false) continue;  // accepts nothing: adds no alternative
            std::string alt_hint = join_hint(hint, std::string(key) + std::to_string(i));
            std::string expr;
            if (siblings.empty()) {
                expr = visit(alt, schema_child(at, i), alt_hint);
            } else {
                SchemaJson both = {{"allOf", SchemaJson::array({siblings, alt})}};
                expr = visit(schema_flatten(root_, both, schema_child(at, i)), schema_child(at, i),
                             alt_hint);
            }
            std::string rule = rule_for(expr, alt_hint);
            if (std::find(alts.begin(), alts.end(), rule) == alts.end()) alts.push_back(rule);
        }
        if (alts.empty()) schema_fail(at, "every alternative is the schema false");
        return gbnf_alternatives(alts);
    }

    std::string visit_typed(const SchemaJson& s, const std::string& type, const std::string& ptr,
                            const std::string& hint) {
        if (type == "null" || type == "boolean" || type == "number") return primitive(type);
        if (type == "integer") return integer_expr(s, ptr);
        if (type == "string") return string_expr(s, ptr);
        if (type == "object") return object_expr(s, ptr, hint);
        return array_expr(s, ptr, hint);
    }

    std::string string_expr(const SchemaJson& s, const std::string& ptr) {
        bool has_length = s.contains("minLength") || s.contains("maxLength");
        std::string format = s.value("format", "");
        if (s.contains("pattern")) {
            const std::string at = schema_child(ptr, "pattern");
            if (!s["pattern"].is_string()) schema_fail(at, "must be a string");
            if (has_length || s.contains("format"))
                schema_fail(at,
                            "a pattern together with minLength/maxLength or a format is not "
                            "supported");
            return gbnf_seq(
                {R"("\"")", pattern_expr(s["pattern"].get<std::string>(), at), R"("\"")"});
        }
        if (format == "date" || format == "time" || format == "date-time" || format == "uuid") {
            if (has_length) {
                schema_fail(ptr, fmt::format("minLength/maxLength together with format \"{}\" "
                                             "are not supported",
                                             format));
            }
            return gbnf_seq({R"("\"")", primitive(format), R"("\"")"});
        }
        if (!has_length) return primitive("string");
        uint64_t lo = schema_count(s, "minLength", 0),
                 hi = schema_count(s, "maxLength", kGbnfUnbounded);
        if (lo > hi) {
            schema_fail(ptr, fmt::format("minLength {} is larger than maxLength {}", lo, hi));
        }
        return gbnf_seq({R"("\"")", gbnf_repeat(primitive("char"), lo, hi), R"("\"")"});
    }

    // ---- pattern: a regular expression over the string's characters, as JSON text ----

    // A GBNF class of the ASCII characters `set` holds (those JSON writes plainly), each as
    // \xHH, or "" when none; with `negate`, [^...] of them and of what JSON must escape.
    static std::string ascii_class(const std::vector<bool>& set, bool negate) {
        std::string body;
        for (int c = 0; c < 128; ++c) {
            const bool plain = c >= 0x20 && c != '"' && c != '\\';
            if (set[size_t(c)] && (plain || negate)) body += fmt::format("\\x{:02X}", c);
        }
        if (negate) return "[^" + body + "\"\\\\\\x00-\\x1F]";
        return body.empty() ? "" : "[" + body + "]";
    }

    // The characters of `set` (ASCII; with `negate`, all but those), as JSON text: a class
    // for the plain ones and the escaped spellings of a quote, a backslash and \t \n \r.
    std::string ascii_set_expr(const std::vector<bool>& set, bool negate) {
        std::vector<std::string> alts;
        if (std::string cls = ascii_class(set, negate); !cls.empty()) alts.push_back(cls);
        const std::pair<int, const char*> escaped[] = {
            {'"', "\\\""}, {'\\', "\\\\"}, {'\t', "\\t"}, {'\n', "\\n"}, {'\r', "\\r"}};
        for (const auto& [c, text] : escaped)
            if (set[size_t(c)] != negate) alts.push_back(gbnf_literal(text));
        if (alts.empty()) return "";
        return gbnf_alternatives(alts);
    }

    // \d \w \s (and the upper-case negations) as a set; false for another letter.
    static bool class_escape(char e, std::vector<bool>& set, bool& negate) {
        negate = e == 'D' || e == 'W' || e == 'S';
        const char lower = char(std::tolower(static_cast<unsigned char>(e)));
        if (lower != 'd' && lower != 'w' && lower != 's') return false;
        for (int c = 0; c < 128; ++c) {
            const bool digit = c >= '0' && c <= '9';
            const bool word = digit || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
            const bool space =
                c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
            if (lower == 'd' ? digit : lower == 'w' ? word : space) set[size_t(c)] = true;
        }
        return true;
    }

    std::string pattern_expr(const std::string& pattern, const std::string& ptr) {
        std::string_view p = pattern;
        bool head = false, tail = false;
        if (!p.empty() && p.front() == '^') head = true, p.remove_prefix(1);
        if (!p.empty() && p.back() == '$' && (p.size() < 2 || p[p.size() - 2] != '\\'))
            tail = true, p.remove_suffix(1);
        size_t i = 0;
        int depth = 0;
        auto bad = [&](const std::string& what) {
            schema_fail(ptr, fmt::format("{} (at offset {} of the pattern) is not supported", what,
                                         i + (head ? 1 : 0)));
        };
        // The escape after a backslash (outside a class): a set, or a literal byte.
        std::function<std::string()> alternation;
        auto literal_char = [&](unsigned char c) -> std::string {
            std::vector<bool> set(128, false);
            if (c < 128) {
                set[c] = true;
                std::string e = ascii_set_expr(set, false);
                if (e.empty()) bad("a control character");
                return e;
            }
            return gbnf_literal(std::string(1, char(c)));  // (a UTF-8 byte, as JSON writes it)
        };
        auto atom = [&]() -> std::string {
            const char c = p[i];
            if (c == '(') {
                if (++depth > 64) bad("groups nested more than 64 deep");
                ++i;
                if (p.substr(i, 2) == "?:") {
                    i += 2;
                } else if (i < p.size() && p[i] == '?') {
                    bad("a lookaround or named group");
                }
                std::string inner = alternation();
                if (i >= p.size() || p[i] != ')') bad("an unclosed group");
                ++i;
                --depth;
                return "(" + (inner.empty() ? std::string("\"\"") : inner) + ")";
            }
            if (c == '.') {
                ++i;
                return primitive("char");
            }
            if (c == '[') {
                ++i;
                const bool negate = i < p.size() && p[i] == '^';
                if (negate) ++i;
                std::vector<bool> set(128, false);
                bool first = true;
                while (i < p.size() && (p[i] != ']' || first)) {
                    first = false;
                    unsigned char lo = static_cast<unsigned char>(p[i]);
                    if (lo == '\\' && i + 1 < p.size()) {
                        std::vector<bool> sub(128, false);
                        bool neg = false;
                        if (class_escape(p[i + 1], sub, neg)) {
                            if (neg) bad("a negated class escape inside a class");
                            for (size_t k = 0; k < 128; ++k) set[k] = set[k] || sub[k];
                            i += 2;
                            continue;
                        }
                        const char e = p[i + 1];
                        lo = static_cast<unsigned char>(e == 'n'   ? '\n'
                                                        : e == 't' ? '\t'
                                                        : e == 'r' ? '\r'
                                                                   : e);
                        i += 2;
                    } else {
                        ++i;
                    }
                    unsigned char hi = lo;
                    if (i + 1 < p.size() && p[i] == '-' && p[i + 1] != ']') {
                        hi = static_cast<unsigned char>(p[i + 1]);
                        if (hi == '\\' && i + 2 < p.size())
                            hi = static_cast<unsigned char>(p[++i + 1]);
                        i += 2;
                    }
                    if (lo >= 128 || hi >= 128) bad("a class with non-ASCII characters");
                    if (hi < lo) bad("a class range that runs backwards");
                    for (int k = lo; k <= hi; ++k) set[size_t(k)] = true;
                }
                if (i >= p.size()) bad("an unclosed class");
                ++i;
                const std::string e = ascii_set_expr(set, negate);
                if (e.empty()) bad("an empty class");
                return e;
            }
            if (c == '\\') {
                if (i + 1 >= p.size()) bad("a trailing backslash");
                const char e = p[i + 1];
                i += 2;
                std::vector<bool> set(128, false);
                bool negate = false;
                if (class_escape(e, set, negate)) return ascii_set_expr(set, negate);
                if (std::isdigit(static_cast<unsigned char>(e))) bad("a backreference");
                if (e == 'b' || e == 'B') bad("a word boundary");
                if (e == 'n') return literal_char('\n');
                if (e == 't') return literal_char('\t');
                if (e == 'r') return literal_char('\r');
                if (std::isalpha(static_cast<unsigned char>(e))) bad(std::string("\\") + e);
                return literal_char(static_cast<unsigned char>(e));
            }
            if (c == '^' || c == '$') bad("an anchor inside the pattern");
            if (c == '*' || c == '+' || c == '?' || c == '{')
                bad("a quantifier with nothing before it");
            ++i;
            return literal_char(static_cast<unsigned char>(c));
        };
        auto sequence = [&]() {
            std::string out;
            while (i < p.size() && p[i] != '|' && p[i] != ')') {
                std::string a = atom();
                uint64_t lo = 1, hi = 1;
                if (i < p.size() && (p[i] == '*' || p[i] == '+' || p[i] == '?')) {
                    lo = p[i] == '+' ? 1 : 0;
                    hi = p[i] == '?' ? 1 : kGbnfUnbounded;
                    ++i;
                } else if (i < p.size() && p[i] == '{') {
                    const size_t close = p.find('}', i);
                    if (close == std::string_view::npos) bad("an unclosed {m,n}");
                    const std::string body(p.substr(i + 1, close - i - 1));
                    const size_t comma = body.find(',');
                    try {
                        lo = std::stoull(body.substr(0, comma));
                        hi = comma == std::string::npos ? lo
                             : comma + 1 == body.size() ? kGbnfUnbounded
                                                        : std::stoull(body.substr(comma + 1));
                    } catch (const std::exception&) {
                        bad("a malformed {m,n}");
                    }
                    if (hi < lo || lo > 10000 || (hi != kGbnfUnbounded && hi > 10000))
                        bad("a {m,n} out of range (up to 10000)");
                    i = close + 1;
                }
                if (lo != 1 || hi != 1) {
                    if (i < p.size() && (p[i] == '?' || p[i] == '+')) ++i;  // lazy, possessive
                    a = gbnf_repeat(gbnf_is_atom(a) ? a : "(" + a + ")", lo, hi);
                    if (a.empty()) a = "\"\"";
                }
                out += (out.empty() ? "" : " ") + a;
            }
            return out;
        };
        alternation = [&]() {
            std::vector<std::string> alts = {sequence()};
            while (i < p.size() && p[i] == '|') {
                ++i;
                alts.push_back(sequence());
            }
            for (std::string& a : alts)
                if (a.empty()) a = "\"\"";
            return gbnf_alternatives(alts);
        };
        std::string body = alternation();
        if (i < p.size()) bad("an unmatched )");
        // JSON Schema's pattern is a search: unanchored sides take any characters.
        const std::string any = primitive("char") + "*";
        return gbnf_seq({head ? "" : any, "(" + body + ")", tail ? "" : any});
    }

    // Integers, with minimum/maximum (and their exclusive forms) enforced.
    std::string integer_expr(const SchemaJson& s, const std::string& ptr) {
        constexpr double kLimit = 1e18;
        bool has_lo = false, has_hi = false;
        int64_t lo = 0, hi = 0;
        auto bound = [&](const char* key, bool lower, bool exclusive) {
            if (!s.contains(key) || s[key].is_boolean()) return;
            double v = s[key].get<double>();
            if (!(std::fabs(v) <= kLimit)) {
                schema_fail(schema_child(ptr, key),
                            fmt::format("{} {} is out of the supported range "
                                        "(magnitudes up to 1e18)",
                                        key, schema_dump(s[key])));
            }
            // exclusive draft-4 style: "exclusiveMinimum": true next to "minimum".
            bool excl = exclusive || s.value(lower ? "exclusiveMinimum" : "exclusiveMaximum",
                                             SchemaJson(false)) == true;
            auto b = static_cast<int64_t>(lower ? std::ceil(v) : std::floor(v));
            if (excl && static_cast<double>(b) == v) b += lower ? 1 : -1;
            int64_t& target = lower ? lo : hi;
            bool& has = lower ? has_lo : has_hi;
            target = !has ? b : lower ? std::max(target, b) : std::min(target, b);
            has = true;
        };
        bound("minimum", true, false);
        bound("exclusiveMinimum", true, true);
        bound("maximum", false, false);
        bound("exclusiveMaximum", false, true);
        if (!has_lo && !has_hi) return primitive("integer");
        if (has_lo && has_hi && lo > hi) {
            schema_fail(ptr, fmt::format("no integer lies between the minimum {} and the "
                                         "maximum {}",
                                         lo, hi));
        }
        return gbnf_integer_range(has_lo, lo, has_hi, hi);
    }

    // Objects: the declared members in order (a required one always, an optional one
    // maybe), then any additional members. A comma goes before every member but the first
    // present one: while no member has appeared yet, each optional member is either the
    // first (and the rest follow with commas) or absent (and the choice moves on).
    std::string object_expr(const SchemaJson& s, const std::string& ptr, const std::string& hint) {
        const SchemaJson no_props = SchemaJson::object();
        const SchemaJson& props = s.contains("properties") ? s["properties"] : no_props;
        std::vector<std::string> required;
        for (const auto& r : s.value("required", SchemaJson::array())) {
            std::string name = r.get<std::string>();
            if (std::find(required.begin(), required.end(), name) == required.end()) {
                required.push_back(name);
            }
        }
        const SchemaJson* extra_schema =
            s.contains("additionalProperties") ? &s["additionalProperties"] : nullptr;
        bool has_props = s.contains("properties");
        bool declares = has_props || !required.empty();
        if (!declares && (!extra_schema || *extra_schema == true)) return primitive("object");
        primitive("ws");

        struct Member {
            std::string name, kv;
            bool required;
        };
        std::vector<Member> members;
        auto is_required = [&](const std::string& name) {
            return std::find(required.begin(), required.end(), name) != required.end();
        };
        auto add_member = [&](const std::string& name, const std::string& value) {
            std::string kv = gbnf_seq(
                {gbnf_literal(schema_dump(SchemaJson(name))), R"(ws ":" ws)", value, "ws"});
            members.push_back({name, kv, is_required(name)});
        };
        for (const auto& [name, sub] : props.items()) {
            std::string at = schema_child(schema_child(ptr, "properties"), name);
            if (sub == false) {
                if (is_required(name)) schema_fail(at, "a required property has the schema false");
                continue;
            }
            std::string h = join_hint(hint, name);
            add_member(name, rule_for(visit(sub, at, h), h));
        }

        // Extra members (and required names without a property schema) take this value.
        // Without additionalProperties, declared properties rule extras out (as llama.cpp).
        std::string extra_value;
        if (extra_schema ? *extra_schema != false : !has_props) {
            std::string h = join_hint(hint, "extra");
            extra_value =
                extra_schema
                    ? rule_for(visit(*extra_schema, schema_child(ptr, "additionalProperties"), h),
                               h)
                    : primitive("value");
        }
        for (const auto& name : required) {
            if (props.contains(name)) continue;
            if (extra_schema && *extra_schema == false) {
                schema_fail(schema_child(ptr, "required"),
                            fmt::format("required property \"{}\" is not in properties, and "
                                        "additionalProperties is false",
                                        name));
            }
            add_member(name, extra_value.empty() ? primitive("value") : extra_value);
        }
        std::string extra;  // rule for one additional member; empty when none are allowed
        if (!extra_value.empty()) {
            std::vector<std::string> names = required;  // every declared name, even false ones
            for (const auto& [name, sub] : props.items()) names.push_back(name);
            if (!names.empty()) primitive("char");
            std::string key =
                names.empty() ? primitive("string")
                              : add_rule(join_hint(hint, "extra-key"), gbnf_key_excluding(names));
            extra = add_rule(join_hint(hint, "extra-kv"),
                             gbnf_seq({key, R"(ws ":" ws)", extra_value, "ws"}));
        }

        // Leading optional members make each later member appear in several alternatives:
        // then members, and the lists after each, get rules (linear, not quadratic, size).
        bool repeated = !members.empty() && !members[0].required;
        if (repeated) {
            for (auto& m : members) m.kv = add_rule(join_hint(hint, m.name + "-kv"), m.kv);
        }
        const std::string comma = R"("," ws)";
        std::string tail = extra.empty() ? "" : "( " + comma + " " + extra + " )*";  // after i
        std::string first = extra.empty() ? "" : "( " + extra + " " + tail + " )?";  // none yet
        for (size_t i = members.size(); i-- > 0;) {
            const Member& m = members[i];
            std::string present = gbnf_seq({m.kv, tail});
            if (m.required) {
                first = present;
            } else {
                first =
                    first.empty() ? "( " + present + " )?" : "( " + present + " | " + first + " )";
            }
            tail = gbnf_seq(
                {m.required ? comma + " " + m.kv : "( " + comma + " " + m.kv + " )?", tail});
            if (repeated && i > 0) tail = rule_for(tail, join_hint(hint, m.name + "-rest"));
        }
        return gbnf_seq({R"("{" ws)", first, R"("}")"});
    }

    // Arrays: prefix (tuple) items, then items of the rest schema, minItems..maxItems in all.
    // A prefix item may be absent only when the ones after it are too (JSON Schema lets an
    // array be shorter than its prefixItems); those below minItems are mandatory.
    std::string array_expr(const SchemaJson& s, const std::string& ptr, const std::string& hint) {
        primitive("ws");
        const SchemaJson* prefix = nullptr;
        const SchemaJson* rest = nullptr;
        std::string prefix_key, rest_key;
        if (s.contains("prefixItems")) {
            prefix = &s["prefixItems"], prefix_key = "prefixItems";
            if (s.contains("items")) rest = &s["items"], rest_key = "items";
        } else if (s.contains("items") && s["items"].is_array()) {
            prefix = &s["items"], prefix_key = "items";
            if (s.contains("additionalItems"))
                rest = &s["additionalItems"], rest_key = "additionalItems";
        } else if (s.contains("items")) {
            rest = &s["items"], rest_key = "items";
        }
        uint64_t lo = schema_count(s, "minItems", 0),
                 hi = schema_count(s, "maxItems", kGbnfUnbounded);
        if (lo > hi)
            schema_fail(ptr, fmt::format("minItems {} is larger than maxItems {}", lo, hi));

        std::vector<std::string> items;  // the prefix items' rules
        for (size_t i = 0; prefix && i < prefix->size() && i < hi; ++i) {
            if ((*prefix)[i] == false) {  // no array reaches this index
                hi = i;
                break;
            }
            std::string h = join_hint(hint, "item" + std::to_string(i));
            items.push_back(rule_for(
                visit((*prefix)[i], schema_child(schema_child(ptr, prefix_key), i), h), h));
        }
        std::string rest_rule;
        if (!rest || *rest != false) {
            std::string h = join_hint(hint, "item");
            rest_rule = rest ? rule_for(visit(*rest, schema_child(ptr, rest_key), h), h)
                             : primitive("value");
        } else if (hi > items.size()) {
            hi = items.size();
        }
        if (lo > hi) {
            schema_fail(ptr,
                        fmt::format("minItems {} asks for more items than the {} allowed", lo, hi));
        }

        const std::string comma = R"("," ws)";
        uint64_t k = items.size();
        std::string tail;  // the items from index k on
        if (!rest_rule.empty() && hi > k) {
            uint64_t a = lo > k ? lo - k : 0, b = minus(hi, k);
            std::string more = "( " + gbnf_seq({comma, rest_rule, "ws"}) + " )";
            if (k > 0) {
                tail = gbnf_repeat(more, a, b);
            } else {
                tail =
                    gbnf_seq({rest_rule, "ws", gbnf_repeat(more, a > 0 ? a - 1 : 0, minus(b, 1))});
                if (a == 0) tail = "( " + tail + " )?";
            }
        }
        for (uint64_t i = k; i-- > 0;) {
            std::string one = gbnf_seq({i > 0 ? comma : "", items[i], "ws", tail});
            tail = i < lo ? one : "( " + one + " )?";
        }
        return gbnf_seq({R"("[" ws)", tail, R"("]")"});
    }

    const SchemaJson& root_;
    std::vector<std::pair<std::string, std::string>> rules_;  // [name, body], root first
    std::set<std::string> taken_;                             // rule names in use or reserved
    std::set<std::string> primitives_;                        // fixed rules already emitted
    std::map<std::string, std::string> ref_rules_;            // $ref -> rule name
};

}  // namespace

std::string json_schema_to_grammar(const nlohmann::ordered_json& schema) {
    return Converter(schema, "root").run();
}

std::string json_schema_to_grammar_rule(const nlohmann::ordered_json& schema,
                                        const std::string& rule,
                                        const std::vector<std::string>& reserved) {
    for (const std::string& name : reserved)
        if (gbnf_is_primitive(name))
            fail("json_schema_to_grammar_rule: '{}' is a fixed rule", name);
    if (rule.empty() || rule == "root" || gbnf_is_primitive(rule) ||
        rule.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") != std::string::npos)
        fail("json_schema_to_grammar_rule: '{}' is no free rule name", rule);
    return Converter(schema, rule, reserved).run();
}

std::string json_schema_to_grammar_rules(
    const nlohmann::ordered_json& root,
    const std::vector<std::pair<std::string, std::string>>& rules,
    const std::vector<std::string>& reserved) {
    for (const std::string& name : reserved)
        if (gbnf_is_primitive(name))
            fail("json_schema_to_grammar_rules: '{}' is a fixed rule", name);
    std::vector<std::string> names = reserved;
    for (const auto& [rule, ref] : rules) {
        if (rule.empty() || rule == "root" || gbnf_is_primitive(rule) ||
            rule.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") != std::string::npos ||
            std::find(names.begin(), names.end(), rule) != names.end())
            fail("json_schema_to_grammar_rules: '{}' is no free rule name", rule);
        if (ref.rfind("#/", 0) != 0) fail("json_schema_to_grammar_rules: '{}' is no $ref", ref);
        names.push_back(rule);
    }
    return Converter(root, "root", names).run(rules);
}

std::string json_schema_to_grammar(const nlohmann::json& schema) {
    return json_schema_to_grammar(nlohmann::ordered_json(schema));
}

}  // namespace kvrun
