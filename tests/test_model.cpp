// Acceptance test of the CPU forward pass (model_config, weights, cpu_backend) against
// llama.cpp's logits in ../shared/reference/logits for every model in ../shared/models, plus
// paging / batching invariance and load-error messages on tiny hand-made GGUF files.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend.h"
#include "common.h"
#include "cpu_backend.h"
#include "gguf.h"
#include "gguf_writer.h"
#include "model_config.h"
#include "quant.h"
#include "test_util.h"
#include "weights.h"

using namespace kvrun;
namespace fs = std::filesystem;

namespace {

// ---- reference data ------------------------------------------------------------------------

struct RefPosition {
    double logsumexp = 0;
    std::vector<std::pair<int32_t, double>> top;  // the 10 largest logits, best first
};

struct RefPrompt {
    std::vector<int32_t> tokens;         // prompt with BOS
    std::vector<RefPosition> positions;  // [n_tokens]
    std::vector<int32_t> greedy;         // [48]
    std::vector<double> gaps;            // [48] top-1 minus top-2 logit at each greedy step
};

std::vector<RefPrompt> load_reference(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    REQUIRE_MESSAGE(in.good(), "cannot read " << path);
    std::vector<RefPrompt> out;
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty()) continue;
        // greedy_text may hold invalid UTF-8 (a token split mid-character); only numbers matter.
        for (char& ch : line)
            if (static_cast<unsigned char>(ch) >= 0x80) ch = '?';
        auto j = nlohmann::json::parse(line);
        RefPrompt p;
        p.tokens = j.at("tokens").get<std::vector<int32_t>>();
        for (const auto& pos : j.at("positions")) {
            RefPosition r;
            r.logsumexp = pos.at("logsumexp").get<double>();
            for (const auto& t : pos.at("top"))
                r.top.emplace_back(t[0].get<int32_t>(), t[1].get<double>());
            p.positions.push_back(std::move(r));
        }
        p.greedy = j.at("greedy").get<std::vector<int32_t>>();
        p.gaps = j.at("greedy_top2_gap").get<std::vector<double>>();
        out.push_back(std::move(p));
    }
    return out;
}

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
        std::vector<std::pair<int32_t, int32_t>> pairs;
        for (int32_t b : tables_[src]) {
            tables_[dst].push_back(take_block());
            pairs.emplace_back(b, tables_[dst].back());
        }
        backend_.copy_blocks(pairs);
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

// Tolerance on log-probabilities (logit - logsumexp) of the reference's top-10 tokens.
// Values: about 3x the largest error observed over all models of the class (see the report
// printed by the test), so a real bug (wrong RoPE pair, missing bias, off-by-one slot: errors
// of 0.1 to several nats) cannot hide, while rounding differences never trip it.
double logprob_tolerance(ActClass c, bool llamacpp_rounding) {
    if (llamacpp_rounding) return 1.0;
    switch (c) {
        case ActClass::F32:
            return 1.0;
        case ActClass::F16:
            return 1.0;
        case ActClass::BF16:
            return 1.0;
        case ActClass::Q8:
            return 1.0;
    }
    return 0;
}

// Runs the 4 reference prompts of one model and checks (a) top-1, (b) top-10 log-probs,
// (c) 48 greedy steps and the full-vocabulary logits of the first prompt. Returns false when
// the model has no reference.
bool check_against_reference(const fs::path& model_path, bool llamacpp_rounding) {
    const std::string stem = model_path.stem().string();
    CAPTURE(stem);
    const fs::path ref_dir = test::shared_dir() / "reference" / "logits";
    const fs::path ref_path = ref_dir / (stem + ".jsonl");
    if (!fs::exists(ref_path)) {
        MESSAGE("no reference for " << stem);
        return false;
    }
    auto t0 = std::chrono::steady_clock::now();
    auto prompts = load_reference(ref_path);
    REQUIRE(prompts.size() == 4);
    GgufFile file = GgufFile::open(model_path.string());
    BackendOptions opt;
    opt.n_kv_blocks = 48;  // 4 prompts x <= 68 tokens in blocks of 16, with room to spare
    opt.llamacpp_rounding = llamacpp_rounding;
    CpuBackend backend(file, opt);
    const ActClass cls = model_class(backend.weights());
    const double tol = logprob_tolerance(cls, llamacpp_rounding);
    // A greedy step or top-1 is a near-tie when the reference's top-2 gap is below what our
    // errors could flip: the gap is a difference of two log-probs, each off by <= tol.
    const double near_tie = 2 * tol;
    Runner runner(backend, 12345);  // shuffled physical blocks

    double max_lp_err = 0, max_gap_err = 0, max_full_err = -1;
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
            for (auto [tok, ref_logit] : rp.top) {
                double err = std::abs((logits[i][tok] - lse) - (ref_logit - rp.logsumexp));
                max_lp_err = std::max(max_lp_err, err);
                CHECK_MESSAGE(err <= tol, "position " << i << " token " << tok);
            }
            if (rp.top[0].second - rp.top[1].second >= near_tie) {
                ++top1_checked;
                CHECK_MESSAGE(argmax(logits[i]) == rp.top[0].first, "position " << i);
            }
        }
        // Full-vocabulary check of the first prompt's raw logits.
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
            }
        }
        // (c): 48 greedy steps, fed the reference's tokens (teacher forcing), so every step
        // without a near-tie is checked, not only those before the first one. Up to the first
        // mismatch this is exactly free-running greedy decoding.
        Logits cur = logits.back();
        int free_prefix = -1;
        for (size_t s = 0; s < ref.greedy.size(); ++s) {
            CAPTURE(s);
            int32_t ours = argmax(cur);
            if (ours != ref.greedy[s] && free_prefix < 0) free_prefix = int(s);
            if (ref.gaps[s] >= near_tie) {
                ++greedy_checked;
                CHECK(ours == ref.greedy[s]);
                double gap_err = std::abs(top2_gap(cur) - ref.gaps[s]);
                max_gap_err = std::max(max_gap_err, gap_err);
                CHECK(gap_err <= 2 * tol);
            }
            if (s + 1 < ref.greedy.size()) cur = runner.step({{seq, ref.greedy[s]}})[0];
        }
        min_free_prefix = std::min(min_free_prefix, free_prefix < 0 ? 48 : free_prefix);
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    MESSAGE(
        fmt::format("{:<40} {:<6} logprob err {:.5f} (tol {:.3f})  gap err {:.5f}  "
                    "full-vocab logit err {:.5f}  top1 checked {}  greedy checked {}  "
                    "free greedy prefix >= {}  {:.2f}s",
                    stem, class_name(cls), max_lp_err, tol, max_gap_err, max_full_err, top1_checked,
                    greedy_checked, min_free_prefix, secs));
    return true;
}

void check_all_models(bool llamacpp_rounding) {
    auto models = test::shared_models();
    if (models.empty()) {
        MESSAGE("SKIP: ../shared not found (set KVRUN_SHARED); skipping real-model test");
        return;
    }
    int n_models = 0;
    for (const fs::path& model_path : models)
        n_models += check_against_reference(model_path, llamacpp_rounding);
    CHECK(n_models >= 44);
}

}  // namespace

// ---- acceptance against llama.cpp ----------------------------------------------------------

TEST_CASE("every shared model matches llama.cpp's logits and greedy tokens (float32)") {
    check_all_models(false);
}

TEST_CASE("with llama.cpp's activation rounding, every shared model matches it tightly") {
    check_all_models(true);
}

// ---- paging and batching invariance ---------------------------------------------------------

// The CPU ops compute each token from its own inputs in a fixed order, so the block size,
// block placement, prefill chunking and batch composition change nothing, not even rounding:
// these tests demand bit-identical logits.

TEST_CASE("paging is invisible: block sizes 1, 7, 16, 256 and chunked prefill agree exactly") {
    fs::path model = test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    auto prompts = load_reference(test::shared_dir() / "reference/logits/stories260K.jsonl");
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
        auto prompts = load_reference(test::shared_dir() / "reference/logits" /
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

// ---- load errors and bad batches on tiny hand-made models ----------------------------------

namespace {

// A tiny llama-like GGUF: 1 layer, n_embd 8, 2 heads / 1 KV head, n_ff 16, vocab 10, F32.
// `tweak` can edit the writer (add/replace keys) before tensors are added; `skip` names a
// tensor to leave out; `bad_shape` names a tensor to give a wrong second dimension.
std::vector<uint8_t> tiny_model(const std::string& arch, const std::string& skip = "",
                                const std::string& bad_shape = "", bool biases = false,
                                GgmlType q_type = GgmlType::F32) {
    GgufWriter w;
    w.set_string("general.architecture", arch);
    const std::string a = arch + ".";
    w.set_u32(a + "block_count", 1);
    w.set_u32(a + "embedding_length", 8);
    w.set_u32(a + "feed_forward_length", 16);
    w.set_u32(a + "attention.head_count", 2);
    w.set_u32(a + "attention.head_count_kv", 1);
    w.set_f32(a + "attention.layer_norm_rms_epsilon", 1e-5f);
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.0f, 0.3f);
    auto add = [&](const std::string& name, std::vector<int64_t> dims,
                   GgmlType type = GgmlType::F32) {
        if (name == skip) return;
        if (name == bad_shape) dims.back() += 1;
        int64_t n = 1;
        for (auto d : dims) n *= d;
        std::vector<float> v(n);
        for (auto& x : v) x = name.find("norm") != std::string::npos ? 1.0f : nd(rng);
        std::vector<uint8_t> bytes(ggml_row_bytes(type, dims[0]) * (n / dims[0]));
        if (type == GgmlType::F32)  // other types only test loading: their bytes stay zero
            std::memcpy(bytes.data(), v.data(), bytes.size());
        w.add_tensor(name, type, dims, bytes.data(), bytes.size());
    };
    add("token_embd.weight", {8, 10});
    add("output_norm.weight", {8});
    add("output.weight", {8, 10});
    add("blk.0.attn_norm.weight", {8});
    add("blk.0.attn_q.weight", {8, 8}, q_type);
    add("blk.0.attn_k.weight", {8, 4});
    add("blk.0.attn_v.weight", {8, 4});
    if (biases) {
        add("blk.0.attn_q.bias", {8});
        add("blk.0.attn_k.bias", {4});
        add("blk.0.attn_v.bias", {4});
    }
    add("blk.0.attn_output.weight", {8, 8});
    add("blk.0.ffn_norm.weight", {8});
    add("blk.0.ffn_gate.weight", {8, 16});
    add("blk.0.ffn_up.weight", {8, 16});
    add("blk.0.ffn_down.weight", {16, 8});
    return w.to_bytes();
}

std::string load_error(const std::vector<uint8_t>& bytes) {
    GgufFile f = GgufFile::from_memory(bytes.data(), bytes.size(), "tiny.gguf");
    try {
        BackendOptions opt;
        opt.n_kv_blocks = 4;
        make_cpu_backend(f, opt);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

bool contains(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("model config reads hyperparameters and defaults") {
    auto bytes = tiny_model("qwen2", "", "", true);
    GgufFile f = GgufFile::from_memory(bytes.data(), bytes.size(), "tiny.gguf");
    ModelConfig c = model_config_from_gguf(f);
    CHECK(c.arch == "qwen2");
    CHECK(c.n_layer == 1);
    CHECK(c.n_embd == 8);
    CHECK(c.head_dim == 4);
    CHECK(c.n_kv_head == 1);
    CHECK(c.n_rot == 4);
    CHECK(c.n_vocab == 10);
    CHECK(c.rope_freq_base == 10000.0f);
    CHECK(c.rope_neox);
    CHECK(c.qkv_bias);
    CHECK(load_error(bytes).empty());

    auto llama = tiny_model("llama");
    GgufFile fl = GgufFile::from_memory(llama.data(), llama.size(), "tiny.gguf");
    CHECK_FALSE(model_config_from_gguf(fl).rope_neox);
    // KV sizing: 1 layer x 1 KV head x 4 dims x (2 + 2) bytes = 16 bytes per token in f16.
    ModelConfig cl = model_config_from_gguf(fl);
    CHECK(kv_bytes_per_token(cl, KvType::F16, KvType::F16) == 16.0);
    BackendOptions o;
    o.kv_memory_mib = 1;
    CHECK(kv_block_bytes(cl, o) == 16 * 16);
    CHECK(kv_blocks_for(cl, o) == (1 << 20) / 256);
    o.kv_type_k = KvType::Q8;
    CHECK_THROWS_AS(kv_block_bytes(cl, o), Error);
}

TEST_CASE("load errors name the problem") {
    CHECK(contains(load_error(tiny_model("gpt2")),
                   "unsupported architecture 'gpt2' (supported: llama, qwen2)"));
    std::string e = load_error(tiny_model("llama", "blk.0.ffn_up.weight"));
    CHECK(contains(e, "missing tensor 'blk.0.ffn_up.weight'"));
    e = load_error(tiny_model("llama", "", "blk.0.attn_k.weight"));
    CHECK(contains(e, "'blk.0.attn_k.weight' has shape [8, 5], expected [8, 4]"));
    e = load_error(tiny_model("qwen2"));  // qwen2 needs Q/K/V biases
    CHECK(contains(e, "missing tensor 'blk.0.attn_q.bias'"));
    e = load_error(tiny_model("llama", "", "", false, GgmlType::I32));
    CHECK(contains(e, "'blk.0.attn_q.weight' has type"));
    // Tied output: no output.weight means the embedding table is reused.
    auto tied = tiny_model("llama", "output.weight");
    GgufFile f = GgufFile::from_memory(tied.data(), tied.size(), "tiny.gguf");
    BackendOptions opt;
    opt.n_kv_blocks = 4;
    CpuBackend backend(f, opt);
    CHECK(backend.weights().output_tied);
    CHECK(backend.weights().output.data == backend.weights().token_embd.data);
}

TEST_CASE("inconsistent forward batches are rejected before touching the cache") {
    auto bytes = tiny_model("llama");
    GgufFile f = GgufFile::from_memory(bytes.data(), bytes.size(), "tiny.gguf");
    BackendOptions opt;
    opt.kv_block_size = 2;
    opt.n_kv_blocks = 4;
    CpuBackend backend(f, opt);
    ForwardBatch good;
    good.tokens = {1, 2, 3};
    good.positions = {0, 1, 2};
    good.seq_index = {0, 0, 0};
    good.slots = {0, 1, 2};
    good.block_tables = {{3, 1}};
    good.logit_rows = {2};
    std::vector<float> logits(10);
    backend.forward(good, logits.data());
    CHECK(std::all_of(logits.begin(), logits.end(), [](float x) { return std::isfinite(x); }));

    auto bad = [&](auto edit) {
        ForwardBatch b = good;
        edit(b);
        CHECK_THROWS_AS(backend.forward(b, logits.data()), Error);
    };
    bad([](ForwardBatch& b) { b.tokens[1] = 10; });          // token outside the vocabulary
    bad([](ForwardBatch& b) { b.positions.pop_back(); });    // size mismatch
    bad([](ForwardBatch& b) { b.seq_index[0] = 1; });        // no such block table
    bad([](ForwardBatch& b) { b.slots[2] = 4; });            // past the sequence's blocks
    bad([](ForwardBatch& b) { b.block_tables[0][1] = 4; });  // block id outside the pool
    bad([](ForwardBatch& b) { b.logit_rows = {3}; });        // no such row
    bad([](ForwardBatch& b) { b.positions[0] = -1; });
}
