// The acceptance rule of speculative decoding and its helpers (see speculative_accept.h).
#include "speculative_accept.h"

#include <algorithm>

#include "common.h"

namespace kvrun {

SpecAcceptResult speculative_accept(const float* p, const float* q, std::span<const TokenId> drafts,
                                    int n_vocab, Sampler& rng, AcceptRule rule) {
    if (n_vocab <= 0) fail("speculative_accept: vocabulary size {} must be positive", n_vocab);
    const size_t V = static_cast<size_t>(n_vocab);
    for (size_t i = 0; i < drafts.size(); ++i) {
        const TokenId d = drafts[i];
        if (d < 0 || d >= n_vocab)
            fail("speculative_accept: draft token {} outside the vocabulary (0..{})", d,
                 n_vocab - 1);
        if (rule == AcceptRule::AcceptAll) continue;
        const float* pi = p + i * V;  // [n_vocab]
        const float* qi = q + i * V;  // [n_vocab]
        // Accept with probability min(1, p(d) / q(d)): u < p/q  <=>  u * q < p (q(d) > 0 since d
        // was drawn from q; q(d) == 0 < p(d) accepts, p(d) == 0 always rejects).
        const double u = rng.uniform();
        if (u * static_cast<double>(qi[d]) < static_cast<double>(pi[d])) continue;
        const int32_t n_accepted = static_cast<int32_t>(i);
        if (rule == AcceptRule::ResampleTarget) return {n_accepted, rng.sample_from(pi, n_vocab)};
        // Rejected: draw from the residual norm(max(p - q, 0)). It has positive mass whenever
        // p(d) < q(d); should rounding leave nothing, p itself is the right fallback.
        std::vector<float> residual(V);  // [n_vocab]
        double total = 0.0;
        for (size_t t = 0; t < V; ++t) {
            residual[t] = std::max(pi[t] - qi[t], 0.0f);
            total += residual[t];
        }
        if (!(total > 0.0)) return {n_accepted, rng.sample_from(pi, n_vocab)};
        return {n_accepted, rng.sample_from(residual.data(), n_vocab)};
    }
    // Every draft accepted: the bonus token comes from the target's next distribution.
    return {static_cast<int32_t>(drafts.size()), rng.sample_from(p + drafts.size() * V, n_vocab)};
}

TokenId speculative_draft_token(Sampler& draft, const float* logits, int n_vocab,
                                std::span<const TokenId> recent, float* q_row) {
    if (draft.greedy()) return draft.sample(logits, n_vocab, recent);
    draft.compute_probabilities(logits, n_vocab, recent, q_row);
    return draft.sample_from(q_row, n_vocab);
}

SpecAcceptResult speculative_verify(Sampler& target, const float* logits, int n_vocab,
                                    std::span<const TokenId> context, int32_t k, const float* q,
                                    AcceptRule rule, std::vector<float>& p_scratch,
                                    std::span<const TokenConstraint* const> constraints) {
    if (k < 0 || static_cast<size_t>(k) > context.size())
        fail("speculative_verify: {} drafts but a context of {} tokens", k, context.size());
    if (!constraints.empty() && constraints.size() != static_cast<size_t>(k) + 1)
        fail("speculative_verify: {} constraints for {} rows", constraints.size(), k + 1);
    const size_t V = static_cast<size_t>(n_vocab);
    const size_t n = context.size() - static_cast<size_t>(k);
    std::span<const TokenId> drafts = context.subspan(n);
    // Row i under its constraint; the target's own constraint is left cleared.
    struct RowConstraint {
        Sampler& target;
        std::span<const TokenConstraint* const> rows;
        void set(int32_t i) {
            if (!rows.empty()) target.set_constraint(rows[static_cast<size_t>(i)]);
        }
        ~RowConstraint() {
            if (!rows.empty()) target.set_constraint(nullptr);
        }
    } row{target, constraints};
    if (target.greedy()) {
        for (int32_t i = 0; i <= k; ++i) {
            row.set(i);
            const TokenId t = target.sample(logits + i * V, n_vocab, context.first(n + i));
            if (i < k && t == drafts[i]) continue;
            return {i, t};
        }
    }
    p_scratch.resize(static_cast<size_t>(k + 1) * V);
    for (int32_t i = 0; i <= k; ++i) {
        row.set(i);
        target.compute_probabilities(logits + i * V, n_vocab, context.first(n + i),
                                     p_scratch.data() + i * V);
    }
    return speculative_accept(p_scratch.data(), q, drafts, n_vocab, target, rule);
}

int32_t speculative_next_k(int32_t current, int32_t k, int32_t n_accepted, int32_t k_min,
                           int32_t k_max) {
    // Grow while the draft is right every time, shrink when it is mostly wrong.
    int32_t next = current;
    if (n_accepted == k)
        next = k + 2;
    else if (2 * n_accepted < k)
        next = k - 1;
    return std::clamp(next, k_min, k_max);
}

std::vector<TokenId> speculative_lookup_drafts(std::span<const TokenId> tokens, int32_t n_max,
                                               int32_t k) {
    const int64_t len = static_cast<int64_t>(tokens.size());
    if (k <= 0 || len < 2) return {};
    for (int64_t n = std::min<int64_t>(n_max, len - 1); n >= 1; --n) {
        const std::span<const TokenId> suffix = tokens.last(static_cast<size_t>(n));
        // An earlier occurrence ends at e - 1 < len - 1, most recent first.
        for (int64_t e = len - 1; e >= n; --e) {
            if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + (e - n))) continue;
            const int64_t m = std::min<int64_t>(k, len - e);
            return std::vector<TokenId>(tokens.begin() + e, tokens.begin() + e + m);
        }
    }
    return {};
}

uint64_t speculative_draft_seed(uint64_t seed) {
    return seed ^ 0xD1B54A32D192ED03ull;
}

SpeculativeStats SpeculativeStats::operator-(const SpeculativeStats& o) const {
    SpeculativeStats d;
    d.rounds = rounds - o.rounds;
    d.drafted = drafted - o.drafted;
    d.accepted = accepted - o.accepted;
    d.generated = generated - o.generated;
    d.target_passes = target_passes - o.target_passes;
    d.draft_passes = draft_passes - o.draft_passes;
    d.target_ms = target_ms - o.target_ms;
    d.draft_ms = draft_ms - o.draft_ms;
    return d;
}

}  // namespace kvrun
