// libFuzzer target for GBNF grammars, which JSON requests can carry: the input is grammar text,
// a NUL byte, then text to match. Parsing must either succeed or throw kvrun::Error (never
// crash or hang), and a parsed grammar must read the text consistently: advancing by the
// whole text succeeds exactly when advancing byte by byte does, a refused advance changes
// nothing, complete() agrees with grammar_accepts(), and token elements (<[id]>, !<[id]>)
// read tokens consistently. Run with KVRUN_FUZZ_WRITE_SEEDS=<dir>
// to write a small seed corpus and exit.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>

#include "common.h"
#include "fuzz_seeds.h"
#include "grammar.h"

namespace {

[[noreturn]] void trap(const char* what) {
    std::fprintf(stderr, "fuzz_grammar: %s\n", what);
    std::abort();
}

void write_seeds(const char* dir) {
    const char* seeds[][2] = {
        {R"(root ::= "yes" | "no")", "yes"},
        {R"(root ::= [a-z]+ ("," [a-z]+)*)", "ab,cd"},
        {R"(root ::= ("ab"{2,3} | [^x]?) "!" .)", "abab!\xC3\xA9"},
        {"root ::= obj\nobj ::= \"{\" ws (str \":\" ws obj)? \"}\" ws\nstr ::= \"\\\"\" "
         "[^\"\\\\]* \"\\\"\"\nws ::= [ \\t\\n]{0,4}",
         "{\"a\": {}}"},
        {R"(root ::= "\u00e9\x41\n" [\u0100-\U0001F600]*)",
         "\xC3\xA9"
         "A\n\xF0\x9F\x98\x80"},
        {"root ::= item  # comment\nitem ::= \"(\" item* \")\" | \"x\"", "(x(x))"},
        {"root ::= \"a\" <[98]> (!<[99]>)* <[99]> <think>?", "abxyc"},
    };
    int n = 0;
    for (const auto& s : seeds) {
        std::ofstream out(std::string(dir) + "/seed_" + std::to_string(n++), std::ios::binary);
        out << s[0] << '\0' << s[1];
    }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    return fuzz_write_seeds_if_asked(write_seeds);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view input(reinterpret_cast<const char*>(data), size);
    const size_t cut = input.find('\0');
    const std::string_view grammar_text = input.substr(0, cut);
    const std::string_view text = cut == std::string_view::npos ? "" : input.substr(cut + 1);
    std::shared_ptr<const kvrun::Grammar> g;
    try {
        g = kvrun::Grammar::parse(grammar_text);
    } catch (const kvrun::Error&) {
        return 0;
    }
    try {
        kvrun::GrammarState whole(g), bytes(g);
        const bool ok_whole = whole.advance(text);
        bool ok_bytes = true;
        for (char c : text) {
            kvrun::GrammarState before = bytes;
            if (!bytes.advance(std::string_view(&c, 1))) {
                ok_bytes = false;
                if (bytes.complete() != before.complete()) trap("a refused byte changed the state");
                break;
            }
        }
        if (ok_whole != ok_bytes) trap("whole text and byte by byte disagree");
        const bool accepted = kvrun::grammar_accepts(*g, text);
        if (accepted != (ok_whole && whole.complete())) trap("grammar_accepts disagrees");
        if (whole.finished() && !whole.complete()) trap("finished but not complete");
        // Tokens: each byte of the text as a token id (every third with that byte as its
        // text, the others with none, like control tokens): accepts_token agrees with
        // advance_token, and a refused token changes nothing.
        kvrun::GrammarState tokens(g);
        for (size_t i = 0; i < text.size() && i < 64; ++i) {
            const int32_t id = static_cast<uint8_t>(text[i]);
            const std::string_view piece = id % 3 == 0 ? text.substr(i, 1) : std::string_view();
            const kvrun::GrammarState before = tokens;
            const bool accepts = tokens.accepts_token(id, piece);
            if (tokens.advance_token(id, piece) != accepts)
                trap("accepts_token and advance_token disagree");
            if (accepts) continue;
            if (tokens.complete() != before.complete() || tokens.finished() != before.finished())
                trap("a refused token changed the state");
            break;
        }
    } catch (const kvrun::Error&) {
        // "too ambiguous": a clear error is an allowed outcome
    }
    return 0;
}
