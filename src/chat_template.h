// Chat templates: turn a conversation (system/user/assistant messages) into the prompt text
// that a chat-tuned model was trained on, detect the format from a GGUF file's
// `tokenizer.chat_template` (Jinja source), and name the stop strings of each format.
//
// BOS: the formatted text never starts with the BOS token's text. Tokenize it with
// add_bos = tokenizer.add_bos() and parse_special = true, so the tokenizer adds the one
// leading BOS itself. Templates that repeat BOS/EOS *between* turns (Llama-2 writes
// "</s><s>[INST] ...") do include those texts; they become tokens through parse_special.
//
// Incremental chat: for every format, with h any conversation and m any message,
//   apply(h, false) is a prefix of apply(h + [m], add_generation_prompt)      (extension)
//   apply(h, true) is a prefix of apply(h + [assistant reply], false)         (reply fits)
// so the engine only prefills the new text. After the model stops (its end-of-turn token
// sampled but not yet fed), the text to prefill for the next user message `u` is
//   chat_template_assistant_suffix(kind) + chat_template_apply_delta(kind, h, u)
// where h already holds the assistant's reply.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gguf.h"
#include "jinja.h"

namespace kvrun {

struct ChatMessage {
    std::string role;  // "system", "user" or "assistant"
    std::string content;
    bool operator==(const ChatMessage&) const = default;
};

enum class ChatTemplateKind {
    Llama2,
    Llama3,
    ChatML,
    Mistral,
    Zephyr,
    Phi3,
    Phi4,
    Gemma,
    Granite,
    DeepSeek3,
    DeepSeek2,
    MistralV3,
    MistralV3Tekken,
    MistralV7,
    MistralV7Tekken,
    Plain
};

// The BOS/EOS texts of the vocabulary, for formats that write them between turns
// (Llama-2, Mistral and Zephyr use eos; Llama-2 also bos). Pass tok.token_text(tok.eos())
// etc. when the vocabulary's texts differ from the defaults.
struct ChatSpecialTexts {
    std::string bos = "<s>";
    std::string eos = "</s>";
};

// Guesses the format from a Jinja chat template: "<|im_sep|>" → Phi4, "<|im_start|>" → ChatML,
// "<|start_header_id|>" → Llama3, "<start_of_turn>" → Gemma, "<|start_of_role|>" → Granite,
// "<｜User｜>" with "<｜Assistant｜>" → DeepSeek3 (DeepSeek V3/R1 and the R1 distills),
// "'Assistant: ' + message['content'] + eos_token" → DeepSeek2 (DeepSeek V2 / V2-Lite chat),
// "<|user|>" or "<|assistant|>" with "<|end|>" → Phi3, without → Zephyr; "[SYSTEM_PROMPT]" →
// MistralV7 ("[SYSTEM_PROMPT] " with its space) or MistralV7Tekken; "[AVAILABLE_TOOLS]" →
// MistralV3Tekken (a "\"[INST]\"" literal: Mistral Nemo) or MistralV3; "[INST]" with
// "<<SYS>>" → Llama2, other "[INST]" → Mistral; empty or unrecognized → Plain.
ChatTemplateKind chat_template_detect(std::string_view jinja_source);
// A model file's tokenizer.chat_template ("" without one).
std::string chat_template_source(const GgufFile& file);
// chat_template_detect on a model file's tokenizer.chat_template (Plain without one).
ChatTemplateKind chat_template_of(const GgufFile& file);

// "llama2" (or "llama-2"), "llama3" ("llama-3"), "chatml", "mistral", "zephyr", "phi3"
// ("phi-3"), "phi4" ("phi-4"), "gemma", "granite", "deepseek3", "deepseek2", "mistral-v3",
// "mistral-v3-tekken", "mistral-v7", "mistral-v7-tekken", "plain" (llama.cpp's names);
// case-insensitive. Throws Error listing the valid names.
ChatTemplateKind chat_template_from_name(std::string_view name);

// The canonical name ("llama2", "llama3", ...), accepted by chat_template_from_name.
std::string chat_template_name(ChatTemplateKind kind);

// Formats the conversation (see the formats in chat_template.cpp). A leading system message
// is native in Llama3, ChatML, Zephyr, Phi3, Phi4, Granite, DeepSeek3, MistralV7(Tekken) and
// Plain; Llama-2 wraps it in <<SYS>> inside the first [INST]; Mistral, MistralV3(Tekken) and
// Gemma prepend it (plus "\n\n") to the first user message. In those folding formats a system
// message that is not the first is formatted as a user turn.
// add_generation_prompt appends the assistant header the model continues from. Throws Error
// for a role other than system/user/assistant.
std::string chat_template_apply(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt, const ChatSpecialTexts& special = {});

// apply(history + [new_message], true) minus its prefix apply(history, false): the text to
// prefill for a new message when the KV cache already holds apply(history, false).
std::string chat_template_apply_delta(ChatTemplateKind kind,
                                      const std::vector<ChatMessage>& history,
                                      const ChatMessage& new_message,
                                      const ChatSpecialTexts& special = {});

// The text a format writes right after an assistant reply's content to close the turn
// (e.g. "<|im_end|>\n", "<|eot_id|>", " </s>"): what the KV cache still lacks when the
// model stopped on its end-of-turn token without feeding it.
std::string chat_template_assistant_suffix(ChatTemplateKind kind,
                                           const ChatSpecialTexts& special = {});

// Texts that end an assistant reply: end-of-turn token texts (map a text to its token id
// when it is one special token of the vocabulary, and stop on that id) or, for Plain, text
// to look for in the decoded output (cut the reply before it).
std::vector<std::string> chat_template_stop_strings(ChatTemplateKind kind);

// ---- Jinja: a model's own template, rendered by the interpreter (jinja.h) ----

// chat_template_apply through a Jinja chat template, with Hugging Face's variables: messages
// ([{"role", "content"}]), add_generation_prompt, bos_token, eos_token, tools (none). A BOS
// text the template writes first is dropped (the tokenizer adds BOS; see the top). Throws
// Error for what the template raises.
std::string chat_template_apply_jinja(const JinjaTemplate& tmpl,
                                      const std::vector<ChatMessage>& messages,
                                      bool add_generation_prompt,
                                      const ChatSpecialTexts& special = {});
// The same with the template's `messages` and `tools` given as JSON (OpenAI's shapes: tool
// calls and tool results in the conversation, the functions a model may call; tools null for
// none), and more variables for the template in `kwargs` (an object or null; llama.cpp's
// chat_template_kwargs, e.g. {"enable_thinking": false}). Throws Error for kwargs that are
// not an object or that set messages, tools or add_generation_prompt.
std::string chat_template_apply_jinja(const JinjaTemplate& tmpl,
                                      const nlohmann::ordered_json& messages,
                                      const nlohmann::ordered_json& tools,
                                      bool add_generation_prompt,
                                      const ChatSpecialTexts& special = {},
                                      const nlohmann::ordered_json& kwargs = nullptr);
// Messages as the template's `messages` ([{"role", "content"}]).
nlohmann::ordered_json chat_messages_json(const std::vector<ChatMessage>& messages);

// The conversation in a built-in format (`jinja` null) or through a Jinja template: the one
// place that chooses between chat_template_apply and chat_template_apply_jinja. `kwargs`:
// more variables for a Jinja template (a built-in format has none to take).
std::string chat_template_render(ChatTemplateKind kind, const JinjaTemplate* jinja,
                                 const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt, const ChatSpecialTexts& special = {},
                                 const nlohmann::ordered_json& kwargs = nullptr);

// The format a command uses, from its options (in this order): --chat-template NAME (a
// built-in format), --chat-template-file FILE (that Jinja template), --jinja (the model's
// tokenizer.chat_template through the interpreter), else the built-in format detected from
// the model's template, or, when the model has a template that detection does not know,
// that template through the interpreter (`note` then says so). kind is the detected
// built-in format also with Jinja (its end-of-turn texts still stop replies). Throws Error
// for an unknown name, an unreadable file, a template that does not parse, or --jinja on a
// model without a template.
struct ChatTemplateChoice {
    ChatTemplateKind kind = ChatTemplateKind::Plain;
    std::shared_ptr<const JinjaTemplate> jinja;  // null: the built-in `kind`
    std::string note;                            // for stderr, or ""
    // Replies may start with <think> reasoning (chat_template_thinks: of the Jinja template,
    // or of the model's own when a built-in format renders its chats).
    bool thinks = false;
    std::string name() const;  // "jinja" or chat_template_name(kind)
};
ChatTemplateChoice chat_template_choose(const GgufFile& file, const std::string& name,
                                        const std::string& template_file, bool use_jinja);

}  // namespace kvrun
