// Jinja built-ins: string helpers shared with the filters, and the methods of Python's
// str, list and dict that templates call (message.content.split(...), d.items(), ...).
#include <algorithm>
#include <charconv>
#include <cstring>

#include "common.h"
#include "jinja_impl.h"

namespace kvrun::jinja {

std::vector<Value> bind_args(Args& args, std::string_view what,
                             std::initializer_list<std::string_view> names) {
    std::vector<Value> out(names.size());
    if (args.pos.size() > names.size())
        rt_fail("{}() takes at most {} argument(s) ({} given)", what, names.size(),
                args.pos.size());
    for (size_t k = 0; k < args.pos.size(); ++k) out[k] = args.pos[k];
    for (auto& [key, v] : args.kw) {
        auto it = std::find(names.begin(), names.end(), key);
        if (it == names.end()) rt_fail("{}() got an unexpected keyword argument '{}'", what, key);
        out[size_t(it - names.begin())] = v;
    }
    return out;
}

bool py_space(unsigned char c) {
    return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f);
}
char lower_c(char c) {
    return (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c;
}
char upper_c(char c) {
    return (c >= 'a' && c <= 'z') ? char(c - 'a' + 'A') : c;
}
bool alpha_c(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
bool digit_c(char c) {
    return c >= '0' && c <= '9';
}
// Case changes are ASCII-only; other characters pass through.
std::string to_lower(std::string s) {
    for (char& c : s) c = lower_c(c);
    return s;
}
std::string to_upper(std::string s) {
    for (char& c : s) c = upper_c(c);
    return s;
}
std::string capitalize(const std::string& s) {
    std::string out = to_lower(s);
    if (!out.empty()) out[0] = upper_c(out[0]);
    return out;
}

int64_t as_int(const Value& v, const char* what) {
    if (v.type == Value::Type::Int) return v.i;
    if (v.type == Value::Type::Bool) return v.b;
    require_defined(v);
    rt_fail("{}: expected an integer, got {}", what, type_name(v));
}
const std::string& as_str(const Value& v, const char* what) {
    if (v.is_string()) return v.s;
    require_defined(v);
    rt_fail("{}: expected a string, got {}", what, type_name(v));
}
bool arg_bool(const Value& v, bool def) {
    return v.is_undefined() ? def : truthy(v);
}

// str.strip and friends; chars: the characters to remove (code points), or whitespace.
std::string strip(const std::string& s, const Value& chars, bool left, bool right) {
    std::vector<std::string> set;
    bool ws = chars.is_undefined() || chars.is_none();
    if (!ws) {
        const std::string& c = as_str(chars, "strip");
        auto offs = codepoint_offsets(c);
        for (size_t k = 0; k + 1 < offs.size(); ++k)
            set.push_back(c.substr(offs[k], offs[k + 1] - offs[k]));
    }
    size_t b = 0, e = s.size();
    auto match_at = [&](size_t pos, bool backwards) -> size_t {  // bytes of a match, or 0
        if (ws) {
            size_t at = backwards ? pos - 1 : pos;
            return py_space(static_cast<unsigned char>(s[at])) ? 1 : 0;
        }
        for (auto& c : set) {
            if (backwards ? (pos >= c.size() && s.compare(pos - c.size(), c.size(), c) == 0)
                          : s.compare(pos, c.size(), c) == 0)
                return c.size();
        }
        return 0;
    };
    while (left && b < e) {
        size_t m = match_at(b, false);
        if (!m || b + m > e) break;
        b += m;
    }
    while (right && e > b) {
        size_t m = match_at(e, true);
        if (!m || e - m < b) break;
        e -= m;
    }
    return s.substr(b, e - b);
}

// str.split / str.rsplit.
Value split(const std::string& s, const Value& sep_v, const Value& max_v, bool from_right) {
    int64_t maxsplit = max_v.is_undefined() ? -1 : as_int(max_v, "split");
    std::vector<std::string> parts;
    if (sep_v.is_undefined() || sep_v.is_none()) {  // runs of whitespace, ends ignored
        std::vector<std::pair<size_t, size_t>> words;
        for (size_t k = 0; k < s.size();) {
            while (k < s.size() && py_space(static_cast<unsigned char>(s[k]))) ++k;
            if (k == s.size()) break;
            size_t b = k;
            while (k < s.size() && !py_space(static_cast<unsigned char>(s[k]))) ++k;
            words.emplace_back(b, k);
        }
        size_t n = words.size();
        size_t limit = maxsplit < 0 ? n : size_t(std::min<int64_t>(maxsplit, int64_t(n)));
        if (limit >= n || n == 0) {
            for (auto& [b, e] : words) parts.push_back(s.substr(b, e - b));
        } else if (!from_right) {
            for (size_t k = 0; k < limit; ++k)
                parts.push_back(s.substr(words[k].first, words[k].second - words[k].first));
            parts.push_back(s.substr(words[limit].first));  // the rest keeps its spaces
        } else {
            parts.push_back(s.substr(0, words[n - limit - 1].second));
            for (size_t k = n - limit; k < n; ++k)
                parts.push_back(s.substr(words[k].first, words[k].second - words[k].first));
        }
    } else {
        const std::string& sep = as_str(sep_v, "split");
        if (sep.empty()) rt_fail("empty separator");
        std::vector<size_t> cuts;  // match positions
        for (size_t p = s.find(sep); p != std::string::npos; p = s.find(sep, p + sep.size()))
            cuts.push_back(p);
        if (maxsplit >= 0 && size_t(maxsplit) < cuts.size()) {
            if (from_right) {
                cuts.erase(cuts.begin(), cuts.end() - maxsplit);
            } else {
                cuts.resize(size_t(maxsplit));
            }
        }
        size_t b = 0;
        for (size_t c : cuts) {
            parts.push_back(s.substr(b, c - b));
            b = c + sep.size();
        }
        parts.push_back(s.substr(b));
    }
    Value out = Value::new_list();
    for (auto& p : parts) out.list->items.push_back(Value::string(std::move(p)));
    return out;
}

std::string replace(const std::string& s, const std::string& old, const std::string& repl,
                    int64_t count) {
    std::string out;
    if (old.empty()) {  // Python inserts repl around every character
        auto offs = codepoint_offsets(s);
        for (size_t k = 0; k + 1 < offs.size(); ++k) {
            if (count < 0 || int64_t(k) < count) out += repl;
            out.append(s, offs[k], offs[k + 1] - offs[k]);
        }
        if (count < 0 || int64_t(offs.size() - 1) < count) out += repl;
        return out;
    }
    size_t b = 0;
    for (int64_t n = 0; count < 0 || n < count; ++n) {
        size_t p = s.find(old, b);
        if (p == std::string::npos) break;
        out.append(s, b, p - b);
        out += repl;
        b = p + old.size();
        check_size(out.size());
    }
    out.append(s, b);
    return out;
}

std::vector<std::string> splitlines(const std::string& s) {
    std::vector<std::string> lines;
    size_t b = 0;
    for (size_t k = 0; k < s.size(); ++k) {
        if (s[k] == '\n' || s[k] == '\r') {
            lines.push_back(s.substr(b, k - b));
            if (s[k] == '\r' && k + 1 < s.size() && s[k + 1] == '\n') ++k;
            b = k + 1;
        }
    }
    if (b < s.size()) lines.push_back(s.substr(b));
    return lines;
}

// Python's str.format, for {} / {0} / {name} fields without format specs.
std::string str_format(const std::string& f, Args& args) {
    std::string out;
    size_t auto_index = 0;
    for (size_t k = 0; k < f.size(); ++k) {
        char c = f[k];
        if ((c == '{' || c == '}') && k + 1 < f.size() && f[k + 1] == c) {
            out += c;
            ++k;
            continue;
        }
        if (c == '}') rt_fail("single '}}' encountered in format string");
        if (c != '{') {
            out += c;
            continue;
        }
        size_t close = f.find('}', k);
        if (close == std::string::npos) rt_fail("single '{{' encountered in format string");
        std::string field = f.substr(k + 1, close - k - 1);
        if (field.find_first_of(":!") != std::string::npos)
            rt_fail("format specs are not supported in str.format");
        const Value* v = nullptr;
        if (field.empty() || std::all_of(field.begin(), field.end(), digit_c)) {
            size_t idx = auto_index;
            if (field.empty()) {
                ++auto_index;
            } else if (std::from_chars(field.data(), field.data() + field.size(), idx).ec !=
                       std::errc()) {
                rt_fail("Replacement index {} out of range", field);
            }
            if (idx >= args.pos.size()) rt_fail("Replacement index {} out of range", idx);
            v = &args.pos[idx];
        } else {
            for (auto& [key, x] : args.kw)
                if (key == field) v = &x;
            if (!v) rt_fail("KeyError: '{}'", field);
        }
        out += py_str(*v);
        check_size(out.size());
        k = close;
    }
    return out;
}

Value list_of(std::vector<Value> items) {
    return Value::new_list(std::move(items));
}

// str.islower / isupper: some cased characters, all of that case.
bool case_test(const std::string& s, bool lower) {
    bool cased = false;
    for (char c : s) {
        if (!alpha_c(c)) continue;
        cased = true;
        if ((lower_c(c) == c) != lower) return false;
    }
    return cased;
}

namespace {

// A method bound to `self`: the call gets its arguments.
Value bind_method(const Value& self, const std::string& name,
                  Value (*fn)(Interp&, const Value&, const std::string&, Args&)) {
    return Value::function(
        name, [self, name, fn](Interp& in, Args& args) { return fn(in, self, name, args); });
}

// Character index (code points) of a byte offset in s.
int64_t char_index(const std::string& s, size_t byte) {
    return int64_t(codepoint_count(std::string_view(s).substr(0, byte)));
}

Value str_method(Interp& in, const Value& self, const std::string& name, Args& args) {
    const std::string& s = self.s;
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
        auto a = bind_args(args, name, {"chars"});
        return Value::string(strip(s, a[0], name != "rstrip", name != "lstrip"));
    }
    if (name == "split" || name == "rsplit") {
        auto a = bind_args(args, name, {"sep", "maxsplit"});
        return split(s, a[0], a[1], name == "rsplit");
    }
    if (name == "splitlines") {
        bind_args(args, name, {});
        std::vector<Value> out;
        for (auto& line : splitlines(s)) out.push_back(Value::string(line));
        return list_of(std::move(out));
    }
    if (name == "startswith" || name == "endswith") {
        auto a = bind_args(args, name, {"prefix"});
        std::vector<Value> options = a[0].is_tuple() ? a[0].list->items : std::vector<Value>{a[0]};
        for (auto& o : options) {
            const std::string& p = as_str(o, name.c_str());
            bool hit = name == "startswith" ? s.compare(0, p.size(), p) == 0
                                            : s.size() >= p.size() &&
                                                  s.compare(s.size() - p.size(), p.size(), p) == 0;
            if (hit) return Value::boolean(true);
        }
        return Value::boolean(false);
    }
    if (name == "upper" || name == "lower" || name == "capitalize" || name == "title") {
        bind_args(args, name, {});
        if (name == "upper") return Value::string(to_upper(s));
        if (name == "lower") return Value::string(to_lower(s));
        if (name == "capitalize") return Value::string(capitalize(s));
        std::string out = s;  // Python's title: a letter after a non-letter starts a word
        bool prev_alpha = false;
        for (char& c : out) {
            bool a = alpha_c(c);
            if (a) c = prev_alpha ? lower_c(c) : upper_c(c);
            prev_alpha = a;
        }
        return Value::string(std::move(out));
    }
    if (name == "replace") {
        auto a = bind_args(args, name, {"old", "new", "count"});
        std::string out = replace(s, as_str(a[0], "replace"), as_str(a[1], "replace"),
                                  a[2].is_undefined() ? -1 : as_int(a[2], "replace"));
        check_size(out.size());
        return Value::string(std::move(out));
    }
    if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
        auto a = bind_args(args, name, {"sub"});
        const std::string& sub = as_str(a[0], name.c_str());
        size_t p = name[0] == 'r' ? s.rfind(sub) : s.find(sub);
        if (p == std::string::npos) {
            if (name.find("index") != std::string::npos) rt_fail("substring not found");
            return Value::integer(-1);
        }
        return Value::integer(char_index(s, p));
    }
    if (name == "count") {
        auto a = bind_args(args, name, {"sub"});
        const std::string& sub = as_str(a[0], "count");
        if (sub.empty()) return Value::integer(int64_t(codepoint_count(s)) + 1);
        int64_t n = 0;
        for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
        return Value::integer(n);
    }
    if (name == "join") {
        auto a = bind_args(args, name, {"iterable"});
        std::string out;
        bool first = true;
        for (auto& item : iterate(a[0])) {
            if (!first) out += s;
            first = false;
            if (!item.is_string())
                rt_fail("sequence item: expected str instance, {} found", type_name(item));
            out += item.s;
            check_size(out.size());
        }
        return Value::string(std::move(out));
    }
    if (name == "format") {
        std::string out = str_format(s, args);
        check_size(out.size());
        return Value::string(std::move(out));
    }
    // isdigit, isalpha, isalnum, isspace, islower, isupper (ASCII classes)
    bind_args(args, name, {});
    if (name == "islower" || name == "isupper")
        return Value::boolean(case_test(s, name == "islower"));
    if (s.empty()) return Value::boolean(false);
    for (char c : s) {
        bool ok = name == "isdigit"   ? digit_c(c)
                  : name == "isalpha" ? alpha_c(c)
                  : name == "isalnum" ? alpha_c(c) || digit_c(c)
                                      : py_space(static_cast<unsigned char>(c));
        if (!ok) return Value::boolean(false);
    }
    return Value::boolean(true);
}

Value list_method(Interp& in, const Value& self, const std::string& name, Args& args) {
    auto& items = self.list->items;
    const bool mutates = name != "index" && name != "count" && name != "copy";
    if (mutates && self.list->tuple) rt_fail("'tuple' object has no attribute '{}'", name);
    // A Python index (negative from the end) into n items, or a failure naming `what`.
    auto position = [&](const Value& v, size_t n, const char* what) {
        int64_t k = as_int(v, what);
        if (k < 0) k += static_cast<int64_t>(n);
        if (k < 0 || k >= static_cast<int64_t>(n)) rt_fail("{} index out of range", what);
        return static_cast<size_t>(k);
    };
    if (name == "pop") {
        auto a = bind_args(args, name, {"index"});
        if (items.empty()) rt_fail("pop from empty list");
        const size_t k = a[0].is_undefined() ? items.size() - 1 : position(a[0], items.size(), "pop");
        Value out = items[k];
        items.erase(items.begin() + static_cast<std::ptrdiff_t>(k));
        return out;
    }
    if (name == "insert") {  // (Python clamps the index)
        auto a = bind_args(args, name, {"index", "object"});
        const int64_t n = static_cast<int64_t>(items.size());
        int64_t k = as_int(a[0], "insert");
        k = std::clamp(k < 0 ? k + n : k, int64_t(0), n);
        items.insert(items.begin() + static_cast<std::ptrdiff_t>(k), a[1]);
        check_items(items.size());
        return Value::none();
    }
    if (name == "remove") {
        auto a = bind_args(args, name, {"value"});
        for (auto it = items.begin(); it != items.end(); ++it)
            if (py_eq(*it, a[0])) {
                items.erase(it);
                return Value::none();
            }
        rt_fail("list.remove(x): x not in list");
    }
    if (name == "reverse" || name == "clear" || name == "copy") {
        bind_args(args, name, {});
        if (name == "copy") return list_of(items);
        if (name == "reverse")
            std::reverse(items.begin(), items.end());
        else
            items.clear();
        return Value::none();
    }
    if (name == "append" || name == "extend") {
        auto a = bind_args(args, name, {"object"});
        if (name == "append") {
            items.push_back(a[0]);
        } else {
            for (auto& x : iterate(a[0])) items.push_back(x);
        }
        check_items(items.size());
        return Value::none();
    }
    auto a = bind_args(args, name, {"value"});
    if (name == "index") {
        for (size_t k = 0; k < items.size(); ++k)
            if (py_eq(items[k], a[0])) return Value::integer(int64_t(k));
        rt_fail("{} is not in list", py_repr(a[0]));
    }
    return Value::integer(
        std::count_if(items.begin(), items.end(), [&](const Value& x) { return py_eq(x, a[0]); }));
}

Value dict_method(Interp&, const Value& self, const std::string& name, Args& args) {
    auto& items = self.dict->items;
    if (name == "get" || name == "setdefault") {
        auto a = bind_args(args, name, {"key", "default"});
        const Value* v = self.dict->find(a[0]);
        if (v) return *v;
        const Value out = a[1].is_undefined() ? Value::none() : a[1];
        if (name == "setdefault") {
            self.dict->set(a[0], out);
            check_items(items.size());
        }
        return out;
    }
    if (name == "pop") {
        auto a = bind_args(args, name, {"key", "default"});
        for (auto it = items.begin(); it != items.end(); ++it)
            if (py_eq(it->first, a[0])) {
                Value out = it->second;
                items.erase(it);
                return out;
            }
        if (a[1].is_undefined()) rt_fail("KeyError: {}", py_repr(a[0]));
        return a[1];
    }
    if (name == "update") {  // (another dict; keyword arguments)
        Args positional{args.pos, {}};
        auto a = bind_args(positional, name, {"other"});
        if (!a[0].is_undefined()) {
            if (!a[0].is_dict()) rt_fail("dict.update() takes a dict");
            const auto other = a[0].dict->items;  // (a copy: it may be this dict)
            for (const auto& [k, v] : other) self.dict->set(k, v);
        }
        for (auto& [k, v] : args.kw) self.dict->set(Value::string(k), v);
        check_items(items.size());
        return Value::none();
    }
    if (name == "copy") {
        bind_args(args, name, {});
        Value out = Value::new_dict();
        out.dict->items = items;
        return out;
    }
    bind_args(args, name, {});
    std::vector<Value> out;
    for (auto& [k, v] : self.dict->items) {
        if (name == "keys") {
            out.push_back(k);
        } else if (name == "values") {
            out.push_back(v);
        } else {
            out.push_back(Value::new_list({k, v}, true));
        }
    }
    return list_of(std::move(out));
}

}  // namespace

Value get_method(const Value& obj, const std::string& name) {
    static const char* const kStr[] = {
        "strip",    "lstrip",  "rstrip",  "split",      "rsplit", "splitlines", "startswith",
        "endswith", "upper",   "lower",   "capitalize", "title",  "replace",    "find",
        "rfind",    "index",   "rindex",  "count",      "join",   "format",     "isdigit",
        "isalpha",  "isalnum", "isspace", "islower",    "isupper"};
    static const char* const kList[] = {"append", "extend", "index",   "count", "pop",
                                        "insert", "remove", "reverse", "copy",  "clear"};
    static const char* const kDict[] = {"items", "keys",   "values", "get",
                                        "pop",   "update", "copy",   "setdefault"};
    auto has = [&](const auto& names) {
        return std::any_of(std::begin(names), std::end(names),
                           [&](const char* n) { return name == n; });
    };
    if (obj.is_string() && has(kStr)) return bind_method(obj, name, str_method);
    if (obj.is_list() && has(kList)) return bind_method(obj, name, list_method);
    if (obj.is_dict() && !obj.is_namespace() && has(kDict))
        return bind_method(obj, name, dict_method);
    return Value::undefined();
}

}  // namespace kvrun::jinja
