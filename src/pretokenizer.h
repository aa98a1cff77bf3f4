// Pre-tokenization for byte-level BPE: the regex sequence that tokenizer.ggml.pre selects
// (as llama.cpp defines it per pre-tokenizer name), run with PCRE2 over the text, each regex
// refining the pieces left by the previous one.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kvrun {

// What a pre-tokenizer name implies beyond its regexes.
struct PreTokenizerSpec {
    std::vector<std::string> regexes;  // applied in order; `\s` means Unicode White_Space
    bool ignore_merges = false;        // a whole pre-token that is a vocab entry skips merging
    bool add_bos = false;              // default of tokenizer.ggml.add_bos_token
    bool no_bos = false;               // the vocabulary has no BOS token
};

// Throws Error naming `pre` when it is unknown. "" and "default" give the default regexes.
PreTokenizerSpec pretokenizer_spec(const std::string& pre);

// Compiled regex sequence. Thread-safe after construction.
class RegexSplitter {
  public:
    explicit RegexSplitter(const std::vector<std::string>& regexes);
    ~RegexSplitter();
    RegexSplitter(const RegexSplitter&) = delete;
    RegexSplitter& operator=(const RegexSplitter&) = delete;

    // Splits `text` into pieces: each regex's matches, and the unmatched stretches between
    // them, become pieces; the next regex runs inside each piece separately. Malformed UTF-8
    // is decoded leniently (bad bytes become U+FFFD), so the pieces are re-encoded text.
    std::vector<std::string> split(std::string_view text) const;

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace kvrun
