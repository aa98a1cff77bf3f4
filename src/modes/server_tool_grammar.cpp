// The grammars that keep a reply to a native tool format's syntax (chat_tools_grammar).
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

// The parameters of each tool of an XML-style call syntax (Qwen3-Coder's, GLM 4.5's), in the
// schema's order: a rule per value (an enum's strings; a string of bounded length; raw-text, a
// rule the format writes, for other strings; JSON for other types).
struct XmlArguments {
    struct Param {
        std::string name, value_rule;
        bool required = false;
    };
    std::vector<std::vector<Param>> tools;  // per tool of the call schema
    std::string gbnf;                       // the value rules (not raw-text)
    bool raw_text = false;                  // some value is raw-text
};
XmlArguments xml_arguments(const CallSchema& calls, std::vector<std::string>& own) {
    XmlArguments out;
    std::vector<std::pair<std::string, std::string>> json_rules;
    std::string rules;
    for (size_t k = 0; k < calls.tools.size(); ++k) {
        const ojson& args = calls.arguments(k);
        const std::string& base = calls.tools[k].second;
        out.tools.emplace_back();
        if (!args.is_object() || !args.contains("properties") || !args["properties"].is_object())
            continue;
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
                out.raw_text = true;
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
            const bool needed = std::find(required.begin(), required.end(), name) != required.end();
            out.tools.back().push_back(
                {name, string_typed(&prop) && body.empty() ? "raw-text" : value, needed});
        }
    }
    out.gbnf =
        json_rules.empty() ? "" : json_schema_to_grammar_rules(calls.schema, json_rules, own);
    out.gbnf += rules;
    return out;
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
            own.insert(own.end(), {"builtin-call", "code-text", "python-tag", "arg-value"});
            g.gbnf = json_schema_to_grammar_rule(chat_tools_call_schema(t, "parameters", false),
                                                 "tool-call", own);
            // Built-in tools (Llama 3.1) after the python tag: NAME.call(ARG="VALUE", ...)
            // with the names of the tool's parameters, or a code tool's code.
            std::string builtin;
            for (const auto& f : t.functions) {
                const std::string name = f["name"].get<std::string>();
                if (!llama3_builtin(name)) continue;
                std::string alt = "code-text";
                if (!llama3_code_tool(name)) {
                    std::string keys;
                    if (f.contains("parameters") && f["parameters"].contains("properties"))
                        for (const auto& [key, value] : f["parameters"]["properties"].items())
                            keys += (keys.empty() ? "" : " | ") + literal(key);
                    const std::string arg = "(" + keys + ") \"=\" arg-value";
                    alt = literal(name + ".call(") +
                          (keys.empty() ? "" : " (" + arg + " (\", \" " + arg + ")*)?") + " " +
                          literal(")");
                }
                builtin += (builtin.empty() ? "" : " | ") + alt;
            }
            if (builtin.empty()) {
                g.gbnf += "tool-calls ::= tool-call\n";
            } else {
                g.gbnf += "builtin-call ::= " + builtin + "\n";
                g.gbnf += "code-text ::= [^\\x00]+\n";
                g.gbnf += "arg-value ::= \"\\\"\" [^\"\\n]* \"\\\"\"\n";
                g.gbnf += "python-tag ::= " + tag(kPythonTag) + "\n";
                // (With "auto" the grammar starts after the tag.)
                g.gbnf += t.required ? "tool-calls ::= tool-call | python-tag builtin-call\n"
                                     : "tool-calls ::= tool-call | builtin-call\n";
            }
            if (!t.required) {
                // A reply that begins with "{" is a call (from its "{"); so is what follows
                // the python tag (a token where the vocabulary has it, shown in the reply).
                g.triggers.push_back({{"type", "pattern_full"}, {"value", "\\s*(\\{[\\s\\S]*)"}});
                if (one_token(kPythonTag) >= 0 || !builtin.empty())
                    trigger_at(kPythonTag, "<\\|python_tag\\|>()");
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
        case ToolFormat::Granite:
        case ToolFormat::Phi4Mini: {
            // <|tool_call|> (a token where the vocabulary has it) and the list of calls;
            // Phi-4-mini closes it with <|/tool_call|>.
            const bool closed = t.format == ToolFormat::Phi4Mini;
            g.gbnf = json_schema_to_grammar_rule(chat_tools_call_schema(t, "arguments", false),
                                                 "tool-call", own);
            own.insert(own.end(), {"calls-tag", "calls-end"});
            g.gbnf += "calls-tag ::= " + tag(kGraniteCall) + "\n";
            if (closed) g.gbnf += "calls-end ::= " + tag(kPhi4CallEnd) + "\n";
            g.gbnf += fmt::format(
                "tool-calls ::= {}\"[\" tool-call{} \"]\"{}\n", t.required ? "calls-tag " : "",
                t.parallel ? " (\", \" tool-call)*" : "", closed ? " calls-end" : "");
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
        case ToolFormat::FireFunctionV2: {
            // functools[ and the list of calls (with "auto" the grammar starts at the marker;
            // a required call's reply may start with the space the template writes).
            g.gbnf = json_schema_to_grammar_rule(chat_tools_call_schema(t, "arguments", false),
                                                 "tool-call", own);
            g.gbnf +=
                fmt::format("tool-calls ::= {}{} tool-call{} \"]\"\n", t.required ? "\" \"? " : "",
                            literal(kFunctools), t.parallel ? " (\", \" tool-call)*" : "");
            if (!t.required) g.triggers.push_back({{"type", "word"}, {"value", kFunctools}});
            break;
        }
        case ToolFormat::FunctionaryV31: {
            // <function=NAME>{arguments}</function>, one rule per tool for its arguments; a
            // listed "python" tool as <|python_tag|> and its code.
            const CallSchema calls = call_schema(t);
            const auto [rules, alternatives] =
                named_alternatives(calls, [&](const std::string& name, const std::string& args) {
                    return fmt::format("{} {} {}", literal(std::string(kXmlFunction) + name + ">"),
                                       args, literal(kXmlFunctionEnd));
                });
            own.insert(own.end(), {"tool-call", "python-call", "code-text"});
            g.gbnf = json_schema_to_grammar_rules(calls.schema, rules, own);
            bool python = false;
            for (const auto& [name, ref] : calls.tools) python = python || name == "python";
            g.gbnf += "tool-call ::= " + alternatives + "\n";
            if (python) {
                g.gbnf += "python-call ::= " + tag(kPythonTag) + " code-text\n";
                g.gbnf += "code-text ::= [^\\x00]+\n";
            }
            const std::string calls_rule =
                t.parallel ? "tool-call (\"\\n\"? tool-call)*" : "tool-call";
            g.gbnf += "tool-calls ::= " + calls_rule + (python ? " | python-call" : "") + "\n";
            if (t.required) break;
            g.triggers.push_back({{"type", "word"}, {"value", kXmlFunction}});
            if (python) trigger_at(kPythonTag, "<\\|python_tag\\|>()");
            break;
        }
        case ToolFormat::FunctionaryV32: {
            // NAME\n{arguments}, one rule per tool for its arguments; the prompt ends with
            // ">>>", so the first call may start without one; a listed "python" tool as
            // "python\n" and its code (alone: the code runs to the end).
            const CallSchema calls = call_schema(t);
            const auto [rules, alternatives] =
                named_alternatives(calls, [&](const std::string& name, const std::string& args) {
                    return fmt::format("{} {}", literal(name + "\n"), args);
                });
            own.insert(own.end(), {"tool-call", "python-call", "code-text"});
            g.gbnf = json_schema_to_grammar_rules(calls.schema, rules, own);
            bool python = false;
            std::string names;  // (the names as a regular expression's alternatives)
            for (const auto& [name, ref] : calls.tools) {
                python = python || name == "python";
                std::string escaped;
                for (const char c : name) {
                    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos)
                        escaped += '\\';
                    escaped += c;
                }
                names += (names.empty() ? "" : "|") + escaped;
            }
            g.gbnf += "tool-call ::= " + alternatives + "\n";
            const std::string next = literal(kV32Next);
            std::string calls_rule = "tool-call";
            if (t.parallel) calls_rule += " (" + next + " tool-call)*";
            if (python) {
                g.gbnf += "python-call ::= " + literal("python\n") + " code-text\n";
                g.gbnf += "code-text ::= [^\\x00]+\n";
                calls_rule = "(" + calls_rule + " | python-call)";
            }
            g.gbnf += "tool-calls ::= " + next + "? " + calls_rule + "\n";
            if (t.required) break;
            // A reply that begins with a tool's name and a newline is a call; so is ">>>" and
            // a name after the text.
            g.triggers.push_back(
                {{"type", "pattern_full"}, {"value", "((?:" + names + ")\\n[\\s\\S]*)"}});
            for (const auto& [name, ref] : calls.tools)
                g.triggers.push_back({{"type", "word"}, {"value", std::string(kV32Next) + name}});
            break;
        }
        case ToolFormat::Qwen3Coder: {
            // Each tool: its parameters in the schema's order (the required ones always), a
            // string's value as raw text up to "\n</parameter>", other values as JSON.
            const CallSchema calls = call_schema(t);
            own.insert(own.end(), {"tool-call", "raw-text"});
            const XmlArguments args = xml_arguments(calls, own);
            std::string alternatives;
            for (size_t k = 0; k < calls.tools.size(); ++k) {
                std::string params;
                for (const XmlArguments::Param& p : args.tools[k])
                    params += fmt::format(" ({} {} \"\\n</parameter>\\n\"){}",
                                          literal(std::string(kXmlParameter) + p.name + ">\n"),
                                          p.value_rule, p.required ? "" : "?");
                alternatives += fmt::format(
                    "{}{}{} \"</function>\"", k ? " | " : "",
                    literal(std::string(kXmlFunction) + calls.tools[k].first + ">\n"), params);
            }
            g.gbnf = args.gbnf;
            if (args.raw_text) g.gbnf += gbnf_text_without("\n</parameter>", "raw-text");
            g.gbnf += "tool-call ::= " + alternatives + "\n";
            g.gbnf += "tool-block ::= " + literal(kHermesOpen) + " \"\\n\" tool-call \"\\n\" " +
                      literal(kHermesClose) + "\n";
            g.gbnf += t.parallel ? "tool-calls ::= tool-block (\"\\n\" tool-block)*\n"
                                 : "tool-calls ::= tool-block\n";
            if (!t.required) g.triggers.push_back({{"type", "word"}, {"value", kHermesOpen}});
            break;
        }
        case ToolFormat::Glm45: {
            // <tool_call>NAME, then each parameter (in the schema's order, the required ones
            // always) as <arg_key>P</arg_key><arg_value>VALUE</arg_value> on lines of their
            // own, a string's value raw text up to "</arg_value>", others JSON; </tool_call>.
            // The tags are tokens where the vocabulary has them.
            const CallSchema calls = call_schema(t);
            own.insert(own.end(), {"tool-call", "raw-text", "call-open", "call-close", "key-open",
                                   "key-close", "value-open", "value-close"});
            const XmlArguments args = xml_arguments(calls, own);
            std::string alternatives;
            for (size_t k = 0; k < calls.tools.size(); ++k) {
                std::string params;
                for (const XmlArguments::Param& p : args.tools[k])
                    params += fmt::format(
                        " (\"\\n\"? key-open {} key-close \"\\n\"? value-open {} value-close){}",
                        literal(p.name), p.value_rule, p.required ? "" : "?");
                alternatives +=
                    fmt::format("{}{}{}", k ? " | " : "", literal(calls.tools[k].first), params);
            }
            g.gbnf = args.gbnf;
            if (args.raw_text) g.gbnf += gbnf_text_without(kGlmValueEnd, "raw-text");
            g.gbnf += "call-open ::= " + tag(kHermesOpen) + "\n";
            g.gbnf += "call-close ::= " + tag(kHermesClose) + "\n";
            g.gbnf += "key-open ::= " + tag(kGlmKey) + "\n";
            g.gbnf += "key-close ::= " + tag(kGlmKeyEnd) + "\n";
            g.gbnf += "value-open ::= " + tag(kGlmValue) + "\n";
            g.gbnf += "value-close ::= " + tag(kGlmValueEnd) + "\n";
            g.gbnf += "tool-call ::= (" + alternatives + ") \"\\n\"? call-close\n";
            // With "auto" the grammar starts after the first <tool_call>.
            g.gbnf += fmt::format("tool-calls ::= {}tool-call{}\n", t.required ? "call-open " : "",
                                  t.parallel ? " (\"\\n\"? call-open tool-call)*" : "");
            if (!t.required) trigger_at(kHermesOpen, "<tool_call>()");
            break;
        }
        case ToolFormat::KimiK2: {
            // functions.NAME:N (the call's index), the arguments as JSON, between Kimi's tags
            // (tokens where the vocabulary has them).
            const CallSchema calls = call_schema(t);
            const auto [rules, alternatives] =
                named_alternatives(calls, [&](const std::string& name, const std::string& args) {
                    return fmt::format("{} [0-9]{{1,4}} call-args {}",
                                       literal(std::string(kHarmonyFunctions) + name + ":"), args);
                });
            own.insert(own.end(), {"tool-call", "section-begin", "section-end", "call-begin",
                                   "call-args", "call-end"});
            g.gbnf = json_schema_to_grammar_rules(calls.schema, rules, own);
            g.gbnf += "section-begin ::= " + tag(kKimiSection) + "\n";
            g.gbnf += "section-end ::= " + tag(kKimiSectionEnd) + "\n";
            g.gbnf += "call-begin ::= " + tag(kKimiCall) + "\n";
            g.gbnf += "call-args ::= " + tag(kKimiArgs) + "\n";
            g.gbnf += "call-end ::= " + tag(kKimiCallEnd) + "\n";
            g.gbnf += "tool-call ::= call-begin (" + alternatives + ") call-end\n";
            // With "auto" the grammar starts after the section's tag.
            g.gbnf +=
                fmt::format("tool-calls ::= {}tool-call{} section-end\n",
                            t.required ? "section-begin " : "", t.parallel ? " tool-call*" : "");
            if (!t.required) trigger_at(kKimiSection, "<\\|tool_calls_section_begin\\|>()");
            break;
        }
        case ToolFormat::CommandR7B: {
            // <|START_ACTION|>[{"tool_call_id": "0", "tool_name": "NAME", "parameters": {...}},
            // ...]<|END_ACTION|> (the tags tokens where the vocabulary has them); a required call
            // may come after the tool plan, <|START_THINKING|>...<|END_THINKING|>.
            const CallSchema calls = call_schema(t);
            const auto [rules, alternatives] =
                named_alternatives(calls, [&](const std::string& name, const std::string& args) {
                    return fmt::format(
                        "{} [0-9]{{1,3}} {} {} {}", literal("{\"tool_call_id\": \""),
                        literal("\", \"tool_name\": \"" + name + "\", \"parameters\": "), args,
                        literal("}"));
                });
            own.insert(own.end(), {"tool-call", "calls-open", "calls-close", "plan-open",
                                   "plan-close", "plan-text", "gap"});
            for (size_t k = 0; k < kR7bPlanEnd.size(); ++k)
                own.push_back(fmt::format("plan-text-{}", k));
            g.gbnf = json_schema_to_grammar_rules(calls.schema, rules, own);
            g.gbnf += "tool-call ::= " + alternatives + "\n";
            g.gbnf += "gap ::= [ \\t\\n]{0,8}\n";  // (a weak model would write only white space)
            g.gbnf += "calls-open ::= " + tag(kR7bAction) + "\n";
            g.gbnf += "calls-close ::= " + tag(kR7bActionEnd) + "\n";
            // With "auto" the grammar starts after the opening tag.
            g.gbnf += fmt::format(
                "tool-calls ::= {}gap \"[\" gap tool-call{} gap \"]\" calls-close\n",
                t.required ? "calls-open " : "", t.parallel ? " (\",\" gap tool-call)*" : "");
            if (!t.required) {
                trigger_at(kR7bAction, "<\\|START_ACTION\\|>()");
                break;
            }
            g.gbnf += "plan-open ::= " + tag(kR7bPlan) + "\n";
            g.gbnf += "plan-close ::= " + tag(kR7bPlanEnd) + "\n";
            g.gbnf += gbnf_text_without(kR7bPlanEnd, "plan-text");
            g.gbnf += "root ::= (plan-open plan-text plan-close)? tool-calls\n";
            return g;
        }
        case ToolFormat::DeepSeekR1:
        case ToolFormat::DeepSeekV31: {
            // Each call names its tool in text, its arguments a JSON block (R1: after
            // "function" and the separator) or the JSON itself after the separator (V3.1);
            // the tags are tokens where the vocabulary has them.
            const bool r1 = t.format == ToolFormat::DeepSeekR1;
            const CallSchema calls = call_schema(t);
            const auto [rules, alternatives] =
                named_alternatives(calls, [&](const std::string& name, const std::string& args) {
                    return r1 ? fmt::format("{} \"\\n```json\\n\" {} \"\\n```\"", literal(name),
                                            args)
                              : fmt::format("{} call-sep {}", literal(name), args);
                });
            own.insert(own.end(), {"tool-call", "calls-begin", "calls-end", "call-begin",
                                   "call-end", "call-sep"});
            g.gbnf = json_schema_to_grammar_rules(calls.schema, rules, own);
            g.gbnf += "calls-begin ::= " + tag(kR1CallsBegin) + "\n";
            g.gbnf += "calls-end ::= " + tag(kR1CallsEnd) + "\n";
            g.gbnf += "call-begin ::= " + tag(kR1CallBegin) + "\n";
            g.gbnf += "call-end ::= " + tag(kR1CallEnd) + "\n";
            g.gbnf += "call-sep ::= " + tag(kR1Sep) + "\n";
            g.gbnf += "tool-call ::= call-begin " +
                      std::string(r1 ? "\"function\" call-sep " : "") + "(" + alternatives +
                      ") call-end\n";
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
    // (Magistral thinks in [THINK] tags before Mistral v11's calls.)
    if (!t.required || thinking == ToolThinking::None || t.format == ToolFormat::MistralNemo) {
        g.gbnf += "root ::= tool-calls\n";
        return g;
    }
    const ReasoningTags tags = reasoning_tags(tok);
    g.gbnf += gbnf_text_without(tags.close, "think-text");
    // (White space after the block is bounded: a model must not idle there.)
    const std::string close = tag(tags.close) + " [ \\t\\n]{0,8}";
    g.gbnf += thinking == ToolThinking::Open
                  ? "root ::= think-text " + close + " tool-calls\n"
                  : "root ::= (" + tag(tags.open) + " think-text " + close + ")? tool-calls\n";
    return g;
}

std::string chat_tools_prompt_suffix(const ChatTools& t) {
    return t.format == ToolFormat::MistralNemo && t.required ? std::string(kMistralCalls) : "";
}

}  // namespace kvrun
