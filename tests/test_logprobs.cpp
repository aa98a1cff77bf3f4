// Log-probabilities of generated tokens (GenerationRequest::n_probs, --n-probs, JSON
// "n_probs"): the values are the softmax of the raw logits, the alternatives come most likely
// first, and through the engine they match the model's exact next-token distribution, equal
// each prompt alone in a batch, survive grammar constraints and speculation, and are reported
// in JSON.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common.h"
#include "engine.h"
#include "sampler.h"
#include "spec_test_util.h"
#include "test_util.h"

using namespace kvrun;
using spec_test::Model;

TEST_CASE("token_logprobs: softmax of the raw logits, most likely first, ties by lower id") {
    // probabilities 1/8, 3/8, 3/8, 1/8 (and a NaN that counts as -inf)
    const float l3 = std::log(3.0f);
    const std::vector<float> logits = {0.0f, l3, l3, 0.0f, NAN};
    TokenLogprobs lp = token_logprobs(logits.data(), 5, 3, 3);
    CHECK(lp.chosen.token == 3);
    CHECK(lp.chosen.logprob == doctest::Approx(std::log(1.0 / 8)).epsilon(1e-6));
    REQUIRE(lp.top.size() == 3);
    CHECK(lp.top[0].token == 1);
    CHECK(lp.top[1].token == 2);
    CHECK(lp.top[2].token == 0);
    CHECK(lp.top[0].logprob == doctest::Approx(std::log(3.0 / 8)).epsilon(1e-6));
    CHECK(token_logprobs(logits.data(), 5, 4, 0).chosen.logprob == -INFINITY);
    CHECK(token_logprobs(logits.data(), 5, 4, 0).top.empty());
    CHECK(token_logprobs(logits.data(), 5, 0, 99).top.size() == 5);  // at most the vocabulary
    // Large logits do not overflow.
    const std::vector<float> big = {1e30f, 1e30f};
    CHECK(token_logprobs(big.data(), 2, 0, 1).chosen.logprob ==
          doctest::Approx(std::log(0.5)).epsilon(1e-6));
    CHECK_THROWS_AS(token_logprobs(logits.data(), 5, 5, 1), Error);
    const std::vector<float> dead = {-INFINITY, NAN};
    CHECK_THROWS_AS(token_logprobs(dead.data(), 2, 0, 1), Error);
}

TEST_CASE("logprobs through the engine: the exact distribution, batch = alone, with speculation") {
    auto path = test::shared_path("models/stories260K.gguf");
    if (path.empty()) return;
    Model m = spec_test::load(path, 16, 256);
    Model ref = spec_test::load(path, 16, 64);
    auto run = [&](const std::vector<GenerationRequest>& reqs, int32_t parallel,
                   Backend* draft = nullptr) {
        EngineOptions eo;
        eo.max_parallel = parallel;
        // Even where sampling would happen on the device, logprobs need the logits here.
        eo.device_sampling = EngineOptions::DeviceSampling::On;
        if (draft) {
            eo.draft = draft;
            eo.draft_max = 4;
        }
        Engine engine(*m.backend, *m.tok, eo);
        std::vector<GenerationResult> out(reqs.size());
        engine.on_finish([&](const GenerationResult& r) { out[r.request] = r; });
        for (const auto& r : reqs) engine.submit(r);
        engine.run();
        CHECK(engine.stats().device_sampled_steps == 0);
        return out;
    };
    std::vector<GenerationRequest> reqs;
    for (const auto& p : spec_test::kPrompts) {
        GenerationRequest r;
        r.prompt = m.tok->encode(p, true);
        r.n_predict = 12;
        r.sampling.temperature = 0.0f;
        r.n_probs = 5;
        reqs.push_back(r);
    }
    auto alone = run(reqs, 1);
    auto batched = run(reqs, 4);
    for (size_t i = 0; i < reqs.size(); ++i) {
        const GenerationResult& r = alone[i];
        REQUIRE(r.logprobs.size() == r.tokens.size());
        for (size_t t = 0; t < r.tokens.size(); ++t) {
            const TokenLogprobs& lp = r.logprobs[t];
            CHECK(lp.chosen.token == r.tokens[t]);
            REQUIRE(lp.top.size() == 5);
            CHECK(lp.top[0].token == r.tokens[t]);  // greedy without penalties: the argmax
            CHECK(lp.top[0].logprob == lp.chosen.logprob);
            for (size_t k = 1; k < 5; ++k) CHECK(lp.top[k].logprob <= lp.top[k - 1].logprob);
            const TokenLogprobs& b = batched[i].logprobs[t];
            CHECK(b.chosen.logprob == lp.chosen.logprob);
        }
        // The first token's value is the model's exact next-token probability.
        const auto p = spec_test::exact_next_probs(ref, reqs[i].prompt, spec_test::full_softmax());
        CHECK(std::exp(r.logprobs[0].chosen.logprob) ==
              doctest::Approx(p[r.tokens[0]]).epsilon(1e-5));
    }
    // Speculation: accepted drafts carry the target's logprobs at their positions.
    Model draft = spec_test::load(test::shared_path("models/stories260K-Q8_0.gguf"), 16, 320);
    auto spec = run(reqs, 4, draft.backend.get());
    for (size_t i = 0; i < reqs.size(); ++i) {
        REQUIRE(spec[i].tokens == alone[i].tokens);
        CHECK(spec[i].n_accepted > 0);
        for (size_t t = 0; t < spec[i].tokens.size(); ++t)
            CHECK(spec[i].logprobs[t].chosen.logprob ==
                  doctest::Approx(alone[i].logprobs[t].chosen.logprob).epsilon(1e-4));
    }
    // Out of range is refused at submit.
    Engine engine(*m.backend, *m.tok, EngineOptions{});
    GenerationRequest bad = reqs[0];
    bad.n_probs = kMaxLogprobs + 1;
    CHECK_THROWS_WITH_AS(engine.submit(bad), doctest::Contains("n_probs must be between 0 and 100"),
                         Error);
}
