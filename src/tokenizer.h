// Tokenizers driven by GGUF metadata: SPM (tokenizer.ggml.model = "llama") and byte-level
// BPE ("gpt2") with the pre-tokenizer chosen by tokenizer.ggml.pre; special tokens;
// detokenization, including a streaming decoder that never splits a UTF-8 character.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gguf.h"

namespace kvrun {

using TokenId = int32_t;

class Tokenizer {
public:
    // Reads tokenizer.ggml.* from the file. Throws Error for an unsupported model type or
    // inconsistent metadata (e.g. scores/token_type arrays of the wrong length).
    static std::unique_ptr<Tokenizer> from_gguf(const GgufFile& file);
    virtual ~Tokenizer() = default;

    // add_bos: prepend BOS when the vocabulary wants it (tokenizer.ggml.add_bos_token,
    // default true for SPM); parse_special: recognize control/special token texts in `text`.
    virtual std::vector<TokenId> encode(std::string_view text, bool add_bos,
                                        bool parse_special = false) const = 0;
    // The bytes a token stands for (byte-fallback and byte-level tokens become raw bytes;
    // control tokens become "" unless `render_special`).
    virtual std::string token_to_piece(TokenId id, bool render_special = false) const = 0;
    // Concatenated pieces; for SPM the leading space added by encode is removed when
    // `strip_leading_space` (what llama.cpp's detokenize does after BOS).
    std::string decode(const std::vector<TokenId>& ids, bool strip_leading_space = true) const;

    int32_t n_vocab() const { return static_cast<int32_t>(tokens_.size()); }
    const std::string& token_text(TokenId id) const { return tokens_.at(id); }
    TokenId bos() const { return bos_; }       // -1 when the vocabulary has none
    TokenId eos() const { return eos_; }
    bool add_bos() const { return add_bos_; }  // tokenizer.ggml.add_bos_token
    bool add_eos() const { return add_eos_; }
    bool is_eog(TokenId id) const;             // end of generation (EOS, EOT, ...)
    bool is_control(TokenId id) const;
    const std::string& model_name() const { return model_; }  // "llama", "gpt2", ...
    const std::string& pre_name() const { return pre_; }

protected:
    std::vector<std::string> tokens_;
    std::vector<int32_t> token_types_;  // GGUF token type per id (1 normal, 3 control, ...)
    std::vector<TokenId> eog_ids_;
    TokenId bos_ = -1, eos_ = -1;
    bool add_bos_ = false, add_eos_ = false;
    std::string model_, pre_;
};

// Turns a stream of token ids into text chunks that are always whole UTF-8 characters.
class StreamDecoder {
public:
    explicit StreamDecoder(const Tokenizer& tok) : tok_(tok) {}
    // Returns the text that became complete with this token (possibly empty).
    std::string push(TokenId id);
    // Returns what is left (incomplete bytes are replaced by U+FFFD).
    std::string flush();

private:
    const Tokenizer& tok_;
    std::string pending_;
    bool first_ = true;
};

}  // namespace kvrun
