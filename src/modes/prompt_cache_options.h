// --prompt-cache FILE [--prompt-cache-all] [--prompt-cache-ro] (llama.cpp's flags) for the
// generating modes: load a prompt cache file into the engine's prefix cache before the
// requests run, and save the blocks of what ran afterwards (src/prompt_cache.h).
#pragma once

#include "modes/cli_fwd.h"
#include <string>
#include <vector>

#include "engine.h"
#include "modes/model_options.h"
#include "prompt_cache.h"

namespace kvrun {

struct PromptCacheOptions {
    std::string path;
    bool all = false;        // also save the generated tokens' blocks
    bool read_only = false;  // load, never write
    bool enabled() const { return !path.empty(); }
};

void add_prompt_cache_options(CLI::App* cmd, PromptCacheOptions& o);

// The key of the model `m` loaded with options `mo` (KV types, rotation, LoRA, control
// vectors): what a prompt cache or slot file must have been saved with.
PromptCacheKey prompt_cache_key_for(const ModelOptions& mo, const LoadedModel& m);

// One run's use of the file: the constructor loads it (a note on stderr when it is made for
// another model or KV format: it is then rewritten, unless read-only); remember() records a
// request's tokens; save() writes their cached blocks. With a window pool it also keeps the
// windowed layers' K/V of each prompt's last blocks as the engine computes them
// (PromptCacheWindows). Errors (corrupt file, I/O) throw.
class PromptCacheUse {
  public:
    PromptCacheUse(const PromptCacheOptions& o, const ModelOptions& mo, const LoadedModel& m,
                   Engine& engine);
    ~PromptCacheUse();
    PromptCacheUse(const PromptCacheUse&) = delete;
    PromptCacheUse& operator=(const PromptCacheUse&) = delete;
    void remember(const std::vector<TokenId>& prompt, const std::vector<GenerationResult>& results);
    void save();
    // "prompt cache: 12 blocks (192 tokens) loaded from F; 14 saved" for --stats.
    std::string summary() const;

  private:
    PromptCacheOptions o_;
    const LoadedModel& m_;
    Engine& engine_;
    PromptCacheKey key_;
    PromptCacheLoad load_;
    int64_t saved_ = -1;
    std::vector<std::vector<TokenId>> sequences_;
    PromptCacheWindows windows_;
};

}  // namespace kvrun
