// Jinja interpreter: the public API and Python-like values (printing, comparison, JSON).
#include "jinja.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

#include "common.h"
#include "jinja_impl.h"
#include "unicode_text.h"

namespace kvrun {

JinjaTemplate JinjaTemplate::parse(std::string_view source) {
    JinjaTemplate t;
    try {
        t.program_ = jinja::parse_program(source, Limits{}.max_depth);
    } catch (const Error&) {
        throw;
    } catch (const std::exception& e) {  // e.g. out of memory: still an Error for callers
        fail("jinja: {}", e.what());
    }
    return t;
}

std::string JinjaTemplate::render(const nlohmann::ordered_json& context) const {
    return render(context, Limits{});
}

std::string JinjaTemplate::render(const nlohmann::ordered_json& context,
                                  const Limits& limits) const {
    if (!program_) fail("jinja: render of an empty template object");
    jinja::Interp interp(limits);
    try {
        return interp.run(*program_, context);
    } catch (const Error&) {
        throw;
    } catch (const std::exception& e) {
        fail("jinja: {}", e.what());
    }
}

const std::string& JinjaTemplate::source() const {
    static const std::string empty;
    return program_ ? program_->source : empty;
}

std::string jinja_tojson(const nlohmann::ordered_json& value, int indent) {
    static const JinjaTemplate plain = JinjaTemplate::parse("{{ v | tojson }}");
    static const JinjaTemplate indented = JinjaTemplate::parse("{{ v | tojson(indent=n) }}");
    return indent > 0 ? indented.render({{"v", value}, {"n", indent}})
                      : plain.render({{"v", value}});
}

}  // namespace kvrun

namespace kvrun::jinja {

Value Value::undefined(std::string why) {
    Value v;
    v.s = std::move(why);
    return v;
}
Value Value::none() {
    Value v;
    v.type = Type::None;
    return v;
}
Value Value::boolean(bool x) {
    Value v;
    v.type = Type::Bool;
    v.b = x;
    return v;
}
Value Value::integer(int64_t x) {
    Value v;
    v.type = Type::Int;
    v.i = x;
    return v;
}
Value Value::number(double x) {
    Value v;
    v.type = Type::Float;
    v.f = x;
    return v;
}
Value Value::string(std::string x) {
    Value v;
    v.type = Type::String;
    v.s = std::move(x);
    return v;
}
Value Value::new_list(std::vector<Value> items, bool tuple) {
    Value v;
    v.type = Type::List;
    v.list = std::make_shared<ListObj>();
    v.list->items = std::move(items);
    v.list->tuple = tuple;
    register_container(v.list);
    return v;
}
Value Value::new_dict(bool is_namespace) {
    Value v;
    v.type = Type::Dict;
    v.dict = std::make_shared<DictObj>();
    v.dict->is_namespace = is_namespace;
    register_container(v.dict);
    return v;
}
Value Value::function(std::string name, std::function<Value(Interp&, Args&)> fn) {
    Value v;
    v.type = Type::Func;
    v.func = std::make_shared<Function>(Function{std::move(name), std::move(fn)});
    return v;
}
bool Value::is_namespace() const {
    return type == Type::Dict && dict->is_namespace;
}
bool Value::is_tuple() const {
    return type == Type::List && list->tuple;
}

const Value* DictObj::find(const Value& key) const {
    for (auto& [k, v] : items)
        if (py_eq(k, key)) return &v;
    return nullptr;
}
const Value* DictObj::find(std::string_view key) const {
    for (auto& [k, v] : items)
        if (k.type == Value::Type::String && k.s == key) return &v;
    return nullptr;
}
void DictObj::set(Value key, Value value) {
    for (auto& [k, v] : items) {
        if (py_eq(k, key)) {
            v = std::move(value);
            return;
        }
    }
    items.emplace_back(std::move(key), std::move(value));
}

bool truthy(const Value& v) {
    switch (v.type) {
        case Value::Type::Undefined:
        case Value::Type::None:
            return false;
        case Value::Type::Bool:
            return v.b;
        case Value::Type::Int:
            return v.i != 0;
        case Value::Type::Float:
            return v.f != 0;
        case Value::Type::String:
            return !v.s.empty();
        case Value::Type::List:
            return !v.list->items.empty();
        case Value::Type::Dict:
            return v.dict->is_namespace || !v.dict->items.empty();
        case Value::Type::Func:
            return true;
    }
    return false;
}

std::string type_name(const Value& v) {
    switch (v.type) {
        case Value::Type::Undefined:
            return "Undefined";
        case Value::Type::None:
            return "NoneType";
        case Value::Type::Bool:
            return "bool";
        case Value::Type::Int:
            return "int";
        case Value::Type::Float:
            return "float";
        case Value::Type::String:
            return "str";
        case Value::Type::List:
            return v.list->tuple ? "tuple" : "list";
        case Value::Type::Dict:
            return v.dict->is_namespace ? "Namespace" : "dict";
        case Value::Type::Func:
            return "function";
    }
    return "object";
}

void require_defined(const Value& v) {
    if (v.is_undefined()) throw RuntimeError(v.s.empty() ? "value is undefined" : v.s);
}

// Python's repr(float): the shortest digits that round-trip, positional for exponents in
// [-4, 16), else d.ddde+XX.
std::string py_float_repr(double d) {
    if (std::isnan(d)) return "nan";
    if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
    char buf[64];
    auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
    std::string sci(buf, res.ptr);  // e.g. "-1.2345e+02", "0e+00"
    std::string out;
    size_t p = 0;
    if (sci[0] == '-') {
        out = "-";
        p = 1;
    }
    size_t epos = sci.find('e');
    std::string digits;
    for (size_t k = p; k < epos; ++k)
        if (sci[k] != '.') digits += sci[k];
    int exp = std::atoi(sci.c_str() + epos + 1);
    int n = int(digits.size());
    if (exp >= -4 && exp < 16) {
        if (exp >= 0) {
            if (n <= exp + 1) {
                out += digits + std::string(size_t(exp + 1 - n), '0') + ".0";
            } else {
                out += digits.substr(0, size_t(exp + 1)) + "." + digits.substr(size_t(exp + 1));
            }
        } else {
            out += "0." + std::string(size_t(-exp - 1), '0') + digits;
        }
    } else {
        out += digits.substr(0, 1);
        if (n > 1) out += "." + digits.substr(1);
        out += fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', std::abs(exp));
    }
    return out;
}

namespace {

// Python's repr of a str: single quotes unless the text has ' and no ".
std::string repr_string(const std::string& s) {
    char q = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
    std::string out(1, q);
    for (unsigned char c : s) {
        if (c == '\\') {
            out += "\\\\";
        } else if (c == static_cast<unsigned char>(q)) {
            out += '\\';
            out += char(c);
        } else if (c == '\n') {
            out += "\\n";
        } else if (c == '\r') {
            out += "\\r";
        } else if (c == '\t') {
            out += "\\t";
        } else if (c < 0x20 || c == 0x7f) {
            out += fmt::format("\\x{:02x}", c);
        } else {
            out += char(c);
        }
    }
    return out + q;
}

void repr_into(const Value& v, std::string& out, int depth);

void repr_items(const Value& v, std::string& out, int depth) {
    if (v.type == Value::Type::List) {
        bool tuple = v.list->tuple;
        out += tuple ? '(' : '[';
        auto& items = v.list->items;
        for (size_t k = 0; k < items.size(); ++k) {
            if (k) out += ", ";
            repr_into(items[k], out, depth + 1);
        }
        if (tuple && items.size() == 1) out += ',';
        out += tuple ? ')' : ']';
    } else {
        if (v.dict->is_namespace) out += "<Namespace ";
        out += '{';
        bool first = true;
        for (auto& [k, x] : v.dict->items) {
            if (!first) out += ", ";
            first = false;
            repr_into(k, out, depth + 1);
            out += ": ";
            repr_into(x, out, depth + 1);
        }
        out += '}';
        if (v.dict->is_namespace) out += '>';
    }
}

void repr_into(const Value& v, std::string& out, int depth) {
    // A list can contain itself (via append): Python prints [...].
    if (depth > 100) {
        out += "...";
        return;
    }
    check_size(out.size());
    switch (v.type) {
        case Value::Type::String:
            out += repr_string(v.s);
            break;
        case Value::Type::Undefined:
            out += "Undefined";
            break;
        case Value::Type::List:
        case Value::Type::Dict:
            repr_items(v, out, depth);
            break;
        default:
            out += py_str(v);
    }
}

}  // namespace

std::string py_str(const Value& v) {
    switch (v.type) {
        case Value::Type::Undefined:
            return "";
        case Value::Type::None:
            return "None";
        case Value::Type::Bool:
            return v.b ? "True" : "False";
        case Value::Type::Int:
            return std::to_string(v.i);
        case Value::Type::Float:
            return py_float_repr(v.f);
        case Value::Type::String:
            return v.s;
        case Value::Type::List:
        case Value::Type::Dict: {
            std::string out;
            repr_items(v, out, 0);
            return out;
        }
        case Value::Type::Func:
            return "<function " + v.func->name + ">";
    }
    return "";
}

std::string py_repr(const Value& v) {
    std::string out;
    repr_into(v, out, 0);
    return out;
}

double to_double(const Value& v) {
    switch (v.type) {
        case Value::Type::Bool:
            return v.b ? 1 : 0;
        case Value::Type::Int:
            return double(v.i);
        case Value::Type::Float:
            return v.f;
        default:
            rt_fail("expected a number, got {}", type_name(v));
    }
}

bool py_eq(const Value& a, const Value& b, int depth) {
    if (depth > 200) rt_fail("comparison nested too deeply (or circular)");
    if (a.is_number() && b.is_number()) {
        if (a.type != Value::Type::Float && b.type != Value::Type::Float) {
            int64_t x = a.type == Value::Type::Bool ? a.b : a.i;
            int64_t y = b.type == Value::Type::Bool ? b.b : b.i;
            return x == y;
        }
        return to_double(a) == to_double(b);
    }
    if (a.type != b.type) return false;
    switch (a.type) {
        case Value::Type::Undefined:
        case Value::Type::None:
            return true;
        case Value::Type::String:
            return a.s == b.s;
        case Value::Type::List: {
            if (a.list == b.list) return true;
            auto &x = a.list->items, &y = b.list->items;
            if (a.list->tuple != b.list->tuple || x.size() != y.size()) return false;
            for (size_t k = 0; k < x.size(); ++k)
                if (!py_eq(x[k], y[k], depth + 1)) return false;
            return true;
        }
        case Value::Type::Dict: {
            if (a.dict == b.dict) return true;
            if (a.dict->is_namespace || b.dict->is_namespace) return false;
            if (a.dict->items.size() != b.dict->items.size()) return false;
            for (auto& [k, v] : a.dict->items) {
                const Value* o = b.dict->find(k);
                if (!o || !py_eq(v, *o, depth + 1)) return false;
            }
            return true;
        }
        case Value::Type::Func:
            return a.func == b.func;
        default:
            return false;
    }
}

bool py_lt(const Value& a, const Value& b, int depth) {
    if (depth > 200) rt_fail("comparison nested too deeply (or circular)");
    if (a.is_number() && b.is_number()) {
        if (a.type != Value::Type::Float && b.type != Value::Type::Float) {
            int64_t x = a.type == Value::Type::Bool ? a.b : a.i;
            int64_t y = b.type == Value::Type::Bool ? b.b : b.i;
            return x < y;
        }
        return to_double(a) < to_double(b);
    }
    require_defined(a);
    require_defined(b);
    if (a.is_string() && b.is_string()) return a.s < b.s;  // UTF-8 order = code point order
    if (a.is_list() && b.is_list() && a.list->tuple == b.list->tuple) {
        auto &x = a.list->items, &y = b.list->items;
        for (size_t k = 0; k < x.size() && k < y.size(); ++k) {
            if (py_eq(x[k], y[k], depth + 1)) continue;
            return py_lt(x[k], y[k], depth + 1);
        }
        return x.size() < y.size();
    }
    rt_fail("'<' not supported between instances of '{}' and '{}'", type_name(a), type_name(b));
}

Value from_json(const nlohmann::ordered_json& j, int depth) {
    using J = nlohmann::ordered_json::value_t;
    // A hostile request could nest JSON deep enough to overflow the stack here.
    if (depth > 1000) fail("jinja: the render context is nested too deeply (over 1000 levels)");
    switch (j.type()) {
        case J::null:
            return Value::none();
        case J::boolean:
            return Value::boolean(j.get<bool>());
        case J::number_integer:
            return Value::integer(j.get<int64_t>());
        case J::number_unsigned: {
            auto u = j.get<uint64_t>();
            if (u <= uint64_t(INT64_MAX)) return Value::integer(int64_t(u));
            return Value::number(double(u));
        }
        case J::number_float:
            return Value::number(j.get<double>());
        case J::string:
            return Value::string(j.get<std::string>());
        case J::array: {
            Value v = Value::new_list();
            v.list->items.reserve(j.size());
            for (auto& x : j) v.list->items.push_back(from_json(x, depth + 1));
            return v;
        }
        case J::object: {
            Value v = Value::new_dict();
            v.dict->items.reserve(j.size());
            // JSON keys are unique, so no lookup is needed here.
            for (auto& [k, x] : j.items())
                v.dict->items.emplace_back(Value::string(k), from_json(x, depth + 1));
            return v;
        }
        default:
            return Value::none();  // binary, discarded
    }
}

namespace {

void json_string(const std::string& s, bool ensure_ascii, std::string& out) {
    out += '"';
    for (size_t k = 0; k < s.size(); ++k) {
        unsigned char c = static_cast<unsigned char>(s[k]);
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
            case '\b':
                out += "\\b";
                break;
            case '\f':
                out += "\\f";
                break;
            default:
                if (c < 0x20) {
                    out += fmt::format("\\u{:04x}", c);
                } else if (c >= 0x80 && ensure_ascii) {
                    // Decode one UTF-8 sequence; escape it (as a surrogate pair above U+FFFF).
                    int len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
                    uint32_t cp = len == 1 ? c : c & (0x3f >> (len - 1));
                    for (int m = 1; m < len && k + 1 < s.size(); ++m)
                        cp = (cp << 6) | (static_cast<unsigned char>(s[++k]) & 0x3f);
                    if (cp >= 0x10000) {
                        cp -= 0x10000;
                        out += fmt::format("\\u{:04x}\\u{:04x}", 0xd800 + (cp >> 10),
                                           0xdc00 + (cp & 0x3ff));
                    } else {
                        out += fmt::format("\\u{:04x}", cp);
                    }
                } else {
                    out += char(c);
                }
        }
    }
    out += '"';
}

// A dict key as json.dumps writes it: strings as is; numbers, bools and None converted.
std::string json_key(const Value& k) {
    switch (k.type) {
        case Value::Type::String:
            return k.s;
        case Value::Type::None:
            return "null";
        case Value::Type::Bool:
            return k.b ? "true" : "false";
        case Value::Type::Int:
            return std::to_string(k.i);
        case Value::Type::Float:
            return py_float_repr(k.f);
        default:
            rt_fail("keys must be str, int, float, bool or None, not {}", type_name(k));
    }
}

void json_into(const Value& v, const JsonOptions& opt, int level, std::string& out) {
    if (level > 200) rt_fail("tojson: value nested too deeply (or circular)");
    check_size(out.size());
    auto newline = [&](int lv) {
        if (!opt.pretty) return;
        out += '\n';
        for (int k = 0; k < lv; ++k) out += opt.indent;
    };
    const std::string& item_sep = opt.item_sep;
    switch (v.type) {
        case Value::Type::None:
            out += "null";
            return;
        case Value::Type::Bool:
            out += v.b ? "true" : "false";
            return;
        case Value::Type::Int:
            out += std::to_string(v.i);
            return;
        case Value::Type::Float:
            if (std::isnan(v.f)) {
                out += "NaN";
            } else if (std::isinf(v.f)) {
                out += v.f < 0 ? "-Infinity" : "Infinity";
            } else {
                out += py_float_repr(v.f);
            }
            return;
        case Value::Type::String:
            json_string(v.s, opt.ensure_ascii, out);
            return;
        case Value::Type::List: {
            auto& items = v.list->items;
            if (items.empty()) {
                out += "[]";
                return;
            }
            out += '[';
            for (size_t k = 0; k < items.size(); ++k) {
                if (k) out += item_sep;
                newline(level + 1);
                json_into(items[k], opt, level + 1, out);
            }
            newline(level);
            out += ']';
            return;
        }
        case Value::Type::Dict: {
            if (v.dict->is_namespace) rt_fail("Object of type Namespace is not JSON serializable");
            std::vector<const std::pair<Value, Value>*> items;
            for (auto& kv : v.dict->items) items.push_back(&kv);
            if (items.empty()) {
                out += "{}";
                return;
            }
            if (opt.sort_keys) {
                std::stable_sort(items.begin(), items.end(),
                                 [](auto* x, auto* y) { return py_lt(x->first, y->first); });
            }
            out += '{';
            for (size_t k = 0; k < items.size(); ++k) {
                if (k) out += item_sep;
                newline(level + 1);
                json_string(json_key(items[k]->first), opt.ensure_ascii, out);
                out += opt.key_sep;
                json_into(items[k]->second, opt, level + 1, out);
            }
            newline(level);
            out += '}';
            return;
        }
        default:
            rt_fail("Object of type {} is not JSON serializable", type_name(v));
    }
}

}  // namespace

std::string to_json(const Value& v, const JsonOptions& opt) {
    std::string out;
    json_into(v, opt, 0, out);
    return out;
}

std::vector<size_t> codepoint_offsets(std::string_view s) {
    std::vector<size_t> offs;
    offs.reserve(s.size() + 1);
    for (size_t k = 0; k < s.size(); ++k)
        if ((static_cast<unsigned char>(s[k]) & 0xc0) != 0x80) offs.push_back(k);
    offs.push_back(s.size());
    return offs;
}

size_t codepoint_count(std::string_view s) {
    size_t n = 0;
    for (char c : s) n += (static_cast<unsigned char>(c) & 0xc0) != 0x80;
    return n;
}

std::string encode_utf8(uint32_t cp) {
    std::string out;
    utf8_append(out, cp);
    return out;
}

std::vector<Value> iterate(const Value& v) {
    switch (v.type) {
        case Value::Type::Undefined:
            return {};
        case Value::Type::List:
            return v.list->items;
        case Value::Type::Dict: {
            if (v.dict->is_namespace) break;
            std::vector<Value> keys;
            for (auto& kv : v.dict->items) keys.push_back(kv.first);
            return keys;
        }
        case Value::Type::String: {
            std::vector<Value> chars;
            auto offs = codepoint_offsets(v.s);
            for (size_t k = 0; k + 1 < offs.size(); ++k)
                chars.push_back(Value::string(v.s.substr(offs[k], offs[k + 1] - offs[k])));
            return chars;
        }
        default:
            break;
    }
    rt_fail("'{}' object is not iterable", type_name(v));
}

int64_t py_len(const Value& v) {
    switch (v.type) {
        case Value::Type::Undefined:
            return 0;
        case Value::Type::String:
            return int64_t(codepoint_count(v.s));
        case Value::Type::List:
            return int64_t(v.list->items.size());
        case Value::Type::Dict:
            if (v.dict->is_namespace) break;
            return int64_t(v.dict->items.size());
        default:
            break;
    }
    rt_fail("object of type '{}' has no len()", type_name(v));
}

}  // namespace kvrun::jinja

namespace kvrun::jinja {

namespace {

int64_t int_of(const Value& v) {
    return v.type == Value::Type::Bool ? v.b : v.i;
}

Value repeat(Interp& in, const Value& seq, int64_t n) {
    if (n < 0) n = 0;
    size_t len = seq.is_string() ? seq.s.size() : seq.list->items.size();
    if (len && uint64_t(n) > SIZE_MAX / len / sizeof(Value)) check_size(SIZE_MAX);
    if (seq.is_string()) {
        check_size(len * size_t(n));
    } else {
        check_items(len * size_t(n));
    }
    if (seq.is_string()) {
        std::string out;
        out.reserve(len * size_t(n));
        for (int64_t k = 0; k < n; ++k) out += seq.s;
        return Value::string(std::move(out));
    }
    std::vector<Value> out;
    out.reserve(len * size_t(n));
    for (int64_t k = 0; k < n; ++k)
        out.insert(out.end(), seq.list->items.begin(), seq.list->items.end());
    return Value::new_list(std::move(out), seq.list->tuple);
}

}  // namespace

// Python's `'%s, %d' % args` for %s %r %d %i %f %%.
std::string percent_format(const std::string& f, const Value& rhs) {
    std::vector<Value> args = rhs.is_tuple() ? rhs.list->items : std::vector<Value>{rhs};
    size_t next = 0;
    std::string out;
    for (size_t k = 0; k < f.size(); ++k) {
        if (f[k] != '%') {
            out += f[k];
            continue;
        }
        char c = k + 1 < f.size() ? f[++k] : 0;
        if (c == '%') {
            out += '%';
            continue;
        }
        if (next >= args.size()) rt_fail("not enough arguments for format string");
        const Value& a = args[next++];
        if (c == 's') {
            out += py_str(a);
        } else if (c == 'r') {
            out += py_repr(a);
        } else if (c == 'd' || c == 'i') {
            out += std::to_string(a.type == Value::Type::Float ? int64_t(a.f) : int_of(a));
        } else if (c == 'f') {
            out += fmt::format("{:.6f}", to_double(a));
        } else {
            rt_fail("unsupported format character '{}'", std::string(1, c));
        }
        check_size(out.size());
    }
    if (next < args.size()) rt_fail("not all arguments converted during string formatting");
    return out;
}

Value arithmetic(Interp& in, const std::string& op, const Value& a, const Value& b) {
    require_defined(a);
    require_defined(b);
    const char o = op[0];
    if (a.is_number() && b.is_number()) {
        bool ints = a.type != Value::Type::Float && b.type != Value::Type::Float;
        if (ints && op != "/") {
            int64_t x = int_of(a), y = int_of(b), r = 0;
            if (op == "+" || op == "-" || op == "*") {
                bool over = o == '+'   ? __builtin_add_overflow(x, y, &r)
                            : o == '-' ? __builtin_sub_overflow(x, y, &r)
                                       : __builtin_mul_overflow(x, y, &r);
                if (over) rt_fail("integer overflow");
                return Value::integer(r);
            }
            if (op == "**") {
                if (y < 0) return Value::number(std::pow(double(x), double(y)));
                r = 1;
                for (int64_t base = x; y; y >>= 1) {
                    if ((y & 1) && __builtin_mul_overflow(r, base, &r)) rt_fail("integer overflow");
                    if ((y >> 1) && __builtin_mul_overflow(base, base, &base))
                        rt_fail("integer overflow");
                }
                return Value::integer(r);
            }
            if (y == 0) rt_fail("integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) rt_fail("integer overflow");
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) {  // Python rounds toward negative infinity
                --q;
                m += y;
            }
            return Value::integer(op == "//" ? q : m);
        }
        double x = to_double(a), y = to_double(b);
        if (op == "+") return Value::number(x + y);
        if (op == "-") return Value::number(x - y);
        if (op == "*") return Value::number(x * y);
        if (op == "**") return Value::number(std::pow(x, y));
        if (y == 0) rt_fail("float division by zero");
        if (op == "/") return Value::number(x / y);
        double m = std::fmod(x, y);
        if (m != 0 && ((m < 0) != (y < 0))) m += y;
        if (op == "%") return Value::number(m);
        return Value::number(std::floor((x - m) / y + 0.5));  // exact quotient of x - m
    }
    if (op == "+") {
        if (a.is_string() && b.is_string()) {
            check_size(a.s.size() + b.s.size());
            return Value::string(a.s + b.s);
        }
        if (a.is_list() && b.is_list() && a.list->tuple == b.list->tuple) {
            check_items(a.list->items.size() + b.list->items.size());
            std::vector<Value> out = a.list->items;
            out.insert(out.end(), b.list->items.begin(), b.list->items.end());
            return Value::new_list(std::move(out), a.list->tuple);
        }
        if (a.is_string() || a.is_list())
            rt_fail("can only concatenate {} (not \"{}\") to {}", type_name(a), type_name(b),
                    type_name(a));
    }
    if (op == "*") {
        bool seq_a = a.is_string() || a.is_list(), seq_b = b.is_string() || b.is_list();
        if (seq_a && (b.type == Value::Type::Int || b.type == Value::Type::Bool))
            return repeat(in, a, int_of(b));
        if (seq_b && (a.type == Value::Type::Int || a.type == Value::Type::Bool))
            return repeat(in, b, int_of(a));
    }
    if (op == "%" && a.is_string()) return Value::string(percent_format(a.s, b));
    rt_fail("unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(a), type_name(b));
}

bool contains(const Value& haystack, const Value& needle) {
    switch (haystack.type) {
        case Value::Type::Undefined:
            return false;
        case Value::Type::String:
            if (!needle.is_string())
                rt_fail("'in <string>' requires string as left operand, not {}", type_name(needle));
            return haystack.s.find(needle.s) != std::string::npos;
        case Value::Type::List:
            return std::any_of(haystack.list->items.begin(), haystack.list->items.end(),
                               [&](const Value& x) { return py_eq(x, needle); });
        case Value::Type::Dict:
            if (!haystack.dict->is_namespace) return haystack.dict->find(needle) != nullptr;
            break;
        default:
            break;
    }
    rt_fail("argument of type '{}' is not iterable", type_name(haystack));
}

Value slice(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
    require_defined(obj);
    auto index = [](const Value& v, int64_t def) {
        if (v.is_none()) return def;
        if (v.type != Value::Type::Int && v.type != Value::Type::Bool)
            rt_fail("slice indices must be integers or None");
        return int_of(v);
    };
    int64_t step = index(step_v, 1);
    if (step == 0) rt_fail("slice step cannot be zero");
    std::vector<size_t> offs;
    int64_t n;
    if (obj.is_string()) {
        offs = codepoint_offsets(obj.s);
        n = int64_t(offs.size()) - 1;
    } else if (obj.is_list()) {
        n = int64_t(obj.list->items.size());
    } else {
        rt_fail("'{}' object is not subscriptable", type_name(obj));
    }
    // Python's PySlice_AdjustIndices.
    auto adjust = [&](int64_t x) {
        if (x < 0) {
            x += n;
            if (x < 0) x = step < 0 ? -1 : 0;
        } else if (x >= n) {
            x = step < 0 ? n - 1 : n;
        }
        return x;
    };
    int64_t start = start_v.is_none() ? (step < 0 ? n - 1 : 0) : adjust(index(start_v, 0));
    int64_t stop = stop_v.is_none() ? (step < 0 ? -1 : n) : adjust(index(stop_v, 0));
    std::string s;
    std::vector<Value> items;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
        if (obj.is_string()) {
            s.append(obj.s, offs[size_t(k)], offs[size_t(k) + 1] - offs[size_t(k)]);
        } else {
            items.push_back(obj.list->items[size_t(k)]);
        }
    }
    if (obj.is_string()) return Value::string(std::move(s));
    return Value::new_list(std::move(items), obj.list->tuple);
}

}  // namespace kvrun::jinja
