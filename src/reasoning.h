// Reasoning ("thinking") text: models such as DeepSeek R1 (and its distills), Qwen 3 and QwQ
// write their reasoning between <think> and </think> before the answer. The server returns it
// apart, as llama.cpp's --reasoning-format deepseek does: the message's "reasoning_content"
// holds the reasoning and "content" only the answer (streams send "reasoning_content" deltas
// first). A chat template may open the block itself (its generation prompt ends with
// "<think>\n"): the reply then starts inside it.
#pragma once

#include <string>
#include <string_view>

#include "chat_template.h"

namespace kvrun {

// Whether the chat format writes reasoning blocks: the built-in DeepSeek3 format, or a
// Jinja template that mentions "<think>".
bool chat_template_thinks(ChatTemplateKind kind, const JinjaTemplate* jinja);

// Whether a prompt leaves a reasoning block open (ends with "<think>" and white space).
bool prompt_opens_reasoning(std::string_view prompt);

// A reply split into its reasoning and its answer. `opened`: the prompt opened the block.
// Without it, a reply whose first non-blank text is "<think>" starts one; any other reply
// is all answer. The reasoning runs to "</think>" (all of the rest when the block is not
// closed); white space around each part is dropped.
struct ReasoningSplit {
    std::string reasoning;
    std::string content;
};
ReasoningSplit reasoning_split(std::string_view reply, bool opened);

// The same for a reply still being generated: what a stream may show of each part, always
// a prefix of what reasoning_split gives once the reply is whole. Text that may yet become
// a tag ("<thi", "</thin") and white space at the end wait.
ReasoningSplit reasoning_stream(std::string_view reply, bool opened);

}  // namespace kvrun
