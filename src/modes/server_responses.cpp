// OpenAI's Responses API rewritten to and from chat completions (see server_responses.h).
#include "modes/server_responses.h"

#include "base64.h"
#include "common.h"
#include "modes/server_tools.h"

namespace kvrun {

namespace {

using ojson = nlohmann::ordered_json;
using nlohmann::json;

// A reasoning item's "encrypted_content" (with "include": ["reasoning.encrypted_content"], as
// clients that keep no state on the server ask, Codex with "store": false): the reasoning
// text behind this marker, in base64. Not encrypted, only opaque: the client sends it back
// and the next turn's template gets the reasoning again.
constexpr std::string_view kOpaqueReasoning = "kvrun-reasoning-1\n";

bool wants_opaque_reasoning(const ojson& request) {
    if (!request.contains("include") || !request["include"].is_array()) return false;
    for (const ojson& v : request["include"])
        if (v == "reasoning.encrypted_content") return true;
    return false;
}

// The reasoning text of an encrypted_content this server wrote; "" for anything else
// (another server's, which only it can read).
std::string opaque_reasoning_text(const ojson& item) {
    if (!item.contains("encrypted_content") || !item["encrypted_content"].is_string()) return {};
    const auto bytes = base64_decode(item["encrypted_content"].get<std::string>());
    if (!bytes || !bytes->starts_with(kOpaqueReasoning)) return {};
    return bytes->substr(kOpaqueReasoning.size());
}

// An input item's text parts (input_text, output_text, text, refusal) joined by newlines.
std::string parts_text(const ojson& content, const std::string& where) {
    if (content.is_null()) return {};
    if (content.is_string()) return content.get<std::string>();
    if (!content.is_array()) fail("{}.content must be a text or a list of parts", where);
    std::string text;
    for (size_t k = 0; k < content.size(); ++k) {
        const ojson& p = content[k];
        const std::string type = p.is_object() ? p.value("type", "") : "";
        if (type == "input_image" || type == "input_file" || type == "input_audio")
            fail("{}.content[{}]: {} parts are not supported (kvrun runs text models)", where, k,
                 type);
        const char* key = type == "refusal" ? "refusal" : "text";
        if ((type != "input_text" && type != "output_text" && type != "text" && type != "refusal" &&
             type != "reasoning_text" && type != "summary_text") ||
            !p.contains(key) || !p[key].is_string())
            fail("{}.content[{}] must be a text part ({{\"type\": \"input_text\", \"text\": ...}})",
                 where, k);
        if (!text.empty()) text += "\n";
        text += p[key].get<std::string>();
    }
    return text;
}

// The conversation of "input": consecutive assistant items (reasoning, text, calls) become
// one assistant message, as the chat template expects.
ojson input_messages(const ojson& input) {
    ojson out = ojson::array();
    if (input.is_string()) {
        out.push_back({{"role", "user"}, {"content", input}});
        return out;
    }
    if (!input.is_array() || input.empty()) fail("'input' must be a text or a non-empty list");
    ojson assistant;  // the assistant message being gathered (null: none)
    auto flush = [&] {
        if (assistant.is_null()) return;
        if (!assistant.contains("content")) assistant["content"] = nullptr;
        out.push_back(std::move(assistant));
        assistant = nullptr;
    };
    auto gather = [&]() -> ojson& {
        if (assistant.is_null()) assistant = {{"role", "assistant"}};
        return assistant;
    };
    for (size_t i = 0; i < input.size(); ++i) {
        const ojson& item = input[i];
        const std::string where = fmt::format("'input'[{}]", i);
        if (!item.is_object()) fail("{} must be an object", where);
        const std::string type = item.value("type", "message");
        if (type == "message") {
            const std::string role = item.value("role", "");
            if (role != "user" && role != "assistant" && role != "system" && role != "developer")
                fail("{}: role '{}' must be user, assistant, system or developer", where, role);
            const std::string text =
                parts_text(item.contains("content") ? item["content"] : ojson(), where);
            if (role == "assistant") {
                ojson& a = gather();
                const std::string before = a.contains("content") && a["content"].is_string()
                                               ? a["content"].get<std::string>()
                                               : "";
                a["content"] = before.empty() ? text : before + "\n" + text;
                continue;
            }
            flush();
            out.push_back({{"role", role == "developer" ? "system" : role}, {"content", text}});
        } else if (type == "reasoning") {
            std::string text;
            for (const char* key : {"content", "summary"})
                if (text.empty() && item.contains(key) && item[key].is_array() &&
                    !item[key].empty())
                    text = parts_text(item[key], where + "." + key);
            if (text.empty()) text = opaque_reasoning_text(item);
            if (text.empty()) continue;  // (another server's encrypted reasoning)
            ojson& a = gather();
            a["reasoning_content"] = a.value("reasoning_content", std::string()) + text;
        } else if (type == "function_call") {
            if (!item.contains("call_id") || !item["call_id"].is_string() ||
                !item.contains("name") || !item["name"].is_string())
                fail("{} (function_call) needs a string 'call_id' and 'name'", where);
            const ojson args = item.value("arguments", ojson("{}"));
            ojson& a = gather();
            if (!a.contains("tool_calls")) a["tool_calls"] = ojson::array();
            a["tool_calls"].push_back(
                {{"id", item["call_id"]},
                 {"type", "function"},
                 {"function",
                  {{"name", item["name"]},
                   {"arguments", args.is_string() ? args : ojson(args.dump())}}}});
        } else if (type == "function_call_output") {
            if (!item.contains("call_id") || !item["call_id"].is_string())
                fail("{} (function_call_output) needs a string 'call_id'", where);
            flush();
            const ojson& o = item.contains("output") ? item["output"] : ojson("");
            out.push_back({{"role", "tool"},
                           {"tool_call_id", item["call_id"]},
                           {"content", parts_text(o, where + ".output")}});
        } else {
            fail("{}: items of type '{}' are not supported", where, type);
        }
    }
    flush();
    return out;
}

// The settings a response echoes from its request.
json echoed(const ojson& request) {
    auto get = [&](const char* key, json fallback) {
        return request.contains(key) && !request[key].is_null() ? json(request[key]) : fallback;
    };
    json text = get("text", json{{"format", {{"type", "text"}}}});
    return {{"instructions", get("instructions", nullptr)},
            {"max_output_tokens", get("max_output_tokens", nullptr)},
            {"parallel_tool_calls", get("parallel_tool_calls", true)},
            {"previous_response_id", get("previous_response_id", nullptr)},
            {"reasoning", get("reasoning", json{{"effort", nullptr}, {"summary", nullptr}})},
            {"store", get("store", true)},
            {"temperature", get("temperature", 1.0)},
            {"text", text},
            {"tool_choice", get("tool_choice", "auto")},
            {"tools", get("tools", json::array())},
            {"top_p", get("top_p", 1.0)},
            {"truncation", get("truncation", "disabled")},
            {"metadata", get("metadata", json::object())}};
}

// `opaque`: with its encrypted_content (wants_opaque_reasoning).
json reasoning_item(const std::string& id, const std::string& text, bool opaque = false) {
    json item = {{"type", "reasoning"},
                 {"id", "rs_" + id},
                 {"summary", json::array()},
                 {"content", json::array({{{"type", "reasoning_text"}, {"text", text}}})}};
    if (opaque) item["encrypted_content"] = base64_encode(std::string(kOpaqueReasoning) + text);
    return item;
}

json text_part(const std::string& text) {
    return {{"type", "output_text"}, {"text", text}, {"annotations", json::array()}};
}

json message_item(const std::string& id, const std::string& text, const char* status) {
    return {{"type", "message"},
            {"id", "msg_" + id},
            {"status", status},
            {"role", "assistant"},
            {"content", text.empty() && std::string(status) == "in_progress"
                            ? json::array()
                            : json::array({text_part(text)})}};
}

json call_item(const std::string& id, size_t k, const json& call, const char* status) {
    return {{"type", "function_call"},
            {"id", fmt::format("fc_{}_{}", id, k)},
            {"call_id", call["id"]},
            {"name", call["function"]["name"]},
            {"arguments",
             std::string(status) == "in_progress" ? json("") : call["function"]["arguments"]},
            {"status", status}};
}

// The response object: its output items, usage and status ("incomplete" when the length
// limit cut the reply).
json response_object(const ojson& request, const std::string& id, int64_t created,
                     const std::string& model, json output, const json& finish_reason,
                     int64_t input_tokens, int64_t output_tokens, bool done) {
    const bool cut = finish_reason == "length";
    json r = {{"id", "resp_" + id},
              {"object", "response"},
              {"created_at", created},
              {"status", !done ? "in_progress"
                         : cut ? "incomplete"
                               : "completed"},
              {"error", nullptr},
              {"incomplete_details", done && cut ? json{{"reason", "max_output_tokens"}} : json()},
              {"model", model},
              {"output", std::move(output)}};
    r.update(echoed(request));
    r["usage"] = done ? json{{"input_tokens", input_tokens},
                             {"input_tokens_details", {{"cached_tokens", 0}}},
                             {"output_tokens", output_tokens},
                             {"output_tokens_details", {{"reasoning_tokens", 0}}},
                             {"total_tokens", input_tokens + output_tokens}}
                      : json();
    return r;
}

}  // namespace

ojson responses_truncate(const ojson& body, ojson chat,
                         const std::function<bool(const ojson&)>& too_long) {
    const ojson mode = body.contains("truncation") ? body["truncation"] : ojson();
    if (!mode.is_null() && mode != "auto" && mode != "disabled")
        fail("'truncation' must be \"auto\" or \"disabled\" (got {})", mode.dump());
    if (mode != "auto") return chat;
    ojson& msgs = chat["messages"];
    size_t first = 0;  // the first message that may go
    while (first < msgs.size() && msgs[first]["role"] == "system") ++first;
    while (too_long(chat) && msgs.size() > first + 1) {  // (its last call sees the result)
        // The oldest message, and with an assistant's calls the tool results after it.
        size_t end = first + 1;
        while (end < msgs.size() - 1 && msgs[end]["role"] == "tool") ++end;
        msgs.erase(msgs.begin() + std::ptrdiff_t(first), msgs.begin() + std::ptrdiff_t(end));
    }
    return chat;
}

ojson responses_to_openai(const ojson& body, const ojson* history) {
    if (!body.is_object()) fail("the request body must be a JSON object");
    if (body.contains("previous_response_id") && !body["previous_response_id"].is_null() &&
        !history)
        fail("'previous_response_id': no stored response {}", body["previous_response_id"].dump());
    if (!body.contains("input")) fail("missing field 'input' (a text or a list of items)");
    ojson msgs = ojson::array();
    if (body.contains("instructions") && !body["instructions"].is_null()) {
        if (!body["instructions"].is_string()) fail("'instructions' must be a text");
        msgs.push_back({{"role", "system"}, {"content", body["instructions"]}});
    }
    if (history)
        for (const ojson& m : *history) msgs.push_back(m);
    for (ojson& m : input_messages(body["input"])) msgs.push_back(std::move(m));
    ojson out = {{"messages", std::move(msgs)}};
    for (const char* key :
         {"temperature", "top_p", "top_k", "min_p", "seed", "stream", "parallel_tool_calls"})
        if (body.contains(key) && !body[key].is_null()) out[key] = body[key];
    if (body.contains("max_output_tokens") && !body["max_output_tokens"].is_null())
        out["max_tokens"] = body["max_output_tokens"];
    if (body.value("stream", false)) out["stream_options"] = {{"include_usage", true}};
    if (body.contains("tools") && !body["tools"].is_null()) {
        ojson tools = flat_tools_to_openai(body["tools"], "function", "", "parameters",
                                           "{\"type\": \"function\", \"name\", \"parameters\"}",
                                           "built-in tools are not; give functions");
        if (!tools.empty()) out["tools"] = std::move(tools);
    }
    if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
        const ojson& c = body["tool_choice"];
        if (c.is_string()) {
            out["tool_choice"] = c;
        } else if (c.is_object() && c.value("type", "") == "function" && c.contains("name") &&
                   c["name"].is_string()) {
            out["tool_choice"] = {{"type", "function"}, {"function", {{"name", c["name"]}}}};
        } else {
            fail(
                "'tool_choice' must be \"auto\", \"none\", \"required\" or {{\"type\": "
                "\"function\", \"name\": ...}} (got {})",
                c.dump());
        }
    }
    if (body.contains("reasoning") && body["reasoning"].is_object() &&
        body["reasoning"].contains("effort") && !body["reasoning"]["effort"].is_null()) {
        const ojson& e = body["reasoning"]["effort"];
        if (e == "none") {
            out["reasoning_budget_tokens"] = 0;
            out["chat_template_kwargs"] = {{"enable_thinking", false}};
        } else {
            out["reasoning_effort"] = e;  // (checked there)
        }
    }
    if (body.contains("text") && body["text"].is_object() && body["text"].contains("format")) {
        const ojson& f = body["text"]["format"];
        const std::string type = f.is_object() ? f.value("type", "") : "";
        if (type == "json_object") {
            out["response_format"] = {{"type", "json_object"}};
        } else if (type == "json_schema") {
            if (!f.contains("schema")) fail("'text.format' of type json_schema needs a 'schema'");
            ojson js = {{"name", f.value("name", "response")}, {"schema", f["schema"]}};
            if (f.contains("strict")) js["strict"] = f["strict"];
            out["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(js)}};
        } else if (type != "text") {
            fail("'text.format' must be of type text, json_object or json_schema");
        }
    }
    return out;
}

ojson responses_conversation(const ojson& chat_request, const ojson& body, const json& c) {
    ojson out = ojson::array();
    const ojson& msgs = chat_request["messages"];
    const bool instructed = body.contains("instructions") && !body["instructions"].is_null();
    for (size_t i = instructed ? 1 : 0; i < msgs.size(); ++i) out.push_back(msgs[i]);
    const json& m = c["choices"].at(0)["message"];
    ojson answer = {
        {"role", "assistant"},
        {"content", m.contains("content") ? ojson::parse(m["content"].dump()) : ojson()}};
    for (const char* key : {"reasoning_content", "tool_calls"})
        if (m.contains(key) && !m[key].is_null()) answer[key] = ojson::parse(m[key].dump());
    out.push_back(std::move(answer));
    return out;
}

void ResponsesStore::put(const std::string& id, Entry entry) {
    std::lock_guard lk(mu_);
    if (entries_.insert_or_assign(id, std::move(entry)).second) order_.push_back(id);
    while (order_.size() > capacity_) {
        entries_.erase(order_.front());
        order_.pop_front();
    }
}

std::optional<ResponsesStore::Entry> ResponsesStore::get(const std::string& id) const {
    std::lock_guard lk(mu_);
    const auto it = entries_.find(id);
    if (it == entries_.end()) return std::nullopt;
    return it->second;
}

bool ResponsesStore::erase(const std::string& id) {
    std::lock_guard lk(mu_);
    if (entries_.erase(id) == 0) return false;
    order_.remove(id);
    return true;
}

json responses_response(const json& c, const ojson& request) {
    const json& choice = c["choices"].at(0);
    const json& m = choice["message"];
    const std::string id = c.value("id", "");
    json output = json::array();
    if (m.contains("reasoning_content") && m["reasoning_content"].is_string())
        output.push_back(
            reasoning_item(id, m["reasoning_content"], wants_opaque_reasoning(request)));
    if (m.contains("content") && m["content"].is_string() &&
        !m["content"].get<std::string>().empty())
        output.push_back(message_item(id, m["content"], "completed"));
    if (m.contains("tool_calls"))
        for (size_t k = 0; k < m["tool_calls"].size(); ++k)
            output.push_back(call_item(id, k, m["tool_calls"][k], "completed"));
    return response_object(request, id, c.value("created", int64_t(0)), c.value("model", ""),
                           std::move(output), choice["finish_reason"],
                           c["usage"].value("prompt_tokens", int64_t(0)),
                           c["usage"].value("completion_tokens", int64_t(0)), true);
}

void ResponsesStream::emit(std::vector<Event>& out, const std::string& name, json data) {
    data["type"] = name;
    data["sequence_number"] = sequence_++;
    out.emplace_back(name, std::move(data));
}

void ResponsesStream::open(std::vector<Event>& out, const std::string& type) {
    if (open_ == type) return;
    close(out);
    open_ = type;
    text_.clear();
    const size_t index = output_.size();
    if (type == "reasoning") {
        json item = reasoning_item(id_, "");
        item["content"] = json::array();
        emit(out, "response.output_item.added", {{"output_index", index}, {"item", item}});
        emit(out, "response.content_part.added",
             {{"item_id", "rs_" + id_},
              {"output_index", index},
              {"content_index", 0},
              {"part", {{"type", "reasoning_text"}, {"text", ""}}}});
    } else {
        emit(out, "response.output_item.added",
             {{"output_index", index}, {"item", message_item(id_, "", "in_progress")}});
        emit(out, "response.content_part.added",
             {{"item_id", "msg_" + id_},
              {"output_index", index},
              {"content_index", 0},
              {"part", text_part("")}});
    }
}

void ResponsesStream::close(std::vector<Event>& out) {
    if (open_.empty()) return;
    const size_t index = output_.size();
    const bool reasoning = open_ == "reasoning";
    const std::string item_id = (reasoning ? "rs_" : "msg_") + id_;
    emit(out, reasoning ? "response.reasoning_text.done" : "response.output_text.done",
         {{"item_id", item_id}, {"output_index", index}, {"content_index", 0}, {"text", text_}});
    const json part =
        reasoning ? json{{"type", "reasoning_text"}, {"text", text_}} : text_part(text_);
    emit(out, "response.content_part.done",
         {{"item_id", item_id}, {"output_index", index}, {"content_index", 0}, {"part", part}});
    json item = reasoning ? reasoning_item(id_, text_, wants_opaque_reasoning(request_))
                          : message_item(id_, text_, "completed");
    emit(out, "response.output_item.done", {{"output_index", index}, {"item", item}});
    output_.push_back(std::move(item));
    open_.clear();
    text_.clear();
}

std::vector<ResponsesStream::Event> ResponsesStream::fail(const std::string& message) {
    std::vector<Event> out;
    if (done_) return out;
    if (!started_) out = feed(json::object());  // (created and in_progress first)
    emit(out, "error", {{"code", "server_error"}, {"message", message}, {"param", nullptr}});
    json r =
        response_object(request_, id_, created_, model_, output_, nullptr, input_tokens_, 0, true);
    r["status"] = "failed";
    r["error"] = {{"code", "server_error"}, {"message", message}};
    emit(out, "response.failed", {{"response", r}});
    done_ = true;
    return out;
}

std::vector<ResponsesStream::Event> ResponsesStream::feed(const json& chunk) {
    std::vector<Event> out;
    if (done_) return out;
    const bool has_choice = chunk.contains("choices") && !chunk["choices"].empty();
    if (!started_) {
        started_ = true;
        id_ = chunk.value("id", "");
        model_ = chunk.value("model", "");
        created_ = chunk.value("created", int64_t(0));
        const json r = response_object(request_, id_, created_, model_, json::array(), nullptr,
                                       input_tokens_, 0, false);
        emit(out, "response.created", {{"response", r}});
        emit(out, "response.in_progress", {{"response", r}});
    }
    if (has_choice) {
        const json& choice = chunk["choices"][0];
        const json delta = choice.value("delta", json::object());
        auto text_of = [&](const char* key) {
            return delta.contains(key) && delta[key].is_string() ? delta[key].get<std::string>()
                                                                 : std::string();
        };
        const std::pair<const char*, const char*> kinds[] = {{"reasoning_content", "reasoning"},
                                                             {"content", "message"}};
        for (const auto& [key, type] : kinds) {
            const std::string t = text_of(key);
            if (t.empty()) continue;
            open(out, type);
            text_ += t;
            const bool reasoning = open_ == "reasoning";
            emit(out, reasoning ? "response.reasoning_text.delta" : "response.output_text.delta",
                 {{"item_id", (reasoning ? "rs_" : "msg_") + id_},
                  {"output_index", output_.size()},
                  {"content_index", 0},
                  {"delta", t}});
        }
        if (delta.contains("tool_calls"))
            for (const json& call : delta["tool_calls"]) {
                close(out);
                const size_t index = output_.size();
                const size_t k = static_cast<size_t>(call.value("index", 0));
                const json item = call_item(id_, k, call, "completed");
                emit(out, "response.output_item.added",
                     {{"output_index", index}, {"item", call_item(id_, k, call, "in_progress")}});
                emit(out, "response.function_call_arguments.delta",
                     {{"item_id", item["id"]},
                      {"output_index", index},
                      {"delta", item["arguments"]}});
                emit(out, "response.function_call_arguments.done",
                     {{"item_id", item["id"]},
                      {"output_index", index},
                      {"arguments", item["arguments"]}});
                emit(out, "response.output_item.done", {{"output_index", index}, {"item", item}});
                output_.push_back(item);
            }
        if (choice.contains("finish_reason") && !choice["finish_reason"].is_null())
            finish_reason_ = choice["finish_reason"];
    }
    if (chunk.contains("usage") && !chunk["usage"].is_null() && !has_choice) {
        close(out);
        const json r = response_object(request_, id_, created_, model_, output_, finish_reason_,
                                       chunk["usage"].value("prompt_tokens", input_tokens_),
                                       chunk["usage"].value("completion_tokens", int64_t(0)), true);
        emit(out, r["status"] == "incomplete" ? "response.incomplete" : "response.completed",
             {{"response", r}});
        done_ = true;
    }
    return out;
}

}  // namespace kvrun
