// Jinja lexer: template source -> tokens (jinja_impl.h), with the whitespace control of
// jinja2's trim_blocks and lstrip_blocks applied to the text between tags.
//
// The first newline after a block or comment tag is dropped, spaces and tabs before a
// block or comment tag that starts a line are dropped, `{%-` / `-%}` (and the {{ }} and
// {# #} forms) strip all whitespace before / after the tag, and `{%+` / `+%}` turn lstrip /
// trim off for one tag.
#include <algorithm>
#include <charconv>
#include <cstring>

#include "common.h"
#include "jinja_impl.h"

namespace kvrun::jinja {

std::string where(const std::string& src, size_t pos) {
    pos = std::min(pos, src.size());
    int line = 1;
    size_t line_start = 0;
    for (size_t k = 0; k < pos; ++k) {
        if (src[k] == '\n') {
            ++line;
            line_start = k + 1;
        }
    }
    return fmt::format("line {}, column {}", line, pos - line_start + 1);
}

namespace {

bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_ident_start(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_digit(char c) {
    return c >= '0' && c <= '9';
}

class Lexer {
  public:
    explicit Lexer(const std::string& src) : src_(src) {}
    std::vector<Tok> run();

  private:
    // What the end of the previous tag does to the text that follows it.
    enum class After { Nothing, StripAll, TrimNewline };

    void emit_text(size_t begin, size_t end, bool tag_follows, char tag_kind, char modifier);
    void lex_tag(size_t start, char kind);
    size_t lex_raw(size_t content_start);
    void push(Tok::Type type, size_t pos, std::string s = {}) {
        toks_.push_back(Tok{type, std::move(s), 0, 0, pos});
    }
    size_t lex_string(size_t p);
    size_t lex_number(size_t p, bool int_only);

    const std::string& src_;
    std::vector<Tok> toks_;
    After after_ = After::Nothing;
    size_t pos_ = 0;
};

std::vector<Tok> Lexer::run() {
    const size_t n = src_.size();
    while (pos_ <= n) {
        // The next tag start: {{, {% or {#.
        size_t start = pos_;
        while (true) {
            start = src_.find('{', start);
            if (start == std::string::npos || start + 1 >= n) {
                start = std::string::npos;
                break;
            }
            char c = src_[start + 1];
            if (c == '{' || c == '%' || c == '#') break;
            ++start;
        }
        if (start == std::string::npos) {
            emit_text(pos_, n, false, 0, 0);
            break;
        }
        char kind = src_[start + 1];
        char mod = start + 2 < n ? src_[start + 2] : 0;
        emit_text(pos_, start, true, kind, mod);
        lex_tag(start, kind);
    }
    push(Tok::Eof, n);
    return std::move(toks_);
}

// Emits src[begin, end) as text after applying the previous tag's end effect and, when a
// tag follows, that tag's left-side whitespace control.
void Lexer::emit_text(size_t begin, size_t end, bool tag_follows, char tag_kind, char modifier) {
    if (after_ == After::StripAll) {
        while (begin < end && is_space(src_[begin])) ++begin;
    } else if (after_ == After::TrimNewline && begin < end && src_[begin] == '\n') {
        ++begin;
    }
    after_ = After::Nothing;
    if (tag_follows) {
        if (modifier == '-') {
            while (end > begin && is_space(src_[end - 1])) --end;
        } else if ((tag_kind == '%' || tag_kind == '#') && modifier != '+') {
            // lstrip_blocks: drop the tag's indentation when only spaces precede it on its line.
            size_t ls = end;
            while (ls > begin && (src_[ls - 1] == ' ' || src_[ls - 1] == '\t')) --ls;
            if (ls == 0 || src_[ls - 1] == '\n') end = ls;
        }
    }
    if (end > begin) push(Tok::Text, begin, src_.substr(begin, end - begin));
}

void Lexer::lex_tag(size_t start, char kind) {
    const size_t n = src_.size();
    size_t p = start + 2;
    if (kind == '#') {
        size_t close = src_.find("#}", p);
        if (close == std::string::npos) syntax_error(src_, start, "unclosed comment");
        after_ = (close > p && src_[close - 1] == '-') ? After::StripAll : After::TrimNewline;
        pos_ = close + 2;
        return;
    }
    if (p < n && (src_[p] == '-' || (kind == '%' && src_[p] == '+'))) ++p;
    // {% raw %} ... {% endraw %}: the content is text, tags included.
    if (kind == '%') {
        size_t q = p;
        while (q < n && is_space(src_[q])) ++q;
        if (src_.compare(q, 3, "raw") == 0 &&
            (q + 3 >= n || (!is_ident_start(src_[q + 3]) && !is_digit(src_[q + 3])))) {
            q += 3;
            while (q < n && is_space(src_[q])) ++q;
            char m = q < n ? src_[q] : 0;
            if (m == '-' || m == '+') ++q;
            if (src_.compare(q, 2, "%}") == 0) {
                // (trim_blocks does not apply to the raw content's first newline)
                after_ = m == '-' ? After::StripAll : After::Nothing;
                pos_ = lex_raw(q + 2);
                return;
            }
        }
    }
    push(kind == '{' ? Tok::VarBegin : Tok::BlockBegin, start);
    // Open brackets: "}}" inside {{ {'a': {'b': 1}} }} is two braces.
    std::vector<size_t> open;
    bool after_dot = false;
    while (true) {
        while (p < n && is_space(src_[p])) ++p;
        if (p >= n && !open.empty())
            syntax_error(src_, open.back(), "unclosed '{}'", std::string(1, src_[open.back()]));
        if (p >= n)
            syntax_error(src_, start, "unclosed tag (missing '{}')", kind == '{' ? "}}" : "%}");
        if (open.empty()) {
            const char* close = kind == '{' ? "}}" : "%}";
            char m = src_[p];
            bool has_mod =
                (m == '-' || (kind == '%' && m == '+')) && src_.compare(p + 1, 2, close) == 0;
            if (has_mod || src_.compare(p, 2, close) == 0) {
                push(kind == '{' ? Tok::VarEnd : Tok::BlockEnd, p);
                if (has_mod && m == '-') {
                    after_ = After::StripAll;
                } else if (kind == '%' && !has_mod) {
                    after_ = After::TrimNewline;
                } else {
                    after_ = After::Nothing;
                }
                pos_ = p + (has_mod ? 3 : 2);
                return;
            }
        }
        char c = src_[p];
        bool was_dot = after_dot;
        after_dot = false;
        if (is_ident_start(c)) {
            size_t q = p;
            while (q < n && (is_ident_start(src_[q]) || is_digit(src_[q]))) ++q;
            push(Tok::Name, p, src_.substr(p, q - p));
            p = q;
        } else if (is_digit(c)) {
            p = lex_number(p, was_dot);
        } else if (c == '\'' || c == '"') {
            p = lex_string(p);
        } else {
            static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                               "/",  "%",  "~",  "<",  ">",  "=",  ".", ",", ":",
                                               "|",  "(",  ")",  "[",  "]",  "{",  "}"};
            const char* op = nullptr;
            for (const char* o : kOps) {
                if (src_.compare(p, std::strlen(o), o) == 0) {
                    op = o;
                    break;
                }
            }
            if (!op) syntax_error(src_, p, "unexpected character '{}'", std::string(1, c));
            if (*op == '(' || *op == '[' || *op == '{') open.push_back(p);
            if ((*op == ')' || *op == ']' || *op == '}') && !open.empty()) {
                char want = src_[open.back()] == '(' ? ')' : src_[open.back()] == '[' ? ']' : '}';
                if (*op != want)
                    syntax_error(src_, p, "unexpected '{}', expected '{}'", op,
                                 std::string(1, want));
                open.pop_back();
            }
            after_dot = *op == '.';
            push(Tok::Op, p, op);
            p += std::strlen(op);
        }
    }
}

// Finds {% endraw %} from content_start, emits the raw text, returns the position after.
size_t Lexer::lex_raw(size_t content_start) {
    const size_t n = src_.size();
    for (size_t p = src_.find("{%", content_start); p != std::string::npos;
         p = src_.find("{%", p + 2)) {
        size_t q = p + 2;
        char lmod = q < n ? src_[q] : 0;
        if (lmod == '-' || lmod == '+') ++q;
        while (q < n && is_space(src_[q])) ++q;
        if (src_.compare(q, 6, "endraw") != 0) continue;
        q += 6;
        while (q < n && is_space(src_[q])) ++q;
        char rmod = q < n ? src_[q] : 0;
        if (rmod == '-' || rmod == '+') ++q;
        if (src_.compare(q, 2, "%}") != 0) continue;
        emit_text(content_start, p, true, '%', lmod);
        after_ = rmod == '-' ? After::StripAll : rmod == '+' ? After::Nothing : After::TrimNewline;
        return q + 2;
    }
    syntax_error(src_, content_start, "missing {{% endraw %}}");
}

size_t Lexer::lex_string(size_t p) {
    const size_t n = src_.size(), start = p;
    char quote = src_[p++];
    std::string out;
    auto hex = [&](size_t& q, int digits) {
        uint32_t v = 0;
        for (int d = 0; d < digits; ++d, ++q) {
            char h = q < n ? src_[q] : 0;
            int x = is_digit(h)              ? h - '0'
                    : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                    : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                             : -1;
            if (x < 0) syntax_error(src_, q, "bad escape in string literal");
            v = v * 16 + uint32_t(x);
        }
        return v;
    };
    while (true) {
        if (p >= n) syntax_error(src_, start, "unterminated string literal");
        char c = src_[p];
        if (c == quote) break;
        if (c != '\\') {
            out += c;
            ++p;
            continue;
        }
        char e = p + 1 < n ? src_[p + 1] : 0;
        p += 2;
        switch (e) {
            case 'n':
                out += '\n';
                break;
            case 't':
                out += '\t';
                break;
            case 'r':
                out += '\r';
                break;
            case '\\':
                out += '\\';
                break;
            case '\'':
                out += '\'';
                break;
            case '"':
                out += '"';
                break;
            case 'a':
                out += '\a';
                break;
            case 'b':
                out += '\b';
                break;
            case 'f':
                out += '\f';
                break;
            case 'v':
                out += '\v';
                break;
            case '\n':
                break;  // line continuation
            case 'x':
                out += encode_utf8(hex(p, 2));
                break;
            case 'u':
                out += encode_utf8(hex(p, 4));
                break;
            case 'U': {
                uint32_t cp = hex(p, 8);
                if (cp > 0x10ffff) syntax_error(src_, p, "bad \\U escape in string literal");
                out += encode_utf8(cp);
                break;
            }
            default:
                if (e >= '0' && e <= '7') {  // octal, up to 3 digits
                    uint32_t v = uint32_t(e - '0');
                    for (int d = 0; d < 2 && p < n && src_[p] >= '0' && src_[p] <= '7'; ++d)
                        v = v * 8 + uint32_t(src_[p++] - '0');
                    out += encode_utf8(v);
                } else {  // unknown escapes stay as written (Python)
                    out += '\\';
                    if (e) out += e;
                    if (!e) --p;
                }
        }
    }
    push(Tok::Str, start, std::move(out));
    return p + 1;
}

size_t Lexer::lex_number(size_t p, bool int_only) {
    const size_t n = src_.size(), start = p;
    std::string digits;
    auto run = [&]() {  // digits with single underscores between them
        while (p < n && (is_digit(src_[p]) ||
                         (src_[p] == '_' && p + 1 < n && is_digit(src_[p + 1]) && !digits.empty())))
            if (src_[p++] != '_') digits += src_[p - 1];
    };
    run();
    bool is_float = false;
    if (!int_only && p + 1 < n && src_[p] == '.' && is_digit(src_[p + 1])) {
        is_float = true;
        digits += src_[p++];
        run();
    }
    if (!int_only && p < n && (src_[p] == 'e' || src_[p] == 'E')) {
        size_t q = p + 1;
        if (q < n && (src_[q] == '+' || src_[q] == '-')) ++q;
        if (q < n && is_digit(src_[q])) {
            is_float = true;
            digits += 'e';
            digits.append(src_, p + 1, q - p - 1);
            p = q;
            run();
        }
    }
    Tok t{is_float ? Tok::Float : Tok::Int, src_.substr(start, p - start), 0, 0, start};
    const char* b = digits.data();
    const char* e = b + digits.size();
    auto r = is_float ? std::from_chars(b, e, t.f) : std::from_chars(b, e, t.i);
    if (r.ec == std::errc::result_out_of_range && is_float) {
        t.f = std::strtod(digits.c_str(), nullptr);  // inf or 0, as Python
    } else if (r.ec != std::errc() || r.ptr != e) {
        syntax_error(src_, start, "bad number literal '{}'", t.s);
    }
    toks_.push_back(std::move(t));
    return p;
}

}  // namespace

std::vector<Tok> tokenize(const std::string& src) {
    return Lexer(src).run();
}

}  // namespace kvrun::jinja
