// Engine scheduler tests on stories260K (CPU backend): continuous batching gives each prompt
// exactly its greedy tokens alone (parallelism 1 and 8, block sizes 16 and 64), a pool too
// small for the batch preempts and recomputes without changing outputs, a shared system
// prompt is stored once (prefix cache), KV waste stays below one block per sequence,
// --n-samples forks share the prompt's blocks, sessions only compute new tokens, and
// cancellation frees everything.
#include <doctest/doctest.h>

#include <atomic>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "backend.h"
#include "common.h"
#include "engine.h"
#include "gguf.h"
#include "test_util.h"
#include "tokenizer.h"

using namespace kvrun;

namespace {

struct Model {
    GgufFile file;
    std::unique_ptr<Tokenizer> tok;
    explicit Model(const std::string& path) : file(GgufFile::open(path)) {
        tok = Tokenizer::from_gguf(file);
    }
};

std::unique_ptr<Model> load_stories() {
    auto path = test::shared_path("models/stories260K.gguf");
    if (path.empty()) return nullptr;
    return std::make_unique<Model>(path.string());
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
