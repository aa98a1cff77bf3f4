// A model's chat format as the commands use it, in one value: how a conversation is written
// (a built-in format or a Jinja template), the vocabulary's BOS/EOS texts that formats write
// between turns, and the end-of-turn tokens and texts that end a reply.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chat_template.h"
#include "tokenizer.h"

namespace kvrun {

// The vocabulary's BOS/EOS texts for the formats that write them.
ChatSpecialTexts chat_special_texts(const Tokenizer& tok);

// What ends an assistant reply in a format: its end-of-turn texts that are one token of the
// vocabulary stop on that id; the others are looked for in the decoded text.
struct ChatStops {
    std::vector<TokenId> tokens;
    std::vector<std::string> strings;
};
ChatStops chat_stops(ChatTemplateKind kind, const Tokenizer& tok);

// The format of a model's chats. Build it with chat_format_make: the special texts and stops
// come from the vocabulary.
struct ChatFormat {
    // The built-in format; with a Jinja template it only names the end-of-turn texts.
    ChatTemplateKind kind = ChatTemplateKind::Plain;
    std::shared_ptr<const JinjaTemplate> jinja;  // set: conversations are rendered by it
    // The server's requests with tools when a built-in format renders the rest: the model's
    // own template, where it writes a tool syntax the model was trained on (server_tools.h).
    std::shared_ptr<const JinjaTemplate> tools_jinja;
    // The template requests with tools are rendered by (jinja, else tools_jinja), or null.
    const JinjaTemplate* tools_template() const { return jinja ? jinja.get() : tools_jinja.get(); }
    ChatSpecialTexts special;
    ChatStops stops;      // the format's end-of-turn tokens and texts
    bool thinks = false;  // replies may start with <think> reasoning (reasoning.h)
    // The conversation in this format (chat_template_render); add_generation_prompt appends
    // the reply header. `kwargs`: more variables for a Jinja template (an object or null).
    std::string render(const std::vector<ChatMessage>& msgs, bool add_generation_prompt,
                       const nlohmann::ordered_json& kwargs = nullptr) const;
};

// The format chat_template_choose picked, with the special texts and stops of `tok`.
ChatFormat chat_format_make(const ChatTemplateChoice& choice, const Tokenizer& tok);

}  // namespace kvrun
