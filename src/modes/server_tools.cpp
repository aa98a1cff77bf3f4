// Tool calling in one generic JSON format (see server_tools.h).
#include "modes/server_tools.h"

#include <cstring>
#include <map>

#include "common.h"
#include "unicode_text.h"

namespace kvrun {

using ojson = nlohmann::ordered_json;

std::string content_text(const ojson& c, const std::string& owner) {
    if (c.is_null()) return {};
    if (c.is_string()) return c.get<std::string>();
    if (!c.is_array()) fail("{}.content must be a string or a list of parts", owner);
    std::string text;
    for (const ojson& part : c) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string())
            fail(
                "{}: only text content parts ({{\"type\": \"text\", \"text\": ...}}) are "
                "supported",
                owner);
        if (!text.empty()) text += "\n";
        text += part["text"].get<std::string>();
    }
    return text;
}

ojson flat_tools_to_openai(const ojson& tools, const char* type, const char* default_type,
                           const char* schema_key, const char* shape, const char* hint) {
    if (!tools.is_array()) fail("'tools' must be a list of {}", shape);
    ojson out = ojson::array();
    for (size_t i = 0; i < tools.size(); ++i) {
        const ojson& t = tools[i];
        if (!t.is_object()) fail("'tools'[{}] must be an object", i);
        const std::string kind = t.value("type", default_type);
        if (kind != type) fail("'tools'[{}]: '{}' tools are not supported; {}", i, kind, hint);
        ojson fn = {{"name", t.contains("name") ? t["name"] : ojson()}};
        if (t.contains("description") && !t["description"].is_null())
            fn["description"] = t["description"];
        if (t.contains(schema_key) && !t[schema_key].is_null()) fn["parameters"] = t[schema_key];
        out.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
    return out;
}

std::string chat_message_text(const ojson& m, size_t index) {
    if (!m.contains("content")) return {};
    return content_text(m["content"], fmt::format("'messages'[{}]", index));
}

namespace {

// One OpenAI tool call of an assistant message -> {"name", "arguments"} as the model writes
// it (arguments come as a JSON string; one that does not parse stays a string).
ojson written_call(const ojson& call, size_t index) {
    if (!call.is_object() || !call.contains("function") || !call["function"].is_object() ||
        !call["function"].contains("name") || !call["function"]["name"].is_string())
        fail("'messages'[{}].tool_calls: each call needs \"function\": {{\"name\", \"arguments\"}}",
             index);
    const ojson& f = call["function"];
    ojson args = ojson::object();
    if (f.contains("arguments") && f["arguments"].is_string()) {
        const std::string text = f["arguments"].get<std::string>();
        args = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
        if (args.is_discarded()) args = text;
    } else if (f.contains("arguments")) {
        args = f["arguments"];
    }
    return ojson{{"name", f["name"]}, {"arguments", args}};
}

// Collects $defs / definitions of a tool's parameters into the root schema's, where the
// tool's "#/$defs/X" references point once it sits inside the reply schema.
void hoist_definitions(ojson& params, ojson& root, const std::string& tool) {
    for (const char* key : {"$defs", "definitions"}) {
        if (!params.is_object() || !params.contains(key)) continue;
        if (!params[key].is_object())
            fail("tool '{}': parameters' \"{}\" must be an object", tool, key);
        for (auto& [name, def] : params[key].items()) {
            if (root[key].contains(name) && root[key][name] != def)
                fail("tools define \"{}/{}\" twice, differently (tool '{}')", key, name, tool);
            root[key][name] = def;
        }
        params.erase(key);
    }
}

// Four hex digits at s[i..i+4), or -1.
int32_t hex4(std::string_view s, size_t i) {
    if (i + 4 > s.size()) return -1;
    int32_t v = 0;
    for (size_t k = i; k < i + 4; ++k) {
        const char c = s[k];
        const int d = c >= '0' && c <= '9'   ? c - '0'
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                      : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                             : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

}  // namespace

ToolAnswerPrefix tool_answer_prefix(std::string_view s) {
    ToolAnswerPrefix out;
    size_t i = 0;
    auto ws = [&] {
        while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r')) ++i;
    };
    // {  "response"  :  "   — each piece may still be incomplete.
    ws();
    for (std::string_view piece : {std::string_view("{"), std::string_view("\"response\""),
                                   std::string_view(":"), std::string_view("\"")}) {
        const size_t n = std::min(piece.size(), s.size() - i);
        if (s.substr(i, n) != piece.substr(0, n)) {
            out.answer = false;
            return out;
        }
        if (n < piece.size()) {
            out.decided = false;
            return out;
        }
        i += n;
        if (piece == "\"") break;  // the string begins
        ws();
    }
    out.answer = true;
    while (i < s.size() && s[i] != '"') {
        if (s[i] != '\\') {
            out.text += s[i++];
            continue;
        }
        if (i + 1 >= s.size()) break;  // an escape not yet whole
        const char e = s[i + 1];
        const char* simple = "\"\\/bfnrt";
        const char* value = "\"\\/\b\f\n\r\t";
        if (const char* p = std::strchr(simple, e); p && e) {
            out.text += value[p - simple];
            i += 2;
            continue;
        }
        if (e != 'u') break;  // (the grammar admits no other escape)
        const int32_t hi = hex4(s, i + 2);
        if (hi < 0) break;
        if (hi >= 0xD800 && hi < 0xDC00) {  // a surrogate pair: wait for the second half
            if (i + 12 > s.size() || s[i + 6] != '\\' || s[i + 7] != 'u') break;
            const int32_t lo = hex4(s, i + 8);
            if (lo < 0xDC00 || lo > 0xDFFF) break;
            utf8_append(out.text,
                        0x10000 + ((uint32_t(hi) - 0xD800) << 10) + (uint32_t(lo) - 0xDC00));
            i += 12;
            continue;
        }
        utf8_append(out.text, uint32_t(hi));
        i += 6;
    }
    return out;
}

std::optional<ChatTools> chat_tools_from_json(const ojson& j) {
    if (!j.contains("tools") || j["tools"].is_null()) {
        if (j.contains("tool_choice") && j["tool_choice"].is_object())
            fail("'tool_choice' names a function but the request lists no 'tools'");
        return std::nullopt;
    }
    const ojson& tools = j["tools"];
    if (!tools.is_array()) fail("'tools' must be a list of {{\"type\": \"function\", ...}}");
    if (tools.empty()) return std::nullopt;
    ChatTools out;
    for (size_t i = 0; i < tools.size(); ++i) {
        const ojson& t = tools[i];
        if (!t.is_object() || t.value("type", "function") != "function" ||
            !t.contains("function") || !t["function"].is_object())
            fail("'tools'[{}] must be {{\"type\": \"function\", \"function\": {{...}}}}", i);
        const ojson& f = t["function"];
        if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty())
            fail("'tools'[{}].function needs a non-empty string 'name'", i);
        const std::string name = f["name"].get<std::string>();
        for (const ojson& other : out.functions)
            if (other["name"] == name) fail("'tools' lists the function '{}' twice", name);
        ojson fn = {{"name", name}};
        if (f.contains("description") && f["description"].is_string())
            fn["description"] = f["description"];
        ojson params = f.contains("parameters") && !f["parameters"].is_null()
                           ? f["parameters"]
                           : ojson{{"type", "object"}, {"properties", ojson::object()}};
        if (!params.is_object())
            fail("'tools'[{}].function.parameters must be a JSON schema object", i);
        fn["parameters"] = params;
        out.functions.push_back(std::move(fn));
    }
    if (j.contains("parallel_tool_calls") && !j["parallel_tool_calls"].is_null()) {
        if (!j["parallel_tool_calls"].is_boolean())
            fail("'parallel_tool_calls' must be true or false");
        out.parallel = j["parallel_tool_calls"].get<bool>();
    }
    if (!j.contains("tool_choice") || j["tool_choice"].is_null()) return out;
    const ojson& c = j["tool_choice"];
    if (c.is_string()) {
        const std::string s = c.get<std::string>();
        if (s == "none") return std::nullopt;
        if (s == "required")
            out.required = true;
        else if (s != "auto")
            fail(
                "'tool_choice' must be \"auto\", \"none\", \"required\" or a function (got \"{}\")",
                s);
        return out;
    }
    if (!c.is_object() || !c.contains("function") || !c["function"].is_object() ||
        !c["function"].contains("name") || !c["function"]["name"].is_string())
        fail(
            "'tool_choice' must be \"auto\", \"none\", \"required\" or {{\"type\": \"function\", "
            "\"function\": {{\"name\": ...}}}}");
    out.only = c["function"]["name"].get<std::string>();
    out.required = true;
    bool listed = false;
    for (const ojson& f : out.functions) listed = listed || f["name"] == out.only;
    if (!listed) fail("'tool_choice' names '{}', which 'tools' does not list", out.only);
    return out;
}

bool chat_functions_to_tools(ojson& j) {
    bool legacy = false;
    if (j.contains("functions")) {
        const ojson fns = j["functions"];
        j.erase("functions");
        if (!fns.is_array())
            fail("'functions' must be a list of {{\"name\", \"description\", \"parameters\"}}");
        if (!fns.empty()) {
            if (j.contains("tools"))
                fail("'functions' (OpenAI's older form) and 'tools' list the same: give one");
            ojson tools = ojson::array();
            for (size_t i = 0; i < fns.size(); ++i) {
                if (!fns[i].is_object())
                    fail("'functions'[{}] must be an object with a 'name' and 'parameters'", i);
                tools.push_back({{"type", "function"}, {"function", fns[i]}});
            }
            j["tools"] = std::move(tools);
            j["parallel_tool_calls"] = false;  // the older API returns one call
            legacy = true;
        }
    }
    if (j.contains("function_call")) {
        const ojson c = j["function_call"];
        j.erase("function_call");
        if (j.contains("tool_choice"))
            fail("'function_call' (OpenAI's older form) and 'tool_choice' say the same: give one");
        if (c.is_string() && (c == "none" || c == "auto"))
            j["tool_choice"] = c;
        else if (c.is_object() && c.contains("name") && c["name"].is_string())
            j["tool_choice"] = {{"type", "function"}, {"function", {{"name", c["name"]}}}};
        else
            fail("'function_call' must be \"none\", \"auto\" or {{\"name\": ...}} (got {})",
                 c.dump());
    }
    if (!j.contains("messages") || !j["messages"].is_array()) return legacy;
    std::map<std::string, std::string> latest;  // function name -> id of its latest call
    ojson& msgs = j["messages"];
    for (size_t i = 0; i < msgs.size(); ++i) {
        ojson& m = msgs[i];
        if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) continue;
        if (m["role"] == "assistant" && m.contains("function_call") &&
            !m["function_call"].is_null()) {
            const ojson fc = m["function_call"];
            m.erase("function_call");
            if (!fc.is_object() || !fc.contains("name") || !fc["name"].is_string())
                fail("'messages'[{}].function_call needs a string 'name'", i);
            if (m.contains("tool_calls") && !m["tool_calls"].is_null())
                fail("'messages'[{}] has both 'function_call' and 'tool_calls'", i);
            const std::string id = fmt::format("call_{}", i);
            m["tool_calls"] = ojson::array(
                {{{"id", id},
                  {"type", "function"},
                  {"function",
                   {{"name", fc["name"]},
                    {"arguments", fc.contains("arguments") ? fc["arguments"] : ojson("{}")}}}}});
            latest[fc["name"].get<std::string>()] = id;
        } else if (m["role"] == "function") {
            if (!m.contains("name") || !m["name"].is_string())
                fail("'messages'[{}]: a 'function' message needs the function's 'name'", i);
            const std::string name = m["name"].get<std::string>();
            m["role"] = "tool";
            m["tool_call_id"] = latest.count(name) ? latest[name] : fmt::format("call_{}", i);
        }
    }
    return legacy;
}

std::string chat_tools_instructions(const ChatTools& t) {
    std::string s =
        "You can call tools (functions). Here they are as JSON, each with its name, what it "
        "does, and its parameters as a JSON schema:\n";
    for (const ojson& f : t.functions) s += f.dump() + "\n";  // one line per tool
    s += "\nReply with one JSON object and nothing else.\n";
    const std::string calls = t.parallel ? "one or more calls" : "exactly one call";
    if (!t.only.empty()) {
        s += fmt::format(
            "Call the tool \"{}\": {{\"tool_calls\": [{{\"name\": \"{}\", \"arguments\": "
            "{{...}}}}]}} ({}).\n",
            t.only, t.only, calls);
    } else {
        s += fmt::format(
            "{}To call tools: {{\"tool_calls\": [{{\"name\": \"<tool name>\", \"arguments\": "
            "{{...}}}}]}} ({}).\n",
            t.required ? "You must call a tool. " : "", calls);
        if (!t.required) s += "To answer the user instead: {\"response\": \"<your answer>\"}.\n";
    }
    s += "The results of your calls come back in a message {\"tool_results\": [...]}.";
    return s;
}

ojson chat_tools_call_schema(const ChatTools& t, const std::string& args_key, bool with_id) {
    ojson defs = {{"$defs", ojson::object()}, {"definitions", ojson::object()}};
    ojson alternatives = ojson::array();
    for (const ojson& f : t.functions) {
        if (!t.only.empty() && f["name"] != t.only) continue;
        ojson params = f["parameters"];
        hoist_definitions(params, defs, f["name"].get<std::string>());
        ojson call = {{"type", "object"},
                      {"properties", {{"name", {{"const", f["name"]}}}, {args_key, params}}},
                      {"required", {"name", args_key}}};
        if (with_id) call["properties"]["id"] = {{"type", "string"}, {"maxLength", 9}};
        alternatives.push_back(std::move(call));
    }
    ojson root = alternatives.size() == 1 ? alternatives[0] : ojson{{"anyOf", alternatives}};
    for (const char* key : {"$defs", "definitions"})
        if (!defs[key].empty()) root[key] = defs[key];
    return root;
}

ojson chat_tools_schema(const ChatTools& t) {
    ojson call = chat_tools_call_schema(t, "arguments", false);
    ojson root = ojson::object();
    for (const char* key : {"$defs", "definitions"})
        if (call.contains(key)) {
            root[key] = call[key];
            call.erase(key);
        }
    ojson calls = {{"type", "array"}, {"items", call}, {"minItems", 1}};
    if (!t.parallel) calls["maxItems"] = 1;
    const ojson call_reply = {
        {"type", "object"}, {"properties", {{"tool_calls", calls}}}, {"required", {"tool_calls"}}};
    if (t.required) {
        for (auto& [k, v] : call_reply.items()) root[k] = v;
    } else {
        const ojson answer = {{"type", "object"},
                              {"properties", {{"response", {{"type", "string"}}}}},
                              {"required", {"response"}}};
        root["anyOf"] = ojson::array({call_reply, answer});
    }
    return root;
}

std::vector<ChatMessage> chat_messages_from_json(const ojson& messages) {
    if (!messages.is_array() || messages.empty())
        fail("missing field 'messages' (a non-empty list of {{\"role\", \"content\"}})");
    std::vector<ChatMessage> msgs;
    std::map<std::string, std::string> call_names;  // tool_call_id -> function name
    ojson results = ojson::array();                 // consecutive tool messages
    auto flush_results = [&] {
        if (results.empty()) return;
        msgs.push_back({"user", ojson{{"tool_results", results}}.dump()});
        results = ojson::array();
    };
    for (size_t i = 0; i < messages.size(); ++i) {
        const ojson& m = messages[i];
        if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
            fail("'messages'[{}] must be an object with a string 'role'", i);
        std::string role = m["role"].get<std::string>();
        if (role == "developer") role = "system";  // OpenAI's newer name
        if (role == "tool") {
            ojson r = ojson::object();
            const std::string id = m.value("tool_call_id", "");
            if (!id.empty()) r["tool_call_id"] = id;
            if (call_names.count(id)) r["name"] = call_names[id];
            r["content"] = chat_message_text(m, i);
            results.push_back(std::move(r));
            continue;
        }
        flush_results();
        if (role != "system" && role != "user" && role != "assistant")
            fail("'messages'[{}]: role '{}' is not supported (system, user, assistant or tool)", i,
                 role);
        if (role == "assistant" && m.contains("tool_calls") && !m["tool_calls"].is_null() &&
            !(m["tool_calls"].is_array() && m["tool_calls"].empty())) {
            if (!m["tool_calls"].is_array()) fail("'messages'[{}].tool_calls must be a list", i);
            ojson calls = ojson::array();
            for (const ojson& call : m["tool_calls"]) {
                calls.push_back(written_call(call, i));
                if (call.contains("id") && call["id"].is_string())
                    call_names[call["id"].get<std::string>()] = calls.back()["name"];
            }
            msgs.push_back({"assistant", ojson{{"tool_calls", calls}}.dump()});
            continue;
        }
        msgs.push_back({role, chat_message_text(m, i)});
    }
    flush_results();
    return msgs;
}

ChatToolReply chat_tools_parse_generic(const std::string& text, const std::string& id_prefix) {
    ChatToolReply out;
    const ojson j = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("tool_calls") && j["tool_calls"].is_array()) {
        for (const ojson& c : j["tool_calls"]) {
            if (!c.is_object() || !c.contains("name") || !c["name"].is_string()) continue;
            out.calls.push_back({fmt::format("{}_{}", id_prefix, out.calls.size()),
                                 c["name"].get<std::string>(),
                                 c.contains("arguments") ? c["arguments"].dump() : "{}"});
        }
        if (!out.calls.empty()) return out;
    }
    if (j.is_object() && j.contains("response") && j["response"].is_string()) {
        out.content = j["response"].get<std::string>();
    } else if (const ToolAnswerPrefix a = tool_answer_prefix(text); a.answer && !j.is_object()) {
        out.content = a.text;  // an answer cut short
    } else {
        out.content = text;
    }
    return out;
}

nlohmann::json tool_calls_json(const std::vector<ToolCall>& calls, bool with_index) {
    nlohmann::json list = nlohmann::json::array();
    for (size_t k = 0; k < calls.size(); ++k) {
        nlohmann::json c = {
            {"id", calls[k].id},
            {"type", "function"},
            {"function", {{"name", calls[k].name}, {"arguments", calls[k].arguments}}}};
        if (with_index) c["index"] = k;
        list.push_back(std::move(c));
    }
    return list;
}

}  // namespace kvrun
