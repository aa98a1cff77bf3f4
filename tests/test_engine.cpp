// Engine scheduler tests on stories260K (CPU backend): continuous batching gives each prompt
// exactly its greedy tokens alone (parallelism 1 and 8, block sizes 16 and 64), a pool too
// small for the batch preempts and recomputes without changing outputs, a shared system
// prompt is stored once (prefix cache), KV waste stays below one block per sequence,
// --n-samples forks share the prompt's blocks, sessions only compute new tokens,
// cancellation frees everything, and a reasoning budget forces the block's end after N tokens.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "backend.h"
#include "common.h"
#include "engine.h"
#include "gguf.h"
#include "grammar.h"
#include "modes/context_shift.h"
#include "reasoning.h"
#include "test_model.h"
#include "test_util.h"
#include "tokenizer.h"

using namespace kvrun;

namespace {

using test::Model;

std::unique_ptr<Model> load_stories() {
    return test::load_shared_model("stories260K.gguf");
}

std::unique_ptr<Backend> make_backend(const Model& m, int32_t block_size, int64_t n_blocks) {
    BackendOptions o;
    o.kv_block_size = block_size;
    o.n_kv_blocks = n_blocks;
    return make_cpu_backend(m.file, o);
}

// 36 prompts of 5 to ~120 tokens: the reference prompts extended by story sentences.
std::vector<std::vector<TokenId>> batch_prompts(const Tokenizer& tok) {
    const char* base[] = {"Once upon a time", "The little dog saw a big red ball. He",
                          "Lily and Tom went to the park. They",
                          "One day, a bird flew into the garden and"};
    const char* more[] = {
        " The sun was shining and the sky was blue.", " She had a red hat and a green bag.",
        " Mom said they could play until dinner.",    " A small cat sat under the old tree.",
        " They laughed and ran to the big slide.",    " Then it started to rain very hard.",
        " The dog barked at the funny frog.",         " He wanted to find his lost toy car."};
    std::vector<std::vector<TokenId>> out;
    for (int i = 0; i < 36; ++i) {
        std::string text;
        for (int k = 0; k < i / 4; ++k) text += more[(i + k) % 8];
        text = (i / 4 ? std::string(base[i % 4]) + "." : std::string()) + text;
        text += i / 4 ? std::string(" ") + base[(i + 1) % 4] : base[i % 4];
        out.push_back(tok.encode(text, true));
    }
    return out;
}

int32_t n_predict_for(size_t i) {
    return 8 + static_cast<int32_t>(i * 7 % 33);
}

struct BatchRun {
    std::vector<std::vector<TokenId>> tokens;  // [prompt] generated tokens
    std::vector<int32_t> preemptions;          // [prompt]
    EngineStats stats;
};

BatchRun run_batch(const Model& m, Backend& backend,
                   const std::vector<std::vector<TokenId>>& prompts, EngineOptions eo,
                   std::vector<int32_t> n_predict = {}) {
    Engine engine(backend, *m.tok, eo);
    BatchRun out;
    out.tokens.resize(prompts.size());
    out.preemptions.resize(prompts.size());
    std::map<int32_t, size_t> index;
    for (size_t i = 0; i < prompts.size(); ++i) {
        GenerationRequest r;
        r.prompt = prompts[i];
        r.n_predict = n_predict.empty() ? n_predict_for(i) : n_predict[i];
        r.sampling.temperature = 0;
        index[engine.submit(r)] = i;
    }
    engine.on_finish([&](const GenerationResult& r) {
        REQUIRE_MESSAGE(r.stop != StopReason::Error, r.error);
        out.tokens[index.at(r.request)] = r.tokens;
        out.preemptions[index.at(r.request)] = r.preemptions;
    });
    engine.run();
    out.stats = engine.stats();
    CHECK(engine.kv_table().n_used_blocks() == 0);  // everything freed (cached blocks evictable)
    return out;
}

// Each prompt alone: one at a time, no prefix cache.
std::vector<std::vector<TokenId>> run_alone(const Model& m,
                                            const std::vector<std::vector<TokenId>>& prompts,
                                            std::vector<int32_t> n_predict = {}) {
    auto backend = make_backend(m, 16, 64);
    EngineOptions eo;
    eo.max_parallel = 1;
    eo.prefix_cache = false;
    return run_batch(m, *backend, prompts, eo, n_predict).tokens;
}

}  // namespace

TEST_CASE("continuous batching gives every prompt its tokens alone (parallel 1/8, blocks 16/64)") {
    auto m = load_stories();
    if (!m) return;
    auto prompts = batch_prompts(*m->tok);
    REQUIRE(prompts.size() >= 32);
    size_t min_len = 1000, max_len = 0;
    for (auto& p : prompts)
        min_len = std::min(min_len, p.size()), max_len = std::max(max_len, p.size());
    CHECK(min_len <= 6);
    CHECK(max_len >= 100);
    auto alone = run_alone(*m, prompts);
    for (size_t i = 0; i < prompts.size(); ++i) CHECK(alone[i].size() == size_t(n_predict_for(i)));
    for (int32_t bs : {16, 64}) {
        for (int32_t parallel : {1, 8}) {
            CAPTURE(bs);
            CAPTURE(parallel);
            auto backend = make_backend(*m, bs, 8 * (256 / bs));
            EngineOptions eo;
            eo.max_parallel = parallel;
            eo.n_batch = 64;  // long prompts are prefilled in chunks next to decodes
            BatchRun r = run_batch(*m, *backend, prompts, eo);
            for (size_t i = 0; i < prompts.size(); ++i) CHECK_MESSAGE(r.tokens[i] == alone[i], i);
            CHECK(r.stats.peak_running == parallel);
            CHECK(r.stats.preemptions == 0);
            // KV waste: only the last block of each sequence is partly empty.
            double mean_len = 0;
            for (size_t i = 0; i < prompts.size(); ++i)
                mean_len += prompts[i].size() + n_predict_for(i);
            mean_len /= prompts.size();
            CHECK(r.stats.peak_waste_fraction < bs / mean_len);
            CHECK(r.stats.mean_waste_fraction() < bs / mean_len);
            MESSAGE("bs " << bs << " parallel " << parallel << ": waste "
                          << 100 * r.stats.mean_waste_fraction() << "% (bound "
                          << 100 * bs / mean_len << "%), steps " << r.stats.steps);
        }
    }
}

TEST_CASE("a pool too small for the batch preempts and recomputes; outputs are unchanged") {
    auto m = load_stories();
    if (!m) return;
    auto prompts = batch_prompts(*m->tok);
    auto alone = run_alone(*m, prompts);
    for (bool prefix_cache : {true, false}) {
        CAPTURE(prefix_cache);
        // 16 blocks of 16 tokens: one sequence of up to 160 tokens fits, eight do not.
        auto backend = make_backend(*m, 16, 16);
        EngineOptions eo;
        eo.max_parallel = 8;
        eo.prefix_cache = prefix_cache;
        BatchRun r = run_batch(*m, *backend, prompts, eo);
        for (size_t i = 0; i < prompts.size(); ++i) CHECK_MESSAGE(r.tokens[i] == alone[i], i);
        CHECK(r.stats.preemptions > 0);
        int64_t sum = 0;
        for (int32_t p : r.preemptions) sum += p;
        CHECK(sum == r.stats.preemptions);
        CHECK(r.stats.peak_blocks_used <= 16);
        MESSAGE("prefix cache " << prefix_cache << ": " << r.stats.preemptions << " preemptions");
    }
}

TEST_CASE("16 prompts sharing a 100-token system prompt store it once") {
    auto m = load_stories();
    if (!m) return;
    std::string sys_text =
        "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
        "park with her dog Max. Every day they ran and jumped and played with a big red ball. "
        "One day, Lily saw a little bird in a tree. The bird was sad because it could not fly.";
    std::vector<TokenId> sys = m->tok->encode(sys_text, true);
    REQUIRE(sys.size() >= 100);
    sys.resize(100);
    std::vector<std::vector<TokenId>> prompts;
    const char* questions[] = {" Lily",    " Max",   " The bird", " Mom",      " They", " The sun",
                               " Tom",     " A cat", " The tree", " She said", " He",   " The ball",
                               " One day", " Then",  " The park", " Her dad"};
    for (const char* q : questions) {
        auto p = sys;
        auto t = m->tok->encode(q, false);
        p.insert(p.end(), t.begin(), t.end());
        prompts.push_back(p);
    }
    const int32_t bs = 16, n_predict = 20;
    std::vector<int32_t> n_pred(prompts.size(), n_predict);
    auto alone = run_alone(*m, prompts, n_pred);
    auto backend = make_backend(*m, bs, 256);
    EngineOptions eo;
    eo.max_parallel = 16;
    BatchRun r = run_batch(*m, *backend, prompts, eo, n_pred);
    for (size_t i = 0; i < prompts.size(); ++i) CHECK_MESSAGE(r.tokens[i] == alone[i], i);
    const int32_t shared_blocks = 100 / bs;  // 6 full blocks (96 tokens)
    CHECK(r.stats.prefix_hit_tokens == 15 * shared_blocks * bs);
    CHECK(r.stats.peak_shared_blocks == shared_blocks);
    // Peak: the shared blocks once, plus each prompt's own tail (rest of the prefix, its
    // question and reply).
    int32_t own = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
        const int32_t tail = int32_t(prompts[i].size() + r.tokens[i].size()) - shared_blocks * bs;
        own += (tail + bs - 1) / bs;
    }
    MESSAGE("peak blocks " << r.stats.peak_blocks_used << " = " << shared_blocks << " shared + "
                           << own << " own (unshared would be " << own + 16 * shared_blocks << ")");
    CHECK(r.stats.peak_blocks_used <= shared_blocks + own);
    CHECK(r.stats.peak_blocks_used >= shared_blocks + own - 16);
    CHECK(r.stats.peak_blocks_used < own + 16 * shared_blocks - 60);
}

TEST_CASE("--n-samples: diverging continuations share the prompt's blocks") {
    auto m = load_stories();
    if (!m) return;
    auto run = [&](uint64_t seed, EngineStats* stats) {
        auto backend = make_backend(*m, 16, 64);
        Engine engine(*backend, *m->tok, EngineOptions{});
        GenerationRequest r;
        r.prompt = m->tok->encode(
            "Once upon a time, there was a little girl named Lily. She loved to play outside in "
            "the park with her dog. One day",
            true);
        REQUIRE(r.prompt.size() > 32);
        r.n_predict = 24;
        r.n_samples = 4;
        r.ignore_eos = true;
        r.sampling.temperature = 1.0f;
        r.sampling.seed = seed;
        std::vector<std::vector<TokenId>> out(4);
        engine.on_finish([&](const GenerationResult& g) { out.at(g.sample) = g.tokens; });
        engine.submit(r);
        engine.run();
        const int32_t prompt_blocks = int32_t(r.prompt.size()) / 16;
        CHECK(engine.stats().peak_shared_blocks >= prompt_blocks);
        CHECK(engine.stats().cow_copies >= 3);  // the partly filled last block, per sample
        CHECK(engine.stats().tokens_prefilled == int64_t(r.prompt.size()));  // prompt run once
        if (stats) *stats = engine.stats();
        return out;
    };
    EngineStats st;
    auto a = run(42, &st);
    auto b = run(42, nullptr);
    CHECK(a == b);  // same seed, same samples
    std::set<std::vector<TokenId>> distinct(a.begin(), a.end());
    CHECK(distinct.size() == 4);
    for (auto& s : a) CHECK(s.size() == 24);
    MESSAGE("shared blocks peak " << st.peak_shared_blocks << ", copies " << st.cow_copies);
}

TEST_CASE("a session continues its sequence: the next request computes only new tokens") {
    auto m = load_stories();
    if (!m) return;
    auto backend = make_backend(*m, 16, 64);
    Engine engine(*backend, *m->tok, EngineOptions{});
    std::vector<GenerationResult> results;
    engine.on_finish([&](const GenerationResult& r) { results.push_back(r); });
    const int32_t ses = engine.open_session();
    GenerationRequest r;
    r.session = ses;
    r.prompt = m->tok->encode("Once upon a time", true);
    r.n_predict = 20;
    r.sampling.temperature = 0;
    engine.submit(r);
    engine.run();
    REQUIRE(results.size() == 1);
    const auto turn1 = engine.session_tokens(ses);
    CHECK(turn1.size() == r.prompt.size() + 20);
    // The last sampled token was never fed, so it is the one uncached token.
    CHECK(engine.session_cached_tokens(ses) == int32_t(turn1.size()) - 1);

    r.prompt = m->tok->encode(" The dog said", false);
    engine.submit(r);
    engine.run();
    REQUIRE(results.size() == 2);
    CHECK(results[1].timings.n_prompt == int32_t(turn1.size() + r.prompt.size()));
    CHECK(results[1].timings.n_prompt_computed == int32_t(r.prompt.size()) + 1);

    // Same tokens as a fresh engine running the whole conversation at once.
    std::vector<TokenId> whole = turn1;
    whole.insert(whole.end(), r.prompt.begin(), r.prompt.end());
    auto fresh = run_alone(*m, {whole}, {20});
    CHECK(results[1].tokens == fresh[0]);

    // Truncation rolls the session back; the next turn recomputes from there.
    engine.truncate_session(ses, int32_t(turn1.size()));
    CHECK(engine.session_tokens(ses) == turn1);
    r.prompt = m->tok->encode(" The dog said", false);
    engine.submit(r);
    engine.run();
    REQUIRE(results.size() == 3);
    CHECK(results[2].tokens == fresh[0]);
    // (turn 1's last token was computed during turn 2, so only the new prompt runs now)
    CHECK(results[2].timings.n_prompt_computed == int32_t(r.prompt.size()));
    engine.close_session(ses);
    CHECK(engine.kv_table().n_used_blocks() == 0);
    CHECK_THROWS_AS(engine.session_tokens(ses), Error);
}

TEST_CASE("cancel ends every request and frees the pool; bad requests throw") {
    auto m = load_stories();
    if (!m) return;
    auto backend = make_backend(*m, 16, 64);
    EngineOptions eo;
    eo.max_parallel = 2;
    Engine engine(*backend, *m->tok, eo);
    std::vector<StopReason> stops;
    engine.on_finish([&](const GenerationResult& r) { stops.push_back(r.stop); });
    for (int i = 0; i < 5; ++i) {
        GenerationRequest r;
        r.prompt = m->tok->encode("Once upon a time", true);
        r.n_predict = 100;
        r.ignore_eos = true;
        engine.submit(r);
    }
    for (int i = 0; i < 3; ++i) engine.step();
    std::atomic<bool> cancel{true};
    engine.run(&cancel);
    CHECK(stops.size() == 5);
    for (StopReason s : stops) CHECK(s == StopReason::Cancelled);
    CHECK(engine.idle());
    CHECK(engine.kv_table().n_used_blocks() == 0);

    GenerationRequest empty;
    CHECK_THROWS_AS(engine.submit(empty), Error);
    GenerationRequest too_long;
    too_long.prompt.assign(size_t(engine.n_ctx()), 1);
    CHECK_THROWS_AS(engine.submit(too_long), Error);
    GenerationRequest bad_id;
    bad_id.prompt = {1, 100000};
    CHECK_THROWS_AS(engine.submit(bad_id), Error);
}

TEST_CASE("continuous batching on synthetic GQA/qwen2 models matches each prompt alone") {
    for (const char* name : {"synth-llama-hd64-gqa4-Q4_0", "synth-qwen2-hd64-gqa2-F16"}) {
        CAPTURE(name);
        auto path = test::shared_path(std::string("models/") + name + ".gguf");
        if (path.empty()) return;
        Model m(path.string());
        std::vector<std::vector<TokenId>> prompts;
        for (int i = 0; i < 8; ++i) {
            std::vector<TokenId> p = {1};
            for (int k = 0; k < 3 + 9 * i; ++k) p.push_back(3 + (i * 131 + k * 17) % 500);
            prompts.push_back(p);
        }
        std::vector<int32_t> n_pred(prompts.size(), 6);
        auto alone = run_alone(m, prompts, n_pred);
        auto backend = make_backend(m, 16, 64);
        EngineOptions eo;
        eo.max_parallel = 4;
        eo.n_batch = 32;
        BatchRun r = run_batch(m, *backend, prompts, eo, n_pred);
        for (size_t i = 0; i < prompts.size(); ++i) CHECK_MESSAGE(r.tokens[i] == alone[i], i);
        CHECK(r.stats.peak_running == 4);
    }
}

TEST_CASE("n_predict 0 generates nothing (stop length), -1 has no limit, below -1 is refused") {
    auto m = load_stories();
    if (!m) return;
    auto draft_path = test::shared_path("models/stories260K-Q8_0.gguf");
    Model draft_model(draft_path.string());
    auto draft_backend = make_backend(draft_model, 16, 64);
    for (bool speculative : {false, true}) {
        CAPTURE(speculative);
        auto backend = make_backend(*m, 16, 64);
        EngineOptions eo;
        if (speculative) eo.draft = draft_backend.get();
        Engine engine(*backend, *m->tok, eo);
        std::vector<GenerationResult> results;
        engine.on_finish([&](const GenerationResult& r) { results.push_back(r); });
        GenerationRequest r;
        r.prompt = m->tok->encode("Once upon a time", true);
        r.sampling.temperature = 0;
        r.n_predict = 0;
        const int32_t zero = engine.submit(r);
        r.n_samples = 3;
        r.sampling.temperature = 1;
        const int32_t zero3 = engine.submit(r);
        r.n_samples = 1;
        r.n_predict = 5;
        r.sampling.temperature = 0;
        const int32_t five = engine.submit(r);
        engine.run();
        REQUIRE(results.size() == 5);
        std::set<int32_t> samples_of_zero3;
        for (const GenerationResult& x : results) {
            if (x.request == five) {
                CHECK(x.tokens.size() == 5);
                continue;
            }
            CHECK((x.request == zero || x.request == zero3));
            CHECK(x.tokens.empty());
            CHECK(x.stop == StopReason::Length);
            CHECK(x.timings.n_prompt_computed == 0);
            if (x.request == zero3) samples_of_zero3.insert(x.sample);
        }
        CHECK(samples_of_zero3 == std::set<int32_t>{0, 1, 2});
        // Only the request that generates ran its prompt.
        CHECK(engine.stats().tokens_prefilled == int64_t(r.prompt.size()));
        CHECK(engine.kv_table().n_used_blocks() == 0);

        // -1: until the context is full; below -1: refused.
        r.n_predict = -1;
        r.ignore_eos = true;
        results.clear();
        engine.submit(r);
        engine.run();
        REQUIRE(results.size() == 1);
        CHECK(results[0].stop == StopReason::Context);
        CHECK(int32_t(results[0].tokens.size() + r.prompt.size()) == engine.n_ctx());
        r.n_predict = -2;
        CHECK_THROWS_WITH_AS(engine.submit(r), doctest::Contains("n_predict must be -1"), Error);

        // In a session, n_predict 0 only appends the prompt; the next request computes it.
        const int32_t ses = engine.open_session();
        r.session = ses;
        r.n_predict = 0;
        results.clear();
        engine.submit(r);
        engine.run();
        REQUIRE(results.size() == 1);
        CHECK(results[0].tokens.empty());
        CHECK(engine.session_tokens(ses) == r.prompt);
        const std::vector<TokenId> first = r.prompt;
        r.prompt = m->tok->encode(" The dog", false);
        r.n_predict = 8;
        engine.submit(r);
        engine.run();
        REQUIRE(results.size() == 2);
        CHECK(results[1].tokens.size() == 8);
        CHECK(results[1].timings.n_prompt_computed == int32_t(first.size() + r.prompt.size()));
        engine.close_session(ses);
        r.session = -1;
    }
}

TEST_CASE("KV waste under heavy prefix sharing stays below block_size / physical tokens per seq") {
    // Waste = unfilled slots of the physical blocks in use / their slots. Only a sequence's
    // last block can be partly filled (shared prefix blocks are full), so with N sequences
    // unfilled <= N (bs - 1) and waste = U / (F + U) <= N (bs - 1) / F < bs / (F / N), where F
    // is the number of filled physical slots: F / N is the mean *physical* tokens per sequence
    // (a shared token counts once). Sharing makes F / N smaller than the sequences' lengths,
    // so the waste share of the (smaller) pool is larger than without sharing.
    auto m = load_stories();
    if (!m) return;
    std::string sys_text =
        "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
        "park with her dog Max. Every day they ran and jumped and played with a big red ball. "
        "One day, Lily saw a little bird in a tree. The bird was sad because it could not fly.";
    std::vector<TokenId> sys = m->tok->encode(sys_text, true);
    REQUIRE(sys.size() >= 100);
    sys.resize(100);
    const char* questions[] = {" Lily",    " Max",   " The bird", " Mom",      " They", " The sun",
                               " Tom",     " A cat", " The tree", " She said", " He",   " The ball",
                               " One day", " Then",  " The park", " Her dad"};
    for (int32_t bs : {16, 32}) {
        CAPTURE(bs);
        auto backend = make_backend(*m, bs, 4096 / bs);
        EngineOptions eo;
        eo.max_parallel = 16;
        Engine engine(*backend, *m->tok, eo);
        double mean_len = 0;
        for (const char* q : questions) {
            GenerationRequest r;
            r.prompt = sys;
            auto t = m->tok->encode(q, false);
            r.prompt.insert(r.prompt.end(), t.begin(), t.end());
            r.n_predict = 40;
            r.ignore_eos = true;
            r.sampling.temperature = 0;
            mean_len += double(r.prompt.size() + 40) / 16;
            engine.submit(r);
        }
        double max_ratio = 0, peak_bound = 0, peak_waste = 0;
        int32_t peak_used = 0;
        while (engine.step()) {
            const KvBlockStats ks = engine.kv_table().stats();
            const int32_t n = ks.n_sequences;
            if (n == 0 || ks.used_blocks == 0) continue;
            const int64_t filled = int64_t(ks.used_blocks) * bs - ks.unfilled_slots;
            CHECK(ks.unfilled_slots <= int64_t(n) * (bs - 1));
            const double bound = double(bs) / (double(filled) / n);
            CHECK(ks.waste_fraction() < bound);
            max_ratio = std::max(max_ratio, ks.waste_fraction() / bound);
            if (ks.used_blocks >= peak_used) {
                peak_used = ks.used_blocks;
                peak_bound = bound;
                peak_waste = ks.waste_fraction();
            }
        }
        const EngineStats& st = engine.stats();
        CHECK(st.peak_shared_blocks == 100 / bs);  // the shared full blocks, stored once
        CHECK(peak_waste < peak_bound);
        CHECK(peak_bound < 1.0);  // at the peak the bound is a real limit, not a formality
        MESSAGE("bs " << bs << ": waste at the peak (" << peak_used << " blocks) "
                      << 100 * peak_waste << "% < bound " << 100 * peak_bound << "%; mean "
                      << 100 * st.mean_waste_fraction() << "%; bs / mean sequence length "
                      << 100 * bs / mean_len << "%; waste / bound at most " << max_ratio);
    }
}

TEST_CASE("decode tokens/s only when meaningful; the requested context is reported") {
    GenerationTimings t;
    t.n_generated = 8;
    t.decode_ms = 0.004;  // every token in one speculative round
    CHECK_FALSE(t.has_decode_rate());
    CHECK(t.decode_tokens_per_s() == 0.0);
    t.n_generated = 1;
    t.decode_ms = 50;
    CHECK_FALSE(t.has_decode_rate());
    t.n_generated = 11;
    t.decode_ms = 10;
    CHECK(t.has_decode_rate());
    CHECK(t.decode_tokens_per_s() == doctest::Approx(1000.0));

    auto m = load_stories();
    if (!m) return;
    auto backend = make_backend(*m, 16, 4);  // a pool of 64 tokens
    EngineOptions eo;
    eo.n_ctx = 256;
    Engine engine(*backend, *m->tok, eo);
    CHECK(engine.n_ctx() == 64);
    CHECK(engine.n_ctx_requested() == 256);
}

TEST_CASE("device-style sampling (Backend::forward_sample) gives the host path's tokens") {
    auto m = load_stories();
    if (!m) return;
    const auto prompts = batch_prompts(*m->tok);
    // Greedy, sampled, sampled with a repetition penalty over all or the last 8 tokens, and
    // two samples of one prompt (its first step forks on the host path).
    auto run = [&](EngineOptions::DeviceSampling mode, EngineStats* stats) {
        auto backend = make_backend(*m, 16, 128);
        EngineOptions eo;
        eo.max_parallel = 6;
        eo.device_sampling = mode;
        Engine engine(*backend, *m->tok, eo);
        std::map<std::pair<int32_t, int32_t>, std::vector<TokenId>> out;
        for (int i = 0; i < 10; ++i) {
            GenerationRequest r;
            r.prompt = prompts[size_t(i) * 3];
            r.n_predict = 24;
            r.sampling.seed = 100 + uint64_t(i);
            r.sampling.temperature = i % 4 == 0 ? 0.0f : 0.9f;
            if (i % 4 == 2) r.sampling.repeat_penalty = 1.3f, r.sampling.repeat_last_n = -1;
            if (i % 4 == 3) r.sampling.repeat_penalty = 1.2f, r.sampling.repeat_last_n = 8;
            if (i == 5) r.n_samples = 2;
            engine.submit(r);
        }
        engine.on_finish([&](const GenerationResult& r) {
            REQUIRE_MESSAGE(r.stop != StopReason::Error, r.error);
            out[{r.request, r.sample}] = r.tokens;
        });
        engine.run();
        *stats = engine.stats();
        return out;
    };
    EngineStats host_stats, dev_stats;
    const auto host = run(EngineOptions::DeviceSampling::Off, &host_stats);
    const auto dev = run(EngineOptions::DeviceSampling::On, &dev_stats);
    CHECK(host == dev);
    CHECK(host.size() == 11);
    CHECK(host_stats.device_sampled_steps == 0);
    CHECK(dev_stats.device_sampled_steps > 0);
    CHECK(dev_stats.device_sampled_steps < dev_stats.steps);  // the fork step used the host
}

TEST_CASE("--context-shift: keep the head, drop the older half, go on like a fresh run") {
    // The rule on its own.
    const std::vector<TokenId> all = {1, 10, 11, 12, 13, 14, 15, 16, 17, 18};
    CHECK(context_shift_tokens(all, 2) == std::vector<TokenId>{1, 10, 15, 16, 17, 18});
    CHECK(context_shift_tokens(all, 0) == std::vector<TokenId>{14, 15, 16, 17, 18});
    CHECK(context_shift_tokens(all, 9).empty());  // one token left over: nothing to drop
    CHECK(context_shift_tokens(all, 99).empty());
    CHECK(context_shift_keep({1, 5, 6}, 1, 1) == 2);   // BOS counted on top
    CHECK(context_shift_keep({5, 6, 7}, 1, 1) == 1);   // no BOS
    CHECK(context_shift_keep({1, 5, 6}, -1, 1) == 3);  // the whole prompt
    CHECK(context_shift_keep({1, 5, 6}, 9, 1) == 3);

    auto m = load_stories();
    if (!m) return;
    auto backend = make_backend(*m, 16, 64);
    EngineOptions eo;
    eo.n_ctx = 64;
    Engine engine(*backend, *m->tok, eo);
    GenerationRequest req;
    req.prompt = m->tok->encode("Once upon a time", true);
    req.n_predict = 150;
    req.ignore_eos = true;
    req.sampling.temperature = 0;
    ContextShiftOptions o;
    o.enabled = true;
    o.n_keep = 2;
    int32_t shifts = 0;
    const GenerationResult r = run_with_context_shift(engine, req, o, *m->tok, nullptr, &shifts);
    CHECK(r.tokens.size() == 150);
    CHECK(r.stop == StopReason::Length);
    CHECK(shifts >= 3);
    CHECK(r.timings.n_generated == 150);
    // Round 1 fills the context; round 2 is exactly a fresh greedy run on the shifted text.
    const size_t n1 = 64 - req.prompt.size();
    std::vector<TokenId> all1 = req.prompt;
    all1.insert(all1.end(), r.tokens.begin(), r.tokens.begin() + std::ptrdiff_t(n1));
    const std::vector<TokenId> next = context_shift_tokens(all1, 3);
    REQUIRE(next.size() < 64);
    GenerationRequest fresh = req;
    fresh.prompt = next;
    fresh.n_predict = static_cast<int32_t>(64 - next.size());
    GenerationResult f;
    auto b2 = make_backend(*m, 16, 64);
    Engine e2(*b2, *m->tok, eo);
    e2.on_finish([&](const GenerationResult& x) { f = x; });
    e2.submit(fresh);
    e2.run();
    REQUIRE(f.tokens.size() == size_t(fresh.n_predict));
    CHECK(std::equal(f.tokens.begin(), f.tokens.end(), r.tokens.begin() + std::ptrdiff_t(n1)));
    // A stop string across the first shift (its start in round 1, its end in round 2) ends
    // the text there.
    std::string t1, t2;
    for (size_t i = 0; i < n1; ++i) t1 += m->tok->token_to_piece(r.tokens[i]);
    for (size_t i = n1; i < n1 + 4; ++i) t2 += m->tok->token_to_piece(r.tokens[i]);
    GenerationRequest stopping = req;
    stopping.stop_strings = {t1.substr(t1.size() - 3) + t2.substr(0, 3)};
    REQUIRE(t1.find(stopping.stop_strings[0]) == std::string::npos);
    const GenerationResult st =
        run_with_context_shift(engine, stopping, o, *m->tok, nullptr, &shifts);
    CHECK(st.stop == StopReason::StopString);
    CHECK(shifts == 1);
    CHECK(st.tokens.size() > n1);
    CHECK(st.tokens.size() <= n1 + 4);
    // Off: the context stop stays; all blocks are back after the rounds.
    o.enabled = false;
    const GenerationResult off = run_with_context_shift(engine, req, o, *m->tok, nullptr, &shifts);
    CHECK(off.stop == StopReason::Context);
    CHECK(off.tokens.size() == n1);
    CHECK(shifts == 0);
    CHECK(engine.kv_table().n_used_blocks() == 0);
    req.n_samples = 2;
    CHECK_THROWS_AS(run_with_context_shift(engine, req, o, *m->tok, nullptr, nullptr), Error);
}

namespace {

// One request run alone on a fresh engine; fails the test on an error.
GenerationResult run_one(const Model& m, GenerationRequest r, EngineOptions eo = {}) {
    auto backend = make_backend(m, 16, 64);
    Engine engine(*backend, *m.tok, eo);
    GenerationResult out;
    engine.on_finish([&](const GenerationResult& res) {
        REQUIRE_MESSAGE(res.stop != StopReason::Error, res.error);
        if (res.sample == 0) out = res;
    });
    engine.submit(std::move(r));
    engine.run();
    CHECK(engine.kv_table().n_used_blocks() == 0);
    return out;
}

// "Once upon a time", n greedy tokens, past EOS.
GenerationRequest greedy_story(const Tokenizer& tok, int32_t n) {
    GenerationRequest r;
    r.prompt = tok.encode("Once upon a time", true);
    r.n_predict = n;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    return r;
}

bool has_at(const std::vector<TokenId>& v, size_t at, const std::vector<TokenId>& part) {
    return at + part.size() <= v.size() && std::equal(part.begin(), part.end(), v.begin() + at);
}

}  // namespace

TEST_CASE("reasoning budget: N tokens of reasoning, then the forced message and end tag") {
    auto m = load_stories();
    if (!m) return;
    const Tokenizer& tok = *m->tok;
    GenerationRequest base = greedy_story(tok, 40);
    const std::vector<TokenId> ref = run_one(*m, base).tokens;
    REQUIRE(ref.size() == 40);

    // The prompt opened the block (a template's "<think>\n"): the reply starts inside it.
    const ReasoningBudget rb = reasoning_budget_for(5, " Done.", /*opened=*/true, tok);
    CHECK(rb.start == "<think>");
    CHECK(rb.end == "</think>");
    CHECK(rb.state.inside);
    CHECK(tok.decode(rb.forced, /*strip_leading_space=*/false) == " Done.</think>");
    const size_t nf = rb.forced.size();
    for (int32_t budget : {0, 1, 5, 12}) {
        CAPTURE(budget);
        GenerationRequest r = base;
        r.reasoning_budget = rb;
        r.reasoning_budget.tokens = budget;
        for (auto mode : {EngineOptions::DeviceSampling::Off, EngineOptions::DeviceSampling::On}) {
            EngineOptions eo;
            eo.device_sampling = mode;
            const std::vector<TokenId> out = run_one(*m, r, eo).tokens;
            REQUIRE(out.size() == 40);  // forced tokens count toward n_predict
            // The model's own first `budget` tokens, then the forced ones...
            CHECK(std::equal(ref.begin(), ref.begin() + budget, out.begin()));
            CHECK(has_at(out, size_t(budget), rb.forced));
            // ... then it goes on as from a prompt that holds them.
            GenerationRequest cont = base;
            cont.prompt.insert(cont.prompt.end(), out.begin(), out.begin() + budget + long(nf));
            cont.n_predict = 40 - budget - int32_t(nf);
            const std::vector<TokenId> rest = run_one(*m, cont).tokens;
            CHECK(std::equal(rest.begin(), rest.end(), out.begin() + budget + long(nf)));
        }
    }
    // Sampled: the forced steps draw nothing, on the host path as with device sampling.
    GenerationRequest warm = base;
    warm.reasoning_budget = rb;
    warm.sampling.temperature = 0.9f;
    warm.sampling.seed = 11;
    EngineOptions on, off;
    on.device_sampling = EngineOptions::DeviceSampling::On;
    off.device_sampling = EngineOptions::DeviceSampling::Off;
    const std::vector<TokenId> warm_host = run_one(*m, warm, off).tokens;
    CHECK(has_at(warm_host, 5, rb.forced));
    CHECK(run_one(*m, warm, on).tokens == warm_host);
    // Both samples of a two-sample request are cut, each on its own.
    GenerationRequest two = base;
    two.reasoning_budget = rb;
    two.n_samples = 2;
    two.sampling.temperature = 0.8f;
    two.sampling.seed = 7;
    auto backend = make_backend(*m, 16, 64);
    Engine engine(*backend, tok, {});
    int n_done = 0;
    engine.on_finish([&](const GenerationResult& res) {
        CHECK(has_at(res.tokens, 5, rb.forced));
        ++n_done;
    });
    engine.submit(two);
    engine.run();
    CHECK(n_done == 2);
    // No budget, and a budget that the reply never reaches: nothing forced.
    GenerationRequest big = base;
    big.reasoning_budget = rb;
    big.reasoning_budget.tokens = 100;
    CHECK(run_one(*m, big).tokens == ref);
}

TEST_CASE("reasoning budget: a reply split over requests goes on where it stopped") {
    // A reply generated in two requests, the second starting from the first's
    // GenerationResult::reasoning (what a context shift or a continued chat reply does), is
    // the reply generated in one: split before the budget runs out, where it runs out, in the
    // middle of the forced tokens and after them.
    auto m = load_stories();
    if (!m) return;
    const Tokenizer& tok = *m->tok;
    GenerationRequest base = greedy_story(tok, 40);
    base.reasoning_budget = reasoning_budget_for(12, " Done.", /*opened=*/true, tok);
    const int32_t nf = static_cast<int32_t>(base.reasoning_budget.forced.size());
    REQUIRE(nf >= 3);
    const GenerationResult whole = run_one(*m, base);
    REQUIRE(whole.tokens.size() == 40);
    REQUIRE(has_at(whole.tokens, 12, base.reasoning_budget.forced));
    CHECK_FALSE(whole.reasoning.inside);
    CHECK(whole.reasoning.spent == 12);
    CHECK(whole.reasoning.forced_next == -1);
    for (int32_t k : {3, 11, 12, 13, 12 + nf - 1, 12 + nf, 30}) {
        CAPTURE(k);
        GenerationRequest first = base;
        first.n_predict = k;
        const GenerationResult a = run_one(*m, first);
        REQUIRE(a.tokens.size() == size_t(k));
        const bool forcing = k >= 12 && k < 12 + nf;
        CHECK(a.reasoning.inside == (k < 12 + nf));
        CHECK(a.reasoning.spent == std::min(k, 12));
        CHECK(a.reasoning.forced_next == (forcing ? k - 12 : -1));
        GenerationRequest rest = base;
        rest.prompt.insert(rest.prompt.end(), a.tokens.begin(), a.tokens.end());
        rest.n_predict = 40 - k;
        rest.reasoning_budget.state = a.reasoning;
        std::vector<TokenId> joined = a.tokens;
        const std::vector<TokenId> b = run_one(*m, rest).tokens;
        joined.insert(joined.end(), b.begin(), b.end());
        CHECK(joined == whole.tokens);
    }
    // States that cannot be are refused: a forced index past the forced tokens, forcing
    // outside a block, tokens spent below 0.
    GenerationRequest bad = base;
    bad.reasoning_budget.state.forced_next = nf;
    auto backend = make_backend(*m, 16, 64);
    Engine engine(*backend, tok, {});
    CHECK_THROWS_AS(engine.submit(bad), Error);
    bad.reasoning_budget.state = {false, 0, 0, ""};  // forcing outside a block
    CHECK_THROWS_AS(engine.submit(bad), Error);
    bad.reasoning_budget.state = {true, -1, -1, ""};
    CHECK_THROWS_AS(engine.submit(bad), Error);
}

TEST_CASE("reasoning budget: a context shift carries it over") {
    // The budget closes the block in the first round; the rounds after a shift go on outside
    // it (the forced tokens appear once), and the output is the same as with a larger context
    // up to the first shift.
    auto m = load_stories();
    if (!m) return;
    const Tokenizer& tok = *m->tok;
    auto backend = make_backend(*m, 16, 64);
    EngineOptions eo;
    eo.n_ctx = 48;
    Engine engine(*backend, tok, eo);
    GenerationRequest req = greedy_story(tok, 120);
    req.reasoning_budget = reasoning_budget_for(6, " Done.", /*opened=*/true, tok);
    const std::vector<TokenId>& forced = req.reasoning_budget.forced;
    ContextShiftOptions o;
    o.enabled = true;
    o.n_keep = 2;
    int32_t shifts = 0;
    const GenerationResult r = run_with_context_shift(engine, req, o, tok, nullptr, &shifts);
    REQUIRE(r.tokens.size() == 120);
    CHECK(shifts >= 2);
    CHECK(has_at(r.tokens, 6, forced));
    size_t n_forced = 0;
    for (size_t i = 0; i < r.tokens.size(); ++i) n_forced += has_at(r.tokens, i, forced);
    CHECK(n_forced == 1);
    CHECK_FALSE(r.reasoning.inside);
    CHECK(r.reasoning.spent == 6);
    // A shift in the middle of the forced tokens finishes them in the next round, once.
    const int32_t n1 = 48 - static_cast<int32_t>(req.prompt.size());
    GenerationRequest late = req;
    late.reasoning_budget.tokens = n1 - 2;
    const GenerationResult l = run_with_context_shift(engine, late, o, tok, nullptr, &shifts);
    REQUIRE(l.tokens.size() == 120);
    CHECK(has_at(l.tokens, size_t(n1 - 2), forced));
    n_forced = 0;
    for (size_t i = 0; i < l.tokens.size(); ++i) n_forced += has_at(l.tokens, i, forced);
    CHECK(n_forced == 1);
    CHECK(engine.kv_table().n_used_blocks() == 0);
}

TEST_CASE("reasoning budget: a block the reply opens itself, tags split over tokens, grammar") {
    auto m = load_stories();
    if (!m) return;
    const Tokenizer& tok = *m->tok;
    // The grammar makes the model write "<think>" (several tokens of this vocabulary) and
    // then words; the budget closes the block after 3 tokens (the forced end tag is allowed
    // by the grammar), and the grammar goes on after it.
    GenerationRequest r;
    r.prompt = tok.encode("Once upon a time", true);
    r.n_predict = 30;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    r.grammar = Grammar::parse(R"(root ::= "<think>" [a-z ]+ "</think>" [a-z .]+)");
    r.reasoning_budget = reasoning_budget_for(3, "", /*opened=*/false, tok);
    CHECK_FALSE(r.reasoning_budget.state.inside);
    const std::vector<TokenId> out = run_one(*m, r).tokens;
    // The token that completes "<think>", 3 more, then the forced tokens.
    std::string text;
    size_t open_at = 0;
    for (; open_at < out.size(); ++open_at) {
        text += tok.token_to_piece(out[open_at]);
        if (text.find("<think>") != std::string::npos) break;
    }
    REQUIRE(open_at < out.size());
    CHECK(open_at >= 1);  // the tag took several tokens
    CHECK(has_at(out, open_at + 4, r.reasoning_budget.forced));
    const std::string whole = tok.decode(out);
    CHECK(whole.find("</think>") != std::string::npos);
    // A grammar that refuses the forced tokens wins: nothing is forced.
    GenerationRequest strict = r;
    strict.grammar = Grammar::parse(R"(root ::= "<think>" [a-z ]+)");
    const std::vector<TokenId> free = run_one(*m, strict).tokens;
    CHECK(tok.decode(free).find("</think>") == std::string::npos);
}

TEST_CASE("reasoning budget: bad budgets are refused") {
    auto m = load_stories();
    if (!m) return;
    auto backend = make_backend(*m, 16, 64);
    Engine engine(*backend, *m->tok, {});
    GenerationRequest r;
    r.prompt = m->tok->encode("Once", true);
    r.reasoning_budget = reasoning_budget_for(4, "", true, *m->tok);
    r.reasoning_budget.tokens = -2;
    CHECK_THROWS_AS(engine.submit(r), Error);
    r.reasoning_budget.tokens = 4;
    r.reasoning_budget.forced.clear();
    CHECK_THROWS_AS(engine.submit(r), Error);
    r.reasoning_budget.forced = {m->tok->n_vocab()};
    CHECK_THROWS_AS(engine.submit(r), Error);
}

TEST_CASE(
    "code completion limits: n_indent ends at a line indented less, max_predict_ms after a "
    "newline") {
    // llama-server's n_indent and t_max_predict_ms (llama.vim / llama.vscode send them): a
    // grammar makes the model write lines of known indentation.
    auto m = load_stories();
    if (!m) return;
    const Tokenizer& tok = *m->tok;
    GenerationRequest r;
    r.prompt = tok.encode("Once upon a time", true);
    r.n_predict = 60;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    r.grammar = Grammar::parse(R"(root ::= "if x\n    a\n  b\nc" [a-z ]+)");
    auto text = [&](const GenerationResult& g) { return tok.decode(g.tokens); };
    const GenerationResult plain = run_one(*m, r);
    REQUIRE(text(plain).starts_with("if x\n    a\n  b\nc"));
    // n_indent 2: "  b" has two blanks, "c" none: the reply ends before "c" (stop length).
    r.n_indent = 2;
    GenerationResult g = run_one(*m, r);
    CHECK(g.stop == StopReason::Length);
    CHECK(text(g).starts_with("if x\n    a\n  b"));
    CHECK(text(g).find('c') == std::string::npos);
    // n_indent 4: "  b" already ends it; the first line never does (no indentation there).
    r.n_indent = 4;
    g = run_one(*m, r);
    CHECK(g.stop == StopReason::Length);
    CHECK(text(g).starts_with("if x\n    a"));
    CHECK(text(g).find('b') == std::string::npos);
    // A line indented enough, then one that is not, in the tokens after it.
    r.grammar = Grammar::parse(R"(root ::= "if x\n    ab\n  cd\ne" [a-z ]+)");
    r.n_indent = 4;
    g = run_one(*m, r);
    CHECK(text(g).starts_with("if x\n    ab\n"));
    CHECK(text(g).find('d') == std::string::npos);
    r.grammar = Grammar::parse(R"(root ::= "if x\n    a\n  b\nc" [a-z ]+)");
    r.n_indent = 0;
    // max_predict_ms: once it has passed, the reply ends at its first newline; without one,
    // it goes on.
    r.max_predict_ms = 1e-6;
    g = run_one(*m, r);
    CHECK(g.stop == StopReason::Length);
    CHECK(text(g) == "if x\n");
    r.grammar = Grammar::parse(R"(root ::= [a-z ]+)");
    g = run_one(*m, r);
    CHECK(g.tokens.size() == 60);
}
