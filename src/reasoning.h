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

// Whether a chat format writes reasoning blocks: the built-in DeepSeek3 format, or a template
// (`source`: the Jinja template that renders the chats, or the model's own template that a
// built-in format stands in for, as ChatML does for Qwen 3) that mentions "<think>".
bool chat_template_thinks(ChatTemplateKind kind, std::string_view source);

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

// A reply shown with its reasoning apart as it streams (kvrun chat on a terminal): the
// reasoning without its tags between `on` and `off` (e.g. ANSI dim and reset), then a blank
// line and the answer. add() takes the next piece of the reply and returns what to show now;
// finish() returns the rest once the reply is whole.
class ReasoningStyler {
  public:
    ReasoningStyler(bool opened, std::string on, std::string off)
        : opened_(opened), on_(std::move(on)), off_(std::move(off)) {}
    std::string add(std::string_view text);
    std::string finish();

  private:
    std::string show(const ReasoningSplit& v);
    bool opened_;
    std::string on_, off_, reply_;
    size_t reasoning_shown_ = 0, content_shown_ = 0;
    bool styled_ = false;  // `on` is in effect
};

}  // namespace kvrun
