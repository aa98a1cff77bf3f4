// Speculative-decoding flags shared by the modes that generate (run now; chat and batch can
// call the same three functions): --draft-model, --draft-n, --draft-min, --spec-baseline;
// loading the draft beside a loaded target; and the --stats lines.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "engine.h"
#include "modes/model_options.h"
#include "speculative.h"

namespace kvrun {

struct DraftOptions {
    std::string model;      // --draft-model: empty = no speculation
    int32_t n_max = 8;      // --draft-n: most tokens drafted per round
    int32_t n_min = 1;      // --draft-min: fewest (== n_max: fixed K)
    bool baseline = false;  // --spec-baseline: also time the target alone (with --stats)
    bool enabled() const { return !model.empty(); }
};

void add_draft_options(CLI::App* cmd, DraftOptions& o);

// The context the target runs with: -c (or its training context), capped by its KV pool.
int32_t target_context(const ModelOptions& o, const Backend& target);

// Loads the draft with the target's device and KV flags, a KV pool sized for the target's
// context, and checks that the vocabularies agree (throws Error naming the mismatch).
LoadedModel load_draft_model(const DraftOptions& d, const ModelOptions& target_options,
                             const LoadedModel& target);

SpeculativeOptions speculative_options(const DraftOptions& d, const ModelOptions& target_options,
                                       const LoadedModel& target);

// The --stats block for a speculative run: drafted, accepted, acceptance, mean accepted per
// round, target passes per token, tokens/s.
void print_speculative_stats(const SpeculativeStats& s, const GenerationResult& r);

// Total generation time (prompt included) and tokens per second over it.
double generation_ms(const GenerationTimings& t);
double generation_tokens_per_s(const GenerationTimings& t);

}  // namespace kvrun
