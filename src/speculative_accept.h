// The speculative-decoding acceptance rule (Leviathan et al. 2023, Chen et al. 2023), shared by
// the engine's speculation and SpeculativeDecoder: drawing a draft token from the draft's final
// distribution, judging one round's drafts against the target's logits (greedy: exact argmax
// match; sampling: accept with min(1, p/q), else sample from norm(max(p - q, 0)), a bonus
// token after K acceptances), the adaptive draft length, and the counters.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "sampler.h"
#include "tokenizer.h"

namespace kvrun {

// How a draft token is judged. Only Lossless is correct; the others are deliberately wrong
// variants kept so tests can show that the losslessness test catches a broken rule.
enum class AcceptRule {
    Lossless,        // accept with min(1, p/q), else sample from norm(max(p - q, 0))
    AcceptAll,       // BROKEN (tests only): every draft token is accepted
    ResampleTarget,  // BROKEN (tests only): on rejection sample from p instead of the residual
};

// Outcome of judging one round: drafts[0 .. n_accepted) are kept, then `next` follows them.
struct SpecAcceptResult {
    int32_t n_accepted = 0;
    TokenId next = -1;
};

// The acceptance step on probabilities. p: [n_draft + 1][n_vocab] the target's final (filtered)
// distributions at each drafted position and one past the last; q: [n_draft][n_vocab] the
// draft's distributions the drafts were drawn from; drafts: [n_draft]. Draws with `rng`
// (uniform() and sample_from()). Throws Error for a draft id outside the vocabulary.
SpecAcceptResult speculative_accept(const float* p, const float* q, std::span<const TokenId> drafts,
                                    int n_vocab, Sampler& rng,
                                    AcceptRule rule = AcceptRule::Lossless);

// Draws one draft token from the draft's logits: [n_vocab]. recent: the sequence so far plus
// the drafts before this one (the penalty's recent tokens). Greedy samplers take the argmax
// (q_row is then unused and may be null); otherwise q_row: [n_vocab] receives the draft's
// final distribution and the token is drawn from it.
TokenId speculative_draft_token(Sampler& draft, const float* logits, int n_vocab,
                                std::span<const TokenId> recent, float* q_row);

// Judges one round of k drafts with the target's sampler. logits: [k + 1][n_vocab] the target's
// logits at the sequence's last token and at each draft; context: [n + k] the sequence (or its
// last tokens, at least repeat_last_n of them) followed by the k drafts — row i sees
// context[0, n + i) as recent tokens; q: [k][n_vocab] the draft distributions (sampling only;
// null when greedy); p_scratch: reused buffer. Greedy: drafts are kept while they equal the
// target's argmax, then the argmax follows; sampling: speculative_accept with `rule`.
// constraints: empty, or [k + 1] the token constraint of each row (a grammar's state after
// the drafts before it), set on `target` for that row and cleared afterwards.
SpecAcceptResult speculative_verify(Sampler& target, const float* logits, int n_vocab,
                                    std::span<const TokenId> context, int32_t k, const float* q,
                                    AcceptRule rule, std::vector<float>& p_scratch,
                                    std::span<const TokenConstraint* const> constraints = {});

// The adaptive draft length for the next round: `current` is the sequence's K, `k` the drafts
// this round actually carried (K capped by the context and the tokens still wanted), of which
// n_accepted were kept. All accepted: k + 2; fewer than half: k - 1; else K stays; always
// within [k_min, k_max].
int32_t speculative_next_k(int32_t current, int32_t k, int32_t n_accepted, int32_t k_min,
                           int32_t k_max);

// Prompt lookup ("n-gram") drafting, no draft model: the tokens that followed the most recent
// earlier occurrence of the sequence's last n tokens, for the longest n in [1, n_max] that has
// one, at most k of them (empty when no suffix recurs). A one-hot draft distribution, so
// sampling stays exact with the usual acceptance rule.
std::vector<TokenId> speculative_lookup_drafts(std::span<const TokenId> tokens, int32_t n_max,
                                               int32_t k);

// The draft sampler's seed for a request seed (its own stream of random numbers).
uint64_t speculative_draft_seed(uint64_t seed);

// Speculation counters (cumulative).
struct SpeculativeStats {
    int64_t rounds = 0;                  // verifications that carried at least one draft
    int64_t drafted = 0;                 // draft tokens proposed
    int64_t accepted = 0;                // draft tokens accepted
    int64_t generated = 0;               // tokens output
    int64_t target_passes = 0;           // target forward passes (prompt chunks included)
    int64_t draft_passes = 0;            // draft forward passes
    double target_ms = 0, draft_ms = 0;  // time inside each backend's forward
    double acceptance() const { return drafted > 0 ? double(accepted) / double(drafted) : 0.0; }
    // Mean accepted drafts per round ("mean accepted length"; +1 gives tokens per round).
    double mean_accepted() const { return rounds > 0 ? double(accepted) / double(rounds) : 0.0; }
    double tokens_per_target_pass() const {
        return target_passes > 0 ? double(generated) / double(target_passes) : 0.0;
    }
    SpeculativeStats operator-(const SpeculativeStats& o) const;
};

}  // namespace kvrun
