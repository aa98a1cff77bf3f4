// Helpers shared by the CUDA backend tests (test_cuda_backend.cpp, test_cuda_arch.cpp): the
// logit bounds, a batch run on both backends compared by normalized MSE, and steps of a
// KvBlockTable driving several backends.
#pragma once

#include <algorithm>
#include <initializer_list>
#include <utility>
#include <vector>

#include "backend.h"
#include "cuda_test_util.h"
#include "kv_block_table.h"
#include "kv_format.h"
#include "test_util.h"

#ifdef KVRUN_HAS_CUDA

namespace kvrun::test {

// f16 activations in the prefill GEMMs and f16 K/V on both sides leave small differences.
inline constexpr double kLogitBound = 1e-4;
// A q4 cache amplifies them: a K/V value that the f16 GEMM moves by an ulp can land on the
// other side of a 4-bit rounding step (a step is 1/8 of the group's largest magnitude).
// Measured under tools/cuda-emu on synth-llama-hd64-gqa4-Q4_0: nmse vs the CPU 1e-7 with f16
// KV, 3e-6 with q8, 1e-4 to 2.3e-4 with q4; with F32 weights (an exact f32 GEMM) q4 is 1e-8.
inline constexpr double kLogitBoundQ4 = 1e-3;

inline double logit_bound(KvType kv) {
    return kv == KvType::Q4 ? kLogitBoundQ4 : kLogitBound;
}

// Runs the batch on both backends and returns nmse(gpu, cpu) of the logits; *next (when
// given) receives the CPU's argmax of the last logit row.
inline double compare(Backend& cpu, Backend& gpu, const ForwardBatch& b, int32_t* next = nullptr) {
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

using StepParts = std::vector<std::pair<SeqId, std::vector<TokenId>>>;

// One step driven by `table` for several backends: appends each part's tokens to its
// sequence, hands the queued block copies (which also closes the pass for stage reclaiming)
// to every backend, and returns the batch of those tokens with each part's last token as a
// logit row.
inline ForwardBatch append_step(KvBlockTable& table, const StepParts& parts,
                                std::initializer_list<Backend*> backends) {
    std::vector<int32_t> starts;
    for (const auto& [seq, toks] : parts) {
        starts.push_back(table.n_tokens(seq));
        REQUIRE(table.append(seq, toks));
    }
    const std::vector<BlockCopy> copies = table.take_pending_copies();
    if (!copies.empty())
        for (Backend* be : backends) be->copy_blocks(copies);
    ForwardBatch fb;
    for (size_t i = 0; i < parts.size(); ++i) {
        fb.add_sequence(table, parts[i].first, starts[i], int32_t(parts[i].second.size()));
        fb.logit_rows.push_back(int32_t(fb.tokens.size()) - 1);
    }
    return fb;
}

// The 24-token prompt the cases below prefill.
inline std::vector<TokenId> prompt24() {
    std::vector<TokenId> toks;
    for (int32_t i = 0; i < 24; ++i) toks.push_back((i * 37 + 11) % 512);
    return toks;
}

// Prefills prompt24() into sequence `seq` (one GEMM pass), then n_decode steps of the token
// the CPU picked (GEMV, graphs), checking every step's logits against `bound`. Returns the
// next token.
inline int32_t check_prefill_decode(Backend& cpu, Backend& gpu, KvBlockTable& table, SeqId seq,
                                    int n_decode, double bound) {
    int32_t next = 0;
    CHECK(compare(cpu, gpu, append_step(table, {{seq, prompt24()}}, {&cpu, &gpu}), &next) < bound);
    for (int step = 0; step < n_decode; ++step)
        CHECK(compare(cpu, gpu, append_step(table, {{seq, {next}}}, {&cpu, &gpu}), &next) < bound);
    return next;
}

// `n` tokens of sequence `seq` starting at slot `pos`, logits for every row.
inline ForwardBatch batch_of(const std::vector<int32_t>& tokens, int32_t pos, int32_t seq,
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

}  // namespace kvrun::test

#endif  // KVRUN_HAS_CUDA
