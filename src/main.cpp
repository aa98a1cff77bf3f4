// kvrun entry point: builds the command line from the modes and turns every error into
// one clear line on stderr ("kvrun: error: <message> (hint: <hint>)") and exit code 1.
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "common.h"
#include "modes/modes.h"

namespace {

// s on one line: each run of line breaks (and the spaces after it) becomes "; ", so a
// multi-line message can't break the one-line rule.
std::string one_line(std::string_view s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] != '\n' && s[i] != '\r') {
            out += s[i];
            continue;
        }
        while (i + 1 < s.size() && (s[i + 1] == '\n' || s[i + 1] == '\r' || s[i + 1] == ' ')) ++i;
        if (!out.empty() && i + 1 < s.size()) out += "; ";
    }
    return out;
}

// Prints the single error line (flushing stdout first so the two streams stay ordered).
void print_error(std::string_view message, std::string_view hint) {
    std::fflush(stdout);
    if (hint.empty())
        fmt::print(stderr, "kvrun: error: {}\n", one_line(message));
    else
        fmt::print(stderr, "kvrun: error: {} (hint: {})\n", one_line(message), one_line(hint));
}

// The command-line error CLI11 reports, naming the offending argument where CLI11 does not:
// `kvrun --bogus` fails the "a subcommand is required" check before CLI11 looks at unknown
// options, so name the first argument nothing consumed instead.
std::string parse_error_message(const CLI::App& app, const CLI::ParseError& e) {
    if (app.get_subcommands().empty()) {
        std::vector<std::string> left = app.remaining();
        if (!left.empty() && !left.front().empty() && left.front()[0] == '-')
            return fmt::format("unknown option '{}'", left.front());
    }
    return e.what();
}

// "see `kvrun <command> --help`" for the command being parsed.
std::string parse_error_hint(const CLI::App& app) {
    std::vector<CLI::App*> subs = app.get_subcommands();
    if (subs.empty()) return "see `kvrun --help`";
    return fmt::format("see `kvrun {} --help`", subs.front()->get_name());
}

}  // namespace

// llama.cpp's multi-letter short flags, which CLI11 cannot name, as their long spellings.
static std::vector<std::string> with_llamacpp_flags(int argc, char** argv) {
    static const std::pair<const char*, const char*> kAliases[] = {
        {"-ngl", "--n-gpu-layers"},  {"-md", "--model-draft"}, {"-ctk", "--cache-type-k"},
        {"-ctv", "--cache-type-v"},  {"-np", "--parallel"},    {"-sp", "--special"},
        {"-tb", "--threads-batch"},  {"-ub", "--ubatch-size"}, {"-fa", "--flash-attn"},
        {"-sys", "--system-prompt"}, {"-pg", "--pg"},          {"-to", "--timeout"},
        {"-cb", "--cont-batching"},
    };
    std::vector<std::string> args(argv, argv + argc);
    for (size_t i = 1; i < args.size(); ++i)
        for (const auto& [short_name, long_name] : kAliases)
            if (args[i] == short_name) args[i] = long_name;
    return args;
}

int main(int argc, char** argv) {
    CLI::App app{
        "kvrun: run quantized GGUF language models (llama family) on a paged KV cache.\n"
        "Use `kvrun <command> --help` for the options of each command."};
    app.require_subcommand(1);
    app.set_version_flag("--version", "kvrun 0.1.0");
    int exit_code = 0;
    kvrun::add_bench_command(app, exit_code);
    kvrun::add_info_command(app, exit_code);
    kvrun::add_run_command(app, exit_code);
    kvrun::add_batch_command(app, exit_code);
    kvrun::add_chat_command(app, exit_code);
    kvrun::add_perplexity_command(app, exit_code);
    kvrun::add_tokenize_command(app, exit_code);
    kvrun::add_quantize_command(app, exit_code);
    kvrun::add_embedding_command(app, exit_code);
    kvrun::add_imatrix_command(app, exit_code);
    kvrun::add_server_command(app, exit_code);
    kvrun::add_export_lora_command(app, exit_code);
    kvrun::add_cvector_command(app, exit_code);
    kvrun::add_gguf_split_command(app, exit_code);
    try {
        auto is_command = [&](const std::string& name) {
            for (const CLI::App* sub : app.get_subcommands({}))
                if (sub->check_name(name)) return true;
            return false;
        };
        if (argc > 1 && argv[1][0] != '-' && !is_command(argv[1]))
            throw kvrun::Error(
                fmt::format("unknown command '{}'", argv[1]),
                "the commands are run, chat, batch, perplexity, bench, info, tokenize, "
                "quantize, imatrix and embedding; "
                "see `kvrun --help`");
        std::vector<std::string> args = with_llamacpp_flags(argc, argv);
        std::vector<char*> arg_ptrs;
        for (std::string& a : args) arg_ptrs.push_back(a.data());
        app.parse(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForVersion& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        print_error(parse_error_message(app, e), parse_error_hint(app));
        return 1;
    } catch (const kvrun::Error& e) {
        print_error(e.what(), e.hint());
        return 1;
    } catch (const std::bad_alloc&) {
        print_error("out of memory", "");
        return 1;
    } catch (const std::exception& e) {
        std::fflush(stdout);
        fmt::print(stderr, "kvrun: internal error: {}\n", one_line(e.what()));
        return 2;
    }
    return exit_code;
}
