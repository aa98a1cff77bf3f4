// --prompt-cache flags and their use around an engine run (see prompt_cache_options.h).
#include "modes/prompt_cache_options.h"

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "kv_format.h"

namespace kvrun {

void add_prompt_cache_options(CLI::App* cmd, PromptCacheOptions& o) {
    auto* path = cmd->add_option("--prompt-cache", o.path,
                                 "Load the prompt's K/V from this file when it was saved for the "
                                 "same model and KV settings, and save it there afterwards");
    cmd->add_flag("--prompt-cache-all", o.all,
                  "Also save the generated tokens' K/V in the --prompt-cache file")
        ->needs(path);
    cmd->add_flag("--prompt-cache-ro", o.read_only, "Use the --prompt-cache file, never write it")
        ->needs(path);
}

PromptCacheKey prompt_cache_key_for(const ModelOptions& mo, const LoadedModel& m) {
    const KvType k = kv_type_parse(mo.kv_type_k.empty() ? mo.kv_type : mo.kv_type_k);
    const KvType v = kv_type_parse(mo.kv_type_v.empty() ? mo.kv_type : mo.kv_type_v);
    return prompt_cache_key(*m.file, *m.backend, k, v, mo.kv_rotate == "on", lora_specs(mo),
                            control_vector_options(mo));
}

namespace {

// Host bytes for kept window parts: as much as the backend's window pool holds.
int64_t window_keep_bytes(const Backend& b) {
    return int64_t(b.kv_window_pool().n_blocks) * b.kv_block_io_bytes(KvPool::Window);
}

}  // namespace

PromptCacheUse::PromptCacheUse(const PromptCacheOptions& o, const ModelOptions& mo,
                               const LoadedModel& m, Engine& engine)
    : o_(o), m_(m), engine_(engine), windows_(window_keep_bytes(*m.backend)) {
    key_ = prompt_cache_key_for(mo, m);
    load_ =
        prompt_cache_load(o.path, key_, engine.kv_table(), *m.backend, m.backend->config().n_vocab);
    if (!load_.ignored.empty())
        fmt::print(stderr, "kvrun: note: prompt cache {} is not used: {}{}\n", o.path,
                   load_.ignored, o.read_only ? "" : " (it will be rewritten)");
    if (!o.read_only && m.backend->kv_window_pool().n_blocks > 0)
        engine.on_prompt_computed(
            [this](SeqId seq) { windows_.keep(engine_.kv_table(), *m_.backend, seq); });
}

PromptCacheUse::~PromptCacheUse() {
    engine_.on_prompt_computed(nullptr);
}

void PromptCacheUse::remember(const std::vector<TokenId>& prompt,
                              const std::vector<GenerationResult>& results) {
    sequences_.push_back(prompt);
    if (!o_.all) return;
    for (const GenerationResult& r : results) {
        std::vector<TokenId> all = prompt;
        all.insert(all.end(), r.tokens.begin(), r.tokens.end());
        sequences_.push_back(std::move(all));
    }
}

void PromptCacheUse::save() {
    if (o_.read_only) return;
    saved_ =
        prompt_cache_save(o_.path, key_, engine_.kv_table(), *m_.backend, sequences_, &windows_);
}

std::string PromptCacheUse::summary() const {
    std::string s = fmt::format("prompt cache      {}: ", o_.path);
    if (!load_.found)
        s += "new";
    else if (!load_.ignored.empty())
        s += "not used (" + load_.ignored + ")";
    else
        s += fmt::format(
            "{} of {} blocks loaded ({} tokens{})", load_.blocks_loaded, load_.blocks_in_file,
            load_.blocks_loaded * key_.block_size,
            key_.window_block_bytes > 0
                ? fmt::format("; {} with their sliding-window layers", load_.windows_loaded)
                : "");
    if (saved_ >= 0) s += fmt::format(", {} blocks saved", saved_);
    return s;
}

}  // namespace kvrun
