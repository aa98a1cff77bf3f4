// Helpers for tests: locating ../shared (real models and references) and the kvrun binary.
#pragma once

#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace kvrun::test {

// The shared data directory: $KVRUN_SHARED, else ../shared beside the source tree.
// Empty when absent (tests then skip with a message).
inline std::filesystem::path shared_dir() {
    if (const char* env = std::getenv("KVRUN_SHARED"); env && *env) {
        if (std::filesystem::is_directory(env)) return env;
    }
    std::filesystem::path p = std::filesystem::path(KVRUN_SOURCE_DIR) / ".." / "shared";
    if (std::filesystem::is_directory(p / "models")) return std::filesystem::weakly_canonical(p);
    return {};
}

// Returns shared_dir()/rel, or an empty path (after printing why) when ../shared is absent.
inline std::filesystem::path shared_path(const std::string& rel) {
    auto dir = shared_dir();
    if (dir.empty()) {
        MESSAGE("SKIP: ../shared not found (set KVRUN_SHARED); skipping real-data test");
        return {};
    }
    return dir / rel;
}

// shared_dir()/models/name when present; otherwise an empty path, after saying why (no
// ../shared, or a model missing from a partial copy such as a GPU session's carried subset).
inline std::filesystem::path shared_model(const std::string& name) {
    auto path = shared_path("models/" + name);
    if (path.empty()) return {};
    if (!std::filesystem::exists(path)) {
        MESSAGE("SKIP: missing " << path.string());
        return {};
    }
    return path;
}

// Every model file under ../shared/models, sorted (empty when absent).
inline std::vector<std::filesystem::path> shared_models() {
    std::vector<std::filesystem::path> out;
    auto dir = shared_dir();
    if (dir.empty()) return out;
    for (auto& e : std::filesystem::directory_iterator(dir / "models"))
        if (e.path().extension() == ".gguf") out.push_back(e.path());
    std::sort(out.begin(), out.end());
    return out;
}

// `s` as one single-quoted /bin/sh word.
inline std::string shell_quote(const std::string& s) {
    std::string out = "'";
    for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
}

inline std::string kvrun_binary() {
    return KVRUN_BINARY;
}

struct CommandResult {
    int exit_code = -1;
    std::string out;  // stdout
    std::string err;  // stderr
};

// Runs `cmd` through /bin/sh, capturing stdout and stderr (via a temp file).
inline CommandResult run_command(const std::string& cmd, const std::string& stdin_text = {}) {
    namespace fs = std::filesystem;
    static int counter = 0;
    fs::path tmp = fs::temp_directory_path() /
                   ("kvrun_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::string in_file = tmp.string() + ".in", err_file = tmp.string() + ".err";
    {
        FILE* f = std::fopen(in_file.c_str(), "wb");
        std::fwrite(stdin_text.data(), 1, stdin_text.size(), f);
        std::fclose(f);
    }
    std::string full = cmd + " <" + in_file + " 2>" + err_file;
    CommandResult r;
    FILE* p = ::popen(full.c_str(), "r");
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
    int status = ::pclose(p);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (FILE* f = std::fopen(err_file.c_str(), "rb")) {
        while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) r.err.append(buf, n);
        std::fclose(f);
    }
    fs::remove(in_file);
    fs::remove(err_file);
    return r;
}

// A fresh scratch directory under the system temp dir, removed at scope exit.
struct TempDir {
    std::filesystem::path path;
    TempDir() {
        static int counter = 0;
        path = std::filesystem::temp_directory_path() /
               ("kvrun_test_dir_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
        std::filesystem::create_directories(path);
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    std::string file(const std::string& name) const { return (path / name).string(); }
    // Writes `text` to file(name) and returns that path.
    std::string write(const std::string& name, const std::string& text) const {
        std::ofstream(path / name, std::ios::binary) << text;
        return file(name);
    }
};

}  // namespace kvrun::test
