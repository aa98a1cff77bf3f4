// Tests for GBNF grammars: parsing (and its error messages), matching whole texts and
// prefixes (code points split across calls included), the vocabulary trie's mask against
// token-by-token checks on real vocabularies, and the sampler under a grammar constraint.
#include <doctest/doctest.h>

#include <random>
#include <string>
#include <vector>

#include "common.h"
#include "gguf.h"
#include "grammar.h"
#include "sampler.h"
#include "test_util.h"
#include "tokenizer.h"

using namespace kvrun;

namespace {

bool accepts(const std::string& grammar, const std::string& text) {
    return grammar_accepts(*Grammar::parse(grammar), text);
}

std::string parse_error(const std::string& grammar) {
    try {
        Grammar::parse(grammar);
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

// A small JSON grammar in the style users write (multi-line rules, comments, groups).
const char* kJsonGrammar = R"(
# any JSON value
root   ::= value
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
  )* "\"" ws

number ::= "-"? ([0-9] | [1-9] [0-9]{1,15}) ("." [0-9]+)? ([eE] [-+]? [0-9]{1,4})? ws
ws ::= | " " | "\n" [ \t]{0,20}
)";

}  // namespace

TEST_CASE("grammar: literals, classes, alternatives and repetitions") {
    CHECK(accepts(R"(root ::= "abc")", "abc"));
    CHECK_FALSE(accepts(R"(root ::= "abc")", "ab"));
    CHECK_FALSE(accepts(R"(root ::= "abc")", "abcd"));
    CHECK(accepts(R"(root ::= "a" | "b" | )", ""));
    CHECK(accepts(R"(root ::= [a-c0-9]+)", "a0c9b"));
    CHECK_FALSE(accepts(R"(root ::= [a-c0-9]+)", ""));
    CHECK_FALSE(accepts(R"(root ::= [a-c0-9]+)", "abd"));
    CHECK(accepts(R"(root ::= [^a-c]*)", "xyz!\n"));
    CHECK_FALSE(accepts(R"(root ::= [^a-c]*)", "xaz"));
    CHECK(accepts(R"(root ::= . . .)", "a\xC3\xA9\xE6\x97\xA5"));  // any three code points
    CHECK(accepts(R"(root ::= "x"? "y")", "y"));
    CHECK(accepts(R"(root ::= "x"? "y")", "xy"));
    CHECK_FALSE(accepts(R"(root ::= "x"? "y")", "xxy"));
    CHECK(accepts(R"(root ::= "ab"*)", "ababab"));  // a postfix repeats the whole literal
    CHECK_FALSE(accepts(R"(root ::= "ab"*)", "aba"));
    for (int n = 0; n <= 6; ++n) {
        CAPTURE(n);
        const std::string xs(static_cast<size_t>(n), 'x');
        CHECK(accepts(R"(root ::= "x"{2,4})", xs) == (n >= 2 && n <= 4));
        CHECK(accepts(R"(root ::= "x"{3})", xs) == (n == 3));
        CHECK(accepts(R"(root ::= "x"{2,})", xs) == (n >= 2));
        CHECK(accepts(R"(root ::= "x"{0,2})", xs) == (n <= 2));
    }
    CHECK(accepts(R"(root ::= ("a" | "bc")+ "!")", "abcbca!"));
    CHECK_FALSE(accepts(R"(root ::= ("a" | "bc")+ "!")", "ab!"));
    // Rules referenced before their definition, recursion that consumes first, comments.
    const char* nested = R"g(
        root ::= item  # a comment
        item ::= "(" item* ")" | "x"
    )g";
    CHECK(accepts(nested, "(x(xx)())"));
    CHECK_FALSE(accepts(nested, "(x(xx)()"));
    // Escapes in literals and classes.
    CHECK(accepts(R"(root ::= "\x41\u00e9\n\t\"\\")", "A\xC3\xA9\n\t\"\\"));
    CHECK(accepts(R"(root ::= [\]\-\x30]+)", "]-0"));
    CHECK(accepts(R"(root ::= "日本" [語人])", "日本語"));
}

TEST_CASE("grammar: a JSON grammar accepts JSON and refuses near misses") {
    auto g = Grammar::parse(kJsonGrammar);
    for (const char* ok :
         {"{}", "[]", "{\"a\": [1, -2.5e3, true, null], \"b\": {\"c\": \"\\u00e9\"}}",
          "\"tab\\tnew\\nline\"", "[\n  1,\n  2\n]", "0", "-0.5"}) {
        CAPTURE(ok);
        CHECK(grammar_accepts(*g, ok));
    }
    for (const char* bad :
         {"{", "[1,]", "{\"a\" 1}", "\"raw\ncontrol\"", "01", "tru", "[1 2]", "\"\\x\""}) {
        CAPTURE(bad);
        CHECK_FALSE(grammar_accepts(*g, bad));
    }
}

TEST_CASE("grammar: parse errors name the problem and where it is") {
    CHECK(parse_error("").find("empty") != std::string::npos);
    CHECK(parse_error(R"(item ::= "x")").find("no `root ::= ...` rule") != std::string::npos);
    CHECK(parse_error("root ::= item\n") ==
          "grammar: rule `item` is used but never defined at line 1, column 10");
    CHECK(parse_error("root ::= \"abc\n\"").find("newline inside a string literal") !=
          std::string::npos);
    CHECK(parse_error(R"(root ::= "abc)").find("unterminated string literal") != std::string::npos);
    CHECK(parse_error(R"(root ::= [a-)").find("unterminated character class") != std::string::npos);
    CHECK(parse_error(R"(root ::= [z-a])").find("runs backwards") != std::string::npos);
    CHECK(parse_error(R"(root ::= "\q")").find("unknown escape `\\q`") != std::string::npos);
    CHECK(parse_error("root ::= \"a\"\nroot ::= \"b\"").find("defined twice at line 2") !=
          std::string::npos);
    CHECK(parse_error(R"(root ::= * "a")").find("nothing to repeat") != std::string::npos);
    CHECK(parse_error(R"(root ::= ("a")").find("expected `)`") != std::string::npos);
    CHECK(parse_error(R"(root ::= "a"{3,1})").find("n < m") != std::string::npos);
    CHECK(parse_error(R"(root ::= "a"{99999})").find("above 10000") != std::string::npos);
    CHECK(parse_error("root ::= \"\xC3\"").find("invalid UTF-8") != std::string::npos);
    // Left recursion would loop forever in the matcher: refused with the user's rule name.
    CHECK(parse_error("root ::= root \"a\" | \"b\"").find("rule `root` is left-recursive") !=
          std::string::npos);
    CHECK(parse_error("root ::= a\na ::= b? a \"x\"\nb ::= \"y\"")
              .find("rule `a` is left-recursive") != std::string::npos);
    CHECK(parse_error(R"(root ::= ("a"?)*)")
              .find("rule `root` (a group or repetition inside it) is left-recursive") !=
          std::string::npos);
    // Hostile sizes: deep nesting and huge written-out repetitions are refused, not crashed on.
    CHECK(parse_error("root ::= " + std::string(300, '(') + "\"a\"" + std::string(300, ')'))
              .find("nested more than 256 deep") != std::string::npos);
    std::string huge = "root ::=";
    for (int i = 0; i < 300; ++i) huge += " \"ab\"{10000}";
    CHECK(parse_error(huge).find("too large") != std::string::npos);
    CHECK(accepts(R"(root ::= ("ab"{100}){50})", [] {
        std::string t;
        for (int i = 0; i < 5000; ++i) t += "ab";
        return t;
    }()));
    // Another start rule can be chosen.
    CHECK(grammar_accepts(*Grammar::parse("start ::= \"s\"", "start"), "s"));
}

TEST_CASE("grammar state: prefixes, completion and code points split across calls") {
    auto g = Grammar::parse(R"(root ::= "caf" [\u00e0-\u00ff] ("!" | ""))");
    GrammarState st(g);
    CHECK_FALSE(st.complete());
    CHECK(st.accepts("ca"));
    CHECK_FALSE(st.accepts("cb"));
    REQUIRE(st.advance("caf"));
    // U+00E9 is C3 A9: its first byte alone could still become a code point in range.
    CHECK(st.accepts("\xC3"));
    CHECK_FALSE(st.accepts("\xE6"));  // a 3-byte lead: every completion is beyond U+00FF
    CHECK_FALSE(st.accepts("\xA9"));  // a continuation byte cannot start a character
    REQUIRE(st.advance("\xC3"));
    CHECK_FALSE(st.complete());       // half a character is not a complete text
    CHECK_FALSE(st.advance("\xE0"));  // a lead byte where a continuation byte must come
    REQUIRE(st.advance("\xA9"));
    CHECK(st.complete());
    CHECK_FALSE(st.finished());  // "!" may still follow
    REQUIRE(st.advance("!"));
    CHECK(st.finished());
    CHECK_FALSE(st.accepts("!"));
    // Only well-formed UTF-8: no overlong spelling of "{" (which once let a model write four
    // byte tokens where the grammar wanted "{"), no surrogates, nothing past U+10FFFF.
    GrammarState brace(Grammar::parse(R"(root ::= "{")"));
    CHECK(brace.accepts("{"));
    CHECK_FALSE(brace.accepts("\xF0"));
    CHECK_FALSE(brace.accepts("\xF0\x80\x81\xBB"));
    CHECK_FALSE(brace.accepts("\xC1\xBB"));
    GrammarState any(Grammar::parse("root ::= ."));
    CHECK(any.accepts("\xF4\x8F\xBF\xBF"));
    CHECK(any.accepts("\xED\x9F\xBF"));
    CHECK_FALSE(any.accepts("\xED\xA0"));
    CHECK_FALSE(any.accepts("\xF4\x90"));
    CHECK_FALSE(any.accepts("\xF5"));
    CHECK_FALSE(any.accepts("\xE0\x9F"));  // only overlong 3-byte forms start E0 80..9F
    // A refused advance leaves the state as it was.
    GrammarState st2(g);
    CHECK_FALSE(st2.advance("cafx"));
    CHECK(st2.advance("caf\xC3\xA0"));
}

TEST_CASE("grammar constraint: the trie's mask equals token-by-token checks on real vocabularies") {
    const char* grammars[] = {
        kJsonGrammar,
        R"(root ::= ("yes" | "no") " " [0-9]{1,3} "\n")",
        R"(root ::= [^a-z]* "é" .)",
        R"(root ::= " Once upon a time" [ a-z,.]*)",
        // Tokens (control ones included) among text, and any token but one.
        R"(root ::= ("a" | <[1]> | <[7]>) (!<[300]> | " x"){1,3} [0-9]+)",
    };
    for (const char* vocab_name :
         {"models/stories260K-F16.gguf", "vocab/ggml-vocab-llama-spm.gguf",
          "vocab/ggml-vocab-gpt-2.gguf", "vocab/ggml-vocab-deepseek-llm.gguf"}) {
        CAPTURE(vocab_name);
        auto path = test::shared_path(vocab_name);
        if (path.empty()) return;
        if (!std::filesystem::exists(path)) {
            MESSAGE("SKIP: missing " << path.string());
            continue;
        }
        GgufFile file = GgufFile::open(path.string());
        auto tok = Tokenizer::from_gguf(file);
        auto vocab = std::make_shared<GrammarVocab>(*tok);
        std::mt19937 rng(7);
        for (const char* text : grammars) {
            GrammarConstraint c(grammar_bind_tokens(Grammar::parse(text), *tok), vocab);
            GrammarConstraint prev = c;
            std::vector<uint8_t> prev_mask;
            // Walk a few random allowed tokens deep, comparing the mask with allows() each time.
            for (int step = 0; step < 6; ++step) {
                std::vector<uint8_t> mask(static_cast<size_t>(tok->n_vocab()), 7);
                c.allowed_mask(mask);
                std::vector<TokenId> allowed;
                int mismatches = 0;
                TokenId first_mismatch = -1;
                for (TokenId t = 0; t < tok->n_vocab(); ++t) {
                    if (mask[t] > 1 || (mask[t] == 1) != c.allows(t)) {
                        if (mismatches++ == 0) first_mismatch = t;
                    }
                    if (mask[t] == 1 && !tok->is_eog(t)) allowed.push_back(t);
                }
                CHECK_MESSAGE(mismatches == 0,
                              "step " << step << ": first mismatch token " << first_mismatch);
                if (step == 0) CHECK(!allowed.empty());
                for (TokenId t : tok->eog_ids()) CHECK(c.allows(t) == c.complete());
                // Masks come from a cache shared by copies: the same state gives the same
                // mask again, and an earlier state (a copy left behind) still gets its own.
                std::vector<uint8_t> again(mask.size());
                c.allowed_mask(again);
                CHECK(again == mask);
                if (step > 0) {
                    prev.allowed_mask(again);
                    CHECK(again == prev_mask);
                }
                prev = c;
                prev_mask = mask;
                if (allowed.empty()) break;
                c.accept(allowed[rng() % allowed.size()]);
            }
        }
    }
}

TEST_CASE("grammar constraint: extra end tokens are allowed exactly where the text is complete") {
    auto path = test::shared_path("models/stories260K.gguf");
    if (path.empty()) return;
    GgufFile file = GgufFile::open(path.string());
    auto tok = Tokenizer::from_gguf(file);
    auto vocab = std::make_shared<GrammarVocab>(*tok);
    const TokenId dot = tok->find_token(".");
    const TokenId word = tok->find_token("\u2581the");  // " the"
    REQUIRE(dot >= 0);
    REQUIRE(word >= 0);
    // "." spelled by the grammar too: as an end token it is only an end.
    GrammarConstraint c(Grammar::parse(R"(root ::= (" the")+ "."?)"), vocab);
    c.set_end_tokens({dot});
    std::vector<uint8_t> mask(static_cast<size_t>(tok->n_vocab()));
    c.allowed_mask(mask);
    CHECK_FALSE(c.allows(dot));  // nothing yet: not complete
    CHECK(mask[size_t(dot)] == 0);
    CHECK(c.allows(word));
    c.accept(word);
    CHECK(c.complete());
    c.allowed_mask(mask);
    CHECK(c.allows(dot));
    CHECK(mask[size_t(dot)] == 1);
    GrammarConstraint before = c;
    CHECK(c.try_accept(dot));  // the end: the state stays
    CHECK(c.state().complete());
    c.accept(word);  // still where it was
    // Without it, "." is text of the grammar.
    GrammarConstraint plain(Grammar::parse(R"(root ::= (" the")+ "."?)"), vocab);
    CHECK_FALSE(plain.allows(dot));  // not before " the"
    plain.accept(word);
    CHECK(plain.allows(dot));
    plain.accept(dot);
    CHECK(plain.finished());
    CHECK_FALSE(plain.allows(word));
}

TEST_CASE("grammar tokens: <[id]>, <text> and !<...> match whole tokens, control ones too") {
    // Parsing: ids, names (bound later), negation, and the errors.
    auto g = Grammar::parse(R"(root ::= <[12]> !<[3]> <think> ("x" | <think>))");
    CHECK(g->has_tokens());
    REQUIRE(g->token_names() == std::vector<std::string>{"<think>"});
    CHECK_FALSE(Grammar::parse(R"(root ::= "<[12]>")")->has_tokens());           // a literal's text
    CHECK_FALSE(grammar_accepts(*Grammar::parse("root ::= <[12]>"), "<[12]>"));  // never text
    CHECK(parse_error("root ::= <>").find("empty token") != std::string::npos);
    CHECK(parse_error("root ::= <[1x]>").find("bad token id") != std::string::npos);
    CHECK(parse_error("root ::= <[99999999999]>").find("bad token id") != std::string::npos);
    CHECK(parse_error("root ::= <abc\n").find("unterminated token") != std::string::npos);
    CHECK(parse_error("root ::= ! \"a\"").find("unexpected character `!`") != std::string::npos);

    auto path = test::shared_path("models/stories260K.gguf");
    if (path.empty()) return;
    GgufFile file = GgufFile::open(path.string());
    auto tok = Tokenizer::from_gguf(file);
    auto vocab = std::make_shared<GrammarVocab>(*tok);
    const TokenId bos = tok->bos();  // a control token: no text, so only a token element
    const TokenId the = tok->find_token("\u2581the");
    const TokenId dot = tok->find_token(".");
    REQUIRE(bos >= 0);
    REQUIRE(the >= 0);
    REQUIRE(dot >= 0);
    const auto n = static_cast<size_t>(tok->n_vocab());
    auto allowed = [&](const GrammarConstraint& c) {
        std::vector<uint8_t> mask(n);
        c.allowed_mask(mask);
        std::vector<TokenId> out;
        for (TokenId t = 0; t < tok->n_vocab(); ++t) {
            CHECK((mask[t] == 1) == c.allows(t));
            if (mask[t]) out.push_back(t);
        }
        return out;
    };
    // The tokens whose whole text is `text` (a word and its byte-fallback twin).
    auto spelled = [&](const std::string& text) {
        std::vector<TokenId> out;
        for (TokenId t = 0; t < tok->n_vocab(); ++t)
            if (!tok->is_control(t) && tok->token_to_piece(t) == text) out.push_back(t);
        return out;
    };

    // Binding: texts become ids (the encoded special token, or the vocabulary's spelling),
    // unknown names and ids past the vocabulary are refused, an unbound grammar too.
    auto bound = grammar_bind_tokens(Grammar::parse("root ::= <s> <[5]>"), *tok);
    CHECK(bound->token_names().empty());
    CHECK(Grammar::matches_token(bound->element(bound->alternatives_of(bound->root())[0]), bos));
    CHECK(Grammar::matches_token(bound->element(bound->alternatives_of(bound->root())[0] + 1), 5));
    auto plain = Grammar::parse(R"(root ::= "a")");
    CHECK(grammar_bind_tokens(plain, *tok) == plain);  // nothing to bind: the same grammar
    CHECK_THROWS_WITH_AS(grammar_bind_tokens(Grammar::parse("root ::= <no such token>"), *tok),
                         doctest::Contains("has no token `<no such token>`"), Error);
    // A text that is a word of the vocabulary, not a special token: <0x0A>-style byte tokens.
    CHECK(grammar_bind_tokens(Grammar::parse("root ::= <0x0A>"), *tok)->token_names().empty());
    CHECK_THROWS_WITH_AS(grammar_bind_tokens(Grammar::parse("root ::= <[512]>"), *tok),
                         doctest::Contains("beyond the vocabulary of 512"), Error);
    CHECK_THROWS_WITH_AS(GrammarConstraint(Grammar::parse("root ::= <s>"), vocab),
                         doctest::Contains("not bound"), Error);
    CHECK_THROWS_WITH_AS(GrammarConstraint(Grammar::parse("root ::= <[600]>"), vocab),
                         doctest::Contains("beyond the vocabulary"), Error);

    // A control token between texts: exactly it is allowed, then the text goes on.
    {
        GrammarConstraint c(grammar_bind_tokens(Grammar::parse(R"(root ::= " the" <s> ".")"), *tok),
                            vocab);
        c.accept(the);
        CHECK(allowed(c) == std::vector<TokenId>{bos});
        c.accept(bos);
        CHECK(allowed(c) == spelled("."));
        c.accept(dot);
        CHECK(c.finished());
    }
    // A token by id or its text: the token itself may come either way; the mask agrees.
    {
        GrammarConstraint c(
            grammar_bind_tokens(
                Grammar::parse(fmt::format(R"(root ::= (<[{}]> | " th") "e")", the)), *tok),
            vocab);
        const auto first = allowed(c);
        CHECK(std::find(first.begin(), first.end(), the) != first.end());
        CHECK(std::find(first.begin(), first.end(), tok->find_token("\u2581th")) != first.end());
        GrammarConstraint as_token = c;
        as_token.accept(the);  // both parses: the token, and " th" + "e" of its text
        CHECK(as_token.complete());
        CHECK(as_token.state().complete());
    }
    // !<[id]>: any one token but that one (and no end of generation), then the text.
    {
        GrammarConstraint c(Grammar::parse(fmt::format(R"(root ::= !<[{}]> ".")", dot)), vocab);
        const auto first = allowed(c);
        CHECK(std::find(first.begin(), first.end(), dot) == first.end());
        CHECK(std::find(first.begin(), first.end(), bos) != first.end());
        for (TokenId t : tok->eog_ids())
            CHECK(std::find(first.begin(), first.end(), t) == first.end());
        CHECK(first.size() == n - 1 - tok->eog_ids().size());
        CHECK_FALSE(c.try_accept(dot));
        c.accept(the);
        CHECK(allowed(c) == spelled("."));
    }
    // Reasoning the way a tool grammar writes it: any tokens but the closing one, then it.
    {
        GrammarConstraint c(
            Grammar::parse(fmt::format(R"(root ::= (!<[{0}]>)* <[{0}]> " the")", dot)), vocab);
        for (int i = 0; i < 5; ++i) c.accept(the);
        c.accept(dot);
        for (TokenId t : allowed(c))  // " the" and its prefixes (" ", " t", ...)
            CHECK(std::string(" the").rfind(tok->token_to_piece(t), 0) == 0);
        c.accept(the);
        CHECK(c.finished());
    }
}

TEST_CASE("lazy grammar constraint: everything until a trigger word, pattern or token") {
    auto path = test::shared_path("models/stories260K.gguf");
    if (path.empty()) return;
    GgufFile file = GgufFile::open(path.string());
    auto tok = Tokenizer::from_gguf(file);
    auto vocab = std::make_shared<GrammarVocab>(*tok);
    auto id = [&](const char* piece) {
        const TokenId t = tok->find_token(piece);
        REQUIRE(t >= 0);
        return t;
    };
    // SPM pieces: " the", " c", " t", "h", "e", "1", ".".
    const TokenId the = id("\u2581the"), sc = id("\u2581c"), st = id("\u2581t");
    const TokenId h = id("h"), e = id("e"), one = id("1"), dot = id("."), eos = tok->eos();
    auto g = Grammar::parse(R"(root ::= "the" [0-9]+ ".")");
    std::vector<uint8_t> mask(static_cast<size_t>(tok->n_vocab()));

    GrammarConstraint lazy(g, vocab);
    lazy.set_lazy({{"the"}, {}, {}, {}});
    CHECK_FALSE(lazy.triggered());
    CHECK(lazy.complete());  // free text may end anywhere
    lazy.allowed_mask(mask);
    CHECK(std::count(mask.begin(), mask.end(), 1) == tok->n_vocab());
    CHECK(lazy.allows(eos));
    lazy.accept(sc);
    lazy.accept(st);  // " c t": the word begins...
    CHECK_FALSE(lazy.triggered());
    lazy.accept(h);
    lazy.accept(e);  // ... and is whole: the grammar has taken "the"
    CHECK(lazy.triggered());
    CHECK_FALSE(lazy.complete());
    CHECK_FALSE(lazy.allows(eos));
    CHECK_FALSE(lazy.allows(sc));
    CHECK(lazy.allows(one));
    lazy.allowed_mask(mask);
    CHECK(mask[size_t(one)] == 1);
    CHECK(mask[size_t(sc)] == 0);
    lazy.accept(one);
    lazy.accept(dot);
    CHECK(lazy.finished());

    // A trigger the grammar cannot start with is none: the search goes on past it.
    GrammarConstraint other(Grammar::parse(R"(root ::= "x" [0-9]+)"), vocab);
    other.set_lazy({{"the"}, {}, {}, {}});
    other.accept(the);
    CHECK_FALSE(other.triggered());
    CHECK(other.allows(sc));

    // A token trigger: the grammar starts right after it.
    GrammarConstraint by_token(Grammar::parse(R"(root ::= [0-9]+)"), vocab);
    by_token.set_lazy({{}, {}, {}, {sc}});
    by_token.accept(the);
    CHECK(by_token.allows(the));
    by_token.accept(sc);
    CHECK(by_token.triggered());
    CHECK_FALSE(by_token.allows(the));
    CHECK(by_token.allows(one));

    // A pattern: the grammar starts at its first group.
    GrammarConstraint by_pattern(g, vocab);
    by_pattern.set_lazy({{}, {"c (the)"}, {}, {}});
    by_pattern.accept(the);
    CHECK_FALSE(by_pattern.triggered());  // " the" alone does not match
    by_pattern.accept(sc);
    by_pattern.accept(the);  // " the c the"
    CHECK(by_pattern.triggered());
    CHECK(by_pattern.allows(one));
    // A copy goes on from the same place.
    GrammarConstraint copy = by_pattern;
    copy.accept(one);
    CHECK(copy.allows(dot));
    CHECK_FALSE(by_pattern.allows(dot));
    // Hostile patterns on a long reply: no stack exhaustion (std::regex recurses per
    // character), and a word trigger at its end still works.
    const TokenId at = id("at");
    GrammarConstraint hostile(g, vocab);
    hostile.set_lazy({{"the"}, {"a[\\s\\S]*b", "(a|at)*x"}, {"[\\s\\S]*x", "(a|t)*x"}, {}});
    for (int i = 0; i < 1000; ++i) hostile.accept(at);  // 2000 bytes of "atat..."
    CHECK_FALSE(hostile.triggered());
    hostile.accept(st);
    hostile.accept(h);
    hostile.accept(e);
    CHECK(hostile.triggered());
    CHECK(hostile.allows(one));
    // A bad pattern is refused with its reason.
    GrammarConstraint bad(g, vocab);
    CHECK_THROWS_WITH_AS(bad.set_lazy({{}, {"(unclosed"}, {}, {}}),
                         doctest::Contains("not a valid regex"), Error);
}

namespace {

// A constraint that allows a fixed set of tokens (sampler tests need no vocabulary).
struct SetConstraint : TokenConstraint {
    std::vector<uint8_t> ok;
    bool allows(TokenId t) const override { return ok[static_cast<size_t>(t)] != 0; }
    void allowed_mask(std::span<uint8_t> mask) const override {
        std::copy(ok.begin(), ok.end(), mask.begin());
    }
};

}  // namespace

TEST_CASE("sampler under a constraint: exactly the distribution of masked logits") {
    const int V = 1000;
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.0f, 3.0f);
    std::vector<float> logits(V);
    for (float& l : logits) l = nd(rng);
    SetConstraint c;
    c.ok.assign(V, 0);
    for (int i = 0; i < V; i += 3) c.ok[static_cast<size_t>(i)] = 1;
    std::vector<float> masked = logits;
    for (int i = 0; i < V; ++i)
        if (!c.ok[static_cast<size_t>(i)]) masked[static_cast<size_t>(i)] = -INFINITY;
    // Top-k small (the one-by-one path), large (beyond the window: the mask path), off.
    for (int top_k : {0, 1, 5, 40, 200}) {
        for (float temp : {0.0f, 0.7f}) {
            CAPTURE(top_k);
            CAPTURE(temp);
            SamplingParams p;
            p.temperature = temp;
            p.top_k = top_k;
            p.top_p = 0.9f;
            p.min_p = 0.01f;
            p.repeat_penalty = 1.1f;
            p.seed = 11;
            Sampler constrained(p), reference(p);
            constrained.set_constraint(&c);
            std::vector<TokenId> recent = {0, 3, 6, 7};
            auto pc = constrained.probabilities(logits.data(), V, recent);
            auto pr = reference.probabilities(masked.data(), V, recent);
            CHECK(pc == pr);
            for (int i = 0; i < 50; ++i) {
                const TokenId a = constrained.sample(logits.data(), V, recent);
                CHECK(a == reference.sample(masked.data(), V, recent));
                CHECK(c.ok[static_cast<size_t>(a)] == 1);
            }
        }
    }
    SetConstraint none;
    none.ok.assign(V, 0);
    Sampler s(SamplingParams{});
    s.set_constraint(&none);
    CHECK_THROWS_WITH_AS(s.sample(logits.data(), V, {}),
                         doctest::Contains("the grammar allows no token"), Error);
}
