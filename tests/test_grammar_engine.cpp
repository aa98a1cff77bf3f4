// Grammar-constrained generation through the engine on stories260K (CPU backend): every
// output is a sentence (or, cut by n_predict, a prefix) of its grammar, greedy tokens in a
// batch equal each prompt alone, parallel samples each follow it, and with a draft model the
// greedy tokens are unchanged and sampled tokens keep the target's constrained distribution.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "common.h"
#include "engine.h"
#include "grammar.h"
#include "modes/request_json.h"
#include "spec_test_util.h"
#include "test_util.h"

using namespace kvrun;
using spec_test::Model;

namespace {

const char* kWords = R"(root ::= (" " [a-z]+){2,6} ".")";
const char* kAnswer = R"(root ::= " " ("yes" | "no") ", " [0-9]{1,3} " " [a-z]{1,6} ".")";
const char* kJsonish = R"g(
root  ::= " {\"name\": \"" [A-Za-z ]{1,12} "\", \"age\": " [1-9] [0-9]? ", \"pets\": [" list? "]}"
list  ::= pet (", " pet){0,2}
pet   ::= "\"" ("cat" | "dog" | "bird") "\""
)g";

struct Out {
    std::vector<TokenId> tokens;
    StopReason stop = StopReason::None;
};

// Runs every (prompt, request template) at once with `parallel` sequences.
std::vector<std::vector<Out>> run(Model& m, const std::vector<GenerationRequest>& reqs,
                                  int32_t parallel, Backend* draft = nullptr, int32_t k = 4) {
    EngineOptions eo;
    eo.max_parallel = parallel;
    eo.n_batch = 64;
    if (draft) {
        eo.draft = draft;
        eo.draft_min = 1;
        eo.draft_max = k;
    }
    Engine engine(*m.backend, *m.tok, eo);
    std::vector<std::vector<Out>> out(reqs.size());
    std::vector<int32_t> ids;
    for (const auto& r : reqs) {
        ids.push_back(engine.submit(r));
        out[ids.back()].resize(static_cast<size_t>(r.n_samples));
    }
    engine.on_finish([&](const GenerationResult& r) {
        out[r.request][r.sample] = {r.tokens, r.stop};
        CHECK_MESSAGE(r.stop != StopReason::Error, r.error);
    });
    engine.run();
    CHECK(engine.kv_table().n_used_blocks() == 0);
    return out;
}

// A finished output is a whole sentence; one cut by n_predict is a prefix of one.
void check_follows(std::shared_ptr<const Grammar> g, const Tokenizer& tok, const Out& o) {
    std::string text;
    for (TokenId t : o.tokens) text += tok.token_to_piece(t);
    CAPTURE(text);
    if (o.stop == StopReason::Eos) {
        CHECK(grammar_accepts(*g, text));
    } else {
        CHECK(o.stop == StopReason::Length);
        GrammarState st(g);
        CHECK(st.advance(text));
    }
}

std::vector<GenerationRequest> requests(const Tokenizer& tok, std::shared_ptr<const Grammar> g,
                                        SamplingParams sp, int32_t n_predict,
                                        int32_t n_samples = 1) {
    std::vector<GenerationRequest> reqs;
    for (const auto& p : spec_test::kPrompts) {
        GenerationRequest r;
        r.prompt = tok.encode(p, true);
        r.grammar = g;
        r.sampling = sp;
        r.n_predict = n_predict;
        r.n_samples = n_samples;
        reqs.push_back(std::move(r));
    }
    return reqs;
}

SamplingParams greedy() {
    SamplingParams p;
    p.temperature = 0.0f;
    return p;
}

}  // namespace

TEST_CASE("grammar through the engine: outputs follow it, batches equal each prompt alone") {
    auto path = test::shared_path("models/stories260K.gguf");
    if (path.empty()) return;
    Model m = spec_test::load(path, 16, 256);
    for (const std::string text : {kWords, kAnswer, kJsonish}) {
        CAPTURE(text);
        auto g = Grammar::parse(text);
        // Greedy: alone (parallel 1) and batched (parallel 4) agree token for token.
        auto reqs = requests(*m.tok, g, greedy(), 120);
        auto alone = run(m, reqs, 1);
        auto batched = run(m, reqs, 4);
        int finished = 0;
        for (size_t i = 0; i < reqs.size(); ++i) {
            CHECK(alone[i][0].tokens == batched[i][0].tokens);
            check_follows(g, *m.tok, alone[i][0]);
            finished += alone[i][0].stop == StopReason::Eos;
        }
        CHECK(finished > 0);  // these grammars end within 60 tokens for most prompts
        // The grammar changes what the model says.
        auto free_reqs = reqs;
        for (auto& r : free_reqs) r.grammar = nullptr;
        auto unconstrained = run(m, free_reqs, 4);
        bool differs = false;
        for (size_t i = 0; i < reqs.size(); ++i)
            differs |= unconstrained[i][0].tokens != alone[i][0].tokens;
        CHECK(differs);
        // Sampling, on the one-by-one top-k path and the whole-vocabulary mask path, and
        // parallel samples forked from one prompt: each follows the grammar on its own.
        for (int top_k : {40, 0}) {
            SamplingParams sp;
            sp.temperature = 1.0f;
            sp.top_k = top_k;
            sp.top_p = 1.0f;
            sp.min_p = 0.0f;
            sp.seed = 5 + static_cast<uint64_t>(top_k);
            auto sampled = run(m, requests(*m.tok, g, sp, 60, 4), 8);
            for (const auto& samples : sampled) {
                for (const Out& o : samples) check_follows(g, *m.tok, o);
                CHECK(samples[0].tokens != samples[1].tokens);
            }
        }
    }
}

TEST_CASE("grammar with speculative decoding: greedy tokens unchanged, sampling lossless") {
    auto path = test::shared_path("models/stories260K.gguf");
    if (path.empty()) return;
    Model target = spec_test::load(path, 16, 256);
    Model draft = spec_test::load(test::shared_path("models/stories260K-Q8_0.gguf"), 16, 320);
    for (const std::string text : {kWords, kJsonish}) {
        CAPTURE(text);
        auto g = Grammar::parse(text);
        auto reqs = requests(*target.tok, g, greedy(), 60);
        auto want = run(target, reqs, 4);
        for (int32_t k : {1, 4, 8}) {
            CAPTURE(k);
            auto got = run(target, reqs, 4, draft.backend.get(), k);
            for (size_t i = 0; i < reqs.size(); ++i) CHECK(got[i][0].tokens == want[i][0].tokens);
        }
    }

    // Sampled: the first two tokens over many seeds follow the target's distribution under the
    // grammar (a draft of other layers, so that rejections happen).
    Model ref = spec_test::load(path, 4, 64);
    Model target4 = spec_test::load(path, 4, 1024);
    Model l3 = spec_test::load(test::shared_path("models/stories260K-L3-F32.gguf"), 4, 1200);
    // No word may start with "w" (the unconstrained model's favourite, " wanted"/" was").
    auto g = Grammar::parse(R"(root ::= (" " [a-vx-z] [a-z]*)+)");
    const std::vector<TokenId> prompt =
        target4.tok->encode("The little dog saw a big red ball. He", true);
    SamplingParams sp = spec_test::full_softmax();
    const auto run = spec_test::first_pairs(target4, l3.backend.get(), prompt, sp, 2000,
                                            AcceptRule::Lossless, g);
    const auto& draws = run.draws;
    const auto z = spec_test::lossless_z(ref, prompt, sp, draws, true, g);
    MESSAGE("grammar + speculation: z(first) " << z.z_first << ", z(pair) " << z.z_pair
                                               << ", acceptance " << run.stats.spec.acceptance());
    CHECK(z.z_first < 3.7);
    CHECK(z.z_pair < 3.7);
    CHECK(run.stats.spec.accepted > 0);
    // Against the unconstrained distribution the same draws are far off: the test has teeth.
    const auto free = spec_test::lossless_z(ref, prompt, sp, draws, false);
    CHECK(free.z_first > 10);
}

TEST_CASE("a grammar that explodes mid-generation ends only its own request, with the reason") {
    auto path = test::shared_path("models/stories260K.gguf");
    if (path.empty()) return;
    Model m = spec_test::load(path, 16, 64);
    // After " x", 2^16 equal parses: refused as too ambiguous instead of hanging.
    std::string text = "root ::= \" x\" r0\n";
    for (int i = 0; i < 16; ++i) text += fmt::format("r{} ::= r{} | r{}\n", i, i + 1, i + 1);
    text += "r16 ::= \"y\"\n";
    auto bad = Grammar::parse(text);
    {
        GrammarState st(bad);
        CHECK_THROWS_WITH_AS(st.advance(" x"), doctest::Contains("too ambiguous"), Error);
    }
    auto reqs = requests(*m.tok, Grammar::parse(kWords), greedy(), 40);
    reqs[1].grammar = bad;
    EngineOptions eo;
    eo.max_parallel = 4;
    Engine engine(*m.backend, *m.tok, eo);
    std::vector<GenerationResult> results(reqs.size());
    engine.on_finish([&](const GenerationResult& r) { results[r.request] = r; });
    for (const auto& r : reqs) engine.submit(r);
    engine.run();
    CHECK(results[1].stop == StopReason::Error);
    CHECK(results[1].error.find("too ambiguous") != std::string::npos);
    for (size_t i : {0, 2, 3}) CHECK(results[i].stop == StopReason::Eos);
    CHECK(engine.kv_table().n_used_blocks() == 0);
}

TEST_CASE("grammar_prefix continues a reply where it left off; stop tokens end it when complete") {
    auto path = test::shared_path("models/stories260K.gguf");
    if (path.empty()) return;
    Model m = spec_test::load(path, 16, 64);
    auto g = Grammar::parse(R"(root ::= " [" [a-z]+ (", " [a-z]+)* "]")");
    auto reqs = requests(*m.tok, g, greedy(), 40);
    reqs.resize(1);
    reqs[0].ignore_eos = true;
    const auto whole = run(m, reqs, 1);
    const std::vector<TokenId>& all = whole[0][0].tokens;
    REQUIRE(all.size() == 40);
    // The same request cut after k tokens, then continued with those tokens as its prefix.
    for (size_t k : {1, 7, 20}) {
        CAPTURE(k);
        GenerationRequest r = reqs[0];
        r.prompt.insert(r.prompt.end(), all.begin(), all.begin() + long(k));
        r.grammar_prefix.assign(all.begin(), all.begin() + long(k));
        r.n_predict = 40 - int32_t(k);
        const auto rest = run(m, {r}, 1);
        CHECK(rest[0][0].tokens == std::vector<TokenId>(all.begin() + long(k), all.end()));
        // Without the prefix the grammar starts over (" [" again): another continuation.
        r.grammar_prefix.clear();
        CHECK(run(m, {r}, 1)[0][0].tokens != rest[0][0].tokens);
    }
    // A prefix the grammar refuses is refused at submit.
    {
        EngineOptions eo;
        Engine engine(*m.backend, *m.tok, eo);
        GenerationRequest r = reqs[0];
        r.grammar_prefix = {m.tok->find_token(".")};
        CHECK_THROWS_WITH_AS(engine.submit(r), doctest::Contains("does not continue the grammar"),
                             Error);
    }

    // A stop token (here ".") is allowed as the end once the text is complete, and only then.
    const TokenId dot = m.tok->find_token(".");
    auto words = Grammar::parse(R"(root ::= (" " [a-z]+){3,})");
    auto sreqs = requests(*m.tok, words, greedy(), 60);
    for (auto& r : sreqs) r.stop_tokens = {dot};
    const auto ended = run(m, sreqs, 4);
    int early = 0;
    for (size_t i = 0; i < sreqs.size(); ++i) {
        CAPTURE(i);
        const Out& o = ended[i][0];
        std::string text;
        for (TokenId t : o.tokens) text += m.tok->token_to_piece(t);
        CAPTURE(text);
        GrammarState st(words);
        CHECK(st.advance(text));
        if (o.stop == StopReason::Eos) {
            CHECK(st.complete());
            ++early;
        }
    }
    CHECK(early >= 2);  // the story model ends its sentences soon after three words
}

TEST_CASE("lazy grammar: free text until a trigger, the grammar from there; with a draft too") {
    auto path = test::shared_path("models/stories260K.gguf");
    if (path.empty()) return;
    Model m = spec_test::load(path, 16, 64);
    // Unconstrained, "Once upon a time" goes on ", there was a little girl named Lily...".
    GenerationRequest free;
    free.prompt = m.tok->encode("Once upon a time", true);
    free.sampling = greedy();
    free.n_predict = 30;
    const auto plain = run(m, {free}, 1)[0][0];
    std::string plain_text;
    for (TokenId t : plain.tokens) plain_text += m.tok->token_to_piece(t);
    const size_t at = plain_text.find(" girl");
    REQUIRE(at != std::string::npos);

    // From " girl" on, the text must be " girl" and then numbers (which the story model would
    // never write there).
    auto g = Grammar::parse(R"(root ::= " girl" (" " [0-9]{1,3}){2,4} ".")");
    GenerationRequest lazy = free;
    lazy.grammar = g;
    lazy.grammar_triggers.words = {" girl"};
    for (Backend* draft : {static_cast<Backend*>(nullptr), m.backend.get()}) {
        CAPTURE(draft != nullptr);
        const auto out = run(m, {lazy}, 1, draft, 4)[0][0];
        std::string text;
        for (TokenId t : out.tokens) text += m.tok->token_to_piece(t);
        CAPTURE(text);
        // Before the trigger: exactly the free text; from it: a sentence of the grammar, which
        // then ends the generation.
        REQUIRE(text.size() > at);
        CHECK(text.substr(0, at) == plain_text.substr(0, at));
        CHECK(grammar_accepts(*g, text.substr(at)));
        CHECK(out.stop == StopReason::Eos);
    }
    // A trigger that never shows leaves the output free.
    lazy.grammar_triggers.words = {"zebra"};
    CHECK(run(m, {lazy}, 1)[0][0].tokens == plain.tokens);
    // A pattern trigger: the grammar starts at its capture group.
    lazy.grammar_triggers.words.clear();
    lazy.grammar_triggers.patterns = {"little( girl)"};
    const auto by_pattern = run(m, {lazy}, 1)[0][0];
    std::string text;
    for (TokenId t : by_pattern.tokens) text += m.tok->token_to_piece(t);
    CHECK(text.substr(0, at) == plain_text.substr(0, at));
    CHECK(grammar_accepts(*g, text.substr(at)));
}

TEST_CASE("lazy grammar from a JSON request: llama.cpp's grammar_lazy and grammar_triggers") {
    auto path = test::shared_path("models/stories260K.gguf");
    if (path.empty()) return;
    GgufFile file = GgufFile::open(path.string());
    auto tok = Tokenizer::from_gguf(file);
    RequestDefaults d;
    auto parse = [&](const std::string& fields) {
        return request_from_json(R"({"prompt": "Hi", )" + fields + "}", d, *tok).request;
    };
    const GenerationRequest r =
        parse(R"("grammar": "root ::= [0-9]+", "grammar_lazy": true, "grammar_triggers": [)"
              R"({"type": "word", "value": "<x>"}, {"type": 1, "value": "y"}, {"word": "z"},)"
              R"x({"type": "pattern", "value": "a(b)"}, {"type": 3, "value": "c.*"},)x"
              R"({"type": "token", "value": "</s>"}, {"type": 0, "token": 5}])");
    CHECK(r.grammar_triggers.words == std::vector<std::string>{"<x>", "y", "z"});
    CHECK(r.grammar_triggers.patterns == std::vector<std::string>{"a(b)"});
    CHECK(r.grammar_triggers.patterns_full == std::vector<std::string>{"c.*"});
    CHECK(r.grammar_triggers.tokens == std::vector<TokenId>{tok->eos(), 5});
    CHECK(parse(R"("grammar": "root ::= [0-9]+")").grammar_triggers.empty());
    // Each misuse gets its reason.
    const std::vector<std::pair<std::string, std::string>> bad = {
        {R"("grammar_lazy": true, "grammar_triggers": [{"word": "a"}])", "needs a 'grammar'"},
        {R"("grammar": "root ::= [0-9]+", "grammar_lazy": true)", "needs 'grammar_triggers'"},
        {R"("grammar": "root ::= [0-9]+", "grammar_triggers": [{"word": "a"}])",
         "need \"grammar_lazy\": true"},
        {R"("grammar": "root ::= [0-9]+", "grammar_lazy": 1, "grammar_triggers": [])",
         "must be true or false"},
        {R"("grammar": "root ::= [0-9]+", "grammar_lazy": true, "grammar_triggers": [{"type": 7}])",
         "'grammar_triggers'[0] must be"},
        {R"("grammar": "root ::= [0-9]+", "grammar_lazy": true,
            "grammar_triggers": [{"type": "token", "value": "hello there"}])",
         "is not one token"},
        {R"("grammar": "root ::= [0-9]+", "grammar_lazy": true,
            "grammar_triggers": [{"type": "token", "token": 99999}])",
         "outside the vocabulary"},
        {R"("grammar": "root ::= [0-9]+", "grammar_lazy": true,
            "grammar_triggers": [{"type": "pattern", "value": "(a"}])",
         "not a valid regex"},
    };
    for (const auto& [fields, reason] : bad) {
        CAPTURE(fields);
        CHECK_THROWS_WITH_AS(parse(fields), doctest::Contains(reason.c_str()), Error);
    }
}

TEST_CASE("grammar tokens through the engine: a control token inside the reply, by its text") {
    auto path = test::shared_path("models/stories260K.gguf");
    if (path.empty()) return;
    Model m = spec_test::load(path, 16, 256);
    const TokenId bos = m.tok->bos();
    const TokenId dot = m.tok->find_token(".");
    REQUIRE(dot >= 0);
    // Two words, the control token <s> (no text: only the token element reaches it), any
    // 2-5 tokens but "." and then ".": the same greedy tokens alone, batched, with a draft.
    auto g = Grammar::parse(R"(root ::= (" " [a-z]{1,4}){2} <s> (!<[)" + std::to_string(dot) +
                            R"(]>){2,5} ".")");
    auto reqs = requests(*m.tok, g, greedy(), 40);
    auto alone = run(m, reqs, 1);
    auto batched = run(m, reqs, 4);
    auto drafted = run(m, reqs, 4, m.backend.get(), 3);
    for (size_t i = 0; i < reqs.size(); ++i) {
        const Out& o = alone[i][0];
        CAPTURE(i);
        std::string shown;
        for (TokenId t : o.tokens) shown += fmt::format("{}:{} ", t, m.tok->token_to_piece(t));
        CAPTURE(shown);
        CHECK(o.tokens == batched[i][0].tokens);
        CHECK(o.tokens == drafted[i][0].tokens);
        CHECK(o.stop == StopReason::Eos);
        const auto at = std::find(o.tokens.begin(), o.tokens.end(), bos);
        REQUIRE(at != o.tokens.end());
        std::string words;
        for (auto t = o.tokens.begin(); t != at; ++t) words += m.tok->token_to_piece(*t);
        CHECK(grammar_accepts(*Grammar::parse(R"(root ::= (" " [a-z]{1,4}){2})"), words));
        const auto rest = std::distance(at, o.tokens.end()) - 1;
        CHECK(rest >= 3);
        CHECK(rest <= 6);
        CHECK(o.tokens.back() == dot);
        CHECK(std::count(at + 1, o.tokens.end(), dot) == 1);
    }
    // A token the vocabulary lacks: the request is refused with its name.
    GenerationRequest r = reqs[0];
    r.grammar = Grammar::parse("root ::= <|im_end|>");
    Engine engine(*m.backend, *m.tok, EngineOptions{});
    CHECK_THROWS_WITH_AS(engine.submit(r), doctest::Contains("no token `<|im_end|>`"), Error);
}
