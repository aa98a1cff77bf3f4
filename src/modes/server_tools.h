// OpenAI tool (function) calling for /v1/chat/completions, on any model.
//
// kvrun's chat templates are built in (chat_template.h), not Jinja, so tools are not written
// in each model family's own trained format. Instead every model gets one generic format
// (the idea of llama.cpp's "generic" tool-call handler): the system prompt lists the tools
// as JSON and asks for one JSON object back,
//   {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}   or
//   {"response": "the answer to the user"},
// and a grammar built from the tools' parameter schemas makes that the only thing the model
// can write: a call always names a listed tool and its arguments always match its schema.
// The reply is then read back into OpenAI's message: "tool_calls" (each with an id, the
// name and the arguments as a JSON string; finish_reason "tool_calls") or "content" (which a
// stream shows as it is generated: tool_answer_prefix).
//
// tool_choice: "auto" (call or answer), "required" (at least one call), {"type":
// "function", "function": {"name": ...}} (that tool), "none" (no tools: plain chat).
// parallel_tool_calls: false allows exactly one call per reply.
//
// The conversation may carry earlier calls and their results: an assistant message's
// "tool_calls" are written as the JSON object the model would have produced, and "tool"
// messages (consecutive ones together) as a user message {"tool_results": [{"tool_call_id",
// "name", "content"}]}.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "chat_template.h"

namespace kvrun {

struct ChatTools {
    // [{"name", "description"?, "parameters"}], as the request listed them.
    nlohmann::ordered_json functions = nlohmann::ordered_json::array();
    std::string only;       // tool_choice naming one function: its name ("" otherwise)
    bool required = false;  // tool_choice "required" (or naming a function)
    bool parallel = true;   // parallel_tool_calls
};

// The request's "tools", "tool_choice" and "parallel_tool_calls"; nullopt without tools or
// with tool_choice "none". Throws Error for a malformed list, a tool without a name, twice
// the same name, or a tool_choice naming no listed tool.
std::optional<ChatTools> chat_tools_from_json(const nlohmann::ordered_json& request);

// The text added to the system prompt: the tools and the reply format.
std::string chat_tools_instructions(const ChatTools& tools);

// The JSON schema every reply must match (the generation's grammar).
nlohmann::ordered_json chat_tools_schema(const ChatTools& tools);

// The request's "messages" as chat messages (tool calls and results written as described
// above; "developer" is "system"). Throws Error naming the bad message.
std::vector<ChatMessage> chat_messages_from_json(const nlohmann::ordered_json& messages);

struct ToolCall {
    std::string id;
    std::string name;
    std::string arguments;  // a JSON object's compact text
};

// A reply read back: tool calls, or the answer text. A reply that is not the format (cut
// short by max_tokens, say) comes back whole as content.
struct ChatToolReply {
    std::string content;
    std::vector<ToolCall> calls;
};
// Ids are id_prefix + "_" + the call's position. An answer cut short ({"response": "It is
// with no closing quote, max_tokens) gives the answer text so far.
ChatToolReply chat_tools_parse(const std::string& text, const std::string& id_prefix);

// A reply read while it is generated: whether it is (so far) an answer {"response": "...",
// and the answer's text whose characters are already known (escapes decoded; an escape or
// surrogate pair not yet whole waits). A stream shows an answer as it comes.
struct ToolAnswerPrefix {
    bool answer = false;  // the text so far begins an answer
    bool decided = true;  // false: too little text to tell yet
    std::string text;
};
ToolAnswerPrefix tool_answer_prefix(std::string_view reply);

// OpenAI's "tool_calls" list of a message (with "index" for a streamed delta).
nlohmann::json tool_calls_json(const std::vector<ToolCall>& calls, bool with_index);

}  // namespace kvrun
