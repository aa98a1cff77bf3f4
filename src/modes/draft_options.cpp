// Generation flags shared by run, chat and batch: speculative decoding, -n, the capped-context
// warning and the speculative --stats lines (see draft_options.h).
#include "modes/draft_options.h"

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>

#include "common.h"
#include "model_config.h"

namespace kvrun {

void add_draft_options(CLI::App* cmd, DraftOptions& o, bool baseline) {
    cmd->add_option("--draft-model,--model-draft", o.model,
                    "Speculative decoding: a small GGUF model of the same family that drafts "
                    "tokens for the target to verify, for every sequence (output unchanged)")
        ->check(CLI::ExistingFile);
    cmd->add_option("--draft-ngram", o.ngram,
                    "Speculative decoding without a draft model (prompt lookup): draft the "
                    "tokens that followed the last N tokens (or fewer) earlier in the text "
                    "(output unchanged)")
        ->check(CLI::Range(1, 64))
        ->excludes("--draft-model");
    cmd->add_option("--draft-n,--draft-max", o.n_max,
                    "Most tokens the draft proposes per round (adapted to the acceptance rate)")
        ->check(CLI::Range(1, 256))
        ->capture_default_str();
    cmd->add_option("--draft-min", o.n_min, "Fewest tokens drafted per round (= --draft-n: fixed)")
        ->check(CLI::Range(1, 256))
        ->capture_default_str();
    cmd->add_option("--draft-p-min", o.p_min,
                    "With --draft-model: end a round's drafts at the first token the draft gives "
                    "less than this probability (llama.cpp's flag; 0: off)")
        ->check(CLI::Range(0.0, 1.0))
        ->capture_default_str();
    if (baseline)
        cmd->add_flag("--spec-baseline", o.baseline,
                      "With --stats and --draft-model or --draft-ngram: afterwards run the target "
                      "alone on the same request and report the measured speed-up");
}

CLI::Validator n_predict_check() {
    return CLI::Validator(
        [](std::string& text) -> std::string {
            try {
                size_t used = 0;
                const long long v = std::stoll(text, &used);
                if (used == text.size() && v >= -1 && v <= INT32_MAX) return {};
            } catch (const std::exception&) {
            }
            return fmt::format("-n/--n-predict must be -1 (no limit) or a count >= 0 (got {})",
                               text);
        },
        "-1 or >=0");
}

int32_t target_context(const ModelOptions& o, const Backend& target) {
    int64_t ctx = o.n_ctx > 0 ? o.n_ctx : target.config().n_ctx_train;
    if (ctx <= 0) ctx = 4096;
    return static_cast<int32_t>(std::min(ctx, target.n_kv_blocks() * target.kv_block_size()));
}

LoadedModel load_draft_model(const DraftOptions& d, const ModelOptions& target_options,
                             const LoadedModel& target, int32_t n_sequences) {
    if (d.n_min > d.n_max) fail("--draft-min {} is larger than --draft-n {}", d.n_min, d.n_max);
    const int64_t n_seq = std::max<int32_t>(1, n_sequences);
    const int64_t pool = target.backend->n_kv_blocks() * target.backend->kv_block_size();
    ModelOptions o = target_options;
    o.model = d.model;
    o.kv_overrides.clear();  // --override-kv names the target's metadata
    o.lora.clear();          // so do the LoRA adapters
    o.lora_scaled.clear();
    o.control_vectors.clear();  // and the control vectors (the draft only proposes)
    o.control_vectors_scaled.clear();
    o.control_vector_layer_range.clear();
    o.device = target.device;  // the same device the target got
    // load_model gives n_seq x ceil(n_ctx / block) blocks: the target's pool, spread over the
    // sequences, plus room for a round of drafts and a partly filled block each.
    o.n_ctx = static_cast<int32_t>(std::min<int64_t>(
        (pool + n_seq - 1) / n_seq + d.n_max + 2 * int64_t(target_options.kv_block_size),
        INT32_MAX));
    o.kv_memory_mib = 0;
    LoadedModel draft = load_model(o, static_cast<int32_t>(n_seq));
    try {
        check_vocab_compatible(*target.tokenizer, *draft.tokenizer);
    } catch (const Error& e) {
        throw Error(fmt::format("--draft-model {}: {}", d.model, e.what()), e.hint());
    }
    return draft;
}

EngineOptions generation_engine_options(const ModelOptions& o, int32_t max_parallel,
                                        const DraftOptions& d, const LoadedModel& draft) {
    EngineOptions e = engine_options(o, max_parallel);
    if (draft.backend || d.ngram > 0) {
        e.draft = draft.backend.get();
        e.draft_ngram = draft.backend ? 0 : d.ngram;
        e.draft_max = d.n_max;
        e.draft_min = std::min(d.n_min, d.n_max);
        e.draft_p_min = d.p_min;
    }
    return e;
}

void warn_if_context_capped(const Engine& e, const ModelOptions& o) {
    if (e.n_ctx() >= e.n_ctx_requested()) return;
    const KvBlockTable& t = e.kv_table();
    fmt::print(stderr,
               "kvrun: warning: the context is capped from {} to {} tokens: the KV pool{} holds "
               "{} blocks of {} tokens (raise --kv-memory or lower -c)\n",
               e.n_ctx_requested(), e.n_ctx(),
               o.kv_memory_mib > 0 ? fmt::format(" (--kv-memory {} MiB)", o.kv_memory_mib) : "",
               t.n_blocks(), t.block_size());
}

double generation_ms(const GenerationTimings& t) {
    return t.prefill_ms + t.decode_ms;
}

double generation_tokens_per_s(const GenerationTimings& t) {
    const double ms = generation_ms(t);
    return ms > 0 ? t.n_generated / (ms / 1000.0) : 0.0;
}

void print_speculative_stats(const SpeculativeStats& s) {
    fmt::print(stderr,
               "speculative       {} drafted, {} accepted ({:.1f}%), mean accepted length {:.2f} "
               "per round ({} rounds)\n"
               "target passes     {} for {} tokens ({:.2f} tokens per pass), draft passes {}\n"
               "time in models    target {:.1f} ms, draft {:.1f} ms\n",
               s.drafted, s.accepted, 100.0 * s.acceptance(), s.mean_accepted(), s.rounds,
               s.target_passes, s.generated, s.tokens_per_target_pass(), s.draft_passes,
               s.target_ms, s.draft_ms);
}

}  // namespace kvrun
