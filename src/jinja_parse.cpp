// Jinja parser: tokens (jinja_lex.cpp) -> syntax tree (jinja_impl.h).
// As jinja2 does, newlines are normalized to \n and one trailing newline is dropped first.
#include <algorithm>
#include <charconv>
#include <cstring>

#include "common.h"
#include "jinja_impl.h"

namespace kvrun::jinja {
namespace {

class Parser {
  public:
    Parser(const std::string& src, std::vector<Tok> toks, int max_depth)
        : src_(src), toks_(std::move(toks)), max_depth_(max_depth) {}

    Body parse_template() {
        Body body = parse_body({}, toks_.back(), "");
        return body;
    }

  private:
    using Stops = std::initializer_list<const char*>;

    const Tok& cur() const { return toks_[k_]; }
    const Tok& peek(size_t d = 1) const { return toks_[std::min(k_ + d, toks_.size() - 1)]; }
    bool is_op(const char* op) const { return cur().type == Tok::Op && cur().s == op; }
    bool is_name(const char* name) const { return cur().type == Tok::Name && cur().s == name; }
    std::string describe(const Tok& t) const {
        switch (t.type) {
            case Tok::VarEnd:
                return "end of print statement";
            case Tok::BlockEnd:
                return "end of statement block";
            case Tok::Eof:
                return "end of template";
            case Tok::Str:
                return "string";
            default:
                return "'" + t.s + "'";
        }
    }
    template <typename... Args>
    [[noreturn]] void error(const Tok& t, fmt::format_string<Args...> f, Args&&... args) const {
        syntax_error(src_, t.pos, f, std::forward<Args>(args)...);
    }
    void expect_op(const char* op) {
        if (!is_op(op)) error(cur(), "expected '{}', got {}", op, describe(cur()));
        ++k_;
    }
    void expect(Tok::Type type, const char* what) {
        if (cur().type != type) error(cur(), "expected {}, got {}", what, describe(cur()));
        ++k_;
    }
    std::string expect_name() {
        if (cur().type != Tok::Name) error(cur(), "expected a name, got {}", describe(cur()));
        return toks_[k_++].s;
    }

    // Nesting guard for the recursive descent (blocks and expressions).
    struct Nest {
        Parser& p;
        Nest(Parser& parser, const Tok& t) : p(parser) {
            if (++p.depth_ > p.max_depth_) p.error(t, "template nested too deeply");
        }
        ~Nest() { --p.depth_; }
    };

    ExprPtr make(Expr::Kind kind, const Tok& at, ExprPtr a = {}, ExprPtr b = {}, ExprPtr c = {});
    void add_child(Expr& e, ExprPtr child);
    void grow(Expr& e, const ExprPtr& child, const Tok& at);

    Body parse_body(Stops stops, const Tok& opener, const char* opener_name);
    NodePtr parse_statement();
    NodePtr parse_if(const Tok& at);
    NodePtr parse_for(const Tok& at);
    NodePtr parse_set(const Tok& at);
    NodePtr parse_macro(const Tok& at);
    void parse_filter_chain(std::vector<ExprPtr>& out);
    void end_tag(const char* keyword);

    ExprPtr parse_tuple(bool with_cond);
    ExprPtr parse_expression(bool with_cond = true);
    ExprPtr parse_or();
    ExprPtr parse_and();
    ExprPtr parse_not();
    ExprPtr parse_compare();
    ExprPtr parse_math1();
    ExprPtr parse_concat();
    ExprPtr parse_math2();
    ExprPtr parse_pow();
    ExprPtr parse_unary(bool with_filter);
    ExprPtr parse_primary();
    ExprPtr parse_postfix(ExprPtr e);
    ExprPtr parse_filter_expr(ExprPtr e);
    ExprPtr parse_filter(ExprPtr e);
    void parse_call_args(Expr& call);

    const std::string& src_;
    std::vector<Tok> toks_;
    size_t k_ = 0;
    int max_depth_;
    int depth_ = 0;
    int loop_depth_ = 0;  // for break / continue
    // Whether the macro body being parsed names varargs / kwargs (else extra arguments
    // to the macro are an error, as in jinja2).
    bool saw_varargs_ = false, saw_kwargs_ = false;
};

ExprPtr Parser::make(Expr::Kind kind, const Tok& at, ExprPtr a, ExprPtr b, ExprPtr c) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = int(at.pos);  // byte offset until the tree is finished; only used in errors
    for (ExprPtr* child : {&a, &b, &c}) grow(*e, *child, at);
    e->a = std::move(a);
    e->b = std::move(b);
    e->c = std::move(c);
    return e;
}

// Keeps every subtree's height bounded, so evaluating (and destroying) a tree never
// recurses deeper than max_depth: `1+1+1+...` is a deep tree without deep parsing.
void Parser::grow(Expr& e, const ExprPtr& child, const Tok& at) {
    if (!child) return;
    e.height = std::max(e.height, child->height + 1);
    if (e.height > max_depth_) error(at, "expression nested too deeply");
}

void Parser::add_child(Expr& e, ExprPtr child) {
    grow(e, child, cur());
    e.items.push_back(std::move(child));
}

// Parses nodes until a {% stop %} tag (left unconsumed) or the end of the template.
Body Parser::parse_body(Stops stops, const Tok& opener, const char* opener_name) {
    Nest nest(*this, opener);
    Body body;
    while (true) {
        const Tok& t = cur();
        if (t.type == Tok::Text) {
            auto node = std::make_unique<Node>();
            node->kind = Node::Kind::Text;
            node->text = t.s;
            node->line = int(t.pos);
            body.push_back(std::move(node));
            ++k_;
        } else if (t.type == Tok::VarBegin) {
            ++k_;
            auto node = std::make_unique<Node>();
            node->kind = Node::Kind::Output;
            node->line = int(t.pos);
            node->expr = parse_tuple(true);
            expect(Tok::VarEnd, "'}}'");
            body.push_back(std::move(node));
        } else if (t.type == Tok::BlockBegin) {
            const Tok& name = peek();
            if (name.type == Tok::Name)
                for (const char* s : stops)
                    if (name.s == s) return body;
            body.push_back(parse_statement());
        } else if (t.type == Tok::Eof) {
            if (stops.size() == 0) return body;
            std::string expected;
            for (const char* s : stops)
                expected += (expected.empty() ? "'" : " or '") + std::string(s) + "'";
            error(opener, "unclosed '{}' block: end of template reached, expected {}", opener_name,
                  expected);
        } else {
            error(t, "unexpected {}", describe(t));
        }
    }
}

// Consumes `{% keyword %}` (the BlockBegin is current).
void Parser::end_tag(const char* keyword) {
    expect(Tok::BlockBegin, "'{%'");
    if (!is_name(keyword)) error(cur(), "expected '{}'", keyword);
    ++k_;
    expect(Tok::BlockEnd, "'%}'");
}

NodePtr Parser::parse_statement() {
    const Tok& at = cur();
    ++k_;  // {%
    if (cur().type != Tok::Name) error(cur(), "expected a statement name, got {}", describe(cur()));
    std::string kw = toks_[k_++].s;
    auto simple = [&](Node::Kind kind) {
        auto node = std::make_unique<Node>();
        node->kind = kind;
        node->line = int(at.pos);
        return node;
    };
    if (kw == "if") return parse_if(at);
    if (kw == "for") return parse_for(at);
    if (kw == "set") return parse_set(at);
    if (kw == "macro") return parse_macro(at);
    if (kw == "break" || kw == "continue") {
        if (loop_depth_ == 0) error(at, "'{}' outside of a loop", kw);
        expect(Tok::BlockEnd, "'%}'");
        return simple(kw == "break" ? Node::Kind::Break : Node::Kind::Continue);
    }
    if (kw == "filter") {
        auto node = simple(Node::Kind::FilterBlock);
        parse_filter_chain(node->filters);
        expect(Tok::BlockEnd, "'%}'");
        node->bodies.push_back(parse_body({"endfilter"}, at, "filter"));
        end_tag("endfilter");
        return node;
    }
    if (kw == "generation") {  // HF's AssistantTracker: renders the body as is
        auto node = simple(Node::Kind::Scope);
        expect(Tok::BlockEnd, "'%}'");
        node->bodies.push_back(parse_body({"endgeneration"}, at, "generation"));
        end_tag("endgeneration");
        return node;
    }
    static const char* const kUnsupported[] = {"block", "extends", "include",    "import", "from",
                                               "call",  "with",    "autoescape", "do",     "trans"};
    for (const char* s : kUnsupported)
        if (kw == s) error(at, "unsupported statement '{}'", kw);
    static const char* const kClosers[] = {"elif",      "else",          "endif",
                                           "endfor",    "endset",        "endmacro",
                                           "endfilter", "endgeneration", "endraw"};
    for (const char* s : kClosers)
        if (kw == s) error(at, "unexpected '{}'", kw);
    error(at, "unknown statement '{}'", kw);
}

NodePtr Parser::parse_if(const Tok& at) {
    auto node = std::make_unique<Node>();
    node->kind = Node::Kind::If;
    node->line = int(at.pos);
    node->conds.push_back(parse_tuple(false));
    expect(Tok::BlockEnd, "'%}'");
    while (true) {
        node->bodies.push_back(parse_body({"elif", "else", "endif"}, at, "if"));
        ++k_;  // {%
        std::string kw = toks_[k_++].s;
        if (kw == "elif") {
            node->conds.push_back(parse_tuple(false));
            expect(Tok::BlockEnd, "'%}'");
        } else if (kw == "else") {
            expect(Tok::BlockEnd, "'%}'");
            node->bodies.push_back(parse_body({"endif"}, at, "if"));
            end_tag("endif");
            return node;
        } else {
            expect(Tok::BlockEnd, "'%}'");
            return node;
        }
    }
}

NodePtr Parser::parse_for(const Tok& at) {
    auto node = std::make_unique<Node>();
    node->kind = Node::Kind::For;
    node->line = int(at.pos);
    bool paren = is_op("(");
    if (paren) ++k_;
    node->targets.push_back(expect_name());
    while (is_op(",")) {
        ++k_;
        if (cur().type != Tok::Name || is_name("in")) break;
        node->targets.push_back(expect_name());
    }
    if (paren) expect_op(")");
    if (!is_name("in")) error(cur(), "expected 'in', got {}", describe(cur()));
    ++k_;
    node->expr = parse_tuple(false);
    if (is_name("if")) {
        ++k_;
        node->cond = parse_expression();
    }
    if (is_name("recursive")) error(cur(), "recursive loops are not supported");
    expect(Tok::BlockEnd, "'%}'");
    ++loop_depth_;
    node->bodies.push_back(parse_body({"else", "endfor"}, at, "for"));
    --loop_depth_;
    if (peek().s == "else") {
        k_ += 2;
        expect(Tok::BlockEnd, "'%}'");
        node->bodies.push_back(parse_body({"endfor"}, at, "for"));
    }
    end_tag("endfor");
    return node;
}

NodePtr Parser::parse_set(const Tok& at) {
    auto node = std::make_unique<Node>();
    node->line = int(at.pos);
    node->targets.push_back(expect_name());
    if (is_op(".")) {
        ++k_;
        node->kind = Node::Kind::SetAttr;
        node->text = expect_name();
    } else {
        node->kind = Node::Kind::Set;
        while (is_op(",")) {
            ++k_;
            if (is_op("=")) break;
            node->targets.push_back(expect_name());
        }
    }
    if (is_op("=")) {
        ++k_;
        node->expr = parse_tuple(true);
        expect(Tok::BlockEnd, "'%}'");
        return node;
    }
    if (node->kind != Node::Kind::Set || node->targets.size() != 1)
        error(cur(), "expected '=', got {}", describe(cur()));
    node->kind = Node::Kind::SetBlock;
    if (is_op("|")) parse_filter_chain(node->filters);
    expect(Tok::BlockEnd, "'%}'");
    node->bodies.push_back(parse_body({"endset"}, at, "set"));
    end_tag("endset");
    return node;
}

NodePtr Parser::parse_macro(const Tok& at) {
    auto node = std::make_unique<Node>();
    node->kind = Node::Kind::Macro;
    node->line = int(at.pos);
    node->text = expect_name();
    expect_op("(");
    while (!is_op(")")) {
        if (!node->targets.empty()) expect_op(",");
        if (is_op(")")) break;
        node->targets.push_back(expect_name());
        if (is_op("=")) {
            ++k_;
            node->defaults.push_back(parse_expression());
        } else {
            node->defaults.push_back(nullptr);
        }
    }
    ++k_;
    expect(Tok::BlockEnd, "'%}'");
    int saved_loops = loop_depth_;
    bool saved_varargs = saw_varargs_, saved_kwargs = saw_kwargs_;
    loop_depth_ = 0;
    saw_varargs_ = saw_kwargs_ = false;
    node->bodies.push_back(parse_body({"endmacro"}, at, "macro"));
    node->uses_varargs = saw_varargs_;
    node->uses_kwargs = saw_kwargs_;
    loop_depth_ = saved_loops;
    saw_varargs_ = saved_varargs || saw_varargs_;
    saw_kwargs_ = saved_kwargs || saw_kwargs_;
    end_tag("endmacro");
    return node;
}

// `name(args) | name ...` of {% filter %} and {% set x | f %}: operands left null.
void Parser::parse_filter_chain(std::vector<ExprPtr>& out) {
    if (is_op("|")) ++k_;
    while (true) {
        out.push_back(parse_filter(nullptr));
        if (!is_op("|")) break;
        ++k_;
    }
}

// `a, b, c` (a tuple) or a single expression.
ExprPtr Parser::parse_tuple(bool with_cond) {
    const Tok& at = cur();
    ExprPtr first = parse_expression(with_cond);
    if (!is_op(",")) return first;
    ExprPtr tuple = make(Expr::Kind::Tuple, at);
    add_child(*tuple, std::move(first));
    while (is_op(",")) {
        ++k_;
        auto t = cur().type;
        if (t == Tok::VarEnd || t == Tok::BlockEnd || is_op(")") || is_name("if")) break;
        add_child(*tuple, parse_expression(with_cond));
    }
    return tuple;
}

ExprPtr Parser::parse_expression(bool with_cond) {
    const Tok& at = cur();
    ExprPtr e = parse_or();
    while (with_cond && is_name("if")) {
        ++k_;
        ExprPtr cond = parse_or();
        ExprPtr other;
        if (is_name("else")) {
            ++k_;
            other = parse_expression();
        }
        e = make(Expr::Kind::Cond, at, std::move(e), std::move(cond), std::move(other));
    }
    return e;
}

ExprPtr Parser::parse_or() {
    const Tok& at = cur();
    ExprPtr e = parse_and();
    while (is_name("or")) {
        ++k_;
        e = make(Expr::Kind::Or, at, std::move(e), parse_and());
    }
    return e;
}

ExprPtr Parser::parse_and() {
    const Tok& at = cur();
    ExprPtr e = parse_not();
    while (is_name("and")) {
        ++k_;
        e = make(Expr::Kind::And, at, std::move(e), parse_not());
    }
    return e;
}

ExprPtr Parser::parse_not() {
    const Tok& at = cur();
    if (is_name("not")) {
        Nest nest(*this, at);
        ++k_;
        return make(Expr::Kind::Not, at, parse_not());
    }
    return parse_compare();
}

ExprPtr Parser::parse_compare() {
    const Tok& at = cur();
    ExprPtr e = parse_math1();
    ExprPtr cmp;
    while (true) {
        std::string op;
        if (cur().type == Tok::Op && (cur().s == "==" || cur().s == "!=" || cur().s == "<" ||
                                      cur().s == "<=" || cur().s == ">" || cur().s == ">=")) {
            op = cur().s;
            ++k_;
        } else if (is_name("in")) {
            op = "in";
            ++k_;
        } else if (is_name("not") && peek().type == Tok::Name && peek().s == "in") {
            op = "notin";
            k_ += 2;
        } else {
            break;
        }
        if (!cmp) cmp = make(Expr::Kind::Compare, at, std::move(e));
        cmp->ops.push_back(op);
        add_child(*cmp, parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(e);
}

ExprPtr Parser::parse_math1() {
    const Tok& at = cur();
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
        std::string op = toks_[k_++].s;
        e = make(Expr::Kind::Binary, at, std::move(e), parse_concat());
        e->name = op;
    }
    return e;
}

ExprPtr Parser::parse_concat() {
    const Tok& at = cur();
    ExprPtr e = parse_math2();
    if (!is_op("~")) return e;
    ExprPtr cat = make(Expr::Kind::Concat, at);
    add_child(*cat, std::move(e));
    while (is_op("~")) {
        ++k_;
        add_child(*cat, parse_math2());
    }
    return cat;
}

ExprPtr Parser::parse_math2() {
    const Tok& at = cur();
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
        std::string op = toks_[k_++].s;
        e = make(Expr::Kind::Binary, at, std::move(e), parse_pow());
        e->name = op;
    }
    return e;
}

ExprPtr Parser::parse_pow() {
    const Tok& at = cur();
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {  // left-associative in jinja2: 2 ** 3 ** 2 == 64
        ++k_;
        e = make(Expr::Kind::Binary, at, std::move(e), parse_unary(true));
        e->name = "**";
    }
    return e;
}

// Unary minus binds looser than filters in jinja2: -x|abs is abs(-x), -2 ** 2 is 4.
ExprPtr Parser::parse_unary(bool with_filter) {
    const Tok& at = cur();
    Nest nest(*this, at);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
        bool neg = cur().s == "-";
        ++k_;
        e = make(neg ? Expr::Kind::Neg : Expr::Kind::Pos, at, parse_unary(false));
    } else {
        e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
}

ExprPtr Parser::parse_primary() {
    const Tok& t = cur();
    ExprPtr e;
    switch (t.type) {
        case Tok::Name: {
            ++k_;
            e = make(Expr::Kind::Literal, t);
            if (t.s == "true" || t.s == "True") {
                e->value = Value::boolean(true);
            } else if (t.s == "false" || t.s == "False") {
                e->value = Value::boolean(false);
            } else if (t.s == "none" || t.s == "None") {
                e->value = Value::none();
            } else {
                e->kind = Expr::Kind::Name;
                e->name = t.s;
                saw_varargs_ |= t.s == "varargs";
                saw_kwargs_ |= t.s == "kwargs";
            }
            return e;
        }
        case Tok::Str: {
            std::string s;
            while (cur().type == Tok::Str) s += toks_[k_++].s;  // "a" "b" == "ab"
            e = make(Expr::Kind::Literal, t);
            e->value = Value::string(std::move(s));
            return e;
        }
        case Tok::Int:
        case Tok::Float:
            ++k_;
            e = make(Expr::Kind::Literal, t);
            e->value = t.type == Tok::Int ? Value::integer(t.i) : Value::number(t.f);
            return e;
        case Tok::Op:
            if (t.s == "(") {
                ++k_;
                if (is_op(")")) {
                    ++k_;
                    return make(Expr::Kind::Tuple, t);
                }
                e = parse_expression();
                if (is_op(",")) {
                    ExprPtr tuple = make(Expr::Kind::Tuple, t);
                    add_child(*tuple, std::move(e));
                    while (is_op(",")) {
                        ++k_;
                        if (is_op(")")) break;
                        add_child(*tuple, parse_expression());
                    }
                    e = std::move(tuple);
                }
                expect_op(")");
                return e;
            }
            if (t.s == "[") {
                ++k_;
                e = make(Expr::Kind::List, t);
                while (!is_op("]")) {
                    if (!e->items.empty()) expect_op(",");
                    if (is_op("]")) break;
                    add_child(*e, parse_expression());
                }
                ++k_;
                return e;
            }
            if (t.s == "{") {
                ++k_;
                e = make(Expr::Kind::Dict, t);
                while (!is_op("}")) {
                    if (!e->items.empty()) expect_op(",");
                    if (is_op("}")) break;
                    add_child(*e, parse_expression());
                    expect_op(":");
                    add_child(*e, parse_expression());
                }
                ++k_;
                return e;
            }
            break;
        default:
            break;
    }
    error(t, "unexpected {}", describe(t));
}

ExprPtr Parser::parse_postfix(ExprPtr e) {
    while (true) {
        const Tok& t = cur();
        if (is_op(".")) {
            ++k_;
            if (cur().type == Tok::Int) {  // x.0 is x[0]
                ExprPtr idx = make(Expr::Kind::Literal, cur());
                idx->value = Value::integer(cur().i);
                ++k_;
                e = make(Expr::Kind::Item, t, std::move(e), std::move(idx));
            } else {
                std::string name = expect_name();
                e = make(Expr::Kind::Attr, t, std::move(e));
                e->name = std::move(name);
            }
        } else if (is_op("[")) {
            ++k_;
            ExprPtr parts[3];
            bool is_slice = false;
            for (int p = 0; p < 3; ++p) {
                if (!is_op(":") && !is_op("]")) parts[p] = parse_expression();
                if (p < 2 && is_op(":")) {
                    is_slice = true;
                    ++k_;
                } else {
                    break;
                }
            }
            expect_op("]");
            if (is_slice) {
                ExprPtr s = make(Expr::Kind::Slice, t, std::move(e));
                for (auto& p : parts) {
                    grow(*s, p, t);
                    s->items.push_back(std::move(p));
                }
                e = std::move(s);
            } else {
                if (!parts[0]) error(t, "expected a subscript");
                e = make(Expr::Kind::Item, t, std::move(e), std::move(parts[0]));
            }
        } else if (is_op("(")) {
            e = make(Expr::Kind::Call, t, std::move(e));
            parse_call_args(*e);
        } else {
            return e;
        }
    }
}

ExprPtr Parser::parse_filter_expr(ExprPtr e) {
    while (true) {
        const Tok& t = cur();
        if (is_op("|")) {
            ++k_;
            e = parse_filter(std::move(e));
        } else if (is_name("is")) {
            ++k_;
            bool negated = false;
            if (is_name("not")) {
                negated = true;
                ++k_;
            }
            const Tok& name_tok = cur();
            std::string name = expect_name();
            if (!find_test(name)) error(name_tok, "no test named '{}'", name);
            e = make(Expr::Kind::Test, t, std::move(e));
            e->name = std::move(name);
            e->negated = negated;
            if (is_op("(")) {
                parse_call_args(*e);
            } else if ((cur().type == Tok::Name && !is_name("else") && !is_name("or") &&
                        !is_name("and") && !is_name("if") && !is_name("is")) ||
                       cur().type == Tok::Str || cur().type == Tok::Int ||
                       cur().type == Tok::Float || is_op("[") || is_op("{")) {
                // `x is divisibleby 3`: one argument without parentheses
                add_child(*e, parse_postfix(parse_primary()));
            }
        } else if (is_op("(")) {
            e = make(Expr::Kind::Call, t, std::move(e));
            parse_call_args(*e);
        } else {
            return e;
        }
    }
}

// `| name` or `| name(args)` applied to e (null in filter blocks).
ExprPtr Parser::parse_filter(ExprPtr e) {
    const Tok& t = cur();
    std::string name = expect_name();
    if (!find_filter(name)) error(t, "no filter named '{}'", name);
    ExprPtr f = make(Expr::Kind::Filter, t, std::move(e));
    f->name = std::move(name);
    if (is_op("(")) parse_call_args(*f);
    return f;
}

// `(a, b, k=v)`: positional into items, keyword into kwargs.
void Parser::parse_call_args(Expr& call) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
        if (!first) expect_op(",");
        first = false;
        if (is_op(")")) break;
        if (is_op("*") || is_op("**")) error(cur(), "*args and **kwargs are not supported");
        if (cur().type == Tok::Name && peek().type == Tok::Op && peek().s == "=") {
            std::string key = toks_[k_].s;
            k_ += 2;
            ExprPtr v = parse_expression();
            grow(call, v, cur());
            call.kwargs.emplace_back(std::move(key), std::move(v));
        } else {
            if (!call.kwargs.empty()) error(cur(), "positional argument after keyword argument");
            add_child(call, parse_expression());
        }
    }
    ++k_;
}

// Turns the byte offsets kept in `line` into line and column numbers.
struct Locator {
    std::vector<size_t> line_starts{0};
    explicit Locator(const std::string& src) {
        for (size_t k = 0; k < src.size(); ++k)
            if (src[k] == '\n') line_starts.push_back(k + 1);
    }
    void set(int& line, int& col) const {
        size_t pos = size_t(line);
        auto it = std::upper_bound(line_starts.begin(), line_starts.end(), pos);
        size_t l = size_t(it - line_starts.begin());
        line = int(l);
        col = int(pos - line_starts[l - 1] + 1);
    }
    void fix(Expr* e) const {
        if (!e) return;
        set(e->line, e->col);
        fix(e->a.get());
        fix(e->b.get());
        fix(e->c.get());
        for (auto& x : e->items) fix(x.get());
        for (auto& kv : e->kwargs) fix(kv.second.get());
    }
    void fix(Body& body) const {
        for (auto& n : body) {
            set(n->line, n->col);
            fix(n->expr.get());
            fix(n->cond.get());
            for (auto& x : n->conds) fix(x.get());
            for (auto& x : n->filters) fix(x.get());
            for (auto& x : n->defaults) fix(x.get());
            for (auto& b : n->bodies) fix(b);
        }
    }
};

}  // namespace

std::shared_ptr<Program> parse_program(std::string_view source, int max_depth) {
    auto program = std::make_shared<Program>();
    program->source = std::string(source);
    // Newlines as \n, and one trailing newline dropped (jinja2's keep_trailing_newline=False).
    std::string src;
    src.reserve(source.size());
    for (size_t k = 0; k < source.size(); ++k) {
        if (source[k] == '\r') {
            src += '\n';
            if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
        } else {
            src += source[k];
        }
    }
    if (!src.empty() && src.back() == '\n') src.pop_back();
    Parser parser(src, tokenize(src), max_depth);
    program->body = parser.parse_template();
    Locator(src).fix(program->body);
    return program;
}

}  // namespace kvrun::jinja
