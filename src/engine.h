// The engine: runs generation requests on a backend over the paged KV cache. One loop
// steps every running sequence together — chunked prefill of new prompts mixed with
// decode steps of running ones (continuous batching) — admits waiting requests by free KV
// blocks, reuses cached prompt prefixes, and preempts (frees and later recomputes) the
// youngest sequence when the pool runs out. Sessions keep a conversation's KV sequence
// alive between requests (chat). With a draft model (EngineOptions::draft) every decoding
// sequence speculates on its own: the draft proposes up to K tokens per sequence (one draft
// pass per position for all sequences), the target verifies every sequence's K + 1
// positions in the step's one forward pass, and rejected positions are truncated from both
// KV tables (engine_speculative.cpp). `run`, `batch` and `chat` are built on it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend.h"
#include "grammar.h"
#include "kv_block_table.h"
#include "sampler.h"
#include "speculative_accept.h"
#include "tokenizer.h"

namespace kvrun {

enum class StopReason { None, Eos, Length, Context, StopString, Cancelled, Error };
const char* stop_reason_name(StopReason r);  // "eos", "length", "context", "stop", ...

class GrammarVocab;

// Where a reply stands in its reasoning blocks (GenerationResult::reasoning): a request that
// continues the reply (a context shift, a chat reply continued after an overflow) starts from
// it (ReasoningBudget::state), so the budget counts over the whole reply.
struct ReasoningState {
    bool inside = false;       // inside a block (at the start: the prompt opened one)
    int32_t spent = 0;         // tokens generated inside blocks (forced ones not counted)
    int32_t forced_next = -1;  // the forced tokens were being output: the next one's index
    std::string tail;          // the reply's last bytes, where a tag may be split
};

// A reasoning budget (llama.cpp's --reasoning-budget): at most `tokens` generated tokens
// inside reasoning blocks (the text between `start` and `end`), counted over the whole reply
// from `state`. When a block has spent the budget and is still open, the next tokens are
// `forced` (a message, then the end tag) instead of sampled, one per step; generation then
// goes on. Forced tokens count toward n_predict like generated ones. tokens < 0: no budget.
struct ReasoningBudget {
    int32_t tokens = -1;
    std::string start = "<think>", end = "</think>";
    std::vector<TokenId> forced;
    ReasoningState state;  // where the reply stands before this request's first token
};

struct GenerationRequest {
    std::vector<TokenId> prompt;  // [n_prompt] already tokenized (BOS included if wanted)
    int32_t n_predict = 128;      // max new tokens; -1: until EOS or the context is full (0: none,
                                  // stop "length"; other negative values are refused)
    SamplingParams sampling;
    int32_t n_samples = 1;  // parallel continuations sharing the prompt's KV blocks
    bool ignore_eos = false;
    std::vector<std::string> stop_strings;  // generation ends when the text contains one
    // Text generated before this request that a stop string may begin in (the reply so far
    // when a context shift continues it); only its last bytes matter.
    std::string stop_text_before;
    // Control tokens whose text the output shows (sorted; preserved_tokens): stop strings see it.
    std::vector<TokenId> shown_tokens;
    std::vector<TokenId> stop_tokens;  // extra end-of-generation ids (like EOS: not output)
    // Constrained generation: every generated token continues a sentence of the grammar, the
    // end of generation comes only where a sentence is complete, and the request ends (stop
    // "eos") once the grammar admits nothing more. Null: unconstrained.
    std::shared_ptr<const Grammar> grammar;
    // Lazy grammar (llama.cpp's grammar_lazy): the output is free until one of these
    // triggers appears, and follows `grammar` from there on (GrammarTriggers). Empty: the
    // grammar holds from the first token.
    GrammarTriggers grammar_triggers;
    // Tokens already generated under the grammar, at the end of the prompt (a reply continued
    // after a context shift): its state starts after them. Each must continue the grammar.
    std::vector<TokenId> grammar_prefix;
    // > 0: report each generated token's log-probability and the n_probs most likely tokens
    // (GenerationResult::logprobs; at most kMaxLogprobs). Such steps sample on the host.
    int32_t n_probs = 0;
    // >= 0: run in this session (see Engine::open_session): the sequence is the session's
    // tokens followed by `prompt` (which may then be empty); only uncached tokens are computed.
    int32_t session = -1;
    // This request's scale for each loaded LoRA adapter (llama.cpp server's "lora"); empty:
    // the loaded scales. Sequences with other scales never share cached K/V with it.
    std::vector<float> lora;
    // false: the whole prompt is computed, adopting no K/V from the prefix cache (llama.cpp
    // server's cache_prompt); its full blocks still serve later requests.
    bool cache_prompt = true;
    // Reasoning budget (llama.cpp's --reasoning-budget; reasoning_budget_for in reasoning.h).
    ReasoningBudget reasoning_budget;
    // Code completion limits (llama-server's t_max_predict_ms and n_indent; 0: none), both
    // ending the reply with stop "length": max_predict_ms once that long has passed since
    // its first token and its text holds a newline; n_indent at a line after the first whose
    // first non-blank character comes after fewer than n_indent spaces or tabs (the token
    // that shows it is not output).
    double max_predict_ms = 0;
    int32_t n_indent = 0;
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
    // (n_generated - 1) / decode time, or 0 when that is not a meaningful rate: fewer than two
    // tokens, or less than kMinDecodeMs between the first and the last (speculation can deliver
    // every token of a short reply in one round).
    double decode_tokens_per_s() const;
    bool has_decode_rate() const;
    static constexpr double kMinDecodeMs = 1.0;
};

struct GenerationResult {
    int32_t request = 0;          // id returned by submit()
    int32_t sample = 0;           // 0 .. n_samples-1
    std::vector<TokenId> tokens;  // generated tokens (stop string text included)
    StopReason stop = StopReason::None;
    std::string error;  // when stop == Error
    int32_t preemptions = 0;
    GenerationTimings timings;
    // Speculative decoding (an engine with a draft model): draft tokens proposed and accepted,
    // and verification rounds that carried at least one draft.
    int32_t n_drafted = 0, n_accepted = 0, n_spec_rounds = 0;
    int32_t n_target_passes = 0;          // target forward passes this sequence took part in
    std::vector<TokenLogprobs> logprobs;  // [tokens.size()] when the request asked (n_probs)
    ReasoningState reasoning;  // after the last token, when the request had a reasoning budget
};

struct EngineOptions {
    int32_t max_parallel = 64;  // sequences running at once
    int32_t n_batch = 512;      // tokens per forward pass (prefill chunk budget)
    int32_t n_ctx = 0;          // max tokens per sequence (prompt + generated); 0: model's
    bool prefix_cache = true;
    // Speculative decoding: a draft model of the same vocabulary on its own backend (which
    // must outlive the engine; its KV pool should hold at least the target's, plus K tokens
    // per sequence). Null: no speculation.
    Backend* draft = nullptr;
    // Or, without a draft model: prompt lookup drafting (speculative_lookup_drafts) with
    // n-grams of up to this many tokens (0: off). The two exclude each other.
    int32_t draft_ngram = 0;
    int32_t draft_max = 8;  // --draft-n: the most tokens drafted per sequence and round
    int32_t draft_min = 1;  // the fewest (== draft_max: K fixed, no adaptation)
    // llama.cpp's --draft-p-min: a round stops drafting at the first token the draft model
    // gives less than this probability (that token is not proposed); 0: off.
    float draft_p_min = 0.0f;
    AcceptRule accept_rule = AcceptRule::Lossless;
    // Sampling where the logits are (Backend::forward_sample): only token ids come back from
    // the device. Auto: when the backend samples on its device (CUDA). On: always (tests use
    // it on the CPU). Steps that need the logits on the host (draft verification, a grammar, the
    // first token of a multi-sample request) always take the host path.
    enum class DeviceSampling { Auto, On, Off } device_sampling = DeviceSampling::Auto;
};

struct EngineStats {
    int64_t steps = 0;
    int64_t device_sampled_steps = 0;  // steps sampled with Backend::forward_sample
    int64_t tokens_prefilled = 0;      // prompt (and recomputed) tokens run through the model
    int64_t tokens_decoded = 0;        // tokens generated
    int64_t prefix_hit_tokens = 0;     // prompt tokens adopted from the prefix cache / a session
    int64_t preemptions = 0;
    int64_t cow_copies = 0;  // copy-on-write block copies (diverging samples)
    int32_t peak_running = 0;
    int32_t peak_blocks_used = 0;
    int32_t peak_shared_blocks = 0;  // blocks referenced by >1 sequence, at most at once
    double peak_waste_fraction = 0;  // unfilled / allocated slots, at the peak of blocks used
    int64_t allocated_slots = 0;     // sum over steps of used blocks x block size
    int64_t unfilled_slots = 0;      // sum over steps of their unfilled slots
    double busy_ms = 0;              // time inside step()
    SpeculativeStats spec;           // drafts, acceptance, passes, model time (all steps)
    // Unfilled / allocated KV slots, averaged over all steps (the "KV waste").
    double mean_waste_fraction() const;
};

// A running sequence as the scheduler sees it (tests, diagnostics).
struct EngineSequenceInfo {
    int32_t request = 0, sample = 0;
    SeqId kv = -1;         // target KV sequence
    SeqId draft_kv = -1;   // draft KV sequence (-1 without a draft model)
    int32_t n_tokens = 0;  // prompt + generated so far
    int32_t n_prompt = 0;
    int32_t n_computed = 0;  // tokens whose K/V the target holds
    int32_t draft_k = 0;     // the adaptive draft length for its next round
};

class Engine {
  public:
    // `logprobs`: the token's log-probabilities when the request asked for them (n_probs),
    // else null; valid during the call.
    using TokenCallback = std::function<void(int32_t request, int32_t sample, TokenId token,
                                             const TokenLogprobs* logprobs)>;
    using FinishCallback = std::function<void(const GenerationResult&)>;

    Engine(Backend& backend, const Tokenizer& tokenizer, EngineOptions options);
    ~Engine();

    // Queues a request; returns its id. Throws Error for a request that can never run
    // (empty prompt, prompt longer than the context, more blocks than the whole pool,
    // n_predict below -1). A request with n_predict 0 finishes at the next step with no
    // tokens (stop "length") and computes nothing.
    int32_t submit(GenerationRequest request);
    // One scheduler step (admission, one forward pass, sampling). Returns false when idle.
    bool step();
    // Steps until every request finished (or `cancel` becomes true: running and waiting
    // requests then finish with StopReason::Cancelled).
    void run(const std::atomic<bool>* cancel = nullptr);
    bool idle() const;
    // Ends every running and waiting request with StopReason::Cancelled.
    void cancel_all();
    // Ends the request's sequences (all its samples) with StopReason::Cancelled and frees
    // their blocks (a server's client went away). Not during step(); unknown or finished ids
    // are ignored. Returns whether anything was cancelled.
    bool cancel(int32_t request);

    void on_token(TokenCallback cb) { on_token_ = std::move(cb); }
    void on_finish(FinishCallback cb) { on_finish_ = std::move(cb); }
    // Called after the pass that computed a sequence's last prompt token (again when a
    // preempted one recomputes it), with its id in kv_table(), before a later pass moves its
    // sliding window on: a prompt cache reads the windowed layers' K/V of the prompt's last
    // blocks there (PromptCacheWindows).
    using PromptCallback = std::function<void(SeqId kv)>;
    void on_prompt_computed(PromptCallback cb) { on_prompt_computed_ = std::move(cb); }

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
    // The target model's backend (for passes between steps on kv_table(), e.g. embeddings).
    Backend& backend() { return backend_; }
    const KvBlockTable& kv_table() const { return table_; }
    KvBlockTable& kv_table() { return table_; }
    // The draft model's block table (null without a draft model).
    const KvBlockTable* draft_kv_table() const { return draft_table_.get(); }
    bool speculative() const { return draft_ != nullptr || opt_.draft_ngram > 0; }
    int32_t n_ctx() const { return n_ctx_; }
    // The context asked for (-c, else the model's training context) before n_ctx() capped it
    // to the KV pool: larger than n_ctx() when the pool is too small for it.
    int32_t n_ctx_requested() const { return n_ctx_requested_; }
    std::vector<EngineSequenceInfo> running_sequences() const;
    int32_t n_running() const { return static_cast<int32_t>(running_.size()); }
    int32_t n_waiting() const { return static_cast<int32_t>(waiting_.size()); }
    int32_t shared_blocks() const;  // blocks referenced by more than one sequence now

  private:
    using Clock = std::chrono::steady_clock;
    struct Seq;
    struct Session {
        SeqId kv = -1;                // KV sequence while idle (-1: none or lent to a request)
        SeqId draft_kv = -1;          // the draft model's sequence while idle (a prefix of tokens)
        std::vector<TokenId> tokens;  // [n] the conversation so far
        int32_t n_cached = 0;         // leading tokens whose K/V `kv` holds
        bool busy = false;            // a request runs in it
    };

    struct Part;  // one sequence's share of a step's forward pass
    void finish_empty_requests();
    void admit();
    bool shares_uncomputed_prefix(const Seq& s, int32_t n_cached) const;
    int32_t committed_blocks() const;
    void preempt(Seq& s);
    void finish(Seq& s, StopReason reason, std::string error = {});
    int32_t reserve(Seq& s, std::span<const TokenId> toks, int32_t n_min);
    bool drop_idle_session();
    void sample_and_advance(Seq& s, const float* logits);
    // A sampler for params, with the token texts DRY needs when it is on.
    std::unique_ptr<Sampler> make_sampler(const SamplingParams& params);
    std::span<const TokenId> penalty_window(const Seq& s) const;  // tokens the sampler sees
    RowSampling row_sampling(Seq& s);  // for forward_sample (draws the sequence's uniform)
    // logits: [n_vocab] the distribution tok was drawn from (for the request's logprobs; null
    // when the step sampled on the device, which a request with n_probs never does).
    void advance(Seq& s, TokenId tok, const float* logits = nullptr);
    // The reasoning budget (GenerationRequest::reasoning_budget) after s's newest token tok:
    // tracks the reasoning blocks and starts forcing when the budget runs out inside one.
    void track_reasoning(Seq& s, TokenId tok);
    // The token to output instead of sampling when s is forcing (-1: none, and forcing stops
    // when the grammar refuses the forced token).
    TokenId take_forced(Seq& s);
    void fork_samples(Seq& s);
    StopReason check_stop(Seq& s, TokenId tok);
    void requeue_preempted();
    void update_kv_stats();
    void free_kv(Seq& s);
    void keep_in_session(Seq& s, Session& ses);
    // ---- speculation (engine_speculative.cpp) ----
    void draft_init(Seq& s, Session* session);
    int32_t draft_length(const Seq& s) const;
    void draft_round(std::vector<Part>& parts);
    void lookup_round(std::vector<Part>& parts);  // drafts by prompt lookup
    void draft_forward(const ForwardBatch& fb);
    bool draft_append(Seq& s, std::span<const TokenId> toks);
    void verify_drafts(Seq& s, const float* logits, int32_t k);
    std::vector<TokenId> recent_window(const Seq& s) const;
    Session& session_ref(int32_t id);
    const Session& session_ref(int32_t id) const;

    Backend& backend_;
    const Tokenizer& tok_;
    EngineOptions opt_;
    KvBlockTable table_;
    Backend* draft_ = nullptr;
    std::unique_ptr<KvBlockTable> draft_table_;
    int32_t n_ctx_ = 0, n_ctx_requested_ = 0;
    int32_t next_request_ = 0;
    int32_t next_session_ = 0;
    int64_t next_order_ = 0;
    std::vector<std::unique_ptr<Seq>> running_;
    std::deque<std::unique_ptr<Seq>> waiting_;
    std::map<int32_t, Session> sessions_;
    TokenCallback on_token_;
    FinishCallback on_finish_;
    PromptCallback on_prompt_computed_;
    EngineStats stats_;
    std::vector<float> logits_;                          // [logit rows][n_vocab] of the target pass
    std::vector<float> draft_logits_;                    // [logit rows][n_vocab] of a draft pass
    std::vector<float> p_scratch_;                       // target distributions while verifying
    std::shared_ptr<const GrammarVocab> grammar_vocab_;  // built for the first grammar request
    // [n_vocab] each token's text ("" for control tokens), built for the first DRY request.
    std::shared_ptr<const std::vector<std::string>> token_pieces_;
};

}  // namespace kvrun
