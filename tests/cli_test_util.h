// Helpers of the end-to-end tests of the kvrun executable (test_cli, test_cli_flags).
#pragma once

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "test_util.h"

namespace kvrun::test::cli {

using kvrun::test::run_command;
using kvrun::test::shared_path;

inline std::string kvrun_cmd(const std::string& args) {
    return kvrun::test::kvrun_binary() + " " + args;
}

// Bad input must give exactly one line on stderr, "kvrun: error: <message>" with any hint on
// the same line, nothing on stdout, and exit code 1.
inline void check_one_clear_error(const kvrun::test::CommandResult& r, const std::string& needle) {
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
inline void check_one_line_with_hint(const kvrun::test::CommandResult& r,
                                     const std::string& needle) {
    check_one_clear_error(r, needle);
    CHECK_MESSAGE(r.err.find(" (hint: ") != std::string::npos, r.err);
}

// Each (flags, needle): `run` with those flags (on a file that is not a model, so nothing loads
// first) fails with one clear line containing needle.
inline void check_bad_run_flags(const std::vector<std::pair<std::string, std::string>>& bad) {
    const std::string readme = std::string(KVRUN_SOURCE_DIR) + "/README.md";
    for (const auto& [flag, needle] : bad) {
        INFO(flag);
        check_one_clear_error(run_command(kvrun_cmd("run -m " + readme + " -p hi " + flag)),
                              needle);
    }
}

// One parsed JSON value per line of `text` (JSONL output).
inline std::vector<nlohmann::json> json_lines(const std::string& text) {
    std::istringstream in(text);
    std::vector<nlohmann::json> out;
    for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
    return out;
}

// Writes `text` byte-exact to a fresh temporary file and returns its path.
inline std::string temp_file(const std::string& text, const std::string& tag) {
    static int counter = 0;
    std::filesystem::path p =
        std::filesystem::temp_directory_path() /
        ("kvrun_cli_" + std::to_string(::getpid()) + "_" + tag + "_" + std::to_string(counter++));
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
}

inline std::string read_all(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// llama.cpp's .inp files: every case is followed by "\n__ggml_vocab_test__\n".
inline std::vector<std::string> vocab_cases(const std::string& inp) {
    static const std::string sep = "\n__ggml_vocab_test__\n";
    std::vector<std::string> cases;
    for (size_t pos = 0, at; (at = inp.find(sep, pos)) != std::string::npos; pos = at + sep.size())
        cases.push_back(inp.substr(pos, at - pos));
    return cases;
}

// What `tokenize --ids` must print for a .out line: .out spells the ids " 1 2 3" (a space
// before each), --ids "1 2 3\n" (an empty line for no ids).
inline std::string ids_output_for(const std::string& out_line) {
    REQUIRE_MESSAGE((out_line.empty() || out_line[0] == ' '), out_line);
    return (out_line.empty() ? out_line : out_line.substr(1)) + "\n";
}

// A fresh path in the temporary directory, kvrun_<tag>_<pid> (nothing is written).
inline std::string temp_path(const std::string& tag) {
    return (std::filesystem::temp_directory_path() /
            ("kvrun_" + tag + "_" + std::to_string(::getpid())))
        .string();
}

// The mean KL divergence `perplexity ARGS --kl-divergence-base BASE --kl-divergence` reports
// for `model` (ARGS: the text, -c and --chunks the base run was made with).
inline double mean_kld(const std::string& model, const std::string& args, const std::string& base) {
    auto k = run_command(kvrun_cmd("perplexity -m " + model + args + " --kl-divergence-base " +
                                   base + " --kl-divergence"));
    REQUIRE_MESSAGE(k.exit_code == 0, k.err);
    std::smatch m;
    REQUIRE_MESSAGE(std::regex_search(k.out, m, std::regex(R"(Mean +KLD: +([0-9.]+))")), k.out);
    return std::stod(m[1]);
}

}  // namespace kvrun::test::cli
