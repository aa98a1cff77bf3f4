// JSON requests and results shared by `run --jsonl` and `batch`: one request object per
// input line ({"prompt": ..., "n_predict": ..., sampling fields, "n_samples", "stop", "id"})
// becomes a GenerationRequest; finished generations become one result object.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "chat_format.h"
#include "chat_template.h"
#include "engine.h"
#include "grammar.h"
#include "sampler.h"
#include "tokenizer.h"

namespace kvrun {

// How "messages" requests are written: the model's format as chat_template_choose picks it
// without options (a note, if any, on stderr); its end-of-turn tokens and texts end the reply.
std::shared_ptr<const ChatFormat> request_chat_for(const GgufFile& file, const Tokenizer& tok);

// What a request gets for the fields it leaves out (the command-line flags).
struct RequestDefaults {
    SamplingParams sampling;
    int32_t n_predict = 128;
    int32_t n_samples = 1;
    bool ignore_eos = false;
    std::vector<std::string> stop;
    bool add_bos = true;  // add BOS when the vocabulary wants it
    bool parse_special = false;
    std::shared_ptr<const Grammar> grammar;  // --grammar (null: unconstrained)
    int32_t n_probs = 0;                     // --n-probs
    int32_t n_lora = 0;                      // LoRA adapters loaded (--lora, --lora-scaled)
    std::shared_ptr<const ChatFormat> chat;  // null: "messages" requests are refused
    // The prompt is a rendered chat (the server's chat completions), as a "messages" request's.
    bool chat_prompt = false;
    // --reasoning-budget (-1: none) and --reasoning-budget-message for chat requests.
    int32_t reasoning_budget = -1;
    std::string reasoning_budget_message;
};

struct ParsedRequest {
    GenerationRequest request;
    std::string prompt_text;
    nlohmann::json id;  // the request's "id" field, echoed in its result (null when absent)
    // "n_keep" (llama-server's field): --context-shift's --keep for this request (-1: the
    // whole prompt); unset when absent. Without --context-shift it changes nothing.
    std::optional<int32_t> n_keep;
};

// Parses one JSONL request. Fields: prompt (string, required, non-empty UTF-8; or an array of
// token ids, used as they are, without BOS) or messages ([{"role", "content"}], a
// conversation written in the chat format with the assistant's header; its end-of-turn
// tokens end the reply), n_predict
// (-1: no limit, 0: nothing generated; anything below -1 is refused),
// temperature, top_k, top_p, min_p, repeat_penalty, frequency_penalty, presence_penalty,
// repeat_last_n, seed, n_samples (1-256),
// ignore_eos, stop (array of strings), grammar (GBNF text; "" for none), grammar_lazy and
// grammar_triggers (grammar_options.h), json_schema (a JSON
// Schema object or its text), n_probs (0-100: report logprobs), n_keep (-1 or a count >= 0;
// ParsedRequest::n_keep), t_max_predict_ms and n_indent (GenerationRequest::max_predict_ms,
// n_indent), id (any JSON value), lora
// ([{"id": ADAPTER, "scale": S}, ...] as llama.cpp's server: the scale of each loaded
// adapter, in --lora order; an adapter left out gets 0); chat requests ("messages", or
// defaults.chat_prompt) also reasoning_budget_tokens (or thinking_budget_tokens: -1 for no
// budget, else the most tokens the reply may think; reasoning_budget_for in reasoning.h) and
// reasoning_budget_message.
// Throws Error with the reason.
ParsedRequest request_from_json(const std::string& line, const RequestDefaults& defaults,
                                const Tokenizer& tok);

// A request's "lora": [{"id": ADAPTER, "scale": S}, ...] -> one scale per loaded adapter (0
// for those left out). Throws Error for a malformed list, an id not loaded or given twice, a
// scale out of range, or no adapters loaded.
std::vector<float> lora_scales_from_json(const nlohmann::json& j, int32_t n_lora);

// Builds a request from a plain prompt text with the defaults.
GenerationRequest request_from_text(const std::string& prompt_text, const RequestDefaults& defaults,
                                    const Tokenizer& tok);

// decode_tokens_per_s is null when there is no meaningful rate (GenerationTimings::
// has_decode_rate: fewer than two tokens, or all of them within a millisecond).
nlohmann::json timings_to_json(const GenerationTimings& t);

// [{"id", "token", "bytes", "logprob", "top_logprobs": [{"id", "token", "bytes", "logprob"},
// ...]}, ...]: one entry per generated token (llama.cpp server's layout).
// `shown`: control tokens whose text the output shows (sorted; llama.cpp's preserved_tokens).
nlohmann::json logprobs_to_json(const std::vector<TokenLogprobs>& lps, const Tokenizer& tok,
                                const std::vector<TokenId>& shown = {});

// One generation: {"tokens", "text", "stop", "preemptions", "timings"} (+ "error"), with
// `speculative` {"speculative": {"drafted", "accepted", "rounds", "target_passes"}}, and when
// the request asked for them "logprobs": [{"id", "token", "bytes", "logprob",
// "top_logprobs": [{"id", "token", "bytes", "logprob"}, ...]}, ...] (one per token).
// `special`: control tokens show their text in "text" (--special).
nlohmann::json generation_to_json(const GenerationResult& r, const Tokenizer& tok,
                                  bool speculative = false, bool special = false);

// A request's result: sample 0's fields plus "prompt_tokens", and with several samples a
// "samples" array holding each one. `samples` is indexed by sample number.
nlohmann::json request_result_to_json(const std::vector<GenerationResult>& samples,
                                      const std::vector<TokenId>& prompt_tokens,
                                      const Tokenizer& tok, bool speculative = false,
                                      bool special = false);

// For each generation of `result` (and its "samples") that ended on a stop string, adds
// "stopping_word": the one of `stops` that occurs first in its "text", and cuts the text
// before it (as llama.cpp's server; "tokens" keep every generated token).
void add_stopping_words(nlohmann::json& result, const std::vector<std::string>& stops);

// One JSON line: compact, invalid UTF-8 replaced by U+FFFD.
std::string json_line(const nlohmann::json& j);

}  // namespace kvrun
