// --context-shift: see context_shift.h.
#include "modes/context_shift.h"

#include <algorithm>

#include "common.h"

namespace kvrun {

std::vector<TokenId> context_shift_tokens(const std::vector<TokenId>& all, int32_t keep) {
    const int64_t n = static_cast<int64_t>(all.size());
    keep = static_cast<int32_t>(std::clamp<int64_t>(keep, 0, n));
    const int64_t n_discard = (n - keep) / 2;
    if (n_discard <= 0) return {};
    std::vector<TokenId> out(all.begin(), all.begin() + keep);
    out.insert(out.end(), all.begin() + keep + n_discard, all.end());
    return out;
}

int32_t context_shift_keep(const std::vector<TokenId>& prompt, int32_t n_keep, TokenId bos) {
    const int32_t n = static_cast<int32_t>(prompt.size());
    if (n_keep < 0) return n;
    const int32_t with_bos = n_keep + (n > 0 && prompt[0] == bos ? 1 : 0);
    return std::min(with_bos, n);
}

GenerationResult run_with_context_shift(Engine& engine, GenerationRequest req,
                                        const ContextShiftOptions& o, TokenId bos,
                                        const std::atomic<bool>* cancel, int32_t* n_shifts) {
    if (req.n_samples > 1) fail("--context-shift runs one sample per request");
    const int32_t keep = context_shift_keep(req.prompt, o.n_keep, bos);
    const uint64_t seed = req.sampling.seed;
    std::vector<TokenId> all = req.prompt;
    GenerationResult total;
    GenerationResult round;
    engine.on_finish([&](const GenerationResult& r) { round = r; });
    int32_t shifts = 0;
    for (;;) {
        engine.submit(req);
        engine.run(cancel);
        all.insert(all.end(), round.tokens.begin(), round.tokens.end());
        if (shifts == 0) {
            total = round;
        } else {
            total.tokens.insert(total.tokens.end(), round.tokens.begin(), round.tokens.end());
            total.logprobs.insert(total.logprobs.end(), round.logprobs.begin(),
                                  round.logprobs.end());
            total.stop = round.stop;
            total.error = round.error;
            total.preemptions += round.preemptions;
            total.n_drafted += round.n_drafted;
            total.n_accepted += round.n_accepted;
            total.n_spec_rounds += round.n_spec_rounds;
            total.n_target_passes += round.n_target_passes;
            // A later round's queueing and re-prefill is time spent generating.
            total.timings.decode_ms +=
                round.timings.queue_ms + round.timings.prefill_ms + round.timings.decode_ms;
            total.timings.n_generated += round.timings.n_generated;
        }
        if (!o.enabled || round.stop != StopReason::Context || (cancel && *cancel)) break;
        if (req.n_predict >= 0) {
            req.n_predict -= static_cast<int32_t>(round.tokens.size());
            if (req.n_predict <= 0) {
                total.stop = StopReason::Length;
                break;
            }
        }
        std::vector<TokenId> next = context_shift_tokens(all, keep);
        if (next.empty()) break;  // only kept tokens: stays a "context" stop
        if (req.grammar)          // the reply so far, for the grammar's state
            req.grammar_prefix = total.tokens;
        all = next;
        req.prompt = std::move(next);
        ++shifts;
        // A new draw sequence per round: the same seed would replay the first round's draws.
        req.sampling.seed = seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(shifts);
    }
    engine.on_finish(nullptr);
    if (n_shifts) *n_shifts = shifts;
    return total;
}

}  // namespace kvrun
