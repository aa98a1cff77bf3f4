// Speculative-decoding flags, draft model loading and the speculative --stats block.
#include "modes/draft_options.h"

#include <fmt/core.h>

#include <algorithm>

#include "common.h"
#include "model_config.h"

namespace kvrun {

void add_draft_options(CLI::App* cmd, DraftOptions& o) {
    cmd->add_option("--draft-model", o.model,
                    "Speculative decoding: a small GGUF model of the same family that drafts "
                    "tokens for the target to verify (output unchanged)")
        ->check(CLI::ExistingFile);
    cmd->add_option("--draft-n", o.n_max,
                    "Most tokens the draft proposes per round (adapted to the acceptance rate)")
        ->check(CLI::Range(1, 256))
        ->capture_default_str();
    cmd->add_option("--draft-min", o.n_min, "Fewest tokens drafted per round (= --draft-n: fixed)")
        ->check(CLI::Range(1, 256))
        ->capture_default_str();
    cmd->add_flag("--spec-baseline", o.baseline,
                  "With --stats and --draft-model: afterwards run the target alone on the same "
                  "request and report the measured speed-up");
}

int32_t target_context(const ModelOptions& o, const Backend& target) {
    int64_t ctx = o.n_ctx > 0 ? o.n_ctx : target.config().n_ctx_train;
    if (ctx <= 0) ctx = 4096;
    return static_cast<int32_t>(std::min(ctx, target.n_kv_blocks() * target.kv_block_size()));
}

LoadedModel load_draft_model(const DraftOptions& d, const ModelOptions& target_options,
                             const LoadedModel& target) {
    if (d.n_min > d.n_max) fail("--draft-min {} is larger than --draft-n {}", d.n_min, d.n_max);
    ModelOptions o = target_options;
    o.model = d.model;
    o.device = target.device;  // the same device the target got
    o.n_ctx = target_context(target_options, *target.backend);
    o.kv_memory_mib = 0;  // sized for the target's context
    LoadedModel draft = load_model(o, 1);
    try {
        check_vocab_compatible(*target.tokenizer, *draft.tokenizer);
    } catch (const Error& e) {
        throw Error(fmt::format("--draft-model {}: {}", d.model, e.what()), e.hint());
    }
    return draft;
}

SpeculativeOptions speculative_options(const DraftOptions& d, const ModelOptions& target_options,
                                       const LoadedModel& target) {
    SpeculativeOptions s;
    s.draft_max = d.n_max;
    s.draft_min = std::min(d.n_min, d.n_max);
    s.n_batch = target_options.n_batch;
    s.n_ctx = target_context(target_options, *target.backend);
    return s;
}

double generation_ms(const GenerationTimings& t) {
    return t.prefill_ms + t.decode_ms;
}

double generation_tokens_per_s(const GenerationTimings& t) {
    const double ms = generation_ms(t);
    return ms > 0 ? t.n_generated / (ms / 1000.0) : 0.0;
}

void print_speculative_stats(const SpeculativeStats& s, const GenerationResult& r) {
    fmt::print(stderr,
               "speculative       {} drafted, {} accepted ({:.1f}%), {:.2f} accepted per round "
               "({} rounds)\n"
               "target passes     {} for {} tokens ({:.2f} tokens per pass), draft passes {}\n"
               "time in models    target {:.1f} ms, draft {:.1f} ms\n"
               "generation        {:.1f} tokens/s (prompt included)\n",
               s.drafted, s.accepted, 100.0 * s.acceptance(), s.mean_accepted(), s.rounds,
               s.target_passes, s.generated, s.tokens_per_target_pass(), s.draft_passes,
               s.target_ms, s.draft_ms, generation_tokens_per_s(r.timings));
}

}  // namespace kvrun
