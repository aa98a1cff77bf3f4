// Token sampling on the host: llama.cpp's default chain (repetition penalty, top-k, top-p,
// min-p, temperature, then a seeded draw), greedy argmax when temperature <= 0, and the
// filtered distribution itself (speculative decoding compares target and draft distributions).
// Deterministic across platforms: std::mt19937_64 plus our own uniform conversion.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "tokenizer.h"

namespace kvrun {

// Defaults follow llama.cpp. A filter whose value disables it: top_k == 0, top_p == 1,
// min_p == 0, repeat_penalty == 1, frequency_penalty == presence_penalty == 0,
// repeat_last_n == 0 (-1: every recent token given; it bounds all three penalties).
// Valid ranges (sampling_validate): temperature >= 0, top_k >= 0, top_p and min_p in
// [0, 1], repeat_penalty > 0, repeat_last_n >= -1, all finite.
struct SamplingParams {
    float temperature = 0.8f;  // 0: greedy (argmax, lowest id on ties)
    int top_k = 40;
    float top_p = 0.95f;
    float min_p = 0.05f;
    float repeat_penalty = 1.0f;  // positive logits divided by it, negative ones multiplied
    // Then, for a token seen c > 0 times among the recent ones (OpenAI's penalties, as
    // llama.cpp applies them): logit -= c * frequency_penalty + presence_penalty.
    float frequency_penalty = 0.0f;
    float presence_penalty = 0.0f;
    int repeat_last_n = 64;  // how many of the most recent tokens the penalties look at
    uint64_t seed = 0x5EED;
    // Added to these tokens' logits before everything else (llama.cpp's --logit-bias; -inf
    // bans a token). An id listed twice gets the sum. Finite values or -inf only.
    std::vector<std::pair<TokenId, float>> logit_bias;
};

// The biases sorted by id, each id once (values summed; -inf wins). Throws Error for an id
// outside [0, n_vocab). Shared by Sampler and the CUDA sampler's host side.
std::vector<std::pair<TokenId, float>> merged_logit_bias(const SamplingParams& params,
                                                         int64_t n_vocab);
// logit + bias as the sampler applies it: -inf stays -inf, the sum is kept below +inf.
inline float biased_logit(float logit, float bias) {
    const float l = logit + bias;
    return l > 3.402823466e+38f ? 3.402823466e+38f : l;
}

// The tokens the penalties apply to, each once with its count, sorted by id: the last
// repeat_last_n entries of `recent` (all for -1); empty when no penalty is on. Throws Error
// for an id outside [0, n_vocab). Shared by Sampler and the CUDA sampler's host side.
std::vector<std::pair<TokenId, int32_t>> penalized_token_counts(const SamplingParams& params,
                                                                std::span<const TokenId> recent,
                                                                int64_t n_vocab);

// A generated token's log-probability under the model's own distribution (softmax of the raw
// logits: temperature 1, before penalties, filters and grammar, as OpenAI's and llama.cpp's
// logprobs), with the n most likely tokens.
struct TokenLogprob {
    TokenId token = -1;
    float logprob = 0.0f;  // natural log; -inf for a token the model gives no chance
};
struct TokenLogprobs {
    TokenLogprob chosen;
    std::vector<TokenLogprob> top;  // [n] most likely first (lower id first on ties)
};
constexpr int32_t kMaxLogprobs = 100;  // the most alternatives a request may ask for

// logits: [n_vocab] (NaN counts as -inf). Throws Error when no logit is finite or `chosen` is
// outside [0, n_vocab).
TokenLogprobs token_logprobs(const float* logits, int n_vocab, TokenId chosen, int32_t n_top);

// Throws Error naming the first parameter outside its range, its value and the range (the
// same rule for command-line flags, JSON requests and the Sampler constructor).
void sampling_validate(const SamplingParams& params);

// Which tokens may come next (grammar-constrained generation, grammar.h). The sampler asks
// allows() for single tokens (the greedy pick, the best few under top-k) and allowed_mask()
// when it needs the whole vocabulary; both must agree.
class TokenConstraint {
  public:
    virtual ~TokenConstraint() = default;
    virtual bool allows(TokenId token) const = 0;
    // mask: [n_vocab], set to 1 for allowed tokens and 0 for the rest.
    virtual void allowed_mask(std::span<uint8_t> mask) const = 0;
};

class Sampler {
  public:
    // Throws Error for invalid parameters (see sampling_validate).
    explicit Sampler(const SamplingParams& params);

    // Picks the next token. logits: [n_vocab]; recent_tokens: the sequence so far (only its
    // last repeat_last_n entries are penalized). Throws Error when no logit is finite or a
    // recent token id is outside [0, n_vocab).
    TokenId sample(const float* logits, int n_vocab, std::span<const TokenId> recent_tokens);
    // The same with a given uniform number u in [0, 1) instead of the RNG's next one (ignored
    // when greedy): sample(x) == sample_with(x, uniform()) for non-greedy parameters.
    TokenId sample_with(const float* logits, int n_vocab, std::span<const TokenId> recent_tokens,
                        double u);

    // The final distribution after the filters (one-hot at the argmax when greedy).
    std::vector<float> probabilities(const float* logits, int n_vocab,
                                     std::span<const TokenId> recent_tokens);
    // The same into a caller buffer: probs: [n_vocab], zero for excluded tokens, sums to 1.
    void compute_probabilities(const float* logits, int n_vocab,
                               std::span<const TokenId> recent_tokens, float* probs);
    // Draws a token from a distribution (probs: [n_vocab], non-negative, not all zero; need
    // not be normalized) with this sampler's RNG. For the same RNG state,
    // sample_from(probabilities(x)) == sample(x) for non-greedy parameters.
    TokenId sample_from(const float* probs, int n_vocab);
    // The next uniform number in [0, 1) from the RNG (speculative acceptance tests).
    double uniform();

    void reseed(uint64_t seed) { rng_.seed(seed); }
    // Every later pick and distribution is restricted to the tokens `c` allows, exactly as if
    // the others had -inf logits before the filter chain (null: no constraint). The
    // constraint must outlive its use; when it allows no token, sampling throws Error.
    void set_constraint(const TokenConstraint* c) { constraint_ = c; }
    const SamplingParams& params() const { return params_; }
    bool greedy() const { return params_.temperature <= 0.0f; }

  private:
    // Runs the filter chain; leaves the surviving candidates in cand_ (sorted by token id) and
    // their probabilities in cand_prob_.
    void filter(const float* logits, int n_vocab, std::span<const TokenId> recent_tokens);
    // Copies logits into work_ with NaN -> -inf and the repetition, frequency and presence
    // penalties applied.
    void penalized_logits(const float* logits, int n_vocab, std::span<const TokenId> recent);
    TokenId argmax_of_work() const;
    // Sets every token the constraint refuses to -inf in work_ (throws when none is left).
    void mask_work();
    // The greedy pick under the constraint: the argmax when allowed (the common case, one
    // check), else the argmax of the masked logits.
    TokenId constrained_argmax();

    SamplingParams params_;
    std::mt19937_64 rng_;
    std::vector<float> work_;                      // [n_vocab] penalized logits
    std::vector<std::pair<float, TokenId>> cand_;  // surviving (logit, id)
    std::vector<float> cand_prob_;                 // [cand_.size()]
    const TokenConstraint* constraint_ = nullptr;
    std::vector<std::pair<TokenId, float>> bias_;  // merged_logit_bias, computed once
    std::vector<uint8_t> mask_;                    // [n_vocab] scratch for the constraint's mask
};

}  // namespace kvrun
