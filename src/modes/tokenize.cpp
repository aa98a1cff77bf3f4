// `kvrun tokenize`: the token ids (and pieces) a model's tokenizer makes of a text.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "gguf.h"
#include "modes/modes.h"
#include "text_input.h"
#include "tokenizer.h"

namespace kvrun {
namespace {

struct TokenizeOptions {
    std::string model, prompt, file;
    bool prompt_given = false;  // -p was on the command line (an empty -p '' counts)
    bool ids = false, no_bos = false, parse_special = false, show_count = false;
    bool no_parse_special = false, from_stdin = false;  // llama-tokenize's spellings
};

int run_tokenize(const TokenizeOptions& o) {
    // The text byte-exact from -p, -f or stdin alike (a final newline is tokenized too), and
    // empty text is fine: like llama-tokenize, so the vocabulary suites replay exactly.
    TextInput in;
    if (o.prompt_given) in.prompt = o.prompt;
    in.file = o.file;
    in.allow_empty = true;
    in.strip_final_newline = false;
    std::string text = read_text_input(in);
    GgufFile f = GgufFile::open(o.model);
    auto tok = Tokenizer::from_gguf(f);
    std::vector<TokenId> ids = tok->encode(text, !o.no_bos && tok->add_bos(), o.parse_special);
    if (o.ids) {  // one line, empty when there are no tokens
        std::string line;
        for (size_t i = 0; i < ids.size(); ++i) line += (i ? " " : "") + std::to_string(ids[i]);
        fmt::print("{}\n", line);
    } else {
        for (TokenId id : ids)
            fmt::print("{:>8} -> '{}'\n", id, escape_control_bytes(tok->token_to_piece(id, true)));
    }
    if (o.show_count) fmt::print(stderr, "{} tokens\n", ids.size());
    return 0;
}

}  // namespace

void add_tokenize_command(CLI::App& root, int& exit_code) {
    auto o = std::make_shared<TokenizeOptions>();
    CLI::App* cmd = root.add_subcommand(
        "tokenize", "Tokenize a text with a model's tokenizer and print the token ids and pieces");
    cmd->add_option("-m,--model", o->model, "GGUF model (or vocabulary-only GGUF) file")
        ->required()
        ->check(CLI::ExistingFile);
    auto* p = cmd->add_option("-p,--prompt", o->prompt, "Text to tokenize");
    auto* f = cmd->add_option("-f,--file", o->file, "Read the text from this file")
                  ->check(CLI::ExistingFile);
    p->excludes(f);
    cmd->add_flag("--ids", o->ids, "Print only the ids, space-separated on one line");
    cmd->add_flag("--no-bos", o->no_bos, "Do not add the BOS token");
    auto* ps = cmd->add_flag("--parse-special", o->parse_special,
                             "Recognize special/control token texts (e.g. <s>) in the input");
    cmd->add_flag("--no-parse-special", o->no_parse_special,
                  "Treat special token texts as plain text (the default)")
        ->excludes(ps);
    auto* in = cmd->add_flag(
        "--stdin", o->from_stdin,
        "Read the text from standard input (the default without -p or -f; llama-tokenize's flag)");
    in->excludes(p)->excludes(f);
    cmd->add_flag("--show-count", o->show_count, "Print the number of tokens to stderr");
    cmd->footer(
        "Without -p or -f the text is read from standard input. The text is tokenized "
        "byte-exact (a final newline included); empty text gives no tokens.");
    cmd->callback([o, p, &exit_code] {
        o->prompt_given = p->count() > 0;
        exit_code = run_tokenize(*o);
    });
}

}  // namespace kvrun
