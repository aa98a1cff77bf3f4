// `kvrun batch`: many prompts at once through the engine's continuous batching. Input is a
// text file (one prompt per line, escapes \n \t \r \\) or JSONL (one request object per
// line, as `run --jsonl`); output is one JSON result per input line, in input order, to -o
// or stdout. A progress bar and a final summary (throughput, KV use, prefix-cache hits,
// preemptions, speculation) go to stderr. Ctrl-C stops, writes the results that finished, and
// exits 130. With --draft-model every sequence speculates on its own (engine_speculative.cpp).
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>

#include "common.h"
#include "gguf.h"
#include "model_config.h"
#include "modes/context_shift.h"
#include "modes/draft_options.h"
#include "modes/grammar_options.h"
#include "modes/model_options.h"
#include "modes/modes.h"
#include "modes/prompt_cache_options.h"
#include "modes/request_json.h"
#include "text_input.h"

namespace kvrun {
namespace {

struct BatchOptions {
    ModelOptions model;
    DraftOptions draft;
    SamplingParams sampling;
    GrammarOptions grammar;
    PromptCacheOptions cache;
    ContextShiftOptions shift;
    std::string file, output, format = "auto";
    int32_t n_predict = 128;
    int32_t n_samples = 1;
    int32_t n_probs = 0;
    int32_t parallel = 16;
    int32_t reasoning_budget = -1;  // chat ("messages") requests
    std::string reasoning_budget_message;
    bool ignore_eos = false, no_bos = false, parse_special = false, no_progress = false;
    bool special = false;  // control tokens in the output show their text
    std::vector<std::string> stop;
};

// One non-blank input line and, once it ran, its result.
struct Item {
    int64_t line_no = 0;  // 1-based line number in the input file
    nlohmann::json id;    // JSONL "id" field (null when absent)
    std::string error;    // the line could not become a request
    GenerationRequest request;
    std::vector<GenerationResult> samples;  // [n_samples]
    int32_t n_finished = 0;
    bool done = false;
    std::optional<ContextShiftRun> shift;  // --context-shift: the rounds so far
    std::optional<int32_t> n_keep;         // the JSONL request's "n_keep" (replaces --keep)
};

bool reads_stdin(const BatchOptions& o) {
    return o.file.empty() || o.file == "-";
}

// The input's name in messages.
std::string input_name(const BatchOptions& o) {
    return reads_stdin(o) ? std::string("standard input") : "'" + o.file + "'";
}

// --format auto: a file by its extension; standard input by its first non-blank line (a
// JSON object starts with '{', a prompt seldom does).
bool is_jsonl(const BatchOptions& o, const std::string& first_line) {
    if (o.format == "jsonl" || o.format == "json") return true;
    if (o.format == "txt" || o.format == "text") return false;
    if (o.format != "auto") fail("bad --format '{}' (expected auto, txt or jsonl)", o.format);
    if (reads_stdin(o)) {
        const size_t at = first_line.find_first_not_of(" \t");
        return at != std::string::npos && first_line[at] == '{';
    }
    auto ends_with = [&](const char* ext) {
        std::string e = ext;
        return o.file.size() >= e.size() &&
               o.file.compare(o.file.size() - e.size(), e.size(), e) == 0;
    };
    return ends_with(".jsonl") || ends_with(".json") || ends_with(".ndjson");
}

// Reads every non-blank line of the input into an item (bad lines carry their error).
std::vector<Item> read_items(const BatchOptions& o, const GgufFile& model, const Tokenizer& tok) {
    std::ifstream file;
    if (!reads_stdin(o)) {
        file.open(o.file, std::ios::binary);
        if (!file) fail("cannot open '{}' for reading", o.file);
    }
    if (reads_stdin(o)) note_reading_terminal();
    std::istream& in = reads_stdin(o) ? std::cin : file;
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(std::move(line));
    if (in.bad()) fail("error while reading {}", input_name(o));
    std::string first;
    for (const std::string& l : lines)
        if (l.find_first_not_of(" \t\r") != std::string::npos) {
            first = l;
            break;
        }
    const bool jsonl = is_jsonl(o, first);
    RequestDefaults d;
    d.sampling = o.sampling;
    d.n_predict = o.n_predict;
    d.n_samples = o.n_samples;
    d.n_probs = o.n_probs;
    d.reasoning_budget = o.reasoning_budget;
    d.reasoning_budget_message = o.reasoning_budget_message;
    d.ignore_eos = o.ignore_eos;
    d.stop = o.stop;
    d.add_bos = !o.no_bos;
    d.parse_special = o.parse_special;
    d.grammar = grammar_from_options(o.grammar);
    d.n_lora = static_cast<int32_t>(lora_specs(o.model).size());
    if (jsonl) d.chat = request_chat_for(model, tok);
    std::vector<Item> items;
    int64_t line_no = 0;
    for (std::string& line : lines) {
        ++line_no;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.find_first_not_of(" \t") == std::string::npos) continue;
        Item it;
        it.line_no = line_no;
        try {
            if (jsonl) {
                ParsedRequest p = request_from_json(line, d, tok);
                it.request = std::move(p.request);
                it.id = std::move(p.id);
                it.n_keep = p.n_keep;
            } else {
                std::string text = unescape_text(line);
                utf8_require_valid(text, fmt::format("line {}", line_no));
                it.request = request_from_text(text, d, tok);
            }
        } catch (const Error& e) {
            it.error = e.what();
        }
        items.push_back(std::move(it));
    }
    if (items.empty())
        fail("no prompts in {} (one prompt or JSON request per line)", input_name(o));
    return items;
}

// Pool size for the batch: `parallel` sequences as long as the longest request needs
// (prompt + n_predict, at most the context), unless --kv-memory was given.
ModelOptions sized_for(const BatchOptions& o, const std::vector<Item>& items,
                       const ModelConfig& cfg) {
    ModelOptions m = o.model;
    if (m.kv_memory_mib > 0) return m;
    const int64_t ctx = m.n_ctx > 0 ? m.n_ctx : (cfg.n_ctx_train > 0 ? cfg.n_ctx_train : 4096);
    int64_t longest = 1;
    for (const Item& it : items) {
        if (!it.error.empty()) continue;
        const int64_t n = it.request.n_predict < 0 ? ctx : it.request.n_predict;
        longest =
            std::max<int64_t>(longest, static_cast<int64_t>(it.request.prompt.size()) + n + 1);
    }
    m.n_ctx = static_cast<int32_t>(std::min(ctx, longest));
    return m;
}

nlohmann::json item_json(size_t index, const Item& it, const Tokenizer& tok, bool speculative,
                         bool special) {
    nlohmann::json j = {{"index", index}, {"line", it.line_no}};
    if (!it.id.is_null()) j["id"] = it.id;
    if (!it.error.empty()) {
        j["error"] = it.error;
        return j;
    }
    j.update(request_result_to_json(it.samples, it.request.prompt, tok, speculative, special));
    add_stopping_words(j, it.request.stop_strings);
    return j;
}

// Redraws the progress bar (only on a terminal).
class Progress {
  public:
    Progress(size_t total, bool enabled) : total_(total), enabled_(enabled && isatty(2)) {}
    void update(size_t done, int64_t tokens, int32_t running, double seconds, bool force) {
        if (!enabled_) return;
        auto now = std::chrono::steady_clock::now();
        if (!force && now - last_ < std::chrono::milliseconds(100)) return;
        last_ = now;
        constexpr int kWidth = 30;
        const int filled = total_ ? static_cast<int>(kWidth * done / total_) : kWidth;
        fmt::print(stderr, "\r[{}{}] {}/{} requests, {} in flight, {:.0f} tokens/s   ",
                   std::string(filled, '#'), std::string(kWidth - filled, '.'), done, total_,
                   running, seconds > 0 ? tokens / seconds : 0.0);
        std::fflush(stderr);
    }
    void clear() {
        if (enabled_) fmt::print(stderr, "\r{}\r", std::string(100, ' '));
    }

  private:
    size_t total_;
    bool enabled_;
    std::chrono::steady_clock::time_point last_{};
};

void print_summary(const std::vector<Item>& items, size_t n_written, const Engine& e,
                   const LoadedModel& m, double seconds, bool interrupted) {
    size_t n_err = 0, n_ok = 0;
    int64_t prompt = 0, computed = 0, generated = 0;
    for (const Item& it : items) {
        if (!it.error.empty()) ++n_err;
        if (!it.done) continue;
        for (const auto& r : it.samples) {
            if (r.stop == StopReason::Error) ++n_err;
            generated += r.timings.n_generated;
        }
        ++n_ok;
        prompt += it.samples[0].timings.n_prompt;
        computed += it.samples[0].timings.n_prompt_computed;
    }
    const EngineStats& s = e.stats();
    const KvBlockStats ks = e.kv_table().stats();
    fmt::print(stderr,
               "--- batch summary ({}) ---\n"
               "requests          {} ({} finished, {} errors{}), {} results written\n"
               "prompt tokens     {} ({} computed, {} from the prefix cache)\n"
               "generated tokens  {} in {:.2f} s: {:.1f} tokens/s ({:.1f} tokens/s with prefill)\n"
               "peak in flight    {} sequences\n"
               "KV blocks         peak {} of {} ({} tokens each), {} in use at the end\n"
               "KV waste          {:.2f}% of allocated slots unfilled (mean), {:.2f}% at the peak\n"
               "prefix cache      {} tokens reused (prompts, and preempted sequences resuming)\n"
               "shared blocks     peak {} (prefixes, samples), {} copy-on-write copies\n"
               "preemptions       {}\n",
               m.device, items.size(), n_ok, n_err, interrupted ? ", interrupted" : "", n_written,
               prompt, computed, prompt - computed, generated, seconds,
               seconds > 0 ? generated / seconds : 0.0,
               seconds > 0 ? (generated + s.tokens_prefilled) / seconds : 0.0, s.peak_running,
               s.peak_blocks_used, ks.n_blocks, ks.block_size, ks.used_blocks,
               100.0 * s.mean_waste_fraction(), 100.0 * s.peak_waste_fraction, s.prefix_hit_tokens,
               s.peak_shared_blocks, s.cow_copies, s.preemptions);
    if (const KvBlockTable* d = e.draft_kv_table()) {
        const KvBlockStats ds = d->stats();
        fmt::print(stderr, "draft KV blocks   peak {} of {}, {} in use at the end\n",
                   ds.peak_used_blocks, ds.n_blocks, ds.used_blocks);
    }
    if (e.speculative()) print_speculative_stats(s.spec);
}

int run_batch(const BatchOptions& o) {
    std::vector<Item> items;
    ModelOptions mo;
    {
        const auto f = open_model_file(o.model);
        auto tok = Tokenizer::from_gguf(*f);
        items = read_items(o, *f, *tok);
        mo = sized_for(o, items, model_config_from_gguf(*f));
    }
    LoadedModel m = load_model(mo, o.parallel);
    LoadedModel draft;
    if (o.draft.enabled()) draft = load_draft_model(o.draft, mo, m, o.parallel);
    Engine engine(*m.backend, *m.tokenizer,
                  generation_engine_options(mo, o.parallel, o.draft, draft));
    warn_if_context_capped(engine, mo);
    std::optional<PromptCacheUse> cache;
    if (o.cache.enabled()) cache.emplace(o.cache, mo, m, engine);

    std::FILE* out = stdout;
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> out_file(nullptr, std::fclose);
    if (!o.output.empty()) {
        out_file.reset(std::fopen(o.output.c_str(), "wb"));
        if (!out_file) fail("cannot open '{}' for writing", o.output);
        out = out_file.get();
    }

    std::vector<size_t> item_of_request;  // engine request id -> item index
    auto submit = [&](size_t i, const GenerationRequest& req) {
        const int32_t id = engine.submit(req);
        if (item_of_request.size() <= static_cast<size_t>(id)) item_of_request.resize(id + 1);
        item_of_request[id] = i;
    };
    for (size_t i = 0; i < items.size(); ++i) {
        Item& it = items[i];
        if (!it.error.empty()) continue;
        try {
            if (o.shift.enabled) {
                ContextShiftOptions shift = o.shift;
                if (it.n_keep) shift.n_keep = *it.n_keep;
                it.shift.emplace(it.request, shift, *m.tokenizer);
            }
            submit(i, it.request);
            it.samples.resize(it.request.n_samples);
        } catch (const Error& e) {
            it.error = e.what();
        }
    }
    std::vector<size_t> continued;  // --context-shift: items whose next round is due
    engine.on_finish([&](const GenerationResult& r) {
        const size_t i = item_of_request[r.request];
        Item& it = items[i];
        if (it.shift) {
            if (it.shift->add(r, interrupt_flag())) {
                continued.push_back(i);
                return;
            }
            it.samples[0] = it.shift->result();
            it.done = true;
            return;
        }
        it.samples[r.sample] = r;
        if (++it.n_finished == it.request.n_samples) it.done = true;
    });
    // Submits the rounds that shifted contexts ask for (outside the engine's step).
    auto submit_continued = [&] {
        for (size_t i : continued) {
            Item& it = items[i];
            try {
                submit(i, it.shift->request());
            } catch (const Error& e) {
                it.samples[0] = it.shift->result();
                it.samples[0].stop = StopReason::Error;
                it.samples[0].error = e.what();
                it.done = true;
            }
        }
        continued.clear();
    };

    // Writes finished results, in input order, as far as they are consecutive.
    size_t next = 0, n_written = 0;
    auto flush_ready = [&](bool skip_unfinished) {
        for (; next < items.size(); ++next) {
            Item& it = items[next];
            const bool ready = it.done || !it.error.empty();
            if (!ready && !skip_unfinished) break;
            if (!ready) continue;
            fmt::print(
                out, "{}\n",
                json_line(item_json(next, it, *m.tokenizer, engine.speculative(), o.special)));
            ++n_written;
        }
        std::fflush(out);
    };

    install_interrupt_handler();
    Progress progress(items.size(), !o.no_progress);
    const auto t0 = std::chrono::steady_clock::now();
    bool interrupted = false;
    while (!engine.idle()) {
        if (interrupt_flag()) {
            interrupted = true;
            engine.on_finish(nullptr);  // cancelled requests are not results
            engine.cancel_all();
            break;
        }
        engine.step();
        submit_continued();
        flush_ready(false);
        progress.update(next, engine.stats().tokens_decoded, engine.n_running(), seconds_since(t0),
                        false);
    }
    flush_ready(true);
    const double elapsed = seconds_since(t0);
    progress.update(next, engine.stats().tokens_decoded, 0, elapsed, true);
    progress.clear();
    print_summary(items, n_written, engine, m, elapsed, interrupted);
    fmt::print(stderr, "{}\n", kv_cache_summary(*m.backend, mo));
    if (cache) {
        for (const Item& it : items)
            if (it.done) cache->remember(it.request.prompt, it.samples);
        cache->save();
        fmt::print(stderr, "{}\n", cache->summary());
    }
    if (out_file && std::fclose(out_file.release()) != 0)
        fail("error while writing '{}'", o.output);
    if (interrupted) {
        fmt::print(stderr, "kvrun: interrupted\n");
        return 130;
    }
    return 0;
}

}  // namespace

void add_batch_command(CLI::App& root, int& exit_code) {
    auto o = std::make_shared<BatchOptions>();
    CLI::App* cmd = root.add_subcommand(
        "batch",
        "Run many prompts at once (continuous batching): one prompt (txt) or JSON request "
        "(jsonl) per line in, one JSON result per line out, in input order");
    add_model_options(cmd, o->model);
    cmd->add_option("-f,--file", o->file,
                    "Input: .txt (one prompt per line; \\n \\t \\r \\\\ escapes) or .jsonl (one "
                    "request object per line, as `run --jsonl`); default or '-': standard input "
                    "(JSONL when its first line starts with '{')")
        ->check(CLI::Validator(
            [](const std::string& f) {
                return f == "-" ? std::string() : CLI::ExistingFile(std::string(f));
            },
            "FILE|-"));
    cmd->add_option("-o,--output", o->output, "Write the JSONL results here (default: stdout)");
    cmd->add_option("--format", o->format, "Input format: auto (by extension), txt or jsonl")
        ->capture_default_str();
    cmd->add_option("--parallel", o->parallel, "Sequences running at once")
        ->check(CLI::Range(1, 4096))
        ->capture_default_str();
    cmd->add_option("-n,--n-predict", o->n_predict,
                    "Tokens to generate per request (-1: until EOS or the context is full, 0: "
                    "none)")
        ->check(n_predict_check())
        ->capture_default_str();
    add_sampling_options(cmd, o->sampling);
    add_reasoning_budget_options(cmd, o->reasoning_budget, o->reasoning_budget_message,
                                 " (JSONL requests with \"messages\")");
    add_grammar_options(cmd, o->grammar);
    add_draft_options(cmd, o->draft);
    add_prompt_cache_options(cmd, o->cache);
    cmd->add_option("--n-probs", o->n_probs,
                    "Report each generated token's log-probability and the N most likely "
                    "tokens (\"logprobs\" in each result)")
        ->check(CLI::Range(0, static_cast<int>(kMaxLogprobs)))
        ->capture_default_str();
    cmd->add_option("--n-samples", o->n_samples,
                    "Continuations per prompt, sharing the prompt's KV blocks")
        ->check(CLI::Range(1, 256))
        ->capture_default_str();
    cmd->add_option("--stop", o->stop, "Stop when the output contains this text (repeatable)");
    cmd->add_flag("--ignore-eos", o->ignore_eos, "Keep generating after the end-of-sequence token");
    cmd->add_flag("--no-bos", o->no_bos, "Do not add the BOS token to the prompts");
    cmd->add_flag("--parse-special", o->parse_special, "Recognize special token texts in prompts");
    cmd->add_flag("--special", o->special,
                  "Show control tokens the model generates as their text in \"text\" (llama.cpp's "
                  "-sp)");
    cmd->add_flag("--no-progress", o->no_progress, "No progress bar on stderr");
    add_context_shift_options(cmd, o->shift);
    cmd->callback([o, &exit_code] { exit_code = run_batch(*o); });
}

}  // namespace kvrun
