// The engine's scheduler loop: admission, chunked prefill + decode in one forward pass,
// prefix caching, preemption, sessions, sampling, stop conditions and timings.
//
// Admission (FCFS): the front waiting request joins when a slot is free (max_parallel) and
// the pool can hold its uncached tokens on top of what running sequences still need for
// their prompts, plus one block of headroom per running sequence; with nothing running it
// always joins. A request whose prompt shares full blocks with a running sequence's prompt
// that are not computed yet waits one step, so it adopts them instead of computing them again.
// Preemption: when an append finds no block, the youngest running sequence is freed (its
// tokens are kept; it goes back to the front of the queue and recomputes, mostly from the
// prefix cache), then idle sessions' K/V; a lone sequence that still does not fit ends with
// an error (cannot happen while n_ctx <= pool size).
// A step: plan every running sequence's part (a prefill chunk within the -b budget, or its
// one pending token, plus K drafts when a draft model speculates for it), run the draft
// passes (engine_speculative.cpp), append each part to the block table (oldest first, so
// preemption takes the youngest; a part that does not fit drops its drafts before anyone is
// preempted), one target forward pass, then verification / sampling and the stop checks.
#include "engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common.h"
#include "engine_seq.h"

namespace kvrun {

const char* stop_reason_name(StopReason r) {
    switch (r) {
        case StopReason::None:
            return "none";
        case StopReason::Eos:
            return "eos";
        case StopReason::Length:
            return "length";
        case StopReason::Context:
            return "context";
        case StopReason::StopString:
            return "stop";
        case StopReason::Cancelled:
            return "cancelled";
        case StopReason::Error:
            return "error";
    }
    return "?";
}

double GenerationTimings::prefill_tokens_per_s() const {
    return prefill_ms > 0 ? n_prompt_computed / (prefill_ms / 1000.0) : 0.0;
}
bool GenerationTimings::has_decode_rate() const {
    return n_generated >= 2 && decode_ms >= kMinDecodeMs;
}
double GenerationTimings::decode_tokens_per_s() const {
    return has_decode_rate() ? (n_generated - 1) / (decode_ms / 1000.0) : 0.0;
}
double EngineStats::mean_waste_fraction() const {
    return allocated_slots > 0 ? static_cast<double>(unfilled_slots) / allocated_slots : 0.0;
}

static double ms_between(std::chrono::steady_clock::time_point a,
                         std::chrono::steady_clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

Engine::Engine(Backend& backend, const Tokenizer& tokenizer, EngineOptions options)
    : backend_(backend), tok_(tokenizer), opt_(options), table_(kv_table_for(backend)) {
    if (opt_.max_parallel < 1) fail("--parallel must be at least 1 (got {})", opt_.max_parallel);
    if (opt_.n_batch < 1) fail("the batch size must be at least 1 (got {})", opt_.n_batch);
    const int64_t pool_tokens = backend.n_kv_blocks() * backend.kv_block_size();
    int64_t ctx = opt_.n_ctx > 0 ? opt_.n_ctx : backend.config().n_ctx_train;
    if (ctx <= 0) ctx = 4096;
    ctx = std::min<int64_t>(ctx, INT32_MAX);
    n_ctx_requested_ = static_cast<int32_t>(ctx);
    n_ctx_ = static_cast<int32_t>(std::min<int64_t>(ctx, pool_tokens));
    if (opt_.draft_ngram < 0 || opt_.draft_ngram > 64)
        fail("--draft-ngram must be between 0 (off) and 64 (got {})", opt_.draft_ngram);
    if (opt_.draft && opt_.draft_ngram > 0)
        fail("give a draft model or n-gram drafting (--draft-ngram), not both");
    if (opt_.draft || opt_.draft_ngram > 0) {
        if (opt_.draft_max < 1 || opt_.draft_max > 256)
            fail("--draft-n must be between 1 and 256 (got {})", opt_.draft_max);
        if (opt_.draft_min < 1 || opt_.draft_min > opt_.draft_max)
            fail("--draft-min must be between 1 and --draft-n ({}) (got {})", opt_.draft_max,
                 opt_.draft_min);
    }
    if (opt_.draft) {
        Backend& d = *opt_.draft;
        if (d.config().n_vocab != backend.config().n_vocab)
            throw Error(fmt::format("the draft model outputs {} logits per token but the target {}",
                                    d.config().n_vocab, backend.config().n_vocab),
                        "use a draft model of the same family (same tokenizer) as the target");
        draft_ = &d;
        draft_table_ = std::make_unique<KvBlockTable>(kv_table_for(d));
    }
    if (opt_.draft || opt_.draft_ngram > 0) {
        // A round rolls back at most draft_max + 1 tokens, which a window pool keeps.
        int32_t margin = INT32_MAX;
        if (table_.windowed()) margin = table_.window_pool().margin;
        if (draft_table_ && draft_table_->windowed())
            margin = std::min(margin, draft_table_->window_pool().margin);
        opt_.draft_max = std::min(opt_.draft_max, margin - 1);
        opt_.draft_min = std::min(opt_.draft_min, opt_.draft_max);
    }
}

Engine::~Engine() = default;

int32_t Engine::submit(GenerationRequest request) {
    const int64_t n_vocab = backend_.config().n_vocab;
    Session* session = nullptr;
    if (request.session >= 0) {
        session = &session_ref(request.session);
        if (session->busy) fail("session {} already runs a request", request.session);
        if (request.n_samples != 1) fail("n_samples > 1 cannot run in a session");
    }
    std::vector<TokenId> tokens = session ? session->tokens : std::vector<TokenId>{};
    tokens.insert(tokens.end(), request.prompt.begin(), request.prompt.end());
    if (tokens.empty()) fail("empty prompt: nothing to generate from");
    if (request.n_predict < -1)
        fail("n_predict must be -1 (no limit) or at least 0 (got {})", request.n_predict);
    for (TokenId t : request.prompt)
        if (t < 0 || t >= n_vocab)
            fail("prompt token id {} is outside the vocabulary (0..{})", t, n_vocab - 1);
    if (static_cast<int64_t>(tokens.size()) >= n_ctx_)
        throw Error(fmt::format("the prompt is {} tokens but the context holds {} tokens",
                                tokens.size(), n_ctx_),
                    "use a larger -c/--ctx (and --kv-memory), a shorter prompt, or --truncate");
    if (request.n_samples < 1) fail("n_samples must be at least 1 (got {})", request.n_samples);
    merged_logit_bias(request.sampling, n_vocab);  // throws for an id outside the vocabulary
    if (request.n_probs < 0 || request.n_probs > kMaxLogprobs)
        fail("n_probs must be between 0 and {} (got {})", kMaxLogprobs, request.n_probs);
    if (!request.lora.empty()) {
        const std::vector<float> loaded = backend_.lora_scales();
        if (loaded.empty())
            throw Error("the request sets LoRA scales but no adapter is loaded",
                        "load the adapters with --lora or --lora-scaled");
        if (request.lora.size() != loaded.size())
            fail("the request has {} LoRA scales for {} loaded adapters", request.lora.size(),
                 loaded.size());
        for (float x : request.lora)
            if (!std::isfinite(x)) fail("LoRA scale {} is not finite", x);
        if (request.lora == loaded) request.lora.clear();  // the loaded scales: share the cache
    }
    const ReasoningBudget& rb = request.reasoning_budget;
    if (rb.tokens < -1)
        fail("the reasoning budget must be -1 (none) or at least 0 (got {})", rb.tokens);
    if (rb.tokens >= 0) {
        if (rb.start.empty() || rb.end.empty() || rb.forced.empty())
            fail("a reasoning budget needs its block's start and end text and the forced tokens");
        for (TokenId t : rb.forced)
            if (t < 0 || t >= n_vocab)
                fail("forced token id {} is outside the vocabulary (0..{})", t, n_vocab - 1);
        if (rb.state.spent < 0)
            fail("reasoning tokens spent must be >= 0 (got {})", rb.state.spent);
        if (rb.state.forced_next < -1 ||
            rb.state.forced_next >= static_cast<int64_t>(rb.forced.size()) ||
            (rb.state.forced_next >= 0 && !rb.state.inside))
            fail("the forced tokens' next index {} does not fit {} forced tokens inside a block",
                 rb.state.forced_next, rb.forced.size());
    }
    auto req = std::make_shared<const GenerationRequest>(std::move(request));
    auto s = std::make_unique<Seq>();
    s->request = next_request_++;
    s->req = req;
    s->tokens = std::move(tokens);
    s->n_prompt = static_cast<int32_t>(s->tokens.size());
    if (!req->stop_strings.empty()) s->text = req->stop_text_before;
    s->text_start = s->text.size();
    s->sampler = make_sampler(req->sampling);
    if (req->grammar) {
        if (!grammar_vocab_) grammar_vocab_ = std::make_shared<GrammarVocab>(tok_);
        s->grammar = std::make_unique<GrammarConstraint>(grammar_bind_tokens(req->grammar, tok_),
                                                         grammar_vocab_);
        s->grammar->set_end_tokens(req->stop_tokens);
        if (!req->grammar_triggers.empty()) s->grammar->set_lazy(req->grammar_triggers);
        for (size_t i = 0; i < req->grammar_prefix.size(); ++i)
            if (!s->grammar->try_accept(req->grammar_prefix[i]))
                fail("grammar_prefix: token {} (#{}) does not continue the grammar",
                     req->grammar_prefix[i], i);
        s->sampler->set_constraint(s->grammar.get());
    }
    if (const ReasoningBudget& b = req->reasoning_budget; b.tokens >= 0) {
        s->think.inside = b.state.inside;
        s->think.tokens = b.state.spent;
        s->think.tail = b.state.tail;
        if (b.state.forced_next >= 0 || (b.state.inside && b.state.spent >= b.tokens)) {
            s->think.forced = b.forced;
            s->think.next = static_cast<size_t>(std::max(0, b.state.forced_next));
            s->think.tail.clear();
        }
    }
    if (speculative() && req->sampling.mirostat == 0) {  // mirostat moves with every draw
        if (draft_) {
            SamplingParams dp = req->sampling;
            dp.seed = speculative_draft_seed(dp.seed);
            s->draft_sampler = make_sampler(dp);
        }
        s->k = opt_.draft_max;
    }
    s->t_submit = Clock::now();
    if (session) session->busy = true;
    waiting_.push_back(std::move(s));
    return waiting_.back()->request;
}

bool Engine::idle() const {
    return running_.empty() && waiting_.empty();
}

// The block-hash salt of a request's LoRA scales (KvBlockTable::create_sequence): 0 for the
// loaded scales.
static uint64_t lora_salt(const std::vector<float>& scales) {
    if (scales.empty()) return 0;
    std::vector<TokenId> bits(scales.size());
    std::memcpy(bits.data(), scales.data(), scales.size() * sizeof(float));
    const uint64_t h = KvBlockTable::hash_block(0x4c6f'5241'7363'616cULL, bits);
    return h != 0 ? h : 1;
}

// Blocks running sequences still need for the prompt tokens they have not computed yet.
int32_t Engine::committed_blocks() const {
    int32_t n = 0;
    for (const auto& r : running_)
        if (!r->finished && r->kv >= 0)
            n +=
                table_.blocks_needed(r->kv, static_cast<int32_t>(r->tokens.size()) - r->n_computed);
    return n;
}

// Whether a running sequence will soon compute full blocks that `s` could adopt: s shares
// more than its `n_cached` cached tokens, in whole blocks, with a running sequence's tokens.
bool Engine::shares_uncomputed_prefix(const Seq& s, int32_t n_cached) const {
    const int32_t bs = table_.block_size();
    const size_t limit = s.tokens.size() - 1;  // the last token is always computed
    for (const auto& r : running_) {
        if (r->finished || r->kv < 0 || r->req->lora != s.req->lora) continue;
        const size_t n = std::min(limit, r->tokens.size());
        size_t common = 0;
        while (common < n && s.tokens[common] == r->tokens[common]) ++common;
        if (static_cast<int32_t>(common / bs * bs) > n_cached) return true;
    }
    return false;
}

void Engine::admit() {
    while (!waiting_.empty()) {
        Seq& s = *waiting_.front();
        // A request with n samples takes n slots once it forks (a request with more samples
        // than max_parallel runs alone).
        auto slots_of = [](const Seq& q) { return q.forked ? 1 : q.req->n_samples; };
        const int32_t slots = slots_of(s);
        const int32_t n_running = static_cast<int32_t>(running_.size());
        int32_t used_slots = 0;
        for (const auto& r : running_) used_slots += slots_of(*r);
        if (n_running > 0 && used_slots + slots > opt_.max_parallel) break;
        const int32_t n_tokens = static_cast<int32_t>(s.tokens.size());
        Session* session = s.req->session >= 0 ? &session_ref(s.req->session) : nullptr;
        SeqId kv = -1;
        int32_t adopted = 0;
        const uint64_t salt = lora_salt(s.req->lora);
        if (session && session->kv >= 0 && table_.salt(session->kv) != salt) {
            // The session's K/V was computed with other LoRA scales: recompute.
            table_.free_sequence(session->kv);
            session->kv = -1;
            session->n_cached = 0;
        }
        if (session && session->kv >= 0) {
            // Continue the session's own sequence; its last token's logits must be computed.
            kv = session->kv;
            adopted = std::min(session->n_cached, n_tokens - 1);
            // Past what a window pool keeps, the rollback recomputes from the start.
            if (adopted < table_.n_tokens(kv)) adopted = table_.rollback(kv, adopted);
            session->n_cached = adopted;
        } else {
            // Adopt cached blocks for all but the last token: its logits must be computed.
            std::span<const TokenId> prefix(s.tokens.data(), s.tokens.size() - 1);
            const bool reuse = opt_.prefix_cache && s.req->cache_prompt;
            if (reuse && !running_.empty() &&
                shares_uncomputed_prefix(s, table_.match_prefix(prefix, salt)))
                break;  // a running prompt computes these blocks in this step: wait for them
            kv = reuse ? table_.create_sequence_with_prefix(prefix, salt)
                       : table_.create_sequence(salt);
            adopted = table_.n_tokens(kv);
        }
        // Forked samples copy the prompt's partly filled last block when they diverge.
        const int32_t need = table_.blocks_needed(kv, n_tokens - adopted) + slots - 1;
        const int32_t headroom = n_running;
        if (!running_.empty() &&
            need + committed_blocks() + headroom > table_.n_available_blocks()) {
            if (!session || session->kv != kv) table_.free_sequence(kv);
            break;
        }
        if (session && session->kv == kv) {
            session->kv = -1;
            session->n_cached = 0;
        }
        s.kv = kv;
        s.n_computed = adopted;
        s.order = next_order_++;
        if (draft_) draft_init(s, session);
        stats_.prefix_hit_tokens += adopted;
        if (!s.admitted_once) {
            s.admitted_once = true;
            s.t_admit = Clock::now();
            s.n_prompt_computed = s.n_prompt - std::min(adopted, s.n_prompt);
        }
        running_.push_back(std::move(waiting_.front()));
        waiting_.pop_front();
    }
    stats_.peak_running = std::max(stats_.peak_running, static_cast<int32_t>(running_.size()));
}

// Frees a sequence's K/V in both tables (target and draft).
void Engine::free_kv(Seq& s) {
    if (s.kv >= 0) table_.free_sequence(s.kv);
    if (s.draft_kv >= 0) draft_table_->free_sequence(s.draft_kv);
    s.kv = s.draft_kv = -1;
}

void Engine::preempt(Seq& s) {
    free_kv(s);
    s.n_computed = 0;
    s.preempted = true;
    s.preemptions++;
    stats_.preemptions++;
}

// Frees the K/V of one idle session (it will be recomputed when the session runs again).
bool Engine::drop_idle_session() {
    for (auto& [id, ses] : sessions_) {
        if (ses.kv < 0) continue;
        table_.free_sequence(ses.kv);
        if (ses.draft_kv >= 0) draft_table_->free_sequence(ses.draft_kv);
        ses.kv = ses.draft_kv = -1;
        ses.n_cached = 0;
        return true;
    }
    return false;
}

// Appends toks (the part's tokens, then its drafts) to s's KV sequence. Out of blocks, it
// first gives up the drafts (keeps the first n_min tokens), then preempts the youngest other
// running sequence, or s itself when s is the youngest. Returns the tokens appended: toks.size(),
// n_min, or 0 when s was preempted or ended with an error.
int32_t Engine::reserve(Seq& s, std::span<const TokenId> toks, int32_t n_min) {
    int32_t n = static_cast<int32_t>(toks.size());
    for (;;) {
        KvAppendResult r = table_.append(s.kv, n, toks.data());
        if (r) return n;
        if (n > n_min) {
            n = n_min;
            continue;
        }
        Seq* victim = nullptr;
        for (auto& o : running_)
            if (o.get() != &s && !o->preempted && !o->finished && o->kv >= 0 &&
                (!victim || o->order > victim->order))
                victim = o.get();
        if (victim && victim->order < s.order) {
            preempt(s);
            return 0;
        }
        if (victim) {
            preempt(*victim);
            continue;
        }
        if (drop_idle_session()) continue;
        // Alone and still out of blocks: cannot happen while n_ctx <= pool size, but
        // never crash — end this sequence with a clear error.
        finish(s, StopReason::Error,
               fmt::format("KV pool full: {} blocks of {} tokens cannot hold this sequence ({})",
                           table_.n_blocks(), table_.block_size(), r.reason()));
        return 0;
    }
}

void Engine::finish(Seq& s, StopReason reason, std::string error) {
    if (s.req->session >= 0) keep_in_session(s, session_ref(s.req->session));
    free_kv(s);  // what a session did not take
    s.finished = true;
    GenerationResult r;
    r.request = s.request;
    r.sample = s.sample;
    r.tokens.assign(s.tokens.begin() + s.n_prompt, s.tokens.end());
    r.stop = reason;
    r.error = std::move(error);
    r.preemptions = s.preemptions;
    r.n_drafted = s.n_drafted;
    r.n_accepted = s.n_accepted;
    r.n_spec_rounds = s.n_spec_rounds;
    r.n_target_passes = s.n_passes;
    r.logprobs = std::move(s.logprobs);
    if (s.req->reasoning_budget.tokens >= 0)
        r.reasoning = {s.think.inside, s.think.tokens,
                       s.forcing() ? static_cast<int32_t>(s.think.next) : -1, s.think.tail};
    auto now = Clock::now();
    GenerationTimings& t = r.timings;
    t.n_prompt = s.n_prompt;
    t.n_prompt_computed = s.n_prompt_computed;
    t.n_generated = static_cast<int32_t>(r.tokens.size());
    if (s.admitted_once) t.queue_ms = ms_between(s.t_submit, s.t_admit);
    if (s.has_first) {
        t.prefill_ms = ms_between(s.t_admit, s.t_first);
        t.ttft_ms = ms_between(s.t_submit, s.t_first);
        t.decode_ms = ms_between(s.t_first, s.t_last);
    } else if (s.admitted_once) {
        t.prefill_ms = ms_between(s.t_admit, now);
    }
    if (!on_finish_) return;
    // A multi-sample request that ends before its samples forked (an error, a cancel, n_predict
    // 0) ends every sample: callers count one result per sample.
    if (s.forked || s.req->n_samples == 1) {
        on_finish_(r);
        return;
    }
    for (int32_t i = 0; i < s.req->n_samples; ++i) {
        r.sample = i;
        on_finish_(r);
    }
}

// n_indent: whether a line of `text` after its first (the generated text starts at `start`)
// that the newest token (from `from` on) completes or reaches shows its first non-blank
// character after fewer than n_indent spaces or tabs.
static bool under_indented(std::string_view text, size_t start, size_t from, int32_t n_indent) {
    // Lines to look at: the one the token continues (if it began after a newline of the
    // generated text), then each one the token starts.
    size_t nl = from > start ? text.rfind('\n', from - 1) : std::string_view::npos;
    if (nl == std::string_view::npos || nl < start) nl = text.find('\n', from);
    for (; nl != std::string_view::npos; nl = text.find('\n', nl + 1)) {
        size_t i = nl + 1;
        while (i < text.size() && (text[i] == ' ' || text[i] == '\t')) ++i;
        if (i < text.size() && text[i] != '\n' && text[i] != '\r' && int64_t(i - nl - 1) < n_indent)
            return true;
    }
    return false;
}

StopReason Engine::check_stop(Seq& s, TokenId tok) {
    const GenerationRequest& req = *s.req;
    if (!req.ignore_eos && tok_.is_eog(tok)) return StopReason::Eos;
    if (std::find(req.stop_tokens.begin(), req.stop_tokens.end(), tok) != req.stop_tokens.end())
        return StopReason::Eos;
    if (!req.stop_strings.empty() || req.n_indent > 0 || req.max_predict_ms > 0) {
        const size_t from = s.text.size();
        s.text += token_piece_shown(tok_, tok, req.shown_tokens);
        for (const auto& stop : req.stop_strings)
            if (!stop.empty() && s.text.find(stop) != std::string::npos)
                return StopReason::StopString;
        if (req.n_indent > 0 && under_indented(s.text, s.text_start, from, req.n_indent)) {
            s.drop_newest = true;  // (the line's first character is not output)
            return StopReason::Length;
        }
        if (req.max_predict_ms > 0 && ms_between(s.t_first, s.t_last) > req.max_predict_ms &&
            s.text.find('\n', s.text_start) != std::string::npos)
            return StopReason::Length;
    }
    if (req.n_predict >= 0 && s.n_generated() >= req.n_predict) return StopReason::Length;
    if (static_cast<int32_t>(s.tokens.size()) >= n_ctx_) return StopReason::Context;
    return StopReason::None;
}

// Creates samples 1..n-1 of a request right after its prompt's logits: each a new KV
// sequence sharing every block of the prompt (copy-on-write when they diverge), in the
// draft's table too.
void Engine::fork_samples(Seq& s) {
    s.forked = true;
    for (int32_t i = 1; i < s.req->n_samples; ++i) {
        auto f = std::make_unique<Seq>();
        f->request = s.request;
        f->sample = i;
        f->req = s.req;
        f->kv = table_.fork(s.kv);
        f->tokens = s.tokens;
        f->n_prompt = s.n_prompt;
        f->n_computed = s.n_computed;
        f->order = next_order_++;
        f->forked = true;
        f->think = s.think;
        SamplingParams p = s.req->sampling;
        p.seed = p.seed + static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull;
        f->sampler = make_sampler(p);
        if (s.grammar) {
            f->grammar = std::make_unique<GrammarConstraint>(*s.grammar);
            f->sampler->set_constraint(f->grammar.get());
        }
        if (draft_ && s.draft_sampler) {
            if (s.draft_kv >= 0) f->draft_kv = draft_table_->fork(s.draft_kv);
            p.seed = speculative_draft_seed(p.seed);
            f->draft_sampler = make_sampler(p);
        }
        f->k = s.k;
        f->admitted_once = true;
        f->t_submit = s.t_submit;
        f->t_admit = s.t_admit;
        f->n_prompt_computed = 0;
        f->n_passes = s.n_passes;
        running_.push_back(std::move(f));
    }
}

std::unique_ptr<Sampler> Engine::make_sampler(const SamplingParams& params) {
    auto sampler = std::make_unique<Sampler>(params);
    if (params.dry_multiplier != 0.0f && !params.dry_sequence_breakers.empty()) {
        if (!token_pieces_)
            token_pieces_ = std::make_shared<std::vector<std::string>>(token_text_pieces(tok_));
        sampler->set_token_pieces(token_pieces_.get());
    }
    return sampler;
}

std::span<const TokenId> Engine::penalty_window(const Seq& s) const {
    // < 0: the sampler looks at the whole sequence (the penalties' or DRY's window).
    const int32_t last_n = sampling_history_length(s.req->sampling);
    const int32_t n_tokens = static_cast<int32_t>(s.tokens.size());
    const int32_t n_recent = last_n < 0 ? n_tokens : std::min(n_tokens, last_n);
    return {s.tokens.data() + s.tokens.size() - n_recent, static_cast<size_t>(n_recent)};
}

void Engine::sample_and_advance(Seq& s, const float* logits) {
    const int n_vocab = static_cast<int>(backend_.config().n_vocab);
    TokenId tok = take_forced(s);
    if (tok < 0) {
        try {  // e.g. all logits NaN, or a grammar that allows no token: only this sequence ends
            tok = s.sampler->sample(logits, n_vocab, penalty_window(s));
        } catch (const Error& e) {
            finish(s, StopReason::Error, e.what());
            return;
        }
    }
    advance(s, tok, logits);
}

TokenId Engine::take_forced(Seq& s) {
    if (!s.forcing()) return -1;
    const TokenId t = s.think.forced[s.think.next];
    if (s.grammar && !s.grammar->allows(t)) {  // the output must follow the grammar: no forcing
        s.think.forced.clear();
        s.think.next = 0;
        return -1;
    }
    s.think.next++;
    s.think.last_forced = true;
    return t;
}

void Engine::track_reasoning(Seq& s, TokenId tok) {
    const ReasoningBudget& b = s.req->reasoning_budget;
    if (b.tokens < 0) return;
    if (s.think.last_forced) {
        s.think.last_forced = false;
        if (!s.forcing()) {  // the forced end tag is out: the block is closed
            s.think.inside = false;
            s.think.forced.clear();
            s.think.next = 0;
            s.think.tail.clear();
        }
        return;
    }
    // Tags are found in the text, control tokens included: a tag may be one token, or split
    // over several ("</", "think", ">").
    s.think.tail += tok_.token_to_piece(tok, /*render_special=*/true);
    if (s.think.inside) {
        s.think.tokens++;
        if (const size_t at = s.think.tail.find(b.end); at != std::string::npos) {
            s.think.inside = false;
            s.think.tail.erase(0, at + b.end.size());
        }
    }
    if (!s.think.inside) {
        if (const size_t at = s.think.tail.find(b.start); at != std::string::npos) {
            s.think.inside = true;
            s.think.tail.erase(0, at + b.start.size());
        }
    }
    if (s.think.inside && s.think.tokens >= b.tokens) {
        s.think.forced = b.forced;
        s.think.next = 0;
        s.think.tail.clear();
        return;
    }
    const size_t keep = std::max(b.start.size(), b.end.size());
    if (s.think.tail.size() > keep) s.think.tail.erase(0, s.think.tail.size() - keep);
}

RowSampling Engine::row_sampling(Seq& s) {
    RowSampling r;
    r.params = s.sampler->params();
    if (s.forcing()) {  // the row's token is ignored: no draw (as on the host path)
        r.params.temperature = 0.0f;
        r.u = 0.0;
        return r;
    }
    r.u = s.sampler->greedy() ? 0.0 : s.sampler->uniform();  // the draw sample() would make
    const auto recent = penalty_window(s);
    r.recent.assign(recent.begin(), recent.end());
    return r;
}

// Appends one generated token, reports it and ends the sequence on a stop condition.
void Engine::advance(Seq& s, TokenId tok, const float* logits) {
    auto now = Clock::now();
    if (!s.has_first) {
        s.has_first = true;
        s.t_first = now;
    }
    s.t_last = now;
    s.tokens.push_back(tok);
    if (s.grammar) {
        try {
            s.grammar->accept(tok);
        } catch (const Error& e) {  // only a bug could sample a token the grammar refuses
            s.tokens.pop_back();
            finish(s, StopReason::Error, e.what());
            return;
        }
    }
    StopReason stop = check_stop(s, tok);
    if (stop == StopReason::Eos || s.drop_newest) {
        // The end-of-generation token is not part of the output, nor one n_indent ends at.
        s.tokens.pop_back();
    } else {
        const TokenLogprobs* lp = nullptr;
        if (s.req->n_probs > 0 && logits) {
            s.logprobs.push_back(token_logprobs(logits, static_cast<int>(backend_.config().n_vocab),
                                                tok, s.req->n_probs));
            lp = &s.logprobs.back();
        }
        stats_.tokens_decoded++;
        stats_.spec.generated++;
        if (on_token_) on_token_(s.request, s.sample, tok, lp);
        track_reasoning(s, tok);
    }
    // The grammar admits nothing more: the model could only end here, so end it now.
    if (stop == StopReason::None && s.grammar && s.grammar->finished()) stop = StopReason::Eos;
    if (stop != StopReason::None) finish(s, stop);
}

// Preempted sequences go back to the front of the queue, oldest first.
void Engine::requeue_preempted() {
    std::vector<std::unique_ptr<Seq>> back;
    for (auto& s : running_)
        if (s->preempted) back.push_back(std::move(s));
    std::sort(back.begin(), back.end(), [](auto& a, auto& b) { return a->order > b->order; });
    for (auto& s : back) {
        s->preempted = false;
        waiting_.push_front(std::move(s));
    }
    std::erase_if(running_, [](auto& s) { return !s; });
}

int32_t Engine::shared_blocks() const {
    // Walks the running sequences' block lists (not the whole pool): O(blocks in use).
    std::vector<BlockId> seen;
    for (const auto& r : running_) {
        if (r->finished || r->kv < 0) continue;
        for (BlockId b : table_.block_ids(r->kv))
            if (table_.refcount(b) > 1) seen.push_back(b);
    }
    std::sort(seen.begin(), seen.end());
    return static_cast<int32_t>(std::unique(seen.begin(), seen.end()) - seen.begin());
}

// KV statistics after a forward pass (and after rejected drafts were truncated). A full
// KvBlockTable::stats() walks the whole pool, so on large pools the waste average is sampled
// (every 16th step, and at each new peak).
void Engine::update_kv_stats() {
    const int32_t used = table_.n_used_blocks();
    const bool peak = used >= stats_.peak_blocks_used;
    if (!peak && table_.n_blocks() > 4096 && stats_.steps % 16 != 0) return;
    const KvBlockStats ks = table_.stats();
    if (peak) {
        stats_.peak_blocks_used = ks.used_blocks;
        stats_.peak_waste_fraction = ks.waste_fraction();
    }
    stats_.allocated_slots += static_cast<int64_t>(ks.used_blocks) * ks.block_size;
    stats_.unfilled_slots += ks.unfilled_slots;
    stats_.cow_copies = ks.copies;
    stats_.peak_shared_blocks = std::max(stats_.peak_shared_blocks, shared_blocks());
}

// Requests that want no tokens (n_predict 0) end at once with stop "length": nothing is
// computed, and a session keeps the appended prompt for its next request.
void Engine::finish_empty_requests() {
    for (auto it = waiting_.begin(); it != waiting_.end();) {
        Seq& s = **it;
        if (s.req->n_predict != 0 || s.admitted_once) {
            ++it;
            continue;
        }
        s.admitted_once = true;
        s.t_admit = Clock::now();
        s.n_prompt_computed = 0;
        finish(s, StopReason::Length);  // every sample
        it = waiting_.erase(it);
    }
}

bool Engine::step() {
    auto t0 = Clock::now();
    finish_empty_requests();
    admit();
    if (running_.empty()) {
        stats_.busy_ms += ms_between(t0, Clock::now());
        return !waiting_.empty();
    }

    // Plan: oldest first, so that preemption (which takes the youngest) never hits a
    // sequence already placed in this step.
    std::vector<Seq*> order;
    for (auto& s : running_) order.push_back(s.get());
    std::sort(order.begin(), order.end(), [](Seq* a, Seq* b) { return a->order < b->order; });
    std::vector<Part> parts;
    int32_t budget = opt_.n_batch;
    for (Seq* s : order) {
        if (s->preempted || s->finished) continue;
        const int32_t remaining = s->n_tokens() - s->n_computed;
        int32_t n = remaining;
        if (remaining > 1) {  // prefill: a chunk within the budget
            if (budget <= 0) continue;
            n = std::min(remaining, budget);
        }
        budget -= n;
        Part p;
        p.s = s;
        p.start = s->n_computed;
        p.n = n;
        p.logits = s->n_computed + n == s->n_tokens();
        if (speculative() && p.logits) p.k = draft_length(*s);
        parts.push_back(p);
    }
    if (draft_)
        draft_round(parts);  // sets each part's drafts (p.k = how many)
    else if (opt_.draft_ngram > 0)
        lookup_round(parts);

    std::vector<TokenId> toks;
    for (Part& p : parts) {
        Seq& s = *p.s;
        if (s.preempted || s.finished || s.kv < 0) continue;
        toks.assign(s.tokens.begin() + p.start, s.tokens.begin() + p.start + p.n);
        toks.insert(toks.end(), s.drafts.begin(), s.drafts.begin() + p.k);
        const int32_t got = reserve(s, toks, p.n);
        if (got == 0) continue;
        if (got < p.n + p.k) {  // no room for the drafts: a plain step, drafts dropped
            p.k = 0;
            if (s.draft_kv >= 0 && draft_table_->n_tokens(s.draft_kv) > s.n_tokens())
                draft_table_->truncate(s.draft_kv, s.n_tokens());
        }
        p.reserved = true;
    }
    requeue_preempted();
    std::erase_if(parts, [](const Part& p) { return !p.reserved || p.s->finished || p.s->kv < 0; });

    if (!parts.empty()) {
        kv_apply_pending(table_, backend_);

        ForwardBatch fb;
        for (const Part& p : parts) {
            fb.add_sequence(table_, p.s->kv, p.start, p.n + p.k);
            if (!p.s->req->lora.empty())
                fb.set_lora_scales(static_cast<int32_t>(fb.block_tables.size()) - 1,
                                   p.s->req->lora);
            if (p.logits)
                for (int32_t i = p.k; i >= 0; --i)
                    fb.logit_rows.push_back(static_cast<int32_t>(fb.tokens.size()) - 1 - i);
            if (p.n > 1 || p.start < p.s->n_prompt) stats_.tokens_prefilled += p.n;
        }
        const int64_t n_vocab = backend_.config().n_vocab;
        // Device sampling: every logit row is one plain sample (no drafts to verify, no
        // multi-sample fork that needs the logits several times).
        bool device_sampling = opt_.device_sampling == EngineOptions::DeviceSampling::On ||
                               (opt_.device_sampling == EngineOptions::DeviceSampling::Auto &&
                                backend_.samples_on_device());
        for (const Part& p : parts)
            if (p.logits &&
                (p.k > 0 || p.s->grammar || p.s->req->n_probs > 0 ||
                 sampling_needs_host(p.s->req->sampling) ||
                 (p.s->n_tokens() == p.s->n_prompt && p.s->req->n_samples > 1 && !p.s->forked)))
                device_sampling = false;
        std::vector<TokenId> sampled;
        const auto tf = Clock::now();
        if (device_sampling) {
            std::vector<RowSampling> rs;
            for (const Part& p : parts)
                if (p.logits) rs.push_back(row_sampling(*p.s));
            sampled.resize(rs.size());
            backend_.forward_sample(fb, rs, sampled.data());
            stats_.device_sampled_steps++;
        } else {
            logits_.resize(std::max<size_t>(1, fb.logit_rows.size()) * n_vocab);
            backend_.forward(fb, logits_.data());
        }
        stats_.spec.target_ms += ms_between(tf, Clock::now());
        stats_.spec.target_passes++;

        // Verify the drafts first and truncate what was rejected (both tables), so the KV
        // statistics see only accepted tokens.
        std::vector<size_t> rows(parts.size());
        size_t row = 0;
        for (size_t i = 0; i < parts.size(); ++i) {
            Part& p = parts[i];
            p.s->n_computed += p.n + p.k;
            p.s->n_passes++;
            rows[i] = row;
            if (!p.logits) continue;
            if (p.k > 0) {  // host path
                try {
                    verify_drafts(*p.s, logits_.data() + row * n_vocab, p.k);
                } catch (const Error& e) {  // the sequence ends; its drafts are not output
                    finish(*p.s, StopReason::Error, e.what());
                }
            }
            row += static_cast<size_t>(p.k) + 1;
        }
        update_kv_stats();
        if (on_prompt_computed_)
            for (const Part& p : parts)
                if (p.start < p.s->n_prompt && p.start + p.n >= p.s->n_prompt && p.s->kv >= 0)
                    on_prompt_computed_(p.s->kv);

        for (size_t i = 0; i < parts.size(); ++i) {
            const Part& p = parts[i];
            if (!p.logits) continue;
            if (p.k > 0) {  // the accepted drafts and the target's own token
                Seq& s = *p.s;
                for (size_t j = 0; j < s.drafts.size() && !s.finished && !s.forcing(); ++j)
                    advance(s, s.drafts[j], logits_.data() + (rows[i] + j) * n_vocab);
                // A reasoning budget ran out before the last draft: forced tokens replace the
                // rest, whose K/V go (the newest token is run again for the next step).
                if (s.forcing() && !s.finished && s.n_computed >= s.n_tokens()) {
                    const int32_t keep = s.n_tokens() - 1;
                    s.n_computed = table_.rollback(s.kv, keep);
                    if (s.draft_kv >= 0 && draft_table_->n_tokens(s.draft_kv) > keep)
                        draft_table_->rollback(s.draft_kv, keep);
                }
                continue;
            }
            if (device_sampling) {  // rows[i] counts logit rows: one per plain part
                const TokenId forced = take_forced(*p.s);
                advance(*p.s, forced >= 0 ? forced : sampled[rows[i]]);
                continue;
            }
            const float* lg = logits_.data() + rows[i] * n_vocab;
            const bool first = p.s->n_tokens() == p.s->n_prompt;
            if (first && p.s->req->n_samples > 1 && !p.s->forked) {
                size_t before = running_.size();
                fork_samples(*p.s);
                stats_.peak_shared_blocks = std::max(stats_.peak_shared_blocks, shared_blocks());
                for (size_t j = before; j < running_.size(); ++j)
                    sample_and_advance(*running_[j], lg);
            }
            sample_and_advance(*p.s, lg);
        }
        stats_.steps++;
    }
    stats_.peak_running = std::max(stats_.peak_running, static_cast<int32_t>(running_.size()));
    std::erase_if(running_, [](auto& s) { return s->finished; });
    if (idle()) stats_.cow_copies = table_.stats().copies;  // (sampled on large pools)
    stats_.busy_ms += ms_between(t0, Clock::now());
    return !idle();
}

std::vector<EngineSequenceInfo> Engine::running_sequences() const {
    std::vector<EngineSequenceInfo> out;
    for (const auto& s : running_) {
        if (s->finished) continue;
        EngineSequenceInfo i;
        i.request = s->request;
        i.sample = s->sample;
        i.kv = s->kv;
        i.draft_kv = s->draft_kv;
        i.n_tokens = s->n_tokens();
        i.n_prompt = s->n_prompt;
        i.n_computed = s->n_computed;
        i.draft_k = s->k;
        out.push_back(i);
    }
    return out;
}

void Engine::cancel_all() {
    for (auto& s : running_)
        if (!s->finished) finish(*s, StopReason::Cancelled);
    running_.clear();
    while (!waiting_.empty()) {
        finish(*waiting_.front(), StopReason::Cancelled);
        waiting_.pop_front();
    }
}

bool Engine::cancel(int32_t request) {
    bool any = false;
    for (auto& s : running_)
        if (s->request == request && !s->finished) {
            finish(*s, StopReason::Cancelled);
            any = true;
        }
    std::erase_if(running_, [](auto& s) { return s->finished; });
    for (auto it = waiting_.begin(); it != waiting_.end();) {
        if ((*it)->request != request) {
            ++it;
            continue;
        }
        finish(**it, StopReason::Cancelled);
        it = waiting_.erase(it);
        any = true;
    }
    return any;
}

void Engine::run(const std::atomic<bool>* cancel) {
    while (!idle()) {
        if (cancel && cancel->load()) {
            cancel_all();
            return;
        }
        step();
    }
}

}  // namespace kvrun
