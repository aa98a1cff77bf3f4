// Helpers shared by the speculative-decoding tests (test_speculative.cpp, test_spec_engine.cpp,
// test_grammar_engine.cpp, test_sampler_filters.cpp): a model with its own CPU backend, the
// reference prompts, the chi-square statistic, the exact next-token distribution of the
// target, sampled (first, second) token pairs through a speculating engine, and the
// losslessness check on them.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend.h"
#include "engine.h"
#include "gguf.h"
#include "grammar.h"
#include "kv_block_table.h"
#include "sampler.h"
#include "tokenizer.h"

namespace kvrun::spec_test {

// One model with its own backend (and so its own KV pool).
struct Model {
    std::unique_ptr<GgufFile> file;
    std::unique_ptr<Tokenizer> tok;
    std::unique_ptr<Backend> backend;
};

inline Model load(const std::filesystem::path& path, int32_t block_size = 16,
                  int64_t n_blocks = 64) {
    Model m;
    m.file = std::make_unique<GgufFile>(GgufFile::open(path.string()));
    m.tok = Tokenizer::from_gguf(*m.file);
    BackendOptions o;
    o.kv_block_size = block_size;
    o.n_kv_blocks = n_blocks;
    o.n_threads = 1;  // tiny models: one thread beats the hand-offs
    m.backend = make_cpu_backend(*m.file, o);
    return m;
}

inline const std::vector<std::string> kPrompts = {
    "Once upon a time", "The little dog saw a big red ball. He",
    "Lily and Tom went to the park. They", "One day, a bird flew into the garden and"};

// Chi-square statistic of observed counts against expected probabilities (bins with
// expected count >= 5; the rest pooled into one bin), returned as a Wilson-Hilferty z-score:
// about N(0, 1) when the counts follow `expected`. +inf when a token of probability 0 occurs.
inline double chi_square_z(const std::map<int64_t, int64_t>& observed,
                           const std::map<int64_t, double>& expected, int64_t n) {
    double x2 = 0, pooled_exp = 0;
    int64_t pooled_obs = 0, bins = 0;
    for (const auto& [key, count] : observed)
        if (!expected.count(key) || expected.at(key) <= 0) return INFINITY;
    for (const auto& [key, p] : expected) {
        const double e = p * double(n);
        const int64_t o = observed.count(key) ? observed.at(key) : 0;
        if (e >= 5) {
            x2 += (o - e) * (o - e) / e;
            ++bins;
        } else {
            pooled_exp += e;
            pooled_obs += o;
        }
    }
    if (pooled_exp > 0) {
        x2 += (pooled_obs - pooled_exp) * (pooled_obs - pooled_exp) / std::max(pooled_exp, 1.0);
        ++bins;
    }
    const double df = double(std::max<int64_t>(bins - 1, 1));
    const double s = 2.0 / (9.0 * df);
    return (std::cbrt(x2 / df) - (1.0 - s)) / std::sqrt(s);
}

// Exact target probabilities of the next token after `ctx` under `params` (and `constraint`
// when given), computed on `ref`'s backend (its KV pool must be free and hold ctx).
inline std::vector<float> exact_next_probs(Model& ref, const std::vector<TokenId>& ctx,
                                           const SamplingParams& params,
                                           const TokenConstraint* constraint = nullptr) {
    const int V = static_cast<int>(ref.backend->config().n_vocab);
    KvBlockTable table = kv_table_for(*ref.backend);
    SeqId seq = table.create_sequence();
    REQUIRE(table.append(seq, ctx));
    kv_apply_pending(table, *ref.backend);
    ForwardBatch fb;
    fb.add_sequence(table, seq, 0, static_cast<int32_t>(ctx.size()));
    fb.logit_rows = {int32_t(ctx.size()) - 1};
    std::vector<float> logits(V);
    ref.backend->forward(fb, logits.data());
    Sampler s(params);
    s.set_constraint(constraint);
    return s.probabilities(logits.data(), V, ctx);
}

struct LosslessZ {
    double z_first = 0, z_pair = 0;
};

// Compares observed first tokens (and, with `pairs`, first-two-token pairs) of continuations of
// `prompt` with the target's exact distribution: z_first against p(t1), z_pair against
// p(t1) p(t2 | t1) (t1 with at least 20 expected draws; the other pairs pooled). With a
// grammar, the distributions are those under it.
inline LosslessZ lossless_z(Model& ref, const std::vector<TokenId>& prompt,
                            const SamplingParams& params,
                            const std::vector<std::pair<TokenId, TokenId>>& draws, bool pairs,
                            std::shared_ptr<const Grammar> grammar = nullptr) {
    const int V = static_cast<int>(ref.backend->config().n_vocab);
    const int64_t n = static_cast<int64_t>(draws.size());
    std::map<int64_t, int64_t> first, pair;
    for (const auto& [t1, t2] : draws) {
        first[t1]++;
        pair[int64_t(t1) * V + t2]++;
    }
    LosslessZ out;
    std::unique_ptr<GrammarConstraint> c0;
    if (grammar)
        c0 = std::make_unique<GrammarConstraint>(grammar, std::make_shared<GrammarVocab>(*ref.tok));
    const std::vector<float> p1 = exact_next_probs(ref, prompt, params, c0.get());
    std::map<int64_t, double> e1, e2;
    for (int t = 0; t < V; ++t)
        if (p1[t] > 0) e1[t] = p1[t];
    out.z_first = chi_square_z(first, e1, n);
    if (!pairs) return out;
    for (int t1 = 0; t1 < V; ++t1) {
        if (p1[t1] * double(n) < 20) continue;
        std::vector<TokenId> ctx = prompt;
        ctx.push_back(t1);
        std::unique_ptr<GrammarConstraint> c1;
        if (c0) {
            c1 = std::make_unique<GrammarConstraint>(*c0);
            c1->accept(t1);
        }
        const std::vector<float> p2 = exact_next_probs(ref, ctx, params, c1.get());
        for (int t2 = 0; t2 < V; ++t2)
            if (p2[t2] > 0) e2[int64_t(t1) * V + t2] = double(p1[t1]) * p2[t2];
    }
    double covered = 0;
    for (const auto& [key, p] : e2) covered += p;
    std::map<int64_t, int64_t> binned;  // pairs outside e2 go to the pooled key -1
    for (const auto& [key, count] : pair) binned[e2.count(key) ? key : -1] += count;
    e2[-1] = std::max(0.0, 1.0 - covered);
    out.z_pair = chi_square_z(binned, e2, n);
    return out;
}

// The first two tokens of n continuations of `prompt` (three tokens each, seeds 1..n, `params`
// otherwise, under `grammar` when given), 16 at a time, with the draft model (or, with
// `ngram` > 0 and no draft, prompt lookup) proposing two tokens: both come from one round's
// acceptance chain. Checks that no KV block leaks.
struct FirstPairs {
    std::vector<std::pair<TokenId, TokenId>> draws;
    EngineStats stats;
};
inline FirstPairs first_pairs(Model& target, Backend* draft, const std::vector<TokenId>& prompt,
                              const SamplingParams& params, int64_t n,
                              AcceptRule rule = AcceptRule::Lossless,
                              std::shared_ptr<const Grammar> grammar = nullptr, int32_t ngram = 0) {
    EngineOptions eo;
    eo.max_parallel = 16;
    eo.n_batch = 32;
    eo.draft = draft;
    eo.draft_ngram = ngram;
    eo.draft_min = eo.draft_max = 2;
    eo.accept_rule = rule;
    Engine engine(*target.backend, *target.tok, eo);
    FirstPairs out;
    engine.on_finish([&](const GenerationResult& r) {
        REQUIRE(r.tokens.size() == 3);
        out.draws.emplace_back(r.tokens[0], r.tokens[1]);
    });
    for (int64_t i = 0; i < n; ++i) {
        GenerationRequest req;
        req.prompt = prompt;
        req.n_predict = 3;
        req.ignore_eos = true;
        req.sampling = params;
        req.sampling.seed = 1 + uint64_t(i);
        req.grammar = grammar;
        engine.submit(req);
    }
    engine.run();
    CHECK(engine.kv_table().n_used_blocks() == 0);
    if (draft) CHECK(engine.draft_kv_table()->n_used_blocks() == 0);
    out.stats = engine.stats();
    return out;
}

// The whole softmax at temperature 1 (no filters).
inline SamplingParams full_softmax() {
    SamplingParams p;
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    return p;
}

}  // namespace kvrun::spec_test
