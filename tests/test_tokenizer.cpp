// Tokenizer tests: llama.cpp's vocabulary suites (../shared/vocab/*.inp/.out, every line
// exact), round trips, reference prompt tokens of every shared model, StreamDecoder UTF-8
// safety, and small synthetic vocabularies for merge rules and bad metadata.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "gguf.h"
#include "gguf_writer.h"
#include "pretokenizer.h"
#include "test_util.h"
#include "tokenizer.h"
#include "unicode_text.h"

using namespace kvrun;
namespace fs = std::filesystem;

namespace {

std::string read_text(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    REQUIRE_MESSAGE(in.good(), "cannot read " << p);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// .inp: every case is followed by "\n__ggml_vocab_test__\n" (cases may be empty or hold
// newlines themselves).
std::vector<std::string> split_cases(const std::string& inp) {
    static const std::string sep = "\n__ggml_vocab_test__\n";
    std::vector<std::string> cases;
    size_t pos = 0;
    while (pos < inp.size()) {
        const size_t at = inp.find(sep, pos);
        if (at == std::string::npos) break;
        cases.push_back(inp.substr(pos, at - pos));
        pos = at + sep.size();
    }
    return cases;
}

std::vector<std::vector<TokenId>> parse_out(const std::string& out) {
    std::vector<std::vector<TokenId>> lines;
    std::istringstream in(out);
    std::string line;
    while (std::getline(in, line)) {
        std::istringstream ls(line);
        std::vector<TokenId> ids;
        long long v;
        while (ls >> v) ids.push_back(static_cast<TokenId>(v));
        lines.push_back(std::move(ids));
    }
    return lines;
}

std::string show_ids(const std::vector<TokenId>& ids) {
    std::string s;
    for (TokenId id : ids) {
        s += ' ';
        s += std::to_string(id);
    }
    return s;
}

std::string escaped(const std::string& s) {
    std::string o = "'";
    for (char c : s) {
        if (c == '\n')
            o += "\\n";
        else if (c == '\t')
            o += "\\t";
        else
            o += c;
    }
    o += '\'';
    return o;
}

std::unique_ptr<Tokenizer> load(const fs::path& p) {
    GgufFile f = GgufFile::open(p.string());
    return Tokenizer::from_gguf(f);
}

}  // namespace

TEST_CASE("llama.cpp vocabulary suites reproduce every .out line") {
    const fs::path dir = test::shared_path("vocab");
    if (dir.empty()) return;
    const std::vector<std::string> required = {"llama-spm", "phi-3",        "gpt-2",
                                               "falcon",    "deepseek-llm", "deepseek-coder",
                                               "starcoder", "refact",       "mpt"};
    int suites = 0;
    for (const std::string& name : required) {
        const fs::path gguf = dir / ("ggml-vocab-" + name + ".gguf");
        const fs::path inp = gguf.string() + ".inp", out = gguf.string() + ".out";
        REQUIRE_MESSAGE(fs::exists(gguf), "missing " << gguf);
        REQUIRE(fs::exists(inp));
        REQUIRE(fs::exists(out));
        auto tok = load(gguf);
        const auto cases = split_cases(read_text(inp));
        const auto expected = parse_out(read_text(out));
        REQUIRE_MESSAGE(cases.size() == expected.size(), name << ": " << cases.size()
                                                              << " cases vs " << expected.size()
                                                              << " .out lines");
        int mismatches = 0, roundtrip_failures = 0;
        for (size_t i = 0; i < cases.size(); ++i) {
            const std::vector<TokenId> got = tok->encode(cases[i], false, false);
            if (got != expected[i]) {
                ++mismatches;
                MESSAGE(name << " case " << i << " " << escaped(cases[i]) << "\n  expected"
                             << show_ids(expected[i]) << "\n  got     " << show_ids(got));
            }
            // Byte-level BPE and SPM (minus its added leading space) give the text back.
            const std::string back = tok->decode(got);
            if (back != cases[i]) {
                ++roundtrip_failures;
                MESSAGE(name << " round trip of case " << i << " " << escaped(cases[i]) << " gave "
                             << escaped(back));
            }
        }
        CHECK_MESSAGE(mismatches == 0, name << ": " << mismatches << " mismatching cases");
        CHECK_MESSAGE(roundtrip_failures == 0,
                      name << ": " << roundtrip_failures << " round-trip failures");
        ++suites;
    }
    CHECK(suites == static_cast<int>(required.size()));
    MESSAGE(
        "bert-bge (WordPiece) is not supported and is skipped; llama-bpe, qwen2, command-r,"
        " chameleon, deepseek-r1-qwen and roberta-bpe have no vocabulary file to test");
}

TEST_CASE("an unsupported tokenizer model is a clear error") {
    const fs::path bert = test::shared_path("vocab/ggml-vocab-bert-bge.gguf");
    if (bert.empty()) return;
    GgufFile f = GgufFile::open(bert.string());
    CHECK_THROWS_AS(Tokenizer::from_gguf(f), Error);
}

TEST_CASE("special-token rules: user-defined always, promoted FIM tokens, Phi-3 strip") {
    const fs::path vocab = test::shared_path("vocab");
    if (vocab.empty()) return;
    auto ds = load(vocab / "ggml-vocab-deepseek-coder.gguf");
    CHECK(ds->eos() == 32014);
    CHECK(ds->eot() == 32014);
    CHECK(ds->is_eog(32014));
    CHECK(ds->token_type(32021) == kTokenUserDefined);  // "<|EOT|>"
    CHECK(ds->encode("a<|EOT|>", false, false) == std::vector<TokenId>{64, 32021});
    CHECK(ds->is_control(32016));  // "<｜fim▁begin｜>" is user-defined in the file
    CHECK(ds->encode("<|EOT|>", true) == std::vector<TokenId>{32013, 32021});
    auto phi = load(vocab / "ggml-vocab-phi-3.gguf");
    CHECK(phi->is_eog(32007));  // <|end|>
    CHECK(phi->is_eog(32000));  // <|endoftext|>
    const auto spaced = phi->encode("<|user|>  hi", false, true);
    CHECK(spaced.front() == 32010);
    CHECK(spaced == phi->encode("<|user|>hi", false, true));
}

TEST_CASE("stories260K: Once upon a time") {
    const fs::path p = test::shared_path("models/stories260K.gguf");
    if (p.empty()) return;
    auto tok = load(p);
    CHECK(tok->model_name() == "llama");
    CHECK(tok->n_vocab() == 512);
    CHECK(tok->bos() == 1);
    CHECK(tok->eos() == 2);
    CHECK(tok->add_bos());
    CHECK(tok->is_eog(2));
    CHECK_FALSE(tok->is_eog(1));
    CHECK(tok->is_control(1));
    const auto ids = tok->encode("Once upon a time", true);
    CHECK(ids == std::vector<TokenId>{1, 403, 407, 261, 378});
    CHECK(tok->decode(ids) == "Once upon a time");
    CHECK(tok->token_to_piece(1).empty());
    CHECK(tok->token_to_piece(1, true) == "<s>");
    CHECK(tok->encode("<s>hi", false, true).front() == 1);
    CHECK(tok->encode("<s>hi", false, false).front() != 1);
    CHECK_THROWS_AS(tok->token_to_piece(512), Error);
    CHECK_THROWS_AS(tok->token_to_piece(-1), Error);
}

TEST_CASE("reference prompt tokens of every shared model (with BOS)") {
    const fs::path ref = test::shared_path("reference");
    if (ref.empty()) return;
    std::vector<std::string> prompts;
    {
        std::istringstream in(read_text(ref / "prompts.txt"));
        std::string line;
        while (std::getline(in, line)) {
            std::string p;
            for (size_t i = 0; i < line.size(); ++i) {
                if (line[i] == '\\' && i + 1 < line.size() && line[i + 1] == 'n') {
                    p += '\n';
                    ++i;
                } else {
                    p += line[i];
                }
            }
            prompts.push_back(p);
        }
    }
    REQUIRE(!prompts.empty());
    int checked = 0, files = 0;
    bool saw_big_vocab = false;
    for (const auto& e : fs::directory_iterator(ref / "logits")) {
        if (e.path().extension() != ".jsonl") continue;
        const fs::path model = ref / ".." / "models" / (e.path().stem().string() + ".gguf");
        REQUIRE_MESSAGE(fs::exists(model), "no model for " << e.path());
        auto tok = load(model);
        if (tok->n_vocab() == 32000) saw_big_vocab = true;
        std::istringstream in(read_text(e.path()));
        std::string line;
        size_t index = 0;
        while (std::getline(in, line)) {
            if (line.empty()) continue;
            // Only the head of the line matters (generated text may not be valid UTF-8).
            const size_t cut = line.find(",\"positions\"");
            const auto j =
                nlohmann::json::parse(cut == std::string::npos ? line : line.substr(0, cut) + "}");
            const std::string prompt = j.at("prompt").get<std::string>();
            const auto expected = j.at("tokens").get<std::vector<TokenId>>();
            REQUIRE(index < prompts.size());
            CHECK(prompt == prompts[index]);
            const auto got = tok->encode(prompts[index], tok->add_bos());
            CHECK_MESSAGE(got == expected, e.path().filename()
                                               << " prompt " << escaped(prompt) << " expected"
                                               << show_ids(expected) << " got" << show_ids(got));
            ++index, ++checked;
        }
        ++files;
    }
    CHECK(files >= 40);
    CHECK(checked >= files);
    CHECK(saw_big_vocab);  // llama-2-tiny-random: the 32000-token Llama-2 vocabulary
}

namespace {

// Feeds `ids` one at a time; every chunk must be valid UTF-8; returns their concatenation.
std::string stream_all(const Tokenizer& tok, const std::vector<TokenId>& ids) {
    StreamDecoder sd(tok);
    std::string all;
    for (TokenId id : ids) {
        const std::string chunk = sd.push(id);
        CHECK_MESSAGE(utf8_is_valid(chunk), "invalid UTF-8 chunk after token " << id);
        all += chunk;
    }
    const std::string rest = sd.flush();
    CHECK(utf8_is_valid(rest));
    return all + rest;
}

}  // namespace

TEST_CASE("StreamDecoder emits whole UTF-8 characters") {
    const fs::path vocab = test::shared_path("vocab");
    if (vocab.empty()) return;
    const std::string text =
        "Hello \xF0\x9F\xA6\x99 llama, \xE4\xBD\xA0\xE5\xA5\xBD\xE4\xB8\x96\xE7\x95\x8C "
        "\xF0\x9D\x92\x9C \xC3\xA9t\xC3\xA9 \xE1\xBC\x80 \xF0\x9F\x98\x80\xF0\x9F\x8C\x8D!";
    for (const char* name : {"llama-spm", "gpt-2", "deepseek-llm", "phi-3"}) {
        CAPTURE(name);
        auto tok = load(vocab / (std::string("ggml-vocab-") + name + ".gguf"));
        const auto ids = tok->encode(text, true);
        // Split characters must really occur (byte fallback / byte-level pieces).
        int partial = 0;
        for (TokenId id : ids) partial += !utf8_is_valid(tok->token_to_piece(id));
        CHECK(partial > 0);
        const std::string streamed = stream_all(*tok, ids);
        CHECK(streamed == tok->decode(ids));
        CHECK(streamed == text);
        // A stream that does not start at BOS keeps every space.
        const auto no_bos = tok->encode(text, false);
        CHECK(stream_all(*tok, no_bos) == tok->decode(no_bos, false));
    }
    // Malformed output (a stray continuation byte, an unfinished sequence) becomes U+FFFD.
    auto spm = load(vocab / "ggml-vocab-llama-spm.gguf");
    const TokenId b80 = spm->find_token("<0x80>"), be4 = spm->find_token("<0xE4>");
    const TokenId a = spm->find_token("a");
    REQUIRE(b80 >= 0);
    REQUIRE(be4 >= 0);
    REQUIRE(a >= 0);
    StreamDecoder sd(*spm);
    CHECK(sd.push(a) == "a");
    CHECK(sd.push(b80) == "\xEF\xBF\xBD");
    CHECK(sd.push(be4).empty());  // could still complete
    CHECK(sd.flush() == "\xEF\xBF\xBD");
}

// ---- synthetic vocabularies (no ../shared needed) ----

namespace {

struct VocabSpec {
    std::string model = "llama", pre;
    std::vector<std::string> tokens;
    std::vector<float> scores;
    std::vector<int32_t> types;
    std::vector<std::string> merges;
};

std::unique_ptr<Tokenizer> make(const VocabSpec& v) {
    GgufWriter w;
    w.set_string("tokenizer.ggml.model", v.model);
    if (!v.pre.empty()) w.set_string("tokenizer.ggml.pre", v.pre);
    w.set_array_str("tokenizer.ggml.tokens", v.tokens);
    if (!v.scores.empty()) w.set_array_f32("tokenizer.ggml.scores", v.scores);
    if (!v.types.empty()) w.set_array_i32("tokenizer.ggml.token_type", v.types);
    if (!v.merges.empty()) w.set_array_str("tokenizer.ggml.merges", v.merges);
    const auto bytes = w.to_bytes();
    GgufFile f = GgufFile::from_memory(bytes.data(), bytes.size());
    return Tokenizer::from_gguf(f);
}

const std::string kMark = "\xE2\x96\x81";  // ▁

// <unk> <s> </s>, 256 byte tokens, then pieces with scores.
VocabSpec small_spm(const std::vector<std::pair<std::string, float>>& pieces) {
    VocabSpec v;
    v.tokens = {"<unk>", "<s>", "</s>"};
    v.scores = {0, 0, 0};
    v.types = {2, 3, 3};
    for (int b = 0; b < 256; ++b) {
        v.tokens.push_back(fmt::format("<0x{:02X}>", b));
        v.scores.push_back(0);
        v.types.push_back(6);
    }
    for (const auto& [t, s] : pieces) {
        v.tokens.push_back(t);
        v.scores.push_back(s);
        v.types.push_back(1);
    }
    return v;
}

}  // namespace

TEST_CASE("SPM merges by score, leftmost first, with byte fallback") {
    // ids: 259 ▁, 260 a, 261 b, 262 ▁a, 263 ab, 264 ▁ab
    auto v = small_spm(
        {{kMark, -1}, {"a", -2}, {"b", -3}, {kMark + "a", -5}, {"ab", -4}, {kMark + "ab", -6}});
    auto tok = make(v);
    // "▁ab": "ab" (-4) beats "▁a" (-5); then "▁"+"ab" -> "▁ab".
    CHECK(tok->encode("ab", false) == std::vector<TokenId>{264});
    // Equal scores: the leftmost pair merges first.
    auto tie = make(small_spm({{kMark, -1}, {"a", -2}, {kMark + "a", -3}, {"aa", -3}}));
    // "▁aa": pairs "▁a" (left 0) and "aa" (left 1) tie -> "▁a" + "a".
    CHECK(tie->encode("aa", false) == std::vector<TokenId>{261, 260});
    // Characters outside the vocabulary become their UTF-8 bytes.
    CHECK(tok->encode("a\xC3\xA9", false) == std::vector<TokenId>{262, 3 + 0xC3, 3 + 0xA9});
    CHECK(tok->decode(tok->encode("a\xC3\xA9 b", true)) == "a\xC3\xA9 b");
    CHECK(tok->encode("", true) == std::vector<TokenId>{1});
    CHECK(tok->encode("", false).empty());
}

TEST_CASE("bad tokenizer metadata is an Error") {
    auto v = small_spm({{"a", -1}});
    v.scores.pop_back();
    CHECK_THROWS_AS(make(v), Error);
    v = small_spm({{"a", -1}});
    v.types.push_back(1);
    CHECK_THROWS_AS(make(v), Error);
    v = small_spm({{"a", -1}});
    v.model = "t5";
    CHECK_THROWS_AS(make(v), Error);
    v = small_spm({{"a", -1}});
    v.model = "gpt2";  // BPE needs merges
    CHECK_THROWS_AS(make(v), Error);
    v.merges = {"a b"};
    v.pre = "no-such-pre-tokenizer";
    CHECK_THROWS_AS(make(v), Error);
    v.tokens.clear();
    v.scores.clear();
    v.types.clear();
    v.pre.clear();
    CHECK_THROWS_AS(make(v), Error);
}

TEST_CASE("byte-level BPE: merge ranks and special tokens") {
    VocabSpec v;
    v.model = "gpt2";
    v.pre = "gpt-2";
    // Byte stand-ins for a few bytes ("Ġ" is the space), merged pieces, specials.
    v.tokens = {"h",  "e",    "l",     "o",         "\xC4\xA0",      "he",
                "ll", "hell", "hello", "\xC4\xA0h", "<|endoftext|>", "<tag>"};
    v.types = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3, 4};
    v.merges = {"l l", "h e", "he ll", "hell o", "\xC4\xA0 h"};
    auto tok = make(v);
    CHECK(tok->encode("hello", false) == std::vector<TokenId>{8});
    CHECK(tok->encode("hell", false) == std::vector<TokenId>{7});
    // " hel": pre-token " hel"; "Ġ h" (rank 4) loses to "h e" (rank 1), then nothing joins Ġ.
    CHECK(tok->encode(" hel", false) == std::vector<TokenId>{4, 5, 2});
    // User-defined tokens are always split out; control ones only with parse_special.
    CHECK(tok->encode("he<tag>ll", false) == std::vector<TokenId>{5, 11, 6});
    CHECK(tok->encode("<|endoftext|>", false, true) == std::vector<TokenId>{10});
    CHECK(tok->encode("<|endoftext|>", false, false) != std::vector<TokenId>{10});
    CHECK(tok->is_eog(10));
    CHECK(tok->eot() == 10);
    CHECK(tok->decode(tok->encode("hello hell", false)) == "hello hell");
    CHECK(tok->token_to_piece(4) == " ");
    CHECK(tok->token_to_piece(10).empty());
    CHECK(tok->token_to_piece(10, true) == "<|endoftext|>");
}

TEST_CASE("pre-tokenizer regexes split like llama.cpp") {
    using Words = std::vector<std::string>;
    RegexSplitter llama3(pretokenizer_spec("llama-bpe").regexes);
    CHECK(llama3.split("Hello world") == Words{"Hello", " world"});
    CHECK(llama3.split("  Hello") == Words{" ", " Hello"});
    CHECK(llama3.split("1234567") == Words{"123", "456", "7"});
    CHECK(llama3.split("I'M here") == Words{"I", "'M", " here"});
    CHECK(llama3.split("a\n\nb") == Words{"a", "\n\n", "b"});
    CHECK(llama3.split("3.14!") == Words{"3", ".", "14", "!"});
    CHECK(llama3.split("").empty());
    RegexSplitter qwen2(pretokenizer_spec("qwen2").regexes);
    CHECK(qwen2.split("x 123") == Words{"x", " ", "1", "2", "3"});
    CHECK(qwen2.split("x!\n\ny 12") == Words{"x", "!\n\n", "y", " ", "1", "2"});
    // Seed-Coder / Seed-OSS: Qwen2's, except that line breaks after punctuation split off.
    RegexSplitter seed(pretokenizer_spec("seed-coder").regexes);
    CHECK(seed.split("x!\n\ny 12") == Words{"x", "!", "\n\n", "y", " ", "1", "2"});
    CHECK(seed.split("It's ok.") == Words{"It", "'s", " ok", "."});
    RegexSplitter gpt2(pretokenizer_spec("gpt-2").regexes);
    // U+180E is not White_Space (PCRE2's own \s would say it is).
    CHECK(gpt2.split("a\xE1\xA0\x8E\xE1\xA0\x8E"
                     "b") == Words{"a", "\xE1\xA0\x8E\xE1\xA0\x8E", "b"});
    // No-break space and NEL are.
    CHECK(gpt2.split("a\xC2\x85\xC2\x85"
                     "b") == Words{"a", "\xC2\x85", "\xC2\x85", "b"});
    // Malformed UTF-8 is decoded leniently: a stray byte becomes U+FFFD.
    CHECK(gpt2.split("a\xFF") == Words{"a", "\xEF\xBF\xBD"});
    // GPT-4o (o200k, Phi-4-mini): cased words keep their contraction, digits in threes, a
    // run of capitals joins the word it starts.
    RegexSplitter gpt4o(pretokenizer_spec("gpt-4o").regexes);
    CHECK(gpt4o.split("Hello World's 12345 HTTPServer\n\n  x") ==
          Words{"Hello", " World's", " ", "123", "45", " HTTPServer", "\n\n", " ", " x"});
    CHECK(gpt4o.split("I'M fine/ok\n") == Words{"I'M", " fine", "/ok", "\n"});
    RegexSplitter falcon(pretokenizer_spec("falcon").regexes);
    CHECK(falcon.split("x=12345") == Words{"x", "=", "123", "45"});
    // GLM 4.5's "glm4" splits as ChatGLM 4's (Llama 3's rule) and adds no BOS.
    CHECK(pretokenizer_spec("glm4").regexes == pretokenizer_spec("llama3").regexes);
    CHECK(pretokenizer_spec("glm4").no_bos);
}

TEST_CASE("UTF-8 helpers") {
    CHECK(utf8_decode_lenient("a\xC3\xA9\xE2\x82") ==
          std::vector<uint32_t>{'a', 0xE9, kReplacementChar, kReplacementChar});
    CHECK(utf8_is_valid("\xF0\x9F\xA6\x99"));
    CHECK_FALSE(utf8_is_valid("\xC0\x80"));      // overlong
    CHECK_FALSE(utf8_is_valid("\xED\xA0\x80"));  // surrogate
    std::string pending = "ab\xF0\x9F\xA6";
    CHECK(utf8_take_complete(pending, false) == "ab");
    CHECK(pending == "\xF0\x9F\xA6");
    pending += "\x99";
    CHECK(utf8_take_complete(pending, false) == "\xF0\x9F\xA6\x99");
    CHECK(pending.empty());
    pending = "\xE4\xBD";
    CHECK(utf8_take_complete(pending, true) == "\xEF\xBF\xBD");
    pending = "\x80x";
    CHECK(utf8_take_complete(pending, false) == "\xEF\xBF\xBDx");
}
