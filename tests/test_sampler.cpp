// Tests for Sampler: greedy, filter chain (top-k, top-p, min-p, repetition penalty),
// seeded determinism, and empirical frequencies against softmax(logits / T).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "common.h"
#include "sampler.h"

using kvrun::Sampler;
using kvrun::SamplingParams;
using kvrun::TokenId;

namespace {

SamplingParams no_filters(float temperature, uint64_t seed = 1) {
    SamplingParams p;
    p.temperature = temperature;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.0f;
    p.seed = seed;
    return p;
}

std::vector<float> random_logits(int n, uint64_t seed, float scale = 3.0f) {
    std::mt19937_64 rng(seed);
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = scale * (static_cast<float>(rng() % 20001) / 10000.0f - 1.0f);
    return v;
}

std::vector<double> softmax(const std::vector<float>& logits, double t) {
    double mx = *std::max_element(logits.begin(), logits.end());
    std::vector<double> p(logits.size());
    double z = 0;
    for (size_t i = 0; i < p.size(); ++i) z += p[i] = std::exp((logits[i] - mx) / t);
    for (auto& x : p) x /= z;
    return p;
}

int count_nonzero(const std::vector<float>& p) {
    return static_cast<int>(std::count_if(p.begin(), p.end(), [](float x) { return x > 0; }));
}

}  // namespace

TEST_CASE("sampler: greedy picks the argmax, lowest id on ties") {
    std::vector<float> logits = {0.1f, 2.0f, -1.0f, 2.0f, 1.9f};
    Sampler s(no_filters(0.0f));
    CHECK(s.greedy());
    CHECK(s.sample(logits.data(), 5, {}) == 1);
    CHECK_THROWS_AS(Sampler(no_filters(-1.0f)), kvrun::Error);  // negative is not greedy
    auto p = s.probabilities(logits.data(), 5, {});
    CHECK(p == std::vector<float>{0, 1, 0, 0, 0});
    // NaN and -inf logits are never chosen.
    std::vector<float> odd = {NAN, -INFINITY, 0.5f, NAN};
    CHECK(s.sample(odd.data(), 4, {}) == 2);
    std::vector<float> none = {NAN, -INFINITY};
    CHECK_THROWS_AS(s.sample(none.data(), 2, {}), kvrun::Error);
    CHECK_THROWS_AS(s.sample(nullptr, 2, {}), kvrun::Error);
    CHECK_THROWS_AS(s.sample(logits.data(), 0, {}), kvrun::Error);
}

TEST_CASE("sampler: top_k = 1 equals greedy") {
    for (uint64_t seed = 0; seed < 20; ++seed) {
        auto logits = random_logits(300, seed);
        SamplingParams p;  // llama.cpp defaults otherwise
        p.top_k = 1;
        p.temperature = 1.5f;
        p.seed = seed;
        Sampler topk(p), greedy(no_filters(0.0f));
        for (int i = 0; i < 5; ++i) {
            CHECK(topk.sample(logits.data(), 300, {}) == greedy.sample(logits.data(), 300, {}));
        }
    }
}

TEST_CASE("sampler: same seed, same tokens; different seed, different tokens") {
    auto logits = random_logits(1000, 7, 2.0f);
    SamplingParams p = no_filters(1.0f, 1234);
    Sampler a(p), b(p);
    p.seed = 4321;
    Sampler c(p);
    std::vector<TokenId> ta, tb, tc;
    for (int i = 0; i < 200; ++i) {
        ta.push_back(a.sample(logits.data(), 1000, {}));
        tb.push_back(b.sample(logits.data(), 1000, {}));
        tc.push_back(c.sample(logits.data(), 1000, {}));
    }
    CHECK(ta == tb);
    CHECK(ta != tc);
    // Fixed expectations: the RNG and the draw are our own code, so this holds everywhere.
    Sampler d(no_filters(1.0f, 1234));
    CHECK(d.sample(logits.data(), 1000, {}) == ta[0]);
    d.reseed(1234);
    CHECK(d.sample(logits.data(), 1000, {}) == ta[0]);
    Sampler u(no_filters(1.0f, 42));
    const double x = u.uniform();
    CHECK(x >= 0.0);
    CHECK(x < 1.0);
    CHECK(x == static_cast<double>(std::mt19937_64(42)() >> 11) * 0x1.0p-53);
}

TEST_CASE("sampler: empirical frequencies match softmax(logits / T)") {
    const std::vector<float> logits = {1.0f, 0.5f, 0.0f, -0.5f, 2.0f, 1.5f, -1.0f, 0.2f};
    const int n = static_cast<int>(logits.size());
    for (float t : {0.7f, 1.0f, 1.8f}) {
        CAPTURE(t);
        Sampler s(no_filters(t, 99));
        auto expect = softmax(logits, t);
        auto probs = s.probabilities(logits.data(), n, {});
        for (int i = 0; i < n; ++i) CHECK(probs[i] == doctest::Approx(expect[i]).epsilon(1e-5));
        const int draws = 40000;
        std::vector<int> counts(n, 0);
        for (int i = 0; i < draws; ++i) ++counts[s.sample(logits.data(), n, {})];
        double chi2 = 0;
        for (int i = 0; i < n; ++i) {
            const double e = expect[i] * draws;
            chi2 += (counts[i] - e) * (counts[i] - e) / e;
        }
        // 7 degrees of freedom: P(chi2 > 24.3) ~ 0.001.
        CHECK(chi2 < 24.3);
    }
}

TEST_CASE("sampler: sample() and sample_from(probabilities()) agree draw for draw") {
    auto logits = random_logits(500, 3);
    SamplingParams p;
    p.top_k = 60;
    p.seed = 77;
    Sampler a(p), b(p), probe(p);
    for (int i = 0; i < 300; ++i) {
        auto probs = probe.probabilities(logits.data(), 500, {});
        CHECK(a.sample(logits.data(), 500, {}) == b.sample_from(probs.data(), 500));
    }
    std::vector<float> bad = {0.5f, -0.1f};
    CHECK_THROWS_AS(b.sample_from(bad.data(), 2), kvrun::Error);
    std::vector<float> zeros = {0.0f, 0.0f};
    CHECK_THROWS_AS(b.sample_from(zeros.data(), 2), kvrun::Error);
    std::vector<float> one_hot = {0.0f, 0.0f, 3.0f};
    CHECK(b.sample_from(one_hot.data(), 3) == 2);
}

TEST_CASE("sampler: top-k keeps exactly k tokens, ties broken by lower id") {
    std::vector<float> logits = {1, 3, 3, 0, 2, 3};
    SamplingParams p = no_filters(1.0f);
    p.top_k = 2;
    Sampler s(p);
    auto probs = s.probabilities(logits.data(), 6, {});
    CHECK(count_nonzero(probs) == 2);
    CHECK(probs[1] == doctest::Approx(0.5));
    CHECK(probs[2] == doctest::Approx(0.5));
    CHECK(probs[5] == 0.0f);
    p.top_k = 100;  // larger than the vocabulary: no-op
    Sampler all(p);
    CHECK(count_nonzero(all.probabilities(logits.data(), 6, {})) == 6);
}

TEST_CASE("sampler: top-p keeps the smallest head reaching p") {
    // Probabilities 0.5, 0.25, 0.125, 0.0625, 0.0625.
    std::vector<float> logits = {std::log(0.5f), std::log(0.25f), std::log(0.125f),
                                 std::log(0.0625f), std::log(0.0625f)};
    SamplingParams p = no_filters(1.0f);
    p.top_p = 0.7f;  // 0.5 < 0.7 <= 0.75: two tokens
    auto probs = Sampler(p).probabilities(logits.data(), 5, {});
    CHECK(count_nonzero(probs) == 2);
    CHECK(probs[0] == doctest::Approx(2.0 / 3.0));
    CHECK(probs[1] == doctest::Approx(1.0 / 3.0));
    p.top_p = 0.8f;
    CHECK(count_nonzero(Sampler(p).probabilities(logits.data(), 5, {})) == 3);
    p.top_p = 0.0f;  // keeps at least one
    CHECK(count_nonzero(Sampler(p).probabilities(logits.data(), 5, {})) == 1);
    p.top_p = 1.0f;
    CHECK(count_nonzero(Sampler(p).probabilities(logits.data(), 5, {})) == 5);
    // top-p judges the untempered distribution (temperature comes last).
    p.top_p = 0.7f;
    p.temperature = 5.0f;
    CHECK(count_nonzero(Sampler(p).probabilities(logits.data(), 5, {})) == 2);
}

TEST_CASE("sampler: min-p drops tokens below min_p times the best") {
    std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.1f), std::log(0.06f),
                                 std::log(0.04f)};
    SamplingParams p = no_filters(1.0f);
    p.min_p = 0.15f;  // threshold 0.075: keeps 0.5, 0.3, 0.1
    auto probs = Sampler(p).probabilities(logits.data(), 5, {});
    CHECK(count_nonzero(probs) == 3);
    CHECK(probs[3] == 0.0f);
    CHECK(probs[2] == doctest::Approx(0.1 / 0.9));
    p.min_p = 1.0f;
    CHECK(count_nonzero(Sampler(p).probabilities(logits.data(), 5, {})) == 1);
    // Default chain: all filters together still sum to one.
    SamplingParams d;
    auto big = random_logits(5000, 11, 6.0f);
    auto dp = Sampler(d).probabilities(big.data(), 5000, {});
    CHECK(std::accumulate(dp.begin(), dp.end(), 0.0) == doctest::Approx(1.0));
    CHECK(count_nonzero(dp) <= 40);
    CHECK(count_nonzero(dp) >= 1);
}

TEST_CASE("sampler: repetition penalty changes the choice") {
    std::vector<float> logits = {2.0f, 1.5f, -1.0f, -1.2f};
    SamplingParams p = no_filters(0.0f);
    p.repeat_penalty = 1.5f;
    Sampler s(p);
    std::vector<TokenId> recent = {0, 0, 3};
    CHECK(Sampler(no_filters(0.0f)).sample(logits.data(), 4, recent) == 0);
    CHECK(s.sample(logits.data(), 4, recent) == 1);  // 2.0 / 1.5 = 1.33 < 1.5
    // Negative logits are multiplied: token 3 falls further behind token 2.
    p.temperature = 1.0f;
    Sampler t(p);
    auto probs = t.probabilities(logits.data(), 4, recent);
    std::vector<float> expect_logits = {2.0f / 1.5f, 1.5f, -1.0f, -1.2f * 1.5f};
    auto expect = softmax(expect_logits, 1.0);
    for (int i = 0; i < 4; ++i) CHECK(probs[i] == doctest::Approx(expect[i]).epsilon(1e-5));
    // Only the last repeat_last_n tokens count.
    p.temperature = 0.0f;
    p.repeat_last_n = 2;
    std::vector<TokenId> old_zero = {0, 3, 2};
    CHECK(Sampler(p).sample(logits.data(), 4, old_zero) == 0);
    p.repeat_last_n = 0;
    CHECK(Sampler(p).sample(logits.data(), 4, recent) == 0);
    std::vector<TokenId> bad = {7};
    CHECK_THROWS_AS(s.sample(logits.data(), 4, bad), kvrun::Error);
}

TEST_CASE(
    "sampler: frequency and presence penalties subtract count x f + p, after the repeat "
    "penalty") {
    std::vector<float> logits = {2.0f, 1.5f, -1.0f, -1.2f, 0.5f};
    const std::vector<TokenId> recent = {0, 3, 0, 4, 0};  // 0 three times, 3 and 4 once
    SamplingParams p = no_filters(1.0f);
    p.frequency_penalty = 0.25f;
    p.presence_penalty = 0.5f;
    auto probs = Sampler(p).probabilities(logits.data(), 5, recent);
    std::vector<float> expect_logits = {2.0f - (3 * 0.25f + 0.5f), 1.5f, -1.0f,
                                        -1.2f - (0.25f + 0.5f), 0.5f - (0.25f + 0.5f)};
    auto expect = softmax(expect_logits, 1.0);
    for (int i = 0; i < 5; ++i) CHECK(probs[i] == doctest::Approx(expect[i]).epsilon(1e-5));
    // With the repeat penalty too (llama.cpp's order): divide or multiply, then subtract.
    p.repeat_penalty = 2.0f;
    probs = Sampler(p).probabilities(logits.data(), 5, recent);
    expect_logits = {2.0f / 2 - (3 * 0.25f + 0.5f), 1.5f, -1.0f, -1.2f * 2 - (0.25f + 0.5f),
                     0.5f / 2 - (0.25f + 0.5f)};
    expect = softmax(expect_logits, 1.0);
    for (int i = 0; i < 5; ++i) CHECK(probs[i] == doctest::Approx(expect[i]).epsilon(1e-5));
    // The window is repeat_last_n: the last two tokens are 4 and 0, once each.
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 2;
    probs = Sampler(p).probabilities(logits.data(), 5, recent);
    expect_logits = {2.0f - 0.75f, 1.5f, -1.0f, -1.2f, 0.5f - 0.75f};
    expect = softmax(expect_logits, 1.0);
    for (int i = 0; i < 5; ++i) CHECK(probs[i] == doctest::Approx(expect[i]).epsilon(1e-5));
    // Greedy: a frequency penalty moves the choice off a token the text keeps repeating;
    // a negative presence penalty pulls it back.
    SamplingParams g = no_filters(0.0f);
    g.frequency_penalty = 0.2f;
    CHECK(Sampler(no_filters(0.0f)).sample(logits.data(), 5, recent) == 0);
    CHECK(Sampler(g).sample(logits.data(), 5, recent) == 1);  // 2.0 - 0.6 < 1.5
    g.presence_penalty = -0.5f;
    CHECK(Sampler(g).sample(logits.data(), 5, recent) == 0);
    // A huge penalty leaves the token a finite candidate, never NaN or an empty set.
    SamplingParams h = no_filters(1.0f);
    h.presence_penalty = 3e38f;
    h.frequency_penalty = 3e38f;
    const std::vector<TokenId> all = {0, 1, 2, 3, 4};
    probs = Sampler(h).probabilities(logits.data(), 5, all);
    CHECK(std::accumulate(probs.begin(), probs.end(), 0.0) == doctest::Approx(1.0));
    for (float x : probs) CHECK(std::isfinite(x));
}

TEST_CASE("sampler: invalid parameters are rejected") {
    SamplingParams p;
    p.temperature = NAN;
    CHECK_THROWS_AS(Sampler{p}, kvrun::Error);
    p = {};
    p.repeat_penalty = 0.0f;
    CHECK_THROWS_AS(Sampler{p}, kvrun::Error);
    p = {};
    p.top_p = -0.5f;
    CHECK_THROWS_AS(Sampler{p}, kvrun::Error);
    p = {};
    p.min_p = NAN;
    CHECK_THROWS_AS(Sampler{p}, kvrun::Error);
    p = {};
    p.repeat_last_n = -2;
    CHECK_THROWS_AS(Sampler{p}, kvrun::Error);
}

TEST_CASE("sampling_validate: each range, its edges and the message") {
    auto message = [](auto change) -> std::string {
        SamplingParams p;
        change(p);
        try {
            kvrun::sampling_validate(p);
        } catch (const kvrun::Error& e) {
            return e.what();
        }
        return "";
    };
    using P = SamplingParams&;
    CHECK(message([](P) {}).empty());  // the defaults are valid
    // Edges that are valid: greedy, filters off, the strongest filters.
    CHECK(message([](P p) { p.temperature = 0.0f; }).empty());
    CHECK(message([](P p) { p.temperature = 100.0f; }).empty());
    CHECK(message([](P p) { p.top_k = 0; }).empty());
    CHECK(message([](P p) { p.top_p = 0.0f; }).empty());
    CHECK(message([](P p) { p.top_p = 1.0f; }).empty());
    CHECK(message([](P p) { p.min_p = 0.0f; }).empty());
    CHECK(message([](P p) { p.min_p = 1.0f; }).empty());
    CHECK(message([](P p) { p.repeat_penalty = 0.01f; }).empty());
    CHECK(message([](P p) { p.repeat_last_n = -1; }).empty());
    CHECK(message([](P p) { p.repeat_last_n = 0; }).empty());

    CHECK(message([](P p) { p.temperature = -1.0f; }) ==
          "temperature must be a finite number >= 0 (got -1; 0 is greedy)");
    CHECK(message([](P p) { p.temperature = INFINITY; }).find("temperature") == 0);
    CHECK(message([](P p) { p.top_k = -3; }) == "top-k must be >= 0 (got -3; 0 disables it)");
    CHECK(message([](P p) { p.top_p = 2.0f; }) ==
          "top-p must be between 0 and 1 (got 2; 1 disables it)");
    CHECK(message([](P p) { p.top_p = NAN; }).find("top-p") == 0);
    CHECK(message([](P p) { p.min_p = -1.0f; }) ==
          "min-p must be between 0 and 1 (got -1; 0 disables it)");
    CHECK(message([](P p) { p.min_p = 1.5f; }).find("min-p") == 0);
    CHECK(message([](P p) { p.repeat_penalty = 0.0f; }) ==
          "repeat penalty must be a finite number > 0 (got 0; 1 disables it)");
    CHECK(message([](P p) { p.repeat_penalty = -2.0f; }).find("repeat penalty") == 0);
    CHECK(message([](P p) { p.repeat_penalty = INFINITY; }).find("repeat penalty") == 0);
    CHECK(message([](P p) { p.repeat_last_n = -2; }).find("repeat-last-n must be >= -1") == 0);
    CHECK(message([](P p) { p.frequency_penalty = -2.0f; }).empty());  // any finite value
    CHECK(message([](P p) { p.presence_penalty = 2.0f; }).empty());
    CHECK(message([](P p) { p.frequency_penalty = NAN; }) ==
          "frequency penalty must be a finite number (got nan; 0 disables it)");
    CHECK(message([](P p) { p.presence_penalty = -INFINITY; }) ==
          "presence penalty must be a finite number (got -inf; 0 disables it)");

    // The constructor applies the same rule.
    SamplingParams bad;
    bad.top_k = -1;
    CHECK_THROWS_WITH_AS(Sampler{bad}, "top-k must be >= 0 (got -1; 0 disables it)", kvrun::Error);
}

TEST_CASE("sample_with(u) picks what sample() picks when u is the RNG's next number") {
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.0f, 2.0f);
    std::vector<float> logits(300);
    for (auto& l : logits) l = nd(rng);
    const std::vector<TokenId> recent = {3, 7, 7, 250};
    for (float temp : {0.0f, 0.7f, 1.5f}) {
        SamplingParams p;
        p.temperature = temp;
        p.repeat_penalty = 1.2f;
        p.seed = 77;
        Sampler a(p), b(p), c(p);
        for (int i = 0; i < 50; ++i) {
            const TokenId x = a.sample(logits.data(), 300, recent);
            const double u = temp > 0 ? b.uniform() : 0.0;
            CHECK(c.sample_with(logits.data(), 300, recent, u) == x);
        }
    }
}

TEST_CASE("logit bias: added before everything else; -inf bans; ids listed twice are summed") {
    const std::vector<float> logits = {1.0f, 2.0f, 3.0f, 0.5f};
    SamplingParams p = no_filters(0.0f);
    p.logit_bias = {{2, -INFINITY}};
    CHECK(Sampler(p).sample(logits.data(), 4, {}) == 1);
    p.logit_bias = {{0, 1.5f}, {0, 1.0f}};  // 1 + 2.5 = 3.5 beats 3
    CHECK(Sampler(p).sample(logits.data(), 4, {}) == 0);
    // Before the repetition penalty: (2 + 2) / 2 = 2 < 3, token 2 stays the best.
    p.logit_bias = {{1, 2.0f}};
    p.repeat_penalty = 2.0f;
    const std::vector<TokenId> recent = {1};
    CHECK(Sampler(p).sample(logits.data(), 4, recent) == 2);
    // The distribution equals the one of the biased logits, bit for bit.
    SamplingParams s = no_filters(0.7f);
    s.top_k = 3;
    s.logit_bias = {{3, 2.25f}, {1, -0.5f}, {3, 0.25f}};
    const std::vector<float> biased = {1.0f, 1.5f, 3.0f, 3.0f};
    SamplingParams plain = s;
    plain.logit_bias.clear();
    CHECK(Sampler(s).probabilities(logits.data(), 4, {}) ==
          Sampler(plain).probabilities(biased.data(), 4, {}));
    CHECK(kvrun::merged_logit_bias(s, 4) ==
          std::vector<std::pair<TokenId, float>>{{1, -0.5f}, {3, 2.5f}});
    // Bad values and ids.
    s.logit_bias = {{1, NAN}};
    CHECK_THROWS_WITH_AS(Sampler{s}, doctest::Contains("logit bias of token 1 must be"),
                         kvrun::Error);
    s.logit_bias = {{1, INFINITY}};
    CHECK_THROWS_AS(Sampler{s}, kvrun::Error);
    s.logit_bias = {{4, 1.0f}};
    Sampler out_of_range(s);
    CHECK_THROWS_WITH_AS(out_of_range.sample(logits.data(), 4, {}),
                         doctest::Contains("token id 4 is outside the vocabulary"), kvrun::Error);
    s.logit_bias = {{0, -INFINITY}, {1, -INFINITY}, {2, -INFINITY}, {3, -INFINITY}};
    Sampler all_banned(s);
    CHECK_THROWS_WITH_AS(all_banned.sample(logits.data(), 4, {}),
                         doctest::Contains("banned by a logit bias"), kvrun::Error);
}
