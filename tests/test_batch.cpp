// End-to-end tests of `kvrun batch` on stories260K: text and JSONL input, results in input
// order equal to `kvrun run` (greedy), the summary on stderr, error objects for bad lines,
// --n-samples, a pool too small for the batch (preemption), Ctrl-C (exit 130, finished
// results written), --draft-model (same greedy tokens, speculation in the summary), -n 0 and
// negative -n in every mode, the capped-context warning, and decode rates.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

using kvrun::test::run_command;
using kvrun::test::shell_quote;
namespace fs = std::filesystem;

namespace {

std::string kvrun_cmd(const std::string& args) {
    return kvrun::test::kvrun_binary() + " " + args;
}

using kvrun::test::TempDir;

std::vector<nlohmann::json> parse_lines(const std::string& text) {
    std::vector<nlohmann::json> out;
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
    return out;
}

std::string read_all(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// `kvrun run` greedy output for one prompt (without the final newline).
std::string run_alone(const std::string& model, const std::string& prompt, int n) {
    auto r = run_command(kvrun_cmd("run -m " + model + " --temp 0 -n " + std::to_string(n) +
                                   " -p " + shell_quote(prompt)));
    REQUIRE(r.exit_code == 0);
    return r.out.substr(0, r.out.size() - 1);
}

int count_lines(const std::string& text, const std::string& needle) {
    int n = 0;
    for (size_t p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
    return n;
}

void check_summary(const std::string& err) {
    for (const char* s : {"batch summary", "tokens/s", "peak in flight", "KV blocks", "KV waste",
                          "prefix cache", "preemptions"})
        CHECK_MESSAGE(err.find(s) != std::string::npos, s << " missing in: " << err);
}

}  // namespace

TEST_CASE("batch on a text file: one result per prompt, input order, equal to run") {
    auto model = kvrun::test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    TempDir dir;
    const std::vector<std::string> prompts = {"Once upon a time",
                                              "The little dog saw a big red ball. He",
                                              "Lily and Tom went to the park. They",
                                              "One day, a bird flew into the garden and",
                                              "Tom had a cat.\nThe cat",
                                              "Mom said \"no\" \\ and"};
    // Line 5 uses the \n escape, line 6 a literal backslash (\\); a blank line is skipped;
    // the invalid UTF-8 line becomes an error object.
    std::string txt = prompts[0] + "\n" + prompts[1] + "\n\n" + prompts[2] + "\n" + prompts[3] +
                      "\nTom had a cat.\\nThe cat\n" + "Mom said \"no\" \\\\ and\n" +
                      "bad \xff line\n";
    std::string in = dir.write("prompts.txt", txt);
    std::string out = (dir.path / "out.jsonl").string();
    auto r = run_command(kvrun_cmd("batch -m " + model.string() + " -f " + in + " -o " + out +
                                   " --temp 0 -n 20 --parallel 4"));
    CHECK_MESSAGE(r.exit_code == 0, r.err);
    CHECK(r.out.empty());
    check_summary(r.err);
    auto lines = parse_lines(read_all(out));
    REQUIRE(lines.size() == 7);
    const int file_lines[] = {1, 2, 4, 5, 6, 7, 8};
    for (size_t i = 0; i < lines.size(); ++i) {
        CHECK(lines[i]["index"] == i);
        CHECK(lines[i]["line"] == file_lines[i]);
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
        CAPTURE(prompts[i]);
        REQUIRE(!lines[i].contains("error"));
        CHECK(lines[i]["tokens"].size() == 20);
        CHECK(lines[i]["stop"] == "length");
        CHECK(lines[i]["text"] == run_alone(model.string(), prompts[i], 20));
        for (const char* k : {"queue_ms", "ttft_ms", "decode_tokens_per_s", "prefill_ms"})
            CHECK(lines[i]["timings"].contains(k));
    }
    CHECK(lines[6]["error"].get<std::string>().find("UTF-8") != std::string::npos);
}

TEST_CASE("batch on a JSONL file: per-request fields, error objects, samples, stdout") {
    auto model = kvrun::test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    TempDir dir;
    std::string jsonl =
        "{\"prompt\": \"Once upon a time\", \"n_predict\": 30, \"temperature\": 0, \"id\": \"a\"}\n"
        "{\"prompt\": \"The little dog saw a big red ball. He\", \"n_predict\": 5, "
        "\"temperature\": 0, \"id\": 7}\n"
        "{this is not json\n"
        "{\"n_predict\": 3}\n"
        "{\"prompt\": \"Lily and Tom went to the park. They\", \"n_predict\": 8, \"n_samples\": 3, "
        "\"temperature\": 1, \"seed\": 5, \"ignore_eos\": true}\n"
        "{\"prompt\": \"One day\", \"n_predict\": 4, \"temperature\": -1, \"top_k\": \"x\"}\n";
    std::string in = dir.write("requests.jsonl", jsonl);
    auto r = run_command(kvrun_cmd("batch -m " + model.string() + " -f " + in + " --parallel 8"));
    CHECK_MESSAGE(r.exit_code == 0, r.err);
    check_summary(r.err);
    auto lines = parse_lines(r.out);
    REQUIRE(lines.size() == 6);
    for (size_t i = 0; i < lines.size(); ++i) CHECK(lines[i]["index"] == i);
    // The short second request finished first but is written second.
    CHECK(lines[0]["id"] == "a");
    CHECK(lines[0]["tokens"].size() == 30);
    CHECK(lines[0]["text"] == run_alone(model.string(), "Once upon a time", 30));
    CHECK(lines[1]["id"] == 7);
    CHECK(lines[1]["tokens"].size() == 5);
    CHECK(lines[1]["text"] ==
          run_alone(model.string(), "The little dog saw a big red ball. He", 5));
    CHECK(lines[2]["error"].get<std::string>().find("malformed JSON") != std::string::npos);
    CHECK(lines[2]["line"] == 3);
    CHECK(lines[3]["error"].get<std::string>().find("prompt") != std::string::npos);
    REQUIRE(lines[4].contains("samples"));
    REQUIRE(lines[4]["samples"].size() == 3);
    CHECK(lines[4]["samples"][0]["tokens"] != lines[4]["samples"][1]["tokens"]);
    CHECK(lines[4]["samples"][1]["tokens"] != lines[4]["samples"][2]["tokens"]);
    for (auto& s : lines[4]["samples"]) CHECK(s["tokens"].size() == 8);
    CHECK(lines[5]["error"].get<std::string>().find("bad field type") != std::string::npos);
    // The samples shared the prompt's blocks.
    CHECK(r.err.find("shared blocks     peak 0") == std::string::npos);

    // --n-samples 4 with a fixed seed: four different continuations sharing the prompt.
    std::string one =
        dir.write("one.txt", "Once upon a time, there was a little girl named Lily.\n");
    auto ns = run_command(kvrun_cmd("batch -m " + model.string() + " -f " + one +
                                    " --temp 1 -s 3 -n 16 --ignore-eos --n-samples 4"));
    CHECK(ns.exit_code == 0);
    auto ns_lines = parse_lines(ns.out);
    REQUIRE(ns_lines.size() == 1);
    REQUIRE(ns_lines[0]["samples"].size() == 4);
    std::set<std::string> texts;
    for (auto& s : ns_lines[0]["samples"]) texts.insert(s["text"].get<std::string>());
    CHECK(texts.size() == 4);
    CHECK(ns.err.find("shared blocks     peak 0") == std::string::npos);
    CHECK(ns.err.find("shared blocks     peak") != std::string::npos);
    auto ns2 = run_command(kvrun_cmd("batch -m " + model.string() + " -f " + one +
                                     " --temp 1 -s 3 -n 16 --ignore-eos --n-samples 4"));
    auto ns2_lines = parse_lines(ns2.out);  // same seed, same samples
    REQUIRE(ns2_lines.size() == 1);
    for (size_t k = 0; k < 4; ++k)
        CHECK(ns2_lines[0]["samples"][k]["tokens"] == ns_lines[0]["samples"][k]["tokens"]);

    // The same JSONL through `run --jsonl` gives the same greedy tokens.
    auto rr = run_command(kvrun_cmd("run --jsonl -m " + model.string()), jsonl);
    auto run_lines = parse_lines(rr.out);
    REQUIRE(run_lines.size() == 6);
    CHECK(run_lines[0]["tokens"] == lines[0]["tokens"]);
    CHECK(run_lines[1]["tokens"] == lines[1]["tokens"]);
}

TEST_CASE("batch with a pool too small for all prompts preempts and still answers all") {
    auto model = kvrun::test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    TempDir dir;
    std::string txt;
    std::vector<std::string> prompts;
    const char* base[] = {"Once upon a time", "The little dog saw a big red ball. He",
                          "Lily and Tom went to the park. They",
                          "One day, a bird flew into the garden and"};
    for (int i = 0; i < 12; ++i) {
        prompts.push_back(std::string(base[i % 4]) + (i >= 4 ? " the" : "") +
                          (i >= 8 ? " big" : ""));
        txt += prompts.back() + "\n";
    }
    std::string in = dir.write("p.txt", txt);
    // 0.1 MiB of f16 KV = 10 blocks of 16 tokens (640 bytes per token): ~2 sequences of 80.
    auto r = run_command(kvrun_cmd("batch -m " + model.string() + " -f " + in +
                                   " --temp 0 -n 60 --parallel 8 --kv-memory 0.1"));
    CHECK_MESSAGE(r.exit_code == 0, r.err);
    auto lines = parse_lines(r.out);
    REQUIRE(lines.size() == prompts.size());
    CHECK(r.err.find("preemptions       0") == std::string::npos);
    for (size_t i = 0; i < prompts.size(); i += 3) {
        CAPTURE(i);
        CHECK(lines[i]["text"] == run_alone(model.string(), prompts[i], 60));
    }
}

TEST_CASE("batch: Ctrl-C stops, writes the finished results and exits 130") {
    auto model = kvrun::test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    TempDir dir;
    std::string jsonl =
        "{\"prompt\": \"Once upon a time\", \"n_predict\": 4}\n"
        "{\"prompt\": \"One day\", \"n_predict\": 4}\n";
    for (int i = 0; i < 4; ++i)
        jsonl += "{\"prompt\": \"Lily and Tom\", \"n_predict\": -1, \"ignore_eos\": true}\n";
    std::string in = dir.write("r.jsonl", jsonl);
    std::string out = (dir.path / "out.jsonl").string();
    // Wait (at most 10 s) until the two short requests are written, then send SIGINT.
    std::string script = kvrun_cmd("batch -m " + model.string() + " -f " + in + " -o " + out +
                                   " --parallel 1 -c 2048") +
                         " & pid=$!; for i in $(seq 100); do "
                         "[ \"$(wc -l < " +
                         out +
                         " 2>/dev/null)\" -ge 2 ] 2>/dev/null && break; "
                         "sleep 0.1; done; kill -INT $pid; wait $pid; echo rc=$?";
    auto r = run_command("sh -c " + shell_quote(script));
    CHECK_MESSAGE(r.out.find("rc=130") != std::string::npos, r.out << r.err);
    CHECK(r.err.find("interrupted") != std::string::npos);
    auto lines = parse_lines(read_all(out));
    REQUIRE(lines.size() >= 2);
    CHECK(lines.size() < 6);
    CHECK(lines[0]["index"] == 0);
    CHECK(lines[1]["index"] == 1);
    CHECK(lines[1]["tokens"].size() == 4);
}

TEST_CASE("batch reads standard input without -f (or with -f -), JSONL by its first line") {
    auto model = kvrun::test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    const std::string m = "batch -m " + model.string() + " --temp 0 -n 12 --no-progress";
    auto txt = run_command(kvrun_cmd(m), "Once upon a time\n\nThe little dog\n");
    REQUIRE_MESSAGE(txt.exit_code == 0, txt.err);
    auto lines = parse_lines(txt.out);
    REQUIRE(lines.size() == 2);
    CHECK(lines[0]["text"] == run_alone(model.string(), "Once upon a time", 12));
    CHECK(lines[1]["text"] == run_alone(model.string(), "The little dog", 12));
    CHECK(lines[1]["line"] == 3);
    auto jsonl =
        run_command(kvrun_cmd(m + " -f -"),
                    "  {\"prompt\": \"The little dog\", \"id\": \"d\", \"n_predict\": 12}\n");
    REQUIRE_MESSAGE(jsonl.exit_code == 0, jsonl.err);
    lines = parse_lines(jsonl.out);
    REQUIRE(lines.size() == 1);
    CHECK(lines[0]["id"] == "d");
    CHECK(lines[0]["text"] == run_alone(model.string(), "The little dog", 12));
    // --format txt reads a '{' line as a prompt.
    auto forced = run_command(kvrun_cmd(m + " --format txt"), "{ not json\n");
    REQUIRE_MESSAGE(forced.exit_code == 0, forced.err);
    CHECK_FALSE(parse_lines(forced.out)[0].contains("error"));
    auto none = run_command(kvrun_cmd(m), "\n \n");
    CHECK(none.exit_code == 1);
    CHECK(none.err.find("no prompts in standard input") != std::string::npos);
}

TEST_CASE("batch rejects a missing or empty input with one clear line") {
    auto model = kvrun::test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    TempDir dir;
    std::string empty = dir.write("empty.txt", "\n  \n");
    auto r = run_command(kvrun_cmd("batch -m " + model.string() + " -f " + empty));
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("no prompts") != std::string::npos);
    auto m = run_command(kvrun_cmd("batch -m " + model.string() + " -f /no/such/file.txt"));
    CHECK(m.exit_code == 1);
    CHECK(m.err.find("/no/such/file.txt") != std::string::npos);
}

TEST_CASE("batch --draft-model: greedy results equal the target's (parallel 1/4, K 1/4/8)") {
    auto model = kvrun::test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    TempDir dir;
    std::string txt;
    const char* base[] = {"Once upon a time", "The little dog saw a big red ball. He",
                          "Lily and Tom went to the park. They",
                          "One day, a bird flew into the garden and"};
    for (int i = 0; i < 8; ++i)
        txt += std::string(base[i % 4]) +
               (i >= 4 ? " The sun was shining and the sky was blue." : "") + "\n";
    std::string in = dir.write("p.txt", txt);
    const std::string cmd = "batch -m " + model.string() + " -f " + in + " --temp 0 -n 48";
    auto plain = run_command(kvrun_cmd(cmd + " --parallel 4"));
    REQUIRE(plain.exit_code == 0);
    CHECK(plain.err.find("speculative") == std::string::npos);
    auto want = parse_lines(plain.out);
    REQUIRE(want.size() == 8);
    for (const char* draft : {"stories260K-Q8_0.gguf", "stories260K-L4-F32.gguf"}) {
        const auto dpath = kvrun::test::shared_path(std::string("models/") + draft);
        for (int parallel : {1, 4}) {
            for (int k : {1, 4, 8}) {
                CAPTURE(draft);
                CAPTURE(parallel);
                CAPTURE(k);
                auto r =
                    run_command(kvrun_cmd(cmd + " --parallel " + std::to_string(parallel) +
                                          " --draft-model " + dpath.string() + " --draft-n " +
                                          std::to_string(k) + " --draft-min " + std::to_string(k)));
                REQUIRE_MESSAGE(r.exit_code == 0, r.err);
                auto got = parse_lines(r.out);
                REQUIRE(got.size() == 8);
                for (size_t i = 0; i < 8; ++i) {
                    CHECK(got[i]["tokens"] == want[i]["tokens"]);
                    CHECK(got[i]["speculative"]["drafted"].get<int>() > 0);
                    CHECK(got[i]["speculative"]["accepted"].get<int>() <=
                          got[i]["speculative"]["drafted"].get<int>());
                }
                check_summary(r.err);
                for (const char* s : {"speculative", "drafted", "accepted", "mean accepted length",
                                      "draft KV blocks", "0 in use at the end"})
                    CHECK_MESSAGE(r.err.find(s) != std::string::npos, s << " missing in " << r.err);
            }
        }
    }
    auto help = run_command(kvrun_cmd("batch --help"));
    for (const char* flag : {"--draft-model", "--draft-n", "--draft-min"})
        CHECK_MESSAGE(help.out.find(flag) != std::string::npos, flag);
}

TEST_CASE("-n 0 generates nothing and values below -1 are refused (run, batch, chat, JSONL)") {
    auto model = kvrun::test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    const auto draft = kvrun::test::shared_path("models/stories260K-Q8_0.gguf");
    const std::string m = " -m " + model.string();
    auto zero = run_command(kvrun_cmd("run" + m + " -p 'Once upon a time' -n 0 --stats"));
    CHECK(zero.exit_code == 0);
    CHECK(zero.out == "\n");
    CHECK(zero.err.find("generated tokens  0 (stop: length)") != std::string::npos);
    auto zero_spec = run_command(
        kvrun_cmd("run" + m + " -p 'Once upon a time' -n 0 --draft-model " + draft.string()));
    CHECK(zero_spec.exit_code == 0);
    CHECK(zero_spec.out == "\n");
    for (const char* mode : {"run -p hi", "batch -f /dev/null", "chat"}) {
        CAPTURE(mode);
        auto bad = run_command(kvrun_cmd(std::string(mode) + m + " -n -2"));
        CHECK(bad.exit_code == 1);
        CHECK_MESSAGE(bad.err.find("must be -1 (no limit) or a count >= 0") != std::string::npos,
                      bad.err);
    }
    // JSONL, through run and batch.
    TempDir dir;
    const std::string jsonl =
        "{\"prompt\": \"Once upon a time\", \"n_predict\": 0}\n"
        "{\"prompt\": \"Once upon a time\", \"n_predict\": 0, \"n_samples\": 2}\n"
        "{\"prompt\": \"Once upon a time\", \"n_predict\": -2}\n"
        "{\"prompt\": \"Once upon a time\", \"n_predict\": 3, \"temperature\": 0}\n";
    auto run_out = run_command(kvrun_cmd("run --jsonl" + m), jsonl);
    auto batch_out = run_command(kvrun_cmd("batch" + m + " -f " + dir.write("r.jsonl", jsonl)));
    for (const auto* r : {&run_out, &batch_out}) {
        CHECK(r->exit_code == 0);
        auto lines = parse_lines(r->out);
        REQUIRE(lines.size() == 4);
        CHECK(lines[0]["tokens"].empty());
        CHECK(lines[0]["stop"] == "length");
        REQUIRE(lines[1]["samples"].size() == 2);
        for (auto& s : lines[1]["samples"]) CHECK(s["tokens"].empty());
        CHECK(lines[2]["error"].get<std::string>().find("'n_predict' must be -1 (no limit)") !=
              std::string::npos);
        CHECK(lines[3]["tokens"].size() == 3);
    }
}

TEST_CASE(
    "serving: the capped-context warning, all samples in --stats, decode rate only when "
    "meaningful") {
    auto model = kvrun::test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    const std::string m = " -m " + model.string();
    // 0.05 MiB of f16 KV = 5 blocks of 16 tokens: the context shrinks from 512 to 80 tokens.
    auto capped = run_command(kvrun_cmd("run" + m + " -p hi -n 4 -c 512 --kv-memory 0.05"));
    CHECK(capped.exit_code == 0);
    CHECK_MESSAGE(capped.err.find("warning: the context is capped from 512 to 80 tokens") !=
                      std::string::npos,
                  capped.err);
    CHECK(capped.err.find("--kv-memory 0.05 MiB") != std::string::npos);
    auto roomy = run_command(kvrun_cmd("run" + m + " -p hi -n 4 -c 512"));
    CHECK(roomy.err.find("capped") == std::string::npos);
    TempDir dir;
    std::string in = dir.write("p.txt", "Once upon a time\nOne day\n");
    auto batch = run_command(kvrun_cmd("batch" + m + " -f " + in + " -n 8 --kv-memory 0.1"));
    CHECK(batch.exit_code == 0);
    CHECK(count_lines(batch.err, "context is capped from") == 1);  // once
    auto chat = run_command(kvrun_cmd("chat" + m + " -n 4 -c 512 --kv-memory 0.05"), "hi\n");
    CHECK(chat.err.find("context is capped from 512 to 80 tokens") != std::string::npos);

    // --n-samples N --stats counts every sample's tokens.
    auto samples = run_command(kvrun_cmd("run" + m +
                                         " -p 'Once upon a time' -n 20 --ignore-eos --temp 1 "
                                         "--n-samples 3 --stats"));
    CHECK(samples.exit_code == 0);
    CHECK_MESSAGE(samples.err.find("generated tokens  60 (stop: 3 samples: 20 (length), 20 "
                                   "(length), 20 (length))") != std::string::npos,
                  samples.err);

    // Six tokens in one speculative round: no decode rate (null), not millions of tokens/s.
    const auto draft = kvrun::test::shared_path("models/stories260K-Q8_0.gguf");
    auto one_round =
        run_command(kvrun_cmd("run --jsonl" + m + " --draft-model " + draft.string()),
                    "{\"prompt\": \"Once upon a time\", \"n_predict\": 6, \"temperature\": 0}\n"
                    "{\"prompt\": \"Once upon a time\", \"n_predict\": 40, \"temperature\": 0}\n");
    auto lines = parse_lines(one_round.out);
    REQUIRE(lines.size() == 2);
    CHECK(lines[0]["tokens"].size() == 6);
    CHECK(lines[0]["speculative"]["rounds"] == 1);
    CHECK(lines[0]["timings"]["decode_tokens_per_s"].is_null());
    CHECK(lines[1]["tokens"].size() == 40);
    CHECK(lines[1]["speculative"]["rounds"].get<int>() > 1);
}

TEST_CASE("batch --context-shift: each request goes past the context, like run does") {
    auto model = kvrun::test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    TempDir dir;
    const std::vector<std::string> prompts = {"Once upon a time", "The little dog saw a big red",
                                              "Lily and Tom went to the park. They"};
    std::string txt;
    for (const auto& p : prompts) txt += p + "\n";
    const std::string in = dir.write("prompts.txt", txt);
    const std::string flags = " --temp 0 -n 70 -c 32 --ignore-eos --context-shift --keep 2";
    auto r = run_command(
        kvrun_cmd("batch -m " + model.string() + " -f " + in + " --parallel 3" + flags));
    CHECK_MESSAGE(r.exit_code == 0, r.err);
    auto lines = parse_lines(r.out);
    REQUIRE(lines.size() == 3);
    for (size_t i = 0; i < prompts.size(); ++i) {
        CAPTURE(prompts[i]);
        CHECK(lines[i]["tokens"].size() == 70);
        CHECK(lines[i]["stop"] == "length");
        // The same tokens as `run` with the same flags (one request at a time).
        auto alone = run_command(
            kvrun_cmd("run -m " + model.string() + flags + " -p " + shell_quote(prompts[i])));
        REQUIRE(alone.exit_code == 0);
        CHECK(lines[i]["text"].get<std::string>() + "\n" == alone.out);
    }
    // Without it the context ends each text; with several samples a request is refused.
    auto plain = run_command(kvrun_cmd("batch -m " + model.string() + " -f " + in +
                                       " --temp 0 -n 70 -c 32 --ignore-eos"));
    CHECK(parse_lines(plain.out)[0]["stop"] == "context");
    auto samples = run_command(
        kvrun_cmd("batch -m " + model.string() + " -f " + in + flags + " --n-samples 2"));
    CHECK(parse_lines(samples.out)[0]["error"] == "--context-shift runs one sample per request");
}

TEST_CASE("a JSONL request's n_keep replaces --keep under --context-shift (batch and run)") {
    // llama-server's per-request field, also in `batch` and `run --jsonl` files: each line
    // gives the text of `run --keep N` with its own N (-1: the whole prompt).
    auto model = kvrun::test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    TempDir dir;
    const std::string prompt = "Lily and Tom went to the park. They";
    const std::string flags = " --temp 0 -n 70 -c 32 --ignore-eos --context-shift";
    auto run_keep = [&](const std::string& keep) {
        auto r = run_command(kvrun_cmd("run -m " + model.string() + flags + " --keep " + keep +
                                       " -p " + shell_quote(prompt)));
        REQUIRE(r.exit_code == 0);
        return r.out;
    };
    const std::string keep2 = run_keep("2"), keep5 = run_keep("5"), keep_all = run_keep("-1");
    REQUIRE(keep2 != keep5);  // the three keeps give three texts here
    REQUIRE(keep5 != keep_all);
    const std::string line = R"({"prompt": ")" + prompt + R"(", "n_keep": )";
    const std::string jsonl = line + "5}\n" + line + "-1}\n" + R"({"prompt": ")" + prompt +
                              "\"}\n" + line + "-2}\n" + line + "\"all\"}\n";
    const std::string in = dir.write("requests.jsonl", jsonl);
    auto check = [&](const kvrun::test::CommandResult& r) {
        CHECK_MESSAGE(r.exit_code == 0, r.err);
        auto lines = parse_lines(r.out);
        REQUIRE(lines.size() == 5);
        CHECK(lines[0]["text"].get<std::string>() + "\n" == keep5);
        CHECK(lines[1]["text"].get<std::string>() + "\n" == keep_all);
        CHECK(lines[2]["text"].get<std::string>() + "\n" == keep2);  // no n_keep: --keep
        for (int i : {3, 4}) {
            CAPTURE(i);
            CHECK(lines[i]["error"].get<std::string>().find(
                      "'n_keep' must be -1 (the whole prompt) or a count >= 0") == 0);
        }
    };
    SUBCASE("batch") {
        check(run_command(kvrun_cmd("batch -m " + model.string() + " -f " + in + " --parallel 3" +
                                    flags + " --keep 2")));
    }
    SUBCASE("run --jsonl") {
        check(run_command(kvrun_cmd("run -m " + model.string() + " --jsonl" + flags + " --keep 2"),
                          jsonl));
    }
}
