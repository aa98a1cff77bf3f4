// Programmatic dependent launch (KVRUN_PDL=on, src/cuda/common.cuh) lets a kernel start
// while the one before it in the stream still runs. That is safe only if the kernel waits
// (cu::pdl_wait, directly or through a helper such as pdl_begin or gemv_begin) before it
// touches activations and before any return. A kernel that forgets it races its predecessor,
// and a race may pass a GPU test by luck. This test reads the CUDA sources and holds every
// kernel that src/cuda launches through launch_pdl to the contract's checkable part: the
// kernel calls a waiting function, and no `return` comes before that call. Needs no GPU.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

// text with comments and string/char literals blanked (same length, so offsets hold).
std::string strip(const std::string& text) {
    std::string s = text;
    for (size_t i = 0; i < s.size();) {
        if (s.compare(i, 2, "//") == 0) {
            while (i < s.size() && s[i] != '\n') s[i++] = ' ';
        } else if (s.compare(i, 2, "/*") == 0) {
            const size_t end = s.find("*/", i + 2);
            const size_t stop = end == std::string::npos ? s.size() : end + 2;
            for (; i < stop; ++i)
                if (s[i] != '\n') s[i] = ' ';
        } else if (s[i] == '"' || s[i] == '\'') {
            const char q = s[i++];
            while (i < s.size() && s[i] != q && s[i] != '\n') {
                if (s[i] == '\\' && i + 1 < s.size()) s[i++] = ' ';
                s[i++] = ' ';
            }
            ++i;
        } else {
            ++i;
        }
    }
    return s;
}

// The function definitions of a stripped source: name -> body (between its braces), and the
// names of those declared __global__. A definition is `name(...) ... {` at brace depth 0
// (or inside a namespace), its parameter list balanced.
struct Functions {
    std::map<std::string, std::string> body;
    std::set<std::string> global;
};

bool ident_char(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}

void collect(const std::string& s, Functions& out) {
    static const std::set<std::string> kNotNames = {
        "if",    "for",     "while",     "switch",  "return", "sizeof", "__launch_bounds__",
        "catch", "alignas", "__align__", "decltype"};
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] != '(') continue;
        size_t e = i;
        while (e > 0 && s[e - 1] == ' ') --e;
        size_t b = e;
        while (b > 0 && ident_char(s[b - 1])) --b;
        if (b == e) continue;
        const std::string name = s.substr(b, e - b);
        if (kNotNames.count(name) || std::isdigit(static_cast<unsigned char>(name[0]))) continue;
        // The balanced parameter list, then qualifiers up to `{` (a definition) or anything
        // else (a call, a declaration).
        int depth = 0;
        size_t j = i;
        for (; j < s.size(); ++j) {
            if (s[j] == '(') ++depth;
            if (s[j] == ')' && --depth == 0) break;
        }
        size_t k = j + 1;
        while (k < s.size() &&
               (std::isspace(static_cast<unsigned char>(s[k])) || ident_char(s[k]) || s[k] == '&'))
            ++k;
        if (k >= s.size() || s[k] != '{') continue;
        const std::string between = s.substr(j + 1, k - j - 1);
        if (between.find_first_not_of(" \t\n&") != std::string::npos &&
            std::regex_search(between, std::regex(R"(\b(?!const\b|noexcept\b|override\b)\w+)")))
            continue;  // e.g. `} else if (...) x {` is not a definition
        // The body by brace matching.
        int braces = 0;
        size_t m = k;
        for (; m < s.size(); ++m) {
            if (s[m] == '{') ++braces;
            if (s[m] == '}' && --braces == 0) break;
        }
        // Declared __global__: the keyword between the previous statement's end and the name.
        size_t d = b;
        while (d > 0 && s[d - 1] != ';' && s[d - 1] != '}' && s[d - 1] != '{') --d;
        const std::string head = s.substr(d, b - d);
        if (head.find("__global__") != std::string::npos) out.global.insert(name);
        out.body[name] += s.substr(k, m - k + 1);
        i = m;  // nested definitions (lambdas) stay part of this body
    }
}

// Offset of the first call in `body` of any function in `names` (npos if none).
size_t first_call(const std::string& body, const std::set<std::string>& names) {
    size_t best = std::string::npos;
    for (const auto& n : names) {
        const std::regex call("\\b" + n + "\\s*\\(");
        std::smatch mt;
        if (std::regex_search(body, mt, call)) best = std::min(best, size_t(mt.position(0)));
    }
    return best;
}

// What the contract check found: the launch_pdl kernels, and those that break it, with why.
struct Report {
    std::set<std::string> launched;
    std::vector<std::string> problems;
};

Report check_sources(const std::vector<std::string>& sources) {
    Functions fns;
    std::string all;
    for (const auto& text : sources) {
        const std::string s = strip(text);
        collect(s, fns);
        all += s + "\n";
    }
    Report r;
    // The kernels passed to launch_pdl (its own definition names its parameter `void`).
    const std::regex launch(R"(launch_pdl\s*\(\s*([A-Za-z_]\w*))");
    for (auto it = std::sregex_iterator(all.begin(), all.end(), launch);
         it != std::sregex_iterator(); ++it)
        if ((*it)[1] != "void") r.launched.insert((*it)[1]);
    // The functions that wait: pdl_wait, and whatever calls one of them, transitively.
    std::set<std::string> waits = {"pdl_wait"};
    for (bool grew = true; grew;) {
        grew = false;
        for (const auto& [name, body] : fns.body)
            if (!waits.count(name) && first_call(body, waits) != std::string::npos) {
                waits.insert(name);
                grew = true;
            }
    }
    for (const auto& k : r.launched) {
        if (!fns.body.count(k)) {
            r.problems.push_back(k + ": launched through launch_pdl, definition not found");
            continue;
        }
        if (!fns.global.count(k)) r.problems.push_back(k + ": launched but not __global__");
        const std::string& body = fns.body.at(k);
        const size_t wait_at = first_call(body, waits);
        if (wait_at == std::string::npos) {
            r.problems.push_back(k + ": never waits for its predecessor (no pdl_wait)");
            continue;
        }
        std::smatch ret;
        if (std::regex_search(body, ret, std::regex(R"(\breturn\b)")) &&
            size_t(ret.position(0)) < wait_at)
            r.problems.push_back(k + ": may return before it waits for its predecessor");
    }
    return r;
}

std::string read(const std::filesystem::path& p) {
    std::ifstream f(p);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

std::string join(const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += x + "\n";
    return s;
}

}  // namespace

TEST_CASE("the contract check finds a kernel that does not wait, or returns first") {
    const std::string helpers = R"(
        __device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;"); }
        __device__ __forceinline__ void pdl_begin() { pdl_wait(); pdl_launch_dependents(); }
        __device__ void my_begin(int a) { if (a) prefetch(a); cu::pdl_begin(); }
    )";
    const std::string kernels = R"(
        template <int R>
        __global__ void __launch_bounds__(256) good_kernel(const float* x, int n) {
            cu::pdl_begin();  // a "return" in a comment or a string does not count
            if (threadIdx.x >= n) return;
        }
        __global__ void helper_kernel(int n) { my_begin(n); if (n) return; }
        __global__ void lazy_kernel(float* y, int n) {
            if (threadIdx.x >= n) return;
            cu::pdl_wait();
            y[0] = 1;
        }
        __global__ void never_kernel(float* y) { y[threadIdx.x] = 0; }
        __device__ void not_a_kernel(float* y) { cu::pdl_wait(); }
        void launch(cudaStream_t s) {
            cu::launch_pdl(good_kernel<4>, 1, 32, 0, s, nullptr, 0);
            cu::launch_pdl(helper_kernel, 1, 32, 0, s, 1);
            cu::launch_pdl(lazy_kernel, 1, 32, 0, s, nullptr, 1);
            cu::launch_pdl(never_kernel, 1, 32, 0, s, nullptr);
            cu::launch_pdl(not_a_kernel, 1, 32, 0, s, nullptr);
            cu::launch_pdl(missing_kernel, 1, 32, 0, s);
            plain_kernel<<<1, 32, 0, s>>>();
        }
    )";
    const Report r = check_sources({helpers, kernels});
    CHECK(r.launched == std::set<std::string>{"good_kernel", "helper_kernel", "lazy_kernel",
                                              "never_kernel", "not_a_kernel", "missing_kernel"});
    const std::string p = join(r.problems);
    INFO(p);
    CHECK(r.problems.size() == 4);
    CHECK(p.find("lazy_kernel: may return before") != std::string::npos);
    CHECK(p.find("never_kernel: never waits") != std::string::npos);
    CHECK(p.find("not_a_kernel: launched but not __global__") != std::string::npos);
    CHECK(p.find("missing_kernel: launched through launch_pdl, definition not found") !=
          std::string::npos);
    CHECK(p.find("good_kernel") == std::string::npos);
    CHECK(p.find("helper_kernel") == std::string::npos);
}

TEST_CASE("every kernel that src/cuda launches through launch_pdl waits before it returns") {
    const std::filesystem::path dir = std::filesystem::path(KVRUN_SOURCE_DIR) / "src" / "cuda";
    std::vector<std::string> sources;
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
        const auto ext = e.path().extension();
        if (ext == ".cu" || ext == ".cuh" || ext == ".h") sources.push_back(read(e.path()));
    }
    REQUIRE(sources.size() > 10);
    const Report r = check_sources(sources);
    MESSAGE(r.launched.size() << " kernels launched through launch_pdl");
    // The forward pass's kernels: norms, GEMVs, attention, KV writes, sampling (about 40).
    CHECK(r.launched.size() >= 30);
    for (const char* k : {"gemv_kernel", "gemv_q8_kernel", "decode_attention_kernel",
                          "rmsnorm_reg_kernel", "kv_write_kernel", "sample_rows_kernel"})
        CHECK_MESSAGE(r.launched.count(k), k);
    CHECK_MESSAGE(r.problems.empty(), join(r.problems));
}
