// --context-shift: see context_shift.h.
#include "modes/context_shift.h"

#include <CLI/CLI.hpp>
#include <algorithm>

#include "common.h"

namespace kvrun {

void add_context_shift_options(CLI::App* cmd, ContextShiftOptions& o) {
    cmd->add_flag("--context-shift", o.enabled,
                  "When a request's context fills before its -n tokens, drop the older half of "
                  "the tokens after --keep and go on, re-prefilling what is kept (llama.cpp's "
                  "flag; one sample per request)");
    cmd->add_option("--keep", o.n_keep,
                    "Prompt tokens --context-shift always keeps after BOS (-1: the whole prompt)")
        ->check(CLI::Range(-1, INT32_MAX))
        ->capture_default_str();
}

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

ContextShiftRun::ContextShiftRun(GenerationRequest req, const ContextShiftOptions& o,
                                 const Tokenizer& tok)
    : req_(std::move(req)), o_(o), tok_(tok) {
    if (req_.n_samples > 1) fail("--context-shift runs one sample per request");
    keep_ = context_shift_keep(req_.prompt, o_.n_keep, tok_.bos());
    seed_ = req_.sampling.seed;
    all_ = req_.prompt;
}

bool ContextShiftRun::add(const GenerationResult& round, bool cancelled) {
    all_.insert(all_.end(), round.tokens.begin(), round.tokens.end());
    if (rounds_++ == 0) {
        total_ = round;
    } else {
        total_.tokens.insert(total_.tokens.end(), round.tokens.begin(), round.tokens.end());
        total_.logprobs.insert(total_.logprobs.end(), round.logprobs.begin(), round.logprobs.end());
        total_.stop = round.stop;
        total_.error = round.error;
        total_.preemptions += round.preemptions;
        total_.n_drafted += round.n_drafted;
        total_.n_accepted += round.n_accepted;
        total_.n_spec_rounds += round.n_spec_rounds;
        total_.n_target_passes += round.n_target_passes;
        total_.reasoning = round.reasoning;
        // A later round's queueing and re-prefill is time spent generating.
        total_.timings.decode_ms +=
            round.timings.queue_ms + round.timings.prefill_ms + round.timings.decode_ms;
        total_.timings.n_generated += round.timings.n_generated;
    }
    if (!o_.enabled || round.stop != StopReason::Context || cancelled) return false;
    if (req_.n_predict >= 0) {
        req_.n_predict -= static_cast<int32_t>(round.tokens.size());
        if (req_.n_predict <= 0) {
            total_.stop = StopReason::Length;
            return false;
        }
    }
    std::vector<TokenId> next = context_shift_tokens(all_, keep_);
    if (next.empty()) return false;  // only kept tokens: stays a "context" stop
    if (req_.grammar)                // the reply so far, for the grammar's state
        req_.grammar_prefix = total_.tokens;
    if (!req_.stop_strings.empty()) {  // a stop string may begin in the reply so far
        size_t longest = 1;
        for (const std::string& stop : req_.stop_strings) longest = std::max(longest, stop.size());
        std::string text;
        for (TokenId t : total_.tokens) text += tok_.token_to_piece(t);
        req_.stop_text_before = text.substr(text.size() - std::min(text.size(), longest - 1));
    }
    // The reasoning budget counts over the whole reply: the next round starts where this
    // one stopped (inside a block or not, tokens spent, forcing under way).
    if (req_.reasoning_budget.tokens >= 0) req_.reasoning_budget.state = round.reasoning;
    all_ = next;
    req_.prompt = std::move(next);
    ++shifts_;
    // A new draw sequence per round: the same seed would replay the first round's draws.
    req_.sampling.seed = seed_ + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(shifts_);
    return true;
}

GenerationResult run_with_context_shift(Engine& engine, GenerationRequest req,
                                        const ContextShiftOptions& o, const Tokenizer& tok,
                                        const std::atomic<bool>* cancel, int32_t* n_shifts) {
    ContextShiftRun run(std::move(req), o, tok);
    GenerationResult round;
    engine.on_finish([&](const GenerationResult& r) { round = r; });
    struct Unhook {  // also when submit throws: the callback must not outlive `round`
        Engine& e;
        ~Unhook() { e.on_finish(nullptr); }
    } unhook{engine};
    do {
        engine.submit(run.request());
        engine.run(cancel);
    } while (run.add(round, cancel && *cancel));
    if (n_shifts) *n_shifts = run.shifts();
    return run.result();
}

}  // namespace kvrun
