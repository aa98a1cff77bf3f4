// Tests for the sampler's llama.cpp extras: DRY (against a brute-force reference, with
// single- and multi-token sequence breakers), top-n-sigma, locally typical sampling, XTC (its
// coin folded into the distribution), dynamic temperature; their validation, greedy's rule,
// that draws agree with the distribution they report; through the engine, DRY with drafts and
// batches, and sampling with all of them under speculation still lossless.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "common.h"
#include "engine.h"
#include "sampler.h"
#include "spec_test_util.h"
#include "test_util.h"

using kvrun::Sampler;
using kvrun::sampler_order_name;
using kvrun::sampler_order_parse;
using kvrun::sampler_seq_parse;
using kvrun::SamplerStep;
using kvrun::sampling_needs_host;
using kvrun::sampling_validate;
using kvrun::SamplingParams;
using kvrun::TokenId;

namespace {

SamplingParams plain(float temperature = 1.0f) {
    SamplingParams p;
    p.temperature = temperature;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = 3;
    return p;
}

SamplingParams dry(float multiplier, int allowed, int last_n, std::vector<std::string> breakers) {
    SamplingParams p = plain();
    p.dry_multiplier = multiplier;
    p.dry_allowed_length = allowed;
    p.dry_penalty_last_n = last_n;
    p.dry_sequence_breakers = std::move(breakers);
    return p;
}

// DRY by its definition: for every earlier position j, the longest n such that the n tokens
// ending at j equal the last n tokens, none of those last n at or before a breaker token.
std::map<TokenId, float> dry_reference(const SamplingParams& p, std::vector<TokenId> w,
                                       const std::vector<std::string>& pieces) {
    if (p.dry_penalty_last_n > 0 && w.size() > size_t(p.dry_penalty_last_n))
        w.erase(w.begin(), w.end() - p.dry_penalty_last_n);
    const int n = static_cast<int>(w.size());
    int limit = n;
    for (int j = n - 1; j >= 0; --j) {
        bool breaker = false;
        for (const auto& b : p.dry_sequence_breakers)
            breaker |= pieces[size_t(w[size_t(j)])].find(b) != std::string::npos;
        if (breaker) {
            limit = n - 1 - j;
            break;
        }
    }
    std::map<TokenId, int> run;
    for (int j = 0; j + 1 < n; ++j) {
        int len = 0;
        while (len <= j && len < limit && w[size_t(j - len)] == w[size_t(n - 1 - len)]) ++len;
        if (len >= p.dry_allowed_length)
            run[w[size_t(j + 1)]] = std::max(run[w[size_t(j + 1)]], len);
    }
    std::map<TokenId, float> out;
    for (const auto& [t, len] : run)
        out[t] = static_cast<float>(p.dry_multiplier *
                                    std::pow(double(p.dry_base), len - p.dry_allowed_length));
    return out;
}

std::vector<double> softmax(const std::vector<float>& logits, double t = 1.0) {
    const double mx = *std::max_element(logits.begin(), logits.end());
    std::vector<double> p(logits.size());
    double z = 0;
    for (size_t i = 0; i < p.size(); ++i) z += p[i] = std::exp((logits[i] - mx) / t);
    for (auto& x : p) x /= z;
    return p;
}

std::vector<TokenId> kept(const std::vector<float>& probs) {
    std::vector<TokenId> out;
    for (size_t i = 0; i < probs.size(); ++i)
        if (probs[i] > 0) out.push_back(static_cast<TokenId>(i));
    return out;
}

}  // namespace

TEST_CASE("DRY: penalties equal the brute-force definition on random sequences") {
    // Tokens 0-3 are letters, 4 is "\n" (a breaker), 5 is "x:" (contains the breaker ":").
    const std::vector<std::string> pieces = {"a", "b", "c", "d", "\n", "x:"};
    std::mt19937_64 rng(7);
    int with_penalty = 0;
    for (int trial = 0; trial < 3000; ++trial) {
        const int len = 1 + int(rng() % 60);
        const int alphabet = 2 + int(rng() % 3);
        std::vector<TokenId> w(static_cast<size_t>(len));
        for (auto& t : w) t = rng() % 25 == 0 ? TokenId(4 + rng() % 2) : TokenId(rng() % alphabet);
        const int allowed = 1 + int(rng() % 3);
        const int last_n = rng() % 3 == 0 ? int(1 + rng() % 40) : -1;
        SamplingParams p = dry(0.8f, allowed, last_n, {"\n", ":"});
        p.dry_base = 1.5f;
        CAPTURE(trial);
        const auto got = kvrun::dry_penalties(p, w, &pieces);
        const auto want = dry_reference(p, w, pieces);
        REQUIRE(got.size() == want.size());
        for (const auto& [t, pen] : got) {
            REQUIRE(want.count(t));
            CHECK(pen == doctest::Approx(want.at(t)).epsilon(1e-6));
        }
        with_penalty += !got.empty();
    }
    CHECK(with_penalty > 1000);  // the cases exercise the penalty, not only its absence
}

TEST_CASE("DRY: a repeated phrase is penalized, growing with its length; breakers cut it") {
    const std::vector<std::string> pieces = {"a", " b", " c", " d", ".", "#", "e"};
    // a b c d a b c -> d would repeat "a b c d": run 3, allowed 2: 0.8 * 1.75^1.
    std::vector<TokenId> w = {0, 1, 2, 3, 0, 1, 2};
    auto pen = kvrun::dry_penalties(dry(0.8f, 2, -1, {"."}), w, &pieces);
    REQUIRE(pen.size() == 1);
    CHECK(pen[0].first == 3);
    CHECK(pen[0].second == doctest::Approx(0.8 * 1.75));
    // Shorter than allowed: nothing.
    CHECK(kvrun::dry_penalties(dry(0.8f, 4, -1, {"."}), w, &pieces).empty());
    // The window sees only the last 4 tokens: "d a b c" has no earlier "a b c".
    CHECK(kvrun::dry_penalties(dry(0.8f, 2, 4, {"."}), w, &pieces).empty());
    // A breaker inside the repeated run limits it to the tokens after the breaker.
    std::vector<TokenId> cut = {0, 4, 1, 2, 3, 0, 4, 1, 2};  // a . b c d a . b c
    auto p1 = kvrun::dry_penalties(dry(1.0f, 2, -1, {"."}), cut, &pieces);
    REQUIRE(p1.size() == 1);
    CHECK(p1[0].second == doctest::Approx(1.0));  // run 2 ("b c"), not 4
    auto p0 = kvrun::dry_penalties(dry(1.0f, 2, -1, {}), cut, &pieces);
    REQUIRE(p0.size() == 1);
    CHECK(p0[0].second == doctest::Approx(std::pow(1.75, 2)));  // run 4 without breakers
    // A breaker spelled by two tokens ("##") counts where its second token completes it.
    std::vector<TokenId> hash = {0, 5, 5, 1, 6, 0, 5, 5, 1};  // a # # b e a # # b
    CHECK(kvrun::dry_penalties(dry(1.0f, 2, -1, {"##"}), hash, &pieces).empty());
    CHECK(kvrun::dry_penalties(dry(1.0f, 2, -1, {"#a"}), hash, &pieces).size() == 1);
    // The last token itself a breaker: no run at all.
    std::vector<TokenId> ends = {0, 1, 4, 0, 1, 4};
    CHECK(kvrun::dry_penalties(dry(1.0f, 1, -1, {"."}), ends, &pieces).empty());
    // Ids outside the vocabulary anywhere in the window are an Error, not a stray read
    // (found by fuzz/fuzz_sampler.cpp).
    CHECK_THROWS_AS(
        kvrun::dry_penalties(dry(1.0f, 2, -1, {"."}), std::vector<TokenId>{0, -3, 1, 0}, &pieces),
        kvrun::Error);
    CHECK_THROWS_AS(
        kvrun::dry_penalties(dry(1.0f, 2, -1, {"."}), std::vector<TokenId>{0, 99, 1, 0}, &pieces),
        kvrun::Error);
    // Breakers need the token texts.
    CHECK_THROWS_AS(kvrun::dry_penalties(dry(1.0f, 2, -1, {"."}), w, nullptr), kvrun::Error);
    CHECK(kvrun::dry_penalties(dry(1.0f, 2, -1, {}), w, nullptr).size() == 1);
    // Huge exponents stay finite.
    std::vector<TokenId> long_run(3000, 0);
    auto big = kvrun::dry_penalties(dry(1.0f, 1, -1, {}), long_run, nullptr);
    REQUIRE(big.size() == 1);
    CHECK(std::isfinite(big[0].second));
}

TEST_CASE("DRY in the sampler: subtracted after the penalties, greedy follows it") {
    const std::vector<std::string> pieces = {"a", " b", " c", " d", "."};
    std::vector<float> logits = {1.0f, 1.0f, 1.0f, 3.0f, 2.5f};
    std::vector<TokenId> w = {0, 1, 2, 3, 0, 1, 2};
    SamplingParams p = dry(0.8f, 2, -1, {"."});
    p.temperature = 0.0f;
    Sampler s(p);
    s.set_token_pieces(&pieces);
    CHECK(s.sample(logits.data(), 5, w) == 4);  // 3 - 1.4 < 2.5
    p.dry_multiplier = 0.0f;
    CHECK(Sampler(p).sample(logits.data(), 5, w) == 3);
    // Probabilities at temperature 1: logit of d lowered by exactly 1.4.
    p = dry(0.8f, 2, -1, {"."});
    Sampler t(p);
    t.set_token_pieces(&pieces);
    auto probs = t.probabilities(logits.data(), 5, w);
    auto want = softmax({1.0f, 1.0f, 1.0f, 3.0f - 1.4f, 2.5f});
    for (int i = 0; i < 5; ++i) CHECK(probs[size_t(i)] == doctest::Approx(want[size_t(i)]));
    // Without the token texts, a sampler with breakers refuses to guess.
    Sampler blind(p);
    CHECK_THROWS_AS(blind.sample(logits.data(), 5, w), kvrun::Error);
}

TEST_CASE("top-n-sigma keeps the logits within n standard deviations of the best") {
    // mean 3.2, standard deviation sqrt(12.56) = 3.544
    const std::vector<float> logits = {0, 1, 2, 3, 10};
    SamplingParams p = plain();
    p.top_n_sigma = 1.0f;  // >= 6.456
    CHECK(kept(Sampler(p).probabilities(logits.data(), 5, {})) == std::vector<TokenId>{4});
    p.top_n_sigma = 2.0f;  // >= 2.91
    CHECK(kept(Sampler(p).probabilities(logits.data(), 5, {})) == std::vector<TokenId>{3, 4});
    p.top_n_sigma = 3.0f;  // >= -0.63
    CHECK(kept(Sampler(p).probabilities(logits.data(), 5, {})).size() == 5);
    p.top_n_sigma = 0.0f;  // off
    CHECK(kept(Sampler(p).probabilities(logits.data(), 5, {})).size() == 5);
    // It runs before top-k: top-k 1 of what is left.
    p.top_n_sigma = 2.0f;
    p.top_k = 1;
    CHECK(kept(Sampler(p).probabilities(logits.data(), 5, {})) == std::vector<TokenId>{4});
}

TEST_CASE("typical sampling keeps the tokens whose surprise is nearest the entropy") {
    std::mt19937_64 rng(11);
    for (int trial = 0; trial < 200; ++trial) {
        const int n = 2 + int(rng() % 30);
        std::vector<float> logits(static_cast<size_t>(n));
        for (auto& l : logits) l = float(rng() % 1000) / 150.0f;
        const float tp = float(rng() % 1000) / 1000.0f;
        // Reference: sort by |-log p - H|, keep the shortest prefix reaching tp.
        auto pr = softmax(logits);
        double h = 0;
        for (double x : pr) h -= x * std::log(x);
        std::vector<int> order(static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) order[size_t(i)] = i;
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
            const double da = std::abs(-std::log(pr[size_t(a)]) - h);
            const double db = std::abs(-std::log(pr[size_t(b)]) - h);
            return da < db;
        });
        std::vector<TokenId> want;
        double cum = 0;
        for (int i : order) {
            want.push_back(i);
            cum += pr[size_t(i)];
            if (cum >= tp) break;
        }
        std::sort(want.begin(), want.end());
        SamplingParams p = plain();
        p.typical_p = tp;
        CAPTURE(trial);
        const auto probs = Sampler(p).probabilities(logits.data(), n, {});
        const auto got = kept(probs);
        // Exact ties in |surprise - entropy| may order differently; then only the mass agrees.
        if (got != want) {
            double got_mass = 0, want_mass = 0;
            for (TokenId t : got) got_mass += pr[size_t(t)];
            for (TokenId t : want) want_mass += pr[size_t(t)];
            CHECK(got_mass == doctest::Approx(want_mass).epsilon(1e-5));
        }
        // Renormalized among the kept ones.
        double z = 0;
        for (TokenId t : got) z += pr[size_t(t)];
        for (TokenId t : got) CHECK(probs[size_t(t)] == doctest::Approx(pr[size_t(t)] / z));
    }
    // The argmax may be dropped: probabilities 0.4, 0.2, 0.2, 0.2 have entropy 1.33; the
    // surprise of 0.2 (1.61) is nearer than that of 0.4 (0.92).
    std::vector<float> lopsided = {std::log(0.4f), std::log(0.2f), std::log(0.2f), std::log(0.2f)};
    SamplingParams p = plain();
    p.typical_p = 0.5f;
    auto probs = Sampler(p).probabilities(lopsided.data(), 4, {});
    CHECK(kept(probs) == std::vector<TokenId>{1, 2, 3});
    p.typical_p = 1.0f;  // off
    CHECK(kept(Sampler(p).probabilities(lopsided.data(), 4, {})).size() == 4);
}

TEST_CASE("XTC drops the top choices but the least likely of them, with its probability") {
    // probabilities 0.5, 0.3, 0.15, 0.05
    const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f),
                                       std::log(0.05f)};
    SamplingParams p = plain();
    p.xtc_threshold = 0.1f;
    p.xtc_probability = 1.0f;  // three above 0.1: 0 and 1 go
    auto probs = Sampler(p).probabilities(logits.data(), 4, {});
    CHECK(probs[0] == 0.0f);
    CHECK(probs[1] == 0.0f);
    CHECK(probs[2] == doctest::Approx(0.75));
    CHECK(probs[3] == doctest::Approx(0.25));
    p.xtc_probability = 0.4f;  // the mixture of both outcomes
    probs = Sampler(p).probabilities(logits.data(), 4, {});
    CHECK(probs[0] == doctest::Approx(0.6 * 0.5));
    CHECK(probs[1] == doctest::Approx(0.6 * 0.3));
    CHECK(probs[2] == doctest::Approx(0.6 * 0.15 + 0.4 * 0.75));
    CHECK(probs[3] == doctest::Approx(0.6 * 0.05 + 0.4 * 0.25));
    p.xtc_threshold = 0.4f;  // only one token above: nothing happens
    probs = Sampler(p).probabilities(logits.data(), 4, {});
    CHECK(probs[0] == doctest::Approx(0.5));
    // After the temperature-free min-p, before the temperature: at T 0.5 the survivors are
    // 0.15^2 : 0.05^2.
    p.xtc_threshold = 0.1f;
    p.xtc_probability = 1.0f;
    p.temperature = 0.5f;
    probs = Sampler(p).probabilities(logits.data(), 4, {});
    CHECK(probs[2] == doctest::Approx(0.0225 / 0.025));
    // Greedy ignores it.
    p.temperature = 0.0f;
    CHECK(Sampler(p).sample(logits.data(), 4, {}) == 0);

    // The draws follow the mixture.
    p = plain();
    p.xtc_threshold = 0.1f;
    p.xtc_probability = 0.4f;
    Sampler s(p);
    std::vector<int> count(4);
    const int n = 40000;
    for (int i = 0; i < n; ++i) count[size_t(s.sample(logits.data(), 4, {}))]++;
    const double want[] = {0.3, 0.18, 0.39, 0.13};
    for (int i = 0; i < 4; ++i)
        CHECK(std::abs(count[size_t(i)] / double(n) - want[i]) < 4.5 * std::sqrt(want[i] / n));
}

TEST_CASE("dynamic temperature: from the entropy of the candidates") {
    const std::vector<float> logits = {2.0f, 1.0f, 0.0f, -1.0f};
    SamplingParams p = plain(1.0f);
    p.dynatemp_range = 0.5f;
    p.dynatemp_exponent = 1.5f;
    auto pr = softmax(logits);
    double h = 0;
    for (double x : pr) h -= x * std::log(x);
    const double t = 0.5 + 1.0 * std::pow(h / std::log(4.0), 1.5);
    auto probs = Sampler(p).probabilities(logits.data(), 4, {});
    auto want = softmax(logits, t);
    for (int i = 0; i < 4; ++i) CHECK(probs[size_t(i)] == doctest::Approx(want[size_t(i)]));
    // A range above the temperature is cut at 0.
    p.temperature = 0.3f;
    p.dynatemp_range = 1.0f;
    p.dynatemp_exponent = 1.0f;
    const double t2 = 0.0 + 1.3 * (h / std::log(4.0));
    probs = Sampler(p).probabilities(logits.data(), 4, {});
    want = softmax(logits, t2);
    for (int i = 0; i < 4; ++i) CHECK(probs[size_t(i)] == doctest::Approx(want[size_t(i)]));
}

TEST_CASE("the extras: draws agree with probabilities(), draw for draw") {
    std::mt19937_64 rng(5);
    std::vector<float> logits(300);
    for (auto& l : logits) l = float(rng() % 4000) / 500.0f;
    std::vector<TokenId> recent;
    for (int i = 0; i < 80; ++i) recent.push_back(TokenId(rng() % 6));
    SamplingParams p;
    p.dry_multiplier = 0.5f;
    p.dry_sequence_breakers = {};
    p.top_n_sigma = 2.5f;
    p.typical_p = 0.9f;
    p.xtc_probability = 0.5f;
    p.xtc_threshold = 0.05f;
    p.dynatemp_range = 0.3f;
    p.seed = 99;
    Sampler a(p), b(p), probe(p);
    for (int i = 0; i < 300; ++i) {
        auto probs = probe.probabilities(logits.data(), 300, recent);
        double sum = 0;
        for (float x : probs) sum += x;
        CHECK(sum == doctest::Approx(1.0).epsilon(1e-5));
        CHECK(a.sample(logits.data(), 300, recent) == b.sample_from(probs.data(), 300));
    }
}

TEST_CASE("--samplers: the default order spelled out equals the built-in chain") {
    // Random logits and every filter on: the ordered path must reproduce the fixed one.
    std::mt19937_64 rng(11);
    const std::vector<SamplerStep> spelled =
        sampler_order_parse("penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature");
    CHECK(sampler_order_name(spelled) == sampler_order_name({}));
    for (int trial = 0; trial < 200; ++trial) {
        CAPTURE(trial);
        std::vector<float> logits(200);
        for (auto& l : logits) l = float(rng() % 6000) / 700.0f;
        SamplingParams p;
        p.temperature = 0.3f + float(trial % 7) * 0.3f;
        p.top_k = int(trial % 5) * 30;
        p.top_p = trial % 3 ? 0.9f : 1.0f;
        p.min_p = trial % 4 ? 0.02f : 0.0f;
        p.top_n_sigma = trial % 5 == 1 ? 2.0f : -1.0f;
        p.typical_p = trial % 6 == 2 ? 0.8f : 1.0f;
        p.xtc_probability = trial % 2 ? 0.4f : 0.0f;
        p.xtc_threshold = 0.03f;
        p.dynatemp_range = trial % 7 == 3 ? 0.5f : 0.0f;
        SamplingParams q = p;
        q.order = spelled;
        Sampler a(p), b(q);
        const auto pa = a.probabilities(logits.data(), 200, {});
        const auto pb = b.probabilities(logits.data(), 200, {});
        double diff = 0;
        for (size_t i = 0; i < pa.size(); ++i)
            diff = std::max(diff, double(std::fabs(pa[i] - pb[i])));
        CHECK(diff < 1e-6);
        CHECK(kept(pa) == kept(pb));
    }
}

TEST_CASE("--samplers: temperature first changes what top-p keeps; leaving it out means 1") {
    const std::vector<float> logits = {2.0f, 1.0f, 0.0f, -1.0f};
    SamplingParams p = plain(2.0f);
    p.top_p = 0.6f;
    // Default: top-p on the untempered softmax (0.64 for the best) keeps one token.
    Sampler d(p);
    CHECK(kept(d.probabilities(logits.data(), 4, {})) == std::vector<TokenId>{0});
    // Temperature 2 first: the tempered softmax (0.44, 0.27, ...) needs two tokens for 0.6,
    // and the result is their softmax at temperature 2 (no second division).
    p.order = sampler_order_parse("temperature;top_p");
    Sampler t(p);
    const auto pt = t.probabilities(logits.data(), 4, {});
    CHECK(kept(pt) == std::vector<TokenId>{0, 1});
    const auto ref = softmax({2.0f, 1.0f}, 2.0);
    CHECK(pt[0] == doctest::Approx(ref[0]).epsilon(1e-6));
    CHECK(pt[1] == doctest::Approx(ref[1]).epsilon(1e-6));
    // No temperature step: the temperature does not apply (llama.cpp's rule).
    p.order = sampler_order_parse("top_k");
    p.top_k = 3;
    Sampler k(p);
    const auto pk = k.probabilities(logits.data(), 4, {});
    const auto ref3 = softmax({2.0f, 1.0f, 0.0f});
    for (int i = 0; i < 3; ++i)
        CHECK(pk[size_t(i)] == doctest::Approx(ref3[size_t(i)]).epsilon(1e-6));
    CHECK(pk[3] == 0.0f);
    // A tiny (dynamic) temperature first cannot overflow the logits (found by fuzz_sampler).
    const std::vector<float> wide = {57.9f, 1e-10f, -9.8f, 30.0f, -7.8f};
    for (float range : {0.0f, 0.9f}) {
        SamplingParams q = plain(4.6e-14f);
        q.dynatemp_range = range;
        q.dynatemp_exponent = 2.2f;
        q.top_p = 0.99f;
        q.order = sampler_order_parse("temperature;top_p;min_p");
        Sampler tiny(q);
        const auto pt2 = tiny.probabilities(wide.data(), 5, {});
        double sum = 0;
        for (float x : pt2) {
            CHECK(std::isfinite(x));
            sum += x;
        }
        CHECK(sum == doctest::Approx(1.0));
        CHECK(pt2[0] > 0.5f);
    }
}

TEST_CASE("--samplers: XTC before top-k runs top-k for both outcomes of the coin") {
    // Tokens 0 and 1 above the threshold: XTC (q 0.25) drops token 0, then top-k 1 keeps
    // token 0 (no drop, 0.75) or token 1 (drop, 0.25).
    const std::vector<float> logits = {3.0f, 2.9f, 0.0f, -1.0f};
    SamplingParams p = plain(1.0f);
    p.xtc_probability = 0.25f;
    p.xtc_threshold = 0.2f;
    p.top_k = 1;
    p.order = sampler_seq_parse("xkt");
    Sampler s(p);
    const auto probs = s.probabilities(logits.data(), 4, {});
    CHECK(probs[0] == doctest::Approx(0.75));
    CHECK(probs[1] == doctest::Approx(0.25));
    CHECK(probs[2] == 0.0f);
    // Draws follow that mixture, draw for draw.
    Sampler a(p), b(p);
    int ones = 0;
    for (int i = 0; i < 400; ++i) {
        const TokenId x = a.sample(logits.data(), 4, {});
        CHECK(x == b.sample_from(probs.data(), 4));
        ones += x == 1;
    }
    CHECK(ones > 60);
    CHECK(ones < 140);
    // The order keeps sampling on the host.
    CHECK(sampling_needs_host(p));
}

TEST_CASE("--samplers / --sampling-seq parsing") {
    CHECK(sampler_order_parse("top_k; top-p ;min_p;temp") ==
          std::vector<SamplerStep>{SamplerStep::TopK, SamplerStep::TopP, SamplerStep::MinP,
                                   SamplerStep::Temperature});
    CHECK(sampler_seq_parse("edskypmxt") == sampler_order_parse("top_n_sigma;top_k;typical;"
                                                                "nucleus;min-p;xtc;temperature"));
    CHECK(sampler_order_name(sampler_seq_parse("mt")) == "min_p;temperature");
    CHECK_THROWS_WITH_AS(sampler_order_parse("top_k;top_z"),
                         doctest::Contains("unknown sampler 'top_z'"), kvrun::Error);
    CHECK_THROWS_WITH_AS(sampler_order_parse("top_k;temp;top_k"),
                         doctest::Contains("sampler 'top_k' is listed twice"), kvrun::Error);
    CHECK_THROWS_WITH_AS(sampler_order_parse("top_k;penalties"),
                         doctest::Contains("must come before the filters"), kvrun::Error);
    CHECK_THROWS_WITH_AS(sampler_seq_parse("kq"), doctest::Contains("unknown sampler letter 'q'"),
                         kvrun::Error);
    CHECK_THROWS_AS(sampler_order_parse(";;"), kvrun::Error);
    SamplingParams p;
    p.order = {SamplerStep::TopK, SamplerStep::TopK};
    CHECK_THROWS_WITH_AS(sampling_validate(p), doctest::Contains("listed twice"), kvrun::Error);
}

TEST_CASE("a tiny or huge repeat penalty keeps the logits finite (found by fuzz_sampler)") {
    const std::vector<float> logits = {2.86f, -0.04f, -1.76f, 1e-30f};
    const std::vector<TokenId> recent = {0, 1, 3};
    for (float rp : {1.4e-39f, 1e-30f, 1e30f, 3e38f}) {
        CAPTURE(rp);
        SamplingParams p = plain(1.9f);
        p.repeat_penalty = rp;
        const auto probs = Sampler(p).probabilities(logits.data(), 4, recent);
        double sum = 0;
        for (float x : probs) {
            CHECK(std::isfinite(x));
            CHECK(x >= 0.0f);
            sum += x;
        }
        CHECK(sum == doctest::Approx(1.0));
    }
}

TEST_CASE("the extras: validation, host-only, history length") {
    auto bad = [](auto set) {
        SamplingParams p;
        set(p);
        return std::string([&] {
            try {
                kvrun::sampling_validate(p);
            } catch (const kvrun::Error& e) {
                return std::string(e.what());
            }
            return std::string();
        }());
    };
    CHECK(bad([](SamplingParams& p) { p.dry_multiplier = -1; }).find("DRY multiplier") !=
          std::string::npos);
    CHECK(bad([](SamplingParams& p) { p.dry_base = 0.5f; }).find("DRY base") != std::string::npos);
    CHECK(bad([](SamplingParams& p) { p.dry_allowed_length = 0; }).find("allowed length") !=
          std::string::npos);
    CHECK(bad([](SamplingParams& p) { p.dry_penalty_last_n = -2; }).find("penalty-last-n") !=
          std::string::npos);
    CHECK(bad([](SamplingParams& p) { p.top_n_sigma = NAN; }).find("top-n-sigma") !=
          std::string::npos);
    CHECK(bad([](SamplingParams& p) { p.typical_p = 1.5f; }).find("typical-p") !=
          std::string::npos);
    CHECK(bad([](SamplingParams& p) { p.xtc_probability = -0.1f; }).find("XTC probability") !=
          std::string::npos);
    CHECK(bad([](SamplingParams& p) { p.xtc_threshold = 2; }).find("XTC threshold") !=
          std::string::npos);
    CHECK(bad([](SamplingParams& p) { p.dynatemp_range = INFINITY; }).find("range") !=
          std::string::npos);
    CHECK(bad([](SamplingParams& p) { p.dynatemp_exponent = -1; }).find("exponent") !=
          std::string::npos);
    CHECK(bad([](SamplingParams& p) { p.mirostat = 3; }).find("mirostat must be") !=
          std::string::npos);
    CHECK(bad([](SamplingParams& p) { p.mirostat_tau = -1; }).find("tau") != std::string::npos);
    CHECK(bad([](SamplingParams& p) { p.mirostat_eta = NAN; }).find("eta") != std::string::npos);
    CHECK(bad([](SamplingParams&) {}).empty());

    SamplingParams p;
    CHECK_FALSE(kvrun::sampling_needs_host(p));
    CHECK(kvrun::sampling_history_length(p) == 64);
    p.dry_multiplier = 0.8f;
    CHECK(kvrun::sampling_needs_host(p));
    CHECK(kvrun::sampling_history_length(p) == -1);
    p.dry_penalty_last_n = 200;
    CHECK(kvrun::sampling_history_length(p) == 200);
    p.dry_penalty_last_n = 10;
    CHECK(kvrun::sampling_history_length(p) == 64);
    p.dry_penalty_last_n = 0;  // off
    CHECK_FALSE(kvrun::sampling_needs_host(p));
    for (auto set : {+[](SamplingParams& q) { q.top_n_sigma = 1; },
                     +[](SamplingParams& q) { q.typical_p = 0.5f; },
                     +[](SamplingParams& q) { q.xtc_probability = 0.5f; },
                     +[](SamplingParams& q) { q.dynatemp_range = 0.5f; },
                     +[](SamplingParams& q) { q.mirostat = 2; }}) {
        SamplingParams q;
        set(q);
        CHECK(kvrun::sampling_needs_host(q));
    }
}

TEST_CASE("mirostat 2: cuts at surprise mu, then moves mu toward tau by each draw's surprise") {
    // probabilities 0.5, 0.25, 0.125, 0.125: surprises 1, 2, 3, 3 bits
    const std::vector<float> logits = {std::log(0.5f), std::log(0.25f), std::log(0.125f),
                                       std::log(0.125f)};
    SamplingParams p = plain();
    p.mirostat = 2;
    p.mirostat_tau = 1.25f;  // mu starts at 2.5: tokens 0 and 1 stay
    p.mirostat_eta = 0.1f;
    Sampler s(p);
    CHECK(s.mirostat_mu() == doctest::Approx(2.5));
    auto probs = s.probabilities(logits.data(), 4, {});
    CHECK(probs[0] == doctest::Approx(2.0 / 3));
    CHECK(probs[1] == doctest::Approx(1.0 / 3));
    CHECK(probs[2] == 0.0f);
    CHECK(s.mirostat_mu() == doctest::Approx(2.5));  // probabilities() does not move it
    CHECK(s.sample_with(logits.data(), 4, {}, 0.1) == 0);
    CHECK(s.mirostat_mu() == doctest::Approx(2.5 - 0.1 * (-std::log2(2.0 / 3) - 1.25)));
    CHECK(s.sample_with(logits.data(), 4, {}, 0.9) == 1);
    // tau 0: mu 0 keeps only the best token.
    p.mirostat_tau = 0.0f;
    CHECK(kept(Sampler(p).probabilities(logits.data(), 4, {})) == std::vector<TokenId>{0});
}

TEST_CASE("mirostat 1 and 2: the drawn tokens' mean surprise settles at tau") {
    // A Zipf-like vocabulary of 2000 tokens.
    std::vector<float> logits(2000);
    for (size_t i = 0; i < logits.size(); ++i) logits[i] = -1.1f * std::log(float(i + 1));
    for (int version : {1, 2}) {
        for (float tau : {2.0f, 4.0f, 6.0f}) {
            SamplingParams p = plain();
            p.mirostat = version;
            p.mirostat_tau = tau;
            p.seed = 17;
            Sampler s(p), rng(p);
            double sum = 0;
            int n = 0;
            for (int i = 0; i < 6000; ++i) {
                const auto probs = s.probabilities(logits.data(), 2000, {});
                const TokenId t = s.sample(logits.data(), 2000, {});
                CHECK(t == rng.sample_from(probs.data(), 2000));  // draws follow probabilities()
                if (i >= 1000) {
                    sum += -std::log2(double(probs[size_t(t)]));
                    ++n;
                }
            }
            CAPTURE(version);
            CAPTURE(tau);
            CHECK(sum / n == doctest::Approx(tau).epsilon(0.08));
            CHECK(std::isfinite(s.mirostat_mu()));
        }
    }
}

// ---- through the engine (stories260K, CPU backend) ----

namespace {

using kvrun::Engine;
using kvrun::EngineOptions;
using kvrun::GenerationRequest;
using kvrun::GenerationResult;
using kvrun::StopReason;
using kvrun::spec_test::Model;

// Runs the requests at once; the tokens of each (first sample), in submission order.
std::vector<std::vector<TokenId>> run_all(Model& m, const std::vector<GenerationRequest>& reqs,
                                          int32_t parallel, kvrun::Backend* draft = nullptr,
                                          int32_t k = 4, EngineOptions eo = {},
                                          int64_t* device_steps = nullptr) {
    eo.max_parallel = parallel;
    eo.n_batch = 64;
    if (draft) {
        eo.draft = draft;
        eo.draft_min = 1;
        eo.draft_max = k;
    }
    Engine engine(*m.backend, *m.tok, eo);
    std::vector<std::vector<TokenId>> out(reqs.size());
    for (const auto& r : reqs) engine.submit(r);
    engine.on_finish([&](const GenerationResult& r) {
        CHECK_MESSAGE(r.stop != StopReason::Error, r.error);
        out[static_cast<size_t>(r.request)] = r.tokens;
    });
    engine.run();
    CHECK(engine.kv_table().n_used_blocks() == 0);
    if (device_steps) *device_steps = engine.stats().device_sampled_steps;
    return out;
}

}  // namespace

TEST_CASE("DRY through the engine: greedy with it, with drafts, in batches, never on the device") {
    auto path = kvrun::test::shared_path("models/stories260K.gguf");
    if (path.empty()) return;
    Model target = kvrun::spec_test::load(path, 16, 512);
    Model draft =
        kvrun::spec_test::load(kvrun::test::shared_path("models/stories260K-Q8_0.gguf"), 16, 512);
    std::vector<GenerationRequest> reqs;
    for (const auto& p : kvrun::spec_test::kPrompts) {
        GenerationRequest r;
        r.prompt = target.tok->encode(p, true);
        r.sampling.temperature = 0.0f;
        r.sampling.dry_multiplier = 0.8f;  // the default breakers: "\n" ":" "\"" "*"
        r.n_predict = 200;
        r.ignore_eos = true;
        reqs.push_back(std::move(r));
    }
    auto plain_reqs = reqs;
    for (auto& r : plain_reqs) r.sampling.dry_multiplier = 0.0f;
    const auto plain = run_all(target, plain_reqs, 4);
    const auto want = run_all(target, reqs, 1);
    int changed = 0;
    for (size_t i = 0; i < reqs.size(); ++i) changed += want[i] != plain[i];
    CHECK(changed >= 2);  // greedy stories repeat themselves; DRY steers away

    // The engine's DRY sees the whole sequence: a hand-written loop (the full context through
    // the backend each step, a Sampler with the token texts) picks the same tokens.
    Model ref = kvrun::spec_test::load(path, 16, 64);
    const std::vector<std::string> pieces = kvrun::token_text_pieces(*ref.tok);
    std::vector<TokenId> ctx = reqs[1].prompt;
    Sampler greedy_dry(reqs[1].sampling);
    greedy_dry.set_token_pieces(&pieces);
    const int V = static_cast<int>(ref.backend->config().n_vocab);
    std::vector<TokenId> by_hand;
    while (by_hand.size() < want[1].size()) {
        kvrun::KvBlockTable table = kvrun::kv_table_for(*ref.backend);
        const auto seq = table.create_sequence();
        REQUIRE(table.append(seq, ctx));
        kvrun::kv_apply_pending(table, *ref.backend);
        kvrun::ForwardBatch fb;
        fb.add_sequence(table, seq, 0, static_cast<int32_t>(ctx.size()));
        fb.logit_rows = {static_cast<int32_t>(ctx.size()) - 1};
        std::vector<float> logits(static_cast<size_t>(V));
        ref.backend->forward(fb, logits.data());
        const TokenId t = greedy_dry.sample(logits.data(), V, ctx);
        by_hand.push_back(t);
        ctx.push_back(t);
    }
    CHECK(by_hand == want[1]);

    // Batched = alone; asked to sample on the device, the engine keeps DRY on the host.
    EngineOptions on;
    on.device_sampling = EngineOptions::DeviceSampling::On;
    int64_t device_steps = -1;
    CHECK(run_all(target, reqs, 4, nullptr, 4, on, &device_steps) == want);
    CHECK(device_steps == 0);
    // With drafts: every verification row sees the drafted tokens before it.
    for (int32_t k : {1, 4, 8}) {
        CAPTURE(k);
        CHECK(run_all(target, reqs, 4, draft.backend.get(), k) == want);
    }
}

// stories260K as the reference (exact distributions) and as the target, with its 3-layer
// cut as the draft: the lossless chi-square tests' models. Null without ../shared.
struct L3Setup {
    Model ref, target, l3;
};
std::unique_ptr<L3Setup> l3_setup() {
    auto path = kvrun::test::shared_path("models/stories260K.gguf");
    if (path.empty()) return nullptr;
    return std::unique_ptr<L3Setup>(
        new L3Setup{kvrun::spec_test::load(path, 4, 64), kvrun::spec_test::load(path, 4, 1024),
                    kvrun::spec_test::load(
                        kvrun::test::shared_path("models/stories260K-L3-F32.gguf"), 4, 1200)});
}

TEST_CASE("the extras with speculative decoding: sampling stays lossless (chi-square)") {
    auto setup = l3_setup();
    if (!setup) return;
    Model &ref = setup->ref, &target = setup->target, &l3 = setup->l3;
    // A repetitive prompt, so that DRY's penalty is in play for both tokens.
    const std::vector<TokenId> prompt =
        target.tok->encode("The dog saw the cat. The dog saw the cat. The dog saw the", true);
    SamplingParams sp = kvrun::spec_test::full_softmax();
    sp.dry_multiplier = 1.5f;
    sp.dry_sequence_breakers = {};  // exact_next_probs has no token texts
    sp.xtc_probability = 0.5f;
    sp.xtc_threshold = 0.15f;
    sp.typical_p = 0.95f;
    sp.dynatemp_range = 0.4f;
    const auto run = kvrun::spec_test::first_pairs(target, l3.backend.get(), prompt, sp, 2000);
    const auto& draws = run.draws;
    const auto z = kvrun::spec_test::lossless_z(ref, prompt, sp, draws, true);
    MESSAGE("extras + speculation: z(first) " << z.z_first << ", z(pair) " << z.z_pair
                                              << ", acceptance " << run.stats.spec.acceptance());
    CHECK(z.z_first < 3.7);
    CHECK(z.z_pair < 3.7);
    CHECK(run.stats.spec.accepted > 0);
    // Against the plain softmax the same draws are far off: the extras did change the output.
    const auto free =
        kvrun::spec_test::lossless_z(ref, prompt, kvrun::spec_test::full_softmax(), draws, false);
    CHECK(free.z_first > 10);
}

TEST_CASE("a custom --samplers order with speculative decoding stays lossless (chi-square)") {
    auto setup = l3_setup();
    if (!setup) return;
    Model &ref = setup->ref, &target = setup->target, &l3 = setup->l3;
    const std::vector<TokenId> prompt = target.tok->encode("Once upon a time, there was a", true);
    SamplingParams sp = kvrun::spec_test::full_softmax();
    sp.temperature = 1.6f;
    sp.top_p = 0.9f;
    sp.min_p = 0.02f;
    sp.xtc_probability = 0.5f;
    sp.xtc_threshold = 0.1f;
    sp.order = sampler_order_parse("xtc;temperature;top_p;min_p");
    const auto run = kvrun::spec_test::first_pairs(target, l3.backend.get(), prompt, sp, 2000);
    const auto z = kvrun::spec_test::lossless_z(ref, prompt, sp, run.draws, true);
    MESSAGE("custom order + speculation: z(first) " << z.z_first << ", z(pair) " << z.z_pair
                                                    << ", acceptance "
                                                    << run.stats.spec.acceptance());
    CHECK(z.z_first < 3.7);
    CHECK(z.z_pair < 3.7);
    CHECK(run.stats.spec.accepted > 0);
    // The default order with the same values is far off: the order changed the output.
    SamplingParams fixed = sp;
    fixed.order.clear();
    CHECK(kvrun::spec_test::lossless_z(ref, prompt, fixed, run.draws, false).z_first > 10);
}

TEST_CASE("mirostat through the engine: no speculation, the same tokens, never on the device") {
    auto path = kvrun::test::shared_path("models/stories260K.gguf");
    if (path.empty()) return;
    Model target = kvrun::spec_test::load(path, 16, 512);
    Model draft =
        kvrun::spec_test::load(kvrun::test::shared_path("models/stories260K-Q8_0.gguf"), 16, 512);
    std::vector<GenerationRequest> reqs;
    for (int v : {1, 2}) {
        for (const auto& prompt : kvrun::spec_test::kPrompts) {
            GenerationRequest r;
            r.prompt = target.tok->encode(prompt, true);
            r.sampling.temperature = 1.0f;
            r.sampling.mirostat = v;
            r.sampling.mirostat_tau = 3.0f;
            r.sampling.seed = 7;
            r.n_predict = 80;
            reqs.push_back(std::move(r));
        }
    }
    const auto alone = run_all(target, reqs, 1);
    EngineOptions on;
    on.device_sampling = EngineOptions::DeviceSampling::On;
    int64_t device_steps = -1;
    CHECK(run_all(target, reqs, 8, nullptr, 4, on, &device_steps) == alone);
    CHECK(device_steps == 0);
    EngineOptions eo;
    eo.max_parallel = 8;
    eo.draft = draft.backend.get();
    Engine engine(*target.backend, *target.tok, eo);
    std::vector<std::vector<TokenId>> got(reqs.size());
    engine.on_finish([&](const GenerationResult& r) { got[size_t(r.request)] = r.tokens; });
    for (const auto& r : reqs) engine.submit(r);
    engine.run();
    CHECK(got == alone);
    CHECK(engine.stats().spec.drafted == 0);
}
