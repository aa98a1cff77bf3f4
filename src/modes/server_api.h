// The server's HTTP API, without sockets: OpenAI's /v1/completions and /v1/chat/completions
// and llama.cpp server's /completion requests become GenerationRequests, and what the
// engine generates becomes their JSON responses and server-sent-event chunks.
//
// A request's fields are llama.cpp server's (request_json.h: temperature, top_k, top_p,
// min_p, repeat_penalty, seed, grammar, json_schema, logit_bias, n_probs, ...) plus OpenAI's
// names for the same things: max_tokens / max_completion_tokens (n_predict), n (samples),
// stop as one string, logprobs / top_logprobs, response_format ({"type": "json_object"} or
// {"type": "json_schema", "json_schema": {"schema": ...}}), stream and
// stream_options.include_usage. Fields a client sets to null keep the server's defaults;
// fields kvrun does not know are ignored (clients send many), but ones it cannot honour
// (images, best_of > n, echo outside /v1/completions) are refused with a clear
// message. A list of prompts runs as that many requests (at most kMaxApiPrompts). Chat
// requests may carry tools (server_tools.h). /infill (input_prefix, input_suffix,
// input_extra, prompt) and OpenAI's "suffix" fill in the middle (infill.h).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base64.h"
#include "chat_format.h"
#include "chat_template.h"
#include "modes/request_json.h"
#include "modes/server_tools.h"
#include "stop_text.h"
#include "tokenizer.h"

namespace kvrun {

enum class ApiFormat {
    Completion,        // llama.cpp server's POST /completion
    OpenAiCompletion,  // POST /v1/completions
    OpenAiChat,        // POST /v1/chat/completions
    Infill,            // llama.cpp server's POST /infill (fill in the middle; infill.h)
};

// llama.cpp's own formats (/completion, /infill) rather than OpenAI's.
inline bool api_native(ApiFormat f) {
    return f == ApiFormat::Completion || f == ApiFormat::Infill;
}

// What the server knows when it reads a request.
struct ApiContext {
    RequestDefaults defaults;  // the command line's sampling, -n, --stop, ...
    std::string model_id;      // "model" in responses
    ChatFormat chat;           // how chats are written, and their end-of-turn tokens and texts
    // Fill in the middle: the tokens one sequence holds (0: no limit), and --spm-infill.
    int64_t n_ctx_seq = 0;
    bool spm_infill = false;
    // --reasoning-format deepseek (the default): a chat format that thinks (reasoning.h) has
    // its replies' reasoning returned apart; none: replies stay whole; deepseek-legacy: apart,
    // and the content stays whole too.
    bool reasoning = true;
    bool reasoning_keep_content = false;
    // --chat-template-kwargs: more variables for a Jinja template (an object, or null); a
    // request's "chat_template_kwargs" add to them.
    nlohmann::ordered_json template_kwargs;
};

// An Error as one line for an HTTP answer: the message and its hint.
std::string error_text(const Error& e);

struct ApiRequest {
    ApiFormat format = ApiFormat::OpenAiCompletion;
    // One per prompt: OpenAI's "prompt" may list several (their choices come prompt by
    // prompt, each prompt's n samples together); otherwise one.
    std::vector<GenerationRequest> requests;
    std::vector<std::string> stop;          // texts the output ends before (request and template)
    std::vector<std::string> prompt_texts;  // [requests.size()] as given (or decoded ids)
    // OpenAI's "echo" (/v1/completions): each choice's text starts with its prompt, and with
    // logprobs the prompt's tokens get theirs (the first one null) — lm-evaluation-harness
    // scores continuations this way.
    bool echo = false;
    // llama-server's "n_keep": --context-shift's --keep for this request (-1: the whole prompt).
    std::optional<int32_t> n_keep;
    // llama-server's "id_slot": the slot whose remembered tokens (server_slots.h) this
    // request's become; -1: the least recently used.
    int32_t id_slot = -1;
    // A chat without tools on Functionary v3.2's template: the reply's text is its "all" part
    // (the model writes "all\n" first, after the prompt's ">>>"), read as that format does.
    bool v32_text = false;
    bool stream = false;
    bool include_usage = false;  // stream_options.include_usage: a last chunk with "usage"
    int32_t top_logprobs = -1;   // OpenAI logprobs: alternatives shown (-1: no logprobs)
    // Chat with tools: the reply is generated in server_tools.h's JSON format and shown as
    // tool calls or content once the choice ends (streams send no text deltas before).
    std::optional<ChatTools> tools;
    // Chat replies' reasoning returned apart ("reasoning_content"); the prompt opened the
    // reasoning block (the reply starts inside it).
    bool reasoning = false;
    bool reasoning_open = false;
    bool reasoning_keep_content = false;  // deepseek-legacy: "content" keeps the reasoning
    // Control tokens the text shows (llama.cpp's "preserved_tokens": the request's, and a
    // native tool syntax's markers).
    std::vector<TokenId> preserved_tokens;
    bool prompt_list = false;  // "prompt" listed prompts (/completion then answers a list)
    bool truncated = false;    // infill: prefix, suffix or extra files cut to fit the context
    // OpenAI's older "functions" / "function_call" (chat_functions_to_tools): the reply's call
    // comes back as the message's "function_call", finish_reason "function_call".
    bool legacy_functions = false;
    // llama-server's "response_fields" (/completion, /infill): the answer holds only these,
    // each "a/b" path under its own name at the root (api_pick_fields).
    std::vector<std::string> response_fields;
};

// The fields `paths` of a whole answer (a list: of each element): each "a/b/c" path found
// becomes a key of that name at the root; paths not found are left out.
nlohmann::json api_pick_fields(const nlohmann::json& answer, const std::vector<std::string>& paths);

constexpr size_t kMaxApiPrompts = 256;

// llama.cpp server's /apply-template: a chat request's "messages" (and "tools") as the prompt
// text /v1/chat/completions would generate from. Throws Error like api_request_from_json.
std::string api_chat_prompt(const std::string& body, const ApiContext& ctx);

// Throws Error with the reason (the server answers 400 with it).
ApiRequest api_request_from_json(ApiFormat format, const std::string& body, const ApiContext& ctx,
                                 const Tokenizer& tok);

// One sample's text as it is generated: whole UTF-8 characters, cut before a stop string.
class ApiTextStream {
  public:
    ApiTextStream(const Tokenizer& tok, const std::vector<std::string>& stops,
                  const std::vector<TokenId>& preserved = {})
        : decoder_(tok), text_(stops) {
        decoder_.show_tokens(preserved);
    }
    std::string push(TokenId token) { return text_.push(decoder_.push(token)); }
    std::string finish() {
        std::string out = text_.push(decoder_.flush());
        return out + text_.finish();
    }
    const std::string& text() const { return text_.shown(); }
    const StopTextStream& stops() const { return text_; }

  private:
    StreamDecoder decoder_;
    StopTextStream text_;
};

// "stop", "length", or null for a generation that did not end normally.
nlohmann::json api_finish_reason(StopReason stop);

// Identifies one response: "cmpl-..."/"chatcmpl-..." id, creation time, model.
struct ApiResponseMeta {
    std::string id;
    int64_t created = 0;
    std::string model;
};

// One streamed chunk carrying `delta` for choice `index` (OpenAI formats: the first chat chunk
// of a choice also carries the role; llama.cpp's: {"content", "stop": false}) and, with
// logprobs, those of the tokens generated since the last chunk (`offset`: the bytes of the
// choice's text before them).
// `reasoning`: reasoning text for the chat delta's "reasoning_content" (its "content" then
// only when `delta` is not empty).
nlohmann::json api_stream_chunk(const ApiRequest& req, const ApiResponseMeta& meta, int32_t index,
                                const std::string& delta, bool first, const Tokenizer& tok,
                                const std::vector<TokenLogprobs>& logprobs = {}, size_t offset = 0,
                                const std::string& reasoning = "");

// With tools or reasoning, what a stream may show of a chat reply so far: its reasoning and
// its content (prefixes of what the finished reply gives; tool calls show at the end).
struct ApiStreamView {
    std::string reasoning;
    std::string content;
};
ApiStreamView api_stream_view(const ApiRequest& req, std::string_view reply);

// A finished sample as the response shows it.
struct ApiChoiceResult {
    int32_t index = 0;  // the choice's "index": prompt x n + sample
    std::string text;   // cut before the stop string
    // echo: the prompt's text before `text`, and with logprobs its tokens and, for each token
    // after the first, prompt_logprobs' entry.
    std::string echo_text;
    std::vector<TokenId> echo_tokens;
    std::vector<TokenLogprobs> echo_logprobs;
    GenerationResult result;
    std::string stop_word;  // the stop string that ended it ("" for none)
};

// With tools or reasoning: the chunk carrying a finished choice's tool calls and the rest of
// its reasoning and content after the bytes streamed while it was generated
// (api_stream_view); sent before its final chunk. null: nothing left to send.
nlohmann::json api_stream_reply_chunk(const ApiRequest& req, const ApiResponseMeta& meta,
                                      const ApiChoiceResult& choice, size_t content_sent,
                                      size_t reasoning_sent, bool first);

// With echo (text completions), the first chunk of a choice: the prompt's text, and with
// logprobs its tokens' (the first null), as many entries as it has tokens.
nlohmann::json api_stream_echo_chunk(const ApiRequest& req, const ApiResponseMeta& meta,
                                     const ApiChoiceResult& choice, const Tokenizer& tok);

// The last streamed chunk of a choice (its finish reason, and the logprob entries not sent
// yet: from `logprobs_sent` on, counting the prompt's with echo; llama.cpp's: the whole
// result with "stop": true).
nlohmann::json api_stream_final_chunk(const ApiRequest& req, const ApiResponseMeta& meta,
                                      const ApiChoiceResult& choice, const Tokenizer& tok,
                                      size_t logprobs_sent = 0);
// The usage chunk after every choice finished (stream_options.include_usage).
nlohmann::json api_usage_chunk(const ApiRequest& req, const ApiResponseMeta& meta,
                               const std::vector<ApiChoiceResult>& choices);
// A whole (not streamed) response.
nlohmann::json api_response(const ApiRequest& req, const ApiResponseMeta& meta,
                            const std::vector<ApiChoiceResult>& choices, const Tokenizer& tok);

// /v1/embeddings: "input" (or llama.cpp's "content"): a string, a list of strings, token
// ids, or a list of token-id lists -> one prompt each (strings get BOS when the vocabulary
// wants it). Throws Error for anything else, an empty input, or an id outside the vocabulary.
std::vector<std::vector<TokenId>> api_embedding_inputs(const nlohmann::json& body,
                                                       const Tokenizer& tok);
// /rerank's body (llama-server's, Jina's and Cohere's fields): "query", "documents" (or TEI's
// "texts": texts or {"text"} objects, at most 4096), "top_n", "return_text" /
// "return_documents", "instruction" (default kRerankInstruction). Throws Error for a missing
// or malformed field.
struct ApiRerankRequest {
    std::string query, instruction;
    std::vector<std::string> documents;
    int64_t top_n = 0;
    bool with_text = false;
};
ApiRerankRequest api_rerank_request(const nlohmann::json& body);
// The answer: "results" of {"index", "relevance_score", "document"?}, the most relevant
// first, top_n of them; "usage" counts n_tokens.
nlohmann::json api_rerank_response(const ApiRerankRequest& req, const std::vector<double>& scores,
                                   const std::string& model_id, int64_t n_tokens);

// OpenAI's embeddings list; base64: each vector as the base64 of its little-endian float32
// bytes ("encoding_format": "base64").
nlohmann::json api_embedding_response(const std::vector<std::vector<float>>& vectors,
                                      const std::string& model, int64_t n_prompt_tokens,
                                      bool base64);

}  // namespace kvrun
