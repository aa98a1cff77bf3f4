// Jinja built-ins: filters and tests, each as jinja2 (on Python) behaves.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <ctime>
#include <unordered_map>

#include "common.h"
#include "jinja_impl.h"

namespace kvrun::jinja {

namespace {

// `attribute='a.b.0'` of map, sort, selectattr...: item lookups along a dotted path.
Value attr_path(const Value& v, const Value& path) {
    if (path.type == Value::Type::Int) return get_item(v, path);
    Value cur = v;
    Value parts = split(as_str(path, "attribute"), Value::string("."), Value(), false);
    for (const auto& part : parts.list->items) {
        if (!part.s.empty() && std::all_of(part.s.begin(), part.s.end(), digit_c)) {
            int64_t index = 0;
            auto r = std::from_chars(part.s.data(), part.s.data() + part.s.size(), index);
            if (r.ec != std::errc()) rt_fail("attribute index '{}' out of range", part.s);
            cur = get_item(cur, Value::integer(index));
        } else {
            cur = get_item(cur, part);
        }
    }
    return cur;
}

// Sort key: lowercased strings when not case-sensitive.
Value sort_key(const Value& v, bool case_sensitive) {
    if (!case_sensitive && v.is_string()) return Value::string(to_lower(v.s));
    return v;
}

std::string html_escape(const std::string& s) {
    std::string out;
    for (char c : s) {
        switch (c) {
            case '&':
                out += "&amp;";
                break;
            case '<':
                out += "&lt;";
                break;
            case '>':
                out += "&gt;";
                break;
            case '"':
                out += "&#34;";
                break;
            case '\'':
                out += "&#39;";
                break;
            default:
                out += c;
        }
    }
    return out;
}

// ---- filters ----

#define FILTER(name) Value name(Interp& in, Value& v, Args& args)

FILTER(f_trim) {
    auto a = bind_args(args, "trim", {"chars"});
    return Value::string(strip(py_str(v), a[0], true, true));
}
FILTER(f_upper) {
    bind_args(args, "upper", {});
    return Value::string(to_upper(py_str(v)));
}
FILTER(f_lower) {
    bind_args(args, "lower", {});
    return Value::string(to_lower(py_str(v)));
}
FILTER(f_capitalize) {
    bind_args(args, "capitalize", {});
    return Value::string(capitalize(py_str(v)));
}
// jinja2's title: a word starts after whitespace, '-', or an opening bracket.
FILTER(f_title) {
    bind_args(args, "title", {});
    std::string s = py_str(v);
    bool start = true;
    for (char& c : s) {
        bool delim = py_space(static_cast<unsigned char>(c)) || std::strchr("-({[<", c) != nullptr;
        c = start ? upper_c(c) : lower_c(c);
        start = delim;
    }
    return Value::string(std::move(s));
}
FILTER(f_length) {
    bind_args(args, "length", {});
    return Value::integer(py_len(v));
}
FILTER(f_first) {
    bind_args(args, "first", {});
    auto items = iterate(v);
    return items.empty() ? Value::undefined("first: empty sequence") : items.front();
}
FILTER(f_last) {
    bind_args(args, "last", {});
    require_defined(v);
    auto items = iterate(v);
    return items.empty() ? Value::undefined("last: empty sequence") : items.back();
}
FILTER(f_join) {
    auto a = bind_args(args, "join", {"d", "attribute"});
    std::string sep = a[0].is_undefined() ? "" : py_str(a[0]), out;
    bool first = true;
    for (auto& item : iterate(v)) {
        if (!first) out += sep;
        first = false;
        out += py_str(a[1].is_undefined() ? item : attr_path(item, a[1]));
        check_size(out.size());
    }
    return Value::string(std::move(out));
}
FILTER(f_default) {
    auto a = bind_args(args, "default", {"default_value", "boolean"});
    bool use = v.is_undefined() || (arg_bool(a[1], false) && !truthy(v));
    if (!use) return v;
    return a[0].is_undefined() ? Value::string("") : a[0];
}
// HF's tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False).
FILTER(f_tojson) {
    auto a = bind_args(args, "tojson", {"ensure_ascii", "indent", "separators", "sort_keys"});
    JsonOptions opt;
    opt.ensure_ascii = arg_bool(a[0], false);
    opt.sort_keys = arg_bool(a[3], false);
    if (!a[1].is_undefined() && !a[1].is_none()) {
        opt.pretty = true;
        opt.item_sep = ",";
        if (a[1].is_string()) {
            opt.indent = a[1].s;
        } else {
            int64_t n = as_int(a[1], "tojson indent");
            opt.indent = std::string(size_t(std::clamp<int64_t>(n, 0, 64)), ' ');
        }
    }
    if (!a[2].is_undefined() && !a[2].is_none()) {
        auto seps = iterate(a[2]);
        if (seps.size() != 2) rt_fail("tojson: separators must be a pair of strings");
        opt.item_sep = as_str(seps[0], "tojson separators");
        opt.key_sep = as_str(seps[1], "tojson separators");
    }
    std::string out = to_json(v, opt);
    check_size(out.size());
    return Value::string(std::move(out));
}
FILTER(f_string) {
    bind_args(args, "string", {});
    return v.is_string() ? v : Value::string(py_str(v));
}
FILTER(f_int) {
    auto a = bind_args(args, "int", {"default", "base"});
    Value def = a[0].is_undefined() ? Value::integer(0) : a[0];
    switch (v.type) {
        case Value::Type::Int:
            return v;
        case Value::Type::Bool:
            return Value::integer(v.b);
        case Value::Type::Float:
            if (!std::isfinite(v.f) || std::fabs(v.f) >= 9.2e18) return def;
            return Value::integer(int64_t(v.f));
        case Value::Type::String: {
            std::string s = strip(v.s, Value(), true, true);
            s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
            int base = a[1].is_undefined() ? 10 : int(as_int(a[1], "int base"));
            if (s.empty() || base < 2 || base > 36) return def;
            errno = 0;
            char* end = nullptr;
            long long x = std::strtoll(s.c_str(), &end, base);
            if (errno == 0 && *end == 0) return Value::integer(x);
            if (base != 10) return def;
            double d = std::strtod(s.c_str(), &end);
            if (*end != 0 || !std::isfinite(d) || std::fabs(d) >= 9.2e18) return def;
            return Value::integer(int64_t(d));
        }
        default:
            return def;
    }
}
FILTER(f_float) {
    auto a = bind_args(args, "float", {"default"});
    Value def = a[0].is_undefined() ? Value::number(0) : a[0];
    if (v.is_number()) return Value::number(to_double(v));
    if (v.is_string()) {
        std::string s = strip(v.s, Value(), true, true);
        char* end = nullptr;
        double d = std::strtod(s.c_str(), &end);
        if (!s.empty() && *end == 0) return Value::number(d);
    }
    return def;
}
FILTER(f_abs) {
    bind_args(args, "abs", {});
    if (v.type == Value::Type::Float) return Value::number(std::fabs(v.f));
    int64_t x = as_int(v, "abs");
    if (x == INT64_MIN) rt_fail("integer overflow");
    return Value::integer(x < 0 ? -x : x);
}
// round(precision=0, method='common'): Python's round (half to even on the exact binary
// value, which printf's correctly rounded %.*f gives), or ceil / floor.
FILTER(f_round) {
    auto a = bind_args(args, "round", {"precision", "method"});
    int64_t prec = a[0].is_undefined() ? 0 : as_int(a[0], "round");
    std::string method = a[1].is_undefined() ? "common" : as_str(a[1], "round");
    if (method != "common" && method != "ceil" && method != "floor")
        rt_fail("method must be 'common', 'ceil' or 'floor'");
    if (method == "common" && v.type != Value::Type::Float) {
        require_defined(v);
        return Value::integer(as_int(v, "round"));  // round(int) stays int (precision >= 0)
    }
    double x = to_double(v);
    if (method != "common") {
        double scale = std::pow(10.0, double(prec));
        return Value::number((method == "ceil" ? std::ceil(x * scale) : std::floor(x * scale)) /
                             scale);
    }
    if (!std::isfinite(x)) return Value::number(x);
    if (prec < 0) {
        double scale = std::pow(10.0, double(-prec));
        return Value::number(std::nearbyint(x / scale) * scale);
    }
    std::string s = fmt::format("{:.{}f}", x, std::min<int64_t>(prec, 300));
    return Value::number(std::strtod(s.c_str(), nullptr));
}
FILTER(f_list) {
    bind_args(args, "list", {});
    return list_of(iterate(v));
}
FILTER(f_items) {
    bind_args(args, "items", {});
    if (v.is_undefined()) return list_of({});
    if (!v.is_dict() || v.is_namespace())
        rt_fail("items: expected a mapping, got {}", type_name(v));
    std::vector<Value> out;
    for (auto& [k, x] : v.dict->items) out.push_back(Value::new_list({k, x}, true));
    return list_of(std::move(out));
}
FILTER(f_dictsort) {
    auto a = bind_args(args, "dictsort", {"case_sensitive", "by", "reverse"});
    if (!v.is_dict() || v.is_namespace())
        rt_fail("dictsort: expected a mapping, got {}", type_name(v));
    bool cs = arg_bool(a[0], false), rev = arg_bool(a[2], false);
    std::string by = a[1].is_undefined() ? "key" : as_str(a[1], "dictsort");
    if (by != "key" && by != "value") rt_fail("You can only sort by either 'key' or 'value'");
    std::vector<std::pair<Value, Value>> items = v.dict->items;
    std::stable_sort(items.begin(), items.end(), [&](auto& x, auto& y) {
        const Value& p = by == "key" ? x.first : x.second;
        const Value& q = by == "key" ? y.first : y.second;
        return rev ? py_lt(sort_key(q, cs), sort_key(p, cs))
                   : py_lt(sort_key(p, cs), sort_key(q, cs));
    });
    std::vector<Value> out;
    for (auto& [k, x] : items) out.push_back(Value::new_list({k, x}, true));
    return list_of(std::move(out));
}
FILTER(f_sort) {
    auto a = bind_args(args, "sort", {"reverse", "case_sensitive", "attribute"});
    bool rev = arg_bool(a[0], false), cs = arg_bool(a[1], false);
    std::vector<Value> items = iterate(v);
    std::vector<Value> keys;
    for (auto& x : items)
        keys.push_back(sort_key(a[2].is_undefined() ? x : attr_path(x, a[2]), cs));
    std::vector<size_t> order(items.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = k;
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
        return rev ? py_lt(keys[y], keys[x]) : py_lt(keys[x], keys[y]);
    });
    std::vector<Value> out;
    for (size_t k : order) out.push_back(items[k]);
    return list_of(std::move(out));
}
FILTER(f_unique) {
    auto a = bind_args(args, "unique", {"case_sensitive", "attribute"});
    bool cs = arg_bool(a[0], false);
    std::vector<Value> out, seen;
    for (auto& x : iterate(v)) {
        Value key = sort_key(a[1].is_undefined() ? x : attr_path(x, a[1]), cs);
        if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return py_eq(s, key); }))
            continue;
        seen.push_back(key);
        out.push_back(x);
    }
    return list_of(std::move(out));
}
FILTER(f_reverse) {
    bind_args(args, "reverse", {});
    if (v.is_string()) {
        auto offs = codepoint_offsets(v.s);
        std::string out;
        for (size_t k = offs.size() - 1; k > 0; --k)
            out.append(v.s, offs[k - 1], offs[k] - offs[k - 1]);
        return Value::string(std::move(out));
    }
    auto items = iterate(v);
    std::reverse(items.begin(), items.end());
    return list_of(std::move(items));
}
FILTER(f_replace) {
    auto a = bind_args(args, "replace", {"old", "new", "count"});
    std::string out = replace(py_str(v), as_str(a[0], "replace"), as_str(a[1], "replace"),
                              a[2].is_undefined() || a[2].is_none() ? -1 : as_int(a[2], "replace"));
    check_size(out.size());
    return Value::string(std::move(out));
}
FILTER(f_safe) {
    bind_args(args, "safe", {});
    return v;
}
FILTER(f_escape) {
    bind_args(args, "escape", {});
    return Value::string(html_escape(py_str(v)));
}
// jinja2 3.1's indent(width=4, first=False, blank=False); width may be a string.
FILTER(f_indent) {
    auto a = bind_args(args, "indent", {"width", "first", "blank"});
    std::string ind =
        a[0].is_undefined() ? "    "
        : a[0].is_string()
            ? a[0].s
            : std::string(size_t(std::clamp<int64_t>(as_int(a[0], "indent"), 0, 1024)), ' ');
    auto lines = splitlines(py_str(v) + "\n");
    std::string out;
    for (size_t k = 0; k < lines.size(); ++k) {
        if (k) out += '\n';
        if (k && (arg_bool(a[2], false) || !lines[k].empty())) out += ind;
        out += lines[k];
        check_size(out.size());
    }
    if (arg_bool(a[1], false)) out = ind + out;
    return Value::string(std::move(out));
}
FILTER(f_center) {
    auto a = bind_args(args, "center", {"width"});
    std::string s = py_str(v);
    int64_t width = a[0].is_undefined() ? 80 : as_int(a[0], "center");
    int64_t pad = width - int64_t(codepoint_count(s));
    if (pad <= 0) return Value::string(s);
    check_size(size_t(width));
    int64_t left = pad / 2 + (pad & width & 1);
    return Value::string(std::string(size_t(left), ' ') + s + std::string(size_t(pad - left), ' '));
}
FILTER(f_wordcount) {
    bind_args(args, "wordcount", {});
    std::string s = py_str(v);
    int64_t n = 0;
    bool in_word = false;
    for (char c : s) {
        bool w = alpha_c(c) || digit_c(c) || c == '_' || (static_cast<unsigned char>(c) & 0x80);
        if (w && !in_word) ++n;
        in_word = w;
    }
    return Value::integer(n);
}
FILTER(f_truncate) {
    auto a = bind_args(args, "truncate", {"length", "killwords", "end", "leeway"});
    std::string s = py_str(v);
    int64_t length = a[0].is_undefined() ? 255 : as_int(a[0], "truncate");
    std::string end = a[2].is_undefined() ? "..." : as_str(a[2], "truncate");
    int64_t leeway = a[3].is_undefined() || a[3].is_none() ? 5 : as_int(a[3], "truncate");
    auto offs = codepoint_offsets(s);
    int64_t n = int64_t(offs.size()) - 1;
    if (n <= length + leeway) return Value::string(s);
    int64_t keep = std::clamp<int64_t>(length - int64_t(codepoint_count(end)), 0, n);
    std::string head = s.substr(0, offs[size_t(keep)]);
    if (!arg_bool(a[1], false)) {
        size_t sp = head.rfind(' ');
        if (sp != std::string::npos) head.resize(sp);
    }
    return Value::string(head + end);
}
FILTER(f_map) {
    std::vector<Value> out;
    bool by_attr = false;
    Value attr, def;
    for (auto& [k, x] : args.kw) {
        if (k == "attribute") {
            by_attr = true;
            attr = x;
        } else if (k == "default") {
            def = x;
        }
    }
    if (by_attr) {
        for (auto& item : iterate(v)) {
            Value r = attr_path(item, attr);
            out.push_back(r.is_undefined() && !def.is_undefined() ? def : r);
        }
        return list_of(std::move(out));
    }
    if (args.pos.empty()) rt_fail("map: needs a filter name or attribute=");
    std::string name = as_str(args.pos[0], "map");
    Args rest;
    rest.pos.assign(args.pos.begin() + 1, args.pos.end());
    rest.kw = args.kw;
    for (auto& item : iterate(v)) {
        Args copy = rest;
        out.push_back(in.apply_filter(name, item, copy));
    }
    return list_of(std::move(out));
}
// select / reject / selectattr / rejectattr
Value select_impl(Interp& in, Value& v, Args& args, bool attr, bool keep) {
    size_t first_test = attr ? 1 : 0;
    if (attr && args.pos.empty()) rt_fail("selectattr: missing attribute name");
    std::string test = args.pos.size() > first_test ? as_str(args.pos[first_test], "select") : "";
    Args targs;
    if (args.pos.size() > first_test + 1)
        targs.pos.assign(args.pos.begin() + long(first_test) + 1, args.pos.end());
    targs.kw = args.kw;
    std::vector<Value> out;
    for (auto& item : iterate(v)) {
        Value x = attr ? attr_path(item, args.pos[0]) : item;
        Args copy = targs;
        bool ok = test.empty() ? truthy(x) : in.apply_test(test, x, copy);
        if (ok == keep) out.push_back(item);
    }
    return list_of(std::move(out));
}
FILTER(f_select) {
    return select_impl(in, v, args, false, true);
}
FILTER(f_reject) {
    return select_impl(in, v, args, false, false);
}
FILTER(f_selectattr) {
    return select_impl(in, v, args, true, true);
}
FILTER(f_rejectattr) {
    return select_impl(in, v, args, true, false);
}
Value min_max(Value& v, Args& args, bool max) {
    auto a = bind_args(args, max ? "max" : "min", {"case_sensitive", "attribute"});
    bool cs = arg_bool(a[0], false);
    auto items = iterate(v);
    if (items.empty()) return Value::undefined("no items for min/max");
    size_t best = 0;
    auto key = [&](size_t k) {
        return sort_key(a[1].is_undefined() ? items[k] : attr_path(items[k], a[1]), cs);
    };
    for (size_t k = 1; k < items.size(); ++k)
        if (max ? py_lt(key(best), key(k)) : py_lt(key(k), key(best))) best = k;
    return items[best];
}
FILTER(f_min) {
    return min_max(v, args, false);
}
FILTER(f_max) {
    return min_max(v, args, true);
}
FILTER(f_sum) {
    auto a = bind_args(args, "sum", {"attribute", "start"});
    Value total = a[1].is_undefined() ? Value::integer(0) : a[1];
    for (auto& item : iterate(v))
        total = arithmetic(in, "+", total, a[0].is_undefined() ? item : attr_path(item, a[0]));
    return total;
}
FILTER(f_batch) {
    auto a = bind_args(args, "batch", {"linecount", "fill_with"});
    int64_t n = as_int(a[0], "batch");
    if (n <= 0) rt_fail("batch: linecount must be positive");
    std::vector<Value> out;
    Value cur = list_of({});
    for (auto& item : iterate(v)) {
        cur.list->items.push_back(item);
        if (int64_t(cur.list->items.size()) == n) {
            out.push_back(cur);
            cur = list_of({});
        }
    }
    if (!cur.list->items.empty()) {
        if (!a[1].is_undefined() && !a[1].is_none())
            while (int64_t(cur.list->items.size()) < n) cur.list->items.push_back(a[1]);
        out.push_back(cur);
    }
    return list_of(std::move(out));
}
// "%s and %s"|format(a, b): Python's % formatting.
FILTER(f_format) {
    if (!args.kw.empty()) rt_fail("format: keyword arguments are not supported");
    return Value::string(percent_format(py_str(v), Value::new_list(args.pos, true)));
}
FILTER(f_attr) {
    // Python attributes only: attr('role') of a dict is undefined, unlike x.role.
    auto a = bind_args(args, "attr", {"name"});
    const std::string& name = as_str(a[0], "attr");
    require_defined(v);
    Value m = get_method(v, name);
    if (m.is_undefined() && v.is_namespace()) return get_attr(v, name);
    return m.is_undefined() ? Value::undefined(fmt::format("no attribute '{}'", name)) : m;
}

#undef FILTER

// ---- tests ----

#define TEST(name) bool name(Interp& in, const Value& v, Args& args)

Value one_arg(Args& args, const char* what) {
    auto a = bind_args(args, what, {"other"});
    return a[0];
}
TEST(t_defined) {
    return !v.is_undefined();
}
TEST(t_undefined) {
    return v.is_undefined();
}
TEST(t_none) {
    return v.is_none();
}
TEST(t_boolean) {
    return v.type == Value::Type::Bool;
}
TEST(t_true) {
    return v.type == Value::Type::Bool && v.b;
}
TEST(t_false) {
    return v.type == Value::Type::Bool && !v.b;
}
TEST(t_integer) {
    return v.type == Value::Type::Int;
}
TEST(t_float) {
    return v.type == Value::Type::Float;
}
TEST(t_number) {
    return v.is_number();
}
TEST(t_string) {
    return v.is_string();
}
TEST(t_mapping) {
    return v.is_dict() && !v.is_namespace();
}
TEST(t_iterable) {
    return v.is_undefined() || v.is_string() || v.is_list() || (v.is_dict() && !v.is_namespace());
}
TEST(t_sequence) {
    return v.is_string() || v.is_list() || (v.is_dict() && !v.is_namespace());
}
TEST(t_callable) {
    return v.type == Value::Type::Func;
}
TEST(t_odd) {
    return as_int(v, "odd") % 2 != 0;
}
TEST(t_even) {
    return as_int(v, "even") % 2 == 0;
}
TEST(t_divisibleby) {
    int64_t d = as_int(one_arg(args, "divisibleby"), "divisibleby");
    if (d == 0) rt_fail("integer division or modulo by zero");
    return d == -1 || as_int(v, "divisibleby") % d == 0;
}
TEST(t_eq) {
    return py_eq(v, one_arg(args, "eq"));
}
TEST(t_ne) {
    return !py_eq(v, one_arg(args, "ne"));
}
TEST(t_lt) {
    return py_lt(v, one_arg(args, "lt"));
}
TEST(t_le) {
    Value o = one_arg(args, "le");
    return py_lt(v, o) || py_eq(v, o);
}
TEST(t_gt) {
    return py_lt(one_arg(args, "gt"), v);
}
TEST(t_ge) {
    Value o = one_arg(args, "ge");
    return py_lt(o, v) || py_eq(v, o);
}
TEST(t_in) {
    return contains(one_arg(args, "in"), v);
}
TEST(t_sameas) {
    Value o = one_arg(args, "sameas");
    if (v.type != o.type) return false;
    if (v.is_list()) return v.list == o.list;
    if (v.is_dict()) return v.dict == o.dict;
    return py_eq(v, o);
}
TEST(t_lower) {
    return case_test(py_str(v), true);
}
TEST(t_upper) {
    return case_test(py_str(v), false);
}
TEST(t_escaped) {
    return false;
}
TEST(t_filter) {
    return v.is_string() && find_filter(v.s) != nullptr;
}
TEST(t_test) {
    return v.is_string() && find_test(v.s) != nullptr;
}

#undef TEST

}  // namespace

FilterFn find_filter(const std::string& name) {
    static const std::unordered_map<std::string, FilterFn> filters = {
        {"abs", f_abs},           {"attr", f_attr},
        {"batch", f_batch},       {"capitalize", f_capitalize},
        {"center", f_center},     {"count", f_length},
        {"d", f_default},         {"default", f_default},
        {"dictsort", f_dictsort}, {"e", f_escape},
        {"escape", f_escape},     {"first", f_first},
        {"float", f_float},       {"forceescape", f_escape},
        {"format", f_format},     {"indent", f_indent},
        {"int", f_int},           {"items", f_items},
        {"join", f_join},         {"last", f_last},
        {"length", f_length},     {"list", f_list},
        {"lower", f_lower},       {"map", f_map},
        {"max", f_max},           {"min", f_min},
        {"reject", f_reject},     {"rejectattr", f_rejectattr},
        {"replace", f_replace},   {"reverse", f_reverse},
        {"round", f_round},       {"safe", f_safe},
        {"select", f_select},     {"selectattr", f_selectattr},
        {"sort", f_sort},         {"string", f_string},
        {"sum", f_sum},           {"title", f_title},
        {"tojson", f_tojson},     {"trim", f_trim},
        {"truncate", f_truncate}, {"unique", f_unique},
        {"upper", f_upper},       {"wordcount", f_wordcount},
    };
    auto it = filters.find(name);
    return it == filters.end() ? nullptr : it->second;
}

TestFn find_test(const std::string& name) {
    static const std::unordered_map<std::string, TestFn> tests = {
        {"defined", t_defined},
        {"undefined", t_undefined},
        {"none", t_none},
        {"boolean", t_boolean},
        {"true", t_true},
        {"false", t_false},
        {"integer", t_integer},
        {"float", t_float},
        {"number", t_number},
        {"string", t_string},
        {"mapping", t_mapping},
        {"iterable", t_iterable},
        {"sequence", t_sequence},
        {"callable", t_callable},
        {"odd", t_odd},
        {"even", t_even},
        {"divisibleby", t_divisibleby},
        {"eq", t_eq},
        {"equalto", t_eq},
        {"==", t_eq},
        {"ne", t_ne},
        {"!=", t_ne},
        {"lt", t_lt},
        {"lessthan", t_lt},
        {"<", t_lt},
        {"le", t_le},
        {"<=", t_le},
        {"gt", t_gt},
        {"greaterthan", t_gt},
        {">", t_gt},
        {"ge", t_ge},
        {">=", t_ge},
        {"in", t_in},
        {"sameas", t_sameas},
        {"lower", t_lower},
        {"upper", t_upper},
        {"escaped", t_escaped},
        {"filter", t_filter},
        {"test", t_test},
    };
    auto it = tests.find(name);
    return it == tests.end() ? nullptr : it->second;
}

}  // namespace kvrun::jinja
