// Private parts of the Jinja interpreter (jinja.h): values, the syntax tree, the
// interpreter and the built-in filters, tests, methods and globals.
//   jinja.cpp          public API; values: Python-style printing, comparison, operators, JSON
//   jinja_lex.cpp      lexer (whitespace control)
//   jinja_parse.cpp    parser
//   jinja_eval.cpp     the interpreter; attribute / item lookup; globals
//   jinja_filters.cpp  filters and tests
//   jinja_methods.cpp  string helpers; methods of str, list and dict
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common.h"
#include "jinja.h"

namespace kvrun::jinja {

// A runtime error without a location yet: the interpreter adds the line and column of
// the statement being run and rethrows it as kvrun::Error.
struct RuntimeError : std::runtime_error {
    using std::runtime_error::runtime_error;
};
// raise_exception(msg): becomes kvrun::Error(msg) unchanged.
struct RaisedError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

template <typename... Args>
[[noreturn]] void rt_fail(fmt::format_string<Args...> f, Args&&... args) {
    throw RuntimeError(fmt::format(f, std::forward<Args>(args)...));
}

struct Value;
struct ListObj;
struct DictObj;
struct Function;
class Interp;

// Arguments of a call: positional, then keyword.
struct Args {
    std::vector<Value> pos;
    std::vector<std::pair<std::string, Value>> kw;
};

// A Python-like value. Lists and dicts are shared (reference semantics, as in Python), so
// list.append and `set ns.attr` are seen through every reference.
struct Value {
    enum class Type { Undefined, None, Bool, Int, Float, String, List, Dict, Func };
    Type type = Type::Undefined;
    bool b = false;
    int64_t i = 0;
    double f = 0;
    std::string s;  // String; for Undefined, why it is undefined (for error messages)
    std::shared_ptr<ListObj> list;
    std::shared_ptr<DictObj> dict;
    std::shared_ptr<Function> func;

    Value() = default;
    static Value undefined(std::string why = {});
    static Value none();
    static Value boolean(bool v);
    static Value integer(int64_t v);
    static Value number(double v);
    static Value string(std::string v);
    static Value new_list(std::vector<Value> items = {}, bool tuple = false);
    static Value new_dict(bool is_namespace = false);
    static Value function(std::string name, std::function<Value(Interp&, Args&)> fn);

    bool is_undefined() const { return type == Type::Undefined; }
    bool is_none() const { return type == Type::None; }
    bool is_string() const { return type == Type::String; }
    bool is_list() const { return type == Type::List; }
    bool is_dict() const { return type == Type::Dict; }
    // int, float or bool (Python's numbers.Number includes bool)
    bool is_number() const {
        return type == Type::Int || type == Type::Float || type == Type::Bool;
    }
    bool is_namespace() const;
    bool is_tuple() const;
};

struct ListObj {
    std::vector<Value> items;
    bool tuple = false;  // prints as (a, b) instead of [a, b]
};

// An insertion-ordered dict (linear lookup: template dicts are small). Also namespace().
struct DictObj {
    std::vector<std::pair<Value, Value>> items;
    bool is_namespace = false;
    const Value* find(const Value& key) const;
    const Value* find(std::string_view key) const;
    void set(Value key, Value value);
};

struct Function {
    std::string name;
    std::function<Value(Interp&, Args&)> fn;
};

// Size bounds of the render running on this thread (Limits::max_output; no bound outside a
// render): throw when a string of `bytes`, or a list of `count` items, would be too large.
void check_size(size_t bytes);
void check_items(size_t count);

// Registers a new container with the running render (jinja_eval.cpp), which empties it at
// the end so that reference cycles cannot leak.
void register_container(const std::shared_ptr<ListObj>& p);
void register_container(const std::shared_ptr<DictObj>& p);

// --- value helpers (jinja.cpp) ---
bool truthy(const Value& v);
std::string type_name(const Value& v);  // Python's: 'str', 'int', 'dict', 'NoneType', ...
std::string py_str(const Value& v);     // str(v)
std::string py_repr(const Value& v);    // repr(v)
std::string py_float_repr(double d);
// Depth-bounded (a list can contain itself): throw past 200 levels.
bool py_eq(const Value& a, const Value& b, int depth = 0);
bool py_lt(const Value& a, const Value& b, int depth = 0);  // throws for unorderable types
double to_double(const Value& v);                           // numbers only
// Throws "'x' is undefined" when v is undefined (operations jinja2 refuses on undefined).
void require_defined(const Value& v);
Value from_json(const nlohmann::ordered_json& j, int depth = 0);  // throws past 1000 levels
struct JsonOptions {
    bool ensure_ascii = false;
    bool pretty = false;  // indent given
    std::string indent;
    std::string item_sep = ", ", key_sep = ": ";
    bool sort_keys = false;
};
std::string to_json(const Value& v, const JsonOptions& opt);
// UTF-8 code point helpers: Python strings index by code point.
std::vector<size_t> codepoint_offsets(std::string_view s);  // byte offset of each, plus end
size_t codepoint_count(std::string_view s);
std::string encode_utf8(uint32_t cp);
// Items of an iterable: list/tuple items, dict keys, string characters; undefined gives
// none. Throws for others.
std::vector<Value> iterate(const Value& v);
// len(v); undefined is 0. Throws for unsized values.
int64_t py_len(const Value& v);

// --- syntax tree ---
struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
    enum class Kind {
        Literal,  // value
        Name,     // name
        List,     // items
        Tuple,    // items
        Dict,     // items: key, value, key, value, ...
        Attr,     // a.name
        Item,     // a[b]
        Slice,    // a[items[0]:items[1]:items[2]] (null parts absent)
        Call,     // a(items..., kwargs...)
        Filter,   // a | name(items..., kwargs...); a null in a filter block
        Test,     // a is [not] name(items..., kwargs...)
        Neg,      // -a
        Pos,      // +a
        Not,      // not a
        And,      // a and b
        Or,       // a or b
        Binary,   // a name b: + - * / // % **
        Concat,   // items[0] ~ items[1] ~ ...
        Compare,  // a ops[0] items[0] ops[1] items[1] ...: == != < <= > >= in notin
        Cond,     // a if b else c (c may be null)
    };
    Kind kind;
    int line = 0, col = 0;
    Value value;
    std::string name;
    ExprPtr a, b, c;
    std::vector<ExprPtr> items;
    std::vector<std::pair<std::string, ExprPtr>> kwargs;
    std::vector<std::string> ops;
    bool negated = false;  // Test: `is not`
    int height = 1;        // of this subtree (the parser bounds it: no deep recursion)
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
    enum class Kind {
        Text,         // text
        Output,       // {{ expr }}
        If,           // conds[i] -> bodies[i]; bodies[conds.size()] is else when present
        For,          // for targets in expr [if cond]: bodies[0], else bodies[1]
        Set,          // set targets = expr
        SetAttr,      // set targets[0].name = expr
        SetBlock,     // set targets[0] [| filters] %} bodies[0] {% endset
        Macro,        // macro name(targets = defaults) bodies[0]
        Break,        //
        Continue,     //
        FilterBlock,  // filter filters: bodies[0]
        Scope,        // bodies[0] run as is ({% generation %})
    };
    Kind kind;
    int line = 0, col = 0;
    std::string text;  // Text; Macro name; SetAttr attribute
    std::string name;
    std::vector<std::string> targets;
    ExprPtr expr;
    ExprPtr cond;                   // For: filter condition
    std::vector<ExprPtr> conds;     // If conditions
    std::vector<ExprPtr> filters;   // Filter exprs with a null operand, applied in order
    std::vector<ExprPtr> defaults;  // Macro: default of each parameter (null: none)
    std::vector<Body> bodies;
    bool uses_varargs = false, uses_kwargs = false;  // Macro: refers to varargs / kwargs
};

struct Program {
    std::string source;
    Body body;
};

// --- lexer (jinja_lex.cpp) ---
struct Tok {
    enum Type { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, Str, Int, Float, Op, Eof };
    Type type;
    std::string s;  // text, name, string value or operator
    int64_t i = 0;
    double f = 0;
    size_t pos = 0;  // byte offset in the (normalized) source
};
// Tokens of a template (newlines already normalized); ends with Eof. Throws kvrun::Error.
std::vector<Tok> tokenize(const std::string& src);
// "line L, column C" of a byte offset (column counted in bytes, from 1).
std::string where(const std::string& src, size_t pos);
template <typename... Args>
[[noreturn]] void syntax_error(const std::string& src, size_t pos, fmt::format_string<Args...> f,
                               Args&&... args) {
    throw Error(where(src, pos) + ": " + fmt::format(f, std::forward<Args>(args)...));
}

// Parses (jinja_parse.cpp). Throws kvrun::Error "line L, column C: what".
std::shared_ptr<Program> parse_program(std::string_view source, int max_depth);

// --- the interpreter (jinja_eval.cpp) ---
struct Scope {
    std::unordered_map<std::string, Value> vars;
    std::shared_ptr<Scope> parent;
    const Value* lookup(const std::string& name) const;
};
using ScopePtr = std::shared_ptr<Scope>;

class Interp {
  public:
    explicit Interp(const JinjaTemplate::Limits& limits) : limits_(limits) {}
    std::string run(const Program& program, const nlohmann::ordered_json& context);

    // For built-ins: call a callable value; apply a filter / test by name.
    Value call(const Value& callee, Args& args);
    Value apply_filter(const std::string& name, Value input, Args& args);
    bool apply_test(const std::string& name, const Value& input, Args& args);
    // Counts one unit of work (a loop iteration, a macro call); throws past the limit.
    void step();
    // Counts work proportional to a value's size (string bytes, list items): a template
    // looping over costly operations is stopped like one looping too long.
    void charge(const Value& v);
    void charge_bytes(size_t bytes);
    const JinjaTemplate::Limits& limits() const { return limits_; }

  private:
    enum class Flow { Normal, Break, Continue };
    Flow exec(const Body& body, const ScopePtr& scope, std::string& out);
    Flow exec_node(const Node& node, const ScopePtr& scope, std::string& out);
    void exec_for(const Node& node, const ScopePtr& scope, std::string& out);
    Value eval(const Expr& e, const ScopePtr& scope);
    Value eval_binary(const Expr& e, const ScopePtr& scope);
    Value eval_compare(const Expr& e, const ScopePtr& scope);
    Value eval_call(const Expr& e, const ScopePtr& scope);
    void eval_args(const Expr& e, const ScopePtr& scope, Args& args);
    Value make_macro(const Node& node, const ScopePtr& scope);
    void append(std::string& out, std::string_view text);

    struct DepthGuard {
        Interp& in;
        explicit DepthGuard(Interp& i);
        ~DepthGuard() { --in.depth_; }
    };

    const JinjaTemplate::Limits& limits_;
    uint64_t steps_ = 0;
    uint64_t work_bytes_ = 0;
    int depth_ = 0;
};

// --- built-ins (jinja_filters.cpp) ---
using FilterFn = Value (*)(Interp&, Value&, Args&);
using TestFn = bool (*)(Interp&, const Value&, Args&);
FilterFn find_filter(const std::string& name);  // nullptr when unknown
TestFn find_test(const std::string& name);      // nullptr when unknown
// obj.name for str/list/dict methods: a bound function, or undefined when not a method.
Value get_method(const Value& obj, const std::string& name);
// Global functions: range, namespace, dict, raise_exception, strftime_now.
void add_globals(Scope& scope);
// Python's binary operators (+ - * / // % **) on values.
Value arithmetic(Interp& in, const std::string& op, const Value& a, const Value& b);
// obj.name / obj[key] as jinja2 resolves them.
Value get_attr(const Value& obj, const std::string& name);
Value get_item(const Value& obj, const Value& key);
// Python's `format % args` for %s %r %d %i %f %% (a tuple rhs gives several arguments).
std::string percent_format(const std::string& format, const Value& rhs);
// `needle in haystack`
bool contains(const Value& haystack, const Value& needle);
// Python slicing of a list, tuple or string.
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

// --- string and argument helpers (jinja_methods.cpp); case changes are ASCII-only ---
bool py_space(unsigned char c);  // Python's str.isspace for one byte
char lower_c(char c);
char upper_c(char c);
bool alpha_c(char c);
bool digit_c(char c);
std::string to_lower(std::string s);
std::string to_upper(std::string s);
std::string capitalize(const std::string& s);
bool case_test(const std::string& s, bool lower);  // str.islower / str.isupper
// An argument as int / str (named `what` in the error), or a bool with a default.
int64_t as_int(const Value& v, const char* what);
const std::string& as_str(const Value& v, const char* what);
bool arg_bool(const Value& v, bool def);
// str.strip / lstrip / rstrip; chars undefined or none: whitespace.
std::string strip(const std::string& s, const Value& chars, bool left, bool right);
// str.split / str.rsplit (sep undefined or none: runs of whitespace).
Value split(const std::string& s, const Value& sep, const Value& maxsplit, bool from_right);
std::string replace(const std::string& s, const std::string& old, const std::string& repl,
                    int64_t count);  // count < 0: all
std::vector<std::string> splitlines(const std::string& s);
std::string str_format(const std::string& f, Args& args);  // str.format without specs
Value list_of(std::vector<Value> items);

// Binds a call's arguments to parameter names (positional first, then by keyword);
// missing ones are undefined. Throws for too many or unknown arguments.
std::vector<Value> bind_args(Args& args, std::string_view what,
                             std::initializer_list<std::string_view> names);

}  // namespace kvrun::jinja
