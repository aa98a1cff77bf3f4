// Speculative decoding (see speculative.h): vocabulary check, the acceptance rule, and the
// decoder's rounds — draft K tokens, verify K + 1 positions with one target pass, truncate
// the rejected positions from both KV tables, adapt K to the acceptance rate.
#include "speculative.h"

#include <algorithm>
#include <cmath>

#include "common.h"

namespace kvrun {

namespace {

double ms_between(std::chrono::steady_clock::time_point a,
                  std::chrono::steady_clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

void check_vocab_compatible(const Tokenizer& target, const Tokenizer& draft) {
    if (target.n_vocab() != draft.n_vocab())
        throw Error(
            fmt::format("the draft model's vocabulary has {} tokens but the target's has {}",
                        draft.n_vocab(), target.n_vocab()),
            "use a draft model of the same family (same tokenizer) as the target");
    for (TokenId id = 0; id < target.n_vocab(); ++id) {
        if (target.token_text(id) != draft.token_text(id))
            throw Error(
                fmt::format("the draft model's vocabulary differs from the target's: token {} "
                            "is '{}' in the target but '{}' in the draft",
                            id, target.token_text(id), draft.token_text(id)),
                "use a draft model of the same family (same tokenizer) as the target");
    }
}

SpecAcceptResult speculative_accept(const float* p, const float* q, std::span<const TokenId> drafts,
                                    int n_vocab, Sampler& rng, AcceptRule rule) {
    if (n_vocab <= 0) fail("speculative_accept: vocabulary size {} must be positive", n_vocab);
    const size_t V = static_cast<size_t>(n_vocab);
    for (size_t i = 0; i < drafts.size(); ++i) {
        const TokenId d = drafts[i];
        if (d < 0 || d >= n_vocab)
            fail("speculative_accept: draft token {} outside the vocabulary (0..{})", d,
                 n_vocab - 1);
        if (rule == AcceptRule::AcceptAll) continue;
        const float* pi = p + i * V;  // [n_vocab]
        const float* qi = q + i * V;  // [n_vocab]
        // Accept with probability min(1, p(d) / q(d)): u < p/q  <=>  u * q < p (q(d) > 0 since d
        // was drawn from q; q(d) == 0 < p(d) accepts, p(d) == 0 always rejects).
        const double u = rng.uniform();
        if (u * static_cast<double>(qi[d]) < static_cast<double>(pi[d])) continue;
        const int32_t n_accepted = static_cast<int32_t>(i);
        if (rule == AcceptRule::ResampleTarget) return {n_accepted, rng.sample_from(pi, n_vocab)};
        // Rejected: draw from the residual norm(max(p - q, 0)). It has positive mass whenever
        // p(d) < q(d); should rounding leave nothing, p itself is the right fallback.
        std::vector<float> residual(V);  // [n_vocab]
        double total = 0.0;
        for (size_t t = 0; t < V; ++t) {
            residual[t] = std::max(pi[t] - qi[t], 0.0f);
            total += residual[t];
        }
        if (!(total > 0.0)) return {n_accepted, rng.sample_from(pi, n_vocab)};
        return {n_accepted, rng.sample_from(residual.data(), n_vocab)};
    }
    // Every draft accepted: the bonus token comes from the target's next distribution.
    return {static_cast<int32_t>(drafts.size()), rng.sample_from(p + drafts.size() * V, n_vocab)};
}

SpeculativeDecoder::SpeculativeDecoder(Backend& target, Backend& draft, const Tokenizer& tokenizer,
                                       SpeculativeOptions options)
    : target_(target),
      draft_(draft),
      tok_(tokenizer),
      opt_(options),
      target_table_(static_cast<int32_t>(target.n_kv_blocks()), target.kv_block_size(),
                    target.n_kv_stages()),
      draft_table_(static_cast<int32_t>(draft.n_kv_blocks()), draft.kv_block_size(),
                   draft.n_kv_stages()) {
    if (target.config().n_vocab != draft.config().n_vocab)
        throw Error(fmt::format("the draft model outputs {} logits per token but the target {}",
                                draft.config().n_vocab, target.config().n_vocab),
                    "use a draft model of the same family (same tokenizer) as the target");
    if (target.config().n_vocab != tokenizer.n_vocab())
        fail("the target model outputs {} logits per token but its vocabulary has {} tokens",
             target.config().n_vocab, tokenizer.n_vocab());
    if (opt_.draft_max < 1 || opt_.draft_max > 256)
        fail("--draft-n must be between 1 and 256 (got {})", opt_.draft_max);
    if (opt_.draft_min < 1 || opt_.draft_min > opt_.draft_max)
        fail("--draft-min must be between 1 and --draft-n ({}) (got {})", opt_.draft_max,
             opt_.draft_min);
    if (opt_.n_batch < 1) fail("the batch size must be at least 1 (got {})", opt_.n_batch);
    n_vocab_ = static_cast<int32_t>(target.config().n_vocab);
    int64_t ctx = opt_.n_ctx > 0 ? opt_.n_ctx : target.config().n_ctx_train;
    if (ctx <= 0) ctx = 4096;
    ctx = std::min(ctx, target.n_kv_blocks() * target.kv_block_size());
    ctx = std::min(ctx, draft.n_kv_blocks() * draft.kv_block_size());
    n_ctx_ = static_cast<int32_t>(ctx);
    k_ = opt_.draft_max;
}

SpeculativeDecoder::~SpeculativeDecoder() {
    if (target_seq_ >= 0) target_table_.free_sequence(target_seq_);
    if (draft_seq_ >= 0) draft_table_.free_sequence(draft_seq_);
}

void SpeculativeDecoder::start(const GenerationRequest& request,
                               std::function<void(TokenId)> on_token) {
    if (active_) fail("speculative decoder: a request is still running (call finish() first)");
    if (request.prompt.empty()) fail("empty prompt: nothing to generate from");
    for (TokenId t : request.prompt)
        if (t < 0 || t >= n_vocab_)
            fail("prompt token id {} is outside the vocabulary (0..{})", t, n_vocab_ - 1);
    if (static_cast<int64_t>(request.prompt.size()) >= n_ctx_)
        throw Error(fmt::format("the prompt is {} tokens but the context holds {} tokens",
                                request.prompt.size(), n_ctx_),
                    "use a larger -c/--ctx (and --kv-memory), a shorter prompt, or --truncate");
    if (request.n_samples != 1)
        throw Error(fmt::format("speculative decoding runs one sample per request (got {})",
                                request.n_samples),
                    "drop --n-samples or --draft-model");
    req_ = request;
    on_token_ = std::move(on_token);
    target_sampler_ = std::make_unique<Sampler>(req_.sampling);
    SamplingParams dp = req_.sampling;
    dp.seed = dp.seed ^ 0xD1B54A32D192ED03ull;  // the draft's own stream of random numbers
    draft_sampler_ = std::make_unique<Sampler>(dp);
    tokens_ = req_.prompt;
    n_prompt_ = static_cast<int32_t>(tokens_.size());
    // Cached blocks for all but the last prompt token: its logits must be computed.
    std::span<const TokenId> prefix(tokens_.data(), tokens_.size() - 1);
    target_seq_ = opt_.prefix_cache ? target_table_.create_sequence_with_prefix(prefix)
                                    : target_table_.create_sequence();
    draft_seq_ = opt_.prefix_cache ? draft_table_.create_sequence_with_prefix(prefix)
                                   : draft_table_.create_sequence();
    n_prompt_computed_ = n_prompt_ - target_table_.n_tokens(target_seq_);
    stop_ = StopReason::None;
    text_.clear();
    has_first_ = false;
    k_ = opt_.draft_max;
    t_start_ = Clock::now();
    active_ = true;
    if (req_.n_predict == 0) stop_ = StopReason::Length;
}

int64_t SpeculativeDecoder::feed(Backend& backend, KvBlockTable& table, SeqId seq,
                                 std::span<const TokenId> toks, int32_t n_logits, float* out) {
    const int32_t len = static_cast<int32_t>(toks.size());
    if (len == 0) return 0;
    const int32_t start = table.n_tokens(seq);
    n_logits = std::min(n_logits, len);
    // The last chunk holds every token that needs logits; earlier chunks take n_batch each.
    // Each chunk is appended right before its pass (a quantized cache stages the blocks one
    // pass writes).
    const int32_t last_len = std::max(n_logits, std::min(len, opt_.n_batch));
    int64_t passes = 0;
    for (int32_t pos = 0; pos < len;) {
        const int32_t end =
            pos < len - last_len ? std::min(pos + opt_.n_batch, len - last_len) : len;
        const int32_t n = end - pos;
        KvAppendResult r = table.append(seq, n, toks.data() + pos);
        if (!r)
            throw Error(
                fmt::format("KV pool full: {} blocks of {} tokens cannot hold {} more tokens ({})",
                            table.n_blocks(), table.block_size(), n, r.reason()),
                "use a larger --kv-memory or a smaller -c/--ctx");
        kv_apply_pending(table, backend);
        ForwardBatch fb;
        fb.add_sequence(table, seq, start + pos, n);
        if (end == len)
            for (int32_t i = n - n_logits; i < n; ++i) fb.logit_rows.push_back(i);
        backend.forward(fb, out);
        ++passes;
        pos = end;
    }
    return passes;
}

void SpeculativeDecoder::propose(int32_t k) {
    drafts_.clear();
    if (k <= 0) return;
    const size_t V = static_cast<size_t>(n_vocab_);
    const bool greedy = draft_sampler_->greedy();
    if (!greedy) q_.resize(static_cast<size_t>(k) * V);
    logits_.resize(std::max(logits_.size(), V));
    const size_t n = tokens_.size();
    // Pending: tokens the draft has not seen yet (at least the last one).
    const int32_t have = draft_table_.n_tokens(draft_seq_);
    feed_buf_.assign(tokens_.begin() + have, tokens_.end());
    auto t0 = Clock::now();
    for (int32_t i = 0; i < k; ++i) {
        std::span<const TokenId> in = i == 0 ? std::span<const TokenId>(feed_buf_)
                                             : std::span<const TokenId>(&drafts_.back(), 1);
        stats_.draft_passes += feed(draft_, draft_table_, draft_seq_, in, 1, logits_.data());
        // Recent tokens for the penalty: the sequence plus the drafts so far (held in tokens_
        // only while drafting).
        std::span<const TokenId> recent(tokens_.data(), tokens_.size());
        TokenId d;
        if (greedy) {
            d = draft_sampler_->sample(logits_.data(), n_vocab_, recent);
        } else {
            float* qi = q_.data() + static_cast<size_t>(i) * V;
            draft_sampler_->compute_probabilities(logits_.data(), n_vocab_, recent, qi);
            d = draft_sampler_->sample_from(qi, n_vocab_);
        }
        drafts_.push_back(d);
        tokens_.push_back(d);
    }
    tokens_.resize(n);
    stats_.draft_ms += ms_between(t0, Clock::now());
}

StopReason SpeculativeDecoder::check_stop(TokenId tok) {
    if (!req_.ignore_eos && tok_.is_eog(tok)) return StopReason::Eos;
    if (!req_.stop_strings.empty()) {
        text_ += tok_.token_to_piece(tok);
        for (const auto& stop : req_.stop_strings)
            if (!stop.empty() && text_.find(stop) != std::string::npos)
                return StopReason::StopString;
    }
    const int32_t n_generated = static_cast<int32_t>(tokens_.size()) - n_prompt_;
    if (req_.n_predict >= 0 && n_generated >= req_.n_predict) return StopReason::Length;
    if (static_cast<int32_t>(tokens_.size()) >= n_ctx_) return StopReason::Context;
    return StopReason::None;
}

void SpeculativeDecoder::adapt(int32_t k, int32_t n_accepted) {
    // Grow while the draft is right every time, shrink when it is mostly wrong.
    if (n_accepted == k)
        k_ = std::min(opt_.draft_max, k + 2);
    else if (2 * n_accepted < k)
        k_ = std::max(opt_.draft_min, k - 1);
    k_ = std::clamp(k_, opt_.draft_min, opt_.draft_max);
}

SpecAcceptResult SpeculativeDecoder::draft_and_verify(int32_t k) {
    const int32_t n = static_cast<int32_t>(tokens_.size());
    const size_t V = static_cast<size_t>(n_vocab_);
    propose(k);

    // Target: the pending tokens plus the drafts in one pass, logits for the last pending
    // token and every draft.
    const int32_t have = target_table_.n_tokens(target_seq_);
    feed_buf_.assign(tokens_.begin() + have, tokens_.end());
    feed_buf_.insert(feed_buf_.end(), drafts_.begin(), drafts_.end());
    logits_.resize(std::max(logits_.size(), static_cast<size_t>(k + 1) * V));
    auto t0 = Clock::now();
    stats_.target_passes +=
        feed(target_, target_table_, target_seq_, feed_buf_, k + 1, logits_.data());
    stats_.target_ms += ms_between(t0, Clock::now());

    // Judge the drafts; tokens_ temporarily holds them for the penalty's recent tokens.
    tokens_.insert(tokens_.end(), drafts_.begin(), drafts_.end());
    SpecAcceptResult res;
    if (target_sampler_->greedy()) {
        res.n_accepted = k;
        for (int32_t i = 0; i <= k; ++i) {
            std::span<const TokenId> recent(tokens_.data(), static_cast<size_t>(n + i));
            const TokenId t = target_sampler_->sample(logits_.data() + i * V, n_vocab_, recent);
            if (i < k && t == drafts_[i]) continue;
            res = {i, t};
            break;
        }
    } else {
        p_.resize(static_cast<size_t>(k + 1) * V);
        for (int32_t i = 0; i <= k; ++i) {
            std::span<const TokenId> recent(tokens_.data(), static_cast<size_t>(n + i));
            target_sampler_->compute_probabilities(logits_.data() + i * V, n_vocab_, recent,
                                                   p_.data() + i * V);
        }
        res = speculative_accept(p_.data(), q_.data(), drafts_, n_vocab_, *target_sampler_,
                                 opt_.rule);
    }
    tokens_.resize(n);
    return res;
}

bool SpeculativeDecoder::step() {
    if (!active_ || stop_ != StopReason::None) return false;
    const int32_t n = static_cast<int32_t>(tokens_.size());
    // Room: the target writes positions n-1 .. n-1+k, all below n_ctx; drafting more than the
    // tokens still wanted (minus the one the target adds) is wasted.
    int32_t k = std::min(k_, n_ctx_ - n);
    if (req_.n_predict >= 0) k = std::min(k, req_.n_predict - (n - n_prompt_) - 1);
    k = std::max(k, 0);
    SpecAcceptResult res;
    try {
        res = draft_and_verify(k);
    } catch (...) {
        tokens_.resize(n);  // drop drafts held for the penalty's recent tokens
        throw;
    }

    // Roll back: both caches keep the sequence plus the accepted drafts (the token that
    // follows them has not been run through either model yet).
    const int32_t keep = n + res.n_accepted;
    target_table_.truncate(target_seq_, keep);
    if (draft_table_.n_tokens(draft_seq_) > keep) draft_table_.truncate(draft_seq_, keep);
    if (k > 0) {
        stats_.rounds++;
        stats_.drafted += k;
        stats_.accepted += res.n_accepted;
        adapt(k, res.n_accepted);
    }

    // Output the accepted drafts and the target's token, stopping at the first stop condition.
    for (int32_t i = 0; i <= res.n_accepted && stop_ == StopReason::None; ++i) {
        const TokenId tok = i < res.n_accepted ? drafts_[i] : res.next;
        tokens_.push_back(tok);
        stop_ = check_stop(tok);
        if (stop_ == StopReason::Eos) {
            tokens_.pop_back();  // the end-of-generation token is not part of the output
            break;
        }
        const auto now = Clock::now();
        if (!has_first_) has_first_ = true, t_first_ = now;
        t_last_ = now;
        stats_.generated++;
        if (on_token_) on_token_(tok);
    }
    return stop_ == StopReason::None;
}

GenerationResult SpeculativeDecoder::finish() {
    if (!active_) fail("speculative decoder: finish() without a running request");
    GenerationResult r;
    r.tokens.assign(tokens_.begin() + n_prompt_, tokens_.end());
    r.stop = stop_ == StopReason::None ? StopReason::Cancelled : stop_;
    GenerationTimings& t = r.timings;
    t.n_prompt = n_prompt_;
    t.n_prompt_computed = n_prompt_computed_;
    t.n_generated = static_cast<int32_t>(r.tokens.size());
    const auto now = Clock::now();
    if (has_first_) {
        t.prefill_ms = t.ttft_ms = ms_between(t_start_, t_first_);
        t.decode_ms = ms_between(t_first_, t_last_);
    } else {
        t.prefill_ms = ms_between(t_start_, now);
    }
    target_table_.free_sequence(target_seq_);
    draft_table_.free_sequence(draft_seq_);
    target_seq_ = draft_seq_ = -1;
    active_ = false;
    return r;
}

GenerationResult SpeculativeDecoder::generate(const GenerationRequest& request,
                                              const std::function<void(TokenId)>& on_token,
                                              const std::atomic<bool>* cancel) {
    start(request, on_token);
    try {
        while (step())
            if (cancel && cancel->load()) break;
    } catch (const Error& e) {
        GenerationResult r = finish();
        r.stop = StopReason::Error;
        r.error = e.what();
        return r;
    }
    return finish();
}

}  // namespace kvrun
