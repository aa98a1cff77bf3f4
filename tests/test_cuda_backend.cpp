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
#include "kv_block_table.h"
#include "kv_format.h"
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
    o.kv_block_size = 300;  // the kernels take blocks of at most 256 tokens
    CHECK_THROWS_AS(make_cuda_backend(file, o, 0), Error);
    o.kv_block_size = 16;
    CHECK_THROWS_AS(make_cuda_backend(file, o, cuda_device_count()), Error);
}

TEST_CASE("cuda backend with a q8 / q4 KV cache matches the cpu backend") {
    for (const char* name : {"stories260K.gguf", "synth-llama-hd64-gqa4-Q4_0.gguf",
                             "synth-llama-hd128-mqa-theta500k-Q8_0.gguf"})
        for (KvType kv : {KvType::Q8, KvType::Q4})
            for (bool rotate : {false, true}) {
                CAPTURE(name);
                CAPTURE(kv_type_name(kv));
                CAPTURE(rotate);
                const auto path = shared_path(std::string("models/") + name);
                if (path.empty()) return;
                if (!std::filesystem::exists(path)) {
                    MESSAGE("SKIP: missing " << path.string());
                    continue;
                }
                GgufFile file = GgufFile::open(path.string());
                BackendOptions o;
                o.kv_block_size = 16;
                o.n_kv_blocks = 24;
                o.kv_type_k = o.kv_type_v = kv;
                o.kv_rotate = rotate;
                auto cpu = make_cpu_backend(file, o);
                auto gpu = make_cuda_backend(file, o, 0);
                REQUIRE(gpu->n_kv_stages() == cpu->n_kv_stages());
                REQUIRE(cpu->n_kv_stages() > 0);
                // One table drives both backends: a 40-token prompt, decode steps, a fork that
                // copies the partly filled block's stage, and both continuing in one batch.
                KvBlockTable table(24, 16, cpu->n_kv_stages());
                const int64_t n_vocab = cpu->config().n_vocab;
                auto step = [&](const std::vector<std::pair<SeqId, std::vector<TokenId>>>& parts,
                                int32_t* next) {
                    ForwardBatch fb;
                    std::vector<int32_t> starts;
                    for (auto& [seq, toks] : parts) {
                        starts.push_back(table.n_tokens(seq));
                        REQUIRE(table.append(seq, toks));
                    }
                    auto copies = table.take_pending_copies();
                    if (!copies.empty()) {
                        cpu->copy_blocks(copies);
                        gpu->copy_blocks(copies);
                    }
                    for (size_t i = 0; i < parts.size(); ++i) {
                        fb.add_sequence(table, parts[i].first, starts[i],
                                        int32_t(parts[i].second.size()));
                        fb.logit_rows.push_back(int32_t(fb.tokens.size()) - 1);
                    }
                    return compare(*cpu, *gpu, fb, next);
                };
                SeqId a = table.create_sequence();
                std::vector<TokenId> prompt;
                for (int32_t i = 0; i < 40; ++i) prompt.push_back(TokenId((i * 37 + 11) % n_vocab));
                int32_t next = 0;
                CHECK(step({{a, prompt}}, &next) < kLogitBound);
                for (int i = 0; i < 30; ++i) CHECK(step({{a, {next}}}, &next) < kLogitBound);
                SeqId f = table.fork(a);
                for (int i = 0; i < 4; ++i)
                    CHECK(step({{a, {next}}, {f, {TokenId((next + i) % n_vocab)}}}, &next) <
                          kLogitBound);
            }
}

TEST_CASE("cuda forward_sample returns the tokens the host sampler picks from the same logits") {
    const auto path = shared_path("models/stories260K.gguf");
    if (path.empty()) return;
    GgufFile file = GgufFile::open(path.string());
    BackendOptions o;
    o.n_kv_blocks = 16;
    auto cpu = make_cpu_backend(file, o);
    auto gpu = make_cuda_backend(file, o, 0);
    CHECK(gpu->samples_on_device());
    CHECK_FALSE(cpu->samples_on_device());
    // Two sequences; rows: greedy, greedy with a repetition penalty, and sampled rows with
    // the filters on and off, at several uniform numbers.
    std::vector<int32_t> p0 = {1, 403, 407, 261, 378}, p1 = {1, 500, 12, 77};
    const std::vector<std::vector<int32_t>> tables = {{0, 1}, {2, 3}};
    ForwardBatch b = batch_of(p0, 0, 0, tables);
    ForwardBatch b1 = batch_of(p1, 0, 1, tables);
    for (size_t i = 0; i < p1.size(); ++i) {
        b.tokens.push_back(b1.tokens[i]);
        b.positions.push_back(b1.positions[i]);
        b.seq_index.push_back(1);
        b.slots.push_back(b1.slots[i]);
        b.logit_rows.push_back(int32_t(p0.size() + i));
    }
    std::vector<RowSampling> rows(b.logit_rows.size());
    for (size_t r = 0; r < rows.size(); ++r) {
        SamplingParams& sp = rows[r].params;
        sp.seed = r;
        sp.temperature = r % 3 == 0 ? 0.0f : 0.9f;
        if (r % 3 == 2) sp.top_k = 0, sp.top_p = 1.0f, sp.min_p = 0.0f;  // filters off
        if (r % 2 == 1) sp.repeat_penalty = 1.3f;
        rows[r].u = double(r) / double(rows.size()) + 0.01;
        rows[r].recent = {403, 261, 13, 403};
    }
    std::vector<int32_t> tc(rows.size()), tg(rows.size());
    cpu->forward_sample(b, rows, tc.data());
    gpu->forward_sample(b, rows, tg.data());
    CHECK(tc == tg);
    rows.pop_back();
    CHECK_THROWS_AS(gpu->forward_sample(b, rows, tg.data()), Error);
}

#endif  // KVRUN_HAS_CUDA
