// Perplexity and KL-divergence evaluation over chunks of a text (llama.cpp's method).
//
// KLD file format (little-endian), written by --kld-save and read by --kld:
//   char[8]  magic "KVRKLD02"
//   u32      n_vocab, n_ctx, n_chunks, n_scored_per_chunk
//   then per chunk: i32 tokens[n_ctx] (the chunk's tokens, BOS first), followed by
//   n_scored_per_chunk rows of n_vocab f32 log-probabilities (log-softmax of the logits at
//   positions n_ctx/2 .. n_ctx-2). f32, not f16: f16 rounding alone puts a floor of ~5e-5
//   under the mean KLD, too close to the 1e-3 budget of an INT8 KV cache. The cost is
//   4 x n_vocab bytes per scored token (5 MB for a 512-token vocabulary and 20 chunks of 256).
#include "perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <tuple>

#include "common.h"
#include "kv_block_table.h"
#include "stdio_file.h"

namespace kvrun {
namespace {

constexpr char kKldMagic[8] = {'K', 'V', 'R', 'K', 'L', 'D', '0', '2'};

void read_all(FILE* f, void* p, size_t n, const std::string& path) {
    if (std::fread(p, 1, n, f) != n) fail("'{}' is truncated or not a kvrun KLD file", path);
}

// log-softmax of logits[n] into out[n]; returns logsumexp.
double log_softmax(const float* logits, int64_t n, float* out) {
    float mx = logits[0];
    for (int64_t i = 1; i < n; ++i) mx = std::max(mx, logits[i]);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += std::exp(double(logits[i]) - mx);
    const double lse = mx + std::log(sum);
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(logits[i] - lse);
    return lse;
}

// Mean and standard error of the mean of x.
std::pair<double, double> mean_stderr(const std::vector<double>& x) {
    const double n = double(x.size());
    double sum = 0, sum2 = 0;
    for (double v : x) sum += v, sum2 += v * v;
    const double mean = sum / n, var = sum2 / n - mean * mean;
    return {mean, var > 0 && n > 1 ? std::sqrt(var / (n - 1)) : 0.0};
}

// The value at quantile q of sorted values (nearest rank below).
double quantile(const std::vector<double>& sorted, double q) {
    const size_t i = static_cast<size_t>(q * double(sorted.size() - 1) + 0.5);
    return sorted[std::min(i, sorted.size() - 1)];
}

// llama-perplexity's comparison block: PPL ratio and difference with their errors, the NLLs'
// correlation, KL divergence and Δp quantiles, Δp mean and RMS, the top-1 agreement's error.
void comparison_statistics(PerplexityResult& r, const std::vector<double>& nll,
                           const std::vector<double>& base_nll, std::vector<double> kld,
                           std::vector<double> dp) {
    const size_t n = nll.size();
    if (n == 0) return;
    std::vector<double> d(n);
    for (size_t i = 0; i < n; ++i) d[i] = nll[i] - base_nll[i];
    std::tie(r.ln_ratio, r.ln_ratio_stderr) = mean_stderr(d);
    r.ppl_ratio = std::exp(r.ln_ratio);
    r.ppl_ratio_stderr = r.ppl_ratio * r.ln_ratio_stderr;
    const auto [mq, eq] = mean_stderr(nll);
    const auto [mb, eb] = mean_stderr(base_nll);
    r.base_ppl_stderr = r.base_ppl * eb;
    double cov = 0, vq = 0, vb = 0;
    for (size_t i = 0; i < n; ++i) {
        cov += (nll[i] - mq) * (base_nll[i] - mb);
        vq += (nll[i] - mq) * (nll[i] - mq);
        vb += (base_nll[i] - mb) * (base_nll[i] - mb);
    }
    r.nll_correlation = vq > 0 && vb > 0 ? cov / std::sqrt(vq * vb) : 1.0;
    // Delta method: var(e^a - e^b) from the means' errors and their covariance.
    const double cov_means = n > 1 ? cov / double(n) / double(n - 1) : 0.0;
    const double var_delta = r.ppl * r.ppl * eq * eq + r.base_ppl * r.base_ppl * eb * eb -
                             2 * r.ppl * r.base_ppl * cov_means;
    r.ppl_delta_stderr = var_delta > 0 ? std::sqrt(var_delta) : 0.0;
    std::tie(r.dp_mean, r.dp_stderr) = mean_stderr(dp);
    double sq = 0;
    for (double v : dp) sq += v * v;
    r.dp_rms = std::sqrt(sq / double(n));
    const double p = r.top1_agreement;
    r.top1_stderr = n > 1 ? std::sqrt(p * (1 - p) / double(n - 1)) : 0.0;
    std::sort(kld.begin(), kld.end());
    std::sort(dp.begin(), dp.end());
    for (double q : {1.0, 0.999, 0.99, 0.95, 0.9, 0.5, 0.1, 0.05, 0.01, 0.001, 0.0}) {
        r.kld_quantiles.emplace_back(q, quantile(kld, q));
        r.dp_quantiles.emplace_back(q, quantile(dp, q));
    }
}

}  // namespace

PerplexityResult perplexity_run(Backend& backend, const Tokenizer& tok, const std::string& text,
                                const PerplexityOptions& opt, const PerplexityProgress& progress) {
    const int32_t n_ctx = opt.n_ctx;
    if (n_ctx < 4) fail("perplexity needs a context of at least 4 tokens (got {})", n_ctx);
    const int32_t n_batch = std::min(std::max(1, opt.n_batch), n_ctx);
    // Whole chunks per forward pass when -b holds several (llama.cpp's n_seq = n_batch / n_ctx):
    // each its own sequence, the same numbers as one at a time (a token's arithmetic does not
    // depend on the rest of the batch), fewer passes.
    int32_t n_par = std::max(1, opt.n_batch / n_ctx);
    const int64_t n_vocab = backend.config().n_vocab;

    std::vector<TokenId> tokens = tok.encode(text, /*add_bos=*/tok.bos() >= 0);
    const int64_t max_chunks = static_cast<int64_t>(tokens.size()) / n_ctx;
    if (max_chunks < 2)
        throw Error(fmt::format("the text has {} tokens; perplexity with -c {} needs at least {}",
                                tokens.size(), n_ctx, 2 * n_ctx),
                    "use a longer text or a smaller -c");
    const int32_t n_chunks = static_cast<int32_t>(
        opt.n_chunks < 0 ? max_chunks : std::min<int64_t>(opt.n_chunks, max_chunks));
    const int32_t first = n_ctx / 2;
    const int32_t n_scored = n_ctx - 1 - first;

    KvBlockTable table = kv_table_for(backend);
    if (table.n_blocks() * int64_t(table.block_size()) < n_ctx)
        throw Error(fmt::format("the KV pool holds {} tokens, less than -c {}",
                                table.n_blocks() * int64_t(table.block_size()), n_ctx),
                    "give a larger --kv-memory");
    const int64_t blocks_per_chunk = (n_ctx + table.block_size() - 1) / table.block_size();
    n_par = static_cast<int32_t>(
        std::clamp<int64_t>(table.n_blocks() / blocks_per_chunk, 1, std::min(n_par, n_chunks)));

    FilePtr save, base;
    if (!opt.kld_save.empty()) {
        save.reset(std::fopen(opt.kld_save.c_str(), "wb"));
        if (!save) fail("cannot create '{}'", opt.kld_save);
        uint32_t hdr[4] = {uint32_t(n_vocab), uint32_t(n_ctx), uint32_t(n_chunks),
                           uint32_t(n_scored)};
        write_all(save.get(), kKldMagic, 8, opt.kld_save);
        write_all(save.get(), hdr, sizeof hdr, opt.kld_save);
    }
    if (!opt.kld_base.empty()) {
        base.reset(std::fopen(opt.kld_base.c_str(), "rb"));
        if (!base) fail("cannot open KLD base file '{}'", opt.kld_base);
        char magic[8];
        uint32_t hdr[4];
        read_all(base.get(), magic, 8, opt.kld_base);
        if (std::memcmp(magic, kKldMagic, 8) != 0)
            fail("'{}' is not a kvrun KLD file (bad magic)", opt.kld_base);
        read_all(base.get(), hdr, sizeof hdr, opt.kld_base);
        if (hdr[0] != n_vocab || hdr[1] != uint32_t(n_ctx) || hdr[3] != uint32_t(n_scored))
            fail(
                "KLD base '{}' was made with n_vocab {} and -c {}; this run has n_vocab {} and -c "
                "{}",
                opt.kld_base, hdr[0], hdr[1], n_vocab, n_ctx);
        if (hdr[2] < uint32_t(n_chunks))
            fail("KLD base '{}' holds {} chunks; this run needs {}", opt.kld_base, hdr[2],
                 n_chunks);
    }

    PerplexityResult res;
    res.n_chunks = n_chunks;
    double nll_sum = 0, nll2_sum = 0;
    double base_nll_sum = 0, kld_sum = 0, kld2_sum = 0;
    int64_t count = 0, agree = 0;
    std::vector<double> klds, nlls, base_nlls, dps;
    std::vector<float> logits(static_cast<size_t>(std::max(n_batch, n_par * n_scored)) *
                              size_t(n_vocab));
    std::vector<float> all_logp(static_cast<size_t>(n_par) * n_scored * n_vocab);
    std::vector<float> base_logp(n_vocab);
    std::vector<int32_t> base_tokens(n_ctx);
    const auto t0 = std::chrono::steady_clock::now();

    // Scores chunk c's predictions (logp: [n_scored][n_vocab]), saves or compares them, and
    // reports progress.
    auto score_chunk = [&](int32_t c, const std::vector<TokenId>& chunk, const float* logp) {
        if (save) write_all(save.get(), chunk.data(), sizeof(int32_t) * n_ctx, opt.kld_save);
        if (base) {
            read_all(base.get(), base_tokens.data(), sizeof(int32_t) * n_ctx, opt.kld_base);
            if (!std::equal(base_tokens.begin(), base_tokens.end(), chunk.begin()))
                fail("KLD base '{}' was made from a different text (chunk {} differs)",
                     opt.kld_base, c);
        }
        for (int32_t j = 0; j < n_scored; ++j) {
            const float* lp = logp + size_t(j) * n_vocab;
            const TokenId target = tokens[int64_t(c) * n_ctx + first + j + 1];
            const double nll = -double(lp[target]);
            nll_sum += nll;
            nll2_sum += nll * nll;
            ++count;
            if (save) {
                write_all(save.get(), lp, sizeof(float) * n_vocab, opt.kld_save);
            }
            if (base) {
                read_all(base.get(), base_logp.data(), sizeof(float) * n_vocab, opt.kld_base);
                double kld = 0;
                int64_t arg_base = 0, arg_new = 0;
                for (int64_t v = 0; v < n_vocab; ++v) {
                    const double pb = std::exp(double(base_logp[v]));
                    kld += pb * (double(base_logp[v]) - double(lp[v]));
                    if (base_logp[v] > base_logp[arg_base]) arg_base = v;
                    if (lp[v] > lp[arg_new]) arg_new = v;
                }
                kld = std::max(0.0, kld);
                kld_sum += kld;
                kld2_sum += kld * kld;
                klds.push_back(kld);
                agree += arg_base == arg_new;
                base_nll_sum += -double(base_logp[target]);
                nlls.push_back(nll);
                base_nlls.push_back(-double(base_logp[target]));
                dps.push_back(std::exp(double(lp[target])) - std::exp(double(base_logp[target])));
            }
        }
        const double running = std::exp(nll_sum / count);
        res.chunk_ppl.push_back(running);
        if (progress) {
            double secs = seconds_since(t0);
            progress(c + 1, n_chunks, running, secs);
        }
    };
    auto chunk_tokens = [&](int32_t c) {
        std::vector<TokenId> chunk(tokens.begin() + int64_t(c) * n_ctx,
                                   tokens.begin() + int64_t(c + 1) * n_ctx);
        if (tok.bos() >= 0) chunk[0] = tok.bos();
        return chunk;
    };
    for (int32_t c0 = 0; c0 < n_chunks; c0 += n_par) {
        const int32_t group = std::min(n_par, n_chunks - c0);
        if (group > 1) {  // whole chunks, one pass
            std::vector<SeqId> seqs;
            ForwardBatch fb;
            for (int32_t g = 0; g < group; ++g) {
                const std::vector<TokenId> chunk = chunk_tokens(c0 + g);
                seqs.push_back(table.create_sequence());
                if (!table.append(seqs.back(), chunk))
                    fail("KV pool exhausted during perplexity (pool too small for -c {})", n_ctx);
            }
            kv_apply_pending(table, backend);
            for (int32_t g = 0; g < group; ++g) {
                const int32_t offset = static_cast<int32_t>(fb.tokens.size());
                fb.add_sequence(table, seqs[size_t(g)], 0, n_ctx);
                for (int32_t pos = first; pos <= n_ctx - 2; ++pos)
                    fb.logit_rows.push_back(offset + pos);
            }
            backend.forward(fb, logits.data());
            for (size_t r = 0; r < fb.logit_rows.size(); ++r)
                log_softmax(logits.data() + r * n_vocab, n_vocab, all_logp.data() + r * n_vocab);
            for (SeqId s : seqs) table.free_sequence(s);
        } else {  // one chunk in passes of -b tokens
            const std::vector<TokenId> chunk = chunk_tokens(c0);
            SeqId seq = table.create_sequence();
            for (int32_t start = 0; start < n_ctx; start += n_batch) {
                const int32_t n = std::min(n_batch, n_ctx - start);
                if (!table.append(seq, n, chunk.data() + start))
                    fail("KV pool exhausted during perplexity (pool too small for -c {})", n_ctx);
                kv_apply_pending(table, backend);
                ForwardBatch fb;
                fb.add_sequence(table, seq, start, n);
                for (int32_t i = 0; i < n; ++i)  // rows first .. n_ctx-2 are scored
                    if (start + i >= first && start + i <= n_ctx - 2) fb.logit_rows.push_back(i);
                if (fb.logit_rows.empty()) {
                    // Still run the pass to fill the cache; ask for one row we ignore.
                    fb.logit_rows.push_back(n - 1);
                }
                backend.forward(fb, logits.data());
                for (size_t r = 0; r < fb.logit_rows.size(); ++r) {
                    const int32_t pos = start + fb.logit_rows[r];
                    if (pos < first || pos > n_ctx - 2) continue;
                    log_softmax(logits.data() + r * n_vocab, n_vocab,
                                all_logp.data() + size_t(pos - first) * n_vocab);
                }
            }
            table.free_sequence(seq);
        }
        for (int32_t g = 0; g < group; ++g)
            score_chunk(c0 + g, chunk_tokens(c0 + g),
                        all_logp.data() + size_t(g) * n_scored * size_t(n_vocab));
    }

    res.n_scored = count;
    res.mean_nll = nll_sum / count;
    res.ppl = std::exp(res.mean_nll);
    double var = nll2_sum / count - res.mean_nll * res.mean_nll;
    res.ppl_stderr = var > 0 && count > 1 ? res.ppl * std::sqrt(var / (count - 1)) : 0.0;
    if (base) {
        res.has_kld = true;
        res.kld_mean = kld_sum / count;
        double kvar = kld2_sum / count - res.kld_mean * res.kld_mean;
        res.kld_stderr = kvar > 0 && count > 1 ? std::sqrt(kvar / (count - 1)) : 0.0;
        std::sort(klds.begin(), klds.end());
        res.kld_max = klds.back();
        res.kld_p99 = quantile(klds, 0.99);
        res.top1_agreement = double(agree) / count;
        res.base_ppl = std::exp(base_nll_sum / count);
        comparison_statistics(res, nlls, base_nlls, klds, dps);
    }
    return res;
}

}  // namespace kvrun
