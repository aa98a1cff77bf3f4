// End-to-end tests of the kvrun executable: help, errors on bad input (one line, exit 1),
// info/tokenize output (every llama.cpp vocabulary case through the binary), sampling flag
// validation, and `run` (streamed text, --jsonl) on real shared models.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "test_util.h"

using kvrun::test::run_command;
using kvrun::test::shared_path;

namespace {

std::string kvrun_cmd(const std::string& args) {
    return kvrun::test::kvrun_binary() + " " + args;
}

// Bad input must give exactly one line on stderr, "kvrun: error: <message>" with any hint on
// the same line, nothing on stdout, and exit code 1.
void check_one_clear_error(const kvrun::test::CommandResult& r, const std::string& needle) {
    CHECK(r.exit_code == 1);
    CHECK(r.out.empty());
    CHECK_MESSAGE(r.err.rfind("kvrun: error: ", 0) == 0, r.err);
    CHECK_MESSAGE(!r.err.empty(), "no error message");
    CHECK_MESSAGE(r.err.find('\n') == r.err.size() - 1, "not exactly one line: " << r.err);
    CHECK_MESSAGE(r.err.find('\r') == std::string::npos, r.err);
    CHECK_MESSAGE(r.err.find("\nhint") == std::string::npos, r.err);
    CHECK_MESSAGE(r.err.find(needle) != std::string::npos,
                  "expected '" << needle << "' in: " << r.err);
}

// The same, and the line carries a hint.
void check_one_line_with_hint(const kvrun::test::CommandResult& r, const std::string& needle) {
    check_one_clear_error(r, needle);
    CHECK_MESSAGE(r.err.find(" (hint: ") != std::string::npos, r.err);
}

// Each (flags, needle): `run` with those flags (on a file that is not a model, so nothing loads
// first) fails with one clear line containing needle.
void check_bad_run_flags(const std::vector<std::pair<std::string, std::string>>& bad) {
    const std::string readme = std::string(KVRUN_SOURCE_DIR) + "/README.md";
    for (const auto& [flag, needle] : bad) {
        INFO(flag);
        check_one_clear_error(run_command(kvrun_cmd("run -m " + readme + " -p hi " + flag)),
                              needle);
    }
}

// One parsed JSON value per line of `text` (JSONL output).
std::vector<nlohmann::json> json_lines(const std::string& text) {
    std::istringstream in(text);
    std::vector<nlohmann::json> out;
    for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
    return out;
}

// Writes `text` byte-exact to a fresh temporary file and returns its path.
std::string temp_file(const std::string& text, const std::string& tag) {
    static int counter = 0;
    std::filesystem::path p =
        std::filesystem::temp_directory_path() /
        ("kvrun_cli_" + std::to_string(::getpid()) + "_" + tag + "_" + std::to_string(counter++));
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
}

std::string read_all(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// llama.cpp's .inp files: every case is followed by "\n__ggml_vocab_test__\n".
std::vector<std::string> vocab_cases(const std::string& inp) {
    static const std::string sep = "\n__ggml_vocab_test__\n";
    std::vector<std::string> cases;
    for (size_t pos = 0, at; (at = inp.find(sep, pos)) != std::string::npos; pos = at + sep.size())
        cases.push_back(inp.substr(pos, at - pos));
    return cases;
}

// What `tokenize --ids` must print for a .out line: .out spells the ids " 1 2 3" (a space
// before each), --ids "1 2 3\n" (an empty line for no ids).
std::string ids_output_for(const std::string& out_line) {
    REQUIRE_MESSAGE((out_line.empty() || out_line[0] == ' '), out_line);
    return (out_line.empty() ? out_line : out_line.substr(1)) + "\n";
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
    for (const char* flag :
         {"--temp", "--top-k", "--top-p", "--min-p", "--repeat-penalty", "--frequency-penalty",
          "--presence-penalty", "--seed", "--kv-block-size", "--kv-type", "--device", "--jsonl",
          "--stats", "--ctx", "--grammar", "--grammar-file", "--json-schema", "--json-schema-file",
          "--n-probs"})
        CHECK_MESSAGE(run_help.out.find(flag) != std::string::npos, flag);
}

TEST_CASE("bad flags and files give one clear line and exit 1") {
    check_one_clear_error(run_command(kvrun_cmd("info --no-such-flag -m " +
                                                std::string(KVRUN_SOURCE_DIR) + "/README.md")),
                          "no-such-flag");
    check_one_clear_error(run_command(kvrun_cmd("info -m /nonexistent/model.gguf")),
                          "/nonexistent/model.gguf");
    check_one_line_with_hint(run_command(kvrun_cmd("frobnicate")), "unknown command 'frobnicate'");
    auto bogus = run_command(kvrun_cmd("--bogus"));
    check_one_line_with_hint(bogus, "unknown option '--bogus'");
    CHECK(bogus.err.find("subcommand is required") == std::string::npos);
    check_one_clear_error(run_command(kvrun_cmd("--bogus=3")), "--bogus");
    check_one_clear_error(run_command(kvrun_cmd("")), "subcommand");
    std::string not_gguf = std::string(KVRUN_SOURCE_DIR) + "/README.md";
    check_one_clear_error(run_command(kvrun_cmd("info -m " + not_gguf)), "not a GGUF file");
    check_one_clear_error(run_command(kvrun_cmd("run -m " + not_gguf + " -p hi")),
                          "not a GGUF file");
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
    // The chat format `chat` would use: none in stories260K, Phi-3's in its vocabulary file.
    CHECK(table.out.find("chat template   none in the file") != std::string::npos);
    CHECK(j["vocab"]["chat_template"] == "plain");
    auto phi3 = shared_path("vocab/ggml-vocab-phi-3.gguf");
    if (phi3.empty()) return;
    auto p = run_command(kvrun_cmd("info -m " + phi3.string()));
    CHECK(p.out.find("chat template   phi3 (detected from tokenizer.chat_template)") !=
          std::string::npos);
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
        for (const char* t :
             {"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q6_K", "BF16", "IQ4_NL", "IQ4_XS"})
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
    auto r =
        run_command(kvrun_cmd("tokenize --ids -m " + model.string() + " -p 'Once upon a time'"));
    CHECK(r.exit_code == 0);
    CHECK(r.out == "1 403 407 261 378\n");
    auto nb = run_command(
        kvrun_cmd("tokenize --ids --no-bos -m " + model.string() + " -p 'Once upon a time'"));
    CHECK(nb.out == "403 407 261 378\n");
    auto pieces =
        run_command(kvrun_cmd("tokenize -m " + model.string() + " -p 'Once upon a time'"));
    CHECK(pieces.exit_code == 0);
    CHECK(pieces.out.find("403") != std::string::npos);
    // llama-tokenize's --stdin and --no-parse-special (kvrun's defaults) are accepted.
    auto in =
        run_command(kvrun_cmd("tokenize --ids --stdin --no-parse-special -m " + model.string()),
                    "Once upon a time");
    CHECK(in.out == r.out);
    check_one_clear_error(run_command(kvrun_cmd("tokenize --stdin -p x -m " + model.string())),
                          "--prompt excludes --stdin");
}

TEST_CASE("tokenize: empty text gives an empty result") {
    auto vocab = shared_path("vocab/ggml-vocab-gpt-2.gguf");
    if (vocab.empty()) return;
    std::string base = kvrun_cmd("tokenize -m " + vocab.string());
    std::string empty = temp_file("", "empty");
    for (const std::string& source : {std::string(" -p ''"), " -f " + empty, std::string()}) {
        INFO("source:" << source);
        auto ids = run_command(base + " --ids --no-bos" + source);
        CHECK(ids.exit_code == 0);
        CHECK(ids.out == "\n");  // exactly one empty line
        CHECK(ids.err.empty());
        auto table = run_command(base + source);
        CHECK(table.exit_code == 0);
        CHECK(table.out.empty());
    }
    std::filesystem::remove(empty);
    // A model that adds BOS still does so for empty text, as llama.cpp does.
    auto model = shared_path("models/stories260K.gguf");
    auto bos = run_command(kvrun_cmd("tokenize --ids -p '' -m " + model.string()));
    CHECK(bos.exit_code == 0);
    CHECK(bos.out == "1\n");
}

TEST_CASE("tokenize: stdin and -f give the same ids for the same bytes") {
    auto model = shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    std::string base = kvrun_cmd("tokenize --ids -m " + model.string());
    for (const std::string& text : {std::string("Once upon a time\n"), std::string("a\n\n"),
                                    std::string("two\r\n"), std::string(" x ")}) {
        INFO("text: " << text);
        std::string file = temp_file(text, "same");
        auto from_file = run_command(base + " -f " + file);
        auto from_stdin = run_command(base, text);
        std::filesystem::remove(file);
        CHECK(from_file.exit_code == 0);
        CHECK(from_stdin.exit_code == 0);
        CHECK(from_file.out == from_stdin.out);
    }
    // The final newline is part of the text (it is a token of its own here).
    auto with_nl = run_command(base, "Once upon a time\n");
    auto without = run_command(base + " -p 'Once upon a time'");
    CHECK(without.out == "1 403 407 261 378\n");
    CHECK(with_nl.out.rfind("1 403 407 261 378 ", 0) == 0);
}

TEST_CASE("tokenize --ids reproduces every llama.cpp vocabulary case through the binary") {
    const std::filesystem::path dir = shared_path("vocab");
    if (dir.empty()) return;
    const std::vector<std::string> suites = {"llama-spm", "phi-3",        "gpt-2",
                                             "falcon",    "deepseek-llm", "deepseek-coder",
                                             "starcoder", "refact",       "mpt"};
    int total = 0;
    for (const std::string& name : suites) {
        const std::filesystem::path gguf = dir / ("ggml-vocab-" + name + ".gguf");
        REQUIRE_MESSAGE(std::filesystem::exists(gguf), "missing " << gguf);
        const std::vector<std::string> cases = vocab_cases(read_all(gguf.string() + ".inp"));
        std::vector<std::string> expected;
        std::istringstream out(read_all(gguf.string() + ".out"));
        for (std::string line; std::getline(out, line);) expected.push_back(line);
        REQUIRE_MESSAGE(cases.size() == expected.size(), name);
        REQUIRE(cases.size() > 30);
        int mismatches = 0;
        for (size_t i = 0; i < cases.size(); ++i) {
            const std::string file = temp_file(cases[i], name);
            auto r = run_command(
                kvrun_cmd("tokenize --ids --no-bos -m " + gguf.string() + " -f " + file));
            std::filesystem::remove(file);
            const bool ok = r.exit_code == 0 && r.out == ids_output_for(expected[i]);
            if (!ok) {
                ++mismatches;
                MESSAGE(name << " case " << i << ": expected '" << expected[i] << "', got '"
                             << r.out << "' (exit " << r.exit_code << ") " << r.err);
            }
            ++total;
        }
        CHECK_MESSAGE(mismatches == 0,
                      name << ": " << mismatches << " of " << cases.size() << " cases differ");
    }
    CHECK(total >= 9 * 40);
}

TEST_CASE("run streams the greedy continuation from stdin") {
    auto model = shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    auto r = run_command(kvrun_cmd("run -m " + model.string() + " -n 48 --temp 0"),
                         "Once upon a time\n");
    CHECK(r.exit_code == 0);
    CHECK_MESSAGE(
        r.out.rfind(", there was a little girl named Lily. She loved to play outside in the park",
                    0) == 0,
        r.out);
    auto p = run_command(
        kvrun_cmd("run -m " + model.string() + " -n 48 --temp 0 --stats -p 'Once upon a time'"));
    CHECK(p.out == r.out);
    CHECK(p.err.find("prompt tokens") != std::string::npos);
    CHECK(p.err.find("KV blocks used") != std::string::npos);
    CHECK(p.err.find("tokens/s") != std::string::npos);
}

TEST_CASE("run: same seed, same output; different seed, different output") {
    auto model = shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    std::string base =
        kvrun_cmd("run -m " + model.string() + " -n 32 --temp 1 -p 'Once upon a time'");
    auto a = run_command(base + " -s 7"), b = run_command(base + " -s 7"),
         c = run_command(base + " -s 8");
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
    check_one_clear_error(run_command(kvrun_cmd("run" + m + " --kv-type q3 -p hi")), "q3");
    check_one_clear_error(run_command(kvrun_cmd("run" + m + " --kv-block-size 0 -p hi")),
                          "kv-block-size");
    check_one_clear_error(run_command(kvrun_cmd("run" + m + " --device tpu -p hi")), "tpu");
    check_one_clear_error(run_command(kvrun_cmd("run" + m), "\xff\xfe bad utf8"), "UTF-8");
    auto vocab = shared_path("vocab/ggml-vocab-gpt-2.gguf");
    check_one_line_with_hint(run_command(kvrun_cmd("run -m " + vocab.string() + " -p hi")),
                             "unsupported architecture");
    check_one_line_with_hint(
        run_command(kvrun_cmd("run" + m + " -c 4 -p 'Once upon a time there was'")),
        "but the context holds");
    check_one_line_with_hint(run_command(kvrun_cmd("run" + m + " --kv-memory 0.0001 -p hi")),
                             "KV budget");
    auto bert = shared_path("vocab/ggml-vocab-bert-bge.gguf");
    check_one_line_with_hint(run_command(kvrun_cmd("tokenize -m " + bert.string() + " -p hi")),
                             "unsupported tokenizer model");
    // Without a GPU (or without CUDA in this build) --device cuda is one line with a hint.
    auto cuda = run_command(kvrun_cmd("run" + m + " --device cuda -n 1 -p hi"));
    if (cuda.exit_code != 0) check_one_line_with_hint(cuda, "--device cuda");
    // --truncate keeps the end of a too-long prompt instead.
    auto t = run_command(
        kvrun_cmd("run" + m + " -c 8 --truncate -n 2 --temp 0 -p 'Once upon a time there was'"));
    CHECK(t.exit_code == 0);
    // A full context stops with a note naming --context-shift, which goes on instead.
    const std::string gen = "run" + m + " -c 32 -n 80 --temp 0 --ignore-eos --stats -p 'Once'";
    auto full = run_command(kvrun_cmd(gen));
    CHECK(full.exit_code == 0);
    CHECK(full.err.find("the context is full (hint: raise -c/--ctx, or --context-shift)") !=
          std::string::npos);
    auto shifted = run_command(kvrun_cmd(gen + " --context-shift --keep 1"));
    CHECK(shifted.exit_code == 0);
    CHECK(shifted.err.find("generated tokens  80 (stop: length)") != std::string::npos);
    CHECK(shifted.err.find("context shifts    ") != std::string::npos);
    CHECK(shifted.out.size() > full.out.size());
    CHECK(shifted.out.compare(0, full.out.size() - 1, full.out, 0, full.out.size() - 1) == 0);
    check_one_line_with_hint(run_command(kvrun_cmd(gen + " --context-shift --n-samples 2")),
                             "--context-shift runs one sample");
}

TEST_CASE("sampling flags out of range are rejected with one clear line") {
    const std::string readme = std::string(KVRUN_SOURCE_DIR) + "/README.md";  // parse-time error
    const std::vector<std::pair<std::string, std::string>> bad = {
        {"--top-k -3", "top-k must be >= 0 (got -3"},
        {"--top-p 2", "top-p must be between 0 and 1 (got 2"},
        {"--top-p -0.1", "top-p must be between 0 and 1"},
        {"--min-p -1", "min-p must be between 0 and 1 (got -1"},
        {"--min-p 1.5", "min-p must be between 0 and 1"},
        {"--temp -1", "temperature must be a finite number >= 0 (got -1"},
        {"--temp nan", "temperature"},
        {"--repeat-penalty 0", "repeat penalty must be a finite number > 0 (got 0"},
        {"--repeat-penalty -1", "repeat penalty"},
        {"--repeat-last-n -2", "repeat-last-n must be >= -1"},
        {"--frequency-penalty nan", "frequency penalty must be a finite number (got nan"},
        {"--presence-penalty inf", "presence penalty must be a finite number"},
        {"--top-k abc", "--top-k"},
        {"--dry-multiplier -1", "DRY multiplier must be a finite number >= 0 (got -1"},
        {"--dry-base 0.5", "DRY base must be a finite number >= 1 (got 0.5"},
        {"--dry-allowed-length 0", "DRY allowed length must be >= 1 (got 0"},
        {"--dry-penalty-last-n -2", "DRY penalty-last-n must be >= -1 (got -2"},
        {"--dry-sequence-breaker " + std::string(41, 'x'), "at most 40 bytes (got 41"},
        {"--top-nsigma nan", "top-n-sigma must be a finite number"},
        {"--typical 1.5", "typical-p must be between 0 and 1 (got 1.5"},
        {"--xtc-probability 2", "XTC probability must be between 0 and 1 (got 2"},
        {"--xtc-threshold -1", "XTC threshold must be between 0 and 1 (got -1"},
        {"--dynatemp-range -1", "dynamic temperature range must be a finite number >= 0"},
        {"--dynatemp-exp inf", "dynamic temperature exponent must be a finite number >= 0"},
        {"--mirostat 3", "mirostat must be 0 (off), 1 or 2 (got 3"},
        {"--mirostat-ent -1", "mirostat tau must be a finite number >= 0 (got -1"},
        {"--mirostat-lr nan", "mirostat eta must be a finite number >= 0"},
    };
    for (const auto& [flag, needle] : bad) {
        INFO(flag);
        auto r = run_command(kvrun_cmd("run -m " + readme + " -p hi " + flag));
        check_one_clear_error(r, needle);
        CHECK_MESSAGE(r.err.find(flag.substr(0, flag.find(' '))) != std::string::npos, r.err);
    }
    for (const char* cmd : {"batch -f " KVRUN_SOURCE_DIR "/README.md", "chat"})
        check_one_clear_error(
            run_command(kvrun_cmd(std::string(cmd) + " -m " + readme + " --top-p 2")),
            "top-p must be between 0 and 1");

    auto model = shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    // The edges of each range are fine.
    auto ok = run_command(kvrun_cmd("run -m " + model.string() +
                                    " -n 4 --temp 0 --top-k 0 --top-p 1 --min-p 0 --repeat-penalty"
                                    " 1 --repeat-last-n -1 -p 'Once upon a time'"));
    CHECK_MESSAGE(ok.exit_code == 0, ok.err);
    auto edges = run_command(kvrun_cmd("run -m " + model.string() +
                                       " -n 4 --temp 2 --top-p 0 --min-p 1 --repeat-penalty 0.5"
                                       " --repeat-last-n 0 -p 'Once upon a time'"));
    CHECK_MESSAGE(edges.exit_code == 0, edges.err);
    // JSONL requests follow the same rule, as an error object for that line.
    auto j = run_command(kvrun_cmd("run --jsonl -m " + model.string()),
                         "{\"prompt\": \"hi\", \"top_k\": -3}\n"
                         "{\"prompt\": \"hi\", \"min_p\": 2}\n"
                         "{\"prompt\": \"hi\", \"n_predict\": 2, \"temperature\": 0}\n");
    CHECK(j.exit_code == 0);
    const std::vector<nlohmann::json> lines = json_lines(j.out);
    REQUIRE(lines.size() == 3);
    CHECK(lines[0]["error"].get<std::string>().find("top-k must be >= 0 (got -3") !=
          std::string::npos);
    CHECK(lines[1]["error"].get<std::string>().find("min-p must be between 0 and 1") !=
          std::string::npos);
    CHECK(lines[2]["tokens"].size() == 2);

    // Frequency and presence penalties: the flags and the JSONL fields do the same thing.
    const std::string greedy =
        "run -m " + model.string() + " -n 40 --temp 0 --repeat-last-n -1 -p 'Once upon a time'";
    auto plain = run_command(kvrun_cmd(greedy));
    auto freq = run_command(kvrun_cmd(greedy + " --frequency-penalty 1.5"));
    auto pres = run_command(kvrun_cmd(greedy + " --presence-penalty 2"));
    REQUIRE(plain.exit_code == 0);
    REQUIRE(freq.exit_code == 0);
    REQUIRE(pres.exit_code == 0);
    CHECK(freq.out != plain.out);
    CHECK(pres.out != plain.out);
    auto pj = run_command(kvrun_cmd("run --jsonl -m " + model.string()),
                          "{\"prompt\": \"Once upon a time\", \"n_predict\": 40, "
                          "\"temperature\": 0, \"repeat_last_n\": -1, \"frequency_penalty\": 1.5}\n"
                          "{\"prompt\": \"Once upon a time\", \"n_predict\": 40, "
                          "\"temperature\": 0, \"repeat_last_n\": -1, \"presence_penalty\": 2}\n"
                          "{\"prompt\": \"hi\", \"presence_penalty\": \"high\"}\n");
    const std::vector<nlohmann::json> pl = json_lines(pj.out);
    REQUIRE(pl.size() == 3);
    CHECK(freq.out.find(pl[0]["text"].get<std::string>()) != std::string::npos);
    CHECK(pres.out.find(pl[1]["text"].get<std::string>()) != std::string::npos);
    CHECK(pl[2].contains("error"));
}

TEST_CASE("numeric flags out of range name the flag and the bound, not a float range") {
    const std::string readme = std::string(KVRUN_SOURCE_DIR) + "/README.md";  // parse-time error
    const std::vector<std::pair<std::string, std::string>> bad = {
        {"run -p hi -c -1", "--ctx: must be at least 0 (got -1)"},
        {"run -p hi -b 0", "--batch-size: must be at least 1 (got 0)"},
        {"run -p hi -t -2", "--threads: must be at least 0 (got -2)"},
        {"run -p hi --kv-memory -5", "--kv-memory: must be at least 0 (got -5)"},
        {"bench -p -5", "-p: '-5' is not a token count"},
        {"bench -n 8,-1", "-n: '-1' is not a token count"},
        {"bench -pg 5", "-pg: '5' is not PROMPT,GEN"},
        {"bench -r 0", "--repetitions: must be at least 1 (got 0)"},
        {"perplexity -f " + readme + " --chunks -2", "--chunks: must be at least -1 (got -2)"},
        {"chat --sink-tokens -1", "--sink-tokens: must be at least 0 (got -1)"},
    };
    for (const auto& [args, needle] : bad) {
        INFO(args);
        auto r = run_command(kvrun_cmd(args + " -m " + readme));
        check_one_clear_error(r, needle);
        CHECK(r.err.find("0.000000") == std::string::npos);
    }
    auto model = shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    // Depths are checked before any model work.
    check_one_clear_error(
        run_command(kvrun_cmd("bench -m " + model.string() + " -p 8 -n 0 --depth 0,-3")),
        "--depth: '-3' is not a token count");
    // llama-bench's lists: -p and -n take several counts, -d the depths, -pg a prompt-then-
    // generate test; -o jsonl writes one object per result.
    auto lists = run_command(kvrun_cmd("bench -m " + model.string() +
                                       " --device cpu -p 8,16 -n 4 -pg 8,4 -d 0,16 -r 1 -o jsonl"));
    CHECK_MESSAGE(lists.exit_code == 0, lists.err);
    const std::vector<nlohmann::json> rows = json_lines(lists.out);
    REQUIRE(rows.size() == 8);
    std::vector<std::string> tests;
    for (const auto& r : rows)
        tests.push_back(r["test"].get<std::string>() + "@" + std::to_string(r["depth"].get<int>()));
    CHECK(tests == std::vector<std::string>{"pp8@0", "pp16@0", "tg4@0", "pp8+tg4@0", "pp8@16",
                                            "pp16@16", "tg4@16", "pp8+tg4@16"});
    CHECK(rows[3]["tokens"] == 12);
    CHECK(rows[2]["bytes_per_token"].get<double>() > 0);
    CHECK(rows[0]["tokens_per_s"].get<double>() > 0);
    CHECK(rows[0]["model_params"] == 292800);  // llama-bench's size and params columns
    CHECK(rows[0]["model_bytes"].get<double>() > 1e6);
    // A completion cut short by a full context says so on stderr (exit 0, text kept).
    auto full = run_command(kvrun_cmd("run -m " + model.string() + " -c 8 -n 100 --temp 0 -p hi"));
    CHECK(full.exit_code == 0);
    CHECK_FALSE(full.out.empty());
    CHECK_MESSAGE(full.err.find("note: stopped after 5 of 100 tokens: the context is full") !=
                      std::string::npos,
                  full.err);
    // ... and says nothing when -n was reached.
    auto fits = run_command(kvrun_cmd("run -m " + model.string() + " -c 8 -n 3 --temp 0 -p hi"));
    CHECK(fits.exit_code == 0);
    CHECK(fits.err.empty());
}

TEST_CASE("run --jsonl answers each line; a malformed line yields an error object") {
    auto model = shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    std::string input =
        "{\"prompt\": \"Once upon a time\", \"n_predict\": 12, \"temperature\": 0}\n"
        "{this is not json\n"
        "{\"n_predict\": 3}\n"
        "{\"prompt\": \"Lily and Tom went to the park. They\", \"n_predict\": 6, \"temperature\": "
        "0}\n";
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

TEST_CASE(
    "run and batch follow --grammar / --grammar-file / JSON \"grammar\"; bad ones fail clearly") {
    auto model = shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    const std::string m = " -m " + model.string();
    const std::string words = R"(root ::= (" " [a-z]+){2,6} ".")";
    const std::regex words_re(R"(( [a-z]+){2,6}\.)");
    auto quoted = [](const std::string& s) { return "'" + s + "'"; };

    auto r = run_command(
        kvrun_cmd("run" + m + " -p 'Once upon a time' --temp 0 -n 60 --grammar " + quoted(words)));
    CHECK_MESSAGE(r.exit_code == 0, r.err);
    REQUIRE(!r.out.empty());
    const std::string text = r.out.substr(0, r.out.size() - 1);  // run ends with a newline
    CHECK_MESSAGE(std::regex_match(text, words_re), text);
    const std::string file = temp_file(words + "\n", "grammar");
    auto from_file = run_command(
        kvrun_cmd("run" + m + " -p 'Once upon a time' --temp 0 -n 60 --grammar-file " + file));
    CHECK(from_file.out == r.out);
    // Sampled, with several samples: every one follows it.
    auto sampled = run_command(kvrun_cmd("run" + m +
                                         " -p 'Lily' --temp 1 -s 9 -n 60 "
                                         "--n-samples 3 --grammar " +
                                         quoted(words)));
    CHECK_MESSAGE(sampled.exit_code == 0, sampled.err);
    std::istringstream lines(sampled.out);
    std::string line;
    int n_samples = 0;
    while (std::getline(lines, line)) {
        if (line.rfind("--- sample", 0) == 0) continue;
        ++n_samples;
        CHECK_MESSAGE(std::regex_match(line, words_re), line);
    }
    CHECK(n_samples == 3);

    // Bad grammars and flags: one line naming the problem.
    check_one_line_with_hint(
        run_command(kvrun_cmd("run" + m + " -p hi --grammar 'root ::= item'")),
        "--grammar: grammar: rule `item` is used but never defined at line 1, column 10");
    check_one_clear_error(
        run_command(
            kvrun_cmd("run" + m + " -p hi --grammar 'root ::= \"a\"' --grammar-file " + file)),
        "excludes");
    check_one_clear_error(
        run_command(kvrun_cmd("run" + m + " -p hi --grammar-file /nonexistent.gbnf")),
        "/nonexistent.gbnf");
    check_one_line_with_hint(
        run_command(kvrun_cmd("batch" + m + " -f " + file + " --grammar 'root ::= root \"x\"'")),
        "left-recursive");

    // JSONL: a per-request grammar, "" for none, and errors that stay on their line.
    const std::string input =
        "{\"prompt\": \"Once upon a time\", \"n_predict\": 60, \"temperature\": 0, "
        "\"grammar\": \"root ::= \\\" \\\" (\\\"yes\\\" | \\\"no\\\") \\\".\\\"\"}\n"
        "{\"prompt\": \"Once upon a time\", \"n_predict\": 5, \"temperature\": 0, "
        "\"grammar\": \"\"}\n"
        "{\"prompt\": \"hi\", \"grammar\": \"root ::= [\"}\n"
        "{\"prompt\": \"hi\", \"grammar\": 7}\n";
    auto j = run_command(kvrun_cmd("run --jsonl" + m + " --grammar " + quoted(words)), input);
    CHECK_MESSAGE(j.exit_code == 0, j.err);
    std::istringstream jin(j.out);
    std::vector<nlohmann::json> res;
    while (std::getline(jin, line)) res.push_back(nlohmann::json::parse(line));
    REQUIRE(res.size() == 4);
    CHECK(res[0]["stop"] == "eos");
    const std::string answer = res[0]["text"];
    CHECK_MESSAGE((answer == " yes." || answer == " no."), answer);
    CHECK(res[1]["text"].get<std::string>().rfind(", there was", 0) == 0);  // unconstrained
    CHECK(res[2]["error"].get<std::string>().find("'grammar': grammar: unterminated "
                                                  "character class") != std::string::npos);
    CHECK(res[3]["error"].get<std::string>().find("'grammar' must be a string") !=
          std::string::npos);

    // batch: --grammar applies to every prompt of the file.
    const std::string prompts = temp_file("Once upon a time\nLily and Tom\nThe dog\n", "prompts");
    auto b = run_command(
        kvrun_cmd("batch" + m + " -f " + prompts + " --temp 0 -n 60 --grammar " + quoted(words)));
    CHECK_MESSAGE(b.exit_code == 0, b.err);
    std::istringstream bin(b.out);
    int n_lines = 0;
    while (std::getline(bin, line)) {
        ++n_lines;
        const std::string t = nlohmann::json::parse(line)["text"];
        CHECK_MESSAGE(std::regex_match(t, words_re), t);
    }
    CHECK(n_lines == 3);
}

TEST_CASE(
    "--json-schema / --json-schema-file / JSON \"json_schema\": output is JSON valid for it") {
    auto model = shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    const std::string m = " -m " + model.string();
    const std::string schema =
        R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},)"
        R"( "age": {"type": "integer", "minimum": 1, "maximum": 99},)"
        R"( "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 3}},)"
        R"( "required": ["name", "age", "pets"]})";
    auto check_record = [](const std::string& text) {
        CAPTURE(text);
        auto j = nlohmann::ordered_json::parse(text);  // throws (fails the test) if not JSON
        REQUIRE(j.is_object());
        CHECK(j.size() == 3);
        std::vector<std::string> keys;
        for (auto it = j.begin(); it != j.end(); ++it) keys.push_back(it.key());
        CHECK(keys == std::vector<std::string>{"name", "age", "pets"});  // the schema's order
        CHECK(j["name"].get<std::string>().size() <= 12);
        CHECK(j["age"].get<int>() >= 1);
        CHECK(j["age"].get<int>() <= 99);
        CHECK(j["pets"].size() <= 3);
        for (const auto& p : j["pets"]) CHECK((p == "cat" || p == "dog"));
    };
    for (const char* seed : {"1", "2", "3"}) {
        auto r = run_command(kvrun_cmd("run" + m + " -p 'Once upon a time' -n 150 --temp 0.9 -s " +
                                       seed + " --json-schema '" + schema + "'"));
        CHECK_MESSAGE(r.exit_code == 0, r.err);
        check_record(r.out);
    }
    const std::string file = temp_file(schema, "schema");
    auto from_file = run_command(
        kvrun_cmd("run" + m + " -p 'Once upon a time' -n 150 --temp 0 --json-schema-file " + file));
    CHECK_MESSAGE(from_file.exit_code == 0, from_file.err);
    check_record(from_file.out);

    // JSONL: the schema as an object (its member order kept) or as text; errors per line.
    const std::string input =
        "{\"prompt\": \"Lily\", \"temperature\": 0, \"n_predict\": 150, \"json_schema\": " +
        schema + "}\n" +
        "{\"prompt\": \"Tom\", \"temperature\": 0, \"n_predict\": 150, \"json_schema\": " +
        nlohmann::json(schema).dump() + "}\n" +
        "{\"prompt\": \"hi\", \"json_schema\": {\"type\": \"string\", \"pattern\": \"a+\"}}\n"
        "{\"prompt\": \"hi\", \"json_schema\": {}, \"grammar\": \"root ::= \\\"a\\\"\"}\n"
        "{\"prompt\": \"hi\", \"json_schema\": 3}\n";
    auto j = run_command(kvrun_cmd("run --jsonl" + m), input);
    CHECK_MESSAGE(j.exit_code == 0, j.err);
    std::istringstream jin(j.out);
    std::vector<nlohmann::json> res;
    std::string line;
    while (std::getline(jin, line)) res.push_back(nlohmann::json::parse(line));
    REQUIRE(res.size() == 5);
    for (int i : {0, 1}) {
        CHECK(res[i]["stop"] == "eos");
        check_record(res[i]["text"]);
    }
    CHECK(res[2]["error"] ==
          "'json_schema': json schema #/pattern: the \"pattern\" keyword is not supported");
    CHECK(res[3]["error"] == "give 'grammar' or 'json_schema', not both");
    CHECK(res[4]["error"].get<std::string>().find("'json_schema' must be a JSON Schema") == 0);

    // Bad schemas and flag clashes: one clear line.
    check_one_clear_error(run_command(kvrun_cmd("run" + m + " -p hi -j '{\"type\": 5}'")),
                          "--json-schema: json schema #/type");
    check_one_clear_error(run_command(kvrun_cmd("run" + m + " -p hi -j '{oops'")),
                          "--json-schema: the JSON schema is not valid JSON");
    check_one_clear_error(
        run_command(kvrun_cmd("run" + m + " -p hi -j '{}' --grammar 'root ::= \"a\"'")),
        "excludes");
}

TEST_CASE("--n-probs / JSON \"n_probs\": each token's logprob and the most likely alternatives") {
    auto model = shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    const std::string m = " -m " + model.string();
    auto r = run_command(kvrun_cmd("run" + m + " -p 'Once upon a time' --temp 0 -n 4 --n-probs 3"));
    CHECK_MESSAGE(r.exit_code == 0, r.err);
    CHECK(r.out == ", there was a\n");  // stdout keeps only the text
    CHECK(r.err.find("--- logprobs") != std::string::npos);
    CHECK(r.err.find("\",\"  -0.0317  96.9% | \",\" 96.9% \" there\" 2.9%") != std::string::npos);

    const std::string input =
        "{\"prompt\": \"Once upon a time\", \"n_predict\": 3, \"temperature\": 0, \"n_probs\": 2}\n"
        "{\"prompt\": \"Once upon a time\", \"n_predict\": 3, \"temperature\": 0}\n"
        "{\"prompt\": \"hi\", \"n_probs\": 101}\n";
    auto j = run_command(kvrun_cmd("run --jsonl" + m), input);
    std::istringstream jin(j.out);
    std::vector<nlohmann::json> res;
    std::string line;
    while (std::getline(jin, line)) res.push_back(nlohmann::json::parse(line));
    REQUIRE(res.size() == 3);
    REQUIRE(res[0]["logprobs"].size() == 3);
    const auto& first = res[0]["logprobs"][0];
    CHECK(first["id"] == res[0]["tokens"][0]);
    CHECK(first["token"] == ",");
    CHECK(first["bytes"] == nlohmann::json({44}));
    CHECK(first["logprob"].get<double>() == doctest::Approx(-0.03175).epsilon(1e-3));
    REQUIRE(first["top_logprobs"].size() == 2);
    CHECK(first["top_logprobs"][1]["token"] == " there");
    CHECK_FALSE(res[1].contains("logprobs"));  // only when asked
    CHECK(res[2]["error"] == "'n_probs' must be between 0 and 100 (got 101)");
    check_one_clear_error(run_command(kvrun_cmd("run" + m + " -p hi --n-probs 101")), "--n-probs");

    const std::string prompts = temp_file("Once upon a time\nThe dog\n", "nprobs");
    auto b = run_command(kvrun_cmd("batch" + m + " -f " + prompts + " --temp 0 -n 3 --n-probs 1"));
    CHECK_MESSAGE(b.exit_code == 0, b.err);
    std::istringstream bin(b.out);
    int n = 0;
    while (std::getline(bin, line)) {
        auto x = nlohmann::json::parse(line);
        CHECK(x["logprobs"].size() == x["tokens"].size());
        CHECK(x["logprobs"][0]["top_logprobs"].size() == 1);
        ++n;
    }
    CHECK(n == 2);
}

TEST_CASE("-l/--logit-bias and JSON \"logit_bias\" (object or pairs) change the output") {
    auto model = shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    const std::string m = " -m " + model.string();
    const std::string base = "run" + m + " -p 'Once upon a time' --temp 0 -n 4";
    CHECK(run_command(kvrun_cmd(base)).out == ", there was a\n");
    // 432 is ",", 383 is " there".
    auto r = run_command(kvrun_cmd(base + " -l 432-inf --logit-bias 383+5"));
    CHECK_MESSAGE(r.exit_code == 0, r.err);
    CHECK(r.out == " there there was a\n");
    check_one_clear_error(run_command(kvrun_cmd(base + " -l 432")), "bad logit bias '432'");
    check_one_clear_error(run_command(kvrun_cmd(base + " -l 432+inf")), "--logit-bias");
    check_one_clear_error(run_command(kvrun_cmd(base + " -l 99999+1")),
                          "logit bias: token id 99999 is outside the vocabulary (0..511)");

    const std::string input =
        "{\"prompt\": \"Once upon a time\", \"n_predict\": 4, \"temperature\": 0, "
        "\"logit_bias\": {\"432\": -1000, \"383\": 5}}\n"
        "{\"prompt\": \"Once upon a time\", \"n_predict\": 4, \"temperature\": 0, "
        "\"logit_bias\": [[432, false], [383, 5]]}\n"
        "{\"prompt\": \"Once upon a time\", \"n_predict\": 4, \"temperature\": 0, "
        "\"logit_bias\": []}\n"
        "{\"prompt\": \"hi\", \"logit_bias\": {\"abc\": 1}}\n"
        "{\"prompt\": \"hi\", \"logit_bias\": [[1, \"x\"]]}\n"
        "{\"prompt\": \"hi\", \"logit_bias\": {\"600\": 1}}\n";
    auto j = run_command(kvrun_cmd("run --jsonl" + m + " -l 410+100"), input);
    std::istringstream jin(j.out);
    std::vector<nlohmann::json> res;
    std::string line;
    while (std::getline(jin, line)) res.push_back(nlohmann::json::parse(line));
    REQUIRE(res.size() == 6);
    CHECK(res[0]["text"] == " there there was a");  // the request's biases replace -l's
    CHECK(res[1]["text"] == " there there was a");
    CHECK(res[2]["text"] == ", there was a");  // [] clears the command line's
    CHECK(res[3]["error"] == "'logit_bias': 'abc' is not a token id");
    CHECK(res[4]["error"].get<std::string>().find("'logit_bias' must be") == 0);
    CHECK(res[5]["error"] == "logit bias: token id 600 is outside the vocabulary (0..511)");
}

TEST_CASE("--special / -sp shows generated control tokens; -np is --parallel") {
    auto model = shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    const std::string m = " -m " + model.string();
    // Token 1 is the control token <s>: forced by a bias, it is invisible unless --special.
    const std::string base = "run" + m + " -p 'Once' --temp 0 -n 3 -l 1+100";
    CHECK(run_command(kvrun_cmd(base)).out == "\n");
    CHECK(run_command(kvrun_cmd(base + " --special")).out == "<s><s><s>\n");
    CHECK(run_command(kvrun_cmd(base + " -sp --n-samples 2")).out.find("<s><s><s>\n") !=
          std::string::npos);
    const std::string req = "{\"prompt\": \"Once\", \"n_predict\": 2}\n";
    auto j = run_command(kvrun_cmd("run --jsonl -sp -l 1+100" + m), req);
    CHECK(nlohmann::json::parse(j.out)["text"] == "<s><s>");
    kvrun::test::TempDir dir;
    const std::string prompts = dir.file("p.txt");
    std::ofstream(prompts) << "Once\nThe dog\n";
    auto b = run_command(kvrun_cmd("batch -f " + prompts + m + " -n 2 -l 1+100 -np 2 --special"));
    CHECK_MESSAGE(b.exit_code == 0, b.err);
    CHECK(b.out.find("\"text\":\"<s><s>\"") != std::string::npos);
    b = run_command(kvrun_cmd("batch -f " + prompts + m + " -n 2 -l 1+100"));
    CHECK(b.out.find("\"text\":\"\"") != std::string::npos);
}

TEST_CASE("DRY, XTC, typical, top-n-sigma, dynamic temperature, mirostat: flags and JSON agree") {
    auto model = shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    const std::string m = " -m " + model.string();
    const std::string base = "run" + m + " -p 'Once upon a time' --temp 0 -n 250";
    const auto plain = run_command(kvrun_cmd(base));
    const auto dry = run_command(kvrun_cmd(base + " --dry-multiplier 0.8"));
    CHECK_MESSAGE(dry.exit_code == 0, dry.err);
    CHECK(dry.out != plain.out);  // the greedy story repeats "was sad and didn't know what to do"
    auto count = [](const std::string& text) {
        int n = 0;
        for (size_t at = 0;
             (at = text.find("was sad and didn't know what to do", at)) != std::string::npos; ++at)
            ++n;
        return n;
    };
    CHECK(count(plain.out) == 2);
    CHECK(count(dry.out) == 1);
    // The defaults spelled out, with escapes, give the same; no breakers give another text.
    const auto spelled =
        run_command(kvrun_cmd(base + " --dry-multiplier 0.8 --dry-sequence-breaker '\\n' "
                                     "--dry-sequence-breaker : --dry-sequence-breaker '\"' "
                                     "--dry-sequence-breaker '*'"));
    CHECK(spelled.out == dry.out);
    const auto none =
        run_command(kvrun_cmd(base + " --dry-multiplier 0.8 --dry-sequence-breaker none"));
    CHECK(none.out != dry.out);

    const std::string req =
        "{\"prompt\": \"Once upon a time\", \"n_predict\": 250, "
        "\"temperature\": 0";
    const std::string input = req + ", \"dry_multiplier\": 0.8}\n" + req +
                              ", \"dry_multiplier\": 0.8, \"dry_sequence_breakers\": []}\n" + req +
                              "}\n" + "{\"prompt\": \"hi\", \"typical_p\": 2}\n" +
                              "{\"prompt\": \"hi\", \"dry_sequence_breakers\": \"abc\"}\n" +
                              // mirostat with tau 0 keeps only the best token: greedy
                              "{\"prompt\": \"Once upon a time\", \"n_predict\": 250, "
                              "\"temperature\": 1, \"mirostat\": 2, \"mirostat_tau\": 0}\n";
    auto j = run_command(kvrun_cmd("run --jsonl" + m), input);
    std::istringstream jin(j.out);
    std::vector<nlohmann::json> res;
    std::string line;
    while (std::getline(jin, line)) res.push_back(nlohmann::json::parse(line));
    REQUIRE(res.size() == 6);
    CHECK(res[0]["text"].get<std::string>() + "\n" == dry.out);
    CHECK(res[1]["text"].get<std::string>() + "\n" == none.out);
    CHECK(res[2]["text"].get<std::string>() + "\n" == plain.out);
    CHECK(res[3]["error"] == "typical-p must be between 0 and 1 (got 2; 1 disables it)");
    CHECK(res[4].contains("error"));
    CHECK(res[5]["text"].get<std::string>() + "\n" == plain.out);

    // Sampled with every extra at once: a seed gives one text, the flags change it.
    const std::string sampled = "run" + m + " -p 'Once upon a time' -n 60 --temp 1 -s 4";
    const std::string extras =
        " --xtc-probability 0.5 --xtc-threshold 0.1 --typical 0.9 --top-nsigma 2 "
        "--dynatemp-range 0.5 --dynatemp-exp 2 --dry-multiplier 1";
    const auto a = run_command(kvrun_cmd(sampled + extras));
    const auto b = run_command(kvrun_cmd(sampled + extras));
    CHECK_MESSAGE(a.exit_code == 0, a.err);
    CHECK(a.out == b.out);
    CHECK(a.out != run_command(kvrun_cmd(sampled)).out);
    // batch takes the same flags.
    auto bt = run_command(kvrun_cmd("batch" + m +
                                    " -f /dev/stdin --format txt -n 250 --temp 0 "
                                    "--dry-multiplier 0.8"),
                          "Once upon a time\n");
    CHECK_MESSAGE(bt.exit_code == 0, bt.err);
    REQUIRE(!bt.out.empty());
    CHECK(nlohmann::json::parse(bt.out)["text"].get<std::string>() + "\n" == dry.out);
}

TEST_CASE("llama.cpp's spellings: -ngl, --ctx-size, -ctk/-ctv, -md/--draft-max, -s -1, -e") {
    auto model = shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    const std::string m = " -m " + model.string();
    const std::string base = "run" + m + " -p 'Once upon a time' -n 12 --temp 0";
    const auto plain = run_command(kvrun_cmd(base));
    auto r = run_command(kvrun_cmd(base + " -ngl 0 --ctx-size 128 -ctk q8_0 -ctv q4_0 --stats"));
    CHECK_MESSAGE(r.exit_code == 0, r.err);
    CHECK(r.err.find("(cpu)") != std::string::npos);
    CHECK(r.err.find("K q8, V q4") != std::string::npos);
    CHECK(r.err.find("8 blocks of 16 tokens") != std::string::npos);  // 128 tokens
    const auto draft = shared_path("models/stories260K-Q8_0.gguf");
    auto d = run_command(
        kvrun_cmd(base + " -md " + draft.string() + " --draft-max 4 --draft-p-min 0.5 --stats"));
    CHECK_MESSAGE(d.exit_code == 0, d.err);
    CHECK(d.out == plain.out);
    CHECK(d.err.find("speculative with") != std::string::npos);
    // -e/--escape: \n in the prompt is a newline (without it, a backslash and an n).
    const std::string esc = "run" + m + " -p 'Hello\\nWorld' --echo -n 2 --temp 0";
    CHECK(run_command(kvrun_cmd(esc + " -e")).out.rfind("Hello\nWorld", 0) == 0);
    CHECK(run_command(kvrun_cmd(esc)).out.rfind("Hello\\nWorld", 0) == 0);
    // -s -1: a random seed each time.
    std::set<std::string> outs;
    for (int i = 0; i < 3; ++i)
        outs.insert(
            run_command(kvrun_cmd("run" + m + " -p 'Once upon a time' -n 40 --temp 1.5 -s -1"))
                .out);
    CHECK(outs.size() >= 2);
    const std::string input =
        "{\"prompt\": \"Once upon a time\", \"n_predict\": 4, \"seed\": -1}\n"
        "{\"prompt\": \"hi\", \"seed\": -5}\n";
    auto j = run_command(kvrun_cmd("run --jsonl" + m), input);
    std::istringstream jin(j.out);
    std::string line;
    std::vector<nlohmann::json> res;
    while (std::getline(jin, line)) res.push_back(nlohmann::json::parse(line));
    REQUIRE(res.size() == 2);
    CHECK(res[0].contains("text"));
    CHECK(res[1]["error"] == "'seed' must be a count >= 0 or -1 for a random one (got -5)");

    // -tb, -ub, --no-mmap, --mlock, -fa: the same tokens (-ub 3 prefills in passes of 3 tokens,
    // -tb 2 uses two threads for them and -t 1 one for each decode step).
    for (const char* flags : {" -t 1 -tb 2", " -ub 3", " -b 8 -ub 16", " --no-mmap", " --mlock",
                              " --no-mmap --mlock", " -fa", " -fa on", " --flash-attn auto"}) {
        CAPTURE(flags);
        auto x = run_command(kvrun_cmd(base + flags));
        CHECK_MESSAGE(x.exit_code == 0, x.err);
        CHECK(x.out == plain.out);
    }
    // --verbose-prompt: the prompt's tokens on stderr; --no-display-prompt (the default) wins
    // over --echo.
    auto vp = run_command(kvrun_cmd(base + " --verbose-prompt --echo --no-display-prompt"));
    CHECK(vp.out == plain.out);
    CHECK(vp.err.find("prompt: 'Once upon a time'\nnumber of tokens in prompt = 5\n       1 -> "
                      "'<s>'\n     403 -> ' Once'\n") != std::string::npos);
    auto fa_off = run_command(kvrun_cmd(base + " -fa off"));
    CHECK(fa_off.out == plain.out);
    CHECK(fa_off.err.find("-fa off changes nothing") != std::string::npos);
    check_bad_run_flags({{"-ub 0", "--ubatch-size"},
                         {"-tb -1", "--threads-batch"},
                         {"-fa maybe", "--flash-attn"},
                         {"--draft-p-min 2", "--draft-p-min"}});
}

TEST_CASE("RoPE flags: --rope-scale, --rope-freq-base, --rope-scaling, --yarn-*") {
    const std::vector<std::pair<std::string, std::string>> bad = {
        {"--rope-scaling dynamic", "--rope-scaling"},
        {"--rope-scale 0", "--rope-scale"},
        {"--rope-freq-base -1", "--rope-freq-base"},
        {"--rope-freq-scale nan", "--rope-freq-scale"},
        {"--yarn-orig-ctx 0", "--yarn-orig-ctx: must be at least 1 (got 0)"},
        {"--yarn-beta-fast 0", "--yarn-beta-fast"},
    };
    check_bad_run_flags(bad);
    auto model = shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    const std::string base =
        "run -m " + model.string() + " -p 'Once upon a time, there was a' -n 40 --temp 0";
    const auto plain = run_command(kvrun_cmd(base));
    REQUIRE(plain.exit_code == 0);
    // The model's own values restate nothing.
    CHECK(run_command(kvrun_cmd(base + " --rope-freq-base 10000 --rope-scale 1")).out == plain.out);
    const auto x4 = run_command(kvrun_cmd(base + " --rope-scale 4"));
    CHECK_MESSAGE(x4.exit_code == 0, x4.err);
    CHECK(x4.out != plain.out);
    CHECK(run_command(kvrun_cmd(base + " --rope-freq-scale 0.25 --rope-scaling linear")).out ==
          x4.out);
    const auto yarn =
        run_command(kvrun_cmd(base + " --rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 128"));
    CHECK_MESSAGE(yarn.exit_code == 0, yarn.err);
    CHECK(yarn.out != x4.out);
    CHECK(yarn.out != plain.out);
    // The flags reach every model-running mode.
    auto chat = run_command(kvrun_cmd("chat -m " + model.string() +
                                      " --temp 0 -n 8 --rope-scale 2 --chat-template plain"),
                            "hi\n");
    CHECK_MESSAGE(chat.exit_code == 0, chat.err);
    auto info = run_command(kvrun_cmd("info --json -m " + model.string()));
    CHECK(nlohmann::json::parse(info.out)["hyperparameters"]["rope_scaling"] == "none");
}

TEST_CASE("--prompt-cache: a second run reuses the prompt's blocks and prints the same text") {
    check_bad_run_flags({{"--prompt-cache-ro", "--prompt-cache-ro requires --prompt-cache"}});
    auto model = shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    kvrun::test::TempDir dir;
    const std::string cache = dir.file("prompt.cache");
    const std::string base = "run -m " + model.string() +
                             " -p 'Once upon a time, there was a little girl named Lily. She "
                             "loved to play outside in the park with her friends.' -n 20 "
                             "--temp 0 --stats --prompt-cache " +
                             cache;
    const auto first = run_command(kvrun_cmd(base));
    REQUIRE_MESSAGE(first.exit_code == 0, first.err);
    CHECK(first.err.find("prompt cache      " + cache + ": new, 2 blocks saved") !=
          std::string::npos);
    const auto second = run_command(kvrun_cmd(base));
    REQUIRE_MESSAGE(second.exit_code == 0, second.err);
    CHECK(second.out == first.out);
    CHECK(second.err.find("2 of 2 blocks loaded (32 tokens)") != std::string::npos);
    CHECK(second.err.find("32 from the prefix cache") != std::string::npos);
    // -ro: used, never written; another KV format: a note, the run goes on.
    const auto ro = run_command(kvrun_cmd(base + " --prompt-cache-ro --kv-type q8"));
    CHECK(ro.exit_code == 0);
    CHECK(ro.err.find("kvrun: note: prompt cache " + cache +
                      " is not used: it was made with another KV cache") != std::string::npos);
    CHECK(run_command(kvrun_cmd(base)).err.find("2 of 2 blocks loaded") != std::string::npos);
    // --prompt-cache-all keeps the generated tokens' blocks too.
    const auto all = run_command(kvrun_cmd(base + " --prompt-cache-all"));
    CHECK(all.err.find("3 blocks saved") != std::string::npos);
    // A corrupt file: one clear line, exit 1.
    std::string bytes = read_all(cache);
    bytes[bytes.size() / 2] ^= 1;
    const std::string bad = dir.write("bad.cache", bytes);
    check_one_clear_error(
        run_command(kvrun_cmd("run -m " + model.string() + " -p hi -n 2 --prompt-cache " + bad)),
        "prompt cache is corrupt (checksum mismatch)");
    // batch and run --jsonl take it too.
    const std::string prompts = dir.write(
        "p.txt",
        "Once upon a time, there was a little girl named Lily. She loved to play outside\n");
    const std::string b = "batch -m " + model.string() + " -f " + prompts +
                          " -n 4 --temp 0 --no-progress --prompt-cache " + dir.file("b.cache");
    CHECK(run_command(kvrun_cmd(b)).err.find("new, 1 blocks saved") != std::string::npos);
    CHECK(run_command(kvrun_cmd(b)).err.find("1 of 1 blocks loaded") != std::string::npos);
    const auto j = run_command(
        kvrun_cmd("run --jsonl --stats -m " + model.string() + " --prompt-cache " + cache),
        "{\"prompt\": \"Once upon a time, there was a little girl named Lily. She loved to "
        "play outside in the park with her friends.\", \"n_predict\": 2}\n");
    CHECK(j.err.find("blocks loaded") != std::string::npos);
}

TEST_CASE("--override-kv KEY=TYPE:VALUE replaces metadata before the model loads") {
    const std::vector<std::pair<std::string, std::string>> bad = {
        {"--override-kv foo", "bad override 'foo' (expected KEY=TYPE:VALUE"},
        {"--override-kv =int:1", "bad override '=int:1'"},
        {"--override-kv a=long:1", "bad override 'a=long:1'"},
        {"--override-kv a=int:1.5", "'1.5' is not an integer"},
        {"--override-kv a=float:nan", "'nan' is not a finite number"},
        {"--override-kv a=bool:yes", "a bool is true or false"},
    };
    check_bad_run_flags(bad);
    auto model = shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    const std::string m = " -m " + model.string();
    // No BOS: the prompt is one token shorter.
    auto ids = [&](const std::string& extra) {
        auto r = run_command(kvrun_cmd("run --jsonl" + m + extra),
                             "{\"prompt\": \"Once upon a time\", \"n_predict\": 1}\n");
        REQUIRE_MESSAGE(r.exit_code == 0, r.err);
        return nlohmann::json::parse(r.out)["prompt_tokens"].size();
    };
    CHECK(ids(" --override-kv tokenizer.ggml.add_bos_token=bool:false") + 1 == ids(""));
    // A RoPE base in the metadata equals the flag, and differs from the model's own.
    const std::string base = "run" + m + " -p 'Once upon a time, there was a' -n 30 --temp 0";
    const auto flag = run_command(kvrun_cmd(base + " --rope-freq-base 300"));
    const auto kv = run_command(kvrun_cmd(base + " --override-kv llama.rope.freq_base=float:300"));
    CHECK_MESSAGE(kv.exit_code == 0, kv.err);
    CHECK(kv.out == flag.out);
    CHECK(kv.out != run_command(kvrun_cmd(base)).out);
    // An override the loader refuses is reported like a bad file.
    check_one_clear_error(run_command(kvrun_cmd(base + " --override-kv llama.block_count=int:-3")),
                          "llama.block_count");
}

TEST_CASE("--samplers / --sampling-seq and JSON \"samplers\": llama.cpp's filter order") {
    check_bad_run_flags({{"--samplers top_z", "unknown sampler 'top_z'"},
                         {"--sampling-seq kk", "sampler 'top_k' is listed twice"}});
    auto model = shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    const std::string base =
        "run -m " + model.string() + " -p 'Once upon a time' -n 40 --temp 3 --top-p 0.5 -s 5";
    const auto plain = run_command(kvrun_cmd(base));
    const auto flag = run_command(kvrun_cmd(base + " --samplers 'temperature;top_p'"));
    const auto seq = run_command(kvrun_cmd(base + " --sampling-seq tp"));
    CHECK_MESSAGE(flag.exit_code == 0, flag.err);
    CHECK(flag.out == seq.out);
    CHECK(flag.out != plain.out);  // top-p on the tempered distribution keeps more tokens
    // The default order spelled out changes nothing.
    CHECK(run_command(kvrun_cmd(base + " --sampling-seq edskypmxt")).out == plain.out);
    auto j = run_command(kvrun_cmd("run --jsonl -m " + model.string()),
                         "{\"prompt\": \"Once upon a time\", \"n_predict\": 40, \"temperature\": "
                         "3, \"top_p\": 0.5, \"seed\": 5, \"samplers\": [\"temperature\", "
                         "\"top_p\"]}\n"
                         "{\"prompt\": \"hi\", \"samplers\": \"top_k;nope\"}\n");
    const std::vector<nlohmann::json> lines = json_lines(j.out);
    REQUIRE(lines.size() == 2);
    CHECK(flag.out.find(lines[0]["text"].get<std::string>()) != std::string::npos);
    CHECK(lines[1]["error"].get<std::string>().find("unknown sampler 'nope'") != std::string::npos);
}

TEST_CASE("run --jsonl and batch report the stop string that ended a text (stopping_word)") {
    auto model = shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    const std::string req =
        "{\"prompt\": \"Once upon a time\", \"n_predict\": 40, \"temperature\": 0, "
        "\"stop\": [\"zzz\", \"Lily\", \"girl\"]}\n"
        "{\"prompt\": \"Once upon a time\", \"n_predict\": 3, \"temperature\": 0, "
        "\"stop\": [\"zzz\"]}\n";
    auto r = run_command(kvrun_cmd("run --jsonl -m " + model.string()), req);
    CHECK(r.exit_code == 0);
    const std::vector<nlohmann::json> lines = json_lines(r.out);
    REQUIRE(lines.size() == 2);
    CHECK(lines[0]["stop"] == "stop");
    CHECK(lines[0]["stopping_word"] == "girl");  // before "Lily" in the text
    CHECK(lines[0]["text"].get<std::string>().ends_with("girl"));
    CHECK_FALSE(lines[1].contains("stopping_word"));
    const std::string in = temp_file(req, "stops.jsonl");
    auto b = run_command(kvrun_cmd("batch --format jsonl -m " + model.string() + " -f " + in));
    CHECK(json_lines(b.out)[0]["stopping_word"] == "girl");
}
