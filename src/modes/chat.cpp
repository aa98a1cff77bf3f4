// `kvrun chat`: interactive multi-turn chat in the terminal. The conversation lives in a
// ChatSession (template, incremental prefill, context overflow); this file is the REPL:
// line editing and history (LineEditor), slash commands, streaming the reply to stdout,
// Ctrl-C (stops a reply / clears the line) and Ctrl-D (exits 0). With --draft-model the
// engine speculates for every reply (same replies with --temp 0; /stats shows the acceptance).
// --grammar / --json-schema constrain every reply.
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <optional>

#include "chat_session.h"
#include "common.h"
#include "line_editor.h"
#include "modes/draft_options.h"
#include "modes/grammar_options.h"
#include "modes/model_options.h"
#include "modes/modes.h"
#include "modes/prompt_cache_options.h"
#include "reasoning.h"
#include "text_input.h"

namespace kvrun {
namespace {

struct ChatOptions {
    ModelOptions model;
    DraftOptions draft;
    GrammarOptions grammar;
    SamplingParams sampling;
    std::string system, chat_template, chat_template_file, overflow = "shift", history_file;
    bool jinja = false;
    int32_t n_predict = -1;
    int32_t n_sink = 4;
    bool ignore_eos = false, stats = false;
    std::string reasoning_format = "auto";  // none: replies exactly as generated
    int32_t reasoning_budget = -1;
    std::string reasoning_budget_message;
    std::vector<std::string> stop;  // -r/--reverse-prompt
    PromptCacheOptions cache;
};

constexpr const char* kHelp =
    "commands:\n"
    "  /reset, /clear  start a new conversation (keeps the system prompt)\n"
    "  /undo           take back your last message and its reply\n"
    "  /regen          generate the last reply again (a new draw)\n"
    "  /read FILE      send the text of FILE as your message\n"
    "  /system TEXT    set the system prompt (empty: none) and start over\n"
    "  /stats          token counts, cache reuse and speed of the last turn\n"
    "  /help           this list\n"
    "  /exit           quit (also Ctrl-D)\n"
    "Ctrl-C stops a reply; while typing it clears the line.\n";

void print_stats(const ChatSession& chat, const Engine& engine, const LoadedModel& m,
                 const ModelOptions& mo) {
    const ChatTurnStats& t = chat.last_turn();
    const KvBlockStats ks = engine.kv_table().stats();
    fmt::print(
        "conversation   {} tokens ({} in the KV cache) of a {}-token context, {} messages\n"
        "last turn      prefilled {} tokens ({} new), reused {} cached tokens\n"
        "reply          {} tokens, stop: {}, context overflows: {}\n"
        "speed          time to first token {:.1f} ms, prefill {:.1f} tokens/s, decode {}\n"
        "KV blocks      {} used of {} ({} tokens each), {} cached for reuse\n"
        "template       {} ({}), context overflow: {}\n",
        chat.n_tokens(), chat.n_cached_tokens(), engine.n_ctx(), chat.messages().size(),
        t.n_prefilled, t.n_appended, t.n_reused, t.n_generated, stop_reason_name(t.stop),
        t.n_overflows, t.timings.ttft_ms, t.timings.prefill_tokens_per_s(),
        t.timings.has_decode_rate()
            ? fmt::format("{:.1f} tokens/s", t.timings.decode_tokens_per_s())
            : std::string("-"),
        ks.used_blocks, ks.n_blocks, ks.block_size, ks.evictable_blocks,
        chat.config().chat_template.name(), m.device,
        chat.config().overflow == ContextOverflow::Stop    ? "stop"
        : chat.config().overflow == ContextOverflow::Shift ? "shift"
                                                           : "sinks");
    fmt::print("{}\n", kv_cache_summary(*m.backend, mo));
    if (engine.speculative()) {
        const SpeculativeStats& s = engine.stats().spec;
        fmt::print(
            "speculative    last turn {} drafted, {} accepted ({:.1f}%), mean accepted length "
            "{:.2f}; all turns {} drafted, {} accepted ({:.1f}%), mean accepted length {:.2f}\n",
            t.n_drafted, t.n_accepted, t.n_drafted > 0 ? 100.0 * t.n_accepted / t.n_drafted : 0.0,
            t.n_spec_rounds > 0 ? double(t.n_accepted) / t.n_spec_rounds : 0.0, s.drafted,
            s.accepted, 100.0 * s.acceptance(), s.mean_accepted());
    }
}

std::string trim(const std::string& s) {
    const size_t b = s.find_first_not_of(" \t\r\n");
    if (b == std::string::npos) return {};
    return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

int run_chat(const ChatOptions& o) {
    ChatConfig cfg;
    cfg.system = o.system;
    cfg.n_predict = o.n_predict;
    cfg.sampling = o.sampling;
    cfg.ignore_eos = o.ignore_eos;
    cfg.overflow = context_overflow_from_name(o.overflow);
    cfg.n_sink = o.n_sink;
    cfg.stop = o.stop;
    cfg.reasoning_budget = o.reasoning_budget;
    cfg.reasoning_budget_message = o.reasoning_budget_message;
    cfg.grammar = grammar_from_options(o.grammar);  // before the model: a bad grammar fails fast
    LoadedModel m = load_model(o.model, 1);
    LoadedModel draft;
    if (o.draft.enabled()) draft = load_draft_model(o.draft, o.model, m, 1);
    const ChatTemplateChoice choice =
        chat_template_choose(*m.file, o.chat_template, o.chat_template_file, o.jinja);
    if (!choice.note.empty()) fmt::print(stderr, "kvrun chat: {}\n", choice.note);
    cfg.chat_template = choice;
    Engine engine(*m.backend, *m.tokenizer, generation_engine_options(o.model, 1, o.draft, draft));
    warn_if_context_capped(engine, o.model);
    std::optional<PromptCacheUse> cache;  // before the session prefills the system prompt
    if (o.cache.enabled()) cache.emplace(o.cache, o.model, m, engine);
    ChatSession chat(engine, *m.tokenizer, cfg);
    LineEditor editor(o.history_file);
    const bool tty = isatty(STDOUT_FILENO) == 1;
    fmt::print(stderr,
               "kvrun chat: {} on {}, template {}, context {} tokens (overflow: {}).\n"
               "Type /help for commands, Ctrl-D to exit.\n",
               o.model.model, m.device, choice.name(), engine.n_ctx(), o.overflow);
    install_interrupt_handler();
    // A thinking model's reasoning shows dimmed on a terminal (--reasoning-format none: as is).
    const bool styled = tty && chat.thinks() && o.reasoning_format != "none";
    std::optional<ReasoningStyler> styler;
    auto print_text = [&](std::string_view s) {
        if (styled) {
            if (!styler) styler.emplace(chat.reply_opened_reasoning(), "\x1b[2m", "\x1b[0m");
            fmt::print("{}", styler->add(s));
        } else {
            fmt::print("{}", s);
        }
        std::fflush(stdout);
    };
    auto print_notice = [](std::string_view s) {
        std::fflush(stdout);
        fmt::print(stderr, "\n{}\n", s);
    };
    // Saves the conversation's blocks for the next chat (--prompt-cache) on the way out.
    auto finish = [&]() {
        if (!cache) return 0;
        cache->remember(chat.tokens(), {});
        cache->save();
        if (o.stats) fmt::print(stderr, "{}\n", cache->summary());
        return 0;
    };
    // One reply: `turn` sends (or regenerates) and returns false when there was nothing to do;
    // an Error is one line on stderr and the chat goes on.
    auto reply = [&](const std::function<bool()>& turn) {
        interrupt_flag() = false;
        styler.reset();
        try {
            const bool sent = turn();
            if (styler) fmt::print("{}", styler->finish());
            if (!sent) return;
        } catch (const Error& e) {
            if (styler) fmt::print("{}", styler->finish());
            std::fflush(stdout);
            fmt::print(stderr, "error: {}{}\n", e.what(),
                       e.hint().empty() ? "" : " (hint: " + e.hint() + ")");
            return;
        }
        if (chat.last_turn().stop == StopReason::Cancelled) fmt::print(" [interrupted]");
        fmt::print("\n");
        if (tty) fmt::print("\n");
        std::fflush(stdout);
        interrupt_flag() = false;
        if (o.stats) print_stats(chat, engine, m, o.model);
    };
    for (;;) {
        std::optional<std::string> read = editor.read_line("> ");
        if (!read) return finish();  // Ctrl-D / end of input
        if (editor.interrupted()) continue;
        const std::string line = trim(*read);
        if (line.empty()) continue;
        editor.add_history(line);
        if (line[0] != '/') {
            reply([&] {
                chat.send(line, print_text, print_notice, &interrupt_flag());
                return true;
            });
            continue;
        }
        const size_t sp = line.find(' ');
        const std::string cmd = line.substr(0, sp);
        const std::string arg = sp == std::string::npos ? "" : trim(line.substr(sp));
        if (cmd == "/exit" || cmd == "/quit") return finish();
        if (cmd == "/help") {
            fmt::print("{}", kHelp);
        } else if (cmd == "/reset" || cmd == "/clear") {
            chat.reset();
            fmt::print("[new conversation]\n");
        } else if (cmd == "/undo") {
            fmt::print("{}\n",
                       chat.undo() ? "[took back the last exchange]" : "[nothing to take back]");
        } else if (cmd == "/regen") {
            reply([&] {
                if (chat.regenerate(print_text, print_notice, &interrupt_flag())) return true;
                fmt::print("[no reply to generate again]\n");
                return false;
            });
        } else if (cmd == "/read") {
            reply([&] {
                if (arg.empty()) throw Error("/read needs a file name", "/read FILE");
                const std::string text = read_file_text(arg);
                utf8_require_valid(text, "'" + arg + "'");
                chat.send(text, print_text, print_notice, &interrupt_flag());
                return true;
            });
        } else if (cmd == "/system") {
            chat.set_system(arg);
            fmt::print("[system prompt {}; new conversation]\n", arg.empty() ? "cleared" : "set");
        } else if (cmd == "/stats") {
            print_stats(chat, engine, m, o.model);
        } else {
            fmt::print("unknown command {} (/help lists them)\n", cmd);
        }
        std::fflush(stdout);
    }
}

}  // namespace

void add_chat_command(CLI::App& root, int& exit_code) {
    auto o = std::make_shared<ChatOptions>();
    CLI::App* cmd = root.add_subcommand(
        "chat", "Interactive multi-turn chat (each turn prefills only its new tokens)");
    add_model_options(cmd, o->model);
    cmd->add_option("--system,--system-prompt", o->system, "System prompt (llama.cpp's -sys)");
    cmd->add_option(
        "--chat-template", o->chat_template,
        "Chat format: llama2, llama3, chatml, mistral, zephyr, phi3, phi4, gemma, granite, "
        "deepseek3, deepseek2, mistral-v3, mistral-v3-tekken, mistral-v7, mistral-v7-tekken or "
        "plain "
        "(default: detected from the model's tokenizer.chat_template)");
    cmd->add_option("--chat-template-file", o->chat_template_file,
                    "A Jinja chat template to format the conversation with");
    cmd->add_flag("--jinja", o->jinja,
                  "Format the conversation with the model's own Jinja template through kvrun's "
                  "interpreter (default: a built-in format when the template is a known one)");
    cmd->add_option("-n,--n-predict", o->n_predict,
                    "Max tokens per reply (-1: until the end of the turn)")
        ->check(n_predict_check())
        ->capture_default_str();
    add_sampling_options(cmd, o->sampling);
    add_reasoning_budget_options(cmd, o->reasoning_budget, o->reasoning_budget_message);
    add_draft_options(cmd, o->draft);
    add_grammar_options(cmd, o->grammar);
    cmd->add_option("--context-overflow", o->overflow,
                    "When the conversation outgrows the context: stop (end the reply), shift "
                    "(drop the oldest half of the turns, re-prefill) or sinks (keep the first "
                    "tokens + a recent window, re-prefill)")
        ->check(CLI::IsMember({"stop", "shift", "sinks"}))
        ->capture_default_str();
    cmd->add_option("--sink-tokens", o->n_sink, "Leading tokens kept by --context-overflow sinks")
        ->check(at_least(0))
        ->capture_default_str();
    cmd->add_option("--history-file", o->history_file, "Load and save the input history here");
    cmd->add_flag("--ignore-eos", o->ignore_eos, "Keep generating past end-of-turn tokens");
    add_prompt_cache_options(cmd, o->cache);
    cmd->add_option("-r,--reverse-prompt,--stop", o->stop,
                    "End a reply where it writes this text, cut before it (repeatable; "
                    "llama.cpp's -r)");
    cmd->add_flag("--stats", o->stats, "Print /stats after every reply");
    cmd->add_option("--reasoning-format", o->reasoning_format,
                    "A thinking model's <think> reasoning: auto or deepseek (shown dimmed, "
                    "without the tags, on a terminal) or none (shown as generated)")
        ->check(CLI::IsMember({"none", "deepseek", "auto"}))
        ->capture_default_str();
    cmd->callback([o, &exit_code] { exit_code = run_chat(*o); });
}

}  // namespace kvrun
