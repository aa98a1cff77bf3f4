// Reasoning ("thinking") text: models such as DeepSeek R1 (and its distills), Qwen 3 and QwQ
// write their reasoning between <think> and </think> before the answer. The server returns it
// apart, as llama.cpp's --reasoning-format deepseek does: the message's "reasoning_content"
// holds the reasoning and "content" only the answer (streams send "reasoning_content" deltas
// first). A chat template may open the block itself (its generation prompt ends with
// "<think>\n"): the reply then starts inside it.
//
// gpt-oss writes OpenAI's harmony format instead: a reply is a sequence of messages, each
// "<|channel|>NAME[ to=RECIPIENT][ <|constrain|>TYPE]<|message|>TEXT" ended by "<|end|>" (the
// next one starting "<|start|>assistant"), and the last ended by the end of generation
// (<|return|>, <|call|>). Channel "analysis" is the reasoning, "final" the answer, and
// "commentary" either text for the user or, with a recipient "functions.NAME", a tool call
// whose text is its arguments. reasoning_split and reasoning_stream read a reply that starts
// with "<|channel|>" or "<|start|>" this way.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "chat_template.h"
#include "engine.h"
#include "tokenizer.h"

namespace kvrun {

// A reasoning block's tags: "<think>" and "</think>", or Magistral's "[THINK]" and "[/THINK]"
// (Mistral's reasoning models, where they are control tokens). Replies are read with either.
struct ReasoningTags {
    std::string_view open, close;
};
// The tags a model of this vocabulary writes: Magistral's when "[THINK]" and "[/THINK]" are
// tokens of it and "<think>" is not one.
ReasoningTags reasoning_tags(const Tokenizer& tok);

// Whether a chat format writes reasoning blocks: the built-in DeepSeek3 format, or a template
// (`source`: the Jinja template that renders the chats, or the model's own template that a
// built-in format stands in for, as ChatML does for Qwen 3) that mentions "<think>",
// "[THINK]" or harmony's "<|channel|>analysis".
bool chat_template_thinks(ChatTemplateKind kind, std::string_view source);

// Whether a prompt leaves a reasoning block open (ends with "<think>" or "[THINK]" and white
// space).
bool prompt_opens_reasoning(std::string_view prompt);
// Whether a prompt ends with an empty reasoning block the template wrote to switch thinking
// off ("<think></think>" and white space, as GLM 4.5 and Qwen 3 do with enable_thinking
// false), or with an end tag that closes no block (DeepSeek V3.1's "<｜Assistant｜></think>"):
// the reply then does not think.
bool prompt_closes_reasoning(std::string_view prompt);

// One harmony message of a reply: its channel ("analysis", "final", "commentary"), recipient
// ("functions.get_weather", or empty), content type ("json", or empty) and text; `closed`:
// its end tag (or the next message) follows, so the text is whole.
struct HarmonyMessage {
    std::string channel, recipient, content_type, text;
    bool closed = false;
};
// Whether a reply is in the harmony format: it starts with "<|channel|>" or "<|start|>" after
// white space, or with " to=" (a recipient right after the prompt's "<|start|>assistant") and
// holds "<|message|>".
bool harmony_reply(std::string_view reply);
// The reply's messages in order; a message whose header is not whole yet is left out.
// Harmony's reasoning is the analysis messages' text, its answer the final and the
// commentary messages' without a recipient (joined by blank lines).
std::vector<HarmonyMessage> harmony_messages(std::string_view reply);
// The answer of those messages (reasoning_split's content for a harmony reply).
std::string harmony_content(const std::vector<HarmonyMessage>& messages);

// A reply split into its reasoning and its answer. `opened`: the prompt opened the block.
// Without it, a reply whose first non-blank text is "<think>" (or "[THINK]") starts one; any
// other reply is all answer. The reasoning runs to "</think>" (or "[/THINK]"; in a block the
// prompt opened, the first of either), all of the rest when the block is not closed; white
// space around each part is dropped. An answer after the block that starts with "<response>"
// (Granite 3.3 thinking) loses that tag and "</response>" with what follows.
struct ReasoningSplit {
    std::string reasoning;
    std::string content;
};
ReasoningSplit reasoning_split(std::string_view reply, bool opened);

// The same for a reply still being generated: what a stream may show of each part, always
// a prefix of what reasoning_split gives once the reply is whole. Text that may yet become
// a tag ("<thi", "</thin") and white space at the end wait.
ReasoningSplit reasoning_stream(std::string_view reply, bool opened);

// llama.cpp's --reasoning-budget N and --reasoning-budget-message for one reply (the
// engine's ReasoningBudget): at most N tokens of reasoning (-1: no budget; 0: the block ends
// as soon as it opens), then `message` and the block's end tag are forced. A <think> block
// ends with "</think>" (`opened`: the prompt opened it), a [THINK] block with "[/THINK]"
// (reasoning_tags); with harmony's vocabulary (gpt-oss:
// "<|channel|>" is one token) the analysis message ends with "<|end|>" and the reply goes on
// in the final channel.
ReasoningBudget reasoning_budget_for(int32_t tokens, std::string_view message, bool opened,
                                     const Tokenizer& tok);

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
