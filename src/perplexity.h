// Perplexity with llama.cpp's method, and KL divergence against a saved reference run.
// Method: tokenize the whole text with BOS, cut it into chunks of n_ctx tokens, put BOS as
// each chunk's first token, and score the last n_ctx/2 predictions of each chunk.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend.h"
#include "tokenizer.h"

namespace kvrun {

struct PerplexityOptions {
    int32_t n_ctx = 512;
    int32_t n_batch = 512;  // tokens per forward pass (<= n_ctx)
    int32_t n_chunks = -1;  // -1: all chunks the text holds
    std::string kld_save;   // write the per-token log-probabilities here
    std::string kld_base;   // compare against log-probabilities saved earlier
};

struct PerplexityResult {
    int32_t n_chunks = 0;
    int64_t n_scored = 0;
    double ppl = 0, ppl_stderr = 0;  // exp(mean NLL) and its error as llama.cpp reports it
    double mean_nll = 0;
    std::vector<double> chunk_ppl;  // running PPL after each chunk
    // KL divergence mode (when kld_base is set).
    bool has_kld = false;
    double kld_mean = 0, kld_max = 0, kld_p99 = 0, kld_stderr = 0;
    double top1_agreement = 0;  // fraction of positions with the same argmax
    double base_ppl = 0;        // PPL of the reference run
};

// Progress callback: (chunks done, total chunks, running PPL, seconds elapsed).
using PerplexityProgress = std::function<void(int32_t, int32_t, double, double)>;

// Runs the evaluation on `backend` (whose pool must hold n_ctx tokens). Throws Error when the
// text holds fewer than 2 * n_ctx tokens, or when the KLD base file doesn't match.
PerplexityResult perplexity_run(Backend& backend, const Tokenizer& tok, const std::string& text,
                                const PerplexityOptions& opt,
                                const PerplexityProgress& progress = {});

}  // namespace kvrun
