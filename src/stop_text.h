// Showing generated text that must end before a stop string. The engine stops a sequence once
// its text contains a stop string, but the text streams out as it grows, so a stream must hold
// back an end that could still become a stop string ("<|im_" before "end|>"), and cut the
// final text before the stop string (as llama.cpp's server and OpenAI's API do).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kvrun {

// Length of the longest end of `text` that is a proper beginning of one of `stops`.
size_t stop_string_holdback(std::string_view text, const std::vector<std::string>& stops);

class StopTextStream {
  public:
    explicit StopTextStream(std::vector<std::string> stops);
    // Appends generated text; returns the part that can be shown now (nothing more once a
    // stop string appeared).
    std::string push(std::string_view text);
    // The generation ended: the text held back, unless it is (the start of) the stop string.
    std::string finish();
    bool stopped() const { return stopped_; }
    const std::string& stop_word() const { return stop_word_; }  // the stop string found
    const std::string& shown() const { return shown_; }          // everything returned so far

  private:
    std::vector<std::string> stops_;
    std::string text_;  // everything pushed
    std::string shown_;
    size_t max_stop_ = 0;
    bool stopped_ = false;
    std::string stop_word_;
};

}  // namespace kvrun
