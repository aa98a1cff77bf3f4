// The engine's scheduler loop: admission, chunked prefill + decode in one forward pass,
// prefix caching, preemption, sampling, stop conditions and timings.
#include "engine.h"

#include <algorithm>

#include "common.h"

namespace kvrun {

const char* stop_reason_name(StopReason r) {
    switch (r) {
        case StopReason::None: return "none";
        case StopReason::Eos: return "eos";
        case StopReason::Length: return "length";
        case StopReason::Context: return "context";
        case StopReason::StopString: return "stop";
        case StopReason::Cancelled: return "cancelled";
        case StopReason::Error: return "error";
    }
    return "?";
}

double GenerationTimings::prefill_tokens_per_s() const {
    return prefill_ms > 0 ? n_prompt_computed / (prefill_ms / 1000.0) : 0.0;
}
double GenerationTimings::decode_tokens_per_s() const {
    return decode_ms > 0 && n_generated > 1 ? (n_generated - 1) / (decode_ms / 1000.0) : 0.0;
}

// One running or waiting sequence: a request's prompt plus what it generated so far.
struct Engine::Seq {
    int32_t request = 0;
    int32_t sample = 0;
    std::shared_ptr<const GenerationRequest> req;
    SeqId kv = -1;                 // KV table sequence while admitted
    std::vector<TokenId> tokens;   // [n_prompt + n_generated]
    int32_t n_prompt = 0;
    int32_t n_computed = 0;        // tokens whose K/V are in the cache
    int64_t order = 0;             // admission order (larger = younger)
    bool forked = false;           // parallel samples already created
    bool preempted = false, finished = false;
    std::unique_ptr<Sampler> sampler;
    std::string text;              // generated text so far (only kept for stop strings)
    int32_t preemptions = 0;
    bool admitted_once = false, has_first = false;
    Clock::time_point t_submit, t_admit, t_first, t_last;
    int32_t n_prompt_computed = 0;
    int32_t n_generated() const { return static_cast<int32_t>(tokens.size()) - n_prompt; }
};

static double ms_between(std::chrono::steady_clock::time_point a,
                         std::chrono::steady_clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

Engine::Engine(Backend& backend, const Tokenizer& tokenizer, EngineOptions options)
    : backend_(backend),
      tok_(tokenizer),
      opt_(options),
      table_(static_cast<int32_t>(backend.n_kv_blocks()), backend.kv_block_size()) {
    if (opt_.max_parallel < 1) fail("--parallel must be at least 1 (got {})", opt_.max_parallel);
    if (opt_.n_batch < 1) fail("the batch size must be at least 1 (got {})", opt_.n_batch);
    const int64_t pool_tokens = backend.n_kv_blocks() * backend.kv_block_size();
    int64_t ctx = opt_.n_ctx > 0 ? opt_.n_ctx : backend.config().n_ctx_train;
    if (ctx <= 0) ctx = 4096;
    n_ctx_ = static_cast<int32_t>(std::min<int64_t>(ctx, pool_tokens));
}

Engine::~Engine() = default;

int32_t Engine::submit(GenerationRequest request) {
    const int64_t n_vocab = backend_.config().n_vocab;
    if (request.prompt.empty()) fail("empty prompt: nothing to generate from");
    for (TokenId t : request.prompt)
        if (t < 0 || t >= n_vocab) fail("prompt token id {} is outside the vocabulary (0..{})", t, n_vocab - 1);
    if (static_cast<int64_t>(request.prompt.size()) >= n_ctx_)
        throw Error(fmt::format("the prompt is {} tokens but the context holds {} tokens",
                                request.prompt.size(), n_ctx_),
                    "use a larger -c/--ctx (and --kv-memory), a shorter prompt, or --truncate");
    if (request.n_samples < 1) fail("n_samples must be at least 1 (got {})", request.n_samples);
    auto req = std::make_shared<const GenerationRequest>(std::move(request));
    auto s = std::make_unique<Seq>();
    s->request = next_request_++;
    s->req = req;
    s->tokens = req->prompt;
    s->n_prompt = static_cast<int32_t>(req->prompt.size());
    s->sampler = std::make_unique<Sampler>(req->sampling);
    s->t_submit = Clock::now();
    waiting_.push_back(std::move(s));
    return waiting_.back()->request;
}

bool Engine::idle() const { return running_.empty() && waiting_.empty(); }

void Engine::admit() {
    while (!waiting_.empty() && static_cast<int32_t>(running_.size()) < opt_.max_parallel) {
        Seq& s = *waiting_.front();
        // Adopt cached blocks for all but the last token: its logits must be computed.
        std::span<const TokenId> prefix(s.tokens.data(), s.tokens.size() - 1);
        SeqId kv = opt_.prefix_cache ? table_.create_sequence_with_prefix(prefix)
                                     : table_.create_sequence();
        const int32_t adopted = table_.n_tokens(kv);
        const int32_t remaining = static_cast<int32_t>(s.tokens.size()) - adopted;
        const int32_t need = table_.blocks_needed(kv, remaining);
        // Keep one block of headroom per running sequence so admissions don't immediately
        // force preemptions of running decodes. With nothing running, always admit.
        const int32_t headroom = static_cast<int32_t>(running_.size());
        if (!running_.empty() && need + headroom > table_.n_available_blocks()) {
            table_.free_sequence(kv);
            break;
        }
        s.kv = kv;
        s.n_computed = adopted;
        s.order = next_order_++;
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

void Engine::preempt(Seq& s) {
    table_.free_sequence(s.kv);
    s.kv = -1;
    s.n_computed = 0;
    s.preempted = true;
    s.preemptions++;
    stats_.preemptions++;
}

bool Engine::reserve(Seq& s, int32_t n) {
    for (;;) {
        KvAppendResult r = table_.append(s.kv, n, s.tokens.data() + s.n_computed);
        if (r) return true;
        // Out of blocks: preempt the youngest other running sequence, or this one if it is
        // the youngest.
        Seq* victim = nullptr;
        for (auto& o : running_)
            if (o.get() != &s && !o->preempted && !o->finished && o->kv >= 0 &&
                (!victim || o->order > victim->order))
                victim = o.get();
        if (!victim) {
            // Alone and still out of blocks: cannot happen while n_ctx <= pool size, but
            // never crash — end this sequence with a clear error.
            finish(s, StopReason::Error,
                   fmt::format("KV pool full: {} blocks of {} tokens cannot hold this sequence "
                               "({})", table_.n_blocks(), table_.block_size(), r.reason()));
            return false;
        }
        if (victim->order < s.order) {
            preempt(s);
            return false;
        }
        preempt(*victim);
    }
}

void Engine::finish(Seq& s, StopReason reason, std::string error) {
    if (s.kv >= 0) table_.free_sequence(s.kv);
    s.kv = -1;
    s.finished = true;
    GenerationResult r;
    r.request = s.request;
    r.sample = s.sample;
    r.tokens.assign(s.tokens.begin() + s.n_prompt, s.tokens.end());
    r.stop = reason;
    r.error = std::move(error);
    r.preemptions = s.preemptions;
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
    if (on_finish_) on_finish_(r);
}

StopReason Engine::check_stop(Seq& s, TokenId tok) {
    const GenerationRequest& req = *s.req;
    if (!req.ignore_eos && tok_.is_eog(tok)) return StopReason::Eos;
    if (!req.stop_strings.empty()) {
        s.text += tok_.token_to_piece(tok);
        for (const auto& stop : req.stop_strings)
            if (!stop.empty() && s.text.find(stop) != std::string::npos) return StopReason::StopString;
    }
    if (req.n_predict >= 0 && s.n_generated() >= req.n_predict) return StopReason::Length;
    if (static_cast<int32_t>(s.tokens.size()) >= n_ctx_) return StopReason::Context;
    return StopReason::None;
}

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
        SamplingParams p = s.req->sampling;
        p.seed = p.seed + static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull;
        f->sampler = std::make_unique<Sampler>(p);
        f->admitted_once = true;
        f->t_submit = s.t_submit;
        f->t_admit = s.t_admit;
        f->n_prompt_computed = 0;
        running_.push_back(std::move(f));
    }
}

void Engine::sample_and_advance(Seq& s, const float* logits) {
    const int n_vocab = static_cast<int>(backend_.config().n_vocab);
    const int32_t n_recent = std::min<int32_t>(static_cast<int32_t>(s.tokens.size()),
                                               std::max(0, s.req->sampling.repeat_last_n));
    std::span<const TokenId> recent(s.tokens.data() + s.tokens.size() - n_recent, n_recent);
    TokenId tok = s.sampler->sample(logits, n_vocab, recent);
    auto now = Clock::now();
    if (!s.has_first) {
        s.has_first = true;
        s.t_first = now;
    }
    s.t_last = now;
    s.tokens.push_back(tok);
    StopReason stop = check_stop(s, tok);
    if (stop == StopReason::Eos) {
        s.tokens.pop_back();  // the end-of-generation token is not part of the output
    } else {
        stats_.tokens_decoded++;
        if (on_token_) on_token_(s.request, s.sample, tok);
    }
    if (stop != StopReason::None) finish(s, stop);
}

bool Engine::step() {
    auto t0 = Clock::now();
    admit();
    if (running_.empty()) return !waiting_.empty();

    // Plan: oldest first, so that preemption (which takes the youngest) never hits a
    // sequence already planned in this step.
    std::vector<Seq*> order;
    for (auto& s : running_) order.push_back(s.get());
    std::sort(order.begin(), order.end(), [](Seq* a, Seq* b) { return a->order < b->order; });
    struct Part {
        Seq* s;
        int32_t start, n;
        bool logits;
    };
    std::vector<Part> parts;
    int32_t budget = opt_.n_batch;
    for (Seq* s : order) {
        if (s->preempted || s->finished) continue;
        const int32_t remaining = static_cast<int32_t>(s->tokens.size()) - s->n_computed;
        int32_t n = remaining;
        if (remaining > 1) {  // prefill: a chunk within the budget
            if (budget <= 0) continue;
            n = std::min(remaining, budget);
        }
        if (!reserve(*s, n)) continue;
        budget -= n;
        parts.push_back({s, s->n_computed, n, s->n_computed + n == static_cast<int32_t>(s->tokens.size())});
    }
    // Preempted sequences go back to the front of the queue (oldest first).
    std::vector<std::unique_ptr<Seq>> back;
    for (auto& s : running_)
        if (s->preempted) back.push_back(std::move(s));
    std::sort(back.begin(), back.end(), [](auto& a, auto& b) { return a->order > b->order; });
    for (auto& s : back) {
        s->preempted = false;
        waiting_.push_front(std::move(s));
    }
    std::erase_if(running_, [](auto& s) { return !s; });
    std::erase_if(parts, [](const Part& p) { return p.s->finished || p.s->kv < 0; });

    if (!parts.empty()) {
        std::vector<std::pair<int32_t, int32_t>> copies;
        for (const BlockCopy& c : table_.take_pending_copies()) copies.emplace_back(c.src, c.dst);
        if (!copies.empty()) backend_.copy_blocks(copies);

        ForwardBatch fb;
        for (size_t r = 0; r < parts.size(); ++r) {
            const Part& p = parts[r];
            fb.block_tables.push_back(table_.block_ids(p.s->kv));
            for (int32_t i = 0; i < p.n; ++i) {
                fb.tokens.push_back(p.s->tokens[p.start + i]);
                fb.positions.push_back(p.start + i);
                fb.seq_index.push_back(static_cast<int32_t>(r));
                fb.slots.push_back(p.start + i);
            }
            if (p.logits) fb.logit_rows.push_back(static_cast<int32_t>(fb.tokens.size()) - 1);
            if (p.n > 1 || p.start < p.s->n_prompt) stats_.tokens_prefilled += p.n;
        }
        const int64_t n_vocab = backend_.config().n_vocab;
        logits_.resize(fb.logit_rows.size() * n_vocab);
        backend_.forward(fb, logits_.data());

        KvBlockStats ks = table_.stats();
        if (ks.used_blocks >= stats_.peak_blocks_used) {
            stats_.peak_blocks_used = ks.used_blocks;
            stats_.peak_waste_fraction = ks.waste_fraction();
        }
        size_t row = 0;
        for (const Part& p : parts) {
            p.s->n_computed += p.n;
            if (!p.logits) continue;
            const float* lg = logits_.data() + row++ * n_vocab;
            const bool first = static_cast<int32_t>(p.s->tokens.size()) == p.s->n_prompt;
            if (first && p.s->req->n_samples > 1 && !p.s->forked) {
                size_t before = running_.size();
                fork_samples(*p.s);
                for (size_t i = before; i < running_.size(); ++i) sample_and_advance(*running_[i], lg);
            }
            sample_and_advance(*p.s, lg);
        }
        stats_.steps++;
    }
    std::erase_if(running_, [](auto& s) { return s->finished; });
    stats_.busy_ms += ms_between(t0, Clock::now());
    return !idle();
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
