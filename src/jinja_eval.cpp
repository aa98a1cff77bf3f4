// Jinja interpreter: runs the syntax tree (jinja_impl.h) against a context.
//
// Scoping follows jinja2: the template's top level is one scope; each for-loop iteration
// and each macro call gets a fresh child scope (so `set` inside a loop does not leak out,
// hence namespace()); if-blocks share their parent's scope.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ctime>

#include "common.h"
#include "jinja_impl.h"

namespace kvrun::jinja {

// Every list and dict created during a render, so that run() can break reference cycles
// (a list appended to itself, `set ns.self = ns`) that would otherwise leak.
struct ContainerRegistry {
    std::vector<std::weak_ptr<ListObj>> lists;
    std::vector<std::weak_ptr<DictObj>> dicts;
    size_t compact_at = 1024;
    void compact() {
        auto dead = [](auto& w) { return w.expired(); };
        lists.erase(std::remove_if(lists.begin(), lists.end(), dead), lists.end());
        dicts.erase(std::remove_if(dicts.begin(), dicts.end(), dead), dicts.end());
        compact_at = std::max<size_t>(1024, 2 * (lists.size() + dicts.size()));
    }
    template <typename T>
    void add(std::vector<std::weak_ptr<T>>& v, const std::shared_ptr<T>& p) {
        v.push_back(p);
        if (lists.size() + dicts.size() >= compact_at) compact();
    }
};
thread_local ContainerRegistry* g_registry = nullptr;

void register_container(const std::shared_ptr<ListObj>& p) {
    if (g_registry) g_registry->add(g_registry->lists, p);
}
void register_container(const std::shared_ptr<DictObj>& p) {
    if (g_registry) g_registry->add(g_registry->dicts, p);
}

const Value* Scope::lookup(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent.get()) {
        auto it = s->vars.find(name);
        if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
}

namespace {

// Bytes of stack one render may use before it is stopped (deep macro recursion), on top
// of the depth limit: sanitizer builds have much larger frames.
constexpr size_t kStackBudget = size_t(2) << 20;
thread_local const char* g_stack_base = nullptr;
thread_local size_t g_max_size = SIZE_MAX;

}  // namespace

void check_size(size_t bytes) {
    if (bytes > g_max_size)
        rt_fail("template output or value too large (over {} bytes)", g_max_size);
}

void check_items(size_t count) {
    check_size(count > SIZE_MAX / sizeof(Value) ? SIZE_MAX : count * sizeof(Value));
}

Interp::DepthGuard::DepthGuard(Interp& i) : in(i) {
    char probe = 0;
    size_t used = g_stack_base ? size_t(g_stack_base - &probe) : 0;
    if (++in.depth_ > in.limits_.max_depth * 5 || used > kStackBudget) {
        --in.depth_;
        rt_fail("template recursion too deep");
    }
}

std::string Interp::run(const Program& program, const nlohmann::ordered_json& context) {
    if (!context.is_object() && !context.is_null())
        fail("jinja: the render context must be a JSON object, not {}", context.type_name());
    // Set up the cycle breaker and the stack reference for this render; restore the outer
    // ones after (a render may run inside another's strftime_now... never, but be safe).
    ContainerRegistry registry;
    ContainerRegistry* saved_registry = g_registry;
    const char* saved_base = g_stack_base;
    size_t saved_max = g_max_size;
    char base = 0;
    g_registry = &registry;
    g_stack_base = &base;
    g_max_size = limits_.max_output;
    struct Restore {
        ContainerRegistry* reg;
        ContainerRegistry* saved_reg;
        const char* saved_base;
        size_t saved_max;
        ~Restore() {
            // Empty every container still alive: drops any cycle among them.
            for (auto& w : reg->lists)
                if (auto p = w.lock()) std::vector<Value>().swap(p->items);
            for (auto& w : reg->dicts)
                if (auto p = w.lock()) std::vector<std::pair<Value, Value>>().swap(p->items);
            g_registry = saved_reg;
            g_stack_base = saved_base;
            g_max_size = saved_max;
        }
    } restore{&registry, saved_registry, saved_base, saved_max};

    auto globals = std::make_shared<Scope>();
    add_globals(*globals);
    auto top = std::make_shared<Scope>();
    top->parent = globals;
    if (context.is_object())
        for (auto& [k, v] : context.items()) top->vars[k] = from_json(v);
    std::string out;
    try {
        exec(program.body, top, out);
    } catch (const RaisedError& e) {
        throw Error(e.what());
    } catch (const RuntimeError& e) {  // not inside any statement (should not happen)
        throw Error(e.what());
    }
    // Values hold the scopes' closures; drop them while the registry is still active.
    top.reset();
    globals.reset();
    return out;
}

void Interp::step() {
    if (++steps_ > limits_.max_steps)
        rt_fail("template ran too long (more than {} steps: loop iterations, calls, filters)",
                limits_.max_steps);
}

void Interp::charge_bytes(size_t bytes) {
    // Budget: copying the largest allowed output 64 times over (about a second).
    work_bytes_ += bytes;
    if (work_bytes_ / 64 > limits_.max_output)
        rt_fail("template does too much work (over {} bytes of values built)",
                uint64_t(limits_.max_output) * 64);
}

void Interp::charge(const Value& v) {
    if (v.is_string()) {
        charge_bytes(v.s.size());
    } else if (v.is_list()) {
        charge_bytes(v.list->items.size() * 32);
    } else if (v.is_dict()) {
        charge_bytes(v.dict->items.size() * 64);
    }
}

void Interp::append(std::string& out, std::string_view text) {
    check_size(out.size() + text.size());
    charge_bytes(text.size());
    out += text;
}

Interp::Flow Interp::exec(const Body& body, const ScopePtr& scope, std::string& out) {
    for (auto& node : body) {
        Flow f = exec_node(*node, scope, out);
        if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
}

Interp::Flow Interp::exec_node(const Node& node, const ScopePtr& scope, std::string& out) {
    DepthGuard guard(*this);
    try {
        switch (node.kind) {
            case Node::Kind::Text:
                append(out, node.text);
                break;
            case Node::Kind::Output:
                append(out, py_str(eval(*node.expr, scope)));
                break;
            case Node::Kind::If:
                for (size_t k = 0; k < node.conds.size(); ++k)
                    if (truthy(eval(*node.conds[k], scope)))
                        return exec(node.bodies[k], scope, out);
                if (node.bodies.size() > node.conds.size())
                    return exec(node.bodies.back(), scope, out);
                break;
            case Node::Kind::For:
                exec_for(node, scope, out);
                break;
            case Node::Kind::Set: {
                Value v = eval(*node.expr, scope);
                if (node.targets.size() == 1) {
                    scope->vars[node.targets[0]] = std::move(v);
                    break;
                }
                std::vector<Value> items = iterate(v);
                if (items.size() != node.targets.size())
                    rt_fail("cannot unpack {} values into {} names", items.size(),
                            node.targets.size());
                for (size_t k = 0; k < items.size(); ++k) scope->vars[node.targets[k]] = items[k];
                break;
            }
            case Node::Kind::SetAttr: {
                const Value* obj = scope->lookup(node.targets[0]);
                if (!obj || !obj->is_namespace())
                    rt_fail("cannot assign attribute on non-namespace object '{}'",
                            node.targets[0]);
                Value v = eval(*node.expr, scope);
                obj->dict->set(Value::string(node.text), std::move(v));
                break;
            }
            case Node::Kind::SetBlock:
            case Node::Kind::FilterBlock: {
                std::string text;
                exec(node.bodies[0], scope, text);
                Value v = Value::string(std::move(text));
                for (auto& f : node.filters) {
                    Args args;
                    eval_args(*f, scope, args);
                    v = apply_filter(f->name, std::move(v), args);
                }
                if (node.kind == Node::Kind::SetBlock) {
                    scope->vars[node.targets[0]] = std::move(v);
                } else {
                    append(out, py_str(v));
                }
                break;
            }
            case Node::Kind::Macro:
                scope->vars[node.text] = make_macro(node, scope);
                break;
            case Node::Kind::Break:
                return Flow::Break;
            case Node::Kind::Continue:
                return Flow::Continue;
            case Node::Kind::Scope:
                return exec(node.bodies[0], scope, out);
        }
    } catch (const RuntimeError& e) {
        throw Error(fmt::format("line {}, column {}: {}", node.line, node.col, e.what()));
    }
    return Flow::Normal;
}

namespace {

// Binds a loop item to the loop's target names (`for k, v in ...` unpacks).
void bind_targets(const std::vector<std::string>& targets, const Value& item, Scope& scope) {
    if (targets.size() == 1) {
        scope.vars[targets[0]] = item;
        return;
    }
    std::vector<Value> parts = iterate(item);
    if (parts.size() != targets.size())
        rt_fail("cannot unpack {} values into {} loop variables", parts.size(), targets.size());
    for (size_t k = 0; k < parts.size(); ++k) scope.vars[targets[k]] = parts[k];
}

}  // namespace

void Interp::exec_for(const Node& node, const ScopePtr& scope, std::string& out) {
    std::vector<Value> items = iterate(eval(*node.expr, scope));
    if (node.cond) {  // `for x in xs if cond`: filtered first, so loop.length counts the kept
        std::vector<Value> kept;
        for (auto& item : items) {
            step();
            auto s = std::make_shared<Scope>();
            s->parent = scope;
            bind_targets(node.targets, item, *s);
            if (truthy(eval(*node.cond, s))) kept.push_back(item);
        }
        items = std::move(kept);
    }
    if (items.empty()) {
        if (node.bodies.size() > 1) {
            auto s = std::make_shared<Scope>();
            s->parent = scope;
            exec(node.bodies[1], s, out);
        }
        return;
    }
    const int64_t n = int64_t(items.size());
    auto index = std::make_shared<int64_t>(0);
    // loop.cycle('a', 'b'): the argument at loop.index0 modulo their count.
    Value cycle = Value::function("cycle", [index](Interp&, Args& args) {
        if (args.pos.empty()) rt_fail("loop.cycle() needs at least one argument");
        return args.pos[size_t(*index % int64_t(args.pos.size()))];
    });
    // One `loop` object per loop, updated in place (as jinja2's LoopContext advances).
    Value loop = Value::new_dict();
    static const char* const kKeys[] = {"index",  "index0",   "revindex", "revindex0",
                                        "first",  "last",     "length",   "depth",
                                        "depth0", "previtem", "nextitem", "cycle"};
    for (const char* key : kKeys) loop.dict->items.emplace_back(Value::string(key), Value());
    auto& slot = loop.dict->items;
    slot[6].second = Value::integer(n);
    slot[7].second = Value::integer(1);
    slot[8].second = Value::integer(0);
    slot[11].second = cycle;
    // Each iteration starts from an empty scope (nothing set in one is seen by the next).
    auto s = std::make_shared<Scope>();
    s->parent = scope;
    for (int64_t k = 0; k < n; ++k) {
        step();
        *index = k;
        s->vars.clear();
        bind_targets(node.targets, items[size_t(k)], *s);
        slot[0].second = Value::integer(k + 1);
        slot[1].second = Value::integer(k);
        slot[2].second = Value::integer(n - k);
        slot[3].second = Value::integer(n - k - 1);
        slot[4].second = Value::boolean(k == 0);
        slot[5].second = Value::boolean(k == n - 1);
        slot[9].second =
            k > 0 ? items[size_t(k - 1)] : Value::undefined("there is no previous item");
        slot[10].second =
            k + 1 < n ? items[size_t(k + 1)] : Value::undefined("there is no next item");
        s->vars["loop"] = loop;
        Flow f = exec(node.bodies[0], s, out);
        if (f == Flow::Break) break;
    }
}

Value Interp::make_macro(const Node& node, const ScopePtr& scope) {
    // The macro sees its defining scope (held weakly: the scope holds the macro).
    std::weak_ptr<Scope> weak = scope;
    const Node* def = &node;
    return Value::function(node.text, [def, weak](Interp& in, Args& args) {
        ScopePtr parent = weak.lock();
        if (!parent) rt_fail("macro '{}' called after its scope ended", def->text);
        DepthGuard guard(in);
        in.step();
        auto s = std::make_shared<Scope>();
        s->parent = parent;
        const size_t n = def->targets.size();
        std::vector<bool> given(n, false);
        Value varargs = def->uses_varargs ? Value::new_list({}, true) : Value();
        Value kwargs = def->uses_kwargs ? Value::new_dict() : Value();
        for (size_t k = 0; k < args.pos.size(); ++k) {
            if (k < n) {
                s->vars[def->targets[k]] = args.pos[k];
                given[k] = true;
            } else if (def->uses_varargs) {
                varargs.list->items.push_back(args.pos[k]);
            } else {
                rt_fail("macro '{}' takes not more than {} argument(s)", def->text, n);
            }
        }
        for (auto& [key, v] : args.kw) {
            auto it = std::find(def->targets.begin(), def->targets.end(), key);
            if (it == def->targets.end()) {
                if (!def->uses_kwargs)
                    rt_fail("macro '{}' takes no keyword argument '{}'", def->text, key);
                kwargs.dict->set(Value::string(key), v);
                continue;
            }
            size_t k = size_t(it - def->targets.begin());
            if (given[k])
                rt_fail("macro '{}' got multiple values for argument '{}'", def->text, key);
            s->vars[key] = v;
            given[k] = true;
        }
        for (size_t k = 0; k < n; ++k) {
            if (given[k]) continue;
            s->vars[def->targets[k]] =
                def->defaults[k] ? in.eval(*def->defaults[k], s)
                                 : Value::undefined(fmt::format("parameter '{}' was not provided",
                                                                def->targets[k]));
        }
        if (def->uses_varargs) s->vars["varargs"] = std::move(varargs);
        if (def->uses_kwargs) s->vars["kwargs"] = std::move(kwargs);
        std::string out;
        in.exec(def->bodies[0], s, out);
        return Value::string(std::move(out));
    });
}

Value Interp::call(const Value& callee, Args& args) {
    if (callee.type != Value::Type::Func) {
        require_defined(callee);
        rt_fail("'{}' object is not callable", type_name(callee));
    }
    return callee.func->fn(*this, args);
}

Value Interp::apply_filter(const std::string& name, Value input, Args& args) {
    FilterFn f = find_filter(name);
    if (!f) rt_fail("no filter named '{}'", name);
    return f(*this, input, args);
}

bool Interp::apply_test(const std::string& name, const Value& input, Args& args) {
    TestFn t = find_test(name);
    if (!t) rt_fail("no test named '{}'", name);
    return t(*this, input, args);
}

void Interp::eval_args(const Expr& e, const ScopePtr& scope, Args& args) {
    args.pos.reserve(e.items.size());
    for (auto& x : e.items) args.pos.push_back(eval(*x, scope));
    for (auto& [k, x] : e.kwargs) args.kw.emplace_back(k, eval(*x, scope));
}

Value Interp::eval_call(const Expr& e, const ScopePtr& scope) {
    Value callee = eval(*e.a, scope);
    Args args;
    eval_args(e, scope, args);
    step();
    Value result = call(callee, args);
    charge(result);
    return result;
}

Value Interp::eval_binary(const Expr& e, const ScopePtr& scope) {
    Value a = eval(*e.a, scope);
    Value b = eval(*e.b, scope);
    return arithmetic(*this, e.name, a, b);
}

Value Interp::eval_compare(const Expr& e, const ScopePtr& scope) {
    Value left = eval(*e.a, scope);
    for (size_t k = 0; k < e.ops.size(); ++k) {
        Value right = eval(*e.items[k], scope);
        const std::string& op = e.ops[k];
        bool ok;
        if (op == "==") {
            ok = py_eq(left, right);
        } else if (op == "!=") {
            ok = !py_eq(left, right);
        } else if (op == "<") {
            ok = py_lt(left, right);
        } else if (op == "<=") {
            ok = py_lt(left, right) || py_eq(left, right);
        } else if (op == ">") {
            ok = py_lt(right, left);
        } else if (op == ">=") {
            ok = py_lt(right, left) || py_eq(left, right);
        } else if (op == "in") {
            ok = contains(right, left);
        } else {
            ok = !contains(right, left);
        }
        if (!ok) return Value::boolean(false);
        left = std::move(right);
    }
    return Value::boolean(true);
}

Value Interp::eval(const Expr& e, const ScopePtr& scope) {
    DepthGuard guard(*this);
    switch (e.kind) {
        case Expr::Kind::Literal:
            return e.value;
        case Expr::Kind::Name: {
            if (const Value* v = scope->lookup(e.name)) return *v;
            return Value::undefined(fmt::format("'{}' is undefined", e.name));
        }
        case Expr::Kind::List:
        case Expr::Kind::Tuple: {
            Value v = Value::new_list({}, e.kind == Expr::Kind::Tuple);
            for (auto& x : e.items) v.list->items.push_back(eval(*x, scope));
            return v;
        }
        case Expr::Kind::Dict: {
            Value v = Value::new_dict();
            for (size_t k = 0; k + 1 < e.items.size(); k += 2) {
                Value key = eval(*e.items[k], scope);
                v.dict->set(std::move(key), eval(*e.items[k + 1], scope));
            }
            return v;
        }
        case Expr::Kind::Attr:
            return get_attr(eval(*e.a, scope), e.name);
        case Expr::Kind::Item: {
            Value obj = eval(*e.a, scope);
            return get_item(obj, eval(*e.b, scope));
        }
        case Expr::Kind::Slice: {
            Value obj = eval(*e.a, scope);
            Value parts[3];
            for (int k = 0; k < 3; ++k)
                parts[k] = e.items[size_t(k)] ? eval(*e.items[size_t(k)], scope) : Value::none();
            return slice(obj, parts[0], parts[1], parts[2]);
        }
        case Expr::Kind::Call:
            return eval_call(e, scope);
        case Expr::Kind::Filter: {
            Value input = e.a ? eval(*e.a, scope) : Value::undefined();
            Args args;
            eval_args(e, scope, args);
            step();
            charge(input);
            Value result = apply_filter(e.name, std::move(input), args);
            charge(result);
            return result;
        }
        case Expr::Kind::Test: {
            Value input = eval(*e.a, scope);
            Args args;
            eval_args(e, scope, args);
            return Value::boolean(apply_test(e.name, input, args) != e.negated);
        }
        case Expr::Kind::Neg:
        case Expr::Kind::Pos: {
            Value v = eval(*e.a, scope);
            if (v.is_undefined()) require_defined(v);
            if (!v.is_number())
                rt_fail("bad operand type for unary {}: '{}'",
                        e.kind == Expr::Kind::Neg ? '-' : '+', type_name(v));
            if (v.type == Value::Type::Bool) v = Value::integer(v.b);
            if (e.kind == Expr::Kind::Pos) return v;
            if (v.type == Value::Type::Float) return Value::number(-v.f);
            if (v.i == INT64_MIN) rt_fail("integer overflow");
            return Value::integer(-v.i);
        }
        case Expr::Kind::Not:
            return Value::boolean(!truthy(eval(*e.a, scope)));
        case Expr::Kind::And: {
            Value a = eval(*e.a, scope);
            return truthy(a) ? eval(*e.b, scope) : a;
        }
        case Expr::Kind::Or: {
            Value a = eval(*e.a, scope);
            return truthy(a) ? a : eval(*e.b, scope);
        }
        case Expr::Kind::Binary:
            return eval_binary(e, scope);
        case Expr::Kind::Concat: {
            std::string s;
            for (auto& x : e.items) {
                s += py_str(eval(*x, scope));
                check_size(s.size());
            }
            charge_bytes(s.size());
            return Value::string(std::move(s));
        }
        case Expr::Kind::Compare:
            return eval_compare(e, scope);
        case Expr::Kind::Cond:
            if (truthy(eval(*e.b, scope))) return eval(*e.a, scope);
            if (e.c) return eval(*e.c, scope);
            return Value::undefined("the conditional expression has no else branch");
    }
    return Value::undefined();
}

}  // namespace kvrun::jinja

namespace kvrun::jinja {

Value get_attr(const Value& obj, const std::string& name) {
    switch (obj.type) {
        case Value::Type::Undefined:
            require_defined(obj);
            break;
        case Value::Type::Dict: {
            // jinja2 tries the Python attribute first: d.items is the method, d.role the item.
            if (!obj.dict->is_namespace) {
                Value m = get_method(obj, name);
                if (!m.is_undefined()) return m;
            }
            if (const Value* v = obj.dict->find(name)) return *v;
            break;
        }
        case Value::Type::String:
        case Value::Type::List: {
            Value m = get_method(obj, name);
            if (!m.is_undefined()) return m;
            break;
        }
        case Value::Type::None:
            return Value::undefined(fmt::format("'None' has no attribute '{}'", name));
        default:
            break;
    }
    return Value::undefined(fmt::format("'{} object' has no attribute '{}'", type_name(obj), name));
}

Value get_item(const Value& obj, const Value& key) {
    require_defined(obj);
    if (obj.is_dict()) {
        if (const Value* v = obj.dict->find(key)) return *v;
    } else if ((obj.is_list() || obj.is_string()) &&
               (key.type == Value::Type::Int || key.type == Value::Type::Bool)) {
        int64_t k = key.type == Value::Type::Bool ? key.b : key.i;
        if (obj.is_list()) {
            int64_t n = int64_t(obj.list->items.size());
            if (k < 0) k += n;
            if (k >= 0 && k < n) return obj.list->items[size_t(k)];
        } else {
            auto offs = codepoint_offsets(obj.s);
            int64_t n = int64_t(offs.size()) - 1;
            if (k < 0) k += n;
            if (k >= 0 && k < n)
                return Value::string(
                    obj.s.substr(offs[size_t(k)], offs[size_t(k) + 1] - offs[size_t(k)]));
        }
        return Value::undefined(
            fmt::format("{} object has no element {}", type_name(obj), py_str(key)));
    }
    // Not an item: jinja2 falls back to the attribute (x['items'] is the dict method).
    if (key.is_string()) return get_attr(obj, key.s);
    return Value::undefined(
        fmt::format("'{} object' has no item {}", type_name(obj), py_repr(key)));
}

void add_globals(Scope& scope) {
    scope.vars["range"] = Value::function("range", [](Interp& in, Args& args) {
        auto a = bind_args(args, "range", {"start", "stop", "step"});
        auto num = [](const Value& v) {
            if (v.type == Value::Type::Bool) return int64_t(v.b);
            if (v.type != Value::Type::Int)
                rt_fail("range() arguments must be integers, not {}", type_name(v));
            return v.i;
        };
        if (a[0].is_undefined()) rt_fail("range expected at least 1 argument");
        int64_t start = 0, stop, step = 1;
        if (a[1].is_undefined()) {
            stop = num(a[0]);
        } else {
            start = num(a[0]);
            stop = num(a[1]);
            if (!a[2].is_undefined()) step = num(a[2]);
        }
        if (step == 0) rt_fail("range() arg 3 must not be zero");
        // Count without overflow, then refuse ranges past the iteration limit.
        long double span = step > 0 ? (long double)stop - start : (long double)start - stop;
        long double count = std::ceil(span / std::fabs((long double)step));
        if (count > (long double)in.limits().max_steps) rt_fail("range() too large");
        check_items(size_t(std::max<long double>(count, 0)));
        std::vector<Value> out;
        for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
            out.push_back(Value::integer(k));
            if ((step > 0 && k > INT64_MAX - step) || (step < 0 && k < INT64_MIN - step)) break;
        }
        return Value::new_list(std::move(out));
    });
    // namespace(**kwargs) and dict(**kwargs), each also taking a dict first.
    auto make_dict = [](bool ns) {
        return [ns](Interp&, Args& args) {
            Value d = Value::new_dict(ns);
            if (args.pos.size() > 1) rt_fail("expected at most 1 positional argument");
            if (!args.pos.empty()) {
                const Value& init = args.pos[0];
                if (!init.is_dict()) rt_fail("expected a mapping, got {}", type_name(init));
                for (auto& [k, v] : init.dict->items) d.dict->set(k, v);
            }
            for (auto& [k, v] : args.kw) d.dict->set(Value::string(k), v);
            return d;
        };
    };
    scope.vars["namespace"] = Value::function("namespace", make_dict(true));
    scope.vars["dict"] = Value::function("dict", make_dict(false));
    scope.vars["raise_exception"] =
        Value::function("raise_exception", [](Interp&, Args& args) -> Value {
            auto a = bind_args(args, "raise_exception", {"message"});
            throw RaisedError(py_str(a[0]));
        });
    scope.vars["strftime_now"] = Value::function("strftime_now", [](Interp&, Args& args) {
        auto a = bind_args(args, "strftime_now", {"format"});
        if (!a[0].is_string()) rt_fail("strftime_now: format must be a string");
        std::time_t now = std::time(nullptr);
        std::tm tm{};
        localtime_r(&now, &tm);
        if (a[0].s.empty()) return Value::string("");
        for (size_t cap = 256; cap <= 65536; cap *= 4) {
            std::string buf(cap, '\0');
            size_t n = std::strftime(buf.data(), cap, a[0].s.c_str(), &tm);
            if (n > 0) return Value::string(buf.substr(0, n));
        }
        return Value::string("");
    });
}

}  // namespace kvrun::jinja
