// Reasoning blocks of replies (see reasoning.h).
#include "reasoning.h"

#include <algorithm>

#include "stop_text.h"
#include "unicode_text.h"

namespace kvrun {
namespace {

constexpr std::string_view kOpen = "<think>", kClose = "</think>";
// Magistral's tags (Mistral's reasoning models; control tokens of their vocabulary).
constexpr std::string_view kOpenMistral = "[THINK]", kCloseMistral = "[/THINK]";
constexpr ReasoningTags kTagPairs[] = {{kOpen, kClose}, {kOpenMistral, kCloseMistral}};
// Granite 3.3 with thinking on answers between these after its reasoning block.
constexpr std::string_view kResponse = "<response>", kResponseEnd = "</response>";
// Harmony's tags (gpt-oss).
constexpr std::string_view kStart = "<|start|>", kChannel = "<|channel|>", kMessage = "<|message|>",
                           kConstrain = "<|constrain|>", kRecipient = " to=";
const std::vector<std::string> kHarmonyEnds = {"<|end|>", "<|start|>", "<|call|>", "<|return|>"};

// The value after `key` in a message header ("to=functions.f <|constrain|>json"): up to white
// space or a tag.
std::string header_value(std::string_view header, std::string_view key) {
    const size_t at = header.find(key);
    if (at == std::string_view::npos) return {};
    const std::string_view rest = header.substr(at + key.size());
    return std::string(rest.substr(0, rest.find_first_of(" \t\n<")));
}

// Harmony's split of a reply (harmony_reply): the analysis text is the reasoning, the final
// and the commentary text without a recipient the answer; while streaming, an open message's
// text less what may become its end tag.
ReasoningSplit harmony_split(const std::vector<HarmonyMessage>& messages, bool streaming) {
    ReasoningSplit out;
    for (const HarmonyMessage& m : messages) {
        std::string_view text = m.text;
        if (!m.closed && streaming)
            text = text.substr(0, text.size() - stop_string_holdback(text, kHarmonyEnds));
        text = trim_space_right(trim_space_left(text));
        std::string* part = m.channel == "analysis" ? &out.reasoning
                            : m.recipient.empty()   ? &out.content
                                                    : nullptr;
        if (!part || text.empty()) continue;
        if (!part->empty()) *part += "\n\n";
        *part += text;
    }
    return out;
}

// s without an end that may still grow into `tag` (stop_string_holdback).
std::string_view hold_back(std::string_view s, std::string_view tag) {
    return s.substr(0, s.size() - stop_string_holdback(s, {std::string(tag)}));
}

// Where the reasoning begins in the reply (npos: there is none) and the tag that ends it, and
// whether the reply is still too short to tell. A block the prompt opened ends with the first
// end tag of either pair (the prompt's own tag is not seen here).
size_t reasoning_start(std::string_view reply, bool opened, bool& undecided,
                       std::string_view& close) {
    undecided = false;
    if (opened) {
        size_t first = std::string_view::npos;
        close = kClose;
        for (const ReasoningTags& t : kTagPairs)
            if (const size_t at = reply.find(t.close); at < first) first = at, close = t.close;
        return 0;
    }
    const std::string_view s = trim_space_left(reply);
    for (const ReasoningTags& t : kTagPairs) {
        if (s.starts_with(t.open)) {
            close = t.close;
            return reply.size() - s.size() + t.open.size();
        }
        undecided = undecided || (s.size() < t.open.size() && t.open.starts_with(s));
    }
    return std::string_view::npos;
}

// s without an end that may still grow into either end tag (a block the prompt opened).
std::string_view hold_back_closes(std::string_view s) {
    std::vector<std::string> tags;
    for (const ReasoningTags& t : kTagPairs) tags.emplace_back(t.close);
    return s.substr(0, s.size() - stop_string_holdback(s, tags));
}

// The answer after a closed reasoning block. Granite 3.3 wraps it in <response> tags (its
// template asks for them when thinking is on): they are dropped, with what follows
// </response>. While streaming, text that may yet become either tag waits.
std::string answer_after_reasoning(std::string_view after, bool streaming) {
    std::string_view s = trim_space_left(after);
    if (streaming && s.size() < kResponse.size() && kResponse.starts_with(s)) return {};
    if (!s.starts_with(kResponse)) return std::string(s);
    s = trim_space_left(s.substr(kResponse.size()));
    if (const size_t end = s.find(kResponseEnd); end != std::string_view::npos)
        return std::string(trim_space_right(s.substr(0, end)));
    return std::string(trim_space_right(streaming ? hold_back(s, kResponseEnd) : s));
}

ReasoningSplit split(std::string_view reply, bool opened, bool streaming) {
    if (harmony_reply(reply)) return harmony_split(harmony_messages(reply), streaming);
    ReasoningSplit out;
    const std::string_view head = trim_space_left(reply);
    if (streaming && !opened &&
        ((!head.empty() && (kChannel.starts_with(head) || kStart.starts_with(head))) ||
         kRecipient.starts_with(reply) || reply.starts_with(kRecipient)))
        return out;  // may yet become a harmony tag, or a recipient's header
    bool undecided = false;
    std::string_view close;
    const size_t start = reasoning_start(reply, opened, undecided, close);
    if (undecided && streaming) return out;
    if (start == std::string_view::npos) {
        out.content = reply;
        return out;
    }
    const std::string_view rest = reply.substr(start);
    const size_t end = rest.find(close);
    if (end == std::string_view::npos) {
        const std::string_view shown = !streaming ? rest
                                       : opened   ? hold_back_closes(rest)
                                                  : hold_back(rest, close);
        out.reasoning = trim_space_right(trim_space_left(shown));
        return out;
    }
    out.reasoning = trim_space_right(trim_space_left(rest.substr(0, end)));
    out.content = answer_after_reasoning(rest.substr(end + close.size()), streaming);
    return out;
}

}  // namespace

bool chat_template_thinks(ChatTemplateKind kind, std::string_view source) {
    return kind == ChatTemplateKind::DeepSeek3 || source.find(kOpen) != std::string_view::npos ||
           source.find(kOpenMistral) != std::string_view::npos ||
           source.find("<|channel|>analysis") != std::string_view::npos;
}

bool harmony_reply(std::string_view reply) {
    const std::string_view s = trim_space_left(reply);
    // (After the prompt's "<|start|>assistant" a reply may begin with its recipient.)
    return s.starts_with(kChannel) || s.starts_with(kStart) ||
           (reply.starts_with(kRecipient) && s.find(kMessage) != std::string_view::npos);
}

std::vector<HarmonyMessage> harmony_messages(std::string_view reply) {
    std::vector<HarmonyMessage> out;
    size_t pos = 0;
    while (pos < reply.size()) {
        // The header runs to <|message|>: "<|start|>assistant to=X<|channel|>commentary json"
        // or "<|channel|>commentary to=X <|constrain|>json" (the role part may be absent).
        const size_t body = reply.find(kMessage, pos);
        if (body == std::string_view::npos) break;  // a header still being written
        const std::string_view header = reply.substr(pos, body - pos);
        HarmonyMessage m;
        m.channel = header_value(header, kChannel);
        m.recipient = header_value(header, "to=");
        m.content_type = header_value(header, kConstrain);
        if (m.content_type.empty() && !m.channel.empty()) {  // "commentary json"
            const std::string_view after = header.substr(header.find(kChannel) + kChannel.size());
            const size_t sp = after.find_last_of(' ');
            if (sp != std::string_view::npos &&
                after.substr(sp + 1).find('=') == std::string_view::npos)
                m.content_type = std::string(after.substr(sp + 1));
        }
        // The text runs to the first end tag (or the next message's start).
        const size_t from = body + kMessage.size();
        size_t end = std::string_view::npos, tag = 0;
        for (const std::string& t : kHarmonyEnds)
            if (const size_t at = reply.find(t, from); at < end) end = at, tag = t.size();
        const bool closed = end != std::string_view::npos;
        m.closed = closed;
        m.text = std::string(reply.substr(from, closed ? end - from : std::string_view::npos));
        out.push_back(std::move(m));
        if (!closed) break;
        // "<|start|>" begins the next message's header; the other tags end this one.
        pos = reply.substr(end, kStart.size()) == kStart ? end : end + tag;
    }
    return out;
}

std::string harmony_content(const std::vector<HarmonyMessage>& messages) {
    return harmony_split(messages, false).content;
}

bool prompt_opens_reasoning(std::string_view prompt) {
    const std::string_view s = trim_space_right(prompt);
    return std::any_of(std::begin(kTagPairs), std::end(kTagPairs),
                       [&](const ReasoningTags& t) { return s.ends_with(t.open); });
}

bool prompt_closes_reasoning(std::string_view prompt) {
    const std::string_view s = trim_space_right(prompt);
    return std::any_of(std::begin(kTagPairs), std::end(kTagPairs), [&](const ReasoningTags& t) {
        if (!s.ends_with(t.close)) return false;
        const std::string_view before = s.substr(0, s.size() - t.close.size());
        if (trim_space_right(before).ends_with(t.open)) return true;  // an empty block
        // A close tag that closes no block (DeepSeek V3.1's "<｜Assistant｜></think>"): no
        // open tag of either pair since the last close.
        size_t open = std::string_view::npos, close = std::string_view::npos;
        for (const ReasoningTags& u : kTagPairs) {
            const size_t o = before.rfind(u.open), c = before.rfind(u.close);
            if (o != std::string_view::npos && (open == std::string_view::npos || o > open))
                open = o;
            if (c != std::string_view::npos && (close == std::string_view::npos || c > close))
                close = c;
        }
        return open == std::string_view::npos || (close != std::string_view::npos && close > open);
    });
}

ReasoningTags reasoning_tags(const Tokenizer& tok) {
    auto one_token = [&](std::string_view text) {
        return tok.encode(std::string(text), false, true).size() == 1;
    };
    if (one_token(kOpenMistral) && one_token(kCloseMistral) && !one_token(kOpen))
        return {kOpenMistral, kCloseMistral};
    return {kOpen, kClose};
}

ReasoningSplit reasoning_split(std::string_view reply, bool opened) {
    return split(reply, opened, false);
}

ReasoningSplit reasoning_stream(std::string_view reply, bool opened) {
    return split(reply, opened, true);
}

std::string ReasoningStyler::add(std::string_view text) {
    reply_ += text;
    return show(reasoning_stream(reply_, opened_));
}

std::string ReasoningStyler::finish() {
    std::string out = show(reasoning_split(reply_, opened_));
    if (styled_) out += off_;
    styled_ = false;
    return out;
}

std::string ReasoningStyler::show(const ReasoningSplit& v) {
    std::string out;
    if (v.reasoning.size() > reasoning_shown_) {
        if (!styled_) out += on_;
        styled_ = true;
        out += std::string_view(v.reasoning).substr(reasoning_shown_);
        reasoning_shown_ = v.reasoning.size();
    }
    if (v.content.size() > content_shown_) {
        if (styled_) out += off_;
        styled_ = false;
        if (content_shown_ == 0 && reasoning_shown_ > 0) out += "\n\n";
        out += std::string_view(v.content).substr(content_shown_);
        content_shown_ = v.content.size();
    }
    return out;
}

}  // namespace kvrun

namespace kvrun {

ReasoningBudget reasoning_budget_for(int32_t tokens, std::string_view message, bool opened,
                                     const Tokenizer& tok) {
    ReasoningBudget b;
    b.tokens = tokens;
    if (tokens < 0) return b;
    // An SPM vocabulary's encode starts the text with a space of its own: a message that
    // starts with one gives it up, so the forced text is the message as written.
    if (tok.add_space_prefix() && message.starts_with(' ')) message.remove_prefix(1);
    const std::string msg(message);
    if (tok.encode(kChannel, false, true).size() == 1) {
        b.start = std::string(kChannel) + "analysis" + std::string(kMessage);
        b.end = "<|end|>";
        b.state.inside = false;  // harmony prompts end with the reply header "<|start|>assistant"
        b.forced = tok.encode(msg + b.end + std::string(kStart) + "assistant" +
                                  std::string(kChannel) + "final" + std::string(kMessage),
                              false, true);
    } else {
        const ReasoningTags tags = reasoning_tags(tok);
        b.start = std::string(tags.open);
        b.end = std::string(tags.close);
        b.state.inside = opened;
        b.forced = tok.encode(msg + b.end, false, true);
    }
    return b;
}

}  // namespace kvrun
