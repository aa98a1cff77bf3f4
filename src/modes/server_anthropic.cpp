// Anthropic's Messages API rewritten to and from chat completions (see server_anthropic.h).
#include "modes/server_anthropic.h"

#include "common.h"
#include "modes/server_tools.h"

namespace kvrun {

namespace {

using ojson = nlohmann::ordered_json;
using nlohmann::json;

// One Anthropic message as OpenAI messages (a user's tool results first, as tool messages).
void convert_message(const ojson& m, size_t i, ojson& out) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
        fail("'messages'[{}] must be an object with a string 'role'", i);
    const std::string role = m["role"].get<std::string>();
    if (role != "user" && role != "assistant")
        fail(
            "'messages'[{}]: role '{}' must be user or assistant (the system prompt is "
            "'system')",
            i, role);
    if (!m.contains("content")) fail("'messages'[{}] has no 'content'", i);
    const ojson& content = m["content"];
    if (content.is_string()) {
        out.push_back({{"role", role}, {"content", content}});
        return;
    }
    if (!content.is_array()) fail("'messages'[{}].content must be text or a list of blocks", i);
    std::string text, thinking;
    ojson calls = ojson::array();
    for (size_t k = 0; k < content.size(); ++k) {
        const ojson& b = content[k];
        const std::string type = b.is_object() ? b.value("type", "") : "";
        const std::string where = fmt::format("'messages'[{}].content[{}]", i, k);
        if (type == "text") {
            if (!b.contains("text") || !b["text"].is_string())
                fail("{} needs a string 'text'", where);
            text += (text.empty() ? "" : "\n") + b["text"].get<std::string>();
        } else if (type == "thinking" && role == "assistant") {
            thinking += b.value("thinking", "");
        } else if (type == "redacted_thinking" && role == "assistant") {
            continue;  // (nothing readable to give back)
        } else if (type == "tool_use" && role == "assistant") {
            if (!b.contains("id") || !b["id"].is_string() || !b.contains("name") ||
                !b["name"].is_string())
                fail("{} (tool_use) needs a string 'id' and 'name'", where);
            const ojson input = b.contains("input") ? b["input"] : ojson::object();
            calls.push_back({{"id", b["id"]},
                             {"type", "function"},
                             {"function", {{"name", b["name"]}, {"arguments", input.dump()}}}});
        } else if (type == "tool_result" && role == "user") {
            if (!b.contains("tool_use_id") || !b["tool_use_id"].is_string())
                fail("{} (tool_result) needs a string 'tool_use_id'", where);
            std::string result = b.contains("content") ? content_text(b["content"], where) : "";
            if (b.value("is_error", false)) result = "Error: " + result;
            out.push_back(
                {{"role", "tool"}, {"tool_call_id", b["tool_use_id"]}, {"content", result}});
        } else if (type == "image" || type == "document") {
            fail("{}: {} blocks are not supported (kvrun runs text models)", where, type);
        } else {
            fail("{}: a block of type '{}' is not supported in a {} message", where, type, role);
        }
    }
    if (role == "user") {
        if (!text.empty() || out.empty() || out.back()["role"] != "tool")
            out.push_back({{"role", "user"}, {"content", text}});
        return;
    }
    ojson msg = {{"role", "assistant"},
                 {"content", text.empty() && !calls.empty() ? ojson() : ojson(text)}};
    if (!thinking.empty()) msg["reasoning_content"] = thinking;
    if (!calls.empty()) msg["tool_calls"] = std::move(calls);
    out.push_back(std::move(msg));
}

}  // namespace

ojson anthropic_to_openai(const ojson& body) {
    if (!body.is_object()) fail("the request body must be a JSON object");
    if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
        fail("missing field 'messages' (a non-empty list of {{\"role\", \"content\"}})");
    ojson out = ojson::object();
    ojson msgs = ojson::array();
    if (body.contains("system") && !body["system"].is_null())
        msgs.push_back({{"role", "system"}, {"content", content_text(body["system"], "'system'")}});
    for (size_t i = 0; i < body["messages"].size(); ++i)
        convert_message(body["messages"][i], i, msgs);
    out["messages"] = std::move(msgs);
    for (const char* key : {"max_tokens", "temperature", "top_p", "top_k", "stream"})
        if (body.contains(key) && !body[key].is_null()) out[key] = body[key];
    if (body.value("stream", false)) out["stream_options"] = {{"include_usage", true}};
    if (body.contains("stop_sequences") && !body["stop_sequences"].is_null()) {
        if (!body["stop_sequences"].is_array()) fail("'stop_sequences' must be a list of texts");
        out["stop"] = body["stop_sequences"];
    }
    if (body.contains("tools") && !body["tools"].is_null()) {
        ojson tools = flat_tools_to_openai(body["tools"], "custom", "custom", "input_schema",
                                           "{\"name\", \"input_schema\"}",
                                           "give a name, a description and an input_schema");
        if (!tools.empty()) out["tools"] = std::move(tools);
    }
    if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
        const ojson& c = body["tool_choice"];
        const std::string type = c.is_object() ? c.value("type", "") : "";
        if (type == "auto") {
            out["tool_choice"] = "auto";
        } else if (type == "any") {
            out["tool_choice"] = "required";
        } else if (type == "none") {
            out["tool_choice"] = "none";
        } else if (type == "tool" && c.contains("name") && c["name"].is_string()) {
            out["tool_choice"] = {{"type", "function"}, {"function", {{"name", c["name"]}}}};
        } else {
            fail(
                "'tool_choice' must be {{\"type\": \"auto\"}}, \"any\", \"none\" or {{\"type\": "
                "\"tool\", \"name\": ...}} (got {})",
                c.dump());
        }
        if (c.value("disable_parallel_tool_use", false)) out["parallel_tool_calls"] = false;
    }
    if (body.contains("thinking") && !body["thinking"].is_null()) {
        const ojson& t = body["thinking"];
        const std::string type = t.is_object() ? t.value("type", "") : "";
        if (type == "enabled") {
            if (!t.contains("budget_tokens") || !t["budget_tokens"].is_number_integer())
                fail("'thinking' of type enabled needs an integer 'budget_tokens'");
            out["reasoning_budget_tokens"] = t["budget_tokens"];
        } else if (type == "disabled") {
            out["reasoning_budget_tokens"] = 0;
            out["chat_template_kwargs"] = {{"enable_thinking", false}};
        } else {
            fail(
                "'thinking' must be {{\"type\": \"enabled\", \"budget_tokens\": N}} or "
                "{{\"type\": \"disabled\"}}");
        }
    }
    return out;
}

std::string anthropic_stop_reason(const json& finish_reason, bool stop_word) {
    if (finish_reason == "length") return "max_tokens";
    if (finish_reason == "tool_calls") return "tool_use";
    return stop_word ? "stop_sequence" : "end_turn";
}

json anthropic_response(const json& c, const std::string& stop_word) {
    const json& choice = c["choices"].at(0);
    const json& m = choice["message"];
    json content = json::array();
    if (m.contains("reasoning_content") && m["reasoning_content"].is_string())
        content.push_back(
            {{"type", "thinking"}, {"thinking", m["reasoning_content"]}, {"signature", ""}});
    if (m.contains("content") && m["content"].is_string() &&
        !m["content"].get<std::string>().empty())
        content.push_back({{"type", "text"}, {"text", m["content"]}});
    if (m.contains("tool_calls"))
        for (const json& call : m["tool_calls"]) {
            json input = json::parse(call["function"]["arguments"].get<std::string>(), nullptr,
                                     /*allow_exceptions=*/false);
            if (input.is_discarded() || !input.is_object()) input = json::object();
            content.push_back({{"type", "tool_use"},
                               {"id", call["id"]},
                               {"name", call["function"]["name"]},
                               {"input", input}});
        }
    const bool by_word = !stop_word.empty() && choice["finish_reason"] == "stop";
    return {{"id", "msg_" + c.value("id", "")},
            {"type", "message"},
            {"role", "assistant"},
            {"model", c.value("model", "")},
            {"content", content},
            {"stop_reason", anthropic_stop_reason(choice["finish_reason"], by_word)},
            {"stop_sequence", by_word ? json(stop_word) : json()},
            {"usage",
             {{"input_tokens", c["usage"].value("prompt_tokens", 0)},
              {"output_tokens", c["usage"].value("completion_tokens", 0)}}}};
}

void AnthropicStream::open(std::vector<Event>& out, const char* type) {
    if (block_ == type) return;
    close(out);
    block_ = type;
    json block = {{"type", type}};
    block[block_ == "thinking" ? "thinking" : "text"] = "";
    out.emplace_back(
        "content_block_start",
        json{{"type", "content_block_start"}, {"index", ++index_}, {"content_block", block}});
}

void AnthropicStream::close(std::vector<Event>& out) {
    if (block_.empty()) return;
    out.emplace_back("content_block_stop", json{{"type", "content_block_stop"}, {"index", index_}});
    block_.clear();
}

std::vector<AnthropicStream::Event> AnthropicStream::feed(const json& chunk) {
    std::vector<Event> out;
    if (done_) return out;
    const bool has_choice = chunk.contains("choices") && !chunk["choices"].empty();
    if (!started_) {
        started_ = true;
        out.emplace_back(
            "message_start",
            json{{"type", "message_start"},
                 {"message",
                  {{"id", "msg_" + chunk.value("id", "")},
                   {"type", "message"},
                   {"role", "assistant"},
                   {"model", chunk.value("model", "")},
                   {"content", json::array()},
                   {"stop_reason", nullptr},
                   {"stop_sequence", nullptr},
                   {"usage", {{"input_tokens", input_tokens_}, {"output_tokens", 0}}}}}});
    }
    if (has_choice) {
        const json& choice = chunk["choices"][0];
        const json delta = choice.value("delta", json::object());
        auto text_of = [&](const char* key) {
            return delta.contains(key) && delta[key].is_string() ? delta[key].get<std::string>()
                                                                 : std::string();
        };
        if (const std::string t = text_of("reasoning_content"); !t.empty()) {
            open(out, "thinking");
            out.emplace_back("content_block_delta",
                             json{{"type", "content_block_delta"},
                                  {"index", index_},
                                  {"delta", {{"type", "thinking_delta"}, {"thinking", t}}}});
        }
        if (const std::string t = text_of("content"); !t.empty()) {
            open(out, "text");
            out.emplace_back("content_block_delta",
                             json{{"type", "content_block_delta"},
                                  {"index", index_},
                                  {"delta", {{"type", "text_delta"}, {"text", t}}}});
        }
        if (delta.contains("tool_calls"))
            for (const json& call : delta["tool_calls"]) {
                close(out);
                ++index_;
                out.emplace_back("content_block_start", json{{"type", "content_block_start"},
                                                             {"index", index_},
                                                             {"content_block",
                                                              {{"type", "tool_use"},
                                                               {"id", call["id"]},
                                                               {"name", call["function"]["name"]},
                                                               {"input", json::object()}}}});
                out.emplace_back("content_block_delta",
                                 json{{"type", "content_block_delta"},
                                      {"index", index_},
                                      {"delta",
                                       {{"type", "input_json_delta"},
                                        {"partial_json", call["function"]["arguments"]}}}});
                out.emplace_back("content_block_stop",
                                 json{{"type", "content_block_stop"}, {"index", index_}});
            }
        if (choice.contains("finish_reason") && !choice["finish_reason"].is_null()) {
            close(out);
            const bool by_word = !stop_word_.empty() && choice["finish_reason"] == "stop";
            stop_reason_ = {
                {"stop_reason", anthropic_stop_reason(choice["finish_reason"], by_word)},
                {"stop_sequence", by_word ? json(stop_word_) : json()}};
        }
    }
    if (chunk.contains("usage") && !chunk["usage"].is_null() && !has_choice) {
        close(out);
        if (stop_reason_.is_null())
            stop_reason_ = {{"stop_reason", "end_turn"}, {"stop_sequence", nullptr}};
        out.emplace_back(
            "message_delta",
            json{{"type", "message_delta"},
                 {"delta", stop_reason_},
                 {"usage", {{"output_tokens", chunk["usage"].value("completion_tokens", 0)}}}});
        out.emplace_back("message_stop", json{{"type", "message_stop"}});
        done_ = true;
    }
    return out;
}

std::string anthropic_error_body(int status, std::string_view message) {
    const char* type = status == 401   ? "authentication_error"
                       : status == 404 ? "not_found_error"
                       : status == 503 ? "overloaded_error"
                       : status >= 500 ? "api_error"
                                       : "invalid_request_error";
    const json body = {{"type", "error"}, {"error", {{"type", type}, {"message", message}}}};
    return body.dump(-1, ' ', false, json::error_handler_t::replace);  // (bad UTF-8 replaced)
}

}  // namespace kvrun
