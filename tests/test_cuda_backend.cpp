// The CUDA backend vs the CPU backend on the shared models (float, legacy, K-quant and IQ4
// mixes; llama GQA/MQA and qwen2 with biases): prompt prefill (tensor-core GEMM path),
// decode steps (GEMV path, replayed from CUDA graphs after the first step), a two-sequence
// batch, copy-on-write block copies and input validation. Logits compared by normalized MSE.
// Exits 77 (skipped) without a GPU; skips a model when ../shared is absent.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "backend.h"
#include "common.h"
#include "cuda_test_util.h"
#include "gguf.h"
#include "test_util.h"

#ifdef KVRUN_HAS_CUDA
#include "cuda/cuda_backend.h"

using namespace kvrun;
using namespace kvrun::test;

namespace {

// f16 activations in the prefill GEMMs and f16 K/V on both sides leave small differences.
constexpr double kLogitBound = 1e-4;

const char* const kModels[] = {
    "stories260K.gguf",
    "stories260K-Q4_0.gguf",
    "stories260K-w256-Q4_K_M.gguf",
    "stories260K-w256-Q2_K.gguf",
    "stories260K-w256-IQ4_XS.gguf",
    "stories260K-w256-BF16.gguf",
    "synth-llama-hd64-gqa4-Q4_0.gguf",
    "synth-llama-hd128-mqa-theta500k-Q8_0.gguf",
    "synth-qwen2-hd64-gqa2-Q5_K_M.gguf",
};

// Runs the batch on both backends and returns nmse(gpu, cpu) of the logits; *next (when
// given) receives the CPU's argmax of the last logit row.
double compare(Backend& cpu, Backend& gpu, const ForwardBatch& b, int32_t* next = nullptr) {
    const size_t n_vocab = size_t(cpu.config().n_vocab);
    const size_t n = b.logit_rows.size() * n_vocab;
    std::vector<float> lc(n), lg(n);
    cpu.forward(b, lc.data());
    gpu.forward(b, lg.data());
    if (next) {
        const float* last = lc.data() + n - n_vocab;
        *next = int32_t(std::max_element(last, last + n_vocab) - last);
    }
    return nmse(lg, lc);
}

// `n` tokens of sequence `seq` starting at slot `pos`, logits for every row.
ForwardBatch batch_of(const std::vector<int32_t>& tokens, int32_t pos, int32_t seq,
                      std::vector<std::vector<int32_t>> tables) {
    ForwardBatch b;
    for (size_t i = 0; i < tokens.size(); ++i) {
        b.tokens.push_back(tokens[i]);
        b.positions.push_back(pos + int32_t(i));
        b.seq_index.push_back(seq);
        b.slots.push_back(pos + int32_t(i));
        b.logit_rows.push_back(int32_t(i));
    }
    b.block_tables = std::move(tables);
    return b;
}

}  // namespace

TEST_CASE("cuda backend logits match the cpu backend on the shared models") {
    for (const char* name : kModels) {
        CAPTURE(name);
        const auto path = shared_path(std::string("models/") + name);
        if (path.empty()) return;
        if (!std::filesystem::exists(path)) {
            MESSAGE("SKIP: missing " << path.string());
            continue;
        }
        GgufFile file = GgufFile::open(path.string());
        BackendOptions o;
        o.kv_block_size = 16;
        o.n_kv_blocks = 16;
        auto cpu = make_cpu_backend(file, o);
        auto gpu = make_cuda_backend(file, o, 0);
        const int64_t n_vocab = cpu->config().n_vocab;
        CHECK(gpu->config().n_vocab == n_vocab);
        CHECK(gpu->n_kv_blocks() == 16);
        CHECK(gpu->name() == "cuda");

        // Sequence 0: a 24-token prompt (GEMM path), then decode steps (GEMV + graphs).
        std::vector<int32_t> prompt;
        for (int32_t i = 0; i < 24; ++i) prompt.push_back(int32_t((i * 37 + 11) % n_vocab));
        const std::vector<std::vector<int32_t>> tables = {{3, 0, 5, 1}, {2, 7, 4, 6}};
        int32_t next = 0;
        CHECK(compare(*cpu, *gpu, batch_of(prompt, 0, 0, tables), &next) < kLogitBound);
        for (int32_t step = 0; step < 5; ++step) {
            CAPTURE(step);
            CHECK(compare(*cpu, *gpu, batch_of({next}, 24 + step, 0, tables), &next) < kLogitBound);
        }

        // Sequence 1: a 10-token prompt, then decode steps for both sequences in one batch
        // (two logit rows, in reverse order).
        std::vector<int32_t> p1;
        for (int32_t i = 0; i < 10; ++i) p1.push_back(int32_t((i * 53 + 5) % n_vocab));
        CHECK(compare(*cpu, *gpu, batch_of(p1, 0, 1, tables)) < kLogitBound);
        for (int rep = 0; rep < 3; ++rep) {  // eager, capture, replay
            ForwardBatch both;
            both.tokens = {next, int32_t(7 % n_vocab)};
            both.positions = {29, 10};
            both.seq_index = {0, 1};
            both.slots = {29, 10};
            both.block_tables = tables;
            both.logit_rows = {1, 0};
            CHECK(compare(*cpu, *gpu, both) < kLogitBound);
        }

        // Copy-on-write: block 3 (sequence 0's first) copied to block 9 serves the same keys.
        cpu->copy_blocks({{3, 9}});
        gpu->copy_blocks({{3, 9}});
        std::vector<std::vector<int32_t>> cow = tables;
        cow[0][0] = 9;
        CHECK(compare(*cpu, *gpu, batch_of({next}, 29, 0, cow)) < kLogitBound);

        // Bad input throws before touching the cache.
        std::vector<float> l(static_cast<size_t>(n_vocab));
        CHECK_THROWS_AS(gpu->forward(batch_of({int32_t(n_vocab)}, 30, 0, tables), l.data()), Error);
        CHECK_THROWS_AS(gpu->copy_blocks({{0, 16}}), Error);
    }
}

TEST_CASE("cuda backend refuses what its kernels cannot run, with a hint") {
    const auto path = shared_path("models/stories260K.gguf");
    if (path.empty()) return;
    GgufFile file = GgufFile::open(path.string());
    BackendOptions o;
    o.n_kv_blocks = 4;
    o.kv_type_k = KvType::Q8;
    CHECK_THROWS_AS(make_cuda_backend(file, o, 0), Error);
    o.kv_type_k = KvType::F16;
    CHECK_THROWS_AS(make_cuda_backend(file, o, cuda_device_count()), Error);
}

#endif  // KVRUN_HAS_CUDA
