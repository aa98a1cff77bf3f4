// GBNF text for the JSON Schema converter (json_schema_impl.h): the fixed rules (JSON values,
// bounded whitespace and numbers, date/time/uuid formats), literals, repetitions, integer
// ranges as digit patterns, and object keys that avoid a set of names.
#include <algorithm>
#include <cctype>
#include <map>

#include "common.h"
#include "json_schema_impl.h"

namespace kvrun {

namespace {

// Fixed rules, emitted on first use (with the rules they use). Whitespace is bounded so a
// model cannot emit it forever; numbers are bounded for the same reason.
constexpr GbnfPrimitive kPrimitives[] = {
    {"ws", R"(| " " | "\n" [ \t]{0,20})", ""},
    {"value", "object | array | string | number | boolean | null",
     "object array string number boolean null"},
    {"object", R"("{" ws ( string ws ":" ws value ws ( "," ws string ws ":" ws value ws )* )? "}")",
     "ws string value"},
    {"array", R"("[" ws ( value ws ( "," ws value ws )* )? "]")", "ws value"},
    {"string", R"("\"" char* "\"")", "char"},
    {"char", R"([^"\\\x00-\x1F] | "\\" escape)", "escape"},
    {"escape", R"(["\\/bfnrt] | "u" [0-9a-fA-F]{4})", ""},
    {"number", R"(integer ( "." [0-9]{1,16} )? ( [eE] ( "-" | "+" )? [0-9]{1,3} )?)", "integer"},
    {"integer", R"("-"? ( "0" | [1-9] [0-9]{0,15} ))", ""},
    {"boolean", R"("true" | "false")", ""},
    {"null", R"("null")", ""},
    {"date", R"([0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] ))",
     ""},
    {"time",
     R"(( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" ( [0-5] [0-9] | "60" ) ( "." [0-9]{1,9} )? )"
     R"(( [Zz] | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ))",
     ""},
    {"date-time", "date [Tt] time", "date time"},
    {"uuid",
     R"([0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12})",
     ""},
};

// One code point as it may appear inside a GBNF character class or literal.
std::string gbnf_code_point(uint32_t cp) {
    if (cp < 0x80) {
        if (std::isalnum(static_cast<int>(cp))) return std::string(1, static_cast<char>(cp));
        return fmt::format("\\x{:02X}", cp);
    }
    if (cp <= 0xFFFF) return fmt::format("\\u{:04X}", cp);
    std::string out;  // raw UTF-8 (4 bytes)
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
    return out;
}

// Decodes UTF-8 into code points; false when `s` is not valid UTF-8.
bool decode_utf8(std::string_view s, std::vector<uint32_t>& out) {
    for (size_t i = 0; i < s.size();) {
        auto b = static_cast<unsigned char>(s[i]);
        int n = b < 0x80           ? 0
                : (b >> 5) == 0x6  ? 1
                : (b >> 4) == 0xE  ? 2
                : (b >> 3) == 0x1E ? 3
                                   : -1;
        if (n < 0 || i + n >= s.size()) return false;
        uint32_t cp = n == 0 ? b : b & (0x3F >> n);
        for (int k = 1; k <= n; ++k) {
            auto c = static_cast<unsigned char>(s[i + k]);
            if ((c >> 6) != 0x2) return false;
            cp = (cp << 6) | (c & 0x3F);
        }
        out.push_back(cp);
        i += static_cast<size_t>(n) + 1;
    }
    return true;
}

// Decimal numerals of equal length from a to b (a <= b) after the digits `prefix`, as
// sequences appended to out: a shared leading digit narrows the range, else it splits into
// a's first digit (then a's rest up to 9s), the digits strictly between (then any digits),
// and b's first digit (then 0s up to b's rest).
void same_length_range(std::string_view a, std::string_view b, const std::string& prefix,
                       std::vector<std::string>& out) {
    std::string lead = prefix.empty() ? "" : gbnf_literal(prefix);
    if (a.empty()) {
        out.push_back(lead);
        return;
    }
    if (a[0] == b[0]) return same_length_range(a.substr(1), b.substr(1), prefix + a[0], out);
    size_t rest = a.size() - 1;
    bool a_all_zero = a.find_first_not_of('0', 1) == std::string_view::npos;
    bool b_all_nine = b.find_first_not_of('9', 1) == std::string_view::npos;
    char lo = a_all_zero ? a[0] : static_cast<char>(a[0] + 1);
    char hi = b_all_nine ? b[0] : static_cast<char>(b[0] - 1);
    if (!a_all_zero) same_length_range(a.substr(1), std::string(rest, '9'), prefix + a[0], out);
    if (lo <= hi) {
        std::string digit =
            lo == hi ? gbnf_literal(std::string(1, lo)) : fmt::format("[{}-{}]", lo, hi);
        out.push_back(gbnf_seq({lead, digit, gbnf_repeat("[0-9]", rest, rest)}));
    }
    if (!b_all_nine) same_length_range(std::string(rest, '0'), b.substr(1), prefix + b[0], out);
}

// Numerals (no leading zeros) of the integers in [lo, hi]; hi may be kGbnfUnbounded (then up
// to 16 digits).
std::vector<std::string> natural_range(uint64_t lo, uint64_t hi) {
    std::vector<std::string> out;
    std::string a = std::to_string(lo);
    if (hi == kGbnfUnbounded) {
        same_length_range(a, std::string(a.size(), '9'), "", out);
        if (a.size() < 16) out.push_back("[1-9] " + gbnf_repeat("[0-9]", a.size(), 15));
        return out;
    }
    std::string b = std::to_string(hi);
    for (size_t len = a.size(); len <= b.size(); ++len) {
        std::string from = len == a.size() ? a : "1" + std::string(len - 1, '0');
        std::string to = len == b.size() ? b : std::string(len, '9');
        same_length_range(from, to, "", out);
    }
    return out;
}

}  // namespace

const GbnfPrimitive* gbnf_primitive(std::string_view name) {
    for (const auto& p : kPrimitives) {
        if (p.name == name) return &p;
    }
    return nullptr;
}

bool gbnf_is_primitive(std::string_view name) {
    return gbnf_primitive(name) != nullptr;
}

std::string gbnf_literal(std::string_view bytes) {
    std::string out = "\"";
    for (unsigned char c : bytes) {
        switch (c) {
            case '"':
                out += "\\\"";
                break;
            case '\\':
                out += "\\\\";
                break;
            case '\n':
                out += "\\n";
                break;
            case '\r':
                out += "\\r";
                break;
            case '\t':
                out += "\\t";
                break;
            default:
                if (c < 0x20 || c == 0x7F) {
                    out += fmt::format("\\x{:02X}", c);
                } else {
                    out += static_cast<char>(c);
                }
        }
    }
    return out + "\"";
}

std::string gbnf_repeat(const std::string& atom, uint64_t a, uint64_t b) {
    if (b == 0) return "";
    if (b == kGbnfUnbounded) {
        return atom + (a == 0 ? "*" : a == 1 ? "+" : fmt::format("{{{},}}", a));
    }
    if (a == b) return a == 1 ? atom : atom + fmt::format("{{{}}}", a);
    if (a == 0 && b == 1) return atom + "?";
    return atom + fmt::format("{{{},{}}}", a, b);
}

std::string gbnf_seq(std::initializer_list<std::string> parts) {
    std::string out;
    for (const auto& p : parts) {
        if (p.empty()) continue;
        if (!out.empty()) out += ' ';
        out += p;
    }
    return out;
}

std::string gbnf_alternatives(const std::vector<std::string>& alts) {
    if (alts.size() == 1) return alts[0];
    std::string out = "(";
    for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : " ") + alts[i];
    return out + " )";
}

bool gbnf_is_atom(std::string_view s) {
    bool identifier = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '-';
    });
    if (identifier) return true;
    if (s.size() < 2 || s.front() != '"') return false;
    for (size_t i = 1; i < s.size(); ++i) {
        if (s[i] == '\\') {
            ++i;
        } else if (s[i] == '"') {
            return i + 1 == s.size();
        }
    }
    return false;
}

std::string gbnf_integer_range(bool has_lo, int64_t lo, bool has_hi, int64_t hi) {
    std::vector<std::string> alts;
    // Negative numbers: "-" and a magnitude in [max(1, -hi), -lo].
    if (!has_lo || lo < 0) {
        uint64_t from = has_hi && hi < 0 ? static_cast<uint64_t>(-hi) : 1;
        uint64_t to = has_lo ? static_cast<uint64_t>(-lo) : kGbnfUnbounded;
        alts.push_back("\"-\" " + gbnf_alternatives(natural_range(from, to)));
    }
    if (!has_hi || hi >= 0) {
        uint64_t from = has_lo && lo > 0 ? static_cast<uint64_t>(lo) : 0;
        for (auto& a : natural_range(from, has_hi ? static_cast<uint64_t>(hi) : kGbnfUnbounded)) {
            alts.push_back(a);
        }
    }
    return gbnf_alternatives(alts);
}

std::string gbnf_key_excluding(const std::vector<std::string>& names) {
    struct Node {
        std::map<uint32_t, size_t> children;
        bool terminal = false;
    };
    std::vector<Node> trie(1);
    for (const auto& name : names) {
        std::string text =
            SchemaJson(name).dump(-1, ' ', false, SchemaJson::error_handler_t::replace);
        std::vector<uint32_t> cps;
        text = text.substr(1, text.size() - 2);
        if (text.find('\\') != std::string::npos || !decode_utf8(text, cps)) continue;
        size_t node = 0;
        for (uint32_t cp : cps) {
            auto it = trie[node].children.find(cp);
            if (it == trie[node].children.end()) {
                trie.push_back({});
                it = trie[node].children.emplace(cp, trie.size() - 1).first;
            }
            node = it->second;
        }
        trie[node].terminal = true;
    }
    // node_expr(n): what may follow the prefix leading to node n.
    auto node_expr = [&](auto&& self, size_t n) -> std::string {
        std::vector<std::string> alts;
        if (!trie[n].terminal) alts.push_back(R"("\"")");
        std::string others = R"([^"\\\x00-\x1F)";
        for (const auto& [cp, next] : trie[n].children) others += gbnf_code_point(cp);
        alts.push_back(others + R"(] char* "\"")");
        alts.push_back(R"("\\" escape char* "\"")");
        for (const auto& [cp, next] : trie[n].children) {
            alts.push_back("\"" + gbnf_code_point(cp) + "\" " + self(self, next));
        }
        return gbnf_alternatives(alts);
    };
    return R"("\"" )" + node_expr(node_expr, 0);
}

}  // namespace kvrun
