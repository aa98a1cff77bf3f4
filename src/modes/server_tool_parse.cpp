// Reading a reply back in a native tool format's syntax, whole (chat_tools_parse) or while it
// is generated (tool_stream_content).
#include <algorithm>
#include <cctype>
#include <map>
#include <set>

#include "common.h"
#include "json_schema.h"
#include "modes/server_tool_impl.h"
#include "modes/server_tools.h"
#include "reasoning.h"
#include "stop_text.h"
#include "tokenizer.h"
#include "unicode_text.h"

namespace kvrun {

namespace tool_detail {
using ojson = nlohmann::ordered_json;
const ojson* parameter_schema(const ChatTools* tools, const std::string& fn, const std::string& p) {
    if (!tools) return nullptr;
    for (const ojson& f : tools->functions)
        if (f["name"] == fn && f.contains("parameters") && f["parameters"].is_object() &&
            f["parameters"].contains("properties") && f["parameters"]["properties"].contains(p))
            return &f["parameters"]["properties"][p];
    return nullptr;
}

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
}  // namespace tool_detail

namespace {

using ojson = nlohmann::ordered_json;
using namespace tool_detail;

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

// The JSON object or list that s begins with (after white space), without what follows it, or
// "" (also for one not closed).
std::string_view value_at(std::string_view s) {
    const size_t start = s.find_first_not_of(" \n\t\r");
    if (start == std::string_view::npos || (s[start] != '{' && s[start] != '[')) return {};
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

// The JSON object that s begins with (after white space), without what follows it, or "".
std::string_view object_at(std::string_view s) {
    const std::string_view v = value_at(s);
    return !v.empty() && v.front() == '{' ? v : std::string_view();
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

// Llama 3.1's built-in call NAME.call(ARG="VALUE", ARG=2, ...) (white space allowed around
// the parts; a quoted value is a string, JSON escapes read where they parse, others JSON
// where they parse): false when s is not one.
bool read_builtin_call(std::string_view s, ToolCall& call) {
    auto ident = [&](size_t& i) {
        const size_t from = i;
        while (i < s.size() && (std::isalnum(static_cast<unsigned char>(s[i])) || s[i] == '_')) ++i;
        return std::string(s.substr(from, i - from));
    };
    auto skip = [&](size_t& i) {
        while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    };
    size_t i = 0;
    const std::string name = ident(i);
    auto expect = [&](std::string_view word) {
        skip(i);
        if (s.substr(i, word.size()) != word) return false;
        i += word.size();
        return true;
    };
    if (name.empty() || !expect(".") || !expect("call") || !expect("(")) return false;
    ojson args = ojson::object();
    for (skip(i); i < s.size() && s[i] != ')';) {
        const std::string key = ident(i);
        skip(i);
        if (key.empty() || i >= s.size() || s[i] != '=') return false;
        ++i;
        skip(i);
        if (i < s.size() && s[i] == '"') {
            size_t end = i + 1;
            while (end < s.size() && s[end] != '"') end += s[end] == '\\' ? 2 : 1;
            if (end >= s.size()) return false;
            const std::string_view quoted = s.substr(i, end + 1 - i);
            const ojson v = ojson::parse(quoted, nullptr, false);
            args[key] = v.is_string() ? v : ojson(std::string(quoted.substr(1, quoted.size() - 2)));
            i = end + 1;
        } else {
            const size_t end = s.find_first_of(",)", i);
            if (end == std::string_view::npos) return false;
            const std::string raw(trim_space_right(s.substr(i, end - i)));
            const ojson v = ojson::parse(raw, nullptr, false);
            args[key] = v.is_discarded() ? ojson(raw) : v;
            i = end;
        }
        skip(i);
        if (i < s.size() && s[i] == ',') ++i;
        skip(i);
    }
    if (i >= s.size() || !trim_space_left(s.substr(i + 1)).empty()) return false;
    call.name = name;
    call.arguments = args.dump();
    return true;
}

// Llama 3: {"name", "parameters"} (after the python tag or not); after the python tag, a
// built-in tool's call or a code tool's code (a listed python or code_interpreter tool, else
// "python", as llama.cpp reads it).
ChatToolReply parse_llama3(const std::string& text, const ChatTools* tools) {
    ChatToolReply out;
    std::string_view s = trim_space_left(text);
    const bool tagged = s.starts_with(kPythonTag);
    if (tagged) s = trim_space_left(s.substr(kPythonTag.size()));
    s = trim_space_right(s);
    ToolCall call;
    if (read_call(ojson::parse(s, nullptr, false), call) ||
        (tagged && read_builtin_call(s, call))) {
        out.calls.push_back(call);
    } else if (tagged && !s.empty()) {
        call.name = "python";
        if (tools)
            for (const auto& f : tools->functions)
                if (llama3_code_tool(f["name"].get<std::string>())) {
                    call.name = f["name"].get<std::string>();
                    break;
                }
        call.arguments = ojson({{"code", std::string(s)}}).dump();
        out.calls.push_back(call);
    } else {
        out.content = text;
    }
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

// Command R7B: the tool plan <|START_THINKING|>...<|END_THINKING|> (not content), then the
// calls <|START_ACTION|>[{"tool_call_id", "tool_name", "parameters"}, ...]<|END_ACTION|>, or
// the answer <|START_RESPONSE|>...<|END_RESPONSE|> (a reply without those tags is all
// answer, less its plan).
std::string r7b_answer(std::string_view text, bool whole) {
    if (const size_t p = text.find(kR7bPlan); p != std::string_view::npos) {
        const size_t e = text.find(kR7bPlanEnd, p);
        if (e == std::string_view::npos) return {};  // still planning
        text = text.substr(e + kR7bPlanEnd.size());
    }
    const size_t r = text.find(kR7bResponse);
    if (r != std::string_view::npos) text = text.substr(r + kR7bResponse.size());
    const size_t end = text.find(kR7bResponseEnd);
    if (end != std::string_view::npos) {
        text = text.substr(0, end);
    } else if (!whole) {  // what may begin a tag waits
        text.remove_suffix(stop_string_holdback(
            text, {std::string(kR7bResponseEnd), std::string(kR7bAction), std::string(kR7bPlan)}));
    }
    return std::string(trim_space_right(trim_space_left(text)));
}

ChatToolReply parse_command_r7b(const std::string& text) {
    ChatToolReply out;
    const size_t at = text.find(kR7bAction);
    if (at != std::string::npos) {
        std::string_view rest =
            trim_space_left(std::string_view(text).substr(at + kR7bAction.size()));
        const size_t end = rest.find(kR7bActionEnd);
        const ojson j = ojson::parse(trim_space_right(rest.substr(0, end)), nullptr, false);
        if (j.is_array())
            for (const ojson& c : j) {
                if (!c.is_object() || !c.contains("tool_name") || !c["tool_name"].is_string())
                    continue;
                const ojson args = c.contains("parameters") ? c["parameters"] : ojson::object();
                out.calls.push_back({"", c["tool_name"].get<std::string>(), args.dump()});
            }
    }
    // (Text may come before the calls, as in the other formats.)
    out.content = r7b_answer(
        out.calls.empty() ? std::string_view(text) : std::string_view(text).substr(0, at), true);
    return out;
}

// Functionary v3.1: <function=NAME>{...}</function> calls after any text (the end tag may be
// missing at the very end); or the text after <|python_tag|>, a "python" call's code.
ChatToolReply parse_functionary_v31(const std::string& text) {
    ChatToolReply out;
    const size_t python = text.find(kPythonTag);
    const size_t first = std::min(text.find(kXmlFunction), python);
    for (size_t at = text.find(kXmlFunction); at < python; at = text.find(kXmlFunction, at)) {
        at += kXmlFunction.size();
        const size_t name_end = text.find('>', at);
        if (name_end == std::string::npos) break;
        const std::string_view args = object_at(std::string_view(text).substr(name_end + 1));
        const ojson j = ojson::parse(args, nullptr, false);
        if (!j.is_object()) break;
        out.calls.push_back({"", text.substr(at, name_end - at), j.dump()});
        at = size_t(args.data() + args.size() - text.data());
    }
    if (python != std::string::npos && out.calls.empty()) {
        const std::string_view code =
            trim_space_right(std::string_view(text).substr(python + kPythonTag.size()));
        if (!code.empty())
            out.calls.push_back({"", "python", ojson({{"code", std::string(code)}}).dump()});
    }
    out.content = out.calls.empty() ? text : std::string(trim_space_right(text.substr(0, first)));
    return out;
}

// Where a Functionary v3.2 part starts at or after `from`: ">>>" followed by a name (letters,
// digits, '_', '-', '.') and a newline; npos if none.
size_t v32_next_part(std::string_view text, size_t from) {
    for (size_t at = text.find(kV32Next, from); at != std::string_view::npos;
         at = text.find(kV32Next, at + 1)) {
        size_t e = at + kV32Next.size();
        while (e < text.size() && (std::isalnum(static_cast<unsigned char>(text[e])) ||
                                   text[e] == '_' || text[e] == '-' || text[e] == '.'))
            ++e;
        if (e > at + kV32Next.size() && e < text.size() && text[e] == '\n') return at;
    }
    return std::string_view::npos;
}

// Functionary v3.2: parts after the prompt's ">>>" and each later ">>>": "all\nTEXT" is the
// reply's text, "NAME\n{...}" a call, "python\nCODE" (not JSON) a python call's code. A reply
// that does not read so is all text.
ChatToolReply parse_functionary_v32(const std::string& text) {
    ChatToolReply out;
    std::string content;
    size_t at = text.starts_with(kV32Next) ? kV32Next.size() : 0;
    while (at < text.size()) {
        const std::string_view rest = std::string_view(text).substr(at);
        size_t next = v32_next_part(text, at);
        if (rest.starts_with(kV32All)) {
            const size_t from = at + kV32All.size();
            content += text.substr(from, next == std::string::npos ? next : next - from);
        } else {
            const size_t nl = rest.find('\n');
            const std::string name(rest.substr(0, nl == std::string_view::npos ? 0 : nl));
            const std::string_view body = nl == std::string_view::npos ? "" : rest.substr(nl + 1);
            const std::string_view args = object_at(body);
            const ojson j = args.empty() ? ojson() : ojson::parse(args, nullptr, false);
            if (!name.empty() && j.is_object()) {
                out.calls.push_back({"", name, j.dump()});
                next = v32_next_part(text, size_t(args.data() + args.size() - text.data()));
            } else if (name == "python") {
                const size_t end = next == std::string::npos ? text.size() : next;
                const std::string_view code = trim_space_right(body.substr(0, end - at - nl - 1));
                out.calls.push_back({"", "python", ojson({{"code", std::string(code)}}).dump()});
            } else {  // not a part: the text as the model wrote it
                out.calls.clear();
                out.content = text;
                return out;
            }
        }
        if (next == std::string::npos) break;
        at = next + kV32Next.size();
    }
    out.content = std::string(trim_space_right(content));
    return out;
}

// Calls as JSON lists [{"name", "arguments"}, ...], each after `tag` (Granite's and
// Phi-4-mini's <|tool_call|>, whose end tag may be missing; FireFunction's functools[, which
// ends with the list's bracket), after any text (the content). A reply without a readable
// list is all content.
ChatToolReply parse_call_lists(const std::string& text, std::string_view tag) {
    ChatToolReply out;
    const size_t first = text.find(tag);
    for (size_t at = first; at != std::string::npos; at = text.find(tag, at)) {
        at += tag.size() - (tag.back() == '[' ? 1 : 0);
        const std::string_view list = value_at(std::string_view(text).substr(at));
        const ojson j = ojson::parse(list, nullptr, false);
        if (!j.is_array()) break;
        for (const ojson& c : j) {
            ToolCall call;
            if (read_call(c, call)) out.calls.push_back(call);
        }
        at = size_t(list.data() + list.size() - text.data());
    }
    out.content = out.calls.empty() ? text : std::string(trim_space_right(text.substr(0, first)));
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

// A parameter's value as written in an XML-style call: a string parameter's text as it is,
// others JSON where it parses.
ojson argument_value(const ChatTools* tools, const std::string& fn, const std::string& p,
                     std::string_view value) {
    const ojson parsed = ojson::parse(value, nullptr, false);
    return string_typed(parameter_schema(tools, fn, p)) || parsed.is_discarded()
               ? ojson(std::string(value))
               : parsed;
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
            args[name] = argument_value(tools, call.name, name, value);
            p = value_end;
        }
        call.arguments = args.dump();
        out.calls.push_back(std::move(call));
        at = body_end;
    }
    out.content = out.calls.empty() ? text : std::string(trim_space_right(text.substr(0, first)));
    return out;
}

// <tool_call>NAME\n<arg_key>P</arg_key>\n<arg_value>VALUE</arg_value>\n...</tool_call>
ChatToolReply parse_glm45(const std::string& text, const ChatTools* tools) {
    ChatToolReply out;
    const size_t first = text.find(kHermesOpen);
    for (size_t at = first; at != std::string::npos; at = text.find(kHermesOpen, at)) {
        at += kHermesOpen.size();
        const size_t end = std::min(text.find(kHermesClose, at), text.size());
        const std::string_view body = std::string_view(text).substr(at, end - at);
        const size_t keys = body.find(kGlmKey);
        ToolCall call;
        call.name = trim_space_right(trim_space_left(body.substr(0, keys)));
        if (call.name.empty()) break;
        ojson args = ojson::object();
        for (size_t k = keys; k != std::string_view::npos; k = body.find(kGlmKey, k)) {
            const size_t key_end = body.find(kGlmKeyEnd, k);
            const size_t v =
                key_end == std::string_view::npos ? key_end : body.find(kGlmValue, key_end);
            if (v == std::string_view::npos) break;
            const std::string name(trim_space_right(
                trim_space_left(body.substr(k + kGlmKey.size(), key_end - k - kGlmKey.size()))));
            const size_t v_end = body.find(kGlmValueEnd, v);
            std::string_view value = body.substr(v + kGlmValue.size());
            if (v_end == std::string_view::npos)  // (cut short, perhaps inside its closing tag)
                value.remove_suffix(stop_string_holdback(value, {std::string(kGlmValueEnd)}));
            else
                value = value.substr(0, v_end - v - kGlmValue.size());
            args[name] = argument_value(tools, call.name, name, value);
            if (v_end == std::string_view::npos) break;
            k = v_end;
        }
        call.arguments = args.dump();
        out.calls.push_back(std::move(call));
        at = end;
    }
    out.content = out.calls.empty() ? text : std::string(trim_space_right(text.substr(0, first)));
    return out;
}

// Whether a call's id is Kimi K2's "functions.NAME:N".
bool kimi_id(const ToolCall& call) {
    const std::string head = std::string(kHarmonyFunctions) + call.name + ":";
    return call.id.size() > head.size() && call.id.starts_with(head) &&
           std::all_of(call.id.begin() + static_cast<std::ptrdiff_t>(head.size()), call.id.end(),
                       [](char c) { return c >= '0' && c <= '9'; });
}

// <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:N<|tool_call_argument_begin|>
// {...}<|tool_call_end|>...<|tool_calls_section_end|>; each call's id is the model's
// "functions.NAME:N".
ChatToolReply parse_kimi_k2(const std::string& text) {
    ChatToolReply out;
    size_t first = text.find(kKimiSection);
    if (first == std::string::npos) first = text.find(kKimiCall);
    for (size_t at = first == std::string::npos ? first : text.find(kKimiCall, first);
         at != std::string::npos; at = text.find(kKimiCall, at)) {
        const size_t id_start = at + kKimiCall.size();
        const size_t args = text.find(kKimiArgs, id_start);
        if (args == std::string::npos) break;
        const std::string id(trim_space_right(
            trim_space_left(std::string_view(text).substr(id_start, args - id_start))));
        std::string_view name = id;
        if (name.starts_with(kHarmonyFunctions)) name.remove_prefix(kHarmonyFunctions.size());
        name = name.substr(0, name.rfind(':'));
        const std::string_view body =
            object_at(std::string_view(text).substr(args + kKimiArgs.size()));
        const ojson j = ojson::parse(body, nullptr, false);
        if (!j.is_object() || name.empty()) break;
        out.calls.push_back({id, std::string(name), j.dump()});
        at = static_cast<size_t>(body.data() + body.size() - text.data());
    }
    out.content = out.calls.empty() ? text : std::string(trim_space_right(text.substr(0, first)));
    return out;
}

// DeepSeek's calls, the text before the first call the content: R1's
// <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```
// <｜tool▁call▁end｜>..., or (r1 false) V3.1's
// <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...
ChatToolReply parse_deepseek(const std::string& text, bool r1) {
    ChatToolReply out;
    size_t first = text.find(kR1CallsBegin);
    if (first == std::string::npos) first = text.find(kR1CallBegin);
    for (size_t at = first; at != std::string::npos; at = text.find(kR1CallBegin, at)) {
        const size_t begin = text.find(kR1CallBegin, at) + kR1CallBegin.size();
        const size_t sep = text.find(kR1Sep, at);
        if (sep == std::string::npos || begin > sep) break;
        // The name: after the separator up to a newline (R1), or between the tags (V3.1).
        const size_t name_start = r1 ? sep + kR1Sep.size() : begin;
        const size_t name_end = r1 ? text.find('\n', name_start) : sep;
        if (name_end == std::string::npos) break;
        std::string_view rest =
            std::string_view(text).substr(r1 ? name_end + 1 : sep + kR1Sep.size());
        if (r1 && trim_space_left(rest).starts_with("```json"))
            rest = trim_space_left(rest).substr(7);
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

}  // namespace

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
            out = parse_llama3(text, tools);
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
            out = parse_deepseek(text, true);
            break;
        case ToolFormat::DeepSeekV31:
            out = parse_deepseek(text, false);
            break;
        case ToolFormat::Harmony:
            out = parse_harmony(text);
            break;
        case ToolFormat::Granite:
        case ToolFormat::Phi4Mini:
            out = parse_call_lists(text, kGraniteCall);
            break;
        case ToolFormat::Glm45:
            out = parse_glm45(text, tools);
            break;
        case ToolFormat::KimiK2:
            out = parse_kimi_k2(text);
            break;
        case ToolFormat::CommandR7B:
            out = parse_command_r7b(text);
            break;
        case ToolFormat::FunctionaryV31:
            out = parse_functionary_v31(text);
            break;
        case ToolFormat::FunctionaryV32:
            out = parse_functionary_v32(text);
            break;
        case ToolFormat::FireFunctionV2:
            out = parse_call_lists(text, kFunctools);
            break;
    }
    std::set<std::string> ids;
    for (size_t k = 0; k < out.calls.size(); ++k) {
        // Kimi K2's template writes the ids back, and the model was trained on its own.
        if (format == ToolFormat::KimiK2 && kimi_id(out.calls[k]) &&
            ids.insert(out.calls[k].id).second)
            continue;
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
        case ToolFormat::DeepSeekV31:
            return content_before(reply, kR1CallsBegin);
        case ToolFormat::Granite:
        case ToolFormat::Phi4Mini:
            return content_before(reply, kGraniteCall);
        case ToolFormat::FireFunctionV2:
            return content_before(reply, kFunctools);
        case ToolFormat::FunctionaryV31: {  // before a call or the python tag
            ToolAnswerPrefix a = content_before(reply, kXmlFunction);
            ToolAnswerPrefix b = content_before(reply, kPythonTag);
            return a.text.size() <= b.text.size() ? a : b;
        }
        case ToolFormat::FunctionaryV32: {  // the "all" part's text, before the next part
            std::string_view r =
                reply.starts_with(kV32Next) ? reply.substr(kV32Next.size()) : reply;
            if (!r.starts_with(kV32All)) {
                ToolAnswerPrefix none;
                none.decided = !kV32All.starts_with(r);
                return none;
            }
            r.remove_prefix(kV32All.size());
            return content_before(r.substr(0, v32_next_part(r, 0)), kV32Next);
        }
        case ToolFormat::Glm45:
            return content_before(reply, kHermesOpen);
        case ToolFormat::KimiK2:
            return content_before(reply, kKimiSection);
        case ToolFormat::CommandR7B:  // the answer's text, without the plan and the tags
            out.answer = true;
            out.text = r7b_answer(reply.substr(0, reply.find(kR7bAction)), false);
            return out;
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
