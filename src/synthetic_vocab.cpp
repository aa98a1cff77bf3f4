// Builds the synthetic SPM vocabulary described in synthetic_vocab.h.
#include "synthetic_vocab.h"

#include <fmt/format.h>

#include <string_view>
#include <unordered_set>

#include "common.h"

namespace kvrun {
namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581, SPM's word-boundary marker

// A few frequent English words (as pieces with and without the word-boundary marker).
constexpr std::string_view kWords[] = {
    "the",   "and",    "of",    "to",     "in",   "is",    "it",     "you",    "that",  "he",
    "was",   "for",    "on",    "are",    "with", "as",    "his",    "they",   "be",    "at",
    "one",   "have",   "this",  "from",   "or",   "had",   "by",     "word",   "but",   "not",
    "what",  "all",    "were",  "we",     "when", "your",  "can",    "said",   "there", "use",
    "an",    "each",   "which", "she",    "do",   "how",   "their",  "if",     "will",  "up",
    "other", "about",  "out",   "many",   "then", "them",  "these",  "so",     "some",  "her",
    "would", "make",   "like",  "him",    "into", "time",  "has",    "look",   "two",   "more",
    "write", "go",     "see",   "number", "no",   "way",   "could",  "people", "my",    "than",
    "first", "water",  "been",  "call",   "who",  "its",   "now",    "find",   "long",  "down",
    "day",   "did",    "get",   "come",   "made", "may",   "part",   "hello",  "world", "once",
    "upon",  "little", "girl",  "boy",    "play", "happy", "friend", "story",  "model", "token",
};

class Builder {
  public:
    explicit Builder(int64_t n) : n_(n) {}
    bool full() const { return int64_t(v_.tokens.size()) >= n_; }
    void add(std::string text, float score, int32_t type) {
        if (full() || !seen_.insert(text).second) return;
        v_.tokens.push_back(std::move(text));
        v_.scores.push_back(score);
        v_.token_types.push_back(type);
    }
    // A normal piece; earlier pieces get higher scores (merged first).
    void piece(std::string text) { add(std::move(text), -float(n_pieces_++), 1); }
    // The piece and every prefix of it that is at least two bytes long (prefix closure).
    void piece_with_prefixes(std::string_view text, size_t keep) {
        for (size_t k = keep + 1; k <= text.size(); ++k) piece(std::string(text.substr(0, k)));
    }
    SpmVocab take() { return std::move(v_); }

  private:
    int64_t n_;
    int64_t n_pieces_ = 0;
    SpmVocab v_;
    std::unordered_set<std::string> seen_;
};

// Every lowercase string of length `len`, in lexicographic order, until the builder is full.
void add_combos(Builder& b, int len, bool with_space) {
    std::string s(size_t(len), 'a');
    while (!b.full()) {
        b.piece(with_space ? std::string(kSpace) + s : s);
        int i = len - 1;
        while (i >= 0 && s[size_t(i)] == 'z') s[size_t(i--)] = 'a';
        if (i < 0) return;
        ++s[size_t(i)];
    }
}

}  // namespace

SpmVocab synthetic_spm_vocab(int64_t n_vocab) {
    if (n_vocab < kSyntheticVocabMin || n_vocab > (int64_t(1) << 24))
        fail("synthetic vocabulary size {} is out of range [{}, {}]", n_vocab, kSyntheticVocabMin,
             int64_t(1) << 24);
    Builder b(n_vocab);
    b.add("<unk>", 0.0f, 2);
    b.add("<s>", 0.0f, 3);
    b.add("</s>", 0.0f, 3);
    for (int byte = 0; byte < 256; ++byte) b.add(fmt::format("<0x{:02X}>", byte), 0.0f, 6);
    b.piece(std::string(kSpace));
    for (char c = 'a'; c <= 'z'; ++c) b.piece(std::string(1, c));
    for (char c = 'a'; c <= 'z'; ++c) b.piece(std::string(kSpace) + c);
    for (char c = '!'; c <= '~'; ++c) b.piece(std::string(1, c));
    for (char c = 'A'; c <= 'Z'; ++c) b.piece(std::string(kSpace) + c);
    for (std::string_view w : kWords) {
        b.piece_with_prefixes(std::string(kSpace) + std::string(w), kSpace.size() + 1);
        b.piece_with_prefixes(w, 1);
    }
    // Generated letter combinations: prefix-closed because all shorter ones come first.
    for (int len = 2; !b.full(); ++len) {
        add_combos(b, len, false);
        add_combos(b, len, true);
    }
    return b.take();
}

}  // namespace kvrun
