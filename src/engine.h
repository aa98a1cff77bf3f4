// The engine: runs generation requests on a backend over the paged KV cache. One loop
// steps every running sequence together — chunked prefill of new prompts mixed with
// decode steps of running ones (continuous batching) — admits waiting requests by free KV
// blocks, reuses cached prompt prefixes, and preempts (frees and later recomputes) the
// youngest sequence when the pool runs out. Sessions keep a conversation's KV sequence
// alive between requests (chat). `run`, `batch` and `chat` are built on it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend.h"
#include "kv_block_table.h"
#include "sampler.h"
#include "tokenizer.h"

namespace kvrun {

enum class StopReason { None, Eos, Length, Context, StopString, Cancelled, Error };
const char* stop_reason_name(StopReason r);  // "eos", "length", "context", "stop", ...

struct GenerationRequest {
    std::vector<TokenId> prompt;  // [n_prompt] already tokenized (BOS included if wanted)
    int32_t n_predict = 128;      // max new tokens; < 0: until EOS or the context is full
    SamplingParams sampling;
    int32_t n_samples = 1;  // parallel continuations sharing the prompt's KV blocks
    bool ignore_eos = false;
    std::vector<std::string> stop_strings;  // generation ends when the text contains one
    std::vector<TokenId> stop_tokens;       // extra end-of-generation ids (like EOS: not output)
    // >= 0: run in this session (see Engine::open_session): the sequence is the session's
    // tokens followed by `prompt` (which may then be empty); only uncached tokens are computed.
    int32_t session = -1;
};

struct GenerationTimings {
    double queue_ms = 0;            // submit -> first scheduled
    double prefill_ms = 0;          // first scheduled -> first token sampled
    double ttft_ms = 0;             // submit -> first token
    double decode_ms = 0;           // first token -> last token
    int32_t n_prompt = 0;           // whole sequence before generation (session: incl. history)
    int32_t n_prompt_computed = 0;  // prompt tokens actually run (the rest came from the cache)
    int32_t n_generated = 0;
    double prefill_tokens_per_s() const;
    double decode_tokens_per_s() const;
};

struct GenerationResult {
    int32_t request = 0;          // id returned by submit()
    int32_t sample = 0;           // 0 .. n_samples-1
    std::vector<TokenId> tokens;  // generated tokens (stop string text included)
    StopReason stop = StopReason::None;
    std::string error;  // when stop == Error
    int32_t preemptions = 0;
    GenerationTimings timings;
};

struct EngineOptions {
    int32_t max_parallel = 64;  // sequences running at once
    int32_t n_batch = 512;      // tokens per forward pass (prefill chunk budget)
    int32_t n_ctx = 0;          // max tokens per sequence (prompt + generated); 0: model's
    bool prefix_cache = true;
};

struct EngineStats {
    int64_t steps = 0;
    int64_t tokens_prefilled = 0;   // prompt (and recomputed) tokens run through the model
    int64_t tokens_decoded = 0;     // tokens generated
    int64_t prefix_hit_tokens = 0;  // prompt tokens adopted from the prefix cache / a session
    int64_t preemptions = 0;
    int64_t cow_copies = 0;  // copy-on-write block copies (diverging samples)
    int32_t peak_running = 0;
    int32_t peak_blocks_used = 0;
    int32_t peak_shared_blocks = 0;  // blocks referenced by >1 sequence, at most at once
    double peak_waste_fraction = 0;  // unfilled / allocated slots, at the peak of blocks used
    int64_t allocated_slots = 0;     // sum over steps of used blocks x block size
    int64_t unfilled_slots = 0;      // sum over steps of their unfilled slots
    double busy_ms = 0;              // time inside step()
    // Unfilled / allocated KV slots, averaged over all steps (the "KV waste").
    double mean_waste_fraction() const;
};

class Engine {
  public:
    using TokenCallback = std::function<void(int32_t request, int32_t sample, TokenId token)>;
    using FinishCallback = std::function<void(const GenerationResult&)>;

    Engine(Backend& backend, const Tokenizer& tokenizer, EngineOptions options);
    ~Engine();

    // Queues a request; returns its id. Throws Error for a request that can never run
    // (empty prompt, prompt longer than the context, more blocks than the whole pool).
    int32_t submit(GenerationRequest request);
    // One scheduler step (admission, one forward pass, sampling). Returns false when idle.
    bool step();
    // Steps until every request finished (or `cancel` becomes true: running and waiting
    // requests then finish with StopReason::Cancelled).
    void run(const std::atomic<bool>* cancel = nullptr);
    bool idle() const;
    // Ends every running and waiting request with StopReason::Cancelled.
    void cancel_all();

    void on_token(TokenCallback cb) { on_token_ = std::move(cb); }
    void on_finish(FinishCallback cb) { on_finish_ = std::move(cb); }

    // ---- sessions: a sequence kept between requests (multi-turn chat) ----
    // When a session's request ends (any stop reason), its tokens and K/V stay in the
    // session, so the next request only computes what it appends. Under memory pressure an
    // idle session's K/V may be dropped (it is then recomputed, helped by the prefix cache).
    int32_t open_session();
    void close_session(int32_t session);  // frees its K/V; unknown ids are ignored
    // Prompts and replies so far. Throws Error for an unknown session.
    const std::vector<TokenId>& session_tokens(int32_t session) const;
    // Tokens whose K/V the session holds right now (<= session_tokens().size()).
    int32_t session_cached_tokens(int32_t session) const;
    // Keeps the first n tokens (e.g. drops a stop string's tokens). Not while it runs.
    void truncate_session(int32_t session, int32_t n_tokens);

    const EngineStats& stats() const { return stats_; }
    const KvBlockTable& kv_table() const { return table_; }
    KvBlockTable& kv_table() { return table_; }
    int32_t n_ctx() const { return n_ctx_; }
    int32_t n_running() const { return static_cast<int32_t>(running_.size()); }
    int32_t n_waiting() const { return static_cast<int32_t>(waiting_.size()); }
    int32_t shared_blocks() const;  // blocks referenced by more than one sequence now

  private:
    using Clock = std::chrono::steady_clock;
    struct Seq;
    struct Session {
        SeqId kv = -1;                // KV sequence while idle (-1: none or lent to a request)
        std::vector<TokenId> tokens;  // [n] the conversation so far
        int32_t n_cached = 0;         // leading tokens whose K/V `kv` holds
        bool busy = false;            // a request runs in it
    };

    void admit();
    bool shares_uncomputed_prefix(const Seq& s, int32_t n_cached) const;
    int32_t committed_blocks() const;
    void preempt(Seq& s);
    void finish(Seq& s, StopReason reason, std::string error = {});
    bool reserve(Seq& s, int32_t n);
    bool drop_idle_session();
    void sample_and_advance(Seq& s, const float* logits);
    void fork_samples(Seq& s);
    StopReason check_stop(Seq& s, TokenId tok);
    void requeue_preempted();
    void update_kv_stats();
    Session& session_ref(int32_t id);
    const Session& session_ref(int32_t id) const;

    Backend& backend_;
    const Tokenizer& tok_;
    EngineOptions opt_;
    KvBlockTable table_;
    int32_t n_ctx_ = 0;
    int32_t next_request_ = 0;
    int32_t next_session_ = 0;
    int64_t next_order_ = 0;
    std::vector<std::unique_ptr<Seq>> running_;
    std::deque<std::unique_ptr<Seq>> waiting_;
    std::map<int32_t, Session> sessions_;
    TokenCallback on_token_;
    FinishCallback on_finish_;
    EngineStats stats_;
    std::vector<float> logits_;
};

}  // namespace kvrun
