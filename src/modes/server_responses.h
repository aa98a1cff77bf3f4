// OpenAI's Responses API (POST /v1/responses), as vLLM's, Ollama's and llama.cpp's servers
// offer it for clients such as the OpenAI Agents SDK and Codex: a request is rewritten into a
// chat completions request, which runs as any other, and its answer (whole, or streamed as
// chat completion chunks) is rewritten into a response object and its events. Responses are
// kept in memory (ResponsesStore) for `previous_response_id` and GET/DELETE
// /v1/responses/{id}. JSON in, JSON out; no model here.
#pragma once

#include <functional>
#include <list>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvrun {

// The chat completions request for a Responses one: "instructions" becomes a system message;
// "input" (a text, or items: messages with text parts, an assistant's "reasoning",
// "function_call" and text items merged into one assistant message, "function_call_output"
// items as tool messages) the messages; function "tools" ({type, name, description,
// parameters}), "tool_choice", "parallel_tool_calls", "max_output_tokens", "temperature",
// "top_p", "stream" carry over; "reasoning.effort" becomes reasoning_effort ("none": no
// thinking), "text.format" the response_format. `history`: the conversation of the response
// named by previous_response_id (ResponsesStore), put between the instructions and the input
// (a request naming one without it is refused). Throws Error for what kvrun cannot do
// (images, files, built-in tools) or a malformed body.
nlohmann::ordered_json responses_to_openai(const nlohmann::ordered_json& body,
                                           const nlohmann::ordered_json* history = nullptr);

// OpenAI's "truncation": with "auto", `chat` (responses_to_openai's request) with its oldest
// conversation messages dropped, after the system ones (the instructions), while
// `too_long(chat)` and more than one is left (an assistant's tool calls go with their
// results); the last call of `too_long` is on the request returned. With "disabled" or none,
// `chat` as it is (`too_long` is not called). Throws Error for another value.
nlohmann::ordered_json responses_truncate(
    const nlohmann::ordered_json& body, nlohmann::ordered_json chat,
    const std::function<bool(const nlohmann::ordered_json&)>& too_long);

// What a stored response keeps for the next turn: the chat request's messages without the
// request's instructions (a later request gives its own), then the answer's message.
nlohmann::ordered_json responses_conversation(const nlohmann::ordered_json& chat_request,
                                              const nlohmann::ordered_json& body,
                                              const nlohmann::json& chat_completion);

// Responses kept for previous_response_id and GET / DELETE /v1/responses/{id}: the newest
// `capacity` of them, in memory only (a restart forgets them). Thread-safe.
class ResponsesStore {
  public:
    struct Entry {
        nlohmann::ordered_json conversation;  // responses_conversation's
        nlohmann::json response;              // the response object
    };
    explicit ResponsesStore(size_t capacity = 256) : capacity_(capacity) {}
    void put(const std::string& id, Entry entry);
    std::optional<Entry> get(const std::string& id) const;
    bool erase(const std::string& id);

  private:
    mutable std::mutex mu_;
    std::list<std::string> order_;  // oldest first
    std::unordered_map<std::string, Entry> entries_;
    size_t capacity_;
};

// The whole answer: a chat completion (one choice) as a response object whose output is a
// reasoning item, a message with its output_text and a function_call item per call. With
// "include": ["reasoning.encrypted_content"] the reasoning item also carries its text as
// encrypted_content (opaque, not encrypted), which an input reasoning item may send back
// alone: responses_to_openai reads it (and skips another server's).
// `request` is the Responses body (its settings are echoed).
nlohmann::json responses_response(const nlohmann::json& chat_completion,
                                  const nlohmann::ordered_json& request);

// A streamed answer: fed the chat completion chunks in order (the last one the usage chunk),
// gives the Responses events as (name, data) pairs: response.created and
// response.in_progress, then per output item response.output_item.added, its parts' deltas
// (reasoning_text, output_text, function_call_arguments) and their .done events,
// response.output_item.done, and last response.completed (response.incomplete when
// max_output_tokens cut the reply; response.failed after an error, fail()) with the whole
// response.
class ResponsesStream {
  public:
    using Event = std::pair<std::string, nlohmann::json>;
    ResponsesStream(nlohmann::ordered_json request, int64_t input_tokens)
        : request_(std::move(request)), input_tokens_(input_tokens) {}
    std::vector<Event> feed(const nlohmann::json& chunk);
    // The reply failed (an error in the engine): an "error" event, then response.failed with
    // the output so far; later chunks give nothing.
    std::vector<Event> fail(const std::string& message);

  private:
    void emit(std::vector<Event>& out, const std::string& name, nlohmann::json data);
    void open(std::vector<Event>& out, const std::string& type);
    void close(std::vector<Event>& out);
    nlohmann::ordered_json request_;
    int64_t input_tokens_;
    int64_t sequence_ = 0;
    bool started_ = false, done_ = false;
    std::string id_, model_;
    int64_t created_ = 0;
    std::string open_;  // the open item's type ("reasoning", "message"; "" when none)
    std::string text_;  // its text so far
    nlohmann::json output_ = nlohmann::json::array();  // the finished items
    nlohmann::json finish_reason_;
};

}  // namespace kvrun
