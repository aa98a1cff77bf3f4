// Reasoning blocks of replies (see reasoning.h).
#include "reasoning.h"

#include <algorithm>

#include "stop_text.h"
#include "unicode_text.h"

namespace kvrun {
namespace {

constexpr std::string_view kOpen = "<think>", kClose = "</think>";

// s without an end that may still grow into `tag` (stop_string_holdback).
std::string_view hold_back(std::string_view s, std::string_view tag) {
    return s.substr(0, s.size() - stop_string_holdback(s, {std::string(tag)}));
}

// Where the reasoning begins in the reply (npos: there is none), and whether the reply is
// still too short to tell.
size_t reasoning_start(std::string_view reply, bool opened, bool& undecided) {
    undecided = false;
    if (opened) return 0;
    const std::string_view s = trim_space_left(reply);
    if (s.substr(0, kOpen.size()) == kOpen) return reply.size() - s.size() + kOpen.size();
    undecided = s.size() < kOpen.size() && kOpen.substr(0, s.size()) == s;
    return std::string_view::npos;
}

ReasoningSplit split(std::string_view reply, bool opened, bool streaming) {
    ReasoningSplit out;
    bool undecided = false;
    const size_t start = reasoning_start(reply, opened, undecided);
    if (undecided && streaming) return out;
    if (start == std::string_view::npos) {
        out.content = reply;
        return out;
    }
    const std::string_view rest = reply.substr(start);
    const size_t end = rest.find(kClose);
    if (end == std::string_view::npos) {
        const std::string_view shown = streaming ? hold_back(rest, kClose) : rest;
        out.reasoning = trim_space_right(trim_space_left(shown));
        return out;
    }
    out.reasoning = trim_space_right(trim_space_left(rest.substr(0, end)));
    out.content = trim_space_left(rest.substr(end + kClose.size()));
    return out;
}

}  // namespace

bool chat_template_thinks(ChatTemplateKind kind, std::string_view source) {
    return kind == ChatTemplateKind::DeepSeek3 || source.find(kOpen) != std::string_view::npos;
}

bool prompt_opens_reasoning(std::string_view prompt) {
    const std::string_view s = trim_space_right(prompt);
    return s.size() >= kOpen.size() && s.substr(s.size() - kOpen.size()) == kOpen;
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
