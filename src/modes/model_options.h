// Options shared by every mode that runs a model (run, chat, batch, perplexity, bench),
// and loading a model with them: GGUF file, tokenizer and backend (cpu or cuda).
#pragma once

#include "modes/cli_fwd.h"
#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "backend.h"
#include "engine.h"
#include "gguf.h"
#include "sampler.h"
#include "tokenizer.h"

namespace kvrun {

struct ModelOptions {
    std::string model;
    std::string device = "auto";  // auto | cpu | cuda | cuda:N
    int32_t n_ctx = 0;            // 0: the model's training context (capped by the pool)
    int32_t kv_block_size = 16;
    std::string kv_type = "f16", kv_type_k, kv_type_v;
    std::string kv_rotate = "off";  // on | off
    double kv_memory_mib = 0;       // 0: enough for the context (x parallel sequences)
    int32_t n_threads = 0;
    int32_t n_threads_batch = 0;  // -tb: CPU threads for prefill passes (0: -t)
    int32_t n_batch = 512;
    int32_t n_ubatch = 0;  // -ub (llama.cpp's physical batch): the pass size, at most -b if given
    bool mmap = true;      // --no-mmap: read the model file into memory instead
    bool mlock = false;    // --mlock: lock the model's bytes in RAM
    std::string flash_attn = "auto";  // -fa on|off|auto: kvrun's attention is always fused
    // llama.cpp's -ngl/--n-gpu-layers: 0 runs on the CPU (when --device is auto); any other
    // count runs every layer on the GPU when one is present (there is no partial offload).
    int32_t n_gpu_layers = -1;  // -1: not given
    RopeOverrides rope;         // --rope-* / --yarn-* (llama.cpp's spellings)
    // --override-kv KEY=TYPE:VALUE (llama.cpp's): metadata replaced before anything reads it.
    std::vector<std::string> kv_overrides;
    // LoRA adapters (llama.cpp's --lora FILE, --lora-scaled FILE SCALE), applied in order.
    std::vector<std::string> lora;
    std::vector<std::string> lora_scaled;  // FILE, SCALE, FILE, SCALE, ...
    bool lora_init_without_apply = false;  // loaded at scale 0 (requests' "lora" set them)
    // Control vectors (llama.cpp's --control-vector FILE, --control-vector-scaled FILE SCALE,
    // --control-vector-layer-range START END).
    std::vector<std::string> control_vectors;
    std::vector<std::string> control_vectors_scaled;  // FILE, SCALE, FILE, SCALE, ...
    std::vector<int32_t> control_vector_layer_range;  // empty or START, END
    // Keep the sliding-window layers' K/V for the whole context (llama.cpp's --swa-full)
    // instead of only each sequence's window (BackendOptions::swa_full).
    bool swa_full = false;
};

// A CLI11 check that a number is >= lo, with a plain message ("must be at least 0 (got -1)").
CLI::Validator at_least(int64_t lo);
// A CLI11 check that runs `parse` on the text and reports the Error it throws, if any (one
// rule and one message for a flag and the code that reads the same text).
CLI::Validator parses_with(std::function<void(const std::string&)> parse, std::string name);

void add_model_options(CLI::App* cmd, ModelOptions& o);
// llama.cpp's --rope-scaling, --rope-freq-base, --rope-freq-scale, --rope-scale, --yarn-*.
void add_rope_options(CLI::App* cmd, RopeOverrides& r);
// -s/--seed takes -1 for a random seed (as llama.cpp), drawn from std::random_device.
void add_sampling_options(CLI::App* cmd, SamplingParams& p);
// llama.cpp's --reasoning-budget N (-1: no limit) and --reasoning-budget-message TEXT: a chat
// reply thinks at most N tokens, then TEXT and the block's end tag are forced. `zero_note`
// says what 0 does besides (the server also turns the template's thinking off).
void add_reasoning_budget_options(CLI::App* cmd, int32_t& budget, std::string& message,
                                  const std::string& zero_note = "");
// --rerank-template TEXT: a reranking judge's prompt, with {query}, {document} and
// optionally {instruction} (default: Qwen3-Reranker's); `used_with` names the flag that turns
// reranking on in that command.
void add_rerank_template_option(CLI::App* cmd, std::string& prompt, const std::string& used_with);
uint64_t random_seed();
// "tokenizer.ggml.add_bos_token=bool:false" (TYPE int, float, bool or str) -> (key, value).
// Throws Error with the expected form.
std::pair<std::string, GgufValue> parse_kv_override(const std::string& text);
// The --lora and --lora-scaled adapters, in that order. Throws Error for a bad scale.
std::vector<LoraSpec> lora_specs(const ModelOptions& o);
// The --control-vector(-scaled) files and --control-vector-layer-range. Throws Error for a
// bad scale.
ControlVectorOptions control_vector_options(const ModelOptions& o);
// Opens the model file with the --override-kv values applied.
std::unique_ptr<GgufFile> open_model_file(const ModelOptions& o);
// "15043+1.5", "15043-inf", "15043=-2" -> (id, bias). Throws Error with the expected form.
std::pair<TokenId, float> parse_logit_bias(const std::string& text);

struct LoadedModel {
    std::unique_ptr<GgufFile> file;
    std::unique_ptr<Tokenizer> tokenizer;
    std::unique_ptr<Backend> backend;
    std::string device;  // what was chosen, e.g. "cpu" or "cuda:0"
};

// Opens the model and creates the backend with a KV pool of kv_memory_mib, or when that is
// 0, enough blocks for `n_sequences` full contexts. Throws Error with a hint on failure.
LoadedModel load_model(const ModelOptions& o, int32_t n_sequences = 1);

// One line describing the backend's KV cache: storage types, bytes per token, blocks,
// stage slots and rotation (for --stats, perplexity and batch summaries).
std::string kv_cache_summary(const Backend& backend, const ModelOptions& o);

// The engine options these flags imply.
EngineOptions engine_options(const ModelOptions& o, int32_t max_parallel);

// SIGINT handling for long-running modes: the first Ctrl-C sets the flag (the mode stops
// cleanly), a second one exits immediately.
void install_interrupt_handler();
std::atomic<bool>& interrupt_flag();

}  // namespace kvrun
