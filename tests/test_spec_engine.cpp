// Speculative decoding inside the engine (continuous batching with a draft model, CPU backend,
// stories260K): greedy batches give exactly the target's tokens for --parallel 1 and 4 and
// K = 1, 4, 8 (Q8_0 and L4 drafts), also with a pool so small that sequences are preempted;
// sampled batches are lossless (chi-square against the target's exact distributions, which a
// deliberately broken rule fails); both KV tables hold exactly the accepted tokens after every
// step and are empty at the end; sessions (chat turns) give the same tokens with a draft;
// n_samples > 1 speculate on their own.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "chat_session.h"
#include "common.h"
#include "engine.h"
#include "reasoning.h"
#include "spec_test_util.h"
#include "test_util.h"

using namespace kvrun;
using spec_test::load;
using spec_test::Model;

namespace {

// 12 prompts of 5 to ~90 tokens (long ones are prefilled in several chunks of -b 32).
std::vector<std::vector<TokenId>> prompts_for(const Tokenizer& tok) {
    const char* more[] = {
        " The sun was shining and the sky was blue.", " She had a red hat and a green bag.",
        " Mom said they could play until dinner.", " A small cat sat under the old tree."};
    std::vector<std::vector<TokenId>> out;
    for (int i = 0; i < 12; ++i) {
        std::string text = spec_test::kPrompts[i % 4];
        for (int k = 0; k < i / 3; ++k) text += more[(i + k) % 4];
        out.push_back(tok.encode(text, true));
    }
    return out;
}

int32_t n_predict_for(size_t i) {
    return 10 + static_cast<int32_t>(i * 13 % 50);
}

struct Run {
    std::vector<std::vector<TokenId>> tokens;  // [prompt] generated tokens
    std::vector<GenerationResult> results;     // [prompt]
    EngineStats stats;
};

// Submits every prompt (greedy unless `sampling` is given) and runs the engine to the end.
Run run_all(Model& target, const std::vector<std::vector<TokenId>>& prompts, EngineOptions eo,
            const std::vector<int32_t>& n_predict, bool check_empty = true,
            const ReasoningBudget& budget = {}) {
    Engine engine(*target.backend, *target.tok, eo);
    Run out;
    out.tokens.resize(prompts.size());
    out.results.resize(prompts.size());
    std::map<int32_t, size_t> index;
    for (size_t i = 0; i < prompts.size(); ++i) {
        GenerationRequest r;
        r.prompt = prompts[i];
        r.n_predict = n_predict[i];
        r.sampling.temperature = 0;
        r.ignore_eos = true;
        r.reasoning_budget = budget;
        index[engine.submit(r)] = i;
    }
    engine.on_finish([&](const GenerationResult& r) {
        REQUIRE_MESSAGE(r.stop != StopReason::Error, r.error);
        out.tokens[index.at(r.request)] = r.tokens;
        out.results[index.at(r.request)] = r;
    });
    engine.run();
    out.stats = engine.stats();
    if (check_empty) {
        CHECK(engine.kv_table().n_used_blocks() == 0);
        if (engine.draft_kv_table()) CHECK(engine.draft_kv_table()->n_used_blocks() == 0);
    }
    return out;
}

EngineOptions spec_options(Model* draft, int32_t parallel, int32_t k_min, int32_t k_max) {
    EngineOptions eo;
    eo.max_parallel = parallel;
    eo.n_batch = 32;
    if (draft) {
        eo.draft = draft->backend.get();
        eo.draft_min = k_min;
        eo.draft_max = k_max;
    }
    return eo;
}

int32_t blocks_for(int32_t n_tokens, int32_t bs) {
    return (n_tokens + bs - 1) / bs;
}

}  // namespace

TEST_CASE("greedy batches with a draft give exactly the target's tokens (parallel 1/4, K 1/4/8)") {
    auto tpath = test::shared_path("models/stories260K.gguf");
    if (tpath.empty()) return;
    Model target = load(tpath, 16, 256);
    auto prompts = prompts_for(*target.tok);
    std::vector<int32_t> n_pred;
    for (size_t i = 0; i < prompts.size(); ++i) n_pred.push_back(n_predict_for(i));
    const Run want = run_all(target, prompts, spec_options(nullptr, 4, 1, 1), n_pred);
    for (size_t i = 0; i < prompts.size(); ++i) REQUIRE(want.tokens[i].size() == size_t(n_pred[i]));

    for (const std::string name : {"stories260K-Q8_0.gguf", "stories260K-L4-F32.gguf"}) {
        Model draft = load(test::shared_path("models/" + name), 16, 256 + 64);
        for (int32_t parallel : {1, 4}) {
            for (int32_t k : {1, 4, 8, 0}) {  // 0: adaptive K up to 8
                CAPTURE(name);
                CAPTURE(parallel);
                CAPTURE(k);
                const Run got = run_all(
                    target, prompts, spec_options(&draft, parallel, k ? k : 1, k ? k : 8), n_pred);
                for (size_t i = 0; i < prompts.size(); ++i)
                    CHECK_MESSAGE(got.tokens[i] == want.tokens[i], "prompt " << i);
                const SpeculativeStats& s = got.stats.spec;
                CHECK(s.drafted > 0);
                CHECK(s.accepted <= s.drafted);
                CHECK(got.stats.peak_running == parallel);
                // Each result's counters add up to the engine's; every round output its
                // accepted drafts plus the target's token.
                int64_t drafted = 0, accepted = 0, rounds = 0, passes = 0, passes_alone = 0;
                for (const GenerationResult& r : want.results) passes_alone += r.n_target_passes;
                for (const GenerationResult& r : got.results) {
                    passes += r.n_target_passes;
                    drafted += r.n_drafted;
                    accepted += r.n_accepted;
                    rounds += r.n_spec_rounds;
                    CHECK(r.n_accepted + r.n_spec_rounds <= int32_t(r.tokens.size()));
                    if (k > 0) CHECK(r.n_drafted <= k * r.n_spec_rounds);
                }
                CHECK(drafted == s.drafted);
                CHECK(accepted == s.accepted);
                CHECK(rounds == s.rounds);
                // Each sequence took part in fewer target passes than without speculation (one
                // per token): a quarter as many with the Q8_0 draft.
                CHECK(passes < passes_alone);
                if (name == "stories260K-Q8_0.gguf" && k >= 4) CHECK(4 * passes < passes_alone);
                if (parallel == 4 && k == 8)
                    MESSAGE(name << ", parallel 4, K 8: drafted " << s.drafted << ", accepted "
                                 << s.accepted << " (" << 100 * s.acceptance()
                                 << "%), mean accepted length " << s.mean_accepted()
                                 << ", passes per sequence " << passes << " (alone " << passes_alone
                                 << ")");
            }
        }
    }
}

TEST_CASE("a pool too small for the batch preempts speculating sequences; tokens unchanged") {
    auto tpath = test::shared_path("models/stories260K.gguf");
    if (tpath.empty()) return;
    Model big = load(tpath, 16, 256);
    auto prompts = prompts_for(*big.tok);
    std::vector<int32_t> n_pred;
    for (size_t i = 0; i < prompts.size(); ++i) n_pred.push_back(n_predict_for(i) + 40);
    // Alone, with the context the small pool allows (the longest request stops at 160 tokens).
    EngineOptions alone = spec_options(nullptr, 1, 1, 1);
    alone.n_ctx = 160;
    const Run want = run_all(big, prompts, alone, n_pred);
    CHECK(want.results.back().stop == StopReason::Context);
    // 10 blocks of 16 tokens: one sequence of up to 160 tokens fits, eight do not.
    Model target = load(tpath, 16, 10);
    for (int64_t draft_blocks : {int64_t(40), int64_t(10)}) {  // roomy, and as small as the target
        Model draft = load(test::shared_path("models/stories260K-Q8_0.gguf"), 16, draft_blocks);
        for (bool prefix_cache : {true, false}) {
            CAPTURE(draft_blocks);
            CAPTURE(prefix_cache);
            EngineOptions eo = spec_options(&draft, 8, 1, 8);
            eo.prefix_cache = prefix_cache;
            const Run got = run_all(target, prompts, eo, n_pred);
            for (size_t i = 0; i < prompts.size(); ++i)
                CHECK_MESSAGE(got.tokens[i] == want.tokens[i], "prompt " << i);
            CHECK(got.stats.preemptions > 0);
            CHECK(got.stats.spec.accepted > 0);
            CHECK(got.stats.peak_blocks_used <= 10);
            for (size_t i = 0; i < prompts.size(); ++i)
                CHECK(got.results[i].stop == want.results[i].stop);
            MESSAGE("draft pool " << draft_blocks << ", prefix cache " << prefix_cache << ": "
                                  << got.stats.preemptions << " preemptions, acceptance "
                                  << 100 * got.stats.spec.acceptance() << "%");
        }
    }
}

TEST_CASE("both KV tables hold exactly the accepted tokens after every step; none leak") {
    auto tpath = test::shared_path("models/stories260K.gguf");
    if (tpath.empty()) return;
    const int32_t bs = 4;
    Model target = load(tpath, bs, 1024);
    Model draft = load(test::shared_path("models/stories260K-L4-F32.gguf"), bs, 1200);
    auto prompts = prompts_for(*target.tok);
    for (bool prefix_cache : {false, true}) {
        CAPTURE(prefix_cache);
        EngineOptions eo = spec_options(&draft, 6, 1, 8);
        eo.prefix_cache = prefix_cache;
        Engine engine(*target.backend, *target.tok, eo);
        int finished = 0;
        engine.on_finish([&](const GenerationResult& r) {
            CHECK(r.stop == StopReason::Length);
            CHECK(r.tokens.size() == 250);
            ++finished;
        });
        for (size_t i = 0; i < prompts.size(); ++i) {
            GenerationRequest r;
            r.prompt = prompts[i];
            r.n_predict = 250;
            r.ignore_eos = true;
            r.sampling.temperature = 1.0f;  // sampling: plenty of rejections to roll back
            r.sampling.seed = 11 + i;
            engine.submit(r);
        }
        const KvBlockTable& tt = engine.kv_table();
        const KvBlockTable& dt = *engine.draft_kv_table();
        int64_t steps = 0;
        bool exact = true;
        while (engine.step()) {
            ++steps;
            int32_t target_blocks = 0, draft_blocks = 0;
            for (const EngineSequenceInfo& s : engine.running_sequences()) {
                const int32_t held = tt.n_tokens(s.kv), dheld = dt.n_tokens(s.draft_kv);
                exact &= held == s.n_computed;
                // Decoding: every token but the last (sampled, not run yet); no draft is left.
                if (s.n_tokens > s.n_prompt) exact &= held == s.n_tokens - 1;
                exact &= dheld <= std::max(held, s.n_tokens - 1);
                // The draft's tokens are a prefix of the target's (both are the sequence's).
                const auto& a = tt.tokens(s.kv);
                const auto& b = dt.tokens(s.draft_kv);
                const size_t n = std::min(a.size(), b.size());
                exact &= std::equal(a.begin(), a.begin() + n, b.begin());
                target_blocks += blocks_for(held, bs);
                draft_blocks += blocks_for(dheld, bs);
            }
            if (!prefix_cache) {  // no shared blocks: used blocks are exactly what tokens need
                exact &= tt.n_used_blocks() == target_blocks;
                exact &= dt.n_used_blocks() == draft_blocks;
            } else {
                exact &= tt.n_used_blocks() <= target_blocks;
                exact &= dt.n_used_blocks() <= draft_blocks;
            }
            if (!exact) break;
        }
        CHECK(exact);
        CHECK(finished == int(prompts.size()));
        const SpeculativeStats& s = engine.stats().spec;
        CHECK(s.drafted - s.accepted > 500);  // many rejected positions were rolled back
        CHECK(steps > 40);
        CHECK(tt.n_used_blocks() == 0);
        CHECK(dt.n_used_blocks() == 0);
        CHECK(tt.n_sequences() == 0);
        CHECK(dt.n_sequences() == 0);
        MESSAGE("prefix cache " << prefix_cache << ": " << steps << " steps, drafted " << s.drafted
                                << ", accepted " << s.accepted);
    }
}

TEST_CASE("sampled batches with speculation are lossless (chi-square, temp 0.8 and 1)") {
    auto tpath = test::shared_path("models/stories260K.gguf");
    if (tpath.empty()) return;
    // Small blocks so that the prompt comes from the prefix cache after the first requests.
    Model ref = load(tpath, 4, 64), target = load(tpath, 4, 1024);
    Model draft = load(test::shared_path("models/stories260K-L3-F32.gguf"), 4, 1200);
    const std::vector<TokenId> prompt =
        target.tok->encode("The little dog saw a big red ball. He", true);

    auto measure = [&](const SamplingParams& params, AcceptRule rule, int64_t n, bool pairs,
                       double* acceptance) {
        const auto run =
            spec_test::first_pairs(target, draft.backend.get(), prompt, params, n, rule);
        CHECK(run.stats.peak_running == 16);
        if (acceptance) *acceptance = run.stats.spec.acceptance();
        return spec_test::lossless_z(ref, prompt, params, run.draws, pairs);
    };

    const int64_t n = 3000;
    SamplingParams filtered;  // llama.cpp's defaults: top-k 40, top-p 0.95, min-p 0.05, T 0.8
    double acceptance = 0;
    const spec_test::LosslessZ z08 = measure(filtered, AcceptRule::Lossless, n, true, &acceptance);
    MESSAGE("batch, temp 0.8 (filters): z(first) " << z08.z_first << ", z(pair) " << z08.z_pair
                                                   << ", acceptance " << acceptance);
    CHECK(z08.z_first < 3.7);
    CHECK(z08.z_pair < 3.7);
    CHECK(acceptance > 0.05);
    CHECK(acceptance < 0.95);
    const spec_test::LosslessZ z1 =
        measure(spec_test::full_softmax(), AcceptRule::Lossless, n, true, nullptr);
    MESSAGE("batch, full softmax: z(first) " << z1.z_first << ", z(pair) " << z1.z_pair);
    CHECK(z1.z_first < 3.7);
    CHECK(z1.z_pair < 3.7);
    // The same test catches a broken rule run through the engine.
    const spec_test::LosslessZ broken =
        measure(spec_test::full_softmax(), AcceptRule::AcceptAll, n / 2, false, nullptr);
    MESSAGE("batch, broken accept-all: z(first) " << broken.z_first);
    CHECK(broken.z_first > 10);
}

TEST_CASE("sessions with a draft: two turns give the tokens of the target alone") {
    auto tpath = test::shared_path("models/stories260K.gguf");
    if (tpath.empty()) return;
    Model target = load(tpath, 16, 64);
    Model draft = load(test::shared_path("models/stories260K-Q8_0.gguf"), 16, 80);
    auto two_turns = [&](Model* d, std::vector<GenerationResult>& results, SpeculativeStats& st) {
        Engine engine(*target.backend, *target.tok, spec_options(d, 1, 1, 6));
        engine.on_finish([&](const GenerationResult& r) { results.push_back(r); });
        const int32_t ses = engine.open_session();
        GenerationRequest r;
        r.session = ses;
        r.prompt = target.tok->encode("Once upon a time", true);
        r.n_predict = 40;
        r.sampling.temperature = 0;
        engine.submit(r);
        engine.run();
        const int32_t after1 = int32_t(engine.session_tokens(ses).size());
        // The session keeps both sequences; the target holds every token but the last.
        CHECK(engine.session_cached_tokens(ses) == after1 - 1);
        if (d) CHECK(engine.draft_kv_table()->n_sequences() == 1);
        r.prompt = target.tok->encode(" The dog said", false);
        engine.submit(r);
        engine.run();
        REQUIRE(results.size() == 2);
        CHECK(results[1].timings.n_prompt_computed == int32_t(r.prompt.size()) + 1);
        // A third turn after rolling the session back (as chat does for stop strings).
        engine.truncate_session(ses, after1);
        engine.submit(r);
        engine.run();
        REQUIRE(results.size() == 3);
        st = engine.stats().spec;
        engine.close_session(ses);
        CHECK(engine.kv_table().n_used_blocks() == 0);
        if (d) CHECK(engine.draft_kv_table()->n_used_blocks() == 0);
    };
    std::vector<GenerationResult> want, got;
    SpeculativeStats st_want, st_got;
    two_turns(nullptr, want, st_want);
    two_turns(&draft, got, st_got);
    for (size_t i = 0; i < 3; ++i) {
        CAPTURE(i);
        CHECK(got[i].tokens == want[i].tokens);
        CHECK(got[i].tokens.size() == 40);
        CHECK(got[i].n_drafted > 0);
    }
    CHECK(got[2].tokens == got[1].tokens);
    CHECK(st_got.acceptance() > 0.8);  // the Q8_0 draft nearly always agrees
    CHECK(st_got.target_passes < st_want.target_passes / 3);
}

TEST_CASE("chat turns through ChatSession with a draft give the same replies") {
    auto tpath = test::shared_path("models/stories260K.gguf");
    if (tpath.empty()) return;
    Model target = load(tpath, 16, 64);
    Model draft = load(test::shared_path("models/stories260K-L4-F32.gguf"), 16, 80);
    auto chat = [&](Model* d, std::vector<ChatTurnStats>* turns) {
        Engine engine(*target.backend, *target.tok, spec_options(d, 1, 1, 4));
        ChatConfig cfg;
        cfg.n_predict = 30;
        cfg.sampling.temperature = 0;
        cfg.system = "Tell a story.";
        ChatSession session(engine, *target.tok, cfg);
        std::vector<std::string> replies;
        for (const char* msg : {"Once upon a time", "The dog ran to the park", "Then what?"}) {
            replies.push_back(session.send(
                msg, [](std::string_view) {}, [](std::string_view) {}));
            if (turns) turns->push_back(session.last_turn());
        }
        return replies;
    };
    std::vector<ChatTurnStats> turns;
    const auto want = chat(nullptr, nullptr);
    const auto got = chat(&draft, &turns);
    CHECK(got == want);
    for (const ChatTurnStats& t : turns) {
        CHECK(t.n_drafted > 0);
        CHECK(t.n_accepted <= t.n_drafted);
        CHECK(t.n_generated > 0);
    }
}

TEST_CASE("n_samples with a draft: each sample speculates on its own") {
    auto tpath = test::shared_path("models/stories260K.gguf");
    if (tpath.empty()) return;
    Model target = load(tpath, 16, 128);
    Model draft = load(test::shared_path("models/stories260K-Q8_0.gguf"), 16, 160);
    auto run = [&](uint64_t seed, EngineStats* stats) {
        Engine engine(*target.backend, *target.tok, spec_options(&draft, 4, 1, 8));
        GenerationRequest r;
        r.prompt =
            target.tok->encode("Once upon a time, there was a little girl named Lily.", true);
        REQUIRE(r.prompt.size() == 16);
        r.n_predict = 30;
        r.n_samples = 4;
        r.ignore_eos = true;
        r.sampling.temperature = 1.0f;
        r.sampling.seed = seed;
        std::vector<std::vector<TokenId>> out(4);
        engine.on_finish([&](const GenerationResult& g) {
            CHECK(g.n_drafted > 0);
            out.at(g.sample) = g.tokens;
        });
        engine.submit(r);
        engine.run();
        CHECK(engine.kv_table().n_used_blocks() == 0);
        CHECK(engine.draft_kv_table()->n_used_blocks() == 0);
        if (stats) *stats = engine.stats();
        return out;
    };
    EngineStats st;
    const auto a = run(9, &st), b = run(9, nullptr);
    CHECK(a == b);  // same seed, same samples
    std::set<std::vector<TokenId>> distinct(a.begin(), a.end());
    CHECK(distinct.size() == 4);
    for (const auto& s : a) CHECK(s.size() == 30);
    CHECK(st.tokens_prefilled == 16);  // the prompt (16 tokens) ran once
    CHECK(st.spec.accepted > 0);
}

TEST_CASE("quantized KV caches (q8, q4) with a draft: greedy tokens unchanged, no leak") {
    auto tpath = test::shared_path("models/stories260K.gguf");
    if (tpath.empty()) return;
    // Blocks of 4 tokens: drafts often fill (seal, quantize) a block that the rollback then
    // reopens, which the staging keeps exact.
    auto load_kv = [](const std::filesystem::path& path, KvType type, int64_t n_blocks) {
        Model m;
        m.file = std::make_unique<GgufFile>(GgufFile::open(path.string()));
        m.tok = Tokenizer::from_gguf(*m.file);
        BackendOptions o;
        o.kv_block_size = 4;
        o.n_kv_blocks = n_blocks;
        o.kv_type_k = o.kv_type_v = type;
        o.n_parallel = 4;
        o.n_batch = 32;
        o.n_threads = 1;
        m.backend = make_cpu_backend(*m.file, o);
        return m;
    };
    for (KvType type : {KvType::Q8, KvType::Q4}) {
        CAPTURE(int(type));
        Model target = load_kv(tpath, type, 512);
        Model draft = load_kv(test::shared_path("models/stories260K-L4-F32.gguf"), type, 600);
        REQUIRE(target.backend->n_kv_stages() > 0);
        auto prompts = prompts_for(*target.tok);
        prompts.resize(8);
        std::vector<int32_t> n_pred(prompts.size(), 80);
        const Run want = run_all(target, prompts, spec_options(nullptr, 4, 1, 1), n_pred);
        const Run got = run_all(target, prompts, spec_options(&draft, 4, 1, 8), n_pred);
        for (size_t i = 0; i < prompts.size(); ++i)
            CHECK_MESSAGE(got.tokens[i] == want.tokens[i], "prompt " << i);
        CHECK(got.stats.spec.drafted > got.stats.spec.accepted);  // rollbacks happened
    }
}

TEST_CASE("prompt lookup drafts: hand cases") {
    using V = std::vector<TokenId>;
    // ... 1 2 3 | 9 9 ... 1 2 3 -> the continuation after the most recent "1 2 3": "4 5".
    const V t = {1, 2, 3, 9, 9, 1, 2, 3, 4, 5, 7, 1, 2, 3};
    CHECK(speculative_lookup_drafts(t, 3, 2) == V{4, 5});
    CHECK(speculative_lookup_drafts(t, 3, 8) == V{4, 5, 7, 1, 2, 3});  // up to the end
    CHECK(speculative_lookup_drafts(t, 3, 0).empty());
    // The longest n-gram that recurs wins over a more recent shorter one: "6 7" was last
    // followed by 8; the single "7" more recently by 1.
    const V u = {5, 6, 7, 8, 0, 7, 1, 6, 7};
    CHECK(speculative_lookup_drafts(u, 2, 3) == V{8, 0, 7});
    CHECK(speculative_lookup_drafts(u, 1, 3) == V{1, 6, 7});
    // Nothing recurs: no drafts.
    CHECK(speculative_lookup_drafts(V{1, 2, 3, 4}, 3, 4).empty());
    CHECK(speculative_lookup_drafts(V{1}, 3, 4).empty());
    // A run of one token drafts more of it.
    CHECK(speculative_lookup_drafts(V{4, 4, 4}, 2, 5) == V{4});
}

TEST_CASE("prompt lookup (--draft-ngram): greedy tokens unchanged, sampling lossless") {
    auto tpath = test::shared_path("models/stories260K.gguf");
    if (tpath.empty()) return;
    Model target = load(tpath, 16, 256);
    auto prompts = prompts_for(*target.tok);
    std::vector<int32_t> n_pred;
    for (size_t i = 0; i < prompts.size(); ++i) n_pred.push_back(40 + n_predict_for(i));
    const Run want = run_all(target, prompts, spec_options(nullptr, 4, 1, 1), n_pred);
    for (int32_t parallel : {1, 4}) {
        for (int32_t k : {1, 4, 8}) {
            CAPTURE(parallel);
            CAPTURE(k);
            EngineOptions eo = spec_options(nullptr, parallel, 1, k);
            eo.draft_ngram = 3;
            const Run got = run_all(target, prompts, eo, n_pred);
            for (size_t i = 0; i < prompts.size(); ++i)
                CHECK_MESSAGE(got.tokens[i] == want.tokens[i], "prompt " << i);
            CHECK(got.stats.spec.drafted > 0);
            CHECK(got.stats.spec.accepted > 0);  // greedy stories repeat their own phrases
            CHECK(got.stats.spec.draft_passes == 0);
        }
    }
    // Both options at once are refused.
    Model draft = load(test::shared_path("models/stories260K-Q8_0.gguf"), 16, 64);
    EngineOptions both = spec_options(&draft, 1, 1, 4);
    both.draft_ngram = 2;
    CHECK_THROWS_WITH_AS(Engine(*target.backend, *target.tok, both), doctest::Contains("not both"),
                         Error);

    // Sampled: one-hot drafts with the usual acceptance rule keep the target's distribution.
    Model ref = load(tpath, 4, 64), target4 = load(tpath, 4, 1024);
    const std::vector<TokenId> prompt =
        target4.tok->encode("The dog saw the cat. The dog saw the cat. The dog saw the", true);
    for (const SamplingParams& sp : {spec_test::full_softmax(), SamplingParams{}}) {
        const auto run = spec_test::first_pairs(target4, nullptr, prompt, sp, 3000,
                                                AcceptRule::Lossless, nullptr, 3);
        const auto z = spec_test::lossless_z(ref, prompt, sp, run.draws, true);
        MESSAGE("prompt lookup, temp " << sp.temperature << ": z(first) " << z.z_first
                                       << ", z(pair) " << z.z_pair << ", acceptance "
                                       << run.stats.spec.acceptance());
        CHECK(z.z_first < 3.7);
        CHECK(z.z_pair < 3.7);
        CHECK(run.stats.spec.accepted > 0);
        CHECK(run.stats.spec.accepted < run.stats.spec.drafted);
    }
    // A broken rule through the same path is caught.
    const auto broken = spec_test::first_pairs(target4, nullptr, prompt, spec_test::full_softmax(),
                                               1500, AcceptRule::AcceptAll, nullptr, 3);
    CHECK(
        spec_test::lossless_z(ref, prompt, spec_test::full_softmax(), broken.draws, false).z_first >
        10);
}

TEST_CASE("a reasoning budget with speculation: the target's tokens, forced at the same place") {
    // Drafts accepted past the token where the budget runs out are dropped (their K/V rolled
    // back in both tables) and the forced tokens follow, as without speculation.
    auto tpath = test::shared_path("models/stories260K.gguf");
    if (tpath.empty()) return;
    Model target = load(tpath, 16, 256);
    auto prompts = prompts_for(*target.tok);
    std::vector<int32_t> n_pred;
    for (size_t i = 0; i < prompts.size(); ++i) n_pred.push_back(20 + n_predict_for(i));
    for (int32_t tokens : {0, 3, 11}) {
        CAPTURE(tokens);
        ReasoningBudget rb = reasoning_budget_for(tokens, " Done.", /*opened=*/true, *target.tok);
        const Run want = run_all(target, prompts, spec_options(nullptr, 4, 1, 1), n_pred, true, rb);
        for (size_t i = 0; i < prompts.size(); ++i) {
            const auto& t = want.tokens[i];
            REQUIRE(t.size() >= size_t(tokens) + rb.forced.size());
            CHECK(std::equal(rb.forced.begin(), rb.forced.end(), t.begin() + tokens));
        }
        Model draft = load(test::shared_path("models/stories260K-Q8_0.gguf"), 16, 256 + 64);
        for (int32_t k : {4, 8}) {
            CAPTURE(k);
            const Run got =
                run_all(target, prompts, spec_options(&draft, 4, k, k), n_pred, true, rb);
            for (size_t i = 0; i < prompts.size(); ++i)
                CHECK_MESSAGE(got.tokens[i] == want.tokens[i], "prompt " << i);
            CHECK(got.stats.spec.accepted > 0);
            EngineOptions lookup = spec_options(nullptr, 4, 1, k);
            lookup.draft_ngram = 3;
            const Run got2 = run_all(target, prompts, lookup, n_pred, true, rb);
            for (size_t i = 0; i < prompts.size(); ++i)
                CHECK_MESSAGE(got2.tokens[i] == want.tokens[i], "prompt " << i);
        }
    }
}

TEST_CASE("--draft-p-min ends rounds at unsure drafts: fewer drafted, tokens unchanged") {
    auto tpath = test::shared_path("models/stories260K.gguf");
    if (tpath.empty()) return;
    Model target = load(tpath, 16, 256);
    Model draft = load(test::shared_path("models/stories260K-Q4_0.gguf"), 16, 256 + 64);
    auto prompts = prompts_for(*target.tok);
    std::vector<int32_t> n_pred;
    for (size_t i = 0; i < prompts.size(); ++i) n_pred.push_back(n_predict_for(i));
    const Run want = run_all(target, prompts, spec_options(nullptr, 4, 1, 1), n_pred);
    std::vector<SpeculativeStats> stats;
    for (float p_min : {0.0f, 0.6f, 0.95f, 1.0f}) {
        CAPTURE(p_min);
        EngineOptions eo = spec_options(&draft, 4, 4, 4);
        eo.draft_p_min = p_min;
        const Run got = run_all(target, prompts, eo, n_pred);
        for (size_t i = 0; i < prompts.size(); ++i)
            CHECK_MESSAGE(got.tokens[i] == want.tokens[i], "prompt " << i);
        stats.push_back(got.stats.spec);
    }
    CHECK(stats[1].drafted < stats[0].drafted);
    CHECK(stats[2].drafted < stats[1].drafted);
    CHECK(stats[1].acceptance() > stats[0].acceptance());  // what is left is likelier right
    CHECK(stats[3].drafted < stats[2].drafted);            // only drafts the draft is certain of
    MESSAGE("Q4_0 draft, K 4: drafted/accepted at p-min 0 "
            << stats[0].drafted << "/" << stats[0].accepted << ", 0.6 " << stats[1].drafted << "/"
            << stats[1].accepted << ", 0.95 " << stats[2].drafted << "/" << stats[2].accepted);
}
