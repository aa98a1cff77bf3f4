// Internal to the tokenizer files: factories for the concrete tokenizers behind
// Tokenizer::from_gguf (SPM in tokenizer_spm.cpp, byte-level BPE in tokenizer_bpe.cpp).
#pragma once

#include <memory>

#include "tokenizer.h"

namespace kvrun {

std::unique_ptr<Tokenizer> make_spm_tokenizer(const GgufFile& file);
std::unique_ptr<Tokenizer> make_bpe_tokenizer(const GgufFile& file);

}  // namespace kvrun
