// Speculative decoding with a draft model (Leviathan et al. 2023, Chen et al. 2023): a small
// draft model proposes K tokens autoregressively, the target scores all K + 1 positions in one
// forward pass, and tokens are accepted so that the output distribution is exactly the
// target's (greedy: the target's argmax sequence). Each model has its own backend and KV block
// table; rejected positions are truncated from both tables.
//
// The rounds run inside the Engine (EngineOptions::draft; engine_speculative.cpp), where every
// sequence of a batch speculates on its own; the acceptance rule is in speculative_accept.h.
// SpeculativeDecoder is the one-request view of such an engine (tests, simple callers):
//   SpeculativeDecoder dec(*target.backend, *draft.backend, *target.tokenizer, options);
//   GenerationResult r = dec.generate(request, on_token, &cancel);  // or start()/step()/finish()
//   dec.stats() -> drafted, accepted, acceptance, passes, timings (cumulative).
// check_vocab_compatible() compares the two tokenizers (load_draft_model calls it).
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
#include "speculative_accept.h"
#include "tokenizer.h"

namespace kvrun {

// Throws Error unless the draft can stand in for the target: same n_vocab and the same token
// text for every id (the draft proposes target token ids).
void check_vocab_compatible(const Tokenizer& target, const Tokenizer& draft);

struct SpeculativeOptions {
    int32_t draft_max = 8;     // --draft-n: the most tokens the draft proposes in one round
    int32_t draft_min = 1;     // the fewest (draft_min == draft_max: K fixed, no adaptation)
    int32_t n_batch = 512;     // tokens per forward pass when prefilling a prompt
    int32_t n_ctx = 0;         // max tokens per sequence; 0: the target's training context
    bool prefix_cache = true;  // reuse cached prompt blocks between requests (chat turns)
    AcceptRule rule = AcceptRule::Lossless;
};

class SpeculativeDecoder {
  public:
    // Both backends must outlive the decoder, whose engine owns their KV pools while it lives;
    // `tokenizer` is the target's (stop checks). Throws Error for mismatched vocabulary sizes
    // or bad options.
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
    SeqId target_seq() const;
    SeqId draft_seq() const;
    const KvBlockTable& target_table() const { return engine_.kv_table(); }
    const KvBlockTable& draft_table() const { return *engine_.draft_kv_table(); }
    // Cumulative since construction or reset_stats().
    SpeculativeStats stats() const { return engine_.stats().spec - base_; }
    void reset_stats() { base_ = engine_.stats().spec; }
    int32_t n_ctx() const { return engine_.n_ctx(); }
    int32_t current_k() const;  // the adaptive draft length for the next round
    const Engine& engine() const { return engine_; }

  private:
    Engine engine_;
    SpeculativeStats base_;  // engine counters at the last reset_stats()

    // The current request.
    bool active_ = false, done_ = false;
    int32_t request_ = -1;
    std::function<void(TokenId)> on_token_;
    std::vector<TokenId> tokens_;  // [n_prompt + n_generated]
    GenerationResult result_;
};

}  // namespace kvrun
