// Speculative verification on the GPU must not change the target's output: one pass over
// the K+1 tokens of a sequence has to give, row for row, the logits that K+1 single-token
// decode steps give — bit for bit, not within a tolerance — so that greedy speculative
// decoding on the GPU equals the target alone even at near-ties. Exits 77 (skipped) without
// a GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "backend.h"
#include "common.h"
#include "cuda_test_util.h"
#include "gguf.h"
#include "kv_block_table.h"
#include "kv_format.h"
#include "test_util.h"

#ifdef KVRUN_HAS_CUDA
#include "cuda/cuda_backend.h"
#include "cuda/ops.h"

using namespace kvrun;
using namespace kvrun::test;

namespace {

constexpr int32_t kBlockSize = 16;
constexpr int32_t kBlocks = 64;
constexpr int32_t kVerifyRows = 9;  // --draft-n 8 (the default): 8 drafted tokens + 1

// A backend and the block table that drives it.
struct Side {
    std::unique_ptr<Backend> backend;
    KvBlockTable table;
    SeqId seq;

    Side(const GgufFile& file, const BackendOptions& o)
        : backend(make_cuda_backend(file, o, 0)),
          table(kBlocks, kBlockSize, backend->n_kv_stages()),
          seq(table.create_sequence()) {}

    // Appends `tokens` to `seq` and runs one pass; returns the logits of every row.
    std::vector<float> pass(const std::vector<TokenId>& tokens, bool all_rows) {
        const int32_t start = table.n_tokens(seq);
        REQUIRE(table.append(seq, tokens));
        kv_apply_pending(table, *backend);
        ForwardBatch fb;
        fb.add_sequence(table, seq, start, int32_t(tokens.size()));
        for (int32_t i = all_rows ? 0 : int32_t(tokens.size()) - 1; i < int32_t(tokens.size()); ++i)
            fb.logit_rows.push_back(i);
        std::vector<float> out(fb.logit_rows.size() * size_t(backend->config().n_vocab));
        backend->forward(fb, out.data());
        return out;
    }
};

// The logits of one decode step per token of `draft`, one after another.
std::vector<float> decode_steps(Side& side, const std::vector<TokenId>& draft) {
    std::vector<float> out;
    for (TokenId t : draft) {
        const std::vector<float> row = side.pass({t}, false);
        out.insert(out.end(), row.begin(), row.end());
    }
    return out;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    float m = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
    return m;
}

// The options of every backend here: kBlocks blocks of kBlockSize tokens.
BackendOptions test_options() {
    BackendOptions o;
    o.kv_block_size = kBlockSize;
    o.n_kv_blocks = kBlocks;
    return o;
}

// The tests' token streams: a prompt of `depth` tokens and a draft of kVerifyRows.
std::vector<TokenId> test_prompt(int64_t n_vocab, int32_t depth) {
    std::vector<TokenId> t;
    for (int32_t i = 0; i < depth; ++i) t.push_back(TokenId((i * 37 + 11) % n_vocab));
    return t;
}
std::vector<TokenId> test_draft(int64_t n_vocab) {
    std::vector<TokenId> t;
    for (int32_t i = 0; i < kVerifyRows; ++i) t.push_back(TokenId((i * 91 + 3) % n_vocab));
    return t;
}

// Prefills test_prompt(depth) on two backends (the same cache on both), then runs the draft
// as kVerifyRows decode steps on one and as one verification pass on the other, and checks
// that the pass gives the steps' logits bit for bit; with `then_decode`, also one more step
// on each. Returns the steps' logits.
std::vector<float> check_pass_equals_steps(const GgufFile& file, const BackendOptions& o,
                                           int32_t depth, bool then_decode = false) {
    Side steps(file, o), verify(file, o);
    const int64_t n_vocab = steps.backend->config().n_vocab;
    const std::vector<TokenId> prompt = test_prompt(n_vocab, depth), draft = test_draft(n_vocab);
    CHECK(steps.pass(prompt, false) == verify.pass(prompt, false));
    const std::vector<float> one_by_one = decode_steps(steps, draft);
    const std::vector<float> together = verify.pass(draft, true);
    REQUIRE(together.size() == size_t(kVerifyRows) * size_t(n_vocab));
    CHECK_MESSAGE(
        std::memcmp(together.data(), one_by_one.data(), together.size() * sizeof(float)) == 0,
        "max |diff| " << max_abs_diff(together, one_by_one));
    if (then_decode)  // decoding on after the verification pass stays identical too
        CHECK(steps.pass({draft[0]}, false) == verify.pass({draft[0]}, false));
    return one_by_one;
}

}  // namespace

TEST_CASE("cuda: a K+1-token pass gives the logits of K+1 decode steps, bit for bit") {
    for (const char* name : {"stories260K-w256-Q4_K_M.gguf", "synth-llama-hd64-gqa4-Q4_0.gguf",
                             "synth-llama-hd128-mqa-theta500k-Q8_0.gguf"})
        for (KvType kv : {KvType::F16, KvType::Q8, KvType::Q4})
            for (int32_t depth : {40, 300}) {  // 300: long enough for split attention
                CAPTURE(name);
                CAPTURE(kv_type_name(kv));
                CAPTURE(depth);
                const auto path = shared_model(name);
                if (path.empty()) continue;
                GgufFile file = GgufFile::open(path.string());
                BackendOptions o = test_options();
                o.kv_type_k = o.kv_type_v = kv;
                check_pass_equals_steps(file, o, depth, /*then_decode=*/true);
            }
}

TEST_CASE("cuda: with the 8- and 16-bit activation GEMVs too (KVRUN_GEMV=q8|q16), near f32") {
    for (const int bits : {8, 16})
        for (const char* name : {"stories260K-w256-Q4_K_M.gguf", "synth-llama-hd64-gqa4-Q4_0.gguf",
                                 "synth-llama-hd128-mqa-theta500k-Q8_0.gguf"}) {
            CAPTURE(bits);
            CAPTURE(name);
            const auto path = shared_model(name);
            if (path.empty()) continue;
            GgufFile file = GgufFile::open(path.string());
            const BackendOptions o = test_options();
            Side f32(file, o);  // the default path, for the distance
            if (bits == 8)
                cuda_set_gemv_q8(true);
            else
                cuda_set_gemv_q16(true);
            const std::vector<float> one_by_one = check_pass_equals_steps(file, o, 40);
            cuda_set_gemv_q8(false);
            // The same steps on the f32 path: logits within x's rounding.
            const int64_t n_vocab = f32.backend->config().n_vocab;
            f32.pass(test_prompt(n_vocab, 40), false);
            const std::vector<float> ref = decode_steps(f32, test_draft(n_vocab));
            const double d = nmse(one_by_one, ref);
            MESSAGE(bits << "-bit x: logits NMSE " << d << " against the f32 GEMV");
            CHECK(d < (bits == 8 ? 1e-3 : 1e-6));
            CHECK(d > 0.0);
        }
}

TEST_CASE("cuda: with GEMV split-K too (KVRUN_GEMV_SPLIT), a K+1 pass gives the steps' bits") {
    for (const char* name : {"synth-llama-hd64-gqa4-Q4_0.gguf", "stories260K-w256-Q4_K_M.gguf"})
        for (int split : {0, 4}) {
            CAPTURE(name);
            CAPTURE(split);
            const auto path = shared_model(name);
            if (path.empty()) continue;
            GgufFile file = GgufFile::open(path.string());
            const BackendOptions o = test_options();
            cuda_set_gemv_split(split);
            check_pass_equals_steps(file, o, 40);
        }
    cuda_set_gemv_split(1);
}

TEST_CASE("cuda: programmatic dependent launch and the GEMV prefetch keep every bit") {
    // KVRUN_PDL=on lets a kernel start before its predecessor ends (each waits in
    // cu::pdl_wait before touching activations); a kernel that read or wrote too early would
    // change the logits. The same prompt pass and decode steps with the switches off and on
    // must agree bit for bit, with f16 and q8 KV (q8 adds the sealing kernels) and with the
    // 8-bit GEMV (its x quantization kernel). On a GPU below sm_90 the switch stays off.
    for (const char* name : {"synth-llama-hd64-gqa4-Q4_0.gguf", "stories260K-w256-Q4_K_M.gguf",
                             "synth-qwen2-hd64-gqa2-Q5_K_M.gguf"}) {
        const auto path = shared_model(name);
        if (path.empty()) continue;
        GgufFile file = GgufFile::open(path.string());
        for (KvType kv : {KvType::F16, KvType::Q8})
            for (bool q8 : {false, true}) {
                CAPTURE(name);
                CAPTURE(kv_type_name(kv));
                CAPTURE(q8);
                BackendOptions o = test_options();
                o.kv_type_k = o.kv_type_v = kv;
                cuda_set_gemv_q8(q8);
                auto run = [&](bool on) {
                    cuda_set_pdl(on);
                    cuda_set_gemv_prefetch(on);
                    Side side(file, o);
                    const int64_t n_vocab = side.backend->config().n_vocab;
                    const std::vector<TokenId> prompt = test_prompt(n_vocab, 40),
                                               draft = test_draft(n_vocab);
                    std::vector<float> out = side.pass(prompt, true);
                    const std::vector<float> steps = decode_steps(side, draft);
                    out.insert(out.end(), steps.begin(), steps.end());
                    const std::vector<float> verify = side.pass(draft, true);
                    out.insert(out.end(), verify.begin(), verify.end());
                    return out;
                };
                const std::vector<float> off = run(false), on = run(true);
                REQUIRE(off.size() == on.size());
                CHECK_MESSAGE(std::memcmp(off.data(), on.data(), off.size() * sizeof(float)) == 0,
                              "max |diff| " << max_abs_diff(off, on));
            }
    }
    cuda_set_gemv_q8(false);
    cuda_set_pdl(false);
    cuda_set_gemv_prefetch(false);
}

#endif  // KVRUN_HAS_CUDA
