// Tool calls in a model family's own syntax (see ToolFormat in server_tools.h): detection
// from the chat template, and the messages and tools a template is given.
#include <algorithm>
#include <map>

#include "common.h"
#include "json_schema.h"
#include "modes/server_tool_impl.h"
#include "modes/server_tools.h"
#include "reasoning.h"
#include "stop_text.h"
#include "tokenizer.h"
#include "unicode_text.h"

namespace kvrun {
namespace {

using ojson = nlohmann::ordered_json;
using namespace tool_detail;

// A call's arguments as the model would have written them: an object when the text parses.
ojson arguments_value(const ojson& f) {
    if (!f.contains("arguments")) return ojson::object();
    if (!f["arguments"].is_string()) return f["arguments"];
    const std::string text = f["arguments"].get<std::string>();
    ojson v = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
    return v.is_discarded() ? ojson(text) : v;
}

// Phi-4-mini's template reads the tools from the system message: its "tools", the functions
// as JSON text (as Python writes it, as Microsoft's examples show them). A conversation
// without a system message gets one saying the model has tools.
ojson phi4_system_tools(ojson messages, const ojson& tools) {
    if (tools.empty()) return messages;
    ojson functions = ojson::array();
    for (const ojson& t : tools) functions.push_back(t.contains("function") ? t["function"] : t);
    const std::string text = jinja_tojson(functions);
    if (messages.empty() || messages[0]["role"] != "system")
        messages.insert(messages.begin(), ojson{{"role", "system"},
                                                {"content",
                                                 "You are a helpful assistant with "
                                                 "some tools."}});
    if (messages[0]["content"].is_null()) messages[0]["content"] = "";
    messages[0]["tools"] = text;
    return messages;
}

}  // namespace

namespace tool_detail {

bool llama3_code_tool(std::string_view name) {
    return name == "python" || name == "code_interpreter";
}

bool llama3_builtin(std::string_view name) {
    return llama3_code_tool(name) || name == "wolfram_alpha" || name == "brave_search" ||
           name == "web_search";
}

}  // namespace tool_detail

std::shared_ptr<const JinjaTemplate> native_tools_template(const std::string& source) {
    if (source.empty() || tool_format_detect(source) == ToolFormat::Generic) return nullptr;
    try {
        auto t = std::make_shared<const JinjaTemplate>(JinjaTemplate::parse(source));
        // A conversation with a call and its result must render (with the arguments as
        // objects, or as text as the server retries) and show the tool.
        const ojson tools = ojson::parse(R"([{"type": "function", "function": {
            "name": "kvrun_probe_tool", "description": "d", "parameters": {"type": "object",
            "properties": {"x": {"type": "string"}}, "required": ["x"]}}}])");
        const ojson msgs = ojson::parse(R"([{"role": "user", "content": "q"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "abcDEF123",
              "type": "function", "function": {"name": "kvrun_probe_tool",
              "arguments": {"x": "y"}}}]},
            {"role": "tool", "tool_call_id": "abcDEF123", "name": "kvrun_probe_tool",
             "content": "r"},
            {"role": "user", "content": "q"}])");
        const std::string text = chat_tools_render(*t, tool_format_detect(source), msgs, tools, {});
        if (text.find("kvrun_probe_tool") == std::string::npos) return nullptr;
        return t;
    } catch (const Error&) {
        return nullptr;
    }
}

ToolFormat tool_format_detect(std::string_view src) {
    auto has = [&](std::string_view s) { return src.find(s) != std::string_view::npos; };
    if (has(kHarmonyChannel) && has("commentary") && has(kHarmonyFunctions))
        return ToolFormat::Harmony;
    if (has(kHermesOpen) && has(kGlmKey)) return ToolFormat::Glm45;
    if (has(kKimiSection)) return ToolFormat::KimiK2;
    if (has(kR7bAction)) return ToolFormat::CommandR7B;
    if (has(kHermesOpen) && has(kXmlFunction) && has(kXmlParameter)) return ToolFormat::Qwen3Coder;
    if (has(kR1CallsBegin))
        return has("```json") ? ToolFormat::DeepSeekR1 : ToolFormat::DeepSeekV31;
    if (has(kHermesOpen)) return ToolFormat::Hermes;
    if (has(kMistralCalls))
        return has(kMistralArgs) ? ToolFormat::MistralV11 : ToolFormat::MistralNemo;
    if (has(std::string(kV32Next) + "all")) return ToolFormat::FunctionaryV32;
    if (has(kXmlFunction) && has(kXmlFunctionEnd) && has("<|start_header_id|>"))
        return ToolFormat::FunctionaryV31;
    if (has(kFunctools)) return ToolFormat::FireFunctionV2;
    if (has("<|start_header_id|>") && (has("ipython") || has(kPythonTag)))
        return ToolFormat::Llama3;
    if (has(kGraniteCall) && has("<|start_of_role|>")) return ToolFormat::Granite;
    if (has(kPhi4Tools) && has(kPhi4ToolsEnd)) return ToolFormat::Phi4Mini;
    return ToolFormat::Generic;
}

const char* tool_format_name(ToolFormat f) {
    switch (f) {
        case ToolFormat::Hermes:
            return "hermes";
        case ToolFormat::Llama3:
            return "llama3";
        case ToolFormat::MistralNemo:
            return "mistral-nemo";
        case ToolFormat::MistralV11:
            return "mistral-v11";
        case ToolFormat::Qwen3Coder:
            return "qwen3-coder";
        case ToolFormat::DeepSeekR1:
            return "deepseek-r1";
        case ToolFormat::DeepSeekV31:
            return "deepseek-v3.1";
        case ToolFormat::Harmony:
            return "gpt-oss";
        case ToolFormat::Granite:
            return "granite";
        case ToolFormat::Glm45:
            return "glm-4.5";
        case ToolFormat::KimiK2:
            return "kimi-k2";
        case ToolFormat::CommandR7B:
            return "command-r7b";
        case ToolFormat::Phi4Mini:
            return "phi-4-mini";
        case ToolFormat::FunctionaryV31:
            return "functionary-v3.1";
        case ToolFormat::FunctionaryV32:
            return "functionary-v3.2";
        case ToolFormat::FireFunctionV2:
            return "firefunction-v2";
        default:
            return "generic";
    }
}

ojson chat_messages_native(const ojson& messages) {
    chat_messages_from_json(messages);  // the same checks, the same messages
    ojson out = ojson::array();
    std::map<std::string, std::string> call_names;  // tool_call_id -> function name
    for (size_t i = 0; i < messages.size(); ++i) {
        const ojson& m = messages[i];
        std::string role = m["role"].get<std::string>();
        if (role == "developer") role = "system";
        ojson msg = {{"role", role}, {"content", nullptr}};
        if (m.contains("content") && !m["content"].is_null())
            msg["content"] = chat_message_text(m, i);
        // An earlier reply's reasoning, as a client sends it back (Qwen 3's template reads it).
        if (role == "assistant" && m.contains("reasoning_content") &&
            m["reasoning_content"].is_string())
            msg["reasoning_content"] = m["reasoning_content"];
        if (role == "tool") {
            const std::string id = m.value("tool_call_id", "");
            if (!id.empty()) msg["tool_call_id"] = id;
            if (call_names.count(id)) msg["name"] = call_names[id];
        }
        if (role == "assistant" && m.contains("tool_calls") && m["tool_calls"].is_array() &&
            !m["tool_calls"].empty()) {
            ojson calls = ojson::array();
            for (const ojson& c : m["tool_calls"]) {
                const ojson& f = c["function"];
                ojson call = ojson::object();
                if (c.contains("id") && c["id"].is_string()) {
                    call["id"] = c["id"];
                    call_names[c["id"].get<std::string>()] = f["name"].get<std::string>();
                }
                call["type"] = "function";
                call["function"] = {{"name", f["name"]}, {"arguments", arguments_value(f)}};
                calls.push_back(std::move(call));
            }
            msg["tool_calls"] = std::move(calls);
        }
        out.push_back(std::move(msg));
    }
    return out;
}

ojson chat_messages_arguments_as_text(ojson messages) {
    for (ojson& m : messages)
        if (m.contains("tool_calls") && m["tool_calls"].is_array())
            for (ojson& c : m["tool_calls"])
                if (c.contains("function") && !c["function"]["arguments"].is_string())
                    c["function"]["arguments"] = c["function"]["arguments"].dump();
    return messages;
}

std::string chat_tools_render(const JinjaTemplate& t, ToolFormat format, const ojson& messages,
                              const ojson& tools, const ChatSpecialTexts& special,
                              const ojson& kwargs) {
    // A template that writes a call's arguments as text (DeepSeek R1's adds them to a string)
    // gets them as OpenAI sends them, JSON text; one that needs every content to be a string
    // (gpt-oss's tests "in" it) gets "" for a call's null content. Failing all, the first
    // error.
    ojson msgs = chat_messages_for_format(format, messages);
    if (format == ToolFormat::Phi4Mini) msgs = phi4_system_tools(std::move(msgs), tools);
    // Llama 3.1's template writes built-in tools' calls its own way, given their names.
    ojson vars = kwargs;
    if (format == ToolFormat::Llama3 && (!vars.is_object() || !vars.contains("builtin_tools"))) {
        ojson names = ojson::array();
        for (const ojson& tool : tools) {
            const ojson& f = tool.contains("function") ? tool["function"] : tool;
            if (f.contains("name") && f["name"].is_string() &&
                llama3_builtin(f["name"].get<std::string>()))
                names.push_back(f["name"]);
        }
        if (!names.empty()) {
            if (!vars.is_object()) vars = ojson::object();
            vars["builtin_tools"] = names;
        }
    }
    std::vector<ojson> tries = {msgs, chat_messages_arguments_as_text(msgs)};
    tries.push_back(chat_messages_content_as_text(msgs));
    tries.push_back(chat_messages_content_as_text(tries[1]));
    std::exception_ptr first;
    for (size_t i = 0; i < tries.size(); ++i) {
        if (i > 0 && tries[i] == msgs) continue;
        try {
            return chat_template_apply_jinja(t, tries[i], tools, true, special, vars);
        } catch (const Error&) {
            if (!first) first = std::current_exception();
        }
    }
    std::rethrow_exception(first);
}

ojson chat_messages_for_format(ToolFormat format, ojson messages) {
    // GLM 4.5's template writes a null content as "None".
    if (format == ToolFormat::Glm45) return chat_messages_content_as_text(std::move(messages));
    // Command R7B's template writes an earlier reply's plan from "tool_plan".
    if (format == ToolFormat::CommandR7B) {
        for (ojson& m : messages)
            if (m["role"] == "assistant" && m.contains("reasoning_content") &&
                !m.contains("tool_plan"))
                m["tool_plan"] = m["reasoning_content"];
        return messages;
    }
    if (format != ToolFormat::Granite && format != ToolFormat::Phi4Mini) return messages;
    // Granite's and Phi-4-mini's templates write an assistant's content only: its calls go
    // there, as the model wrote them.
    const std::string_view end = format == ToolFormat::Phi4Mini ? kPhi4CallEnd : "";
    for (ojson& m : messages) {
        if (m["role"] != "assistant" || !m.contains("tool_calls") || !m["tool_calls"].is_array())
            continue;
        ojson calls = ojson::array();
        for (const ojson& c : m["tool_calls"])
            calls.push_back(
                {{"name", c["function"]["name"]}, {"arguments", c["function"]["arguments"]}});
        std::string text = m["content"].is_string() ? m["content"].get<std::string>() : "";
        m["content"] = text + std::string(kGraniteCall) +
                       (format == ToolFormat::Phi4Mini ? jinja_tojson(calls) : calls.dump()) +
                       std::string(end);
    }
    return messages;
}

ojson chat_messages_content_as_text(ojson messages) {
    for (ojson& m : messages)
        if (m.contains("content") && m["content"].is_null()) m["content"] = "";
    return messages;
}

ojson chat_tools_native_list(const ChatTools& t) {
    ojson out = ojson::array();
    for (const ojson& f : t.functions) out.push_back({{"type", "function"}, {"function", f}});
    return out;
}

}  // namespace kvrun
