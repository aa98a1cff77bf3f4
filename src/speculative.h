// Speculative decoding with a draft model (Leviathan et al. 2023, Chen et al. 2023): a small
// draft model proposes K tokens autoregressively, the target scores all K + 1 positions in one
// forward pass, and tokens are accepted so that the output distribution is exactly the
// target's (greedy: the target's argmax sequence). Each model has its own backend and KV block
// table; rejected positions are truncated from both tables.
//
// Use from a mode (run; chat and batch later):
//   check_vocab_compatible(*target.tokenizer, *draft.tokenizer);   // done by the constructor too
//   SpeculativeDecoder dec(*target.backend, *draft.backend, *target.tokenizer, options);
//   GenerationResult r = dec.generate(request, on_token, &cancel);  // or start()/step()/finish()
//   dec.stats() -> drafted, accepted, acceptance, passes, timings (cumulative).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend.h"
#include "engine.h"
#include "kv_block_table.h"
#include "sampler.h"
#include "tokenizer.h"

namespace kvrun {

// Throws Error unless the draft can stand in for the target: same n_vocab and the same token
// text for every id (the draft proposes target token ids).
void check_vocab_compatible(const Tokenizer& target, const Tokenizer& draft);

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

struct SpeculativeOptions {
    int32_t draft_max = 8;     // --draft-n: the most tokens the draft proposes in one round
    int32_t draft_min = 1;     // the fewest (draft_min == draft_max: K fixed, no adaptation)
    int32_t n_batch = 512;     // tokens per forward pass when prefilling a prompt
    int32_t n_ctx = 0;         // max tokens per sequence; 0: the target's training context
    bool prefix_cache = true;  // reuse cached prompt blocks between requests (chat turns)
    AcceptRule rule = AcceptRule::Lossless;
};

// Cumulative over every request of one decoder (reset_stats() clears it).
struct SpeculativeStats {
    int64_t rounds = 0;                  // verification passes that carried at least one draft
    int64_t drafted = 0;                 // draft tokens proposed
    int64_t accepted = 0;                // draft tokens accepted
    int64_t generated = 0;               // tokens output
    int64_t target_passes = 0;           // target forward passes (prompt chunks included)
    int64_t draft_passes = 0;            // draft forward passes
    double target_ms = 0, draft_ms = 0;  // time inside each backend's forward
    double acceptance() const { return drafted > 0 ? double(accepted) / double(drafted) : 0.0; }
    double mean_accepted() const { return rounds > 0 ? double(accepted) / double(rounds) : 0.0; }
    double tokens_per_target_pass() const {
        return target_passes > 0 ? double(generated) / double(target_passes) : 0.0;
    }
};

class SpeculativeDecoder {
  public:
    // Both backends must outlive the decoder; `tokenizer` is the target's (stop checks). Throws
    // Error for mismatched vocabulary sizes or bad options.
    SpeculativeDecoder(Backend& target, Backend& draft, const Tokenizer& tokenizer,
                       SpeculativeOptions options);
    ~SpeculativeDecoder();

    // Runs one request to the end (n_samples must be 1). on_token sees each output token in
    // order (not the end-of-generation token). `cancel` is polled between rounds.
    GenerationResult generate(const GenerationRequest& request,
                              const std::function<void(TokenId)>& on_token = {},
                              const std::atomic<bool>* cancel = nullptr);

    // Step-wise form of generate(): start() validates and queues the request (throws Error
    // like Engine::submit); each step() runs one round (draft K, verify, roll back) and returns
    // false once the request finished; finish() returns the result and frees the sequences
    // (also mid-way: then the stop reason is Cancelled).
    void start(const GenerationRequest& request, std::function<void(TokenId)> on_token = {});
    bool step();
    GenerationResult finish();
    bool active() const { return active_; }

    // Prompt + generated tokens of the current request.
    const std::vector<TokenId>& tokens() const { return tokens_; }
    // The current request's KV sequences (-1 when none).
    SeqId target_seq() const { return target_seq_; }
    SeqId draft_seq() const { return draft_seq_; }
    const KvBlockTable& target_table() const { return target_table_; }
    const KvBlockTable& draft_table() const { return draft_table_; }
    const SpeculativeStats& stats() const { return stats_; }
    void reset_stats() { stats_ = {}; }
    int32_t n_ctx() const { return n_ctx_; }
    int32_t current_k() const { return k_; }  // the adaptive draft length for the next round

  private:
    using Clock = std::chrono::steady_clock;
    // Appends toks to `seq` and runs them through `backend` in chunks of n_batch; the last
    // n_logits tokens produce logits into out: [n_logits][n_vocab]. Returns forward passes run.
    int64_t feed(Backend& backend, KvBlockTable& table, SeqId seq, std::span<const TokenId> toks,
                 int32_t n_logits, float* out);
    // The draft proposes up to k tokens into drafts_ (q rows into q_).
    void propose(int32_t k);
    // One round's passes: k drafts, the target over them, and the acceptance decision.
    SpecAcceptResult draft_and_verify(int32_t k);
    // Checks the stop conditions after `tok` was appended (as Engine does).
    StopReason check_stop(TokenId tok);
    void adapt(int32_t k, int32_t n_accepted);

    Backend& target_;
    Backend& draft_;
    const Tokenizer& tok_;
    SpeculativeOptions opt_;
    KvBlockTable target_table_, draft_table_;
    int32_t n_ctx_ = 0;
    int32_t n_vocab_ = 0;
    int32_t k_ = 1;
    SpeculativeStats stats_;

    // The current request.
    bool active_ = false;
    GenerationRequest req_;
    std::function<void(TokenId)> on_token_;
    std::unique_ptr<Sampler> target_sampler_, draft_sampler_;
    SeqId target_seq_ = -1, draft_seq_ = -1;
    std::vector<TokenId> tokens_;  // [n_prompt + n_generated]
    int32_t n_prompt_ = 0, n_prompt_computed_ = 0;
    StopReason stop_ = StopReason::None;
    std::string text_;  // generated text (kept only for stop strings)
    Clock::time_point t_start_, t_first_, t_last_;
    bool has_first_ = false;

    // Scratch.
    std::vector<TokenId> drafts_;    // [k]
    std::vector<float> q_;           // [k][n_vocab] draft distributions
    std::vector<float> p_;           // [k + 1][n_vocab] target distributions
    std::vector<float> logits_;      // [k + 1][n_vocab]
    std::vector<TokenId> feed_buf_;  // tokens of one feed
};

}  // namespace kvrun
