// Shared model/sampling flags, model loading with backend selection, and Ctrl-C handling.
#include "modes/model_options.h"

#include <CLI/CLI.hpp>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdint>
#include <functional>
#include <random>

#include "common.h"
#include "gguf_writer.h"
#include "kv_format.h"
#include "model_config.h"
#include "text_input.h"
#include "thread_pool.h"
#if KVRUN_HAS_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace kvrun {

CLI::Validator at_least(int64_t lo) {
    return CLI::Validator(
        [lo](std::string& text) -> std::string {
            double v = 0;
            // A value that is not a number is left to CLI11's own conversion error.
            if (!CLI::detail::lexical_cast(text, v) || v >= double(lo)) return {};
            return fmt::format("must be at least {} (got {})", lo, text);
        },
        fmt::format(">= {}", lo));
}

CLI::Validator positive_finite() {
    return CLI::Validator(
        [](std::string& text) -> std::string {
            double v = 0;
            if (!CLI::detail::lexical_cast(text, v) || (v > 0 && std::isfinite(v))) return {};
            return fmt::format("must be a finite number > 0 (got {})", text);
        },
        "> 0");
}

CLI::Validator parses_with(std::function<void(const std::string&)> parse, std::string name) {
    return CLI::Validator(
        [parse = std::move(parse)](std::string& text) -> std::string {
            try {
                parse(text);
            } catch (const Error& e) {
                return e.what();
            }
            return {};
        },
        std::move(name));
}

void add_model_options(CLI::App* cmd, ModelOptions& o) {
    cmd->add_option("-m,--model", o.model, "GGUF model file")->required()->check(CLI::ExistingFile);
    cmd->add_option("--device", o.device,
                    "Compute device: cpu, cuda, cuda:N or auto (cuda when present)")
        ->capture_default_str();
    cmd->add_option("-c,--ctx,--ctx-size", o.n_ctx, "Context length per sequence (0: the model's)")
        ->check(at_least(0));
    cmd->add_option("--kv-block-size", o.kv_block_size, "Tokens per KV cache block (1-256)")
        ->check(CLI::Range(1, 256))
        ->capture_default_str();
    cmd->add_option("--kv-type", o.kv_type, "KV cache storage: f16, q8, q4 (or f32)")
        ->capture_default_str();
    cmd->add_option("--kv-type-k,--cache-type-k", o.kv_type_k,
                    "Storage of K only (overrides --kv-type; llama.cpp's -ctk works too)");
    cmd->add_option("--kv-type-v,--cache-type-v", o.kv_type_v,
                    "Storage of V only (overrides --kv-type; llama.cpp's -ctv works too)");
    cmd->add_option("--kv-rotate", o.kv_rotate,
                    "Hadamard-rotate Q and K before K is stored (on, off; see docs/kv-cache.md)")
        ->check(CLI::IsMember({"on", "off"}))
        ->capture_default_str();
    cmd->add_flag("--swa-full", o.swa_full,
                  "Sliding-window models (Gemma 2/3): keep the windowed layers' K/V for the "
                  "whole context instead of only each sequence's window (more memory)");
    cmd->add_option("--kv-memory", o.kv_memory_mib,
                    "KV cache pool size in MiB (0: sized for the context)")
        ->check(at_least(0));
    cmd->add_option("--n-gpu-layers", o.n_gpu_layers,
                    "llama.cpp's -ngl: 0 runs on the CPU; any other count puts every layer on "
                    "the GPU when one is present")
        ->check(at_least(0));
    cmd->add_option("-t,--threads", o.n_threads, "CPU threads (0: all cores)")->check(at_least(0));
    cmd->add_option("--threads-batch", o.n_threads_batch,
                    "CPU threads for prefill passes (llama.cpp's -tb; 0: as -t)")
        ->check(at_least(0));
    cmd->add_option("-b,--batch-size", o.n_batch, "Max tokens per forward pass (prefill chunk)")
        ->check(at_least(1))
        ->capture_default_str();
    cmd->add_option("--ubatch-size", o.n_ubatch,
                    "llama.cpp's -ub: max tokens per forward pass (at most -b when both are given)")
        ->check(at_least(1));
    cmd->add_flag("!--no-mmap", o.mmap, "Read the model file into memory instead of mapping it");
    cmd->add_flag("--no-warmup")
        ->description("Accepted for llama.cpp's scripts: kvrun runs no warm-up pass");
    cmd->add_flag("--mlock", o.mlock,
                  "Keep the model's bytes in RAM (mlock; a warning when the system refuses)");
    cmd->add_option("--flash-attn", o.flash_attn,
                    "llama.cpp's -fa: kvrun's attention is always fused (flash-attention "
                    "style); the value changes nothing")
        ->expected(0, 1)
        ->default_str("auto")
        ->check(CLI::IsMember({"on", "off", "auto", "1", "0", "true", "false"}));
    cmd->parse_complete_callback([cmd, &o] {
        if (o.n_ubatch > 0)
            o.n_batch = cmd->count("--batch-size") ? std::min(o.n_batch, o.n_ubatch) : o.n_ubatch;
        if (o.flash_attn == "off" || o.flash_attn == "0" || o.flash_attn == "false")
            fmt::print(stderr,
                       "kvrun: note: -fa off changes nothing: kvrun's attention is always "
                       "fused\n");
    });
    add_rope_options(cmd, o.rope);
    cmd->add_option("--override-kv", o.kv_overrides,
                    "Replace a metadata value: KEY=TYPE:VALUE, TYPE int, float, bool or str "
                    "(repeatable; e.g. tokenizer.ggml.add_bos_token=bool:false)")
        ->check(parses_with([](const std::string& t) { parse_kv_override(t); }, "KEY=TYPE:VALUE"));
    cmd->add_option("--lora", o.lora,
                    "Apply a LoRA adapter (llama.cpp's adapter GGUF) at scale 1 (repeatable)");
    cmd->add_option("--lora-scaled", o.lora_scaled,
                    "Apply a LoRA adapter at a scale: --lora-scaled FILE SCALE (repeatable)")
        ->type_size(2);
    cmd->add_flag("--lora-init-without-apply", o.lora_init_without_apply,
                  "Load the LoRA adapters at scale 0: only requests that set \"lora\" use them");
    cmd->add_option("--control-vector", o.control_vectors,
                    "Add a control vector (llama.cpp's GGUF) to the residual stream (repeatable)");
    cmd->add_option("--control-vector-scaled", o.control_vectors_scaled,
                    "Add a control vector times SCALE: --control-vector-scaled FILE SCALE "
                    "(repeatable)")
        ->type_size(2);
    cmd->add_option("--control-vector-layer-range", o.control_vector_layer_range,
                    "Steer only layers START..END (inclusive, counted from 0)")
        ->expected(2);
}

std::pair<std::string, GgufValue> parse_kv_override(const std::string& text) {
    const std::string usage = fmt::format(
        "bad override '{}' (expected KEY=TYPE:VALUE with TYPE int, float, bool or str, e.g. "
        "tokenizer.ggml.add_bos_token=bool:false)",
        text);
    const size_t eq = text.find('=');
    if (eq == 0 || eq == std::string::npos) fail("{}", usage);
    const size_t colon = text.find(':', eq + 1);
    if (colon == std::string::npos) fail("{}", usage);
    const std::string key = text.substr(0, eq), type = text.substr(eq + 1, colon - eq - 1);
    const std::string value = text.substr(colon + 1);
    GgufValue v;
    if (type == "str") {
        v = gguf_make_string(value);
    } else if (type == "bool") {
        if (value != "true" && value != "false") fail("{}: a bool is true or false", usage);
        v = gguf_make_bool(value == "true");
    } else if (type == "int" || type == "float") {
        size_t used = 0;
        try {
            if (type == "int")
                v = gguf_make_int(GgufValueType::INT64, std::stoll(value, &used));
            else {
                const double d = std::stod(value, &used);
                if (!std::isfinite(d)) used = 0;
                v = gguf_make_float(GgufValueType::FLOAT64, d);
            }
        } catch (const std::exception&) {
            used = 0;
        }
        if (used == 0 || used != value.size())
            fail("{}: '{}' is not {}", usage, value,
                 type == "int" ? "an integer" : "a finite number");
    } else {
        fail("{}", usage);
    }
    return {key, std::move(v)};
}

std::unique_ptr<GgufFile> open_model_file(const ModelOptions& o) {
    GgufOpenOptions go;
    go.mmap = o.mmap;
    go.mlock = o.mlock;
    auto f = std::make_unique<GgufFile>(GgufFile::open(o.model, go));
    if (!f->lock_error().empty())
        fmt::print(stderr,
                   "kvrun: warning: --mlock: cannot lock the model's {:.1f} MiB in RAM ({}); "
                   "going on unlocked (hint: raise `ulimit -l`)\n",
                   double(f->file_size()) / (1 << 20), f->lock_error());
    if (f->get_string_or("general.type", "") == "adapter")
        throw Error(fmt::format("{} is a LoRA adapter, not a model", o.model),
                    "pass it with --lora next to its base model (-m)");
    if (f->get_string_or("general.type", "") == "imatrix")
        throw Error(fmt::format("{} is an importance matrix, not a model", o.model),
                    "pass it to `kvrun quantize --imatrix`");
    for (const std::string& text : o.kv_overrides) {
        auto [key, value] = parse_kv_override(text);
        f->override_value(key, std::move(value));
    }
    return f;
}

void add_rope_options(CLI::App* cmd, RopeOverrides& r) {
    const std::string group = "RoPE (default: the model's)";
    cmd->add_option("--rope-scaling", r.scaling, "RoPE scaling: none, linear or yarn")
        ->check(CLI::IsMember({"none", "linear", "yarn"}))
        ->group(group);
    cmd->add_option("--rope-freq-base", r.freq_base, "RoPE base frequency (theta)")
        ->check(positive_finite())
        ->group(group);
    cmd->add_option("--rope-freq-scale", r.freq_scale,
                    "RoPE frequency scale: the context grows by 1 / this")
        ->check(positive_finite())
        ->group(group);
    cmd->add_option_function<float>(
           "--rope-scale", [&r](float n) { r.freq_scale = 1.0f / n; },
           "RoPE context scaling factor: the context grows by this (= --rope-freq-scale 1/N)")
        ->check(positive_finite())
        ->group(group);
    cmd->add_option("--yarn-orig-ctx", r.yarn_orig_ctx, "YaRN: the model's context before scaling")
        ->check(at_least(1))
        ->group(group);
    cmd->add_option("--yarn-ext-factor", r.yarn_ext_factor,
                    "YaRN: extrapolation mix (0: plain interpolation; -1: the model's, 1)")
        ->check(CLI::Range(-1.0f, 100.0f) & at_least(-1))
        ->group(group);
    cmd->add_option("--yarn-attn-factor", r.yarn_attn_factor, "YaRN: attention magnitude factor")
        ->check(positive_finite())
        ->group(group);
    cmd->add_option("--yarn-beta-fast", r.yarn_beta_fast,
                    "YaRN: pairs turning more than this often keep their frequency (32)")
        ->check(positive_finite())
        ->group(group);
    cmd->add_option("--yarn-beta-slow", r.yarn_beta_slow,
                    "YaRN: pairs turning less than this often are fully interpolated (1)")
        ->check(positive_finite())
        ->group(group);
}

std::pair<TokenId, float> parse_logit_bias(const std::string& text) {
    // TOKEN_ID followed by +BIAS, -BIAS or =BIAS (llama.cpp's spelling: 15043+1, 15043-inf).
    size_t i = 0;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
    const std::string usage = fmt::format(
        "bad logit bias '{}' (expected TOKEN_ID+BIAS, TOKEN_ID-BIAS or TOKEN_ID=BIAS, e.g. "
        "15043+1.5 or 15043-inf to ban a token)",
        text);
    if (i == 0 || i >= 10 || i + 1 >= text.size() ||
        (text[i] != '+' && text[i] != '-' && text[i] != '='))
        fail("{}", usage);
    const auto id = static_cast<TokenId>(std::stol(text.substr(0, i)));
    const std::string value = text.substr(text[i] == '=' ? i + 1 : i);
    float bias = 0.0f;
    if (value == "-inf") {
        bias = -std::numeric_limits<float>::infinity();
    } else {
        size_t used = 0;
        try {
            bias = std::stof(value, &used);
        } catch (const std::exception&) {
            fail("{}", usage);
        }
        if (used != value.size() || !std::isfinite(bias)) fail("{}", usage);
    }
    return {id, bias};
}

uint64_t random_seed() {
    std::random_device rd;
    return (uint64_t(rd()) << 32) ^ rd();
}

void add_reasoning_budget_options(CLI::App* cmd, int32_t& budget, std::string& message,
                                  const std::string& zero_note) {
    cmd->add_option("--reasoning-budget", budget,
                    "Tokens a chat reply may think (<think> reasoning; gpt-oss's analysis): -1 "
                    "no limit; N: after N tokens of reasoning the block's end tag is forced, "
                    "and the reply goes on to its answer; 0: the block ends as soon as it "
                    "opens" +
                        zero_note)
        ->check(CLI::Range(-1, INT32_MAX))
        ->capture_default_str();
    cmd->add_option("--reasoning-budget-message", message,
                    "Text forced before the end tag when the reasoning budget runs out (e.g. "
                    "\" Time is up, let me answer.\")");
}

void add_rerank_template_option(CLI::App* cmd, std::string& prompt, const std::string& used_with) {
    cmd->add_option("--rerank-template", prompt,
                    "The judge's prompt for " + used_with +
                        ", with {query}, {document} and optionally {instruction} (default: "
                        "Qwen3-Reranker's)");
}

void add_sampling_options(CLI::App* cmd, SamplingParams& p) {
    // Each flag's value is put into otherwise default parameters and checked with
    // sampling_validate, so flags and JSON requests share one rule and one message. A value
    // that is not a number is left to CLI11's own conversion error.
    auto valid = [](const char* range, auto field) {
        return CLI::Validator(
            [field](std::string& text) -> std::string {
                SamplingParams trial;
                if (!CLI::detail::lexical_cast(text, trial.*field)) return {};
                try {
                    sampling_validate(trial);
                } catch (const Error& e) {
                    return e.what();
                }
                return {};
            },
            range);
    };
    cmd->add_option("--temp,--temperature", p.temperature, "Sampling temperature (0: greedy)")
        ->check(valid("NONNEGATIVE", &SamplingParams::temperature))
        ->capture_default_str();
    cmd->add_option("--top-k", p.top_k, "Keep the k most likely tokens (0: off)")
        ->check(valid("NONNEGATIVE", &SamplingParams::top_k))
        ->capture_default_str();
    cmd->add_option("--top-p", p.top_p, "Nucleus sampling threshold (1: off)")
        ->check(valid("in [0 - 1]", &SamplingParams::top_p))
        ->capture_default_str();
    cmd->add_option("--min-p", p.min_p, "Drop tokens below min-p x the top probability (0: off)")
        ->check(valid("in [0 - 1]", &SamplingParams::min_p))
        ->capture_default_str();
    cmd->add_option("--repeat-penalty", p.repeat_penalty,
                    "Penalty for recently seen tokens (1: off)")
        ->check(valid("POSITIVE", &SamplingParams::repeat_penalty))
        ->capture_default_str();
    cmd->add_option("--frequency-penalty", p.frequency_penalty,
                    "Subtract this x the count of each recently seen token from its logit (0: off)")
        ->check(valid("FINITE", &SamplingParams::frequency_penalty))
        ->capture_default_str();
    cmd->add_option("--presence-penalty", p.presence_penalty,
                    "Subtract this from the logit of every recently seen token (0: off)")
        ->check(valid("FINITE", &SamplingParams::presence_penalty))
        ->capture_default_str();
    cmd->add_option("--repeat-last-n", p.repeat_last_n,
                    "How many recent tokens the penalties look at (-1: all, 0: off)")
        ->check(valid("AT LEAST -1", &SamplingParams::repeat_last_n))
        ->capture_default_str();
    cmd->add_option("-s,--seed", p.seed, "Random seed (same seed, same output; -1: a random one)")
        ->transform(CLI::Validator(
            [](std::string& text) -> std::string {
                if (text == "-1") text = std::to_string(random_seed());
                return {};
            },
            "", "seed"))
        ->capture_default_str();
    cmd->add_option("--dry-multiplier", p.dry_multiplier,
                    "DRY: penalty for extending a repetition of the text (0: off)")
        ->check(valid("NONNEGATIVE", &SamplingParams::dry_multiplier))
        ->capture_default_str();
    cmd->add_option("--dry-base", p.dry_base, "DRY: growth of the penalty per repeated token")
        ->check(valid("AT LEAST 1", &SamplingParams::dry_base))
        ->capture_default_str();
    cmd->add_option("--dry-allowed-length", p.dry_allowed_length,
                    "DRY: repetitions this long go unpenalized")
        ->check(valid("AT LEAST 1", &SamplingParams::dry_allowed_length))
        ->capture_default_str();
    cmd->add_option("--dry-penalty-last-n", p.dry_penalty_last_n,
                    "DRY: how many recent tokens it looks at (-1: all, 0: off)")
        ->check(valid("AT LEAST -1", &SamplingParams::dry_penalty_last_n))
        ->capture_default_str();
    cmd->add_option_function<std::vector<std::string>>(
           "--dry-sequence-breaker",
           [&p](const std::vector<std::string>& v) {
               p.dry_sequence_breakers.clear();
               if (v.size() == 1 && v[0] == "none") return;
               for (const auto& s : v) p.dry_sequence_breakers.push_back(unescape_text(s));
           },
           "DRY: text that ends a repetition (repeatable, \\n escapes; replaces the defaults "
           "\\n : \" *; 'none' for no breaker)")
        ->check(CLI::Validator(
            [](std::string& text) -> std::string {
                SamplingParams trial;
                trial.dry_sequence_breakers = {unescape_text(text)};
                try {
                    utf8_require_valid(text, "a DRY sequence breaker");
                    sampling_validate(trial);
                } catch (const Error& e) {
                    return e.what();
                }
                return {};
            },
            "TEXT"));
    cmd->add_option("--top-nsigma,--top-n-sigma", p.top_n_sigma,
                    "Keep logits within n standard deviations of the best (<= 0: off)")
        ->check(valid("FINITE", &SamplingParams::top_n_sigma))
        ->capture_default_str();
    cmd->add_option("--typical", p.typical_p, "Locally typical sampling mass (1: off)")
        ->check(valid("in [0 - 1]", &SamplingParams::typical_p))
        ->capture_default_str();
    cmd->add_option("--xtc-probability", p.xtc_probability,
                    "XTC: chance of dropping the top choices (0: off)")
        ->check(valid("in [0 - 1]", &SamplingParams::xtc_probability))
        ->capture_default_str();
    cmd->add_option("--xtc-threshold", p.xtc_threshold,
                    "XTC: the probability that makes a top choice")
        ->check(valid("in [0 - 1]", &SamplingParams::xtc_threshold))
        ->capture_default_str();
    cmd->add_option("--dynatemp-range", p.dynatemp_range,
                    "Dynamic temperature: temp +- this by the entropy (0: off)")
        ->check(valid("NONNEGATIVE", &SamplingParams::dynatemp_range))
        ->capture_default_str();
    cmd->add_option("--mirostat", p.mirostat,
                    "Mirostat 1 or 2 instead of the filters after the penalties (0: off)")
        ->check(valid("0, 1 or 2", &SamplingParams::mirostat))
        ->capture_default_str();
    cmd->add_option("--mirostat-ent", p.mirostat_tau, "Mirostat: target surprise (tau, bits)")
        ->check(valid("NONNEGATIVE", &SamplingParams::mirostat_tau))
        ->capture_default_str();
    cmd->add_option("--mirostat-lr", p.mirostat_eta, "Mirostat: learning rate (eta)")
        ->check(valid("NONNEGATIVE", &SamplingParams::mirostat_eta))
        ->capture_default_str();
    cmd->add_option_function<std::string>(
           "--samplers", [&p](const std::string& v) { p.order = sampler_order_parse(v); },
           "The filters in this order, ';'-separated (llama.cpp's names; default "
           "penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature)")
        ->check(parses_with([](const std::string& t) { sampler_order_parse(t); }, "LIST"));
    cmd->add_option_function<std::string>(
           "--sampling-seq,--sampler-seq",
           [&p](const std::string& v) { p.order = sampler_seq_parse(v); },
           "--samplers as letters (default edskypmxt: e penalties, d dry, s top-n-sigma, k "
           "top-k, y typical, p top-p, m min-p, x XTC, t temperature)")
        ->check(parses_with([](const std::string& t) { sampler_seq_parse(t); }, "LETTERS"));
    cmd->add_option("--dynatemp-exp", p.dynatemp_exponent,
                    "Dynamic temperature: exponent of the normalized entropy")
        ->check(valid("NONNEGATIVE", &SamplingParams::dynatemp_exponent))
        ->capture_default_str();
    cmd->add_option_function<std::vector<std::string>>(
           "-l,--logit-bias",
           [&p](const std::vector<std::string>& v) {
               for (const auto& s : v) p.logit_bias.push_back(parse_logit_bias(s));
           },
           "Add BIAS to a token's logit: TOKEN_ID+BIAS or TOKEN_ID-BIAS, -inf bans it "
           "(repeatable)")
        ->check(
            parses_with([](const std::string& t) { parse_logit_bias(t); }, "TOKEN_ID(+|-)BIAS"));
}

// A FILE SCALE, FILE SCALE, ... flag's values as (file, scale) pairs. Throws Error naming the
// flag for a scale that is not a finite number.
static std::vector<std::pair<std::string, float>> scaled_files(
    const std::vector<std::string>& values, const char* flag) {
    std::vector<std::pair<std::string, float>> out;
    for (size_t i = 0; i + 1 < values.size(); i += 2) {
        const std::string& text = values[i + 1];
        char* end = nullptr;
        const double scale = std::strtod(text.c_str(), &end);
        if (text.empty() || *end != '\0' || !std::isfinite(scale))
            fail("{} {} {}: the scale must be a finite number", flag, values[i], text);
        out.emplace_back(values[i], float(scale));
    }
    return out;
}

std::vector<LoraSpec> lora_specs(const ModelOptions& o) {
    std::vector<LoraSpec> specs;
    for (const std::string& path : o.lora) specs.push_back({path, 1.0f});
    for (auto& [path, scale] : scaled_files(o.lora_scaled, "--lora-scaled"))
        specs.push_back({path, scale});
    if (o.lora_init_without_apply)
        for (LoraSpec& s : specs) s.scale = 0.0f;
    return specs;
}

ControlVectorOptions control_vector_options(const ModelOptions& o) {
    ControlVectorOptions c;
    for (const std::string& path : o.control_vectors) c.specs.push_back({path, 1.0f});
    for (auto& [path, scale] : scaled_files(o.control_vectors_scaled, "--control-vector-scaled"))
        c.specs.push_back({path, scale});
    if (o.control_vector_layer_range.size() == 2) {
        c.layer_start = o.control_vector_layer_range[0];
        c.layer_end = o.control_vector_layer_range[1];
    }
    return c;
}

static bool cuda_available() {
#if KVRUN_HAS_CUDA
    return cuda_device_count() > 0;
#else
    return false;
#endif
}

LoadedModel load_model(const ModelOptions& o, int32_t n_sequences) {
    LoadedModel m;
    m.file = open_model_file(o);
    m.tokenizer = Tokenizer::from_gguf(*m.file);
    ModelConfig cfg = model_config_from_gguf(*m.file);

    BackendOptions bo;
    bo.kv_block_size = o.kv_block_size;
    bo.kv_type_k = kv_type_parse(o.kv_type_k.empty() ? o.kv_type : o.kv_type_k);
    bo.kv_type_v = kv_type_parse(o.kv_type_v.empty() ? o.kv_type : o.kv_type_v);
    bo.n_threads = o.n_threads;
    bo.n_threads_batch = o.n_threads_batch;
    bo.n_batch = o.n_batch;
    bo.n_parallel = std::max<int32_t>(1, n_sequences);
    bo.kv_rotate = o.kv_rotate == "on";
    bo.rope = o.rope;
    bo.n_ctx = o.n_ctx;
    bo.lora = lora_specs(o);
    bo.control_vectors = control_vector_options(o);
    bo.swa_full = o.swa_full;
    if (o.kv_memory_mib > 0) {
        bo.kv_memory_mib = o.kv_memory_mib;
        bo.n_kv_blocks = kv_blocks_for(cfg, bo);  // what the budget holds after stage slots
    } else {
        int64_t ctx = o.n_ctx > 0 ? o.n_ctx : (cfg.n_ctx_train > 0 ? cfg.n_ctx_train : 4096);
        int64_t per_seq = (ctx + o.kv_block_size - 1) / o.kv_block_size;
        bo.n_kv_blocks = per_seq * std::max<int32_t>(1, n_sequences);
    }
    if (o.n_threads > 0 || o.n_threads_batch > 0)
        cpu_set_num_threads(
            std::max(cpu_resolve_threads(o.n_threads), cpu_resolve_threads(o.n_threads_batch)));

    std::string dev = o.device;
    if (dev == "auto") {
        dev = cuda_available() && o.n_gpu_layers != 0 ? "cuda" : "cpu";
        if (const std::string what = cuda_unsupported(cfg); dev == "cuda" && !what.empty()) {
            fmt::print(stderr,
                       "kvrun: note: {} runs on the CPU: the CUDA backend has no kernels "
                       "for {} yet\n",
                       cfg.arch, what);
            dev = "cpu";
        }
    }
    if (dev != "cpu" && o.n_gpu_layers > 0 && o.n_gpu_layers < cfg.n_layer)
        fmt::print(stderr,
                   "kvrun: warning: -ngl {}: all {} layers run on the GPU (there is no partial "
                   "offload; -ngl 0 or --device cpu runs on the CPU)\n",
                   o.n_gpu_layers, cfg.n_layer);
    if (dev == "cpu") {
        m.backend = make_cpu_backend(*m.file, bo);
        m.device = "cpu";
    } else if (dev == "cuda" || dev.rfind("cuda:", 0) == 0) {
        int index = 0;
        if (dev.size() > 5) {
            try {
                index = std::stoi(dev.substr(5));
            } catch (...) {
                fail("bad --device '{}' (expected cpu, cuda or cuda:N)", o.device);
            }
        }
#if KVRUN_HAS_CUDA
        if (!cuda_available())
            throw Error("--device cuda: no CUDA device is available", "use --device cpu");
        m.backend = make_cuda_backend(*m.file, bo, index);
        m.device = fmt::format("cuda:{}", index);
#else
        (void)index;
        throw Error("--device cuda: this kvrun was built without CUDA",
                    "rebuild with the CUDA toolkit installed, or use --device cpu");
#endif
    } else {
        fail("bad --device '{}' (expected cpu, cuda, cuda:N or auto)", o.device);
    }
    return m;
}

std::string kv_cache_summary(const Backend& backend, const ModelOptions& o) {
    const KvType k = kv_type_parse(o.kv_type_k.empty() ? o.kv_type : o.kv_type_k);
    const KvType v = kv_type_parse(o.kv_type_v.empty() ? o.kv_type : o.kv_type_v);
    const ModelConfig& c = backend.config();
    const int32_t bs = backend.kv_block_size();
    const KvWindowPool w = backend.kv_window_pool();
    int64_t n_win = 0;  // layers in the window pool
    for (int64_t l = 0; l < c.n_layer; ++l) n_win += kv_layer_in_window_pool(c, w, l) ? 1 : 0;
    const double per_token =
        kv_bytes_per_token(c, k, v, bs) * double(c.n_layer - n_win) / double(c.n_layer);
    std::string s =
        fmt::format("KV cache: K {}, V {}, {:.1f} bytes/token, {} blocks of {} tokens",
                    kv_type_name(k), kv_type_name(v), per_token, backend.n_kv_blocks(), bs);
    if (w.n_blocks > 0)
        s += fmt::format(" + {} blocks for the {} sliding-window layers (window {} + {})",
                         w.n_blocks, n_win, w.window, w.margin);
    if (backend.n_kv_stages() > 0)
        s += fmt::format(" + {} f16 stage blocks", backend.n_kv_stages());
    if (o.kv_rotate == "on") s += ", Hadamard-rotated keys";
    return s;
}

EngineOptions engine_options(const ModelOptions& o, int32_t max_parallel) {
    EngineOptions e;
    e.max_parallel = max_parallel;
    e.n_batch = o.n_batch;
    e.n_ctx = o.n_ctx;
    return e;
}

static std::atomic<bool> g_interrupted{false};

static void on_sigint(int) {
    if (g_interrupted.exchange(true)) _exit(130);
}

void install_interrupt_handler() {
    struct sigaction sa {};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    sigaction(SIGINT, &sa, nullptr);
}

std::atomic<bool>& interrupt_flag() {
    return g_interrupted;
}

}  // namespace kvrun
