// Chat templates: detection from Jinja source, names, and the exact text of each format.
//
// The formats, for [system S, user U1, assistant A1, user U2] + generation prompt
// (no leading BOS; "trim" = strip ASCII whitespace at both ends, as Jinja's trim/strip):
//   llama2  [INST] <<SYS>>\nS\n<</SYS>>\n\nU1 [/INST] A1 </s><s>[INST] U2 [/INST]
//           (Meta's template: the [INST] block and each reply are trimmed)
//   llama3  <|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>... per message, content
//           trimmed; generation prompt <|start_header_id|>assistant<|end_header_id|>\n\n
//   chatml  <|im_start|>role\ncontent<|im_end|>\n per message; prompt <|im_start|>assistant\n
//   mistral [INST] S\n\nU1 [/INST]A1</s>[INST] U2 [/INST]   (Mistral's documented v0.1 form)
//   zephyr  <|role|>\ncontent</s>\n per message; prompt <|assistant|>\n
//   phi3    <|role|>\ncontent<|end|>\n per message; prompt <|assistant|>\n
//   phi4    <|im_start|>role<|im_sep|>content<|im_end|> per message (nothing between);
//           prompt <|im_start|>assistant<|im_sep|>
//   gemma   <start_of_turn>user\nS\n\nU1<end_of_turn>\n<start_of_turn>model\nA1<end_of_turn>\n
//           ... content trimmed, assistant is "model"; prompt <start_of_turn>model\n
//   granite <|start_of_role|>role<|end_of_role|>content<|end_of_text|>\n per message;
//           prompt <|start_of_role|>assistant<|end_of_role|>   (IBM Granite 3)
//   deepseek3          S\n\n<｜User｜>U1<｜Assistant｜>A1<｜end▁of▁sentence｜><｜User｜>U2
//                      <｜Assistant｜>   (DeepSeek V3/R1 and the R1 distills of Qwen/Llama)
//   deepseek2          S\n\nUser: U1\n\nAssistant: A1<｜end▁of▁sentence｜>User: U2\n\nAssistant:
//                      (DeepSeek V2 / V2-Lite chat; the reply follows "Assistant:" with its
//                      own leading space)
//   mistral-v3         [INST] S\n\nU1[/INST] A1</s>[INST] U2[/INST]   (A trimmed)
//   mistral-v3-tekken  [INST]S\n\nU1[/INST]A1</s>[INST]U2[/INST]   (Mistral Nemo)
//   mistral-v7         [SYSTEM_PROMPT] S[/SYSTEM_PROMPT][INST] U1[/INST] A1</s>[INST] U2[/INST]
//   mistral-v7-tekken  [SYSTEM_PROMPT]S[/SYSTEM_PROMPT][INST]U1[/INST]A1</s>[INST]U2[/INST]
//                      (Mistral Small 3; the Mistral formats as their model cards and
//                      llama.cpp write them; </s> is the vocabulary's EOS text)
//   plain   S\n\nUser: U1\nAssistant: A1\nUser: U2\nAssistant:   (for models without a
//           template; the reply follows "Assistant:" with its own leading space)
// Each message is formatted independently of later ones, which gives the prefix properties
// promised in chat_template.h.
#include "chat_template.h"

#include <algorithm>
#include <array>
#include <ctime>

#include "common.h"
#include "reasoning.h"
#include "text_input.h"

namespace kvrun {

namespace {

struct NamedKind {
    std::string_view name;
    ChatTemplateKind kind;
};

// Canonical names first (chat_template_name reads this table), then aliases.
constexpr std::array<NamedKind, 20> kNames = {{
    {"llama2", ChatTemplateKind::Llama2},
    {"llama3", ChatTemplateKind::Llama3},
    {"chatml", ChatTemplateKind::ChatML},
    {"mistral", ChatTemplateKind::Mistral},
    {"zephyr", ChatTemplateKind::Zephyr},
    {"phi3", ChatTemplateKind::Phi3},
    {"phi4", ChatTemplateKind::Phi4},
    {"gemma", ChatTemplateKind::Gemma},
    {"granite", ChatTemplateKind::Granite},
    {"deepseek3", ChatTemplateKind::DeepSeek3},
    {"deepseek2", ChatTemplateKind::DeepSeek2},
    {"mistral-v3", ChatTemplateKind::MistralV3},
    {"mistral-v3-tekken", ChatTemplateKind::MistralV3Tekken},
    {"mistral-v7", ChatTemplateKind::MistralV7},
    {"mistral-v7-tekken", ChatTemplateKind::MistralV7Tekken},
    {"plain", ChatTemplateKind::Plain},
    {"llama-2", ChatTemplateKind::Llama2},
    {"llama-3", ChatTemplateKind::Llama3},
    {"phi-3", ChatTemplateKind::Phi3},
    {"phi-4", ChatTemplateKind::Phi4},
}};
constexpr size_t kCanonicalNames = 16;

std::string_view trim(std::string_view s) {
    constexpr std::string_view ws = " \t\n\r\v\f";
    size_t b = s.find_first_not_of(ws);
    if (b == std::string_view::npos) return {};
    size_t e = s.find_last_not_of(ws);
    return s.substr(b, e - b + 1);
}

enum class Role { System, User, Assistant };

Role parse_role(const ChatMessage& m, size_t index) {
    if (m.role == "system") return Role::System;
    if (m.role == "user") return Role::User;
    if (m.role == "assistant") return Role::Assistant;
    fail("chat message {}: unknown role '{}' (expected system, user or assistant)", index, m.role);
}

// Formats for which a system message is folded into the first user turn: the leading system
// text waits in `pending_system` until that turn, and later system messages act as users.
bool folds_system(ChatTemplateKind kind) {
    return kind == ChatTemplateKind::Llama2 || kind == ChatTemplateKind::Mistral ||
           kind == ChatTemplateKind::Gemma || kind == ChatTemplateKind::MistralV3 ||
           kind == ChatTemplateKind::MistralV3Tekken;
}

// DeepSeek's turn markers: fullwidth vertical bars (U+FF5C) and U+2581 for the spaces.
constexpr std::string_view kDeepSeekUser = "<\uFF5CUser\uFF5C>";
constexpr std::string_view kDeepSeekAssistant = "<\uFF5CAssistant\uFF5C>";
constexpr std::string_view kDeepSeekEnd = "<\uFF5Cend\u2581of\u2581sentence\uFF5C>";

// Appends one user turn of a folding format; `system` is the pending system text or null.
void append_folded_user(ChatTemplateKind kind, std::string& out, std::string_view content,
                        const std::string* system, const ChatSpecialTexts& special) {
    switch (kind) {
        case ChatTemplateKind::Llama2: {
            std::string text;
            if (system) text = "<<SYS>>\n" + *system + "\n<</SYS>>\n\n";
            text += content;
            if (!out.empty()) out += special.bos;  // the first BOS comes from the tokenizer
            out += "[INST] ";
            out += trim(text);
            out += " [/INST]";
            break;
        }
        case ChatTemplateKind::Mistral:
            out += "[INST] ";
            if (system) out += *system + "\n\n";
            out += content;
            out += " [/INST]";
            break;
        case ChatTemplateKind::MistralV3:
        case ChatTemplateKind::MistralV3Tekken:
            out += kind == ChatTemplateKind::MistralV3 ? "[INST] " : "[INST]";
            if (system) out += *system + "\n\n";
            out += content;
            out += "[/INST]";
            break;
        default:  // Gemma
            out += "<start_of_turn>user\n";
            if (system) out += *system + "\n\n";
            out += trim(content);
            out += "<end_of_turn>\n";
            break;
    }
}

// Appends one message of a format whose turns all look alike: header, content, suffix.
void append_uniform(ChatTemplateKind kind, std::string& out, Role role, const ChatMessage& m,
                    const ChatSpecialTexts& special) {
    switch (kind) {
        case ChatTemplateKind::Llama3:
            out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n";
            out += trim(m.content);
            out += "<|eot_id|>";
            break;
        case ChatTemplateKind::ChatML:
            out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
            break;
        case ChatTemplateKind::Zephyr:
            out += "<|" + m.role + "|>\n" + m.content + special.eos + "\n";
            break;
        case ChatTemplateKind::Phi3:
            out += "<|" + m.role + "|>\n" + m.content + "<|end|>\n";
            break;
        case ChatTemplateKind::Phi4:
            out += "<|im_start|>" + m.role + "<|im_sep|>" + m.content + "<|im_end|>";
            break;
        case ChatTemplateKind::Granite:
            out +=
                "<|start_of_role|>" + m.role + "<|end_of_role|>" + m.content + "<|end_of_text|>\n";
            break;
        case ChatTemplateKind::DeepSeek3:
            if (role == Role::System) out += m.content + "\n\n";
            if (role == Role::User) (out += kDeepSeekUser) += m.content;
            if (role == Role::Assistant) ((out += kDeepSeekAssistant) += m.content) += kDeepSeekEnd;
            break;
        case ChatTemplateKind::DeepSeek2:
            if (role == Role::System) out += m.content + "\n\n";
            if (role == Role::User) out += "User: " + m.content + "\n\n";
            if (role == Role::Assistant) ((out += "Assistant: ") += m.content) += kDeepSeekEnd;
            break;
        case ChatTemplateKind::MistralV7:
        case ChatTemplateKind::MistralV7Tekken: {
            const std::string_view space = kind == ChatTemplateKind::MistralV7 ? " " : "";
            if (role == Role::System)
                ((out += "[SYSTEM_PROMPT]") += space) += m.content + "[/SYSTEM_PROMPT]";
            if (role == Role::User) ((out += "[INST]") += space) += m.content + "[/INST]";
            if (role == Role::Assistant) (out += space) += m.content + special.eos;
            break;
        }
        default:  // Plain
            if (role == Role::System) out += m.content + "\n\n";
            if (role == Role::User) out += "User: " + m.content + "\n";
            if (role == Role::Assistant) out += "Assistant: " + m.content + "\n";
            break;
    }
}

// The assistant header that add_generation_prompt appends.
std::string_view generation_prompt(ChatTemplateKind kind) {
    switch (kind) {
        case ChatTemplateKind::Llama2:
        case ChatTemplateKind::Mistral:
        case ChatTemplateKind::MistralV3:
        case ChatTemplateKind::MistralV3Tekken:
        case ChatTemplateKind::MistralV7:
        case ChatTemplateKind::MistralV7Tekken:
            return "";  // "[/INST]" already asks for the reply
        case ChatTemplateKind::DeepSeek3:
            return kDeepSeekAssistant;
        case ChatTemplateKind::Llama3:
            return "<|start_header_id|>assistant<|end_header_id|>\n\n";
        case ChatTemplateKind::ChatML:
            return "<|im_start|>assistant\n";
        case ChatTemplateKind::Zephyr:
        case ChatTemplateKind::Phi3:
            return "<|assistant|>\n";
        case ChatTemplateKind::Phi4:
            return "<|im_start|>assistant<|im_sep|>";
        case ChatTemplateKind::Gemma:
            return "<start_of_turn>model\n";
        case ChatTemplateKind::Granite:
            return "<|start_of_role|>assistant<|end_of_role|>";
        case ChatTemplateKind::Plain:
        case ChatTemplateKind::DeepSeek2:
            return "Assistant:";
    }
    return "";
}

}  // namespace

ChatTemplateKind chat_template_detect(std::string_view src) {
    if (contains(src, "<|im_sep|>")) return ChatTemplateKind::Phi4;  // before ChatML's test
    if (contains(src, "<|im_start|>")) return ChatTemplateKind::ChatML;
    if (contains(src, "<|start_header_id|>")) return ChatTemplateKind::Llama3;
    if (contains(src, "<start_of_turn>")) return ChatTemplateKind::Gemma;
    if (contains(src, "<|start_of_role|>")) return ChatTemplateKind::Granite;
    if (contains(src, kDeepSeekUser) && contains(src, kDeepSeekAssistant))
        return ChatTemplateKind::DeepSeek3;
    if (contains(src, "'Assistant: ' + message['content'] + eos_token"))
        return ChatTemplateKind::DeepSeek2;
    // Mistral's tokenizer versions: v7 has a system prompt block, v3 tool calls; the
    // Tekken ones (Nemo, Small 3) write their markers without spaces.
    if (contains(src, "[SYSTEM_PROMPT]"))
        return contains(src, "[SYSTEM_PROMPT] ") ? ChatTemplateKind::MistralV7
                                                 : ChatTemplateKind::MistralV7Tekken;
    if (contains(src, "[INST]") && contains(src, "[AVAILABLE_TOOLS]"))
        return contains(src, "\"[INST]\"") ? ChatTemplateKind::MistralV3Tekken
                                           : ChatTemplateKind::MistralV3;
    // Zephyr/Phi-3 templates may build "<|user|>" from the role, but all of them write the
    // "<|assistant|>" generation prompt literally.
    if (contains(src, "<|user|>") || contains(src, "<|assistant|>")) {
        return contains(src, "<|end|>") ? ChatTemplateKind::Phi3 : ChatTemplateKind::Zephyr;
    }
    if (contains(src, "[INST]")) {
        return contains(src, "<<SYS>>") ? ChatTemplateKind::Llama2 : ChatTemplateKind::Mistral;
    }
    return ChatTemplateKind::Plain;
}

std::string chat_template_source(const GgufFile& file) {
    const GgufValue* v = file.find("tokenizer.chat_template");
    return v && std::holds_alternative<std::string>(v->data) ? v->as_string() : "";
}

ChatTemplateKind chat_template_of(const GgufFile& file) {
    const std::string source = chat_template_source(file);
    return source.empty() ? ChatTemplateKind::Plain : chat_template_detect(source);
}

ChatTemplateKind chat_template_from_name(std::string_view name) {
    std::string lower(name);
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) {
        return static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    });
    for (const auto& n : kNames) {
        if (n.name == lower) return n.kind;
    }
    std::string valid;
    for (size_t i = 0; i < kCanonicalNames; ++i) {
        if (i) valid += ", ";
        valid += kNames[i].name;
    }
    throw Error(fmt::format("unknown chat template '{}' (valid: {})", name, valid),
                "pass --chat-template with one of: " + valid);
}

std::string chat_template_name(ChatTemplateKind kind) {
    for (size_t i = 0; i < kCanonicalNames; ++i) {
        if (kNames[i].kind == kind) return std::string(kNames[i].name);
    }
    return "plain";
}

std::string chat_template_apply(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt, const ChatSpecialTexts& special) {
    std::string out;
    std::string pending_system;  // folding formats: leading system text not yet written
    bool has_pending_system = false;
    for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        Role role = parse_role(m, i);
        if (!folds_system(kind)) {
            append_uniform(kind, out, role, m, special);
            continue;
        }
        if (role == Role::System && i == 0) {
            pending_system = m.content;
            has_pending_system = true;
        } else if (role == Role::Assistant) {
            if (kind == ChatTemplateKind::Llama2) {
                out += " ";
                out += trim(m.content);
                out += " " + special.eos;
            } else if (kind == ChatTemplateKind::Mistral ||
                       kind == ChatTemplateKind::MistralV3Tekken) {
                out += m.content + special.eos;
            } else if (kind == ChatTemplateKind::MistralV3) {
                out += " ";
                out += trim(m.content);
                out += special.eos;
            } else {
                out += "<start_of_turn>model\n";
                out += trim(m.content);
                out += "<end_of_turn>\n";
            }
        } else {  // user, or a later system message formatted as a user turn
            append_folded_user(kind, out, m.content, has_pending_system ? &pending_system : nullptr,
                               special);
            has_pending_system = false;
        }
    }
    if (add_generation_prompt) out += generation_prompt(kind);
    return out;
}

std::string chat_template_apply_delta(ChatTemplateKind kind,
                                      const std::vector<ChatMessage>& history,
                                      const ChatMessage& new_message,
                                      const ChatSpecialTexts& special) {
    std::vector<ChatMessage> extended = history;
    extended.push_back(new_message);
    std::string full = chat_template_apply(kind, extended, true, special);
    std::string prefix = chat_template_apply(kind, history, false, special);
    if (full.compare(0, prefix.size(), prefix) != 0) {
        fail("chat template {}: the formatted conversation does not extend its history",
             chat_template_name(kind));
    }
    return full.substr(prefix.size());
}

std::string chat_template_assistant_suffix(ChatTemplateKind kind, const ChatSpecialTexts& special) {
    switch (kind) {
        case ChatTemplateKind::Llama2:
            return " " + special.eos;
        case ChatTemplateKind::Mistral:
        case ChatTemplateKind::MistralV3:
        case ChatTemplateKind::MistralV3Tekken:
        case ChatTemplateKind::MistralV7:
        case ChatTemplateKind::MistralV7Tekken:
            return special.eos;
        case ChatTemplateKind::DeepSeek3:
        case ChatTemplateKind::DeepSeek2:
            return std::string(kDeepSeekEnd);
        case ChatTemplateKind::Llama3:
            return "<|eot_id|>";
        case ChatTemplateKind::ChatML:
            return "<|im_end|>\n";
        case ChatTemplateKind::Zephyr:
            return special.eos + "\n";
        case ChatTemplateKind::Phi3:
            return "<|end|>\n";
        case ChatTemplateKind::Phi4:
            return "<|im_end|>";
        case ChatTemplateKind::Gemma:
            return "<end_of_turn>\n";
        case ChatTemplateKind::Granite:
            return "<|end_of_text|>\n";
        case ChatTemplateKind::Plain:
            return "\n";
    }
    return "";
}

std::vector<std::string> chat_template_stop_strings(ChatTemplateKind kind) {
    switch (kind) {
        case ChatTemplateKind::Llama2:
        case ChatTemplateKind::Mistral:
        case ChatTemplateKind::MistralV3:
        case ChatTemplateKind::MistralV3Tekken:
        case ChatTemplateKind::MistralV7:
        case ChatTemplateKind::MistralV7Tekken:
            return {"</s>"};
        case ChatTemplateKind::DeepSeek3:
            return {std::string(kDeepSeekEnd)};
        case ChatTemplateKind::DeepSeek2:  // (its EOS, and a turn the model writes itself)
            return {std::string(kDeepSeekEnd), "\n\nUser:"};
        case ChatTemplateKind::Llama3:
            return {"<|eot_id|>", "<|end_of_text|>"};
        case ChatTemplateKind::ChatML:
        case ChatTemplateKind::Phi4:
            return {"<|im_end|>", "<|endoftext|>"};
        case ChatTemplateKind::Zephyr:
            return {"</s>", "<|user|>"};
        case ChatTemplateKind::Phi3:
            return {"<|end|>", "<|endoftext|>"};
        case ChatTemplateKind::Gemma:
            return {"<end_of_turn>", "<eos>"};
        case ChatTemplateKind::Granite:
            return {"<|end_of_text|>"};
        case ChatTemplateKind::Plain:
            return {"\nUser:"};
    }
    return {};
}

std::string chat_template_apply_jinja(const JinjaTemplate& tmpl,
                                      const std::vector<ChatMessage>& messages,
                                      bool add_generation_prompt, const ChatSpecialTexts& special) {
    return chat_template_apply_jinja(tmpl, chat_messages_json(messages), nullptr,
                                     add_generation_prompt, special);
}

nlohmann::ordered_json chat_messages_json(const std::vector<ChatMessage>& messages) {
    nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
    for (const ChatMessage& m : messages)
        msgs.push_back({{"role", m.role}, {"content", m.content}});
    return msgs;
}

std::string chat_template_apply_jinja(const JinjaTemplate& tmpl,
                                      const nlohmann::ordered_json& messages,
                                      const nlohmann::ordered_json& tools,
                                      bool add_generation_prompt, const ChatSpecialTexts& special,
                                      const nlohmann::ordered_json& kwargs) {
    nlohmann::ordered_json context = {
        {"messages", messages},     {"add_generation_prompt", add_generation_prompt},
        {"bos_token", special.bos}, {"eos_token", special.eos},
        {"tools", tools},           {"documents", nullptr}};
    if (!kwargs.is_null()) {
        if (!kwargs.is_object())
            fail("chat template kwargs must be a JSON object of variables (got {})", kwargs.dump());
        for (const auto& [key, value] : kwargs.items()) {
            if (key == "messages" || key == "tools" || key == "add_generation_prompt")
                fail("chat template kwargs cannot set '{}'", key);
            context[key] = value;
        }
    }
    // FireFunction v2's template writes its caller's "functions" (the tools as JSON text, ""
    // without) and "datetime" into every system prompt, as llama.cpp gives them.
    if (tmpl.source().find("functools[") != std::string::npos) {
        if (!context.contains("functions"))
            context["functions"] = tools.is_null() || tools.empty() ? "" : jinja_tojson(tools, 2);
        if (!context.contains("datetime")) {
            const std::time_t now = std::time(nullptr);
            std::tm utc{};
            gmtime_r(&now, &utc);
            char buf[64];
            std::strftime(buf, sizeof buf, "%b %d %Y %H:%M:%S GMT", &utc);
            context["datetime"] = buf;
        }
    }
    // A chat template takes a few steps per message; a model file's template that runs
    // away stops well before the interpreter's default bound (seconds per request).
    JinjaTemplate::Limits limits;
    limits.max_steps = 2'000'000;
    std::string text = tmpl.render(context, limits);
    if (!special.bos.empty() && text.rfind(special.bos, 0) == 0) text.erase(0, special.bos.size());
    return text;
}

std::string chat_template_render(ChatTemplateKind kind, const JinjaTemplate* jinja,
                                 const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt, const ChatSpecialTexts& special,
                                 const nlohmann::ordered_json& kwargs) {
    return jinja ? chat_template_apply_jinja(*jinja, chat_messages_json(messages), nullptr,
                                             add_generation_prompt, special, kwargs)
                 : chat_template_apply(kind, messages, add_generation_prompt, special);
}

std::string ChatTemplateChoice::name() const {
    return jinja ? "jinja" : chat_template_name(kind);
}

namespace {

ChatTemplateChoice choose(const GgufFile& file, const std::string& name,
                          const std::string& template_file, bool use_jinja) {
    ChatTemplateChoice c;
    if (!name.empty() && !template_file.empty())
        fail("give --chat-template or --chat-template-file, not both");
    if (!name.empty()) {
        c.kind = chat_template_from_name(name);
        return c;
    }
    const std::string model_source = chat_template_source(file);
    auto parse = [&](const std::string& source, const std::string& where) {
        try {
            c.jinja = std::make_shared<const JinjaTemplate>(JinjaTemplate::parse(source));
        } catch (const Error& e) {
            throw Error(fmt::format("{}: the chat template does not parse: {}", where, e.what()),
                        "give a built-in format with --chat-template NAME");
        }
        c.kind = chat_template_detect(source);
    };
    if (!template_file.empty()) {
        parse(read_file_text(template_file), template_file);
        return c;
    }
    if (use_jinja) {
        if (model_source.empty())
            throw Error("--jinja: the model has no chat template (tokenizer.chat_template)",
                        "give one with --chat-template-file FILE");
        parse(model_source, file.path());
        return c;
    }
    c.kind = chat_template_detect(model_source);
    if (c.kind != ChatTemplateKind::Plain || model_source.empty()) return c;
    try {
        parse(model_source, file.path());
        c.note =
            "the model's chat template is not a built-in format: rendering it with the Jinja "
            "interpreter (--chat-template NAME picks a built-in one)";
    } catch (const Error& e) {
        c.note = fmt::format("{}; using the plain format", e.what());
    }
    return c;
}

}  // namespace

ChatTemplateChoice chat_template_choose(const GgufFile& file, const std::string& name,
                                        const std::string& template_file, bool use_jinja) {
    ChatTemplateChoice c = choose(file, name, template_file, use_jinja);
    // A built-in format standing in for the model's template thinks when that template does.
    c.thinks = chat_template_thinks(c.kind, c.jinja        ? c.jinja->source()
                                            : name.empty() ? chat_template_source(file)
                                                           : std::string());
    return c;
}

}  // namespace kvrun
