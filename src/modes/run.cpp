// `kvrun run`: one completion streamed to stdout (prompt from -p, -f or stdin), or with
// --jsonl one JSON request per stdin line -> one JSON result per stdout line. Both run on the
// engine; with --draft-model it speculates (same output distribution; greedy: same tokens).
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

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

struct RunOptions {
    ModelOptions model;
    DraftOptions draft;
    SamplingParams sampling;
    GrammarOptions grammar;
    PromptCacheOptions cache;
    ContextShiftOptions shift;
    std::string prompt, file;
    int32_t n_predict = 128;
    int32_t n_samples = 1;
    int32_t n_probs = 0;
    int32_t reasoning_budget = -1;  // chat ("messages") requests of --jsonl
    std::string reasoning_budget_message;
    bool stats = false, jsonl = false, truncate = false, ignore_eos = false;
    bool special = false;  // control tokens in the output show their text
    bool no_bos = false, parse_special = false, echo = false, escape = false;
    bool verbose_prompt = false;     // the prompt's tokens on stderr before generating
    bool no_display_prompt = false;  // llama.cpp's; kvrun shows the prompt only with --echo
    std::vector<std::string> stop;
};

// Keeps the last tokens of a prompt that is too long for the context (BOS kept first).
void truncate_prompt(std::vector<TokenId>& prompt, int32_t n_ctx, int32_t n_predict, TokenId bos) {
    int32_t keep = std::max<int32_t>(1, n_ctx - std::max<int32_t>(n_predict, 1) - 1);
    if (static_cast<int32_t>(prompt.size()) <= keep) return;
    bool has_bos = !prompt.empty() && prompt[0] == bos;
    std::vector<TokenId> out;
    if (has_bos) out.push_back(bos), --keep;
    out.insert(out.end(), prompt.end() - keep, prompt.end());
    prompt = std::move(out);
}

// --stats: the request's timings (sample 0's), every sample's generated tokens, KV use, and
// with a draft model the speculation counters.
void print_stats(const std::vector<GenerationResult>& results, const Engine& e,
                 const LoadedModel& m, const RunOptions& o) {
    const GenerationResult& r = results[0];
    const auto& t = r.timings;
    const auto ks = e.kv_table().stats();
    int64_t generated = 0;
    std::string per_sample;
    for (const auto& x : results) {
        generated += x.timings.n_generated;
        per_sample += fmt::format("{}{} ({})", per_sample.empty() ? "" : ", ",
                                  x.timings.n_generated, stop_reason_name(x.stop));
    }
    fmt::print(
        stderr, "\n--- stats ({}{}) ---\n", m.device,
        e.speculative()
            ? ", speculative with " +
                  (o.draft.enabled() ? o.draft.model : fmt::format("{}-gram lookup", o.draft.ngram))
            : "");
    fmt::print(stderr,
               "prompt tokens     {} ({} computed, {} from the prefix cache)\n"
               "generated tokens  {} (stop: {})\n",
               t.n_prompt, t.n_prompt_computed, t.n_prompt - t.n_prompt_computed, generated,
               results.size() > 1 ? fmt::format("{} samples: {}", results.size(), per_sample)
                                  : stop_reason_name(r.stop));
    fmt::print(stderr,
               "time to first tok {:.2f} ms\n"
               "prefill           {:.1f} tokens/s\n"
               "decode            {}\n"
               "generation        {:.1f} tokens/s (prompt included)\n",
               t.ttft_ms, t.prefill_tokens_per_s(),
               t.has_decode_rate() ? fmt::format("{:.1f} tokens/s", t.decode_tokens_per_s())
                                   : std::string("- (too few tokens or too quick to measure)"),
               generation_tokens_per_s(t));
    if (const KvBlockTable* d = e.draft_kv_table())
        fmt::print(stderr,
                   "KV blocks used    target {} peak of {}, draft {} peak of {} ({} tokens each), "
                   "waste {:.1f}%\n",
                   e.stats().peak_blocks_used, ks.n_blocks, d->stats().peak_used_blocks,
                   d->n_blocks(), ks.block_size, 100.0 * e.stats().peak_waste_fraction);
    else
        fmt::print(stderr, "KV blocks used    {} peak of {} ({} tokens each), waste {:.1f}%\n",
                   e.stats().peak_blocks_used, ks.n_blocks, ks.block_size,
                   100.0 * e.stats().peak_waste_fraction);
    if (ks.n_window_blocks > 0)
        fmt::print(stderr, "KV window blocks  {} peak of {} (the sliding-window layers)\n",
                   ks.window_peak, ks.n_window_blocks);
    fmt::print(stderr, "{}\n", kv_cache_summary(*m.backend, o.model));
    if (results.size() > 1)
        fmt::print(stderr,
                   "samples           {} sharing the prompt's KV blocks (peak {} shared "
                   "blocks, {} copy-on-write copies)\n",
                   results.size(), e.stats().peak_shared_blocks, e.stats().cow_copies);
    if (e.speculative()) print_speculative_stats(e.stats().spec);
}

// --n-probs: each generated token with its log-probability and the most likely alternatives.
void print_logprobs(const GenerationResult& r, const Tokenizer& tok, bool several) {
    auto show = [&](TokenId t) {  // quoted, escaped, invalid UTF-8 as U+FFFD
        return nlohmann::json(tok.token_to_piece(t))
            .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    };
    fmt::print(stderr, "\n--- logprobs{} (token, logprob, probability; then the most likely) ---\n",
               several ? fmt::format(" of sample {}", r.sample) : "");
    for (const TokenLogprobs& lp : r.logprobs) {
        std::string line = fmt::format("{:>14} {:8.4f} {:5.1f}% |", show(lp.chosen.token),
                                       lp.chosen.logprob, 100.0 * std::exp(lp.chosen.logprob));
        for (const TokenLogprob& t : lp.top)
            line += fmt::format(" {} {:.1f}%", show(t.token), 100.0 * std::exp(t.logprob));
        fmt::print(stderr, "{}\n", line);
    }
}

// --spec-baseline: the target alone on the same request (its own engine: the speculative one
// and its view of the KV pool are gone) and the measured speed-up.
void print_baseline(const RunOptions& o, const LoadedModel& m, const GenerationRequest& req,
                    const GenerationResult& r) {
    Engine engine(*m.backend, *m.tokenizer, engine_options(o.model, std::max(1, o.n_samples)));
    GenerationResult base;
    engine.on_finish([&](const GenerationResult& x) {
        if (x.sample == 0) base = x;
    });
    engine.submit(req);
    engine.run(&interrupt_flag());
    const double spec_tps = generation_tokens_per_s(r.timings);
    const double base_tps = generation_tokens_per_s(base.timings);
    fmt::print(stderr,
               "target alone      {} tokens in {:.1f} ms ({:.1f} tokens/s)\n"
               "speculative       {} tokens in {:.1f} ms ({:.1f} tokens/s)\n"
               "speed-up          {:.2f}x{}\n",
               base.tokens.size(), generation_ms(base.timings), base_tps, r.tokens.size(),
               generation_ms(r.timings), spec_tps, base_tps > 0 ? spec_tps / base_tps : 0.0,
               o.sampling.temperature <= 0
                   ? (base.tokens == r.tokens ? " (outputs identical)" : " (OUTPUTS DIFFER)")
                   : "");
}

// One prompt (from -p, -f or stdin) through the engine, with a draft model when given; each
// of --n-samples continuations speculates on its own.
int run_single(const RunOptions& o) {
    std::string text = read_prompt_text(o.prompt, o.file, /*allow_stdin=*/true);
    if (o.escape) text = unescape_text(text);
    auto grammar = grammar_from_options(o.grammar);
    const int32_t n_seq = std::max(1, o.n_samples);
    if (o.shift.enabled && n_seq > 1)
        throw Error("--context-shift runs one sample", "drop --n-samples, or --context-shift");
    int32_t n_shifts = 0;
    LoadedModel m = load_model(o.model, n_seq);
    LoadedModel d;
    if (o.draft.enabled()) d = load_draft_model(o.draft, o.model, m, n_seq);
    GenerationRequest req;
    std::vector<GenerationResult> results(n_seq);
    {
        Engine engine(*m.backend, *m.tokenizer,
                      generation_engine_options(o.model, n_seq, o.draft, d));
        warn_if_context_capped(engine, o.model);
        req.prompt =
            m.tokenizer->encode(text, !o.no_bos && m.tokenizer->add_bos(), o.parse_special);
        if (o.truncate)
            truncate_prompt(req.prompt, engine.n_ctx(), o.n_predict, m.tokenizer->bos());
        if (o.verbose_prompt) {  // llama.cpp's --verbose-prompt
            fmt::print(stderr, "prompt: '{}'\nnumber of tokens in prompt = {}\n",
                       escape_control_bytes(text), req.prompt.size());
            for (TokenId id : req.prompt)
                fmt::print(stderr, "{:>8} -> '{}'\n", id,
                           escape_control_bytes(m.tokenizer->token_to_piece(id, true)));
        }
        req.n_predict = o.n_predict;
        req.sampling = o.sampling;
        req.n_samples = o.n_samples;
        req.n_probs = o.n_probs;
        req.ignore_eos = o.ignore_eos;
        req.stop_strings = o.stop;
        req.grammar = grammar;
        std::optional<PromptCacheUse> cache;
        if (o.cache.enabled()) cache.emplace(o.cache, o.model, m, engine);
        if (!o.shift.enabled) engine.submit(req);

        install_interrupt_handler();
        if (o.echo && !o.no_display_prompt) fmt::print("{}", text), std::fflush(stdout);
        std::vector<StreamDecoder> decoders(n_seq, StreamDecoder(*m.tokenizer, o.special));
        if (n_seq == 1) {
            engine.on_token([&](int32_t, int32_t, TokenId tok, const TokenLogprobs*) {
                std::string piece = decoders[0].push(tok);
                if (!piece.empty()) fmt::print("{}", piece), std::fflush(stdout);
            });
        }
        if (o.shift.enabled) {
            results[0] = run_with_context_shift(engine, req, o.shift, *m.tokenizer,
                                                &interrupt_flag(), &n_shifts);
        } else {
            engine.on_finish([&](const GenerationResult& r) { results[r.sample] = r; });
            engine.run(&interrupt_flag());
        }
        if (n_seq == 1) {
            fmt::print("{}\n", decoders[0].flush());
        } else {
            for (const auto& r : results)
                fmt::print("--- sample {} ({} tokens, stop: {}) ---\n{}\n", r.sample,
                           r.tokens.size(), stop_reason_name(r.stop),
                           m.tokenizer->decode(r.tokens, false, o.special));
        }
        std::fflush(stdout);
        if (o.n_probs > 0)
            for (const auto& r : results) print_logprobs(r, *m.tokenizer, n_seq > 1);
        if (cache) {
            cache->remember(req.prompt, results);
            cache->save();
        }
        if (o.stats) print_stats(results, engine, m, o);
        if (o.stats && o.shift.enabled)
            fmt::print(stderr, "context shifts    {} (--keep {})\n", n_shifts, o.shift.n_keep);
        if (o.stats && cache) fmt::print(stderr, "{}\n", cache->summary());
    }
    for (const auto& r : results)
        if (r.stop == StopReason::Error) fail("{}", r.error);
    // Like llama.cpp's "context full" notice: the text ended early, not at EOS or -n.
    for (const auto& r : results)
        if (r.stop == StopReason::Context && o.n_predict > 0) {
            fmt::print(stderr,
                       "kvrun: note: stopped after {} of {} tokens: the context is full "
                       "(hint: raise -c/--ctx, or --context-shift)\n",
                       r.tokens.size(), o.n_predict);
            break;
        }
    if (interrupt_flag()) {
        fmt::print(stderr, "kvrun: interrupted\n");
        return 130;
    }
    if (o.stats && o.draft.baseline && o.draft.speculates()) print_baseline(o, m, req, results[0]);
    return 0;
}

// Parses one JSONL request (throws Error with the reason on bad input); the fields are
// those of modes/request_json.h, shared with `kvrun batch`.
ParsedRequest parse_request(const std::string& line, const RunOptions& o, const Tokenizer& tok,
                            std::shared_ptr<const Grammar> grammar,
                            std::shared_ptr<const ChatFormat> chat) {
    RequestDefaults d;
    d.chat = std::move(chat);
    d.grammar = std::move(grammar);
    d.sampling = o.sampling;
    d.n_predict = o.n_predict;
    d.ignore_eos = o.ignore_eos;
    d.stop = o.stop;
    d.n_probs = o.n_probs;
    d.reasoning_budget = o.reasoning_budget;
    d.reasoning_budget_message = o.reasoning_budget_message;
    d.add_bos = !o.no_bos;
    d.parse_special = o.parse_special;
    d.n_lora = static_cast<int32_t>(lora_specs(o.model).size());
    return request_from_json(line, d, tok);
}

int run_jsonl(const RunOptions& o) {
    const auto grammar = grammar_from_options(o.grammar);
    LoadedModel m = load_model(o.model, 1);
    const auto chat = request_chat_for(*m.file, *m.tokenizer);
    LoadedModel draft;
    if (o.draft.enabled()) draft = load_draft_model(o.draft, o.model, m, 8);
    Engine engine(*m.backend, *m.tokenizer, generation_engine_options(o.model, 8, o.draft, draft));
    warn_if_context_capped(engine, o.model);
    std::optional<PromptCacheUse> cache;
    if (o.cache.enabled()) cache.emplace(o.cache, o.model, m, engine);
    install_interrupt_handler();
    std::string line;
    int64_t line_no = 0;
    while (!interrupt_flag() && std::getline(std::cin, line)) {
        ++line_no;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        nlohmann::json out;
        try {
            ParsedRequest parsed = parse_request(line, o, *m.tokenizer, grammar, chat);
            GenerationRequest& req = parsed.request;
            if (o.truncate)
                truncate_prompt(req.prompt, engine.n_ctx(), req.n_predict, m.tokenizer->bos());
            std::vector<GenerationResult> results(std::max(1, req.n_samples));
            if (o.shift.enabled) {
                ContextShiftOptions shift = o.shift;
                if (parsed.n_keep) shift.n_keep = *parsed.n_keep;
                results[0] = run_with_context_shift(engine, req, shift, *m.tokenizer,
                                                    &interrupt_flag(), nullptr);
            } else {
                engine.on_finish([&](const GenerationResult& r) { results[r.sample] = r; });
                engine.submit(req);
                engine.run(&interrupt_flag());
            }
            if (cache) cache->remember(req.prompt, results);
            out = request_result_to_json(results, req.prompt, *m.tokenizer, engine.speculative(),
                                         o.special);
            add_stopping_words(out, req.stop_strings);
        } catch (const Error& e) {
            out = {{"error", e.what()}, {"line", line_no}};
        }
        fmt::print("{}\n", json_line(out));
        std::fflush(stdout);
    }
    if (cache) cache->save();
    if (o.stats && cache) fmt::print(stderr, "{}\n", cache->summary());
    return interrupt_flag() ? 130 : 0;
}

}  // namespace

void add_run_command(CLI::App& root, int& exit_code) {
    auto o = std::make_shared<RunOptions>();
    CLI::App* cmd = root.add_subcommand(
        "run",
        "Generate a completion for a prompt (from -p, -f or stdin) and stream it to stdout; "
        "with --jsonl, answer one JSON request per stdin line");
    add_model_options(cmd, o->model);
    auto* p = cmd->add_option("-p,--prompt", o->prompt, "The prompt text");
    cmd->add_option("-f,--file", o->file, "Read the prompt from this file")
        ->check(CLI::ExistingFile)
        ->excludes(p);
    cmd->add_option("-n,--n-predict", o->n_predict,
                    "Tokens to generate (-1: until EOS or the context is full, 0: none)")
        ->check(n_predict_check())
        ->capture_default_str();
    add_sampling_options(cmd, o->sampling);
    add_reasoning_budget_options(cmd, o->reasoning_budget, o->reasoning_budget_message,
                                 " (--jsonl requests with \"messages\")");
    add_grammar_options(cmd, o->grammar);
    add_draft_options(cmd, o->draft, /*baseline=*/true);
    add_prompt_cache_options(cmd, o->cache);
    cmd->add_option("--n-samples", o->n_samples,
                    "Parallel continuations sharing the prompt's KV blocks")
        ->check(CLI::Range(1, 256))
        ->capture_default_str();
    cmd->add_option("--n-probs", o->n_probs,
                    "Report each generated token's log-probability and the N most likely "
                    "tokens (stderr; \"logprobs\" in JSON results)")
        ->check(CLI::Range(0, static_cast<int>(kMaxLogprobs)))
        ->capture_default_str();
    cmd->add_option("--stop", o->stop, "Stop when the output contains this text (repeatable)");
    cmd->add_flag("--stats", o->stats, "Print timings and KV usage to stderr");
    cmd->add_flag("--special", o->special,
                  "Show control tokens the model generates (e.g. <|im_start|>) as their text "
                  "(llama.cpp's -sp)");
    cmd->add_flag(
        "--jsonl", o->jsonl,
        "Read JSON requests from stdin, one per line: {\"prompt\": ..., \"n_predict\": ..., "
        "\"temperature\": ..., \"top_k\", \"top_p\", \"min_p\", \"repeat_penalty\", "
        "\"frequency_penalty\", \"presence_penalty\", \"repeat_last_n\", \"seed\", "
        "\"dry_*\", \"top_n_sigma\", \"typical_p\", \"xtc_*\", \"dynatemp_*\", \"mirostat*\", "
        "\"logit_bias\", "
        "\"n_samples\", \"stop\", \"grammar\", \"json_schema\", \"n_probs\"}; write one JSON "
        "result per line (README: every field)");
    cmd->add_flag("--truncate", o->truncate,
                  "Keep the end of a prompt that is longer than the context");
    add_context_shift_options(cmd, o->shift);
    cmd->add_flag("--ignore-eos", o->ignore_eos, "Keep generating after the end-of-sequence token");
    cmd->add_flag("--no-bos", o->no_bos, "Do not add the BOS token to the prompt");
    cmd->add_flag("--parse-special", o->parse_special,
                  "Recognize special token texts in the prompt");
    cmd->add_flag("--echo", o->echo, "Print the prompt before the completion");
    cmd->add_flag("--verbose-prompt", o->verbose_prompt,
                  "Print the prompt's tokens (id and piece) to stderr before generating");
    cmd->add_flag("--no-display-prompt", o->no_display_prompt,
                  "llama.cpp's: the prompt is not shown (kvrun's default; --echo shows it)");
    cmd->add_flag("-e,--escape", o->escape,
                  "Turn \\n \\t \\r \\\\ in the prompt into newline, tab, carriage return, "
                  "backslash (as llama.cpp's -e)");
    cmd->callback([o, &exit_code] { exit_code = o->jsonl ? run_jsonl(*o) : run_single(*o); });
}

}  // namespace kvrun
