// --context-shift and --keep N (llama.cpp's flags) for `run`, `batch` and `server`: when a
// request's context fills up before it has generated n_predict tokens, keep the first n_keep prompt
// tokens (BOS always), drop the older half of the rest and go on generating, as often as it takes.
// llama.cpp re-rotates the cached keys of the tokens it keeps; kvrun re-prefills them (the
// prefix cache still serves the kept head), so their K/V are exactly those of a run on the
// shortened text.
#pragma once

#include "modes/cli_fwd.h"
#include <atomic>
#include <cstdint>
#include <vector>

#include "engine.h"

namespace kvrun {

struct ContextShiftOptions {
    bool enabled = false;
    int32_t n_keep = 0;  // prompt tokens always kept after BOS; -1: the whole prompt
};

// --context-shift and --keep N.
void add_context_shift_options(CLI::App* cmd, ContextShiftOptions& o);

// The sequence `all` (prompt + generated so far) after one shift: its first `keep` tokens,
// then the newer half of the others. Empty when there is nothing to drop.
std::vector<TokenId> context_shift_tokens(const std::vector<TokenId>& all, int32_t keep);

// The tokens a shift keeps at the head of `prompt` (ContextShiftOptions::n_keep resolved:
// BOS counted on top, -1 or more than the prompt: the whole prompt).
int32_t context_shift_keep(const std::vector<TokenId>& prompt, int32_t n_keep, TokenId bos);

// One request's rounds under --context-shift (single sample): give it each finished round;
// it says whether to go on with request() (the context shifted) and merges the rounds into
// result(): all generated tokens and their log-probabilities, the last stop reason, the first
// round's prompt timings with the later rounds' time counted as decoding, and the
// speculation counters. Each later round draws with a new seed, continues the grammar and
// sees the reply's last bytes for stop strings that span two rounds.
class ContextShiftRun {
  public:
    // Throws Error for a request with several samples.
    ContextShiftRun(GenerationRequest req, const ContextShiftOptions& o, const Tokenizer& tok);
    const GenerationRequest& request() const { return req_; }  // the next round to submit
    // True: submit request() again. `cancelled`: the user stopped, no further round.
    bool add(const GenerationResult& round, bool cancelled);
    const GenerationResult& result() const { return total_; }
    int32_t shifts() const { return shifts_; }

  private:
    GenerationRequest req_;
    ContextShiftOptions o_;
    const Tokenizer& tok_;
    int32_t keep_ = 0;
    uint64_t seed_ = 0;
    std::vector<TokenId> all_;  // the current round's prompt + its tokens
    GenerationResult total_;
    int32_t rounds_ = 0, shifts_ = 0;
};

// Runs one single-sample request to its end on `engine` (which must be idle), shifting the
// context as the options say (ContextShiftRun). The result merges every round: all generated tokens
// and their log-probabilities, the last stop reason, the first round's prompt timings with the
// later rounds' time counted as decoding, and the speculation counters. `n_shifts` (optional)
// receives the shifts made. Replaces the engine's finish callback (cleared on return).
GenerationResult run_with_context_shift(Engine& engine, GenerationRequest req,
                                        const ContextShiftOptions& o, const Tokenizer& tok,
                                        const std::atomic<bool>* cancel, int32_t* n_shifts);

}  // namespace kvrun
