// End-to-end tests of the kvrun executable: help, errors on bad input (one line, exit 1),
// info/tokenize output, and `run` (streamed text, --jsonl) on real shared models.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "test_util.h"

using kvrun::test::run_command;
using kvrun::test::shared_path;

namespace {

std::string kvrun_cmd(const std::string& args) { return kvrun::test::kvrun_binary() + " " + args; }

// Bad input must give exactly one "kvrun: ..." line (plus an optional "hint: ..." line).
void check_one_clear_error(const kvrun::test::CommandResult& r, const std::string& needle) {
    CHECK(r.exit_code == 1);
    CHECK(r.out.empty());
    std::istringstream in(r.err);
    std::string line;
    int n_lines = 0, n_hints = 0;
    while (std::getline(in, line)) {
        if (line.rfind("hint: ", 0) == 0) ++n_hints;
        else ++n_lines;
    }
    CHECK_MESSAGE(n_lines == 1, r.err);
    CHECK(n_hints <= 1);
    CHECK_MESSAGE(r.err.find(needle) != std::string::npos, "expected '" << needle << "' in: " << r.err);
}

}  // namespace

TEST_CASE("help is complete and exits 0") {
    auto r = run_command(kvrun_cmd("--help"));
    CHECK(r.exit_code == 0);
    for (const char* cmd : {"run", "info", "tokenize"}) CHECK(r.out.find(cmd) != std::string::npos);
    for (const char* cmd : {"run", "info", "tokenize"}) {
        auto h = run_command(kvrun_cmd(std::string(cmd) + " --help"));
        CHECK(h.exit_code == 0);
        CHECK(h.out.find("--model") != std::string::npos);
    }
    auto run_help = run_command(kvrun_cmd("run --help"));
    for (const char* flag : {"--temp", "--top-k", "--top-p", "--min-p", "--repeat-penalty", "--seed",
                             "--kv-block-size", "--kv-type", "--device", "--jsonl", "--stats", "--ctx"})
        CHECK_MESSAGE(run_help.out.find(flag) != std::string::npos, flag);
}

TEST_CASE("bad flags and files give one clear line and exit 1") {
    check_one_clear_error(run_command(kvrun_cmd("info --no-such-flag -m " + std::string(KVRUN_SOURCE_DIR) + "/README.md")), "no-such-flag");
    check_one_clear_error(run_command(kvrun_cmd("info -m /nonexistent/model.gguf")), "/nonexistent/model.gguf");
    check_one_clear_error(run_command(kvrun_cmd("frobnicate")), "frobnicate");
    std::string not_gguf = std::string(KVRUN_SOURCE_DIR) + "/README.md";
    check_one_clear_error(run_command(kvrun_cmd("info -m " + not_gguf)), "not a GGUF file");
    check_one_clear_error(run_command(kvrun_cmd("run -m " + not_gguf + " -p hi")), "not a GGUF file");
}

TEST_CASE("info reports stories260K's hyperparameters") {
    auto model = shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    auto r = run_command(kvrun_cmd("info --json -m " + model.string()));
    REQUIRE(r.exit_code == 0);
    auto j = nlohmann::json::parse(r.out);
    CHECK(j["architecture"] == "llama");
    CHECK(j["hyperparameters"]["n_layer"] == 5);
    CHECK(j["hyperparameters"]["n_embd"] == 64);
    CHECK(j["hyperparameters"]["n_head"] == 8);
    CHECK(j["hyperparameters"]["n_head_kv"] == 4);
    CHECK(j["hyperparameters"]["head_dim"] == 8);
    CHECK(j["hyperparameters"]["n_ff"] == 172);
    CHECK(j["vocab"]["n_vocab"] == 512);
    CHECK(j["tensor_types"].contains("F32"));
    // f16 KV: 2 (K,V) x 5 layers x 4 kv heads x 8 dims x 2 bytes
    CHECK(j["kv_bytes_per_token"]["f16"].get<double>() == doctest::Approx(640.0));
    auto table = run_command(kvrun_cmd("info -m " + model.string()));
    CHECK(table.exit_code == 0);
    CHECK(table.out.find("n_layer") != std::string::npos);
}

TEST_CASE("info loads every shared model and reports its tensor types") {
    auto dir = kvrun::test::shared_dir();
    if (dir.empty()) {
        MESSAGE("SKIP: ../shared not found");
        return;
    }
    int n = 0;
    for (const auto& model : kvrun::test::shared_models()) {
        auto r = run_command(kvrun_cmd("info --json -m " + model.string()));
        CHECK_MESSAGE(r.exit_code == 0, model.string() << ": " << r.err);
        if (r.exit_code != 0) continue;
        auto j = nlohmann::json::parse(r.out);
        CHECK(j["n_tensors"].get<int>() > 0);
        CHECK(!j["tensor_types"].empty());
        std::string name = model.filename().string();
        // The type named in the file name must be among the tensor types (stories260K's
        // 64-wide tensors can't hold K-quants, so those files fall back to other types).
        bool w256 = name.find("w256") != std::string::npos;
        for (const char* t : {"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q6_K", "BF16", "IQ4_NL", "IQ4_XS"})
            if (name.find(std::string("-") + t + ".gguf") != std::string::npos &&
                (w256 || std::string(t) != "Q6_K"))
                CHECK_MESSAGE(j["tensor_types"].contains(t), name);
        ++n;
    }
    CHECK(n == 44);
}

TEST_CASE("tokenize --ids prints one line of ids") {
    auto model = shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    auto r = run_command(kvrun_cmd("tokenize --ids -m " + model.string() + " -p 'Once upon a time'"));
    CHECK(r.exit_code == 0);
    CHECK(r.out == "1 403 407 261 378\n");
    auto nb = run_command(kvrun_cmd("tokenize --ids --no-bos -m " + model.string() + " -p 'Once upon a time'"));
    CHECK(nb.out == "403 407 261 378\n");
    auto pieces = run_command(kvrun_cmd("tokenize -m " + model.string() + " -p 'Once upon a time'"));
    CHECK(pieces.exit_code == 0);
    CHECK(pieces.out.find("403") != std::string::npos);
}

TEST_CASE("run streams the greedy continuation from stdin") {
    auto model = shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    auto r = run_command(kvrun_cmd("run -m " + model.string() + " -n 48 --temp 0"), "Once upon a time\n");
    CHECK(r.exit_code == 0);
    CHECK_MESSAGE(r.out.rfind(", there was a little girl named Lily. She loved to play outside in the park", 0) == 0,
                  r.out);
    auto p = run_command(kvrun_cmd("run -m " + model.string() + " -n 48 --temp 0 --stats -p 'Once upon a time'"));
    CHECK(p.out == r.out);
    CHECK(p.err.find("prompt tokens") != std::string::npos);
    CHECK(p.err.find("KV blocks used") != std::string::npos);
    CHECK(p.err.find("tokens/s") != std::string::npos);
}

TEST_CASE("run: same seed, same output; different seed, different output") {
    auto model = shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    std::string base = kvrun_cmd("run -m " + model.string() + " -n 32 --temp 1 -p 'Once upon a time'");
    auto a = run_command(base + " -s 7"), b = run_command(base + " -s 7"), c = run_command(base + " -s 8");
    CHECK(a.exit_code == 0);
    CHECK(a.out == b.out);
    CHECK(a.out != c.out);
}

TEST_CASE("run rejects bad input with one clear line") {
    auto model = shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    std::string m = " -m " + model.string();
    check_one_clear_error(run_command(kvrun_cmd("run -m /no/such.gguf -p hi")), "/no/such.gguf");
    check_one_clear_error(run_command(kvrun_cmd("run" + m + " -p ''")), "empty prompt");
    check_one_clear_error(run_command(kvrun_cmd("run" + m), ""), "empty prompt");
    check_one_clear_error(run_command(kvrun_cmd("run" + m + " -c 4 -p 'Once upon a time there was'")),
                          "context");
    check_one_clear_error(run_command(kvrun_cmd("run" + m + " --kv-type q3 -p hi")), "q3");
    check_one_clear_error(run_command(kvrun_cmd("run" + m + " --kv-block-size 0 -p hi")), "kv-block-size");
    check_one_clear_error(run_command(kvrun_cmd("run" + m + " --device tpu -p hi")), "tpu");
    check_one_clear_error(run_command(kvrun_cmd("run" + m), "\xff\xfe bad utf8"), "UTF-8");
    auto vocab = shared_path("vocab/ggml-vocab-gpt-2.gguf");
    check_one_clear_error(run_command(kvrun_cmd("run -m " + vocab.string() + " -p hi")),
                          "unsupported architecture");
    // --truncate keeps the end of a too-long prompt instead.
    auto t = run_command(kvrun_cmd("run" + m + " -c 8 --truncate -n 2 --temp 0 -p 'Once upon a time there was'"));
    CHECK(t.exit_code == 0);
}

TEST_CASE("run --jsonl answers each line; a malformed line yields an error object") {
    auto model = shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    std::string input =
        "{\"prompt\": \"Once upon a time\", \"n_predict\": 12, \"temperature\": 0}\n"
        "{this is not json\n"
        "{\"n_predict\": 3}\n"
        "{\"prompt\": \"Lily and Tom went to the park. They\", \"n_predict\": 6, \"temperature\": 0}\n";
    auto r = run_command(kvrun_cmd("run --jsonl -m " + model.string()), input);
    CHECK(r.exit_code == 0);
    std::istringstream in(r.out);
    std::vector<nlohmann::json> lines;
    std::string line;
    while (std::getline(in, line)) lines.push_back(nlohmann::json::parse(line));
    REQUIRE(lines.size() == 4);
    CHECK(lines[0]["prompt_tokens"] == nlohmann::json({1, 403, 407, 261, 378}));
    CHECK(lines[0]["tokens"].size() == 12);
    CHECK(lines[0]["stop"] == "length");
    CHECK(lines[0]["text"].get<std::string>().rfind(", there was a little girl", 0) == 0);
    CHECK(lines[0]["timings"].contains("ttft_ms"));
    CHECK(lines[1].contains("error"));
    CHECK(lines[1]["line"] == 2);
    CHECK(lines[2]["error"].get<std::string>().find("prompt") != std::string::npos);
    CHECK(lines[3]["tokens"].size() == 6);
}
