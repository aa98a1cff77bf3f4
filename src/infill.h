// Fill in the middle (code completion at a cursor): the prompt a FIM-trained model (CodeLlama,
// StarCoder, Qwen2.5-Coder, DeepSeek-Coder, ...) expects, built from the text before the
// cursor, the text after it, and optionally other files for context.
//
// Prefix-suffix-middle order (the default):
//   [BOS] {SEP filename "\n" text}... PRE prefix SUF suffix MID prompt
// suffix-prefix-middle (spm, for models trained that way):
//   [BOS] {SEP filename "\n" text}... SUF suffix PRE prefix MID prompt
// The model then writes the middle and ends with an end-of-generation token. Without a SEP
// token, extra files are written as plain text before the rest. Texts are tokenized without
// special tokens (code may contain "<|fim_prefix|>" literally).
//
// When it does not fit in `budget` tokens, the prefix keeps its end and the suffix its start
// (the text nearest the cursor): the suffix takes at most a quarter of the room left after the
// special tokens and `prompt`, the prefix the rest; extra files come only when room is left,
// in order.
#pragma once

#include <string>
#include <vector>

#include "tokenizer.h"

namespace kvrun {

struct InfillInput {
    std::string prefix;  // before the cursor
    std::string suffix;  // after it
    std::string prompt;  // after MID: the start of the middle, when already known
    struct File {
        std::string filename;
        std::string text;
    };
    std::vector<File> extra;
    bool spm = false;  // suffix-prefix-middle order
};

struct InfillPrompt {
    std::vector<TokenId> tokens;
    bool truncated = false;  // prefix, suffix or extra files were cut to fit
};

// Whether the vocabulary has the PRE, SUF and MID tokens.
bool infill_supported(const Tokenizer& tok);

// Throws Error when the vocabulary lacks the FIM tokens, or when even the special tokens and
// `prompt` do not fit in `budget` (> 0; 0: no limit).
InfillPrompt infill_prompt(const Tokenizer& tok, const InfillInput& in, int64_t budget);

}  // namespace kvrun
