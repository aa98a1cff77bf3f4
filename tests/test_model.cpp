// Acceptance test of the CPU forward pass (model_config, weights, cpu_backend) against
// llama.cpp's logits in ../shared/reference/logits for every model in ../shared/models, plus
// paging / batching / copy-on-write invariance on stories260K. (Load errors and batch
// validation on tiny hand-made models: test_model_load.cpp.)
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend.h"
#include "common.h"
#include "cpu_backend.h"
#include "gguf.h"
#include "model_config.h"
#include "quant.h"
#include "reference_logits.h"
#include "test_util.h"
#include "tokenizer.h"
#include "weights.h"

using namespace kvrun;
namespace fs = std::filesystem;

namespace {

// MODEL.first.f32: int32 n_tokens, int32 n_vocab, then [n_tokens][n_vocab] float32.
std::vector<float> load_first_logits(const fs::path& path, int64_t& n_tokens, int64_t& n_vocab) {
    std::ifstream in(path, std::ios::binary);
    if (!in.good()) return {};
    int32_t hdr[2] = {0, 0};
    in.read(reinterpret_cast<char*>(hdr), sizeof hdr);
    n_tokens = hdr[0];
    n_vocab = hdr[1];
    std::vector<float> data(size_t(n_tokens) * size_t(n_vocab));
    in.read(reinterpret_cast<char*>(data.data()), std::streamsize(data.size() * sizeof(float)));
    REQUIRE(in.good());
    return data;
}

// ---- driving a backend ---------------------------------------------------------------------

using Logits = std::vector<float>;  // [n_vocab]

// Sequences on one backend, with blocks handed out from a (possibly shuffled) free list.
class Runner {
  public:
    Runner(Backend& backend, uint32_t shuffle_seed) : backend_(backend) {
        free_.resize(backend.n_kv_blocks());
        std::iota(free_.begin(), free_.end(), 0);
        if (shuffle_seed) std::shuffle(free_.begin(), free_.end(), std::mt19937(shuffle_seed));
        std::reverse(free_.begin(), free_.end());  // pop_back hands out free_[0] first
    }

    int new_seq() {
        tables_.emplace_back();
        lens_.push_back(0);
        return int(tables_.size()) - 1;
    }
    int32_t len(int seq) const { return lens_[seq]; }

    // A new sequence holding copies of `src`'s blocks (copy-on-write fork).
    int fork(int src) {
        int dst = new_seq();
        std::vector<BlockCopy> copies;
        for (int32_t b : tables_[src]) {
            tables_[dst].push_back(take_block());
            copies.push_back({b, tables_[dst].back()});
        }
        backend_.copy_blocks(copies);
        lens_[dst] = lens_[src];
        return dst;
    }

    struct Item {
        int seq;
        int32_t token;
    };
    // One forward over `items` (appended to their sequences in order); logits for every item.
    std::vector<Logits> step(const std::vector<Item>& items) {
        ForwardBatch b;
        const int32_t bs = backend_.kv_block_size();
        for (const Item& it : items) {
            int32_t slot = lens_[it.seq]++;
            while (int64_t(tables_[it.seq].size()) * bs <= slot)
                tables_[it.seq].push_back(take_block());
            b.tokens.push_back(it.token);
            b.positions.push_back(slot);
            b.seq_index.push_back(it.seq);
            b.slots.push_back(slot);
            b.logit_rows.push_back(int32_t(b.logit_rows.size()));
        }
        b.block_tables = tables_;
        const int64_t n_vocab = backend_.config().n_vocab;
        std::vector<float> flat(items.size() * n_vocab);
        backend_.forward(b, flat.data());
        std::vector<Logits> out(items.size());
        for (size_t i = 0; i < items.size(); ++i)
            out[i].assign(flat.begin() + i * n_vocab, flat.begin() + (i + 1) * n_vocab);
        return out;
    }

    // Feeds `tokens` to `seq` in chunks of `chunk` tokens; logits after every token.
    std::vector<Logits> prefill(int seq, const std::vector<int32_t>& tokens,
                                size_t chunk = 1 << 30) {
        std::vector<Logits> out;
        for (size_t i = 0; i < tokens.size(); i += chunk) {
            std::vector<Item> items;
            for (size_t j = i; j < std::min(tokens.size(), i + chunk); ++j)
                items.push_back({seq, tokens[j]});
            for (auto& l : step(items)) out.push_back(std::move(l));
        }
        return out;
    }

  private:
    int32_t take_block() {
        REQUIRE_MESSAGE(!free_.empty(), "test KV pool too small");
        int32_t b = free_.back();
        free_.pop_back();
        return b;
    }

    Backend& backend_;
    std::vector<int32_t> free_;
    std::vector<std::vector<int32_t>> tables_;
    std::vector<int32_t> lens_;
};

int32_t argmax(const Logits& l) {
    return int32_t(std::max_element(l.begin(), l.end()) - l.begin());
}

double logsumexp(const Logits& l) {
    double mx = *std::max_element(l.begin(), l.end()), s = 0;
    for (float x : l) s += std::exp(double(x) - mx);
    return mx + std::log(s);
}

double top2_gap(const Logits& l) {
    float a = -INFINITY, b = -INFINITY;
    for (float x : l) {
        if (x > a) {
            b = a;
            a = x;
        } else if (x > b) {
            b = x;
        }
    }
    return double(a) - double(b);
}

// Greedy decoding of n tokens after `prompt` on a fresh sequence: all logits (prompt
// positions, then one per decode step) and the chosen tokens.
struct GreedyRun {
    std::vector<Logits> logits;
    std::vector<int32_t> tokens;
};

GreedyRun run_greedy(Runner& r, const std::vector<int32_t>& prompt, int n, size_t chunk = 1 << 30) {
    GreedyRun g;
    int seq = r.new_seq();
    g.logits = r.prefill(seq, prompt, chunk);
    for (int i = 0; i < n; ++i) {
        g.tokens.push_back(argmax(g.logits.back()));
        if (i + 1 < n) g.logits.push_back(r.step({{seq, g.tokens.back()}})[0]);
    }
    return g;
}

double max_abs_diff(const std::vector<Logits>& a, const std::vector<Logits>& b) {
    REQUIRE(a.size() == b.size());
    double m = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        REQUIRE(a[i].size() == b[i].size());
        for (size_t j = 0; j < a[i].size(); ++j)
            m = std::max(m, std::abs(double(a[i][j]) - b[i][j]));
    }
    return m;
}

// ---- tolerances ----------------------------------------------------------------------------

// How llama.cpp rounds the activations entering the matrix products (the weights are the
// same bytes for both of us, and both keep K/V in f16):
//  - F32 weights: nothing but float summation order -> only f16 K/V and Q·K rounding differ.
//  - F16 weights: activations rounded to f16 (2^-11 relative).
//  - BF16 weights: activations rounded to bf16 (2^-8 relative).
//  - quantized weights: activations quantized to 8 bits per block of 32 / 256 (Q8_0 / Q8_K,
//    error up to 1/254 of the block's max) in every product.
// A model's class is that of its least precise 2-D weight.
enum class ActClass { F32, F16, BF16, Q8 };

ActClass model_class(const ModelWeights& w) {
    ActClass c = ActClass::F32;
    auto see = [&](const WeightView& v) {
        ActClass k = v.type == GgmlType::F32    ? ActClass::F32
                     : v.type == GgmlType::F16  ? ActClass::F16
                     : v.type == GgmlType::BF16 ? ActClass::BF16
                                                : ActClass::Q8;
        c = std::max(c, k);
    };
    see(w.output);  // (token_embd is only looked up, never multiplied: it does not count)
    for (const auto& l : w.layers)
        for (const WeightView* v : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
            see(*v);
    return c;
}

const char* class_name(ActClass c) {
    switch (c) {
        case ActClass::F32:
            return "f32";
        case ActClass::F16:
            return "f16";
        case ActClass::BF16:
            return "bf16";
        case ActClass::Q8:
            return "q8-act";
    }
    return "?";
}

// Bounds for the float32 comparison, per class. Our logits are float32 end to end (only K/V
// are f16, like llama.cpp's), llama.cpp's are not (see ActClass), and these tiny models
// amplify one flipped 8-bit rounding into ~0.1-0.5 nats at later positions, so:
//  - max_logprob: the largest |log-prob error| allowed for any top-10 token of any position,
//    about 2x the largest seen over all models of the class;
//  - mean_logprob: the mean over all of them, 2-3x the largest mean seen; a systematic
//    error (wrong eps, RoPE base or scale, a missing bias) moves the mean well past it;
//  - near_tie: a reference top-2 gap below this may legitimately flip top-1 / greedy choices,
//    about 2x the largest gap at which we ever disagreed. F32/F16 use the 0.05 suggested for
//    near-ties: their disagreements happen only at gaps < 0.02.
// Observed (float32 run, all 44 models; max / mean / largest reference gap at which our top-1
// or greedy token differed):
//   f32   0.014 / 0.0011 / 0.0006     f16     0.015 / 0.0024 / 0.0000
//   bf16  0.069 / 0.012  / 0.0010     q8-act  0.79  / 0.098  / 0.37  (w256 Q2_K/Q3_K worst)
// These are loose because the float32 path is not llama.cpp's arithmetic, not because anything
// is wrong: with llama.cpp's arithmetic emulated (check_emulated below) the same code, weights
// and graph give llama.cpp's logits bit for bit on every model, so every difference left here
// is rounding (per-model numbers for both paths: docs/llamacpp-fidelity.md). The strict
// thresholds of the issue are checked there; this test guards the path kvrun actually runs.
struct Tolerance {
    double max_logprob;
    double mean_logprob;
    double near_tie;
};

Tolerance tolerance(ActClass c) {
    switch (c) {
        case ActClass::F32:
            return {0.03, 0.003, 0.05};
        case ActClass::F16:
            return {0.03, 0.005, 0.05};
        case ActClass::BF16:
            return {0.15, 0.025, 0.05};
        case ActClass::Q8:
            return {1.6, 0.2, 0.75};
    }
    return {};
}

double logprob_error(const Logits& ours, double our_lse, const RefPosition& rp, size_t k) {
    auto [tok, ref_logit] = rp.top[k];
    return std::abs((double(ours[tok]) - our_lse) - (ref_logit - rp.logsumexp));
}

std::string model_stem(const fs::path& p) {
    return p.stem().string();
}

// Runs the 4 reference prompts of one model in float32 and checks (a) top-1 outside near-ties,
// (b) top-10 log-probs, (c) 48 greedy steps, and the full-vocabulary logits of the first
// prompt for F32 models.
void check_against_reference(const fs::path& model_path) {
    const std::string stem = model_stem(model_path);
    CAPTURE(stem);
    const fs::path ref_dir = test::shared_dir() / "reference" / "logits";
    auto t0 = std::chrono::steady_clock::now();
    auto prompts = load_reference_logits(ref_dir / (stem + ".jsonl"));
    REQUIRE(prompts.size() == 4);
    GgufFile file = GgufFile::open(model_path.string());
    BackendOptions opt;
    opt.n_kv_blocks = 48;  // 4 prompts x <= 68 tokens in blocks of 16, with room to spare
    CpuBackend backend(file, opt);
    const ActClass cls = model_class(backend.weights());
    const Tolerance tol = tolerance(cls);
    Runner runner(backend, 12345);  // shuffled physical blocks

    double max_lp_err = 0, sum_lp_err = 0, max_gap_err = 0, max_full_err = -1, worst_flip = 0;
    int64_t n_lp = 0;
    int top1_checked = 0, greedy_checked = 0, min_free_prefix = 48;
    for (size_t p = 0; p < prompts.size(); ++p) {
        const RefPrompt& ref = prompts[p];
        CAPTURE(p);
        int seq = runner.new_seq();
        std::vector<Logits> logits = runner.prefill(seq, ref.tokens);
        // (a), (b): every prompt position.
        for (size_t i = 0; i < ref.tokens.size(); ++i) {
            const RefPosition& rp = ref.positions[i];
            const double lse = logsumexp(logits[i]);
            for (size_t k = 0; k < rp.top.size(); ++k) {
                double err = logprob_error(logits[i], lse, rp, k);
                max_lp_err = std::max(max_lp_err, err);
                sum_lp_err += err;
                ++n_lp;
                CHECK_MESSAGE(err <= tol.max_logprob,
                              "position " << i << " token " << rp.top[k].first);
            }
            const double gap = rp.top[0].second - rp.top[1].second;
            if (argmax(logits[i]) != rp.top[0].first) worst_flip = std::max(worst_flip, gap);
            if (gap >= tol.near_tie) {
                ++top1_checked;
                CHECK_MESSAGE(argmax(logits[i]) == rp.top[0].first, "position " << i);
            }
        }
        // Full-vocabulary check of the first prompt's raw logits (F32 models: they differ from
        // llama.cpp's only by f16 Q / softmax-weight rounding and summation order).
        if (p == 0) {
            int64_t nt = 0, nv = 0;
            std::vector<float> full = load_first_logits(ref_dir / (stem + ".first.f32"), nt, nv);
            if (!full.empty()) {
                REQUIRE(nt == int64_t(ref.tokens.size()));
                REQUIRE(nv == backend.config().n_vocab);
                max_full_err = 0;
                for (int64_t i = 0; i < nt; ++i)
                    for (int64_t v = 0; v < nv; ++v)
                        max_full_err = std::max(max_full_err,
                                                std::abs(double(logits[i][v]) - full[i * nv + v]));
                if (cls == ActClass::F32) CHECK(max_full_err <= 0.01);
            }
        }
        // (c): 48 greedy steps, fed the reference's tokens (teacher forcing), so every step
        // outside a near-tie is checked, not only those before the first one. Up to the first
        // disagreement this is exactly free-running greedy decoding.
        Logits cur = logits.back();
        int free_prefix = -1;
        for (size_t s = 0; s < ref.greedy.size(); ++s) {
            CAPTURE(s);
            int32_t ours = argmax(cur);
            if (ours != ref.greedy[s]) {
                if (free_prefix < 0) free_prefix = int(s);
                worst_flip = std::max(worst_flip, ref.gaps[s]);
            }
            if (ref.gaps[s] >= tol.near_tie) {
                ++greedy_checked;
                CHECK(ours == ref.greedy[s]);
            }
            // The gap is a difference of two log-probs: off by at most twice their error.
            double gap_err = std::abs(top2_gap(cur) - ref.gaps[s]);
            max_gap_err = std::max(max_gap_err, gap_err);
            CHECK(gap_err <= 2 * tol.max_logprob);
            if (s + 1 < ref.greedy.size()) cur = runner.step({{seq, ref.greedy[s]}})[0];
        }
        min_free_prefix = std::min(min_free_prefix, free_prefix < 0 ? 48 : free_prefix);
    }
    const double mean_lp_err = sum_lp_err / double(std::max<int64_t>(1, n_lp));
    CHECK(mean_lp_err <= tol.mean_logprob);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    MESSAGE(
        fmt::format("{:<38} {:<6} logprob err max {:.4f} mean {:.4f}  gap err {:.4f}  "
                    "full-vocab err {:.4f}  disagreement at gap <= {:.4f}  checked top1 {} "
                    "greedy {}  free greedy run >= {}  {:.2f}s",
                    stem, class_name(cls), max_lp_err, mean_lp_err, max_gap_err, max_full_err,
                    worst_flip, top1_checked, greedy_checked, min_free_prefix, secs));
}

// ---- llama.cpp's arithmetic emulated: the strict criteria ------------------------

// With BackendOptions::llamacpp_rounding the CPU backend reproduces the reference build's
// float arithmetic operation by operation (src/cpu_ops.cpp, docs/llamacpp-fidelity.md), and
// every logit of every shared model equals llama.cpp's float32 value bit for bit. What is left
// is the reference files' own rounding:
//  - kEmuLogprobTol: logits and logsumexp are printed with 6 decimals, so a log-prob is off by
//    up to 1e-6 (measured max over all 44 models: 1.0e-6); 5e-6 leaves room for summation
//    order in the two logsumexps, and is 4 orders of magnitude below the float32 path's errors;
//  - kEmuGapTol: greedy_top2_gap is printed with 4 decimals (5e-5; measured 5.0e-5);
//  - kNearTie: the near-tie threshold. With equal logits even smaller gaps agree, but a
//    gap under 0.01 is where the issue lets two correct implementations differ.
constexpr double kEmuLogprobTol = 5e-6;
constexpr double kEmuGapTol = 1e-4;
constexpr double kNearTie = 0.01;

// The acceptance criteria at their strict thresholds, emulation on: prompt tokens equal
// the reference's; top-1 equals the reference's at every prompt position unless its top-2 gap
// is < 0.01; top-10 log-probs within kEmuLogprobTol; the first prompt's whole-vocabulary logits
// bit-equal to MODEL.first.f32 (when present); 48 greedy steps fed the reference's tokens, our
// token equal to the reference's at every step before its first gap < 0.01 (this is free-running
// greedy decoding up to there) and at every later step with a gap >= 0.01, each step's top-2 gap
// within kEmuGapTol.
void check_emulated(const fs::path& model_path) {
    const std::string stem = model_stem(model_path);
    CAPTURE(stem);
    const fs::path ref_dir = test::shared_dir() / "reference" / "logits";
    auto prompts = load_reference_logits(ref_dir / (stem + ".jsonl"));
    REQUIRE(prompts.size() == 4);
    GgufFile file = GgufFile::open(model_path.string());
    const auto tokenizer = Tokenizer::from_gguf(file);
    BackendOptions opt;
    opt.n_kv_blocks = 48;
    opt.llamacpp_rounding = true;
    CpuBackend backend(file, opt);
    Runner runner(backend, 777);  // shuffled physical blocks
    double max_lp_err = 0, max_gap_err = 0;
    int top1_checked = 0, greedy_checked = 0;
    int64_t full_diff = -1;
    for (size_t p = 0; p < prompts.size(); ++p) {
        const RefPrompt& ref = prompts[p];
        CAPTURE(p);
        CHECK(tokenizer->encode(ref.text, true) == ref.tokens);
        int seq = runner.new_seq();
        std::vector<Logits> logits = runner.prefill(seq, ref.tokens);
        for (size_t i = 0; i < ref.tokens.size(); ++i) {
            CAPTURE(i);
            const RefPosition& rp = ref.positions[i];
            const double lse = logsumexp(logits[i]);
            for (size_t k = 0; k < rp.top.size(); ++k) {
                const double err = logprob_error(logits[i], lse, rp, k);
                max_lp_err = std::max(max_lp_err, err);
                CHECK(err <= kEmuLogprobTol);
            }
            if (rp.top[0].second - rp.top[1].second >= kNearTie) {
                ++top1_checked;
                CHECK(argmax(logits[i]) == rp.top[0].first);
            }
        }
        if (p == 0) {
            int64_t nt = 0, nv = 0;
            std::vector<float> full = load_first_logits(ref_dir / (stem + ".first.f32"), nt, nv);
            if (!full.empty()) {
                REQUIRE(nt == int64_t(ref.tokens.size()));
                REQUIRE(nv == backend.config().n_vocab);
                full_diff = 0;
                for (int64_t i = 0; i < nt; ++i)
                    for (int64_t v = 0; v < nv; ++v) full_diff += logits[i][v] != full[i * nv + v];
                CHECK(full_diff == 0);
            }
        }
        Logits cur = logits.back();
        bool before_tie = true;
        for (size_t s = 0; s < ref.greedy.size(); ++s) {
            CAPTURE(s);
            before_tie = before_tie && ref.gaps[s] >= kNearTie;
            const int32_t ours = argmax(cur);
            if (before_tie || ref.gaps[s] >= kNearTie) {
                ++greedy_checked;
                CHECK(ours == ref.greedy[s]);
            }
            const double gap_err = std::abs(top2_gap(cur) - ref.gaps[s]);
            max_gap_err = std::max(max_gap_err, gap_err);
            CHECK(gap_err <= kEmuGapTol);
            if (s + 1 < ref.greedy.size()) cur = runner.step({{seq, ref.greedy[s]}})[0];
        }
    }
    MESSAGE(
        fmt::format("{:<38} emulated: logprob err max {:.1e}  gap err {:.1e}  first prompt "
                    "{}  checked top1 {} greedy {}",
                    stem, max_lp_err, max_gap_err,
                    full_diff < 0    ? std::string("(no .first.f32)")
                    : full_diff == 0 ? std::string("bit-equal")
                                     : fmt::format("{} logits differ", full_diff),
                    top1_checked, greedy_checked));
}

std::vector<fs::path> models_with_reference() {
    std::vector<fs::path> out;
    for (const fs::path& m : test::shared_models())
        if (fs::exists(test::shared_dir() / "reference/logits" / (model_stem(m) + ".jsonl")))
            out.push_back(m);
        else
            MESSAGE("no reference for " << m);
    return out;
}

}  // namespace

// ---- acceptance against llama.cpp ----------------------------------------------------------

TEST_CASE("every shared model matches llama.cpp's logits and greedy tokens") {
    auto models = models_with_reference();
    if (models.empty()) {
        MESSAGE("SKIP: ../shared not found (set KVRUN_SHARED); skipping real-model test");
        return;
    }
    CHECK(models.size() >= 44);
    for (const fs::path& m : models) check_against_reference(m);
}

TEST_CASE("with llama.cpp's arithmetic emulated, every shared model meets the strict criteria") {
    auto models = models_with_reference();
    if (models.empty()) {
        MESSAGE("SKIP: ../shared not found (set KVRUN_SHARED); skipping real-model test");
        return;
    }
    CHECK(models.size() >= 44);
    for (const fs::path& m : models) check_emulated(m);
}

TEST_CASE("paging is invisible: block sizes 1, 7, 16, 256 and chunked prefill agree exactly") {
    fs::path model = test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    auto prompts = load_reference_logits(test::shared_dir() / "reference/logits/stories260K.jsonl");
    GgufFile file = GgufFile::open(model.string());
    std::vector<std::vector<GreedyRun>> runs;  // [block size][prompt]
    for (int32_t bs : {16, 1, 7, 256}) {
        CAPTURE(bs);
        BackendOptions opt;
        opt.kv_block_size = bs;
        opt.n_kv_blocks = 4 * ((68 + bs - 1) / bs) + 3;
        CpuBackend backend(file, opt);
        Runner runner(backend, uint32_t(bs) * 7 + 1);  // shuffled physical blocks
        runs.emplace_back();
        for (const RefPrompt& p : prompts)
            runs.back().push_back(run_greedy(runner, p.tokens, 48, bs == 7 ? 3 : 1 << 30));
        for (size_t p = 0; p < prompts.size(); ++p) {
            CHECK(runs.back()[p].tokens == runs[0][p].tokens);
            CHECK(max_abs_diff(runs.back()[p].logits, runs[0][p].logits) == 0.0);
        }
    }
    // And the story is the reference's ("..., there was a little girl named Lily...").
    CHECK(runs[0][0].tokens == prompts[0].greedy);
}

TEST_CASE("three prompts in one batch give the same logits as each alone") {
    for (const char* name : {"stories260K", "synth-qwen2-hd64-gqa2-F16"}) {
        CAPTURE(name);
        fs::path model = test::shared_path(std::string("models/") + name + ".gguf");
        if (model.empty()) return;
        auto prompts = load_reference_logits(test::shared_dir() / "reference/logits" /
                                             (std::string(name) + ".jsonl"));
        const int n_steps = std::string(name) == "stories260K" ? 48 : 12;
        GgufFile file = GgufFile::open(model.string());
        BackendOptions opt;
        opt.n_kv_blocks = 40;
        CpuBackend backend(file, opt);

        std::vector<GreedyRun> alone;
        {
            Runner r(backend, 3);
            for (int p = 1; p <= 3; ++p) alone.push_back(run_greedy(r, prompts[p].tokens, n_steps));
        }
        // Together: prompt tokens interleaved round-robin in one forward, then one decode
        // step per forward for all three.
        Runner r(backend, 4);
        int seqs[3] = {r.new_seq(), r.new_seq(), r.new_seq()};
        std::vector<Runner::Item> items;
        std::vector<std::pair<int, size_t>> who;  // (prompt, position) of each item
        for (size_t i = 0; i < 20; ++i)
            for (int k = 0; k < 3; ++k)
                if (i < prompts[k + 1].tokens.size()) {
                    items.push_back({seqs[k], prompts[k + 1].tokens[i]});
                    who.emplace_back(k, i);
                }
        std::vector<Logits> out = r.step(items);
        std::vector<GreedyRun> together(3);
        for (size_t i = 0; i < items.size(); ++i) together[who[i].first].logits.push_back(out[i]);
        for (int s = 0; s < n_steps; ++s) {
            std::vector<Runner::Item> step;
            for (int k = 0; k < 3; ++k) {
                together[k].tokens.push_back(argmax(together[k].logits.back()));
                step.push_back({seqs[k], together[k].tokens.back()});
            }
            if (s + 1 == n_steps) break;
            out = r.step(step);
            for (int k = 0; k < 3; ++k) together[k].logits.push_back(out[k]);
        }
        for (int k = 0; k < 3; ++k) {
            CAPTURE(k);
            CHECK(together[k].tokens == alone[k].tokens);
            CHECK(max_abs_diff(together[k].logits, alone[k].logits) == 0.0);
        }
    }
}

TEST_CASE("copy_blocks forks a sequence: the copy continues exactly like the original") {
    fs::path model = test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    GgufFile file = GgufFile::open(model.string());
    BackendOptions opt;
    opt.kv_block_size = 4;
    opt.n_kv_blocks = 32;
    CpuBackend backend(file, opt);
    Runner r(backend, 9);
    const std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 432};  // 6 tokens: 1.5 blocks
    int a = r.new_seq();
    r.prefill(a, prompt);
    int b = r.fork(a);
    // Continue both with the same tokens in one batch; the shared partial block was copied,
    // so both write their own slot 6 and see identical histories.
    auto out = r.step({{a, 383}, {b, 383}});
    CHECK(out[0] == out[1]);
    CHECK(argmax(out[0]) == 286);  // the reference's greedy continuation
    // Now diverge: b's new token must not leak into a.
    auto out_b = r.step({{b, 300}});
    auto out_a = r.step({{a, 286}});
    CHECK(out_a[0] != out_b[0]);
    CHECK(argmax(out_a[0]) == 261);
    CHECK_THROWS_AS(backend.copy_blocks({{0, 32}}), Error);
}
