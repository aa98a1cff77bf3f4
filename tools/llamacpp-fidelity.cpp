// llamacpp-fidelity: compares the CPU backend's logits with llama.cpp's reference logits
// (../shared/reference/logits) for one or more models, with or without the llama.cpp rounding
// emulation (BackendOptions::llamacpp_rounding). An investigation aid for
// docs/llamacpp-fidelity.md; the acceptance checks live in tests/test_model.cpp.
//
//   llamacpp-fidelity [--emulate] [--verbose] [--shared DIR] [--dump FILE] [MODEL.gguf...]
// (no model: every model under DIR/models; DIR: $KVRUN_SHARED, else ../shared)
//
// Per model, one table row: mode (emu: emulation on, f32: default), the largest |log-prob
// error| over the reference's top-10 tokens of every prompt position and the share of them
// within 1e-3, the largest |raw logit error| over the whole vocabulary of the first prompt
// (MODEL.first.f32) and the share of bit-equal logits, the largest greedy top-2 gap error (48
// teacher-forced decode steps per prompt; the reference prints gaps to 4 decimals), the largest
// reference gap at which our top-1 / greedy token differs, the number of such differences at
// gaps >= 0.01, and the shortest free-running greedy prefix equal to the reference's before
// its first gap < 0.01 (48: all).
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "backend.h"
#include "common.h"
#include "cpu_backend.h"
#include "gguf.h"
#include "reference_logits.h"

namespace fs = std::filesystem;
using namespace kvrun;

namespace {

double logsumexp(const float* l, int64_t n) {
    double mx = *std::max_element(l, l + n), s = 0;
    for (int64_t i = 0; i < n; ++i) s += std::exp(double(l[i]) - mx);
    return mx + std::log(s);
}
int32_t argmax(const float* l, int64_t n) {
    return int32_t(std::max_element(l, l + n) - l);
}
double top2_gap(const float* l, int64_t n) {
    float a = -INFINITY, b = -INFINITY;
    for (int64_t i = 0; i < n; ++i) {
        if (l[i] > a) {
            b = a;
            a = l[i];
        } else if (l[i] > b) {
            b = l[i];
        }
    }
    return double(a) - double(b);
}

std::FILE* g_dump = nullptr;  // --dump: every logit row computed, raw float32

// One sequence in blocks 0, 1, 2, ... of the backend.
struct Seq {
    Backend& be;
    int32_t len = 0;
    std::vector<int32_t> table;
    std::vector<float> step(const std::vector<int32_t>& toks) {
        ForwardBatch b;
        for (int32_t t : toks) {
            int32_t slot = len++;
            while (int64_t(table.size()) * be.kv_block_size() <= slot)
                table.push_back(int32_t(table.size()));
            b.tokens.push_back(t);
            b.positions.push_back(slot);
            b.seq_index.push_back(0);
            b.slots.push_back(slot);
            b.logit_rows.push_back(int32_t(b.logit_rows.size()));
        }
        b.block_tables = {table};
        std::vector<float> out(toks.size() * be.config().n_vocab);
        be.forward(b, out.data());
        if (g_dump) std::fwrite(out.data(), sizeof(float), out.size(), g_dump);
        return out;
    }
};

struct Summary {
    double max_lp = 0, max_full = -1, max_gap_err = 0, worst_flip = 0, max_lp_first = 0;
    int first_bad_pos = -1, min_free = 48, n_lp = 0, n_exact = 0;
    int strict_fail = 0;     // top-1 / teacher-forced greedy differences at a reference gap >= 0.01
    int64_t full_equal = 0;  // first prompt: logits bit-equal to MODEL.first.f32
    int64_t full_n = 0;
};

Summary check_model(const fs::path& model, const fs::path& ref_dir, bool emulate, bool verbose) {
    const std::string stem = model.stem().string();
    auto prompts = load_reference_logits(ref_dir / (stem + ".jsonl"));
    GgufFile file = GgufFile::open(model.string());
    BackendOptions opt;
    opt.n_kv_blocks = 8;
    opt.llamacpp_rounding = emulate;
    CpuBackend backend(file, opt);
    const int64_t nv = backend.config().n_vocab;
    Summary s;
    for (size_t p = 0; p < prompts.size(); ++p) {
        const RefPrompt& ref = prompts[p];
        Seq seq{backend, 0, {}};
        std::vector<float> logits = seq.step(ref.tokens);
        const int64_t nt = int64_t(ref.tokens.size());
        for (int64_t i = 0; i < nt; ++i) {
            const float* l = logits.data() + i * nv;
            const double lse = logsumexp(l, nv);
            double pos_max = 0;
            for (auto [tok, rl] : ref.positions[i].top) {
                double e = std::abs((l[tok] - lse) - (rl - ref.positions[i].logsumexp));
                pos_max = std::max(pos_max, e);
                s.n_exact += e <= 1e-3;
                ++s.n_lp;
            }
            s.max_lp = std::max(s.max_lp, pos_max);
            if (p == 0) s.max_lp_first = std::max(s.max_lp_first, pos_max);
            if (pos_max > 1e-3 && s.first_bad_pos < 0) s.first_bad_pos = int(p * 100 + i);
            const double gap = ref.positions[i].top[0].second - ref.positions[i].top[1].second;
            if (argmax(l, nv) != ref.positions[i].top[0].first) {
                s.worst_flip = std::max(s.worst_flip, gap);
                s.strict_fail += gap >= 0.01;
            }
            if (verbose)
                fmt::print("  p{} pos {:2} tok {:4} lp err {:.6f} ref gap {:.4f}{}\n", p, i,
                           ref.tokens[i], pos_max, gap,
                           argmax(l, nv) != ref.positions[i].top[0].first ? " TOP1 DIFFERS" : "");
        }
        if (p == 0) {
            std::ifstream in(ref_dir / (stem + ".first.f32"), std::ios::binary);
            int32_t hdr[2] = {0, 0};
            if (in.read(reinterpret_cast<char*>(hdr), sizeof hdr) && hdr[0] == nt && hdr[1] == nv) {
                std::vector<float> full(size_t(nt * nv));
                in.read(reinterpret_cast<char*>(full.data()), std::streamsize(full.size() * 4));
                s.max_full = 0;
                for (int64_t k = 0; k < nt * nv; ++k) {
                    s.max_full = std::max(s.max_full, std::abs(double(logits[k]) - full[k]));
                    s.full_equal += logits[k] == full[k];
                }
                s.full_n = nt * nv;
                if (verbose)
                    for (int64_t i = 0; i < nt; ++i) {
                        double mx = 0;
                        int64_t same = 0;
                        for (int64_t v = 0; v < nv; ++v) {
                            mx = std::max(mx,
                                          std::abs(double(logits[i * nv + v]) - full[i * nv + v]));
                            same += logits[i * nv + v] == full[i * nv + v];
                        }
                        fmt::print("  full pos {}: max |diff| {:.3g}, bit-equal {}/{}\n", i, mx,
                                   same, nv);
                    }
            }
        }
        std::vector<float> cur(logits.end() - nv, logits.end());
        int free_prefix = -1;
        bool tie_seen = false;
        for (size_t st = 0; st < ref.greedy.size(); ++st) {
            const int32_t ours = argmax(cur.data(), nv);
            const double ge = std::abs(top2_gap(cur.data(), nv) - ref.gaps[st]);
            s.max_gap_err = std::max(s.max_gap_err, ge);
            if (ours != ref.greedy[st]) {
                s.worst_flip = std::max(s.worst_flip, ref.gaps[st]);
                s.strict_fail += ref.gaps[st] >= 0.01;
            }
            if (ref.gaps[st] < 0.01) tie_seen = true;
            if (ours != ref.greedy[st] && !tie_seen && free_prefix < 0) free_prefix = int(st);
            if (verbose)
                fmt::print("  p{} greedy {:2} ref {:4} ours {:4} gap {:.4f} gap err {:.6f}\n", p,
                           st, ref.greedy[st], ours, ref.gaps[st], ge);
            if (st + 1 < ref.greedy.size()) cur = seq.step({ref.greedy[st]});
        }
        if (free_prefix >= 0) s.min_free = std::min(s.min_free, free_prefix);
    }
    const std::string full = s.full_n == 0
                                 ? std::string("-")
                                 : fmt::format("{:.1e} ({:.0f}% bit-equal)", s.max_full,
                                               100.0 * double(s.full_equal) / double(s.full_n));
    fmt::print("| {:<38} | {} | {:.1e} | {:5.1f}% | {:<22} | {:.1e} | {:.4f} | {:>2} | {:>2} |\n",
               stem, emulate ? "emu" : "f32", s.max_lp, 100.0 * s.n_exact / std::max(1, s.n_lp),
               full, s.max_gap_err, s.worst_flip, s.strict_fail, s.min_free);
    std::fflush(stdout);
    return s;
}

}  // namespace

int main(int argc, char** argv) {
    bool emulate = false, verbose = false;
    const char* env = std::getenv("KVRUN_SHARED");
    fs::path shared = env && *env ? fs::path(env) : fs::path("../shared");
    std::vector<fs::path> models;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--emulate")
            emulate = true;
        else if (a == "--verbose")
            verbose = true;
        else if (a == "--shared" && i + 1 < argc)
            shared = argv[++i];
        else if (a == "--dump" && i + 1 < argc)
            g_dump = std::fopen(argv[++i], "wb");
        else
            models.emplace_back(a);
    }
    if (models.empty())
        for (auto& e : fs::directory_iterator(shared / "models"))
            if (e.path().extension() == ".gguf") models.push_back(e.path());
    std::sort(models.begin(), models.end());
    try {
        for (const auto& m : models)
            check_model(m, shared / "reference" / "logits", emulate, verbose);
        if (g_dump) std::fclose(g_dump);
    } catch (const std::exception& e) {
        fmt::print(stderr, "error: {}\n", e.what());
        return 1;
    }
    return 0;
}
