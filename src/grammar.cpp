// GBNF parsing: text -> flat rules of Char/NotChar/Rule/Token elements. Repetitions and groups
// become generated rules (x* is R ::= x R | empty, so the matcher's stacks stay bounded);
// after parsing, every referenced rule must exist and no rule may be left-recursive.
#include "grammar.h"

#include <algorithm>
#include <map>

#include "common.h"
#include "unicode_text.h"

namespace kvrun {

namespace {

using Element = Grammar::Element;
using Kind = Grammar::Kind;
using Sequence = std::vector<Element>;

bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

constexpr uint32_t kMaxRepeat = 10000;            // {m,n} bounds beyond this are refused
constexpr int kMaxNesting = 256;                  // ( ... ) groups inside each other
constexpr size_t kMaxElements = size_t(1) << 22;  // a bound on the compiled size

}  // namespace

class GrammarParser {
  public:
    explicit GrammarParser(std::string_view text) : text_(text) {}

    std::shared_ptr<const Grammar> parse(std::string_view root) {
        skip_space();
        if (at_end())
            fail("grammar: the grammar is empty (it needs at least a `root ::= ...` rule)");
        while (!at_end()) {
            parse_rule();
            skip_space();
        }
        return finish(root);
    }

  private:
    // ---- errors and positions ----
    [[noreturn]] void error(const std::string& what) const {
        int line = 1, col = 1;
        for (size_t i = 0; i < pos_ && i < text_.size(); ++i) {
            if (text_[i] == '\n') {
                ++line;
                col = 1;
            } else {
                ++col;
            }
        }
        fail("grammar: {} at line {}, column {}", what, line, col);
    }
    bool at_end() const { return pos_ >= text_.size(); }
    char peek(size_t ahead = 0) const {
        return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : '\0';
    }

    // Skips blanks, newlines and # comments.
    void skip_space() {
        while (!at_end()) {
            const char c = peek();
            if (c == '#') {
                while (!at_end() && peek() != '\n') ++pos_;
            } else if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
                ++pos_;
            } else {
                break;
            }
        }
    }

    std::string parse_name() {
        const size_t start = pos_;
        while (!at_end() && is_name_char(peek())) ++pos_;
        if (pos_ == start) error("expected a rule name");
        return std::string(text_.substr(start, pos_ - start));
    }

    // Does a new rule (`name ::=`) start here?
    bool at_rule_start() const {
        size_t p = pos_;
        if (p >= text_.size() || !is_name_char(text_[p])) return false;
        while (p < text_.size() && is_name_char(text_[p])) ++p;
        while (p < text_.size() && (text_[p] == ' ' || text_[p] == '\t')) ++p;
        return text_.substr(p, 3) == "::=";
    }

    uint32_t rule_index(const std::string& name) {
        auto [it, inserted] = index_.try_emplace(name, static_cast<uint32_t>(rules_.size()));
        if (inserted) {
            rules_.emplace_back();
            names_.push_back(name);
            owner_.push_back(name);
            defined_.push_back(false);
            used_at_.push_back(pos_);
        }
        return it->second;
    }

    uint32_t new_rule(const std::string& base) {
        // "/" never appears in a user's rule name, so generated names cannot collide.
        const uint32_t r = rule_index(fmt::format("{}/{}", base, ++generated_));
        defined_[r] = true;
        owner_[r] = base;
        return r;
    }

    void parse_rule() {
        const std::string name = parse_name();
        while (peek() == ' ' || peek() == '\t') ++pos_;
        if (text_.substr(pos_, 3) != "::=") error(fmt::format("expected `::=` after `{}`", name));
        pos_ += 3;
        const uint32_t r = rule_index(name);
        if (defined_[r]) error(fmt::format("rule `{}` is defined twice", name));
        defined_[r] = true;
        current_ = name;
        auto alts = parse_alternatives(false);
        rules_[r] = std::move(alts);
    }

    std::vector<Sequence> parse_alternatives(bool nested) {
        if (nested && ++depth_ > kMaxNesting)
            error(fmt::format("groups nested more than {} deep", kMaxNesting));
        std::vector<Sequence> alts;
        alts.push_back(parse_sequence(nested));
        while (peek() == '|') {
            ++pos_;
            alts.push_back(parse_sequence(nested));
        }
        for (const Sequence& a : alts) n_elements_ += a.size() + 1;
        if (n_elements_ > kMaxElements)
            error(
                fmt::format("the grammar is too large (more than {} elements once its "
                            "repetitions are written out)",
                            kMaxElements));
        if (nested) --depth_;
        return alts;
    }

    // One alternative: elements until `|`, `)`, the next rule or the end.
    Sequence parse_sequence(bool nested) {
        Sequence seq;
        size_t unit = 0;  // where the last element (the target of a postfix operator) starts
        bool have_unit = false;
        for (;;) {
            skip_space();
            if (at_end() || peek() == '|' || at_rule_start()) break;
            const char c = peek();
            if (c == ')') {
                if (!nested) error("unexpected `)`");
                break;
            }
            if (c == '*' || c == '+' || c == '?' || c == '{') {
                if (!have_unit) error(fmt::format("`{}` has nothing to repeat", c));
                apply_postfix(seq, unit);
                have_unit = false;  // `x**` is refused
                continue;
            }
            unit = seq.size();
            have_unit = true;
            if (c == '"') {
                ++pos_;
                parse_literal(seq);
            } else if (c == '[') {
                ++pos_;
                parse_class(seq);
            } else if (c == '<' || (c == '!' && peek(1) == '<')) {
                parse_token(seq);
            } else if (c == '.') {
                ++pos_;
                seq.push_back({Kind::NotChar, static_cast<uint32_t>(ranges_.size()), 0});
            } else if (c == '(') {
                ++pos_;
                const uint32_t r = new_rule(current_);
                auto alts = parse_alternatives(true);
                skip_space();
                if (peek() != ')') error("expected `)`");
                ++pos_;
                rules_[r] = std::move(alts);
                seq.push_back({Kind::Rule, r, 0});
            } else if (is_name_char(c)) {
                const size_t at = pos_;
                const std::string name = parse_name();
                const uint32_t r = rule_index(name);
                if (!defined_[r] && used_at_[r] > at) used_at_[r] = at;
                seq.push_back({Kind::Rule, r, 0});
            } else {
                error(fmt::format("unexpected character `{}`", c));
            }
        }
        return seq;
    }

    // One code point of a literal or class: an escape or a UTF-8 character.
    uint32_t parse_char() {
        if (at_end()) error("unexpected end of the grammar");
        if (peek() == '\\') {
            ++pos_;
            const char e = peek();
            ++pos_;
            switch (e) {
                case 'n':
                    return '\n';
                case 'r':
                    return '\r';
                case 't':
                    return '\t';
                case '0':
                    return 0;
                case '\\':
                case '"':
                case '[':
                case ']':
                case '-':
                case '^':
                case '/':
                case '\'':
                    return static_cast<uint32_t>(e);
                case 'x':
                    return parse_hex(2);
                case 'u':
                    return parse_hex(4);
                case 'U':
                    return parse_hex(8);
                default:
                    --pos_;
                    error(fmt::format("unknown escape `\\{}`", e));
            }
        }
        const auto lead = static_cast<uint8_t>(peek());
        const size_t len = utf8_lead_len(lead);
        if ((lead & 0xC0) == 0x80 || lead >= 0xF8 || pos_ + len > text_.size() ||
            !utf8_is_valid(text_.substr(pos_, len)))
            error("invalid UTF-8");
        const uint32_t cp = utf8_decode_lenient(text_.substr(pos_, len))[0];
        pos_ += len;
        return cp;
    }

    uint32_t parse_hex(int digits) {
        uint32_t v = 0;
        for (int i = 0; i < digits; ++i) {
            const char c = peek();
            int d;
            if (c >= '0' && c <= '9')
                d = c - '0';
            else if (c >= 'a' && c <= 'f')
                d = c - 'a' + 10;
            else if (c >= 'A' && c <= 'F')
                d = c - 'A' + 10;
            else
                error(fmt::format("expected {} hex digits", digits));
            v = v * 16 + static_cast<uint32_t>(d);
            ++pos_;
        }
        if (v > 0x10FFFF) error("code point beyond U+10FFFF");
        return v;
    }

    void parse_literal(Sequence& seq) {
        for (;;) {
            if (at_end()) error("unterminated string literal");
            if (peek() == '"') {
                ++pos_;
                return;
            }
            if (peek() == '\n') error("newline inside a string literal (write \\n)");
            const uint32_t cp = parse_char();
            seq.push_back({Kind::Char, static_cast<uint32_t>(ranges_.size()), 1});
            ranges_.push_back({cp, cp});
        }
    }

    void parse_class(Sequence& seq) {
        Element e{Kind::Char, static_cast<uint32_t>(ranges_.size()), 0};
        if (peek() == '^') {
            ++pos_;
            e.kind = Kind::NotChar;
        }
        bool first = true;
        for (;;) {
            if (at_end()) error("unterminated character class");
            if (peek() == ']' && !first) {
                ++pos_;
                break;
            }
            first = false;
            const uint32_t lo = parse_char();
            uint32_t hi = lo;
            if (peek() == '-' && peek(1) != ']' && pos_ + 1 < text_.size()) {
                ++pos_;
                hi = parse_char();
                if (hi < lo) error("character range runs backwards");
            }
            ranges_.push_back({lo, hi});
            e.n_ranges++;
        }
        seq.push_back(e);
    }

    // `<[id]>`, `<text>`, or either after `!` (any one token but that).
    void parse_token(Sequence& seq) {
        Element e{Kind::Token, 0, 0};
        if (peek() == '!') {
            e.kind = Kind::NotToken;
            ++pos_;
        }
        ++pos_;  // '<'
        const size_t start = pos_;
        while (!at_end() && peek() != '>' && peek() != '\n') ++pos_;
        if (peek() != '>') error("unterminated token (`<[id]>` or `<text>`)");
        const std::string_view inner = text_.substr(start, pos_ - start);
        ++pos_;
        if (inner.empty()) error("empty token `<>`");
        if (inner.front() == '[' && inner.back() == ']' && inner.size() > 2) {
            uint64_t id = 0;
            for (char d : inner.substr(1, inner.size() - 2)) {
                if (d < '0' || d > '9' || id > Grammar::kNamedToken)
                    error(fmt::format("bad token id in `<{}>`", inner));
                id = id * 10 + static_cast<uint64_t>(d - '0');
            }
            if (id >= Grammar::kNamedToken) error(fmt::format("bad token id in `<{}>`", inner));
            e.value = static_cast<uint32_t>(id);
        } else {
            // The token's text is all of `<...>`, as special tokens are spelled (<think>).
            const std::string name = "<" + std::string(inner) + ">";
            auto it = std::find(token_names_.begin(), token_names_.end(), name);
            e.value = Grammar::kNamedToken | static_cast<uint32_t>(it - token_names_.begin());
            if (it == token_names_.end()) token_names_.push_back(name);
        }
        seq.push_back(e);
    }

    // Replaces seq[unit..] by its repetition (`*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}`).
    void apply_postfix(Sequence& seq, size_t unit) {
        const char op = peek();
        ++pos_;
        Sequence x(seq.begin() + static_cast<std::ptrdiff_t>(unit), seq.end());
        seq.resize(unit);
        if (x.size() > 1) {  // a literal of several characters: one rule, so copies stay small
            const uint32_t r = new_rule(current_);
            rules_[r] = {x};
            x = {{Kind::Rule, r, 0}};
        }
        uint32_t min = 0, max = 0;
        bool unbounded = false;
        if (op == '*') {
            unbounded = true;
        } else if (op == '+') {
            min = 1;
            unbounded = true;
        } else if (op == '?') {
            max = 1;
        } else {  // {m}, {m,}, {m,n}
            skip_space();
            min = parse_count();
            skip_space();
            max = min;
            if (peek() == ',') {
                ++pos_;
                skip_space();
                if (peek() == '}')
                    unbounded = true;
                else
                    max = parse_count();
                skip_space();
            }
            if (peek() != '}') error("expected `}`");
            ++pos_;
            if (!unbounded && max < min) error("repetition {m,n} with n < m");
        }
        n_elements_ += 2 * static_cast<size_t>(unbounded ? min : max);
        if (n_elements_ > kMaxElements)
            error(
                fmt::format("the grammar is too large (more than {} elements once its "
                            "repetitions are written out)",
                            kMaxElements));
        for (uint32_t i = 0; i < min; ++i) seq.insert(seq.end(), x.begin(), x.end());
        if (unbounded) {  // R ::= x R | (empty)
            const uint32_t r = new_rule(current_);
            Sequence again = x;
            again.push_back({Kind::Rule, r, 0});
            rules_[r] = {again, {}};
            seq.push_back({Kind::Rule, r, 0});
        } else if (max > min) {  // optional tail, nested: (x (x (x)?)?)?
            uint32_t inner = 0;
            bool have_inner = false;
            for (uint32_t i = min; i < max; ++i) {
                const uint32_t r = new_rule(current_);
                Sequence alt = x;
                if (have_inner) alt.push_back({Kind::Rule, inner, 0});
                rules_[r] = {alt, {}};
                inner = r;
                have_inner = true;
            }
            seq.push_back({Kind::Rule, inner, 0});
        }
    }

    uint32_t parse_count() {
        const size_t start = pos_;
        uint64_t v = 0;
        while (peek() >= '0' && peek() <= '9') {
            v = v * 10 + static_cast<uint64_t>(peek() - '0');
            if (v > kMaxRepeat) error(fmt::format("repetition count above {}", kMaxRepeat));
            ++pos_;
        }
        if (pos_ == start) error("expected a number");
        return static_cast<uint32_t>(v);
    }

    // Checks the rules and flattens them into the Grammar.
    std::shared_ptr<const Grammar> finish(std::string_view root) {
        for (size_t r = 0; r < rules_.size(); ++r) {
            if (!defined_[r]) {
                pos_ = used_at_[r];
                error(fmt::format("rule `{}` is used but never defined", names_[r]));
            }
        }
        auto it = index_.find(std::string(root));
        if (it == index_.end()) fail("grammar: there is no `{} ::= ...` rule to start from", root);
        check_left_recursion();

        auto g = std::make_shared<Grammar>();
        g->ranges_ = std::move(ranges_);
        g->names_ = names_;
        g->token_names_ = std::move(token_names_);
        g->root_ = it->second;
        g->alts_.resize(rules_.size());
        for (size_t r = 0; r < rules_.size(); ++r) {
            for (const Sequence& alt : rules_[r]) {
                g->alts_[r].push_back(static_cast<uint32_t>(g->elements_.size()));
                g->elements_.insert(g->elements_.end(), alt.begin(), alt.end());
                g->elements_.push_back({Kind::End, 0, 0});
            }
        }
        g->has_tokens_ = std::any_of(
            g->elements_.begin(), g->elements_.end(),
            [](const Element& e) { return e.kind == Kind::Token || e.kind == Kind::NotToken; });
        return g;
    }

    // A rule that can reach itself without consuming a character would make the matcher's
    // expansion loop forever: refuse it, naming the rule the user wrote.
    void check_left_recursion() const {
        const size_t n = rules_.size();
        std::vector<bool> nullable(n, false);
        for (bool changed = true; changed;) {
            changed = false;
            for (size_t r = 0; r < n; ++r) {
                if (nullable[r]) continue;
                for (const Sequence& alt : rules_[r]) {
                    const bool all = std::all_of(alt.begin(), alt.end(), [&](const Element& e) {
                        return e.kind == Kind::Rule && nullable[e.value];
                    });
                    if (all) {
                        nullable[r] = true;
                        changed = true;
                        break;
                    }
                }
            }
        }
        // Edges r -> s when s can start r's text.
        std::vector<std::vector<uint32_t>> first(n);
        for (size_t r = 0; r < n; ++r)
            for (const Sequence& alt : rules_[r])
                for (const Element& e : alt) {
                    if (e.kind != Kind::Rule) break;
                    first[r].push_back(e.value);
                    if (!nullable[e.value]) break;
                }
        std::vector<int> color(n, 0);  // 0 new, 1 on the path, 2 done
        for (size_t start = 0; start < n; ++start) {
            if (color[start]) continue;
            std::vector<std::pair<uint32_t, size_t>> path{{static_cast<uint32_t>(start), 0}};
            color[start] = 1;
            while (!path.empty()) {
                auto& [r, next] = path.back();
                if (next == first[r].size()) {
                    color[r] = 2;
                    path.pop_back();
                    continue;
                }
                const uint32_t s = first[r][next++];
                if (color[s] == 1) {
                    const bool generated = owner_[s] != names_[s];
                    fail(
                        "grammar: rule `{}`{} is left-recursive: it can reach itself before "
                        "reading any character (rewrite it right-recursively, e.g. "
                        "`x ::= y x | y`, and do not repeat something that can be empty)",
                        owner_[s], generated ? " (a group or repetition inside it)" : "");
                }
                if (color[s] == 0) {
                    color[s] = 1;
                    path.emplace_back(s, 0);
                }
            }
        }
    }

    std::string_view text_;
    size_t pos_ = 0;
    std::vector<std::vector<Sequence>> rules_;
    std::vector<Grammar::Range> ranges_;
    std::vector<std::string> names_;
    std::vector<std::string> token_names_;  // `<text>` tokens, by first use
    std::vector<std::string> owner_;        // the user's rule a generated rule belongs to
    std::vector<bool> defined_;
    std::vector<size_t> used_at_;  // where a rule was first referenced (for errors)
    std::map<std::string, uint32_t> index_;
    std::string current_;    // the rule being parsed (names generated rules)
    int depth_ = 0;          // groups open around the current position
    size_t n_elements_ = 0;  // elements so far (a bound on the compiled size)
    int generated_ = 0;
};

std::shared_ptr<const Grammar> Grammar::parse(std::string_view text, std::string_view root) {
    return GrammarParser(text).parse(root);
}

bool Grammar::matches(const Element& e, uint32_t cp) const {
    if (e.kind == Kind::Token || e.kind == Kind::NotToken) return false;
    bool in = false;
    for (uint32_t i = 0; i < e.n_ranges && !in; ++i) {
        const Range& r = ranges_[e.value + i];
        in = cp >= r.lo && cp <= r.hi;
    }
    return e.kind == Kind::Char ? in : !in;
}

bool Grammar::matches_token(const Element& e, int32_t id) {
    if (id < 0 || (e.value & kNamedToken)) return false;
    if (e.kind == Kind::Token) return e.value == static_cast<uint32_t>(id);
    return e.kind == Kind::NotToken && e.value != static_cast<uint32_t>(id);
}

std::shared_ptr<const Grammar> grammar_bind_tokens(std::shared_ptr<const Grammar> grammar,
                                                   const Tokenizer& tok) {
    if (!grammar || !grammar->has_tokens()) return grammar;
    std::vector<uint32_t> ids;
    for (const std::string& name : grammar->token_names()) {
        const std::vector<TokenId> enc = tok.encode(name, false, true);
        TokenId id = enc.size() == 1 ? enc[0] : tok.find_token(name);
        if (id < 0)
            throw Error(fmt::format("grammar: the model has no token `{}` (its text encodes to "
                                    "{} tokens)",
                                    name, enc.size()),
                        "a token element names one token of the vocabulary: its text, or "
                        "its id as `<[id]>`");
        ids.push_back(static_cast<uint32_t>(id));
    }
    auto out = std::make_shared<Grammar>(*grammar);
    out->token_names_.clear();
    for (Grammar::Element& e : out->elements_) {
        if (e.kind != Kind::Token && e.kind != Kind::NotToken) continue;
        if (e.value & Grammar::kNamedToken) e.value = ids[e.value & ~Grammar::kNamedToken];
        if (e.value >= static_cast<uint32_t>(tok.n_vocab()))
            fail("grammar: token id {} (`<[{}]>`) is beyond the vocabulary of {} tokens", e.value,
                 e.value, tok.n_vocab());
    }
    return out;
}

bool Grammar::matches_any(const Element& e, uint32_t lo, uint32_t hi) const {
    if (e.kind == Kind::Token || e.kind == Kind::NotToken) return false;
    if (e.kind == Kind::Char) {
        for (uint32_t i = 0; i < e.n_ranges; ++i) {
            const Range& r = ranges_[e.value + i];
            if (r.lo <= hi && r.hi >= lo) return true;
        }
        return false;
    }
    // NotChar: some code point of [lo, hi] lies outside every range. Walk up from lo past
    // the ranges that cover it.
    uint32_t cp = lo;
    for (bool moved = true; moved && cp <= hi;) {
        moved = false;
        for (uint32_t i = 0; i < e.n_ranges; ++i) {
            const Range& r = ranges_[e.value + i];
            if (cp >= r.lo && cp <= r.hi) {
                if (r.hi >= hi) return false;
                cp = r.hi + 1;
                moved = true;
            }
        }
    }
    return cp <= hi;
}

}  // namespace kvrun
