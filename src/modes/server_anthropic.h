// Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens), as llama.cpp's and
// vLLM's servers offer it for clients such as Claude Code: a request is rewritten into a chat
// completions request, which runs as any other, and its answer (whole, or streamed as OpenAI
// chunks) is rewritten into Anthropic's message and events. JSON in, JSON out; no model here.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvrun {

// The chat completions request for an Anthropic one: "system" (text or text blocks) becomes a
// system message; each message's blocks become OpenAI's (text; an assistant's "thinking" its
// reasoning_content, its "tool_use" blocks tool calls; a user's "tool_result" blocks tool
// messages before its text); "tools" ({name, description, input_schema}), "tool_choice"
// (auto, any, tool, none; disable_parallel_tool_use), "stop_sequences", "max_tokens",
// "temperature", "top_p", "top_k", "stream" carry over, and "thinking" becomes a reasoning
// budget (enabled: budget_tokens; disabled: 0 and the template's enable_thinking off).
// Throws Error for what kvrun cannot do (images, documents, server tools) or a malformed body.
nlohmann::ordered_json anthropic_to_openai(const nlohmann::ordered_json& body);

// OpenAI's finish_reason as Anthropic's stop_reason ("stop" with a stop text matched:
// stop_sequence).
std::string anthropic_stop_reason(const nlohmann::json& finish_reason, bool stop_word);

// The whole answer: a chat completion (one choice) as an Anthropic message, its content the
// thinking, text and tool_use blocks. `stop_word`: the stop text that ended it ("" if none).
nlohmann::json anthropic_response(const nlohmann::json& chat_completion,
                                  const std::string& stop_word);

// A streamed answer: fed the chat completion chunks in order (the last one the usage chunk),
// gives Anthropic's events as (name, data) pairs: message_start, then per block
// content_block_start / content_block_delta... / content_block_stop (thinking, text, each
// tool_use with its arguments as one input_json_delta), then message_delta (stop_reason,
// output_tokens) and message_stop.
class AnthropicStream {
  public:
    using Event = std::pair<std::string, nlohmann::json>;
    explicit AnthropicStream(int64_t input_tokens) : input_tokens_(input_tokens) {}
    // The stop text that ended the reply, when one did (before the finishing chunk).
    void set_stop_word(std::string word) { stop_word_ = std::move(word); }
    std::vector<Event> feed(const nlohmann::json& chunk);

  private:
    void open(std::vector<Event>& out, const char* type);
    void close(std::vector<Event>& out);
    int64_t input_tokens_;
    bool started_ = false, done_ = false;
    std::string block_;  // the open block's type ("" when none)
    int index_ = -1;     // the latest block's index
    std::string stop_word_;
    nlohmann::json stop_reason_;
};

// Anthropic's error body: {"type": "error", "error": {"type", "message"}}.
std::string anthropic_error_body(int status, std::string_view message);

}  // namespace kvrun
