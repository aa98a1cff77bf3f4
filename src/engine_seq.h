// Engine internals shared by engine.cpp (scheduler) and engine_speculative.cpp (drafting and
// verification): the state of one running or waiting sequence, and one sequence's share of a
// step's forward pass. Not part of the engine's interface.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine.h"
#include "grammar.h"

namespace kvrun {

// One running or waiting sequence: a request's prompt plus what it generated so far.
struct Engine::Seq {
    int32_t request = 0;
    int32_t sample = 0;
    std::shared_ptr<const GenerationRequest> req;
    SeqId kv = -1;                // KV table sequence while admitted
    std::vector<TokenId> tokens;  // [n_prompt + n_generated]
    int32_t n_prompt = 0;
    int32_t n_computed = 0;  // tokens whose K/V are in the cache
    int64_t order = 0;       // admission order (larger = younger)
    bool forked = false;     // parallel samples already created
    bool preempted = false, finished = false;
    std::unique_ptr<Sampler> sampler;
    std::unique_ptr<GrammarConstraint> grammar;  // the request's grammar (sampler's constraint)
    // Generated text so far (only kept for stop strings, n_indent and max_predict_ms), after
    // the request's stop_text_before; text_start: where the generated text starts in it.
    std::string text;
    size_t text_start = 0;
    bool drop_newest = false;  // n_indent ended the reply at the newest token: not output
    std::vector<TokenLogprobs> logprobs;  // [n_generated] when the request asks for them
    int32_t preemptions = 0;
    bool admitted_once = false, has_first = false;
    Clock::time_point t_submit, t_admit, t_first, t_last;
    int32_t n_prompt_computed = 0;
    int32_t n_passes = 0;  // target forward passes it took part in

    // Reasoning budget (GenerationRequest::reasoning_budget): where the reply stands. Copied
    // whole to the samples a request forks into.
    struct Think {
        bool inside = false;          // inside a reasoning block
        int32_t tokens = 0;           // generated inside blocks so far
        std::string tail;             // the reply's last bytes, where a tag may be split
        std::vector<TokenId> forced;  // tokens output instead of sampled, from next on
        size_t next = 0;
        bool last_forced = false;  // the newest token was a forced one
    } think;
    bool forcing() const { return think.next < think.forced.size(); }

    // Speculation (engine with a draft model).
    SeqId draft_kv = -1;  // the draft's KV sequence: a prefix of `tokens`
    int32_t k = 0;        // adaptive draft length for the next round
    std::unique_ptr<Sampler> draft_sampler;
    std::unique_ptr<GrammarConstraint> draft_grammar;  // the grammar after this round's drafts
    std::vector<TokenId> drafts;  // [k] this round's drafts; after verification, the output
    std::vector<float> q;         // [k][n_vocab] draft distributions (sampling only)
    int32_t n_drafted = 0, n_accepted = 0, n_spec_rounds = 0;

    int32_t n_generated() const { return static_cast<int32_t>(tokens.size()) - n_prompt; }
    int32_t n_tokens() const { return static_cast<int32_t>(tokens.size()); }
};

// One sequence's share of a step's target pass: tokens [start, start + n) of its sequence and
// k drafts after them; logits for the last k + 1 rows when `logits` (the part reaches the
// sequence's end), none for an earlier prefill chunk.
struct Engine::Part {
    Seq* s = nullptr;
    int32_t start = 0, n = 0;
    bool logits = false;
    int32_t k = 0;
    bool reserved = false;
};

}  // namespace kvrun
