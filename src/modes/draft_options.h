// Generation flags and helpers shared by the modes that run the engine (run, chat, batch):
// the speculative-decoding flags (--draft-model or --draft-ngram, --draft-n, --draft-min,
// --spec-baseline) and
// loading the draft beside a loaded target, the engine options they imply, the -n check, the
// one-time warning when the KV pool caps the context, and the speculative --stats lines.
#pragma once

#include "modes/cli_fwd.h"
#include <cstdint>
#include <string>

#include "engine.h"
#include "modes/model_options.h"
#include "speculative.h"

namespace kvrun {

struct DraftOptions {
    std::string model;      // --draft-model: empty = no draft model
    int32_t ngram = 0;      // --draft-ngram: prompt lookup drafting with n-grams up to this
    int32_t n_max = 8;      // --draft-n: most tokens drafted per round (and sequence)
    int32_t n_min = 1;      // --draft-min: fewest (== n_max: fixed K)
    float p_min = 0.0f;     // --draft-p-min: stop a round at a draft token less likely than this
    bool baseline = false;  // --spec-baseline: also time the target alone (run --stats)
    bool enabled() const { return !model.empty(); }             // a draft model to load
    bool speculates() const { return enabled() || ngram > 0; }  // either kind of drafts
};

// `baseline`: also offer --spec-baseline (run only).
void add_draft_options(CLI::App* cmd, DraftOptions& o, bool baseline = false);

// The check of -n/--n-predict: -1 (no limit) or a count >= 0; anything else is refused with
// one clear line.
CLI::Validator n_predict_check();

// The context the target runs with: -c (or its training context), capped by its KV pool.
int32_t target_context(const ModelOptions& o, const Backend& target);

// Loads the draft with the target's device and KV flags and checks that the vocabularies agree
// (throws Error naming the mismatch). Its KV pool holds the target's pool plus K tokens and two
// blocks per sequence, for an engine running `n_sequences` at once.
LoadedModel load_draft_model(const DraftOptions& d, const ModelOptions& target_options,
                             const LoadedModel& target, int32_t n_sequences = 1);

// engine_options(o, max_parallel), plus the draft model when one was loaded (draft.backend set).
EngineOptions generation_engine_options(const ModelOptions& o, int32_t max_parallel,
                                        const DraftOptions& d, const LoadedModel& draft);

// Prints one warning to stderr when the KV pool made the engine's context smaller than the one
// asked for (-c, or the model's training context): "from M to N tokens". The library itself
// prints nothing.
void warn_if_context_capped(const Engine& e, const ModelOptions& o);

// The --stats / summary block for speculation: drafted, accepted, acceptance, mean accepted
// length per round, target passes per token, time in each model.
void print_speculative_stats(const SpeculativeStats& s);

// Total generation time (prompt included) and tokens per second over it.
double generation_ms(const GenerationTimings& t);
double generation_tokens_per_s(const GenerationTimings& t);

}  // namespace kvrun
