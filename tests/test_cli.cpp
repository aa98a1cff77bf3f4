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

#include "arch_test_util.h"
#include "cli_test_util.h"
#include "gguf.h"
#include "gguf_writer.h"
#include "synthetic_model.h"
#include "test_util.h"

using kvrun::test::run_command;
using kvrun::test::shared_path;

using namespace kvrun::test::cli;

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

TEST_CASE("info counts the matrices with a per-tensor scale (NAME.scale)") {
    kvrun::test::TempDir dir;
    kvrun::SyntheticModelConfig c = kvrun::synthetic_preset("tiny");
    c.n_layer = 1;
    const std::string plain = dir.file("plain.gguf"), scaled = dir.file("scaled.gguf");
    kvrun::synthetic_model_write(c, plain);
    const std::vector<uint8_t> bytes =
        kvrun::arch_test::gguf_with_scales(kvrun::GgufFile::open(plain));
    std::ofstream(scaled, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    for (const auto& [path, n] : {std::pair{plain, 0}, std::pair{scaled, 8}}) {
        CAPTURE(path);
        const auto r = run_command(kvrun_cmd("info --json -m " + path));
        REQUIRE(r.exit_code == 0);
        CHECK(nlohmann::json::parse(r.out)["scaled_matrices"] == n);  // 7 in the layer, output
        const auto table = run_command(kvrun_cmd("info -m " + path));
        CHECK((table.out.find("8 matrices carry a NAME.scale factor") != std::string::npos) ==
              (n > 0));
    }
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
    CHECK(p.out.find("chat features   tool calls generic; no reasoning blocks") !=
          std::string::npos);
    // The same vocabulary with a template in the Hermes tool syntax that thinks.
    kvrun::GgufFile phi = kvrun::GgufFile::open(phi3.string());
    kvrun::GgufWriter w;
    for (const auto& [key, value] : phi.metadata()) w.set_value(key, value);
    w.set_string("tokenizer.chat_template",
                 "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                 "{% endfor %}<|im_start|>assistant\n<think>\n{# <tool_call> #}");
    kvrun::test::TempDir dir;
    const std::string hermes = dir.file("hermes.gguf");
    w.write_file(hermes);
    auto h = run_command(kvrun_cmd("info -m " + hermes));
    // (It only names the syntax in a comment: it cannot show the tools, so they go generic.)
    CHECK_MESSAGE(h.out.find("chat features   tool calls hermes (not rendered here: the generic "
                             "JSON format instead); thinks") != std::string::npos,
                  h.out);
    const auto hj = nlohmann::json::parse(run_command(kvrun_cmd("info --json -m " + hermes)).out);
    CHECK(hj["vocab"]["tool_calls"] == "hermes");
    CHECK(hj["vocab"]["thinking"] == true);
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

// test_tokenizer checks every case of these suites in process; here the binary's path (a
// file's bytes, --ids, --no-bos) runs on every 6th case and the last of each suite: each
// process start loads the CUDA libraries in a CUDA build (~0.4 s), and one per case (~400)
// took five minutes of CI.
TEST_CASE("tokenize --ids reproduces llama.cpp vocabulary cases through the binary") {
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
            if (i % 6 != 0 && i + 1 != cases.size()) continue;
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
    CHECK(total >= 9 * 7);
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
        "{\"prompt\": \"hi\", \"json_schema\": {\"type\": \"string\", \"multipleOf\": 2}}\n"
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
          "'json_schema': json schema #/multipleOf: the \"multipleOf\" keyword is not supported");
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
