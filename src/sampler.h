// Token sampling on the host: llama.cpp's default chain (logit bias, repetition/frequency/
// presence penalties, DRY, top-n-sigma, top-k, typical, top-p, min-p, XTC, temperature or
// dynamic temperature — or mirostat 1/2 after DRY — then a seeded draw), greedy argmax when
// temperature <= 0, and the filtered distribution itself (speculative decoding compares target
// and draft distributions).
// Deterministic across platforms: std::mt19937_64 plus our own uniform conversion.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer.h"

namespace kvrun {

// The filters llama.cpp's --samplers can reorder (the logit bias, the penalties and DRY
// always come first).
enum class SamplerStep : uint8_t { TopNSigma, TopK, Typical, TopP, MinP, Xtc, Temperature };

// Defaults follow llama.cpp. A filter whose value disables it: top_k == 0, top_p == 1,
// min_p == 0, repeat_penalty == 1, frequency_penalty == presence_penalty == 0,
// repeat_last_n == 0 (-1: every recent token given; it bounds all three penalties),
// dry_multiplier == 0, top_n_sigma <= 0, typical_p == 1, xtc_probability == 0,
// dynatemp_range == 0. Valid ranges (sampling_validate): temperature >= 0, top_k >= 0, top_p,
// min_p, typical_p, xtc_probability and xtc_threshold in [0, 1], repeat_penalty > 0,
// repeat_last_n and dry_penalty_last_n >= -1, dry_multiplier, dynatemp_range and
// dynatemp_exponent >= 0, dry_base >= 1, dry_allowed_length >= 1, all finite.
//
// Greedy (temperature 0) takes the argmax of the logits after the bias, the penalties and
// DRY; the filters from top-n-sigma to XTC choose among candidates and do not apply.
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

    // DRY, "don't repeat yourself" (koboldcpp's, as llama.cpp has it): when the last n tokens
    // occurred earlier followed by token t, and n >= dry_allowed_length, t's logit loses
    // dry_multiplier * dry_base^(n - dry_allowed_length). A repetition never reaches back
    // past a sequence breaker: a string whose occurrence in the text ends a run (any token
    // whose text completes one). Applied after the other penalties, over the last
    // dry_penalty_last_n tokens of the sequence (prompt included; -1: all of it, 0: off).
    float dry_multiplier = 0.0f;  // 0: off
    float dry_base = 1.75f;
    int dry_allowed_length = 2;
    int dry_penalty_last_n = -1;
    std::vector<std::string> dry_sequence_breakers = {"\n", ":", "\"", "*"};

    // top-n-sigma: keep the tokens whose logit is at least max - top_n_sigma x the standard
    // deviation of the logits (before top-k; <= 0: off).
    float top_n_sigma = -1.0f;
    // Locally typical sampling: keep the tokens whose surprise is closest to the entropy until
    // their mass reaches typical_p (after top-k, before top-p; 1: off).
    float typical_p = 1.0f;
    // XTC, "exclude top choices": with probability xtc_probability, when two or more tokens
    // have a probability >= xtc_threshold, all of them but the least likely are dropped
    // (after min-p). The coin is part of the distribution: probabilities() returns the
    // mixture, so speculative decoding stays exact.
    float xtc_probability = 0.0f;
    float xtc_threshold = 0.1f;
    // Dynamic temperature: the temperature runs from temperature - dynatemp_range to
    // temperature + dynatemp_range (never below 0) as the candidates' normalized entropy, to
    // the power dynatemp_exponent, runs from 0 to 1 (0: a fixed temperature).
    float dynatemp_range = 0.0f;
    float dynatemp_exponent = 1.0f;
    // Mirostat 1 or 2 (0: off) replaces the filters after the penalties and DRY: the
    // candidates at the temperature are cut so that the surprise (-log2 p) of the drawn tokens
    // tracks mirostat_tau, learning at rate mirostat_eta. Its state changes with every draw, so
    // a sequence using it does not speculate.
    int mirostat = 0;
    float mirostat_tau = 5.0f;
    float mirostat_eta = 0.1f;
    // The filters in this order instead of the default (llama.cpp's --samplers). Each filter
    // sees the logits as the steps before it left them: after "temperature" they are divided
    // by it, so a later top-p works on the tempered distribution. A filter left out does not
    // run; without "temperature" the distribution is the softmax of the filtered logits at
    // temperature 1 (temperature 0 is still greedy). XTC's coin stays part of the
    // distribution (the steps after it run for both outcomes). Empty: the default order.
    std::vector<SamplerStep> order = {};
};

// llama.cpp's --samplers names, ';'-separated ("top_k;top_p;min_p;temperature"; also
// "top-k", "typ_p", "typical", "nucleus", "temp", "top_n_sigma", ...; "penalties" and "dry"
// are accepted at the front, where they always run). Throws Error for an unknown or
// repeated name, or penalties/dry after a filter.
std::vector<SamplerStep> sampler_order_parse(std::string_view names);
// llama.cpp's --sampling-seq letters: s top-n-sigma, k top-k, y typical, p top-p, m min-p,
// x XTC, t temperature (e penalties, d DRY accepted at the front). Same errors.
std::vector<SamplerStep> sampler_seq_parse(std::string_view letters);
// "top_k;top_p;temperature" (the default order for an empty one).
std::string sampler_order_name(const std::vector<SamplerStep>& order);

// True when the parameters use a filter only the host sampler has (DRY, top-n-sigma,
// typical, XTC, dynamic temperature, mirostat): such rows are not sampled on the GPU.
bool sampling_needs_host(const SamplingParams& params);

// How many of the last tokens of a sequence the sampler looks at: the longer of the
// penalties' and DRY's windows (-1: all of them).
int32_t sampling_history_length(const SamplingParams& params);

// DRY's penalties for the next token: (token, amount to subtract from its logit), each token
// once, sorted by id. history: the sequence so far (only its last dry_penalty_last_n tokens
// count); pieces: [n_vocab] each token's text, needed to find the sequence breakers (throws
// Error when breakers are set and pieces is null). Empty when DRY is off.
std::vector<std::pair<TokenId, float>> dry_penalties(const SamplingParams& params,
                                                     std::span<const TokenId> history,
                                                     const std::vector<std::string>* pieces);

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
    // With mirostat: the distribution of the next draw, which moves with each sample(); the
    // target surprise's running estimate mu (2 x tau at the start).
    float mirostat_mu() const { return mu_; }
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
    // Each token's text (pieces: [n_vocab]), which DRY's sequence breakers are found in; must
    // outlive the sampler. Needed only when DRY is on with breakers.
    void set_token_pieces(const std::vector<std::string>* pieces) { pieces_ = pieces; }
    const SamplingParams& params() const { return params_; }
    bool greedy() const { return params_.temperature <= 0.0f; }

  private:
    // Runs the filter chain; leaves the surviving candidates in cand_ (sorted by token id) and
    // their probabilities in cand_prob_.
    void filter(const float* logits, int n_vocab, std::span<const TokenId> recent_tokens);
    // Copies logits into work_ with NaN -> -inf and the logit bias, the repetition, frequency
    // and presence penalties and DRY applied.
    void penalized_logits(const float* logits, int n_vocab, std::span<const TokenId> recent);
    // The filters that run on cand_ (best first): top-n-sigma (any order), typical (keeps
    // best-first order), and how many of the best XTC's coin drops (0: it does not apply).
    void top_n_sigma(std::vector<std::pair<float, TokenId>>& cand) const;
    void typical(std::vector<std::pair<float, TokenId>>& cand) const;
    // top-p on the softmax of cand (best first): the shortest head whose mass reaches top_p;
    // min-p: the tokens whose probability is at least min_p times the best one's.
    void top_p(std::vector<std::pair<float, TokenId>>& cand) const;
    void min_p(std::vector<std::pair<float, TokenId>>& cand) const;
    // Dynamic temperature for n candidates whose softmax has this entropy (nats).
    double dynamic_temperature(double entropy, size_t n) const;
    size_t xtc_cut(const std::vector<std::pair<float, TokenId>>& cand) const;
    // The filters in params_.order: cand_ and cand_prob_ (by id) from the candidates.
    void ordered_filter();
    // Runs steps [step, end) of the order on c (logits as the steps left them) and adds
    // weight x its final distribution into acc_.
    void run_steps(std::vector<std::pair<float, TokenId>> c, size_t step, double weight);
    // Mirostat's candidates and distribution (cand_, cand_prob_ by id) instead of the filters.
    void mirostat_filter();
    void collect_candidates();  // cand_ = the finite entries of work_, by id
    // out: [cand_.size()] the tempered softmax of the candidates (id order) not excluded, 0
    // for the excluded; the temperature is dynamic when dynatemp_range > 0.
    void tempered_softmax(const std::vector<uint8_t>* excluded, std::vector<float>& out) const;
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
    const std::vector<std::string>* pieces_ = nullptr;  // [n_vocab] token texts (DRY)
    std::vector<std::pair<TokenId, float>> bias_;       // merged_logit_bias, computed once
    std::vector<uint8_t> mask_;          // [n_vocab] scratch for the constraint's mask
    std::vector<TokenId> xtc_ids_;       // sorted ids XTC's coin drops
    std::vector<uint8_t> xtc_excluded_;  // [cand_.size()] 1 where XTC drops
    std::vector<float> xtc_prob_;        // [cand_.size()] the distribution after XTC
    std::vector<double> miro_p_;         // [candidates] mirostat's distribution, best first
    std::vector<double> acc_;            // [n_vocab] ordered_filter's distribution
    std::vector<TokenId> acc_ids_;       // tokens with a share in acc_
    float mu_ = 0.0f;                    // mirostat's bound on the surprise, in bits
};

}  // namespace kvrun
