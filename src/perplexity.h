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
    int32_t n_batch = 512;  // tokens per forward pass; a multiple of n_ctx runs whole chunks
                            // in one pass (as many as the KV pool holds)
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
    // llama-perplexity's fuller statistics (KL divergence mode), over the scored positions:
    double base_ppl_stderr = 0;
    double ln_ratio = 0, ln_ratio_stderr = 0;    // mean of ln p_base - ln p (= ln PPL ratio)
    double ppl_ratio = 0, ppl_ratio_stderr = 0;  // PPL / base PPL
    double ppl_delta_stderr = 0;                 // of ppl - base_ppl
    double nll_correlation = 0;  // Pearson correlation of the per-token NLLs of both runs
    // (quantile q in [0, 1], value): the KL divergence and Δp = p(correct token) - base
    // p(correct token), at 1, 0.999, 0.99, 0.95, 0.9, 0.5, 0.1, 0.05, 0.01, 0.001, 0.
    std::vector<std::pair<double, double>> kld_quantiles, dp_quantiles;
    double dp_mean = 0, dp_stderr = 0, dp_rms = 0;  // Δp, as fractions
    double top1_stderr = 0;
};

// Progress callback: (chunks done, total chunks, running PPL, seconds elapsed).
using PerplexityProgress = std::function<void(int32_t, int32_t, double, double)>;

// Runs the evaluation on `backend` (whose pool must hold n_ctx tokens). Throws Error when the
// text holds fewer than 2 * n_ctx tokens, or when the KLD base file doesn't match.
PerplexityResult perplexity_run(Backend& backend, const Tokenizer& tok, const std::string& text,
                                const PerplexityOptions& opt,
                                const PerplexityProgress& progress = {});

}  // namespace kvrun
