// Tests for speculative decoding (speculative.h, speculative_accept.h; SpeculativeDecoder is
// the one-request view of an engine with a draft model): the acceptance rule on synthetic
// distributions, greedy output identical to the target alone for real draft/target pairs and
// K = 1, 4, 8, a chi-square test that sampling is lossless (which deliberately broken rules
// fail), exact KV block accounting through rollbacks, stop conditions, vocabulary checks, and
// the `kvrun run --draft-model` flags (batches: test_spec_engine.cpp).
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "backend.h"
#include "common.h"
#include "engine.h"
#include "gguf.h"
#include "sampler.h"
#include "spec_test_util.h"
#include "speculative.h"
#include "synthetic_model.h"
#include "test_util.h"
#include "tokenizer.h"

using namespace kvrun;
using kvrun::test::shared_path;
namespace fs = std::filesystem;

namespace {

using spec_test::chi_square_z;
using spec_test::kPrompts;
using spec_test::load;
using spec_test::Model;

GenerationRequest greedy_request(const Tokenizer& tok, const std::string& text, int32_t n) {
    GenerationRequest r;
    r.prompt = tok.encode(text, true);
    r.n_predict = n;
    r.sampling.temperature = 0.0f;
    r.ignore_eos = true;
    return r;
}

// The target alone, through the engine (the path `kvrun run` takes without a draft).
GenerationResult run_engine(Model& m, const GenerationRequest& req) {
    Engine e(*m.backend, *m.tok, EngineOptions{});
    GenerationResult out;
    e.on_finish([&](const GenerationResult& r) { out = r; });
    e.submit(req);
    e.run();
    return out;
}

SpeculativeOptions fixed_k(int32_t k) {
    SpeculativeOptions o;
    o.draft_max = o.draft_min = k;
    return o;
}

}  // namespace

TEST_CASE("speculative_accept reproduces the target distribution on synthetic p and q") {
    // Fixed target/draft distributions per position (independent of the context): output
    // token j must then follow p[j] whatever happened before it.
    const int V = 6, K = 2;
    const std::vector<float> p = {0.30f, 0.05f, 0.25f, 0.00f, 0.30f, 0.10f,   // position 0
                                  0.10f, 0.40f, 0.10f, 0.20f, 0.10f, 0.10f,   // position 1
                                  0.50f, 0.10f, 0.10f, 0.10f, 0.10f, 0.10f};  // bonus
    const std::vector<float> q = {0.05f, 0.40f, 0.05f, 0.30f, 0.10f, 0.10f,
                                  0.30f, 0.10f, 0.30f, 0.10f, 0.10f, 0.10f};
    auto run = [&](AcceptRule rule, double& z0, double& z1) {
        Sampler rng(SamplingParams{.temperature = 1.0f, .seed = 42, .logit_bias = {}});
        std::mt19937_64 draw(7);
        std::discrete_distribution<int> q0(q.begin(), q.begin() + V), q1(q.begin() + V, q.end());
        std::map<int64_t, int64_t> first, second;
        const int64_t n = 60000;
        int64_t n_second = 0;
        for (int64_t i = 0; i < n; ++i) {
            std::vector<TokenId> drafts = {q0(draw), q1(draw)};
            SpecAcceptResult r = speculative_accept(p.data(), q.data(), drafts, V, rng, rule);
            REQUIRE(r.n_accepted >= 0);
            REQUIRE(r.n_accepted <= K);
            first[r.n_accepted > 0 ? drafts[0] : r.next]++;
            if (r.n_accepted >= 1) {
                second[r.n_accepted > 1 ? drafts[1] : r.next]++;
                ++n_second;
            }
        }
        std::map<int64_t, double> p0, p1;
        for (int t = 0; t < V; ++t) p0[t] = p[t], p1[t] = p[V + t];
        z0 = chi_square_z(first, p0, n);
        z1 = chi_square_z(second, p1, n_second);
    };
    double z0, z1;
    run(AcceptRule::Lossless, z0, z1);
    CHECK(z0 < 3.7);
    CHECK(z1 < 3.7);
    run(AcceptRule::AcceptAll, z0, z1);
    CHECK(z0 > 20);
    run(AcceptRule::ResampleTarget, z0, z1);
    CHECK(z0 > 20);

    // Greedy-shaped (one-hot) rows: accept exactly while the draft equals the argmax.
    std::vector<float> ph(3 * V, 0.0f), qh(2 * V, 0.0f);
    ph[2] = ph[V + 4] = ph[2 * V + 1] = 1.0f;
    qh[2] = qh[V + 5] = 1.0f;
    Sampler rng(SamplingParams{.temperature = 1.0f, .seed = 1, .logit_bias = {}});
    SpecAcceptResult r =
        speculative_accept(ph.data(), qh.data(), std::vector<TokenId>{2, 5}, V, rng);
    CHECK(r.n_accepted == 1);
    CHECK(r.next == 4);
    qh[V + 5] = 0, qh[V + 4] = 1;
    r = speculative_accept(ph.data(), qh.data(), std::vector<TokenId>{2, 4}, V, rng);
    CHECK(r.n_accepted == 2);
    CHECK(r.next == 1);
    CHECK_THROWS_AS(speculative_accept(ph.data(), qh.data(), std::vector<TokenId>{2, 9}, V, rng),
                    Error);
}

TEST_CASE("greedy speculation outputs exactly the target's tokens (K = 1, 4, 8, adaptive)") {
    struct Pair {
        const char *target, *draft;
        double lo, hi;  // acceptance bounds at K = 8 on the first prompt (llama.cpp's +- slack)
    };
    const std::vector<Pair> pairs = {
        {"stories260K.gguf", "stories260K-Q8_0.gguf", 0.85, 1.0},
        {"stories260K.gguf", "stories260K-Q4_0.gguf", 0.45, 0.75},
        {"stories260K.gguf", "stories260K-L4-F32.gguf", 0.08, 0.30},
        {"stories260K.gguf", "stories260K-L3-F32.gguf", 0.0, 0.10},
        {"stories260K-w256-F32.gguf", "stories260K-w256-pure-Q4_K_M.gguf", 0.65, 0.90},
    };
    for (const Pair& pr : pairs) {
        auto tpath = shared_path(std::string("models/") + pr.target);
        if (tpath.empty()) return;
        Model base = load(tpath), target = load(tpath);
        Model draft = load(shared_path(std::string("models/") + pr.draft));
        for (size_t pi = 0; pi < kPrompts.size(); ++pi) {
            GenerationRequest req = greedy_request(*target.tok, kPrompts[pi], 128);
            const GenerationResult want = run_engine(base, req);
            REQUIRE(want.tokens.size() == 128);
            for (int32_t k : {1, 4, 8, 0}) {
                if (k == 0 && pi > 0) continue;  // adaptive K: the first prompt is enough
                SpeculativeOptions o = k > 0 ? fixed_k(k) : SpeculativeOptions{};
                SpeculativeDecoder dec(*target.backend, *draft.backend, *target.tok, o);
                const GenerationResult got = dec.generate(req);
                const std::string draft_name = pr.draft;
                CAPTURE(draft_name);
                CAPTURE(pi);
                CAPTURE(k);
                CHECK(got.stop == StopReason::Length);
                CHECK(got.tokens == want.tokens);
                const SpeculativeStats& s = dec.stats();
                CHECK(s.generated == 128);
                CHECK(s.accepted <= s.drafted);
                // Every target pass yields the accepted drafts plus one token.
                CHECK(s.generated == s.accepted + s.target_passes);
                if (k == 8 && pi == 0) {
                    MESSAGE(std::string(pr.target)
                            << " <- " << std::string(pr.draft) << ": drafted " << s.drafted
                            << ", accepted " << s.accepted << " (" << 100.0 * s.acceptance()
                            << "%)");
                    CHECK(s.acceptance() >= pr.lo);
                    CHECK(s.acceptance() <= pr.hi);
                }
            }
        }
    }
}

TEST_CASE("greedy speculation stops like the engine (EOS, stop strings, context)") {
    auto tpath = shared_path("models/stories260K.gguf");
    if (tpath.empty()) return;
    Model base = load(tpath), target = load(tpath);
    Model draft = load(shared_path("models/stories260K-Q4_0.gguf"));
    SpeculativeDecoder dec(*target.backend, *draft.backend, *target.tok, SpeculativeOptions{});
    for (const auto& text : kPrompts) {
        GenerationRequest req = greedy_request(*target.tok, text, 400);
        req.ignore_eos = false;
        const GenerationResult want = run_engine(base, req);
        const GenerationResult got = dec.generate(req);
        CHECK(got.stop == want.stop);
        CHECK(got.tokens == want.tokens);
        req.stop_strings = {" ball", "park"};
        const GenerationResult want_s = run_engine(base, req), got_s = dec.generate(req);
        CHECK(got_s.stop == want_s.stop);
        CHECK(got_s.tokens == want_s.tokens);
    }
    // A context of 40 tokens: generation ends with stop "context" at exactly 40 tokens.
    SpeculativeOptions o;
    o.n_ctx = 40;
    SpeculativeDecoder small(*target.backend, *draft.backend, *target.tok, o);
    GenerationRequest req = greedy_request(*target.tok, kPrompts[0], -1);
    const GenerationResult r = small.generate(req);
    CHECK(r.stop == StopReason::Context);
    CHECK(r.tokens.size() + req.prompt.size() == 40);
    EngineOptions eo;
    eo.n_ctx = 40;
    Engine e(*base.backend, *base.tok, eo);
    GenerationResult want;
    e.on_finish([&](const GenerationResult& x) { want = x; });
    e.submit(req);
    e.run();
    CHECK(r.tokens == want.tokens);
    // n_predict 0 generates nothing; a bad request is refused before anything runs.
    req.n_predict = 0;
    CHECK(small.generate(req).tokens.empty());
    req.prompt.assign(45, 1);
    CHECK_THROWS_WITH_AS(small.generate(req), doctest::Contains("context"), Error);
    req.prompt = {1, 9999};
    CHECK_THROWS_WITH_AS(small.generate(req), doctest::Contains("outside the vocabulary"), Error);
}

TEST_CASE("sampling with speculation is lossless (chi-square on the first token and pairs)") {
    auto tpath = shared_path("models/stories260K.gguf");
    if (tpath.empty()) return;
    // Small blocks so that the prompt comes from the prefix cache after the first run.
    Model ref = load(tpath, 4, 64), target = load(tpath, 4, 64);
    Model draft = load(shared_path("models/stories260K-L3-F32.gguf"), 4, 64);
    const std::vector<TokenId> prompt =
        target.tok->encode("The little dog saw a big red ball. He", true);
    SamplingParams full = spec_test::full_softmax();  // the whole softmax at temperature 1
    SamplingParams filtered;  // llama.cpp's defaults (top-k 40, top-p 0.95, min-p 0.05, T 0.8)

    struct Outcome {
        double z_first = 0, z_pair = 0, acceptance = 0;
    };
    // n runs of two tokens (one round drafting K = 2: both come from the acceptance chain).
    auto measure = [&](const SamplingParams& params, AcceptRule rule, int64_t n, bool pairs) {
        SpeculativeOptions o = fixed_k(2);
        o.rule = rule;
        SpeculativeDecoder dec(*target.backend, *draft.backend, *target.tok, o);
        std::vector<std::pair<TokenId, TokenId>> draws;
        for (int64_t i = 0; i < n; ++i) {
            GenerationRequest req;
            req.prompt = prompt;
            req.n_predict = 3;
            req.ignore_eos = true;
            req.sampling = params;
            req.sampling.seed = 1 + uint64_t(i);
            const GenerationResult r = dec.generate(req);
            REQUIRE(r.tokens.size() == 3);
            draws.emplace_back(r.tokens[0], r.tokens[1]);
        }
        Outcome out;
        out.acceptance = dec.stats().acceptance();
        const spec_test::LosslessZ z = spec_test::lossless_z(ref, prompt, params, draws, pairs);
        out.z_first = z.z_first;
        out.z_pair = z.z_pair;
        return out;
    };

    const int64_t n = 3000;
    const Outcome ok_full = measure(full, AcceptRule::Lossless, n, true);
    MESSAGE("lossless, full softmax: z(first) " << ok_full.z_first << ", z(pair) " << ok_full.z_pair
                                                << ", acceptance " << ok_full.acceptance);
    CHECK(ok_full.z_first < 3.7);
    CHECK(ok_full.z_pair < 3.7);
    CHECK(ok_full.acceptance > 0.05);  // the draft is weak but the rule is exercised both ways
    CHECK(ok_full.acceptance < 0.95);
    const Outcome ok_filtered = measure(filtered, AcceptRule::Lossless, n, false);
    MESSAGE("lossless, filtered: z(first) " << ok_filtered.z_first);
    CHECK(ok_filtered.z_first < 3.7);

    // The same test catches broken acceptance rules.
    const Outcome all = measure(full, AcceptRule::AcceptAll, n / 2, false);
    const Outcome resample = measure(full, AcceptRule::ResampleTarget, n / 2, false);
    MESSAGE("broken: accept-all z " << all.z_first << ", resample-from-p z " << resample.z_first);
    CHECK(all.z_first > 10);
    CHECK(resample.z_first > 3.7);
}

TEST_CASE("KV accounting stays exact through a long run with many rollbacks") {
    auto tpath = shared_path("models/stories260K.gguf");
    if (tpath.empty()) return;
    Model target = load(tpath, 4, 256);
    Model draft = load(shared_path("models/stories260K-L4-F32.gguf"), 4, 256);
    SpeculativeDecoder dec(*target.backend, *draft.backend, *target.tok, SpeculativeOptions{});
    GenerationRequest req;
    req.prompt = target.tok->encode("Once upon a time", true);
    req.n_predict = 600;
    req.ignore_eos = true;
    req.sampling.temperature = 1.0f;
    req.sampling.seed = 3;
    dec.start(req);
    const auto& tt = dec.target_table();
    const auto& dt = dec.draft_table();
    auto blocks_for = [](int32_t n_tokens) { return (n_tokens + 3) / 4; };
    auto is_prefix = [&](const std::vector<TokenId>& a) {
        return a.size() <= dec.tokens().size() &&
               std::equal(a.begin(), a.end(), dec.tokens().begin());
    };
    int64_t steps = 0;
    bool exact = true;
    while (dec.step()) {
        ++steps;
        const int32_t n = static_cast<int32_t>(dec.tokens().size());
        // The target holds every token but the last (not run yet); the draft at most that.
        exact &= tt.n_tokens(dec.target_seq()) == n - 1;
        exact &= dt.n_tokens(dec.draft_seq()) <= n - 1;
        exact &= tt.n_used_blocks() == blocks_for(tt.n_tokens(dec.target_seq()));
        exact &= dt.n_used_blocks() == blocks_for(dt.n_tokens(dec.draft_seq()));
        exact &= is_prefix(tt.tokens(dec.target_seq())) && is_prefix(dt.tokens(dec.draft_seq()));
        if (!exact) break;
    }
    CHECK(exact);
    const SpeculativeStats s = dec.stats();
    CHECK(s.drafted - s.accepted > 200);  // plenty of rejected positions were rolled back
    CHECK(steps > 100);
    const GenerationResult r = dec.finish();
    CHECK(r.tokens.size() == 600);
    CHECK(r.stop == StopReason::Length);
    CHECK(tt.n_used_blocks() == 0);
    CHECK(dt.n_used_blocks() == 0);
    CHECK(tt.n_sequences() == 0);
    CHECK(dt.n_sequences() == 0);
    // Peak use never went beyond the accepted tokens plus one round of drafts.
    CHECK(tt.stats().peak_used_blocks <= blocks_for(int32_t(req.prompt.size()) + 600 + 8));

    // Same seed, same output (also with the prompt now in the prefix cache, and fresh).
    const GenerationResult again = dec.generate(req);
    CHECK(again.tokens == r.tokens);
    SpeculativeDecoder fresh(*target.backend, *draft.backend, *target.tok, SpeculativeOptions{});
    CHECK(fresh.generate(req).tokens == r.tokens);
}

TEST_CASE("incompatible draft vocabularies are refused with a clear error") {
    auto tpath = shared_path("models/stories260K.gguf");
    if (tpath.empty()) return;
    Model target = load(tpath);
    // Same size (512), different token texts.
    SyntheticModelConfig cfg;
    cfg.n_layer = 1;
    cfg.n_embd = 64;
    cfg.n_head = 2;
    cfg.n_head_kv = 2;
    cfg.n_ff = 128;
    cfg.n_vocab = 512;
    cfg.n_ctx = 256;
    const fs::path other = fs::temp_directory_path() / "kvrun_spec_other_vocab.gguf";
    synthetic_model_write(cfg, other.string());
    Model draft = load(other);
    REQUIRE(draft.tok->n_vocab() == 512);
    CHECK_THROWS_WITH_AS(check_vocab_compatible(*target.tok, *draft.tok),
                         doctest::Contains("differs from the target's: token"), Error);
    // Different sizes.
    auto big = shared_path("models/llama-2-tiny-random.gguf");
    Model llama = load(big);
    CHECK_THROWS_WITH_AS(check_vocab_compatible(*target.tok, *llama.tok),
                         doctest::Contains("vocabulary has 32000 tokens but the target's has 512"),
                         Error);
    CHECK_THROWS_AS(SpeculativeDecoder(*target.backend, *llama.backend, *target.tok, {}), Error);
    SpeculativeOptions bad;
    bad.draft_min = 9;
    CHECK_THROWS_WITH_AS(SpeculativeDecoder(*target.backend, *target.backend, *target.tok, bad),
                         doctest::Contains("--draft-min"), Error);

    // The CLI says so in one line.
    const std::string kv = test::kvrun_binary();
    auto r = test::run_command(kv + " run -m " + tpath.string() + " --draft-model " +
                               other.string() + " -p hi -n 4");
    CHECK(r.exit_code == 1);
    CHECK_MESSAGE(r.err.rfind("kvrun: error: --draft-model", 0) == 0, r.err);
    CHECK(r.err.find("differs from the target's") != std::string::npos);
    fs::remove(other);
}

TEST_CASE("kvrun run --draft-model: same text, stats, baseline, jsonl") {
    auto tpath = shared_path("models/stories260K.gguf");
    if (tpath.empty()) return;
    const auto dpath = shared_path("models/stories260K-Q8_0.gguf");
    const std::string kv = test::kvrun_binary();
    const std::string base =
        kv + " run -m " + tpath.string() + " -n 64 --temp 0 -p 'Once upon a time'";
    auto plain = test::run_command(base);
    REQUIRE(plain.exit_code == 0);
    auto spec = test::run_command(base + " --draft-model " + dpath.string() +
                                  " --draft-n 6 --stats --spec-baseline");
    CHECK(spec.exit_code == 0);
    CHECK(spec.out == plain.out);
    for (const char* needle : {"drafted", "accepted", "tokens per pass", "tokens/s", "speed-up",
                               "outputs identical", "KV blocks used"})
        CHECK_MESSAGE(spec.err.find(needle) != std::string::npos, needle << " in " << spec.err);
    // Prompt lookup instead of a draft model: the same text too.
    auto lookup = test::run_command(base + " --draft-ngram 3 --stats --spec-baseline");
    CHECK_MESSAGE(lookup.exit_code == 0, lookup.err);
    CHECK(lookup.out == plain.out);
    for (const char* needle : {"3-gram lookup", "drafted", "draft passes 0", "outputs identical"})
        CHECK_MESSAGE(lookup.err.find(needle) != std::string::npos, needle << " in " << lookup.err);
    auto both = test::run_command(base + " --draft-ngram 3 --draft-model " + dpath.string());
    CHECK(both.exit_code == 1);
    CHECK(both.err.find("excludes") != std::string::npos);
    auto help = test::run_command(kv + " run --help");
    for (const char* flag :
         {"--draft-model", "--draft-ngram", "--draft-n", "--draft-min", "--spec-baseline"})
        CHECK_MESSAGE(help.out.find(flag) != std::string::npos, flag);
    // Each sample speculates on its own (the engine forks the draft's sequence too): greedy
    // samples are all the target's text.
    auto samples = test::run_command(base + " --draft-model " + dpath.string() + " --n-samples 2");
    CHECK(samples.exit_code == 0);
    const std::string text = plain.out.substr(0, plain.out.size() - 1);
    CHECK(samples.out.find("--- sample 0 (64 tokens, stop: length) ---\n" + text) !=
          std::string::npos);
    CHECK(samples.out.find("--- sample 1 (64 tokens, stop: length) ---\n" + text) !=
          std::string::npos);

    const std::string jl = kv + " run --jsonl -m " + tpath.string();
    const std::string in =
        "{\"prompt\": \"Once upon a time\", \"n_predict\": 40, \"temperature\": 0}\n";
    auto a = test::run_command(jl, in);
    auto b = test::run_command(jl + " --draft-model " + dpath.string(), in);
    REQUIRE(a.exit_code == 0);
    REQUIRE(b.exit_code == 0);
    auto ja = nlohmann::json::parse(a.out), jb = nlohmann::json::parse(b.out);
    CHECK(ja["tokens"] == jb["tokens"]);
    CHECK(jb["speculative"]["drafted"].get<int64_t>() > 0);
}
