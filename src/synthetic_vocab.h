// A synthetic SentencePiece ("llama") vocabulary of any size >= 260 for synthetic models:
// <unk>, <s>, </s>, the 256 byte-fallback tokens, then printable pieces ("▁", ASCII
// characters, "▁x", common words and their prefixes, generated letter combinations). The
// piece set is prefix-closed, so SPM merges can reach every piece; earlier pieces score higher.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvrun {

struct SpmVocab {
    std::vector<std::string> tokens;   // [n_vocab] token texts
    std::vector<float> scores;         // [n_vocab] merge priority (higher merges first)
    std::vector<int32_t> token_types;  // [n_vocab] 1 normal, 2 unknown, 3 control, 6 byte
    int32_t unk_id = 0, bos_id = 1, eos_id = 2;
};

constexpr int64_t kSyntheticVocabMin = 260;

// Deterministic; throws Error when n_vocab < kSyntheticVocabMin or absurdly large (> 2^24).
SpmVocab synthetic_spm_vocab(int64_t n_vocab);

}  // namespace kvrun
