// Tool calls in a model family's own syntax (see ToolFormat in server_tools.h): detection
// from the chat template, the messages and tools a template is given, the grammar that keeps
// calls to the syntax, and reading a reply back.
#include <algorithm>
#include <map>

#include "common.h"
#include "json_schema.h"
#include "modes/server_tools.h"
#include "reasoning.h"
#include "stop_text.h"
#include "tokenizer.h"
#include "unicode_text.h"

namespace kvrun {
namespace {

using ojson = nlohmann::ordered_json;

constexpr std::string_view kHermesOpen = "<tool_call>", kHermesClose = "</tool_call>";
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]", kPythonTag = "<|python_tag|>";
constexpr std::string_view kMistralArgs = "[ARGS]", kMistralCallId = "[CALL_ID]";
constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>";
constexpr std::string_view kXmlFunction = "<function=", kXmlParameter = "<parameter=";
constexpr std::string_view kXmlParameterEnd = "</parameter>", kXmlFunctionEnd = "</function>";
// DeepSeek R1's tool tokens.
constexpr std::string_view kR1CallsBegin = "<｜tool▁calls▁begin｜>",
                           kR1CallsEnd = "<｜tool▁calls▁end｜>",
                           kR1CallBegin = "<｜tool▁call▁begin｜>",
                           kR1CallEnd = "<｜tool▁call▁end｜>", kR1Sep = "<｜tool▁sep｜>";
// gpt-oss's harmony tags.
constexpr std::string_view kHarmonyChannel = "<|channel|>", kHarmonyFunctions = "functions.";
constexpr std::string_view kHarmonyEnd = "<|end|>";
// IBM Granite 3.x's call tag.
constexpr std::string_view kGraniteCall = "<|tool_call|>";

// A call's arguments as the model would have written them: an object when the text parses.
ojson arguments_value(const ojson& f) {
    if (!f.contains("arguments")) return ojson::object();
    if (!f["arguments"].is_string()) return f["arguments"];
    const std::string text = f["arguments"].get<std::string>();
    ojson v = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
    return v.is_discarded() ? ojson(text) : v;
}

// One call read from the model's JSON: {"name", args_key or the other usual key}.
bool read_call(const ojson& j, ToolCall& call) {
    if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
    call.name = j["name"].get<std::string>();
    const char* keys[] = {"arguments", "parameters"};
    call.arguments = "{}";
    for (const char* k : keys)
        if (j.contains(k)) {
            call.arguments = j[k].is_string() ? j[k].get<std::string>() : j[k].dump();
            break;
        }
    return true;
}

// The JSON object that s begins with (after white space), without what follows it, or "".
std::string_view object_at(std::string_view s) {
    const size_t start = s.find_first_not_of(" \n\t\r");
    if (start == std::string_view::npos || s[start] != '{') return {};
    int depth = 0;
    bool in_string = false;
    for (size_t i = start; i < s.size(); ++i) {
        const char c = s[i];
        if (in_string) {
            if (c == '\\')
                ++i;
            else if (c == '"')
                in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '{' || c == '[') {
            ++depth;
        } else if ((c == '}' || c == ']') && --depth == 0) {
            return s.substr(start, i + 1 - start);
        }
    }
    return {};
}

// Mistral's templates demand ids of 9 letters and digits: made from the usual id.
std::string mistral_id(const std::string& id) {
    static constexpr char kAlnum[] =
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (unsigned char c : id) h = (h ^ c) * 1099511628211ull;
    std::string out;
    for (int i = 0; i < 9; ++i) {
        out += kAlnum[h % 62];
        h = h / 62 + (h % 7919) * 2654435761ull;
    }
    return out;
}

ChatToolReply parse_hermes(const std::string& text) {
    ChatToolReply out;
    const size_t first = text.find(kHermesOpen);
    if (first == std::string::npos) {
        out.content = text;
        return out;
    }
    for (size_t at = first; at != std::string::npos; at = text.find(kHermesOpen, at)) {
        at += kHermesOpen.size();
        const size_t end = text.find(kHermesClose, at);
        // (A block cut short after its object, "</tool_c" say, still holds the call.)
        const std::string_view body = object_at(std::string_view(text).substr(at));
        ToolCall call;
        if (read_call(ojson::parse(body, nullptr, false), call)) out.calls.push_back(call);
        if (end == std::string::npos) break;
        at = end + kHermesClose.size();
    }
    out.content = out.calls.empty() ? text : std::string(trim_space_right(text.substr(0, first)));
    return out;
}

ChatToolReply parse_llama3(const std::string& text) {
    ChatToolReply out;
    std::string_view s = trim_space_left(text);
    if (s.substr(0, kPythonTag.size()) == kPythonTag)
        s = trim_space_left(s.substr(kPythonTag.size()));
    ToolCall call;
    const ojson j = ojson::parse(trim_space_right(s), nullptr, false);
    if (read_call(j, call))
        out.calls.push_back(call);
    else
        out.content = text;
    return out;
}

ChatToolReply parse_mistral(const std::string& text) {
    ChatToolReply out;
    std::string_view s = trim_space_left(text);
    if (s.substr(0, kMistralCalls.size()) == kMistralCalls)
        s = trim_space_left(s.substr(kMistralCalls.size()));
    const ojson j = ojson::parse(trim_space_right(s), nullptr, false);
    if (j.is_array())
        for (const ojson& c : j) {
            ToolCall call;
            if (read_call(c, call)) out.calls.push_back(call);
        }
    if (out.calls.empty()) out.content = text;
    return out;
}

// Granite: any text, then <|tool_call|> and a JSON list of {"name", "arguments"}.
ChatToolReply parse_granite(const std::string& text) {
    ChatToolReply out;
    const size_t at = text.find(kGraniteCall);
    if (at != std::string::npos) {
        const std::string_view rest = trim_space_right(
            trim_space_left(std::string_view(text).substr(at + kGraniteCall.size())));
        const ojson j = ojson::parse(rest, nullptr, false);
        if (j.is_array())
            for (const ojson& c : j) {
                ToolCall call;
                if (read_call(c, call)) out.calls.push_back(call);
            }
    }
    out.content = out.calls.empty() ? text : std::string(trim_space_right(text.substr(0, at)));
    return out;
}

// [TOOL_CALLS]name[ARGS]{...}, repeated; an id the model adds ([CALL_ID]id) is left out.
ChatToolReply parse_mistral_v11(const std::string& text) {
    ChatToolReply out;
    const size_t first = text.find(kMistralCalls);
    for (size_t at = first; at != std::string::npos; at = text.find(kMistralCalls, at)) {
        at += kMistralCalls.size();
        const size_t args = text.find(kMistralArgs, at);
        if (args == std::string::npos) break;
        std::string_view name = std::string_view(text).substr(at, args - at);
        name = name.substr(0, name.find(kMistralCallId));
        const std::string_view body =
            object_at(std::string_view(text).substr(args + kMistralArgs.size()));
        const ojson j = ojson::parse(body, nullptr, false);
        if (!j.is_object()) break;
        out.calls.push_back({"", std::string(trim_space_right(trim_space_left(name))), j.dump()});
        at = static_cast<size_t>(body.data() + body.size() - text.data());
    }
    out.content = out.calls.empty() ? text : std::string(trim_space_right(text.substr(0, first)));
    return out;
}

// A parameter's schema in the tools' call schema, or null.
const ojson* parameter_schema(const ChatTools* tools, const std::string& fn, const std::string& p) {
    if (!tools) return nullptr;
    for (const ojson& f : tools->functions)
        if (f["name"] == fn && f.contains("parameters") && f["parameters"].is_object() &&
            f["parameters"].contains("properties") && f["parameters"]["properties"].contains(p))
            return &f["parameters"]["properties"][p];
    return nullptr;
}

// A string parameter's value is its text as written; others are JSON where they parse.
bool string_typed(const ojson* schema) {
    if (!schema || !schema->is_object()) return false;
    if (schema->contains("type")) return (*schema)["type"] == "string";
    if (schema->contains("enum")) {
        const ojson& e = (*schema)["enum"];
        return e.is_array() &&
               std::all_of(e.begin(), e.end(), [](const ojson& v) { return v.is_string(); });
    }
    return false;
}

// <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...</function>\n</tool_call>
ChatToolReply parse_qwen3_coder(const std::string& text, const ChatTools* tools) {
    ChatToolReply out;
    const size_t first = text.find(kHermesOpen);
    for (size_t at = first; at != std::string::npos; at = text.find(kHermesOpen, at)) {
        at += kHermesOpen.size();
        const size_t fn = text.find(kXmlFunction, at);
        const size_t fn_end = fn == std::string::npos ? fn : text.find('>', fn);
        if (fn_end == std::string::npos) break;
        ToolCall call;
        call.name = trim_space_right(trim_space_left(std::string_view(text).substr(
            fn + kXmlFunction.size(), fn_end - fn - kXmlFunction.size())));
        ojson args = ojson::object();
        const size_t body_end = std::min(text.find(kXmlFunctionEnd, fn_end), text.size());
        for (size_t p = text.find(kXmlParameter, fn_end); p < body_end;
             p = text.find(kXmlParameter, p)) {
            const size_t name_end = text.find('>', p);
            if (name_end == std::string::npos) break;
            const std::string name(trim_space_right(trim_space_left(std::string_view(text).substr(
                p + kXmlParameter.size(), name_end - p - kXmlParameter.size()))));
            size_t value_end = text.find(kXmlParameterEnd, name_end);
            const bool cut = value_end == std::string::npos;
            if (cut) value_end = body_end;
            std::string_view value =
                std::string_view(text).substr(name_end + 1, value_end - name_end - 1);
            if (cut)  // (cut short inside its closing tag)
                value.remove_suffix(
                    stop_string_holdback(value, {"\n" + std::string(kXmlParameterEnd)}));
            if (value.starts_with('\n')) value.remove_prefix(1);
            if (value.ends_with('\n')) value.remove_suffix(1);
            const ojson parsed = ojson::parse(value, nullptr, false);
            args[name] =
                string_typed(parameter_schema(tools, call.name, name)) || parsed.is_discarded()
                    ? ojson(std::string(value))
                    : parsed;
            p = value_end;
        }
        call.arguments = args.dump();
        out.calls.push_back(std::move(call));
        at = body_end;
    }
    out.content = out.calls.empty() ? text : std::string(trim_space_right(text.substr(0, first)));
    return out;
}

// <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```
// <｜tool▁call▁end｜>..., the text before the first call the content.
ChatToolReply parse_deepseek_r1(const std::string& text) {
    ChatToolReply out;
    size_t first = text.find(kR1CallsBegin);
    if (first == std::string::npos) first = text.find(kR1CallBegin);
    for (size_t at = first; at != std::string::npos; at = text.find(kR1CallBegin, at)) {
        const size_t sep = text.find(kR1Sep, at);
        if (sep == std::string::npos) break;
        const size_t name_start = sep + kR1Sep.size();
        const size_t name_end = text.find('\n', name_start);
        if (name_end == std::string::npos) break;
        std::string_view rest = std::string_view(text).substr(name_end + 1);
        if (trim_space_left(rest).starts_with("```json")) rest = trim_space_left(rest).substr(7);
        const std::string_view body = object_at(rest);
        const ojson j = ojson::parse(body, nullptr, false);
        if (!j.is_object()) break;
        out.calls.push_back(
            {"",
             std::string(trim_space_right(trim_space_left(
                 std::string_view(text).substr(name_start, name_end - name_start)))),
             j.dump()});
        at = static_cast<size_t>(body.data() + body.size() - text.data());
    }
    out.content = out.calls.empty() ? text : std::string(trim_space_right(text.substr(0, first)));
    return out;
}

// Harmony (gpt-oss): each message addressed to "functions.NAME" is a call whose text is its
// arguments; the final and commentary text for the user is the content.
ChatToolReply parse_harmony(const std::string& text) {
    ChatToolReply out;
    if (!harmony_reply(text)) {
        out.content = text;
        return out;
    }
    const std::vector<HarmonyMessage> messages = harmony_messages(text);
    for (const HarmonyMessage& m : messages) {
        if (!m.recipient.starts_with(kHarmonyFunctions)) continue;
        const ojson j = ojson::parse(trim_space_left(m.text), nullptr, false);
        if (!j.is_object()) continue;
        out.calls.push_back({"", m.recipient.substr(kHarmonyFunctions.size()), j.dump()});
    }
    out.content = harmony_content(messages);
    return out;
}

// What a stream may show of a reply whose calls start with `tag` after any text: the text
// before it, without what may begin the tag and without trailing white space.
ToolAnswerPrefix content_before(std::string_view reply, std::string_view tag) {
    ToolAnswerPrefix out;
    out.answer = true;
    const size_t at = reply.find(tag);
    std::string_view shown = reply.substr(0, at);
    if (at == std::string_view::npos)
        shown.remove_suffix(stop_string_holdback(shown, {std::string(tag)}));
    out.text = trim_space_right(shown);
    return out;
}

// The call schema (chat_tools_call_schema) and, for each tool it allows, its name and a
// $ref to its arguments' schema inside it: for grammars that write the name outside JSON.
struct CallSchema {
    ojson schema;
    std::vector<std::pair<std::string, std::string>> tools;  // (name, "#/.../arguments")
    const ojson& arguments(size_t k) const {
        return schema.at(ojson::json_pointer(tools[k].second.substr(1)));
    }
};
CallSchema call_schema(const ChatTools& t) {
    CallSchema c{chat_tools_call_schema(t, "arguments", false), {}};
    const bool one = !c.schema.contains("anyOf");
    const size_t n = one ? 1 : c.schema["anyOf"].size();
    for (size_t k = 0; k < n; ++k) {
        const ojson& call = one ? c.schema : c.schema["anyOf"][k];
        c.tools.emplace_back(call["properties"]["name"]["const"].get<std::string>(),
                             one ? std::string("#/properties/arguments")
                                 : fmt::format("#/anyOf/{}/properties/arguments", k));
    }
    return c;
}

// For grammars that write each tool's name outside JSON: a rule "tool-args-k" per tool of
// `calls` for its arguments (json_schema_to_grammar_rules' (rule, $ref) pairs), and the
// alternatives "A | B | ..." where alternative(name, rule) writes one tool's call.
template <class F>
std::pair<std::vector<std::pair<std::string, std::string>>, std::string> named_alternatives(
    const CallSchema& calls, F&& alternative) {
    std::pair<std::vector<std::pair<std::string, std::string>>, std::string> out;
    auto& [rules, alternatives] = out;
    for (size_t k = 0; k < calls.tools.size(); ++k) {
        rules.emplace_back(fmt::format("tool-args-{}", k), calls.tools[k].second);
        alternatives += (k ? " | " : "") + alternative(calls.tools[k].first, rules.back().first);
    }
    return out;
}

// GBNF for a string literal.
std::string literal(std::string_view s) {
    std::string out = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') out += '\\';
        if (c == '\n') {
            out += "\\n";
            continue;
        }
        out += c;
    }
    return out + "\"";
}

// GBNF rules `name` (with helpers name-0 .. name-(n-1)) for any text that does not contain
// `word` (ASCII): a matcher of the word's prefixes, each state a rule that goes on with any
// character except one that would complete the word.
std::string gbnf_text_without(std::string_view word, const std::string& name) {
    std::string alphabet;
    for (char c : word) {
        if (static_cast<unsigned char>(c) >= 0x80)
            fail("gbnf_text_without: '{}' is not ASCII", word);
        if (alphabet.find(c) == std::string::npos) alphabet += c;
    }
    // The longest prefix of `word` that ends the text word[0..k) + c.
    auto next = [&](size_t k, char c) {
        const std::string text = std::string(word.substr(0, k)) + c;
        for (size_t j = std::min(text.size(), word.size()); j > 0; --j)
            if (text.compare(text.size() - j, j, word.substr(0, j)) == 0) return j;
        return size_t(0);
    };
    auto char_literal = [](char c) { return literal(std::string_view(&c, 1)); };
    std::string others = "[^";
    for (char c : alphabet) {
        if (c == '\n') {
            others += "\\n";
            continue;
        }
        if (c == ']' || c == '^' || c == '-' || c == '\\') others += '\\';
        others += c;
    }
    others += "]";
    std::string out = name + " ::= " + name + "-0\n";
    for (size_t k = 0; k < word.size(); ++k) {
        out += fmt::format("{}-{} ::= (", name, k);
        for (char c : alphabet)
            if (const size_t j = next(k, c); j < word.size())
                out += fmt::format("{} {}-{} | ", char_literal(c), name, j);
        out += fmt::format("{} {}-0)?\n", others, name);
    }
    return out;
}

}  // namespace

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
    if (has(kHermesOpen) && has(kXmlFunction) && has(kXmlParameter)) return ToolFormat::Qwen3Coder;
    if (has(kR1CallsBegin)) return ToolFormat::DeepSeekR1;
    if (has(kHermesOpen)) return ToolFormat::Hermes;
    if (has(kMistralCalls))
        return has(kMistralArgs) ? ToolFormat::MistralV11 : ToolFormat::MistralNemo;
    if (has("<|start_header_id|>") && (has("ipython") || has(kPythonTag)))
        return ToolFormat::Llama3;
    if (has(kGraniteCall) && has("<|start_of_role|>")) return ToolFormat::Granite;
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
        case ToolFormat::Harmony:
            return "gpt-oss";
        case ToolFormat::Granite:
            return "granite";
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
    const ojson msgs = chat_messages_for_format(format, messages);
    std::vector<ojson> tries = {msgs, chat_messages_arguments_as_text(msgs)};
    tries.push_back(chat_messages_content_as_text(msgs));
    tries.push_back(chat_messages_content_as_text(tries[1]));
    std::exception_ptr first;
    for (size_t i = 0; i < tries.size(); ++i) {
        if (i > 0 && tries[i] == msgs) continue;
        try {
            return chat_template_apply_jinja(t, tries[i], tools, true, special, kwargs);
        } catch (const Error&) {
            if (!first) first = std::current_exception();
        }
    }
    std::rethrow_exception(first);
}

ojson chat_messages_for_format(ToolFormat format, ojson messages) {
    if (format != ToolFormat::Granite) return messages;
    // Granite's template writes an assistant's content only: its calls go there, as the
    // model wrote them.
    for (ojson& m : messages) {
        if (m["role"] != "assistant" || !m.contains("tool_calls") || !m["tool_calls"].is_array())
            continue;
        ojson calls = ojson::array();
        for (const ojson& c : m["tool_calls"])
            calls.push_back(
                {{"name", c["function"]["name"]}, {"arguments", c["function"]["arguments"]}});
        std::string text = m["content"].is_string() ? m["content"].get<std::string>() : "";
        m["content"] = text + std::string(kGraniteCall) + calls.dump();
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

ToolGrammar chat_tools_grammar(const ChatTools& t, const Tokenizer& tok, ToolThinking thinking) {
    ToolGrammar g;
    // The vocabulary's one token for a text, or -1.
    auto one_token = [&](std::string_view text) {
        const std::vector<TokenId> ids = tok.encode(std::string(text), false, true);
        return ids.size() == 1 && tok.token_to_piece(ids[0], true) == text ? ids[0] : TokenId(-1);
    };
    // A control token of the syntax: the token where the vocabulary has it (its text then
    // shown in the reply), else its text.
    auto tag = [&](std::string_view text) {
        const TokenId id = one_token(text);
        if (id < 0) return literal(text);
        g.preserved.emplace_back(text);
        return fmt::format("<[{}]>", id);
    };
    // A lazy grammar's start: the tag's token where the vocabulary has it (the tag's text then
    // shown in the reply), else `pattern` on its text.
    auto trigger_at = [&](std::string_view tag_text, const std::string& pattern) {
        if (const TokenId id = one_token(tag_text); id >= 0) {
            g.triggers.push_back({{"type", "token"}, {"token", id}});
            if (std::find(g.preserved.begin(), g.preserved.end(), tag_text) == g.preserved.end())
                g.preserved.emplace_back(tag_text);
        } else {
            g.triggers.push_back({{"type", "pattern"}, {"value", pattern}});
        }
    };
    // The grammar's own rules (the schema's keep clear of them).
    std::vector<std::string> own = {"tool-calls", "tool-block", "think-text"};
    for (size_t k = 0; k < kThinkClose.size(); ++k) own.push_back(fmt::format("think-text-{}", k));
    switch (t.format) {
        case ToolFormat::Hermes: {
            g.gbnf = json_schema_to_grammar_rule(chat_tools_call_schema(t, "arguments", false),
                                                 "tool-call", own);
            g.gbnf += "tool-block ::= " + literal(kHermesOpen) + " \"\\n\"? tool-call \"\\n\"? " +
                      literal(kHermesClose) + "\n";
            g.gbnf += t.parallel ? "tool-calls ::= tool-block (\"\\n\" tool-block)*\n"
                                 : "tool-calls ::= tool-block\n";
            if (!t.required) g.triggers.push_back({{"type", "word"}, {"value", kHermesOpen}});
            break;
        }
        case ToolFormat::Llama3: {
            g.gbnf = json_schema_to_grammar_rule(chat_tools_call_schema(t, "parameters", false),
                                                 "tool-call", own);
            g.gbnf += "tool-calls ::= tool-call\n";
            if (!t.required) {
                // A reply that begins with "{" is a call (from its "{"); so is what follows
                // the python tag where the vocabulary has it.
                g.triggers.push_back({{"type", "pattern_full"}, {"value", "\\s*(\\{[\\s\\S]*)"}});
                if (one_token(kPythonTag) >= 0)
                    g.triggers.push_back({{"type", "token"}, {"token", one_token(kPythonTag)}});
            }
            break;
        }
        case ToolFormat::MistralNemo: {
            g.gbnf = json_schema_to_grammar_rule(chat_tools_call_schema(t, "arguments", true),
                                                 "tool-call", own);
            g.gbnf += t.parallel ? "tool-calls ::= \"[\" tool-call (\", \" tool-call)* \"]\"\n"
                                 : "tool-calls ::= \"[\" tool-call \"]\"\n";
            // A required call: the prompt ends with "[TOOL_CALLS]" (chat_tools_prompt_suffix).
            if (t.required) break;
            trigger_at(kMistralCalls, "\\[TOOL_CALLS\\]\\s*(\\[)");  // (text: from the list on)
            break;
        }
        case ToolFormat::Granite: {
            // <|tool_call|> (a token where the vocabulary has it) and the list of calls.
            g.gbnf = json_schema_to_grammar_rule(chat_tools_call_schema(t, "arguments", false),
                                                 "tool-call", own);
            own.push_back("calls-tag");
            g.gbnf += "calls-tag ::= " + tag(kGraniteCall) + "\n";
            g.gbnf += fmt::format("tool-calls ::= {}\"[\" tool-call{} \"]\"\n",
                                  t.required ? "calls-tag " : "",
                                  t.parallel ? " (\", \" tool-call)*" : "");
            if (t.required) break;
            trigger_at(kGraniteCall, "<\\|tool_call\\|>\\s*(\\[)");  // (text: from the list on)
            break;
        }
        case ToolFormat::MistralV11: {
            // One rule per tool for its arguments (the call schema's alternatives), named in
            // text before them; the control tokens as tokens where the vocabulary has them.
            // Newer models may give a call an id ([CALL_ID] and 9 letters or digits) before
            // its arguments; where the vocabulary has no such token, never.
            const bool ids = one_token(kMistralCallId) >= 0;
            const CallSchema calls = call_schema(t);
            const auto [rules, alternatives] =
                named_alternatives(calls, [&](const std::string& name, const std::string& args) {
                    return fmt::format("{}{} args-tag {}", literal(name), ids ? " call-id?" : "",
                                       args);
                });
            own.insert(own.end(), {"tool-call", "calls-tag", "args-tag", "call-id"});
            g.gbnf = json_schema_to_grammar_rules(calls.schema, rules, own);
            g.gbnf += "tool-call ::= " + alternatives + "\n";
            g.gbnf += "calls-tag ::= " + tag(kMistralCalls) + "\n";
            g.gbnf += "args-tag ::= " + tag(kMistralArgs) + "\n";
            if (ids) g.gbnf += "call-id ::= " + tag(kMistralCallId) + " [a-zA-Z0-9]{9}\n";
            // A required call: the grammar writes the first [TOOL_CALLS] too; with "auto" it
            // starts after it.
            g.gbnf += fmt::format("tool-calls ::= {}tool-call{}\n", t.required ? "calls-tag " : "",
                                  t.parallel ? " (calls-tag tool-call)*" : "");
            if (t.required) break;
            trigger_at(kMistralCalls, "\\[TOOL_CALLS\\]()");  // (text: right after it)
            break;
        }
        case ToolFormat::Qwen3Coder: {
            // Each tool: its parameters in the schema's order (the required ones always), a
            // string's value as raw text up to "\n</parameter>", other values as JSON.
            const CallSchema calls = call_schema(t);
            std::vector<std::pair<std::string, std::string>> json_rules;
            std::string rules, alternatives;
            bool raw_text = false;
            own.insert(own.end(), {"tool-call", "raw-text"});
            for (size_t k = 0; k < calls.tools.size(); ++k) {
                const ojson& args = calls.arguments(k);
                const std::string& base = calls.tools[k].second;
                std::string params;
                if (args.is_object() && args.contains("properties") &&
                    args["properties"].is_object()) {
                    const ojson required = args.value("required", ojson::array());
                    size_t i = 0;
                    for (const auto& [name, prop] : args["properties"].items()) {
                        const std::string value = fmt::format("tool-{}-value-{}", k, i++);
                        std::string body;
                        if (string_typed(&prop) && prop.contains("enum")) {
                            for (const ojson& e : prop["enum"])
                                body += (body.empty() ? "" : " | ") + literal(e.get<std::string>());
                        } else if (string_typed(&prop) && prop.contains("maxLength")) {
                            body = fmt::format("[^<]{{{},{}}}", prop.value("minLength", 0),
                                               prop["maxLength"].get<int64_t>());
                        } else if (string_typed(&prop)) {
                            body = "raw-text";
                            raw_text = true;
                        } else {  // (a JSON pointer's name is escaped: ~0 ~1)
                            std::string escaped;
                            for (char c : name)
                                escaped += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
                            json_rules.emplace_back(value, base + "/properties/" + escaped);
                        }
                        if (!body.empty()) {
                            rules += value + " ::= " + body + "\n";
                            own.push_back(value);
                        }
                        const bool needed =
                            std::find(required.begin(), required.end(), name) != required.end();
                        params += fmt::format(" ({} {} \"\\n</parameter>\\n\"){}",
                                              literal(std::string(kXmlParameter) + name + ">\n"),
                                              value, needed ? "" : "?");
                    }
                }
                alternatives += fmt::format(
                    "{}{}{} \"</function>\"", k ? " | " : "",
                    literal(std::string(kXmlFunction) + calls.tools[k].first + ">\n"), params);
            }
            g.gbnf = json_rules.empty()
                         ? ""
                         : json_schema_to_grammar_rules(calls.schema, json_rules, own);
            g.gbnf += rules;
            if (raw_text) g.gbnf += gbnf_text_without("\n</parameter>", "raw-text");
            g.gbnf += "tool-call ::= " + alternatives + "\n";
            g.gbnf += "tool-block ::= " + literal(kHermesOpen) + " \"\\n\" tool-call \"\\n\" " +
                      literal(kHermesClose) + "\n";
            g.gbnf += t.parallel ? "tool-calls ::= tool-block (\"\\n\" tool-block)*\n"
                                 : "tool-calls ::= tool-block\n";
            if (!t.required) g.triggers.push_back({{"type", "word"}, {"value", kHermesOpen}});
            break;
        }
        case ToolFormat::DeepSeekR1: {
            // Each call names its tool in text, its arguments a JSON block; the tags are
            // tokens where the vocabulary has them.
            const CallSchema calls = call_schema(t);
            const auto [rules, alternatives] =
                named_alternatives(calls, [&](const std::string& name, const std::string& args) {
                    return fmt::format("{} \"\\n```json\\n\" {} \"\\n```\"", literal(name), args);
                });
            own.insert(own.end(), {"tool-call", "calls-begin", "calls-end", "call-begin",
                                   "call-end", "call-sep"});
            g.gbnf = json_schema_to_grammar_rules(calls.schema, rules, own);
            g.gbnf += "calls-begin ::= " + tag(kR1CallsBegin) + "\n";
            g.gbnf += "calls-end ::= " + tag(kR1CallsEnd) + "\n";
            g.gbnf += "call-begin ::= " + tag(kR1CallBegin) + "\n";
            g.gbnf += "call-end ::= " + tag(kR1CallEnd) + "\n";
            g.gbnf += "call-sep ::= " + tag(kR1Sep) + "\n";
            g.gbnf +=
                "tool-call ::= call-begin \"function\" call-sep (" + alternatives + ") call-end\n";
            // With "auto" the grammar starts after the first tag.
            g.gbnf += fmt::format("tool-calls ::= {}tool-call{} calls-end\n",
                                  t.required ? "calls-begin " : "",
                                  t.parallel ? " (\"\\n\"? tool-call)*" : "");
            if (t.required) break;
            trigger_at(kR1CallsBegin, std::string(kR1CallsBegin) + "()");
            break;
        }
        case ToolFormat::Harmony: {
            // A call is a commentary message to "functions.NAME" whose text is the arguments:
            // "<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}", or
            // with the recipient in the role: "<|start|>assistant to=functions.NAME
            // <|channel|>commentary json<|message|>{...}". Generation ends at <|call|>.
            const CallSchema calls = call_schema(t);
            const auto [rules, alternatives] =
                named_alternatives(calls, [&](const std::string& name, const std::string& args) {
                    return fmt::format("{} call-head {}",
                                       literal(std::string(kHarmonyFunctions) + name), args);
                });
            own.insert(own.end(), {"tool-call", "call-head", "analysis"});
            for (size_t k = 0; k < kHarmonyEnd.size(); ++k)
                own.push_back(fmt::format("analysis-{}", k));
            g.gbnf = json_schema_to_grammar_rules(calls.schema, rules, own);
            g.gbnf +=
                "call-head ::= \"<|channel|>commentary\"? (\" <|constrain|>json\" | \" json\")? "
                "\"<|message|>\"\n";
            g.gbnf += "tool-call ::= " + alternatives + "\n";
            if (!t.required) {  // the grammar from the recipient on
                g.gbnf += "tool-calls ::= tool-call\n";
                g.triggers.push_back(
                    {{"type", "pattern"}, {"value", "<\\|channel\\|>commentary to=()"}});
                g.triggers.push_back(
                    {{"type", "pattern"}, {"value", "<\\|start\\|>assistant to=()"}});
                break;
            }
            // Required: the reasoning may come first (the prompt ends with the assistant's
            // "<|start|>assistant"), then the call's message.
            g.gbnf += gbnf_text_without(kHarmonyEnd, "analysis");
            g.gbnf +=
                "root ::= (\"<|channel|>analysis<|message|>\" analysis \"<|end|>\" "
                "\"<|start|>assistant\")? (\"<|channel|>commentary to=\" tool-call | \" to=\" "
                "tool-call)\n";
            return g;
        }
        case ToolFormat::Generic:
            fail("chat_tools_grammar: the generic format uses chat_tools_schema");
    }
    // A required call in a reply that may think first: the reasoning block, then the calls
    // (a lazy grammar leaves the text before the calls free anyway).
    if (!t.required || thinking == ToolThinking::None || t.format == ToolFormat::MistralNemo ||
        t.format == ToolFormat::MistralV11) {
        g.gbnf += "root ::= tool-calls\n";
        return g;
    }
    g.gbnf += gbnf_text_without(kThinkClose, "think-text");
    const std::string close = literal(kThinkClose) + " [ \\t\\n]*";
    g.gbnf += thinking == ToolThinking::Open
                  ? "root ::= think-text " + close + " tool-calls\n"
                  : "root ::= (" + literal(kThinkOpen) + " think-text " + close + ")? tool-calls\n";
    return g;
}

std::string chat_tools_prompt_suffix(const ChatTools& t) {
    return t.format == ToolFormat::MistralNemo && t.required ? std::string(kMistralCalls) : "";
}

ChatToolReply chat_tools_parse(ToolFormat format, const std::string& text,
                               const std::string& id_prefix, const ChatTools* tools) {
    ChatToolReply out;
    switch (format) {
        case ToolFormat::Generic:
            return chat_tools_parse_generic(text, id_prefix);
        case ToolFormat::Hermes:
            out = parse_hermes(text);
            break;
        case ToolFormat::Llama3:
            out = parse_llama3(text);
            break;
        case ToolFormat::MistralNemo:
            out = parse_mistral(text);
            break;
        case ToolFormat::MistralV11:
            out = parse_mistral_v11(text);
            break;
        case ToolFormat::Qwen3Coder:
            out = parse_qwen3_coder(text, tools);
            break;
        case ToolFormat::DeepSeekR1:
            out = parse_deepseek_r1(text);
            break;
        case ToolFormat::Harmony:
            out = parse_harmony(text);
            break;
        case ToolFormat::Granite:
            out = parse_granite(text);
            break;
    }
    for (size_t k = 0; k < out.calls.size(); ++k) {
        out.calls[k].id = fmt::format("{}_{}", id_prefix, k);
        if (format == ToolFormat::MistralNemo || format == ToolFormat::MistralV11)
            out.calls[k].id = mistral_id(out.calls[k].id);
    }
    return out;
}

ToolAnswerPrefix tool_stream_content(ToolFormat format, std::string_view reply) {
    ToolAnswerPrefix out;
    switch (format) {
        case ToolFormat::Generic:
            return tool_answer_prefix(reply);
        case ToolFormat::Hermes:
        case ToolFormat::Qwen3Coder:
            return content_before(reply, kHermesOpen);
        case ToolFormat::MistralV11:
            return content_before(reply, kMistralCalls);
        case ToolFormat::DeepSeekR1:
            return content_before(reply, kR1CallsBegin);
        case ToolFormat::Granite:
            return content_before(reply, kGraniteCall);
        case ToolFormat::Harmony:  // the final and commentary text so far
            out.answer = true;
            out.text =
                harmony_reply(reply) ? reasoning_stream(reply, false).content : std::string(reply);
            return out;
        case ToolFormat::Llama3:
        case ToolFormat::MistralNemo: {
            const std::string_view s = trim_space_left(reply);
            if (s.empty()) {
                out.decided = false;
                return out;
            }
            const char call_start = format == ToolFormat::Llama3 ? '{' : '[';
            out.answer = s.front() != call_start && s.front() != '<';
            if (out.answer) out.text = reply;
            return out;
        }
    }
    return out;
}

}  // namespace kvrun
