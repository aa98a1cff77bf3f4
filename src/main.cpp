// kvrun entry point: builds the command line from the modes and turns every error into
// one clear line on stderr and a non-zero exit code.
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "common.h"
#include "modes/modes.h"

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
    try {
        auto is_command = [&](const std::string& name) {
            for (const CLI::App* sub : app.get_subcommands({}))
                if (sub->check_name(name)) return true;
            return false;
        };
        if (argc > 1 && argv[1][0] != '-' && !is_command(argv[1]))
            throw kvrun::Error(fmt::format("unknown command '{}'", argv[1]),
                               "commands: run, chat, batch, perplexity, bench, info, tokenize "
                               "(see `kvrun --help`)");
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForVersion& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        std::fflush(stdout);
        fmt::print(stderr, "kvrun: {} (see `kvrun --help`)\n", e.what());
        return 1;
    } catch (const kvrun::Error& e) {
        std::fflush(stdout);
        fmt::print(stderr, "kvrun: error: {}\n", e.what());
        if (!e.hint().empty()) fmt::print(stderr, "hint: {}\n", e.hint());
        return 1;
    } catch (const std::bad_alloc&) {
        std::fflush(stdout);
        fmt::print(stderr, "kvrun: error: out of memory\n");
        return 1;
    } catch (const std::exception& e) {
        std::fflush(stdout);
        fmt::print(stderr, "kvrun: internal error: {}\n", e.what());
        return 2;
    }
    return exit_code;
}
