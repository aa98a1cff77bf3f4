// Stop strings in streamed text (see stop_text.h).
#include "stop_text.h"

#include <algorithm>

namespace kvrun {

size_t stop_string_holdback(std::string_view text, const std::vector<std::string>& stops) {
    size_t best = 0;
    for (const std::string& s : stops) {
        if (s.empty()) continue;
        for (size_t n = std::min(s.size() - 1, text.size()); n > best; --n)
            if (text.substr(text.size() - n) == std::string_view(s).substr(0, n)) {
                best = n;
                break;
            }
    }
    return best;
}

StopTextStream::StopTextStream(std::vector<std::string> stops) : stops_(std::move(stops)) {
    std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
    for (const std::string& s : stops_) max_stop_ = std::max(max_stop_, s.size());
}

std::string StopTextStream::push(std::string_view text) {
    if (stopped_) return {};
    const size_t from = shown_.size();
    const size_t old_size = text_.size();
    text_ += text;
    // A new occurrence ends in the new text, so it begins at most max_stop_ - 1 bytes before
    // it (older text was searched when it came). Held-back text covers such a beginning, so
    // the stop string never begins before what was shown.
    const size_t lo = old_size + 1 > max_stop_ ? old_size + 1 - max_stop_ : 0;
    size_t at = std::string::npos;
    for (const std::string& s : stops_) {
        const size_t p = text_.find(s, lo);
        if (p < at || (p == at && p != std::string::npos && s.size() > stop_word_.size())) {
            at = p;
            stop_word_ = s;
        }
    }
    size_t end;
    if (at != std::string::npos) {
        stopped_ = true;
        end = std::max(at, from);
    } else {
        end = std::max(text_.size() - stop_string_holdback(text_, stops_), from);
    }
    std::string out = text_.substr(from, end - from);
    shown_ += out;
    return out;
}

std::string StopTextStream::finish() {
    if (stopped_) return {};
    std::string out = text_.substr(shown_.size());
    shown_ += out;
    return out;
}

}  // namespace kvrun
